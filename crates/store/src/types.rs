//! The store's typed contract: what can be written (in one transaction) and
//! what can be read back. Both implementations — redb on disk and the
//! in-memory model used by the simulator — honour exactly this contract.

use std::net::SocketAddr;

use mesh_protocol::{
    Cid, Epoch, NodeCard, NodeId, OpenBatch, Seq, SignedBatch, StreamId, TopicName,
};
use serde::{Deserialize, Serialize};

mod invites;

pub use invites::{INVITE_SPEND_REQUESTS_MAX, INVITE_USES_MAX, InviteRecord, InviteSpend};

/// A position in the local journal. Dense, starting at 1; 0 is "before the first".
pub type Arrival = u64;

/// What the store knows about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreMeta {
    /// The store's epoch, made at creation.
    pub epoch: Epoch,
    /// The schema version the file was written with.
    pub schema_version: u32,
}

/// The author-side state of one stream this node writes.
///
/// Invariants (see [`OwnStream::broken`]): `first_retained <= next_seq`,
/// and the outbox holds every seq in between (`msgs == next_seq -
/// first_retained`, so it is empty iff they are equal); `last_acked <
/// next_seq`; the evictable envelopes are a
/// part of the retained ones, starting at `first_retained` and ending at or
/// below `last_acked`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnStream {
    /// The stream.
    pub stream: StreamId,
    /// The seq the next envelope gets.
    pub next_seq: Seq,
    /// The oldest seq still in the outbox (`next_seq` when empty).
    pub first_retained: Seq,
    /// The highest seq the recipient has acknowledged.
    pub last_acked: Seq,
    /// Envelopes in the outbox.
    pub msgs: u64,
    /// Payload bytes in the outbox.
    pub bytes: u64,
    /// Envelopes in the outbox's oldest batches that lie wholly at or below
    /// `last_acked`: what can be evicted without losing anything.
    pub evictable_msgs: u64,
    /// Payload bytes of those envelopes.
    pub evictable_bytes: u64,
}

impl OwnStream {
    /// The state of `stream` before its first message.
    pub fn empty(stream: StreamId) -> OwnStream {
        OwnStream {
            stream,
            next_seq: 1,
            first_retained: 1,
            last_acked: 0,
            msgs: 0,
            bytes: 0,
            evictable_msgs: 0,
            evictable_bytes: 0,
        }
    }

    /// Which invariant this state breaks, if any.
    pub fn broken(&self) -> Option<&'static str> {
        let retained = self.next_seq.checked_sub(self.first_retained);
        if self.next_seq == 0 || self.first_retained == 0 {
            Some("seqs start at 1")
        } else if retained.is_none() {
            Some("first_retained is past next_seq")
        } else if retained != Some(self.msgs) {
            // Whole batches are kept, so every seq from first_retained on is.
            Some("msgs does not match the retained seqs")
        } else if self.last_acked >= self.next_seq {
            Some("last_acked is not below next_seq")
        } else if self.evictable_msgs > self.msgs || self.evictable_bytes > self.bytes {
            Some("more is evictable than is retained")
        } else if self.evictable_msgs == 0 && self.evictable_bytes > 0 {
            Some("evictable bytes without evictable envelopes")
        } else if self.evictable_msgs > 0
            && self.first_retained + self.evictable_msgs > self.last_acked + 1
        {
            Some("evictable envelopes above last_acked")
        } else {
            None
        }
    }
}

/// A batch as kept in the outbox: the signed batch exactly as signed, and its payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBatch {
    /// The signed batch, byte for byte as it was signed.
    pub batch: SignedBatch,
    /// One payload per entry.
    pub payloads: Vec<Vec<u8>>,
}

/// Why envelopes were given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum LossReason {
    /// The author's outbox was full and its policy is `evict-oldest`.
    OutboxEvicted,
    /// A live subscriber stopped reading with its buffer full (the journal still has the entries).
    SubscriberLagged,
}

