//! Own sends in a commit: signed into batches, answered once committed,
//! held while the store is down and let go past the hold.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{
    Channel, MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES, NewEnvelope, NodeId, OpenBatch, Seq,
    StreamId, TopicName,
};
use mesh_store::{Eviction, Receipt, StoreError, WriteOp};

use super::committed::{AfterCommit, is_down};
use crate::core::agents::Tracked;
use crate::core::commit::{Batch, Group, WaitingPublish, WaitingSend};
use crate::core::outbox::Room;
use crate::core::{Core, Effect, Millis, ReqId, SendError, SendReceipt};

impl Core {
    /// Turns the waiting sends into signed batches, one group each: the
    /// sends of one stream that its outbox takes (see [`outbox`]) become
    /// one batch, split at the batch and outbox limits. A send the outbox
    /// refuses is answered at once, unless an ack of its stream rides in
    /// this commit: then it and the stream's later sends wait for the next
    /// commit, which knows what the ack made evictable.
    pub(super) fn build_appends(&mut self, batch: &mut Batch, acking: &BTreeSet<NodeId>) {
        let mut by_peer: BTreeMap<NodeId, Vec<WaitingSend>> = BTreeMap::new();
        let bounces = self.take_bounces();
        for mut s in self.committer.take_sends() {
            self.readdress_waiting(&mut s);
            by_peer.entry(s.to).or_default().push(s);
        }
        for s in bounces {
            by_peer.entry(s.to).or_default().push(s);
        }
        let mut later = Vec::new();
        for (to, sends) in by_peer {
            let own = self.author.own_view(to);
            let mut room = Room::new(&own, self.config.outbox, to);
            if self.moves.forwarding(to, own.last_acked) {
                room.keep_unacked();
            }
            let mut taken: Vec<WaitingSend> = Vec::with_capacity(sends.len());
            let mut sends = sends.into_iter();
            while let Some(s) = sends.next() {
                // A keyed send may become its tombstone, which can be the
                // longer: room for the longer of the two.
                let len = if s.is_keyed() {
                    (s.payload.len() as u64).max(mesh_protocol::MAX_TOMBSTONE_BYTES)
                } else {
                    s.payload.len() as u64
                };
                // A forward's author was told its message was delivered:
                // nothing makes room by a loss while it is on its way (it
                // waits for room; the pump passes it on again).
                let admitted = if mesh_protocol::is_forward_kind(s.kind) {
                    room.admit_lossless(len)
                } else {
                    room.admit(len)
                };
                match admitted {
                    Ok(()) => taken.push(s),
                    Err(_) if acking.contains(&to) => {
                        later.push(s);
                        later.extend(sends.by_ref());
                    }
                    Err(e) => {
                        if s.req == ReqId::INTERNAL {
                            self.out.metrics.agents.bounces_refused += 1;
                        }
                        self.out.metrics.sends_refused += 1;
                        self.reply(s.req, Err(e));
                    }
                }
            }
            let replace = self.plan_supersede(to, own.next_seq, &mut taken);
            self.build_stream(batch, to, own.next_seq, taken, &mut room);
            for r in replace {
                self.build_replace(batch, r);
            }
        }
        // Bounces wait apart from the local sends, outside their bound.
        let (bounces, later): (Vec<_>, Vec<_>) =
            later.into_iter().partition(|s| s.req == ReqId::INTERNAL);
        self.wait_again_bounces(bounces);
        self.committer.wait_again(later);
    }

