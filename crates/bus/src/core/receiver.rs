//! The receiver side: sequence peers' batches against the marks, hold early
//! ones, record gaps, ask for what is missing.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{
    Channel, Cid, Epoch, Frame, MAX_HELLO_MARKS, Mark, NodeId, OpenBatch, Seq, StreamId,
};

use super::commit::{InboundQueue, InboundWork};
use super::peers::Peers;
use super::{Config, ConnId, DropReason, Millis, Out, REORDER_BYTES_MAX, REORDER_ENVELOPES_MAX};

/// The receiver state of one stream.
///
/// Invariants: `committed <= pending`, `pending <= known_last` once
/// `roll_back` or a gap ran (and `known_last` only grows); `held_bytes` is
/// the payload bytes of `held`, every one of which starts past `pending + 1`.
#[derive(Debug, Default)]
struct Inbound {
    /// Every envelope up to here is committed.
    committed: Seq,
    /// The payload hash of the envelope at `committed`, if known.
    committed_cid: Option<Cid>,
    /// A conflict with what is committed was found (and queued to be journaled).
    conflicted: bool,
    /// The highest seq journaled as rolled back by the author.
    rolled_back_to: Seq,
    /// Every envelope up to here is committed or in a commit under way.
    pending: Seq,
    /// The payload hash of the envelope at `pending`, if known: a batch
    /// from a second writer that overlaps what is queued but not yet
    /// committed is a conflict too, not a duplicate.
    pending_cid: Option<Cid>,
    /// Verified batches that start past `pending + 1`, by first seq.
    held: BTreeMap<Seq, OpenBatch>,
    held_bytes: u64,
    /// The highest seq the author is known to have.
    known_last: Seq,
    /// The last `Resync` asked: its `after` and when.
    asked: Option<(Seq, Millis)>,
    /// The batch that followed the pending mark was dropped for want of
    /// room in the commit queue: ask for it again as soon as a commit
    /// empties the queue, not a resync interval later.
    starved: bool,
}

impl Inbound {
    /// A stream committed up to `mark`, whose envelope there has `cid`.
    fn at(mark: Seq, cid: Option<Cid>) -> Inbound {
        Inbound {
            committed: mark,
            committed_cid: cid,
            pending: mark,
            pending_cid: cid,
            known_last: mark,
            ..Inbound::default()
        }
    }

    /// Where `open` carries another envelope than the one this node holds
    /// at its committed or its pending mark: (that seq, ours, theirs).
    fn conflict_in(&self, open: &OpenBatch) -> Option<(Seq, Cid, Cid)> {
        let (first, last) = (open.batch().first_seq(), open.batch().last_seq());
        [
            (self.committed, self.committed_cid),
            (self.pending, self.pending_cid),
        ]
        .into_iter()
        .filter(|(seq, _)| first <= *seq && *seq <= last)
        .find_map(|(seq, ours)| {
            let ours = ours?;
            let at = usize::try_from(seq - first).ok()?;
            let theirs = open.batch().entries().get(at)?.payload_cid;
            (theirs != ours).then_some((seq, ours, theirs))
        })
    }

    /// The author has envelopes this node has neither committed nor pending.
    fn behind(&self) -> bool {
        self.known_last > self.pending
    }

    /// Drops the early batches (the connection they came on is gone).
    fn forget_held(&mut self) {
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

    fn check(&self) {
        debug_assert!(
            self.committed <= self.pending && self.pending <= self.known_last,
            "{self:?}"
        );
        debug_assert_eq!(
            self.held_bytes,
            self.held
                .values()
                .map(|b| b.batch().payload_bytes())
                .sum::<u64>(),
        );
    }
}

/// The peer a frame came from, with the store epoch its Hello announced
/// and the connection it came on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sender {
    pub(super) peer: NodeId,
    pub(super) epoch: Epoch,
    pub(super) conn: ConnId,
}

