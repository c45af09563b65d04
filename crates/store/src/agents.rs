//! What the store keeps for agents: the local agents, each agent's inbox
//! index, the message index, retried-send records, node aliases and
//! agents' named cursors. All of it is written by [`WriteOp::Agents`]
//! ([`AgentOp`]) in the same transaction as the journal entries it
//! indexes, and read back by the `MeshStore` methods `agents`, `inbox`,
//! `message`, `dedup`, `aliases` and `agent_cursor`.
//!
//! The rules for these ops are here too, for both implementations: an
//! index entry names an envelope journaled earlier in its group by stream
//! and seq, and the store resolves that to the envelope's arrival.
//!
//! [`WriteOp::Agents`]: crate::WriteOp::Agents

use mesh_protocol::{AgentName, BounceReason, MsgId, NodeId, Seq, StreamId};
use serde::{Deserialize, Serialize};

use crate::Arrival;

/// The longest `client_id` of a retried send, in bytes.
pub const CLIENT_ID_BYTES_MAX: usize = 128;

/// The longest node alias, in bytes (the same rule as an agent name).
pub const ALIAS_BYTES_MAX: usize = 64;

/// A local agent as the store keeps it (its secret key is a file of its own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// Its name, unique on this node.
    pub name: AgentName,
    /// Its public key.
    #[serde(with = "node_id_bytes")]
    pub key: NodeId,
    /// The uid whose processes may act as it.
    pub uid: u32,
    /// When it was added, ms since the Unix epoch.
    pub created_ms: u64,
}

/// What an entry of an agent's inbox is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum InboxKind {
    /// An agent message to it.
    Message,
    /// A bounce of a message it sent.
    Bounce,
    /// A lag record of one of its live subscriptions.
    Lagged,
    /// A tombstone: a message to it that was superseded before it was sent.
    // Appended last: a variant's place is its stored encoding.
    Superseded,
    /// A loss record naming messages it sent that were given up before
    /// their recipient node had them (its outbox evicted them).
    Lost,
    /// A read receipt: the recipient agent of messages it sent, which
    /// asked for one, read them.
    Read,
}

/// One entry of an agent's inbox index: the journal entry at its arrival
/// belongs to the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxRow {
    /// What it is.
    pub kind: InboxKind,
    /// For a message: whether its author announced its sender agent.
    pub verified: bool,
    /// For a message: what it answers (kept here so that a wait for a
    /// reply reads no journal entry it does not want).
    pub in_reply_to: Option<MsgId>,
}

/// An inbox entry read back: the index row and the journal entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxItem {
    /// The journal entry (its arrival is the inbox cursor).
    pub item: crate::JournalItem,
    /// The index row.
    pub row: InboxRow,
}

/// Whether a message was sent from this node or received by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MessageDir {
    /// This node is its author.
    Sent,
    /// This node received it.
    Received,
}

/// What the message index says of one agent message: its place (kept in
/// the index) and what its envelope in the journal says (read from there:
/// the index holds no copy of it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRow {
    /// Sent or received here.
    pub dir: MessageDir,
    /// Its stream.
    pub stream: StreamId,
    /// Its seq in the stream.
    pub seq: Seq,
    /// Its arrival in this node's journal.
    pub arrival: Arrival,
    /// The sending agent (on the stream's author).
    pub from: AgentName,
    /// The recipient agent (on the stream's recipient), if any.
    pub to: Option<AgentName>,
    /// What it answers.
    pub in_reply_to: Option<MsgId>,
    /// Set when it was not delivered: here (received) or as the bounce
    /// that came back (sent).
    pub undelivered: Option<BounceReason>,
    /// Set when a later message with the same supersede key replaced it
    /// before it was sent: that message. Read from `superseded-v1` (sent)
    /// or from the tombstone in the journal (received); never part of the
    /// index row's own encoding.
    #[serde(skip)]
    pub superseded_by: Option<MsgId>,
    /// Set when this node sent it and its reader's receipt came back: who
    /// read it and when. Read from `read-v1`; never part of the index
    /// row's own encoding.
    #[serde(skip)]
    pub read: Option<ReadMark>,
}

