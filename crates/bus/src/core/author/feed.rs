//! Feeding each peer our stream on its live connection, as far as it acknowledges.

use std::collections::BTreeSet;

use mesh_protocol::{Cid, Frame, NodeId, OpenBatch, Payloads, Seq, StreamId};
use mesh_store::{OwnStream, StoreError, StoredBatch};

use super::{Author, Loaded};
use crate::core::{Config, ConnId, DropReason, Effect, LoadId, Millis, Out};

/// A feed waiting for the read that checks the peer's mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Verify {
    mark: Seq,
    cid: Cid,
    /// The peer's store epoch changed: its ack resets ours.
    reset: bool,
}

/// How far this node's stream to a peer has been sent on the live connection.
///
/// Invariant: `acked <= cursor` is not guaranteed (a peer may claim more
/// than this connection carried, up to what is committed), but nothing is
/// sent past what is committed.
#[derive(Debug)]
pub(super) struct Feed {
    /// The connection the feed belongs to.
    conn: ConnId,
    /// The highest seq handed to the connection (or known to be at the peer).
    cursor: Seq,
    /// The highest seq the peer has acknowledged on this connection.
    acked: Seq,
    /// The outbox read in flight, if any.
    load: Option<LoadId>,
    /// A read failed; try again then.
    retry_at: Option<Millis>,
    /// Send `ResyncDone` once the cursor reaches the end.
    announce_done: bool,
    /// When the peer last made progress (or we started waiting for it).
    progress_at: Millis,
    /// The peer's mark is being checked; nothing is sent until it is.
    verify: Option<Verify>,
}

impl Feed {
    /// A new feed on `conn` from `acked`, checking `verify` first if given.
    fn new(conn: ConnId, acked: Seq, progress_at: Millis, verify: Option<Verify>) -> Feed {
        Feed {
            conn,
            cursor: 0,
            acked,
            load: None,
            retry_at: None,
            announce_done: false,
            progress_at,
            verify,
        }
    }

    /// The next deadline of this feed: a read to retry, or the moment the
    /// peer's silence about outstanding messages makes us resend.
    fn deadline(&self, config: &Config) -> Option<Millis> {
        if self.retry_at.is_some() {
            return self.retry_at;
        }
        (self.verify.is_none() && self.load.is_none() && self.acked < self.cursor)
            .then(|| self.progress_at.plus(config.retransmit_ms))
    }

    /// Whether a freshly committed batch starting at `first` may go out at
    /// once: nothing is being read and the cursor is right before it.
    fn takes_fresh(&self, first: Seq) -> bool {
        self.verify.is_none()
            && self.load.is_none()
            && self.retry_at.is_none()
            && self.cursor.saturating_add(1) == first
    }

    /// Hands one stored batch to the connection, byte for byte as signed.
    fn send_batch(&mut self, peer: NodeId, sb: StoredBatch, now: Millis, out: &mut Out) {
        if self.acked >= self.cursor {
            // Nothing was outstanding: the silence clock starts now.
            self.progress_at = now;
        }
        self.cursor = self.cursor.max(sb.batch.last_seq());
        let frame = Frame::Batch {
            batch: sb.batch,
            payloads: Payloads(sb.payloads),
        };
        out.send(peer, self.conn, frame);
    }

    /// Tells the peer that nothing before `earliest` is held any more.
    fn send_gap(&self, peer: NodeId, own: &OwnStream, earliest: Seq, out: &mut Out) {
        out.metrics.gaps_sent += 1;
        let frame = Frame::ResyncGap {
            stream: own.stream.clone(),
            earliest_available: earliest,
        };
        out.send(peer, self.conn, frame);
    }
}

impl Author {
    /// The peer's Hello came on `conn` with `mark` for our stream: feeds it
    /// from there.
    pub(in crate::core) fn start_feed(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        mark: Seq,
        now: Millis,
        config: &Config,
        out: &mut Out,
    ) {
        if self.frozen {
            return;
        }
        self.feeds
            .insert(peer, Feed::new(conn, mark, Millis::default(), None));
        self.touched.insert(peer);
        out.metrics.resyncs_served += 1;
        self.serve(peer, mark, now, config, out);
    }

