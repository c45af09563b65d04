//! Topics: membership, publishing, and every member's stream relayed by
//! any member, synced by marks (`docs/design.md`, "Topics").
//!
//! The machine keeps, per topic stream this node holds (its own and other
//! members'), what is held of it and its marks; per live peer, the topics
//! its last `Topics` frame named and its marks; and a feed per (stream,
//! peer) that says how far the peer has the stream. A batch this node
//! commits goes at once to every member whose feed is right before it; a
//! feed that is behind reads the outbox in chunks, as a direct catch-up
//! does. Nobody acknowledges a topic stream: a member asks again with
//! `Resync` when it sees a batch it cannot take yet.

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{
    Channel, Frame, MAX_FRAME_TOPICS, MAX_HELLO_MARKS, Mark, NodeId, OpenBatch, Payloads, Seq,
    StreamId, TopicName,
};
use mesh_store::{Eviction, OwnStream, StoreError, StoredBatch, TopicRecord};

use super::{ConnId, DropReason, Effect, LoadId, Out};

mod inbound;

/// The bit that marks a [`LoadId`] as a topic feed's (the author's are small).
pub(super) const TOPIC_LOAD: u64 = 1 << 63;

/// Payload bytes one catch-up read of a topic stream gathers.
const LOAD_BYTES: u64 = 1 << 20;

/// How often a member tells its peers its topics and marks again, though
/// nothing changed: a topic stream has no acks, so this is what brings a
/// batch that never arrived (a relay's failed outbox read, a frame lost
/// with its connection's queue) within a period.
pub const TOPIC_ANNOUNCE_MS: u64 = 30_000;

/// The most author streams of other members one topic takes (one per
/// author and store epoch). A batch or gap of one more is dropped and
/// counted (`topic_streams_full`), so members (or a key that signs a
/// stream per epoch) cannot grow the marks, feeds and disk of a topic
/// without end: its disk is at most one more than this many times its
/// per-author byte bound (this node's own stream is never refused).
pub const TOPIC_STREAMS_MAX: usize = 256;

/// This node's topic stream that a member holds more of than this store:
/// the store went back in time (a restored backup, a clone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WentBack {
    pub(super) stream: StreamId,
    /// The last seq this store holds of it.
    pub(super) held: Seq,
    /// The member's mark of it.
    pub(super) world: Seq,
}

/// How far one peer has one topic stream, as this node knows it.
#[derive(Debug)]
struct Feed {
    /// The connection it belongs to.
    conn: ConnId,
    /// The highest seq the peer has, or was handed on this connection.
    cursor: Seq,
    /// The outbox read in flight, if any.
    load: Option<LoadId>,
}

/// What one live peer said of its topics.
#[derive(Debug, Default)]
struct PeerTopics {
    conn: Option<ConnId>,
    /// The topics of its pages so far.
    topics: BTreeSet<TopicName>,
    /// Its last page came: `topics` is all of them.
    complete: bool,
}

/// The marks of another member's stream this node receives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Marks {
    /// Every envelope up to here is committed.
    committed: Seq,
    /// Every envelope up to here is committed or in a commit under way.
    pending: Seq,
}

/// A membership change, committed as a local write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TopicChange {
    Join(TopicRecord),
    Leave(TopicName),
}

impl TopicChange {
    /// The membership change `write` makes, if any.
    pub(super) fn of(write: &super::LocalWrite) -> Option<TopicChange> {
        match write {
            super::LocalWrite::JoinTopic(r) => Some(TopicChange::Join(r.clone())),
            super::LocalWrite::LeaveTopic(t) => Some(TopicChange::Leave(t.clone())),
            _ => None,
        }
    }
}