/// Who read a message this node sent, and when (from a read receipt).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadMark {
    /// The reader's node (the receipt's author).
    #[serde(with = "node_id_bytes")]
    pub node: NodeId,
    /// The reader agent.
    pub reader: AgentName,
    /// When it read it, ms since the Unix epoch (as the receipt says).
    pub read_ms: u64,
}

/// A retried send's key: the sender (an agent, or the node itself) and
/// the id the client chose.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DedupKey {
    /// The sending agent; `None` for a send as the node.
    pub sender: Option<AgentName>,
    /// The client's id (1..=[`CLIENT_ID_BYTES_MAX`] bytes).
    pub client_id: String,
}

/// The first send of a [`DedupKey`], answered again to a retry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupRecord {
    /// The key.
    pub key: DedupKey,
    /// When the first send was taken, ms since the Unix epoch.
    pub at_ms: u64,
    /// A digest of what was sent (recipient and body), so that a retry
    /// with another message under the same id is told apart.
    pub digest: [u8; 16],
    /// The message id, for an agent message.
    pub msg: Option<MsgId>,
    /// Its stream.
    pub stream: StreamId,
    /// Its seq.
    pub seq: Seq,
    /// Its arrival in this node's journal.
    pub arrival: Arrival,
}

/// An index entry for an envelope journaled earlier in the same group.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentIndex {
    /// The envelope `seq` goes to `agent`'s inbox.
    Inbox {
        /// The agent.
        agent: AgentName,
        /// The envelope's seq.
        seq: Seq,
        /// The row.
        row: InboxRow,
    },
    /// The envelope `seq` is the agent message `id` (its arrival is filled in).
    Message {
        /// The message id.
        id: MsgId,
        /// The envelope's seq.
        seq: Seq,
        /// The row (`arrival` and `stream` are set by the store).
        row: MessageRow,
    },
    /// The envelope `seq` carries the agent message `id` that the old host
    /// of `agent` passed on (a forward): it goes to `agent`'s inbox and the
    /// message index, unless the message index has `id` already (the same
    /// message passed on twice, or come straight too): then neither.
    Forwarded {
        /// The agent.
        agent: AgentName,
        /// The message id.
        id: MsgId,
        /// The envelope's seq.
        seq: Seq,
        /// The inbox row.
        inbox: InboxRow,
        /// The message row (`arrival` and `stream` are set by the store).
        message: MessageRow,
    },
    /// The envelope `seq` is a forward of the message `id` that the store
    /// put in an inbox although the message index had `id` already (the
    /// agent came back here, or it is this node's own message): the next
    /// forward of `id` is measured against this arrival, so it is taken
    /// once. The store writes it itself, expanding [`AgentIndex::Forwarded`].
    ForwardTaken {
        /// The message id.
        id: MsgId,
        /// The forward's seq.
        seq: Seq,
    },
    /// The envelope `seq` is a read receipt: `mark.reader` on `mark.node`
    /// read the messages `ids`. The store marks each id that this node
    /// sent to `mark.node` and that is not marked read yet (the others
    /// are skipped and counted in [`crate::Receipt::read`]); if it marks
    /// any, the envelope goes to `agent`'s inbox (kind
    /// [`InboxKind::Read`]), else the receipt is refused: no entry. So a
    /// receipt delivered twice, or naming only what this node never sent,
    /// tells the agent nothing.
    Read {
        /// The sending agent told.
        agent: AgentName,
        /// The receipt envelope's seq.
        seq: Seq,
        /// Who read them, and when.
        mark: ReadMark,
        /// The messages read.
        ids: Vec<MsgId>,
    },
    /// The envelope `seq` is the first send of `key` (arrival filled in).
    Dedup {
        /// The envelope's seq.
        seq: Seq,
        /// The record (`arrival` and `stream` are set by the store).
        record: DedupRecord,
    },
}

