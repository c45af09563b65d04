//! The committer's queues: what is added to them, and taken for the next commit.

use std::collections::{BTreeMap, VecDeque};

use mesh_protocol::{Epoch, NodeCard, NodeId, Seq};

use super::{
    AckWork, CarryWork, Committer, EpochSwitch, Group, InboundWork, LostTally, Report,
    WaitingPublish, WaitingSend,
};
use crate::core::peers::PeerChange;
use crate::core::{Config, LocalWrite, Millis, ReqId, WAITING_SENDS_MAX};

impl Committer {
    /// Sends waiting, and their payload bytes.
    pub(in crate::core) fn sends_waiting(&self) -> (usize, u64) {
        (self.sends.len(), self.send_bytes)
    }

    pub(in crate::core) fn queue_send(&mut self, send: WaitingSend) {
        self.send_bytes += send.payload.len() as u64;
        self.sends.push_back(send);
        self.check();
    }

    /// The sends waiting, taken for the next commit.
    pub(in crate::core) fn take_sends(&mut self) -> VecDeque<WaitingSend> {
        self.send_bytes = 0;
        std::mem::take(&mut self.sends)
    }

    /// Sends taken for a commit that must wait for the next one after all,
    /// in their order, ahead of any that came since.
    pub(in crate::core) fn wait_again(&mut self, sends: Vec<WaitingSend>) {
        for s in sends.into_iter().rev() {
            self.send_bytes += s.payload.len() as u64;
            self.sends.push_front(s);
        }
        self.check();
    }

    /// Sends and publishes whose commit failed for want of a store, held
    /// again ahead of any that came since; returns the newest past the
    /// hold bounds (one budget for both), which the caller refuses: the
    /// oldest are held first, and a publish request is refused whole.
    pub(in crate::core) fn hold_again(
        &mut self,
        sends: Vec<WaitingSend>,
        publishes: Vec<WaitingPublish>,
        config: &Config,
    ) -> (Vec<WaitingSend>, Vec<WaitingPublish>) {
        for s in sends.into_iter().rev() {
            self.send_bytes += s.payload.len() as u64;
            self.sends.push_front(s);
        }
        for p in publishes.into_iter().rev() {
            self.publish_bytes += p.payload.len() as u64;
            self.publishes.push_front(p);
        }
        let (msgs_max, bytes_max) = config.hold_bounds();
        let mut over = (Vec::new(), Vec::new());
        loop {
            let (msgs, bytes) = self.held();
            if msgs <= msgs_max && bytes <= bytes_max {
                break;
            }
            let send_ms = self.sends.back().map(|s| s.created_ms);
            let publish = self.publishes.back().map(|p| (p.created_ms, p.request));
            match (send_ms, publish) {
                (None, None) => break,
                (Some(s), p) if p.is_none_or(|(p, _)| s > p) => {
                    if let Some(s) = self.sends.pop_back() {
                        self.send_bytes -= s.payload.len() as u64;
                        over.0.push(s);
                    }
                }
                (_, Some((_, request))) => {
                    // A request's publishes wait next to each other, in order.
                    while self.publishes.back().is_some_and(|p| p.request == request) {
                        if let Some(p) = self.publishes.pop_back() {
                            self.publish_bytes -= p.payload.len() as u64;
                            over.1.push(p);
                        }
                    }
                }
                (_, None) => break,
            }
        }
        over.0.reverse();
        over.1.reverse();
        self.check();
        over
    }

