//! Unit tests of the core, each driving one or two cores whose effects are
//! carried out at once against a `MemStore`.

use std::collections::VecDeque;

use mesh_protocol::{
    Channel, Epoch, Frame, Mark, NewEnvelope, NodeCard, NodeId, NodeName, OpenBatch,
    PROTOCOL_VERSION, Payloads, SecretKey, Seq, StreamId,
};
use mesh_store::{
    JournalRecord, LossReason, MemStore, MeshStore, OnFull, OutboxBounds, PeerRecord, Receipt,
    StoreError, WriteOp,
};

use super::*;

const T0: Millis = Millis(1_000_000);

fn key(n: u8) -> SecretKey {
    SecretKey::from_bytes(&[n; 32])
}

fn id(n: u8) -> NodeId {
    key(n).public()
}

fn epoch(n: u8) -> Epoch {
    Epoch([n; 16])
}

fn bounds(max_msgs: u64, on_full: OnFull) -> Config {
    Config {
        outbox: OutboxBounds {
            max_msgs,
            max_bytes: 1 << 20,
            on_full,
        },
        ..Config::default()
    }
}

/// One node: a core and its store; effects are carried out at once.
struct Node {
    n: u8,
    core: Core,
    store: MemStore,
    config: Config,
    now: Millis,
    next_req: u64,
    /// Replies, in order.
    replies: Vec<(ReqId, Result<SendReceipt, SendError>)>,
    /// Frames sent, with their connection.
    sent: Vec<(NodeId, ConnId, Frame)>,
    /// Every other effect not carried out (SetTimer, Journaled, CloseConnection).
    other: Vec<Effect>,
    /// Persists seen, as (number of groups, ops of each group).
    persists: Vec<Vec<Vec<WriteOp>>>,
    /// Loads and frames, in the order the core asked for them.
    log: Vec<String>,
    /// Hold commits instead of carrying them out.
    hold_commits: bool,
    held: VecDeque<(CommitId, Vec<Vec<WriteOp>>)>,
}

impl Node {
    /// Node `n` (key and epoch from `n`) that knows the nodes in `peers`.
    fn new(n: u8, store_epoch: u8, peers: &[u8], config: Config) -> Node {
        let store = MemStore::new(epoch(store_epoch));
        let group: Vec<WriteOp> = peers
            .iter()
            .map(|p| {
                WriteOp::PutPeer(PeerRecord {
                    node: id(*p),
                    addrs: Vec::new(),
                    epoch: None,
                })
            })
            .collect();
        for r in store.commit(vec![group]) {
            r.expect("peers are written");
        }
        let core = Core::new(
            config.clone(),
            key(n),
            Recovered::read(&store).expect("mem store reads"),
        );
        Node {
            n,
            core,
            store,
            config,
            now: T0,
            next_req: 1,
            replies: Vec::new(),
            sent: Vec::new(),
            other: Vec::new(),
            persists: Vec::new(),
            log: Vec::new(),
            hold_commits: false,
            held: VecDeque::new(),
        }
    }

    fn id(&self) -> NodeId {
        self.core.node_id()
    }

    /// A new core from the store, as after a crash.
    fn restart(&mut self) {
        self.held.clear();
        self.core = Core::new(
            self.config.clone(),
            key(self.n),
            Recovered::read(&self.store).expect("mem store reads"),
        );
    }

    /// Feeds `input` and carries out persists and loads until none remain.
    /// Returns the frames sent meanwhile.
    fn run(&mut self, input: Input) -> Vec<(NodeId, ConnId, Frame)> {
        self.run_many(vec![input])
    }

    /// As [`Node::run`], with `first` fed together through `handle_many`.
    fn run_many(&mut self, first: Vec<Input>) -> Vec<(NodeId, ConnId, Frame)> {
        let mark = self.sent.len();
        self.core.handle_many(first, self.now);
        let mut inputs = VecDeque::new();
        loop {
            while let Some(e) = self.core.poll_effect() {
                match e {
                    Effect::Persist { commit, groups } => {
                        self.persists.push(groups.clone());
                        if self.hold_commits {
                            self.held.push_back((commit, groups));
                        } else {
                            let results = self.store.commit(groups);
                            inputs.push_back(Input::Committed { commit, results });
                        }
                    }
                    Effect::LoadOutbox {
                        load,
                        stream,
                        after,
                        max_bytes,
                        ..
                    } => {
                        self.log.push(format!("load after {after}"));
                        let result = self.store.read_outbox(&stream, after, max_bytes);
                        inputs.push_back(Input::OutboxLoaded { load, result });
                    }
                    Effect::Reply { req, result } => self.replies.push((req, result)),
                    Effect::SendFrame { peer, conn, frame } => {
                        self.log.push(frame_name(&frame));
                        self.sent.push((peer, conn, frame))
                    }
                    other => self.other.push(other),
                }
            }
            let Some(input) = inputs.pop_front() else {
                break;
            };
            self.core.handle(input, self.now);
        }
        self.sent[mark..].to_vec()
    }

    /// Lets the clock run to the end of the ride bound of the acks waiting
    /// for company, if any, and fires the timer: they are committed alone.
    /// Returns whether there were any.
    fn ride_out_acks(&mut self) -> bool {
        let (Some(since), false) = self.core.committer.acks_waiting() else {
            return false;
        };
        self.now = self.now.max(since.plus(self.config.ack_ride_ms));
        self.run(Input::Timer);
        true
    }

    /// Completes the oldest held commit.
    fn release_commit(&mut self) -> Vec<(NodeId, ConnId, Frame)> {
        let (commit, groups) = self.held.pop_front().expect("a commit is held");
        let results = self.store.commit(groups);
        self.run(Input::Committed { commit, results })
    }

    /// The next request id, taken.
    fn take_req(&mut self) -> ReqId {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        req
    }

    fn send(&mut self, to: NodeId, payload: &[u8]) -> ReqId {
        let req = self.take_req();
        self.run(Input::Send {
            req,
            to,
            kind: 0,
            payload: payload.to_vec(),
        });
        req
    }

    fn reply(&self, req: ReqId) -> Option<&Result<SendReceipt, SendError>> {
        self.replies.iter().find(|(r, _)| *r == req).map(|(_, x)| x)
    }

    fn journal(&self) -> Vec<JournalRecord> {
        self.store
            .journal(0, 10_000)
            .expect("mem store reads")
            .into_iter()
            .map(|i| i.record)
            .collect()
    }

    /// The records of this node's journal that `keep` keeps, in order.
    fn journaled(&self, keep: impl Fn(&JournalRecord) -> bool) -> Vec<JournalRecord> {
        self.journal().into_iter().filter(|r| keep(r)).collect()
    }

    /// The payloads of this node's outbox of `stream`, in order.
    fn outbox_payloads(&self, stream: &StreamId) -> Vec<Vec<u8>> {
        self.store
            .read_outbox(stream, 0, u64::MAX)
            .expect("outbox")
            .into_iter()
            .flat_map(|b| b.payloads)
            .collect()
    }

    /// Payloads of the envelopes of `stream` in this node's journal.
    fn received(&self, stream: &StreamId) -> Vec<(Seq, Vec<u8>)> {
        self.journal()
            .into_iter()
            .filter_map(|r| match r {
                JournalRecord::Envelope {
                    stream: s,
                    seq,
                    payload,
                    ..
                } if s == *stream => Some((seq, payload)),
                _ => None,
            })
            .collect()
    }

    /// What the store holds as node 2's ack of this node's stream.
    fn own_acked(&self) -> Seq {
        self.store
            .own_streams()
            .expect("mem store reads")
            .into_iter()
            .find(|o| o.stream.channel == Channel::Direct(id(2)))
            .map_or(0, |o| o.last_acked)
    }

    fn store_mark(&self, stream: &StreamId) -> Seq {
        self.store
            .marks()
            .expect("mem store reads")
            .into_iter()
            .find(|m| m.stream == *stream)
            .map_or(0, |m| m.seq)
    }

    /// Feeds a new connection `conn` from `peer`; returns the frames sent.
    fn connected(&mut self, peer: u8, conn: ConnId) -> Vec<(NodeId, ConnId, Frame)> {
        self.run(Input::PeerConnected {
            peer: id(peer),
            conn,
        })
    }

    /// Opens connection `conn` from `peer` and feeds its Hello with `marks`;
    /// returns the frames sent in answer to both.
    fn hello_from(
        &mut self,
        peer: u8,
        peer_epoch: u8,
        conn: ConnId,
        marks: Vec<Mark>,
    ) -> Vec<(NodeId, ConnId, Frame)> {
        let mut out = self.connected(peer, conn);
        out.extend(self.frame(peer, conn, hello(peer, peer_epoch, marks, card(peer, 1))));
        out
    }

    fn frame(&mut self, peer: u8, conn: ConnId, frame: Frame) -> Vec<(NodeId, ConnId, Frame)> {
        self.run(frame_input(id(peer), conn, frame))
    }
}

/// Node `node`'s Hello in `node_epoch`, showing `marks` and carrying `card`.
fn hello(node: u8, node_epoch: u8, marks: Vec<Mark>, card: NodeCard) -> Frame {
    Frame::Hello {
        version: PROTOCOL_VERSION,
        node: id(node),
        epoch: epoch(node_epoch),
        marks,
        card: Box::new(card),
    }
}

/// The input a driver makes of `frame` from `peer`: a batch is opened at the edge.
fn frame_input(peer: NodeId, conn: ConnId, frame: Frame) -> Input {
    match frame {
        Frame::Batch { batch, payloads } => Input::Batch {
            peer,
            conn,
            batch: open_batch(batch, payloads.0),
        },
        Frame::Agents { cards } => Input::Agents {
            peer,
            conn,
            cards: super::open_cards(cards),
        },
        Frame::Moves { notices, .. } => Input::Moves {
            peer,
            conn,
            notices: super::open_moves(notices),
        },
        frame => Input::Frame { peer, conn, frame },
    }
}

/// What `pick` makes of the frames of `out` it picks, in order.
fn picked<T>(out: &[(NodeId, ConnId, Frame)], pick: impl Fn(&Frame) -> Option<T>) -> Vec<T> {
    out.iter().filter_map(|(_, _, f)| pick(f)).collect()
}

fn frame_name(f: &Frame) -> String {
    match f {
        Frame::ResyncGap {
            earliest_available, ..
        } => format!("gap {earliest_available}"),
        Frame::Batch { batch, .. } => format!("batch {}", batch.first_seq),
        Frame::ResyncDone { upto, .. } => format!("done {upto}"),
        Frame::Resync { after, .. } => format!("resync {after}"),
        Frame::Ack { upto, .. } => format!("ack {upto}"),
        Frame::Hello { .. } => "hello".to_string(),
        Frame::CardQuery { .. } => "card query".to_string(),
        Frame::CardAnswer { .. } => "card answer".to_string(),
        Frame::Agents { cards } => format!("agents {}", cards.len()),
        Frame::StreamEnded { held, .. } => format!("ended {held}"),
        Frame::Topics { topics, .. } => format!("topics {}", topics.len()),
        Frame::Moves { notices, .. } => format!("moves {}", notices.len()),
        Frame::Followed {
            through, agents, ..
        } => {
            format!("followed {} through {through}", agents.len())
        }
    }
}

/// Node `n`'s card, issued at `issued_ms`, listening on 127.0.0.1:(4000 + n).
fn card(n: u8, issued_ms: u64) -> mesh_protocol::NodeCard {
    let name = mesh_protocol::NodeName::new(&format!("node-{n}")).expect("a valid name");
    let addrs = vec![std::net::SocketAddr::from((
        [127, 0, 0, 1],
        4000 + u16::from(n),
    ))];
    mesh_protocol::NodeCard::sign(&key(n), name, addrs, issued_ms).expect("one address")
}

