//! Counters the core keeps about itself, readable at any time.

use mesh_protocol::Frame;

/// Frames counted by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameCounts {
    /// `Hello` frames.
    pub hello: u64,
    /// `Batch` frames.
    pub batch: u64,
    /// `Ack` frames.
    pub ack: u64,
    /// `Resync` frames.
    pub resync: u64,
    /// `ResyncGap` frames.
    pub resync_gap: u64,
    /// `ResyncDone` frames.
    pub resync_done: u64,
}

impl FrameCounts {
    pub(crate) fn count(&mut self, frame: &Frame) {
        let c = match frame {
            Frame::Hello { .. } => &mut self.hello,
            Frame::Batch { .. } => &mut self.batch,
            Frame::Ack { .. } => &mut self.ack,
            Frame::Resync { .. } => &mut self.resync,
            Frame::ResyncGap { .. } => &mut self.resync_gap,
            Frame::ResyncDone { .. } => &mut self.resync_done,
        };
        *c += 1;
    }
}

/// Why an incoming frame (or part of it) was dropped without changing state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// The batch signature does not verify.
    BadSignature,
    /// The batch breaks a shape limit (entries, bytes, first seq).
    Malformed,
    /// A payload does not match its signed hash (or the count differs).
    CidMismatch,
    /// A batch (or gap) for a stream the sending peer does not author.
    WrongAuthor,
    /// A batch (or gap) for a stream not addressed to this node.
    WrongRecipient,
    /// A stream of another epoch than the one the peer announced.
    StaleEpoch,
    /// Every envelope of the batch is at or below the pending mark.
    Duplicate,
    /// The batch ends too far past the pending mark to be held.
    OutsideWindow,
    /// The waiting queue for the next commit was full.
    QueueFull,
    /// A frame other than Hello before the peer's Hello.
    BeforeHello,
    /// A frame on a connection that is no longer the peer's live one.
    StaleConnection,
    /// An ack or resync for a stream this node does not write to the peer.
    UnknownStream,
    /// An ack or resync naming a seq this node never sent.
    BogusSeq,
}

impl From<crate::core::BadBatch> for DropReason {
    fn from(bad: crate::core::BadBatch) -> Self {
        match bad {
            crate::core::BadBatch::BadSignature => DropReason::BadSignature,
            crate::core::BadBatch::Malformed => DropReason::Malformed,
            crate::core::BadBatch::CidMismatch => DropReason::CidMismatch,
        }
    }
}

/// Dropped frames (or batches) by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// See [`DropReason::BadSignature`].
    pub bad_signature: u64,
    /// See [`DropReason::Malformed`].
    pub malformed: u64,
    /// See [`DropReason::CidMismatch`].
    pub cid_mismatch: u64,
    /// See [`DropReason::WrongAuthor`].
    pub wrong_author: u64,
    /// See [`DropReason::WrongRecipient`].
    pub wrong_recipient: u64,
    /// See [`DropReason::StaleEpoch`].
    pub stale_epoch: u64,
    /// See [`DropReason::Duplicate`].
    pub duplicate: u64,
    /// See [`DropReason::OutsideWindow`].
    pub outside_window: u64,
    /// See [`DropReason::QueueFull`].
    pub queue_full: u64,
    /// See [`DropReason::BeforeHello`].
    pub before_hello: u64,
    /// See [`DropReason::StaleConnection`].
    pub stale_connection: u64,
    /// See [`DropReason::UnknownStream`].
    pub unknown_stream: u64,
    /// See [`DropReason::BogusSeq`].
    pub bogus_seq: u64,
}

impl DropCounts {
    /// The count for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        *self.slot(reason)
    }

    /// Every count added up.
    pub fn total(&self) -> u64 {
        self.bad_signature
            + self.malformed
            + self.cid_mismatch
            + self.wrong_author
            + self.wrong_recipient
            + self.stale_epoch
            + self.duplicate
            + self.outside_window
            + self.queue_full
            + self.before_hello
            + self.stale_connection
            + self.unknown_stream
            + self.bogus_seq
    }

    pub(crate) fn count(&mut self, reason: DropReason) {
        *self.slot_mut(reason) += 1;
    }

    fn slot(&self, reason: DropReason) -> &u64 {
        match reason {
            DropReason::BadSignature => &self.bad_signature,
            DropReason::Malformed => &self.malformed,
            DropReason::CidMismatch => &self.cid_mismatch,
            DropReason::WrongAuthor => &self.wrong_author,
            DropReason::WrongRecipient => &self.wrong_recipient,
            DropReason::StaleEpoch => &self.stale_epoch,
            DropReason::Duplicate => &self.duplicate,
            DropReason::OutsideWindow => &self.outside_window,
            DropReason::QueueFull => &self.queue_full,
            DropReason::BeforeHello => &self.before_hello,
            DropReason::StaleConnection => &self.stale_connection,
            DropReason::UnknownStream => &self.unknown_stream,
            DropReason::BogusSeq => &self.bogus_seq,
        }
    }

    fn slot_mut(&mut self, reason: DropReason) -> &mut u64 {
        match reason {
            DropReason::BadSignature => &mut self.bad_signature,
            DropReason::Malformed => &mut self.malformed,
            DropReason::CidMismatch => &mut self.cid_mismatch,
            DropReason::WrongAuthor => &mut self.wrong_author,
            DropReason::WrongRecipient => &mut self.wrong_recipient,
            DropReason::StaleEpoch => &mut self.stale_epoch,
            DropReason::Duplicate => &mut self.duplicate,
            DropReason::OutsideWindow => &mut self.outside_window,
            DropReason::QueueFull => &mut self.queue_full,
            DropReason::BeforeHello => &mut self.before_hello,
            DropReason::StaleConnection => &mut self.stale_connection,
            DropReason::UnknownStream => &mut self.unknown_stream,
            DropReason::BogusSeq => &mut self.bogus_seq,
        }
    }
}

/// What the core has done, counted since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Frames received on live connections, by kind.
    pub frames_in: FrameCounts,
    /// Frames sent, by kind.
    pub frames_out: FrameCounts,
    /// Frames (or batches) dropped, by reason.
    pub dropped: DropCounts,
    /// Envelopes received at or below the pending mark (whole or trimmed).
    pub duplicate_envelopes: u64,
    /// Peer batches accepted into a commit (whole or trimmed).
    pub batches_accepted: u64,
    /// Peer batches held in a reorder buffer.
    pub batches_held: u64,
    /// Commits issued ([`crate::core::Effect::Persist`]).
    pub commits: u64,
    /// Groups the store refused or failed.
    pub groups_failed: u64,
    /// Local sends answered Ok.
    pub sends_ok: u64,
    /// Local sends refused before the store (busy, full, bad request).
    pub sends_refused: u64,
    /// Local sends the store refused or failed.
    pub sends_failed: u64,
    /// `Resync` frames sent (asked).
    pub resyncs_asked: u64,
    /// `Resync` requests (and Hello marks) served.
    pub resyncs_served: u64,
    /// `ResyncGap` frames sent.
    pub gaps_sent: u64,
    /// Gaps committed to the journal.
    pub gaps_recorded: u64,
    /// Times a peer's stream was resent from its last ack after a silence.
    pub retransmits: u64,
    /// Outbox loads asked of the driver.
    pub loads: u64,
    /// Outbox loads that failed.
    pub load_failures: u64,
    /// Commit or load answers for requests the core no longer waits for.
    pub stale_answers: u64,
    /// Peers whose Hello announced a new store epoch.
    pub peer_epoch_changes: u64,
}
