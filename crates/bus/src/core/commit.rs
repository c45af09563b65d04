//! Group commit: at most one [`Effect::Persist`] in flight; whatever arrives
//! meanwhile waits in bounded queues and goes into the next one.

use std::collections::{BTreeMap, VecDeque};

use mesh_protocol::{Epoch, NodeCard, NodeId, OpenBatch, Seq, StreamId};
use mesh_store::{Receipt, StoreError, WriteOp};

use super::peers::PeerChange;
use super::{
    CommitId, Config, Effect, LocalWrite, Millis, Out, ReqId, WAITING_BATCH_BYTES_MAX,
    WAITING_BATCHES_MAX, WAITING_SENDS_MAX,
};

/// A local send waiting for the next commit.
#[derive(Debug)]
pub(super) struct WaitingSend {
    pub(super) req: ReqId,
    pub(super) to: NodeId,
    pub(super) kind: u16,
    pub(super) payload: Vec<u8>,
    pub(super) created_ms: u64,
    /// Agent addressing and a client id, if the send has either.
    pub(super) tracked: Option<Box<super::agents::Tracked>>,
}

/// Receiver work waiting for the next commit, in arrival order.
// A few hundred bytes against a few dozen, in a queue of at most
// WAITING_BATCHES_MAX: not worth an allocation per batch.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum InboundWork {
    /// Commit `batch` from seq `from`.
    Accept {
        peer: NodeId,
        from: Seq,
        batch: OpenBatch,
    },
    /// The author no longer holds anything before `earliest`.
    Gap {
        peer: NodeId,
        stream: StreamId,
        earliest: Seq,
    },
}

impl InboundWork {
    fn stream(&self) -> &StreamId {
        match self {
            InboundWork::Accept { batch, .. } => batch.batch().stream(),
            InboundWork::Gap { stream, .. } => stream,
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            InboundWork::Accept { batch, .. } => batch.batch().payload_bytes(),
            InboundWork::Gap { .. } => 0,
        }
    }
}

/// Peer batches and gaps waiting for the next commit.
///
/// Invariant: `bytes` is the payload bytes of `work`, and both stay within
/// [`WAITING_BATCHES_MAX`] and [`WAITING_BATCH_BYTES_MAX`].
#[derive(Debug, Default)]
pub(super) struct InboundQueue {
    work: VecDeque<InboundWork>,
    bytes: u64,
}

impl InboundQueue {
    /// Whether a batch of `bytes` payload bytes fits.
    pub(super) fn has_room(&self, bytes: u64) -> bool {
        self.work.len() < WAITING_BATCHES_MAX && self.bytes + bytes <= WAITING_BATCH_BYTES_MAX
    }

    /// Whether no more work fits, whatever its size.
    pub(super) fn is_full(&self) -> bool {
        self.work.len() >= WAITING_BATCHES_MAX
    }

    pub(super) fn push(&mut self, work: InboundWork) {
        self.bytes += work.bytes();
        self.work.push_back(work);
        self.check();
    }

    /// Drops the work queued for `stream` (its commit failed).
    pub(super) fn remove_stream(&mut self, stream: &StreamId) {
        let (kept, dropped): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.work)
            .into_iter()
            .partition(|w| w.stream() != stream);
        for w in dropped {
            self.bytes -= w.bytes();
        }
        self.work = kept;
        self.check();
    }

    fn take(&mut self) -> VecDeque<InboundWork> {
        self.bytes = 0;
        std::mem::take(&mut self.work)
    }

    fn check(&self) {
        debug_assert_eq!(
            self.bytes,
            self.work.iter().map(InboundWork::bytes).sum::<u64>()
        );
        debug_assert!(self.work.len() <= WAITING_BATCHES_MAX);
    }
}

/// What a peer has acknowledged of our stream to it, to be committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AckWork {
    /// The peer's mark.
    pub(super) upto: Seq,
    /// The peer's store is new: the ack may move backwards.
    pub(super) reset: bool,
    /// The peer's epoch to record, if it changed.
    pub(super) epoch: Option<Epoch>,
}

