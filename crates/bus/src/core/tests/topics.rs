//! Topics through several cores: membership, publishing, relaying along a
//! line, sync by marks after a partition, duplicates and forgeries.

use std::collections::BTreeSet;

use mesh_protocol::TopicName;
use mesh_store::TopicRecord;

use super::mesh::Mesh;
use super::*;

fn topic() -> TopicName {
    TopicName::new("builds").expect("a topic name")
}

/// The request `req` publishing `payload` (of kind 0) to the topic.
fn publish_input(req: ReqId, payload: &[u8]) -> Input {
    Input::Publish {
        topic: topic(),
        msgs: vec![Publication {
            req,
            kind: 0,
            payload: payload.to_vec(),
        }],
    }
}

/// Node `n`'s stream of the topic (its store epoch is `n`).
fn topic_stream(n: u8) -> StreamId {
    StreamId {
        author: id(n),
        epoch: epoch(n),
        channel: Channel::Topic(topic()),
    }
}

impl Mesh {
    /// Node `n`'s clock moves on by a topic announcement period, so it
    /// tells its topics and marks again; what follows is delivered.
    fn announce_a_period_later(&mut self, n: u8) {
        let node = self.node(n);
        node.now = node.now.plus(TOPIC_ANNOUNCE_MS);
        let out = node.run(Input::Timer);
        self.sent_by(n, out);
        self.settle();
    }

    /// Nodes 1 and 2, peers and linked, both members of the topic.
    fn two_members() -> Mesh {
        Mesh::two_members_with(&Config::default())
    }

    /// As [`Mesh::two_members`], each node with `config`.
    fn two_members_with(config: &Config) -> Mesh {
        let mut m = Mesh::with_config(2, &[(1, 2)], config);
        m.join(1, 100);
        m.join(2, 100);
        m.link(1, 2);
        m
    }

    fn join(&mut self, n: u8, max_msgs: u64) {
        let node = self.node(n);
        let req = node.take_req();
        let write = LocalWrite::JoinTopic(TopicRecord {
            name: topic(),
            joined_ms: 1,
            max_msgs,
            max_bytes: 1 << 20,
        });
        let out = node.run(Input::Write { req, write });
        self.sent_by(n, out);
        self.settle();
    }

    fn publish(&mut self, n: u8, payload: &[u8]) -> Result<SendReceipt, SendError> {
        let node = self.node(n);
        let req = node.take_req();
        let out = node.run(publish_input(req, payload));
        let result = node.reply(req).cloned().expect("answered");
        self.sent_by(n, out);
        self.settle();
        result
    }

    /// Node `n` publishes `msgs` (each a kind and a payload) as one batch;
    /// each one's answer.
    fn publish_batch(
        &mut self,
        n: u8,
        msgs: &[(u16, &[u8])],
    ) -> Vec<Result<SendReceipt, SendError>> {
        let node = self.node(n);
        let msgs: Vec<Publication> = msgs
            .iter()
            .map(|(kind, payload)| Publication {
                req: node.take_req(),
                kind: *kind,
                payload: payload.to_vec(),
            })
            .collect();
        let reqs: Vec<ReqId> = msgs.iter().map(|m| m.req).collect();
        let out = node.run(Input::Publish {
            topic: topic(),
            msgs,
        });
        let answers = reqs
            .iter()
            .map(|r| node.reply(*r).cloned().expect("answered"))
            .collect();
        self.sent_by(n, out);
        self.settle();
        answers
    }

    /// Node `n` asks to publish each batch of `batches` (one request each),
    /// without waiting for an answer; the requests of each.
    fn ask_publish(&mut self, n: u8, batches: &[&[&[u8]]]) -> Vec<Vec<ReqId>> {
        let node = self.node(n);
        let mut asked = Vec::new();
        let mut inputs = Vec::new();
        for payloads in batches {
            let msgs: Vec<Publication> = payloads
                .iter()
                .map(|p| Publication {
                    req: node.take_req(),
                    kind: 0,
                    payload: p.to_vec(),
                })
                .collect();
            asked.push(msgs.iter().map(|m| m.req).collect());
            inputs.push(Input::Publish {
                topic: topic(),
                msgs,
            });
        }
        let out = node.run_many(inputs);
        self.sent_by(n, out);
        self.settle();
        asked
    }

