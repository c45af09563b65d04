//! The in-memory store: the same rules as [`crate::RedbStore`], kept in
//! ordered maps behind one mutex. For the simulator and unit tests.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use mesh_protocol::{
    AgentName, Cid, Epoch, InviteId, Mark, MsgId, NodeCard, NodeId, Seq, SignedBatch, StreamId,
};

use crate::logic::{self, BatchMeta, Fail, JOURNAL_TIME_STEP_MS};
use crate::{
    AgentRecord, Arrival, DedupRecord, EndedOwn, InboxItem, InboxRow, InviteRecord, JournalBounds,
    JournalItem, JournalRecord, MeshStore, MessageRow, OwnStream, PeerRecord, Receipt,
    SCHEMA_VERSION, StoreError, StoreMeta, StoredBatch, WriteOp,
};

mod write;

use write::MemBase;

/// The committed state of a [`MemStore`].
#[derive(Clone, Debug)]
struct State {
    epoch: Epoch,
    own: BTreeMap<StreamId, OwnStream>,
    /// Own batches and the arrival of their first envelope, whose payloads
    /// are read back from the journal as on disk (unless kept in `payloads`).
    outbox: BTreeMap<(StreamId, Seq), (SignedBatch, Arrival)>,
    /// Payloads the outbox keeps itself (their journal entries are trimmed,
    /// or were never written).
    payloads: BTreeMap<(StreamId, Seq), Vec<Vec<u8>>>,
    marks: BTreeMap<StreamId, Seq>,
    mark_cids: BTreeMap<StreamId, Cid>,
    journal: BTreeMap<Arrival, JournalRecord>,
    /// The first retained arrival.
    journal_first: Arrival,
    /// The last arrival ever written (it stays when everything is trimmed).
    journal_head: Arrival,
    journal_bytes: u64,
    /// Dated journal positions: the first arrival of a commit, its time.
    times: BTreeMap<Arrival, u64>,
    last_write_ms: u64,
    peers: BTreeMap<[u8; 32], PeerRecord>,
    cards: BTreeMap<[u8; 32], NodeCard>,
    invites: BTreeMap<InviteId, InviteRecord>,
    topics: BTreeMap<mesh_protocol::TopicName, crate::TopicRecord>,
    cursors: BTreeMap<String, Arrival>,
    ended: BTreeMap<StreamId, EndedOwn>,
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
    /// Sent messages superseded before they were sent, and by what.
    superseded: BTreeMap<MsgId, MsgId>,
    /// Sent messages their reader's receipt said were read.
    read: BTreeMap<MsgId, crate::ReadMark>,
    /// Forwards taken into an inbox while the index had their message.
    forwards: BTreeMap<MsgId, Arrival>,
    /// By (time taken, encoded key), as on disk.
    dedup: BTreeMap<(u64, Vec<u8>), DedupRecord>,
    aliases: BTreeMap<String, NodeId>,
    /// Agents' move notices, by agent key.
    moves: BTreeMap<NodeId, mesh_protocol::AgentMove>,
    cursors: BTreeMap<(AgentName, String), Arrival>,
    /// The last inbox entry of each agent that retention took.
    trimmed: BTreeMap<AgentName, Arrival>,
}

/// The bytes a journal record is counted as in memory: its payload or
/// text and a fixed overhead (the disk store counts its rows' real bytes).
pub(crate) fn record_bytes(r: &JournalRecord) -> u64 {
    const OVERHEAD_BYTES: u64 = 64;
    record_text_bytes(r) + OVERHEAD_BYTES
}

/// The payload or text bytes of a journal record, as a page's byte bound counts them.
pub(crate) fn record_text_bytes(r: &JournalRecord) -> u64 {
    let body = match r {
        JournalRecord::Envelope { payload, .. } => payload.len(),
        JournalRecord::Loss { detail, .. }
        | JournalRecord::SendsLost { detail, .. }
        | JournalRecord::DrainEnded { detail, .. }
        | JournalRecord::RolledBack { detail, .. } => detail.len(),
        JournalRecord::SubscriberLagged { subscriber, .. } => subscriber.len(),
        _ => 0,
    };
    body as u64
}

/// An in-memory [`MeshStore`] with exactly the rules of the on-disk store.
///
/// Everything `commit` accepted survives as long as the object does; a
/// simulated crash keeps the object and drops only what was never passed to
/// `commit`. [`MemStore::set_unavailable`] simulates a failing disk.
#[derive(Debug)]
pub struct MemStore {
    state: Mutex<State>,
}

impl State {
    fn new(epoch: Epoch) -> State {
        State {
            epoch,
            own: BTreeMap::new(),
            outbox: BTreeMap::new(),
            payloads: BTreeMap::new(),
            marks: BTreeMap::new(),
            mark_cids: BTreeMap::new(),
            journal: BTreeMap::new(),
            journal_first: 1,
            journal_head: 0,
            journal_bytes: 0,
            times: BTreeMap::new(),
            last_write_ms: 0,
            peers: BTreeMap::new(),
            cards: BTreeMap::new(),
            invites: BTreeMap::new(),
            topics: BTreeMap::new(),
            cursors: BTreeMap::new(),
            agents: Agents::default(),
            ended: BTreeMap::new(),
            max_lamport: 0,
            unavailable: false,
        }
    }
}

