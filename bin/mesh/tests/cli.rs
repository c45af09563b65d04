//! The `mesh` CLI against real `mesh daemon` processes, each command its own
//! process, exactly as a person or a script runs them.
//!
//! Waits are on events (a daemon's ticket line, a line from `mesh tail`),
//! each bounded; see `mesh_tests::daemon`.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::time::{Duration, Instant};

use mesh_api::Fault;
use mesh_tests::daemon::{
    DaemonProcess, Output, assert_says, ok, parse_json, run, run_command, run_command_as_is,
    temp_dir,
};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// How long `mesh tail` may take to show what was sent.
const TAIL_TIMEOUT: Duration = Duration::from_secs(30);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

#[track_caller]
fn fails_saying(out: Output, words: &[&str]) {
    assert!(!out.ok(), "succeeded: {out:?}");
    assert_says(&out, words);
}

#[test]
fn two_daemons_linked_with_ticket_and_peer_add_send_tail_and_page_events() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));

    // `mesh id` and `mesh ticket` print the value alone.
    assert_eq!(ok(a.mesh(&["id"]).unwrap()), format!("{}\n", a.node()));
    let b_ticket = ok(b.mesh(&["ticket"]).unwrap());
    assert_eq!(b_ticket.lines().count(), 1, "{b_ticket}");
    let a_ticket = ok(a.mesh(&["ticket"]).unwrap());
    let added = ok(a.mesh(&["peer", "add", b_ticket.trim()]).unwrap());
    assert_eq!(added, format!("added peer {}\n", b.node()));
    ok(b.mesh(&["peer", "add", a_ticket.trim()]).unwrap());

    let (mut tail, lines) = b.spawn_mesh(&["tail"]).unwrap();

    // `mesh send` prints the seq once committed.
    assert_eq!(ok(a.mesh(&["send", b.node(), "hello b"]).unwrap()), "1\n");
    assert_eq!(ok(a.mesh(&["send", b.node(), "again"]).unwrap()), "2\n");
    let out = a
        .mesh_stdin(&["send", b.node(), "-", "--lines"], Some("x\ny\nz\n"))
        .unwrap();
    assert_eq!(ok(out), "3\n4\n5\n");
    let out = a
        .mesh_stdin(&["send", b.node(), "-", "--json"], Some("whole\nstdin"))
        .unwrap();
    let sent = parse_json(&ok(out)).unwrap();
    assert_eq!(sent["seq"], 6);
    assert_eq!(sent["stream"]["author"], a.node());

    // b's `mesh tail` shows them as they arrive, in order.
    let short: String = a.node().chars().take(10).collect();
    let deadline = Instant::now() + TAIL_TIMEOUT;
    let mut shown = Vec::new();
    while shown.len() < 6 {
        let line = lines.next_until(deadline).unwrap().expect("tail ended");
        shown.push(line);
    }
    let want = ["hello b", "again", "x", "y", "z", "whole\nstdin"];
    for (i, (line, body)) in shown.iter().zip(want).enumerate() {
        let expect = format!("from {short} #{}: {}", i + 1, body.lines().next().unwrap());
        assert!(line.contains(&expect), "{line:?} lacks {expect:?}");
    }
    let _ = tail.kill();
    let _ = tail.wait();

    // `mesh events` prints a page, then `next: CURSOR` on stderr; `--after`
    // goes on from there.
    let out = b.mesh(&["events", "--limit", "2"]).unwrap();
    assert!(out.ok(), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 2, "{out:?}");
    assert!(out.stdout.contains("#1: hello b"), "{out:?}");
    let next = out.next_cursor();
    let out = b.mesh(&["events", "--after", &next, "--json"]).unwrap();
    assert!(out.ok(), "{out:?}");
    let seqs: Vec<u64> = out
        .stdout
        .lines()
        .map(|l| parse_json(l).unwrap()["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4, 5, 6]);
    assert!(out.stderr.starts_with("next: "), "{out:?}");
    // A cursor of another node is refused, saying why.
    let out = a.mesh(&["events", "--after", &next]).unwrap();
    fails_saying(out, &["only valid on the node that issued them", "409"]);

    // `--json` output parses.
    let st = parse_json(&ok(a.mesh(&["status", "--json"]).unwrap())).unwrap();
    assert_eq!(st["node"], a.node());
    assert_eq!(st["peers"][0]["node"], b.node());
    let peers = parse_json(&ok(a.mesh(&["peer", "list", "--json"]).unwrap())).unwrap();
    assert_eq!(peers["peers"][0]["node"], b.node());
    let text = ok(a.mesh(&["peer", "list"]).unwrap());
    let b_name = parse_json(&ok(b.mesh(&["status", "--json"]).unwrap())).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.starts_with(&format!("  {}  {b_name:12}  connected", b.node())),
        "{text}"
    );
    let text = ok(a.mesh(&["status"]).unwrap());
    assert!(
        text.starts_with(&format!("node    {}\n", a.node())),
        "{text}"
    );

    // Failures exit non-zero with the reason, and print no seq.
    let stranger = start(&tmp.path().join("stranger"));
    let out = a.mesh(&["send", stranger.node(), "hi"]).unwrap();
    assert!(
        !out.stderr.contains("of 1"),
        "a single send has no batch note: {out:?}"
    );
    fails_saying(out, &["unknown peer", stranger.node(), "mesh peer add"]);
    let out = a.mesh(&["send", "not-a-node-id", "hi"]).unwrap();
    fails_saying(out, &["not a node id"]);
    let out = a.mesh(&["peer", "add", "meshnode1bogus"]).unwrap();
    fails_saying(out, &["400"]);
    // A second daemon on the same data dir is refused.
    let data = a.data().to_str().unwrap();
    let out = run(
        Path::new(MESH),
        &["daemon", "--data", data, "--bind", "127.0.0.1:0"],
        None,
    )
    .unwrap();
    assert!(!out.ok(), "a second daemon started: {out:?}");
    assert!(out.stderr.to_lowercase().contains("already"), "{out:?}");

    // SIGTERM stops a daemon cleanly: exit 0, socket removed.
    let socket = a.socket();
    for d in [a, b, stranger] {
        let status = d.terminate().unwrap();
        assert!(status.success(), "{status}");
    }
    assert!(!socket.exists());
}

