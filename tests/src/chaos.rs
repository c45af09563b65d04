//! A whole chaos run: a cluster, the workload, the nemesis, the final phase
//! and the checker, with everything a person needs written to one folder.
//!
//! 1. Start the cluster ([`Cluster::start`]) and the clients ([`run_client`]).
//! 2. Once sends succeed, carry out the seeded fault schedule ([`plan`])
//!    until it ends or the chaos time is up.
//! 3. Stop the clients; heal the network, resume and restart every node.
//! 4. Wait (bounded) until every receiver's marks reach the last seq its
//!    senders acknowledged, every member's topic marks the last seq each
//!    author acknowledged of its topic stream, and the senders' outboxes drain.
//! 5. Read the roaming agent's inbox at its last host until every agent
//!    send answered `ok` was read (or given up with a record), bounded.
//! 6. Read every journal through the API and [`check`] it against the history.
//!
//! Every node has a sender agent (`s0`, `s1`, ...) that some of the
//! workload's messages go from, to the roaming agent [`ROAMER`], created on
//! node 0; the nemesis moves it between nodes (`move_roamer`), reading its
//! inbox at each host before it leaves.
//!
//! The folder (by default `target/chaos/<label>-<seed>/`) holds
//! `history.jsonl`, `plan.json`, `nemesis.jsonl`, `journal-node-I.jsonl`,
//! `node-I.log` (each daemon's stderr), `summary.json` and `summary.txt`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio::sync::watch;

use crate::checker::{Summary, check};
use crate::cluster::{
    Cluster, ClusterConfig, Isolation, JournalTail, call, create_file, write_journal,
};
use crate::history::{History, Op};
use crate::nemesis::{Ctx, Fault, RoamerReader, Step, apply, plan, with_moves};
use crate::rng::SimRng;
use crate::workload::{ClientSpec, Roamer, WorkloadConfig, run_client};
use mesh_api::client::Client;
use mesh_api::{AddAgentRequest, AgentJson, EventRecord, TopicsResponse};

/// The seed of the short run when `CHAOS_SEED` is not set.
pub const SHORT_SEED: u64 = 20_261_129;
/// How often the final phase polls the nodes' marks.
const CONVERGE_POLL: Duration = Duration::from_millis(250);
/// How many successful sends the run waits for before the first fault, and
/// how many polls it waits at most.
const WARMUP_OKS: usize = 10;
const WARMUP_POLLS_MAX: u32 = 600;

/// What a chaos run does.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    /// The `mesh` executable.
    pub bin: PathBuf,
    /// A short name for the run's folder (`short`, `long`).
    pub label: String,
    /// The seed of the fault schedule and the clients' choices.
    pub seed: u64,
    /// How many daemons (3 by default, 5 settable).
    pub nodes: usize,
    /// How many faults the schedule has.
    pub faults: usize,
    /// The fault phase ends after this even if faults remain.
    pub chaos_time: Duration,
    /// How long the final phase waits for marks to reach the acknowledged seqs.
    pub converge_timeout: Duration,
    /// The clients.
    pub workload: WorkloadConfig,
    /// Namespaces or loopback.
    pub isolation: Isolation,
    /// Each daemon's `config.toml`, if any (e.g. a small outbox, so that
    /// acknowledged envelopes are evicted and gaps happen). It must join
    /// every node to the workload's topic, if it has one.
    pub daemon_config: Option<String>,
    /// Where the run's files go.
    pub out_dir: PathBuf,
    /// A move of the roaming agent after every this many faults (0: no
    /// agents, no moves).
    pub moves_every: usize,
    /// If no planned kill landed while the node was still behind (its
    /// catch-up beat every one, as under a loaded machine), at most this
    /// many more `kill_during_resync` faults follow the schedule, until one
    /// does.
    pub resync_kill_retries: usize,
}

