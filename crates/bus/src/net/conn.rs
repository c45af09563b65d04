//! One live connection: a reader task that decodes (and opens) the peer's
//! frames and a writer task that drains the connection's send queue.

use std::sync::Arc;

use iroh::endpoint::{
    Connection, ConnectionError, ReadError, ReadExactError, RecvStream, SendStream, VarInt,
    WriteError,
};
use mesh_protocol::{
    FRAME_HEADER_BYTES, Frame, FrameError, NodeId, PROTOCOL_VERSION, decode_frame, frame_body_len,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tracing::warn;

use super::counters::Counters;
use super::queue::SendQueue;
use super::{
    DisconnectReason, INSTANCE_BYTES, PREAMBLE, PREAMBLE_MAGIC, READ_BUFFER_BYTES, close_code,
};
use crate::core::ConnId;

/// A connection whose frame stream is open and whose preamble was read.
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) peer: NodeId,
    pub(crate) connection: Connection,
    pub(crate) send: SendStream,
    pub(crate) recv: RecvStream,
    /// Whether this node dialed it (and so has read the acceptor's preamble).
    pub(crate) dialed_here: bool,
    /// The peer's instance, from its preamble.
    pub(crate) peer_instance: u64,
}

/// A received frame's hold on [`super::RECEIVED_BYTES_MAX`]; dropping it (or
/// the event carrying it) lets the readers take in that many more bytes.
#[derive(Debug)]
pub struct RecvLease {
    _permit: OwnedSemaphorePermit,
}

/// What a connection's reader hands the transport's owner, in order: its
/// frames, then once how it ended.
#[derive(Debug)]
pub(crate) struct ConnEvent<T> {
    pub(crate) peer: NodeId,
    pub(crate) conn: ConnId,
    pub(crate) what: ConnWhat<T>,
}

#[derive(Debug)]
pub(crate) enum ConnWhat<T> {
    /// A frame, as the transport's `open` function made it.
    Frame(T, RecvLease),
    /// Nothing more comes on this connection.
    Ended(DisconnectReason),
}

/// Our preamble: [`PREAMBLE`] then `instance`, big-endian.
pub(crate) fn preamble(instance: u64) -> [u8; PREAMBLE.len() + INSTANCE_BYTES] {
    let mut out = [0u8; PREAMBLE.len() + INSTANCE_BYTES];
    out[..PREAMBLE.len()].copy_from_slice(&PREAMBLE);
    out[PREAMBLE.len()..].copy_from_slice(&instance.to_be_bytes());
    out
}

/// Closes `connection` with `code` and `reason`.
pub(crate) fn close(connection: &Connection, code: u32, reason: &str) {
    connection.close(VarInt::from_u32(code), reason.as_bytes());
}

/// Why the preamble exchange failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The peer's preamble names another protocol version.
    Version(u32),
    /// The peer closed the connection (or it failed) before its preamble.
    Closed(DisconnectReason),
    /// The peer wrote something that is no preamble.
    Bad(String),
}

impl HandshakeError {
    /// The peer's close code and reason, if the peer closed the connection.
    pub(crate) fn closed_by_peer(&self) -> Option<(u64, String)> {
        match self {
            HandshakeError::Closed(DisconnectReason::ClosedByPeer { code, reason }) => {
                Some((*code, reason.clone()))
            }
            _ => None,
        }
    }

