//! The nemesis: a seeded schedule of faults, and how each is carried out on
//! a [`Cluster`].
//!
//! The schedule is a pure function of the seed, the cluster size, the
//! number of faults and whether the network can be cut ([`plan`]), so a
//! failing run replays from its seed. Faults run one at a time: apply, hold,
//! heal, a quiet spell, the next. The first faults of every schedule are one
//! of each kind in a seeded order, so even a short run has them all.
//! [`with_moves`] adds moves of the roaming agent between them, drawn from
//! a seeded generator of their own (the faults stay the seed's).

use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use mesh_api::client::{Client, path_segment};
use mesh_api::{AgentExport, AgentJson, ExportAgentRequest, ImportAgentRequest, InboxPage};

use crate::cluster::Cluster;
use crate::history::{History, Op, ReadEntry};
use crate::netns::Netns;
use crate::rng::SimRng;
use crate::workload::{Ended, Publish, Roamer, Send};

/// The share of packets the loss fault drops, in percent.
pub const LOSS_PERCENT: u32 = 30;

/// One fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum Fault {
    /// `kill -9` a node, keep it down for `down_ms`, restart it on its data dir.
    KillRestart {
        /// The node.
        node: usize,
        /// How long it stays down.
        down_ms: u64,
    },
    /// SIGSTOP a node for `hold_ms`, then SIGCONT.
    Pause {
        /// The node.
        node: usize,
        /// How long it stays stopped.
        hold_ms: u64,
    },
    /// Cut one node off from all others for `hold_ms`.
    Isolate {
        /// The node.
        node: usize,
        /// How long the cut lasts.
        hold_ms: u64,
    },
    /// Split the cluster into `minority` and the rest for `hold_ms`.
    Split {
        /// The smaller side.
        minority: Vec<usize>,
        /// How long the split lasts.
        hold_ms: u64,
    },
    /// Drop [`LOSS_PERCENT`] % of all packets on the bridge for `hold_ms`.
    Loss {
        /// How long the loss lasts.
        hold_ms: u64,
    },
    /// Send a burst of messages through a node and `kill -9` it the moment
    /// the first is acknowledged (so a send answered before its commit is
    /// durable is caught), keep it down for `down_ms`, restart it. With a
    /// topic ([`Ctx::topic`]), some of the burst are published to it.
    KillAfterAck {
        /// The node.
        node: usize,
        /// The recipient of the burst.
        to: usize,
        /// How many sends the burst has.
        burst: u32,
        /// How long it stays down.
        down_ms: u64,
    },
    /// `kill -9` a node, keep it down for `down_ms` while the others queue
    /// messages for it, restart it, and `kill -9` it again as soon as the
    /// others' queues for it start to shrink (it is catching up), or
    /// `resync_ms` after it answers at the latest; then restart it.
    KillDuringResync {
        /// The node.
        node: usize,
        /// How long it stays down first.
        down_ms: u64,
        /// How long after it is back the second kill comes at the latest.
        resync_ms: u64,
    },
    /// Move the roaming agent ([`Ctx::roamer`]) from its host to another
    /// node: read its inbox there to its end, export it after what it read,
    /// import it on the node `1 + to_offset` after its host (mod the
    /// cluster's size); `kill` says which host is `kill -9`ed around it,
    /// for `down_ms`.
    MoveRoamer {
        /// Which node it moves to, counted from its host.
        to_offset: usize,
        /// Which host is killed around the move, if any.
        kill: MoveKill,
        /// How long the killed host stays down.
        down_ms: u64,
    },
}

/// Which host a move kills (`kill -9`), and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveKill {
    /// None.
    None,
    /// The host it leaves, between the export and the import (it learns of
    /// the move from its peers once it is back).
    OldBeforeImport,
    /// The host it leaves, right after the import (maybe mid-pump).
    Old,
    /// The new host, right after the import (before its notice is out, maybe).
    New,
}

