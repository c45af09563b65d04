//! Helpers shared by the bus's test binaries and its bench (which includes
//! this file by path): raw transports and whole nodes on 127.0.0.1, and
//! waits on their events bounded by [`T`].
// Each binary uses its own subset of these helpers.
#![allow(dead_code)]
// A test fails by panicking.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use iroh::endpoint::{PortmapperConfig, presets};
use iroh::{Endpoint, RelayMode};
use mesh_bus::net::{ConnId, DisconnectReason, Net, NetEvent};
use mesh_bus::{CoreConfig, NetConfig, Node, NodeConfig};
use mesh_protocol::{Epoch, Frame, NodeId, SecretKey, Seq, StreamId};
use mesh_store::{Arrival, JournalRecord, MeshStore};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

/// The bound on every wait (generous: the machine is shared).
pub(crate) const T: Duration = Duration::from_secs(60);

/// How often a condition without an event of its own is looked at again.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// 127.0.0.1 on a free port.
pub(crate) fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A bare iroh endpoint with `key` on 127.0.0.1 (no relay, no address
/// lookup, no port mapping), for hand-made connections and frames.
pub(crate) async fn bare_endpoint(key: SecretKey) -> Endpoint {
    Endpoint::builder(presets::Minimal)
        .secret_key(key)
        .relay_mode(RelayMode::Disabled)
        .clear_address_lookup()
        .portmapper_config(PortmapperConfig::Disabled)
        .clear_ip_transports()
        .bind_addr(loopback())
        .expect("bind addr")
        .bind()
        .await
        .expect("raw endpoint")
}

/// A node on 127.0.0.1 with the core configured as `core`.
pub(crate) fn node_config(core: CoreConfig) -> NodeConfig {
    NodeConfig {
        net: NetConfig::with_bind_addr(loopback()),
        core,
        ..NodeConfig::default()
    }
}

/// Polls `f` until it holds, failing after [`T`].
pub(crate) async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + T;
    while !f().await {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// A raw transport and its events.
pub(crate) struct NetNode {
    pub(crate) net: Net,
    pub(crate) events: mpsc::Receiver<NetEvent>,
}

impl NetNode {
    pub(crate) async fn bind_with(config: NetConfig, key: SecretKey) -> NetNode {
        let (net, events) = Net::bind(config, key).await.expect("bind on 127.0.0.1:0");
        NetNode { net, events }
    }

    pub(crate) async fn bind(key: SecretKey) -> NetNode {
        NetNode::bind_with(NetConfig::with_bind_addr(loopback()), key).await
    }

    pub(crate) async fn new() -> NetNode {
        NetNode::bind(SecretKey::generate()).await
    }

    pub(crate) fn id(&self) -> NodeId {
        self.net.node_id()
    }

    pub(crate) async fn next(&mut self) -> NetEvent {
        timeout(T, self.events.recv())
            .await
            .expect("no event in time")
            .expect("event channel closed")
    }

    /// Skips events until `peer` is connected; returns the connection.
    pub(crate) async fn connected(&mut self, peer: NodeId) -> ConnId {
        loop {
            if let NetEvent::Connected { peer: p, conn } = self.next().await
                && p == peer
            {
                return conn;
            }
        }
    }

    /// Skips events until `conn` to `peer` is reported disconnected.
    pub(crate) async fn disconnected(&mut self, peer: NodeId, conn: ConnId) -> DisconnectReason {
        loop {
            if let NetEvent::Disconnected {
                peer: p,
                conn: c,
                reason,
            } = self.next().await
                && p == peer
                && c == conn
            {
                return reason;
            }
        }
    }

    /// The next event must be `peer` connecting; returns the connection.
    pub(crate) async fn next_connected(&mut self, peer: NodeId) -> ConnId {
        match self.next().await {
            NetEvent::Connected { peer: p, conn } if p == peer => conn,
            other => panic!("expected {peer} to connect, got {other:?}"),
        }
    }

    /// The next event must be `conn` to `peer` ending; returns why.
    pub(crate) async fn next_disconnected(
        &mut self,
        peer: NodeId,
        conn: ConnId,
    ) -> DisconnectReason {
        match self.next().await {
            NetEvent::Disconnected {
                peer: p,
                conn: c,
                reason,
            } if p == peer && c == conn => reason,
            other => panic!("expected {conn} to {peer} to end, got {other:?}"),
        }
    }

    /// The next event must be a frame.
    pub(crate) async fn frame(&mut self) -> (NodeId, ConnId, Frame) {
        match self.next().await {
            NetEvent::Frame {
                peer, conn, frame, ..
            } => (peer, conn, frame),
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    /// No event has come so far.
    pub(crate) fn no_event_yet(&mut self) {
        match self.events.try_recv() {
            Err(mpsc::error::TryRecvError::Empty) => {}
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// [`link_one_way`], then waits for both ends to report the connection;
/// returns it as `(dialer's, acceptor's)`.
pub(crate) async fn connect_one_way(
    dialer: &mut NetNode,
    acceptor: &mut NetNode,
) -> (ConnId, ConnId) {
    link_one_way(dialer, acceptor).await;
    let at_dialer = dialer.connected(acceptor.id()).await;
    let at_acceptor = acceptor.connected(dialer.id()).await;
    (at_dialer, at_acceptor)
}

/// `dialer` knows `acceptor`'s address; `acceptor` only allows `dialer`. So
/// exactly one connection is made, dialed by `dialer`.
pub(crate) async fn link_one_way(dialer: &NetNode, acceptor: &NetNode) {
    acceptor
        .net
        .add_peer(dialer.id(), Vec::new())
        .await
        .expect("add dialer");
    dialer
        .net
        .add_peer(acceptor.id(), acceptor.net.local_addrs())
        .await
        .expect("add acceptor");
}

/// An ack frame for a made-up stream: a frame the transport carries as is.
pub(crate) fn ack(n: u64) -> Frame {
    let a = SecretKey::from_bytes(&[7; 32]).public();
    Frame::Ack {
        stream: StreamId::direct(a, Epoch([7; 16]), a),
        upto: n,
    }
}

/// Makes `a` and `b` peers of each other, each at the other's addresses.
pub(crate) async fn link(a: &Node, b: &Node) {
    let (ra, rb) = tokio::join!(
        a.add_peer(b.node_id(), b.ticket().addrs),
        b.add_peer(a.node_id(), a.ticket().addrs),
    );
    ra.expect("a adds b");
    rb.expect("b adds a");
}

/// Waits (at most `bound`) until `node`'s journal head reaches `at_least`.
pub(crate) async fn wait_head_within(node: &Node, at_least: Arrival, bound: Duration) {
    let mut head = node.journal_head();
    timeout(bound, head.wait_for(|h| *h >= at_least))
        .await
        .expect("journal head in time")
        .expect("node running");
}

/// Waits (at most [`T`]) until `node`'s journal head reaches `at_least`.
pub(crate) async fn wait_head(node: &Node, at_least: Arrival) {
    wait_head_within(node, at_least, T).await;
}

/// One journal entry of a stream from one author, as the tests compare it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Got {
    Msg(Seq, Vec<u8>),
    Gap(Seq, Seq),
}

/// What `store` journaled of the streams `author` wrote to it, in order.
pub(crate) fn received(store: &dyn MeshStore, author: NodeId) -> Vec<Got> {
    let mut out = Vec::new();
    let mut after = 0;
    // Bounded: at most 1,000 pages of 1,000.
    for _ in 0..1_000 {
        let page = store.journal(after, 1_000).expect("journal");
        let Some(last) = page.last() else { break };
        after = last.arrival;
        for item in page {
            match item.record {
                JournalRecord::Envelope {
                    stream,
                    seq,
                    payload,
                    ..
                } if stream.author == author => out.push(Got::Msg(seq, payload)),
                JournalRecord::Gap { stream, from, to } if stream.author == author => {
                    out.push(Got::Gap(from, to))
                }
                _ => {}
            }
        }
    }
    out
}
