//! Real daemons end to end: each node is a full `mesh_daemon::Daemon` (redb
//! store, bus node on an iroh endpoint bound to 127.0.0.1, local API on a
//! real Unix socket in a temp dir), started and stopped in this process and
//! driven only through its socket API (`common::TestNode`).
//!
//! Nothing here sleeps to synchronise: every wait polls the API with short
//! intervals and a bounded number of tries, and every test has a deadline.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;
use common::{
    TestNode, bounded, error_code, in_order, link, open_unread_subscription, read_until_lagged,
    spawn_reader, texts, wait_connected, wait_for,
};
use std::path::Path;

use hyper::{Method, StatusCode};
use mesh_api::client::Client;
use mesh_api::{EventRecord, EventsPage};
use serde_json::{Value, json};

/// How the two nodes of a test start.
#[derive(Clone, Copy, Default)]
struct Pair<'a> {
    /// `config.toml` of a and of b.
    configs: [Option<&'a str>; 2],
    /// Whether a and b add each other and wait until they are connected.
    linked: bool,
}

/// Runs `test` on nodes a and b in a temp dir (given, for more nodes), then
/// stops those still running; fails the test after `common::TEST_TIMEOUT`.
async fn with_pair(pair: Pair<'_>, test: impl AsyncFnOnce(&Path, &mut TestNode, &mut TestNode)) {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let mut a = TestNode::start(tmp.path(), "a", pair.configs[0]).await;
        let mut b = TestNode::start(tmp.path(), "b", pair.configs[1]).await;
        if pair.linked {
            link(&a, &b).await;
        }
        test(tmp.path(), &mut a, &mut b).await;
        for n in [&mut a, &mut b] {
            if n.is_running() {
                n.stop().await;
            }
        }
    })
    .await
}

const LINKED: Pair<'static> = Pair {
    configs: [None, None],
    linked: true,
};

