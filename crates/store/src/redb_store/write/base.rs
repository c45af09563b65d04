//! The planner's read view of a commit: what the store's rules read,
//! from the write transaction's own tables.

use super::*;

impl Base for Tables<'_> {
    fn name(&self) -> &str {
        self.name
    }

    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, StoreError> {
        if let Some(o) = self.own_pending.get(stream) {
            return Ok(Some(o.clone()));
        }
        let k = stream_key(stream)?;
        let v = self.own.get(k.as_slice()).map_err(|e| self.err(e))?;
        let counters: Option<OwnCounters> = v
            .map(|v| decode(self.name, "own stream", v.value()))
            .transpose()?;
        counters
            .map(|c| c.with(stream.clone(), self.name))
            .transpose()
    }

    fn own_streams(&mut self) -> Result<Vec<OwnStream>, StoreError> {
        let mut out = Vec::new();
        for row in self.own.iter().map_err(|e| self.err(e))? {
            let (k, v) = row.map_err(|e| self.err(e))?;
            let stream: StreamId = decode(self.name, "stream id", k.value())?;
            if self.own_pending.contains_key(&stream) {
                continue;
            }
            let counters: OwnCounters = decode(self.name, "own stream", v.value())?;
            out.push(counters.with(stream, self.name)?);
        }
        out.extend(self.own_pending.values().cloned());
        Ok(out)
    }

    fn batch_meta(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<BatchMeta>, StoreError> {
        let k = stream_key(stream)?;
        outbox_meta(&self.outbox, &k, first_seq, self.name)
    }

    fn batch_holding(
        &mut self,
        stream: &StreamId,
        seq: Seq,
    ) -> Result<Option<(Seq, BatchMeta)>, StoreError> {
        let k = stream_key(stream)?;
        let k = k.as_slice();
        let row = self
            .outbox
            .range((k, 0)..=(k, seq))
            .map_err(|e| self.err(e))?
            .next_back();
        let Some(row) = row else { return Ok(None) };
        let (key, v) = row.map_err(|e| self.err(e))?;
        let first = key.value().1;
        Ok(Some((first, decode_meta(v.value(), self.name)?)))
    }

    fn batch_first_arrival(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<Arrival>, StoreError> {
        let k = stream_key(stream)?;
        let v = self
            .outbox
            .get((k.as_slice(), first_seq))
            .map_err(|e| self.err(e))?;
        let Some(v) = v else { return Ok(None) };
        let b: BatchOwned = decode(self.name, "outbox batch", v.value())?;
        Ok(Some(b.first_arrival))
    }

    fn batch_moved(&mut self, stream: &StreamId, first_seq: Seq) -> Result<bool, StoreError> {
        let k = stream_key(stream)?;
        Ok(self
            .payloads
            .get((k.as_slice(), first_seq))
            .map_err(|e| self.err(e))?
            .is_some())
    }

    fn agent_payloads(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
        from: Seq,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let k = stream_key(stream)?;
        let key = (k.as_slice(), first_seq);
        let Some(v) = self.outbox.get(key).map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        let b: BatchOwned = decode(self.name, "outbox batch", v.value())?;
        drop(v);
        let wanted = crate::logic::agent_entries(&b.batch, from);
        if wanted.is_empty() {
            return Ok(Some(Vec::new()));
        }
        if self
            .journal_pending
            .first()
            .is_some_and(|(a, _)| *a <= b.first_arrival)
        {
            // Journaled by an earlier group of this transaction, at
            // consecutive arrivals from the batch's first (the pending
            // records are in arrival order).
            let at = |i: usize| {
                let pending = &self.journal_pending;
                let n = pending
                    .binary_search_by_key(&(b.first_arrival + i as u64), |(a, _)| *a)
                    .ok()?;
                match &pending[n].1 {
                    JournalRecord::Envelope { payload, .. } => Some(payload.clone()),
                    _ => None,
                }
            };
            return Ok(Some(wanted.into_iter().filter_map(at).collect()));
        }
        let kept = self.payloads.get(key).map_err(|e| self.err(e))?;
        let mut all: Vec<Vec<u8>> = if let Some(v) = kept {
            let p: Vec<serde_bytes::ByteBuf> = decode(self.name, "outbox payloads", v.value())?;
            p.into_iter().map(serde_bytes::ByteBuf::into_vec).collect()
        } else {
            read::journal_payloads(self.name, &self.journal, &k, &b.batch, b.first_arrival)?
        };
        Ok(Some(
            wanted
                .into_iter()
                .filter_map(|i| all.get_mut(i).map(std::mem::take))
                .collect(),
        ))
    }

    fn is_agent(&mut self, agent: &mesh_protocol::AgentName) -> Result<bool, StoreError> {
        self.agents.has_agent(agent, self.name)
    }

    fn inbox_after(
        &mut self,
        agent: &mesh_protocol::AgentName,
        after: crate::Arrival,
    ) -> Result<bool, StoreError> {
        self.agents
            .inbox_after(agent, after, &self.journal, self.name)
    }

    fn forward_taken(
        &mut self,
        id: &mesh_protocol::MsgId,
    ) -> Result<Option<crate::Arrival>, StoreError> {
        self.agents.forward_taken(id, self.name)
    }

    fn message_place(
        &mut self,
        id: &mesh_protocol::MsgId,
    ) -> Result<Option<(crate::MessageDir, crate::Arrival)>, StoreError> {
        self.agents.message_place(id, &self.journal, self.name)
    }

    fn sent_to(
        &mut self,
        id: &mesh_protocol::MsgId,
    ) -> Result<Option<mesh_protocol::NodeId>, StoreError> {
        Ok(self
            .agents
            .message_at(id, &self.journal, self.name)?
            .filter(|p| p.dir == crate::MessageDir::Sent)
            .and_then(|p| p.stream.recipient()))
    }

    fn is_read(&mut self, id: &mesh_protocol::MsgId) -> Result<bool, StoreError> {
        self.agents.is_read(id, self.name)
    }

    fn agent_cursor(
        &mut self,
        agent: &mesh_protocol::AgentName,
        name: &str,
    ) -> Result<Option<crate::Arrival>, StoreError> {
        self.agents.agent_cursor(agent, name, self.name)
    }

    fn mark(&mut self, stream: &StreamId) -> Result<Option<Seq>, StoreError> {
        if let Some(m) = self.marks_pending.get(stream) {
            return Ok(Some(*m));
        }
        let k = stream_key(stream)?;
        Ok(self
            .marks
            .get(k.as_slice())
            .map_err(|e| self.err(e))?
            .map(|v| v.value()))
    }

    fn journal_rows(&mut self, from: Arrival, max: usize) -> Result<Vec<RowInfo>, StoreError> {
        let mut out = Vec::new();
        for row in self.journal.range(from..).map_err(|e| self.err(e))? {
            if out.len() >= max {
                break;
            }
            let (k, v) = row.map_err(|e| self.err(e))?;
            let view = RowView::decode(self.name, v.value())?;
            out.push(view.info(self.name, k.value(), v.value().len())?);
        }
        Ok(out)
    }

    fn journal_times(
        &mut self,
        after: Arrival,
        max: usize,
    ) -> Result<Vec<(Arrival, u64)>, StoreError> {
        let mut out = Vec::new();
        let rows = self
            .times
            .range(after.saturating_add(1)..)
            .map_err(|e| self.err(e))?;
        for row in rows {
            if out.len() >= max {
                break;
            }
            let (k, v) = row.map_err(|e| self.err(e))?;
            out.push((k.value(), v.value()));
        }
        Ok(out)
    }

    fn ended(&mut self, stream: &StreamId) -> Result<Option<EndedOwn>, StoreError> {
        let k = stream_key(stream)?;
        let v = self.ended.get(k.as_slice()).map_err(|e| self.err(e))?;
        let Some(v) = v else { return Ok(None) };
        let c: EndedCounters = decode(self.name, "ended own stream", v.value())?;
        Ok(Some(EndedOwn {
            stream: stream.clone(),
            held: c.held,
            reported: c.reported,
            carried: c.carried,
        }))
    }

    fn topics(&mut self) -> Result<Vec<crate::TopicRecord>, StoreError> {
        let mut out = Vec::new();
        for row in self.topics.iter().map_err(|e| self.err(e))? {
            let (_, v) = row.map_err(|e| self.err(e))?;
            out.push(decode(self.name, "topic", v.value())?);
        }
        Ok(out)
    }
}
