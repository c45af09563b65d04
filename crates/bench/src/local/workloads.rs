//! The latency, catch-up and queued-memory workloads of a run.

use std::path::Path;
use std::str::FromStr as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use mesh_protocol::{Cursor, Epoch, NodeId};
use tokio::time::Instant;

use crate::measure::{self, ms};
use crate::progress::Bar;
use crate::send::{self};
use mesh_api::{EventEntry, EventRecord};
use mesh_cluster::NodeProc;

use super::{
    IDLE_SETTLE, LATENCY_DRAIN, MIB, RSS_SAMPLE_INTERVAL, ReaderTask, RunCtx, Usage, stop_all,
};

impl RunCtx<'_> {
    pub(super) async fn latency(
        &mut self,
        sender: &NodeProc,
        receivers: &[NodeProc],
        to: Vec<String>,
        count: u64,
    ) -> anyhow::Result<()> {
        let msgs = self.msgs('l', to);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, std::time::Instant)>();
        let readers = subscribe_readers(receivers, &msgs, tx).await?;
        let sent_at = Arc::new(Mutex::new(vec![None; count as usize]));
        let bar = self.bar("latency", count, "msgs");
        let sending = send::paced(
            sender.socket(),
            msgs.clone(),
            count,
            self.settings.rate,
            sent_at.clone(),
            &bar,
        );
        let mut got: Vec<Option<std::time::Instant>> = vec![None; count as usize];
        let receiving = receive_arrivals(&mut rx, count, &sent_at, &mut got);
        let (answered, received) = tokio::try_join!(sending, receiving)?;
        drop(readers);
        let sent = sent_at
            .lock()
            .map_err(|_| anyhow::anyhow!("the send times are poisoned"))?
            .clone();
        if received < count {
            bail!("the peers' subscribers saw {received} of {count} messages");
        }
        self.latency_figures(count, &sent, &got, answered, bar);
        Ok(())
    }

    /// Adds the latency figures of `count` messages sent at `sent` and seen
    /// at `got` (by number), and the sender's answer times `answered`.
    fn latency_figures(
        &mut self,
        count: u64,
        sent: &[Option<std::time::Instant>],
        got: &[Option<std::time::Instant>],
        mut answered: Vec<Duration>,
        bar: Bar,
    ) {
        let mut lat: Vec<Duration> = sent
            .iter()
            .zip(got)
            .filter_map(|(s, g)| Some(g.as_ref()?.saturating_duration_since(*s.as_ref()?)))
            .collect();
        let (p50, p99, max) = self.col.add_latency("", count, &mut lat);
        answered.sort();
        let sender_p50 = measure::quantile(&answered, 0.5).map_or(f64::NAN, ms);
        self.col
            .add("latency", "sender_p50", "ms", count, sender_p50);
        bar.finish(&format!(
            "p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms at {} msgs/s",
            self.settings.rate
        ));
    }

    pub(super) async fn catch_up(
        &mut self,
        sender: &NodeProc,
        receivers: &mut [NodeProc],
        to: Vec<String>,
        count: u64,
    ) -> anyhow::Result<()> {
        stop_all(receivers).await?;
        let msgs = self.msgs('c', to);
        let bar = self.bar("catch-up: sending, peers stopped", count, "msgs");
        let last = self.send_batch(sender.client(), msgs, count, &bar).await?;
        bar.finish("queued");
        let base = send::total(&last) - count;
        let bar = self.bar("catch-up", count, "msgs");
        let sender_u0 = Usage::of(std::slice::from_ref(sender));
        let t0 = Instant::now();
        for r in receivers.iter_mut() {
            r.spawn()?;
        }
        for r in receivers.iter_mut() {
            r.wait_ready().await?;
        }
        let started = t0.elapsed();
        send::wait_marks(receivers, sender, &last, base, &bar).await?;
        let rate = count as f64 / t0.elapsed().as_secs_f64();
        // The peers are new processes: all they did is start and catch up.
        let peers_u = Usage::of(receivers);
        let sender_cpu = Usage::of(std::slice::from_ref(sender)).cpu_per_msg(&sender_u0, count);
        let cu = "catch-up";
        self.col.add(cu, "rate", "msgs/s", count, rate);
        self.col.add(cu, "peer_start", "ms", count, ms(started));
        self.col.add(cu, "sender_cpu/msg", "µs", count, sender_cpu);
        let cpu = peers_u.cpu_per_msg(&Usage::default(), count);
        self.col.add(cu, "peer_cpu/msg", "µs", count, cpu);
        let disk = peers_u.disk_per_msg(&Usage::default(), count);
        self.col.add(cu, "peer_disk/msg", "bytes", count, disk);
        bar.finish(&format!(
            "{rate:.0} msgs/s from the peers' start (they answered after {:.0} ms)",
            ms(started)
        ));
        Ok(())
    }

    pub(super) async fn queued(
        &mut self,
        sender: &NodeProc,
        receivers: &mut [NodeProc],
        to: Vec<String>,
        count: u64,
    ) -> anyhow::Result<()> {
        stop_all(receivers).await?;
        let pid = sender.pid().context("the sender is not running")?;
        self.queued_memory(
            pid,
            sender.data_dir(),
            sender.client(),
            to,
            count,
            "queued-memory",
        )
        .await
    }

    /// queued-memory, in both modes: sends `count` messages to `to` through
    /// `client` while they cannot be delivered, and measures the sending
    /// daemon `pid` (data dir `dir`): its peak RSS over idle, its disk
    /// growth and the send rate. `label` names the progress bar.
    pub(crate) async fn queued_memory(
        &mut self,
        pid: u32,
        dir: &Path,
        client: &mesh_api::client::Client,
        to: Vec<String>,
        count: u64,
        label: &str,
    ) -> anyhow::Result<()> {
        tokio::time::sleep(IDLE_SETTLE).await;
        let memory = || measure::memory(pid).context("cannot read the sending daemon's memory");
        let (idle, _) = memory()?;
        let peak_reset = measure::reset_peak(pid);
        if !peak_reset {
            self.col.notes.push(
                "queued-memory: the kernel refused to reset VmHWM; the peak is the largest 50 ms sample".into(),
            );
        }
        let disk0 = measure::disk_bytes(dir);
        let sampled = Arc::new(AtomicU64::new(idle));
        let sampler = {
            let sampled = sampled.clone();
            ReaderTask(tokio::spawn(async move {
                loop {
                    if let Some((rss, _)) = measure::memory(pid) {
                        sampled.fetch_max(rss, Ordering::Relaxed);
                    }
                    tokio::time::sleep(RSS_SAMPLE_INTERVAL).await;
                }
            }))
        };
        let msgs = self.msgs('q', to);
        let bar = self.bar(label, count, "msgs");
        let t0 = Instant::now();
        self.send_batch(client, msgs, count, &bar).await?;
        let send_rate = count as f64 / t0.elapsed().as_secs_f64();
        drop(sampler);
        let (rss, hwm) = memory()?;
        let mut peak = sampled.load(Ordering::Relaxed).max(rss);
        if peak_reset {
            peak = peak.max(hwm);
        }
        let over = peak.saturating_sub(idle) as f64 / MIB;
        let disk = measure::disk_bytes(dir).saturating_sub(disk0) as f64 / MIB;
        let qm = "queued-memory";
        self.col.add(qm, "rss_over_idle", "MiB", count, over);
        self.col.add(qm, "disk", "MiB", count, disk);
        self.col
            .add(qm, "idle_rss", "MiB", count, idle as f64 / MIB);
        self.col.add(qm, "send_rate", "msgs/s", count, send_rate);
        bar.finish(&format!(
            "peak RSS {over:.1} MiB over idle ({:.1} MiB), {disk:.0} MiB on disk, sent at {send_rate:.0} msgs/s",
            idle as f64 / MIB
        ));
        Ok(())
    }
}

