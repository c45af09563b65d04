//! Hostile input: a linked peer floods a daemon with frames it must refuse,
//! while an honest peer keeps sending to it.
//!
//! The flooder is a real iroh transport ([`Net`]) with its own key, added
//! to node 0 as a peer, that sends a valid `Hello` and then, in rotation:
//! batches with a broken signature, a replay of its one valid batch, batches
//! far past the reorder window, payloads that do not match their signed
//! hash, batches for another recipient, by another author, under another
//! epoch, and acks and resyncs for streams that do not exist. Frames that
//! do not decode or exceed the size limit cannot be sent through the
//! transport (it encodes what it sends) and are covered by the protocol's
//! fuzz targets instead.
//!
//! What must hold: node 0's peak RSS grows at most [`RSS_GROWTH_MAX_BYTES`]
//! over its idle RSS; its journal gains nothing from the flooder but the one
//! valid message; `GET /metrics` counts each refusal by reason, and every
//! frame sent is either counted there or is that message; and the
//! honest peer's messages all arrive (checked like a chaos run).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mesh_api::{AddPeerRequest, EventRecord};
use mesh_bus::net::{ConnId, Net, NetConfig, NetEvent};
use mesh_protocol::{
    Channel, Epoch, Frame, NewEnvelope, NodeId, OpenBatch, PROTOCOL_VERSION, Payloads, SecretKey,
    Seq, StreamId,
};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::chaos::{Follower, converge};
use crate::checker::{Summary, check};
use crate::cluster::{Cluster, ClusterConfig, Isolation, call};
use crate::history::History;
use crate::rng::SimRng;
use crate::workload::{ClientSpec, WorkloadConfig, run_client};

/// The most node 0's peak RSS may grow over its idle RSS.
pub const RSS_GROWTH_MAX_BYTES: u64 = 64 << 20;
/// How long the flooder waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How many reconnections the flood tolerates before giving up.
const RECONNECTS_MAX: u64 = 1000;
/// How often, and how many times at most, the counters are read while
/// node 0 works through what was sent.
const SETTLE_POLL: Duration = Duration::from_millis(200);
const SETTLE_POLLS_MAX: u32 = 3000;
/// Polls without any change after which node 0 is taken to be done.
const SETTLE_STILL_POLLS: u32 = 25;

/// What a flood run saw.
#[derive(Clone, Debug, Serialize)]
pub struct FloodReport {
    /// Frames the flooder sent.
    pub frames_sent: u64,
    /// Times the flooder's connection was closed and made again.
    pub reconnects: u64,
    /// Seconds the flood took.
    pub flood_s: f64,
    /// Node 0's RSS before the flood, in KiB.
    pub idle_rss_kib: u64,
    /// Node 0's peak RSS at the end, in KiB.
    pub peak_rss_kib: u64,
    /// `mesh_frames_dropped_total` growth over the flood, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Frames sent that neither a drop counter nor the journal accounts
    /// for, beyond those sent on a connection that later closed.
    pub unaccounted: u64,
    /// Frames sent on connections that later closed.
    pub sent_on_closed: u64,
    /// Envelopes by the flooder in node 0's journal (1 expected: its one
    /// valid message).
    pub flooder_envelopes: u64,
    /// Honest sends acknowledged during the flood.
    pub honest_ok: u64,
    /// Whether node 0 caught up with the honest peer afterwards.
    pub converged: bool,
    /// The checker's counts for the honest traffic.
    pub summary: Summary,
}

impl FloodReport {
    /// The reasons the flood must have been refused for.
    pub const REASONS: [&'static str; 6] = [
        "bad_signature",
        "duplicate",
        "outside_window",
        "cid_mismatch",
        "wrong_recipient",
        "wrong_author",
    ];

    /// Whether every property held.
    pub fn passed(&self) -> bool {
        self.peak_rss_kib.saturating_sub(self.idle_rss_kib) * 1024 <= RSS_GROWTH_MAX_BYTES
            && self.flooder_envelopes <= 1
            && self.unaccounted == 0
            && Self::REASONS
                .iter()
                .all(|r| self.dropped.get(*r).copied().unwrap_or(0) > 0)
            && self.honest_ok > 0
            && self.converged
            && self.summary.passed()
    }
}

