//! Joining with one invite, against real stores and real endpoints on
//! 127.0.0.1: the claim, its lease, the spend after the membership, "try
//! again" for a second key and under a store outage, proven re-entry after
//! a lost answer, and every replay refused. Every wait is bounded by [`T`].

#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{T, bare_endpoint, node_config, until};
use iroh::endpoint::ConnectionError;
use iroh::{Endpoint, EndpointAddr};
use mesh_bus::{CoreConfig, INVITE_LEASE_MS, JoinError, Node, close_code};
use mesh_protocol::{
    InviteCode, InviteId, InviteSecret, JOIN_ALPN, JOIN_MESSAGE_BYTES_MAX, JoinAnswer, JoinRefusal,
    JoinRequest, NodeCard, NodeName, RequestId, SecretKey, decode_join, encode_join,
};
use mesh_store::testing::{CommitHook, Hooked};
use mesh_store::{
    InviteRecord, MemStore, MeshStore, Receipt, RedbStore, StoreError, StoreHandle, WriteOp,
};
use tokio::time::timeout;

struct Running<S: MeshStore> {
    node: Node,
    store: Arc<S>,
}

async fn start<S: MeshStore>(store: Arc<S>, key: SecretKey) -> Running<S> {
    let handle = StoreHandle::spawn(store.clone()).expect("store actor");
    let node = Node::start(node_config(CoreConfig::default()), key, handle)
        .await
        .expect("start");
    Running { node, store }
}

