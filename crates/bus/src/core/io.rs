//! What goes into the core and what comes out: inputs, effects, ids, errors.

use std::fmt;

use mesh_protocol::{
    AgentCard, AgentName, Epoch, Frame, Mark, MsgId, NodeCard, NodeId, OpenBatch, Seq, SignedBatch,
    StreamId, VerifyError,
};
use mesh_store::{
    AgentOp, AgentRecord, Arrival, CURSOR_NAME_BYTES_MAX, DedupRecord, EndedOwn, InboxKind,
    InboxRow, InviteRecord, MeshStore, OwnStream, PeerRecord, Receipt, SUBSCRIBER_NAME_BYTES_MAX,
    StoreError, StoredBatch, WriteOp,
};

/// A point in time: milliseconds on the driver's clock.
///
/// The driver passes milliseconds since the Unix epoch, so the value doubles
/// as an envelope's `created_ms`; the core only compares and adds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl Millis {
    /// `self + ms`, saturating.
    pub fn plus(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }
}

/// A connection to a peer, named by the driver. Unique per connection for
/// the life of the core, so events of an old connection can be told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// A local send request, named by the driver; echoed in its [`Effect::Reply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReqId(pub u64);

impl ReqId {
    /// A send the core makes itself (a bounce): it is never answered. A
    /// driver never names a request with it.
    pub const INTERNAL: ReqId = ReqId(u64::MAX);
}

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
}

/// Why an agent card frame was refused at the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadCards {
    /// A card's signature does not verify under its agent key.
    #[error("an agent card does not verify")]
    BadSignature,
}

/// Verifies every card of an `Agents` frame: the only way cards reach the
/// core. Pure and thread-safe, run where the frame is read.
pub fn open_cards(cards: Vec<AgentCard>) -> Result<Vec<AgentCard>, BadCards> {
    if cards.iter().all(|c| c.verify().is_ok()) {
        Ok(cards)
    } else {
        Err(BadCards::BadSignature)
    }
}

/// One [`Effect::Persist`], named by the core; echoed in [`Input::Committed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitId(pub u64);

/// One [`Effect::LoadOutbox`], named by the core; echoed in [`Input::OutboxLoaded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LoadId(pub u64);

/// Why a peer's batch frame was refused before it reached the core's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadBatch {
    /// The signature does not verify under the author's key.
    #[error("bad signature")]
    BadSignature,
    /// The batch breaks a shape limit (entries, bytes, first seq).
    #[error("malformed batch")]
    Malformed,
    /// A payload does not match its signed hash, or the count differs.
    #[error("a payload does not match its signed hash")]
    CidMismatch,
}

/// Verifies a received batch's signature and every payload's hash: the only
/// way a peer's batch reaches the core. Pure and thread-safe; the driver runs
/// it in each connection's reader task, in parallel, off the node task.
pub fn open_batch(batch: SignedBatch, payloads: Vec<Vec<u8>>) -> Result<OpenBatch, BadBatch> {
    let verified = batch.verify().map_err(|e| match e {
        VerifyError::BadSignature(_) => BadBatch::BadSignature,
        _ => BadBatch::Malformed,
    })?;
    verified.open(payloads).map_err(|_| BadBatch::CidMismatch)
}

