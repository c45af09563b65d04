//! Building the next commit from what the machines queued, and routing
//! each group's outcome back to the machine it was for.

use super::agents::Tracked;
use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{
    Channel, Epoch, Frame, MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES, NewEnvelope, NodeId,
    OpenBatch, Seq, StreamId,
};
use mesh_store::{Arrival, Eviction, PeerRecord, Receipt, StoreError, WriteOp};

use super::commit::{Batch, CarryWork, EpochSwitch, Group, InboundWork, LostTally, WaitingSend};
use super::outbox::Room;
use super::peers::PeerChange;
use super::receiver::{Env, send_live};
use super::{CommitId, Core, Effect, Millis, PeerChangeError, ReqId, SendError, SendReceipt};

/// What a finished commit leaves to do once every group is handled.
#[derive(Debug, Default)]
struct AfterCommit {
    /// The last journal position written.
    journaled: Option<Arrival>,
    /// A group failed for want of a working store (its error): wait before
    /// the next commit, and hold the sends.
    store_down: Option<String>,
    /// A group committed: the store works.
    store_works: bool,
    /// Sends whose commit failed for want of a store, to hold again, in order.
    held: Vec<WaitingSend>,
    /// Streams whose committed mark moved: their authors get an Ack.
    acks: BTreeSet<(NodeId, StreamId)>,
    /// Streams whose accept or gap failed: roll back and ask again.
    failed_streams: BTreeSet<StreamId>,
    /// Own streams whose append failed, and why: later batches of the
    /// stream in the same commit could not follow it.
    failed_sends: BTreeMap<NodeId, SendError>,
}

impl Core {
    /// Issues the next commit if none is in flight and anything waits:
    /// the journal's trim first (its bounds hold before the commit's rows),
    /// acks (the appends after them may evict what they acknowledge), a new
    /// epoch and what ended streams report, then peer batches and gaps,
    /// the ended epochs of peers, peer changes, lost sends, a carry-over
    /// chunk, and the sends, signed into batches.
    pub(super) fn flush(&mut self, now: Millis) {
        if !self.committer.carrying() && !self.committer.switching() {
            // Also after a start: an ended stream left to carry (a crash
            // came between the new epoch's commit and the carry-over).
            let (config, out) = (&self.config, &mut self.out);
            self.author.next_carry(config, out);
        }
        if !self.committer.ready(now, &self.config) {
            return;
        }
        let mut batch = Batch::default();
        let wanted_trim = self.committer.trim_wanted();
        self.committer.take_trim();
        batch.push(
            vec![WriteOp::Trim {
                now_ms: now.0,
                bytes_max: self.config.journal_bytes_max,
                age_ms_max: self.config.journal_age_ms_max,
            }],
            Group::Trim,
        );
        let (epochs, acking, ends) = self.build_acks(&mut batch);
        if let Some(switch) = self.committer.take_switch() {
            let mut ops = vec![WriteOp::NewEpoch {
                epoch: switch.epoch,
            }];
            ops.extend(switch.reports.iter().map(report_op));
            batch.push(ops, Group::NewEpoch { switch });
        }
        for report in self.committer.take_reports() {
            batch.push(vec![report_op(&report)], Group::Report { report });
        }
        for work in self.committer.take_inbound() {
            // Its agent index goes in its group; bounces join the sends.
            let index = self.index_inbound(&work, now);
            batch_inbound(&mut batch, work, index);
        }
        for stream in ends {
            batch.push(vec![WriteOp::EndEpoch { stream }], Group::EndEpoch);
        }
        // The queue is empty again.
        let (config, out) = (&self.config, &mut self.out);
        let peers = &self.peers;
        self.receiver.ask_starved(&mut Env {
            peers,
            config,
            now,
            out,
        });
        self.build_peer_changes(&mut batch, &epochs);
        for (to, tally) in self.committer.take_lost() {
            batch.push(
                vec![lost_op(to, tally, &self.config)],
                Group::Lost { to, tally },
            );
        }
        if let Some(carry) = self.committer.take_carry() {
            self.build_carry(&mut batch, carry);
        }
        self.build_cards(&mut batch, &epochs);
        // New sends wait while a new epoch is under way, so that they come
        // after what is carried over to it.
        if !self.committer.switching() && !self.author.has_carry() {
            self.build_appends(&mut batch, &acking);
        }
        for (req, write) in self.committer.take_writes() {
            let agent = super::agents::AgentChange::of(&write);
            batch.push(write.into_ops(), Group::Write { req, agent });
        }
        let housekeeping = self.agent_housekeeping(now);
        if !housekeeping.is_empty() {
            batch.push(housekeeping, Group::Housekeeping);
        }
        self.committer.start(batch, wanted_trim, &mut self.out);
    }