    /// The batches of the sends to `to` its outbox took, from `next_seq` on.
    fn build_stream(
        &mut self,
        batch: &mut Batch,
        to: NodeId,
        mut next_seq: Seq,
        sends: Vec<WaitingSend>,
        room: &mut Room,
    ) {
        let bounds = self.config.outbox;
        let max_entries = (MAX_BATCH_ENTRIES as u64).min(bounds.max_msgs).max(1);
        let max_bytes = MAX_BATCH_PAYLOAD_BYTES.min(bounds.max_bytes);
        let mut chunk: Vec<WaitingSend> = Vec::new();
        let mut chunk_bytes = 0u64;
        let mut sends = sends.into_iter().peekable();
        while let Some(s) = sends.next() {
            let keyed = s.is_keyed();
            chunk_bytes += s.payload.len() as u64;
            chunk.push(s);
            // A keyed message (or its tombstone) is a batch of its own: one
            // that is replaced in the outbox is re-signed alone.
            let full = keyed
                || sends.peek().is_none_or(|n| {
                    n.is_keyed()
                        || chunk.len() as u64 >= max_entries
                        || chunk_bytes + n.payload.len() as u64 > max_bytes
                });
            if !full {
                continue;
            }
            let taken = std::mem::take(&mut chunk);
            let bytes = std::mem::take(&mut chunk_bytes);
            let n = taken.len() as u64;
            let forward = taken
                .iter()
                .rposition(|s| mesh_protocol::is_forward_kind(s.kind))
                .map(|i| next_seq + i as u64);
            let evict = room.evict_for(n, bytes);
            if self.sign_chunk(batch, to, next_seq, taken, evict) {
                if let Some(seq) = forward {
                    self.moves.note_forward(to, seq);
                }
                next_seq += n;
            }
        }
    }

    /// Signs one batch of sends starting at `first_seq` into `batch`;
    /// answers the senders at once if it cannot be signed (a bug: the
    /// limits were checked). Returns whether it was signed.
    fn sign_chunk(
        &mut self,
        batch: &mut Batch,
        to: NodeId,
        first_seq: Seq,
        mut sends: Vec<WaitingSend>,
        evict: Option<Eviction>,
    ) -> bool {
        let index = self.index_own(to, first_seq, &mut sends);
        let mut senders = Vec::with_capacity(sends.len());
        let mut tracked = Vec::with_capacity(sends.len());
        let envelopes: Vec<NewEnvelope> = sends
            .into_iter()
            .map(|s| {
                senders.push(s.req);
                tracked.push(s.tracked);
                NewEnvelope {
                    lamport: 0,
                    created_ms: s.created_ms,
                    kind: s.kind,
                    payload: s.payload,
                }
            })
            .collect();
        match self.author.sign(to, first_seq, envelopes) {
            Ok(signed) => {
                let mut ops = vec![WriteOp::AppendOwn {
                    batch: signed.clone(),
                    evict,
                }];
                ops.extend(index);
                let group = Group::Append {
                    to,
                    batch: signed,
                    senders,
                    tracked,
                };
                batch.push(ops, group);
                true
            }
            Err(e) => {
                self.fail_senders(senders, &SendError::Internal(e.to_string()));
                false
            }
        }
    }

    fn fail_senders(&mut self, senders: Vec<ReqId>, err: &SendError) {
        self.out.metrics.sends_failed += senders.len() as u64;
        for req in senders {
            self.reply(req, Err(err.clone()));
        }
    }

    /// Answers the senders of one own batch, and sends it to the peer if
    /// its feed is right before it.
    pub(super) fn on_append_committed(
        &mut self,
        to: NodeId,
        batch: OpenBatch,
        (senders, tracked): (Vec<ReqId>, Vec<Option<Box<Tracked>>>),
        result: Result<Receipt, StoreError>,
        after: &mut AfterCommit,
        now: Millis,
    ) {
        if let Err(e) = &result
            && is_down(e)
        {
            // Not written: held, to be tried again, unanswered.
            after.held.extend(unsigned(to, batch, senders, tracked));
            return;
        }
        if let Some(err) = after.failed_sends.get(&to).cloned() {
            // An earlier batch of this stream failed, so this one could
            // not follow it; say why the first failed.
            return self.fail_senders(senders, &err);
        }
        let receipt = match result {
            Ok(receipt) => receipt,
            Err(e) => {
                let err = SendError::from_store(&e);
                self.fail_senders(senders, &err);
                after.failed_sends.insert(to, err);
                return;
            }
        };
        let (stream, first, first_arrival) = placed(&batch, &receipt);
        self.note_keyed(to, &batch, &tracked);
        self.out.metrics.sends_ok += senders.len() as u64;
        for (i, req) in senders.into_iter().enumerate() {
            let superseded_by = tracked
                .get(i)
                .and_then(|t| t.as_deref())
                .and_then(Tracked::superseded_by);
            self.out.metrics.agents.superseded += u64::from(superseded_by.is_some());
            let receipt = SendReceipt {
                superseded_by,
                stream: stream.clone(),
                seq: first + i as u64,
                arrival: first_arrival + i as u64,
            };
            self.reply(req, Ok(receipt));
        }
        self.author.send_fresh(to, batch, now, &mut self.out);
    }

