//! The node: one task, the only actor of the bus, that owns the [`Core`](crate::core::Core),
//! the transport and the store's answers, and the handle the daemon talks
//! to.
//!
//! The handle only sends requests to the task and waits for answers; the
//! task never waits for anything that could wait for it (its store requests
//! and frame sends never block, and every answer comes back on a channel
//! its `select!` loop takes from).

mod actor;
mod effects;
mod invites;
mod join;
mod link;
mod moving;
mod receipts;
mod start;
mod status;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iroh::{Endpoint, RelayUrl};
use mesh_protocol::{Epoch, MAX_TICKET_ADDRS, NodeId, NodeName, NodeTicket, SecretKey};
use mesh_store::{Arrival, MeshStore, Receipt, StoreError, StoreHandle};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, error_span, info};

use crate::core::{self, LocalWrite, Recovered, SendReceipt};
use crate::net::{NetConfig, NetError, PeerError, endpoint_addrs};

pub use join::{
    INVITE_LEASE_MS, INVITE_TTL_MS_MAX, InviteError, JOIN_ATTEMPTS_MAX, JOIN_TIMEOUT, JoinError,
    TRY_AGAIN_MS,
};
pub use moving::{
    MOVE_ANSWER_TIMEOUT, MOVE_READ_TIMEOUT, MOVE_TIMEOUT, MOVES_AT_ONCE_MAX, MoveError, MoveOffer,
    MoveOffers, move_message_len,
};
pub use receipts::Receipts;
pub use status::{NodePeer, NodeStatus, NodeTopic, TopicStream};

use actor::{Actor, Audience, Cmd, PeerChange};
use join::{InviteCmd, Inviter};
use start::{bind_transport, new_core};

/// Requests from the handle waiting for the node task.
pub const COMMANDS_MAX: usize = 1024;

/// Payload bytes of messages handed to [`Node::submit`] that the node task
/// has not taken yet; a submit beyond it waits.
pub const COMMAND_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The most messages of a submit handed to the task in one request; a larger
/// submit is handed over in parts of this size, in order.
pub const SUBMIT_PART_MSGS_MAX: usize = 256;

/// How long shutdown waits for commits under way to be answered.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// The names of this node (first) and of its peers, from the newest card
/// held of each (a peer without a card yet is not listed).
pub type NodeNames = Arc<Vec<(NodeId, NodeName)>>;

/// The agents' move notices a node holds, by agent key.
pub type AgentMoves = Arc<Vec<mesh_protocol::AgentMove>>;

/// The agents (by key) that moved away from a node whose every peer
/// follows the move and has been received as far as it said.
pub type DrainsFollowed = Arc<std::collections::BTreeSet<NodeId>>;

/// How to start a node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The transport.
    pub net: NetConfig,
    /// The core.
    pub core: core::Config,
    /// The node's name, in its card.
    pub name: NodeName,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            net: NetConfig::default(),
            core: core::Config::default(),
            name: NodeName::from_hostname(""),
        }
    }
}

/// Why the node could not start or do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The transport could not bind.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The store could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The peer could not be added, removed, paused or resumed.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// The core refused or could not commit a peer change.
    #[error(transparent)]
    PeerChange(#[from] core::PeerChangeError),
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
}

/// Why a local send got no receipt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The bus refused or failed it; nothing was written.
    #[error(transparent)]
    Refused(#[from] core::SendError),
    /// The node stopped before it answered.
    #[error(
        "the node stopped before answering; read the journal to see whether the message was written"
    )]
    Stopped,
}

/// One message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The recipient node.
    pub to: NodeId,
    /// Application-defined kind; 0 is a plain message.
    pub kind: u16,
    /// The payload (an agent message's body).
    pub payload: Vec<u8>,
    /// The agent addressing of an agent message, or a client id.
    pub meta: Option<Box<core::SendMeta>>,
}

impl Outgoing {
    /// A plain message of `kind` to `to`.
    pub fn plain(to: NodeId, kind: u16, payload: Vec<u8>) -> Outgoing {
        Outgoing {
            to,
            kind,
            payload,
            meta: None,
        }
    }
}

