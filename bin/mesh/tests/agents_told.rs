//! How an agent is told: a message's thread (`mesh --agent NAME thread
//! ID`) read from both ends of a conversation across two nodes, and the
//! Claude Code hook (`inbox --unread --hook claude`) through real `mesh
//! daemon` processes, each command its own process.
//!
//! Every wait is on an event (`--wait` on the inbox, a message's state)
//! and bounded.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::time::Duration;

use mesh_tests::daemon::{DaemonProcess, Output, ok, parse_json, temp_dir};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// How long a message may take to reach the other node's inbox.
const ARRIVAL_SECS: &str = "30";
/// How long a state the test waits for may take (polled through the CLI).
const SETTLE: Duration = Duration::from_secs(60);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

/// `mesh --agent AGENT ...` against `d`, with `stdin`.
fn as_agent_stdin(d: &DaemonProcess, agent: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut all = vec!["--agent", agent];
    all.extend_from_slice(args);
    d.mesh_stdin(&all, stdin).unwrap()
}

/// `mesh --agent AGENT ...` against `d`.
fn as_agent(d: &DaemonProcess, agent: &str, args: &[&str]) -> Output {
    as_agent_stdin(d, agent, args, None)
}

/// Waits (at most [`ARRIVAL_SECS`]) for the message `id` in `agent`'s
/// inbox after `after`; answers the cursor past it.
fn wait_for(d: &DaemonProcess, agent: &str, id: &str, after: Option<&str>) -> String {
    let mut after = after.map(str::to_owned);
    loop {
        let mut args = vec!["inbox", "--json", "--wait", ARRIVAL_SECS];
        if let Some(a) = &after {
            args.extend(["--after", a]);
        }
        let out = as_agent(d, agent, &args);
        assert!(out.ok(), "{out:?}");
        let entries: Vec<_> = out.stdout.lines().map(|l| parse_json(l).unwrap()).collect();
        assert!(!entries.is_empty(), "{id} did not reach {agent}");
        if let Some(e) = entries.iter().find(|e| e["id"] == id) {
            return e["cursor"].as_str().unwrap().to_owned();
        }
        after = Some(out.next_cursor());
    }
}

/// `mesh --agent AGENT thread ID --json`, parsed.
fn thread(d: &DaemonProcess, agent: &str, id: &str) -> serde_json::Value {
    parse_json(&ok(as_agent(d, agent, &["thread", id, "--json"]))).unwrap()
}