/// The frames the flooder sends, in rotation.
struct Arsenal {
    frames: Vec<Frame>,
}

impl Arsenal {
    fn new(flooder: &SecretKey, epoch: Epoch, target: NodeId, other: NodeId) -> Self {
        let mut rng = SimRng::new(0xF100D);
        let key = |rng: &mut SimRng| {
            let mut b = [0u8; 32];
            for chunk in b.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next_u64().to_le_bytes()[..chunk.len()]);
            }
            SecretKey::from_bytes(&b)
        };
        let batch = |secret: &SecretKey, epoch: Epoch, to: NodeId, first: Seq, text: &str| {
            let open = OpenBatch::sign(
                secret,
                epoch,
                Channel::Direct(to),
                first,
                vec![NewEnvelope {
                    lamport: first,
                    created_ms: 0,
                    kind: 0,
                    payload: text.as_bytes().to_vec(),
                }],
            );
            // The limits are far away: one small envelope.
            open.map(|o| (o.batch().signed().clone(), o.payloads().to_vec()))
        };
        let mut frames = Vec::new();
        let mut push =
            |r: Result<(mesh_protocol::SignedBatch, Vec<Vec<u8>>), _>,
             tweak: &dyn Fn(&mut mesh_protocol::SignedBatch, &mut Vec<Vec<u8>>)| {
                if let Ok((mut b, mut p)) = r {
                    tweak(&mut b, &mut p);
                    frames.push(Frame::Batch {
                        batch: b,
                        payloads: Payloads(p),
                    });
                }
            };
        // Seq 1, valid: accepted once, then every copy is a replay.
        push(batch(flooder, epoch, target, 1, "flood 1"), &|_, _| {});
        push(batch(flooder, epoch, target, 2, "bad sig"), &|b, _| {
            b.sig[0] ^= 1
        });
        push(
            batch(flooder, epoch, target, 1_000_000, "far future"),
            &|_, _| {},
        );
        push(batch(flooder, epoch, target, 2, "cid"), &|_, p| {
            p[0][0] ^= 1
        });
        push(batch(flooder, epoch, other, 1, "not for you"), &|_, _| {});
        let stranger = key(&mut rng);
        push(batch(&stranger, epoch, target, 1, "not me"), &|_, _| {});
        let old = Epoch([7; 16]);
        push(batch(flooder, old, target, 1, "old epoch"), &|_, _| {});
        let bogus = StreamId {
            author: target,
            epoch: Epoch([9; 16]),
            channel: Channel::Direct(flooder.public()),
        };
        frames.push(Frame::Ack {
            stream: bogus.clone(),
            upto: 5,
        });
        frames.push(Frame::Resync {
            stream: bogus,
            after: 5,
        });
        Arsenal { frames }
    }
}

/// Runs the flood against `bin` with `frames` frames.
///
/// # Errors
/// If it cannot be set up.
pub fn run_blocking(bin: &Path, out_dir: &Path, frames: u64) -> anyhow::Result<FloodReport> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    rt.block_on(run(bin, out_dir, frames))
}