/// One journal entry's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum JournalRecord {
    /// An envelope: one this node sent (`stream.author` is this node) or received.
    Envelope {
        /// Its stream.
        stream: StreamId,
        /// Its seq.
        seq: Seq,
        /// The author's Lamport clock.
        lamport: u64,
        /// The author's wall clock, ms since the Unix epoch.
        created_ms: u64,
        /// Application-defined kind.
        kind: u16,
        /// The payload.
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    /// The receiver can never have `from..=to` of `stream`: the author no longer holds it.
    Gap {
        /// The stream.
        stream: StreamId,
        /// First missing seq.
        from: Seq,
        /// Last missing seq.
        to: Seq,
    },
    /// Envelopes `from..=to` of `stream` were given up for `reason`.
    Loss {
        /// The stream.
        stream: StreamId,
        /// First lost seq.
        from: Seq,
        /// Last lost seq.
        to: Seq,
        /// Why.
        reason: LossReason,
        /// Free text for a person (e.g. which subscriber lagged).
        detail: String,
    },
    /// The local subscriber `subscriber` missed the live journal entries at
    /// arrivals `from..=to`; they are still in the journal, to be re-read.
    // Appended last: a variant's place is its stored encoding.
    SubscriberLagged {
        /// Who lagged, for a person.
        subscriber: String,
        /// First arrival not delivered live.
        from: Arrival,
        /// Last arrival not delivered live.
        to: Arrival,
    },
    /// `msgs` local sends to `to` (`bytes` payload bytes, taken between
    /// `first_ms` and `last_ms`) were held while the store could not
    /// commit them, longer than the hold bound, and let go: their senders
    /// were answered 503, and none of them was ever written or sent.
    SendsLost {
        /// The recipient node.
        to: NodeId,
        /// How many sends.
        msgs: u64,
        /// Their payload bytes.
        bytes: u64,
        /// When the first of them was taken (ms since the Unix epoch).
        first_ms: u64,
        /// When the last of them was taken.
        last_ms: u64,
        /// Free text for a person (the hold bound, the store's error).
        detail: String,
    },
    /// The author of `stream` started a new store epoch: this node holds
    /// the stream up to `last`, and nothing later of it can ever arrive.
    EpochEnded {
        /// The ended stream.
        stream: StreamId,
        /// The last seq this node holds (its mark).
        last: Seq,
    },
    /// The author's store of `stream` went back in time (a restored
    /// backup, or a clone writing the same stream): seqs `from..=to` are
    /// what the world saw of the stream but the author's store lost, or
    /// holds other envelopes under. Journaled by the author when a peer
    /// shows it the range, and by the receiver from the author's word.
    RolledBack {
        /// The stream.
        stream: StreamId,
        /// First seq concerned.
        from: Seq,
        /// Last seq concerned.
        to: Seq,
        /// Free text for a person (what was re-sent where).
        detail: String,
    },
    /// A batch of `stream` came with another envelope at `seq` than the one
    /// committed here (`ours`, `theirs`: the payload hashes): two writers
    /// used one (author, epoch, seq). It was not taken.
    Conflict {
        /// The stream.
        stream: StreamId,
        /// The seq.
        seq: Seq,
        /// The payload hash committed here.
        ours: Cid,
        /// The payload hash the batch carried.
        theirs: Cid,
    },
    /// Never stored: a read from before the retained journal gets this
    /// first, naming the arrivals `from..=to` retention has trimmed.
    Trimmed {
        /// First trimmed arrival the read asked for.
        from: Arrival,
        /// Last trimmed arrival.
        to: Arrival,
    },
    /// The drain of `agent`, which moved to `to`, ended: what came for it
    /// here up to this entry was passed on to `to`; it is no longer an
    /// agent of this node (what comes for it later is bounced).
    DrainEnded {
        /// The agent.
        agent: mesh_protocol::AgentName,
        /// Its host now.
        to: NodeId,
        /// Free text for a person (why it ended).
        detail: String,
    },
}

/// A journal entry with its arrival position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalItem {
    /// Local arrival seq.
    pub arrival: Arrival,
    /// The entry.
    pub record: JournalRecord,
}

