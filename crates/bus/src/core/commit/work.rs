//! The work that waits in the committer's queues for the next commit.

use std::collections::VecDeque;

use mesh_protocol::{Cid, Epoch, NewEnvelope, NodeId, OpenBatch, Seq, StreamId};

use crate::core::{ReqId, WAITING_BATCH_BYTES_MAX, WAITING_BATCHES_MAX};

/// Held sends to one peer let go after the hold bound, to be journaled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::core) struct LostTally {
    pub(in crate::core) msgs: u64,
    pub(in crate::core) bytes: u64,
    pub(in crate::core) first_ms: u64,
    pub(in crate::core) last_ms: u64,
}

impl LostTally {
    pub(super) fn add(&mut self, other: LostTally) {
        if self.msgs == 0 {
            *self = other;
            return;
        }
        self.msgs += other.msgs;
        self.bytes += other.bytes;
        self.first_ms = self.first_ms.min(other.first_ms);
        self.last_ms = self.last_ms.max(other.last_ms);
    }
}

/// A rolled-back stream to journal: what this store holds of it as its
/// peer has it, what the peer holds, and a sentence for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::core) struct Report {
    pub(in crate::core) stream: StreamId,
    pub(in crate::core) held: Seq,
    pub(in crate::core) world: Seq,
    pub(in crate::core) detail: String,
}

/// The next store epoch, to be committed with the rollbacks that call for it.
#[derive(Clone, Debug)]
pub(in crate::core) struct EpochSwitch {
    pub(in crate::core) epoch: Epoch,
    pub(in crate::core) reports: Vec<Report>,
}

/// Envelopes of an ended own stream, read back to be re-signed into the
/// new epoch's stream to the same peer.
#[derive(Debug)]
pub(in crate::core) struct CarryWork {
    pub(in crate::core) from: StreamId,
    pub(in crate::core) to: NodeId,
    /// The seq of `from` of each envelope, and the envelope.
    pub(in crate::core) envelopes: Vec<(Seq, NewEnvelope)>,
}

/// A local publish to a topic waiting for the next commit.
#[derive(Debug)]
pub(in crate::core) struct WaitingPublish {
    pub(in crate::core) req: ReqId,
    pub(in crate::core) topic: mesh_protocol::TopicName,
    pub(in crate::core) kind: u16,
    pub(in crate::core) payload: Vec<u8>,
    pub(in crate::core) created_ms: u64,
    /// The publish request it came in (one number per request): a batch
    /// is held, refused or let go whole.
    pub(in crate::core) request: u64,
}

/// A local send waiting for the next commit.
#[derive(Debug)]
pub(in crate::core) struct WaitingSend {
    pub(in crate::core) req: ReqId,
    pub(in crate::core) to: NodeId,
    pub(in crate::core) kind: u16,
    pub(in crate::core) payload: Vec<u8>,
    pub(in crate::core) created_ms: u64,
    /// Agent addressing and a client id, if the send has either.
    pub(in crate::core) tracked: Option<Box<crate::core::agents::Tracked>>,
}

/// Receiver work waiting for the next commit, in arrival order.
// A few hundred bytes against a few dozen, in a queue of at most
// WAITING_BATCHES_MAX: not worth an allocation per batch.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(in crate::core) enum InboundWork {
    /// Commit `batch` from seq `from`; it came on `conn`.
    Accept {
        peer: NodeId,
        conn: crate::core::ConnId,
        from: Seq,
        batch: OpenBatch,
    },
    /// The author no longer holds anything before `earliest`.
    Gap {
        peer: NodeId,
        conn: crate::core::ConnId,
        stream: StreamId,
        earliest: Seq,
    },
    /// A batch came with `theirs` at `seq`, where `ours` is committed.
    Conflict {
        stream: StreamId,
        seq: Seq,
        ours: Cid,
        theirs: Cid,
    },
    /// The author says its store lost `from..=to` of `stream`, which this node holds.
    RolledBack {
        stream: StreamId,
        from: Seq,
        to: Seq,
    },
    /// Commit a member's topic `batch` from seq `from` (it came from
    /// `peer`), and hold it to relay after `evict` made room.
    TopicAccept {
        peer: NodeId,
        from: Seq,
        batch: OpenBatch,
        evict: Option<mesh_store::Eviction>,
    },
    /// No member that was asked holds a topic stream before `earliest`.
    TopicGap { stream: StreamId, earliest: Seq },
}