    /// Answers sends and publishes past the hold bounds: refused at once
    /// (nothing was written).
    pub(super) fn refuse_held(&mut self, sends: Vec<WaitingSend>, publishes: Vec<WaitingPublish>) {
        let (held, _) = self.committer.held();
        let why = self.store_down_why();
        let reqs: Vec<ReqId> = sends
            .iter()
            .map(|s| s.req)
            .chain(publishes.iter().map(|p| p.req))
            .collect();
        self.out.metrics.sends_refused += reqs.len() as u64;
        for req in reqs {
            let result = Err(SendError::StoreDown {
                held,
                why: why.clone(),
            });
            self.out.push(Effect::Reply { req, result });
        }
    }

    /// The store's last error, while it is down.
    fn store_down_why(&self) -> String {
        self.committer
            .store_down()
            .map_or_else(|| "the store failed".to_owned(), |d| d.why.clone())
    }

    /// Lets go the held sends and publishes whose hold has ended: answered
    /// 503; the sends are journaled as lost once the store takes a commit.
    pub(in crate::core) fn expire_held(&mut self, now: Millis) {
        let (expired, publishes) = self.committer.expire_held(now, &self.config);
        if expired.is_empty() && publishes.is_empty() {
            return;
        }
        let why = self.store_down_why();
        self.committer.note_lost(&expired);
        let ended: Vec<(ReqId, u64)> = expired
            .iter()
            .map(|s| (s.req, s.created_ms))
            .chain(publishes.iter().map(|p| (p.req, p.created_ms)))
            .collect();
        self.out.metrics.sends_let_go += ended.len() as u64;
        for (req, created_ms) in ended {
            let result = Err(SendError::Held {
                held_ms: now.0.saturating_sub(created_ms),
                why: why.clone(),
            });
            self.out.push(Effect::Reply { req, result });
        }
    }
}

impl Core {
    /// Signs the waiting publishes into batches of this node's stream of
    /// each topic, one group each, evicting past the topic's bound with a
    /// loss record. A publish to a topic left meanwhile is refused.
    pub(super) fn build_publishes(&mut self, batch: &mut Batch, _now: Millis) {
        let mut by_topic: BTreeMap<TopicName, Vec<WaitingPublish>> = BTreeMap::new();
        for p in self.committer.take_publishes() {
            by_topic.entry(p.topic.clone()).or_default().push(p);
        }
        for (topic, publishes) in by_topic {
            let Some(record) = self.topics.record(&topic).cloned() else {
                let err = SendError::NotAMember(topic.clone());
                self.fail_senders(publishes.iter().map(|p| p.req).collect(), &err);
                continue;
            };
            let stream = StreamId {
                author: self.me,
                epoch: self.author.epoch(),
                channel: Channel::Topic(topic.clone()),
            };
            let own = self.topics.own_view(&stream);
            let mut next_seq = own.next_seq;
            let max_bytes = MAX_BATCH_PAYLOAD_BYTES.min(record.max_bytes.max(1));
            let mut rest = publishes.into_iter().peekable();
            while rest.peek().is_some() {
                let mut chunk = Vec::new();
                let mut bytes = 0u64;
                while let Some(p) = rest.peek() {
                    let len = p.payload.len() as u64;
                    if !chunk.is_empty()
                        && (chunk.len() >= MAX_BATCH_ENTRIES || bytes + len > max_bytes)
                    {
                        break;
                    }
                    bytes += len;
                    if let Some(p) = rest.next() {
                        chunk.push(p);
                    }
                }
                let n = chunk.len() as u64;
                let senders: Vec<ReqId> = chunk.iter().map(|p| p.req).collect();
                let requests: Vec<u64> = chunk.iter().map(|p| p.request).collect();
                let envelopes = chunk.into_iter().map(|p| NewEnvelope {
                    lamport: 0,
                    created_ms: p.created_ms,
                    kind: p.kind,
                    payload: p.payload,
                });
                let channel = Channel::Topic(topic.clone());
                match self.author.sign_on(channel, next_seq, envelopes) {
                    Ok(signed) => {
                        let evict = crate::core::topics::evict_for(&record, n, bytes);
                        let ops = vec![WriteOp::AppendOwn {
                            batch: signed.clone(),
                            evict: Some(evict),
                        }];
                        batch.push(
                            ops,
                            Group::Publish {
                                batch: signed,
                                senders,
                                requests,
                            },
                        );
                        next_seq += n;
                    }
                    Err(e) => self.fail_senders(senders, &SendError::Internal(e.to_string())),
                }
            }
        }
    }

