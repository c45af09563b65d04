//! The author side: appending own batches to the outbox, acknowledgements,
//! and evicting what the outbox bounds or the acknowledgements free.

use std::collections::BTreeSet;

use mesh_protocol::{AgentHeader, AgentName, KIND_AGENT, Seq, SignedBatch, StreamId};

use super::{Base, BatchMeta, Fail, GroupView, Write, refuse};
use crate::agents::AgentWrite;
use crate::{Arrival, Eviction, InboxKind, InboxRow, JournalRecord, LossReason, OwnStream};

impl<B: Base> GroupView<'_, B> {
    /// The stored meta of the batch of `own` that starts at `first_seq`,
    /// which the stream's counters say exists.
    pub(super) fn meta_at(&mut self, own: &OwnStream, first_seq: Seq) -> Result<BatchMeta, Fail> {
        match self.batch_meta(&own.stream, first_seq)? {
            Some(meta) => Ok(meta),
            None => Err(self.corrupt(format!(
                "outbox of {:?} holds seqs {}..{} but has no batch starting at {first_seq}",
                own.stream, own.first_retained, own.next_seq
            ))),
        }
    }

    /// Removes the oldest batch of `own`, returning it. The outbox must not be empty.
    pub(super) fn evict_oldest(&mut self, own: &mut OwnStream) -> Result<BatchMeta, Fail> {
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
    pub(super) fn make_room(&mut self, own: &mut OwnStream, evict: Eviction) -> Result<(), Fail> {
        let mut lost: Option<(Seq, Seq)> = None;
        let mut senders = BTreeSet::new();
        while own.msgs > evict.msgs_max || own.bytes > evict.bytes_max {
            let first = own.first_retained;
            if own.evictable_msgs == 0 && evict.loss.is_none() {
                return refuse(format!(
                    "evicting down to {} msgs / {} bytes would drop unacknowledged seqs of {:?} \
                     from {first} without a loss record",
                    evict.msgs_max, evict.bytes_max, own.stream
                ));
            }
            // The first seq this batch gives up unacknowledged, if it gives up any.
            let unacked = (own.evictable_msgs == 0).then(|| first.max(own.last_acked + 1));
            if let Some(from) = unacked {
                self.senders_in(&own.stream, first, from, &mut senders)?;
            }
            let meta = self.evict_oldest(own)?;
            if let Some(from) = unacked {
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
            // Each agent whose message it gives up is told in its inbox.
            let arrival = self.counters.journal_head;
            for agent in senders {
                // As for a bounce: an agent removed since it sent is told nothing.
                if !self.base.is_agent(&agent)? {
                    continue;
                }
                self.writes.push(Write::Agents(AgentWrite::Inbox {
                    agent,
                    arrival,
                    row: InboxRow {
                        kind: InboxKind::Lost,
                        verified: true,
                        in_reply_to: None,
                    },
                }));
            }
        }
        Ok(())
    }

    /// Adds to `senders` the sending agent of each agent message from
    /// seq `from` on in the outbox batch of `stream` at `first`.
    fn senders_in(
        &mut self,
        stream: &StreamId,
        first: Seq,
        from: Seq,
        senders: &mut BTreeSet<AgentName>,
    ) -> Result<(), Fail> {
        // The core wrote them: one that does not decode names no sender.
        let mut note = |payload: &[u8]| {
            if let Ok(h) = AgentHeader::decode(payload) {
                senders.insert(h.from);
            }
        };
        if let Some(Some(meta)) = self.batches.get(&(stream.clone(), first)) {
            // Appended by this group: its envelopes are among the group's writes.
            let last = meta.last_seq;
            for w in &self.writes {
                if let Write::Journal {
                    record:
                        JournalRecord::Envelope {
                            stream: s,
                            seq,
                            kind: KIND_AGENT,
                            payload,
                            ..
                        },
                    ..
                } = w
                    && s == stream
                    && (from.max(first)..=last).contains(seq)
                {
                    note(payload);
                }
            }
            return Ok(());
        }
        for payload in self
            .base
            .agent_payloads(stream, first, from)?
            .unwrap_or_default()
        {
            note(&payload);
        }
        Ok(())
    }

    /// The own stream `batch` appends to, after the checks every append
    /// makes: this store's current epoch, and the stream's next seq.
    pub(super) fn append_target(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<OwnStream, Fail> {
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
    pub(super) fn append_batch(
        &mut self,
        mut own: OwnStream,
        batch: SignedBatch,
        first_arrival: Arrival,
    ) {
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

    pub(super) fn append_own(
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

    /// Replaces the unacknowledged one-envelope batch at `batch`'s seq
    /// with `batch` (see [`crate::WriteOp::Supersede`]).
    pub(super) fn supersede(
        &mut self,
        batch: mesh_protocol::OpenBatch,
        by: Seq,
    ) -> Result<(), Fail> {
        let (vb, payloads) = batch.into_parts();
        let stream = vb.stream().clone();
        let seq = vb.first_seq();
        if stream.epoch != self.counters.epoch {
            return refuse(format!(
                "supersede in {stream:?}, which is not of this store's epoch"
            ));
        }
        let Some(mut own) = self.own_stream(&stream)? else {
            return refuse(format!(
                "supersede in {stream:?}, which this store does not write"
            ));
        };
        if vb.entries().len() != 1 {
            return refuse(format!(
                "a tombstone batch of {stream:?} at {seq} holds {} envelopes, not one",
                vb.entries().len()
            ));
        }
        if seq <= own.last_acked || seq < own.first_retained || by <= seq || by >= own.next_seq {
            return refuse(format!(
                "supersede of {stream:?} seq {seq} by {by}: the outbox holds {}..{}, acknowledged \
                 up to {}",
                own.first_retained, own.next_seq, own.last_acked
            ));
        }
        let old = match self.batch_meta(&stream, seq)? {
            Some(m) if m.last_seq == seq => m,
            _ => {
                return refuse(format!(
                    "supersede of {stream:?} seq {seq}: no batch of that one envelope"
                ));
            }
        };
        let new = BatchMeta {
            last_seq: seq,
            msgs: 1,
            bytes: payloads.iter().map(|p| p.len() as u64).sum(),
        };
        for h in vb.entries() {
            self.lamport(h.lamport);
        }
        let key = (stream.clone(), seq);
        self.writes.push(Write::DelBatch {
            stream: stream.clone(),
            first_seq: seq,
        });
        self.writes.push(Write::PutPayloads {
            stream: stream.clone(),
            first_seq: seq,
            payloads,
        });
        self.writes.push(Write::PutBatch {
            first_seq: seq,
            batch: vb.into_signed(),
            first_arrival: 0,
        });
        self.moved.insert(key.clone());
        self.batches.insert(key, Some(new));
        own.bytes = own.bytes - old.bytes + new.bytes;
        self.set_own(own);
        Ok(())
    }

    pub(super) fn acked(&mut self, stream: StreamId, upto: Seq, reset: bool) -> Result<(), Fail> {
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
}
