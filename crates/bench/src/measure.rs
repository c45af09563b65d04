//! Probes and readings: the disk's fsync rate, the smallest store commit,
//! a process's memory, a directory's disk use, percentiles, a temp dir.

use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use mesh_store::{MeshStore, RedbStore, WriteOp};

/// The most iterations of a probe, whatever its time.
const PROBE_ITERATIONS_MAX: u64 = 20_000;

/// The most bytes the write probe writes.
const WRITE_PROBE_BYTES_MAX: u64 = 256 << 20;

/// The write probe syncs after this many bytes (as a big commit would).
const WRITE_SYNC_BYTES: u64 = 8 << 20;

/// Directory levels [`disk_bytes`] descends.
const DISK_WALK_DEPTH_MAX: usize = 4;

/// The disk's serial fsync rate in `dir`: 4 KiB written at the same offset
/// then `fdatasync`, again and again, for at most `time`. Returns
/// (iterations, per second).
pub(super) fn fsync_rate(dir: &Path, time: Duration) -> anyhow::Result<(u64, f64)> {
    on_probe_file(dir, "fsync-probe", |file| {
        let block = [0x5au8; 4096];
        // The first write allocates the block; the loop measures overwrites.
        file.write_all_at(&block, 0)?;
        file.sync_all()?;
        let start = Instant::now();
        let mut n = 0u64;
        while n < PROBE_ITERATIONS_MAX && (n < 3 || start.elapsed() < time) {
            file.write_all_at(&block, 0)?;
            file.sync_data()?;
            n += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        Ok((n, n as f64 / secs))
    })
}

/// The disk's write bandwidth in `dir`: 1 MiB writes, an `fdatasync` after
/// every [`WRITE_SYNC_BYTES`], for at most `time` or [`WRITE_PROBE_BYTES_MAX`].
/// Returns (MiB written, MiB per second).
pub(super) fn write_rate(dir: &Path, time: Duration) -> anyhow::Result<(u64, f64)> {
    on_probe_file(dir, "write-probe", |file| {
        let chunk = vec![0xa5u8; 1 << 20];
        let start = Instant::now();
        let mut written = 0u64;
        while written < WRITE_PROBE_BYTES_MAX && (written == 0 || start.elapsed() < time) {
            file.write_all_at(&chunk, written)?;
            written += chunk.len() as u64;
            if written.is_multiple_of(WRITE_SYNC_BYTES) {
                file.sync_data()?;
            }
        }
        file.sync_data()?;
        let secs = start.elapsed().as_secs_f64();
        Ok((written >> 20, written as f64 / (1 << 20) as f64 / secs))
    })
}

/// Runs `probe` on a new empty file `name` in `dir`, then removes the file,
/// whether the probe succeeded or not.
fn on_probe_file<T>(
    dir: &Path,
    name: &str,
    probe: impl FnOnce(&std::fs::File) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let out = probe(&file);
    drop(file);
    let _ = std::fs::remove_file(&path);
    out
}

/// The rate of the smallest durable store commit (one named cursor) on a
/// fresh redb store in `dir`, for at most `time`. Returns (commits, per second).
pub(super) fn store_commit_rate(dir: &Path, time: Duration) -> anyhow::Result<(u64, f64)> {
    let store_dir = dir.join("store-probe");
    std::fs::create_dir_all(&store_dir)?;
    let result = (|| {
        let store = RedbStore::open(&store_dir)?;
        let mut n = 0u64;
        let start = Instant::now();
        while n < PROBE_ITERATIONS_MAX && (n < 3 || start.elapsed() < time) {
            let op = WriteOp::PutCursor {
                name: "bench".into(),
                arrival: 0,
            };
            for r in store.commit(vec![vec![op]]) {
                r?;
            }
            n += 1;
        }
        anyhow::Ok((n, n as f64 / start.elapsed().as_secs_f64()))
    })();
    let _ = std::fs::remove_dir_all(&store_dir);
    result
}

/// `VmRSS` and `VmHWM` of process `pid`, in bytes.
pub(super) fn memory(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Bytes process `pid` has caused to be written to storage (`write_bytes`
/// of `/proc/PID/io`).
pub(super) fn written(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// CPU time (user + system, every thread) process `pid` has used.
pub(super) fn cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is field 3,
    // utime 14 and stime 15, in clock ticks.
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux architecture.
    Some(Duration::from_millis(ticks * 10))
}

/// The share of the last minute some task waited for `what` (`cpu`, `io`),
/// in percent, from `/proc/pressure`.
pub(super) fn pressure(what: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/pressure/{what}")).ok()?;
    let some = text.lines().find(|l| l.starts_with("some"))?;
    some.split_whitespace()
        .find_map(|f| f.strip_prefix("avg60="))
        .and_then(|v| v.parse().ok())
}

/// Resets the peak RSS (`VmHWM`) of `pid` to its current RSS; false if the
/// kernel refused.
pub(super) fn reset_peak(pid: u32) -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/clear_refs"))
        .and_then(|mut f| f.write_all(b"5"))
        .is_ok()
}

/// Bytes allocated on disk to the files under `dir`.
pub(super) fn disk_bytes(dir: &Path) -> u64 {
    fn walk(dir: &Path, depth: usize) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        let mut sum = 0;
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                if depth < DISK_WALK_DEPTH_MAX {
                    sum += walk(&e.path(), depth + 1);
                }
            } else {
                sum += m.blocks() * 512;
            }
        }
        sum
    }
    walk(dir, 0)
}

/// The nearest-rank `q` quantile (0..=1) of sorted `v`.
pub(super) fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Milliseconds as a float.
pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&v, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&v, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&v, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&v[..1], 0.99), Some(Duration::from_millis(1)));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn the_probes_measure_a_rate_in_a_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let (n, rate) = fsync_rate(tmp.path(), Duration::from_millis(20)).unwrap();
        assert!(n >= 3 && rate > 0.0);
        let (n, rate) = write_rate(tmp.path(), Duration::from_millis(20)).unwrap();
        assert!(n >= 1 && rate > 0.0);
        let (n, rate) = store_commit_rate(tmp.path(), Duration::from_millis(20)).unwrap();
        assert!(n >= 3 && rate > 0.0);
        assert!(disk_bytes(tmp.path()) < 1 << 20, "probes clean up");
        let me = std::process::id();
        let (rss, hwm) = memory(me).unwrap();
        assert!(rss > 0 && hwm >= rss / 2);
        assert!(written(me).is_some());
        assert!(cpu_time(me).is_some());
    }
}
