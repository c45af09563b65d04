//! `mesh bench peer PEER_ID`: from this node to a peer it is linked with.
//!
//! The bus has no bench probe a peer answers, so what can be seen from here
//! is what the peer acknowledges: an ack means the peer has committed
//! everything up to it. send-pipelined runs until the peer has acknowledged
//! every message; latency is send → the ack committed here (three commits:
//! ours, the peer's, and ours of the ack), an upper bound of send → the
//! peer's subscriber.
//!
//! A remote daemon cannot be stopped from here, so catch-up and
//! queued-memory pause the link to the peer instead (`POST
//! /v1/peers/{id}/pause`): this node closes the connection and refuses the
//! peer's, and what is sent waits in its outbox exactly as for a stopped
//! peer. catch-up then resumes the link and times until the peer has
//! acknowledged every message; queued-memory reads this daemon's memory
//! (its pid is in `/v1/status`) and its data dir's disk use while the
//! messages are queued, then resumes and waits until they are acknowledged,
//! so a run leaves nothing queued. The link is resumed however the bench
//! ends (an error, a time bound, Ctrl-C), except when it is killed outright:
//! then `mesh peer resume PEER_ID` or a restart of the daemon resumes it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

use super::http::Conn;
use super::local::{RunCtx, declare_probes, metrics_of, time_bound};
use super::measure::{self, ms};
use super::progress::{Bar, Progress};
use super::report::{Collector, Machine, Report};
use super::{Settings, Workload};
use mesh_api::DataDir;
use mesh_api::StatusResponse;
use mesh_api::client::Client;

/// How often our own status is read while waiting for the peer's acks.
const ACK_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The most messages the ack-latency workload sends (one at a time).
const ACK_LATENCY_MSGS_MAX: u64 = 1_000;
/// How long one message may wait for its ack.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// The figures each workload gives in `bench peer`: (metric, unit).
fn peer_metrics(w: Workload) -> Vec<(&'static str, &'static str)> {
    match w {
        Workload::Latency => vec![("ack_p50", "ms"), ("ack_p99", "ms"), ("ack_max", "ms")],
        Workload::CatchUp => vec![
            ("rate", "msgs/s"),
            ("connect", "ms"),
            ("sender_cpu/msg", "µs"),
        ],
        Workload::QueuedMemory => vec![
            ("rss_over_idle", "MiB"),
            ("disk", "MiB"),
            ("idle_rss", "MiB"),
            ("send_rate", "msgs/s"),
            ("drain_rate", "msgs/s"),
        ],
        // This process sees neither the peer's CPU and disk nor, in these
        // two, this daemon's.
        Workload::SendEach
        | Workload::SendPipelined
        | Workload::AgentPipelined
        | Workload::TopicFanout
        | Workload::TopicBatched => metrics_of(w)
            .iter()
            .copied()
            .filter(|(m, _)| !m.contains("cpu") && !m.contains("disk"))
            .collect(),
    }
}

/// The link to the benched peer: paused and resumed through this node's
/// API, remembering whether the bench paused it, so it can always resume.
pub(super) struct Link {
    client: Client,
    peer: String,
    paused: AtomicBool,
}

impl Link {
    pub(super) fn new(data: &DataDir, peer: &str) -> Link {
        Link {
            client: Client::new(data.socket_path()),
            peer: peer.to_owned(),
            paused: AtomicBool::new(false),
        }
    }

    async fn pause(&self) -> anyhow::Result<()> {
        // Set first: a pause whose answer is lost is still resumed.
        self.paused.store(true, Ordering::SeqCst);
        let _: serde_json::Value = self
            .client
            .post(&format!("/v1/peers/{}/pause", self.peer), &())
            .await
            .context("cannot pause the link to the peer")?;
        Ok(())
    }

