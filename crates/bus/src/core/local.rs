//! Requests of the local clients (sends, writes, peer changes, this node's
//! card): refused at once, or queued for the next commit.

use mesh_protocol::{NodeCard, NodeId};
use mesh_store::StoreError;

use super::agents::Tracked;
use super::commit::WaitingSend;
use super::peers::PeerChange;
use super::{
    Core, Effect, LocalWrite, Millis, PAYLOAD_BYTES_MAX, PeerChangeError, ReqId, SendError,
    WAITING_PEER_CHANGES_MAX, WAITING_SEND_BYTES_MAX, WAITING_SENDS_MAX, WAITING_WRITES_MAX,
};

impl Core {
    /// This node issued a newer card: kept with the next commit, sent in
    /// every later Hello and in answers about this node.
    pub(super) fn on_own_card(&mut self, card: NodeCard) {
        debug_assert_eq!(card.node, self.me, "a node issues only its own card");
        if card.node != self.me || !card.is_newer_than(&self.own_card) {
            return;
        }
        self.own_card = card.clone();
        self.committer.queue_card(card);
    }

    /// Queues a local write for the next commit; a name the store could
    /// never take, or a full queue, is refused at once.
    pub(super) fn on_write(&mut self, req: ReqId, write: LocalWrite) {
        let (name, max) = write.name();
        let waiting = self.committer.writes_waiting();
        let refused = if name.len() > max {
            Some(StoreError::Conflict(format!(
                "a name of {} bytes is longer than the {max} the store takes",
                name.len()
            )))
        } else if let Err(e) = self.check_agent_write(&write) {
            Some(e)
        } else if waiting >= WAITING_WRITES_MAX {
            Some(StoreError::Busy { waiting })
        } else {
            None
        };
        match refused {
            Some(e) => self.out.push(Effect::Written {
                req,
                result: Err(e),
            }),
            None => self.committer.queue_write(req, write),
        }
    }

    /// Queues a peer change for the next commit; it takes effect once committed.
    pub(super) fn on_peer_change(&mut self, req: ReqId, change: PeerChange) {
        let node = change.node();
        let waiting = self.committer.peer_changes_waiting();
        let refused = if node == self.me {
            Some(PeerChangeError::SelfPeer)
        } else if waiting >= WAITING_PEER_CHANGES_MAX {
            Some(PeerChangeError::Busy { waiting })
        } else {
            None
        };
        if let Some(e) = refused {
            let result = Err(e);
            self.out.push(Effect::PeerChanged { req, node, result });
            return;
        }
        self.committer.queue_peer_change(req, change);
    }

    /// Applies a committed peer change.
    pub(super) fn apply_peer_change(&mut self, change: PeerChange) {
        if let PeerChange::Remove(node) = change {
            self.forget_conn(node);
            self.committer.drop_acks(node);
        }
        self.peers.apply(change);
    }

    /// A forward the driver asks for (of an agent that moved): a send of
    /// the mesh's kind [`mesh_protocol::KIND_FORWARD`] or
    /// [`mesh_protocol::KIND_FORWARD_TRIMMED`], refused unless its payload
    /// is one of that kind.
    pub(super) fn on_forward(
        &mut self,
        req: ReqId,
        to: NodeId,
        kind: u16,
        payload: Vec<u8>,
        now: Millis,
    ) {
        let decoded = match kind {
            mesh_protocol::KIND_FORWARD => mesh_protocol::Forward::decode(&payload).map(drop),
            mesh_protocol::KIND_FORWARD_TRIMMED => {
                mesh_protocol::ForwardTrimmed::decode(&payload).map(drop)
            }
            _ => Ok(()),
        };
        let refused = match decoded {
            _ if !mesh_protocol::is_forward_kind(kind) => Some(SendError::Internal(format!(
                "kind {kind} is not a forward's"
            ))),
            Err(e) => Some(SendError::Internal(format!("not a forward: {e}"))),
            Ok(()) => self.check_send(to, payload.len() as u64).err(),
        };
        if let Some(e) = refused {
            self.refuse_send(req, e);
            return;
        }
        if kind == mesh_protocol::KIND_FORWARD_TRIMMED {
            self.out.metrics.agents.forwards_trimmed_sent += 1;
        } else {
            self.out.metrics.agents.forwards_sent += 1;
        }
        self.queue_checked_send(req, to, kind, payload, now, None);
    }