impl AgentIndex {
    fn seq(&self) -> Seq {
        match self {
            AgentIndex::Inbox { seq, .. }
            | AgentIndex::Message { seq, .. }
            | AgentIndex::Forwarded { seq, .. }
            | AgentIndex::ForwardTaken { seq, .. }
            | AgentIndex::Read { seq, .. }
            | AgentIndex::Dedup { seq, .. } => *seq,
        }
    }
}

/// The named cursor of an agent that came back to a node it had left: it
/// reads its inbox there after this. A message passed on to it again
/// (from the host it left) that this node journaled at or before it is put
/// in its inbox again, since it reads on from past where it had it.
pub const RESUMED_CURSOR: &str = "mesh:resumed";

/// One agent write (the payload of [`crate::WriteOp::Agents`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentOp {
    /// Add or replace a local agent.
    PutAgent(AgentRecord),
    /// Remove a local agent, its inbox index and its named cursors (its
    /// journal entries stay).
    RemoveAgent(AgentName),
    /// Index envelopes of `stream` journaled earlier in the same group.
    /// Check: each names a seq journaled there.
    Index {
        /// The stream.
        stream: StreamId,
        /// The entries.
        entries: Vec<AgentIndex>,
    },
    /// The last journal entry written so far in the same group goes to
    /// `agent`'s inbox (a lag record of its subscription). Check: the
    /// group journaled something.
    InboxLast {
        /// The agent.
        agent: AgentName,
        /// The row.
        row: InboxRow,
    },
    /// Mark the message `id` (if this node indexed it) as bounced.
    Bounced {
        /// The message.
        id: MsgId,
        /// Why it was not delivered.
        reason: BounceReason,
    },
    /// Record that the sent message `id` was superseded by `by` before it
    /// was sent (its tombstone replaced it in the outbox).
    Superseded {
        /// The message replaced.
        id: MsgId,
        /// The message that replaced it.
        by: MsgId,
    },
    /// Forget retried-send records taken before `before_ms`.
    ExpireDedup {
        /// The cut-off, ms since the Unix epoch.
        before_ms: u64,
    },
    /// Forget one retried-send record (the memory bound let it go early).
    ForgetDedup {
        /// When it was taken.
        at_ms: u64,
        /// Its key.
        key: DedupKey,
    },
    /// Set (`Some`) or clear (`None`) the local alias `alias` of a node.
    /// Check: 1..=[`ALIAS_BYTES_MAX`] bytes.
    PutAlias {
        /// The alias.
        alias: String,
        /// The node, or `None` to remove the alias.
        node: Option<NodeId>,
    },
    /// Set an agent's named cursor. Checks: the name is
    /// 1..=[`crate::CURSOR_NAME_BYTES_MAX`] bytes and `arrival` is at most
    /// the journal head.
    PutCursor {
        /// The agent.
        agent: AgentName,
        /// The cursor's name.
        name: String,
        /// The arrival.
        arrival: Arrival,
    },
    /// Keep `notice` as the move notice of its agent (replacing the one
    /// held): the core keeps only the notice that wins.
    PutMove(mesh_protocol::AgentMove),
}

/// One primitive agent write, as planned (arrivals resolved).
#[derive(Debug)]
pub(crate) enum AgentWrite {
    PutAgent(AgentRecord),
    RemoveAgent(AgentName),
    Inbox {
        agent: AgentName,
        arrival: Arrival,
        row: InboxRow,
    },
    Message {
        id: MsgId,
        row: MessageRow,
    },
    ForwardTaken {
        id: MsgId,
        arrival: Arrival,
    },
    Bounced {
        id: MsgId,
        reason: BounceReason,
    },
    Superseded {
        id: MsgId,
        by: MsgId,
    },
    Read {
        id: MsgId,
        mark: ReadMark,
    },
    Dedup(DedupRecord),
    ExpireDedup {
        before_ms: u64,
    },
    ForgetDedup {
        at_ms: u64,
        key: DedupKey,
    },
    Alias {
        alias: String,
        node: Option<NodeId>,
    },
    Move(mesh_protocol::AgentMove),
    Cursor {
        agent: AgentName,
        name: String,
        arrival: Arrival,
    },
    /// Retention trimmed the journal before `before`: every agent's inbox
    /// entries there go, and each agent remembers the last it lost, so that
    /// a reader behind it is told (see [`inbox_trimmed`]).
    TrimInboxes {
        before: Arrival,
    },
    /// Retention trimmed the journal rows of the received seqs `from..=to`
    /// of the stream whose ids start with `tag`: their message rows go
    /// (`mesh message` no longer knows them either way), and what marks
    /// them (undelivered, superseded).
    TrimMessages {
        tag: [u8; 8],
        from: Seq,
        to: Seq,
    },
}

