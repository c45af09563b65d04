//! The write rules, written once for both implementations.
//!
//! A caller's group of [`WriteOp`]s is checked and turned into a list of
//! primitive [`Write`]s against a read view of the committed state ([`Base`])
//! plus the group's own earlier effects. Nothing is written while planning, so
//! a refused group leaves no trace; a planned group is applied as a whole.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{Cid, Epoch, NodeCard, NodeId, Seq, SignedBatch, StreamId};

use crate::agents::{self, AgentWrite, Run};
use crate::{
    Arrival, EndedOwn, Eviction, INVITE_SPEND_REQUESTS_MAX, INVITE_USES_MAX, InviteRecord,
    JournalBounds, JournalRecord, LossReason, OwnStream, PeerRecord, Receipt, StoreError,
    TrimReport, WriteOp,
};

/// The longest durable cursor name, in bytes.
pub const CURSOR_NAME_BYTES_MAX: usize = 64;

/// The longest subscriber name in a lag record, in bytes.
pub const SUBSCRIBER_NAME_BYTES_MAX: usize = 256;

/// The most journal rows one [`WriteOp::Trim`] removes (a row holds up to
/// 16 KiB): a bound far below the bytes take several commits, not one
/// huge transaction.
pub const TRIM_ROWS_MAX: usize = 4096;

/// The longest free text of a record a caller journals, in bytes.
pub const DETAIL_BYTES_MAX: usize = 1024;

/// Journal rows are dated at most once per this many ms (the age bound's
/// resolution: a row may outlive the bound by this much).
pub const JOURNAL_TIME_STEP_MS: u64 = 60_000;

/// Journal rows read at a time while trimming.
const TRIM_READ_ROWS: usize = 64;

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
    /// An agent table write (`crate::agents`).
    Agents(AgentWrite),
}

/// Counters shared by the groups of one transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TxCounters {
    pub(crate) journal_head: Arrival,
    pub(crate) max_lamport: u64,
    /// The first retained journal arrival.
    pub(crate) journal_first: Arrival,
    /// The bytes of the retained journal rows (the rows this commit writes
    /// are added when they are written).
    pub(crate) journal_bytes: u64,
    /// When the last commit that journaled anything ran (0: never dated).
    pub(crate) last_write_ms: u64,
    /// The store's epoch (a group may start a new one).
    pub(crate) epoch: Epoch,
    /// The clock a trim in this commit gave, to date its rows.
    pub(crate) now_ms: Option<u64>,
}

impl TxCounters {
    /// The journal's bounds as they stand.
    pub(crate) fn bounds(&self) -> JournalBounds {
        JournalBounds {
            first: self.journal_first,
            head: self.journal_head,
            bytes: self.journal_bytes,
        }
    }
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
    /// Own streams this group removed.
    own_dropped: BTreeSet<StreamId>,
    marks: BTreeMap<StreamId, Seq>,
    mark_cids: BTreeMap<StreamId, Option<Cid>>,
    /// Batches added (`Some`) or removed (`None`) by this group.
    batches: BTreeMap<(StreamId, Seq), Option<BatchMeta>>,
    /// Batches whose payloads this group put in the outbox.
    moved: BTreeSet<(StreamId, Seq)>,
    ended: BTreeMap<StreamId, EndedOwn>,
    writes: Vec<Write>,
    first_arrival: Option<Arrival>,
    /// The envelopes this group journaled, for the agent index.
    runs: Vec<Run>,
    trim: Option<TrimReport>,
}

