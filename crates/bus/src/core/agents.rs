//! Agents in the core: this node's agents and their cards, the agents each
//! peer announced, the send path of agent messages (their envelope, their
//! id, retried sends), and the receive side's checks, inbox routing and
//! bounces.
//!
//! The store writes what this decides in the same transaction as the
//! envelopes it concerns: an own batch's group carries the message and
//! retried-send records of its agent messages, an accepted batch's group
//! the inbox and message index entries of its envelopes, and a bounce for
//! an agent this node does not host is an own send in the same commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use mesh_protocol::{
    AgentCard, AgentEnvelope, AgentHeader, AgentName, Bounce, BounceReason, Frame, KIND_AGENT,
    KIND_BOUNCE, MAX_AGENT_CARDS, MsgId, NodeId, Seq, StreamId, stamp_msg_id,
};
use mesh_store::{
    AgentIndex, AgentOp, DedupKey, DedupRecord, InboxKind, InboxRow, MessageDir, MessageRow,
    StoreError, WriteOp,
};

use super::commit::{InboundWork, WaitingSend};
use super::{
    BadCards, ConnId, Core, DropReason, Effect, LocalWrite, Millis, ReqId, SendError, SendMeta,
    SendReceipt,
};

/// The most retried-send records kept (within the window); past it the
/// oldest are forgotten early, and counted.
pub const DEDUP_ENTRIES_MAX: usize = 65_536;

/// The most bytes of retried-send records kept (estimated per record).
pub const DEDUP_BYTES_MAX: usize = 32 << 20;

/// The default of [`crate::core::Config::dedup_window_ms`]: 24 hours.
pub const DEDUP_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;

/// Bytes counted per retried-send record besides its key's text.
const DEDUP_ENTRY_OVERHEAD_BYTES: usize = 256;

/// What a waiting send carries besides its payload.
#[derive(Debug)]
pub(super) struct Tracked {
    /// For an agent message: its addressing (the payload is then an
    /// encoded [`AgentEnvelope`] whose id is stamped when it is signed).
    pub(super) agent: Option<AgentMsg>,
    /// For a send with a client id: its retried-send record to be.
    pub(super) dedup: Option<DedupMeta>,
}

/// An agent message's addressing, for its message index row.
#[derive(Debug)]
pub(super) struct AgentMsg {
    from: AgentName,
    to: Option<AgentName>,
    in_reply_to: Option<MsgId>,
}

/// A first send's retried-send record, before it has a place.
#[derive(Debug)]
pub(super) struct DedupMeta {
    key: DedupKey,
    at_ms: u64,
    digest: [u8; 16],
}

/// A local agent change committed with a [`LocalWrite`].
#[derive(Debug)]
pub(super) enum AgentChange {
    Put(AgentName),
    Remove(AgentName),
}

impl AgentChange {
    /// The change `write` makes to the core's agents, if any.
    pub(super) fn of(write: &LocalWrite) -> Option<AgentChange> {
        match write {
            LocalWrite::PutAgent(r) => Some(AgentChange::Put(r.name.clone())),
            LocalWrite::RemoveAgent(n) => Some(AgentChange::Remove(n.clone())),
            _ => None,
        }
    }
}

/// One retried-send record.
#[derive(Debug)]
struct DedupEntry {
    at_ms: u64,
    digest: [u8; 16],
    state: DedupState,
}

#[derive(Debug)]
enum DedupState {
    /// The first send is waiting for its commit; these retries wait with it.
    Pending { waiters: Vec<ReqId> },
    /// The first send's receipt.
    Done(SendReceipt),
}

/// What [`Dedup::check`] says of a send with a client id.
enum DedupCheck {
    /// The first of its key: send it.
    Fresh,
    /// A retry of a committed send: answer this.
    Answer(Result<SendReceipt, SendError>),
    /// A retry of a send still waiting: it gets the same answer.
    Waits,
}

/// Retried-send records in memory, mirrored in the store.
///
/// Invariants: `order` holds exactly the keys of `entries` with their
/// times; `bytes` is their estimated size; `by_req` names only pending
/// entries; within [`DEDUP_ENTRIES_MAX`] and [`DEDUP_BYTES_MAX`] but for
/// pending ones.
#[derive(Debug, Default)]
struct Dedup {
    entries: HashMap<DedupKey, DedupEntry>,
    order: BTreeSet<(u64, DedupKey)>,
    bytes: usize,
    by_req: HashMap<ReqId, DedupKey>,
}

