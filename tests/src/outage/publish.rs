//! Publishing through a store outage: topic publishes held while the disk
//! is full (their requests open), then committed once it has room, in the
//! order asked, and journaled by the other member once each, in order.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{BatchResponse, EventRecord, JoinTopicRequest, PublishRequest, SendResponse};
use serde::Serialize;

use super::supersede::held_past;
use super::{HELD_AFTER, HOLD_MS, PHASE_TIMEOUT, PROBES_MAX, start_on_tmpfs};

/// The topic both nodes join.
const TOPIC: &str = "outage";
/// Messages of the batch published while one publish is held.
const BATCH: usize = 3;

/// What the run saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PublishReport {
    /// Publishes committed after the disk was full, before one was held.
    pub ok_before_held: u64,
    /// The held publish's seq once it was committed.
    pub held_seq: Option<u64>,
    /// The seqs of the batch published while it was held.
    pub batch_seqs: Vec<u64>,
    /// Every publish answered Ok: its seq and body, in the order asked.
    pub published: Vec<(u64, String)>,
    /// Node 0's topic stream as node 1 journaled it: seq and body of each.
    pub member: Vec<(u64, String)>,
}

impl PublishReport {
    /// Whether the held publish and the batch behind it were committed,
    /// at seqs in the order asked, with no seq skipped, and the other
    /// member journaled every publish once, in order.
    pub fn passed(&self) -> bool {
        let asked: Vec<u64> = (1..=self.published.len() as u64).collect();
        let seqs: Vec<u64> = self.published.iter().map(|(s, _)| *s).collect();
        let behind: Vec<u64> = self
            .held_seq
            .map_or_else(Vec::new, |h| (h + 1..=h + BATCH as u64).collect());
        self.held_seq.is_some()
            && self.batch_seqs == behind
            && seqs == asked
            && self.member == self.published
    }
}

/// Runs the scenario with `bin`, writing the daemons' logs to `out_dir`.
///
/// # Errors
/// If it cannot be set up (no root, no mount, a daemon does not start) or a
/// step does not happen in time.
pub fn run_blocking(bin: &Path, out_dir: &Path) -> anyhow::Result<PublishReport> {
    super::block_on(run(bin, out_dir))
}

fn publish_req(body: String) -> PublishRequest {
    PublishRequest {
        body,
        encoding: Default::default(),
        msg_kind: 0,
    }
}

/// Node 0's topic messages in `api`'s journal: seq and body of each.
async fn member_got(api: &Client, author: &str) -> anyhow::Result<Vec<(u64, String)>> {
    let journal = mesh_cluster::read_journal(api).await?;
    let channel = format!("topic:{TOPIC}");
    Ok(journal
        .into_iter()
        .filter_map(|e| match e.record {
            EventRecord::Envelope {
                stream, seq, body, ..
            } if stream.author == author && stream.channel == channel => Some((seq, body)),
            _ => None,
        })
        .collect())
}

async fn run(bin: &Path, out_dir: &Path) -> anyhow::Result<PublishReport> {
    std::fs::create_dir_all(out_dir)?;
    // A hold far past the run's: every held publish is committed, none let go.
    let (tmpfs, cluster) = start_on_tmpfs(bin, out_dir, HOLD_MS * 10).await?;
    let (api, member) = (cluster.client(0).clone(), cluster.client(1).clone());
    for c in [&api, &member] {
        let join = JoinTopicRequest {
            name: TOPIC.to_owned(),
            max_msgs: None,
            max_bytes: None,
        };
        let _: serde_json::Value = c.post("/v1/topics", &join).await?;
    }
    let mut report = PublishReport::default();
    let path = format!("/v1/topics/{TOPIC}/publish");
    let first: SendResponse = api.post(&path, &publish_req("before".into())).await?;
    report.published.push((first.seq, "before".into()));

    // Fill the disk, and publish one at a time until one is held.
    tmpfs.fill()?;
    let mut probe = None;
    for i in 0..PROBES_MAX {
        let body = format!("probe {i}");
        let (api, path, req) = (api.clone(), path.clone(), publish_req(body.clone()));
        let mut task = tokio::spawn(async move { api.post::<SendResponse>(&path, &req).await });
        tokio::select! {
            done = &mut task => {
                let sent = done.context("a probe failed")??;
                report.ok_before_held += 1;
                report.published.push((sent.seq, body));
            }
            () = tokio::time::sleep(HELD_AFTER) => { probe = Some((task, body)); break; }
        }
    }
    let (probe, probe_body) = probe.context("no publish was held on a full disk")?;
    // Held, not merely slow: the node counts it.
    held_past(&api, 0).await?;
    // A batch behind it is held too, whole, and keeps its place after it.
    let bodies: Vec<String> = (0..BATCH).map(|i| format!("batch {i}")).collect();
    let batch_req: Vec<PublishRequest> = bodies.iter().cloned().map(publish_req).collect();
    let (a, batch_path) = (api.clone(), format!("{path}/batch"));
    let batch = tokio::spawn(async move { a.post::<BatchResponse>(&batch_path, &batch_req).await });
    tokio::time::sleep(HELD_AFTER).await;
    if batch.is_finished() {
        bail!(
            "the batch was answered while the disk was full: {:?}",
            batch.await
        );
    }
    tmpfs.unfill()?;
    let held = probe.await.context("the held publish failed")??;
    report.held_seq = Some(held.seq);
    report.published.push((held.seq, probe_body));
    let sent = batch.await.context("the held batch failed")??;
    report.batch_seqs = sent.sent.iter().map(|s| s.seq).collect();
    report
        .published
        .extend(report.batch_seqs.iter().copied().zip(bodies));

    let author = cluster.node_id(0).to_owned();
    let started = Instant::now();
    loop {
        report.member = member_got(&member, &author).await?;
        if report.member.len() >= report.published.len() || started.elapsed() > PHASE_TIMEOUT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(cluster);
    std::fs::write(
        out_dir.join("publish.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(report)
}
