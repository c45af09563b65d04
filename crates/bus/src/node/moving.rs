//! The agent move link ([`MOVE_ALPN`]): a node hands one agent export to a
//! peer and waits for its one answer.
//!
//! The bus carries the two messages as opaque bytes, each with a 4-byte
//! big-endian length header and at most [`MOVE_MESSAGE_BYTES_MAX`] bytes
//! (a longer header is refused before its body is read); what they mean is
//! the daemon's (it imports the export and makes the answer). On the side
//! that takes moves, the transport hands over only connections from known
//! peers whose link is not paused, refusing every other before reading
//! (`transport::links::move_admission`); the mover task here reads at most
//! [`MOVES_AT_ONCE_MAX`] at once, each within [`MOVE_READ_TIMEOUT`], hands
//! each to whoever took [`MoveOffers`] and writes the answer it gets within
//! [`MOVE_ANSWER_TIMEOUT`]. The offering side ([`offer`]) gives up after
//! [`MOVE_TIMEOUT`]. QUIC's TLS 1.3 to the peer's node key is what keeps
//! the export secret on the way: only the holder of that key reads it.

use std::time::Duration;

use iroh::endpoint::{Connection, ConnectionError, RecvStream};
use iroh::{Endpoint, RelayUrl};
use mesh_protocol::{FRAME_HEADER_BYTES, MOVE_ALPN, MOVE_MESSAGE_BYTES_MAX, NodeId};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tracing::{debug, info};

use super::link::{ReadError, capped_len, read_capped};
use crate::net::{close_code, close_connection as close};

/// The most agent moves this node takes at once; more are refused with
/// [`close_code::MOVE_BUSY`].
pub const MOVES_AT_ONCE_MAX: usize = 4;

/// How long the offering node waits, from its dial, for the answer.
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the taking node waits for the offer to be read.
pub const MOVE_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the taking node waits for its daemon's answer to an offer
/// (less than [`MOVE_TIMEOUT`], so the offering node hears why).
pub const MOVE_ANSWER_TIMEOUT: Duration = Duration::from_secs(25);

/// How long the taking node waits, after writing its answer, for the
/// offering node to read it and close.
const ANSWER_LINGER: Duration = Duration::from_secs(2);

/// One agent export a peer offered this node, to be answered once.
#[derive(Debug)]
pub struct MoveOffer {
    /// The peer that offered it (the connection's authenticated key).
    pub from: NodeId,
    /// The offer's bytes, at most [`MOVE_MESSAGE_BYTES_MAX`].
    pub body: Vec<u8>,
    reply: oneshot::Sender<Vec<u8>>,
}

impl MoveOffer {
    /// Sends `answer` (at most [`MOVE_MESSAGE_BYTES_MAX`] bytes; a longer
    /// one is not sent, and the offering node hears the connection close)
    /// to the peer that offered it.
    pub fn answer(self, answer: Vec<u8>) {
        let _ = self.reply.send(answer);
    }
}

/// The offers peers make to this node, for the one that imports them
/// ([`crate::Node::take_move_offers`]).
pub type MoveOffers = mpsc::Receiver<MoveOffer>;

/// Why an offer got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MoveError {
    /// The node is not a known peer of this one.
    #[error("node {0} is not a peer of this node; an agent moves only to a peer")]
    NotPeer(NodeId),
    /// The link to the peer is paused here.
    #[error("the link to node {0} is paused; resume it (`mesh peer resume`) first")]
    Paused(NodeId),
    /// The offer is over [`MOVE_MESSAGE_BYTES_MAX`].
    #[error("the offer is {0} bytes, more than the {MOVE_MESSAGE_BYTES_MAX} a move may be")]
    TooLarge(usize),
    /// The peer does not speak the move link (an older version).
    #[error(
        "node {node} does not take agent moves over the mesh (it does not offer {}): {why}",
        String::from_utf8_lossy(MOVE_ALPN)
    )]
    NotOffered {
        /// The peer.
        node: NodeId,
        /// What the dial said.
        why: String,
    },
    /// The peer closed the link without an answer, with this code.
    #[error("node {node} refused the move: {reason} (code {code})")]
    Refused {
        /// The peer.
        node: NodeId,
        /// Its close code ([`close_code`]).
        code: u64,
        /// Its reason.
        reason: String,
    },
    /// The peer could not be reached, or no answer came in time.
    #[error("no answer from node {node}: {why}")]
    Unreachable {
        /// The peer.
        node: NodeId,
        /// What happened.
        why: String,
    },
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
}

