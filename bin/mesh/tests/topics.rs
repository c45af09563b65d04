//! Topics through real `mesh daemon` processes and the `mesh` CLI: a line of
//! three nodes sharing a topic, and seed 001's walk of the journal across a
//! partition (`mesh peer pause`), exactly once.
//!
//! Every wait is on a command's output and bounded.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::time::{Duration, Instant};

use mesh_tests::daemon::{DaemonProcess, ok, parse_json, temp_dir};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// How long messages may take to reach a member.
const SETTLE: Duration = Duration::from_secs(60);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

/// Makes `a` and `b` peers of each other.
fn link(a: &DaemonProcess, b: &DaemonProcess) {
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
}

fn join(d: &DaemonProcess, topic: &str) {
    let t = parse_json(&ok(d.mesh(&["topic", "join", topic, "--json"]).unwrap())).unwrap();
    assert_eq!(t["name"], topic);
}

fn publish(d: &DaemonProcess, topic: &str, text: &str) -> u64 {
    ok(d.mesh(&["publish", topic, text]).unwrap())
        .trim()
        .parse()
        .unwrap()
}

/// The topic messages of `d`'s journal after `after` (all of them when
/// `None`), one page of at most `limit`: (author, seq, body), and the next cursor.
fn page(
    d: &DaemonProcess,
    after: Option<&str>,
    limit: u32,
) -> (Vec<(String, u64, String)>, String) {
    let limit = limit.to_string();
    let mut args = vec!["events", "--json", "--limit", &limit];
    if let Some(a) = after {
        args.extend(["--after", a]);
    }
    let out = d.mesh(&args).unwrap();
    assert!(out.ok(), "{out:?}");
    let items = out
        .stdout
        .lines()
        .map(|l| parse_json(l).unwrap())
        .filter(|e| {
            e["stream"]["channel"]
                .as_str()
                .is_some_and(|c| c.starts_with("topic:"))
        })
        .map(|e| {
            (
                e["stream"]["author"].as_str().unwrap().to_owned(),
                e["seq"].as_u64().unwrap(),
                e["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (items, out.next_cursor())
}

#[test]
fn three_nodes_in_a_line_share_a_topic_each_message_journaled_once_in_order() {
    let tmp = temp_dir().unwrap();
    // C is a member from its config, joined at start.
    let c_dir = tmp.path().join("c");
    std::fs::create_dir_all(&c_dir).unwrap();
    std::fs::write(c_dir.join("config.toml"), "[topics]\njoin = [\"builds\"]\n").unwrap();
    let (a, b, c) = (
        start(&tmp.path().join("a")),
        start(&tmp.path().join("b")),
        start(&c_dir),
    );
    let listed = parse_json(&ok(c.mesh(&["topic", "list", "--json"]).unwrap())).unwrap();
    assert_eq!(listed["topics"][0]["name"], "builds", "{listed}");
    // A — B — C: A and C are not peers.
    link(&a, &b);
    link(&b, &c);
    for d in [&a, &b] {
        join(d, "builds");
    }
    let out = a.mesh(&["publish", "other", "x"]).unwrap();
    assert_eq!(out.status.code(), Some(3), "not a member: {out:?}");
    assert!(out.stderr.contains("not a member"), "{out:?}");
    let bodies: Vec<String> = (1..=5).map(|i| format!("build {i} passed")).collect();
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(publish(&a, "builds", body), i as u64 + 1);
    }
    let want: Vec<(u64, String)> = (1..).zip(bodies.iter().cloned()).collect();
    for d in [&b, &c] {
        assert_eq!(wait_for(d, a.node(), 5), want, "at {}", d.node());
    }
    // C answers; A has it through B.
    publish(&c, "builds", "deployed");
    assert_eq!(wait_for(&a, c.node(), 1), vec![(1, "deployed".to_owned())]);
    let list = parse_json(&ok(b.mesh(&["topic", "list", "--json"]).unwrap())).unwrap();
    let t = &list["topics"][0];
    assert_eq!(t["name"], "builds");
    assert_eq!(t["members"].as_array().unwrap().len(), 2, "{t}");
    assert_eq!(t["streams"].as_array().unwrap().len(), 2, "{t}");
    // `/metrics` per topic.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = mesh_api::client::Client::new(b.socket());
    let text = rt.block_on(client.get_text("/metrics")).unwrap();
    for line in [
        "mesh_topic_members{topic=\"builds\"} 2",
        "mesh_topic_streams{topic=\"builds\"} 2",
        "mesh_topic_held_msgs{topic=\"builds\"} 6",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in /metrics");
    }
}

/// Seed 001's regression test, in our terms: a reader walks the journal one
/// page of one entry at a time; the writer is partitioned (its link paused,
/// not stopped) and writes; when the link comes back its messages arrive
/// after the walk went by, and the resumed walk returns them, each once.
#[test]
fn a_journal_walk_resumed_across_partitions_returns_every_late_message_exactly_once() {
    let tmp = temp_dir().unwrap();
    let (a, b) = (start(&tmp.path().join("a")), start(&tmp.path().join("b")));
    link(&a, &b);
    join(&a, "incidents");
    join(&b, "incidents");
    publish(&b, "incidents", "b-0");
    wait_for(&a, b.node(), 1);
    // The reader on A walks past B's latest message, one entry a page.
    let mut seen: Vec<(u64, String)> = Vec::new();
    let mut cursor: Option<String> = None;
    let walk = |cursor: &mut Option<String>, seen: &mut Vec<(u64, String)>| loop {
        let (items, next) = page(&a, cursor.as_deref(), 1);
        let moved = cursor.as_deref() != Some(next.as_str());
        seen.extend(
            items
                .into_iter()
                .filter(|(author, _, _)| author == b.node())
                .map(|(_, s, body)| (s, body)),
        );
        *cursor = Some(next);
        if !moved {
            return;
        }
    };
    walk(&mut cursor, &mut seen);
    assert_eq!(seen, vec![(1, "b-0".to_owned())]);
    let mut sent = 1;
    for round in 0..3 {
        // A partition: A stops talking to B.
        ok(a.mesh(&["peer", "pause", b.node()]).unwrap());
        for i in 0..3 {
            publish(&b, "incidents", &format!("b-{round}-{i}"));
            sent += 1;
        }
        // Nothing arrives while paused; the walk finds nothing new.
        walk(&mut cursor, &mut seen);
        assert_eq!(
            seen.len(),
            sent - 3,
            "round {round}: before the link is back"
        );
        ok(a.mesh(&["peer", "resume", b.node()]).unwrap());
        wait_for(&a, b.node(), sent);
        walk(&mut cursor, &mut seen);
    }
    let seqs: Vec<u64> = seen.iter().map(|(s, _)| *s).collect();
    let want: Vec<u64> = (1..=sent as u64).collect();
    assert_eq!(
        seqs, want,
        "every message once, in order, over the whole walk"
    );
    assert_eq!(seen[1].1, "b-0-0");
}

#[test]
fn three_members_publishing_through_random_partitions_end_with_every_message_once() {
    let tmp = temp_dir().unwrap();
    let nodes: Vec<DaemonProcess> = ["a", "b", "c"]
        .iter()
        .map(|n| start(&tmp.path().join(n)))
        .collect();
    for (i, j) in [(0, 1), (1, 2), (0, 2)] {
        link(&nodes[i], &nodes[j]);
    }
    for d in &nodes {
        join(d, "chaos");
    }
    // A fixed pseudo-random schedule (xorshift): each step one node
    // publishes, and now and then a link is paused or resumed.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut paused = [[false; 3]; 3];
    let mut sent = [0usize; 3];
    for step in 0..30 {
        let r = next();
        let (i, j) = [(0, 1), (1, 2), (0, 2)][(r % 3) as usize];
        if r % 4 == 0 {
            let verb = if paused[i][j] { "resume" } else { "pause" };
            ok(nodes[i].mesh(&["peer", verb, nodes[j].node()]).unwrap());
            paused[i][j] = !paused[i][j];
        }
        let author = ((r >> 8) % 3) as usize;
        publish(&nodes[author], "chaos", &format!("{author}:{step}"));
        sent[author] += 1;
    }
    for (i, row) in paused.iter().enumerate() {
        for (j, p) in row.iter().enumerate() {
            if *p {
                ok(nodes[i].mesh(&["peer", "resume", nodes[j].node()]).unwrap());
            }
        }
    }
    for d in &nodes {
        for (author, n) in nodes.iter().zip(sent) {
            let got = wait_for(d, author.node(), n);
            let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
            let want: Vec<u64> = (1..=n as u64).collect();
            assert_eq!(
                seqs,
                want,
                "at {}: {}'s messages once each, in order",
                d.node(),
                author.node()
            );
        }
    }
}

/// Waits until `d` journals `n` messages of `author`'s topic stream,
/// paging the whole journal; returns them all.
fn wait_for(d: &DaemonProcess, author: &str, n: usize) -> Vec<(u64, String)> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut got = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (items, next) = page(d, after.as_deref(), 1000);
            if items.is_empty() && after.as_deref() == Some(next.as_str()) {
                break;
            }
            got.extend(
                items
                    .into_iter()
                    .filter(|(a, _, _)| a == author)
                    .map(|(_, s, b)| (s, b)),
            );
            after = Some(next);
        }
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} after {SETTLE:?}",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_batch_of_publishes_arrives_whole_in_order_and_a_bad_one_publishes_nothing() {
    const N: usize = 2500;
    let tmp = temp_dir().unwrap();
    let (a, b) = (start(&tmp.path().join("a")), start(&tmp.path().join("b")));
    link(&a, &b);
    for d in [&a, &b] {
        join(d, "builds");
    }
    // `mesh publish - --lines`: 1000 a request, one seq printed per line.
    let lines: String = (0..N).map(|i| format!("line {i}\n")).collect();
    let out = ok(a
        .mesh_stdin(&["publish", "builds", "-", "--lines"], Some(&lines))
        .unwrap());
    let seqs: Vec<u64> = out.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(seqs, (1..=N as u64).collect::<Vec<_>>());
    let want: Vec<(u64, String)> = (1..).zip((0..N).map(|i| format!("line {i}"))).collect();
    assert!(
        wait_for(&b, a.node(), N) == want,
        "not every line, in order"
    );

    // NDJSON in, NDJSON out; a bad line refuses the whole request.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = mesh_api::client::Client::new(a.socket());
    let post = |body: &str| {
        rt.block_on(client.raw_bytes(
            hyper::Method::POST,
            "/v1/topics/builds/publish/batch",
            Some("application/x-ndjson"),
            hyper::body::Bytes::from(body.to_owned()),
        ))
        .unwrap()
    };
    let (status, body) = post("{\"body\":\"x\"}\n{\"body\":\"y\",\"msg_kind\":3}\n");
    assert_eq!(status, 400, "{body:?}");
    let err: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(err["error"]["code"], "bad_request", "{err}");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("kind 3"),
        "{err}"
    );
    assert_eq!(err["error"]["committed"], 0, "{err}");
    let (status, body) = post("{\"body\":\"x\"}\n\n{\"body\":\"y\"}\n");
    assert_eq!(status, 200, "{body:?}");
    let answers: Vec<serde_json::Value> = std::str::from_utf8(&body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(
        (answers[0]["seq"].as_u64(), answers[1]["seq"].as_u64()),
        (Some(N as u64 + 1), Some(N as u64 + 2)),
        "{answers:?}"
    );
    assert_eq!(answers[2]["done"]["count"], 2);
    // Nothing of the refused request reached the member: x, y follow line N-1.
    let got = wait_for(&b, a.node(), N + 2);
    assert_eq!(got.len(), N + 2, "{:?}", &got[N..]);
    assert_eq!(
        got[N..].iter().map(|(_, b)| b.as_str()).collect::<Vec<_>>(),
        ["x", "y"]
    );
    // Not a member: refused whole, as a single publish is.
    let out = a
        .mesh_stdin(&["publish", "other", "-", "--lines"], Some("one\ntwo\n"))
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(out.stderr.contains("not a member"), "{out:?}");
}
