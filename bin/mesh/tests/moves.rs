//! Moving an agent through real `mesh daemon` processes: `mesh agent
//! export` on its old host, `mesh agent import` on its new one, and the
//! move notice reaching every node of a line, even one that never talks
//! to the new host (issue 15, part one).
//!
//! Every wait is on an event (a command's output, `--wait` on the inbox, a
//! listing that changes) and bounded.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use mesh_tests::daemon::{DaemonProcess, Output, assert_says, ok, parse_json, temp_dir};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// How long a state the test waits for may take (polled through the CLI).
const SETTLE: Duration = Duration::from_secs(60);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

/// Daemons a, b and c in `root`, each linked to both others, and to a
/// member that is down (see [`offline_member`]).
fn triangle(root: &Path) -> (DaemonProcess, DaemonProcess, DaemonProcess) {
    let (a, b, c) = online_triangle(root);
    offline_member(root, &[&a, &b, &c]);
    (a, b, c)
}

/// Daemons a, b and c in `root`, each linked to both others.
fn online_triangle(root: &Path) -> (DaemonProcess, DaemonProcess, DaemonProcess) {
    let (a, b, c) = (
        start(&root.join("a")),
        start(&root.join("b")),
        start(&root.join("c")),
    );
    link(&a, &b);
    link(&b, &c);
    link(&a, &c);
    (a, b, c)
}

/// A member that each of `nodes` has as a peer and that is down for the
/// rest of the test: it never follows a move, so no drain ends early (as
/// with a contact that stays offline), and what these tests look at is
/// the drain itself.
fn offline_member(root: &Path, nodes: &[&DaemonProcess]) {
    let away = start(&root.join("offline"));
    for n in nodes {
        link(n, &away);
    }
    away.terminate().unwrap();
}

/// Links `a` and `b` both ways.
fn link(a: &DaemonProcess, b: &DaemonProcess) {
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
}

fn as_agent(d: &DaemonProcess, agent: &str, args: &[&str]) -> Output {
    let mut all = vec!["--agent", agent];
    all.extend_from_slice(args);
    d.mesh(&all).unwrap()
}

/// `d` pauses its links to each of `others`: it is away, and queues.
fn away(d: &DaemonProcess, others: &[&DaemonProcess]) {
    for o in others {
        ok(d.mesh(&["peer", "pause", o.node()]).unwrap());
    }
}

/// The `drain_ended` entries of `d`'s journal.
fn drains_ended(d: &DaemonProcess) -> Vec<serde_json::Value> {
    let events = ok(d.mesh(&["events", "--json"]).unwrap());
    events
        .lines()
        .map(|l| parse_json(l).unwrap())
        .filter(|e| e["kind"] == "drain_ended")
        .collect()
}