/// Consecutive envelopes of one stream journaled in a group: seqs
/// `first_seq..first_seq + n` at arrivals `first_arrival..`.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) stream: StreamId,
    pub(crate) first_seq: Seq,
    pub(crate) first_arrival: Arrival,
    pub(crate) n: u64,
}

/// Extends `runs` with the envelope `seq` of `stream` journaled at `arrival`.
pub(crate) fn note_envelope(runs: &mut Vec<Run>, stream: &StreamId, seq: Seq, arrival: Arrival) {
    if let Some(r) = runs.last_mut()
        && r.first_seq + r.n == seq
        && r.first_arrival + r.n == arrival
        && r.stream == *stream
    {
        r.n += 1;
        return;
    }
    runs.push(Run {
        stream: stream.clone(),
        first_seq: seq,
        first_arrival: arrival,
        n: 1,
    });
}

/// The arrival of the envelope `seq` of `stream` among `runs`.
fn arrival_of(runs: &[Run], stream: &StreamId, seq: Seq) -> Option<Arrival> {
    runs.iter()
        .rev()
        .find(|r| r.stream == *stream && seq >= r.first_seq && seq < r.first_seq + r.n)
        .map(|r| r.first_arrival + (seq - r.first_seq))
}

/// Plans `op` given the group's envelope `runs`, its last arrival so far
/// (`last`) and the journal head; the error is the refusal's reason.
pub(crate) fn plan(
    op: AgentOp,
    runs: &[Run],
    last: Option<Arrival>,
    journal_head: Arrival,
    out: &mut Vec<AgentWrite>,
) -> Result<(), String> {
    match op {
        AgentOp::PutAgent(r) => out.push(AgentWrite::PutAgent(r)),
        AgentOp::RemoveAgent(n) => out.push(AgentWrite::RemoveAgent(n)),
        AgentOp::Index { stream, entries } => {
            for e in entries {
                if let AgentIndex::Read {
                    agent,
                    seq,
                    mark,
                    ids,
                } = e
                {
                    // Filtered by the store against the message index
                    // before this (`logic`): what is left is marked.
                    if ids.is_empty() {
                        continue;
                    }
                    let row = InboxRow {
                        kind: InboxKind::Read,
                        verified: true,
                        in_reply_to: None,
                    };
                    out.push(index_write(
                        AgentIndex::Inbox { agent, seq, row },
                        &stream,
                        runs,
                    )?);
                    for id in ids {
                        out.push(AgentWrite::Read {
                            id,
                            mark: mark.clone(),
                        });
                    }
                    continue;
                }
                out.push(index_write(e, &stream, runs)?);
            }
        }
        AgentOp::InboxLast { agent, row } => {
            let arrival = last.ok_or("an inbox entry for a group that journaled nothing")?;
            out.push(AgentWrite::Inbox {
                agent,
                arrival,
                row,
            });
        }
        AgentOp::Bounced { id, reason } => out.push(AgentWrite::Bounced { id, reason }),
        AgentOp::Superseded { id, by } => out.push(AgentWrite::Superseded { id, by }),
        AgentOp::ExpireDedup { before_ms } => out.push(AgentWrite::ExpireDedup { before_ms }),
        AgentOp::ForgetDedup { at_ms, key } => out.push(AgentWrite::ForgetDedup { at_ms, key }),
        AgentOp::PutAlias { alias, node } => {
            check_alias(&alias)?;
            out.push(AgentWrite::Alias { alias, node });
        }
        AgentOp::PutMove(notice) => out.push(AgentWrite::Move(notice)),
        AgentOp::PutCursor {
            agent,
            name,
            arrival,
        } => {
            check_cursor(&agent, &name, arrival, journal_head)?;
            out.push(AgentWrite::Cursor {
                agent,
                name,
                arrival,
            });
        }
    }
    Ok(())
}