#[test]
fn mesh_send_says_the_outbox_is_full_when_the_peer_is_offline() {
    let tmp = temp_dir().unwrap();
    let a_dir = tmp.path().join("a");
    std::fs::create_dir(&a_dir).unwrap();
    std::fs::write(a_dir.join("config.toml"), "[outbox]\nmax_msgs = 1\n").unwrap();
    let a = start(&a_dir);
    let b = start(&tmp.path().join("b"));
    let (b_id, b_ticket) = (b.node().to_owned(), b.ticket().to_owned());
    assert!(b.terminate().unwrap().success());
    ok(a.mesh(&["peer", "add", &b_ticket]).unwrap());
    assert_eq!(ok(a.mesh(&["send", &b_id, "one"]).unwrap()), "1\n");
    let out = a.mesh(&["send", &b_id, "two"]).unwrap();
    assert_eq!(
        out.status.code(),
        Some(i32::from(Fault::Capacity.exit_code())),
        "{out:?}"
    );
    fails_saying(out, &["outbox", "429"]);
    let out = a
        .mesh_stdin(&["send", &b_id, "-", "--lines"], Some("three\n"))
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(i32::from(Fault::Capacity.exit_code())),
        "{out:?}"
    );
    fails_saying(out, &["outbox", "429"]);
    assert!(a.terminate().unwrap().success());
}

#[test]
fn mesh_peer_pause_and_resume_show_in_the_peer_list_and_an_unknown_peer_is_an_error() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    let out = ok(a.mesh(&["peer", "pause", b.node()]).unwrap());
    assert!(
        out.starts_with(&format!("paused peer {}: ", b.node())) && out.contains("restart"),
        "{out}"
    );
    let text = ok(a.mesh(&["peer", "list"]).unwrap());
    let line = text.lines().next().unwrap_or_default();
    assert!(
        line.starts_with(&format!("  {}  ", b.node())) && line.contains(" paused "),
        "{text}"
    );
    let st = parse_json(&ok(a.mesh(&["status", "--json"]).unwrap())).unwrap();
    assert_eq!(st["peers"][0]["paused"], true, "{st}");
    // Sends are accepted while paused.
    assert_eq!(ok(a.mesh(&["send", b.node(), "queued"]).unwrap()), "1\n");
    let p = parse_json(&ok(a
        .mesh(&["peer", "resume", b.node(), "--json"])
        .unwrap()))
    .unwrap();
    assert_eq!(
        (&p["node"], &p["paused"]),
        (&b.node().into(), &false.into())
    );

    let stranger = "0".repeat(64);
    for verb in ["pause", "resume"] {
        let out = a.mesh(&["peer", verb, &stranger]).unwrap();
        fails_saying(out, &["unknown peer", &stranger, "mesh peer add", "404"]);
    }
    let out = a.mesh(&["peer", "pause", "not-a-node-id"]).unwrap();
    fails_saying(out, &["not a node id"]);
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}

