//! `mesh doctor` against real daemons and real faults: each fault is made
//! here (a data dir open to others, a stale socket, a peer stopped, a link
//! paused, a journal at its bound, a socket another uid cannot reach, ...)
//! and found, with its fix line.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use mesh_tests::daemon::{DaemonProcess, Output, ok, parse_json, run, run_command, temp_dir};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// The uid other than ours the test acts as.
const NOBODY: u32 = 65534;

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

fn doctor_at(data: &Path, flags: &[&str]) -> Output {
    let mut all = vec!["--data", data.to_str().unwrap(), "doctor"];
    all.extend_from_slice(flags);
    run(Path::new(MESH), &all, None).unwrap()
}

/// The findings of `mesh doctor --json` on `data`, and whether it exited 0.
fn findings(data: &Path, flags: &[&str]) -> (Vec<serde_json::Value>, bool) {
    let mut all = vec!["--json"];
    all.extend_from_slice(flags);
    let out = doctor_at(data, &all);
    let list = parse_json(&out.stdout).unwrap();
    (list.as_array().unwrap().clone(), out.ok())
}

/// The one finding of `check` at `severity` whose text has every word of
/// `what`; its fix must have every word of `fix`.
#[track_caller]
fn found(list: &[serde_json::Value], check: &str, severity: &str, what: &[&str], fix: &[&str]) {
    let f = list
        .iter()
        .find(|f| {
            f["check"] == check
                && f["severity"] == severity
                && what.iter().all(|w| f["what"].as_str().unwrap().contains(w))
        })
        .unwrap_or_else(|| panic!("no {severity} {check} finding with {what:?} in {list:#?}"));
    let text = f["fix"].as_str().unwrap_or("");
    for w in fix {
        assert!(text.contains(w), "the fix {text:?} lacks {w:?}");
    }
}