    /// The carry-over chunk `carry`, re-signed into the current epoch's
    /// stream to its peer as one group (one batch per batch limit), or the
    /// ended outbox dropped if nothing is left in it.
    fn build_carry(&mut self, batch: &mut Batch, carry: CarryWork) {
        let CarryWork {
            from,
            to,
            envelopes,
        } = carry;
        if envelopes.is_empty() {
            let ops = vec![WriteOp::DropEnded {
                stream: from.clone(),
            }];
            let group = Group::Carry {
                from,
                to,
                upto: Seq::MAX,
                batches: Vec::new(),
            };
            batch.push(ops, group);
            return;
        }
        let mut next_seq = self.author.own_view(to).next_seq;
        let mut ops = Vec::new();
        let mut batches = Vec::new();
        let mut upto = 0;
        let mut rest = envelopes.into_iter().peekable();
        while rest.peek().is_some() {
            let mut chunk = Vec::new();
            let mut bytes = 0u64;
            while let Some((_, e)) = rest.peek() {
                let len = e.payload.len() as u64;
                if !chunk.is_empty()
                    && (chunk.len() >= MAX_BATCH_ENTRIES || bytes + len > MAX_BATCH_PAYLOAD_BYTES)
                {
                    break;
                }
                bytes += len;
                if let Some((seq, e)) = rest.next() {
                    upto = seq;
                    chunk.push(e);
                }
            }
            let n = chunk.len() as u64;
            match self.author.sign(to, next_seq, chunk) {
                Ok(signed) => {
                    ops.push(WriteOp::CarryOver {
                        batch: signed.clone(),
                        from: from.clone(),
                        upto,
                    });
                    batches.push(signed);
                    next_seq += n;
                }
                // The envelopes were signed once within the same limits.
                Err(_) => break,
            }
        }
        if ops.is_empty() {
            return;
        }
        let upto = match ops.last() {
            Some(WriteOp::CarryOver { upto, .. }) => *upto,
            _ => 0,
        };
        batch.push(
            ops,
            Group::Carry {
                from,
                to,
                upto,
                batches,
            },
        );
    }

    /// One group per peer whose ack (or new epoch) waits; returns the
    /// epochs they record, so a peer record written later in the same
    /// commit keeps the newest, the peers whose ack moves, and the streams
    /// of peers' earlier epochs to record as ended.
    fn build_acks(
        &mut self,
        batch: &mut Batch,
    ) -> (BTreeMap<NodeId, Epoch>, BTreeSet<NodeId>, Vec<StreamId>) {
        let mut epochs = BTreeMap::new();
        let mut acking = BTreeSet::new();
        let mut ends = Vec::new();
        let me = self.me;
        for (peer, work) in self.committer.take_acks() {
            let mut ops = Vec::new();
            if let Some(earlier) = work.ended {
                ends.push(StreamId::direct(peer, earlier, me));
            }
            if let Some(epoch) = work.epoch {
                epochs.insert(peer, epoch);
                if let Some(record) = self.peers.record(peer) {
                    ops.push(WriteOp::PutPeer(PeerRecord {
                        epoch: Some(epoch),
                        ..record.clone()
                    }));
                }
            }
            if let Some(own) = self.author.own(&peer) {
                // The peer may name a seq whose commit answer we have not
                // processed yet; never past what the store holds.
                let upto = work.upto.min(own.next_seq - 1);
                if upto > own.last_acked || (work.reset && upto != own.last_acked) {
                    acking.insert(peer);
                    ops.push(WriteOp::Acked {
                        stream: own.stream.clone(),
                        upto,
                        reset: work.reset,
                    });
                }
            }
            if !ops.is_empty() {
                batch.push(ops, Group::Ack { peer, work });
            }
        }
        (epochs, acking, ends)
    }

