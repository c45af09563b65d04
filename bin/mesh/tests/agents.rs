//! Agents through real `mesh daemon` processes and the `mesh` CLI, each
//! command its own process: addresses, inboxes, refusals, bounces,
//! request/reply, waits, restarts and retried sends.
//!
//! Every wait is on an event (a command's output, `--wait` on the inbox,
//! a message's state) and bounded.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mesh_tests::daemon::{
    DaemonProcess, Output, assert_says, loopback, ok, parse_json, run, temp_dir,
};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// How long a message may take to reach the other node's inbox.
const ARRIVAL_SECS: &str = "30";
/// How long a state the test waits for may take (polled through the CLI).
const SETTLE: Duration = Duration::from_secs(60);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

#[track_caller]
fn refused(out: &Output, code: i32, words: &[&str]) {
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    assert_says(out, words);
}

/// Two daemons linked both ways, each naming the other by an alias.
fn pair(root: &Path) -> (DaemonProcess, DaemonProcess) {
    let a = start(&root.join("a"));
    let b = start(&root.join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["peer", "name", b.node(), "gpu"]).unwrap());
    ok(b.mesh(&["peer", "name", a.node(), "laptop"]).unwrap());
    (a, b)
}

/// `mesh --agent AGENT ...` against `d`.
fn as_agent(d: &DaemonProcess, agent: &str, args: &[&str]) -> Output {
    let mut all = vec!["--agent", agent];
    all.extend_from_slice(args);
    d.mesh(&all).unwrap()
}

/// The inbox entries of `agent` after `after`, waiting up to
/// [`ARRIVAL_SECS`] for the first, and the next cursor.
fn inbox(
    d: &DaemonProcess,
    agent: &str,
    after: Option<&str>,
    limit: u32,
) -> (Vec<serde_json::Value>, String) {
    let limit = limit.to_string();
    let mut args = vec!["inbox", "--json", "--wait", ARRIVAL_SECS, "--limit", &limit];
    if let Some(a) = after {
        args.extend(["--after", a]);
    }
    let out = as_agent(d, agent, &args);
    assert!(out.ok(), "{out:?}");
    let entries = out.stdout.lines().map(|l| parse_json(l).unwrap()).collect();
    let next = out.next_cursor();
    (entries, next)
}

/// The first `n` inbox entries of `agent`, read as they come: messages sent
/// one after another may commit at the receiver one commit apart.
fn inbox_first(d: &DaemonProcess, agent: &str, n: usize) -> Vec<serde_json::Value> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    while all.len() < n {
        let (got, next) = inbox(d, agent, after.as_deref(), 10);
        assert!(!got.is_empty(), "{agent} got {} of {n}: {all:?}", all.len());
        all.extend(got);
        after = Some(next);
    }
    all
}

/// The inbox entries of `agent` now, without waiting.
fn inbox_now(d: &DaemonProcess, agent: &str) -> Vec<serde_json::Value> {
    let out = as_agent(d, agent, &["inbox", "--json", "--limit", "1000"]);
    assert!(out.ok(), "{out:?}");
    out.stdout.lines().map(|l| parse_json(l).unwrap()).collect()
}

/// Polls `mesh message ID` on `d` until its state is `state`.
fn wait_state(d: &DaemonProcess, id: &str, state: &str) -> serde_json::Value {
    d.wait_message_state(id, state, SETTLE)
}

