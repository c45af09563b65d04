//! One connection's send queue: the owner encodes frames straight into a
//! byte buffer that the connection's writer task takes whole and writes in
//! one go.

use std::sync::Mutex;

use mesh_protocol::{Frame, encode_frame};
use tokio::sync::{Notify, mpsc};
use tracing::warn;

use super::SendError;
use crate::core::ConnId;

/// The send queue of one live connection: the only queue between the
/// transport's owner and the wire.
///
/// The owner pushes without ever waiting and watches the queued bytes (the
/// node closes a connection whose queue passes
/// [`super::SEND_QUEUE_BYTES_MAX`]); the writer takes everything queued at
/// once. An owner that wants to know when the writer has taken the queue
/// asks with [`SendQueue::notify_when_taken`] and hears the connection's id
/// on its `taken` channel.
#[derive(Debug)]
pub(crate) struct SendQueue {
    conn: ConnId,
    state: Mutex<State>,
    /// Wakes the writer: bytes were queued or the queue closed.
    data: Notify,
    /// Where [`SendQueue::notify_when_taken`] is answered.
    taken: mpsc::Sender<ConnId>,
}

#[derive(Debug, Default)]
struct State {
    /// Encoded frames, headers included, in send order.
    buf: Vec<u8>,
    /// Frames in `buf`.
    frames: u64,
    closed: bool,
    /// The owner waits to hear of the next take.
    notify: bool,
}

impl SendQueue {
    pub(crate) fn new(conn: ConnId, taken: mpsc::Sender<ConnId>) -> Self {
        SendQueue {
            conn,
            state: Mutex::new(State::default()),
            data: Notify::new(),
            taken,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock (encode_frame returns errors),
        // and the state is valid between any two statements anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Encodes `frame` onto the queue and returns the bytes queued now.
    ///
    /// # Errors
    /// [`SendError::NotConnected`] once closed, [`SendError::Frame`] if the
    /// frame does not encode (nothing is queued then).
    pub(crate) fn push(&self, frame: &Frame) -> Result<usize, SendError> {
        let mut st = self.state();
        if st.closed {
            return Err(SendError::NotConnected);
        }
        let before = st.buf.len();
        if let Err(e) = encode_frame(frame, &mut st.buf) {
            // A failed encode may have written part of the frame.
            st.buf.truncate(before);
            return Err(SendError::Frame(e));
        }
        st.frames += 1;
        let queued = st.buf.len();
        debug_assert!(queued > before, "a frame encodes to at least its header");
        drop(st);
        self.data.notify_one();
        Ok(queued)
    }

    /// The bytes queued now.
    pub(crate) fn queued(&self) -> usize {
        self.state().buf.len()
    }

    /// Asks to hear (on the `taken` channel) when the writer next takes the
    /// queue, if at least `bytes` are queued; returns false (and asks
    /// nothing) if fewer are, so the caller need not wait at all.
    pub(crate) fn notify_when_taken(&self, bytes: usize) -> bool {
        let mut st = self.state();
        if st.closed || st.buf.len() < bytes {
            return false;
        }
        st.notify = true;
        true
    }

    /// Refuses further frames, drops what is queued and wakes the writer.
    pub(crate) fn close(&self) {
        {
            let mut st = self.state();
            st.closed = true;
            st.buf = Vec::new();
            st.frames = 0;
            st.notify = false;
        }
        self.data.notify_one();
    }

    /// Waits for queued frames and swaps them into `out` (which the caller has
    /// emptied). Returns how many frames were taken, or `None` once closed.
    pub(crate) async fn take(&self, out: &mut Vec<u8>) -> Option<u64> {
        debug_assert!(out.is_empty());
        loop {
            {
                let mut st = self.state();
                if st.closed {
                    return None;
                }
                if !st.buf.is_empty() {
                    debug_assert!(st.frames > 0, "queued bytes are whole frames");
                    std::mem::swap(&mut st.buf, out);
                    let n = std::mem::take(&mut st.frames);
                    let notify = std::mem::take(&mut st.notify);
                    drop(st);
                    if notify && self.taken.try_send(self.conn).is_err() {
                        // One notice per request and at most one request per
                        // connection outstanding: the channel has room for
                        // every connection, so this is a bug, or the owner is gone.
                        warn!(conn = %self.conn, "could not tell the transport a send queue was taken");
                    }
                    return Some(n);
                }
                debug_assert_eq!(st.frames, 0);
            }
            // notify_one keeps a permit when nobody waits, so a push between
            // the look above and this wait still wakes us.
            self.data.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use mesh_protocol::{Epoch, SecretKey, StreamId};

    use super::*;

    fn ack(upto: u64) -> Frame {
        let k = SecretKey::from_bytes(&[7; 32]).public();
        Frame::Ack {
            stream: StreamId::direct(k, Epoch([7; 16]), k),
            upto,
        }
    }

    #[tokio::test]
    async fn the_writer_takes_everything_queued_at_once_and_a_waiting_owner_hears_of_it() {
        let (tx, mut rx) = mpsc::channel(4);
        let q = SendQueue::new(ConnId(7), tx);
        assert!(!q.notify_when_taken(1), "an empty queue needs no wait");
        let one = q.push(&ack(1)).expect("push");
        let two = q.push(&ack(2)).expect("push");
        assert!(two > one);
        assert!(q.notify_when_taken(two));
        let mut out = Vec::new();
        assert_eq!(q.take(&mut out).await, Some(2));
        assert_eq!((out.len(), q.queued()), (two, 0));
        assert_eq!(rx.try_recv(), Ok(ConnId(7)));
        // Only one notice per request.
        out.clear();
        q.push(&ack(3)).expect("push");
        assert_eq!(q.take(&mut out).await, Some(1));
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_closed_queue_refuses_frames_and_ends_the_writer() {
        let (tx, _rx) = mpsc::channel(1);
        let q = SendQueue::new(ConnId(1), tx);
        q.push(&ack(1)).expect("push");
        q.close();
        assert_eq!(q.push(&ack(2)), Err(SendError::NotConnected));
        assert_eq!(q.take(&mut Vec::new()).await, None);
        assert_eq!(q.queued(), 0);
    }
}
