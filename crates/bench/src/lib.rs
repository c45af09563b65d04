//! `mesh bench`: measures a mesh the way people compare message brokers, and
//! the way `iperf` measures a link.
//!
//! - `mesh bench local` starts `--nodes` daemons as child processes (the
//!   `mesh` executable run as `mesh daemon`, by `mesh-cluster`) in a temp
//!   dir, links them over 127.0.0.1 with the default durable settings and
//!   drives their local APIs;
//! - `mesh bench peer PEER_ID` drives this node's API towards a peer it is
//!   already linked with; where `local` stops the peers, it pauses the link.
//!
//! Workloads (node 0 sends to the others in turn; 1 KiB payloads unless
//! `--size`): `send-each` (send, wait for the commit, send the next),
//! `send-pipelined` (`--window` in flight, until the peers' marks cover
//! every message), `agent-pipelined` (the same as an agent of node 0 to
//! an agent of each peer, `AGENT@NODE`, through the agent's socket; `bench
//! local` only), `latency` (sends at `--rate`, send → the peer's journal
//! subscriber), `catch-up` (the peers are stopped while messages are sent,
//! then started: until their marks cover every message) and
//! `queued-memory` (the peers are stopped while messages are sent: the
//! sender's peak RSS over idle and its disk use). Each run also measures the
//! disk's serial fsync rate and the rate of the smallest store commit in
//! the same data dir, the floors `send-each` and `latency` stand on.
//!
//! Every run has fresh daemons, and every step has a deadline. Child daemons
//! are killed when the bench ends, however it ends: on drop, on SIGINT or
//! SIGTERM, and (where `setpriv` exists, through the parent-death signal
//! `mesh-cluster` starts them with) when the bench process is killed.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Tests unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod http;
mod local;
mod measure;
mod peer;
mod progress;
mod report;
mod send;
mod status;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, value_parser};

use mesh_api::DataDir;

pub use report::{Figure, Machine, Report};

/// The environment variable that names the `mesh` executable `mesh bench
/// local` runs as `mesh daemon` (default: the running executable).
pub const DAEMON_BIN_ENV: &str = "MESH_BENCH_DAEMON";

/// The `msg_kind` of every message a bench sends, so they can be told apart
/// in a journal.
pub const BENCH_MSG_KIND: u16 = 0x6d62;

/// The largest `--size`: one message's payload limit.
const SIZE_MAX: u64 = mesh_protocol::MAX_BATCH_PAYLOAD_BYTES;

/// The smallest `--size`: room for the message's tag and number.
const SIZE_MIN: u64 = 32;

/// `mesh bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Start daemons in a temp dir, linked over 127.0.0.1, and measure them.
    Local {
        /// How many daemons (node 0 sends to the others in turn).
        #[arg(long, default_value_t = 2, value_parser = value_parser!(u32).range(2..=8))]
        nodes: u32,
        /// Where to make the temp dir (it decides which disk is measured)
        /// [default: $TMPDIR, else /tmp].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The `mesh` executable to run as `mesh daemon` [default: this one].
        #[arg(long, value_name = "PATH", env = DAEMON_BIN_ENV)]
        daemon_bin: Option<PathBuf>,
        /// Keep each node's dashboard (`mesh web`) open in this browser
        /// while the workloads run, headless (e.g. `/usr/bin/chromium`):
        /// the page's live stream and polling beside the load. Each run
        /// waits until every page has its stream open.
        #[arg(long, value_name = "PATH")]
        web_browser: Option<PathBuf>,
        /// What to measure and how.
        #[command(flatten)]
        opts: BenchOptions,
    },
    /// Measure from this node (`--data`) to a peer it is linked with.
    ///
    /// Runs send-each, send-pipelined (until the peer has acknowledged every
    /// message), latency as send → the peer's ack, and catch-up and
    /// queued-memory with the link paused (`mesh peer pause`) instead of the
    /// peer stopped; the link is resumed after each, and on an error or
    /// Ctrl-C (if the bench is killed, run `mesh peer resume PEER_ID`).
    /// queued-memory waits after its measurement until the peer has
    /// acknowledged everything. The messages stay in both journals (kind
    /// 0x6d62).
    Peer {
        /// The peer's node id.
        peer: String,
        /// What to measure and how.
        #[command(flatten)]
        opts: BenchOptions,
    },
}

