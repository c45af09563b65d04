//! The agent index between folds (schema 5): a commit's entries travel in
//! the journal rows of their envelopes ([`RunIndex`]), and a fold writes
//! those of the rows since the last one to `inbox-v1` and `messages-v1`
//! (see `redb_store`'s module docs).

use super::*;

/// An inbox entry: the agent, its journal entry's arrival, the row.
pub(in crate::redb_store) type InboxEntry = (AgentName, Arrival, InboxRow);

/// A message index entry: the message and where it is.
pub(in crate::redb_store) type MessageEntry = (MsgId, crate::agents::Place);

/// The agent index entries of one journal run, kept in its row (an
/// `Indexed` run) until a fold writes them to the index tables.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq, Eq)]
pub(in crate::redb_store) struct RunIndex {
    /// The run's envelopes.
    n: u32,
    /// The first 8 bytes of the ids of the run's messages: a message's id
    /// is this tag and its seq ([`MsgId::in_stream`]). A message whose id
    /// is not its stream's own (a forward, a tombstone naming the message
    /// it replaced) is never held in a row: its commit folds.
    tag: [u8; 8],
    /// The agents of `inbox`, each once.
    agents: Vec<AgentName>,
    /// Inbox entries: the envelope's place in the run, the agent (its
    /// place in `agents`), the row.
    inbox: Vec<(u32, u32, InboxRow)>,
    /// Message index entries: the envelope's place in the run, sent or
    /// received.
    messages: Vec<(u32, MessageDir)>,
}

/// Where the agent index stands: the tables hold every entry up to
/// `through`; the journal rows after it hold the rest. `through` is the
/// journal's head whenever no row holds an entry (a commit moves it there
/// then), so `through < head` says that rows hold some.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::redb_store) struct FoldState {
    /// Every entry at this arrival or before is in the tables.
    pub(in crate::redb_store) through: Arrival,
    /// Bytes of the journal rows written since `through` moved.
    pub(in crate::redb_store) bytes: u64,
}

impl FoldState {
    /// The state in the meta table `meta`.
    pub(in crate::redb_store) fn read(
        meta: &impl ReadableTable<&'static str, &'static [u8]>,
        name: &str,
    ) -> Result<Self, StoreError> {
        Ok(FoldState {
            through: read_u64(meta, META_INDEX_THROUGH, name)?,
            bytes: read_u64(meta, META_INDEX_DEFERRED_BYTES, name)?,
        })
    }
}

/// The agent index entries of one `Indexed` journal row.
pub(in crate::redb_store) struct DeferredRow {
    /// The arrival of the run's first envelope.
    first: Arrival,
    /// The run's stream, encoded (decoded only when a place is read).
    stream: Vec<u8>,
    first_seq: Seq,
    index: RunIndex,
}

impl DeferredRow {
    /// The row's inbox entries of `agent` after `after`, in arrival order.
    pub(super) fn inbox_of<'a>(
        &'a self,
        agent: &'a AgentName,
        after: Arrival,
    ) -> impl Iterator<Item = (Arrival, InboxRow)> + 'a {
        let ix = self.index.agents.iter().position(|a| a == agent);
        self.index
            .inbox
            .iter()
            .filter(move |(_, a, _)| ix.is_some_and(|ix| *a as usize == ix))
            .map(|(at, _, row)| (self.first + u64::from(*at), *row))
            .filter(move |(arrival, _)| *arrival > after)
    }

    /// The id of the message entry at `at`.
    fn id(&self, at: u32) -> MsgId {
        MsgId::in_stream(self.index.tag, self.first_seq + u64::from(at))
    }

    /// Where the message `id` is, if this row's index has it: sent or
    /// received, its seq and its arrival.
    pub(super) fn message(&self, id: &MsgId) -> Option<(MessageDir, Seq, Arrival)> {
        self.index
            .messages
            .iter()
            .find(|(at, _)| self.id(*at) == *id)
            .map(|(at, dir)| {
                (
                    *dir,
                    self.first_seq + u64::from(*at),
                    self.first + u64::from(*at),
                )
            })
    }

    /// The row's index entries.
    #[cfg(test)]
    pub(in crate::redb_store) fn entries(&self) -> usize {
        self.index.inbox.len() + self.index.messages.len()
    }

    /// The row's stream.
    pub(super) fn stream(&self, name: &str) -> Result<StreamId, StoreError> {
        decode(name, "stream id", &self.stream)
    }
}

