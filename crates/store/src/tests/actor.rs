//! The writer actor: group commit, caps, errors, close.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use mesh_protocol::Epoch;

use super::util::*;
use crate::testing::{CommitHook, Hooked};
use crate::{
    GROUP_COMMIT_GROUPS_MAX, MemStore, MeshStore, PeerRecord, Receipt, RedbStore, StoreError,
    StoreHandle, WriteOp,
};

/// A commit hook whose first commit waits for the test, and that records
/// how many groups each commit got.
struct Gated {
    entered: Mutex<mpsc::Sender<()>>,
    release: Mutex<mpsc::Receiver<()>>,
    gate_open: AtomicBool,
    sizes: Mutex<Vec<usize>>,
}

struct Gate {
    entered: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

fn gated() -> (Arc<Hooked<Gated>>, Gate) {
    let (etx, erx) = mpsc::channel();
    let (rtx, rrx) = mpsc::channel();
    let g = Gated {
        entered: Mutex::new(etx),
        release: Mutex::new(rrx),
        gate_open: AtomicBool::new(false),
        sizes: Mutex::new(Vec::new()),
    };
    (
        Arc::new(Hooked::new(MemStore::new(Epoch([9; 16])), g)),
        Gate {
            entered: erx,
            release: rtx,
        },
    )
}

impl CommitHook for Gated {
    fn commit(
        &self,
        inner: &MemStore,
        groups: Vec<Vec<WriteOp>>,
    ) -> Vec<Result<Receipt, StoreError>> {
        self.sizes.lock().expect("lock").push(groups.len());
        if !self.gate_open.swap(true, Ordering::SeqCst) {
            self.entered
                .lock()
                .expect("lock")
                .send(())
                .expect("test waits");
            self.release
                .lock()
                .expect("lock")
                .recv()
                .expect("test releases");
        }
        inner.commit(groups)
    }
}

fn peer_op(author: u8) -> Vec<WriteOp> {
    vec![WriteOp::PutPeer(PeerRecord {
        node: node(author),
        addrs: vec![],
        epoch: None,
    })]
}

/// Spawns `n` single-group commits and waits until all of them are queued.
async fn queue_commits(
    h: &StoreHandle<Hooked<Gated>>,
    n: usize,
    ops: impl Fn(usize) -> Vec<WriteOp>,
) -> Vec<tokio::task::JoinHandle<Result<Receipt, StoreError>>> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let h = h.clone();
            let ops = ops(i);
            tokio::spawn(async move { h.commit(ops).await })
        })
        .collect();
    // Each task enqueues on its first poll; yielding lets them run.
    while h.queued() < n {
        tokio::task::yield_now().await;
    }
    tasks
}

/// Holds the writer in its first commit (of `first_ops`) and returns once it is in there.
async fn hold_writer(
    h: &StoreHandle<Hooked<Gated>>,
    gate: Gate,
    first_ops: Vec<WriteOp>,
) -> (
    tokio::task::JoinHandle<Result<Receipt, StoreError>>,
    mpsc::Sender<()>,
) {
    let first = tokio::spawn({
        let h = h.clone();
        async move { h.commit(first_ops).await }
    });
    let Gate { entered, release } = gate;
    tokio::task::spawn_blocking(move || entered.recv())
        .await
        .expect("join")
        .expect("the writer entered the first commit");
    (first, release)
}

#[tokio::test]
async fn callers_queued_during_a_commit_share_the_next_transaction_and_each_get_their_receipt() {
    let (store, gate) = gated();
    let h = StoreHandle::spawn(store.clone()).expect("spawn");
    let (first, release) = hold_writer(&h, gate, peer_op(50)).await;
    let tasks = queue_commits(&h, 40, |i| {
        vec![WriteOp::Accept {
            batch: peer_batch(3 + i as u8, 1, 1),
            from: 1,
        }]
    })
    .await;
    release.send(()).expect("writer waits");
    first.await.expect("join").expect("first commits");
    let mut arrivals = Vec::new();
    for t in tasks {
        let (a, b) = t
            .await
            .expect("join")
            .expect("commits")
            .arrivals
            .expect("journaled");
        assert_eq!(a, b);
        arrivals.push(a);
    }
    assert_eq!(
        arrivals,
        (1..=40).collect::<Vec<_>>(),
        "each caller got its own receipt"
    );
    assert_eq!(
        *store.sizes.lock().expect("lock"),
        vec![1, 40],
        "40 callers, one transaction"
    );
}

