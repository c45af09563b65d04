//! Helpers shared by the daemon's integration tests (`api.rs`, `e2e.rs`):
//! a real daemon in a temp dir driven through its socket, and waits.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used)]
// Not every test file uses every helper.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::{Method, StatusCode};
use mesh_api::client::{Client, SseStream};
use mesh_api::{DataDir, EventEntry, EventRecord, EventsPage, StatusResponse};
use mesh_daemon::Daemon;
use mesh_protocol::{Cursor, Epoch, NodeId, NodeTicket, SecretKey};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every test finishes well within this, or fails.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `f`, failing the test if it takes longer than [`TEST_TIMEOUT`].
pub(crate) async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test timed out")
}

/// How often a condition is polled.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How many polls before a wait fails (about 60 s: two cores, debug build,
/// other tests running).
pub(crate) const POLLS_MAX: u32 = 3000;

/// Polls `f` until it gives a value, at most [`POLLS_MAX`] times.
pub(crate) async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..POLLS_MAX {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    panic!("gave up waiting for {what}");
}

/// The `error.code` of an API error answer.
pub(crate) fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<none>")
}

/// Reads the response head of a raw subscription request, then leaves the
/// rest unread: a subscriber that stopped reading.
pub(crate) async fn open_unread_subscription(socket: &Path) -> tokio::net::UnixStream {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    s.write_all(b"GET /v1/subscribe HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// Reads a subscription's raw SSE bytes until its `lagged` event; its data.
pub(crate) async fn read_until_lagged(
    stopped: &mut tokio::net::UnixStream,
) -> mesh_api::LaggedEvent {
    let mut seen = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = stopped.read(&mut chunk).await.unwrap();
        assert!(n > 0, "stream ended before a lagged event");
        seen.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&seen);
        if let Some(at) = text.find("event: lagged\n")
            && let Some(end) = text[at..].find("\n\n")
        {
            let data = text[at..at + end]
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            return serde_json::from_str(data).unwrap();
        }
    }
}

/// A key no daemon has.
pub(crate) fn random_key() -> SecretKey {
    SecretKey::from_bytes(&rand::random::<[u8; 32]>())
}

/// One real daemon (redb store, bus node on 127.0.0.1, API socket) in
/// `<tmp>/<name>`, in this process, restartable on the same port.
pub(crate) struct TestNode {
    pub(crate) name: &'static str,
    pub(crate) dir: PathBuf,
    /// The UDP port the first start picked; restarts bind it again, so peers
    /// find the node where its ticket says.
    port: u16,
    pub(crate) id: String,
    pub(crate) epoch: Epoch,
    pub(crate) client: Client,
    daemon: Option<Daemon>,
}

impl TestNode {
    /// Starts a node; `config` is written to its `config.toml` first.
    pub(crate) async fn start(tmp: &Path, name: &'static str, config: Option<&str>) -> TestNode {
        let dir = tmp.join(name);
        if let Some(text) = config {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.toml"), text).unwrap();
        }
        let daemon = run_daemon(&dir, 0).await;
        let client = Client::new(daemon.socket_path());
        let mut node = TestNode {
            name,
            dir,
            port: 0,
            id: daemon.node_id().to_string(),
            epoch: daemon.epoch(),
            client,
            daemon: Some(daemon),
        };
        let st = node.status().await;
        let addr: SocketAddr = st["addrs"][0].as_str().unwrap().parse().unwrap();
        assert!(addr.ip().is_loopback(), "{st}");
        node.port = addr.port();
        node
    }

    /// Stops the daemon; its store is closed when this returns.
    pub(crate) async fn stop(&mut self) {
        self.daemon
            .take()
            .expect("the node is running")
            .shutdown()
            .await;
    }

    /// Whether the daemon runs (it was not stopped).
    pub(crate) fn is_running(&self) -> bool {
        self.daemon.is_some()
    }

    /// Starts the stopped daemon again on the same dir and port.
    pub(crate) async fn restart(&mut self) {
        assert!(self.daemon.is_none(), "{} is running", self.name);
        self.daemon = Some(run_daemon(&self.dir, self.port).await);
    }

    /// The node's control socket.
    pub(crate) fn socket(&self) -> &Path {
        self.client.socket()
    }

    /// The node id, parsed.
    pub(crate) fn node_id(&self) -> NodeId {
        self.id.parse().unwrap()
    }

