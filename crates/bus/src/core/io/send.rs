//! A local send's metadata, its receipt, and why it was refused.

use mesh_protocol::{AgentName, MsgId, NodeId, Seq, StreamId, SupersedeKey};
use mesh_store::StoreError;

/// What a local send carries besides its recipient and payload: the
/// agent addressing of an agent message, and a client's id for retries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendMeta {
    /// The sending agent of this node: the message is an agent message
    /// (kind [`mesh_protocol::KIND_AGENT`]) whose body is the payload.
    /// `None`: a plain message of the node, of its own kind.
    pub from: Option<AgentName>,
    /// The recipient agent (agent messages only; `None` for the recipient
    /// node's own journal).
    pub to: Option<AgentName>,
    /// The message this one answers (agent messages only).
    pub in_reply_to: Option<MsgId>,
    /// The client's id: a send of the same sender and id within
    /// [`crate::core::Config::dedup_window_ms`] is answered with the first
    /// one's receipt instead of being sent again.
    pub client_id: Option<String>,
    /// The supersede key (agent messages only): this message replaces an
    /// earlier one of the same sender to the same recipient agent and node
    /// with the same key that still waits to be sent (held, or queued and
    /// never handed to a connection); that one is answered, or marked,
    /// superseded, and a tombstone goes in its place.
    pub key: Option<SupersedeKey>,
    /// Asks the recipient agent's node for a read receipt once that agent
    /// has read the message (agent messages to an agent only).
    pub receipt: bool,
    /// The payload is a [`mesh_protocol::ReadReceipt`] of one of this
    /// node's agents, of kind [`mesh_protocol::KIND_READ_RECEIPT`]: the
    /// one mesh kind a node-level send may carry, and only its daemon's
    /// receipt pump sets this (no API does).
    pub read_receipt: bool,
}

/// One message of an [`crate::core::Input::Publish`]: its request, kind and
/// payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    /// Names the request (each message is answered on its own).
    pub req: crate::core::ReqId,
    /// Application-defined kind; 0 is a plain message.
    pub kind: u16,
    /// The payload.
    pub payload: Vec<u8>,
}

/// Where a sent message went: its stream and seq, durable at the author.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendReceipt {
    /// The stream (this node, its epoch, `Direct(recipient)`).
    pub stream: StreamId,
    /// The message's seq in the stream.
    pub seq: Seq,
    /// The message's position in this node's journal.
    pub arrival: mesh_store::Arrival,
    /// The message was superseded before it was sent, by this one: a
    /// tombstone naming it was written (and goes to the peer) in its place.
    pub superseded_by: Option<MsgId>,
}

/// Why a local send was refused, grouped by who can fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The caller's fault: the recipient is not a known peer.
    #[error("unknown peer {}: add it as a peer before sending to it", .0.fmt_short())]
    UnknownPeer(NodeId),
    /// The caller's fault: a node does not send to itself over the mesh.
    #[error("cannot send to this node itself")]
    ToSelf,
    /// The caller's fault: a publish to a topic this node is not a member of.
    #[error("this node is not a member of topic {0}: join it first (`mesh topic join {0}`)")]
    NotAMember(mesh_protocol::TopicName),
    /// The caller's fault: the sending agent is not an agent of this node.
    #[error("no agent {0} on this node")]
    UnknownAgent(AgentName),
    /// The caller's fault: a message to an agent of this node itself names
    /// none it hosts (a message to this node needs a recipient agent).
    #[error("this node has no agent {}", .0.as_ref().map_or("(none named)", |n| n.as_str()))]
    NoSuchLocalAgent(Option<AgentName>),
    /// The caller's fault: a retry's client id was first used for another
    /// message (another recipient or body).
    #[error(
        "client id {client_id:?} was already used for another message; a retry must repeat the first send exactly"
    )]
    ClientIdReused {
        /// The client id.
        client_id: String,
    },
    /// The caller's fault: a recipient agent, a reply or a supersede key
    /// without a sending agent.
    #[error(
        "only an agent message names a recipient agent, answers a message or carries a \
         supersede key: send as an agent"
    )]
    NotAnAgentMessage,
    /// The caller's fault: a read receipt asked of a message without a
    /// recipient agent (one to the node itself, or a plain message).
    #[error(
        "a read receipt is asked only of an agent message to an agent: name the recipient \
         agent (AGENT@NODE)"
    )]
    ReceiptWithoutAgent,
    /// The caller's fault (this node's receipt pump): a read receipt that
    /// does not decode, or whose reader is no agent of this node.
    #[error("not a read receipt of an agent of this node: {0}")]
    BadReadReceipt(String),
    /// The caller's fault: a plain message of one of the mesh's own kinds.
    #[error("kind {0} is reserved for the mesh's own messages (1 to 15); use 0 or a kind above 15")]
    ReservedKind(u16),
    /// The caller's fault: the payload can never fit a batch or the outbox.
    #[error("payload of {len} bytes is larger than the {max}-byte limit")]
    TooLarge {
        /// The payload's length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Capacity: too many sends are waiting for the store; retry later.
    #[error("the bus is busy: {waiting} sends are already waiting for the store; retry later")]
    Busy {
        /// Sends waiting.
        waiting: usize,
    },
    /// Capacity: the peer's outbox is full of unacknowledged messages and its
    /// policy is `reject`. Nothing was written. Decided by the core, exactly,
    /// from the committed outbox and the sends ahead of this one.
    #[error(
        "outbox for peer {} is full ({msgs} msgs / {bytes} bytes unacknowledged); the peer must catch up first",
        .peer.fmt_short()
    )]
    OutboxFull {
        /// The recipient.
        peer: NodeId,
        /// Messages the outbox cannot evict without loss (written, or taken
        /// ahead of this one).
        msgs: u64,
        /// Their payload bytes.
        bytes: u64,
    },
    /// The environment: the store failed; the message was not written.
    #[error("the store could not write the message: {0}")]
    Store(String),
    /// The environment: the store could not commit the message while it
    /// was held, `held_ms` long; it was let go, never written (it took no
    /// seq), and for a send a lost record is journaled once the store is
    /// back.
    #[error(
        "the store could not commit the message for {held_ms} ms ({why}); it was let go and never written"
    )]
    Held {
        /// How long it was held.
        held_ms: u64,
        /// The store's last error.
        why: String,
    },
    /// The environment: the store cannot commit now and as many sends and
    /// publishes as the node holds (one budget) are held already; nothing
    /// was written.
    #[error(
        "the store cannot commit now ({why}) and {held} sends and publishes are held already; \
         nothing was written"
    )]
    StoreDown {
        /// Sends and publishes held.
        held: usize,
        /// The store's last error.
        why: String,
    },
    /// A bug: the store refused a write the core believed valid.
    #[error("internal error, the message was not written: {0}")]
    Internal(String),
}

impl SendError {
    /// Why the store did not write a send.
    pub(crate) fn from_store(e: &StoreError) -> SendError {
        match e {
            StoreError::Conflict(why) => SendError::Internal(why.clone()),
            other => SendError::Store(other.to_string()),
        }
    }
}
