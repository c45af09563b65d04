//! One suite of rules, run against every [`MeshStore`] implementation.

use mesh_protocol::{Channel, Epoch, OpenBatch, StreamId};

use super::util::*;
use crate::{Eviction, JournalRecord, LossReason, MeshStore, PeerRecord, StoreError, WriteOp};

store_suite!(
    an_append_at_the_next_seq_is_stored_journaled_and_read_back_byte_for_byte,
    an_append_that_skips_a_seq_is_refused_and_writes_nothing,
    a_stream_starts_at_seq_1,
    an_append_in_another_epoch_is_refused,
    an_eviction_that_would_drop_unacked_seqs_without_a_loss_record_is_refused,
    an_eviction_takes_the_oldest_whole_batches_until_the_outbox_is_within_it,
    a_lossy_eviction_journals_one_loss_record_for_the_unacked_part,
    an_eviction_counts_payload_bytes,
    acks_count_whole_batches_as_evictable,
    accept_moves_the_mark_and_journals_in_the_same_commit,
    accept_from_inside_a_batch_journals_only_the_new_part,
    an_accept_that_does_not_follow_the_mark_is_refused_and_writes_nothing,
    a_gap_moves_the_mark_and_is_a_journal_entry,
    acks_never_move_backwards_unless_reset,
    one_callers_conflict_does_not_fail_the_others_in_the_group,
    later_groups_see_earlier_groups_of_the_same_commit,
    ops_of_one_group_see_each_other,
    read_outbox_starts_at_the_batch_holding_after_plus_one_and_caps_bytes,
    the_journal_pages_in_arrival_order,
    a_large_commit_of_many_streams_reads_back_entry_by_entry_from_any_position,
    one_send_to_each_of_many_peers_in_one_commit_reads_back_per_peer,
    peers_and_cursors_round_trip,
    a_cursor_must_be_named_and_point_into_the_journal,
    max_lamport_is_the_highest_clock_ever_committed,
    a_loss_record_is_a_journal_entry,
    a_subscriber_lag_is_a_journal_entry_naming_arrivals_already_written,
    cards_round_trip_the_newest_replaces_and_a_removed_peer_loses_its_card,
    invites_round_trip_and_one_with_too_many_uses_or_spends_is_refused,
);

fn receipt_of(s: &dyn MeshStore, ops: Vec<WriteOp>) -> crate::Receipt {
    commit1(s, ops).expect("commit succeeds")
}

fn an_append_at_the_next_seq_is_stored_journaled_and_read_back_byte_for_byte(s: &dyn MeshStore) {
    let b = own(s, PEER, 1, 2, 100);
    let stream = own_stream_id(s, PEER);
    let signed = b.batch().signed().clone();
    let payloads = b.payloads().to_vec();
    let r = append_ok(s, b);
    assert_eq!(r.arrivals, Some((1, 2)));
    let state = own_state(s, &stream).expect("stream exists");
    assert_eq!(r.own_streams, vec![state.clone()]);
    assert_eq!(
        (
            state.next_seq,
            state.first_retained,
            state.last_acked,
            state.msgs,
            state.bytes
        ),
        (3, 1, 0, 2, 200)
    );
    let out = outbox(s, &stream);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].batch, signed);
    assert_eq!(
        postcard::to_stdvec(&out[0].batch).expect("encodes"),
        postcard::to_stdvec(&signed).expect("encodes")
    );
    assert_eq!(out[0].payloads, payloads);
    let j = journal(s);
    assert_eq!(j.len(), 2);
    assert!(matches!(
        &j[1].record,
        JournalRecord::Envelope { seq: 2, lamport: 2, payload, .. } if *payload == payloads[1]
    ));
    assert_eq!(s.journal_head().expect("head"), 2);
}

fn an_append_that_skips_a_seq_is_refused_and_writes_nothing(s: &dyn MeshStore) {
    append_ok(s, own(s, PEER, 1, 1, 10));
    let before = dump(s, &[]).expect("dump");
    assert_conflict(s, vec![append(own(s, PEER, 3, 1, 10))], "seq 2 was skipped");
    assert_eq!(dump(s, &[]).expect("dump"), before);
    // Re-appending an already used seq is refused too.
    assert_conflict(s, vec![append(own(s, PEER, 1, 1, 10))], "seq 1 is taken");
    assert_eq!(dump(s, &[]).expect("dump"), before);
}

fn a_stream_starts_at_seq_1(s: &dyn MeshStore) {
    assert_conflict(
        s,
        vec![append(own(s, PEER, 2, 1, 10))],
        "a new stream starts at 1",
    );
    assert!(s.own_streams().expect("read").is_empty());
    assert_eq!(s.journal_head().expect("head"), 0);
}

