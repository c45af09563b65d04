//! The writer actor: one thread owns every write and groups whatever callers
//! have queued into one durable transaction.
//!
//! In the daemon the bus node is the only caller, with at most one commit
//! outstanding ([`StoreHandle::commit_then`]), so each transaction holds one
//! request; the grouping of several callers is kept for other users of the
//! handle (tools, tests), and costs a single caller one empty `try_recv`.

use std::fmt;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::{MeshStore, Receipt, StoreError, WriteOp};

/// The most requests waiting for the writer; a caller beyond it waits to enqueue.
pub const WRITE_QUEUE_REQUESTS_MAX: usize = 1024;

/// The most caller groups in one transaction.
pub const GROUP_COMMIT_GROUPS_MAX: usize = 512;

/// The most payload bytes (roughly) in one transaction. A single request
/// larger than this still gets a transaction of its own.
pub const GROUP_COMMIT_BYTES_MAX: u64 = 32 << 20;

/// Bytes counted for an op besides its payloads, so that many small ops
/// also close a transaction.
const OP_OVERHEAD_BYTES: u64 = 128;

type GroupResult = Result<Receipt, StoreError>;

/// One caller's groups and where to send their results.
type Caller = (Vec<Vec<WriteOp>>, Reply);

/// Where one request's results go.
enum Reply {
    /// To a caller awaiting them ([`StoreHandle::commit_groups`]).
    Wait(oneshot::Sender<Vec<GroupResult>>),
    /// To a callback the writer thread calls ([`StoreHandle::commit_then`]).
    Call(Answer),
}

impl Reply {
    fn send(self, results: Vec<GroupResult>) {
        match self {
            // A caller that gave up waiting is not an error.
            Reply::Wait(tx) => {
                let _ = tx.send(results);
            }
            Reply::Call(answer) => answer.call(results),
        }
    }
}

/// A callback owed one answer: if it is dropped unanswered (the writer
/// stopped or panicked), it is called with [`StoreError::Closed`] for every
/// group, so its caller never waits for an answer that cannot come.
struct Answer {
    groups: usize,
    call: Option<Box<dyn FnOnce(Vec<GroupResult>) + Send>>,
}

impl Answer {
    fn call(mut self, results: Vec<GroupResult>) {
        if let Some(call) = self.call.take() {
            call(results);
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            call((0..self.groups).map(|_| Err(StoreError::Closed)).collect());
        }
    }
}

enum Request {
    Commit {
        groups: Vec<Vec<WriteOp>>,
        bytes: u64,
        reply: Reply,
    },
    /// Stop after answering everything queued before this; the reply comes
    /// once the writer has dropped its reference to the store.
    Close(oneshot::Sender<()>),
}

/// A handle to the writer actor in front of a [`MeshStore`].
///
/// `commit` sends a caller's group of ops to the one writer thread, which
/// takes everything queued (up to [`GROUP_COMMIT_GROUPS_MAX`] groups and
/// [`GROUP_COMMIT_BYTES_MAX`] bytes) into one [`MeshStore::commit`] call and
/// answers every caller once it returns. Nothing is answered before the
/// transaction is durable; a transaction error is every caller's error.
///
/// Reads do not go through the writer: use [`StoreHandle::reader`] from any
/// thread. The writer thread needs no async runtime. It stops when every
/// handle is dropped, or at [`StoreHandle::close`].
pub struct StoreHandle<S: MeshStore + ?Sized> {
    tx: mpsc::Sender<Request>,
    store: Arc<S>,
}

impl<S: MeshStore + ?Sized> Clone for StoreHandle<S> {
    fn clone(&self) -> Self {
        StoreHandle {
            tx: self.tx.clone(),
            store: self.store.clone(),
        }
    }
}

impl<S: MeshStore + ?Sized> fmt::Debug for StoreHandle<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreHandle")
            .field("queued", &self.queued())
            .finish_non_exhaustive()
    }
}

fn op_bytes(op: &WriteOp) -> u64 {
    let payloads = match op {
        WriteOp::AppendOwn { batch, .. }
        | WriteOp::Accept { batch, .. }
        | WriteOp::Supersede { batch, .. } => batch.batch().payload_bytes(),
        WriteOp::RecordLoss { detail, .. } => detail.len() as u64,
        _ => 0,
    };
    payloads + OP_OVERHEAD_BYTES
}