/// The write of the index entry `e` of `stream`, at the arrival this group
/// journaled its envelope (found in `runs`); the error is the refusal's reason.
fn index_write(e: AgentIndex, stream: &StreamId, runs: &[Run]) -> Result<AgentWrite, String> {
    let seq = e.seq();
    let arrival = arrival_of(runs, stream, seq).ok_or_else(|| {
        format!("index entry for seq {seq} of {stream:?}, which this group did not journal")
    })?;
    Ok(match e {
        AgentIndex::Forwarded { .. } => {
            return Err("a forwarded entry reached the plan unexpanded".to_owned());
        }
        AgentIndex::Read { .. } => {
            return Err("a read receipt entry reached the plan unexpanded".to_owned());
        }
        AgentIndex::Inbox { agent, row, .. } => AgentWrite::Inbox {
            agent,
            arrival,
            row,
        },
        AgentIndex::Message { id, mut row, .. } => {
            row.arrival = arrival;
            row.stream = stream.clone();
            row.seq = seq;
            AgentWrite::Message { id, row }
        }
        AgentIndex::ForwardTaken { id, .. } => AgentWrite::ForwardTaken { id, arrival },
        AgentIndex::Dedup { mut record, .. } => {
            let len = record.key.client_id.len();
            if len == 0 || len > CLIENT_ID_BYTES_MAX {
                return Err(format!(
                    "a client id of {len} bytes; it must be 1..={CLIENT_ID_BYTES_MAX}"
                ));
            }
            record.arrival = arrival;
            record.stream = stream.clone();
            record.seq = seq;
            AgentWrite::Dedup(record)
        }
    })
}

/// Refuses an alias of 0 or more than [`ALIAS_BYTES_MAX`] bytes.
fn check_alias(alias: &str) -> Result<(), String> {
    if alias.is_empty() || alias.len() > ALIAS_BYTES_MAX {
        return Err(format!(
            "an alias of {} bytes; it must be 1..={ALIAS_BYTES_MAX}",
            alias.len()
        ));
    }
    Ok(())
}

/// Refuses a cursor of `agent` with a name out of bounds or set past the
/// journal head.
fn check_cursor(
    agent: &AgentName,
    name: &str,
    arrival: Arrival,
    journal_head: Arrival,
) -> Result<(), String> {
    let max = crate::CURSOR_NAME_BYTES_MAX;
    if name.is_empty() || name.len() > max {
        return Err(format!(
            "cursor name is {} bytes; it must be 1..={max}",
            name.len()
        ));
    }
    if arrival > journal_head {
        return Err(format!(
            "cursor {name:?} of agent {agent} set to arrival {arrival}, past the journal head {journal_head}"
        ));
    }
    Ok(())
}

/// Where a message is, as the index keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Place {
    pub(crate) dir: MessageDir,
    pub(crate) stream: StreamId,
    pub(crate) seq: Seq,
    pub(crate) arrival: Arrival,
}

impl Place {
    pub(crate) fn of(row: &MessageRow) -> Place {
        Place {
            dir: row.dir,
            stream: row.stream.clone(),
            seq: row.seq,
            arrival: row.arrival,
        }
    }