/// `(seq, body)` of every message in `entries`, in order.
fn messages(entries: &[mesh_api::EventEntry]) -> Vec<(u64, String)> {
    entries
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Envelope { seq, body, .. } => Some((*seq, body.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_linked_daemons_send_both_ways_exactly_once_and_in_order() {
    with_pair(LINKED, async |_, a, b| {
        let (s, v) = a
            .raw(
                Method::POST,
                "/v1/send",
                Some(&json!({ "to": b.id, "body": "hello b" })),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["seq"], 1);
        assert_eq!(v["stream"]["author"], a.id.as_str());
        assert_eq!(v["stream"]["channel"], format!("direct:{}", b.id));
        let to_b = texts("a-to-b", 5);
        let to_a = texts("b-to-a", 7);
        assert_eq!(a.send_all(&b.id, &to_b, 2).await, [2, 3, 4, 5, 6]);
        assert_eq!(b.send_all(&a.id, &to_a, 3).await, [1, 2, 3, 4, 5, 6, 7]);

        let mut want_b = vec!["hello b".to_owned()];
        want_b.extend(to_b);
        assert_eq!(b.wait_received(&a.id, 6).await, in_order(&want_b));
        assert_eq!(a.wait_received(&b.id, 7).await, in_order(&to_a));

        // Each side's own sends are in its journal too, and each has
        // acknowledged all it got: nothing stays queued, the marks say so.
        assert_eq!(a.journal().await.len(), 6 + 7);
        wait_for("both outboxes to be acknowledged", async || {
            let qa = a.peer(&b.id).await["queued_msgs"] == 0;
            let qb = b.peer(&a.id).await["queued_msgs"] == 0;
            (qa && qb).then_some(())
        })
        .await;
        let marks = b.peer(&a.id).await["marks"].clone();
        assert_eq!(marks[0]["mark"], 6, "{marks}");
        assert_eq!(marks[0]["stream"]["author"], a.id.as_str());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_1000_gets_its_seqs_in_request_order() {
    with_pair(Pair::default(), async |_, a, b| {
        a.add_peer(&b.ticket().await).await;
        b.stop().await;
        let bodies = texts("o", 1000);
        let seqs = a.send_all(&b.id, &bodies, 1000).await;
        assert_eq!(seqs, (1..=1000).collect::<Vec<u64>>());
        // The journal pairs each seq with the body sent in that position.
        let sent = messages(&a.journal().await);
        assert!(sent == in_order(&bodies), "seqs follow the request order");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_stopped_while_1000_messages_are_sent_to_it_gets_all_exactly_once_in_order() {
    with_pair(LINKED, async |_, a, b| {
        let bodies = texts("m", 1000);
        // The first 300 go while b is up (some may still be in flight when it stops).
        a.send_all(&b.id, &bodies[..300], 100).await;
        b.stop().await;
        let seqs = a.send_all(&b.id, &bodies[300..], 100).await;
        assert_eq!(seqs, (301..=1000).collect::<Vec<u64>>());
        let queued = a.peer(&b.id).await["queued_msgs"].as_u64().unwrap();
        assert!(
            queued >= 700,
            "a holds what b has not acknowledged: {queued}"
        );

        b.restart().await;
        assert_eq!(b.wait_received(&a.id, 1000).await, in_order(&bodies));
        wait_for("a's outbox to be acknowledged", async || {
            (a.peer(&b.id).await["queued_msgs"] == 0).then_some(())
        })
        .await;
        // Nothing arrives twice later either: a fresh read still has 1000.
        assert_eq!(b.received_from(&a.id).await.len(), 1000);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_events_one_at_a_time_over_1000_received_returns_each_exactly_once_across_a_restart()
{
    with_pair(LINKED, async |_, a, b| {
        let bodies = texts("p", 1000);
        a.send_all(&b.id, &bodies, 250).await;
        b.wait_received(&a.id, 1000).await;

        let mut after = String::new();
        let mut seen = b.page_one_by_one(&mut after, 400).await;
        assert_eq!(seen.len(), 400);
        b.stop().await;
        b.restart().await;
        let rest = b.page_one_by_one(&mut after, 601).await;
        assert_eq!(rest.len(), 600, "no more entries than were received");
        seen.extend(rest);
        assert_eq!(messages(&seen), in_order(&bodies));
        assert_eq!(seen.len(), 1000, "only messages");
        let arrivals: Vec<u64> = seen.iter().map(|e| e.arrival).collect();
        let mut sorted = arrivals.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), 1000, "each arrival exactly once");
        assert!(arrivals.windows(2).all(|w| w[0] < w[1]), "in arrival order");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_from_another_node_is_refused_with_409_and_changes_nothing() {
    with_pair(LINKED, async |_, a, b| {
        a.send_all(&b.id, &texts("c", 2), 2).await;
        let foreign = a.page("", 100).await.next;
        let conflict = StatusCode::CONFLICT;
        for path in [
            format!("/v1/events?after={foreign}"),
            format!("/v1/subscribe?after={foreign}"),
        ] {
            let v = b
                .expect_error((Method::GET, &path), None, (conflict, "cursor_other_node"))
                .await;
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains("only valid on the node that issued them"),
                "{msg}"
            );
        }
        let put = json!({ "cursor": foreign });
        b.expect_error(
            (Method::PUT, "/v1/cursors/agent"),
            Some(&put),
            (conflict, "cursor_other_node"),
        )
        .await;
        b.assert_no_cursor("agent").await;
        // On the node that issued it, the same cursor pages on.
        a.ok(Method::GET, &format!("/v1/events?after={foreign}"), None)
            .await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_unknown_peer_oversized_body_and_full_outbox_give_the_documented_errors() {
    let pair = Pair {
        configs: [
            Some(
                "[outbox]
max_msgs = 3
",
            ),
            None,
        ],
        linked: false,
    };
    with_pair(pair, async |tmp, a, b| {
        // b exists but is offline: nothing a sends it is ever acknowledged.
        let b_ticket = b.ticket().await;
        b.stop().await;
        a.add_peer(&b_ticket).await;
        let bad = StatusCode::BAD_REQUEST;
        let send = |v: Value| serde_json::to_vec(&v).unwrap();

        a.post_expect_error("/v1/send", b"{\"to\": ".to_vec(), (bad, "bad_json"))
            .await;
        a.post_expect_error("/v1/peers", b"[1, 2]".to_vec(), (bad, "bad_json"))
            .await;

        let mut stranger = TestNode::start(tmp, "stranger", None).await;
        let hi = json!({ "to": stranger.id, "body": "hi" });
        let v = a
            .post_expect_error("/v1/send", send(hi), (StatusCode::NOT_FOUND, "unknown_peer"))
            .await;
        assert!(v["error"]["message"].as_str().unwrap().contains("mesh peer add"), "{v}");
        let path = format!("/v1/peers/{}", stranger.id);
        a.expect_error((Method::DELETE, &path), None, (StatusCode::NOT_FOUND, "unknown_peer"))
            .await;
        stranger.stop().await;

        let huge = json!({ "to": b.id, "body": "x".repeat(mesh_daemon::api::SEND_REQUEST_BYTES_MAX) });
        a.post_expect_error("/v1/send", send(huge), (bad, "body_too_large"))
            .await;
        let big = json!({ "to": b.id, "body": "x".repeat(mesh_protocol::MAX_BATCH_PAYLOAD_BYTES as usize + 1) });
        a.post_expect_error("/v1/send", send(big), (bad, "bad_request"))
            .await;

        // Three fit in the outbox; the fourth finds it full of unacknowledged
        // messages and is refused with nothing written.
        assert_eq!(a.send_all(&b.id, &texts("f", 3), 1).await, [1, 2, 3]);
        let fourth = json!({ "to": b.id, "body": "f-0003" });
        a.post_expect_error("/v1/send", send(fourth), (StatusCode::TOO_MANY_REQUESTS, "outbox_full"))
            .await;
        let bodies: Vec<String> = messages(&a.journal().await).into_iter().map(|(_, b)| b).collect();
        assert_eq!(bodies, texts("f", 3));
        assert_eq!(a.peer(&b.id).await["queued_msgs"], 3);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_subscriber_lags_alone_and_its_loss_is_a_durable_record() {
    const N: usize = 2000;
    // The stopped subscriber lags once its 512-entry buffer and its
    // socket are full and it has taken nothing for 3 s.
    let pair = Pair {
        configs: [
            None,
            Some(
                "[api]
subscriber_buffer = 512
subscriber_stall_ms = 3000
",
            ),
        ],
        linked: true,
    };
    with_pair(pair, async |_, a, b| {
        // On b, one subscriber stops reading after the response head, one reads.
        let mut stopped = open_unread_subscription(b.socket()).await;
        let sub = b.client.subscribe("/v1/subscribe").await.unwrap();
        let last = format!("{:05}", N - 1);
        // Up to the last message, so that a lag of its own ends it too.
        let reader = spawn_reader(sub, Some(a.id.clone()), move |s| {
            s.bodies.last().is_some_and(|b| b.starts_with(&last))
        });

        // a's messages come to b over the bus; b's journal grows while the
        // stopped subscriber's socket and buffer fill up.
        let pad = "x".repeat(4096);
        let bodies: Vec<String> = (0..N).map(|i| format!("{i:05}{pad}")).collect();
        a.send_all(&b.id, &bodies, 50).await;
        let seen = reader.await.unwrap();
        assert_eq!(seen.lagged, 0, "the reading subscriber never lagged");
        assert!(
            seen.bodies == bodies,
            "the reading subscriber got every message once, in order"
        );

        // The stopped one's loss is in the journal, among the messages (the
        // reader saw it live unless it came after the last message).
        let loss_seen = wait_for("the subscriber's loss record", async || {
            let losses = b.losses().await;
            (!losses.is_empty()).then_some(losses)
        })
        .await;
        assert_eq!(loss_seen.len(), 1, "{loss_seen:?}");
        assert!(seen.losses <= 1, "{}", seen.losses);

        // Once the stopped one reads again, it is told what it missed.
        let lagged = read_until_lagged(&mut stopped).await;
        assert!(lagged.loss_recorded, "{lagged:?}");
        assert!(lagged.skipped_to >= lagged.skipped_from, "{lagged:?}");
        drop(stopped);

        // The loss is durable: after a restart the journal still has it, in place.
        b.stop().await;
        b.restart().await;
        let journal = b.journal().await;
        let loss = b
            .losses()
            .await
            .pop()
            .expect("a loss record in the journal");
        assert_eq!(loss.reason, "subscriber_lagged");
        assert_eq!(
            (loss.from, loss.to),
            (lagged.skipped_from, lagged.skipped_to)
        );
        assert!(
            loss.arrival > lagged.skipped_from,
            "recorded after what it names"
        );
        assert!(loss.detail.contains(&lagged.resume), "{}", loss.detail);
        // The skipped entries are still there to re-read from the resume cursor.
        let page: EventsPage = b.page(&lagged.resume, 1).await;
        assert_eq!(page.entries[0].arrival, lagged.skipped_from);
        assert_eq!(journal.len(), N + 1);
    })
    .await
}

/// Set in the helper process that connects as another uid.
const HELPER_ENV: &str = "MESH_E2E_OTHER_UID_SOCKET";
/// The uid the helper runs as ("nobody").
const OTHER_UID: u32 = 65534;

/// Not a test on its own: the body of the helper process (a no-op otherwise).
#[test]
fn other_uid_helper() {
    let Ok(socket) = std::env::var(HELPER_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = Client::new(socket);
        for (method, path, body) in [
            (Method::GET, "/v1/status", None),
            (Method::POST, "/v1/peers", Some(json!({ "ticket": "x" }))),
            (
                Method::PUT,
                "/v1/cursors/intruder",
                Some(json!({ "cursor": "" })),
            ),
        ] {
            let (s, b) = c.raw(method, path, body.as_ref()).await.unwrap();
            let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
            println!(
                "HELPER {path} STATUS={} CODE={}",
                s.as_u16(),
                error_code(&v)
            );
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_is_refused_with_403_and_changes_nothing() {
    if mesh_daemon::api::daemon_uid() != 0 {
        println!(
            "skipped: connecting as another uid needs root to start the helper as uid {OTHER_UID}"
        );
        return;
    }
    bounded(async {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let tmp = tempfile::tempdir().unwrap();
        let mut a = TestNode::start(tmp.path(), "a", None).await;
        // The 0700 dirs and the 0600 socket keep other users out already;
        // open them up to prove the SO_PEERCRED check refuses on its own.
        let socket = a.client.socket().to_owned();
        for dir in [tmp.path(), a.dir.as_path()] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "other_uid_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, &socket)
        .uid(OTHER_UID)
        .gid(OTHER_UID);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        for path in ["/v1/status", "/v1/peers", "/v1/cursors/intruder"] {
            assert!(
                stdout.contains(&format!("HELPER {path} STATUS=403 CODE=forbidden")),
                "helper said: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let (s, v) = a.raw(Method::GET, "/v1/cursors/intruder", None).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::NOT_FOUND, "unknown_cursor")
        );
        assert_eq!(a.status().await["peers"], json!([]));
        let (_, bytes) = a
            .client
            .raw(Method::GET, "/metrics", None::<&()>)
            .await
            .unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(text.contains("mesh_api_refused_uid_total 3"), "{text}");
        a.stop().await;
    })
    .await
}

/// `POST /v1/peers/{id}/pause` and `/resume`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_peer_gets_nothing_and_is_refused_then_everything_once_in_order_after_resume() {
    with_pair(LINKED, async |_, a, b| {
        let st = a.status().await;
        assert_eq!(st["pid"], std::process::id(), "{st}");
        assert_eq!(a.peer(&b.id).await["paused"], false);

        let p = a
            .ok(Method::POST, &format!("/v1/peers/{}/pause", b.id), None)
            .await;
        assert_eq!((&p["node"], &p["paused"]), (&json!(b.id), &json!(true)));
        assert_eq!(p["connected"], false, "closed before the answer: {p}");
        let listed = a.ok(Method::GET, "/v1/peers", None).await;
        assert_eq!(listed["peers"][0]["paused"], true, "{listed}");

        // Sends are committed and queued as for an offline peer.
        let bodies = texts("p", 300);
        a.send_all(&b.id, &bodies, 100).await;
        assert_eq!(a.peer(&b.id).await["queued_msgs"], 300);

        // B keeps dialing A (it has A's ticket); A refuses each dial.
        wait_for("a to refuse b's dials", async || {
            (a.metric("mesh_link_paused_refused_total").await >= 2).then_some(())
        })
        .await;
        assert_eq!(b.peer(&a.id).await["connected"], false);
        assert_eq!(a.peer(&b.id).await["connected"], false);
        assert!(b.received_from(&a.id).await.is_empty(), "b got messages");
        assert_eq!(a.peer(&b.id).await["queued_msgs"], 300);

        let p = a
            .ok(Method::POST, &format!("/v1/peers/{}/resume", b.id), None)
            .await;
        assert_eq!(p["paused"], false, "{p}");
        wait_for("every message to be acknowledged", async || {
            (a.peer(&b.id).await["queued_msgs"] == 0).then_some(())
        })
        .await;
        assert!(
            b.received_from(&a.id).await == in_order(&bodies),
            "once each, in order"
        );
        wait_connected(a, b).await;

        // An unknown peer, and a bad id, are the caller's errors.
        let stranger = "0".repeat(64);
        let (s, v) = a
            .raw(Method::POST, &format!("/v1/peers/{stranger}/pause"), None)
            .await;
        assert_eq!((s, error_code(&v)), (StatusCode::NOT_FOUND, "unknown_peer"));
        let (s, v) = a
            .raw(Method::POST, "/v1/peers/not-an-id/resume", None)
            .await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::BAD_REQUEST, "bad_request")
        );
    })
    .await
}
