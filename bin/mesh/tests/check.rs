//! `mesh check` against real daemons: each check trips with the exit code
//! of the Nagios convention, its JSON parses, and its Prometheus text goes
//! through the reference parser (the `prometheus_client` package from PyPI,
//! installed by this test into the target dir when it is not importable).
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::{Path, PathBuf};
use std::process::Command;

use mesh_tests::daemon::{DaemonProcess, Output, ok, parse_json, run, temp_dir};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// The parser's version: pinned, so every run parses alike.
const PROMETHEUS_CLIENT: &str = "prometheus-client==0.21.1";

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

fn check(d: &DaemonProcess, flags: &[&str]) -> Output {
    let mut all = vec!["check"];
    all.extend_from_slice(flags);
    d.mesh(&all).unwrap()
}

/// `mesh check flags...`'s exit code and its one line.
#[track_caller]
fn exits(d: &DaemonProcess, flags: &[&str], code: i32, starts: &str) -> String {
    let out = check(d, flags);
    assert_eq!(out.status.code(), Some(code), "{flags:?}: {out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{flags:?}: {out:?}");
    assert!(out.stdout.starts_with(starts), "{flags:?}: {out:?}");
    assert!(out.stderr.is_empty(), "{flags:?}: {out:?}");
    out.stdout
}

fn as_agent(d: &DaemonProcess, agent: &str, args: &[&str]) -> String {
    let mut all = vec!["--agent", agent];
    all.extend_from_slice(args);
    ok(d.mesh(&all).unwrap())
}

