//! The transport as fields its owner drives: the peer table with each
//! peer's dial, backoff and pause state, the live connections with their
//! send queues, and the tasks it owns (the accept loop, dials, a reader and
//! a writer per connection). Nothing here is shared with another actor:
//! tasks hand their results back on channels and join sets that
//! [`Transport::next`] selects on, and no method waits for the owner.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use iroh::address_lookup::memory::MemoryLookup;
use iroh::endpoint::Connection;
use iroh::{Endpoint, EndpointAddr, RelayUrl};
use mesh_protocol::{Frame, MAX_TICKET_ADDRS, NodeId, NodeTicket, SecretKey};
use rand::rngs::SmallRng;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{AbortHandle, JoinError, JoinHandle, JoinSet};
use tokio::time::{Instant, Sleep};
use tracing::{Instrument, debug, info, warn};

use super::conn::{self, ConnEvent, ConnWhat, Established, Reader, RecvLease};
use super::counters::{Counters, NetCounters};
use super::endpoint::{self, Authenticated, Failed};
use super::mdns::{self, Found, Mdns};
use super::peers::{Live, PeerState, jitter, new_wins};
use super::queue::SendQueue;
use super::{
    DIAL_BACKOFF_MAX, DIAL_BACKOFF_MIN, DisconnectReason, NetConfig, NetError, PAUSED_REASON,
    PEERS_MAX, PENDING_ACCEPTS_MAX, PeerError, RECEIVED_BYTES_MAX, RECEIVED_FRAMES_MAX,
    SHUTDOWN_TIMEOUT, STABLE_CONNECTION, SendError, close_code,
};
use crate::core::ConnId;

/// What the transport reports, in order per peer: a connection's
/// `Connected`, then its frames, then its `Disconnected`. Events of two
/// connections to one peer never interleave: a replacing connection is
/// announced only after the one it replaces has been reported disconnected.
#[derive(Debug)]
pub(crate) enum Event<T> {
    /// A connection to `peer` is live; frames may be sent on `conn`.
    Connected { peer: NodeId, conn: ConnId },
    /// A frame arrived from `peer` on `conn`, as the transport's `open` made it.
    Frame {
        peer: NodeId,
        conn: ConnId,
        item: T,
        lease: RecvLease,
    },
    /// `conn` to `peer` is gone; nothing more arrives on it.
    Disconnected {
        peer: NodeId,
        conn: ConnId,
        reason: DisconnectReason,
    },
    /// The writer of `conn` took its queue, as [`Transport::notify_when_taken`] asked.
    Taken { conn: ConnId },
}

/// One known peer as the transport sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerStatus {
    /// The peer.
    pub node: NodeId,
    /// The addresses it is dialed at.
    pub addrs: Vec<SocketAddr>,
    /// The live connection, if any.
    pub conn: Option<ConnId>,
    /// Whether this node dialed the live connection (false if the peer did).
    pub dialed_here: bool,
    /// Whether the link is paused.
    pub paused: bool,
    /// The last identity conflict seen on this link (two live processes
    /// share one node key), for a person.
    pub identity_conflict: Option<String>,
    /// Why the last connection with the peer was refused for speaking
    /// another protocol version (either side's refusal), until one is live.
    pub refused: Option<String>,
}

/// A node mDNS found on the LAN that is not a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NearbyNode {
    /// Its id.
    pub node: NodeId,
    /// The name it announces, if any.
    pub name: Option<String>,
    /// Where it announces it listens.
    pub addrs: Vec<SocketAddr>,
}

/// A live connection's queue and tasks; kept until its reader reports its end.
#[derive(Debug)]
struct ConnTask {
    peer: NodeId,
    connection: Connection,
    queue: Arc<SendQueue>,
    writer: AbortHandle,
    /// Why this node closed it, if it did; reported instead of "closed".
    local: Option<DisconnectReason>,
}

type Dialed = (NodeId, u64, Result<Established, Failed>);

/// One thing that happened, taken out of a select so its handler may borrow
/// the whole transport.
enum Source<T> {
    Conn(ConnEvent<T>),
    Taken(ConnId),
    Inbound(Authenticated),
    Handshake(Result<Result<Established, Failed>, JoinError>),
    Dialed(Result<Dialed, JoinError>),
    ReaderDone(Result<(tokio::task::Id, ()), JoinError>),
    RedialDue,
    Found(Found),
}

