//! The send path of agent messages and sends with a client id: checks, ids, index entries.

use mesh_protocol::{
    AgentEnvelope, AgentName, KIND_AGENT, KIND_READ_RECEIPT, MsgId, NodeId, ReadReceipt, Seq,
    StreamId, SupersedeKey, stamp_msg_id,
};
use mesh_store::{
    AgentIndex, AgentOp, DedupKey, DedupRecord, InboxKind, InboxRow, MessageDir, MessageRow,
    WriteOp,
};

use super::dedup::{DedupCheck, digest};
use super::{AgentMsg, DedupMeta, Tracked};
use crate::core::commit::WaitingSend;
use crate::core::{Core, Effect, Millis, ReqId, SendError, SendMeta, SendReceipt};

/// The agent fields of a send, as [`SendMeta`] has them.
struct Addressing {
    from: Option<AgentName>,
    to: Option<AgentName>,
    in_reply_to: Option<MsgId>,
    key: Option<SupersedeKey>,
    receipt: bool,
    read_receipt: bool,
}

impl Core {
    /// Queues a send with agent addressing or a client id, after the
    /// checks every send has; a retry of a send already taken is answered
    /// with its receipt (or waits for it) and is not sent again.
    pub(in crate::core) fn on_send_with(
        &mut self,
        req: ReqId,
        to: NodeId,
        kind: u16,
        body: Vec<u8>,
        meta: SendMeta,
        now: Millis,
    ) {
        let refuse = |core: &mut Core, e: SendError| {
            core.out.metrics.sends_refused += 1;
            core.reply(req, Err(e));
        };
        let SendMeta {
            from,
            to: to_agent,
            in_reply_to,
            client_id,
            key,
            receipt,
            read_receipt,
        } = meta;
        // Only a send with a client id needs one (a retry is told apart by it).
        let digest = match client_id {
            Some(_) => digest(
                to,
                kind,
                from.as_ref(),
                to_agent.as_ref(),
                in_reply_to,
                receipt,
                &body,
            ),
            None => [0; 16],
        };
        let addressing = Addressing {
            from,
            to: to_agent,
            in_reply_to,
            key,
            receipt,
            read_receipt,
        };
        let (kind, payload, agent) = match self.address_send(kind, body, addressing) {
            Ok(addressed) => addressed,
            Err(e) => return refuse(self, e),
        };
        // A recipient that moved is written to at its new host.
        let to = agent
            .as_ref()
            .and_then(|a| a.to.as_ref())
            .and_then(|name| self.readdress(to, name))
            .unwrap_or(to);
        // A read receipt of one of this node's agents for a message of
        // another of them is delivered here, as a message between them is.
        let checked = if read_receipt && to == self.me {
            self.check_room(payload.len() as u64)
        } else {
            self.check_addressed(to, agent.as_ref(), payload.len() as u64)
        };
        if let Err(e) = checked {
            return refuse(self, e);
        }
        let dedup = match client_id {
            Some(client_id) => {
                let key = DedupKey {
                    sender: agent.as_ref().map(|a| a.from.clone()),
                    client_id,
                };
                let Some(meta) = self.check_retry(req, key, digest, now) else {
                    return;
                };
                Some(meta)
            }
            None => None,
        };
        if agent.is_some() {
            self.out.metrics.agents.sends += 1;
        }
        if read_receipt {
            self.out.metrics.agents.receipts_sent += 1;
        }
        let tracked = Some(Box::new(Tracked { agent, dedup }));
        self.queue_checked_send(req, to, kind, payload, now, tracked);
    }

    /// Sends a waiting agent message to its recipient's new host, if the
    /// recipient moved since it was queued (see `core::moves`).
    pub(in crate::core) fn readdress_waiting(&self, send: &mut WaitingSend) {
        let name = send
            .tracked
            .as_ref()
            .and_then(|t| t.agent.as_ref())
            .and_then(|a| a.to.as_ref());
        if let Some(host) = name.and_then(|name| self.readdress(send.to, name)) {
            send.to = host;
        }
    }

