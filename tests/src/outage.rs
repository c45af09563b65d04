//! Store outage: a node's data dir on a small tmpfs that is filled up while
//! it takes sends, then emptied again (root only).
//!
//! What must hold: sends are refused (`503 store_unavailable`) or held, never
//! acknowledged and then lost; the daemon keeps running and takes sends
//! again by itself once the filesystem has room; and after the other node
//! catches up, the checker finds nothing lost, duplicated or out of order.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::chaos::{Follower, converge};
use crate::checker::{Summary, check};
use crate::cluster::{Cluster, ClusterConfig, Isolation, write_journal};
use crate::history::History;
use crate::workload::{Ended, Send};

/// The tmpfs's size.
pub const TMPFS_BYTES: u64 = 32 << 20;
/// Sends before the filesystem is filled.
const SENDS_BEFORE: u64 = 20;
/// The most sends tried while the filesystem is full.
const SENDS_FULL_MAX: u64 = 20_000;
/// Refused (or unanswered) sends in a row that show the outage bit.
const REFUSED_IN_A_ROW: u32 = 5;
/// Accepted sends in a row that show the node recovered.
const OK_IN_A_ROW: u32 = 5;
/// How long the full phase and the recovery phase may each take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long one send may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between sends while the node refuses them.
const REFUSED_PAUSE: Duration = Duration::from_millis(50);

