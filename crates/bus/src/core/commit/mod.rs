//! Group commit: at most one [`Effect::Persist`] in flight; whatever arrives
//! meanwhile waits in bounded queues and goes into the next one.

mod queues;
mod work;

use std::collections::{BTreeMap, VecDeque};

use mesh_protocol::{Cid, NodeCard, NodeId, OpenBatch, Seq, StreamId};
use mesh_store::{Receipt, StoreError, WriteOp};

use super::peers::PeerChange;
use super::{CommitId, Config, Effect, LocalWrite, Millis, Out, ReqId};

pub(super) use work::{
    AckWork, CarryWork, EpochSwitch, InboundQueue, InboundWork, LostTally, Report, WaitingPublish,
    WaitingSend,
};

/// Why the store is taken to be down: its last error.
#[derive(Clone, Debug)]
pub(super) struct StoreDown {
    pub(super) why: String,
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
    /// A peer batch that came on `conn`: its ack goes back on `conn` only.
    Accept {
        peer: NodeId,
        conn: super::ConnId,
        stream: StreamId,
        last: Seq,
        cid: Option<Cid>,
    },
    Gap {
        peer: NodeId,
        conn: super::ConnId,
        stream: StreamId,
        earliest: Seq,
    },
    Append {
        to: NodeId,
        batch: OpenBatch,
        senders: Vec<ReqId>,
        /// Each send's agent addressing and retried-send record, kept so
        /// that a batch the store could not write is held as it came.
        tracked: Vec<Option<Box<super::agents::Tracked>>>,
    },
    Peer {
        req: ReqId,
        change: PeerChange,
    },
    Write {
        req: ReqId,
        /// The agent it adds or removes, applied once committed.
        agent: Option<super::agents::AgentChange>,
        /// The topic it joins or leaves, applied once committed.
        topic: Option<super::topics::TopicChange>,
    },
    /// A member's topic batch, kept to relay once committed.
    TopicAccept {
        peer: NodeId,
        stream: StreamId,
        last: Seq,
        batch: OpenBatch,
    },
    TopicGap {
        stream: StreamId,
        earliest: Seq,
    },
    /// A batch of this node's own stream of a topic.
    Publish {
        batch: OpenBatch,
        senders: Vec<ReqId>,
        /// The publish request of each, kept so that a batch the store
        /// could not write is held as it came.
        requests: Vec<u64>,
    },
    /// Store ops no request waits for (expired retried-send records).
    Housekeeping,
    Trim,
    Lost {
        to: NodeId,
        tally: LostTally,
    },
    EndEpoch,
    Conflict {
        stream: StreamId,
    },
    RolledBack {
        stream: StreamId,
        from: Seq,
    },
    NewEpoch {
        switch: EpochSwitch,
    },
    Report {
        report: Report,
    },
    Carry {
        from: StreamId,
        to: NodeId,
        upto: Seq,
        batches: Vec<OpenBatch>,
    },
    /// A node's newer card (this node's own, or a peer's learned one).
    Card {
        card: NodeCard,
    },
    /// A queued keyed message of the stream to `to` replaced by its tombstone.
    Supersede {
        to: NodeId,
    },
}

/// A commit being built: the store's groups and what each is for.
#[derive(Debug, Default)]
pub(super) struct Batch {
    groups: Vec<Vec<WriteOp>>,
    meta: Vec<Group>,
}

impl Batch {
    pub(super) fn push(&mut self, ops: Vec<WriteOp>, group: Group) {
        self.groups.push(ops);
        self.meta.push(group);
    }
}

/// The commit in flight.
#[derive(Debug)]
struct InFlight {
    id: CommitId,
    groups: Vec<Group>,
}