    /// The refusal to show for this peer, if it is one of protocol versions:
    /// ours of its preamble, its of ours (a peer of this protocol or newer
    /// closes with [`close_code::VERSION_MISMATCH`], an older one reads
    /// `amesh/6` as a bad preamble).
    pub(crate) fn refusal(&self) -> Option<String> {
        match self {
            HandshakeError::Version(theirs) => Some(version_refusal(*theirs)),
            HandshakeError::Closed(DisconnectReason::ClosedByPeer { code, reason })
                if *code == u64::from(close_code::VERSION_MISMATCH) =>
            {
                Some(format!("the peer refused this node's protocol: {reason}"))
            }
            HandshakeError::Closed(DisconnectReason::ClosedByPeer { code, .. })
                if *code == u64::from(close_code::BAD_PREAMBLE) =>
            {
                Some(format!(
                    "the peer refused this node's preamble (agent-mesh protocol {PROTOCOL_VERSION}): \
                     it probably runs an older agent-mesh; upgrade it"
                ))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Version(theirs) => f.write_str(&version_refusal(*theirs)),
            HandshakeError::Closed(reason) => write!(f, "{reason}"),
            HandshakeError::Bad(why) => f.write_str(why),
        }
    }
}

/// The reason sent with [`close_code::VERSION_MISMATCH`] to a peer whose
/// preamble names protocol `theirs`.
pub(crate) fn version_refusal(theirs: u32) -> String {
    format!(
        "peer speaks agent-mesh protocol {theirs}, this node speaks {PROTOCOL_VERSION}; upgrade the older node"
    )
}

/// Reads the peer's preamble from `recv` and returns its instance.
async fn read_preamble(recv: &mut RecvStream) -> Result<u64, HandshakeError> {
    let mut got = [0u8; PREAMBLE.len() + INSTANCE_BYTES];
    recv.read_exact(&mut got).await.map_err(|e| match e {
        ReadExactError::FinishedEarly(n) => {
            HandshakeError::Bad(format!("stream ended after {n} preamble bytes"))
        }
        ReadExactError::ReadError(e) => HandshakeError::Closed(read_error(e)),
    })?;
    let (magic, instance) = got.split_at(PREAMBLE.len());
    if magic != PREAMBLE {
        return Err(match preamble_version(magic) {
            Some(theirs) => HandshakeError::Version(theirs),
            None => HandshakeError::Bad(format!("bad preamble {magic:02x?}")),
        });
    }
    let mut be = [0u8; INSTANCE_BYTES];
    be.copy_from_slice(instance);
    Ok(u64::from_be_bytes(be))
}

/// The version a well-formed preamble of any version names (`amesh/N\n`).
fn preamble_version(magic: &[u8]) -> Option<u32> {
    let rest = magic.strip_prefix(PREAMBLE_MAGIC.as_slice())?;
    match rest {
        [d, b'\n'] if d.is_ascii_digit() => Some(u32::from(d - b'0')),
        _ => None,
    }
}

/// Dialer side of the handshake: opens the frame stream, writes the preamble
/// (which makes the stream visible to the peer) and waits for the peer's.
/// Returns the streams and the acceptor's instance.
pub(crate) async fn open_frame_stream(
    connection: &Connection,
    instance: u64,
) -> Result<(SendStream, RecvStream, u64), HandshakeError> {
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|e| HandshakeError::Closed(conn_error(e)))?;
    send.write_all(&preamble(instance))
        .await
        .map_err(|e| HandshakeError::Closed(write_error(e)))?;
    let theirs = read_preamble(&mut recv).await?;
    Ok((send, recv, theirs))
}

/// Acceptor side of the handshake: accepts the frame stream and reads the
/// dialer's preamble. Our preamble is written once the connection is live.
/// Returns the streams and the dialer's instance.
pub(crate) async fn accept_frame_stream(
    connection: &Connection,
) -> Result<(SendStream, RecvStream, u64), HandshakeError> {
    let (send, mut recv) = connection
        .accept_bi()
        .await
        .map_err(|e| HandshakeError::Closed(conn_error(e)))?;
    let theirs = read_preamble(&mut recv).await?;
    Ok((send, recv, theirs))
}

/// The reader task of one live connection.
pub(crate) struct Reader<T> {
    pub(crate) peer: NodeId,
    pub(crate) conn: ConnId,
    pub(crate) connection: Connection,
    pub(crate) recv: RecvStream,
    /// Turns each decoded frame into what the owner takes (the node opens
    /// batches here, so their signatures are checked in parallel).
    pub(crate) open: fn(Frame) -> T,
    pub(crate) events: mpsc::Sender<ConnEvent<T>>,
    pub(crate) budget: Arc<Semaphore>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) queue: Arc<SendQueue>,
    /// Why the writer failed, if it does.
    pub(crate) writer_failed: oneshot::Receiver<DisconnectReason>,
}

