//! Crash consistency of the redb store: build the file a power loss would
//! leave at many points of a long workload, reopen it, and check that every
//! commit acknowledged before that point is there, exactly.
//!
//! A recording [`StorageBackend`] logs every write and sync of a workload
//! run through [`RedbStore`], which is checked op for op against
//! [`MemStore`] (the model). For a crash after sync `k`, the disk holds
//! everything up to sync `k` plus any subset of the writes issued before sync
//! `k + 1`, each whole, lost, or torn at sector granularity. The reopened
//! store must equal the model after the last commit that had returned by
//! sync `k`, or after the one in flight.
//!
//! Set `MESH_STORE_CRASH_SEED` to explore other workloads and crash images.

use std::sync::{Arc, Mutex};

use mesh_protocol::{Channel, StreamId};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redb::StorageBackend;
use redb::backends::InMemoryBackend;

use super::util::*;
use crate::{
    Eviction, LossReason, MemStore, MeshStore, PeerRecord, RedbStore, StoreError, WriteOp,
};

/// The default seed; override with `MESH_STORE_CRASH_SEED`.
const DEFAULT_SEED: u64 = 0x6d65_7368_2d73_746f;
/// Ops in the workload, at least.
const WORKLOAD_OPS_MIN: usize = 1000;
/// Crash points checked, at most (sampled evenly over all syncs; the default workload has fewer).
const CRASH_POINTS_MAX: usize = 400;
/// The atomic unit of a torn write.
const SECTOR_BYTES: usize = 512;
/// Durable cursors the workload sets.
const CURSORS: [&str; 2] = ["a", "b"];

#[derive(Debug, Clone)]
enum Event {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
    Sync,
}

#[derive(Debug, Default)]
struct Recording {
    live: Vec<u8>,
    log: Vec<Event>,
    syncs: usize,
}

/// A memory image that logs every write, length change and sync.
#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<Recording>>);

impl Recorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Recording> {
        self.0.lock().expect("recorder lock")
    }
}

fn apply(image: &mut Vec<u8>, event: &Event) {
    match event {
        Event::Write { offset, data } => write_at(image, *offset as usize, data),
        Event::SetLen(len) => image.resize(*len as usize, 0),
        Event::Sync => {}
    }
}

fn write_at(image: &mut Vec<u8>, offset: usize, data: &[u8]) {
    if image.len() < offset + data.len() {
        image.resize(offset + data.len(), 0);
    }
    image[offset..offset + data.len()].copy_from_slice(data);
}

