//! Topics in the store: membership, and other members' batches held to relay.

use mesh_protocol::{Channel, Epoch, OpenBatch, StreamId, TopicName};

use super::util::*;
use crate::{Eviction, JournalRecord, LossReason, MeshStore, StoreError, TOPICS_MAX, WriteOp};

store_suite!(
    joining_and_leaving_round_trip_and_a_member_of_too_many_topics_is_refused,
    a_members_topic_batch_is_journaled_and_held_to_relay_byte_for_byte,
    a_topic_batch_is_refused_unless_this_node_is_a_member_and_another_node_wrote_it,
    what_is_held_of_a_relayed_stream_is_bounded_and_goes_without_a_loss_record,
    a_gap_in_a_relayed_stream_starts_what_is_held_afresh,
    a_journal_trim_takes_relayed_batches_with_their_rows_but_keeps_the_own_topic_stream,
    the_own_topic_stream_is_an_own_stream_that_a_new_epoch_does_not_end,
    an_earlier_epochs_own_topic_stream_a_member_holds_more_of_is_reported_once_and_kept,
);

fn take(batch: OpenBatch, from: u64, evict: Option<Eviction>) -> WriteOp {
    WriteOp::AcceptTopic { batch, from, evict }
}

#[track_caller]
fn refused(s: &dyn MeshStore, ops: Vec<WriteOp>, why: &str) {
    let err = commit1(s, ops).expect_err(why);
    assert!(matches!(err, StoreError::Conflict(_)), "{why}: {err}");
}

/// The first seqs of the held batches of `stream`.
fn held(s: &dyn MeshStore, stream: &StreamId) -> Vec<u64> {
    outbox(s, stream)
        .iter()
        .map(|b| b.batch.first_seq)
        .collect()
}

fn joining_and_leaving_round_trip_and_a_member_of_too_many_topics_is_refused(s: &dyn MeshStore) {
    assert!(s.topics().expect("topics").is_empty());
    commit1(s, vec![member_of(topic(), 10)]).expect("joins");
    // Joining again changes the bounds.
    commit1(s, vec![member_of(topic(), 20)]).expect("joins again");
    let topics = s.topics().expect("topics");
    assert_eq!(topics.len(), 1);
    assert_eq!((topics[0].name.clone(), topics[0].max_msgs), (topic(), 20));
    refused(s, vec![member_of(topic(), 0)], "a bound of 0 holds nothing");
    commit1(s, vec![WriteOp::LeaveTopic { topic: topic() }]).expect("leaves");
    assert!(s.topics().expect("topics").is_empty());
    refused(
        s,
        vec![WriteOp::LeaveTopic { topic: topic() }],
        "not a member any more",
    );
    // As many as allowed in one group, counted within the group.
    let names: Vec<TopicName> = (0..TOPICS_MAX)
        .map(|i| TopicName::new(&format!("t{i}")).expect("name"))
        .collect();
    commit1(s, names.iter().cloned().map(|n| member_of(n, 1)).collect()).expect("joins all");
    refused(s, vec![member_of(topic(), 1)], "one more than allowed");
    // Leaving one makes room, in the same group.
    commit1(
        s,
        vec![
            WriteOp::LeaveTopic {
                topic: names[0].clone(),
            },
            member_of(topic(), 1),
        ],
    )
    .expect("leaves one, joins another");
    assert_eq!(s.topics().expect("topics").len(), TOPICS_MAX);
}

fn a_members_topic_batch_is_journaled_and_held_to_relay_byte_for_byte(s: &dyn MeshStore) {
    commit1(s, vec![member_of(topic(), 100)]).expect("joins");
    let first = topic_batch(3, 1, 2);
    let signed = first.batch().signed().clone();
    let payloads = first.payloads().to_vec();
    let r = commit1(s, vec![take(first, 1, None)]).expect("accepts");
    assert_eq!(r.arrivals, Some((1, 2)));
    let stream = topic_stream(3);
    assert_eq!(mark(s, &stream), 2);
    let j = journal(s);
    assert!(
        matches!(&j[1].record, JournalRecord::Envelope { stream: st, seq: 2, payload, .. }
            if *st == stream && *payload == payloads[1]),
        "{j:?}"
    );
    let out = outbox(s, &stream);
    assert_eq!(out.len(), 1);
    assert_eq!(
        postcard::to_stdvec(&out[0].batch).expect("encodes"),
        postcard::to_stdvec(&signed).expect("encodes"),
        "held as signed"
    );
    assert_eq!(out[0].payloads, payloads);
    // Another batch of another author in the same commit, and a next one.
    commit1(
        s,
        vec![
            take(topic_batch(3, 3, 1), 3, None),
            take(topic_batch(4, 1, 1), 1, None),
        ],
    )
    .expect("accepts");
    assert_eq!(held(s, &stream), vec![1, 3]);
    assert_eq!(held(s, &topic_stream(4)), vec![1]);
    let row = own_state(s, &stream).expect("a held row");
    assert_eq!(
        (row.first_retained, row.next_seq, row.last_acked, row.msgs),
        (1, 4, 3, 3),
        "all of it may go"
    );
    assert_eq!((row.evictable_msgs, row.evictable_bytes), (3, 48));
    let after = s.read_outbox(&stream, 2, u64::MAX).expect("reads");
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].batch.first_seq, 3);
    // A duplicate is refused by the mark, as for a direct stream.
    refused(s, vec![take(topic_batch(3, 1, 2), 1, None)], "old seqs");
}