/// An answer about node `about`: its card `card`.
fn card_answer(about: u8, card: NodeCard) -> Frame {
    Frame::CardAnswer {
        node: id(about),
        card: Some(Box::new(card)),
    }
}

/// A batch of `author` (in `author_epoch`) to `to`, signed, as a frame.
fn batch(author: u8, author_epoch: u8, to: u8, first_seq: Seq, payloads: &[&[u8]]) -> Frame {
    let envelopes = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| NewEnvelope {
            lamport: first_seq + i as u64,
            created_ms: 0,
            kind: 0,
            payload: p.to_vec(),
        })
        .collect();
    let open = OpenBatch::sign(
        &key(author),
        epoch(author_epoch),
        Channel::Direct(id(to)),
        first_seq,
        envelopes,
    )
    .expect("a valid batch");
    let (vb, payloads) = open.into_parts();
    Frame::Batch {
        batch: vb.into_signed(),
        payloads: Payloads(payloads),
    }
}

fn stream(author: u8, author_epoch: u8, to: u8) -> StreamId {
    StreamId::direct(id(author), epoch(author_epoch), id(to))
}

fn payloads(items: &[(Seq, Vec<u8>)]) -> Vec<&[u8]> {
    items.iter().map(|(_, p)| p.as_slice()).collect()
}

/// Two nodes, 1 and 2, and the frames between them.
struct Pair {
    a: Node,
    b: Node,
    conn: Option<ConnId>,
    next_conn: u64,
}

impl Pair {
    fn new(config: Config) -> Pair {
        Pair {
            a: Node::new(1, 1, &[2], config.clone()),
            b: Node::new(2, 2, &[1], config),
            conn: None,
            next_conn: 1,
        }
    }

    fn connect(&mut self) {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.conn = Some(conn);
        let (a, b) = (self.a.id(), self.b.id());
        let mut to_b = self.a.run(Input::PeerConnected { peer: b, conn });
        let mut to_a = self.b.run(Input::PeerConnected { peer: a, conn });
        self.exchange(&mut to_b, &mut to_a);
    }

    fn disconnect(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let (a, b) = (self.a.id(), self.b.id());
        self.a.run(Input::PeerDisconnected { peer: b, conn });
        self.b.run(Input::PeerDisconnected { peer: a, conn });
    }

    /// Delivers frames both ways until both are quiet.
    fn exchange(
        &mut self,
        to_b: &mut Vec<(NodeId, ConnId, Frame)>,
        to_a: &mut Vec<(NodeId, ConnId, Frame)>,
    ) {
        let (a, b) = (self.a.id(), self.b.id());
        for _ in 0..10_000 {
            let Some(conn) = self.conn else { return };
            if !to_b.is_empty() {
                for (_, c, frame) in std::mem::take(to_b) {
                    if c == conn {
                        let out = self.b.run(frame_input(a, conn, frame));
                        to_a.extend(out);
                    }
                }
            } else if !to_a.is_empty() {
                for (_, c, frame) in std::mem::take(to_a) {
                    if c == conn {
                        let out = self.a.run(frame_input(b, conn, frame));
                        to_b.extend(out);
                    }
                }
            } else if !self.a.ride_out_acks() && !self.b.ride_out_acks() {
                return;
            }
        }
        panic!("the pair did not settle");
    }

    /// Node 1 sends `payload` to node 2; frames are exchanged until quiet.
    fn send_a(&mut self, payload: &[u8]) -> ReqId {
        let mark = self.a.sent.len();
        let req = self.a.send(self.b.id(), payload);
        let mut to_b: Vec<_> = self.a.sent[mark..].to_vec();
        self.exchange(&mut to_b, &mut Vec::new());
        req
    }
}

fn ok_seq(r: Option<&Result<SendReceipt, SendError>>) -> Seq {
    match r {
        Some(Ok(receipt)) => receipt.seq,
        other => panic!("expected Ok, got {other:?}"),
    }
}

fn appends(groups: &[Vec<WriteOp>]) -> Vec<(Seq, usize)> {
    groups
        .iter()
        .flatten()
        .filter_map(|op| match op {
            WriteOp::AppendOwn { batch, .. } => {
                Some((batch.batch().first_seq(), batch.batch().entries().len()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn sends_sharing_a_commit_become_one_signed_batch() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.hold_commits = true;
    let first = a.send(id(2), b"one");
    let second = a.send(id(2), b"two");
    let third = a.send(id(2), b"three");
    // The first went alone; the other two waited for it.
    assert_eq!(a.persists.len(), 1);
    assert_eq!(appends(&a.persists[0]), vec![(1, 1)]);
    a.release_commit();
    assert_eq!(a.persists.len(), 2);
    assert_eq!(
        appends(&a.persists[1]),
        vec![(2, 2)],
        "one batch of two envelopes"
    );
    a.release_commit();
    assert_eq!(ok_seq(a.reply(first)), 1);
    assert_eq!(ok_seq(a.reply(second)), 2);
    assert_eq!(ok_seq(a.reply(third)), 3);
    let out = a
        .store
        .read_outbox(&stream(1, 1, 2), 0, u64::MAX)
        .expect("reads");
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].batch.entries.len(), 2);
    out[1]
        .batch
        .clone()
        .verify()
        .expect("one signature covers both");
}

#[test]
fn sends_past_the_batch_limit_are_split_into_several_batches() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.hold_commits = true;
    a.send(id(2), b"first");
    for i in 0..300u32 {
        a.send(id(2), &i.to_be_bytes());
    }
    a.release_commit();
    assert_eq!(appends(&a.persists[1]), vec![(2, 256), (258, 44)]);
    a.release_commit();
    assert_eq!(a.replies.iter().filter(|(_, r)| r.is_ok()).count(), 301);
}

#[test]
fn a_sender_is_answered_only_after_its_commit() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.hold_commits = true;
    let req = a.send(id(2), b"hello");
    assert!(
        a.reply(req).is_none(),
        "no answer before the commit returns"
    );
    a.release_commit();
    assert_eq!(ok_seq(a.reply(req)), 1);

    // A failed commit holds the send, unanswered; it is committed, and
    // answered, once the store is back.
    a.store.set_unavailable(true);
    let held = a.send(id(2), b"held");
    assert!(a.reply(held).is_none());
    a.release_commit();
    assert!(a.reply(held).is_none(), "held, not answered");
    a.store.set_unavailable(false);
    a.now = a.now.plus(a.config.store_retry_ms);
    let again = a.send(id(2), b"again");
    a.release_commit();
    assert_eq!(ok_seq(a.reply(held)), 2, "the held send goes first");
    assert_eq!(ok_seq(a.reply(again)), 3);
}

#[test]
fn a_peer_batch_is_acknowledged_only_after_its_commit() {
    let (mut b, conn) = receiver();
    b.hold_commits = true;
    let out = b.frame(1, conn, batch(1, 1, 2, 1, &[b"x"]));
    assert!(!out.iter().any(|(_, _, f)| matches!(f, Frame::Ack { .. })));
    assert_eq!(
        b.core.mark(&stream(1, 1, 2)),
        0,
        "the mark waits for the commit"
    );
    let out = b.release_commit();
    let acks = picked(&out, |f| match f {
        Frame::Ack { upto, .. } => Some(*upto),
        _ => None,
    });
    assert_eq!(acks, vec![1]);
    assert_eq!(b.core.mark(&stream(1, 1, 2)), 1);
}

#[test]
fn a_gap_in_seq_is_held_and_resync_is_asked() {
    let (mut b, conn) = receiver();
    let out = b.frame(1, conn, batch(1, 1, 2, 3, &[b"three"]));
    assert!(
        out.iter()
            .any(|(_, _, f)| matches!(f, Frame::Resync { after: 0, .. })),
        "asks for what is missing: {out:?}"
    );
    assert!(b.journal().is_empty(), "nothing committed past the hole");
    assert_eq!(b.core.metrics().batches_held, 1);
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"one"]));
    assert_eq!(b.received(&stream(1, 1, 2)).len(), 1);
    b.frame(1, conn, batch(1, 1, 2, 2, &[b"two"]));
    let got = b.received(&stream(1, 1, 2));
    assert_eq!(
        got,
        vec![
            (1, b"one".to_vec()),
            (2, b"two".to_vec()),
            (3, b"three".to_vec())
        ]
    );
    assert_eq!(b.store_mark(&stream(1, 1, 2)), 3);
}

#[test]
fn a_batch_far_past_the_mark_is_not_held() {
    let (mut b, conn) = receiver();
    b.frame(
        1,
        conn,
        batch(1, 1, 2, REORDER_ENVELOPES_MAX + 1, &[b"far"]),
    );
    assert_eq!(b.core.metrics().dropped.get(DropReason::OutsideWindow), 1);
    assert_eq!(b.core.metrics().batches_held, 0);
}

#[test]
fn a_duplicate_batch_changes_nothing_and_is_counted() {
    let (mut b, conn) = receiver();
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"once"]));
    let before = b.journal();
    let commits = b.core.metrics().commits;
    let out = b.frame(1, conn, batch(1, 1, 2, 1, &[b"once"]));
    assert_eq!(b.journal(), before);
    assert_eq!(
        b.core.metrics().commits,
        commits,
        "no commit for a duplicate"
    );
    assert_eq!(b.core.metrics().dropped.get(DropReason::Duplicate), 1);
    assert_eq!(b.core.metrics().duplicate_envelopes, 1);
    assert!(
        out.iter()
            .any(|(_, _, f)| matches!(f, Frame::Ack { upto: 1, .. })),
        "a duplicate is acknowledged again, in case the ack was lost"
    );
}

#[test]
fn a_batch_overlapping_the_mark_is_trimmed_not_dropped() {
    let (mut b, conn) = receiver();
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"1", b"2"]));
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"1", b"2", b"3", b"4"]));
    let got = b.received(&stream(1, 1, 2));
    let seqs: Vec<Seq> = got.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(payloads(&got), vec![&b"1"[..], b"2", b"3", b"4"]);
    assert_eq!(b.core.metrics().duplicate_envelopes, 2);
    assert_eq!(b.store_mark(&stream(1, 1, 2)), 4);
}

/// Asserts `b` committed nothing past `commits`, journaled nothing, and has
/// no mark of `stream`.
fn assert_no_state_changed(b: &Node, commits: u64, stream: &StreamId) {
    assert_eq!(b.core.metrics().commits, commits);
    assert!(b.journal().is_empty());
    assert_eq!(b.core.mark(stream), 0);
}

#[test]
fn a_batch_from_the_wrong_author_changes_no_state() {
    let mut b = Node::new(2, 2, &[1, 3], Config::default());
    let conn = ConnId(7);
    b.hello_from(1, 1, conn, Vec::new());
    let commits = b.core.metrics().commits;
    // Node 3's batch to node 2, relayed by node 1.
    b.frame(1, conn, batch(3, 3, 2, 1, &[b"forged"]));
    // Node 1's batch, but to node 3.
    b.frame(1, conn, batch(1, 1, 3, 1, &[b"elsewhere"]));
    // Node 1's batch of another epoch than it announced.
    b.frame(1, conn, batch(1, 9, 2, 1, &[b"old epoch"]));
    let m = b.core.metrics();
    assert_eq!(m.dropped.get(DropReason::WrongAuthor), 1);
    assert_eq!(m.dropped.get(DropReason::WrongRecipient), 1);
    assert_eq!(m.dropped.get(DropReason::StaleEpoch), 1);
    assert_no_state_changed(&b, commits, &stream(3, 3, 2));
}