impl StorageBackend for Recorder {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.lock().live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let r = self.lock();
        let start = offset as usize;
        let src = r
            .live
            .get(start..start + out.len())
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut r = self.lock();
        r.live.resize(len as usize, 0);
        r.log.push(Event::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut r = self.lock();
        r.syncs += 1;
        r.log.push(Event::Sync);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut r = self.lock();
        write_at(&mut r.live, offset as usize, data);
        r.log.push(Event::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }
}

/// Generates a random but mostly valid workload against the model's state.
struct Workload {
    rng: StdRng,
    ops: usize,
}

/// Recipients of own streams.
const RECIPIENTS: [u8; 3] = [2, 3, 4];
/// Authors of streams this node receives.
const AUTHORS: [u8; 3] = [5, 6, 7];

impl Workload {
    fn op(&mut self, model: &MemStore) -> WriteOp {
        self.ops += 1;
        let r = &mut self.rng;
        match r.random_range(0..100) {
            0..35 => self.append(model),
            35..50 => self.ack(model),
            50..58 => {
                // A member's topic batch: refused while this node is not a member.
                let author = AUTHORS[r.random_range(0..3)];
                let m = mark(model, &topic_stream(author));
                let evict = r.random_bool(0.3).then(|| crate::Eviction {
                    msgs_max: r.random_range(0..6),
                    bytes_max: u64::MAX,
                    loss: None,
                });
                WriteOp::AcceptTopic {
                    batch: topic_batch(author, m + 1, r.random_range(1..=3usize)),
                    from: m + 1,
                    evict,
                }
            }
            58..60 => {
                if r.random_bool(0.8) {
                    member_of(topic(), 10)
                } else {
                    WriteOp::LeaveTopic { topic: topic() }
                }
            }
            60..80 => {
                let author = AUTHORS[r.random_range(0..3)];
                let m = mark(model, &peer_stream(author));
                // The author sends from where it is; a resend starts inside an old batch.
                let first = if r.random_range(0..6) == 0 {
                    m.saturating_sub(1).max(1)
                } else {
                    m + 1
                };
                let n = r.random_range(1..=3usize);
                WriteOp::Accept {
                    batch: peer_batch(author, first, n),
                    from: m + 1,
                }
            }
            80..87 => {
                let author = AUTHORS[r.random_range(0..3)];
                let m = mark(model, &peer_stream(author));
                WriteOp::Gap {
                    stream: peer_stream(author),
                    earliest_available: m + r.random_range(1..5),
                }
            }
            87..92 => WriteOp::PutCursor {
                name: CURSORS[r.random_range(0..2)].into(),
                arrival: r.random_range(0..=model.journal_head().expect("head") + 1),
            },
            92..96 => self.peer(),
            96 => WriteOp::Trim {
                // All or nothing: the two stores count a row's bytes apart,
                // and both trim the same rows at these bounds.
                now_ms: self.ops as u64 * 1_000,
                bytes_max: if r.random_bool(0.5) { 0 } else { u64::MAX },
                age_ms_max: 0,
            },
            97 => {
                // Now and then past the head, which both stores must refuse.
                let head = model.journal_head().expect("head");
                let from = r.random_range(1..=head + 1);
                WriteOp::RecordLag {
                    subscriber: format!("subscriber {}", r.random_range(0..3)),
                    from,
                    to: (from + r.random_range(0..5)).min(head + 1),
                }
            }
            _ => {
                let from = r.random_range(1..50);
                WriteOp::RecordLoss {
                    stream: peer_stream(AUTHORS[0]),
                    from,
                    to: from + r.random_range(0..5),
                    reason: LossReason::SubscriberLagged,
                    detail: "lagged".into(),
                }
            }
        }
    }

    /// An own batch at the next seq (now and then a wrong one, which both
    /// stores must refuse), with no eviction or one down to random
    /// targets: lossless (refused if it would drop unacknowledged seqs) or
    /// recording a loss.
    fn append(&mut self, model: &MemStore) -> WriteOp {
        let r = &mut self.rng;
        let epoch = model.meta().epoch;
        let to = RECIPIENTS[r.random_range(0..3)];
        let stream = StreamId::direct(node(ME), epoch, node(to));
        let next = own_state(model, &stream).map_or(1, |o| o.next_seq);
        let first = if r.random_range(0..20) == 0 {
            next + 1
        } else {
            next
        };
        let sizes: Vec<usize> = (0..r.random_range(1..=3))
            .map(|_| r.random_range(0..120))
            .collect();
        let evict = match r.random_range(0..4) {
            0 | 1 => None,
            n => Some(Eviction {
                msgs_max: r.random_range(0..8),
                bytes_max: r.random_range(0..600),
                loss: (n == 3).then(|| "full".into()),
            }),
        };
        WriteOp::AppendOwn {
            batch: batch(ME, epoch, Channel::Direct(node(to)), first, &sizes),
            evict,
        }
    }

    /// An ack of an own stream, forward (or, now and then, a reset anywhere).
    fn ack(&mut self, model: &MemStore) -> WriteOp {
        let r = &mut self.rng;
        let to = RECIPIENTS[r.random_range(0..3)];
        let stream = StreamId::direct(node(ME), model.meta().epoch, node(to));
        let (acked, next) =
            own_state(model, &stream).map_or((0, 1), |o| (o.last_acked, o.next_seq));
        let reset = r.random_range(0..15) == 0;
        let upto = if reset {
            r.random_range(0..next)
        } else {
            r.random_range(acked..next)
        };
        WriteOp::Acked {
            stream,
            upto,
            reset,
        }
    }

