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
    /// is this tag and its seq ([`MsgId::in_stream`]) unless its entry
    /// names another (a forward carries the id its author gave it).
    tag: [u8; 8],
    /// The agents of `inbox`, each once.
    agents: Vec<AgentName>,
    /// Inbox entries: the envelope's place in the run, the agent (its
    /// place in `agents`), the row.
    inbox: Vec<(u32, u32, InboxRow)>,
    /// Message index entries: the envelope's place in the run, sent or
    /// received, and its id where it is not the tag's.
    messages: Vec<(u32, MessageDir, Option<MsgId>)>,
}

/// Where the agent index stands: the tables hold every entry up to
/// `through`; the journal rows after it hold `entries` more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::redb_store) struct FoldState {
    /// Every entry at this arrival or before is in the tables.
    pub(in crate::redb_store) through: Arrival,
    /// Entries held in journal rows after `through`.
    pub(in crate::redb_store) entries: u64,
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
            entries: read_u64(meta, META_INDEX_DEFERRED_ENTRIES, name)?,
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

    /// The id of the message entry at `at` naming `explicit`.
    pub(super) fn id(&self, at: u32, explicit: Option<MsgId>) -> MsgId {
        explicit.unwrap_or_else(|| MsgId::in_stream(self.index.tag, self.first_seq + u64::from(at)))
    }

    /// Where the message `id` is, if this row's index has it: sent or
    /// received, its seq and its arrival.
    pub(super) fn message(&self, id: &MsgId) -> Option<(MessageDir, Seq, Arrival)> {
        self.index
            .messages
            .iter()
            .find(|(at, _, explicit)| self.id(*at, *explicit) == *id)
            .map(|(at, dir, _)| {
                (
                    *dir,
                    self.first_seq + u64::from(*at),
                    self.first + u64::from(*at),
                )
            })
    }

    /// The row's stream.
    pub(super) fn stream(&self, name: &str) -> Result<StreamId, StoreError> {
        decode(name, "stream id", &self.stream)
    }
}

/// The agent index entries held in the `Indexed` rows of `journal` after
/// arrival `after`: at most the rows since the last fold, which
/// [`IndexFold`] bounds.
pub(in crate::redb_store) fn deferred_rows(
    journal: &impl ReadableTable<u64, &'static [u8]>,
    after: Arrival,
    name: &str,
) -> Result<Vec<DeferredRow>, StoreError> {
    let rerr = |e: redb::StorageError| from_redb(name, "cannot read", e);
    let mut out = Vec::new();
    let Some(from) = after.checked_add(1) else {
        return Ok(out);
    };
    for row in journal.range(from..).map_err(rerr)? {
        let (k, v) = row.map_err(rerr)?;
        let Some((&INDEXED_TAG, rest)) = v.value().split_first() else {
            continue;
        };
        let head: IndexedHead = decode(name, "indexed journal row", rest)?;
        let index: RunIndex = decode(name, "journal row's index", head.index)?;
        let first = (k.value() + 1)
            .checked_sub(u64::from(index.n))
            .ok_or_else(|| corrupt(name, "an indexed journal row holds more than its key"))?;
        out.push(DeferredRow {
            first,
            stream: head.stream.to_vec(),
            first_seq: head.first_seq,
            index,
        });
    }
    Ok(out)
}

/// The index of the run of `n` envelopes from `first` (seq `first_seq`):
/// the entries of `inbox` and `messages` (each in arrival order) at its
/// arrivals, taken from their fronts. `None` if it has none.
pub(in crate::redb_store) fn run_index(
    first: Arrival,
    first_seq: Seq,
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
        if index.messages.is_empty() {
            index.tag.copy_from_slice(&id.0[..8]);
        }
        let derived = MsgId::in_stream(index.tag, first_seq + u64::from(at(place.arrival)));
        let explicit = (derived != *id).then_some(*id);
        index
            .messages
            .push((at(place.arrival), place.dir, explicit));
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
        if std::mem::replace(&mut self.folded, true) || self.fold.entries == 0 {
            return self.write_index(inbox, messages, name);
        }
        let rows = deferred_rows(journal, self.fold.through, name)?;
        let mut all_inbox = Vec::new();
        let mut all_messages = Vec::new();
        // Streams decoded once each (a node id's decoding checks a point).
        let mut streams: Vec<(Vec<u8>, StreamId)> = Vec::new();
        for r in &rows {
            for (at, agent, row) in &r.index.inbox {
                let agent = r.index.agents.get(*agent as usize).ok_or_else(|| {
                    corrupt(
                        name,
                        "a journal row's index names an agent it does not hold",
                    )
                })?;
                all_inbox.push((agent.clone(), r.first + u64::from(*at), *row));
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
            for (at, dir, explicit) in &r.index.messages {
                let place = crate::agents::Place {
                    dir: *dir,
                    stream: stream.clone(),
                    seq: r.first_seq + u64::from(*at),
                    arrival: r.first + u64::from(*at),
                };
                all_messages.push((r.id(*at, *explicit), place));
            }
        }
        all_inbox.extend(inbox);
        all_messages.extend(messages);
        self.fold.entries = 0;
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

    /// The entries held in journal rows after `after` that this
    /// transaction has not folded.
    pub(super) fn deferred(
        &self,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        after: Arrival,
        name: &str,
    ) -> Result<Vec<DeferredRow>, StoreError> {
        if self.folded || self.fold.entries == 0 {
            return Ok(Vec::new());
        }
        deferred_rows(journal, after.max(self.fold.through), name)
    }
}
