//! The bus as the daemon uses it, and the one place that names `mesh_bus`.
//!
//! [`Bus`] is the node handle the API holds. Its calls are the node's
//! interface as the daemon needs it: [`Bus::submit`] (one call hands a
//! batch of messages over and returns once they are queued, with
//! [`Receipts`] that resolve after their commit), [`Bus::put_cursor`] and
//! [`Bus::record_subscriber_lag`] (the API's own durable writes, sequenced
//! by the node like every other commit). Where today's `Node` does not offer
//! a call yet they are made up here, on `Node::send_many` and the store's
//! writer; every other module of the daemon uses only what this one exports.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use mesh_protocol::{Channel, Cursor, NodeId, StreamId, TopicName};
use mesh_store::{Arrival, LossReason, Receipt, RedbStore, StoreHandle, WriteOp};
use tokio::sync::watch;

pub(crate) use mesh_bus::core::{
    Config as CoreConfig, DropReason, SendError as CoreSendError, SendReceipt,
};
pub(crate) use mesh_bus::net::{NetConfig, PeerError, load_or_create_node_key};
pub(crate) use mesh_bus::node::{Node, NodeConfig, NodeError, NodePeer, NodeStatus, SendError};

/// One message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Outgoing {
    /// The recipient.
    pub(crate) to: NodeId,
    /// Application-defined kind; 0 is a plain message.
    pub(crate) kind: u16,
    /// The payload.
    pub(crate) payload: Vec<u8>,
}

/// The future of one result per message of a submit.
type Answers = Pin<Box<dyn Future<Output = Vec<Result<SendReceipt, SendError>>> + Send>>;

/// The answers of one [`Bus::submit`]: a future of one result per message,
/// in the order given, each after its commit.
pub(crate) struct Receipts(Answers);

impl Future for Receipts {
    type Output = Vec<Result<SendReceipt, SendError>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

/// The running bus node, as the API uses it. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Bus {
    node: Arc<Node>,
    /// The store's writer, for the writes the node does not make for the API yet.
    writer: StoreHandle<RedbStore>,
    head: Arc<watch::Sender<Arrival>>,
}

impl Bus {
    /// The bus of `node`, whose store's writer is `writer`.
    pub(crate) fn new(node: Arc<Node>, writer: StoreHandle<RedbStore>) -> Bus {
        let head = node.journal_head_sender();
        Bus { node, writer, head }
    }

    /// Hands `msgs` to the node in the order given (messages to one peer get
    /// ascending seqs in that order; they may share a commit) and returns
    /// once every one is queued with the node; the [`Receipts`] resolve to
    /// one result per message, in order, each after its commit. Messages
    /// handed over after this returns are ordered after these.
    pub(crate) async fn submit(&self, msgs: Vec<Outgoing>) -> Receipts {
        let handed = Arc::new(AtomicBool::new(false));
        let msgs = HandOver {
            msgs: msgs.into_iter(),
            done: handed.clone(),
        };
        let node = self.node.clone();
        let mut sending = Box::pin(async move { node.send_many(msgs).await });
        // `send_many` queues one message after another and then waits for
        // every commit: drive it until the last is queued (or all answered).
        let early = std::future::poll_fn(|cx| match sending.as_mut().poll(cx) {
            Poll::Ready(receipts) => Poll::Ready(Some(receipts)),
            Poll::Pending if handed.load(Ordering::Acquire) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        })
        .await;
        match early {
            Some(receipts) => Receipts(Box::pin(std::future::ready(receipts))),
            None => Receipts(sending),
        }
    }

    /// Sets the named durable cursor `name` to `arrival`; answers once it is
    /// committed.
    ///
    /// # Errors
    /// [`NodeError::Store`] if it cannot be written.
    pub(crate) async fn put_cursor(&self, name: String, arrival: Arrival) -> Result<(), NodeError> {
        self.commit(vec![WriteOp::PutCursor { name, arrival }])
            .await
            .map(|_| ())
    }

    /// Journals that the local subscriber `subscriber` (a description for
    /// a person) missed the live journal entries `from..=to` (arrivals): it
    /// must re-read them. Answers the record's arrival once it is committed.
    ///
    /// # Errors
    /// [`NodeError::Store`] if it cannot be written.
    pub(crate) async fn record_subscriber_lag(
        &self,
        subscriber: String,
        from: Arrival,
        to: Arrival,
    ) -> Result<Arrival, NodeError> {
        let (me, epoch) = (self.node.node_id(), self.node.epoch());
        let resume = Cursor::new(&me, epoch, from.saturating_sub(1));
        let detail = format!(
            "{subscriber} stopped reading; journal arrivals {from}..={to} were not delivered \
             to it live and are still in the journal: re-read them with \
             GET /v1/events?after={resume}"
        );
        // The store has no lag record yet: the loss is reported against a
        // stream named after the journal, with arrivals where seqs would be.
        let channel = TopicName::new(JOURNAL_TOPIC)
            .map(Channel::Topic)
            .unwrap_or(Channel::Direct(me));
        let op = WriteOp::RecordLoss {
            stream: StreamId {
                author: me,
                epoch,
                channel,
            },
            from,
            to,
            reason: LossReason::SubscriberLagged,
            detail,
        };
        let receipt = self.commit(vec![op]).await?;
        Ok(receipt.arrivals.map_or(to, |(_, last)| last))
    }

    /// Commits `ops` through the store's writer, then moves the journal head
    /// watch past what they journaled (it never moves back).
    async fn commit(&self, ops: Vec<WriteOp>) -> Result<Receipt, NodeError> {
        let receipt = self.writer.commit(ops).await?;
        if let Some((_, last)) = receipt.arrivals {
            self.head.send_if_modified(|h| {
                let moved = last > *h;
                *h = (*h).max(last);
                moved
            });
        }
        Ok(receipt)
    }
}

impl std::ops::Deref for Bus {
    type Target = Node;

    fn deref(&self) -> &Node {
        &self.node
    }
}

/// The topic name subscriber loss records are reported against.
const JOURNAL_TOPIC: &str = "local.journal";

/// The messages of a batch as `Node::send_many` takes them, noting when it
/// has taken the last one: it asks for the next only after it has queued
/// the one before.
struct HandOver<I> {
    msgs: I,
    done: Arc<AtomicBool>,
}

impl<I: Iterator<Item = Outgoing>> Iterator for HandOver<I> {
    type Item = (NodeId, u16, Vec<u8>);

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.msgs.next();
        if next.is_none() {
            self.done.store(true, Ordering::Release);
        }
        next.map(|m| (m.to, m.kind, m.payload))
    }
}
