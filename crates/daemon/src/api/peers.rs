//! The node routes: status, ticket, and the peers (add, list, remove, pause,
//! resume), answered from the bus node and the store's marks.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::{Path, Request, State};
use mesh_api::{
    AddPeerRequest, AliasRequest, JournalStatus, NearbyJson, NearbyResponse, NodeStatus,
    PeerStatus, PeersResponse, StatusResponse, StreamJson, StreamMark, TicketResponse,
};
use mesh_protocol::{AgentName, NodeId, NodeTicket};
use mesh_store::{MeshStore, OwnStream};

use super::error::node_error;
use super::routes::{read_json, read_store};
use super::{ApiError, ApiState, CallerError, NotFound, REQUEST_BYTES_MAX};
use crate::bus::{NodePeer, NodeStatus as BusStatus};

impl ApiState {
    /// Every known peer, with its marks and last seen epoch from the store.
    async fn peers(&self) -> Result<Vec<PeerStatus>, ApiError> {
        let status = self.inner.bus.status().await.map_err(node_error)?;
        self.peers_of(status).await
    }

    async fn peers_of(&self, status: BusStatus) -> Result<Vec<PeerStatus>, ApiError> {
        let (marks, records) =
            read_store(&self.inner.store, |s| Ok((s.marks()?, s.peers()?))).await?;
        let epochs: HashMap<NodeId, String> = records
            .into_iter()
            .filter_map(|r| Some((r.node, r.epoch?.to_string())))
            .collect();
        let mut by_author: HashMap<NodeId, Vec<StreamMark>> = HashMap::new();
        for m in marks {
            by_author
                .entry(m.stream.author)
                .or_default()
                .push(StreamMark {
                    stream: StreamJson::from(&m.stream),
                    mark: m.seq,
                });
        }
        Ok(status
            .peers
            .into_iter()
            .map(|p| {
                let alias = self.alias_of(&p.node);
                let mut s = peer_status(p, &epochs, &mut by_author);
                s.alias = alias;
                s
            })
            .collect())
    }

    /// The peer `node` as it is now ([`NotFound::UnknownPeer`] if it is not known).
    async fn peer(&self, node: NodeId) -> Result<PeerStatus, ApiError> {
        let id = node.to_string();
        self.peers()
            .await?
            .into_iter()
            .find(|p| p.node == id)
            .ok_or_else(|| NotFound::UnknownPeer(node).into())
    }
}

fn peer_status(
    p: NodePeer,
    epochs: &HashMap<NodeId, String>,
    marks: &mut HashMap<NodeId, Vec<StreamMark>>,
) -> PeerStatus {
    // What an ended epoch still has to carry over is queued too: a status
    // that said 0 while it waited would read as delivered.
    let (queued_msgs, outbox_bytes) = match &p.own_stream {
        Some(o) => (queued(o) + p.carrying, o.bytes),
        None => (p.carrying, 0),
    };
    PeerStatus {
        node: p.node.to_string(),
        name: p.card.as_ref().map(|c| c.name.to_string()),
        card_issued_ms: p.card.as_ref().map(|c| c.issued_ms),
        refused: p.refused,
        addrs: p.addrs,
        connected: p.conn.is_some(),
        epoch: epochs.get(&p.node).cloned(),
        marks: marks.remove(&p.node).unwrap_or_default(),
        queued_msgs,
        outbox_bytes,
        oldest_queued_ms: None,
        paused: p.paused,
        alias: None,
        identity_conflict: p.identity_conflict,
    }
}

/// Envelopes of `o` that are unacknowledged and still in the outbox: from
/// past the ack (or from the oldest retained, if `evict-oldest` dropped
/// more) to the last one sent.
fn queued(o: &OwnStream) -> u64 {
    o.next_seq
        .saturating_sub(o.first_retained.max(o.last_acked.saturating_add(1)))
}

pub(super) async fn status(State(st): State<ApiState>) -> Result<Json<StatusResponse>, ApiError> {
    let bus = st.inner.bus.status().await.map_err(node_error)?;
    Ok(Json(st.status_of(bus).await?))
}

