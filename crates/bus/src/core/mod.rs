//! The sans-IO core: `handle(input, now) -> effects`.
//!
//! [`Core`] makes every decision of the bus — stream sequencing, group
//! commit, outbox policy, acks, resync, gaps, replay defense and the reorder
//! buffer — and does no IO: no sockets, no clock, no store access, no
//! randomness. Time comes in as [`Millis`], store reads and writes go out as
//! [`Effect::LoadOutbox`] and [`Effect::Persist`] and come back as inputs.
//! That is what lets the deterministic simulator (`tests/sim.rs`) drive
//! several cores through loss, reordering, partitions and crashes.
//!
//! `Core` itself only routes, as iroh-gossip's `proto::State` does: the
//! work is done by four machines, each with its own state and invariants —
//! [`Peers`](peers::Peers) (the peer table and each connection's phase),
//! [`Author`](author::Author) (own streams, signing, feeding peers, their
//! acks), [`Receiver`](receiver::Receiver) (marks, the reorder buffer,
//! resync asks, gaps) and [`Committer`](commit::Committer) (the waiting
//! queues and the one commit in flight) — and their deadlines live in one
//! [`TimerTable`](timers::TimerTable). `flush` builds each commit from
//! what they queued and routes each group's outcome back to them.

mod agents;
mod author;
mod cards;
mod commit;
mod config;
mod flush;
mod io;
mod metrics;
mod outbox;
mod peers;
mod receiver;
#[cfg(test)]
mod tests;
mod timers;

use std::collections::VecDeque;

use mesh_protocol::{
    Epoch, Frame, Mark, NodeCard, NodeId, NodeName, OpenBatch, PROTOCOL_VERSION, SecretKey, Seq,
    StreamId,
};
use mesh_store::{JournalBounds, OwnStream, StoreError};

pub use agents::{DEDUP_BYTES_MAX, DEDUP_ENTRIES_MAX, DEDUP_WINDOW_MS};
pub use config::{
    ACK_RIDE_MS, CARD_ANSWER_WINDOW_MS, CARD_ANSWERS_MAX, CARD_QUERIES_MAX, Config, HOLD_BYTES_MAX,
    HOLD_MS, HOLD_MSGS_MAX, JOURNAL_AGE_MS_MAX, JOURNAL_BYTES_MAX, PAYLOAD_BYTES_MAX,
    REORDER_BYTES_MAX, REORDER_ENVELOPES_MAX, WAITING_BATCH_BYTES_MAX, WAITING_BATCHES_MAX,
    WAITING_PEER_CHANGES_MAX, WAITING_SEND_BYTES_MAX, WAITING_SENDS_MAX, WAITING_WRITES_MAX,
};
pub use io::{
    BadBatch, BadCards, CloseReason, CommitId, ConnId, Effect, Input, LoadId, LocalWrite, Millis,
    PeerChangeError, Recovered, ReqId, SendError, SendMeta, SendReceipt, open_batch, open_cards,
};
pub use metrics::{AgentCounts, DropCounts, DropReason, FrameCounts, Metrics};

use agents::Agents;
use author::{Author, HelloCheck, Loaded};
use commit::{AckWork, Committer, WaitingSend};
use peers::{HelloStep, PeerChange, Peers};
use receiver::{Env, Receiver, Sender};
use timers::{PeerTimer, Timer, TimerTable};

/// What the machines hand the driver, in order, and the counters they keep.
#[derive(Debug, Default)]
struct Out {
    effects: VecDeque<Effect>,
    metrics: Metrics,
}

impl Out {
    fn push(&mut self, effect: Effect) {
        self.effects.push_back(effect);
    }

    /// Sends `frame` to `peer` on `conn`, counted by kind.
    fn send(&mut self, peer: NodeId, conn: ConnId, frame: Frame) {
        self.metrics.frames_out.count(&frame);
        self.push(Effect::SendFrame { peer, conn, frame });
    }