impl ChaosConfig {
    /// The short run for `cargo test`: 3 nodes, 24 faults within about 90 s,
    /// every node a member of [`TOPIC`] and one message in
    /// [`PUBLISH_ONE_IN`] published to it. `CHAOS_SEED`, `CHAOS_NODES` and
    /// `CHAOS_OUT` override its defaults, `CHAOS_TOPIC_MSGS=0` leaves the
    /// topic out, and `CHAOS_MESH_BIN` runs another `mesh` executable than
    /// `bin` (e.g. a release build, or a copy that a rebuild will not
    /// replace mid-run).
    pub fn short(bin: impl Into<PathBuf>) -> Self {
        let bin = bin.into();
        let seed = env_u64("CHAOS_SEED").unwrap_or(SHORT_SEED);
        let topic_msgs = env_u64("CHAOS_TOPIC_MSGS").unwrap_or(TOPIC_MSGS);
        let moves_every = env_u64("CHAOS_MOVES_EVERY").map_or(MOVES_EVERY, |n| n as usize);
        let workload = WorkloadConfig {
            topic: (topic_msgs > 0).then(|| TOPIC.to_owned()),
            publish_one_in: PUBLISH_ONE_IN,
            agent_send_one_in: if moves_every > 0 {
                AGENT_SEND_ONE_IN
            } else {
                0
            },
            ..WorkloadConfig::default()
        };
        let mut cfg = ChaosConfig {
            out_dir: default_out_dir(&bin, "short", seed),
            bin: std::env::var_os("CHAOS_MESH_BIN").map_or(bin, PathBuf::from),
            label: "short".into(),
            seed,
            nodes: env_u64("CHAOS_NODES").map_or(3, |n| n as usize),
            faults: 24,
            chaos_time: Duration::from_secs(100),
            converge_timeout: Duration::from_secs(60),
            workload,
            // CHAOS_LOOPBACK=1 runs as a non-root user would, even as root.
            isolation: if env_u64("CHAOS_LOOPBACK").is_some_and(|v| v != 0) {
                Isolation::Loopback
            } else {
                Isolation::Auto
            },
            daemon_config: Some(daemon_config_from_env(topic_msgs)),
            moves_every,
            resync_kill_retries: RESYNC_KILL_RETRIES,
        };
        if let Ok(out) = std::env::var("CHAOS_OUT") {
            cfg.out_dir = PathBuf::from(out);
        }
        cfg
    }

    /// A long run: faults for `CHAOS_SECONDS` (default 1800) seconds, seed
    /// from `CHAOS_SEED` or else from the clock (printed either way).
    pub fn long(bin: impl Into<PathBuf>) -> Self {
        let bin = bin.into();
        let seconds = env_u64("CHAOS_SECONDS").unwrap_or(1800).max(10);
        let seed = env_u64("CHAOS_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_000)
        });
        let mut cfg = ChaosConfig::short(bin.clone());
        cfg.label = "long".into();
        cfg.seed = seed;
        cfg.out_dir = std::env::var("CHAOS_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|_| default_out_dir(&bin, "long", seed));
        // A fault takes at least a second or two: the time bound ends the run.
        cfg.faults = seconds as usize;
        cfg.chaos_time = Duration::from_secs(seconds);
        cfg.converge_timeout = Duration::from_secs(180);
        cfg.workload.sends_max = 200_000;
        cfg.resync_kill_retries = 0;
        cfg
    }
}

/// The outbox bound of chaos runs unless `CHAOS_OUTBOX_MSGS` says otherwise:
/// small, so acknowledged envelopes are evicted within seconds (an ack sent
/// before its commit then shows as a gap the author never recorded) and the
/// `evict-oldest` policy writes real gaps while a node is away.
pub const OUTBOX_MSGS: u64 = 32;
/// The outbox policy of chaos runs unless `CHAOS_ON_FULL` says otherwise.
pub const ON_FULL: &str = "evict-oldest";

/// How many more `kill_during_resync` faults a short run carries out if
/// none of its planned ones caught the node behind.
pub const RESYNC_KILL_RETRIES: usize = 4;

/// The topic every node of a chaos run joins from its config.
pub const TOPIC: &str = "chaos";
/// What each member holds of each author's stream of [`TOPIC`] unless
/// `CHAOS_TOPIC_MSGS` says otherwise (0: no topic): small, so an author
/// evicts its oldest publishes (with a loss record) within seconds and a
/// member that is away long enough gets real gaps.
pub const TOPIC_MSGS: u64 = 32;
/// One workload message in this many is published to [`TOPIC`].
pub const PUBLISH_ONE_IN: u64 = 4;
/// Of the rest, one in this many is an agent send to [`ROAMER`].
pub const AGENT_SEND_ONE_IN: u64 = 4;
/// The roaming agent's name.
pub const ROAMER: &str = "roamer";
/// The node it is created on.
pub const ROAMER_HOME: usize = 0;
/// A move of [`ROAMER`] after every this many faults unless
/// `CHAOS_MOVES_EVERY` says otherwise (0: no agents, no moves).
pub const MOVES_EVERY: usize = 4;