fn a_topic_batch_is_refused_unless_this_node_is_a_member_and_another_node_wrote_it(
    s: &dyn MeshStore,
) {
    refused(s, vec![take(topic_batch(3, 1, 1), 1, None)], "not a member");
    commit1(s, vec![member_of(topic(), 100)]).expect("joins");
    refused(
        s,
        vec![take(peer_batch(PEER, 1, 1), 1, None)],
        "a direct stream is no topic's",
    );
    let mine = batch(ME, s.meta().epoch, Channel::Topic(topic()), 1, &[16]);
    refused(
        s,
        vec![take(mine, 1, None)],
        "this store writes its own stream",
    );
    let other = batch(
        3,
        Epoch([3; 16]),
        Channel::Topic(TopicName::new("other").expect("name")),
        1,
        &[16],
    );
    refused(s, vec![take(other, 1, None)], "a topic not joined");
    assert_eq!(s.journal_head().expect("head"), 0, "nothing written");
    assert!(s.own_streams().expect("own").is_empty());
    // Joined and taken in one group; refused again once left.
    commit1(s, vec![take(topic_batch(3, 1, 1), 1, None)]).expect("a member");
    commit1(s, vec![WriteOp::LeaveTopic { topic: topic() }]).expect("leaves");
    refused(s, vec![take(topic_batch(3, 2, 1), 2, None)], "left");
    assert_eq!(held(s, &topic_stream(3)), vec![1], "what was held stays");
}

fn what_is_held_of_a_relayed_stream_is_bounded_and_goes_without_a_loss_record(s: &dyn MeshStore) {
    commit1(s, vec![member_of(topic(), 100)]).expect("joins");
    for first in [1, 3, 5] {
        commit1(s, vec![take(topic_batch(3, first, 2), first, None)]).expect("accepts");
    }
    let evict = Eviction {
        msgs_max: 3,
        bytes_max: 1 << 20,
        loss: Some("would be a loss of an own stream".into()),
    };
    commit1(s, vec![take(topic_batch(3, 7, 2), 7, Some(evict))]).expect("accepts");
    let stream = topic_stream(3);
    assert_eq!(held(s, &stream), vec![5, 7], "down to 2 before the new one");
    let row = own_state(s, &stream).expect("row");
    assert_eq!((row.first_retained, row.next_seq, row.msgs), (5, 9, 4));
    assert!(
        !journal(s)
            .iter()
            .any(|i| matches!(i.record, JournalRecord::Loss { .. })),
        "this node journaled every seq: nothing is lost"
    );
    assert_eq!(mark(s, &stream), 8);
    // Bytes bound too.
    let evict = Eviction {
        msgs_max: u64::MAX,
        bytes_max: 16,
        loss: None,
    };
    commit1(s, vec![take(topic_batch(3, 9, 1), 9, Some(evict))]).expect("accepts");
    assert_eq!(held(s, &stream), vec![9]);
}

fn a_gap_in_a_relayed_stream_starts_what_is_held_afresh(s: &dyn MeshStore) {
    commit1(s, vec![member_of(topic(), 100)]).expect("joins");
    commit1(s, vec![take(topic_batch(3, 1, 2), 1, None)]).expect("accepts");
    let stream = topic_stream(3);
    commit1(
        s,
        vec![WriteOp::Gap {
            stream: stream.clone(),
            earliest_available: 6,
        }],
    )
    .expect("a gap");
    assert!(held(s, &stream).is_empty(), "nothing held follows the gap");
    let row = own_state(s, &stream).expect("row");
    assert_eq!((row.first_retained, row.next_seq, row.msgs), (6, 6, 0));
    // A batch that starts below the gap is held whole, its payloads kept.
    let b = topic_batch(3, 4, 3);
    let payloads = b.payloads().to_vec();
    commit1(s, vec![take(b, 6, None)]).expect("accepts from inside");
    assert_eq!(mark(s, &stream), 6);
    let out = outbox(s, &stream);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].batch.first_seq, out[0].batch.last_seq()), (4, 6));
    assert_eq!(out[0].payloads, payloads);
    let row = own_state(s, &stream).expect("row");
    assert_eq!((row.first_retained, row.next_seq, row.msgs), (4, 7, 3));
    commit1(s, vec![take(topic_batch(3, 7, 1), 7, None)]).expect("follows");
    assert_eq!(held(s, &stream), vec![4, 7]);
}

