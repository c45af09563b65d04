//! Agents' move notices (`docs/design.md`, "As built: moving an agent"):
//! per agent, the notice that wins, told to every peer after its Hello and
//! passed on to every other peer when a newer one comes.
//!
//! A notice is signed by the agent's own key, checked at the edge as cards
//! are, so a node passes on what it cannot have made. Which one wins is
//! [`AgentMove::wins_over`]: the higher version, then the higher node id,
//! so two moves in a race settle on one host everywhere.

use std::collections::BTreeMap;

use mesh_protocol::{AgentMove, Frame, MAX_FRAME_MOVES, NodeId};
use mesh_store::AgentOp;

use super::{BadCards, ConnId, Core, DropReason};

/// The most agents this node keeps a move notice of. A notice of one more
/// agent is dropped and counted (`moves_full`): notices are never
/// forgotten, so this bounds their memory and disk (about 200 bytes each).
pub const MOVES_MAX: usize = 4096;

/// The notice held of each agent that moved, by agent key.
#[derive(Debug, Default)]
pub(super) struct Moves {
    held: BTreeMap<NodeId, AgentMove>,
}

impl Moves {
    pub(super) fn new(held: Vec<AgentMove>) -> Moves {
        Moves {
            held: held.into_iter().map(|m| (m.key, m)).collect(),
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

    /// A committed move notice this node signed (an import).
    pub(super) fn on_local_move(&mut self, notice: AgentMove) {
        self.take_moves(vec![notice], None);
    }

    /// Keeps the notices of `notices` that win and tells every live peer
    /// but `from` about them.
    fn take_moves(&mut self, notices: Vec<AgentMove>, from: Option<NodeId>) {
        let mut won = Vec::new();
        for notice in notices {
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
    }
}
