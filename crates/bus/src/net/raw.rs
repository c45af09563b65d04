//! [`Net`]: a transport on its own, without a core, for tools and tests that
//! speak frames directly (a hostile peer in the fault harness, the
//! transport's own tests). The node does not use it: it owns its
//! [`super::Transport`] in its one loop.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use iroh::Endpoint;
use mesh_protocol::{Frame, NodeId, NodeTicket, SecretKey};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, error_span};

use super::counters::{Counters, NetCounters};
use super::transport::{Event, PeerStatus, Transport};
use super::{DisconnectReason, NetConfig, NetError, PeerError, RecvLease, SendError, endpoint};
use crate::core::ConnId;

/// Bytes queued on a connection at which [`Net::try_send`] answers
/// [`SendError::QueueFull`] (and [`Net::send`] waits for the writer).
pub const NET_QUEUE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Events waiting for the [`Net`] user; the transport waits beyond it
/// (its own bounds then hold the rest).
pub const NET_EVENTS_MAX: usize = 1024;

/// Requests from the handle waiting for its task.
const COMMANDS_MAX: usize = 64;

/// What a [`Net`] reports, in order per peer: a connection's `Connected`,
/// its frames, then its `Disconnected`; a replacing connection only after
/// the one it replaces has been reported gone.
#[derive(Debug)]
#[non_exhaustive]
pub enum NetEvent {
    /// A connection to `peer` is live; frames may be sent on `conn`.
    Connected {
        /// The peer.
        peer: NodeId,
        /// The new connection.
        conn: ConnId,
    },
    /// A frame arrived from `peer` on `conn` (not verified: a raw transport
    /// checks nothing but the frame's size and encoding).
    #[non_exhaustive]
    Frame {
        /// The peer.
        peer: NodeId,
        /// The connection it came on.
        conn: ConnId,
        /// The decoded frame.
        frame: Frame,
        /// The frame's share of the receive budget, returned when dropped.
        lease: RecvLease,
    },
    /// `conn` to `peer` is gone; nothing more arrives on it.
    Disconnected {
        /// The peer.
        peer: NodeId,
        /// The connection that ended.
        conn: ConnId,
        /// Why it ended.
        reason: DisconnectReason,
    },
}

enum Command {
    AddPeer(
        NodeId,
        Vec<SocketAddr>,
        oneshot::Sender<Result<(), PeerError>>,
    ),
    RemovePeer(NodeId, oneshot::Sender<()>),
    SetPaused(NodeId, bool, oneshot::Sender<Result<(), PeerError>>),
    Peers(oneshot::Sender<Vec<PeerStatus>>),
    Send(Outgoing),
    Close(NodeId, ConnId, u32, String),
}

/// A frame to queue, and whether to wait while the queue is full.
struct Outgoing {
    peer: NodeId,
    conn: ConnId,
    frame: Frame,
    wait: bool,
    reply: oneshot::Sender<Result<(), SendError>>,
}

/// A raw transport handle. Dropping it without [`Net::shutdown`] shuts the
/// transport down in the background.
#[derive(Debug)]
pub struct Net {
    id: NodeId,
    endpoint: Endpoint,
    counters: Arc<Counters>,
    commands: mpsc::Sender<Command>,
    closing: watch::Sender<bool>,
    /// Taken by the first [`Net::shutdown`].
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Net {
    /// Binds the endpoint and starts the transport's task.
    ///
    /// Returns the handle and the receiver of every [`NetEvent`] (bounded by
    /// [`NET_EVENTS_MAX`]). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`NetError::AddrInUse`] or [`NetError::Bind`] if the address cannot be bound.
    pub async fn bind(
        config: NetConfig,
        secret_key: SecretKey,
    ) -> Result<(Net, mpsc::Receiver<NetEvent>), NetError> {
        let span = error_span!("net", me = %secret_key.public().fmt_short());
        let transport = Transport::bind(&config, secret_key, |f| f)
            .instrument(span.clone())
            .await?;
        let (events_tx, events) = mpsc::channel(NET_EVENTS_MAX);
        let (commands, commands_rx) = mpsc::channel(COMMANDS_MAX);
        let closing = watch::Sender::new(false);
        let net = Net {
            id: transport.node_id(),
            endpoint: transport.endpoint().clone(),
            counters: transport.counters(),
            commands,
            closing: closing.clone(),
            task: Mutex::new(None),
        };
        let driver = Driver {
            transport,
            waiting: HashMap::new(),
        };
        let run = driver.run(events_tx, commands_rx, closing.subscribe());
        let task = tokio::spawn(run.instrument(span));
        *net.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok((net, events))
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.id
    }

    /// The addresses a ticket names: the bound socket, or when bound to
    /// `0.0.0.0`, the interface addresses.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        endpoint::local_addrs(&self.endpoint)
    }

