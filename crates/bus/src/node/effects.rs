//! Carrying out the core's effects. Nothing here waits: frames go onto the
//! connection's queue, commits and outbox reads are queued for the store's
//! threads, which answer on the task's own channel.

use std::time::Duration;

use mesh_protocol::{Frame, NodeId};
use mesh_store::{MeshStore, StoreError, WriteOp};
use tracing::{error, info, warn};

use super::NodeError;
use super::actor::{Actor, LoadReq, PeerChange, StoreAnswer, Waiter, now};
use crate::core::{self, CommitId, ConnId, Effect, Millis, PeerChangeError, ReqId};
use crate::net::{CATCHUP_QUEUE_BYTES_MAX, SEND_QUEUE_BYTES_MAX, SendError, close_code};

impl<S: MeshStore + ?Sized> Actor<S> {
    /// Carries out every effect the core has queued, in order.
    pub(super) fn carry_out(&mut self) {
        while let Some(effect) = self.core.poll_effect() {
            match effect {
                Effect::SendFrame { peer, conn, frame } => self.send_frame(peer, conn, &frame),
                Effect::Persist { commit, groups } => self.persist(commit, groups),
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
                    self.load_outbox(peer, req);
                }
                Effect::Reply { req, result } => self.on_reply(req, result),
                Effect::Journaled { upto } => {
                    self.head.send_if_modified(|h| {
                        let moved = upto > *h;
                        *h = (*h).max(upto);
                        moved
                    });
                }
                Effect::SetTimer { at } => self.arm_timer(at),
                Effect::PeerChanged { req, node, result } => {
                    self.on_peer_changed(req, node, result)
                }
                Effect::Written { req, result } => {
                    if let Some(Waiter::Write(reply)) = self.waiters.remove(&req) {
                        let _ = reply.send(result);
                    }
                }
                Effect::EpochChanged { epoch } => {
                    warn!(epoch = %epoch.fmt_short(), "this node started a new store epoch: its store went back in time");
                    self.epoch.send_replace(epoch);
                }
                Effect::AgentMoved { notice } => {
                    info!(agent = %notice.name, to = %notice.node.fmt_short(), version = notice.version, "an agent moved");
                    self.moves
                        .send_replace(std::sync::Arc::new(self.core.agent_moves()));
                }
                Effect::DrainsFollowed { agents } => {
                    info!(
                        agents = agents.len(),
                        "every peer follows the moves of agents away from here"
                    );
                    self.followed
                        .send_replace(std::sync::Arc::new(agents.into_iter().collect()));
                }
                Effect::PeerAddrs { node, addrs } => {
                    info!(peer = %node.fmt_short(), ?addrs, "learned where the peer listens");
                    self.transport.set_addrs(node, addrs);
                    // A card was committed: its name may be new.
                    self.publish_names();
                }
                Effect::CloseConnection { peer, conn, reason } => {
                    warn!(peer = %peer.fmt_short(), %conn, %reason, "closing a connection: the peer broke the protocol");
                    let code = u32::from(&reason);
                    self.transport.close(peer, conn, code, &reason.to_string());
                }
            }
        }
    }

    /// Queues `frame` on `conn`; a peer whose queue grows past
    /// [`SEND_QUEUE_BYTES_MAX`] does not keep up and is disconnected (it
    /// catches up from the outbox after it reconnects).
    fn send_frame(&mut self, peer: NodeId, conn: ConnId, frame: &Frame) {
        match self.transport.send(peer, conn, frame) {
            Ok(queued) if queued > SEND_QUEUE_BYTES_MAX => {
                warn!(peer = %peer.fmt_short(), %conn, queued, "peer does not keep up; disconnecting it");
                self.transport
                    .close(peer, conn, close_code::SLOW_PEER, "peer too slow");
            }
            Ok(_) => {}
            // The core recovers frames of a connection that is gone.
            Err(SendError::NotConnected) => {}
            Err(e) => error!(peer = %peer.fmt_short(), error = %e, "frame not sent"),
        }
    }

    /// Hands the commit to the store's writer thread, which answers on the
    /// task's channel.
    fn persist(&mut self, commit: CommitId, groups: Vec<Vec<WriteOp>>) {
        debug_assert!(
            self.committing.is_none(),
            "the core has one commit in flight"
        );
        self.committing = Some(commit);
        // What was fed so far is in this commit (or was dropped as stale).
        self.fed_since_commit = (0, 0);
        let tx = self.store_tx.clone();
        self.store.commit_then(groups, move |results| {
            // A closed channel means the task is gone: nobody waits.
            let _ = tx.send(StoreAnswer::Committed { commit, results });
        });
    }

    /// Reads the outbox for `peer` once the frames queued before are handed
    /// to the connection: at once if little is queued, else when its writer
    /// next takes the queue.
    fn load_outbox(&mut self, peer: NodeId, req: LoadReq) {
        let Some(conn) = self.transport.live_conn(peer) else {
            // Gone: the core drops the answer as stale.
            self.start_load(req);
            return;
        };
        // A feed (one per stream) has one read outstanding: one of the same
        // stream still waiting here was superseded (a resync restarted the
        // feed), and the core no longer waits for it.
        if let Some(waiting) = self.deferred.get_mut(&conn) {
            waiting.retain(|w| w.stream != req.stream);
        }
        if self
            .transport
            .notify_when_taken(conn, CATCHUP_QUEUE_BYTES_MAX)
        {
            self.deferred.entry(conn).or_default().push(req);
        } else {
            self.start_load(req);
        }
    }

    /// Reads the outbox on the blocking pool; the answer comes on the task's
    /// channel, an error one if the read panics or never runs.
    pub(super) fn start_load(&self, req: LoadReq) {
        let reader = self.store.reader();
        let answer = LoadAnswer {
            load: req.load,
            tx: Some(self.store_tx.clone()),
        };
        let LoadReq {
            stream,
            after,
            max_bytes,
            ..
        } = req;
        // The handle is not needed: the answer comes through `answer`.
        drop(tokio::task::spawn_blocking(move || {
            answer.send(reader.read_outbox(&stream, after, max_bytes));
        }));
    }

    fn on_reply(&mut self, req: ReqId, result: Result<core::SendReceipt, core::SendError>) {
        let (part, index) = match self.waiters.remove(&req) {
            Some(Waiter::Send { part, index }) => (part, index),
            Some(Waiter::Publish(reply)) => {
                let _ = reply.send(result);
                return;
            }
            Some(other) => {
                // Not a send's: put it back (a reply names sends only).
                self.waiters.insert(req, other);
                return;
            }
            None => return,
        };
        let Some(p) = self.parts.get_mut(&part) else {
            return;
        };
        debug_assert!(p.answers[index].is_none(), "one answer per message");
        p.answers[index] = Some(result);
        p.left -= 1;
        if p.left > 0 {
            return;
        }
        if let Some(p) = self.parts.remove(&part) {
            let answers: Vec<_> = p.answers.into_iter().flatten().collect();
            // A caller that stopped waiting is not an error.
            let _ = p.reply.send(answers);
        }
    }

    /// The core committed (or failed to commit) a peer change: tell the
    /// transport, then the caller.
    fn on_peer_changed(&mut self, req: ReqId, node: NodeId, result: Result<(), PeerChangeError>) {
        let Some(Waiter::Peer { change, reply }) = self.waiters.remove(&req) else {
            return;
        };
        let result = match (result, change) {
            (Err(e), _) => Err(NodeError::PeerChange(e)),
            (Ok(()), PeerChange::Add { node, addrs }) => {
                info!(peer = %node.fmt_short(), ?addrs, "peer added");
                self.transport
                    .add_peer(node, addrs)
                    .map_err(NodeError::from)
            }
            (Ok(()), PeerChange::Remove { node }) => {
                info!(peer = %node.fmt_short(), "peer removed");
                self.transport.remove_peer(node);
                Ok(())
            }
        };
        if let Err(e) = &result {
            warn!(peer = %node.fmt_short(), error = %e, "peer change failed");
        }
        self.publish_names();
        let _ = reply.send(result);
    }

    /// Sets the timer to the core's deadline `at`.
    fn arm_timer(&mut self, at: Millis) {
        let wait = Duration::from_millis(at.0.saturating_sub(now().0));
        self.deadline = Some(at);
        self.timer
            .as_mut()
            .reset(tokio::time::Instant::now() + wait);
    }
}

/// An outbox read owed to the core: answered once, with an error if it is
/// dropped unanswered (the read panicked, or the pool dropped it).
struct LoadAnswer {
    load: core::LoadId,
    tx: Option<tokio::sync::mpsc::UnboundedSender<StoreAnswer>>,
}

impl LoadAnswer {
    fn send(mut self, result: Result<Vec<mesh_store::StoredBatch>, StoreError>) {
        if let Some(tx) = self.tx.take() {
            let load = self.load;
            let _ = tx.send(StoreAnswer::Loaded { load, result });
        }
    }
}

impl Drop for LoadAnswer {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let result = Err(StoreError::Unavailable(
                "the outbox read did not finish".into(),
            ));
            let _ = tx.send(StoreAnswer::Loaded {
                load: self.load,
                result,
            });
        }
    }
}