/// What every chaos daemon's `config.toml` says: no mDNS, so a node
/// restarted on a new port is found only through its own Hello and the
/// cards its peers pass on (what a run with fresh ports tests).
const DISCOVERY_OFF: &str = "[discovery]\nmdns = \"off\"\n";

/// The daemons' `config.toml`: [`DISCOVERY_OFF`]; `[outbox]` from
/// `CHAOS_OUTBOX_MSGS` (0: the daemon's built-in defaults) and
/// `CHAOS_ON_FULL`; and `[topics]`, joining [`TOPIC`] with a bound of
/// `topic_msgs` per author, unless it is 0.
fn daemon_config_from_env(topic_msgs: u64) -> String {
    let mut toml = DISCOVERY_OFF.to_owned();
    let msgs = env_u64("CHAOS_OUTBOX_MSGS").unwrap_or(OUTBOX_MSGS);
    if msgs > 0 {
        let on_full = std::env::var("CHAOS_ON_FULL")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| ON_FULL.into());
        toml += &format!(
            "[outbox]\nmax_msgs = {msgs}\non_full = {:?}\n",
            on_full.trim()
        );
    }
    if topic_msgs > 0 {
        toml += &format!("[topics]\njoin = [{TOPIC:?}]\nmax_msgs = {topic_msgs}\n");
    }
    toml
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| v.trim().parse().ok())
}

/// `target/chaos/<label>-<seed>` next to the `mesh` executable's `target/<profile>/`.
fn default_out_dir(bin: &Path, label: &str, seed: u64) -> PathBuf {
    let target = bin
        .parent()
        .and_then(Path::parent)
        .map_or_else(std::env::temp_dir, Path::to_owned);
    target.join("chaos").join(format!("{label}-{seed}"))
}

/// What a run did and found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// How many nodes.
    pub nodes: usize,
    /// Whether partitions and loss ran (namespaces were available).
    pub network_faults: bool,
    /// The topic every node was a member of and the workload published to.
    pub topic: Option<String>,
    /// Faults carried out, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Faults carried out in all.
    pub faults_total: u64,
    /// Second kills of `kill_during_resync` made while the others still
    /// had messages queued for the node.
    pub resync_kills_while_behind: u64,
    /// Packets the partitions and loss dropped, in all.
    pub packets_dropped: u64,
    /// Whether every receiver's marks reached the acknowledged seqs.
    pub converged: bool,
    /// Whether every sender's outbox drained (everything acknowledged).
    pub drained: bool,
    /// Whether every agent send answered `ok` was read (or given up with a
    /// record) at the end.
    pub agents_settled: bool,
    /// Seconds from start to verdict.
    pub elapsed_s: u64,
    /// The checker's counts.
    pub summary: Summary,
    /// Where the files are.
    pub out_dir: PathBuf,
}