#[test]
fn a_bad_signature_changes_no_state() {
    let (mut b, conn) = receiver();
    let commits = b.core.metrics().commits;
    let Frame::Batch {
        mut batch,
        payloads,
    } = batch(1, 1, 2, 1, &[b"x"])
    else {
        unreachable!()
    };
    let good = batch.clone();
    batch.sig[0] ^= 1;
    b.frame(
        1,
        conn,
        Frame::Batch {
            batch,
            payloads: payloads.clone(),
        },
    );
    // A good signature with a payload that does not match its hash.
    b.frame(
        1,
        conn,
        Frame::Batch {
            batch: good,
            payloads: Payloads(vec![b"y".to_vec()]),
        },
    );
    let m = b.core.metrics();
    assert_eq!(m.dropped.get(DropReason::BadSignature), 1);
    assert_eq!(m.dropped.get(DropReason::CidMismatch), 1);
    assert_no_state_changed(&b, commits, &stream(1, 1, 2));
}

#[test]
fn frames_before_the_hello_or_on_a_stale_connection_are_dropped() {
    let mut b = Node::new(2, 2, &[1], Config::default());
    b.connected(1, ConnId(7));
    b.frame(1, ConnId(7), batch(1, 1, 2, 1, &[b"early"]));
    b.frame(1, ConnId(6), batch(1, 1, 2, 1, &[b"stale"]));
    assert_eq!(b.core.metrics().dropped.get(DropReason::BeforeHello), 1);
    assert_eq!(b.core.metrics().dropped.get(DropReason::StaleConnection), 1);
    assert!(b.journal().is_empty());
}

#[test]
fn a_hello_naming_another_node_closes_the_connection() {
    let mut b = Node::new(2, 2, &[1, 3], Config::default());
    b.connected(1, ConnId(7));
    b.frame(1, ConnId(7), hello(3, 3, Vec::new(), card(3, 1)));
    assert!(b.other.iter().any(|e| matches!(
        e,
        Effect::CloseConnection {
            reason: CloseReason::WrongNode,
            ..
        }
    )));
    // The connection is ignored from now on.
    b.frame(1, ConnId(7), batch(1, 1, 2, 1, &[b"x"]));
    assert_eq!(b.core.metrics().dropped.get(DropReason::StaleConnection), 1);
}

#[test]
fn an_unknown_peer_is_refused() {
    let mut b = Node::new(2, 2, &[1], Config::default());
    b.connected(5, ConnId(7));
    assert!(b.other.iter().any(|e| matches!(
        e,
        Effect::CloseConnection {
            reason: CloseReason::UnknownPeer,
            ..
        }
    )));
    let req = b.send(id(5), b"x");
    assert!(matches!(b.reply(req), Some(Err(SendError::UnknownPeer(_)))));
}

#[test]
fn messages_reach_a_connected_peer_in_order_and_are_acknowledged() {
    let mut p = Pair::new(Config::default());
    p.connect();
    for i in 0..5u8 {
        p.send_a(&[i]);
    }
    let got = p.b.received(&stream(1, 1, 2));
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    let own = p.a.core.own_stream(&id(2)).expect("stream exists");
    assert_eq!(own.last_acked, 5);
}

#[test]
fn a_reconnecting_peer_gets_what_it_missed() {
    let mut p = Pair::new(Config::default());
    p.a.send(id(2), b"1");
    p.a.send(id(2), b"2");
    p.connect();
    p.send_a(b"3");
    p.disconnect();
    p.a.send(id(2), b"4");
    p.b.restart();
    p.connect();
    let got = p.b.received(&stream(1, 1, 2));
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert_eq!(p.a.core.own_stream(&id(2)).map(|o| o.last_acked), Some(4));
}

#[test]
fn resync_past_retention_answers_a_gap_with_earliest_available() {
    // Two messages retained; acknowledged ones make room for new ones.
    let mut p = Pair::new(bounds(2, OnFull::Reject));
    p.connect();
    for m in [b"1", b"2", b"3", b"4"] {
        p.send_a(m);
    }
    let own = p.a.core.own_stream(&id(2)).expect("stream").clone();
    assert_eq!((own.first_retained, own.last_acked), (3, 4));
    let conn = p.conn.expect("connected");
    let out = p.a.frame(
        2,
        conn,
        Frame::Resync {
            stream: stream(1, 1, 2),
            after: 0,
        },
    );
    let frames: Vec<String> = out
        .iter()
        .map(|(_, _, f)| match f {
            Frame::ResyncGap {
                earliest_available, ..
            } => format!("gap {earliest_available}"),
            Frame::Batch { batch, .. } => format!("batch {}", batch.first_seq),
            Frame::ResyncDone { upto, .. } => format!("done {upto}"),
            other => other.name().to_string(),
        })
        .collect();
    assert_eq!(frames, vec!["gap 3", "batch 3", "batch 4", "done 4"]);
}

#[test]
fn a_gap_from_the_author_is_journaled_and_moves_the_mark() {
    let (mut b, conn) = receiver();
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"1"]));
    b.frame(
        1,
        conn,
        Frame::ResyncGap {
            stream: stream(1, 1, 2),
            earliest_available: 5,
        },
    );
    b.frame(1, conn, batch(1, 1, 2, 5, &[b"5"]));
    let s = stream(1, 1, 2);
    let j = b.journal();
    assert!(j.contains(&JournalRecord::Gap {
        stream: s.clone(),
        from: 2,
        to: 4
    }));
    assert_eq!(b.store_mark(&s), 5);
    assert_eq!(b.core.metrics().gaps_recorded, 1);
}

#[test]
fn a_peer_with_a_new_epoch_is_fed_again_from_what_is_retained() {
    let mut p = Pair::new(bounds(2, OnFull::Reject));
    p.connect();
    for m in [b"1", b"2", b"3"] {
        p.send_a(m);
    }
    let own = p.a.core.own_stream(&id(2)).expect("stream").clone();
    assert_eq!((own.first_retained, own.last_acked), (2, 3));
    p.disconnect();
    // Node 2 loses its store and comes back with a new epoch.
    p.b = Node::new(2, 22, &[1], bounds(2, OnFull::Reject));
    p.connect();
    let s = stream(1, 1, 2);
    assert_first_is_gap_of_one(&p.b, &s);
    let got = p.b.received(&s);
    assert_eq!(payloads(&got), vec![&b"2"[..], b"3"]);
    assert_eq!(p.a.core.metrics().peer_epoch_changes, 1);
    let own = p.a.core.own_stream(&id(2)).expect("stream");
    assert_eq!(own.last_acked, 3, "acked again by the new store");
    let peers = p.a.store.peers().expect("reads");
    assert_eq!(peers[0].epoch, Some(epoch(22)), "the new epoch is recorded");
}

#[test]
fn an_authors_new_epoch_starts_a_new_stream_at_seq_1() {
    let mut p = Pair::new(Config::default());
    p.connect();
    for m in [b"1", b"2", b"3"] {
        p.send_a(m);
    }
    p.disconnect();
    // Node 1 loses its store: same key, new epoch.
    p.a = Node::new(1, 11, &[2], Config::default());
    p.connect();
    let req = p.send_a(b"new");
    assert_eq!(ok_seq(p.a.reply(req)), 1);
    let old = p.b.received(&stream(1, 1, 2));
    let new = p.b.received(&stream(1, 11, 2));
    assert_eq!(old.len(), 3);
    assert_eq!(new, vec![(1, b"new".to_vec())], "not mistaken for a replay");
    assert_eq!(p.b.core.metrics().dropped.get(DropReason::Duplicate), 0);
}

#[test]
fn reject_policy_refuses_a_full_outbox_with_the_peer_and_counts() {
    let mut a = Node::new(1, 1, &[2], bounds(2, OnFull::Reject));
    let r1 = a.send(id(2), b"1");
    let r2 = a.send(id(2), b"2");
    let r3 = a.send(id(2), b"3");
    assert_eq!(ok_seq(a.reply(r1)), 1);
    assert_eq!(ok_seq(a.reply(r2)), 2);
    let err = a.reply(r3).expect("answered").clone().expect_err("refused");
    assert!(
        matches!(err, SendError::OutboxFull { msgs: 2, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "outbox for peer {} is full (2 msgs",
            id(2).fmt_short()
        )),
        "{text}"
    );
    assert_eq!(a.core.metrics().sends_refused, 1);
    assert_eq!(a.core.own_stream(&id(2)).map(|o| o.next_seq), Some(3));
    assert_eq!(
        a.received(&stream(1, 1, 2)).len(),
        2,
        "nothing written for it"
    );
}

#[test]
fn the_core_refuses_a_full_outbox_by_its_bytes_exactly_before_the_store() {
    // Some retained messages are acked: the core knows which part of the
    // outbox it may evict, bytes and all, so it refuses at once and the
    // store is never asked to write what would not fit.
    let config = Config {
        outbox: OutboxBounds {
            max_msgs: 100,
            max_bytes: 10,
            on_full: OnFull::Reject,
        },
        ..Config::default()
    };
    let mut p = Pair::new(config);
    p.connect();
    p.send_a(b"1");
    p.disconnect();
    let r2 = p.a.send(id(2), b"12345678");
    assert_eq!(ok_seq(p.a.reply(r2)), 2);
    // 1 (acked) + 8 retained: evicting the acked one leaves 8 + 3 > 10.
    let commits = p.a.persists.len();
    let r3 = p.a.send(id(2), b"123");
    assert!(
        matches!(
            p.a.reply(r3),
            Some(Err(SendError::OutboxFull {
                msgs: 1,
                bytes: 8,
                ..
            }))
        ),
        "{:?}",
        p.a.reply(r3)
    );
    assert_eq!(
        p.a.core.metrics().sends_failed,
        0,
        "not failed by the store"
    );
    assert_eq!(p.a.core.metrics().sends_refused, 1);
    assert_eq!(p.a.persists.len(), commits, "nothing was committed for it");
    // Two bytes fit once the acked message goes, which the append says.
    let r4 = p.a.send(id(2), b"12");
    assert_eq!(ok_seq(p.a.reply(r4)), 3);
    let evicts: Vec<_> = p.a.persists[commits..]
        .iter()
        .flatten()
        .flatten()
        .filter_map(|op| match op {
            WriteOp::AppendOwn { evict, .. } => Some(evict.clone()),
            _ => None,
        })
        .collect();
    let keep = mesh_store::Eviction {
        msgs_max: 99,
        bytes_max: 8,
        loss: None,
    };
    assert_eq!(evicts, vec![Some(keep)]);
    let own = p.a.core.own_stream(&id(2)).expect("stream");
    assert_eq!((own.first_retained, own.bytes), (2, 10));
}

#[test]
fn evict_oldest_records_a_loss_and_the_peer_gets_a_gap() {
    let mut p = Pair::new(bounds(2, OnFull::EvictOldest));
    for m in [b"1", b"2", b"3"] {
        let req = p.a.send(id(2), m);
        assert!(matches!(p.a.reply(req), Some(Ok(_))));
    }
    let s = stream(1, 1, 2);
    assert!(p.a.journal().iter().any(|r| matches!(
        r,
        JournalRecord::Loss {
            from: 1,
            to: 1,
            reason: LossReason::OutboxEvicted,
            ..
        }
    )));
    p.connect();
    assert_first_is_gap_of_one(&p.b, &s);
    assert_eq!(payloads(&p.b.received(&s)), vec![&b"2"[..], b"3"]);
}

