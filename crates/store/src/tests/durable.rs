//! The rules of schema 4, run against every [`MeshStore`] implementation:
//! journal retention, the mark's payload hash, new epochs and carrying
//! over, and the records of lost sends, ended epochs and conflicts.

use mesh_protocol::{Channel, Cid, Epoch, StreamId};

use super::util::*;
use crate::{JournalRecord, MeshStore, StoreError, WriteOp};

store_suite!(
    a_trim_over_the_byte_bound_takes_the_oldest_rows_and_a_read_from_before_gets_a_trimmed_entry,
    a_trim_of_everything_keeps_the_arrivals_going_on,
    a_trim_evicts_acknowledged_own_batches_and_keeps_the_payloads_of_unacknowledged_ones,
    a_trim_by_age_takes_rows_dated_before_the_bound_and_says_when_the_next_is_due,
    a_trim_takes_a_bounded_number_of_rows_and_says_there_is_more,
    a_mark_keeps_the_payload_hash_of_its_envelope_and_a_gap_forgets_it,
    a_new_epoch_ends_the_own_streams_and_takes_appends_in_the_new_one,
    a_rollback_is_reported_once_per_range_the_world_saw,
    a_carry_over_appends_without_journaling_and_drops_the_ended_outbox_at_its_end,
    an_ended_stream_with_nothing_left_to_carry_is_dropped,
    lost_sends_ended_epochs_and_conflicts_are_journal_entries,
    a_journal_page_stops_after_the_entry_that_crosses_its_byte_bound,
);

fn trim(bytes_max: u64) -> WriteOp {
    WriteOp::Trim {
        now_ms: 1_000_000,
        bytes_max,
        age_ms_max: 0,
    }
}

/// Accepts `n` batches of peer `PEER` of `per` envelopes each, one commit each.
fn accept_many(s: &dyn MeshStore, n: u64, per: usize) {
    let mark0 = mark(s, &peer_stream(PEER));
    for i in 0..n {
        let first = mark0 + 1 + i * per as u64;
        commit1(
            s,
            vec![WriteOp::Accept {
                batch: peer_batch(PEER, first, per),
                from: first,
            }],
        )
        .expect("accepted");
    }
}

fn a_trim_over_the_byte_bound_takes_the_oldest_rows_and_a_read_from_before_gets_a_trimmed_entry(
    s: &dyn MeshStore,
) {
    accept_many(s, 20, 4);
    let before = s.journal_bounds().expect("bounds");
    assert_eq!((before.first, before.head), (1, 80));
    let bound = before.bytes / 2;
    let r = commit1(s, vec![trim(bound)]).expect("trims");
    let report = r.trim.expect("a trim report");
    let after = s.journal_bounds().expect("bounds");
    assert_eq!(report.bounds, after);
    assert!(!report.more);
    assert!(after.bytes <= bound && after.bytes > 0, "{after:?}");
    assert!(after.first > 1 && after.first <= 80, "{after:?}");
    assert_eq!(after.head, 80, "trimming never moves the head");
    let page = s.journal(0, 3).expect("page");
    assert_eq!(
        page[0].record,
        JournalRecord::Trimmed {
            from: 1,
            to: after.first - 1
        }
    );
    assert_eq!(page[0].arrival, after.first - 1);
    assert_eq!(page[1].arrival, after.first);
    // From a cursor inside the trimmed range: named from there on.
    let page = s.journal(5, 1).expect("page");
    assert_eq!(
        page[0].record,
        JournalRecord::Trimmed {
            from: 6,
            to: after.first - 1
        }
    );
    // From the first retained one on: no trimmed entry.
    let page = s.journal(after.first - 1, usize::MAX).expect("page");
    assert_eq!(page.len() as u64, 80 - after.first + 1);
    assert!(matches!(page[0].record, JournalRecord::Envelope { .. }));
    // Still over nothing: another trim takes nothing.
    let r = commit1(s, vec![trim(bound)]).expect("trims");
    assert_eq!(r.trim.expect("report").bounds, after);
}

