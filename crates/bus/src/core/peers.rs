//! The peer table: who this node talks to, and the phase of each live
//! connection.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{Epoch, NodeCard, NodeId};
use mesh_store::PeerRecord;

use super::{CARD_ANSWER_WINDOW_MS, CARD_ANSWERS_MAX, CARD_QUERIES_MAX, Config, ConnId, Millis};

/// A peer added (or its addresses changed) or removed, to be committed.
#[derive(Clone, Debug)]
pub(super) enum PeerChange {
    /// Add or update; the epoch is the core's, taken when the commit is built.
    Put(PeerRecord),
    Remove(NodeId),
}

impl PeerChange {
    pub(super) fn node(&self) -> NodeId {
        match self {
            PeerChange::Put(r) => r.node,
            PeerChange::Remove(n) => *n,
        }
    }
}

/// How far a connection has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Our Hello went out `attempts` times, last at `sent_at`; the peer's has
    /// not come yet, so nothing but a Hello is taken from it.
    AwaitingHello { sent_at: Millis, attempts: u32 },
    /// The peer's Hello came, announcing its store epoch.
    Live { peer_epoch: Epoch },
}

/// A known peer.
#[derive(Debug)]
struct Peer {
    /// As committed.
    record: PeerRecord,
    /// The newest store epoch the peer announced (committed or not yet).
    epoch_seen: Option<Epoch>,
    /// The live connection and its phase.
    conn: Option<(ConnId, Phase)>,
    /// Its newest card, as committed.
    card: Option<NodeCard>,
    /// While it has no connection: when to ask the connected peers for its
    /// newest card next.
    ask_at: Option<Millis>,
    /// Card queries sent to it on its live connection and not answered
    /// yet: about which node, sent when (at most [`CARD_QUERIES_MAX`]).
    asked: BTreeMap<NodeId, Millis>,
    /// Card queries it sent on its live connection that were answered in
    /// the window starting at the first: (start, count).
    answered: (Millis, u32),
}

impl Peer {
    fn new(record: PeerRecord) -> Peer {
        Peer {
            epoch_seen: record.epoch,
            record,
            conn: None,
            card: None,
            ask_at: None,
            asked: BTreeMap::new(),
            answered: (Millis(0), 0),
        }
    }
}

/// What a due Hello timer asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HelloStep {
    /// Send the Hello again on `conn`.
    Resend(ConnId),
    /// Every attempt went unanswered: close `conn`.
    GiveUp(ConnId, u32),
}

/// The known peers and their connections.
///
/// Invariant: this node is never its own peer.
#[derive(Debug)]
pub(super) struct Peers {
    me: NodeId,
    table: BTreeMap<NodeId, Peer>,
    /// Peers whose connection phase changed since [`Peers::take_touched`].
    touched: BTreeSet<NodeId>,
}

impl Peers {
    /// The committed peers of node `me` (a record of `me` itself is ignored).
    pub(super) fn new(me: NodeId, records: Vec<PeerRecord>) -> Peers {
        let table: BTreeMap<NodeId, Peer> = records
            .into_iter()
            .filter(|r| r.node != me)
            .map(|record| (record.node, Peer::new(record)))
            .collect();
        Peers {
            me,
            // The first turn schedules a card query for each (see `ensure_ask`).
            touched: table.keys().copied().collect(),
            table,
        }
    }

    /// Sets the committed cards of known peers (others are ignored).
    pub(super) fn load_cards(&mut self, cards: Vec<NodeCard>) {
        for card in cards {
            if let Some(p) = self.table.get_mut(&card.node) {
                p.card = Some(card);
            }
        }
    }

