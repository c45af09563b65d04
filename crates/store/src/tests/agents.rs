//! The agent tables' rules, run against every [`MeshStore`] implementation,
//! and a file written before the tables existed.

use mesh_protocol::{
    AgentEnvelope, AgentName, BounceReason, Channel, Epoch, KIND_AGENT, KIND_TOMBSTONE, MsgId,
    NewEnvelope, OpenBatch, SupersedeKey, Tombstone, TombstoneReason,
};

use super::util::*;
use crate::{
    AgentIndex, AgentOp, AgentRecord, DedupKey, DedupRecord, InboxKind, InboxRow, JournalRecord,
    MeshStore, MessageDir, MessageRow, StoreError, WriteOp,
};

store_suite!(
    an_inbox_entry_is_written_with_its_envelope_and_reads_back_with_it,
    an_index_entry_for_an_envelope_not_journaled_in_its_group_is_refused_whole,
    an_inbox_pages_in_arrival_order_after_a_cursor_and_holds_only_its_agent,
    a_message_row_gets_its_place_and_a_bounce_marks_it,
    a_superseded_outbox_message_reads_back_as_its_tombstone_and_the_index_says_by_what,
    a_received_tombstone_indexes_as_superseded,
    agents_aliases_and_agent_cursors_round_trip_and_a_removed_agent_loses_its_inbox,
    dedup_records_round_trip_oldest_first_and_expire_by_time,
    a_lag_record_goes_to_an_agents_inbox_with_the_group_that_journals_it,
    a_run_of_messages_of_one_stream_reads_back_each_and_a_bounce_marks_only_its_own,
    an_inbox_entry_whose_journal_entry_retention_trimmed_reads_as_trimmed,
    a_trim_takes_the_inbox_entries_of_its_rows_even_from_a_row_it_cuts,
    a_trim_forgets_the_messages_of_its_rows_and_the_rest_keep_their_places,
    an_evicted_agent_message_puts_the_loss_record_in_its_senders_inbox,
    a_move_notice_is_kept_per_agent_and_a_later_one_replaces_it,
    a_message_passed_on_twice_is_indexed_once,
    a_message_taken_again_for_an_agent_back_here_is_taken_once_more_only,
    a_drain_end_is_refused_while_the_inbox_has_entries_after_what_was_passed_on,
    a_read_receipt_marks_only_what_this_node_sent_to_the_reader_and_only_once,
);

/// The read receipt entry at `seq` of `PEER`'s stream: bob on `reader_node`
/// read `ids` of alice's.
fn read_entry(seq: u64, reader_node: u8, ids: Vec<MsgId>) -> AgentIndex {
    AgentIndex::Read {
        agent: name("alice"),
        seq,
        mark: crate::ReadMark {
            node: node(reader_node),
            reader: name("bob"),
            read_ms: 1_000 + seq,
        },
        ids,
    }
}

/// Accepts `PEER`'s envelope `seq` (standing for a receipt) with `entry`.
fn accept_receipt(s: &dyn MeshStore, seq: u64, entry: AgentIndex) -> crate::Receipt {
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: peer_batch(PEER, seq, 1),
                from: seq,
            },
            index_peer(vec![entry]),
        ],
    )
    .expect("commits")
}

fn a_read_receipt_marks_only_what_this_node_sent_to_the_reader_and_only_once(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    let id = |seq| MsgId::derive(&node(ME), s.meta().epoch, &node(PEER), seq);
    for seq in 1..=2 {
        commit1(
            s,
            vec![
                WriteOp::AppendOwn {
                    batch: own_message(s, seq, "alice"),
                    evict: None,
                },
                WriteOp::Agents(AgentOp::Index {
                    stream: stream.clone(),
                    entries: vec![AgentIndex::Message {
                        id: id(seq),
                        seq,
                        row: MessageRow {
                            stream: stream.clone(),
                            from: name("alice"),
                            ..sent_row(seq)
                        },
                    }],
                }),
            ],
        )
        .expect("commits");
    }
    // A message this node received from the peer: not its to be read.
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: agent_batch(1, 1),
                from: 1,
            },
            index_peer(vec![AgentIndex::Message {
                id: peer_id(1),
                seq: 1,
                row: MessageRow {
                    seq: 1,
                    ..message_row()
                },
            }]),
        ],
    )
    .expect("commits");
    assert!(s.message(&peer_id(1)).expect("reads").is_some());
    let never = MsgId([0xee; 16]);
    let r = accept_receipt(s, 2, read_entry(2, PEER, vec![id(1), peer_id(1), never]));
    assert_eq!(
        r.read,
        crate::ReadReport {
            taken: 1,
            marked: 1,
            skipped: 2,
            refused: 0
        }
    );
    let got = s.message(&id(1)).expect("reads").expect("indexed");
    let mark = got.read.expect("marked read");
    assert_eq!(
        (mark.node, mark.reader, mark.read_ms),
        (node(PEER), name("bob"), 1_002)
    );
    assert_eq!(
        s.message(&id(2)).expect("reads").expect("indexed").read,
        None
    );
    let inbox = || {
        inbox_of(s, "alice")
            .into_iter()
            .filter(|(k, _)| *k == InboxKind::Read)
            .count()
    };
    assert_eq!(inbox(), 1, "one read entry");
    // The same receipt again, and one naming id 2 from another node: each
    // marks nothing, so neither tells alice anything.
    let again = accept_receipt(s, 3, read_entry(3, PEER, vec![id(1)]));
    assert_eq!((again.read.marked, again.read.refused), (0, 1));
    let elsewhere = accept_receipt(s, 4, read_entry(4, 9, vec![id(2)]));
    assert_eq!((elsewhere.read.skipped, elsewhere.read.refused), (1, 1));
    assert_eq!(inbox(), 1);
    assert_eq!(
        s.message(&id(2)).expect("reads").expect("indexed").read,
        None
    );
    assert_eq!(
        s.message(&id(1))
            .expect("reads")
            .expect("indexed")
            .read
            .map(|m| m.read_ms),
        Some(1_002),
        "the first receipt's mark stays"
    );
    let second = accept_receipt(s, 5, read_entry(5, PEER, vec![id(2)]));
    assert_eq!((second.read.marked, second.read.refused), (1, 0));
    assert_eq!(inbox(), 2);
    assert!(
        s.message(&id(2))
            .expect("reads")
            .expect("indexed")
            .read
            .is_some()
    );
}

/// The end of a moved agent's drain is journaled only once its previous
/// inbox was passed on whole: an entry after `passed` refuses it.
fn a_drain_end_is_refused_while_the_inbox_has_entries_after_what_was_passed_on(s: &dyn MeshStore) {
    accept_into(s, 1, 3, "bob", &[1, 2, 3]);
    let end = |passed| {
        commit1(
            s,
            vec![WriteOp::RecordDrainEnded {
                agent: name("bob"),
                to: node(PEER),
                passed,
                detail: "every peer followed".into(),
            }],
        )
    };
    let r = end(1);
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    assert_eq!(s.journal_head().expect("head"), 3, "nothing journaled");
    end(3).expect("passed on whole: the drain ends");
    assert_eq!(s.journal_head().expect("head"), 4);
}

/// A forwarded entry of the message `id` at `seq` of `PEER`'s stream.
fn forwarded(id: MsgId, seq: u64) -> AgentIndex {
    AgentIndex::Forwarded {
        agent: name("kim"),
        id,
        seq,
        inbox: row(InboxKind::Message),
        message: MessageRow {
            seq,
            ..message_row()
        },
    }
}

