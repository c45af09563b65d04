//! The bus as the daemon uses it, and the one place that names `mesh_bus`.
//!
//! [`Bus`] is the node handle the API holds. Its calls are the node's
//! interface as the daemon needs it: [`Bus::submit`] (one call hands a
//! batch of messages over and returns once they are queued, with
//! [`Receipts`] that resolve after their commit), [`Bus::put_cursor`] and
//! [`Bus::record_subscriber_lag`] (the API's own durable writes, sequenced
//! by the node like every other commit). Every other module of the daemon uses
//! only what this one exports.

use std::sync::Arc;

use mesh_store::Arrival;

pub(crate) use mesh_bus::{
    CoreConfig, CoreSendError, DropReason, HOLD_BYTES_MAX, HOLD_MS, HOLD_MSGS_MAX, InviteError,
    JOURNAL_AGE_MS_MAX, JOURNAL_BYTES_MAX, JoinError, LocalWrite, MdnsMode, NetConfig, Node,
    NodeConfig, NodeError, NodePeer, NodeStatus, NodeTopic, Outgoing, PeerChangeError, PeerError,
    RELAYS_MAX, Receipts, RelayUrl, SendError, SendMeta, SendReceipt, WAITING_SEND_BYTES_MAX,
    WAITING_SENDS_MAX, load_or_create_key, load_or_create_node_key, store_key,
};
pub(crate) use mesh_bus::{MoveError, MoveOffer, MoveOffers, close_code};
pub(crate) use mesh_protocol::JoinRefusal;

/// The running bus node, as the API uses it. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Bus {
    node: Arc<Node>,
}

impl Bus {
    /// The bus of `node`.
    pub(crate) fn new(node: Arc<Node>) -> Bus {
        Bus { node }
    }

    /// Hands `msgs` to the node in the order given (messages to one peer get
    /// ascending seqs in that order; they may share a commit) and returns
    /// once every one is queued with the node; the [`Receipts`] resolve to
    /// one result per message, in order, each after its commit. Messages
    /// handed over after this returns are ordered after these.
    pub(crate) async fn submit(&self, msgs: Vec<Outgoing>) -> Receipts {
        self.node.submit(msgs).await
    }

    /// This node's and its peers' names as their newest cards say, now.
    pub(crate) fn node_names(&self) -> mesh_bus::NodeNames {
        self.node.node_names()
    }

    /// Sets the named durable cursor `name` to `arrival`; answers once it is
    /// committed.
    ///
    /// # Errors
    /// [`NodeError::Store`] if it cannot be written.
    pub(crate) async fn put_cursor(&self, name: String, arrival: Arrival) -> Result<(), NodeError> {
        self.node.put_cursor(name, arrival).await
    }

    /// Journals that the local subscriber `subscriber` (a short description
    /// for a person) missed the live journal entries `from..=to` (arrivals): it
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
        self.node.record_subscriber_lag(subscriber, from, to).await
    }
}

impl std::ops::Deref for Bus {
    type Target = Node;

    fn deref(&self) -> &Node {
        &self.node
    }
}
