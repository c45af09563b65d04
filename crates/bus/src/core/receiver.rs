//! The receiver side: sequence, hold early batches, record gaps,
//! ask for what is missing.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use mesh_protocol::{Channel, Epoch, Frame, NodeId, OpenBatch, Seq, StreamId};

use super::commit::InboundWork;
use super::{
    Core, DropReason, Millis, REORDER_BYTES_MAX, REORDER_ENVELOPES_MAX, WAITING_BATCH_BYTES_MAX,
    WAITING_BATCHES_MAX,
};

/// The receiver state of one stream.
#[derive(Debug, Default)]
pub(super) struct Inbound {
    /// Every envelope up to here is committed.
    pub(super) committed: Seq,
    /// Every envelope up to here is committed or in a commit under way.
    pub(super) pending: Seq,
    /// Verified batches that start past `pending + 1`, by first seq.
    held: BTreeMap<Seq, OpenBatch>,
    held_bytes: u64,
    /// The highest seq the author is known to have.
    known_last: Seq,
    /// The last `Resync` asked: its `after` and when.
    pub(super) asked: Option<(Seq, Millis)>,
    /// The batch that followed the pending mark was dropped for want of
    /// room in the commit queue: ask for it again as soon as a commit
    /// empties the queue, not a resync interval later.
    pub(super) starved: bool,
}

impl Inbound {
    /// A stream committed up to `mark`.
    pub(super) fn at(mark: Seq) -> Inbound {
        Inbound {
            committed: mark,
            pending: mark,
            known_last: mark,
            ..Inbound::default()
        }
    }

    /// The author has envelopes this node has neither committed nor pending.
    pub(super) fn behind(&self) -> bool {
        self.known_last > self.pending
    }

    /// Drops the early batches (the connection they came on is gone).
    pub(super) fn forget_held(&mut self) {
        self.held.clear();
        self.held_bytes = 0;
        self.asked = None;
        // The next connection's Hello restates what is missing.
        self.starved = false;
    }

    /// Drops held batches that end at or below `pending`.
    fn trim_held(&mut self) {
        let pending = self.pending;
        let before = self.held.len();
        self.held.retain(|_, b| b.batch().last_seq() > pending);
        if self.held.len() != before {
            self.held_bytes = self.held.values().map(|b| b.batch().payload_bytes()).sum();
        }
    }
}

impl Core {
    /// Checks that `stream` is one `peer` may feed this node on its live
    /// connection: authored by `peer`, in the epoch it announced, to us.
    fn check_incoming(&mut self, peer: NodeId, peer_epoch: Epoch, stream: &StreamId) -> bool {
        let reason = if stream.author != peer {
            DropReason::WrongAuthor
        } else if stream.channel != Channel::Direct(self.me) {
            DropReason::WrongRecipient
        } else if stream.epoch != peer_epoch {
            DropReason::StaleEpoch
        } else {
            return true;
        };
        self.metrics.dropped.count(reason);
        false
    }

    pub(super) fn on_batch(
        &mut self,
        peer: NodeId,
        peer_epoch: Epoch,
        open: OpenBatch,
        now: Millis,
    ) {
        let stream = open.batch().stream().clone();
        if !self.check_incoming(peer, peer_epoch, &stream) {
            return;
        }
        let (first, last) = (open.batch().first_seq(), open.batch().last_seq());
        let inb = self.inbound.entry(stream.clone()).or_default();
        inb.known_last = inb.known_last.max(last);
        if last <= inb.pending {
            self.metrics.dropped.count(DropReason::Duplicate);
            self.metrics.duplicate_envelopes += last - first + 1;
            // Our ack may have been lost: say again what is committed.
            if inb.committed >= last {
                let upto = inb.committed;
                self.send_live(peer, Frame::Ack { stream, upto });
            }
            return;
        }
        if first > inb.pending.saturating_add(1) {
            let bytes = open.batch().payload_bytes();
            if last - inb.pending > REORDER_ENVELOPES_MAX
                || inb.held_bytes + bytes > REORDER_BYTES_MAX
            {
                self.metrics.dropped.count(DropReason::OutsideWindow);
            } else if let Entry::Vacant(slot) = inb.held.entry(first) {
                slot.insert(open);
                inb.held_bytes += bytes;
                self.metrics.batches_held += 1;
            }
            self.ask_resync(&stream, now, false);
            return;
        }
        if self.queue_accept(peer, &stream, open) {
            self.drain_held(peer, &stream);
        }
    }

