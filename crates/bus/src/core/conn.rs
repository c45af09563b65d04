//! A peer's connection as the core sees it: opened, its Hello, the frames
//! and batches it carries, and its close.

use mesh_protocol::{Epoch, Frame, Mark, NodeId, OpenBatch, PROTOCOL_VERSION, Seq, StreamId};

use super::author::HelloCheck;
use super::commit::{AckWork, Report};
use super::receiver::{Env, Sender};
use super::topics::WentBack;
use super::{BadBatch, CloseReason, ConnId, Core, DropReason, Effect, Millis};

impl Core {
    pub(super) fn on_connected(&mut self, peer: NodeId, conn: ConnId, now: Millis) {
        if peer == self.me || !self.peers.is_peer(peer) {
            let reason = CloseReason::UnknownPeer;
            self.out
                .push(Effect::CloseConnection { peer, conn, reason });
            return;
        }
        self.forget_conn(peer);
        let hello = self.hello_frame(peer);
        self.peers.open(peer, conn, now);
        self.out.send(peer, conn, hello);
    }

    /// Drops the peer's connection state and what was held for it.
    pub(super) fn forget_conn(&mut self, peer: NodeId) {
        self.peers.close(peer);
        self.topics.drop_peer(peer);
        self.author.drop_feed(peer);
        self.receiver.forget_held(peer, None);
    }

    pub(super) fn close(&mut self, peer: NodeId, conn: ConnId, reason: CloseReason) {
        self.out
            .push(Effect::CloseConnection { peer, conn, reason });
        self.forget_conn(peer);
    }

    pub(super) fn on_frame(&mut self, peer: NodeId, conn: ConnId, frame: Frame, now: Millis) {
        if self.peers.live_conn(peer) != Some(conn) {
            self.out.drop(DropReason::StaleConnection);
            return;
        }
        self.out.metrics.frames_in.count(&frame);
        if let Frame::Hello {
            version,
            node,
            epoch,
            marks,
            card,
        } = frame
        {
            self.on_hello(peer, conn, version, node, epoch, marks, now);
            if self.peers.peer_epoch(peer).is_some() {
                self.learn_card(peer, *card);
            }
            return;
        }
        let Some(epoch) = self.peers.peer_epoch(peer) else {
            self.out.drop(DropReason::BeforeHello);
            return;
        };
        let from = Sender { peer, epoch, conn };
        let (config, out) = (&self.config, &mut self.out);
        match frame {
            Frame::Topics {
                topics,
                marks,
                more,
            } => {
                let epoch = self.author.epoch();
                let went_back =
                    self.topics
                        .on_topics(peer, conn, (topics, marks, more), epoch, out);
                for w in went_back {
                    self.topic_went_back(peer, conn, w);
                }
            }
            Frame::Resync { stream, after } if super::topics::topic_of(&stream).is_some() => {
                self.topics.on_resync(peer, &stream, after, out)
            }
            Frame::ResyncGap {
                stream,
                earliest_available,
            } if super::topics::topic_of(&stream).is_some() => {
                let queue = &mut self.committer.inbound;
                self.topics
                    .on_resync_gap(stream, earliest_available, queue, out)
            }
            // A topic stream is never done: a member asks when it lacks something.
            Frame::ResyncDone { stream, .. } if super::topics::topic_of(&stream).is_some() => {}
            Frame::Ack { stream, upto } => {
                if self.author.on_ack(peer, &stream, upto, now, out) {
                    self.note_ack(peer, upto);
                }
            }
            Frame::Resync { stream, after } => self
                .author
                .on_resync(peer, &stream, after, now, config, out),
            Frame::ResyncGap {
                stream,
                earliest_available,
            } => self.on_resync_gap(from, stream, earliest_available),
            Frame::ResyncDone { stream, upto } => self.on_resync_done(from, stream, upto, now),
            Frame::StreamEnded { stream, held } if super::topics::topic_of(&stream).is_some() => {
                let queue = &mut self.committer.inbound;
                self.topics
                    .on_stream_ended((peer, epoch), stream, held, queue, out);
            }
            Frame::StreamEnded { stream, held } => {
                let queue = &mut self.committer.inbound;
                self.receiver
                    .on_stream_ended(from, stream, held, queue, out);
            }
            Frame::Followed {
                stream,
                through,
                agents,
            } => self.on_followed(peer, stream, through, agents),
            Frame::CardQuery { node } => self.on_card_query(peer, node, now),
            Frame::CardAnswer { node, card } => self.on_card_answer(peer, node, card),
            Frame::Batch { .. } => {
                debug_assert!(false, "a batch frame must come as Input::Batch");
                self.out.drop(DropReason::Malformed);
            }
            Frame::Agents { .. } => {
                debug_assert!(false, "an agents frame must come as Input::Agents");
                self.out.drop(DropReason::Malformed);
            }
            Frame::Moves { .. } => {
                debug_assert!(false, "a moves frame must come as Input::Moves");
                self.out.drop(DropReason::Malformed);
            }
            // Handled above.
            Frame::Hello { .. } => {}
        }
    }