impl Report {
    /// Whether the run kept every guarantee and converged.
    pub fn passed(&self) -> bool {
        self.converged && self.summary.passed()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos seed={} nodes={} network_faults={} elapsed={}s -> {}",
            self.seed,
            self.nodes,
            self.network_faults,
            self.elapsed_s,
            if self.passed() { "PASS" } else { "FAIL" }
        )?;
        let kinds: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        writeln!(
            f,
            "faults: {} ({}); kills during resync while behind: {}; packets dropped: {}",
            self.faults_total,
            kinds.join(" "),
            self.resync_kills_while_behind,
            self.packets_dropped
        )?;
        let s = &self.summary;
        writeln!(
            f,
            "sends: invoked={} ok={} fail={} unknown={} unfinished={}; converged={} drained={}",
            s.invoked, s.ok, s.failed, s.unknown, s.unfinished, self.converged, self.drained
        )?;
        if let Some(topic) = &self.topic {
            let p = &s.published;
            writeln!(
                f,
                "of them published to topic {topic}: invoked={} ok={} fail={} unknown={} \
                 unfinished={}",
                p.invoked, p.ok, p.failed, p.unknown, p.unfinished
            )?;
        }
        writeln!(f, "total: {}", s.total)?;
        for (node, c) in &s.per_receiver {
            writeln!(f, "  receiver {}: {c}", short(node))?;
        }
        if s.agent_sends.invoked > 0 || s.agent_moves > 0 {
            let a = &s.agent_sends;
            writeln!(
                f,
                "agent sends: invoked={} ok={} fail={} unknown={} unfinished={}; moves={} \
                 inbox reads={}; settled={}",
                a.invoked,
                a.ok,
                a.failed,
                a.unknown,
                a.unfinished,
                s.agent_moves,
                s.agent_reads,
                self.agents_settled
            )?;
            for (agent, c) in &s.per_agent {
                writeln!(f, "  agent {agent}: {c}")?;
            }
        }
        for e in &s.examples {
            writeln!(f, "  {e}")?;
        }
        write!(f, "files: {}", self.out_dir.display())
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(10)]
}

/// Runs `cfg` on a runtime of its own.
///
/// # Errors
/// If the run could not be carried out (a daemon would not start, the
/// network could not be set up); a run that finds violations is not an
/// error: see [`Report::passed`].
pub fn run_blocking(cfg: ChaosConfig) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    // The cluster lives inside this call's future, which runs on this
    // thread: the daemons' parent-death signal is tied to it.
    rt.block_on(run(cfg))
}