    /// Every peer's id.
    pub(super) fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.table.keys().copied()
    }

    pub(super) fn is_peer(&self, node: NodeId) -> bool {
        self.table.contains_key(&node)
    }

    /// The peer's committed record.
    pub(super) fn record(&self, node: NodeId) -> Option<&PeerRecord> {
        self.table.get(&node).map(|p| &p.record)
    }

    /// The newest store epoch the peer announced, committed or not.
    pub(super) fn epoch_seen(&self, node: NodeId) -> Option<Epoch> {
        self.table.get(&node)?.epoch_seen
    }

    /// The live connection to `peer`, in any phase.
    pub(super) fn live_conn(&self, peer: NodeId) -> Option<ConnId> {
        self.table.get(&peer)?.conn.map(|(id, _)| id)
    }

    /// The epoch `peer` announced on its live connection, once it has.
    pub(super) fn peer_epoch(&self, peer: NodeId) -> Option<Epoch> {
        match self.table.get(&peer)?.conn? {
            (_, Phase::Live { peer_epoch }) => Some(peer_epoch),
            (_, Phase::AwaitingHello { .. }) => None,
        }
    }

    /// A new connection to `peer`, whose first Hello we send now.
    pub(super) fn open(&mut self, peer: NodeId, conn: ConnId, now: Millis) {
        if let Some(p) = self.table.get_mut(&peer) {
            let phase = Phase::AwaitingHello {
                sent_at: now,
                attempts: 1,
            };
            p.conn = Some((conn, phase));
            self.touched.insert(peer);
        }
    }

    /// Forgets the peer's connection, if it has one, and the card queries
    /// on it.
    pub(super) fn close(&mut self, peer: NodeId) {
        if let Some(p) = self.table.get_mut(&peer) {
            p.asked.clear();
            p.answered = (Millis(0), 0);
            if p.conn.take().is_some() {
                self.touched.insert(peer);
            }
        }
    }

    /// The peer's newest committed card.
    pub(super) fn card(&self, node: NodeId) -> Option<&NodeCard> {
        self.table.get(&node)?.card.as_ref()
    }

    /// The peer's card is committed, with its addresses as the peer's (if
    /// it has any): it is the one held now.
    pub(super) fn set_card(&mut self, card: NodeCard) {
        if let Some(p) = self.table.get_mut(&card.node)
            && p.card.as_ref().is_none_or(|c| card.is_newer_than(c))
        {
            if !card.addrs.is_empty() {
                p.record.addrs = card.addrs.clone();
            }
            p.card = Some(card);
        }
    }

    /// While `peer` has no connection, ask the others for its card at `at`.
    pub(super) fn schedule_ask(&mut self, peer: NodeId, at: Millis) {
        if let Some(p) = self.table.get_mut(&peer) {
            p.ask_at = Some(at);
            self.touched.insert(peer);
        }
    }

    /// Schedules the first card query about `peer` at `at` if none is:
    /// a peer just added or loaded is asked about once it has gone that
    /// long without a connection.
    pub(super) fn ensure_ask(&mut self, peer: NodeId, at: Millis) {
        if let Some(p) = self.table.get_mut(&peer)
            && p.ask_at.is_none()
        {
            p.ask_at = Some(at);
        }
    }

    /// When to ask about `peer` next: only while it has no connection.
    pub(super) fn ask_deadline(&self, peer: NodeId) -> Option<Millis> {
        let p = self.table.get(&peer)?;
        if p.conn.is_some() {
            return None;
        }
        p.ask_at
    }

    /// The peers with a live connection (Hello received) other than
    /// `about` that may be asked about it now: not already asked within
    /// `retry_ms`, and with room for one more open query. Marks them asked
    /// at `now`.
    pub(super) fn ask_about(
        &mut self,
        about: NodeId,
        now: Millis,
        retry_ms: u64,
    ) -> Vec<(NodeId, ConnId)> {
        let mut out = Vec::new();
        for (node, p) in self.table.iter_mut() {
            let Some((conn, Phase::Live { .. })) = p.conn else {
                continue;
            };
            if *node == about {
                continue;
            }
            let due = p
                .asked
                .get(&about)
                .is_none_or(|sent| now >= sent.plus(retry_ms));
            if !due || (!p.asked.contains_key(&about) && p.asked.len() >= CARD_QUERIES_MAX) {
                continue;
            }
            p.asked.insert(about, now);
            out.push((*node, conn));
        }
        out
    }

    /// `from` answered our query about `about`: whether we had asked it.
    pub(super) fn take_answer(&mut self, from: NodeId, about: NodeId) -> bool {
        self.table
            .get_mut(&from)
            .is_some_and(|p| p.asked.remove(&about).is_some())
    }

    /// Whether `from` may be answered one more card query at `now`: at most
    /// [`CARD_ANSWERS_MAX`] in each [`CARD_ANSWER_WINDOW_MS`]. Counts it.
    pub(super) fn may_answer(&mut self, from: NodeId, now: Millis) -> bool {
        let Some(p) = self.table.get_mut(&from) else {
            return false;
        };
        let (start, count) = &mut p.answered;
        if now >= start.plus(CARD_ANSWER_WINDOW_MS) {
            *start = now;
            *count = 0;
        }
        if *count >= CARD_ANSWERS_MAX {
            return false;
        }
        *count += 1;
        true
    }

    /// The peer's Hello announced `epoch`: returns `None` if it is the one
    /// already seen, or `Some(earlier)` if it is new, with the epoch seen
    /// before (`Some`: the peer's store is not the one that acknowledged,
    /// and that epoch's stream to us has ended).
    pub(super) fn see_epoch(&mut self, peer: NodeId, epoch: Epoch) -> Option<Option<Epoch>> {
        let p = self.table.get_mut(&peer)?;
        if p.epoch_seen == Some(epoch) {
            return None;
        }
        Some(p.epoch_seen.replace(epoch))
    }

    /// Every peer whose connection is live, with it.
    pub(super) fn live(&self) -> Vec<(NodeId, ConnId)> {
        self.table
            .iter()
            .filter_map(|(n, p)| match p.conn {
                Some((c, Phase::Live { .. })) => Some((*n, c)),
                _ => None,
            })
            .collect()
    }

    /// Every peer with a connection, in any phase: the connection, and
    /// whether the peer's Hello came on it.
    pub(super) fn connected(&self) -> Vec<(NodeId, ConnId, bool)> {
        self.table
            .iter()
            .filter_map(|(n, p)| {
                let (c, phase) = p.conn?;
                Some((*n, c, matches!(phase, Phase::Live { .. })))
            })
            .collect()
    }

    /// The peer's Hello came on its live connection.
    pub(super) fn go_live(&mut self, peer: NodeId, epoch: Epoch) {
        if let Some((_, phase)) = self.table.get_mut(&peer).and_then(|p| p.conn.as_mut()) {
            *phase = Phase::Live { peer_epoch: epoch };
            self.touched.insert(peer);
        }
    }

    /// The peer's epoch is committed.
    pub(super) fn record_epoch(&mut self, peer: NodeId, epoch: Epoch) {
        if let Some(p) = self.table.get_mut(&peer) {
            p.record.epoch = Some(epoch);
        }
    }

    /// Applies a committed peer change. The caller has forgotten the
    /// connection of a removed peer.
    pub(super) fn apply(&mut self, change: PeerChange) {
        // The core refuses a change naming this node before it is queued.
        debug_assert_ne!(change.node(), self.me);
        match change {
            PeerChange::Put(record) => match self.table.get_mut(&record.node) {
                Some(p) => p.record.addrs = record.addrs,
                None => {
                    self.touched.insert(record.node);
                    self.table.insert(record.node, Peer::new(record));
                }
            },
            PeerChange::Remove(node) => {
                self.table.remove(&node);
                self.touched.insert(node);
            }
        }
    }

    /// When the peer's Hello is due again, while it has not come.
    pub(super) fn hello_deadline(&self, peer: NodeId, config: &Config) -> Option<Millis> {
        match self.table.get(&peer)?.conn? {
            (_, Phase::AwaitingHello { sent_at, .. }) => Some(sent_at.plus(config.hello_retry_ms)),
            (_, Phase::Live { .. }) => None,
        }
    }

    /// What the Hello timer of `peer` asks for at `now`, if it is due;
    /// counts a resend as an attempt.
    pub(super) fn hello_due(
        &mut self,
        peer: NodeId,
        now: Millis,
        config: &Config,
    ) -> Option<HelloStep> {
        let (conn, phase) = self.table.get_mut(&peer)?.conn.as_mut()?;
        let Phase::AwaitingHello { sent_at, attempts } = phase else {
            return None;
        };
        if now < sent_at.plus(config.hello_retry_ms) {
            return None;
        }
        if *attempts >= config.hello_attempts_max {
            return Some(HelloStep::GiveUp(*conn, *attempts));
        }
        *attempts += 1;
        *sent_at = now;
        self.touched.insert(peer);
        Some(HelloStep::Resend(*conn))
    }

    /// The peers whose connection phase changed since the last call.
    pub(super) fn take_touched(&mut self) -> BTreeSet<NodeId> {
        std::mem::take(&mut self.touched)
    }
}
