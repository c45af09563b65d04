//! Reads: the [`MeshStore`] read methods and outbox payloads from the journal.

use super::*;

/// The payloads of own `batch` (of the stream with key `stream`), read
/// from its envelopes in `journal`, journaled from `first_arrival` on.
pub(super) fn journal_payloads(
    name: &str,
    journal: &impl ReadableTable<u64, &'static [u8]>,
    stream: &[u8],
    batch: &SignedBatch,
    first_arrival: Arrival,
) -> Result<Vec<Vec<u8>>, StoreError> {
    let rerr = |e: redb::StorageError| from_redb(name, "cannot read", e);
    let n = batch.entries.len();
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(n);
    let missing = |why: &str| {
        corrupt(
            name,
            format!(
                "the outbox batch at seq {} has {why} in the journal from arrival {first_arrival}",
                batch.first_seq
            ),
        )
    };
    let rows = journal.range(first_arrival..).map_err(rerr)?;
    for row in rows {
        if out.len() == n {
            break;
        }
        let (k, v) = row.map_err(rerr)?;
        let row = RowView::decode(name, v.value())?;
        let first = row.first_arrival(k.value());
        let RowView::Run {
            stream: s,
            first_seq,
            entries,
        } = row
        else {
            return Err(missing("another record"));
        };
        if s != stream {
            return Err(missing("another stream's envelopes"));
        }
        let skip = usize::try_from(first_arrival.saturating_sub(first)).unwrap_or(usize::MAX);
        for (i, e) in entries.iter().enumerate().skip(skip) {
            let Some(h) = batch.entries.get(out.len()) else {
                break;
            };
            let seq = batch.first_seq + out.len() as u64;
            if first_seq + i as u64 != seq || e.payload.len() != h.payload_len as usize {
                return Err(missing("other envelopes"));
            }
            out.push(e.payload.to_vec());
        }
    }
    if out.len() != n {
        return Err(missing("fewer envelopes"));
    }
    Ok(out)
}

/// Opens `def` for reading; `None` if the file has no such table yet.
pub(super) fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    rx: &redb::ReadTransaction,
    def: TableDefinition<'_, K, V>,
    name: &str,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match rx.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(from_redb(name, "cannot read", e)),
    }
}

impl RedbStore {
    /// Every value of `t`, in key order, each decoded as a `what`.
    pub(super) fn decode_values<K: redb::Key + 'static, T: serde::de::DeserializeOwned>(
        &self,
        t: &impl ReadableTable<K, &'static [u8]>,
        what: &str,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (_, v) = row.map_err(|e| self.read_err(e))?;
            out.push(decode(&self.name, what, v.value())?);
        }
        Ok(out)
    }

    /// The journal entry at `arrival`, if `journal` holds it.
    pub(super) fn journal_item_at(
        &self,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        arrival: Arrival,
    ) -> Result<Option<JournalItem>, StoreError> {
        let mut found = Vec::with_capacity(1);
        // The row holding `arrival` is the first keyed at or after it.
        if let Some(r) = journal
            .range(arrival..)
            .map_err(|e| self.read_err(e))?
            .next()
        {
            let (k, v) = r.map_err(|e| self.read_err(e))?;
            let view = RowView::decode(&self.name, v.value())?;
            view.push_items(
                &self.name,
                k.value(),
                arrival,
                (1, u64::MAX),
                &mut 0,
                &mut found,
            )?;
        }
        Ok(found.pop().filter(|item| item.arrival == arrival))
    }

    /// The journal's bounds in the read transaction `rx`.
    pub(super) fn bounds_in(
        &self,
        rx: &redb::ReadTransaction,
    ) -> Result<JournalBounds, StoreError> {
        let meta = rx.open_table(META).map_err(|e| self.read_err(e))?;
        let first = read_u64(&meta, META_JOURNAL_FIRST, &self.name)?;
        let bytes = read_u64(&meta, META_JOURNAL_BYTES, &self.name)?;
        let t = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        let last = t
            .last()
            .map_err(|e| self.read_err(e))?
            .map_or(0, |(k, _)| k.value());
        Ok(JournalBounds {
            first,
            head: last.max(first.saturating_sub(1)),
            bytes,
        })
    }
}

