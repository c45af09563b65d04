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
//! `Peers` (the peer table and each connection's phase),
//! `Author` (own streams, signing, feeding peers, their
//! acks), `Receiver` (marks, the reorder buffer,
//! resync asks, gaps) and `Committer` (the waiting
//! queues and the one commit in flight) — and their deadlines live in one
//! `TimerTable`. `flush` builds each commit from
//! what they queued and routes each group's outcome back to them.

mod agents;
mod author;
mod cards;
mod commit;
mod config;
mod conn;
mod flush;
mod io;
mod local;
mod metrics;
mod moves;
mod outbox;
mod peers;
mod receiver;
#[cfg(test)]
mod tests;
mod timers;
mod topics;

use std::collections::VecDeque;

use mesh_protocol::{Epoch, Frame, NodeCard, NodeId, NodeName, SecretKey, Seq, StreamId};
use mesh_store::{JournalBounds, OwnStream};

pub use agents::{DEDUP_BYTES_MAX, DEDUP_ENTRIES_MAX, DEDUP_WINDOW_MS};
pub use config::{
    ACK_RIDE_MS, CARD_ANSWER_WINDOW_MS, CARD_ANSWERS_MAX, CARD_QUERIES_MAX, Config, HOLD_BYTES_MAX,
    HOLD_MS, HOLD_MSGS_MAX, JOURNAL_AGE_MS_MAX, JOURNAL_BYTES_MAX, PAYLOAD_BYTES_MAX,
    REORDER_BYTES_MAX, REORDER_ENVELOPES_MAX, WAITING_BATCH_BYTES_MAX, WAITING_BATCHES_MAX,
    WAITING_PEER_CHANGES_MAX, WAITING_SEND_BYTES_MAX, WAITING_SENDS_MAX, WAITING_WRITES_MAX,
};
pub use io::{
    BadBatch, BadCards, CloseReason, CommitId, ConnId, Effect, Input, LoadId, LocalWrite, Millis,
    PeerChangeError, Publication, Recovered, ReqId, SendError, SendMeta, SendReceipt, open_batch,
    open_cards, open_moves,
};
pub use metrics::{AgentCounts, DropCounts, DropReason, FrameCounts, Metrics, TopicCounts};
pub use moves::{HOSTED_MAX, MOVES_MAX};
pub use topics::{TOPIC_ANNOUNCE_MS, TOPIC_STREAMS_MAX};

use agents::Agents;
use author::{Author, Loaded};
use commit::{AckWork, Committer};
use peers::{HelloStep, PeerChange, Peers};
use receiver::{Env, Receiver};
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
    topics: topics::Topics,
    moves: moves::Moves,
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
        let topics = topics::Topics::new(me, state.topics, &state.own_streams, &state.marks);
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
            // Topic streams' marks are the topics machine's.
            receiver: Receiver::new(
                me,
                state
                    .marks
                    .into_iter()
                    .filter(|m| topics::topic_of(&m.stream).is_none())
                    .collect(),
            ),
            committer,
            agents: Agents::new(state.agents, state.dedup, &state.dedup_superseded),
            topics,
            moves: moves::Moves::new(me, state.moves),
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
        if topics::topic_of(stream).is_some() {
            return self.topics.mark(stream);
        }
        self.receiver.mark(stream)
    }

    /// The unacknowledged envelopes of ended epochs' streams to `to` that
    /// are still to be carried into this epoch's stream.
    pub fn carrying(&self, to: &NodeId) -> u64 {
        self.author.to_carry(*to)
    }

    /// This node's stream to `to`, as committed (`None` before its first message).
    pub fn own_stream(&self, to: &NodeId) -> Option<&OwnStream> {
        self.author.own(to)
    }

    /// The topics this node is a member of.
    pub fn topics(&self) -> Vec<mesh_store::TopicRecord> {
        self.topics.joined().cloned().collect()
    }

    /// The author streams of `topic` this node holds and its mark of each
    /// (its own stream's: its last seq), and the live peers that said they
    /// are members.
    pub fn topic_state(
        &self,
        topic: &mesh_protocol::TopicName,
    ) -> (Vec<(StreamId, Seq)>, Vec<NodeId>) {
        (self.topics.streams_of(topic), self.topics.members(topic))
    }

    /// What is held of the topic stream `stream`, as committed.
    pub fn topic_held(&self, stream: &StreamId) -> Option<&OwnStream> {
        self.topics.held(stream)
    }

    /// This node's agents' current cards.
    pub fn agent_cards(&self) -> Vec<mesh_protocol::AgentCard> {
        self.agents.local_cards()
    }

    /// The move notice held of each agent that moved, by agent key.
    pub fn agent_moves(&self) -> Vec<mesh_protocol::AgentMove> {
        self.moves.all().cloned().collect()
    }

    /// The move notice held of the agent `key`, if it moved.
    pub fn agent_move(&self, key: &NodeId) -> Option<&mesh_protocol::AgentMove> {
        self.moves.get(key)
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
            Input::Publish { topic, msgs } => self.on_publish(topic, msgs, now),
            Input::Agents { peer, conn, cards } => self.on_agents(peer, conn, cards),
            Input::Moves {
                peer,
                conn,
                notices,
            } => self.on_moves(peer, conn, notices),
            Input::Forward {
                req,
                to,
                kind,
                payload,
            } => self.on_forward(req, to, kind, payload, now),
            Input::AgentCard { card } => self.on_agent_card(card),
            Input::Committed { commit, results } => self.on_committed(commit, results, now),
            Input::OutboxLoaded { load, result } if load.0 & topics::TOPIC_LOAD != 0 => {
                self.topics.on_loaded(load, result, &mut self.out);
            }
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
            Timer::TopicAnnounce => self.topics.on_announce_timer(now, &mut self.out),
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
        let announce = self.topics.announce_deadline(now);
        self.timers.set(Timer::TopicAnnounce, announce);
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
