//! The durable store of agent-mesh: one redb file per node, written by one
//! actor that groups whatever is queued into one durable transaction.
//!
//! [`MeshStore`] is the typed contract; [`RedbStore`] keeps it on disk and
//! [`MemStore`] keeps it in memory for the simulator and unit tests.
//! [`StoreHandle`] is the group-commit writer actor in front of either.
//! The design is in `docs/design.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod actor;
mod agents;
mod logic;
mod mem;
mod redb_store;
mod types;

#[cfg(any(test, feature = "test-util"))]
pub mod testing;
#[cfg(test)]
mod tests;

pub use actor::{
    GROUP_COMMIT_BYTES_MAX, GROUP_COMMIT_GROUPS_MAX, StoreHandle, WRITE_QUEUE_REQUESTS_MAX,
};
pub use agents::{
    ALIAS_BYTES_MAX, AgentIndex, AgentOp, AgentRecord, CLIENT_ID_BYTES_MAX, DedupKey, DedupRecord,
    InboxItem, InboxKind, InboxRow, MessageDir, MessageRow, RESUMED_CURSOR, ReadMark,
};
pub use logic::{
    CURSOR_NAME_BYTES_MAX, DETAIL_BYTES_MAX, JOURNAL_TIME_STEP_MS, SUBSCRIBER_NAME_BYTES_MAX,
    TRIM_ROWS_MAX,
};
pub use mem::MemStore;
pub use redb_store::{CACHE_BYTES, RedbStore, STORE_FILE_NAME};
pub use types::{
    Arrival, EndedOwn, Eviction, INVITE_SPEND_REQUESTS_MAX, INVITE_USES_MAX, InviteRecord,
    InviteSpend, JournalBounds, JournalItem, JournalRecord, LossReason, OnFull, OutboxBounds,
    OwnStream, PeerRecord, ReadReport, Receipt, StoreMeta, StoredBatch, TOPICS_MAX, TopicRecord,
    TrimReport, WriteOp,
};

use mesh_protocol::{InviteId, Mark, NodeCard, Seq, StreamId};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: u32 = 5;

/// Errors from the store, grouped by who is at fault.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another process (or handle) holds the data dir's store open.
    #[error(
        "the store at {path} is already open by another mesh process; stop it first or use another --data dir"
    )]
    AlreadyOpen {
        /// The store file.
        path: String,
    },
    /// The file is damaged or is not an agent-mesh store; it is never reset silently.
    #[error(
        "the store at {path} is damaged or not an agent-mesh store: {why}. It was not changed; move it aside to start a new store"
    )]
    Corrupt {
        /// The store file.
        path: String,
        /// What was found.
        why: String,
    },
    /// The file was written by a newer (or unknown) schema version.
    #[error("the store at {path} has schema version {found}; this build reads version {supported}")]
    SchemaVersion {
        /// The store file.
        path: String,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// One caller's ops failed a check against the stored state; nothing of
    /// theirs was written. This is a bug in the caller (or a race it must handle).
    #[error("write refused: {0}")]
    Conflict(String),
    /// Capacity: too many writes already wait for the store (refused
    /// before it was reached); nothing was written, retry later.
    #[error("{waiting} writes are already waiting for the store; retry later")]
    Busy {
        /// Writes waiting.
        waiting: usize,
    },
    /// The disk or the database failed; the transaction was not committed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The writer actor has stopped.
    #[error("the store writer has stopped")]
    Closed,
}