    /// The kind, payload and agent addressing of a send: an agent message's
    /// envelope (its id stamped later), or the plain message as it came.
    ///
    /// Errors: an unknown sending agent, agent fields on a plain message, a
    /// receipt asked without a recipient agent, a plain message of a mesh
    /// kind (but a read receipt of this node's agent, from its pump).
    fn address_send(
        &self,
        kind: u16,
        body: Vec<u8>,
        a: Addressing,
    ) -> Result<(u16, Vec<u8>, Option<AgentMsg>), SendError> {
        let Addressing {
            from,
            to: to_agent,
            in_reply_to,
            key,
            receipt,
            read_receipt,
        } = a;
        match from {
            Some(from) => {
                if !self.agents.is_local(&from) {
                    return Err(SendError::UnknownAgent(from));
                }
                if receipt && to_agent.is_none() {
                    return Err(SendError::ReceiptWithoutAgent);
                }
                if read_receipt {
                    return Err(SendError::NotAnAgentMessage);
                }
                let envelope = AgentEnvelope {
                    // Stamped with its real id when it is signed.
                    id: MsgId([0; 16]),
                    from: from.clone(),
                    to: to_agent.clone(),
                    in_reply_to,
                    key: key.clone(),
                    body,
                    receipt,
                };
                let agent = AgentMsg {
                    from,
                    to: to_agent,
                    in_reply_to,
                    key,
                    superseded_by: None,
                    original: None,
                };
                Ok((KIND_AGENT, envelope.encode(), Some(agent)))
            }
            None if to_agent.is_some() || in_reply_to.is_some() || key.is_some() => {
                Err(SendError::NotAnAgentMessage)
            }
            None if receipt => Err(SendError::ReceiptWithoutAgent),
            None if read_receipt => {
                if kind != KIND_READ_RECEIPT {
                    return Err(SendError::BadReadReceipt(format!("kind {kind}")));
                }
                let r = ReadReceipt::decode(&body)
                    .map_err(|e| SendError::BadReadReceipt(e.to_string()))?;
                if !self.agents.is_local(&r.reader) {
                    return Err(SendError::BadReadReceipt(format!(
                        "no agent {} here",
                        r.reader
                    )));
                }
                Ok((kind, body, None))
            }
            // As for a send without meta: the mesh's own kinds are its own.
            None if mesh_protocol::is_mesh_kind(kind) => Err(SendError::ReservedKind(kind)),
            None => Ok((kind, body, None)),
        }
    }

    /// Checks an addressed send of `len` payload bytes to `to`: an agent
    /// message to this node must name one of its agents, any other send
    /// must go to a peer; both need room in the queue.
    fn check_addressed(
        &self,
        to: NodeId,
        agent: Option<&AgentMsg>,
        len: u64,
    ) -> Result<(), SendError> {
        // An agent message has room for the forward it may become, should
        // its recipient move (the old host passes it on as it is).
        let len = match agent {
            Some(_) => len + mesh_protocol::MAX_FORWARD_OVERHEAD_BYTES as u64,
            None => len,
        };
        // An agent message to an agent of this node is delivered here, in
        // the commit that writes it: its stream to this node is acknowledged
        // in the same group.
        if to == self.me && agent.is_some() {
            match agent.and_then(|a| a.to.as_ref()) {
                Some(n) if self.agents.is_local(n) => self.check_room(len),
                other => Err(SendError::NoSuchLocalAgent(other.cloned())),
            }
        } else {
            self.check_send(to, len)
        }
    }

    /// The retried-send record of a first send under `key`; `None` when
    /// the send is a retry, answered here or left to wait for the first's
    /// answer. Records past the window are forgotten on the way.
    fn check_retry(
        &mut self,
        req: ReqId,
        key: DedupKey,
        digest: [u8; 16],
        now: Millis,
    ) -> Option<DedupMeta> {
        let mut forgotten = Vec::new();
        let check = self
            .agents
            .dedup
            .check(req, &key, digest, now.0, &mut forgotten);
        self.out.metrics.agents.dedup_forgotten += forgotten.len() as u64;
        self.agents.housekeeping.extend(forgotten);
        match check {
            DedupCheck::Fresh => Some(DedupMeta {
                key,
                at_ms: now.0,
                digest,
            }),
            DedupCheck::Answer(result) => {
                if result.is_ok() {
                    self.out.metrics.agents.retries_answered += 1;
                }
                self.reply(req, result);
                None
            }
            DedupCheck::Waits => {
                self.out.metrics.agents.retries_answered += 1;
                None
            }
        }
    }

    /// Answers the send `req` (unless the core made it itself), and the
    /// retries that waited for it with the same answer.
    pub(in crate::core) fn reply(&mut self, req: ReqId, result: Result<SendReceipt, SendError>) {
        for waiter in self.agents.dedup.resolved(req, &result) {
            self.out.push(Effect::Reply {
                req: waiter,
                result: result.clone(),
            });
        }
        if req != ReqId::INTERNAL {
            self.out.push(Effect::Reply { req, result });
        }
    }

