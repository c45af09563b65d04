//! The agent routes: adding, listing and removing agents (the node's
//! socket), and what an agent does as itself (its socket): send, reply,
//! read and wait on its inbox, keep named cursors; where a message is and
//! the thread it is part of.
//!
//! An agent's inbox is an index of the journal written in the commits that
//! journal its entries (messages to it, bounces and losses of its messages, lag
//! records of its subscriptions), so a page reads only the agent's entries
//! and a cursor is an ordinary journal cursor. A wait (`wait=SECS`) returns
//! as soon as an entry commits: it wakes on the journal head, never on a
//! timer.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use mesh_api::{
    AGENT_EXPORT_FORMAT, AddAgentRequest, AgentExport, AgentJson, AgentMoveJson, AgentsResponse,
    ExportAgentRequest, ImportAgentRequest,
};
use mesh_protocol::{AgentCard, AgentMove, AgentName, MAX_AGENT_CARDS, NodeId, SecretKey};
use mesh_store::{AgentRecord, MeshStore};

use super::agent_socket::Acting;
use super::error::node_error;
use super::routes::{read_json, read_store};
use super::{
    ApiError, ApiState, Bug, CallerError, Capacity, NotFound, PeerCred, REQUEST_BYTES_MAX,
};
use crate::agents::now_ms;
use crate::bus::LocalWrite;

mod inbox;
mod moving;
mod send;
mod status;
mod thread;

pub use inbox::{INBOX_SCAN_ROWS_MAX, INBOX_WAIT_SECS_MAX};
pub use status::LOSS_SCAN_ENTRIES_MAX;
pub use thread::{
    THREAD_ANCESTORS_MAX, THREAD_BODY_BYTES_MAX, THREAD_ENTRIES_MAX, THREAD_SCAN_ROWS_MAX,
};

pub(super) use inbox::{ack, get_cursor, inbox, put_cursor};
pub(crate) use moving::serve_moves;
pub(super) use moving::{decode_answer, decode_offer, move_agent};
pub(super) use send::{check_client_id, reply, send, send_batch};
pub(super) use status::message;
pub(super) use thread::thread;

/// An agent's name from a path, checked.
fn agent_name(text: &str) -> Result<AgentName, ApiError> {
    AgentName::new(text).map_err(|e| CallerError::BadValue(e.to_string()).into())
}

impl ApiState {
    /// The agent a send of `name` acts as: only through `name`'s own
    /// socket, by `name` itself ([`Acting`], set by its socket's check).
    fn sender(&self, acting: Option<Extension<Acting>>, name: &str) -> Result<AgentName, ApiError> {
        let name = agent_name(name)?;
        if let Some(to) = self.inner.registry.get(&name).and_then(|a| a.moved_to()) {
            return Err(CallerError::AgentMoved(format!(
                "agent {name} moved to node {to}: it acts there now, not here"
            ))
            .into());
        }
        match acting {
            Some(Extension(Acting(a))) if a == name => Ok(name),
            _ => {
                self.inner
                    .counters
                    .refused_agent
                    .fetch_add(1, Ordering::Relaxed);
                Err(CallerError::UnverifiedSender(format!(
                    "agent {name} sends only through its own socket, {}",
                    self.agent_socket_path(&name).display()
                ))
                .into())
            }
        }
    }

    /// The agent whose inbox or cursors `name` names: on its socket, itself
    /// (checked there); on the node's socket, any agent of the node.
    fn reader(&self, name: &str) -> Result<AgentName, ApiError> {
        let name = agent_name(name)?;
        if self.inner.registry.get(&name).is_none() {
            return Err(NotFound::UnknownAgent(name.to_string()).into());
        }
        Ok(name)
    }

    /// `NAME@NODE_ID`.
    fn address(agent: &AgentName, node: &NodeId) -> String {
        format!("{agent}@{node}")
    }
}

