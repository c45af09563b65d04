//! The iroh transport: one endpoint per node, at most one connection per peer,
//! frames in and out. It makes no protocol decisions; those are the core's.
//!
//! # Shape
//!
//! [`Net::bind`] starts an iroh endpoint (relays, address lookup and the
//! portmapper off) and a driver task, and hands back the [`Net`] handle and the
//! receiver of [`NetEvent`]s. Per connection it reports `Connected`, then the
//! peer's frames in order, then `Disconnected`, all tagged with a [`ConnId`]
//! unique to that connection, so a reader can ignore stale events. Events of
//! two connections to one peer never interleave: a replacing connection is
//! announced only after the one it replaces has been reported disconnected.
//!
//! # Who may connect
//!
//! Only peers added with [`Net::add_peer`]. Anyone else is closed right after
//! the TLS handshake with [`close_code::UNKNOWN_NODE`] and the reason
//! "unknown node", logged and counted in [`NetCounters::refused`].
//!
//! # Pausing a link
//!
//! [`Net::set_paused`] pauses the link to a known peer: its connection is
//! closed with [`close_code::PAUSED`] and the reason "link paused", it is not
//! dialed, and its incoming connections are closed the same way right after
//! the TLS handshake (logged once per pause, counted in
//! [`NetCounters::paused_refused`]). To the bus the peer is simply
//! disconnected, so what is sent to it waits in the outbox. Resuming dials
//! the peer at once with the backoff reset; the peer's own redials, slowed
//! by their backoff, need not come first, and if both dial at once the rule
//! below keeps one connection. (A peer this node has no address for cannot
//! be dialed: it gets back in with its own next redial, at most
//! [`DIAL_BACKOFF_MAX`] later.) A pause lives in memory only: a restarted
//! transport has no paused link.
//!
//! # One connection per peer
//!
//! Both sides dial a known peer whenever they have no connection to it (with
//! bounded, jittered exponential backoff), so a peer reachable in one
//! direction only is still reached. When two connections to the same peer
//! meet, both sides keep the same one:
//!
//! - of two dialed by different sides, the one dialed by the lower node id
//!   (byte order of the public keys) wins;
//! - of two dialed by the same side, the newer wins: that side only dials when
//!   it has no connection, so it has given the older one up (a restart).
//!
//! Before either rule, a connection to a newer *instance* of the peer wins
//! over one to an older instance, and loses against a newer one. Each side
//! names its instance in its preamble (the time its transport was bound), so
//! a peer that crashed and came back is told apart from one that dialed at
//! the same moment as we did: without it, a restarted higher-id peer's dials
//! would be refused in favour of our dead connection to its old process
//! until that one timed out. A peer whose clock went backwards across a
//! restart looks older and waits for the idle timeout as before.
//!
//! The loser is closed with [`close_code::DUPLICATE`]. A dial loses the race
//! only when the other direction already won, so it is not retried until that
//! connection ends.
//!
//! # The frame stream
//!
//! Each connection carries one long-lived bi stream. The dialer opens it and
//! writes its preamble at once (a stream is invisible to the peer's
//! `accept_bi` until its opener writes): [`PREAMBLE`], then its instance, 8
//! bytes big-endian ([`INSTANCE_BYTES`]). The acceptor answers with its own
//! preamble once it has taken the connection as its live one; the dialer
//! reports `Connected` only after reading it. After the preamble each side
//! writes frames: a 4-byte big-endian length, then the postcard body
//! ([`mesh_protocol::encode_frame`]). A frame that is too large or does not
//! decode closes the connection ([`close_code::FRAME_TOO_LARGE`],
//! [`close_code::BAD_FRAME`]) and is counted in [`NetCounters::bad_frames`].
//!
//! Outgoing frames are encoded by the caller into a per-connection buffer of
//! at most [`PEER_QUEUE_BYTES`]; a writer task sends all that is queued in one
//! write. Incoming frames go through the bounded event channel, so a reader
//! that stops reading back-pressures the peer through QUIC flow control.

mod actor;
mod conn;
mod key;
mod outbox;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use iroh::address_lookup::memory::MemoryLookup;
use iroh::endpoint::{
    AfterHandshakeOutcome, Connection, EndpointHooks, PortmapperConfig, QuicTransportConfig, Side,
    VarInt, presets,
};
use iroh::{Endpoint, RelayMode};
use mesh_protocol::{Frame, FrameError, MAX_TICKET_ADDRS, NodeId, NodeTicket, SecretKey};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

