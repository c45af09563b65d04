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
    /// `CardQuery` frames.
    pub card_query: u64,
    /// `CardAnswer` frames.
    pub card_answer: u64,
    /// `Agents` frames.
    pub agents: u64,
    /// `StreamEnded` frames.
    pub stream_ended: u64,
    /// `Topics` frames.
    pub topics: u64,
    /// `Moves` frames.
    pub moves: u64,
    /// `Followed` frames.
    pub followed: u64,
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
            Frame::CardQuery { .. } => &mut self.card_query,
            Frame::CardAnswer { .. } => &mut self.card_answer,
            Frame::Agents { .. } => &mut self.agents,
            Frame::StreamEnded { .. } => &mut self.stream_ended,
            Frame::Topics { .. } => &mut self.topics,
            Frame::Moves { .. } => &mut self.moves,
            Frame::Followed { .. } => &mut self.followed,
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
    /// A card that is not its node's, does not verify, or names a node
    /// that is not a peer.
    BadCard,
    /// A valid card older than the one held (a rollback, or a late answer).
    StaleCard,
    /// A card answer to a query this node did not send on that connection.
    UnsolicitedCard,
    /// A card query past the peer's answer rate ([`crate::core::CARD_ANSWERS_MAX`]).
    CardQueryLimited,
    /// A batch with another envelope at the receiver's committed mark than
    /// the one committed there (journaled once as a conflict).
    Conflict,
    /// A topic batch (or gap) of a topic this node is not a member of.
    NotAMember,
    /// A topic batch (or gap) of a new author stream of a topic that
    /// holds [`crate::core::TOPIC_STREAMS_MAX`] streams already.
    TopicStreamsFull,
    /// A move notice of a new agent while this node holds notices of
    /// [`crate::core::MOVES_MAX`] agents already.
    MovesFull,
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

impl DropReason {
    /// Every reason, in the order [`DropCounts::iter`] gives them.
    pub const ALL: [DropReason; 21] = [
        DropReason::BadSignature,
        DropReason::Malformed,
        DropReason::CidMismatch,
        DropReason::WrongAuthor,
        DropReason::WrongRecipient,
        DropReason::StaleEpoch,
        DropReason::Duplicate,
        DropReason::OutsideWindow,
        DropReason::QueueFull,
        DropReason::BeforeHello,
        DropReason::StaleConnection,
        DropReason::UnknownStream,
        DropReason::BogusSeq,
        DropReason::BadCard,
        DropReason::StaleCard,
        DropReason::UnsolicitedCard,
        DropReason::CardQueryLimited,
        DropReason::Conflict,
        DropReason::NotAMember,
        DropReason::TopicStreamsFull,
        DropReason::MovesFull,
    ];

    /// The reason's name in `snake_case`, as metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::BadSignature => "bad_signature",
            DropReason::Malformed => "malformed",
            DropReason::CidMismatch => "cid_mismatch",
            DropReason::WrongAuthor => "wrong_author",
            DropReason::WrongRecipient => "wrong_recipient",
            DropReason::StaleEpoch => "stale_epoch",
            DropReason::Duplicate => "duplicate",
            DropReason::OutsideWindow => "outside_window",
            DropReason::QueueFull => "queue_full",
            DropReason::BeforeHello => "before_hello",
            DropReason::StaleConnection => "stale_connection",
            DropReason::UnknownStream => "unknown_stream",
            DropReason::BogusSeq => "bogus_seq",
            DropReason::BadCard => "bad_card",
            DropReason::StaleCard => "stale_card",
            DropReason::UnsolicitedCard => "unsolicited_card",
            DropReason::CardQueryLimited => "card_query_limited",
            DropReason::Conflict => "conflict",
            DropReason::NotAMember => "not_a_member",
            DropReason::TopicStreamsFull => "topic_streams_full",
            DropReason::MovesFull => "moves_full",
        }
    }

    /// The reason's slot in [`DropCounts`]: its place in [`DropReason::ALL`].
    fn slot(self) -> usize {
        self as usize
    }
}

/// Dropped frames (or batches) by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts([u64; DropReason::ALL.len()]);

