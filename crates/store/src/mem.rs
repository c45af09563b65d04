//! The in-memory store: the same rules as [`crate::RedbStore`], kept in
//! ordered maps behind one mutex. For the simulator and unit tests.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use mesh_protocol::{
    AgentName, Epoch, InviteId, Mark, MsgId, NodeCard, NodeId, Seq, SignedBatch, StreamId,
};

use crate::agents::{AgentWrite, dedup_key_bytes};
use crate::logic::{self, Base, BatchMeta, Fail, TxCounters, Write};
use crate::{
    AgentRecord, Arrival, DedupRecord, InboxItem, InboxRow, InviteRecord, JournalItem,
    JournalRecord, MeshStore, MessageRow, OwnStream, PeerRecord, Receipt, SCHEMA_VERSION,
    StoreError, StoreMeta, StoredBatch, WriteOp,
};

/// The committed state of a [`MemStore`].
#[derive(Clone, Debug, Default)]
struct State {
    own: BTreeMap<StreamId, OwnStream>,
    /// Own batches and the arrival of their first envelope, whose payloads
    /// are read back from the journal as on disk.
    outbox: BTreeMap<(StreamId, Seq), (SignedBatch, Arrival)>,
    marks: BTreeMap<StreamId, Seq>,
    journal: BTreeMap<Arrival, JournalRecord>,
    peers: BTreeMap<[u8; 32], PeerRecord>,
    cards: BTreeMap<[u8; 32], NodeCard>,
    invites: BTreeMap<InviteId, InviteRecord>,
    cursors: BTreeMap<String, Arrival>,
    max_lamport: u64,
    /// While set, every commit fails as a disk would (see [`MemStore::set_unavailable`]).
    unavailable: bool,
    agents: Agents,
}

/// The agent tables of a [`MemStore`].
#[derive(Clone, Debug, Default)]
struct Agents {
    agents: BTreeMap<AgentName, AgentRecord>,
    inbox: BTreeMap<(AgentName, Arrival), InboxRow>,
    /// Where each indexed message is (its content is the journal's).
    messages: BTreeMap<MsgId, crate::agents::Place>,
    /// Messages not delivered, and why.
    undelivered: BTreeMap<MsgId, mesh_protocol::BounceReason>,
    /// By (time taken, encoded key), as on disk.
    dedup: BTreeMap<(u64, Vec<u8>), DedupRecord>,
    aliases: BTreeMap<String, NodeId>,
    cursors: BTreeMap<(AgentName, String), Arrival>,
}

impl Agents {
    fn apply(&mut self, w: AgentWrite) {
        match w {
            AgentWrite::PutAgent(r) => {
                self.agents.insert(r.name.clone(), r);
            }
            AgentWrite::RemoveAgent(name) => {
                self.agents.remove(&name);
                self.inbox.retain(|(a, _), _| *a != name);
                self.cursors.retain(|(a, _), _| *a != name);
            }
            AgentWrite::Inbox {
                agent,
                arrival,
                row,
            } => {
                self.inbox.insert((agent, arrival), row);
            }
            AgentWrite::Message { id, row } => {
                if let Some(reason) = row.undelivered {
                    self.undelivered.insert(id, reason);
                }
                self.messages.insert(id, crate::agents::Place::of(&row));
            }
            AgentWrite::Bounced { id, reason } => {
                self.undelivered.insert(id, reason);
            }
            AgentWrite::Dedup(r) => {
                self.dedup.insert((r.at_ms, dedup_key_bytes(&r.key)), r);
            }
            AgentWrite::ExpireDedup { before_ms } => {
                self.dedup.retain(|(at, _), _| *at >= before_ms);
            }
            AgentWrite::ForgetDedup { at_ms, key } => {
                self.dedup.remove(&(at_ms, dedup_key_bytes(&key)));
            }
            AgentWrite::Alias { alias, node } => match node {
                Some(n) => {
                    self.aliases.insert(alias, n);
                }
                None => {
                    self.aliases.remove(&alias);
                }
            },
            AgentWrite::Cursor {
                agent,
                name,
                arrival,
            } => {
                self.cursors.insert((agent, name), arrival);
            }
        }
    }
}

/// An in-memory [`MeshStore`] with exactly the rules of the on-disk store.
///
/// Everything `commit` accepted survives as long as the object does; a
/// simulated crash keeps the object and drops only what was never passed to
/// `commit`. [`MemStore::set_unavailable`] simulates a failing disk.
#[derive(Debug)]
pub struct MemStore {
    epoch: Epoch,
    state: Mutex<State>,
}

struct MemBase<'a> {
    epoch: Epoch,
    state: &'a State,
}

impl Base for MemBase<'_> {
    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn name(&self) -> &str {
        "in-memory store"
    }

    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, StoreError> {
        Ok(self.state.own.get(stream).cloned())
    }

    fn batch_meta(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<BatchMeta>, StoreError> {
        Ok(self
            .state
            .outbox
            .get(&(stream.clone(), first_seq))
            .map(|(b, _)| BatchMeta::of(b)))
    }

    fn mark(&mut self, stream: &StreamId) -> Result<Option<Seq>, StoreError> {
        Ok(self.state.marks.get(stream).copied())
    }
}