impl Fault {
    /// The fault's kind, as counted in reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillRestart { .. } => "kill_restart",
            Fault::Pause { .. } => "pause",
            Fault::Isolate { .. } => "isolate",
            Fault::Split { .. } => "split",
            Fault::Loss { .. } => "loss",
            Fault::KillDuringResync { .. } => "kill_during_resync",
            Fault::KillAfterAck { .. } => "kill_after_ack",
            Fault::MoveRoamer { .. } => "move_roamer",
        }
    }

    /// Whether the fault needs network namespaces.
    pub fn needs_network(&self) -> bool {
        matches!(
            self,
            Fault::Isolate { .. } | Fault::Split { .. } | Fault::Loss { .. }
        )
    }
}

/// One step of a schedule: a fault, then a quiet spell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The fault.
    #[serde(flatten)]
    pub fault: Fault,
    /// The quiet spell after it is healed, in ms.
    pub quiet_ms: u64,
}

/// The fault kinds a schedule draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    KillRestart,
    Pause,
    KillDuringResync,
    KillAfterAck,
    Isolate,
    Split,
    Loss,
}

const PROCESS_KINDS: [Kind; 4] = [
    Kind::KillRestart,
    Kind::Pause,
    Kind::KillDuringResync,
    Kind::KillAfterAck,
];
const NETWORK_KINDS: [Kind; 3] = [Kind::Isolate, Kind::Split, Kind::Loss];

/// The schedule of `count` faults for a cluster of `nodes` (at least 2),
/// from `seed`. Without `network`, only process faults are drawn.
pub fn plan(seed: u64, nodes: usize, count: usize, network: bool) -> Vec<Step> {
    let mut rng = SimRng::new(seed ^ 0x6E65_6D65_7369_7321);
    let mut kinds: Vec<Kind> = PROCESS_KINDS.to_vec();
    if network {
        kinds.extend(NETWORK_KINDS);
    }
    let mut first = kinds.clone();
    rng.shuffle(&mut first);
    // After one of each, kills during resync come twice as often: they are
    // the fault the issue singles out.
    let mut later = kinds.clone();
    later.push(Kind::KillDuringResync);
    let ms = |rng: &mut SimRng, lo: u64, hi: u64| {
        rng.duration(Duration::from_millis(lo), Duration::from_millis(hi))
            .as_millis() as u64
    };
    (0..count)
        .map(|i| {
            let kind = first
                .get(i)
                .copied()
                .unwrap_or_else(|| later[rng.index(later.len())]);
            let node = rng.index(nodes.max(1));
            let fault = match kind {
                Kind::KillRestart => Fault::KillRestart {
                    node,
                    down_ms: ms(&mut rng, 200, 3000),
                },
                Kind::Pause => Fault::Pause {
                    node,
                    hold_ms: ms(&mut rng, 500, 4000),
                },
                Kind::KillDuringResync => Fault::KillDuringResync {
                    node,
                    down_ms: ms(&mut rng, 1500, 4000),
                    resync_ms: ms(&mut rng, 300, 2000),
                },
                Kind::KillAfterAck => Fault::KillAfterAck {
                    node,
                    to: (node + 1 + rng.index(nodes.saturating_sub(1).max(1))) % nodes.max(1),
                    burst: 1 + rng.below(8) as u32,
                    down_ms: ms(&mut rng, 200, 2000),
                },
                Kind::Isolate => Fault::Isolate {
                    node,
                    hold_ms: ms(&mut rng, 1000, 5000),
                },
                Kind::Split => {
                    let mut all: Vec<usize> = (0..nodes).collect();
                    rng.shuffle(&mut all);
                    let size = 1 + rng.index(((nodes.saturating_sub(1)) / 2).max(1));
                    let mut minority = all[..size.min(nodes)].to_vec();
                    minority.sort_unstable();
                    Fault::Split {
                        minority,
                        hold_ms: ms(&mut rng, 1000, 5000),
                    }
                }
                Kind::Loss => Fault::Loss {
                    hold_ms: ms(&mut rng, 2000, 5000),
                },
            };
            Step {
                fault,
                quiet_ms: ms(&mut rng, 300, 1500),
            }
        })
        .collect()
}

