//! A store that goes back in time, with real `mesh daemon` processes: a data
//! dir restored from a backup, and a data dir copied and run twice at once.
//!
//! What must hold: nothing acknowledged is lost and nothing arrives twice;
//! the node whose store went back starts a new epoch before it sends
//! anything more, and both journals say what the world saw that its store
//! lost; two live processes with one key are reported as an identity
//! conflict at both ends, and neither's messages are dropped for the other's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{EventEntry, EventRecord, SendRequest, SendResponse, StatusResponse};
use mesh_cluster::{Cluster, ClusterConfig, NodeProc, NodeSpec, Placement, call, read_journal};

/// How often a condition is looked at.
const POLL: Duration = Duration::from_millis(50);
/// How many looks before a wait fails (about 120 s: debug builds on two busy cores).
const POLLS_MAX: u32 = 2400;

/// Files of a data dir a backup keeps (not the socket).
const DATA_FILES: [&str; 2] = [mesh_api::paths::KEY_FILE, "mesh.redb"];

/// Copies the files of the stopped node's data dir `from` to `to`.
fn copy_data_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot make {}", to.display()))?;
    for f in DATA_FILES {
        std::fs::copy(from.join(f), to.join(f))
            .with_context(|| format!("cannot copy {f} to {}", to.display()))?;
    }
    Ok(())
}

/// Sends `body` to `to` through `client`; the answer's seq and stream epoch.
async fn send(client: &Client, to: &str, body: &str) -> anyhow::Result<(u64, String)> {
    let req = SendRequest {
        to: to.to_owned(),
        body: body.to_owned(),
        encoding: Default::default(),
        msg_kind: 0,
        client_id: None,
    };
    let r: SendResponse = call(client.post("/v1/send", &req)).await?;
    Ok((r.seq, r.stream.epoch))
}

/// Polls `f` until it answers `Some`, at most [`POLLS_MAX`] times.
async fn wait_for<T>(
    what: &str,
    mut f: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    for _ in 0..POLLS_MAX {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        tokio::time::sleep(POLL).await;
    }
    bail!("gave up waiting for {what}")
}

/// Waits until `client`'s node has nothing queued for `peer` (all acknowledged).
async fn wait_acked(client: &Client, peer: &str) -> anyhow::Result<()> {
    wait_for("the peer to acknowledge everything", async || {
        Ok(acked(client, peer).await?.then_some(()))
    })
    .await
}

/// Whether the node behind `client` is connected to `peer` and has nothing
/// queued for it.
async fn acked(client: &Client, peer: &str) -> anyhow::Result<bool> {
    let st: StatusResponse = call(client.get("/v1/status")).await?;
    Ok(st
        .node
        .peers
        .iter()
        .any(|p| p.node == peer && p.connected && p.queued_msgs == 0))
}

/// The bodies of the messages from `author` in `journal`, with their epoch
/// and seq, in journal order.
pub fn messages_from(journal: &[EventEntry], author: &str) -> Vec<(String, String, u64)> {
    journal
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Envelope {
                stream, seq, body, ..
            } if stream.author == author => Some((body.clone(), stream.epoch.clone(), *seq)),
            _ => None,
        })
        .collect()
}

/// The rolled-back records in `journal`: stream epoch, from, to.
pub fn rolled_back(journal: &[EventEntry]) -> Vec<(String, u64, u64)> {
    journal
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::RolledBack {
                stream, from, to, ..
            } => Some((stream.epoch.clone(), *from, *to)),
            _ => None,
        })
        .collect()
}

/// What the restore-from-backup run saw.
#[derive(Debug)]
pub struct RestoreReport {
    /// A's epoch before and after.
    pub epochs: (String, String),
    /// What A answered for new-1..5: (seq, epoch).
    pub new_answers: Vec<(u64, String)>,
    /// B's messages from A: (body, epoch, seq), in journal order.
    pub at_b: Vec<(String, String, u64)>,
    /// B's epoch-ended records: (epoch, last).
    pub b_ended: Vec<(String, u64)>,
    /// Rolled-back records at A and at B.
    pub a_rolled_back: Vec<(String, u64, u64)>,
    /// Same, at B.
    pub b_rolled_back: Vec<(String, u64, u64)>,
}

