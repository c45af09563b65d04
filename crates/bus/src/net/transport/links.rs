//! How connections come and go: refusing unknown and paused peers, the
//! one-connection rule, starting a live connection's tasks, reporting its
//! end, dialing and redialing with backoff, and shutting down.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinError;
use tokio::time::{Instant, timeout};
use tracing::{Instrument, debug, error_span, info, warn};

use super::{
    Authenticated, ConnTask, DIAL_BACKOFF_MAX, Dialed, DisconnectReason, Event, Failed, Live,
    PAUSED_REASON, PeerState, Reader, SHUTDOWN_TIMEOUT, STABLE_CONNECTION, SendQueue, Transport,
    cancel_redial, close_code, conn, endpoint, jitter, new_wins,
};
use crate::core::ConnId;
use crate::net::conn::Established;
use crate::net::counters::Counters;
use crate::net::peers::Dial;
use mesh_protocol::NodeId;

impl<T: Send + 'static> Transport<T> {
    /// An incoming connection past TLS: refused at once if its key is not a
    /// known peer's (with [`close_code::UNKNOWN_NODE`]) or its link is paused,
    /// else its frame stream is accepted.
    pub(super) fn on_authenticated(&mut self, a: Authenticated) {
        let Authenticated { connection, slot } = a;
        let peer = connection.remote_id();
        if connection.alpn() == mesh_protocol::JOIN_ALPN {
            // Any node may ask to join; the inviter bounds and times it.
            drop(slot);
            let refused = match &self.joins {
                Some(joins) => joins.try_send(connection).err().map(|e| e.into_inner()),
                None => Some(connection),
            };
            if let Some(connection) = refused {
                debug!(peer = %peer.fmt_short(), "a join attempt refused: too many at once");
                conn::close(
                    &connection,
                    close_code::JOIN_BUSY,
                    "too many joins at once; try again",
                );
            }
            return;
        }
        if connection.alpn() == mesh_protocol::MOVE_ALPN {
            drop(slot);
            self.on_move_connection(connection);
            return;
        }
        let Some(ps) = self.peers.get_mut(&peer) else {
            Counters::add(&self.counters.refused, 1);
            warn!(peer = %peer, "refused a connection from an unknown node");
            conn::close(&connection, close_code::UNKNOWN_NODE, "unknown node");
            return;
        };
        if ps.paused.is_some() {
            refused_paused(&self.counters, peer, ps);
            conn::close(&connection, close_code::PAUSED, PAUSED_REASON);
            return;
        }
        let span = error_span!("accept", peer = %peer.fmt_short());
        self.handshakes.spawn(
            async move {
                let _slot = slot;
                endpoint::accept_stream(connection).await
            }
            .instrument(span),
        );
    }

    /// A connection on the move ALPN: taken only from a known peer whose
    /// link is not paused ([`move_admission`]), before anything is read.
    fn on_move_connection(&mut self, connection: iroh::endpoint::Connection) {
        let peer = connection.remote_id();
        let refused = match move_admission(self.peers.get(&peer)) {
            Err(refusal) => Some((refusal, connection)),
            Ok(()) => match &self.moves {
                Some(moves) => moves.try_send(connection).err().map(|e| {
                    (
                        MoveRefusal::Busy("too many agent moves at once; try again"),
                        e.into_inner(),
                    )
                }),
                None => Some((
                    MoveRefusal::Busy("this node takes no agent moves"),
                    connection,
                )),
            },
        };
        let Some((refusal, connection)) = refused else {
            return;
        };
        match refusal {
            MoveRefusal::UnknownNode => {
                Counters::add(&self.counters.refused, 1);
                warn!(peer = %peer, "refused an agent move from a node that is not a peer");
            }
            MoveRefusal::Paused => Counters::add(&self.counters.paused_refused, 1),
            MoveRefusal::Busy(why) => {
                debug!(peer = %peer.fmt_short(), why, "an agent move refused")
            }
        }
        let (code, reason) = refusal.close();
        conn::close(&connection, code, reason);
    }

    /// Keeps or refuses a connection whose frame stream is open: against the
    /// one the peer has (or the one chosen to replace it), a connection to a
    /// newer instance of the peer wins, then the newer of two from one
    /// dialer, then the one the lower node id dialed ([`new_wins`]).
    pub(super) fn on_established(&mut self, est: Established) {
        let peer = est.peer;
        let Some(ps) = self.peers.get_mut(&peer) else {
            // Removed while the handshake ran (or our dial's peer is gone).
            refuse_peerless(&self.counters, &est);
            return;
        };
        if ps.paused.is_some() {
            // Accepted before the pause, or our own dial that was under way.
            if !est.dialed_here {
                refused_paused(&self.counters, peer, ps);
            }
            conn::close(&est.connection, close_code::PAUSED, PAUSED_REASON);
            return;
        }
        let rival = rival_of(ps, &self.conns);
        let new = (est.dialed_here, est.peer_instance);
        if let Some((_, rival_instance)) = rival
            && ps.superseded == Some(est.peer_instance)
            && rival_instance != est.peer_instance
        {
            // The instance a newer one replaced is alive: two processes
            // run with the peer's key. Neither is dropped in silence.
            refuse_identity_conflict(&self.counters, ps, &est, rival_instance);
            return;
        }
        if let Some((_, rival_instance)) = rival
            && rival_instance > est.peer_instance
        {
            // An older instance of the peer connects while a newer one is
            // connected: it is alive too (it just finished a handshake), so
            // two processes run with the peer's key; from now on its
            // connections are refused as such, never as mere duplicates.
            ps.superseded = Some(est.peer_instance);
            refuse_identity_conflict(&self.counters, ps, &est, rival_instance);
            return;
        }
        if let Some(rival) = rival
            && !new_wins(self.me, peer, new, rival)
        {
            debug!(peer = %peer.fmt_short(), dialed_here = est.dialed_here, "duplicate connection refused");
            conn::close(
                &est.connection,
                close_code::DUPLICATE,
                "duplicate connection",
            );
            return;
        }
        if let Some((_, rival_instance)) = rival
            && rival_instance < est.peer_instance
        {
            // A newer instance of the peer takes over: the old one is taken
            // for dead, and a connection from it later is a conflict.
            ps.superseded = Some(rival_instance);
        }
        if let Some(old) = ps.pending.take() {
            conn::close(
                &old.connection,
                close_code::DUPLICATE,
                "duplicate connection",
            );
        }
        cancel_redial(&mut self.redials, peer, ps);
        if let Some(live) = ps.live.as_ref().map(|l| l.conn) {
            // The new one takes over once the old one is reported gone.
            ps.pending = Some(est);
            self.close_conn(
                live,
                close_code::DUPLICATE,
                "replaced by a newer connection",
            );
            return;
        }
        self.activate(est);
    }

    /// Makes `est` the live connection of its peer and starts its reader and
    /// writer; `Connected` goes out before any of its frames.
    fn activate(&mut self, est: Established) {
        let Established {
            peer,
            connection,
            send,
            recv,
            dialed_here,
            peer_instance,
        } = est;
        let Some(ps) = self.peers.get_mut(&peer) else {
            conn::close(&connection, close_code::PEER_REMOVED, "peer removed");
            return;
        };
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        ps.refused = None;
        ps.live = Some(Live {
            conn,
            dialed_here,
            peer_instance,
            since: Instant::now(),
        });
        Counters::add(&self.counters.connections, 1);
        info!(peer = %peer.fmt_short(), %conn, dialed_here, "connected");
        self.ready.push_back(Event::Connected { peer, conn });
        let queue = Arc::new(SendQueue::new(conn, self.taken_tx.clone()));
        let (failed_tx, failed_rx) = oneshot::channel();
        let span = error_span!("conn", peer = %peer.fmt_short(), %conn);
        // The acceptor's preamble tells the dialer its connection was taken.
        let preamble = (!dialed_here).then(|| conn::preamble(self.instance));
        let writer = conn::write_task(
            send,
            queue.clone(),
            preamble,
            self.counters.clone(),
            failed_tx,
        );
        let writer = tokio::spawn(writer.instrument(span.clone())).abort_handle();
        let reader = Reader {
            peer,
            conn,
            connection: connection.clone(),
            recv,
            open: self.open,
            events: self.events_tx.clone(),
            budget: self.budget.clone(),
            counters: self.counters.clone(),
            queue: queue.clone(),
            writer_failed: failed_rx,
        };
        let handle = self.readers.spawn(reader.run().instrument(span));
        self.reader_conns.insert(handle.id(), (peer, conn));
        let task = ConnTask {
            peer,
            connection,
            queue,
            writer,
            local: None,
        };
        self.conns.insert(conn, task);
    }

    /// `conn` to `peer` ended: report it, then let a connection that won
    /// against it take over, or redial.
    pub(super) fn on_ended(&mut self, peer: NodeId, conn: ConnId, mut reason: DisconnectReason) {
        let Some(task) = self.conns.remove(&conn) else {
            // Reported already (a reader that failed after its last word).
            return;
        };
        task.writer.abort();
        task.queue.close();
        if let (Some(local), DisconnectReason::ClosedLocally { .. }) = (task.local, &reason) {
            reason = local;
        }
        info!(peer = %peer.fmt_short(), %conn, %reason, "disconnected");
        let refused = match &reason {
            DisconnectReason::ClosedByPeer { code, reason } => Some((*code, reason.clone())),
            _ => None,
        };
        if let DisconnectReason::ClosedByPeer { code, reason } = &reason
            && *code == u64::from(close_code::VERSION_MISMATCH)
        {
            self.note_refusal(
                peer,
                format!("the peer refused this node's protocol: {reason}"),
            );
        }
        self.ready
            .push_back(Event::Disconnected { peer, conn, reason });
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        if let Some((code, why)) = refused {
            note_conflict(&self.counters, peer, ps, code, why);
        }
        let Some(live) = ps.live.take_if(|l| l.conn == conn) else {
            return;
        };
        if live.since.elapsed() >= STABLE_CONNECTION {
            ps.backoff = super::DIAL_BACKOFF_MIN;
        }
        if let Some(next) = ps.pending.take() {
            self.activate(next);
        } else if ps.idle() {
            self.schedule_redial(peer);
        }
    }

    /// A reader task ended; one that panicked never reported its end, so it
    /// is reported here.
    pub(super) fn on_reader_done(&mut self, res: Result<(tokio::task::Id, ()), JoinError>) {
        let (id, failure) = match res {
            Ok((id, ())) => (id, None),
            Err(e) => (e.id(), Some(e)),
        };
        let Some((peer, conn)) = self.reader_conns.remove(&id) else {
            return;
        };
        if let Some(e) = failure
            && self.conns.contains_key(&conn)
        {
            warn!(peer = %peer.fmt_short(), %conn, error = %e, "connection task failed");
            let reason = DisconnectReason::Transport(format!("connection task failed: {e}"));
            self.on_ended(peer, conn, reason);
        }
    }

    /// An incoming handshake failed; a protocol refusal is recorded.
    pub(super) fn on_handshake_failed(&mut self, failed: Failed) {
        if let Some(why) = failed.refusal {
            self.note_refusal(failed.peer, why);
        }
    }

    pub(super) fn on_dialed(&mut self, dialed: Dialed) {
        let (peer, attempt, result) = dialed;
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
            Ok(est) => self.on_established(est),
            Err(failed) => {
                Counters::add(&self.counters.dial_failures, 1);
                debug!(peer = %peer.fmt_short(), error = %failed.why, "dial failed");
                let idle = ps.idle();
                if let Some((code, reason)) = failed.closed {
                    note_conflict(&self.counters, peer, ps, code, reason);
                }
                if let Some(why) = failed.refusal {
                    self.note_refusal(peer, why);
                }
                if idle {
                    self.schedule_redial(peer);
                }
            }
        }
    }

    /// Starts the redials that are due.
    pub(super) fn on_redials_due(&mut self) {
        let now = Instant::now();
        while let Some(&(at, peer)) = self.redials.first() {
            if at > now {
                break;
            }
            self.redials.pop_first();
            let Some(ps) = self.peers.get_mut(&peer) else {
                continue;
            };
            debug_assert_eq!(ps.redial_at, Some(at), "a cancelled redial left the queue");
            ps.redial_at = None;
            if ps.idle() {
                self.start_dial(peer);
            }
        }
    }

    /// Dials `peer` again after its jittered backoff, and grows the backoff.
    /// A paused peer is not redialed.
    pub(super) fn schedule_redial(&mut self, peer: NodeId) {
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        if ps.paused.is_some() {
            return;
        }
        cancel_redial(&mut self.redials, peer, ps);
        let delay = jitter(&mut self.rng, ps.backoff);
        ps.backoff = (ps.backoff * 2).min(DIAL_BACKOFF_MAX);
        let at = Instant::now() + delay;
        ps.redial_at = Some(at);
        self.redials.insert((at, peer));
        debug!(peer = %peer.fmt_short(), ?delay, "redial scheduled");
    }

    /// Dials `peer` now. A peer without addresses waits to be dialed instead;
    /// a paused peer is not dialed.
    pub(super) fn start_dial(&mut self, peer: NodeId) {
        let Some(ps) = self.peers.get_mut(&peer) else {
            return;
        };
        if ps.paused.is_some() || (ps.addrs.is_empty() && self.relays.is_empty()) {
            return;
        }
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        let (ep, addrs, instance) = (self.endpoint.clone(), ps.addrs.clone(), self.instance);
        let relays = self.relays.clone();
        let span = error_span!("dial", peer = %peer.fmt_short(), attempt);
        let dial = async move {
            (
                peer,
                attempt,
                endpoint::dial(ep, peer, addrs, relays, instance).await,
            )
        };
        let abort = self.dials.spawn(dial.instrument(span));
        ps.dial = Some(Dial { attempt, abort });
        debug!(peer = %peer.fmt_short(), attempt, "dialing");
    }

    /// Closes every connection (code [`close_code::SHUTDOWN`]) and the
    /// endpoint, waits (bounded) until the close frames are flushed, and
    /// stops every task.
    pub(crate) async fn shutdown(mut self) {
        self.dials.abort_all();
        self.handshakes.abort_all();
        for ps in self.peers.values_mut() {
            if let Some(p) = ps.pending.take() {
                conn::close(&p.connection, close_code::SHUTDOWN, "shutdown");
            }
        }
        for c in self.conns.values() {
            conn::close(&c.connection, close_code::SHUTDOWN, "shutdown");
            c.queue.close();
        }
        // Flushes the close frames; bounded in case the network stack hangs.
        if timeout(SHUTDOWN_TIMEOUT, self.endpoint.close())
            .await
            .is_err()
        {
            warn!("closing the endpoint timed out");
        }
        self.accept.abort();
        for c in self.conns.values() {
            c.writer.abort();
        }
        self.readers.shutdown().await;
        self.dials.shutdown().await;
        self.handshakes.shutdown().await;
        debug!("transport shut down");
    }
}