/// A batch of `PEER` from `first`: forwards of the messages `ids`.
fn forward_batch(first: u64, ids: &[MsgId]) -> OpenBatch {
    let envs = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let inner = AgentEnvelope {
                id: *id,
                from: name("bob"),
                to: Some(name("kim")),
                in_reply_to: None,
                key: None,
                body: b"hi".to_vec(),
                receipt: false,
            };
            let f = mesh_protocol::Forward {
                author: node(50),
                envelope: inner.encode(),
            };
            NewEnvelope {
                lamport: first + i as u64,
                created_ms: 1,
                kind: mesh_protocol::KIND_FORWARD,
                payload: f.encode(),
            }
        })
        .collect();
    peer_batch_of(first, envs)
}

/// The row of a message this node sent, at `seq`.
fn sent_row(seq: u64) -> MessageRow {
    MessageRow {
        dir: MessageDir::Sent,
        seq,
        ..message_row()
    }
}

/// `PEER`'s batch of `envs` to this node from `first`, in its first epoch.
fn peer_batch_of(first: u64, envs: Vec<NewEnvelope>) -> OpenBatch {
    OpenBatch::sign(
        &key(PEER),
        Epoch([PEER; 16]),
        Channel::Direct(node(ME)),
        first,
        envs,
    )
    .expect("fits")
}

/// This store's batch of `envs` to `PEER` from `first`, in its epoch.
fn own_batch(s: &dyn MeshStore, first: u64, envs: Vec<NewEnvelope>) -> OpenBatch {
    OpenBatch::sign(
        &key(ME),
        s.meta().epoch,
        Channel::Direct(node(PEER)),
        first,
        envs,
    )
    .expect("fits")
}

/// Adds the agent kim.
fn add_kim(s: &dyn MeshStore) {
    let kim = AgentRecord {
        name: name("kim"),
        key: node(40),
        uid: 1,
        created_ms: 1,
    };
    commit1(s, vec![WriteOp::Agents(AgentOp::PutAgent(kim))]).expect("commits");
}

/// The index op of `entries` of `PEER`'s stream.
fn index_peer(entries: Vec<AgentIndex>) -> WriteOp {
    WriteOp::Agents(AgentOp::Index {
        stream: peer_stream(PEER),
        entries,
    })
}

/// `PEER`'s batch from `first` of forwards of `ids`, accepted.
fn accept_forwards(first: u64, ids: &[MsgId]) -> WriteOp {
    WriteOp::Accept {
        batch: forward_batch(first, ids),
        from: first,
    }
}

fn a_message_passed_on_twice_is_indexed_once(s: &dyn MeshStore) {
    add_kim(s);
    let (once, sent) = (MsgId([1; 16]), MsgId([2; 16]));
    // A message this node sent, come back to an agent that moved here.
    let own = sent_row(1);
    commit1(
        s,
        vec![
            accept_forwards(1, &[sent]),
            index_peer(vec![AgentIndex::Message {
                id: sent,
                seq: 1,
                row: own,
            }]),
        ],
    )
    .expect("commits");
    // Seqs 2 and 3 carry the same message, and so does seq 4 a commit
    // later; seq 5 is the node's own message.
    commit1(
        s,
        vec![
            accept_forwards(2, &[once, once]),
            index_peer(vec![forwarded(once, 2), forwarded(once, 3)]),
        ],
    )
    .expect("commits");
    commit1(
        s,
        vec![
            accept_forwards(4, &[once, sent]),
            index_peer(vec![forwarded(once, 4), forwarded(sent, 5)]),
        ],
    )
    .expect("commits");
    let inbox = arrivals(s, "kim", 0, 10);
    assert_eq!(
        inbox.len(),
        2,
        "the message once, and the node's own: {inbox:?}"
    );
    let got = s.message(&once).expect("reads").expect("indexed");
    assert_eq!(
        (got.dir, got.seq),
        (MessageDir::Received, 2),
        "the first place"
    );
    let own = s.message(&sent).expect("reads").expect("indexed");
    assert_eq!((own.dir, own.seq), (MessageDir::Sent, 1), "its row stays");
}

/// The chaos run's duplicate (docs/reliability.md): an agent came back to
/// a node it had left, and the old host passed one message on to it twice.
/// A message the index had from before the agent left here, and this
/// node's own message, each go in its inbox once more, not once per copy.
fn a_message_taken_again_for_an_agent_back_here_is_taken_once_more_only(s: &dyn MeshStore) {
    add_kim(s);
    let (back, sent) = (MsgId([3; 16]), MsgId([4; 16]));
    // Before kim left: `back` came here for it, and this node sent `sent`.
    let own = sent_row(2);
    commit1(
        s,
        vec![
            accept_forwards(1, &[back, sent]),
            index_peer(vec![
                forwarded(back, 1),
                AgentIndex::Message {
                    id: sent,
                    seq: 2,
                    row: own,
                },
            ]),
        ],
    )
    .expect("commits");
    let before = inbox_of(s, "kim");
    assert_eq!(before.len(), 1, "{before:?}");
    // kim left and came back: it reads on from past where it had `back`.
    let resumed = s.inbox(&name("kim"), 0, 10).expect("reads")[0].item.arrival;
    commit1(
        s,
        vec![WriteOp::Agents(AgentOp::PutCursor {
            agent: name("kim"),
            name: crate::RESUMED_CURSOR.to_owned(),
            arrival: resumed,
        })],
    )
    .expect("commits");
    // The host it came from passes both on, then (a page given up and
    // read again) both once more: two groups of one commit, then a commit
    // later.
    let copies = |first| {
        vec![
            accept_forwards(first, &[back, sent]),
            index_peer(vec![forwarded(back, first), forwarded(sent, first + 1)]),
        ]
    };
    for r in s.commit(vec![copies(3), copies(5)]) {
        r.expect("commits");
    }
    commit1(s, copies(7)).expect("commits");
    let after = arrivals(s, "kim", resumed, 10);
    assert_eq!(
        after.len(),
        2,
        "past where kim resumed: `back` and the node's own message, once each: {after:?}"
    );
    let own = s.message(&sent).expect("reads").expect("indexed");
    assert_eq!((own.dir, own.seq), (MessageDir::Sent, 2), "its row stays");
}

fn a_move_notice_is_kept_per_agent_and_a_later_one_replaces_it(s: &dyn MeshStore) {
    assert_eq!(s.moves().expect("reads"), vec![], "none before any move");
    let notice = |agent: u8, version: u64| {
        mesh_protocol::AgentMove::sign(&key(agent), name("kim"), (node(1), node(2)), version, 7)
    };
    let put = |n| commit1(s, vec![WriteOp::Agents(AgentOp::PutMove(n))]);
    put(notice(40, 1)).expect("commits");
    put(notice(41, 3)).expect("commits");
    put(notice(40, 2)).expect("commits");
    let mut held = s.moves().expect("reads");
    held.sort_by_key(|m| m.version);
    assert_eq!(held, vec![notice(40, 2), notice(41, 3)]);
    assert!(held.iter().all(|m| m.verify().is_ok()), "kept as signed");
}

fn name(s: &str) -> AgentName {
    AgentName::new(s).expect("valid name")
}

