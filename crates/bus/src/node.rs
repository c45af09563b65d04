//! The node: one task that joins the [`Core`], the store's writer actor and
//! the [`Net`] transport, and the handle the daemon talks to.
//!
//! The task runs one `select!` loop. Inputs to the core are the transport's
//! events, local sends, store answers and the core's one timer; it feeds the
//! input it woke for together with those already queued behind it (at most
//! `INPUTS_PER_TURN_MAX` items, so a burst shares one commit), then carries
//! out every effect in order:
//!
//! - `SendFrame`: queued on the connection; if its queue is full, the frame
//!   waits in a per-peer backlog ([`BACKLOG_BYTES_MAX`]) drained as the queue
//!   empties. A peer whose backlog overflows is disconnected (it catches up
//!   from the outbox after it reconnects);
//! - `Persist`: `StoreHandle::commit_groups`, answered with `Committed`;
//! - `LoadOutbox`: read on the blocking pool once the peer's backlog is
//!   empty (this paces a catch-up to what the peer takes), answered with
//!   `OutboxLoaded`;
//! - `Reply`: the local sender's answer; `Journaled`: the journal head watch;
//!   `SetTimer`: re-arms the timer; `CloseConnection`: closes it with
//!   [`close_code::PROTOCOL_VIOLATION`].
//!
//! Adding or removing a peer goes through the core (`PeerAdded`,
//! `PeerRemoved`), which writes the peer record with its next commit; once
//! that returns (`PeerChanged`) the task tells the transport and answers the
//! caller. Other peers and their connections are untouched.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesh_protocol::{Epoch, Frame, MAX_TICKET_ADDRS, NodeId, NodeTicket, SecretKey, Seq, StreamId};
use mesh_store::{Arrival, MeshStore, OwnStream, PeerRecord, StoreError, StoreHandle, StoredBatch};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tracing::{debug, error, info, warn};

use crate::core::{
    self, CommitId, Core, Effect, Input, LoadId, Metrics, Millis, PeerChangeError, Recovered,
    ReqId, SendReceipt,
};
use crate::net::{self, Net, NetConfig, NetCounters, NetError, NetEvent, PeerError, close_code};

/// Local requests queued for the node task.
pub const COMMANDS_CAPACITY: usize = 1024;

/// Bytes of frames (payloads plus a fixed overhead each) held for one peer
/// whose send queue is full, before that peer is disconnected as too slow.
pub const BACKLOG_BYTES_MAX: usize = 8 * 1024 * 1024;

/// How long shutdown waits for commits under way to be answered.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Bytes a frame counts for in a backlog besides its payloads.
const FRAME_OVERHEAD_BYTES: usize = 256;

/// Items (store answers, transport events, local requests) already queued
/// that the task takes in one turn, after the one it woke for, and feeds the
/// core together: a burst then shares one commit.
const INPUTS_PER_TURN_MAX: usize = 256;

/// How to start a node.
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    /// The transport.
    pub net: NetConfig,
    /// The core.
    pub core: core::Config,
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
    /// The peer could not be added or removed.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// The core refused the peer change.
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

/// A snapshot of the node for status pages and metrics.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeStatus {
    /// This node's id.
    pub node: NodeId,
    /// Its store epoch.
    pub epoch: Epoch,
    /// A ticket other nodes can add.
    pub ticket: NodeTicket,
    /// Every known peer.
    pub peers: Vec<NodePeer>,
    /// The last journal position written.
    pub journal_head: Arrival,
    /// Transport counters.
    pub net: NetCounters,
    /// Core counters.
    pub core: Metrics,
}

/// One peer in a [`NodeStatus`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodePeer {
    /// The peer.
    pub node: NodeId,
    /// Where it is dialed.
    pub addrs: Vec<SocketAddr>,
    /// Its live connection, if any.
    pub conn: Option<net::ConnId>,
    /// This node's stream to it, as committed (`None` before the first message).
    pub own_stream: Option<OwnStream>,
    /// Whether the link to it is paused ([`Node::set_peer_paused`]).
    pub paused: bool,
}