fn entry_bytes(key: &DedupKey) -> usize {
    key.client_id.len()
        + key.sender.as_ref().map_or(0, |s| s.as_str().len())
        + DEDUP_ENTRY_OVERHEAD_BYTES
}

impl Dedup {
    fn recover(records: Vec<mesh_store::DedupRecord>) -> Dedup {
        let mut d = Dedup::default();
        for r in records {
            let receipt = SendReceipt {
                stream: r.stream,
                seq: r.seq,
                arrival: r.arrival,
            };
            d.insert(r.key, r.at_ms, r.digest, DedupState::Done(receipt));
        }
        d
    }

    fn insert(&mut self, key: DedupKey, at_ms: u64, digest: [u8; 16], state: DedupState) {
        self.bytes += entry_bytes(&key);
        self.order.insert((at_ms, key.clone()));
        let old = self.entries.insert(
            key,
            DedupEntry {
                at_ms,
                digest,
                state,
            },
        );
        debug_assert!(old.is_none(), "one record per key");
    }

    fn remove(&mut self, key: &DedupKey) -> Option<DedupEntry> {
        let e = self.entries.remove(key)?;
        self.order.remove(&(e.at_ms, key.clone()));
        self.bytes -= entry_bytes(key);
        Some(e)
    }

    fn check(
        &mut self,
        req: ReqId,
        key: &DedupKey,
        digest: [u8; 16],
        now_ms: u64,
        forgotten: &mut Vec<AgentOp>,
    ) -> DedupCheck {
        if let Some(e) = self.entries.get_mut(key) {
            if e.digest != digest {
                return DedupCheck::Answer(Err(SendError::ClientIdReused {
                    client_id: key.client_id.clone(),
                }));
            }
            return match &mut e.state {
                DedupState::Done(receipt) => DedupCheck::Answer(Ok(receipt.clone())),
                DedupState::Pending { waiters } => {
                    waiters.push(req);
                    DedupCheck::Waits
                }
            };
        }
        // Make room: the oldest committed records go first, and are
        // forgotten in the store too (a retry of them would send again).
        while self.entries.len() >= DEDUP_ENTRIES_MAX || self.bytes > DEDUP_BYTES_MAX {
            let oldest = self
                .order
                .iter()
                .find(|(_, k)| {
                    matches!(
                        self.entries.get(k).map(|e| &e.state),
                        Some(DedupState::Done(_))
                    )
                })
                .cloned();
            let Some((at_ms, k)) = oldest else { break };
            self.remove(&k);
            forgotten.push(AgentOp::ForgetDedup { at_ms, key: k });
        }
        self.insert(
            key.clone(),
            now_ms,
            digest,
            DedupState::Pending {
                waiters: Vec::new(),
            },
        );
        self.by_req.insert(req, key.clone());
        DedupCheck::Fresh
    }

    /// The first send `req` was answered with `result`: the retries that
    /// waited for it. A refused first send leaves no record.
    fn resolved(&mut self, req: ReqId, result: &Result<SendReceipt, SendError>) -> Vec<ReqId> {
        let Some(key) = self.by_req.remove(&req) else {
            return Vec::new();
        };
        let waiters = match self.entries.get_mut(&key) {
            Some(e) => match std::mem::replace(
                &mut e.state,
                DedupState::Pending {
                    waiters: Vec::new(),
                },
            ) {
                DedupState::Pending { waiters } => waiters,
                DedupState::Done(r) => {
                    e.state = DedupState::Done(r);
                    return Vec::new();
                }
            },
            None => return Vec::new(),
        };
        match result {
            Ok(receipt) => {
                if let Some(e) = self.entries.get_mut(&key) {
                    e.state = DedupState::Done(receipt.clone());
                }
            }
            Err(_) => {
                self.remove(&key);
            }
        }
        waiters
    }