/// Something that happened, fed to [`crate::core::Core::handle`].
#[derive(Debug)]
pub enum Input {
    /// A connection to `peer` is live. The driver reports at most one live
    /// connection per peer: a replacing connection only after the old one's
    /// [`Input::PeerDisconnected`].
    PeerConnected {
        /// The peer (the connection's authenticated key).
        peer: NodeId,
        /// The connection.
        conn: ConnId,
    },
    /// The connection `conn` to `peer` is gone.
    PeerDisconnected {
        /// The peer.
        peer: NodeId,
        /// The connection.
        conn: ConnId,
    },
    /// A decoded frame other than a batch arrived from `peer` on `conn`
    /// (batches come as [`Input::Batch`]; a `Frame::Batch` here is dropped
    /// as malformed).
    Frame {
        /// The peer (the connection's authenticated key).
        peer: NodeId,
        /// The connection it came on.
        conn: ConnId,
        /// The frame.
        frame: Frame,
    },
    /// A batch frame from `peer` on `conn`, already checked by [`open_batch`]
    /// (`Err`: refused at the edge; the core only counts it).
    Batch {
        /// The peer (the connection's authenticated key).
        peer: NodeId,
        /// The connection it came on.
        conn: ConnId,
        /// The opened batch, or why it was refused.
        batch: Result<OpenBatch, BadBatch>,
    },
    /// A local client wants to send `payload` to `to`.
    Send {
        /// Names the request; the answer is an [`Effect::Reply`] with it.
        req: ReqId,
        /// The recipient node.
        to: NodeId,
        /// Application-defined kind; 0 is a plain message.
        kind: u16,
        /// The payload.
        payload: Vec<u8>,
    },
    /// A local client wants to send `payload` to `to` with `meta`: an agent
    /// message, or a send with a client id. Answered like [`Input::Send`].
    SendWith {
        /// Names the request.
        req: ReqId,
        /// The recipient node.
        to: NodeId,
        /// The kind of a plain message (ignored for an agent message).
        kind: u16,
        /// The payload (an agent message's body).
        payload: Vec<u8>,
        /// The agent addressing and client id.
        meta: SendMeta,
    },
    /// An `Agents` frame from `peer` on `conn`, its cards already checked
    /// by [`open_cards`] (`Err`: refused at the edge; only counted).
    Agents {
        /// The peer (the connection's authenticated key).
        peer: NodeId,
        /// The connection it came on.
        conn: ConnId,
        /// The verified cards, or why they were refused.
        cards: Result<Vec<AgentCard>, BadCards>,
    },
    /// A newly signed card of one of this node's agents (it went online or
    /// offline, or the node started): announced to every live peer, not
    /// stored. A card of an agent the core does not host is ignored.
    AgentCard {
        /// The card.
        card: AgentCard,
    },
    /// The store finished [`Effect::Persist`] `commit`: one result per group,
    /// in the order of the groups. If the transaction failed, every group
    /// carries the error.
    Committed {
        /// The commit.
        commit: CommitId,
        /// One result per group.
        results: Vec<Result<Receipt, StoreError>>,
    },
    /// The answer to [`Effect::LoadOutbox`] `load`: `MeshStore::read_outbox`.
    OutboxLoaded {
        /// The load.
        load: LoadId,
        /// What the store returned.
        result: Result<Vec<StoredBatch>, StoreError>,
    },
    /// The deadline of the last [`Effect::SetTimer`] has passed.
    Timer,
    /// A local write, queued for the next commit; the answer is an
    /// [`Effect::Written`] with `req` once it is committed (or refused).
    Write {
        /// Names the request.
        req: ReqId,
        /// What to write.
        write: LocalWrite,
    },
    /// Add `record.node` as a peer at `record.addrs`, or update the addresses
    /// of a known peer (the epoch the core recorded for it is kept; the one in
    /// `record` is ignored). The record is written with the next commit and
    /// takes effect in the core once that commit returns; the answer is an
    /// [`Effect::PeerChanged`] with `req`. Other peers and their connections
    /// are untouched. Tell the transport about the peer only after the answer,
    /// so no connection of it is reported before the core knows it.
    PeerAdded {
        /// Names the request.
        req: ReqId,
        /// The peer and where to dial it.
        record: PeerRecord,
    },
    /// Forget `node` as a peer (its streams and marks stay in the store).
    /// Written with the next commit; once that returns, the core drops the
    /// peer and its connection state and answers [`Effect::PeerChanged`].
    /// The driver then closes the peer's connection; its later
    /// [`Input::PeerDisconnected`] is harmless. Removing an unknown peer is
    /// not an error.
    PeerRemoved {
        /// Names the request.
        req: ReqId,
        /// The peer.
        node: NodeId,
    },
    /// This node issued a newer card (its name or addresses changed): it
    /// is written with the next commit and sent in every later Hello. A
    /// card of another node, or not newer than the one held, is ignored.
    OwnCard {
        /// The card, signed by this node with a larger `issued_ms`.
        card: NodeCard,
    },
}