/// `POST /v1/agents`: adds an agent, makes its key and serves its socket.
pub(super) async fn add_agent(
    State(st): State<ApiState>,
    cred: Option<Extension<PeerCred>>,
    req: Request,
) -> Result<Json<AgentJson>, ApiError> {
    let body: AddAgentRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let name = agent_name(&body.name)?;
    let daemon_uid = st.inner.daemon_uid;
    let uid = body
        .uid
        .or(cred.and_then(|c| c.0.uid))
        .unwrap_or(daemon_uid);
    let registry = st.inner.registry.clone();
    if registry.get(&name).is_some() {
        return Err(CallerError::AgentExists(name.to_string()).into());
    }
    if registry.len() >= MAX_AGENT_CARDS {
        return Err(Capacity::TooManyAgents(format!(
            "this node hosts {MAX_AGENT_CARDS} agents, as many as it may; remove one first"
        ))
        .into());
    }
    if uid != daemon_uid && uid != 0 && st.inner.agent_sockets_private {
        return Err(CallerError::BadValue(format!(
            "uid {uid} could not reach agent {name}'s socket: it would be in {}, inside the \
             data dir, which only uid {daemon_uid} may enter; set [agents] socket_dir in \
             config.toml to a dir uid {uid} may enter (e.g. /run/agent-mesh) and restart",
            st.inner.agent_socket_dir.display()
        ))
        .into());
    }
    let key = {
        let registry = registry.clone();
        let name = name.clone();
        // A new agent gets a new key: a key file left by an agent of this
        // name that is gone (a crash after its drain ended) is not reused.
        tokio::task::spawn_blocking(move || {
            registry.forget_key(&name);
            registry.key(&name)
        })
        .await
        .map_err(|e| Bug::new(format!("key task failed: {e}")))?
        .map_err(|e| super::Unavailable::Store(e.to_string()))?
    };
    let record = AgentRecord {
        name: name.clone(),
        key: key.public(),
        uid,
        created_ms: now_ms(),
    };
    st.inner
        .bus
        .local_write(LocalWrite::PutAgent(record.clone()))
        .await
        .map_err(node_error)?;
    let agent = registry.insert(record, key);
    let socket = st
        .start_agent_server(&agent)
        .await
        .map_err(|e| super::Unavailable::Node(e.to_string()))?;
    crate::agents::announce(&registry, &st.inner.bus, true).await;
    tracing::info!(agent = %name, uid, socket = %socket.display(), "agent added");
    Ok(Json(st.hosted_json(&agent.record, None)))
}

impl ApiState {
    /// How an agent this node hosts now is shown right after a change (not
    /// online yet): its address, key, uid and socket, and `inbox_after`.
    pub(super) fn hosted_json(
        &self,
        record: &AgentRecord,
        inbox_after: Option<String>,
    ) -> AgentJson {
        let me = self.inner.node;
        AgentJson {
            address: ApiState::address(&record.name, &me),
            name: record.name.to_string(),
            node: me.to_string(),
            node_alias: None,
            key: Some(record.key.to_string()),
            online: false,
            uid: Some(record.uid),
            socket: Some(self.agent_socket_path(&record.name).display().to_string()),
            moved_to: None,
            inbox_after,
            unread: None,
        }
    }
}

