//! The sans-IO core: `handle(input, now) -> effects`.
//!
//! [`Core`] makes every decision of the bus — stream sequencing, group
//! commit, outbox policy, acks, resync, gaps, replay defense and the reorder
//! buffer — and does no IO: no sockets, no clock, no store access, no
//! randomness. Time comes in as [`Millis`], store reads and writes go out as
//! [`Effect::LoadOutbox`] and [`Effect::Persist`] and come back as inputs.
//! That is what lets the deterministic simulator (`tests/sim.rs`) drive
//! several cores through loss, reordering, partitions and crashes.

mod author;
mod commit;
mod config;
mod io;
mod metrics;
mod receiver;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

use mesh_protocol::{
    Channel, Epoch, Frame, MAX_HELLO_MARKS, Mark, NodeId, OpenBatch, PROTOCOL_VERSION, SecretKey,
    Seq, StreamId,
};
use mesh_store::{OwnStream, PeerRecord};

pub use config::{
    ACK_RIDE_MS, Config, PAYLOAD_BYTES_MAX, REORDER_BYTES_MAX, REORDER_ENVELOPES_MAX,
    WAITING_BATCH_BYTES_MAX, WAITING_BATCHES_MAX, WAITING_PEER_CHANGES_MAX, WAITING_SEND_BYTES_MAX,
    WAITING_SENDS_MAX,
};
pub use io::{
    BadBatch, CloseReason, CommitId, ConnId, Effect, Input, LoadId, Millis, Recovered, ReqId,
    SendError, SendReceipt, open_batch,
};
pub use metrics::{DropCounts, DropReason, FrameCounts, Metrics};

use commit::{InFlight, PeerChange, Waiting};
use receiver::Inbound;

/// The state machine of one node's bus.
///
/// # Driving the core
///
/// The driver owns the connections, the clock, the store and one timer; the
/// core owns every decision. Its loop:
///
/// 1. Feed one [`Input`] to [`Core::handle`] with the current time, or every
///    input already waiting (a bounded number) to [`Core::handle_many`].
/// 2. Drain [`Core::poll_effect`] until it returns `None`, carrying out each
///    [`Effect`] in the order given:
///    - [`Effect::SendFrame`]: queue the frame on that connection (drop it if
///      the connection is gone; the core recovers lost frames itself);
///    - [`Effect::Persist`]: hand the groups to `MeshStore::commit` (the store
///      actor) and, when it returns, feed [`Input::Committed`] with the same
///      id. The core never has two commits outstanding, so the store sees
///      them in order;
///    - [`Effect::LoadOutbox`]: once the frames emitted before it are handed
///      to the connection, call `MeshStore::read_outbox` and feed
///      [`Input::OutboxLoaded`] with the same id;
///    - [`Effect::Reply`]: answer the local client of that request;
///    - [`Effect::Journaled`]: wake local subscribers to read the journal;
///    - [`Effect::SetTimer`]: re-arm the one timer; when it fires feed
///      [`Input::Timer`];
///    - [`Effect::PeerChanged`]: the peer change is durable and in effect:
///      add the peer to (or remove it from) the transport, then answer the
///      local client;
///    - [`Effect::CloseConnection`]: close it (the core already ignores it).
/// 3. Repeat with the next input. Answers to `Persist` and `LoadOutbox` may
///    be fed whenever they are ready, interleaved with other inputs.
///
/// Connections: report a connection with [`Input::PeerConnected`] once it is
/// live, then its frames in order with [`Input::Frame`], then
/// [`Input::PeerDisconnected`]; at most one live connection per peer (a
/// replacing one only after the old one's disconnect).
///
/// Start and crash: read the committed state with [`Recovered::read`] and
/// build the core with [`Core::new`]. After a crash, drop the core together
/// with every answer still owed to it (commits not yet returned, loads) and
/// build a new one from the store: memory holds nothing the store does not.
///
/// # What it keeps in memory
///
/// Counters and marks per stream, the peers and their connections, and
/// bounded queues: sends and peer batches waiting for the next commit
/// ([`WAITING_SENDS_MAX`], [`WAITING_BATCHES_MAX`] and their byte bounds)
/// and early batches per stream ([`REORDER_ENVELOPES_MAX`],
/// [`REORDER_BYTES_MAX`]). Never the outbox: catch-ups read it in chunks.
#[derive(Debug)]
pub struct Core {
    config: Config,
    secret: SecretKey,
    me: NodeId,
    epoch: Epoch,
    /// The highest Lamport clock seen or given out.
    lamport: u64,
    peers: BTreeMap<NodeId, Peer>,
    /// This node's current-epoch stream to each recipient, as committed.
    own: BTreeMap<NodeId, OwnStream>,
    /// Receiver state of every stream this node receives.
    inbound: BTreeMap<StreamId, Inbound>,
    waiting: Waiting,
    in_flight: Option<InFlight>,
    next_commit: u64,
    next_load: u64,
    /// After a store failure: no commit before this.
    store_retry_at: Option<Millis>,
    effects: VecDeque<Effect>,
    /// The deadline last handed out with [`Effect::SetTimer`].
    timer: Option<Millis>,
    metrics: Metrics,
}