fn message_row() -> MessageRow {
    MessageRow {
        dir: MessageDir::Received,
        stream: peer_stream(PEER),
        seq: 0,
        arrival: 0,
        from: name("alice"),
        to: Some(name("bob")),
        in_reply_to: None,
        undelivered: None,
        superseded_by: None,
        read: None,
    }
}

/// The id of seq `seq` of `PEER`'s stream to us.
fn peer_id(seq: u64) -> MsgId {
    MsgId::derive(&node(PEER), Epoch([PEER; 16]), &node(ME), seq)
}

/// A batch of `PEER`'s of `n` agent messages from `first`, message `seq`
/// from agent `a{seq}` to `bob`.
fn agent_batch(first: u64, n: u64) -> OpenBatch {
    agent_batch_of(first, n, b"hi")
}

/// As [`agent_batch`], each message's body `body`.
fn agent_batch_of(first: u64, n: u64, body: &[u8]) -> OpenBatch {
    let envs = (first..first + n)
        .map(|seq| NewEnvelope {
            lamport: seq,
            created_ms: seq,
            kind: KIND_AGENT,
            payload: AgentEnvelope {
                id: peer_id(seq),
                from: name(&format!("a{seq}")),
                to: Some(name("bob")),
                in_reply_to: None,
                key: None,
                body: body.to_vec(),
                receipt: false,
            }
            .encode(),
        })
        .collect();
    peer_batch_of(first, envs)
}

fn row(kind: InboxKind) -> InboxRow {
    InboxRow {
        kind,
        verified: true,
        in_reply_to: None,
    }
}

/// Accepts `n` envelopes of `PEER` from `first` and indexes `inbox` of them
/// (by seq) into `agent`'s inbox, in one group.
fn accept_into(s: &dyn MeshStore, first: u64, n: usize, agent: &str, inbox: &[u64]) {
    let entries = inbox
        .iter()
        .map(|seq| AgentIndex::Inbox {
            agent: name(agent),
            seq: *seq,
            row: row(InboxKind::Message),
        })
        .collect();
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: peer_batch(PEER, first, n),
                from: first,
            },
            WriteOp::Agents(AgentOp::Index {
                stream: peer_stream(PEER),
                entries,
            }),
        ],
    )
    .expect("commits");
}

fn an_inbox_entry_is_written_with_its_envelope_and_reads_back_with_it(s: &dyn MeshStore) {
    accept_into(s, 1, 3, "bob", &[2]);
    let inbox = s.inbox(&name("bob"), 0, 10).expect("reads");
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].item.arrival, 2);
    assert_eq!(inbox[0].row, row(InboxKind::Message));
    assert!(matches!(
        &inbox[0].item.record,
        JournalRecord::Envelope { seq: 2, .. }
    ));
    assert_eq!(inbox[0].item, journal(s)[1]);
}

fn an_index_entry_for_an_envelope_not_journaled_in_its_group_is_refused_whole(s: &dyn MeshStore) {
    accept_into(s, 1, 1, "bob", &[1]);
    // Seq 1 was journaled by another group: this one holds only seq 2.
    let r = commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: peer_batch(PEER, 2, 1),
                from: 2,
            },
            WriteOp::Agents(AgentOp::Index {
                stream: peer_stream(PEER),
                entries: vec![AgentIndex::Inbox {
                    agent: name("bob"),
                    seq: 1,
                    row: row(InboxKind::Message),
                }],
            }),
        ],
    );
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    assert_eq!(s.journal_head().expect("head"), 1, "nothing of it written");
    assert_eq!(s.inbox(&name("bob"), 0, 10).expect("reads").len(), 1);
}

fn an_inbox_pages_in_arrival_order_after_a_cursor_and_holds_only_its_agent(s: &dyn MeshStore) {
    accept_into(s, 1, 4, "bob", &[1, 3]);
    accept_into(s, 5, 2, "carol", &[5]);
    accept_into(s, 7, 2, "bob", &[8]);
    assert_eq!(arrivals(s, "bob", 0, 10), [1, 3, 8]);
    assert_eq!(arrivals(s, "bob", 1, 1), [3]);
    assert_eq!(arrivals(s, "bob", 3, 10), [8]);
    assert_eq!(arrivals(s, "bob", 8, 10), Vec::<u64>::new());
    assert_eq!(arrivals(s, "carol", 0, 10), [5]);
    assert_eq!(arrivals(s, "dave", 0, 10), Vec::<u64>::new());
}

fn a_message_row_gets_its_place_and_a_bounce_marks_it(s: &dyn MeshStore) {
    let id = peer_id(2);
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: agent_batch(1, 2),
                from: 1,
            },
            WriteOp::Agents(AgentOp::Index {
                stream: peer_stream(PEER),
                entries: vec![AgentIndex::Message {
                    id,
                    seq: 2,
                    row: message_row(),
                }],
            }),
        ],
    )
    .expect("commits");
    let got = s.message(&id).expect("reads").expect("indexed");
    assert_eq!(
        (got.stream, got.seq, got.arrival),
        (peer_stream(PEER), 2, 2)
    );
    // What it says is its envelope's.
    assert_eq!((got.from, got.to), (name("a2"), Some(name("bob"))));
    assert_eq!(s.message(&peer_id(1)).expect("reads"), None, "not indexed");
    commit1(
        s,
        vec![WriteOp::Agents(AgentOp::Bounced {
            id,
            reason: BounceReason::NoSuchAgent,
        })],
    )
    .expect("commits");
    let got = s.message(&id).expect("reads").expect("indexed");
    assert_eq!(got.undelivered, Some(BounceReason::NoSuchAgent));
    // A bounce of a message this node never indexed changes nothing.
    commit1(
        s,
        vec![WriteOp::Agents(AgentOp::Bounced {
            id: MsgId([5; 16]),
            reason: BounceReason::NoSuchAgent,
        })],
    )
    .expect("commits");
    assert_eq!(s.message(&MsgId([5; 16])).expect("reads"), None);
}