fn an_append_in_another_epoch_is_refused(s: &dyn MeshStore) {
    let mut other = s.meta().epoch;
    other.0[0] ^= 0xff;
    let b = batch(ME, other, Channel::Direct(node(PEER)), 1, &[10]);
    assert_conflict(s, vec![append(b)], "own streams carry the store's epoch");
    assert!(s.own_streams().expect("read").is_empty());
}

/// Evict down to `msgs_max` envelopes and `bytes_max` bytes, acknowledged
/// batches only.
fn keep(msgs_max: u64, bytes_max: u64) -> Eviction {
    Eviction {
        msgs_max,
        bytes_max,
        loss: None,
    }
}

/// As [`keep`], unacknowledged batches too, recording their loss.
fn lose(msgs_max: u64, bytes_max: u64) -> Eviction {
    Eviction {
        loss: Some("full".into()),
        ..keep(msgs_max, bytes_max)
    }
}

fn append_evicting(s: &dyn MeshStore, first_seq: u64, n: usize, len: usize, evict: Eviction) {
    receipt_of(
        s,
        vec![WriteOp::AppendOwn {
            batch: own(s, PEER, first_seq, n, len),
            evict: Some(evict),
        }],
    );
}

fn firsts(s: &dyn MeshStore, stream: &StreamId) -> Vec<u64> {
    outbox(s, stream)
        .iter()
        .map(|b| b.batch.first_seq)
        .collect()
}

fn ack(stream: &StreamId, upto: u64, reset: bool) -> WriteOp {
    WriteOp::Acked {
        stream: stream.clone(),
        upto,
        reset,
    }
}

/// Appending `batch` to its own stream, evicting nothing.
fn append(batch: OpenBatch) -> WriteOp {
    WriteOp::AppendOwn { batch, evict: None }
}

/// Commits `ops` as one group and asserts that they are refused as a
/// conflict.
#[track_caller]
fn assert_conflict(s: &dyn MeshStore, ops: Vec<WriteOp>, why: &str) {
    let err = commit1(s, ops).expect_err(why);
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
}

/// Accepting seqs `first..first + n` of `PEER`'s stream, new from `from`.
fn accept(first: u64, n: usize, from: u64) -> WriteOp {
    WriteOp::Accept {
        batch: peer_batch(PEER, first, n),
        from,
    }
}

fn an_eviction_that_would_drop_unacked_seqs_without_a_loss_record_is_refused(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    for seq in 1..=3 {
        append_ok(s, own(s, PEER, seq, 1, 10));
    }
    receipt_of(s, vec![ack(&stream, 1, false)]);
    let before = dump(s, &[]).expect("dump");
    assert_conflict(
        s,
        vec![WriteOp::AppendOwn {
            batch: own(s, PEER, 4, 1, 10),
            evict: Some(keep(1, u64::MAX)),
        }],
        "seq 2 is not acknowledged",
    );
    assert_eq!(dump(s, &[]).expect("dump"), before, "nothing written");
    append_evicting(s, 4, 1, 10, keep(2, u64::MAX));
    assert_eq!(firsts(s, &stream), vec![2, 3, 4]);
}

fn an_eviction_takes_the_oldest_whole_batches_until_the_outbox_is_within_it(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    for seq in 1..=3 {
        append_ok(s, own(s, PEER, seq, 1, 10));
    }
    receipt_of(s, vec![ack(&stream, 2, false)]);
    // Room for exactly what is asked: one batch goes, not both acked ones.
    append_evicting(s, 4, 1, 10, keep(2, u64::MAX));
    assert_eq!(firsts(s, &stream), vec![2, 3, 4]);
    let state = own_state(s, &stream).expect("stream");
    assert_eq!(
        (
            state.first_retained,
            state.msgs,
            state.bytes,
            state.last_acked
        ),
        (2, 3, 30, 2)
    );
    assert_eq!((state.evictable_msgs, state.evictable_bytes), (1, 10));
    let r = receipt_of(
        s,
        vec![WriteOp::AppendOwn {
            batch: own(s, PEER, 5, 1, 10),
            evict: Some(keep(2, u64::MAX)),
        }],
    );
    assert_eq!(firsts(s, &stream), vec![3, 4, 5]);
    let state = own_state(s, &stream).expect("stream");
    assert_eq!(r.own_streams, vec![state.clone()]);
    assert_eq!((state.evictable_msgs, state.evictable_bytes), (0, 0));
    assert!(
        journal(s)
            .iter()
            .all(|i| matches!(i.record, JournalRecord::Envelope { .. })),
        "evicting acknowledged envelopes loses nothing"
    );
    // An eviction with nothing to do is no eviction.
    append_evicting(s, 6, 1, 10, keep(10, u64::MAX));
    assert_eq!(firsts(s, &stream), vec![3, 4, 5, 6]);
}