    /// A ticket for this node at [`Net::local_addrs`].
    pub fn ticket(&self) -> NodeTicket {
        NodeTicket {
            node: self.id,
            addrs: self.local_addrs(),
        }
    }

    /// Transport counters since bind.
    pub fn counters(&self) -> NetCounters {
        self.counters.snapshot()
    }

    async fn ask<R>(&self, cmd: impl FnOnce(oneshot::Sender<R>) -> Command) -> Option<R> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(cmd(tx)).await.ok()?;
        rx.await.ok()
    }

    /// Makes `node` a known peer at `addrs` (replacing addresses it had) and
    /// dials it at once. A peer with no addresses is accepted but not dialed.
    ///
    /// # Errors
    /// [`PeerError`] for too many peers or addresses, this node's own id, or a
    /// transport that has shut down.
    pub async fn add_peer(&self, node: NodeId, addrs: Vec<SocketAddr>) -> Result<(), PeerError> {
        let r = self.ask(|tx| Command::AddPeer(node, addrs, tx)).await;
        r.unwrap_or(Err(PeerError::ShutDown))
    }

    /// Forgets `node`: refuses it from now on and closes its connection.
    ///
    /// # Errors
    /// [`PeerError::ShutDown`] if the transport has shut down.
    pub async fn remove_peer(&self, node: NodeId) -> Result<(), PeerError> {
        let r = self.ask(|tx| Command::RemovePeer(node, tx)).await;
        r.ok_or(PeerError::ShutDown)
    }

    /// Pauses or resumes the link to the known peer `node`.
    ///
    /// # Errors
    /// [`PeerError::UnknownPeer`], or [`PeerError::ShutDown`].
    pub async fn set_paused(&self, node: NodeId, paused: bool) -> Result<(), PeerError> {
        let r = self.ask(|tx| Command::SetPaused(node, paused, tx)).await;
        r.unwrap_or(Err(PeerError::ShutDown))
    }

    /// The known peers and their live connections (empty once shut down).
    pub async fn peers(&self) -> Vec<PeerStatus> {
        self.ask(Command::Peers).await.unwrap_or_default()
    }

    async fn queue(
        &self,
        peer: NodeId,
        conn: ConnId,
        frame: &Frame,
        wait: bool,
    ) -> Result<(), SendError> {
        let frame = frame.clone();
        let r = self
            .ask(|reply| {
                Command::Send(Outgoing {
                    peer,
                    conn,
                    frame,
                    wait,
                    reply,
                })
            })
            .await;
        r.unwrap_or(Err(SendError::NotConnected))
    }

    /// Queues `frame` for `peer` on `conn` unless [`NET_QUEUE_BYTES_MAX`]
    /// are queued already.
    ///
    /// # Errors
    /// [`SendError::NotConnected`] if `conn` is not the peer's live connection,
    /// [`SendError::QueueFull`], or [`SendError::Frame`] if it does not encode.
    pub async fn try_send(
        &self,
        peer: NodeId,
        conn: ConnId,
        frame: &Frame,
    ) -> Result<(), SendError> {
        self.queue(peer, conn, frame, false).await
    }

    /// Queues `frame` for `peer` on `conn`, waiting while the queue is full.
    ///
    /// # Errors
    /// As [`Net::try_send`], except that it waits instead of answering
    /// `QueueFull`; `NotConnected` if the connection ends while waiting.
    pub async fn send(&self, peer: NodeId, conn: ConnId, frame: &Frame) -> Result<(), SendError> {
        self.queue(peer, conn, frame, true).await
    }

    /// Closes `conn` to `peer` with `code` and `reason` if it is the live
    /// connection; `Disconnected` follows as usual.
    ///
    /// # Errors
    /// [`PeerError::ShutDown`] if the transport has shut down.
    pub async fn close(
        &self,
        peer: NodeId,
        conn: ConnId,
        code: u32,
        reason: &str,
    ) -> Result<(), PeerError> {
        let cmd = Command::Close(peer, conn, code, reason.to_owned());
        self.commands
            .send(cmd)
            .await
            .map_err(|_| PeerError::ShutDown)
    }

    /// Closes every connection and the endpoint, and waits until the close
    /// frames are flushed. Later calls return at once.
    pub async fn shutdown(&self) {
        self.closing.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            // A panic in the task has been logged by tokio already.
            let _ = task.await;
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.closing.send_replace(true);
    }
}