/// `POST /v1/agents/{name}/export`: the agent's key and last move, for
/// `mesh agent import` on its new host. The agent goes on acting here
/// until its new host's move notice arrives; from then on it does not, and
/// what came for it since the export is passed on to its new host.
pub(super) async fn export_agent(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<AgentExport>, ApiError> {
    let body: ExportAgentRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let name = st.reader(&name)?;
    export(&st, &name, body.after.as_deref()).await.map(Json)
}

/// Exports the agent `name` (as `POST /v1/agents/{name}/export`): sets
/// its export cursor to `after` and returns its export. By default that is
/// the agent's read position if it ever acknowledged an entry (its unread
/// mail goes with it, unread at its new host, as issue 31's read position
/// travels), else the last inbox entry this node handed to it (what it
/// never saw here is passed on).
async fn export(
    st: &ApiState,
    name: &AgentName,
    after: Option<&str>,
) -> Result<AgentExport, ApiError> {
    let head = *st.inner.bus.journal_head().borrow();
    let after = match after {
        Some(text) => st.parse_after(Some(text))?,
        None => match st.read_position(name).await? {
            0 => st.served_cursor(name).await?,
            read => read,
        },
    }
    .min(head);
    let agent = st
        .inner
        .registry
        .get(name)
        .ok_or_else(|| NotFound::UnknownAgent(name.to_string()))?;
    if let Some(to) = agent.moved_to() {
        return Err(CallerError::AgentMoved(format!(
            "agent {name} moved to node {to} already; export it there"
        ))
        .into());
    }
    let status = st.inner.bus.status().await.map_err(node_error)?;
    let version = status
        .moves
        .iter()
        .find(|m| m.key == agent.record.key)
        .map_or(0, |m| m.version);
    // What comes for it from here on is passed on to its new host once
    // this node learns of the move (`crate::drain`).
    st.put_agent_cursor(name, crate::drain::EXPORT_CURSOR, after)
        .await?;
    tracing::info!(agent = %name, version, after, "agent exported");
    Ok(AgentExport {
        format: AGENT_EXPORT_FORMAT.to_owned(),
        name: name.to_string(),
        key: agent.record.key.to_string(),
        secret_key: data_encoding::HEXLOWER.encode(&agent.secret().to_bytes()),
        from: st.inner.node.to_string(),
        version,
    })
}

impl ApiState {
    /// Sets `agent`'s named cursor `cursor` to `arrival`, committed.
    async fn put_agent_cursor(
        &self,
        agent: &AgentName,
        cursor: &str,
        arrival: mesh_store::Arrival,
    ) -> Result<(), ApiError> {
        self.inner
            .bus
            .local_write(LocalWrite::PutAgentCursor {
                agent: agent.clone(),
                name: cursor.to_owned(),
                arrival,
            })
            .await
            .map_err(node_error)?;
        Ok(())
    }
}

/// The secret key of an export, checked against the public key it names.
pub(crate) fn export_secret(export: &AgentExport) -> Result<SecretKey, ApiError> {
    let bad = |why: String| -> ApiError { CallerError::BadValue(why).into() };
    if export.format != AGENT_EXPORT_FORMAT {
        return Err(bad(format!(
            "not an agent export of this version: format {:?}, this node reads {AGENT_EXPORT_FORMAT:?}",
            export.format
        )));
    }
    let bytes = data_encoding::HEXLOWER_PERMISSIVE
        .decode(export.secret_key.trim().as_bytes())
        .map_err(|e| bad(format!("the export's secret_key is not hex: {e}")))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| bad("the export's secret_key is not 32 bytes".to_owned()))?;
    let secret = SecretKey::from_bytes(&bytes);
    if secret.public().to_string() != export.key.trim() {
        return Err(bad(
            "the export's secret_key is not the key it names: the file is damaged".to_owned(),
        ));
    }
    Ok(secret)
}

/// `POST /v1/agents/import`: hosts an exported agent here with its key,
/// and announces its move notice (the export's version and one).
pub(super) async fn import_agent(
    State(st): State<ApiState>,
    cred: Option<Extension<PeerCred>>,
    req: Request,
) -> Result<Json<AgentJson>, ApiError> {
    let body: ImportAgentRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let uid = body
        .uid
        .or(cred.and_then(|c| c.0.uid))
        .unwrap_or(st.inner.daemon_uid);
    import(&st, body.export, uid).await.map(|(a, _)| Json(a))
}