/// `steps` with a move of the roaming agent after every `every` of them
/// (none if 0), drawn from `seed` by a generator of their own: the faults
/// of `steps` stay what [`plan`] made them.
pub fn with_moves(steps: Vec<Step>, seed: u64, nodes: usize, every: usize) -> Vec<Step> {
    if every == 0 || nodes < 2 {
        return steps;
    }
    let mut rng = SimRng::new(seed ^ 0x726F_616D_6572_2121);
    let kills = [
        MoveKill::None,
        MoveKill::OldBeforeImport,
        MoveKill::Old,
        MoveKill::New,
    ];
    let mut out = Vec::with_capacity(steps.len() + steps.len() / every);
    for (i, step) in steps.into_iter().enumerate() {
        out.push(step);
        if (i + 1) % every == 0 {
            let kill = kills[rng.index(kills.len())];
            out.push(Step {
                fault: Fault::MoveRoamer {
                    to_offset: rng.index(nodes - 1),
                    kill,
                    down_ms: rng
                        .duration(Duration::from_millis(200), Duration::from_millis(1000))
                        .as_millis() as u64,
                },
                quiet_ms: rng
                    .duration(Duration::from_millis(100), Duration::from_millis(500))
                    .as_millis() as u64,
            });
        }
    }
    out
}

/// What carrying out a fault observed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Applied {
    /// Milliseconds since the run started, when the fault began.
    pub t_ms: u64,
    /// The fault's kind.
    pub kind: String,
    /// For `kill_during_resync`: envelopes the other nodes had queued for
    /// the node when it answered again after the first kill.
    pub queued_at_restart: Option<u64>,
    /// For `kill_during_resync`: envelopes the other nodes still had queued
    /// for the node right after the second kill (above zero shows it was
    /// killed before it caught up).
    pub queued_at_kill: Option<u64>,
    /// For network faults: packets the `tc` rules dropped while it lasted
    /// (above zero shows the cut bit on live traffic).
    pub packets_dropped: Option<u64>,
    /// Anything worth a person's attention.
    pub note: String,
}

/// What the nemesis needs besides the cluster: the history its own sends
/// (for `kill_after_ack`) are recorded in, under a client number of its own.
#[derive(Debug)]
pub struct Ctx {
    /// The run's history.
    pub history: Arc<History>,
    /// The nemesis's client number (no workload client has it).
    pub client: u32,
    /// How long one of its sends may take.
    pub send_timeout: Duration,
    /// The topic every node is a member of, if any, and one message in how
    /// many of a `kill_after_ack` burst is published to it (by the
    /// message's counter, so the schedule stays the seed's).
    pub topic: Option<(String, u64)>,
    /// The agent `move_roamer` moves, and where it reads it.
    pub roamer: Option<RoamerReader>,
    next_c: u64,
}

/// The roaming agent as its reader knows it: where it is, and how far it
/// has read its inbox there.
#[derive(Debug)]
pub struct RoamerReader {
    /// The agent (its host is shared with the workload).
    pub roamer: Roamer,
    /// Where the next read of its inbox at its host starts (`None`: from
    /// the start).
    pub after: Option<String>,
}