/// The queues of work waiting for the next commit, and the one in flight.
///
/// Invariants: at most one commit is in flight; `send_bytes` is the payload
/// bytes of `sends`, `publish_bytes` of `publishes`; each queue stays
/// within its bound. While the store is down (`store_down`), the sends and
/// publishes waiting are the held ones, within one budget: the hold bounds
/// count both together.
#[derive(Debug)]
pub(super) struct Committer {
    sends: VecDeque<WaitingSend>,
    send_bytes: u64,
    /// Publishes to topics, in the order asked, within the bounds of sends.
    publishes: VecDeque<WaitingPublish>,
    publish_bytes: u64,
    /// The number of the next publish request.
    next_request: u64,
    /// Peer batches and gaps.
    pub(super) inbound: InboundQueue,
    acks: BTreeMap<NodeId, AckWork>,
    /// When the acks waiting were first seen by [`Committer::ready`] (`None`
    /// when none wait): they may wait for company until `ack_ride_ms` after it.
    acks_since: Option<Millis>,
    /// Peer changes, in the order asked (at most [`super::WAITING_PEER_CHANGES_MAX`]).
    peer_changes: VecDeque<(ReqId, PeerChange)>,
    /// Local writes, in the order asked (at most [`super::WAITING_WRITES_MAX`]).
    writes: VecDeque<(ReqId, LocalWrite)>,
    /// Held sends let go, per peer (at most one tally each), to be journaled.
    lost: BTreeMap<NodeId, LostTally>,
    /// A new store epoch to commit.
    switch: Option<EpochSwitch>,
    /// Rolled-back ended streams to journal (at most one per ended stream).
    reports: Vec<Report>,
    /// The next carry-over chunk (one at a time).
    carry: Option<CarryWork>,
    /// Rollbacks found while a new epoch was being committed: reported,
    /// and told to their peers, once it is.
    after_switch: Vec<Report>,
    /// A trim is due even if nothing else is.
    trim_wanted: bool,
    /// When the next trim is due (its timer).
    trim_at: Option<Millis>,
    /// Newer cards to keep, at most one per node (so at most one per peer
    /// and this node's own).
    cards: BTreeMap<NodeId, NodeCard>,
    in_flight: Option<InFlight>,
    next_commit: u64,
    /// After a store failure: no commit before this.
    store_retry_at: Option<Millis>,
    /// The store failed and has not committed anything since.
    store_down: Option<StoreDown>,
}

impl Committer {
    pub(super) fn new() -> Committer {
        Committer {
            sends: VecDeque::new(),
            send_bytes: 0,
            publishes: VecDeque::new(),
            publish_bytes: 0,
            next_request: 1,
            inbound: InboundQueue::default(),
            acks: BTreeMap::new(),
            acks_since: None,
            peer_changes: VecDeque::new(),
            writes: VecDeque::new(),
            lost: BTreeMap::new(),
            switch: None,
            reports: Vec::new(),
            carry: None,
            after_switch: Vec::new(),
            trim_wanted: false,
            trim_at: None,
            cards: BTreeMap::new(),
            in_flight: None,
            next_commit: 1,
            store_retry_at: None,
            store_down: None,
        }
    }

    /// Whether a commit is outstanding (built, not yet answered).
    pub(super) fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether a commit is outstanding or anything waits for one.
    pub(super) fn is_committing(&self) -> bool {
        self.in_flight.is_some() || !self.is_empty()
    }

    /// Whether a stopping node must wait for the store: a commit is
    /// outstanding, or work waits while the store works. Held sends and
    /// publishes (the store is down) are not waited for: they are answered
    /// "stopped".
    pub(super) fn must_drain(&self) -> bool {
        self.in_flight.is_some() || (!self.is_empty() && self.store_down.is_none())
    }

    fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.acks.is_empty() && !self.has_other_work()
    }

    /// Whether anything but sends and acks waits for a commit.
    fn has_other_work(&self) -> bool {
        !self.inbound.work.is_empty()
            || !self.publishes.is_empty()
            || !self.peer_changes.is_empty()
            || !self.writes.is_empty()
            || !self.cards.is_empty()
            || !self.lost.is_empty()
            || self.switch.is_some()
            || !self.reports.is_empty()
            || self.carry.is_some()
            || self.trim_wanted
    }

    /// Publishes waiting, and their payload bytes.
    pub(super) fn publishes_waiting(&self) -> (usize, u64) {
        (self.publishes.len(), self.publish_bytes)
    }

    /// Sends and publishes waiting, and their payload bytes: what the hold
    /// bounds count while the store is down.
    pub(super) fn held(&self) -> (usize, u64) {
        (
            self.sends.len() + self.publishes.len(),
            self.send_bytes + self.publish_bytes,
        )
    }

    /// Queues the publishes of one request to `topic`, taken at `now`, for
    /// the next commit, in order (the caller checked the bounds).
    pub(super) fn queue_publishes(
        &mut self,
        topic: &mesh_protocol::TopicName,
        msgs: Vec<super::Publication>,
        now: Millis,
    ) {
        let request = self.next_request;
        self.next_request += 1;
        for m in msgs {
            self.publish_bytes += m.payload.len() as u64;
            self.publishes.push_back(WaitingPublish {
                req: m.req,
                topic: topic.clone(),
                kind: m.kind,
                payload: m.payload,
                created_ms: now.0,
                request,
            });
        }
    }

    /// The publishes waiting, for the next commit.
    pub(super) fn take_publishes(&mut self) -> VecDeque<WaitingPublish> {
        self.publish_bytes = 0;
        std::mem::take(&mut self.publishes)
    }

    /// The store is down, and why, if it is.
    pub(super) fn store_down(&self) -> Option<&StoreDown> {
        self.store_down.as_ref()
    }

    /// Whether the next commit may start now. Keeps the clock of acks
    /// waiting for company, and the store's retry bound.
    pub(super) fn ready(&mut self, now: Millis, config: &Config) -> bool {
        let since = if self.acks.is_empty() {
            None
        } else {
            Some(self.acks_since.unwrap_or(now))
        };
        self.acks_since = since;
        if self.in_flight.is_some() {
            return false;
        }
        if let Some(t) = self.store_retry_at {
            if now < t {
                return false;
            }
            self.store_retry_at = None;
        }
        !self.acks_may_wait(now, config)
    }

    /// Whether the only work waiting is acks that may still wait for other
    /// work (sends, peer batches, peer changes, local writes) to share their commit: plain acks (no reset, no new epoch, which
    /// are written at once), seen less than `ack_ride_ms` ago.
    ///
    /// Nothing else waits for an ack record: sends that need the room an
    /// ack makes wait for the commit after the ack's, which any send
    /// starts at once. A reset or an epoch record
    /// is not delayed: until it is written, the store holds an acked mark
    /// a new peer store no longer has.
    fn acks_may_wait(&self, now: Millis, config: &Config) -> bool {
        let Some(since) = self.acks_since else {
            return false;
        };
        self.sends.is_empty()
            && !self.has_other_work()
            && self.acks.values().all(|a| !a.urgent())
            && now < since.plus(config.ack_ride_ms)
    }

    /// Issues `batch` as the commit in flight, unless it holds nothing but
    /// the trim every commit carries and no trim was wanted.
    pub(super) fn start(&mut self, batch: Batch, wanted_trim: bool, out: &mut Out) {
        debug_assert!(self.in_flight.is_none(), "one commit in flight at most");
        let only_trim = batch.meta.iter().all(|g| matches!(g, Group::Trim));
        if batch.groups.is_empty() || (only_trim && !wanted_trim) {
            return;
        }
        let id = CommitId(self.next_commit);
        self.next_commit += 1;
        out.metrics.commits += 1;
        self.in_flight = Some(InFlight {
            id,
            groups: batch.meta,
        });
        out.push(Effect::Persist {
            commit: id,
            groups: batch.groups,
        });
    }

    /// The store's answer to `commit`: each group with its result, or
    /// `None` if that is not the commit in flight (counted as stale).
    pub(super) fn finish(
        &mut self,
        commit: CommitId,
        results: Vec<Result<Receipt, StoreError>>,
        out: &mut Out,
    ) -> Option<Vec<(Group, Result<Receipt, StoreError>)>> {
        let Some(flight) = self.in_flight.take_if(|f| f.id == commit) else {
            out.metrics.stale_answers += 1;
            return None;
        };
        let mut results = results.into_iter();
        let outcomes = flight
            .groups
            .into_iter()
            .map(|g| {
                let result = results.next().unwrap_or_else(|| {
                    Err(StoreError::Unavailable(
                        "the store gave no result for this group".into(),
                    ))
                });
                (g, result)
            })
            .collect();
        Some(outcomes)
    }

    /// The store failed (`why`): no commit before `store_retry_ms` from
    /// now, and the sends and publishes waiting are held until it works
    /// again.
    pub(super) fn store_failed(&mut self, now: Millis, config: &Config, why: String) {
        self.store_retry_at = Some(now.plus(config.store_retry_ms));
        match &mut self.store_down {
            Some(down) => down.why = why,
            None => self.store_down = Some(StoreDown { why }),
        }
    }

    /// The store committed something: it works.
    pub(super) fn store_works(&mut self) {
        self.store_down = None;
    }

    /// When the store may be tried again, after a failure.
    pub(super) fn store_retry_deadline(&self) -> Option<Millis> {
        self.store_retry_at
    }

    /// When the acks waiting were first seen, and whether a commit is in
    /// flight (for tests that let the ride bound pass).
    #[cfg(test)]
    pub(super) fn acks_waiting(&self) -> (Option<Millis>, bool) {
        (self.acks_since, self.in_flight.is_some())
    }

    /// When acks waiting for company must be committed alone, if any wait.
    pub(super) fn ack_ride_deadline(&self, config: &Config) -> Option<Millis> {
        if self.in_flight.is_some() || self.store_retry_at.is_some() {
            return None;
        }
        self.acks_since.map(|since| since.plus(config.ack_ride_ms))
    }
}
