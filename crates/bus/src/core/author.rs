//! The author side: this node's own streams, signing, and feeding each
//! peer its stream on the live connection (live, catch-up, resync, gaps,
//! retransmit after silence) as far as the peer acknowledges; checking a
//! peer's mark against the store before trusting it (a store that went back
//! in time, or a clone writing the same stream, is found there), and the own
//! streams of ended epochs, whose unacknowledged envelopes are carried over.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{
    Channel, Cid, Epoch, Frame, Mark, NewEnvelope, NodeId, OpenBatch, Payloads, SecretKey, Seq,
    StreamId, VerifyError,
};
use mesh_store::{EndedOwn, OwnStream, StoreError, StoredBatch};

use super::commit::{CarryWork, Report};
use super::{Config, ConnId, DropReason, Effect, LoadId, Millis, Out};

/// A peer's Hello mark for our stream, checked against what is committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HelloCheck {
    /// The mark can be taken as it is (as far as the store can tell).
    Trust(Seq),
    /// The mark names an envelope the outbox holds: compare hashes first.
    Verify { mark: Seq, cid: Cid },
    /// The peer holds more of the stream than this store ever wrote: the
    /// store went back in time.
    RolledBack { mark: Seq },
}

/// What an outbox read brought back besides a feed's catch-up.
#[derive(Debug)]
pub(super) enum Loaded {
    /// Nothing more to do (a catch-up chunk was sent, or the read is stale).
    Done,
    /// The peer's mark names our own envelope: feed it from there.
    Verified {
        peer: NodeId,
        mark: Seq,
        reset: bool,
    },
    /// The peer's mark names another envelope than ours at that seq.
    Forked { peer: NodeId, mark: Seq },
    /// The next envelopes of an ended stream to carry over.
    Carry(CarryWork),
}

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
struct Feed {
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

/// This node's own streams and the feeds that carry them to peers.
///
/// Invariant: a feed exists only for a peer whose Hello came on the
/// connection the feed names.
#[derive(Debug)]
pub(super) struct Author {
    secret: SecretKey,
    me: NodeId,
    epoch: Epoch,
    /// The highest Lamport clock seen or given out.
    lamport: u64,
    /// This node's current-epoch stream to each recipient, as committed.
    own: BTreeMap<NodeId, OwnStream>,
    feeds: BTreeMap<NodeId, Feed>,
    next_load: u64,
    /// Peers whose feed changed since [`Author::take_touched`].
    touched: BTreeSet<NodeId>,
    /// Own streams of earlier epochs of this store.
    ended: BTreeMap<StreamId, EndedOwn>,
    /// The outboxes of ended streams still holding envelopes to carry over.
    old: BTreeMap<StreamId, OwnStream>,
    /// The carry-over read in flight.
    carry_load: Option<(LoadId, StreamId)>,
    /// A new epoch is under way: nothing more goes out on the old streams.
    frozen: bool,
    /// Randomness for new epochs, and how many were made.
    entropy: [u8; 32],
    epochs_made: u64,
}

impl Author {
    /// The author of `secret`'s streams in `epoch`, from the committed
    /// streams (other nodes' and other epochs' are ignored).
    pub(super) fn new(
        secret: SecretKey,
        epoch: Epoch,
        streams: Vec<OwnStream>,
        lamport: u64,
        ended: Vec<EndedOwn>,
        entropy: [u8; 32],
    ) -> Author {
        let me = secret.public();
        let ended: BTreeMap<StreamId, EndedOwn> =
            ended.into_iter().map(|e| (e.stream.clone(), e)).collect();
        let mut own = BTreeMap::new();
        let mut old = BTreeMap::new();
        for o in streams.into_iter().filter(|o| o.stream.author == me) {
            let Channel::Direct(to) = o.stream.channel else {
                continue;
            };
            if o.stream.epoch == epoch {
                own.insert(to, o);
            } else if ended.contains_key(&o.stream) {
                old.insert(o.stream.clone(), o);
            }
        }
        Author {
            secret,
            me,
            epoch,
            lamport,
            own,
            feeds: BTreeMap::new(),
            next_load: 1,
            touched: BTreeSet::new(),
            ended,
            old,
            carry_load: None,
            frozen: false,
            entropy,
            epochs_made: 0,
        }
    }