/// What a receiver step reads besides its own state, and where its frames
/// and counts go.
pub(super) struct Env<'a> {
    pub(super) peers: &'a Peers,
    pub(super) config: &'a Config,
    pub(super) now: Millis,
    pub(super) out: &'a mut Out,
}

/// The streams this node receives, by stream.
#[derive(Debug)]
pub(super) struct Receiver {
    me: NodeId,
    streams: BTreeMap<StreamId, Inbound>,
    /// Streams whose state changed since [`Receiver::take_touched`].
    touched: BTreeSet<StreamId>,
    /// The seq of the last batch's conflict, until [`Receiver::take_conflict`].
    conflict: Option<Seq>,
}

impl Receiver {
    /// The receiver of node `me`, from its committed marks.
    pub(super) fn new(me: NodeId, marks: Vec<Mark>) -> Receiver {
        let streams = marks
            .into_iter()
            .map(|m| (m.stream, Inbound::at(m.seq, m.cid)))
            .collect();
        Receiver {
            me,
            streams,
            touched: BTreeSet::new(),
            conflict: None,
        }
    }

    /// The seq at which the last batch conflicted, if it did (another
    /// envelope there than the one committed or queued to be).
    pub(super) fn take_conflict(&mut self) -> Option<Seq> {
        self.conflict.take()
    }

    /// The committed mark of `stream` (0 if none).
    pub(super) fn mark(&self, stream: &StreamId) -> Seq {
        self.streams.get(stream).map_or(0, |i| i.committed)
    }

    /// The state of `stream`, made if new, marked as changed.
    fn inbound(&mut self, stream: &StreamId) -> &mut Inbound {
        if !self.touched.contains(stream) {
            self.touched.insert(stream.clone());
        }
        self.streams.entry(stream.clone()).or_default()
    }

    /// The marks this node's Hello to `peer` carries: its committed marks
    /// for the streams `peer` writes to it, the epoch `newest` first.
    pub(super) fn hello_marks(&self, peer: NodeId, newest: Option<Epoch>) -> Vec<Mark> {
        let mut marks: Vec<Mark> = self
            .streams
            .iter()
            .filter(|(s, i)| {
                s.author == peer && s.channel == Channel::Direct(self.me) && i.committed > 0
            })
            .map(|(s, i)| Mark {
                stream: s.clone(),
                seq: i.committed,
                cid: i.committed_cid,
            })
            .collect();
        // Only the newest epoch's mark matters to the peer; keep it if cut.
        marks.sort_by_key(|m| Some(m.stream.epoch) != newest);
        marks.truncate(MAX_HELLO_MARKS);
        marks
    }

    /// Drops what is held of `peer`'s streams, except those of epoch `keep`.
    pub(super) fn forget_held(&mut self, peer: NodeId, keep: Option<Epoch>) {
        for (stream, inb) in self.streams.iter_mut() {
            if stream.author == peer && Some(stream.epoch) != keep {
                inb.forget_held();
                self.touched.insert(stream.clone());
            }
        }
    }

    /// Marks every stream of `peer` as changed (its connection did).
    pub(super) fn touch_author(&mut self, peer: NodeId) {
        for stream in self.streams.keys() {
            if stream.author == peer {
                self.touched.insert(stream.clone());
            }
        }
    }

    /// Checks that `stream` is one `peer` may feed this node on its live
    /// connection: authored by `peer`, in the epoch it announced, to us.
    fn check_incoming(&self, from: Sender, stream: &StreamId, out: &mut Out) -> bool {
        let reason = if stream.author != from.peer {
            DropReason::WrongAuthor
        } else if stream.channel != Channel::Direct(self.me) {
            DropReason::WrongRecipient
        } else if stream.epoch != from.epoch {
            DropReason::StaleEpoch
        } else {
            return true;
        };
        out.drop(reason);
        false
    }