    /// The author of `stream` no longer holds anything before
    /// `earliest_available`: the gap goes to the receiver, to be committed.
    fn on_resync_gap(&mut self, from: Sender, stream: StreamId, earliest_available: Seq) {
        let (queue, out) = (&mut self.committer.inbound, &mut self.out);
        let top = self
            .receiver
            .on_resync_gap(from, stream, earliest_available, queue, out);
        self.author.observe_lamport(top);
    }

    /// The author of `stream` has sent everything up to `upto`: the
    /// receiver asks again if it is still behind.
    fn on_resync_done(&mut self, from: Sender, stream: StreamId, upto: Seq, now: Millis) {
        let mut env = Env {
            peers: &self.peers,
            config: &self.config,
            now,
            out: &mut self.out,
        };
        self.receiver.on_resync_done(from, stream, upto, &mut env);
    }

    pub(super) fn on_batch(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        batch: Result<OpenBatch, BadBatch>,
        now: Millis,
    ) {
        if self.peers.live_conn(peer) != Some(conn) {
            self.out.drop(DropReason::StaleConnection);
            return;
        }
        self.out.metrics.frames_in.batch += 1;
        let Some(peer_epoch) = self.peers.peer_epoch(peer) else {
            self.out.drop(DropReason::BeforeHello);
            return;
        };
        let open = match batch {
            Ok(open) => open,
            Err(bad) => return self.out.drop(DropReason::from(bad)),
        };
        if super::topics::topic_of(open.batch().stream()).is_some() {
            let top = open.batch().entries().iter().map(|e| e.lamport).max();
            let queue = &mut self.committer.inbound;
            self.topics.on_batch(peer, conn, open, queue, &mut self.out);
            self.author.observe_lamport(top.unwrap_or(0));
            return;
        }
        let from = Sender {
            peer,
            epoch: peer_epoch,
            conn,
        };
        let mut env = Env {
            peers: &self.peers,
            config: &self.config,
            now,
            out: &mut self.out,
        };
        let queue = &mut self.committer.inbound;
        let top = self.receiver.on_batch(from, open, queue, &mut env);
        self.author.observe_lamport(top);
        if let Some(seq) = self.receiver.take_conflict() {
            // A second writer with the peer's key (a clone) fed this
            // connection: nothing more of it is taken, or the writer's next
            // seqs would pass as the stream's. Its next connection starts
            // with our Hello, whose mark tells the writer its stream forked.
            self.close(peer, conn, CloseReason::Conflict { seq });
        }
    }

