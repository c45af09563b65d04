//! One write transaction: checks, table updates and journal rows.

use super::*;
use crate::logic::JOURNAL_TIME_STEP_MS;

mod base;
mod rows;

use rows::can_hold;

impl RedbStore {
    /// Plans and applies `groups` in one write transaction and commits it:
    /// a refused group fails alone, any other error fails the whole commit.
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
        let epoch_before = self.meta_now().epoch;
        let counters = {
            let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
            let mut t = Tables::open(&tx, name)?;
            let before = t.counters(&meta, epoch_before)?;
            let fold_before = agents::FoldState::read(&meta, name)?;
            t.agents.fold = fold_before;
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
            let (written, fold) = t.flush(counters.now_ms, self.fold, before.journal_head)?;
            counters.journal_bytes += written;
            put_fold(&mut meta, fold, fold_before, name)?;
            if written > 0
                && let Some(now) = counters.now_ms
            {
                counters.last_write_ms = now;
            }
            put_meta(&mut meta, counters, before, name)?;
            counters
        };
        tx.commit().map_err(|e| werr(e.into()))?;
        if counters.epoch != epoch_before {
            self.meta.write().unwrap_or_else(|p| p.into_inner()).epoch = counters.epoch;
        }
        Ok(out)
    }
}

/// Writes the meta counters that differ in `counters` from `before`.
fn put_meta(
    meta: &mut Table<'_, &'static str, &'static [u8]>,
    counters: TxCounters,
    before: TxCounters,
    name: &str,
) -> Result<(), StoreError> {
    let werr = write_err(name);
    let mut put = |key: &str, value: u64, was: u64| {
        if value == was {
            return Ok(());
        }
        meta.insert(key, value.to_le_bytes().as_slice())
            .map(drop)
            .map_err(werr)
    };
    put(META_MAX_LAMPORT, counters.max_lamport, before.max_lamport)?;
    put(
        META_JOURNAL_FIRST,
        counters.journal_first,
        before.journal_first,
    )?;
    put(
        META_JOURNAL_BYTES,
        counters.journal_bytes,
        before.journal_bytes,
    )?;
    put(
        META_LAST_WRITE_MS,
        counters.last_write_ms,
        before.last_write_ms,
    )?;
    if counters.epoch != before.epoch {
        meta.insert(META_EPOCH, counters.epoch.0.as_slice())
            .map_err(werr)?;
    }
    Ok(())
}

/// Writes the index fold state where it differs from `before`.
fn put_fold(
    meta: &mut Table<'_, &'static str, &'static [u8]>,
    fold: agents::FoldState,
    before: agents::FoldState,
    name: &str,
) -> Result<(), StoreError> {
    let werr = write_err(name);
    for (key, value, was) in [
        (META_INDEX_THROUGH, fold.through, before.through),
        (META_INDEX_DEFERRED_BYTES, fold.bytes, before.bytes),
    ] {
        if value != was {
            meta.insert(key, value.to_le_bytes().as_slice())
                .map_err(werr)?;
        }
    }
    Ok(())
}

/// Writes `value`, encoded, at `key` in `table` of the store `name`.
fn put_encoded<T: Serialize + ?Sized>(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
    value: &T,
    name: &str,
) -> Result<(), StoreError> {
    let v = encode(value)?;
    table.insert(key, v.as_slice()).map_err(write_err(name))?;
    Ok(())
}

/// The error of a failed write to the store `name`.
fn write_err(name: &str) -> impl Fn(redb::StorageError) -> StoreError + Copy + '_ {
    move |e| from_redb(name, "cannot write", e)
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
    decode_meta(v.value(), name).map(Some)
}

/// The meta at the head of an encoded outbox row.
fn decode_meta(value: &[u8], name: &str) -> Result<BatchMeta, StoreError> {
    // Only the leading meta is decoded: decoding the batch validates a key.
    let (m, _): (StoredMeta, _) = postcard::take_from_bytes(value)
        .map_err(|e| corrupt(name, format!("a stored outbox batch does not decode: {e}")))?;
    Ok(BatchMeta {
        last_seq: m.last_seq,
        msgs: m.msgs,
        bytes: m.bytes,
    })
}