#[test]
fn a_forward_never_makes_room_by_a_loss_even_under_evict_oldest() {
    let mut p = Pair::new(bounds(2, OnFull::EvictOldest));
    let forward = |n: u8| {
        let envelope = mesh_protocol::AgentEnvelope {
            id: mesh_protocol::MsgId::in_stream([3; 8], u64::from(n)),
            from: mesh_protocol::AgentName::new("bob").expect("a name"),
            to: Some(mesh_protocol::AgentName::new("kim").expect("a name")),
            in_reply_to: None,
            key: None,
            body: vec![n; 4],
            receipt: false,
        };
        mesh_protocol::Forward {
            author: id(3),
            envelope: envelope.encode(),
        }
        .encode()
    };
    let forward_req = |a: &mut Node, n: u8| {
        let req = a.take_req();
        a.run(Input::Forward {
            req,
            to: id(2),
            kind: mesh_protocol::KIND_FORWARD,
            payload: forward(n),
        });
        req
    };
    for n in [1, 2] {
        let req = forward_req(&mut p.a, n);
        assert!(
            matches!(p.a.reply(req), Some(Ok(_))),
            "{:?}",
            p.a.reply(req)
        );
    }
    // The outbox holds two unacknowledged: a third forward is refused,
    // and nothing is given up for it.
    let req = forward_req(&mut p.a, 3);
    assert!(
        matches!(
            p.a.reply(req),
            Some(Err(SendError::OutboxFull { msgs: 2, .. }))
        ),
        "{:?}",
        p.a.reply(req)
    );
    let lost = |a: &Node| {
        a.journal()
            .iter()
            .filter(|r| matches!(r, JournalRecord::Loss { .. }))
            .count()
    };
    // Nor does a plain send make room by a loss while a forward is
    // unacknowledged: it is refused as under `reject`.
    let req = p.a.send(id(2), b"plain");
    assert!(
        matches!(p.a.reply(req), Some(Err(SendError::OutboxFull { .. }))),
        "{:?}",
        p.a.reply(req)
    );
    assert_eq!(lost(&p.a), 0);
    // Once the peer acknowledged them, evict-oldest is as it was: room is
    // made by a loss if need be.
    p.connect();
    let s = stream(1, 1, 2);
    assert_eq!(p.b.received(&s).len(), 2, "both forwards arrived");
    let req = p.a.send(id(2), b"3");
    assert!(
        matches!(p.a.reply(req), Some(Ok(_))),
        "{:?}",
        p.a.reply(req)
    );
    assert_eq!(lost(&p.a), 0, "the acknowledged forwards made the room");
    p.disconnect();
    for body in [&b"4"[..], b"5"] {
        let req = p.a.send(id(2), body);
        assert!(
            matches!(p.a.reply(req), Some(Ok(_))),
            "{:?}",
            p.a.reply(req)
        );
    }
    assert_eq!(lost(&p.a), 1, "a plain send evicts again");
}

#[test]
fn a_failed_commit_rolls_the_mark_back_and_asks_again() {
    let (mut b, conn) = receiver();
    b.store.set_unavailable(true);
    let out = b.frame(1, conn, batch(1, 1, 2, 1, &[b"1"]));
    assert!(
        out.iter()
            .any(|(_, _, f)| matches!(f, Frame::Resync { after: 0, .. })),
        "{out:?}"
    );
    assert!(!out.iter().any(|(_, _, f)| matches!(f, Frame::Ack { .. })));
    assert_eq!(b.core.mark(&stream(1, 1, 2)), 0);
    b.store.set_unavailable(false);
    b.now = b.now.plus(b.config.store_retry_ms);
    // The author answers the resync by sending it again.
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"1"]));
    assert_eq!(b.received(&stream(1, 1, 2)).len(), 1);
}

#[test]
fn sends_past_the_waiting_bound_are_refused_as_busy() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.hold_commits = true;
    a.send(id(2), b"in flight");
    for _ in 0..WAITING_SENDS_MAX {
        a.send(id(2), b"");
    }
    let req = a.send(id(2), b"one too many");
    assert!(matches!(a.reply(req), Some(Err(SendError::Busy { .. }))));
    assert_eq!(a.replies.len(), 1, "only the refused one is answered");
}

#[test]
fn own_lamport_is_one_past_the_highest_seen() {
    let (mut b, conn) = receiver();
    // `batch` stamps lamport = seq; 40 is the highest seen.
    b.frame(1, conn, batch(1, 1, 2, 1, &vec![&b"x"[..]; 40]));
    b.send(id(1), b"reply");
    let lamport = b.journal().into_iter().find_map(|r| match r {
        JournalRecord::Envelope {
            stream, lamport, ..
        } if stream.author == id(2) => Some(lamport),
        _ => None,
    });
    assert_eq!(lamport, Some(41));
}

#[test]
fn an_unacknowledged_stream_is_sent_again_after_silence() {
    let mut p = Pair::new(Config::default());
    p.connect();
    let conn = p.conn.expect("connected");
    // The batch is lost on the way.
    p.a.send(id(2), b"lost");
    p.a.now = p.a.now.plus(p.a.config.retransmit_ms);
    let out = p.a.run(Input::Timer);
    assert!(
        out.iter()
            .any(|(_, c, f)| *c == conn && matches!(f, Frame::Batch { .. }))
    );
    assert_eq!(p.a.core.metrics().retransmits, 1);
}

#[test]
fn an_unanswered_hello_is_sent_again_then_the_connection_closed() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.connected(2, ConnId(3));
    let attempts = a.config.hello_attempts_max;
    for _ in 1..attempts {
        a.now = a.now.plus(a.config.hello_retry_ms);
        let out = a.run(Input::Timer);
        assert!(matches!(out.as_slice(), [(_, _, Frame::Hello { .. })]));
    }
    a.now = a.now.plus(a.config.hello_retry_ms);
    a.run(Input::Timer);
    assert!(a.other.iter().any(|e| matches!(
        e,
        Effect::CloseConnection {
            reason: CloseReason::NoHello { .. },
            ..
        }
    )));
}

#[test]
fn a_restarted_core_resumes_from_the_store() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.send(id(2), b"1");
    a.send(id(2), b"2");
    a.hold_commits = true;
    let lost = a.send(id(2), b"never committed");
    a.restart();
    a.hold_commits = false;
    let req = a.send(id(2), b"3");
    assert_eq!(ok_seq(a.reply(req)), 3, "seqs stay dense across a crash");
    assert!(a.reply(lost).is_none());
}

#[test]
fn a_resync_is_not_taken_as_an_ack() {
    // The asker's `after` is its pending mark, which a failed commit can roll
    // back; acking it would let the author evict what was never committed.
    let mut a = Node::new(1, 1, &[2], bounds(2, OnFull::Reject));
    for m in [b"1", b"2"] {
        a.send(id(2), m);
    }
    let conn = ConnId(99);
    a.hello_from(2, 2, conn, Vec::new());
    a.frame(
        2,
        conn,
        Frame::Resync {
            stream: stream(1, 1, 2),
            after: 2,
        },
    );
    let own = a.core.own_stream(&id(2)).expect("stream");
    assert_eq!(own.last_acked, 0);
    assert_eq!(
        a.core.metrics().resyncs_served,
        2,
        "the hello and the resync"
    );
}

#[test]
fn a_catch_up_is_read_in_chunks_each_after_the_last_was_handed_off() {
    let config = Config {
        catchup_chunk_bytes: 10,
        ..Config::default()
    };
    let mut a = Node::new(1, 1, &[2], config);
    for i in 0..4u8 {
        a.send(id(2), &[i; 8]);
    }
    a.log.clear();
    a.hello_from(2, 2, ConnId(5), Vec::new());
    assert_eq!(
        a.log,
        vec![
            "hello",
            "load after 0",
            "batch 1",
            "load after 1",
            "batch 2",
            "load after 2",
            "batch 3",
            "load after 3",
            "batch 4",
            "done 4"
        ]
    );
}

#[test]
fn a_missing_part_is_asked_again_until_it_comes() {
    let (mut b, conn) = receiver();
    b.frame(1, conn, batch(1, 1, 2, 2, &[b"two"]));
    b.log.clear();
    // Not yet due: nothing is asked twice within the retry interval.
    b.now = b.now.plus(b.config.resync_retry_ms - 1);
    b.run(Input::Timer);
    assert!(b.log.is_empty(), "{:?}", b.log);
    b.now = b.now.plus(1);
    b.run(Input::Timer);
    assert_eq!(b.log, vec!["resync 0"]);
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"one"]));
    b.log.clear();
    b.now = b.now.plus(10 * b.config.resync_retry_ms);
    b.run(Input::Timer);
    assert!(b.log.is_empty(), "nothing is missing any more: {:?}", b.log);
}

fn peer_changed(node: &Node, req: ReqId) -> Option<Result<(), PeerChangeError>> {
    node.other.iter().find_map(|e| match e {
        Effect::PeerChanged { req: r, result, .. } if *r == req => Some(result.clone()),
        _ => None,
    })
}

#[test]
fn a_node_is_refused_as_its_own_peer_and_peer_changes_past_the_bound_as_busy() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.run(Input::PeerRemoved {
        req: ReqId(1),
        node: id(1),
    });
    let err = peer_changed(&a, ReqId(1))
        .expect("answered")
        .expect_err("refused");
    assert!(matches!(err, PeerChangeError::SelfPeer), "{err:?}");
    assert_eq!(err.to_string(), "a node cannot be its own peer");
    // A commit in flight, so the changes that follow wait for the next one.
    a.hold_commits = true;
    a.send(id(2), b"x");
    let max = WAITING_PEER_CHANGES_MAX as u64;
    for req in 10..=10 + max {
        a.run(Input::PeerRemoved {
            req: ReqId(req),
            node: id(3),
        });
    }
    assert!(
        peer_changed(&a, ReqId(10 + max - 1)).is_none(),
        "the last that fits waits"
    );
    let err = peer_changed(&a, ReqId(10 + max))
        .expect("answered at once")
        .expect_err("refused");
    assert!(
        matches!(err, PeerChangeError::Busy { waiting } if waiting == WAITING_PEER_CHANGES_MAX),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("{WAITING_PEER_CHANGES_MAX} peer changes are already waiting; retry later")
    );
}

#[test]
fn adding_a_peer_writes_its_record_and_leaves_other_connections_alone() {
    let mut p = Pair::new(Config::default());
    p.connect();
    p.send_a(b"before");
    let req = ReqId(900);
    let record = PeerRecord {
        node: id(3),
        addrs: vec!["127.0.0.1:4000".parse().expect("addr")],
        epoch: None,
    };
    let out = p.a.run(Input::PeerAdded { req, record });
    assert!(
        out.is_empty(),
        "adding a peer sends nothing to others: {out:?}"
    );
    assert!(matches!(peer_changed(&p.a, req), Some(Ok(()))));
    let stored = p.a.store.peers().expect("peers");
    let three = stored
        .iter()
        .find(|r| r.node == id(3))
        .expect("record written");
    assert_eq!(three.addrs.len(), 1);
    // The connection to node 2 was not touched: a send still flows and is acked.
    p.send_a(b"after");
    let s = stream(1, 1, 2);
    assert_eq!(p.b.received(&s).len(), 2);
    assert_eq!(p.a.core.own_stream(&id(2)).map(|o| o.last_acked), Some(2));
    // Node 3 is now a known peer: its connection gets a Hello, not a refusal.
    let out = p.a.connected(3, ConnId(77));
    assert!(matches!(
        out.as_slice(),
        [(_, ConnId(77), Frame::Hello { .. })]
    ));
    // And it survives a restart.
    p.a.restart();
    assert!(p.a.core.own_stream(&id(2)).is_some());
    let req = p.a.send(id(3), b"to three");
    assert!(matches!(p.a.reply(req), Some(Ok(_))));
}

#[test]
fn adding_a_known_peer_keeps_the_epoch_the_core_recorded() {
    let mut p = Pair::new(Config::default());
    p.connect();
    let before = p.a.store.peers().expect("peers");
    let epoch = before
        .iter()
        .find(|r| r.node == id(2))
        .and_then(|r| r.epoch);
    assert_eq!(
        epoch,
        Some(p.b.core.epoch()),
        "the hello recorded the epoch"
    );
    let req = ReqId(901);
    let record = PeerRecord {
        node: id(2),
        addrs: vec!["127.0.0.1:4001".parse().expect("addr")],
        epoch: None,
    };
    p.a.run(Input::PeerAdded { req, record });
    assert!(matches!(peer_changed(&p.a, req), Some(Ok(()))));
    let after = p.a.store.peers().expect("peers");
    let two = after.iter().find(|r| r.node == id(2)).expect("still known");
    assert_eq!(two.epoch, epoch);
    assert_eq!(two.addrs.len(), 1);
}