/// A request from the handle to the task.
enum Cmd {
    Send {
        to: NodeId,
        kind: u16,
        payload: Vec<u8>,
        reply: oneshot::Sender<Result<SendReceipt, core::SendError>>,
    },
    Peer {
        change: PeerChange,
        reply: oneshot::Sender<Result<(), NodeError>>,
    },
    Status {
        reply: oneshot::Sender<CoreView>,
    },
}

enum PeerChange {
    Add {
        node: NodeId,
        addrs: Vec<SocketAddr>,
    },
    Remove {
        node: NodeId,
    },
}

/// What only the task can read: the core's state.
struct CoreView {
    metrics: Metrics,
    own: HashMap<NodeId, OwnStream>,
}

/// The running node. Dropping it stops the node in the background; prefer
/// [`Node::shutdown`], which waits.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    epoch: Epoch,
    net: Arc<Net>,
    commands: mpsc::Sender<Cmd>,
    head: Arc<watch::Sender<Arrival>>,
    closing: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Node {
    /// Reads the committed state from `store`, binds the transport with
    /// `secret`, makes every stored peer known to it and starts the task.
    ///
    /// # Errors
    /// [`NodeError::Store`] if the store cannot be read, [`NodeError::Net`] if
    /// the transport cannot bind.
    pub async fn start<S: MeshStore + ?Sized>(
        config: NodeConfig,
        secret: SecretKey,
        store: StoreHandle<S>,
    ) -> Result<Node, NodeError> {
        let reader = store.reader();
        let (recovered, head) = blocking(move || {
            let recovered = Recovered::read(&*reader)?;
            Ok((recovered, reader.journal_head()?))
        })
        .await?;
        let (net, events) = Net::bind(config.net.clone(), secret.clone()).await?;
        let net = Arc::new(net);
        let id = net.node_id();
        for p in recovered.peers.iter().filter(|p| p.node != id) {
            let addrs = p.addrs.iter().copied().take(MAX_TICKET_ADDRS).collect();
            net.add_peer(p.node, addrs).await?;
        }
        let epoch = recovered.epoch;
        let core = Core::new(config.core.clone(), secret.clone(), recovered);
        let (commands, commands_rx) = mpsc::channel(COMMANDS_CAPACITY);
        let head = Arc::new(watch::Sender::new(head));
        let (closing, closing_rx) = watch::channel(false);
        let task = Driver {
            core,
            store,
            net: net.clone(),
            events,
            commands: commands_rx,
            closing: closing_rx,
            head: head.clone(),
            store_tasks: JoinSet::new(),
            owed: HashMap::new(),
            replies: HashMap::new(),
            next_req: 1,
            timer: None,
            backlogs: HashMap::new(),
            writable: JoinSet::new(),
            peer_replies: HashMap::new(),
        };
        let task = tokio::spawn(task.run());
        info!(node = %id.fmt_short(), epoch = %epoch.fmt_short(), addrs = ?net.local_addrs(), "node started");
        Ok(Node {
            id,
            epoch,
            net,
            commands,
            head,
            closing,
            task: std::sync::Mutex::new(Some(task)),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.id
    }

    /// This node's store epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// A ticket other nodes can add to reach this one.
    pub fn ticket(&self) -> NodeTicket {
        self.net.ticket()
    }

    /// Sends `payload` to `to`; answers once it is committed to the outbox
    /// (or refused, with nothing written).
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
        let (reply, answer) = oneshot::channel();
        let cmd = Cmd::Send {
            to,
            kind,
            payload,
            reply,
        };
        self.commands
            .send(cmd)
            .await
            .map_err(|_| SendError::Stopped)?;
        answer
            .await
            .map_err(|_| SendError::Stopped)?
            .map_err(SendError::Refused)
    }

    /// Sends each message of `msgs` (`(to, kind, payload)`) as [`Node::send`]
    /// does, handing them to the node in the order given, so the messages to
    /// one peer get ascending seqs in that order; they may share a commit.
    /// Answers once every one is committed or refused, in the order given.
    pub async fn send_many(
        &self,
        msgs: impl IntoIterator<Item = (NodeId, u16, Vec<u8>)>,
    ) -> Vec<Result<SendReceipt, SendError>> {
        // Queue every command first, one after another: awaiting separate
        // `send` futures together would hand them over in whatever order
        // they happen to be polled.
        let mut answers = Vec::new();
        for (to, kind, payload) in msgs {
            let (reply, answer) = oneshot::channel();
            let cmd = Cmd::Send {
                to,
                kind,
                payload,
                reply,
            };
            let queued = self.commands.send(cmd).await.is_ok();
            answers.push(queued.then_some(answer));
        }
        let mut receipts = Vec::with_capacity(answers.len());
        for answer in answers {
            let receipt = match answer {
                Some(answer) => answer
                    .await
                    .map_err(|_| SendError::Stopped)
                    .and_then(|r| r.map_err(SendError::Refused)),
                None => Err(SendError::Stopped),
            };
            receipts.push(receipt);
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
        self.change(PeerChange::Add { node, addrs }).await
    }

    /// Forgets `node`, durably, and closes its connection; its streams and
    /// marks stay in the store.
    ///
    /// # Errors
    /// As [`Node::add_peer`].
    pub async fn remove_peer(&self, node: NodeId) -> Result<(), NodeError> {
        self.change(PeerChange::Remove { node }).await
    }

    /// Pauses (`paused = true`) or resumes the link to the known peer
    /// `node`, in the transport only: while paused it is not dialed and its
    /// connections are refused, so to the bus it is offline and sends to it
    /// wait in the outbox as for any offline peer. Resuming dials it at once.
    /// The pause is not stored: a restarted node has no paused link.
    ///
    /// # Errors
    /// [`NodeError::Peer`] with [`PeerError::UnknownPeer`] for a peer that is
    /// not known, [`NodeError::Stopped`] if the transport has shut down.
    pub async fn set_peer_paused(&self, node: NodeId, paused: bool) -> Result<(), NodeError> {
        match self.net.set_paused(node, paused).await {
            Err(PeerError::ShutDown) => Err(NodeError::Stopped),
            other => other.map_err(NodeError::from),
        }
    }

    async fn change(&self, change: PeerChange) -> Result<(), NodeError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Cmd::Peer { change, reply })
            .await
            .map_err(|_| NodeError::Stopped)?;
        answer.await.map_err(|_| NodeError::Stopped)?
    }

    /// A watch of the last journal position written; it moves after every
    /// commit that journals something.
    pub fn journal_head(&self) -> watch::Receiver<Arrival> {
        self.head.subscribe()
    }

    /// The sender behind [`Node::journal_head`], for other writers of the
    /// journal (such as the API's own commits) to announce their commits.
    pub fn journal_head_sender(&self) -> Arc<watch::Sender<Arrival>> {
        self.head.clone()
    }

    /// The node's state now.
    ///
    /// # Errors
    /// [`NodeError::Stopped`] if the node has stopped.
    pub async fn status(&self) -> Result<NodeStatus, NodeError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Cmd::Status { reply })
            .await
            .map_err(|_| NodeError::Stopped)?;
        let view = answer.await.map_err(|_| NodeError::Stopped)?;
        let peers = self
            .net
            .peers()
            .into_iter()
            .map(|p| NodePeer {
                own_stream: view.own.get(&p.node).cloned(),
                node: p.node,
                addrs: p.addrs,
                conn: p.conn,
                paused: p.paused,
            })
            .collect();
        Ok(NodeStatus {
            node: self.id,
            epoch: self.epoch,
            ticket: self.net.ticket(),
            peers,
            journal_head: *self.head.borrow(),
            net: self.net.counters(),
            core: view.metrics,
        })
    }

    /// Stops taking requests, waits (at most [`SHUTDOWN_DRAIN`]) until what
    /// is being committed is answered, then closes the transport. Later
    /// calls return at once.
    pub async fn shutdown(&self) {
        self.closing.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            // A panic in the task has been logged by tokio already.
            let _ = task.await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.closing.send_replace(true);
    }
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

