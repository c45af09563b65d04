//! The node task: one `select!` loop over local requests, the transport's
//! events, the store's answers and the core's one timer. It feeds the core
//! the input it woke for together with those already queued behind it (at
//! most [`INPUTS_PER_TURN_MAX`], so a burst shares one commit), then carries
//! out every effect (`effects.rs`) without waiting for anything.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesh_protocol::{Epoch, Frame, NodeId, OpenBatch, Seq, StreamId};
use mesh_store::{Arrival, MeshStore, PeerRecord, Receipt, StoreError, StoreHandle, StoredBatch};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot, watch};
use tokio::time::{Instant, Sleep};
use tracing::{debug, info, warn};

use super::receipts::PartAnswer;
use super::{NodeError, NodePeer, NodeStatus, Outgoing, SHUTDOWN_DRAIN};
use crate::core::{
    self, BadBatch, CommitId, ConnId, Core, Input, LoadId, LocalWrite, Millis, ReqId,
    WAITING_BATCH_BYTES_MAX, WAITING_BATCHES_MAX,
};
use crate::net::{Event, PeerError, Transport};

/// Inputs (store answers, transport events, local requests) already queued
/// that the task takes in one turn, after the one it woke for, and feeds the
/// core together: a burst then shares one commit.
const INPUTS_PER_TURN_MAX: usize = 256;

/// A request from the handle to the task.
pub(super) enum Cmd {
    Submit {
        msgs: Vec<Outgoing>,
        reply: oneshot::Sender<PartAnswer>,
        /// The payload bytes' share of the command budget, returned once the
        /// task has taken the messages.
        budget: OwnedSemaphorePermit,
    },
    Peer {
        change: PeerChange,
        reply: oneshot::Sender<Result<(), NodeError>>,
    },
    Pause {
        node: NodeId,
        paused: bool,
        reply: oneshot::Sender<Result<(), PeerError>>,
    },
    Write {
        write: LocalWrite,
        reply: oneshot::Sender<Result<Receipt, StoreError>>,
    },
    Status {
        reply: oneshot::Sender<NodeStatus>,
    },
    AgentCard {
        card: mesh_protocol::AgentCard,
    },
    /// Messages for `to`, each with its kind, payload and reply (a
    /// forward is one message).
    Publish {
        to: Audience,
        msgs: Vec<(u16, Vec<u8>, PublishReply)>,
        /// As for a submit: returned once the task has taken the payloads.
        budget: OwnedSemaphorePermit,
    },
}

/// Where the answer to one message of a [`Cmd::Publish`] goes.
pub(super) type PublishReply = oneshot::Sender<Result<core::SendReceipt, core::SendError>>;

/// Where a [`Cmd::Publish`] goes.
pub(super) enum Audience {
    /// The members of a topic this node is a member of.
    Topic(mesh_protocol::TopicName),
    /// The new host of an agent that moved away, as a forward.
    Forward(NodeId),
}

pub(super) enum PeerChange {
    Add {
        node: NodeId,
        addrs: Vec<std::net::SocketAddr>,
    },
    Remove {
        node: NodeId,
    },
}

/// What a frame becomes in its connection's reader: a batch is opened there
/// (signature and payload hashes checked), in parallel across connections.
#[derive(Debug)]
pub(super) enum Received {
    Frame(Frame),
    Batch(Result<OpenBatch, BadBatch>),
    Agents(Result<Vec<mesh_protocol::AgentCard>, core::BadCards>),
    Moves(Result<Vec<mesh_protocol::AgentMove>, core::BadCards>),
}

/// The transport's `open`: runs in each connection's reader task.
pub(super) fn open(frame: Frame) -> Received {
    match frame {
        Frame::Batch { batch, payloads } => Received::Batch(core::open_batch(batch, payloads.0)),
        Frame::Agents { cards } => Received::Agents(core::open_cards(cards)),
        Frame::Moves { notices, .. } => Received::Moves(core::open_moves(notices)),
        other => Received::Frame(other),
    }
}

/// A store answer, sent by the writer thread or a blocking-pool read on the
/// task's own channel.
pub(super) enum StoreAnswer {
    Committed {
        commit: CommitId,
        results: Vec<Result<Receipt, StoreError>>,
    },
    Loaded {
        load: LoadId,
        result: Result<Vec<StoredBatch>, StoreError>,
    },
}