#[test]
fn removing_a_peer_forgets_it_durably_and_drops_its_connection_state() {
    let mut p = Pair::new(Config::default());
    p.connect();
    p.send_a(b"one");
    let req = ReqId(902);
    p.a.run(Input::PeerRemoved { req, node: id(2) });
    assert!(matches!(peer_changed(&p.a, req), Some(Ok(()))));
    assert!(
        p.a.store
            .peers()
            .expect("peers")
            .iter()
            .all(|r| r.node != id(2))
    );
    // Frames on its old connection change nothing; a send to it is refused.
    let conn = p.conn.expect("connected");
    let stale = p.a.core.metrics().dropped;
    p.a.run(Input::Frame {
        peer: id(2),
        conn,
        frame: Frame::Ack {
            stream: stream(1, 1, 2),
            upto: 1,
        },
    });
    assert_ne!(p.a.core.metrics().dropped, stale);
    let req = p.a.send(id(2), b"two");
    assert!(matches!(
        p.a.reply(req),
        Some(Err(SendError::UnknownPeer(_)))
    ));
    // Its stream stays in the store.
    p.a.restart();
    assert_eq!(p.a.core.own_stream(&id(2)).map(|o| o.next_seq), Some(2));
}

#[test]
fn a_peer_change_sharing_a_commit_with_an_epoch_record_keeps_both() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.hold_commits = true;
    // A commit in flight, so what follows waits for the next one together.
    a.send(id(2), b"x");
    a.hello_from(2, 5, ConnId(1), Vec::new());
    let req = ReqId(903);
    let addr: std::net::SocketAddr = "127.0.0.1:4002".parse().expect("addr");
    let record = PeerRecord {
        node: id(2),
        addrs: vec![addr],
        epoch: None,
    };
    a.run(Input::PeerAdded { req, record });
    assert!(peer_changed(&a, req).is_none(), "not before its commit");
    a.release_commit();
    a.release_commit();
    assert!(matches!(peer_changed(&a, req), Some(Ok(()))));
    let stored = a.store.peers().expect("peers");
    let two = stored.iter().find(|r| r.node == id(2)).expect("known");
    assert_eq!(two.addrs, vec![addr], "the new addresses");
    assert_eq!(
        two.epoch,
        Some(epoch(5)),
        "the epoch the same commit recorded"
    );
}

/// Node 1, connected to node 2 (whose Hello is committed), with `sent`
/// messages to it committed and sent, and none acknowledged yet.
/// Node 2 that has node 1's Hello on `ConnId(7)`.
fn receiver() -> (Node, ConnId) {
    let mut b = Node::new(2, 2, &[1], Config::default());
    let conn = ConnId(7);
    b.hello_from(1, 1, conn, Vec::new());
    (b, conn)
}

/// Asserts `node`'s journal opens with a gap of seq 1 alone in `stream`.
fn assert_first_is_gap_of_one(node: &Node, stream: &StreamId) {
    assert_eq!(
        node.journal().first(),
        Some(&JournalRecord::Gap {
            stream: stream.clone(),
            from: 1,
            to: 1
        })
    );
}

fn sender_with(sent: usize, config: Config) -> (Node, ConnId) {
    let mut a = Node::new(1, 1, &[2], config);
    let conn = ConnId(7);
    a.hello_from(2, 2, conn, Vec::new());
    for i in 0..sent {
        a.send(id(2), &[i as u8]);
    }
    (a, conn)
}

fn ack(upto: Seq) -> Frame {
    Frame::Ack {
        stream: stream(1, 1, 2),
        upto,
    }
}

fn acked_ops(groups: &[Vec<WriteOp>]) -> Vec<Seq> {
    groups
        .iter()
        .flatten()
        .filter_map(|op| match op {
            WriteOp::Acked { upto, .. } => Some(*upto),
            _ => None,
        })
        .collect()
}

#[test]
fn an_ack_alone_does_not_start_a_commit_before_the_ride_bound() {
    let (mut a, conn) = sender_with(2, Config::default());
    let commits = a.persists.len();
    a.frame(2, conn, ack(2));
    assert_eq!(a.persists.len(), commits, "the ack waits for company");
    assert!(a.core.is_committing(), "it is still owed a commit");
    assert!(
        a.other
            .iter()
            .any(|e| matches!(e, Effect::SetTimer { at } if *at == T0.plus(ACK_RIDE_MS))),
        "the timer is set to the ride bound: {:?}",
        a.other
    );
    a.now = T0.plus(ACK_RIDE_MS - 1);
    a.run(Input::Timer);
    assert_eq!(a.persists.len(), commits, "not before the bound");
    assert_eq!(a.own_acked(), 0);
}

#[test]
fn an_ack_alone_is_committed_at_the_latest_after_the_bound() {
    let (mut a, conn) = sender_with(2, Config::default());
    let commits = a.persists.len();
    a.frame(2, conn, ack(1));
    a.now = T0.plus(20);
    // A later ack joins the one waiting; the bound runs from the first.
    a.frame(2, conn, ack(2));
    a.now = T0.plus(ACK_RIDE_MS);
    a.run(Input::Timer);
    assert_eq!(a.persists.len(), commits + 1);
    assert_eq!(acked_ops(&a.persists[commits]), vec![2]);
    assert_eq!(a.own_acked(), 2);
    assert!(!a.core.is_committing());
}

#[test]
fn an_ack_rides_in_the_next_commit_of_sends_ahead_of_their_appends() {
    let (mut a, conn) = sender_with(2, Config::default());
    let commits = a.persists.len();
    a.frame(2, conn, ack(2));
    a.now = T0.plus(10);
    let req = a.send(id(2), b"three");
    assert_eq!(a.persists.len(), commits + 1, "one commit for both");
    let groups = &a.persists[commits];
    assert!(
        matches!(groups[0][..], [WriteOp::Trim { .. }]),
        "trims first"
    );
    assert!(matches!(groups[1][..], [WriteOp::Acked { upto: 2, .. }]));
    assert_eq!(appends(&groups[2..]), vec![(3, 1)]);
    assert_eq!(ok_seq(a.reply(req)), 3);
    assert_eq!(a.own_acked(), 2);
    assert!(!a.core.is_committing(), "nothing is left to commit");
}

#[test]
fn a_waiting_ack_makes_room_under_reject_and_is_written_before_the_append() {
    // One message fits; the peer's ack (not yet written) frees its place.
    let (mut a, conn) = sender_with(1, bounds(1, OnFull::Reject));
    a.frame(2, conn, ack(1));
    let req = a.send(id(2), b"two");
    assert_eq!(ok_seq(a.reply(req)), 2, "the store saw the ack first");
    let own = a.core.own_stream(&id(2)).expect("stream").clone();
    assert_eq!((own.first_retained, own.last_acked), (2, 1));
}

#[test]
fn a_new_peer_epoch_is_written_at_once_not_held_for_company() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.hello_from(2, 2, ConnId(7), Vec::new());
    assert_eq!(a.persists.len(), 1, "the epoch record went alone");
    let peers = a.store.peers().expect("reads");
    assert_eq!(peers[0].epoch, Some(epoch(2)));
}

#[test]
fn inputs_fed_together_share_one_commit() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.hold_commits = true;
    let sends: Vec<Input> = (0..3u8)
        .map(|i| Input::Send {
            req: ReqId(100 + u64::from(i)),
            to: id(2),
            kind: 0,
            payload: vec![i],
        })
        .collect();
    a.run_many(sends);
    assert_eq!(a.persists.len(), 1);
    assert_eq!(appends(&a.persists[0]), vec![(1, 3)], "one batch of three");
    a.release_commit();
    for (i, req) in (100..103).map(ReqId).enumerate() {
        assert_eq!(ok_seq(a.reply(req)), i as u64 + 1);
    }
}

#[test]
fn an_ack_waiting_out_a_store_failure_sets_no_timer_in_the_past() {
    let (mut a, conn) = sender_with(1, Config::default());
    a.store.set_unavailable(true);
    a.send(id(2), b"fails");
    a.frame(2, conn, ack(1));
    a.now = T0.plus(ACK_RIDE_MS + 1);
    a.other.clear();
    a.run(Input::Timer);
    let timers: Vec<Millis> = a
        .other
        .iter()
        .filter_map(|e| match e {
            Effect::SetTimer { at } => Some(*at),
            _ => None,
        })
        .collect();
    assert_eq!(timers, vec![T0.plus(a.config.store_retry_ms)]);
    a.store.set_unavailable(false);
    a.now = T0.plus(a.config.store_retry_ms);
    a.run(Input::Timer);
    assert_eq!(a.own_acked(), 1, "written once the store is back");
}

#[test]
fn a_batch_dropped_for_a_full_queue_is_asked_again_once_a_commit_empties_it() {
    let (mut b, conn) = receiver();
    b.hold_commits = true;
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"in flight"]));
    let big = vec![7u8; PAYLOAD_BYTES_MAX as usize];
    let per_queue = WAITING_BATCH_BYTES_MAX / PAYLOAD_BYTES_MAX;
    for seq in 2..2 + per_queue {
        b.frame(1, conn, batch(1, 1, 2, seq, &[&big]));
    }
    let out = b.frame(1, conn, batch(1, 1, 2, 2 + per_queue, &[&big]));
    assert!(out.is_empty(), "dropped, nothing asked yet: {out:?}");
    assert_eq!(b.core.metrics().dropped.get(DropReason::QueueFull), 1);
    // The commit in flight returns; the next one takes the queue, and the
    // dropped batch is asked for at once, not a resync interval later.
    let out = b.release_commit();
    let asked: Vec<Seq> = picked(&out, |f| match f {
        Frame::Resync { after, .. } => Some(*after),
        _ => None,
    });
    assert_eq!(asked, vec![1 + per_queue]);
}

impl Node {
    /// Feeds the local write `write` as `req`; returns why it was refused.
    fn refused_write(&mut self, req: ReqId, write: LocalWrite) -> StoreError {
        self.run(Input::Write { req, write });
        written(self, req).expect("answered").expect_err("refused")
    }
}

fn written(node: &Node, req: ReqId) -> Option<Result<Receipt, StoreError>> {
    node.other.iter().find_map(|e| match e {
        Effect::Written { req: r, result } if *r == req => Some(result.clone()),
        _ => None,
    })
}

#[test]
fn a_local_write_is_answered_only_after_the_commit_it_shares() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    a.send(id(2), b"one");
    a.hold_commits = true;
    a.send(id(2), b"two");
    let cursor = LocalWrite::PutCursor {
        name: "reader".into(),
        arrival: 1,
    };
    let lag = LocalWrite::SubscriberLagged {
        subscriber: "subscriber 3".into(),
        from: 1,
        to: 1,
    };
    a.run_many(vec![
        Input::Write {
            req: ReqId(50),
            write: cursor,
        },
        Input::Write {
            req: ReqId(51),
            write: lag,
        },
    ]);
    assert!(written(&a, ReqId(50)).is_none(), "not before its commit");
    a.release_commit();
    assert_eq!(a.persists.len(), 3, "both writes share the next commit");
    assert!(written(&a, ReqId(50)).is_none());
    a.release_commit();
    assert!(matches!(written(&a, ReqId(50)), Some(Ok(_))));
    assert_eq!(a.store.cursor("reader").expect("reads"), Some(1));
    let receipt = written(&a, ReqId(51)).expect("answered").expect("written");
    let (first, last) = receipt.arrivals.expect("journaled");
    assert_eq!(first, last);
    assert_eq!(
        a.journal()[last as usize - 1],
        JournalRecord::SubscriberLagged {
            subscriber: "subscriber 3".into(),
            from: 1,
            to: 1
        }
    );
    assert!(
        a.other
            .iter()
            .any(|e| matches!(e, Effect::Journaled { upto } if *upto == last)),
        "subscribers are woken for the lag record"
    );
}

