//! The receive side: a peer batch's agent messages to inboxes and the
//! index, bounces, and read receipts.

use mesh_protocol::{
    AgentHeader, Bounce, BounceReason, Envelope, Forward, ForwardTrimmed, KIND_AGENT, KIND_BOUNCE,
    KIND_FORWARD, KIND_FORWARD_TRIMMED, KIND_READ_RECEIPT, KIND_TOMBSTONE, NodeId, ReadReceipt,
    StreamId, Tombstone,
};
use mesh_store::{
    AgentIndex, AgentOp, InboxKind, InboxRow, MessageDir, MessageRow, ReadMark, WriteOp,
};

use crate::core::commit::{InboundWork, WaitingSend};
use crate::core::{Core, Millis, ReqId};

impl Core {
    /// The index op for a peer batch about to be committed (its agent
    /// messages to their inboxes and the message index, its bounces to
    /// their senders), queueing a bounce for every agent message to an
    /// agent this node does not host.
    pub(in crate::core) fn index_inbound(
        &mut self,
        work: &InboundWork,
        now: Millis,
    ) -> Vec<WriteOp> {
        let InboundWork::Accept {
            peer, from, batch, ..
        } = work
        else {
            return Vec::new();
        };
        let stream = batch.batch().stream().clone();
        let mut entries = Vec::new();
        let mut ops = Vec::new();
        for e in batch.envelopes().filter(|e| e.seq >= *from) {
            match e.header.kind {
                KIND_AGENT => self.index_inbound_agent(*peer, &stream, &e, now, &mut entries),
                KIND_BOUNCE => self.index_inbound_bounce(&e, &mut entries, &mut ops),
                KIND_TOMBSTONE => self.index_inbound_tombstone(*peer, &stream, &e, &mut entries),
                KIND_FORWARD => self.index_inbound_forward(&stream, &e, &mut entries),
                KIND_FORWARD_TRIMMED => self.index_inbound_forward_trimmed(&e, &mut entries),
                KIND_READ_RECEIPT => self.index_inbound_receipt(*peer, &e, &mut entries),
                _ => {}
            }
        }
        if !entries.is_empty() {
            ops.insert(0, WriteOp::Agents(AgentOp::Index { stream, entries }));
        }
        ops
    }

    /// Adds the index entries of the agent message `e` from `peer` on
    /// `stream` to `entries` (an inbox entry if its agent is here, its
    /// message row), queueing a bounce if its agent is not.
    fn index_inbound_agent(
        &mut self,
        peer: NodeId,
        stream: &StreamId,
        e: &Envelope<'_>,
        now: Millis,
        entries: &mut Vec<AgentIndex>,
    ) {
        let Ok(msg) = AgentHeader::decode(e.payload) else {
            self.out.metrics.agents.malformed += 1;
            return;
        };
        let verified = self.announced(peer, &msg.from);
        let mut undelivered = None;
        match &msg.to {
            Some(to) if self.agents.is_local(to) => {
                self.out.metrics.agents.delivered += 1;
                if !verified {
                    self.out.metrics.agents.unverified_senders += 1;
                }
                entries.push(AgentIndex::Inbox {
                    agent: to.clone(),
                    seq: e.seq,
                    row: InboxRow {
                        kind: InboxKind::Message,
                        verified,
                        in_reply_to: msg.in_reply_to,
                    },
                });
            }
            Some(missing) => {
                self.out.metrics.agents.undeliverable += 1;
                undelivered = Some(BounceReason::NoSuchAgent);
                let bounce = Bounce {
                    id: msg.id,
                    to: msg.from.clone(),
                    missing: Some(missing.clone()),
                    reason: BounceReason::NoSuchAgent,
                };
                self.queue_bounce(peer, bounce, now);
            }
            None => {}
        }
        let row = MessageRow {
            in_reply_to: msg.in_reply_to,
            undelivered,
            ..received_row(stream, e.seq, msg.from, msg.to)
        };
        entries.push(AgentIndex::Message {
            id: msg.id,
            seq: e.seq,
            row,
        });
    }

