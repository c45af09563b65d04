//! What one small durable commit costs, and what would move it: the floor
//! under `send-each` and the latency workload (docs/benchmarks.md, "Side by
//! side with NATS").
//!
//! - `floor/redb_tables/N`: a raw redb file, one `Durability::Immediate`
//!   transaction that inserts one 1.4 KiB row into each of `N` tables. Each
//!   table dirties its own pages, so this shows what a commit costs per page
//!   it writes (an agent-mesh send commit writes 10 pages plus the header:
//!   strace, docs/benchmarks.md).
//! - `floor/send_commit`: the store's real commit of one one-envelope send
//!   (`WriteOp::AppendOwn` through `RedbStore::commit`, no writer thread).
//! - `floor/wal_append`: the prototype of a write-ahead file: append one
//!   1.4 KiB record to a file allocated and synced beforehand, then
//!   `fdatasync` — one contiguous write and one flush per commit.
//! - `floor/wal_then_redb_nosync_8`: that append, then the 8-table redb
//!   transaction with `Durability::None`: what a commit would cost with redb
//!   behind a write-ahead file (redb made durable now and then, the file
//!   replayed into it after a crash). A prototype only: nothing in the store
//!   does this.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mesh_protocol::{Channel, NewEnvelope, OpenBatch, SecretKey};
use mesh_store::{MeshStore, RedbStore, WriteOp};
use redb::{Database, Durability, TableDefinition};

/// Bytes of one record: a one-envelope signed batch of 1 KiB with its
/// headers, about what a send commit journals.
const RECORD_BYTES: usize = 1400;
/// The write-ahead file's preallocated size; it wraps around.
const WAL_BYTES: u64 = 64 << 20;
/// Table names for the raw redb shapes.
const TABLES: [&str; 8] = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"];

fn group(c: &mut Criterion) -> criterion::BenchmarkGroup<'_, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group("floor");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(1));
    g
}

/// One transaction inserting key `k` into each of the first `n` tables.
fn redb_commit(db: &Database, n: usize, k: u64, durability: Durability, row: &[u8]) {
    let mut tx = db.begin_write().expect("begin");
    tx.set_durability(durability).expect("durability");
    for name in &TABLES[..n] {
        let def: TableDefinition<'_, u64, &[u8]> = TableDefinition::new(name);
        let mut t = tx.open_table(def).expect("table");
        t.insert(k, row).expect("insert");
        // Keep each table at 64 rows, as acknowledgements keep the outbox short.
        if k >= 64 {
            t.remove(k - 64).expect("remove");
        }
    }
    tx.commit().expect("commit");
}

fn redb_tables(c: &mut Criterion) {
    let row = vec![0x5au8; RECORD_BYTES];
    let mut g = group(c);
    for n in [1usize, 2, 4, 8] {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Database::create(dir.path().join("f.redb")).expect("create");
        g.bench_with_input(BenchmarkId::new("redb_tables", n), &n, |b, &n| {
            let mut k = 0u64;
            b.iter(|| {
                redb_commit(&db, n, k, Durability::Immediate, &row);
                k += 1;
            });
        });
    }
    g.finish();
}

fn send_commit(c: &mut Criterion) {
    let sk = SecretKey::from_bytes(&[7; 32]);
    let to = SecretKey::from_bytes(&[9; 32]).public();
    let mut g = group(c);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RedbStore::open(dir.path()).expect("open");
    let epoch = store.meta().epoch;
    let mut next = 1u64;
    g.bench_function("send_commit", |b| {
        b.iter_custom(|iters| {
            // Signed outside the timed part: only the commits are timed.
            let batches: Vec<_> = (next..next + iters)
                .map(|seq| {
                    let env = NewEnvelope {
                        lamport: seq,
                        created_ms: seq,
                        kind: 1,
                        payload: vec![0xa5; 1024],
                    };
                    OpenBatch::sign(&sk, epoch, Channel::Direct(to), seq, vec![env])
                        .expect("the batch fits the limits")
                })
                .collect();
            next += iters;
            let t0 = Instant::now();
            for batch in batches {
                for r in store.commit(vec![vec![WriteOp::AppendOwn { batch, evict: None }]]) {
                    r.expect("commits");
                }
            }
            t0.elapsed()
        });
    });
    g.finish();
}

/// A file of [`WAL_BYTES`], written and synced, so that appends change no
/// block allocation or size (what `fdatasync` would otherwise also flush).
fn preallocated(dir: &std::path::Path) -> std::fs::File {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.join("wal"))
        .expect("file");
    let chunk = vec![0u8; 1 << 20];
    for i in 0..WAL_BYTES / chunk.len() as u64 {
        f.write_all_at(&chunk, i * chunk.len() as u64)
            .expect("fill");
    }
    f.sync_all().expect("sync");
    f
}

/// Writes `record` into slot `i` of the wrapping file `f` and flushes it.
fn append(f: &std::fs::File, record: &[u8], i: u64) {
    let slots = WAL_BYTES / record.len() as u64;
    f.write_all_at(record, (i % slots) * record.len() as u64)
        .expect("append");
    f.sync_data().expect("fdatasync");
}

fn wal(c: &mut Criterion) {
    let record = vec![0x3cu8; RECORD_BYTES];
    let row = vec![0x5au8; RECORD_BYTES];
    let mut g = group(c);
    let dir = tempfile::tempdir().expect("tempdir");
    let f = preallocated(dir.path());
    let mut i = 0u64;
    g.bench_function("wal_append", |b| {
        b.iter(|| {
            append(&f, &record, i);
            i += 1;
        });
    });
    let db = Database::create(dir.path().join("f.redb")).expect("create");
    let mut k = 0u64;
    g.bench_function("wal_then_redb_nosync_8", |b| {
        b.iter(|| {
            append(&f, &record, i);
            redb_commit(&db, TABLES.len(), k, Durability::None, &row);
            i += 1;
            k += 1;
        });
    });
    g.finish();
}

criterion_group!(benches, redb_tables, send_commit, wal);
criterion_main!(benches);