/// Refuses `est`, whose peer is not (or no longer) known: our own dial's
/// as a removed peer's, an accepted one as an unknown node's (counted).
fn refuse_peerless(counters: &Counters, est: &Established) {
    let (code, why) = if est.dialed_here {
        (close_code::PEER_REMOVED, "peer removed")
    } else {
        Counters::add(&counters.refused, 1);
        (close_code::UNKNOWN_NODE, "unknown node")
    };
    conn::close(&est.connection, code, why);
}

/// The connection a new one of the peer of `ps` must beat, as (dialed
/// here, peer instance): the one chosen to replace the live one, else the
/// live one while it is not being closed.
fn rival_of(ps: &PeerState, conns: &HashMap<ConnId, ConnTask>) -> Option<(bool, u64)> {
    let live_open = ps
        .live
        .as_ref()
        .filter(|l| conns.get(&l.conn).is_some_and(|c| c.local.is_none()));
    match (&ps.pending, live_open) {
        (Some(p), _) => Some((p.dialed_here, p.peer_instance)),
        (None, Some(l)) => Some((l.dialed_here, l.peer_instance)),
        (None, None) => None,
    }
}

/// Refuses `est`, a connection from the peer instance a newer one
/// replaced, while `rival_instance` is live: counted, warned of once per
/// distinct conflict, and kept in `ps` for a person to see.
fn refuse_identity_conflict(
    counters: &Counters,
    ps: &mut PeerState,
    est: &Established,
    rival_instance: u64,
) {
    let peer = est.peer;
    let why = format!(
        "identity conflict: two processes run with node key {} (instances {} and {}, \
         both live): a copied data dir run twice? Stop one of them",
        peer.fmt_short(),
        est.peer_instance,
        rival_instance
    );
    Counters::add(&counters.identity_conflicts, 1);
    if ps.conflict.as_deref() != Some(why.as_str()) {
        warn!(peer = %peer.fmt_short(), "{why}; refusing the connection of the older one");
    }
    conn::close(&est.connection, close_code::IDENTITY_CONFLICT, &why);
    ps.conflict = Some(why);
}