/// Polls `mesh agents --json` on `d` until `done` says yes; returns it.
fn wait_agents(
    d: &DaemonProcess,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        let all = parse_json(&ok(d.mesh(&["agents", "--json"]).unwrap())).unwrap();
        if done(&all) {
            return all;
        }
        assert!(Instant::now() < deadline, "{what}: {all}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Adds the agents kim at `a` and bob at `b`; kim's address at `a`.
fn add_kim_and_bob(a: &DaemonProcess, b: &DaemonProcess) -> String {
    ok(a.mesh(&["agent", "add", "kim"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    format!("kim@{}", a.node())
}

/// Exports kim at `d` into `file`, with `extra` arguments (`--after`).
fn export_kim(d: &DaemonProcess, file: &Path, extra: &[&str]) {
    let mut args = vec!["agent", "export", "kim", "--out", file.to_str().unwrap()];
    args.extend(extra);
    ok(d.mesh(&args).unwrap());
}

/// Imports the agent export `file` at `d`.
fn import_kim(d: &DaemonProcess, file: &Path) {
    ok(d.mesh(&["agent", "import", file.to_str().unwrap()])
        .unwrap());
}

/// Whether `all` has kim's move notice with `node` as its host.
fn kim_moved_to(all: &serde_json::Value, node: &str) -> bool {
    moves_of(all, "kim")
        .first()
        .is_some_and(|m| m["node"] == node)
}

/// The move notices `all` lists for agent `name`.
fn moves_of<'a>(all: &'a serde_json::Value, name: &str) -> Vec<&'a serde_json::Value> {
    all["moves"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == name)
        .collect()
}

#[test]
fn an_agent_moved_along_a_line_is_placed_at_its_new_host_everywhere_and_acts_only_there() {
    let tmp = temp_dir().unwrap();
    let (a, b, c) = (
        start(&tmp.path().join("a")),
        start(&tmp.path().join("b")),
        start(&tmp.path().join("c")),
    );
    // A line: a and c are not peers, b passes the notice on.
    link(&a, &b);
    link(&b, &c);
    offline_member(tmp.path(), &[&a, &b, &c]);
    add_kim_and_bob(&a, &b);
    let key = {
        let all = parse_json(&ok(a.mesh(&["agents", "--json"]).unwrap())).unwrap();
        all["local"][0]["key"].as_str().unwrap().to_owned()
    };

    // The export is the agent's key: a file only its owner may read, never
    // written over.
    let file = tmp.path().join("kim.export");
    let out = a
        .mesh(&["agent", "export", "kim", "--out", file.to_str().unwrap()])
        .unwrap();
    assert!(out.ok(), "{out:?}");
    assert_says(&out, &["secret key", "mesh agent import"]);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let again = a
        .mesh(&["agent", "export", "kim", "--out", file.to_str().unwrap()])
        .unwrap();
    assert!(!again.ok(), "an existing file is not replaced: {again:?}");
    // A damaged file is refused, naming what is wrong, and nothing is added.
    let text = std::fs::read_to_string(&file).unwrap();
    let export: serde_json::Value = parse_json(&text).unwrap();
    let mut damaged = export.clone();
    let secret = export["secret_key"].as_str().unwrap();
    let flipped = if secret.starts_with('0') { "1" } else { "0" };
    damaged["secret_key"] = format!("{flipped}{}", &secret[1..]).into();
    let bad = tmp.path().join("damaged.export");
    std::fs::write(&bad, damaged.to_string()).unwrap();
    let out = c.mesh(&["agent", "import", bad.to_str().unwrap()]).unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_says(&out, &["damaged"]);

    // Until its new host says so, kim still acts on a.
    ok(as_agent(
        &a,
        "kim",
        &["send", &format!("bob@{}", b.node()), "before"],
    ));

    let imported = parse_json(&ok(c
        .mesh(&["agent", "import", file.to_str().unwrap(), "--json"])
        .unwrap()))
    .unwrap();
    assert_eq!(imported["address"], format!("kim@{}", c.node()));
    assert_eq!(imported["key"], key.as_str(), "the same agent, by its key");

    // Every node of the line learns where kim is: b from c, a through b.
    for d in [&a, &b, &c] {
        let all = wait_agents(d, "the move notice arrives", |all| {
            kim_moved_to(all, c.node())
        });
        let m = moves_of(&all, "kim");
        assert_eq!(m.len(), 1, "{all}");
        assert_eq!(m[0]["from"], a.node());
        assert_eq!(m[0]["version"], 1);
        assert_eq!(m[0]["key"], key.as_str());
    }
    let all = wait_agents(&a, "a marks kim as moved", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    assert_eq!(all["local"][0]["name"], "kim");
    let text = ok(a.mesh(&["agents"]).unwrap());
    assert!(text.contains(&format!("moved to {}", c.node())), "{text}");

    // kim no longer acts on a, and does on c.
    let out = as_agent(&a, "kim", &["send", &format!("bob@{}", b.node()), "stale"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_says(&out, &["moved to node", c.node()]);
    let id = ok(as_agent(
        &c,
        "kim",
        &["send", &format!("bob@{}", b.node()), "after"],
    ));
    let bodies = {
        let deadline = Instant::now() + SETTLE;
        loop {
            let out = as_agent(&b, "bob", &["inbox", "--json", "--limit", "10"]);
            let got: Vec<serde_json::Value> =
                out.stdout.lines().map(|l| parse_json(l).unwrap()).collect();
            if got.len() >= 2 || Instant::now() > deadline {
                break got;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let texts: Vec<&str> = bodies.iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert_eq!(texts, ["before", "after"], "{bodies:?}");
    assert_eq!(bodies[1]["from"], format!("kim@{}", c.node()));
    assert_eq!(bodies[1]["id"], id.trim());

    // What a knows of the move survives its restart.
    let a_dir = a.data().to_path_buf();
    a.terminate().unwrap();
    let a = start(&a_dir);
    let all = wait_agents(&a, "a still knows after a restart", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    assert_eq!(moves_of(&all, "kim").len(), 1, "{all}");

    // And back: exported from c, imported on a again, where it still has
    // its inbox; the second move wins everywhere.
    let back = tmp.path().join("kim.back");
    export_kim(&c, &back, &[]);
    let again = ok(a
        .mesh(&["agent", "import", back.to_str().unwrap(), "--json"])
        .unwrap());
    let again = parse_json(&again).unwrap();
    // Back on a node it had left: where to read its inbox here from.
    assert!(
        again["inbox_after"]
            .as_str()
            .is_some_and(|c| c.starts_with("mc1")),
        "{again}"
    );
    for d in [&a, &b, &c] {
        wait_agents(d, "the second move arrives", |all| {
            moves_of(all, "kim")
                .first()
                .is_some_and(|m| m["node"] == a.node() && m["version"] == 2)
        });
    }
    wait_agents(&c, "c marks kim as moved", |all| {
        all["local"][0]["moved_to"] == a.node()
    });
    let all = parse_json(&ok(a.mesh(&["agents", "--json"]).unwrap())).unwrap();
    assert!(all["local"][0].get("moved_to").is_none(), "{all}");
    ok(as_agent(
        &a,
        "kim",
        &["send", &format!("bob@{}", b.node()), "home"],
    ));
    let out = as_agent(&c, "kim", &["send", &format!("bob@{}", b.node()), "stale"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

/// The messages in `agent`'s inbox on `d`, waiting (bounded) until there
/// are at least `n`.
fn inbox_until(d: &DaemonProcess, agent: &str, n: usize) -> Vec<serde_json::Value> {
    inbox_with_until(d, agent, &["--limit", "100"], n)
}

/// As [`inbox_until`], the inbox read with `args` (`--unread`).
fn inbox_with_until(
    d: &DaemonProcess,
    agent: &str,
    args: &[&str],
    n: usize,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + SETTLE;
    let mut all = vec!["inbox", "--json"];
    all.extend_from_slice(args);
    loop {
        let out = as_agent(d, agent, &all);
        assert!(out.ok(), "{out:?}");
        let got: Vec<serde_json::Value> = out
            .stdout
            .lines()
            .map(|l| parse_json(l).unwrap())
            .filter(|e| e["kind"] == "message")
            .collect();
        if got.len() >= n {
            return got;
        }
        assert!(Instant::now() < deadline, "{agent} has {got:?}, not {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Seed 004's first test, in our terms: a contact that was away during the
/// move comes back and flushes its queue to the host the agent left; every
/// message reaches the agent at its new host, exactly once and in order.
#[test]
fn a_contact_away_during_the_move_flushes_to_the_old_host_and_the_agent_gets_each_message_once() {
    let tmp = temp_dir().unwrap();
    let (a, b, c) = triangle(tmp.path());
    let kim_at_a = add_kim_and_bob(&a, &b);
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "m0"]));
    // kim reads m0 at a: what the export passes on starts after it.
    inbox_until(&a, "kim", 1);
    // b goes away (from both), and queues for kim at a meanwhile.
    away(&b, &[&a, &c]);
    let mut ids = Vec::new();
    for i in 1..=3 {
        let id = ok(as_agent(&b, "bob", &["send", &kim_at_a, &format!("m{i}")]));
        ids.push(id.trim().to_owned());
    }
    // kim moves to c while b is away.
    let file = tmp.path().join("kim.export");
    export_kim(&a, &file, &[]);
    import_kim(&c, &file);
    wait_agents(&a, "a marks kim as moved", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    // b comes back to a only: its queue goes to the host kim left.
    ok(b.mesh(&["peer", "resume", a.node()]).unwrap());
    let got = inbox_until(&c, "kim", 3);
    let bodies: Vec<&str> = got.iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["m1", "m2", "m3"], "{got:?}");
    for (e, id) in got.iter().zip(&ids) {
        assert_eq!(e["id"], id.as_str(), "the id its author gave it");
        assert_eq!(e["from"], format!("bob@{}", b.node()));
        assert_eq!(e["forwarded_by"], a.node());
    }
    assert_eq!(a.metric("mesh_agent_forwards_sent_total"), Some(3));
    assert_eq!(c.metric("mesh_agent_forwards_received_total"), Some(3));
    // a kept them too, in kim's previous inbox there (with m0, from before).
    let old = inbox_until(&a, "kim", 4);
    assert_eq!(old.len(), 4, "{old:?}");
    // b comes back to c too, and writes on to kim@a: it learned from a
    // itself that kim@a moved, so m4 goes to c, not through a.
    ok(b.mesh(&["peer", "resume", c.node()]).unwrap());
    wait_agents(&b, "b learns of the move", |all| {
        kim_moved_to(all, c.node())
    });
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "m4"]));
    let got = inbox_until(&c, "kim", 4);
    let bodies: Vec<&str> = got.iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["m1", "m2", "m3", "m4"], "{got:?}");
    assert!(
        got[..3].iter().all(|e| e["verified"] == false),
        "the forwarder vouches, not the author: {got:?}"
    );
    assert!(got[3].get("forwarded_by").is_none(), "{got:?}");
    assert_eq!(got[3]["verified"], true, "{got:?}");
    assert_eq!(a.metric("mesh_agent_forwards_sent_total"), Some(3));
    let text = ok(as_agent(&c, "kim", &["inbox", "--limit", "1"]));
    assert!(text.contains("via"), "{text}");
}

/// Writes `config` as the config file of the daemon `name` in `root`.
fn configure(root: &Path, name: &str, config: &str) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), config).unwrap();
}

/// b, away, queues `bodies` from bob for kim at a; kim moves from a to c
/// (export, import); a is cut off from c; b comes back to a, which takes
/// the messages into kim's previous inbox to pass on.
fn queued_for_the_old_host_while_the_new_is_away(
    root: &Path,
    a: &DaemonProcess,
    b: &DaemonProcess,
    c: &DaemonProcess,
    bodies: &[String],
) {
    let kim_at_a = add_kim_and_bob(a, b);
    away(b, &[a, c]);
    for body in bodies {
        ok(as_agent(b, "bob", &["send", &kim_at_a, body]));
    }
    let file = root.join("kim.export");
    export_kim(a, &file, &[]);
    import_kim(c, &file);
    wait_agents(a, "a marks kim as moved", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    away(a, &[c]);
    ok(b.mesh(&["peer", "resume", a.node()]).unwrap());
}

/// A host the agent left whose outbox to the new host is full passes on
/// nothing by a loss, even under `evict-oldest`: its own sends to the new
/// host are refused while a forward waits there, and every message reaches
/// the agent once the new host is back (chaos found forwards evicted).
#[test]
fn a_full_outbox_to_the_new_host_gives_up_no_forward_and_the_agent_gets_every_message() {
    let tmp = temp_dir().unwrap();
    configure(
        tmp.path(),
        "a",
        "[outbox]\nmax_msgs = 3\non_full = \"evict-oldest\"\n",
    );
    let (a, b, c) = triangle(tmp.path());
    // a cannot reach c. The three messages for kim are committed in its
    // inbox at a before a learns of the move, so the pass-on reads them in
    // one page and forwards all three into a's outbox to c (three fill it).
    // (Had they come in two commits, the pass-on would wait for c to
    // acknowledge the first page before reading the next: the test once
    // failed so under load.)
    let kim_at_a = add_kim_and_bob(&a, &b);
    away(&a, &[&c]);
    for i in 1..=3 {
        let id = ok(as_agent(&b, "bob", &["send", &kim_at_a, &format!("m{i}")]));
        b.wait_message_state(id.trim(), "delivered", SETTLE);
    }
    let file = tmp.path().join("kim.export");
    export_kim(&a, &file, &[]);
    import_kim(&c, &file);
    // a hears of the move through b.
    wait_agents(&a, "a marks kim as moved", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    let deadline = Instant::now() + SETTLE;
    while a.metric("mesh_agent_forwards_sent_total") < Some(3) {
        assert!(Instant::now() < deadline, "a did not pass the three on");
        std::thread::sleep(Duration::from_millis(50));
    }
    // a's own send to c would make room by giving up a forward: refused.
    let out = a.mesh(&["send", c.node(), "plain"]).unwrap();
    assert!(!out.ok(), "{out:?}");
    assert_says(&out, &["outbox"]);
    let events = ok(a.mesh(&["events", "--json"]).unwrap());
    assert!(
        !events
            .lines()
            .any(|l| parse_json(l).unwrap()["kind"] == "loss"),
        "nothing given up: {events}"
    );
    // c is back: kim gets each of the three, once and in order.
    ok(a.mesh(&["peer", "resume", c.node()]).unwrap());
    let got = inbox_until(&c, "kim", 3);
    let bodies: Vec<&str> = got.iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["m1", "m2", "m3"], "{got:?}");
    // Once c acknowledged them, a's own sends to c go again.
    let deadline = Instant::now() + SETTLE;
    while !a.mesh(&["send", c.node(), "plain"]).unwrap().ok() {
        assert!(Instant::now() < deadline, "a's outbox to c stays full");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(inbox_until(&c, "kim", 3).len(), 3);
}

/// A host the agent left whose journal retention removes messages for it
/// before they are passed on (the new host away, the journal bounded)
/// tells the agent at its new host: a `trimmed` entry stands where they
/// were, and every other message arrives once and in order.
#[test]
fn messages_retention_took_at_the_old_host_before_they_were_passed_on_are_told_to_the_agent() {
    const N: usize = 40;
    let tmp = temp_dir().unwrap();
    // The smallest journal bound: 1 MiB, about 17 of the messages below.
    configure(tmp.path(), "a", "[journal]\nmax_bytes = 1048576\n");
    let (a, b, c) = triangle(tmp.path());
    // b queues 40 messages of 60 KB (2.4 MB) for kim at a while away; a's
    // journal keeps 1 MiB of them while at most a page waits to be passed on.
    let pad = "x".repeat(60_000);
    let bodies: Vec<String> = (0..N).map(|i| format!("m{i:02} {pad}")).collect();
    queued_for_the_old_host_while_the_new_is_away(tmp.path(), &a, &b, &c, &bodies);
    let deadline = Instant::now() + SETTLE;
    let queued_to_a = || {
        let peers = parse_json(&ok(b.mesh(&["peer", "list", "--json"]).unwrap())).unwrap();
        peers["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["node"] == a.node())
            .map_or(u64::MAX, |p| p["queued_msgs"].as_u64().unwrap())
    };
    while queued_to_a() != 0 {
        assert!(Instant::now() < deadline, "b's queue to a did not drain");
        std::thread::sleep(Duration::from_millis(50));
    }
    ok(a.mesh(&["peer", "resume", c.node()]).unwrap());
    // kim at c: a prefix of the messages, then one trimmed entry passed on
    // by a, then the rest: nothing missing that the entry does not cover.
    let deadline = Instant::now() + SETTLE;
    let entries = loop {
        let out = as_agent(&c, "kim", &["inbox", "--json", "--limit", "1000"]);
        assert!(out.ok(), "{out:?}");
        let entries: Vec<serde_json::Value> =
            out.stdout.lines().map(|l| parse_json(l).unwrap()).collect();
        let last = format!("m{:02} ", N - 1);
        if entries
            .iter()
            .any(|e| e["body"].as_str().is_some_and(|b| b.starts_with(&last)))
        {
            break entries;
        }
        assert!(
            Instant::now() < deadline,
            "kim at c has {} entries",
            entries.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let seen: Vec<String> = entries
        .iter()
        .map(|e| match e["kind"].as_str().unwrap() {
            "message" => e["body"].as_str().unwrap()[..3].to_owned(),
            kind => kind.to_owned(),
        })
        .collect();
    let at = seen.iter().position(|k| k == "trimmed");
    let at = at.unwrap_or_else(|| panic!("no trimmed entry: {seen:?}"));
    let trimmed = &entries[at];
    assert_eq!(trimmed["forwarded_by"], a.node(), "{trimmed}");
    assert!(
        trimmed["body"].as_str().unwrap().contains("retention"),
        "{trimmed}"
    );
    let number = |k: &String| {
        k[1..]
            .parse::<usize>()
            .unwrap_or_else(|_| panic!("{seen:?}"))
    };
    let before: Vec<usize> = seen[..at].iter().map(number).collect();
    let after: Vec<usize> = seen[at + 1..].iter().map(number).collect();
    assert_eq!(before, (0..before.len()).collect::<Vec<_>>(), "{seen:?}");
    let first_after = after.first().copied().unwrap_or(N);
    assert!(
        first_after > before.len(),
        "the entry stands for a loss: {seen:?}"
    );
    assert_eq!(after, (first_after..N).collect::<Vec<_>>(), "{seen:?}");
    assert_eq!(a.metric("mesh_agent_forwards_trimmed_sent_total"), Some(1));
    assert_eq!(
        c.metric("mesh_agent_forwards_trimmed_received_total"),
        Some(1)
    );
}

/// Seed 004's second test, in our terms: the host an agent left is read
/// until every peer has followed. With a contact away, the drain goes on
/// after the move; once the contact is back, has sent what it queued for
/// the agent to the old host and follows the move, and the old host has
/// passed all of it on, the drain ends, saying why. What the contact sends
/// after that goes to the new host.
#[test]
fn the_old_host_is_read_until_every_peer_follows_and_then_the_drain_ends() {
    let tmp = temp_dir().unwrap();
    let (a, b, c) = online_triangle(tmp.path());
    let kim_at_a = add_kim_and_bob(&a, &b);
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "m0"]));
    inbox_until(&a, "kim", 1);
    away(&b, &[&a, &c]);
    for i in 1..=3 {
        ok(as_agent(&b, "bob", &["send", &kim_at_a, &format!("m{i}")]));
    }
    let file = tmp.path().join("kim.export");
    let (_, read_to) = read_inbox(&a, "kim", None);
    export_kim(&a, &file, &["--after", &read_to.unwrap()]);
    import_kim(&c, &file);
    // c follows at once (it hosts kim); b, away, has not: the drain goes on.
    wait_agents(&a, "a drains kim's previous inbox", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    assert_eq!(a.metric("mesh_agent_drains_followed_total"), Some(0));
    assert!(drains_ended(&a).is_empty());
    // b comes back to a: its queue reaches a, a passes it on, b learns of
    // the move from a and follows: the drain ends.
    ok(b.mesh(&["peer", "resume", a.node()]).unwrap());
    wait_agents(&a, "the drain ends and kim is no longer a's", |all| {
        all["local"].as_array().unwrap().is_empty()
    });
    let got = inbox_until(&c, "kim", 3);
    let bodies: Vec<&str> = got.iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, ["m1", "m2", "m3"], "read to its end first: {got:?}");
    assert!(got.iter().all(|e| e["forwarded_by"] == a.node()), "{got:?}");
    let ended = drains_ended(&a);
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert!(
        ended[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("every peer")),
        "{}",
        ended[0]
    );
    assert_eq!(a.metric("mesh_agent_drains_followed_total"), Some(1));
    assert!(
        b.metric("mesh_agent_follows_sent_total")
            .is_some_and(|n| n >= 1)
    );
    // From now on b writes to kim at c, by the address it knows.
    ok(b.mesh(&["peer", "resume", c.node()]).unwrap());
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "m4"]));
    let got = inbox_until(&c, "kim", 4);
    assert_eq!(got[3]["body"], "m4");
    assert!(got[3].get("forwarded_by").is_none(), "{got:?}");
    // And so does an agent of a, the node kim left: a no longer hosts kim.
    ok(a.mesh(&["agent", "add", "ann"]).unwrap());
    ok(as_agent(&a, "ann", &["send", &kim_at_a, "from ann"]));
    let got = inbox_until(&c, "kim", 5);
    assert_eq!(got[4]["body"], "from ann");
    assert_eq!(got[4]["from"], format!("ann@{}", a.node()));
    assert_eq!(a.metric("mesh_agent_forwards_sent_total"), Some(3));
}

/// Seed 004's third test, in our terms: two moves of one agent made in a
/// race (one export imported on two nodes while they are apart), while a
/// contact writes to it. Every node settles on one host, and every message
/// sent from the export on reaches the agent there exactly once.
#[test]
fn two_moves_in_a_race_settle_on_one_host_and_nothing_sent_meanwhile_is_lost_or_doubled() {
    let tmp = temp_dir().unwrap();
    let (a, b, c) = triangle(tmp.path());
    ok(a.mesh(&["agent", "add", "kim"]).unwrap());
    ok(a.mesh(&["agent", "add", "bob"]).unwrap());
    let kim_at_a = format!("kim@{}", a.node());
    let mut sent: Vec<String> = Vec::new();
    let mut send = |i: usize| {
        let id = ok(as_agent(&a, "bob", &["send", &kim_at_a, &format!("m{i}")]));
        sent.push(id.trim().to_owned());
    };
    send(0);
    // kim reads m0 at a: what the export passes on starts after it.
    inbox_until(&a, "kim", 1);
    let file = tmp.path().join("kim.export");
    export_kim(&a, &file, &[]);
    // b and c are cut off from everyone, and each imports the export.
    for (d, others) in [(&b, [&a, &c]), (&c, [&a, &b])] {
        for o in others {
            ok(d.mesh(&["peer", "pause", o.node()]).unwrap());
        }
    }
    for i in 1..=5 {
        send(i);
    }
    import_kim(&b, &file);
    import_kim(&c, &file);
    for i in 6..=10 {
        send(i);
    }
    for (d, others) in [(&b, [&a, &c]), (&c, [&a, &b])] {
        for o in others {
            ok(d.mesh(&["peer", "resume", o.node()]).unwrap());
        }
    }
    // The same version twice: the higher node id wins, everywhere.
    let (winner, loser) = if b.node() > c.node() {
        (&b, &c)
    } else {
        (&c, &b)
    };
    for d in [&a, &b, &c] {
        wait_agents(d, "every node settles on one host", |all| {
            moves_of(all, "kim")
                .first()
                .is_some_and(|m| m["node"] == winner.node() && m["version"] == 1)
        });
    }
    wait_agents(loser, "the loser no longer hosts kim", |all| {
        all["local"][0]["moved_to"] == winner.node()
    });
    wait_agents(&a, "a no longer hosts kim", |all| {
        all["local"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "kim" && x["moved_to"] == winner.node())
    });
    // And on: what is sent to kim@a now is passed on to the winner.
    for i in 11..=15 {
        send(i);
    }
    let got = inbox_until(winner, "kim", 15);
    let mut ids: Vec<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let mut want: Vec<&str> = sent[1..].iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(ids, want, "every message from the export on, once: {got:?}");
    // a knows kim's key (it was its agent): its own later sends to kim@a
    // go to the winner directly, not through its previous inbox.
    let late: Vec<&serde_json::Value> = got
        .iter()
        .filter(|e| ["m11", "m12", "m13", "m14", "m15"].contains(&e["body"].as_str().unwrap()))
        .collect();
    assert_eq!(late.len(), 5, "{got:?}");
    assert!(
        late.iter().all(|e| e.get("forwarded_by").is_none()),
        "{late:?}"
    );
    // The loser's kim is not acting, and got nothing that is lost: what
    // came to it (nothing here) would be passed on too.
    let out = as_agent(loser, "kim", &["send", &format!("bob@{}", a.node()), "x"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

/// The drain's end: with `[agents] drain_days = 0` the old host passes on
/// what it holds for the moved agent, journals that the drain ended and no
/// longer hosts the agent; a message that comes for it later is bounced to
/// its sender, never dropped.
#[test]
fn once_the_drain_ends_the_old_host_says_so_and_a_late_message_is_bounced_to_its_sender() {
    let tmp = temp_dir().unwrap();
    configure(tmp.path(), "a", "[agents]\ndrain_days = 0\n");
    let (a, b, c) = triangle(tmp.path());
    let kim_at_a = add_kim_and_bob(&a, &b);
    let file = tmp.path().join("kim.export");
    export_kim(&a, &file, &[]);
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "held at a"]));
    // b goes away before it learns of the move, with one more queued.
    away(&b, &[&a, &c]);
    let late = ok(as_agent(&b, "bob", &["send", &kim_at_a, "late"]));
    import_kim(&c, &file);
    // What a held is passed on, then the drain ends: journaled, kim gone.
    let got = inbox_until(&c, "kim", 1);
    assert_eq!(got[0]["body"], "held at a");
    wait_agents(&a, "the drain ends and kim is no longer a's", |all| {
        all["local"].as_array().unwrap().is_empty()
    });
    let ended = drains_ended(&a);
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["agent"], "kim");
    assert_eq!(ended[0]["to"], c.node());
    // kim is gone from a, and a still says where it went.
    let out = as_agent(&a, "kim", &["send", &format!("bob@{}", b.node()), "stale"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_says(&out, &["agent_moved", "moved to node", c.node()]);
    // b comes back to a only: its late message is bounced, not dropped.
    ok(b.mesh(&["peer", "resume", a.node()]).unwrap());
    let deadline = Instant::now() + SETTLE;
    let bounce = loop {
        let out = as_agent(&b, "bob", &["inbox", "--json", "--limit", "10"]);
        let got: Vec<serde_json::Value> =
            out.stdout.lines().map(|l| parse_json(l).unwrap()).collect();
        if let Some(e) = got.into_iter().find(|e| e["kind"] == "bounce") {
            break e;
        }
        assert!(Instant::now() < deadline, "no bounce: {out:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(bounce["id"], late.trim());
    assert_eq!(
        inbox_until(&c, "kim", 1).len(),
        1,
        "the late one is not at c"
    );
}

/// The agent's inbox on `d` after `after` (all of it if `None`), and the
/// cursor after its last entry: what the agent reads there.
fn read_inbox(
    d: &DaemonProcess,
    agent: &str,
    after: Option<&str>,
) -> (Vec<String>, Option<String>) {
    let mut args = vec!["inbox", "--json", "--limit", "1000"];
    if let Some(a) = after {
        args.extend(["--after", a]);
    }
    let out = as_agent(d, agent, &args);
    assert!(out.ok(), "{out:?}");
    let entries: Vec<serde_json::Value> =
        out.stdout.lines().map(|l| parse_json(l).unwrap()).collect();
    let cursor = entries
        .last()
        .map(|e| e["cursor"].as_str().unwrap().to_owned());
    let ids = entries
        .iter()
        .filter(|e| e["kind"] == "message")
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    (ids, cursor.or_else(|| after.map(str::to_owned)))
}

/// An agent moved twice (a → c → d) while a contact writes to it, each
/// host it left killed (`kill -9`) right after the move and started again:
/// what the agent read at each host, and what reaches it at the last, hold
/// every message exactly once.
#[test]
fn an_agent_moved_twice_with_the_hosts_it_left_killed_reads_each_message_once() {
    let tmp = temp_dir().unwrap();
    let dirs: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| tmp.path().join(n))
        .collect();
    let mut nodes: Vec<Option<DaemonProcess>> = dirs.iter().map(|d| Some(start(d))).collect();
    for i in 0..4 {
        for j in i + 1..4 {
            link(n(&nodes, i), n(&nodes, j));
        }
    }
    let (a, b, c, d) = (0, 1, 2, 3);
    let kim_at_a = add_kim_and_bob(n(&nodes, a), n(&nodes, b));
    let mut sent = Vec::new();
    let send = |nodes: &[Option<DaemonProcess>], sent: &mut Vec<String>, i: usize| {
        let out = as_agent(n(nodes, b), "bob", &["send", &kim_at_a, &format!("m{i}")]);
        sent.push(ok(out).trim().to_owned());
    };
    send(&nodes, &mut sent, 0);
    // kim reads at a, then more comes, then it is exported: what came
    // after what it read is passed on.
    let got = inbox_until(n(&nodes, a), "kim", 1);
    let read_a: Vec<String> = got
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    let after_a = got.last().unwrap()["cursor"].as_str().unwrap().to_owned();
    for i in 1..=3 {
        send(&nodes, &mut sent, i);
    }
    let file = tmp.path().join("kim.1");
    export_kim(n(&nodes, a), &file, &["--after", &after_a]);
    import_kim(n(&nodes, c), &file);
    let c_id = n(&nodes, c).node().to_owned();
    // (Its drain may end at once: every peer here follows.)
    wait_agents(n(&nodes, a), "a learns of the move", |all| {
        kim_moved_to(all, c_id.as_str())
    });
    // a dies at once, maybe mid-pump; the contact writes on; a comes back.
    nodes[a] = None;
    for i in 4..=6 {
        send(&nodes, &mut sent, i);
    }
    nodes[a] = Some(start(&dirs[a]));
    // kim reads at c what came so far, then moves on to d; c dies at once
    // and comes back.
    inbox_until(n(&nodes, c), "kim", 1);
    let (read_c, after_c) = read_inbox(n(&nodes, c), "kim", None);
    let file = tmp.path().join("kim.2");
    let after: Vec<&str> = after_c
        .iter()
        .flat_map(|a| ["--after", a.as_str()])
        .collect();
    export_kim(n(&nodes, c), &file, &after);
    for i in 7..=8 {
        send(&nodes, &mut sent, i);
    }
    import_kim(n(&nodes, d), &file);
    let d_id = n(&nodes, d).node().to_owned();
    // (Its drain may end at once: every peer here follows.)
    wait_agents(n(&nodes, c), "c learns of the move", |all| {
        kim_moved_to(all, d_id.as_str())
    });
    nodes[c] = None;
    for i in 9..=10 {
        send(&nodes, &mut sent, i);
    }
    nodes[c] = Some(start(&dirs[c]));
    // At d: everything not read at a or c, once.
    let want: std::collections::BTreeSet<String> = sent.iter().cloned().collect();
    let deadline = Instant::now() + SETTLE;
    loop {
        let (ids, _) = read_inbox(n(&nodes, d), "kim", None);
        let all: Vec<String> = read_a.iter().chain(&read_c).chain(&ids).cloned().collect();
        let seen: std::collections::BTreeSet<String> = all.iter().cloned().collect();
        assert_eq!(
            seen.len(),
            all.len(),
            "a message read twice: a {read_a:?} c {read_c:?} d {ids:?}"
        );
        if seen == want {
            assert!(!ids.is_empty(), "d got what came after the reads");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all read once: sent {sent:?}, a {read_a:?}, c {read_c:?}, d {ids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Node `i` of `nodes`, which must be running.
fn n(nodes: &[Option<DaemonProcess>], i: usize) -> &DaemonProcess {
    nodes[i].as_ref().expect("running")
}

/// Back to the host it left, with a message in flight: a → c, a message
/// reaches a and is passed on to c but not read there, then the agent
/// moves back to a. c passes it back, and a (which journaled it before)
/// puts it in the agent's inbox again past where it reads on: read once.
#[test]
fn a_message_passed_on_and_back_before_it_was_read_is_read_once_at_the_host_moved_back_to() {
    let tmp = temp_dir().unwrap();
    let (a, b, c) = triangle(tmp.path());
    let kim_at_a = add_kim_and_bob(&a, &b);
    let file = tmp.path().join("kim.1");
    export_kim(&a, &file, &[]);
    import_kim(&c, &file);
    wait_agents(&a, "a learns of the move", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    let m1 = ok(as_agent(&b, "bob", &["send", &kim_at_a, "m1"]));
    inbox_until(&c, "kim", 1);
    // kim reads m1 at c; m2 comes, is passed on to c, and is not read.
    let (read_c, after_c) = read_inbox(&c, "kim", None);
    assert_eq!(read_c, [m1.trim()]);
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "m2"]));
    inbox_until(&c, "kim", 2);
    let back = tmp.path().join("kim.2");
    let after_c = after_c.unwrap();
    export_kim(&c, &back, &["--after", &after_c]);
    let again = parse_json(&ok(a
        .mesh(&["agent", "import", back.to_str().unwrap(), "--json"])
        .unwrap()))
    .unwrap();
    let inbox_after = again["inbox_after"].as_str().unwrap().to_owned();
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "m3"]));
    // At a, from where it reads on: m2 (passed back by c) and m3, once each.
    let deadline = Instant::now() + SETTLE;
    loop {
        let out = as_agent(&a, "kim", &["inbox", "--json", "--after", &inbox_after]);
        let bodies: Vec<String> = out
            .stdout
            .lines()
            .map(|l| parse_json(l).unwrap())
            .filter(|e| e["kind"] == "message")
            .map(|e| e["body"].as_str().unwrap().to_owned())
            .collect();
        let mut sorted = bodies.clone();
        sorted.sort();
        if sorted == ["m2", "m3"] {
            break;
        }
        assert!(
            bodies.len() <= 2 && Instant::now() < deadline,
            "kim at a reads {bodies:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A move without `--after` passes on what the old host never handed the
/// agent (before: everything up to the move counted as read, and what the
/// agent had not read stayed at the old host, where nobody could read it).
/// kim reads m1 of m1..m3 at a, a is restarted, kim moves to c without
/// `--after`: at c it gets m2 and m3, once each, and not m1.
#[test]
fn a_move_without_after_passes_on_what_the_agent_never_read_even_across_a_restart() {
    let tmp = temp_dir().unwrap();
    let (a, b, c) = triangle(tmp.path());
    let kim_at_a = add_kim_and_bob(&a, &b);
    let sent: Vec<String> = ["m1", "m2", "m3"]
        .iter()
        .map(|m| {
            ok(as_agent(&b, "bob", &["send", &kim_at_a, m]))
                .trim()
                .to_owned()
        })
        .collect();
    // All three committed at a, seen from b: kim's inbox is not read yet.
    for id in &sent {
        b.wait_message_state(id, "delivered", SETTLE);
    }
    // kim reads one entry: m1.
    let first = as_agent(&a, "kim", &["inbox", "--json", "--limit", "1"]);
    let first = parse_json(ok(first).lines().next().unwrap()).unwrap();
    assert_eq!(first["id"], sent[0].as_str());
    let a_dir = a.data().to_path_buf();
    a.terminate().unwrap();
    let a = start(&a_dir);
    ok(move_agent(&a, "kim", c.node(), &[]));
    let got = inbox_until(&c, "kim", 2);
    let ids: Vec<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [sent[1].as_str(), sent[2].as_str()],
        "m2 and m3 (never read at a), once each, m1 not: {got:?}"
    );
}

/// The move's answer as `mesh agent move NAME --to PEER --json` on `d`
/// prints it (`extra` after the peer).
fn move_agent(d: &DaemonProcess, name: &str, to: &str, extra: &[&str]) -> Output {
    let mut args = vec!["agent", "move", name, "--to", to];
    args.extend_from_slice(extra);
    d.mesh(&args).unwrap()
}

/// `mesh agent move` hands the agent to a peer over the mesh: what was sent
/// to it after what it read at the old host, before and after the move,
/// reaches it at the new host exactly once; the old host no longer acts as
/// it the moment the move returns; every node shows it at its new host.
#[test]
fn an_agent_moved_over_the_mesh_gets_each_message_once_at_its_new_host_and_not_at_the_old() {
    let tmp = temp_dir().unwrap();
    let (a, b, c) = triangle(tmp.path());
    add_kim_and_bob(&a, &b);
    // The peer by a local alias, as a send names it.
    ok(a.mesh(&["peer", "name", c.node(), "gpu"]).unwrap());
    let kim_at_a = format!("kim@{}", a.node());
    let key = {
        let all = parse_json(&ok(a.mesh(&["agents", "--json"]).unwrap())).unwrap();
        all["local"][0]["key"].as_str().unwrap().to_owned()
    };
    // kim reads m1 at a; m2 comes after what it read.
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "m1"]));
    inbox_until(&a, "kim", 1);
    let (_, read_to) = read_inbox(&a, "kim", None);
    let m2 = ok(as_agent(&b, "bob", &["send", &kim_at_a, "m2"]));
    inbox_until(&a, "kim", 2);

    let out = move_agent(&a, "kim", "gpu", &["--after", &read_to.unwrap(), "--json"]);
    let moved = parse_json(&ok(out)).unwrap();
    assert_eq!(moved["agent"]["address"], format!("kim@{}", c.node()));
    assert_eq!(
        moved["agent"]["key"],
        key.as_str(),
        "the same agent, by its key"
    );
    assert_eq!(moved["version"], 1);
    assert_eq!(moved["already"], false);

    // The old host refuses to act as it as soon as the move returns.
    let out = as_agent(&a, "kim", &["send", &format!("bob@{}", b.node()), "stale"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_says(&out, &["agent_moved", "moved to node", c.node()]);
    // A second move is refused the same way: it moved already.
    let again = move_agent(&a, "kim", c.node(), &[]);
    assert_eq!(again.status.code(), Some(3), "{again:?}");
    assert_says(&again, &["agent_moved"]);

    // Sent after the move to the address it had: it reaches kim at c.
    let m3 = ok(as_agent(&b, "bob", &["send", &kim_at_a, "m3"]));
    let got = inbox_until(&c, "kim", 2);
    let mut ids: Vec<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let mut want = vec![m2.trim(), m3.trim()];
    want.sort_unstable();
    assert_eq!(
        ids, want,
        "m2 and m3 once each, m1 (read at a) not: {got:?}"
    );
    // And one more, from kim's new host's point of view: still once each.
    let m4 = ok(as_agent(&b, "bob", &["send", &kim_at_a, "m4"]));
    let got = inbox_until(&c, "kim", 3);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[2]["id"], m4.trim());
    // kim acts at c.
    ok(as_agent(
        &c,
        "kim",
        &["send", &format!("bob@{}", b.node()), "from c"],
    ));
    // Every node shows kim at c; a shows it moved there.
    for d in [&a, &b, &c] {
        wait_agents(d, "the move notice arrives", |all| {
            moves_of(all, "kim")
                .first()
                .is_some_and(|m| m["node"] == c.node() && m["from"] == a.node())
        });
    }
    let all = parse_json(&ok(c.mesh(&["agents", "--json"]).unwrap())).unwrap();
    assert!(
        all["local"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "kim" && x.get("moved_to").is_none()),
        "{all}"
    );
    let all = parse_json(&ok(a.mesh(&["agents", "--json"]).unwrap())).unwrap();
    assert_eq!(all["local"][0]["moved_to"], c.node(), "{all}");
}

/// A move that cannot be made changes nothing: to a node that is not a
/// peer (refused here), to a node that does not have this one as a peer
/// (refused there before it reads anything), of an unknown agent, or to
/// this node itself. The agent stays, acting where it was, and the error
/// says so, by its fault class.
#[test]
fn a_move_to_a_node_that_is_not_a_peer_or_of_an_unknown_agent_is_refused_and_changes_nothing() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let d = start(&tmp.path().join("d"));
    link(&a, &b);
    add_kim_and_bob(&a, &b);

    // d is no peer of a's.
    let out = move_agent(&a, "kim", d.node(), &[]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_says(&out, &["unknown_peer", "stays here"]);
    // a has d as a peer, d does not have a: d refuses before reading.
    ok(a.mesh(&["peer", "add", d.ticket()]).unwrap());
    let refused_before = d.metric("mesh_unknown_node_refused_total").unwrap();
    let out = move_agent(&a, "kim", d.node(), &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_says(&out, &["forbidden", "not its peer", "stays here"]);
    assert!(
        d.metric("mesh_unknown_node_refused_total").unwrap() > refused_before,
        "counted at d"
    );
    // An unknown agent, and this node itself.
    let out = move_agent(&a, "nobody", b.node(), &[]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_says(&out, &["unknown_agent"]);
    let out = move_agent(&a, "kim", a.node(), &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");

    // Nothing changed: d hosts no kim, nobody holds a notice, kim acts at a.
    let all = parse_json(&ok(d.mesh(&["agents", "--json"]).unwrap())).unwrap();
    assert!(all["local"].as_array().unwrap().is_empty(), "{all}");
    for n in [&a, &b, &d] {
        let all = parse_json(&ok(n.mesh(&["agents", "--json"]).unwrap())).unwrap();
        assert!(moves_of(&all, "kim").is_empty(), "{all}");
    }
    let all = parse_json(&ok(a.mesh(&["agents", "--json"]).unwrap())).unwrap();
    assert!(all["local"][0].get("moved_to").is_none(), "{all}");
    ok(as_agent(
        &a,
        "kim",
        &["send", &format!("bob@{}", b.node()), "still here"],
    ));
    let got = inbox_until(&b, "bob", 1);
    assert_eq!(got[0]["body"], "still here");
}

/// An answer lost after the import is safe to retry: the same offer made
/// again (by hand on the move link, as the old host's node) is answered
/// imported, `already`, with the same notice; nothing is done twice.
#[test]
fn a_move_offered_again_after_its_answer_was_lost_is_answered_imported_and_done_once() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let c = start(&tmp.path().join("c"));
    link(&a, &c);
    // a's drain stays open: kim stays a's, marked moved.
    offline_member(tmp.path(), &[&a, &c]);
    ok(a.mesh(&["agent", "add", "kim"]).unwrap());
    let file = tmp.path().join("kim.export");
    export_kim(&a, &file, &[]);
    let export = std::fs::read(&file).unwrap();
    // As a's node: its key, from its data dir.
    let key: [u8; 32] = std::fs::read(a.data().join("node.key"))
        .unwrap()
        .try_into()
        .unwrap();
    let key = mesh_protocol::SecretKey::from_bytes(&key);
    let to: mesh_protocol::NodeTicket = c.ticket().parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let offer = || {
        let answer = rt
            .block_on(mesh_tests::move_link::offer(key.clone(), &to, &export))
            .unwrap();
        parse_json(std::str::from_utf8(&answer).unwrap()).unwrap()
    };
    let first = offer();
    assert_eq!(first["imported"]["version"], 1, "{first}");
    assert_eq!(first["imported"]["already"], false, "{first}");
    let second = offer();
    assert_eq!(second["imported"]["version"], 1, "{second}");
    assert_eq!(second["imported"]["already"], true, "{second}");
    assert_eq!(
        second["imported"]["agent"]["address"],
        format!("kim@{}", c.node())
    );
    let all = parse_json(&ok(c.mesh(&["agents", "--json"]).unwrap())).unwrap();
    let m = moves_of(&all, "kim");
    assert_eq!(m.len(), 1, "{all}");
    assert_eq!(m[0]["version"], 1, "one notice, not a second: {all}");
    // And a's own `mesh agent move` now: it moved already.
    wait_agents(&a, "a learns of the move", |all| {
        all["local"][0]["moved_to"] == c.node()
    });
    let out = move_agent(&a, "kim", c.node(), &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_says(&out, &["agent_moved"]);
}

/// The read position travels with a move (issue 31): an agent that read a
/// page of its inbox but acknowledged only part of it moves, and what it
/// did not acknowledge is passed on and unread at its new host; what it
/// acknowledged is not.
#[test]
fn what_an_agent_read_but_did_not_acknowledge_is_unread_at_its_new_host() {
    let tmp = temp_dir().unwrap();
    let (a, b) = (start(&tmp.path().join("a")), start(&tmp.path().join("b")));
    link(&a, &b);
    let kim_at_a = add_kim_and_bob(&a, &b);
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "acked"]));
    ok(as_agent(&b, "bob", &["send", &kim_at_a, "read, not acked"]));
    // Both handed to kim (its served cursor is past both), one acked.
    let page = inbox_until(&a, "kim", 2);
    let first = page[0]["cursor"].as_str().unwrap();
    ok(as_agent(&a, "kim", &["ack", first]));
    ok(a.mesh(&["agent", "move", "kim", "--to", b.node()]).unwrap());
    let unread: Vec<String> = inbox_with_until(&b, "kim", &["--unread"], 1)
        .iter()
        .map(|e| e["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(unread, vec!["read, not acked".to_owned()]);
}
