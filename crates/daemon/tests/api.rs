//! The local API on a real Unix socket in front of a real redb store.
//!
//! The bus is not here yet: `TestNode` is a minimal `NodeApi` that signs and
//! commits sends through the store's group-commit actor, the way the driver
//! will, so everything the journal routes show was really committed.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;
use common::{bounded, error_code, open_unread_subscription};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::{Method, StatusCode};
use mesh_daemon::api::json::{EventEntry, EventRecord, EventsPage, LaggedEvent};
use mesh_daemon::api::{
    ApiError, ApiParts, ApiSocket, ApiState, BindError, BoxFuture, NodeApi, NodeStatus, OutMessage,
    PeerStatus, Sent, StoreWriter, publish_head, serve,
};
use mesh_daemon::client::{Client, ClientError};
use mesh_protocol::{
    Channel, Cursor, Epoch, NewEnvelope, NodeId, NodeTicket, OpenBatch, SecretKey, Seq, StreamId,
};
use mesh_store::{
    Arrival, MeshStore, OnFull, OutboxBounds, PeerRecord, RedbStore, StoreHandle, WriteOp,
};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{oneshot, watch};

fn random_key() -> SecretKey {
    SecretKey::from_bytes(&rand::random::<[u8; 32]>())
}

/// A minimal node: sends are signed and committed through the store actor.
struct TestNode {
    secret: SecretKey,
    epoch: Epoch,
    handle: StoreHandle<RedbStore>,
    head: Arc<watch::Sender<Arrival>>,
    bounds: OutboxBounds,
    next_seq: tokio::sync::Mutex<HashMap<NodeId, Seq>>,
    peers: Mutex<HashSet<NodeId>>,
}

impl TestNode {
    fn peer_status(node: NodeId) -> PeerStatus {
        PeerStatus {
            node: node.to_string(),
            addrs: vec![],
            connected: false,
            epoch: None,
            marks: vec![],
            queued_msgs: 0,
            outbox_bytes: 0,
            paused: false,
        }
    }
}

impl NodeApi for TestNode {
    fn send_batch(&self, msgs: Vec<OutMessage>) -> BoxFuture<'_, Result<Vec<Sent>, ApiError>> {
        Box::pin(async move {
            {
                let peers = self.peers.lock().unwrap();
                if let Some(m) = msgs.iter().find(|m| !peers.contains(&m.to)) {
                    return Err(ApiError::UnknownPeer(m.to));
                }
            }
            // One sender at a time keeps the seqs dense, as the bus does.
            let mut next = self.next_seq.lock().await;
            let mut planned = next.clone();
            let mut ops = Vec::new();
            let mut sent = Vec::new();
            for m in &msgs {
                let seq = planned.entry(m.to).or_insert(1);
                // Nothing is ever acknowledged here: the outbox holds every seq
                // sent. The bus core would refuse the send the same way.
                if *seq > self.bounds.max_msgs {
                    return Err(ApiError::OutboxFull(format!(
                        "outbox for peer {} is full ({} msgs unacknowledged)",
                        m.to.fmt_short(),
                        *seq - 1
                    )));
                }
                let batch = OpenBatch::sign(
                    &self.secret,
                    self.epoch,
                    Channel::Direct(m.to),
                    *seq,
                    vec![NewEnvelope {
                        lamport: *seq,
                        created_ms: 1,
                        kind: m.kind,
                        payload: m.body.clone(),
                    }],
                )
                .map_err(|e| ApiError::BadRequest(e.to_string()))?;
                ops.push(WriteOp::AppendOwn { batch, evict: None });
                sent.push((
                    StreamId::direct(self.secret.public(), self.epoch, m.to),
                    *seq,
                ));
                *seq += 1;
            }
            let receipt = self.handle.commit(ops).await?;
            publish_head(&self.head, &receipt);
            *next = planned;
            let (first, _) = receipt
                .arrivals
                .ok_or_else(|| ApiError::Internal("no arrivals".into()))?;
            Ok(sent
                .into_iter()
                .enumerate()
                .map(|(i, (stream, seq))| Sent {
                    stream,
                    seq,
                    arrival: first + i as u64,
                })
                .collect())
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<NodeStatus, ApiError>> {
        Box::pin(async move {
            Ok(NodeStatus {
                node: self.secret.public().to_string(),
                epoch: self.epoch.to_string(),
                addrs: vec![],
                ticket: NodeTicket::new(self.secret.public(), vec![])
                    .unwrap()
                    .to_string(),
                peers: vec![],
                store_bytes: None,
            })
        })
    }

    fn ticket(&self) -> BoxFuture<'_, Result<NodeTicket, ApiError>> {
        Box::pin(async move {
            NodeTicket::new(self.secret.public(), vec![])
                .map_err(|e| ApiError::Internal(e.to_string()))
        })
    }

    fn add_peer(&self, ticket: NodeTicket) -> BoxFuture<'_, Result<PeerStatus, ApiError>> {
        Box::pin(async move {
            self.handle
                .commit(vec![WriteOp::PutPeer(PeerRecord {
                    node: ticket.node,
                    addrs: ticket.addrs.clone(),
                    epoch: None,
                })])
                .await?;
            self.peers.lock().unwrap().insert(ticket.node);
            Ok(Self::peer_status(ticket.node))
        })
    }