fn agents_aliases_and_agent_cursors_round_trip_and_a_removed_agent_loses_its_inbox(
    s: &dyn MeshStore,
) {
    let record = |n: &str, uid| AgentRecord {
        name: name(n),
        key: node(7),
        uid,
        created_ms: 5,
    };
    let put = |op| commit1(s, vec![WriteOp::Agents(op)]);
    put(AgentOp::PutAgent(record("bob", 1000))).expect("commits");
    put(AgentOp::PutAgent(record("alice", 0))).expect("commits");
    assert_eq!(
        s.agents().expect("reads"),
        vec![record("alice", 0), record("bob", 1000)]
    );
    accept_into(s, 1, 2, "bob", &[1, 2]);
    let cursor = |agent: &str, cursor: &str, arrival| {
        put(AgentOp::PutCursor {
            agent: name(agent),
            name: cursor.into(),
            arrival,
        })
    };
    cursor("bob", "main", 1).expect("commits");
    assert!(matches!(
        cursor("bob", "main", 3),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(cursor("bob", "", 1), Err(StoreError::Conflict(_))));
    assert_eq!(
        s.agent_cursor(&name("bob"), "main").expect("reads"),
        Some(1)
    );
    assert_eq!(s.agent_cursor(&name("alice"), "main").expect("reads"), None);
    put(AgentOp::PutAlias {
        alias: "gpu".into(),
        node: Some(node(PEER)),
    })
    .expect("commits");
    assert_eq!(
        s.aliases().expect("reads"),
        vec![("gpu".to_owned(), node(PEER))]
    );
    put(AgentOp::PutAlias {
        alias: "gpu".into(),
        node: None,
    })
    .expect("commits");
    assert_eq!(s.aliases().expect("reads"), vec![]);
    assert!(matches!(
        put(AgentOp::PutAlias {
            alias: String::new(),
            node: Some(node(PEER)),
        }),
        Err(StoreError::Conflict(_))
    ));
    put(AgentOp::RemoveAgent(name("bob"))).expect("commits");
    assert_eq!(s.agents().expect("reads"), vec![record("alice", 0)]);
    assert_eq!(s.inbox(&name("bob"), 0, 10).expect("reads"), vec![]);
    assert_eq!(s.agent_cursor(&name("bob"), "main").expect("reads"), None);
    assert_eq!(journal(s).len(), 2, "its journal entries stay");
}

fn dedup_records_round_trip_oldest_first_and_expire_by_time(s: &dyn MeshStore) {
    let stream = own_stream_id(s, PEER);
    let record = |id: &str, at_ms| DedupRecord {
        key: DedupKey {
            sender: Some(name("alice")),
            client_id: id.into(),
        },
        at_ms,
        digest: [1; 16],
        msg: Some(MsgId([2; 16])),
        stream: stream.clone(),
        seq: 0,
        arrival: 0,
    };
    for (seq, (id, at)) in [("b", 20), ("a", 10), ("c", 30)].into_iter().enumerate() {
        let seq = seq as u64 + 1;
        commit1(
            s,
            vec![
                WriteOp::AppendOwn {
                    batch: own(s, PEER, seq, 1, 4),
                    evict: None,
                },
                WriteOp::Agents(AgentOp::Index {
                    stream: stream.clone(),
                    entries: vec![AgentIndex::Dedup {
                        seq,
                        record: record(id, at),
                    }],
                }),
            ],
        )
        .expect("commits");
    }
    let got = s.dedup().expect("reads");
    let ids: Vec<(&str, u64, u64)> = got
        .iter()
        .map(|r| (r.key.client_id.as_str(), r.seq, r.arrival))
        .collect();
    assert_eq!(ids, [("a", 2, 2), ("b", 1, 1), ("c", 3, 3)]);
    commit1(
        s,
        vec![WriteOp::Agents(AgentOp::ExpireDedup { before_ms: 20 })],
    )
    .expect("commits");
    commit1(
        s,
        vec![WriteOp::Agents(AgentOp::ForgetDedup {
            at_ms: 30,
            key: record("c", 30).key,
        })],
    )
    .expect("commits");
    let left: Vec<String> = s
        .dedup()
        .expect("reads")
        .into_iter()
        .map(|r| r.key.client_id)
        .collect();
    assert_eq!(left, ["b"]);
}

fn a_lag_record_goes_to_an_agents_inbox_with_the_group_that_journals_it(s: &dyn MeshStore) {
    accept_into(s, 1, 2, "bob", &[1, 2]);
    commit1(
        s,
        vec![
            WriteOp::RecordLag {
                subscriber: "bob's subscription".into(),
                from: 1,
                to: 2,
            },
            WriteOp::Agents(AgentOp::InboxLast {
                agent: name("bob"),
                row: row(InboxKind::Lagged),
            }),
        ],
    )
    .expect("commits");
    let inbox = s.inbox(&name("bob"), 2, 10).expect("reads");
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].row.kind, InboxKind::Lagged);
    assert!(matches!(
        inbox[0].item.record,
        JournalRecord::SubscriberLagged { from: 1, to: 2, .. }
    ));
    let alone = commit1(
        s,
        vec![WriteOp::Agents(AgentOp::InboxLast {
            agent: name("bob"),
            row: row(InboxKind::Lagged),
        })],
    );
    assert!(matches!(alone, Err(StoreError::Conflict(_))), "{alone:?}");
}

fn a_run_of_messages_of_one_stream_reads_back_each_and_a_bounce_marks_only_its_own(
    s: &dyn MeshStore,
) {
    let stream = peer_stream(PEER);
    let entries = (1..=4)
        .map(|seq| AgentIndex::Message {
            id: peer_id(seq),
            seq,
            row: message_row(),
        })
        .collect();
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: agent_batch(1, 5),
                from: 1,
            },
            WriteOp::Agents(AgentOp::Index {
                stream: stream.clone(),
                entries,
            }),
        ],
    )
    .expect("commits");
    for seq in 1..=4 {
        let row = s.message(&peer_id(seq)).expect("reads").expect("indexed");
        assert_eq!((row.seq, row.arrival), (seq, seq));
        assert_eq!(row.from, name(&format!("a{seq}")));
    }
    assert_eq!(
        s.message(&peer_id(5)).expect("reads"),
        None,
        "seq 5 is not indexed"
    );
    assert_eq!(s.message(&MsgId([0; 16])).expect("reads"), None);
    commit1(
        s,
        vec![WriteOp::Agents(AgentOp::Bounced {
            id: peer_id(2),
            reason: BounceReason::NoSuchAgent,
        })],
    )
    .expect("commits");
    let marked: Vec<bool> = (1..=4)
        .map(|seq| {
            s.message(&peer_id(seq))
                .expect("reads")
                .expect("indexed")
                .undelivered
                .is_some()
        })
        .collect();
    assert_eq!(marked, [false, true, false, false]);
}

fn an_inbox_entry_whose_journal_entry_retention_trimmed_reads_as_trimmed(s: &dyn MeshStore) {
    accept_into(s, 1, 3, "bob", &[2]);
    let first_row = s.journal_bounds().expect("bounds").bytes;
    accept_into(s, 4, 3, "bob", &[5]);
    let both = s.journal_bounds().expect("bounds").bytes;
    // Keep the bytes of the second commit's rows only: the first ones go.
    commit1(
        s,
        vec![WriteOp::Trim {
            now_ms: 1_000_000,
            bytes_max: both - first_row,
            age_ms_max: 0,
        }],
    )
    .expect("trims");
    assert_eq!(s.journal_bounds().expect("bounds").first, 4);
    let inbox = s.inbox(&name("bob"), 0, 10).expect("reads");
    assert_eq!(inbox.len(), 2, "{inbox:?}");
    assert_eq!(inbox[0].item.arrival, 2);
    assert_eq!(
        inbox[0].item.record,
        JournalRecord::Trimmed { from: 1, to: 2 },
        "the reader is told what retention took, once, from its cursor on"
    );
    assert!(matches!(
        &inbox[1].item.record,
        JournalRecord::Envelope { seq: 5, .. }
    ));
    // A cursor inside the trimmed range is told from there; one past it is not.
    let from_1 = s.inbox(&name("bob"), 1, 10).expect("reads");
    assert_eq!(
        from_1[0].item.record,
        JournalRecord::Trimmed { from: 2, to: 2 }
    );
    let past = s.inbox(&name("bob"), 2, 10).expect("reads");
    assert_eq!(past.len(), 1);
    assert!(matches!(
        &past[0].item.record,
        JournalRecord::Envelope { seq: 5, .. }
    ));
    // The told range counts against the page.
    let one = s.inbox(&name("bob"), 0, 1).expect("reads");
    assert_eq!(one.len(), 1);
    assert!(matches!(one[0].item.record, JournalRecord::Trimmed { .. }));
    assert!(s.inbox(&name("bob"), 0, 0).expect("reads").is_empty());
    // Another agent's inbox is not told of bob's losses.
    assert!(s.inbox(&name("carol"), 0, 10).expect("reads").is_empty());
}