impl State {
    fn apply(&mut self, writes: Vec<Write>) {
        for w in writes {
            match w {
                Write::OwnStream(o) => {
                    self.own.insert(o.stream.clone(), o);
                }
                Write::PutBatch {
                    first_seq,
                    batch,
                    first_arrival,
                } => {
                    let stream = StreamId {
                        author: batch.author,
                        epoch: batch.epoch,
                        channel: batch.channel.clone(),
                    };
                    self.outbox
                        .insert((stream, first_seq), (batch, first_arrival));
                }
                Write::DelBatch { stream, first_seq } => {
                    self.outbox.remove(&(stream, first_seq));
                }
                Write::Mark { stream, seq } => {
                    self.marks.insert(stream, seq);
                }
                Write::Journal { arrival, record } => {
                    self.journal.insert(arrival, record);
                }
                Write::PutPeer(p) => {
                    self.peers.insert(*p.node.as_bytes(), p);
                }
                Write::RemovePeer(n) => {
                    self.peers.remove(n.as_bytes());
                    self.cards.remove(n.as_bytes());
                }
                Write::Cursor { name, arrival } => {
                    self.cursors.insert(name, arrival);
                }
                Write::PutCard(card) => {
                    self.cards.insert(*card.node.as_bytes(), card);
                }
                Write::PutInvite(invite) => {
                    self.invites.insert(invite.id, invite);
                }
                Write::Agents(w) => self.agents.apply(w),
            }
        }
    }

    fn journal_head(&self) -> Arrival {
        self.journal.last_key_value().map_or(0, |(k, _)| *k)
    }
}

impl MemStore {
    /// An empty store of `epoch`.
    pub fn new(epoch: Epoch) -> Self {
        MemStore {
            epoch,
            state: Mutex::new(State::default()),
        }
    }

