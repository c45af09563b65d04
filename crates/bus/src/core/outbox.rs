//! The outbox policy, decided here and nowhere else: which sends an own
//! stream's outbox takes in a commit, which it refuses as full, and what
//! each new batch evicts.
//!
//! It needs only the committed accounting of the stream ([`OwnStream`]:
//! retained envelopes and bytes, and how many of them lie in whole
//! acknowledged batches, the evictable part). The store executes the
//! evictions it is given and refuses one that would drop an unacknowledged
//! envelope without a loss record: under `reject` that would be a bug here.

use mesh_protocol::NodeId;
use mesh_store::{Eviction, OnFull, OutboxBounds, OwnStream};

use super::SendError;

/// Envelopes and payload bytes.
type Amount = (u64, u64);

fn add(a: Amount, b: Amount) -> Amount {
    (a.0 + b.0, a.1 + b.1)
}

fn within(a: Amount, max: Amount) -> bool {
    a.0 <= max.0 && a.1 <= max.1
}

/// One own stream's outbox as the policy sees it while a commit is built.
///
/// Invariants: under `reject`, `held + queued` never passes the bounds, and
/// `held` is exact; under `evict-oldest`, `held` is exact until a lossy
/// eviction and an upper bound after it.
#[derive(Debug)]
pub(super) struct Room {
    bounds: OutboxBounds,
    peer: NodeId,
    /// What no lossless eviction can free: the retained envelopes outside
    /// the evictable part, and the batches planned in this commit.
    held: Amount,
    /// Messages admitted but not yet planned into a batch.
    queued: Amount,
    /// Everything retained and planned, while known exactly: until this
    /// commit first evicts (how much a whole-batch eviction frees is the
    /// store's to find out).
    total: Option<Amount>,
    /// Whether no send may make room by a loss, whatever the policy: the
    /// outbox holds (or this commit takes) a forward not yet acknowledged.
    lossless: bool,
}

impl Room {
    /// The room in `own` (as committed) under `bounds`, for sends to `peer`.
    pub(super) fn new(own: &OwnStream, bounds: OutboxBounds, peer: NodeId) -> Room {
        let held = (
            own.msgs - own.evictable_msgs,
            own.bytes - own.evictable_bytes,
        );
        Room {
            bounds,
            peer,
            held,
            queued: (0, 0),
            total: Some((own.msgs, own.bytes)),
            lossless: false,
        }
    }

    /// From now on no send makes room by a loss: each is refused as under
    /// `reject` instead.
    pub(super) fn keep_unacked(&mut self) {
        self.lossless = true;
    }

    fn max(&self) -> Amount {
        (self.bounds.max_msgs, self.bounds.max_bytes)
    }

    /// Takes one more message of `len` payload bytes into this commit, or
    /// refuses it: under `reject`, when it fits only by evicting an
    /// unacknowledged envelope; under either policy, when it could never
    /// fit (bounds of no message at all).
    pub(super) fn admit(&mut self, len: u64) -> Result<(), SendError> {
        let after = add(add(self.held, self.queued), (1, len));
        let never = !within((1, len), self.max());
        let reject = self.lossless || self.bounds.on_full == OnFull::Reject;
        if never || (reject && !within(after, self.max())) {
            let (msgs, bytes) = add(self.held, self.queued);
            return Err(SendError::OutboxFull {
                peer: self.peer,
                msgs,
                bytes,
            });
        }
        self.queued = add(self.queued, (1, len));
        Ok(())
    }

    /// A forward of a moved agent's message (its author was told it was
    /// delivered): taken as under `reject`, and from it on, while it is
    /// unacknowledged, no send makes room by a loss (the store may evict
    /// a batch of this very commit).
    pub(super) fn admit_lossless(&mut self, len: u64) -> Result<(), SendError> {
        self.keep_unacked();
        self.admit(len)
    }

    /// What the store evicts before appending the next batch of admitted
    /// messages, `msgs` of them with `bytes` payload bytes: nothing if it
    /// fits as the outbox is; else the oldest whole batches down to what
    /// leaves it room, recording a loss only if that cannot be done with
    /// acknowledged batches alone.
    pub(super) fn evict_for(&mut self, msgs: u64, bytes: u64) -> Option<Eviction> {
        let batch = (msgs, bytes);
        debug_assert!(within(batch, self.queued) && within(batch, self.max()));
        self.queued = (self.queued.0 - msgs, self.queued.1 - bytes);
        let max = self.max();
        if let Some(total) = self.total.filter(|t| within(add(*t, batch), max)) {
            self.total = Some(add(total, batch));
            self.held = add(self.held, batch);
            return None;
        }
        // Every admitted message fits the bounds alone, and a batch is cut
        // at them: this does not saturate.
        let keep = (max.0.saturating_sub(msgs), max.1.saturating_sub(bytes));
        let lossless = within(self.held, keep);
        debug_assert!(lossless || self.bounds.on_full == OnFull::EvictOldest);
        self.total = None;
        let left = if lossless {
            self.held
        } else {
            // Everything left is at most `keep`, the unacknowledged part too.
            (self.held.0.min(keep.0), self.held.1.min(keep.1))
        };
        self.held = add(left, batch);
        let loss = (!lossless).then(|| {
            format!(
                "outbox for {} was full (it keeps {} msgs / {} bytes) and its policy is evict-oldest",
                self.peer.fmt_short(),
                max.0,
                max.1
            )
        });
        Some(Eviction {
            msgs_max: keep.0,
            bytes_max: keep.1,
            loss,
        })
    }
}

#[cfg(test)]
mod tests {
    use mesh_protocol::{Epoch, SecretKey, StreamId};

    use super::*;