/// The transport of one node (see the module doc). `T` is what a received
/// frame becomes in its connection's reader (`open`).
pub(crate) struct Transport<T> {
    me: NodeId,
    endpoint: Endpoint,
    lookup: MemoryLookup,
    /// This transport's instance, sent in every preamble.
    instance: u64,
    /// Relay servers every peer is also dialed through.
    relays: Vec<RelayUrl>,
    open: fn(Frame) -> T,
    counters: Arc<Counters>,
    /// Holds [`RECEIVED_BYTES_MAX`] permits, one per received byte not yet taken.
    budget: Arc<Semaphore>,
    /// Jitter for redials.
    rng: SmallRng,
    peers: HashMap<NodeId, PeerState>,
    conns: HashMap<ConnId, ConnTask>,
    readers: JoinSet<()>,
    reader_conns: HashMap<tokio::task::Id, (NodeId, ConnId)>,
    events_tx: mpsc::Sender<ConnEvent<T>>,
    events: mpsc::Receiver<ConnEvent<T>>,
    taken_tx: mpsc::Sender<ConnId>,
    taken: mpsc::Receiver<ConnId>,
    inbound: mpsc::Receiver<Authenticated>,
    accept: JoinHandle<()>,
    handshakes: JoinSet<Result<Established, Failed>>,
    dials: JoinSet<Dialed>,
    /// Redials waiting out their backoff, by when they are due.
    redials: BTreeSet<(Instant, NodeId)>,
    redial_timer: Pin<Box<Sleep>>,
    /// LAN discovery, if it runs.
    mdns: Option<Mdns>,
    /// Strangers it found, by id (at most [`mdns::NEARBY_MAX`]), with when
    /// each was last seen.
    nearby: HashMap<NodeId, (NearbyNode, Instant)>,
    /// Where connections on the join ALPN go (the node's inviter), if anywhere.
    joins: Option<mpsc::Sender<Connection>>,
    /// Where connections on the move ALPN from known, unpaused peers go
    /// (the node's mover), if anywhere.
    moves: Option<mpsc::Sender<Connection>>,
    /// Events made by one source beyond the one returned at once.
    ready: VecDeque<Event<T>>,
    next_conn: u64,
    next_attempt: u64,
}