/// Runs `cfg`; see the module doc.
///
/// # Errors
/// As [`run_blocking`].
pub async fn run(cfg: ChaosConfig) -> anyhow::Result<Report> {
    let started = Instant::now();
    if cfg.out_dir.exists() {
        std::fs::remove_dir_all(&cfg.out_dir)
            .with_context(|| format!("cannot clear {}", cfg.out_dir.display()))?;
    }
    std::fs::create_dir_all(&cfg.out_dir)
        .with_context(|| format!("cannot create {}", cfg.out_dir.display()))?;
    eprintln!(
        "chaos: seed {} ({} nodes, {} faults planned, up to {:?}); files in {}",
        cfg.seed,
        cfg.nodes,
        cfg.faults,
        cfg.chaos_time,
        cfg.out_dir.display()
    );
    let mut cluster_cfg = ClusterConfig::new(&cfg.bin, cfg.nodes);
    cluster_cfg.isolation = cfg.isolation;
    // Every restart listens on a new port: the others find it through its
    // Hello and each other's cards.
    cluster_cfg.restart_port = crate::cluster::RestartPort::Fresh;
    cluster_cfg.log_dir = Some(cfg.out_dir.clone());
    cluster_cfg.daemon_config = cfg.daemon_config.clone();
    if let Some(toml) = &cfg.daemon_config {
        eprintln!("chaos: daemons' config.toml:\n{toml}");
    }
    let mut cluster = Cluster::start(cluster_cfg).await?;
    let network = cluster.netns().is_some();
    if !network {
        eprintln!("chaos: partitions and packet loss are skipped (no network namespaces)");
    }
    std::fs::write(
        cfg.out_dir.join("nodes.json"),
        serde_json::to_vec_pretty(&cluster.node_ids())?,
    )?;
    let agents = if cfg.moves_every > 0 {
        Some(add_agents(&cluster).await?)
    } else {
        None
    };
    let steps = with_moves(
        plan(cfg.seed, cfg.nodes, cfg.faults, network),
        cfg.seed,
        cfg.nodes,
        cfg.moves_every,
    );
    std::fs::write(
        cfg.out_dir.join("plan.json"),
        serde_json::to_vec_pretty(&steps)?,
    )?;

    let history = Arc::new(History::new(Some(&cfg.out_dir.join("history.jsonl")))?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut rng = SimRng::new(cfg.seed);
    let node_ids = cluster.node_ids();
    let mut clients = tokio::task::JoinSet::new();
    for node in 0..cluster.len() {
        for k in 0..cfg.workload.clients_per_node {
            let client = (node * cfg.workload.clients_per_node + k) as u32;
            let spec = ClientSpec {
                client,
                node,
                api: cluster.client(node).clone(),
                node_ids: node_ids.clone(),
                agent: agents.as_ref().map(|a| a.senders[node].clone()),
                roamer: agents.as_ref().map(|a| a.roamer.clone()),
            };
            clients.spawn(run_client(
                spec,
                cfg.workload.clone(),
                rng.fork(u64::from(client)),
                history.clone(),
                stop_rx.clone(),
            ));
        }
    }
    for _ in 0..WARMUP_POLLS_MAX {
        let oks = history
            .ops()
            .iter()
            .filter(|o| matches!(o, Op::Ok { .. }))
            .count();
        if oks >= WARMUP_OKS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The nemesis's own sends get a client number past every workload client's.
    let nemesis_client = (cluster.len() * cfg.workload.clients_per_node) as u32;
    let mut ctx = Ctx::new(history.clone(), nemesis_client, cfg.workload.send_timeout);
    ctx.topic = cfg
        .workload
        .topic
        .clone()
        .map(|t| (t, cfg.workload.publish_one_in));
    ctx.roamer = agents.as_ref().map(|a| RoamerReader {
        roamer: a.roamer.clone(),
        after: None,
    });
    let mut nemesis_log = std::io::BufWriter::new(create_file(&cfg.out_dir.join("nemesis.jsonl"))?);
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let mut resync_kills_while_behind = 0;
    let mut packets_dropped = 0;
    let chaos_start = Instant::now();
    let mut fault_error = None;
    let mut retries = 0;
    for n in 0.. {
        let step = if n < steps.len() && chaos_start.elapsed() < cfg.chaos_time {
            steps[n].clone()
        } else if resync_kills_while_behind == 0 && retries < cfg.resync_kill_retries {
            // Bounded: each is a few seconds, and only when none landed.
            retries += 1;
            Step {
                fault: Fault::KillDuringResync {
                    node: retries % cfg.nodes,
                    down_ms: 2_500,
                    resync_ms: 1_500,
                },
                quiet_ms: 1_000,
            }
        } else {
            break;
        };
        let step = &step;
        let t_ms = history.now_ms();
        eprintln!(
            "chaos: [{:>6.1}s] fault {}: {}",
            t_ms as f64 / 1000.0,
            n + 1,
            serde_json::to_string(&step.fault)?
        );
        let mut applied = match apply(&mut cluster, &mut ctx, &step.fault).await {
            Ok(a) => a,
            Err(e) => {
                eprintln!("chaos: fault {} could not be carried out: {e:#}", n + 1);
                fault_error = Some(e.context(format!("fault {}: {:?}", n + 1, step.fault)));
                break;
            }
        };
        applied.t_ms = t_ms;
        if applied.queued_at_kill.is_some_and(|q| q > 0) {
            resync_kills_while_behind += 1;
        }
        packets_dropped += applied.packets_dropped.unwrap_or(0);
        serde_json::to_writer(
            &mut nemesis_log,
            &serde_json::json!({"step": step, "applied": applied}),
        )?;
        nemesis_log.write_all(b"\n")?;
        // A person following a long run reads this file as it grows.
        nemesis_log.flush()?;
        *faults.entry(applied.kind.clone()).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(step.quiet_ms)).await;
    }
    nemesis_log.flush()?;

    // Final phase.
    stop_tx.send_replace(true);
    while clients.join_next().await.is_some() {}
    history.flush()?;
    let heal = cluster.heal_all().await;
    if let Some(e) = fault_error {
        // The run cannot be judged; say what happened with the logs.
        return Err(e.context(format!("files in {}", cfg.out_dir.display())));
    }
    heal.context("the final heal failed")?;
    eprintln!("chaos: healed; waiting for marks to reach the acknowledged seqs");
    let ops = history.ops();
    let mut follower = Follower::new(cluster.len());
    let (converged, drained) = converge(&cluster, &mut follower, &ops, cfg.converge_timeout).await;
    let agents_settled = match ctx.roamer.as_mut() {
        Some(r) => {
            eprintln!(
                "chaos: reading {} at node {} until every acknowledged agent send is read",
                r.roamer.name,
                r.roamer.host()
            );
            settle_roamer(&cluster, &mut follower, r, &history, cfg.converge_timeout).await
        }
        None => true,
    };
    history.flush()?;
    let ops = history.ops();

    let mut journals = BTreeMap::new();
    for i in 0..cluster.len() {
        // Whatever arrived after the last poll, too.
        follower
            .read(&cluster, i)
            .await
            .with_context(|| format!("reading node {i}'s journal"))?;
        let journal = std::mem::take(&mut follower.tails[i].entries);
        write_journal(&cfg.out_dir, i, &journal)?;
        journals.insert(cluster.node_id(i).to_owned(), journal);
    }
    drop(cluster);

    let summary = check(&ops, &journals);
    let report = Report {
        seed: cfg.seed,
        nodes: cfg.nodes,
        network_faults: network,
        topic: cfg.workload.topic.clone(),
        faults_total: faults.values().sum(),
        faults,
        resync_kills_while_behind,
        packets_dropped,
        converged,
        drained,
        agents_settled,
        elapsed_s: started.elapsed().as_secs(),
        summary,
        out_dir: cfg.out_dir.clone(),
    };
    std::fs::write(
        cfg.out_dir.join("summary.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    std::fs::write(cfg.out_dir.join("summary.txt"), format!("{report}\n"))?;
    eprintln!("{report}");
    Ok(report)
}

/// Checks a finished run's folder again (`history.jsonl`, `nodes.json` and
/// `journal-node-I.jsonl`), e.g. after the checker learned something new.
///
/// # Errors
/// If a file is missing or malformed.
pub fn recheck(dir: &Path) -> anyhow::Result<Summary> {
    let ops = crate::history::load(&dir.join("history.jsonl"))?;
    let ids: Vec<String> = serde_json::from_slice(
        &std::fs::read(dir.join("nodes.json")).context("cannot read nodes.json")?,
    )?;
    let mut journals = BTreeMap::new();
    for (i, id) in ids.iter().enumerate() {
        let path = dir.join(format!("journal-node-{i}.jsonl"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut entries = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            entries.push(
                serde_json::from_str(line)
                    .with_context(|| format!("{}: not a journal entry", path.display()))?,
            );
        }
        journals.insert(id.clone(), entries);
    }
    Ok(check(&ops, &journals))
}

/// The highest seq below which a stream is covered without a hole, by
/// delivered envelopes and gap records arriving in any order.
#[derive(Clone, Debug, Default)]
struct Prefix {
    upto: u64,
    /// Ranges above `upto + 1`: first seq -> last seq.
    pending: BTreeMap<u64, u64>,
}

impl Prefix {
    fn cover(&mut self, from: u64, to: u64) {
        if to <= self.upto {
            return;
        }
        if from > self.upto + 1 {
            let end = self.pending.entry(from).or_insert(to);
            *end = (*end).max(to);
            return;
        }
        self.upto = to;
        while let Some((&first, &last)) = self.pending.first_key_value() {
            if first > self.upto + 1 {
                break;
            }
            self.pending.pop_first();
            self.upto = self.upto.max(last);
        }
    }
}

type StreamKey = (String, String, String);

/// Every node's journal, followed incrementally, with each receiver's
/// covered prefix per stream.
pub(crate) struct Follower {
    pub(crate) tails: Vec<JournalTail>,
    /// Per node: stream -> covered prefix (others' streams only).
    prefixes: Vec<HashMap<StreamKey, Prefix>>,
}

impl Follower {
    pub(crate) fn new(nodes: usize) -> Self {
        Follower {
            tails: vec![JournalTail::default(); nodes],
            prefixes: vec![HashMap::new(); nodes],
        }
    }

    /// Reads what node `i` journaled since the last call.
    pub(crate) async fn read(&mut self, cluster: &Cluster, i: usize) -> anyhow::Result<()> {
        let tail = &mut self.tails[i];
        let from = tail.entries.len();
        let read = tail.read_new(cluster.client(i)).await;
        let me = cluster.node_id(i);
        for e in &tail.entries[from..] {
            let (stream, lo, hi) = match &e.record {
                EventRecord::Envelope { stream, seq, .. } => (stream, *seq, *seq),
                EventRecord::Gap { stream, from, to } => (stream, *from, *to),
                _ => continue,
            };
            if stream.author == me {
                continue;
            }
            let key = (
                stream.author.clone(),
                stream.epoch.clone(),
                stream.channel.clone(),
            );
            self.prefixes[i].entry(key).or_default().cover(lo, hi);
        }
        read.map(drop)
    }
}

/// Waits until, for every stream, the receiver holds everything up to the
/// highest seq acknowledged on it (its mark, or what its journal shows
/// delivered or covered by gaps), and (within the same bound) until every
/// sender's outbox is empty. A direct stream's mark is the receiver's in
/// `GET /v1/status`; a topic stream is for every node but its author, and
/// its mark is the one in that node's `GET /v1/topics`. Answers (reached,
/// drained).
pub(crate) async fn converge(
    cluster: &Cluster,
    follower: &mut Follower,
    ops: &[Op],
    timeout: Duration,
) -> (bool, bool) {
    // Receiver id -> stream -> highest acknowledged seq.
    let mut want: HashMap<String, HashMap<StreamKey, u64>> = HashMap::new();
    let ids: Vec<String> = (0..cluster.len())
        .map(|i| cluster.node_id(i).to_owned())
        .collect();
    let mut any_topic = false;
    // Agent sends are waited for at the agent (`settle_roamer`): their
    // stream may be one to the sender's own node, or readdressed.
    let agent_sends: std::collections::HashSet<(u32, u64)> = ops
        .iter()
        .filter(|o| matches!(o, Op::AgentSend { .. }))
        .filter_map(Op::message)
        .collect();
    for op in ops {
        let Op::Ok { stream, seq, .. } = op else {
            continue;
        };
        if op.message().is_some_and(|m| agent_sends.contains(&m)) {
            continue;
        }
        let receivers: Vec<&str> = if let Some(to) = stream.channel.strip_prefix("direct:") {
            vec![to]
        } else if stream.channel.starts_with("topic:") {
            any_topic = true;
            ids.iter()
                .map(String::as_str)
                .filter(|id| *id != stream.author)
                .collect()
        } else {
            continue;
        };
        for to in receivers {
            let top = want
                .entry(to.to_owned())
                .or_default()
                .entry((
                    stream.author.clone(),
                    stream.epoch.clone(),
                    stream.channel.clone(),
                ))
                .or_insert(0);
            *top = (*top).max(*seq);
        }
    }
    let polls = (timeout.as_millis() / CONVERGE_POLL.as_millis()).max(1);
    let mut reached = false;
    let mut last_behind = String::new();
    for _ in 0..polls {
        let mut behind = Vec::new();
        let mut queued = 0u64;
        for i in 0..cluster.len() {
            if let Err(e) = follower.read(cluster, i).await {
                behind.push(format!("node {i}'s journal: {e:#}"));
                continue;
            }
            let status = match cluster.status(i).await {
                Ok(s) => s,
                Err(e) => {
                    behind.push(format!("node {i}'s status: {e:#}"));
                    continue;
                }
            };
            let topics = if any_topic {
                match call(cluster.client(i).get::<TopicsResponse>("/v1/topics")).await {
                    Ok(t) => t.topics,
                    Err(e) => {
                        behind.push(format!("node {i}'s topics: {e:#}"));
                        continue;
                    }
                }
            } else {
                Vec::new()
            };
            queued += status.peers.iter().map(|p| p.queued_msgs).sum::<u64>();
            let id = cluster.node_id(i);
            for (key, top) in want.get(id).into_iter().flatten() {
                let (author, epoch, channel) = key;
                let same = |s: &mesh_api::StreamJson| {
                    &s.author == author && &s.epoch == epoch && &s.channel == channel
                };
                let mark = match channel.strip_prefix("topic:") {
                    Some(name) => topics
                        .iter()
                        .filter(|t| t.name == name)
                        .flat_map(|t| &t.streams)
                        .find(|s| same(&s.stream))
                        .map_or(0, |s| s.mark),
                    None => status
                        .peers
                        .iter()
                        .filter(|p| &p.node == author)
                        .flat_map(|p| &p.marks)
                        .find(|m| same(&m.stream))
                        .map_or(0, |m| m.mark),
                };
                let seen = follower.prefixes[i].get(key).map_or(0, |p| p.upto);
                if mark.max(seen) < *top {
                    behind.push(format!(
                        "node {i} holds {} {channel}..#{} (mark {mark}), acknowledged #{top}",
                        short(author),
                        seen
                    ));
                }
            }
        }
        reached = behind.is_empty();
        if reached && queued == 0 {
            return (true, true);
        }
        last_behind = if reached {
            format!("{queued} messages still queued")
        } else {
            behind.join("; ")
        };
        tokio::time::sleep(CONVERGE_POLL).await;
    }
    eprintln!("chaos: not converged within {timeout:?}: {last_behind}");
    (reached, false)
}

/// The agents of a run: each node's sender agent and the roaming one.
struct Agents {
    /// By node: the sender agent's name and a client of its socket.
    senders: Vec<(String, Client)>,
    roamer: Roamer,
}

/// Adds a sender agent `sI` on every node `I` and [`ROAMER`] on [`ROAMER_HOME`].
async fn add_agents(cluster: &Cluster) -> anyhow::Result<Agents> {
    let add = |i: usize, name: String| async move {
        let a: AgentJson = call(
            cluster
                .client(i)
                .post("/v1/agents", &AddAgentRequest { name, uid: None }),
        )
        .await?;
        let socket = a
            .socket
            .with_context(|| format!("node {i} named no socket for agent {}", a.name))?;
        anyhow::Ok(Client::for_agent(socket, &a.name))
    };
    let mut senders = Vec::new();
    for i in 0..cluster.len() {
        let name = format!("s{i}");
        let client = add(i, name.clone())
            .await
            .with_context(|| format!("adding agent {name} on node {i}"))?;
        senders.push((name, client));
    }
    add(ROAMER_HOME, ROAMER.into())
        .await
        .with_context(|| format!("adding agent {ROAMER} on node {ROAMER_HOME}"))?;
    Ok(Agents {
        senders,
        roamer: Roamer {
            name: ROAMER.into(),
            home: ROAMER_HOME,
            host: Arc::new(std::sync::atomic::AtomicUsize::new(ROAMER_HOME)),
        },
    })
}

/// Reads `r`'s agent's inbox at its host (recording each read) until the
/// checker finds no agent send lost (every one answered `ok` was read, or
/// its sender was told: given up with a record, or bounced), on the
/// journals `follower` reads, polling within `timeout`; then once more.
/// Answers whether it found none lost.
async fn settle_roamer(
    cluster: &Cluster,
    follower: &mut Follower,
    r: &mut RoamerReader,
    history: &History,
    timeout: Duration,
) -> bool {
    let polls = (timeout.as_millis() / CONVERGE_POLL.as_millis()).max(1);
    let mut lost = u64::MAX;
    for _ in 0..polls {
        if let Err(e) = r.read(cluster, history).await {
            eprintln!("chaos: {e:#}");
        }
        let mut journals = BTreeMap::new();
        for i in 0..cluster.len() {
            if let Err(e) = follower.read(cluster, i).await {
                eprintln!("chaos: node {i}'s journal: {e:#}");
            }
            journals.insert(
                cluster.node_id(i).to_owned(),
                follower.tails[i].entries.clone(),
            );
        }
        lost = check(&history.ops(), &journals).agent_total.lost;
        if lost == 0 {
            break;
        }
        tokio::time::sleep(CONVERGE_POLL).await;
    }
    // What came meanwhile, once more (a late duplicate, too).
    if let Err(e) = r.read(cluster, history).await {
        eprintln!("chaos: {e:#}");
    }
    if lost > 0 {
        eprintln!("chaos: {lost} acknowledged agent sends not read within {timeout:?}");
    }
    lost == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_grows_over_seqs_and_gaps_in_any_order() {
        let mut p = Prefix::default();
        p.cover(2, 2);
        assert_eq!(p.upto, 0);
        p.cover(4, 9);
        p.cover(1, 1);
        assert_eq!(p.upto, 2);
        p.cover(3, 3);
        assert_eq!(p.upto, 9);
        p.cover(5, 5);
        assert_eq!(p.upto, 9);
        p.cover(11, 11);
        assert_eq!(p.upto, 9);
    }
}