    /// Node `n`'s clock moves on by `ms` and its timer fires; what it sends
    /// is delivered.
    fn tick(&mut self, n: u8, ms: u64) {
        let node = self.node(n);
        node.now = node.now.plus(ms);
        let out = node.run(Input::Timer);
        self.sent_by(n, out);
        self.settle();
    }

    /// The payloads of `author`'s topic stream in node `n`'s journal, in order.
    fn got(&mut self, n: u8, author: u8) -> Vec<Vec<u8>> {
        let stream = topic_stream(author);
        let items = self.node(n).received(&stream);
        let seqs: Vec<Seq> = items.iter().map(|(s, _)| *s).collect();
        let want: Vec<Seq> = (1..=seqs.len() as u64).collect();
        assert_eq!(
            seqs, want,
            "node {n} journals author {author}'s seqs once each, in order"
        );
        items.into_iter().map(|(_, p)| p).collect()
    }
}

fn texts(prefix: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .collect()
}

#[test]
fn a_publish_is_refused_unless_this_node_is_a_member() {
    let mut m = Mesh::new(1, &[]);
    let err = m.publish(1, b"hi").expect_err("not a member");
    assert_eq!(err, SendError::NotAMember(topic()));
    m.join(1, 100);
    let r = m.publish(1, b"hi").expect("a member publishes");
    assert_eq!((r.stream.clone(), r.seq), (topic_stream(1), 1));
    assert_eq!(m.got(1, 1), vec![b"hi".to_vec()], "journaled at its author");
}

#[test]
fn a_batch_of_publishes_is_published_whole_in_order_or_refused_whole() {
    let mut m = Mesh::two_members();
    // One bad message refuses the batch: nothing of it is written.
    let answers = m.publish_batch(1, &[(0, b"a"), (3, b"b"), (0, b"c")]);
    assert_eq!(answers, vec![Err(SendError::ReservedKind(3)); 3]);
    assert!(m.got(1, 1).is_empty() && m.got(2, 1).is_empty());
    // A good one: every message, in order, at consecutive seqs.
    let answers = m.publish_batch(1, &[(0, b"a"), (20, b"b"), (0, b"c")]);
    let seqs: Vec<Seq> = answers
        .into_iter()
        .map(|a| a.expect("published").seq)
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    let want = vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()];
    assert_eq!(m.got(1, 1), want);
    assert_eq!(m.got(2, 1), want, "relayed to the other member");
    // A batch larger than the queue's room is refused whole too.
    let big = vec![(0u16, b"x".as_slice()); crate::core::WAITING_SENDS_MAX + 1];
    let answers = m.publish_batch(1, &big);
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Err(SendError::Busy { .. }))),
        "{:?}",
        answers.first()
    );
    assert_eq!(m.got(1, 1).len(), 3);
}

#[test]
fn a_line_relays_every_members_messages_exactly_once_in_order() {
    // 1 — 2 — 3: node 1 and node 3 are not peers.
    let mut m = Mesh::new(3, &[(1, 2), (2, 3)]);
    for n in 1..=3 {
        m.join(n, 100);
    }
    m.link(1, 2);
    m.link(2, 3);
    let from_1 = texts("one-", 5);
    for p in &from_1 {
        m.publish(1, p).expect("published");
    }
    let from_3 = texts("three-", 3);
    for p in &from_3 {
        m.publish(3, p).expect("published");
    }
    for n in [2, 3] {
        assert_eq!(m.got(n, 1), from_1, "node {n}");
    }
    for n in [1, 2] {
        assert_eq!(m.got(n, 3), from_3, "node {n}");
    }
    assert!(m.node(2).core.metrics().topics.batches_relayed >= 8);
    // Nothing came back to its author as a second entry.
    assert_eq!(m.got(1, 1), from_1);
}

