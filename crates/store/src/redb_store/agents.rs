//! The agent tables on disk (`crate::agents`): written in the commit's
//! transaction, opened only by a commit that writes them; read as empty
//! from a file written before they existed.
//!
//! | table              | key                              | value                 |
//! |--------------------|----------------------------------|-----------------------|
//! | `agents-v1`        | agent name                       | postcard `AgentRecord` |
//! | `inbox-v1`         | (agent name, arrival)            | postcard `InboxRow`   |
//! | `messages-v1`      | message id (16 bytes)            | postcard `MessageRow` |
//! | `dedup-v1`         | (ms taken, postcard `DedupKey`)  | postcard `DedupRecord` |
//! | `aliases-v1`       | alias                            | node id (32 bytes)    |
//! | `agent-cursors-v1` | (agent name, cursor name)        | arrival               |

use mesh_protocol::{AgentName, MsgId, NodeId};
use redb::{ReadTransaction, WriteTransaction};

use super::*;
use crate::agents::{AgentWrite, dedup_key_bytes};
use crate::{AgentRecord, DedupRecord, InboxItem, InboxRow, MessageRow};

const AGENTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("agents-v1");
const INBOX: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("inbox-v1");
const MESSAGES: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("messages-v1");
const DEDUP: TableDefinition<'_, (u64, &[u8]), &[u8]> = TableDefinition::new("dedup-v1");
const ALIASES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("aliases-v1");
const AGENT_CURSORS: TableDefinition<'_, (&str, &str), u64> =
    TableDefinition::new("agent-cursors-v1");

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
    cursors: Option<Table<'tx, (&'static str, &'static str), u64>>,
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
            cursors: None,
        }
    }

    pub(super) fn apply(&mut self, w: AgentWrite, name: &str) -> Result<(), StoreError> {
        let werr = |e: redb::StorageError| from_redb(name, "cannot write", e);
        let tx = self.tx;
        match w {
            AgentWrite::PutAgent(r) => {
                let v = encode(&r)?;
                open(tx, &mut self.agents, AGENTS, name)?
                    .insert(r.name.as_str(), v.as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::RemoveAgent(agent) => {
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
            }
            AgentWrite::Inbox {
                agent,
                arrival,
                row,
            } => {
                let v = encode(&row)?;
                open(tx, &mut self.inbox, INBOX, name)?
                    .insert((agent.as_str(), arrival), v.as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::Message { id, row } => {
                let v = encode(&row)?;
                open(tx, &mut self.messages, MESSAGES, name)?
                    .insert(id.as_bytes().as_slice(), v.as_slice())
                    .map_err(werr)?;
            }
            AgentWrite::Bounced { id, reason } => {
                let t = open(tx, &mut self.messages, MESSAGES, name)?;
                let row = t
                    .get(id.as_bytes().as_slice())
                    .map_err(werr)?
                    .map(|v| decode::<MessageRow>(name, "message row", v.value()))
                    .transpose()?;
                if let Some(mut row) = row {
                    row.undelivered = Some(reason);
                    let v = encode(&row)?;
                    t.insert(id.as_bytes().as_slice(), v.as_slice())
                        .map_err(werr)?;
                }
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
        }
        Ok(())
    }
}

/// Opens `def` for reading; `None` if the file has no such table yet.
fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    rx: &ReadTransaction,
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
    pub(super) fn read_agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, AGENTS, &self.name)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (_, v) = row.map_err(|e| self.read_err(e))?;
            out.push(decode(&self.name, "agent", v.value())?);
        }
        Ok(out)
    }

    pub(super) fn read_inbox(
        &self,
        agent: &AgentName,
        after: Arrival,
        limit: usize,
    ) -> Result<Vec<InboxItem>, StoreError> {
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, INBOX, &self.name)? else {
            return Ok(Vec::new());
        };
        let a = agent.as_str();
        let mut rows = Vec::new();
        for row in t
            .range((a, next)..=(a, u64::MAX))
            .map_err(|e| self.read_err(e))?
            .take(limit)
        {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let row: InboxRow = decode(&self.name, "inbox row", v.value())?;
            rows.push((k.value().1, row));
        }
        let journal = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for (arrival, row) in rows {
            let mut found = Vec::with_capacity(1);
            // The row holding `arrival` is the first keyed at or after it.
            if let Some(r) = journal
                .range(arrival..)
                .map_err(|e| self.read_err(e))?
                .next()
            {
                let (k, v) = r.map_err(|e| self.read_err(e))?;
                let view: RowView = decode(&self.name, "journal row", v.value())?;
                view.push_items(&self.name, k.value(), arrival, 1, &mut found)?;
            }
            match found.pop() {
                Some(item) if item.arrival == arrival => out.push(InboxItem { item, row }),
                _ => {
                    return Err(corrupt(
                        &self.name,
                        format!("inbox of {agent} names arrival {arrival}, not in the journal"),
                    ));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn read_message(&self, id: &MsgId) -> Result<Option<MessageRow>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, MESSAGES, &self.name)? else {
            return Ok(None);
        };
        t.get(id.as_bytes().as_slice())
            .map_err(|e| self.read_err(e))?
            .map(|v| decode(&self.name, "message row", v.value()))
            .transpose()
    }

    pub(super) fn read_dedup(&self) -> Result<Vec<DedupRecord>, StoreError> {
        let rx = self.begin_read()?;
        let Some(t) = read_table(&rx, DEDUP, &self.name)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (_, v) = row.map_err(|e| self.read_err(e))?;
            out.push(decode(&self.name, "dedup record", v.value())?);
        }
        Ok(out)
    }

    pub(super) fn read_aliases(&self) -> Result<Vec<(String, NodeId)>, StoreError> {
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

    pub(super) fn read_agent_cursor(
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