    /// Drops the committed records taken before `before_ms`; whether any went.
    fn expire(&mut self, before_ms: u64) -> bool {
        let mut any = false;
        while let Some((at_ms, key)) = self.order.first().cloned() {
            if at_ms >= before_ms {
                break;
            }
            if !matches!(
                self.entries.get(&key).map(|e| &e.state),
                Some(DedupState::Done(_))
            ) {
                break;
            }
            self.remove(&key);
            any = true;
        }
        any
    }
}

/// This node's agents, its peers' agents, and retried sends.
#[derive(Debug)]
pub(super) struct Agents {
    /// This node's agents, with their current cards once signed.
    local: BTreeMap<AgentName, Option<AgentCard>>,
    /// The agents each peer announced on its last connection.
    peers: BTreeMap<NodeId, BTreeMap<AgentName, AgentCard>>,
    dedup: Dedup,
    /// Bounces for the commit being built (or the next one), apart from
    /// the local sends and their bound: at most one per envelope of the
    /// peer batches in one commit.
    bounces: Vec<WaitingSend>,
    /// Store ops for the next commit that no request waits for.
    housekeeping: Vec<AgentOp>,
    /// The last time retried-send records were expired.
    expired_at: Millis,
}

impl Agents {
    pub(super) fn new(agents: Vec<mesh_store::AgentRecord>, dedup: Vec<DedupRecord>) -> Agents {
        Agents {
            local: agents.into_iter().map(|r| (r.name, None)).collect(),
            peers: BTreeMap::new(),
            dedup: Dedup::recover(dedup),
            bounces: Vec::new(),
            housekeeping: Vec::new(),
            expired_at: Millis(0),
        }
    }

    /// Whether `name` is an agent of this node.
    pub(super) fn is_local(&self, name: &AgentName) -> bool {
        self.local.contains_key(name)
    }

    /// This node's agents' cards, by name.
    pub(super) fn local_cards(&self) -> Vec<AgentCard> {
        self.local.values().flatten().cloned().collect()
    }