/// Each entry's `field`, as text.
fn column(t: &serde_json::Value, field: &str) -> Vec<String> {
    t["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| match &e[field] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

#[test]
fn a_three_message_thread_across_two_nodes_reads_in_order_with_states_from_both_ends() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "carol"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let bob = format!("bob@{}", b.node());
    let alice = format!("alice@{}", a.node());

    // alice asks, bob answers, alice answers the answer.
    let ask = ok(as_agent(&a, "alice", &["send", &bob, "which port?"]));
    let ask = ask.trim();
    let at_bob = wait_for(&b, "bob", ask, None);
    let answer = ok(as_agent(&b, "bob", &["reply", ask, "port 7000"]));
    let answer = answer.trim();
    wait_for(&a, "alice", answer, None);
    let thanks = ok(as_agent(&a, "alice", &["reply", answer, "thanks"]));
    let thanks = thanks.trim();
    wait_for(&b, "bob", thanks, Some(&at_bob));
    for id in [ask, thanks] {
        a.wait_message_state(id, "delivered", SETTLE);
    }
    b.wait_message_state(answer, "delivered", SETTLE);

    // From alice's end: in arrival order, each a level deeper.
    let t = thread(&a, "alice", ask);
    assert_eq!(t["id"], ask);
    assert_eq!(t["truncated"], false, "{t}");
    assert_eq!(column(&t, "id"), [ask, answer, thanks], "{t}");
    assert_eq!(column(&t, "dir"), ["sent", "received", "sent"]);
    assert_eq!(column(&t, "state"), ["delivered", "received", "delivered"]);
    assert_eq!(column(&t, "depth"), ["0", "1", "2"]);
    assert_eq!(column(&t, "body"), ["which port?", "port 7000", "thanks"]);
    assert_eq!(column(&t, "from"), [alice.as_str(), &bob, &alice]);
    assert_eq!(column(&t, "to"), [bob.as_str(), &alice, &bob]);
    assert_eq!(column(&t, "in_reply_to"), ["null", ask, answer]);
    let arrivals: Vec<u64> = column(&t, "arrival")
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    assert!(arrivals.is_sorted(), "{arrivals:?}");

    // From bob's end: the same three, his own as sent.
    let t = thread(&b, "bob", ask);
    assert_eq!(column(&t, "id"), [ask, answer, thanks], "{t}");
    assert_eq!(column(&t, "state"), ["received", "delivered", "received"]);
    assert_eq!(column(&t, "depth"), ["0", "1", "2"]);

    // Asked from the middle: what it answers comes first.
    let t = thread(&b, "bob", answer);
    assert_eq!(column(&t, "id"), [ask, answer, thanks], "{t}");
    assert_eq!(column(&t, "depth"), ["0", "1", "2"]);

    // The text: one line per message, indented by depth, with its state.
    let text = ok(as_agent(&a, "alice", &["thread", ask]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for (line, (id, state, indent)) in lines.iter().zip([
        (ask, "delivered", "*"),
        (answer, "received", "   "),
        (thanks, "delivered", "     "),
    ]) {
        assert!(line.contains(&format!("{indent}{id} ")), "{line:?}");
        assert!(line.contains(&format!(" {state}: ")), "{line:?}");
    }

    // An id no node sent, one not of this agent, and one that is no id.
    let unknown = "0".repeat(32);
    let out = as_agent(&a, "alice", &["thread", &unknown]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        out.stderr.contains(&format!("no message {unknown}")),
        "{out:?}"
    );
    let out = as_agent(&a, "carol", &["thread", ask]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(
        out.stderr.contains("agent carol neither sent nor received"),
        "{out:?}"
    );
    let out = as_agent(&a, "alice", &["thread", "not-an-id"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        out.stderr.contains("not-an-id") || out.stderr.contains("id"),
        "{out:?}"
    );
}

/// The cursors and bodies of `agent`'s unread entries on `d`.
fn unread(d: &DaemonProcess, agent: &str) -> Vec<(String, String)> {
    ok(as_agent(d, agent, &["inbox", "--unread", "--json"]))
        .lines()
        .map(|l| {
            let e = parse_json(l).unwrap();
            (
                e["cursor"].as_str().unwrap().to_owned(),
                e["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The Claude Code hook of `agent` on `d` for `event` (`None`: from the
/// stdin JSON), with `stdin`.
fn hook(d: &DaemonProcess, agent: &str, event: Option<&str>, stdin: Option<&str>) -> Output {
    let mut args = vec!["inbox", "--unread", "--hook", "claude"];
    if let Some(e) = event {
        args.extend(["--event", e]);
    }
    as_agent_stdin(d, agent, &args, stdin)
}

#[test]
fn the_claude_hook_tells_of_unread_mail_until_it_is_acked_and_never_blocks_twice() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "bob"]).unwrap());
    let alice = format!("alice@{}", a.node());
    let id = ok(as_agent(
        &a,
        "bob",
        &["send", &alice, "please review PR 12"],
    ));
    let id = id.trim();
    let waiting = unread(&a, "alice");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let cursor = &waiting[0].0;

    // UserPromptSubmit: the mail goes into the prompt's context.
    let out = hook(&a, "alice", Some("user-prompt-submit"), None);
    assert!(out.ok(), "{out:?}");
    let answer = parse_json(out.stdout.trim()).unwrap();
    let specific = &answer["hookSpecificOutput"];
    assert_eq!(specific["hookEventName"], "UserPromptSubmit", "{answer}");
    let context = specific["additionalContext"].as_str().unwrap();
    for want in [
        "please review PR 12",
        cursor.as_str(),
        id,
        "from: bob@",
        "mesh --agent alice ack CURSOR",
    ] {
        assert!(context.contains(want), "no {want:?} in {context}");
    }
    // The event from the hook's own JSON, with the fields Claude Code adds.
    let out = hook(
        &a,
        "alice",
        None,
        Some(
            r#"{"session_id":"s1","cwd":"/tmp","hook_event_name":"UserPromptSubmit","prompt":"hi"}"#,
        ),
    );
    let answer = parse_json(ok(out).trim()).unwrap();
    assert_eq!(
        answer["hookSpecificOutput"]["hookEventName"],
        "UserPromptSubmit"
    );

    // Stop: the turn does not end with mail waiting, once.
    let out = hook(&a, "alice", Some("stop"), None);
    let answer = parse_json(ok(out).trim()).unwrap();
    assert_eq!(answer["decision"], "block", "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains(cursor.as_str()));
    let out = hook(
        &a,
        "alice",
        None,
        Some(r#"{"hook_event_name":"Stop","stop_hook_active":true}"#),
    );
    assert!(out.ok(), "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
    // Reading acked nothing.
    assert_eq!(unread(&a, "alice").len(), 1);

    // Bad input is a non-blocking error (exit 1, never 2), one line.
    let out = hook(&a, "alice", None, Some("not json"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("not the JSON object"), "{out:?}");
    let out = hook(&a, "alice", None, None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("--event"), "{out:?}");

    // Acked: nothing to say, for either event.
    ok(as_agent(&a, "alice", &["ack", cursor]));
    for event in ["user-prompt-submit", "stop"] {
        let out = hook(&a, "alice", Some(event), None);
        assert!(out.ok(), "{out:?}");
        assert_eq!(out.stdout, "", "{event}: {out:?}");
    }

    // No daemon: exit 1, the reason on stderr, nothing on stdout.
    let data = a.data().to_owned();
    a.terminate().unwrap();
    let d = data.to_str().unwrap();
    let out = mesh_tests::daemon::run(
        Path::new(MESH),
        &[
            "--data", d, "--agent", "alice", "inbox", "--unread", "--hook", "claude", "--event",
            "stop",
        ],
        None,
    )
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(out.stdout, "");
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
}

/// `--hook gemini`: Gemini CLI's BeforeAgent gets the unread mail as
/// additional context, AfterAgent rejects the turn's answer with it (once:
/// not when it already runs as a retry), and with nothing to say the
/// answer is `{}`, the JSON Gemini CLI parses on exit 0.
#[test]
fn the_gemini_hook_tells_of_unread_mail_in_gemini_clis_json_and_says_nothing_once_acked() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "bob"]).unwrap());
    let alice = format!("alice@{}", a.node());
    ok(as_agent(&a, "bob", &["send", &alice, "the build is red"]));
    let waiting = unread(&a, "alice");
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let cursor = &waiting[0].0;
    let gemini = |stdin: &str| {
        let out = as_agent_stdin(
            &a,
            "alice",
            &["inbox", "--unread", "--hook", "gemini"],
            Some(stdin),
        );
        assert!(out.ok(), "{out:?}");
        parse_json(out.stdout.trim()).unwrap()
    };
    let answer = gemini(
        r#"{"session_id":"s","cwd":"/tmp","hook_event_name":"BeforeAgent","timestamp":"2026-12-08T00:00:00Z","prompt":"hi"}"#,
    );
    let specific = &answer["hookSpecificOutput"];
    assert_eq!(specific["hookEventName"], "BeforeAgent", "{answer}");
    let context = specific["additionalContext"].as_str().unwrap();
    assert!(
        context.contains("the build is red") && context.contains(cursor.as_str()),
        "{context}"
    );
    let answer =
        gemini(r#"{"hook_event_name":"AfterAgent","prompt":"hi","prompt_response":"done"}"#);
    assert_eq!(answer["decision"], "deny", "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains(cursor.as_str()));
    let answer = gemini(r#"{"hook_event_name":"AfterAgent","stop_hook_active":true}"#);
    assert_eq!(answer, serde_json::json!({}));
    // Claude Code's events are not Gemini CLI's: a clear error, exit 1.
    let out = as_agent_stdin(
        &a,
        "alice",
        &["inbox", "--unread", "--hook", "gemini"],
        Some(r#"{"hook_event_name":"Stop"}"#),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("BeforeAgent"), "{out:?}");
    ok(as_agent(&a, "alice", &["ack", cursor]));
    for event in ["BeforeAgent", "AfterAgent"] {
        let answer = gemini(&format!(r#"{{"hook_event_name":"{event}"}}"#));
        assert_eq!(answer, serde_json::json!({}), "{event}");
    }
}

/// Each local agent's unread count as `mesh agents --json` and `mesh
/// status --json` give it, by name: (agents', status's).
fn unread_counts(d: &DaemonProcess) -> Vec<(String, u64, u64)> {
    let agents = parse_json(&ok(d.mesh(&["agents", "--json"]).unwrap())).unwrap();
    let status = parse_json(&ok(d.mesh(&["status", "--json"]).unwrap())).unwrap();
    agents["local"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let name = a["name"].as_str().unwrap().to_owned();
            let in_status = status["agents"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name.as_str())
                .unwrap_or_else(|| panic!("{name} is not in the status: {status}"));
            assert_eq!(a["unread"]["more"], false, "{a}");
            (
                name,
                a["unread"]["count"].as_u64().unwrap(),
                in_status["unread"]["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn mesh_agents_and_mesh_status_count_each_local_agents_unread_mail_down_to_its_acks() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "bob"]).unwrap());
    let bob = format!("bob@{}", a.node());
    for text in ["one", "two", "three"] {
        ok(as_agent(&a, "alice", &["send", &bob, text]));
    }
    let counts = |alice: u64, bob: u64| {
        vec![
            ("alice".to_owned(), alice, alice),
            ("bob".to_owned(), bob, bob),
        ]
    };
    assert_eq!(unread_counts(&a), counts(0, 3));
    let agents = ok(a.mesh(&["agents"]).unwrap());
    let line = agents.lines().find(|l| l.contains(&bob)).unwrap();
    assert!(line.contains("3 unread (oldest "), "{agents}");
    let status = ok(a.mesh(&["status"]).unwrap());
    assert!(
        status
            .lines()
            .any(|l| l.trim_start().starts_with("bob") && l.contains("3 unread")),
        "{status}"
    );

    // Acks move the count; one before the position is a no-op.
    let page = ok(as_agent(&a, "bob", &["inbox", "--unread", "--json"]));
    let cursors: Vec<String> = page
        .lines()
        .map(|l| {
            parse_json(l).unwrap()["cursor"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(cursors.len(), 3, "{page}");
    ok(as_agent(&a, "bob", &["ack", &cursors[1]]));
    assert_eq!(unread_counts(&a), counts(0, 1));
    ok(as_agent(&a, "bob", &["ack", &cursors[0]]));
    assert_eq!(unread_counts(&a), counts(0, 1));
    ok(as_agent(&a, "bob", &["ack", &cursors[2]]));
    assert_eq!(unread_counts(&a), counts(0, 0));
    let agents = ok(a.mesh(&["agents"]).unwrap());
    let line = agents.lines().find(|l| l.contains(&bob)).unwrap();
    assert!(line.ends_with("no unread"), "{agents}");
}

/// The counter `name` on `d`'s `GET /metrics` (0 if absent).
fn metric(d: &DaemonProcess, name: &str) -> u64 {
    d.metric(name).unwrap_or(0)
}

/// Polls `d`'s counter `name` until it is `want` (at most [`SETTLE`]).
fn wait_metric(d: &DaemonProcess, name: &str, want: u64) {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let got = metric(d, name);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} is {got}, not {want}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `agent`'s whole inbox on `d` as JSON entries.
fn inbox_all(d: &DaemonProcess, agent: &str) -> Vec<serde_json::Value> {
    let out = ok(as_agent(d, agent, &["inbox", "--json", "--limit", "1000"]));
    out.lines().map(|l| parse_json(l).unwrap()).collect()
}

/// The `read` entries of `agent`'s inbox on `d`.
fn reads(d: &DaemonProcess, agent: &str) -> Vec<serde_json::Value> {
    inbox_all(d, agent)
        .into_iter()
        .filter(|e| e["kind"] == "read")
        .collect()
}

/// Writes `d`'s data dir `config.toml` with `[agents] read_receipts`.
fn receipts_config(data: &Path, on: bool) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!("[agents]\nread_receipts = {on}\n"),
    )
    .unwrap();
}

/// alice@a and bob@b, each node the other's peer.
fn alice_and_bob(a: &DaemonProcess, b: &DaemonProcess) -> (String, String) {
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    (format!("alice@{}", a.node()), format!("bob@{}", b.node()))
}

#[test]
fn a_message_sent_with_receipt_reads_as_read_once_bob_acks_and_acking_the_receipt_sends_nothing() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    let (alice, bob) = alice_and_bob(&a, &b);
    let asked = ok(as_agent(
        &a,
        "alice",
        &["send", "--receipt", &bob, "read me"],
    ));
    let asked = asked.trim();
    let plain = ok(as_agent(&a, "alice", &["send", &bob, "no receipt"]));
    let plain = plain.trim();
    let first = wait_for(&b, "bob", asked, None);
    let past = wait_for(&b, "bob", plain, Some(&first));
    a.wait_message_state(plain, "delivered", SETTLE);
    assert!(reads(&a, "alice").is_empty(), "nothing read yet");
    ok(as_agent(&b, "bob", &["ack", &past]));

    let st = a.wait_message_state(asked, "read", SETTLE);
    assert_eq!(st["read_by"], bob.as_str(), "{st}");
    assert!(st["read_ms"].as_u64().is_some_and(|ms| ms > 0), "{st}");
    let text = ok(a.mesh(&["message", asked]).unwrap());
    assert!(text.contains("read") && text.contains(&bob), "{text}");
    let got = reads(&a, "alice");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["from"], bob.as_str());
    assert_eq!(got[0]["to"], alice.as_str());
    assert_eq!(got[0]["ids"], serde_json::json!([asked]), "only what asked");
    let line = ok(as_agent(&a, "alice", &["inbox"]));
    assert!(
        line.contains("READ by bob@") && line.contains(asked),
        "{line}"
    );
    // Asked nothing: acked, but never read as far as alice can tell.
    assert_eq!(
        a.wait_message_state(plain, "delivered", SETTLE)["state"],
        "delivered"
    );
    wait_metric(&b, "mesh_agent_receipts_sent_total", 1);
    wait_metric(&a, "mesh_agent_receipts_received_total", 1);

    // alice acks the read entry, then reads and acks a message of bob's
    // that asks a receipt: the pump takes her inbox in order, so had the
    // read entry asked one, b would hear of two.
    ok(as_agent(
        &a,
        "alice",
        &["ack", got[0]["cursor"].as_str().unwrap()],
    ));
    let back = ok(as_agent(
        &b,
        "bob",
        &["send", "--receipt", &alice, "and you?"],
    ));
    let back = back.trim();
    let at_alice = wait_for(&a, "alice", back, Some(got[0]["cursor"].as_str().unwrap()));
    ok(as_agent(&a, "alice", &["ack", &at_alice]));
    b.wait_message_state(back, "read", SETTLE);
    assert_eq!(metric(&a, "mesh_agent_receipts_sent_total"), 1);
    assert_eq!(metric(&b, "mesh_agent_receipts_received_total"), 1);
    assert_eq!(metric(&b, "mesh_agent_receipts_refused_total"), 0);
    assert_eq!(metric(&a, "mesh_agent_receipts_refused_total"), 0);
    // A receipt is asked only of a message to an agent of another node.
    let out = as_agent(&a, "alice", &["send", "--receipt", b.node(), "to the node"]);
    assert!(
        !out.ok() && out.stderr.contains("recipient agent"),
        "{out:?}"
    );
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn a_receipt_not_sent_before_the_readers_node_was_killed_arrives_after_its_restart_once() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b_dir = tmp.path().join("b");
    // b's pump is off: bob's ack commits, and no receipt can go out.
    receipts_config(&b_dir, false);
    let b = start(&b_dir);
    let (alice, bob) = alice_and_bob(&a, &b);
    let asked = ok(as_agent(
        &a,
        "alice",
        &["send", "--receipt", &bob, "read me"],
    ));
    let asked = asked.trim();
    let past = wait_for(&b, "bob", asked, None);
    ok(as_agent(&b, "bob", &["ack", &past]));
    a.wait_message_state(asked, "delivered", SETTLE);
    assert_eq!(metric(&b, "mesh_agent_receipts_sent_total"), 0);
    // kill -9, then start it again with receipts on: its pump finds the
    // ack past its own durable cursor and sends the receipt.
    let addr = b.peer_addr().unwrap();
    drop(b);
    receipts_config(&b_dir, true);
    let b = DaemonProcess::start(Path::new(MESH), &b_dir, addr).unwrap();
    let st = a.wait_message_state(asked, "read", SETTLE);
    assert_eq!(st["read_by"], bob.as_str(), "{st}");
    wait_metric(&b, "mesh_agent_receipts_sent_total", 1);
    // Killed again and restarted: the cursor moved past it, nothing goes
    // twice. A second receipt-asking message is the barrier: its receipt
    // comes after anything the pump had left to send.
    drop(b);
    let b = DaemonProcess::start(Path::new(MESH), &b_dir, addr).unwrap();
    let again = ok(as_agent(
        &a,
        "alice",
        &["send", "--receipt", &bob, "and this"],
    ));
    let again = again.trim();
    let past = wait_for(&b, "bob", again, Some(&past));
    ok(as_agent(&b, "bob", &["ack", &past]));
    a.wait_message_state(again, "read", SETTLE);
    let got = reads(&a, "alice");
    assert_eq!(got.len(), 2, "one read entry per receipt: {got:?}");
    assert_eq!(got[0]["ids"], serde_json::json!([asked]));
    assert_eq!(got[1]["ids"], serde_json::json!([again]));
    assert_eq!(metric(&a, "mesh_agent_receipts_refused_total"), 0);
    assert_eq!(metric(&a, "mesh_agent_receipts_received_total"), 2);
    let _ = alice;
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn a_reader_killed_between_a_receipts_commit_and_its_cursor_sends_it_once_after_the_restart() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b_dir = tmp.path().join("b");
    // The test-only fault hook: b's daemon aborts right after a receipt
    // is committed, before its pump's cursor moves past it.
    let b = DaemonProcess::start_with_env(
        Path::new(MESH),
        &b_dir,
        mesh_tests::daemon::loopback(),
        &[("MESH_FAULT_ABORT_AFTER_RECEIPT", "1")],
    )
    .unwrap();
    let (_, bob) = alice_and_bob(&a, &b);
    let asked = ok(as_agent(
        &a,
        "alice",
        &["send", "--receipt", &bob, "read me"],
    ));
    let asked = asked.trim();
    let past = wait_for(&b, "bob", asked, None);
    let addr = b.peer_addr().unwrap();
    ok(as_agent(&b, "bob", &["ack", &past]));
    let status = b.wait_exit().unwrap();
    assert!(!status.success(), "the daemon died: {status:?}");
    // Restarted: the pump builds the same receipt again; its client id
    // finds the first send, committed before the crash, and nothing more
    // is sent (the outbox sends the first).
    let b = DaemonProcess::start(Path::new(MESH), &b_dir, addr).unwrap();
    let st = a.wait_message_state(asked, "read", SETTLE);
    assert_eq!(st["read_by"], bob.as_str(), "{st}");
    let again = ok(as_agent(
        &a,
        "alice",
        &["send", "--receipt", &bob, "and this"],
    ));
    let again = again.trim();
    let past = wait_for(&b, "bob", again, Some(&past));
    ok(as_agent(&b, "bob", &["ack", &past]));
    a.wait_message_state(again, "read", SETTLE);
    assert_eq!(
        metric(&b, "mesh_agent_receipts_sent_total"),
        1,
        "after the restart only the second receipt was sent"
    );
    let got = reads(&a, "alice");
    assert_eq!(got.len(), 2, "one read entry per receipt: {got:?}");
    assert_eq!(got[0]["ids"], serde_json::json!([asked]));
    assert_eq!(metric(&a, "mesh_agent_receipts_refused_total"), 0);
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn a_receipt_between_two_agents_of_one_node_marks_the_message_read_there() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "carol"]).unwrap());
    let carol = format!("carol@{}", a.node());
    let asked = ok(as_agent(
        &a,
        "alice",
        &["send", "--receipt", &carol, "read me"],
    ));
    let asked = asked.trim();
    assert_eq!(
        a.wait_message_state(asked, "delivered", SETTLE)["state"],
        "delivered"
    );
    let past = wait_for(&a, "carol", asked, None);
    ok(as_agent(&a, "carol", &["ack", &past]));
    let st = a.wait_message_state(asked, "read", SETTLE);
    assert_eq!(st["read_by"], carol.as_str(), "{st}");
    let got = reads(&a, "alice");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["ids"], serde_json::json!([asked]));
    assert_eq!(got[0]["from"], carol.as_str());
    assert!(reads(&a, "carol").is_empty(), "the reader is told nothing");
    assert_eq!(metric(&a, "mesh_agent_receipts_sent_total"), 1);
    // alice acks it: nothing more goes (the pump takes her inbox in
    // order; a later receipt of carol's is the barrier).
    ok(as_agent(
        &a,
        "alice",
        &["ack", got[0]["cursor"].as_str().unwrap()],
    ));
    let alice = format!("alice@{}", a.node());
    let back = ok(as_agent(
        &a,
        "carol",
        &["send", "--receipt", &alice, "you too"],
    ));
    let back = back.trim();
    let at = wait_for(&a, "alice", back, Some(got[0]["cursor"].as_str().unwrap()));
    ok(as_agent(&a, "alice", &["ack", &at]));
    a.wait_message_state(back, "read", SETTLE);
    assert_eq!(metric(&a, "mesh_agent_receipts_sent_total"), 2);
    assert!(a.terminate().unwrap().success());
}