/// Counts a connection of `peer` refused because its link is paused; logs
/// the first of each pause at info, the others at debug.
fn refused_paused(counters: &Counters, peer: NodeId, ps: &mut PeerState) {
    Counters::add(&counters.paused_refused, 1);
    let first = ps
        .paused
        .as_mut()
        .is_some_and(|logged| !std::mem::replace(logged, true));
    if first {
        info!(peer = %peer.fmt_short(), "refused a connection: the link is paused (logged once per pause)");
    } else {
        debug!(peer = %peer.fmt_short(), "refused a connection: the link is paused");
    }
}

/// The peer closed a connection of ours with `code`: an identity conflict
/// (another process with this node's key is connected to it) is logged
/// (once per distinct reason), counted and kept for status.
fn note_conflict(counters: &Counters, peer: NodeId, ps: &mut PeerState, code: u64, why: String) {
    if code != u64::from(close_code::IDENTITY_CONFLICT) {
        return;
    }
    Counters::add(&counters.identity_conflicts, 1);
    if ps.conflict.as_deref() != Some(why.as_str()) {
        warn!(peer = %peer.fmt_short(), "the peer refused this node: {why}");
    }
    ps.conflict = Some(why);
}

/// Why a connection on the move ALPN is closed before it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MoveRefusal {
    /// Its key is not a known peer's.
    UnknownNode,
    /// The link to the peer is paused here.
    Paused,
    /// Nothing takes it now.
    Busy(&'static str),
}