    /// This node's current store epoch, as the author writes it.
    pub(super) fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// An epoch for this store to start: new with overwhelming likelihood
    /// (drawn from the driver's randomness), never the current one.
    pub(super) fn next_epoch(&mut self) -> Epoch {
        loop {
            self.epochs_made += 1;
            let mut h = blake3::Hasher::new_keyed(&self.entropy);
            h.update(b"agent-mesh/epoch\0");
            h.update(&self.epoch.0);
            h.update(&self.epochs_made.to_le_bytes());
            let mut e = [0u8; 16];
            e.copy_from_slice(&h.finalize().as_bytes()[..16]);
            if Epoch(e) != self.epoch {
                return Epoch(e);
            }
        }
    }

    /// Checks a peer's Hello mark for our current stream to it (`None`: it
    /// names none) against what is committed.
    pub(super) fn check_hello(&self, peer: NodeId, mark: Option<&Mark>) -> HelloCheck {
        let Some(mark) = mark.filter(|m| m.seq > 0) else {
            return HelloCheck::Trust(0);
        };
        let own = self.own_view(peer);
        if mark.seq >= own.next_seq {
            return HelloCheck::RolledBack { mark: mark.seq };
        }
        match mark.cid {
            // A batch evicted is one the peer acknowledged (or a loss it
            // was told of): nothing left to compare.
            Some(cid) if mark.seq >= own.first_retained => HelloCheck::Verify {
                mark: mark.seq,
                cid,
            },
            _ => HelloCheck::Trust(mark.seq),
        }
    }

    /// The ended streams to `peer` it holds more of than this store does:
    /// what to journal as rolled back and tell it (a `StreamEnded` frame).
    pub(super) fn ended_reports(&self, peer: NodeId, marks: &[Mark]) -> Vec<Report> {
        marks
            .iter()
            .filter_map(|m| {
                let e = self.ended.get(&m.stream)?;
                (m.stream.channel == Channel::Direct(peer) && m.seq > e.held).then(|| Report {
                    stream: m.stream.clone(),
                    held: e.held,
                    world: m.seq,
                    detail: rolled_back_detail(peer, e.held, m.seq, None),
                })
            })
            .collect()
    }

    /// The report of our current stream to `peer`, which holds it up to
    /// `world`: the store holds it as the peer has it only up to its acked
    /// mark; a new epoch `epoch` takes over.
    pub(super) fn current_report(&self, peer: NodeId, world: Seq, epoch: Epoch) -> Report {
        let own = self.own_view(peer);
        Report {
            stream: own.stream.clone(),
            held: own.last_acked,
            world,
            detail: rolled_back_detail(peer, own.last_acked, world, Some(epoch)),
        }
    }

    /// Stops every feed: a new epoch is under way, and nothing more goes
    /// out on the old streams.
    pub(super) fn freeze(&mut self) {
        self.frozen = true;
        let peers: Vec<NodeId> = self.feeds.keys().copied().collect();
        for p in peers {
            self.drop_feed(p);
        }
    }

    /// Whether a new epoch is under way.
    pub(super) fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// The new epoch `epoch` is committed: the current streams are ended
    /// (`ended` from the store), those with envelopes left to carry keep
    /// their outbox for it, and the new epoch's streams start empty.
    pub(super) fn switched(&mut self, epoch: Epoch, ended: &[EndedOwn]) {
        for e in ended {
            self.ended.insert(e.stream.clone(), e.clone());
        }
        for (_, o) in std::mem::take(&mut self.own) {
            if o.last_acked + 1 < o.next_seq {
                self.old.insert(o.stream.clone(), o);
            }
        }
        self.epoch = epoch;
        self.frozen = false;
        self.carry_load = None;
    }

    /// Ended streams changed by a commit (carried on, reported).
    pub(super) fn ended_changed(&mut self, ended: &[EndedOwn]) {
        for e in ended {
            self.ended.insert(e.stream.clone(), e.clone());
        }
    }

    /// Whether envelopes of ended streams are still to be carried over
    /// (new sends wait until they are, so they come after them).
    pub(super) fn has_carry(&self) -> bool {
        self.frozen || !self.old.is_empty()
    }