/// The tables of one write transaction.
pub(super) struct Tables<'tx> {
    name: &'tx str,
    outbox: Table<'tx, (&'static [u8], u64), &'static [u8]>,
    payloads: Table<'tx, (&'static [u8], u64), &'static [u8]>,
    own: Table<'tx, &'static [u8], &'static [u8]>,
    ended: Table<'tx, &'static [u8], &'static [u8]>,
    marks: Table<'tx, &'static [u8], u64>,
    mark_cids: Table<'tx, &'static [u8], &'static [u8]>,
    journal: Table<'tx, u64, &'static [u8]>,
    times: Table<'tx, u64, u64>,
    peers: Table<'tx, &'static [u8], &'static [u8]>,
    cursors: Table<'tx, &'static str, u64>,
    cards: Table<'tx, &'static [u8], &'static [u8]>,
    invites: Table<'tx, &'static [u8], &'static [u8]>,
    topics: Table<'tx, &'static [u8], &'static [u8]>,
    /// Journal records of the groups applied so far, in arrival order;
    /// written as rows at [`Tables::flush`], when every run is complete.
    journal_pending: Vec<(Arrival, JournalRecord)>,
    /// The latest mark and own-stream state per stream, written once per
    /// commit at [`Tables::flush`] however many groups moved them; reads
    /// in the transaction look here first.
    marks_pending: HashMap<StreamId, Seq>,
    cids_pending: HashMap<StreamId, Option<Cid>>,
    own_pending: HashMap<StreamId, OwnStream>,
    /// The agent tables, opened when first written.
    agents: agents::AgentTables<'tx>,
}

impl<'tx> Tables<'tx> {
    /// Opens the store's tables in `tx` (the agent tables when first written).
    fn open(tx: &'tx redb::WriteTransaction, name: &'tx str) -> Result<Self, StoreError> {
        let werr = |e: TableError| from_redb(name, "cannot write", e);
        Ok(Tables {
            name,
            outbox: tx.open_table(OUTBOX).map_err(werr)?,
            payloads: tx.open_table(OUTBOX_PAYLOADS).map_err(werr)?,
            own: tx.open_table(OWN).map_err(werr)?,
            ended: tx.open_table(ENDED_OWN).map_err(werr)?,
            marks: tx.open_table(MARKS).map_err(werr)?,
            mark_cids: tx.open_table(MARK_CIDS).map_err(werr)?,
            journal: tx.open_table(JOURNAL).map_err(werr)?,
            times: tx.open_table(JOURNAL_TIMES).map_err(werr)?,
            peers: tx.open_table(PEERS).map_err(werr)?,
            cursors: tx.open_table(CURSORS).map_err(werr)?,
            cards: tx.open_table(CARDS).map_err(werr)?,
            invites: tx.open_table(INVITES).map_err(werr)?,
            topics: tx.open_table(TOPICS).map_err(werr)?,
            journal_pending: Vec::new(),
            marks_pending: HashMap::new(),
            cids_pending: HashMap::new(),
            own_pending: HashMap::new(),
            agents: agents::AgentTables::new(tx),
        })
    }
}

