//! A mesh that finds itself again, with real `mesh daemon` processes on
//! 127.0.0.1 and the `mesh` CLI, as the README runs them: nodes restarted
//! on port 0 keep their port, a node whose port was taken is found at its
//! new one through its Hello, and a removed peer is cut off at once.
//!
//! Waits poll the nodes' APIs (through `mesh ... --json`), each bounded by
//! [`WAIT`].
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use mesh_tests::daemon::{DaemonProcess, ok, parse_json, temp_dir};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// The bound on every wait (generous: the machine is shared).
const WAIT: Duration = Duration::from_secs(60);
/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(50);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

fn json(d: &DaemonProcess, args: &[&str]) -> serde_json::Value {
    parse_json(&ok(d.mesh(args).unwrap())).unwrap()
}

/// The port `d` listens on for peers, from its status.
fn port(d: &DaemonProcess) -> u16 {
    let st = json(d, &["status", "--json"]);
    st["addrs"][0]
        .as_str()
        .unwrap()
        .parse::<SocketAddr>()
        .unwrap()
        .port()
}

/// `d`'s view of its peer `other`.
fn peer(d: &DaemonProcess, other: &str) -> serde_json::Value {
    let peers = json(d, &["peer", "list", "--json"]);
    peers["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["node"] == other)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// Polls `f` until it holds, failing after [`WAIT`].
#[track_caller]
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(POLL);
    }
}

/// The bodies of the messages `d` received from `from`, in order.
fn received(d: &DaemonProcess, from: &str) -> Vec<String> {
    let out = ok(d.mesh(&["events", "--json", "--limit", "1000"]).unwrap());
    out.lines()
        .map(|l| parse_json(l).unwrap())
        .filter(|e| e["kind"] == "envelope" && e["stream"]["author"] == from)
        .map(|e| e["body"].as_str().unwrap().to_owned())
        .collect()
}

/// Starts daemons in `a_dir` and `b_dir`, adds each as the other's peer and
/// answers them with their node ids.
fn linked_pair(a_dir: &Path, b_dir: &Path) -> (DaemonProcess, DaemonProcess, String, String) {
    let a = start(a_dir);
    let b = start(b_dir);
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    let (a_id, b_id) = (a.node().to_owned(), b.node().to_owned());
    (a, b, a_id, b_id)
}