/// The topics machine.
#[derive(Debug)]
pub(super) struct Topics {
    me: NodeId,
    joined: BTreeMap<TopicName, TopicRecord>,
    /// What is held of each topic stream, as committed.
    held: BTreeMap<StreamId, OwnStream>,
    /// Other members' streams this node receives.
    marks: BTreeMap<StreamId, Marks>,
    peers: BTreeMap<NodeId, PeerTopics>,
    /// By stream, then peer.
    feeds: BTreeMap<(StreamId, NodeId), Feed>,
    loads: BTreeMap<LoadId, (StreamId, NodeId)>,
    next_load: u64,
    /// Early batches already asked for again: (stream, peer) → the mark asked after.
    asked: BTreeMap<(StreamId, NodeId), Seq>,
    /// This node's streams of earlier epochs a member holds more of than
    /// this store, and the highest mark of it each peer was told ended
    /// since its connection came (a `StreamEnded` frame, once per mark).
    told_ended: BTreeMap<(StreamId, NodeId), Seq>,
    /// Other members' streams whose author said they ended: the highest
    /// seq journaled as rolled back (its store lost it) in this process.
    rolled_back: BTreeMap<StreamId, Seq>,
    /// When the topics are told to the peers again (`None`: a member of none).
    announce_at: Option<super::Millis>,
}

/// Whether `stream` is a topic's, and which.
pub(super) fn topic_of(stream: &StreamId) -> Option<&TopicName> {
    match &stream.channel {
        Channel::Topic(t) => Some(t),
        Channel::Direct(_) => None,
    }
}

impl Topics {
    /// The machine of node `me`, from what its store holds.
    pub(super) fn new(
        me: NodeId,
        joined: Vec<TopicRecord>,
        own_streams: &[OwnStream],
        marks: &[Mark],
    ) -> Topics {
        let held = own_streams
            .iter()
            .filter(|o| topic_of(&o.stream).is_some())
            .map(|o| (o.stream.clone(), o.clone()))
            .collect();
        let marks = marks
            .iter()
            .filter(|m| topic_of(&m.stream).is_some() && m.stream.author != me)
            .map(|m| {
                let at = Marks {
                    committed: m.seq,
                    pending: m.seq,
                };
                (m.stream.clone(), at)
            })
            .collect();
        Topics {
            me,
            joined: joined.into_iter().map(|t| (t.name.clone(), t)).collect(),
            held,
            marks,
            peers: BTreeMap::new(),
            feeds: BTreeMap::new(),
            loads: BTreeMap::new(),
            next_load: 1,
            asked: BTreeMap::new(),
            told_ended: BTreeMap::new(),
            rolled_back: BTreeMap::new(),
            announce_at: None,
        }
    }

    /// When this node's topics are next told to its peers again, arming
    /// the first deadline a period after `now` once it is a member of any.
    pub(super) fn announce_deadline(&mut self, now: super::Millis) -> Option<super::Millis> {
        if self.joined.is_empty() {
            self.announce_at = None;
        } else if self.announce_at.is_none() {
            self.announce_at = Some(now.plus(TOPIC_ANNOUNCE_MS));
        }
        self.announce_at
    }

    /// The period is up: every live peer is told this node's topics and
    /// marks again, and feeds from its answer what this node lacks.
    pub(super) fn on_announce_timer(&mut self, now: super::Millis, out: &mut Out) {
        self.announce_at = (!self.joined.is_empty()).then(|| now.plus(TOPIC_ANNOUNCE_MS));
        if self.joined.is_empty() {
            return;
        }
        self.tell_live(out);
    }

    /// Tells every live peer this node's topics and marks (the frames are
    /// made once for all of them); returns those peers.
    fn tell_live(&self, out: &mut Out) -> Vec<(NodeId, ConnId)> {
        let live: Vec<(NodeId, ConnId)> = self
            .peers
            .iter()
            .filter_map(|(n, p)| p.conn.map(|c| (*n, c)))
            .collect();
        let frames = self.frames();
        for (peer, conn) in &live {
            for frame in &frames {
                out.send(*peer, *conn, frame.clone());
            }
        }
        live
    }

