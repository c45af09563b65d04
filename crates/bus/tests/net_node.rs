//! Nodes (core + store actor + iroh transport) talking over 127.0.0.1.
//! Every wait is bounded by [`T`].

#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Got, T, link, node_config, received, wait_head};
use mesh_bus::net::ConnId;
use mesh_bus::{CoreConfig, Node, SendError};
use mesh_protocol::{Epoch, NodeId, SecretKey};
use mesh_store::{MemStore, StoreHandle};
use tokio::task::JoinSet;
use tokio::time::timeout;

struct Running {
    node: Arc<Node>,
    store: Arc<MemStore>,
}

async fn start(store: Arc<MemStore>, key: SecretKey) -> Running {
    let handle = StoreHandle::spawn(store.clone()).expect("store actor");
    let config = node_config(CoreConfig::default());
    let node = Node::start(config, key, handle).await.expect("start");
    Running {
        node: Arc::new(node),
        store,
    }
}

async fn fresh() -> Running {
    let epoch = Epoch(rand::random());
    start(Arc::new(MemStore::new(epoch)), SecretKey::generate()).await
}

/// The seqs and payloads of what `store` journaled from `author`, in order.
fn messages(store: &MemStore, author: NodeId) -> Vec<(u64, Vec<u8>)> {
    received(store, author)
        .into_iter()
        .filter_map(|g| match g {
            Got::Msg(seq, payload) => Some((seq, payload)),
            Got::Gap(..) => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_on_one_node_are_journaled_in_order_on_the_other() {
    const N: u64 = 2_000;
    let a = fresh().await;
    let b = fresh().await;
    link(&a.node, &b.node).await;
    let to = b.node.node_id();

    let start = Instant::now();
    let mut sends = JoinSet::new();
    for i in 0..N {
        let node = a.node.clone();
        sends.spawn(async move {
            let payload = format!("message {i:05}").into_bytes();
            node.send(to, 0, payload).await
        });
    }
    let mut seqs = Vec::new();
    while let Some(r) = timeout(T, sends.join_next()).await.expect("sends in time") {
        seqs.push(r.expect("task").expect("sent").seq);
    }
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (1..=N).collect::<Vec<_>>(),
        "every send got its own seq"
    );
    // B journals each of A's envelopes once.
    wait_head(&b.node, N).await;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{N} messages committed at A and journaled at B in {secs:.3} s = {:.0} msg/s",
        N as f64 / secs
    );

    let got = messages(&b.store, a.node.node_id());
    assert_eq!(got.len() as u64, N);
    for (i, (seq, _)) in got.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "in stream order");
    }
    let status = a.node.status().await.expect("status");
    let own = status.peers[0].own_stream.clone().expect("stream to b");
    assert_eq!(own.next_seq, N + 1);

    a.node.shutdown().await;
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_restarts_receives_what_was_sent_while_it_was_away() {
    let a = fresh().await;
    let b_key = SecretKey::generate();
    let b_store = Arc::new(MemStore::new(Epoch(rand::random())));
    let b = start(b_store.clone(), b_key.clone()).await;
    link(&a.node, &b.node).await;
    let to = b.node.node_id();
    a.node.send(to, 0, b"before".to_vec()).await.expect("send");
    wait_head(&b.node, 1).await;

    // B stops; A keeps writing to its outbox.
    b.node.shutdown().await;
    drop(b);
    for i in 0..50 {
        a.node
            .send(to, 0, format!("while away {i}").into_bytes())
            .await
            .expect("send");
    }

    // B comes back with the same store and key on a new port.
    let b = start(b_store, b_key).await;
    a.node
        .add_peer(to, b.node.ticket().addrs)
        .await
        .expect("new address");
    wait_head(&b.node, 51).await;
    let got = messages(&b.store, a.node.node_id());
    assert_eq!(got.len(), 51);
    assert_eq!(got[0].1, b"before");
    assert_eq!(got[50].1, b"while away 49");

    a.node.shutdown().await;
    b.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_an_unknown_peer_is_refused_and_a_stopped_node_says_so() {
    let a = fresh().await;
    let stranger = SecretKey::generate().public();
    match a.node.send(stranger, 0, b"hi".to_vec()).await {
        Err(SendError::Refused(e)) => assert!(e.to_string().contains("unknown peer"), "{e}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    a.node.shutdown().await;
    assert_eq!(
        a.node.send(stranger, 0, b"hi".to_vec()).await,
        Err(SendError::Stopped)
    );
}

/// The live connection `node` holds to `peer`, once there is one.
async fn conn_to(node: &Node, peer: NodeId) -> ConnId {
    let deadline = Instant::now() + T;
    let mut head = node.journal_head();
    loop {
        let status = node.status().await.expect("status");
        if let Some(c) = status
            .peers
            .iter()
            .find(|p| p.node == peer)
            .and_then(|p| p.conn)
        {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "no connection to the peer in time"
        );
        // Poll again after the next journal change or a short bound.
        let _ = timeout(Duration::from_millis(50), head.changed()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_and_removing_a_peer_leaves_a_live_stream_to_another_flowing() {
    let a = fresh().await;
    let b = fresh().await;
    let c = fresh().await;
    // Only A can dial B, so their one connection is never a duplicate that
    // the other side's dial replaces (when both dial, the lower id's dial
    // may arrive after traffic has started on the other and replace it).
    a.node
        .add_peer(b.node.node_id(), b.node.ticket().addrs)
        .await
        .expect("a adds b");
    b.node
        .add_peer(a.node.node_id(), Vec::new())
        .await
        .expect("b adds a without an address");
    let to_b = b.node.node_id();
    a.node.send(to_b, 0, b"first".to_vec()).await.expect("send");
    wait_head(&b.node, 1).await;
    let before = conn_to(&a.node, to_b).await;

    // A stream to B runs while C is added and removed.
    let sender = a.node.clone();
    let stream = tokio::spawn(async move {
        for i in 0..300u32 {
            sender
                .send(to_b, 0, i.to_be_bytes().to_vec())
                .await
                .expect("send");
        }
    });
    link(&a.node, &c.node).await;
    let to_c = c.node.node_id();
    a.node
        .send(to_c, 0, b"to c".to_vec())
        .await
        .expect("send to c");
    wait_head(&c.node, 1).await;
    a.node.remove_peer(to_c).await.expect("remove c");
    timeout(T, stream)
        .await
        .expect("stream in time")
        .expect("sends");
    wait_head(&b.node, 301).await;

    assert_eq!(
        conn_to(&a.node, to_b).await,
        before,
        "the connection to B was never replaced"
    );
    let got = messages(&b.store, a.node.node_id());
    assert_eq!(got.len(), 301);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, (seq, _))| *seq == i as u64 + 1)
    );
    let status = a.node.status().await.expect("status");
    assert!(
        status.peers.iter().all(|p| p.node != to_c),
        "C is forgotten"
    );
    assert!(matches!(
        a.node.send(to_c, 0, b"gone".to_vec()).await,
        Err(SendError::Refused(_))
    ));

    a.node.shutdown().await;
    b.node.shutdown().await;
    c.node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peers_acks_are_committed_even_when_nothing_else_happens() {
    let a = fresh().await;
    let b = fresh().await;
    link(&a.node, &b.node).await;
    let to = b.node.node_id();
    for i in 0..10u32 {
        a.node
            .send(to, 0, i.to_be_bytes().to_vec())
            .await
            .expect("send");
    }
    // The acks alone wait at most `ack_ride_ms` for company, then commit.
    common::until("a to record b's ack of all 10", || async {
        let status = a.node.status().await.expect("status");
        status.peers[0]
            .own_stream
            .as_ref()
            .is_some_and(|o| o.last_acked == 10)
    })
    .await;
    a.node.shutdown().await;
    b.node.shutdown().await;
}