#[tokio::test]
async fn one_callers_refusal_in_a_group_commit_is_only_its_own() {
    let (store, gate) = gated();
    let h = StoreHandle::spawn(store.clone()).expect("spawn");
    let (first, release) = hold_writer(&h, gate, peer_op(50)).await;
    let tasks = queue_commits(&h, 3, |i| {
        // The middle caller skips seq 1.
        let from = if i == 1 { 2 } else { 1 };
        vec![WriteOp::Accept {
            batch: peer_batch(3 + i as u8, from, 1),
            from,
        }]
    })
    .await;
    release.send(()).expect("writer waits");
    first.await.expect("join").expect("first commits");
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("join"));
    }
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(
        matches!(results[1], Err(StoreError::Conflict(_))),
        "{results:?}"
    );
    assert_eq!(*store.sizes.lock().expect("lock"), vec![1, 3]);
}

#[tokio::test]
async fn a_failed_transaction_is_every_callers_error() {
    let (store, gate) = gated();
    let h = StoreHandle::spawn(store.clone()).expect("spawn");
    let (first, release) = hold_writer(&h, gate, peer_op(50)).await;
    let tasks = queue_commits(&h, 5, |i| peer_op(3 + i as u8)).await;
    store.inner().set_unavailable(true);
    release.send(()).expect("writer waits");
    assert!(matches!(
        first.await.expect("join"),
        Err(StoreError::Unavailable(_))
    ));
    for t in tasks {
        assert!(matches!(
            t.await.expect("join"),
            Err(StoreError::Unavailable(_))
        ));
    }
    assert_eq!(*store.sizes.lock().expect("lock"), vec![1, 5]);
    assert!(h.reader().peers().expect("peers").is_empty());
}

#[tokio::test]
async fn a_transaction_holds_at_most_the_group_cap() {
    let (store, gate) = gated();
    let h = StoreHandle::spawn(store.clone()).expect("spawn");
    let (first, release) = hold_writer(&h, gate, peer_op(50)).await;
    let n = GROUP_COMMIT_GROUPS_MAX + 10;
    let tasks = queue_commits(&h, n, |i| peer_op((i % 200) as u8)).await;
    release.send(()).expect("writer waits");
    first.await.expect("join").expect("commits");
    for t in tasks {
        t.await.expect("join").expect("commits");
    }
    assert_eq!(
        *store.sizes.lock().expect("lock"),
        vec![1, GROUP_COMMIT_GROUPS_MAX, 10]
    );
}

#[tokio::test]
async fn commit_groups_answers_each_group_and_splits_past_the_cap() {
    let (store, gate) = gated();
    let h = StoreHandle::spawn(store.clone()).expect("spawn");
    let (first, release) = hold_writer(&h, gate, peer_op(50)).await;
    release.send(()).expect("writer waits");
    first.await.expect("join").expect("commits");
    let n = GROUP_COMMIT_GROUPS_MAX + 1;
    let groups: Vec<_> = (0..n)
        .map(|i| {
            if i == 7 {
                vec![WriteOp::Gap {
                    stream: peer_stream(3),
                    earliest_available: 1,
                }]
            } else {
                peer_op(1)
            }
        })
        .collect();
    let results = h.commit_groups(groups).await;
    assert_eq!(results.len(), n);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.is_err(), i == 7, "group {i}: {r:?}");
    }
    assert_eq!(
        *store.sizes.lock().expect("lock"),
        vec![1, GROUP_COMMIT_GROUPS_MAX, 1]
    );
}

#[tokio::test]
async fn many_concurrent_writers_on_redb_all_commit_their_own_streams() {
    let store = Arc::new(RedbStore::in_memory().expect("store"));
    let h = StoreHandle::spawn(store).expect("spawn");
    let epoch = h.reader().meta().epoch;
    let tasks: Vec<_> = (0..64u8)
        .map(|to| {
            let h = h.clone();
            tokio::spawn(async move {
                for seq in 1..=3 {
                    let b = batch(
                        ME,
                        epoch,
                        mesh_protocol::Channel::Direct(node(to)),
                        seq,
                        &[32],
                    );
                    let r = h
                        .commit(vec![WriteOp::AppendOwn {
                            batch: b,
                            evict: None,
                        }])
                        .await?;
                    assert_eq!(r.own_streams.len(), 1);
                    assert_eq!(r.own_streams[0].next_seq, seq + 1);
                }
                Ok::<_, StoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("join").expect("commits");
    }
    let reader = h.reader();
    assert_eq!(reader.own_streams().expect("read").len(), 64);
    assert_eq!(reader.journal_head().expect("head"), 64 * 3);
}

#[tokio::test]
async fn close_answers_what_was_queued_then_releases_the_store_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h =
        StoreHandle::spawn(Arc::new(RedbStore::open(dir.path()).expect("creates"))).expect("spawn");
    let other = h.clone();
    h.commit(peer_op(3)).await.expect("commits");
    h.close().await;
    assert!(matches!(
        other.commit(peer_op(4)).await,
        Err(StoreError::Closed)
    ));
    drop(other);
    let s = RedbStore::open(dir.path()).expect("the file is free again");
    assert_eq!(s.peers().expect("peers").len(), 1);
}