/// The task behind a [`Net`]: its transport, and the senders waiting for room.
struct Driver {
    transport: Transport<Frame>,
    /// Frames waiting for room on a connection, in order.
    waiting: HashMap<ConnId, VecDeque<Outgoing>>,
}

impl Driver {
    async fn run(
        mut self,
        events: mpsc::Sender<NetEvent>,
        mut commands: mpsc::Receiver<Command>,
        mut closing: watch::Receiver<bool>,
    ) {
        // One event at a time waits for the user; commands are taken meanwhile.
        let mut pending: Option<NetEvent> = None;
        loop {
            tokio::select! {
                _ = closing.wait_for(|c| *c) => break,
                permit = events.reserve(), if pending.is_some() => {
                    // A user that dropped the receiver wants no events.
                    if let (Ok(permit), Some(ev)) = (permit, pending.take()) {
                        permit.send(ev);
                    }
                }
                ev = self.transport.next(), if pending.is_none() => pending = self.on_event(ev),
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    None => break,
                },
            }
        }
        self.transport.shutdown().await;
    }

    fn on_event(&mut self, ev: Event<Frame>) -> Option<NetEvent> {
        match ev {
            Event::Connected { peer, conn } => Some(NetEvent::Connected { peer, conn }),
            Event::Frame {
                peer,
                conn,
                item,
                lease,
            } => Some(NetEvent::Frame {
                peer,
                conn,
                frame: item,
                lease,
            }),
            Event::Disconnected { peer, conn, reason } => {
                for w in self.waiting.remove(&conn).into_iter().flatten() {
                    let _ = w.reply.send(Err(SendError::NotConnected));
                }
                Some(NetEvent::Disconnected { peer, conn, reason })
            }
            Event::Taken { conn } => {
                self.flush_waiting(conn);
                None
            }
        }
    }

    fn on_command(&mut self, cmd: Command) {
        let t = &mut self.transport;
        match cmd {
            Command::AddPeer(node, addrs, reply) => {
                let _ = reply.send(t.add_peer(node, addrs));
            }
            Command::RemovePeer(node, reply) => {
                t.remove_peer(node);
                let _ = reply.send(());
            }
            Command::SetPaused(node, paused, reply) => {
                let _ = reply.send(t.set_paused(node, paused));
            }
            Command::Peers(reply) => {
                let _ = reply.send(t.peers());
            }
            Command::Close(peer, conn, code, reason) => t.close(peer, conn, code, &reason),
            Command::Send(out) => self.on_send(out),
        }
    }

    fn on_send(&mut self, out: Outgoing) {
        let queued = self.waiting.get(&out.conn).is_some_and(|w| !w.is_empty());
        let full = queued
            || self
                .transport
                .queued(out.conn)
                .is_some_and(|q| q >= NET_QUEUE_BYTES_MAX);
        if !full {
            let r = self.transport.send(out.peer, out.conn, &out.frame);
            let _ = out.reply.send(r.map(|_| ()));
            return;
        }
        if !out.wait {
            let _ = out.reply.send(Err(SendError::QueueFull));
            return;
        }
        let conn = out.conn;
        self.waiting.entry(conn).or_default().push_back(out);
        if !queued && !self.transport.notify_when_taken(conn, NET_QUEUE_BYTES_MAX) {
            // Taken meanwhile (or gone): go on at once.
            self.flush_waiting(conn);
        }
    }

    /// Queues what waits for `conn` while there is room, and asks to hear
    /// when there is room again for the rest.
    fn flush_waiting(&mut self, conn: ConnId) {
        let Some(mut waiting) = self.waiting.remove(&conn) else {
            return;
        };
        while let Some(out) = waiting.pop_front() {
            let room = self
                .transport
                .queued(conn)
                .is_none_or(|q| q < NET_QUEUE_BYTES_MAX);
            if !room {
                waiting.push_front(out);
                break;
            }
            let r = self.transport.send(out.peer, out.conn, &out.frame);
            let _ = out.reply.send(r.map(|_| ()));
        }
        if waiting.is_empty() {
            return;
        }
        self.waiting.insert(conn, waiting);
        if !self.transport.notify_when_taken(conn, NET_QUEUE_BYTES_MAX) {
            self.flush_waiting(conn);
        }
    }
}