    /// A peer added (or readdressed) or removed.
    fn peer(&mut self) -> WriteOp {
        let r = &mut self.rng;
        let n = AUTHORS[r.random_range(0..3)];
        if r.random_bool(0.7) {
            WriteOp::PutPeer(PeerRecord {
                node: node(n),
                addrs: vec![
                    format!("127.0.0.1:{}", r.random_range(1000..2000))
                        .parse()
                        .expect("addr"),
                ],
                epoch: None,
            })
        } else {
            WriteOp::RemovePeer(node(n))
        }
    }
}

/// The workload must exercise what it claims to: refused groups,
/// evictions, and evictions recorded as a loss.
fn assert_exercised(seed: u64, model: &MemStore, refused: usize, losses: usize) {
    let evicted: u64 = model
        .own_streams()
        .expect("own streams")
        .iter()
        .map(|o| o.first_retained - 1)
        .sum();
    let trimmed = model.journal_bounds().expect("bounds").first > 1;
    assert!(
        refused > 10 && evicted > 10 && losses > 5 && trimmed,
        "seed {seed}: {refused} refused, {evicted} evicted, {losses} losses, trimmed {trimmed}"
    );
}

fn same_outcome(
    a: &Result<crate::Receipt, StoreError>,
    b: &Result<crate::Receipt, StoreError>,
) -> bool {
    // A trim's bytes are counted apart by the two stores; the rest is the same.
    let same_bytes = |r: &crate::Receipt| {
        let mut r = r.clone();
        if let Some(t) = &mut r.trim {
            t.bounds.bytes = 0;
        }
        r
    };
    match (a, b) {
        (Ok(x), Ok(y)) => same_bytes(x) == same_bytes(y),
        (Err(x), Err(y)) => std::mem::discriminant(x) == std::mem::discriminant(y),
        _ => false,
    }
}

/// What the workload left: the log, and per commit its digest and the syncs done when it returned.
struct Run {
    log: Vec<Event>,
    base: Vec<u8>,
    initial_digest: u64,
    digests: Vec<u64>,
    syncs_at_return: Vec<usize>,
}

fn run_workload(seed: u64) -> Run {
    let rec = Recorder::default();
    let store = RedbStore::with_backend(rec.clone(), "recorded").expect("creates");
    let base = {
        let mut r = rec.lock();
        r.log.clear();
        r.syncs = 0;
        r.live.clone()
    };
    let model = MemStore::new(store.meta().epoch);
    let initial_digest = digest(&dump(&model, &CURSORS).expect("dump"));
    let mut w = Workload {
        rng: StdRng::seed_from_u64(seed),
        ops: 0,
    };
    let (mut digests, mut syncs_at_return) = (Vec::new(), Vec::new());
    let mut refused = 0;
    // Loss records journaled so far (a trim may take them out of the journal later).
    let (mut losses, mut seen) = (0, 0);
    while w.ops < WORKLOAD_OPS_MIN {
        let groups: Vec<Vec<WriteOp>> = (0..w.rng.random_range(1..=4))
            .map(|_| {
                let n = w.rng.random_range(1..=3);
                (0..n).map(|_| w.op(&model)).collect()
            })
            .collect();
        let want = model.commit(groups.clone());
        let got = store.commit(groups);
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            assert!(
                same_outcome(w, g),
                "seed {seed}: model {w:?} but redb {g:?}"
            );
            refused += usize::from(matches!(w, Err(StoreError::Conflict(_))));
        }
        syncs_at_return.push(rec.lock().syncs);
        digests.push(digest(&dump(&model, &CURSORS).expect("dump")));
        for item in model.journal(seen, usize::MAX).expect("journal") {
            seen = seen.max(item.arrival);
            losses += usize::from(matches!(
                item.record,
                crate::JournalRecord::Loss {
                    reason: LossReason::OutboxEvicted,
                    ..
                }
            ));
        }
    }
    assert_eq!(
        dump(&store, &CURSORS).expect("dump"),
        dump(&model, &CURSORS).expect("dump"),
        "seed {seed}"
    );
    assert_exercised(seed, &model, refused, losses);
    let log = std::mem::take(&mut rec.lock().log);
    drop(store);
    Run {
        log,
        base,
        initial_digest,
        digests,
        syncs_at_return,
    }
}