/// Entries one page of an inbox read asks for, and the most pages one
/// read takes (a bound, far above what a run's agent sends fill).
const INBOX_PAGE: usize = 500;
const INBOX_PAGES_MAX: usize = 200;
/// How long one inbox page, export or import may take.
const AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl RoamerReader {
    /// A client of the agent's socket on node `i` (as its host).
    pub fn client(&self, cluster: &Cluster, i: usize) -> Client {
        let dir = mesh_api::DataDir::resolve(Some(cluster.data_dir(i))).map_or_else(
            |_| cluster.data_dir(i).join("agents"),
            |d| d.agent_sockets_dir(),
        );
        Client::for_agent(
            mesh_api::agent_socket_in(&dir, &self.roamer.name),
            &self.roamer.name,
        )
    }

    /// Reads the agent's inbox at its host from where the last read
    /// stopped to its end, records what it read (`agent_read`, also when
    /// a page fails after others were read) and moves on past it. Answers
    /// how many message entries it read.
    ///
    /// # Errors
    /// If a page cannot be read (what was read before it is recorded).
    pub async fn read(&mut self, cluster: &Cluster, history: &History) -> anyhow::Result<usize> {
        let node = self.roamer.host();
        let client = self.client(cluster, node);
        let start = self.after.clone();
        let mut entries = Vec::new();
        let mut other = Vec::new();
        let mut failed = None;
        for _ in 0..INBOX_PAGES_MAX {
            let mut path = format!(
                "/v1/agents/{}/inbox?limit={INBOX_PAGE}",
                path_segment(&self.roamer.name)
            );
            if let Some(a) = &self.after {
                path += &format!("&after={}", path_segment(a));
            }
            let page = match tokio::time::timeout(
                AGENT_CALL_TIMEOUT,
                client.get::<InboxPage>(&path),
            )
            .await
            {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    failed = Some(anyhow::Error::new(e));
                    break;
                }
                Err(_) => {
                    failed = Some(anyhow::anyhow!("no answer within {AGENT_CALL_TIMEOUT:?}"));
                    break;
                }
            };
            let Some(last) = page.entries.last() else {
                break;
            };
            self.after = Some(last.cursor.clone());
            for e in page.entries {
                if e.kind == "message" {
                    entries.push(ReadEntry {
                        id: e.id.unwrap_or_default(),
                        body: e.body,
                        arrival: e.arrival,
                        forwarded_by: e.forwarded_by,
                    });
                } else {
                    other.push(format!("{} at arrival {}: {}", e.kind, e.arrival, e.body));
                }
            }
        }
        let n = entries.len();
        if !entries.is_empty() || !other.is_empty() {
            history.record(Op::AgentRead {
                t_ms: history.now_ms(),
                node,
                agent: self.roamer.name.clone(),
                after: start,
                next: self.after.clone(),
                entries,
                other,
            });
        }
        match failed {
            Some(e) => Err(e.context(format!(
                "reading {}'s inbox at node {node}",
                self.roamer.name
            ))),
            None => Ok(n),
        }
    }
}

impl Ctx {
    /// A context recording into `history` as `client`.
    pub fn new(history: Arc<History>, client: u32, send_timeout: Duration) -> Self {
        Ctx {
            history,
            client,
            send_timeout,
            topic: None,
            roamer: None,
            next_c: 0,
        }
    }
}

