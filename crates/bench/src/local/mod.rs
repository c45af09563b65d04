//! `mesh bench local`: fresh daemons per run, node 0 sending to the others.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

use super::http::Conn;
use super::measure::{self, ms};
use super::progress::{Bar, Progress};
use super::report::{Collector, Machine, Report};
use super::send::{self, Msgs};
use super::{Settings, Workload};
use mesh_cluster::{Cluster, ClusterConfig, NodeProc, Stopped};

mod workloads;

/// How often the sender's RSS is sampled in queued-memory.
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
/// How long the sender idles before its idle RSS is read.
const IDLE_SETTLE: Duration = Duration::from_millis(300);
/// How long latency waits for the last messages after the last was sent.
const LATENCY_DRAIN: Duration = Duration::from_secs(10);
/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// The default outbox bounds the daemons run with: queued-memory sends at
/// most what they admit.
const OUTBOX_MSGS_MAX: u64 = 1_000_000;
const OUTBOX_BYTES_MAX: u64 = 1 << 30;

/// A `mesh bench local` run to make.
pub(super) struct Local {
    pub(super) nodes: usize,
    pub(super) bin: PathBuf,
    pub(super) parent: PathBuf,
    pub(super) settings: Settings,
    /// A browser to keep each node's dashboard open in (`--web-browser`).
    pub(super) web_browser: Option<PathBuf>,
}

/// The longest a workload of `count` messages may take in one run.
pub(super) fn time_bound(w: Workload, count: u64, rate: u32) -> Duration {
    let base = Duration::from_secs(30);
    base + match w {
        Workload::SendEach => Duration::from_millis(10) * count as u32,
        Workload::SendPipelined | Workload::AgentPipelined | Workload::QueuedMemory => {
            Duration::from_millis(count)
        }
        Workload::Latency => Duration::from_secs_f64(count as f64 / f64::from(rate)),
        Workload::CatchUp | Workload::TopicFanout | Workload::TopicBatched => {
            Duration::from_millis(2 * count)
        }
    }
}

/// Cuts queued-memory's count to what the default outbox bounds admit at
/// the plan's payload size, with a note in `col` saying so.
fn fit_queued_memory(settings: &mut Settings, col: &mut Collector) {
    if let Some(count) = settings.count(Workload::QueuedMemory) {
        let fit = OUTBOX_MSGS_MAX.min(OUTBOX_BYTES_MAX / settings.size as u64);
        if count > fit {
            col.notes.push(format!(
                "queued-memory sends {fit}, not {count}: that is what the default outbox bounds admit at {} bytes",
                settings.size
            ));
            for (w, c) in &mut settings.plan {
                if *w == Workload::QueuedMemory {
                    *c = fit;
                }
            }
        }
    }
}

