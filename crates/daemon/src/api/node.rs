//! What the API needs from the running node (the bus driver), as a trait so
//! the HTTP layer is built and tested apart from it, and what it needs to
//! write to the store.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use mesh_protocol::{NodeId, NodeTicket, Seq, StreamId};
use mesh_store::{Arrival, MeshStore, Receipt, StoreError, StoreHandle, WriteOp};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::error::ApiError;
use super::json::StreamJson;

/// A boxed, sendable future: what the object-safe traits here return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Messages handed to the node ([`NodeApi::submit_batch`]): their answers,
/// once committed, in the order they were handed over.
pub struct PendingSends(pub(super) BoxFuture<'static, Result<Vec<Sent>, ApiError>>);

impl PendingSends {
    /// The answers `answers` will give.
    pub fn new(
        answers: impl Future<Output = Result<Vec<Sent>, ApiError>> + Send + 'static,
    ) -> Self {
        PendingSends(Box::pin(answers))
    }

    /// Answers already known.
    pub fn ready(answers: Result<Vec<Sent>, ApiError>) -> Self {
        PendingSends::new(std::future::ready(answers))
    }

    /// Waits for the answers.
    pub async fn answers(self) -> Result<Vec<Sent>, ApiError> {
        self.0.await
    }
}

/// One message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutMessage {
    /// The recipient.
    pub to: NodeId,
    /// Application-defined kind; 0 is a plain message.
    pub kind: u16,
    /// The payload (at most `mesh_protocol::MAX_BATCH_PAYLOAD_BYTES`).
    pub body: Vec<u8>,
}

/// A message committed to its outbox and journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Its stream.
    pub stream: StreamId,
    /// Its seq in the stream.
    pub seq: Seq,
    /// Its position in this node's journal.
    pub arrival: Arrival,
}

/// The node's state as `GET /v1/status` shows it (the API adds the journal head).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This node's id.
    pub node: String,
    /// This node's store epoch (hex).
    pub epoch: String,
    /// Addresses it listens on for peers.
    pub addrs: Vec<SocketAddr>,
    /// A ticket other nodes can add.
    pub ticket: String,
    /// Every known peer.
    pub peers: Vec<PeerStatus>,
    /// The store file's size in bytes, if known.
    pub store_bytes: Option<u64>,
}

/// One peer as `GET /v1/peers` and `GET /v1/status` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// The peer's id.
    pub node: String,
    /// Addresses this node dials it at.
    pub addrs: Vec<SocketAddr>,
    /// Whether a connection is up now.
    pub connected: bool,
    /// The peer's store epoch as last seen (hex), if any.
    pub epoch: Option<String>,
    /// This node's receive marks for the peer's streams.
    pub marks: Vec<StreamMark>,
    /// Envelopes queued for the peer (unacknowledged, in the outbox).
    pub queued_msgs: u64,
    /// Payload bytes in the peer's outbox.
    pub outbox_bytes: u64,
    /// Whether the link to it is paused (`mesh peer pause`); absent means no.
    #[serde(default)]
    pub paused: bool,
}

/// A receive mark: every envelope of `stream` up to `mark` is committed here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMark {
    /// The stream.
    pub stream: StreamJson,
    /// The mark.
    pub mark: Seq,
}