impl MeshStore for RedbStore {
    fn meta(&self) -> StoreMeta {
        self.meta_now()
    }

    fn commit(&self, groups: Vec<Vec<WriteOp>>) -> Vec<Result<Receipt, StoreError>> {
        let n = groups.len();
        if self.db.read().unwrap_or_else(|p| p.into_inner()).is_none() {
            self.reopen();
        }
        match self.try_commit(groups) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(store = %self.name, error = %e, groups = n, "store commit failed");
                if matches!(e, StoreError::Unavailable(_)) {
                    self.reopen();
                }
                vec![Err(e); n]
            }
        }
    }

    fn own_streams(&self) -> Result<Vec<OwnStream>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(OWN).map_err(|e| self.read_err(e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let stream: StreamId = decode(&self.name, "stream id", k.value())?;
            let counters: OwnCounters = decode(&self.name, "own stream", v.value())?;
            out.push(counters.with(stream, &self.name)?);
        }
        Ok(out)
    }

    fn marks(&self) -> Result<Vec<Mark>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(MARKS).map_err(|e| self.read_err(e))?;
        let cids = rx.open_table(MARK_CIDS).map_err(|e| self.read_err(e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let cid = cids
                .get(k.value())
                .map_err(|e| self.read_err(e))?
                .map(|c| {
                    <[u8; 32]>::try_from(c.value())
                        .map(Cid)
                        .map_err(|_| corrupt(&self.name, "a mark's payload hash is not 32 bytes"))
                })
                .transpose()?;
            out.push(Mark {
                stream: decode(&self.name, "stream id", k.value())?,
                seq: v.value(),
                cid,
            });
        }
        Ok(out)
    }

    fn read_outbox(
        &self,
        stream: &StreamId,
        after: Seq,
        max_bytes: u64,
    ) -> Result<Vec<StoredBatch>, StoreError> {
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let k = stream_key(stream)?;
        let k = k.as_slice();
        let rx = self.begin_read()?;
        let t = rx.open_table(OUTBOX).map_err(|e| self.read_err(e))?;
        // The batch holding `next` starts at or before it; later ones start after it.
        let first = t
            .range((k, 0)..=(k, next))
            .map_err(|e| self.read_err(e))?
            .next_back();
        let rest = t
            .range((k, next.saturating_add(1))..=(k, u64::MAX))
            .map_err(|e| self.read_err(e))?;
        let rest = if next == u64::MAX { None } else { Some(rest) };
        let rows = first.into_iter().chain(rest.into_iter().flatten());
        let batches = rows.map(|row| {
            let (_, v) = row.map_err(|e| self.read_err(e))?;
            decode::<BatchOwned>(&self.name, "outbox batch", v.value())
        });
        let chosen = gather(batches, |b| &b.batch, after, max_bytes)?;
        let journal = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        let kept = rx
            .open_table(OUTBOX_PAYLOADS)
            .map_err(|e| self.read_err(e))?;
        chosen
            .into_iter()
            .map(|b| {
                let moved = kept
                    .get((k, b.batch.first_seq))
                    .map_err(|e| self.read_err(e))?;
                let payloads = match moved {
                    Some(v) => {
                        let p: Vec<serde_bytes::ByteBuf> =
                            decode(&self.name, "outbox payloads", v.value())?;
                        if p.len() != b.batch.entries.len() {
                            return Err(corrupt(
                                &self.name,
                                format!(
                                    "the outbox keeps {} payloads for the batch at seq {} of {} entries",
                                    p.len(),
                                    b.batch.first_seq,
                                    b.batch.entries.len()
                                ),
                            ));
                        }
                        p.into_iter().map(serde_bytes::ByteBuf::into_vec).collect()
                    }
                    None => {
                        journal_payloads(&self.name, &journal, k, &b.batch, b.first_arrival)?
                    }
                };
                Ok(StoredBatch {
                    batch: b.batch,
                    payloads,
                })
            })
            .collect()
    }

    fn journal_page(
        &self,
        after: Arrival,
        limit: usize,
        max_bytes: u64,
    ) -> Result<Vec<JournalItem>, StoreError> {
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rx = self.begin_read()?;
        let bounds = self.bounds_in(&rx)?;
        let mut out: Vec<_> = crate::mem::journal_trimmed(next, bounds.first)
            .into_iter()
            .collect();
        let t = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        let mut bytes = 0u64;
        // Rows are keyed by their last arrival: the first row at or after
        // `next` holds it (and maybe earlier arrivals, skipped).
        for row in t.range(next..).map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let row = RowView::decode(&self.name, v.value())?;
            row.push_items(
                &self.name,
                k.value(),
                next,
                (limit, max_bytes),
                &mut bytes,
                &mut out,
            )?;
            if out.len() >= limit || (!out.is_empty() && bytes >= max_bytes) {
                break;
            }
        }
        Ok(out)
    }

    fn journal_bounds(&self) -> Result<JournalBounds, StoreError> {
        let rx = self.begin_read()?;
        self.bounds_in(&rx)
    }

    fn ended_own(&self) -> Result<Vec<EndedOwn>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(ENDED_OWN).map_err(|e| self.read_err(e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let c: EndedCounters = decode(&self.name, "ended own stream", v.value())?;
            out.push(EndedOwn {
                stream: decode(&self.name, "stream id", k.value())?,
                held: c.held,
                reported: c.reported,
                carried: c.carried,
            });
        }
        Ok(out)
    }

    fn peers(&self) -> Result<Vec<PeerRecord>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(PEERS).map_err(|e| self.read_err(e))?;
        self.decode_values(&t, "peer")
    }

    fn cards(&self) -> Result<Vec<NodeCard>, StoreError> {
        let rx = self.begin_read()?;
        // A file written before the table existed: no cards yet.
        let Some(t) = read_table(&rx, CARDS, &self.name)? else {
            return Ok(Vec::new());
        };
        self.decode_values(&t, "node card")
    }

    fn invites(&self) -> Result<Vec<InviteRecord>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, INVITES, &self.name)? else {
            return Ok(Vec::new());
        };
        self.decode_values(&t, "invite")
    }

    fn invite(&self, id: &InviteId) -> Result<Option<InviteRecord>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, INVITES, &self.name)? else {
            return Ok(None);
        };
        let v = t.get(id.0.as_slice()).map_err(|e| self.read_err(e))?;
        v.map(|v| decode(&self.name, "invite", v.value()))
            .transpose()
    }

    fn topics(&self) -> Result<Vec<crate::TopicRecord>, StoreError> {
        let rx = self.begin_read()?;
        // A file written before the table existed: a member of none.
        let Some(t) = read_table(&rx, TOPICS, &self.name)? else {
            return Ok(Vec::new());
        };
        self.decode_values(&t, "topic")
    }

    fn cursor(&self, name: &str) -> Result<Option<Arrival>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(CURSORS).map_err(|e| self.read_err(e))?;
        Ok(t.get(name)
            .map_err(|e| self.read_err(e))?
            .map(|v| v.value()))
    }

    fn max_lamport(&self) -> Result<u64, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(META).map_err(|e| self.read_err(e))?;
        read_u64(&t, META_MAX_LAMPORT, &self.name)
    }

    fn agents(&self) -> Result<Vec<crate::AgentRecord>, StoreError> {
        self.read_agents()
    }

    fn inbox(
        &self,
        agent: &mesh_protocol::AgentName,
        after: Arrival,
        limit: usize,
    ) -> Result<Vec<crate::InboxItem>, StoreError> {
        self.read_inbox(agent, after, limit)
    }

    fn message(&self, id: &mesh_protocol::MsgId) -> Result<Option<crate::MessageRow>, StoreError> {
        self.read_message(id)
    }

    fn dedup(&self) -> Result<Vec<crate::DedupRecord>, StoreError> {
        self.read_dedup()
    }

    fn aliases(&self) -> Result<Vec<(String, mesh_protocol::NodeId)>, StoreError> {
        self.read_aliases()
    }

    fn moves(&self) -> Result<Vec<mesh_protocol::AgentMove>, StoreError> {
        self.read_moves()
    }

    fn agent_cursor(
        &self,
        agent: &mesh_protocol::AgentName,
        name: &str,
    ) -> Result<Option<Arrival>, StoreError> {
        self.read_agent_cursor(agent, name)
    }
}