/// Polls the daemon's `/metrics` until the sample `name` is `want`.
fn wait_metric(d: &DaemonProcess, name: &str, want: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = mesh_api::client::Client::new(d.socket());
    let deadline = Instant::now() + SETTLE;
    loop {
        let text = rt.block_on(client.get_text("/metrics")).unwrap();
        let got = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse::<u64>().ok());
        if got == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {got:?}, not {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn journal_head(d: &DaemonProcess) -> u64 {
    let st = parse_json(&ok(d.mesh(&["status", "--json"]).unwrap())).unwrap();
    st["journal_head"].as_u64().unwrap()
}

#[test]
fn agents_on_two_nodes_talk_both_ways_by_alias_and_each_inbox_holds_only_its_own() {
    let tmp = temp_dir().unwrap();
    let (a, b) = pair(tmp.path());
    let added = ok(a.mesh(&["agent", "add", "alice", "--json"]).unwrap());
    let added = parse_json(&added).unwrap();
    assert_eq!(added["address"], format!("alice@{}", a.node()));
    ok(a.mesh(&["agent", "add", "carol"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());

    // a → b by alias; the id is what the inbox shows.
    let id = ok(as_agent(&a, "alice", &["send", "bob@gpu", "hi bob"]));
    let id = id.trim();
    let (got, _) = inbox(&b, "bob", None, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["kind"], "message");
    assert_eq!(got[0]["id"], id);
    assert_eq!(got[0]["from"], format!("alice@{}", a.node()));
    assert_eq!(got[0]["to"], format!("bob@{}", b.node()));
    assert_eq!(got[0]["body"], "hi bob");
    assert_eq!(got[0]["verified"], true);
    assert!(got[0]["cursor"].as_str().unwrap().starts_with("mc1"));

    // b → a, and a reply to a's message.
    let back = ok(as_agent(&b, "bob", &["send", "alice@laptop", "hi alice"]));
    let reply = ok(as_agent(&b, "bob", &["reply", id, "ack"]));
    let got = inbox_first(&a, "alice", 2);
    let bodies: Vec<&str> = got.iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert_eq!(bodies.len(), 2, "{got:?}");
    assert!(
        bodies.contains(&"hi alice") && bodies.contains(&"ack"),
        "{got:?}"
    );
    let ack = got.iter().find(|e| e["body"] == "ack").unwrap();
    assert_eq!(ack["in_reply_to"], id);
    assert_eq!(ack["id"], reply.trim());
    assert!(got.iter().any(|e| e["id"] == back.trim()));
    // Carol, on the same node, has nothing; the node's journal has it all.
    assert!(inbox_now(&a, "carol").is_empty());
    let events = ok(a.mesh(&["events", "--json"]).unwrap());
    assert_eq!(events.lines().count(), 3, "{events}");
    // The node's journal reads each as its envelope says, as text too.
    let first = parse_json(events.lines().next().unwrap()).unwrap();
    assert_eq!(first["msg_kind"], 1, "{first}");
    assert_eq!(first["agent"]["id"], id, "{first}");
    assert_eq!(first["agent"]["from"], format!("alice@{}", a.node()));
    assert_eq!(first["agent"]["to"], format!("bob@{}", b.node()));
    assert_eq!(first["agent"]["body"], "hi bob");
    let text = ok(a.mesh(&["events"]).unwrap());
    let line = text.lines().next().unwrap();
    let short = |n: &str| n.chars().take(10).collect::<String>();
    let want = format!(
        "{id} alice@{} -> bob@{}: hi bob",
        short(a.node()),
        short(b.node())
    );
    assert!(line.ends_with(&want), "{line:?}, not ending {want:?}");

    // Where each message is, on each node.
    wait_state(&a, id, "delivered");
    let st = parse_json(&ok(b.mesh(&["message", id, "--json"]).unwrap())).unwrap();
    assert_eq!(st["state"], "received");

    // Each node lists its agents and its peer's.
    let agents = parse_json(&ok(a.mesh(&["agents", "--json"]).unwrap())).unwrap();
    let local: Vec<&str> = agents["local"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(local, ["alice", "carol"]);
    let peers = agents["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "{agents}");
    assert_eq!(peers[0]["address"], format!("bob@{}", b.node()));
    assert_eq!(peers[0]["node_alias"], "gpu");
    let text = ok(a.mesh(&["agents"]).unwrap());
    assert!(text.contains(&format!("bob@{} (gpu)", b.node())), "{text}");
}

/// Starts a daemon in `data` whose `[node] name` is `name`.
fn start_named(data: &Path, name: &str) -> DaemonProcess {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!("[node]\nname = {name:?}\n"),
    )
    .unwrap();
    start(data)
}

/// Polls `mesh peer list` on `d` until its peer `node` shows the name `name`
/// (its card came with a Hello).
fn wait_peer_name(d: &DaemonProcess, node: &str, name: &str) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let peers = parse_json(&ok(d.mesh(&["peer", "list", "--json"]).unwrap())).unwrap();
        let named = peers["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["node"] == node && p["name"] == name);
        if named {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "peer {node} not named {name}: {peers}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn agents_on_two_nodes_talk_both_ways_by_the_name_in_each_nodes_card() {
    let tmp = temp_dir().unwrap();
    let a = start_named(&tmp.path().join("a"), "laptop-x");
    let b = start_named(&tmp.path().join("b"), "gpu-x");
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    wait_peer_name(&a, b.node(), "gpu-x");
    wait_peer_name(&b, a.node(), "laptop-x");

    let id = ok(as_agent(&a, "alice", &["send", "bob@gpu-x", "by name"]));
    let (got, _) = inbox(&b, "bob", None, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["id"], id.trim());
    assert_eq!(got[0]["to"], format!("bob@{}", b.node()));
    let back = ok(as_agent(
        &b,
        "bob",
        &["send", "alice@laptop-x", "back by name"],
    ));
    let (got, _) = inbox(&a, "alice", None, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["id"], back.trim());
    assert_eq!(got[0]["from"], format!("bob@{}", b.node()));
    // A node answers to its own name too: an agent reaches its neighbour.
    ok(a.mesh(&["agent", "add", "carol"]).unwrap());
    let near = ok(as_agent(
        &a,
        "alice",
        &["send", "carol@laptop-x", "next door"],
    ));
    let (got, _) = inbox(&a, "carol", None, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["id"], near.trim());
    assert_eq!(got[0]["to"], format!("carol@{}", a.node()));

    // A name no node has is refused, naming what a node may be called.
    let out = as_agent(&a, "alice", &["send", "bob@nowhere", "lost?"]);
    refused(&out, 4, &["nowhere"]);
    // An alias of the same node as its name agrees with it: not ambiguous.
    ok(a.mesh(&["peer", "name", b.node(), "gpu-x"]).unwrap());
    ok(as_agent(&a, "alice", &["send", "bob@gpu-x", "again"]));
}

#[test]
fn a_name_two_nodes_answer_to_is_refused_listing_both_and_nothing_is_sent() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let c = start_named(&tmp.path().join("c"), "shared");
    for peer in [&b, &c] {
        ok(a.mesh(&["peer", "add", peer.ticket()]).unwrap());
        ok(peer.mesh(&["peer", "add", a.ticket()]).unwrap());
    }
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    wait_peer_name(&a, c.node(), "shared");
    // b's alias here is c's own name.
    ok(a.mesh(&["peer", "name", b.node(), "shared"]).unwrap());
    let head = journal_head(&a);
    let out = as_agent(&a, "alice", &["send", "bob@shared", "which one?"]);
    refused(&out, 3, &["ambiguous", b.node(), c.node()]);
    assert_eq!(journal_head(&a), head, "nothing was written");
    wait_metric(&a, "mesh_agent_sends_total", 0);
}

#[test]
fn a_message_for_an_agent_the_other_node_does_not_host_comes_back_as_a_bounce() {
    let tmp = temp_dir().unwrap();
    let (a, b) = pair(tmp.path());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let id = ok(as_agent(
        &a,
        "alice",
        &["send", "nobody@gpu", "anyone there?"],
    ));
    let id = id.trim();
    let (got, _) = inbox(&a, "alice", None, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["kind"], "bounce");
    assert_eq!(got[0]["id"], id);
    assert_eq!(got[0]["reason"], "no_such_agent");
    assert!(
        got[0]["body"]
            .as_str()
            .unwrap()
            .contains("undeliverable: no_such_agent"),
        "{got:?}"
    );
    // Journaled at b as undeliverable, delivered to no one there.
    let st = parse_json(&ok(b.mesh(&["message", id, "--json"]).unwrap())).unwrap();
    assert_eq!(st["state"], "undeliverable");
    assert!(inbox_now(&b, "bob").is_empty());
    let st = wait_state(&a, id, "bounced");
    assert!(
        st["detail"].as_str().unwrap().contains("no such agent"),
        "{st}"
    );
}

/// A dir that any uid may enter, for agents' sockets.
fn open_dir(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o711)).unwrap();
    path.to_owned()
}

/// The uid other than ours the test acts as.
const NOBODY: u32 = 65534;

/// `mesh ...` run as uid and gid [`NOBODY`] (needs root).
fn as_nobody(args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args([
        "--reuid",
        &NOBODY.to_string(),
        "--regid",
        &NOBODY.to_string(),
        "--clear-groups",
        MESH,
    ])
    .args(args);
    mesh_tests::daemon::run_command(cmd, None).unwrap()
}

#[test]
fn a_wrong_agent_another_uid_and_an_unknown_agent_are_refused_and_write_nothing() {
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata("/proc/self").unwrap().uid(),
        0,
        "this test acts as another uid and must run as root"
    );
    let tmp = temp_dir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let sockets = open_dir(&tmp.path().join("sockets"));
    let data = tmp.path().join("a");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!(
            "[agents]\nsocket_dir = {:?}\n",
            sockets.display().to_string()
        ),
    )
    .unwrap();
    let a = start(&data);
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "bob"]).unwrap());
    let alice_sock = sockets.join("alice.sock");
    let alice_sock = alice_sock.to_str().unwrap();
    let head = journal_head(&a);
    let to = format!("x@{}", b.node());

    // An agent this node does not have: no socket, nothing sent.
    let out = as_agent(&a, "nobody", &["send", &to, "hi"]);
    refused(&out, 3, &["no agent nobody"]);
    // Alice's socket, claiming to be bob.
    let out = a
        .mesh(&[
            "--agent",
            "bob",
            "--agent-socket",
            alice_sock,
            "send",
            &to,
            "hi",
        ])
        .unwrap();
    refused(&out, 3, &["unverified sender", "403", "unverified_sender"]);
    // Alice's socket, used by another uid.
    let data_arg = data.to_str().unwrap();
    let args = [
        "--data",
        data_arg,
        "--agent",
        "alice",
        "--agent-socket",
        alice_sock,
    ];
    let out = as_nobody(&[&args[..], &["send", &to, "hi"]].concat());
    refused(
        &out,
        3,
        &[
            "unverified sender",
            &format!("uid {NOBODY} may not act as agent alice"),
        ],
    );
    // Its inbox too: only alice reads it through her socket.
    let out = as_nobody(&[&args[..], &["inbox"]].concat());
    refused(&out, 3, &["unverified_sender"]);
    assert_eq!(journal_head(&a), head, "nothing was written");
    // The send works as alice herself.
    ok(as_agent(&a, "alice", &["send", &to, "hi"]));
    assert!(journal_head(&a) > head);

    // An agent added for that uid acts through its socket outside the
    // data dir.
    ok(
        a.mesh(&["agent", "add", "dave", "--uid", &NOBODY.to_string()])
            .unwrap(),
    );
    let dave_sock = sockets.join("dave.sock");
    let dave = [
        "--data",
        data_arg,
        "--agent",
        "dave",
        "--agent-socket",
        dave_sock.to_str().unwrap(),
    ];
    let sent = as_nobody(&[&dave[..], &["send", &to, "from another uid"]].concat());
    assert!(sent.ok(), "{sent:?}");
    // A node whose agents' sockets are in its data dir refuses such an agent.
    let out = b
        .mesh(&["agent", "add", "eve", "--uid", &NOBODY.to_string()])
        .unwrap();
    refused(&out, 3, &["socket_dir"]);
}