/// The node operations behind the `/v1` routes that need the bus.
///
/// Every method answers only after its effect is durable (a send after its
/// commit) or fails with an [`ApiError`] whose status tells who is at fault:
/// [`ApiError::UnknownPeer`] for an unknown recipient or peer,
/// [`ApiError::OutboxFull`] (the core refused the send),
/// [`ApiError::StoreUnavailable`], [`ApiError::NodeUnavailable`].
pub trait NodeApi: Send + Sync + 'static {
    /// Sends one message; answers after it is committed.
    fn send(&self, msg: OutMessage) -> BoxFuture<'_, Result<Sent, ApiError>> {
        Box::pin(async move {
            let mut sent = self.send_batch(vec![msg]).await?;
            sent.pop()
                .ok_or_else(|| ApiError::Internal("send_batch answered nothing".into()))
        })
    }

    /// Sends messages (to one or many peers); the answer lists them in
    /// request order. Each message is committed or refused on its own: if
    /// any is refused, the error is the first refusal and its message says
    /// how many of the others were committed (the journal shows which).
    fn send_batch(&self, msgs: Vec<OutMessage>) -> BoxFuture<'_, Result<Vec<Sent>, ApiError>>;

    /// Hands `msgs` to the node as [`NodeApi::send_batch`] does, resolving
    /// once every one of them is handed over, with the future of their
    /// answers. Messages handed over after it resolves are ordered after
    /// these (their seqs follow), so a caller may hand over the next batch
    /// while this one commits and the two may share a commit. The default
    /// hands over and waits for the whole batch.
    fn submit_batch(self: Arc<Self>, msgs: Vec<OutMessage>) -> BoxFuture<'static, PendingSends> {
        Box::pin(async move { PendingSends::ready(self.send_batch(msgs).await) })
    }

    /// The node's state.
    fn status(&self) -> BoxFuture<'_, Result<NodeStatus, ApiError>>;

    /// A ticket for this node.
    fn ticket(&self) -> BoxFuture<'_, Result<NodeTicket, ApiError>>;

    /// Adds (or updates) a peer from its ticket, durably.
    fn add_peer(&self, ticket: NodeTicket) -> BoxFuture<'_, Result<PeerStatus, ApiError>>;

    /// Every known peer.
    fn list_peers(&self) -> BoxFuture<'_, Result<Vec<PeerStatus>, ApiError>>;

    /// Forgets a peer durably ([`ApiError::UnknownPeer`] if it is not known).
    fn remove_peer(&self, node: NodeId) -> BoxFuture<'_, Result<(), ApiError>>;

    /// Pauses or resumes the link to a peer ([`ApiError::UnknownPeer`] if it
    /// is not known) and answers the peer as it is then. Not durable: a
    /// restarted node has no paused link. A node that cannot pause links
    /// answers [`ApiError::NodeUnavailable`].
    fn set_peer_paused(
        &self,
        node: NodeId,
        paused: bool,
    ) -> BoxFuture<'_, Result<PeerStatus, ApiError>> {
        let _ = (node, paused);
        Box::pin(async {
            Err(ApiError::NodeUnavailable(
                "this node cannot pause links".into(),
            ))
        })
    }
}

/// Durable writes the API makes itself: named cursors and subscriber loss records.
///
/// The daemon passes its group-commit store actor; the answer comes after
/// the ops are committed. The journal head watch given to the API must
/// advance after every commit that journals something, these included.
pub trait JournalWriter: Send + Sync + 'static {
    /// Commits `ops` in one group, all or nothing.
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'_, Result<Receipt, StoreError>>;
}

/// The [`JournalWriter`] the daemon uses: commits through the store's
/// group-commit actor, then moves the journal head watch forward.
pub struct StoreWriter<S: MeshStore + ?Sized> {
    handle: StoreHandle<S>,
    head: Arc<watch::Sender<Arrival>>,
}

impl<S: MeshStore + ?Sized> StoreWriter<S> {
    /// Writes through `handle`, announcing new journal heads on `head` (the
    /// sender the bus driver also announces its commits on).
    pub fn new(handle: StoreHandle<S>, head: Arc<watch::Sender<Arrival>>) -> Self {
        StoreWriter { handle, head }
    }
}

impl<S: MeshStore + ?Sized> JournalWriter for StoreWriter<S> {
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'_, Result<Receipt, StoreError>> {
        Box::pin(async move {
            let receipt = self.handle.commit(ops).await?;
            publish_head(&self.head, &receipt);
            Ok(receipt)
        })
    }
}

/// Moves the journal head watch to the last arrival `receipt` wrote, if that
/// is past it (commits may be answered out of order; the head never moves back).
pub fn publish_head(head: &watch::Sender<Arrival>, receipt: &Receipt) {
    if let Some((_, last)) = receipt.arrivals {
        head.send_if_modified(|h| {
            let moved = last > *h;
            *h = (*h).max(last);
            moved
        });
    }
}