    /// The cursor after arrival `arrival` of this node's journal.
    pub(crate) fn cursor(&self, arrival: u64) -> String {
        Cursor::new(&self.node_id(), self.epoch, arrival).to_string()
    }

    /// Any request; the status and the JSON answer (`null` if not JSON).
    pub(crate) async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, Value) {
        let (status, bytes) = self.client.raw(method, path, body).await.unwrap();
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, v)
    }

    /// `POST path` with `body` as it is; the status and the JSON answer.
    pub(crate) async fn post_bytes(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let (s, bytes) = self
            .client
            .raw_bytes(Method::POST, path, Some("application/json"), body.into())
            .await
            .unwrap();
        (s, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// `raw`, asserting the error answer `want` (status, code); the answer.
    pub(crate) async fn expect_error(
        &self,
        (method, path): (Method, &str),
        body: Option<&Value>,
        want: (StatusCode, &str),
    ) -> Value {
        let (s, v) = self.raw(method, path, body).await;
        assert_eq!((s, error_code(&v)), want, "{path}: {v}");
        v
    }

    /// `post_bytes`, asserting the error answer `want` (status, code); the answer.
    pub(crate) async fn post_expect_error(
        &self,
        path: &str,
        body: Vec<u8>,
        want: (StatusCode, &str),
    ) -> Value {
        let (s, v) = self.post_bytes(path, body).await;
        assert_eq!((s, error_code(&v)), want, "{path}: {v}");
        v
    }

    /// Asserts that no named cursor `name` is stored.
    pub(crate) async fn assert_no_cursor(&self, name: &str) {
        let path = format!("/v1/cursors/{name}");
        let want = (StatusCode::NOT_FOUND, "unknown_cursor");
        self.expect_error((Method::GET, &path), None, want).await;
    }

    /// `raw`, asserting 200.
    pub(crate) async fn ok(&self, method: Method, path: &str, body: Option<&Value>) -> Value {
        let (s, v) = self.raw(method, path, body).await;
        assert_eq!(s, StatusCode::OK, "{}: {path}: {v}", self.name);
        v
    }

    /// `GET /v1/status`.
    pub(crate) async fn status(&self) -> Value {
        self.client.get("/v1/status").await.unwrap()
    }

    /// `GET /metrics`.
    pub(crate) async fn metrics_text(&self) -> String {
        let (s, bytes) = self
            .client
            .raw(Method::GET, "/metrics", None::<&Value>)
            .await
            .unwrap();
        assert_eq!(s, StatusCode::OK);
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// The value of the Prometheus sample `name` in `GET /metrics`.
    pub(crate) async fn metric(&self, name: &str) -> u64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }

    /// Its ticket.
    pub(crate) async fn ticket(&self) -> String {
        let v: Value = self.client.get("/v1/ticket").await.unwrap();
        v["ticket"].as_str().unwrap().to_owned()
    }

    /// Adds the peer of `ticket`, asserting 200.
    pub(crate) async fn add_peer(&self, ticket: &str) {
        self.ok(
            Method::POST,
            "/v1/peers",
            Some(&json!({ "ticket": ticket })),
        )
        .await;
    }

    /// Adds a peer no daemon answers for (a new key at 127.0.0.1:1): what is
    /// sent to it stays in the outbox.
    pub(crate) async fn add_absent_peer(&self) -> NodeId {
        let peer = random_key().public();
        let ticket = NodeTicket::new(peer, vec!["127.0.0.1:1".parse().unwrap()]).unwrap();
        self.add_peer(&ticket.to_string()).await;
        peer
    }

    /// The peer `id` as this node's status shows it.
    pub(crate) async fn peer(&self, id: &str) -> Value {
        let st = self.status().await;
        st["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["node"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{} does not list peer {id}: {st}", self.name))
    }

    /// Sends `bodies` to `to` through `POST /v1/send/batch`, `per` a request;
    /// returns the seqs the node answered.
    pub(crate) async fn send_all(&self, to: &str, bodies: &[String], per: usize) -> Vec<u64> {
        let mut seqs = Vec::new();
        for chunk in bodies.chunks(per) {
            let items: Vec<Value> = chunk
                .iter()
                .map(|b| json!({ "to": to, "body": b }))
                .collect();
            let v = self
                .ok(Method::POST, "/v1/send/batch", Some(&Value::Array(items)))
                .await;
            let sent = v["sent"].as_array().unwrap();
            assert_eq!(sent.len(), chunk.len(), "{v}");
            seqs.extend(sent.iter().map(|s| s["seq"].as_u64().unwrap()));
        }
        seqs
    }

    /// A page of `GET /v1/events` after `after` (empty: from the start).
    pub(crate) async fn page(&self, after: &str, limit: usize) -> EventsPage {
        self.client
            .get(&format!("/v1/events?after={after}&limit={limit}"))
            .await
            .unwrap()
    }

    /// The whole journal, paged 1,000 at a time.
    pub(crate) async fn journal(&self) -> Vec<EventEntry> {
        let mut entries = Vec::new();
        let mut after = String::new();
        loop {
            let page = self.page(&after, 1000).await;
            if page.entries.is_empty() {
                return entries;
            }
            entries.extend(page.entries);
            after = page.next;
        }
    }

    /// `(seq, body)` of every message from `author` in the journal, in journal order.
    pub(crate) async fn received_from(&self, author: &str) -> Vec<(u64, String)> {
        self.journal()
            .await
            .into_iter()
            .filter_map(|e| match e.record {
                EventRecord::Envelope {
                    stream, seq, body, ..
                } if stream.author == author => Some((seq, body)),
                _ => None,
            })
            .collect()
    }

    /// Waits until `count` messages from `author` are in the journal.
    pub(crate) async fn wait_received(&self, author: &str, count: usize) -> Vec<(u64, String)> {
        let what = format!("{} to hold {count} messages from {author}", self.name);
        wait_for(&what, async || {
            let got = self.received_from(author).await;
            assert!(
                got.len() <= count,
                "{}: more than {count}: {got:?}",
                self.name
            );
            (got.len() == count).then_some(got)
        })
        .await
    }

    /// Its status, typed.
    pub(crate) async fn typed_status(&self) -> StatusResponse {
        self.client.get("/v1/status").await.unwrap()
    }

    /// Pages the journal one entry a time from `after` (moving it on), for
    /// at most `max` entries or until a page is empty; each page of one
    /// ends at its entry, and an empty page returns the cursor it was given.
    pub(crate) async fn page_one_by_one(&self, after: &mut String, max: usize) -> Vec<EventEntry> {
        let mut entries = Vec::new();
        while entries.len() < max {
            let mut page = self.page(after, 1).await;
            let Some(e) = page.entries.pop() else {
                assert_eq!(&page.next, after, "an empty page returns its cursor");
                break;
            };
            assert!(page.entries.is_empty(), "a page of one has one entry");
            assert_eq!(page.next, e.cursor);
            *after = page.next;
            entries.push(e);
        }
        entries
    }

    /// The loss records in the whole journal.
    pub(crate) async fn losses(&self) -> Vec<Loss> {
        self.journal()
            .await
            .into_iter()
            .filter_map(|e| match e.record {
                EventRecord::Loss {
                    from,
                    to,
                    reason,
                    detail,
                    ..
                } => Some(Loss {
                    arrival: e.arrival,
                    from,
                    to,
                    reason,
                    detail,
                }),
                EventRecord::Lagged {
                    from, to, detail, ..
                } => Some(Loss {
                    arrival: e.arrival,
                    from,
                    to,
                    reason: "subscriber_lagged".into(),
                    detail,
                }),
                _ => None,
            })
            .collect()
    }
}