    /// While `unavailable`, every commit fails with [`StoreError::Unavailable`]
    /// for every group and writes nothing, as a failing disk would. Reads still work.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.lock().unavailable = unavailable;
    }

    /// A new store holding a copy of this one's committed state (same epoch).
    pub fn fork(&self) -> MemStore {
        MemStore {
            epoch: self.epoch,
            state: Mutex::new(self.lock().clone()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held cannot leave the state half-written:
        // writes are applied only after a group has been fully planned.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl MeshStore for MemStore {
    fn meta(&self) -> StoreMeta {
        StoreMeta {
            epoch: self.epoch,
            schema_version: SCHEMA_VERSION,
        }
    }

    fn commit(&self, groups: Vec<Vec<WriteOp>>) -> Vec<Result<Receipt, StoreError>> {
        let mut state = self.lock();
        if state.unavailable {
            return groups
                .iter()
                .map(|_| {
                    Err(StoreError::Unavailable(
                        "the store is marked unavailable".into(),
                    ))
                })
                .collect();
        }
        let mut counters = TxCounters {
            journal_head: state.journal_head(),
            max_lamport: state.max_lamport,
        };
        // Reads of the maps cannot fail, so no group here is ever `Fail::Fatal`.
        let mut out = Vec::with_capacity(groups.len());
        for ops in groups {
            let planned = {
                let mut base = MemBase {
                    epoch: self.epoch,
                    state: &state,
                };
                logic::plan_group(&mut base, &mut counters, ops)
            };
            match planned {
                Ok(plan) => {
                    state.apply(plan.writes);
                    out.push(Ok(plan.receipt));
                }
                Err(Fail::Refused(e) | Fail::Fatal(e)) => out.push(Err(e)),
            }
        }
        state.max_lamport = counters.max_lamport;
        out
    }

    fn own_streams(&self) -> Result<Vec<OwnStream>, StoreError> {
        Ok(self.lock().own.values().cloned().collect())
    }

    fn marks(&self) -> Result<Vec<Mark>, StoreError> {
        Ok(self
            .lock()
            .marks
            .iter()
            .map(|(s, seq)| Mark {
                stream: s.clone(),
                seq: *seq,
            })
            .collect())
    }

    fn read_outbox(
        &self,
        stream: &StreamId,
        after: Seq,
        max_bytes: u64,
    ) -> Result<Vec<StoredBatch>, StoreError> {
        let state = self.lock();
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let lo = (stream.clone(), 0);
        let hi = (stream.clone(), next);
        // The batch holding `next` starts at or before it; later ones start after it.
        let first = state.outbox.range(lo..=hi.clone()).next_back();
        let rest = state
            .outbox
            .range((std::ops::Bound::Excluded(hi), std::ops::Bound::Unbounded));
        let candidates = first
            .into_iter()
            .chain(rest)
            .take_while(|((s, _), _)| s == stream)
            .map(|(_, b)| Ok(b));
        gather(candidates, |(b, _)| b, after, max_bytes)?
            .into_iter()
            .map(|(batch, first_arrival)| {
                let payloads = (0..batch.entries.len() as u64)
                    .map(|i| match state.journal.get(&(first_arrival + i)) {
                        Some(JournalRecord::Envelope {
                            stream: s,
                            seq,
                            payload,
                            ..
                        }) if s == stream && *seq == batch.first_seq + i => Ok(payload.clone()),
                        _ => Err(StoreError::Corrupt {
                            path: "in-memory store".into(),
                            why: format!(
                                "outbox batch {stream:?} at {} has no journal envelope at arrival {}",
                                batch.first_seq,
                                first_arrival + i
                            ),
                        }),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(StoredBatch {
                    batch: batch.clone(),
                    payloads,
                })
            })
            .collect()
    }

    fn journal(&self, after: Arrival, limit: usize) -> Result<Vec<JournalItem>, StoreError> {
        let state = self.lock();
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        Ok(state
            .journal
            .range(next..)
            .take(limit)
            .map(|(a, r)| JournalItem {
                arrival: *a,
                record: r.clone(),
            })
            .collect())
    }

    fn journal_head(&self) -> Result<Arrival, StoreError> {
        Ok(self.lock().journal_head())
    }

    fn peers(&self) -> Result<Vec<PeerRecord>, StoreError> {
        Ok(self.lock().peers.values().cloned().collect())
    }

    fn cards(&self) -> Result<Vec<NodeCard>, StoreError> {
        Ok(self.lock().cards.values().cloned().collect())
    }

    fn invites(&self) -> Result<Vec<InviteRecord>, StoreError> {
        Ok(self.lock().invites.values().cloned().collect())
    }

    fn invite(&self, id: &InviteId) -> Result<Option<InviteRecord>, StoreError> {
        Ok(self.lock().invites.get(id).cloned())
    }

    fn cursor(&self, name: &str) -> Result<Option<Arrival>, StoreError> {
        Ok(self.lock().cursors.get(name).copied())
    }

    fn max_lamport(&self) -> Result<u64, StoreError> {
        Ok(self.lock().max_lamport)
    }

    fn agents(&self) -> Result<Vec<AgentRecord>, StoreError> {
        Ok(self.lock().agents.agents.values().cloned().collect())
    }

    fn inbox(
        &self,
        agent: &AgentName,
        after: Arrival,
        limit: usize,
    ) -> Result<Vec<InboxItem>, StoreError> {
        let state = self.lock();
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let lo = (agent.clone(), next);
        let hi = (agent.clone(), Arrival::MAX);
        state
            .agents
            .inbox
            .range(lo..=hi)
            .take(limit)
            .map(|((_, arrival), row)| {
                let record =
                    state
                        .journal
                        .get(arrival)
                        .cloned()
                        .ok_or_else(|| StoreError::Corrupt {
                            path: "in-memory store".into(),
                            why: format!(
                                "inbox of {agent} names arrival {arrival}, not in the journal"
                            ),
                        })?;
                Ok(InboxItem {
                    item: JournalItem {
                        arrival: *arrival,
                        record,
                    },
                    row: *row,
                })
            })
            .collect()
    }

    fn message(&self, id: &MsgId) -> Result<Option<MessageRow>, StoreError> {
        let state = self.lock();
        let Some(place) = state.agents.messages.get(id).cloned() else {
            return Ok(None);
        };
        let corrupt = |why: String| StoreError::Corrupt {
            path: "in-memory store".into(),
            why,
        };
        let record = state
            .journal
            .get(&place.arrival)
            .ok_or_else(|| corrupt(format!("no journal entry at {}", place.arrival)))?;
        let undelivered = state.agents.undelivered.get(id).copied();
        place.row(record, undelivered).map(Some).map_err(corrupt)
    }

    fn dedup(&self) -> Result<Vec<DedupRecord>, StoreError> {
        Ok(self.lock().agents.dedup.values().cloned().collect())
    }

    fn aliases(&self) -> Result<Vec<(String, NodeId)>, StoreError> {
        Ok(self
            .lock()
            .agents
            .aliases
            .iter()
            .map(|(a, n)| (a.clone(), *n))
            .collect())
    }

    fn agent_cursor(&self, agent: &AgentName, name: &str) -> Result<Option<Arrival>, StoreError> {
        Ok(self
            .lock()
            .agents
            .cursors
            .get(&(agent.clone(), name.to_owned()))
            .copied())
    }
}

/// Applies the `read_outbox` rule to batches of one stream in seq order,
/// starting with the one that may hold `after + 1`; `batch` reaches the
/// signed batch of an item.
pub(crate) fn gather<T>(
    batches: impl Iterator<Item = Result<T, StoreError>>,
    batch: impl Fn(&T) -> &SignedBatch,
    after: Seq,
    max_bytes: u64,
) -> Result<Vec<T>, StoreError> {
    let mut out = Vec::new();
    let mut total = 0u64;
    for b in batches {
        let b = b?;
        let signed = batch(&b);
        if signed.last_seq() <= after {
            continue;
        }
        let bytes = BatchMeta::of(signed).bytes;
        if !out.is_empty() && total.saturating_add(bytes) > max_bytes {
            break;
        }
        total = total.saturating_add(bytes);
        out.push(b);
    }
    Ok(out)
}