impl<T: Send + 'static> Reader<T> {
    /// Reads until the stream or the connection ends, the peer sends a bad
    /// frame or the writer fails; then stops the writer, closes the
    /// connection if it is still open and reports how it ended.
    pub(crate) async fn run(self) {
        let Reader {
            peer,
            conn,
            connection,
            mut recv,
            open,
            events,
            budget,
            counters,
            queue,
            mut writer_failed,
        } = self;
        let frames = Frames {
            peer,
            conn,
            connection: &connection,
            open,
            events: &events,
            budget: &budget,
            counters: &counters,
        };
        let reason = tokio::select! {
            r = frames.read_all(&mut recv) => r,
            Ok(r) = &mut writer_failed => r,
        };
        queue.close();
        if connection.close_reason().is_none() {
            // The stream ended but the connection did not: it is of no more use.
            close(&connection, close_code::SHUTDOWN, "frame stream ended");
        }
        let ended = ConnEvent {
            peer,
            conn,
            what: ConnWhat::Ended(reason),
        };
        // A closed channel means the owner is gone: nobody wants to know.
        let _ = events.send(ended).await;
    }
}

/// What the read loop needs, borrowed from the reader.
struct Frames<'a, T> {
    peer: NodeId,
    conn: ConnId,
    connection: &'a Connection,
    open: fn(Frame) -> T,
    events: &'a mpsc::Sender<ConnEvent<T>>,
    budget: &'a Arc<Semaphore>,
    counters: &'a Counters,
}

impl<T> Frames<'_, T> {
    /// Reads frames until the stream or the connection ends, or the peer
    /// sends a bad frame (then closes the connection with a code).
    async fn read_all(&self, recv: &mut RecvStream) -> DisconnectReason {
        // Invariant: buf[start..end] holds received bytes not yet decoded, and
        // end < buf.len() before every read.
        let mut buf = vec![0u8; READ_BUFFER_BYTES];
        let (mut start, mut end) = (0usize, 0usize);
        loop {
            // Decode every whole frame in the buffer.
            while end - start >= FRAME_HEADER_BYTES {
                let mut header = [0u8; FRAME_HEADER_BYTES];
                header.copy_from_slice(&buf[start..start + FRAME_HEADER_BYTES]);
                // The length is checked before anything is allocated for the body.
                let len = match frame_body_len(header) {
                    Ok(len) => len,
                    Err(e) => return self.bad_frame(close_code::FRAME_TOO_LARGE, e),
                };
                let whole = FRAME_HEADER_BYTES + len;
                if end - start < whole {
                    if buf.len() < whole {
                        // Make room for this one frame (at most MAX_FRAME_BYTES + 4).
                        buf.copy_within(start..end, 0);
                        end -= start;
                        start = 0;
                        buf.resize(whole, 0);
                    }
                    break;
                }
                let body = &buf[start + FRAME_HEADER_BYTES..start + whole];
                if let Err(reason) = self.deliver(whole, body).await {
                    return reason;
                }
                start += whole;
            }
            if start == end {
                start = 0;
                end = 0;
                if buf.len() > READ_BUFFER_BYTES {
                    // A large frame grew the buffer; don't keep it for idle peers.
                    buf.truncate(READ_BUFFER_BYTES);
                    buf.shrink_to_fit();
                }
            } else if start > 0 {
                // Keep the partial frame at the front so the free tail is largest.
                buf.copy_within(start..end, 0);
                end -= start;
                start = 0;
            }
            match recv.read(&mut buf[end..]).await {
                Ok(Some(n)) => {
                    end += n;
                    Counters::add(&self.counters.bytes_in, n as u64);
                }
                Ok(None) => return DisconnectReason::StreamEnded,
                Err(e) => return read_error(e),
            }
        }
    }

    /// Takes `whole` bytes of the receive budget, decodes and opens `body`
    /// and hands it to the owner.
    async fn deliver(&self, whole: usize, body: &[u8]) -> Result<(), DisconnectReason> {
        // Whole frames are at most MAX_FRAME_BYTES + 4, far below both
        // u32::MAX and the budget, so this always fits and never waits forever.
        let cost = u32::try_from(whole).unwrap_or(u32::MAX);
        let Ok(permit) = self.budget.clone().acquire_many_owned(cost).await else {
            // The semaphore is never closed; treat it as a shutdown anyway.
            return Err(DisconnectReason::ClosedLocally {
                code: close_code::SHUTDOWN,
                reason: "shutdown".to_owned(),
            });
        };
        let frame = match decode_frame(body) {
            Ok(frame) => frame,
            Err(e) => return Err(self.bad_frame(close_code::BAD_FRAME, e)),
        };
        Counters::add(&self.counters.frames_in, 1);
        let item = (self.open)(frame);
        let event = ConnEvent {
            peer: self.peer,
            conn: self.conn,
            what: ConnWhat::Frame(item, RecvLease { _permit: permit }),
        };
        if self.events.send(event).await.is_err() {
            // Nobody listens any more: the transport is going away.
            close(self.connection, close_code::SHUTDOWN, "shutdown");
            return Err(DisconnectReason::ClosedLocally {
                code: close_code::SHUTDOWN,
                reason: "the transport's owner is gone".to_owned(),
            });
        }
        Ok(())
    }

    fn bad_frame(&self, code: u32, e: FrameError) -> DisconnectReason {
        Counters::add(&self.counters.bad_frames, 1);
        warn!(error = %e, "peer sent a bad frame; closing the connection");
        let reason = match code {
            close_code::FRAME_TOO_LARGE => "frame too large",
            _ => "bad frame",
        };
        close(self.connection, code, reason);
        DisconnectReason::BadFrame(e)
    }
}

