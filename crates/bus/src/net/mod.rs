//! The iroh transport: one endpoint per node, at most one connection per
//! peer, frames in and out. It makes no protocol decisions; those are the
//! core's. The wire format, who may connect, pausing, the one-connection
//! rule and the close codes are specified in `docs/protocol.md`.
//!
//! The transport is not an actor of its own: it is the peer table, the dial,
//! backoff and pause state, and the tasks it owns (the accept loop, dials, a
//! reader and a writer per connection), held and driven by its owner
//! through one cancel-safe `next()` that a `select!` loop waits on. The node's
//! loop owns the node's transport; [`Net`] runs one alone for tools and tests.
//!
//! Each connection has one bounded byte queue, filled by the owner without
//! waiting and drained whole by its writer task. Each connection's reader
//! decodes frames (and, for the node, checks batch signatures) in its own
//! task, so that work runs in parallel across connections; what it read
//! waits for the owner within [`RECEIVED_FRAMES_MAX`] and
//! [`RECEIVED_BYTES_MAX`], and a reader beyond them back-pressures its peer
//! through QUIC flow control.

pub mod close_code;
mod config;
mod conn;
mod counters;
mod endpoint;
mod error;
mod key;
mod mdns;
mod peers;
mod queue;
mod raw;
mod transport;

pub use crate::core::ConnId;
pub use config::{
    ALPN, CATCHUP_QUEUE_BYTES_MAX, DIAL_BACKOFF_MAX, DIAL_BACKOFF_MIN, DIAL_TIMEOUT,
    HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, INSTANCE_BYTES, KEEP_ALIVE_INTERVAL, NetConfig, PAUSED_REASON,
    PEERS_MAX, PENDING_ACCEPTS_MAX, PREAMBLE, PREAMBLE_MAGIC, READ_BUFFER_BYTES,
    RECEIVED_BYTES_MAX, RECEIVED_FRAMES_MAX, RELAYS_MAX, SEND_QUEUE_BYTES_MAX, STABLE_CONNECTION,
};
pub use conn::RecvLease;
pub use counters::NetCounters;
pub(crate) use error::error_chain;
pub use error::{DisconnectReason, NetError, PeerError, SendError};
pub use key::{
    NODE_KEY_BYTES, NODE_KEY_FILE, load_or_create_key, load_or_create_node_key, store_key,
};
pub use mdns::{MDNS_SERVICE, MdnsMode, NEARBY_MAX};
pub use raw::{NET_EVENTS_MAX, NET_QUEUE_BYTES_MAX, Net, NetEvent};
pub use transport::{NearbyNode, PeerStatus};

pub(crate) use config::SHUTDOWN_TIMEOUT;
pub(crate) use conn::close as close_connection;
pub(crate) use endpoint::endpoint_addr;
pub(crate) use endpoint::local_addrs as endpoint_addrs;
pub(crate) use endpoint::local_port as endpoint_port;
pub(crate) use transport::{Event, Transport};
