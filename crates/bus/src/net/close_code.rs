//! QUIC application close codes this transport sends (HTTP-like numbers),
//! one per reason.

use crate::core::CloseReason;

/// The node is shutting down, or the frame stream ended.
pub const SHUTDOWN: u32 = 0;
/// The peer did not start the frame stream with the preamble.
pub const BAD_PREAMBLE: u32 = 400;
/// The remote key is not a known peer ("unknown node").
pub const UNKNOWN_NODE: u32 = 403;
/// The bus closed the connection for a protocol violation no other code names.
pub const PROTOCOL_VIOLATION: u32 = 406;
/// The preamble exchange did not finish in time.
pub const HANDSHAKE_TIMEOUT: u32 = 408;
/// Another connection to the same peer was kept instead of this one.
pub const DUPLICATE: u32 = 409;
/// The peer was removed from the known peers.
pub const PEER_REMOVED: u32 = 410;
/// Identity conflict: another process with the same node key (another
/// instance) is connected already; two live processes share one key.
pub const IDENTITY_CONFLICT: u32 = 412;
/// A frame header announced more than `MAX_FRAME_BYTES` (or zero).
pub const FRAME_TOO_LARGE: u32 = 413;
/// The peer's Hello names another node than the connection's key.
pub const WRONG_NODE: u32 = 421;
/// A frame body did not decode.
pub const BAD_FRAME: u32 = 422;
/// The peer did not take frames as fast as they came; it catches up
/// after it reconnects.
pub const SLOW_PEER: u32 = 429;
/// The link to the peer is paused on this side; it is dialed again when
/// it is resumed.
pub const PAUSED: u32 = 503;
/// The peer sent no Hello after every retry of ours.
pub const NO_HELLO: u32 = 504;
/// The peer speaks another protocol version, in its preamble or its Hello
/// (the reason names both).
pub const VERSION_MISMATCH: u32 = 505;
/// Join exchange: this node takes no joins now (too many at once, or it
/// does not take joins at all); try again later.
pub const JOIN_BUSY: u32 = 530;
/// Move link: this node takes no agent move now (as many at once as it
/// handles, or nothing here takes moves); try again later.
pub const MOVE_BUSY: u32 = 531;

impl From<&CloseReason> for u32 {
    /// The close code the bus sends for `reason`.
    fn from(reason: &CloseReason) -> u32 {
        match reason {
            CloseReason::UnknownPeer => UNKNOWN_NODE,
            CloseReason::VersionMismatch { .. } => VERSION_MISMATCH,
            CloseReason::WrongNode => WRONG_NODE,
            CloseReason::NoHello { .. } => NO_HELLO,
            CloseReason::Conflict { .. } => IDENTITY_CONFLICT,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_close_reason_goes_out_with_a_code_of_its_own() {
        let reasons = [
            CloseReason::UnknownPeer,
            CloseReason::VersionMismatch { theirs: 2, ours: 1 },
            CloseReason::WrongNode,
            CloseReason::NoHello { attempts: 5 },
            CloseReason::Conflict { seq: 3 },
        ];
        let codes: BTreeSet<u32> = reasons.iter().map(u32::from).collect();
        assert_eq!(codes.len(), reasons.len(), "{codes:?}");
        assert!(!codes.contains(&SHUTDOWN) && !codes.contains(&PROTOCOL_VIOLATION));
    }
}
