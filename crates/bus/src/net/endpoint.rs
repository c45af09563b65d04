//! The iroh endpoint: binding it, accepting connections up to the TLS
//! handshake, dialing, and the frame-stream handshake on both sides.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use iroh::address_lookup::memory::MemoryLookup;
use iroh::endpoint::{
    Connection, Incoming, PortmapperConfig, QuicTransportConfig, VarInt, presets,
};
use iroh::{Endpoint, EndpointAddr, RelayMode, RelayUrl};
use mesh_protocol::{MAX_TICKET_ADDRS, NodeId, SecretKey};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tracing::{debug, warn};

use super::conn::{self, Established, HandshakeError};
use super::error::{error_chain, find_io_kind};
use super::{
    ALPN, DIAL_TIMEOUT, HANDSHAKE_TIMEOUT, NetConfig, NetError, PENDING_ACCEPTS_MAX, RELAYS_MAX,
    close_code,
};

/// Binds the endpoint (see [`bind_at`]). With port 0 in `config.bind_addr`
/// and a `config.preferred_port`, that port is asked for first; if it is
/// taken, a new one is picked and both are logged.
pub(crate) async fn bind(
    config: &NetConfig,
    secret: SecretKey,
) -> Result<(Endpoint, MemoryLookup), NetError> {
    let addr = config.bind_addr;
    if config.relays.len() > RELAYS_MAX {
        return Err(NetError::Bind {
            addr,
            why: format!(
                "{} relays configured, at most {RELAYS_MAX} allowed",
                config.relays.len()
            ),
        });
    }
    if let Some(port) = config
        .preferred_port
        .filter(|p| addr.port() == 0 && *p != 0)
    {
        let preferred = SocketAddr::new(addr.ip(), port);
        match bind_at(config, preferred, secret.clone()).await {
            Err(NetError::AddrInUse { .. }) => {
                let bound = bind_at(config, addr, secret).await?;
                let now = local_port(&bound.0);
                warn!(
                    wanted = port,
                    got = now,
                    "the port this node listened on before ({port}) is taken; listening on {now} instead, peers learn it from its next Hello"
                );
                return Ok(bound);
            }
            other => return other,
        }
    }
    bind_at(config, addr, secret).await
}

/// The port the endpoint is bound to (0 if it reports none).
pub(crate) fn local_port(endpoint: &Endpoint) -> u16 {
    endpoint.bound_sockets().first().map_or(0, SocketAddr::port)
}

/// Binds the endpoint at `addr`: relays (but for the configured ones),
/// address lookup (but for an in-memory table of the peers' addresses) and
/// the portmapper off, one bi stream per connection.
async fn bind_at(
    config: &NetConfig,
    addr: SocketAddr,
    secret: SecretKey,
) -> Result<(Endpoint, MemoryLookup), NetError> {
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
        .relay_mode(if config.relays.is_empty() {
            RelayMode::Disabled
        } else {
            RelayMode::custom(config.relays.iter().cloned())
        })
        .clear_address_lookup()
        .portmapper_config(PortmapperConfig::Disabled)
        .clear_ip_transports()
        .bind_addr(addr)
        .map_err(|e| bind_err(e.to_string()))?
        .alpns(vec![
            ALPN.to_vec(),
            mesh_protocol::JOIN_ALPN.to_vec(),
            mesh_protocol::MOVE_ALPN.to_vec(),
        ])
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

/// A handshake that did not give a live connection, and the protocol
/// refusal to record for the peer, if it was one.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) peer: NodeId,
    pub(crate) refusal: Option<String>,
    /// The peer's close code and reason, if the peer closed the connection.
    pub(crate) closed: Option<(u64, String)>,
    pub(crate) why: String,
}

/// Closes `connection` as the handshake error `e` asks: another version's
/// preamble with [`close_code::VERSION_MISMATCH`] and a reason naming both
/// versions, a bad one with [`close_code::BAD_PREAMBLE`].
fn close_for(connection: &Connection, e: &HandshakeError) {
    match e {
        HandshakeError::Version(theirs) => conn::close(
            connection,
            close_code::VERSION_MISMATCH,
            &conn::version_refusal(*theirs),
        ),
        HandshakeError::Bad(_) => conn::close(connection, close_code::BAD_PREAMBLE, "bad preamble"),
        HandshakeError::Closed(_) => {}
    }
}

/// Closes `connection` as the handshake error `e` asks (see [`close_for`])
/// and says how the handshake with `peer` failed.
fn handshake_failed(connection: &Connection, peer: NodeId, e: &HandshakeError) -> Failed {
    close_for(connection, e);
    Failed {
        peer,
        refusal: e.refusal(),
        closed: e.closed_by_peer(),
        why: e.to_string(),
    }
}

/// The acceptor's frame-stream handshake on a connection from a known peer;
/// a connection that fails it is closed with its code.
pub(crate) async fn accept_stream(connection: Connection) -> Result<Established, Failed> {
    let peer = connection.remote_id();
    match timeout(HANDSHAKE_TIMEOUT, conn::accept_frame_stream(&connection)).await {
        Ok(Ok((send, recv, peer_instance))) => Ok(Established {
            peer,
            connection,
            send,
            recv,
            dialed_here: false,
            peer_instance,
        }),
        Ok(Err(e)) => {
            debug!(peer = %peer.fmt_short(), error = %e, "incoming frame stream failed");
            Err(handshake_failed(&connection, peer, &e))
        }
        Err(_) => {
            debug!(peer = %peer.fmt_short(), "incoming frame stream timed out");
            conn::close(
                &connection,
                close_code::HANDSHAKE_TIMEOUT,
                "handshake timed out",
            );
            Err(Failed {
                peer,
                refusal: None,
                closed: None,
                why: "handshake timed out".into(),
            })
        }
    }
}

/// Dials `peer` at `addrs` (and through `relays`, if any) and opens the
/// frame stream.
pub(crate) async fn dial(
    endpoint: Endpoint,
    peer: NodeId,
    addrs: Vec<SocketAddr>,
    relays: Vec<RelayUrl>,
    instance: u64,
) -> Result<Established, Failed> {
    let failed = |why: String| Failed {
        peer,
        refusal: None,
        closed: None,
        why,
    };
    let addr = endpoint_addr(peer, addrs, relays);
    let connection = match timeout(DIAL_TIMEOUT, endpoint.connect(addr, ALPN)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Err(_) => return Err(failed(format!("no answer within {DIAL_TIMEOUT:?}"))),
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
        Ok(Err(e)) => Err(handshake_failed(&connection, peer, &e)),
        Err(_) => {
            conn::close(
                &connection,
                close_code::HANDSHAKE_TIMEOUT,
                "handshake timed out",
            );
            Err(failed(format!("no preamble within {HANDSHAKE_TIMEOUT:?}")))
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

/// Where to dial `node`: at each of `addrs`, and through each of `relays`.
pub(crate) fn endpoint_addr(
    node: NodeId,
    addrs: impl IntoIterator<Item = SocketAddr>,
    relays: impl IntoIterator<Item = RelayUrl>,
) -> EndpointAddr {
    let addr = addrs
        .into_iter()
        .fold(EndpointAddr::new(node), |addr, a| addr.with_ip_addr(a));
    relays
        .into_iter()
        .fold(addr, |addr, r| addr.with_relay_url(r))
}
