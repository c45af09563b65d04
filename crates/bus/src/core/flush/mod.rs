//! Building the next commit from what the machines queued, and routing
//! each group's outcome back to the machine it was for.

mod committed;
mod sends;

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{
    Epoch, MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES, NewEnvelope, NodeId, OpenBatch, Seq,
    StreamId,
};
use mesh_store::{PeerRecord, WriteOp};

use super::commit::{Batch, CarryWork, Group, InboundWork, LostTally};
use super::peers::PeerChange;
use super::receiver::Env;
use super::{Core, Millis};

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
        let wanted_trim = self.build_trim(&mut batch, now);
        let (epochs, acking, ends) = self.build_acks(&mut batch);
        self.build_epoch_reports(&mut batch);
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
        if !self.committer.switching() {
            self.build_publishes(&mut batch, now);
        }
        for (req, write) in self.committer.take_writes() {
            let agent = super::agents::AgentChange::of(&write);
            let topic = super::topics::TopicChange::of(&write);
            batch.push(write.into_ops(), Group::Write { req, agent, topic });
        }
        let housekeeping = self.agent_housekeeping(now);
        if !housekeeping.is_empty() {
            batch.push(housekeeping, Group::Housekeeping);
        }
        self.committer.start(batch, wanted_trim, &mut self.out);
    }

    /// The journal's trim group, first in every commit; returns whether a
    /// trim was wanted even if nothing else waited, and clears the want.
    fn build_trim(&mut self, batch: &mut Batch, now: Millis) -> bool {
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
        wanted_trim
    }

    /// The new epoch's group if one waits (with what its ended streams
    /// report), then one group per other report of an ended stream.
    fn build_epoch_reports(&mut self, batch: &mut Batch) {
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
        let (ops, batches) = self.sign_carry(to, &from, envelopes);
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

    /// Re-signs the carried `envelopes` of `from` into the current epoch's
    /// stream to `to`, one batch per batch limit: each batch's carry-over op
    /// and the batch, in order, up to the first that fails to sign.
    fn sign_carry(
        &mut self,
        to: NodeId,
        from: &StreamId,
        envelopes: Vec<(Seq, NewEnvelope)>,
    ) -> (Vec<WriteOp>, Vec<OpenBatch>) {
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
        (ops, batches)
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
            conn,
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
                    conn,
                    stream,
                    last,
                    cid,
                },
            );
        }
        InboundWork::Gap {
            peer,
            conn,
            stream,
            earliest,
        } => {
            let ops = vec![WriteOp::Gap {
                stream: stream.clone(),
                earliest_available: earliest,
            }];
            let group = Group::Gap {
                peer,
                conn,
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
        InboundWork::TopicAccept {
            peer,
            from,
            batch: open,
            evict,
        } => {
            let stream = open.batch().stream().clone();
            let last = open.batch().last_seq();
            let ops = vec![WriteOp::AcceptTopic {
                batch: open.clone(),
                from,
                evict,
            }];
            let group = Group::TopicAccept {
                peer,
                stream,
                last,
                batch: open,
            };
            batch.push(ops, group);
        }
        InboundWork::TopicGap { stream, earliest } => {
            let ops = vec![WriteOp::Gap {
                stream: stream.clone(),
                earliest_available: earliest,
            }];
            batch.push(ops, Group::TopicGap { stream, earliest });
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