/// The length a move message header announces, if it is within
/// [`MOVE_MESSAGE_BYTES_MAX`] (checked before the body is read).
pub fn move_message_len(header: [u8; FRAME_HEADER_BYTES]) -> Option<usize> {
    capped_len(header, MOVE_MESSAGE_BYTES_MAX)
}

/// `body` with its length header.
fn framed(body: &[u8]) -> Option<Vec<u8>> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| *l as usize <= MOVE_MESSAGE_BYTES_MAX)?;
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
    Some(out)
}

/// Reads one move message, refusing one over the cap before its body.
async fn read_message(recv: &mut RecvStream) -> Result<Vec<u8>, ReadError> {
    read_capped(recv, MOVE_MESSAGE_BYTES_MAX).await
}

/// The offering side: dials `to` (at `addrs`, and through `relays`) on
/// [`MOVE_ALPN`], sends `body` and returns the peer's answer, all within
/// [`MOVE_TIMEOUT`]. The caller has checked that `to` is a known peer.
///
/// # Errors
/// [`MoveError::TooLarge`] before dialing; [`MoveError::NotOffered`],
/// [`MoveError::Refused`] or [`MoveError::Unreachable`] after.
pub(super) async fn offer(
    endpoint: &Endpoint,
    to: NodeId,
    addrs: &[std::net::SocketAddr],
    relays: &[RelayUrl],
    body: &[u8],
) -> Result<Vec<u8>, MoveError> {
    let out = framed(body).ok_or(MoveError::TooLarge(body.len()))?;
    let addr = crate::net::endpoint_addr(to, addrs.iter().copied(), relays.iter().cloned());
    let unreachable = |why: String| MoveError::Unreachable { node: to, why };
    let exchange = async {
        let connection = endpoint.connect(addr, MOVE_ALPN).await.map_err(|e| {
            let why = crate::net::error_chain(&e);
            // The TLS handshake names the missing protocol (error 120).
            if why.contains("no application protocol") || why.contains("known protocol") {
                MoveError::NotOffered { node: to, why }
            } else {
                unreachable(why)
            }
        })?;
        let answer = async {
            let (mut send, mut recv) = connection.open_bi().await.map_err(|e| lost(to, &e))?;
            send.write_all(&out).await.map_err(|e| match e {
                iroh::endpoint::WriteError::ConnectionLost(c) => lost(to, &c),
                other => unreachable(other.to_string()),
            })?;
            let _ = send.finish();
            match read_message(&mut recv).await {
                Ok(body) => Ok(body),
                Err(ReadError::TooLarge(n)) => Err(unreachable(format!(
                    "its answer announces {n} bytes, more than {MOVE_MESSAGE_BYTES_MAX}"
                ))),
                Err(ReadError::Stream(why)) => match connection.close_reason() {
                    Some(c) => Err(lost(to, &c)),
                    None => Err(unreachable(why)),
                },
            }
        }
        .await;
        close(&connection, close_code::SHUTDOWN, "move done");
        answer
    };
    match timeout(MOVE_TIMEOUT, exchange).await {
        Ok(r) => r,
        Err(_) => Err(unreachable(format!("none within {MOVE_TIMEOUT:?}"))),
    }
}

/// The error for a connection to `node` that ended: the peer's refusal if
/// it closed it with a code, else unreachable.
fn lost(node: NodeId, e: &ConnectionError) -> MoveError {
    match e {
        ConnectionError::ApplicationClosed(c) => MoveError::Refused {
            node,
            code: c.error_code.into_inner(),
            reason: String::from_utf8_lossy(&c.reason).into_owned(),
        },
        other => MoveError::Unreachable {
            node,
            why: other.to_string(),
        },
    }
}

/// The taking side: the task that reads offers off the connections the
/// transport hands over and answers them (see the module doc).
pub(super) struct Mover {
    pub(super) conns: mpsc::Receiver<Connection>,
    pub(super) offers: mpsc::Sender<MoveOffer>,
    pub(super) closing: watch::Receiver<bool>,
}