async fn on_disk(dir: &std::path::Path) -> Running<RedbStore> {
    std::fs::create_dir_all(dir).unwrap();
    let store = Arc::new(RedbStore::open(dir).expect("store"));
    start(store, SecretKey::generate()).await
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The invite `id` as `s` holds it.
fn invite(s: &dyn MeshStore, id: InviteId) -> InviteRecord {
    s.invite(&id).unwrap().expect("the invite is stored")
}

fn is_peer(s: &dyn MeshStore, node: mesh_protocol::NodeId) -> bool {
    s.peers().unwrap().iter().any(|p| p.node == node)
}

/// A bare endpoint with `key`, to present hand-made join requests.
async fn raw(key: &SecretKey) -> Endpoint {
    bare_endpoint(key.clone()).await
}

fn addr(code: &InviteCode) -> EndpointAddr {
    let mut a = EndpointAddr::new(code.inviter);
    for s in &code.addrs {
        a = a.with_ip_addr(*s);
    }
    a
}

/// Presents `req` from `ep` and reads the answer.
async fn present(ep: &Endpoint, code: &InviteCode, req: &JoinRequest) -> JoinAnswer {
    let conn = timeout(T, ep.connect(addr(code), JOIN_ALPN))
        .await
        .expect("in time")
        .expect("any node reaches the join ALPN");
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut out = Vec::new();
    encode_join(req, &mut out).unwrap();
    send.write_all(&out).await.unwrap();
    send.finish().unwrap();
    let body = timeout(T, recv.read_to_end(4 + JOIN_MESSAGE_BYTES_MAX))
        .await
        .expect("answered in time")
        .unwrap();
    conn.close(0u32.into(), b"done");
    decode_join(&body[4..]).unwrap()
}

/// A fresh request of `key` for `code`, request id `r`.
fn request(key: &SecretKey, code: &InviteCode, r: u8) -> JoinRequest {
    let card = NodeCard::sign(key, NodeName::new("raw").unwrap(), vec![], 1).unwrap();
    JoinRequest::new(key, code, RequestId([r; 16]), card)
}

fn refused(r: JoinRefusal) -> JoinAnswer {
    JoinAnswer::Refused { refusal: r }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invite_then_a_join_makes_both_nodes_peers_durably_and_spends_the_invite() {
    let tmp = tempfile::tempdir().unwrap();
    let inviter = on_disk(&tmp.path().join("inviter")).await;
    let joiner = on_disk(&tmp.path().join("joiner")).await;
    let code = inviter.node.create_invite(1, 3_600_000).await.unwrap();
    assert!(code.to_string().starts_with("meshinvite1"));
    let stored = invite(&*inviter.store, code.id);
    assert_eq!((stored.uses_left(), stored.claimed_by), (1, None));
    assert_ne!(stored.secret_hash, [0; 32]);

    let card = joiner.node.join(&code).await.unwrap();
    let (i, j) = (inviter.node.node_id(), joiner.node.node_id());
    assert_eq!(card.node, i);
    assert!(is_peer(&*inviter.store, j) && is_peer(&*joiner.store, i));
    let spent = invite(&*inviter.store, code.id);
    assert_eq!(spent.uses_left(), 0);
    assert_eq!(spent.spent[0].by, j);
    assert_eq!(spent.claimed_by, None);
    // A second node is refused the spent invite.
    let other = on_disk(&tmp.path().join("other")).await;
    match other.node.join(&code).await {
        Err(JoinError::Refused(JoinRefusal::Spent)) => {}
        other => panic!("expected a refusal as spent, got {other:?}"),
    }
    // They talk, both ways.
    until("the two to connect", || async {
        let st = joiner.node.status().await.unwrap();
        st.peers.iter().any(|p| p.node == i && p.conn.is_some())
    })
    .await;
    inviter.node.send(j, 0, b"welcome".to_vec()).await.unwrap();
    joiner.node.send(i, 0, b"thanks".to_vec()).await.unwrap();
    common::wait_head(&joiner.node, 2).await;
    common::wait_head(&inviter.node, 2).await;
    for r in [inviter, joiner, other] {
        r.node.shutdown().await;
    }
}

/// Writes `record` into `store` before a node runs on it.
async fn seed(store: Arc<impl MeshStore>, record: InviteRecord) {
    let handle = StoreHandle::spawn(store).unwrap();
    handle
        .commit(vec![WriteOp::PutInvite(record)])
        .await
        .unwrap();
    handle.close().await;
}

fn record(
    code_id: InviteId,
    secret: &InviteSecret,
    claimed: Option<(mesh_protocol::NodeId, u64)>,
) -> InviteRecord {
    let now = now_ms();
    InviteRecord {
        id: code_id,
        secret_hash: secret.hash(),
        uses: 1,
        created_ms: now,
        expires_ms: now + 3_600_000,
        claimed_by: claimed.map(|c| c.0),
        claimed_until_ms: claimed.map_or(0, |c| c.1),
        claimed_request: claimed.map(|_| RequestId([0xcc; 16])),
        spent: vec![],
        revoked: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_key_presenting_a_claimed_invite_tries_again_until_the_lease_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let (id, secret) = (InviteId([1; 8]), InviteSecret([2; 16]));
    let holder = SecretKey::generate().public();
    let store = Arc::new(
        RedbStore::open(&{
            let d = tmp.path().join("i");
            std::fs::create_dir_all(&d).unwrap();
            d
        })
        .unwrap(),
    );
    let live = record(id, &secret, Some((holder, now_ms() + INVITE_LEASE_MS)));
    seed(store.clone(), live.clone()).await;
    let inviter = start(store, SecretKey::generate()).await;
    let code = InviteCode {
        inviter: inviter.node.node_id(),
        addrs: inviter.node.ticket().addrs,
        id,
        secret: secret.clone(),
    };
    let joiner = on_disk(&tmp.path().join("j")).await;
    match joiner.node.join(&code).await {
        Err(JoinError::TryAgain { .. }) => {}
        other => panic!("expected try again, got {other:?}"),
    }
    assert_eq!(invite(&*inviter.store, id), live, "nothing changed");
    assert!(!is_peer(&*inviter.store, joiner.node.node_id()));
    inviter.node.shutdown().await;
    drop(inviter);

    // The same claim, its lease over: the next key takes the invite.
    let store2 = Arc::new(RedbStore::open(&tmp.path().join("i2").tap_mkdir()).unwrap());
    let ended = record(id, &secret, Some((holder, now_ms() - 1)));
    seed(store2.clone(), ended).await;
    let inviter = start(store2, SecretKey::generate()).await;
    let code = InviteCode {
        inviter: inviter.node.node_id(),
        addrs: inviter.node.ticket().addrs,
        ..code
    };
    joiner.node.join(&code).await.unwrap();
    let spent = invite(&*inviter.store, id);
    assert_eq!(spent.spent[0].by, joiner.node.node_id());
    for r in [inviter.node, joiner.node] {
        r.shutdown().await;
    }
}

trait MkDir {
    fn tap_mkdir(self) -> Self;
}

impl MkDir for std::path::PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_store_outage_a_join_tries_again_and_nothing_is_claimed_or_spent() {
    let store = Arc::new(MemStore::new(mesh_protocol::Epoch([4; 16])));
    let inviter = start(store.clone(), SecretKey::generate()).await;
    let joiner = start(
        Arc::new(MemStore::new(mesh_protocol::Epoch([5; 16]))),
        SecretKey::generate(),
    )
    .await;
    let code = inviter.node.create_invite(1, 3_600_000).await.unwrap();
    let before = invite(&*store, code.id);
    store.set_unavailable(true);
    match joiner.node.join(&code).await {
        Err(JoinError::TryAgain { .. }) => {}
        other => panic!("expected try again, got {other:?}"),
    }
    assert_eq!(invite(&*store, code.id), before, "nothing claimed or spent");
    store.set_unavailable(false);
    // The store is back (after the bus's retry delay): the join completes.
    until("the join to complete once the store is back", || async {
        joiner.node.join(&code).await.is_ok()
    })
    .await;
    assert_eq!(invite(&*store, code.id).spent[0].by, joiner.node.node_id());
    for r in [inviter.node, joiner.node] {
        r.shutdown().await;
    }
}

/// A hook that fails every commit writing a peer record while `fail_peers`
/// is set: the membership step of a join fails, nothing else.
struct NoNewPeers {
    fail_peers: AtomicBool,
}

impl CommitHook for NoNewPeers {
    fn commit(
        &self,
        inner: &MemStore,
        groups: Vec<Vec<WriteOp>>,
    ) -> Vec<Result<Receipt, StoreError>> {
        let writes_peer = groups
            .iter()
            .flatten()
            .any(|op| matches!(op, WriteOp::PutPeer(_)));
        if writes_peer && self.fail_peers.load(Ordering::SeqCst) {
            return groups
                .iter()
                .map(|_| Err(StoreError::Unavailable("the disk is full".into())))
                .collect();
        }
        inner.commit(groups)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invite_is_spent_only_once_the_membership_is_committed() {
    let store = Arc::new(Hooked::new(
        MemStore::new(mesh_protocol::Epoch([6; 16])),
        NoNewPeers {
            fail_peers: AtomicBool::new(true),
        },
    ));
    let inviter = start(store.clone(), SecretKey::generate()).await;
    let joiner = start(
        Arc::new(MemStore::new(mesh_protocol::Epoch([7; 16]))),
        SecretKey::generate(),
    )
    .await;
    let j = joiner.node.node_id();
    let code = inviter.node.create_invite(1, 3_600_000).await.unwrap();
    match joiner.node.join(&code).await {
        Err(JoinError::TryAgain { .. }) => {}
        other => panic!("expected try again, got {other:?}"),
    }
    let claimed = invite(&*store, code.id);
    assert_eq!(claimed.claimed_by, Some(j), "claimed for the joiner");
    assert!(claimed.spent.is_empty(), "not spent without the membership");
    assert!(!is_peer(&*store, j));
    // Another key meanwhile: the claim holds.
    let other = SecretKey::generate();
    let ep = raw(&other).await;
    assert!(matches!(
        present(&ep, &code, &request(&other, &code, 1)).await,
        JoinAnswer::TryAgain { .. }
    ));
    store.fail_peers.store(false, Ordering::SeqCst);
    until("the joiner's retry to complete", || async {
        joiner.node.join(&code).await.is_ok()
    })
    .await;
    let spent = invite(&*store, code.id);
    assert_eq!(spent.spent[0].by, j);
    assert!(is_peer(&*store, j));
    ep.close().await;
    for r in [inviter.node, joiner.node] {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_finished_by_a_new_proven_request_and_every_replay_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let inviter = on_disk(&tmp.path().join("inviter")).await;
    let code = inviter.node.create_invite(1, 3_600_000).await.unwrap();
    let key = SecretKey::generate();
    let ep = raw(&key).await;
    let first = request(&key, &code, 1);
    // The first answer is "lost": the joiner does nothing with it.
    assert!(matches!(
        present(&ep, &code, &first).await,
        JoinAnswer::Welcome { .. }
    ));
    assert_eq!(invite(&*inviter.store, code.id).uses_left(), 0);
    // The same key, a new request, proven: welcomed again, no second use.
    let second = request(&key, &code, 2);
    match present(&ep, &code, &second).await {
        JoinAnswer::Welcome { card } => assert_eq!(card.node, inviter.node.node_id()),
        other => panic!("expected a welcome, got {other:?}"),
    }
    let after = invite(&*inviter.store, code.id);
    assert_eq!(after.spent.len(), 1);
    assert_eq!(
        after.spent[0].requests,
        vec![RequestId([1; 16]), RequestId([2; 16])]
    );
    // Redeliveries of either.
    for r in [&first, &second] {
        assert_eq!(
            present(&ep, &code, r).await,
            refused(JoinRefusal::Redelivered)
        );
    }
    // No proof.
    let mut bare = request(&key, &code, 3);
    bare.proof = None;
    assert_eq!(
        present(&ep, &code, &bare).await,
        refused(JoinRefusal::ProofRequired)
    );
    // A forged proof: another key's signature over the right bytes.
    let mut forged = request(&key, &code, 4);
    forged.proof = Some(
        SecretKey::generate()
            .sign(&forged.proof_bytes(&code.inviter))
            .to_bytes(),
    );
    assert_eq!(
        present(&ep, &code, &forged).await,
        refused(JoinRefusal::BadProof)
    );
    // A proof for another request.
    let mut borrowed = request(&key, &code, 5);
    borrowed.proof = request(&key, &code, 6).proof;
    assert_eq!(
        present(&ep, &code, &borrowed).await,
        refused(JoinRefusal::BadProof)
    );
    // Another key: spent.
    let stranger = SecretKey::generate();
    let ep2 = raw(&stranger).await;
    assert_eq!(
        present(&ep2, &code, &request(&stranger, &code, 1)).await,
        refused(JoinRefusal::Spent)
    );
    // Someone else's card and proof, presented from another key.
    let theft = request(&key, &code, 7);
    assert_eq!(
        present(&ep2, &code, &theft).await,
        refused(JoinRefusal::BadCard)
    );
    assert_eq!(
        invite(&*inviter.store, code.id).spent.len(),
        1,
        "nothing more spent"
    );
    ep.close().await;
    ep2.close().await;
    inviter.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_expired_or_revoked_invite_is_refused_with_its_own_code() {
    let tmp = tempfile::tempdir().unwrap();
    let (id, secret) = (InviteId([8; 8]), InviteSecret([9; 16]));
    let dir = tmp.path().join("inviter").tap_mkdir();
    let store = Arc::new(RedbStore::open(&dir).unwrap());
    let mut expired = record(id, &secret, None);
    expired.expires_ms = now_ms() - 1;
    seed(store.clone(), expired).await;
    let inviter = start(store, SecretKey::generate()).await;
    let joiner = on_disk(&tmp.path().join("joiner")).await;
    let code = InviteCode {
        inviter: inviter.node.node_id(),
        addrs: inviter.node.ticket().addrs,
        id,
        secret,
    };
    let refusal = |r: Result<NodeCard, JoinError>| match r {
        Err(JoinError::Refused(refusal)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(refusal(joiner.node.join(&code).await), JoinRefusal::Expired);
    let revoked = inviter.node.create_invite(2, 3_600_000).await.unwrap();
    let record = inviter.node.revoke_invite(revoked.id).await.unwrap();
    assert!(record.revoked);
    assert_eq!(
        refusal(joiner.node.join(&revoked).await),
        JoinRefusal::Revoked
    );
    let unknown = InviteCode {
        id: InviteId([0; 8]),
        ..code.clone()
    };
    assert_eq!(
        refusal(joiner.node.join(&unknown).await),
        JoinRefusal::UnknownInvite
    );
    let wrong_secret = InviteCode {
        secret: InviteSecret([0; 16]),
        ..revoked
    };
    assert_eq!(
        refusal(joiner.node.join(&wrong_secret).await),
        JoinRefusal::UnknownInvite
    );
    assert!(!is_peer(&*inviter.store, joiner.node.node_id()));
    for r in [inviter.node, joiner.node] {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_reaches_only_the_join_exchange_and_an_oversized_or_silent_attempt_is_cut_off() {
    let store = Arc::new(MemStore::new(mesh_protocol::Epoch([3; 16])));
    let inviter = start(store, SecretKey::generate()).await;
    let code = inviter.node.create_invite(1, 3_600_000).await.unwrap();
    let key = SecretKey::generate();
    let ep = raw(&key).await;
    let app_code = |e: ConnectionError| match e {
        ConnectionError::ApplicationClosed(c) => c.error_code.into_inner(),
        other => panic!("expected an application close, got {other:?}"),
    };
    // The mesh ALPN refuses it after the TLS handshake.
    let conn = ep.connect(addr(&code), mesh_bus::net::ALPN).await.unwrap();
    assert_eq!(
        app_code(timeout(T, conn.closed()).await.unwrap()),
        u64::from(close_code::UNKNOWN_NODE)
    );
    // A join message announced larger than the cap.
    let conn = ep.connect(addr(&code), JOIN_ALPN).await.unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    let too_big = (JOIN_MESSAGE_BYTES_MAX as u32 + 1).to_be_bytes();
    send.write_all(&too_big).await.unwrap();
    assert_eq!(
        app_code(timeout(T, conn.closed()).await.unwrap()),
        u64::from(close_code::FRAME_TOO_LARGE)
    );
    // A join that never says anything is cut off after the join timeout.
    let conn = ep.connect(addr(&code), JOIN_ALPN).await.unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(&[0]).await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(
        app_code(timeout(T, conn.closed()).await.unwrap()),
        u64::from(close_code::HANDSHAKE_TIMEOUT)
    );
    assert!(started.elapsed() <= mesh_bus::JOIN_TIMEOUT + std::time::Duration::from_secs(5));
    assert_eq!(store_invite_uses(&inviter), 1, "nothing spent");
    ep.close().await;
    inviter.node.shutdown().await;
}

fn store_invite_uses(r: &Running<MemStore>) -> u32 {
    r.store.invites().unwrap()[0].uses_left()
}
