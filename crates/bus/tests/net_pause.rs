//! Pausing and resuming a link in the iroh transport, against real
//! endpoints on 127.0.0.1. Every wait is bounded by [`T`]; conditions that
//! have no event of their own are polled.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::net::SocketAddr;
use std::time::Duration;

use mesh_bus::net::{
    ConnId, DisconnectReason, Net, NetConfig, NetEvent, PAUSED_REASON, PeerError, close_code,
};
use mesh_protocol::{NodeId, SecretKey};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

/// The bound on every wait in these tests.
const T: Duration = Duration::from_secs(30);
/// How often a condition without an event is polled.
const POLL: Duration = Duration::from_millis(10);

struct Node {
    net: Net,
    events: mpsc::Receiver<NetEvent>,
}

impl Node {
    async fn new() -> Node {
        let bind = SocketAddr::from(([127, 0, 0, 1], 0));
        let (net, events) = Net::bind(NetConfig::with_bind_addr(bind), SecretKey::generate())
            .await
            .expect("bind on 127.0.0.1:0");
        Node { net, events }
    }

    fn id(&self) -> NodeId {
        self.net.node_id()
    }

    async fn next(&mut self) -> NetEvent {
        timeout(T, self.events.recv())
            .await
            .expect("no event in time")
            .expect("event channel closed")
    }

    /// The next event must be `peer` connecting; returns the connection.
    async fn connected(&mut self, peer: NodeId) -> ConnId {
        match self.next().await {
            NetEvent::Connected { peer: p, conn } if p == peer => conn,
            other => panic!("expected {peer} to connect, got {other:?}"),
        }
    }

    /// The next event must be `conn` to `peer` ending; returns why.
    async fn disconnected(&mut self, peer: NodeId, conn: ConnId) -> DisconnectReason {
        match self.next().await {
            NetEvent::Disconnected {
                peer: p,
                conn: c,
                reason,
            } if p == peer && c == conn => reason,
            other => panic!("expected {conn} to {peer} to end, got {other:?}"),
        }
    }

    fn no_event_yet(&mut self) {
        match self.events.try_recv() {
            Err(mpsc::error::TryRecvError::Empty) => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// Polls `f` until it holds, failing after [`T`].
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_link_is_closed_refused_and_not_dialed_until_resumed() {
    let mut a = Node::new().await;
    let mut b = Node::new().await;
    // A dials; once connected, B learns A's address too (and so redials A
    // whenever it has no connection).
    b.net.add_peer(a.id(), Vec::new()).await.unwrap();
    a.net.add_peer(b.id(), b.net.local_addrs()).await.unwrap();
    let ca = a.connected(b.id()).await;
    let cb = b.connected(a.id()).await;
    b.net.add_peer(a.id(), a.net.local_addrs()).await.unwrap();

    a.net.set_paused(b.id(), true).await.unwrap();
    assert_eq!(
        a.disconnected(b.id(), ca).await,
        DisconnectReason::ClosedLocally {
            code: close_code::PAUSED,
            reason: PAUSED_REASON.into()
        }
    );
    assert_eq!(
        b.disconnected(a.id(), cb).await,
        DisconnectReason::ClosedByPeer {
            code: close_code::PAUSED.into(),
            reason: PAUSED_REASON.into()
        }
    );
    let p = &a.net.peers()[0];
    assert!(p.paused && p.conn.is_none(), "{p:?}");
    // Pausing again changes nothing.
    a.net.set_paused(b.id(), true).await.unwrap();

    // B keeps redialing; A refuses each dial and reports nothing.
    until(
        "a to refuse two of b's dials, and b to see them fail",
        || a.net.counters().paused_refused >= 2 && b.net.counters().dial_failures >= 2,
    )
    .await;
    assert_eq!(a.net.counters().refused, 0, "not counted as unknown nodes");
    a.no_event_yet();
    b.no_event_yet();

    a.net.set_paused(b.id(), false).await.unwrap();
    let ca = a.connected(b.id()).await;
    let cb = b.connected(a.id()).await;
    assert!(!a.net.peers()[0].paused);
    a.net.try_send(b.id(), ca, &ack_frame()).unwrap();
    match b.next().await {
        NetEvent::Frame { conn, frame, .. } => {
            assert_eq!((conn, frame), (cb, ack_frame()));
        }
        other => panic!("expected a frame, got {other:?}"),
    }
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_dials_the_peer_at_once_even_when_it_cannot_dial_back() {
    let mut a = Node::new().await;
    let mut b = Node::new().await;
    // B has no address for A: every connection is A's dial.
    b.net.add_peer(a.id(), Vec::new()).await.unwrap();
    a.net.add_peer(b.id(), b.net.local_addrs()).await.unwrap();
    let ca = a.connected(b.id()).await;
    let cb = b.connected(a.id()).await;
    a.net.set_paused(b.id(), true).await.unwrap();
    a.disconnected(b.id(), ca).await;
    b.disconnected(a.id(), cb).await;
    let dials = a.net.counters().connections;

    a.net.set_paused(b.id(), false).await.unwrap();
    a.connected(b.id()).await;
    b.connected(a.id()).await;
    assert_eq!(a.net.counters().connections, dials + 1);
    assert!(a.net.peers()[0].dialed_here);
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_an_unknown_peer_is_an_error_and_removing_a_peer_forgets_its_pause() {
    let a = Node::new().await;
    let b = Node::new().await;
    assert_eq!(
        a.net.set_paused(b.id(), true).await,
        Err(PeerError::UnknownPeer(b.id()))
    );
    a.net.add_peer(b.id(), Vec::new()).await.unwrap();
    a.net.set_paused(b.id(), true).await.unwrap();
    a.net.remove_peer(b.id()).await.unwrap();
    a.net.add_peer(b.id(), Vec::new()).await.unwrap();
    assert!(!a.net.peers()[0].paused);
    a.net.shutdown().await;
    b.net.shutdown().await;
}

fn ack_frame() -> mesh_protocol::Frame {
    let k = SecretKey::from_bytes(&[7; 32]).public();
    mesh_protocol::Frame::Ack {
        stream: mesh_protocol::StreamId::direct(k, mesh_protocol::Epoch([7; 16]), k),
        upto: 5,
    }
}
