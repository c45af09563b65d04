//! Store outage: a node's data dir on a small tmpfs that is filled up while
//! it takes sends, then emptied again (root only).
//!
//! What must hold: a send the store cannot commit is held, its request
//! open and unanswered, while the node keeps answering reads and status;
//! each held send is answered exactly once — Ok after the store returns
//! (committed), or 503 after the hold (and a `lost` record is journaled once
//! the store is back) — never both, and none is lost; a node stopped during
//! a hold acknowledges none of its held sends; and after the other node
//! catches up, the checker finds nothing lost, duplicated or out of order.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mesh_api::EventRecord;
use mesh_api::client::Client;
use serde::Serialize;

use crate::chaos::{Follower, converge};
use crate::checker::{Summary, check};
use crate::cluster::{Cluster, ClusterConfig, Isolation, write_journal};
use crate::history::{History, Op};
use crate::workload::{Ended, Send};

pub mod publish;
pub mod supersede;

/// The tmpfs's size.
pub const TMPFS_BYTES: u64 = 32 << 20;
/// Sends before the filesystem is filled.
const SENDS_BEFORE: u64 = 20;
/// Sends held at once in each phase.
const HELD: u64 = 5;
/// `[store] hold_ms` of the node on the tmpfs: short, so a run takes seconds.
pub const HOLD_MS: u64 = 6_000;
/// The most sends tried until one is held (the store may take a few
/// commits from free pages inside its file after the disk is full).
const PROBES_MAX: u64 = 2_000;
/// How long a probe may take before it counts as held.
const HELD_AFTER: Duration = Duration::from_secs(2);
/// How long a held send may take to be answered: the hold and then some.
const SEND_TIMEOUT: Duration = Duration::from_millis(HOLD_MS + 30_000);
/// How long a plain send may take.
const QUICK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the status may take while sends are held.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the other phases may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);
/// Accepted sends in a row that show the node recovered.
const OK_IN_A_ROW: u32 = 5;

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
#[derive(Clone, Debug, Default, Serialize)]
pub struct OutageReport {
    /// Bytes the filler took.
    pub filler_bytes: u64,
    /// Sends committed after the disk was full, before one was held.
    pub ok_before_held: u64,
    /// Whether the node held a send (its request stayed open).
    pub held: bool,
    /// Whether the status answered, naming the store as down, while sends
    /// were held; how long it took.
    pub status_while_held_ms: Option<u64>,
    /// The sends held past the hold: how each ended, and after how long (ms).
    pub let_go: Vec<(String, u64)>,
    /// Sends the `lost` records of node 0 count.
    pub lost_recorded: u64,
    /// Sends held while node 0 was stopped: how each ended.
    pub stopped_while_held: Vec<String>,
    /// Of those, how many are in node 0's journal at the end (must be 0).
    pub stopped_journaled: u64,
    /// Sends held, then committed once the store came back: how each ended.
    pub held_then_committed: Vec<String>,
    /// Milliseconds from freeing space to accepted sends again.
    pub recovered_after_ms: Option<u64>,
    /// Whether the daemon was still running at the end.
    pub daemon_survived: bool,
    /// Whether the other node caught up.
    pub converged: bool,
    /// The checker's counts.
    pub summary: Summary,
    /// Where the files are.
    pub out_dir: PathBuf,
}

impl OutageReport {
    /// Whether every held send ended as the hold says, nothing held was
    /// acknowledged by a stopped node, the node recovered and kept
    /// running, and nothing acknowledged was lost.
    pub fn passed(&self) -> bool {
        let let_go_ok = self.let_go.len() as u64 == HELD
            && self
                .let_go
                .iter()
                .all(|(e, ms)| e == "fail" && *ms >= HOLD_MS - 500);
        self.held
            && self.status_while_held_ms.is_some()
            && let_go_ok
            && self.lost_recorded == HELD
            && self.stopped_while_held.iter().all(|e| e != "ok")
            && self.stopped_journaled == 0
            && self.held_then_committed.len() as u64 == HELD
            && self.held_then_committed.iter().all(|e| e == "ok")
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
    block_on(run(bin, out_dir))
}

/// Runs `f` to its end on a runtime of its own (two workers).
fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start a runtime")?
        .block_on(f)
}