impl<S: MeshStore + ?Sized> StoreHandle<S> {
    /// Starts the writer thread for `store`.
    ///
    /// Errors with [`StoreError::Unavailable`] if the thread cannot be started.
    pub fn spawn(store: Arc<S>) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE_REQUESTS_MAX);
        let writer_store = store.clone();
        thread::Builder::new()
            .name("mesh-store-writer".into())
            .spawn(move || writer(writer_store, rx))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the store writer: {e}")))?;
        Ok(StoreHandle { tx, store })
    }

    /// Commits one caller's ops (all or nothing) in the next group commit.
    ///
    /// Errors: the [`MeshStore::commit`] error for this group, or
    /// [`StoreError::Closed`] if the writer has stopped.
    pub async fn commit(&self, ops: Vec<WriteOp>) -> Result<Receipt, StoreError> {
        let mut out = self.commit_groups(vec![ops]).await;
        out.pop().unwrap_or(Err(StoreError::Closed))
    }

    /// Commits several independent groups, each all or nothing, and answers
    /// each. More than [`GROUP_COMMIT_GROUPS_MAX`] groups are split over
    /// several transactions.
    pub async fn commit_groups(&self, groups: Vec<Vec<WriteOp>>) -> Vec<GroupResult> {
        let total = groups.len();
        let mut pending = Vec::new();
        let mut groups = groups.into_iter().peekable();
        while groups.peek().is_some() {
            let chunk: Vec<_> = groups.by_ref().take(GROUP_COMMIT_GROUPS_MAX).collect();
            let n = chunk.len();
            let bytes = chunk.iter().flatten().map(op_bytes).sum();
            let (reply, rx) = oneshot::channel();
            let sent = self
                .tx
                .send(Request::Commit {
                    groups: chunk,
                    bytes,
                    reply: Reply::Wait(reply),
                })
                .await;
            pending.push((n, sent.ok().map(|()| rx)));
        }
        let mut out = Vec::with_capacity(total);
        for (n, rx) in pending {
            match rx {
                Some(rx) => match rx.await {
                    Ok(results) => out.extend(results),
                    Err(_) => out.extend((0..n).map(|_| Err(StoreError::Closed))),
                },
                None => out.extend((0..n).map(|_| Err(StoreError::Closed))),
            }
        }
        out
    }

    /// Queues `groups` for the writer without waiting, as one request (not
    /// split at [`GROUP_COMMIT_GROUPS_MAX`]: one request larger than a group
    /// commit's caps gets a transaction of its own), and returns at once. The
    /// writer thread calls `reply` with one result per group once the
    /// transaction returns: a caller that must never block (an event loop)
    /// gets its answers on its own channel without a task per commit.
    ///
    /// `reply` is called exactly once: with [`StoreError::Closed`] for every
    /// group if the writer has stopped (or stops before answering), and with
    /// [`StoreError::Unavailable`] at once if [`WRITE_QUEUE_REQUESTS_MAX`]
    /// requests are already queued.
    pub fn commit_then(
        &self,
        groups: Vec<Vec<WriteOp>>,
        reply: impl FnOnce(Vec<GroupResult>) + Send + 'static,
    ) {
        let bytes = groups.iter().flatten().map(op_bytes).sum();
        let answer = Answer {
            groups: groups.len(),
            call: Some(Box::new(reply)),
        };
        let request = Request::Commit {
            groups,
            bytes,
            reply: Reply::Call(answer),
        };
        match self.tx.try_send(request) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(Request::Commit { groups, reply, .. })) => {
                let why = format!(
                    "the store's write queue holds {WRITE_QUEUE_REQUESTS_MAX} requests already"
                );
                reply.send(
                    (0..groups.len())
                        .map(|_| Err(StoreError::Unavailable(why.clone())))
                        .collect(),
                );
            }
            // Closed (or Full of a close request, which is never built here):
            // dropping the request answers Closed.
            Err(_) => {}
        }
    }

    /// The store, for reads from any thread (reads see committed state only).
    pub fn reader(&self) -> Arc<S> {
        self.store.clone()
    }

    /// Requests waiting for the writer now.
    pub fn queued(&self) -> usize {
        WRITE_QUEUE_REQUESTS_MAX.saturating_sub(self.tx.capacity())
    }

    /// Stops the writer once it has answered everything queued before this
    /// call, and returns after it has dropped its reference to the store.
    /// Later commits through other clones get [`StoreError::Closed`].
    ///
    /// The store itself is dropped (and a redb file unlocked) when the last
    /// [`StoreHandle::reader`] reference is gone too.
    pub async fn close(self) {
        let StoreHandle { tx, store } = self;
        drop(store);
        let (reply, rx) = oneshot::channel();
        if tx.send(Request::Close(reply)).await.is_ok() {
            // An error means the writer is already gone, which is what we wait for.
            let _ = rx.await;
        }
    }
}

