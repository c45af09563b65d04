//! The running daemon: the bus node behind the local API.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use mesh_bus::core::SendError as CoreSendError;
use mesh_bus::core::SendReceipt;
use mesh_bus::node::{Node, NodeError, NodePeer, SendError};
use mesh_protocol::{NodeId, NodeTicket};
use mesh_store::{MeshStore, RedbStore};

use crate::api::ApiError;
use crate::api::json::StreamJson;
use crate::api::node::{
    BoxFuture, NodeApi, NodeStatus, OutMessage, PeerStatus, PendingSends, Sent, StreamMark,
};

/// The [`NodeApi`] of a running bus [`Node`].
pub struct BusApi {
    node: Arc<Node>,
    store: Arc<RedbStore>,
    store_file: PathBuf,
}

impl BusApi {
    /// The API of `node`, whose store is `store` (at `store_file`).
    pub fn new(node: Arc<Node>, store: Arc<RedbStore>, store_file: PathBuf) -> Self {
        BusApi {
            node,
            store,
            store_file,
        }
    }

    async fn peers(&self) -> Result<Vec<PeerStatus>, ApiError> {
        let status = self.node.status().await.map_err(node_error)?;
        let store = self.store.clone();
        let (marks, records) = tokio::task::spawn_blocking(move || {
            Ok::<_, mesh_store::StoreError>((store.marks()?, store.peers()?))
        })
        .await
        .map_err(|e| ApiError::Internal(format!("store read task failed: {e}")))?
        .map_err(|e| ApiError::StoreUnavailable(e.to_string()))?;
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
                let epoch = epochs.get(&p.node).cloned();
                PeerStatus {
                    epoch,
                    ..peer_status(p, &mut by_author)
                }
            })
            .collect())
    }
}

fn peer_status(p: NodePeer, marks: &mut HashMap<NodeId, Vec<StreamMark>>) -> PeerStatus {
    let (queued_msgs, outbox_bytes) = match &p.own_stream {
        Some(o) => (queued(o), o.bytes),
        None => (0, 0),
    };
    PeerStatus {
        node: p.node.to_string(),
        addrs: p.addrs,
        connected: p.conn.is_some(),
        epoch: None,
        marks: marks.remove(&p.node).unwrap_or_default(),
        queued_msgs,
        outbox_bytes,
        paused: p.paused,
    }
}

/// Envelopes of `o` that are unacknowledged and still in the outbox: from
/// past the ack (or from the oldest retained, if `evict-oldest` dropped
/// more) to the last one sent.
fn queued(o: &mesh_store::OwnStream) -> u64 {
    o.next_seq
        .saturating_sub(o.first_retained.max(o.last_acked.saturating_add(1)))
}

fn node_error(e: NodeError) -> ApiError {
    match e {
        NodeError::Store(s) => ApiError::StoreUnavailable(s.to_string()),
        NodeError::Peer(p) => ApiError::BadRequest(p.to_string()),
        NodeError::Stopped => ApiError::NodeUnavailable("the node is stopping".into()),
        other => ApiError::NodeUnavailable(other.to_string()),
    }
}

fn send_error(to: NodeId, e: SendError) -> ApiError {
    match e {
        SendError::Refused(CoreSendError::UnknownPeer(_)) => ApiError::UnknownPeer(to),
        SendError::Refused(e @ CoreSendError::OutboxFull { .. }) => {
            ApiError::OutboxFull(e.to_string())
        }
        SendError::Refused(e @ CoreSendError::Store(_)) => {
            ApiError::StoreUnavailable(e.to_string())
        }
        SendError::Refused(e @ CoreSendError::Busy { .. }) => {
            ApiError::NodeUnavailable(e.to_string())
        }
        SendError::Refused(e @ (CoreSendError::ToSelf | CoreSendError::TooLarge { .. })) => {
            ApiError::BadRequest(e.to_string())
        }
        SendError::Refused(e) => ApiError::Internal(e.to_string()),
        SendError::Stopped => ApiError::NodeUnavailable(SendError::Stopped.to_string()),
        other => ApiError::Internal(other.to_string()),
    }
}

