//! The transport's driver task: accepts and dials, keeps one connection per
//! peer, and reports connections coming and going.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iroh::{Endpoint, EndpointAddr};
use mesh_protocol::NodeId;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{AbortHandle, JoinError, JoinHandle, JoinSet};
use tokio::time::{Instant, timeout};
use tracing::{debug, info, warn};

use super::conn::{self, Established};
use super::outbox::Outbox;
use super::{
    ALPN, Command, ConnId, Counters, DIAL_BACKOFF_MAX, DIAL_BACKOFF_MIN, DIAL_TIMEOUT,
    DisconnectReason, HANDSHAKE_TIMEOUT, MAX_PENDING_ACCEPTS, NetEvent, PAUSED_REASON,
    STABLE_CONNECTION, Shared, close_code,
};

/// How long closing the endpoint may take at shutdown.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// Starts the accept loop and the driver; the handle ends after shutdown.
pub(super) fn spawn(
    endpoint: Endpoint,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<NetEvent>,
) -> JoinHandle<()> {
    let (inbound_tx, inbound) = mpsc::channel(MAX_PENDING_ACCEPTS);
    let accept = tokio::spawn(accept_loop(endpoint.clone(), inbound_tx));
    let closing = shared.closing.subscribe();
    let driver = Driver {
        me: endpoint.id(),
        endpoint,
        shared,
        commands,
        inbound,
        events,
        closing,
        peers: HashMap::new(),
        running: HashMap::new(),
        timers: JoinSet::new(),
        dials: JoinSet::new(),
        conns: JoinSet::new(),
        next_conn: 1,
        next_attempt: 1,
    };
    tokio::spawn(driver.run(accept))
}

/// Accepts incoming connections, at most [`MAX_PENDING_ACCEPTS`] in their
/// handshake at once, and passes on those whose frame stream opened.
/// Unknown nodes never get here: the endpoint hook refuses them.
async fn accept_loop(endpoint: Endpoint, inbound: mpsc::Sender<Established>) {
    let slots = Arc::new(Semaphore::new(MAX_PENDING_ACCEPTS));
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    debug!("too many handshakes in progress; refusing a connection");
                    incoming.refuse();
                    continue;
                };
                let inbound = inbound.clone();
                handshakes.spawn(async move {
                    let _slot = slot;
                    if let Some(est) = accept_one(incoming).await {
                        // Fails only when the driver is gone (shutdown).
                        let _ = inbound.send(est).await;
                    }
                });
            }
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
        }
    }
    handshakes.shutdown().await;
}

async fn accept_one(incoming: iroh::endpoint::Incoming) -> Option<Established> {
    let connection = match timeout(HANDSHAKE_TIMEOUT, incoming).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            // Includes connections the allowlist hook refused (logged there).
            debug!(error = %e, "incoming connection failed");
            return None;
        }
        Err(_) => {
            debug!("incoming connection handshake timed out");
            return None;
        }
    };
    let peer = connection.remote_id();
    match timeout(HANDSHAKE_TIMEOUT, conn::accept_frame_stream(&connection)).await {
        Ok(Ok((send, recv, peer_instance))) => Some(Established {
            peer,
            connection,
            send,
            recv,
            dialed_here: false,
            peer_instance,
        }),
        Ok(Err(e)) => {
            debug!(peer = %peer.fmt_short(), error = %e, "incoming frame stream failed");
            conn::close(&connection, close_code::BAD_PREAMBLE, "bad preamble");
            None
        }
        Err(_) => {
            debug!(peer = %peer.fmt_short(), "incoming frame stream timed out");
            conn::close(
                &connection,
                close_code::HANDSHAKE_TIMEOUT,
                "handshake timed out",
            );
            None
        }
    }
}

