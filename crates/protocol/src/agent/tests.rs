use super::*;
use crate::ids::SecretKey;

fn name(s: &str) -> AgentName {
    AgentName::new(s).unwrap()
}

fn envelope() -> AgentEnvelope {
    AgentEnvelope {
        id: MsgId([7; 16]),
        from: name("alice"),
        to: Some(name("bob")),
        in_reply_to: None,
        key: None,
        body: b"hi".to_vec(),
        receipt: false,
    }
}

fn receipt_by(secret: &SecretKey, node: &NodeId, ids: Vec<MsgId>) -> ReadReceipt {
    ReadReceipt::sign(secret, node, (name("bob"), name("alice")), 1_000, ids)
}

#[test]
fn a_forward_adds_at_most_its_overhead_to_the_message_it_carries() {
    let author = SecretKey::from_bytes(&[1; 32]).public();
    for len in [
        0usize,
        127,
        128,
        16_383,
        16_384,
        MAX_BATCH_PAYLOAD_BYTES as usize,
    ] {
        let f = Forward {
            author,
            envelope: vec![0; len],
        };
        let extra = f.encode().len() - len;
        assert!(extra <= MAX_FORWARD_OVERHEAD_BYTES, "{len}: {extra}");
    }
}

#[test]
fn a_move_notice_verifies_only_as_signed_and_the_higher_version_then_node_wins() {
    let agent = SecretKey::from_bytes(&[5; 32]);
    let (a, b) = (
        SecretKey::from_bytes(&[1; 32]).public(),
        SecretKey::from_bytes(&[2; 32]).public(),
    );
    let first = AgentMove::sign(&agent, name("bob"), (b, a), 1, 10);
    first.verify().unwrap();
    let mut altered = first.clone();
    altered.node = b;
    assert!(altered.verify().is_err(), "a relay cannot change the host");
    let forged = AgentMove::sign(&SecretKey::from_bytes(&[6; 32]), name("bob"), (a, b), 9, 10);
    let mut forged_as_bob = forged.clone();
    forged_as_bob.key = agent.public();
    assert!(
        forged_as_bob.verify().is_err(),
        "only the agent's key signs"
    );
    let second = AgentMove::sign(&agent, name("bob"), (a, b), 2, 20);
    assert!(second.wins_over(&first) && !first.wins_over(&second));
    assert!(!second.wins_over(&second), "the same notice does not win");
    // Two imports of one export: the same version, the higher node wins.
    let (lo, hi) = if a.as_bytes() < b.as_bytes() {
        (a, b)
    } else {
        (b, a)
    };
    let race_lo = AgentMove::sign(&agent, name("bob"), (hi, lo), 3, 30);
    let race_hi = AgentMove::sign(&agent, name("bob"), (lo, hi), 3, 30);
    assert!(race_hi.wins_over(&race_lo) && !race_lo.wins_over(&race_hi));
}

#[test]
fn agent_names_are_bounded_and_restricted() {
    assert!(AgentName::new("planner.v1_a-b").is_ok());
    assert!(AgentName::new("").is_err());
    assert!(AgentName::new(&"a".repeat(65)).is_err());
    assert!(AgentName::new(&"a".repeat(64)).is_ok());
    assert!(AgentName::new("Bob").is_err());
    assert!(AgentName::new("a/b").is_err());
    assert!(AgentName::new("a@b").is_err());
}

#[test]
fn an_envelope_round_trips_and_its_id_is_its_first_sixteen_bytes() {
    let e = envelope();
    let mut bytes = e.encode();
    assert_eq!(&bytes[..16], &[7; 16]);
    assert_eq!(AgentEnvelope::decode(&bytes).unwrap(), e);
    assert!(stamp_msg_id(&mut bytes, MsgId([9; 16])));
    assert_eq!(AgentEnvelope::decode(&bytes).unwrap().id, MsgId([9; 16]));
    assert!(!stamp_msg_id(&mut [0u8; 15], MsgId([9; 16])));
}