/// Visits the agent index entries held in the `Indexed` rows of `journal`
/// after arrival `after`, oldest first, while `visit` says go on: at most
/// the rows since the last fold, which [`IndexFold`] bounds (plus the
/// commit that passed a bound).
pub(in crate::redb_store) fn deferred_rows(
    journal: &impl ReadableTable<u64, &'static [u8]>,
    after: Arrival,
    name: &str,
    mut visit: impl FnMut(DeferredRow) -> bool,
) -> Result<(), StoreError> {
    let rerr = |e: redb::StorageError| from_redb(name, "cannot read", e);
    let Some(from) = after.checked_add(1) else {
        return Ok(());
    };
    for row in journal.range(from..).map_err(rerr)? {
        let (k, v) = row.map_err(rerr)?;
        let Some((&INDEXED_TAG, rest)) = v.value().split_first() else {
            continue;
        };
        let head: IndexedHead = decode(name, "indexed journal row", rest)?;
        let index: RunIndex = decode(name, "journal row's index", head.index)?;
        let row = DeferredRow::new(k.value(), head.stream, head.first_seq, index)
            .map_err(|why| corrupt(name, format!("indexed journal row {}: {why}", k.value())))?;
        if !visit(row) {
            break;
        }
    }
    Ok(())
}

impl DeferredRow {
    /// The row keyed `last` of `stream` from `first_seq` with `index`, if
    /// its index names only its own envelopes and agents; the why if not.
    fn new(last: Arrival, stream: &[u8], first_seq: Seq, index: RunIndex) -> Result<Self, String> {
        let n = u64::from(index.n);
        let first = (last + 1)
            .checked_sub(n)
            .filter(|_| n > 0)
            .ok_or("its index counts no envelopes, or more than its key allows")?;
        first_seq
            .checked_add(n - 1)
            .ok_or("its seqs pass the largest seq")?;
        let agents = index.agents.len();
        if index
            .inbox
            .iter()
            .any(|(at, a, _)| *at >= index.n || *a as usize >= agents)
            || index.messages.iter().any(|(at, _)| *at >= index.n)
        {
            return Err("its index names an envelope or an agent it does not hold".into());
        }
        Ok(DeferredRow {
            first,
            stream: stream.to_vec(),
            first_seq,
            index,
        })
    }
}

/// The index of the run of `n` envelopes from arrival `first`:
/// the entries of `inbox` and `messages` (each in arrival order, each
/// message id its stream's own) at its arrivals, taken from their fronts.
/// `None` if it has none.
pub(in crate::redb_store) fn run_index(
    first: Arrival,
    n: usize,
    inbox: &mut &[InboxEntry],
    messages: &mut &[MessageEntry],
) -> Option<RunIndex> {
    let last = first + n as u64 - 1;
    let at = |arrival: Arrival| u32::try_from(arrival.saturating_sub(first)).unwrap_or(u32::MAX);
    let mut index = RunIndex {
        n: u32::try_from(n).unwrap_or(u32::MAX),
        ..RunIndex::default()
    };
    while let Some(((agent, arrival, row), rest)) = inbox.split_first()
        && *arrival <= last
    {
        let ix = match index.agents.iter().position(|a| a == agent) {
            Some(ix) => ix,
            None => {
                index.agents.push(agent.clone());
                index.agents.len() - 1
            }
        };
        index
            .inbox
            .push((at(*arrival), u32::try_from(ix).unwrap_or(u32::MAX), *row));
        *inbox = rest;
    }
    while let Some(((id, place), rest)) = messages.split_first()
        && place.arrival <= last
    {
        // Every id is its stream's own (`own_ids`): the first names the tag.
        index.tag.copy_from_slice(&id.0[..8]);
        debug_assert_eq!(*id, MsgId::in_stream(index.tag, place.seq));
        index.messages.push((at(place.arrival), place.dir));
        *messages = rest;
    }
    (!index.inbox.is_empty() || !index.messages.is_empty()).then_some(index)
}