/// An outbox read the core asked for.
pub(super) struct LoadReq {
    pub(super) load: LoadId,
    pub(super) stream: StreamId,
    pub(super) after: Seq,
    pub(super) max_bytes: u64,
}

/// One submit part waiting for its answers.
pub(super) struct Part {
    pub(super) answers: Vec<Option<Result<core::SendReceipt, core::SendError>>>,
    pub(super) left: usize,
    pub(super) reply: oneshot::Sender<PartAnswer>,
}

/// Who waits for a request the core answers.
pub(super) enum Waiter {
    /// Message `index` of submit part `part`.
    Send {
        part: u64,
        index: usize,
    },
    /// A publish to a topic.
    Publish(PublishReply),
    Peer {
        change: PeerChange,
        reply: oneshot::Sender<Result<(), NodeError>>,
    },
    Write(oneshot::Sender<Result<Receipt, StoreError>>),
}

// One value per turn, on the stack: boxing the frame would cost an
// allocation per received frame.
#[allow(clippy::large_enum_variant)]
enum Step {
    Closing,
    Store(StoreAnswer),
    Timer,
    Net(Event<Received>),
    Cmd(Cmd),
}

/// The node task's state: plain fields, owned by its one loop.
pub(super) struct Actor<S: MeshStore + ?Sized> {
    pub(super) core: Core,
    pub(super) store: StoreHandle<S>,
    pub(super) transport: Transport<Received>,
    commands: mpsc::Receiver<Cmd>,
    closing: watch::Receiver<bool>,
    /// The journal head; the task is its only writer.
    pub(super) head: watch::Sender<Arrival>,
    /// The peers' names; the task is its only writer.
    names: watch::Sender<super::NodeNames>,
    /// The agents' move notices held; the task is its only writer.
    pub(super) moves: watch::Sender<super::AgentMoves>,
    /// The drains every peer followed; the task is its only writer.
    pub(super) followed: watch::Sender<super::DrainsFollowed>,
    /// The store's epoch; the task is its only writer.
    pub(super) epoch: watch::Sender<Epoch>,
    /// Where the store answers. Unbounded in type, bounded by what is
    /// outstanding: one commit (the core's rule) and at most one outbox read
    /// per live connection (each of at most a catch-up chunk of payload).
    pub(super) store_tx: mpsc::UnboundedSender<StoreAnswer>,
    store_rx: mpsc::UnboundedReceiver<StoreAnswer>,
    /// The commit the store owes an answer for.
    pub(super) committing: Option<CommitId>,
    /// Peer batches (count, payload bytes) fed to the core since it last
    /// issued a commit or had nothing waiting: an upper bound of what waits
    /// in it for the next commit.
    pub(super) fed_since_commit: (usize, u64),
    /// The core's one deadline, and a timer set to it.
    pub(super) deadline: Option<Millis>,
    pub(super) timer: Pin<Box<Sleep>>,
    pub(super) waiters: HashMap<ReqId, Waiter>,
    pub(super) parts: HashMap<u64, Part>,
    next_req: u64,
    next_part: u64,
    /// The outbox reads waiting for the writer of a connection to take its
    /// queue (the catch-up pacing rule), by connection: at most one per
    /// stream (the peer's direct stream, and each topic stream it is fed).
    pub(super) deferred: HashMap<ConnId, Vec<LoadReq>>,
}

impl<S: MeshStore + ?Sized> Actor<S> {
    pub(super) fn new(
        core: Core,
        store: StoreHandle<S>,
        transport: Transport<Received>,
        commands: mpsc::Receiver<Cmd>,
        closing: watch::Receiver<bool>,
        (head, names, moves, followed): (
            watch::Sender<Arrival>,
            watch::Sender<super::NodeNames>,
            watch::Sender<super::AgentMoves>,
            watch::Sender<super::DrainsFollowed>,
        ),
        epoch: watch::Sender<Epoch>,
    ) -> Self {
        let (store_tx, store_rx) = mpsc::unbounded_channel();
        Actor {
            core,
            store,
            transport,
            commands,
            closing,
            head,
            names,
            moves,
            followed,
            epoch,
            store_tx,
            store_rx,
            committing: None,
            fed_since_commit: (0, 0),
            deadline: None,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            waiters: HashMap::new(),
            parts: HashMap::new(),
            next_req: 1,
            next_part: 1,
            deferred: HashMap::new(),
        }
    }

