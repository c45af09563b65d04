//! A mesh that finds itself again across real networks: `mesh daemon`
//! processes, each in a network namespace of its own on one bridge (made
//! by this test, never the host's interfaces), moved to new addresses,
//! restarted on port 0 in every order, finding each other by mDNS, and
//! meeting through a relay the test runs when they have no route.
//!
//! These need root (network namespaces); without it they fail saying so.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use mesh_api::{
    InviteRequest, InviteResponse, JoinBody, JoinResponse, NearbyResponse, PeerStatus,
    StatusResponse,
};
use mesh_cluster::{NodeProc, NodeSpec, Placement, RestartPort, call};
use mesh_tests::netns::{self, Netns};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// The bound on every wait (generous: the machine is shared).
const WAIT: Duration = Duration::from_secs(90);
/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(50);

/// The namespaces, or a failure saying why they cannot be made here.
fn namespaces(n: usize) -> Netns {
    if let Some(why) = netns::unavailable_reason() {
        panic!("this test needs network namespaces (run it as root with iproute2): {why}");
    }
    Netns::create(n).unwrap()
}

/// A daemon in namespace `i`, on its address with port 0, started with
/// `--bind IP:0` every time (it asks for the port it remembers).
fn node(net: &Netns, root: &Path, i: usize, config: &str) -> NodeProc {
    let name = format!("node-{i}");
    let data = root.join(&name);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("config.toml"), config).unwrap();
    NodeProc::new(NodeSpec {
        log: root.join(format!("{name}.log")),
        name,
        bin: MESH.into(),
        data,
        placement: Placement {
            bind: SocketAddr::new(IpAddr::V4(net.node_ip(i)), 0),
            prefix: ["ip", "netns", "exec", net.node_ns(i)]
                .map(Into::into)
                .to_vec(),
            restart_port: RestartPort::Remembered,
        },
        rust_log: "info".into(),
    })
}

async fn status(n: &NodeProc) -> StatusResponse {
    n.status().await.unwrap()
}

async fn peer(n: &NodeProc, other: &str) -> Option<PeerStatus> {
    status(n)
        .await
        .node
        .peers
        .into_iter()
        .find(|p| p.node == other)
}

