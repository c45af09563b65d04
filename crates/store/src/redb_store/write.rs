//! One write transaction: checks, table updates and journal rows.

use super::*;

impl RedbStore {
    pub(super) fn try_commit(
        &self,
        groups: Vec<Vec<WriteOp>>,
    ) -> Result<Vec<Result<Receipt, StoreError>>, StoreError> {
        let name = self.name.as_str();
        let werr = |e: redb::Error| from_redb(name, "cannot write", e);
        let db = self.db.read().unwrap_or_else(|p| p.into_inner());
        let mut tx = db
            .as_ref()
            .ok_or_else(|| self.closed())?
            .begin_write()
            .map_err(|e| werr(e.into()))?;
        tx.set_durability(Durability::Immediate)
            .map_err(|e| werr(e.into()))?;
        let mut out = Vec::with_capacity(groups.len());
        {
            let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
            let mut t = Tables {
                name,
                epoch: self.meta.epoch,
                outbox: tx.open_table(OUTBOX).map_err(|e| werr(e.into()))?,
                own: tx.open_table(OWN).map_err(|e| werr(e.into()))?,
                marks: tx.open_table(MARKS).map_err(|e| werr(e.into()))?,
                journal: tx.open_table(JOURNAL).map_err(|e| werr(e.into()))?,
                peers: tx.open_table(PEERS).map_err(|e| werr(e.into()))?,
                cursors: tx.open_table(CURSORS).map_err(|e| werr(e.into()))?,
                cards: tx.open_table(CARDS).map_err(|e| werr(e.into()))?,
                invites: tx.open_table(INVITES).map_err(|e| werr(e.into()))?,
                journal_pending: Vec::new(),
                marks_pending: HashMap::new(),
                own_pending: HashMap::new(),
                agents: agents::AgentTables::new(&tx),
            };
            let journal_head = t
                .journal
                .last()
                .map_err(|e| werr(e.into()))?
                .map_or(0, |(k, _)| k.value());
            let max_lamport = read_u64(&meta, META_MAX_LAMPORT, name)?;
            let before = TxCounters {
                journal_head,
                max_lamport,
            };
            let mut counters = before;
            for ops in groups {
                match logic::plan_group(&mut t, &mut counters, ops) {
                    Ok(plan) => {
                        t.apply(plan.writes)?;
                        out.push(Ok(plan.receipt));
                    }
                    Err(Fail::Refused(e)) => out.push(Err(e)),
                    // Dropping the transaction aborts it: nothing of any group is written.
                    Err(Fail::Fatal(e)) => return Err(e),
                }
            }
            t.flush()?;
            if counters.max_lamport != before.max_lamport {
                meta.insert(
                    META_MAX_LAMPORT,
                    counters.max_lamport.to_le_bytes().as_slice(),
                )
                .map_err(|e| werr(e.into()))?;
            }
        }
        tx.commit().map_err(|e| werr(e.into()))?;
        Ok(out)
    }
}

/// The meta of the outbox batch of the stream with key `stream` that
/// starts at `first_seq`, if there is one.
pub(super) fn outbox_meta(
    outbox: &impl ReadableTable<(&'static [u8], u64), &'static [u8]>,
    stream: &[u8],
    first_seq: Seq,
    name: &str,
) -> Result<Option<BatchMeta>, StoreError> {
    let v = outbox
        .get((stream, first_seq))
        .map_err(|e| from_redb(name, "cannot read", e))?;
    let Some(v) = v else { return Ok(None) };
    // Only the leading meta is decoded: the batch and payloads follow it.
    let (m, _): (StoredMeta, _) = postcard::take_from_bytes(v.value())
        .map_err(|e| corrupt(name, format!("a stored outbox batch does not decode: {e}")))?;
    Ok(Some(BatchMeta {
        last_seq: m.last_seq,
        msgs: m.msgs,
        bytes: m.bytes,
    }))
}

/// The tables of one write transaction.
pub(super) struct Tables<'tx> {
    name: &'tx str,
    epoch: Epoch,
    outbox: Table<'tx, (&'static [u8], u64), &'static [u8]>,
    own: Table<'tx, &'static [u8], &'static [u8]>,
    marks: Table<'tx, &'static [u8], u64>,
    journal: Table<'tx, u64, &'static [u8]>,
    peers: Table<'tx, &'static [u8], &'static [u8]>,
    cursors: Table<'tx, &'static str, u64>,
    cards: Table<'tx, &'static [u8], &'static [u8]>,
    invites: Table<'tx, &'static [u8], &'static [u8]>,
    /// Journal records of the groups applied so far, in arrival order;
    /// written as rows at [`Tables::flush`], when every run is complete.
    journal_pending: Vec<(Arrival, JournalRecord)>,
    /// The latest mark and own-stream state per stream, written once per
    /// commit at [`Tables::flush`] however many groups moved them; reads
    /// in the transaction look here first.
    marks_pending: HashMap<StreamId, Seq>,
    own_pending: HashMap<StreamId, OwnStream>,
    /// The agent tables, opened when first written.
    agents: agents::AgentTables<'tx>,
}