    /// One group per peer change, after the acks: an ack's record carries
    /// the peer's old addresses, so the change must be written last.
    fn build_peer_changes(&mut self, batch: &mut Batch, epochs: &BTreeMap<NodeId, Epoch>) {
        for (req, change) in self.committer.take_peer_changes() {
            let op = match &change {
                PeerChange::Put(r) => {
                    let known = self.peers.record(r.node).and_then(|p| p.epoch);
                    WriteOp::PutPeer(PeerRecord {
                        node: r.node,
                        addrs: r.addrs.clone(),
                        epoch: epochs.get(&r.node).copied().or(known),
                    })
                }
                PeerChange::Remove(node) => WriteOp::RemovePeer(*node),
            };
            batch.push(vec![op], Group::Peer { req, change });
        }
    }

    /// One group per newer card, after the peer changes: a peer's card
    /// carries its addresses, which replace those of its record (written
    /// with the newest epoch, as the peer changes are).
    fn build_cards(&mut self, batch: &mut Batch, epochs: &BTreeMap<NodeId, Epoch>) {
        for (node, card) in self.committer.take_cards() {
            let mut ops = Vec::with_capacity(2);
            if let Some(record) = self.peers.record(node) {
                // A card without addresses (a node reached through relays
                // only) leaves the known ones as they are.
                let addrs = if card.addrs.is_empty() {
                    record.addrs.clone()
                } else {
                    card.addrs.clone()
                };
                ops.push(WriteOp::PutPeer(PeerRecord {
                    node,
                    addrs,
                    epoch: epochs.get(&node).copied().or(record.epoch),
                }));
            } else if node != self.me {
                // Removed since the card was learned.
                continue;
            }
            ops.push(WriteOp::PutCard(card.clone()));
            batch.push(ops, Group::Card { card });
        }
    }