/// Carries out `fault` on `cluster` and heals it. Answers what it saw.
///
/// # Errors
/// If the cluster cannot be signalled, restarted or the network cut/healed.
pub async fn apply(cluster: &mut Cluster, ctx: &mut Ctx, fault: &Fault) -> anyhow::Result<Applied> {
    let mut applied = Applied {
        kind: fault.kind().into(),
        ..Applied::default()
    };
    let sleep = |ms: u64| tokio::time::sleep(Duration::from_millis(ms));
    match fault {
        Fault::KillRestart { node, down_ms } => {
            cluster.kill(*node).await?;
            sleep(*down_ms).await;
            cluster.restart(*node).await?;
        }
        Fault::Pause { node, hold_ms } => {
            cluster.pause(*node)?;
            sleep(*hold_ms).await;
            cluster.resume(*node)?;
        }
        Fault::Isolate { node, hold_ms } => {
            let net = cluster.netns().context("isolate needs namespaces")?;
            let before = dropped_total(net);
            net.isolate(*node)?;
            sleep(*hold_ms).await;
            net.heal()?;
            applied.packets_dropped = Some(dropped_total(net).saturating_sub(before));
        }
        Fault::Split { minority, hold_ms } => {
            let net = cluster.netns().context("split needs namespaces")?;
            let majority: Vec<usize> = (0..cluster.len())
                .filter(|i| !minority.contains(i))
                .collect();
            let before = dropped_total(net);
            net.partition(&[minority.clone(), majority])?;
            sleep(*hold_ms).await;
            net.heal()?;
            applied.packets_dropped = Some(dropped_total(net).saturating_sub(before));
        }
        Fault::Loss { hold_ms } => {
            let net = cluster.netns().context("loss needs namespaces")?;
            let before = dropped_total(net);
            net.loss(LOSS_PERCENT)?;
            sleep(*hold_ms).await;
            net.heal()?;
            applied.packets_dropped = Some(dropped_total(net).saturating_sub(before));
        }
        Fault::KillAfterAck {
            node,
            to,
            burst,
            down_ms,
        } => {
            let mut sends = tokio::task::JoinSet::new();
            for _ in 0..*burst {
                ctx.next_c += 1;
                let (client, c) = (ctx.client, ctx.next_c);
                let (api, history, timeout) = (
                    cluster.client(*node).clone(),
                    ctx.history.clone(),
                    ctx.send_timeout,
                );
                match &ctx.topic {
                    Some((topic, one_in)) if *one_in > 0 && c % *one_in == 0 => {
                        let publish = Publish {
                            client,
                            c,
                            from: *node,
                            from_id: cluster.node_id(*node).to_owned(),
                            topic: topic.clone(),
                        };
                        sends.spawn(async move { publish.run(&api, &history, timeout).await });
                    }
                    _ => {
                        let send = Send {
                            client,
                            c,
                            from: *node,
                            to: *to,
                            to_id: cluster.node_id(*to).to_owned(),
                        };
                        sends.spawn(async move { send.run(&api, &history, timeout).await });
                    }
                }
            }
            let mut killed_after_ack = false;
            while let Some(ended) = sends.join_next().await {
                if ended.ok() == Some(Ended::Ok) {
                    // At once: the point is to land before a lazy commit.
                    cluster.kill(*node).await?;
                    killed_after_ack = true;
                    break;
                }
            }
            cluster.kill(*node).await?;
            while sends.join_next().await.is_some() {}
            if !killed_after_ack {
                applied.note = "no send of the burst was acknowledged".into();
            }
            sleep(*down_ms).await;
            cluster.restart(*node).await?;
        }
        Fault::KillDuringResync {
            node,
            down_ms,
            resync_ms,
        } => {
            cluster.kill(*node).await?;
            sleep(*down_ms).await;
            cluster.restart(*node).await?;
            // Watch the others' queues for it (bounded by `resync_ms`) and
            // kill it as soon as they shrink: it is catching up.
            let at_restart = queued_for(cluster, *node).await;
            let deadline = tokio::time::Instant::now() + Duration::from_millis(*resync_ms);
            for _ in 0..RESYNC_POLLS_MAX {
                let now = queued_for(cluster, *node).await;
                if now == 0 || now < at_restart || tokio::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(RESYNC_POLL).await;
            }
            cluster.kill(*node).await?;
            // What the others still hold for it: not yet acknowledged.
            applied.queued_at_restart = Some(at_restart);
            applied.queued_at_kill = Some(queued_for(cluster, *node).await);
            sleep(*down_ms / 4).await;
            cluster.restart(*node).await?;
        }
        Fault::MoveRoamer {
            to_offset,
            kill,
            down_ms,
        } => {
            let r = ctx
                .roamer
                .as_mut()
                .context("move_roamer needs a roaming agent")?;
            let from = r.roamer.host();
            let to = (from + 1 + to_offset) % cluster.len();
            applied.note = move_roamer(cluster, r, &ctx.history, from, to, *kill).await?;
            match kill {
                MoveKill::None => {}
                MoveKill::OldBeforeImport => {
                    // Killed already: it comes back now.
                    sleep(*down_ms).await;
                    cluster.restart(from).await?;
                }
                MoveKill::Old | MoveKill::New => {
                    let node = if *kill == MoveKill::Old { from } else { to };
                    cluster.kill(node).await?;
                    sleep(*down_ms).await;
                    cluster.restart(node).await?;
                }
            }
        }
    }
    Ok(applied)
}