// Three evictions of one outbox in turn; each starts where the last left it.
fn a_lossy_eviction_journals_one_loss_record_for_the_unacked_part(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 2, 10));
    append_ok(s, own(s, PEER, 3, 2, 10));
    // Seq 1 is acknowledged, seq 2 (same batch) is not.
    receipt_of(s, vec![ack(&stream, 1, false)]);
    let r = receipt_of(
        s,
        vec![WriteOp::AppendOwn {
            batch: own(s, PEER, 5, 2, 10),
            evict: Some(lose(2, u64::MAX)),
        }],
    );
    assert_eq!(
        r.arrivals,
        Some((5, 7)),
        "one loss record, then two envelopes"
    );
    let j = journal(s);
    match &j[4].record {
        JournalRecord::Loss {
            stream: ls,
            from,
            to,
            reason,
            detail,
        } => {
            assert_eq!(
                (ls, *from, *to, *reason, detail.as_str()),
                (&stream, 2, 2, LossReason::OutboxEvicted, "full")
            );
        }
        other => panic!("expected a loss record, got {other:?}"),
    }
    let r = receipt_of(
        s,
        vec![WriteOp::AppendOwn {
            batch: own(s, PEER, 7, 2, 10),
            evict: Some(lose(2, u64::MAX)),
        }],
    );
    assert_eq!(r.arrivals, Some((8, 10)));
    assert!(matches!(
        journal(s)[7].record,
        JournalRecord::Loss {
            from: 3,
            to: 4,
            reason: LossReason::OutboxEvicted,
            ..
        }
    ));
    let state = own_state(s, &stream).expect("stream");
    assert_eq!(
        (
            state.first_retained,
            state.next_seq,
            state.msgs,
            state.bytes
        ),
        (5, 9, 4, 40)
    );
    assert_eq!(firsts(s, &stream), vec![5, 7]);
    // A lossy eviction that finds acknowledged batches enough records nothing.
    receipt_of(s, vec![ack(&stream, 6, false)]);
    let r = receipt_of(
        s,
        vec![WriteOp::AppendOwn {
            batch: own(s, PEER, 9, 1, 10),
            evict: Some(lose(2, u64::MAX)),
        }],
    );
    assert_eq!(r.arrivals, Some((11, 11)), "no loss record");
}

fn an_eviction_counts_payload_bytes(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 1, 100));
    append_ok(s, own(s, PEER, 2, 1, 100));
    assert_conflict(
        s,
        vec![WriteOp::AppendOwn {
            batch: own(s, PEER, 3, 1, 100),
            evict: Some(keep(u64::MAX, 150)),
        }],
        "200 bytes are unacknowledged",
    );
    receipt_of(s, vec![ack(&stream, 1, false)]);
    assert_eq!(
        own_state(s, &stream).map(|o| (o.evictable_msgs, o.evictable_bytes)),
        Some((1, 100))
    );
    append_evicting(s, 3, 1, 100, keep(u64::MAX, 150));
    let state = own_state(s, &stream).expect("stream");
    assert_eq!((state.first_retained, state.bytes), (2, 200));
}

fn acks_count_whole_batches_as_evictable(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 3, 10));
    append_ok(s, own(s, PEER, 4, 2, 20));
    append_ok(s, own(s, PEER, 6, 1, 30));
    let evictable = |s: &dyn MeshStore| {
        own_state(s, &stream).map(|o| (o.last_acked, o.evictable_msgs, o.evictable_bytes))
    };
    for (upto, reset, want) in [
        (2, false, (2, 0, 0)),
        (3, false, (3, 3, 30)),
        (1, false, (3, 3, 30)),
        (5, false, (5, 5, 70)),
        (6, false, (6, 6, 100)),
        (4, true, (4, 3, 30)),
        (0, true, (0, 0, 0)),
        (5, false, (5, 5, 70)),
    ] {
        receipt_of(s, vec![ack(&stream, upto, reset)]);
        assert_eq!(evictable(s), Some(want), "after an ack of {upto}");
    }
    // Evicting acknowledged batches takes them from the evictable part.
    append_evicting(s, 7, 1, 10, keep(3, u64::MAX));
    assert_eq!(evictable(s), Some((5, 2, 40)));
    assert_eq!(firsts(s, &stream), vec![4, 6, 7]);
}

fn accept_moves_the_mark_and_journals_in_the_same_commit(s: &dyn MeshStore) {
    let stream = peer_stream(PEER);
    let b = peer_batch(PEER, 1, 3);
    let payloads = b.payloads().to_vec();
    let r = receipt_of(s, vec![WriteOp::Accept { batch: b, from: 1 }]);
    assert_eq!(r.arrivals, Some((1, 3)));
    assert!(r.own_streams.is_empty());
    assert_eq!(mark(s, &stream), 3);
    let j = journal(s);
    assert_eq!(j.len(), 3);
    for (i, item) in j.iter().enumerate() {
        match &item.record {
            JournalRecord::Envelope {
                stream: st,
                seq,
                payload,
                ..
            } => {
                assert_eq!((st, *seq, payload), (&stream, i as u64 + 1, &payloads[i]));
            }
            other => panic!("expected an envelope, got {other:?}"),
        }
    }
}