async fn run(bin: &Path, out_dir: &Path, frames: u64) -> anyhow::Result<FloodReport> {
    if out_dir.exists() {
        std::fs::remove_dir_all(out_dir)?;
    }
    std::fs::create_dir_all(out_dir)?;
    let mut cfg = ClusterConfig::new(bin, 2);
    // The flooder is a transport in this process: loopback reaches it.
    cfg.isolation = Isolation::Loopback;
    cfg.log_dir = Some(out_dir.to_owned());
    let cluster = Cluster::start(cfg).await?;
    let target: NodeId = cluster.node_id(0).parse().context("node 0's id")?;
    let other: NodeId = cluster.node_id(1).parse().context("node 1's id")?;
    let pid = cluster.pid(0).context("node 0 is not running")?;

    let mut seed = SimRng::new(0x5EED);
    let mut key_bytes = [0u8; 32];
    for chunk in key_bytes.chunks_mut(8) {
        chunk.copy_from_slice(&seed.next_u64().to_le_bytes());
    }
    let flooder = SecretKey::from_bytes(&key_bytes);
    let epoch = Epoch([3; 16]);
    let (net, mut events) = Net::bind(
        NetConfig::with_bind_addr(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
        flooder.clone(),
    )
    .await
    .context("cannot bind the flooder's transport")?;
    call(cluster.client(0).post::<serde_json::Value>(
        "/v1/peers",
        &AddPeerRequest {
            ticket: net.ticket().to_string(),
        },
    ))
    .await
    .context("adding the flooder to node 0")?;
    net.add_peer(target, vec![cluster.peer_addr(0)])
        .await
        .context("adding node 0 to the flooder")?;
    let name = mesh_protocol::NodeName::new("flooder").context("a valid name")?;
    let card = mesh_protocol::NodeCard::sign(&flooder, name, net.local_addrs(), 1)
        .context("the flooder's card")?;
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION,
        node: flooder.public(),
        epoch,
        marks: vec![],
        card: Box::new(card),
    };
    let arsenal = Arsenal::new(&flooder, epoch, target, other);

    // Honest traffic from node 1 to node 0, all along.
    let history = Arc::new(History::new(Some(&out_dir.join("history.jsonl")))?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let honest = tokio::spawn(run_client(
        ClientSpec {
            client: 0,
            node: 1,
            api: cluster.client(1).clone(),
            node_ids: vec![cluster.node_id(0).to_owned(), cluster.node_id(1).to_owned()],
            agent: None,
            roamer: None,
        },
        WorkloadConfig {
            interval: Duration::from_millis(20),
            ..WorkloadConfig::default()
        },
        SimRng::new(1),
        history.clone(),
        stop_rx,
    ));

    let before = dropped(&cluster).await?;
    let idle_rss_kib = proc_status_kib(pid, "VmRSS:")?;
    let started = Instant::now();
    let mut conn = wait_settled(&net, &mut events, target, &hello).await?;
    let mut reconnects = 0;
    let mut sent = 0u64;
    // Frames sent on connections that closed later: some may never have
    // been read, so they may be missing from the counters.
    let mut sent_on_closed = 0u64;
    let mut sent_on_conn = 0u64;
    while sent < frames {
        // Take what arrived; notice a closed connection.
        let mut lost_conn = false;
        while let Ok(ev) = events.try_recv() {
            match ev {
                NetEvent::Disconnected { conn: c, .. } if c == conn => lost_conn = true,
                NetEvent::Connected { peer, conn: c } if peer == target => {
                    sent_on_closed += std::mem::take(&mut sent_on_conn);
                    conn = c;
                    lost_conn = false;
                    reconnects += 1;
                    net.send(target, conn, &hello).await.ok();
                }
                _ => {}
            }
        }
        if lost_conn {
            sent_on_closed += std::mem::take(&mut sent_on_conn);
            reconnects += 1;
            if reconnects > RECONNECTS_MAX {
                bail!("node 0 closed the flooder's connection {reconnects} times");
            }
            conn = wait_settled(&net, &mut events, target, &hello).await?;
        }
        let frame = &arsenal.frames[(sent % arsenal.frames.len() as u64) as usize];
        if net.send(target, conn, frame).await.is_ok() {
            sent += 1;
            sent_on_conn += 1;
        } else {
            // Not connected any more: the next round waits for the new one.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let flood_s = started.elapsed().as_secs_f64();
    // Node 0 may still be reading: wait (bounded) until its refusals
    // account for every frame, or stop growing.
    let mut after = dropped(&cluster).await?;
    let mut still = 0;
    for _ in 0..SETTLE_POLLS_MAX {
        let counted: u64 = after
            .iter()
            .map(|(k, v)| v.saturating_sub(before.get(k).copied().unwrap_or(0)))
            .sum();
        if counted + 1 >= sent || still >= SETTLE_STILL_POLLS {
            break;
        }
        tokio::time::sleep(SETTLE_POLL).await;
        let now = dropped(&cluster).await?;
        still = if now == after { still + 1 } else { 0 };
        after = now;
    }
    stop_tx.send_replace(true);
    honest.await.ok();
    net.shutdown().await;
    history.flush()?;

    let peak_rss_kib = proc_status_kib(pid, "VmHWM:")?;
    let ops = history.ops();
    let mut follower = Follower::new(2);
    let (converged, _) = converge(&cluster, &mut follower, &ops, Duration::from_secs(60)).await;
    let mut journals = BTreeMap::new();
    for i in 0..2 {
        follower.read(&cluster, i).await?;
        journals.insert(
            cluster.node_id(i).to_owned(),
            std::mem::take(&mut follower.tails[i].entries),
        );
    }
    let flooder_id = flooder.public().to_string();
    let flooder_envelopes = journals[cluster.node_id(0)]
        .iter()
        .filter(|e| matches!(&e.record, EventRecord::Envelope { stream, .. } if stream.author == flooder_id))
        .count() as u64;
    // The flooder's one message is not the honest workload's: leave it out.
    for j in journals.values_mut() {
        j.retain(|e| !matches!(&e.record, EventRecord::Envelope { stream, .. } if stream.author == flooder_id));
    }
    let summary = check(&ops, &journals);
    let dropped: BTreeMap<String, u64> = after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect();
    let unaccounted = sent.saturating_sub(dropped.values().sum::<u64>() + flooder_envelopes);
    // What a closed connection may have taken with it is not held against node 0.
    let unaccounted = unaccounted.saturating_sub(sent_on_closed);
    let report = FloodReport {
        frames_sent: sent,
        reconnects,
        flood_s,
        idle_rss_kib,
        peak_rss_kib,
        dropped,
        unaccounted,
        sent_on_closed,
        flooder_envelopes,
        honest_ok: summary.ok,
        converged,
        summary,
    };
    std::fs::write(
        out_dir.join("summary.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    eprintln!("flood: {report:#?}");
    Ok(report)
}

/// Waits (bounded) for a connection to `target`, says `hello`, and waits
/// for `target`'s own `Hello` on it: then both sides took it as their live
/// connection (a dial race can replace the first one).
async fn wait_settled(
    net: &Net,
    events: &mut mpsc::Receiver<NetEvent>,
    target: NodeId,
    hello: &Frame,
) -> anyhow::Result<ConnId> {
    let mut conn = wait_connected(events, target).await?;
    net.send(target, conn, hello).await.ok();
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(NetEvent::Frame {
                peer,
                conn: c,
                frame: Frame::Hello { .. },
                ..
            })) if peer == target && c == conn => return Ok(conn),
            Ok(Some(NetEvent::Connected { peer, conn: c })) if peer == target => {
                conn = c;
                net.send(target, conn, hello).await.ok();
            }
            Ok(Some(_)) => continue,
            Ok(None) => bail!("the flooder's transport stopped"),
            Err(_) => bail!("node 0 did not say hello within {CONNECT_TIMEOUT:?}"),
        }
    }
}

/// Waits (bounded) for the flooder's connection to `target`.
async fn wait_connected(
    events: &mut mpsc::Receiver<NetEvent>,
    target: NodeId,
) -> anyhow::Result<ConnId> {
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(NetEvent::Connected { peer, conn })) if peer == target => return Ok(conn),
            Ok(Some(_)) => continue,
            Ok(None) => bail!("the flooder's transport stopped"),
            Err(_) => bail!("the flooder did not connect to node 0 within {CONNECT_TIMEOUT:?}"),
        }
    }
}

/// `mesh_frames_dropped_total` by reason, from `GET /metrics` of node 0.
async fn dropped(cluster: &Cluster) -> anyhow::Result<BTreeMap<String, u64>> {
    let (_, body) = call(
        cluster
            .client(0)
            .raw(hyper::Method::GET, "/metrics", None::<&()>),
    )
    .await?;
    let text = String::from_utf8_lossy(&body);
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("mesh_frames_dropped_total{reason=\"") else {
            continue;
        };
        if let Some((reason, value)) = rest.split_once("\"} ")
            && let Ok(v) = value.trim().parse()
        {
            out.insert(reason.to_owned(), v);
        }
    }
    Ok(out)
}

/// A `kB` field of `/proc/PID/status`.
fn proc_status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}