fn a_trim_of_everything_keeps_the_arrivals_going_on(s: &dyn MeshStore) {
    accept_many(s, 3, 2);
    commit1(s, vec![trim(0)]).expect("trims");
    let b = s.journal_bounds().expect("bounds");
    assert_eq!((b.first, b.head, b.bytes), (7, 6, 0));
    assert_eq!(
        s.journal(0, 10).expect("page")[0].record,
        JournalRecord::Trimmed { from: 1, to: 6 }
    );
    assert!(s.journal(6, 10).expect("page").is_empty());
    let r = commit1(
        s,
        vec![WriteOp::Accept {
            batch: peer_batch(PEER, 7, 1),
            from: 7,
        }],
    )
    .expect("accepted");
    assert_eq!(r.arrivals, Some((7, 7)), "arrivals never repeat");
    // A cursor may still be set anywhere up to the head.
    commit1(
        s,
        vec![WriteOp::PutCursor {
            name: "old".into(),
            arrival: 2,
        }],
    )
    .expect("cursor");
}

fn a_trim_evicts_acknowledged_own_batches_and_keeps_the_payloads_of_unacknowledged_ones(
    s: &dyn MeshStore,
) {
    let stream = own_stream_id(s, PEER);
    let (b1, b2, b3) = (
        own(s, PEER, 1, 3, 10),
        own(s, PEER, 4, 3, 20),
        own(s, PEER, 7, 2, 30),
    );
    append_ok(s, b1);
    append_ok(s, b2.clone());
    append_ok(s, b3.clone());
    commit1(
        s,
        vec![WriteOp::Acked {
            stream: stream.clone(),
            upto: 3,
            reset: false,
        }],
    )
    .expect("acked");
    let r = commit1(s, vec![trim(0)]).expect("trims");
    let o = own_state(s, &stream).expect("stream");
    assert_eq!(
        (o.first_retained, o.msgs, o.bytes, o.evictable_msgs),
        (4, 5, 120, 0),
        "the acknowledged batch went with its rows"
    );
    assert_eq!(r.own_streams, vec![o.clone()], "the receipt says so");
    let out = outbox(s, &stream);
    assert_eq!(out.len(), 2);
    for (got, want) in out.iter().zip([&b2, &b3]) {
        assert_eq!(got.batch, *want.batch().signed());
        assert!(got.payloads == want.payloads(), "payloads kept");
    }
    // Reads from inside a kept batch still work.
    assert_eq!(s.read_outbox(&stream, 5, 0).expect("read").len(), 1);
    // Once acknowledged, a batch whose rows are gone goes at once.
    commit1(
        s,
        vec![WriteOp::Acked {
            stream: stream.clone(),
            upto: 6,
            reset: false,
        }],
    )
    .expect("acked");
    let o = own_state(s, &stream).expect("stream");
    assert_eq!((o.first_retained, o.msgs, o.bytes), (7, 2, 60));
    assert_eq!(outbox(s, &stream).len(), 1);
    // New sends after a trim are journaled and read from the journal.
    let b4 = own(s, PEER, 9, 1, 5);
    append_ok(s, b4.clone());
    let out = s.read_outbox(&stream, 8, u64::MAX).expect("read");
    assert!(out.last().expect("b4").payloads == b4.payloads());
}

