//! What the rules read from a store ([`Base`]) and the primitive writes
//! they plan for it ([`Write`]), which each implementation applies.

use mesh_protocol::{Cid, Epoch, NodeCard, NodeId, Seq, SignedBatch, StreamId, TopicName};

use crate::agents::AgentWrite;
use crate::{
    Arrival, EndedOwn, InviteRecord, JournalRecord, OwnStream, PeerRecord, StoreError, TopicRecord,
};

/// The places in `batch` (which starts at its first seq) of its agent
/// messages at seq `from` or later.
pub(crate) fn agent_entries(batch: &SignedBatch, from: Seq) -> Vec<usize> {
    (batch.first_seq..)
        .zip(&batch.entries)
        .enumerate()
        .filter(|(_, (seq, e))| *seq >= from && e.kind == mesh_protocol::KIND_AGENT)
        .map(|(i, _)| i)
        .collect()
}

/// What the rules need to know about one stored outbox batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchMeta {
    pub(crate) last_seq: Seq,
    pub(crate) msgs: u64,
    pub(crate) bytes: u64,
}

impl BatchMeta {
    pub(crate) fn of(batch: &mesh_protocol::SignedBatch) -> Self {
        BatchMeta {
            last_seq: batch.last_seq(),
            msgs: batch.entries.len() as u64,
            bytes: batch.entries.iter().map(|e| u64::from(e.payload_len)).sum(),
        }
    }
}

/// One journal row as trimming sees it: its arrivals, the bytes it takes,
/// and, for a run of envelopes, its stream and seqs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RowInfo {
    pub(crate) first: Arrival,
    pub(crate) last: Arrival,
    pub(crate) bytes: u64,
    /// The stream, the first seq and the number of envelopes of a run.
    pub(crate) run: Option<(StreamId, Seq, u64)>,
}