impl InboundWork {
    fn stream(&self) -> &StreamId {
        match self {
            InboundWork::Accept { batch, .. } | InboundWork::TopicAccept { batch, .. } => {
                batch.batch().stream()
            }
            InboundWork::Gap { stream, .. }
            | InboundWork::Conflict { stream, .. }
            | InboundWork::RolledBack { stream, .. }
            | InboundWork::TopicGap { stream, .. } => stream,
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            InboundWork::Accept { batch, .. } | InboundWork::TopicAccept { batch, .. } => {
                batch.batch().payload_bytes()
            }
            _ => 0,
        }
    }
}

/// Peer batches and gaps waiting for the next commit.
///
/// Invariant: `bytes` is the payload bytes of `work`, and both stay within
/// [`WAITING_BATCHES_MAX`] and [`WAITING_BATCH_BYTES_MAX`].
#[derive(Debug, Default)]
pub(in crate::core) struct InboundQueue {
    pub(super) work: VecDeque<InboundWork>,
    bytes: u64,
}

impl InboundQueue {
    /// Whether a batch of `bytes` payload bytes fits.
    pub(in crate::core) fn has_room(&self, bytes: u64) -> bool {
        self.work.len() < WAITING_BATCHES_MAX && self.bytes + bytes <= WAITING_BATCH_BYTES_MAX
    }

    /// Whether no more work fits, whatever its size.
    pub(in crate::core) fn is_full(&self) -> bool {
        self.work.len() >= WAITING_BATCHES_MAX
    }

    pub(in crate::core) fn push(&mut self, work: InboundWork) {
        self.bytes += work.bytes();
        self.work.push_back(work);
        self.check();
    }

    /// Drops the work queued for `stream` (its commit failed).
    pub(in crate::core) fn remove_stream(&mut self, stream: &StreamId) {
        let (kept, dropped): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.work)
            .into_iter()
            .partition(|w| w.stream() != stream);
        for w in dropped {
            self.bytes -= w.bytes();
        }
        self.work = kept;
        self.check();
    }

    pub(super) fn take(&mut self) -> VecDeque<InboundWork> {
        self.bytes = 0;
        std::mem::take(&mut self.work)
    }

    fn check(&self) {
        debug_assert_eq!(
            self.bytes,
            self.work.iter().map(InboundWork::bytes).sum::<u64>()
        );
        debug_assert!(self.work.len() <= WAITING_BATCHES_MAX);
    }
}

/// What a peer has acknowledged of our stream to it, to be committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::core) struct AckWork {
    /// The peer's mark.
    pub(in crate::core) upto: Seq,
    /// The peer's store is new: the ack may move backwards.
    pub(in crate::core) reset: bool,
    /// The peer's epoch to record, if it changed.
    pub(in crate::core) epoch: Option<Epoch>,
    /// The peer's earlier epoch, whose stream to us has ended.
    pub(in crate::core) ended: Option<Epoch>,
}

impl AckWork {
    /// An ack of `upto`, nothing else.
    pub(in crate::core) fn upto(upto: Seq) -> AckWork {
        AckWork {
            upto,
            reset: false,
            epoch: None,
            ended: None,
        }
    }

    /// `older`, which failed to commit (or is not committed yet), folded
    /// under `self`, which came after it.
    pub(super) fn under(self, older: AckWork) -> AckWork {
        let (upto, reset) = if self.reset {
            (self.upto, true)
        } else {
            (self.upto.max(older.upto), older.reset)
        };
        AckWork {
            upto,
            reset,
            epoch: self.epoch.or(older.epoch),
            ended: older.ended.or(self.ended),
        }
    }

    /// Whether it must be written at once rather than wait for company.
    pub(super) fn urgent(&self) -> bool {
        self.reset || self.epoch.is_some()
    }
}
