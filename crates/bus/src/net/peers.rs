//! What the transport knows about one peer, and the rules that keep one
//! connection per peer and space out redials.

use std::net::SocketAddr;
use std::time::Duration;

use mesh_protocol::NodeId;
use rand::RngExt;
use rand::rngs::SmallRng;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::DIAL_BACKOFF_MIN;
use super::conn::Established;
use crate::core::ConnId;

/// One known peer: a plain field of the transport, changed only by its owner.
#[derive(Debug)]
pub(crate) struct PeerState {
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) live: Option<Live>,
    /// A connection that won against `live` and takes over once `live` has
    /// been reported disconnected.
    pub(crate) pending: Option<Established>,
    /// When a redial waiting out its backoff is due; cleared when a
    /// connection appears.
    pub(crate) redial_at: Option<Instant>,
    /// The dial in flight. A connection appearing does not cancel it: the
    /// peer may already have taken it as its live connection, so it runs to
    /// the end and goes through the same rule as any other connection.
    pub(crate) dial: Option<Dial>,
    /// The delay before the next redial (before jitter).
    pub(crate) backoff: Duration,
    /// `Some` while the link is paused, with whether a refused connection of
    /// this pause has been logged (only the first is, at info).
    pub(crate) paused: Option<bool>,
    /// The peer's instance that a connection to a newer instance replaced:
    /// a dead process never dials again, so a connection from it later
    /// means two processes run with the peer's key.
    pub(crate) superseded: Option<u64>,
    /// The last identity conflict seen on this link, for a person.
    pub(crate) conflict: Option<String>,
    /// The last protocol-version refusal with this peer, until a connection
    /// is live again.
    pub(crate) refused: Option<String>,
}

impl PeerState {
    pub(crate) fn new(addrs: Vec<SocketAddr>) -> Self {
        PeerState {
            addrs,
            live: None,
            pending: None,
            redial_at: None,
            dial: None,
            backoff: DIAL_BACKOFF_MIN,
            paused: None,
            superseded: None,
            conflict: None,
            refused: None,
        }
    }

    pub(crate) fn cancel_dial(&mut self) {
        if let Some(d) = self.dial.take() {
            d.abort.abort();
        }
    }

    /// Neither connected nor about to be.
    pub(crate) fn idle(&self) -> bool {
        self.live.is_none() && self.pending.is_none() && self.dial.is_none()
    }
}

/// The live connection of a peer, as the one-connection rule needs it.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) conn: ConnId,
    pub(crate) dialed_here: bool,
    /// The peer's instance on this connection.
    pub(crate) peer_instance: u64,
    pub(crate) since: Instant,
}

/// A dial in flight, told apart from older ones by `attempt`.
#[derive(Debug)]
pub(crate) struct Dial {
    pub(crate) attempt: u64,
    pub(crate) abort: AbortHandle,
}

/// Whether a new connection beats its rival, each given as (dialed here,
/// the peer's instance): one to a newer instance of the peer wins (the peer
/// restarted, so the rival leads to a dead process) and one to an older
/// instance loses; with the same instance, from the same dialer the newer
/// wins and from different dialers the one dialed by the lower node id wins.
pub(crate) fn new_wins(me: NodeId, peer: NodeId, new: (bool, u64), rival: (bool, u64)) -> bool {
    let ((new_dialed_here, new_instance), (rival_dialed_here, rival_instance)) = (new, rival);
    if new_instance != rival_instance {
        return new_instance > rival_instance;
    }
    if new_dialed_here == rival_dialed_here {
        return true;
    }
    let new_dialer = if new_dialed_here { me } else { peer };
    let rival_dialer = if rival_dialed_here { me } else { peer };
    new_dialer.as_bytes() < rival_dialer.as_bytes()
}

/// A random delay in `[d/2, d]`, so peers that lost each other together do
/// not redial in lockstep.
pub(crate) fn jitter(rng: &mut SmallRng, d: Duration) -> Duration {
    let half = d / 2;
    let extra_us = rng.random_range(0..=u64::try_from(half.as_micros()).unwrap_or(u64::MAX));
    half + Duration::from_micros(extra_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::SecretKey;
    use rand::SeedableRng;

    fn ids() -> (NodeId, NodeId) {
        let a = SecretKey::generate().public();
        let b = SecretKey::generate().public();
        if a.as_bytes() < b.as_bytes() {
            (a, b)
        } else {
            (b, a)
        }
    }

    #[test]
    fn both_sides_keep_the_connection_dialed_by_the_lower_id() {
        let (low, high) = ids();
        // Low's view: new = dialed by low (here), rival = dialed by high.
        assert!(new_wins(low, high, (true, 1), (false, 1)));
        assert!(!new_wins(low, high, (false, 1), (true, 1)));
        // High's view of the same two connections.
        assert!(new_wins(high, low, (false, 1), (true, 1)));
        assert!(!new_wins(high, low, (true, 1), (false, 1)));
    }

    #[test]
    fn a_newer_connection_from_the_same_dialer_replaces_the_older() {
        let (low, high) = ids();
        assert!(new_wins(low, high, (false, 1), (false, 1)));
        assert!(new_wins(high, low, (false, 1), (false, 1)));
        assert!(new_wins(low, high, (true, 1), (true, 1)));
    }

    #[test]
    fn a_connection_to_a_restarted_peer_beats_one_to_its_old_process() {
        let (low, high) = ids();
        // High restarted and dials low, which holds its own dial to old high:
        // the rule by dialer alone would keep the dead one.
        assert!(new_wins(low, high, (false, 2), (true, 1)));
        // A late connection from the old process never replaces the new one.
        assert!(!new_wins(low, high, (false, 1), (true, 2)));
        assert!(!new_wins(low, high, (true, 1), (false, 2)));
    }

    #[test]
    fn jitter_stays_within_half_to_full() {
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..1000 {
            let j = jitter(&mut rng, Duration::from_millis(100));
            assert!(j >= Duration::from_millis(50) && j <= Duration::from_millis(100));
        }
        assert_eq!(jitter(&mut rng, Duration::ZERO), Duration::ZERO);
    }
}
