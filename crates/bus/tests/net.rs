//! The iroh transport against real endpoints on 127.0.0.1 (relays, address
//! lookup and the portmapper off). Every wait is bounded by [`T`].

#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;

use std::time::{Duration, Instant};

use common::{NetNode, T, ack, bare_endpoint, connect_one_way, link_one_way, loopback, until};
use iroh::endpoint::ConnectionError;
use iroh::{Endpoint, EndpointAddr};
use mesh_bus::net::{
    ALPN, ConnId, DisconnectReason, INSTANCE_BYTES, Net, NetConfig, NetError, NetEvent, PREAMBLE,
    PeerStatus, SendError, close_code, load_or_create_node_key,
};
use mesh_protocol::{
    Channel, EntryHeader, Epoch, Frame, FrameError, NodeId, Payloads, SecretKey, SignedBatch,
};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// A batch frame carrying one payload of `len` bytes, numbered `seq`.
fn batch(author: NodeId, to: NodeId, seq: u64, payload: &[u8]) -> Frame {
    Frame::Batch {
        batch: SignedBatch {
            author,
            epoch: Epoch([1; 16]),
            channel: Channel::Direct(to),
            first_seq: seq,
            entries: vec![EntryHeader::for_payload(seq, 0, 0, payload)],
            // A raw transport does not verify; the node does.
            sig: [0; 64],
        },
        payloads: Payloads(vec![payload.to_vec()]),
    }
}

fn seq_of(frame: &Frame) -> u64 {
    match frame {
        Frame::Batch { batch, .. } => batch.first_seq,
        other => panic!("expected a batch, got {other:?}"),
    }
}

/// A bare iroh endpoint, for hand-written misbehaviour.
async fn raw_endpoint() -> Endpoint {
    bare_endpoint(SecretKey::generate()).await
}

/// A [`raw_endpoint`] that `node` allows as a peer.
async fn allowed_raw_endpoint(node: &NetNode) -> Endpoint {
    let raw = raw_endpoint().await;
    node.net
        .add_peer(raw.id(), Vec::new())
        .await
        .expect("allow raw");
    raw
}

fn addr_of(node: &NetNode) -> EndpointAddr {
    let mut addr = EndpointAddr::new(node.id());
    for a in node.net.local_addrs() {
        addr = addr.with_ip_addr(a);
    }
    addr
}