pub use key::{NODE_KEY_BYTES, NODE_KEY_FILE, load_or_create_node_key};

use outbox::Outbox;

/// The ALPN of the agent-mesh daemon-to-daemon protocol.
pub const ALPN: &[u8] = b"agent-mesh/1";

/// The first bytes each side writes on the frame stream, before any frame.
///
/// It makes the opener's stream visible to the acceptor at once, and the
/// acceptor's copy tells the dialer its connection was taken as the live one.
pub const PREAMBLE: [u8; 8] = *b"amesh/1\n";

/// Bytes of the instance that follows [`PREAMBLE`]: a big-endian `u64`, the
/// microseconds since the Unix epoch when the sender's transport was bound.
/// It only orders the instances of one node (see "One connection per peer").
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

/// Bytes of encoded frames queued for one peer before [`Net::try_send`]
/// answers [`SendError::QueueFull`] (and [`Net::send`] waits). One frame may
/// overshoot it, so the most held is this plus one frame.
pub const PEER_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// Capacity of the [`NetEvent`] channel.
pub const EVENTS_CAPACITY: usize = 1024;

/// Bytes of received frames (as counted on the wire) that may wait in the
/// event channel, over all peers; each [`NetEvent::Frame`] holds its share in
/// a [`RecvLease`] until dropped. With [`EVENTS_CAPACITY`] this bounds memory
/// for both many small and a few large frames.
pub const RECV_BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// Initial size of a connection's read buffer; it grows to one whole frame
/// (at most [`mesh_protocol::MAX_FRAME_BYTES`] plus its header) when needed.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Most incoming connections in their handshake at once; more are refused.
pub const MAX_PENDING_ACCEPTS: usize = 32;

/// Most peers one node knows.
pub const MAX_PEERS: usize = 4096;

/// The reason sent with [`close_code::PAUSED`].
pub const PAUSED_REASON: &str = "link paused";

/// Capacity of the command channel from [`Net`] to its driver task.
const COMMANDS_CAPACITY: usize = 64;

/// QUIC application close codes this transport sends (HTTP-like numbers).
pub mod close_code {
    /// The node is shutting down, or the frame stream ended.
    pub const SHUTDOWN: u32 = 0;
    /// The bus closed the connection: the peer broke the protocol.
    pub const PROTOCOL_VIOLATION: u32 = 406;
    /// The peer did not start the frame stream with the preamble.
    pub const BAD_PREAMBLE: u32 = 400;
    /// The remote key is not a known peer ("unknown node").
    pub const UNKNOWN_NODE: u32 = 403;
    /// The preamble exchange did not finish in time.
    pub const HANDSHAKE_TIMEOUT: u32 = 408;
    /// Another connection to the same peer was kept instead of this one.
    pub const DUPLICATE: u32 = 409;
    /// The peer was removed from the known peers.
    pub const PEER_REMOVED: u32 = 410;
    /// The link to the peer is paused on this side; it is dialed again when
    /// it is resumed.
    pub const PAUSED: u32 = 503;
    /// The peer did not take frames as fast as they came; it catches up
    /// after it reconnects.
    pub const SLOW_PEER: u32 = 429;
    /// A frame header announced more than `MAX_FRAME_BYTES` (or zero).
    pub const FRAME_TOO_LARGE: u32 = 413;
    /// A frame body did not decode.
    pub const BAD_FRAME: u32 = 422;
}

/// Whether the endpoint may use relay servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayPolicy {
    /// Direct addresses only (the only policy so far).
    #[default]
    Disabled,
}

/// How to bind the transport.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// The UDP socket to bind; port 0 picks a free one.
    pub bind_addr: SocketAddr,
    /// Relay use (off).
    pub relays: RelayPolicy,
    /// QUIC idle timeout; see [`IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// QUIC keep-alive interval; see [`KEEP_ALIVE_INTERVAL`].
    pub keep_alive: Duration,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            bind_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            relays: RelayPolicy::Disabled,
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

