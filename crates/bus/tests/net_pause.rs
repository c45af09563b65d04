//! Pausing and resuming a link in the iroh transport, against real
//! endpoints on 127.0.0.1. Every wait is bounded by `common::T`; conditions
//! that have no event of their own are polled.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;

use common::{NetNode, ack, until};
use mesh_bus::net::NetEvent;
use mesh_bus::net::{ConnId, DisconnectReason, PAUSED_REASON, PeerError, close_code};

/// Two nodes, each the other's peer, where only `b` has an address for the
/// other: answers them once `a`'s dial connected, with each side's
/// connection.
async fn a_dialed_b() -> (NetNode, NetNode, ConnId, ConnId) {
    let mut a = NetNode::new().await;
    let mut b = NetNode::new().await;
    b.net.add_peer(a.id(), Vec::new()).await.unwrap();
    a.net.add_peer(b.id(), b.net.local_addrs()).await.unwrap();
    let ca = a.next_connected(b.id()).await;
    let cb = b.next_connected(a.id()).await;
    (a, b, ca, cb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_link_is_closed_refused_and_not_dialed_until_resumed() {
    // A dials; once connected, B learns A's address too (and so redials A
    // whenever it has no connection).
    let (mut a, mut b, ca, cb) = a_dialed_b().await;
    b.net.add_peer(a.id(), a.net.local_addrs()).await.unwrap();

    a.net.set_paused(b.id(), true).await.unwrap();
    assert_eq!(
        a.next_disconnected(b.id(), ca).await,
        DisconnectReason::ClosedLocally {
            code: close_code::PAUSED,
            reason: PAUSED_REASON.into()
        }
    );
    assert_eq!(
        b.next_disconnected(a.id(), cb).await,
        DisconnectReason::ClosedByPeer {
            code: close_code::PAUSED.into(),
            reason: PAUSED_REASON.into()
        }
    );
    let p = &a.net.peers().await[0];
    assert!(p.paused && p.conn.is_none(), "{p:?}");
    // Pausing again changes nothing.
    a.net.set_paused(b.id(), true).await.unwrap();

    // B keeps redialing; A refuses each dial and reports nothing.
    until(
        "a to refuse two of b's dials, and b to see them fail",
        || async { a.net.counters().paused_refused >= 2 && b.net.counters().dial_failures >= 2 },
    )
    .await;
    assert_eq!(a.net.counters().refused, 0, "not counted as unknown nodes");
    a.no_event_yet();
    b.no_event_yet();

    a.net.set_paused(b.id(), false).await.unwrap();
    let ca = a.next_connected(b.id()).await;
    let cb = b.next_connected(a.id()).await;
    assert!(!a.net.peers().await[0].paused);
    a.net.try_send(b.id(), ca, &ack(5)).await.unwrap();
    match b.next().await {
        NetEvent::Frame { conn, frame, .. } => {
            assert_eq!((conn, frame), (cb, ack(5)));
        }
        other => panic!("expected a frame, got {other:?}"),
    }
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_dials_the_peer_at_once_even_when_it_cannot_dial_back() {
    // B has no address for A: every connection is A's dial.
    let (mut a, mut b, ca, cb) = a_dialed_b().await;
    a.net.set_paused(b.id(), true).await.unwrap();
    a.next_disconnected(b.id(), ca).await;
    b.next_disconnected(a.id(), cb).await;
    let dials = a.net.counters().connections;

    a.net.set_paused(b.id(), false).await.unwrap();
    a.next_connected(b.id()).await;
    b.next_connected(a.id()).await;
    assert_eq!(a.net.counters().connections, dials + 1);
    assert!(a.net.peers().await[0].dialed_here);
    a.net.shutdown().await;
    b.net.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_an_unknown_peer_is_an_error_and_removing_a_peer_forgets_its_pause() {
    let a = NetNode::new().await;
    let b = NetNode::new().await;
    assert_eq!(
        a.net.set_paused(b.id(), true).await,
        Err(PeerError::UnknownPeer(b.id()))
    );
    a.net.add_peer(b.id(), Vec::new()).await.unwrap();
    a.net.set_paused(b.id(), true).await.unwrap();
    a.net.remove_peer(b.id()).await.unwrap();
    a.net.add_peer(b.id(), Vec::new()).await.unwrap();
    assert!(!a.net.peers().await[0].paused);
    a.net.shutdown().await;
    b.net.shutdown().await;
}
