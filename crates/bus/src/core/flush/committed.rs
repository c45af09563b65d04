//! The store's answer to a commit: each group's outcome routed back to the
//! machine it was for, then what the commit leaves to do.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{Channel, Cid, Frame, NodeId, OpenBatch, Seq, StreamId};
use mesh_store::{Arrival, Receipt, StoreError};

use crate::core::ConnId;
use crate::core::commit::{AckWork, EpochSwitch, Group, WaitingPublish, WaitingSend};
use crate::core::peers::PeerChange;
use crate::core::receiver::Env;
use crate::core::{CommitId, Core, Effect, Millis, PeerChangeError, ReqId, SendError};

/// What a finished commit leaves to do once every group is handled.
#[derive(Debug, Default)]
pub(super) struct AfterCommit {
    /// The last journal position written.
    journaled: Option<Arrival>,
    /// A group failed for want of a working store (its error): wait before
    /// the next commit, and hold the sends.
    store_down: Option<String>,
    /// A group committed: the store works.
    store_works: bool,
    /// Sends whose commit failed for want of a store, to hold again, in order.
    pub(super) held: Vec<WaitingSend>,
    /// Publishes whose commit failed for want of a store, to hold again,
    /// in order.
    pub(super) held_publishes: Vec<WaitingPublish>,
    /// Streams whose committed mark moved: their authors get an Ack, on
    /// the connection the batch came on if it is still the live one.
    acks: BTreeSet<(NodeId, ConnId, StreamId)>,
    /// Streams whose accept or gap failed: roll back and ask again.
    failed_streams: BTreeSet<StreamId>,
    /// Own streams whose append failed, and why: later batches of the
    /// stream in the same commit could not follow it.
    pub(super) failed_sends: BTreeMap<NodeId, SendError>,
    /// Peers whose outbox this commit replaced batches of: their feeds
    /// read again.
    replaced: BTreeSet<NodeId>,
}