/// Imports `export` (as `POST /v1/agents/import`, and an offer on the move
/// link), for processes of `uid`: the agent as hosted here, and the
/// version of the move notice signed for it.
async fn import(
    st: &ApiState,
    export: AgentExport,
    uid: u32,
) -> Result<(AgentJson, u64), ApiError> {
    let name = agent_name(&export.name)?;
    let secret = export_secret(&export)?;
    let from: NodeId = mesh_protocol::parse_node_id(export.from.trim())
        .map_err(|e| CallerError::BadValue(format!("the export's from: {e}")))?;
    let me = st.inner.node;
    if from == me {
        return Err(CallerError::BadValue(format!(
            "agent {name} was exported from this node: import it on its new host"
        ))
        .into());
    }
    let registry = st.inner.registry.clone();
    // An import cut short (the agent written, its notice not) is finished
    // by importing the same file again.
    let resumed = registry.get(&name);
    match &resumed {
        Some(a) if a.record.key != secret.public() => {
            return Err(CallerError::AgentExists(name.to_string()).into());
        }
        None if registry.len() >= MAX_AGENT_CARDS => {
            return Err(Capacity::TooManyAgents(format!(
                "this node hosts {MAX_AGENT_CARDS} agents, as many as it may; remove one first"
            ))
            .into());
        }
        _ => {}
    }
    let status = st.inner.bus.status().await.map_err(node_error)?;
    let held = status.moves.iter().find(|m| m.key == secret.public());
    if resumed.is_some() && held.is_some_and(|m| m.node == me) {
        return Err(CallerError::AgentExists(format!("{name} (imported here already)")).into());
    }
    // A move this node already knows of that is newer than the export's.
    let Some(version) = held
        .map_or(0, |m| m.version)
        .max(export.version)
        .checked_add(1)
    else {
        return Err(CallerError::BadValue(format!(
            "the export says version {}: no move can follow it",
            export.version
        ))
        .into());
    };
    {
        let registry = registry.clone();
        let (name, secret) = (name.clone(), secret.clone());
        tokio::task::spawn_blocking(move || registry.import_key(&name, &secret))
            .await
            .map_err(|e| Bug::new(format!("key task failed: {e}")))?
            .map_err(|e| super::Unavailable::Store(e.to_string()))?;
    }
    let record = match &resumed {
        Some(a) => a.record.clone(),
        None => AgentRecord {
            name: name.clone(),
            key: secret.public(),
            uid,
            created_ms: now_ms(),
        },
    };
    if resumed.is_none() {
        st.inner
            .bus
            .local_write(LocalWrite::PutAgent(record.clone()))
            .await
            .map_err(node_error)?;
    }
    // Back on a node it had left: what came here while it was away, up to
    // where that was passed on, it read there.
    let inbox_after = match &resumed {
        Some(_) => {
            let n = name.clone();
            read_store(&st.inner.store, move |s| {
                s.agent_cursor(&n, crate::drain::EXPORT_CURSOR)
            })
            .await?
        }
        None => None,
    };
    if let Some(after) = inbox_after {
        // What comes back to it from the host it left, journaled here at
        // or before that, goes in its inbox again (mesh_store::RESUMED_CURSOR).
        st.put_agent_cursor(&name, mesh_store::RESUMED_CURSOR, after)
            .await?;
        // What was passed on from here it saw (or will see) at the host it
        // left: a move from here without `--after` starts past it.
        st.put_served(&name, after).await?;
    }
    // Should this move lose a race, what comes for the agent here from now
    // on is passed on to the winner (`crate::drain`).
    let head = *st.inner.bus.journal_head().borrow();
    st.put_agent_cursor(&name, crate::drain::EXPORT_CURSOR, head)
        .await?;
    let notice = AgentMove::sign(&secret, name.clone(), (from, me), version, now_ms());
    st.inner
        .bus
        .local_write(LocalWrite::PutMove(notice))
        .await
        .map_err(node_error)?;
    let agent = match resumed {
        Some(a) => a,
        None => {
            let agent = registry.insert(record, secret);
            st.start_agent_server(&agent)
                .await
                .map_err(|e| super::Unavailable::Node(e.to_string()))?;
            agent
        }
    };
    crate::agents::announce(&registry, &st.inner.bus, true).await;
    tracing::info!(agent = %name, from = %from.fmt_short(), version, "agent imported");
    let inbox_after = inbox_after.map(|a| st.cursor_text(a));
    Ok((st.hosted_json(&agent.record, inbox_after), version))
}

fn move_json(m: &AgentMove) -> AgentMoveJson {
    AgentMoveJson {
        name: m.name.to_string(),
        address: ApiState::address(&m.name, &m.node),
        key: m.key.to_string(),
        from: m.from.to_string(),
        node: m.node.to_string(),
        version: m.version,
        issued_ms: m.issued_ms,
    }
}