#[test]
fn a_member_that_joins_late_or_comes_back_after_a_partition_gets_what_it_lacks_once() {
    let mut m = Mesh::new(3, &[(1, 2), (2, 3)]);
    m.join(1, 100);
    m.join(2, 100);
    m.link(1, 2);
    m.link(2, 3);
    m.publish(1, b"before 3 joined").expect("published");
    // Node 3 joins: node 2 feeds it what it holds of node 1's stream.
    m.join(3, 100);
    assert_eq!(m.got(3, 1), vec![b"before 3 joined".to_vec()]);
    // A partition: node 1 publishes while 2 and 3 cannot hear it.
    m.cut(1, 2);
    let late = texts("late-", 4);
    for p in &late {
        m.publish(1, p).expect("published");
    }
    m.publish(3, b"from 3 meanwhile").expect("published");
    assert_eq!(m.got(3, 1).len(), 1, "not yet");
    m.link(1, 2);
    let mut want = vec![b"before 3 joined".to_vec()];
    want.extend(late.clone());
    for n in [2, 3] {
        assert_eq!(m.got(n, 1), want, "node {n}");
    }
    assert_eq!(m.got(1, 3), vec![b"from 3 meanwhile".to_vec()]);
    // Links cut and made again change nothing: every entry is once.
    m.cut(2, 3);
    m.link(2, 3);
    m.cut(1, 2);
    m.link(1, 2);
    for n in [2, 3] {
        assert_eq!(m.got(n, 1), want, "node {n}");
    }
}

#[test]
fn a_batch_delivered_twice_is_a_counted_duplicate_and_a_forged_one_is_refused() {
    let mut m = Mesh::two_members();
    m.publish(1, b"once").expect("published");
    let conn = m.links[0].2;
    let sent = m.node(1).sent.clone();
    let batch = sent
        .iter()
        .rev()
        .find_map(|(_, _, f)| match f {
            Frame::Batch { batch, payloads } if batch.channel == Channel::Topic(topic()) => {
                Some((batch.clone(), payloads.clone()))
            }
            _ => None,
        })
        .expect("node 1 sent its batch");
    let dups = m.node(2).core.metrics().dropped.get(DropReason::Duplicate);
    m.queue.push_back((
        2,
        1,
        conn,
        Frame::Batch {
            batch: batch.0.clone(),
            payloads: batch.1.clone(),
        },
    ));
    m.settle();
    assert_eq!(
        m.node(2).core.metrics().dropped.get(DropReason::Duplicate),
        dups + 1
    );
    assert_eq!(m.got(2, 1), vec![b"once".to_vec()]);
    // A relay that alters a payload: refused at the edge, counted.
    let mut payloads = batch.1.clone();
    payloads.0[0][0] ^= 1;
    let mut next = batch.0.clone();
    next.first_seq = 2;
    m.queue.push_back((
        2,
        1,
        conn,
        Frame::Batch {
            batch: next,
            payloads,
        },
    ));
    m.settle();
    let dropped = m.node(2).core.metrics().dropped;
    assert_eq!(
        dropped.get(DropReason::BadSignature) + dropped.get(DropReason::CidMismatch),
        1
    );
    assert_eq!(
        m.got(2, 1),
        vec![b"once".to_vec()],
        "nothing forged journaled"
    );
}

#[test]
fn three_members_linked_in_a_triangle_each_journal_every_message_once() {
    let mut m = Mesh::new(3, &[(1, 2), (2, 3), (1, 3)]);
    for n in 1..=3 {
        m.join(n, 100);
    }
    m.link(1, 2);
    m.link(2, 3);
    m.link(1, 3);
    let mut want: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 4];
    for round in 0..4 {
        for author in 1..=3u8 {
            let p = format!("{author}:{round}").into_bytes();
            m.publish(author, &p).expect("published");
            want[usize::from(author)].push(p);
        }
        if round == 1 {
            m.cut(1, 3);
        }
        if round == 2 {
            m.link(1, 3);
        }
    }
    for n in 1..=3 {
        for author in 1..=3u8 {
            assert_eq!(
                m.got(n, author),
                want[usize::from(author)],
                "node {n}, author {author}"
            );
        }
    }
    let dups: u64 = (1..=3)
        .map(|n| m.node(n).core.metrics().dropped.get(DropReason::Duplicate))
        .sum();
    assert!(
        dups > 0,
        "two paths deliver twice, and the second is a duplicate"
    );
}

