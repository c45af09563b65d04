//! The write rules, written once for both implementations.
//!
//! A caller's group of [`WriteOp`]s is checked and turned into a list of
//! primitive [`Write`]s against a read view of the committed state ([`Base`])
//! plus the group's own earlier effects. Nothing is written while planning, so
//! a refused group leaves no trace; a planned group is applied as a whole.

use std::collections::BTreeMap;

use mesh_protocol::{Epoch, NodeCard, NodeId, Seq, SignedBatch, StreamId};

use crate::agents::{self, AgentWrite, Run};
use crate::{
    Arrival, Eviction, INVITE_SPEND_REQUESTS_MAX, INVITE_USES_MAX, InviteRecord, JournalRecord,
    LossReason, OwnStream, PeerRecord, Receipt, StoreError, WriteOp,
};

/// The longest durable cursor name, in bytes.
pub const CURSOR_NAME_BYTES_MAX: usize = 64;

/// The longest subscriber name in a lag record, in bytes.
pub const SUBSCRIBER_NAME_BYTES_MAX: usize = 256;

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

/// Read access to the committed state (including groups applied earlier in
/// the same transaction). An error here fails the whole transaction.
pub(crate) trait Base {
    fn epoch(&self) -> Epoch;
    /// The store's path or name, for messages.
    fn name(&self) -> &str;
    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, StoreError>;
    fn batch_meta(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<BatchMeta>, StoreError>;
    fn mark(&mut self, stream: &StreamId) -> Result<Option<Seq>, StoreError>;
}

/// One primitive write, applied in order.
#[derive(Debug)]
pub(crate) enum Write {
    OwnStream(OwnStream),
    /// An own batch; its payloads are the journal's envelopes from
    /// `first_arrival` on, written earlier in the same group (the journal
    /// is never trimmed, so the outbox need not hold them again).
    PutBatch {
        first_seq: Seq,
        batch: SignedBatch,
        first_arrival: Arrival,
    },
    DelBatch {
        stream: StreamId,
        first_seq: Seq,
    },
    Mark {
        stream: StreamId,
        seq: Seq,
    },
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
    PutCard(NodeCard),
    PutInvite(InviteRecord),
    /// An agent table write (`crate::agents`).
    Agents(AgentWrite),
}

/// Counters shared by the groups of one transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TxCounters {
    pub(crate) journal_head: Arrival,
    pub(crate) max_lamport: u64,
}

/// Why planning a group stopped.
#[derive(Debug)]
pub(crate) enum Fail {
    /// The group broke a rule; only this group fails.
    Refused(StoreError),
    /// Reading the state failed; the whole transaction fails.
    Fatal(StoreError),
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail::Fatal(e)
    }
}

fn refuse<T>(why: String) -> Result<T, Fail> {
    Err(Fail::Refused(StoreError::Conflict(why)))
}

/// A planned group: its writes in order and the caller's receipt.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) writes: Vec<Write>,
    pub(crate) receipt: Receipt,
}

/// One group's view: the base plus its own earlier effects.
struct GroupView<'b, B: Base> {
    base: &'b mut B,
    counters: TxCounters,
    own: BTreeMap<StreamId, OwnStream>,
    /// Own streams changed by this group, in the order of their first change.
    own_changed: Vec<StreamId>,
    marks: BTreeMap<StreamId, Seq>,
    /// Batches added (`Some`) or removed (`None`) by this group.
    batches: BTreeMap<(StreamId, Seq), Option<BatchMeta>>,
    writes: Vec<Write>,
    first_arrival: Option<Arrival>,
    /// The envelopes this group journaled, for the agent index.
    runs: Vec<Run>,
}