impl MemStore {
    /// An empty store of `epoch`.
    pub fn new(epoch: Epoch) -> Self {
        MemStore {
            state: Mutex::new(State::new(epoch)),
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
            epoch: self.lock().epoch,
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
        let before = state.counters();
        let mut counters = before;
        // Reads of the maps cannot fail, so no group here is ever `Fail::Fatal`.
        let mut out = Vec::with_capacity(groups.len());
        for ops in groups {
            let planned = {
                let mut base = MemBase { state: &state };
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
        state.journal_first = counters.journal_first;
        // The trims took their rows off; the journal writes added theirs.
        let added = state.journal_bytes - before.journal_bytes;
        state.journal_bytes = counters.journal_bytes + added;
        state.epoch = counters.epoch;
        if let Some(now) = counters.now_ms
            && state.journal_head > before.journal_head
        {
            let first = before.journal_head + 1;
            let dated = state.times.last_key_value().map(|(_, t)| *t);
            if dated.is_none_or(|t| now >= t.saturating_add(JOURNAL_TIME_STEP_MS)) {
                state.times.insert(first, now);
            }
            state.last_write_ms = now;
        }
        out
    }

    fn own_streams(&self) -> Result<Vec<OwnStream>, StoreError> {
        Ok(self.lock().own.values().cloned().collect())
    }

    fn marks(&self) -> Result<Vec<Mark>, StoreError> {
        let state = self.lock();
        Ok(state
            .marks
            .iter()
            .map(|(s, seq)| Mark {
                stream: s.clone(),
                seq: *seq,
                cid: state.mark_cids.get(s).copied(),
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
                if let Some(p) = state.payloads.get(&(stream.clone(), batch.first_seq)) {
                    return Ok(StoredBatch {
                        batch: batch.clone(),
                        payloads: p.clone(),
                    });
                }
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

    fn journal_page(
        &self,
        after: Arrival,
        limit: usize,
        max_bytes: u64,
    ) -> Result<Vec<JournalItem>, StoreError> {
        let state = self.lock();
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut out: Vec<_> = journal_trimmed(next, state.journal_first)
            .into_iter()
            .collect();
        let mut bytes = 0u64;
        for (a, r) in state.journal.range(next..) {
            if out.len() >= limit || (!out.is_empty() && bytes >= max_bytes) {
                break;
            }
            bytes += record_text_bytes(r);
            out.push(JournalItem {
                arrival: *a,
                record: r.clone(),
            });
        }
        Ok(out)
    }

    fn journal_bounds(&self) -> Result<JournalBounds, StoreError> {
        let state = self.lock();
        Ok(JournalBounds {
            first: state.journal_first,
            head: state.journal_head,
            bytes: state.journal_bytes,
        })
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

    fn topics(&self) -> Result<Vec<crate::TopicRecord>, StoreError> {
        Ok(self.lock().topics.values().cloned().collect())
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
        let trimmed = crate::agents::inbox_trimmed(after, state.agents.trimmed.get(agent).copied())
            .filter(|_| limit > 0);
        let rest = limit.saturating_sub(usize::from(trimmed.is_some()));
        let rows = state
            .agents
            .inbox
            .range(lo..=hi)
            .take(rest)
            .map(|((_, arrival), row)| {
                if *arrival < state.journal_first {
                    return Ok(InboxItem {
                        item: crate::agents::trimmed(*arrival),
                        row: *row,
                    });
                }
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
            });
        trimmed.into_iter().map(Ok).chain(rows).collect()
    }

    fn message(&self, id: &MsgId) -> Result<Option<MessageRow>, StoreError> {
        let state = self.lock();
        let Some(place) = state.agents.messages.get(id).cloned() else {
            return Ok(None);
        };
        if place.arrival < state.journal_first {
            return Ok(None);
        }
        let corrupt = |why: String| StoreError::Corrupt {
            path: "in-memory store".into(),
            why,
        };
        let record = state
            .journal
            .get(&place.arrival)
            .ok_or_else(|| corrupt(format!("no journal entry at {}", place.arrival)))?;
        let undelivered = state.agents.undelivered.get(id).copied();
        let superseded = state.agents.superseded.get(id).copied();
        let read = state.agents.read.get(id).cloned();
        place
            .row(record, undelivered, superseded, read)
            .map(Some)
            .map_err(corrupt)
    }

    fn dedup(&self) -> Result<Vec<DedupRecord>, StoreError> {
        Ok(self.lock().agents.dedup.values().cloned().collect())
    }

    fn moves(&self) -> Result<Vec<mesh_protocol::AgentMove>, StoreError> {
        Ok(self.lock().agents.moves.values().cloned().collect())
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

    fn ended_own(&self) -> Result<Vec<EndedOwn>, StoreError> {
        Ok(self.lock().ended.values().cloned().collect())
    }
}

/// The item a journal page read from `next` starts with when retention
/// took the arrivals before `first` (the oldest held): one `Trimmed`
/// record naming `next` to `first - 1`, so the reader never skips them
/// silently.
pub(crate) fn journal_trimmed(next: Arrival, first: Arrival) -> Option<JournalItem> {
    (next < first).then(|| JournalItem {
        arrival: first - 1,
        record: JournalRecord::Trimmed {
            from: next,
            to: first - 1,
        },
    })
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
