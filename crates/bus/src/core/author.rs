//! The author side: local sends, the outbox policy pre-check, feeding a
//! peer its stream (live, catch-up, resync, gaps) and the peer's acks.

use mesh_protocol::{
    Epoch, Frame, Mark, NodeId, OpenBatch, PROTOCOL_VERSION, Payloads, Seq, StreamId,
};
use mesh_store::{OnFull, OwnStream, StoreError, StoredBatch};

use super::commit::{AckWork, WaitingSend};
use super::{
    CloseReason, ConnId, Core, Effect, Feed, LoadId, Millis, PAYLOAD_BYTES_MAX, ReqId, SendError,
    WAITING_SEND_BYTES_MAX, WAITING_SENDS_MAX,
};

impl Core {
    /// This node's current-epoch stream to `to`.
    pub(super) fn own_stream_id(&self, to: NodeId) -> StreamId {
        StreamId::direct(self.me, self.epoch, to)
    }

    /// The committed state of this node's stream to `to` (empty before its
    /// first message).
    pub(super) fn own_view(&self, to: NodeId) -> OwnStream {
        self.own.get(&to).cloned().unwrap_or_else(|| OwnStream {
            stream: self.own_stream_id(to),
            next_seq: 1,
            first_retained: 1,
            last_acked: 0,
            msgs: 0,
            bytes: 0,
        })
    }

    pub(super) fn on_send(
        &mut self,
        req: ReqId,
        to: NodeId,
        kind: u16,
        payload: Vec<u8>,
        now: Millis,
    ) {
        if let Err(e) = self.check_send(to, payload.len() as u64) {
            self.metrics.sends_refused += 1;
            self.effects.push_back(Effect::Reply {
                req,
                result: Err(e),
            });
            return;
        }
        let len = payload.len() as u64;
        self.waiting.send_bytes += len;
        let q = self.waiting.queued.entry(to).or_default();
        q.0 += 1;
        q.1 += len;
        self.waiting.sends.push_back(WaitingSend {
            req,
            to,
            kind,
            payload,
            created_ms: now.0,
        });
    }

    /// Refuses a send early: a bad request, a full queue, or (under
    /// `reject`) an outbox that cannot take it. The store checks again.
    fn check_send(&self, to: NodeId, len: u64) -> Result<(), SendError> {
        if to == self.me {
            return Err(SendError::ToSelf);
        }
        if !self.peers.contains_key(&to) {
            return Err(SendError::UnknownPeer(to.fmt_short().to_string()));
        }
        let bounds = self.config.outbox;
        let max = PAYLOAD_BYTES_MAX.min(bounds.max_bytes);
        if len > max {
            return Err(SendError::TooLarge { len, max });
        }
        if self.waiting.sends.len() >= WAITING_SENDS_MAX
            || self.waiting.send_bytes + len > WAITING_SEND_BYTES_MAX
        {
            return Err(SendError::Busy {
                waiting: self.waiting.sends.len(),
            });
        }
        if bounds.on_full == OnFull::EvictOldest {
            return Ok(());
        }
        let own = self.own_view(to);
        let acked = own.last_acked.max(self.ack_in_progress(to));
        // Retained and unacknowledged: seqs above both the ack and the eviction point.
        let unacked_msgs = (own.next_seq - 1).saturating_sub(acked.max(own.first_retained - 1));
        // Bytes are known per stream only; they are all unacknowledged if no
        // retained seq is acknowledged, and otherwise unknown (0 is a lower bound).
        let unacked_bytes = if acked < own.first_retained {
            own.bytes
        } else {
            0
        };
        let (qm, qb) = self.waiting.queued.get(&to).copied().unwrap_or_default();
        let msgs = unacked_msgs + qm;
        let bytes = unacked_bytes + qb;
        if msgs + 1 > bounds.max_msgs || bytes + len > bounds.max_bytes {
            return Err(SendError::OutboxFull {
                peer: to.fmt_short().to_string(),
                msgs,
                bytes,
            });
        }
        Ok(())
    }

    /// The highest ack of `to` waiting for or in the current commit (0 if none, or a reset).
    fn ack_in_progress(&self, to: NodeId) -> Seq {
        let waiting = self.waiting.acks.get(&to);
        let flying = self.in_flight.as_ref().and_then(|f| f.ack_for(to));
        [waiting, flying]
            .into_iter()
            .flatten()
            .filter(|w| !w.reset)
            .map(|w| w.upto)
            .max()
            .unwrap_or(0)
    }