impl Tables<'_> {
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        from_redb(self.name, "cannot write", e)
    }

    fn apply(&mut self, writes: Vec<Write>) -> Result<(), StoreError> {
        let name = self.name;
        for w in writes {
            match w {
                Write::OwnStream(o) => {
                    self.own_pending.insert(o.stream.clone(), o);
                }
                Write::PutBatch {
                    first_seq,
                    batch,
                    first_arrival,
                } => {
                    let k = stream_key(&batch_stream(&batch))?;
                    let m = BatchMeta::of(&batch);
                    let v = encode(&BatchRef {
                        meta: StoredMeta {
                            last_seq: m.last_seq,
                            msgs: m.msgs,
                            bytes: m.bytes,
                        },
                        batch: &batch,
                        first_arrival,
                    })?;
                    self.outbox
                        .insert((k.as_slice(), first_seq), v.as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::DelBatch { stream, first_seq } => {
                    let k = stream_key(&stream)?;
                    self.outbox
                        .remove((k.as_slice(), first_seq))
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::Mark { stream, seq } => {
                    self.marks_pending.insert(stream, seq);
                }
                Write::Journal { arrival, record } => {
                    self.journal_pending.push((arrival, record));
                }
                Write::PutPeer(p) => {
                    let v = encode(&p)?;
                    self.peers
                        .insert(p.node.as_bytes().as_slice(), v.as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::RemovePeer(n) => {
                    self.peers
                        .remove(n.as_bytes().as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                    self.cards
                        .remove(n.as_bytes().as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::PutCard(card) => {
                    let v = encode(&card)?;
                    self.cards
                        .insert(card.node.as_bytes().as_slice(), v.as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::PutInvite(invite) => {
                    let v = encode(&invite)?;
                    self.invites
                        .insert(invite.id.0.as_slice(), v.as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::Cursor {
                    name: cursor,
                    arrival,
                } => {
                    self.cursors
                        .insert(cursor.as_str(), arrival)
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::Agents(w) => self.agents.apply(w, name)?,
            }
        }
        Ok(())
    }

    /// Writes what [`Tables::apply`] deferred: marks, own streams, and the
    /// journal packed into rows.
    fn flush(&mut self) -> Result<(), StoreError> {
        let name = self.name;
        self.agents.flush(name)?;
        let werr = |e| from_redb(name, "cannot write", e);
        let mut marks: Vec<_> = self.marks_pending.drain().collect();
        marks.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (stream, seq) in marks {
            let k = stream_key(&stream)?;
            self.marks.insert(k.as_slice(), seq).map_err(werr)?;
        }
        let mut own: Vec<_> = self.own_pending.drain().map(|(_, o)| o).collect();
        own.sort_unstable_by(|a, b| a.stream.cmp(&b.stream));
        for o in own {
            let k = stream_key(&o.stream)?;
            let v = encode(&OwnCounters::of(&o))?;
            self.own.insert(k.as_slice(), v.as_slice()).map_err(werr)?;
        }
        let pending = std::mem::take(&mut self.journal_pending);
        let mut buf = Vec::new();
        let mut rest = pending.as_slice();
        let mut key = Vec::new();
        while let Some(((arrival, record), _)) = rest.split_first() {
            let n = run_len(rest);
            let row = match record {
                JournalRecord::Envelope { stream, seq, .. } if n > 0 => {
                    let mut entries = Vec::with_capacity(n);
                    for (_, r) in &rest[..n] {
                        if let JournalRecord::Envelope {
                            lamport,
                            created_ms,
                            kind,
                            payload,
                            ..
                        } = r
                        {
                            entries.push(EntryRef {
                                lamport: *lamport,
                                created_ms: *created_ms,
                                kind: *kind,
                                payload: Bytes::new(payload),
                            });
                        }
                    }
                    encode_into(&mut key, stream)?;
                    RowRef::Run {
                        stream: Bytes::new(&key),
                        first_seq: *seq,
                        entries,
                    }
                }
                other => RowRef::Record(other),
            };
            encode_into(&mut buf, &row)?;
            let taken = n.max(1);
            let last = arrival + taken as u64 - 1;
            self.journal.insert(last, buf.as_slice()).map_err(werr)?;
            rest = &rest[taken..];
        }
        Ok(())
    }
}

/// How many of `records` (consecutive arrivals) open a journal row of
/// envelopes: consecutive seqs of one stream, within [`JOURNAL_ROW_BYTES_MAX`]
/// (at least one). 0 if the first is not an envelope.
pub(super) fn run_len(records: &[(Arrival, JournalRecord)]) -> usize {
    let Some((
        (
            arrival,
            JournalRecord::Envelope {
                stream,
                seq,
                payload,
                ..
            },
        ),
        more,
    )) = records.split_first()
    else {
        return 0;
    };
    let mut bytes = ROW_OVERHEAD_BYTES + payload.len() + ROW_ENTRY_OVERHEAD_BYTES;
    let mut n = 1;
    for (a, r) in more {
        let JournalRecord::Envelope {
            stream: s,
            seq: q,
            payload: p,
            ..
        } = r
        else {
            break;
        };
        let add = p.len() + ROW_ENTRY_OVERHEAD_BYTES;
        if s != stream
            || Some(*q) != seq.checked_add(n as u64)
            || Some(*a) != arrival.checked_add(n as u64)
            || bytes + add > JOURNAL_ROW_BYTES_MAX
        {
            break;
        }
        bytes += add;
        n += 1;
    }
    n
}

impl Base for Tables<'_> {
    fn epoch(&self) -> Epoch {
        self.epoch
    }

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

    fn batch_meta(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<BatchMeta>, StoreError> {
        let k = stream_key(stream)?;
        outbox_meta(&self.outbox, &k, first_seq, self.name)
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
}