impl<B: Base> GroupView<'_, B> {
    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, Fail> {
        if let Some(o) = self.own.get(stream) {
            return Ok(Some(o.clone()));
        }
        if self.own_dropped.contains(stream) {
            return Ok(None);
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

    fn batch_moved(&mut self, stream: &StreamId, first_seq: Seq) -> Result<bool, Fail> {
        if self.moved.contains(&(stream.clone(), first_seq)) {
            return Ok(true);
        }
        if let Some(None) = self.batches.get(&(stream.clone(), first_seq)) {
            return Ok(false);
        }
        Ok(self.base.batch_moved(stream, first_seq)?)
    }

    fn mark(&mut self, stream: &StreamId) -> Result<Seq, Fail> {
        if let Some(m) = self.marks.get(stream) {
            return Ok(*m);
        }
        Ok(self.base.mark(stream)?.unwrap_or(0))
    }

    fn ended(&mut self, stream: &StreamId) -> Result<Option<EndedOwn>, Fail> {
        if let Some(e) = self.ended.get(stream) {
            return Ok(Some(e.clone()));
        }
        Ok(self.base.ended(stream)?)
    }

    fn set_ended(&mut self, e: EndedOwn) {
        self.ended.insert(e.stream.clone(), e);
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

    fn corrupt(&self, why: String) -> Fail {
        Fail::Fatal(StoreError::Corrupt {
            path: self.base.name().to_owned(),
            why,
        })
    }

    /// The stored meta of the batch of `own` that starts at `first_seq`,
    /// which the stream's counters say exists.
    fn meta_at(&mut self, own: &OwnStream, first_seq: Seq) -> Result<BatchMeta, Fail> {
        match self.batch_meta(&own.stream, first_seq)? {
            Some(meta) => Ok(meta),
            None => Err(self.corrupt(format!(
                "outbox of {:?} holds seqs {}..{} but has no batch starting at {first_seq}",
                own.stream, own.first_retained, own.next_seq
            ))),
        }
    }

    /// Removes the oldest batch of `own`, returning it. The outbox must not be empty.
    fn evict_oldest(&mut self, own: &mut OwnStream) -> Result<BatchMeta, Fail> {
        let first = own.first_retained;
        let meta = self.meta_at(own, first)?;
        self.batches.insert((own.stream.clone(), first), None);
        self.moved.remove(&(own.stream.clone(), first));
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

    /// Evicts the oldest batches of `own` while they are acknowledged and
    /// their payloads live in the outbox (their journal rows are gone):
    /// nothing else would ever free them before the outbox fills.
    fn evict_moved_acked(&mut self, own: &mut OwnStream) -> Result<(), Fail> {
        while own.evictable_msgs > 0 && self.batch_moved(&own.stream, own.first_retained)? {
            self.evict_oldest(own)?;
        }
        Ok(())
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

    /// The own stream `batch` appends to, after the checks every append
    /// makes: this store's current epoch, and the stream's next seq.
    fn append_target(&mut self, stream: &StreamId, first_seq: Seq) -> Result<OwnStream, Fail> {
        let epoch = self.counters.epoch;
        if stream.epoch != epoch {
            return refuse(format!(
                "batch of {stream:?} is in epoch {}, but this store's epoch is {}",
                stream.epoch.fmt_short(),
                epoch.fmt_short()
            ));
        }
        let own = self
            .own_stream(stream)?
            .unwrap_or_else(|| OwnStream::empty(stream.clone()));
        if first_seq != own.next_seq {
            return refuse(format!(
                "batch of {stream:?} starts at seq {first_seq}, but the stream's next seq is {}",
                own.next_seq
            ));
        }
        Ok(own)
    }

    /// Counts an appended batch into `own` and records it.
    fn append_batch(&mut self, mut own: OwnStream, batch: SignedBatch, first_arrival: Arrival) {
        let meta = BatchMeta::of(&batch);
        let first_seq = batch.first_seq;
        self.batches
            .insert((own.stream.clone(), first_seq), Some(meta));
        self.writes.push(Write::PutBatch {
            first_seq,
            batch,
            first_arrival,
        });
        if own.msgs == 0 {
            own.first_retained = first_seq;
        }
        own.next_seq = meta.last_seq + 1;
        own.msgs += meta.msgs;
        own.bytes += meta.bytes;
        self.set_own(own);
    }

    fn append_own(
        &mut self,
        batch: mesh_protocol::OpenBatch,
        evict: Option<Eviction>,
    ) -> Result<(), Fail> {
        let (vb, payloads) = batch.into_parts();
        let stream = vb.stream().clone();
        let mut own = self.append_target(&stream, vb.first_seq())?;
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
        self.append_batch(own, vb.into_signed(), first_arrival);
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
            self.evict_moved_acked(&mut own)?;
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
        let last_cid = vb.entries().last().map(|h| h.payload_cid);
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
        self.marks.insert(stream.clone(), last);
        self.mark_cids.insert(stream, last_cid);
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
        self.marks.insert(stream.clone(), to);
        self.mark_cids.insert(stream, None);
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

    /// Trims the oldest journal rows while the journal is over its bounds
    /// (see [`WriteOp::Trim`]).
    fn trim(&mut self, now_ms: u64, bytes_max: u64, age_ms_max: u64) -> Result<(), Fail> {
        if self.counters.now_ms.is_some() {
            return refuse("a commit trims the journal once at most".into());
        }
        self.counters.now_ms = Some(now_ms);
        let aged = self.aged_before(now_ms, age_ms_max)?;
        let (first_before, mut rows, mut more) = (self.counters.journal_first, 0usize, false);
        let mut last_trimmed = None;
        // Most trims take a row or two: read few first, more if need be.
        let mut read = 4;
        'read: loop {
            let over = self.counters.journal_bytes > bytes_max;
            if !over && aged <= self.counters.journal_first {
                break;
            }
            let batch = self.base.journal_rows(self.counters.journal_first, read)?;
            read = (read * 2).min(TRIM_READ_ROWS);
            if batch.is_empty() {
                break;
            }
            for row in batch {
                if row.first < self.counters.journal_first {
                    return Err(self.corrupt(format!(
                        "a journal row starts at {} inside the trimmed range (first {})",
                        row.first, self.counters.journal_first
                    )));
                }
                let over = self.counters.journal_bytes > bytes_max;
                if !over && row.last >= aged {
                    break 'read;
                }
                if rows >= TRIM_ROWS_MAX {
                    more = true;
                    break 'read;
                }
                if let Some((stream, first_seq, n)) = &row.run {
                    self.free_for_trim(stream, *first_seq, *n)?;
                }
                self.counters.journal_bytes = self.counters.journal_bytes.saturating_sub(row.bytes);
                self.counters.journal_first = row.last + 1;
                last_trimmed = Some(row.last);
                rows += 1;
            }
        }
        let (next_due_ms, keep) = self.next_age_due(self.counters.journal_first, age_ms_max)?;
        if let Some(last) = last_trimmed {
            self.writes.push(Write::DelJournal {
                first: first_before,
                last,
            });
            self.writes.push(Write::DelTimesBefore(keep));
        }
        self.trim = Some(TrimReport {
            bounds: self.counters.bounds(),
            more,
            next_due_ms,
        });
        Ok(())
    }

    /// The arrival before which every row was written more than
    /// `age_ms_max` ms before `now_ms` (0 if none is known to be, or no bound).
    ///
    /// A dated position `(a, t)` says: rows before `a` were written before
    /// the commit that started at `a`, at `t`; and rows from `a` up to the
    /// next dated one within [`JOURNAL_TIME_STEP_MS`] after `t` (a commit
    /// that came later would have been dated).
    fn aged_before(&mut self, now_ms: u64, age_ms_max: u64) -> Result<Arrival, Fail> {
        if age_ms_max == 0 || now_ms < age_ms_max {
            return Ok(0);
        }
        let cutoff = now_ms - age_ms_max;
        if self.counters.last_write_ms != 0 && self.counters.last_write_ms <= cutoff {
            // Nothing was written since: every row is old.
            return Ok(self.counters.journal_head + 1);
        }
        let mut bound = 0;
        let mut prev: Option<u64> = None;
        let mut after = 0;
        loop {
            let times = self.base.journal_times(after, TRIM_READ_ROWS)?;
            let Some(&(last, _)) = times.last() else {
                return Ok(bound);
            };
            for (a, t) in times {
                if t > cutoff {
                    let step_done =
                        prev.is_some_and(|p| p.saturating_add(JOURNAL_TIME_STEP_MS) <= cutoff);
                    return Ok(if step_done { a } else { bound });
                }
                bound = a;
                prev = Some(t);
            }
            after = last;
        }
    }

    /// When the row at `first` passes the age bound (see
    /// [`GroupView::aged_before`]), and the dated position to keep (the last
    /// at or before `first`: the dates before it are of trimmed rows).
    fn next_age_due(
        &mut self,
        first: Arrival,
        age_ms_max: u64,
    ) -> Result<(Option<u64>, Arrival), Fail> {
        let mut at_or_before: Option<(Arrival, u64)> = None;
        let mut next: Option<u64> = None;
        let mut after = 0;
        'scan: loop {
            let times = self.base.journal_times(after, TRIM_READ_ROWS)?;
            let Some(&(last, _)) = times.last() else {
                break;
            };
            for (a, t) in times {
                if a > first {
                    next = Some(t);
                    break 'scan;
                }
                at_or_before = Some((a, t));
            }
            after = last;
        }
        let keep = at_or_before.map_or(first, |(a, _)| a);
        if age_ms_max == 0 || first > self.counters.journal_head {
            return Ok((None, keep));
        }
        let written_by = match (at_or_before, next) {
            (Some((_, t)), Some(_)) => t.saturating_add(JOURNAL_TIME_STEP_MS),
            (None, Some(t)) => t,
            (_, None) => self.counters.last_write_ms,
        };
        Ok((Some(written_by.saturating_add(age_ms_max)), keep))
    }

    /// Before the journal row holding envelopes `first_seq..first_seq + n`
    /// of `stream` goes: if `stream` is an own stream, its outbox batches
    /// that hold them lose their payloads with the row — so an acknowledged
    /// one (then the oldest retained) is evicted, and an unacknowledged
    /// one gets its payloads copied into the outbox.
    fn free_for_trim(&mut self, stream: &StreamId, first_seq: Seq, n: u64) -> Result<(), Fail> {
        let Some(mut own) = self.own_stream(stream)? else {
            return Ok(());
        };
        let last_seq = first_seq + n - 1;
        if last_seq < own.first_retained {
            return Ok(());
        }
        // Batches are contiguous from the first retained one.
        let start = first_seq.max(own.first_retained);
        let mut at = if start == own.first_retained {
            start
        } else {
            self.base
                .batch_holding(stream, start)?
                .map_or(start, |(b, _)| b.max(own.first_retained))
        };
        let mut changed = false;
        while at <= last_seq && at < own.next_seq {
            let meta = self.meta_at(&own, at)?;
            if at == own.first_retained && own.evictable_msgs > 0 {
                self.evict_oldest(&mut own)?;
                changed = true;
            } else if !self.batch_moved(stream, at)? {
                let first_arrival = self.batch_first_arrival(&own, at)?;
                self.writes.push(Write::MovePayloads {
                    stream: stream.clone(),
                    first_seq: at,
                    first_arrival,
                    n: meta.msgs,
                });
                self.moved.insert((stream.clone(), at));
            }
            at = meta.last_seq + 1;
        }
        if changed {
            self.set_own(own);
        }
        Ok(())
    }

    fn batch_first_arrival(&mut self, own: &OwnStream, first_seq: Seq) -> Result<Arrival, Fail> {
        match self.base.batch_first_arrival(&own.stream, first_seq)? {
            Some(a) if a > 0 => Ok(a),
            _ => Err(self.corrupt(format!(
                "the outbox batch of {:?} at {first_seq} has no journal position",
                own.stream
            ))),
        }
    }

    /// Ends every own stream of the current epoch and switches to `epoch`.
    fn new_epoch(&mut self, epoch: Epoch) -> Result<(), Fail> {
        let old = self.counters.epoch;
        if epoch == old {
            return refuse(format!(
                "the store is in epoch {} already",
                epoch.fmt_short()
            ));
        }
        let mut streams = self.base.own_streams()?;
        streams
            .retain(|o| !self.own.contains_key(&o.stream) && !self.own_dropped.contains(&o.stream));
        streams.extend(self.own.values().cloned());
        if streams.iter().any(|o| o.stream.epoch == epoch) {
            return refuse(format!("epoch {} was written before", epoch.fmt_short()));
        }
        for own in streams.into_iter().filter(|o| o.stream.epoch == old) {
            // Only what the peer acknowledged is known to be as it has it.
            let ended = EndedOwn {
                stream: own.stream.clone(),
                held: own.last_acked,
                reported: own.last_acked,
                carried: own.last_acked,
            };
            if own.last_acked + 1 >= own.next_seq {
                self.drop_outbox(&own.stream);
            }
            self.set_ended(ended);
        }
        self.counters.epoch = epoch;
        self.writes.push(Write::Epoch(epoch));
        Ok(())
    }

    /// Removes the outbox and the row of the own stream `stream`.
    fn drop_outbox(&mut self, stream: &StreamId) {
        self.own.remove(stream);
        self.own_changed.retain(|s| s != stream);
        self.own_dropped.insert(stream.clone());
        self.batches.retain(|(s, _), _| s != stream);
        self.moved.retain(|(s, _)| s != stream);
        self.writes.push(Write::DropOutbox(stream.clone()));
        self.writes.push(Write::DelOwn(stream.clone()));
    }

    fn ended_or_refuse(&mut self, stream: &StreamId) -> Result<EndedOwn, Fail> {
        match self.ended(stream)? {
            Some(e) => Ok(e),
            None => refuse(format!("{stream:?} is not an ended own stream")),
        }
    }

    fn report_rolled_back(
        &mut self,
        stream: StreamId,
        held: Seq,
        world: Seq,
        detail: String,
    ) -> Result<(), Fail> {
        check_detail(&detail)?;
        let mut e = self.ended_or_refuse(&stream)?;
        let held = e.held.min(held);
        if e.reported == e.held {
            // Nothing reported yet: the report starts after what is held.
            e.reported = held;
        }
        e.held = held;
        if world > e.reported {
            self.journal(JournalRecord::RolledBack {
                stream,
                from: e.reported + 1,
                to: world,
                detail,
            });
            e.reported = world;
        }
        self.set_ended(e);
        Ok(())
    }

    fn carry_over(
        &mut self,
        batch: mesh_protocol::OpenBatch,
        from: StreamId,
        upto: Seq,
    ) -> Result<(), Fail> {
        let mut e = self.ended_or_refuse(&from)?;
        let Some(old) = self.own_stream(&from)? else {
            return refuse(format!("{from:?} has no outbox left to carry"));
        };
        if upto <= e.carried || upto >= old.next_seq {
            return refuse(format!(
                "carry of {from:?} up to {upto}, but it is carried to {} and ends at {}",
                e.carried,
                old.next_seq - 1
            ));
        }
        let (vb, payloads) = batch.into_parts();
        let stream = vb.stream().clone();
        let own = self.append_target(&stream, vb.first_seq())?;
        for h in vb.entries() {
            self.lamport(h.lamport);
        }
        let first_seq = vb.first_seq();
        self.writes.push(Write::PutPayloads {
            stream: stream.clone(),
            first_seq,
            payloads,
        });
        self.moved.insert((stream, first_seq));
        self.append_batch(own, vb.into_signed(), 0);
        e.carried = upto;
        if upto + 1 == old.next_seq {
            self.drop_outbox(&from);
        }
        self.set_ended(e);
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
            WriteOp::Trim {
                now_ms,
                bytes_max,
                age_ms_max,
            } => self.trim(now_ms, bytes_max, age_ms_max),
            WriteOp::RecordLost {
                to,
                msgs,
                bytes,
                first_ms,
                last_ms,
                detail,
            } => {
                check_detail(&detail)?;
                if msgs == 0 || first_ms > last_ms {
                    return refuse(format!(
                        "a lost record of {msgs} sends taken from {first_ms} to {last_ms} ms"
                    ));
                }
                self.journal(JournalRecord::SendsLost {
                    to,
                    msgs,
                    bytes,
                    first_ms,
                    last_ms,
                    detail,
                });
                Ok(())
            }
            WriteOp::EndEpoch { stream } => {
                let last = self.mark(&stream)?;
                if last > 0 {
                    self.journal(JournalRecord::EpochEnded { stream, last });
                }
                Ok(())
            }
            WriteOp::RecordRolledBack {
                stream,
                from,
                to,
                detail,
            } => {
                check_detail(&detail)?;
                if from == 0 || from > to {
                    return refuse(format!(
                        "a rolled-back record of {stream:?} for {from}..={to}"
                    ));
                }
                self.journal(JournalRecord::RolledBack {
                    stream,
                    from,
                    to,
                    detail,
                });
                Ok(())
            }
            WriteOp::RecordConflict {
                stream,
                seq,
                ours,
                theirs,
            } => {
                self.journal(JournalRecord::Conflict {
                    stream,
                    seq,
                    ours,
                    theirs,
                });
                Ok(())
            }
            WriteOp::NewEpoch { epoch } => self.new_epoch(epoch),
            WriteOp::ReportRolledBack {
                stream,
                held,
                world,
                detail,
            } => self.report_rolled_back(stream, held, world, detail),
            WriteOp::CarryOver { batch, from, upto } => self.carry_over(batch, from, upto),
            WriteOp::DropEnded { stream } => {
                let mut e = self.ended_or_refuse(&stream)?;
                if self.own_stream(&stream)?.is_some() {
                    self.drop_outbox(&stream);
                }
                e.carried = e.carried.max(e.held);
                self.set_ended(e);
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

/// Refuses free text longer than [`DETAIL_BYTES_MAX`].
fn check_detail(detail: &str) -> Result<(), Fail> {
    if detail.len() > DETAIL_BYTES_MAX {
        return refuse(format!(
            "a record's detail of {} bytes is longer than the {DETAIL_BYTES_MAX} allowed",
            detail.len()
        ));
    }
    Ok(())
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
        own_dropped: BTreeSet::new(),
        marks: BTreeMap::new(),
        mark_cids: BTreeMap::new(),
        batches: BTreeMap::new(),
        moved: BTreeSet::new(),
        ended: BTreeMap::new(),
        writes: Vec::new(),
        first_arrival: None,
        runs: Vec::new(),
        trim: None,
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
    for (stream, cid) in std::mem::take(&mut view.mark_cids) {
        view.writes.push(Write::MarkCid { stream, cid });
    }
    let ended: Vec<EndedOwn> = std::mem::take(&mut view.ended).into_values().collect();
    for e in &ended {
        view.writes.push(Write::Ended(e.clone()));
    }
    let arrivals = view.first_arrival.map(|f| (f, view.counters.journal_head));
    *counters = view.counters;
    Ok(Plan {
        writes: view.writes,
        receipt: Receipt {
            arrivals,
            own_streams,
            trim: view.trim,
            ended,
        },
    })
}