#[test]
fn a_local_write_the_store_cannot_take_is_refused_and_a_full_queue_is_busy() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    let past_head = LocalWrite::PutCursor {
        name: "reader".into(),
        arrival: 7,
    };
    let err = a.refused_write(ReqId(1), past_head);
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    let long = LocalWrite::SubscriberLagged {
        subscriber: "x".repeat(mesh_store::SUBSCRIBER_NAME_BYTES_MAX + 1),
        from: 1,
        to: 1,
    };
    let commits = a.core.metrics().commits;
    let err = a.refused_write(ReqId(2), long);
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(
        a.core.metrics().commits,
        commits,
        "refused before the store"
    );
    a.hold_commits = true;
    a.send(id(2), b"in flight");
    let cursor = |n: u64| Input::Write {
        req: ReqId(100 + n),
        write: LocalWrite::PutCursor {
            name: format!("c{n}"),
            arrival: 0,
        },
    };
    a.run_many((0..=WAITING_WRITES_MAX as u64).map(cursor).collect());
    let busy = written(&a, ReqId(100 + WAITING_WRITES_MAX as u64));
    assert!(
        matches!(busy, Some(Err(StoreError::Busy { waiting })) if waiting == WAITING_WRITES_MAX),
        "{busy:?}"
    );
    assert!(written(&a, ReqId(100)).is_none(), "the others wait");
}

/// The envelope of `stream` at `seq` in `node`'s journal, and its hash.
fn mark_of(node: &Node, stream: &StreamId, seq: Seq) -> Mark {
    let payload = node
        .received(stream)
        .into_iter()
        .find(|(q, _)| *q == seq)
        .map(|(_, p)| p)
        .expect("journaled");
    Mark {
        stream: stream.clone(),
        seq,
        cid: Some(mesh_protocol::Cid::of(&payload)),
    }
}

fn hold_config(hold_msgs_max: usize) -> Config {
    Config {
        hold_ms: 5_000,
        hold_msgs_max,
        ..Config::default()
    }
}

#[test]
fn a_held_send_is_let_go_after_the_hold_with_a_lost_record_once_the_store_is_back() {
    let (mut a, _) = sender_with(0, hold_config(16));
    a.store.set_unavailable(true);
    let req = a.send(id(2), b"never");
    assert!(a.reply(req).is_none(), "held");
    // Retried on the ticker meanwhile, still unanswered.
    a.now = a.now.plus(a.config.store_retry_ms);
    a.run(Input::Timer);
    assert!(a.reply(req).is_none());
    assert!(a.core.metrics().sends_held >= 2);
    a.now = T0.plus(a.config.hold_ms);
    a.run(Input::Timer);
    match a.reply(req) {
        Some(Err(SendError::Held { held_ms, why })) => {
            assert_eq!(*held_ms, a.config.hold_ms);
            assert!(why.contains("unavailable"), "{why}");
        }
        other => panic!("expected Held, got {other:?}"),
    }
    assert!(
        a.journal().is_empty(),
        "nothing written while the store is down"
    );
    a.store.set_unavailable(false);
    a.now = a.now.plus(a.config.store_retry_ms);
    let next = a.send(id(2), b"after");
    assert_eq!(ok_seq(a.reply(next)), 1, "the let-go send never took a seq");
    let lost = a.journaled(|r| matches!(r, JournalRecord::SendsLost { .. }));
    assert!(
        matches!(
            &lost[..],
            [JournalRecord::SendsLost { to, msgs: 1, bytes: 5, first_ms, .. }]
                if *to == id(2) && *first_ms == T0.0
        ),
        "{lost:?}"
    );
    assert_eq!(a.core.metrics().sends_let_go, 1);
}

#[test]
fn sends_past_the_hold_bounds_are_refused_at_once_while_the_store_is_down() {
    let (mut a, _) = sender_with(0, hold_config(2));
    a.store.set_unavailable(true);
    let first = a.send(id(2), b"1");
    assert!(a.core.store_down().is_some());
    let second = a.send(id(2), b"2");
    let third = a.send(id(2), b"3");
    assert!(a.reply(first).is_none() && a.reply(second).is_none());
    assert!(
        matches!(
            a.reply(third),
            Some(Err(SendError::StoreDown { held: 2, .. }))
        ),
        "{:?}",
        a.reply(third)
    );
    a.store.set_unavailable(false);
    a.now = a.now.plus(a.config.store_retry_ms);
    a.run(Input::Timer);
    assert_eq!(ok_seq(a.reply(first)), 1);
    assert_eq!(ok_seq(a.reply(second)), 2);
}

#[test]
fn a_stopping_node_waits_for_a_commit_under_way_but_not_for_held_sends() {
    let (mut a, _) = sender_with(0, hold_config(16));
    a.hold_commits = true;
    a.send(id(2), b"1");
    assert!(a.core.must_drain(), "a commit is under way");
    a.store.set_unavailable(true);
    a.release_commit();
    assert!(a.core.is_committing(), "the send is held");
    assert!(!a.core.must_drain(), "a held send is not waited for");
}

#[test]
fn every_commit_trims_the_journal_first_and_keeps_it_within_its_bytes() {
    let config = Config {
        journal_bytes_max: 600,
        ..Config::default()
    };
    let (mut a, conn) = sender_with(0, config);
    for i in 0..20u8 {
        let req = a.send(id(2), &[i; 100]);
        ok_seq(a.reply(req));
        a.frame(2, conn, ack(u64::from(i) + 1));
        a.ride_out_acks();
    }
    for p in &a.persists {
        assert!(matches!(p[0][..], [WriteOp::Trim { .. }]), "{p:?}");
    }
    let b = a.store.journal_bounds().expect("bounds");
    assert!(b.bytes <= 600 + 200, "{b:?}");
    assert!(b.first > 1, "{b:?}");
    let bounds = a.core.journal_bounds().expect("reported");
    assert!(bounds.first > 1);
    let own = a.core.own_stream(&id(2)).expect("stream");
    assert!(
        own.first_retained > 1,
        "acknowledged sends went with their rows: {own:?}"
    );
}

#[test]
fn a_trim_due_by_age_runs_alone_when_nothing_else_commits() {
    let config = Config {
        journal_age_ms_max: 60_000,
        ..Config::default()
    };
    let (mut a, _) = sender_with(1, config);
    let commits = a.persists.len();
    // The rows of the send age out a minute after they were dated.
    a.now = T0.plus(2 * 60_000 + 1);
    a.run(Input::Timer);
    assert_eq!(a.persists.len(), commits + 1, "a trim-only commit");
    assert_eq!(a.persists[commits].len(), 1);
    let b = a.store.journal_bounds().expect("bounds");
    assert_eq!(
        b.first,
        b.head + 1,
        "everything is older than a minute: {b:?}"
    );
}

#[test]
fn a_peer_with_a_new_epoch_has_its_old_stream_journaled_as_ended() {
    let (mut b, conn) = receiver();
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"a", b"b"]));
    assert_eq!(b.core.mark(&stream(1, 1, 2)), 2);
    b.run(Input::PeerDisconnected { peer: id(1), conn });
    b.hello_from(1, 3, ConnId(8), Vec::new());
    b.frame(1, ConnId(8), batch(1, 3, 2, 1, &[b"new"]));
    let j = b.journal();
    let ended = j
        .iter()
        .position(|r| {
            *r == JournalRecord::EpochEnded {
                stream: stream(1, 1, 2),
                last: 2,
            }
        })
        .expect("the old epoch's stream is ended");
    let new = j
        .iter()
        .position(|r| matches!(r, JournalRecord::Envelope { stream: s, seq: 1, .. } if *s == stream(1, 3, 2)))
        .expect("the new epoch's message");
    assert!(ended < new, "{j:?}");
    // Once only: the next Hello of the same epoch ends nothing more.
    b.hello_from(1, 3, ConnId(9), Vec::new());
    let n = b
        .journal()
        .iter()
        .filter(|r| matches!(r, JournalRecord::EpochEnded { .. }))
        .count();
    assert_eq!(n, 1);
}

#[test]
fn a_batch_with_another_envelope_at_the_mark_is_a_conflict_journaled_once() {
    let (mut b, conn) = receiver();
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"a", b"b"]));
    // The same (author, epoch, seqs), other payloads: a clone or a restored store.
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"a", b"X"]));
    // The connection that fed it is closed: the other writer's next seq
    // on it must not pass as the stream's.
    assert!(b.other.iter().any(|e| matches!(
        e,
        Effect::CloseConnection {
            conn: ConnId(7),
            reason: CloseReason::Conflict { seq: 2 },
            ..
        }
    )));
    b.frame(1, conn, batch(1, 1, 2, 3, &[b"Z"]));
    assert_eq!(b.core.metrics().dropped.get(DropReason::StaleConnection), 1);
    assert_eq!(b.core.mark(&stream(1, 1, 2)), 2);
    b.run(Input::PeerDisconnected { peer: id(1), conn });
    b.hello_from(1, 1, ConnId(8), Vec::new());
    b.frame(1, ConnId(8), batch(1, 1, 2, 2, &[b"Y", b"c"]));
    b.run(Input::PeerDisconnected {
        peer: id(1),
        conn: ConnId(8),
    });
    b.hello_from(1, 1, ConnId(9), Vec::new());
    let conflicts = b.journaled(|r| matches!(r, JournalRecord::Conflict { .. }));
    assert!(
        matches!(&conflicts[..], [JournalRecord::Conflict { seq: 2, ours, theirs, .. }]
            if *ours == mesh_protocol::Cid::of(b"b") && *theirs == mesh_protocol::Cid::of(b"X")),
        "{conflicts:?}"
    );
    assert_eq!(b.core.metrics().dropped.get(DropReason::Conflict), 2);
    assert_eq!(b.core.mark(&stream(1, 1, 2)), 2, "never taken");
    // The same envelopes again are duplicates, as ever.
    b.frame(1, ConnId(9), batch(1, 1, 2, 1, &[b"a", b"b"]));
    assert_eq!(b.core.metrics().dropped.get(DropReason::Duplicate), 1);
}

#[test]
fn a_second_writers_batch_over_what_is_queued_not_yet_committed_is_a_conflict_not_a_duplicate() {
    let (mut b, conn) = receiver();
    b.hold_commits = true;
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"a", b"b"]));
    // While that commit is under way, another writer's seq 2 (a clone):
    // taken as a duplicate, its seq 3 would then pass as the stream's.
    b.frame(1, conn, batch(1, 1, 2, 2, &[b"X"]));
    assert!(
        b.other.iter().any(|e| matches!(
            e,
            Effect::CloseConnection {
                reason: CloseReason::Conflict { seq: 2 },
                ..
            }
        )),
        "{:?}",
        b.other
    );
    assert_eq!(b.core.metrics().dropped.get(DropReason::Duplicate), 0);
    assert_eq!(b.core.metrics().dropped.get(DropReason::Conflict), 1);
    b.frame(1, conn, batch(1, 1, 2, 3, &[b"Z"]));
    assert_eq!(b.core.metrics().dropped.get(DropReason::StaleConnection), 1);
    b.hold_commits = false;
    b.release_commit();
    assert_eq!(b.core.mark(&stream(1, 1, 2)), 2, "the first writer's");
    let conflicts = b.journaled(|r| matches!(r, JournalRecord::Conflict { .. }));
    assert!(
        matches!(&conflicts[..], [JournalRecord::Conflict { seq: 2, ours, theirs, .. }]
            if *ours == mesh_protocol::Cid::of(b"b") && *theirs == mesh_protocol::Cid::of(b"X")),
        "{conflicts:?}"
    );
    // The first writer's own batch again is a duplicate, as ever.
    b.hello_from(1, 1, ConnId(8), Vec::new());
    b.frame(1, ConnId(8), batch(1, 1, 2, 2, &[b"b"]));
    assert_eq!(b.core.metrics().dropped.get(DropReason::Duplicate), 1);
}