fn a_trim_takes_the_inbox_entries_of_its_rows_even_from_a_row_it_cuts(s: &dyn MeshStore) {
    // One commit: bob's entries at arrival 1 (PEER's run, 1..=2) and at 4
    // (node 3's run, 3..=4), one inbox row on disk across two journal rows.
    let index = |stream, seq| {
        WriteOp::Agents(AgentOp::Index {
            stream,
            entries: vec![AgentIndex::Inbox {
                agent: name("bob"),
                seq,
                row: row(InboxKind::Message),
            }],
        })
    };
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: peer_batch(PEER, 1, 2),
                from: 1,
            },
            WriteOp::Accept {
                batch: peer_batch(3, 1, 2),
                from: 1,
            },
            index(peer_stream(PEER), 1),
            index(peer_stream(3), 2),
        ],
    )
    .expect("commits");
    let both = s.journal_bounds().expect("bounds").bytes;
    // The two runs are alike: half the bytes is the first run's rows gone.
    commit1(
        s,
        vec![WriteOp::Trim {
            now_ms: 1_000_000,
            bytes_max: both / 2,
            age_ms_max: 0,
        }],
    )
    .expect("trims");
    assert_eq!(s.journal_bounds().expect("bounds").first, 3);
    let inbox = s.inbox(&name("bob"), 0, 10).expect("reads");
    assert_eq!(inbox.len(), 2, "{inbox:?}");
    assert_eq!(
        inbox[0].item.record,
        JournalRecord::Trimmed { from: 1, to: 1 }
    );
    assert_eq!(inbox[1].item.arrival, 4);
    assert!(matches!(
        &inbox[1].item.record,
        JournalRecord::Envelope { seq: 2, .. }
    ));
    // A later trim of everything: one range, up to the last entry taken.
    commit1(
        s,
        vec![WriteOp::Trim {
            now_ms: 2_000_000,
            bytes_max: 0,
            age_ms_max: 0,
        }],
    )
    .expect("trims");
    let inbox = s.inbox(&name("bob"), 0, 10).expect("reads");
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    assert_eq!(
        inbox[0].item.record,
        JournalRecord::Trimmed { from: 1, to: 4 }
    );
    assert!(s.inbox(&name("bob"), 4, 10).expect("reads").is_empty());
}

/// A tombstone of `id` from `alice` to `bob` under key `k`, superseded by `by`.
fn tombstone(id: MsgId, by: MsgId) -> Vec<u8> {
    Tombstone {
        id,
        from: name("alice"),
        to: Some(name("bob")),
        key: SupersedeKey::new("k").expect("valid key"),
        reason: TombstoneReason::Superseded { by },
    }
    .encode()
}

/// One envelope of kind `kind` at `seq` of this store's stream to `PEER`.
fn own_one(s: &dyn MeshStore, seq: u64, kind: u16, payload: Vec<u8>) -> OpenBatch {
    let env = NewEnvelope {
        lamport: seq,
        created_ms: seq,
        kind,
        payload,
    };
    own_batch(s, seq, vec![env])
}

fn a_superseded_outbox_message_reads_back_as_its_tombstone_and_the_index_says_by_what(
    s: &dyn MeshStore,
) {
    let stream = own_stream_id(s, PEER);
    let id = |seq| MsgId::derive(&node(ME), s.meta().epoch, &node(PEER), seq);
    let message = |seq: u64| AgentEnvelope {
        id: id(seq),
        from: name("alice"),
        to: Some(name("bob")),
        in_reply_to: None,
        key: Some(SupersedeKey::new("k").expect("valid key")),
        body: vec![7; 100],
        receipt: false,
    };
    let sent = |seq| MessageRow {
        dir: MessageDir::Sent,
        stream: stream.clone(),
        seq,
        from: name("alice"),
        ..message_row()
    };
    for seq in 1..=2 {
        commit1(
            s,
            vec![
                WriteOp::AppendOwn {
                    batch: own_one(s, seq, KIND_AGENT, message(seq).encode()),
                    evict: None,
                },
                WriteOp::Agents(AgentOp::Index {
                    stream: stream.clone(),
                    entries: vec![AgentIndex::Message {
                        id: id(seq),
                        seq,
                        row: sent(seq),
                    }],
                }),
            ],
        )
        .expect("commits");
    }
    let original = message(1).encode();
    let tomb = tombstone(id(1), id(2));
    let supersede = |seq, by| WriteOp::Supersede {
        batch: own_one(s, seq, KIND_TOMBSTONE, tombstone(id(seq), id(by))),
        by,
    };
    let err = commit1(s, vec![supersede(2, 2)]).expect_err("only by a later message");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    let err = commit1(s, vec![supersede(1, 3)]).expect_err("only by an appended one");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    commit1(
        s,
        vec![
            supersede(1, 2),
            WriteOp::Agents(AgentOp::Superseded {
                id: id(1),
                by: id(2),
            }),
        ],
    )
    .expect("commits");
    let out = outbox(s, &stream);
    assert_eq!(out.len(), 2);
    assert_eq!(
        out[0].payloads,
        vec![tomb.clone()],
        "the outbox sends the tombstone"
    );
    assert_eq!(out[0].batch.entries[0].kind, KIND_TOMBSTONE);
    let state = own_state(s, &stream).expect("stream");
    let second = message(2).encode().len() as u64;
    assert_eq!((state.msgs, state.bytes), (2, tomb.len() as u64 + second));
    // The journal keeps what was sent there.
    assert!(matches!(
        &journal(s)[0].record,
        JournalRecord::Envelope { seq: 1, kind: KIND_AGENT, payload, .. } if *payload == original
    ));
    let got = s.message(&id(1)).expect("reads").expect("indexed");
    assert_eq!(got.superseded_by, Some(id(2)));
    assert_eq!(got.from, name("alice"));
    assert_eq!(
        s.message(&id(2))
            .expect("reads")
            .expect("indexed")
            .superseded_by,
        None
    );
    // Once acknowledged, a message is the peer's: never replaced.
    commit1(
        s,
        vec![WriteOp::Acked {
            stream: stream.clone(),
            upto: 2,
            reset: false,
        }],
    )
    .expect("commits");
    commit1(
        s,
        vec![WriteOp::AppendOwn {
            batch: own_one(s, 3, KIND_AGENT, message(3).encode()),
            evict: None,
        }],
    )
    .expect("commits");
    let err = commit1(s, vec![supersede(2, 3)]).expect_err("acknowledged");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
}

fn a_received_tombstone_indexes_as_superseded(s: &dyn MeshStore) {
    let env = NewEnvelope {
        lamport: 1,
        created_ms: 1,
        kind: KIND_TOMBSTONE,
        payload: tombstone(peer_id(1), peer_id(2)),
    };
    let batch = peer_batch_of(1, vec![env]);
    commit1(
        s,
        vec![
            WriteOp::Accept { batch, from: 1 },
            WriteOp::Agents(AgentOp::Index {
                stream: peer_stream(PEER),
                entries: vec![
                    AgentIndex::Inbox {
                        agent: name("bob"),
                        seq: 1,
                        row: row(InboxKind::Superseded),
                    },
                    AgentIndex::Message {
                        id: peer_id(1),
                        seq: 1,
                        row: message_row(),
                    },
                ],
            }),
        ],
    )
    .expect("commits");
    let got = s.message(&peer_id(1)).expect("reads").expect("indexed");
    assert_eq!(
        (got.from, got.to, got.superseded_by),
        (name("alice"), Some(name("bob")), Some(peer_id(2)))
    );
    let inbox = s.inbox(&name("bob"), 0, 10).expect("reads");
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].row.kind, InboxKind::Superseded);
}