    /// The topic `name`'s record, if this node is a member.
    pub(super) fn record(&self, name: &TopicName) -> Option<&TopicRecord> {
        self.joined.get(name)
    }

    /// The topics this node is a member of.
    pub(super) fn joined(&self) -> impl Iterator<Item = &TopicRecord> {
        self.joined.values()
    }

    /// What is held of `stream` (a topic stream), as committed.
    pub(super) fn held(&self, stream: &StreamId) -> Option<&OwnStream> {
        self.held.get(stream)
    }

    /// This node's stream of `topic` in `epoch`, as committed (or empty).
    pub(super) fn own_view(&self, stream: &StreamId) -> OwnStream {
        self.held
            .get(stream)
            .cloned()
            .unwrap_or_else(|| OwnStream::empty(stream.clone()))
    }

    /// The held topic streams and this node's mark of each (its own: its
    /// last seq), by topic.
    pub(super) fn streams_of(&self, topic: &TopicName) -> Vec<(StreamId, Seq)> {
        let mut out: BTreeMap<StreamId, Seq> = BTreeMap::new();
        for (s, o) in &self.held {
            if topic_of(s) == Some(topic) && o.next_seq > 1 {
                out.insert(s.clone(), o.next_seq - 1);
            }
        }
        for (s, m) in &self.marks {
            if topic_of(s) == Some(topic) && m.committed > 0 {
                let e = out.entry(s.clone()).or_default();
                *e = (*e).max(m.committed);
            }
        }
        out.into_iter().collect()
    }