/// A channel's two ends.
type Channel<T> = (mpsc::Sender<T>, mpsc::Receiver<T>);

/// The channels: connections from the transport, offers to their taker.
pub(super) fn channels() -> (Channel<Connection>, Channel<MoveOffer>) {
    (
        mpsc::channel(MOVES_AT_ONCE_MAX),
        mpsc::channel(MOVES_AT_ONCE_MAX),
    )
}

impl Mover {
    pub(super) async fn run(mut self) {
        let mut exchanges: JoinSet<()> = JoinSet::new();
        loop {
            tokio::select! {
                _ = self.closing.wait_for(|c| *c) => break,
                Some(connection) = self.conns.recv() => {
                    if exchanges.len() >= MOVES_AT_ONCE_MAX {
                        close(&connection, close_code::MOVE_BUSY, "too many agent moves at once; try again");
                        continue;
                    }
                    exchanges.spawn(exchange(connection, self.offers.clone()));
                }
                Some(_) = exchanges.join_next(), if !exchanges.is_empty() => {}
                else => break,
            }
        }
        exchanges.shutdown().await;
    }
}

/// One offer: read, handed over, answered.
async fn exchange(connection: Connection, offers: mpsc::Sender<MoveOffer>) {
    let from = connection.remote_id();
    let read = async {
        let (send, mut recv) = connection
            .accept_bi()
            .await
            .map_err(|e| (close_code::SHUTDOWN, e.to_string()))?;
        let body = read_message(&mut recv).await.map_err(|e| match e {
            ReadError::TooLarge(n) => (
                close_code::FRAME_TOO_LARGE,
                format!("an offer of {n} bytes, more than {MOVE_MESSAGE_BYTES_MAX}"),
            ),
            ReadError::Stream(why) => (close_code::BAD_FRAME, why),
        })?;
        Ok::<_, (u32, String)>((send, body))
    };
    let (mut send, body) = match timeout(MOVE_READ_TIMEOUT, read).await {
        Ok(Ok(read)) => read,
        Ok(Err((code, why))) => {
            debug!(peer = %from.fmt_short(), %why, "agent move offer refused");
            close(&connection, code, &why);
            return;
        }
        Err(_) => {
            close(
                &connection,
                close_code::HANDSHAKE_TIMEOUT,
                "the offer did not come in time",
            );
            return;
        }
    };
    let (reply, answer) = oneshot::channel();
    let offer = MoveOffer { from, body, reply };
    let answered = async {
        offers.send(offer).await.ok()?;
        answer.await.ok()
    };
    let Ok(Some(answer)) = timeout(MOVE_ANSWER_TIMEOUT, answered).await else {
        close(
            &connection,
            close_code::MOVE_BUSY,
            "no answer to the move in time; try again",
        );
        return;
    };
    let Some(out) = framed(&answer) else {
        close(&connection, close_code::SHUTDOWN, "the answer is too large");
        return;
    };
    if send.write_all(&out).await.is_ok() {
        let _ = send.finish();
        let _ = timeout(ANSWER_LINGER, connection.closed()).await;
    }
    info!(peer = %from.fmt_short(), "agent move answered");
    close(&connection, close_code::SHUTDOWN, "move answered");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_message_over_the_cap_is_refused_from_its_header() {
        let at = |n: u32| move_message_len(n.to_be_bytes());
        assert_eq!(at(0), Some(0));
        assert_eq!(
            at(MOVE_MESSAGE_BYTES_MAX as u32),
            Some(MOVE_MESSAGE_BYTES_MAX)
        );
        assert_eq!(at(MOVE_MESSAGE_BYTES_MAX as u32 + 1), None);
        assert_eq!(at(u32::MAX), None);
        assert!(framed(&vec![0; MOVE_MESSAGE_BYTES_MAX]).is_some());
        assert!(framed(&vec![0; MOVE_MESSAGE_BYTES_MAX + 1]).is_none());
        let out = framed(b"abc").expect("under the cap");
        assert_eq!(&out[..4], &3u32.to_be_bytes());
    }
}