    fn list_peers(&self) -> BoxFuture<'_, Result<Vec<PeerStatus>, ApiError>> {
        Box::pin(async move {
            let peers = self.peers.lock().unwrap();
            Ok(peers.iter().map(|p| Self::peer_status(*p)).collect())
        })
    }

    fn remove_peer(&self, node: NodeId) -> BoxFuture<'_, Result<(), ApiError>> {
        Box::pin(async move {
            if !self.peers.lock().unwrap().contains(&node) {
                return Err(ApiError::UnknownPeer(node));
            }
            self.handle.commit(vec![WriteOp::RemovePeer(node)]).await?;
            self.peers.lock().unwrap().remove(&node);
            Ok(())
        })
    }
}

/// Options of a test daemon.
#[derive(Clone, Copy)]
struct Opts {
    subscriber_buffer: usize,
    subscriber_stall: Duration,
    bounds: OutboxBounds,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            subscriber_buffer: 1024,
            subscriber_stall: Duration::from_secs(5),
            bounds: OutboxBounds::default(),
        }
    }
}

/// A daemon's API on a real socket over a real store in `dir`.
struct Daemon {
    client: Client,
    socket: PathBuf,
    node: NodeId,
    epoch: Epoch,
    handle: StoreHandle<RedbStore>,
    stop: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Daemon {
    async fn start(dir: &Path, secret: &SecretKey, opts: Opts) -> Daemon {
        let store = Arc::new(RedbStore::open(dir).unwrap());
        let epoch = store.meta().epoch;
        let head = Arc::new(watch::Sender::new(store.journal_head().unwrap()));
        let handle = StoreHandle::spawn(store.clone()).unwrap();
        let peers = store.peers().unwrap().into_iter().map(|p| p.node).collect();
        let next_seq = store
            .own_streams()
            .unwrap()
            .into_iter()
            .filter_map(|s| Some((s.stream.recipient()?, s.next_seq)))
            .collect();
        let node_api = Arc::new(TestNode {
            secret: secret.clone(),
            epoch,
            handle: handle.clone(),
            head: head.clone(),
            bounds: opts.bounds,
            next_seq: tokio::sync::Mutex::new(next_seq),
            peers: Mutex::new(peers),
        });
        let state = ApiState::new(ApiParts {
            node: secret.public(),
            epoch,
            store: store.clone(),
            writer: Arc::new(StoreWriter::new(handle.clone(), head.clone())),
            head: head.subscribe(),
            node_api,
            metrics: Some(Arc::new(|out: &mut String| {
                out.push_str("# TYPE mesh_test_extra counter\nmesh_test_extra 7\n")
            })),
            subscriber_buffer: opts.subscriber_buffer,
            subscriber_stall: opts.subscriber_stall,
        });
        let socket = dir.join("mesh.sock");
        let bound = ApiSocket::bind(&socket).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(bound, state, async move {
            let _ = stopped.await;
        }));
        Daemon {
            client: Client::new(&socket),
            socket,
            node: secret.public(),
            epoch,
            handle,
            stop,
            server,
        }
    }