/// The driver's clock: milliseconds since the Unix epoch.
fn now() -> Millis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Millis(ms)
}

/// What a frame counts for in a backlog.
fn frame_cost(frame: &Frame) -> usize {
    match frame {
        Frame::Batch { payloads, .. } => {
            payloads.0.iter().map(Vec::len).sum::<usize>() + FRAME_OVERHEAD_BYTES
        }
        _ => FRAME_OVERHEAD_BYTES,
    }
}

/// An outbox read the core asked for.
struct LoadReq {
    load: LoadId,
    stream: StreamId,
    after: Seq,
    max_bytes: u64,
}

/// What a store task owes the core, kept in case the task panics.
enum Owed {
    Commit { commit: CommitId, groups: usize },
    Load(LoadId),
}

/// Frames for one peer's connection that did not fit its send queue, and
/// the outbox reads that wait for them to go out.
struct Backlog {
    conn: net::ConnId,
    frames: VecDeque<Frame>,
    bytes: usize,
    loads: Vec<LoadReq>,
}

enum Step {
    Closing,
    Store(Result<(tokio::task::Id, Input), JoinError>),
    Writable(Result<(NodeId, net::ConnId, Result<(), net::SendError>), JoinError>),
    Timer,
    Net(NetEvent),
    Cmd(Cmd),
}

