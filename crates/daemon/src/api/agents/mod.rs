//! The agent routes: adding, listing and removing agents (the node's
//! socket), and what an agent does as itself (its socket): send, reply,
//! read and wait on its inbox, keep named cursors; where a message is.
//!
//! An agent's inbox is an index of the journal written in the commits that
//! journal its entries (messages to it, bounces and losses of its messages, lag
//! records of its subscriptions), so a page reads only the agent's entries
//! and a cursor is an ordinary journal cursor. A wait (`wait=SECS`) returns
//! as soon as an entry commits: it wakes on the journal head, never on a
//! timer.

use std::sync::atomic::Ordering;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, Request, State};
use mesh_api::{AddAgentRequest, AgentJson, AgentsResponse};
use mesh_protocol::{AgentCard, AgentName, MAX_AGENT_CARDS, NodeId};
use mesh_store::AgentRecord;

use super::agent_socket::Acting;
use super::error::node_error;
use super::routes::read_json;
use super::{
    ApiError, ApiState, Bug, CallerError, Capacity, NotFound, PeerCred, REQUEST_BYTES_MAX,
};
use crate::agents::now_ms;
use crate::bus::LocalWrite;

mod inbox;
mod send;
mod status;

pub use inbox::{INBOX_SCAN_ROWS_MAX, INBOX_WAIT_SECS_MAX};
pub use status::LOSS_SCAN_ENTRIES_MAX;

pub(super) use inbox::{get_cursor, inbox, put_cursor};
pub(super) use send::{check_client_id, reply, send, send_batch};
pub(super) use status::message;

/// An agent's name from a path, checked.
fn agent_name(text: &str) -> Result<AgentName, ApiError> {
    AgentName::new(text).map_err(|e| CallerError::BadValue(e.to_string()).into())
}

impl ApiState {
    /// The agent a send of `name` acts as: only through `name`'s own
    /// socket, by `name` itself ([`Acting`], set by its socket's check).
    fn sender(&self, acting: Option<Extension<Acting>>, name: &str) -> Result<AgentName, ApiError> {
        let name = agent_name(name)?;
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
        tokio::task::spawn_blocking(move || registry.key(&name))
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
    Ok(Json(AgentJson {
        address: ApiState::address(&name, &st.inner.node),
        name: name.to_string(),
        node: st.inner.node.to_string(),
        node_alias: None,
        key: Some(agent.record.key.to_string()),
        online: false,
        uid: Some(uid),
        socket: Some(socket.display().to_string()),
    }))
}

/// `DELETE /v1/agents/{name}`: stops its socket, removes it (its inbox
/// index, its cursors and its key; its journal entries stay).
pub(super) async fn remove_agent(
    State(st): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let name = st.reader(&name)?;
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
    }
}

/// `GET /v1/agents`: this node's agents and those its peers announced.
pub(super) async fn list_agents(
    State(st): State<ApiState>,
) -> Result<Json<AgentsResponse>, ApiError> {
    let status = st.inner.bus.status().await.map_err(node_error)?;
    let local = st
        .inner
        .registry
        .all()
        .iter()
        .map(|a| {
            let name = &a.record.name;
            let online = status
                .agents
                .iter()
                .find(|c| &c.name == name)
                .is_some_and(|c| c.online);
            AgentJson {
                name: name.to_string(),
                address: ApiState::address(name, &st.inner.node),
                node: st.inner.node.to_string(),
                node_alias: None,
                key: Some(a.record.key.to_string()),
                online,
                uid: Some(a.record.uid),
                socket: Some(st.agent_socket_path(name).display().to_string()),
            }
        })
        .collect();
    let peers = status
        .peers
        .iter()
        .flat_map(|p| {
            let alias = st.alias_of(&p.node);
            p.agents
                .iter()
                .map(move |c| card_json(c, alias.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(Json(AgentsResponse { local, peers }))
}