    async fn resume(&self) -> anyhow::Result<()> {
        let _: serde_json::Value = self
            .client
            .post(&format!("/v1/peers/{}/resume", self.peer), &())
            .await
            .with_context(|| {
                format!(
                    "cannot resume the link to the peer; run `mesh peer resume {}`",
                    self.peer
                )
            })?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Resumes the link if the bench paused it; says so on stderr if that fails.
    pub(super) async fn resume_if_paused(&self) {
        if self.paused.load(Ordering::SeqCst)
            && let Err(e) = self.resume().await
        {
            eprintln!("{e:#}");
        }
    }
}

/// This daemon's pid, from `/v1/status`.
async fn daemon_pid(client: &Client) -> anyhow::Result<u32> {
    #[derive(serde::Deserialize)]
    struct Pid {
        pid: Option<u32>,
    }
    let st: Pid = client.get("/v1/status").await?;
    let pid = st
        .pid
        .context("the daemon does not report its pid in /v1/status (an older version?)")?;
    if measure::memory(pid).is_none() {
        bail!(
            "cannot read /proc/{pid}/status of the daemon (another user, or another PID namespace?)"
        );
    }
    Ok(pid)
}

/// Messages to `peer` this node has not had acknowledged.
async fn queued(client: &Client, peer: &str) -> anyhow::Result<u64> {
    let st: StatusResponse = client.get("/v1/status").await?;
    Ok(super::status::peer(&st, peer)
        .with_context(|| format!("{peer} is no longer a peer of this node"))?
        .queued_msgs)
}

/// Runs `settings`' plan against `link`'s peer, from the node on `data`, and
/// reports it.
///
/// # Errors
/// The node is not running, or the peer is not a connected, unpaused peer of
/// it; a workload's error is in the report, not returned.
pub(super) async fn run(
    data: &DataDir,
    link: &Link,
    mut settings: Settings,
) -> anyhow::Result<Report> {
    let peer = link.peer.as_str();
    let started = Instant::now();
    let mut machine = Machine::read();
    let client = Client::new(data.socket_path());
    check_peer_up(&client, peer).await?;
    let needs_pid = settings
        .plan
        .iter()
        .any(|(w, _)| matches!(w, Workload::CatchUp | Workload::QueuedMemory));
    let pid = if needs_pid {
        Some(daemon_pid(&client).await?)
    } else {
        None
    };
    let mut col = Collector::default();
    plan_and_notes(&mut settings, &mut col, pid);
    declare_probes(&mut col);
    for (w, count) in &settings.plan {
        for (metric, unit) in peer_metrics(*w) {
            col.declare(w.name(), metric, unit, *count);
        }
    }
    let sent_total = run_plan(data, link, &client, &settings, &mut col, pid).await;
    col.notes.push(format!(
        "this run wrote up to {sent_total} messages (msg_kind {:#06x}) to this node's journal and \
         the peer's ({peer}); they stay there",
        super::BENCH_MSG_KIND
    ));
    let (figures, errors, notes) = col.finish();
    Ok(Report {
        mode: "peer".into(),
        nodes: 2,
        size: settings.size,
        runs: settings.runs,
        window: settings.window,
        rate: settings.rate,
        plan: Report::plan_of(&settings.plan),
        machine: {
            machine.finish();
            machine
        },
        version: env!("CARGO_PKG_VERSION").into(),
        data_dir: data.root().display().to_string(),
        figures,
        errors,
        notes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Checks that `peer` is a peer of the node `client` talks to, with its
/// link neither paused nor down.
///
/// # Errors
/// The node is not running, or `peer` is unknown, paused or not connected.
async fn check_peer_up(client: &Client, peer: &str) -> anyhow::Result<()> {
    let st: StatusResponse = client
        .get("/v1/status")
        .await
        .context("bench peer measures from a running node")?;
    let p = super::status::peer(&st, peer).with_context(|| {
        format!("{peer} is not a peer of this node; link them first (`mesh peer add TICKET`)")
    })?;
    if p.paused {
        bail!("the link to {peer} is paused; `mesh peer resume {peer}` first");
    }
    if !p.connected {
        bail!("peer {peer} is not connected now; bench peer needs it up");
    }
    Ok(())
}

/// Takes out of the plan what `bench peer` cannot run, and notes in `col`
/// how its figures differ from `bench local`'s (`pid` is this daemon's, when
/// a workload pauses the link).
fn plan_and_notes(settings: &mut Settings, col: &mut Collector, pid: Option<u32>) {
    let before = settings.plan.len();
    // It needs an agent on the peer, which this node cannot add.
    settings.plan.retain(|(w, _)| {
        !matches!(
            w,
            Workload::AgentPipelined | Workload::TopicFanout | Workload::TopicBatched
        )
    });
    if settings.plan.len() < before {
        col.notes.push(
            "agent-pipelined, topic-fanout and topic-batched run in `mesh bench local` only (they add an \
             agent, or join a topic, on the peer)"
                .into(),
        );
    }
    if let Some(pid) = pid {
        col.notes.push(format!(
            "catch-up and queued-memory pause this node's link to the peer (`mesh peer pause`) \
             instead of stopping it, and resume it after; their memory and CPU are this daemon's \
             (pid {pid})"
        ));
    }
    if settings.count(Workload::QueuedMemory).is_some() {
        col.notes.push(
            "queued-memory's idle RSS is this daemon's as it runs, warm from earlier work (unlike \
             bench local's fresh daemons): memory it already holds is not counted over idle; its \
             disk figure is the data dir's growth, less where the store reuses freed pages"
                .into(),
        );
    }
    col.notes.push(
        "latency here is send → the peer's ack committed on this node (3 commits), an upper bound \
         of send → the peer's subscriber; the bus has no bench probe for the peer to answer"
            .into(),
    );
}

/// Runs the plan `settings.runs` times, each run's probes first; a
/// workload's error is recorded in `col` and ends that run. Returns how many
/// messages were sent, at most.
async fn run_plan(
    data: &DataDir,
    link: &Link,
    client: &Client,
    settings: &Settings,
    col: &mut Collector,
    pid: Option<u32>,
) -> u64 {
    let progress = Progress::new();
    let mut sent_total = 0u64;
    for run in 1..=settings.runs {
        let mut r = RunCtx {
            run,
            runs: settings.runs,
            settings,
            progress,
            col: &mut *col,
        };
        r.probes_in(data.root().to_owned()).await;
        for (w, count) in &settings.plan {
            let bound = time_bound(*w, *count, settings.rate);
            let work = workload(&mut r, data, link, client, *w, *count, pid);
            let result = match tokio::time::timeout(bound, work).await {
                Ok(r) => r,
                Err(_) => Err(anyhow::anyhow!("did not finish within {bound:?}")),
            };
            // Whatever happened, the next workload starts with the link up.
            link.resume_if_paused().await;
            sent_total += if *w == Workload::Latency {
                (*count).min(ACK_LATENCY_MSGS_MAX)
            } else {
                *count
            };
            if let Err(e) = result {
                r.col.error(run, w.name(), &e);
                eprintln!("run {run}/{}: {}: {e:#}", settings.runs, w.name());
                break;
            }
        }
    }
    sent_total
}

/// One workload `w` of `count` messages to `link`'s peer.
async fn workload(
    r: &mut RunCtx<'_>,
    data: &DataDir,
    link: &Link,
    client: &Client,
    w: Workload,
    count: u64,
    pid: Option<u32>,
) -> anyhow::Result<()> {
    let peer = link.peer.as_str();
    match w {
        Workload::SendEach => {
            r.send_each(&data.socket_path(), None, vec![peer.to_owned()], count)
                .await
        }
        Workload::SendPipelined => pipelined(r, client, peer, count).await,
        // Left out of the plan by plan_and_notes.
        Workload::AgentPipelined | Workload::TopicFanout | Workload::TopicBatched => Ok(()),
        Workload::Latency => ack_latency(r, &data.socket_path(), client, peer, count).await,
        Workload::CatchUp => catch_up(r, client, link, pid.unwrap_or_default(), count).await,
        Workload::QueuedMemory => {
            queued_memory(r, data, client, link, pid.unwrap_or_default(), count).await
        }
    }
}

async fn pipelined(
    r: &mut RunCtx<'_>,
    client: &Client,
    peer: &str,
    count: u64,
) -> anyhow::Result<()> {
    let msgs = r.msgs('p', vec![peer.to_owned()]);
    let bar = r.bar("send-pipelined", count, "msgs");
    let t0 = Instant::now();
    r.send_batch(client, msgs, count, &bar).await?;
    let local = t0.elapsed();
    wait_acked(client, peer, count, &bar).await?;
    let rate = count as f64 / t0.elapsed().as_secs_f64();
    let sender_rate = count as f64 / local.as_secs_f64();
    r.col.add("send-pipelined", "rate", "msgs/s", count, rate);
    r.col.add(
        "send-pipelined",
        "sender_rate",
        "msgs/s",
        count,
        sender_rate,
    );
    bar.finish(&format!(
        "{rate:.0} msgs/s acknowledged by the peer ({sender_rate:.0} msgs/s committed here)"
    ));
    Ok(())
}

/// Waits until nothing to `peer` is unacknowledged.
async fn wait_acked(client: &Client, peer: &str, count: u64, bar: &Bar) -> anyhow::Result<()> {
    loop {
        let q = queued(client, peer).await?;
        bar.set(count.saturating_sub(q));
        if q == 0 {
            return Ok(());
        }
        tokio::time::sleep(ACK_POLL_INTERVAL).await;
    }
}

async fn ack_latency(
    r: &mut RunCtx<'_>,
    socket: &Path,
    client: &Client,
    peer: &str,
    count: u64,
) -> anyhow::Result<()> {
    let count = count.min(ACK_LATENCY_MSGS_MAX);
    let msgs = r.msgs('l', vec![peer.to_owned()]);
    let mut conn = Conn::open(socket).await?;
    let bar = r.bar("latency (send → ack)", count, "msgs");
    wait_acked(client, peer, 0, &bar).await?;
    let start = Instant::now();
    let mut lat = Vec::with_capacity(count as usize);
    let mut body = Vec::new();
    for k in 0..count {
        let at = start + Duration::from_secs_f64(k as f64 / f64::from(r.settings.rate));
        tokio::time::sleep_until(at).await;
        body.clear();
        msgs.push_json(k, &mut body);
        let t = Instant::now();
        let _: mesh_api::SendResponse = conn
            .post("/v1/send", bytes::Bytes::copy_from_slice(&body))
            .await?;
        loop {
            if queued(client, peer).await? == 0 {
                break;
            }
            if t.elapsed() > ACK_TIMEOUT {
                bail!("message {k} was not acknowledged within {ACK_TIMEOUT:?}");
            }
            tokio::task::yield_now().await;
        }
        lat.push(t.elapsed());
        bar.inc(1);
    }
    let (p50, p99, max) = r.col.add_latency("ack_", count, &mut lat);
    bar.finish(&format!(
        "send → ack p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
    ));
    Ok(())
}

/// Waits until everything earlier to `peer` is acknowledged, so a workload
/// starts from an empty outbox.
async fn settle(r: &RunCtx<'_>, client: &Client, peer: &str, what: &str) -> anyhow::Result<()> {
    let bar = r.bar(&format!("{what}: earlier messages acknowledged"), 0, "msgs");
    wait_acked(client, peer, 0, &bar).await?;
    bar.finish("none queued");
    Ok(())
}

/// Pauses the link, sends `count` (queued at this node), resumes it: the
/// time until the peer has acknowledged them all, and until it reconnected.
async fn catch_up(
    r: &mut RunCtx<'_>,
    client: &Client,
    link: &Link,
    pid: u32,
    count: u64,
) -> anyhow::Result<()> {
    let peer = link.peer.as_str();
    settle(r, client, peer, "catch-up").await?;
    link.pause().await?;
    let msgs = r.msgs('c', vec![peer.to_owned()]);
    let bar = r.bar("catch-up: sending, link paused", count, "msgs");
    r.send_batch(client, msgs, count, &bar).await?;
    bar.finish("queued");
    let bar = r.bar("catch-up", count, "msgs");
    let cpu0 = measure::cpu_time(pid).unwrap_or_default();
    let t0 = Instant::now();
    link.resume().await?;
    let connect = loop {
        let st: StatusResponse = client.get("/v1/status").await?;
        let p = super::status::peer(&st, peer)
            .with_context(|| format!("{peer} is no longer a peer of this node"))?;
        bar.set(count.saturating_sub(p.queued_msgs));
        if p.connected {
            break t0.elapsed();
        }
        tokio::time::sleep(ACK_POLL_INTERVAL).await;
    };
    wait_acked(client, peer, count, &bar).await?;
    let total = t0.elapsed();
    let cpu = measure::cpu_time(pid)
        .unwrap_or_default()
        .saturating_sub(cpu0);
    let rate = count as f64 / total.as_secs_f64();
    let cu = "catch-up";
    r.col.add(cu, "rate", "msgs/s", count, rate);
    r.col.add(cu, "connect", "ms", count, ms(connect));
    let cpu_per_msg = cpu.as_secs_f64() * 1e6 / count as f64;
    r.col.add(cu, "sender_cpu/msg", "µs", count, cpu_per_msg);
    bar.finish(&format!(
        "{rate:.0} msgs/s acknowledged from the resume (reconnected after {:.0} ms)",
        ms(connect)
    ));
    Ok(())
}

/// Pauses the link and sends `count`: this daemon's peak RSS over idle and
/// its data dir's growth while they are queued; then resumes and waits until
/// the peer has acknowledged them all.
async fn queued_memory(
    r: &mut RunCtx<'_>,
    data: &DataDir,
    client: &Client,
    link: &Link,
    pid: u32,
    count: u64,
) -> anyhow::Result<()> {
    let peer = link.peer.as_str();
    settle(r, client, peer, "queued-memory").await?;
    link.pause().await?;
    let label = "queued-memory: sending, link paused";
    r.queued_memory(
        pid,
        data.root(),
        client,
        vec![peer.to_owned()],
        count,
        label,
    )
    .await?;
    let qm = "queued-memory";
    // Leave nothing queued: the workload's time bound covers this wait.
    let bar = r.bar("queued-memory: resumed, until acknowledged", count, "msgs");
    let t1 = Instant::now();
    link.resume().await?;
    wait_acked(client, peer, count, &bar).await?;
    let drain_rate = count as f64 / t1.elapsed().as_secs_f64();
    r.col.add(qm, "drain_rate", "msgs/s", count, drain_rate);
    bar.finish(&format!(
        "{drain_rate:.0} msgs/s acknowledged after the resume"
    ));
    Ok(())
}