impl AgentTables<'_> {
    /// Takes this commit's index entries, each kind in arrival order, and
    /// writes its bounces (rare, and keyed by id: never deferred).
    pub(in crate::redb_store) fn take_index(
        &mut self,
        name: &str,
    ) -> Result<(Vec<InboxEntry>, Vec<MessageEntry>), StoreError> {
        let mut inbox = std::mem::take(&mut self.inbox_pending);
        inbox.sort_by_key(|e| e.1);
        let mut messages = Vec::with_capacity(self.messages_pending.len());
        for (id, row) in std::mem::take(&mut self.messages_pending) {
            if let Some(reason) = row.undelivered {
                self.bounced_pending.push((id, reason));
            }
            messages.push((
                id,
                crate::agents::Place {
                    dir: row.dir,
                    stream: row.stream,
                    seq: row.seq,
                    arrival: row.arrival,
                },
            ));
        }
        messages.sort_by_key(|(_, p)| p.arrival);
        let bounced = std::mem::take(&mut self.bounced_pending);
        if !bounced.is_empty() {
            let werr = |e: redb::StorageError| from_redb(name, "cannot write", e);
            let t = open(self.tx, &mut self.undelivered, UNDELIVERED, name)?;
            for (id, reason) in bounced {
                let v = encode(&reason)?;
                t.insert(id.as_bytes().as_slice(), v.as_slice())
                    .map_err(werr)?;
            }
        }
        Ok((inbox, messages))
    }

    /// Writes the entries held in the journal rows after `fold.through` to
    /// the index tables, once per transaction: before a write that removes
    /// what they name.
    pub(in crate::redb_store) fn fold_rows(
        &mut self,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        name: &str,
    ) -> Result<(), StoreError> {
        self.fold_with(journal, Vec::new(), Vec::new(), name)
    }

    /// Writes `inbox` and `messages` (each in arrival order, all after
    /// what the journal rows hold) to the index tables, with the entries
    /// held in the rows after `fold.through` before them unless this
    /// transaction folded those already.
    pub(in crate::redb_store) fn fold_with(
        &mut self,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        inbox: Vec<InboxEntry>,
        messages: Vec<MessageEntry>,
        name: &str,
    ) -> Result<(), StoreError> {
        self.held(journal, name)?;
        let rows = self.held.take().unwrap_or_default();
        self.folded = true;
        let mut all_inbox = Vec::new();
        let mut all_messages = Vec::new();
        // Streams decoded once each (a node id's decoding checks a point).
        let mut streams: Vec<(Vec<u8>, StreamId)> = Vec::new();
        for r in &rows {
            for (at, agent, row) in &r.index.inbox {
                // `DeferredRow::new` checked the agent's place.
                let agent = r.index.agents[*agent as usize].clone();
                all_inbox.push((agent, r.first + u64::from(*at), *row));
            }
            if r.index.messages.is_empty() {
                continue;
            }
            let stream = match streams.iter().find(|(k, _)| *k == r.stream) {
                Some((_, s)) => s.clone(),
                None => {
                    let s = r.stream(name)?;
                    streams.push((r.stream.clone(), s.clone()));
                    s
                }
            };
            for (at, dir) in &r.index.messages {
                let place = crate::agents::Place {
                    dir: *dir,
                    stream: stream.clone(),
                    seq: r.first_seq + u64::from(*at),
                    arrival: r.first + u64::from(*at),
                };
                all_messages.push((r.id(*at), place));
            }
        }
        all_inbox.extend(inbox);
        all_messages.extend(messages);
        self.write_index(all_inbox, all_messages, name)
    }

    /// Writes index entries (each kind in arrival order, all after what
    /// the tables hold) to the tables as packed rows.
    pub(super) fn write_index(
        &mut self,
        mut inbox: Vec<InboxEntry>,
        messages: Vec<MessageEntry>,
        name: &str,
    ) -> Result<(), StoreError> {
        let werr = |e: redb::StorageError| from_redb(name, "cannot write", e);
        let tx = self.tx;
        if !inbox.is_empty() {
            // By agent, in arrival order: a fold's entries of an agent pack into rows.
            inbox.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            let t = open(tx, &mut self.inbox, INBOX, name)?;
            let mut buf = Vec::new();
            for chunk in inbox.chunk_by(|a, b| a.0 == b.0) {
                for part in chunk.chunks(INDEX_ROW_ENTRIES_MAX) {
                    let agent = part[0].0.as_str();
                    let last = part[part.len() - 1].1;
                    let run = InboxRun {
                        entries: part.iter().map(|(_, a, r)| (*a, *r)).collect(),
                    };
                    encode_into(&mut buf, &run)?;
                    t.insert((agent, last), buf.as_slice()).map_err(werr)?;
                }
            }
        }
        if messages.is_empty() {
            return Ok(());
        }
        let t = open(tx, &mut self.messages, MESSAGES, name)?;
        let mut buf = Vec::new();
        let mut run: Option<(MsgId, MessageRun)> = None;
        let mut write = |run: Option<(MsgId, MessageRun)>| -> Result<(), StoreError> {
            if let Some((last, r)) = run {
                encode_into(&mut buf, &r)?;
                t.insert(last.as_bytes().as_slice(), buf.as_slice())
                    .map_err(werr)?;
            }
            Ok(())
        };
        for (id, place) in messages {
            if let Some((last, r)) = &mut run
                && r.extends(last, &id, &place)
            {
                r.n += 1;
                *last = id;
                continue;
            }
            write(run.take())?;
            run = Some((
                id,
                MessageRun {
                    dir: place.dir,
                    stream: place.stream,
                    first_seq: place.seq,
                    first_arrival: place.arrival,
                    n: 1,
                },
            ));
        }
        write(run)
    }

    /// The entries held in the journal rows after `fold.through` that this
    /// transaction has not folded: read once per transaction (its own
    /// rows are written at its end, so they cannot change before a fold).
    pub(super) fn held(
        &mut self,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        name: &str,
    ) -> Result<&[DeferredRow], StoreError> {
        if self.folded {
            return Ok(&[]);
        }
        if self.held.is_none() {
            let mut rows = Vec::new();
            deferred_rows(journal, self.fold.through, name, |r| {
                rows.push(r);
                true
            })?;
            self.held = Some(rows);
        }
        Ok(self.held.as_deref().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(n: u32, inbox: Vec<(u32, u32, InboxRow)>, agents: usize) -> RunIndex {
        RunIndex {
            n,
            tag: [1; 8],
            agents: (0..agents)
                .map(|i| AgentName::new(&format!("a{i}")).expect("a name"))
                .collect(),
            inbox,
            messages: vec![(0, MessageDir::Received)],
        }
    }

    fn row() -> InboxRow {
        InboxRow {
            kind: crate::InboxKind::Message,
            verified: true,
            in_reply_to: None,
        }
    }

    #[test]
    fn a_held_row_whose_index_names_what_it_does_not_hold_is_refused() {
        let ok = DeferredRow::new(12, &[], 5, index(3, vec![(2, 0, row())], 1)).expect("valid");
        assert_eq!((ok.first, ok.id(2)), (10, MsgId::in_stream([1; 8], 7)));
        for (last, first_seq, ix) in [
            (12, 5, index(3, vec![(3, 0, row())], 1)),
            (12, 5, index(3, vec![(0, 1, row())], 1)),
            (12, 5, index(0, vec![], 0)),
            (1, 5, index(3, vec![], 0)),
            (12, u64::MAX, index(3, vec![], 0)),
        ] {
            assert!(DeferredRow::new(last, &[], first_seq, ix).is_err());
        }
    }
}