/// `DELETE /v1/agents/{name}`: stops its socket, removes it (its inbox
/// index, its cursors and its key; its journal entries stay).
pub(super) async fn remove_agent(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    q: Result<Query<RemoveQuery>, QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let name = st.reader(&name)?;
    let force = super::routes::query(q)?.force.unwrap_or(false);
    if !force {
        // Nothing it never saw goes with it unsaid.
        let served = st.served_cursor(&name).await?;
        // The inbox reader's own bounds: entries, and bytes of bodies.
        let (unread, _) = st.read_inbox(&name, served, UNREAD_SHOWN_MAX, None).await?;
        if let Some(last) = unread.last() {
            // Fewer than asked for may be the byte bound: look one further.
            let more = unread.len() >= UNREAD_SHOWN_MAX
                || !st
                    .read_inbox(&name, last.item.arrival, 1, None)
                    .await?
                    .0
                    .is_empty();
            let count = match (unread.len(), more) {
                (n, true) => format!("{n} or more inbox entries"),
                (1, false) => "1 inbox entry".to_owned(),
                (n, false) => format!("{n} inbox entries"),
            };
            return Err(CallerError::UnreadEntries(format!(
                "agent {name} has {count} this node never handed to it (an inbox read or \
                 its subscription); read them, move the agent (`mesh agent move`), or \
                 remove it with --force (they stay in the node's journal)"
            ))
            .into());
        }
    }
    st.inner
        .bus
        .local_write(LocalWrite::RemoveAgent(name.clone()))
        .await
        .map_err(node_error)?;
    let registry = st.inner.registry.clone();
    // Its waits and subscriptions end, then its socket goes.
    registry.remove(&name);
    st.stop_agent_server(&name).await;
    let n = name.clone();
    let _ = tokio::task::spawn_blocking(move || registry.forget_key(&n)).await;
    tracing::info!(agent = %name, "agent removed");
    Ok(Json(serde_json::json!({ "removed": name.to_string() })))
}

/// `DELETE /v1/agents/{name}?force=` query.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RemoveQuery {
    /// Remove it even if it has inbox entries it was never handed.
    force: Option<bool>,
}

/// The most unread entries a refused removal counts (and reads: at most
/// [`crate::api::EVENTS_PAGE_BYTES_MAX`] of their bodies).
const UNREAD_SHOWN_MAX: usize = 100;

fn card_json(card: &AgentCard, alias: Option<String>) -> AgentJson {
    AgentJson {
        name: card.name.to_string(),
        address: ApiState::address(&card.name, &card.node),
        node: card.node.to_string(),
        node_alias: alias,
        key: Some(card.key.to_string()),
        online: card.online,
        uid: None,
        socket: None,
        moved_to: None,
        inbox_after: None,
        unread: None,
    }
}

/// `GET /v1/agents`: this node's agents and those its peers announced.
pub(super) async fn list_agents(
    State(st): State<ApiState>,
) -> Result<Json<AgentsResponse>, ApiError> {
    let status = st.inner.bus.status().await.map_err(node_error)?;
    let mut unread = HashMap::new();
    for a in st.inner.registry.all().iter() {
        let name = &a.record.name;
        unread.insert(name.to_string(), st.unread(name).await?);
    }
    Ok(Json(st.agents_of(&status, &unread)))
}

impl ApiState {
    /// This node's agents (each with its unread mail as `unread` has it, by
    /// name) and those its peers announced, as `status` has them.
    pub(super) fn agents_of(
        &self,
        status: &crate::bus::NodeStatus,
        unread: &HashMap<String, mesh_api::Unread>,
    ) -> AgentsResponse {
        let mut local = Vec::new();
        for a in self.inner.registry.all().iter() {
            let name = &a.record.name;
            let online = status
                .agents
                .iter()
                .find(|c| &c.name == name)
                .is_some_and(|c| c.online);
            local.push(AgentJson {
                name: name.to_string(),
                address: ApiState::address(name, &self.inner.node),
                node: self.inner.node.to_string(),
                node_alias: None,
                key: Some(a.record.key.to_string()),
                online,
                uid: Some(a.record.uid),
                socket: Some(self.agent_socket_path(name).display().to_string()),
                moved_to: status
                    .moves
                    .iter()
                    .find(|m| m.key == a.record.key && m.node != self.inner.node)
                    .map(|m| m.node.to_string()),
                inbox_after: None,
                unread: unread.get(name.as_str()).copied(),
            });
        }
        let peers = status
            .peers
            .iter()
            .flat_map(|p| {
                let alias = self.alias_of(&p.node);
                p.agents
                    .iter()
                    .map(move |c| card_json(c, alias.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let moves = status.moves.iter().map(move_json).collect();
        AgentsResponse {
            local,
            peers,
            moves,
        }
    }
}