/// The store's typed contract. Reads see only committed state.
///
/// `commit` applies each caller's group of ops in one transaction made
/// durable before it returns (`Durability::Immediate` on disk): a group's
/// result is `Ok` only if its writes are durable.
pub trait MeshStore: Send + Sync + 'static {
    /// Epoch and schema version. The epoch changes only with a committed
    /// [`WriteOp::NewEpoch`].
    fn meta(&self) -> StoreMeta;

    /// Applies `groups` in one durable transaction and answers each group.
    ///
    /// A group whose checks fail gets [`StoreError::Conflict`] and writes
    /// nothing; the others still commit. If the transaction itself fails,
    /// every group gets the error.
    fn commit(&self, groups: Vec<Vec<WriteOp>>) -> Vec<Result<Receipt, StoreError>>;

    /// Author-side state of every stream this node writes, and of every
    /// other member's topic stream whose batches it holds for relaying
    /// (their `last_acked` is one below `next_seq`: all of it may go).
    fn own_streams(&self) -> Result<Vec<OwnStream>, StoreError>;

    /// Every receiver mark this node holds, with the payload hash of the
    /// envelope at each mark where it is known.
    fn marks(&self) -> Result<Vec<Mark>, StoreError>;

    /// Outbox batches of `stream` that hold any seq above `after`, in order,
    /// at most `max_bytes` of payload in all, except that the first batch
    /// that qualifies is always returned whatever its size. A batch is
    /// returned whole even if it starts at or below `after`.
    fn read_outbox(
        &self,
        stream: &StreamId,
        after: Seq,
        max_bytes: u64,
    ) -> Result<Vec<StoredBatch>, StoreError>;

    /// Up to `limit` journal entries after `after`, in arrival order, and
    /// no more once `max_bytes` of payload and text are read (the entry
    /// that crosses it is the last; the first is always given). If `after`
    /// is before the retained journal, the first entry is a
    /// [`JournalRecord::Trimmed`] naming the trimmed arrivals from
    /// `after + 1` on, at the last of them: never a silent skip.
    fn journal_page(
        &self,
        after: Arrival,
        limit: usize,
        max_bytes: u64,
    ) -> Result<Vec<JournalItem>, StoreError>;

    /// Up to `limit` journal entries after `after`, in arrival order
    /// ([`MeshStore::journal_page`] without a byte bound).
    fn journal(&self, after: Arrival, limit: usize) -> Result<Vec<JournalItem>, StoreError> {
        self.journal_page(after, limit, u64::MAX)
    }

    /// The journal's retained range and the bytes it takes.
    fn journal_bounds(&self) -> Result<JournalBounds, StoreError>;

    /// The last arrival position written (0 if nothing was ever journaled).
    fn journal_head(&self) -> Result<Arrival, StoreError> {
        Ok(self.journal_bounds()?.head)
    }

    /// Every known peer.
    fn peers(&self) -> Result<Vec<PeerRecord>, StoreError>;

    /// The newest card held of each node (this node's own and its peers').
    fn cards(&self) -> Result<Vec<NodeCard>, StoreError>;

    /// Every invite this node handed out, by id.
    fn invites(&self) -> Result<Vec<InviteRecord>, StoreError>;

    /// One invite, if it exists.
    fn invite(&self, id: &InviteId) -> Result<Option<InviteRecord>, StoreError>;

    /// Every topic this node is a member of, by name. A store written
    /// before topics existed reads as a member of none.
    fn topics(&self) -> Result<Vec<TopicRecord>, StoreError>;

    /// A named durable cursor, if set.
    fn cursor(&self, name: &str) -> Result<Option<Arrival>, StoreError>;

    /// The highest Lamport clock of any envelope this store ever committed
    /// (own or received); it does not go down when envelopes are evicted.
    fn max_lamport(&self) -> Result<u64, StoreError>;

    // Agents (`agents.rs`). A store written before these tables existed
    // reads as having none of their rows.

    /// Every local agent, by name.
    fn agents(&self) -> Result<Vec<AgentRecord>, StoreError>;

    /// Up to `limit` entries of `agent`'s inbox after arrival `after`, in
    /// arrival order, with their journal entries.
    fn inbox(
        &self,
        agent: &mesh_protocol::AgentName,
        after: Arrival,
        limit: usize,
    ) -> Result<Vec<InboxItem>, StoreError>;

    /// The message index's row of `id`, if this node sent or received it.
    fn message(&self, id: &mesh_protocol::MsgId) -> Result<Option<MessageRow>, StoreError>;

    /// Every retried-send record, oldest first.
    fn dedup(&self) -> Result<Vec<DedupRecord>, StoreError>;

    /// The move notice held of each agent that moved, by agent key.
    fn moves(&self) -> Result<Vec<mesh_protocol::AgentMove>, StoreError>;

    /// Every node alias, by alias.
    fn aliases(&self) -> Result<Vec<(String, mesh_protocol::NodeId)>, StoreError>;

    /// An agent's named cursor, if set.
    fn agent_cursor(
        &self,
        agent: &mesh_protocol::AgentName,
        name: &str,
    ) -> Result<Option<Arrival>, StoreError>;
    /// The own streams of earlier epochs of this store (see [`WriteOp::NewEpoch`]).
    fn ended_own(&self) -> Result<Vec<EndedOwn>, StoreError>;
}