    fn peer() -> NodeId {
        SecretKey::from_bytes(&[2; 32]).public()
    }

    /// A stream retaining `msgs`/`bytes`, of which `evictable` in whole acked batches.
    fn own(msgs: u64, bytes: u64, evictable: Amount) -> OwnStream {
        let me = SecretKey::from_bytes(&[1; 32]).public();
        OwnStream {
            next_seq: msgs + 1,
            last_acked: evictable.0,
            msgs,
            bytes,
            evictable_msgs: evictable.0,
            evictable_bytes: evictable.1,
            ..OwnStream::empty(StreamId::direct(me, Epoch([1; 16]), peer()))
        }
    }

    /// Asserts that `err` is a full outbox holding `msgs` messages of `bytes`
    /// payload bytes.
    #[track_caller]
    fn assert_full(err: &SendError, msgs: u64, bytes: u64) {
        assert!(
            matches!(
                err,
                SendError::OutboxFull { msgs: m, bytes: b, .. } if (*m, *b) == (msgs, bytes)
            ),
            "{err:?}"
        );
    }

    fn bounds(max_msgs: u64, max_bytes: u64, on_full: OnFull) -> OutboxBounds {
        OutboxBounds {
            max_msgs,
            max_bytes,
            on_full,
        }
    }

    fn keep(msgs_max: u64, bytes_max: u64) -> Option<Eviction> {
        Some(Eviction {
            msgs_max,
            bytes_max,
            loss: None,
        })
    }

    #[test]
    fn a_lossless_message_is_refused_where_evict_oldest_would_make_room_by_a_loss() {
        let b = bounds(3, 100, OnFull::EvictOldest);
        // Three retained, one of them in an acked batch.
        let mut r = Room::new(&own(3, 30, (1, 10)), b, peer());
        r.admit_lossless(10).expect("the acked one makes room");
        let err = r
            .admit_lossless(10)
            .expect_err("only by evicting an unacked one");
        assert_full(&err, 3, 30);
        let err = r.admit(10).expect_err("nor a plain send, after a forward");
        assert_full(&err, 3, 30);
        let mut r = Room::new(&own(3, 30, (0, 0)), b, peer());
        r.admit(10)
            .expect("a plain send under evict-oldest is taken");
        r.keep_unacked();
        assert!(
            r.admit(10).is_err(),
            "not while a forward is unacknowledged"
        );
    }

    #[test]
    fn a_batch_that_fits_evicts_nothing() {
        let mut r = Room::new(&own(2, 20, (0, 0)), bounds(4, 100, OnFull::Reject), peer());
        r.admit(10).expect("fits");
        r.admit(10).expect("fits");
        assert_eq!(r.evict_for(2, 20), None);
        assert!(r.admit(1).is_err(), "four are unacknowledged");
    }

    #[test]
    fn under_reject_acknowledged_batches_make_room_and_unacknowledged_ones_do_not() {
        // Three retained, two of them in acked batches.
        let b = bounds(3, 100, OnFull::Reject);
        let mut r = Room::new(&own(3, 30, (2, 20)), b, peer());
        r.admit(10).expect("room from an acked batch");
        r.admit(10).expect("room from the other acked batch");
        let err = r.admit(10).expect_err("only unacked ones are left");
        assert_full(&err, 3, 30);
        assert_eq!(r.evict_for(2, 20), keep(1, 80));
        // The next batch of the commit cannot know what the eviction freed: it says where to stop.
        let mut r = Room::new(&own(3, 30, (2, 20)), b, peer());
        r.admit(10).expect("fits");
        assert_eq!(r.evict_for(1, 10), keep(2, 90));
        r.admit(10).expect("fits");
        assert_eq!(r.evict_for(1, 10), keep(2, 90));
    }

    #[test]
    fn bytes_are_counted_exactly_not_guessed() {
        // 1 acked byte and 8 unacked retained; 10 bytes at most.
        let b = bounds(100, 10, OnFull::Reject);
        let mut r = Room::new(&own(2, 9, (1, 1)), b, peer());
        let err = r.admit(3).expect_err("8 + 3 > 10");
        assert_full(&err, 1, 8);
        r.admit(2).expect("8 + 2 fits once the acked byte goes");
        assert_eq!(r.evict_for(1, 2), keep(99, 8));
    }

    #[test]
    fn a_message_that_could_never_fit_is_refused_under_either_policy() {
        for on_full in [OnFull::Reject, OnFull::EvictOldest] {
            let mut r = Room::new(&own(0, 0, (0, 0)), bounds(0, 100, on_full), peer());
            assert!(r.admit(1).is_err(), "no message fits 0 msgs");
            let mut r = Room::new(&own(0, 0, (0, 0)), bounds(5, 9, on_full), peer());
            assert!(r.admit(10).is_err(), "10 bytes never fit 9");
            r.admit(9).expect("9 bytes do");
        }
    }

    #[test]
    fn under_evict_oldest_every_send_is_taken_and_a_loss_is_recorded_only_when_needed() {
        let b = bounds(3, 100, OnFull::EvictOldest);
        let mut r = Room::new(&own(3, 30, (1, 10)), b, peer());
        r.admit(10).expect("taken");
        assert_eq!(r.evict_for(1, 10), keep(2, 90), "the acked batch suffices");
        let mut r = Room::new(&own(3, 30, (1, 10)), b, peer());
        for _ in 0..2 {
            r.admit(10).expect("taken");
        }
        let e = r.evict_for(2, 20).expect("an eviction");
        assert_eq!((e.msgs_max, e.bytes_max), (1, 80));
        let detail = e.loss.expect("unacked ones go");
        assert!(detail.contains("evict-oldest"), "{detail}");
    }
}