/// The user's sequence: A sends old-1..5 to B; A's data dir is copied while
/// A is stopped; A sends old-6..10; A's data dir is restored from the copy
/// and A restarted (B is stopped meanwhile, so A's next sends are committed
/// before A hears from B); A sends new-1..5; B comes back.
///
/// # Errors
/// If a daemon does not start or answer, or a wait runs out.
pub async fn restore_from_backup(bin: &Path, out: &Path) -> anyhow::Result<RestoreReport> {
    let mut cfg = ClusterConfig::new(bin, 2);
    cfg.log_dir = Some(out.to_owned());
    let mut c = Cluster::start(cfg).await?;
    c.wait_connected().await?;
    let (a, b) = (c.node_id(0).to_owned(), c.node_id(1).to_owned());
    for i in 1..=5 {
        send(c.client(0), &b, &format!("old-{i}")).await?;
    }
    wait_acked(c.client(0), &b).await?;
    c.stop(0).await?;
    let backup = out.join("backup-a");
    copy_data_dir(c.data_dir(0), &backup)?;
    c.restart(0).await?;
    c.wait_connected().await?;
    for i in 6..=10 {
        send(c.client(0), &b, &format!("old-{i}")).await?;
    }
    wait_acked(c.client(0), &b).await?;
    let before = c.status(0).await?.node.epoch;
    c.stop(0).await?;
    c.stop(1).await?;
    copy_data_dir(&backup, c.data_dir(0))?;
    c.restart(0).await?;
    let mut new_answers = Vec::new();
    for i in 1..=5 {
        new_answers.push(send(c.client(0), &b, &format!("new-{i}")).await?);
    }
    c.restart(1).await?;
    c.wait_connected().await?;
    let client_b = c.client(1).clone();
    let a2 = a.clone();
    wait_for("b to hold new-1..5", async || {
        let j = read_journal(&client_b).await?;
        let got = messages_from(&j, &a2)
            .iter()
            .filter(|(body, ..)| body.starts_with("new-"))
            .count();
        Ok((got >= 5).then_some(()))
    })
    .await?;
    wait_acked(c.client(0), &b).await?;
    let after = c.status(0).await?.node.epoch;
    let ja = c.journal(0).await?;
    let jb = c.journal(1).await?;
    let b_ended = jb
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::EpochEnded { stream, last, .. } if stream.author == a => {
                Some((stream.epoch.clone(), *last))
            }
            _ => None,
        })
        .collect();
    Ok(RestoreReport {
        epochs: (before, after),
        new_answers,
        at_b: messages_from(&jb, &a),
        b_ended,
        a_rolled_back: rolled_back(&ja),
        b_rolled_back: rolled_back(&jb),
    })
}

/// What the cloned-data-dir run saw.
#[derive(Debug)]
pub struct CloneReport {
    /// The identity conflict B shows for A.
    pub b_conflict: Option<String>,
    /// The identity conflict the refused clone shows for B.
    pub refused_conflict: Option<String>,
    /// Every message each clone acknowledged: body to (seq, epoch).
    pub acknowledged: BTreeMap<String, (u64, String)>,
    /// B's messages from A's key: (body, epoch, seq), in journal order.
    pub at_b: Vec<(String, String, u64)>,
}

/// When the two copies of a cloned data dir send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloneSends {
    /// A sends and B acknowledges all of it before the copy starts; then
    /// the copy sends.
    OneAfterTheOther,
    /// Both run at once and send in turn (a-1, clone-1, a-2, ...), before B
    /// has seen the conflict.
    Interleaved,
}

