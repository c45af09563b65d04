//! One live connection: the handshake on its frame stream, then a reader and
//! a writer until it ends.

use std::sync::Arc;

use iroh::endpoint::{
    Connection, ConnectionError, ReadError, ReadExactError, RecvStream, SendStream, VarInt,
    WriteError,
};
use mesh_protocol::{FRAME_HEADER_BYTES, FrameError, NodeId, decode_frame, frame_body_len};
use tokio::sync::mpsc;
use tracing::warn;

use super::outbox::Outbox;
use super::{
    ConnId, Counters, DisconnectReason, INSTANCE_BYTES, NetEvent, PREAMBLE, READ_BUFFER_BYTES,
    RecvLease, Shared, close_code,
};

/// A connection whose frame stream is open and whose preamble was read.
#[derive(Debug)]
pub(super) struct Established {
    pub(super) peer: NodeId,
    pub(super) connection: Connection,
    pub(super) send: SendStream,
    pub(super) recv: RecvStream,
    /// Whether this node dialed it (and so has read the acceptor's preamble).
    pub(super) dialed_here: bool,
    /// The peer's instance, from its preamble.
    pub(super) peer_instance: u64,
}

/// Our preamble: [`PREAMBLE`] then `instance`, big-endian.
pub(super) fn preamble(instance: u64) -> [u8; PREAMBLE.len() + INSTANCE_BYTES] {
    let mut out = [0u8; PREAMBLE.len() + INSTANCE_BYTES];
    out[..PREAMBLE.len()].copy_from_slice(&PREAMBLE);
    out[PREAMBLE.len()..].copy_from_slice(&instance.to_be_bytes());
    out
}

/// Closes `connection` with `code` and `reason`.
pub(super) fn close(connection: &Connection, code: u32, reason: &str) {
    connection.close(VarInt::from_u32(code), reason.as_bytes());
}

/// Reads the peer's preamble from `recv` and returns its instance.
pub(super) async fn read_preamble(recv: &mut RecvStream) -> Result<u64, String> {
    let mut got = [0u8; PREAMBLE.len() + INSTANCE_BYTES];
    recv.read_exact(&mut got).await.map_err(|e| match e {
        ReadExactError::FinishedEarly(n) => format!("stream ended after {n} preamble bytes"),
        ReadExactError::ReadError(e) => read_error(e).to_string(),
    })?;
    let (magic, instance) = got.split_at(PREAMBLE.len());
    if magic != PREAMBLE {
        return Err(format!("bad preamble {magic:02x?}"));
    }
    let mut be = [0u8; INSTANCE_BYTES];
    be.copy_from_slice(instance);
    Ok(u64::from_be_bytes(be))
}

/// Dialer side of the handshake: opens the frame stream, writes the preamble
/// (which makes the stream visible to the peer) and waits for the peer's.
/// Returns the streams and the acceptor's instance.
pub(super) async fn open_frame_stream(
    connection: &Connection,
    instance: u64,
) -> Result<(SendStream, RecvStream, u64), String> {
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|e| conn_error(e).to_string())?;
    send.write_all(&preamble(instance))
        .await
        .map_err(|e| write_error(e).to_string())?;
    let theirs = read_preamble(&mut recv).await?;
    Ok((send, recv, theirs))
}

/// Acceptor side of the handshake: accepts the frame stream and reads the
/// dialer's preamble. Our preamble is written once the connection is live.
/// Returns the streams and the dialer's instance.
pub(super) async fn accept_frame_stream(
    connection: &Connection,
) -> Result<(SendStream, RecvStream, u64), String> {
    let (send, mut recv) = connection
        .accept_bi()
        .await
        .map_err(|e| conn_error(e).to_string())?;
    let theirs = read_preamble(&mut recv).await?;
    Ok((send, recv, theirs))
}

