//! Supersede through a store outage: two keyed agent messages held while
//! the disk is full; once it has room, the older is committed as the
//! tombstone of itself (its sender answered `superseded_by` the newer one)
//! and the newer as itself, and the recipient's inbox shows both.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{
    AddAgentRequest, AgentJson, AgentSendRequest, AgentSendResponse, InboxPage, SendRequest,
};
use serde::Serialize;

use super::{HELD_AFTER, HOLD_MS, PHASE_TIMEOUT, start_on_tmpfs};

/// What the run saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SupersedeReport {
    /// The older keyed send's answer: its id and what superseded it.
    pub old: Option<(String, Option<String>)>,
    /// The newer one's id.
    pub new: Option<String>,
    /// The recipient's inbox: (kind, id, superseded_by, body) of each entry.
    pub inbox: Vec<(String, Option<String>, Option<String>, String)>,
    /// `mesh message` of the older one at its sender: its state.
    pub sender_state: Option<String>,
}

impl SupersedeReport {
    /// Whether the older was answered superseded by the newer, and the
    /// recipient got its tombstone, then the newer, and nothing else.
    pub fn passed(&self) -> bool {
        let (Some((old, Some(by))), Some(new)) = (&self.old, &self.new) else {
            return false;
        };
        let want = [
            ("superseded", Some(old), Some(new)),
            ("message", Some(new), None),
        ];
        by == new
            && self.sender_state.as_deref() == Some("superseded")
            && self.inbox.len() == want.len()
            && self
                .inbox
                .iter()
                .zip(want)
                .all(|((k, id, by, _), w)| k == w.0 && id.as_ref() == w.1 && by.as_ref() == w.2)
            && self.inbox[1].3 == "idle"
    }
}

/// Runs the scenario with `bin`, writing the daemons' logs to `out_dir`.
///
/// # Errors
/// If it cannot be set up (no root, no mount, a daemon does not start) or a
/// step does not happen in time.
pub fn run_blocking(bin: &Path, out_dir: &Path) -> anyhow::Result<SupersedeReport> {
    super::block_on(run(bin, out_dir))
}

async fn add_agent(api: &Client, name: &str) -> anyhow::Result<Client> {
    let req = AddAgentRequest {
        name: name.to_owned(),
        uid: None,
    };
    let agent: AgentJson = api.post("/v1/agents", &req).await?;
    let socket = agent.socket.context("an agent of this node has a socket")?;
    Ok(Client::new(socket))
}

fn keyed(to: &str, body: &str) -> AgentSendRequest {
    AgentSendRequest {
        to: to.to_owned(),
        body: body.to_owned(),
        encoding: Default::default(),
        in_reply_to: None,
        client_id: None,
        key: Some("status".to_owned()),
        receipt: false,
    }
}

/// The sample `name` of `api`'s `/metrics`.
async fn metric(api: &Client, name: &str) -> anyhow::Result<u64> {
    let text = api.get_text("/metrics").await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
}

/// Waits until `api`'s count of held sends (and publishes) passes `above`.
pub(super) async fn held_past(api: &Client, above: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    while metric(api, "mesh_sends_held_total").await? <= above {
        if started.elapsed() > PHASE_TIMEOUT {
            bail!("no send was held again within {PHASE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn run(bin: &Path, out_dir: &Path) -> anyhow::Result<SupersedeReport> {
    std::fs::create_dir_all(out_dir)?;
    let (tmpfs, cluster) = start_on_tmpfs(bin, out_dir, HOLD_MS * 10).await?;
    let (api, to) = (cluster.client(0).clone(), cluster.node_id(1).to_owned());
    let alice = add_agent(&api, "alice").await?;
    let bob = add_agent(cluster.client(1), "bob").await?;
    let mut report = SupersedeReport::default();

    // Fill the disk, and probe with plain sends until one is held.
    tmpfs.fill()?;
    let mut probe = None;
    for i in 0..super::PROBES_MAX {
        let req = SendRequest {
            to: to.clone(),
            body: format!("probe {i}"),
            encoding: Default::default(),
            msg_kind: 0,
            client_id: None,
        };
        let api = api.clone();
        let mut task =
            tokio::spawn(async move { api.post::<mesh_api::SendResponse>("/v1/send", &req).await });
        tokio::select! {
            done = &mut task => { done.context("a probe failed")??; }
            () = tokio::time::sleep(HELD_AFTER) => { probe = Some(task); break; }
        }
    }
    let probe = probe.context("no send was held on a full disk")?;
    let held = metric(&api, "mesh_sends_held_total").await?;
    let path = "/v1/agents/alice/send";
    let (a1, a2) = (alice.clone(), alice.clone());
    let old_req = keyed(&format!("bob@{to}"), "busy");
    let old = tokio::spawn(async move { a1.post::<AgentSendResponse>(path, &old_req).await });
    // The older is held (tried and failed once) before the newer comes.
    held_past(&api, held).await?;
    let new_req = keyed(&format!("bob@{to}"), "idle");
    let new = tokio::spawn(async move { a2.post::<AgentSendResponse>(path, &new_req).await });
    tmpfs.unfill()?;
    probe.await.context("the probe failed")??;
    let old = old.await.context("the older send failed")??;
    let new = new.await.context("the newer send failed")??;
    report.old = Some((old.id.clone(), old.superseded_by.clone()));
    report.new = Some(new.id.clone());
    let st: mesh_api::MessageStatus = alice.get(&format!("/v1/messages/{}", old.id)).await?;
    report.sender_state = Some(st.state);

    let started = Instant::now();
    loop {
        let page: InboxPage = bob.get("/v1/agents/bob/inbox?wait=5").await?;
        report.inbox = page
            .entries
            .into_iter()
            .map(|e| (e.kind, e.id, e.superseded_by, e.body))
            .collect();
        if report.inbox.len() >= 2 || started.elapsed() > PHASE_TIMEOUT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(cluster);
    std::fs::write(
        out_dir.join("supersede.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(report)
}