#[test]
fn an_envelope_with_a_bad_name_trailing_bytes_or_padding_is_refused() {
    let mut bytes = envelope().encode();
    bytes.push(0);
    assert!(AgentEnvelope::decode(&bytes).is_err());
    let bad = AgentEnvelope {
        from: AgentName("Bad".into()),
        ..envelope()
    };
    assert!(AgentEnvelope::decode(&bad.encode()).is_err());
    // The body length is the last varint before the body: pad it.
    let e = envelope();
    let bytes = e.encode();
    let n = bytes.len();
    let mut padded = bytes[..n - 3].to_vec();
    padded.extend_from_slice(&[0x82, 0x00]);
    padded.extend_from_slice(b"hi");
    assert_eq!(postcard::from_bytes::<AgentEnvelope>(&padded).unwrap(), e);
    assert!(matches!(
        AgentEnvelope::decode(&padded),
        Err(AgentError::Malformed { why, .. }) if why.contains("not canonical")
    ));
}

#[test]
fn a_header_decodes_as_its_envelope_does_without_copying_the_body() {
    let e = envelope();
    let bytes = e.encode();
    let h = AgentHeader::decode(&bytes).unwrap();
    assert_eq!(
        (h.id, &h.from, &h.to, h.body),
        (e.id, &e.from, &e.to, &b"hi"[..])
    );
    let mut long = bytes.clone();
    long.push(0);
    assert!(AgentHeader::decode(&long).is_err());
}

#[test]
fn message_ids_differ_by_every_field_they_are_derived_from() {
    let a = SecretKey::from_bytes(&[1; 32]).public();
    let b = SecretKey::from_bytes(&[2; 32]).public();
    let e = Epoch([3; 16]);
    let id = MsgId::derive(&a, e, &b, 1);
    assert_ne!(id, MsgId::derive(&b, e, &a, 1));
    assert_ne!(id, MsgId::derive(&a, Epoch([4; 16]), &b, 1));
    assert_ne!(id, MsgId::derive(&a, e, &b, 2));
    assert!(
        MsgId::derive(&a, e, &b, 2) > id,
        "one stream's ids sort by seq"
    );
    assert_eq!(id.to_string().parse::<MsgId>().unwrap(), id);
    assert!("xyz".parse::<MsgId>().is_err());
}

#[test]
fn a_card_verifies_only_as_signed() {
    let agent = SecretKey::from_bytes(&[5; 32]);
    let node = SecretKey::from_bytes(&[6; 32]).public();
    let card = AgentCard::sign(&agent, node, name("alice"), true, 10);
    assert!(card.verify().is_ok());
    let mut forged = card.clone();
    forged.online = false;
    assert!(forged.verify().is_err());
    let mut other = card.clone();
    other.key = SecretKey::from_bytes(&[7; 32]).public();
    assert!(other.verify().is_err());
}

#[test]
fn mesh_kinds_are_a_small_reserved_range() {
    assert!(!is_mesh_kind(0));
    assert!(is_mesh_kind(KIND_AGENT) && is_mesh_kind(KIND_BOUNCE));
    assert!(is_mesh_kind(KIND_TOMBSTONE) && is_mesh_kind(KIND_FORWARD));
    assert!(!is_mesh_kind(16));
    assert!(!is_mesh_kind(0x6d62));
}

#[test]
fn a_tombstone_decodes_only_as_encoded_and_takes_a_stamped_id() {
    let mut t = Tombstone {
        id: MsgId([0; 16]),
        from: name("alice"),
        to: Some(name("bob")),
        key: SupersedeKey::new("status").unwrap(),
        reason: TombstoneReason::Superseded { by: MsgId([9; 16]) },
    };
    let mut bytes = t.encode();
    assert!(stamp_msg_id(&mut bytes, MsgId([7; 16])));
    t.id = MsgId([7; 16]);
    assert_eq!(Tombstone::decode(&bytes).unwrap(), t);
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(Tombstone::decode(&longer).is_err(), "trailing bytes");
    assert!(Tombstone::decode(&bytes[..bytes.len() - 1]).is_err());
    // The reason is an enum of one variant: any other tag is refused.
    let last = bytes.len() - 17;
    let mut other = bytes.clone();
    other[last] = 1;
    assert!(Tombstone::decode(&other).is_err(), "unknown reason");
    let longest = Tombstone {
        id: MsgId([0xff; 16]),
        from: name(&"a".repeat(MAX_AGENT_NAME_BYTES)),
        to: Some(name(&"b".repeat(MAX_AGENT_NAME_BYTES))),
        key: SupersedeKey::new(&"k".repeat(MAX_SUPERSEDE_KEY_BYTES)).unwrap(),
        reason: TombstoneReason::Superseded {
            by: MsgId([0xff; 16]),
        },
    };
    assert!(longest.encode().len() as u64 <= MAX_TOMBSTONE_BYTES);
}