/// Dials `addr` and opens the frame stream.
async fn dial(
    endpoint: Endpoint,
    addr: EndpointAddr,
    instance: u64,
) -> Result<Established, String> {
    let peer = addr.id;
    let connection = match timeout(DIAL_TIMEOUT, endpoint.connect(addr, ALPN)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {DIAL_TIMEOUT:?}")),
    };
    match timeout(
        HANDSHAKE_TIMEOUT,
        conn::open_frame_stream(&connection, instance),
    )
    .await
    {
        Ok(Ok((send, recv, peer_instance))) => Ok(Established {
            peer,
            connection,
            send,
            recv,
            dialed_here: true,
            peer_instance,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            conn::close(
                &connection,
                close_code::HANDSHAKE_TIMEOUT,
                "handshake timed out",
            );
            Err(format!("no preamble within {HANDSHAKE_TIMEOUT:?}"))
        }
    }
}

/// What the driver knows about one peer.
#[derive(Debug)]
struct PeerState {
    addrs: Vec<SocketAddr>,
    live: Option<Live>,
    /// A connection that won against `live` and takes over once `live` has
    /// been reported disconnected.
    pending: Option<Established>,
    /// A redial waiting out its backoff; cancelled when a connection appears.
    timer: Option<Task>,
    /// The dial in flight. A connection appearing does not cancel it: the
    /// peer may already have taken it as its live connection, so it runs to
    /// the end and goes through the same rule as any other connection.
    dial: Option<Task>,
    /// The delay before the next redial (before jitter).
    backoff: Duration,
}

impl PeerState {
    fn new(addrs: Vec<SocketAddr>) -> Self {
        PeerState {
            addrs,
            live: None,
            pending: None,
            timer: None,
            dial: None,
            backoff: DIAL_BACKOFF_MIN,
        }
    }

    fn cancel_timer(&mut self) {
        if let Some(t) = self.timer.take() {
            t.abort.abort();
        }
    }

    fn cancel_dial(&mut self) {
        if let Some(t) = self.dial.take() {
            t.abort.abort();
        }
    }

    /// Neither connected nor about to be.
    fn idle(&self) -> bool {
        self.live.is_none() && self.pending.is_none() && self.dial.is_none()
    }
}

#[derive(Debug)]
struct Live {
    conn: ConnId,
    dialed_here: bool,
    /// The peer's instance on this connection.
    peer_instance: u64,
    connection: iroh::endpoint::Connection,
    since: Instant,
    /// Set once this node has closed it; it stays `live` until its task ends.
    closing: bool,
}

/// A dial or a redial timer, told apart from older ones by `attempt`.
#[derive(Debug)]
struct Task {
    attempt: u64,
    abort: AbortHandle,
}

/// A connection task that has not ended yet.
#[derive(Debug)]
struct Running {
    peer: NodeId,
    task: tokio::task::Id,
    /// Why this node closed it, if it did; reported instead of "closed".
    local: Option<DisconnectReason>,
}

type DialResult = (NodeId, u64, Result<Established, String>);
type ConnResult = (NodeId, ConnId, DisconnectReason);

struct Driver {
    me: NodeId,
    endpoint: Endpoint,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    inbound: mpsc::Receiver<Established>,
    events: mpsc::Sender<NetEvent>,
    closing: watch::Receiver<bool>,
    peers: HashMap<NodeId, PeerState>,
    running: HashMap<ConnId, Running>,
    timers: JoinSet<(NodeId, u64)>,
    dials: JoinSet<DialResult>,
    conns: JoinSet<ConnResult>,
    next_conn: u64,
    next_attempt: u64,
}

/// One thing that happened, taken out of the select so handlers may borrow
/// the driver.
enum Step {
    Stop,
    Command(Command),
    Inbound(Established),
    TimerDue(Result<(NodeId, u64), JoinError>),
    Dialed(Result<DialResult, JoinError>),
    Ended(Result<(tokio::task::Id, ConnResult), JoinError>),
}

impl Driver {
    async fn run(mut self, accept: JoinHandle<()>) {
        loop {
            let step = tokio::select! {
                biased;
                _ = self.closing.wait_for(|c| *c) => Step::Stop,
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => Step::Command(cmd),
                    None => Step::Stop,
                },
                Some(res) = self.conns.join_next_with_id(), if !self.conns.is_empty() => Step::Ended(res),
                Some(res) = self.dials.join_next(), if !self.dials.is_empty() => Step::Dialed(res),
                Some(res) = self.timers.join_next(), if !self.timers.is_empty() => Step::TimerDue(res),
                Some(est) = self.inbound.recv() => Step::Inbound(est),
            };
            match step {
                Step::Stop => break,
                Step::Command(cmd) => self.on_command(cmd).await,
                Step::Inbound(est) => self.on_established(est).await,
                Step::Dialed(res) => self.on_dialed(res).await,
                Step::TimerDue(res) => self.on_timer(res),
                Step::Ended(res) => self.on_ended(res).await,
            }
        }
        self.shutdown(accept).await;
    }

    /// Sends an event unless the transport is closing meanwhile.
    async fn emit(&mut self, event: NetEvent) {
        let closing = &mut self.closing;
        tokio::select! {
            biased;
            _ = closing.wait_for(|c| *c) => {}
            // A dropped receiver is fine: nobody wants the event.
            _ = self.events.send(event) => {}
        }
    }

    async fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::PeerAdded { node, addrs } => {
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
                    ps.cancel_timer();
                    self.start_dial(node);
                }
            }
            Command::PeerRemoved { node, done } => {
                if let Some(mut ps) = self.peers.remove(&node) {
                    ps.cancel_timer();
                    ps.cancel_dial();
                    if let Some(p) = ps.pending.take() {
                        conn::close(&p.connection, close_code::PEER_REMOVED, "peer removed");
                    }
                    if let Some(live) = ps.live.as_mut() {
                        self.close_live(node, live, close_code::PEER_REMOVED, "peer removed");
                    }
                    info!(peer = %node.fmt_short(), "peer removed");
                }
                let _ = done.send(());
            }
            Command::SetPaused { node, paused, done } => {
                self.set_paused(node, paused);
                let _ = done.send(());
            }
            Command::Close {
                peer,
                conn,
                code,
                reason,
            } => {
                if let Some(ps) = self.peers.get_mut(&peer)
                    && let Some(mut live) = ps.live.take_if(|l| l.conn == conn)
                {
                    self.close_live(peer, &mut live, code, &reason);
                    if let Some(ps) = self.peers.get_mut(&peer) {
                        ps.live = Some(live);
                    }
                }
            }
        }
    }

    /// Acts on a pause or resume of `node`, already recorded in the shared
    /// set: a pause closes its connections and stops dialing it; a resume
    /// dials it at once with the backoff reset.
    fn set_paused(&mut self, node: NodeId, paused: bool) {
        let Some(ps) = self.peers.get_mut(&node) else {
            // Known to the allowlist but its command is still queued: it is
            // dialed (or not, if paused) when that command arrives.
            return;
        };
        ps.backoff = DIAL_BACKOFF_MIN;
        if paused {
            ps.cancel_timer();
            ps.cancel_dial();
            if let Some(p) = ps.pending.take() {
                conn::close(&p.connection, close_code::PAUSED, PAUSED_REASON);
            }
            if let Some(mut live) = ps.live.take() {
                self.close_live(node, &mut live, close_code::PAUSED, PAUSED_REASON);
                if let Some(ps) = self.peers.get_mut(&node) {
                    ps.live = Some(live);
                }
            }
            info!(peer = %node.fmt_short(), "link paused");
        } else {
            info!(peer = %node.fmt_short(), "link resumed");
            if ps.idle() {
                ps.cancel_timer();
                self.start_dial(node);
            }
        }
    }

    /// Closes the live connection of `peer` and stops sends to it at once.
    fn close_live(&mut self, peer: NodeId, live: &mut Live, code: u32, reason: &str) {
        if live.closing {
            return;
        }
        live.closing = true;
        conn::close(&live.connection, code, reason);
        if let Some(r) = self.running.get_mut(&live.conn) {
            r.local = Some(DisconnectReason::ClosedLocally {
                code,
                reason: reason.to_owned(),
            });
        }
        let mut map = self.shared.live.write().unwrap_or_else(|p| p.into_inner());
        if map.get(&peer).is_some_and(|o| o.conn == live.conn)
            && let Some(o) = map.remove(&peer)
        {
            o.close();
        }
    }

    /// Keeps or refuses a connection whose frame stream is open, by the rule
    /// in the module doc.
    async fn on_established(&mut self, est: Established) {
        let peer = est.peer;
        if !self.peers.contains_key(&peer) {
            // Known to the allowlist but its command is still queued: take it.
            let addrs = self
                .shared
                .peers
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&peer)
                .cloned();
            match addrs {
                Some(addrs) => {
                    self.peers.insert(peer, PeerState::new(addrs));
                }
                None => {
                    Counters::add(&self.shared.counters.refused, 1);
                    warn!(peer = %peer, "refused a connection from an unknown node");
                    conn::close(&est.connection, close_code::UNKNOWN_NODE, "unknown node");
                    return;
                }
            }
        }
        if self.shared.is_paused(&peer) {
            // Accepted before the pause, or our own dial that was under way.
            if !est.dialed_here {
                self.shared.refused_paused(&peer);
            }
            conn::close(&est.connection, close_code::PAUSED, PAUSED_REASON);
            return;
        }
        let me = self.me;
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        let rival = match (&ps.pending, &ps.live) {
            (Some(p), _) => Some((p.dialed_here, p.peer_instance)),
            (None, Some(l)) if !l.closing => Some((l.dialed_here, l.peer_instance)),
            _ => None,
        };
        let new = (est.dialed_here, est.peer_instance);
        if let Some(rival) = rival
            && !new_wins(me, peer, new, rival)
        {
            debug!(peer = %peer.fmt_short(), dialed_here = est.dialed_here, "duplicate connection refused");
            conn::close(
                &est.connection,
                close_code::DUPLICATE,
                "duplicate connection",
            );
            return;
        }
        if let Some(old) = ps.pending.take() {
            conn::close(
                &old.connection,
                close_code::DUPLICATE,
                "duplicate connection",
            );
        }
        ps.cancel_timer();
        if let Some(mut live) = ps.live.take() {
            ps.pending = Some(est);
            self.close_live(
                peer,
                &mut live,
                close_code::DUPLICATE,
                "replaced by a newer connection",
            );
            if let Some(ps) = self.peers.get_mut(&peer) {
                ps.live = Some(live);
            }
            return;
        }
        self.activate(est).await;
    }

    /// Makes `est` the live connection of its peer and starts its task.
    async fn activate(&mut self, est: Established) {
        let peer = est.peer;
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        let outbox = Arc::new(Outbox::new(conn, est.dialed_here));
        ps.live = Some(Live {
            conn,
            dialed_here: est.dialed_here,
            peer_instance: est.peer_instance,
            connection: est.connection.clone(),
            since: Instant::now(),
            closing: false,
        });
        self.shared
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer, outbox.clone());
        Counters::add(&self.shared.counters.connections, 1);
        info!(peer = %peer.fmt_short(), %conn, dialed_here = est.dialed_here, "connected");
        // Connected goes out before the task starts, so it precedes every frame.
        self.emit(NetEvent::Connected { peer, conn }).await;
        let task = self.conns.spawn({
            let events = self.events.clone();
            let shared = self.shared.clone();
            async move {
                (
                    peer,
                    conn,
                    conn::run(est, conn, outbox, events, shared).await,
                )
            }
        });
        self.running.insert(
            conn,
            Running {
                peer,
                task: task.id(),
                local: None,
            },
        );
    }

    async fn on_dialed(&mut self, res: Result<DialResult, JoinError>) {
        let (peer, attempt, result) = match res {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => return,
            Err(e) => {
                warn!(error = %e, "dial task failed");
                return;
            }
        };
        let Some(ps) = self.peers.get_mut(&peer) else {
            if let Ok(est) = result {
                conn::close(&est.connection, close_code::PEER_REMOVED, "peer removed");
            }
            return;
        };
        if ps.dial.as_ref().is_some_and(|d| d.attempt == attempt) {
            ps.dial = None;
        }
        match result {
            // Even a superseded dial may have become the peer's live
            // connection, so it goes through the same rule as any other.
            Ok(est) => self.on_established(est).await,
            Err(e) => {
                Counters::add(&self.shared.counters.dial_failures, 1);
                debug!(peer = %peer.fmt_short(), error = %e, "dial failed");
                if ps.idle() {
                    self.schedule_redial(peer);
                }
            }
        }
    }

    async fn on_ended(&mut self, res: Result<(tokio::task::Id, ConnResult), JoinError>) {
        let (peer, conn, mut reason) = match res {
            Ok((_, r)) => r,
            Err(e) => {
                // Only a panic gets here (tasks are aborted only at shutdown).
                let id = e.id();
                let Some((&conn, r)) = self.running.iter().find(|(_, r)| r.task == id) else {
                    return;
                };
                warn!(peer = %r.peer.fmt_short(), %conn, error = %e, "connection task failed");
                (
                    r.peer,
                    conn,
                    DisconnectReason::Transport(format!("connection task failed: {e}")),
                )
            }
        };
        if let Some(r) = self.running.remove(&conn)
            && let (Some(local), DisconnectReason::ClosedLocally { .. }) = (r.local, &reason)
        {
            reason = local;
        }
        {
            let mut map = self.shared.live.write().unwrap_or_else(|p| p.into_inner());
            if map.get(&peer).is_some_and(|o| o.conn == conn)
                && let Some(o) = map.remove(&peer)
            {
                o.close();
            }
        }
        info!(peer = %peer.fmt_short(), %conn, %reason, "disconnected");
        self.emit(NetEvent::Disconnected { peer, conn, reason })
            .await;
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        let Some(live) = ps.live.take_if(|l| l.conn == conn) else {
            return;
        };
        if live.since.elapsed() >= STABLE_CONNECTION {
            ps.backoff = DIAL_BACKOFF_MIN;
        }
        if let Some(next) = ps.pending.take() {
            self.activate(next).await;
        } else if ps.idle() {
            self.schedule_redial(peer);
        }
    }

    fn on_timer(&mut self, res: Result<(NodeId, u64), JoinError>) {
        // Cancelled timers end here too; only the peer's current one counts.
        let Ok((peer, attempt)) = res else { return };
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        if ps.timer.as_ref().is_some_and(|t| t.attempt == attempt) {
            ps.timer = None;
            if ps.idle() {
                self.start_dial(peer);
            }
        }
    }

    /// Dials `peer` again after its jittered backoff, and grows the backoff.
    /// A paused peer is not redialed.
    fn schedule_redial(&mut self, peer: NodeId) {
        if self.shared.is_paused(&peer) {
            return;
        }
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        ps.cancel_timer();
        let delay = jitter(ps.backoff);
        ps.backoff = (ps.backoff * 2).min(DIAL_BACKOFF_MAX);
        let abort = self.timers.spawn(async move {
            tokio::time::sleep(delay).await;
            (peer, attempt)
        });
        ps.timer = Some(Task { attempt, abort });
        debug!(peer = %peer.fmt_short(), ?delay, "redial scheduled");
    }

    /// Dials `peer` now. A peer without addresses waits to be dialed instead;
    /// a paused peer is not dialed.
    fn start_dial(&mut self, peer: NodeId) {
        if self.shared.is_paused(&peer) {
            return;
        }
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        if ps.addrs.is_empty() {
            return;
        }
        let mut addr = EndpointAddr::new(peer);
        for a in &ps.addrs {
            addr = addr.with_ip_addr(*a);
        }
        let endpoint = self.endpoint.clone();
        let instance = self.shared.instance;
        let abort = self
            .dials
            .spawn(async move { (peer, attempt, dial(endpoint, addr, instance).await) });
        ps.dial = Some(Task { attempt, abort });
        debug!(peer = %peer.fmt_short(), attempt, "dialing");
    }

    async fn shutdown(mut self, accept: JoinHandle<()>) {
        self.timers.abort_all();
        self.dials.abort_all();
        for ps in self.peers.values_mut() {
            if let Some(p) = ps.pending.take() {
                conn::close(&p.connection, close_code::SHUTDOWN, "shutdown");
            }
            if let Some(live) = &ps.live {
                conn::close(&live.connection, close_code::SHUTDOWN, "shutdown");
            }
        }
        for (_, o) in self
            .shared
            .live
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            o.close();
        }
        // Flushes the close frames; bounded in case the network stack hangs.
        if timeout(SHUTDOWN_TIMEOUT, self.endpoint.close())
            .await
            .is_err()
        {
            warn!("closing the endpoint timed out");
        }
        accept.abort();
        self.conns.shutdown().await;
        self.dials.shutdown().await;
        self.timers.shutdown().await;
        debug!("transport shut down");
    }
}