/// A known peer.
#[derive(Debug)]
struct Peer {
    /// As committed.
    record: PeerRecord,
    /// The newest store epoch the peer announced (committed or not yet).
    epoch_seen: Option<Epoch>,
    conn: Option<Conn>,
}

/// The live connection to a peer.
#[derive(Debug)]
struct Conn {
    id: ConnId,
    /// The epoch from the peer's Hello on this connection; `None` until then.
    peer_epoch: Option<Epoch>,
    hello_sent_at: Millis,
    hellos_sent: u32,
    /// Feeding this node's stream to the peer (meaningful once `peer_epoch` is set).
    feed: Feed,
}

/// How far this node's stream to a peer has been sent on one connection.
#[derive(Debug, Default)]
struct Feed {
    /// The highest seq handed to the connection (or known to be at the peer).
    cursor: Seq,
    /// The highest seq the peer has acknowledged on this connection.
    acked: Seq,
    /// The outbox read in flight, if any.
    load: Option<LoadId>,
    /// A read failed; try again then.
    retry_at: Option<Millis>,
    /// Send `ResyncDone` once the cursor reaches the end.
    announce_done: bool,
    /// When the peer last made progress (or we started waiting for it).
    progress_at: Millis,
}

impl Core {
    /// A core for the node `secret`, starting from the committed state `state`.
    pub fn new(config: Config, secret: SecretKey, state: Recovered) -> Core {
        let me = secret.public();
        let epoch = state.epoch;
        let peers = state
            .peers
            .into_iter()
            .filter(|p| p.node != me)
            .map(|record| {
                let peer = Peer {
                    epoch_seen: record.epoch,
                    record,
                    conn: None,
                };
                (peer.record.node, peer)
            })
            .collect();
        let own = state
            .own_streams
            .into_iter()
            .filter(|o| o.stream.author == me && o.stream.epoch == epoch)
            .filter_map(|o| match o.stream.channel {
                Channel::Direct(to) => Some((to, o)),
                Channel::Topic(_) => None,
            })
            .collect();
        let inbound = state
            .marks
            .into_iter()
            .map(|m| (m.stream, Inbound::at(m.seq)))
            .collect();
        Core {
            config,
            secret,
            me,
            epoch,
            lamport: state.max_lamport,
            peers,
            own,
            inbound,
            waiting: Waiting::default(),
            in_flight: None,
            next_commit: 1,
            next_load: 1,
            store_retry_at: None,
            effects: VecDeque::new(),
            timer: None,
            metrics: Metrics::default(),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.me
    }

    /// This node's store epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The committed mark of a stream this node receives (0 if none).
    pub fn mark(&self, stream: &StreamId) -> Seq {
        self.inbound.get(stream).map_or(0, |i| i.committed)
    }

    /// This node's stream to `to`, as committed (`None` before its first message).
    pub fn own_stream(&self, to: &NodeId) -> Option<&OwnStream> {
        self.own.get(to)
    }

    /// Whether a commit is outstanding or anything waits for one.
    pub fn is_committing(&self) -> bool {
        self.in_flight.is_some() || !self.waiting.is_empty()
    }

    /// Feeds one input. Drain [`Core::poll_effect`] afterwards.
    pub fn handle(&mut self, input: Input, now: Millis) {
        self.handle_many([input], now);
    }

    /// Feeds inputs that are already waiting, in order, as [`Core::handle`]
    /// would one at a time, except that a commit starts only after the last
    /// of them: a burst of sends or frames shares one commit instead of the
    /// first going alone. Drain [`Core::poll_effect`] afterwards.
    pub fn handle_many(&mut self, inputs: impl IntoIterator<Item = Input>, now: Millis) {
        for input in inputs {
            self.apply(input, now);
        }
        self.flush(now);
        self.arm_timer(now);
    }

    fn apply(&mut self, input: Input, now: Millis) {
        match input {
            Input::PeerConnected { peer, conn } => self.on_connected(peer, conn, now),
            Input::PeerDisconnected { peer, conn } => self.on_disconnected(peer, conn),
            Input::Frame { peer, conn, frame } => self.on_frame(peer, conn, frame, now),
            Input::Batch { peer, conn, batch } => self.on_batch_input(peer, conn, batch, now),
            Input::Send {
                req,
                to,
                kind,
                payload,
            } => self.on_send(req, to, kind, payload, now),
            Input::Committed { commit, results } => self.on_committed(commit, results, now),
            Input::OutboxLoaded { load, result } => self.on_loaded(load, result, now),
            Input::Timer => self.on_timer(now),
            Input::PeerAdded { req, record } => self.on_peer_change(req, PeerChange::Put(record)),
            Input::PeerRemoved { req, node } => self.on_peer_change(req, PeerChange::Remove(node)),
        }
    }

    /// The next effect to carry out, in order; `None` when drained.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    fn on_connected(&mut self, peer: NodeId, conn: ConnId, now: Millis) {
        if peer == self.me || !self.peers.contains_key(&peer) {
            self.effects.push_back(Effect::CloseConnection {
                peer,
                conn,
                reason: CloseReason::UnknownPeer,
            });
            return;
        }
        self.forget_conn(peer);
        let hello = self.hello_frame(peer);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.conn = Some(Conn {
                id: conn,
                peer_epoch: None,
                hello_sent_at: now,
                hellos_sent: 1,
                feed: Feed::default(),
            });
        }
        self.send_frame(peer, conn, hello);
    }

    /// Queues a peer change for the next commit; it takes effect once committed.
    fn on_peer_change(&mut self, req: ReqId, change: PeerChange) {
        let node = change.node();
        if node == self.me || self.waiting.peers.len() >= WAITING_PEER_CHANGES_MAX {
            let why = if node == self.me {
                "a node cannot be its own peer".to_owned()
            } else {
                format!("{WAITING_PEER_CHANGES_MAX} peer changes are already waiting; retry later")
            };
            let result = Err(mesh_store::StoreError::Conflict(why));
            self.effects
                .push_back(Effect::PeerChanged { req, node, result });
            return;
        }
        self.waiting.peers.push_back((req, change));
    }

    /// Applies a committed peer change.
    fn apply_peer_change(&mut self, change: PeerChange) {
        match change {
            PeerChange::Put(record) => match self.peers.get_mut(&record.node) {
                Some(p) => p.record.addrs = record.addrs,
                None => {
                    let peer = Peer {
                        epoch_seen: record.epoch,
                        record,
                        conn: None,
                    };
                    self.peers.insert(peer.record.node, peer);
                }
            },
            PeerChange::Remove(node) => {
                self.forget_conn(node);
                self.peers.remove(&node);
                self.waiting.acks.remove(&node);
            }
        }
    }

    fn on_disconnected(&mut self, peer: NodeId, conn: ConnId) {
        if self.live_conn(peer) == Some(conn) {
            self.forget_conn(peer);
        }
    }

    /// Drops the peer's connection state and what was held for it.
    fn forget_conn(&mut self, peer: NodeId) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.conn = None;
        }
        for (stream, inb) in self.inbound.iter_mut() {
            if stream.author == peer {
                inb.forget_held();
            }
        }
    }

    fn close(&mut self, peer: NodeId, conn: ConnId, reason: CloseReason) {
        self.effects
            .push_back(Effect::CloseConnection { peer, conn, reason });
        self.forget_conn(peer);
    }

    fn on_frame(&mut self, peer: NodeId, conn: ConnId, frame: Frame, now: Millis) {
        if self.live_conn(peer) != Some(conn) {
            self.metrics.dropped.count(DropReason::StaleConnection);
            return;
        }
        self.metrics.frames_in.count(&frame);
        if let Frame::Hello {
            version,
            node,
            epoch,
            marks,
        } = frame
        {
            self.on_hello(peer, conn, version, node, epoch, marks, now);
            return;
        }
        let Some(peer_epoch) = self.peer_epoch(peer) else {
            self.metrics.dropped.count(DropReason::BeforeHello);
            return;
        };
        match frame {
            Frame::Batch { .. } => {
                debug_assert!(false, "a batch frame must come as Input::Batch");
                self.metrics.dropped.count(DropReason::Malformed);
            }
            Frame::Ack { stream, upto } => self.on_ack(peer, stream, upto, now),
            Frame::Resync { stream, after } => self.on_resync(peer, stream, after, now),
            Frame::ResyncGap {
                stream,
                earliest_available,
            } => self.on_resync_gap(peer, peer_epoch, stream, earliest_available),
            Frame::ResyncDone { stream, upto } => {
                self.on_resync_done(peer, peer_epoch, stream, upto, now)
            }
            // Handled above.
            Frame::Hello { .. } => {}
        }
    }

    fn on_batch_input(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        batch: Result<OpenBatch, BadBatch>,
        now: Millis,
    ) {
        if self.live_conn(peer) != Some(conn) {
            self.metrics.dropped.count(DropReason::StaleConnection);
            return;
        }
        self.metrics.frames_in.batch += 1;
        let Some(peer_epoch) = self.peer_epoch(peer) else {
            self.metrics.dropped.count(DropReason::BeforeHello);
            return;
        };
        match batch {
            Ok(open) => self.on_batch(peer, peer_epoch, open, now),
            Err(bad) => self.metrics.dropped.count(DropReason::from(bad)),
        }
    }

    /// The Hello this node sends `peer`: its committed marks for the
    /// streams `peer` authors, the peer's newest known epoch first.
    fn hello_frame(&self, peer: NodeId) -> Frame {
        let newest = self.peers.get(&peer).and_then(|p| p.epoch_seen);
        let mut marks: Vec<Mark> = self
            .inbound
            .iter()
            .filter(|(s, i)| {
                s.author == peer && s.channel == Channel::Direct(self.me) && i.committed > 0
            })
            .map(|(s, i)| Mark {
                stream: s.clone(),
                seq: i.committed,
            })
            .collect();
        // Only the newest epoch's mark matters to the peer; keep it if cut.
        marks.sort_by_key(|m| Some(m.stream.epoch) != newest);
        marks.truncate(MAX_HELLO_MARKS);
        Frame::Hello {
            version: PROTOCOL_VERSION,
            node: self.me,
            epoch: self.epoch,
            marks,
        }
    }

    fn on_timer(&mut self, now: Millis) {
        // The timer that brought us here is spent; arm_timer sets the next.
        self.timer = None;
        let peers: Vec<NodeId> = self.peers.keys().copied().collect();
        for peer in peers {
            let Some(c) = self.peers.get_mut(&peer).and_then(|p| p.conn.as_mut()) else {
                continue;
            };
            let conn = c.id;
            if c.peer_epoch.is_none() {
                if now < c.hello_sent_at.plus(self.config.hello_retry_ms) {
                    continue;
                }
                if c.hellos_sent >= self.config.hello_attempts_max {
                    let attempts = c.hellos_sent;
                    self.close(peer, conn, CloseReason::NoHello { attempts });
                    continue;
                }
                c.hellos_sent += 1;
                c.hello_sent_at = now;
                let hello = self.hello_frame(peer);
                self.send_frame(peer, conn, hello);
                continue;
            }
            let feed = &mut c.feed;
            if feed.retry_at.is_some_and(|t| now >= t) {
                feed.retry_at = None;
                self.pump(peer, now);
            }
            if let Some(c) = self.peers.get(&peer).and_then(|p| p.conn.as_ref()) {
                let feed = &c.feed;
                let silent = now >= feed.progress_at.plus(self.config.retransmit_ms);
                if feed.load.is_none()
                    && feed.retry_at.is_none()
                    && feed.acked < feed.cursor
                    && silent
                {
                    let from = feed.acked;
                    self.metrics.retransmits += 1;
                    self.serve(peer, from, now);
                }
            }
        }
        // A stream's ask is due at its deadline (see `next_deadline`), not
        // whenever another timer happens to fire.
        let retry = self.config.resync_retry_ms;
        let behind: Vec<StreamId> = self
            .inbound
            .iter()
            .filter(|(_, i)| i.behind() && i.asked.is_none_or(|(_, t)| now >= t.plus(retry)))
            .map(|(s, _)| s.clone())
            .collect();
        for stream in behind {
            self.ask_resync(&stream, now, false);
        }
    }

    /// The earliest moment something is due, if anything is.
    fn next_deadline(&self, now: Millis) -> Option<Millis> {
        let mut due = self.store_retry_at;
        let mut at = |t: Millis| due = Some(due.map_or(t, |d| d.min(t)));
        if self.in_flight.is_none()
            && self.store_retry_at.is_none()
            && let Some(since) = self.waiting.acks_since
        {
            // Acks waiting for company: commit them alone at the latest then.
            at(since.plus(self.config.ack_ride_ms));
        }
        for p in self.peers.values() {
            let Some(c) = &p.conn else { continue };
            if c.peer_epoch.is_none() {
                at(c.hello_sent_at.plus(self.config.hello_retry_ms));
                continue;
            }
            if let Some(t) = c.feed.retry_at {
                at(t);
            } else if c.feed.load.is_none() && c.feed.acked < c.feed.cursor {
                at(c.feed.progress_at.plus(self.config.retransmit_ms));
            }
        }
        for (stream, inb) in &self.inbound {
            if inb.behind() && self.peer_epoch(stream.author) == Some(stream.epoch) {
                at(inb
                    .asked
                    .map_or(now, |(_, t)| t.plus(self.config.resync_retry_ms)));
            }
        }
        due
    }

    fn arm_timer(&mut self, now: Millis) {
        let next = self.next_deadline(now);
        if let Some(at) = next
            && self.timer != Some(at)
        {
            self.effects.push_back(Effect::SetTimer { at });
        }
        self.timer = next;
    }

    /// The live connection to `peer`, if any.
    fn live_conn(&self, peer: NodeId) -> Option<ConnId> {
        self.peers.get(&peer)?.conn.as_ref().map(|c| c.id)
    }

    /// The epoch `peer` announced on its live connection, once it has.
    fn peer_epoch(&self, peer: NodeId) -> Option<Epoch> {
        self.peers.get(&peer)?.conn.as_ref()?.peer_epoch
    }

    fn send_frame(&mut self, peer: NodeId, conn: ConnId, frame: Frame) {
        self.metrics.frames_out.count(&frame);
        self.effects
            .push_back(Effect::SendFrame { peer, conn, frame });
    }

    /// Sends on the peer's live connection, if there is one.
    fn send_live(&mut self, peer: NodeId, frame: Frame) {
        if let Some(conn) = self.live_conn(peer) {
            self.send_frame(peer, conn, frame);
        }
    }
}