#[test]
fn an_authors_bound_evicts_with_a_loss_record_and_a_member_behind_it_records_the_gap() {
    let mut m = Mesh::new(2, &[(1, 2)]);
    m.join(1, 2);
    m.join(2, 100);
    for i in 0..5 {
        m.publish(1, format!("m{i}").as_bytes()).expect("published");
    }
    let losses = m
        .node(1)
        .journaled(|r| matches!(r, JournalRecord::Loss { .. }));
    assert!(
        !losses.is_empty(),
        "the author journaled what its bound dropped"
    );
    m.link(1, 2);
    let stream = topic_stream(1);
    let gaps = m
        .node(2)
        .journaled(|r| matches!(r, JournalRecord::Gap { .. }));
    assert_eq!(
        gaps,
        vec![JournalRecord::Gap {
            stream: stream.clone(),
            from: 1,
            to: 3
        }]
    );
    let got: Vec<Seq> = m
        .node(2)
        .received(&stream)
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(got, vec![4, 5], "the rest, after the gap");
}

#[test]
fn leaving_a_topic_stops_what_comes_and_keeps_what_came() {
    let mut m = Mesh::two_members();
    m.publish(1, b"kept").expect("published");
    let node = m.node(2);
    let req = node.take_req();
    let out = node.run(Input::Write {
        req,
        write: LocalWrite::LeaveTopic(topic()),
    });
    m.sent_by(2, out);
    m.settle();
    m.publish(1, b"not taken").expect("published");
    assert_eq!(m.got(2, 1), vec![b"kept".to_vec()]);
    assert!(m.node(2).core.topics().is_empty());
}

/// Node 1 and node 2 share the topic; node 1 publishes `before`, its store
/// is copied, it publishes `after`, and it comes back from the copy. Its
/// next publish goes out on a new epoch's stream from seq 1 and reaches
/// node 2 once; node 2 keeps all it had, once, and both journal the seqs
/// of the old stream the store lost (once, though marks are told again).
fn restored_after(before: &[&[u8]], after: &[&[u8]]) {
    let mut m = Mesh::two_members();
    for p in before {
        m.publish(1, p).expect("published");
    }
    let backup = m.node(1).store.fork();
    for p in after {
        m.publish(1, p).expect("published");
    }
    m.cut(1, 2);
    let node = m.node(1);
    node.store = backup;
    node.restart();
    m.link(1, 2);
    let receipt = m.publish(1, b"on a new stream").expect("published");
    let old = topic_stream(1);
    assert_eq!(
        (receipt.stream.author, &receipt.stream.channel, receipt.seq),
        (id(1), &old.channel, 1)
    );
    assert_ne!(
        receipt.stream.epoch, old.epoch,
        "a stream the member has not seen"
    );
    let all: Vec<Vec<u8>> = before.iter().chain(after).map(|p| p.to_vec()).collect();
    assert_eq!(m.got(2, 1), all, "the member keeps what it had, once");
    let new: Vec<(Seq, Vec<u8>)> = vec![(1, b"on a new stream".to_vec())];
    assert_eq!(m.node(2).received(&receipt.stream), new, "once");
    m.announce_a_period_later(1);
    m.announce_a_period_later(2);
    let (held, world) = (before.len() as Seq, (before.len() + after.len()) as Seq);
    for n in [1, 2] {
        let rolled: Vec<(Seq, Seq)> = m
            .node(n)
            .journaled(|r| matches!(r, JournalRecord::RolledBack { stream, .. } if *stream == old))
            .into_iter()
            .filter_map(|r| match r {
                JournalRecord::RolledBack { from, to, .. } => Some((from, to)),
                _ => None,
            })
            .collect();
        assert_eq!(
            rolled,
            vec![(held + 1, world)],
            "node {n} journals the loss once"
        );
    }
}