impl<T: Send + 'static> Transport<T> {
    /// Binds the endpoint and starts the accept loop. Must be called inside a
    /// tokio runtime.
    ///
    /// # Errors
    /// [`NetError::AddrInUse`] or [`NetError::Bind`] if the address cannot be bound.
    pub(crate) async fn bind(
        config: &NetConfig,
        secret: SecretKey,
        open: fn(Frame) -> T,
    ) -> Result<Self, NetError> {
        let (endpoint, lookup) = endpoint::bind(config, secret).await?;
        let bound = SocketAddr::new(config.bind_addr.ip(), endpoint::local_port(&endpoint));
        let mdns = mdns::start(
            config.mdns,
            endpoint.id(),
            bound,
            &endpoint::local_addrs(&endpoint),
            &config.mdns_name,
        );
        let (inbound_tx, inbound) = mpsc::channel(PENDING_ACCEPTS_MAX);
        let accept = tokio::spawn(
            endpoint::accept_loop(endpoint.clone(), inbound_tx)
                .instrument(tracing::Span::current()),
        );
        let (events_tx, events) = mpsc::channel(RECEIVED_FRAMES_MAX);
        // Room for one notice per connection: a live and a pending one per peer.
        let (taken_tx, taken) = mpsc::channel(2 * PEERS_MAX);
        Ok(Transport {
            me: endpoint.id(),
            endpoint,
            lookup,
            instance: endpoint::instance_now(),
            relays: config.relays.clone(),
            open,
            counters: Arc::default(),
            budget: Arc::new(Semaphore::new(RECEIVED_BYTES_MAX)),
            rng: rand::make_rng(),
            peers: HashMap::new(),
            conns: HashMap::new(),
            readers: JoinSet::new(),
            reader_conns: HashMap::new(),
            events_tx,
            events,
            taken_tx,
            taken,
            inbound,
            accept,
            handshakes: JoinSet::new(),
            dials: JoinSet::new(),
            redials: BTreeSet::new(),
            redial_timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            mdns,
            nearby: HashMap::new(),
            joins: None,
            moves: None,
            ready: VecDeque::new(),
            next_conn: 1,
            next_attempt: 1,
        })
    }

    /// This node's id.
    pub(crate) fn node_id(&self) -> NodeId {
        self.me
    }

    /// Hands every connection on the join ALPN, from any node, to `joins`
    /// (bounded: one that finds it full is closed with
    /// [`close_code::JOIN_BUSY`]). Without it, such connections are closed
    /// the same way.
    pub(crate) fn accept_joins(&mut self, joins: mpsc::Sender<Connection>) {
        self.joins = Some(joins);
    }

    /// Hands every connection on the move ALPN from a known peer whose
    /// link is not paused to `moves` (bounded: one that finds it full is
    /// closed with [`close_code::MOVE_BUSY`]); any other node's is closed
    /// before anything is read from it, with [`close_code::UNKNOWN_NODE`]
    /// (counted as refused) or [`close_code::PAUSED`]. Without it, every
    /// such connection is closed with [`close_code::MOVE_BUSY`].
    pub(crate) fn accept_moves(&mut self, moves: mpsc::Sender<Connection>) {
        self.moves = Some(moves);
    }

    /// The endpoint (for the addresses a ticket names).
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// A ticket for this node at its bound addresses.
    pub(crate) fn ticket(&self) -> NodeTicket {
        NodeTicket {
            node: self.me,
            addrs: endpoint::local_addrs(&self.endpoint),
        }
    }

    /// The counters, for a handle that reads them without asking the owner.
    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Transport counters since bind.
    pub(crate) fn counters_now(&self) -> NetCounters {
        self.counters.snapshot()
    }

    /// The next event. Cancel-safe: every source it waits on is, and what it
    /// takes from one is handled before the next wait.
    pub(crate) async fn next(&mut self) -> Event<T> {
        loop {
            if let Some(event) = self.try_next() {
                return event;
            }
            let source = self.wait().await;
            if let Some(event) = self.on_source(source) {
                return event;
            }
        }
    }

    /// The next event if one is ready now, without waiting.
    pub(crate) fn try_next(&mut self) -> Option<Event<T>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            let source = self.poll_now()?;
            if let Some(event) = self.on_source(source) {
                return Some(event);
            }
        }
    }

    /// One source that is ready now, frames first.
    fn poll_now(&mut self) -> Option<Source<T>> {
        if let Ok(ev) = self.events.try_recv() {
            return Some(Source::Conn(ev));
        }
        if let Ok(conn) = self.taken.try_recv() {
            return Some(Source::Taken(conn));
        }
        if let Ok(a) = self.inbound.try_recv() {
            return Some(Source::Inbound(a));
        }
        if let Some(r) = self.handshakes.try_join_next() {
            return Some(Source::Handshake(r));
        }
        if let Some(r) = self.dials.try_join_next() {
            return Some(Source::Dialed(r));
        }
        if let Some(r) = self.readers.try_join_next_with_id() {
            return Some(Source::ReaderDone(r));
        }
        if let Some(found) = self.mdns.as_mut().and_then(|m| m.found.try_recv().ok()) {
            return Some(Source::Found(found));
        }
        let due = self
            .redials
            .first()
            .is_some_and(|(at, _)| *at <= Instant::now());
        due.then_some(Source::RedialDue)
    }

    /// Waits for any source.
    async fn wait(&mut self) -> Source<T> {
        let next_redial = self.redials.first().map(|(at, _)| *at);
        if let Some(at) = next_redial
            && self.redial_timer.deadline() != at
        {
            self.redial_timer.as_mut().reset(at);
        }
        tokio::select! {
            // The transport holds a sender of each of these, so they never close.
            Some(ev) = self.events.recv() => Source::Conn(ev),
            Some(conn) = self.taken.recv() => Source::Taken(conn),
            Some(a) = self.inbound.recv() => Source::Inbound(a),
            Some(r) = self.handshakes.join_next(), if !self.handshakes.is_empty() => Source::Handshake(r),
            Some(r) = self.dials.join_next(), if !self.dials.is_empty() => Source::Dialed(r),
            Some(r) = self.readers.join_next_with_id(), if !self.readers.is_empty() => Source::ReaderDone(r),
            () = &mut self.redial_timer, if next_redial.is_some() => Source::RedialDue,
            Some(found) = found(&mut self.mdns) => Source::Found(found),
        }
    }

    /// Handles one source; returns an event at once (a frame) or queues
    /// what it made in `ready`.
    fn on_source(&mut self, source: Source<T>) -> Option<Event<T>> {
        match source {
            Source::Conn(ConnEvent { peer, conn, what }) => match what {
                ConnWhat::Frame(item, lease) => {
                    return Some(Event::Frame {
                        peer,
                        conn,
                        item,
                        lease,
                    });
                }
                ConnWhat::Ended(reason) => self.on_ended(peer, conn, reason),
            },
            Source::Taken(conn) if self.conns.contains_key(&conn) => {
                return Some(Event::Taken { conn });
            }
            // Ended meanwhile.
            Source::Taken(_) => {}
            Source::Inbound(a) => self.on_authenticated(a),
            Source::Handshake(Ok(Ok(est))) => self.on_established(est),
            Source::Handshake(Ok(Err(failed))) => self.on_handshake_failed(failed),
            Source::Handshake(Err(e)) | Source::Dialed(Err(e)) if e.is_cancelled() => {}
            Source::Handshake(Err(e)) | Source::Dialed(Err(e)) => {
                warn!(error = %e, "handshake task failed");
            }
            Source::Dialed(Ok(dialed)) => self.on_dialed(dialed),
            Source::ReaderDone(r) => self.on_reader_done(r),
            Source::RedialDue => self.on_redials_due(),
            Source::Found(found) => self.on_found(found),
        }
        None
    }

    /// mDNS found (or lost) a node: a known peer's addresses are dialed at
    /// once if it has no connection; a stranger is listed as nearby.
    fn on_found(&mut self, found: Found) {
        let Found { node, addrs, name } = found;
        if let Some(ps) = self.peers.get_mut(&node) {
            if addrs.is_empty() || addrs.iter().all(|a| ps.addrs.contains(a)) {
                return;
            }
            let mut merged = addrs.clone();
            merged.extend(ps.addrs.iter().filter(|a| !addrs.contains(a)));
            merged.truncate(MAX_TICKET_ADDRS);
            info!(peer = %node.fmt_short(), ?addrs, "mDNS found a peer at a new address");
            if let Err(e) = self.add_peer(node, merged) {
                warn!(peer = %node.fmt_short(), error = %e, "mDNS addresses not used");
            }
            return;
        }
        if addrs.is_empty() {
            self.nearby.remove(&node);
            return;
        }
        if !self.nearby.contains_key(&node) && self.nearby.len() >= mdns::NEARBY_MAX {
            let oldest = self
                .nearby
                .iter()
                .min_by_key(|(_, (_, seen))| *seen)
                .map(|(n, _)| *n);
            if let Some(oldest) = oldest {
                self.nearby.remove(&oldest);
            }
        }
        debug!(node = %node.fmt_short(), ?name, "mDNS found a node that is not a peer");
        self.nearby
            .insert(node, (NearbyNode { node, name, addrs }, Instant::now()));
    }

    /// The nodes mDNS found on the LAN that are not peers, by id.
    pub(crate) fn nearby(&self) -> Vec<NearbyNode> {
        let mut out: Vec<NearbyNode> = self
            .nearby
            .values()
            .filter(|(n, _)| !self.peers.contains_key(&n.node))
            .map(|(n, _)| n.clone())
            .collect();
        out.sort_by_key(|n| *n.node.as_bytes());
        out
    }

    /// Checks that `node` at `addrs` may be added (see [`Transport::add_peer`]).
    ///
    /// # Errors
    /// [`PeerError`] for this node's own id, too many addresses or peers.
    pub(crate) fn check_add(&self, node: NodeId, addrs: &[SocketAddr]) -> Result<(), PeerError> {
        if node == self.me {
            return Err(PeerError::SelfPeer);
        }
        if addrs.len() > MAX_TICKET_ADDRS {
            return Err(PeerError::TooManyAddrs(addrs.len()));
        }
        if self.peers.len() >= PEERS_MAX && !self.peers.contains_key(&node) {
            return Err(PeerError::TooManyPeers);
        }
        Ok(())
    }

    /// Makes `node` a known peer at `addrs` (replacing addresses it had) and
    /// dials it at once. A peer with no addresses is accepted but not dialed.
    ///
    /// # Errors
    /// As [`Transport::check_add`].
    pub(crate) fn add_peer(
        &mut self,
        node: NodeId,
        addrs: Vec<SocketAddr>,
    ) -> Result<(), PeerError> {
        self.check_add(node, &addrs)?;
        let mut info = EndpointAddr::new(node);
        for a in &addrs {
            info = info.with_ip_addr(*a);
        }
        self.lookup.set_endpoint_info(info);
        let ps = self
            .peers
            .entry(node)
            .or_insert_with(|| PeerState::new(Vec::new()));
        if ps.addrs != addrs {
            // A dial to the old addresses is of no more use.
            ps.cancel_dial();
            ps.addrs = addrs;
        }
        ps.backoff = DIAL_BACKOFF_MIN;
        if ps.idle() {
            cancel_redial(&mut self.redials, node, ps);
            self.start_dial(node);
        }
        Ok(())
    }

    /// Dials the known peer `node` at `addrs` from now on (its newest card
    /// says it listens there): at once, with the backoff reset, if it has no
    /// connection. Unknown peers and too many addresses are ignored.
    pub(crate) fn set_addrs(&mut self, node: NodeId, addrs: Vec<SocketAddr>) {
        if addrs.len() > MAX_TICKET_ADDRS || !self.peers.contains_key(&node) {
            return;
        }
        if let Err(e) = self.add_peer(node, addrs) {
            warn!(peer = %node.fmt_short(), error = %e, "learned addresses not used");
        }
    }

    /// Records that the last connection with `peer` was refused for
    /// speaking another protocol version; logs it once per peer (until a
    /// connection is live again) and counts it.
    pub(crate) fn note_refusal(&mut self, peer: NodeId, why: String) {
        Counters::add(&self.counters.version_refused, 1);
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        if ps.refused.as_deref() == Some(why.as_str()) {
            tracing::debug!(peer = %peer.fmt_short(), %why, "protocol version refused again");
            return;
        }
        warn!(peer = %peer.fmt_short(), %why, "protocol version refused (logged once per peer)");
        ps.refused = Some(why);
    }

    /// Forgets `node` (and its pause): refuses it from now on and closes its
    /// connection with [`close_code::PEER_REMOVED`]. Removing an unknown
    /// peer does nothing.
    pub(crate) fn remove_peer(&mut self, node: NodeId) {
        self.lookup.remove_endpoint_info(node);
        let Some(mut ps) = self.peers.remove(&node) else {
            return;
        };
        cancel_redial(&mut self.redials, node, &mut ps);
        ps.cancel_dial();
        if let Some(p) = ps.pending.take() {
            conn::close(&p.connection, close_code::PEER_REMOVED, "peer removed");
        }
        if let Some(live) = ps.live {
            self.close_conn(live.conn, close_code::PEER_REMOVED, "peer removed");
        }
        info!(peer = %node.fmt_short(), "peer removed");
    }

    /// Pauses (`paused = true`) or resumes the link to the known peer
    /// `node`: a pause closes its connections with [`close_code::PAUSED`] and
    /// stops dialing it (its dials are refused the same way); a resume dials
    /// it at once with the backoff reset. Pausing a paused link or resuming a
    /// live one does nothing.
    ///
    /// # Errors
    /// [`PeerError::UnknownPeer`] if `node` is not a known peer.
    pub(crate) fn set_paused(&mut self, node: NodeId, paused: bool) -> Result<(), PeerError> {
        let Some(ps) = self.peers.get_mut(&node) else {
            return Err(PeerError::UnknownPeer(node));
        };
        ps.backoff = DIAL_BACKOFF_MIN;
        if !paused {
            if ps.paused.take().is_some() {
                info!(peer = %node.fmt_short(), "link resumed");
            }
            if ps.idle() {
                cancel_redial(&mut self.redials, node, ps);
                self.start_dial(node);
            }
            return Ok(());
        }
        if ps.paused.is_none() {
            info!(peer = %node.fmt_short(), "link paused");
        }
        ps.paused = Some(ps.paused.unwrap_or(false));
        cancel_redial(&mut self.redials, node, ps);
        ps.cancel_dial();
        if let Some(p) = ps.pending.take() {
            conn::close(&p.connection, close_code::PAUSED, PAUSED_REASON);
        }
        if let Some(conn) = ps.live.as_ref().map(|l| l.conn) {
            self.close_conn(conn, close_code::PAUSED, PAUSED_REASON);
        }
        Ok(())
    }

    /// Every known peer, by id.
    pub(crate) fn peers(&self) -> Vec<PeerStatus> {
        let mut out: Vec<PeerStatus> = self
            .peers
            .iter()
            .map(|(node, ps)| {
                let live = ps.live.as_ref().filter(|l| !self.is_closing(l.conn));
                PeerStatus {
                    node: *node,
                    addrs: ps.addrs.clone(),
                    conn: live.map(|l| l.conn),
                    dialed_here: live.is_some_and(|l| l.dialed_here),
                    paused: ps.paused.is_some(),
                    identity_conflict: ps.conflict.clone(),
                    refused: ps.refused.clone(),
                }
            })
            .collect();
        out.sort_by_key(|p| *p.node.as_bytes());
        out
    }

    /// The live connection to `peer`, unless it is closing.
    pub(crate) fn live_conn(&self, peer: NodeId) -> Option<ConnId> {
        let live = self.peers.get(&peer)?.live.as_ref()?;
        (!self.is_closing(live.conn)).then_some(live.conn)
    }

    /// Queues `frame` for `peer` on `conn` and returns the bytes queued on
    /// it now. Never waits: the caller watches the queue's size.
    ///
    /// # Errors
    /// [`SendError::NotConnected`] if `conn` is not (or no longer) the peer's
    /// open connection, [`SendError::Frame`] if the frame does not encode.
    pub(crate) fn send(
        &self,
        peer: NodeId,
        conn: ConnId,
        frame: &Frame,
    ) -> Result<usize, SendError> {
        match self.conns.get(&conn) {
            Some(c) if c.peer == peer && c.local.is_none() => c.queue.push(frame),
            _ => Err(SendError::NotConnected),
        }
    }

    /// The bytes queued on `conn`, if it is open.
    pub(crate) fn queued(&self, conn: ConnId) -> Option<usize> {
        self.conns
            .get(&conn)
            .filter(|c| c.local.is_none())
            .map(|c| c.queue.queued())
    }

    /// Asks for an [`Event::Taken`] when the writer of `conn` next takes its
    /// queue, if at least `bytes` are queued; false if fewer are (or `conn`
    /// is not open), and then no event comes.
    pub(crate) fn notify_when_taken(&self, conn: ConnId, bytes: usize) -> bool {
        self.conns
            .get(&conn)
            .filter(|c| c.local.is_none())
            .is_some_and(|c| c.queue.notify_when_taken(bytes))
    }

    /// Closes `conn` to `peer` with `code` and `reason` if it is the peer's
    /// live connection (see [`close_code`]); the peer is redialed with
    /// backoff as after any disconnect. `Disconnected` follows as usual.
    pub(crate) fn close(&mut self, peer: NodeId, conn: ConnId, code: u32, reason: &str) {
        let live = self
            .peers
            .get(&peer)
            .and_then(|ps| ps.live.as_ref())
            .is_some_and(|l| l.conn == conn);
        if live {
            self.close_conn(conn, code, reason);
            if code == close_code::VERSION_MISMATCH {
                self.note_refusal(peer, reason.to_owned());
            }
        }
    }

    fn is_closing(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_none_or(|c| c.local.is_some())
    }

    /// Closes a live connection and stops sends on it at once.
    fn close_conn(&mut self, conn: ConnId, code: u32, reason: &str) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.local.is_some() {
            return;
        }
        c.local = Some(DisconnectReason::ClosedLocally {
            code,
            reason: reason.to_owned(),
        });
        conn::close(&c.connection, code, reason);
        c.queue.close();
    }
}

/// The next discovery, or never if mDNS does not run.
async fn found(mdns: &mut Option<Mdns>) -> Option<Found> {
    match mdns {
        Some(m) => m.found.recv().await,
        None => std::future::pending().await,
    }
}

/// Forgets a redial waiting for `peer`, if any.
fn cancel_redial(redials: &mut BTreeSet<(Instant, NodeId)>, peer: NodeId, ps: &mut PeerState) {
    if let Some(at) = ps.redial_at.take() {
        redials.remove(&(at, peer));
    }
}

mod links;