#[test]
fn an_envelope_asks_a_receipt_with_one_trailing_flags_byte_and_nothing_else() {
    let plain = envelope();
    let asked = AgentEnvelope {
        receipt: true,
        ..envelope()
    };
    let (p, a) = (plain.encode(), asked.encode());
    // Today's encoding, plus 0x01: every envelope stored before decodes.
    assert_eq!(&a[..a.len() - 1], &p[..]);
    assert_eq!(a.last(), Some(&0x01));
    assert_eq!(AgentEnvelope::decode(&p).unwrap(), plain);
    assert_eq!(AgentEnvelope::decode(&a).unwrap(), asked);
    assert!(AgentHeader::decode(&a).unwrap().receipt);
    assert!(!AgentHeader::decode(&p).unwrap().receipt);
    for bad in [
        vec![0x00],
        vec![0x02],
        vec![0x81],
        vec![0x01, 0x00],
        vec![0x01, 0x01],
    ] {
        let bytes = [p.as_slice(), &bad].concat();
        assert!(AgentEnvelope::decode(&bytes).is_err(), "{bad:?}");
        assert!(AgentHeader::decode(&bytes).is_err(), "{bad:?}");
    }
}

#[test]
fn a_receipt_verifies_only_under_its_readers_key_and_node() {
    let bob = SecretKey::from_bytes(&[5; 32]);
    let node = SecretKey::from_bytes(&[6; 32]).public();
    let r = receipt_by(&bob, &node, vec![MsgId([1; 16]), MsgId([2; 16])]);
    assert_eq!(ReadReceipt::decode(&r.encode()).unwrap(), r);
    r.verify(&node, &bob.public()).unwrap();
    let mallory = SecretKey::from_bytes(&[7; 32]);
    assert!(r.verify(&node, &mallory.public()).is_err(), "another key");
    let forged = receipt_by(&mallory, &node, r.ids.clone());
    assert!(
        forged.verify(&node, &bob.public()).is_err(),
        "signed by the wrong agent key"
    );
    let elsewhere = SecretKey::from_bytes(&[8; 32]).public();
    assert!(r.verify(&elsewhere, &bob.public()).is_err(), "another host");
    let mut altered = r.clone();
    altered.ids.pop();
    assert!(altered.verify(&node, &bob.public()).is_err(), "fewer ids");
    let mut later = r.clone();
    later.read_ms += 1;
    assert!(later.verify(&node, &bob.public()).is_err(), "another time");
}

#[test]
fn a_receipt_names_one_to_256_ids_strictly_ascending_and_its_longest_fits_its_cap() {
    let bob = SecretKey::from_bytes(&[5; 32]);
    let node = SecretKey::from_bytes(&[6; 32]).public();
    let id = |n: u16| {
        let mut b = [0xff; 16];
        b[14..].copy_from_slice(&n.to_be_bytes());
        MsgId(b)
    };
    for bad in [vec![], vec![id(2), id(1)], vec![id(1), id(1)]] {
        let r = receipt_by(&bob, &node, bad.clone());
        assert!(ReadReceipt::decode(&r.encode()).is_err(), "{bad:?}");
    }
    let too_many = receipt_by(&bob, &node, (0..=MAX_RECEIPT_IDS as u16).map(id).collect());
    assert!(ReadReceipt::decode(&too_many.encode()).is_err());
    let longest = ReadReceipt::sign(
        &bob,
        &node,
        (
            name(&"a".repeat(MAX_AGENT_NAME_BYTES)),
            name(&"b".repeat(MAX_AGENT_NAME_BYTES)),
        ),
        u64::MAX,
        (0..MAX_RECEIPT_IDS as u16).map(id).collect(),
    );
    let bytes = longest.encode();
    assert!(bytes.len() <= MAX_READ_RECEIPT_BYTES, "{}", bytes.len());
    assert_eq!(ReadReceipt::decode(&bytes).unwrap(), longest);
    let mut trailing = receipt_by(&bob, &node, vec![id(1)]).encode();
    trailing.push(0);
    assert!(ReadReceipt::decode(&trailing).is_err());
    assert!(ReadReceipt::decode(&vec![0; MAX_READ_RECEIPT_BYTES + 1]).is_err());
}
