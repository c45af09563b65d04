//! One connection's send queue: frames encoded by the senders straight into a
//! byte buffer that the writer task takes whole and writes in one go.

use std::pin::pin;
use std::sync::Mutex;

use mesh_protocol::{Frame, encode_frame};
use tokio::sync::Notify;

use super::{ConnId, PEER_QUEUE_BYTES, SendError};

/// The send queue of one live connection.
///
/// Bounded by [`PEER_QUEUE_BYTES`] (plus the one frame that crosses it); the
/// writer holds at most one more such buffer while it writes.
#[derive(Debug)]
pub(super) struct Outbox {
    /// The connection this queue feeds.
    pub(super) conn: ConnId,
    /// Whether this node dialed the connection.
    pub(super) dialed_here: bool,
    state: Mutex<State>,
    /// Wakes the writer: bytes were queued or the queue closed.
    data: Notify,
    /// Wakes waiting senders: the writer took the queue or it closed.
    space: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Encoded frames, headers included, in send order.
    buf: Vec<u8>,
    /// Frames in `buf`.
    frames: u64,
    closed: bool,
}

impl Outbox {
    pub(super) fn new(conn: ConnId, dialed_here: bool) -> Self {
        Outbox {
            conn,
            dialed_here,
            state: Mutex::new(State::default()),
            data: Notify::new(),
            space: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock (encode_frame returns errors),
        // and the state is valid between any two statements anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Encodes `frame` onto the queue, or says why not.
    pub(super) fn try_push(&self, frame: &Frame) -> Result<(), SendError> {
        let mut st = self.state();
        if st.closed {
            return Err(SendError::NotConnected);
        }
        if st.buf.len() >= PEER_QUEUE_BYTES {
            return Err(SendError::QueueFull);
        }
        encode_frame(frame, &mut st.buf).map_err(SendError::Frame)?;
        st.frames += 1;
        drop(st);
        self.data.notify_one();
        Ok(())
    }

    /// Encodes `frame` onto the queue, waiting while it is full.
    pub(super) async fn push(&self, frame: &Frame) -> Result<(), SendError> {
        loop {
            // Register for the wake-up before looking, so a take between the
            // look and the wait is not missed.
            let mut notified = pin!(self.space.notified());
            notified.as_mut().enable();
            match self.try_push(frame) {
                Err(SendError::QueueFull) => notified.await,
                other => return other,
            }
        }
    }

    /// Waits until the queue has room (or is closed: `NotConnected`).
    pub(super) async fn writable(&self) -> Result<(), SendError> {
        loop {
            let mut notified = pin!(self.space.notified());
            notified.as_mut().enable();
            {
                let st = self.state();
                if st.closed {
                    return Err(SendError::NotConnected);
                }
                if st.buf.len() < PEER_QUEUE_BYTES {
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    /// Refuses further frames, drops what is queued and wakes everyone waiting.
    pub(super) fn close(&self) {
        {
            let mut st = self.state();
            st.closed = true;
            st.buf = Vec::new();
            st.frames = 0;
        }
        self.space.notify_waiters();
        self.data.notify_one();
    }

    /// Waits for queued frames and swaps them into `out` (which the caller has
    /// emptied). Returns how many frames were taken, or `None` once closed.
    pub(super) async fn take(&self, out: &mut Vec<u8>) -> Option<u64> {
        loop {
            {
                let mut st = self.state();
                if st.closed {
                    return None;
                }
                if !st.buf.is_empty() {
                    std::mem::swap(&mut st.buf, out);
                    let n = std::mem::take(&mut st.frames);
                    drop(st);
                    self.space.notify_waiters();
                    return Some(n);
                }
            }
            // notify_one keeps a permit when nobody waits, so a push between
            // the look above and this wait still wakes us.
            self.data.notified().await;
        }
    }
}