    /// Turns the waiting sends into signed batches, one group each: the
    /// sends of one stream that its outbox takes (see [`outbox`]) become
    /// one batch, split at the batch and outbox limits. A send the outbox
    /// refuses is answered at once, unless an ack of its stream rides in
    /// this commit: then it and the stream's later sends wait for the next
    /// commit, which knows what the ack made evictable.
    fn build_appends(&mut self, batch: &mut Batch, acking: &BTreeSet<NodeId>) {
        let mut by_peer: BTreeMap<NodeId, Vec<WaitingSend>> = BTreeMap::new();
        let bounces = self.take_bounces();
        for s in self.committer.take_sends().into_iter().chain(bounces) {
            by_peer.entry(s.to).or_default().push(s);
        }
        let mut later = Vec::new();
        for (to, sends) in by_peer {
            let own = self.author.own_view(to);
            let mut room = Room::new(&own, self.config.outbox, to);
            let mut taken = Vec::with_capacity(sends.len());
            let mut sends = sends.into_iter();
            while let Some(s) = sends.next() {
                match room.admit(s.payload.len() as u64) {
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
            self.build_stream(batch, to, own.next_seq, taken, &mut room);
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
            chunk_bytes += s.payload.len() as u64;
            chunk.push(s);
            let full = sends.peek().is_none_or(|n| {
                chunk.len() as u64 >= max_entries
                    || chunk_bytes + n.payload.len() as u64 > max_bytes
            });
            if !full {
                continue;
            }
            let taken = std::mem::take(&mut chunk);
            let bytes = std::mem::take(&mut chunk_bytes);
            let n = taken.len() as u64;
            let evict = room.evict_for(n, bytes);
            if self.sign_chunk(batch, to, next_seq, taken, evict) {
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

    /// The answer to the commit in flight: each group's outcome goes to the
    /// machine it was for, then acks, rollbacks and feeds follow.
    pub(super) fn on_committed(
        &mut self,
        commit: CommitId,
        results: Vec<Result<Receipt, StoreError>>,
        now: Millis,
    ) {
        let Some(outcomes) = self.committer.finish(commit, results, &mut self.out) else {
            return;
        };
        let mut after = AfterCommit::default();
        for (group, result) in outcomes {
            match &result {
                Ok(receipt) => {
                    if let Some((_, last)) = receipt.arrivals {
                        after.journaled = Some(last);
                    }
                    self.author.committed(&receipt.own_streams);
                    self.author.ended_changed(&receipt.ended);
                    after.store_works = true;
                }
                Err(e) => {
                    self.out.metrics.groups_failed += 1;
                    if is_down(e) {
                        after.store_down.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            self.on_group(group, result, &mut after, now);
        }
        self.after_commit(after, now);
    }

    /// Routes one group's outcome.
    fn on_group(
        &mut self,
        group: Group,
        result: Result<Receipt, StoreError>,
        after: &mut AfterCommit,
        now: Millis,
    ) {
        match group {
            Group::Ack { peer, work } => match result {
                Ok(_) => {
                    if let Some(epoch) = work.epoch {
                        self.peers.record_epoch(peer, epoch);
                    }
                }
                Err(StoreError::Conflict(_)) => {}
                Err(_) => self.committer.retry_ack(peer, work),
            },
            Group::Accept {
                peer,
                stream,
                last,
                cid,
            } => match result {
                Ok(_) => {
                    if self.receiver.committed(&stream, last, cid) {
                        after.acks.insert((peer, stream));
                    }
                }
                Err(_) => {
                    after.failed_streams.insert(stream);
                }
            },
            Group::Gap {
                peer,
                stream,
                earliest,
            } => match result {
                Ok(_) => {
                    self.out.metrics.gaps_recorded += 1;
                    if self.receiver.committed(&stream, earliest - 1, None) {
                        after.acks.insert((peer, stream));
                    }
                }
                Err(_) => {
                    after.failed_streams.insert(stream);
                }
            },
            Group::Peer { req, change } => self.on_peer_committed(req, change, result),
            Group::Write { req, agent } => {
                if let (Some(change), Ok(_)) = (agent, &result) {
                    self.on_agent_change(change);
                }
                self.out.push(Effect::Written { req, result });
            }
            Group::Housekeeping => {}
            Group::Card { card } => self.on_card_committed(card, result),
            Group::Append {
                to,
                batch,
                senders,
                tracked,
            } => {
                let sends = (senders, tracked);
                self.on_append_committed(to, batch, sends, result, after, now);
            }
            Group::Trim => {
                if let Ok(Receipt {
                    trim: Some(report), ..
                }) = result
                {
                    if self.journal.is_some_and(|j| j.first != report.bounds.first) {
                        self.out.metrics.trims += 1;
                    }
                    self.journal = Some(report.bounds);
                    if report.more {
                        self.committer.want_trim();
                    } else {
                        self.committer.set_trim_at(report.next_due_ms.map(Millis));
                    }
                }
            }
            Group::Lost { to, tally } => {
                if result.is_err() {
                    self.committer.lost_again(to, tally);
                }
            }
            Group::EndEpoch => {}
            Group::Conflict { stream } => {
                if result.is_err() {
                    self.receiver.conflict_unrecorded(&stream);
                }
            }
            Group::RolledBack { stream, from } => {
                if result.is_err() {
                    self.receiver.rolled_back_unrecorded(&stream, from);
                }
            }
            Group::Report { report } => {
                if matches!(result, Err(ref e) if is_down(e)) {
                    self.committer.queue_report(report);
                }
            }
            Group::NewEpoch { switch } => self.on_switch_committed(switch, result, now),
            Group::Carry {
                from,
                to,
                upto,
                batches,
            } => {
                let ok = result.is_ok();
                self.author.carry_done(&from, upto, ok);
                if ok {
                    for b in batches {
                        self.author.send_fresh(to, b, now, &mut self.out);
                    }
                }
            }
        }
    }

    /// The new epoch's commit returned: on success the author writes the
    /// new epoch, every live peer hears of it (a Hello again, and what its
    /// ended stream lost) and is fed the new stream from its start.
    fn on_switch_committed(
        &mut self,
        mut switch: EpochSwitch,
        result: Result<Receipt, StoreError>,
        now: Millis,
    ) {
        let receipt = match result {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, StoreError::Conflict(_)) {
                    // That epoch was written before: another one.
                    switch.epoch = self.author.next_epoch();
                }
                self.committer.switch_again(switch);
                return;
            }
        };
        let epoch = switch.epoch;
        self.author.switched(epoch, &receipt.ended);
        self.out.metrics.epoch_switches += 1;
        self.out.push(Effect::EpochChanged { epoch });
        let late = self.committer.take_after_switch();
        for r in &late {
            self.committer.queue_report(r.clone());
        }
        for (peer, conn) in self.peers.live() {
            let hello = self.hello_frame(peer);
            self.out.send(peer, conn, hello);
            for r in switch.reports.iter().chain(&late) {
                if r.stream.channel == Channel::Direct(peer) {
                    let frame = Frame::StreamEnded {
                        stream: r.stream.clone(),
                        held: r.held,
                    };
                    self.out.send(peer, conn, frame);
                }
            }
            let (config, out) = (&self.config, &mut self.out);
            self.author.start_feed(peer, conn, 0, now, config, out);
        }
    }

    fn on_peer_committed(
        &mut self,
        req: ReqId,
        mut change: PeerChange,
        result: Result<Receipt, StoreError>,
    ) {
        let node = change.node();
        if result.is_ok() {
            // The ack that may have shared this commit set the epoch.
            if let PeerChange::Put(r) = &mut change {
                r.epoch = self.peers.record(node).and_then(|p| p.epoch);
            }
            self.apply_peer_change(change);
        }
        let result = result.map(|_| ()).map_err(PeerChangeError::Store);
        self.out.push(Effect::PeerChanged { req, node, result });
    }

    /// Answers the senders of one own batch, and sends it to the peer if
    /// its feed is right before it.
    fn on_append_committed(
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
        let stream = batch.batch().stream().clone();
        let first = batch.batch().first_seq();
        // The store journals a batch's envelopes last in its group, in seq
        // order: they end at `last`.
        let n = batch.batch().entries().len() as u64;
        let first_arrival = receipt
            .arrivals
            .map_or(0, |(_, last)| (last + 1).saturating_sub(n));
        self.out.metrics.sends_ok += senders.len() as u64;
        for (i, req) in senders.into_iter().enumerate() {
            let receipt = SendReceipt {
                stream: stream.clone(),
                seq: first + i as u64,
                arrival: first_arrival + i as u64,
            };
            self.reply(req, Ok(receipt));
        }
        self.author.send_fresh(to, batch, now, &mut self.out);
    }

    /// What follows a commit once its groups are handled.
    fn after_commit(&mut self, after: AfterCommit, now: Millis) {
        if let Some(why) = after.store_down {
            self.committer.store_failed(now, &self.config, why);
        } else if after.store_works {
            self.committer.store_works();
        }
        if !after.held.is_empty() {
            self.out.metrics.sends_held += after.held.len() as u64;
            let over = self.committer.hold_again(after.held, &self.config);
            self.refuse_held(over);
        }
        let (config, out) = (&self.config, &mut self.out);
        for stream in &after.failed_streams {
            let queue = &mut self.committer.inbound;
            self.receiver.roll_back(
                stream,
                queue,
                &mut Env {
                    peers: &self.peers,
                    config,
                    now,
                    out,
                },
            );
        }
        for (peer, stream) in after.acks {
            let upto = self.receiver.mark(&stream);
            send_live(&self.peers, peer, Frame::Ack { stream, upto }, out);
        }
        if let Some(upto) = after.journaled {
            out.push(Effect::Journaled { upto });
            // The rows just written pass the age bound a dating step after
            // it at the latest; the next trim says when, exactly, if earlier.
            if config.journal_age_ms_max > 0 && self.committer.trim_deadline().is_none() {
                let at = now.plus(config.journal_age_ms_max + mesh_store::JOURNAL_TIME_STEP_MS);
                self.committer.set_trim_at(Some(at));
            }
        }
        self.author.pump_all(config, out);
        if !self.committer.carrying() && !self.committer.switching() {
            self.author.next_carry(config, out);
        }
    }

    /// Answers sends past the hold bounds: refused at once (nothing was written).
    fn refuse_held(&mut self, sends: Vec<WaitingSend>) {
        let (held, _) = self.committer.sends_waiting();
        let why = self
            .committer
            .store_down()
            .map_or_else(|| "the store failed".to_owned(), |d| d.why.clone());
        self.out.metrics.sends_refused += sends.len() as u64;
        for s in sends {
            let result = Err(SendError::StoreDown {
                held,
                why: why.clone(),
            });
            self.out.push(Effect::Reply { req: s.req, result });
        }
    }

    /// Lets go the held sends whose hold has ended: answered 503, and
    /// journaled as lost once the store takes a commit.
    pub(super) fn expire_held(&mut self, now: Millis) {
        let expired = self.committer.expire_held(now, &self.config);
        if expired.is_empty() {
            return;
        }
        let why = self
            .committer
            .store_down()
            .map_or_else(|| "the store failed".to_owned(), |d| d.why.clone());
        self.committer.note_lost(&expired);
        self.out.metrics.sends_let_go += expired.len() as u64;
        for s in expired {
            let result = Err(SendError::Held {
                held_ms: now.0.saturating_sub(s.created_ms),
                why: why.clone(),
            });
            self.out.push(Effect::Reply { req: s.req, result });
        }
    }
}

/// Whether a store error means the store cannot commit now (rather than
/// that the ops broke a rule).
fn is_down(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_) | StoreError::Closed)
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

/// The op journaling a rolled-back stream.
fn report_op(r: &super::commit::Report) -> WriteOp {
    WriteOp::ReportRolledBack {
        stream: r.stream.clone(),
        held: r.held,
        world: r.world,
        detail: r.detail.clone(),
    }
}

/// The op journaling held sends to `to` let go.
fn lost_op(to: NodeId, t: LostTally, config: &super::Config) -> WriteOp {
    WriteOp::RecordLost {
        to,
        msgs: t.msgs,
        bytes: t.bytes,
        first_ms: t.first_ms,
        last_ms: t.last_ms,
        detail: format!(
            "{} sends to {} were held {} ms while the store could not commit them, then let go; \
             their senders were answered 503 and nothing of them was written or sent",
            t.msgs,
            to.fmt_short(),
            config.hold_ms
        ),
    }
}

/// The group of one peer batch or gap, with the agent `index` ops of its
/// envelopes.
fn batch_inbound(batch: &mut Batch, work: InboundWork, index: Vec<WriteOp>) {
    match work {
        InboundWork::Accept {
            peer,
            from,
            batch: open,
        } => {
            let stream = open.batch().stream().clone();
            let last = open.batch().last_seq();
            let cid = open.batch().entries().last().map(|h| h.payload_cid);
            let mut ops = vec![WriteOp::Accept { batch: open, from }];
            ops.extend(index);
            batch.push(
                ops,
                Group::Accept {
                    peer,
                    stream,
                    last,
                    cid,
                },
            );
        }
        InboundWork::Gap {
            peer,
            stream,
            earliest,
        } => {
            let ops = vec![WriteOp::Gap {
                stream: stream.clone(),
                earliest_available: earliest,
            }];
            let group = Group::Gap {
                peer,
                stream,
                earliest,
            };
            batch.push(ops, group);
        }
        InboundWork::Conflict {
            stream,
            seq,
            ours,
            theirs,
        } => {
            let ops = vec![WriteOp::RecordConflict {
                stream: stream.clone(),
                seq,
                ours,
                theirs,
            }];
            batch.push(ops, Group::Conflict { stream });
        }
        InboundWork::RolledBack { stream, from, to } => {
            let detail = format!(
                "the author's store went back in time: it holds this stream as this node has \
                 it only up to seq {}; seqs {from}..={to} here are what it lost, or holds other \
                 envelopes under, and its new epoch is a new stream",
                from - 1
            );
            let ops = vec![WriteOp::RecordRolledBack {
                stream: stream.clone(),
                from,
                to,
                detail,
            }];
            batch.push(ops, Group::RolledBack { stream, from });
        }
    }
}