impl ApiState {
    /// The node's status from `bus`, one read of the node's own, with what
    /// the store adds (marks, queue ages, the journal's bounds, unread mail).
    pub(super) async fn status_of(&self, bus: BusStatus) -> Result<StatusResponse, ApiError> {
        let ticket = bus.ticket.clone();
        let store_down = bus.store_down.clone();
        let oldest = oldest_queued(self, &bus).await;
        // Read from the store (the node only knows it as of its last trim); a
        // store that cannot be read does not hide the rest of the status.
        let journal = read_store(&self.inner.store, |s| s.journal_bounds())
            .await
            .ok()
            .or(bus.journal)
            .map(|b| JournalStatus {
                first: b.first,
                head: b.head,
                bytes: b.bytes,
                max_bytes: Some(self.inner.journal_bytes_max),
            });

        // Unread counts read the store too; one that cannot be read leaves them out.
        let agents = self
            .local_agents(|name| bus.agents.iter().any(|c| &c.name == name && c.online))
            .await
            .unwrap_or_default();
        let (node_id, name, epoch) = (bus.node, bus.card.name.to_string(), bus.epoch);
        let mut peers = self.peers_of(bus).await?;
        for p in &mut peers {
            p.oldest_queued_ms = oldest.get(&p.node).copied();
        }
        let node = NodeStatus {
            node: node_id.to_string(),
            name,
            epoch: epoch.to_string(),
            addrs: ticket.addrs.clone(),
            ticket: ticket.to_string(),
            peers,
            store_bytes: std::fs::metadata(&self.inner.store_file)
                .ok()
                .map(|m| m.len()),
            journal,
            store_down,
        };
        Ok(StatusResponse {
            node,
            journal_head: self.read_head(),
            subscribers: self.inner.counters.subscribers.load(Ordering::Relaxed),
            pid: std::process::id(),
            agents,
        })
    }
}

/// When the oldest envelope still queued of this node's own stream to each
/// peer was written (its header's `created_ms`), by peer id: one outbox read
/// per peer with something queued. A store that cannot be read leaves the
/// times out rather than the status.
async fn oldest_queued(st: &ApiState, bus: &BusStatus) -> HashMap<String, u64> {
    let queued: Vec<(String, OwnStream)> = bus
        .peers
        .iter()
        .filter_map(|p| Some((p.node.to_string(), p.own_stream.clone()?)))
        .filter(|(_, o)| queued(o) > 0)
        .collect();
    if queued.is_empty() {
        return HashMap::new();
    }
    read_store(&st.inner.store, move |s| {
        let mut times = HashMap::new();
        for (node, o) in queued {
            let after = o.last_acked.max(o.first_retained.saturating_sub(1));
            // A read of at most one batch: the first that holds `after + 1`.
            let batches = s.read_outbox(&o.stream, after, 1)?;
            let created = batches.iter().find_map(|b| {
                let first = b.batch.first_seq;
                b.batch
                    .entries
                    .iter()
                    .zip(first..)
                    .find(|(_, seq)| *seq > after)
                    .map(|(h, _)| h.created_ms)
            });
            if let Some(ms) = created {
                times.insert(node, ms);
            }
        }
        Ok(times)
    })
    .await
    .unwrap_or_default()
}

pub(super) async fn ticket(State(st): State<ApiState>) -> Json<TicketResponse> {
    Json(TicketResponse {
        ticket: st.inner.bus.ticket().to_string(),
    })
}

pub(super) async fn add_peer(
    State(st): State<ApiState>,
    req: Request,
) -> Result<Json<PeerStatus>, ApiError> {
    let body: AddPeerRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let ticket: NodeTicket = body
        .ticket
        .parse()
        .map_err(|e: mesh_protocol::TicketError| CallerError::BadValue(e.to_string()))?;
    st.inner
        .bus
        .add_peer(ticket.node, ticket.addrs)
        .await
        .map_err(node_error)?;
    let peer = st.peer(ticket.node).await.map_err(|e| match e.kind() {
        super::ErrorKind::NotFound(_) => super::Bug::new("the added peer is not listed").into(),
        _ => e,
    })?;
    Ok(Json(peer))
}

pub(super) async fn list_peers(
    State(st): State<ApiState>,
) -> Result<Json<PeersResponse>, ApiError> {
    Ok(Json(PeersResponse {
        peers: st.peers().await?,
    }))
}

pub(super) async fn nearby(State(st): State<ApiState>) -> Result<Json<NearbyResponse>, ApiError> {
    let status = st.inner.bus.status().await.map_err(node_error)?;
    let nearby = status
        .nearby
        .into_iter()
        .map(|n| NearbyJson {
            node: n.node.to_string(),
            name: n.name,
            addrs: n.addrs,
        })
        .collect();
    Ok(Json(NearbyResponse { nearby }))
}