fn a_trim_by_age_takes_rows_dated_before_the_bound_and_says_when_the_next_is_due(
    s: &dyn MeshStore,
) {
    const DAY: u64 = 86_400_000;
    let t0 = 10 * DAY;
    let dated = |now_ms, first: u64| {
        vec![
            WriteOp::Trim {
                now_ms,
                bytes_max: u64::MAX,
                age_ms_max: DAY,
            },
            WriteOp::Accept {
                batch: peer_batch(PEER, first, 2),
                from: first,
            },
        ]
    };
    commit1(s, dated(t0, 1)).expect("day 0");
    commit1(s, dated(t0 + DAY / 2, 3)).expect("half a day later");
    let r = commit1(s, dated(t0 + DAY - 1, 5)).expect("almost a day later");
    let report = r.trim.expect("report");
    assert_eq!(report.bounds.first, 1, "nothing is a day old yet");
    // Rows are dated to a minute: those of the first commit were written
    // within a minute of it.
    let step = crate::logic::JOURNAL_TIME_STEP_MS;
    assert_eq!(report.next_due_ms, Some(t0 + step + DAY));
    // A day (and the minute) after the second commit, its rows and the first's are old.
    let r = commit1(
        s,
        vec![WriteOp::Trim {
            now_ms: t0 + 3 * DAY / 2 + step,
            bytes_max: u64::MAX,
            age_ms_max: DAY,
        }],
    )
    .expect("trims");
    let report = r.trim.expect("report");
    assert_eq!(report.bounds.first, 5, "{report:?}");
    assert_eq!(report.next_due_ms, Some(t0 + DAY - 1 + DAY));
    // Long after the last write, everything is old.
    let r = commit1(
        s,
        vec![WriteOp::Trim {
            now_ms: t0 + 5 * DAY,
            bytes_max: u64::MAX,
            age_ms_max: DAY,
        }],
    )
    .expect("trims");
    let report = r.trim.expect("report");
    assert_eq!((report.bounds.first, report.next_due_ms), (7, None));
}

fn a_trim_takes_a_bounded_number_of_rows_and_says_there_is_more(s: &dyn MeshStore) {
    // One row each: envelopes of two streams in turn never share a row.
    let n = crate::TRIM_ROWS_MAX as u64 / 2 + 5;
    let ops = (1..=n)
        .flat_map(|seq| {
            [PEER, 3].map(|author| {
                vec![WriteOp::Accept {
                    batch: peer_batch(author, seq, 1),
                    from: seq,
                }]
            })
        })
        .collect::<Vec<_>>();
    for chunk in ops.chunks(512) {
        for r in s.commit(chunk.to_vec()) {
            r.expect("accepted");
        }
    }
    let r = commit1(s, vec![trim(0)]).expect("trims");
    let report = r.trim.expect("report");
    assert!(report.more);
    assert!(
        report.bounds.first > 1 && report.bounds.first <= 2 * n,
        "{report:?}"
    );
    let r = commit1(s, vec![trim(0)]).expect("trims again");
    let report = r.trim.expect("report");
    assert!(!report.more);
    assert_eq!(report.bounds.first, 2 * n + 1);
}

fn a_mark_keeps_the_payload_hash_of_its_envelope_and_a_gap_forgets_it(s: &dyn MeshStore) {
    let b = peer_batch(PEER, 1, 3);
    let want = Cid::of(&b.payloads()[2]);
    commit1(s, vec![WriteOp::Accept { batch: b, from: 1 }]).expect("accepted");
    let m = s.marks().expect("marks");
    assert_eq!((m[0].seq, m[0].cid), (3, Some(want)));
    commit1(
        s,
        vec![WriteOp::Gap {
            stream: peer_stream(PEER),
            earliest_available: 6,
        }],
    )
    .expect("gap");
    let m = s.marks().expect("marks");
    assert_eq!((m[0].seq, m[0].cid), (5, None));
}

fn new_epoch(s: &dyn MeshStore, n: u8) -> Epoch {
    let epoch = Epoch([n; 16]);
    commit1(s, vec![WriteOp::NewEpoch { epoch }]).expect("new epoch");
    epoch
}

fn a_new_epoch_ends_the_own_streams_and_takes_appends_in_the_new_one(s: &dyn MeshStore) {
    let old = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 3, 10));
    commit1(
        s,
        vec![WriteOp::Acked {
            stream: old.clone(),
            upto: 1,
            reset: false,
        }],
    )
    .expect("acked");
    let stale = own(s, PEER, 4, 1, 10);
    let e2 = new_epoch(s, 0x42);
    assert_eq!(s.meta().epoch, e2);
    let err = commit1(
        s,
        vec![WriteOp::AppendOwn {
            batch: stale,
            evict: None,
        }],
    )
    .expect_err("the old epoch is over");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    append_ok(s, own(s, PEER, 1, 1, 10));
    let ended = s.ended_own().expect("ended");
    assert_eq!(ended.len(), 1);
    let e = &ended[0];
    assert_eq!((&e.stream, e.held, e.reported, e.carried), (&old, 1, 1, 1));
    assert_eq!(outbox(s, &old).len(), 1, "kept to be carried over");
    let err = commit1(s, vec![WriteOp::NewEpoch { epoch: e2 }]).expect_err("not new");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
}

