//! The agent tables on disk (`crate::agents`): written in the commit's
//! transaction, opened only by a commit that writes them; read as empty
//! from a file written before they existed.
//!
//! | table              | key                              | value                 |
//! |--------------------|----------------------------------|-----------------------|
//! | `agents-v1`        | agent name                       | postcard `AgentRecord` |
//! | `inbox-v1`         | (agent name, last arrival in the row) | postcard `InboxRun`: the agent's entries of one commit |
//! | `messages-v1`      | id of the last message in the row (16 bytes) | postcard `MessageRun`: the places of consecutive messages of one stream |
//! | `undelivered-v1`   | message id                       | postcard `BounceReason` |
//! | `superseded-v1`    | message id                       | the id (16 bytes) of the message that superseded it before it was sent |
//! | `read-v1`          | message id                       | postcard `ReadMark`: who read a sent message, and when (its read receipt) |
//! | `dedup-v1`         | (ms taken, postcard `DedupKey`)  | postcard `DedupRecord` |
//! | `aliases-v1`       | alias                            | node id (32 bytes)    |
//! | `moves-v1`         | agent key (32 bytes)             | postcard `AgentMove`: the move notice held of the agent |
//! | `forwards-v1`      | message id                       | the arrival of the last inbox entry made from a forward of it while the message index had it |
//! | `agent-cursors-v1` | (agent name, cursor name)        | arrival               |
//! | `inbox-trimmed-v1` | agent name                       | the last arrival of its inbox that retention took |
//!
//! The two indexes are packed as the journal is: a fold's inbox entries
//! of one agent are one row, and its messages of one stream at
//! consecutive seqs, arrivals and ids are one row (the stream named once),
//! so indexing thousands of agent messages is a few inserts, not one per
//! message. Between folds the entries are in the journal rows of their
//! envelopes (`fold::RunIndex`, `super`'s module docs): a read takes the
//! tables up to `index_through` and those rows after it. A row is keyed by its last entry, so the row that
//! holds an entry is the first keyed at or after it. The message index
//! holds places only: a message's sender, recipient and what it answers
//! are read from its envelope in the journal (once retention trimmed that,
//! the message is unknown here: `docs/design.md`), and the few
//! messages not delivered are in `undelivered-v1`.

use mesh_protocol::{AgentName, BounceReason, MsgId, NodeId};
use redb::WriteTransaction;

use super::read::read_table;
use super::*;
use crate::agents::{AgentWrite, dedup_key_bytes};
use crate::{AgentRecord, DedupRecord, InboxItem, InboxRow, MessageDir, MessageRow};

mod fold;
mod read;

use fold::DeferredRow;
pub(in crate::redb_store) use fold::deferred_rows;
pub(in crate::redb_store) use fold::{FoldState, InboxEntry, MessageEntry, run_index};

/// The most entries in one packed index row.
const INDEX_ROW_ENTRIES_MAX: usize = 256;

/// One agent's inbox entries written in one fold, in arrival order.
#[derive(Serialize, Deserialize)]
struct InboxRun {
    entries: Vec<(Arrival, InboxRow)>,
}

/// The places of messages of one stream at consecutive seqs, arrivals and
/// ids (their content is their envelopes in the journal).
#[derive(Serialize, Deserialize)]
struct MessageRun {
    dir: MessageDir,
    stream: StreamId,
    first_seq: Seq,
    first_arrival: Arrival,
    n: u32,
}

impl MessageRun {
    /// Whether the message `id` at `row` can follow this run's last (whose id is `last`).
    fn extends(&self, last: &MsgId, id: &MsgId, row: &crate::agents::Place) -> bool {
        let n = u64::from(self.n);
        (self.n as usize) < INDEX_ROW_ENTRIES_MAX
            && self.dir == row.dir
            && self.stream == row.stream
            && row.seq == self.first_seq + n
            && row.arrival == self.first_arrival + n
            && id_follows(last, id)
    }