/// Moves `r`'s agent from node `from` to node `to`: reads its inbox at
/// `from` to its end, exports it there after what it read, kills `from`
/// if `kill` says so before the import, and imports it on `to`. Each step
/// is recorded; an export or import that fails leaves the agent at `from`
/// (where its reader goes on), and the run goes on. Answers a note.
///
/// # Errors
/// If the import's answer was lost and cannot be told from a refusal (the
/// agent's inbox at `to` could not be read from the right place), or the
/// history cannot be kept.
async fn move_roamer(
    cluster: &mut Cluster,
    r: &mut RoamerReader,
    history: &History,
    from: usize,
    to: usize,
    kill: MoveKill,
) -> anyhow::Result<String> {
    let name = r.roamer.name.clone();
    let record = |outcome: &str, after: Option<String>, inbox_after, error: String| {
        history.record(Op::AgentMove {
            t_ms: history.now_ms(),
            agent: name.clone(),
            from,
            to,
            after,
            outcome: outcome.into(),
            inbox_after,
            error,
        });
    };
    if let Err(e) = r.read(cluster, history).await {
        // Not moved: what it could not read stays there, to be read later.
        let error = format!("{e:#}");
        record("read_failed", r.after.clone(), None, error.clone());
        return Ok(format!(
            "not moved, its inbox at {from} could not be read: {error}"
        ));
    }
    let after = r.after.clone();
    let export = tokio::time::timeout(
        AGENT_CALL_TIMEOUT,
        cluster.client(from).post::<AgentExport>(
            &format!("/v1/agents/{}/export", path_segment(&name)),
            &ExportAgentRequest {
                after: after.clone(),
            },
        ),
    )
    .await;
    let export = match export {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            record("export_failed", after, None, e.to_string());
            return Ok(format!("not moved, the export failed: {e}"));
        }
        Err(_) => {
            let error = format!("no answer within {AGENT_CALL_TIMEOUT:?}");
            record("export_failed", after, None, error.clone());
            return Ok(format!("not moved, the export failed: {error}"));
        }
    };
    if kill == MoveKill::OldBeforeImport {
        cluster.kill(from).await?;
    }
    let import = tokio::time::timeout(
        AGENT_CALL_TIMEOUT,
        cluster.client(to).post::<AgentJson>(
            "/v1/agents/import",
            &ImportAgentRequest { export, uid: None },
        ),
    )
    .await;
    match import {
        Ok(Ok(a)) => {
            record("moved", after, a.inbox_after.clone(), String::new());
            r.roamer.host.store(to, Ordering::Release);
            r.after = a.inbox_after;
            Ok(format!("moved {name} from node {from} to node {to}"))
        }
        Ok(Err(e)) if crate::workload::is_refusal(&e) => {
            // Refused: nothing was imported, it is still at `from`.
            record("import_failed", after, None, e.to_string());
            Ok(format!("not moved, the import was refused: {e}"))
        }
        Ok(Err(e)) => {
            record("import_unknown", after, None, e.to_string());
            anyhow::bail!("the import of {name} on node {to} may or may not have happened: {e}")
        }
        Err(_) => {
            let error = format!("no answer within {AGENT_CALL_TIMEOUT:?}");
            record("import_unknown", after, None, error.clone());
            anyhow::bail!("the import of {name} on node {to} may or may not have happened: {error}")
        }
    }
}