fn accept_from_inside_a_batch_journals_only_the_new_part(s: &dyn MeshStore) {
    let stream = peer_stream(PEER);
    receipt_of(s, vec![accept(1, 2, 1)]);
    let r = receipt_of(s, vec![accept(1, 4, 3)]);
    assert_eq!(r.arrivals, Some((3, 4)));
    assert_eq!(mark(s, &stream), 4);
    let seqs: Vec<_> = journal(s)
        .iter()
        .map(|i| match i.record {
            JournalRecord::Envelope { seq, .. } => seq,
            _ => 0,
        })
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
}

fn an_accept_that_does_not_follow_the_mark_is_refused_and_writes_nothing(s: &dyn MeshStore) {
    let stream = peer_stream(PEER);
    for (first, n, from) in [(1, 2, 2), (2, 2, 2), (1, 2, 3), (1, 2, 0)] {
        assert_conflict(s, vec![accept(first, n, from)], "does not follow mark 0");
    }
    receipt_of(s, vec![accept(1, 2, 1)]);
    // A duplicate of what is already committed.
    assert_conflict(s, vec![accept(1, 2, 1)], "already committed");
    assert_eq!(mark(s, &stream), 2);
    assert_eq!(s.journal_head().expect("head"), 2);
}

fn a_gap_moves_the_mark_and_is_a_journal_entry(s: &dyn MeshStore) {
    let stream = peer_stream(PEER);
    receipt_of(s, vec![accept(1, 1, 1)]);
    let r = receipt_of(
        s,
        vec![WriteOp::Gap {
            stream: stream.clone(),
            earliest_available: 5,
        }],
    );
    assert_eq!(r.arrivals, Some((2, 2)));
    assert_eq!(mark(s, &stream), 4);
    assert!(matches!(&journal(s)[1].record,
        JournalRecord::Gap { stream: g, from: 2, to: 4 } if *g == stream));
    for earliest in [5, 4, 0] {
        assert_conflict(
            s,
            vec![WriteOp::Gap {
                stream: stream.clone(),
                earliest_available: earliest,
            }],
            "nothing is missing",
        );
    }
    receipt_of(s, vec![accept(5, 1, 5)]);
    assert_eq!(mark(s, &stream), 5);
    assert_eq!(s.journal_head().expect("head"), 3);
}

fn acks_never_move_backwards_unless_reset(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 5, 10));
    let r = receipt_of(s, vec![ack(&stream, 3, false)]);
    assert_eq!(r.own_streams.len(), 1);
    assert_eq!(r.own_streams[0].last_acked, 3);
    let r = receipt_of(s, vec![ack(&stream, 1, false)]);
    assert!(r.own_streams.is_empty(), "a stale ack changes nothing");
    assert_eq!(own_state(s, &stream).expect("stream").last_acked, 3);
    receipt_of(s, vec![ack(&stream, 0, true)]);
    assert_eq!(own_state(s, &stream).expect("stream").last_acked, 0);
    assert_conflict(s, vec![ack(&stream, 6, false)], "only 5 were sent");
    assert_conflict(
        s,
        vec![WriteOp::Acked {
            stream: own_stream_id(s, 7),
            upto: 1,
            reset: false,
        }],
        "unknown stream",
    );
    assert_eq!(own_state(s, &stream).expect("stream").last_acked, 0);
}

fn one_callers_conflict_does_not_fail_the_others_in_the_group(s: &dyn MeshStore) {
    let a = own_stream_id(s, PEER);
    let b = own_stream_id(s, 3);
    let results = s.commit(vec![
        vec![append(own(s, PEER, 1, 1, 10))],
        // Valid first op, invalid second: the whole group must leave no trace.
        vec![
            append(own(s, 3, 1, 1, 10)),
            WriteOp::PutPeer(PeerRecord {
                node: node(3),
                addrs: vec![],
                epoch: None,
            }),
            WriteOp::Accept {
                batch: peer_batch(4, 2, 1),
                from: 2,
            },
        ],
        vec![accept(1, 1, 1)],
    ]);
    assert_eq!(results.len(), 3);
    assert_eq!(
        results[0].as_ref().expect("first commits").arrivals,
        Some((1, 1))
    );
    assert!(
        matches!(results[1], Err(StoreError::Conflict(_))),
        "{:?}",
        results[1]
    );
    assert_eq!(
        results[2].as_ref().expect("third commits").arrivals,
        Some((2, 2)),
        "the refused group took no arrival positions"
    );
    assert!(own_state(s, &a).is_some());
    assert!(own_state(s, &b).is_none());
    assert!(outbox(s, &b).is_empty());
    assert!(s.peers().expect("peers").is_empty());
    assert_eq!(mark(s, &peer_stream(4)), 0);
    assert_eq!(mark(s, &peer_stream(PEER)), 1);
    assert_eq!(s.journal_head().expect("head"), 2);
}