/// An agent message from `from` at `seq` of this store's stream to `PEER`.
fn own_message(s: &dyn MeshStore, seq: u64, from: &str) -> OpenBatch {
    let payload = AgentEnvelope {
        id: MsgId::derive(&node(ME), s.meta().epoch, &node(PEER), seq),
        from: name(from),
        to: Some(name("bob")),
        in_reply_to: None,
        key: None,
        body: vec![1; 10],
        receipt: false,
    }
    .encode();
    own_one(s, seq, KIND_AGENT, payload)
}

fn append_evicting(batch: OpenBatch, msgs_max: u64) -> WriteOp {
    WriteOp::AppendOwn {
        batch,
        evict: Some(crate::Eviction {
            msgs_max,
            bytes_max: u64::MAX,
            loss: Some("outbox full".into()),
        }),
    }
}

/// The arrivals of `agent`'s inbox after `after`, `limit` at most.
fn arrivals(s: &dyn MeshStore, agent: &str, after: u64, limit: usize) -> Vec<u64> {
    s.inbox(&name(agent), after, limit)
        .expect("reads")
        .iter()
        .map(|i| i.item.arrival)
        .collect()
}

/// The inbox of `agent`: each entry's kind and arrival.
fn inbox_of(s: &dyn MeshStore, agent: &str) -> Vec<(InboxKind, u64)> {
    s.inbox(&name(agent), 0, 100)
        .expect("reads")
        .into_iter()
        .map(|i| (i.row.kind, i.item.arrival))
        .collect()
}

fn an_evicted_agent_message_puts_the_loss_record_in_its_senders_inbox(s: &dyn MeshStore) {
    let names = [
        "alice", "carol", "dave", "erin", "frank", "gina", "hank", "ivy", "jo", "kim",
    ];
    for n in names {
        let record = AgentRecord {
            name: name(n),
            key: node(7),
            uid: 0,
            created_ms: 5,
        };
        commit1(s, vec![WriteOp::Agents(AgentOp::PutAgent(record))]).expect("commits");
    }
    // Committed earlier: alice at 1, carol at 2, a node message at 3.
    commit1(s, vec![append_evicting(own_message(s, 1, "alice"), 10)]).expect("commits");
    commit1(s, vec![append_evicting(own_message(s, 2, "carol"), 10)]).expect("commits");
    commit1(
        s,
        vec![append_evicting(own_one(s, 3, 0, b"node".to_vec()), 10)],
    )
    .expect("commits");
    // Another transaction's groups: a lag record, dave at 4, then erin at 5
    // evicting 1..=4 (dave's batch was journaled by an earlier group of this
    // transaction, after another record).
    let out = s.commit(vec![
        vec![WriteOp::RecordLag {
            subscriber: "sub".into(),
            from: 1,
            to: 1,
        }],
        vec![append_evicting(own_message(s, 4, "dave"), 10)],
        vec![append_evicting(own_message(s, 5, "erin"), 0)],
    ]);
    let receipt = out[2].clone().expect("commits");
    let (loss_at, _) = receipt.arrivals.expect("journals");
    let page = s.journal_page(loss_at - 1, 1, u64::MAX).expect("reads");
    assert!(
        matches!(page[0].record, JournalRecord::Loss { from: 1, to: 4, .. }),
        "{page:?}"
    );
    for agent in ["alice", "carol", "dave"] {
        assert_eq!(
            inbox_of(s, agent),
            vec![(InboxKind::Lost, loss_at)],
            "{agent}"
        );
    }
    // Not lost: erin's own message, and bob (the recipient) is told nothing here.
    assert_eq!(inbox_of(s, "erin"), vec![]);
    assert_eq!(inbox_of(s, "bob"), vec![]);

    // One group appends frank's message and evicts it with the next one.
    let out = s.commit(vec![vec![
        append_evicting(own_message(s, 6, "frank"), 10),
        append_evicting(own_message(s, 7, "gina"), 0),
    ]]);
    let (first, _) = out[0].clone().expect("commits").arrivals.expect("journals");
    // Frank's envelope, then the loss record, then gina's envelope.
    assert_eq!(inbox_of(s, "frank"), vec![(InboxKind::Lost, first + 1)]);
    assert_eq!(inbox_of(s, "erin"), vec![(InboxKind::Lost, first + 1)]);
    assert_eq!(inbox_of(s, "gina"), vec![]);

    // A batch of two, hank's then ivy's, acknowledged up to hank's: only
    // ivy's is lost (gina's, before it, is acknowledged too).
    let stream = own_stream_id(s, PEER);
    let both = |seq: u64| {
        let mut envs = Vec::new();
        for (at, who) in [(seq, "hank"), (seq + 1, "ivy")] {
            let one = own_message(s, at, who);
            envs.push(NewEnvelope {
                lamport: at,
                created_ms: at,
                kind: KIND_AGENT,
                payload: one.payloads()[0].clone(),
            });
        }
        own_batch(s, seq, envs)
    };
    commit1(s, vec![append_evicting(both(8), 10)]).expect("commits");
    commit1(
        s,
        vec![WriteOp::Acked {
            stream,
            upto: 8,
            reset: false,
        }],
    )
    .expect("commits");
    let out = commit1(s, vec![append_evicting(own_message(s, 10, "jo"), 0)]).expect("commits");
    let (loss_at, _) = out.arrivals.expect("journals");
    let page = s.journal_page(loss_at - 1, 1, u64::MAX).expect("reads");
    assert!(
        matches!(page[0].record, JournalRecord::Loss { from: 9, to: 9, .. }),
        "{page:?}"
    );
    assert_eq!(inbox_of(s, "ivy"), vec![(InboxKind::Lost, loss_at)]);
    assert_eq!(inbox_of(s, "hank"), vec![]);
    assert_eq!(inbox_of(s, "gina"), vec![]);

    // An agent removed since it sent is told nothing (as for a bounce);
    // another that is still here is.
    commit1(s, vec![append_evicting(own_message(s, 11, "kim"), 10)]).expect("commits");
    commit1(s, vec![append_evicting(own_message(s, 12, "zed"), 10)]).expect("commits");
    commit1(s, vec![WriteOp::Agents(AgentOp::RemoveAgent(name("kim")))]).expect("commits");
    let out = commit1(s, vec![append_evicting(own_message(s, 13, "jo"), 0)]).expect("commits");
    let (loss_at, _) = out.arrivals.expect("journals");
    assert_eq!(inbox_of(s, "kim"), vec![]);
    assert_eq!(inbox_of(s, "zed"), vec![]);
    assert_eq!(inbox_of(s, "jo"), vec![(InboxKind::Lost, loss_at)]);
}

