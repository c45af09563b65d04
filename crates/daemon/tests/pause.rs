//! `POST /v1/peers/{id}/pause` and `/resume` between two real daemons (redb
//! stores, iroh endpoints on 127.0.0.1, API sockets in a temp dir), driven
//! only through their socket APIs. Waits poll with short intervals and a
//! bounded number of tries; the test has a deadline.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

#[allow(dead_code)] // Not every shared helper is used here.
mod common;
use common::{bounded, error_code, wait_for};
use std::net::SocketAddr;
use std::path::Path;

use hyper::{Method, StatusCode};
use mesh_daemon::api::json::{EventRecord, EventsPage};
use mesh_daemon::client::Client;
use mesh_daemon::paths::DataDir;
use mesh_daemon::run::Daemon;
use serde_json::{Value, json};

struct Node {
    id: String,
    client: Client,
    daemon: Daemon,
}

impl Node {
    async fn start(tmp: &Path, name: &str) -> Node {
        let bind = SocketAddr::from(([127, 0, 0, 1], 0));
        let daemon = Daemon::start(DataDir::resolve(Some(&tmp.join(name))).unwrap(), Some(bind))
            .await
            .unwrap();
        let client = daemon.client();
        let st: Value = client.get("/v1/status").await.unwrap();
        let id = st["node"].as_str().unwrap().to_owned();
        Node { id, client, daemon }
    }

    async fn raw(&self, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let (status, bytes) = self.client.raw(method, path, body).await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn ok(&self, method: Method, path: &str, body: Option<&Value>) -> Value {
        let (s, v) = self.raw(method, path, body).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        v
    }

    async fn peer(&self, id: &str) -> Value {
        let st = self.ok(Method::GET, "/v1/status", None).await;
        st["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["node"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no peer {id} in {st}"))
    }

    /// `(seq, body)` of every message from `author` in the journal, in order.
    async fn received_from(&self, author: &str) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        let mut after = String::new();
        loop {
            let page: EventsPage = self
                .client
                .get(&format!("/v1/events?after={after}&limit=1000"))
                .await
                .unwrap();
            if page.entries.is_empty() {
                return out;
            }
            for e in page.entries {
                if let EventRecord::Envelope {
                    stream, seq, body, ..
                } = e.record
                    && stream.author == author
                {
                    out.push((seq, body));
                }
            }
            after = page.next;
        }
    }

    /// The value of the Prometheus sample `name` in `GET /metrics`.
    async fn metric(&self, name: &str) -> u64 {
        let (s, bytes) = self
            .client
            .raw(Method::GET, "/metrics", None::<&Value>)
            .await
            .unwrap();
        assert_eq!(s, StatusCode::OK);
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }
}

async fn connected(a: &Node, b: &Node) -> bool {
    a.peer(&b.id).await["connected"] == true && b.peer(&a.id).await["connected"] == true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_peer_gets_nothing_and_is_refused_then_everything_once_in_order_after_resume() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let a = Node::start(tmp.path(), "a").await;
        let b = Node::start(tmp.path(), "b").await;
        let a_ticket = a.ok(Method::GET, "/v1/ticket", None).await["ticket"].clone();
        let b_ticket = b.ok(Method::GET, "/v1/ticket", None).await["ticket"].clone();
        a.ok(
            Method::POST,
            "/v1/peers",
            Some(&json!({ "ticket": b_ticket })),
        )
        .await;
        b.ok(
            Method::POST,
            "/v1/peers",
            Some(&json!({ "ticket": a_ticket })),
        )
        .await;
        wait_for("a and b to connect", async || {
            connected(&a, &b).await.then_some(())
        })
        .await;
        let st = a.ok(Method::GET, "/v1/status", None).await;
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
        let bodies: Vec<String> = (0..300).map(|i| format!("p-{i:03}")).collect();
        for chunk in bodies.chunks(100) {
            let items: Vec<Value> = chunk
                .iter()
                .map(|t| json!({ "to": b.id, "body": t }))
                .collect();
            a.ok(Method::POST, "/v1/send/batch", Some(&Value::Array(items)))
                .await;
        }
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
        let want: Vec<(u64, String)> = (1..).zip(bodies).collect();
        assert!(b.received_from(&a.id).await == want, "once each, in order");
        assert!(connected(&a, &b).await);

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
        a.daemon.shutdown().await;
        b.daemon.shutdown().await;
    })
    .await
}