pub(super) async fn remove_peer(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let node = st.resolve_peer_arg(&id)?;
    let status = st.inner.bus.status().await.map_err(node_error)?;
    if !status.peers.iter().any(|p| p.node == node) {
        return Err(NotFound::UnknownPeer(node).into());
    }
    st.inner.bus.remove_peer(node).await.map_err(node_error)?;
    Ok(Json(serde_json::json!({ "removed": node.to_string() })))
}

pub(super) async fn pause_peer(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<PeerStatus>, ApiError> {
    set_paused(st, &id, true).await
}

pub(super) async fn resume_peer(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<PeerStatus>, ApiError> {
    set_paused(st, &id, false).await
}

/// `PUT /v1/peers/{id}/alias`: sets (or with `null` removes) this node's
/// local alias of the peer `id` (an id, an alias or a name), so that
/// `AGENT@ALIAS` and `mesh send ALIAS` name it.
pub(super) async fn put_alias(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Json<PeerStatus>, ApiError> {
    let node = st.resolve_peer_arg(&id)?;
    let body: AliasRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    if let Some(a) = &body.alias {
        AgentName::new(a).map_err(|e| {
            CallerError::BadValue(format!(
                "bad alias {:?}: {}",
                super::routes::cut(a),
                e.to_string().replace("agent name", "alias")
            ))
        })?;
        if mesh_protocol::parse_node_id(a).is_ok() {
            return Err(CallerError::BadValue(format!("alias {a:?} reads as a node id")).into());
        }
        if let Some(other) = st.aliases().get(a.as_str()).filter(|n| **n != node) {
            return Err(CallerError::AmbiguousName(format!(
                "alias {a:?} names node {other} already; remove it there first"
            ))
            .into());
        }
    }
    let peer = st.peer(node).await?;
    if let Some(old) = st
        .alias_of(&node)
        .filter(|o| Some(o) != body.alias.as_ref())
    {
        let write = crate::bus::LocalWrite::PutAlias {
            alias: old,
            node: None,
        };
        st.inner.bus.local_write(write).await.map_err(node_error)?;
    }
    if let Some(a) = &body.alias {
        let write = crate::bus::LocalWrite::PutAlias {
            alias: a.clone(),
            node: Some(node),
        };
        st.inner.bus.local_write(write).await.map_err(node_error)?;
    }
    st.set_alias(node, body.alias.as_deref());
    Ok(Json(PeerStatus {
        alias: body.alias,
        ..peer
    }))
}

/// Pauses or resumes the link to the peer `id` and answers the peer as it
/// is then. Not durable: a restarted node has no paused link.
async fn set_paused(st: ApiState, id: &str, paused: bool) -> Result<Json<PeerStatus>, ApiError> {
    let node = st.resolve_peer_arg(id)?;
    st.inner
        .bus
        .set_peer_paused(node, paused)
        .await
        .map_err(node_error)?;
    Ok(Json(st.peer(node).await?))
}

#[cfg(test)]
mod tests {
    use mesh_protocol::{Epoch, SecretKey, StreamId};
    use mesh_store::OwnStream;

    use super::queued;

    #[test]
    fn queued_counts_only_unacknowledged_envelopes_still_in_the_outbox() {
        let me = SecretKey::from_bytes(&[1; 32]).public();
        let to = SecretKey::from_bytes(&[3; 32]).public();
        let own = |first_retained, last_acked| OwnStream {
            stream: StreamId::direct(me, Epoch([0; 16]), to),
            next_seq: 101,
            first_retained,
            last_acked,
            msgs: 101 - first_retained,
            bytes: 0,
            evictable_msgs: 0,
            evictable_bytes: 0,
        };
        // 100 sent, 40 acknowledged, nothing evicted: 60 queued.
        assert_eq!(queued(&own(1, 40)), 60);
        // evict-oldest dropped everything before 71 (30 of it unacknowledged).
        assert_eq!(queued(&own(71, 40)), 30);
        // Acknowledged ones evicted too: still only what is unacknowledged.
        assert_eq!(queued(&own(50, 60)), 40);
        assert_eq!(queued(&own(1, 100)), 0);
    }
}