/// How often, and how many times at most, `kill_during_resync` reads the
/// others' queues while waiting for the catch-up to start.
const RESYNC_POLL: Duration = Duration::from_millis(2);
const RESYNC_POLLS_MAX: u32 = 2000;

/// Envelopes the other nodes hold unacknowledged for `node` (a node whose
/// status cannot be read counts 0).
async fn queued_for(cluster: &Cluster, node: usize) -> u64 {
    let id = cluster.node_id(node);
    let mut queued = 0;
    for other in (0..cluster.len()).filter(|o| *o != node) {
        if let Ok(st) = cluster.status(other).await {
            queued += st
                .peers
                .iter()
                .filter(|p| p.node == id)
                .map(|p| p.queued_msgs)
                .sum::<u64>();
        }
    }
    queued
}

/// Packets dropped on every port so far (a port that cannot be read counts 0).
fn dropped_total(net: &Netns) -> u64 {
    (0..net.len()).map(|i| net.dropped(i).unwrap_or(0)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_schedule() {
        assert_eq!(plan(42, 3, 30, true), plan(42, 3, 30, true));
        assert_ne!(plan(42, 3, 30, true), plan(43, 3, 30, true));
    }

    #[test]
    fn every_kind_comes_first_so_short_runs_have_them_all() {
        for seed in 0..50 {
            let p = plan(seed, 3, 7, true);
            let mut kinds: Vec<&str> = p.iter().map(|s| s.fault.kind()).collect();
            kinds.sort_unstable();
            assert_eq!(
                kinds,
                [
                    "isolate",
                    "kill_after_ack",
                    "kill_during_resync",
                    "kill_restart",
                    "loss",
                    "pause",
                    "split"
                ],
                "seed {seed}"
            );
        }
    }

    #[test]
    fn moves_come_between_the_faults_and_leave_them_as_the_seed_made_them() {
        let p = plan(42, 3, 24, true);
        let m = with_moves(p.clone(), 42, 3, 4);
        assert_eq!(m.len(), 30);
        let faults: Vec<Step> = m
            .iter()
            .filter(|s| s.fault.kind() != "move_roamer")
            .cloned()
            .collect();
        assert_eq!(faults, p);
        for (i, s) in m.iter().enumerate() {
            assert_eq!(
                s.fault.kind() == "move_roamer",
                (i + 1) % 5 == 0,
                "step {i}"
            );
            if let Fault::MoveRoamer { to_offset, .. } = s.fault {
                assert!(to_offset < 2);
            }
        }
        assert_eq!(with_moves(p.clone(), 42, 3, 0), p);
        assert_eq!(m, with_moves(p, 42, 3, 4));
    }

    #[test]
    fn without_a_network_only_process_faults_are_drawn() {
        let p = plan(7, 3, 100, false);
        assert!(p.iter().all(|s| !s.fault.needs_network()));
        assert!(p.iter().any(|s| s.fault.kind() == "kill_during_resync"));
    }

    #[test]
    fn faults_name_existing_nodes_and_a_true_minority() {
        for nodes in [2, 3, 5] {
            for s in plan(9, nodes, 200, true) {
                match s.fault {
                    Fault::KillRestart { node, .. }
                    | Fault::Pause { node, .. }
                    | Fault::Isolate { node, .. }
                    | Fault::KillDuringResync { node, .. } => assert!(node < nodes),
                    Fault::KillAfterAck { node, to, .. } => {
                        assert!(node < nodes && to < nodes && node != to)
                    }
                    Fault::Split { minority, .. } => {
                        assert!(!minority.is_empty() && minority.len() * 2 < nodes.max(3));
                        assert!(minority.iter().all(|&n| n < nodes));
                    }
                    Fault::Loss { .. } | Fault::MoveRoamer { .. } => {}
                }
            }
        }
    }
}
