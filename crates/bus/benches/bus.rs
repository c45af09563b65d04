//! Bus-level figures: two whole nodes (core, redb store files in a temp dir,
//! iroh on 127.0.0.1), 1 KiB payloads, every commit `Durability::Immediate`
//! on both sides and every batch signature verified by the receiver.
//!
//! A plain bench (`harness = false`): each case is end to end and takes
//! seconds, so it is run a few times and the median printed.
//!
//! - `throughput`: sends pipelined from two tasks (`Node::submit`, 1,024
//!   at a time each), timed from the first send until the peer's journal
//!   holds every message;
//! - `catchup`: 100,000 messages committed while the peer was stopped, timed
//!   from the peer's restart until its journal holds all of them;
//! - `rtt`: A sends one message to B; when B's journal has it, B sends one
//!   back; the round trip ends when A's journal has the answer;
//! - `frames`: the transport alone ([`mesh_bus::net::Net`]): 200,000 batch
//!   frames of 1 KiB one way, unverified, timed until the last arrives.
//!
//! Each case also prints the commits each node's core issued per 1,000
//! messages (from `Node::status`): how full the group commits were.
//!
//! `cargo bench -p mesh-bus --bench bus` (env `BUS_BENCH_RUNS`, default 3;
//! `BUS_BENCH_MSGS` for `throughput`, default 50,000; `BUS_BENCH_CATCHUP`,
//! default 100,000; `BUS_BENCH_FRAMES`, default 200,000). A name after `--`
//! runs only the cases it names part of, e.g. `-- rtt`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{NetNode, link, link_one_way, node_config, wait_head_within};
use mesh_bus::{CoreConfig as Config, DropReason, Node, NodeConfig, Outgoing};
use mesh_protocol::{Channel, EntryHeader, Epoch, Frame, Payloads, SignedBatch};
use mesh_protocol::{NodeId, SecretKey};
use mesh_store::{MemStore, MeshStore, OnFull, OutboxBounds, RedbStore, StoreHandle};

/// The bound on every wait.
const T: Duration = Duration::from_secs(600);

fn config() -> NodeConfig {
    node_config(Config {
        outbox: OutboxBounds {
            max_msgs: 10_000_000,
            max_bytes: 1 << 34,
            on_full: OnFull::Reject,
        },
        ..Config::default()
    })
}

struct Running {
    dir: PathBuf,
    key: SecretKey,
    node: Arc<Node>,
    handle: StoreHandle<dyn MeshStore>,
}

/// With `BUS_BENCH_MEM=1`, an in-memory store per data dir (no disk, no
/// fsync), kept across restarts: shows what the rest of the bus can do.
fn memory() -> bool {
    std::env::var("BUS_BENCH_MEM").is_ok_and(|v| v == "1")
}

static MEM: std::sync::Mutex<Vec<(PathBuf, Arc<MemStore>)>> = std::sync::Mutex::new(Vec::new());

fn open(dir: &Path) -> Arc<dyn MeshStore> {
    if !memory() {
        return Arc::new(RedbStore::open(dir).expect("open store"));
    }
    let mut mem = MEM.lock().expect("lock");
    if let Some((_, s)) = mem.iter().find(|(d, _)| d == dir) {
        return s.clone();
    }
    let s = Arc::new(MemStore::new(Epoch(rand::random())));
    mem.push((dir.to_path_buf(), s.clone()));
    s
}

async fn start(dir: PathBuf, key: SecretKey) -> Running {
    let store = open(&dir);
    let handle = StoreHandle::spawn(store).expect("store actor");
    let node = Node::start(config(), key.clone(), handle.clone())
        .await
        .expect("start");
    Running {
        dir,
        key,
        node: Arc::new(node),
        handle,
    }
}

async fn fresh(root: &Path, name: &str) -> Running {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("dir");
    start(dir, SecretKey::generate()).await
}

impl Running {
    async fn stop(self) -> (PathBuf, SecretKey) {
        self.node.shutdown().await;
        self.handle.close().await;
        (self.dir, self.key)
    }
}

async fn wait_head(node: &Node, at_least: u64) {
    wait_head_within(node, at_least, T).await;
}

