//! Whole nodes (core + redb store files + iroh on 127.0.0.1) through stops,
//! crashes and restarts from their data dirs. Every wait is bounded by [`T`].
//!
//! A "crash" runs the node on its own tokio runtime and shuts that runtime
//! down without any shutdown of the node: its memory (core state, frames in
//! flight, reorder buffers) is lost and nothing is closed; only what the
//! store committed survives.

#![allow(clippy::unwrap_used)] // A test fails by panicking.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Got, T, link, node_config, received, wait_head};
use mesh_bus::{CoreConfig as Config, Node, Outgoing};
use mesh_protocol::{Channel, NodeId, SecretKey, Seq, StreamId};
use mesh_store::{
    JournalRecord, LossReason, MeshStore, OnFull, OutboxBounds, RedbStore, StoreError, StoreHandle,
};
use tokio::runtime::Runtime;
use tokio::time::timeout;

/// A node on a data dir; `rt` is set when it runs on its own runtime (so it
/// can be crashed).
struct Running {
    dir: PathBuf,
    key: SecretKey,
    node: Arc<Node>,
    store: Arc<RedbStore>,
    handle: StoreHandle<RedbStore>,
    rt: Option<Runtime>,
}

/// Opens the store in `dir`; while a crashed node's last reads still hold
/// the file, waits for them (bounded by [`T`]).
async fn open_store(dir: &Path) -> Arc<RedbStore> {
    let deadline = Instant::now() + T;
    loop {
        match RedbStore::open(dir) {
            Ok(s) => return Arc::new(s),
            Err(StoreError::AlreadyOpen { .. }) if Instant::now() < deadline => {
                // Only a crashed node's store-read threads can hold it; they end by themselves.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("open store: {e}"),
        }
    }
}

async fn start_in(dir: PathBuf, key: SecretKey, core: Config, own_runtime: bool) -> Running {
    let store = open_store(&dir).await;
    let handle = StoreHandle::spawn(store.clone()).expect("store actor");
    let (node, rt) = if own_runtime {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let started = rt.spawn(Node::start(node_config(core), key.clone(), handle.clone()));
        let node = timeout(T, started)
            .await
            .expect("started in time")
            .expect("task")
            .expect("start");
        (node, Some(rt))
    } else {
        let node = Node::start(node_config(core), key.clone(), handle.clone())
            .await
            .expect("start");
        (node, None)
    };
    Running {
        dir,
        key,
        node: Arc::new(node),
        store,
        handle,
        rt,
    }
}

async fn fresh(root: &Path, name: &str, core: Config) -> Running {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("data dir");
    start_in(dir, SecretKey::generate(), core, false).await
}

impl Running {
    fn id(&self) -> NodeId {
        self.node.node_id()
    }

    /// Stops the node cleanly and releases its store; returns what restarts it.
    async fn stop(self) -> (PathBuf, SecretKey) {
        self.node.shutdown().await;
        self.handle.close().await;
        (self.dir, self.key)
    }

    /// Loses the node's process state at once: nothing is shut down or closed.
    async fn crash(self) -> (PathBuf, SecretKey) {
        let rt = self.rt.expect("a crashable node runs on its own runtime");
        rt.shutdown_background();
        drop(self.node);
        self.handle.close().await;
        (self.dir, self.key)
    }
}

fn payload(i: u64) -> Vec<u8> {
    let mut p = format!("message {i:06} ").into_bytes();
    p.resize(1024, b'.');
    p
}

/// `n` messages numbered `from..from + n` as `Got`, seqs the same.
fn expected(from: u64, n: u64) -> Vec<Got> {
    (from..from + n).map(|i| Got::Msg(i, payload(i))).collect()
}

/// Sends messages `from..from + n` to `to`, in chunks that share commits.
async fn send_numbered(node: &Node, to: NodeId, from: u64, n: u64) {
    let mut i = from;
    while i < from + n {
        let end = (i + 50).min(from + n);
        let msgs: Vec<_> = (i..end)
            .map(|k| Outgoing::plain(to, 0, payload(k)))
            .collect();
        for r in node.submit(msgs).await.await {
            r.expect("send");
        }
        i = end;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_redb_deliver_both_ways_exactly_once_in_order() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = fresh(root.path(), "a", Config::default()).await;
    let b = fresh(root.path(), "b", Config::default()).await;
    link(&a.node, &b.node).await;
    let (sa, sb) = tokio::join!(
        send_numbered(&a.node, b.id(), 1, 200),
        send_numbered(&b.node, a.id(), 1, 200),
    );
    let ((), ()) = (sa, sb);
    // Each journal holds its own 200 and the other's 200.
    wait_head(&a.node, 400).await;
    wait_head(&b.node, 400).await;
    assert_eq!(received(&*b.store, a.id()), expected(1, 200));
    assert_eq!(received(&*a.store, b.id()), expected(1, 200));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_each_receive_every_others_stream_in_order() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = fresh(root.path(), "a", Config::default()).await;
    let b = fresh(root.path(), "b", Config::default()).await;
    let c = fresh(root.path(), "c", Config::default()).await;
    link(&a.node, &b.node).await;
    link(&b.node, &c.node).await;
    link(&a.node, &c.node).await;
    let nodes = [&a, &b, &c];
    let mut sends = Vec::new();
    for from in nodes {
        for to in nodes.iter().filter(|n| n.id() != from.id()) {
            let node = from.node.clone();
            let to = to.id();
            sends.push(tokio::spawn(async move {
                send_numbered(&node, to, 1, 100).await
            }));
        }
    }
    for s in sends {
        timeout(T, s).await.expect("sent in time").expect("task");
    }
    for n in nodes {
        // 200 of its own, 100 from each of the two others.
        wait_head(&n.node, 400).await;
        for other in nodes.iter().filter(|o| o.id() != n.id()) {
            assert_eq!(received(&*n.store, other.id()), expected(1, 100));
        }
    }
    a.stop().await;
    b.stop().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_stopped_while_1000_are_sent_gets_all_exactly_once_in_order_after_restart() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = fresh(root.path(), "a", Config::default()).await;
    let b = fresh(root.path(), "b", Config::default()).await;
    link(&a.node, &b.node).await;
    let to = b.id();
    send_numbered(&a.node, to, 1, 10).await;
    wait_head(&b.node, 10).await;

    let (dir, key) = b.stop().await;
    send_numbered(&a.node, to, 11, 1_000).await;

    // B comes back from its data dir on a new port; it dials A.
    let b = start_in(dir, key, Config::default(), false).await;
    wait_head(&b.node, 1_010).await;
    assert_eq!(received(&*b.store, a.id()), expected(1, 1_010));
    let own = a.node.status().await.expect("status").peers[0]
        .own_stream
        .clone();
    assert_eq!(own.map(|o| o.next_seq), Some(1_011));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_loses_its_process_state_mid_resync_still_gets_each_message_once_in_order() {
    let root = tempfile::tempdir().expect("tempdir");
    // One batch per message and per catch-up read, so the catch-up of 1,000
    // takes 1,000 round trips through A's store: the crash lands inside it.
    let slow_feed = Config {
        catchup_chunk_bytes: 1,
        ..Config::default()
    };
    let a = fresh(root.path(), "a", slow_feed).await;
    let b = fresh(root.path(), "b", Config::default()).await;
    link(&a.node, &b.node).await;
    let to = b.id();
    let (dir, key) = b.stop().await;
    for i in 1..=1_000 {
        a.node.send(to, 0, payload(i)).await.expect("send");
    }

    // B restarts and is crashed while it is catching up.
    let b = start_in(dir, key, Config::default(), true).await;
    wait_head(&b.node, 300).await;
    let (dir, key) = b.crash().await;
    let partial = {
        let store = open_store(&dir).await;
        let got = received(&*store, a.id());
        assert_eq!(
            got,
            expected(1, got.len() as u64),
            "a prefix, nothing twice"
        );
        got.len()
    };
    println!("crashed with {partial} of 1000 committed");
    assert!(
        (300..1_000).contains(&partial),
        "the crash came mid-resync ({partial} of 1000 committed)"
    );

    let b = start_in(dir, key, Config::default(), false).await;
    wait_head(&b.node, 1_000).await;
    assert_eq!(received(&*b.store, a.id()), expected(1, 1_000));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_past_retention_gets_a_gap_with_the_right_earliest_available_then_every_retained_message()
 {
    let root = tempfile::tempdir().expect("tempdir");
    let bounded = Config {
        outbox: OutboxBounds {
            max_msgs: 100,
            max_bytes: 1 << 30,
            on_full: OnFull::EvictOldest,
        },
        ..Config::default()
    };
    let a = fresh(root.path(), "a", bounded).await;
    let b = fresh(root.path(), "b", Config::default()).await;
    link(&a.node, &b.node).await;
    let to = b.id();
    send_numbered(&a.node, to, 1, 5).await;
    wait_head(&b.node, 5).await;

    let (dir, key) = b.stop().await;
    // 400 more while B is away: only the newest 100 stay in A's outbox.
    send_numbered(&a.node, to, 6, 400).await;
    let stream = StreamId {
        author: a.id(),
        epoch: a.node.epoch(),
        channel: Channel::Direct(to),
    };
    let retained = a.store.read_outbox(&stream, 0, u64::MAX).expect("outbox");
    let first_retained = retained
        .first()
        .map(|b| b.batch.first_seq)
        .expect("something retained");
    let last = 405;
    let lost: Vec<(Seq, Seq)> = a
        .store
        .journal(0, 10_000)
        .expect("journal")
        .into_iter()
        .filter_map(|i| match i.record {
            JournalRecord::Loss {
                from,
                to,
                reason: LossReason::OutboxEvicted,
                ..
            } => Some((from, to)),
            _ => None,
        })
        .collect();
    // The first seq A still holds, by its own loss records.
    let earliest = lost.last().map(|l| l.1 + 1).expect("a loss record");
    assert!(earliest > 6 && last - earliest < 100, "retention applied");
    assert!(first_retained <= earliest);

    let b = start_in(dir, key, Config::default(), false).await;
    // 5 before, one gap record, then what was retained.
    wait_head(&b.node, 5 + 1 + (last - earliest + 1)).await;
    let mut want = expected(1, 5);
    want.push(Got::Gap(6, earliest - 1));
    want.extend(expected(earliest, last - earliest + 1));
    assert_eq!(received(&*b.store, a.id()), want);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_node_is_refused_and_nothing_of_it_arrives() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = fresh(root.path(), "a", Config::default()).await;
    let stranger = fresh(root.path(), "s", Config::default()).await;
    // The stranger knows A; A does not know the stranger.
    stranger
        .node
        .add_peer(a.id(), a.node.ticket().addrs)
        .await
        .expect("stranger adds a");
    stranger
        .node
        .send(a.id(), 0, b"let me in".to_vec())
        .await
        .expect("committed to the stranger's own outbox");
    let deadline = Instant::now() + T;
    let mut head = a.node.journal_head();
    loop {
        let status = a.node.status().await.expect("status");
        if status.net.refused > 0 {
            assert!(status.peers.is_empty());
            break;
        }
        assert!(Instant::now() < deadline, "no refusal in time");
        // Nothing to wait on but the refusal counter: look again shortly.
        let _ = timeout(Duration::from_millis(50), head.changed()).await;
    }
    let s = stranger.node.status().await.expect("status");
    assert!(s.peers.iter().all(|p| p.conn.is_none()), "never connected");
    assert_eq!(a.node.status().await.expect("status").journal_head, 0);
    assert!(received(&*a.store, stranger.id()).is_empty());
    a.stop().await;
    stranger.stop().await;
}