    /// The place of entry `i`.
    fn place(&self, i: usize) -> crate::agents::Place {
        crate::agents::Place {
            dir: self.dir,
            stream: self.stream.clone(),
            seq: self.first_seq + i as u64,
            arrival: self.first_arrival + i as u64,
        }
    }
}

/// The low 8 bytes of an id, as a number.
fn id_low(id: &MsgId) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id.0[8..]);
    u64::from_be_bytes(b)
}

/// Whether `next` is the id after `prev` in one stream (same tag, low part + 1).
fn id_follows(prev: &MsgId, next: &MsgId) -> bool {
    prev.0[..8] == next.0[..8] && id_low(prev).checked_add(1) == Some(id_low(next))
}

/// Where `id` is in the run keyed `key` with `n` entries, if there.
fn index_in(key: &MsgId, n: usize, id: &MsgId) -> Option<usize> {
    if key.0[..8] != id.0[..8] {
        return None;
    }
    let back = id_low(key).checked_sub(id_low(id))?;
    let back = usize::try_from(back).ok()?;
    (back < n).then(|| n - 1 - back)
}

const AGENTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("agents-v1");
const INBOX: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("inbox-v1");
const MESSAGES: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("messages-v1");
const DEDUP: TableDefinition<'_, (u64, &[u8]), &[u8]> = TableDefinition::new("dedup-v1");
const ALIASES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("aliases-v1");
const MOVES: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("moves-v1");
const UNDELIVERED: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("undelivered-v1");
const SUPERSEDED: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("superseded-v1");
/// Added to schema 5 without a version bump (a new table changes no
/// encoding): a file written before it has no read marks.
const READ: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("read-v1");
const AGENT_CURSORS: TableDefinition<'_, (&str, &str), u64> =
    TableDefinition::new("agent-cursors-v1");
const INBOX_TRIMMED: TableDefinition<'_, &str, u64> = TableDefinition::new("inbox-trimmed-v1");
const FORWARDS: TableDefinition<'_, &[u8], u64> = TableDefinition::new("forwards-v1");

/// The dedup table as a write transaction holds it.
type DedupTable<'tx> = Table<'tx, (u64, &'static [u8]), &'static [u8]>;

/// The agent tables of one write transaction, each opened when first written.
pub(super) struct AgentTables<'tx> {
    tx: &'tx WriteTransaction,
    agents: Option<Table<'tx, &'static str, &'static [u8]>>,
    inbox: Option<Table<'tx, (&'static str, u64), &'static [u8]>>,
    messages: Option<Table<'tx, &'static [u8], &'static [u8]>>,
    dedup: Option<DedupTable<'tx>>,
    aliases: Option<Table<'tx, &'static str, &'static [u8]>>,
    moves: Option<Table<'tx, &'static [u8], &'static [u8]>>,
    cursors: Option<Table<'tx, (&'static str, &'static str), u64>>,
    undelivered: Option<Table<'tx, &'static [u8], &'static [u8]>>,
    superseded: Option<Table<'tx, &'static [u8], &'static [u8]>>,
    read: Option<Table<'tx, &'static [u8], &'static [u8]>>,
    inbox_trimmed: Option<Table<'tx, &'static str, u64>>,
    forwards: Option<Table<'tx, &'static [u8], u64>>,
    /// Index entries of this commit: in its journal rows or the tables at
    /// `Tables::flush`.
    inbox_pending: Vec<InboxEntry>,
    messages_pending: Vec<(MsgId, MessageRow)>,
    bounced_pending: Vec<(MsgId, BounceReason)>,
    /// Where the index stood when this transaction began (set by its opener).
    pub(super) fold: FoldState,
    /// Whether this transaction wrote the entries of the rows after
    /// `fold.through` to the tables: then its own go there too.
    pub(super) folded: bool,
    /// The entries those rows hold, once read (see [`AgentTables::held`]).
    held: Option<Vec<DeferredRow>>,
}

