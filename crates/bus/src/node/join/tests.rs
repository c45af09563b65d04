//! Unit tests of the invite decisions.

use super::*;
use mesh_protocol::NodeName;

fn key(n: u8) -> SecretKey {
    SecretKey::from_bytes(&[n; 32])
}

const NOW: u64 = 1_000_000;

fn code() -> InviteCode {
    InviteCode {
        inviter: key(1).public(),
        addrs: vec![],
        id: InviteId([5; 8]),
        secret: InviteSecret([6; 16]),
    }
}

fn invite(uses: u32) -> InviteRecord {
    InviteRecord {
        id: code().id,
        secret_hash: code().secret.hash(),
        uses,
        created_ms: NOW - 10,
        expires_ms: NOW + 3_600_000,
        claimed_by: None,
        claimed_until_ms: 0,
        claimed_request: None,
        spent: vec![],
        revoked: false,
    }
}

fn req(joiner: u8, r: u8) -> JoinRequest {
    let k = key(joiner);
    let card = NodeCard::sign(&k, NodeName::new("j").expect("name"), vec![], 1).expect("card");
    JoinRequest::new(&k, &code(), RequestId([r; 16]), card)
}

fn decide_now(inv: &InviteRecord, joiner: u8, r: &JoinRequest, at: u64) -> Decision {
    decide(Some(inv), r, key(joiner).public(), key(1).public(), at)
}

fn refusal(d: Decision) -> Option<JoinRefusal> {
    match d {
        Decision::Refuse(r) => Some(r),
        _ => None,
    }
}

#[test]
fn a_fresh_proven_request_claims_the_invite_for_its_key_under_a_lease() {
    let Decision::Claim(c) = decide_now(&invite(1), 2, &req(2, 1), NOW) else {
        panic!("claimed")
    };
    assert_eq!(c.claimed_by, Some(key(2).public()));
    assert_eq!(c.claimed_until_ms, NOW + INVITE_LEASE_MS);
    assert_eq!(c.claimed_request, Some(RequestId([1; 16])));
    let spent = spend(&c, key(2).public());
    assert_eq!(spent.uses_left(), 0);
    assert_eq!(spent.claimed_by, None);
    assert_eq!(spent.spent[0].until_ms, NOW + INVITE_LEASE_MS);
}

#[test]
fn a_second_key_waits_for_a_live_claim_and_takes_it_over_once_the_lease_ends() {
    let Decision::Claim(c) = decide_now(&invite(1), 2, &req(2, 1), NOW) else {
        panic!("claimed")
    };
    assert_eq!(decide_now(&c, 3, &req(3, 1), NOW + 1), Decision::TryAgain);
    let after = NOW + INVITE_LEASE_MS + 1;
    assert!(matches!(
        decide_now(&c, 3, &req(3, 1), after),
        Decision::Claim(_)
    ));
    // The same key may claim again with a new request, not the same one.
    assert!(matches!(
        decide_now(&c, 2, &req(2, 2), NOW + 1),
        Decision::Claim(_)
    ));
    assert_eq!(
        refusal(decide_now(&c, 2, &req(2, 1), NOW + 1)),
        Some(JoinRefusal::Redelivered)
    );
}

#[test]
fn after_the_spend_only_a_new_proven_request_of_the_same_key_inside_the_lease_reenters() {
    let Decision::Claim(c) = decide_now(&invite(1), 2, &req(2, 1), NOW) else {
        panic!("claimed")
    };
    let spent = spend(&c, key(2).public());
    let Decision::Reenter(again) = decide_now(&spent, 2, &req(2, 2), NOW + 5) else {
        panic!("re-entered")
    };
    assert_eq!(again.uses_left(), 0, "no second use");
    assert_eq!(
        again.spent[0].requests,
        vec![RequestId([1; 16]), RequestId([2; 16])]
    );
    // Redeliveries of either request are refused.
    for r in [1, 2] {
        assert_eq!(
            refusal(decide_now(&again, 2, &req(2, r), NOW + 6)),
            Some(JoinRefusal::Redelivered)
        );
    }
    let mut unproven = req(2, 3);
    unproven.proof = None;
    assert_eq!(
        refusal(decide_now(&again, 2, &unproven, NOW + 6)),
        Some(JoinRefusal::ProofRequired)
    );
    let mut forged = req(2, 3);
    forged.proof = Some(
        key(9)
            .sign(&forged.proof_bytes(&key(1).public()))
            .to_bytes(),
    );
    assert_eq!(
        refusal(decide_now(&again, 2, &forged, NOW + 6)),
        Some(JoinRefusal::BadProof)
    );
    let mut borrowed = req(2, 4);
    borrowed.proof = req(2, 3).proof;
    assert_eq!(
        refusal(decide_now(&again, 2, &borrowed, NOW + 6)),
        Some(JoinRefusal::BadProof)
    );
    // Another key, or the same one past its lease: spent.
    assert_eq!(
        refusal(decide_now(&again, 3, &req(3, 1), NOW + 6)),
        Some(JoinRefusal::Spent)
    );
    let late = NOW + INVITE_LEASE_MS + 1;
    assert_eq!(
        refusal(decide_now(&again, 2, &req(2, 5), late)),
        Some(JoinRefusal::Spent)
    );
}

#[test]
fn an_unknown_expired_revoked_or_mis_carded_invite_is_refused_with_its_own_reason() {
    let inv = invite(2);
    let me = key(1).public();
    assert_eq!(
        refusal(decide(None, &req(2, 1), key(2).public(), me, NOW)),
        Some(JoinRefusal::UnknownInvite)
    );
    let mut other_secret = req(2, 1);
    other_secret.secret = InviteSecret([0; 16]);
    assert_eq!(
        refusal(decide_now(&inv, 2, &other_secret, NOW)),
        Some(JoinRefusal::UnknownInvite)
    );
    assert_eq!(
        refusal(decide_now(&inv, 2, &req(2, 1), inv.expires_ms + 1)),
        Some(JoinRefusal::Expired)
    );
    let revoked = InviteRecord {
        revoked: true,
        ..inv.clone()
    };
    assert_eq!(
        refusal(decide_now(&revoked, 2, &req(2, 1), NOW)),
        Some(JoinRefusal::Revoked)
    );
    // Key 3 presents key 2's card and proof: not its own.
    assert_eq!(
        refusal(decide_now(&inv, 3, &req(2, 1), NOW)),
        Some(JoinRefusal::BadCard)
    );
}