    /// A verified batch `from` a peer: queued for the next commit if it
    /// follows the pending mark, held if it is early, dropped if it is old.
    /// Returns the highest Lamport clock of what was queued (0 if nothing).
    pub(super) fn on_batch(
        &mut self,
        from: Sender,
        open: OpenBatch,
        queue: &mut InboundQueue,
        env: &mut Env<'_>,
    ) -> u64 {
        let stream = open.batch().stream().clone();
        if !self.check_incoming(from, &stream, env.out) {
            return 0;
        }
        let (first, last) = (open.batch().first_seq(), open.batch().last_seq());
        let inb = self.inbound(&stream);
        if let Some((seq, ours, theirs)) = inb.conflict_in(&open) {
            // Two writers used one (author, epoch, seq): never a duplicate.
            env.out.drop(DropReason::Conflict);
            if !inb.conflicted && queue.has_room(0) {
                inb.conflicted = true;
                env.out.metrics.conflicts += 1;
                queue.push(InboundWork::Conflict {
                    stream,
                    seq,
                    ours,
                    theirs,
                });
            }
            self.conflict = Some(seq);
            return 0;
        }
        inb.known_last = inb.known_last.max(last);
        if last <= inb.pending {
            env.out.drop(DropReason::Duplicate);
            env.out.metrics.duplicate_envelopes += last - first + 1;
            // Our ack may have been lost: say again what is committed.
            if inb.committed >= last {
                let upto = inb.committed;
                send_live(env.peers, from.peer, Frame::Ack { stream, upto }, env.out);
            }
            return 0;
        }
        if first > inb.pending.saturating_add(1) {
            let bytes = open.batch().payload_bytes();
            if last - inb.pending > REORDER_ENVELOPES_MAX
                || inb.held_bytes + bytes > REORDER_BYTES_MAX
            {
                env.out.drop(DropReason::OutsideWindow);
            } else if let Entry::Vacant(slot) = inb.held.entry(first) {
                slot.insert(open);
                inb.held_bytes += bytes;
                env.out.metrics.batches_held += 1;
            }
            self.ask_resync(&stream, false, env);
            return 0;
        }
        let Some(top) = self.queue_accept(from, &stream, open, queue, env.out) else {
            return 0;
        };
        top.max(self.drain_held(from, &stream, queue, env.out))
    }

    /// Queues the part of `open` above the pending mark for the next commit.
    /// `open` must reach past the pending mark and start at most one above it.
    /// Returns its highest Lamport clock, or `None` if the queue was full
    /// (the batch is dropped and counted).
    fn queue_accept(
        &mut self,
        from_peer: Sender,
        stream: &StreamId,
        open: OpenBatch,
        queue: &mut InboundQueue,
        out: &mut Out,
    ) -> Option<u64> {
        let bytes = open.batch().payload_bytes();
        let inb = self.inbound(stream);
        if !queue.has_room(bytes) {
            out.drop(DropReason::QueueFull);
            inb.starved = true;
            return None;
        }
        let from = inb.pending.saturating_add(1);
        let (first, last) = (open.batch().first_seq(), open.batch().last_seq());
        out.metrics.duplicate_envelopes += from - first;
        out.metrics.batches_accepted += 1;
        let top = open
            .batch()
            .entries()
            .iter()
            .map(|e| e.lamport)
            .max()
            .unwrap_or(0);
        inb.pending = last;
        inb.pending_cid = open.batch().entries().last().map(|e| e.payload_cid);
        inb.check();
        queue.push(InboundWork::Accept {
            peer: from_peer.peer,
            conn: from_peer.conn,
            from,
            batch: open,
        });
        Some(top)
    }