/// The options both modes take.
#[derive(Clone, Debug, Args)]
pub struct BenchOptions {
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024, value_parser = value_parser!(u64).range(SIZE_MIN..=SIZE_MAX))]
    pub size: u64,
    /// Runs per workload; the table shows their median, min and max [default: 3; 1 with --quick].
    #[arg(long, value_parser = value_parser!(u32).range(1..=20))]
    pub runs: Option<u32>,
    /// Messages in flight in send-pipelined, catch-up and queued-memory.
    #[arg(long, default_value_t = 256, value_parser = value_parser!(u32).range(1..=4096))]
    pub window: u32,
    /// Messages per second in the latency workload.
    #[arg(long, default_value_t = 1000, value_parser = value_parser!(u32).range(1..=20_000))]
    pub rate: u32,
    /// Tiny counts and one run: checks that everything works, in seconds.
    #[arg(long)]
    pub quick: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The workloads to run, each with an optional count, e.g.
    /// `send-each=5000 catch-up` [default: all, default counts]. Workloads:
    /// send-each, send-pipelined, agent-pipelined (bench local only),
    /// latency, catch-up, queued-memory, topic-fanout (bench local only: node
    /// 0 publishes to a topic every node joined, one request per message;
    /// `--nodes 3` for 2 members), topic-batched (the same, 64 messages a
    /// request to `/publish/batch`).
    #[arg(value_name = "WORKLOAD[=COUNT]")]
    pub counts: Vec<String>,
}

/// A workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Workload {
    SendEach,
    SendPipelined,
    AgentPipelined,
    TopicFanout,
    TopicBatched,
    Latency,
    CatchUp,
    QueuedMemory,
}

impl Workload {
    /// In the order a run makes them (the declaration order): queued-memory
    /// stops the other daemons, so it comes last.
    const ALL: [Workload; 8] = [
        Workload::SendEach,
        Workload::SendPipelined,
        Workload::AgentPipelined,
        Workload::TopicFanout,
        Workload::TopicBatched,
        Workload::Latency,
        Workload::CatchUp,
        Workload::QueuedMemory,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::SendEach => "send-each",
            Workload::SendPipelined => "send-pipelined",
            Workload::AgentPipelined => "agent-pipelined",
            Workload::Latency => "latency",
            Workload::CatchUp => "catch-up",
            Workload::QueuedMemory => "queued-memory",
            Workload::TopicFanout => "topic-fanout",
            Workload::TopicBatched => "topic-batched",
        }
    }

    /// The default count, and the one of `--quick`.
    fn default_count(self, quick: bool) -> u64 {
        match (self, quick) {
            (Workload::SendEach, false) => 2_000,
            (Workload::SendEach, true) => 50,
            (Workload::SendPipelined | Workload::AgentPipelined, false) => 100_000,
            (Workload::SendPipelined | Workload::AgentPipelined, true) => 1_000,
            (Workload::Latency, false) => 5_000,
            (Workload::Latency, true) => 200,
            (Workload::CatchUp, false) => 100_000,
            (Workload::CatchUp, true) => 1_000,
            (Workload::QueuedMemory, false) => 1_000_000,
            (Workload::QueuedMemory, true) => 5_000,
            (Workload::TopicFanout, false) => 20_000,
            (Workload::TopicFanout, true) => 200,
            (Workload::TopicBatched, false) => 100_000,
            (Workload::TopicBatched, true) => 1_000,
        }
    }

    fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// What one bench does, resolved from [`BenchOptions`].
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) size: usize,
    pub(crate) runs: u32,
    pub(crate) window: usize,
    pub(crate) rate: u32,
    /// The workloads to run with their counts, in the order they run.
    pub(crate) plan: Vec<(Workload, u64)>,
    /// How long the fsync and store-commit probes run at most.
    pub(crate) probe_time: Duration,
}

