//! The namespaces and `tc` rules the chaos harness cuts the network with:
//! set up, cut, lossy, healed and torn down, probed with real UDP packets.
//! Needs root and iproute2; skipped with a message otherwise.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use mesh_tests::netns::{self, Netns};

/// UDP packets sent per probe.
const PROBE_PACKETS: usize = 400;
const PROBE_PORT: u16 = 9999;

fn skip() -> bool {
    match netns::unavailable_reason() {
        Some(why) => {
            eprintln!("SKIPPED: network namespaces are unavailable here ({why})");
            true
        }
        None => false,
    }
}

/// Sends `PROBE_PACKETS` from node `from` to node `to`; answers how many arrived.
fn probe(net: &Netns, from: usize, to: usize) -> usize {
    let rx_addr = SocketAddr::new(net.node_ip(to).into(), PROBE_PORT);
    let rx = netns::udp_socket_in(net.node_ns(to), rx_addr).unwrap();
    let tx = netns::udp_socket_in(
        net.node_ns(from),
        SocketAddr::new(net.node_ip(from).into(), 0),
    )
    .unwrap();
    // ARP first: the loss filter matches IP only, so this resolves the neighbour.
    let _ = tx.send_to(b"warm", rx_addr);
    std::thread::sleep(Duration::from_millis(20));
    rx.set_nonblocking(true).unwrap();
    while rx.recv(&mut [0; 16]).is_ok() {}
    // Count on another thread while sending, so the socket buffer never overflows.
    let counter = std::thread::spawn(move || count_arrivals(&rx));
    for n in 0..PROBE_PACKETS {
        tx.send_to(b"probe", rx_addr).unwrap();
        if n % 20 == 19 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    counter.join().unwrap()
}

/// Counts packets until the socket has been quiet for a while (bounded).
fn count_arrivals(rx: &UdpSocket) -> usize {
    rx.set_nonblocking(false).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut n = 0;
    while n < PROBE_PACKETS && rx.recv(&mut [0; 16]).is_ok() {
        n += 1;
    }
    n
}

#[test]
fn namespaces_are_cut_lossy_healed_and_removed_without_touching_the_host() {
    if skip() {
        return;
    }
    let host_links_before = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap()
        .stdout;
    let mut net = Netns::create(3).unwrap();
    let names: Vec<String> = (0..3)
        .map(|i| net.node_ns(i).to_owned())
        .chain([net.switch().to_owned()])
        .collect();
    let listed = netns::list_namespaces().unwrap();
    assert!(names.iter().all(|n| listed.contains(n)), "{listed:?}");

    assert_eq!(
        probe(&net, 0, 1),
        PROBE_PACKETS,
        "a healthy bridge loses nothing"
    );

    net.isolate(1).unwrap();
    assert_eq!(probe(&net, 0, 1), 0, "an isolated node gets nothing");
    assert_eq!(probe(&net, 1, 2), 0, "an isolated node reaches nobody");
    assert_eq!(probe(&net, 0, 2), PROBE_PACKETS, "the others still talk");

    net.partition(&[vec![0, 1], vec![2]]).unwrap();
    assert_eq!(
        probe(&net, 0, 1),
        PROBE_PACKETS,
        "a new partition replaces the old"
    );
    assert_eq!(probe(&net, 2, 0), 0);

    net.heal().unwrap();
    net.loss(30).unwrap();
    let got = probe(&net, 0, 2);
    // 30 % loss of 400 packets: far outside 20 %..40 % would be a broken rule.
    assert!(
        (240..=320).contains(&got),
        "30 % loss delivered {got} of {PROBE_PACKETS}"
    );
    assert!(net.dropped(2).unwrap() > 0);

    net.heal().unwrap();
    assert_eq!(probe(&net, 2, 0), PROBE_PACKETS, "healed");

    net.destroy().unwrap();
    let listed = netns::list_namespaces().unwrap();
    assert!(names.iter().all(|n| !listed.contains(n)), "{listed:?}");
    let host_links_after = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap()
        .stdout;
    assert_eq!(
        host_links_before, host_links_after,
        "the host's links changed"
    );
}

#[test]
fn namespaces_left_by_a_dead_run_are_removed_on_start() {
    if skip() {
        return;
    }
    // A pid above pid_max belongs to no process, now or later.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Our pid in the set's place keeps two runs of this test apart.
    let stale = format!(
        "{}{}-{}-sw",
        netns::NS_PREFIX,
        pid_max + 1,
        std::process::id()
    );
    let ok = std::process::Command::new("ip")
        .args(["netns", "add", &stale])
        .status()
        .unwrap();
    assert!(ok.success());
    let removed = netns::remove_stale().unwrap();
    assert!(!netns::list_namespaces().unwrap().contains(&stale));
    // Another run's clean-up may have taken it first; then it is gone all the same.
    let _ = removed;
}

#[test]
fn dropping_a_set_removes_its_namespaces() {
    if skip() {
        return;
    }
    let net = Netns::create(2).unwrap();
    let sw = net.switch().to_owned();
    drop(net);
    assert!(!netns::list_namespaces().unwrap().contains(&sw));
}