    /// Queues every held batch that now follows the pending mark; returns
    /// the highest Lamport clock queued (0 if none).
    fn drain_held(
        &mut self,
        from: Sender,
        stream: &StreamId,
        queue: &mut InboundQueue,
        out: &mut Out,
    ) -> u64 {
        let mut top = 0;
        loop {
            let inb = self.inbound(stream);
            inb.trim_held();
            let Some(entry) = inb.held.first_entry() else {
                return top;
            };
            if *entry.key() > inb.pending.saturating_add(1) {
                return top;
            }
            let open = entry.remove();
            inb.held_bytes -= open.batch().payload_bytes();
            match self.queue_accept(from, stream, open, queue, out) {
                Some(t) => top = top.max(t),
                None => return top,
            }
        }
    }

    /// The author of `stream` no longer holds anything before `earliest`.
    pub(super) fn on_resync_gap(
        &mut self,
        from: Sender,
        stream: StreamId,
        earliest: Seq,
        queue: &mut InboundQueue,
        out: &mut Out,
    ) -> u64 {
        if !self.check_incoming(from, &stream, out) {
            return 0;
        }
        let inb = self.inbound(&stream);
        if earliest <= inb.pending.saturating_add(1) {
            // Nothing we lack is gone (a stale or repeated answer).
            return 0;
        }
        if queue.is_full() {
            out.drop(DropReason::QueueFull);
            return 0;
        }
        inb.pending = earliest - 1;
        inb.pending_cid = None;
        inb.known_last = inb.known_last.max(inb.pending);
        queue.push(InboundWork::Gap {
            peer: from.peer,
            conn: from.conn,
            stream: stream.clone(),
            earliest,
        });
        self.drain_held(from, &stream, queue, out)
    }

    /// The author of `stream` has sent everything up to `upto`.
    pub(super) fn on_resync_done(
        &mut self,
        from: Sender,
        stream: StreamId,
        upto: Seq,
        env: &mut Env<'_>,
    ) {
        if !self.check_incoming(from, &stream, env.out) || upto == 0 {
            return;
        }
        let inb = self.inbound(&stream);
        inb.known_last = inb.known_last.max(upto);
        if inb.behind() {
            self.ask_resync(&stream, false, env);
        }
    }

    /// Asks the author of `stream` for everything after the pending mark,
    /// unless the same was asked less than `resync_retry_ms` ago (or `force`).
    pub(super) fn ask_resync(&mut self, stream: &StreamId, force: bool, env: &mut Env<'_>) {
        let linked = env.peers.peer_epoch(stream.author) == Some(stream.epoch);
        if !linked || !self.streams.contains_key(stream) {
            return;
        }
        let inb = self.inbound(stream);
        let after = inb.pending;
        if !force
            && let Some((asked, at)) = inb.asked
            && asked == after
            && env.now < at.plus(env.config.resync_retry_ms)
        {
            return;
        }
        inb.asked = Some((after, env.now));
        env.out.metrics.resyncs_asked += 1;
        let frame = Frame::Resync {
            stream: stream.clone(),
            after,
        };
        send_live(env.peers, stream.author, frame, env.out);
    }

    /// The resync timer of `stream` is due: asks again if it still lacks something.
    pub(super) fn on_resync_timer(&mut self, stream: &StreamId, env: &mut Env<'_>) {
        let now = env.now;
        let deadline = self.resync_deadline(stream, now, env.config);
        if deadline.is_some_and(|t| t <= now) {
            self.ask_resync(stream, false, env);
        }
    }

    /// When `stream` is to be asked for again, if it lacks something
    /// (whether its author is connected is the caller's to check).
    pub(super) fn resync_deadline(
        &self,
        stream: &StreamId,
        now: Millis,
        config: &Config,
    ) -> Option<Millis> {
        let inb = self.streams.get(stream)?;
        inb.behind().then(|| {
            inb.asked
                .map_or(now, |(_, t)| t.plus(config.resync_retry_ms))
        })
    }

    /// Asks again, at once, for what was dropped for want of room in the
    /// commit queue; call when the queue has just been emptied.
    pub(super) fn ask_starved(&mut self, env: &mut Env<'_>) {
        let starved: Vec<StreamId> = self
            .streams
            .iter_mut()
            .filter(|(_, i)| i.starved)
            .map(|(s, i)| {
                i.starved = false;
                s.clone()
            })
            .collect();
        for stream in starved {
            self.ask_resync(&stream, true, env);
        }
    }

