//! A commit's two halves in memory: the read view the rules plan against
//! ([`Base`]), and applying the writes they planned to the maps.

use mesh_protocol::{Cid, Seq, SignedBatch, StreamId};

use super::{Agents, State, record_bytes};
use crate::agents::{AgentWrite, dedup_key_bytes};
use crate::logic::{Base, BatchMeta, RowInfo, TxCounters, Write};
use crate::{Arrival, EndedOwn, JournalRecord, OwnStream, StoreError};

impl Agents {
    fn apply(&mut self, w: AgentWrite) {
        match w {
            AgentWrite::PutAgent(r) => {
                self.agents.insert(r.name.clone(), r);
            }
            AgentWrite::RemoveAgent(name) => {
                self.agents.remove(&name);
                self.trimmed.remove(&name);
                self.inbox.retain(|(a, _), _| *a != name);
                self.cursors.retain(|(a, _), _| *a != name);
            }
            AgentWrite::Inbox {
                agent,
                arrival,
                row,
            } => {
                self.inbox.insert((agent, arrival), row);
            }
            AgentWrite::Message { id, row } => {
                if let Some(reason) = row.undelivered {
                    self.undelivered.insert(id, reason);
                }
                self.messages.insert(id, crate::agents::Place::of(&row));
            }
            AgentWrite::ForwardTaken { id, arrival } => {
                self.forwards.insert(id, arrival);
            }
            AgentWrite::Bounced { id, reason } => {
                self.undelivered.insert(id, reason);
            }
            AgentWrite::Superseded { id, by } => {
                self.superseded.insert(id, by);
            }
            AgentWrite::Read { id, mark } => {
                self.read.insert(id, mark);
            }
            AgentWrite::Dedup(r) => {
                self.dedup.insert((r.at_ms, dedup_key_bytes(&r.key)), r);
            }
            AgentWrite::ExpireDedup { before_ms } => {
                self.dedup.retain(|(at, _), _| *at >= before_ms);
            }
            AgentWrite::ForgetDedup { at_ms, key } => {
                self.dedup.remove(&(at_ms, dedup_key_bytes(&key)));
            }
            AgentWrite::Move(notice) => {
                self.moves.insert(notice.key, notice);
            }
            AgentWrite::Alias { alias, node } => match node {
                Some(n) => {
                    self.aliases.insert(alias, n);
                }
                None => {
                    self.aliases.remove(&alias);
                }
            },
            AgentWrite::Cursor {
                agent,
                name,
                arrival,
            } => {
                self.cursors.insert((agent, name), arrival);
            }
            AgentWrite::TrimMessages { tag, from, to } => {
                let lo = mesh_protocol::MsgId::in_stream(tag, from);
                let hi = mesh_protocol::MsgId::in_stream(tag, to);
                let gone = |id: &mesh_protocol::MsgId| (lo..=hi).contains(id);
                self.messages.retain(|id, _| !gone(id));
                self.undelivered.retain(|id, _| !gone(id));
                self.superseded.retain(|id, _| !gone(id));
                self.read.retain(|id, _| !gone(id));
                self.forwards.retain(|id, _| !gone(id));
            }
            AgentWrite::TrimInboxes { before } => {
                let gone: Vec<(mesh_protocol::AgentName, Arrival)> = self
                    .inbox
                    .keys()
                    .filter(|(_, a)| *a < before)
                    .cloned()
                    .collect();
                for (agent, arrival) in gone {
                    self.inbox.remove(&(agent.clone(), arrival));
                    let last = self.trimmed.entry(agent).or_default();
                    *last = (*last).max(arrival);
                }
            }
        }
    }
}

pub(super) struct MemBase<'a> {
    pub(super) state: &'a State,
}

