//! What goes into the core and what comes out: inputs, effects, ids, errors.
//!
//! The ids and the two enums the driver speaks with the core live here; the
//! edge's checks ([`open_batch`], [`open_cards`]), the send path's types and
//! local writes have their own modules, re-exported at this path.

mod edge;
mod send;
mod write;

use std::fmt;

use mesh_protocol::{AgentCard, Epoch, Frame, Mark, NodeCard, NodeId, OpenBatch, Seq, StreamId};
use mesh_store::{
    AgentRecord, Arrival, DedupRecord, EndedOwn, MeshStore, OwnStream, PeerRecord, Receipt,
    StoreError, StoredBatch, WriteOp,
};

pub use edge::{BadBatch, BadCards, open_batch, open_cards, open_moves};
pub use send::{Publication, SendError, SendMeta, SendReceipt};
pub use write::LocalWrite;

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

/// One [`Effect::Persist`], named by the core; echoed in [`Input::Committed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitId(pub u64);

/// One [`Effect::LoadOutbox`], named by the core; echoed in [`Input::OutboxLoaded`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LoadId(pub u64);

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
    /// A local client publishes `msgs` to `topic`, of which this node is
    /// a member, in order: each answered like [`Input::Send`] once
    /// committed, the receipt naming this node's stream of the topic. The
    /// messages are queued together or refused together (each answered
    /// with the same error), so a batch never commits with a hole.
    Publish {
        /// The topic.
        topic: mesh_protocol::TopicName,
        /// The messages, each with its request.
        msgs: Vec<Publication>,
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
    /// Pass on `payload`, a [`mesh_protocol::Forward`] of a message that
    /// came for an agent of this node that moved to `to` before this node
    /// learned of the move (the daemon reads them from the agent's inbox),
    /// or a [`mesh_protocol::ForwardTrimmed`] in the place of ones its
    /// journal retention removed first. Sent and answered as a send is;
    /// refused unless it decodes as its `kind`.
    Forward {
        /// Answered with its receipt once committed.
        req: ReqId,
        /// The agent's new host.
        to: NodeId,
        /// [`mesh_protocol::KIND_FORWARD`] or [`mesh_protocol::KIND_FORWARD_TRIMMED`].
        kind: u16,
        /// The forward.
        payload: Vec<u8>,
    },
    /// A `Moves` frame from `peer` on `conn`, its notices already checked
    /// by [`open_moves`] (`Err`: refused at the edge; only counted).
    Moves {
        /// The peer (the connection's authenticated key).
        peer: NodeId,
        /// The connection it came on.
        conn: ConnId,
        /// The verified notices, or why they were refused.
        notices: Result<Vec<mesh_protocol::AgentMove>, BadCards>,
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
    /// A move notice won over the one held of its agent (this node's own
    /// import, committed, or one a peer passed on): where the agent is now.
    AgentMoved {
        /// The notice.
        notice: mesh_protocol::AgentMove,
    },
    /// The agents (by key) that moved away from this node whose every
    /// peer follows the move and has been received as far as it said:
    /// nothing more comes here for them, so their drain may end once
    /// their previous inbox is passed on. The whole set, each time it
    /// changes.
    DrainsFollowed {
        /// The agents' keys.
        agents: Vec<NodeId>,
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
        "identity conflict: another envelope at seq {seq} than the one held: two writers use this node's key"
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
    /// Of the agent messages those records name, each one a later message
    /// of its key superseded, and by what (`MeshStore::message`): a retry
    /// after a restart is answered with `superseded_by` as the first was.
    pub dedup_superseded: Vec<(mesh_protocol::MsgId, mesh_protocol::MsgId)>,
    /// `MeshStore::ended_own`: own streams of earlier epochs.
    pub ended_own: Vec<EndedOwn>,
    /// Randomness for the epoch this node starts if its store went back in
    /// time: the driver fills it from its RNG (zeros from [`Recovered::read`]),
    /// so a core stays deterministic given its inputs.
    pub entropy: [u8; 32],
    /// `MeshStore::cards`: this node's newest card and its peers'.
    pub cards: Vec<NodeCard>,
    /// `MeshStore::topics`: the topics this node is a member of.
    pub topics: Vec<mesh_store::TopicRecord>,
    /// `MeshStore::moves`: the move notice held of each agent that moved.
    pub moves: Vec<mesh_protocol::AgentMove>,
}

impl Recovered {
    /// Reads the committed state from `store` (blocking reads; call before
    /// starting the core, never from inside it).
    pub fn read<S: MeshStore + ?Sized>(store: &S) -> Result<Recovered, StoreError> {
        let dedup = store.dedup()?;
        let mut dedup_superseded = Vec::new();
        for id in dedup.iter().filter_map(|r| r.msg) {
            if let Some(by) = store.message(&id)?.and_then(|row| row.superseded_by) {
                dedup_superseded.push((id, by));
            }
        }
        Ok(Recovered {
            epoch: store.meta().epoch,
            own_streams: store.own_streams()?,
            marks: store.marks()?,
            max_lamport: store.max_lamport()?,
            peers: store.peers()?,
            agents: store.agents()?,
            dedup,
            dedup_superseded,
            ended_own: store.ended_own()?,
            entropy: [0; 32],
            cards: store.cards()?,
            topics: store.topics()?,
            moves: store.moves()?,
        })
    }
}