fn later_groups_see_earlier_groups_of_the_same_commit(s: &dyn MeshStore) {
    let results = s.commit(vec![
        vec![append(own(s, PEER, 1, 1, 10))],
        vec![append(own(s, PEER, 2, 1, 10))],
        vec![accept(1, 1, 1)],
        vec![accept(2, 1, 2)],
    ]);
    let arrivals: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("commits").arrivals)
        .collect();
    assert_eq!(
        arrivals,
        vec![Some((1, 1)), Some((2, 2)), Some((3, 3)), Some((4, 4))]
    );
    assert_eq!(
        own_state(s, &own_stream_id(s, PEER))
            .expect("stream")
            .next_seq,
        3
    );
    assert_eq!(mark(s, &peer_stream(PEER)), 2);
}

fn ops_of_one_group_see_each_other(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    let r = receipt_of(
        s,
        vec![
            append(own(s, PEER, 1, 1, 10)),
            append(own(s, PEER, 2, 1, 10)),
            ack(&stream, 1, false),
            // Lossless only because of the ack two ops earlier.
            WriteOp::AppendOwn {
                batch: own(s, PEER, 3, 1, 10),
                evict: Some(keep(1, u64::MAX)),
            },
            accept(1, 1, 1),
            accept(2, 2, 2),
        ],
    );
    assert_eq!(r.arrivals, Some((1, 6)));
    let state = own_state(s, &stream).expect("stream");
    assert_eq!(
        r.own_streams,
        vec![state.clone()],
        "one final state per stream"
    );
    assert_eq!(
        (
            state.first_retained,
            state.next_seq,
            state.last_acked,
            state.msgs
        ),
        (2, 4, 1, 2)
    );
    let firsts: Vec<_> = outbox(s, &stream)
        .iter()
        .map(|b| b.batch.first_seq)
        .collect();
    assert_eq!(firsts, vec![2, 3]);
    assert_eq!(mark(s, &peer_stream(PEER)), 3);
}

fn read_outbox_starts_at_the_batch_holding_after_plus_one_and_caps_bytes(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 3, 10)); // 1..=3, 30 bytes
    append_ok(s, own(s, PEER, 4, 2, 10)); // 4..=5, 20 bytes
    append_ok(s, own(s, PEER, 6, 1, 10)); // 6, 10 bytes
    append_ok(s, own(s, 3, 1, 1, 10)); // another stream, must never show up
    let firsts = |after, max| -> Vec<u64> {
        s.read_outbox(&stream, after, max)
            .expect("read")
            .iter()
            .map(|b| b.batch.first_seq)
            .collect()
    };
    assert_eq!(firsts(0, u64::MAX), vec![1, 4, 6]);
    assert_eq!(
        firsts(2, u64::MAX),
        vec![1, 4, 6],
        "the batch holding seq 3 is sent whole"
    );
    assert_eq!(firsts(3, u64::MAX), vec![4, 6]);
    assert_eq!(firsts(4, u64::MAX), vec![4, 6]);
    assert_eq!(firsts(5, u64::MAX), vec![6]);
    assert_eq!(firsts(6, u64::MAX), Vec::<u64>::new());
    assert_eq!(firsts(u64::MAX, u64::MAX), Vec::<u64>::new());
    assert_eq!(
        firsts(0, 1),
        vec![1],
        "the first batch comes whatever its size"
    );
    assert_eq!(firsts(0, 50), vec![1, 4]);
    assert_eq!(firsts(0, 49), vec![1]);
    assert!(
        s.read_outbox(&own_stream_id(s, 9), 0, u64::MAX)
            .expect("read")
            .is_empty()
    );
}

fn the_journal_pages_in_arrival_order(s: &dyn MeshStore) {
    receipt_of(s, vec![accept(1, 3, 1)]);
    append_ok(s, own(s, PEER, 1, 2, 10));
    let arrivals = |after, limit| -> Vec<u64> {
        s.journal(after, limit)
            .expect("read")
            .iter()
            .map(|i| i.arrival)
            .collect()
    };
    assert_eq!(arrivals(0, 100), vec![1, 2, 3, 4, 5]);
    assert_eq!(arrivals(2, 2), vec![3, 4]);
    assert_eq!(arrivals(5, 10), Vec::<u64>::new());
    assert_eq!(arrivals(u64::MAX, 10), Vec::<u64>::new());
    assert_eq!(arrivals(0, 0), Vec::<u64>::new());
    assert_eq!(s.journal_head().expect("head"), 5);
}