/// Runs a live connection until it ends and returns why. Frames go to
/// `events` in order; the acceptor writes its preamble first.
pub(super) async fn run(
    est: Established,
    conn: ConnId,
    outbox: Arc<Outbox>,
    events: mpsc::Sender<NetEvent>,
    shared: Arc<Shared>,
) -> DisconnectReason {
    let Established {
        peer,
        connection,
        mut send,
        mut recv,
        dialed_here,
        peer_instance: _,
    } = est;
    let reason = tokio::select! {
        r = read_loop(peer, conn, &connection, &mut recv, &events, &shared) => r,
        r = write_loop(&mut send, &outbox, !dialed_here, &shared) => r,
    };
    outbox.close();
    if connection.close_reason().is_none() {
        // The stream ended but the connection did not: it is of no more use.
        close(&connection, close_code::SHUTDOWN, "frame stream ended");
    }
    reason
}

/// Reads frames until the stream or the connection ends, or the peer sends a
/// bad frame (then closes the connection with a code).
async fn read_loop(
    peer: NodeId,
    conn: ConnId,
    connection: &Connection,
    recv: &mut RecvStream,
    events: &mpsc::Sender<NetEvent>,
    shared: &Shared,
) -> DisconnectReason {
    let counters = &shared.counters;
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
                Err(e) => {
                    return bad_frame(peer, connection, shared, close_code::FRAME_TOO_LARGE, e);
                }
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
            // Whole frames are at most MAX_FRAME_BYTES + 4, far below both
            // u32::MAX and the budget, so this always fits and never waits forever.
            let cost = u32::try_from(whole).unwrap_or(u32::MAX);
            let Ok(permit) = shared.recv_budget.clone().acquire_many_owned(cost).await else {
                // The semaphore is never closed; treat it as a shutdown anyway.
                return DisconnectReason::ClosedLocally {
                    code: close_code::SHUTDOWN,
                    reason: "shutdown".to_owned(),
                };
            };
            let lease = RecvLease { _permit: permit };
            let body = &buf[start + FRAME_HEADER_BYTES..start + whole];
            let frame = match decode_frame(body) {
                Ok(frame) => frame,
                Err(e) => return bad_frame(peer, connection, shared, close_code::BAD_FRAME, e),
            };
            start += whole;
            Counters::add(&counters.frames_in, 1);
            if events
                .send(NetEvent::Frame {
                    peer,
                    conn,
                    frame,
                    lease,
                })
                .await
                .is_err()
            {
                // Nobody listens any more: the transport is going away.
                close(connection, close_code::SHUTDOWN, "shutdown");
                return DisconnectReason::ClosedLocally {
                    code: close_code::SHUTDOWN,
                    reason: "event receiver dropped".to_owned(),
                };
            }
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
                Counters::add(&counters.bytes_in, n as u64);
            }
            Ok(None) => return DisconnectReason::StreamEnded,
            Err(e) => return read_error(e),
        }
    }
}

/// Writes the preamble (acceptor only), then whatever is queued, each time
/// all of it in one write.
async fn write_loop(
    send: &mut SendStream,
    outbox: &Outbox,
    with_preamble: bool,
    shared: &Shared,
) -> DisconnectReason {
    let counters = &shared.counters;
    if with_preamble {
        let ours = preamble(shared.instance);
        if let Err(e) = send.write_all(&ours).await {
            return write_error(e);
        }
        Counters::add(&counters.bytes_out, ours.len() as u64);
    }
    let mut out = Vec::new();
    loop {
        out.clear();
        let Some(frames) = outbox.take(&mut out).await else {
            // Closed by the driver, which closes the connection too: let the
            // reader report how it ended.
            return std::future::pending().await;
        };
        if let Err(e) = send.write_all(&out).await {
            return write_error(e);
        }
        Counters::add(&counters.frames_out, frames);
        Counters::add(&counters.bytes_out, out.len() as u64);
    }
}

fn bad_frame(
    peer: NodeId,
    connection: &Connection,
    shared: &Shared,
    code: u32,
    e: FrameError,
) -> DisconnectReason {
    Counters::add(&shared.counters.bad_frames, 1);
    warn!(peer = %peer.fmt_short(), error = %e, "peer sent a bad frame; closing the connection");
    let reason = match code {
        close_code::FRAME_TOO_LARGE => "frame too large",
        _ => "bad frame",
    };
    close(connection, code, reason);
    DisconnectReason::BadFrame(e)
}

/// Why a connection ended, from the connection's own error.
pub(super) fn conn_error(e: ConnectionError) -> DisconnectReason {
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