/// Identifies one connection of this node; never reused while the node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// What the transport reports, in order per peer.
#[derive(Debug)]
#[non_exhaustive]
pub enum NetEvent {
    /// A connection to `peer` is live; frames may be sent on `conn`.
    Connected {
        /// The peer.
        peer: NodeId,
        /// The new connection.
        conn: ConnId,
    },
    /// A frame arrived from `peer` on `conn`.
    #[non_exhaustive]
    Frame {
        /// The peer.
        peer: NodeId,
        /// The connection it came on.
        conn: ConnId,
        /// The decoded frame.
        frame: Frame,
        /// The frame's share of [`RECV_BUDGET_BYTES`], returned when dropped.
        lease: RecvLease,
    },
    /// `conn` to `peer` is gone; nothing more arrives on it.
    Disconnected {
        /// The peer.
        peer: NodeId,
        /// The connection that ended.
        conn: ConnId,
        /// Why it ended.
        reason: DisconnectReason,
    },
}

/// A received frame's hold on [`RECV_BUDGET_BYTES`]; dropping it (or the
/// event carrying it) lets the readers take in that many more bytes.
#[derive(Debug)]
pub struct RecvLease {
    _permit: OwnedSemaphorePermit,
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectReason {
    /// The peer closed it with an application code (see [`close_code`]).
    ClosedByPeer {
        /// The code.
        code: u64,
        /// The reason text.
        reason: String,
    },
    /// This node closed it with an application code (see [`close_code`]).
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

/// Why binding the transport or loading its key failed.
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
    /// The peer's queue holds [`PEER_QUEUE_BYTES`] already.
    #[error("the peer's send queue is full")]
    QueueFull,
    /// The frame does not encode within the frame limit: a bug in the caller.
    #[error("frame cannot be sent: {0}")]
    Frame(FrameError),
}

/// Why a peer could not be added or removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// Already [`MAX_PEERS`] peers.
    #[error("this node already knows {MAX_PEERS} peers; remove one first")]
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
}

#[derive(Debug, Default)]
struct Counters {
    frames_in: AtomicU64,
    frames_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    refused: AtomicU64,
    bad_frames: AtomicU64,
    connections: AtomicU64,
    dial_failures: AtomicU64,
    paused_refused: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> NetCounters {
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
        }
    }
}

/// One known peer as the transport sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStatus {
    /// The peer.
    pub node: NodeId,
    /// The addresses it is dialed at.
    pub addrs: Vec<SocketAddr>,
    /// The live connection, if any.
    pub conn: Option<ConnId>,
    /// Whether this node dialed the live connection (false if the peer did).
    pub dialed_here: bool,
    /// Whether the link is paused ([`Net::set_paused`]).
    pub paused: bool,
}

/// State shared by the handle, the driver, the connection tasks and the hook.
#[derive(Debug)]
struct Shared {
    /// Known peers and their addresses: the allowlist.
    peers: RwLock<HashMap<NodeId, Vec<SocketAddr>>>,
    /// The live connection's send queue per peer.
    live: RwLock<HashMap<NodeId, Arc<Outbox>>>,
    /// Paused peers, each with whether a refused connection of this pause
    /// has been logged (only the first is, at info).
    paused: Mutex<HashMap<NodeId, bool>>,
    counters: Counters,
    /// Holds [`RECV_BUDGET_BYTES`] permits, one per received byte in flight.
    recv_budget: Arc<Semaphore>,
    /// Set once on shutdown; long waits select on it.
    closing: watch::Sender<bool>,
    /// This transport's instance, sent in every preamble.
    instance: u64,
}

impl Shared {
    fn outbox(&self, peer: &NodeId) -> Option<Arc<Outbox>> {
        // A poisoned lock means a panic elsewhere; the map itself is still sound.
        let live = self.live.read().unwrap_or_else(|p| p.into_inner());
        live.get(peer).cloned()
    }

    fn is_paused(&self, peer: &NodeId) -> bool {
        self.paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(peer)
    }

    /// Counts a connection of `peer` refused because its link is paused;
    /// logs the first of each pause at info, the others at debug.
    fn refused_paused(&self, peer: &NodeId) {
        Counters::add(&self.counters.paused_refused, 1);
        let first = self
            .paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(peer)
            .is_some_and(|logged| !std::mem::replace(logged, true));
        if first {
            info!(peer = %peer.fmt_short(), "refused a connection: the link is paused (logged once per pause)");
        } else {
            debug!(peer = %peer.fmt_short(), "refused a connection: the link is paused");
        }
    }

    fn is_known(&self, peer: &NodeId) -> bool {
        self.peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(peer)
    }
}

/// The endpoint hook that closes connections from unknown nodes after the TLS
/// handshake, before any stream is accepted.
#[derive(Debug)]
struct Allowlist(Arc<Shared>);