/// Something the driver must do, drained with [`crate::core::Core::poll_effect`].
#[derive(Debug)]
pub enum Effect {
    /// Send `frame` to `peer` on `conn`. If the connection is gone, drop it.
    SendFrame {
        /// The peer.
        peer: NodeId,
        /// The connection the frame belongs to.
        conn: ConnId,
        /// The frame.
        frame: Frame,
    },
    /// Commit `groups` in one transaction (`MeshStore::commit`) and answer
    /// with [`Input::Committed`]. At most one is outstanding at a time.
    Persist {
        /// Names the commit.
        commit: CommitId,
        /// The groups; each is applied or refused as a whole.
        groups: Vec<Vec<WriteOp>>,
    },
    /// Read `MeshStore::read_outbox(stream, after, max_bytes)` and answer with
    /// [`Input::OutboxLoaded`]. Do it only after the frames emitted before it
    /// have been handed to the connection: that paces a catch-up to the peer.
    LoadOutbox {
        /// Names the load.
        load: LoadId,
        /// The peer being fed (for the driver's bookkeeping).
        peer: NodeId,
        /// The stream to read.
        stream: StreamId,
        /// Read batches holding any seq above this.
        after: Seq,
        /// Payload bytes to gather at most (beyond the first batch).
        max_bytes: u64,
    },
    /// The answer to [`Input::Send`] `req`: given only after the commit that
    /// holds the message returned, or when the send was refused.
    Reply {
        /// The request.
        req: ReqId,
        /// The message's stream and seq, or why it was not sent.
        result: Result<SendReceipt, SendError>,
    },
    /// The journal has committed entries up to `upto`; wake local subscribers.
    Journaled {
        /// The last arrival position written.
        upto: Arrival,
    },
    /// Feed [`Input::Timer`] once the clock reaches `at`. Replaces any
    /// earlier deadline; a timer that fires early or twice does no harm.
    SetTimer {
        /// The deadline.
        at: Millis,
    },
    /// The answer to [`Input::PeerAdded`] or [`Input::PeerRemoved`] `req`:
    /// the peer record is committed and the core uses it (or the commit
    /// failed and nothing changed).
    PeerChanged {
        /// The request.
        req: ReqId,
        /// The peer.
        node: NodeId,
        /// `Ok` once committed.
        result: Result<(), PeerChangeError>,
    },
    /// The answer to [`Input::Write`] `req`: given only after the commit
    /// that holds the write returned, or when it was refused.
    Written {
        /// The request.
        req: ReqId,
        /// The receipt (a lag record's arrival is in `arrivals`), or why
        /// nothing was written: [`StoreError::Conflict`] for a write the
        /// store's rules refuse, [`StoreError::Busy`] when too many wait.
        result: Result<Receipt, StoreError>,
    },
    /// This node's store went back in time and the core started a new
    /// store epoch (committed): local cursors of the old one no longer
    /// name this journal's positions.
    EpochChanged {
        /// The new epoch.
        epoch: Epoch,
    },
    /// A newer card of the peer `node` is committed: dial it at `addrs`
    /// from now on (at once, if it has no connection).
    PeerAddrs {
        /// The peer.
        node: NodeId,
        /// Where its newest card says it listens.
        addrs: Vec<std::net::SocketAddr>,
    },
    /// Close `conn` to `peer`: the peer broke the protocol. The core already
    /// ignores the connection; a later [`Input::PeerDisconnected`] is harmless.
    CloseConnection {
        /// The peer.
        peer: NodeId,
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: CloseReason,
    },
}