/// Subscribes to each of `receivers` after its journal head, with a task
/// per subscription that sends `tx` the number of each of `msgs` it sees and
/// when; a task ends at a lag (those messages never arrive).
///
/// # Errors
/// A receiver's status cannot be read or its subscription cannot start.
async fn subscribe_readers(
    receivers: &[NodeProc],
    msgs: &Arc<send::Msgs>,
    tx: tokio::sync::mpsc::UnboundedSender<(u64, std::time::Instant)>,
) -> anyhow::Result<Vec<ReaderTask>> {
    let mut readers = Vec::new();
    for r in receivers {
        let st = r.status().await?;
        let node = NodeId::from_str(&st.node.node).context("the peer's node id")?;
        let epoch = Epoch::from_str(&st.node.epoch).context("the peer's epoch")?;
        let cursor = Cursor::new(&node, epoch, st.journal_head).to_string();
        let mut sse = r
            .client()
            .subscribe(&format!("/v1/subscribe?after={cursor}"))
            .await
            .with_context(|| format!("subscribing to {}", r.name()))?;
        let tx = tx.clone();
        let msgs = msgs.clone();
        readers.push(ReaderTask(tokio::spawn(async move {
            while let Ok(Some(ev)) = sse.next().await {
                let at = std::time::Instant::now();
                if ev.event == "lagged" {
                    // A gap in what the subscriber saw: those messages never arrive.
                    break;
                }
                if ev.event != "entry" {
                    continue;
                }
                let Ok(entry) = serde_json::from_str::<EventEntry>(&ev.data) else {
                    continue;
                };
                if let EventRecord::Envelope { body, .. } = entry.record
                    && let Some(k) = msgs.number_of(&body)
                    && tx.send((k, at)).is_err()
                {
                    break;
                }
            }
        })));
    }
    Ok(readers)
}

/// Records in `got` when each of `count` messages first arrived, from `rx`,
/// until all have, the readers are gone, or [`LATENCY_DRAIN`] after the last
/// was sent (by `sent_at`). Returns how many arrived.
async fn receive_arrivals(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(u64, std::time::Instant)>,
    count: u64,
    sent_at: &Mutex<Vec<Option<std::time::Instant>>>,
    got: &mut [Option<std::time::Instant>],
) -> anyhow::Result<u64> {
    let mut n = 0u64;
    let mut drain_until: Option<Instant> = None;
    while n < count {
        let next = match drain_until {
            Some(t) => tokio::time::timeout_at(t, rx.recv()).await.ok().flatten(),
            None => rx.recv().await,
        };
        let Some((k, at)) = next else { break };
        if let Some(slot) = got.get_mut(k as usize)
            && slot.is_none()
        {
            *slot = Some(at);
            n += 1;
        }
        if drain_until.is_none()
            && sent_at
                .lock()
                .is_ok_and(|s| s.last().is_some_and(Option::is_some))
        {
            drain_until = Some(Instant::now() + LATENCY_DRAIN);
        }
    }
    Ok(n)
}
