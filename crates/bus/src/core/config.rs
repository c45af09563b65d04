//! The core's knobs and its fixed limits.

use mesh_protocol::{MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES};
use mesh_store::OutboxBounds;

/// The most local sends waiting for the next commit (while one is in flight).
pub const WAITING_SENDS_MAX: usize = 4096;

/// The most payload bytes of local sends waiting for the next commit.
pub const WAITING_SEND_BYTES_MAX: u64 = 16 << 20;

/// The most peer batches (and gaps) waiting for the next commit.
pub const WAITING_BATCHES_MAX: usize = 1024;

/// The most payload bytes of peer batches waiting for the next commit.
pub const WAITING_BATCH_BYTES_MAX: u64 = 16 << 20;

/// The most peer additions and removals waiting for the next commit.
pub const WAITING_PEER_CHANGES_MAX: usize = 64;

/// The most local writes (cursors, lag records) waiting for the next commit.
/// Each names at most [`mesh_store::SUBSCRIBER_NAME_BYTES_MAX`] bytes, so
/// this bounds their bytes too.
pub const WAITING_WRITES_MAX: usize = 256;

/// How far past its pending mark a stream holds early batches, in envelopes:
/// a batch whose last seq is further ahead is dropped (and asked for again).
pub const REORDER_ENVELOPES_MAX: u64 = 4 * MAX_BATCH_ENTRIES as u64;

/// The most payload bytes held early per stream.
pub const REORDER_BYTES_MAX: u64 = 4 * MAX_BATCH_PAYLOAD_BYTES;

/// The largest payload of one message.
pub const PAYLOAD_BYTES_MAX: u64 = MAX_BATCH_PAYLOAD_BYTES;

/// The default of [`Config::ack_ride_ms`].
pub const ACK_RIDE_MS: u64 = 50;

/// The default of [`Config::hold_ms`]: two minutes.
pub const HOLD_MS: u64 = 120_000;

/// The default of [`Config::hold_msgs_max`].
pub const HOLD_MSGS_MAX: usize = 1024;

/// The default of [`Config::hold_bytes_max`].
pub const HOLD_BYTES_MAX: u64 = 8 << 20;

/// The default of [`Config::journal_bytes_max`]: 1 GiB.
pub const JOURNAL_BYTES_MAX: u64 = 1 << 30;

/// The default of [`Config::journal_age_ms_max`]: 30 days.
pub const JOURNAL_AGE_MS_MAX: u64 = 30 * 24 * 3_600_000;

/// The most card queries one peer has open from this node at a time.
pub const CARD_QUERIES_MAX: usize = 64;

/// The most card queries of one peer answered per [`CARD_ANSWER_WINDOW_MS`];
/// more are dropped (and counted).
pub const CARD_ANSWERS_MAX: u32 = 64;

/// The window of [`CARD_ANSWERS_MAX`], in ms.
pub const CARD_ANSWER_WINDOW_MS: u64 = 10_000;

/// The configuration of a [`crate::core::Core`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Retention bounds and full-outbox policy of every outgoing stream.
    pub outbox: OutboxBounds,
    /// Payload bytes one [`crate::core::Effect::LoadOutbox`] asks for (a
    /// catch-up is sent in chunks of about this size).
    pub catchup_chunk_bytes: u64,
    /// Resend our Hello if the peer's has not come after this long.
    pub hello_retry_ms: u64,
    /// Close a connection after this many Hellos went unanswered.
    pub hello_attempts_max: u32,
    /// Resend from the peer's last ack if it has not acknowledged anything
    /// for this long while messages are outstanding.
    pub retransmit_ms: u64,
    /// Ask a missing part of a stream again after this long.
    pub resync_retry_ms: u64,
    /// After the store failed, wait this long before the next commit: the
    /// ticker on which held sends are tried again.
    pub store_retry_ms: u64,
    /// How long a local send is held, unanswered, while the store cannot
    /// commit it; then it is answered 503 and journaled as lost once the
    /// store is back.
    pub hold_ms: u64,
    /// The most sends held at once (at most [`WAITING_SENDS_MAX`]); a send
    /// past it is refused at once while the store is down.
    pub hold_msgs_max: usize,
    /// The most payload bytes of sends held at once (at most
    /// [`WAITING_SEND_BYTES_MAX`]).
    pub hold_bytes_max: u64,
    /// The most bytes the journal's rows may take before the oldest go.
    pub journal_bytes_max: u64,
    /// The oldest a journal entry may get, in ms (0: no age bound).
    pub journal_age_ms_max: u64,
    /// A peer's ack that is all there is to commit waits at most this long
    /// for other work (sends, peer batches, peer changes) to share its
    /// commit. An ack record is advice: one not yet written only means the
    /// peer may get duplicates it drops, and its next Hello restates it.
    pub ack_ride_ms: u64,
    /// How long a send with a client id is remembered: a retry of the same
    /// sender and id within it gets the first send's receipt.
    pub dedup_window_ms: u64,
    /// A peer without a connection this long is asked about: every
    /// connected peer is asked for its newest card.
    pub card_ask_ms: u64,
    /// Ask again after this long while it still has none (also how long a
    /// query may go unanswered before it is sent again).
    pub card_ask_retry_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            outbox: OutboxBounds::default(),
            catchup_chunk_bytes: MAX_BATCH_PAYLOAD_BYTES,
            hello_retry_ms: 2_000,
            hello_attempts_max: 5,
            retransmit_ms: 10_000,
            resync_retry_ms: 2_000,
            store_retry_ms: 1_000,
            hold_ms: HOLD_MS,
            hold_msgs_max: HOLD_MSGS_MAX,
            hold_bytes_max: HOLD_BYTES_MAX,
            journal_bytes_max: JOURNAL_BYTES_MAX,
            journal_age_ms_max: JOURNAL_AGE_MS_MAX,
            ack_ride_ms: ACK_RIDE_MS,
            dedup_window_ms: super::DEDUP_WINDOW_MS,
            card_ask_ms: 3_000,
            card_ask_retry_ms: 10_000,
        }
    }
}

impl Config {
    /// The hold bounds in effect: the configured ones, within the waiting
    /// queue's (held sends are sends waiting for a commit).
    pub(crate) fn hold_bounds(&self) -> (usize, u64) {
        (
            self.hold_msgs_max.min(WAITING_SENDS_MAX),
            self.hold_bytes_max.min(WAITING_SEND_BYTES_MAX),
        )
    }
}