impl MoveRefusal {
    /// The close code and reason it is sent with.
    pub(crate) fn close(self) -> (u32, &'static str) {
        match self {
            MoveRefusal::UnknownNode => (
                close_code::UNKNOWN_NODE,
                "not a peer: agent moves are taken from peers only",
            ),
            MoveRefusal::Paused => (close_code::PAUSED, PAUSED_REASON),
            MoveRefusal::Busy(why) => (close_code::MOVE_BUSY, why),
        }
    }
}

/// Whether an agent move may be read from a node whose peer state here is
/// `ps`: only from a known peer whose link is not paused.
pub(crate) fn move_admission(ps: Option<&PeerState>) -> Result<(), MoveRefusal> {
    match ps {
        None => Err(MoveRefusal::UnknownNode),
        Some(ps) if ps.paused.is_some() => Err(MoveRefusal::Paused),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod move_tests {
    use super::*;

    #[test]
    fn a_move_is_read_only_from_a_known_peer_whose_link_is_not_paused() {
        assert_eq!(move_admission(None), Err(MoveRefusal::UnknownNode));
        let mut ps = PeerState::new(Vec::new());
        assert_eq!(move_admission(Some(&ps)), Ok(()));
        ps.paused = Some(false);
        assert_eq!(move_admission(Some(&ps)), Err(MoveRefusal::Paused));
        assert_eq!(MoveRefusal::UnknownNode.close().0, close_code::UNKNOWN_NODE);
    }
}