impl Local {
    pub(super) async fn run(mut self) -> anyhow::Result<Report> {
        let started = Instant::now();
        let mut machine = Machine::read();
        let progress = Progress::new();
        let mut col = Collector::default();
        fit_queued_memory(&mut self.settings, &mut col);
        if let Some(b) = &self.web_browser {
            col.notes.push(format!(
                "every node's dashboard was open in {} (headless) during the workloads",
                b.display()
            ));
        }
        let s = &self.settings;
        declare_probes(&mut col);
        for (w, count) in &s.plan {
            for (metric, unit) in metrics_of(*w) {
                col.declare(w.name(), metric, unit, *count);
            }
        }
        let data_dir = self.run_plan(progress, &mut col).await;
        let (figures, errors, notes) = col.finish();
        Ok(Report {
            mode: "local".into(),
            nodes: self.nodes,
            size: s.size,
            runs: s.runs,
            window: s.window,
            rate: s.rate,
            plan: Report::plan_of(&s.plan),
            machine: {
                machine.finish();
                machine
            },
            version: env!("CARGO_PKG_VERSION").into(),
            data_dir,
            figures,
            errors,
            notes,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

impl Local {
    /// Runs the plan `runs` times, each on fresh daemons with the probes
    /// first; an error is recorded in `col` and ends that run. Returns the
    /// last run's data dir (the bench's dir if no run started).
    async fn run_plan(&self, progress: Progress, col: &mut Collector) -> String {
        let s = &self.settings;
        let mut data_dir = self.parent.display().to_string();
        for run in 1..=s.runs {
            let cluster = self.start_cluster().await;
            let mut cluster = match cluster {
                Ok(c) => c,
                Err(e) => {
                    col.error(run, "starting the daemons", &e);
                    continue;
                }
            };
            data_dir = cluster.base().display().to_string();
            let _pages = match &self.web_browser {
                Some(b) => match open_pages(&cluster, b).await {
                    Ok(p) => p,
                    Err(e) => {
                        col.error(run, "opening the dashboards", &e);
                        continue;
                    }
                },
                None => Vec::new(),
            };
            let mut r = RunCtx {
                run,
                runs: s.runs,
                settings: s,
                progress,
                col: &mut *col,
            };
            r.probes(&cluster).await;
            for (w, count) in &s.plan {
                let bound = time_bound(*w, *count, s.rate);
                let result =
                    tokio::time::timeout(bound, r.workload(*w, *count, &mut cluster)).await;
                let result = match result {
                    Ok(r) => r,
                    Err(_) => Err(anyhow::anyhow!("did not finish within {bound:?}")),
                };
                if let Err(e) = result {
                    r.col.error(run, w.name(), &e);
                    eprintln!("run {run}/{}: {}: {e:#}", s.runs, w.name());
                    // The daemons' state is unknown now: the next run starts afresh.
                    break;
                }
            }
            drop(cluster);
        }
        data_dir
    }

    /// Fresh daemons under a temp dir in the bench's dir, every pair connected.
    async fn start_cluster(&self) -> anyhow::Result<Cluster> {
        let mut cfg = ClusterConfig::new(&self.bin, self.nodes);
        cfg.temp_parent = Some(self.parent.clone());
        cfg.rust_log = std::env::var("MESH_BENCH_LOG").unwrap_or_else(|_| "warn".into());
        cfg.keep_dir = std::env::var_os("MESH_BENCH_KEEP").is_some();
        let mut cluster = Cluster::start(cfg).await?;
        cluster.wait_connected().await?;
        Ok(cluster)
    }
}

/// How long a browser may take to open a dashboard's live stream.
const PAGE_OPEN_BOUND: Duration = Duration::from_secs(60);

/// Opens each node's dashboard in `browser`, headless, and waits until
/// every page has its live stream open (the node counts a subscriber).
/// The browsers are killed when the answer is dropped.
async fn open_pages(
    cluster: &Cluster,
    browser: &Path,
) -> anyhow::Result<Vec<tokio::process::Child>> {
    let mut pages = Vec::new();
    for i in 0..cluster.len() {
        let web: mesh_api::WebResponse =
            mesh_cluster::call(cluster.client(i).post("/v1/web", &())).await?;
        let profile = cluster.base().join(format!("browser-{i}"));
        let child = tokio::process::Command::new(browser)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .arg("--disable-dev-shm-usage")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(&web.url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", browser.display()))?;
        pages.push(child);
    }
    let deadline = Instant::now() + PAGE_OPEN_BOUND;
    for i in 0..cluster.len() {
        while cluster.status(i).await?.subscribers == 0 {
            if Instant::now() >= deadline {
                bail!("node {i}'s dashboard had no live stream open after {PAGE_OPEN_BOUND:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(pages)
}

/// Stops each of `nodes` with SIGTERM; an error if one had to be killed.
pub(super) async fn stop_all(nodes: &mut [NodeProc]) -> anyhow::Result<()> {
    for n in nodes {
        if n.stop().await? == Stopped::Killed {
            bail!("{} did not stop on SIGTERM; killed", n.name());
        }
    }
    Ok(())
}

/// Puts the probes' figures first in the report.
pub(super) fn declare_probes(col: &mut Collector) {
    col.declare("disk-fsync", "rate", "fsyncs/s", 0);
    col.declare("disk-write", "rate", "MiB/s", 0);
    col.declare("store-commit", "rate", "commits/s", 0);
}

/// The figures a workload produces: (metric, unit).
pub(super) fn metrics_of(w: Workload) -> &'static [(&'static str, &'static str)] {
    match w {
        Workload::SendEach => &[("rate", "msgs/s"), ("p50", "ms"), ("sender_cpu/msg", "µs")],
        Workload::SendPipelined | Workload::AgentPipelined => &[
            ("rate", "msgs/s"),
            ("sender_rate", "msgs/s"),
            ("sender_cpu/msg", "µs"),
            ("peer_cpu/msg", "µs"),
            ("sender_disk/msg", "bytes"),
            ("peer_disk/msg", "bytes"),
        ],
        Workload::Latency => &[
            ("p50", "ms"),
            ("p99", "ms"),
            ("max", "ms"),
            ("sender_p50", "ms"),
        ],
        Workload::CatchUp => &[
            ("rate", "msgs/s"),
            ("peer_start", "ms"),
            ("sender_cpu/msg", "µs"),
            ("peer_cpu/msg", "µs"),
            ("peer_disk/msg", "bytes"),
        ],
        Workload::QueuedMemory => &[
            ("rss_over_idle", "MiB"),
            ("disk", "MiB"),
            ("idle_rss", "MiB"),
            ("send_rate", "msgs/s"),
        ],
        Workload::TopicFanout | Workload::TopicBatched => &[
            ("rate", "msgs/s"),
            ("sender_rate", "msgs/s"),
            ("sender_cpu/msg", "µs"),
            ("peer_cpu/msg", "µs"),
        ],
    }
}

/// Messages a request in topic-batched.
const TOPIC_BATCH: u64 = 64;

/// The agent agent-pipelined sends as, on node 0.
const BENCH_SENDER: &str = "bench-sender";
/// The agent it sends to, on each other node.
const BENCH_RECEIVER: &str = "bench-receiver";

/// Adds the bench's agents (once per cluster): a client of the sender's
/// socket, and the receivers' addresses.
async fn bench_agents(
    sender: &NodeProc,
    receivers: &[NodeProc],
) -> anyhow::Result<(mesh_api::client::Client, Vec<String>)> {
    let socket = add_agent(sender, BENCH_SENDER).await?;
    let mut to = Vec::with_capacity(receivers.len());
    for r in receivers {
        add_agent(r, BENCH_RECEIVER).await?;
        to.push(format!("{BENCH_RECEIVER}@{}", r.id()));
    }
    Ok((
        mesh_api::client::Client::for_agent(socket, BENCH_SENDER),
        to,
    ))
}

/// Adds agent `name` to `node` (or finds it there); its socket.
async fn add_agent(node: &NodeProc, name: &str) -> anyhow::Result<String> {
    let req = mesh_api::AddAgentRequest {
        name: name.into(),
        uid: None,
    };
    let added = node
        .client()
        .post::<mesh_api::AgentJson>("/v1/agents", &req)
        .await;
    let agent = match added {
        Ok(a) => a,
        Err(mesh_api::client::ClientError::Api { code, .. }) if code == "agent_exists" => {
            let all: mesh_api::AgentsResponse = node.client().get("/v1/agents").await?;
            all.local
                .into_iter()
                .find(|a| a.name == name)
                .context("the node lists no agent it says it has")?
        }
        Err(e) => return Err(e.into()),
    };
    agent
        .socket
        .context("the node named no socket for its agent")
}

/// One run's context.
pub(super) struct RunCtx<'a> {
    pub(super) run: u32,
    pub(super) runs: u32,
    pub(super) settings: &'a Settings,
    pub(super) progress: Progress,
    pub(super) col: &'a mut Collector,
}

impl RunCtx<'_> {
    pub(super) fn bar(&self, what: &str, total: u64, unit: &'static str) -> Bar {
        let label = format!("run {}/{} {what}", self.run, self.runs);
        self.progress.bar(label, total, unit)
    }

    /// Streams `count` of `msgs` to `/v1/send/batch` through `client`,
    /// a window of the settings' size in flight: how the plain-send
    /// workloads send.
    pub(super) async fn send_batch(
        &self,
        client: &mesh_api::client::Client,
        msgs: Arc<Msgs>,
        count: u64,
        bar: &Bar,
    ) -> anyhow::Result<send::LastSeqs> {
        let window = self.settings.window;
        send::stream(client, "/v1/send/batch", msgs, count, window, bar).await
    }

    pub(super) fn msgs(&self, letter: char, to: Vec<String>) -> Arc<Msgs> {
        Arc::new(Msgs {
            to,
            size: self.settings.size,
            tag: format!("{letter}{}-", self.run),
            agent: false,
        })
    }

    /// The disk's fsync rate and the smallest store commit, in the run's dir.
    pub(super) async fn probes_in(&mut self, dir: PathBuf) {
        type Probe = fn(&Path, Duration) -> anyhow::Result<(u64, f64)>;
        let probes: [(&str, &str, &str, Probe); 3] = [
            (
                "disk-fsync",
                "fsyncs/s",
                "4 KiB at one offset + fdatasync, in a row",
                measure::fsync_rate,
            ),
            (
                "disk-write",
                "MiB/s",
                "1 MiB writes, fdatasync every 8 MiB",
                measure::write_rate,
            ),
            (
                "store-commit",
                "commits/s",
                "the smallest redb transaction, in a row",
                measure::store_commit_rate,
            ),
        ];
        let time = self.settings.probe_time;
        for (name, unit, what, probe) in probes {
            let d = dir.clone();
            let result = tokio::task::spawn_blocking(move || probe(&d, time))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r);
            match result {
                Ok((n, rate)) => {
                    self.col.add(name, "rate", unit, n, rate);
                    eprintln!(
                        "run {}/{} {name}: {rate:.0} {unit} ({what})",
                        self.run, self.runs
                    );
                }
                Err(e) => self.col.error(self.run, name, &e),
            }
        }
    }

    async fn probes(&mut self, cluster: &Cluster) {
        self.probes_in(cluster.base().to_owned()).await;
    }

    async fn workload(
        &mut self,
        w: Workload,
        count: u64,
        cluster: &mut Cluster,
    ) -> anyhow::Result<()> {
        let (sender, receivers) = cluster
            .nodes_mut()
            .split_first_mut()
            .context("a cluster has at least two nodes")?;
        let to: Vec<String> = receivers.iter().map(|r| r.id().to_owned()).collect();
        match w {
            Workload::SendEach => {
                self.send_each(sender.socket(), Some(sender), to, count)
                    .await
            }
            Workload::SendPipelined => self.pipelined(sender, receivers, to, count, None).await,
            Workload::AgentPipelined => {
                let agents = bench_agents(sender, receivers).await?;
                self.pipelined(sender, receivers, to, count, Some(agents))
                    .await
            }
            Workload::Latency => self.latency(sender, receivers, to, count).await,
            Workload::CatchUp => self.catch_up(sender, receivers, to, count).await,
            Workload::QueuedMemory => self.queued(sender, receivers, to, count).await,
            Workload::TopicFanout => self.topic_fanout(sender, receivers, count, None).await,
            Workload::TopicBatched => {
                let batch = Some(TOPIC_BATCH);
                self.topic_fanout(sender, receivers, count, batch).await
            }
        }
    }

    /// send-each on `sender`'s socket; shared with `bench peer`.
    pub(super) async fn send_each(
        &mut self,
        socket: &Path,
        sender: Option<&NodeProc>,
        to: Vec<String>,
        count: u64,
    ) -> anyhow::Result<()> {
        let msgs = self.msgs('e', to);
        let mut conn = Conn::open(socket).await?;
        let bar = self.bar("send-each", count, "msgs");
        let sender = sender.map(std::slice::from_ref).unwrap_or_default();
        let u0 = Usage::of(sender);
        let t0 = Instant::now();
        let (mut times, _) = send::each(&mut conn, &msgs, count, &bar).await?;
        let rate = count as f64 / t0.elapsed().as_secs_f64();
        times.sort();
        let p50 = measure::quantile(&times, 0.5).map_or(f64::NAN, ms);
        self.col.add("send-each", "rate", "msgs/s", count, rate);
        self.col.add("send-each", "p50", "ms", count, p50);
        if !sender.is_empty() {
            let cpu = Usage::of(sender).cpu_per_msg(&u0, count);
            self.col
                .add("send-each", "sender_cpu/msg", "µs", count, cpu);
        }
        bar.finish(&format!("{rate:.0} msgs/s, p50 {p50:.2} ms per send"));
        Ok(())
    }

    /// send-pipelined, or with `agents` (the sending agent's client and
    /// the receivers' agents' addresses) agent-pipelined.
    async fn pipelined(
        &mut self,
        sender: &NodeProc,
        receivers: &[NodeProc],
        to: Vec<String>,
        count: u64,
        agents: Option<(mesh_api::client::Client, Vec<String>)>,
    ) -> anyhow::Result<()> {
        let pl = match agents {
            Some(_) => "agent-pipelined",
            None => "send-pipelined",
        };
        let (client, path, msgs) = match agents {
            Some((client, addresses)) => {
                let msgs = Arc::new(Msgs {
                    to: addresses,
                    size: self.settings.size,
                    tag: format!("a{}-", self.run),
                    agent: true,
                });
                let path = format!("/v1/agents/{BENCH_SENDER}/send/batch");
                (client, path, msgs)
            }
            None => (
                sender.client().clone(),
                "/v1/send/batch".to_owned(),
                self.msgs('p', to),
            ),
        };
        let bar = self.bar(pl, count, "msgs");
        let sender_u0 = Usage::of(std::slice::from_ref(sender));
        let peers_u0 = Usage::of(receivers);
        let t0 = Instant::now();
        let last = send::stream(&client, &path, msgs, count, self.settings.window, &bar).await?;
        let local = t0.elapsed();
        let base = send::total(&last) - count;
        send::wait_marks(receivers, sender, &last, base, &bar).await?;
        let rate = count as f64 / t0.elapsed().as_secs_f64();
        let sender_rate = count as f64 / local.as_secs_f64();
        let sender_u = Usage::of(std::slice::from_ref(sender));
        let peers_u = Usage::of(receivers);
        self.col.add(pl, "rate", "msgs/s", count, rate);
        self.col
            .add(pl, "sender_rate", "msgs/s", count, sender_rate);
        let cpu = sender_u.cpu_per_msg(&sender_u0, count);
        self.col.add(pl, "sender_cpu/msg", "µs", count, cpu);
        let cpu = peers_u.cpu_per_msg(&peers_u0, count);
        self.col.add(pl, "peer_cpu/msg", "µs", count, cpu);
        let disk = sender_u.disk_per_msg(&sender_u0, count);
        self.col.add(pl, "sender_disk/msg", "bytes", count, disk);
        let disk = peers_u.disk_per_msg(&peers_u0, count);
        self.col.add(pl, "peer_disk/msg", "bytes", count, disk);
        bar.finish(&format!(
            "{rate:.0} msgs/s committed at the peers ({sender_rate:.0} msgs/s at the sender)"
        ));
        Ok(())
    }
}
/// The topic topic-fanout publishes to.
const BENCH_TOPIC: &str = "bench";

impl RunCtx<'_> {
    /// topic-fanout: every node joins the bench topic, node 0 publishes
    /// `count` messages with `window` publishes in flight, and the run ends
    /// when every other node has journaled them all (its mark of node 0's
    /// stream of the topic).
    /// topic-fanout (`batch` None: one request per publish, up to 64 at
    /// once) or topic-batched (`batch` messages a request to
    /// `/publish/batch`, as many requests at once as keep `window`
    /// messages in flight).
    async fn topic_fanout(
        &mut self,
        sender: &NodeProc,
        receivers: &[NodeProc],
        count: u64,
        batch: Option<u64>,
    ) -> anyhow::Result<()> {
        let w = if batch.is_some() {
            "topic-batched"
        } else {
            "topic-fanout"
        };
        let join = mesh_api::JoinTopicRequest {
            name: BENCH_TOPIC.into(),
            max_msgs: Some(count.max(1)),
            max_bytes: None,
        };
        for n in std::iter::once(sender).chain(receivers) {
            n.client()
                .post::<mesh_api::TopicJson>("/v1/topics", &join)
                .await?;
        }
        let bar = Arc::new(self.bar(w, count, "msgs"));
        let sender_u0 = Usage::of(std::slice::from_ref(sender));
        let peers_u0 = Usage::of(receivers);
        let base = topic_mark(sender, sender.id()).await?;
        let (path, per_request, tasks_n) = match batch {
            None => (
                format!("/v1/topics/{BENCH_TOPIC}/publish"),
                1,
                self.settings.window.clamp(1, 64),
            ),
            Some(b) => (
                format!("/v1/topics/{BENCH_TOPIC}/publish/batch"),
                b,
                (self.settings.window as u64).div_ceil(b).max(1) as usize,
            ),
        };
        let req = mesh_api::PublishRequest {
            body: "x".repeat(self.settings.size),
            encoding: mesh_api::BodyEncoding::Text,
            msg_kind: 0,
        };
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..tasks_n {
            let (client, path, req, next, bar) = (
                sender.client().clone(),
                path.clone(),
                req.clone(),
                next.clone(),
                bar.clone(),
            );
            tasks.spawn(async move {
                loop {
                    let first = next.fetch_add(per_request, std::sync::atomic::Ordering::Relaxed);
                    if first >= count {
                        break;
                    }
                    let n = per_request.min(count - first);
                    if batch.is_none() {
                        client.post::<mesh_api::SendResponse>(&path, &req).await?;
                    } else {
                        let reqs = vec![req.clone(); n as usize];
                        let sent: mesh_api::BatchResponse = client.post(&path, &reqs).await?;
                        anyhow::ensure!(sent.sent.len() as u64 == n, "a short batch answer");
                    }
                    bar.inc(n);
                }
                Ok::<_, anyhow::Error>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        let local = t0.elapsed();
        for r in receivers {
            loop {
                if topic_mark(r, sender.id()).await? >= base + count {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let rate = count as f64 / t0.elapsed().as_secs_f64();
        let sender_rate = count as f64 / local.as_secs_f64();
        self.col.add(w, "rate", "msgs/s", count, rate);
        self.col.add(w, "sender_rate", "msgs/s", count, sender_rate);
        let cpu = Usage::of(std::slice::from_ref(sender)).cpu_per_msg(&sender_u0, count);
        self.col.add(w, "sender_cpu/msg", "µs", count, cpu);
        let cpu = Usage::of(receivers).cpu_per_msg(&peers_u0, count);
        self.col.add(w, "peer_cpu/msg", "µs", count, cpu);
        let summary = format!(
            "{rate:.0} msgs/s journaled at every member ({sender_rate:.0} msgs/s published)"
        );
        // Every task that held the bar has ended.
        if let Ok(bar) = Arc::try_unwrap(bar) {
            bar.finish(&summary);
        }
        Ok(())
    }
}

/// `node`'s mark of `author`'s stream of the bench topic (0 if none).
async fn topic_mark(node: &NodeProc, author: &str) -> anyhow::Result<u64> {
    let topics: mesh_api::TopicsResponse = node.client().get("/v1/topics").await?;
    Ok(topics
        .topics
        .iter()
        .filter(|t| t.name == BENCH_TOPIC)
        .flat_map(|t| &t.streams)
        .filter(|s| s.stream.author == author)
        .map(|s| s.mark)
        .max()
        .unwrap_or(0))
}

/// What the running daemons among some nodes have used so far.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    /// Bytes written to storage.
    written: u64,
    /// CPU time, user and system.
    cpu: Duration,
}

impl Usage {
    fn of(nodes: &[NodeProc]) -> Usage {
        let mut u = Usage::default();
        for pid in nodes.iter().filter_map(NodeProc::pid) {
            u.written += measure::written(pid).unwrap_or(0);
            u.cpu += measure::cpu_time(pid).unwrap_or_default();
        }
        u
    }

    /// CPU µs per message since `before`.
    fn cpu_per_msg(&self, before: &Usage, count: u64) -> f64 {
        self.cpu.saturating_sub(before.cpu).as_secs_f64() * 1e6 / count as f64
    }

    /// Bytes written per message since `before`.
    fn disk_per_msg(&self, before: &Usage, count: u64) -> f64 {
        self.written.saturating_sub(before.written) as f64 / count as f64
    }
}

/// A helper task aborted when dropped.
pub(super) struct ReaderTask(pub(super) tokio::task::JoinHandle<()>);

impl Drop for ReaderTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}
