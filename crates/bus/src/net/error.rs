//! What can go wrong in the transport, grouped by operation.

use std::fmt;
use std::net::SocketAddr;

use mesh_protocol::{FrameError, MAX_TICKET_ADDRS, NodeId};

use super::PEERS_MAX;

/// Why binding the transport or loading its key failed: the environment's
/// fault (the disk, the socket).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The node key file or its directory could not be read or written.
    #[error("cannot use the node key at {path}: {source}")]
    KeyIo {
        /// The file (or directory).
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The node key file does not hold exactly 32 bytes. It is left as it is.
    #[error(
        "the node key at {path} holds {len} bytes, not 32; it was not changed. \
         Restore the right file, or move it aside to start this node with a new identity"
    )]
    KeyWrongSize {
        /// The file.
        path: std::path::PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The listen address is taken by another socket.
    #[error(
        "address {addr} is already in use; is another mesh daemon running? \
         Stop it or choose another listen address"
    )]
    AddrInUse {
        /// The address.
        addr: SocketAddr,
    },
    /// The listen address cannot be bound for another reason.
    #[error("cannot listen on {addr}: {why}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What iroh and the OS reported.
        why: String,
    },
}

/// Why a frame was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// `conn` is not the live connection to the peer (any more).
    #[error("not connected to the peer on this connection")]
    NotConnected,
    /// The connection's queue is full ([`super::Net::try_send`] only).
    #[error("the peer's send queue is full")]
    QueueFull,
    /// The frame does not encode within the frame limit: a bug in the caller.
    #[error("frame cannot be sent: {0}")]
    Frame(FrameError),
}

/// Why a peer could not be added, removed, paused or resumed: the caller's
/// fault, except [`PeerError::ShutDown`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// Already [`PEERS_MAX`] peers.
    #[error("this node already knows {PEERS_MAX} peers; remove one first")]
    TooManyPeers,
    /// More than [`MAX_TICKET_ADDRS`] addresses.
    #[error("{0} addresses given, at most {MAX_TICKET_ADDRS} allowed")]
    TooManyAddrs(usize),
    /// A node cannot be its own peer.
    #[error("a node cannot be its own peer")]
    SelfPeer,
    /// The peer is not known (to pause or resume it).
    #[error("{0} is not a known peer")]
    UnknownPeer(NodeId),
    /// The transport has shut down.
    #[error("the transport has shut down")]
    ShutDown,
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectReason {
    /// The peer closed it with an application code (see [`super::close_code`]).
    ClosedByPeer {
        /// The code.
        code: u64,
        /// The reason text.
        reason: String,
    },
    /// This node closed it with an application code (see [`super::close_code`]).
    ClosedLocally {
        /// The code.
        code: u32,
        /// The reason text.
        reason: String,
    },
    /// The peer sent a frame that was too large or did not decode.
    BadFrame(FrameError),
    /// Nothing was heard from the peer for the idle timeout.
    TimedOut,
    /// The peer finished or reset the frame stream.
    StreamEnded,
    /// Another transport failure.
    Transport(String),
}

impl fmt::Display for DisconnectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DisconnectReason::ClosedByPeer { code, reason } => {
                write!(f, "closed by peer: {reason} (code {code})")
            }
            DisconnectReason::ClosedLocally { code, reason } => {
                write!(f, "closed here: {reason} (code {code})")
            }
            DisconnectReason::BadFrame(e) => write!(f, "peer sent a bad frame: {e}"),
            DisconnectReason::TimedOut => f.write_str("timed out"),
            DisconnectReason::StreamEnded => f.write_str("peer ended the frame stream"),
            DisconnectReason::Transport(e) => write!(f, "transport error: {e}"),
        }
    }
}

/// The first `io::ErrorKind` in an error's source chain.
pub(crate) fn find_io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // Bounded: error chains are short, but a cyclic one must not loop.
    for _ in 0..16 {
        let err = cur?;
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}

/// An error and its sources on one line.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    for _ in 0..16 {
        let Some(err) = cur else { break };
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out
}