impl Tables<'_> {
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        from_redb(self.name, "cannot write", e)
    }

    /// The counters as the last commit left them, in the store's `epoch`.
    fn counters(
        &self,
        meta: &impl ReadableTable<&'static str, &'static [u8]>,
        epoch: Epoch,
    ) -> Result<TxCounters, StoreError> {
        let name = self.name;
        let journal_first = read_u64(meta, META_JOURNAL_FIRST, name)?;
        let last_row = self
            .journal
            .last()
            .map_err(|e| self.err(e))?
            .map_or(0, |(k, _)| k.value());
        Ok(TxCounters {
            journal_head: last_row.max(journal_first.saturating_sub(1)),
            max_lamport: read_u64(meta, META_MAX_LAMPORT, name)?,
            journal_first,
            journal_bytes: read_u64(meta, META_JOURNAL_BYTES, name)?,
            last_write_ms: read_u64(meta, META_LAST_WRITE_MS, name)?,
            epoch,
            now_ms: None,
        })
    }

    /// Applies a planned group's writes, in order.
    fn apply(&mut self, writes: Vec<Write>) -> Result<(), StoreError> {
        for w in writes {
            self.write(w)?;
        }
        Ok(())
    }

    /// Applies one write: to its table, or to what [`Tables::flush`] writes.
    fn write(&mut self, w: Write) -> Result<(), StoreError> {
        let name = self.name;
        let werr = write_err(name);
        match w {
            Write::OwnStream(o) => {
                self.own_pending.insert(o.stream.clone(), o);
            }
            Write::DelOwn(stream) => self.del_own(&stream)?,
            Write::PutBatch {
                first_seq,
                batch,
                first_arrival,
            } => self.put_batch(first_seq, &batch, first_arrival)?,
            Write::DelBatch { stream, first_seq } => self.del_batch(&stream, first_seq)?,
            Write::DropOutbox(stream) => self.drop_outbox(&stream)?,
            Write::PutPayloads {
                stream,
                first_seq,
                payloads,
            } => self.put_payloads(&stream, first_seq, &payloads)?,
            Write::MovePayloads {
                stream,
                first_seq,
                first_arrival,
                n,
            } => self.move_payloads(&stream, first_seq, first_arrival, n)?,
            Write::DelJournal { first, last } => {
                // Rows after the last fold hold index entries: fold them
                // first if it removes some of those rows.
                if last > self.agents.fold.through {
                    self.agents.fold_rows(&self.journal, name)?;
                }
                self.journal
                    .retain_in(first..=last, |_, _| false)
                    .map_err(werr)?;
            }
            Write::DelTimesBefore(first) => {
                self.times.retain_in(..first, |_, _| false).map_err(werr)?;
            }
            Write::Mark { stream, seq } => {
                self.marks_pending.insert(stream, seq);
            }
            Write::MarkCid { stream, cid } => {
                self.cids_pending.insert(stream, cid);
            }
            Write::Ended(e) => self.put_ended(&e)?,
            Write::Journal { arrival, record } => {
                self.journal_pending.push((arrival, record));
            }
            Write::PutPeer(p) => put_encoded(&mut self.peers, p.node.as_bytes(), &p, name)?,
            Write::RemovePeer(n) => {
                self.peers.remove(n.as_bytes().as_slice()).map_err(werr)?;
                self.cards.remove(n.as_bytes().as_slice()).map_err(werr)?;
            }
            Write::PutCard(card) => {
                put_encoded(&mut self.cards, card.node.as_bytes(), &card, name)?;
            }
            Write::PutInvite(invite) => {
                put_encoded(&mut self.invites, &invite.id.0, &invite, name)?;
            }
            Write::PutTopic(topic) => {
                put_encoded(
                    &mut self.topics,
                    topic.name.as_str().as_bytes(),
                    &topic,
                    name,
                )?;
            }
            Write::DelTopic(topic) => {
                self.topics
                    .remove(topic.as_str().as_bytes())
                    .map_err(werr)?;
            }
            Write::Cursor {
                name: cursor,
                arrival,
            } => {
                self.cursors
                    .insert(cursor.as_str(), arrival)
                    .map_err(werr)?;
            }
            Write::Agents(w) => self.agents.apply(w, &self.journal, name)?,
            // Written with the commit's counters.
            Write::Epoch(_) => {}
        }
        Ok(())
    }

    /// Removes the own stream `stream`, pending or written.
    fn del_own(&mut self, stream: &StreamId) -> Result<(), StoreError> {
        self.own_pending.remove(stream);
        let k = stream_key(stream)?;
        self.own
            .remove(k.as_slice())
            .map_err(write_err(self.name))?;
        Ok(())
    }

    /// Writes the outbox row of `batch`, which starts at `first_seq`.
    fn put_batch(
        &mut self,
        first_seq: Seq,
        batch: &SignedBatch,
        first_arrival: Arrival,
    ) -> Result<(), StoreError> {
        let k = stream_key(&batch_stream(batch))?;
        let m = BatchMeta::of(batch);
        let v = encode(&BatchRef {
            meta: StoredMeta {
                last_seq: m.last_seq,
                msgs: m.msgs,
                bytes: m.bytes,
            },
            batch,
            first_arrival,
        })?;
        self.outbox
            .insert((k.as_slice(), first_seq), v.as_slice())
            .map_err(write_err(self.name))?;
        Ok(())
    }

    /// Removes the outbox batch of `stream` at `first_seq`, then its kept payloads.
    fn del_batch(&mut self, stream: &StreamId, first_seq: Seq) -> Result<(), StoreError> {
        let werr = write_err(self.name);
        let k = stream_key(stream)?;
        self.outbox
            .remove((k.as_slice(), first_seq))
            .map_err(werr)?;
        self.payloads
            .remove((k.as_slice(), first_seq))
            .map_err(werr)?;
        Ok(())
    }

    /// Removes every outbox batch of `stream`, then every kept payload.
    fn drop_outbox(&mut self, stream: &StreamId) -> Result<(), StoreError> {
        let werr = write_err(self.name);
        let k = stream_key(stream)?;
        let range = (k.as_slice(), 0)..=(k.as_slice(), u64::MAX);
        self.outbox
            .retain_in(range.clone(), |_, _| false)
            .map_err(werr)?;
        self.payloads.retain_in(range, |_, _| false).map_err(werr)?;
        Ok(())
    }

    /// Copies the `n` payloads of the outbox batch of `stream` at
    /// `first_seq` from its journal rows (from `first_arrival`) to the outbox.
    fn move_payloads(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
        first_arrival: Arrival,
        n: u64,
    ) -> Result<(), StoreError> {
        let name = self.name;
        let k = stream_key(stream)?;
        let row = self
            .outbox
            .get((k.as_slice(), first_seq))
            .map_err(write_err(name))?
            .ok_or_else(|| {
                corrupt(
                    name,
                    format!("no outbox batch of {stream:?} at {first_seq}"),
                )
            })?;
        let b: BatchOwned = decode(name, "outbox batch", row.value())?;
        drop(row);
        debug_assert_eq!(b.batch.entries.len() as u64, n);
        let payloads = read::journal_payloads(name, &self.journal, &k, &b.batch, first_arrival)?;
        self.put_payloads(stream, first_seq, &payloads)
    }

    /// Writes the counters of the ended own stream `e`.
    fn put_ended(&mut self, e: &EndedOwn) -> Result<(), StoreError> {
        let k = stream_key(&e.stream)?;
        let v = encode(&EndedCounters {
            held: e.held,
            reported: e.reported,
            carried: e.carried,
        })?;
        self.ended
            .insert(k.as_slice(), v.as_slice())
            .map_err(write_err(self.name))?;
        Ok(())
    }

    fn put_payloads(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
        payloads: &[Vec<u8>],
    ) -> Result<(), StoreError> {
        let k = stream_key(stream)?;
        let refs: Vec<&Bytes> = payloads.iter().map(|p| Bytes::new(p)).collect();
        let v = encode(&refs)?;
        let name = self.name;
        self.payloads
            .insert((k.as_slice(), first_seq), v.as_slice())
            .map_err(|e| from_redb(name, "cannot write", e))?;
        Ok(())
    }

    /// Writes what [`Tables::apply`] deferred: marks, own streams, and the
    /// journal packed into rows, dated `now_ms` if given, with this
    /// commit's agent index entries in them or, when `fold` says so (or the
    /// transaction folded already, or a row cannot hold an entry: see
    /// [`can_hold`]), folded into the index tables with those of the rows
    /// since the last fold. Returns the bytes of the rows written and where the index
    /// stands after the commit (the journal's head was `head` before it).
    fn flush(
        &mut self,
        now_ms: Option<u64>,
        fold: IndexFold,
        head: Arrival,
    ) -> Result<(u64, agents::FoldState), StoreError> {
        self.flush_marks()?;
        self.flush_own()?;
        let pending = std::mem::take(&mut self.journal_pending);
        if let (Some(now), Some((first, _))) = (now_ms, pending.first()) {
            self.date_rows(*first, now)?;
        }
        let (inbox, messages) = self.agents.take_index(self.name)?;
        let has = !inbox.is_empty() || !messages.is_empty();
        let head_after = pending.last().map_or(head, |(a, _)| *a);
        let state = self.agents.fold;
        // Where the index stands once every entry is in the tables.
        let folded = agents::FoldState {
            through: head_after,
            bytes: 0,
        };
        let held = state.through < head;
        let due = (held || has)
            && (head_after.saturating_sub(state.through) >= fold.arrivals
                || state.bytes >= fold.bytes);
        if self.agents.folded || due || (has && !can_hold(&pending, &inbox, &messages)) {
            self.agents
                .fold_with(&self.journal, inbox, messages, self.name)?;
            let written = self.write_rows(&pending, &mut &[][..], &mut &[][..])?;
            return Ok((written, folded));
        }
        let written = self.write_rows(&pending, &mut inbox.as_slice(), &mut messages.as_slice())?;
        if !held && !has {
            // Nothing held in rows: the fold point keeps up with the head.
            return Ok((written, folded));
        }
        Ok((
            written,
            agents::FoldState {
                through: state.through,
                bytes: state.bytes + written,
            },
        ))
    }

    /// Writes the pending marks, then the pending mark cids, each in stream order.
    fn flush_marks(&mut self) -> Result<(), StoreError> {
        let werr = write_err(self.name);
        let mut marks: Vec<_> = self.marks_pending.drain().collect();
        marks.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (stream, seq) in marks {
            let k = stream_key(&stream)?;
            self.marks.insert(k.as_slice(), seq).map_err(werr)?;
        }
        let mut cids: Vec<_> = self.cids_pending.drain().collect();
        cids.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (stream, cid) in cids {
            let k = stream_key(&stream)?;
            match cid {
                Some(c) => {
                    self.mark_cids
                        .insert(k.as_slice(), c.0.as_slice())
                        .map_err(werr)?;
                }
                None => {
                    self.mark_cids.remove(k.as_slice()).map_err(werr)?;
                }
            }
        }
        Ok(())
    }

    /// Writes the pending own streams in stream order.
    fn flush_own(&mut self) -> Result<(), StoreError> {
        let werr = write_err(self.name);
        let mut own: Vec<_> = self.own_pending.drain().map(|(_, o)| o).collect();
        own.sort_unstable_by(|a, b| a.stream.cmp(&b.stream));
        for o in own {
            let k = stream_key(&o.stream)?;
            let v = encode(&OwnCounters::of(&o))?;
            self.own.insert(k.as_slice(), v.as_slice()).map_err(werr)?;
        }
        Ok(())
    }

    /// Dates the rows from arrival `first` at `now`, unless the last date
    /// is less than [`JOURNAL_TIME_STEP_MS`] before it.
    fn date_rows(&mut self, first: Arrival, now: u64) -> Result<(), StoreError> {
        let werr = write_err(self.name);
        let dated = self.times.last().map_err(werr)?.map(|(_, t)| t.value());
        if dated.is_none_or(|t| now >= t.saturating_add(JOURNAL_TIME_STEP_MS)) {
            self.times.insert(first, now).map_err(werr)?;
        }
        Ok(())
    }
}