/// The answer to a batch of sends from the bus's receipts, in request order
/// (`tos` names each message's recipient).
fn batch_answer(
    receipts: Vec<Result<SendReceipt, SendError>>,
    tos: Vec<NodeId>,
) -> Result<Vec<Sent>, ApiError> {
    let results: Vec<Result<Sent, ApiError>> = receipts
        .into_iter()
        .zip(tos)
        .map(|(r, to)| {
            r.map(|r| Sent {
                stream: r.stream,
                seq: r.seq,
                arrival: r.arrival,
            })
            .map_err(|e| send_error(to, e))
        })
        .collect();
    let n = results.len();
    let committed = results.iter().filter(|r| r.is_ok()).count();
    if committed == n {
        return Ok(results.into_iter().flatten().collect());
    }
    let (i, first) = results
        .into_iter()
        .enumerate()
        .find_map(|(i, r)| r.err().map(|e| (i, e)))
        .ok_or_else(|| ApiError::Internal("a failed send has no error".into()))?;
    if n == 1 {
        // A single send: which one and how many were committed go without saying.
        return Err(first);
    }
    let note = format!(
        "message {i} of {n} was refused; {committed} of the {n} were committed \
         (GET /v1/events shows which)"
    );
    Err(first.with_note(&note))
}

/// The messages of a batch as the bus takes them, noting when the bus has
/// taken the last one: `Node::send_many` asks for the next message only
/// after it has queued the one before.
struct HandOver<I> {
    msgs: I,
    done: Arc<AtomicBool>,
}

impl<I: Iterator<Item = OutMessage>> Iterator for HandOver<I> {
    type Item = (NodeId, u16, Vec<u8>);

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.msgs.next();
        if next.is_none() {
            self.done.store(true, Ordering::Release);
        }
        next.map(|m| (m.to, m.kind, m.body))
    }
}

impl NodeApi for BusApi {
    fn send_batch(&self, msgs: Vec<OutMessage>) -> BoxFuture<'_, Result<Vec<Sent>, ApiError>> {
        Box::pin(async move {
            // Handed to the bus in request order (so the seqs follow it) and
            // answered together: the messages share the bus's next group commit.
            let tos: Vec<NodeId> = msgs.iter().map(|m| m.to).collect();
            let receipts = self
                .node
                .send_many(msgs.into_iter().map(|m| (m.to, m.kind, m.body)))
                .await;
            batch_answer(receipts, tos)
        })
    }

    fn submit_batch(self: Arc<Self>, msgs: Vec<OutMessage>) -> BoxFuture<'static, PendingSends> {
        Box::pin(async move {
            let tos: Vec<NodeId> = msgs.iter().map(|m| m.to).collect();
            let handed = Arc::new(AtomicBool::new(false));
            let msgs = HandOver {
                msgs: msgs.into_iter(),
                done: handed.clone(),
            };
            let node = self.node.clone();
            let mut sending = Box::pin(async move { node.send_many(msgs).await });
            // Drive the sends until the bus has queued every one (or answered
            // them all); the answers are awaited by the caller.
            let early = std::future::poll_fn(|cx| match sending.as_mut().poll(cx) {
                Poll::Ready(receipts) => Poll::Ready(Some(receipts)),
                Poll::Pending if handed.load(Ordering::Acquire) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            })
            .await;
            match early {
                Some(receipts) => PendingSends::ready(batch_answer(receipts, tos)),
                None => PendingSends::new(async move { batch_answer(sending.await, tos) }),
            }
        })
    }

    fn status(&self) -> BoxFuture<'_, Result<NodeStatus, ApiError>> {
        Box::pin(async move {
            let peers = self.peers().await?;
            let addrs = self.node.ticket().addrs;
            Ok(NodeStatus {
                node: self.node.node_id().to_string(),
                epoch: self.node.epoch().to_string(),
                addrs,
                ticket: self.node.ticket().to_string(),
                peers,
                store_bytes: std::fs::metadata(&self.store_file).ok().map(|m| m.len()),
            })
        })
    }

    fn ticket(&self) -> BoxFuture<'_, Result<NodeTicket, ApiError>> {
        Box::pin(async move { Ok(self.node.ticket()) })
    }

    fn add_peer(&self, ticket: NodeTicket) -> BoxFuture<'_, Result<PeerStatus, ApiError>> {
        Box::pin(async move {
            let id = ticket.node;
            self.node
                .add_peer(id, ticket.addrs)
                .await
                .map_err(node_error)?;
            let peers = self.peers().await?;
            peers
                .into_iter()
                .find(|p| p.node == id.to_string())
                .ok_or_else(|| ApiError::Internal("the added peer is not listed".into()))
        })
    }

    fn list_peers(&self) -> BoxFuture<'_, Result<Vec<PeerStatus>, ApiError>> {
        Box::pin(self.peers())
    }

    fn remove_peer(&self, node: NodeId) -> BoxFuture<'_, Result<(), ApiError>> {
        Box::pin(async move {
            let known = self
                .node
                .status()
                .await
                .map_err(node_error)?
                .peers
                .iter()
                .any(|p| p.node == node);
            if !known {
                return Err(ApiError::UnknownPeer(node));
            }
            self.node.remove_peer(node).await.map_err(node_error)
        })
    }

    fn set_peer_paused(
        &self,
        node: NodeId,
        paused: bool,
    ) -> BoxFuture<'_, Result<PeerStatus, ApiError>> {
        Box::pin(async move {
            match self.node.set_peer_paused(node, paused).await {
                Err(NodeError::Peer(mesh_bus::net::PeerError::UnknownPeer(_))) => {
                    return Err(ApiError::UnknownPeer(node));
                }
                other => other.map_err(node_error)?,
            }
            let id = node.to_string();
            self.peers()
                .await?
                .into_iter()
                .find(|p| p.node == id)
                .ok_or(ApiError::UnknownPeer(node))
        })
    }
}

