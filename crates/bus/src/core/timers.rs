//! The core's deadlines, one per (peer | stream, kind), in one table.
//!
//! Each sub-machine says when its own timers are due; the core keeps them
//! here and hands the driver only the earliest, as one
//! [`crate::core::Effect::SetTimer`]. When that fires, the table names
//! what is due, so nothing is found by scanning every peer and stream.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{NodeId, StreamId};

use super::Millis;

/// What a deadline is for. The order is the order in which due timers are
/// handled: the core's own first, then per peer, then per stream.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    /// A store failure is waited out: the next commit may start.
    StoreRetry,
    /// Acks waiting for company must be committed alone.
    AckRide,
    /// The oldest held send's hold ends.
    Hold,
    /// The journal is due to be trimmed.
    Trim,
    /// This node's topics and marks are due to be told to its peers again.
    TopicAnnounce,
    /// A timer of one peer's connection.
    Peer(NodeId, PeerTimer),
    /// Ask the stream's author again for what is missing.
    Resync(StreamId),
}

/// The timers of one peer's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum PeerTimer {
    /// The peer's Hello has not come: send ours again, or give up.
    Hello,
    /// Feeding the peer: retry a failed outbox read, or resend after silence.
    Feed,
    /// The peer has no connection: ask the connected peers for its card.
    Ask,
}

/// Deadlines by timer, and the same ordered by time.
///
/// Invariant: `order` holds exactly `(at, timer)` for every entry of `at`.
#[derive(Debug, Default)]
pub(super) struct TimerTable {
    at: BTreeMap<Timer, Millis>,
    order: BTreeSet<(Millis, Timer)>,
}

impl TimerTable {
    /// Sets `timer` to fire at `at`, or stops it (`None`).
    pub(super) fn set(&mut self, timer: Timer, at: Option<Millis>) {
        if self.at.get(&timer).copied() == at {
            return;
        }
        let old = match at {
            Some(t) => self.at.insert(timer.clone(), t),
            None => self.at.remove(&timer),
        };
        if let Some(old) = old {
            self.order.remove(&(old, timer.clone()));
        }
        if let Some(t) = at {
            self.order.insert((t, timer));
        }
        debug_assert_eq!(self.at.len(), self.order.len());
    }

    /// The earliest deadline, if any timer is set.
    pub(super) fn next(&self) -> Option<Millis> {
        self.order.first().map(|(t, _)| *t)
    }

    /// The timers due at `now`, in [`Timer`] order. They stay set: the
    /// machine that handles one says what comes next.
    pub(super) fn due(&self, now: Millis) -> Vec<Timer> {
        let mut due: Vec<Timer> = self
            .order
            .iter()
            .take_while(|(t, _)| *t <= now)
            .map(|(_, timer)| timer.clone())
            .collect();
        due.sort();
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_the_earliest_deadline_and_what_is_due_in_timer_order() {
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        t.set(Timer::AckRide, Some(Millis(30)));
        t.set(Timer::StoreRetry, Some(Millis(20)));
        t.set(Timer::StoreRetry, Some(Millis(40)));
        assert_eq!(t.next(), Some(Millis(30)));
        assert_eq!(t.due(Millis(29)), Vec::<Timer>::new());
        assert_eq!(t.due(Millis(40)), vec![Timer::StoreRetry, Timer::AckRide]);
        t.set(Timer::AckRide, None);
        assert_eq!(t.next(), Some(Millis(40)));
        t.set(Timer::StoreRetry, None);
        assert_eq!(t.next(), None);
    }
}