/// Polls `f` until it holds, failing after [`WAIT`] with the logs of `nodes`.
async fn wait_for<F, Fut>(what: &str, nodes: &[&NodeProc], mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !f().await {
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes
                .iter()
                .map(|n| format!("--- {} ---\n{}", n.name(), n.log_tail()))
                .collect();
            panic!("gave up waiting for {what}\n{}", logs.join("\n"));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `inviter` invites, `joiner` joins: both are each other's peers.
async fn invite_join(inviter: &NodeProc, joiner: &NodeProc) {
    let made: InviteResponse = call(
        inviter
            .client()
            .post("/v1/invites", &InviteRequest::default()),
    )
    .await
    .unwrap();
    let body = JoinBody { code: made.code };
    let joined: JoinResponse = call(joiner.client().post("/v1/join", &body)).await.unwrap();
    assert_eq!(joined.inviter, inviter.id());
}

async fn send(from: &NodeProc, to: &NodeProc, body: &str) {
    let req = mesh_api::SendRequest {
        to: to.id().to_owned(),
        body: body.to_owned(),
        encoding: Default::default(),
        msg_kind: 0,
    };
    let _: serde_json::Value = call(from.client().post("/v1/send", &req)).await.unwrap();
}

/// The bodies `n` received from `from`, in order.
async fn received(n: &NodeProc, from: &str) -> Vec<String> {
    n.journal()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.record {
            mesh_api::EventRecord::Envelope { stream, body, .. } if stream.author == from => {
                Some(body)
            }
            _ => None,
        })
        .collect()
}

async fn connected(a: &NodeProc, b: &NodeProc) -> bool {
    peer(a, b.id()).await.is_some_and(|p| p.connected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mdns_between_namespaces_finds_moved_peers_and_lists_a_stranger_as_nearby() {
    let mut net = namespaces(3);
    net.enable_multicast().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mdns_on = "[discovery]\nmdns = \"on\"\n";
    let mut a = node(&net, tmp.path(), 0, mdns_on);
    let mut b = node(&net, tmp.path(), 1, mdns_on);
    let mut c = node(&net, tmp.path(), 2, mdns_on);
    for n in [&mut a, &mut b, &mut c] {
        n.start().await.unwrap();
    }
    invite_join(&a, &b).await;
    wait_for("a and b to connect", &[&a, &b], || connected(&a, &b)).await;

    // c is no peer of a's: it is listed as nearby, with its name; b is not.
    let started = Instant::now();
    let c_name = status(&c).await.node.name;
    wait_for("a to list c as nearby", &[&a, &c], || async {
        let near: NearbyResponse = call(a.client().get("/v1/peers/nearby")).await.unwrap();
        near.nearby
            .iter()
            .any(|n| n.node == c.id() && n.name.as_deref() == Some(c_name.as_str()))
    })
    .await;
    eprintln!(
        "mDNS listed a stranger {:.2} s after asking",
        started.elapsed().as_secs_f64()
    );
    let near: NearbyResponse = call(a.client().get("/v1/peers/nearby")).await.unwrap();
    assert!(near.nearby.iter().all(|n| n.node != b.id()), "{near:?}");
    assert!(peer(&a, c.id()).await.is_none(), "discovery adds no peer");

    // Both hosts reboot and come back at new addresses (DHCP): neither
    // knows where the other is now; only mDNS can tell them.
    a.stop().await.unwrap();
    b.stop().await.unwrap();
    let new_a = net.move_node(0, 20).unwrap();
    let new_b = net.move_node(1, 21).unwrap();
    a.set_bind(SocketAddr::new(new_a.into(), 0));
    b.set_bind(SocketAddr::new(new_b.into(), 0));
    a.start().await.unwrap();
    b.start().await.unwrap();
    let restarted = Instant::now();
    send(&a, &b, "after the move").await;
    wait_for("the message after the move", &[&a, &b], || async {
        received(&b, a.id()).await == ["after the move"]
    })
    .await;
    eprintln!(
        "mDNS: both moved, reconnected and delivered {:.2} s after the restarts",
        restarted.elapsed().as_secs_f64()
    );
    let b_seen = peer(&a, b.id()).await.unwrap();
    assert!(
        b_seen.addrs.iter().any(|s| s.ip() == IpAddr::V4(new_b)),
        "{b_seen:?}"
    );
    for n in [&mut a, &mut b, &mut c] {
        n.stop().await.unwrap();
    }
}

/// Every order of three.
const ORDERS: [[usize; 3]; 6] = [
    [0, 1, 2],
    [0, 2, 1],
    [1, 0, 2],
    [1, 2, 0],
    [2, 0, 1],
    [2, 1, 0],
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_restarted_in_every_order_on_port_0_with_moved_addresses_drain_every_queue() {
    let mut net = namespaces(3);
    let tmp = tempfile::tempdir().unwrap();
    // No mDNS: what finds a moved node is its own Hello and its peers' cards.
    let config = "[discovery]\nmdns = \"off\"\n";
    let mut nodes: Vec<NodeProc> = (0..3).map(|i| node(&net, tmp.path(), i, config)).collect();
    for n in &mut nodes {
        n.start().await.unwrap();
    }
    for i in 0..3 {
        for j in 0..3 {
            if i != j {
                nodes[i].add_peer(&nodes[j]).await.unwrap();
            }
        }
    }
    let mut sent = vec![vec![0usize; 3]; 3];
    for (round, order) in ORDERS.iter().enumerate() {
        for n in &mut nodes {
            n.stop().await.unwrap();
        }
        // One node a round comes back elsewhere.
        let moved = round % 3;
        let ip = net.move_node(moved, 30 + round as u8).unwrap();
        nodes[moved].set_bind(SocketAddr::new(ip.into(), 0));
        let started = Instant::now();
        for (k, &i) in order.iter().enumerate() {
            nodes[i].start().await.unwrap();
            // Everyone up so far sends to everyone: queued for those down.
            for &from in &order[..=k] {
                for to in 0..3 {
                    if to != from {
                        let body = format!("round {round} from {from} to {to} #{}", sent[from][to]);
                        send(&nodes[from], &nodes[to], &body).await;
                        sent[from][to] += 1;
                    }
                }
            }
        }
        let all: Vec<&NodeProc> = nodes.iter().collect();
        wait_for(
            &format!("round {round} (order {order:?}) to drain"),
            &all,
            || async {
                for a in &nodes {
                    let st = status(a).await;
                    if st.node.peers.len() != 2
                        || st
                            .node
                            .peers
                            .iter()
                            .any(|p| !p.connected || p.queued_msgs > 0)
                    {
                        return false;
                    }
                }
                true
            },
        )
        .await;
        eprintln!(
            "round {round}: order {order:?}, node {moved} moved to {ip}: every queue drained {:.2} s after the first start",
            started.elapsed().as_secs_f64()
        );
    }
    for to in 0..3 {
        for from in (0..3).filter(|f| *f != to) {
            let got = received(&nodes[to], nodes[from].id()).await;
            assert_eq!(got.len(), sent[from][to], "{from} → {to}");
        }
    }
    for n in &mut nodes {
        n.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_with_no_route_meet_through_a_relay_the_test_runs() {
    let net = namespaces(3);
    // The relay (plain HTTP, iroh-relay's server) runs in node 2's namespace.
    let relay_ip = net.node_ip(2);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let relay = std::thread::spawn({
        let ns = net.node_ns(2).to_owned();
        move || {
            netns::run_in_namespace(&ns, move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let mut config = iroh_relay::server::ServerConfig::default();
                    config.relay = Some(iroh_relay::server::RelayConfig::new((relay_ip, 0)));
                    let server = iroh_relay::server::Server::spawn(config).await.unwrap();
                    addr_tx.send(server.http_addr().unwrap()).unwrap();
                    let _ = stop_rx.await;
                    let _ = server.shutdown().await;
                });
            })
            .unwrap();
        }
    });
    let relay_addr = addr_rx.recv_timeout(WAIT).unwrap();
    // Nodes 0 and 1 cannot reach each other; both reach the relay.
    net.cut_pair(0, 1).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let config =
        format!("[net]\nrelays = [\"http://{relay_addr}\"]\n[discovery]\nmdns = \"off\"\n");
    let mut a = node(&net, tmp.path(), 0, &config);
    let mut b = node(&net, tmp.path(), 1, &config);
    a.start().await.unwrap();
    b.start().await.unwrap();
    let started = Instant::now();
    // Even the join goes through the relay: the invite's addresses are cut.
    invite_join(&a, &b).await;
    send(&a, &b, "through the relay").await;
    send(&b, &a, "and back").await;
    wait_for("both messages", &[&a, &b], || async {
        received(&b, a.id()).await == ["through the relay"]
            && received(&a, b.id()).await == ["and back"]
    })
    .await;
    eprintln!(
        "relay: joined and exchanged both ways {:.2} s after the start",
        started.elapsed().as_secs_f64()
    );
    assert!(
        net.dropped(0).unwrap() + net.dropped(1).unwrap() > 0,
        "the direct path was tried and cut"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
    let _ = stop_tx.send(());
    relay.join().unwrap();
}