/// Whether a new connection beats its rival, each given as (dialed here,
/// the peer's instance): one to a newer instance of the peer wins (the peer
/// restarted, so the rival leads to a dead process) and one to an older
/// instance loses; with the same instance, from the same dialer the newer
/// wins and from different dialers the one dialed by the lower node id wins.
fn new_wins(me: NodeId, peer: NodeId, new: (bool, u64), rival: (bool, u64)) -> bool {
    let ((new_dialed_here, new_instance), (rival_dialed_here, rival_instance)) = (new, rival);
    if new_instance != rival_instance {
        return new_instance > rival_instance;
    }
    if new_dialed_here == rival_dialed_here {
        return true;
    }
    let new_dialer = if new_dialed_here { me } else { peer };
    let rival_dialer = if rival_dialed_here { me } else { peer };
    new_dialer.as_bytes() < rival_dialer.as_bytes()
}

/// A random delay in `[d/2, d]`, so peers that lost each other together do
/// not redial in lockstep.
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    let extra_us = rand::random_range(0..=half.as_micros().min(u128::from(u64::MAX)) as u64);
    half + Duration::from_micros(extra_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::SecretKey;

    fn ids() -> (NodeId, NodeId) {
        let a = SecretKey::generate().public();
        let b = SecretKey::generate().public();
        if a.as_bytes() < b.as_bytes() {
            (a, b)
        } else {
            (b, a)
        }
    }

    #[test]
    fn both_sides_keep_the_connection_dialed_by_the_lower_id() {
        let (low, high) = ids();
        // Low's view: new = dialed by low (here), rival = dialed by high.
        assert!(new_wins(low, high, (true, 1), (false, 1)));
        assert!(!new_wins(low, high, (false, 1), (true, 1)));
        // High's view of the same two connections.
        assert!(new_wins(high, low, (false, 1), (true, 1)));
        assert!(!new_wins(high, low, (true, 1), (false, 1)));
    }

    #[test]
    fn a_newer_connection_from_the_same_dialer_replaces_the_older() {
        let (low, high) = ids();
        assert!(new_wins(low, high, (false, 1), (false, 1)));
        assert!(new_wins(high, low, (false, 1), (false, 1)));
        assert!(new_wins(low, high, (true, 1), (true, 1)));
    }

    #[test]
    fn a_connection_to_a_restarted_peer_beats_one_to_its_old_process() {
        let (low, high) = ids();
        // High restarted and dials low, which holds its own dial to old high:
        // the rule by dialer alone would keep the dead one.
        assert!(new_wins(low, high, (false, 2), (true, 1)));
        // A late connection from the old process never replaces the new one.
        assert!(!new_wins(low, high, (false, 1), (true, 2)));
        assert!(!new_wins(low, high, (true, 1), (false, 2)));
    }

    #[test]
    fn jitter_stays_within_half_to_full() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_millis(100));
            assert!(j >= Duration::from_millis(50) && j <= Duration::from_millis(100));
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