#[test]
fn a_node_whose_store_went_back_in_time_publishes_on_a_new_stream_and_says_what_was_lost() {
    restored_after(&[b"a"], &[b"b", b"c"]);
}

#[test]
fn a_node_restored_from_a_backup_taken_before_its_first_publish_moves_on_too() {
    restored_after(&[], &[b"a"]);
}

/// The seqs of the rolled-back records of `stream` node `n` journaled.
fn rolled_back(m: &mut Mesh, n: u8, stream: &StreamId) -> Vec<(Seq, Seq)> {
    m.node(n)
        .journal()
        .into_iter()
        .filter_map(|r| match r {
            JournalRecord::RolledBack {
                stream: s,
                from,
                to,
                ..
            } if s == *stream => Some((from, to)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_member_that_comes_back_after_the_new_epoch_is_told_what_the_restored_store_lost() {
    let mut m = Mesh::new(3, &[(1, 2), (1, 3)]);
    for n in 1..=3 {
        m.join(n, 100);
    }
    m.link(1, 2);
    m.link(1, 3);
    m.publish(1, b"a").expect("published");
    let backup = m.node(1).store.fork();
    m.publish(1, b"b").expect("published");
    m.publish(1, b"c").expect("published");
    m.cut(1, 2);
    m.cut(1, 3);
    let node = m.node(1);
    node.store = backup;
    node.restart();
    m.link(1, 2);
    let receipt = m.publish(1, b"new").expect("published");
    assert_ne!(receipt.stream, topic_stream(1));
    // Node 3 was away: it shows its mark of the ended stream only now.
    m.link(1, 3);
    m.announce_a_period_later(3);
    let old = topic_stream(1);
    assert_eq!(m.got(3, 1), texts_of(&[b"a", b"b", b"c"]));
    assert_eq!(
        m.node(3).received(&receipt.stream),
        vec![(1, b"new".to_vec())]
    );
    for n in [1, 2, 3] {
        assert_eq!(rolled_back(&mut m, n, &old), vec![(2, 3)], "node {n}, once");
    }
}

fn texts_of(ps: &[&[u8]]) -> Vec<Vec<u8>> {
    ps.iter().map(|p| p.to_vec()).collect()
}

#[test]
fn a_batch_that_never_arrived_comes_with_the_next_announcement() {
    let mut m = Mesh::two_members();
    // Node 1 publishes; its batch to node 2 is lost on the way (a relay's
    // failed read, a frame gone with its connection's queue).
    let node = m.node(1);
    let req = node.take_req();
    let out = node.run(publish_input(req, b"lost once"));
    let kept: Vec<_> = out
        .into_iter()
        .filter(|(_, _, f)| !matches!(f, Frame::Batch { .. }))
        .collect();
    m.sent_by(1, kept);
    m.settle();
    assert!(m.got(2, 1).is_empty(), "the batch was lost");
    // A period later node 2 tells its marks again, and node 1 feeds it.
    m.announce_a_period_later(2);
    assert_eq!(m.got(2, 1), vec![b"lost once".to_vec()]);
    // And again: nothing is journaled twice.
    m.announce_a_period_later(1);
    assert_eq!(m.got(2, 1), vec![b"lost once".to_vec()]);
}

/// A signed one-envelope batch of node 1's stream of the topic in the
/// store epoch numbered `n` (many epochs: many author streams).
fn batch_of_epoch(n: u16, first_seq: Seq) -> Frame {
    let mut e = [0u8; 16];
    e[..2].copy_from_slice(&n.to_be_bytes());
    e[15] = 0xee;
    let envelope = NewEnvelope {
        lamport: first_seq,
        created_ms: 0,
        kind: 0,
        payload: format!("epoch {n}").into_bytes(),
    };
    let open = OpenBatch::sign(
        &key(1),
        Epoch(e),
        Channel::Topic(topic()),
        first_seq,
        vec![envelope],
    )
    .expect("a valid batch");
    let (vb, payloads) = open.into_parts();
    Frame::Batch {
        batch: vb.into_signed(),
        payloads: Payloads(payloads),
    }
}

#[test]
fn a_topic_takes_at_most_its_bound_of_author_streams_and_counts_the_rest() {
    let mut m = Mesh::two_members();
    let conn = m.links[0].2;
    let max = TOPIC_STREAMS_MAX as u16;
    for n in 0..=max {
        m.queue.push_back((2, 1, conn, batch_of_epoch(n, 1)));
    }
    m.settle();
    let streams = |m: &mut Mesh| {
        let journal = m.node(2).journal();
        let streams: BTreeSet<StreamId> = journal
            .into_iter()
            .filter_map(|r| match r {
                JournalRecord::Envelope { stream, .. } => Some(stream),
                _ => None,
            })
            .collect();
        streams.len()
    };
    assert_eq!(streams(&mut m), TOPIC_STREAMS_MAX);
    let dropped = |m: &mut Mesh| {
        let d = m.node(2).core.metrics().dropped;
        d.get(DropReason::TopicStreamsFull)
    };
    assert_eq!(dropped(&mut m), 1, "the stream past the bound is counted");
    // A gap of yet another stream is refused too; the streams taken go on.
    let mut gap_stream = topic_stream(1);
    gap_stream.epoch = Epoch([0xab; 16]);
    m.queue.push_back((
        2,
        1,
        conn,
        Frame::ResyncGap {
            stream: gap_stream,
            earliest_available: 5,
        },
    ));
    m.queue.push_back((2, 1, conn, batch_of_epoch(0, 2)));
    m.settle();
    assert_eq!(dropped(&mut m), 2);
    assert_eq!(streams(&mut m), TOPIC_STREAMS_MAX);
    let taken = m.node(2).journal().len();
    assert!(
        m.node(2)
            .journal()
            .iter()
            .all(|r| !matches!(r, JournalRecord::Gap { .. })),
        "no gap of the refused stream: {taken} records"
    );
    let mut first = topic_stream(1);
    first.epoch = match batch_of_epoch(0, 1) {
        Frame::Batch { batch, .. } => batch.epoch,
        _ => unreachable!("a batch"),
    };
    assert_eq!(
        m.node(2).received(&first).len(),
        2,
        "a known stream goes on"
    );
}

/// How many times node `n` answered `req`.
fn answers(m: &mut Mesh, n: u8, req: ReqId) -> usize {
    m.node(n).replies.iter().filter(|(r, _)| *r == req).count()
}

#[test]
fn publishes_are_held_through_a_store_outage_within_the_bounds_sends_share_then_committed_once_in_order()
 {
    let mut m = Mesh::two_members_with(&hold_config(4));
    m.publish(1, b"before").expect("published");
    m.node(1).store.set_unavailable(true);
    let journal = m.node(1).journal().len();
    let held = m.ask_publish(1, &[&[b"one"], &[b"two", b"three"]]);
    let node = m.node(1);
    assert!(node.core.store_down().is_some());
    let send = node.send(id(2), b"a send");
    let held: Vec<ReqId> = held.into_iter().flatten().collect();
    for req in held.iter().chain([&send]) {
        assert!(node.reply(*req).is_none(), "held, unanswered: {req:?}");
    }
    assert!(
        !node.core.must_drain(),
        "a stopping node does not wait for them"
    );
    // Three publishes and a send fill the one budget of four: a publish,
    // a batch and a send past it are refused at once, nothing written.
    let past = m.ask_publish(1, &[&[b"past"], &[b"past-a", b"past-b"]]);
    let node = m.node(1);
    let late_send = node.send(id(2), b"past too");
    for req in past.iter().flatten().chain([&late_send]) {
        match node.reply(*req) {
            Some(Err(SendError::StoreDown { held: 4, why })) => {
                assert!(why.contains("unavailable"), "{why}");
            }
            other => panic!("expected StoreDown with 4 held, got {other:?}"),
        }
    }
    // Retried while the store is still down: still held.
    let retry_ms = node.config.store_retry_ms;
    let held_before = node.core.metrics().sends_held;
    m.tick(1, retry_ms);
    let node = m.node(1);
    assert!(held.iter().all(|r| node.reply(*r).is_none()));
    assert_eq!(node.journal().len(), journal, "nothing journaled meanwhile");
    assert_eq!(
        node.core.metrics().sends_held,
        held_before + 4,
        "tried again and held again"
    );
    // The store is back: each is committed once, in the order asked.
    node.store.set_unavailable(false);
    m.tick(1, retry_ms);
    let node = m.node(1);
    let seqs: Vec<Seq> = held
        .iter()
        .map(|r| {
            node.reply(*r)
                .cloned()
                .expect("answered")
                .expect("published")
                .seq
        })
        .collect();
    assert_eq!(seqs, [2, 3, 4], "seqs given out in publish order");
    assert_eq!(ok_seq(node.reply(send)), 1);
    for req in held.iter().chain(past.iter().flatten()) {
        assert_eq!(answers(&mut m, 1, *req), 1, "answered once: {req:?}");
    }
    let want: Vec<Vec<u8>> = [b"before".as_slice(), b"one", b"two", b"three"]
        .iter()
        .map(|p| p.to_vec())
        .collect();
    assert_eq!(m.got(1, 1), want);
    assert_eq!(m.got(2, 1), want, "the member gets each once, in order");
}

#[test]
fn a_publish_batch_past_the_hold_bounds_is_refused_whole_and_a_held_one_let_go_whole() {
    let mut m = Mesh::two_members_with(&hold_config(2));
    m.node(1).hold_commits = true;
    // "a" goes into a commit; the batch waits for the next, which the
    // bound of sends waiting lets it.
    let asked = m.ask_publish(1, &[&[b"a"], &[b"b", b"c"]]);
    let node = m.node(1);
    node.store.set_unavailable(true);
    node.hold_commits = false;
    let out = node.release_commit();
    m.sent_by(1, out);
    m.settle();
    // Held again: "a" fits the hold bound of two, the batch only with it
    // does not, so the batch is refused whole (the newest go first).
    let node = m.node(1);
    assert!(node.reply(asked[0][0]).is_none(), "held");
    for req in &asked[1] {
        assert!(
            matches!(
                node.reply(*req),
                Some(Err(SendError::StoreDown { held: 1, .. }))
            ),
            "{:?}",
            node.reply(*req)
        );
    }
    // A batch that fits is held whole, and let go whole after the hold.
    node.now = node.now.plus(1);
    let batch = m.ask_publish(1, &[&[b"d"]]).remove(0);
    let node = m.node(1);
    assert!(node.reply(batch[0]).is_none(), "held");
    let hold_ms = node.config.hold_ms;
    m.tick(1, hold_ms - 1);
    let node = m.node(1);
    assert!(
        matches!(node.reply(asked[0][0]), Some(Err(SendError::Held { .. }))),
        "{:?}",
        node.reply(asked[0][0])
    );
    assert!(
        node.reply(batch[0]).is_none(),
        "taken 1 ms later, still held"
    );
    m.tick(1, 1);
    let node = m.node(1);
    assert!(matches!(
        node.reply(batch[0]),
        Some(Err(SendError::Held { .. }))
    ));
    assert_eq!(node.core.metrics().sends_let_go, 2);
    // None of them took a seq: the next publish has the first.
    node.store.set_unavailable(false);
    let retry_ms = node.config.store_retry_ms;
    m.tick(1, retry_ms);
    assert_eq!(m.publish(1, b"after").expect("published").seq, 1);
    assert_eq!(m.got(2, 1), vec![b"after".to_vec()]);
}
