//! The transport's counters: bumped by the connection tasks and the owner,
//! read as a [`NetCounters`] snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

/// Transport counters since bind, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetCounters {
    /// Frames received and decoded.
    pub frames_in: u64,
    /// Frames written to QUIC.
    pub frames_out: u64,
    /// Bytes received on frame streams (headers and preambles included).
    pub bytes_in: u64,
    /// Bytes written to frame streams (headers and preambles included).
    pub bytes_out: u64,
    /// Connections refused because the remote was not a known peer.
    pub refused: u64,
    /// Connections closed because the peer sent a bad or oversized frame.
    pub bad_frames: u64,
    /// Connections that became live.
    pub connections: u64,
    /// Dials that failed or timed out.
    pub dial_failures: u64,
    /// Incoming connections closed because the link to their peer is paused.
    pub paused_refused: u64,
    /// Connections refused (here or by the peer) because two live processes
    /// share one node key.
    pub identity_conflicts: u64,
    /// Connections refused (by either side) for another protocol version.
    pub version_refused: u64,
}

/// The live counters, shared with the connection tasks (metrics only: no
/// decision reads them).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) frames_in: AtomicU64,
    pub(crate) frames_out: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) bad_frames: AtomicU64,
    pub(crate) connections: AtomicU64,
    pub(crate) dial_failures: AtomicU64,
    pub(crate) paused_refused: AtomicU64,
    pub(crate) identity_conflicts: AtomicU64,
    pub(crate) version_refused: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> NetCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetCounters {
            frames_in: g(&self.frames_in),
            frames_out: g(&self.frames_out),
            bytes_in: g(&self.bytes_in),
            bytes_out: g(&self.bytes_out),
            refused: g(&self.refused),
            bad_frames: g(&self.bad_frames),
            connections: g(&self.connections),
            dial_failures: g(&self.dial_failures),
            paused_refused: g(&self.paused_refused),
            identity_conflicts: g(&self.identity_conflicts),
            version_refused: g(&self.version_refused),
        }
    }
}