    /// Stamps the ids of the agent messages among `sends` (the batch to
    /// `to` from `first_seq`) and returns the agent ops of their group: its
    /// index entries, and for a batch to this node itself (agent messages
    /// between its own agents) the recipients' inbox entries and the ack
    /// that delivers it.
    pub(in crate::core) fn index_own(
        &mut self,
        to: NodeId,
        first_seq: Seq,
        sends: &mut [WaitingSend],
    ) -> Vec<WriteOp> {
        let epoch = self.epoch();
        let stream = StreamId::direct(self.me, epoch, to);
        let local = to == self.me;
        let tag = MsgId::stream_tag(&self.me, epoch, &to);
        let mut entries = Vec::new();
        for (i, s) in sends.iter_mut().enumerate() {
            let seq = first_seq + i as u64;
            self.index_own_send(s, seq, tag, &stream, local, &mut entries);
        }
        let mut ops = Vec::new();
        if local {
            ops.push(WriteOp::Acked {
                stream: stream.clone(),
                upto: first_seq + sends.len() as u64 - 1,
                reset: false,
            });
        }
        if !entries.is_empty() {
            ops.push(WriteOp::Agents(AgentOp::Index { stream, entries }));
        }
        ops
    }

    /// Adds the index entry of the read receipt `s` (at `seq` of this
    /// node's stream to itself: one of its agents read messages of another
    /// of them): the store marks what of it this node sent itself, as for a
    /// receipt from a peer. Checked when it was taken (`address_send`).
    fn index_local_receipt(&mut self, s: &WaitingSend, seq: Seq, entries: &mut Vec<AgentIndex>) {
        let Ok(r) = ReadReceipt::decode(&s.payload) else {
            return;
        };
        if !self.agents.is_local(&r.to) {
            return;
        }
        entries.push(AgentIndex::Read {
            agent: r.to,
            seq,
            mark: mesh_store::ReadMark {
                node: self.me,
                reader: r.reader,
                read_ms: r.read_ms,
            },
            ids: r.ids,
        });
    }

    /// Stamps the id of `s` (at `seq` of the own `stream` tagged `tag`) if
    /// it is an agent message, and adds its index entries to `entries`: its
    /// message row, its retried-send record, and for a message between this
    /// node's own agents (`local`) the recipient's inbox entry.
    fn index_own_send(
        &mut self,
        s: &mut WaitingSend,
        seq: Seq,
        tag: [u8; 8],
        stream: &StreamId,
        local: bool,
        entries: &mut Vec<AgentIndex>,
    ) {
        if local && s.kind == KIND_READ_RECEIPT {
            self.index_local_receipt(s, seq, entries);
        }
        let Some(t) = s.tracked.as_deref() else {
            return;
        };
        let mut msg = None;
        if let Some(a) = &t.agent {
            let id = MsgId::in_stream(tag, seq);
            let stamped = stamp_msg_id(&mut s.payload, id);
            debug_assert!(stamped, "an encoded agent envelope starts with its id");
            msg = Some(id);
            if local && let Some(recipient) = &a.to {
                let kind = if a.superseded_by.is_some() {
                    InboxKind::Superseded
                } else {
                    self.out.metrics.agents.delivered += 1;
                    InboxKind::Message
                };
                entries.push(AgentIndex::Inbox {
                    agent: recipient.clone(),
                    seq,
                    row: InboxRow {
                        kind,
                        verified: true,
                        in_reply_to: a.in_reply_to,
                    },
                });
            }
            entries.push(AgentIndex::Message {
                id,
                seq,
                row: MessageRow {
                    dir: MessageDir::Sent,
                    stream: stream.clone(),
                    seq,
                    arrival: 0,
                    from: a.from.clone(),
                    to: a.to.clone(),
                    in_reply_to: a.in_reply_to,
                    undelivered: None,
                    superseded_by: a.superseded_by,
                    read: None,
                },
            });
        }
        if let Some(d) = &t.dedup {
            entries.push(AgentIndex::Dedup {
                seq,
                record: DedupRecord {
                    key: d.key.clone(),
                    at_ms: d.at_ms,
                    digest: d.digest,
                    msg,
                    stream: stream.clone(),
                    seq,
                    arrival: 0,
                },
            });
        }
    }
}