    /// A commit moved the committed mark of `stream` to at least `mark`,
    /// where the envelope has `cid` (`None` after a gap); returns whether
    /// it moved (then the author is owed an ack).
    pub(super) fn committed(&mut self, stream: &StreamId, mark: Seq, cid: Option<Cid>) -> bool {
        let inb = self.inbound(stream);
        if mark > inb.committed {
            inb.committed = mark;
            inb.committed_cid = cid;
            if mark >= inb.pending {
                inb.pending = mark;
                inb.pending_cid = cid;
            }
            inb.check();
            true
        } else {
            false
        }
    }

    /// A conflict's record did not commit: the next conflicting batch queues it again.
    pub(super) fn conflict_unrecorded(&mut self, stream: &StreamId) {
        if let Some(inb) = self.streams.get_mut(stream) {
            inb.conflicted = false;
        }
    }

    /// The author says its `stream` (of an epoch it no longer writes) ended
    /// with `held` as this node may have it: if this node holds more, the
    /// author's store lost it, which is journaled (once per range).
    pub(super) fn on_stream_ended(
        &mut self,
        from: Sender,
        stream: StreamId,
        held: Seq,
        queue: &mut InboundQueue,
        out: &mut Out,
    ) {
        let reason = if stream.author != from.peer {
            Some(DropReason::WrongAuthor)
        } else if stream.channel != Channel::Direct(self.me) {
            Some(DropReason::WrongRecipient)
        } else if stream.epoch == from.epoch {
            // The author's current stream has not ended.
            Some(DropReason::UnknownStream)
        } else {
            None
        };
        if let Some(r) = reason {
            out.drop(r);
            return;
        }
        let Some(inb) = self.streams.get_mut(&stream) else {
            return;
        };
        let from_seq = held.max(inb.rolled_back_to) + 1;
        if inb.committed < from_seq || !queue.has_room(0) {
            return;
        }
        inb.rolled_back_to = inb.committed;
        queue.push(InboundWork::RolledBack {
            stream,
            from: from_seq,
            to: inb.committed,
        });
    }

    /// A rolled-back record did not commit: the author's next word queues it again.
    pub(super) fn rolled_back_unrecorded(&mut self, stream: &StreamId, from: Seq) {
        if let Some(inb) = self.streams.get_mut(stream) {
            inb.rolled_back_to = inb.rolled_back_to.min(from.saturating_sub(1));
        }
    }

    /// A commit for `stream` failed: forget what was pending, ask again.
    pub(super) fn roll_back(
        &mut self,
        stream: &StreamId,
        queue: &mut InboundQueue,
        env: &mut Env<'_>,
    ) {
        if !self.streams.contains_key(stream) {
            return;
        }
        let inb = self.inbound(stream);
        inb.known_last = inb.known_last.max(inb.pending);
        inb.pending = inb.committed;
        inb.pending_cid = inb.committed_cid;
        queue.remove_stream(stream);
        self.ask_resync(stream, true, env);
    }

    /// The streams whose state changed since the last call; each is
    /// checked against its invariants (in debug builds).
    pub(super) fn take_touched(&mut self) -> BTreeSet<StreamId> {
        let touched = std::mem::take(&mut self.touched);
        if cfg!(debug_assertions) {
            for stream in &touched {
                if let Some(inb) = self.streams.get(stream) {
                    inb.check();
                }
            }
        }
        touched
    }
}

/// Sends on the peer's live connection, if there is one.
pub(super) fn send_live(peers: &Peers, peer: NodeId, frame: Frame, out: &mut Out) {
    if let Some(conn) = peers.live_conn(peer) {
        out.send(peer, conn, frame);
    }
}