struct Driver<S: MeshStore + ?Sized> {
    core: Core,
    store: StoreHandle<S>,
    net: Arc<Net>,
    events: mpsc::Receiver<NetEvent>,
    commands: mpsc::Receiver<Cmd>,
    closing: watch::Receiver<bool>,
    head: Arc<watch::Sender<Arrival>>,
    store_tasks: JoinSet<Input>,
    owed: HashMap<tokio::task::Id, Owed>,
    replies: HashMap<ReqId, oneshot::Sender<Result<SendReceipt, core::SendError>>>,
    next_req: u64,
    timer: Option<Millis>,
    backlogs: HashMap<NodeId, Backlog>,
    writable: JoinSet<(NodeId, net::ConnId, Result<(), net::SendError>)>,
    /// Peer changes the core is committing, with their callers.
    peer_replies: HashMap<ReqId, (PeerChange, oneshot::Sender<Result<(), NodeError>>)>,
}

impl<S: MeshStore + ?Sized> Driver<S> {
    async fn run(mut self) {
        let mut drain_until: Option<tokio::time::Instant> = None;
        loop {
            if drain_until.is_none() && *self.closing.borrow() {
                drain_until = Some(tokio::time::Instant::now() + SHUTDOWN_DRAIN);
            }
            if let Some(deadline) = drain_until
                && (!self.core.is_committing() || tokio::time::Instant::now() >= deadline)
            {
                break;
            }
            // While stopping, only answers and timers get in.
            let paused = drain_until.is_some();
            let timer = self.timer;
            let sleep = tokio::time::sleep(Duration::from_millis(
                timer.map_or(0, |at| at.0.saturating_sub(now().0)),
            ));
            let drain_sleep =
                tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now));
            let step = tokio::select! {
                _ = self.closing.wait_for(|c| *c), if drain_until.is_none() => Step::Closing,
                _ = drain_sleep, if drain_until.is_some() => Step::Closing,
                Some(res) = self.store_tasks.join_next_with_id(), if !self.store_tasks.is_empty() => Step::Store(res),
                Some(res) = self.writable.join_next(), if !self.writable.is_empty() => Step::Writable(res),
                _ = sleep, if timer.is_some() => Step::Timer,
                ev = self.events.recv(), if !paused => match ev {
                    Some(ev) => Step::Net(ev),
                    None => Step::Closing,
                },
                cmd = self.commands.recv(), if !paused => match cmd {
                    Some(cmd) => Step::Cmd(cmd),
                    // Every handle is gone.
                    None => Step::Closing,
                },
            };
            let mut inputs = Vec::new();
            match step {
                Step::Closing => {
                    if drain_until.is_none() {
                        drain_until = Some(tokio::time::Instant::now() + SHUTDOWN_DRAIN);
                    }
                }
                Step::Store(res) => self.on_store(res, &mut inputs),
                Step::Writable(res) => self.on_writable(res),
                Step::Timer => {
                    self.timer = None;
                    inputs.push(Input::Timer);
                }
                Step::Net(ev) => self.on_net(ev, &mut inputs),
                Step::Cmd(cmd) => self.on_cmd(cmd, &mut inputs),
            }
            if !inputs.is_empty() {
                self.gather(&mut inputs, paused);
                self.core.handle_many(inputs, now());
            }
            self.carry_out().await;
        }
        if self.core.is_committing() {
            warn!("stopping with a commit still unanswered; its senders are told the node stopped");
        }
        // Dropping these tells waiting peer changes the node stopped.
        self.peer_replies.clear();
        // Dropping the reply senders tells waiting senders the node stopped.
        self.replies.clear();
        self.writable.shutdown().await;
        self.net.shutdown().await;
        info!("node stopped");
    }

    /// Takes what is already queued, at most [`INPUTS_PER_TURN_MAX`] items
    /// and one of each source in turn (only store answers while `paused`),
    /// adding their inputs to `inputs`.
    fn gather(&mut self, inputs: &mut Vec<Input>, paused: bool) {
        let mut taken = 0;
        while taken < INPUTS_PER_TURN_MAX {
            let before = taken;
            if let Some(res) = self.store_tasks.try_join_next_with_id() {
                self.on_store(res, inputs);
                taken += 1;
            }
            if !paused {
                if let Ok(ev) = self.events.try_recv() {
                    self.on_net(ev, inputs);
                    taken += 1;
                }
                if let Ok(cmd) = self.commands.try_recv() {
                    self.on_cmd(cmd, inputs);
                    taken += 1;
                }
            }
            if taken == before {
                break;
            }
        }
    }

    fn on_store(
        &mut self,
        res: Result<(tokio::task::Id, Input), JoinError>,
        inputs: &mut Vec<Input>,
    ) {
        let input = match res {
            Ok((id, answer)) => {
                self.owed.remove(&id);
                answer
            }
            Err(e) => {
                // A store task panicked: answer what it owed, as a failure.
                let Some(owed) = self.owed.remove(&e.id()) else {
                    return;
                };
                error!(error = %e, "store task failed");
                let why = || StoreError::Unavailable(format!("store task failed: {e}"));
                match owed {
                    Owed::Commit { commit, groups } => Input::Committed {
                        commit,
                        results: (0..groups).map(|_| Err(why())).collect(),
                    },
                    Owed::Load(load) => Input::OutboxLoaded {
                        load,
                        result: Err(why()),
                    },
                }
            }
        };
        inputs.push(input);
    }

    fn on_net(&mut self, ev: NetEvent, inputs: &mut Vec<Input>) {
        let input = match ev {
            NetEvent::Connected { peer, conn } => Input::PeerConnected {
                peer,
                conn: core::ConnId(conn.0),
            },
            NetEvent::Frame {
                peer, conn, frame, ..
            } => {
                // The event's receive lease is dropped here: the core owns its own bounds.
                let conn = core::ConnId(conn.0);
                match frame {
                    Frame::Batch { batch, payloads } => Input::Batch {
                        peer,
                        conn,
                        batch: core::open_batch(batch, payloads.0),
                    },
                    frame => Input::Frame { peer, conn, frame },
                }
            }
            NetEvent::Disconnected { peer, conn, reason } => {
                debug!(peer = %peer.fmt_short(), %conn, %reason, "peer disconnected");
                if self.backlogs.get(&peer).is_some_and(|b| b.conn == conn) {
                    self.release_backlog(peer);
                }
                Input::PeerDisconnected {
                    peer,
                    conn: core::ConnId(conn.0),
                }
            }
        };
        inputs.push(input);
    }

    fn on_cmd(&mut self, cmd: Cmd, inputs: &mut Vec<Input>) {
        match cmd {
            Cmd::Send {
                to,
                kind,
                payload,
                reply,
            } => {
                let req = ReqId(self.next_req);
                self.next_req += 1;
                self.replies.insert(req, reply);
                inputs.push(Input::Send {
                    req,
                    to,
                    kind,
                    payload,
                });
            }
            Cmd::Peer { change, reply } => {
                let req = ReqId(self.next_req);
                self.next_req += 1;
                let input = match &change {
                    PeerChange::Add { node, addrs } => Input::PeerAdded {
                        req,
                        record: PeerRecord {
                            node: *node,
                            addrs: addrs.clone(),
                            epoch: None,
                        },
                    },
                    PeerChange::Remove { node } => Input::PeerRemoved { req, node: *node },
                };
                self.peer_replies.insert(req, (change, reply));
                inputs.push(input);
            }
            Cmd::Status { reply } => {
                // The answer reflects every input taken before it.
                if !inputs.is_empty() {
                    self.core.handle_many(inputs.drain(..), now());
                }
                let own = self
                    .net
                    .peers()
                    .into_iter()
                    .filter_map(|p| Some((p.node, self.core.own_stream(&p.node)?.clone())))
                    .collect();
                let _ = reply.send(CoreView {
                    metrics: self.core.metrics().clone(),
                    own,
                });
            }
        }
    }

    /// Carries out every effect the core has queued, in order.
    async fn carry_out(&mut self) {
        while let Some(effect) = self.core.poll_effect() {
            match effect {
                Effect::SendFrame { peer, conn, frame } => {
                    self.send_frame(peer, net::ConnId(conn.0), frame).await;
                }
                Effect::Persist { commit, groups } => {
                    let store = self.store.clone();
                    let n = groups.len();
                    let task = self.store_tasks.spawn(async move {
                        let results = store.commit_groups(groups).await;
                        Input::Committed { commit, results }
                    });
                    self.owed
                        .insert(task.id(), Owed::Commit { commit, groups: n });
                }
                Effect::LoadOutbox {
                    load,
                    peer,
                    stream,
                    after,
                    max_bytes,
                } => {
                    let req = LoadReq {
                        load,
                        stream,
                        after,
                        max_bytes,
                    };
                    match self.backlogs.get_mut(&peer) {
                        // Only once the frames before it have gone to the connection.
                        Some(b) => b.loads.push(req),
                        None => self.spawn_load(req),
                    }
                }
                Effect::Reply { req, result } => {
                    if let Some(reply) = self.replies.remove(&req) {
                        let _ = reply.send(result);
                    }
                }
                Effect::Journaled { upto } => {
                    self.head.send_if_modified(|h| {
                        let moved = upto > *h;
                        *h = (*h).max(upto);
                        moved
                    });
                }
                Effect::SetTimer { at } => self.timer = Some(at),
                Effect::PeerChanged { req, node, result } => {
                    self.on_peer_changed(req, node, result).await;
                }
                // This driver feeds no Input::Write yet, so none is owed an answer.
                Effect::Written { .. } => {}
                Effect::CloseConnection { peer, conn, reason } => {
                    warn!(peer = %peer.fmt_short(), %conn, %reason, "closing a connection: the peer broke the protocol");
                    let reason = reason.to_string();
                    let code = close_code::PROTOCOL_VIOLATION;
                    let _ = self
                        .net
                        .close(peer, net::ConnId(conn.0), code, &reason)
                        .await;
                }
            }
        }
    }

    fn spawn_load(&mut self, req: LoadReq) {
        let reader = self.store.reader();
        let LoadReq {
            load,
            stream,
            after,
            max_bytes,
        } = req;
        let task = self.store_tasks.spawn(async move {
            let result: Result<Vec<StoredBatch>, StoreError> =
                blocking(move || reader.read_outbox(&stream, after, max_bytes)).await;
            Input::OutboxLoaded { load, result }
        });
        self.owed.insert(task.id(), Owed::Load(load));
    }

    async fn send_frame(&mut self, peer: NodeId, conn: net::ConnId, frame: Frame) {
        if let Some(b) = self.backlogs.get_mut(&peer) {
            if b.conn == conn {
                b.bytes += frame_cost(&frame);
                b.frames.push_back(frame);
                if b.bytes > BACKLOG_BYTES_MAX {
                    warn!(peer = %peer.fmt_short(), %conn, "peer does not keep up; disconnecting it");
                    self.release_backlog(peer);
                    let code = close_code::SLOW_PEER;
                    let _ = self.net.close(peer, conn, code, "peer too slow").await;
                }
                return;
            }
            // The backlog belongs to a connection that is gone.
            self.release_backlog(peer);
        }
        match self.net.try_send(peer, conn, &frame) {
            Ok(()) => {}
            Err(net::SendError::QueueFull) => {
                let bytes = frame_cost(&frame);
                let frames = VecDeque::from([frame]);
                let backlog = Backlog {
                    conn,
                    frames,
                    bytes,
                    loads: Vec::new(),
                };
                self.backlogs.insert(peer, backlog);
                self.wait_writable(peer, conn);
            }
            // The core recovers frames of a connection that is gone.
            Err(net::SendError::NotConnected) => {}
            Err(e) => error!(peer = %peer.fmt_short(), error = %e, "frame not sent"),
        }
    }

    fn wait_writable(&mut self, peer: NodeId, conn: net::ConnId) {
        let net = self.net.clone();
        self.writable
            .spawn(async move { (peer, conn, net.writable(peer, conn).await) });
    }

    fn on_writable(
        &mut self,
        res: Result<(NodeId, net::ConnId, Result<(), net::SendError>), JoinError>,
    ) {
        let Ok((peer, conn, ready)) = res else { return };
        let Some(b) = self.backlogs.get_mut(&peer).filter(|b| b.conn == conn) else {
            return;
        };
        if ready.is_ok() {
            while let Some(frame) = b.frames.front() {
                match self.net.try_send(peer, conn, frame) {
                    Ok(()) => {
                        b.bytes = b.bytes.saturating_sub(frame_cost(frame));
                        b.frames.pop_front();
                    }
                    Err(net::SendError::QueueFull) => {
                        self.wait_writable(peer, conn);
                        return;
                    }
                    Err(_) => break,
                }
            }
        }
        self.release_backlog(peer);
    }

    /// Drops a peer's backlog (sent or useless) and starts the reads it held.
    fn release_backlog(&mut self, peer: NodeId) {
        if let Some(b) = self.backlogs.remove(&peer) {
            for req in b.loads {
                self.spawn_load(req);
            }
        }
    }

    /// The core committed (or failed to commit) a peer change: tell the
    /// transport, then the caller.
    async fn on_peer_changed(
        &mut self,
        req: ReqId,
        node: NodeId,
        result: Result<(), PeerChangeError>,
    ) {
        let Some((change, reply)) = self.peer_replies.remove(&req) else {
            return;
        };
        let result = match result {
            Err(PeerChangeError::Store(e)) => Err(NodeError::Store(e)),
            Err(e) => Err(NodeError::PeerChange(e)),
            Ok(()) => match change {
                PeerChange::Add { node, addrs } => {
                    info!(peer = %node.fmt_short(), ?addrs, "peer added");
                    self.net
                        .add_peer(node, addrs)
                        .await
                        .map_err(NodeError::from)
                }
                PeerChange::Remove { node } => {
                    info!(peer = %node.fmt_short(), "peer removed");
                    if self.backlogs.contains_key(&node) {
                        self.release_backlog(node);
                    }
                    self.net.remove_peer(node).await.map_err(NodeError::from)
                }
            },
        };
        if let Err(e) = &result {
            warn!(peer = %node.fmt_short(), error = %e, "peer change failed");
        }
        let _ = reply.send(result);
    }
}