    /// Reads the next envelopes to carry over, unless a read is under way:
    /// the oldest ended stream's, after what is carried.
    pub(super) fn next_carry(&mut self, config: &Config, out: &mut Out) {
        if self.frozen || self.carry_load.is_some() {
            return;
        }
        let Some((stream, o)) = self.old.iter().next() else {
            return;
        };
        let carried = self.ended.get(stream).map_or(o.last_acked, |e| e.carried);
        let after = carried.max(o.first_retained.saturating_sub(1));
        let load = LoadId(self.next_load);
        self.next_load += 1;
        self.carry_load = Some((load, stream.clone()));
        out.metrics.loads += 1;
        let Channel::Direct(peer) = stream.channel else {
            return;
        };
        out.push(Effect::LoadOutbox {
            load,
            peer,
            stream: stream.clone(),
            after,
            max_bytes: config.catchup_chunk_bytes,
        });
    }

    /// A carry-over chunk committed (`Ok`) or not: the next may be read.
    pub(super) fn carry_done(&mut self, from: &StreamId, upto: Seq, ok: bool) {
        if ok
            && let Some(o) = self.old.get(from)
            && upto + 1 >= o.next_seq
        {
            self.old.remove(from);
        }
    }

    /// Turns a carry-over read into the envelopes to re-sign, those after
    /// what is carried of `stream`.
    fn carry_loaded(
        &mut self,
        stream: StreamId,
        result: Result<Vec<StoredBatch>, StoreError>,
        out: &mut Out,
    ) -> Loaded {
        let Ok(batches) = result else {
            out.metrics.load_failures += 1;
            return Loaded::Done;
        };
        let Some(o) = self.old.get(&stream) else {
            return Loaded::Done;
        };
        let carried = self.ended.get(&stream).map_or(o.last_acked, |e| e.carried);
        let Channel::Direct(to) = stream.channel else {
            return Loaded::Done;
        };
        let mut envelopes = Vec::new();
        for sb in batches {
            for (i, (h, p)) in sb.batch.entries.iter().zip(sb.payloads).enumerate() {
                let seq = sb.batch.first_seq + i as u64;
                if seq > carried {
                    envelopes.push((
                        seq,
                        NewEnvelope {
                            lamport: 0,
                            created_ms: h.created_ms,
                            kind: h.kind,
                            payload: p,
                        },
                    ));
                }
            }
        }
        // Empty: nothing retained past what is carried (evicted under
        // evict-oldest, with its loss record); the ended outbox just goes.
        Loaded::Carry(CarryWork {
            from: stream,
            to,
            envelopes,
        })
    }

    /// This node's current-epoch stream to `to`.
    pub(super) fn stream_id(&self, to: NodeId) -> StreamId {
        StreamId::direct(self.me, self.epoch, to)
    }

    /// The committed state of the stream to `to` (`None` before its first message).
    pub(super) fn own(&self, to: &NodeId) -> Option<&OwnStream> {
        self.own.get(to)
    }

    /// The committed state of the stream to `to`, empty before its first message.
    pub(super) fn own_view(&self, to: NodeId) -> OwnStream {
        self.own
            .get(&to)
            .cloned()
            .unwrap_or_else(|| OwnStream::empty(self.stream_id(to)))
    }

    /// The Lamport clock moves past one seen on a peer's envelope.
    pub(super) fn observe_lamport(&mut self, lamport: u64) {
        self.lamport = self.lamport.max(lamport);
    }

    /// A commit wrote these own streams (other nodes' and epochs' are ignored).
    pub(super) fn committed(&mut self, streams: &[OwnStream]) {
        for o in streams {
            if let Channel::Direct(to) = o.stream.channel
                && o.stream.author == self.me
                && o.stream.epoch == self.epoch
            {
                debug_assert_eq!(o.broken(), None, "{o:?}");
                // A commit only moves a stream on: seqs are never reused.
                debug_assert!(
                    self.own
                        .get(&to)
                        .is_none_or(|was| was.next_seq <= o.next_seq)
                );
                self.own.insert(to, o.clone());
            }
        }
    }