/// Opens `def` in `tx` into `slot` if it is not open yet.
fn open<'s, 'tx, K: redb::Key + 'static, V: redb::Value + 'static>(
    tx: &'tx WriteTransaction,
    slot: &'s mut Option<Table<'tx, K, V>>,
    def: TableDefinition<'_, K, V>,
    name: &str,
) -> Result<&'s mut Table<'tx, K, V>, StoreError> {
    if slot.is_none() {
        *slot = Some(
            tx.open_table(def)
                .map_err(|e| from_redb(name, "cannot write", e))?,
        );
    }
    // Set just above.
    slot.as_mut()
        .ok_or_else(|| StoreError::Unavailable("table not open".into()))
}

impl<'tx> AgentTables<'tx> {
    pub(super) fn new(tx: &'tx WriteTransaction) -> Self {
        AgentTables {
            tx,
            agents: None,
            inbox: None,
            messages: None,
            dedup: None,
            aliases: None,
            moves: None,
            cursors: None,
            undelivered: None,
            superseded: None,
            read: None,
            inbox_trimmed: None,
            forwards: None,
            inbox_pending: Vec::new(),
            messages_pending: Vec::new(),
            bounced_pending: Vec::new(),
            fold: FoldState::default(),
            folded: false,
            held: None,
        }
    }

    /// Whether this node has the local agent `agent`.
    pub(super) fn has_agent(&mut self, agent: &AgentName, name: &str) -> Result<bool, StoreError> {
        let t = open(self.tx, &mut self.agents, AGENTS, name)?;
        Ok(t.get(agent.as_str())
            .map_err(|e| from_redb(name, "cannot read", e))?
            .is_some())
    }

    /// Whether `agent`'s inbox has an entry after `after`: in a row of an
    /// earlier commit (a row is keyed by its last arrival) or of this one.
    pub(super) fn inbox_after(
        &mut self,
        agent: &AgentName,
        after: Arrival,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        name: &str,
    ) -> Result<bool, StoreError> {
        if self
            .inbox_pending
            .iter()
            .any(|(a, arrival, _)| a == agent && *arrival > after)
        {
            return Ok(true);
        }
        if self
            .held(journal, name)?
            .iter()
            .any(|r| r.inbox_of(agent, after).next().is_some())
        {
            return Ok(true);
        }
        let rerr = |e: redb::StorageError| from_redb(name, "cannot read", e);
        let t = open(self.tx, &mut self.inbox, INBOX, name)?;
        let mut range = t
            .range((agent.as_str(), after.saturating_add(1))..=(agent.as_str(), u64::MAX))
            .map_err(rerr)?;
        Ok(range.next().is_some())
    }

    /// Whether the message index has `id`, and as sent or received:
    /// written by an earlier commit, or by an earlier group of this one.
    pub(super) fn message_place(
        &mut self,
        id: &MsgId,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        name: &str,
    ) -> Result<Option<(MessageDir, Arrival)>, StoreError> {
        Ok(self
            .message_at(id, journal, name)?
            .map(|p| (p.dir, p.arrival)))
    }

    /// Whether the sent message `id` is marked read, as written so far.
    pub(super) fn is_read(&mut self, id: &MsgId, name: &str) -> Result<bool, StoreError> {
        let t = open(self.tx, &mut self.read, READ, name)?;
        Ok(t.get(id.as_bytes().as_slice())
            .map_err(|e| from_redb(name, "cannot read", e))?
            .is_some())
    }

