//! Test doubles of the store, for this crate's tests and (with the
//! `test-util` feature) other crates' tests: a [`MemStore`] whose commits
//! pass through a [`CommitHook`], to play a slow, failing or gated disk.

use std::ops::Deref;

use mesh_protocol::{AgentName, InviteId, Mark, MsgId, NodeCard, NodeId, Seq, StreamId};

use crate::{
    AgentRecord, Arrival, DedupRecord, EndedOwn, InboxItem, InviteRecord, JournalBounds,
    JournalItem, MemStore, MeshStore, MessageRow, OwnStream, PeerRecord, Receipt, StoreError,
    StoreMeta, StoredBatch, WriteOp,
};

/// What a [`Hooked`] store does with each commit.
pub trait CommitHook: Send + Sync + 'static {
    /// Answers `groups`: commits them to `inner` (before or after waiting,
    /// counting, ...) or fails them without touching it.
    fn commit(
        &self,
        inner: &MemStore,
        groups: Vec<Vec<WriteOp>>,
    ) -> Vec<Result<Receipt, StoreError>>;
}

/// A [`MemStore`] whose commits go through `H`; every read is the inner
/// store's. Derefs to the hook, so a test reaches the hook's switches.
pub struct Hooked<H> {
    inner: MemStore,
    hook: H,
}

impl<H: CommitHook> Hooked<H> {
    /// `inner`, its commits passed through `hook`.
    pub fn new(inner: MemStore, hook: H) -> Self {
        Hooked { inner, hook }
    }

    /// The store the reads and the hook's commits go to.
    pub fn inner(&self) -> &MemStore {
        &self.inner
    }
}

impl<H> Deref for Hooked<H> {
    type Target = H;

    fn deref(&self) -> &H {
        &self.hook
    }
}

impl<H: CommitHook> MeshStore for Hooked<H> {
    fn meta(&self) -> StoreMeta {
        self.inner.meta()
    }
    fn commit(&self, groups: Vec<Vec<WriteOp>>) -> Vec<Result<Receipt, StoreError>> {
        self.hook.commit(&self.inner, groups)
    }
    fn own_streams(&self) -> Result<Vec<OwnStream>, StoreError> {
        self.inner.own_streams()
    }
    fn marks(&self) -> Result<Vec<Mark>, StoreError> {
        self.inner.marks()
    }
    fn read_outbox(
        &self,
        stream: &StreamId,
        after: Seq,
        max_bytes: u64,
    ) -> Result<Vec<StoredBatch>, StoreError> {
        self.inner.read_outbox(stream, after, max_bytes)
    }
    fn journal_page(
        &self,
        after: Arrival,
        limit: usize,
        max_bytes: u64,
    ) -> Result<Vec<JournalItem>, StoreError> {
        self.inner.journal_page(after, limit, max_bytes)
    }
    fn journal(&self, after: Arrival, limit: usize) -> Result<Vec<JournalItem>, StoreError> {
        self.inner.journal(after, limit)
    }
    fn journal_bounds(&self) -> Result<JournalBounds, StoreError> {
        self.inner.journal_bounds()
    }
    fn journal_head(&self) -> Result<Arrival, StoreError> {
        self.inner.journal_head()
    }
    fn peers(&self) -> Result<Vec<PeerRecord>, StoreError> {
        self.inner.peers()
    }
    fn cards(&self) -> Result<Vec<NodeCard>, StoreError> {
        self.inner.cards()
    }
    fn invites(&self) -> Result<Vec<InviteRecord>, StoreError> {
        self.inner.invites()
    }
    fn invite(&self, id: &InviteId) -> Result<Option<InviteRecord>, StoreError> {
        self.inner.invite(id)
    }
    fn topics(&self) -> Result<Vec<crate::TopicRecord>, StoreError> {
        self.inner.topics()
    }
    fn cursor(&self, name: &str) -> Result<Option<Arrival>, StoreError> {
        self.inner.cursor(name)
    }
    fn max_lamport(&self) -> Result<u64, StoreError> {
        self.inner.max_lamport()
    }
    fn agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        self.inner.agents()
    }
    fn inbox(
        &self,
        agent: &AgentName,
        after: Arrival,
        limit: usize,
    ) -> Result<Vec<InboxItem>, StoreError> {
        self.inner.inbox(agent, after, limit)
    }
    fn message(&self, id: &MsgId) -> Result<Option<MessageRow>, StoreError> {
        self.inner.message(id)
    }
    fn dedup(&self) -> Result<Vec<DedupRecord>, StoreError> {
        self.inner.dedup()
    }
    fn aliases(&self) -> Result<Vec<(String, NodeId)>, StoreError> {
        self.inner.aliases()
    }
    fn moves(&self) -> Result<Vec<mesh_protocol::AgentMove>, StoreError> {
        self.inner.moves()
    }
    fn agent_cursor(&self, agent: &AgentName, name: &str) -> Result<Option<Arrival>, StoreError> {
        self.inner.agent_cursor(agent, name)
    }
    fn ended_own(&self) -> Result<Vec<EndedOwn>, StoreError> {
        self.inner.ended_own()
    }
}
