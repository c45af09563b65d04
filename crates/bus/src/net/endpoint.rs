//! The iroh endpoint: binding it, accepting connections up to the TLS
//! handshake, dialing, and the frame-stream handshake on both sides.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use iroh::address_lookup::memory::MemoryLookup;
use iroh::endpoint::{
    Connection, Incoming, PortmapperConfig, QuicTransportConfig, VarInt, presets,
};
use iroh::{Endpoint, EndpointAddr, RelayMode};
use mesh_protocol::{MAX_TICKET_ADDRS, NodeId, SecretKey};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tracing::{debug, warn};

use super::conn::{self, Established};
use super::error::{error_chain, find_io_kind};
use super::{
    ALPN, DIAL_TIMEOUT, HANDSHAKE_TIMEOUT, NetConfig, NetError, PENDING_ACCEPTS_MAX, close_code,
};

/// Binds the endpoint: relays, address lookup (but for an in-memory table
/// of the peers' addresses) and the portmapper off, one bi stream per
/// connection.
pub(crate) async fn bind(
    config: &NetConfig,
    secret: SecretKey,
) -> Result<(Endpoint, MemoryLookup), NetError> {
    let addr = config.bind_addr;
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
    let endpoint = Endpoint::builder(presets::Minimal)
        .secret_key(secret)
        .relay_mode(RelayMode::Disabled)
        .clear_address_lookup()
        .portmapper_config(PortmapperConfig::Disabled)
        .clear_ip_transports()
        .bind_addr(addr)
        .map_err(|e| bind_err(e.to_string()))?
        .alpns(vec![ALPN.to_vec()])
        .transport_config(transport)
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
    Ok((endpoint, lookup))
}

/// The addresses to put in a ticket: the bound socket, or when bound to an
/// unspecified address (`0.0.0.0`), the interface addresses iroh reports.
pub(crate) fn local_addrs(endpoint: &Endpoint) -> Vec<SocketAddr> {
    let mut out: BTreeSet<SocketAddr> = BTreeSet::new();
    for sock in endpoint.bound_sockets() {
        if sock.ip().is_unspecified() {
            out.extend(
                endpoint
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

/// An incoming connection past its TLS handshake: its key is authenticated
/// but not yet checked against the known peers. It holds one of the
/// [`PENDING_ACCEPTS_MAX`] handshake slots until it is live or refused.
#[derive(Debug)]
pub(crate) struct Authenticated {
    pub(crate) connection: Connection,
    pub(crate) slot: OwnedSemaphorePermit,
}

/// Accepts incoming connections, at most [`PENDING_ACCEPTS_MAX`] in their
/// handshake at once (more are refused), and passes on those whose TLS
/// handshake completed. Runs until the endpoint closes.
pub(crate) async fn accept_loop(endpoint: Endpoint, inbound: mpsc::Sender<Authenticated>) {
    let slots = Arc::new(Semaphore::new(PENDING_ACCEPTS_MAX));
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    debug!("too many handshakes in progress; refusing a connection");
                    incoming.refuse();
                    continue;
                };
                let inbound = inbound.clone();
                handshakes.spawn(async move {
                    if let Some(connection) = tls_handshake(incoming).await {
                        // Fails only when the owner is gone (shutdown).
                        let _ = inbound.send(Authenticated { connection, slot }).await;
                    }
                });
            }
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
        }
    }
    handshakes.shutdown().await;
}

async fn tls_handshake(incoming: Incoming) -> Option<Connection> {
    match timeout(HANDSHAKE_TIMEOUT, incoming).await {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => {
            debug!(error = %e, "incoming connection failed");
            None
        }
        Err(_) => {
            debug!("incoming connection handshake timed out");
            None
        }
    }
}

/// The acceptor's frame-stream handshake on a connection from a known peer;
/// a connection that fails it is closed with its code.
pub(crate) async fn accept_stream(connection: Connection) -> Option<Established> {
    let peer = connection.remote_id();
    match timeout(HANDSHAKE_TIMEOUT, conn::accept_frame_stream(&connection)).await {
        Ok(Ok((send, recv, peer_instance))) => Some(Established {
            peer,
            connection,
            send,
            recv,
            dialed_here: false,
            peer_instance,
        }),
        Ok(Err(conn::HandshakeError::Version(why))) => {
            warn!(peer = %peer.fmt_short(), "refused a connection: {why}");
            conn::close(&connection, close_code::VERSION_MISMATCH, &why);
            None
        }
        Ok(Err(e)) => {
            debug!(peer = %peer.fmt_short(), error = %e, "incoming frame stream failed");
            conn::close(&connection, close_code::BAD_PREAMBLE, "bad preamble");
            None
        }
        Err(_) => {
            debug!(peer = %peer.fmt_short(), "incoming frame stream timed out");
            conn::close(
                &connection,
                close_code::HANDSHAKE_TIMEOUT,
                "handshake timed out",
            );
            None
        }
    }
}

/// Why a dial did not give a connection.
#[derive(Debug)]
pub(crate) enum DialError {
    /// The peer closed it during the handshake, with `code`.
    Refused { code: u64, reason: String },
    /// It failed otherwise.
    Other(String),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::Refused { code, reason } => {
                write!(f, "refused by the peer: {reason} (code {code})")
            }
            DialError::Other(e) => f.write_str(e),
        }
    }
}

/// Dials `peer` at `addrs` and opens the frame stream.
pub(crate) async fn dial(
    endpoint: Endpoint,
    peer: NodeId,
    addrs: Vec<SocketAddr>,
    instance: u64,
) -> Result<Established, DialError> {
    let mut addr = EndpointAddr::new(peer);
    for a in addrs {
        addr = addr.with_ip_addr(a);
    }
    let connection = match timeout(DIAL_TIMEOUT, endpoint.connect(addr, ALPN)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(DialError::Other(e.to_string())),
        Err(_) => {
            return Err(DialError::Other(format!(
                "no answer within {DIAL_TIMEOUT:?}"
            )));
        }
    };
    match timeout(
        HANDSHAKE_TIMEOUT,
        conn::open_frame_stream(&connection, instance),
    )
    .await
    {
        Ok(Ok((send, recv, peer_instance))) => Ok(Established {
            peer,
            connection,
            send,
            recv,
            dialed_here: true,
            peer_instance,
        }),
        Ok(Err(conn::HandshakeError::Version(why))) => {
            warn!(peer = %peer.fmt_short(), "closing a connection: {why}");
            conn::close(&connection, close_code::VERSION_MISMATCH, &why);
            Err(DialError::Other(why))
        }
        Ok(Err(conn::HandshakeError::Closed { code, reason })) => {
            Err(DialError::Refused { code, reason })
        }
        Ok(Err(e)) => Err(DialError::Other(e.to_string())),
        Err(_) => {
            conn::close(
                &connection,
                close_code::HANDSHAKE_TIMEOUT,
                "handshake timed out",
            );
            Err(DialError::Other(format!(
                "no preamble within {HANDSHAKE_TIMEOUT:?}"
            )))
        }
    }
}

/// A new instance stamp: microseconds since the Unix epoch (0 if the clock
/// is before it, which only makes this instance look old to peers).
pub(crate) fn instance_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
