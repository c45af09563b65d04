//! Agents in the core: this node's agents and their cards, the agents each
//! peer announced, the send path of agent messages (their envelope, their
//! id, retried sends), and the receive side's checks, inbox routing and
//! bounces.
//!
//! The store writes what this decides in the same transaction as the
//! envelopes it concerns: an own batch's group carries the message and
//! retried-send records of its agent messages, an accepted batch's group
//! the inbox and message index entries of its envelopes, and a bounce for
//! an agent this node does not host is an own send in the same commit.
//!
//! The send path is in `send`, the receive side in `inbound`, retried
//! sends in `dedup`; this module holds the agent tables and their changes.

mod dedup;
mod inbound;
mod send;
mod supersede;

use std::collections::BTreeMap;

use mesh_protocol::{AgentCard, AgentName, Frame, MAX_AGENT_CARDS, MsgId, NodeId};
use mesh_store::{AgentOp, DedupKey, DedupRecord, StoreError};

use super::commit::WaitingSend;
use super::{BadCards, ConnId, Core, DropReason, LocalWrite, Millis};
use dedup::Dedup;
pub use dedup::{DEDUP_BYTES_MAX, DEDUP_ENTRIES_MAX, DEDUP_WINDOW_MS};

/// What a waiting send carries besides its payload.
#[derive(Debug)]
pub(super) struct Tracked {
    /// For an agent message: its addressing (the payload is then an
    /// encoded [`AgentEnvelope`](mesh_protocol::AgentEnvelope) whose id is
    /// stamped when it is signed).
    pub(super) agent: Option<AgentMsg>,
    /// For a send with a client id: its retried-send record to be.
    pub(super) dedup: Option<DedupMeta>,
}

/// An agent message's addressing, for its message index row.
#[derive(Debug)]
pub(super) struct AgentMsg {
    from: AgentName,
    to: Option<AgentName>,
    in_reply_to: Option<MsgId>,
    /// Its supersede key.
    key: Option<mesh_protocol::SupersedeKey>,
    /// Set when a later send of this commit with the same key replaced it:
    /// its payload is then the tombstone naming that send.
    superseded_by: Option<MsgId>,
    /// The kind and payload the send had before it became a tombstone.
    original: Option<(u16, Vec<u8>)>,
}

/// A first send's retried-send record, before it has a place.
#[derive(Debug)]
pub(super) struct DedupMeta {
    key: DedupKey,
    at_ms: u64,
    digest: [u8; 16],
}

/// A local agent change committed with a [`LocalWrite`].
#[derive(Debug)]
pub(super) enum AgentChange {
    Put(AgentName, NodeId),
    Remove(AgentName),
    Move(mesh_protocol::AgentMove),
}

impl AgentChange {
    /// The change `write` makes to the core's agents, if any.
    pub(super) fn of(write: &LocalWrite) -> Option<AgentChange> {
        match write {
            LocalWrite::PutAgent(r) => Some(AgentChange::Put(r.name.clone(), r.key)),
            LocalWrite::RemoveAgent(n) => Some(AgentChange::Remove(n.clone())),
            LocalWrite::PutMove(m) => Some(AgentChange::Move(m.clone())),
            LocalWrite::EndDrain { agent, .. } => Some(AgentChange::Remove(agent.clone())),
            _ => None,
        }
    }
}

/// This node's agents, its peers' agents, and retried sends.
#[derive(Debug)]
pub(super) struct Agents {
    /// This node's agents, with their current cards once signed.
    local: BTreeMap<AgentName, Option<AgentCard>>,
    /// This node's agents' keys.
    keys: BTreeMap<AgentName, NodeId>,
    /// The agents each peer announced on its last connection.
    peers: BTreeMap<NodeId, BTreeMap<AgentName, AgentCard>>,
    dedup: Dedup,
    /// Bounces for the commit being built (or the next one), apart from
    /// the local sends and their bound: at most one per envelope of the
    /// peer batches in one commit.
    bounces: Vec<WaitingSend>,
    /// Store ops for the next commit that no request waits for.
    housekeeping: Vec<AgentOp>,
    /// The last time retried-send records were expired.
    expired_at: Millis,
    /// The newest keyed message committed in this process's life per
    /// peer and slot, which a later one with the same key may replace.
    keyed: supersede::Keyed,
}

impl Agents {
    pub(super) fn new(
        agents: Vec<mesh_store::AgentRecord>,
        dedup: Vec<DedupRecord>,
        superseded: &[(MsgId, MsgId)],
    ) -> Agents {
        Agents {
            keys: agents.iter().map(|r| (r.name.clone(), r.key)).collect(),
            local: agents.into_iter().map(|r| (r.name, None)).collect(),
            peers: BTreeMap::new(),
            dedup: Dedup::recover(dedup, superseded),
            bounces: Vec::new(),
            housekeeping: Vec::new(),
            expired_at: Millis(0),
            keyed: supersede::Keyed::default(),
        }
    }

    /// Whether `name` is an agent of this node.
    pub(super) fn is_local(&self, name: &AgentName) -> bool {
        self.local.contains_key(name)
    }

    /// Whether `name` is an agent of this node with the key `key`.
    pub(super) fn has(&self, name: &AgentName, key: &NodeId) -> bool {
        self.keys.get(name) == Some(key)
    }