impl AckWork {
    /// `older`, which failed to commit, folded under `self`, which came after it.
    fn under(self, older: AckWork) -> AckWork {
        if self.reset {
            return self;
        }
        AckWork {
            upto: self.upto.max(older.upto),
            reset: older.reset,
            epoch: self.epoch.or(older.epoch),
        }
    }
}

/// What one group of the commit in flight was for.
// As for `InboundWork`: bounded, short-lived, not worth boxing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Group {
    Ack {
        peer: NodeId,
        work: AckWork,
    },
    Accept {
        peer: NodeId,
        stream: StreamId,
        last: Seq,
    },
    Gap {
        peer: NodeId,
        stream: StreamId,
        earliest: Seq,
    },
    Append {
        to: NodeId,
        batch: OpenBatch,
        senders: Vec<ReqId>,
    },
    Peer {
        req: ReqId,
        change: PeerChange,
    },
    Write {
        req: ReqId,
        /// The agent it adds or removes, applied once committed.
        agent: Option<super::agents::AgentChange>,
    },
    /// Store ops no request waits for (expired retried-send records).
    Housekeeping,
    /// A node's newer card (this node's own, or a peer's learned one).
    Card {
        card: NodeCard,
    },
}

/// A commit being built: the store's groups and what each is for.
#[derive(Debug, Default)]
pub(super) struct Batch {
    groups: Vec<Vec<WriteOp>>,
    meta: Vec<Group>,
}

impl Batch {
    pub(super) fn push(&mut self, ops: Vec<WriteOp>, group: Group) {
        self.groups.push(ops);
        self.meta.push(group);
    }
}

/// The commit in flight.
#[derive(Debug)]
struct InFlight {
    id: CommitId,
    groups: Vec<Group>,
}

/// The queues of work waiting for the next commit, and the one in flight.
///
/// Invariants: at most one commit is in flight; `send_bytes` is the payload
/// bytes of `sends`; each queue stays within its bound.
#[derive(Debug)]
pub(super) struct Committer {
    sends: VecDeque<WaitingSend>,
    send_bytes: u64,
    /// Peer batches and gaps.
    pub(super) inbound: InboundQueue,
    acks: BTreeMap<NodeId, AckWork>,
    /// When the acks waiting were first seen by [`Committer::ready`] (`None`
    /// when none wait): they may wait for company until `ack_ride_ms` after it.
    acks_since: Option<Millis>,
    /// Peer changes, in the order asked (at most [`super::WAITING_PEER_CHANGES_MAX`]).
    peer_changes: VecDeque<(ReqId, PeerChange)>,
    /// Local writes, in the order asked (at most [`super::WAITING_WRITES_MAX`]).
    writes: VecDeque<(ReqId, LocalWrite)>,
    /// Newer cards to keep, at most one per node (so at most one per peer
    /// and this node's own).
    cards: BTreeMap<NodeId, NodeCard>,
    in_flight: Option<InFlight>,
    next_commit: u64,
    /// After a store failure: no commit before this.
    store_retry_at: Option<Millis>,
}

impl Committer {
    pub(super) fn new() -> Committer {
        Committer {
            sends: VecDeque::new(),
            send_bytes: 0,
            inbound: InboundQueue::default(),
            acks: BTreeMap::new(),
            acks_since: None,
            peer_changes: VecDeque::new(),
            writes: VecDeque::new(),
            cards: BTreeMap::new(),
            in_flight: None,
            next_commit: 1,
            store_retry_at: None,
        }
    }

    /// Whether a commit is outstanding or anything waits for one.
    pub(super) fn is_committing(&self) -> bool {
        self.in_flight.is_some() || !self.is_empty()
    }

    fn is_empty(&self) -> bool {
        self.sends.is_empty()
            && self.inbound.work.is_empty()
            && self.acks.is_empty()
            && self.peer_changes.is_empty()
            && self.writes.is_empty()
            && self.cards.is_empty()
    }

    /// Sends waiting, and their payload bytes.
    pub(super) fn sends_waiting(&self) -> (usize, u64) {
        (self.sends.len(), self.send_bytes)
    }

    pub(super) fn queue_send(&mut self, send: WaitingSend) {
        self.send_bytes += send.payload.len() as u64;
        self.sends.push_back(send);
        self.check();
    }