    /// Counts an input dropped without changing state.
    fn drop(&mut self, reason: DropReason) {
        self.metrics.dropped.count(reason);
    }
}

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
///    - [`Effect::Written`]: answer the local client of that write;
///    - [`Effect::EpochChanged`]: the store's epoch changed (it went back
///      in time and the core started a new one): cursors change with it;
///    - [`Effect::CloseConnection`]: close it (the core already ignores it).
/// 3. Repeat with the next input. Answers to `Persist` and `LoadOutbox` may
///    be fed whenever they are ready, interleaved with other inputs.
///
/// Local writes (named cursors, subscriber lag records) are inputs too,
/// [`Input::Write`]: the core sequences them with every other commit, so
/// the journal head it reports with [`Effect::Journaled`] is the only one.
///
/// Connections: report a connection with [`Input::PeerConnected`] once it is
/// live, then its frames in order ([`Input::Frame`], and [`Input::Batch`]
/// for a batch, opened with [`open_batch`] at the edge), then
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
/// Counters and marks per stream (an own stream's outbox as counts, never
/// per batch), the peers and their connections, one deadline per peer and
/// stream that needs one, and bounded queues: sends, peer batches, peer
/// changes and local writes waiting for the next commit
/// ([`WAITING_SENDS_MAX`], [`WAITING_BATCHES_MAX`] and their byte bounds,
/// [`WAITING_PEER_CHANGES_MAX`], [`WAITING_WRITES_MAX`]) and early batches
/// per stream ([`REORDER_ENVELOPES_MAX`], [`REORDER_BYTES_MAX`]). Never the
/// outbox: catch-ups read it in chunks.
#[derive(Debug)]
pub struct Core {
    config: Config,
    me: NodeId,
    peers: Peers,
    author: Author,
    receiver: Receiver,
    committer: Committer,
    agents: Agents,
    timers: TimerTable,
    /// The deadline last handed out with [`Effect::SetTimer`].
    armed: Option<Millis>,
    /// The journal's bounds as the last trim reported them.
    journal: Option<JournalBounds>,
    /// This node's newest card, sent in every Hello.
    own_card: NodeCard,
    out: Out,
}

impl Core {
    /// A core for the node `secret`, starting from the committed state `state`.
    ///
    /// Its Hellos carry this node's card from `state.cards`; without one
    /// (a store that never held one) a card named `node` with no addresses,
    /// issued at 0, which any card the node issues later replaces.
    pub fn new(config: Config, secret: SecretKey, state: Recovered) -> Core {
        let me = secret.public();
        let epoch = state.epoch;
        let own_card = state
            .cards
            .iter()
            .find(|c| c.node == me)
            .cloned()
            .unwrap_or_else(|| placeholder_card(&secret));
        let mut peers = Peers::new(me, state.peers);
        peers.load_cards(state.cards);
        let author = Author::new(
            secret,
            epoch,
            state.own_streams,
            state.max_lamport,
            state.ended_own,
            state.entropy,
        );
        let committer = Committer::new();
        Core {
            config,
            me,
            peers,
            author,
            receiver: Receiver::new(me, state.marks),
            committer,
            agents: Agents::new(state.agents, state.dedup),
            timers: TimerTable::default(),
            armed: None,
            journal: None,
            own_card,
            out: Out::default(),
        }
    }

    /// This node's card, as its Hellos carry it.
    pub fn own_card(&self) -> &NodeCard {
        &self.own_card
    }

    /// The newest committed card of the peer `node`.
    pub fn peer_card(&self, node: &NodeId) -> Option<&NodeCard> {
        self.peers.card(*node)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.me
    }

    /// This node's store epoch (it changes only with [`Effect::EpochChanged`]).
    pub fn epoch(&self) -> Epoch {
        self.author.epoch()
    }

    /// The journal's retained range and bytes, as the last trim found them.
    pub fn journal_bounds(&self) -> Option<JournalBounds> {
        self.journal
    }

    /// Whether the store is failing, and its last error.
    pub fn store_down(&self) -> Option<&str> {
        self.committer.store_down().map(|d| d.why.as_str())
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.out.metrics
    }