impl Settings {
    fn new(opts: &BenchOptions) -> anyhow::Result<Settings> {
        let mut plan: Vec<(Workload, u64)> = Vec::new();
        for arg in &opts.counts {
            let (name, count) = match arg.split_once('=') {
                Some((n, c)) => {
                    let c: u64 = c
                        .replace('_', "")
                        .parse()
                        .with_context(|| format!("{arg}: the count is not a number"))?;
                    (n, Some(c))
                }
                None => (arg.as_str(), None),
            };
            let Some(w) = Workload::parse(name) else {
                let names: Vec<&str> = Workload::ALL.iter().map(|w| w.name()).collect();
                bail!(
                    "unknown workload {name:?}; the workloads are {}",
                    names.join(", ")
                );
            };
            let count = count.unwrap_or_else(|| w.default_count(opts.quick));
            if !(1..=10_000_000).contains(&count) {
                bail!("{arg}: the count must be 1 to 10,000,000");
            }
            plan.retain(|(p, _)| *p != w);
            plan.push((w, count));
        }
        if plan.is_empty() {
            plan = Workload::ALL
                .iter()
                .map(|w| (*w, w.default_count(opts.quick)))
                .collect();
        }
        plan.sort_by_key(|(w, _)| *w);
        Ok(Settings {
            size: usize::try_from(opts.size).context("--size does not fit in memory")?,
            runs: opts.runs.unwrap_or(if opts.quick { 1 } else { 3 }),
            window: opts.window as usize,
            rate: opts.rate,
            plan,
            probe_time: if opts.quick {
                Duration::from_millis(200)
            } else {
                Duration::from_millis(700)
            },
        })
    }

    pub(crate) fn count(&self, w: Workload) -> Option<u64> {
        self.plan.iter().find(|(p, _)| *p == w).map(|(_, c)| *c)
    }
}

/// Runs `mesh bench` and prints its report (a table, or JSON with `--json`).
///
/// Errors if the bench could not start, or if a workload produced no figure
/// in any run (the report is printed first).
pub fn run(cmd: BenchCommand, data: &DataDir) -> anyhow::Result<()> {
    let json = match &cmd {
        BenchCommand::Local { opts, .. } | BenchCommand::Peer { opts, .. } => opts.json,
    };
    let report = measure(cmd, data)?;
    if json {
        let text = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
        println!("{text}");
    } else {
        print!("{}", report.table());
    }
    let missing = report.missing();
    if !missing.is_empty() {
        bail!("no figure for {}: see the errors above", missing.join(", "));
    }
    Ok(())
}

/// Runs `mesh bench` and returns its report without printing it (progress
/// still goes to stderr when it is a terminal).
///
/// A workload that fails in a run leaves that run's figure out and its error
/// in [`Report::errors`]; this errors only if the bench cannot start at all.
pub fn measure(cmd: BenchCommand, data: &DataDir) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        match cmd {
            BenchCommand::Local {
                nodes,
                dir,
                daemon_bin,
                web_browser,
                opts,
            } => {
                let settings = Settings::new(&opts)?;
                let bin = match daemon_bin {
                    Some(b) => b,
                    None => std::env::current_exe()
                        .context("cannot find this executable to start daemons with")?,
                };
                let parent = dir.unwrap_or_else(std::env::temp_dir);
                let local = local::Local {
                    nodes: nodes as usize,
                    bin,
                    parent,
                    settings,
                    web_browser,
                };
                interruptible(local.run(), "the daemons were stopped").await
            }
            BenchCommand::Peer { peer, opts } => {
                let settings = Settings::new(&opts)?;
                let link = peer::Link::new(data, &peer);
                let result = interruptible(
                    peer::run(data, &link, settings),
                    "a link the bench paused is resumed",
                )
                .await;
                // However the bench ended (short of SIGKILL), the link is up again.
                link.resume_if_paused().await;
                result
            }
        }
    })
}

/// Runs `work` until it ends or SIGINT/SIGTERM arrives; dropping it then
/// kills the daemons it started (`bench local`), and the caller resumes a
/// paused link (`bench peer`). `aftermath` says which, in the error.
async fn interruptible(
    work: impl std::future::Future<Output = anyhow::Result<Report>>,
    aftermath: &str,
) -> anyhow::Result<Report> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::select! {
        r = work => r,
        _ = term.recv() => bail!("interrupted (SIGTERM); {aftermath}"),
        _ = int.recv() => bail!("interrupted (SIGINT); {aftermath}"),
    }
}