    /// Where the message index has `id`: written by an earlier commit, or
    /// by an earlier group of this one.
    pub(super) fn message_at(
        &mut self,
        id: &MsgId,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        name: &str,
    ) -> Result<Option<crate::agents::Place>, StoreError> {
        if let Some((_, row)) = self.messages_pending.iter().rev().find(|(m, _)| m == id) {
            return Ok(Some(crate::agents::Place::of(row)));
        }
        if let Some(r) = self
            .held(journal, name)?
            .iter()
            .find(|r| r.message(id).is_some())
            && let Some((dir, seq, arrival)) = r.message(id)
        {
            return Ok(Some(crate::agents::Place {
                dir,
                stream: r.stream(name)?,
                seq,
                arrival,
            }));
        }
        let rerr = |e: redb::StorageError| from_redb(name, "cannot read", e);
        let t = open(self.tx, &mut self.messages, MESSAGES, name)?;
        let mut range = t.range(id.as_bytes().as_slice()..).map_err(rerr)?;
        let Some(row) = range.next() else {
            return Ok(None);
        };
        let (k, v) = row.map_err(rerr)?;
        let key = MsgId(
            k.value()
                .try_into()
                .map_err(|_| corrupt(name, "a message row's key is not an id"))?,
        );
        let run: MessageRun = decode(name, "message row", v.value())?;
        Ok(index_in(&key, run.n as usize, id).map(|i| run.place(i)))
    }

    /// Where an inbox here last took a forward of `id` while the message
    /// index had it, as written so far.
    pub(super) fn forward_taken(
        &mut self,
        id: &MsgId,
        name: &str,
    ) -> Result<Option<Arrival>, StoreError> {
        let t = open(self.tx, &mut self.forwards, FORWARDS, name)?;
        Ok(t.get(id.as_bytes().as_slice())
            .map_err(|e| from_redb(name, "cannot read", e))?
            .map(|v| v.value()))
    }

    /// An agent's named cursor, as written so far (earlier commits and
    /// earlier groups of this one).
    pub(super) fn agent_cursor(
        &mut self,
        agent: &AgentName,
        cursor: &str,
        name: &str,
    ) -> Result<Option<Arrival>, StoreError> {
        let t = open(self.tx, &mut self.cursors, AGENT_CURSORS, name)?;
        Ok(t.get((agent.as_str(), cursor))
            .map_err(|e| from_redb(name, "cannot read", e))?
            .map(|v| v.value()))
    }