impl DropCounts {
    /// The count for `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason.slot()]
    }

    /// Every count added up.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Every reason's name with its count, in [`DropReason::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropReason::ALL.iter().map(|r| (r.name(), self.get(*r)))
    }

    pub(crate) fn count(&mut self, reason: DropReason) {
        self.0[reason.slot()] += 1;
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
    /// Acks not sent because the batch they acknowledge came on a
    /// connection another one has replaced since (it may be another
    /// process with the peer's key).
    pub acks_withheld: u64,
    /// Outbox loads asked of the driver.
    pub loads: u64,
    /// Outbox loads that failed.
    pub load_failures: u64,
    /// Commit or load answers for requests the core no longer waits for.
    pub stale_answers: u64,
    /// Peers whose Hello announced a new store epoch.
    pub peer_epoch_changes: u64,
    /// Local sends and publishes whose commit failed for want of a store,
    /// put back to be retried (each time).
    pub sends_held: u64,
    /// Held sends and publishes let go after the hold bound (answered 503;
    /// the sends journaled as lost).
    pub sends_let_go: u64,
    /// New epochs this node started because its store went back in time.
    pub epoch_switches: u64,
    /// Batches found to conflict with what is committed here.
    pub conflicts: u64,
    /// Commits whose trim took journal rows.
    pub trims: u64,
    /// Newer peer cards committed (from Hellos and card answers).
    pub cards_learned: u64,
    /// Card queries sent about peers without a connection.
    pub cards_asked: u64,
    /// Agent messages, bounces and retried sends.
    pub agents: AgentCounts,
    /// What the core counts of topics.
    pub topics: TopicCounts,
}

/// What the core counts of topics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TopicCounts {
    /// Messages this node published, committed.
    pub published: u64,
    /// Members' batches taken into a commit.
    pub batches_accepted: u64,
    /// Batches handed to members (this node's own and relayed ones).
    pub batches_relayed: u64,
    /// Outbox reads of topic feeds.
    pub loads: u64,
}

/// What the core counts of agents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentCounts {
    /// Agent messages taken to send.
    pub sends: u64,
    /// Retried sends answered with the first send's receipt.
    pub retries_answered: u64,
    /// Retried-send records forgotten before their window ended (the
    /// memory bound).
    pub dedup_forgotten: u64,
    /// Agent messages received for an agent of this node.
    pub delivered: u64,
    /// Of those, messages whose sender agent its node never announced.
    pub unverified_senders: u64,
    /// Agent messages received for an agent this node does not host.
    pub undeliverable: u64,
    /// Bounces queued back to the author.
    pub bounces_sent: u64,
    /// Bounces the author's outbox did not take (the message stays
    /// journaled here as undeliverable).
    pub bounces_refused: u64,
    /// Bounces received for an agent of this node.
    pub bounces_received: u64,
    /// Envelopes of an agent kind whose payload did not decode (journaled,
    /// put in no inbox).
    pub malformed: u64,
    /// Agents frames dropped: a bad card, or a card of another node.
    pub cards_refused: u64,
    /// Move notices refused: a Moves frame whose signature does not
    /// verify (counted once), or a notice of an agent leaving this node
    /// that is not this node's agent of that name and key.
    pub moves_refused: u64,
    /// Move notices taken: newer than the one held of their agent.
    pub moves_taken: u64,
    /// `Followed` frames sent: this node told a peer it follows the moves
    /// of agents away from it.
    pub follows_sent: u64,
    /// Drains this node could end early: every peer followed the agent's
    /// move away from here and its stream arrived that far.
    pub drains_followed: u64,
    /// Messages for an agent that moved away, taken to pass on to its new host.
    pub forwards_sent: u64,
    /// Forwarded messages received for an agent of this node.
    pub forwards_received: u64,
    /// Trimmed forwards sent: ranges of a moved agent's previous inbox
    /// that journal retention removed before they were passed on.
    pub forwards_trimmed_sent: u64,
    /// Trimmed forwards put in an agent's inbox here.
    pub forwards_trimmed_received: u64,
    /// Own agent messages superseded before they were sent: held ones
    /// (committed as tombstones) and queued ones (replaced in the outbox).
    pub superseded: u64,
    /// Supersedes of a queued message the store refused (it was evicted or
    /// acknowledged meanwhile; it is sent, or lost, as it was).
    pub supersede_refused: u64,
    /// Tombstones received for an agent of this node.
    pub tombstones_received: u64,
    /// Read receipts of this node's agents taken to send (by the
    /// daemon's receipt pump).
    pub receipts_sent: u64,
    /// Read receipts received that marked messages read and went to their
    /// sender agent's inbox here.
    pub receipts_received: u64,
    /// Read receipts refused: malformed, not signed by the key of the
    /// reader its node announced, for an agent this node does not host,
    /// or naming nothing this node sent there that is not read already.
    pub receipts_refused: u64,
    /// Ids of accepted read receipts that named no message this node sent
    /// to the reader's node (or one already marked read): skipped.
    pub receipt_ids_skipped: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_drop_reason_has_its_own_count_and_name() {
        let mut d = DropCounts::default();
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.slot(), i, "{r:?} is in its place in ALL");
            for _ in 0..=i {
                d.count(*r);
            }
        }
        let names: Vec<(&str, u64)> = d.iter().collect();
        assert_eq!(names.len(), DropReason::ALL.len());
        assert_eq!(names[0], ("bad_signature", 1));
        assert_eq!(names[12], ("bogus_seq", 13));
        assert_eq!(d.get(DropReason::Duplicate), 7);
        assert_eq!(d.total(), (1..=DropReason::ALL.len() as u64).sum::<u64>());
        let mut unique: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "no two reasons share a name");
    }
}