    pub(super) async fn run(mut self) {
        // What the core was fed before the loop started (this node's card).
        self.carry_out();
        self.publish_names();
        let mut drain_until: Option<Instant> = None;
        loop {
            if drain_until.is_none() && *self.closing.borrow() {
                drain_until = Some(Instant::now() + SHUTDOWN_DRAIN);
            }
            if let Some(deadline) = drain_until
                && (!self.core.must_drain() || Instant::now() >= deadline)
            {
                break;
            }
            let step = self.next_step(drain_until).await;
            // While stopping, only store answers and timers get in.
            let paused = drain_until.is_some();
            let mut inputs = Vec::new();
            match step {
                Step::Closing => {
                    drain_until.get_or_insert_with(|| Instant::now() + SHUTDOWN_DRAIN);
                }
                Step::Store(answer) => self.on_store(answer, &mut inputs),
                Step::Timer => {
                    self.deadline = None;
                    inputs.push(Input::Timer);
                }
                Step::Net(ev) => self.on_net(ev, &mut inputs),
                Step::Cmd(cmd) => self.on_cmd(cmd, &mut inputs),
            }
            if !inputs.is_empty() {
                self.gather(&mut inputs, paused);
                self.core.handle_many(inputs, now());
            }
            self.carry_out();
            if !self.core.is_committing() {
                // Nothing waits in the core (what was fed was duplicates, or is
                // committed): a commit may never come to reset this.
                self.fed_since_commit = (0, 0);
            }
        }
        self.stop().await;
    }

    /// Whether the core may have no room for another peer batch before its
    /// next commit takes what waits (a turn's batches wait until the turn
    /// ends, later ones until the commit in flight returns). Then the loop
    /// takes nothing from the transport: the readers fill the receive budget
    /// and stop, and QUIC flow control holds the peers back, instead of the
    /// core dropping batches it must ask for again.
    fn inbound_full(&self) -> bool {
        let (batches, bytes) = self.fed_since_commit;
        batches >= WAITING_BATCHES_MAX
            || bytes + mesh_protocol::MAX_BATCH_PAYLOAD_BYTES > WAITING_BATCH_BYTES_MAX
    }

    /// Waits for the next thing to do. While draining (`drain_until` set),
    /// neither the transport nor new requests are taken; while the core's
    /// inbound queue may be full, the transport is not.
    async fn next_step(&mut self, drain_until: Option<Instant>) -> Step {
        let draining = drain_until.is_some();
        let net = !draining && !self.inbound_full();
        let drained = tokio::time::sleep_until(drain_until.unwrap_or_else(Instant::now));
        tokio::select! {
            _ = self.closing.wait_for(|c| *c), if !draining => Step::Closing,
            () = drained, if draining => Step::Closing,
            // The task holds a sender, so this never closes.
            Some(answer) = self.store_rx.recv() => Step::Store(answer),
            () = &mut self.timer, if self.deadline.is_some() => Step::Timer,
            ev = self.transport.next(), if net => Step::Net(ev),
            cmd = self.commands.recv(), if !draining => match cmd {
                Some(cmd) => Step::Cmd(cmd),
                // Every handle is gone.
                None => Step::Closing,
            },
        }
    }

    /// Takes what is already queued, at most [`INPUTS_PER_TURN_MAX`] inputs
    /// and one of each source in turn (only store answers while `paused`),
    /// adding their inputs to `inputs`.
    fn gather(&mut self, inputs: &mut Vec<Input>, paused: bool) {
        while inputs.len() < INPUTS_PER_TURN_MAX {
            let mut took = false;
            if let Ok(answer) = self.store_rx.try_recv() {
                self.on_store(answer, inputs);
                took = true;
            }
            if !paused {
                if !self.inbound_full()
                    && let Some(ev) = self.transport.try_next()
                {
                    self.on_net(ev, inputs);
                    took = true;
                }
                if let Ok(cmd) = self.commands.try_recv() {
                    self.on_cmd(cmd, inputs);
                    took = true;
                }
            }
            if !took {
                break;
            }
        }
    }