fn a_trim_forgets_the_messages_of_its_rows_and_the_rest_keep_their_places(s: &dyn MeshStore) {
    // Three 10 KiB messages in one commit: one index row, three journal rows.
    let entries = (1..=3)
        .map(|seq| AgentIndex::Message {
            id: peer_id(seq),
            seq,
            row: message_row(),
        })
        .collect();
    accept_large(s, entries, 1);
    let trim = |bytes_max| WriteOp::Trim {
        now_ms: 1_000_000,
        bytes_max,
        age_ms_max: 0,
    };
    let all = s.journal_bounds().expect("bounds").bytes;
    commit1(s, vec![trim(all - 1)]).expect("trims the oldest row");
    assert_eq!(s.journal_bounds().expect("bounds").first, 2);
    assert_eq!(s.message(&peer_id(1)).expect("reads"), None);
    for seq in 2..=3 {
        let row = s.message(&peer_id(seq)).expect("reads").expect("kept");
        assert_eq!((row.seq, row.arrival, row.undelivered), (seq, seq, None));
    }
    // A later message of the stream is indexed after what is left.
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: agent_batch(4, 1),
                from: 4,
            },
            WriteOp::Agents(AgentOp::Index {
                stream: peer_stream(PEER),
                entries: vec![AgentIndex::Message {
                    id: peer_id(4),
                    seq: 4,
                    row: message_row(),
                }],
            }),
        ],
    )
    .expect("commits");
    let row = s.message(&peer_id(4)).expect("reads").expect("indexed");
    assert_eq!((row.seq, row.arrival), (4, 4));
    commit1(s, vec![trim(0)]).expect("trims everything");
    for seq in 1..=4 {
        assert_eq!(s.message(&peer_id(seq)).expect("reads"), None, "seq {seq}");
    }
}

#[test]
fn a_trim_removes_the_index_rows_of_what_it_takes_from_the_file() {
    let s = crate::RedbStore::in_memory()
        .expect("opens")
        .folding_every_commit();
    let entries = (1..=3)
        .flat_map(|seq| {
            [
                AgentIndex::Message {
                    id: peer_id(seq),
                    seq,
                    row: message_row(),
                },
                AgentIndex::Inbox {
                    agent: name("bob"),
                    seq,
                    row: row(InboxKind::Message),
                },
            ]
        })
        .collect();
    accept_large(&s, entries, 3);
    assert_eq!(s.index_rows(), [1, 1, 1, 0], "one packed row each");
    let trim = |bytes_max| WriteOp::Trim {
        now_ms: 1_000_000,
        bytes_max,
        age_ms_max: 0,
    };
    let all = s.journal_bounds().expect("bounds").bytes;
    commit1(&s, vec![trim(all - 1)]).expect("trims the oldest row");
    assert_eq!(
        s.index_rows(),
        [1, 1, 1, 1],
        "the rows it cuts are rewritten"
    );
    assert_eq!(
        s.inbox(&name("bob"), 0, 10).expect("reads").len(),
        3,
        "told, then 2 and 3"
    );
    commit1(&s, vec![trim(0)]).expect("trims everything");
    assert_eq!(
        s.index_rows(),
        [0, 0, 0, 1],
        "nothing is left of them but the told mark"
    );
}

/// Commits three 10 KiB messages of `PEER` in one commit (one index row,
/// three journal rows) with the index `entries`, message `bounced` marked
/// undeliverable.
fn accept_large(s: &dyn MeshStore, entries: Vec<AgentIndex>, bounced: u64) {
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: agent_batch_of(1, 3, &[7; 10 << 10]),
                from: 1,
            },
            WriteOp::Agents(AgentOp::Index {
                stream: peer_stream(PEER),
                entries,
            }),
            WriteOp::Agents(AgentOp::Bounced {
                id: peer_id(bounced),
                reason: BounceReason::NoSuchAgent,
            }),
        ],
    )
    .expect("commits");
}

/// The agent index held in journal rows between folds (schema 5): what the
/// readers see is the same before and after a fold, across a reopen, and
/// in a file a schema 4 build wrote.
mod fold {
    use super::*;
    use crate::RedbStore;

    /// `PEER`'s agent messages `first..first + n` to bob, each in bob's
    /// inbox and the message index, in one commit.
    fn accept_indexed(s: &dyn MeshStore, first: u64, n: u64) {
        let entries = (first..first + n)
            .flat_map(|seq| {
                [
                    AgentIndex::Message {
                        id: peer_id(seq),
                        seq,
                        row: MessageRow {
                            seq,
                            ..message_row()
                        },
                    },
                    AgentIndex::Inbox {
                        agent: name("bob"),
                        seq,
                        row: row(InboxKind::Message),
                    },
                ]
            })
            .collect();
        commit1(
            s,
            vec![
                WriteOp::Accept {
                    batch: agent_batch(first, n),
                    from: first,
                },
                index_peer(entries),
            ],
        )
        .expect("commits");
    }

    /// Bob's inbox arrivals after `after`, `limit` at most.
    fn bob(s: &dyn MeshStore, after: u64, limit: usize) -> Vec<u64> {
        arrivals(s, "bob", after, limit)
    }

    /// Where the message index puts `PEER`'s message `seq`: (seq, arrival).
    fn place(s: &dyn MeshStore, seq: u64) -> Option<(u64, u64)> {
        s.message(&peer_id(seq))
            .expect("reads")
            .map(|m| (m.seq, m.arrival))
    }

    /// An in-memory store that folds after 8 arrivals.
    fn folding_after_8() -> RedbStore {
        RedbStore::in_memory()
            .expect("opens")
            .folding_after(8, u64::MAX)
    }

    fn open(dir: &std::path::Path) -> RedbStore {
        RedbStore::open(dir)
            .expect("opens")
            .folding_after(8, u64::MAX)
    }

