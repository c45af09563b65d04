//! The transport's bounds, timings and configuration.

use std::net::SocketAddr;
use std::time::Duration;

use iroh::RelayUrl;

/// The ALPN of the agent-mesh daemon-to-daemon protocol.
pub const ALPN: &[u8] = b"agent-mesh/1";

/// The first bytes each side writes on the frame stream, before any frame:
/// `amesh/` and the protocol version as one digit
/// ([`mesh_protocol::PROTOCOL_VERSION`]), then a newline.
///
/// It makes the opener's stream visible to the acceptor at once, and the
/// acceptor's copy tells the dialer its connection was taken as the live one.
/// A preamble of another version is refused with
/// [`super::close_code::VERSION_MISMATCH`], its reason naming both versions.
pub const PREAMBLE: [u8; 8] = *b"amesh/6\n";

/// The bytes every version's preamble starts with.
pub const PREAMBLE_MAGIC: &[u8; 6] = b"amesh/";

/// Bytes of the instance that follows [`PREAMBLE`]: a big-endian `u64`, the
/// microseconds since the Unix epoch when the sender's transport was bound.
/// It only orders the instances of one node, so that a connection to a
/// restarted peer wins over one to its old process.
pub const INSTANCE_BYTES: usize = 8;

/// QUIC idle timeout: a peer silent this long (keep-alives included) is gone.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// QUIC keep-alive interval; well under [`IDLE_TIMEOUT`] so a live but idle
/// connection never times out.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(2);

/// How long one dial may take before it is abandoned (iroh's own is 30 s).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a new connection may take to exchange [`PREAMBLE`]s.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// First delay before redialing a peer after a failure or a disconnect.
pub const DIAL_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// Largest delay between dials of one peer.
pub const DIAL_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// A connection that stayed up this long resets its peer's dial backoff.
pub const STABLE_CONNECTION: Duration = Duration::from_secs(5);

/// Bytes of encoded frames queued on one connection for its writer task.
/// A connection whose queue grows past this (its peer does not take frames
/// as fast as they come) is closed with [`super::close_code::SLOW_PEER`]; the
/// peer catches up from the outbox after it reconnects. The writer holds at
/// most one more such buffer while it writes it.
pub const SEND_QUEUE_BYTES_MAX: usize = 12 * 1024 * 1024;

/// Bytes queued on a connection below which a catch-up read of the outbox
/// starts at once; above it, the read waits until the writer has taken the
/// queue. This paces a catch-up to what the peer takes, and keeps a
/// catch-up alone far below [`SEND_QUEUE_BYTES_MAX`].
pub const CATCHUP_QUEUE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Received frames (and connection ends) waiting for the transport's owner,
/// over all connections; a reader beyond it waits, which back-pressures its
/// peer through QUIC flow control.
pub const RECEIVED_FRAMES_MAX: usize = 1024;

/// Bytes of received frames (as counted on the wire) read but not yet taken
/// by the transport's owner, over all peers; each frame holds its share in a
/// [`super::RecvLease`] until dropped. With [`RECEIVED_FRAMES_MAX`] this
/// bounds memory for both many small and a few large frames.
pub const RECEIVED_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Initial size of a connection's read buffer; it grows to one whole frame
/// (at most [`mesh_protocol::MAX_FRAME_BYTES`] plus its header) when needed.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Most incoming connections in their handshake at once; more are refused.
pub const PENDING_ACCEPTS_MAX: usize = 32;

/// Most peers one node knows.
pub const PEERS_MAX: usize = 4096;

/// The reason sent with [`super::close_code::PAUSED`].
pub const PAUSED_REASON: &str = "link paused";

/// How long closing the endpoint may take at shutdown.
pub(crate) const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// The most relay servers a node uses.
pub const RELAYS_MAX: usize = 8;

/// How to bind the transport. Address lookup (beyond the peers' known
/// addresses) and the portmapper are always off; relays are off unless
/// some are configured.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// The UDP socket to bind; port 0 picks a free one.
    pub bind_addr: SocketAddr,
    /// With port 0 in `bind_addr`: the port to ask for first (the one this
    /// node listened on before); if it is taken, a free one is picked.
    pub preferred_port: Option<u16>,
    /// Relay servers (self-hosted `iroh-relay`, at most [`RELAYS_MAX`]) for
    /// peers with no direct route; every peer is also dialed through them.
    /// Empty: relays off.
    pub relays: Vec<RelayUrl>,
    /// LAN discovery (off unless asked for; see [`super::MdnsMode`]).
    pub mdns: super::MdnsMode,
    /// The name an mDNS announcement carries.
    pub mdns_name: String,
    /// QUIC idle timeout; see [`IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// QUIC keep-alive interval; see [`KEEP_ALIVE_INTERVAL`].
    pub keep_alive: Duration,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            bind_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            preferred_port: None,
            relays: Vec::new(),
            mdns: super::MdnsMode::Off,
            mdns_name: String::new(),
            idle_timeout: IDLE_TIMEOUT,
            keep_alive: KEEP_ALIVE_INTERVAL,
        }
    }
}

impl NetConfig {
    /// The defaults, bound to `bind_addr`.
    pub fn with_bind_addr(bind_addr: SocketAddr) -> Self {
        NetConfig {
            bind_addr,
            ..NetConfig::default()
        }
    }
}