    /// Remembers that `peer` holds everything of our stream up to `upto`.
    pub(super) fn note_ack(&mut self, peer: NodeId, upto: Seq) {
        if let Some(w) = self.waiting.acks.get_mut(&peer) {
            w.upto = w.upto.max(upto);
            return;
        }
        let own = self.own_view(peer);
        if upto > own.last_acked && upto > self.ack_in_progress(peer) {
            self.waiting.acks.insert(
                peer,
                AckWork {
                    upto,
                    reset: false,
                    epoch: None,
                },
            );
        }
    }

    #[allow(clippy::too_many_arguments)] // The fields of one Hello frame, taken apart.
    pub(super) fn on_hello(
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
            self.close(peer, conn, reason);
            return;
        }
        if node != peer {
            self.close(peer, conn, CloseReason::WrongNode);
            return;
        }
        let mine = self.own_stream_id(peer);
        let mark = marks.iter().find(|m| m.stream == mine).map_or(0, |m| m.seq);
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.epoch_seen != Some(epoch) {
            // A peer whose store is new holds nothing of ours, whatever it
            // acknowledged before: its acked state is reset to what it says now.
            let reset = p.epoch_seen.is_some();
            p.epoch_seen = Some(epoch);
            if reset {
                self.metrics.peer_epoch_changes += 1;
                for (stream, inb) in self.inbound.iter_mut() {
                    if stream.author == peer && stream.epoch != epoch {
                        inb.forget_held();
                    }
                }
            }
            self.waiting.acks.insert(
                peer,
                AckWork {
                    upto: mark,
                    reset,
                    epoch: Some(epoch),
                },
            );
        } else if mark > 0 {
            self.note_ack(peer, mark);
        }
        if let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) {
            c.peer_epoch = Some(epoch);
            c.feed = Feed {
                acked: mark,
                ..Feed::default()
            };
        }
        self.metrics.resyncs_served += 1;
        self.serve(peer, mark, now);
    }

    pub(super) fn on_ack(&mut self, peer: NodeId, stream: StreamId, upto: Seq, now: Millis) {
        let Some(feed) = self.checked_feed(peer, &stream, upto) else {
            return;
        };
        if upto > feed.acked {
            feed.acked = upto;
            feed.progress_at = now;
        }
        self.note_ack(peer, upto);
    }

    pub(super) fn on_resync(&mut self, peer: NodeId, stream: StreamId, after: Seq, now: Millis) {
        if self.checked_feed(peer, &stream, after).is_none() {
            return;
        }
        // Not an ack: the asker's `after` is its pending mark, which a failed
        // commit can still roll back. Only Ack frames and Hello marks are.
        self.metrics.resyncs_served += 1;
        self.serve(peer, after, now);
    }

    /// The feed of `peer` if `stream` is ours to it and `seq` is one we sent;
    /// otherwise counts the drop.
    fn checked_feed(&mut self, peer: NodeId, stream: &StreamId, seq: Seq) -> Option<&mut Feed> {
        if *stream != self.own_stream_id(peer) {
            self.metrics.dropped.count(super::DropReason::UnknownStream);
            return None;
        }
        let last = self.own_view(peer).next_seq - 1;
        let feed = &mut self.peers.get_mut(&peer)?.conn.as_mut()?.feed;
        // The cursor can be ahead of `last`: a read may see a commit whose
        // answer has not come back yet.
        if seq > last.max(feed.cursor) {
            self.metrics.dropped.count(super::DropReason::BogusSeq);
            return None;
        }
        Some(feed)
    }

    /// Starts (or restarts) feeding `peer` our stream after `after`: a gap
    /// first if the outbox no longer reaches back that far.
    pub(super) fn serve(&mut self, peer: NodeId, after: Seq, now: Millis) {
        let own = self.own_view(peer);
        let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) else {
            return;
        };
        let conn = c.id;
        let feed = &mut c.feed;
        feed.cursor = after;
        feed.load = None;
        feed.retry_at = None;
        feed.announce_done = own.next_seq > 1;
        feed.progress_at = now;
        if after.saturating_add(1) < own.first_retained {
            feed.cursor = own.first_retained - 1;
            self.send_gap(peer, conn, own.stream, own.first_retained);
        }
        self.pump(peer, now);
    }

    fn send_gap(&mut self, peer: NodeId, conn: ConnId, stream: StreamId, earliest: Seq) {
        self.metrics.gaps_sent += 1;
        let frame = Frame::ResyncGap {
            stream,
            earliest_available: earliest,
        };
        self.send_frame(peer, conn, frame);
    }

    /// Moves the feed of `peer` on: asks for the next chunk of the outbox,
    /// or says `ResyncDone` once everything committed has been sent.
    pub(super) fn pump(&mut self, peer: NodeId, _now: Millis) {
        let own = self.own_view(peer);
        let last = own.next_seq - 1;
        let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) else {
            return;
        };
        if c.peer_epoch.is_none() || c.feed.load.is_some() || c.feed.retry_at.is_some() {
            return;
        }
        let conn = c.id;
        let feed = &mut c.feed;
        if feed.cursor < last {
            let load = LoadId(self.next_load);
            self.next_load += 1;
            feed.load = Some(load);
            self.metrics.loads += 1;
            self.effects.push_back(Effect::LoadOutbox {
                load,
                peer,
                stream: own.stream,
                after: feed.cursor,
                max_bytes: self.config.catchup_chunk_bytes,
            });
        } else if feed.announce_done {
            feed.announce_done = false;
            let upto = feed.cursor.max(last);
            self.send_frame(
                peer,
                conn,
                Frame::ResyncDone {
                    stream: own.stream,
                    upto,
                },
            );
        }
    }

    /// Pumps every peer that is being fed.
    pub(super) fn pump_all(&mut self, now: Millis) {
        let peers: Vec<NodeId> = self.peers.keys().copied().collect();
        for peer in peers {
            self.pump(peer, now);
        }
    }

    pub(super) fn on_loaded(
        &mut self,
        load: LoadId,
        result: Result<Vec<StoredBatch>, StoreError>,
        now: Millis,
    ) {
        let Some(peer) = self.peers.iter().find_map(|(id, p)| {
            let c = p.conn.as_ref()?;
            (c.feed.load == Some(load)).then_some(*id)
        }) else {
            self.metrics.stale_answers += 1;
            return;
        };
        let own = self.own_view(peer);
        let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) else {
            return;
        };
        let conn = c.id;
        c.feed.load = None;
        let batches = match result {
            Ok(b) => b,
            Err(_) => {
                self.metrics.load_failures += 1;
                c.feed.retry_at = Some(now.plus(self.config.store_retry_ms));
                return;
            }
        };
        let mut cursor = c.feed.cursor;
        let mut progressed = false;
        for sb in batches {
            let (first, last) = (sb.batch.first_seq, sb.batch.last_seq());
            if sb.batch.author != self.me || last <= cursor {
                continue;
            }
            if first > cursor.saturating_add(1) {
                // Evicted since the counters were read (evict-oldest).
                self.send_gap(peer, conn, own.stream.clone(), first);
            }
            self.send_batch(peer, conn, sb, now);
            cursor = last;
            progressed = true;
        }
        if !progressed && cursor < own.next_seq - 1 {
            if cursor.saturating_add(1) < own.first_retained {
                cursor = own.first_retained - 1;
                self.send_gap(peer, conn, own.stream.clone(), own.first_retained);
            } else {
                // The store returned nothing it should hold; try later.
                self.metrics.load_failures += 1;
                if let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) {
                    c.feed.retry_at = Some(now.plus(self.config.store_retry_ms));
                }
                return;
            }
        }
        if let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) {
            c.feed.cursor = c.feed.cursor.max(cursor);
        }
        self.pump(peer, now);
    }

    /// Hands one stored batch to the connection, byte for byte as signed.
    fn send_batch(&mut self, peer: NodeId, conn: ConnId, sb: StoredBatch, now: Millis) {
        let last = sb.batch.last_seq();
        if let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) {
            let feed = &mut c.feed;
            if feed.acked >= feed.cursor {
                // Nothing was outstanding: the silence clock starts now.
                feed.progress_at = now;
            }
            feed.cursor = feed.cursor.max(last);
        }
        let frame = Frame::Batch {
            batch: sb.batch,
            payloads: Payloads(sb.payloads),
        };
        self.send_frame(peer, conn, frame);
    }

    /// After its commit: sends a new batch at once if the peer's feed is
    /// exactly caught up to it; otherwise the catch-up will carry it.
    pub(super) fn send_fresh(&mut self, to: NodeId, batch: OpenBatch, now: Millis) {
        let Some(c) = self.peers.get(&to).and_then(|p| p.conn.as_ref()) else {
            return;
        };
        let feed = &c.feed;
        let ready = c.peer_epoch.is_some() && feed.load.is_none() && feed.retry_at.is_none();
        if !ready || feed.cursor.saturating_add(1) != batch.batch().first_seq() {
            return;
        }
        let conn = c.id;
        let (vb, payloads) = batch.into_parts();
        let sb = StoredBatch {
            batch: vb.into_signed(),
            payloads,
        };
        self.send_batch(to, conn, sb, now);
    }
}