    #[test]
    fn entries_travel_in_journal_rows_until_a_fold_and_read_the_same_across_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path());
        let mem = crate::MemStore::new(Epoch([9; 16]));
        let both = |f: &dyn Fn(&dyn MeshStore)| {
            f(&s);
            f(&mem);
        };
        both(&|s| accept_indexed(s, 1, 3));
        assert_eq!(s.index_rows(), [0, 0, 0, 0], "nothing in the tables yet");
        let (through, entries, _) = s.index_fold();
        assert_eq!((through, entries), (0, 6));
        assert_eq!(bob(&s, 0, 10), [1, 2, 3]);
        assert_eq!(bob(&s, 1, 1), [2]);
        assert_eq!(place(&s, 2), Some((2, 2)));
        assert_eq!(place(&s, 4), None);
        // A reopen reads them from the rows again.
        drop(s);
        let s = open(dir.path());
        assert_eq!(bob(&s, 0, 10), [1, 2, 3]);
        assert_eq!(place(&s, 3), Some((3, 3)));
        // Two more commits: the second reaches 8 arrivals since the last
        // fold (at 0) and folds all three into one row of each table.
        let both = |f: &dyn Fn(&dyn MeshStore)| {
            f(&s);
            f(&mem);
        };
        both(&|s| accept_indexed(s, 4, 3));
        assert_eq!(s.index_rows(), [0, 0, 0, 0]);
        both(&|s| accept_indexed(s, 7, 3));
        assert_eq!(s.index_rows(), [1, 1, 0, 0], "one packed row each");
        assert_eq!(s.index_fold(), (9, 0, 0));
        // Then some in the rows again: a page crosses from table to rows.
        both(&|s| accept_indexed(s, 10, 2));
        assert_eq!(s.index_fold().1, 4);
        assert_eq!(bob(&s, 8, 2), [9, 10]);
        assert_eq!(bob(&s, 0, 100), (1..=11).collect::<Vec<_>>());
        for seq in 1..=12 {
            assert_eq!(place(&s, seq), place(&mem, seq), "message {seq}");
        }
        for (after, limit) in [(0, 100), (0, 5), (5, 3), (9, 100), (11, 1)] {
            assert_eq!(
                s.inbox(&name("bob"), after, limit).expect("reads"),
                mem.inbox(&name("bob"), after, limit).expect("reads"),
                "after {after}, {limit} at most"
            );
        }
    }

    #[test]
    fn a_removed_agent_loses_the_entries_rows_hold_and_they_do_not_come_back_at_a_fold() {
        let s = folding_after_8();
        accept_indexed(&s, 1, 3);
        commit1(&s, vec![WriteOp::Agents(AgentOp::RemoveAgent(name("bob")))]).expect("removes");
        assert_eq!(bob(&s, 0, 10), Vec::<u64>::new());
        assert_eq!(s.index_fold().1, 0, "the removal folded first");
        accept_indexed(&s, 4, 6);
        assert_eq!(bob(&s, 0, 10), [4, 5, 6, 7, 8, 9], "only the later ones");
        assert_eq!(
            place(&s, 1),
            Some((1, 1)),
            "the message index keeps its places"
        );
        // A fold (8 arrivals since the removal's at 3) brings none back.
        accept_indexed(&s, 10, 2);
        assert_eq!(s.index_fold(), (11, 0, 0), "folded");
        assert_eq!(bob(&s, 0, 10), [4, 5, 6, 7, 8, 9, 10, 11]);
    }

    #[test]
    fn a_fold_is_due_by_bytes_as_well_as_by_arrivals() {
        let s = RedbStore::in_memory()
            .expect("opens")
            .folding_after(u64::MAX, 1);
        accept_indexed(&s, 1, 3);
        assert_eq!(
            s.index_fold().1,
            6,
            "held: no row bytes since the last fold"
        );
        accept_indexed(&s, 4, 3);
        assert_eq!(
            s.index_fold(),
            (6, 0, 0),
            "the rows' bytes passed the bound"
        );
        assert_eq!(s.index_rows()[..2], [1, 1]);
        assert_eq!(bob(&s, 0, 10), [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_trim_of_folded_rows_leaves_the_rows_after_the_fold_holding_their_entries() {
        let s = folding_after_8();
        accept_indexed(&s, 1, 3);
        accept_indexed(&s, 4, 6);
        assert_eq!(s.index_fold().0, 9, "folded");
        accept_indexed(&s, 10, 2);
        // The oldest row goes (arrivals 1..=3), with its index entries.
        let all = s.journal_bounds().expect("bounds").bytes;
        let trim = WriteOp::Trim {
            now_ms: 1_000_000,
            bytes_max: all - 1,
            age_ms_max: 0,
        };
        commit1(&s, vec![trim]).expect("trims");
        assert_eq!(s.journal_bounds().expect("bounds").first, 4);
        assert_eq!(
            s.index_fold().1,
            4,
            "the rows after the fold still hold theirs"
        );
        let got = bob(&s, 0, 100);
        assert_eq!(
            got[1..],
            [4, 5, 6, 7, 8, 9, 10, 11],
            "told of the trim first: {got:?}"
        );
        assert_eq!(place(&s, 1), None, "its message rows went with it");
        assert_eq!(place(&s, 11), Some((11, 11)));
    }

    #[test]
    fn a_commit_indexing_an_id_that_is_not_its_streams_own_goes_to_the_tables() {
        let s = folding_after_8();
        add_kim(&s);
        let id = MsgId([7; 16]);
        commit1(
            &s,
            vec![
                accept_forwards(1, &[id]),
                index_peer(vec![forwarded(id, 1)]),
            ],
        )
        .expect("commits");
        assert_eq!(
            s.index_fold(),
            (1, 0, 0),
            "a forward carries its author's id"
        );
        assert_eq!(s.index_rows()[..2], [1, 1]);
        assert_eq!(s.message(&id).expect("reads").expect("indexed").seq, 1);
    }

    /// A data dir as the store of schema 4 left it: written by the build
    /// at commit aac6955 (its store tests with a scratch test, run on an
    /// empty dir), in four commits: agents kim and bob; `PEER`'s agent
    /// messages 1..=3 to bob, each in bob's inbox and the message index
    /// (arrivals 1..=3); this node's agent message 1 from bob to `PEER`,
    /// in the message index as sent (arrival 4).
    const STORE_V4_AGENTS: &[u8] = include_bytes!("data/store-v4-agents.redb");

    #[test]
    fn a_store_written_before_read_receipts_reads_no_mark_and_takes_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(crate::STORE_FILE_NAME), STORE_V4_AGENTS).expect("write");
        let s = open(dir.path());
        let own = MsgId::derive(&node(ME), s.meta().epoch, &node(PEER), 1);
        let sent = s.message(&own).expect("reads").expect("indexed");
        assert_eq!(sent.read, None, "no read-v1 table: nothing marked");
        let entry = AgentIndex::Read {
            agent: name("bob"),
            seq: 4,
            mark: crate::ReadMark {
                node: node(PEER),
                reader: name("kim"),
                read_ms: 7,
            },
            ids: vec![own],
        };
        let r = accept_receipt(&s, 4, entry);
        assert_eq!(r.read.marked, 1);
        drop(s);
        let s = open(dir.path());
        let sent = s.message(&own).expect("reads").expect("indexed");
        assert_eq!(sent.read.map(|m| m.reader), Some(name("kim")));
        assert_eq!(
            s.inbox(&name("bob"), 3, 10).expect("reads")[0].row.kind,
            InboxKind::Read
        );
    }

    #[test]
    fn a_schema_4_store_with_agents_is_migrated_and_reads_its_index_beside_new_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(crate::STORE_FILE_NAME), STORE_V4_AGENTS).expect("write");
        let s = open(dir.path());
        assert_eq!(s.meta().schema_version, crate::SCHEMA_VERSION);
        assert_eq!(s.index_fold(), (4, 0, 0), "all in the tables");
        assert_eq!(s.index_rows()[..2], [1, 2], "as schema 4 wrote them");
        assert_eq!(bob(&s, 0, 10), [1, 2, 3]);
        assert_eq!(place(&s, 2), Some((2, 2)));
        let own = MsgId::derive(&node(ME), s.meta().epoch, &node(PEER), 1);
        let sent = s.message(&own).expect("reads").expect("indexed");
        assert_eq!((sent.dir, sent.seq, sent.arrival), (MessageDir::Sent, 1, 4));
        assert_eq!(sent.from, name("bob"));
        // New entries go in the rows, and read after the old ones.
        accept_indexed(&s, 4, 2);
        assert_eq!(s.index_fold().1, 4);
        assert_eq!(bob(&s, 0, 10), [1, 2, 3, 5, 6]);
        assert_eq!(bob(&s, 2, 2), [3, 5]);
        drop(s);
        let s = open(dir.path());
        assert_eq!(bob(&s, 0, 10), [1, 2, 3, 5, 6]);
        assert_eq!(place(&s, 5), Some((5, 6)));
        accept_indexed(&s, 6, 8);
        assert_eq!(s.index_fold().1, 0, "folded");
        assert_eq!(
            bob(&s, 0, 100),
            [1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
        );
        assert_eq!(place(&s, 13), Some((13, 14)));
        assert_eq!(place(&s, 1), Some((1, 1)));
    }
}