impl EndpointHooks for Allowlist {
    async fn after_handshake<'a>(&'a self, conn: &'a Connection) -> AfterHandshakeOutcome {
        let remote = conn.remote_id();
        if conn.side() == Side::Server && !self.0.is_known(&remote) {
            Counters::add(&self.0.counters.refused, 1);
            warn!(peer = %remote, "refused a connection from an unknown node");
            return AfterHandshakeOutcome::Reject {
                error_code: VarInt::from_u32(close_code::UNKNOWN_NODE),
                reason: b"unknown node".to_vec(),
            };
        }
        if conn.side() == Side::Server && self.0.is_paused(&remote) {
            self.0.refused_paused(&remote);
            return AfterHandshakeOutcome::Reject {
                error_code: VarInt::from_u32(close_code::PAUSED),
                reason: PAUSED_REASON.as_bytes().to_vec(),
            };
        }
        AfterHandshakeOutcome::accept()
    }
}

/// Commands from the handle to the driver task.
#[derive(Debug)]
enum Command {
    /// A peer was added or its addresses changed: (re)dial it now.
    PeerAdded {
        node: NodeId,
        addrs: Vec<SocketAddr>,
    },
    /// A peer was removed: close and forget it.
    PeerRemoved {
        node: NodeId,
        done: oneshot::Sender<()>,
    },
    /// Pause or resume the link to a known peer.
    SetPaused {
        node: NodeId,
        paused: bool,
        done: oneshot::Sender<()>,
    },
    /// Close `conn` to `peer` if it is the live connection.
    Close {
        peer: NodeId,
        conn: ConnId,
        code: u32,
        reason: String,
    },
}

/// The transport handle. Dropping it without [`Net::shutdown`] shuts the
/// transport down in the background.
#[derive(Debug)]
pub struct Net {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    lookup: MemoryLookup,
    commands: mpsc::Sender<Command>,
    /// Taken by the first [`Net::shutdown`].
    driver: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Net {
    /// Binds the endpoint and starts the driver task.
    ///
    /// Returns the handle and the receiver of every [`NetEvent`] (bounded by
    /// [`EVENTS_CAPACITY`]). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`NetError::AddrInUse`] or [`NetError::Bind`] if the address cannot be bound.
    pub async fn bind(
        config: NetConfig,
        secret_key: SecretKey,
    ) -> Result<(Net, mpsc::Receiver<NetEvent>), NetError> {
        let addr = config.bind_addr;
        let (closing, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            peers: RwLock::new(HashMap::new()),
            live: RwLock::new(HashMap::new()),
            paused: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            recv_budget: Arc::new(Semaphore::new(RECV_BUDGET_BYTES)),
            closing,
            instance: instance_now(),
        });
        let bind_err = |why: String| NetError::Bind { addr, why };
        let idle = config.idle_timeout.try_into().map_err(|_| {
            bind_err(format!(
                "idle timeout {:?} is too large",
                config.idle_timeout
            ))
        })?;
        let transport = QuicTransportConfig::builder()
            .max_idle_timeout(Some(idle))
            .keep_alive_interval(config.keep_alive)
            // One frame stream, opened by the dialer; nothing else is accepted.
            .max_concurrent_bidi_streams(VarInt::from_u32(1))
            .max_concurrent_uni_streams(VarInt::from_u32(0))
            .build();
        let relay_mode = match config.relays {
            RelayPolicy::Disabled => RelayMode::Disabled,
        };
        let endpoint = Endpoint::builder(presets::Minimal)
            .secret_key(secret_key)
            .relay_mode(relay_mode)
            .clear_address_lookup()
            .portmapper_config(PortmapperConfig::Disabled)
            .clear_ip_transports()
            .bind_addr(addr)
            .map_err(|e| bind_err(e.to_string()))?
            .alpns(vec![ALPN.to_vec()])
            .transport_config(transport)
            .hooks(Allowlist(shared.clone()))
            .bind()
            .await
            .map_err(|e| match find_io_kind(&e) {
                Some(std::io::ErrorKind::AddrInUse) => NetError::AddrInUse { addr },
                _ => bind_err(error_chain(&e)),
            })?;
        let lookup = MemoryLookup::new();
        match endpoint.address_lookup() {
            Ok(services) => services.add(lookup.clone()),
            Err(e) => {
                endpoint.close().await;
                return Err(bind_err(e.to_string()));
            }
        }
        let (events_tx, events_rx) = mpsc::channel(EVENTS_CAPACITY);
        let (commands, commands_rx) = mpsc::channel(COMMANDS_CAPACITY);
        let driver = actor::spawn(endpoint.clone(), shared.clone(), commands_rx, events_tx);
        Ok((
            Net {
                shared,
                endpoint,
                lookup,
                commands,
                driver: std::sync::Mutex::new(Some(driver)),
            },
            events_rx,
        ))
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.endpoint.id()
    }

