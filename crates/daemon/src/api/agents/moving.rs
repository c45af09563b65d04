//! Moving an agent to a peer over the mesh: `POST /v1/agents/{name}/move`
//! on the old host exports the agent and offers the export to the peer on
//! the move link; the peer imports it through the same code as `POST
//! /v1/agents/import` and answers. QUIC's TLS 1.3 to the peer's node key
//! is what keeps the key secret on the way.
//!
//! Until the peer answers `imported`, the agent stays here and goes on
//! acting here (nothing but its export cursor has changed, as after
//! `mesh agent export`). An answer lost after the import is safe to retry:
//! the peer answers an export it imported already as imported again, and
//! once this node has the peer's notice it refuses a second move as
//! `agent_moved`.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Request, State};
use mesh_api::{
    AgentExport, AgentJson, ErrorCode, ErrorDetail, Fault, MoveAgentRequest, MoveAgentResponse,
    MoveAnswer,
};
use mesh_protocol::{MOVE_MESSAGE_BYTES_MAX, NodeId};
use tokio::task::JoinSet;

use super::super::routes::{parse_json, read_json};
use super::super::{ApiError, ApiState, Bug, CallerError, NotFound, REQUEST_BYTES_MAX, Refused};
use super::super::{Capacity, Unavailable};
use super::agent_name;
use crate::bus::{MoveError, MoveOffer, MoveOffers};

/// What a move that failed before the peer imported the agent adds.
const STAYS: &str = "the agent stays here";

/// How long a move waits, once the peer answered, for this node to hold the
/// peer's notice (so that it no longer acts as the agent when the move
/// returns); the move succeeded either way.
const NOTICE_WAIT: Duration = Duration::from_secs(10);

/// `POST /v1/agents/{name}/move`: exports the agent and hands it to the
/// peer `to` over the move link; answers once the peer imported it.
pub(in crate::api) async fn move_agent(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<MoveAgentResponse>, ApiError> {
    let body: MoveAgentRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let name = st.reader(&name)?;
    let to = st.resolve_node(&body.to).map_err(|e| e.with_note(STAYS))?;
    let me = st.inner.node;
    if to == me {
        return Err(CallerError::BadValue(format!(
            "agent {name} is hosted on this node already; move it to a peer"
        ))
        .into());
    }
    // Refused before the export: a move that cannot be made changes nothing.
    let status = st
        .inner
        .bus
        .status()
        .await
        .map_err(super::super::error::node_error)?;
    match status.peers.iter().find(|p| p.node == to) {
        None => return Err(ApiError::from(NotFound::UnknownPeer(to)).with_note(STAYS)),
        Some(p) if p.paused => return Err(move_error(MoveError::Paused(to))),
        Some(_) => {}
    }
    let export = super::export(&st, &name, body.after.as_deref()).await?;
    let key = export.key.clone();
    let bytes = serde_json::to_vec(&export)
        .map_err(|e| Bug::new(format!("an export does not encode: {e}")))?;
    drop(export);
    tracing::info!(agent = %name, to = %to.fmt_short(), "moving an agent to a peer");
    let answer = st
        .inner
        .bus
        .offer_move(to, bytes)
        .await
        .map_err(move_error)?;
    let answer = decode_answer(&answer).map_err(|why| {
        ApiError::from(Unavailable::Peer(format!(
            "node {to} answered the move with something that is not an answer ({why}); \
             whether it imported agent {name} is not known: `mesh agents` shows it, and \
             moving it again is safe"
        )))
    })?;
    match answer {
        MoveAnswer::Imported {
            agent,
            version,
            already,
        } => {
            st.await_notice(&key, to, version).await;
            tracing::info!(agent = %name, to = %to.fmt_short(), version, already, "agent moved to a peer");
            Ok(Json(MoveAgentResponse {
                agent,
                version,
                already,
            }))
        }
        MoveAnswer::Refused { error } => Err(refused(to, &name.to_string(), error)),
    }
}

impl ApiState {
    /// Waits (at most [`NOTICE_WAIT`]) until this node holds a notice
    /// placing the agent of `key` on `to` at `version` or later, and marks
    /// the agent moved.
    async fn await_notice(&self, key: &str, to: NodeId, version: u64) {
        let mut moves = self.inner.bus.agent_moves();
        let placed = |m: &mesh_protocol::AgentMove| {
            m.key.to_string() == key && m.node == to && m.version >= version
        };
        let held = tokio::time::timeout(NOTICE_WAIT, moves.wait_for(|all| all.iter().any(placed)))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|all| all.clone());
        match held {
            Some(all) => crate::agents::note_moves(&self.inner.registry, &all),
            None => tracing::warn!(
                to = %to.fmt_short(),
                "the new host imported the agent but its notice has not come yet; \
                 this node acts as the agent until it does"
            ),
        }
    }
}