    #[allow(clippy::too_many_arguments)] // The fields of one Hello frame, taken apart.
    fn on_hello(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        version: u32,
        node: NodeId,
        epoch: Epoch,
        marks: Vec<Mark>,
        now: Millis,
    ) {
        if version != PROTOCOL_VERSION {
            let reason = CloseReason::VersionMismatch {
                theirs: version,
                ours: PROTOCOL_VERSION,
            };
            return self.close(peer, conn, reason);
        }
        if node != peer {
            return self.close(peer, conn, CloseReason::WrongNode);
        }
        self.report_ended(peer, conn, &marks);
        let check = self.check_hello_mark(peer, &marks);
        let trusted = match check {
            HelloCheck::Trust(m) => Some(m),
            _ => None,
        };
        let reset = self.see_hello_epoch(peer, epoch, trusted);
        self.peers.go_live(peer, epoch);
        // What the peer announced before comes again on this connection,
        // and ours goes before any batch of ours on it.
        self.forget_peer_agents(peer);
        self.announce_to(peer, conn);
        self.announce_moves_to(peer, conn);
        self.follow_on_hello(peer);
        self.topics.announce(peer, conn, &mut self.out);
        let (config, out) = (&self.config, &mut self.out);
        match check {
            HelloCheck::Trust(mark) => self.author.start_feed(peer, conn, mark, now, config, out),
            HelloCheck::Verify { mark, cid } => self
                .author
                .start_verify(peer, conn, mark, cid, reset, now, out),
            HelloCheck::RolledBack { mark } => self.store_went_back(peer, mark),
        }
    }

    /// Tells `peer` on `conn` what this store still holds of the ended
    /// streams it holds more of, and journals what it saw that this store
    /// lost.
    fn report_ended(&mut self, peer: NodeId, conn: ConnId, marks: &[Mark]) {
        for report in self.author.ended_reports(peer, marks) {
            let frame = Frame::StreamEnded {
                stream: report.stream.clone(),
                held: report.held,
            };
            self.out.send(peer, conn, frame);
            self.committer.queue_report(report);
        }
    }

    /// What the mark `peer`'s Hello gives for our current stream to it says:
    /// while a new epoch is under way only a store gone back counts, and
    /// the old stream is fed nothing.
    fn check_hello_mark(&self, peer: NodeId, marks: &[Mark]) -> HelloCheck {
        let check = self
            .author
            .check_hello(peer, self.author.mark_in(peer, marks));
        if !self.author.is_frozen() {
            return check;
        }
        // A new epoch is under way: the old streams are not fed.
        match check {
            c @ HelloCheck::RolledBack { .. } => c,
            _ => HelloCheck::Trust(0),
        }
    }

    /// Records the store `epoch` that `peer`'s Hello names, acknowledging
    /// the `trusted` mark; true if the peer's store changed since it was
    /// last seen (its acked state is then reset).
    fn see_hello_epoch(&mut self, peer: NodeId, epoch: Epoch, trusted: Option<Seq>) -> bool {
        let seen = self.peers.see_epoch(peer, epoch);
        let reset = matches!(seen, Some(Some(_)));
        match seen {
            // A peer whose store is new holds nothing of ours, whatever it
            // acknowledged before: its acked state is reset to what it says
            // now (once its mark is checked), and its earlier epoch's
            // stream to us has ended.
            Some(earlier) => {
                if earlier.is_some() {
                    self.out.metrics.peer_epoch_changes += 1;
                    self.receiver.forget_held(peer, Some(epoch));
                }
                let work = AckWork {
                    upto: trusted.unwrap_or(0),
                    reset: earlier.is_some() && trusted.is_some(),
                    epoch: Some(epoch),
                    ended: earlier,
                };
                self.committer.new_epoch_ack(peer, work);
            }
            None => {
                if let Some(m) = trusted.filter(|m| *m > 0) {
                    self.note_ack(peer, m);
                }
            }
        }
        reset
    }