/// Prometheus text for the bus's counters.
pub(crate) fn render_metrics(status: &mesh_bus::node::NodeStatus, out: &mut String) {
    use std::fmt::Write;
    let m = &status.core;
    let mut line = |name: &str, help: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP mesh_{name} {help}\n# TYPE mesh_{name} counter\nmesh_{name} {v}"
        );
    };
    line(
        "commits_total",
        "Commits issued by the bus core.",
        m.commits,
    );
    line("sends_ok_total", "Local sends committed.", m.sends_ok);
    line(
        "sends_refused_total",
        "Local sends refused before the store.",
        m.sends_refused,
    );
    line(
        "sends_failed_total",
        "Local sends the store refused or failed.",
        m.sends_failed,
    );
    line(
        "batches_accepted_total",
        "Peer batches accepted into a commit.",
        m.batches_accepted,
    );
    line(
        "duplicate_envelopes_total",
        "Envelopes received at or below the mark.",
        m.duplicate_envelopes,
    );
    line(
        "resyncs_asked_total",
        "Resync frames sent.",
        m.resyncs_asked,
    );
    line(
        "resyncs_served_total",
        "Resync requests served.",
        m.resyncs_served,
    );
    line("gaps_sent_total", "ResyncGap frames sent.", m.gaps_sent);
    line(
        "gaps_recorded_total",
        "Gaps committed to the journal.",
        m.gaps_recorded,
    );
    line(
        "retransmits_total",
        "Streams resent after a silence.",
        m.retransmits,
    );
    line(
        "link_paused_refused_total",
        "Incoming connections refused because the link to their peer is paused.",
        status.net.paused_refused,
    );
    let _ = writeln!(
        out,
        "# HELP mesh_frames_dropped_total Frames dropped, by reason.\n# TYPE mesh_frames_dropped_total counter"
    );
    for (reason, v) in m.dropped.iter() {
        let _ = writeln!(out, "mesh_frames_dropped_total{{reason=\"{reason}\"}} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP mesh_journal_head Last journal arrival written.\n# TYPE mesh_journal_head gauge\nmesh_journal_head {}",
        status.journal_head
    );
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
