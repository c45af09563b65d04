//! The write rules, written once for both implementations.
//!
//! A caller's group of [`WriteOp`]s is checked and turned into a list of
//! primitive [`Write`]s against a read view of the committed state ([`Base`])
//! plus the group's own earlier effects. Nothing is written while planning, so
//! a refused group leaves no trace; a planned group is applied as a whole.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{Cid, Epoch, NodeId, Seq, StreamId};

use crate::agents::{self, Run};
use crate::{
    AgentOp, Arrival, EndedOwn, INVITE_SPEND_REQUESTS_MAX, INVITE_USES_MAX, InviteRecord,
    JournalBounds, JournalRecord, LossReason, OwnStream, ReadReport, Receipt, StoreError,
    TrimReport, WriteOp,
};

mod base;
mod epoch;
mod outbox;
mod receive;
mod topic;
mod trim;

pub(crate) use base::{Base, BatchMeta, RowInfo, Write, agent_entries};

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
    /// Topics joined (`Some`) or left (`None`) by this group.
    topics: BTreeMap<mesh_protocol::TopicName, Option<crate::TopicRecord>>,
    /// What this group's read receipts marked, skipped and refused.
    read: ReadReport,
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

    /// Journals a loss record of `stream` for `from..=to`.
    fn record_loss(
        &mut self,
        stream: StreamId,
        from: Seq,
        to: Seq,
        reason: LossReason,
        detail: String,
    ) -> Result<(), Fail> {
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

    /// Sets the durable cursor `name` to `arrival`, at most the journal head.
    fn put_cursor(&mut self, name: String, arrival: Arrival) -> Result<(), Fail> {
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

    /// Journals that `msgs` sends to `to` were held too long and let go.
    fn record_lost(
        &mut self,
        to: NodeId,
        msgs: u64,
        bytes: u64,
        first_ms: u64,
        last_ms: u64,
        detail: String,
    ) -> Result<(), Fail> {
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

    /// Journals the end of the received `stream` at its mark, if any is held.
    fn end_epoch(&mut self, stream: StreamId) -> Result<(), Fail> {
        let last = self.mark(&stream)?;
        if last > 0 {
            self.journal(JournalRecord::EpochEnded { stream, last });
        }
        Ok(())
    }

    /// Journals that the author of `stream` lost `from..=to`.
    fn record_rolled_back(
        &mut self,
        stream: StreamId,
        from: Seq,
        to: Seq,
        detail: String,
    ) -> Result<(), Fail> {
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

    /// Journals that `stream` at `seq` came with another payload than ours.
    fn record_conflict(
        &mut self,
        stream: StreamId,
        seq: Seq,
        ours: Cid,
        theirs: Cid,
    ) -> Result<(), Fail> {
        self.journal(JournalRecord::Conflict {
            stream,
            seq,
            ours,
            theirs,
        });
        Ok(())
    }

    /// Writes an invite's record once its uses and spends are in bounds.
    fn put_invite(&mut self, invite: InviteRecord) -> Result<(), Fail> {
        check_invite(&invite)?;
        self.writes.push(Write::PutInvite(invite));
        Ok(())
    }

    /// Plans an agent write against the envelopes this group journaled.
    fn agents(&mut self, op: AgentOp) -> Result<(), Fail> {
        let op = self.expand_forwarded(op)?;
        let op = self.filter_read(op)?;
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

    /// Expands the forwarded entries of an index op into an inbox and a
    /// message entry each, leaving out those whose message the index has
    /// already (or an earlier entry of this op has): a message passed on
    /// twice is indexed once.
    fn expand_forwarded(&mut self, op: AgentOp) -> Result<AgentOp, Fail> {
        use crate::AgentIndex;
        let AgentOp::Index { stream, entries } = op else {
            return Ok(op);
        };
        if !entries
            .iter()
            .any(|e| matches!(e, AgentIndex::Forwarded { .. }))
        {
            // The common case: nothing to expand, nothing to move.
            return Ok(AgentOp::Index { stream, entries });
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            match e {
                AgentIndex::Forwarded {
                    agent,
                    id,
                    seq,
                    inbox,
                    message,
                } => {
                    if !seen.insert(id) {
                        continue;
                    }
                    let known = self.base.message_place(&id)?;
                    // Where an inbox here last took it: received straight,
                    // or an earlier forward taken while the index had it.
                    let received = match known {
                        Some((crate::MessageDir::Received, at)) => Some(at),
                        _ => None,
                    };
                    let taken = match known {
                        Some(_) => self.base.forward_taken(&id)?,
                        None => None,
                    };
                    if let Some(at) = received.max(taken) {
                        // Once is enough, unless the agent came back here
                        // and reads on from past where it had it.
                        let back = self.base.agent_cursor(&agent, crate::RESUMED_CURSOR)?;
                        if back.is_none_or(|r| at > r) {
                            continue;
                        }
                    }
                    out.push(AgentIndex::Inbox {
                        agent,
                        seq,
                        row: inbox,
                    });
                    if known.is_none() {
                        out.push(AgentIndex::Message {
                            id,
                            seq,
                            row: message,
                        });
                    } else {
                        // Taken again (the agent came back here, or this
                        // node's own message came back to the agent that
                        // moved here: its row says sent, and stays): the
                        // next copy of it is measured against this one.
                        out.push(AgentIndex::ForwardTaken { id, seq });
                    }
                }
                other => out.push(other),
            }
        }
        Ok(AgentOp::Index {
            stream,
            entries: out,
        })
    }

    /// Keeps, of each read receipt entry of an index op, the ids this node
    /// sent to the reader's node and has not marked read yet (nor has an
    /// earlier entry of this op); the rest are counted as skipped, and an
    /// entry left with none is counted as refused (the plan then writes
    /// neither its inbox entry nor a mark).
    fn filter_read(&mut self, op: AgentOp) -> Result<AgentOp, Fail> {
        use crate::AgentIndex;
        let AgentOp::Index {
            stream,
            mut entries,
        } = op
        else {
            return Ok(op);
        };
        let mut seen = std::collections::BTreeSet::new();
        for e in &mut entries {
            let AgentIndex::Read { mark, ids, .. } = e else {
                continue;
            };
            let asked = ids.len() as u64;
            let mut kept = Vec::with_capacity(ids.len());
            for id in std::mem::take(ids) {
                let sent_there = self
                    .base
                    .sent_to(&id)?
                    .is_some_and(|to| mesh_protocol::same_node(&to, &mark.node));
                if sent_there && !self.base.is_read(&id)? && seen.insert(id) {
                    kept.push(id);
                }
            }
            self.read.marked += kept.len() as u64;
            self.read.skipped += asked - kept.len() as u64;
            if kept.is_empty() {
                self.read.refused += 1;
            } else {
                self.read.taken += 1;
            }
            *ids = kept;
        }
        Ok(AgentOp::Index { stream, entries })
    }

    /// Queues `w` as it is: its op has nothing to check.
    fn write(&mut self, w: Write) -> Result<(), Fail> {
        self.writes.push(w);
        Ok(())
    }

    /// Checks `op` against the view and plans its writes: one arm per op.
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
            } => self.record_loss(stream, from, to, reason, detail),
            WriteOp::RecordLag {
                subscriber,
                from,
                to,
            } => self.record_lag(subscriber, from, to),
            WriteOp::PutPeer(p) => self.write(Write::PutPeer(p)),
            WriteOp::RemovePeer(n) => self.write(Write::RemovePeer(n)),
            WriteOp::PutCursor { name, arrival } => self.put_cursor(name, arrival),
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
            } => self.record_lost(to, msgs, bytes, first_ms, last_ms, detail),
            WriteOp::EndEpoch { stream } => self.end_epoch(stream),
            WriteOp::RecordRolledBack {
                stream,
                from,
                to,
                detail,
            } => self.record_rolled_back(stream, from, to, detail),
            WriteOp::RecordDrainEnded {
                agent,
                to,
                passed,
                detail,
            } => {
                if self.base.inbox_after(&agent, passed)? {
                    return refuse(format!(
                        "agent {agent}'s inbox has entries after arrival {passed}, which were \
                         not passed on: the drain goes on"
                    ));
                }
                self.journal(JournalRecord::DrainEnded { agent, to, detail });
                Ok(())
            }
            WriteOp::RecordConflict {
                stream,
                seq,
                ours,
                theirs,
            } => self.record_conflict(stream, seq, ours, theirs),
            WriteOp::NewEpoch { epoch } => self.new_epoch(epoch),
            WriteOp::ReportRolledBack {
                stream,
                held,
                world,
                detail,
            } => self.report_rolled_back(stream, held, world, detail),
            WriteOp::CarryOver { batch, from, upto } => self.carry_over(batch, from, upto),
            WriteOp::DropEnded { stream } => self.drop_ended(stream),
            WriteOp::Supersede { batch, by } => self.supersede(batch, by),
            WriteOp::PutCard(card) => self.write(Write::PutCard(card)),
            WriteOp::PutInvite(invite) => self.put_invite(invite),
            WriteOp::Agents(op) => self.agents(op),
            WriteOp::JoinTopic(record) => self.join_topic(record),
            WriteOp::LeaveTopic { topic } => self.leave_topic(topic),
            WriteOp::AcceptTopic { batch, from, evict } => self.accept_topic(batch, from, evict),
        }
    }
}

/// Refuses an invite with 0 or too many uses, more spends than uses, or a
/// spend remembering too many requests.
fn check_invite(invite: &InviteRecord) -> Result<(), Fail> {
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
    Ok(())
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
        topics: BTreeMap::new(),
        read: ReadReport::default(),
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
            read: view.read,
        },
    })
}