fn a_rollback_is_reported_once_per_range_the_world_saw(s: &dyn MeshStore) {
    let old = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 3, 10));
    new_epoch(s, 0x43);
    let report = |held, world| WriteOp::ReportRolledBack {
        stream: old.clone(),
        held,
        world,
        detail: "the peer holds more".into(),
    };
    // Nothing was acknowledged: none of it is known to be as the peer has it.
    let r = commit1(s, vec![report(3, 5)]).expect("reported");
    assert_eq!(r.arrivals, Some((4, 4)));
    let rolled = |from, to| JournalRecord::RolledBack {
        stream: old.clone(),
        from,
        to,
        detail: "the peer holds more".into(),
    };
    assert_eq!(journal(s)[3].record, rolled(1, 5));
    let r = commit1(s, vec![report(3, 5)]).expect("again");
    assert_eq!(r.arrivals, None, "the same range is reported once");
    commit1(s, vec![report(3, 7)]).expect("more");
    assert_eq!(journal(s)[4].record, rolled(6, 7));
    let e = &s.ended_own().expect("ended")[0];
    assert_eq!((e.held, e.reported), (0, 7));
    let err = commit1(
        s,
        vec![WriteOp::ReportRolledBack {
            stream: own_stream_id(s, PEER),
            held: 0,
            world: 1,
            detail: String::new(),
        }],
    )
    .expect_err("not an ended stream");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
}

fn a_carry_over_appends_without_journaling_and_drops_the_ended_outbox_at_its_end(
    s: &dyn MeshStore,
) {
    let old = own_stream_id(s, PEER);
    let first = own(s, PEER, 1, 4, 10);
    append_ok(s, first.clone());
    new_epoch(s, 0x44);
    let new = own_stream_id(s, PEER);
    // Re-signed in the new epoch: the unacknowledged seqs 1..=2, then 3..=4.
    let again = |first_seq, from: usize, n: usize| {
        let (_, payloads) = first.clone().into_parts();
        let envs = payloads[from..from + n]
            .iter()
            .map(|p| mesh_protocol::NewEnvelope {
                lamport: 100,
                created_ms: 5,
                kind: 0,
                payload: p.clone(),
            })
            .collect();
        mesh_protocol::OpenBatch::sign(
            &key(ME),
            new.epoch,
            Channel::Direct(node(PEER)),
            first_seq,
            envs,
        )
        .expect("signs")
    };
    let head = s.journal_head().expect("head");
    let carry = |batch, upto| WriteOp::CarryOver {
        batch,
        from: old.clone(),
        upto,
    };
    commit1(s, vec![carry(again(1, 0, 2), 2)]).expect("carried");
    assert_eq!(s.journal_head().expect("head"), head, "not journaled again");
    assert_eq!(s.ended_own().expect("ended")[0].carried, 2);
    let err = commit1(s, vec![carry(again(3, 2, 2), 2)]).expect_err("already carried");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    commit1(s, vec![carry(again(3, 2, 2), 4)]).expect("carried to the end");
    assert!(own_state(s, &old).is_none(), "the ended outbox is dropped");
    assert!(outbox(s, &old).is_empty());
    let o = own_state(s, &new).expect("new stream");
    assert_eq!((o.next_seq, o.msgs, o.bytes), (5, 4, 40));
    let out = outbox(s, &new);
    let payloads: Vec<_> = out.iter().flat_map(|b| b.payloads.clone()).collect();
    assert!(payloads == first.payloads(), "the same messages, re-signed");
    // Trimming leaves the carried batches alone: their payloads are the outbox's.
    commit1(s, vec![trim(0)]).expect("trims");
    assert_eq!(outbox(s, &new).len(), 2);
    assert_eq!(s.ended_own().expect("ended")[0].carried, 4);
}