/// A write of local state, sequenced with every other commit of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LocalWrite {
    /// Set the named durable cursor `name` to `arrival` (≤ the journal head).
    PutCursor {
        /// The cursor's name (1..=[`mesh_store::CURSOR_NAME_BYTES_MAX`] bytes).
        name: String,
        /// The journal position.
        arrival: Arrival,
    },
    /// Journal that the local subscriber `subscriber` missed the live
    /// journal entries `from..=to` (arrivals, not seqs): it must re-read them.
    SubscriberLagged {
        /// Who lagged (1..=[`mesh_store::SUBSCRIBER_NAME_BYTES_MAX`] bytes).
        subscriber: String,
        /// First arrival missed.
        from: Arrival,
        /// Last arrival missed.
        to: Arrival,
    },
    /// As [`LocalWrite::SubscriberLagged`], for a subscription to `agent`'s
    /// inbox: the lag record goes to that inbox too.
    AgentLagged {
        /// The agent.
        agent: AgentName,
        /// Who lagged.
        subscriber: String,
        /// First arrival missed.
        from: Arrival,
        /// Last arrival missed.
        to: Arrival,
    },
    /// Add (or replace) a local agent. Once committed the core routes
    /// messages for it to its inbox; it is announced once its card comes
    /// ([`Input::AgentCard`]). Refused past [`mesh_protocol::MAX_AGENT_CARDS`] agents.
    PutAgent(AgentRecord),
    /// Remove a local agent (its inbox index and cursors; its journal
    /// entries stay); announced to every live peer once committed.
    RemoveAgent(AgentName),
    /// Set (`Some`) or clear the local alias `alias` of a node.
    PutAlias {
        /// The alias.
        alias: String,
        /// The node.
        node: Option<NodeId>,
    },
    /// Set an agent's named cursor to `arrival` (≤ the journal head).
    PutAgentCursor {
        /// The agent.
        agent: AgentName,
        /// The cursor's name (1..=[`mesh_store::CURSOR_NAME_BYTES_MAX`] bytes).
        name: String,
        /// The journal position.
        arrival: Arrival,
    },
    /// Write an invite's record (made, claimed, spent or revoked). The
    /// node's one owner of invites decides what; the core only sequences it.
    PutInvite(InviteRecord),
}

impl LocalWrite {
    /// The name it carries, and the longest the store takes (an invite
    /// carries none).
    pub(crate) fn name(&self) -> (&str, usize) {
        match self {
            LocalWrite::PutCursor { name, .. } | LocalWrite::PutAgentCursor { name, .. } => {
                (name, CURSOR_NAME_BYTES_MAX)
            }
            LocalWrite::SubscriberLagged { subscriber, .. }
            | LocalWrite::AgentLagged { subscriber, .. } => (subscriber, SUBSCRIBER_NAME_BYTES_MAX),
            LocalWrite::PutAgent(r) => (r.name.as_str(), mesh_protocol::MAX_AGENT_NAME_BYTES),
            LocalWrite::RemoveAgent(n) => (n.as_str(), mesh_protocol::MAX_AGENT_NAME_BYTES),
            LocalWrite::PutAlias { alias, .. } => (alias, mesh_store::ALIAS_BYTES_MAX),
            LocalWrite::PutInvite(_) => ("", 0),
        }
    }