#[test]
fn a_mark_naming_our_envelope_is_trusted_once_the_outbox_shows_it() {
    let (mut a, conn) = sender_with(3, Config::default());
    a.run(Input::PeerDisconnected { peer: id(2), conn });
    let s = stream(1, 1, 2);
    let m = mark_of(&a, &s, 2);
    let out = {
        a.connected(2, ConnId(8));
        a.frame(2, ConnId(8), hello(2, 2, vec![m], card(2, 1)))
    };
    assert!(
        out.iter()
            .any(|(_, _, f)| matches!(f, Frame::Batch { batch, .. } if batch.first_seq <= 3)),
        "fed from the mark once checked: {out:?}"
    );
    a.ride_out_acks();
    assert_eq!(a.own_acked(), 2);
    assert_eq!(a.core.metrics().epoch_switches, 0);
}

/// A node 1 that sent "1", "2", "3" to node 2, which acknowledged "1".
fn sent_three_acked_one() -> Node {
    let (mut a, conn) = sender_with(0, Config::default());
    for p in [b"1", b"2", b"3"] {
        let req = a.send(id(2), p);
        ok_seq(a.reply(req));
    }
    a.frame(2, conn, ack(1));
    a.ride_out_acks();
    assert_eq!(a.own_acked(), 1);
    a.run(Input::PeerDisconnected { peer: id(2), conn });
    a
}

/// Node 2's Hello on `conn` with `marks`, to node `a`; returns what `a` sent.
fn hello_of_2(a: &mut Node, conn: ConnId, marks: Vec<Mark>) -> Vec<(NodeId, ConnId, Frame)> {
    a.hello_from(2, 2, conn, marks)
}

fn epoch_changed(node: &Node) -> Option<Epoch> {
    node.other.iter().find_map(|e| match e {
        Effect::EpochChanged { epoch } => Some(*epoch),
        _ => None,
    })
}

/// A peer's Hello mark of seq 5 of `stream`, with an envelope hash no
/// store here wrote: more than `sent_three_acked_one` holds.
fn claim_of_five(stream: StreamId) -> Mark {
    Mark {
        stream,
        seq: 5,
        cid: Some(mesh_protocol::Cid([9; 32])),
    }
}

#[test]
fn a_peer_holding_more_than_this_store_wrote_makes_it_start_a_new_epoch_before_sending() {
    let mut a = sent_three_acked_one();
    let old = stream(1, 1, 2);
    let claim = claim_of_five(old.clone());
    let out = hello_of_2(&mut a, ConnId(8), vec![claim]);
    let new_epoch = epoch_changed(&a).expect("a new epoch");
    assert_ne!(new_epoch, epoch(1));
    assert_eq!(a.core.epoch(), new_epoch);
    assert_eq!(a.store.meta().epoch, new_epoch, "committed");
    // Nothing of the old stream went out; the peer hears of the new epoch,
    // then what this store still holds of the old stream.
    assert!(
        !out.iter()
            .any(|(_, _, f)| matches!(f, Frame::Batch { batch, .. } if batch.epoch == epoch(1))),
        "{out:?}"
    );
    let hello = out
        .iter()
        .rposition(|(_, _, f)| matches!(f, Frame::Hello { epoch, .. } if *epoch == new_epoch))
        .expect("a Hello of the new epoch");
    let ended = out
        .iter()
        .position(|(_, _, f)| matches!(f, Frame::StreamEnded { stream, held: 1 } if *stream == old))
        .expect("StreamEnded");
    assert!(hello < ended);
    let rolled = a.journaled(|r| matches!(r, JournalRecord::RolledBack { .. }));
    assert!(
        matches!(&rolled[..], [JournalRecord::RolledBack { stream, from: 2, to: 5, .. }] if *stream == old),
        "{rolled:?}"
    );
    // The unacknowledged "2" and "3" are carried over to the new stream,
    // without being journaled again, and sent to the peer from seq 1.
    let new = StreamId::direct(id(1), new_epoch, id(2));
    let own = a.core.own_stream(&id(2)).expect("new stream");
    assert_eq!((own.stream.clone(), own.next_seq), (new.clone(), 3));
    let sent = picked(&a.sent, |f| match f {
        Frame::Batch { batch, payloads } if batch.epoch == new_epoch => {
            Some((batch.first_seq, payloads.0.clone()))
        }
        _ => None,
    });
    assert_eq!(sent, vec![(1, vec![b"2".to_vec(), b"3".to_vec()])]);
    assert_eq!(
        a.journal()
            .iter()
            .filter(|r| matches!(r, JournalRecord::Envelope { .. }))
            .count(),
        3,
        "each message journaled once"
    );
    assert!(
        a.store
            .own_streams()
            .expect("own")
            .iter()
            .all(|o| o.stream != old),
        "the old outbox is dropped"
    );
    // Sends go on in the new epoch, after what was carried.
    let req = a.send(id(2), b"4");
    assert_eq!(ok_seq(a.reply(req)), 3);
}

#[test]
fn a_connection_still_waiting_for_the_peers_hello_hears_the_new_epoch_once_it_is_committed() {
    let mut a = sent_three_acked_one();
    let claim = claim_of_five(stream(1, 1, 2));
    a.hold_commits = true;
    hello_of_2(&mut a, ConnId(8), vec![claim]);
    // The new epoch's commit is in flight when the link is replaced: the
    // new connection's first Hello names the old epoch.
    a.run(Input::PeerDisconnected {
        peer: id(2),
        conn: ConnId(8),
    });
    let first = a.connected(2, ConnId(9));
    assert!(
        first
            .iter()
            .any(|(_, _, f)| matches!(f, Frame::Hello { epoch: e, .. } if *e == epoch(1))),
        "{first:?}"
    );
    let out = a.release_commit();
    let new_epoch = epoch_changed(&a).expect("a new epoch");
    assert!(
        out.iter().any(|(_, c, f)| *c == ConnId(9)
            && matches!(f, Frame::Hello { epoch: e, .. } if *e == new_epoch)),
        "the peer hears of the new epoch before its Hello comes: {out:?}"
    );
}

#[test]
fn an_ack_is_not_sent_on_a_connection_that_replaced_the_one_its_batch_came_on() {
    let (mut b, conn) = receiver();
    b.hold_commits = true;
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"a-1"]));
    // Another process with node 1's key takes the link before the commit
    // returns: the ack of a-1 is not its to have.
    b.run(Input::PeerDisconnected { peer: id(1), conn });
    let other = ConnId(8);
    b.hello_from(1, 1, other, Vec::new());
    let out = b.release_commit();
    let acks = picked(&out, |f| match f {
        Frame::Ack { upto, .. } => Some(*upto),
        _ => None,
    });
    assert!(acks.is_empty(), "{out:?}");
    assert_eq!(b.core.metrics().acks_withheld, 1);
    // The same batch on the new connection (a restart resends it) is
    // acknowledged there.
    let out = b.frame(1, other, batch(1, 1, 2, 1, &[b"a-1"]));
    assert!(
        out.iter()
            .any(|(_, c, f)| *c == other && matches!(f, Frame::Ack { upto: 1, .. })),
        "{out:?}"
    );
}

#[test]
fn what_an_ended_epoch_still_has_to_carry_counts_as_carrying_until_it_is_carried() {
    let mut a = sent_three_acked_one();
    let claim = Mark {
        stream: stream(1, 1, 2),
        seq: 5,
        cid: Some(mesh_protocol::Cid([9; 32])),
    };
    a.hold_commits = true;
    hello_of_2(&mut a, ConnId(8), vec![claim]);
    let mut seen = Vec::new();
    while !a.held.is_empty() {
        a.release_commit();
        seen.push(a.core.carrying(&id(2)));
    }
    // "2" and "3" are unacknowledged: between the new epoch's commit and
    // the carry's, the new stream is empty and the two are carrying.
    assert!(epoch_changed(&a).is_some());
    assert!(seen.contains(&2), "{seen:?}");
    assert_eq!(seen.last(), Some(&0), "{seen:?}");
    assert_eq!(a.core.own_stream(&id(2)).expect("new stream").next_seq, 3);
}

#[test]
fn a_mark_naming_another_envelope_than_ours_is_a_fork_and_its_unacknowledged_are_carried_over() {
    let mut a = sent_three_acked_one();
    let old = stream(1, 1, 2);
    // The peer holds seq 3, but not ours: another writer used the seq.
    let forked = Mark {
        stream: old.clone(),
        seq: 3,
        cid: Some(mesh_protocol::Cid::of(b"someone else's 3")),
    };
    a.hold_commits = false;
    let req = {
        let out = hello_of_2(&mut a, ConnId(8), vec![forked]);
        assert!(
            !out.iter().any(
                |(_, _, f)| matches!(f, Frame::Batch { batch, .. } if batch.epoch == epoch(1))
            ),
            "nothing of the old stream is sent: {out:?}"
        );
        a.send(id(2), b"4")
    };
    let new_epoch = epoch_changed(&a).expect("a new epoch");
    let rolled = a.journaled(|r| matches!(r, JournalRecord::RolledBack { .. }));
    assert!(
        matches!(
            &rolled[..],
            [JournalRecord::RolledBack { from: 2, to: 3, .. }]
        ),
        "{rolled:?}"
    );
    let new = StreamId::direct(id(1), new_epoch, id(2));
    let out = a.outbox_payloads(&new);
    assert_eq!(out, vec![b"2".to_vec(), b"3".to_vec(), b"4".to_vec()]);
    assert_eq!(
        ok_seq(a.reply(req)),
        3,
        "a new send comes after the carried ones"
    );
}

#[test]
fn a_peer_holding_more_of_an_ended_stream_is_journaled_once_and_told() {
    let mut a = sent_three_acked_one();
    let old = stream(1, 1, 2);
    let claim = |seq| Mark {
        stream: old.clone(),
        seq,
        cid: None,
    };
    hello_of_2(&mut a, ConnId(8), vec![claim(5)]);
    a.run(Input::PeerDisconnected {
        peer: id(2),
        conn: ConnId(8),
    });
    // Later, the peer still shows the old stream (it may not have seen the
    // new epoch yet): told again, journaled once per range.
    let out = hello_of_2(&mut a, ConnId(9), vec![claim(5)]);
    assert!(
        out.iter()
            .any(|(_, _, f)| matches!(f, Frame::StreamEnded { held: 1, .. }))
    );
    let out = hello_of_2(&mut a, ConnId(10), vec![claim(7)]);
    assert!(
        out.iter()
            .any(|(_, _, f)| matches!(f, Frame::StreamEnded { .. }))
    );
    let ranges: Vec<(Seq, Seq)> = a
        .journal()
        .into_iter()
        .filter_map(|r| match r {
            JournalRecord::RolledBack { from, to, .. } => Some((from, to)),
            _ => None,
        })
        .collect();
    assert_eq!(ranges, vec![(2, 5), (6, 7)]);
    assert_eq!(a.core.metrics().epoch_switches, 1);
}