fn ended_name(e: Ended) -> String {
    match e {
        Ended::Ok => "ok",
        Ended::Fail => "fail",
        Ended::Unknown => "unknown",
    }
    .to_owned()
}

/// The sends of one run: numbered in order, all from node 0 to node 1.
struct Sender {
    api: Client,
    history: Arc<History>,
    to_id: String,
    c: u64,
}

impl Sender {
    fn next(&mut self) -> Send {
        self.c += 1;
        Send {
            client: 0,
            c: self.c,
            from: 0,
            to: 1,
            to_id: self.to_id.clone(),
        }
    }

    /// Starts a send on a task: it ends within `timeout`.
    fn spawn(&mut self, timeout: Duration) -> (u64, tokio::task::JoinHandle<(Ended, u64)>) {
        let send = self.next();
        let c = send.c;
        let (api, history) = (self.api.clone(), self.history.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let ended = send.run(&api, &history, timeout).await;
            (ended, started.elapsed().as_millis() as u64)
        });
        (c, task)
    }

    async fn one(&mut self, timeout: Duration) -> Ended {
        let send = self.next();
        send.run(&self.api, &self.history, timeout).await
    }
}

async fn join(task: tokio::task::JoinHandle<(Ended, u64)>) -> anyhow::Result<(Ended, u64)> {
    task.await.context("a send task failed")
}

/// Sends one at a time until one is held (not answered within
/// [`HELD_AFTER`]); returns it, still open, and how many were committed first.
async fn until_held(
    sender: &mut Sender,
) -> anyhow::Result<(tokio::task::JoinHandle<(Ended, u64)>, u64)> {
    let mut ok = 0;
    for _ in 0..PROBES_MAX {
        let (_, mut task) = sender.spawn(SEND_TIMEOUT);
        tokio::select! {
            done = &mut task => match done.context("a send task failed")?.0 {
                Ended::Ok => ok += 1,
                other => bail!("a send ended {other:?} before any was held"),
            },
            () = tokio::time::sleep(HELD_AFTER) => return Ok((task, ok)),
        }
    }
    bail!("no send was held after {PROBES_MAX} sends to a full disk")
}

/// How many sends node 0's `lost` records count, from its journal.
fn lost_in(journal: &[mesh_api::EventEntry]) -> u64 {
    journal
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Lost { msgs, .. } => Some(*msgs),
            _ => None,
        })
        .sum()
}

/// Starts two nodes on loopback, logging to `out_dir`, with node 0's data
/// dir on a new tmpfs of [`TMPFS_BYTES`] and its `[store] hold_ms` at
/// `hold_ms`. The tmpfs must outlive the cluster.
async fn start_on_tmpfs(
    bin: &Path,
    out_dir: &Path,
    hold_ms: u64,
) -> anyhow::Result<(Tmpfs, Cluster)> {
    let tmpfs = Tmpfs::mount(TMPFS_BYTES)?;
    let mut cfg = ClusterConfig::new(bin, 2);
    cfg.isolation = Isolation::Loopback;
    cfg.log_dir = Some(out_dir.to_owned());
    cfg.data_dirs = BTreeMap::from([(0, tmpfs.path().join("n0"))]);
    cfg.daemon_config = Some(format!("[store]\nhold_ms = {hold_ms}\n"));
    let cluster = Cluster::start(cfg).await?;
    Ok((tmpfs, cluster))
}