    pub(super) fn apply(
        &mut self,
        w: AgentWrite,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        name: &str,
    ) -> Result<(), StoreError> {
        let werr = |e: redb::StorageError| from_redb(name, "cannot write", e);
        let tx = self.tx;
        // A write that removes entries folds first if rows may hold some of
        // them. A trim of inboxes before `fold.through + 1` takes table
        // entries only. A trim of messages comes with the trim of the
        // journal rows that held them, which folded if it reached past
        // `fold.through`; otherwise the rows after it hold only ids of
        // their own streams' later seqs (`Tables::flush`), none in range.
        let removes_held = match &w {
            AgentWrite::RemoveAgent(_) => true,
            AgentWrite::TrimInboxes { before } => *before > self.fold.through.saturating_add(1),
            _ => false,
        };
        if removes_held {
            self.fold_rows(journal, name)?;
        }
        match w {
            AgentWrite::PutAgent(r) => {
                let v = encode(&r)?;
                open(tx, &mut self.agents, AGENTS, name)?
                    .insert(r.name.as_str(), v.as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::RemoveAgent(agent) => {
                self.inbox_pending.retain(|(n, _, _)| *n != agent);
                let a = agent.as_str();
                open(tx, &mut self.agents, AGENTS, name)?
                    .remove(a)
                    .map_err(werr)?;
                open(tx, &mut self.inbox, INBOX, name)?
                    .retain_in((a, 0)..=(a, u64::MAX), |_, _| false)
                    .map_err(werr)?;
                open(tx, &mut self.cursors, AGENT_CURSORS, name)?
                    .retain_in((a, "")..=(a, "\u{10ffff}"), |_, _| false)
                    .map_err(werr)?;
                open(tx, &mut self.inbox_trimmed, INBOX_TRIMMED, name)?
                    .remove(a)
                    .map_err(werr)?;
            }
            AgentWrite::Inbox {
                agent,
                arrival,
                row,
            } => self.inbox_pending.push((agent, arrival, row)),
            AgentWrite::Message { id, row } => self.messages_pending.push((id, row)),
            AgentWrite::ForwardTaken { id, arrival } => {
                open(tx, &mut self.forwards, FORWARDS, name)?
                    .insert(id.as_bytes().as_slice(), arrival)
                    .map_err(werr)?;
            }
            AgentWrite::Bounced { id, reason } => self.bounced_pending.push((id, reason)),
            AgentWrite::Superseded { id, by } => {
                open(tx, &mut self.superseded, SUPERSEDED, name)?
                    .insert(id.as_bytes().as_slice(), by.as_bytes().as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::Read { id, mark } => {
                let v = encode(&mark)?;
                open(tx, &mut self.read, READ, name)?
                    .insert(id.as_bytes().as_slice(), v.as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::Dedup(r) => {
                let k = dedup_key_bytes(&r.key);
                let v = encode(&r)?;
                open(tx, &mut self.dedup, DEDUP, name)?
                    .insert((r.at_ms, k.as_slice()), v.as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::ExpireDedup { before_ms } => {
                let empty: &[u8] = &[];
                open(tx, &mut self.dedup, DEDUP, name)?
                    .retain_in((0, empty)..(before_ms, empty), |_, _| false)
                    .map_err(werr)?;
            }
            AgentWrite::ForgetDedup { at_ms, key } => {
                let k = dedup_key_bytes(&key);
                open(tx, &mut self.dedup, DEDUP, name)?
                    .remove((at_ms, k.as_slice()))
                    .map_err(werr)?;
            }
            AgentWrite::Move(notice) => {
                let v = postcard::to_stdvec(&notice)
                    .map_err(|e| StoreError::Unavailable(format!("cannot encode: {e}")))?;
                open(tx, &mut self.moves, MOVES, name)?
                    .insert(notice.key.as_bytes().as_slice(), v.as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::Alias { alias, node } => {
                let t = open(tx, &mut self.aliases, ALIASES, name)?;
                match node {
                    Some(n) => t.insert(alias.as_str(), n.as_bytes().as_slice()).map(drop),
                    None => t.remove(alias.as_str()).map(drop),
                }
                .map_err(werr)?;
            }
            AgentWrite::Cursor {
                agent,
                name: cursor,
                arrival,
            } => {
                open(tx, &mut self.cursors, AGENT_CURSORS, name)?
                    .insert((agent.as_str(), cursor.as_str()), arrival)
                    .map_err(werr)?;
            }
            AgentWrite::TrimInboxes { before } => self.trim_inboxes(before, name)?,
            AgentWrite::TrimMessages { tag, from, to } => {
                self.trim_messages(MsgId::in_stream(tag, from), MsgId::in_stream(tag, to), name)?
            }
        }
        Ok(())
    }

    /// Removes the message rows of the ids `lo..=hi` (of one stream): the
    /// rows keyed in it, and the early part of the row after it if that
    /// holds some; and their undelivered and superseded marks.
    fn trim_messages(&mut self, lo: MsgId, hi: MsgId, name: &str) -> Result<(), StoreError> {
        let werr = |e: redb::StorageError| from_redb(name, "cannot write", e);
        let tx = self.tx;
        let (lo_k, hi_k) = (lo.as_bytes().as_slice(), hi.as_bytes().as_slice());
        let t = open(tx, &mut self.messages, MESSAGES, name)?;
        t.retain_in(lo_k..=hi_k, |_, _| false).map_err(werr)?;
        let after = t
            .range(hi_k..)
            .map_err(werr)?
            .next()
            .transpose()
            .map_err(werr)?
            .map(|(k, v)| (k.value().to_vec(), v.value().to_vec()));
        if let Some((key, bytes)) = after {
            let key = MsgId(
                key.as_slice()
                    .try_into()
                    .map_err(|_| corrupt(name, "a message row's key is not an id"))?,
            );
            let mut run: MessageRun = decode(name, "message row", &bytes)?;
            // The row's entries end at its key, one id apart.
            let first_low = id_low(&key).saturating_sub(u64::from(run.n).saturating_sub(1));
            if key.0[..8] == hi.0[..8] && first_low <= id_low(&hi) {
                let gone = id_low(&hi) - first_low + 1;
                run.first_seq += gone;
                run.first_arrival += gone;
                run.n -= u32::try_from(gone).unwrap_or(run.n);
                let v = encode(&run)?;
                t.insert(key.as_bytes().as_slice(), v.as_slice())
                    .map_err(werr)?;
            }
        }
        for (slot, def) in [
            (&mut self.undelivered, UNDELIVERED),
            (&mut self.superseded, SUPERSEDED),
            (&mut self.read, READ),
        ] {
            open(tx, slot, def, name)?
                .retain_in(lo_k..=hi_k, |_, _| false)
                .map_err(werr)?;
        }
        open(tx, &mut self.forwards, FORWARDS, name)?
            .retain_in(lo_k..=hi_k, |_, _| false)
            .map_err(werr)?;
        Ok(())
    }

    /// Removes every agent's inbox entries before `before` (whole rows, and
    /// the early part of the row that holds `before`), and remembers the
    /// last one each agent lost.
    fn trim_inboxes(&mut self, before: Arrival, name: &str) -> Result<(), StoreError> {
        let werr = |e: redb::StorageError| from_redb(name, "cannot write", e);
        let tx = self.tx;
        let inbox = open(tx, &mut self.inbox, INBOX, name)?;
        let mut lost = Vec::new();
        // Each agent with an inbox, one range read each: the first key
        // after all of an agent's is its name with a NUL appended.
        let mut next = String::new();
        loop {
            let Some(a) = inbox
                .range((next.as_str(), 0)..)
                .map_err(werr)?
                .next()
                .transpose()
                .map_err(werr)?
                .map(|(k, _)| k.value().0.to_owned())
            else {
                break;
            };
            next = format!("{a}\0");
            let a = a.as_str();
            // Rows are keyed by their last arrival.
            let mut last = inbox
                .range((a, 0)..(a, before))
                .map_err(werr)?
                .next_back()
                .transpose()
                .map_err(werr)?
                .map(|(k, _)| k.value().1);
            if last.is_some() {
                inbox
                    .retain_in((a, 0)..(a, before), |_, _| false)
                    .map_err(werr)?;
            }
            let straddling = inbox
                .range((a, before)..=(a, u64::MAX))
                .map_err(werr)?
                .next()
                .transpose()
                .map_err(werr)?
                .map(|(k, v)| (k.value().1, v.value().to_vec()));
            if let Some((key, bytes)) = straddling {
                let mut run: InboxRun = decode(name, "inbox row", &bytes)?;
                if run.entries.first().is_some_and(|(at, _)| *at < before) {
                    let gone = run.entries.iter().filter(|(at, _)| *at < before).count();
                    last = last.max(Some(run.entries[gone - 1].0));
                    run.entries.drain(..gone);
                    let v = encode(&run)?;
                    inbox.insert((a, key), v.as_slice()).map_err(werr)?;
                }
            }
            if let Some(last) = last {
                lost.push((a.to_owned(), last));
            }
        }
        let trimmed = open(tx, &mut self.inbox_trimmed, INBOX_TRIMMED, name)?;
        for (a, last) in lost {
            let was = trimmed
                .get(a.as_str())
                .map_err(werr)?
                .map_or(0, |v| v.value());
            trimmed.insert(a.as_str(), last.max(was)).map_err(werr)?;
        }
        Ok(())
    }
}