    /// The cards `peer` announced.
    pub(super) fn peer_cards(&self, peer: NodeId) -> Vec<AgentCard> {
        self.peers
            .get(&peer)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The local agents' count.
    pub(super) fn len(&self) -> usize {
        self.local.len()
    }

    /// The frame announcing this node's agents (those with a card), if it
    /// hosts any.
    pub(super) fn frame(&self) -> Option<Frame> {
        (!self.local.is_empty()).then(|| Frame::Agents {
            cards: self.local_cards(),
        })
    }
}

impl Core {
    /// Queues a send with agent addressing or a client id, after the
    /// checks every send has; a retry of a send already taken is answered
    /// with its receipt (or waits for it) and is not sent again.
    pub(super) fn on_send_with(
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
        } = meta;
        // Only a send with a client id needs one (a retry is told apart by it).
        let digest = match client_id {
            Some(_) => digest(
                to,
                kind,
                from.as_ref(),
                to_agent.as_ref(),
                in_reply_to,
                &body,
            ),
            None => [0; 16],
        };
        let (kind, payload, agent) = match from {
            Some(from) => {
                if !self.agents.is_local(&from) {
                    return refuse(self, SendError::UnknownAgent(from));
                }
                let envelope = AgentEnvelope {
                    // Stamped with its real id when it is signed.
                    id: MsgId([0; 16]),
                    from: from.clone(),
                    to: to_agent.clone(),
                    in_reply_to,
                    key: None,
                    body,
                };
                let agent = AgentMsg {
                    from,
                    to: to_agent,
                    in_reply_to,
                };
                (KIND_AGENT, envelope.encode(), Some(agent))
            }
            None if to_agent.is_some() || in_reply_to.is_some() => {
                return refuse(self, SendError::NotAnAgentMessage);
            }
            None => (kind, body, None),
        };
        // An agent message to an agent of this node is delivered here, in
        // the commit that writes it: its stream to this node is acknowledged
        // in the same group.
        let checked = if to == self.me && agent.is_some() {
            match agent.as_ref().and_then(|a| a.to.as_ref()) {
                Some(n) if self.agents.is_local(n) => self.check_room(payload.len() as u64),
                other => Err(SendError::NoSuchLocalAgent(other.cloned())),
            }
        } else {
            self.check_send(to, payload.len() as u64)
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
                        return self.reply(req, result);
                    }
                    DedupCheck::Waits => {
                        self.out.metrics.agents.retries_answered += 1;
                        return;
                    }
                }
            }
            None => None,
        };
        if agent.is_some() {
            self.out.metrics.agents.sends += 1;
        }
        self.committer.queue_send(WaitingSend {
            req,
            to,
            kind,
            payload,
            created_ms: now.0,
            tracked: Some(Box::new(Tracked { agent, dedup })),
        });
    }

    /// Answers the send `req` (unless the core made it itself), and the
    /// retries that waited for it with the same answer.
    pub(super) fn reply(&mut self, req: ReqId, result: Result<SendReceipt, SendError>) {
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
    pub(super) fn index_own(
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
            let Some(t) = s.tracked.as_deref() else {
                continue;
            };
            let seq = first_seq + i as u64;
            let mut msg = None;
            if let Some(a) = &t.agent {
                let id = MsgId::in_stream(tag, seq);
                let stamped = stamp_msg_id(&mut s.payload, id);
                debug_assert!(stamped, "an encoded agent envelope starts with its id");
                msg = Some(id);
                if local && let Some(recipient) = &a.to {
                    self.out.metrics.agents.delivered += 1;
                    entries.push(AgentIndex::Inbox {
                        agent: recipient.clone(),
                        seq,
                        row: InboxRow {
                            kind: InboxKind::Message,
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

    /// The index op for a peer batch about to be committed (its agent
    /// messages to their inboxes and the message index, its bounces to
    /// their senders), queueing a bounce for every agent message to an
    /// agent this node does not host.
    pub(super) fn index_inbound(&mut self, work: &InboundWork, now: Millis) -> Vec<WriteOp> {
        let InboundWork::Accept { peer, from, batch } = work else {
            return Vec::new();
        };
        let stream = batch.batch().stream().clone();
        let mut entries = Vec::new();
        let mut ops = Vec::new();
        for e in batch.envelopes().filter(|e| e.seq >= *from) {
            match e.header.kind {
                KIND_AGENT => {
                    let Ok(msg) = AgentHeader::decode(e.payload) else {
                        self.out.metrics.agents.malformed += 1;
                        continue;
                    };
                    let verified = self
                        .agents
                        .peers
                        .get(peer)
                        .is_some_and(|m| m.contains_key(&msg.from));
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
                            self.queue_bounce(*peer, bounce, now);
                        }
                        None => {}
                    }
                    entries.push(AgentIndex::Message {
                        id: msg.id,
                        seq: e.seq,
                        row: MessageRow {
                            dir: MessageDir::Received,
                            stream: stream.clone(),
                            seq: e.seq,
                            arrival: 0,
                            from: msg.from,
                            to: msg.to,
                            in_reply_to: msg.in_reply_to,
                            undelivered,
                        },
                    });
                }
                KIND_BOUNCE => {
                    let Ok(b) = Bounce::decode(e.payload) else {
                        self.out.metrics.agents.malformed += 1;
                        continue;
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
                _ => {}
            }
        }
        if !entries.is_empty() {
            ops.insert(0, WriteOp::Agents(AgentOp::Index { stream, entries }));
        }
        ops
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
    pub(super) fn take_bounces(&mut self) -> Vec<WaitingSend> {
        std::mem::take(&mut self.agents.bounces)
    }

    /// Bounces taken for a commit that must wait for the next one after all.
    pub(super) fn wait_again_bounces(&mut self, mut bounces: Vec<WaitingSend>) {
        bounces.append(&mut self.agents.bounces);
        self.agents.bounces = bounces;
    }

    /// The retried-send records to forget by now, as store ops for the
    /// next commit (checked at most once a second).
    pub(super) fn agent_housekeeping(&mut self, now: Millis) -> Vec<WriteOp> {
        if now.0 >= self.agents.expired_at.0.saturating_add(1_000) {
            self.agents.expired_at = now;
            let before_ms = now.0.saturating_sub(self.config.dedup_window_ms);
            if self.agents.dedup.expire(before_ms) {
                self.agents
                    .housekeeping
                    .push(AgentOp::ExpireDedup { before_ms });
            }
        }
        std::mem::take(&mut self.agents.housekeeping)
            .into_iter()
            .map(WriteOp::Agents)
            .collect()
    }

    /// A local write that adds or removes an agent: refused past
    /// [`MAX_AGENT_CARDS`] agents.
    pub(super) fn check_agent_write(&self, write: &LocalWrite) -> Result<(), StoreError> {
        if let LocalWrite::PutAgent(r) = write
            && !self.agents.is_local(&r.name)
            && self.agents.len() >= MAX_AGENT_CARDS
        {
            return Err(StoreError::Conflict(format!(
                "this node hosts {MAX_AGENT_CARDS} agents, as many as it may"
            )));
        }
        Ok(())
    }

    /// A committed agent change takes effect and is announced.
    pub(super) fn on_agent_change(&mut self, change: AgentChange) {
        match change {
            AgentChange::Put(name) => {
                self.agents.local.entry(name).or_insert(None);
            }
            AgentChange::Remove(name) => {
                self.agents.local.remove(&name);
                self.announce_all();
            }
        }
    }

    /// A newly signed card of a local agent.
    pub(super) fn on_agent_card(&mut self, card: AgentCard) {
        if card.node != self.me {
            return;
        }
        let Some(slot) = self.agents.local.get_mut(&card.name) else {
            return;
        };
        if slot.as_ref().is_some_and(|c| c.issued_ms > card.issued_ms) {
            return;
        }
        *slot = Some(card);
        self.announce_all();
    }

    /// An `Agents` frame from `peer`: it replaces what `peer` announced.
    pub(super) fn on_agents(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        cards: Result<Vec<AgentCard>, BadCards>,
    ) {
        if self.peers.live_conn(peer) != Some(conn) {
            self.out.drop(DropReason::StaleConnection);
            return;
        }
        self.out.metrics.frames_in.agents += 1;
        if self.peers.peer_epoch(peer).is_none() {
            self.out.drop(DropReason::BeforeHello);
            return;
        }
        let cards = match cards {
            Ok(cards) if cards.iter().all(|c| c.node == peer) => cards,
            _ => {
                self.out.metrics.agents.cards_refused += 1;
                return;
            }
        };
        let mut known: BTreeMap<AgentName, AgentCard> = BTreeMap::new();
        for c in cards {
            if known
                .get(&c.name)
                .is_none_or(|k| k.issued_ms <= c.issued_ms)
            {
                known.insert(c.name.clone(), c);
            }
        }
        self.agents.peers.insert(peer, known);
    }

    /// A peer's new connection: what it announced before is replaced by
    /// what it announces on this one (nothing, if it hosts no agents).
    pub(super) fn forget_peer_agents(&mut self, peer: NodeId) {
        self.agents.peers.remove(&peer);
    }

    /// Announces this node's agents on `peer`'s new live connection.
    pub(super) fn announce_to(&mut self, peer: NodeId, conn: ConnId) {
        if let Some(frame) = self.agents.frame() {
            self.out.send(peer, conn, frame);
        }
    }

    /// Announces this node's agents on every live connection.
    fn announce_all(&mut self) {
        let cards = self.agents.local_cards();
        for (peer, conn) in self.peers.live() {
            self.out.send(
                peer,
                conn,
                Frame::Agents {
                    cards: cards.clone(),
                },
            );
        }
    }
}

/// The digest that tells a retry from another message under the same id.
fn digest(
    to: NodeId,
    kind: u16,
    from: Option<&AgentName>,
    to_agent: Option<&AgentName>,
    in_reply_to: Option<MsgId>,
    body: &[u8],
) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(b"agent-mesh/retry-digest/v1\0");
    h.update(to.as_bytes());
    h.update(&kind.to_be_bytes());
    for name in [from, to_agent] {
        match name {
            Some(n) => {
                h.update(&[1, n.as_str().len() as u8]);
                h.update(n.as_str().as_bytes());
            }
            None => {
                h.update(&[0]);
            }
        }
    }
    match in_reply_to {
        Some(id) => h.update(&[1]).update(id.as_bytes()),
        None => h.update(&[0]),
    };
    h.update(body);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}