impl<B: Base> GroupView<'_, B> {
    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, Fail> {
        if let Some(o) = self.own.get(stream) {
            return Ok(Some(o.clone()));
        }
        Ok(self.base.own_stream(stream)?)
    }

    fn set_own(&mut self, o: OwnStream) {
        debug_assert_eq!(o.broken(), None, "{o:?}");
        if !self.own_changed.contains(&o.stream) {
            self.own_changed.push(o.stream.clone());
        }
        self.own.insert(o.stream.clone(), o);
    }

    fn batch_meta(&mut self, stream: &StreamId, first_seq: Seq) -> Result<Option<BatchMeta>, Fail> {
        if let Some(m) = self.batches.get(&(stream.clone(), first_seq)) {
            return Ok(*m);
        }
        Ok(self.base.batch_meta(stream, first_seq)?)
    }

    fn mark(&mut self, stream: &StreamId) -> Result<Seq, Fail> {
        if let Some(m) = self.marks.get(stream) {
            return Ok(*m);
        }
        Ok(self.base.mark(stream)?.unwrap_or(0))
    }

    fn journal(&mut self, record: JournalRecord) {
        self.counters.journal_head += 1;
        let arrival = self.counters.journal_head;
        self.first_arrival.get_or_insert(arrival);
        if let JournalRecord::Envelope { stream, seq, .. } = &record {
            agents::note_envelope(&mut self.runs, stream, *seq, arrival);
        }
        self.writes.push(Write::Journal { arrival, record });
    }

    fn lamport(&mut self, lamport: u64) {
        self.counters.max_lamport = self.counters.max_lamport.max(lamport);
    }

    /// The stored meta of the batch of `own` that starts at `first_seq`,
    /// which the stream's counters say exists.
    fn meta_at(&mut self, own: &OwnStream, first_seq: Seq) -> Result<BatchMeta, Fail> {
        match self.batch_meta(&own.stream, first_seq)? {
            Some(meta) => Ok(meta),
            None => Err(Fail::Fatal(StoreError::Corrupt {
                path: self.base.name().to_owned(),
                why: format!(
                    "outbox of {:?} holds seqs {}..{} but has no batch starting at {first_seq}",
                    own.stream, own.first_retained, own.next_seq
                ),
            })),
        }
    }

    /// Removes the oldest batch of `own`, returning it. The outbox must not be empty.
    fn evict_oldest(&mut self, own: &mut OwnStream) -> Result<BatchMeta, Fail> {
        let first = own.first_retained;
        let meta = self.meta_at(own, first)?;
        self.batches.insert((own.stream.clone(), first), None);
        self.writes.push(Write::DelBatch {
            stream: own.stream.clone(),
            first_seq: first,
        });
        own.first_retained = meta.last_seq + 1;
        own.msgs -= meta.msgs;
        own.bytes -= meta.bytes;
        if own.evictable_msgs > 0 {
            // The evictable batches are the oldest ones: this was one of them.
            own.evictable_msgs -= meta.msgs;
            own.evictable_bytes -= meta.bytes;
        }
        Ok(meta)
    }

    /// Counts as evictable the batches after those already counted that
    /// now lie wholly at or below `last_acked` (all of them afresh if
    /// `afresh`: the mark moved back).
    fn count_evictable(&mut self, own: &mut OwnStream, afresh: bool) -> Result<(), Fail> {
        if afresh {
            own.evictable_msgs = 0;
            own.evictable_bytes = 0;
        }
        loop {
            // Batches are contiguous from first_retained, so one starts here.
            let at = own.first_retained + own.evictable_msgs;
            if at >= own.next_seq || at > own.last_acked {
                return Ok(());
            }
            let meta = self.meta_at(own, at)?;
            if meta.last_seq > own.last_acked {
                return Ok(());
            }
            own.evictable_msgs += meta.msgs;
            own.evictable_bytes += meta.bytes;
        }
    }

    /// Evicts the oldest batches of `own` as `evict` says; journals the
    /// unacknowledged seqs it drops as one loss record, if it may drop any.
    fn make_room(&mut self, own: &mut OwnStream, evict: Eviction) -> Result<(), Fail> {
        let mut lost: Option<(Seq, Seq)> = None;
        while own.msgs > evict.msgs_max || own.bytes > evict.bytes_max {
            let first = own.first_retained;
            if own.evictable_msgs == 0 && evict.loss.is_none() {
                return refuse(format!(
                    "evicting down to {} msgs / {} bytes would drop unacknowledged seqs of {:?} \
                     from {first} without a loss record",
                    evict.msgs_max, evict.bytes_max, own.stream
                ));
            }
            let acked = own.evictable_msgs > 0;
            let meta = self.evict_oldest(own)?;
            if !acked {
                let from = first.max(own.last_acked.saturating_add(1));
                lost = Some((lost.map_or(from, |(s, _)| s), meta.last_seq));
            }
        }
        if let (Some((from, to)), Some(detail)) = (lost, evict.loss) {
            self.journal(JournalRecord::Loss {
                stream: own.stream.clone(),
                from,
                to,
                reason: LossReason::OutboxEvicted,
                detail,
            });
        }
        Ok(())
    }

    fn append_own(
        &mut self,
        batch: mesh_protocol::OpenBatch,
        evict: Option<Eviction>,
    ) -> Result<(), Fail> {
        let (vb, payloads) = batch.into_parts();
        let stream = vb.stream().clone();
        let epoch = self.base.epoch();
        if stream.epoch != epoch {
            return refuse(format!(
                "batch of {stream:?} is in epoch {}, but this store's epoch is {}",
                stream.epoch.fmt_short(),
                epoch.fmt_short()
            ));
        }
        let mut own = self
            .own_stream(&stream)?
            .unwrap_or_else(|| OwnStream::empty(stream.clone()));
        if vb.first_seq() != own.next_seq {
            return refuse(format!(
                "batch of {stream:?} starts at seq {}, but the stream's next seq is {}",
                vb.first_seq(),
                own.next_seq
            ));
        }
        if let Some(evict) = evict {
            self.make_room(&mut own, evict)?;
        }
        let first_seq = vb.first_seq();
        let first_arrival = self.counters.journal_head + 1;
        for (i, (h, p)) in vb.entries().iter().zip(payloads).enumerate() {
            self.lamport(h.lamport);
            self.journal(JournalRecord::Envelope {
                stream: stream.clone(),
                seq: first_seq + i as u64,
                lamport: h.lamport,
                created_ms: h.created_ms,
                kind: h.kind,
                payload: p,
            });
        }
        let meta = BatchMeta::of(vb.signed());
        self.batches.insert((stream.clone(), first_seq), Some(meta));
        self.writes.push(Write::PutBatch {
            first_seq,
            batch: vb.into_signed(),
            first_arrival,
        });
        if own.msgs == 0 {
            own.first_retained = first_seq;
        }
        own.next_seq = meta.last_seq + 1;
        own.msgs += meta.msgs;
        own.bytes += meta.bytes;
        self.set_own(own);
        Ok(())
    }

    fn acked(&mut self, stream: StreamId, upto: Seq, reset: bool) -> Result<(), Fail> {
        let Some(mut own) = self.own_stream(&stream)? else {
            return refuse(format!(
                "ack for {stream:?}, which this store does not write"
            ));
        };
        if upto >= own.next_seq {
            return refuse(format!(
                "ack of {stream:?} up to seq {upto}, but only {} were sent",
                own.next_seq - 1
            ));
        }
        // An older ack (a duplicate or reordered frame) is harmless: the mark stays.
        if upto > own.last_acked || (reset && upto != own.last_acked) {
            let back = upto < own.last_acked;
            own.last_acked = upto;
            self.count_evictable(&mut own, back)?;
            self.set_own(own);
        }
        Ok(())
    }

    fn accept(&mut self, batch: mesh_protocol::OpenBatch, from: Seq) -> Result<(), Fail> {
        let (vb, payloads) = batch.into_parts();
        let stream = vb.stream().clone();
        if from < vb.first_seq() || from > vb.last_seq() {
            return refuse(format!(
                "accept of {stream:?} from seq {from}, outside the batch {}..={}",
                vb.first_seq(),
                vb.last_seq()
            ));
        }
        let mark = self.mark(&stream)?;
        if mark != from - 1 {
            return refuse(format!(
                "accept of {stream:?} from seq {from}, but the mark is {mark}"
            ));
        }
        let skip = usize::try_from(from - vb.first_seq()).unwrap_or(usize::MAX);
        for (i, (h, p)) in vb.entries().iter().zip(payloads).enumerate().skip(skip) {
            self.lamport(h.lamport);
            self.journal(JournalRecord::Envelope {
                stream: stream.clone(),
                seq: vb.first_seq() + i as u64,
                lamport: h.lamport,
                created_ms: h.created_ms,
                kind: h.kind,
                payload: p,
            });
        }
        let last = vb.last_seq();
        self.marks.insert(stream, last);
        Ok(())
    }

    fn gap(&mut self, stream: StreamId, earliest_available: Seq) -> Result<(), Fail> {
        let mark = self.mark(&stream)?;
        if earliest_available <= mark.saturating_add(1) {
            return refuse(format!(
                "gap of {stream:?} up to earliest available seq {earliest_available}, \
                 but the mark is already {mark}"
            ));
        }
        let to = earliest_available - 1;
        self.journal(JournalRecord::Gap {
            stream: stream.clone(),
            from: mark + 1,
            to,
        });
        self.marks.insert(stream, to);
        Ok(())
    }

    fn record_lag(&mut self, subscriber: String, from: Arrival, to: Arrival) -> Result<(), Fail> {
        if subscriber.is_empty() || subscriber.len() > SUBSCRIBER_NAME_BYTES_MAX {
            return refuse(format!(
                "lag record of a subscriber named in {} bytes; it must be 1..={SUBSCRIBER_NAME_BYTES_MAX}",
                subscriber.len()
            ));
        }
        let head = self.counters.journal_head;
        if from == 0 || from > to || to > head {
            return refuse(format!(
                "lag record of {subscriber:?} for arrivals {from}..={to}, but the journal holds 1..={head}"
            ));
        }
        self.journal(JournalRecord::SubscriberLagged {
            subscriber,
            from,
            to,
        });
        Ok(())
    }

    fn apply(&mut self, op: WriteOp) -> Result<(), Fail> {
        match op {
            WriteOp::AppendOwn { batch, evict } => self.append_own(batch, evict),
            WriteOp::Acked {
                stream,
                upto,
                reset,
            } => self.acked(stream, upto, reset),
            WriteOp::Accept { batch, from } => self.accept(batch, from),
            WriteOp::Gap {
                stream,
                earliest_available,
            } => self.gap(stream, earliest_available),
            WriteOp::RecordLoss {
                stream,
                from,
                to,
                reason,
                detail,
            } => {
                if from > to || from == 0 {
                    return refuse(format!("loss record of {stream:?} for seqs {from}..={to}"));
                }
                self.journal(JournalRecord::Loss {
                    stream,
                    from,
                    to,
                    reason,
                    detail,
                });
                Ok(())
            }
            WriteOp::RecordLag {
                subscriber,
                from,
                to,
            } => self.record_lag(subscriber, from, to),
            WriteOp::PutPeer(p) => {
                self.writes.push(Write::PutPeer(p));
                Ok(())
            }
            WriteOp::RemovePeer(n) => {
                self.writes.push(Write::RemovePeer(n));
                Ok(())
            }
            WriteOp::PutCursor { name, arrival } => {
                if name.is_empty() || name.len() > CURSOR_NAME_BYTES_MAX {
                    return refuse(format!(
                        "cursor name is {} bytes; it must be 1..={CURSOR_NAME_BYTES_MAX}",
                        name.len()
                    ));
                }
                if arrival > self.counters.journal_head {
                    return refuse(format!(
                        "cursor {name:?} set to arrival {arrival}, past the journal head {}",
                        self.counters.journal_head
                    ));
                }
                self.writes.push(Write::Cursor { name, arrival });
                Ok(())
            }
            WriteOp::PutCard(card) => {
                self.writes.push(Write::PutCard(card));
                Ok(())
            }
            WriteOp::PutInvite(invite) => {
                if invite.uses == 0 || invite.uses > INVITE_USES_MAX {
                    return refuse(format!(
                        "invite {} has {} uses; it may have 1..={INVITE_USES_MAX}",
                        invite.id, invite.uses
                    ));
                }
                if invite.spent.len() > invite.uses as usize {
                    return refuse(format!(
                        "invite {} has {} spends for {} uses",
                        invite.id,
                        invite.spent.len(),
                        invite.uses
                    ));
                }
                if invite
                    .spent
                    .iter()
                    .any(|s| s.requests.len() > INVITE_SPEND_REQUESTS_MAX)
                {
                    return refuse(format!(
                        "invite {} has a spend of more than {INVITE_SPEND_REQUESTS_MAX} requests",
                        invite.id
                    ));
                }
                self.writes.push(Write::PutInvite(invite));
                Ok(())
            }
            WriteOp::Agents(op) => {
                let last = self.first_arrival.map(|_| self.counters.journal_head);
                let mut planned = Vec::new();
                agents::plan(
                    op,
                    &self.runs,
                    last,
                    self.counters.journal_head,
                    &mut planned,
                )
                .or_else(refuse)?;
                self.writes.extend(planned.into_iter().map(Write::Agents));
                Ok(())
            }
        }
    }
}

/// Plans one caller's group against `base`. On success `counters` moves on.
pub(crate) fn plan_group<B: Base>(
    base: &mut B,
    counters: &mut TxCounters,
    ops: Vec<WriteOp>,
) -> Result<Plan, Fail> {
    let mut view = GroupView {
        base,
        counters: *counters,
        own: BTreeMap::new(),
        own_changed: Vec::new(),
        marks: BTreeMap::new(),
        batches: BTreeMap::new(),
        writes: Vec::new(),
        first_arrival: None,
        runs: Vec::new(),
    };
    for op in ops {
        view.apply(op)?;
    }
    let mut own_streams = Vec::with_capacity(view.own_changed.len());
    for s in &view.own_changed {
        if let Some(o) = view.own.get(s) {
            view.writes.push(Write::OwnStream(o.clone()));
            own_streams.push(o.clone());
        }
    }
    for (stream, seq) in std::mem::take(&mut view.marks) {
        view.writes.push(Write::Mark { stream, seq });
    }
    let arrivals = view.first_arrival.map(|f| (f, view.counters.journal_head));
    *counters = view.counters;
    Ok(Plan {
        writes: view.writes,
        receipt: Receipt {
            arrivals,
            own_streams,
        },
    })
}