/// A's data dir is copied while A is stopped, and the copy run as a second
/// process beside A (another port); both send to B, as `sends` says. Then
/// the clone B kept connected is stopped, so the refused one gets through.
///
/// # Errors
/// If a daemon does not start or answer, or a wait runs out.
pub async fn clone_run_twice(
    bin: &Path,
    out: &Path,
    sends: CloneSends,
) -> anyhow::Result<CloneReport> {
    let mut cfg = ClusterConfig::new(bin, 2);
    cfg.log_dir = Some(out.to_owned());
    let mut c = Cluster::start(cfg).await?;
    c.wait_connected().await?;
    let (a, b) = (c.node_id(0).to_owned(), c.node_id(1).to_owned());
    let mut acknowledged = BTreeMap::new();
    for i in 1..=3 {
        let body = format!("before-{i}");
        acknowledged.insert(body.clone(), send(c.client(0), &b, &body).await?);
    }
    wait_acked(c.client(0), &b).await?;
    c.stop(0).await?;
    let clone_dir: PathBuf = out.join("clone-a");
    copy_data_dir(c.data_dir(0), &clone_dir)?;
    c.restart(0).await?;
    let mut clone = NodeProc::new(NodeSpec {
        name: "a-clone".into(),
        bin: bin.to_owned(),
        data: clone_dir,
        log: out.join("node-a-clone.log"),
        placement: Placement::default(),
        rust_log: "warn".into(),
    });
    if sends == CloneSends::OneAfterTheOther {
        for i in 1..=3 {
            let body = format!("a-{i}");
            acknowledged.insert(body.clone(), send(c.client(0), &b, &body).await?);
        }
        wait_acked(c.client(0), &b).await?;
        clone.start().await?;
        for i in 1..=3 {
            let body = format!("clone-{i}");
            acknowledged.insert(body.clone(), send(clone.client(), &b, &body).await?);
        }
    } else {
        clone.start().await?;
        for i in 1..=3 {
            let body = format!("a-{i}");
            acknowledged.insert(body.clone(), send(c.client(0), &b, &body).await?);
            let body = format!("clone-{i}");
            acknowledged.insert(body.clone(), send(clone.client(), &b, &body).await?);
        }
    }
    let conflict_of = |st: &StatusResponse, peer: &str| {
        st.node
            .peers
            .iter()
            .find(|p| p.node == peer)
            .and_then(|p| p.identity_conflict.clone())
    };
    let client_b = c.client(1).clone();
    let (a2, b2) = (a.clone(), b.clone());
    let b_conflict = wait_for("b to report the identity conflict", async || {
        let st: StatusResponse = call(client_b.get("/v1/status")).await?;
        Ok(conflict_of(&st, &a2))
    })
    .await?;
    // A copy B refused says so too.
    let (client_a, client_clone) = (c.client(0).clone(), clone.client().clone());
    let refused_conflict = wait_for("the refused clone to report the conflict", async || {
        let sa: StatusResponse = call(client_a.get("/v1/status")).await?;
        let sc: StatusResponse = call(client_clone.get("/v1/status")).await?;
        Ok(conflict_of(&sc, &b2).or(conflict_of(&sa, &b2)))
    })
    .await?;
    // The kept one delivers what it acknowledged (after a fork it found,
    // under its new epoch) before it stops; then the refused one is alone.
    // Which one B keeps is read off the two, not off who shows a conflict:
    // a copy whose conflicting batch got its connection closed shows one
    // too, and may be the one B keeps (the newer instance).
    let kept_is_clone = wait_for("one copy to have everything acknowledged", async || {
        Ok(if acked(&client_clone, &b2).await? {
            Some(true)
        } else if acked(&client_a, &b2).await? {
            Some(false)
        } else {
            None
        })
    })
    .await?;
    let refused = if kept_is_clone {
        clone.stop().await?;
        c.client(0).clone()
    } else {
        c.stop(0).await?;
        clone.client().clone()
    };
    wait_acked(&refused, &b).await?;
    let want = acknowledged.len();
    let a3 = a.clone();
    let at_b = wait_for("b to hold every acknowledged message", async || {
        let j = read_journal(&client_b).await?;
        let got = messages_from(&j, &a3);
        Ok((got.len() >= want).then_some(got))
    })
    .await?;
    clone.stop().await?;
    Ok(CloneReport {
        b_conflict: Some(b_conflict),
        refused_conflict: Some(refused_conflict),
        acknowledged,
        at_b,
    })
}

/// The topic of the topic restore run.
const TOPIC: &str = "restore";

/// What the topic restore-from-backup run saw.
#[derive(Debug)]
pub struct TopicRestoreReport {
    /// A's epoch before and after.
    pub epochs: (String, String),
    /// What A answered for its publish after the restore: (seq, epoch).
    pub new_answer: (u64, String),
    /// B's topic messages from A: (body, epoch, seq), in journal order.
    pub at_b: Vec<(String, String, u64)>,
    /// Rolled-back records of topic streams at A: (epoch, from, to).
    pub a_rolled_back: Vec<(String, u64, u64)>,
    /// Same, at B.
    pub b_rolled_back: Vec<(String, u64, u64)>,
}