    /// The store ops that write it, as one group.
    pub(crate) fn into_ops(self) -> Vec<WriteOp> {
        match self {
            LocalWrite::PutCursor { name, arrival } => vec![WriteOp::PutCursor { name, arrival }],
            LocalWrite::SubscriberLagged {
                subscriber,
                from,
                to,
            } => vec![WriteOp::RecordLag {
                subscriber,
                from,
                to,
            }],
            LocalWrite::AgentLagged {
                agent,
                subscriber,
                from,
                to,
            } => vec![
                WriteOp::RecordLag {
                    subscriber,
                    from,
                    to,
                },
                WriteOp::Agents(AgentOp::InboxLast {
                    agent,
                    row: InboxRow {
                        kind: InboxKind::Lagged,
                        verified: true,
                        in_reply_to: None,
                    },
                }),
            ],
            LocalWrite::PutAgent(r) => vec![WriteOp::Agents(AgentOp::PutAgent(r))],
            LocalWrite::RemoveAgent(n) => vec![WriteOp::Agents(AgentOp::RemoveAgent(n))],
            LocalWrite::PutAlias { alias, node } => {
                vec![WriteOp::Agents(AgentOp::PutAlias { alias, node })]
            }
            LocalWrite::PutAgentCursor {
                agent,
                name,
                arrival,
            } => vec![WriteOp::Agents(AgentOp::PutCursor {
                agent,
                name,
                arrival,
            })],
            LocalWrite::PutInvite(invite) => vec![WriteOp::PutInvite(invite)],
        }
    }
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
    /// The caller's fault: a recipient agent (or a reply) without a sending agent.
    #[error("only an agent message names a recipient agent or answers a message")]
    NotAnAgentMessage,
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
    /// was held, `held_ms` long; it was let go, never written, and a lost
    /// record is journaled once the store is back.
    #[error(
        "the store could not commit the message for {held_ms} ms ({why}); it was let go and never written"
    )]
    Held {
        /// How long it was held.
        held_ms: u64,
        /// The store's last error.
        why: String,
    },
    /// The environment: the store cannot commit now and as many sends as
    /// the node holds are held already; nothing was written.
    #[error(
        "the store cannot commit now ({why}) and {held} sends are held already; nothing was written"
    )]
    StoreDown {
        /// Sends held.
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

/// Why a peer change ([`Input::PeerAdded`], [`Input::PeerRemoved`]) was not made.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerChangeError {
    /// The caller's fault: a node cannot be its own peer.
    #[error("a node cannot be its own peer")]
    SelfPeer,
    /// Capacity: too many peer changes wait for the next commit; retry later.
    #[error("{waiting} peer changes are already waiting; retry later")]
    Busy {
        /// Peer changes waiting.
        waiting: usize,
    },
    /// The store did not write the change; nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why the core closes a connection: the peer broke the protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer is not a known peer.
    #[error("unknown peer")]
    UnknownPeer,
    /// The peer speaks another protocol version.
    #[error(
        "peer speaks agent-mesh protocol {theirs}, this node speaks {ours}; upgrade the older node"
    )]
    VersionMismatch {
        /// The peer's version.
        theirs: u32,
        /// Ours.
        ours: u32,
    },
    /// The peer's Hello names another node than the connection's key.
    #[error("hello names another node than the connection's key")]
    WrongNode,
    /// The peer sent no Hello after every retry of ours.
    #[error("no hello after {attempts} attempts")]
    NoHello {
        /// Hellos we sent.
        attempts: u32,
    },
    /// The peer sent another envelope at a seq this node committed: two
    /// writers share its key (a cloned data dir, or a store restored from
    /// a backup that has not seen our Hello yet).
    #[error(
        "identity conflict: another envelope at committed seq {seq}: two writers use this node's key"
    )]
    Conflict {
        /// The committed seq.
        seq: Seq,
    },
}

/// The committed state a core starts from: read from the store at start-up
/// (and after a crash), never kept up to date by anyone but the core.
#[derive(Clone, Debug)]
pub struct Recovered {
    /// The store's epoch.
    pub epoch: Epoch,
    /// `MeshStore::own_streams`.
    pub own_streams: Vec<OwnStream>,
    /// `MeshStore::marks`.
    pub marks: Vec<Mark>,
    /// `MeshStore::max_lamport`.
    pub max_lamport: u64,
    /// `MeshStore::peers`: the peers the core talks to.
    pub peers: Vec<PeerRecord>,
    /// `MeshStore::agents`: this node's agents.
    pub agents: Vec<AgentRecord>,
    /// `MeshStore::dedup`: retried-send records, oldest first.
    pub dedup: Vec<DedupRecord>,
    /// `MeshStore::ended_own`: own streams of earlier epochs.
    pub ended_own: Vec<EndedOwn>,
    /// Randomness for the epoch this node starts if its store went back in
    /// time: the driver fills it from its RNG (zeros from [`Recovered::read`]),
    /// so a core stays deterministic given its inputs.
    pub entropy: [u8; 32],
    /// `MeshStore::cards`: this node's newest card and its peers'.
    pub cards: Vec<NodeCard>,
}

impl Recovered {
    /// Reads the committed state from `store` (blocking reads; call before
    /// starting the core, never from inside it).
    pub fn read<S: MeshStore + ?Sized>(store: &S) -> Result<Recovered, StoreError> {
        Ok(Recovered {
            epoch: store.meta().epoch,
            own_streams: store.own_streams()?,
            marks: store.marks()?,
            max_lamport: store.max_lamport()?,
            peers: store.peers()?,
            agents: store.agents()?,
            dedup: store.dedup()?,
            ended_own: store.ended_own()?,
            entropy: [0; 32],
            cards: store.cards()?,
        })
    }
}