/// The journal's retained range and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalBounds {
    /// The first retained arrival (`head + 1` when nothing is retained):
    /// everything before it was trimmed.
    pub first: Arrival,
    /// The last arrival written (0 before the first).
    pub head: Arrival,
    /// Bytes the retained rows take in the store (keys and values).
    pub bytes: u64,
}

/// An own stream of an epoch this node no longer writes: its store went
/// back in time and a new epoch was started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndedOwn {
    /// The stream.
    pub stream: StreamId,
    /// The last seq this store holds as its peer may have it.
    pub held: Seq,
    /// The highest seq the peer was seen to hold, once reported as rolled
    /// back (`held` until then).
    pub reported: Seq,
    /// The envelopes up to here were acknowledged or carried over to the
    /// new epoch; the rest of the retained ones are still to carry.
    pub carried: Seq,
}

/// What a [`WriteOp::Trim`] did, and when the next is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrimReport {
    /// The journal's bounds after it.
    pub bounds: JournalBounds,
    /// More is over the bounds than one trim takes: trim again soon.
    pub more: bool,
    /// When (ms since the Unix epoch) the oldest retained entry passes the
    /// age bound, if there is one.
    pub next_due_ms: Option<u64>,
}

/// A known peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRecord {
    /// Its node id.
    pub node: NodeId,
    /// Addresses to dial it at.
    pub addrs: Vec<SocketAddr>,
    /// The peer's store epoch as last seen in its Hello (None until then).
    pub epoch: Option<Epoch>,
}