/// A loss record of a journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Loss {
    pub(crate) arrival: u64,
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) reason: String,
    pub(crate) detail: String,
}

/// What a live subscriber read.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Message bodies, in order.
    pub(crate) bodies: Vec<String>,
    /// `lagged` events.
    pub(crate) lagged: usize,
    /// `subscriber_lagged` loss records among the entries.
    pub(crate) losses: usize,
}

/// Reads the subscription `sub` on a task until `done` says it has seen
/// enough. Every entry's SSE id is its cursor; messages are from `author`
/// (if given) and the only other entries are subscriber loss records.
pub(crate) fn spawn_reader(
    mut sub: SseStream,
    author: Option<String>,
    done: impl Fn(&Seen) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<Seen> {
    tokio::spawn(async move {
        let mut seen = Seen::default();
        while !done(&seen) {
            let ev = sub.next().await.unwrap().expect("stream ended");
            match ev.event.as_str() {
                "lagged" => seen.lagged += 1,
                "entry" => {
                    let e: EventEntry = serde_json::from_str(&ev.data).unwrap();
                    assert_eq!(ev.id.as_deref(), Some(e.cursor.as_str()));
                    match e.record {
                        EventRecord::Envelope { stream, body, .. } => {
                            if let Some(a) = &author {
                                assert_eq!(&stream.author, a);
                            }
                            seen.bodies.push(body)
                        }
                        // The loss lands in the journal among the messages.
                        EventRecord::Lagged { .. } => seen.losses += 1,
                        other => panic!("unexpected {other:?}"),
                    }
                }
                _ => {}
            }
        }
        seen
    })
}

async fn run_daemon(dir: &Path, port: u16) -> Daemon {
    let bind = SocketAddr::from(([127, 0, 0, 1], port));
    Daemon::start(DataDir::resolve(Some(dir)).unwrap(), Some(bind))
        .await
        .unwrap()
}

/// Adds each node's ticket to the other and waits until both say connected.
pub(crate) async fn link(a: &TestNode, b: &TestNode) {
    a.add_peer(&b.ticket().await).await;
    b.add_peer(&a.ticket().await).await;
    wait_connected(a, b).await;
}

/// Waits until `a` and `b` both see the other connected.
pub(crate) async fn wait_connected(a: &TestNode, b: &TestNode) {
    let what = format!("{} and {} to be connected", a.name, b.name);
    wait_for(&what, async || {
        let up =
            a.peer(&b.id).await["connected"] == true && b.peer(&a.id).await["connected"] == true;
        up.then_some(())
    })
    .await
}

/// `n` message texts `prefix-0000`, ...
pub(crate) fn texts(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}

/// `(seq, body)` for seqs `1..` of `bodies`.
pub(crate) fn in_order(bodies: &[String]) -> Vec<(u64, String)> {
    (1..).zip(bodies.iter().cloned()).collect()
}

/// The body of a message entry.
pub(crate) fn body_of(e: &EventEntry) -> Option<&str> {
    match &e.record {
        EventRecord::Envelope { body, .. } => Some(body),
        _ => None,
    }
}

/// One metric family of a Prometheus text exposition.
#[derive(Debug, Default)]
pub(crate) struct Family {
    pub(crate) kind: String,
    /// `(labels, value)` of each sample.
    pub(crate) samples: Vec<(String, f64)>,
}

/// Parses Prometheus text (format 0.0.4) as a scraper does, failing on what
/// a scraper refuses: a family declared twice (`# TYPE` or `# HELP`), a
/// sample of an undeclared family, a family's samples not together, a
/// sample that is not `name{labels} value`.
pub(crate) fn parse_prometheus(text: &str) -> Result<HashMap<String, Family>, String> {
    let mut families: HashMap<String, Family> = HashMap::new();
    let mut helps: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    let mut closed: Vec<String> = Vec::new();
    for (no, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l)) {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("").to_owned();
            if helps.contains(&name) {
                return Err(format!("line {no}: second HELP for {name}"));
            }
            helps.push(name);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let (name, kind) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            if families.contains_key(name) {
                return Err(format!("line {no}: second TYPE for {name}"));
            }
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(format!("line {no}: bad type {kind:?}"));
            }
            if let Some(prev) = current.replace(name.to_owned()) {
                closed.push(prev);
            }
            families.insert(
                name.to_owned(),
                Family {
                    kind: kind.to_owned(),
                    samples: Vec::new(),
                },
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("line {no}: no value: {line:?}"))?;
        let value: f64 = value
            .parse()
            .map_err(|_| format!("line {no}: bad value: {line:?}"))?;
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) if l.ends_with('}') => (n, format!("{{{l}")),
            Some(_) => return Err(format!("line {no}: bad labels: {line:?}")),
            None => (series, String::new()),
        };
        if closed.iter().any(|c| c == name) {
            return Err(format!("line {no}: {name}'s samples are not together"));
        }
        if current.as_deref() != Some(name) {
            return Err(format!("line {no}: sample of undeclared family {name}"));
        }
        let family = families.get_mut(name).unwrap();
        if family.samples.iter().any(|(l, _)| *l == labels) {
            return Err(format!("line {no}: second sample {name}{labels}"));
        }
        family.samples.push((labels, value));
    }
    Ok(families)
}
