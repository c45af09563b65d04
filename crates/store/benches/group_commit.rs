//! Group-commit throughput of the store writer on a real file.
//!
//! `W` concurrent writers each append pre-signed batches of `B` envelopes
//! (1 KiB payload each) to their own stream through one [`StoreHandle`] over
//! a [`RedbStore`] in a temp dir; one criterion iteration is one batch from
//! every writer, and the reported throughput is envelopes per second.
//! `B = 1` with many writers is the worst case (every envelope its own stream
//! and signature); `16 x 16` is what the bus does under load, one batch per
//! stream per group commit. Signing and store creation are outside the timed
//! part. `fsync_4k` measures the disk's `pwrite(4 KiB) + fdatasync` rate.
//!
//! Two more groups mimic the node's bulk write paths, one commit per
//! iteration: `catch_up_1k` is a receiver catching up on one stream (one
//! commit of 256 verified batches of 16 envelopes, each batch its own
//! `Accept` group, as the bus sends them), `pipelined_1k` a sender with a
//! full window to one peer (one commit of 16 `AppendOwn` groups of 16
//! envelopes on one stream).

use std::fs::OpenOptions;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use mesh_protocol::{Channel, Epoch, NewEnvelope, OpenBatch, SecretKey};
use mesh_store::{MeshStore, RedbStore, StoreHandle, WriteOp};

/// Payload bytes per envelope.
const PAYLOAD_BYTES: usize = 1024;
/// (writers, envelopes per batch) measured.
const SHAPES: [(usize, usize); 4] = [(1, 1), (16, 1), (256, 1), (16, 16)];
/// Envelopes pre-signed per writer, at most; longer runs reuse them on a fresh store.
const CHAIN_ENVELOPES_MAX: usize = 50_000;
/// Pre-signed envelopes in all writers' chains, at most (bounds memory).
const CHAIN_TOTAL_MAX: usize = 64_000;

fn secret() -> SecretKey {
    SecretKey::from_bytes(&[7; 32])
}

/// Signs `len` batches of `per` envelopes from seq 1 on, of the stream to `to`.
fn chain(epoch: Epoch, to: usize, len: usize, per: usize) -> Vec<OpenBatch> {
    chain_by(&secret(), epoch, to, len, per)
}

/// [`chain`] by the author `sk`.
fn chain_by(sk: &SecretKey, epoch: Epoch, to: usize, len: usize, per: usize) -> Vec<OpenBatch> {
    let mut seed = [9u8; 32];
    seed[..8].copy_from_slice(&(to as u64).to_le_bytes());
    let recipient = SecretKey::from_bytes(&seed).public();
    (0..len as u64)
        .map(|i| {
            let first = i * per as u64 + 1;
            let envs = (first..first + per as u64)
                .map(|seq| NewEnvelope {
                    lamport: seq,
                    created_ms: seq,
                    kind: 0,
                    payload: vec![(seq % 251) as u8; PAYLOAD_BYTES],
                })
                .collect();
            OpenBatch::sign(sk, epoch, Channel::Direct(recipient), first, envs)
                .expect("the batch fits the limits")
        })
        .collect()
}

/// Pre-signs every writer's chain, on all cores.
fn chains(epoch: Epoch, writers: usize, len: usize, per: usize) -> Vec<Vec<OpenBatch>> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let share = writers.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .step_by(share)
            .map(|start| {
                s.spawn(move || {
                    (start..(start + share).min(writers))
                        .map(|w| chain(epoch, w, len, per))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("signer"))
            .collect()
    })
}

/// Runs `rounds` rounds in chunks of at most `len`, each chunk on a fresh
/// store: `prepare(store, n)` builds the work of a chunk of `n` rounds
/// untimed, `commit(handle, work)` commits it. Returns only the time spent in
/// `commit`.
fn on_fresh_stores<W, Fut>(
    rt: &tokio::runtime::Runtime,
    rounds: u64,
    len: usize,
    prepare: impl Fn(&RedbStore, usize) -> W,
    commit: impl Fn(StoreHandle<RedbStore>, W) -> Fut,
) -> Duration
where
    Fut: Future<Output = ()>,
{
    let mut left = rounds as usize;
    let mut spent = Duration::ZERO;
    while left > 0 {
        let n = left.min(len);
        left -= n;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(RedbStore::open(dir.path()).expect("store opens"));
        let work = prepare(&store, n);
        let handle = StoreHandle::spawn(store).expect("writer starts");
        spent += rt.block_on(async {
            let start = Instant::now();
            commit(handle.clone(), work).await;
            let spent = start.elapsed();
            handle.close().await;
            spent
        });
    }
    spent
}