    /// The addresses to put in a ticket: the bound socket, or when bound to an
    /// unspecified address (`0.0.0.0`), the interface addresses iroh reports.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        let bound = self.endpoint.bound_sockets();
        let mut out: BTreeSet<SocketAddr> = BTreeSet::new();
        for sock in bound {
            if sock.ip().is_unspecified() {
                out.extend(
                    self.endpoint
                        .addr()
                        .ip_addrs()
                        .filter(|a| a.is_ipv4() == sock.is_ipv4() && a.port() == sock.port()),
                );
            } else {
                out.insert(sock);
            }
        }
        out.into_iter().take(MAX_TICKET_ADDRS).collect()
    }

    /// A ticket for this node at [`Net::local_addrs`].
    pub fn ticket(&self) -> NodeTicket {
        NodeTicket {
            node: self.node_id(),
            addrs: self.local_addrs(),
        }
    }

    /// Makes `node` a known peer at `addrs` (replacing addresses it had) and
    /// dials it at once. A peer with no addresses is accepted but not dialed.
    ///
    /// # Errors
    /// [`PeerError`] for too many peers or addresses, this node's own id, or a
    /// transport that has shut down.
    pub async fn add_peer(&self, node: NodeId, addrs: Vec<SocketAddr>) -> Result<(), PeerError> {
        if node == self.node_id() {
            return Err(PeerError::SelfPeer);
        }
        if addrs.len() > MAX_TICKET_ADDRS {
            return Err(PeerError::TooManyAddrs(addrs.len()));
        }
        if *self.shared.closing.borrow() {
            return Err(PeerError::ShutDown);
        }
        {
            let mut peers = self.shared.peers.write().unwrap_or_else(|p| p.into_inner());
            if peers.len() >= MAX_PEERS && !peers.contains_key(&node) {
                return Err(PeerError::TooManyPeers);
            }
            peers.insert(node, addrs.clone());
        }
        let mut info = iroh::EndpointAddr::new(node);
        for a in &addrs {
            info = info.with_ip_addr(*a);
        }
        self.lookup.set_endpoint_info(info);
        self.commands
            .send(Command::PeerAdded { node, addrs })
            .await
            .map_err(|_| PeerError::ShutDown)
    }

    /// Forgets `node`: refuses it from now on and closes its connection with
    /// [`close_code::PEER_REMOVED`]. Removing an unknown peer does nothing.
    ///
    /// # Errors
    /// [`PeerError::ShutDown`] if the transport has shut down.
    pub async fn remove_peer(&self, node: NodeId) -> Result<(), PeerError> {
        self.shared
            .peers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&node);
        self.shared
            .paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&node);
        self.lookup.remove_endpoint_info(node);
        let (done, wait) = oneshot::channel();
        self.commands
            .send(Command::PeerRemoved { node, done })
            .await
            .map_err(|_| PeerError::ShutDown)?;
        wait.await.map_err(|_| PeerError::ShutDown)
    }

    /// The known peers and their live connections.
    pub fn peers(&self) -> Vec<PeerStatus> {
        let peers = self.shared.peers.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<PeerStatus> = peers
            .iter()
            .map(|(node, addrs)| {
                let live = self.shared.outbox(node);
                PeerStatus {
                    node: *node,
                    addrs: addrs.clone(),
                    conn: live.as_ref().map(|o| o.conn),
                    dialed_here: live.is_some_and(|o| o.dialed_here),
                    paused: self.shared.is_paused(node),
                }
            })
            .collect();
        out.sort_by_key(|p| *p.node.as_bytes());
        out
    }

    /// Pauses (`paused = true`) or resumes the link to the known peer `node`;
    /// answers once the transport has acted. See "Pausing a link" in the
    /// module doc. Pausing a paused link or resuming a live one does
    /// nothing. The pause is not stored: a new transport starts unpaused.
    ///
    /// # Errors
    /// [`PeerError::UnknownPeer`] if `node` is not a known peer,
    /// [`PeerError::ShutDown`] if the transport has shut down.
    pub async fn set_paused(&self, node: NodeId, paused: bool) -> Result<(), PeerError> {
        if *self.shared.closing.borrow() {
            return Err(PeerError::ShutDown);
        }
        {
            // Under the peers lock, so a concurrent removal cannot leave a
            // pause behind for a peer that is gone.
            let peers = self.shared.peers.read().unwrap_or_else(|p| p.into_inner());
            if !peers.contains_key(&node) {
                return Err(PeerError::UnknownPeer(node));
            }
            let mut set = self.shared.paused.lock().unwrap_or_else(|p| p.into_inner());
            if paused {
                // Set before the driver acts, so the hook refuses at once.
                set.entry(node).or_insert(false);
            } else {
                set.remove(&node);
            }
        }
        let (done, wait) = oneshot::channel();
        self.commands
            .send(Command::SetPaused { node, paused, done })
            .await
            .map_err(|_| PeerError::ShutDown)?;
        wait.await.map_err(|_| PeerError::ShutDown)
    }

    /// Queues `frame` for `peer` on `conn` without waiting.
    ///
    /// # Errors
    /// [`SendError::NotConnected`] if `conn` is not the peer's live connection,
    /// [`SendError::QueueFull`] if [`PEER_QUEUE_BYTES`] are already queued,
    /// [`SendError::Frame`] if the frame exceeds the frame limit.
    pub fn try_send(&self, peer: NodeId, conn: ConnId, frame: &Frame) -> Result<(), SendError> {
        let outbox = self.live_outbox(peer, conn)?;
        outbox.try_push(frame)
    }

    /// Queues `frame` for `peer` on `conn`, waiting while the queue is full.
    ///
    /// # Errors
    /// As [`Net::try_send`], except that it waits instead of answering
    /// `QueueFull`; `NotConnected` if the connection ends while waiting.
    pub async fn send(&self, peer: NodeId, conn: ConnId, frame: &Frame) -> Result<(), SendError> {
        let outbox = self.live_outbox(peer, conn)?;
        outbox.push(frame).await
    }

    /// Waits until the queue of `peer` on `conn` has room for a frame.
    ///
    /// # Errors
    /// [`SendError::NotConnected`] if `conn` is not (or stops being) live.
    pub async fn writable(&self, peer: NodeId, conn: ConnId) -> Result<(), SendError> {
        let outbox = self.live_outbox(peer, conn)?;
        outbox.writable().await
    }

    /// Transport counters since bind.
    pub fn counters(&self) -> NetCounters {
        self.shared.counters.snapshot()
    }

    /// Closes `conn` to `peer` with `code` and `reason` if it is the live
    /// connection (see [`close_code`]); the peer is redialed with backoff as
    /// after any disconnect. `Disconnected` follows as usual.
    ///
    /// # Errors
    /// [`PeerError::ShutDown`] if the transport has shut down.
    pub async fn close(
        &self,
        peer: NodeId,
        conn: ConnId,
        code: u32,
        reason: &str,
    ) -> Result<(), PeerError> {
        let reason = reason.to_owned();
        self.commands
            .send(Command::Close {
                peer,
                conn,
                code,
                reason,
            })
            .await
            .map_err(|_| PeerError::ShutDown)
    }

    /// Closes every connection (code [`close_code::SHUTDOWN`]) and the
    /// endpoint, and waits until the close frames are flushed. Later calls
    /// return at once.
    pub async fn shutdown(&self) {
        self.shared.closing.send_replace(true);
        let driver = self.driver.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(driver) = driver {
            // The driver closes the endpoint before it returns; a panic in it
            // has been logged by tokio already.
            let _ = driver.await;
        }
    }

    fn live_outbox(&self, peer: NodeId, conn: ConnId) -> Result<Arc<Outbox>, SendError> {
        match self.shared.outbox(&peer) {
            Some(o) if o.conn == conn => Ok(o),
            _ => Err(SendError::NotConnected),
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Wakes the driver even if it is blocked on a full event channel; it
        // then closes everything in the background.
        self.shared.closing.send_replace(true);
    }
}

/// A new instance stamp: microseconds since the Unix epoch (0 if the clock
/// is before it, which only makes this instance look old to peers).
fn instance_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The first `io::ErrorKind` in an error's source chain.
fn find_io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut depth = 0;
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        depth += 1;
        if depth > 16 {
            break;
        }
        cur = err.source();
    }
    None
}

/// An error and its sources on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    let mut depth = 0;
    while let Some(err) = cur {
        depth += 1;
        if depth > 16 {
            break;
        }
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out
}