    /// The peers whose last `Topics` frame named `topic`.
    pub(super) fn members(&self, topic: &TopicName) -> Vec<NodeId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.topics.contains(topic))
            .map(|(n, _)| *n)
            .collect()
    }

    /// The committed mark of another member's `stream` (0 if none).
    pub(super) fn mark(&self, stream: &StreamId) -> Seq {
        self.marks.get(stream).map_or(0, |m| m.committed)
    }

    /// The `Topics` frames that tell a peer this node's topics and marks.
    pub(super) fn frames(&self) -> Vec<Frame> {
        let mut pages = Vec::new();
        let mut topics = Vec::new();
        let mut marks = Vec::new();
        for name in self.joined.keys() {
            if topics.len() == MAX_FRAME_TOPICS {
                pages.push((std::mem::take(&mut topics), std::mem::take(&mut marks)));
            }
            topics.push(name.clone());
            for (stream, seq) in self.streams_of(name) {
                if marks.len() == MAX_HELLO_MARKS {
                    pages.push((std::mem::take(&mut topics), std::mem::take(&mut marks)));
                }
                marks.push(Mark {
                    stream,
                    seq,
                    cid: None,
                });
            }
        }
        pages.push((topics, marks));
        let last = pages.len() - 1;
        pages
            .into_iter()
            .enumerate()
            .map(|(i, (topics, marks))| Frame::Topics {
                topics,
                marks,
                more: i < last,
            })
            .collect()
    }

    /// Tells `peer`, live on `conn`, this node's topics and marks (a node
    /// of no topic says nothing: it is a member of none until it says so).
    pub(super) fn announce(&mut self, peer: NodeId, conn: ConnId, out: &mut Out) {
        self.peers.entry(peer).or_default().conn = Some(conn);
        if self.joined.is_empty() {
            return;
        }
        for frame in self.frames() {
            out.send(peer, conn, frame);
        }
    }

    /// `peer`'s connection is gone: what it said and its feeds go with it.
    pub(super) fn drop_peer(&mut self, peer: NodeId) {
        self.peers.remove(&peer);
        self.feeds.retain(|(_, p), _| *p != peer);
        self.loads.retain(|_, (_, p)| *p != peer);
        self.asked.retain(|(_, p), _| *p != peer);
        self.told_ended.retain(|(_, p), _| *p != peer);
    }

    /// A page of `peer`'s topics and marks. Once its last page came, it is
    /// fed what it lacks of every topic both are members of. Returns this
    /// node's streams the peer holds more of than this store (the store
    /// went back in time): each of the current `epoch`, and each of an
    /// earlier one the peer was not told ended at that mark yet (it is
    /// counted as told).
    pub(super) fn on_topics(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        (topics, marks, more): (Vec<TopicName>, Vec<Mark>, bool),
        epoch: mesh_protocol::Epoch,
        out: &mut Out,
    ) -> Vec<WentBack> {
        let mut went_back = Vec::new();
        let p = self.peers.entry(peer).or_default();
        if p.complete || p.conn != Some(conn) {
            // A new announcement replaces the last.
            *p = PeerTopics {
                conn: Some(conn),
                ..PeerTopics::default()
            };
            self.feeds.retain(|(_, n), _| *n != peer);
            self.loads.retain(|_, (_, n)| *n != peer);
        }
        // A peer is a member of at most as many topics as this node may
        // be: what a peer names beyond that is not kept.
        for topic in topics {
            if p.topics.len() >= mesh_store::TOPICS_MAX {
                out.drop(DropReason::Malformed);
                break;
            }
            p.topics.insert(topic);
        }
        p.complete = !more;
        let theirs: BTreeSet<TopicName> = p.topics.clone();
        for m in marks {
            let Some(topic) = topic_of(&m.stream) else {
                continue;
            };
            let end = self.end_of(&m.stream);
            if m.stream.author == self.me && m.seq > end {
                let told = self.told_ended.get(&(m.stream.clone(), peer)).copied();
                if m.stream.epoch == epoch || told.is_none_or(|t| t < m.seq) {
                    if m.stream.epoch != epoch {
                        self.told_ended.insert((m.stream.clone(), peer), m.seq);
                    }
                    went_back.push(WentBack {
                        stream: m.stream.clone(),
                        held: end,
                        world: m.seq,
                    });
                }
            }
            // Only a stream this node holds can be fed: a feed per stream
            // held, not per stream a peer names.
            if !theirs.contains(topic)
                || !self.joined.contains_key(topic)
                || !self.held.contains_key(&m.stream)
            {
                continue;
            }
            let feed = Feed {
                conn,
                cursor: m.seq,
                load: None,
            };
            self.feeds.insert((m.stream, peer), feed);
        }
        if !more {
            self.feed_common(peer, conn, out);
        }
        went_back
    }

    /// The live members of `topic` (their announcement complete), told
    /// that this node's `stream` of an earlier epoch ended at `held`: each
    /// is counted as told up to `world`.
    pub(super) fn tell_ended(&mut self, stream: &StreamId, held: Seq, world: Seq, out: &mut Out) {
        let Some(topic) = topic_of(stream) else {
            return;
        };
        let members: Vec<(NodeId, ConnId)> = self
            .peers
            .keys()
            .filter_map(|p| self.member_conn(*p, topic).map(|c| (*p, c)))
            .collect();
        for (peer, conn) in members {
            let told = self.told_ended.entry((stream.clone(), peer)).or_default();
            *told = (*told).max(world);
            let frame = Frame::StreamEnded {
                stream: stream.clone(),
                held,
            };
            out.send(peer, conn, frame);
        }
    }

    /// Feeds `peer`, live on `conn`, what it lacks of every stream this
    /// node holds of the topics both are members of (a stream it named no
    /// mark of: from the start; its own stream: never, it has all of it).
    fn feed_common(&mut self, peer: NodeId, conn: ConnId, out: &mut Out) {
        let common: Vec<TopicName> = self
            .peers
            .get(&peer)
            .filter(|p| p.complete)
            .map(|p| {
                p.topics
                    .iter()
                    .filter(|t| self.joined.contains_key(*t))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for topic in common {
            for (stream, _) in self.streams_of(&topic) {
                if stream.author == peer {
                    continue;
                }
                self.feeds.entry((stream.clone(), peer)).or_insert(Feed {
                    conn,
                    cursor: 0,
                    load: None,
                });
                self.serve(&stream, peer, out);
            }
        }
    }

    /// The live connection of `peer` if it is a member of `topic` (its
    /// announcement complete) and so is this node.
    fn member_conn(&self, peer: NodeId, topic: &TopicName) -> Option<ConnId> {
        let p = self.peers.get(&peer)?;
        (p.complete && p.topics.contains(topic) && self.joined.contains_key(topic))
            .then_some(p.conn)
            .flatten()
    }

    /// Reads on for `peer`'s feed of `stream` if it lacks what is held.
    fn serve(&mut self, stream: &StreamId, peer: NodeId, out: &mut Out) {
        let end = self.end_of(stream);
        let Some(feed) = self.feeds.get_mut(&(stream.clone(), peer)) else {
            return;
        };
        if feed.load.is_some() || feed.cursor >= end {
            return;
        }
        let load = LoadId(TOPIC_LOAD | self.next_load);
        self.next_load += 1;
        feed.load = Some(load);
        self.loads.insert(load, (stream.clone(), peer));
        out.metrics.topics.loads += 1;
        out.push(Effect::LoadOutbox {
            load,
            peer,
            stream: stream.clone(),
            after: feed.cursor,
            max_bytes: LOAD_BYTES,
        });
    }

    /// Whether `stream` is new to `topic` and the topic holds
    /// [`TOPIC_STREAMS_MAX`] streams already.
    fn is_full(&self, stream: &StreamId, topic: &TopicName) -> bool {
        if self.marks.contains_key(stream) || self.held.contains_key(stream) {
            return false;
        }
        let known: BTreeSet<&StreamId> = self
            .marks
            .keys()
            .chain(self.held.keys())
            .filter(|s| topic_of(s) == Some(topic))
            .collect();
        known.len() >= TOPIC_STREAMS_MAX
    }

    /// The last seq held of `stream` (0 if none).
    fn end_of(&self, stream: &StreamId) -> Seq {
        self.held
            .get(stream)
            .map_or(0, |o| o.next_seq.saturating_sub(1))
    }

    /// A catch-up read of a feed came back: its batches go to the peer,
    /// after a gap if the outbox no longer holds what the peer lacks.
    pub(super) fn on_loaded(
        &mut self,
        load: LoadId,
        result: Result<Vec<StoredBatch>, StoreError>,
        out: &mut Out,
    ) {
        let Some((stream, peer)) = self.loads.remove(&load) else {
            return;
        };
        let Some(feed) = self.feeds.get_mut(&(stream.clone(), peer)) else {
            return;
        };
        if feed.load != Some(load) {
            return;
        }
        feed.load = None;
        let batches = match result {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "a topic stream's outbox could not be read; the peer asks again");
                return;
            }
        };
        let conn = feed.conn;
        let Some(first) = batches.first().map(|b| b.batch.first_seq) else {
            // Nothing held past the cursor any more (a gap reset it).
            let earliest = self.held.get(&stream).map_or(0, |o| o.first_retained);
            if earliest > feed.cursor + 1 {
                send_gap(out, peer, conn, &stream, earliest);
                feed.cursor = earliest - 1;
            }
            return;
        };
        if first > feed.cursor + 1 {
            send_gap(out, peer, conn, &stream, first);
        }
        for sb in batches {
            let last = sb.batch.last_seq();
            if last <= feed.cursor {
                continue;
            }
            feed.cursor = last;
            out.metrics.topics.batches_relayed += 1;
            out.send(
                peer,
                conn,
                Frame::Batch {
                    batch: sb.batch,
                    payloads: Payloads(sb.payloads),
                },
            );
        }
        self.serve(&stream, peer, out);
    }

    /// `peer` asks for `stream` after `after`.
    pub(super) fn on_resync(&mut self, peer: NodeId, stream: &StreamId, after: Seq, out: &mut Out) {
        let Some(topic) = topic_of(stream) else {
            return;
        };
        let Some(conn) = self.member_conn(peer, topic) else {
            out.drop(DropReason::UnknownStream);
            return;
        };
        let feed = self.feeds.entry((stream.clone(), peer)).or_insert(Feed {
            conn,
            cursor: after,
            load: None,
        });
        feed.cursor = after;
        // A read in flight answers from an older cursor: a new one starts.
        if let Some(load) = feed.load.take() {
            self.loads.remove(&load);
        }
        if after >= self.end_of(stream) {
            return;
        }
        self.serve(stream, peer, out);
    }

    /// A committed batch of `stream` goes at once to every other member
    /// whose feed is right before it (not back to `from`, nor to its
    /// author); a member that is behind reads the outbox instead.
    pub(super) fn relay(&mut self, batch: &OpenBatch, from: Option<NodeId>, out: &mut Out) {
        let stream = batch.batch().stream().clone();
        let Some(topic) = topic_of(&stream).cloned() else {
            return;
        };
        let first = batch.batch().first_seq();
        let members: Vec<(NodeId, ConnId)> = self
            .peers
            .keys()
            .filter(|p| Some(**p) != from && **p != stream.author)
            .filter_map(|p| self.member_conn(*p, &topic).map(|c| (*p, c)))
            .collect();
        for (peer, conn) in members {
            let feed = self.feeds.entry((stream.clone(), peer)).or_insert(Feed {
                conn,
                cursor: 0,
                load: None,
            });
            if feed.load.is_none() && feed.cursor + 1 == first {
                feed.cursor = batch.batch().last_seq();
                out.metrics.topics.batches_relayed += 1;
                out.send(
                    peer,
                    conn,
                    Frame::Batch {
                        batch: batch.batch().signed().clone(),
                        payloads: Payloads(batch.payloads().to_vec()),
                    },
                );
            } else {
                self.serve(&stream, peer, out);
            }
        }
    }

    /// A committed membership change takes effect: every live peer is told.
    pub(super) fn apply(&mut self, change: TopicChange, out: &mut Out) {
        match change {
            TopicChange::Join(record) => {
                self.joined.insert(record.name.clone(), record);
            }
            TopicChange::Leave(name) => {
                self.joined.remove(&name);
                self.feeds.retain(|(s, _), _| topic_of(s) != Some(&name));
                self.loads.retain(|_, (s, _)| topic_of(s) != Some(&name));
            }
        }
        for (peer, conn) in self.tell_live(out) {
            // Feed what it lacks of the topics both are members of now.
            self.feed_common(peer, conn, out);
        }
    }
}

/// The eviction that keeps what is held of a stream within the topic's
/// bounds once `batch` is added.
pub(super) fn room(record: &TopicRecord, batch: &OpenBatch) -> Eviction {
    let n = batch.batch().entries().len() as u64;
    evict_for(record, n, batch.batch().payload_bytes())
}

/// The eviction that leaves room for `n` envelopes of `bytes` within
/// `record`'s bounds. What it drops of this node's own stream is journaled
/// as lost (for another member's, the store drops it quietly).
pub(super) fn evict_for(record: &TopicRecord, n: u64, bytes: u64) -> Eviction {
    Eviction {
        msgs_max: record.max_msgs.saturating_sub(n),
        bytes_max: record.max_bytes.saturating_sub(bytes),
        loss: Some(format!(
            "topic {}'s bound of {} messages / {} bytes per author",
            record.name, record.max_msgs, record.max_bytes
        )),
    }
}

fn send_gap(out: &mut Out, peer: NodeId, conn: ConnId, stream: &StreamId, earliest: Seq) {
    out.metrics.gaps_sent += 1;
    out.send(
        peer,
        conn,
        Frame::ResyncGap {
            stream: stream.clone(),
            earliest_available: earliest,
        },
    );
}