    /// Adds the index entries of the forward `e` on `stream` (from the old
    /// host of one of this node's agents) to `entries`: the message it
    /// carries goes to the agent's inbox as its author wrote it (if the
    /// agent moved on since, this node's daemon passes it on in turn).
    fn index_inbound_forward(
        &mut self,
        stream: &StreamId,
        e: &Envelope<'_>,
        entries: &mut Vec<AgentIndex>,
    ) {
        let Ok(f) = Forward::decode(e.payload) else {
            self.out.metrics.agents.malformed += 1;
            return;
        };
        let Ok(msg) = AgentHeader::decode(&f.envelope) else {
            self.out.metrics.agents.malformed += 1;
            return;
        };
        let Some(to) = msg.to.clone().filter(|to| self.agents.is_local(to)) else {
            // Not an agent of this node (it never came, or was removed):
            // journaled here, and nobody to tell but its old host.
            self.out.metrics.agents.undeliverable += 1;
            return;
        };
        self.out.metrics.agents.forwards_received += 1;
        // The forwarder vouches for what it passes on, not the author: the
        // author's signature does not come with it.
        let verified = false;
        // Indexed once however often it is passed on (the store checks).
        entries.push(AgentIndex::Forwarded {
            agent: to.clone(),
            id: msg.id,
            seq: e.seq,
            inbox: InboxRow {
                kind: InboxKind::Message,
                verified,
                in_reply_to: msg.in_reply_to,
            },
            message: MessageRow {
                in_reply_to: msg.in_reply_to,
                ..received_row(stream, e.seq, msg.from, Some(to))
            },
        });
    }

    /// Adds the inbox entry of the trimmed forward `e` (from the old host
    /// of one of this node's agents: its retention removed messages for the
    /// agent before it passed them on) to `entries`, so the agent is told;
    /// if the agent moved on since, this node's daemon passes it on in turn.
    fn index_inbound_forward_trimmed(&mut self, e: &Envelope<'_>, entries: &mut Vec<AgentIndex>) {
        let Ok(t) = ForwardTrimmed::decode(e.payload) else {
            self.out.metrics.agents.malformed += 1;
            return;
        };
        if !self.agents.is_local(&t.agent) {
            // Journaled here; nobody to tell.
            self.out.metrics.agents.undeliverable += 1;
            return;
        }
        self.out.metrics.agents.forwards_trimmed_received += 1;
        entries.push(AgentIndex::Inbox {
            agent: t.agent,
            seq: e.seq,
            row: InboxRow {
                kind: InboxKind::Lost,
                verified: false,
                in_reply_to: None,
            },
        });
    }

    /// Adds the index entry of the read receipt `e` from `peer` to
    /// `entries` if it holds: it decodes, its reader is an agent `peer`
    /// announced and its signature verifies under that card's key, and
    /// the agent it tells is here. The store then marks what of it this
    /// node sent there (`AgentIndex::Read`). Anything else is journaled,
    /// refused and counted: it marks nothing and tells nobody.
    fn index_inbound_receipt(
        &mut self,
        peer: NodeId,
        e: &Envelope<'_>,
        entries: &mut Vec<AgentIndex>,
    ) {
        let refuse = |core: &mut Core, why: &str| {
            core.out.metrics.agents.receipts_refused += 1;
            tracing::warn!(peer = %peer.fmt_short(), seq = e.seq, why, "read receipt refused");
        };
        let r = match ReadReceipt::decode(e.payload) {
            Ok(r) => r,
            Err(err) => {
                self.out.metrics.agents.malformed += 1;
                return refuse(self, &err.to_string());
            }
        };
        let Some(key) = self.announced_key(peer, &r.reader) else {
            return refuse(self, "its reader is no agent its node announced");
        };
        if r.verify(&peer, &key).is_err() {
            return refuse(self, "not signed by its reader's announced key");
        }
        if !self.agents.is_local(&r.to) {
            return refuse(self, "the agent it tells is not here");
        }
        // Counted received (or refused) once committed: the store decides
        // whether it marks anything.
        entries.push(AgentIndex::Read {
            agent: r.to,
            seq: e.seq,
            mark: ReadMark {
                node: peer,
                reader: r.reader,
                read_ms: r.read_ms,
            },
            ids: r.ids,
        });
    }