/// One write. A caller's ops are applied together or not at all; every op
/// is checked against the state in the transaction before anything is written,
/// and a failed check is a [`crate::StoreError::Conflict`] for that caller only.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum WriteOp {
    /// Author: a new batch of this node's own envelopes, appended to the
    /// outbox and journal, after the eviction `evict` (if any) made room.
    /// Checks: `batch.first_seq == next_seq` of its stream (a stream is
    /// created by its first batch at seq 1), the batch's epoch is this
    /// store's epoch, and the eviction drops an unacknowledged envelope only
    /// if it says so. The store applies no retention policy of its own: what
    /// to evict, and whether a send is refused instead, is the caller's
    /// decision (the bus core's).
    ///
    /// Journaled in order: the eviction's loss record, if any, then the
    /// batch's envelopes in seq order.
    AppendOwn {
        /// The signed batch and payloads.
        batch: OpenBatch,
        /// Room to make first.
        evict: Option<Eviction>,
    },
    /// Author: the recipient acknowledged everything up to `upto`
    /// (never moves backwards unless `reset` — the recipient's store is new).
    /// An older ack without `reset` is a harmless no-op. Checks: the stream
    /// is one this store writes, and `upto < next_seq`. The stream's
    /// evictable envelopes follow the new mark.
    Acked {
        /// The stream.
        stream: StreamId,
        /// The recipient's mark.
        upto: Seq,
        /// Allow the mark to move backwards (recipient changed epoch).
        reset: bool,
    },
    /// Receiver: commit the envelopes of `batch` from `from` to its end,
    /// journal them, and move the mark to the batch's last seq.
    /// Check: the stream's current mark is `from - 1`, and `from` lies in the batch.
    Accept {
        /// The verified batch with matching payloads.
        batch: OpenBatch,
        /// The first seq to take (earlier ones are duplicates).
        from: Seq,
    },
    /// Receiver: the author no longer holds anything before
    /// `earliest_available`. Journals a [`JournalRecord::Gap`] for
    /// `mark + 1 ..= earliest_available - 1` and moves the mark there.
    /// Check: `earliest_available > mark + 1`.
    Gap {
        /// The stream.
        stream: StreamId,
        /// The first seq the author can still send.
        earliest_available: Seq,
    },
    /// Journal a loss record that is not an outbox eviction (e.g. a lagging
    /// subscriber). Check: `1 <= from <= to`.
    RecordLoss {
        /// The stream, or the stream the loss is reported against.
        stream: StreamId,
        /// First seq concerned.
        from: Seq,
        /// Last seq concerned.
        to: Seq,
        /// Why.
        reason: LossReason,
        /// Free text for a person.
        detail: String,
    },
    /// Journal that the local subscriber `subscriber` missed the journal
    /// entries at arrivals `from..=to` (a [`JournalRecord::SubscriberLagged`]).
    /// Checks: `subscriber` is 1..=[`crate::SUBSCRIBER_NAME_BYTES_MAX`] bytes
    /// and `1 <= from <= to <=` the journal head before the record.
    RecordLag {
        /// Who lagged.
        subscriber: String,
        /// First arrival missed.
        from: Arrival,
        /// Last arrival missed.
        to: Arrival,
    },
    /// Add or update a peer.
    PutPeer(PeerRecord),
    /// Forget a peer (its streams and marks stay).
    RemovePeer(NodeId),
    /// Set a named durable cursor to an arrival position. Checks: the name
    /// is 1..=[`crate::CURSOR_NAME_BYTES_MAX`] bytes and `arrival` is at most
    /// the journal head (including entries earlier in the same commit).
    PutCursor {
        /// The cursor's name (1..=64 bytes, checked by the caller).
        name: String,
        /// The arrival position.
        arrival: Arrival,
    },
    /// An agent write: local agents, inbox and message index, retried-send
    /// records, aliases, agents' cursors (see [`crate::AgentOp`]).
    Agents(crate::AgentOp),
    /// Join the topic of `record` (or change its bounds): this node becomes
    /// a member, which may take the topic's batches with
    /// [`WriteOp::AcceptTopic`]. Check: at most [`TOPICS_MAX`] topics.
    JoinTopic(TopicRecord),
    /// Leave `topic`: its record goes. What was journaled stays, and so do
    /// the held batches of its streams (bounded as before, and by the
    /// journal's retention), the own stream's counter with them: a node
    /// that joins again goes on with its next seq. Check: a member.
    LeaveTopic {
        /// The topic.
        topic: TopicName,
    },
    /// Receiver of a topic: commit the envelopes of `batch` (any member's,
    /// its author's signature checked) from `from` to its end, journal
    /// them and move the mark, as [`WriteOp::Accept`] does, and keep the
    /// batch as signed, so that this node can relay it to the topic's
    /// other members, after the eviction `evict` made room in what is held
    /// of its stream (quietly: an evicted relayed batch is in this node's
    /// journal, and a member that still lacks it gets a gap from this
    /// node). Checks: as for `Accept`; the stream is a topic's this node
    /// is a member of, authored by another node.
    AcceptTopic {
        /// The verified batch with matching payloads.
        batch: OpenBatch,
        /// The first seq to take (earlier ones are duplicates).
        from: Seq,
        /// Room to make first in what is held of the stream.
        evict: Option<Eviction>,
    },
    /// Trim the journal, oldest rows first, while its rows take more than
    /// `bytes_max` bytes or were written more than `age_ms_max` ms before
    /// `now_ms` (0: no age bound); at most [`crate::TRIM_ROWS_MAX`] rows.
    /// Payloads still needed by the outbox are not lost: an acknowledged
    /// batch whose rows go is evicted with them (it is the oldest of its
    /// stream), an unacknowledged one keeps its payloads in the outbox.
    /// Also dates the journal rows this commit writes (at `now_ms`), which
    /// is what the age bound reads. Its receipt's `trim` says what is left.
    /// Put it first in a commit: the bounds hold before the commit's own rows.
    Trim {
        /// The clock, ms since the Unix epoch.
        now_ms: u64,
        /// The most bytes the journal's rows may take.
        bytes_max: u64,
        /// The oldest a row may be, in ms (0: no bound).
        age_ms_max: u64,
    },
    /// Journal that local sends were held past the hold bound and let go
    /// (a [`JournalRecord::SendsLost`]). Check: `msgs >= 1`.
    RecordLost {
        /// The recipient node.
        to: NodeId,
        /// How many sends.
        msgs: u64,
        /// Their payload bytes.
        bytes: u64,
        /// When the first was taken.
        first_ms: u64,
        /// When the last was taken.
        last_ms: u64,
        /// Free text for a person.
        detail: String,
    },
    /// Receiver: the author of `stream` started a new epoch. Journals a
    /// [`JournalRecord::EpochEnded`] at the stream's mark (as earlier groups
    /// of the commit left it); nothing if this node holds none of it.
    EndEpoch {
        /// The ended stream.
        stream: StreamId,
    },
    /// Receiver: the author of `stream` says its store lost `from..=to`,
    /// which this node holds: journal a [`JournalRecord::RolledBack`].
    /// Check: `1 <= from <= to`.
    RecordRolledBack {
        /// The stream.
        stream: StreamId,
        /// First seq concerned.
        from: Seq,
        /// Last seq concerned.
        to: Seq,
        /// Free text for a person.
        detail: String,
    },
    /// Journal a [`JournalRecord::DrainEnded`]. Check: `agent`'s inbox
    /// has nothing after `passed` (what was passed on): an entry that came
    /// meanwhile would be lost to it.
    RecordDrainEnded {
        /// The agent.
        agent: mesh_protocol::AgentName,
        /// Its host now.
        to: NodeId,
        /// The last inbox arrival passed on.
        passed: Arrival,
        /// Free text for a person.
        detail: String,
    },
    /// Receiver: journal a [`JournalRecord::Conflict`].
    RecordConflict {
        /// The stream.
        stream: StreamId,
        /// The seq.
        seq: Seq,
        /// The payload hash committed here.
        ours: Cid,
        /// The payload hash the batch carried.
        theirs: Cid,
    },
    /// Author: this store went back in time; every own stream is ended
    /// (kept as an [`EndedOwn`], held and carried up to its acknowledged
    /// mark: only that is known to be as its peer has it; an outbox with
    /// nothing unacknowledged is dropped) and the store's epoch becomes
    /// `epoch`, which later appends must be in. Checks: `epoch` is new (no
    /// own stream has it).
    NewEpoch {
        /// The new epoch.
        epoch: Epoch,
    },
    /// Author: the peer of the ended own stream `stream` holds it up to
    /// `world`, which this store holds only up to `held`: journals a
    /// [`JournalRecord::RolledBack`] for `held + 1 ..= world` (once: the
    /// ended stream remembers what was reported) and lowers the ended
    /// stream's `held`. Checks: the stream is ended, or is this store's
    /// own topic stream of an earlier epoch (which a new epoch leaves as
    /// it is, to be relayed): it is ended here, held and carried up to its
    /// last seq in the outbox (0 without one), its outbox kept.
    ReportRolledBack {
        /// The ended stream.
        stream: StreamId,
        /// What this store holds of it as the peer has it.
        held: Seq,
        /// What the peer holds of it.
        world: Seq,
        /// Free text for a person.
        detail: String,
    },
    /// Author: append `batch` (of the current epoch) to the outbox without
    /// journaling it — its envelopes are the unacknowledged ones of the
    /// ended stream `from` up to `upto`, journaled when first sent — and
    /// record that `from` is carried up to `upto`. Once `from` is carried
    /// to its end its outbox is dropped. Checks as [`WriteOp::AppendOwn`];
    /// `from` is ended and `upto` moves its carried mark on.
    CarryOver {
        /// The re-signed batch.
        batch: OpenBatch,
        /// The ended stream its envelopes come from.
        from: StreamId,
        /// The last seq of `from` carried with it.
        upto: Seq,
    },
    /// Author: replace the outbox batch of `batch`'s stream that starts at
    /// its first seq with `batch`, a tombstone re-signed in its place (the
    /// message there was superseded before it was sent; the journal keeps
    /// what was sent there, the outbox now keeps the tombstone's payload).
    /// Checks: the stream is this store's own in its current epoch; the old
    /// batch and `batch` hold one envelope each, at a seq the peer has not
    /// acknowledged; `by`, the superseding message's seq, is later and
    /// already appended (earlier in the same commit, or before).
    Supersede {
        /// The tombstone, signed alone.
        batch: OpenBatch,
        /// The seq of the message that supersedes it.
        by: Seq,
    },
    /// Author: drop the outbox of the ended own stream `stream` (nothing of
    /// it is left to carry). Checks: the stream is ended.
    DropEnded {
        /// The ended stream.
        stream: StreamId,
    },
    /// Keep `card` as the newest card of its node (this node's own, or a
    /// peer's), replacing the one held. The caller has verified it and
    /// checked it is newer; [`WriteOp::RemovePeer`] forgets a peer's card.
    PutCard(NodeCard),
    /// Write an invite's record (create, claim, spend or revoke it),
    /// replacing the one held. Check: 1 to [`INVITE_USES_MAX`] uses, no more
    /// spends than uses, and at most [`INVITE_SPEND_REQUESTS_MAX`] requests
    /// a spend.
    PutInvite(InviteRecord),
}

