//! Group commit: at most one [`Effect::Persist`] in flight; whatever arrives
//! meanwhile waits in bounded queues and goes into the next one.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use mesh_protocol::{
    Channel, Epoch, Frame, MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES, NewEnvelope, NodeId,
    OpenBatch, Seq, StreamId, TopicName,
};
use mesh_store::{LossReason, PeerRecord, Receipt, StoreError, WriteOp};

use super::{
    CommitId, Core, Effect, LocalWrite, Millis, ReqId, SendError, SendReceipt, WAITING_WRITES_MAX,
};

/// The topic a subscriber's lag record is filed under until the store has a
/// record of its own for it.
const LAG_TOPIC: &str = "local.journal";

/// A peer added (or its addresses changed) or removed, to be committed.
#[derive(Clone, Debug)]
pub(super) enum PeerChange {
    /// Add or update; the epoch is the core's, taken when the commit is built.
    Put(PeerRecord),
    Remove(NodeId),
}

impl PeerChange {
    pub(super) fn node(&self) -> NodeId {
        match self {
            PeerChange::Put(r) => r.node,
            PeerChange::Remove(n) => *n,
        }
    }
}

/// A local send waiting for the next commit.
#[derive(Debug)]
pub(super) struct WaitingSend {
    pub(super) req: ReqId,
    pub(super) to: NodeId,
    pub(super) kind: u16,
    pub(super) payload: Vec<u8>,
    pub(super) created_ms: u64,
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
    pub(super) fn stream(&self) -> &StreamId {
        match self {
            InboundWork::Accept { batch, .. } => batch.batch().stream(),
            InboundWork::Gap { stream, .. } => stream,
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        match self {
            InboundWork::Accept { batch, .. } => batch.batch().payload_bytes(),
            InboundWork::Gap { .. } => 0,
        }
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

/// Everything waiting for the next commit.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    pub(super) sends: VecDeque<WaitingSend>,
    pub(super) send_bytes: u64,
    pub(super) inbound: VecDeque<InboundWork>,
    pub(super) inbound_bytes: u64,
    pub(super) acks: BTreeMap<NodeId, AckWork>,
    /// When the acks waiting were first seen by [`Core::flush`] (`None` when
    /// none wait): they may wait for company until `ack_ride_ms` after it.
    pub(super) acks_since: Option<Millis>,
    /// Sends per recipient not yet committed (waiting or in flight): messages, bytes.
    pub(super) queued: BTreeMap<NodeId, (u64, u64)>,
    /// Peer changes, in the order asked (at most [`super::WAITING_PEER_CHANGES_MAX`]).
    pub(super) peers: VecDeque<(ReqId, PeerChange)>,
    /// Local writes, in the order asked (at most [`WAITING_WRITES_MAX`]).
    pub(super) writes: VecDeque<(ReqId, LocalWrite)>,
}

impl Waiting {
    pub(super) fn is_empty(&self) -> bool {
        self.sends.is_empty()
            && self.inbound.is_empty()
            && self.acks.is_empty()
            && self.peers.is_empty()
            && self.writes.is_empty()
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
        bytes: u64,
    },
    Peer {
        req: ReqId,
        change: PeerChange,
    },
    Write {
        req: ReqId,
    },
}

/// The commit in flight.
#[derive(Debug)]
pub(super) struct InFlight {
    id: CommitId,
    groups: Vec<Group>,
}

impl InFlight {
    /// The ack of `peer` this commit carries, if any.
    pub(super) fn ack_for(&self, peer: NodeId) -> Option<&AckWork> {
        self.groups.iter().find_map(|g| match g {
            Group::Ack { peer: p, work } if *p == peer => Some(work),
            _ => None,
        })
    }
}

impl Core {
    /// Issues the next commit if none is in flight and anything waits.
    pub(super) fn flush(&mut self, now: Millis) {
        let since = if self.waiting.acks.is_empty() {
            None
        } else {
            Some(self.waiting.acks_since.unwrap_or(now))
        };
        self.waiting.acks_since = since;
        if self.in_flight.is_some() {
            return;
        }
        if let Some(t) = self.store_retry_at {
            if now < t {
                return;
            }
            self.store_retry_at = None;
        }
        if self.acks_may_wait(now) {
            return;
        }
        let mut groups: Vec<Vec<WriteOp>> = Vec::new();
        let mut meta: Vec<Group> = Vec::new();
        // The epochs the acks below record, so a peer record written after
        // them in this commit keeps the newest.
        let mut epochs: BTreeMap<NodeId, Epoch> = BTreeMap::new();
        // Acks first: the appends after them may evict what they acknowledge.
        self.waiting.acks_since = None;
        for (peer, work) in std::mem::take(&mut self.waiting.acks) {
            if let Some(epoch) = work.epoch {
                epochs.insert(peer, epoch);
            }
            let mut ops = Vec::new();
            if let (Some(epoch), Some(p)) = (work.epoch, self.peers.get(&peer)) {
                ops.push(WriteOp::PutPeer(PeerRecord {
                    epoch: Some(epoch),
                    ..p.record.clone()
                }));
            }
            if let Some(own) = self.own.get(&peer) {
                // The peer may name a seq whose commit answer we have not
                // processed yet; never past what the store holds.
                let upto = work.upto.min(own.next_seq - 1);
                if upto > own.last_acked || (work.reset && upto != own.last_acked) {
                    ops.push(WriteOp::Acked {
                        stream: own.stream.clone(),
                        upto,
                        reset: work.reset,
                    });
                }
            }
            if !ops.is_empty() {
                groups.push(ops);
                meta.push(Group::Ack { peer, work });
            }
        }
        for work in std::mem::take(&mut self.waiting.inbound) {
            match work {
                InboundWork::Accept { peer, from, batch } => {
                    let stream = batch.batch().stream().clone();
                    let last = batch.batch().last_seq();
                    groups.push(vec![WriteOp::Accept { batch, from }]);
                    meta.push(Group::Accept { peer, stream, last });
                }
                InboundWork::Gap {
                    peer,
                    stream,
                    earliest,
                } => {
                    groups.push(vec![WriteOp::Gap {
                        stream: stream.clone(),
                        earliest_available: earliest,
                    }]);
                    meta.push(Group::Gap {
                        peer,
                        stream,
                        earliest,
                    });
                }
            }
        }
        self.waiting.inbound_bytes = 0;
        // The queue is empty again.
        self.ask_starved(now);
        // Peer changes after the acks: an ack's record carries the peer's
        // old addresses, so the change must be written last.
        for (req, change) in std::mem::take(&mut self.waiting.peers) {
            let op = match &change {
                PeerChange::Put(r) => {
                    let known = self.peers.get(&r.node).and_then(|p| p.record.epoch);
                    WriteOp::PutPeer(PeerRecord {
                        node: r.node,
                        addrs: r.addrs.clone(),
                        epoch: epochs.get(&r.node).copied().or(known),
                    })
                }
                PeerChange::Remove(node) => WriteOp::RemovePeer(*node),
            };
            groups.push(vec![op]);
            meta.push(Group::Peer { req, change });
        }
        for (req, write) in std::mem::take(&mut self.waiting.writes) {
            groups.push(vec![self.write_op(write)]);
            meta.push(Group::Write { req });
        }
        self.sign_sends(&mut groups, &mut meta);
        if groups.is_empty() {
            return;
        }
        let id = CommitId(self.next_commit);
        self.next_commit += 1;
        self.metrics.commits += 1;
        self.in_flight = Some(InFlight { id, groups: meta });
        self.effects
            .push_back(Effect::Persist { commit: id, groups });
    }

    /// Whether the only work waiting is acks that may still wait for other
    /// work to share their commit: plain acks (no reset, no new epoch, which
    /// are written at once), seen less than `ack_ride_ms` ago.
    ///
    /// Nothing else waits for an ack record: the outbox pre-check counts a
    /// waiting ack as acknowledged, and the ack rides first in the commit
    /// of the sends it let in, so the store sees it before their appends; a
    /// store whose mark lags only evicts less. A reset or an epoch record
    /// is not delayed: until it is written, the store holds an acked mark
    /// a new peer store no longer has.
    fn acks_may_wait(&self, now: Millis) -> bool {
        let w = &self.waiting;
        let Some(since) = w.acks_since else {
            return false;
        };
        w.sends.is_empty()
            && w.inbound.is_empty()
            && w.peers.is_empty()
            && w.writes.is_empty()
            && w.acks.values().all(|a| !a.reset && a.epoch.is_none())
            && now < since.plus(self.config.ack_ride_ms)
    }

    /// Queues a local write for the next commit, or refuses it at once when
    /// [`WAITING_WRITES_MAX`] already wait.
    pub(super) fn on_write(&mut self, req: ReqId, write: LocalWrite) {
        if self.waiting.writes.len() >= WAITING_WRITES_MAX {
            let why = format!("{WAITING_WRITES_MAX} local writes are already waiting; retry later");
            self.effects.push_back(Effect::Written {
                req,
                result: Err(StoreError::Unavailable(why)),
            });
            return;
        }
        self.waiting.writes.push_back((req, write));
    }

    /// The store op of a local write.
    fn write_op(&self, write: LocalWrite) -> WriteOp {
        match write {
            LocalWrite::PutCursor { name, arrival } => WriteOp::PutCursor { name, arrival },
            LocalWrite::SubscriberLagged {
                subscriber,
                from,
                to,
            } => {
                let channel = TopicName::new(LAG_TOPIC)
                    .map(Channel::Topic)
                    .unwrap_or(Channel::Direct(self.me));
                WriteOp::RecordLoss {
                    stream: StreamId {
                        author: self.me,
                        epoch: self.epoch,
                        channel,
                    },
                    from,
                    to,
                    reason: LossReason::SubscriberLagged,
                    detail: subscriber,
                }
            }
        }
    }

    /// Turns the waiting sends into signed batches, one group each: the
    /// sends of one stream become one batch, split at the batch and outbox limits.
    fn sign_sends(&mut self, groups: &mut Vec<Vec<WriteOp>>, meta: &mut Vec<Group>) {
        let bounds = self.config.outbox;
        let max_entries = (MAX_BATCH_ENTRIES as u64).min(bounds.max_msgs).max(1);
        let max_bytes = MAX_BATCH_PAYLOAD_BYTES.min(bounds.max_bytes);
        let mut by_peer: BTreeMap<NodeId, Vec<WaitingSend>> = BTreeMap::new();
        for s in std::mem::take(&mut self.waiting.sends) {
            by_peer.entry(s.to).or_default().push(s);
        }
        self.waiting.send_bytes = 0;
        for (to, sends) in by_peer {
            let mut next_seq = self.own_view(to).next_seq;
            let mut chunk: Vec<WaitingSend> = Vec::new();
            let mut chunk_bytes = 0u64;
            let mut sends = sends.into_iter().peekable();
            while let Some(s) = sends.next() {
                chunk_bytes += s.payload.len() as u64;
                chunk.push(s);
                let full = match sends.peek() {
                    None => true,
                    Some(n) => {
                        chunk.len() as u64 >= max_entries
                            || chunk_bytes + n.payload.len() as u64 > max_bytes
                    }
                };
                if !full {
                    continue;
                }
                let taken = std::mem::take(&mut chunk);
                let bytes = std::mem::take(&mut chunk_bytes);
                let n = taken.len() as u64;
                if let Some((ops, group)) = self.sign_chunk(to, next_seq, taken, bytes) {
                    groups.push(ops);
                    meta.push(group);
                    next_seq += n;
                }
            }
        }
    }

    /// Signs one batch of sends starting at `first_seq`; answers the senders
    /// at once if it cannot be signed (a bug: the limits were checked).
    fn sign_chunk(
        &mut self,
        to: NodeId,
        first_seq: Seq,
        sends: Vec<WaitingSend>,
        bytes: u64,
    ) -> Option<(Vec<WriteOp>, Group)> {
        let mut senders = Vec::with_capacity(sends.len());
        let mut envelopes = Vec::with_capacity(sends.len());
        for s in sends {
            self.lamport = self.lamport.saturating_add(1);
            senders.push(s.req);
            envelopes.push(NewEnvelope {
                lamport: self.lamport,
                created_ms: s.created_ms,
                kind: s.kind,
                payload: s.payload,
            });
        }
        let signed = OpenBatch::sign(
            &self.secret,
            self.epoch,
            Channel::Direct(to),
            first_seq,
            envelopes,
        );
        match signed {
            Ok(batch) => {
                let ops = vec![WriteOp::AppendOwn {
                    batch: batch.clone(),
                    bounds: self.config.outbox,
                }];
                let group = Group::Append {
                    to,
                    batch,
                    senders,
                    bytes,
                };
                Some((ops, group))
            }
            Err(e) => {
                let n = senders.len() as u64;
                self.unqueue(to, n, bytes);
                let err = SendError::Internal(e.to_string());
                self.fail_senders(senders, &err);
                None
            }
        }
    }

    fn unqueue(&mut self, to: NodeId, msgs: u64, bytes: u64) {
        if let Some(q) = self.waiting.queued.get_mut(&to) {
            q.0 = q.0.saturating_sub(msgs);
            q.1 = q.1.saturating_sub(bytes);
            if q.0 == 0 {
                self.waiting.queued.remove(&to);
            }
        }
    }

    fn fail_senders(&mut self, senders: Vec<ReqId>, err: &SendError) {
        self.metrics.sends_failed += senders.len() as u64;
        for req in senders {
            self.effects.push_back(Effect::Reply {
                req,
                result: Err(err.clone()),
            });
        }
    }

    /// The answer to the commit in flight.
    pub(super) fn on_committed(
        &mut self,
        commit: CommitId,
        results: Vec<Result<Receipt, StoreError>>,
        now: Millis,
    ) {
        let Some(flight) = self.in_flight.take_if(|f| f.id == commit) else {
            self.metrics.stale_answers += 1;
            return;
        };
        let mut results = results.into_iter();
        let mut journaled = None;
        let mut store_down = false;
        let mut acks: BTreeSet<(NodeId, StreamId)> = BTreeSet::new();
        let mut failed_streams: BTreeSet<StreamId> = BTreeSet::new();
        let mut failed_sends: BTreeMap<NodeId, SendError> = BTreeMap::new();
        for group in flight.groups {
            let result = results.next().unwrap_or_else(|| {
                Err(StoreError::Unavailable(
                    "the store gave no result for this group".into(),
                ))
            });
            match &result {
                Ok(receipt) => {
                    if let Some((_, last)) = receipt.arrivals {
                        journaled = Some(last);
                    }
                    for o in &receipt.own_streams {
                        if let Channel::Direct(to) = o.stream.channel
                            && o.stream.author == self.me
                            && o.stream.epoch == self.epoch
                        {
                            self.own.insert(to, o.clone());
                        }
                    }
                }
                Err(e) => {
                    self.metrics.groups_failed += 1;
                    store_down |= matches!(e, StoreError::Unavailable(_) | StoreError::Closed);
                }
            }
            match group {
                Group::Ack { peer, work } => match result {
                    Ok(_) => {
                        if let (Some(epoch), Some(p)) = (work.epoch, self.peers.get_mut(&peer)) {
                            p.record.epoch = Some(epoch);
                        }
                    }
                    Err(StoreError::Conflict(_)) => {}
                    Err(_) => {
                        // Try again with the next commit, under anything newer.
                        let again = match self.waiting.acks.remove(&peer) {
                            Some(newer) => newer.under(work),
                            None => work,
                        };
                        self.waiting.acks.insert(peer, again);
                    }
                },
                Group::Accept { peer, stream, last } => match result {
                    Ok(_) => {
                        if self.committed_mark(&stream, last) {
                            acks.insert((peer, stream));
                        }
                    }
                    Err(_) => {
                        failed_streams.insert(stream);
                    }
                },
                Group::Gap {
                    peer,
                    stream,
                    earliest,
                } => match result {
                    Ok(_) => {
                        self.metrics.gaps_recorded += 1;
                        if self.committed_mark(&stream, earliest - 1) {
                            acks.insert((peer, stream));
                        }
                    }
                    Err(_) => {
                        failed_streams.insert(stream);
                    }
                },
                Group::Peer { req, change } => {
                    let node = change.node();
                    if result.is_ok() {
                        let mut change = change;
                        // The ack that may have shared this commit set the epoch.
                        if let PeerChange::Put(r) = &mut change {
                            r.epoch = self.peers.get(&node).and_then(|p| p.record.epoch);
                        }
                        self.apply_peer_change(change);
                    }
                    let result = result.map(|_| ());
                    self.effects
                        .push_back(Effect::PeerChanged { req, node, result });
                }
                Group::Write { req } => {
                    self.effects.push_back(Effect::Written { req, result });
                }
                Group::Append {
                    to,
                    batch,
                    senders,
                    bytes,
                } => {
                    self.unqueue(to, senders.len() as u64, bytes);
                    if let Some(err) = failed_sends.get(&to).cloned() {
                        // An earlier batch of this stream failed, so this
                        // one could not follow it; say why the first failed.
                        self.fail_senders(senders, &err);
                        continue;
                    }
                    match result {
                        Ok(receipt) => {
                            let stream = batch.batch().stream().clone();
                            let first = batch.batch().first_seq();
                            // The store journals a batch's envelopes last in
                            // its group, in seq order: they end at `last`.
                            let n = batch.batch().entries().len() as u64;
                            let first_arrival = receipt
                                .arrivals
                                .map_or(0, |(_, last)| (last + 1).saturating_sub(n));
                            self.metrics.sends_ok += senders.len() as u64;
                            for (i, req) in senders.into_iter().enumerate() {
                                let receipt = SendReceipt {
                                    stream: stream.clone(),
                                    seq: first + i as u64,
                                    arrival: first_arrival + i as u64,
                                };
                                self.effects.push_back(Effect::Reply {
                                    req,
                                    result: Ok(receipt),
                                });
                            }
                            self.send_fresh(to, batch, now);
                        }
                        Err(e) => {
                            let err = SendError::from_store(&e);
                            self.fail_senders(senders, &err);
                            failed_sends.insert(to, err);
                        }
                    }
                }
            }
        }
        if store_down {
            self.store_retry_at = Some(now.plus(self.config.store_retry_ms));
        }
        for stream in &failed_streams {
            self.roll_back(stream, now);
        }
        for (peer, stream) in acks {
            let upto = self.mark(&stream);
            self.send_live(peer, Frame::Ack { stream, upto });
        }
        if let Some(upto) = journaled {
            self.effects.push_back(Effect::Journaled { upto });
        }
        self.pump_all(now);
    }
}