    /// The committed mark of a stream this node receives (0 if none).
    pub fn mark(&self, stream: &StreamId) -> Seq {
        self.receiver.mark(stream)
    }

    /// This node's stream to `to`, as committed (`None` before its first message).
    pub fn own_stream(&self, to: &NodeId) -> Option<&OwnStream> {
        self.author.own(to)
    }

    /// This node's agents' current cards.
    pub fn agent_cards(&self) -> Vec<mesh_protocol::AgentCard> {
        self.agents.local_cards()
    }

    /// The agent cards `peer` announced on its last connection.
    pub fn peer_agent_cards(&self, peer: NodeId) -> Vec<mesh_protocol::AgentCard> {
        self.agents.peer_cards(peer)
    }

    /// Whether a commit is outstanding or anything waits for one.
    pub fn is_committing(&self) -> bool {
        self.committer.is_committing()
    }

    /// Whether a stopping driver must still wait for the store: a commit is
    /// outstanding, or work waits while the store works. Sends held while
    /// the store is down are not waited for (they are never answered as sent).
    pub fn must_drain(&self) -> bool {
        self.committer.must_drain()
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

    /// The next effect to carry out, in order; `None` when drained.
    #[must_use = "every effect must be carried out"]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.out.effects.pop_front()
    }

    fn apply(&mut self, input: Input, now: Millis) {
        match input {
            Input::PeerConnected { peer, conn } => self.on_connected(peer, conn, now),
            Input::PeerDisconnected { peer, conn } => {
                if self.peers.live_conn(peer) == Some(conn) {
                    self.forget_conn(peer);
                    let at = now.plus(self.config.card_ask_ms);
                    self.peers.schedule_ask(peer, at);
                }
            }
            Input::Frame { peer, conn, frame } => self.on_frame(peer, conn, frame, now),
            Input::Batch { peer, conn, batch } => self.on_batch(peer, conn, batch, now),
            Input::Send {
                req,
                to,
                kind,
                payload,
            } => self.on_send(req, to, kind, payload, now),
            Input::SendWith {
                req,
                to,
                kind,
                payload,
                meta,
            } => self.on_send_with(req, to, kind, payload, meta, now),
            Input::Agents { peer, conn, cards } => self.on_agents(peer, conn, cards),
            Input::AgentCard { card } => self.on_agent_card(card),
            Input::Committed { commit, results } => self.on_committed(commit, results, now),
            Input::OutboxLoaded { load, result } => {
                let (config, out) = (&self.config, &mut self.out);
                match self.author.on_loaded(load, result, now, config, out) {
                    Loaded::Done => {}
                    Loaded::Verified { peer, mark, reset } => {
                        if reset {
                            let work = AckWork {
                                reset: true,
                                ..AckWork::upto(mark)
                            };
                            self.committer.new_epoch_ack(peer, work);
                        } else {
                            self.note_ack(peer, mark);
                        }
                        let (config, out) = (&self.config, &mut self.out);
                        self.author.verified(peer, mark, now, config, out);
                    }
                    Loaded::Forked { peer, mark } => self.store_went_back(peer, mark),
                    Loaded::Carry(work) => self.committer.queue_carry(work),
                }
            }
            Input::Timer => self.on_timer(now),
            Input::PeerAdded { req, record } => self.on_peer_change(req, PeerChange::Put(record)),
            Input::PeerRemoved { req, node } => self.on_peer_change(req, PeerChange::Remove(node)),
            Input::Write { req, write } => self.on_write(req, write),
            Input::OwnCard { card } => self.on_own_card(card),
        }
    }

    /// This node issued a newer card: kept with the next commit, sent in
    /// every later Hello and in answers about this node.
    fn on_own_card(&mut self, card: NodeCard) {
        debug_assert_eq!(card.node, self.me, "a node issues only its own card");
        if card.node != self.me || !card.is_newer_than(&self.own_card) {
            return;
        }
        self.own_card = card.clone();
        self.committer.queue_card(card);
    }