/// The writer task of one live connection: writes our preamble (the
/// acceptor's, which tells the dialer its connection was taken), then
/// whatever is queued, each time all of it in one write. Ends when the queue
/// closes, or tells the reader why writing failed.
pub(crate) async fn write_task(
    mut send: SendStream,
    queue: Arc<SendQueue>,
    preamble: Option<[u8; PREAMBLE.len() + INSTANCE_BYTES]>,
    counters: Arc<Counters>,
    failed: oneshot::Sender<DisconnectReason>,
) {
    if let Some(ours) = preamble {
        if let Err(e) = send.write_all(&ours).await {
            let _ = failed.send(write_error(e));
            return;
        }
        Counters::add(&counters.bytes_out, ours.len() as u64);
    }
    let mut out = Vec::new();
    loop {
        out.clear();
        let Some(frames) = queue.take(&mut out).await else {
            // Closed by the reader or the owner, which close the connection
            // too: the reader reports how it ended.
            return;
        };
        if let Err(e) = send.write_all(&out).await {
            // The reader may have ended already; then nobody needs to know.
            let _ = failed.send(write_error(e));
            return;
        }
        Counters::add(&counters.frames_out, frames);
        Counters::add(&counters.bytes_out, out.len() as u64);
    }
}

/// Why a connection ended, from the connection's own error.
pub(crate) fn conn_error(e: ConnectionError) -> DisconnectReason {
    match e {
        ConnectionError::ApplicationClosed(close) => DisconnectReason::ClosedByPeer {
            code: close.error_code.into_inner(),
            reason: String::from_utf8_lossy(&close.reason).into_owned(),
        },
        ConnectionError::TimedOut => DisconnectReason::TimedOut,
        ConnectionError::LocallyClosed => DisconnectReason::ClosedLocally {
            code: close_code::SHUTDOWN,
            reason: "closed".to_owned(),
        },
        other => DisconnectReason::Transport(other.to_string()),
    }
}

fn read_error(e: ReadError) -> DisconnectReason {
    match e {
        ReadError::ConnectionLost(e) => conn_error(e),
        ReadError::Reset(_) => DisconnectReason::StreamEnded,
        other => DisconnectReason::Transport(other.to_string()),
    }
}

fn write_error(e: WriteError) -> DisconnectReason {
    match e {
        WriteError::ConnectionLost(e) => conn_error(e),
        WriteError::Stopped(_) => DisconnectReason::StreamEnded,
        other => DisconnectReason::Transport(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preamble_of_another_version_is_told_from_a_bad_one() {
        assert_eq!(preamble_version(b"amesh/1\n"), Some(1));
        assert_eq!(preamble_version(b"amesh/9\n"), Some(9));
        assert_eq!(preamble_version(&PREAMBLE), Some(PROTOCOL_VERSION));
        assert_eq!(preamble_version(b"amesh/x\n"), None);
        assert_eq!(preamble_version(b"GET / HT"), None);
        let why = version_refusal(1);
        assert!(why.contains("protocol 1") && why.contains(&format!("speaks {PROTOCOL_VERSION}")));
        // The previous version, before read receipts, names both.
        let why = version_refusal(5);
        assert!(
            why.contains("protocol 5") && why.contains("speaks 6"),
            "{why}"
        );
    }
}
