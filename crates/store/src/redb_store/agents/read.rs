//! The agent tables read back: agents, inboxes, the message index, dedup
//! records, move notices, aliases and agent cursors.

use super::*;

impl RedbStore {
    /// The rows of the inbox, message, undelivered and inbox-trimmed tables.
    #[cfg(test)]
    pub(crate) fn index_rows(&self) -> [u64; 4] {
        use redb::ReadableTableMetadata;
        let rx = self.begin_read().expect("reads");
        let count = |n: Option<u64>| n.unwrap_or(0);
        [
            count(
                read_table(&rx, INBOX, &self.name)
                    .expect("opens")
                    .map(|t| t.len().expect("counts")),
            ),
            count(
                read_table(&rx, MESSAGES, &self.name)
                    .expect("opens")
                    .map(|t| t.len().expect("counts")),
            ),
            count(
                read_table(&rx, UNDELIVERED, &self.name)
                    .expect("opens")
                    .map(|t| t.len().expect("counts")),
            ),
            count(
                read_table(&rx, INBOX_TRIMMED, &self.name)
                    .expect("opens")
                    .map(|t| t.len().expect("counts")),
            ),
        ]
    }

    pub(in crate::redb_store) fn read_agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, AGENTS, &self.name)? else {
            return Ok(Vec::new());
        };
        self.decode_values(&t, "agent")
    }

    pub(in crate::redb_store) fn read_inbox(
        &self,
        agent: &AgentName,
        after: Arrival,
        limit: usize,
    ) -> Result<Vec<InboxItem>, StoreError> {
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let rx = self.begin_read()?;
        let a = agent.as_str();
        let trimmed_to = match read_table(&rx, INBOX_TRIMMED, &self.name)? {
            Some(t) => t.get(a).map_err(|e| self.read_err(e))?.map(|v| v.value()),
            None => None,
        };
        let trimmed = crate::agents::inbox_trimmed(after, trimmed_to).filter(|_| limit > 0);
        let limit = limit.saturating_sub(usize::from(trimmed.is_some()));
        let mut rows = Vec::new();
        // Rows are keyed by their last arrival: the first at or after
        // `next` may hold earlier ones too, skipped.
        if let Some(t) = read_table(&rx, INBOX, &self.name)? {
            'rows: for row in t
                .range((a, next)..=(a, u64::MAX))
                .map_err(|e| self.read_err(e))?
            {
                let (_, v) = row.map_err(|e| self.read_err(e))?;
                let run: InboxRun = decode(&self.name, "inbox row", v.value())?;
                for (arrival, r) in run.entries {
                    if arrival < next {
                        continue;
                    }
                    if rows.len() >= limit {
                        break 'rows;
                    }
                    rows.push((arrival, r));
                }
            }
        }
        let first = self.bounds_in(&rx)?.first;
        let journal = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        // Then the entries not folded yet, all after those of the table.
        if rows.len() < limit {
            self.deferred_in(&rx, &journal, after, |r| {
                rows.extend(r.inbox_of(agent, after).take(limit - rows.len()));
                rows.len() < limit
            })?;
        }
        let mut out = Vec::with_capacity(rows.len() + 1);
        out.extend(trimmed);
        for (arrival, row) in rows {
            if arrival < first {
                // Retention took its journal entry: the reader is told.
                out.push(InboxItem {
                    item: crate::agents::trimmed(arrival),
                    row,
                });
                continue;
            }
            match self.journal_item_at(&journal, arrival)? {
                Some(item) => out.push(InboxItem { item, row }),
                None => {
                    return Err(corrupt(
                        &self.name,
                        format!("inbox of {agent} names arrival {arrival}, not in the journal"),
                    ));
                }
            }
        }
        Ok(out)
    }

    pub(in crate::redb_store) fn read_message(
        &self,
        id: &MsgId,
    ) -> Result<Option<MessageRow>, StoreError> {
        let rx = self.begin_read()?;
        let journal = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        let Some(place) = self.message_place_in(&rx, &journal, id)? else {
            return Ok(None);
        };
        let undelivered = match read_table(&rx, UNDELIVERED, &self.name)? {
            Some(u) => u
                .get(id.as_bytes().as_slice())
                .map_err(|e| self.read_err(e))?
                .map(|v| decode(&self.name, "undelivered reason", v.value()))
                .transpose()?,
            None => None,
        };
        let superseded = match read_table(&rx, SUPERSEDED, &self.name)? {
            Some(u) => u
                .get(id.as_bytes().as_slice())
                .map_err(|e| self.read_err(e))?
                .map(|v| {
                    <[u8; 16]>::try_from(v.value())
                        .map(MsgId)
                        .map_err(|_| corrupt(&self.name, "a superseded row names no message id"))
                })
                .transpose()?,
            None => None,
        };
        let read = match read_table(&rx, READ, &self.name)? {
            Some(t) => t
                .get(id.as_bytes().as_slice())
                .map_err(|e| self.read_err(e))?
                .map(|v| decode(&self.name, "read mark", v.value()))
                .transpose()?,
            // A file written before read receipts: nothing is marked read.
            None => None,
        };
        if place.arrival < self.bounds_in(&rx)?.first {
            // Retention took its journal entry, and what it said with it.
            return Ok(None);
        }
        let record = self
            .journal_item_at(&journal, place.arrival)?
            .ok_or_else(|| {
                corrupt(
                    &self.name,
                    format!(
                        "the message index names arrival {}, not in the journal",
                        place.arrival
                    ),
                )
            })?;
        place
            .row(&record.record, undelivered, superseded, read)
            .map(Some)
            .map_err(|why| corrupt(&self.name, why))
    }

    /// Where the message `id` is, by the message table or the journal rows
    /// after the last fold.
    fn message_place_in(
        &self,
        rx: &redb::ReadTransaction,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        id: &MsgId,
    ) -> Result<Option<crate::agents::Place>, StoreError> {
        if let Some(t) = read_table(rx, MESSAGES, &self.name)?
            && let Some(row) = t
                .range(id.as_bytes().as_slice()..)
                .map_err(|e| self.read_err(e))?
                .next()
        {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let key = MsgId(
                k.value()
                    .try_into()
                    .map_err(|_| corrupt(&self.name, "a message row's key is not an id"))?,
            );
            let run: MessageRun = decode(&self.name, "message row", v.value())?;
            if let Some(i) = index_in(&key, run.n as usize, id) {
                return Ok(Some(run.place(i)));
            }
        }
        let mut found = None;
        self.deferred_in(rx, journal, 0, |r| {
            found = r
                .message(id)
                .map(|(dir, seq, arrival)| (r, dir, seq, arrival));
            found.is_none()
        })?;
        found
            .map(|(r, dir, seq, arrival)| {
                Ok(crate::agents::Place {
                    dir,
                    stream: r.stream(&self.name)?,
                    seq,
                    arrival,
                })
            })
            .transpose()
    }

    /// Visits the index entries held in journal rows after the last fold
    /// and after `after`, as the read transaction `rx` sees them, while
    /// `visit` says go on.
    fn deferred_in(
        &self,
        rx: &redb::ReadTransaction,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        after: Arrival,
        visit: impl FnMut(DeferredRow) -> bool,
    ) -> Result<(), StoreError> {
        let meta = rx.open_table(META).map_err(|e| self.read_err(e))?;
        let fold = FoldState::read(&meta, &self.name)?;
        // No row after the head: nothing to read when no row holds entries.
        deferred_rows(journal, after.max(fold.through), &self.name, visit)
    }

    pub(in crate::redb_store) fn read_dedup(&self) -> Result<Vec<DedupRecord>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, DEDUP, &self.name)? else {
            return Ok(Vec::new());
        };
        self.decode_values(&t, "dedup record")
    }

    pub(in crate::redb_store) fn read_moves(
        &self,
    ) -> Result<Vec<mesh_protocol::AgentMove>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, MOVES, &self.name)? else {
            return Ok(Vec::new());
        };
        self.decode_values(&t, "move notice")
    }

    pub(in crate::redb_store) fn read_aliases(&self) -> Result<Vec<(String, NodeId)>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, ALIASES, &self.name)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let bytes: [u8; 32] = v
                .value()
                .try_into()
                .map_err(|_| corrupt(&self.name, "an alias names no node id"))?;
            let node = NodeId::from_bytes(&bytes)
                .map_err(|e| corrupt(&self.name, format!("an alias names a bad node id: {e}")))?;
            out.push((k.value().to_owned(), node));
        }
        Ok(out)
    }

    pub(in crate::redb_store) fn read_agent_cursor(
        &self,
        agent: &AgentName,
        name: &str,
    ) -> Result<Option<Arrival>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, AGENT_CURSORS, &self.name)? else {
            return Ok(None);
        };
        Ok(t.get((agent.as_str(), name))
            .map_err(|e| self.read_err(e))?
            .map(|v| v.value()))
    }
}
