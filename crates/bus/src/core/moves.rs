//! Agents' move notices (`docs/design.md`, "As built: moving an agent"):
//! per agent, the notice that wins, told to every peer after its Hello and
//! passed on to every other peer when a newer one comes.
//!
//! A notice is signed by the agent's own key, checked at the edge as cards
//! are, so a node passes on what it cannot have made. Which one wins is
//! [`AgentMove::wins_over`]: the higher version, then the higher node id,
//! so two moves in a race settle on one host everywhere.
//!
//! Following a move: a send to `NAME@OLD` goes to the agent's new host
//! once this node knows, from `OLD` itself, that `NAME@OLD` is the agent
//! of key `K` (`OLD`'s card, or a notice of `K` leaving `OLD` that `OLD`
//! passed on: `OLD` takes such a notice only for its own agent of that
//! key), and holds a notice that `K` is hosted elsewhere (by this node or
//! a peer). Sends not yet in a commit are readdressed when their commit
//! is built; once the commit in flight is answered this node tells `OLD`
//! in a `Followed` frame that nothing for `K` comes after its stream's
//! last seq. The old host ends the agent's drain early once every peer
//! followed and it has received each one's stream that far.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{AgentMove, AgentName, Channel, Frame, MAX_FRAME_MOVES, NodeId, Seq, StreamId};
use mesh_store::AgentOp;

use super::{BadCards, ConnId, Core, DropReason};

/// The most `(host, name)` pairs kept of who hosts which agent key (from
/// the hosts' own cards and notices): one more is not kept (its sends are
/// then not readdressed; the old host passes them on).
pub const HOSTED_MAX: usize = 4096;

/// The most agents this node keeps a move notice of. A notice of one more
/// agent is dropped and counted (`moves_full`): notices are never
/// forgotten, so this bounds their memory and disk (about 200 bytes each).
pub const MOVES_MAX: usize = 4096;

/// The notice held of each agent that moved, by agent key, and what
/// following the moves takes.
#[derive(Debug, Default)]
pub(super) struct Moves {
    held: BTreeMap<NodeId, AgentMove>,
    /// Which key the agent `name` of `host` has, as `host` said (in
    /// memory: learned again from each host's cards and notices).
    hosted: BTreeMap<(NodeId, AgentName), NodeId>,
    /// Peers to tell which moves away from them this node follows, once
    /// no commit is in flight.
    follow_due: BTreeSet<NodeId>,
    /// Per agent that moved away from this node: each peer's `Followed`
    /// stream and the last seq on it that may hold a message for it.
    follows: BTreeMap<NodeId, BTreeMap<NodeId, (StreamId, Seq)>>,
    /// The agents whose every peer followed, as last told.
    followed: BTreeSet<NodeId>,
    /// The agents (name, key) a notice this node took says left it.
    left: BTreeSet<(AgentName, NodeId)>,
    /// Per peer, the last seq of this node's stream to it that carries a
    /// forward (in memory: after a restart the daemon's pump passes on
    /// again what was not acknowledged). While it is unacknowledged the
    /// outbox to the peer makes no room by a loss.
    forwarding: BTreeMap<NodeId, Seq>,
}

impl Moves {
    pub(super) fn new(me: NodeId, held: Vec<AgentMove>) -> Moves {
        Moves {
            left: held
                .iter()
                .filter(|m| m.from == me)
                .map(|m| (m.name.clone(), m.key))
                .collect(),
            held: held.into_iter().map(|m| (m.key, m)).collect(),
            ..Moves::default()
        }
    }

    /// Notes that seq `seq` of this node's stream to `to` carries a forward.
    pub(super) fn note_forward(&mut self, to: NodeId, seq: Seq) {
        let last = self.forwarding.entry(to).or_default();
        *last = (*last).max(seq);
    }