#[test]
fn every_client_command_without_a_daemon_says_so_in_one_line_naming_the_socket() {
    let tmp = temp_dir().unwrap();
    let data = tmp.path().join("nobody-home");
    let socket = data.join("mesh.sock");
    let socket = socket.to_str().unwrap();
    let data = data.to_str().unwrap();
    let id = "0000000000000000000000000000000000000000000000000000000000000000";
    let commands: &[&[&str]] = &[
        &["status"],
        &["status", "--json"],
        &["id"],
        &["ticket"],
        &["peer", "add", "meshnode1x"],
        &["peer", "list"],
        &["peer", "list", "--json"],
        &["peer", "remove", id],
        &["peer", "pause", id],
        &["peer", "resume", id, "--json"],
        &["send", id, "hi"],
        &["events"],
        &["events", "--json"],
        &["tail"],
    ];
    for cmd in commands {
        let mut args = vec!["--data", data];
        args.extend_from_slice(cmd);
        let out = run(Path::new(MESH), &args, None).unwrap();
        assert!(!out.ok(), "{cmd:?} succeeded: {out:?}");
        assert_eq!(out.stderr.trim_end().lines().count(), 1, "{cmd:?}: {out:?}");
        assert!(
            out.stderr.contains("not running") && out.stderr.contains(socket),
            "{cmd:?}: {out:?}"
        );
        assert!(out.stdout.is_empty(), "{cmd:?}: {out:?}");
    }
    // MESH_DATA picks the node when --data is absent.
    let mut cmd = std::process::Command::new(MESH);
    cmd.arg("status").env("MESH_DATA", data);
    let out = run_command(cmd, None).unwrap();
    assert!(!out.ok() && out.stderr.contains(socket), "{out:?}");
}

#[test]
fn a_user_error_is_one_line_without_a_backtrace_and_exits_with_its_fault_class() {
    let tmp = temp_dir().unwrap();
    let a_dir = tmp.path().join("a");
    let a = start(&a_dir);
    let data = a_dir.to_str().unwrap();
    let stranger = "0".repeat(64);
    let cases: [(&[&str], &[&str], Fault); 4] = [
        (
            &["send", "nothing", "x"],
            &["\"nothing\" is not a node id"],
            Fault::Caller,
        ),
        // A path segment is escaped: the id reaches the daemon whole.
        (
            &["peer", "pause", "a/b c"],
            &["\"a/b c\" is not a node id"],
            Fault::Caller,
        ),
        (
            &["send", &stranger, "x"],
            &["unknown peer", "mesh peer add"],
            Fault::NotFound,
        ),
        (
            &["peer", "remove", &stranger],
            &["unknown peer"],
            Fault::NotFound,
        ),
    ];
    for (args, words, fault) in cases {
        let mut cmd = std::process::Command::new(MESH);
        cmd.arg("--data").arg(data).args(args);
        cmd.env("RUST_BACKTRACE", "1").env_remove("RUST_LOG");
        let out = run_command_as_is(cmd, None).unwrap();
        assert_eq!(
            out.status.code(),
            Some(i32::from(fault.exit_code())),
            "{args:?}: {out:?}"
        );
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {out:?}");
        assert!(out.stderr.starts_with("error: "), "{args:?}: {out:?}");
        fails_saying(out, words);
    }
    assert!(a.terminate().unwrap().success());

    // No daemon: unavailable.
    let mut cmd = std::process::Command::new(MESH);
    cmd.args(["--data", data, "status"])
        .env("RUST_BACKTRACE", "1");
    let out = run_command_as_is(cmd, None).unwrap();
    assert_eq!(
        out.status.code(),
        Some(i32::from(Fault::Unavailable.exit_code())),
        "{out:?}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    // A command line that parses but cannot be done is a usage error.
    let out = run(
        Path::new(MESH),
        &["--data", data, "send", "x", "y", "--lines"],
        None,
    )
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(i32::from(mesh_api::EXIT_USAGE)),
        "{out:?}"
    );
}

#[test]
fn mesh_help_lists_an_exit_code_for_each_fault_class() {
    let out = run(Path::new(MESH), &["--help"], None).unwrap();
    assert!(out.ok(), "{out:?}");
    assert!(out.stdout.contains("Exit codes:"), "{}", out.stdout);
    for f in Fault::ALL {
        let line = format!("  {}  {}: ", f.exit_code(), f);
        assert!(out.stdout.contains(&line), "no {line:?} in {}", out.stdout);
    }
}