#[test]
fn two_nodes_both_restarted_on_port_0_reconnect_and_the_queued_message_arrives() {
    let tmp = temp_dir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, b, a_id, b_id) = linked_pair(&a_dir, &b_dir);
    let (a_port, b_port) = (port(&a), port(&b));
    ok(a.mesh(&["send", &b_id, "before"]).unwrap());
    wait_for("the first message", || received(&b, &a_id) == ["before"]);

    // b goes away; a queues a message for it; then a goes away too.
    assert!(b.terminate().unwrap().success());
    ok(a.mesh(&["send", &b_id, "while b was away"]).unwrap());
    assert!(a.terminate().unwrap().success());

    // Both come back on port 0: each asks for the port it had.
    let started = Instant::now();
    let a = start(&a_dir);
    let b = start(&b_dir);
    assert_eq!((port(&a), port(&b)), (a_port, b_port));
    wait_for("the queued message", || {
        received(&b, &a_id) == ["before", "while b was away"]
    });
    eprintln!(
        "both restarted: the queued message arrived {:.2} s after the first start",
        started.elapsed().as_secs_f64()
    );
    wait_for("a's queue for b to drain", || {
        peer(&a, &b_id)["queued_msgs"] == 0
    });
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn nodes_upgraded_from_a_build_that_did_not_remember_the_port_carry_on_at_the_port_of_their_card() {
    // A data dir written by a build before the port was remembered in a
    // file is this one without the file (its store is migrated by the
    // store's own tests, on fixtures of those versions). Both nodes
    // restart on port 0 with no mDNS on loopback: each is found only if it
    // comes back at the port its peer last learned, from its own card.
    let tmp = temp_dir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, b, a_id, b_id) = linked_pair(&a_dir, &b_dir);
    let (a_port, b_port) = (port(&a), port(&b));
    ok(a.mesh(&["send", &b_id, "before"]).unwrap());
    wait_for("the first message", || received(&b, &a_id) == ["before"]);
    assert!(b.terminate().unwrap().success());
    for n in 1..=3 {
        ok(a.mesh(&["send", &b_id, &format!("queued {n}")]).unwrap());
    }
    assert!(a.terminate().unwrap().success());
    for dir in [&a_dir, &b_dir] {
        let file = dir.join(mesh_api::paths::LISTEN_PORT_FILE);
        std::fs::remove_file(&file)
            .unwrap_or_else(|e| panic!("{} is not there to remove: {e}", file.display()));
    }

    let a = start(&a_dir);
    let b = start(&b_dir);
    assert_eq!((port(&a), port(&b)), (a_port, b_port));
    wait_for("the three queued messages", || {
        received(&b, &a_id) == ["before", "queued 1", "queued 2", "queued 3"]
    });
    ok(b.mesh(&["send", &a_id, "after the upgrade"]).unwrap());
    wait_for("a new message the other way", || {
        received(&a, &b_id) == ["after the upgrade"]
    });
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn a_node_whose_port_was_taken_is_found_at_its_new_one_and_peers_dial_that_after_a_restart() {
    let tmp = temp_dir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, b, a_id, b_id) = linked_pair(&a_dir, &b_dir);
    let b_port = port(&b);
    wait_for("a to see b", || peer(&a, &b_id)["connected"] == true);
    assert!(b.terminate().unwrap().success());

    // Something else takes b's port while it is down: it must take another.
    let squatter = UdpSocket::bind(("127.0.0.1", b_port)).unwrap();
    let b = start(&b_dir);
    let moved = port(&b);
    assert_ne!(moved, b_port);
    // a only knew the old port; b's Hello tells it the new one, and a's
    // peer list shows it.
    let at_new_port = |a: &DaemonProcess| {
        let p = peer(a, &b_id);
        p["connected"] == true
            && p["addrs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s.as_str().unwrap().ends_with(&format!(":{moved}")))
    };
    wait_for("a to learn b's new port", || at_new_port(&a));
    assert_eq!(
        peer(&a, &b_id)["name"],
        json(&b, &["status", "--json"])["name"]
    );

    // a restarts and dials b where it learned, b having kept its new port.
    drop(squatter);
    assert!(a.terminate().unwrap().success());
    ok(b.mesh(&["send", &a_id, "to a, after its restart"]).unwrap());
    let a = start(&a_dir);
    wait_for("the message b queued", || {
        received(&a, &b_id) == ["to a, after its restart"]
    });
    assert!(at_new_port(&a));
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn a_removed_peer_is_cut_off_at_once_and_its_next_dials_are_refused() {
    let tmp = temp_dir().unwrap();
    let (a, b, a_id, b_id) = linked_pair(&tmp.path().join("a"), &tmp.path().join("b"));
    wait_for("b to see a", || peer(&b, &a_id)["connected"] == true);
    ok(a.mesh(&["peer", "remove", &b_id]).unwrap());
    // b still lists a and keeps dialing it; a refuses every dial.
    wait_for("b to see a gone", || peer(&b, &a_id)["connected"] == false);
    wait_for("two of b's dials to be refused", || {
        a.metric("mesh_unknown_node_refused_total").unwrap_or(0) >= 2
    });
    assert_eq!(peer(&b, &a_id)["connected"], false);
    assert_eq!(peer(&a, &b_id), serde_json::Value::Null);
    let out = b.mesh(&["send", &a_id, "into the void"]).unwrap();
    assert!(out.ok(), "b may still queue for a: {out:?}");
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn mesh_invite_then_mesh_join_links_two_nodes_and_messages_go_both_ways() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let (a_id, b_id) = (a.node().to_owned(), b.node().to_owned());
    let code = ok(a.mesh(&["invite"]).unwrap());
    assert_eq!(code.lines().count(), 1, "{code}");
    let code = code.trim().to_owned();
    assert!(code.starts_with("meshinvite1"), "{code}");
    let joined = ok(b.mesh(&["join", &code]).unwrap());
    assert!(joined.starts_with(&format!("joined: {a_id} (")), "{joined}");
    // Both are peers; no second command on the inviter.
    assert_ne!(peer(&a, &b_id), serde_json::Value::Null);
    assert_ne!(peer(&b, &a_id), serde_json::Value::Null);
    let list = json(&a, &["invite", "list", "--json"]);
    let inv = &list["invites"][0];
    assert_eq!(
        (&inv["state"], &inv["uses_left"], &inv["joined"][0]),
        (&"spent".into(), &0.into(), &b_id.clone().into()),
        "{list}"
    );
    ok(a.mesh(&["send", &b_id, "hello b"]).unwrap());
    ok(b.mesh(&["send", &a_id, "hello a"]).unwrap());
    wait_for("a's message at b", || received(&b, &a_id) == ["hello b"]);
    wait_for("b's message at a", || received(&a, &b_id) == ["hello a"]);

    // A third node: the spent code is refused with its own code and exit.
    let c = start(&tmp.path().join("c"));
    let out = c.mesh(&["join", &code]).unwrap();
    assert!(!out.ok(), "{out:?}");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        out.stderr.contains("spent") && out.stderr.contains("409"),
        "{out:?}"
    );
    // An invite for two, revoked before use.
    let made = json(&a, &["invite", "--uses", "2", "--ttl", "10m", "--json"]);
    let (code2, id2) = (
        made["code"].as_str().unwrap().to_owned(),
        made["invite"]["id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(made["invite"]["uses"], 2);
    assert!(ok(a.mesh(&["invite", "revoke", &id2]).unwrap()).contains(&id2));
    let out = c.mesh(&["join", &code2]).unwrap();
    assert!(!out.ok() && out.stderr.contains("revoked"), "{out:?}");
    let out = c.mesh(&["join", "meshinvite1nonsense"]).unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(out.stderr.contains("not an invite code"), "{out:?}");
    for d in [a, b, c] {
        assert!(d.terminate().unwrap().success());
    }
}