    /// Answers the publishers of one batch of this node's topic stream,
    /// and relays it to the topic's members; a batch not written for want
    /// of a store is held, unanswered, to be signed again at the same seqs.
    pub(super) fn on_publish_committed(
        &mut self,
        batch: OpenBatch,
        (senders, requests): (Vec<ReqId>, Vec<u64>),
        result: Result<Receipt, StoreError>,
        after: &mut AfterCommit,
    ) {
        let receipt = match result {
            Ok(r) => r,
            Err(e) if is_down(&e) => {
                after
                    .held_publishes
                    .extend(unsigned_publishes(batch, senders, requests));
                return;
            }
            Err(e) => return self.fail_senders(senders, &SendError::from_store(&e)),
        };
        let (stream, first, first_arrival) = placed(&batch, &receipt);
        self.out.metrics.sends_ok += senders.len() as u64;
        self.out.metrics.topics.published += senders.len() as u64;
        for (i, req) in senders.into_iter().enumerate() {
            let receipt = SendReceipt {
                superseded_by: None,
                stream: stream.clone(),
                seq: first + i as u64,
                arrival: first_arrival + i as u64,
            };
            self.reply(req, Ok(receipt));
        }
        self.topics.relay(&batch, None, &mut self.out);
    }
}

/// Where an own batch committed with `receipt` is: its stream, its first
/// seq and the journal arrival of its first envelope (the store journals a
/// batch's envelopes last in its group, in seq order).
fn placed(batch: &OpenBatch, receipt: &Receipt) -> (mesh_protocol::StreamId, Seq, u64) {
    let n = batch.batch().entries().len() as u64;
    let first_arrival = receipt
        .arrivals
        .map_or(0, |(_, last)| (last + 1).saturating_sub(n));
    (
        batch.batch().stream().clone(),
        batch.batch().first_seq(),
        first_arrival,
    )
}

/// The sends of an own batch that was never written, as they waited
/// before it was signed (an agent message's id is stamped again when it
/// is signed again).
fn unsigned(
    to: NodeId,
    batch: OpenBatch,
    senders: Vec<ReqId>,
    tracked: Vec<Option<Box<Tracked>>>,
) -> Vec<WaitingSend> {
    let (vb, payloads) = batch.into_parts();
    vb.entries()
        .iter()
        .zip(payloads)
        .zip(senders.into_iter().zip(tracked))
        .map(|((h, payload), (req, tracked))| WaitingSend {
            req,
            to,
            kind: h.kind,
            payload,
            created_ms: h.created_ms,
            tracked,
        })
        .collect()
}

/// The publishes of an own topic batch that was never written, as they
/// waited before it was signed.
fn unsigned_publishes(
    batch: OpenBatch,
    senders: Vec<ReqId>,
    requests: Vec<u64>,
) -> Vec<WaitingPublish> {
    let (vb, payloads) = batch.into_parts();
    let Channel::Topic(topic) = &vb.stream().channel else {
        debug_assert!(false, "a publish batch is of a topic stream");
        return Vec::new();
    };
    vb.entries()
        .iter()
        .zip(payloads)
        .zip(senders.into_iter().zip(requests))
        .map(|((h, payload), (req, request))| WaitingPublish {
            req,
            topic: topic.clone(),
            kind: h.kind,
            payload,
            created_ms: h.created_ms,
            request,
        })
        .collect()
}