/// The runtime the benchmarks drive the store writer on.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A group of few, long samples: each sample commits thousands of envelopes.
fn slow_group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .warm_up_time(Duration::from_secs(2));
    g
}

/// Runs `rounds` batches from each writer on fresh stores, returning only the time spent committing.
fn run(rt: &tokio::runtime::Runtime, writers: usize, per: usize, rounds: u64) -> Duration {
    let len = (CHAIN_TOTAL_MAX / writers / per)
        .min(CHAIN_ENVELOPES_MAX / per)
        .max(1);
    on_fresh_stores(
        rt,
        rounds,
        len,
        |store, n| chains(store.meta().epoch, writers, n, per),
        |handle, work| async move {
            let tasks: Vec<_> = work
                .into_iter()
                .map(|batches| {
                    let h = handle.clone();
                    tokio::spawn(async move {
                        for batch in batches {
                            h.commit(vec![WriteOp::AppendOwn { batch, evict: None }])
                                .await
                                .expect("append commits");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("writer task");
            }
        },
    )
}

fn group_commit(c: &mut Criterion) {
    let rt = runtime();
    let mut g = slow_group(c, "group_commit_1k");
    for (writers, per) in SHAPES {
        g.throughput(Throughput::Elements((writers * per) as u64));
        let id = BenchmarkId::new("writers_x_batch", format!("{writers}x{per}"));
        g.bench_with_input(id, &(writers, per), |b, &(w, p)| {
            b.iter_custom(|rounds| run(&rt, w, p, rounds));
        });
    }
    g.finish();
}

fn fsync(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.path().join("f"))
        .expect("file");
    let block = vec![0xa5u8; 4096];
    let mut g = c.benchmark_group("disk");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(1));
    g.bench_function("fsync_4k", |b| {
        let mut i = 0u64;
        b.iter(|| {
            f.write_all_at(&block, (i % 256) * 4096).expect("write");
            f.sync_data().expect("fdatasync");
            i += 1;
        });
    });
    g.finish();
}

/// Batches in one catch-up commit (the bus's inbound cap per commit).
const CATCH_UP_BATCHES: usize = 256;
/// Batches in one pipelined-send commit.
const PIPELINED_BATCHES: usize = 16;
/// Envelopes per batch in both bulk shapes.
const BULK_PER: usize = 16;

/// Runs `rounds` commits of `per_commit` groups from one pre-signed chain of
/// one stream, on fresh stores; `op` turns a batch into its group. Returns
/// only the time spent committing.
fn run_bulk(
    rt: &tokio::runtime::Runtime,
    rounds: u64,
    per_commit: usize,
    foreign: bool,
    op: fn(OpenBatch) -> WriteOp,
) -> Duration {
    let len = (CHAIN_TOTAL_MAX / BULK_PER / per_commit).max(1);
    on_fresh_stores(
        rt,
        rounds,
        len,
        |store, n| {
            if foreign {
                // Another node's stream, as a receiver sees it.
                chain_by(
                    &SecretKey::from_bytes(&[3; 32]),
                    Epoch([5; 16]),
                    0,
                    n * per_commit,
                    BULK_PER,
                )
            } else {
                chain(store.meta().epoch, 0, n * per_commit, BULK_PER)
            }
        },
        |handle, batches| async move {
            let mut batches = batches.into_iter();
            loop {
                let groups: Vec<_> = batches
                    .by_ref()
                    .take(per_commit)
                    .map(|b| vec![op(b)])
                    .collect();
                if groups.is_empty() {
                    break;
                }
                for r in handle.commit_groups(groups).await {
                    r.expect("bulk group commits");
                }
            }
        },
    )
}

fn bulk(c: &mut Criterion) {
    let rt = runtime();
    let mut g = slow_group(c, "bulk_1k");
    g.throughput(Throughput::Elements((CATCH_UP_BATCHES * BULK_PER) as u64));
    g.bench_function("catch_up_256x16", |b| {
        b.iter_custom(|rounds| {
            run_bulk(&rt, rounds, CATCH_UP_BATCHES, true, |batch| {
                let from = batch.batch().first_seq();
                WriteOp::Accept { batch, from }
            })
        });
    });
    g.throughput(Throughput::Elements((PIPELINED_BATCHES * BULK_PER) as u64));
    g.bench_function("pipelined_16x16", |b| {
        b.iter_custom(|rounds| {
            run_bulk(&rt, rounds, PIPELINED_BATCHES, false, |batch| {
                WriteOp::AppendOwn { batch, evict: None }
            })
        });
    });
    g.finish();
}

criterion_group!(benches, fsync, group_commit, bulk);
criterion_main!(benches);