fn a_journal_trim_takes_relayed_batches_with_their_rows_but_keeps_the_own_topic_stream(
    s: &dyn MeshStore,
) {
    commit1(s, vec![member_of(topic(), 100)]).expect("joins");
    let mine = batch(ME, s.meta().epoch, Channel::Topic(topic()), 1, &[16, 16]);
    let own_payloads = mine.payloads().to_vec();
    let own_id = mine.batch().stream().clone();
    commit1(
        s,
        vec![WriteOp::AppendOwn {
            batch: mine,
            evict: None,
        }],
    )
    .expect("publishes");
    commit1(s, vec![take(topic_batch(3, 1, 2), 1, None)]).expect("accepts");
    commit1(
        s,
        vec![WriteOp::Trim {
            now_ms: 1_000_000,
            bytes_max: 0,
            age_ms_max: 0,
        }],
    )
    .expect("trims");
    assert!(
        held(s, &topic_stream(3)).is_empty(),
        "a relayed batch goes with its rows"
    );
    let out = outbox(s, &own_id);
    assert_eq!(out.len(), 1, "this node's own messages are kept");
    assert_eq!(out[0].payloads, own_payloads);
    // What is still held goes on after the trim.
    commit1(s, vec![take(topic_batch(3, 3, 1), 3, None)]).expect("accepts");
    assert_eq!(held(s, &topic_stream(3)), vec![3]);
}

fn the_own_topic_stream_is_an_own_stream_that_a_new_epoch_does_not_end(s: &dyn MeshStore) {
    commit1(s, vec![member_of(topic(), 2)]).expect("joins");
    let epoch = s.meta().epoch;
    let mine = |first, n: usize| batch(ME, epoch, Channel::Topic(topic()), first, &vec![16; n]);
    let own_id = mine(1, 1).batch().stream().clone();
    commit1(
        s,
        vec![WriteOp::AppendOwn {
            batch: mine(1, 2),
            evict: None,
        }],
    )
    .expect("publishes");
    // The author's bound drops what no member acknowledged: a loss record.
    let evict = Eviction {
        msgs_max: 1,
        bytes_max: 1 << 20,
        loss: Some("topic bound".into()),
    };
    commit1(
        s,
        vec![WriteOp::AppendOwn {
            batch: mine(3, 1),
            evict: Some(evict),
        }],
    )
    .expect("publishes");
    assert!(
        journal(s).iter().any(|i| matches!(
            &i.record,
            JournalRecord::Loss { stream, from: 1, to: 2, reason: LossReason::OutboxEvicted, .. }
                if *stream == own_id
        )),
        "{:?}",
        journal(s)
    );
    commit1(
        s,
        vec![WriteOp::NewEpoch {
            epoch: Epoch([0x55; 16]),
        }],
    )
    .expect("new epoch");
    assert!(
        s.ended_own().expect("ended").is_empty(),
        "no direct stream to end"
    );
    assert_eq!(
        held(s, &own_id),
        vec![3],
        "still relayed to members that lack it"
    );
}

fn an_earlier_epochs_own_topic_stream_a_member_holds_more_of_is_reported_once_and_kept(
    s: &dyn MeshStore,
) {
    commit1(s, vec![member_of(topic(), 10)]).expect("joins");
    let epoch = s.meta().epoch;
    let mine = batch(ME, epoch, Channel::Topic(topic()), 1, &[16; 3]);
    let own_id = mine.batch().stream().clone();
    commit1(
        s,
        vec![WriteOp::AppendOwn {
            batch: mine,
            evict: None,
        }],
    )
    .expect("publishes");
    let report = |world| WriteOp::ReportRolledBack {
        stream: own_id.clone(),
        held: 3,
        world,
        detail: "a member holds more".into(),
    };
    refused(
        s,
        vec![report(5)],
        "the current epoch's stream has not ended",
    );
    commit1(
        s,
        vec![
            WriteOp::NewEpoch {
                epoch: Epoch([0x56; 16]),
            },
            report(5),
        ],
    )
    .expect("reported with the new epoch");
    let rolled = |from, to| JournalRecord::RolledBack {
        stream: own_id.clone(),
        from,
        to,
        detail: "a member holds more".into(),
    };
    let last = |s: &dyn MeshStore| journal(s).last().map(|i| i.record.clone());
    assert_eq!(last(s), Some(rolled(4, 5)));
    let r = commit1(s, vec![report(5)]).expect("again");
    assert_eq!(r.arrivals, None, "the same range is reported once");
    commit1(s, vec![report(6)]).expect("more");
    assert_eq!(last(s), Some(rolled(6, 6)));
    let ended = s.ended_own().expect("ended");
    assert_eq!(ended.len(), 1);
    let e = &ended[0];
    assert_eq!(
        (&e.stream, e.held, e.reported, e.carried),
        (&own_id, 3, 6, 3)
    );
    assert_eq!(
        held(s, &own_id),
        vec![1],
        "still relayed to members that lack it"
    );
}