    /// Queues a send that passed its checks for the next commit, taken at
    /// `now`; `tracked` carries its agent addressing and client id, if any.
    pub(super) fn queue_checked_send(
        &mut self,
        req: ReqId,
        to: NodeId,
        kind: u16,
        payload: Vec<u8>,
        now: Millis,
        tracked: Option<Box<Tracked>>,
    ) {
        self.committer.queue_send(WaitingSend {
            req,
            to,
            kind,
            payload,
            created_ms: now.0,
            tracked,
        });
    }

    pub(super) fn on_send(
        &mut self,
        req: ReqId,
        to: NodeId,
        kind: u16,
        payload: Vec<u8>,
        now: Millis,
    ) {
        if mesh_protocol::is_mesh_kind(kind) {
            self.refuse_send(req, SendError::ReservedKind(kind));
            return;
        }
        if let Err(e) = self.check_send(to, payload.len() as u64) {
            self.refuse_send(req, e);
            return;
        }
        self.queue_checked_send(req, to, kind, payload, now, None);
    }

    /// Refuses a send at once: a bad request or a full queue. Whether its
    /// outbox takes it is decided when its commit is built.
    pub(super) fn check_send(&self, to: NodeId, len: u64) -> Result<(), SendError> {
        if to == self.me {
            return Err(SendError::ToSelf);
        }
        if !self.peers.is_peer(to) {
            return Err(SendError::UnknownPeer(to));
        }
        self.check_room(len)
    }

    /// Refuses a send that can never fit, or that finds the queue full.
    pub(super) fn check_room(&self, len: u64) -> Result<(), SendError> {
        let max = PAYLOAD_BYTES_MAX.min(self.config.outbox.max_bytes);
        if len > max {
            return Err(SendError::TooLarge { len, max });
        }
        self.check_hold(1, len)?;
        let (waiting, waiting_bytes) = self.committer.sends_waiting();
        if waiting >= WAITING_SENDS_MAX || waiting_bytes + len > WAITING_SEND_BYTES_MAX {
            return Err(SendError::Busy { waiting });
        }
        Ok(())
    }

    /// While the store is down: refuses `msgs` more messages of `len`
    /// payload bytes that the hold bounds have no room for, beside the
    /// sends and publishes held already (one budget).
    fn check_hold(&self, msgs: usize, len: u64) -> Result<(), SendError> {
        let Some(down) = self.committer.store_down() else {
            return Ok(());
        };
        let (held, held_bytes) = self.committer.held();
        let (msgs_max, bytes_max) = self.config.hold_bounds();
        if held + msgs > msgs_max || held_bytes + len > bytes_max {
            return Err(SendError::StoreDown {
                held,
                why: down.why.clone(),
            });
        }
        Ok(())
    }

    /// Queues the publishes `msgs` to `topic` for the next commit, or
    /// refuses them all at once: a reserved kind or a payload too large in
    /// any of them, a topic this node is not a member of, a store that is
    /// down with no room left within the hold bounds for all of them, a
    /// queue without room for all of them.
    pub(super) fn on_publish(
        &mut self,
        topic: mesh_protocol::TopicName,
        msgs: Vec<super::Publication>,
        now: Millis,
    ) {
        let len: u64 = msgs.iter().map(|m| m.payload.len() as u64).sum();
        let (waiting, waiting_bytes) = self.committer.publishes_waiting();
        let one = |m: &super::Publication| {
            if mesh_protocol::is_mesh_kind(m.kind) {
                Some(SendError::ReservedKind(m.kind))
            } else if m.payload.len() as u64 > PAYLOAD_BYTES_MAX {
                Some(SendError::TooLarge {
                    len: m.payload.len() as u64,
                    max: PAYLOAD_BYTES_MAX,
                })
            } else {
                None
            }
        };
        let refused = if let Some(e) = msgs.iter().find_map(one) {
            Some(e)
        } else if self.topics.record(&topic).is_none() {
            Some(SendError::NotAMember(topic.clone()))
        } else if let Err(e) = self.check_hold(msgs.len(), len) {
            Some(e)
        } else if waiting + msgs.len() > WAITING_SENDS_MAX
            || waiting_bytes + len > WAITING_SEND_BYTES_MAX
        {
            Some(SendError::Busy { waiting })
        } else {
            None
        };
        if let Some(e) = refused {
            for m in msgs {
                self.refuse_send(m.req, e.clone());
            }
            return;
        }
        self.committer.queue_publishes(&topic, msgs, now);
    }

    /// Refuses the local send or publish `req` with `e`: counted, and
    /// answered at once.
    fn refuse_send(&mut self, req: ReqId, e: SendError) {
        self.out.metrics.sends_refused += 1;
        self.out.push(Effect::Reply {
            req,
            result: Err(e),
        });
    }
}
