//! The agent move link between real nodes and endpoints on 127.0.0.1: an
//! offer from a peer reaches the node's taker and its answer comes back; a
//! node that is not a peer is refused before anything is read (and
//! counted); an offer over the cap is refused from its header; a peer that
//! does not offer the move ALPN gets an error naming it. Every wait is
//! bounded by [`T`].

#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;

use std::net::SocketAddr;

use common::{T, bare_endpoint, loopback, node_config};
use iroh::endpoint::{ConnectionError, presets};
use iroh::{Endpoint, EndpointAddr, RelayMode};
use mesh_bus::net::ALPN;
use mesh_bus::{CoreConfig, MoveError, Node, close_code};
use mesh_protocol::{MOVE_ALPN, MOVE_MESSAGE_BYTES_MAX, SecretKey};
use mesh_store::{MemStore, StoreHandle};
use tokio::time::timeout;

async fn node() -> Node {
    let handle = StoreHandle::spawn(std::sync::Arc::new(MemStore::new(mesh_protocol::Epoch(
        rand_epoch(),
    ))))
    .unwrap();
    Node::start(
        node_config(CoreConfig::default()),
        SecretKey::generate(),
        handle,
    )
    .await
    .unwrap()
}

fn addrs(n: &Node) -> Vec<SocketAddr> {
    n.ticket().addrs
}

fn ep_addrs(ep: &Endpoint) -> Vec<SocketAddr> {
    ep.bound_sockets()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_offer_is_answered_and_a_stranger_is_refused_before_it_is_read() {
    let (a, b, stranger) = (node().await, node().await, node().await);
    a.add_peer(b.node_id(), addrs(&b)).await.unwrap();
    b.add_peer(a.node_id(), addrs(&a)).await.unwrap();
    // The stranger has b as a peer; b does not have it.
    stranger.add_peer(b.node_id(), addrs(&b)).await.unwrap();
    let mut offers = b.take_move_offers().expect("first take");
    assert!(b.take_move_offers().is_none(), "taken once");
    let taker = tokio::spawn(async move {
        let offer = offers.recv().await.unwrap();
        let from = offer.from;
        let body = offer.body.clone();
        offer.answer(b"imported".to_vec());
        (from, body, offers)
    });
    let answer = timeout(T, a.offer_move(b.node_id(), b"an export".to_vec()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer, b"imported");
    let (from, body, mut offers) = taker.await.unwrap();
    assert_eq!((from, body.as_slice()), (a.node_id(), &b"an export"[..]));

    // The stranger also dials b's mesh link now and then (b is its peer),
    // refused and counted the same way: measure until one offer's window
    // holds nothing else (CI saw a dial land in it once, under load).
    let mut alone = false;
    for _ in 0..10 {
        let refused_before = b.status().await.unwrap().net.refused;
        let e = timeout(T, stranger.offer_move(b.node_id(), b"x".to_vec()))
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(&e, MoveError::Refused { code, .. } if *code == u64::from(close_code::UNKNOWN_NODE)),
            "{e:?}"
        );
        assert!(e.to_string().contains("peers only"), "{e}");
        let refused = b.status().await.unwrap().net.refused;
        assert!(
            refused > refused_before,
            "the stranger's offer was not counted"
        );
        if refused == refused_before + 1 {
            alone = true;
            break;
        }
    }
    assert!(alone, "no offer's refusal was counted alone in 10 tries");
    assert!(
        offers.try_recv().is_err(),
        "nothing of the stranger's was handed on"
    );

    // Locally: a node that is not a peer, or a paused one, is not dialed.
    let e = a
        .offer_move(stranger.node_id(), b"x".to_vec())
        .await
        .unwrap_err();
    assert_eq!(e, MoveError::NotPeer(stranger.node_id()));
    a.set_peer_paused(b.node_id(), true).await.unwrap();
    let e = a.offer_move(b.node_id(), b"x".to_vec()).await.unwrap_err();
    assert_eq!(e, MoveError::Paused(b.node_id()));
    let e = stranger
        .offer_move(b.node_id(), vec![0; MOVE_MESSAGE_BYTES_MAX + 1])
        .await
        .unwrap_err();
    assert!(matches!(e, MoveError::TooLarge(_)), "{e:?}");
    for n in [a, b, stranger] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_over_the_cap_is_refused_from_its_header_and_never_handed_on() {
    let b = node().await;
    let key = SecretKey::generate();
    let raw = bare_endpoint(key.clone()).await;
    b.add_peer(key.public(), ep_addrs(&raw)).await.unwrap();
    let mut offers = b.take_move_offers().unwrap();
    let mut to = EndpointAddr::new(b.node_id());
    for s in addrs(&b) {
        to = to.with_ip_addr(s);
    }
    let conn = timeout(T, raw.connect(to, MOVE_ALPN))
        .await
        .unwrap()
        .unwrap();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    let header = u32::try_from(MOVE_MESSAGE_BYTES_MAX + 1)
        .unwrap()
        .to_be_bytes();
    send.write_all(&header).await.unwrap();
    let closed = timeout(T, conn.closed()).await.unwrap();
    match closed {
        ConnectionError::ApplicationClosed(c) => {
            assert_eq!(
                c.error_code.into_inner(),
                u64::from(close_code::FRAME_TOO_LARGE)
            );
        }
        other => panic!("closed as {other:?}"),
    }
    assert!(offers.try_recv().is_err());
    raw.close().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_does_not_offer_the_move_alpn_gets_an_error_naming_it() {
    let a = node().await;
    let key = SecretKey::generate();
    // An endpoint that speaks the frame protocol's ALPN only, as an older node.
    let old = Endpoint::builder(presets::Minimal)
        .secret_key(key.clone())
        .relay_mode(RelayMode::Disabled)
        .clear_address_lookup()
        .clear_ip_transports()
        .bind_addr(loopback())
        .unwrap()
        .alpns(vec![ALPN.to_vec()])
        .bind()
        .await
        .unwrap();
    let accepting = old.clone();
    let acceptor = tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let _ = incoming.await;
        }
    });
    a.add_peer(key.public(), ep_addrs(&old)).await.unwrap();
    let e = timeout(T, a.offer_move(key.public(), b"x".to_vec()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, MoveError::NotOffered { .. }), "{e:?}");
    assert!(e.to_string().contains("amesh-move/1"), "{e}");
    old.close().await;
    acceptor.abort();
    a.shutdown().await;
}

fn rand_epoch() -> [u8; 16] {
    *SecretKey::generate()
        .public()
        .as_bytes()
        .first_chunk::<16>()
        .unwrap()
}