/// A `PYTHONPATH` under which `prometheus_client` imports: none if it does
/// already, else a dir of the target's it is installed into with pip (each
/// process its own, so two test runs at once do not share a half install).
fn python_path() -> Option<PathBuf> {
    let imports = |path: Option<&Path>| {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", "import prometheus_client"]);
        if let Some(p) = path {
            cmd.env("PYTHONPATH", p);
        }
        cmd.output().map(|o| o.status.success()).unwrap_or(false)
    };
    if imports(None) {
        return None;
    }
    let shared = Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-prometheus");
    if imports(Some(&shared)) {
        return Some(shared);
    }
    let own = shared.with_extension(std::process::id().to_string());
    let out = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
        .arg(&own)
        .arg(PROMETHEUS_CLIENT)
        .output()
        .expect("python3 runs (this test needs python3 with pip)");
    assert!(
        out.status.success(),
        "pip install {PROMETHEUS_CLIENT} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first complete install becomes the shared one; a later run finds it.
    let _ = std::fs::rename(&own, &shared);
    Some(if imports(Some(&shared)) { shared } else { own })
}

/// `text` through `prometheus_client`'s parser: each sample as
/// `[name, labels, value]`.
fn parse_prometheus(text: &str) -> Vec<serde_json::Value> {
    let script = "import sys, json\n\
        from prometheus_client.parser import text_string_to_metric_families\n\
        out = []\n\
        for f in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   assert f.type == 'gauge', (f.name, f.type)\n\
        \x20   for s in f.samples:\n\
        \x20       out.append([s.name, s.labels, s.value])\n\
        print(json.dumps(out))\n";
    let mut cmd = Command::new("python3");
    cmd.args(["-c", script]);
    if let Some(p) = python_path() {
        cmd.env("PYTHONPATH", p);
    }
    let out = mesh_tests::daemon::run_command(cmd, Some(text)).unwrap();
    assert!(out.ok(), "the parser refused:\n{text}\n{out:?}");
    serde_json::from_str::<Vec<serde_json::Value>>(&out.stdout).unwrap()
}

fn sample(samples: &[serde_json::Value], name: &str, label: Option<(&str, &str)>) -> f64 {
    samples
        .iter()
        .find(|s| {
            s[0] == name
                && match label {
                    Some((k, v)) => s[1][k] == v,
                    None => true,
                }
        })
        .unwrap_or_else(|| panic!("no {name} {label:?} in {samples:?}"))[2]
        .as_f64()
        .unwrap()
}

#[test]
fn each_check_trips_with_the_convention_s_exit_code_and_every_format_parses() {
    let tmp = temp_dir().unwrap();
    let a_dir = tmp.path().join("a");
    std::fs::create_dir_all(&a_dir).unwrap();
    // The smallest journal bound (1 MiB), so that a few entries are a
    // percent of it a threshold can be set below.
    std::fs::write(
        a_dir.join("config.toml"),
        "[journal]\nmax_bytes = 1048576\n",
    )
    .unwrap();
    let a = start(&a_dir);
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["send", b.node(), "hello"]).unwrap());
    // Linked: connected, and what was sent acknowledged.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let st = parse_json(&ok(a.mesh(&["status", "--json"]).unwrap())).unwrap();
        let p = &st["peers"][0];
        if p["connected"] == true && p["queued_msgs"] == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not linked: {st}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    exits(
        &a,
        &["--peers-min", "1"],
        0,
        "MESH OK - 1/1 peers connected (at least 1 wanted)| 'peers_connected'=1;;1: ",
    );
    exits(
        &a,
        &["--peers-min", "2"],
        2,
        "MESH CRITICAL - 1/1 peers connected (at least 2 wanted)",
    );

    // JSON: the state, the code and every check.
    let out = check(&a, &["--json"]);
    assert!(out.ok(), "{out:?}");
    let j = parse_json(&out.stdout).unwrap();
    assert_eq!(
        (j["state"].as_str(), j["code"].as_u64()),
        (Some("OK"), Some(0))
    );
    let names: Vec<&str> = j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "store",
            "peers",
            "queue",
            "queue_age",
            "unread_age",
            "journal",
            "losses"
        ]
    );

    // b stops: what a sends queues, and ages.
    b.terminate().unwrap();
    for body in ["one", "two", "three"] {
        ok(a.mesh(&["send", &a_peer(&a), body]).unwrap());
    }
    exits(&a, &["--queue-warn", "4"], 0, "MESH OK");
    exits(&a, &["--queue-warn", "3"], 1, "MESH WARNING - peer ");
    exits(
        &a,
        &["--queue-warn", "2", "--queue-crit", "3"],
        2,
        "MESH CRITICAL - peer ",
    );
    exits(&a, &["--queue-age-warn", "1h"], 0, "MESH OK");
    let line = exits(&a, &["--queue-age-warn", "1ms"], 1, "MESH WARNING - peer ");
    assert!(line.contains("oldest queued message"), "{line}");
    exits(&a, &["--queue-age-crit", "1ms"], 2, "MESH CRITICAL - peer ");

    // Unread mail: bob has alice's message until he acks it.
    for agent in ["alice", "bob"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    as_agent(
        &a,
        "alice",
        &["send", &format!("bob@{}", a.node()), "read me"],
    );
    exits(&a, &["--unread-age-warn", "1h"], 0, "MESH OK");
    let line = exits(
        &a,
        &["--unread-age-warn", "1ms"],
        1,
        "MESH WARNING - agent bob's oldest unread",
    );
    assert!(!line.split('|').next().unwrap().contains("alice"), "{line}");
    let page = as_agent(&a, "bob", &["inbox", "--unread", "--json"]);
    let cursor = parse_json(page.lines().last().unwrap()).unwrap()["cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    as_agent(&a, "bob", &["ack", &cursor]);
    exits(&a, &["--unread-age-crit", "1ms"], 0, "MESH OK");

    // The journal against its bound: a few hundred bytes of its 1 MiB.
    exits(
        &a,
        &["--journal-warn", "0.01"],
        1,
        "MESH WARNING - journal at ",
    );
    exits(
        &a,
        &["--journal-warn", "0.01", "--journal-crit", "0.02"],
        2,
        "MESH CRITICAL - journal at ",
    );

    // Prometheus text, through the reference parser.
    let out = check(&a, &["--format", "prometheus", "--queue-warn", "3"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let samples = parse_prometheus(&out.stdout);
    assert_eq!(
        sample(&samples, "mesh_check_state", Some(("check", "queue"))),
        1.0
    );
    assert_eq!(
        sample(&samples, "mesh_check_state", Some(("check", "peers"))),
        0.0
    );
    let b_node = a_peer(&a);
    assert_eq!(
        sample(
            &samples,
            "mesh_check_peer_queued_msgs",
            Some(("peer", &b_node))
        ),
        3.0
    );
    assert!(
        sample(
            &samples,
            "mesh_check_peer_oldest_queued_age_seconds",
            Some(("peer", &b_node))
        ) > 0.0
    );
    assert_eq!(sample(&samples, "mesh_check_peers_connected", None), 0.0);
    assert!(sample(&samples, "mesh_check_journal_used_percent", None) > 0.0);
    assert_eq!(
        sample(&samples, "mesh_check_recent_loss_records", None),
        0.0
    );
    let data = a.data().to_owned();
    a.terminate().unwrap();

    // No daemon: CRITICAL, in each format; a bad argument: UNKNOWN.
    let data = data.to_str().unwrap();
    let out = run(Path::new(MESH), &["--data", data, "check"], None).unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stdout
            .starts_with("MESH CRITICAL - the mesh daemon is not running"),
        "{out:?}"
    );
    let out = run(Path::new(MESH), &["--data", data, "check", "--json"], None).unwrap();
    assert_eq!(parse_json(&out.stdout).unwrap()["code"], 2, "{out:?}");
    let out = run(
        Path::new(MESH),
        &["--data", data, "check", "--format", "prometheus"],
        None,
    )
    .unwrap();
    assert_eq!(
        sample(
            &parse_prometheus(&out.stdout),
            "mesh_check_state",
            Some(("check", "daemon"))
        ),
        2.0
    );
    for bad in [
        &["--queue-warn", "many"][..],
        &["--journal-warn", "0"],
        &["--nonsense"],
    ] {
        let mut argv = vec!["--data", data, "check"];
        argv.extend_from_slice(bad);
        let out = run(Path::new(MESH), &argv, None).unwrap();
        assert_eq!(out.status.code(), Some(3), "{bad:?}: {out:?}");
    }
}

/// Records of what was lost in the recent journal warn (from one, by
/// default) and go critical at `--losses-crit`; out of `--recent` they
/// no longer count.
#[test]
fn losses_in_the_recent_journal_warn_and_age_out_of_the_window() {
    let tmp = temp_dir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::write(
        a_dir.join("config.toml"),
        "[outbox]\nmax_msgs = 2\non_full = \"evict-oldest\"\n",
    )
    .unwrap();
    let a = start(&a_dir);
    let b = start(&b_dir);
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    b.terminate().unwrap();
    exits(&a, &[], 0, "MESH OK");
    for body in ["one", "two", "three"] {
        ok(a.mesh(&["send", &a_peer(&a), body]).unwrap());
    }
    let line = exits(
        &a,
        &[],
        1,
        "MESH WARNING - 1 gap or loss records in the last ",
    );
    assert!(line.contains("'recent_loss_records'=1;1;"), "{line}");
    exits(&a, &["--losses-warn", "0"], 0, "MESH OK");
    exits(
        &a,
        &["--losses-crit", "1"],
        2,
        "MESH CRITICAL - 1 gap or loss records",
    );
    // The loss is the last arrival; two more and a window of two misses it.
    ok(a.mesh(&["send", &a_peer(&a), "four"]).unwrap());
    ok(a.mesh(&["send", &a_peer(&a), "five"]).unwrap());
    exits(&a, &["--recent", "2"], 1, "MESH WARNING");
    let events = ok(a.mesh(&["events", "--json"]).unwrap());
    let kinds: Vec<String> = events
        .lines()
        .map(|l| parse_json(l).unwrap()["kind"].as_str().unwrap().to_owned())
        .collect();
    let loss_at = kinds.iter().rposition(|k| k == "loss").unwrap();
    let after = kinds.len() - loss_at - 1;
    exits(&a, &["--recent", &after.to_string()], 0, "MESH OK");
    exits(
        &a,
        &["--recent", &(after + 1).to_string()],
        1,
        "MESH WARNING",
    );
}

/// The one peer of `a`.
fn a_peer(a: &DaemonProcess) -> String {
    let st = parse_json(&ok(a.mesh(&["status", "--json"]).unwrap())).unwrap();
    st["peers"][0]["node"].as_str().unwrap().to_owned()
}