impl Core {
    /// The answer to the commit in flight: each group's outcome goes to the
    /// machine it was for, then acks, rollbacks and feeds follow.
    pub(in crate::core) fn on_committed(
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
                    self.topics.committed(&receipt.own_streams);
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
        // Marks moved: a drain may be followed now; and the sends built
        // before a move was learned are committed, so it can be followed.
        self.check_drains();
        self.send_follows();
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
            Group::Ack { peer, work } => self.on_ack_committed(peer, work, &result),
            Group::Accept {
                peer,
                conn,
                stream,
                last,
                cid,
            } => {
                let ok = result.is_ok();
                if let Ok(r) = &result {
                    // Read receipts are counted here, once the store found
                    // what they mark (see `index_inbound_receipt`).
                    let a = &mut self.out.metrics.agents;
                    a.receipts_received += r.read.taken;
                    a.receipts_refused += r.read.refused;
                    a.receipt_ids_skipped += r.read.skipped;
                }
                self.on_accept_committed((peer, conn), stream, last, cid, ok, after);
            }
            Group::Gap {
                peer,
                conn,
                stream,
                earliest,
            } => self.on_gap_committed((peer, conn), stream, earliest, result.is_ok(), after),
            Group::Peer { req, change } => self.on_peer_committed(req, change, result),
            Group::Write { req, agent, topic } => {
                if let (Some(change), Ok(_)) = (agent, &result) {
                    self.on_agent_change(change);
                }
                if let (Some(change), Ok(_)) = (topic, &result) {
                    self.topics.apply(change, &mut self.out);
                }
                self.out.push(Effect::Written { req, result });
            }
            Group::TopicAccept {
                peer,
                stream,
                last,
                batch,
            } => {
                let ok = result.is_ok();
                self.topics.committed_mark(&stream, last, ok);
                if ok {
                    self.topics.relay(&batch, Some(peer), &mut self.out);
                }
            }
            Group::TopicGap { stream, earliest } => {
                self.topics
                    .committed_mark(&stream, earliest - 1, result.is_ok());
            }
            Group::Publish {
                batch,
                senders,
                requests,
            } => self.on_publish_committed(batch, (senders, requests), result, after),
            Group::Housekeeping => {}
            Group::Card { card } => self.on_card_committed(card, result),
            Group::Supersede { to } => {
                self.on_replace_committed(result.is_ok());
                after.replaced.insert(to);
            }
            Group::Append {
                to,
                batch,
                senders,
                tracked,
            } => {
                let sends = (senders, tracked);
                self.on_append_committed(to, batch, sends, result, after, now);
            }
            Group::Trim => self.on_trim_committed(result),
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
                    if super::super::topics::topic_of(&stream).is_some() {
                        self.topics.rolled_back_unrecorded(&stream, from);
                    } else {
                        self.receiver.rolled_back_unrecorded(&stream, from);
                    }
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
            } => self.on_carry_committed(from, to, upto, batches, result.is_ok(), now),
        }
    }

    /// An ack's commit returned: the peer's epoch it carried is recorded,
    /// or the ack is retried unless it lost to a conflict.
    fn on_ack_committed(
        &mut self,
        peer: NodeId,
        work: AckWork,
        result: &Result<Receipt, StoreError>,
    ) {
        match result {
            Ok(_) => {
                if let Some(epoch) = work.epoch {
                    self.peers.record_epoch(peer, epoch);
                }
            }
            Err(StoreError::Conflict(_)) => {}
            Err(_) => self.committer.retry_ack(peer, work),
        }
    }

    /// An accepted batch's commit returned: its stream's author is acked if
    /// the committed mark moved, or the stream is rolled back on failure.
    fn on_accept_committed(
        &mut self,
        (peer, conn): (NodeId, ConnId),
        stream: StreamId,
        last: Seq,
        cid: Option<Cid>,
        ok: bool,
        after: &mut AfterCommit,
    ) {
        if !ok {
            after.failed_streams.insert(stream);
        } else if self.receiver.committed(&stream, last, cid) {
            after.acks.insert((peer, conn, stream));
        }
    }

    /// A recorded gap's commit returned: as an accept, with the mark just
    /// before the earliest seq the author still has.
    fn on_gap_committed(
        &mut self,
        (peer, conn): (NodeId, ConnId),
        stream: StreamId,
        earliest: Seq,
        ok: bool,
        after: &mut AfterCommit,
    ) {
        if !ok {
            after.failed_streams.insert(stream);
            return;
        }
        self.out.metrics.gaps_recorded += 1;
        if self.receiver.committed(&stream, earliest - 1, None) {
            after.acks.insert((peer, conn, stream));
        }
    }

    /// A trim's commit returned: the journal's new bounds are kept and the
    /// next trim is wanted now (more to do) or scheduled.
    fn on_trim_committed(&mut self, result: Result<Receipt, StoreError>) {
        let Ok(Receipt {
            trim: Some(report), ..
        }) = result
        else {
            return;
        };
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

    /// A carry's commit returned: the author learns how it went and, on
    /// success, sends the carried batches to `to` as fresh ones.
    fn on_carry_committed(
        &mut self,
        from: StreamId,
        to: NodeId,
        upto: Seq,
        batches: Vec<OpenBatch>,
        ok: bool,
        now: Millis,
    ) {
        self.author.carry_done(&from, upto, ok);
        if ok {
            for b in batches {
                self.author.send_fresh(to, b, now, &mut self.out);
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
        // Every connection hears the new epoch, one whose peer's Hello has
        // not come yet too: the Hello it got named the old epoch, and the
        // peer would take none of the new streams' batches under it.
        for (peer, conn, live) in self.peers.connected() {
            let hello = self.hello_frame(peer);
            self.out.send(peer, conn, hello);
            if !live {
                continue;
            }
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
        // An ended topic stream's members hear what this store holds of it
        // (they journal what it lost); publishes go on the new epoch's.
        for r in switch.reports.iter().chain(&late) {
            if crate::core::topics::topic_of(&r.stream).is_some() {
                self.topics
                    .tell_ended(&r.stream, r.held, r.world, &mut self.out);
            }
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

    /// What follows a commit once its groups are handled.
    fn after_commit(&mut self, after: AfterCommit, now: Millis) {
        if let Some(why) = after.store_down {
            self.committer.store_failed(now, &self.config, why);
        } else if after.store_works {
            self.committer.store_works();
        }
        if !after.held.is_empty() || !after.held_publishes.is_empty() {
            self.out.metrics.sends_held += (after.held.len() + after.held_publishes.len()) as u64;
            let (sends, publishes) =
                self.committer
                    .hold_again(after.held, after.held_publishes, &self.config);
            self.refuse_held(sends, publishes);
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
        for (peer, conn, stream) in after.acks {
            // Not on a connection that replaced the batch's: that one may
            // be another process with this node's key (a cloned data dir),
            // whose own envelopes at these seqs this store does not hold.
            // It learns the mark from the Hello, with the envelope's hash,
            // or from the ack of a batch of its own.
            if self.peers.live_conn(peer) != Some(conn) {
                out.metrics.acks_withheld += 1;
                continue;
            }
            let upto = self.receiver.mark(&stream);
            out.send(peer, conn, Frame::Ack { stream, upto });
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
        self.author.replaced(after.replaced, config, out);
        self.author.pump_all(config, out);
        if !self.committer.carrying() && !self.committer.switching() {
            self.author.next_carry(config, out);
        }
    }
}

/// Whether a store error means the store cannot commit now (rather than
/// that the ops broke a rule).
pub(super) fn is_down(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_) | StoreError::Closed)
}