/// The running node. Dropping it stops the node in the background; prefer
/// [`Node::shutdown`], which waits.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    epoch: watch::Receiver<Epoch>,
    /// Signs this node's join requests.
    secret: SecretKey,
    /// For tickets (the addresses it is bound to), and join dials.
    endpoint: Endpoint,
    /// The relays a join dials through.
    relays: Vec<RelayUrl>,
    commands: mpsc::Sender<Cmd>,
    /// The inviter's requests.
    invites: mpsc::Sender<InviteCmd>,
    /// Holds [`COMMAND_BYTES_MAX`] permits, one per payload byte handed over
    /// and not yet taken by the task.
    budget: Arc<Semaphore>,
    head: watch::Receiver<Arrival>,
    names: watch::Receiver<NodeNames>,
    moves: watch::Receiver<AgentMoves>,
    followed: watch::Receiver<DrainsFollowed>,
    closing: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
    inviter: Mutex<Option<JoinHandle<()>>>,
    /// The offers of agent moves, until taken ([`Node::take_move_offers`]).
    move_offers: Mutex<Option<MoveOffers>>,
    /// The task that reads agent move offers.
    mover: Mutex<Option<JoinHandle<()>>>,
}

impl Node {
    /// Reads the committed state from `store`, binds the transport with
    /// `secret`, makes every stored peer known to it and starts the task.
    ///
    /// # Errors
    /// [`NodeError::Store`] if the store cannot be read, [`NodeError::Net`] if
    /// the transport cannot bind, [`NodeError::Peer`] if a stored peer cannot
    /// be added (more than [`crate::net::PEERS_MAX`]).
    pub async fn start<S: MeshStore + ?Sized>(
        config: NodeConfig,
        secret: SecretKey,
        store: StoreHandle<S>,
    ) -> Result<Node, NodeError> {
        let reader = store.reader();
        let (mut recovered, head) = blocking(move || {
            let recovered = Recovered::read(&*reader)?;
            Ok((recovered, reader.journal_head()?))
        })
        .await?;
        recovered.entropy = rand::random();
        let id = secret.public();
        let span = error_span!("node", me = %id.fmt_short());
        let mut transport = bind_transport(&config, &secret, &recovered, &span).await?;
        let epoch = recovered.epoch;
        let endpoint = transport.endpoint().clone();
        let core = new_core(&config, &secret, recovered, &endpoint);
        let (commands, commands_rx) = mpsc::channel(COMMANDS_MAX);
        let (head_tx, head_rx) = watch::channel(head);
        let (epoch_tx, epoch_rx) = watch::channel(epoch);
        let (closing, closing_rx) = watch::channel(false);
        let ((joins_tx, joins), (invites, invites_rx)) = join::channels();
        transport.accept_joins(joins_tx);
        let inviter = Inviter {
            me: id,
            commands: commands.clone(),
            store: store.reader(),
            joins,
            cmds: invites_rx,
            closing: closing_rx.clone(),
        };
        let inviter = tokio::spawn(inviter.run().instrument(span.clone()));
        let ((move_conns_tx, move_conns), (offers_tx, offers)) = moving::channels();
        transport.accept_moves(move_conns_tx);
        let mover = moving::Mover {
            conns: move_conns,
            offers: offers_tx,
            closing: closing_rx.clone(),
        };
        let mover = tokio::spawn(mover.run().instrument(span.clone()));
        let (names_tx, names_rx) = watch::channel(NodeNames::default());
        let (moves_tx, moves_rx) = watch::channel(Arc::new(core.agent_moves()));
        let (followed_tx, followed_rx) = watch::channel(DrainsFollowed::default());
        let actor = Actor::new(
            core,
            store,
            transport,
            commands_rx,
            closing_rx,
            (head_tx, names_tx, moves_tx, followed_tx),
            epoch_tx,
        );
        let task = tokio::spawn(actor.run().instrument(span));
        info!(node = %id.fmt_short(), epoch = %epoch.fmt_short(), addrs = ?endpoint_addrs(&endpoint), "node started");
        Ok(Node {
            id,
            epoch: epoch_rx,
            secret,
            endpoint,
            relays: config.net.relays.clone(),
            commands,
            invites,
            budget: Arc::new(Semaphore::new(COMMAND_BYTES_MAX)),
            head: head_rx,
            names: names_rx,
            moves: moves_rx,
            followed: followed_rx,
            closing,
            task: Mutex::new(Some(task)),
            inviter: Mutex::new(Some(inviter)),
            move_offers: Mutex::new(Some(offers)),
            mover: Mutex::new(Some(mover)),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.id
    }

    /// This node's store epoch now. It changes only if the store is found
    /// to have gone back in time (then the node starts a new one).
    pub fn epoch(&self) -> Epoch {
        *self.epoch.borrow()
    }

    /// A watch of the store's epoch.
    pub fn epoch_watch(&self) -> watch::Receiver<Epoch> {
        self.epoch.clone()
    }

    /// The UDP port the node listens on for peers.
    pub fn local_port(&self) -> u16 {
        crate::net::endpoint_port(&self.endpoint)
    }

    /// A ticket other nodes can add to reach this one.
    pub fn ticket(&self) -> NodeTicket {
        NodeTicket {
            node: self.id,
            addrs: endpoint_addrs(&self.endpoint),
        }
    }

    /// Sends `payload` to `to`; answers once it is committed to the outbox
    /// (or refused, with nothing written). [`Node::submit`] of one message.
    ///
    /// # Errors
    /// [`SendError::Refused`] with the core's reason, [`SendError::Stopped`]
    /// if the node stopped before answering.
    pub async fn send(
        &self,
        to: NodeId,
        kind: u16,
        payload: Vec<u8>,
    ) -> Result<SendReceipt, SendError> {
        let msg = Outgoing::plain(to, kind, payload);
        let mut receipts = self.submit(vec![msg]).await.await;
        receipts.pop().unwrap_or(Err(SendError::Stopped))
    }

    /// Publishes `payload` to `topic`, of which this node is a member;
    /// answers once it is committed to this node's stream of the topic (or
    /// refused, with nothing written). Members get it as they connect.
    ///
    /// # Errors
    /// [`SendError::Refused`] with the core's reason (not a member, too
    /// large, busy, the store), [`SendError::Stopped`].
    pub async fn publish(
        &self,
        topic: mesh_protocol::TopicName,
        kind: u16,
        payload: Vec<u8>,
    ) -> Result<SendReceipt, SendError> {
        let mut answers = self.publish_many(topic, vec![(kind, payload)]).await;
        answers.pop().unwrap_or(Err(SendError::Stopped))
    }

    /// Publishes `msgs` (each a kind and a payload) to `topic`, in order,
    /// as one request: queued together or refused together (each answered
    /// with the same error), and answered each once committed, so that
    /// consecutive messages share commits. At most
    /// [`crate::core::WAITING_SENDS_MAX`] fit at once; the caller bounds a
    /// batch below that.
    pub async fn publish_many(
        &self,
        topic: mesh_protocol::TopicName,
        msgs: Vec<(u16, Vec<u8>)>,
    ) -> Vec<Result<SendReceipt, SendError>> {
        let n = msgs.len();
        let bytes = msgs.iter().map(|(_, p)| p.len()).sum::<usize>();
        let mut waiting = Vec::with_capacity(n);
        let mut tagged = Vec::with_capacity(n);
        for (kind, payload) in msgs {
            let (reply, rx) = oneshot::channel();
            tagged.push((kind, payload, reply));
            waiting.push(rx);
        }
        let sent = self
            .command_publish(Audience::Topic(topic), tagged, bytes)
            .await;
        let mut answers = Vec::with_capacity(n);
        for rx in waiting {
            answers.push(match sent {
                Err(()) => Err(SendError::Stopped),
                Ok(()) => rx
                    .await
                    .map_err(|_| SendError::Stopped)
                    .and_then(|r| r.map_err(SendError::Refused)),
            });
        }
        answers
    }

    /// Passes `forward` (a payload of `kind`: a [`mesh_protocol::Forward`]
    /// or a [`mesh_protocol::ForwardTrimmed`]) on to `to`, the new host of
    /// an agent that moved away from this node: answered
    /// with its receipt once committed, as a send is. It never makes room
    /// in a full outbox by a loss, whatever the outbox's policy: it is
    /// refused instead (its author was told the message was delivered).
    ///
    /// # Errors
    /// As a send: refused (not a forward, not a peer, the outbox full) or
    /// the node stopped.
    pub async fn forward(
        &self,
        to: NodeId,
        kind: u16,
        forward: Vec<u8>,
    ) -> Result<SendReceipt, SendError> {
        self.publish_to(Audience::Forward(to), kind, forward).await
    }

    /// Hands `payload` of `kind` for `to` to the task once the command
    /// budget has room for it, and waits for its receipt.
    async fn publish_to(
        &self,
        to: Audience,
        kind: u16,
        payload: Vec<u8>,
    ) -> Result<SendReceipt, SendError> {
        let bytes = payload.len();
        let (reply, rx) = oneshot::channel();
        self.command_publish(to, vec![(kind, payload, reply)], bytes)
            .await
            .map_err(|()| SendError::Stopped)?;
        rx.await
            .map_err(|_| SendError::Stopped)?
            .map_err(SendError::Refused)
    }

    /// Hands `msgs` (of `bytes` of payload) for `to` to the task once the
    /// command budget has room for them; `Err` if the task is gone.
    async fn command_publish(
        &self,
        to: Audience,
        msgs: Vec<(u16, Vec<u8>, actor::PublishReply)>,
        bytes: usize,
    ) -> Result<(), ()> {
        // More than the whole budget waits for all of it.
        let permits = u32::try_from(bytes.min(COMMAND_BYTES_MAX)).unwrap_or(u32::MAX);
        let budget = self
            .budget
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(drop)?;
        let cmd = Cmd::Publish { to, msgs, budget };
        self.commands.send(cmd).await.map_err(drop)
    }

    /// Joins the topic of `record` (or changes its bounds), durably: once
    /// committed this node takes the topic's messages and tells its peers.
    ///
    /// # Errors
    /// [`NodeError::Store`] if it cannot be written (256 topics at most),
    /// [`NodeError::Stopped`].
    pub async fn join_topic(&self, record: mesh_store::TopicRecord) -> Result<(), NodeError> {
        self.local_write(LocalWrite::JoinTopic(record))
            .await
            .map(drop)
    }

    /// Leaves `topic`, durably: replication stops; what was journaled and
    /// what is held stay.
    ///
    /// # Errors
    /// [`NodeError::Store`] if this node is not a member, [`NodeError::Stopped`].
    pub async fn leave_topic(&self, topic: mesh_protocol::TopicName) -> Result<(), NodeError> {
        self.local_write(LocalWrite::LeaveTopic(topic))
            .await
            .map(drop)
    }

    /// Hands `msgs` to the node in the order given (messages to one peer get
    /// ascending seqs in that order; they may share a commit) and returns once
    /// every one is queued with the node; the returned [`Receipts`] resolves
    /// to one result per message, in order, each after its commit.
    ///
    /// Messages handed over by a later call are ordered after these, so a
    /// caller may submit the next batch while this one commits.
    pub async fn submit(&self, msgs: Vec<Outgoing>) -> Receipts {
        let mut receipts = Receipts::new(msgs.len());
        let mut msgs = msgs.into_iter().peekable();
        while msgs.peek().is_some() {
            let part: Vec<Outgoing> = msgs.by_ref().take(SUBMIT_PART_MSGS_MAX).collect();
            let n = part.len();
            let bytes = part.iter().map(|m| m.payload.len()).sum::<usize>();
            // A part larger than the whole budget waits for all of it.
            let permits = u32::try_from(bytes.min(COMMAND_BYTES_MAX)).unwrap_or(u32::MAX);
            let Ok(budget) = self.budget.clone().acquire_many_owned(permits).await else {
                receipts.stopped(n);
                continue;
            };
            let (reply, rx) = oneshot::channel();
            let cmd = Cmd::Submit {
                msgs: part,
                reply,
                budget,
            };
            match self.commands.send(cmd).await {
                Ok(()) => receipts.queued(n, rx),
                Err(_) => receipts.stopped(n),
            }
        }
        receipts
    }

    /// Adds `node` at `addrs` (or updates its addresses), durably; answers
    /// once the record is committed and the transport knows the peer. Other
    /// peers' connections are not touched.
    ///
    /// # Errors
    /// [`NodeError::Peer`] for a bad peer, [`NodeError::Store`] if the record
    /// cannot be written, [`NodeError::Stopped`].
    pub async fn add_peer(&self, node: NodeId, addrs: Vec<SocketAddr>) -> Result<(), NodeError> {
        if node == self.id {
            return Err(PeerError::SelfPeer.into());
        }
        if addrs.len() > MAX_TICKET_ADDRS {
            return Err(PeerError::TooManyAddrs(addrs.len()).into());
        }
        self.ask(|reply| Cmd::Peer {
            change: PeerChange::Add { node, addrs },
            reply,
        })
        .await?
    }

    /// Forgets `node`, durably, and closes its connection; its streams and
    /// marks stay in the store.
    ///
    /// # Errors
    /// As [`Node::add_peer`].
    pub async fn remove_peer(&self, node: NodeId) -> Result<(), NodeError> {
        self.ask(|reply| Cmd::Peer {
            change: PeerChange::Remove { node },
            reply,
        })
        .await?
    }

    /// Pauses (`paused = true`) or resumes the link to the known peer
    /// `node`, in the transport only: while paused it is not dialed and its
    /// connections are refused, so to the bus it is offline and sends to it
    /// wait in the outbox as for any offline peer. Resuming dials it at once.
    /// The pause is not stored: a restarted node has no paused link.
    ///
    /// # Errors
    /// [`NodeError::Peer`] with [`PeerError::UnknownPeer`] for a peer that is
    /// not known, [`NodeError::Stopped`] if the node has stopped.
    pub async fn set_peer_paused(&self, node: NodeId, paused: bool) -> Result<(), NodeError> {
        let r = self
            .ask(|reply| Cmd::Pause {
                node,
                paused,
                reply,
            })
            .await?;
        r.map_err(NodeError::from)
    }

    /// Sets the named durable cursor `name` to `arrival`, sequenced with the
    /// node's other commits; answers once it is committed.
    ///
    /// # Errors
    /// [`NodeError::Store`] if the store refuses it (a name out of bounds, an
    /// arrival past the journal head) or fails, [`NodeError::Stopped`].
    pub async fn put_cursor(&self, name: String, arrival: Arrival) -> Result<(), NodeError> {
        self.write(LocalWrite::PutCursor { name, arrival }).await?;
        Ok(())
    }

    /// Journals that the local subscriber `subscriber` missed the live
    /// journal entries `from..=to` (arrivals); answers with the record's own
    /// arrival once it is committed.
    ///
    /// # Errors
    /// As [`Node::put_cursor`].
    pub async fn record_subscriber_lag(
        &self,
        subscriber: String,
        from: Arrival,
        to: Arrival,
    ) -> Result<Arrival, NodeError> {
        let write = LocalWrite::SubscriberLagged {
            subscriber,
            from,
            to,
        };
        let receipt = self.write(write).await?;
        receipt.arrivals.map(|(first, _)| first).ok_or_else(|| {
            NodeError::Store(StoreError::Unavailable(
                "the lag record was committed without a journal arrival".into(),
            ))
        })
    }

    /// Applies the local write `write` (an agent, an alias, an agent's
    /// cursor, a lag record of an agent's subscription), sequenced with the
    /// node's other commits; answers its receipt once it is committed.
    ///
    /// # Errors
    /// As [`Node::put_cursor`].
    pub async fn local_write(&self, write: LocalWrite) -> Result<Receipt, NodeError> {
        self.write(write).await
    }

    /// Announces a newly signed card of one of this node's agents to every
    /// connected peer (not stored: the daemon signs one at every start).
    ///
    /// # Errors
    /// [`NodeError::Stopped`] if the node has stopped.
    pub async fn announce_agent(&self, card: mesh_protocol::AgentCard) -> Result<(), NodeError> {
        self.commands
            .send(Cmd::AgentCard { card })
            .await
            .map_err(|_| NodeError::Stopped)
    }

    async fn write(&self, write: LocalWrite) -> Result<Receipt, NodeError> {
        let r = self.ask(|reply| Cmd::Write { write, reply }).await?;
        r.map_err(NodeError::from)
    }

    /// Sends the command `cmd` builds and waits for its answer.
    async fn ask<R>(&self, cmd: impl FnOnce(oneshot::Sender<R>) -> Cmd) -> Result<R, NodeError> {
        ask(&self.commands, cmd).await
    }

    /// The agent move offers peers make to this node, to import and answer
    /// ([`MoveOffer::answer`]); `None` after the first call. Until they are
    /// taken, and while the taker does not answer, an offer waits at most
    /// [`MOVE_ANSWER_TIMEOUT`] and is then refused as busy.
    pub fn take_move_offers(&self) -> Option<MoveOffers> {
        self.move_offers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Offers the agent export `body` to the peer `to` on the move link and
    /// returns its answer (see `moving`), within [`MOVE_TIMEOUT`]. QUIC's
    /// TLS to `to`'s node key keeps it secret on the way.
    ///
    /// # Errors
    /// [`MoveError::NotPeer`] or [`MoveError::Paused`] before anything is
    /// sent; the peer's refusal, or unreachable, after.
    pub async fn offer_move(&self, to: NodeId, body: Vec<u8>) -> Result<Vec<u8>, MoveError> {
        let status = self.status().await.map_err(|_| MoveError::Stopped)?;
        let peer = status
            .peers
            .iter()
            .find(|p| p.node == to)
            .ok_or(MoveError::NotPeer(to))?;
        if peer.paused {
            return Err(MoveError::Paused(to));
        }
        moving::offer(&self.endpoint, to, &peer.addrs, &self.relays, &body).await
    }

    /// A watch of the last journal position written; it moves after every
    /// commit that journals something. The node task is its only writer.
    pub fn journal_head(&self) -> watch::Receiver<Arrival> {
        self.head.clone()
    }

    /// This node's name and its peers' names as their newest cards say,
    /// now: updated by the node task whenever it commits a newer card or a
    /// peer is added or removed.
    pub fn node_names(&self) -> NodeNames {
        self.names.borrow().clone()
    }

    /// A watch of the agents' move notices this node holds (the one that
    /// wins per agent), changed whenever a newer one is taken.
    pub fn agent_moves(&self) -> watch::Receiver<AgentMoves> {
        self.moves.clone()
    }

    /// A watch of the agents that moved away from this node whose every
    /// peer follows the move (`Followed`) and has been received as far as
    /// it said: their previous inbox gets nothing more.
    pub fn drains_followed(&self) -> watch::Receiver<DrainsFollowed> {
        self.followed.clone()
    }

    /// The node's state now, as the node task sees it after every input
    /// taken before this request.
    ///
    /// # Errors
    /// [`NodeError::Stopped`] if the node has stopped.
    pub async fn status(&self) -> Result<NodeStatus, NodeError> {
        self.ask(|reply| Cmd::Status { reply }).await
    }

    /// Stops taking requests, waits (at most [`SHUTDOWN_DRAIN`]) until what
    /// is being committed is answered, then closes the transport. Sends held
    /// while the store is down are not waited for: they are answered
    /// [`SendError::Stopped`], never as sent. Later calls return at once.
    pub async fn shutdown(&self) {
        self.closing.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            // A panic in the task has been logged by tokio already.
            let _ = task.await;
        }
        let inviter = self
            .inviter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(inviter) = inviter {
            let _ = inviter.await;
        }
        let mover = self.mover.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mover) = mover {
            let _ = mover.await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.closing.send_replace(true);
    }
}

/// Sends the command `cmd` builds to the node task and waits for its answer.
async fn ask<R>(
    commands: &mpsc::Sender<Cmd>,
    cmd: impl FnOnce(oneshot::Sender<R>) -> Cmd,
) -> Result<R, NodeError> {
    let (reply, answer) = oneshot::channel();
    commands
        .send(cmd(reply))
        .await
        .map_err(|_| NodeError::Stopped)?;
    answer.await.map_err(|_| NodeError::Stopped)
}

/// Runs `f` on the blocking pool (store reads block).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(StoreError::Unavailable(format!(
            "store read task failed: {e}"
        )))
    })
}
