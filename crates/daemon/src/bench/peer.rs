//! `mesh bench peer PEER_ID`: from this node to a peer it is linked with.
//!
//! The bus has no bench probe a peer answers, so what can be seen from here
//! is what the peer acknowledges: an ack means the peer has committed
//! everything up to it. send-pipelined runs until the peer has acknowledged
//! every message; latency is send → the ack committed here (three commits:
//! ours, the peer's, and ours of the ack), an upper bound of send → the
//! peer's subscriber. catch-up and queued-memory need the peer stopped and
//! are left out.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::time::Instant;

use super::cluster::StatusView;
use super::http::Conn;
use super::local::{RunCtx, declare_probes, metrics_of, time_bound};
use super::measure::{self, ms};
use super::progress::{Bar, Progress};
use super::report::{Collector, Machine, Report};
use super::send;
use super::{Settings, Workload};
use crate::client::Client;
use crate::paths::DataDir;

/// How often our own status is read while waiting for the peer's acks.
const ACK_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The most messages the ack-latency workload sends (one at a time).
const ACK_LATENCY_MSGS_MAX: u64 = 1_000;
/// How long one message may wait for its ack.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Messages to `peer` this node has not had acknowledged.
async fn queued(client: &Client, peer: &str) -> anyhow::Result<u64> {
    let st: StatusView = client.get("/v1/status").await?;
    Ok(st
        .peer(peer)
        .with_context(|| format!("{peer} is no longer a peer of this node"))?
        .queued_msgs)
}

pub(super) async fn run(
    data: &DataDir,
    peer: &str,
    mut settings: Settings,
) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut machine = Machine::read();
    let client = Client::new(data.socket_path());
    let st: StatusView = client
        .get("/v1/status")
        .await
        .context("bench peer measures from a running node")?;
    let p = st.peer(peer).with_context(|| {
        format!("{peer} is not a peer of this node; link them first (`mesh peer add TICKET`)")
    })?;
    if !p.connected {
        bail!("peer {peer} is not connected now; bench peer needs it up");
    }
    let mut col = Collector::default();
    let mut left_out = Vec::new();
    settings.plan.retain(|(w, _)| {
        let keep = !matches!(w, Workload::CatchUp | Workload::QueuedMemory);
        if !keep {
            left_out.push(w.name());
        }
        keep
    });
    if !left_out.is_empty() {
        col.notes.push(format!(
            "{} left out: they need the peer stopped, which only `mesh bench local` can do",
            left_out.join(" and ")
        ));
    }
    col.notes.push(
        "latency here is send → the peer's ack committed on this node (3 commits), an upper bound \
         of send → the peer's subscriber; the bus has no bench probe for the peer to answer"
            .into(),
    );
    declare_probes(&mut col);
    for (w, count) in &settings.plan {
        if *w == Workload::Latency {
            col.declare(w.name(), "ack_p50", "ms", *count);
        } else {
            // This process cannot see the peer's (or, here, the daemon's) CPU and disk.
            let seen = metrics_of(*w)
                .iter()
                .filter(|(m, _)| !m.contains("cpu") && !m.contains("disk"));
            for (metric, unit) in seen {
                col.declare(w.name(), metric, unit, *count);
            }
        }
    }
    let progress = Progress::new();
    let mut sent_total = 0u64;
    for run in 1..=settings.runs {
        let mut r = RunCtx {
            run,
            runs: settings.runs,
            settings: &settings,
            progress,
            col: &mut col,
        };
        r.probes_in(data.root().to_owned()).await;
        for (w, count) in &settings.plan {
            let bound = time_bound(*w, *count, settings.rate);
            let work = async {
                match w {
                    Workload::SendEach => {
                        r.send_each(&data.socket_path(), None, vec![peer.to_owned()], *count)
                            .await
                    }
                    Workload::SendPipelined => pipelined(&mut r, &client, peer, *count).await,
                    Workload::Latency => {
                        ack_latency(&mut r, &data.socket_path(), &client, peer, *count).await
                    }
                    Workload::CatchUp | Workload::QueuedMemory => Ok(()),
                }
            };
            let result = match tokio::time::timeout(bound, work).await {
                Ok(r) => r,
                Err(_) => Err(anyhow::anyhow!("did not finish within {bound:?}")),
            };
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
    col.notes.push(format!(
        "this run wrote up to {sent_total} messages (msg_kind {}) to this node's and the peer's journals",
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

async fn pipelined(
    r: &mut RunCtx<'_>,
    client: &Client,
    peer: &str,
    count: u64,
) -> anyhow::Result<()> {
    let msgs = r.msgs('p', vec![peer.to_owned()]);
    let bar = r.bar("send-pipelined", count, "msgs");
    let t0 = Instant::now();
    send::stream(client, msgs, count, r.settings.window, &bar).await?;
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
        let _: crate::api::json::SendResponse = conn
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
    lat.sort();
    let q = |x| measure::quantile(&lat, x).map_or(f64::NAN, ms);
    let (p50, p99, max) = (q(0.5), q(0.99), q(1.0));
    r.col.add("latency", "ack_p50", "ms", count, p50);
    r.col.add("latency", "ack_p99", "ms", count, p99);
    r.col.add("latency", "ack_max", "ms", count, max);
    bar.finish(&format!(
        "send → ack p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
    ));
    Ok(())
}
