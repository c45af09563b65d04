//! Nodes finding each other again over 127.0.0.1: a node that cannot reach
//! a peer asks the peers it is connected to for that peer's newest card,
//! and dials where it says. Every wait is bounded by [`T`].

#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{Got, node_config, received, until, wait_head};
use mesh_bus::{CoreConfig, Node, NodeStatus};
use mesh_protocol::{Epoch, NodeId, SecretKey};
use mesh_store::{MemStore, StoreHandle};

struct Running {
    node: Node,
    store: Arc<MemStore>,
}

/// Asks about an unreachable peer soon and often, so the test is quick.
fn quick() -> CoreConfig {
    CoreConfig {
        card_ask_ms: 100,
        card_ask_retry_ms: 300,
        ..CoreConfig::default()
    }
}

async fn start(store: Arc<MemStore>, key: SecretKey) -> Running {
    start_with(store, key, quick()).await
}

async fn start_with(store: Arc<MemStore>, key: SecretKey, core: CoreConfig) -> Running {
    let handle = StoreHandle::spawn(store.clone()).expect("store actor");
    let node = Node::start(node_config(core), key, handle)
        .await
        .expect("start");
    Running { node, store }
}

fn connected(status: &NodeStatus, peer: NodeId) -> bool {
    status
        .peers
        .iter()
        .any(|p| p.node == peer && p.conn.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_reach_a_peer_learns_where_it_is_from_another_peer() {
    let x = start(
        Arc::new(MemStore::new(Epoch([1; 16]))),
        SecretKey::generate(),
    )
    .await;
    let y = start(
        Arc::new(MemStore::new(Epoch([2; 16]))),
        SecretKey::generate(),
    )
    .await;
    let z = start(
        Arc::new(MemStore::new(Epoch([3; 16]))),
        SecretKey::generate(),
    )
    .await;
    let (xi, yi) = (x.node.node_id(), y.node.node_id());
    // Z knows both and both know Z. Y knows X only at an address where
    // nothing listens any more (where X was before it moved), and X knows
    // no address of Y: neither can dial the other until it learns from Z
    // where the other is.
    for (a, b) in [(&x, &z), (&y, &z), (&z, &x), (&z, &y)] {
        a.node
            .add_peer(b.node.node_id(), b.node.ticket().addrs)
            .await
            .unwrap();
    }
    let gone = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let stale = gone.local_addr().unwrap();
    drop(gone);
    let started = Instant::now();
    x.node.add_peer(yi, Vec::new()).await.unwrap();
    y.node.add_peer(xi, vec![stale]).await.unwrap();
    let x_addrs = x.node.ticket().addrs;
    until("y to reach x where z says it is", || async {
        let st = y.node.status().await.unwrap();
        st.peers
            .iter()
            .any(|p| p.node == xi && p.addrs == x_addrs && p.conn.is_some())
    })
    .await;
    eprintln!(
        "y found x through z {:.2} s after it was told a dead address",
        started.elapsed().as_secs_f64()
    );
    // Either side may learn first: y asks z where x is, or x asks z where y
    // is and dials y (whose Hello then tells y where x is). Which one wins
    // is timing.
    let y_status = y.node.status().await.unwrap();
    let x_status = x.node.status().await.unwrap();
    assert!(
        y_status.core.cards_asked + x_status.core.cards_asked >= 1,
        "x or y asked z about the other"
    );
    assert!(y_status.core.cards_learned >= 1, "y learned x's card");
    let z_status = z.node.status().await.unwrap();
    assert!(z_status.core.frames_out.card_answer >= 1, "z answered");
    until("x to see y connected too", || async {
        connected(&x.node.status().await.unwrap(), yi)
    })
    .await;
    // And messages flow, both ways.
    y.node.send(xi, 0, b"found you".to_vec()).await.unwrap();
    x.node.send(yi, 0, b"so you did".to_vec()).await.unwrap();
    wait_head(&x.node, 2).await;
    wait_head(&y.node, 2).await;
    assert_eq!(
        received(&*x.store, yi),
        vec![Got::Msg(1, b"found you".to_vec())]
    );
    assert_eq!(
        received(&*y.store, xi),
        vec![Got::Msg(1, b"so you did".to_vec())]
    );
    for r in [x, y, z] {
        r.node.shutdown().await;
    }
}