    /// Whether this node's stream to `to` carries a forward after
    /// `last_acked`, the peer's acknowledgment (forgetting one it acknowledged).
    pub(super) fn forwarding(&mut self, to: NodeId, last_acked: Seq) -> bool {
        match self.forwarding.get(&to) {
            Some(&seq) if seq > last_acked => true,
            Some(_) => {
                self.forwarding.remove(&to);
                false
            }
            None => false,
        }
    }

    /// The key of an agent named `name` that left this node, if one did.
    fn left_key(&self, name: &AgentName) -> Option<&NodeId> {
        self.left
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, key)| key)
    }

    /// Keeps that `host` says its agent `name` has the key `key`.
    fn vouch(&mut self, host: NodeId, name: &AgentName, key: NodeId) {
        let slot = (host, name.clone());
        if self.hosted.len() < HOSTED_MAX || self.hosted.contains_key(&slot) {
            self.hosted.insert(slot, key);
        }
    }

    /// The notice held of the agent `key`.
    pub(super) fn get(&self, key: &NodeId) -> Option<&AgentMove> {
        self.held.get(key)
    }

    /// Every notice held, by agent key.
    pub(super) fn all(&self) -> impl Iterator<Item = &AgentMove> {
        self.held.values()
    }

    /// Keeps `notice` if it wins over the one held of its agent (or is the
    /// first, while there is room); `Err` if it is new and there is none.
    fn take(&mut self, notice: &AgentMove) -> Result<bool, ()> {
        match self.held.get(&notice.key) {
            Some(held) if !notice.wins_over(held) => Ok(false),
            None if self.held.len() >= MOVES_MAX => Err(()),
            _ => {
                self.held.insert(notice.key, notice.clone());
                Ok(true)
            }
        }
    }

    /// `notices` as frames of at most [`MAX_FRAME_MOVES`] (none if empty).
    fn frames<'a>(notices: impl Iterator<Item = &'a AgentMove>) -> Vec<Frame> {
        let all: Vec<AgentMove> = notices.cloned().collect();
        let pages: Vec<&[AgentMove]> = all.chunks(MAX_FRAME_MOVES).collect();
        let last = pages.len().saturating_sub(1);
        pages
            .into_iter()
            .enumerate()
            .map(|(i, page)| Frame::Moves {
                notices: page.to_vec(),
                more: i < last,
            })
            .collect()
    }
}

impl Core {
    /// Where a send to the agent `name` of `to` goes instead: the agent's
    /// new host, if `to` said it hosts that agent, a notice says it moved
    /// away, and the new host is this node or a peer.
    pub(super) fn readdress(&self, to: NodeId, name: &AgentName) -> Option<NodeId> {
        if self.moves.held.is_empty() {
            return None;
        }
        let key = if to == self.me {
            // An agent here, or one that left (its drain may have ended).
            match self.agents.key_of(name) {
                Some(key) => key,
                None => self.moves.left_key(name)?,
            }
        } else {
            self.moves.hosted.get(&(to, name.clone()))?
        };
        let m = self.moves.held.get(key)?;
        (m.node != to && &m.name == name && (m.node == self.me || self.peers.is_peer(m.node)))
            .then_some(m.node)
    }