    /// Queues a local write for the next commit; a name the store could
    /// never take, or a full queue, is refused at once.
    fn on_write(&mut self, req: ReqId, write: LocalWrite) {
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

    fn on_connected(&mut self, peer: NodeId, conn: ConnId, now: Millis) {
        if peer == self.me || !self.peers.is_peer(peer) {
            let reason = CloseReason::UnknownPeer;
            self.out
                .push(Effect::CloseConnection { peer, conn, reason });
            return;
        }
        self.forget_conn(peer);
        let hello = self.hello_frame(peer);
        self.peers.open(peer, conn, now);
        self.out.send(peer, conn, hello);
    }

    /// Drops the peer's connection state and what was held for it.
    fn forget_conn(&mut self, peer: NodeId) {
        self.peers.close(peer);
        self.author.drop_feed(peer);
        self.receiver.forget_held(peer, None);
    }

    fn close(&mut self, peer: NodeId, conn: ConnId, reason: CloseReason) {
        self.out
            .push(Effect::CloseConnection { peer, conn, reason });
        self.forget_conn(peer);
    }

    /// Queues a peer change for the next commit; it takes effect once committed.
    fn on_peer_change(&mut self, req: ReqId, change: PeerChange) {
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
    fn apply_peer_change(&mut self, change: PeerChange) {
        if let PeerChange::Remove(node) = change {
            self.forget_conn(node);
            self.committer.drop_acks(node);
        }
        self.peers.apply(change);
    }

    fn on_send(&mut self, req: ReqId, to: NodeId, kind: u16, payload: Vec<u8>, now: Millis) {
        if mesh_protocol::is_mesh_kind(kind) {
            self.out.metrics.sends_refused += 1;
            let result = Err(SendError::ReservedKind(kind));
            self.out.push(Effect::Reply { req, result });
            return;
        }
        if let Err(e) = self.check_send(to, payload.len() as u64) {
            self.out.metrics.sends_refused += 1;
            self.out.push(Effect::Reply {
                req,
                result: Err(e),
            });
            return;
        }
        self.committer.queue_send(WaitingSend {
            req,
            to,
            kind,
            payload,
            created_ms: now.0,
            tracked: None,
        });
    }

    /// Refuses a send at once: a bad request or a full queue. Whether its
    /// outbox takes it is decided when its commit is built.
    fn check_send(&self, to: NodeId, len: u64) -> Result<(), SendError> {
        if to == self.me {
            return Err(SendError::ToSelf);
        }
        if !self.peers.is_peer(to) {
            return Err(SendError::UnknownPeer(to));
        }
        self.check_room(len)
    }

    /// Refuses a send that can never fit, or that finds the queue full.
    fn check_room(&self, len: u64) -> Result<(), SendError> {
        let max = PAYLOAD_BYTES_MAX.min(self.config.outbox.max_bytes);
        if len > max {
            return Err(SendError::TooLarge { len, max });
        }
        let (waiting, waiting_bytes) = self.committer.sends_waiting();
        if let Some(down) = self.committer.store_down() {
            let (msgs_max, bytes_max) = self.config.hold_bounds();
            if waiting >= msgs_max || waiting_bytes + len > bytes_max {
                return Err(SendError::StoreDown {
                    held: waiting,
                    why: down.why.clone(),
                });
            }
        }
        if waiting >= WAITING_SENDS_MAX || waiting_bytes + len > WAITING_SEND_BYTES_MAX {
            return Err(SendError::Busy { waiting });
        }
        Ok(())
    }

    fn on_frame(&mut self, peer: NodeId, conn: ConnId, frame: Frame, now: Millis) {
        if self.peers.live_conn(peer) != Some(conn) {
            self.out.drop(DropReason::StaleConnection);
            return;
        }
        self.out.metrics.frames_in.count(&frame);
        if let Frame::Hello {
            version,
            node,
            epoch,
            marks,
            card,
        } = frame
        {
            self.on_hello(peer, conn, version, node, epoch, marks, now);
            if self.peers.peer_epoch(peer).is_some() {
                self.learn_card(peer, *card);
            }
            return;
        }
        let Some(epoch) = self.peers.peer_epoch(peer) else {
            self.out.drop(DropReason::BeforeHello);
            return;
        };
        let from = Sender { peer, epoch };
        let (config, out) = (&self.config, &mut self.out);
        match frame {
            Frame::Ack { stream, upto } => {
                if self.author.on_ack(peer, &stream, upto, now, out) {
                    self.note_ack(peer, upto);
                }
            }
            Frame::Resync { stream, after } => self
                .author
                .on_resync(peer, &stream, after, now, config, out),
            Frame::ResyncGap {
                stream,
                earliest_available,
            } => {
                let queue = &mut self.committer.inbound;
                let top = self
                    .receiver
                    .on_resync_gap(from, stream, earliest_available, queue, out);
                self.author.observe_lamport(top);
            }
            Frame::ResyncDone { stream, upto } => {
                let mut env = Env {
                    peers: &self.peers,
                    config,
                    now,
                    out,
                };
                self.receiver.on_resync_done(from, stream, upto, &mut env);
            }
            Frame::StreamEnded { stream, held } => {
                let queue = &mut self.committer.inbound;
                self.receiver
                    .on_stream_ended(from, stream, held, queue, out);
            }
            Frame::CardQuery { node } => self.on_card_query(peer, node, now),
            Frame::CardAnswer { node, card } => self.on_card_answer(peer, node, card),
            Frame::Batch { .. } => {
                debug_assert!(false, "a batch frame must come as Input::Batch");
                self.out.drop(DropReason::Malformed);
            }
            Frame::Agents { .. } => {
                debug_assert!(false, "an agents frame must come as Input::Agents");
                self.out.drop(DropReason::Malformed);
            }
            // Handled above.
            Frame::Hello { .. } => {}
        }
    }

    fn on_batch(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        batch: Result<OpenBatch, BadBatch>,
        now: Millis,
    ) {
        if self.peers.live_conn(peer) != Some(conn) {
            self.out.drop(DropReason::StaleConnection);
            return;
        }
        self.out.metrics.frames_in.batch += 1;
        let Some(peer_epoch) = self.peers.peer_epoch(peer) else {
            self.out.drop(DropReason::BeforeHello);
            return;
        };
        let open = match batch {
            Ok(open) => open,
            Err(bad) => return self.out.drop(DropReason::from(bad)),
        };
        let from = Sender {
            peer,
            epoch: peer_epoch,
        };
        let mut env = Env {
            peers: &self.peers,
            config: &self.config,
            now,
            out: &mut self.out,
        };
        let queue = &mut self.committer.inbound;
        let top = self.receiver.on_batch(from, open, queue, &mut env);
        self.author.observe_lamport(top);
        if let Some(seq) = self.receiver.take_conflict() {
            // A second writer with the peer's key (a clone) fed this
            // connection: nothing more of it is taken, or the writer's next
            // seqs would pass as the stream's. Its next connection starts
            // with our Hello, whose mark tells the writer its stream forked.
            self.close(peer, conn, CloseReason::Conflict { seq });
        }
    }

    #[allow(clippy::too_many_arguments)] // The fields of one Hello frame, taken apart.
    fn on_hello(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        version: u32,
        node: NodeId,
        epoch: Epoch,
        marks: Vec<Mark>,
        now: Millis,
    ) {
        if version != PROTOCOL_VERSION {
            let reason = CloseReason::VersionMismatch {
                theirs: version,
                ours: PROTOCOL_VERSION,
            };
            return self.close(peer, conn, reason);
        }
        if node != peer {
            return self.close(peer, conn, CloseReason::WrongNode);
        }
        // Ended streams the peer holds more of than this store: journaled,
        // and the peer is told what this store still holds of them.
        for report in self.author.ended_reports(peer, &marks) {
            let frame = Frame::StreamEnded {
                stream: report.stream.clone(),
                held: report.held,
            };
            self.out.send(peer, conn, frame);
            self.committer.queue_report(report);
        }
        let check = if self.author.is_frozen() {
            // A new epoch is under way: the old streams are not fed.
            match self
                .author
                .check_hello(peer, self.author.mark_in(peer, &marks))
            {
                c @ HelloCheck::RolledBack { .. } => c,
                _ => HelloCheck::Trust(0),
            }
        } else {
            self.author
                .check_hello(peer, self.author.mark_in(peer, &marks))
        };
        let trusted = match check {
            HelloCheck::Trust(m) => Some(m),
            _ => None,
        };
        let seen = self.peers.see_epoch(peer, epoch);
        let reset = matches!(seen, Some(Some(_)));
        match seen {
            // A peer whose store is new holds nothing of ours, whatever it
            // acknowledged before: its acked state is reset to what it says
            // now (once its mark is checked), and its earlier epoch's
            // stream to us has ended.
            Some(earlier) => {
                if earlier.is_some() {
                    self.out.metrics.peer_epoch_changes += 1;
                    self.receiver.forget_held(peer, Some(epoch));
                }
                let work = AckWork {
                    upto: trusted.unwrap_or(0),
                    reset: earlier.is_some() && trusted.is_some(),
                    epoch: Some(epoch),
                    ended: earlier,
                };
                self.committer.new_epoch_ack(peer, work);
            }
            None => {
                if let Some(m) = trusted.filter(|m| *m > 0) {
                    self.note_ack(peer, m);
                }
            }
        }
        self.peers.go_live(peer, epoch);
        // What the peer announced before comes again on this connection,
        // and ours goes before any batch of ours on it.
        self.forget_peer_agents(peer);
        self.announce_to(peer, conn);
        let (config, out) = (&self.config, &mut self.out);
        match check {
            HelloCheck::Trust(mark) => self.author.start_feed(peer, conn, mark, now, config, out),
            HelloCheck::Verify { mark, cid } => self
                .author
                .start_verify(peer, conn, mark, cid, reset, now, out),
            HelloCheck::RolledBack { mark } => self.store_went_back(peer, mark),
        }
    }

    /// `peer` holds our current stream to it up to `mark`, which this store
    /// never wrote or holds otherwise: the store went back in time (a
    /// restored backup, a clone). A new epoch is started before anything
    /// more is sent; what the peer saw that this store lost is journaled
    /// with it, and the unacknowledged envelopes are carried over.
    fn store_went_back(&mut self, peer: NodeId, mark: Seq) {
        tracing::warn!(
            peer = %peer.fmt_short(),
            mark,
            "this node's store went back in time: the peer holds more of our stream than this \
             store wrote, or other envelopes; starting a new epoch"
        );
        if self.committer.switch_waiting() {
            // A new epoch waits for its commit: this stream ends with it too.
            let epoch = self
                .committer
                .waiting_epoch()
                .unwrap_or(self.author.epoch());
            let report = self.author.current_report(peer, mark, epoch);
            self.committer.switch_epoch(epoch, report);
        } else if self.committer.switching() {
            // It is being committed: this stream is an ended one once it is.
            let report = self.author.current_report(peer, mark, self.author.epoch());
            self.committer.report_after_switch(report);
        } else {
            let epoch = self.author.next_epoch();
            let report = self.author.current_report(peer, mark, epoch);
            self.committer.switch_epoch(epoch, report);
            self.author.freeze();
        }
    }

    /// Remembers that `peer` holds everything of our stream up to `upto`.
    fn note_ack(&mut self, peer: NodeId, upto: Seq) {
        let last_acked = self.author.own(&peer).map_or(0, |o| o.last_acked);
        self.committer.note_ack(peer, upto, last_acked);
    }

    /// The Hello this node sends `peer`: its committed marks for the
    /// streams `peer` authors, the peer's newest known epoch first.
    fn hello_frame(&self, peer: NodeId) -> Frame {
        let marks = self.receiver.hello_marks(peer, self.peers.epoch_seen(peer));
        Frame::Hello {
            version: PROTOCOL_VERSION,
            node: self.me,
            epoch: self.author.epoch(),
            marks,
            card: Box::new(self.own_card.clone()),
        }
    }

    fn on_timer(&mut self, now: Millis) {
        // The timer that brought us here is spent; arm_timer sets the next.
        self.armed = None;
        // Inputs earlier in this turn may have moved deadlines.
        self.refresh_timers(now);
        for timer in self.timers.due(now) {
            self.on_due(timer, now);
        }
    }

    /// Handles one due timer.
    fn on_due(&mut self, timer: Timer, now: Millis) {
        let (config, out) = (&self.config, &mut self.out);
        match timer {
            Timer::Peer(peer, PeerTimer::Hello) => match self.peers.hello_due(peer, now, config) {
                Some(HelloStep::Resend(conn)) => {
                    let hello = self.hello_frame(peer);
                    self.out.send(peer, conn, hello);
                }
                Some(HelloStep::GiveUp(conn, attempts)) => {
                    self.close(peer, conn, CloseReason::NoHello { attempts });
                }
                None => {}
            },
            Timer::Peer(peer, PeerTimer::Feed) => {
                self.author.on_feed_timer(peer, now, config, out);
            }
            Timer::Peer(peer, PeerTimer::Ask) => self.on_ask_due(peer, now),
            Timer::Resync(stream) => {
                self.receiver.on_resync_timer(
                    &stream,
                    &mut Env {
                        peers: &self.peers,
                        config,
                        now,
                        out,
                    },
                );
            }
            Timer::Hold => self.expire_held(now),
            Timer::Trim => self.committer.want_trim(),
            // Handled by the flush that ends every turn.
            Timer::StoreRetry | Timer::AckRide => {}
        }
    }

    /// Brings the timers of every peer and stream touched since the last
    /// call up to date (each machine says when its timers are due).
    fn refresh_timers(&mut self, now: Millis) {
        let config = &self.config;
        for peer in self.peers.take_touched() {
            let hello = self.peers.hello_deadline(peer, config);
            self.timers.set(Timer::Peer(peer, PeerTimer::Hello), hello);
            self.peers.ensure_ask(peer, now.plus(config.card_ask_ms));
            let ask = self.peers.ask_deadline(peer);
            self.timers.set(Timer::Peer(peer, PeerTimer::Ask), ask);
            // Whether a stream may be asked for depends on its author's link.
            self.receiver.touch_author(peer);
        }
        for peer in self.author.take_touched() {
            let feed = self.author.feed_deadline(peer, config);
            self.timers.set(Timer::Peer(peer, PeerTimer::Feed), feed);
        }
        for stream in self.receiver.take_touched() {
            let linked = self.peers.peer_epoch(stream.author) == Some(stream.epoch);
            let at = if linked {
                self.receiver.resync_deadline(&stream, now, config)
            } else {
                None
            };
            self.timers.set(Timer::Resync(stream), at);
        }
        let retry = self.committer.store_retry_deadline();
        self.timers.set(Timer::StoreRetry, retry);
        let ride = self.committer.ack_ride_deadline(config);
        self.timers.set(Timer::AckRide, ride);
        let hold = self.committer.hold_deadline(config);
        self.timers.set(Timer::Hold, hold);
        let trim = self.committer.trim_deadline();
        self.timers.set(Timer::Trim, trim);
    }

    fn arm_timer(&mut self, now: Millis) {
        self.refresh_timers(now);
        let next = self.timers.next();
        if let Some(at) = next
            && self.armed != Some(at)
        {
            self.out.push(Effect::SetTimer { at });
        }
        self.armed = next;
    }
}

/// The card a core sends before this node ever issued one: named `node`, no
/// addresses, issued at 0.
fn placeholder_card(secret: &SecretKey) -> NodeCard {
    let name = NodeName::from_hostname("");
    match NodeCard::sign(secret, name, Vec::new(), 0) {
        Ok(card) => card,
        // No addresses is within every bound.
        Err(e) => unreachable!("a card without addresses signs: {e}"),
    }
}