    /// While the store is down: the held sends and publishes taken
    /// `hold_ms` ago or earlier, removed, in their order.
    pub(in crate::core) fn expire_held(
        &mut self,
        now: Millis,
        config: &Config,
    ) -> (Vec<WaitingSend>, Vec<WaitingPublish>) {
        if self.store_down.is_none() {
            return (Vec::new(), Vec::new());
        }
        let ended = |created_ms: u64| now.0 >= created_ms.saturating_add(config.hold_ms);
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sends)
            .into_iter()
            .partition(|s| ended(s.created_ms));
        self.sends = kept.into();
        self.send_bytes = self.sends.iter().map(|s| s.payload.len() as u64).sum();
        // A request's publishes were taken together: they end together.
        let (expired_publishes, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.publishes)
            .into_iter()
            .partition(|p| ended(p.created_ms));
        self.publishes = kept.into();
        self.publish_bytes = self.publishes.iter().map(|p| p.payload.len() as u64).sum();
        self.check();
        (expired, expired_publishes)
    }

    /// While the store is down: when the oldest held send's or publish's
    /// hold ends.
    pub(in crate::core) fn hold_deadline(&self, config: &Config) -> Option<Millis> {
        self.store_down.as_ref()?;
        let sends = self.sends.iter().map(|s| s.created_ms);
        let oldest = sends
            .chain(self.publishes.iter().map(|p| p.created_ms))
            .min()?;
        Some(Millis(oldest.saturating_add(config.hold_ms)))
    }

    /// Held sends let go: journaled once the store takes a commit.
    pub(in crate::core) fn note_lost(&mut self, sends: &[WaitingSend]) {
        for s in sends {
            let t = LostTally {
                msgs: 1,
                bytes: s.payload.len() as u64,
                first_ms: s.created_ms,
                last_ms: s.created_ms,
            };
            self.lost.entry(s.to).or_default().add(t);
        }
    }

    /// The lost tallies waiting, taken for the next commit.
    pub(in crate::core) fn take_lost(&mut self) -> BTreeMap<NodeId, LostTally> {
        std::mem::take(&mut self.lost)
    }

    /// A lost tally whose record did not commit: kept for the next one.
    pub(in crate::core) fn lost_again(&mut self, to: NodeId, tally: LostTally) {
        self.lost.entry(to).or_default().add(tally);
    }

    fn check(&self) {
        debug_assert_eq!(
            self.send_bytes,
            self.sends
                .iter()
                .map(|s| s.payload.len() as u64)
                .sum::<u64>()
        );
        debug_assert_eq!(
            self.publish_bytes,
            self.publishes
                .iter()
                .map(|p| p.payload.len() as u64)
                .sum::<u64>()
        );
        debug_assert!(self.sends.len() <= WAITING_SENDS_MAX);
        debug_assert!(self.publishes.len() <= WAITING_SENDS_MAX);
    }

    /// The highest ack of `to` waiting for or in the current commit (0 if none, or a reset).
    pub(in crate::core) fn ack_in_progress(&self, to: NodeId) -> Seq {
        let flying = self.in_flight.as_ref().and_then(|f| {
            f.groups.iter().find_map(|g| match g {
                Group::Ack { peer, work } if *peer == to => Some(work),
                _ => None,
            })
        });
        [self.acks.get(&to), flying]
            .into_iter()
            .flatten()
            .filter(|w| !w.reset)
            .map(|w| w.upto)
            .max()
            .unwrap_or(0)
    }

    /// Remembers that `peer` holds everything of our stream up to `upto`
    /// (`last_acked`: what is committed of its ack).
    pub(in crate::core) fn note_ack(&mut self, peer: NodeId, upto: Seq, last_acked: Seq) {
        if let Some(w) = self.acks.get_mut(&peer) {
            w.upto = w.upto.max(upto);
            return;
        }
        if upto > last_acked && upto > self.ack_in_progress(peer) {
            self.acks.insert(peer, AckWork::upto(upto));
        }
    }

    /// Ack work that must be written as it says (a new peer epoch, a reset):
    /// folded over whatever waits of the peer's acks.
    pub(in crate::core) fn new_epoch_ack(&mut self, peer: NodeId, work: AckWork) {
        let merged = match self.acks.remove(&peer) {
            Some(older) => work.under(older),
            None => work,
        };
        self.acks.insert(peer, merged);
    }

    /// The peer is gone: its acks are not written.
    pub(in crate::core) fn drop_acks(&mut self, peer: NodeId) {
        self.acks.remove(&peer);
    }

    /// The acks waiting, taken for the next commit.
    pub(in crate::core) fn take_acks(&mut self) -> BTreeMap<NodeId, AckWork> {
        self.acks_since = None;
        std::mem::take(&mut self.acks)
    }

    /// An ack group failed: try it again with the next commit, under
    /// anything newer of the same peer.
    pub(in crate::core) fn retry_ack(&mut self, peer: NodeId, work: AckWork) {
        let again = match self.acks.remove(&peer) {
            Some(newer) => newer.under(work),
            None => work,
        };
        self.acks.insert(peer, again);
    }

    /// The number of peer changes waiting.
    pub(in crate::core) fn peer_changes_waiting(&self) -> usize {
        self.peer_changes.len()
    }

    pub(in crate::core) fn queue_peer_change(&mut self, req: ReqId, change: PeerChange) {
        self.peer_changes.push_back((req, change));
    }

    /// The peer changes waiting, taken for the next commit.
    pub(in crate::core) fn take_peer_changes(&mut self) -> VecDeque<(ReqId, PeerChange)> {
        std::mem::take(&mut self.peer_changes)
    }

    /// The number of local writes waiting.
    pub(in crate::core) fn writes_waiting(&self) -> usize {
        self.writes.len()
    }

    pub(in crate::core) fn queue_write(&mut self, req: ReqId, write: LocalWrite) {
        self.writes.push_back((req, write));
    }

    /// The local writes waiting, taken for the next commit.
    pub(in crate::core) fn take_writes(&mut self) -> VecDeque<(ReqId, LocalWrite)> {
        std::mem::take(&mut self.writes)
    }

    /// The peer batches and gaps waiting, taken for the next commit.
    pub(in crate::core) fn take_inbound(&mut self) -> VecDeque<InboundWork> {
        self.inbound.take()
    }

    /// Starts a new store epoch with the next commit (or adds `report` to
    /// the one already asked for, which keeps its epoch).
    pub(in crate::core) fn switch_epoch(&mut self, epoch: Epoch, report: Report) {
        match &mut self.switch {
            Some(sw) => {
                if !sw.reports.iter().any(|r| r.stream == report.stream) {
                    sw.reports.push(report);
                }
            }
            None => {
                self.switch = Some(EpochSwitch {
                    epoch,
                    reports: vec![report],
                })
            }
        }
    }

    /// The card of `node` waiting for (or in) a commit, if any.
    pub(in crate::core) fn card_waiting(&self, node: NodeId) -> Option<&NodeCard> {
        let flying = self.in_flight.as_ref().and_then(|f| {
            f.groups.iter().find_map(|g| match g {
                Group::Card { card } if card.node == node => Some(card),
                _ => None,
            })
        });
        [self.cards.get(&node), flying]
            .into_iter()
            .flatten()
            .max_by_key(|c| c.issued_ms)
    }

    /// Queues `card` to be kept; it replaces an older one of its node waiting.
    pub(in crate::core) fn queue_card(&mut self, card: NodeCard) {
        match self.cards.get(&card.node) {
            Some(waiting) if !card.is_newer_than(waiting) => {}
            _ => {
                self.cards.insert(card.node, card);
            }
        }
    }

    /// Whether a new epoch waits for its commit (not yet in one).
    pub(in crate::core) fn switch_waiting(&self) -> bool {
        self.switch.is_some()
    }

    /// The epoch of the new epoch waiting for its commit.
    pub(in crate::core) fn waiting_epoch(&self) -> Option<Epoch> {
        self.switch.as_ref().map(|s| s.epoch)
    }

    /// A rollback found while the new epoch is being committed.
    pub(in crate::core) fn report_after_switch(&mut self, report: Report) {
        if !self.after_switch.iter().any(|r| r.stream == report.stream) {
            self.after_switch.push(report);
        }
    }

    /// The rollbacks found while the new epoch was being committed.
    pub(in crate::core) fn take_after_switch(&mut self) -> Vec<Report> {
        std::mem::take(&mut self.after_switch)
    }

    /// Whether a new epoch waits for, or is in, a commit.
    pub(in crate::core) fn switching(&self) -> bool {
        self.switch.is_some()
            || self
                .in_flight
                .as_ref()
                .is_some_and(|f| f.groups.iter().any(|g| matches!(g, Group::NewEpoch { .. })))
    }

    /// The new epoch waiting, taken for the next commit.
    pub(in crate::core) fn take_switch(&mut self) -> Option<EpochSwitch> {
        self.switch.take()
    }

    /// A new epoch whose commit failed: asked for again, with any reports
    /// asked for since.
    pub(in crate::core) fn switch_again(&mut self, mut switch: EpochSwitch) {
        for r in std::mem::take(&mut self.after_switch) {
            if !switch.reports.iter().any(|x| x.stream == r.stream) {
                switch.reports.push(r);
            }
        }
        if let Some(later) = self.switch.take() {
            for r in later.reports {
                if !switch.reports.iter().any(|x| x.stream == r.stream) {
                    switch.reports.push(r);
                }
            }
        }
        self.switch = Some(switch);
    }

    /// Journals a rolled-back ended stream with the next commit (once per
    /// stream waiting).
    pub(in crate::core) fn queue_report(&mut self, report: Report) {
        match self.reports.iter_mut().find(|r| r.stream == report.stream) {
            Some(r) => r.world = r.world.max(report.world),
            None => self.reports.push(report),
        }
    }

    /// The reports waiting, taken for the next commit.
    pub(in crate::core) fn take_reports(&mut self) -> Vec<Report> {
        std::mem::take(&mut self.reports)
    }

    /// Queues the next carry-over chunk; one at a time.
    pub(in crate::core) fn queue_carry(&mut self, carry: CarryWork) {
        debug_assert!(self.carry.is_none(), "one carry-over chunk at a time");
        self.carry = Some(carry);
    }

    /// The carry-over chunk waiting, taken for the next commit.
    pub(in crate::core) fn take_carry(&mut self) -> Option<CarryWork> {
        self.carry.take()
    }

    /// Whether a carry-over chunk waits for, or is in, a commit.
    pub(in crate::core) fn carrying(&self) -> bool {
        self.carry.is_some()
            || self
                .in_flight
                .as_ref()
                .is_some_and(|f| f.groups.iter().any(|g| matches!(g, Group::Carry { .. })))
    }

    /// A trim is due: the next commit happens for it alone if need be.
    pub(in crate::core) fn want_trim(&mut self) {
        self.trim_wanted = true;
        self.trim_at = None;
    }

    /// Whether a trim is wanted even if nothing else waits.
    pub(in crate::core) fn trim_wanted(&self) -> bool {
        self.trim_wanted
    }

    /// The next commit carries the wanted trim (every commit carries one).
    pub(in crate::core) fn take_trim(&mut self) {
        self.trim_wanted = false;
    }

    /// When the next trim is due, from the last trim's report.
    pub(in crate::core) fn set_trim_at(&mut self, at: Option<Millis>) {
        self.trim_at = at;
    }

    /// When the next trim is due.
    pub(in crate::core) fn trim_deadline(&self) -> Option<Millis> {
        self.trim_at
    }

    /// The cards waiting, taken for the next commit.
    pub(in crate::core) fn take_cards(&mut self) -> BTreeMap<NodeId, NodeCard> {
        std::mem::take(&mut self.cards)
    }
}