/// Opens a crash image and returns the digest of what it holds.
fn recover(image: &[u8], ctx: &str) -> u64 {
    let backend = InMemoryBackend::new();
    backend.set_len(image.len() as u64).expect("set_len");
    backend.write(0, image).expect("write");
    let mut s = RedbStore::with_backend(backend, "crash image")
        .unwrap_or_else(|e| panic!("{ctx}: the crash image does not open: {e}"));
    assert!(
        s.check_integrity().unwrap_or_else(|e| panic!("{ctx}: {e}")),
        "{ctx}: integrity check failed"
    );
    let d = digest(&dump(&s, &CURSORS).unwrap_or_else(|e| panic!("{ctx}: {e}")));
    // The recovered store takes new commits.
    commit1(
        &s,
        vec![WriteOp::PutCursor {
            name: "after-crash".into(),
            arrival: 0,
        }],
    )
    .unwrap_or_else(|e| panic!("{ctx}: a commit after recovery fails: {e}"));
    d
}

#[test]
fn every_acknowledged_commit_survives_a_power_loss_at_any_sync() {
    let seed = std::env::var("MESH_STORE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let run = run_workload(seed);
    let sync_at: Vec<usize> = run
        .log
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Event::Sync))
        .map(|(i, _)| i)
        .collect();
    assert!(
        sync_at.len() >= run.digests.len(),
        "seed {seed}: {} syncs for {} durable commits",
        sync_at.len(),
        run.digests.len()
    );
    // Crash points: k = syncs completed, 0..=all, sampled evenly, always the last.
    let total = sync_at.len();
    let step = total.div_ceil(CRASH_POINTS_MAX).max(1);
    let mut points: Vec<usize> = (0..=total).step_by(step).collect();
    if points.last() != Some(&total) {
        points.push(total);
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut image = run.base.clone();
    let mut applied = 0; // events of the log applied to `image`
    let (mut torn, mut dropped, mut in_flight_seen) = (0, 0, 0);
    for &k in &points {
        // Durable: everything up to and including the k-th sync.
        let durable_end = if k == 0 { 0 } else { sync_at[k - 1] + 1 };
        for e in &run.log[applied..durable_end] {
            apply(&mut image, e);
        }
        applied = durable_end;
        let window_end = sync_at.get(k).copied().unwrap_or(run.log.len());
        let mut crashed = image.clone();
        for e in &run.log[durable_end..window_end] {
            match rng.random_range(0..3) {
                0 => dropped += 1,
                1 => apply(&mut crashed, e),
                _ => match e {
                    Event::Write { offset, data } => {
                        torn += 1;
                        for (i, sector) in data.chunks(SECTOR_BYTES).enumerate() {
                            if rng.random_bool(0.5) {
                                write_at(&mut crashed, *offset as usize + i * SECTOR_BYTES, sector);
                            }
                        }
                    }
                    other => apply(&mut crashed, other),
                },
            }
        }
        let acked = run.syncs_at_return.iter().filter(|&&s| s <= k).count();
        let at = |c: usize| {
            if c == 0 {
                run.initial_digest
            } else {
                run.digests[c - 1]
            }
        };
        let ctx = format!(
            "seed {seed} (MESH_STORE_CRASH_SEED), crash after sync {k} of {total}, {acked} commits acknowledged"
        );
        let got = recover(&crashed, &ctx);
        let in_flight = acked < run.digests.len() && got == at(acked + 1);
        in_flight_seen += usize::from(in_flight);
        assert!(
            got == at(acked) || in_flight,
            "{ctx}: the recovered store is neither the state after the last acknowledged commit \
             nor after the one in flight"
        );
    }
    assert!(
        torn > 0 && dropped > 0,
        "seed {seed}: the crash images tore {torn} and dropped {dropped} writes"
    );
    eprintln!(
        "seed {seed}: {} commits, {total} syncs, {} crash images, {torn} torn / {dropped} lost writes, \
         {in_flight_seen} images held the commit in flight",
        run.digests.len(),
        points.len()
    );
}