/// A tmpfs mounted on a temp dir, unmounted when dropped.
#[derive(Debug)]
pub struct Tmpfs {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` on a new temp dir.
    ///
    /// # Errors
    /// If not root or `mount` fails.
    pub fn mount(bytes: u64) -> anyhow::Result<Tmpfs> {
        if !rustix::process::geteuid().is_root() {
            bail!("mounting a tmpfs needs root");
        }
        let dir = tempfile::Builder::new()
            .prefix("mesh-outage-")
            .tempdir()
            .context("cannot make a temp dir")?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={bytes},mode=0700"))
            .arg("tmpfs")
            .arg(dir.path())
            .output()
            .context("cannot run mount")?;
        if !out.status.success() {
            bail!(
                "mount failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Tmpfs { dir, mounted: true })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a filler file until the filesystem is full; answers its size.
    ///
    /// # Errors
    /// If the file cannot be created, or writing fails otherwise than by
    /// running out of space.
    pub fn fill(&self) -> anyhow::Result<u64> {
        let path = self.filler();
        let mut f = std::fs::File::create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        // Bounded: the filesystem holds at most TMPFS_BYTES.
        for _ in 0..=(TMPFS_BYTES / chunk.len() as u64 + 1) {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => return Err(e).context("filling the tmpfs"),
            }
        }
        // Whatever a short write left: one byte at a time is too slow, and
        // a few KiB free do not matter to a store that grows in pages.
        let _ = f.sync_all();
        Ok(written)
    }

    /// Removes the filler file.
    ///
    /// # Errors
    /// If it cannot be removed.
    pub fn unfill(&self) -> anyhow::Result<()> {
        std::fs::remove_file(self.filler()).context("cannot remove the filler")
    }

    fn filler(&self) -> PathBuf {
        self.dir.path().join("filler.bin")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            // Lazy: a daemon killed a moment ago may still hold a file.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
            self.mounted = false;
        }
    }
}

/// What a store outage run saw.
#[derive(Clone, Debug, Serialize)]
pub struct OutageReport {
    /// Bytes the filler took.
    pub filler_bytes: u64,
    /// Sends acknowledged while the filesystem was full (before the outage bit).
    pub ok_while_full: u64,
    /// Sends refused while it was full.
    pub refused_while_full: u64,
    /// Sends with no answer while it was full.
    pub unknown_while_full: u64,
    /// The first refusal's error.
    pub first_refusal: Option<String>,
    /// Whether the node refused sends at all (the outage bit).
    pub outage_bit: bool,
    /// Milliseconds from freeing space to accepted sends again, if it recovered.
    pub recovered_after_ms: Option<u64>,
    /// Whether the daemon was still running at the end.
    pub daemon_survived: bool,
    /// If it did not recover by itself: whether a restart (SIGTERM, start
    /// on the same data dir) made it take sends again.
    pub recovered_after_restart: Option<bool>,
    /// Whether the other node caught up.
    pub converged: bool,
    /// The checker's counts.
    pub summary: Summary,
    /// Where the files are.
    pub out_dir: PathBuf,
}

impl OutageReport {
    /// Whether the node refused while full, recovered by itself, kept
    /// running, and nothing acknowledged was lost.
    pub fn passed(&self) -> bool {
        self.outage_bit
            && self.recovered_after_ms.is_some()
            && self.daemon_survived
            && self.converged
            && self.summary.passed()
    }
}

/// Runs the store outage scenario with `bin`, writing to `out_dir`.
///
/// # Errors
/// If it cannot be set up (no root, no mount, a daemon does not start).
pub fn run_blocking(bin: &Path, out_dir: &Path) -> anyhow::Result<OutageReport> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    rt.block_on(run(bin, out_dir))
}

async fn run(bin: &Path, out_dir: &Path) -> anyhow::Result<OutageReport> {
    if out_dir.exists() {
        std::fs::remove_dir_all(out_dir)
            .with_context(|| format!("cannot clear {}", out_dir.display()))?;
    }
    std::fs::create_dir_all(out_dir)?;
    let tmpfs = Tmpfs::mount(TMPFS_BYTES)?;
    let mut cfg = ClusterConfig::new(bin, 2);
    cfg.isolation = Isolation::Loopback;
    cfg.log_dir = Some(out_dir.to_owned());
    cfg.data_dirs = BTreeMap::from([(0, tmpfs.path().join("n0"))]);
    let mut cluster = Cluster::start(cfg).await?;
    let history = Arc::new(History::new(Some(&out_dir.join("history.jsonl")))?);
    let to_id = cluster.node_id(1).to_owned();
    let api = cluster.client(0).clone();
    let mut c = 0u64;
    let send = |c: &mut u64| {
        *c += 1;
        Send {
            client: 0,
            c: *c,
            from: 0,
            to: 1,
            to_id: to_id.clone(),
        }
    };

    for _ in 0..SENDS_BEFORE {
        let ended = send(&mut c).run(&api, &history, SEND_TIMEOUT).await;
        if ended != Ended::Ok {
            bail!("a send failed before the outage: see {}", out_dir.display());
        }
    }

    let filler_bytes = tmpfs.fill()?;
    eprintln!("outage: the tmpfs is full ({filler_bytes} bytes of filler)");
    let mut report = OutageReport {
        filler_bytes,
        ok_while_full: 0,
        refused_while_full: 0,
        unknown_while_full: 0,
        first_refusal: None,
        outage_bit: false,
        recovered_after_ms: None,
        daemon_survived: false,
        recovered_after_restart: None,
        converged: false,
        summary: Summary::default(),
        out_dir: out_dir.to_owned(),
    };
    let started = Instant::now();
    let mut in_a_row = 0;
    for _ in 0..SENDS_FULL_MAX {
        if started.elapsed() > PHASE_TIMEOUT || !cluster.is_running(0) {
            break;
        }
        let before = history.ops().len();
        match send(&mut c).run(&api, &history, SEND_TIMEOUT).await {
            Ended::Ok => {
                report.ok_while_full += 1;
                in_a_row = 0;
                continue;
            }
            Ended::Fail => report.refused_while_full += 1,
            Ended::Unknown => report.unknown_while_full += 1,
        }
        if report.first_refusal.is_none() {
            report.first_refusal = history.ops().get(before + 1).map(|op| format!("{op:?}"));
        }
        in_a_row += 1;
        if in_a_row >= REFUSED_IN_A_ROW {
            report.outage_bit = true;
            break;
        }
        tokio::time::sleep(REFUSED_PAUSE).await;
    }
    eprintln!(
        "outage: while full, {} sends acknowledged, {} refused, {} unanswered; first refusal: {:?}",
        report.ok_while_full,
        report.refused_while_full,
        report.unknown_while_full,
        report.first_refusal
    );

    tmpfs.unfill()?;
    let freed = Instant::now();
    let mut in_a_row = 0;
    while freed.elapsed() < PHASE_TIMEOUT && cluster.is_running(0) {
        if send(&mut c).run(&api, &history, SEND_TIMEOUT).await == Ended::Ok {
            in_a_row += 1;
            if in_a_row >= OK_IN_A_ROW {
                report.recovered_after_ms = Some(freed.elapsed().as_millis() as u64);
                break;
            }
        } else {
            in_a_row = 0;
            tokio::time::sleep(REFUSED_PAUSE).await;
        }
    }
    report.daemon_survived = cluster.is_running(0);
    if report.recovered_after_ms.is_none() {
        eprintln!("outage: node 0 did not recover by itself; restarting it");
        cluster.stop(0).await?;
        cluster.restart(0).await?;
        let mut ok = 0;
        for _ in 0..OK_IN_A_ROW {
            if send(&mut c).run(&api, &history, SEND_TIMEOUT).await == Ended::Ok {
                ok += 1;
            }
        }
        report.recovered_after_restart = Some(ok == OK_IN_A_ROW);
    }
    history.flush()?;

    let ops = history.ops();
    let mut follower = Follower::new(2);
    let (converged, _) = converge(&cluster, &mut follower, &ops, Duration::from_secs(60)).await;
    report.converged = converged;
    let mut journals = BTreeMap::new();
    for i in 0..2 {
        follower.read(&cluster, i).await?;
        let journal = std::mem::take(&mut follower.tails[i].entries);
        write_journal(out_dir, i, &journal)?;
        journals.insert(cluster.node_id(i).to_owned(), journal);
    }
    drop(cluster);
    report.summary = check(&ops, &journals);
    std::fs::write(
        out_dir.join("summary.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    eprintln!(
        "outage: recovered by itself after {:?} ms, after a restart: {:?}, daemon survived: {}, \
         converged: {}\noutage: {}",
        report.recovered_after_ms,
        report.recovered_after_restart,
        report.daemon_survived,
        report.converged,
        report.summary.total
    );
    Ok(report)
}
