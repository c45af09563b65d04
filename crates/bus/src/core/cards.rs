//! Node cards: learning a peer's newest card (from its Hello, or from
//! another peer that holds it), answering other peers' queries, and asking
//! the connected peers about a peer this node cannot reach.
//!
//! A card is checked here (its node, its signature, that it is newer than
//! the one held) before anything changes: cards come once per connection
//! or per answered query, never per message, so the core verifies them
//! itself. A newer card is committed (its addresses replace the peer's)
//! and only then handed to the driver, which dials the peer there.

use mesh_protocol::{Frame, NodeCard, NodeId};
use mesh_store::{Receipt, StoreError};

use super::{Core, DropReason, Effect, Millis};

impl Core {
    /// Checks `card`, said (by its own Hello, or by a peer that passed it
    /// on) to be the newest of `about`, and queues it to be kept if it is
    /// valid and newer than the one held or waiting. Answers whether it was.
    pub(super) fn learn_card(&mut self, about: NodeId, card: NodeCard) -> bool {
        if card.node != about || about == self.me || !self.peers.is_peer(about) {
            self.out.drop(DropReason::BadCard);
            return false;
        }
        if card.verify().is_err() {
            self.out.drop(DropReason::BadCard);
            return false;
        }
        let held = [self.peers.card(about), self.committer.card_waiting(about)]
            .into_iter()
            .flatten()
            .max_by_key(|c| c.issued_ms);
        if let Some(held) = held
            && !card.is_newer_than(held)
        {
            // The same card again is the common case (every Hello carries one).
            if card != *held {
                self.out.drop(DropReason::StaleCard);
            }
            return false;
        }
        self.committer.queue_card(card);
        true
    }

    /// A card's commit returned.
    pub(super) fn on_card_committed(
        &mut self,
        card: NodeCard,
        result: Result<Receipt, StoreError>,
    ) {
        if result.is_err() {
            // Learned again from the next Hello or answer.
            return;
        }
        if card.node == self.me {
            return;
        }
        self.out.metrics.cards_learned += 1;
        let node = card.node;
        self.peers.set_card(card);
        if let Some(record) = self.peers.record(node) {
            let addrs = record.addrs.clone();
            self.out.push(Effect::PeerAddrs { node, addrs });
        }
    }

    /// `from` asks for our newest card of `about`: answered with it (or
    /// with none), at most [`super::CARD_ANSWERS_MAX`] a window per peer.
    pub(super) fn on_card_query(&mut self, from: NodeId, about: NodeId, now: Millis) {
        if !self.peers.may_answer(from, now) {
            self.out.drop(DropReason::CardQueryLimited);
            return;
        }
        let card = if about == self.me {
            Some(self.own_card.clone())
        } else {
            self.peers.card(about).cloned()
        };
        let card = card.map(Box::new);
        let Some(conn) = self.peers.live_conn(from) else {
            return;
        };
        self.out
            .send(from, conn, Frame::CardAnswer { node: about, card });
    }

    /// `from` answers our query about `about`.
    pub(super) fn on_card_answer(
        &mut self,
        from: NodeId,
        about: NodeId,
        card: Option<Box<NodeCard>>,
    ) {
        if !self.peers.take_answer(from, about) {
            self.out.drop(DropReason::UnsolicitedCard);
            return;
        }
        if let Some(card) = card {
            self.learn_card(about, *card);
        }
    }

    /// The ask timer of `about` is due: while it has no connection, ask
    /// every connected peer for its newest card, and again after
    /// `card_ask_retry_ms`.
    pub(super) fn on_ask_due(&mut self, about: NodeId, now: Millis) {
        let Some(at) = self.peers.ask_deadline(about) else {
            return;
        };
        if now < at {
            return;
        }
        let retry = self.config.card_ask_retry_ms;
        for (peer, conn) in self.peers.ask_about(about, now, retry) {
            self.out.metrics.cards_asked += 1;
            self.out.send(peer, conn, Frame::CardQuery { node: about });
        }
        self.peers.schedule_ask(about, now.plus(retry));
    }
}