/// What one API request logs carries that request's span (a number, the
/// method and the path), so two requests' lines read apart in the log.
#[tokio::test]
async fn each_api_request_logs_inside_its_own_numbered_span() {
    use mesh_api::{AddAgentRequest, AgentJson};
    use mesh_cluster::{NodeProc, NodeSpec, Placement};
    let tmp = temp_dir().unwrap();
    let mut node = NodeProc::new(NodeSpec {
        name: "a".into(),
        bin: MESH.into(),
        data: tmp.path().join("a"),
        log: tmp.path().join("a.log"),
        placement: Placement::default(),
        rust_log: "info".into(),
    });
    node.start().await.unwrap();
    for name in ["alice", "bob"] {
        let req = AddAgentRequest {
            name: name.into(),
            uid: None,
        };
        let _: AgentJson = node.client().post("/v1/agents", &req).await.unwrap();
    }
    node.stop().await.unwrap();
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    let added: Vec<&str> = log.lines().filter(|l| l.contains("agent added")).collect();
    assert_eq!(added.len(), 2, "two agents added, in:\n{log}");
    let mut spans = Vec::new();
    for line in &added {
        let start = line
            .find("request{")
            .unwrap_or_else(|| panic!("no span: {line}"));
        let span = &line[start..start + line[start..].find('}').unwrap() + 1];
        assert!(
            span.contains("method=POST") && span.contains("path=/v1/agents"),
            "{line}"
        );
        spans.push(span.to_owned());
    }
    assert_ne!(spans[0], spans[1], "two requests, one span: {added:?}");
}

/// Starts a daemon with `args`, its log (`RUST_LOG=debug`, so that the
/// libraries' lines are in it too) written to a file, makes it answer a
/// request and stops it; answers the log's lines.
fn daemon_log(name: &str, args: &[&str], env: &[(&str, &str)], config: &str) -> Vec<String> {
    let tmp = temp_dir().unwrap();
    let data = tmp.path().join(name);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("config.toml"), config).unwrap();
    let log = tmp.path().join(format!("{name}.log"));
    let d =
        DaemonProcess::start_logging_to(Path::new(MESH), &data, args, "debug", env, &log).unwrap();
    ok(d.mesh(&["status"]).unwrap());
    assert!(d.terminate().unwrap().success());
    let bytes = std::fs::read(&log).unwrap();
    assert!(
        !bytes.contains(&0x1b),
        "an escape byte in a log written to a file:\n{}",
        String::from_utf8_lossy(&bytes)
    );
    let text = String::from_utf8(bytes).unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    assert!(
        lines.iter().any(|l| l.contains("signal received")),
        "no shutdown line in the log:\n{text}"
    );
    lines
}

/// A log written to a file (a service's journal, a redirect) carries no
/// colour codes, also with `NO_COLOR` unset; `--log-format json` writes one
/// JSON object per line, every line; `[log] format = "journald"` starts
/// each line with its syslog priority and no timestamp.
#[test]
fn a_log_to_a_file_has_no_colour_and_json_and_journald_lines_are_what_they_say() {
    let text = daemon_log("text", &[], &[("NO_COLOR", "")], "");
    assert!(text.iter().any(|l| l.contains(" INFO ")), "{text:?}");

    let json = daemon_log("json", &["--log-format", "json"], &[], "");
    let mut levels = std::collections::BTreeSet::new();
    for line in &json {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        levels.insert(v["level"].as_str().unwrap().to_owned());
        assert!(v["timestamp"].is_string(), "{line}");
        assert!(v["fields"].is_object(), "{line}");
    }
    assert!(
        levels.contains("INFO") && levels.contains("DEBUG"),
        "{levels:?}"
    );

    // The config's format, and the flag over it.
    let journald = daemon_log("journald", &[], &[], "[log]\nformat = \"journald\"\n");
    for line in &journald {
        let (priority, rest) = line
            .strip_prefix('<')
            .and_then(|l| l.split_once('>'))
            .unwrap_or_else(|| panic!("no priority prefix: {line}"));
        assert!(["3", "4", "6", "7"].contains(&priority), "{line}");
        // The level comes first: no timestamp (journald stamps the line).
        let level = rest.split_whitespace().next().unwrap_or("");
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
            "not the level first: {line}"
        );
    }
    assert!(
        journald.iter().any(|l| l.starts_with("<6> INFO")),
        "{journald:?}"
    );
    let flag = daemon_log(
        "flag",
        &["--log-format", "json"],
        &[],
        "[log]\nformat = \"journald\"\n",
    );
    assert!(flag.iter().all(|l| l.starts_with('{')), "{flag:?}");
}

#[test]
fn an_unknown_log_format_is_a_usage_error_naming_the_choices() {
    let tmp = temp_dir().unwrap();
    let data = tmp.path().join("d");
    let out = run(
        Path::new(MESH),
        &[
            "--data",
            data.to_str().unwrap(),
            "daemon",
            "--log-format",
            "xml",
        ],
        None,
    )
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_says(&out, &["xml", "text", "json", "journald"]);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("config.toml"), "[log]\nformat = \"xml\"\n").unwrap();
    let out = run(
        Path::new(MESH),
        &["--data", data.to_str().unwrap(), "daemon"],
        None,
    )
    .unwrap();
    assert!(!out.ok(), "{out:?}");
    assert_says(&out, &["xml", "journald"]);
}