fn a_large_commit_of_many_streams_reads_back_entry_by_entry_from_any_position(s: &dyn MeshStore) {
    let big = |author: u8, first_seq, sizes: &[usize]| {
        batch(
            author,
            Epoch([author; 16]),
            Channel::Direct(node(ME)),
            first_seq,
            sizes,
        )
    };
    // Runs longer than a journal row, a gap between runs of one stream, an
    // envelope larger than a row, and the store's own sends, in one commit.
    let groups = vec![
        vec![WriteOp::Accept {
            batch: big(PEER, 1, &[1024; 12]),
            from: 1,
        }],
        vec![WriteOp::Accept {
            batch: big(PEER, 13, &[1024; 12]),
            from: 15,
        }],
        vec![WriteOp::Gap {
            stream: peer_stream(3),
            earliest_available: 5,
        }],
        vec![WriteOp::Accept {
            batch: big(PEER, 13, &[1024; 12]),
            from: 13,
        }],
        vec![WriteOp::Accept {
            batch: big(4, 1, &[10, 40_000, 10, 0]),
            from: 1,
        }],
        vec![append(own(s, PEER, 1, 9, 3000))],
    ];
    let results = s.commit(groups);
    assert!(results[1].is_err(), "an accept past the mark is refused");
    assert!(results.iter().enumerate().all(|(i, r)| i == 1 || r.is_ok()));
    let all = s.journal(0, usize::MAX).expect("read");
    // (stream, seq, payload length, author) of each entry; a gap's seq is 0.
    let mut want: Vec<(StreamId, u64, usize, u8)> = Vec::new();
    want.extend((1..=12).map(|q| (peer_stream(PEER), q, 1024, PEER)));
    want.push((peer_stream(3), 0, 0, 3));
    want.extend((13..=24).map(|q| (peer_stream(PEER), q, 1024, PEER)));
    let other = StreamId::direct(node(4), Epoch([4; 16]), node(ME));
    want.extend([(1, 10), (2, 40_000), (3, 10), (4, 0)].map(|(q, l)| (other.clone(), q, l, 4)));
    want.extend((1..=9).map(|q| (own_stream_id(s, PEER), q, 3000, ME)));
    assert_eq!(all.len(), want.len());
    for (i, (item, (stream, seq, len, author))) in all.iter().zip(&want).enumerate() {
        assert_eq!(item.arrival, i as u64 + 1);
        match &item.record {
            JournalRecord::Envelope {
                stream: st,
                seq: q,
                payload: p,
                lamport,
                ..
            } => {
                assert_eq!((st, q, lamport), (stream, seq, seq));
                assert!(
                    *p == payload(*seq, *author, *len),
                    "payload of arrival {}",
                    i + 1
                );
            }
            JournalRecord::Gap {
                stream: st,
                from,
                to,
            } => {
                assert_eq!((st, from, to), (stream, &1, &4));
            }
            other => panic!("unexpected record {other:?}"),
        }
    }
    assert_eq!(s.journal_head().expect("head"), all.len() as u64);
    // The own batch spans journal rows; the outbox gives it back whole.
    let sent = outbox(s, &own_stream_id(s, PEER));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].batch, *own(s, PEER, 1, 9, 3000).batch().signed());
    let payloads: Vec<_> = (1..=9).map(|q| payload(q, ME, 3000)).collect();
    assert!(sent[0].payloads == payloads);
    for after in 0..=all.len() {
        for limit in [1, 2, 7, 100] {
            let got = s.journal(after as u64, limit).expect("read");
            let end = (after + limit).min(all.len());
            assert_eq!(got, all[after..end], "after {after}, limit {limit}");
        }
    }
}

fn one_send_to_each_of_many_peers_in_one_commit_reads_back_per_peer(s: &dyn MeshStore) {
    // Enough one-envelope sends to fill several journal rows, twice.
    let peers: Vec<u8> = (10..60).collect();
    for round in 0..2u64 {
        let groups = peers
            .iter()
            .map(|&to| vec![append(own(s, to, round + 1, 1, 700 + usize::from(to)))])
            .collect();
        assert!(s.commit(groups).iter().all(Result::is_ok));
    }
    for &to in &peers {
        let sent = outbox(s, &own_stream_id(s, to));
        assert_eq!(sent.len(), 2, "peer {to}");
        for (b, seq) in sent.iter().zip(1..) {
            assert_eq!(b.batch.first_seq, seq);
            assert!(b.payloads == vec![payload(seq, ME, 700 + usize::from(to))]);
        }
    }
    let all = s.journal(0, usize::MAX).expect("read");
    assert_eq!(all.len(), 2 * peers.len());
    for (i, item) in all.iter().enumerate() {
        let to = peers[i % peers.len()];
        let seq = 1 + (i / peers.len()) as u64;
        assert_eq!(item.arrival, i as u64 + 1);
        match &item.record {
            JournalRecord::Envelope {
                stream,
                seq: q,
                payload: p,
                ..
            } => {
                assert_eq!((stream, *q), (&own_stream_id(s, to), seq));
                assert!(*p == payload(seq, ME, 700 + usize::from(to)));
            }
            other => panic!("unexpected record {other:?}"),
        }
    }
    for after in 0..=all.len() {
        let got = s.journal(after as u64, 3).expect("read");
        assert_eq!(got, all[after..(after + 3).min(all.len())], "after {after}");
    }
}