    /// The key of `peer`'s agent `agent`, from the card it announced (on
    /// its last connection).
    fn announced_key(&self, peer: NodeId, agent: &mesh_protocol::AgentName) -> Option<NodeId> {
        self.agents
            .peers
            .get(&peer)
            .and_then(|m| m.get(agent))
            .map(|card| card.key)
    }

    /// Whether `peer` announced its agent `agent` (on its last connection).
    fn announced(&self, peer: NodeId, agent: &mesh_protocol::AgentName) -> bool {
        self.agents
            .peers
            .get(&peer)
            .is_some_and(|m| m.contains_key(agent))
    }

    /// Adds the index entries of the tombstone `e` from `peer` on `stream`
    /// to `entries`: an inbox entry if the agent the superseded message was
    /// for is here (so its reader is told), and the message row of the
    /// superseded message (`mesh message` says by what). A tombstone for an
    /// agent this node does not host is journaled and bounced to nobody:
    /// the message it replaced was never sent.
    fn index_inbound_tombstone(
        &mut self,
        peer: NodeId,
        stream: &StreamId,
        e: &Envelope<'_>,
        entries: &mut Vec<AgentIndex>,
    ) {
        let Ok(t) = Tombstone::decode(e.payload) else {
            self.out.metrics.agents.malformed += 1;
            return;
        };
        let verified = self.announced(peer, &t.from);
        if let Some(to) = t.to.as_ref().filter(|to| self.agents.is_local(to)) {
            self.out.metrics.agents.tombstones_received += 1;
            entries.push(AgentIndex::Inbox {
                agent: to.clone(),
                seq: e.seq,
                row: InboxRow {
                    kind: InboxKind::Superseded,
                    verified,
                    in_reply_to: None,
                },
            });
        }
        entries.push(AgentIndex::Message {
            id: t.id,
            seq: e.seq,
            row: received_row(stream, e.seq, t.from, t.to),
        });
    }

    /// Adds the bounce `e`'s inbox entry to `entries` if its agent is here,
    /// and to `ops` the record that its message bounced.
    fn index_inbound_bounce(
        &mut self,
        e: &Envelope<'_>,
        entries: &mut Vec<AgentIndex>,
        ops: &mut Vec<WriteOp>,
    ) {
        let Ok(b) = Bounce::decode(e.payload) else {
            self.out.metrics.agents.malformed += 1;
            return;
        };
        if self.agents.is_local(&b.to) {
            self.out.metrics.agents.bounces_received += 1;
            entries.push(AgentIndex::Inbox {
                agent: b.to,
                seq: e.seq,
                row: InboxRow {
                    kind: InboxKind::Bounce,
                    verified: true,
                    in_reply_to: None,
                },
            });
        }
        ops.push(WriteOp::Agents(AgentOp::Bounced {
            id: b.id,
            reason: b.reason,
        }));
    }

    /// Queues `bounce` to `peer` for the commit being built.
    fn queue_bounce(&mut self, peer: NodeId, bounce: Bounce, now: Millis) {
        self.out.metrics.agents.bounces_sent += 1;
        self.agents.bounces.push(WaitingSend {
            req: ReqId::INTERNAL,
            to: peer,
            kind: KIND_BOUNCE,
            payload: bounce.encode(),
            created_ms: now.0,
            tracked: None,
        });
    }

    /// The bounces waiting, taken for the commit being built.
    pub(in crate::core) fn take_bounces(&mut self) -> Vec<WaitingSend> {
        std::mem::take(&mut self.agents.bounces)
    }

    /// Bounces taken for a commit that must wait for the next one after all.
    pub(in crate::core) fn wait_again_bounces(&mut self, mut bounces: Vec<WaitingSend>) {
        bounces.append(&mut self.agents.bounces);
        self.agents.bounces = bounces;
    }
}

/// The message row of a message received at `seq` of `stream`, from `from`
/// to `to`: answering nothing, delivered, not superseded (the store reads
/// that from the tombstone).
fn received_row(
    stream: &StreamId,
    seq: mesh_protocol::Seq,
    from: mesh_protocol::AgentName,
    to: Option<mesh_protocol::AgentName>,
) -> MessageRow {
    MessageRow {
        dir: MessageDir::Received,
        stream: stream.clone(),
        seq,
        arrival: 0,
        from,
        to,
        in_reply_to: None,
        undelivered: None,
        superseded_by: None,
        read: None,
    }
}
