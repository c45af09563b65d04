//! The local API on a real Unix socket in front of a real daemon: redb
//! store, bus node on 127.0.0.1, in this process (`common::TestNode`).
//! Peers that matter only as recipients are absent: what is sent to them
//! stays committed in the outbox.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;
use common::{
    TestNode, body_of, bounded, open_unread_subscription, parse_prometheus, random_key,
    read_until_lagged, spawn_reader,
};
use std::time::Duration;

use hyper::{Method, StatusCode};
use mesh_api::client::{ClientError, Lines};
use mesh_api::{EventEntry, EventsPage, Fault};
use mesh_daemon::api::{ApiSocket, BindError};
use mesh_protocol::{Cursor, Epoch, NodeId, NodeTicket};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

/// Options of a test daemon, written to its `config.toml`.
#[derive(Clone, Copy)]
struct Opts {
    subscriber_buffer: usize,
    subscriber_stall: Duration,
    /// `[outbox] max_msgs`, if not the default.
    outbox_msgs_max: Option<u64>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            subscriber_buffer: 1024,
            subscriber_stall: Duration::from_secs(5),
            outbox_msgs_max: None,
        }
    }
}

impl Opts {
    fn config(&self) -> String {
        let mut text = format!(
            "[api]\nsubscriber_buffer = {}\nsubscriber_stall_ms = {}\n",
            self.subscriber_buffer,
            self.subscriber_stall.as_millis()
        );
        if let Some(n) = self.outbox_msgs_max {
            text.push_str(&format!("[outbox]\nmax_msgs = {n}\non_full = \"reject\"\n"));
        }
        text
    }
}

/// Runs `test` on a daemon with `opts` in a temp dir, then stops it; fails
/// the test after `common::TEST_TIMEOUT`.
async fn with_node(opts: Opts, test: impl AsyncFnOnce(&mut TestNode)) {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let mut d = TestNode::start(tmp.path(), "d", Some(&opts.config())).await;
        test(&mut d).await;
        if d.is_running() {
            d.stop().await;
        }
    })
    .await
}

/// Sends `n` messages to `to` through the JSON-array batch route, `per` a request.
async fn send_many(d: &TestNode, to: NodeId, n: usize, per: usize, body: impl Fn(usize) -> String) {
    let bodies: Vec<String> = (0..n).map(body).collect();
    d.send_all(&to.to_string(), &bodies, per).await;
}

/// Posts `body` to the NDJSON batch route; answers its answer lines.
async fn post_ndjson<S>(d: &TestNode, body: S) -> Result<Lines, ClientError>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static,
{
    d.client
        .stream_lines(Method::POST, "/v1/send/batch", "application/x-ndjson", body)
        .await
}