    /// The peer's Hello came on `conn` with `mark` for our stream, naming
    /// an envelope the outbox holds: reads it to compare its hash with
    /// `cid` before feeding the peer (nothing is sent until then).
    #[allow(clippy::too_many_arguments)] // One Hello's mark, taken apart.
    pub(in crate::core) fn start_verify(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        mark: Seq,
        cid: Cid,
        reset: bool,
        now: Millis,
        out: &mut Out,
    ) {
        if self.frozen {
            return;
        }
        let verify = Some(Verify { mark, cid, reset });
        self.feeds.insert(peer, Feed::new(conn, 0, now, verify));
        self.touched.insert(peer);
        self.load_verify(peer, out);
    }

    /// Asks for the batch holding the mark a feed verifies.
    fn load_verify(&mut self, peer: NodeId, out: &mut Out) {
        if self.superseding.contains(&peer) {
            return;
        }
        let stream = self.stream_id(peer);
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return;
        };
        let Some(v) = feed.verify else { return };
        let load = LoadId(self.next_load);
        self.next_load += 1;
        feed.load = Some(load);
        feed.retry_at = None;
        out.metrics.loads += 1;
        out.push(Effect::LoadOutbox {
            load,
            peer,
            stream,
            after: v.mark - 1,
            max_bytes: 0,
        });
    }

    /// The peer's mark is verified: feed it from there.
    pub(in crate::core) fn verified(
        &mut self,
        peer: NodeId,
        mark: Seq,
        now: Millis,
        config: &Config,
        out: &mut Out,
    ) {
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return;
        };
        feed.verify = None;
        feed.acked = mark;
        out.metrics.resyncs_served += 1;
        self.serve(peer, mark, now, config, out);
    }

    /// The peer's connection is gone.
    pub(in crate::core) fn drop_feed(&mut self, peer: NodeId) {
        if self.feeds.remove(&peer).is_some() {
            self.touched.insert(peer);
        }
    }

    /// A peer's Ack of `stream` up to `upto`; returns whether it counts
    /// (then the caller records it).
    pub(in crate::core) fn on_ack(
        &mut self,
        peer: NodeId,
        stream: &StreamId,
        upto: Seq,
        now: Millis,
        out: &mut Out,
    ) -> bool {
        let Some(feed) = self.checked_feed(peer, stream, upto, out) else {
            return false;
        };
        if upto > feed.acked {
            feed.acked = upto;
            feed.progress_at = now;
        }
        true
    }

    /// A peer's Resync of `stream` after `after`.
    pub(in crate::core) fn on_resync(
        &mut self,
        peer: NodeId,
        stream: &StreamId,
        after: Seq,
        now: Millis,
        config: &Config,
        out: &mut Out,
    ) {
        if self.checked_feed(peer, stream, after, out).is_none() {
            return;
        }
        // Not an ack: the asker's `after` is its pending mark, which a failed
        // commit can still roll back. Only Ack frames and Hello marks are.
        out.metrics.resyncs_served += 1;
        self.serve(peer, after, now, config, out);
    }

    /// The feed of `peer` if `stream` is ours to it and `seq` is one we sent;
    /// otherwise counts the drop.
    fn checked_feed(
        &mut self,
        peer: NodeId,
        stream: &StreamId,
        seq: Seq,
        out: &mut Out,
    ) -> Option<&mut Feed> {
        if *stream != self.stream_id(peer) {
            out.drop(DropReason::UnknownStream);
            return None;
        }
        let last = self.own.get(&peer).map_or(0, |o| o.next_seq - 1);
        let feed = self.feeds.get_mut(&peer)?;
        // Until the peer's mark is checked, nothing it says of our stream counts.
        if feed.verify.is_some() {
            return None;
        }
        self.touched.insert(peer);
        // The cursor can be ahead of `last`: a read may see a commit whose
        // answer has not come back yet.
        if seq > last.max(feed.cursor) {
            out.drop(DropReason::BogusSeq);
            return None;
        }
        Some(feed)
    }

    /// Starts (or restarts) feeding `peer` our stream after `after`: a gap
    /// first if the outbox no longer reaches back that far.
    fn serve(&mut self, peer: NodeId, after: Seq, now: Millis, config: &Config, out: &mut Out) {
        let own = self.own_view(peer);
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return;
        };
        self.touched.insert(peer);
        feed.cursor = after;
        feed.load = None;
        feed.retry_at = None;
        feed.announce_done = own.next_seq > 1;
        feed.progress_at = now;
        if after.saturating_add(1) < own.first_retained {
            feed.cursor = own.first_retained - 1;
            feed.send_gap(peer, &own, own.first_retained, out);
        }
        self.pump(peer, config, out);
    }

    /// Moves the feed of `peer` on: asks for the next chunk of the outbox,
    /// or says `ResyncDone` once everything committed has been sent.
    fn pump(&mut self, peer: NodeId, config: &Config, out: &mut Out) {
        let own = self.own_view(peer);
        let last = own.next_seq - 1;
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return;
        };
        if feed.verify.is_some() || feed.load.is_some() || feed.retry_at.is_some() {
            return;
        }
        if self.superseding.contains(&peer) {
            // Read once the commit replacing a batch of it has returned.
            return;
        }
        if feed.cursor < last {
            let load = LoadId(self.next_load);
            self.next_load += 1;
            feed.load = Some(load);
            self.touched.insert(peer);
            out.metrics.loads += 1;
            out.push(Effect::LoadOutbox {
                load,
                peer,
                stream: own.stream,
                after: feed.cursor,
                max_bytes: config.catchup_chunk_bytes,
            });
        } else if feed.announce_done {
            feed.announce_done = false;
            let upto = feed.cursor.max(last);
            let frame = Frame::ResyncDone {
                stream: own.stream,
                upto,
            };
            out.send(peer, feed.conn, frame);
        }
    }

    /// Whether no outbox read of `peer`'s feed is in flight or wanted
    /// before it sends (no feed, or one that is idle or caught up).
    pub(super) fn feed_reads_nothing(&self, peer: NodeId) -> bool {
        self.feeds
            .get(&peer)
            .is_none_or(|f| f.load.is_none() && f.verify.is_none())
    }

    /// The commit that replaced batches of the outbox to each of `peers`
    /// returned: their feeds read again.
    pub(in crate::core) fn replaced(
        &mut self,
        peers: BTreeSet<NodeId>,
        config: &Config,
        out: &mut Out,
    ) {
        for peer in peers {
            if !self.superseding.remove(&peer) {
                continue;
            }
            let Some(feed) = self.feeds.get(&peer) else {
                continue;
            };
            if feed.verify.is_some() {
                self.load_verify(peer, out);
            } else {
                self.pump(peer, config, out);
            }
        }
    }

    /// Pumps every feed.
    pub(in crate::core) fn pump_all(&mut self, config: &Config, out: &mut Out) {
        let peers: Vec<NodeId> = self.feeds.keys().copied().collect();
        for peer in peers {
            self.pump(peer, config, out);
        }
    }

    /// The answer to an outbox read: a feed's catch-up (sent, then the feed
    /// moves on), the check of a peer's mark, or envelopes to carry over.
    pub(in crate::core) fn on_loaded(
        &mut self,
        load: LoadId,
        result: Result<Vec<StoredBatch>, StoreError>,
        now: Millis,
        config: &Config,
        out: &mut Out,
    ) -> Loaded {
        if let Some((l, stream)) = self.carry_load.clone()
            && l == load
        {
            self.carry_load = None;
            return self.carry_loaded(stream, result, out);
        }
        let Some(peer) = self
            .feeds
            .iter()
            .find_map(|(id, f)| (f.load == Some(load)).then_some(*id))
        else {
            out.metrics.stale_answers += 1;
            return Loaded::Done;
        };
        let own = self.own_view(peer);
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return Loaded::Done;
        };
        self.touched.insert(peer);
        feed.load = None;
        let batches = match result {
            Ok(b) => b,
            Err(_) => {
                out.metrics.load_failures += 1;
                feed.retry_at = Some(now.plus(config.store_retry_ms));
                return Loaded::Done;
            }
        };
        if let Some(v) = feed.verify {
            let at = batches.iter().find_map(|sb| {
                let i = v.mark.checked_sub(sb.batch.first_seq)?;
                sb.batch.entries.get(usize::try_from(i).ok()?)
            });
            return match at {
                Some(h) if h.payload_cid != v.cid => Loaded::Forked { peer, mark: v.mark },
                // Ours, or evicted since (then acknowledged or given up).
                _ => Loaded::Verified {
                    peer,
                    mark: v.mark,
                    reset: v.reset,
                },
            };
        }
        if self.send_loaded(peer, &own, batches, now, config, out) {
            self.pump(peer, config, out);
        }
        Loaded::Done
    }

    /// Sends the batches of one read past the cursor, with a gap before any
    /// that starts later than the cursor. Returns false if the read held
    /// nothing it should have (the feed then retries later).
    fn send_loaded(
        &mut self,
        peer: NodeId,
        own: &OwnStream,
        batches: Vec<StoredBatch>,
        now: Millis,
        config: &Config,
        out: &mut Out,
    ) -> bool {
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return false;
        };
        let mut cursor = feed.cursor;
        let mut progressed = false;
        for sb in batches {
            let (first, last) = (sb.batch.first_seq, sb.batch.last_seq());
            if sb.batch.author != self.me || last <= cursor {
                continue;
            }
            if first > cursor.saturating_add(1) {
                // Evicted since the counters were read (evict-oldest).
                feed.send_gap(peer, own, first, out);
            }
            feed.send_batch(peer, sb, now, out);
            cursor = last;
            progressed = true;
        }
        self.note_sent(peer, cursor);
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return false;
        };
        if !progressed && cursor < own.next_seq - 1 {
            if cursor.saturating_add(1) < own.first_retained {
                cursor = own.first_retained - 1;
                feed.send_gap(peer, own, own.first_retained, out);
            } else {
                // The store returned nothing it should hold; try later.
                out.metrics.load_failures += 1;
                feed.retry_at = Some(now.plus(config.store_retry_ms));
                return false;
            }
        }
        feed.cursor = feed.cursor.max(cursor);
        true
    }

    /// After its commit: sends a new batch at once if the peer's feed is
    /// exactly caught up to it; otherwise the catch-up will carry it.
    pub(in crate::core) fn send_fresh(
        &mut self,
        to: NodeId,
        batch: OpenBatch,
        now: Millis,
        out: &mut Out,
    ) {
        let Some(feed) = self.feeds.get_mut(&to) else {
            return;
        };
        if !feed.takes_fresh(batch.batch().first_seq()) {
            return;
        }
        self.touched.insert(to);
        let (vb, payloads) = batch.into_parts();
        let sb = StoredBatch {
            batch: vb.into_signed(),
            payloads,
        };
        let last = sb.batch.last_seq();
        feed.send_batch(to, sb, now, out);
        self.note_sent(to, last);
    }

    /// The feed timer of `peer` is due: retries a failed read, then resends
    /// from the peer's last ack if it has been silent too long.
    pub(in crate::core) fn on_feed_timer(
        &mut self,
        peer: NodeId,
        now: Millis,
        config: &Config,
        out: &mut Out,
    ) {
        let Some(feed) = self.feeds.get_mut(&peer) else {
            return;
        };
        self.touched.insert(peer);
        if feed.retry_at.is_some_and(|t| now >= t) {
            feed.retry_at = None;
            if feed.verify.is_some() {
                self.load_verify(peer, out);
                return;
            }
            self.pump(peer, config, out);
        }
        let Some(feed) = self.feeds.get(&peer) else {
            return;
        };
        let silent = now >= feed.progress_at.plus(config.retransmit_ms);
        if feed.load.is_none() && feed.retry_at.is_none() && feed.acked < feed.cursor && silent {
            let from = feed.acked;
            out.metrics.retransmits += 1;
            self.serve(peer, from, now, config, out);
        }
    }

    /// When the feed of `peer` next needs the timer, if it does.
    pub(in crate::core) fn feed_deadline(&self, peer: NodeId, config: &Config) -> Option<Millis> {
        self.feeds.get(&peer)?.deadline(config)
    }

    /// The peers whose feed changed since the last call.
    pub(in crate::core) fn take_touched(&mut self) -> BTreeSet<NodeId> {
        std::mem::take(&mut self.touched)
    }
}