    /// `peer` (live on `conn`) holds this node's topic stream past what
    /// this store holds: the store went back in time. Of the current
    /// epoch, a new epoch is started as for a direct stream (publishes wait
    /// for it and go on its stream, from seq 1), which journals what was
    /// lost and tells the members; of an earlier epoch, the peer is told it
    /// ended and what it holds past that is journaled.
    fn topic_went_back(&mut self, peer: NodeId, conn: ConnId, w: WentBack) {
        tracing::warn!(
            peer = %peer.fmt_short(),
            held = w.held,
            member = w.world,
            "a member holds more of this node's topic stream than its store: the store went \
             back in time"
        );
        if w.stream.epoch != self.author.epoch() {
            let frame = Frame::StreamEnded {
                stream: w.stream.clone(),
                held: w.held,
            };
            self.out.send(peer, conn, frame);
            self.committer.queue_report(topic_report(&w, None));
        } else if self.committer.switch_waiting() {
            let epoch = self
                .committer
                .waiting_epoch()
                .unwrap_or(self.author.epoch());
            self.committer
                .switch_epoch(epoch, topic_report(&w, Some(epoch)));
        } else if self.committer.switching() {
            // The epoch is being committed: the stream is an ended one once it is.
            self.committer.report_after_switch(topic_report(&w, None));
        } else {
            let epoch = self.author.next_epoch();
            self.committer
                .switch_epoch(epoch, topic_report(&w, Some(epoch)));
            self.author.freeze();
        }
    }

    /// `peer` holds our current stream to it up to `mark`, which this store
    /// never wrote or holds otherwise: the store went back in time (a
    /// restored backup, a clone). A new epoch is started before anything
    /// more is sent; what the peer saw that this store lost is journaled
    /// with it, and the unacknowledged envelopes are carried over.
    pub(super) fn store_went_back(&mut self, peer: NodeId, mark: Seq) {
        tracing::warn!(
            peer = %peer.fmt_short(),
            mark,
            "this node's store went back in time: the peer holds more of our stream than this \
             store wrote, or other envelopes; starting a new epoch"
        );
        if self.committer.switch_waiting() {
            // A new epoch waits for its commit: this stream ends with it too.
            let epoch = self
                .committer
                .waiting_epoch()
                .unwrap_or(self.author.epoch());
            let report = self.author.current_report(peer, mark, epoch);
            self.committer.switch_epoch(epoch, report);
        } else if self.committer.switching() {
            // It is being committed: this stream is an ended one once it is.
            let report = self.author.current_report(peer, mark, self.author.epoch());
            self.committer.report_after_switch(report);
        } else {
            let epoch = self.author.next_epoch();
            let report = self.author.current_report(peer, mark, epoch);
            self.committer.switch_epoch(epoch, report);
            self.author.freeze();
        }
    }

    /// Remembers that `peer` holds everything of our stream up to `upto`.
    pub(super) fn note_ack(&mut self, peer: NodeId, upto: Seq) {
        let last_acked = self.author.own(&peer).map_or(0, |o| o.last_acked);
        self.committer.note_ack(peer, upto, last_acked);
    }

    /// The Hello this node sends `peer`: its committed marks for the
    /// streams `peer` authors, the peer's newest known epoch first.
    pub(super) fn hello_frame(&self, peer: NodeId) -> Frame {
        let marks = self.receiver.hello_marks(peer, self.peers.epoch_seen(peer));
        Frame::Hello {
            version: PROTOCOL_VERSION,
            node: self.me,
            epoch: self.author.epoch(),
            marks,
            card: Box::new(self.own_card.clone()),
        }
    }
}

/// The report of this node's topic stream a member holds more of, ended
/// by the new epoch `new` (if it starts now).
fn topic_report(w: &WentBack, new: Option<Epoch>) -> Report {
    let topic = super::topics::topic_of(&w.stream).map_or_else(String::new, |t| t.to_string());
    let mut detail = format!(
        "this node's store went back in time (a restored backup, or a copy run as a second \
         node): a member of topic {topic} holds this node's stream of it up to seq {}, but this \
         store holds it only up to {}",
        w.world, w.held
    );
    if let Some(e) = new {
        detail.push_str(&format!(
            "; it started store epoch {}, whose stream of the topic the publishes go on, from \
             seq 1",
            e.fmt_short()
        ));
    }
    Report {
        stream: w.stream.clone(),
        held: w.held,
        world: w.world,
        detail,
    }
}