/// The API error for a move that got no answer from `to`: nothing was
/// imported there (or, for no answer in time, it is not known).
fn move_error(e: MoveError) -> ApiError {
    let stays = STAYS;
    match e {
        MoveError::NotPeer(to) => ApiError::from(NotFound::UnknownPeer(to)).with_note(stays),
        e @ MoveError::Paused(_) => CallerError::BadValue(format!("{e}; {stays}")).into(),
        e @ MoveError::TooLarge(_) => Bug::new(format!("{e}; {stays}")).into(),
        MoveError::Refused { node, code, reason }
            if code == u64::from(crate::bus::close_code::UNKNOWN_NODE) =>
        {
            Refused {
                code: ErrorCode::Forbidden,
                fault: Fault::Caller,
                message: format!(
                    "node {node} refused the move: this node is not its peer ({reason}); \
                     add it there first (`mesh peer add`); {stays}"
                ),
            }
            .into()
        }
        e @ MoveError::Refused { code, .. }
            if code == u64::from(crate::bus::close_code::MOVE_BUSY) =>
        {
            Capacity::Busy(format!("{e}; {stays}")).into()
        }
        e @ (MoveError::NotOffered { .. } | MoveError::Refused { .. }) => {
            Unavailable::Peer(format!("{e}; {stays}")).into()
        }
        MoveError::Unreachable { node, why } => Unavailable::Peer(format!(
            "no answer from node {node} to the move ({why}); if it imported the agent before \
             its answer was lost, `mesh agents` shows it there soon; moving it again is safe \
             (an import there is not done twice); until then the agent stays here"
        ))
        .into(),
        MoveError::Stopped => Unavailable::Node(format!("the node is stopping; {stays}")).into(),
        other => Bug::new(format!("{other}; {stays}")).into(),
    }
}

/// The error for the peer's refusal `error`, by its own code and class.
fn refused(to: NodeId, name: &str, error: ErrorDetail) -> ApiError {
    let code = ErrorCode::parse(&error.code).unwrap_or(ErrorCode::Internal);
    let fault = error.fault.unwrap_or(Fault::Bug);
    Refused {
        code,
        fault,
        message: format!(
            "node {to} refused to import agent {name}: {} ({}); {STAYS}",
            error.message, error.code
        ),
    }
    .into()
}

/// The export a peer's offer holds: at most [`MOVE_MESSAGE_BYTES_MAX`]
/// bytes of an [`AgentExport`]'s JSON.
///
/// # Errors
/// `body_too_large` or `bad_json`.
pub(in crate::api) fn decode_offer(bytes: &[u8]) -> Result<AgentExport, ApiError> {
    if bytes.len() > MOVE_MESSAGE_BYTES_MAX {
        return Err(CallerError::BodyTooLarge {
            limit_bytes: MOVE_MESSAGE_BYTES_MAX,
            hint: "",
        }
        .into());
    }
    parse_json(bytes)
}