    /// The sends waiting, taken for the next commit.
    pub(super) fn take_sends(&mut self) -> VecDeque<WaitingSend> {
        self.send_bytes = 0;
        std::mem::take(&mut self.sends)
    }

    /// Sends taken for a commit that must wait for the next one after all,
    /// in their order, ahead of any that came since.
    pub(super) fn wait_again(&mut self, sends: Vec<WaitingSend>) {
        for s in sends.into_iter().rev() {
            self.send_bytes += s.payload.len() as u64;
            self.sends.push_front(s);
        }
        self.check();
    }

    fn check(&self) {
        debug_assert_eq!(
            self.send_bytes,
            self.sends
                .iter()
                .map(|s| s.payload.len() as u64)
                .sum::<u64>()
        );
        debug_assert!(self.sends.len() <= WAITING_SENDS_MAX);
    }

    /// The highest ack of `to` waiting for or in the current commit (0 if none, or a reset).
    pub(super) fn ack_in_progress(&self, to: NodeId) -> Seq {
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
    pub(super) fn note_ack(&mut self, peer: NodeId, upto: Seq, last_acked: Seq) {
        if let Some(w) = self.acks.get_mut(&peer) {
            w.upto = w.upto.max(upto);
            return;
        }
        if upto > last_acked && upto > self.ack_in_progress(peer) {
            let work = AckWork {
                upto,
                reset: false,
                epoch: None,
            };
            self.acks.insert(peer, work);
        }
    }

    /// The peer announced a new store epoch with `mark`: what was waiting
    /// of its acks is replaced.
    pub(super) fn new_epoch_ack(&mut self, peer: NodeId, work: AckWork) {
        self.acks.insert(peer, work);
    }

    /// The peer is gone: its acks are not written.
    pub(super) fn drop_acks(&mut self, peer: NodeId) {
        self.acks.remove(&peer);
    }

    /// The number of peer changes waiting.
    pub(super) fn peer_changes_waiting(&self) -> usize {
        self.peer_changes.len()
    }

    pub(super) fn queue_peer_change(&mut self, req: ReqId, change: PeerChange) {
        self.peer_changes.push_back((req, change));
    }

    /// The number of local writes waiting.
    pub(super) fn writes_waiting(&self) -> usize {
        self.writes.len()
    }

    pub(super) fn queue_write(&mut self, req: ReqId, write: LocalWrite) {
        self.writes.push_back((req, write));
    }

    /// The local writes waiting, taken for the next commit.
    pub(super) fn take_writes(&mut self) -> VecDeque<(ReqId, LocalWrite)> {
        std::mem::take(&mut self.writes)
    }

    /// The card of `node` waiting for (or in) a commit, if any.
    pub(super) fn card_waiting(&self, node: NodeId) -> Option<&NodeCard> {
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
    pub(super) fn queue_card(&mut self, card: NodeCard) {
        match self.cards.get(&card.node) {
            Some(waiting) if !card.is_newer_than(waiting) => {}
            _ => {
                self.cards.insert(card.node, card);
            }
        }
    }

    /// The cards waiting, taken for the next commit.
    pub(super) fn take_cards(&mut self) -> BTreeMap<NodeId, NodeCard> {
        std::mem::take(&mut self.cards)
    }

    /// Whether the next commit may start now. Keeps the clock of acks
    /// waiting for company, and the store's retry bound.
    pub(super) fn ready(&mut self, now: Millis, config: &Config) -> bool {
        let since = if self.acks.is_empty() {
            None
        } else {
            Some(self.acks_since.unwrap_or(now))
        };
        self.acks_since = since;
        if self.in_flight.is_some() {
            return false;
        }
        if let Some(t) = self.store_retry_at {
            if now < t {
                return false;
            }
            self.store_retry_at = None;
        }
        !self.acks_may_wait(now, config)
    }

    /// Whether the only work waiting is acks that may still wait for other
    /// work (sends, peer batches, peer changes, local writes) to share their commit: plain acks (no reset, no new epoch, which
    /// are written at once), seen less than `ack_ride_ms` ago.
    ///
    /// Nothing else waits for an ack record: sends that need the room an
    /// ack makes wait for the commit after the ack's, which any send
    /// starts at once. A reset or an epoch record
    /// is not delayed: until it is written, the store holds an acked mark
    /// a new peer store no longer has.
    fn acks_may_wait(&self, now: Millis, config: &Config) -> bool {
        let Some(since) = self.acks_since else {
            return false;
        };
        self.sends.is_empty()
            && self.inbound.work.is_empty()
            && self.peer_changes.is_empty()
            && self.writes.is_empty()
            && self.cards.is_empty()
            && self.acks.values().all(|a| !a.reset && a.epoch.is_none())
            && now < since.plus(config.ack_ride_ms)
    }

    /// The acks waiting, taken for the next commit.
    pub(super) fn take_acks(&mut self) -> BTreeMap<NodeId, AckWork> {
        self.acks_since = None;
        std::mem::take(&mut self.acks)
    }

    /// The peer batches and gaps waiting, taken for the next commit.
    pub(super) fn take_inbound(&mut self) -> VecDeque<InboundWork> {
        self.inbound.take()
    }

    /// The peer changes waiting, taken for the next commit.
    pub(super) fn take_peer_changes(&mut self) -> VecDeque<(ReqId, PeerChange)> {
        std::mem::take(&mut self.peer_changes)
    }

    /// Issues `batch` as the commit in flight, unless it is empty.
    pub(super) fn start(&mut self, batch: Batch, out: &mut Out) {
        debug_assert!(self.in_flight.is_none(), "one commit in flight at most");
        if batch.groups.is_empty() {
            return;
        }
        let id = CommitId(self.next_commit);
        self.next_commit += 1;
        out.metrics.commits += 1;
        self.in_flight = Some(InFlight {
            id,
            groups: batch.meta,
        });
        out.push(Effect::Persist {
            commit: id,
            groups: batch.groups,
        });
    }

    /// The store's answer to `commit`: each group with its result, or
    /// `None` if that is not the commit in flight (counted as stale).
    pub(super) fn finish(
        &mut self,
        commit: CommitId,
        results: Vec<Result<Receipt, StoreError>>,
        out: &mut Out,
    ) -> Option<Vec<(Group, Result<Receipt, StoreError>)>> {
        let Some(flight) = self.in_flight.take_if(|f| f.id == commit) else {
            out.metrics.stale_answers += 1;
            return None;
        };
        let mut results = results.into_iter();
        let outcomes = flight
            .groups
            .into_iter()
            .map(|g| {
                let result = results.next().unwrap_or_else(|| {
                    Err(StoreError::Unavailable(
                        "the store gave no result for this group".into(),
                    ))
                });
                (g, result)
            })
            .collect();
        Some(outcomes)
    }

    /// An ack group failed: try it again with the next commit, under
    /// anything newer of the same peer.
    pub(super) fn retry_ack(&mut self, peer: NodeId, work: AckWork) {
        let again = match self.acks.remove(&peer) {
            Some(newer) => newer.under(work),
            None => work,
        };
        self.acks.insert(peer, again);
    }

    /// The store failed: no commit before `store_retry_ms` from now.
    pub(super) fn store_failed(&mut self, now: Millis, config: &Config) {
        self.store_retry_at = Some(now.plus(config.store_retry_ms));
    }

    /// When the store may be tried again, after a failure.
    pub(super) fn store_retry_deadline(&self) -> Option<Millis> {
        self.store_retry_at
    }

    /// When the acks waiting were first seen, and whether a commit is in
    /// flight (for tests that let the ride bound pass).
    #[cfg(test)]
    pub(super) fn acks_waiting(&self) -> (Option<Millis>, bool) {
        (self.acks_since, self.in_flight.is_some())
    }

    /// When acks waiting for company must be committed alone, if any wait.
    pub(super) fn ack_ride_deadline(&self, config: &Config) -> Option<Millis> {
        if self.in_flight.is_some() || self.store_retry_at.is_some() {
            return None;
        }
        self.acks_since.map(|since| since.plus(config.ack_ride_ms))
    }
}