async fn run(bin: &Path, out_dir: &Path) -> anyhow::Result<OutageReport> {
    if out_dir.exists() {
        std::fs::remove_dir_all(out_dir)
            .with_context(|| format!("cannot clear {}", out_dir.display()))?;
    }
    std::fs::create_dir_all(out_dir)?;
    let (tmpfs, mut cluster) = start_on_tmpfs(bin, out_dir, HOLD_MS).await?;
    let history = Arc::new(History::new(Some(&out_dir.join("history.jsonl")))?);
    let mut sender = Sender {
        api: cluster.client(0).clone(),
        history: history.clone(),
        to_id: cluster.node_id(1).to_owned(),
        c: 0,
    };
    let mut report = OutageReport {
        out_dir: out_dir.to_owned(),
        ..OutageReport::default()
    };
    for _ in 0..SENDS_BEFORE {
        if sender.one(QUICK_TIMEOUT).await != Ended::Ok {
            bail!("a send failed before the outage: see {}", out_dir.display());
        }
    }

    // Held past the hold: answered 503, journaled as lost once the store is back.
    report.filler_bytes = tmpfs.fill()?;
    eprintln!(
        "outage: the tmpfs is full ({} bytes of filler)",
        report.filler_bytes
    );
    let (first, ok) = until_held(&mut sender).await?;
    report.ok_before_held = ok;
    report.held = true;
    let mut held = vec![first];
    for _ in 1..HELD {
        held.push(sender.spawn(SEND_TIMEOUT).1);
    }
    let asked = Instant::now();
    if let Ok(Ok(st)) = tokio::time::timeout(
        STATUS_TIMEOUT,
        sender.api.get::<mesh_api::StatusResponse>("/v1/status"),
    )
    .await
        && st.node.store_down.is_some()
    {
        report.status_while_held_ms = Some(asked.elapsed().as_millis() as u64);
    }
    for task in held {
        let (ended, ms) = join(task).await?;
        report.let_go.push((ended_name(ended), ms));
    }
    eprintln!("outage: held past the hold: {:?}", report.let_go);
    tmpfs.unfill()?;
    let api = sender.api.clone();
    let started = Instant::now();
    while started.elapsed() < PHASE_TIMEOUT {
        let j = mesh_cluster::read_journal(&api).await?;
        report.lost_recorded = lost_in(&j);
        if report.lost_recorded >= HELD {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("outage: lost records count {} sends", report.lost_recorded);

    // Stopped while held: nothing is acknowledged.
    tmpfs.fill()?;
    let (first, _) = until_held(&mut sender).await?;
    let (c2, second) = sender.spawn(SEND_TIMEOUT);
    let first_c = c2 - 1;
    cluster.stop(0).await?;
    for task in [first, second] {
        report
            .stopped_while_held
            .push(ended_name(join(task).await?.0));
    }
    tmpfs.unfill()?;
    cluster.restart(0).await?;
    let j = mesh_cluster::read_journal(cluster.client(0)).await?;
    let bodies: Vec<String> = [first_c, c2]
        .iter()
        .map(|c| crate::history::body(0, *c))
        .collect();
    report.stopped_journaled = j
        .iter()
        .filter(
            |e| matches!(&e.record, EventRecord::Envelope { body, .. } if bodies.contains(body)),
        )
        .count() as u64;
    eprintln!(
        "outage: stopped while held: {:?}, journaled {}",
        report.stopped_while_held, report.stopped_journaled
    );

    // Held, then committed when the store comes back within the hold.
    sender.api = cluster.client(0).clone();
    tmpfs.fill()?;
    let (first, _) = until_held(&mut sender).await?;
    let mut held = vec![first];
    for _ in 1..HELD {
        held.push(sender.spawn(SEND_TIMEOUT).1);
    }
    tmpfs.unfill()?;
    let freed = Instant::now();
    for task in held {
        report
            .held_then_committed
            .push(ended_name(join(task).await?.0));
    }
    eprintln!(
        "outage: held then committed: {:?}",
        report.held_then_committed
    );
    let mut in_a_row = 0;
    while freed.elapsed() < PHASE_TIMEOUT && cluster.is_running(0) {
        if sender.one(QUICK_TIMEOUT).await == Ended::Ok {
            in_a_row += 1;
            if in_a_row >= OK_IN_A_ROW {
                report.recovered_after_ms = Some(freed.elapsed().as_millis() as u64);
                break;
            }
        } else {
            in_a_row = 0;
        }
    }
    report.daemon_survived = cluster.is_running(0);
    history.flush()?;

    let ops: Vec<Op> = history.ops();
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
        "outage: recovered after {:?} ms, daemon survived: {}, converged: {}\noutage: {}",
        report.recovered_after_ms, report.daemon_survived, report.converged, report.summary.total
    );
    Ok(report)
}