/// Publishes `body` to [`TOPIC`] through `client`; the answer's seq and
/// stream epoch.
async fn publish(client: &Client, body: &str) -> anyhow::Result<(u64, String)> {
    let req = mesh_api::PublishRequest {
        body: body.to_owned(),
        encoding: Default::default(),
        msg_kind: 0,
    };
    let path = format!("/v1/topics/{TOPIC}/publish");
    let r: SendResponse = call(client.post(&path, &req)).await?;
    Ok((r.seq, r.stream.epoch))
}

/// The topic messages from `author` in `journal`, as [`messages_from`].
fn topic_messages_from(journal: &[EventEntry], author: &str) -> Vec<(String, String, u64)> {
    let channel = format!("topic:{TOPIC}");
    journal
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Envelope {
                stream, seq, body, ..
            } if stream.author == author && stream.channel == channel => {
                Some((body.clone(), stream.epoch.clone(), *seq))
            }
            _ => None,
        })
        .collect()
}

/// The rolled-back records of [`TOPIC`]'s streams in `journal`, as [`rolled_back`].
fn topic_rolled_back(journal: &[EventEntry]) -> Vec<(String, u64, u64)> {
    let channel = format!("topic:{TOPIC}");
    journal
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::RolledBack {
                stream, from, to, ..
            } if stream.channel == channel => Some((stream.epoch.clone(), *from, *to)),
            _ => None,
        })
        .collect()
}

/// Waits until `client`'s node journals `n` topic messages from `author`.
async fn wait_topic_messages(client: &Client, author: &str, n: usize) -> anyhow::Result<()> {
    wait_for("the member to hold the topic messages", async || {
        let j = read_journal(client).await?;
        Ok((topic_messages_from(&j, author).len() >= n).then_some(()))
    })
    .await
}

/// The sequence of [`restore_from_backup`] for a topic both nodes are
/// members of: A publishes old-1..2, its data dir is copied while it is
/// stopped, it publishes old-3..4, its data dir is restored from the copy
/// and it restarts with B up. Once B's marks have made A start a new
/// epoch, A publishes new-1.
///
/// # Errors
/// If a daemon does not start or answer, or a wait runs out.
pub async fn restore_topic_from_backup(
    bin: &Path,
    out: &Path,
) -> anyhow::Result<TopicRestoreReport> {
    let mut cfg = ClusterConfig::new(bin, 2);
    cfg.log_dir = Some(out.to_owned());
    cfg.daemon_config = Some(format!("[topics]\njoin = [{TOPIC:?}]\n"));
    let mut c = Cluster::start(cfg).await?;
    c.wait_connected().await?;
    let a = c.node_id(0).to_owned();
    for i in 1..=2 {
        publish(c.client(0), &format!("old-{i}")).await?;
    }
    wait_topic_messages(c.client(1), &a, 2).await?;
    c.stop(0).await?;
    let backup = out.join("backup-a");
    copy_data_dir(c.data_dir(0), &backup)?;
    c.restart(0).await?;
    c.wait_connected().await?;
    for i in 3..=4 {
        publish(c.client(0), &format!("old-{i}")).await?;
    }
    wait_topic_messages(c.client(1), &a, 4).await?;
    let before = c.status(0).await?.node.epoch;
    c.stop(0).await?;
    copy_data_dir(&backup, c.data_dir(0))?;
    c.restart(0).await?;
    c.wait_connected().await?;
    let client_a = c.client(0).clone();
    let after = wait_for("a to start a new epoch", async || {
        let st: StatusResponse = call(client_a.get("/v1/status")).await?;
        let epoch = st.node.epoch;
        Ok((epoch != before).then_some(epoch))
    })
    .await?;
    let new_answer = publish(c.client(0), "new-1").await?;
    wait_topic_messages(c.client(1), &a, 5).await?;
    let client_b = c.client(1).clone();
    wait_for("both journals to say what was lost", async || {
        let ja = read_journal(&client_a).await?;
        let jb = read_journal(&client_b).await?;
        let both = !topic_rolled_back(&ja).is_empty() && !topic_rolled_back(&jb).is_empty();
        Ok(both.then_some(()))
    })
    .await?;
    let ja = c.journal(0).await?;
    let jb = c.journal(1).await?;
    Ok(TopicRestoreReport {
        epochs: (before, after),
        new_answer,
        at_b: topic_messages_from(&jb, &a),
        a_rolled_back: topic_rolled_back(&ja),
        b_rolled_back: topic_rolled_back(&jb),
    })
}