#[test]
fn a_wait_returns_when_a_message_commits_and_a_request_gets_its_reply_or_times_out() {
    let tmp = temp_dir().unwrap();
    let (a, b) = pair(tmp.path());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());

    // A wait of 120 s returns with the message, long before its time is up.
    let started = Instant::now();
    let (mut waiting, lines) = b
        .spawn_mesh(&["--agent", "bob", "inbox", "--json", "--wait", "120"])
        .unwrap();
    // Once it is waiting (the daemon counts it), the message is sent.
    wait_metric(&b, "mesh_api_inbox_waits", 1);
    ok(as_agent(&a, "alice", &["send", "bob@gpu", "wake up"]));
    let line = lines
        .next_until(started + Duration::from_secs(100))
        .unwrap()
        .expect("the wait printed the entry");
    assert_eq!(parse_json(&line).unwrap()["body"], "wake up");
    assert!(waiting.wait().unwrap().success());
    assert!(started.elapsed() < Duration::from_secs(100));

    // A request waits for the reply that answers it.
    let (mut request, replies) = a
        .spawn_mesh(&[
            "--agent",
            "alice",
            "request",
            "bob@gpu",
            "ping",
            "--timeout",
            "120",
        ])
        .unwrap();
    // The ping is the entry after the first one ("wake up").
    let first = inbox_now(&b, "bob")[0]["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let (got, _) = inbox(&b, "bob", Some(&first), 1);
    assert_eq!(got[0]["body"], "ping");
    ok(as_agent(
        &b,
        "bob",
        &["reply", got[0]["id"].as_str().unwrap(), "pong"],
    ));
    let answer = replies
        .next_until(Instant::now() + Duration::from_secs(100))
        .unwrap();
    assert_eq!(answer.as_deref(), Some("pong"));
    assert!(request.wait().unwrap().success());

    // No reply in time: exit 8; the late reply still lands in the inbox.
    let out = as_agent(
        &a,
        "alice",
        &["request", "bob@gpu", "slow?", "--timeout", "1"],
    );
    refused(&out, 8, &["no reply", "late reply"]);
    // The request was committed at a and reaches b when it does, which under
    // load can be after the second the request waited: read on after "ping".
    let (after_ping, _) = inbox(&b, "bob", got[0]["cursor"].as_str(), 1);
    let slow = &after_ping[0];
    assert_eq!(slow["body"], "slow?");
    ok(as_agent(
        &b,
        "bob",
        &["reply", slow["id"].as_str().unwrap(), "sorry"],
    ));
    let deadline = Instant::now() + SETTLE;
    while !inbox_now(&a, "alice").iter().any(|e| e["body"] == "sorry") {
        assert!(Instant::now() < deadline, "the late reply did not land");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_inbox_walk_one_entry_at_a_time_across_a_restart_sees_each_exactly_once() {
    let tmp = temp_dir().unwrap();
    let (a, b) = pair(tmp.path());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let sent: Vec<String> = (1..=6)
        .map(|i| {
            ok(as_agent(
                &a,
                "alice",
                &["send", "bob@gpu", &format!("m{i}")],
            ))
            .trim()
            .to_owned()
        })
        .collect();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut b = Some(b);
    while seen.len() < sent.len() {
        if seen.len() == 3 {
            // Restart b on its port; the cursor goes on where it was.
            let old = b.take().unwrap();
            let (data, addr) = (old.data().to_owned(), old.peer_addr().unwrap());
            old.terminate().unwrap();
            b = Some(DaemonProcess::start(Path::new(MESH), &data, addr).unwrap());
        }
        let (got, next) = inbox(b.as_ref().unwrap(), "bob", after.as_deref(), 1);
        assert_eq!(got.len(), 1, "{got:?}");
        seen.push(got[0]["id"].as_str().unwrap().to_owned());
        after = Some(next);
    }
    assert_eq!(seen, sent, "each once, in order");
    let (rest, _) = {
        let out = as_agent(
            b.as_ref().unwrap(),
            "bob",
            &["inbox", "--json", "--after", after.as_deref().unwrap()],
        );
        (ok(out), ())
    };
    assert!(rest.is_empty(), "{rest}");
}

#[test]
fn a_send_retried_with_its_id_after_the_daemon_died_between_commit_and_answer_is_delivered_once() {
    let tmp = temp_dir().unwrap();
    let a_data = tmp.path().join("a");
    let a = DaemonProcess::start_with_env(
        Path::new(MESH),
        &a_data,
        loopback(),
        &[("MESH_FAULT_ABORT_AFTER_COMMIT", "job-7")],
    )
    .unwrap();
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let to = format!("bob@{}", b.node());
    // The daemon commits the send, then dies before it answers (the
    // test-only fault hook of the `fault-hooks` build).
    let out = as_agent(&a, "alice", &["send", &to, "exactly once", "--id", "job-7"]);
    assert!(!out.ok(), "the answer was lost: {out:?}");
    let addr = a.peer_addr().unwrap();
    let status = a.wait_exit().unwrap();
    assert!(!status.success(), "the daemon died: {status:?}");
    // Restarted: the message was committed before the daemon died...
    let a = DaemonProcess::start(Path::new(MESH), &a_data, addr).unwrap();
    let journal = ok(a.mesh(&["events", "--json"]).unwrap());
    assert_eq!(journal.lines().count(), 1, "committed once: {journal}");
    // ...and the retry gets the first send's answer.
    let retried = ok(as_agent(
        &a,
        "alice",
        &["send", &to, "exactly once", "--id", "job-7", "--json"],
    ));
    let id = parse_json(&retried).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let again = ok(as_agent(
        &a,
        "alice",
        &["send", &to, "exactly once", "--id", "job-7"],
    ));
    assert_eq!(again.trim(), id);
    // Another message under the same id is refused.
    let out = as_agent(
        &a,
        "alice",
        &["send", &to, "something else", "--id", "job-7"],
    );
    refused(&out, 3, &["client_id_reused"]);
    wait_state(&a, &id, "delivered");
    let got = inbox_now(&b, "bob");
    assert_eq!(got.len(), 1, "delivered once: {got:?}");
    assert_eq!(got[0]["id"], id.as_str());
    assert_eq!(got[0]["body"], "exactly once");
}

#[test]
fn agent_commands_without_an_agent_or_against_a_stopped_daemon_say_what_is_wrong() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let out = a.mesh(&["inbox"]).unwrap();
    refused(&out, 2, &["--agent NAME"]);
    let out = a.mesh(&["agent", "add", "Bad_Name"]).unwrap();
    refused(&out, 3, &["bad agent name"]);
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    let out = a.mesh(&["agent", "add", "alice"]).unwrap();
    refused(&out, 3, &["agent_exists"]);
    let list = ok(a.mesh(&["agent", "list"]).unwrap());
    assert!(list.starts_with("alice  "), "{list}");
    ok(a.mesh(&["agent", "remove", "alice"]).unwrap());
    let out = as_agent(&a, "alice", &["inbox"]);
    refused(&out, 3, &["no agent alice"]);
    // An agent with entries it never read is removed only with --force;
    // once it read them, without.
    ok(a.mesh(&["agent", "add", "carol"]).unwrap());
    ok(a.mesh(&["agent", "add", "dave"]).unwrap());
    let carol = format!("carol@{}", a.node());
    let dave = format!("dave@{}", a.node());
    for to in [&carol, &dave] {
        ok(as_agent(&a, "carol", &["send", to, "for you"]));
    }
    let out = a.mesh(&["agent", "remove", "carol"]).unwrap();
    refused(&out, 3, &["unread_entries", "1 inbox entry", "--force"]);
    assert_eq!(inbox_now(&a, "carol").len(), 1, "nothing removed");
    ok(a.mesh(&["agent", "remove", "carol"]).unwrap());
    let out = a.mesh(&["agent", "remove", "dave"]).unwrap();
    refused(&out, 3, &["unread_entries"]);
    ok(a.mesh(&["agent", "remove", "dave", "--force"]).unwrap());
    let data = a.data().to_str().unwrap().to_owned();
    drop(a);
    let out = run(Path::new(MESH), &["--data", &data, "agents"], None).unwrap();
    refused(&out, 6, &["not running"]);
}

#[test]
fn an_inbox_subscription_streams_only_its_agents_entries_and_a_named_cursor_survives_a_restart() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    for agent in ["alice", "bob", "carol"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bob_sock = a.data().join("agents/bob.sock");
    let bob = mesh_api::client::Client::for_agent(&bob_sock, "bob");
    let mut sse = rt
        .block_on(bob.subscribe("/v1/agents/bob/subscribe"))
        .unwrap();
    // Agents of one node: delivered in the commit that writes them.
    let me = a.node().to_owned();
    for (to, body) in [("bob", "one"), ("carol", "not bob's"), ("bob", "two")] {
        ok(as_agent(
            &a,
            "alice",
            &["send", &format!("{to}@{me}"), body],
        ));
    }
    let mut got: Vec<mesh_api::InboxEntry> = Vec::new();
    while got.len() < 2 {
        let ev = rt
            .block_on(async { tokio::time::timeout(SETTLE, sse.next()).await })
            .expect("an event in time")
            .unwrap()
            .expect("the stream goes on");
        if ev.event == "entry" {
            got.push(serde_json::from_str(&ev.data).unwrap());
        }
    }
    let bodies: Vec<&str> = got.iter().map(|e| e.body.as_str()).collect();
    assert_eq!(bodies, ["one", "two"]);
    drop(sse);
    // A named cursor of bob's, kept across a restart.
    let body = serde_json::json!({ "cursor": got[0].cursor });
    let put: serde_json::Value = rt
        .block_on(bob.put("/v1/agents/bob/cursors/main", &body))
        .unwrap();
    assert_eq!(put["cursor"], got[0].cursor.as_str());
    let (data, addr) = (a.data().to_owned(), a.peer_addr().unwrap());
    a.terminate().unwrap();
    let a = DaemonProcess::start(Path::new(MESH), &data, addr).unwrap();
    let bob = mesh_api::client::Client::for_agent(&bob_sock, "bob");
    let kept: serde_json::Value = rt.block_on(bob.get("/v1/agents/bob/cursors/main")).unwrap();
    assert_eq!(kept["cursor"], got[0].cursor.as_str());
    let (rest, _) = inbox(&a, "bob", kept["cursor"].as_str(), 10);
    let rest: Vec<&str> = rest.iter().map(|e| e["body"].as_str().unwrap()).collect();
    assert_eq!(rest, ["two"]);
    // Removing an agent ends its waits at once.
    let (mut waiting, _lines) = a
        .spawn_mesh(&[
            "--agent",
            "alice",
            "inbox",
            "--wait",
            "600",
            "--after",
            &got[1].cursor,
        ])
        .unwrap();
    wait_metric(&a, "mesh_api_inbox_waits", 1);
    ok(a.mesh(&["agent", "remove", "alice"]).unwrap());
    assert!(waiting.wait().unwrap().success());
    wait_metric(&a, "mesh_api_inbox_waits", 0);
}

/// Polls `mesh status` on `d` until its link to `peer` is down.
fn wait_disconnected(d: &DaemonProcess, peer: &str) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let st = parse_json(&ok(d.mesh(&["status", "--json"]).unwrap())).unwrap();
        let up = st["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["node"] == peer && p["connected"] == true);
        if !up {
            return;
        }
        assert!(Instant::now() < deadline, "still connected to {peer}: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_keyed_status_queued_for_a_paused_peer_is_superseded_and_both_ends_say_so() {
    let tmp = temp_dir().unwrap();
    let (a, b) = pair(tmp.path());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    ok(a.mesh(&["peer", "pause", b.node()]).unwrap());
    wait_disconnected(&a, b.node());

    let send = |body: &str, key: Option<&str>| {
        let mut args = vec!["send", "bob@gpu", body];
        if let Some(k) = key {
            args.extend(["--key", k]);
        }
        let out = as_agent(&a, "alice", &args);
        ok(out).trim().to_owned()
    };
    let busy = send("busy", Some("status"));
    let note = send("a note", None);
    let idle = send("idle", Some("status"));
    // The queued one is superseded at once: it never went out.
    let st = wait_state(&a, &busy, "superseded");
    assert_eq!(st["superseded_by"], idle, "{st}");
    wait_state(&a, &idle, "queued");

    ok(a.mesh(&["peer", "resume", b.node()]).unwrap());
    let got = inbox_first(&b, "bob", 3);
    let kinds: Vec<&str> = got.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["superseded", "message", "message"], "{got:?}");
    assert_eq!(got[0]["id"], busy);
    assert_eq!(got[0]["superseded_by"], idle);
    assert!(
        got[0]["body"].as_str().unwrap().contains("status"),
        "{got:?}"
    );
    assert_eq!(
        (&got[1]["id"], &got[1]["body"]),
        (&note.into(), &"a note".into())
    );
    assert_eq!(
        (&got[2]["id"], &got[2]["body"]),
        (&idle.clone().into(), &"idle".into())
    );
    let st = parse_json(&ok(b.mesh(&["message", &busy, "--json"]).unwrap())).unwrap();
    assert_eq!(
        (&st["state"], &st["superseded_by"]),
        (&"superseded".into(), &idle.clone().into())
    );
    wait_state(&a, &idle, "delivered");
    // The text form says what happened in its place.
    let text = ok(as_agent(&b, "bob", &["inbox"]));
    assert!(text.contains(&format!("SUPERSEDED {busy}")), "{text}");
    wait_metric(&a, "mesh_agent_superseded_total", 1);
    wait_metric(&b, "mesh_agent_tombstones_received_total", 1);

    // A key needs an agent to send as; a bad key is the caller's error.
    let out = a.mesh(&["send", b.node(), "x", "--key", "k"]).unwrap();
    refused(&out, 2, &["--key needs a sending agent"]);
    let out = as_agent(&a, "alice", &["send", "bob@gpu", "x", "--key", "a\u{7}b"]);
    refused(&out, 3, &["supersede key"]);
}

#[test]
fn an_agents_message_evicted_from_a_full_outbox_is_a_loss_in_its_own_inbox() {
    let tmp = temp_dir().unwrap();
    let a_dir = tmp.path().join("a");
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::write(
        a_dir.join("config.toml"),
        "[outbox]\nmax_msgs = 2\non_full = \"evict-oldest\"\n",
    )
    .unwrap();
    let a = start(&a_dir);
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "carol"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    ok(a.mesh(&["peer", "pause", b.node()]).unwrap());
    wait_disconnected(&a, b.node());

    let to_bob = format!("bob@{}", b.node());
    let send = |agent: &str, body: &str| ok(as_agent(&a, agent, &["send", &to_bob, body]));
    let first = send("alice", "one").trim().to_owned();
    let second = send("carol", "two").trim().to_owned();
    // Each later send makes room for itself by giving up the oldest one.
    let third = send("alice", "three").trim().to_owned();
    let fourth = send("alice", "four").trim().to_owned();
    wait_state(&a, &first, "lost");
    wait_state(&a, &second, "lost");
    wait_state(&a, &third, "queued");

    for (agent, seq) in [("alice", 1), ("carol", 2)] {
        let got = inbox_now(&a, agent);
        assert_eq!(got.len(), 1, "{agent}: {got:?}");
        assert_eq!(
            (&got[0]["kind"], &got[0]["reason"], &got[0]["to"]),
            (&"lost".into(), &"outbox_evicted".into(), &b.node().into()),
            "{agent}: {got:?}"
        );
        let says = format!(
            "seqs {seq}..={seq} of this node's stream to {}, yours among them, were given up",
            b.node()
        );
        assert!(got[0]["body"].as_str().unwrap().contains(&says), "{got:?}");
    }
    // The text form says it too.
    let text = ok(as_agent(&a, "alice", &["inbox"]));
    assert!(text.to_lowercase().contains("lost"), "{text}");

    // Bob gets what was kept, and nothing of what was lost.
    ok(a.mesh(&["peer", "resume", b.node()]).unwrap());
    let got = inbox_first(&b, "bob", 2);
    let ids: Vec<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [third.as_str(), fourth.as_str()], "{got:?}");
    wait_state(&a, &fourth, "delivered");
    assert_eq!(inbox_now(&b, "bob").len(), 2);
}