    /// The message row of the message at this place, whose journal entry
    /// is `record` (its agent message, or the tombstone in its place); the
    /// why of a refusal if that entry is neither.
    pub(crate) fn row(
        self,
        record: &crate::JournalRecord,
        undelivered: Option<BounceReason>,
        superseded_by: Option<MsgId>,
        read: Option<ReadMark>,
    ) -> Result<MessageRow, String> {
        let crate::JournalRecord::Envelope {
            stream,
            seq,
            kind,
            payload,
            ..
        } = record
        else {
            return Err(format!(
                "the message index names arrival {}, not an envelope",
                self.arrival
            ));
        };
        let agent_kind = matches!(
            *kind,
            mesh_protocol::KIND_AGENT | mesh_protocol::KIND_TOMBSTONE | mesh_protocol::KIND_FORWARD
        );
        if *stream != self.stream || *seq != self.seq || !agent_kind {
            return Err(format!(
                "the message index names arrival {}, which holds another envelope",
                self.arrival
            ));
        }
        if *kind == mesh_protocol::KIND_TOMBSTONE {
            let t = mesh_protocol::Tombstone::decode(payload).map_err(|e| {
                format!(
                    "the tombstone at arrival {} does not decode: {e}",
                    self.arrival
                )
            })?;
            let by = match t.reason {
                mesh_protocol::TombstoneReason::Superseded { by } => Some(by),
                _ => None,
            };
            return Ok(MessageRow {
                dir: self.dir,
                stream: self.stream,
                seq: self.seq,
                arrival: self.arrival,
                from: t.from,
                to: t.to,
                in_reply_to: None,
                undelivered,
                superseded_by: by,
                read,
            });
        }
        // A forward's message is the one it carries.
        let forward;
        let payload = if *kind == mesh_protocol::KIND_FORWARD {
            forward = mesh_protocol::Forward::decode(payload).map_err(|e| {
                format!(
                    "the forward at arrival {} does not decode: {e}",
                    self.arrival
                )
            })?;
            &forward.envelope
        } else {
            payload
        };
        let h = mesh_protocol::AgentHeader::decode(payload).map_err(|e| {
            format!(
                "the agent message at arrival {} does not decode: {e}",
                self.arrival
            )
        })?;
        Ok(MessageRow {
            dir: self.dir,
            stream: self.stream,
            seq: self.seq,
            arrival: self.arrival,
            from: h.from,
            to: h.to,
            in_reply_to: h.in_reply_to,
            undelivered,
            superseded_by,
            read,
        })
    }
}

/// The stored form of a dedup key, and its table key with the time first.
pub(crate) fn dedup_key_bytes(key: &DedupKey) -> Vec<u8> {
    postcard::to_stdvec(key).unwrap_or_default()
}

/// Node ids as their 32 bytes in the store's encodings.
pub(crate) mod node_id_bytes {
    use mesh_protocol::NodeId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<S: Serializer>(id: &NodeId, s: S) -> Result<S::Ok, S::Error> {
        id.as_bytes().serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NodeId, D::Error> {
        let bytes = <[u8; 32]>::deserialize(d)?;
        NodeId::from_bytes(&bytes).map_err(serde::de::Error::custom)
    }
}

/// The entry an inbox read after `after` starts with when retention took
/// the agent's entries up to `trimmed_to` (its rows gone with the journal's):
/// one `Trimmed` record naming the arrivals from `after + 1` to there, so
/// the reader never skips them silently.
pub(crate) fn inbox_trimmed(after: Arrival, trimmed_to: Option<Arrival>) -> Option<InboxItem> {
    let to = trimmed_to?;
    (after < to).then(|| InboxItem {
        item: crate::JournalItem {
            arrival: to,
            record: crate::JournalRecord::Trimmed {
                from: after + 1,
                to,
            },
        },
        row: InboxRow {
            kind: InboxKind::Message,
            verified: false,
            in_reply_to: None,
        },
    })
}

/// The entry an inbox row gets in place of one retention trimmed.
pub(crate) fn trimmed(arrival: Arrival) -> crate::JournalItem {
    crate::JournalItem {
        arrival,
        record: crate::JournalRecord::Trimmed {
            from: arrival,
            to: arrival,
        },
    }
}

#[cfg(test)]
mod tests;