/// Room an [`WriteOp::AppendOwn`] makes before it appends: the oldest
/// whole batches are evicted until the outbox holds at most `msgs_max`
/// envelopes and `bytes_max` payload bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// The most envelopes left in the outbox.
    pub msgs_max: u64,
    /// The most payload bytes left in the outbox.
    pub bytes_max: u64,
    /// `None`: only acknowledged batches may go; an eviction that would drop
    /// an unacknowledged envelope is refused ([`crate::StoreError::Conflict`]).
    /// `Some(detail)`: unacknowledged ones may go too; the seqs lost are
    /// journaled as one [`JournalRecord::Loss`] (`OutboxEvicted`) with `detail`.
    pub loss: Option<String>,
}

/// The most topics a node may be a member of.
pub const TOPICS_MAX: usize = 256;

/// A topic this node is a member of, and how much of each of its author
/// streams it holds for relaying (its own included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    /// The topic.
    pub name: TopicName,
    /// When this node joined it (ms since the Unix epoch).
    pub joined_ms: u64,
    /// The most envelopes held of one author stream of the topic.
    pub max_msgs: u64,
    /// The most payload bytes held of one author stream of the topic.
    pub max_bytes: u64,
}

/// What one caller's committed ops produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Receipt {
    /// Arrival positions of the journal entries written, first to last (`None` if none).
    pub arrivals: Option<(Arrival, Arrival)>,
    /// The new state of every own stream the ops changed (appends,
    /// evictions, acks, trims), and of a new epoch's.
    pub own_streams: Vec<OwnStream>,
    /// What a [`WriteOp::Trim`] in the ops did.
    pub trim: Option<TrimReport>,
    /// The ended own streams the ops changed.
    pub ended: Vec<EndedOwn>,
    /// What the read receipts among the ops did.
    pub read: ReadReport,
}

/// What the read receipts of one caller's ops did
/// ([`crate::AgentIndex::Read`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Receipts that marked something (each one inbox entry).
    pub taken: u64,
    /// Sent messages marked read.
    pub marked: u64,
    /// Ids skipped: not sent by this node to the reader's node, or marked
    /// read already.
    pub skipped: u64,
    /// Receipts that marked nothing, and so made no inbox entry.
    pub refused: u64,
}

/// What to do when an outbox is full of unacknowledged envelopes (the bus
/// core applies it; the store only executes the evictions it decides).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnFull {
    /// Refuse the new send with a clear error; nothing is written (the default).
    #[default]
    Reject,
    /// Evict the oldest unacknowledged batches and journal their loss durably.
    EvictOldest,
}

/// Retention bounds of one outbox stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxBounds {
    /// The most envelopes kept.
    pub max_msgs: u64,
    /// The most payload bytes kept.
    pub max_bytes: u64,
    /// What happens when only unacknowledged envelopes remain and a new batch does not fit.
    pub on_full: OnFull,
}

impl Default for OutboxBounds {
    fn default() -> Self {
        OutboxBounds {
            max_msgs: 1_000_000,
            max_bytes: 1 << 30,
            on_full: OnFull::Reject,
        }
    }
}