/// A request body sent as one chunk.
fn one_chunk(
    body: String,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::iter([Ok(bytes::Bytes::from(body))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_events_one_at_a_time_returns_each_of_1000_exactly_once_across_a_restart() {
    with_node(Opts::default(), async |d| {
        let peer = d.add_absent_peer().await;
        send_many(d, peer, 1000, 100, |i| format!("msg-{i}")).await;

        let mut after = String::new();
        let mut seen = d.page_one_by_one(&mut after, 400).await;
        assert_eq!(seen.len(), 400);
        d.stop().await;
        d.restart().await;
        seen.extend(d.page_one_by_one(&mut after, 1001).await);
        let seen: Vec<&str> = seen.iter().filter_map(body_of).collect();
        let want: Vec<String> = (0..1000).map(|i| format!("msg-{i}")).collect();
        assert_eq!(seen, want, "each once, in order, and nothing more");

        // No `after` pages from the start; limits are enforced.
        let page: EventsPage = d.client.get("/v1/events").await.unwrap();
        assert_eq!(page.entries.len(), mesh_daemon::api::EVENTS_LIMIT_DEFAULT);
        assert_eq!(body_of(&page.entries[0]), Some("msg-0"));
        let page: EventsPage = d.client.get("/v1/events?limit=1000").await.unwrap();
        assert_eq!(page.entries.len(), 1000);
        for bad in ["0", "1001", "lots"] {
            let path = format!("/v1/events?limit={bad}");
            d.expect_error(
                (Method::GET, &path),
                None,
                (StatusCode::BAD_REQUEST, "bad_request"),
            )
            .await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_from_another_node_or_epoch_is_refused_with_409_and_garbage_with_400() {
    with_node(Opts::default(), async |d| {
        let other_node = Cursor::new(&random_key().public(), d.epoch, 1).to_string();
        let other_epoch = Cursor::new(&d.node_id(), Epoch([9; 16]), 1).to_string();
        let cases = [
            (
                other_node.as_str(),
                StatusCode::CONFLICT,
                "cursor_other_node",
            ),
            (
                other_epoch.as_str(),
                StatusCode::CONFLICT,
                "cursor_other_epoch",
            ),
            ("garbage", StatusCode::BAD_REQUEST, "bad_cursor"),
        ];
        for (cursor, status, code) in cases {
            for path in [
                format!("/v1/events?after={cursor}"),
                format!("/v1/subscribe?after={cursor}"),
            ] {
                d.expect_error((Method::GET, &path), None, (status, code))
                    .await;
            }
            let body = json!({ "cursor": cursor });
            d.expect_error(
                (Method::PUT, "/v1/cursors/agent"),
                Some(&body),
                (status, code),
            )
            .await;
        }
        // Nothing was written by the refused PUTs.
        d.assert_no_cursor("agent").await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_cursor_is_durable_across_a_restart() {
    with_node(Opts::default(), async |d| {
        let peer = d.add_absent_peer().await;
        send_many(d, peer, 3, 3, |i| format!("m{i}")).await;
        let c2 = d.cursor(2);
        let v: Value = d
            .client
            .put("/v1/cursors/planner.inbox", &json!({ "cursor": c2 }))
            .await
            .unwrap();
        assert_eq!(v["cursor"], c2.as_str());
        for (path, body, code) in [
            // A cursor past the journal head can only be forged: refused, not stored.
            (
                "/v1/cursors/planner.inbox",
                json!({ "cursor": d.cursor(99) }),
                "bad_cursor",
            ),
            (
                "/v1/cursors/bad%20name",
                json!({ "cursor": c2 }),
                "bad_request",
            ),
        ] {
            d.expect_error(
                (Method::PUT, path),
                Some(&body),
                (StatusCode::BAD_REQUEST, code),
            )
            .await;
        }
        d.stop().await;

        d.restart().await;
        let v: Value = d.client.get("/v1/cursors/planner.inbox").await.unwrap();
        assert_eq!(v["cursor"], c2.as_str());
        let page = d.page(&c2, 100).await;
        assert_eq!(
            page.entries.iter().filter_map(body_of).collect::<Vec<_>>(),
            ["m2"]
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_subscriber_lags_alone_and_its_loss_is_a_durable_record() {
    const N: usize = 3000;
    // The stopped subscriber lags once its buffer and socket are full
    // and it has taken nothing for the stall time; the reading one,
    // however slowed by a busy machine, keeps taking entries.
    let opts = Opts {
        subscriber_buffer: 256,
        subscriber_stall: Duration::from_secs(3),
        ..Opts::default()
    };
    with_node(opts, async |d| {
        let peer = d.add_absent_peer().await;

        // The stopped subscriber: its response has started, then nobody reads.
        let mut stopped = open_unread_subscription(d.socket()).await;
        // The reading subscriber collects every message and the loss record.
        let sub = d.client.subscribe("/v1/subscribe").await.unwrap();
        let reader = spawn_reader(sub, None, |s| s.losses > 0 && s.bodies.len() == N);

        // Writers are never held up by the stopped subscriber.
        let pad = "x".repeat(2048);
        let body = |i| format!("{i:05}{pad}");
        send_many(d, peer, N, 50, body).await;

        let seen = reader.await.unwrap();
        assert_eq!(seen.lagged, 0, "the reading subscriber never lagged");
        let want: Vec<String> = (0..N).map(body).collect();
        assert!(
            seen.bodies == want,
            "the reading subscriber got every message once, in order"
        );

        // The stopped one, once it reads again, drains what was buffered and
        // is told where to resume.
        let lagged = read_until_lagged(&mut stopped).await;
        assert!(lagged.loss_recorded);
        assert!(lagged.skipped_from >= 1 && lagged.skipped_to >= lagged.skipped_from);
        assert_eq!(lagged.resume, d.cursor(lagged.skipped_from - 1));
        d.stop().await;

        // The loss record is in the journal after a restart.
        d.restart().await;
        let losses = d.losses().await;
        assert!(
            losses.iter().any(|l| l.reason == "subscriber_lagged"
                && (l.from, l.to) == (lagged.skipped_from, lagged.skipped_to)
                && l.detail.contains("stopped reading")),
            "{losses:?}"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reading_subscriber_with_a_tiny_buffer_is_not_lagged_by_one_large_commit() {
    const N: usize = 400;
    // One commit puts 400 entries past a 2-entry buffer at once: the
    // reader is far behind the head, but it is reading, so it gets all.
    let opts = Opts {
        subscriber_buffer: 2,
        ..Opts::default()
    };
    with_node(opts, async |d| {
        let peer = d.add_absent_peer().await;
        let sub = d.client.subscribe("/v1/subscribe").await.unwrap();
        let reader = spawn_reader(sub, Some(d.id.clone()), |s| s.bodies.len() == N);
        let body = |i| format!("{i:05}");
        send_many(d, peer, N, N, body).await;
        let seen = reader.await.unwrap();
        assert_eq!((seen.lagged, seen.losses), (0, 0), "nothing but entries");
        let want: Vec<String> = (0..N).map(body).collect();
        assert_eq!(seen.bodies, want);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stopped_reading_does_not_hold_a_stopping_server() {
    with_node(Opts::default(), async |d| {
        let peer = d.add_absent_peer().await;
        // Fill the unread subscription's socket: ~4 MiB of entries, far
        // more than a Unix socket buffers, so its response stays mid-write.
        let mut stopped = open_unread_subscription(d.socket()).await;
        let pad = "x".repeat(4096);
        send_many(d, peer, 1000, 100, |i| format!("{i:05}{pad}")).await;
        let started = std::time::Instant::now();
        d.stop().await;
        // The server waited its grace period for the stuck response, then
        // cut it; the client sees the stream end once it reads again.
        assert!(
            started.elapsed() >= mesh_daemon::api::SHUTDOWN_GRACE / 2,
            "the stuck connection was given its grace period: {:?}",
            started.elapsed()
        );
        let mut sink = vec![0u8; 1 << 16];
        let mut total = 0usize;
        loop {
            match stopped.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        assert!(total > 0, "the buffered part of the stream was readable");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_sends_the_backlog_after_its_cursor_then_live_entries() {
    with_node(Opts::default(), async |d| {
        let peer = d.add_absent_peer().await;
        send_many(d, peer, 5, 5, |i| format!("old-{i}")).await;
        let path = format!("/v1/subscribe?after={}", d.cursor(3));
        let mut sub = d.client.subscribe(&path).await.unwrap();
        send_many(d, peer, 2, 1, |i| format!("new-{i}")).await;
        let mut bodies = Vec::new();
        while bodies.len() < 4 {
            let ev = sub.next().await.unwrap().unwrap();
            assert_eq!(ev.event, "entry");
            let e: EventEntry = serde_json::from_str(&ev.data).unwrap();
            bodies.push(body_of(&e).unwrap().to_owned());
        }
        assert_eq!(bodies, ["old-3", "old-4", "new-0", "new-1"]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unknown_peers_and_a_full_outbox_get_the_documented_errors() {
    let opts = Opts {
        outbox_msgs_max: Some(2),
        ..Opts::default()
    };
    with_node(opts, async |d| {
        let peer = d.add_absent_peer().await;
        let to = peer.to_string();
        let send = |v: Value| serde_json::to_vec(&v).unwrap();
        let bad = StatusCode::BAD_REQUEST;

        d.post_expect_error("/v1/send", b"{not json".to_vec(), (bad, "bad_json"))
            .await;
        let v = d
            .post_expect_error("/v1/send", br#"{"body":"hi"}"#.to_vec(), (bad, "bad_json"))
            .await;
        assert!(
            v["error"]["message"].as_str().unwrap().contains("`to`"),
            "{v}"
        );
        let huge =
            json!({ "to": to, "body": "x".repeat(mesh_daemon::api::SEND_REQUEST_BYTES_MAX) });
        d.post_expect_error("/v1/send", send(huge), (bad, "body_too_large"))
            .await;
        let nobody = json!({"to": "nobody", "body": "x"});
        d.post_expect_error("/v1/send", send(nobody), (bad, "bad_request"))
            .await;
        let stranger = random_key().public().to_string();
        let unknown = json!({"to": stranger, "body": "x"});
        let v = d
            .post_expect_error(
                "/v1/send",
                send(unknown),
                (StatusCode::NOT_FOUND, "unknown_peer"),
            )
            .await;
        assert_eq!(v["error"]["fault"], "not_found", "{v}");
        let path = format!("/v1/peers/{stranger}");
        d.expect_error(
            (Method::DELETE, &path),
            None,
            (StatusCode::NOT_FOUND, "unknown_peer"),
        )
        .await;
        d.expect_error(
            (Method::GET, "/v1/nothing"),
            None,
            (StatusCode::NOT_FOUND, "no_route"),
        )
        .await;
        let not_allowed = StatusCode::METHOD_NOT_ALLOWED;
        d.expect_error(
            (Method::DELETE, "/v1/events"),
            None,
            (not_allowed, "method_not_allowed"),
        )
        .await;
        d.post_expect_error("/v1/send/batch", b"[]".to_vec(), (bad, "bad_request"))
            .await;

        // Two fit; the third finds the outbox full of unacknowledged messages.
        for i in 0..2 {
            let v: Value = d
                .client
                .post("/v1/send", &json!({ "to": to, "body": format!("m{i}") }))
                .await
                .unwrap();
            assert_eq!(v["seq"], i + 1);
        }
        let full = json!({"to": to, "body": "m2"});
        let v = d
            .post_expect_error(
                "/v1/send",
                send(full.clone()),
                (StatusCode::TOO_MANY_REQUESTS, "outbox_full"),
            )
            .await;
        assert_eq!(v["error"]["fault"], "capacity", "{v}");
        let err = d.client.post::<Value>("/v1/send", &full).await.unwrap_err();
        assert!(
            matches!(
                err,
                ClientError::Api {
                    status: 429,
                    fault: Fault::Capacity,
                    ..
                }
            ),
            "{err}"
        );
        // Nothing of the refused sends reached the journal.
        let page: EventsPage = d.client.get("/v1/events").await.unwrap();
        assert_eq!(
            page.entries.iter().filter_map(body_of).collect::<Vec<_>>(),
            ["m0", "m1"]
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ndjson_batch_commits_line_by_line_and_says_how_far_it_got() {
    with_node(Opts::default(), async |d| {
        let peer = d.add_absent_peer().await;
        let line = |i: usize| {
            format!(
                "{}\n",
                json!({ "to": peer.to_string(), "body": format!("n{i}") })
            )
        };
        let body: String = (0..600).map(line).collect();
        let mut lines = post_ndjson(d, one_chunk(body)).await.unwrap();
        let mut answers = Vec::new();
        while let Some(l) = lines.next_line().await.unwrap() {
            answers.push(serde_json::from_str::<Value>(&l).unwrap());
        }
        assert_eq!(answers.len(), 601);
        assert_eq!(answers[599]["seq"], 600);
        assert_eq!(answers[600], json!({ "done": { "count": 600 } }));

        // A bad line after the answer has started: the lines before it are
        // committed, and the last answer line says so.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
        let body = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        tx.send(Ok(format!("{}{}", line(0), line(1)).into()))
            .await
            .unwrap();
        let mut lines = post_ndjson(d, body).await.unwrap();
        for _ in 0..2 {
            let v: Value =
                serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
            assert!(v["seq"].is_u64(), "{v}");
        }
        tx.send(Ok(format!("not json\n{}", line(2)).into()))
            .await
            .unwrap();
        drop(tx);
        let last: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "bad_json", "{last}");
        assert_eq!(last["error"]["committed"], 2, "{last}");
        assert!(
            last["error"]["message"]
                .as_str()
                .unwrap()
                .contains("line 3"),
            "{last}"
        );
        assert_eq!(lines.next_line().await.unwrap(), None);

        // A bad line in the first chunk: an error status, nothing of it committed.
        let body = format!("{}{}not json\n{}", line(0), line(1), line(2));
        let mut lines = post_ndjson(d, one_chunk(body)).await;
        // The first chunk holds the bad line, so the whole answer is an error status.
        match &mut lines {
            Err(ClientError::Api {
                status: 400,
                code,
                message,
                ..
            }) => {
                assert_eq!(code, "bad_json");
                assert!(message.contains("line 3"), "{message}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a bad first chunk must not answer 200"),
        }
        let page: EventsPage = d.client.get("/v1/events?limit=1000").await.unwrap();
        assert_eq!(
            page.entries.len(),
            602,
            "nothing of a refused chunk was committed"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_ticket_peers_and_metrics_answer_json_and_prometheus_text() {
    with_node(Opts::default(), async |d| {
        let peer = d.add_absent_peer().await;
        let v: Value = d.client.get("/v1/status").await.unwrap();
        assert_eq!(v["node"], d.id);
        assert!(v["journal_head"].is_u64());
        let v: Value = d.client.get("/v1/ticket").await.unwrap();
        let t: NodeTicket = v["ticket"].as_str().unwrap().parse().unwrap();
        assert_eq!(t.node, d.node_id());
        let v: Value = d.client.get("/v1/peers").await.unwrap();
        assert_eq!(v["peers"][0]["node"], peer.to_string());
        let bad_ticket = json!({ "ticket": "meshnode1nope" });
        d.expect_error(
            (Method::POST, "/v1/peers"),
            Some(&bad_ticket),
            (StatusCode::BAD_REQUEST, "bad_request"),
        )
        .await;
        let v: Value = d.client.delete(&format!("/v1/peers/{peer}")).await.unwrap();
        assert_eq!(v["removed"], peer.to_string());
        let text = d.metrics_text().await;
        assert!(
            text.contains("mesh_api_requests_total{class=\"ok\"}"),
            "{text}"
        );
        // The bus's counters are there too.
        assert!(text.contains("\nmesh_commits_total "), "{text}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_with_each_family_once() {
    with_node(Opts::default(), async |d| {
        let peer = d.add_absent_peer().await;
        send_many(d, peer, 3, 3, |i| format!("m{i}")).await;
        let text = d.metrics_text().await;
        let families = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for (name, kind) in [
            ("mesh_api_requests_total", "counter"),
            ("mesh_api_sent_total", "counter"),
            ("mesh_api_subscribers", "gauge"),
            ("mesh_journal_head", "gauge"),
            ("mesh_commits_total", "counter"),
            ("mesh_sends_ok_total", "counter"),
            ("mesh_frames_dropped_total", "counter"),
        ] {
            let f = families
                .get(name)
                .unwrap_or_else(|| panic!("no {name} in\n{text}"));
            assert_eq!(f.kind, kind, "{name}");
        }
        assert_eq!(
            families["mesh_journal_head"].samples,
            [(String::new(), 3.0)]
        );
        assert_eq!(
            families["mesh_api_sent_total"].samples,
            [(String::new(), 3.0)]
        );
        assert_eq!(
            families["mesh_frames_dropped_total"].samples.len(),
            mesh_bus::DropReason::ALL.len(),
            "one sample per drop reason"
        );
        // The checker itself refuses a family given twice.
        let twice = format!("{text}# TYPE mesh_journal_head gauge\nmesh_journal_head 3\n");
        assert!(parse_prometheus(&twice).is_err());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_socket_is_refused_as_another_daemon_and_a_stale_one_is_replaced() {
    bounded(async {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("mesh.sock");
        let first = ApiSocket::bind(&path).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let err = ApiSocket::bind(&path).await.unwrap_err();
        assert!(matches!(err, BindError::AnotherDaemon { .. }), "{err}");
        assert!(err.to_string().contains("another mesh daemon is running"));
        // A daemon that died leaves its socket file behind.
        drop(first);
        assert!(path.exists());
        let again = ApiSocket::bind(&path).await.unwrap();
        drop(again);
        // Something that is not a socket is never removed.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"precious").unwrap();
        let err = ApiSocket::bind(&path).await.unwrap_err();
        assert!(matches!(err, BindError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_daemon_removes_its_socket_and_clients_say_it_is_not_running() {
    with_node(Opts::default(), async |d| {
        let client = d.client.clone();
        let socket = d.socket().to_owned();
        // An open subscription does not hold the shutdown up.
        let mut sub = client.subscribe("/v1/subscribe").await.unwrap();
        d.stop().await;
        assert!(sub.next().await.map(|e| e.is_none()).unwrap_or(true));
        assert!(!socket.exists());
        let err = client.get::<Value>("/v1/status").await.unwrap_err();
        assert!(err.to_string().contains("not running"), "{err}");
        assert!(err.to_string().contains(&socket.display().to_string()));
        assert_eq!(err.fault(), Fault::Unavailable);
    })
    .await
}