impl Base for MemBase<'_> {
    fn name(&self) -> &str {
        "in-memory store"
    }

    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, StoreError> {
        Ok(self.state.own.get(stream).cloned())
    }

    fn own_streams(&mut self) -> Result<Vec<OwnStream>, StoreError> {
        Ok(self.state.own.values().cloned().collect())
    }

    fn batch_meta(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<BatchMeta>, StoreError> {
        Ok(self
            .state
            .outbox
            .get(&(stream.clone(), first_seq))
            .map(|(b, _)| BatchMeta::of(b)))
    }

    fn batch_first_arrival(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<Arrival>, StoreError> {
        Ok(self
            .state
            .outbox
            .get(&(stream.clone(), first_seq))
            .map(|(_, a)| *a))
    }

    fn batch_holding(
        &mut self,
        stream: &StreamId,
        seq: Seq,
    ) -> Result<Option<(Seq, BatchMeta)>, StoreError> {
        Ok(self
            .state
            .outbox
            .range((stream.clone(), 0)..=(stream.clone(), seq))
            .next_back()
            .map(|((_, first), (b, _))| (*first, BatchMeta::of(b))))
    }

    fn batch_moved(&mut self, stream: &StreamId, first_seq: Seq) -> Result<bool, StoreError> {
        Ok(self
            .state
            .payloads
            .contains_key(&(stream.clone(), first_seq)))
    }

    fn agent_payloads(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
        from: Seq,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let key = (stream.clone(), first_seq);
        let Some((batch, first_arrival)) = self.state.outbox.get(&key) else {
            return Ok(None);
        };
        let wanted = crate::logic::agent_entries(batch, from);
        let payload = |i: usize| -> Option<Vec<u8>> {
            if let Some(kept) = self.state.payloads.get(&key) {
                return kept.get(i).cloned();
            }
            match self.state.journal.get(&(first_arrival + i as u64)) {
                Some(JournalRecord::Envelope { payload, .. }) => Some(payload.clone()),
                _ => None,
            }
        };
        Ok(Some(wanted.into_iter().filter_map(payload).collect()))
    }

    fn is_agent(&mut self, agent: &mesh_protocol::AgentName) -> Result<bool, StoreError> {
        Ok(self.state.agents.agents.contains_key(agent))
    }

    fn inbox_after(
        &mut self,
        agent: &mesh_protocol::AgentName,
        after: Arrival,
    ) -> Result<bool, StoreError> {
        Ok(self
            .state
            .agents
            .inbox
            .range((agent.clone(), after + 1)..)
            .next()
            .is_some_and(|((a, _), _)| a == agent))
    }

    fn forward_taken(&mut self, id: &mesh_protocol::MsgId) -> Result<Option<Arrival>, StoreError> {
        Ok(self.state.agents.forwards.get(id).copied())
    }

    fn message_place(
        &mut self,
        id: &mesh_protocol::MsgId,
    ) -> Result<Option<(crate::MessageDir, Arrival)>, StoreError> {
        Ok(self
            .state
            .agents
            .messages
            .get(id)
            .map(|p| (p.dir, p.arrival)))
    }

    fn sent_to(
        &mut self,
        id: &mesh_protocol::MsgId,
    ) -> Result<Option<mesh_protocol::NodeId>, StoreError> {
        Ok(self
            .state
            .agents
            .messages
            .get(id)
            .filter(|p| p.dir == crate::MessageDir::Sent)
            .and_then(|p| p.stream.recipient()))
    }

    fn is_read(&mut self, id: &mesh_protocol::MsgId) -> Result<bool, StoreError> {
        Ok(self.state.agents.read.contains_key(id))
    }

    fn agent_cursor(
        &mut self,
        agent: &mesh_protocol::AgentName,
        name: &str,
    ) -> Result<Option<Arrival>, StoreError> {
        Ok(self
            .state
            .agents
            .cursors
            .get(&(agent.clone(), name.to_owned()))
            .copied())
    }

    fn mark(&mut self, stream: &StreamId) -> Result<Option<Seq>, StoreError> {
        Ok(self.state.marks.get(stream).copied())
    }

    fn journal_rows(&mut self, from: Arrival, max: usize) -> Result<Vec<RowInfo>, StoreError> {
        Ok(self
            .state
            .journal
            .range(from..)
            .take(max)
            .map(|(a, r)| RowInfo {
                first: *a,
                last: *a,
                bytes: record_bytes(r),
                run: match r {
                    JournalRecord::Envelope { stream, seq, .. } => Some((stream.clone(), *seq, 1)),
                    _ => None,
                },
            })
            .collect())
    }

    fn journal_times(
        &mut self,
        after: Arrival,
        max: usize,
    ) -> Result<Vec<(Arrival, u64)>, StoreError> {
        Ok(self
            .state
            .times
            .range(after.saturating_add(1)..)
            .take(max)
            .map(|(a, t)| (*a, *t))
            .collect())
    }

    fn ended(&mut self, stream: &StreamId) -> Result<Option<EndedOwn>, StoreError> {
        Ok(self.state.ended.get(stream).cloned())
    }

    fn topics(&mut self) -> Result<Vec<crate::TopicRecord>, StoreError> {
        Ok(self.state.topics.values().cloned().collect())
    }
}

impl State {
    /// Applies a planned group's writes, in order.
    pub(super) fn apply(&mut self, writes: Vec<Write>) {
        for w in writes {
            self.write(w);
        }
    }

    /// Applies one write to the maps.
    fn write(&mut self, w: Write) {
        match w {
            Write::OwnStream(o) => {
                self.own.insert(o.stream.clone(), o);
            }
            Write::DelOwn(stream) => {
                self.own.remove(&stream);
            }
            Write::PutBatch {
                first_seq,
                batch,
                first_arrival,
            } => self.put_batch(first_seq, batch, first_arrival),
            Write::DelBatch { stream, first_seq } => {
                self.outbox.remove(&(stream.clone(), first_seq));
                self.payloads.remove(&(stream, first_seq));
            }
            Write::DropOutbox(stream) => {
                self.outbox.retain(|(s, _), _| *s != stream);
                self.payloads.retain(|(s, _), _| *s != stream);
            }
            Write::PutPayloads {
                stream,
                first_seq,
                payloads,
            } => {
                self.payloads.insert((stream, first_seq), payloads);
            }
            Write::MovePayloads {
                stream,
                first_seq,
                first_arrival,
                n,
            } => self.move_payloads(stream, first_seq, first_arrival, n),
            Write::DelJournal { first, last } => self.del_journal(first, last),
            Write::DelTimesBefore(first) => {
                self.times = self.times.split_off(&first);
            }
            Write::Mark { stream, seq } => {
                self.marks.insert(stream, seq);
            }
            Write::MarkCid { stream, cid } => self.mark_cid(stream, cid),
            Write::Ended(e) => {
                self.ended.insert(e.stream.clone(), e);
            }
            Write::Journal { arrival, record } => self.append_journal(arrival, record),
            Write::PutPeer(p) => {
                self.peers.insert(*p.node.as_bytes(), p);
            }
            Write::RemovePeer(n) => {
                self.peers.remove(n.as_bytes());
                self.cards.remove(n.as_bytes());
            }
            Write::Cursor { name, arrival } => {
                self.cursors.insert(name, arrival);
            }
            Write::Epoch(epoch) => self.epoch = epoch,
            Write::PutCard(card) => {
                self.cards.insert(*card.node.as_bytes(), card);
            }
            Write::PutInvite(invite) => {
                self.invites.insert(invite.id, invite);
            }
            Write::PutTopic(topic) => {
                self.topics.insert(topic.name.clone(), topic);
            }
            Write::DelTopic(name) => {
                self.topics.remove(&name);
            }
            Write::Agents(w) => self.agents.apply(w),
        }
    }

    /// Keeps the outbox batch `batch`, which starts at `first_seq`.
    fn put_batch(&mut self, first_seq: Seq, batch: SignedBatch, first_arrival: Arrival) {
        let stream = StreamId {
            author: batch.author,
            epoch: batch.epoch,
            channel: batch.channel.clone(),
        };
        self.outbox
            .insert((stream, first_seq), (batch, first_arrival));
    }

    /// Copies the `n` payloads of the outbox batch of `stream` at
    /// `first_seq` from the journal (from `first_arrival`) to the outbox.
    fn move_payloads(&mut self, stream: StreamId, first_seq: Seq, first_arrival: Arrival, n: u64) {
        let payloads = (0..n)
            .filter_map(|i| match self.journal.get(&(first_arrival + i)) {
                Some(JournalRecord::Envelope { payload, .. }) => Some(payload.clone()),
                _ => None,
            })
            .collect();
        self.payloads.insert((stream, first_seq), payloads);
    }

    /// Removes the journal entries at arrivals `first..=last`.
    fn del_journal(&mut self, first: Arrival, last: Arrival) {
        let kept = self.journal.split_off(&(last + 1));
        self.journal.retain(|a, _| *a < first);
        self.journal.extend(kept);
    }

    /// Sets (`Some`) or clears the cid of the mark of `stream`.
    fn mark_cid(&mut self, stream: StreamId, cid: Option<Cid>) {
        match cid {
            Some(c) => {
                self.mark_cids.insert(stream, c);
            }
            None => {
                self.mark_cids.remove(&stream);
            }
        }
    }

    /// Journals `record` at `arrival`, counting its bytes.
    fn append_journal(&mut self, arrival: Arrival, record: JournalRecord) {
        self.journal_bytes += record_bytes(&record);
        self.journal_head = self.journal_head.max(arrival);
        self.journal.insert(arrival, record);
    }

    pub(super) fn counters(&self) -> TxCounters {
        TxCounters {
            journal_head: self.journal_head,
            max_lamport: self.max_lamport,
            journal_first: self.journal_first,
            journal_bytes: self.journal_bytes,
            last_write_ms: self.last_write_ms,
            epoch: self.epoch,
            now_ms: None,
        }
    }
}