    /// Signs `envelopes` (without lamports yet) as the batch of the stream
    /// to `to` starting at `first_seq`, each with the next Lamport clock.
    pub(super) fn sign(
        &mut self,
        to: NodeId,
        first_seq: Seq,
        envelopes: impl IntoIterator<Item = NewEnvelope>,
    ) -> Result<OpenBatch, VerifyError> {
        let envelopes = envelopes
            .into_iter()
            .map(|e| {
                self.lamport = self.lamport.saturating_add(1);
                NewEnvelope {
                    lamport: self.lamport,
                    ..e
                }
            })
            .collect();
        OpenBatch::sign(
            &self.secret,
            self.epoch,
            Channel::Direct(to),
            first_seq,
            envelopes,
        )
    }

    /// The mark `marks` (a peer's Hello) holds for our current stream to `peer`.
    pub(super) fn mark_in<'m>(&self, peer: NodeId, marks: &'m [Mark]) -> Option<&'m Mark> {
        let mine = self.stream_id(peer);
        marks.iter().find(|m| m.stream == mine)
    }

    /// The peer's Hello came on `conn` with `mark` for our stream: feeds it
    /// from there.
    pub(super) fn start_feed(
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
        let feed = Feed {
            conn,
            cursor: 0,
            acked: mark,
            load: None,
            retry_at: None,
            announce_done: false,
            progress_at: Millis::default(),
            verify: None,
        };
        self.feeds.insert(peer, feed);
        self.touched.insert(peer);
        out.metrics.resyncs_served += 1;
        self.serve(peer, mark, now, config, out);
    }

    /// The peer's Hello came on `conn` with `mark` for our stream, naming
    /// an envelope the outbox holds: reads it to compare its hash with
    /// `cid` before feeding the peer (nothing is sent until then).
    #[allow(clippy::too_many_arguments)] // One Hello's mark, taken apart.
    pub(super) fn start_verify(
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
        let feed = Feed {
            conn,
            cursor: 0,
            acked: 0,
            load: None,
            retry_at: None,
            announce_done: false,
            progress_at: now,
            verify: Some(Verify { mark, cid, reset }),
        };
        self.feeds.insert(peer, feed);
        self.touched.insert(peer);
        self.load_verify(peer, out);
    }

    /// Asks for the batch holding the mark a feed verifies.
    fn load_verify(&mut self, peer: NodeId, out: &mut Out) {
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
    pub(super) fn verified(
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
    pub(super) fn drop_feed(&mut self, peer: NodeId) {
        if self.feeds.remove(&peer).is_some() {
            self.touched.insert(peer);
        }
    }

    /// A peer's Ack of `stream` up to `upto`; returns whether it counts
    /// (then the caller records it).
    pub(super) fn on_ack(
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
    pub(super) fn on_resync(
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

    /// Pumps every feed.
    pub(super) fn pump_all(&mut self, config: &Config, out: &mut Out) {
        let peers: Vec<NodeId> = self.feeds.keys().copied().collect();
        for peer in peers {
            self.pump(peer, config, out);
        }
    }

    /// The answer to an outbox read: a feed's catch-up (sent, then the feed
    /// moves on), the check of a peer's mark, or envelopes to carry over.
    pub(super) fn on_loaded(
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
    pub(super) fn send_fresh(&mut self, to: NodeId, batch: OpenBatch, now: Millis, out: &mut Out) {
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
        feed.send_batch(to, sb, now, out);
    }

    /// The feed timer of `peer` is due: retries a failed read, then resends
    /// from the peer's last ack if it has been silent too long.
    pub(super) fn on_feed_timer(
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
    pub(super) fn feed_deadline(&self, peer: NodeId, config: &Config) -> Option<Millis> {
        self.feeds.get(&peer)?.deadline(config)
    }

    /// The peers whose feed changed since the last call.
    pub(super) fn take_touched(&mut self) -> BTreeSet<NodeId> {
        std::mem::take(&mut self.touched)
    }
}

/// The sentence of a rolled-back stream's record, for a person.
fn rolled_back_detail(peer: NodeId, held: Seq, world: Seq, new: Option<Epoch>) -> String {
    let mut d = format!(
        "this node's store went back in time (a restored backup, or a copy run as a second \
         node): peer {} holds this stream up to seq {world}, but this store holds it as the \
         peer has it only up to {held}",
        peer.fmt_short()
    );
    if let Some(e) = new {
        d.push_str(&format!(
            "; it started store epoch {}, and re-sends what the peer never acknowledged \
             there from seq 1",
            e.fmt_short()
        ));
    }
    d
}