/// Read access to the committed state (including groups applied earlier in
/// the same transaction). An error here fails the whole transaction.
pub(crate) trait Base {
    /// The store's path or name, for messages.
    fn name(&self) -> &str;
    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, StoreError>;
    /// Every own stream.
    fn own_streams(&mut self) -> Result<Vec<OwnStream>, StoreError>;
    fn batch_meta(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<BatchMeta>, StoreError>;
    /// The first seq and meta of the outbox batch of `stream` that starts
    /// last at or before `seq`.
    fn batch_holding(
        &mut self,
        stream: &StreamId,
        seq: Seq,
    ) -> Result<Option<(Seq, BatchMeta)>, StoreError>;
    /// The journal arrival of the first envelope of the outbox batch of
    /// `stream` at `first_seq` (0: never journaled).
    fn batch_first_arrival(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<Arrival>, StoreError>;
    /// Whether the payloads of the outbox batch of `stream` at `first_seq`
    /// are kept in the outbox (its journal rows are trimmed or it was never journaled).
    fn batch_moved(&mut self, stream: &StreamId, first_seq: Seq) -> Result<bool, StoreError>;
    /// The payloads of the agent messages (kind `KIND_AGENT`) at seq
    /// `from` or later of the outbox batch of `stream` at `first_seq`, as
    /// committed before this group (`None`: no such batch). A batch with
    /// no such entry is answered without reading a payload.
    fn agent_payloads(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
        from: Seq,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError>;
    /// Whether the message index has `id`, as sent or received, and at
    /// which arrival, as committed before this group.
    fn message_place(
        &mut self,
        id: &mesh_protocol::MsgId,
    ) -> Result<Option<(crate::MessageDir, Arrival)>, StoreError>;
    /// The node this node sent the message `id` to, if the message index
    /// has it as sent, as committed before this group.
    fn sent_to(&mut self, id: &mesh_protocol::MsgId) -> Result<Option<NodeId>, StoreError>;
    /// Whether the sent message `id` is marked read (`read-v1`), as
    /// committed before this group.
    fn is_read(&mut self, id: &mesh_protocol::MsgId) -> Result<bool, StoreError>;
    /// The arrival of the last inbox entry made here from a forward of
    /// `id` that the message index had already ([`crate::AgentIndex::ForwardTaken`]).
    fn forward_taken(&mut self, id: &mesh_protocol::MsgId) -> Result<Option<Arrival>, StoreError>;
    /// An agent's named cursor, as committed before this group.
    fn agent_cursor(
        &mut self,
        agent: &mesh_protocol::AgentName,
        name: &str,
    ) -> Result<Option<Arrival>, StoreError>;
    /// Whether `agent`'s inbox has an entry after arrival `after`.
    fn inbox_after(
        &mut self,
        agent: &mesh_protocol::AgentName,
        after: Arrival,
    ) -> Result<bool, StoreError>;
    /// Whether `agent` is a local agent of this node.
    fn is_agent(&mut self, agent: &mesh_protocol::AgentName) -> Result<bool, StoreError>;
    fn mark(&mut self, stream: &StreamId) -> Result<Option<Seq>, StoreError>;
    /// Up to `max` committed journal rows from the one holding `from` on.
    fn journal_rows(&mut self, from: Arrival, max: usize) -> Result<Vec<RowInfo>, StoreError>;
    /// The dated journal positions (first arrival of a commit, its time),
    /// in order, from the first after `after` on, at most `max`.
    fn journal_times(
        &mut self,
        after: Arrival,
        max: usize,
    ) -> Result<Vec<(Arrival, u64)>, StoreError>;
    fn ended(&mut self, stream: &StreamId) -> Result<Option<EndedOwn>, StoreError>;
    /// Every topic this node is a member of.
    fn topics(&mut self) -> Result<Vec<TopicRecord>, StoreError>;
}

/// One primitive write, applied in order.
#[derive(Debug)]
pub(crate) enum Write {
    OwnStream(OwnStream),
    /// Forget an own stream's row.
    DelOwn(StreamId),
    /// An own batch; its payloads are the journal's envelopes from
    /// `first_arrival` on, written earlier in the same group, unless a
    /// [`Write::PutPayloads`] keeps them in the outbox.
    PutBatch {
        first_seq: Seq,
        batch: SignedBatch,
        first_arrival: Arrival,
    },
    /// Removes an outbox batch and the payloads the outbox keeps for it.
    DelBatch {
        stream: StreamId,
        first_seq: Seq,
    },
    /// Removes every outbox batch of a stream (and their kept payloads).
    DropOutbox(StreamId),
    /// Keeps the payloads of an outbox batch in the outbox.
    PutPayloads {
        stream: StreamId,
        first_seq: Seq,
        payloads: Vec<Vec<u8>>,
    },
    /// Copies the payloads of the outbox batch at `first_seq` (of `n`
    /// envelopes, journaled from `first_arrival`) from the journal into the
    /// outbox; comes before the journal rows it reads are removed.
    MovePayloads {
        stream: StreamId,
        first_seq: Seq,
        first_arrival: Arrival,
        n: u64,
    },
    /// Removes the journal rows from `first` through `last` (row boundaries).
    DelJournal {
        first: Arrival,
        last: Arrival,
    },
    /// Removes the journal's dated positions before this one.
    DelTimesBefore(Arrival),
    Mark {
        stream: StreamId,
        seq: Seq,
    },
    /// The payload hash of the envelope at a stream's mark (`None`: unknown).
    MarkCid {
        stream: StreamId,
        cid: Option<Cid>,
    },
    Ended(EndedOwn),
    Journal {
        arrival: Arrival,
        record: JournalRecord,
    },
    PutPeer(PeerRecord),
    /// Forgets the peer and its card.
    RemovePeer(NodeId),
    Cursor {
        name: String,
        arrival: Arrival,
    },
    /// The store's epoch changes.
    Epoch(Epoch),
    PutCard(NodeCard),
    PutInvite(InviteRecord),
    PutTopic(TopicRecord),
    DelTopic(TopicName),
    /// An agent table write (`crate::agents`).
    Agents(AgentWrite),
}