fn peers_and_cursors_round_trip(s: &dyn MeshStore) {
    let addr = "127.0.0.1:4433".parse().expect("addr");
    let p = PeerRecord {
        node: node(PEER),
        addrs: vec![addr],
        epoch: None,
    };
    let q = PeerRecord {
        node: node(3),
        addrs: vec![],
        epoch: Some(Epoch([3; 16])),
    };
    receipt_of(
        s,
        vec![WriteOp::PutPeer(p.clone()), WriteOp::PutPeer(q.clone())],
    );
    let mut peers = s.peers().expect("peers");
    peers.sort_by_key(|p| *p.node.as_bytes());
    let mut want = vec![p.clone(), q.clone()];
    want.sort_by_key(|p| *p.node.as_bytes());
    assert_eq!(peers, want);
    let p2 = PeerRecord {
        epoch: Some(Epoch([2; 16])),
        ..p
    };
    receipt_of(
        s,
        vec![WriteOp::PutPeer(p2.clone()), WriteOp::RemovePeer(node(3))],
    );
    assert_eq!(s.peers().expect("peers"), vec![p2]);
    append_ok(s, own(s, PEER, 1, 2, 10));
    assert_eq!(s.cursor("mcp").expect("cursor"), None);
    receipt_of(
        s,
        vec![WriteOp::PutCursor {
            name: "mcp".into(),
            arrival: 2,
        }],
    );
    assert_eq!(s.cursor("mcp").expect("cursor"), Some(2));
    receipt_of(
        s,
        vec![WriteOp::PutCursor {
            name: "mcp".into(),
            arrival: 1,
        }],
    );
    assert_eq!(s.cursor("mcp").expect("cursor"), Some(1));
}

fn a_cursor_must_be_named_and_point_into_the_journal(s: &dyn MeshStore) {
    append_ok(s, own(s, PEER, 1, 1, 10));
    for (name, arrival) in [
        (String::new(), 1),
        ("x".repeat(65), 1),
        ("ok".to_string(), 2),
    ] {
        assert_conflict(
            s,
            vec![WriteOp::PutCursor {
                name: name.clone(),
                arrival,
            }],
            "bad cursor",
        );
        assert_eq!(s.cursor(&name).expect("cursor"), None);
    }
    receipt_of(
        s,
        vec![WriteOp::PutCursor {
            name: "x".repeat(64),
            arrival: 1,
        }],
    );
}

fn max_lamport_is_the_highest_clock_ever_committed(s: &dyn MeshStore) {
    assert_eq!(s.max_lamport().expect("lamport"), 0);
    receipt_of(s, vec![accept(1, 7, 1)]);
    assert_eq!(s.max_lamport().expect("lamport"), 7);
    append_ok(s, own(s, PEER, 1, 2, 10));
    assert_eq!(
        s.max_lamport().expect("lamport"),
        7,
        "lamports 1 and 2 are lower"
    );
    // A refused group does not move it.
    let _ = s.commit(vec![vec![
        WriteOp::Accept {
            batch: peer_batch(3, 1, 20),
            from: 1,
        },
        WriteOp::Gap {
            stream: peer_stream(3),
            earliest_available: 1,
        },
    ]]);
    assert_eq!(s.max_lamport().expect("lamport"), 7);
    receipt_of(
        s,
        vec![WriteOp::Accept {
            batch: peer_batch(3, 1, 20),
            from: 1,
        }],
    );
    assert_eq!(s.max_lamport().expect("lamport"), 20);
}

fn a_loss_record_is_a_journal_entry(s: &dyn MeshStore) {
    let stream = peer_stream(PEER);
    let r = receipt_of(
        s,
        vec![WriteOp::RecordLoss {
            stream: stream.clone(),
            from: 3,
            to: 9,
            reason: LossReason::SubscriberLagged,
            detail: "subscriber 'planner' lagged".into(),
        }],
    );
    assert_eq!(r.arrivals, Some((1, 1)));
    assert!(matches!(
        &journal(s)[0].record,
        JournalRecord::Loss {
            from: 3,
            to: 9,
            reason: LossReason::SubscriberLagged,
            ..
        }
    ));
    assert_conflict(
        s,
        vec![WriteOp::RecordLoss {
            stream,
            from: 9,
            to: 3,
            reason: LossReason::SubscriberLagged,
            detail: String::new(),
        }],
        "empty range",
    );
    assert_eq!(s.journal_head().expect("head"), 1);
}