    /// Stops the API and closes the store, so the same dir can be reopened.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.server.await.unwrap().unwrap();
        self.handle.close().await;
    }

    async fn raw(&self, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let (status, bytes) = self.client.raw(method, path, body).await.unwrap();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, v)
    }

    async fn add_peer(&self) -> NodeId {
        let peer = random_key().public();
        let ticket = NodeTicket::new(peer, vec!["127.0.0.1:1".parse().unwrap()]).unwrap();
        let (status, v) = self
            .raw(
                Method::POST,
                "/v1/peers",
                Some(&json!({ "ticket": ticket.to_string() })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        peer
    }

    /// Sends `n` messages to `to` through the JSON-array batch route, `per` a request.
    async fn send_many(&self, to: NodeId, n: usize, per: usize, body: impl Fn(usize) -> String) {
        let mut i = 0;
        while i < n {
            let items: Vec<Value> = (i..(i + per).min(n))
                .map(|k| json!({ "to": to.to_string(), "body": body(k) }))
                .collect();
            let (status, v) = self
                .raw(
                    Method::POST,
                    "/v1/send/batch",
                    Some(&Value::Array(items.clone())),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{v}");
            assert_eq!(v["sent"].as_array().unwrap().len(), items.len());
            i += items.len();
        }
    }

    fn cursor(&self, arrival: Arrival) -> String {
        Cursor::new(&self.node, self.epoch, arrival).to_string()
    }
}

fn body_of(e: &EventEntry) -> Option<&str> {
    match &e.record {
        EventRecord::Envelope { body, .. } => Some(body),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_events_one_at_a_time_returns_each_of_1000_exactly_once_across_a_restart() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let secret = random_key();
        let d = Daemon::start(tmp.path(), &secret, Opts::default()).await;
        let peer = d.add_peer().await;
        d.send_many(peer, 1000, 100, |i| format!("msg-{i}")).await;

        let mut seen = Vec::new();
        let mut after = String::new();
        for _ in 0..400 {
            let page: EventsPage = d
                .client
                .get(&format!("/v1/events?after={after}&limit=1"))
                .await
                .unwrap();
            assert_eq!(page.entries.len(), 1);
            assert_eq!(page.next, page.entries[0].cursor);
            seen.push(body_of(&page.entries[0]).unwrap().to_owned());
            after = page.next;
        }
        d.stop().await;

        let d = Daemon::start(tmp.path(), &secret, Opts::default()).await;
        loop {
            let page: EventsPage = d
                .client
                .get(&format!("/v1/events?after={after}&limit=1"))
                .await
                .unwrap();
            if page.entries.is_empty() {
                assert_eq!(page.next, after, "an empty page returns the input cursor");
                break;
            }
            assert_eq!(page.entries.len(), 1);
            seen.push(body_of(&page.entries[0]).unwrap().to_owned());
            after = page.next;
            assert!(seen.len() <= 1000, "more entries than were sent");
        }
        let want: Vec<String> = (0..1000).map(|i| format!("msg-{i}")).collect();
        assert_eq!(seen, want);

        // No `after` pages from the start; limits are enforced.
        let page: EventsPage = d.client.get("/v1/events").await.unwrap();
        assert_eq!(page.entries.len(), mesh_daemon::api::EVENTS_LIMIT_DEFAULT);
        assert_eq!(body_of(&page.entries[0]), Some("msg-0"));
        let page: EventsPage = d.client.get("/v1/events?limit=1000").await.unwrap();
        assert_eq!(page.entries.len(), 1000);
        for bad in ["0", "1001", "lots"] {
            let (status, v) = d
                .raw(Method::GET, &format!("/v1/events?limit={bad}"), None)
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "limit={bad}");
            assert_eq!(error_code(&v), "bad_request");
        }
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_from_another_node_or_epoch_is_refused_with_409_and_garbage_with_400() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = Daemon::start(tmp.path(), &random_key(), Opts::default()).await;
        let other_node = Cursor::new(&random_key().public(), d.epoch, 1).to_string();
        let other_epoch = Cursor::new(&d.node, Epoch([9; 16]), 1).to_string();
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
                let (s, v) = d.raw(Method::GET, &path, None).await;
                assert_eq!((s, error_code(&v)), (status, code), "{path}: {v}");
            }
            let (s, v) = d
                .raw(
                    Method::PUT,
                    "/v1/cursors/agent",
                    Some(&json!({ "cursor": cursor })),
                )
                .await;
            assert_eq!((s, error_code(&v)), (status, code), "PUT: {v}");
        }
        // Nothing was written by the refused PUTs.
        let (s, v) = d.raw(Method::GET, "/v1/cursors/agent", None).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::NOT_FOUND, "unknown_cursor")
        );
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_cursor_is_durable_across_a_restart() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let secret = random_key();
        let d = Daemon::start(tmp.path(), &secret, Opts::default()).await;
        let peer = d.add_peer().await;
        d.send_many(peer, 3, 3, |i| format!("m{i}")).await;
        let c2 = d.cursor(2);
        let v: Value = d
            .client
            .put("/v1/cursors/planner.inbox", &json!({ "cursor": c2 }))
            .await
            .unwrap();
        assert_eq!(v["cursor"], c2.as_str());
        // A cursor past the journal head can only be forged: refused, not stored.
        let (s, v) = d
            .raw(
                Method::PUT,
                "/v1/cursors/planner.inbox",
                Some(&json!({ "cursor": d.cursor(99) })),
            )
            .await;
        assert_eq!((s, error_code(&v)), (StatusCode::BAD_REQUEST, "bad_cursor"));
        let (s, v) = d
            .raw(
                Method::PUT,
                "/v1/cursors/bad%20name",
                Some(&json!({ "cursor": c2 })),
            )
            .await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::BAD_REQUEST, "bad_request")
        );
        d.stop().await;

        let d = Daemon::start(tmp.path(), &secret, Opts::default()).await;
        let v: Value = d.client.get("/v1/cursors/planner.inbox").await.unwrap();
        assert_eq!(v["cursor"], c2.as_str());
        let page: EventsPage = d
            .client
            .get(&format!("/v1/events?after={c2}"))
            .await
            .unwrap();
        assert_eq!(
            page.entries.iter().filter_map(body_of).collect::<Vec<_>>(),
            ["m2"]
        );
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_subscriber_lags_alone_and_its_loss_is_a_durable_record() {
    bounded(async {
        const N: usize = 3000;
        let tmp = tempfile::tempdir().unwrap();
        let secret = random_key();
        // The stopped subscriber lags once its buffer and socket are full
        // and it has taken nothing for the stall time; the reading one,
        // however slowed by a busy machine, keeps taking entries.
        let opts = Opts {
            subscriber_buffer: 256,
            subscriber_stall: Duration::from_secs(3),
            ..Opts::default()
        };
        let d = Daemon::start(tmp.path(), &secret, opts).await;
        let peer = d.add_peer().await;

        // The stopped subscriber: its response has started, then nobody reads.
        let mut stopped = open_unread_subscription(&d.socket).await;
        // The reading subscriber collects every message and the loss record.
        let mut sub = d.client.subscribe("/v1/subscribe").await.unwrap();
        let reader = tokio::spawn(async move {
            let mut bodies = Vec::new();
            let mut lagged = 0;
            let mut saw_loss = false;
            loop {
                let ev = sub.next().await.unwrap().expect("stream ended");
                match ev.event.as_str() {
                    "lagged" => lagged += 1,
                    "entry" => {
                        let e: EventEntry = serde_json::from_str(&ev.data).unwrap();
                        assert_eq!(ev.id.as_deref(), Some(e.cursor.as_str()));
                        match &e.record {
                            EventRecord::Envelope { body, .. } => bodies.push(body.clone()),
                            // The loss lands in the journal among the messages.
                            EventRecord::Loss { reason, .. } if reason == "subscriber_lagged" => {
                                saw_loss = true
                            }
                            _ => {}
                        }
                        if saw_loss && bodies.len() == N {
                            return (bodies, lagged);
                        }
                    }
                    _ => {}
                }
            }
        });

        // Writers are never held up by the stopped subscriber.
        let pad = "x".repeat(2048);
        d.send_many(peer, N, 50, |i| format!("{i:05}{pad}")).await;

        let (bodies, lagged) = reader.await.unwrap();
        assert_eq!(lagged, 0, "the reading subscriber never lagged");
        let want: Vec<String> = (0..N).map(|i| format!("{i:05}{pad}")).collect();
        assert!(
            bodies == want,
            "the reading subscriber got every message once, in order"
        );

        // The stopped one, once it reads again, drains what was buffered and
        // is told where to resume.
        let mut seen = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let lagged: LaggedEvent = loop {
            let n = stopped.read(&mut chunk).await.unwrap();
            assert!(n > 0, "stream ended before a lagged event");
            seen.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&seen);
            if let Some(at) = text.find("event: lagged\n") {
                let rest = &text[at..];
                if let Some(end) = rest.find("\n\n") {
                    let data = rest[..end]
                        .lines()
                        .find_map(|l| l.strip_prefix("data: "))
                        .unwrap();
                    break serde_json::from_str(data).unwrap();
                }
            }
        };
        assert!(lagged.loss_recorded);
        assert!(lagged.skipped_from >= 1 && lagged.skipped_to >= lagged.skipped_from);
        assert_eq!(lagged.resume, d.cursor(lagged.skipped_from - 1));
        d.stop().await;

        // The loss record is in the journal after a restart.
        let d = Daemon::start(tmp.path(), &secret, opts).await;
        let mut after = String::new();
        let mut losses = Vec::new();
        loop {
            let page: EventsPage = d
                .client
                .get(&format!("/v1/events?after={after}&limit=1000"))
                .await
                .unwrap();
            if page.entries.is_empty() {
                break;
            }
            for e in &page.entries {
                if let EventRecord::Loss {
                    reason,
                    from,
                    to,
                    detail,
                    ..
                } = &e.record
                {
                    losses.push((reason.clone(), *from, *to, detail.clone()));
                }
            }
            after = page.next;
        }
        assert!(
            losses
                .iter()
                .any(|(reason, from, to, detail)| reason == "subscriber_lagged"
                    && *from == lagged.skipped_from
                    && *to == lagged.skipped_to
                    && detail.contains("stopped reading")),
            "{losses:?}"
        );
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reading_subscriber_with_a_tiny_buffer_is_not_lagged_by_one_large_commit() {
    bounded(async {
        const N: usize = 400;
        let tmp = tempfile::tempdir().unwrap();
        // One commit puts 400 entries past a 2-entry buffer at once: the
        // reader is far behind the head, but it is reading, so it gets all.
        let opts = Opts {
            subscriber_buffer: 2,
            ..Opts::default()
        };
        let d = Daemon::start(tmp.path(), &random_key(), opts).await;
        let peer = d.add_peer().await;
        let mut sub = d.client.subscribe("/v1/subscribe").await.unwrap();
        d.send_many(peer, N, N, |i| format!("{i:05}")).await;
        let mut bodies = Vec::new();
        while bodies.len() < N {
            let ev = sub.next().await.unwrap().expect("stream ended");
            assert_eq!(ev.event, "entry", "{}: {}", ev.event, ev.data);
            let e: EventEntry = serde_json::from_str(&ev.data).unwrap();
            bodies.extend(body_of(&e).map(str::to_owned));
        }
        let want: Vec<String> = (0..N).map(|i| format!("{i:05}")).collect();
        assert_eq!(bodies, want);
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stopped_reading_does_not_hold_a_stopping_server() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = Daemon::start(tmp.path(), &random_key(), Opts::default()).await;
        let peer = d.add_peer().await;
        // Fill the unread subscription's socket: ~4 MiB of entries, far
        // more than a Unix socket buffers, so its response stays mid-write.
        let stopped = open_unread_subscription(&d.socket).await;
        let pad = "x".repeat(4096);
        d.send_many(peer, 1000, 100, |i| format!("{i:05}{pad}"))
            .await;
        let started = std::time::Instant::now();
        d.stop().await;
        // The server waited its grace period for the stuck response, then
        // cut it; the client sees the stream end once it reads again.
        assert!(
            started.elapsed() >= mesh_daemon::api::SHUTDOWN_GRACE / 2,
            "the stuck connection was given its grace period: {:?}",
            started.elapsed()
        );
        let mut stopped = stopped;
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
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = Daemon::start(tmp.path(), &random_key(), Opts::default()).await;
        let peer = d.add_peer().await;
        d.send_many(peer, 5, 5, |i| format!("old-{i}")).await;
        let mut sub = d
            .client
            .subscribe(&format!("/v1/subscribe?after={}", d.cursor(3)))
            .await
            .unwrap();
        d.send_many(peer, 2, 1, |i| format!("new-{i}")).await;
        let mut bodies = Vec::new();
        while bodies.len() < 4 {
            let ev = sub.next().await.unwrap().unwrap();
            assert_eq!(ev.event, "entry");
            let e: EventEntry = serde_json::from_str(&ev.data).unwrap();
            bodies.push(body_of(&e).unwrap().to_owned());
        }
        assert_eq!(bodies, ["old-3", "old-4", "new-0", "new-1"]);
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unknown_peers_and_a_full_outbox_get_the_documented_errors() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let opts = Opts {
            bounds: OutboxBounds {
                max_msgs: 2,
                max_bytes: 1 << 20,
                on_full: OnFull::Reject,
            },
            ..Opts::default()
        };
        let d = Daemon::start(tmp.path(), &random_key(), opts).await;
        let peer = d.add_peer().await;
        let to = peer.to_string();
        let post = |path: &'static str, ct: Option<&'static str>, body: Vec<u8>| {
            let c = d.client.clone();
            async move {
                let (s, b) = c
                    .raw_bytes(Method::POST, path, ct, body.into())
                    .await
                    .unwrap();
                (
                    s,
                    serde_json::from_slice::<Value>(&b).unwrap_or(Value::Null),
                )
            }
        };

        let (s, v) = post("/v1/send", None, b"{not json".to_vec()).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::BAD_REQUEST, "bad_json"),
            "{v}"
        );
        let (s, v) = post("/v1/send", None, br#"{"body":"hi"}"#.to_vec()).await;
        assert_eq!((s, error_code(&v)), (StatusCode::BAD_REQUEST, "bad_json"));
        assert!(
            v["error"]["message"].as_str().unwrap().contains("`to`"),
            "{v}"
        );
        let huge =
            json!({ "to": to, "body": "x".repeat(mesh_daemon::api::SEND_REQUEST_BYTES_MAX) });
        let (s, v) = post("/v1/send", None, serde_json::to_vec(&huge).unwrap()).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::BAD_REQUEST, "body_too_large"),
            "{v}"
        );
        let (s, v) = post(
            "/v1/send",
            None,
            serde_json::to_vec(&json!({"to": "nobody", "body": "x"})).unwrap(),
        )
        .await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::BAD_REQUEST, "bad_request"),
            "{v}"
        );
        let stranger = random_key().public().to_string();
        let (s, v) = post(
            "/v1/send",
            None,
            serde_json::to_vec(&json!({"to": stranger, "body": "x"})).unwrap(),
        )
        .await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::NOT_FOUND, "unknown_peer"),
            "{v}"
        );
        let (s, v) = d
            .raw(Method::DELETE, &format!("/v1/peers/{stranger}"), None)
            .await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::NOT_FOUND, "unknown_peer"),
            "{v}"
        );
        let (s, v) = d.raw(Method::GET, "/v1/nothing", None).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::NOT_FOUND, "no_route"),
            "{v}"
        );
        let (s, v) = d.raw(Method::DELETE, "/v1/events", None).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
        );
        let (s, v) = post("/v1/send/batch", None, b"[]".to_vec()).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::BAD_REQUEST, "bad_request"),
            "{v}"
        );

        // Two fit; the third finds the outbox full of unacknowledged messages.
        for i in 0..2 {
            let v: Value = d
                .client
                .post("/v1/send", &json!({ "to": to, "body": format!("m{i}") }))
                .await
                .unwrap();
            assert_eq!(v["seq"], i + 1);
        }
        let (s, v) = post(
            "/v1/send",
            None,
            serde_json::to_vec(&json!({"to": to, "body": "m2"})).unwrap(),
        )
        .await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::INSUFFICIENT_STORAGE, "outbox_full"),
            "{v}"
        );
        let err = d
            .client
            .post::<Value>("/v1/send", &json!({ "to": to, "body": "m2" }))
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Api { status: 507, .. }), "{err}");
        // Nothing of the refused sends reached the journal.
        let page: EventsPage = d.client.get("/v1/events").await.unwrap();
        assert_eq!(
            page.entries.iter().filter_map(body_of).collect::<Vec<_>>(),
            ["m0", "m1"]
        );
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ndjson_batch_commits_line_by_line_and_says_how_far_it_got() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = Daemon::start(tmp.path(), &random_key(), Opts::default()).await;
        let peer = d.add_peer().await;
        let line = |i: usize| {
            format!(
                "{}\n",
                json!({ "to": peer.to_string(), "body": format!("n{i}") })
            )
        };
        let body: String = (0..600).map(line).collect();
        let mut lines = d
            .client
            .stream_lines(
                Method::POST,
                "/v1/send/batch",
                "application/x-ndjson",
                futures_util::stream::iter([Ok(bytes::Bytes::from(body))]),
            )
            .await
            .unwrap();
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
        let mut lines = d
            .client
            .stream_lines(Method::POST, "/v1/send/batch", "application/x-ndjson", body)
            .await
            .unwrap();
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
        let mut lines = d
            .client
            .stream_lines(
                Method::POST,
                "/v1/send/batch",
                "application/x-ndjson",
                futures_util::stream::iter([Ok(bytes::Bytes::from(body))]),
            )
            .await;
        // The first chunk holds the bad line, so the whole answer is an error status.
        match &mut lines {
            Err(ClientError::Api {
                status: 400,
                code,
                message,
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
        d.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_ticket_peers_and_metrics_answer_json_and_prometheus_text() {
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = Daemon::start(tmp.path(), &random_key(), Opts::default()).await;
        let peer = d.add_peer().await;
        let v: Value = d.client.get("/v1/status").await.unwrap();
        assert_eq!(v["node"], d.node.to_string());
        assert!(v["journal_head"].is_u64());
        let v: Value = d.client.get("/v1/ticket").await.unwrap();
        let t: NodeTicket = v["ticket"].as_str().unwrap().parse().unwrap();
        assert_eq!(t.node, d.node);
        let v: Value = d.client.get("/v1/peers").await.unwrap();
        assert_eq!(v["peers"][0]["node"], peer.to_string());
        let (s, v) = d
            .raw(
                Method::POST,
                "/v1/peers",
                Some(&json!({ "ticket": "meshnode1nope" })),
            )
            .await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::BAD_REQUEST, "bad_request")
        );
        let v: Value = d.client.delete(&format!("/v1/peers/{peer}")).await.unwrap();
        assert_eq!(v["removed"], peer.to_string());
        let (s, bytes) = d
            .client
            .raw(Method::GET, "/metrics", None::<&()>)
            .await
            .unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert_eq!(s, StatusCode::OK);
        assert!(
            text.contains("mesh_api_requests_total{class=\"ok\"}"),
            "{text}"
        );
        assert!(text.contains("mesh_test_extra 7"), "{text}");
        d.stop().await;
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
    bounded(async {
        let tmp = tempfile::tempdir().unwrap();
        let d = Daemon::start(tmp.path(), &random_key(), Opts::default()).await;
        let client = d.client.clone();
        let socket = d.socket.clone();
        // An open subscription does not hold the shutdown up.
        let mut sub = client.subscribe("/v1/subscribe").await.unwrap();
        d.stop().await;
        assert!(sub.next().await.map(|e| e.is_none()).unwrap_or(true));
        assert!(!socket.exists());
        let err = client.get::<Value>("/v1/status").await.unwrap_err();
        assert!(err.to_string().contains("not running"), "{err}");
        assert!(err.to_string().contains(&socket.display().to_string()));
    })
    .await
}

/// Set in the helper process that connects as another uid.
const HELPER_ENV: &str = "MESH_TEST_OTHER_UID_SOCKET";
const HELPER_CURSOR_ENV: &str = "MESH_TEST_OTHER_UID_CURSOR";
/// The uid the helper runs as ("nobody").
const OTHER_UID: u32 = 65534;

/// Not a test on its own: the body of the helper process (a no-op otherwise).
#[test]
fn other_uid_helper() {
    let Ok(socket) = std::env::var(HELPER_ENV) else {
        return;
    };
    let cursor = std::env::var(HELPER_CURSOR_ENV).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (s, b) = Client::new(socket)
            .raw(
                Method::PUT,
                "/v1/cursors/intruder",
                Some(&json!({ "cursor": cursor })),
            )
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
        println!("HELPER STATUS={} CODE={}", s.as_u16(), error_code(&v));
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
        let d = Daemon::start(tmp.path(), &random_key(), Opts::default()).await;
        // The 0700 dir and 0600 socket already keep other users out; open
        // both up to prove the SO_PEERCRED check refuses them on its own.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let exe = std::env::current_exe().unwrap();
        let mut cmd = std::process::Command::new(exe);
        cmd.args([
            "--exact",
            "other_uid_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_ENV, &d.socket)
        .env(HELPER_CURSOR_ENV, d.cursor(0))
        .uid(OTHER_UID)
        .gid(OTHER_UID);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("HELPER STATUS=403 CODE=forbidden"),
            "helper said: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (s, v) = d.raw(Method::GET, "/v1/cursors/intruder", None).await;
        assert_eq!(
            (s, error_code(&v)),
            (StatusCode::NOT_FOUND, "unknown_cursor")
        );
        let text = String::from_utf8(
            d.client
                .raw(Method::GET, "/metrics", None::<&()>)
                .await
                .unwrap()
                .1
                .to_vec(),
        )
        .unwrap();
        assert!(text.contains("mesh_api_refused_uid_total 1"), "{text}");
        d.stop().await;
    })
    .await
}