    /// The key of this node's agent `name`.
    pub(super) fn key_of(&self, name: &AgentName) -> Option<&NodeId> {
        self.keys.get(name)
    }

    /// Whether an agent of this node has the key `key`.
    pub(super) fn has_key(&self, key: &NodeId) -> bool {
        self.keys.values().any(|k| k == key)
    }

    /// This node's agents' cards, by name.
    pub(super) fn local_cards(&self) -> Vec<AgentCard> {
        self.local.values().flatten().cloned().collect()
    }

    /// The cards `peer` announced.
    pub(super) fn peer_cards(&self, peer: NodeId) -> Vec<AgentCard> {
        self.peers
            .get(&peer)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The local agents' count.
    pub(super) fn len(&self) -> usize {
        self.local.len()
    }

    /// Forgets the cards of the local agents whose key is in `keys` (they
    /// moved away); returns whether any was held.
    pub(super) fn forget_cards_of(&mut self, keys: &[NodeId]) -> bool {
        let mut any = false;
        for slot in self.local.values_mut() {
            if slot.as_ref().is_some_and(|c| keys.contains(&c.key)) {
                *slot = None;
                any = true;
            }
        }
        any
    }

    /// Queues store ops for the next commit that no request waits for.
    pub(super) fn push_housekeeping(&mut self, op: AgentOp) {
        self.housekeeping.push(op);
    }

    /// The frame announcing this node's agents (those with a card), if it
    /// hosts any.
    pub(super) fn frame(&self) -> Option<Frame> {
        (!self.local.is_empty()).then(|| Frame::Agents {
            cards: self.local_cards(),
        })
    }
}

impl Core {
    /// A local write that adds or removes an agent: refused past
    /// [`MAX_AGENT_CARDS`] agents.
    pub(super) fn check_agent_write(&self, write: &LocalWrite) -> Result<(), StoreError> {
        if let LocalWrite::PutAgent(r) = write
            && !self.agents.is_local(&r.name)
            && self.agents.len() >= MAX_AGENT_CARDS
        {
            return Err(StoreError::Conflict(format!(
                "this node hosts {MAX_AGENT_CARDS} agents, as many as it may"
            )));
        }
        Ok(())
    }

    /// A committed agent change takes effect and is announced.
    pub(super) fn on_agent_change(&mut self, change: AgentChange) {
        match change {
            AgentChange::Put(name, key) => {
                self.agents.keys.insert(name.clone(), key);
                self.agents.local.entry(name).or_insert(None);
            }
            AgentChange::Remove(name) => {
                self.agents.keys.remove(&name);
                self.agents.local.remove(&name);
                self.announce_all();
            }
            AgentChange::Move(notice) => self.on_local_move(notice),
        }
    }

    /// A newly signed card of a local agent.
    pub(super) fn on_agent_card(&mut self, card: AgentCard) {
        if card.node != self.me {
            return;
        }
        let Some(slot) = self.agents.local.get_mut(&card.name) else {
            return;
        };
        if slot.as_ref().is_some_and(|c| c.issued_ms > card.issued_ms) {
            return;
        }
        // It moved away: its card is no longer this node's to announce.
        if self.moves.get(&card.key).is_some_and(|m| m.node != self.me) {
            return;
        }
        *slot = Some(card);
        self.announce_all();
    }

    /// An `Agents` frame from `peer`: it replaces what `peer` announced.
    pub(super) fn on_agents(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        cards: Result<Vec<AgentCard>, BadCards>,
    ) {
        if self.peers.live_conn(peer) != Some(conn) {
            self.out.drop(DropReason::StaleConnection);
            return;
        }
        self.out.metrics.frames_in.agents += 1;
        if self.peers.peer_epoch(peer).is_none() {
            self.out.drop(DropReason::BeforeHello);
            return;
        }
        let cards = match cards {
            Ok(cards) if cards.iter().all(|c| c.node == peer) => cards,
            _ => {
                self.out.metrics.agents.cards_refused += 1;
                return;
            }
        };
        self.vouch_cards(peer, &cards);
        let mut known: BTreeMap<AgentName, AgentCard> = BTreeMap::new();
        for c in cards {
            if known
                .get(&c.name)
                .is_none_or(|k| k.issued_ms <= c.issued_ms)
            {
                known.insert(c.name.clone(), c);
            }
        }
        self.agents.peers.insert(peer, known);
    }

    /// A peer's new connection: what it announced before is replaced by
    /// what it announces on this one (nothing, if it hosts no agents).
    pub(super) fn forget_peer_agents(&mut self, peer: NodeId) {
        self.agents.peers.remove(&peer);
    }

    /// Announces this node's agents on `peer`'s new live connection.
    pub(super) fn announce_to(&mut self, peer: NodeId, conn: ConnId) {
        if let Some(frame) = self.agents.frame() {
            self.out.send(peer, conn, frame);
        }
    }

    /// Announces this node's agents on every live connection.
    pub(super) fn announce_all(&mut self) {
        let cards = self.agents.local_cards();
        for (peer, conn) in self.peers.live() {
            self.out.send(
                peer,
                conn,
                Frame::Agents {
                    cards: cards.clone(),
                },
            );
        }
    }
}