#[test]
fn an_inbox_behind_what_retention_trimmed_is_told_once_and_reads_on_in_order() {
    let tmp = temp_dir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&b_dir).unwrap();
    // The smallest journal bound: 1 MiB.
    std::fs::write(
        b_dir.join("config.toml"),
        "[journal]\nmax_bytes = 1048576\n",
    )
    .unwrap();
    let a = start(&a_dir);
    let b = start(&b_dir);
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["peer", "name", b.node(), "gpu"]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    // 1.5 MiB of messages to bob, so that b's retention takes the first ones.
    const N: usize = 24;
    let pad = "x".repeat(64 << 10);
    let ids: Vec<String> = (0..N)
        .map(|i| {
            let body = format!("m{i:02} {pad}");
            ok(as_agent(&a, "alice", &["send", "bob@gpu", &body]))
                .trim()
                .to_owned()
        })
        .collect();
    wait_state(&a, &ids[N - 1], "delivered");
    let deadline = Instant::now() + SETTLE;
    let first = loop {
        let st = parse_json(&ok(b.mesh(&["status", "--json"]).unwrap())).unwrap();
        let first = st["journal"]["first"].as_u64().unwrap_or(0);
        if first > 1 {
            break first;
        }
        assert!(
            Instant::now() < deadline,
            "b's journal was never trimmed: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let all = inbox_now(&b, "bob");
    assert_eq!(all[0]["kind"], "trimmed", "{:?}", all[0]);
    let body = all[0]["body"].as_str().unwrap();
    assert!(body.contains("arrivals 1..="), "{body}");
    // Then the messages retention left, in order, each once, the last one last.
    let kept: Vec<&str> = all[1..].iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert!(!kept.is_empty() && kept.len() < N, "{} kept", kept.len());
    assert_eq!(kept, ids[N - kept.len()..].to_vec(), "the newest, in order");
    assert!(all[1..].iter().all(|e| e["kind"] == "message"), "{all:?}");
    // A cursor past the trimmed range is not told again.
    let (page, _) = inbox(&b, "bob", Some(all[0]["cursor"].as_str().unwrap()), 100);
    assert_eq!(page.len(), kept.len(), "{page:?}");
    assert!(first > 1);
}

/// The bodies of `agent`'s unread inbox entries on `d` now, and their
/// cursors.
fn unread(d: &DaemonProcess, agent: &str) -> (Vec<String>, Vec<String>) {
    let out = ok(as_agent(d, agent, &["inbox", "--unread", "--json"]));
    out.lines()
        .map(|l| {
            let e = parse_json(l).unwrap();
            let body = e["body"].as_str().unwrap().to_owned();
            (body, e["cursor"].as_str().unwrap().to_owned())
        })
        .unzip()
}

#[test]
fn unread_entries_come_once_per_ack_survive_a_kill_and_a_bad_ack_changes_nothing() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    for agent in ["alice", "bob", "carol"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    let to = format!("bob@{}", a.node());
    for body in ["one", "two"] {
        ok(as_agent(&a, "alice", &["send", &to, body]));
    }
    let (bodies, cursors) = unread(&a, "bob");
    assert_eq!(bodies, ["one", "two"]);
    // Reading does not move the read position.
    assert_eq!(unread(&a, "bob").0, ["one", "two"]);
    let now = ok(as_agent(&a, "bob", &["ack", &cursors[0]]));
    assert_eq!(now.trim(), cursors[0]);
    assert_eq!(unread(&a, "bob").0, ["two"]);
    // Killed (SIGKILL) between a page and its ack: the acked entry stays
    // read, the other comes back as unread.
    let (data, addr) = (a.data().to_owned(), a.peer_addr().unwrap());
    assert_eq!(unread(&a, "bob").0, ["two"]);
    drop(a);
    let a = DaemonProcess::start(Path::new(MESH), &data, addr).unwrap();
    assert_eq!(unread(&a, "bob").0, ["two"]);
    // Refused, changing nothing: a malformed cursor, another node's, one
    // past the head.
    let out = as_agent(&a, "bob", &["ack", "not-a-cursor"]);
    assert!(!out.ok(), "{out:?}");
    let b = start(&tmp.path().join("b"));
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let theirs = as_agent(&b, "bob", &["inbox"]).next_cursor();
    refused(&as_agent(&a, "bob", &["ack", &theirs]), 3, &["cursor"]);
    let mine: mesh_protocol::Cursor = cursors[1].parse().unwrap();
    let node: mesh_protocol::NodeId = a.node().parse().unwrap();
    let arrival = mine.arrival_for(&node, mine.epoch()).unwrap();
    let past = mesh_protocol::Cursor::new(&node, mine.epoch(), arrival + 1000).to_string();
    refused(&as_agent(&a, "bob", &["ack", &past]), 3, &["head"]);
    // And a cursor of another agent's inbox here, past bob's entries: it
    // would mark "two" read unseen.
    let to_carol = format!("carol@{}", a.node());
    ok(as_agent(&a, "alice", &["send", &to_carol, "for carol"]));
    let (_, carols) = unread(&a, "carol");
    refused(
        &as_agent(&a, "bob", &["ack", &carols[0]]),
        3,
        &["not an entry of agent bob's inbox"],
    );
    assert_eq!(unread(&a, "bob").0, ["two"]);
    // Each refusal is counted.
    wait_metric(&a, "mesh_api_agent_acks_refused_total", 4);
    // Read to the end, then an ack back: a no-op, never a jump back.
    ok(as_agent(&a, "bob", &["ack", &cursors[1]]));
    let now = ok(as_agent(&a, "bob", &["ack", &cursors[0]]));
    assert_eq!(now.trim(), cursors[1]);
    assert!(unread(&a, "bob").0.is_empty());
    // Across a restart too, and alice's own position is her own.
    a.terminate().unwrap();
    let a = DaemonProcess::start(Path::new(MESH), &data, addr).unwrap();
    assert!(unread(&a, "bob").0.is_empty());
    ok(as_agent(
        &a,
        "bob",
        &["send", &format!("alice@{}", a.node()), "three"],
    ));
    assert_eq!(unread(&a, "alice").0, ["three"]);
    assert!(unread(&a, "bob").0.is_empty());
}