#[test]
fn the_author_saying_its_ended_stream_holds_less_than_we_do_is_journaled_as_rolled_back() {
    let (mut b, conn) = receiver();
    b.frame(1, conn, batch(1, 1, 2, 1, &[b"a", b"b", b"c"]));
    // The author's new epoch, then its word on the old stream.
    b.frame(1, conn, hello(1, 4, Vec::new(), card(1, 1)));
    let ended = Frame::StreamEnded {
        stream: stream(1, 1, 2),
        held: 1,
    };
    b.frame(1, conn, ended.clone());
    b.frame(1, conn, ended);
    let j = b.journal();
    let rolled: Vec<_> = j
        .iter()
        .filter(|r| matches!(r, JournalRecord::RolledBack { .. }))
        .collect();
    assert!(
        matches!(
            &rolled[..],
            [JournalRecord::RolledBack { from: 2, to: 3, .. }]
        ),
        "{j:?}"
    );
    assert!(j.contains(&JournalRecord::EpochEnded {
        stream: stream(1, 1, 2),
        last: 3
    }));
    // The author's current stream cannot end this way.
    b.frame(
        1,
        conn,
        Frame::StreamEnded {
            stream: stream(1, 4, 2),
            held: 0,
        },
    );
    assert_eq!(b.core.metrics().dropped.get(DropReason::UnknownStream), 1);
}

#[test]
fn a_crash_between_the_new_epoch_and_its_carry_over_carries_on_after_the_restart() {
    let mut a = sent_three_acked_one();
    let claim = Mark {
        stream: stream(1, 1, 2),
        seq: 5,
        cid: None,
    };
    a.hold_commits = true;
    hello_of_2(&mut a, ConnId(8), vec![claim]);
    a.release_commit();
    let new_epoch = epoch_changed(&a).expect("the new epoch is committed");
    assert_eq!(a.held.len(), 1, "the carry-over's commit is under way");
    // The power goes before the carry-over's commit returns.
    a.restart();
    a.hold_commits = false;
    let req = a.send(id(2), b"4");
    assert_eq!(ok_seq(a.reply(req)), 3, "after what is carried over");
    let new = StreamId::direct(id(1), new_epoch, id(2));
    let out = a.outbox_payloads(&new);
    assert_eq!(out, vec![b"2".to_vec(), b"3".to_vec(), b"4".to_vec()]);
    assert!(
        a.store.ended_own().expect("ended")[0].carried == 3,
        "carried to the end"
    );
}

impl Node {
    /// Opens connection `conn` from `peer` and feeds its Hello carrying `card`.
    fn hello_with_card(&mut self, peer: u8, conn: ConnId, card: mesh_protocol::NodeCard) {
        self.connected(peer, conn);
        self.frame(peer, conn, hello(peer, peer, Vec::new(), card));
    }

    fn stored_card(&self, n: u8) -> Option<mesh_protocol::NodeCard> {
        let cards = self.store.cards().expect("mem store reads");
        cards.into_iter().find(|c| c.node == id(n))
    }

    fn stored_addrs(&self, n: u8) -> Vec<std::net::SocketAddr> {
        let peers = self.store.peers().expect("mem store reads");
        peers
            .into_iter()
            .find(|p| p.node == id(n))
            .map(|p| p.addrs)
            .unwrap_or_default()
    }

    fn dropped(&self, reason: DropReason) -> u64 {
        self.core.metrics().dropped.get(reason)
    }

    fn learned(&self) -> Vec<(NodeId, Vec<std::net::SocketAddr>)> {
        self.other
            .iter()
            .filter_map(|e| match e {
                Effect::PeerAddrs { node, addrs } => Some((*node, addrs.clone())),
                _ => None,
            })
            .collect()
    }
}

/// `card` with its addresses changed after signing.
fn tampered(mut card: mesh_protocol::NodeCard) -> mesh_protocol::NodeCard {
    card.addrs = vec![std::net::SocketAddr::from(([192, 0, 2, 66], 1))];
    card
}

#[test]
fn a_newer_card_in_a_hello_is_committed_and_its_addresses_replace_the_peers() {
    let mut b = Node::new(2, 2, &[1], Config::default());
    b.hello_with_card(1, ConnId(1), card(1, 10));
    assert_eq!(b.stored_card(1), Some(card(1, 10)));
    assert_eq!(b.stored_addrs(1), card(1, 10).addrs);
    assert_eq!(b.learned(), vec![(id(1), card(1, 10).addrs)]);
    assert_eq!(b.core.peer_card(&id(1)), Some(&card(1, 10)));

    // The same card again (every reconnect) writes nothing.
    let persists = b.persists.len();
    b.run(Input::PeerDisconnected {
        peer: id(1),
        conn: ConnId(1),
    });
    b.hello_with_card(1, ConnId(2), card(1, 10));
    assert_eq!(b.persists.len(), persists);
    assert_eq!(b.dropped(DropReason::StaleCard), 0);

    // A newer one replaces it, and survives a restart of the core.
    let newer = NodeCard::sign(
        &key(1),
        NodeName::new("moved").expect("a valid name"),
        vec![std::net::SocketAddr::from(([127, 0, 0, 1], 5001))],
        20,
    )
    .expect("one address");
    b.run(Input::PeerDisconnected {
        peer: id(1),
        conn: ConnId(2),
    });
    b.hello_with_card(1, ConnId(3), newer.clone());
    assert_eq!(b.stored_card(1), Some(newer.clone()));
    assert_eq!(b.stored_addrs(1), newer.addrs);
    b.restart();
    assert_eq!(b.core.peer_card(&id(1)), Some(&newer));
}

#[test]
fn an_older_forged_or_foreign_card_is_dropped_and_counted_and_changes_nothing() {
    let mut b = Node::new(2, 2, &[1, 3], Config::default());
    b.hello_with_card(1, ConnId(1), card(1, 10));
    let persists = b.persists.len();
    let hellos = [
        (ConnId(2), card(1, 9)),            // rolled back
        (ConnId(3), tampered(card(1, 11))), // not signed as it reads
        (ConnId(4), card(3, 12)),           // another node's card
    ];
    for (conn, c) in hellos {
        b.run(Input::PeerDisconnected {
            peer: id(1),
            conn: ConnId(conn.0 - 1),
        });
        b.hello_with_card(1, conn, c);
    }
    assert_eq!(b.dropped(DropReason::StaleCard), 1);
    assert_eq!(b.dropped(DropReason::BadCard), 2);
    assert_eq!(b.persists.len(), persists, "nothing was written");
    assert_eq!(b.stored_card(1), Some(card(1, 10)));
    assert_eq!(b.stored_card(3), None);
    // The Hellos themselves were taken: the connection is live.
    assert!(b.core.peers.peer_epoch(id(1)).is_some());
}

#[test]
fn a_node_that_cannot_reach_a_peer_asks_the_connected_ones_and_dials_the_newer_card() {
    let config = Config::default();
    let mut a = Node::new(1, 1, &[2, 3], config.clone());
    a.hello_with_card(3, ConnId(1), card(3, 1));
    // Peer 2 has never connected: it is asked about once that has lasted
    // `card_ask_ms`.
    let sent = a.run(Input::Timer);
    assert!(
        !sent
            .iter()
            .any(|(_, _, f)| matches!(f, Frame::CardQuery { .. }))
    );
    a.now = a.now.plus(config.card_ask_ms);
    let sent = a.run(Input::Timer);
    let asked: Vec<_> = sent
        .iter()
        .filter(|(_, _, f)| matches!(f, Frame::CardQuery { node } if *node == id(2)))
        .map(|(to, conn, _)| (*to, *conn))
        .collect();
    assert_eq!(asked, vec![(id(3), ConnId(1))]);
    // Not again before the retry.
    let again = a.run(Input::Timer);
    assert!(
        !again
            .iter()
            .any(|(_, _, f)| matches!(f, Frame::CardQuery { .. }))
    );

    a.frame(3, ConnId(1), card_answer(2, card(2, 7)));
    assert_eq!(a.stored_card(2), Some(card(2, 7)));
    assert_eq!(
        a.learned(),
        vec![(id(3), card(3, 1).addrs), (id(2), card(2, 7).addrs)]
    );

    // An answer nobody asked for is dropped, even with a newer card.
    a.frame(3, ConnId(1), card_answer(2, card(2, 8)));
    assert_eq!(a.dropped(DropReason::UnsolicitedCard), 1);
    assert_eq!(a.stored_card(2), Some(card(2, 7)));

    // After the retry it asks again; a forged answer is dropped.
    a.now = a.now.plus(config.card_ask_retry_ms);
    let sent = a.run(Input::Timer);
    assert!(
        sent.iter()
            .any(|(_, _, f)| matches!(f, Frame::CardQuery { node } if *node == id(2)))
    );
    a.frame(3, ConnId(1), card_answer(2, tampered(card(2, 9))));
    assert_eq!(a.dropped(DropReason::BadCard), 1);
    assert_eq!(a.stored_card(2), Some(card(2, 7)));
}

#[test]
fn card_queries_are_answered_with_the_newest_card_held_and_rate_limited() {
    let mut c = Node::new(3, 3, &[1, 2], Config::default());
    c.hello_with_card(2, ConnId(1), card(2, 4));
    c.hello_with_card(1, ConnId(2), card(1, 1));
    let answer = |c: &mut Node, about: NodeId| {
        let sent = c.frame(1, ConnId(2), Frame::CardQuery { node: about });
        sent.into_iter().find_map(|(to, _, f)| match f {
            Frame::CardAnswer { node, card } if to == id(1) && node == about => {
                Some(card.map(|c| *c))
            }
            _ => None,
        })
    };
    assert_eq!(answer(&mut c, id(2)), Some(Some(card(2, 4))));
    assert_eq!(answer(&mut c, id(9)), Some(None));
    let own = c.core.own_card().clone();
    assert_eq!(answer(&mut c, id(3)), Some(Some(own)));
    for _ in 3..CARD_ANSWERS_MAX {
        assert!(answer(&mut c, id(2)).is_some());
    }
    assert_eq!(answer(&mut c, id(2)), None, "past the rate, no answer");
    assert_eq!(c.dropped(DropReason::CardQueryLimited), 1);
    // The next window answers again.
    c.now = c.now.plus(CARD_ANSWER_WINDOW_MS);
    assert!(answer(&mut c, id(2)).is_some());
}

#[test]
fn a_node_issues_its_own_newer_card_commits_it_and_sends_it_in_every_hello() {
    let mut a = Node::new(1, 1, &[2], Config::default());
    let mine = card(1, 50);
    a.run(Input::OwnCard { card: mine.clone() });
    assert_eq!(a.stored_card(1), Some(mine.clone()));
    assert!(a.learned().is_empty(), "its own addresses are not a peer's");
    let sent = a.connected(2, ConnId(1));
    assert!(
        sent.iter()
            .any(|(_, _, f)| matches!(f, Frame::Hello { card, .. } if **card == mine))
    );
    // An older one is ignored; a restart keeps the newest.
    a.run(Input::OwnCard { card: card(1, 40) });
    assert_eq!(a.core.own_card(), &mine);
    a.restart();
    assert_eq!(a.core.own_card(), &mine);
}

#[test]
fn a_newer_card_without_addresses_leaves_the_known_ones() {
    let mut b = Node::new(2, 2, &[1], Config::default());
    b.hello_with_card(1, ConnId(1), card(1, 10));
    let relayed = NodeCard::sign(&key(1), NodeName::new("node-1").expect("name"), vec![], 11)
        .expect("no addresses");
    b.run(Input::PeerDisconnected {
        peer: id(1),
        conn: ConnId(1),
    });
    b.hello_with_card(1, ConnId(2), relayed.clone());
    assert_eq!(b.stored_card(1), Some(relayed));
    assert_eq!(b.stored_addrs(1), card(1, 10).addrs);
    assert_eq!(b.learned().last(), Some(&(id(1), card(1, 10).addrs)));
}

mod agents;
mod mesh;
mod moves;
mod topics;