fn an_ended_stream_with_nothing_left_to_carry_is_dropped(s: &dyn MeshStore) {
    let old = own_stream_id(s, PEER);
    append_ok(s, own(s, PEER, 1, 2, 10));
    let other = StreamId::direct(node(ME), s.meta().epoch, node(3));
    append_ok(s, own(s, 3, 1, 1, 10));
    commit1(
        s,
        vec![WriteOp::Acked {
            stream: other.clone(),
            upto: 1,
            reset: false,
        }],
    )
    .expect("acked");
    new_epoch(s, 0x45);
    assert!(
        own_state(s, &other).is_none(),
        "all acknowledged: dropped at once"
    );
    assert!(own_state(s, &old).is_some());
    commit1(
        s,
        vec![WriteOp::DropEnded {
            stream: old.clone(),
        }],
    )
    .expect("dropped");
    assert!(own_state(s, &old).is_none());
    let mut ended = s.ended_own().expect("ended");
    ended.sort_by(|a, b| a.stream.cmp(&b.stream));
    assert!(ended.iter().all(|e| e.carried == e.held), "{ended:?}");
}

fn lost_sends_ended_epochs_and_conflicts_are_journal_entries(s: &dyn MeshStore) {
    let b = peer_batch(PEER, 1, 2);
    let ours = Cid::of(&b.payloads()[1]);
    commit1(s, vec![WriteOp::Accept { batch: b, from: 1 }]).expect("accepted");
    let r = commit1(
        s,
        vec![
            WriteOp::RecordLost {
                to: node(PEER),
                msgs: 3,
                bytes: 30,
                first_ms: 10,
                last_ms: 20,
                detail: "held 120 s".into(),
            },
            WriteOp::EndEpoch {
                stream: peer_stream(PEER),
            },
            WriteOp::EndEpoch {
                stream: peer_stream(7),
            },
            WriteOp::RecordConflict {
                stream: peer_stream(PEER),
                seq: 2,
                ours,
                theirs: Cid([1; 32]),
            },
        ],
    )
    .expect("recorded");
    assert_eq!(
        r.arrivals,
        Some((3, 5)),
        "no record for a stream never received"
    );
    let j = journal(s);
    assert_eq!(
        j[2].record,
        JournalRecord::SendsLost {
            to: node(PEER),
            msgs: 3,
            bytes: 30,
            first_ms: 10,
            last_ms: 20,
            detail: "held 120 s".into()
        }
    );
    assert_eq!(
        j[3].record,
        JournalRecord::EpochEnded {
            stream: peer_stream(PEER),
            last: 2
        }
    );
    assert_eq!(
        j[4].record,
        JournalRecord::Conflict {
            stream: peer_stream(PEER),
            seq: 2,
            ours,
            theirs: Cid([1; 32])
        }
    );
    for bad in [
        WriteOp::RecordLost {
            to: node(PEER),
            msgs: 0,
            bytes: 0,
            first_ms: 1,
            last_ms: 1,
            detail: String::new(),
        },
        WriteOp::RecordLost {
            to: node(PEER),
            msgs: 1,
            bytes: 0,
            first_ms: 1,
            last_ms: 1,
            detail: "x".repeat(crate::DETAIL_BYTES_MAX + 1),
        },
    ] {
        let err = commit1(s, vec![bad]).expect_err("refused");
        assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    }
}

fn a_journal_page_stops_after_the_entry_that_crosses_its_byte_bound(s: &dyn MeshStore) {
    // Peer payloads are 16 bytes.
    accept_many(s, 1, 10);
    let page = s.journal_page(0, 100, 40).expect("page");
    assert_eq!(page.len(), 3, "16 + 16 < 40 <= 48");
    let page = s.journal_page(0, 100, 1).expect("page");
    assert_eq!(page.len(), 1, "the first entry always comes");
    let page = s.journal_page(8, 100, 0).expect("page");
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].arrival, 9);
}