    /// Queues the part of `open` above the pending mark for the next commit.
    /// `open` must reach past the pending mark and start at most one above it.
    /// Returns false if the queue was full (the batch is dropped and counted).
    fn queue_accept(&mut self, peer: NodeId, stream: &StreamId, open: OpenBatch) -> bool {
        let bytes = open.batch().payload_bytes();
        if self.waiting.inbound.len() >= WAITING_BATCHES_MAX
            || self.waiting.inbound_bytes + bytes > WAITING_BATCH_BYTES_MAX
        {
            self.metrics.dropped.count(DropReason::QueueFull);
            if let Some(inb) = self.inbound.get_mut(stream) {
                inb.starved = true;
            }
            return false;
        }
        let Some(inb) = self.inbound.get_mut(stream) else {
            return false;
        };
        let from = inb.pending.saturating_add(1);
        let (first, last) = (open.batch().first_seq(), open.batch().last_seq());
        self.metrics.duplicate_envelopes += from - first;
        self.metrics.batches_accepted += 1;
        let top = open
            .batch()
            .entries()
            .iter()
            .map(|e| e.lamport)
            .max()
            .unwrap_or(0);
        self.lamport = self.lamport.max(top);
        inb.pending = last;
        self.waiting.inbound_bytes += bytes;
        self.waiting.inbound.push_back(InboundWork::Accept {
            peer,
            from,
            batch: open,
        });
        true
    }

    /// Queues every held batch that now follows the pending mark.
    fn drain_held(&mut self, peer: NodeId, stream: &StreamId) {
        loop {
            let Some(inb) = self.inbound.get_mut(stream) else {
                return;
            };
            inb.trim_held();
            let Some(entry) = inb.held.first_entry() else {
                return;
            };
            if *entry.key() > inb.pending.saturating_add(1) {
                return;
            }
            let open = entry.remove();
            inb.held_bytes -= open.batch().payload_bytes();
            if !self.queue_accept(peer, stream, open) {
                return;
            }
        }
    }

    pub(super) fn on_resync_gap(
        &mut self,
        peer: NodeId,
        peer_epoch: Epoch,
        stream: StreamId,
        earliest: Seq,
    ) {
        if !self.check_incoming(peer, peer_epoch, &stream) {
            return;
        }
        let inb = self.inbound.entry(stream.clone()).or_default();
        if earliest <= inb.pending.saturating_add(1) {
            // Nothing we lack is gone (a stale or repeated answer).
            return;
        }
        if self.waiting.inbound.len() >= WAITING_BATCHES_MAX {
            self.metrics.dropped.count(DropReason::QueueFull);
            return;
        }
        inb.pending = earliest - 1;
        inb.known_last = inb.known_last.max(inb.pending);
        self.waiting.inbound.push_back(InboundWork::Gap {
            peer,
            stream: stream.clone(),
            earliest,
        });
        self.drain_held(peer, &stream);
    }

    pub(super) fn on_resync_done(
        &mut self,
        peer: NodeId,
        peer_epoch: Epoch,
        stream: StreamId,
        upto: Seq,
        now: Millis,
    ) {
        if !self.check_incoming(peer, peer_epoch, &stream) || upto == 0 {
            return;
        }
        let inb = self.inbound.entry(stream.clone()).or_default();
        inb.known_last = inb.known_last.max(upto);
        if inb.behind() {
            self.ask_resync(&stream, now, false);
        }
    }

    /// Asks the author of `stream` for everything after the pending mark,
    /// unless the same was asked less than `resync_retry_ms` ago (or `force`).
    pub(super) fn ask_resync(&mut self, stream: &StreamId, now: Millis, force: bool) {
        if self.peer_epoch(stream.author) != Some(stream.epoch) {
            return;
        }
        let retry = self.config.resync_retry_ms;
        let Some(inb) = self.inbound.get_mut(stream) else {
            return;
        };
        let after = inb.pending;
        if !force
            && let Some((asked, at)) = inb.asked
            && asked == after
            && now < at.plus(retry)
        {
            return;
        }
        inb.asked = Some((after, now));
        self.metrics.resyncs_asked += 1;
        let frame = Frame::Resync {
            stream: stream.clone(),
            after,
        };
        self.send_live(stream.author, frame);
    }

    /// Asks again, at once, for what was dropped for want of room in the
    /// commit queue; call when the queue has just been emptied.
    pub(super) fn ask_starved(&mut self, now: Millis) {
        let starved: Vec<StreamId> = self
            .inbound
            .iter_mut()
            .filter(|(_, i)| i.starved)
            .map(|(s, i)| {
                i.starved = false;
                s.clone()
            })
            .collect();
        for stream in starved {
            self.ask_resync(&stream, now, true);
        }
    }

    /// A commit moved the committed mark of `stream` to at least `mark`.
    pub(super) fn committed_mark(&mut self, stream: &StreamId, mark: Seq) -> bool {
        let inb = self.inbound.entry(stream.clone()).or_default();
        if mark > inb.committed {
            inb.committed = mark;
            inb.pending = inb.pending.max(mark);
            true
        } else {
            false
        }
    }

    /// A commit for `stream` failed: forget what was pending, ask again.
    pub(super) fn roll_back(&mut self, stream: &StreamId, now: Millis) {
        let Some(inb) = self.inbound.get_mut(stream) else {
            return;
        };
        inb.known_last = inb.known_last.max(inb.pending);
        inb.pending = inb.committed;
        let (kept, dropped): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting.inbound)
            .into_iter()
            .partition(|w| w.stream() != stream);
        for w in dropped {
            self.waiting.inbound_bytes -= w.bytes();
        }
        self.waiting.inbound = kept.into();
        self.ask_resync(stream, now, true);
    }
}