fn a_subscriber_lag_is_a_journal_entry_naming_arrivals_already_written(s: &dyn MeshStore) {
    append_ok(s, own(s, PEER, 1, 3, 10));
    let lag = |subscriber: &str, from, to| WriteOp::RecordLag {
        subscriber: subscriber.into(),
        from,
        to,
    };
    let r = receipt_of(s, vec![lag("subscriber 7 (uid 1000)", 2, 3)]);
    assert_eq!(r.arrivals, Some((4, 4)));
    assert_eq!(
        journal(s)[3].record,
        JournalRecord::SubscriberLagged {
            subscriber: "subscriber 7 (uid 1000)".into(),
            from: 2,
            to: 3,
        }
    );
    // The record itself may be named by a later one.
    receipt_of(s, vec![lag("again", 4, 4)]);
    let long = "x".repeat(crate::SUBSCRIBER_NAME_BYTES_MAX + 1);
    for bad in [
        lag("s", 0, 1),
        lag("s", 3, 2),
        lag("s", 1, 6),
        lag("", 1, 1),
        lag(&long, 1, 1),
    ] {
        let err = commit1(s, vec![bad.clone()]).expect_err("refused");
        assert!(matches!(err, StoreError::Conflict(_)), "{bad:?}: {err}");
    }
    assert_eq!(s.journal_head().expect("head"), 5);
    // Within one group, an entry written earlier may be named.
    let r = receipt_of(s, vec![append(own(s, PEER, 4, 1, 10)), lag("s", 6, 6)]);
    assert_eq!(r.arrivals, Some((6, 7)));
}

pub(super) fn card(n: u8, issued_ms: u64) -> mesh_protocol::NodeCard {
    let name = mesh_protocol::NodeName::new(&format!("node-{n}")).expect("name");
    let addrs = vec![std::net::SocketAddr::from((
        [127, 0, 0, 1],
        4000 + u16::from(n),
    ))];
    mesh_protocol::NodeCard::sign(&key(n), name, addrs, issued_ms).expect("card")
}

fn cards_round_trip_the_newest_replaces_and_a_removed_peer_loses_its_card(s: &dyn MeshStore) {
    assert_eq!(s.cards().expect("cards"), vec![]);
    let peer = PeerRecord {
        node: node(PEER),
        addrs: vec![],
        epoch: None,
    };
    receipt_of(
        s,
        vec![
            WriteOp::PutPeer(peer),
            WriteOp::PutCard(card(PEER, 1)),
            WriteOp::PutCard(card(3, 1)),
        ],
    );
    let by_node = |s: &dyn MeshStore| {
        let mut c = s.cards().expect("cards");
        c.sort_by_key(|c| *c.node.as_bytes());
        c
    };
    let mut want = vec![card(PEER, 1), card(3, 1)];
    want.sort_by_key(|c| *c.node.as_bytes());
    assert_eq!(by_node(s), want);
    receipt_of(s, vec![WriteOp::PutCard(card(PEER, 2))]);
    assert!(by_node(s).contains(&card(PEER, 2)));
    assert!(!by_node(s).contains(&card(PEER, 1)));
    receipt_of(s, vec![WriteOp::RemovePeer(node(PEER))]);
    assert_eq!(by_node(s), vec![card(3, 1)]);
}

fn invite(uses: u32, spent: usize) -> crate::InviteRecord {
    crate::InviteRecord {
        id: mesh_protocol::InviteId([uses as u8; 8]),
        secret_hash: [7; 32],
        uses,
        created_ms: 10,
        expires_ms: 20,
        claimed_by: None,
        claimed_until_ms: 0,
        claimed_request: None,
        spent: (0..spent)
            .map(|i| crate::InviteSpend {
                by: node(i as u8 + 10),
                requests: vec![mesh_protocol::RequestId([i as u8; 16])],
                until_ms: 30,
            })
            .collect(),
        revoked: false,
    }
}

fn invites_round_trip_and_one_with_too_many_uses_or_spends_is_refused(s: &dyn MeshStore) {
    let a = invite(1, 0);
    let b = invite(3, 2);
    receipt_of(
        s,
        vec![WriteOp::PutInvite(a.clone()), WriteOp::PutInvite(b.clone())],
    );
    assert_eq!(s.invite(&a.id).expect("invite"), Some(a.clone()));
    assert_eq!(
        s.invite(&mesh_protocol::InviteId([0; 8])).expect("invite"),
        None
    );
    let spent = crate::InviteRecord {
        claimed_by: Some(node(5)),
        spent: invite(1, 1).spent,
        ..a.clone()
    };
    assert_eq!(spent.uses_left(), 0);
    receipt_of(s, vec![WriteOp::PutInvite(spent.clone())]);
    assert_eq!(s.invites().expect("invites"), vec![spent, b]);
    for bad in [
        invite(0, 0),
        invite(crate::INVITE_USES_MAX + 1, 0),
        invite(2, 3),
    ] {
        let e = commit1(s, vec![WriteOp::PutInvite(bad)]).expect_err("refused");
        assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    }
    assert_eq!(s.invites().expect("invites").len(), 2);
}