/// The writer thread: take what is queued, commit it in one transaction, answer.
fn writer<S: MeshStore + ?Sized>(store: Arc<S>, mut rx: mpsc::Receiver<Request>) {
    let mut carried: Option<Request> = None;
    loop {
        let Some(first) = carried.take().or_else(|| rx.blocking_recv()) else {
            break;
        };
        let mut batch = Vec::new();
        let mut close = None;
        let (mut groups_n, mut bytes_n) = (0usize, 0u64);
        let mut next = Some(first);
        while let Some(req) = next.take() {
            match req {
                Request::Close(reply) => {
                    close = Some(reply);
                    break;
                }
                Request::Commit {
                    groups,
                    bytes,
                    reply,
                } => {
                    let over = groups_n + groups.len() > GROUP_COMMIT_GROUPS_MAX
                        || bytes_n.saturating_add(bytes) > GROUP_COMMIT_BYTES_MAX;
                    if over && !batch.is_empty() {
                        carried = Some(Request::Commit {
                            groups,
                            bytes,
                            reply,
                        });
                        break;
                    }
                    groups_n += groups.len();
                    bytes_n = bytes_n.saturating_add(bytes);
                    batch.push((groups, reply));
                }
            }
            next = rx.try_recv().ok();
        }
        if !batch.is_empty() {
            commit_batch(&*store, batch, groups_n, bytes_n);
        }
        if let Some(reply) = close {
            drop(store);
            rx.close();
            // Requests queued after the close are dropped: their callers see Closed.
            drop(rx);
            let _ = reply.send(());
            return;
        }
    }
}

fn commit_batch<S: MeshStore + ?Sized>(
    store: &S,
    batch: Vec<Caller>,
    groups_n: usize,
    bytes_n: u64,
) {
    let mut all = Vec::with_capacity(groups_n);
    let mut replies = Vec::with_capacity(batch.len());
    for (groups, reply) in batch {
        replies.push((groups.len(), reply));
        all.extend(groups);
    }
    let started = Instant::now();
    let mut results = store.commit(all).into_iter();
    // After the commit, so that a trace shows what each commit took.
    tracing::trace!(
        groups = groups_n,
        bytes = bytes_n,
        callers = replies.len(),
        commit_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "group commit"
    );
    for (n, reply) in replies {
        let mine: Vec<_> = (0..n)
            .map(|_| {
                results.next().unwrap_or_else(|| {
                    Err(StoreError::Unavailable(
                        "the store answered fewer groups than it was given".into(),
                    ))
                })
            })
            .collect();
        reply.send(mine);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;
    use std::time::Duration;

    use mesh_protocol::{Epoch, SecretKey};

    use super::*;
    use crate::{MemStore, PeerRecord};

    fn put_peer(n: u8) -> Vec<WriteOp> {
        vec![WriteOp::PutPeer(PeerRecord {
            node: SecretKey::from_bytes(&[n; 32]).public(),
            addrs: Vec::new(),
            epoch: None,
        })]
    }

    /// A callback that hands its results to the test thread.
    fn answers() -> (
        impl FnOnce(Vec<GroupResult>) + Send + 'static,
        std_mpsc::Receiver<Vec<GroupResult>>,
    ) {
        let (tx, rx) = std_mpsc::channel();
        (move |r| tx.send(r).expect("test waits"), rx)
    }

    const T: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn commit_then_answers_each_group_on_the_writer_thread_without_a_task() {
        let store = Arc::new(MemStore::new(Epoch([4; 16])));
        let handle = StoreHandle::spawn(store.clone()).expect("writer");
        let (reply, rx) = answers();
        handle.commit_then(vec![put_peer(1), put_peer(2)], reply);
        let results = rx.recv_timeout(T).expect("answered");
        assert_eq!(results.len(), 2);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(store.peers().expect("peers").len(), 2);
        handle.close().await;
    }

    #[tokio::test]
    async fn commit_then_after_the_writer_stopped_answers_closed_for_every_group() {
        let store = Arc::new(MemStore::new(Epoch([5; 16])));
        let handle = StoreHandle::spawn(store).expect("writer");
        let other = handle.clone();
        handle.close().await;
        let (reply, rx) = answers();
        other.commit_then(vec![put_peer(1), put_peer(2), put_peer(3)], reply);
        let results = rx.recv_timeout(T).expect("answered");
        assert_eq!(results.len(), 3);
        assert!(
            results.iter().all(|r| matches!(r, Err(StoreError::Closed))),
            "{results:?}"
        );
    }
}