#[track_caller]
fn not_found(list: &[serde_json::Value], check: &str, severity: &str) {
    assert!(
        !list
            .iter()
            .any(|f| f["check"] == check && f["severity"] == severity),
        "a {severity} {check} finding in {list:#?}"
    );
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_healthy_pair_has_no_problem_and_a_stopped_or_paused_peer_is_found_with_its_fix() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));

    // No peers yet: nothing sent can leave.
    let (list, clean) = findings(a.data(), &[]);
    assert!(!clean);
    found(
        &list,
        "peer",
        "warn",
        &["no peers"],
        &["mesh invite", "mesh join"],
    );

    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["send", b.node(), "hello"]).unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let list = loop {
        let (list, clean) = findings(a.data(), &[]);
        if clean {
            break list;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never healthy: {list:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    for check in ["data_dir", "disk", "daemon", "store", "journal", "peer"] {
        assert!(
            list.iter()
                .any(|f| f["check"] == check && f["severity"] == "ok"),
            "no ok {check} in {list:#?}"
        );
    }
    // The text form: one line per finding, exit 0.
    let out = doctor_at(a.data(), &[]);
    assert!(out.ok(), "{out:?}");
    assert!(out.stdout.lines().all(|l| l.starts_with("ok  ")), "{out:?}");

    // The link paused: found, with the command that resumes it.
    ok(a.mesh(&["peer", "pause", b.node()]).unwrap());
    let (list, clean) = findings(a.data(), &[]);
    assert!(!clean);
    found(
        &list,
        "peer",
        "warn",
        &["paused"],
        &[&format!("mesh peer resume {}", b.node())],
    );
    ok(a.mesh(&["peer", "resume", b.node()]).unwrap());

    // b stopped: a says where it dials b and what to check.
    let (b_addr, b_node) = (b.peer_addr().unwrap().to_string(), b.node().to_owned());
    b.terminate().unwrap();
    ok(a.mesh(&["send", &b_node, "are you there"]).unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (list, _) = findings(a.data(), &[]);
        if list
            .iter()
            .any(|f| f["check"] == "peer" && f["severity"] == "warn")
        {
            found(
                &list,
                "peer",
                "warn",
                &["not connected", &b_addr, "1 messages wait"],
                &["mesh status", "UDP", "mesh peer add"],
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "b never missed: {list:#?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The text form: the problem and its fix line, exit 1.
    let out = doctor_at(a.data(), &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let warn = out
        .stdout
        .lines()
        .position(|l| l.starts_with("WARN  peer"))
        .unwrap();
    assert!(
        out.stdout
            .lines()
            .nth(warn + 1)
            .unwrap()
            .starts_with("      fix: "),
        "{out:?}"
    );
}

#[test]
fn local_faults_are_found_with_their_fix_lines() {
    let tmp = temp_dir().unwrap();
    let data = tmp.path().join("a");

    // No data dir at all.
    let (list, clean) = findings(&data, &[]);
    assert!(!clean);
    found(
        &list,
        "data_dir",
        "fail",
        &["no data dir"],
        &["mesh daemon --data"],
    );

    // A data dir, no daemon: no socket; then a socket nobody listens on.
    let a = start(&data);
    let a_addr = a.peer_addr().unwrap();
    a.terminate().unwrap();
    let (list, _) = findings(&data, &[]);
    found(
        &list,
        "daemon",
        "fail",
        &["no daemon"],
        &["mesh daemon --data"],
    );
    let socket = data.join("mesh.sock");
    let _ = std::fs::remove_file(&socket);
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let (list, _) = findings(&data, &[]);
    found(
        &list,
        "daemon",
        "fail",
        &["no daemon listens", "left by one that ended"],
        &["mesh daemon"],
    );

    // The daemon again; the data dir and the key opened to others.
    let a = DaemonProcess::start(Path::new(MESH), &data, a_addr).unwrap();
    chmod(&data, 0o755);
    chmod(&data.join("node.key"), 0o644);
    let (list, clean) = findings(&data, &[]);
    assert!(!clean);
    found(
        &list,
        "data_dir",
        "fail",
        &["mode 0755"],
        &[&format!("chmod 700 {}", data.display())],
    );
    found(&list, "key", "fail", &["mode 0644"], &["chmod 600"]);
    chmod(&data, 0o700);
    chmod(&data.join("node.key"), 0o600);
    let (list, _) = findings(&data, &[]);
    not_found(&list, "data_dir", "fail");
    not_found(&list, "key", "fail");

    // A disk with less free than asked for.
    let (list, _) = findings(&data, &["--disk-free-min", &u64::MAX.to_string()]);
    found(&list, "disk", "fail", &["nearly full"], &["free space"]);
    let (list, _) = findings(&data, &["--disk-free-min", "1"]);
    not_found(&list, "disk", "fail");
    drop(a);
}

#[test]
fn a_journal_at_its_bound_is_found() {
    let tmp = temp_dir().unwrap();
    let data = tmp.path().join("a");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("config.toml"), "[journal]\nmax_bytes = 1048576\n").unwrap();
    let a = start(&data);
    for agent in ["alice", "bob"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    let to = format!("bob@{}", a.node());
    let body = "x".repeat(60_000);
    let (list, _) = findings(&data, &[]);
    not_found(&list, "journal", "warn");
    for _ in 0..20 {
        ok(a.mesh(&["--agent", "alice", "send", &to, &body]).unwrap());
    }
    let (list, _) = findings(&data, &[]);
    found(
        &list,
        "journal",
        "warn",
        &["of [journal] max_bytes"],
        &["raise [journal] max_bytes"],
    );
}

#[test]
fn sockets_another_uid_cannot_reach_are_found() {
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata("/proc/self").unwrap().uid(),
        0,
        "this test acts as another uid and must run as root"
    );
    let tmp = temp_dir().unwrap();
    // The agents' sockets in a dir of their own under one only root enters.
    let sockets = tmp.path().join("closed").join("sockets");
    std::fs::create_dir_all(&sockets).unwrap();
    chmod(&tmp.path().join("closed"), 0o700);
    let data = tmp.path().join("a");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!("[agents]\nsocket_dir = {:?}\n", sockets.to_str().unwrap()),
    )
    .unwrap();
    let a = start(&data);
    ok(
        a.mesh(&["agent", "add", "nina", "--uid", &NOBODY.to_string()])
            .unwrap(),
    );
    let (list, _) = findings(&data, &[]);
    found(
        &list,
        "agent_socket",
        "fail",
        &["agent nina", &format!("uid {NOBODY} cannot reach")],
        &["[agents] socket_dir"],
    );
    chmod(&tmp.path().join("closed"), 0o711);
    let (list, _) = findings(&data, &[]);
    found(&list, "agent_socket", "ok", &["agent nina"], &[]);

    // Another uid runs the doctor: the control socket is not its to reach.
    chmod(tmp.path(), 0o711);
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args([
        "--reuid",
        &NOBODY.to_string(),
        "--regid",
        &NOBODY.to_string(),
        "--clear-groups",
        MESH,
        "--data",
        data.to_str().unwrap(),
        "doctor",
        "--json",
    ]);
    let out = run_command(cmd, None).unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let list = parse_json(&out.stdout).unwrap().as_array().unwrap().clone();
    found(
        &list,
        "daemon",
        "fail",
        &[&format!("uid {NOBODY} may not reach"), "uid 0's, mode 0700"],
        &["run mesh as uid 0"],
    );
    // A data dir others may enter (but not list or read) is a warning.
    chmod(&data, 0o711);
    let (list, _) = findings(&data, &[]);
    found(
        &list,
        "data_dir",
        "warn",
        &["mode 0711", "may enter"],
        &["chmod 700"],
    );
    chmod(&data, 0o700);
    drop(a);
}