fn payload() -> Vec<u8> {
    vec![0xA5; 1024]
}

/// Sends `n` messages to `to` from two pipelined tasks.
async fn send_pipelined(node: &Arc<Node>, to: NodeId, n: u64) {
    let mut tasks = Vec::new();
    for part in [n / 2, n - n / 2] {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut left = part;
            while left > 0 {
                let k = left.min(1024);
                let msgs = (0..k).map(|_| Outgoing::plain(to, 0, payload())).collect();
                for r in node.submit(msgs).await.await {
                    r.expect("send");
                }
                left -= k;
            }
        }));
    }
    for t in tasks {
        t.await.expect("sender");
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The commits `node`'s core has issued so far.
async fn commits(node: &Node) -> u64 {
    node.status().await.expect("status").core.commits
}

/// Commits per 1,000 of `n` messages.
fn per_k(commits: u64, n: u64) -> f64 {
    commits as f64 * 1e3 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A run's rate and the commits per 1,000 messages of sender and receiver.
struct Run {
    rate: f64,
    sender_per_k: f64,
    receiver_per_k: f64,
    /// What the receiver threw away: (queue full, outside the reorder
    /// window, duplicate envelopes, resyncs it asked).
    receiver_waste: (u64, u64, u64, u64),
}

impl Run {
    fn waste_note(&self) -> String {
        let (full, window, dups, resyncs) = self.receiver_waste;
        format!(
            "receiver dropped {full} batches (queue full), {window} (outside window), \
             {dups} duplicate envelopes, asked {resyncs} resyncs"
        )
    }
}

/// The receiver's waste counters (see [`Run::receiver_waste`]).
async fn waste(node: &Node) -> (u64, u64, u64, u64) {
    let m = node.status().await.expect("status").core;
    (
        m.dropped.get(DropReason::QueueFull),
        m.dropped.get(DropReason::OutsideWindow),
        m.duplicate_envelopes,
        m.resyncs_asked,
    )
}

/// Two fresh nodes `a` and `b` under `root`, linked both ways.
async fn linked_pair(root: &Path) -> (Running, Running) {
    let a = fresh(root, "a").await;
    let b = fresh(root, "b").await;
    link(&a.node, &b.node).await;
    (a, b)
}

/// Waits for `b` to hold `n` messages, then stops both: the run's rate from
/// `t0` and its commits per 1k messages counted from `a0` and `b0`.
async fn finish_run(a: Running, b: Running, n: u64, t0: Instant, (a0, b0): (u64, u64)) -> Run {
    wait_head(&b.node, n).await;
    let secs = t0.elapsed().as_secs_f64();
    let (a1, b1) = (commits(&a.node).await, commits(&b.node).await);
    let receiver_waste = waste(&b.node).await;
    a.stop().await;
    b.stop().await;
    Run {
        rate: n as f64 / secs,
        sender_per_k: per_k(a1 - a0, n),
        receiver_per_k: per_k(b1 - b0, n),
        receiver_waste,
    }
}

async fn throughput(n: u64) -> Run {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = linked_pair(root.path()).await;
    let to = b.node.node_id();
    let (a0, b0) = (commits(&a.node).await, commits(&b.node).await);
    let t0 = Instant::now();
    send_pipelined(&a.node, to, n).await;
    finish_run(a, b, n, t0, (a0, b0)).await
}

async fn catchup(n: u64) -> Run {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = linked_pair(root.path()).await;
    let to = b.node.node_id();
    let (dir, key) = b.stop().await;
    send_pipelined(&a.node, to, n).await;
    let a0 = commits(&a.node).await;
    let t0 = Instant::now();
    let b = start(dir, key).await;
    // The restarted receiver counts its commits from 0.
    finish_run(a, b, n, t0, (a0, 0)).await
}

/// p50 and p99 of the round trip in ms, and A's commits per round trip.
async fn rtt(samples: usize) -> (f64, f64, f64) {
    let root = tempfile::tempdir().expect("tempdir");
    let (a, b) = linked_pair(root.path()).await;
    let (ida, idb) = (a.node.node_id(), b.node.node_id());
    let mut times = Vec::with_capacity(samples);
    let mut a0 = 0;
    // A's journal holds its own sends and B's answers; B's the same.
    for i in 1..=(samples as u64 + 20) {
        if i == 21 {
            a0 = commits(&a.node).await;
        }
        let t0 = Instant::now();
        a.node.send(idb, 0, payload()).await.expect("send");
        wait_head(&b.node, 2 * i - 1).await;
        b.node.send(ida, 0, payload()).await.expect("answer");
        wait_head(&a.node, 2 * i).await;
        // The first 20 warm up.
        if i > 20 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let a1 = commits(&a.node).await;
    a.stop().await;
    b.stop().await;
    times.sort_by(f64::total_cmp);
    let p = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    (p(0.5), p(0.99), (a1 - a0) as f64 / samples as f64)
}

/// Frames per second of `n` 1 KiB batch frames one way through the raw transport.
async fn frames(n: u64) -> f64 {
    let mut a = NetNode::new().await;
    let mut b = NetNode::new().await;
    link_one_way(&a, &b).await;
    let ca = a.connected(b.id()).await;
    b.connected(a.id()).await;
    let payload = vec![0xAB; 1024];
    let frame = Frame::Batch {
        batch: SignedBatch {
            author: a.id(),
            epoch: Epoch([1; 16]),
            channel: Channel::Direct(b.id()),
            first_seq: 1,
            entries: vec![EntryHeader::for_payload(1, 0, 0, &payload)],
            sig: [0; 64],
        },
        payloads: Payloads(vec![payload]),
    };
    let t0 = Instant::now();
    let (net, to) = (&a.net, b.id());
    let send = async move {
        for _ in 0..n {
            net.send(to, ca, &frame).await.expect("send");
        }
    };
    let recv = async {
        for _ in 0..n {
            b.frame().await;
        }
    };
    tokio::join!(send, recv);
    let secs = t0.elapsed().as_secs_f64();
    a.net.shutdown().await;
    b.net.shutdown().await;
    n as f64 / secs
}

/// Runs `run` `runs` times, printing each run's figures; their median rate.
async fn median_rate<Fut: std::future::Future<Output = Run>>(
    name: &str,
    runs: u64,
    mut run: impl FnMut() -> Fut,
) -> f64 {
    let mut v = Vec::new();
    for _ in 0..runs {
        let r = run().await;
        println!(
            "{name} run: {:.0} msg/s, commits per 1k msgs: sender {:.1}, receiver {:.1}; {}",
            r.rate,
            r.sender_per_k,
            r.receiver_per_k,
            r.waste_note()
        );
        v.push(r.rate);
    }
    median(v)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let runs = env("BUS_BENCH_RUNS", 3).max(1);
    let n = env("BUS_BENCH_MSGS", 50_000);
    let c = env("BUS_BENCH_CATCHUP", 100_000);
    let f = env("BUS_BENCH_FRAMES", 200_000);
    let which = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let on = |name: &str| which.as_deref().is_none_or(|w| name.contains(w));
    rt.block_on(async {
        if on("throughput") {
            let rate = median_rate("throughput", runs, || throughput(n)).await;
            println!("bus/throughput/{n}x1KiB: median {rate:.0} msg/s");
        }
        if on("catchup") {
            let rate = median_rate("catchup", runs, || catchup(c)).await;
            println!("bus/catchup/{c}x1KiB: median {rate:.0} msg/s");
        }
        if on("rtt") {
            let (mut p50s, mut p99s) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                let (p50, p99, per_trip) = rtt(500).await;
                println!(
                    "rtt run: p50 {p50:.2} ms, p99 {p99:.2} ms, A's commits per round trip {per_trip:.2}"
                );
                p50s.push(p50);
                p99s.push(p99);
            }
            println!(
                "bus/rtt/1KiB: median p50 {:.2} ms, median p99 {:.2} ms",
                median(p50s),
                median(p99s)
            );
        }
        if on("frames") {
            let mut v = Vec::new();
            for _ in 0..runs {
                let rate = frames(f).await;
                println!("frames run: {rate:.0} frames/s");
                v.push(rate);
            }
            println!("bus/frames/{f}x1KiB: median {:.0} frames/s", median(v));
        }
    });
}