/// A peer's answer to an offer: at most [`MOVE_MESSAGE_BYTES_MAX`] bytes of
/// a [`MoveAnswer`]'s JSON.
///
/// # Errors
/// What is wrong with it, for a person.
pub(in crate::api) fn decode_answer(bytes: &[u8]) -> Result<MoveAnswer, String> {
    if bytes.len() > MOVE_MESSAGE_BYTES_MAX {
        return Err(format!(
            "{} bytes, more than {MOVE_MESSAGE_BYTES_MAX}",
            bytes.len()
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

/// Answers the move offers peers make to this node, each through
/// [`ApiState::take_offer`], until the node stops.
pub(crate) fn serve_moves(st: ApiState, mut offers: MoveOffers) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // The bus hands over at most MOVES_AT_ONCE_MAX at once.
        let mut answering = JoinSet::new();
        loop {
            tokio::select! {
                offer = offers.recv() => {
                    let Some(offer) = offer else { break };
                    let st = st.clone();
                    answering.spawn(async move { st.answer_offer(offer).await });
                }
                Some(_) = answering.join_next(), if !answering.is_empty() => {}
            }
        }
        answering.shutdown().await;
    })
}

impl ApiState {
    async fn answer_offer(&self, offer: MoveOffer) {
        let from = offer.from;
        let answer = match self.take_offer(from, &offer.body).await {
            Ok((agent, version, already)) => MoveAnswer::Imported {
                agent,
                version,
                already,
            },
            Err(e) => {
                tracing::info!(peer = %from.fmt_short(), code = %e.code(), "an agent move refused: {e}");
                MoveAnswer::Refused {
                    error: ErrorDetail {
                        code: e.code().as_str().to_owned(),
                        fault: Some(e.fault()),
                        message: e.to_string(),
                    },
                }
            }
        };
        match serde_json::to_vec(&answer) {
            Ok(bytes) => offer.answer(bytes),
            Err(e) => tracing::warn!("a move answer does not encode: {e}"),
        }
    }

    /// Imports the export `body` the peer `from` offered, as `mesh agent
    /// import` would (the agent's uid here is the daemon's): the agent, the
    /// notice's version, and whether it was imported here already.
    async fn take_offer(
        &self,
        from: NodeId,
        body: &[u8],
    ) -> Result<(AgentJson, u64, bool), ApiError> {
        let export = decode_offer(body)?;
        let origin = mesh_protocol::parse_node_id(export.from.trim())
            .map_err(|e| CallerError::BadValue(format!("the export's from: {e}")))?;
        if origin != from {
            return Err(CallerError::BadValue(format!(
                "the export says it leaves node {origin}, but node {from} offered it"
            ))
            .into());
        }
        if let Some(again) = self.imported_already(&export).await? {
            return Ok(again);
        }
        let (agent, version) = super::import(self, export, self.inner.daemon_uid).await?;
        Ok((agent, version, false))
    }

    /// The answer to an export whose agent this node hosts already, by the
    /// same key, under a notice placing it here: an offer made again after
    /// its answer was lost.
    async fn imported_already(
        &self,
        export: &AgentExport,
    ) -> Result<Option<(AgentJson, u64, bool)>, ApiError> {
        let name = agent_name(&export.name)?;
        let Some(agent) = self.inner.registry.get(&name) else {
            return Ok(None);
        };
        if agent.record.key.to_string() != export.key.trim() {
            return Ok(None);
        }
        let me = self.inner.node;
        let version = self
            .inner
            .bus
            .agent_moves()
            .borrow()
            .iter()
            .find(|m| m.key == agent.record.key && m.node == me)
            .map(|m| m.version);
        Ok(version.map(|v| (self.hosted_json(&agent.record, None), v, true)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;

    fn export_json(pad: usize) -> Vec<u8> {
        let export = AgentExport {
            format: mesh_api::AGENT_EXPORT_FORMAT.to_owned(),
            name: "kim".into(),
            key: "k".repeat(pad),
            secret_key: "00".into(),
            from: "f".into(),
            version: 0,
        };
        serde_json::to_vec(&export).unwrap()
    }

    #[test]
    fn an_offer_over_the_cap_is_refused_unread_and_one_under_it_decodes() {
        let under = export_json(100);
        assert_eq!(decode_offer(&under).unwrap().name, "kim");
        let over = export_json(MOVE_MESSAGE_BYTES_MAX);
        assert!(over.len() > MOVE_MESSAGE_BYTES_MAX);
        let e = decode_offer(&over).unwrap_err();
        assert_eq!(e.code(), ErrorCode::BodyTooLarge, "{e}");
        assert_eq!(decode_offer(b"{").unwrap_err().code(), ErrorCode::BadJson);
        assert!(decode_answer(&vec![b' '; MOVE_MESSAGE_BYTES_MAX + 1]).is_err());
        let seed = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/json_body/seed-move-imported"
        ))
        .unwrap();
        assert!(
            matches!(
                decode_answer(&seed),
                Ok(MoveAnswer::Imported {
                    version: 1,
                    already: false,
                    ..
                })
            ),
            "{:?}",
            decode_answer(&seed)
        );
    }

    #[test]
    fn a_peers_refusal_keeps_its_code_and_class_and_says_the_agent_stays() {
        let to = mesh_protocol::SecretKey::from_bytes(&[3; 32]).public();
        let e = refused(
            to,
            "kim",
            ErrorDetail {
                code: "agent_exists".into(),
                fault: Some(Fault::Caller),
                message: "an agent kim exists".into(),
            },
        );
        assert_eq!(
            (e.code(), e.fault()),
            (ErrorCode::AgentExists, Fault::Caller)
        );
        assert!(e.to_string().contains("stays here"), "{e}");
        let e = move_error(MoveError::Refused {
            node: to,
            code: u64::from(crate::bus::close_code::UNKNOWN_NODE),
            reason: "not a peer".into(),
        });
        assert_eq!((e.code(), e.fault()), (ErrorCode::Forbidden, Fault::Caller));
    }
}