fn app_close(e: ConnectionError) -> (u64, String) {
    match e {
        ConnectionError::ApplicationClosed(c) => (
            c.error_code.into_inner(),
            String::from_utf8_lossy(&c.reason).into_owned(),
        ),
        other => panic!("expected an application close, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_connect_and_exchange_frames_both_ways() {
    let mut a = NetNode::new().await;
    let mut b = NetNode::new().await;
    let (ca, cb) = connect_one_way(&mut a, &mut b).await;

    a.net.try_send(b.id(), ca, &ack(1)).await.expect("a -> b");
    assert_eq!(b.frame().await, (a.id(), cb, ack(1)));
    b.net.send(a.id(), cb, &ack(2)).await.expect("b -> a");
    assert_eq!(a.frame().await, (b.id(), ca, ack(2)));

    // A stale connection id is refused, not sent on the live one.
    let stale = ConnId(ca.0 + 1000);
    assert_eq!(
        a.net.try_send(b.id(), stale, &ack(3)).await,
        Err(SendError::NotConnected)
    );

    let status = a.net.peers().await;
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].conn, Some(ca));
    assert!(status[0].dialed_here);
    let status = b.net.peers().await;
    assert_eq!(status[0].conn, Some(cb));
    assert!(!status[0].dialed_here);

    let counters = a.net.counters();
    assert_eq!((counters.frames_out, counters.frames_in), (1, 1));
    let a_id = a.id();
    a.net.shutdown().await;
    // B hears the shutdown at once, not after the idle timeout.
    match b.disconnected(a_id, cb).await {
        DisconnectReason::ClosedByPeer { code, .. } => {
            assert_eq!(code, u64::from(close_code::SHUTDOWN))
        }
        other => panic!("unexpected reason {other:?}"),
    }
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_frames_arrive_in_order() {
    const N: u64 = 10_000;
    let mut a = NetNode::new().await;
    let mut b = NetNode::new().await;
    let (ca, cb) = connect_one_way(&mut a, &mut b).await;

    let payload = vec![0xAB; 1024];
    let frames: Vec<Frame> = (1..=N)
        .map(|i| batch(a.id(), b.id(), i, &payload))
        .collect();
    let start = Instant::now();
    let (net, to) = (&a.net, b.id());
    let send = async move {
        for f in &frames {
            net.send(to, ca, f).await.expect("send");
        }
    };
    let recv = async {
        for i in 1..=N {
            let (peer, conn, frame) = b.frame().await;
            assert_eq!((peer, conn), (a.id(), cb));
            assert_eq!(seq_of(&frame), i, "frame out of order");
        }
    };
    tokio::join!(send, recv);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{N} frames of 1 KiB in {secs:.3} s = {:.0} frames/s",
        N as f64 / secs
    );
    assert_eq!(b.net.counters().frames_in, N);
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_node_is_refused_with_403_and_never_reported() {
    let mut a = NetNode::new().await;
    let raw = raw_endpoint().await;
    let conn = timeout(T, raw.connect(addr_of(&a), ALPN))
        .await
        .expect("connect in time")
        .expect("handshake completes; refusal comes after");
    // The refusal may arrive before the stream opens; either way it is refused.
    let closed = match conn.open_bi().await {
        Ok((mut send, _recv)) => {
            let _ = send.write_all(&PREAMBLE).await;
            timeout(T, conn.closed()).await.expect("closed in time")
        }
        Err(e) => e,
    };
    let (code, reason) = app_close(closed);
    assert_eq!(
        (code, reason.as_str()),
        (u64::from(close_code::UNKNOWN_NODE), "unknown node")
    );
    assert_eq!(a.net.counters().refused, 1);
    assert!(matches!(
        a.events.try_recv(),
        Err(mpsc::error::TryRecvError::Empty)
    ));
    raw.close().await;

    // A removed peer is refused the same way from then on, and its live
    // connection is closed with its own code.
    let mut b = NetNode::new().await;
    let (cb, ca) = connect_one_way(&mut b, &mut a).await;
    a.net.remove_peer(b.id()).await.expect("remove");
    assert!(matches!(
        a.disconnected(b.id(), ca).await,
        DisconnectReason::ClosedLocally {
            code: close_code::PEER_REMOVED,
            ..
        }
    ));
    match b.disconnected(a.id(), cb).await {
        DisconnectReason::ClosedByPeer { code, .. } => {
            assert_eq!(code, u64::from(close_code::PEER_REMOVED))
        }
        other => panic!("unexpected reason {other:?}"),
    }
    assert!(a.net.peers().await.is_empty());
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_version_1_preamble_is_refused_with_a_reason_naming_both_versions() {
    let mut a = NetNode::new().await;
    let key = SecretKey::generate();
    a.net
        .add_peer(key.public(), Vec::new())
        .await
        .expect("a knows the old node");
    let raw = bare_endpoint(key.clone()).await;
    let conn = timeout(T, raw.connect(addr_of(&a), ALPN))
        .await
        .expect("connect in time")
        .expect("a knows the key");
    let (mut send, _recv) = conn.open_bi().await.expect("stream");
    // What a node of protocol 1 writes: its preamble and its instance.
    let mut old = b"amesh/1\n".to_vec();
    old.extend_from_slice(&[0; INSTANCE_BYTES]);
    send.write_all(&old).await.expect("preamble written");
    let closed = timeout(T, conn.closed()).await.expect("closed in time");
    let (code, reason) = app_close(closed);
    assert_eq!(code, u64::from(close_code::VERSION_MISMATCH), "{reason}");
    assert_eq!(
        reason,
        format!(
            "peer speaks agent-mesh protocol 1, this node speaks {}; upgrade the older node",
            mesh_protocol::PROTOCOL_VERSION
        )
    );
    // Shown for that peer, counted, and no connection was reported. The
    // close goes out before the handshake's end reaches the transport, so
    // the peer's status is asked until it says so.
    let peers = timeout(T, async {
        loop {
            let peers = a.net.peers().await;
            if peers[0].refused.is_some() {
                break peers;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the refusal is shown in time");
    assert_eq!(peers[0].refused.as_deref(), Some(reason.as_str()));
    assert_eq!(a.net.counters().version_refused, 1);
    assert!(matches!(
        a.events.try_recv(),
        Err(mpsc::error::TryRecvError::Empty)
    ));
    raw.close().await;
    a.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_reconnected_with_a_new_conn_id() {
    let mut a = NetNode::new().await;
    let b_key = SecretKey::generate();
    let b = NetNode::bind(b_key.clone()).await;
    link_one_way(&a, &b).await;
    let first = a.connected(b.id()).await;
    let old_addrs = b.net.local_addrs();
    let b_id = b.id();

    // B goes away (dropping the handle closes it in the background).
    drop(b);
    a.disconnected(b_id, first).await;

    // B comes back with the same key on a new port; A learns the new address.
    let mut b = NetNode::bind(b_key).await;
    assert_eq!(b.id(), b_id);
    assert_ne!(b.net.local_addrs(), old_addrs);
    b.net.add_peer(a.id(), Vec::new()).await.expect("allow a");
    a.net
        .add_peer(b_id, b.net.local_addrs())
        .await
        .expect("new addr");
    let second = a.connected(b_id).await;
    assert_ne!(second, first);
    let cb = b.connected(a.id()).await;
    a.net
        .try_send(b_id, second, &ack(9))
        .await
        .expect("send on the new connection");
    assert_eq!(b.frame().await, (a.id(), cb, ack(9)));
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_sends_a_bad_frame_is_closed_and_counted() {
    let mut a = NetNode::new().await;
    let raw = allowed_raw_endpoint(&a).await;

    // (bytes after the preamble, expected close code)
    let cases: [(&[u8], u32); 2] = [
        // A length header far over MAX_FRAME_BYTES.
        (&[0xFF, 0xFF, 0xFF, 0xFF], close_code::FRAME_TOO_LARGE),
        // A 3-byte body with a tag that names no frame.
        (&[0, 0, 0, 3, 0xEE, 0, 0], close_code::BAD_FRAME),
    ];
    for (n, (bytes, code)) in cases.into_iter().enumerate() {
        let conn = timeout(T, raw.connect(addr_of(&a), ALPN))
            .await
            .expect("connect in time")
            .expect("connect");
        let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
        send.write_all(&PREAMBLE).await.expect("preamble");
        send.write_all(&[0; INSTANCE_BYTES])
            .await
            .expect("instance");
        let mut answer = [0u8; PREAMBLE.len() + INSTANCE_BYTES];
        timeout(T, recv.read_exact(&mut answer))
            .await
            .expect("in time")
            .expect("answer");
        assert_eq!(answer[..PREAMBLE.len()], PREAMBLE);
        let c = a.connected(raw.id()).await;

        send.write_all(bytes).await.expect("write the bad frame");
        let (got, _) = app_close(timeout(T, conn.closed()).await.expect("closed in time"));
        assert_eq!(got, u64::from(code));
        match a.disconnected(raw.id(), c).await {
            DisconnectReason::BadFrame(e) => match code {
                close_code::FRAME_TOO_LARGE => assert!(matches!(e, FrameError::TooLarge { .. })),
                _ => assert_eq!(e, FrameError::UnknownTag(0xEE)),
            },
            other => panic!("unexpected reason {other:?}"),
        }
        assert_eq!(a.net.counters().bad_frames, n as u64 + 1);
    }
    raw.close().await;
    a.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_both_sides_dial_they_keep_the_same_single_connection() {
    let mut collisions = 0;
    for _ in 0..4 {
        let mut a = NetNode::new().await;
        let mut b = NetNode::new().await;
        let (a_id, b_id) = (a.id(), b.id());
        let (ra, rb) = tokio::join!(
            a.net.add_peer(b_id, b.net.local_addrs()),
            b.net.add_peer(a_id, a.net.local_addrs()),
        );
        ra.expect("add b");
        rb.expect("add a");

        // Each side pings on every connection it is told about; both are
        // settled once each has heard the other's ping on its live connection
        // and the two agree which one it is (one dialed it, the other
        // accepted it). While the losing connection's close is still on its
        // way the two can briefly each hold the one they accepted, so they
        // are watched until they agree; two kept connections never do.
        let mut sa = Side::default();
        let mut sb = Side::default();
        let (pa, _) = timeout(T, async {
            loop {
                if let (Some(pa), Some(pb)) = (
                    sa.settled(&a.net, b_id).await,
                    sb.settled(&b.net, a_id).await,
                ) && pa.dialed_here != pb.dialed_here
                {
                    break (pa, pb);
                }
                tokio::select! {
                    Some(ev) = a.events.recv() => sa.on(&a.net, ev, 1).await,
                    Some(ev) = b.events.recv() => sb.on(&b.net, ev, 2).await,
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("both sides keep the same connection in time: {sa:?} {sb:?}"));

        if sa.connections > 1 || sb.connections > 1 {
            collisions += 1;
            let low_is_a = a_id.as_bytes() < b_id.as_bytes();
            assert_eq!(
                pa.dialed_here, low_is_a,
                "the connection dialed by the lower id wins"
            );
        }
        a.net.shutdown().await;
        b.net.shutdown().await;
    }
    println!("{collisions} of 4 rounds had two connections meet");
}

#[derive(Debug, Default)]
struct Side {
    live: Option<ConnId>,
    heard: bool,
    connections: u32,
}

impl Side {
    async fn on(&mut self, net: &Net, ev: NetEvent, tag: u64) {
        match ev {
            NetEvent::Connected { peer, conn } => {
                self.connections += 1;
                self.live = Some(conn);
                self.heard = false;
                // The connection may be replaced at once; then this is lost.
                let _ = net.try_send(peer, conn, &ack(tag)).await;
            }
            NetEvent::Frame { conn, .. } if Some(conn) == self.live => self.heard = true,
            NetEvent::Disconnected { conn, .. } if Some(conn) == self.live => {
                self.live = None;
                self.heard = false;
            }
            _ => {}
        }
    }

    /// The peer's status, once this side has heard its ping on the live
    /// connection the status names.
    async fn settled(&self, net: &Net, peer: NodeId) -> Option<PeerStatus> {
        if !self.heard {
            return None;
        }
        net.peers()
            .await
            .into_iter()
            .find(|p| p.node == peer && p.conn.is_some() && p.conn == self.live)
    }
}

#[test]
fn the_node_key_persists_and_a_wrong_size_key_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let k1 = load_or_create_node_key(dir.path()).expect("create");
    let k2 = load_or_create_node_key(dir.path()).expect("load");
    assert_eq!(k1.public(), k2.public());
    let path = dir.path().join("node.key");
    assert_eq!(std::fs::read(&path).expect("read").len(), 32);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    // No temporary files are left behind.
    assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);

    let bad = tempfile::tempdir().expect("tempdir");
    let bad_path = bad.path().join("node.key");
    std::fs::write(&bad_path, [1u8; 31]).expect("write");
    match load_or_create_node_key(bad.path()) {
        Err(e @ NetError::KeyWrongSize { len: 31, .. }) => {
            assert!(e.to_string().contains("not changed"), "{e}");
        }
        other => panic!("expected a wrong-size error, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&bad_path).expect("read"),
        vec![1u8; 31],
        "left as it was"
    );
    std::fs::write(&bad_path, [1u8; 33]).expect("write");
    assert!(matches!(
        load_or_create_node_key(bad.path()),
        Err(NetError::KeyWrongSize { len: 33, .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_a_taken_address_names_it() {
    let a = NetNode::new().await;
    let taken = a.net.local_addrs()[0];
    match Net::bind(NetConfig::with_bind_addr(taken), SecretKey::generate()).await {
        Err(e @ NetError::AddrInUse { .. }) => assert!(e.to_string().contains(&taken.to_string())),
        Err(other) => panic!("expected AddrInUse, got {other:?}"),
        Ok(_) => panic!("bound a taken address"),
    }
    a.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_by_the_bus_is_redialed_with_a_new_conn_id() {
    let mut a = NetNode::new().await;
    let mut b = NetNode::new().await;
    let (first, cb) = connect_one_way(&mut a, &mut b).await;
    a.net
        .close(b.id(), first, close_code::PROTOCOL_VIOLATION, "wrong node")
        .await
        .expect("close");
    match b.disconnected(a.id(), cb).await {
        DisconnectReason::ClosedByPeer { code, reason } => {
            assert_eq!(
                (code, reason.as_str()),
                (u64::from(close_code::PROTOCOL_VIOLATION), "wrong node")
            );
        }
        other => panic!("unexpected reason {other:?}"),
    }
    assert!(matches!(
        a.disconnected(b.id(), first).await,
        DisconnectReason::ClosedLocally {
            code: close_code::PROTOCOL_VIOLATION,
            ..
        }
    ));
    // A dials again after its backoff; sends on the old id are refused.
    let second = a.connected(b.id()).await;
    assert_ne!(second, first);
    assert_eq!(
        a.net.try_send(b.id(), first, &ack(1)).await,
        Err(SendError::NotConnected)
    );
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_higher_id_peer_that_restarts_is_reconnected_before_the_idle_timeout() {
    // The lower id holds a connection it dialed; idle timeout far above the bound.
    let (low_key, high_key) = loop {
        let (x, y) = (SecretKey::generate(), SecretKey::generate());
        if x.public().as_bytes() < y.public().as_bytes() {
            break (x, y);
        }
    };
    let config = NetConfig {
        idle_timeout: Duration::from_secs(60),
        ..NetConfig::with_bind_addr(loopback())
    };
    let mut low = NetNode::bind_with(config, low_key).await;
    // High runs on its own runtime, so it can die without closing anything.
    let crash_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let key = high_key.clone();
    let bound = crash_rt.spawn(async move { NetNode::bind(key).await });
    let high = timeout(T, bound)
        .await
        .expect("bound in time")
        .expect("bind high");
    let high_id = high.id();
    link_one_way(&low, &high).await;
    let first = low.connected(high_id).await;
    assert!(
        low.net.peers().await[0].dialed_here,
        "low dialed the live connection"
    );

    // Kill -9: the runtime stops, no close frame is sent.
    crash_rt.shutdown_background();
    drop(high);

    // High restarts with the same key and dials low, which still holds the
    // dead connection (its idle timeout is 60 s).
    let restarted = Instant::now();
    let mut high = NetNode::bind(high_key).await;
    high.net
        .add_peer(low.id(), low.net.local_addrs())
        .await
        .expect("high knows low");
    let second = timeout(Duration::from_secs(8), low.connected(high_id))
        .await
        .expect("low takes the restarted peer's connection well before the idle timeout");
    assert_ne!(second, first);
    let ch = high.connected(low.id()).await;
    println!("reconnected {:?} after the restart", restarted.elapsed());
    low.net
        .try_send(high_id, second, &ack(5))
        .await
        .expect("send on the new connection");
    assert_eq!(high.frame().await, (low.id(), ch, ack(5)));
    low.net.shutdown().await;
    high.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_processes_with_one_key_are_an_identity_conflict_at_both_ends() {
    let mut b = NetNode::new().await;
    let key = SecretKey::generate();
    // Clone X connects first; clone Y, a later process with the same key
    // (a copied data dir run twice), replaces it as a restart would.
    let mut x = NetNode::bind(key.clone()).await;
    let (xb, bx) = connect_one_way(&mut x, &mut b).await;
    let mut y = NetNode::bind(key.clone()).await;
    y.net
        .add_peer(b.id(), b.net.local_addrs())
        .await
        .expect("add b");
    let yb = y.connected(b.id()).await;
    b.disconnected(x.id(), bx).await;
    let by = b.connected(y.id()).await;
    x.disconnected(b.id(), xb).await;
    // X is alive and dials again: never silently taken for a dead process.
    until("b to see the identity conflict", || async {
        b.net.peers().await[0].identity_conflict.is_some()
    })
    .await;
    until("x to hear it was refused for it", || async {
        x.net.peers().await[0].identity_conflict.is_some()
    })
    .await;
    let why = b.net.peers().await[0].identity_conflict.clone().unwrap();
    assert!(why.contains("two processes run with node key"), "{why}");
    assert!(b.net.counters().identity_conflicts >= 1);
    assert!(x.net.counters().identity_conflicts >= 1);
    // The live one keeps working; X is not let in in its place.
    y.net.try_send(b.id(), yb, &ack(3)).await.expect("y -> b");
    assert_eq!(b.frame().await, (y.id(), by, ack(3)));
    assert_eq!(b.net.peers().await[0].conn, Some(by));
    // Once Y is gone, X gets in.
    let y_id = y.id();
    y.net.shutdown().await;
    b.disconnected(y_id, by).await;
    let bx = b.connected(x.id()).await;
    assert_ne!(bx, by);
    x.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_protocol_5_is_refused_at_its_preamble_naming_both_versions() {
    let mut a = NetNode::new().await;
    let raw = allowed_raw_endpoint(&a).await;
    let conn = timeout(T, raw.connect(addr_of(&a), ALPN))
        .await
        .expect("connect in time")
        .expect("connect");
    let (mut send, _recv) = conn.open_bi().await.expect("open stream");
    // What a node of the previous protocol (before read receipts) writes.
    send.write_all(b"amesh/5\n").await.expect("v5 preamble");
    send.write_all(&[0; INSTANCE_BYTES])
        .await
        .expect("instance");
    let (code, reason) = app_close(timeout(T, conn.closed()).await.expect("closed in time"));
    assert_eq!(code, u64::from(close_code::VERSION_MISMATCH));
    assert!(
        reason.contains("protocol 5") && reason.contains("this node speaks 6"),
        "{reason}"
    );
    assert_eq!(PREAMBLE, *b"amesh/6\n");
    a.no_event_yet();
    raw.close().await;
    a.net.shutdown().await;
}