    fn on_store(&mut self, answer: StoreAnswer, inputs: &mut Vec<Input>) {
        let input = match answer {
            StoreAnswer::Committed { commit, results } => {
                debug_assert_eq!(self.committing, Some(commit), "one commit in flight");
                self.committing = None;
                Input::Committed { commit, results }
            }
            StoreAnswer::Loaded { load, result } => Input::OutboxLoaded { load, result },
        };
        inputs.push(input);
    }

    fn on_net(&mut self, ev: Event<Received>, inputs: &mut Vec<Input>) {
        let input = match ev {
            Event::Connected { peer, conn } => Input::PeerConnected { peer, conn },
            // The frame's receive lease is dropped here: the core owns its own bounds.
            Event::Frame {
                peer, conn, item, ..
            } => match item {
                Received::Frame(frame) => Input::Frame { peer, conn, frame },
                Received::Batch(batch) => {
                    if let Ok(open) = &batch {
                        let (n, bytes) = &mut self.fed_since_commit;
                        *n += 1;
                        *bytes += open.batch().payload_bytes();
                    }
                    Input::Batch { peer, conn, batch }
                }
                Received::Agents(cards) => Input::Agents { peer, conn, cards },
                Received::Moves(notices) => Input::Moves {
                    peer,
                    conn,
                    notices,
                },
            },
            Event::Disconnected { peer, conn, reason } => {
                debug!(peer = %peer.fmt_short(), %conn, %reason, "peer disconnected");
                // The core forgets the connection's feed, and so its reads.
                self.deferred.remove(&conn);
                Input::PeerDisconnected { peer, conn }
            }
            Event::Taken { conn } => {
                for req in self.deferred.remove(&conn).unwrap_or_default() {
                    self.start_load(req);
                }
                return;
            }
        };
        inputs.push(input);
    }

    fn req(&mut self) -> ReqId {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        req
    }

    fn on_cmd(&mut self, cmd: Cmd, inputs: &mut Vec<Input>) {
        match cmd {
            Cmd::Submit {
                msgs,
                reply,
                budget,
            } => self.on_submit(msgs, reply, budget, inputs),
            Cmd::Peer { change, reply } => self.on_peer_cmd(change, reply, inputs),
            Cmd::Pause {
                node,
                paused,
                reply,
            } => {
                let _ = reply.send(self.transport.set_paused(node, paused));
            }
            Cmd::Write { write, reply } => {
                let req = self.req();
                self.waiters.insert(req, Waiter::Write(reply));
                inputs.push(Input::Write { req, write });
            }
            Cmd::AgentCard { card } => inputs.push(Input::AgentCard { card }),
            Cmd::Publish { to, msgs, budget } => {
                let mut publications = Vec::with_capacity(msgs.len());
                for (kind, payload, reply) in msgs {
                    let req = self.req();
                    self.waiters.insert(req, Waiter::Publish(reply));
                    publications.push(core::Publication { req, kind, payload });
                }
                match to {
                    Audience::Topic(topic) => inputs.push(Input::Publish {
                        topic,
                        msgs: publications,
                    }),
                    Audience::Forward(to) => {
                        inputs.extend(publications.into_iter().map(|p| Input::Forward {
                            req: p.req,
                            to,
                            kind: p.kind,
                            payload: p.payload,
                        }));
                    }
                }
                drop(budget);
            }
            Cmd::Status { reply } => {
                // The answer reflects every input taken before it.
                if !inputs.is_empty() {
                    self.core.handle_many(inputs.drain(..), now());
                }
                let _ = reply.send(self.status());
            }
        }
    }

    fn on_submit(
        &mut self,
        msgs: Vec<Outgoing>,
        reply: oneshot::Sender<PartAnswer>,
        budget: OwnedSemaphorePermit,
        inputs: &mut Vec<Input>,
    ) {
        let part = self.next_part;
        self.next_part += 1;
        let n = msgs.len();
        for (index, m) in msgs.into_iter().enumerate() {
            let req = self.req();
            self.waiters.insert(req, Waiter::Send { part, index });
            inputs.push(match m.meta {
                None => Input::Send {
                    req,
                    to: m.to,
                    kind: m.kind,
                    payload: m.payload,
                },
                Some(meta) => Input::SendWith {
                    req,
                    to: m.to,
                    kind: m.kind,
                    payload: m.payload,
                    meta: *meta,
                },
            });
        }
        // The payloads are the core's now (within its own bounds).
        drop(budget);
        let answers = (0..n).map(|_| None).collect();
        self.parts.insert(
            part,
            Part {
                answers,
                left: n,
                reply,
            },
        );
    }