    /// The agents (by key) that moved away from `host` whose sends this
    /// node readdresses.
    fn followable(&self, host: NodeId) -> Vec<NodeId> {
        self.moves
            .hosted
            .iter()
            .filter(|((h, name), _)| *h == host && self.readdress(host, name).is_some())
            .map(|(_, key)| *key)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Notes that `host` is owed a `Followed` frame, if this node follows
    /// a move away from it.
    fn note_follow(&mut self, host: NodeId) {
        if host != self.me && !self.followable(host).is_empty() {
            self.moves.follow_due.insert(host);
        }
    }

    /// Tells each peer owed one, live, which moves away from it this node
    /// follows and the last seq of its stream to the peer: only when no
    /// commit is in flight, so every send built before the notice is
    /// below it (later ones are readdressed when built).
    pub(super) fn send_follows(&mut self) {
        if self.moves.follow_due.is_empty() || self.committer.in_flight() {
            return;
        }
        for peer in std::mem::take(&mut self.moves.follow_due) {
            let Some(conn) = self.peers.live_conn(peer) else {
                continue; // told after its next Hello
            };
            let agents = self.followable(peer);
            let own = self.author.own_view(peer);
            let through = own.next_seq.saturating_sub(1);
            for page in agents.chunks(MAX_FRAME_MOVES) {
                let frame = Frame::Followed {
                    stream: own.stream.clone(),
                    through,
                    agents: page.to_vec(),
                };
                self.out.metrics.agents.follows_sent += 1;
                self.out.send(peer, conn, frame);
            }
        }
    }

    /// Whether the agent `key` moved away from this node and is still
    /// one of its agents (its previous inbox drains here).
    fn drains_here(&self, key: &NodeId) -> bool {
        self.moves.held.get(key).is_some_and(|m| m.node != self.me) && self.agents.has_key(key)
    }

    /// A `Followed` frame from `peer` (live, after its Hello): it follows
    /// the moves of `agents` away from here, and nothing for them comes on
    /// `stream` after `through`.
    pub(super) fn on_followed(
        &mut self,
        peer: NodeId,
        stream: StreamId,
        through: Seq,
        agents: Vec<NodeId>,
    ) {
        if stream.author != peer || stream.channel != Channel::Direct(self.me) {
            self.out.drop(DropReason::Malformed);
            return;
        }
        // Kept also for a move this node has not learned yet (the notice
        // may come on another connection after this), up to a bound.
        for key in agents {
            let known = self.moves.follows.contains_key(&key);
            if known || self.moves.follows.len() < HOSTED_MAX {
                let by = self.moves.follows.entry(key).or_default();
                by.insert(peer, (stream.clone(), through));
            }
        }
        self.check_drains();
    }

    /// Tells the driver which drains every peer followed, if that changed:
    /// each peer said it follows and its stream is committed here as far
    /// as it said.
    pub(super) fn check_drains(&mut self) {
        if self.moves.follows.is_empty() && self.moves.followed.is_empty() {
            return;
        }
        // A move this node learned that is not a drain here is no concern
        // (in place: this runs after every commit while a drain is followed).
        let stale: Vec<NodeId> = self
            .moves
            .follows
            .keys()
            .filter(|&key| self.moves.held.contains_key(key) && !self.drains_here(key))
            .copied()
            .collect();
        for key in stale {
            self.moves.follows.remove(&key);
        }
        let followed: BTreeSet<NodeId> = self
            .moves
            .follows
            .iter()
            .filter(|(key, by)| {
                self.drains_here(key)
                    && self.peers.ids().all(|p| {
                        by.get(&p)
                            .is_some_and(|(stream, through)| self.receiver.mark(stream) >= *through)
                    })
            })
            .map(|(key, _)| *key)
            .collect();
        if followed != self.moves.followed {
            let new = followed.difference(&self.moves.followed).count() as u64;
            self.out.metrics.agents.drains_followed += new;
            self.moves.followed = followed.clone();
            self.out.push(super::Effect::DrainsFollowed {
                agents: followed.into_iter().collect(),
            });
        }
    }

    /// After a peer's Hello: it is owed a `Followed` frame if this node
    /// follows a move away from it.
    pub(super) fn follow_on_hello(&mut self, peer: NodeId) {
        self.note_follow(peer);
        self.send_follows();
    }

    /// A peer's agent cards: each says which key its agent of that name has.
    pub(super) fn vouch_cards(&mut self, peer: NodeId, cards: &[mesh_protocol::AgentCard]) {
        for c in cards {
            self.moves.vouch(peer, &c.name, c.key);
        }
    }

    /// Tells `peer`, live on `conn`, every notice held (nothing if none).
    pub(super) fn announce_moves_to(&mut self, peer: NodeId, conn: ConnId) {
        for frame in Moves::frames(self.moves.all()) {
            self.out.send(peer, conn, frame);
        }
    }

    /// A `Moves` frame from `peer`, its notices already checked at the
    /// edge: each that wins is kept (written with the next commit) and
    /// passed on to every other live peer.
    pub(super) fn on_moves(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        notices: Result<Vec<AgentMove>, BadCards>,
    ) {
        if self.peers.live_conn(peer) != Some(conn) {
            self.out.drop(DropReason::StaleConnection);
            return;
        }
        self.out.metrics.frames_in.moves += 1;
        if self.peers.peer_epoch(peer).is_none() {
            self.out.drop(DropReason::BeforeHello);
            return;
        }
        let Ok(notices) = notices else {
            self.out.metrics.agents.moves_refused += 1;
            return;
        };
        self.take_moves(notices, Some(peer));
    }

    /// A committed move notice this node signed (an import): it holds the
    /// agent's key, so it knows the agent was its old host's.
    pub(super) fn on_local_move(&mut self, notice: AgentMove) {
        self.moves.vouch(notice.from, &notice.name, notice.key);
        self.take_moves(vec![notice], None);
    }

    /// Keeps the notices of `notices` that win and tells every live peer
    /// but `from` about them.
    fn take_moves(&mut self, notices: Vec<AgentMove>, from: Option<NodeId>) {
        let mut won = Vec::new();
        for notice in notices {
            // A notice of an agent leaving this node is taken only for the
            // agent of that name and key here (or one that left before): it
            // is what others trust.
            if notice.from == self.me {
                let agent = (notice.name.clone(), notice.key);
                if !self.agents.has(&agent.0, &agent.1) && !self.moves.left.contains(&agent) {
                    self.out.metrics.agents.moves_refused += 1;
                    continue;
                }
                if self.moves.left.len() < MOVES_MAX {
                    self.moves.left.insert(agent);
                }
            }
            if from == Some(notice.from) {
                self.moves.vouch(notice.from, &notice.name, notice.key);
            }
            match self.moves.take(&notice) {
                Ok(true) => {
                    self.out.metrics.agents.moves_taken += 1;
                    self.out.push(super::Effect::AgentMoved {
                        notice: notice.clone(),
                    });
                    if from.is_some() {
                        self.agents
                            .push_housekeeping(AgentOp::PutMove(notice.clone()));
                    }
                    won.push(notice);
                }
                Ok(false) => {}
                Err(()) => self.out.drop(DropReason::MovesFull),
            }
        }
        if won.is_empty() {
            self.follow_moves(&won, from);
            return;
        }
        // An agent of this node that moved elsewhere is no longer announced here.
        let away: Vec<NodeId> = won
            .iter()
            .filter(|m| m.node != self.me)
            .map(|m| m.key)
            .collect();
        if self.agents.forget_cards_of(&away) {
            self.announce_all();
        }
        for (peer, conn) in self.peers.live() {
            if Some(peer) == from {
                continue;
            }
            for frame in Moves::frames(won.iter()) {
                self.out.send(peer, conn, frame);
            }
        }
        // After the notices: a peer takes a `Followed` of a move it knows.
        self.follow_moves(&won, from);
    }
}

impl Core {
    /// Owes a `Followed` frame to each old host of the agents of `won`
    /// (and to `from`, which may have vouched for one it held already),
    /// and sends what is owed if no commit is in flight.
    fn follow_moves(&mut self, won: &[AgentMove], from: Option<NodeId>) {
        let keys: BTreeSet<NodeId> = won.iter().map(|m| m.key).collect();
        let hosts: BTreeSet<NodeId> = self
            .moves
            .hosted
            .iter()
            .filter(|(_, key)| keys.contains(*key))
            .map(|((host, _), _)| *host)
            .chain(from)
            .collect();
        for host in hosts {
            self.note_follow(host);
        }
        self.check_drains();
        self.send_follows();
    }
}