    fn on_peer_cmd(
        &mut self,
        change: PeerChange,
        reply: oneshot::Sender<Result<(), NodeError>>,
        inputs: &mut Vec<Input>,
    ) {
        let req = self.req();
        let input = match &change {
            PeerChange::Add { node, addrs } => {
                // Refused before the record is written, so the store, the
                // core and the transport agree on who is a peer.
                if let Err(e) = self.transport.check_add(*node, addrs) {
                    let _ = reply.send(Err(e.into()));
                    return;
                }
                Input::PeerAdded {
                    req,
                    record: PeerRecord {
                        node: *node,
                        addrs: addrs.clone(),
                        epoch: None,
                    },
                }
            }
            PeerChange::Remove { node } => Input::PeerRemoved { req, node: *node },
        };
        self.waiters.insert(req, Waiter::Peer { change, reply });
        inputs.push(input);
    }

    /// Publishes this node's name and its peers' names from the newest
    /// card held of each, if they changed.
    pub(super) fn publish_names(&self) {
        let own = self.core.own_card();
        let peers = self.transport.peers().into_iter().filter_map(|p| {
            self.core
                .peer_card(&p.node)
                .map(|c| (p.node, c.name.clone()))
        });
        let names: Vec<(NodeId, mesh_protocol::NodeName)> =
            std::iter::once((own.node, own.name.clone()))
                .chain(peers)
                .collect();
        self.names.send_if_modified(|held| {
            let changed = **held != names;
            if changed {
                *held = std::sync::Arc::new(names);
            }
            changed
        });
    }

    /// The node as it is now.
    fn status(&self) -> NodeStatus {
        let peers = self
            .transport
            .peers()
            .into_iter()
            .map(|p| NodePeer {
                own_stream: self.core.own_stream(&p.node).cloned(),
                agents: self.core.peer_agent_cards(p.node),
                card: self.core.peer_card(&p.node).cloned(),
                node: p.node,
                addrs: p.addrs,
                conn: p.conn,
                paused: p.paused,
                identity_conflict: p.identity_conflict,
                carrying: self.core.carrying(&p.node),
                refused: p.refused,
            })
            .collect();
        let topics = self
            .core
            .topics()
            .into_iter()
            .map(|record| {
                let (streams, members) = self.core.topic_state(&record.name);
                let streams = streams
                    .into_iter()
                    .map(|(stream, mark)| {
                        let held = self.core.topic_held(&stream).cloned();
                        crate::node::TopicStream { stream, mark, held }
                    })
                    .collect();
                crate::node::NodeTopic {
                    record,
                    streams,
                    members,
                }
            })
            .collect();
        NodeStatus {
            topics,
            moves: self.core.agent_moves(),
            card: self.core.own_card().clone(),
            node: self.core.node_id(),
            epoch: self.core.epoch(),
            ticket: self.transport.ticket(),
            peers,
            agents: self.core.agent_cards(),
            nearby: self.transport.nearby(),
            journal_head: *self.head.borrow(),
            journal: self.core.journal_bounds(),
            store_down: self.core.store_down().map(str::to_owned),
            net: self.transport.counters_now(),
            core: self.core.metrics().clone(),
        }
    }

    async fn stop(self) {
        if self.core.must_drain() {
            warn!("stopping with a commit still unanswered; its senders are told the node stopped");
        } else if self.core.is_committing() {
            warn!(
                "stopping with sends held while the store is down; their senders are told the node stopped, and none of them was written"
            );
        }
        // Dropping the waiters and parts tells everyone waiting that the node stopped.
        drop(self.waiters);
        drop(self.parts);
        self.transport.shutdown().await;
        info!("node stopped");
    }
}

/// The task's clock: milliseconds since the Unix epoch.
pub(super) fn now() -> Millis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Millis(ms)
}
