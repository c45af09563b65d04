//! Agents through two cores: agent messages to inboxes, bounces, retried
//! sends, cards.

use mesh_protocol::{AgentCard, AgentEnvelope, AgentName, KIND_AGENT, MsgId, SecretKey};
use mesh_store::{AgentRecord, InboxKind, MessageDir};

use super::*;
use crate::core::SendMeta;

fn name(s: &str) -> AgentName {
    AgentName::new(s).expect("valid name")
}

/// The agent key of `agent` on node `n`.
fn agent_key(n: u8, agent: &str) -> SecretKey {
    let mut b = [n; 32];
    for (i, c) in agent.bytes().enumerate().take(31) {
        b[i + 1] = c;
    }
    SecretKey::from_bytes(&b)
}

impl Node {
    /// Adds the agent `agent` to this node and announces its card.
    fn add_agent(&mut self, agent: &str) {
        let req = self.take_req();
        let record = AgentRecord {
            name: name(agent),
            key: agent_key(self.n, agent).public(),
            uid: 0,
            created_ms: 1,
        };
        self.run(Input::Write {
            req,
            write: LocalWrite::PutAgent(record),
        });
        let card = AgentCard::sign(&agent_key(self.n, agent), self.id(), name(agent), true, 1);
        self.run(Input::AgentCard { card });
    }

    fn send_as(&mut self, to: NodeId, meta: SendMeta, body: &[u8]) -> ReqId {
        let req = self.take_req();
        self.run(Input::SendWith {
            req,
            to,
            kind: 0,
            payload: body.to_vec(),
            meta,
        });
        req
    }

    fn inbox(&self, agent: &str) -> Vec<mesh_store::InboxItem> {
        self.store
            .inbox(&name(agent), 0, 100)
            .expect("mem store reads")
    }
}

impl Pair {
    /// Sends from node 1 as `meta` says; frames are exchanged until quiet.
    fn send_as_a(&mut self, meta: SendMeta, body: &[u8]) -> ReqId {
        let mark = self.a.sent.len();
        let to = self.b.id();
        let req = self.a.send_as(to, meta, body);
        let mut to_b: Vec<_> = self.a.sent[mark..].to_vec();
        self.exchange(&mut to_b, &mut Vec::new());
        req
    }
}

fn from_to(from: &str, to: Option<&str>) -> SendMeta {
    SendMeta {
        from: Some(name(from)),
        to: to.map(name),
        ..SendMeta::default()
    }
}

fn agents_pair() -> Pair {
    let mut p = Pair::new(Config::default());
    p.a.add_agent("alice");
    p.b.add_agent("bob");
    p.connect();
    p
}

fn body_of(item: &mesh_store::InboxItem) -> AgentEnvelope {
    match &item.item.record {
        JournalRecord::Envelope { kind, payload, .. } if *kind == KIND_AGENT => {
            AgentEnvelope::decode(payload).expect("an agent envelope")
        }
        other => panic!("not an agent message: {other:?}"),
    }
}

#[test]
fn an_agent_message_goes_to_its_recipients_inbox_with_the_id_its_author_assigned() {
    let mut p = agents_pair();
    let req = p.send_as_a(from_to("alice", Some("bob")), b"hi bob");
    let receipt = match p.a.reply(req) {
        Some(Ok(r)) => r.clone(),
        other => panic!("not sent: {other:?}"),
    };
    let id = MsgId::derive(&p.a.id(), epoch(1), &p.b.id(), receipt.seq);
    let inbox = p.b.inbox("bob");
    assert_eq!(inbox.len(), 1);
    let e = body_of(&inbox[0]);
    assert_eq!(
        (e.id, e.from, e.body),
        (id, name("alice"), b"hi bob".to_vec())
    );
    assert_eq!(inbox[0].row.kind, InboxKind::Message);
    assert!(inbox[0].row.verified, "alice was announced");
    assert!(
        p.a.inbox("alice").is_empty(),
        "a sent message is in no inbox"
    );
    let sent = p.a.store.message(&id).expect("reads").expect("indexed");
    assert_eq!((sent.dir, sent.seq), (MessageDir::Sent, receipt.seq));
    let got = p.b.store.message(&id).expect("reads").expect("indexed");
    assert_eq!((got.dir, got.undelivered), (MessageDir::Received, None));
    assert_eq!(p.b.core.metrics().agents.delivered, 1);
}

#[test]
fn a_message_for_an_agent_the_peer_does_not_host_is_journaled_there_and_bounced_to_its_sender() {
    let mut p = agents_pair();
    let req = p.send_as_a(from_to("alice", Some("carol")), b"anyone?");
    let seq = ok_seq(p.a.reply(req));
    let id = MsgId::derive(&p.a.id(), epoch(1), &p.b.id(), seq);
    // Journaled at b, in no inbox, marked undeliverable.
    assert_eq!(p.b.received(&stream(1, 1, 2)).len(), 1);
    assert!(p.b.inbox("bob").is_empty());
    let row = p.b.store.message(&id).expect("reads").expect("indexed");
    assert_eq!(
        row.undelivered,
        Some(mesh_protocol::BounceReason::NoSuchAgent)
    );
    // The bounce came back to alice's inbox, and marks her message.
    let inbox = p.a.inbox("alice");
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    assert_eq!(inbox[0].row.kind, InboxKind::Bounce);
    let JournalRecord::Envelope { payload, .. } = &inbox[0].item.record else {
        panic!("a bounce is an envelope");
    };
    let bounce = mesh_protocol::Bounce::decode(payload).expect("a bounce");
    assert_eq!((bounce.id, bounce.missing), (id, Some(name("carol"))));
    let row = p.a.store.message(&id).expect("reads").expect("indexed");
    assert_eq!(
        row.undelivered,
        Some(mesh_protocol::BounceReason::NoSuchAgent)
    );
    assert_eq!(p.b.core.metrics().agents.bounces_sent, 1);
    // Nobody was answered for the bounce.
    assert!(p.b.replies.is_empty(), "{:?}", p.b.replies);
}

#[test]
fn a_retry_with_the_same_client_id_gets_the_first_receipt_and_is_not_sent_again() {
    let mut p = agents_pair();
    let meta = || SendMeta {
        client_id: Some("job-1".into()),
        ..from_to("alice", Some("bob"))
    };
    // Two sends with one id in the same turn: only one is ever written.
    let to = p.b.id();
    let (r1, r2) = (ReqId(900), ReqId(901));
    let inputs = [r1, r2]
        .into_iter()
        .map(|req| Input::SendWith {
            req,
            to,
            kind: 0,
            payload: b"once".to_vec(),
            meta: meta(),
        })
        .collect();
    let mark = p.a.sent.len();
    p.a.run_many(inputs);
    let mut to_b: Vec<_> = p.a.sent[mark..].to_vec();
    p.exchange(&mut to_b, &mut Vec::new());
    let first = p.a.reply(r1).cloned().expect("answered").expect("sent");
    assert_eq!(p.a.reply(r2), Some(&Ok(first.clone())));
    // A later retry, and one after a restart, get the same receipt.
    let r3 = p.send_as_a(meta(), b"once");
    assert_eq!(p.a.reply(r3), Some(&Ok(first.clone())));
    p.disconnect();
    p.a.restart();
    p.connect();
    let r4 = p.send_as_a(meta(), b"once");
    assert_eq!(p.a.reply(r4), Some(&Ok(first.clone())));
    assert_eq!(p.b.inbox("bob").len(), 1, "delivered once");
    // The same id for another message is refused.
    let r5 = p.send_as_a(meta(), b"twice");
    assert!(matches!(
        p.a.reply(r5),
        Some(Err(SendError::ClientIdReused { .. }))
    ));
    assert_eq!(p.b.inbox("bob").len(), 1);
}

/// A retry must repeat the first send exactly, its ask for a read receipt
/// too: the same client id with and without `receipt` is two messages.
#[test]
fn a_retry_that_differs_only_in_asking_a_receipt_is_refused_as_another_message() {
    let mut p = agents_pair();
    let meta = |receipt| SendMeta {
        client_id: Some("job-7".into()),
        receipt,
        ..from_to("alice", Some("bob"))
    };
    let first = p.send_as_a(meta(false), b"report");
    let sent = p.a.reply(first).cloned().expect("answered").expect("sent");
    let same = p.send_as_a(meta(false), b"report");
    assert_eq!(p.a.reply(same), Some(&Ok(sent)));
    let asks = p.send_as_a(meta(true), b"report");
    assert!(matches!(
        p.a.reply(asks),
        Some(Err(SendError::ClientIdReused { .. }))
    ));
    assert_eq!(p.b.inbox("bob").len(), 1, "sent once");
}

#[test]
fn a_retry_record_expires_after_the_window() {
    let config = Config {
        dedup_window_ms: 10_000,
        ..Config::default()
    };
    let mut p = Pair::new(config);
    p.a.add_agent("alice");
    p.b.add_agent("bob");
    p.connect();
    let meta = || SendMeta {
        client_id: Some("job-1".into()),
        ..from_to("alice", Some("bob"))
    };
    let r1 = p.send_as_a(meta(), b"x");
    let first = ok_seq(p.a.reply(r1));
    p.a.now = p.a.now.plus(20_000);
    p.send_as_a(from_to("alice", Some("bob")), b"other");
    assert!(
        p.a.store.dedup().expect("reads").is_empty(),
        "expired in the store"
    );
    let r2 = p.send_as_a(meta(), b"x");
    assert!(ok_seq(p.a.reply(r2)) > first, "sent again after the window");
}

#[test]
fn a_message_from_an_agent_its_node_never_announced_is_delivered_marked_unverified() {
    let mut p = Pair::new(Config::default());
    p.b.add_agent("bob");
    // Alice is an agent of node 1, but its card was never signed.
    let record = AgentRecord {
        name: name("alice"),
        key: agent_key(1, "alice").public(),
        uid: 0,
        created_ms: 1,
    };
    p.a.run(Input::Write {
        req: ReqId(50),
        write: LocalWrite::PutAgent(record),
    });
    p.connect();
    p.send_as_a(from_to("alice", Some("bob")), b"trust me");
    let inbox = p.b.inbox("bob");
    assert_eq!(inbox.len(), 1);
    assert!(!inbox[0].row.verified);
    assert_eq!(p.b.core.metrics().agents.unverified_senders, 1);
}

#[test]
fn an_agents_frame_with_another_nodes_card_is_refused_whole() {
    let mut p = agents_pair();
    let conn = p.conn.expect("connected");
    let mine = AgentCard::sign(&agent_key(1, "x"), id(1), name("x"), true, 5);
    let stolen = AgentCard::sign(&agent_key(3, "y"), id(3), name("y"), true, 5);
    p.b.frame(
        1,
        conn,
        Frame::Agents {
            cards: vec![mine, stolen],
        },
    );
    assert_eq!(p.b.core.metrics().agents.cards_refused, 1);
    let known: Vec<String> =
        p.b.core
            .peer_agent_cards(id(1))
            .iter()
            .map(|c| c.name.to_string())
            .collect();
    assert_eq!(known, ["alice"], "what node 1 announced before stands");
}

#[test]
fn cards_are_announced_after_the_hello_and_again_when_an_agent_goes() {
    let mut p = agents_pair();
    assert_eq!(p.b.core.peer_agent_cards(id(1)).len(), 1);
    let mark = p.a.sent.len();
    p.a.run(Input::Write {
        req: ReqId(77),
        write: LocalWrite::RemoveAgent(name("alice")),
    });
    let mut to_b: Vec<_> = p.a.sent[mark..].to_vec();
    assert!(
        to_b.iter()
            .any(|(_, _, f)| matches!(f, Frame::Agents { cards } if cards.is_empty())),
        "{to_b:?}"
    );
    p.exchange(&mut to_b, &mut Vec::new());
    assert!(p.b.core.peer_agent_cards(id(1)).is_empty());
    // Sending as a removed agent is refused, and nothing is written.
    let head = p.a.store.journal_head().expect("reads");
    let req = p.send_as_a(from_to("alice", Some("bob")), b"ghost");
    assert!(matches!(
        p.a.reply(req),
        Some(Err(SendError::UnknownAgent(_)))
    ));
    assert_eq!(p.a.store.journal_head().expect("reads"), head);
}

#[test]
fn a_plain_message_of_a_mesh_kind_is_refused() {
    let mut p = agents_pair();
    let req = ReqId(5);
    p.a.run(Input::Send {
        req,
        to: id(2),
        kind: KIND_AGENT,
        payload: b"forged".to_vec(),
    });
    assert!(matches!(
        p.a.reply(req),
        Some(Err(SendError::ReservedKind(1)))
    ));
}

#[test]
fn an_agent_message_between_agents_of_one_node_is_delivered_in_the_commit_that_writes_it() {
    let mut n = Node::new(1, 1, &[], Config::default());
    n.add_agent("alice");
    n.add_agent("bob");
    let me = n.id();
    let req = n.send_as(me, from_to("alice", Some("bob")), b"next door");
    let seq = ok_seq(n.reply(req));
    let inbox = n.inbox("bob");
    assert_eq!(inbox.len(), 1);
    assert_eq!(body_of(&inbox[0]).body, b"next door");
    let own = n
        .store
        .own_streams()
        .expect("reads")
        .into_iter()
        .find(|o| o.stream.channel == Channel::Direct(me))
        .expect("a stream to itself");
    assert_eq!(own.last_acked, seq, "delivered as it was written");
    // An agent this node does not host, or no agent at all, is refused.
    let head = n.store.journal_head().expect("reads");
    let r1 = n.send_as(me, from_to("alice", Some("carol")), b"?");
    assert!(matches!(
        n.reply(r1),
        Some(Err(SendError::NoSuchLocalAgent(Some(_))))
    ));
    let r2 = n.send_as(me, from_to("alice", None), b"?");
    assert!(matches!(
        n.reply(r2),
        Some(Err(SendError::NoSuchLocalAgent(None)))
    ));
    assert_eq!(
        n.store.journal_head().expect("reads"),
        head,
        "nothing written"
    );
}

/// `from_to` with the supersede key `key`.
fn keyed(from: &str, to: &str, key: &str) -> SendMeta {
    SendMeta {
        key: Some(mesh_protocol::SupersedeKey::new(key).expect("valid key")),
        ..from_to(from, Some(to))
    }
}

/// The kinds of the inbox entries of `agent` on `node`.
fn inbox_kinds(node: &Node, agent: &str) -> Vec<InboxKind> {
    node.inbox(agent).iter().map(|i| i.row.kind).collect()
}

/// Whether `node` committed an outbox replacement (a queued keyed
/// message's tombstone in its place).
fn replaced_in_outbox(node: &Node) -> bool {
    node.persists
        .iter()
        .flatten()
        .flatten()
        .any(|op| matches!(op, WriteOp::Supersede { .. }))
}

/// The tombstone in the journal entry of `item`.
fn tombstone_of(item: &mesh_store::InboxItem) -> mesh_protocol::Tombstone {
    match &item.item.record {
        JournalRecord::Envelope { kind, payload, .. } if *kind == mesh_protocol::KIND_TOMBSTONE => {
            mesh_protocol::Tombstone::decode(payload).expect("a tombstone")
        }
        other => panic!("not a tombstone: {other:?}"),
    }
}

#[test]
fn a_keyed_send_waiting_with_a_newer_one_of_its_key_is_committed_as_its_tombstone() {
    let mut p = agents_pair();
    p.a.hold_commits = true;
    let to = p.b.id();
    // The first commit is in flight: the next sends wait for it.
    let n = p.a.persists.len();
    p.a.send_as(to, from_to("alice", Some("bob")), b"plain");
    let old = p.a.send_as(to, keyed("alice", "bob", "status"), b"busy");
    let other = p.a.send_as(to, keyed("alice", "bob", "load"), b"0.5");
    let new = p.a.send_as(to, keyed("alice", "bob", "status"), b"idle");
    p.a.release_commit();
    // Each keyed message (or tombstone) is a batch of its own.
    assert_eq!(appends(&p.a.persists[n + 1]), vec![(2, 1), (3, 1), (4, 1)]);
    p.a.release_commit();
    let me = p.a.id();
    let id = |seq| MsgId::derive(&me, epoch(1), &to, seq);
    let Some(Ok(r)) = p.a.reply(old) else {
        panic!("the superseded send is answered, not refused");
    };
    assert_eq!((r.seq, r.superseded_by), (2, Some(id(4))));
    assert_eq!(ok_seq(p.a.reply(other)), 3);
    let Some(Ok(r)) = p.a.reply(new) else {
        panic!("sent");
    };
    assert_eq!((r.seq, r.superseded_by), (4, None));
    let row = p.a.store.message(&id(2)).expect("reads").expect("indexed");
    assert_eq!(row.superseded_by, Some(id(4)), "mesh message says so");
    // The peer gets the tombstone in the message's place.
    let mut to_b = p.a.sent.clone();
    p.exchange(&mut to_b, &mut Vec::new());
    use InboxKind::{Message, Superseded};
    assert_eq!(
        inbox_kinds(&p.b, "bob"),
        vec![Message, Superseded, Message, Message]
    );
    let inbox = p.b.inbox("bob");
    let t = tombstone_of(&inbox[1]);
    assert_eq!(
        (t.id, t.from, t.key.as_str()),
        (id(2), name("alice"), "status")
    );
    assert_eq!(
        t.reason,
        mesh_protocol::TombstoneReason::Superseded { by: id(4) }
    );
    assert_eq!(body_of(&inbox[3]).body, b"idle".to_vec());
    let got = p.b.store.message(&id(2)).expect("reads").expect("indexed");
    assert_eq!(got.superseded_by, Some(id(4)));
    assert_eq!(p.a.core.metrics().agents.superseded, 1);
    assert_eq!(p.b.core.metrics().agents.tombstones_received, 1);
}

#[test]
fn a_queued_keyed_message_never_sent_is_replaced_by_its_tombstone_in_the_outbox() {
    let mut p = agents_pair();
    p.disconnect();
    let to = p.b.id();
    let me = p.a.id();
    let id = |seq| MsgId::derive(&me, epoch(1), &to, seq);
    let first = p.a.send_as(to, keyed("alice", "bob", "status"), b"v1");
    let second = p.a.send_as(to, keyed("alice", "bob", "status"), b"v2");
    let third = p.a.send_as(to, keyed("alice", "bob", "status"), b"v3");
    for (req, seq) in [(first, 1), (second, 2), (third, 3)] {
        let Some(Ok(r)) = p.a.reply(req) else {
            panic!("committed");
        };
        assert_eq!(
            (r.seq, r.superseded_by),
            (seq, None),
            "answered when committed"
        );
    }
    let supersedes: Vec<Seq> =
        p.a.persists
            .iter()
            .flatten()
            .flatten()
            .filter_map(|op| match op {
                WriteOp::Supersede { batch, by } => {
                    assert_eq!(*by, batch.batch().first_seq() + 1);
                    Some(batch.batch().first_seq())
                }
                _ => None,
            })
            .collect();
    assert_eq!(supersedes, vec![1, 2]);
    for seq in [1, 2] {
        let row =
            p.a.store
                .message(&id(seq))
                .expect("reads")
                .expect("indexed");
        assert_eq!(row.superseded_by, Some(id(seq + 1)));
    }
    p.connect();
    use InboxKind::{Message, Superseded};
    assert_eq!(
        inbox_kinds(&p.b, "bob"),
        vec![Superseded, Superseded, Message]
    );
    let inbox = p.b.inbox("bob");
    assert_eq!(tombstone_of(&inbox[0]).id, id(1));
    assert_eq!(body_of(&inbox[2]).body, b"v3".to_vec());
    assert_eq!(
        p.b.core.metrics().dropped.total(),
        0,
        "every batch verified"
    );
    assert_eq!(p.a.own_acked(), 3);
    assert_eq!(p.a.core.metrics().agents.superseded, 2);
}

#[test]
fn a_keyed_message_already_handed_to_the_peer_is_never_replaced() {
    let mut p = agents_pair();
    let to = p.b.id();
    p.send_as_a(keyed("alice", "bob", "status"), b"v1");
    // Sent, not yet acknowledged: the peer may hold it.
    p.disconnect();
    p.a.send_as(to, keyed("alice", "bob", "status"), b"v2");
    let replaced = replaced_in_outbox(&p.a);
    assert!(!replaced, "a message that went out stays as it was");
    p.connect();
    assert_eq!(
        inbox_kinds(&p.b, "bob"),
        vec![InboxKind::Message, InboxKind::Message]
    );
}

/// A decision, not a gap closed (`docs/design.md`, "Supersede"): the core
/// remembers keyed messages committed in this process's life only, because
/// one committed before a restart may have been handed to the peer before
/// it (what went out is not known after a crash) and a replaced envelope
/// the peer held would be a fork. So after a restart a newer message of
/// the key is sent beside the older one, and the recipient gets both.
#[test]
fn after_a_restart_a_keyed_message_queued_before_it_is_not_replaced_and_both_arrive() {
    let mut p = agents_pair();
    p.disconnect();
    let to = p.b.id();
    let old = p.a.send_as(to, keyed("alice", "bob", "status"), b"busy");
    assert_eq!(ok_seq(p.a.reply(old)), 1);
    p.a.restart();
    let new = p.a.send_as(to, keyed("alice", "bob", "status"), b"idle");
    let Some(Ok(r)) = p.a.reply(new) else {
        panic!("sent");
    };
    assert_eq!((r.seq, r.superseded_by), (2, None));
    let replaced = replaced_in_outbox(&p.a);
    assert!(
        !replaced,
        "nothing committed before the restart is replaced"
    );
    let me = p.a.id();
    let row =
        p.a.store
            .message(&MsgId::derive(&me, epoch(1), &to, 1))
            .expect("reads")
            .expect("indexed");
    assert_eq!(row.superseded_by, None, "mesh message says it was sent");
    p.connect();
    assert_eq!(
        inbox_kinds(&p.b, "bob"),
        vec![InboxKind::Message, InboxKind::Message]
    );
    let bodies: Vec<Vec<u8>> = p.b.inbox("bob").iter().map(|i| body_of(i).body).collect();
    assert_eq!(bodies, vec![b"busy".to_vec(), b"idle".to_vec()]);
    assert_eq!(p.a.core.metrics().agents.superseded, 0);
}

#[test]
fn a_supersede_key_on_a_plain_message_is_refused() {
    let mut p = agents_pair();
    let to = p.b.id();
    let meta = SendMeta {
        key: Some(mesh_protocol::SupersedeKey::new("k").expect("valid key")),
        ..SendMeta::default()
    };
    let req = p.a.send_as(to, meta, b"x");
    assert!(matches!(
        p.a.reply(req),
        Some(Err(SendError::NotAnAgentMessage))
    ));
}

/// A retry by client id of a held send that a newer one of its key
/// superseded is answered as the first send was, `superseded_by` and all,
/// in the same life of the core and after a restart.
#[test]
fn a_retry_of_a_superseded_held_send_says_what_superseded_it_also_after_a_restart() {
    let mut p = agents_pair();
    p.disconnect();
    let to = p.b.id();
    let with_id = || SendMeta {
        client_id: Some("status-1".into()),
        ..keyed("alice", "bob", "status")
    };
    p.a.hold_commits = true;
    p.a.store.set_unavailable(true);
    let old = p.a.send_as(to, with_id(), b"v1");
    p.a.release_commit();
    let new = p.a.send_as(to, keyed("alice", "bob", "status"), b"v2");
    p.a.store.set_unavailable(false);
    p.a.now = p.a.now.plus(p.a.config.store_retry_ms);
    p.a.run(Input::Timer);
    p.a.release_commit();
    p.a.hold_commits = false;
    let me = p.a.id();
    let first = p.a.reply(old).cloned().expect("answered").expect("sent");
    assert_eq!(
        first.superseded_by,
        Some(MsgId::derive(&me, epoch(1), &to, 2))
    );
    assert_eq!(ok_seq(p.a.reply(new)), 2);
    let retry = p.a.send_as(to, with_id(), b"v1");
    assert_eq!(p.a.reply(retry), Some(&Ok(first.clone())));
    p.a.restart();
    let after = p.a.send_as(to, with_id(), b"v1");
    assert_eq!(
        p.a.reply(after),
        Some(&Ok(first)),
        "the same answer after a restart"
    );
}

#[test]
fn keyed_sends_held_through_a_store_outage_commit_as_a_tombstone_and_the_newest() {
    let mut p = agents_pair();
    p.disconnect();
    let to = p.b.id();
    p.a.hold_commits = true;
    p.a.store.set_unavailable(true);
    let old = p.a.send_as(to, keyed("alice", "bob", "status"), b"v1");
    p.a.release_commit();
    let new = p.a.send_as(to, keyed("alice", "bob", "status"), b"v2");
    assert!(p.a.reply(old).is_none() && p.a.reply(new).is_none(), "held");
    p.a.store.set_unavailable(false);
    p.a.now = p.a.now.plus(p.a.config.store_retry_ms);
    p.a.run(Input::Timer);
    p.a.release_commit();
    let me = p.a.id();
    let id = |seq| MsgId::derive(&me, epoch(1), &to, seq);
    let Some(Ok(r)) = p.a.reply(old) else {
        panic!("answered once the store is back");
    };
    assert_eq!((r.seq, r.superseded_by), (1, Some(id(2))));
    assert_eq!(ok_seq(p.a.reply(new)), 2);
    assert_eq!(
        p.a.replies.iter().filter(|(q, _)| *q == old).count(),
        1,
        "answered once"
    );
    p.a.hold_commits = false;
    p.connect();
    assert_eq!(
        inbox_kinds(&p.b, "bob"),
        vec![InboxKind::Superseded, InboxKind::Message]
    );
}

impl Pair {
    /// Sends a plain message of `kind` from node 2 to node 1 with `meta`;
    /// frames are exchanged until quiet.
    fn send_from_b(&mut self, kind: u16, meta: SendMeta, payload: Vec<u8>) -> ReqId {
        let mark = self.b.sent.len();
        let to = self.a.id();
        let req = self.b.take_req();
        self.b.run(Input::SendWith {
            req,
            to,
            kind,
            payload,
            meta,
        });
        let mut to_a: Vec<_> = self.b.sent[mark..].to_vec();
        self.exchange(&mut Vec::new(), &mut to_a);
        req
    }

    /// Node 2 sends a read receipt, signed with `signer`, that bob read
    /// `ids` of alice's.
    fn receipt_from_b(&mut self, signer: &SecretKey, ids: Vec<MsgId>) -> ReqId {
        let r = mesh_protocol::ReadReceipt::sign(
            signer,
            &self.b.id(),
            (name("bob"), name("alice")),
            77,
            ids,
        );
        let meta = SendMeta {
            read_receipt: true,
            ..SendMeta::default()
        };
        self.send_from_b(mesh_protocol::KIND_READ_RECEIPT, meta, r.encode())
    }
}

/// Alice's message to bob asking a receipt: its id.
fn asked_of_bob(p: &mut Pair) -> MsgId {
    let meta = SendMeta {
        receipt: true,
        ..from_to("alice", Some("bob"))
    };
    let req = p.send_as_a(meta, b"read me");
    let seq = ok_seq(p.a.reply(req));
    let id = MsgId::derive(&p.a.id(), epoch(1), &p.b.id(), seq);
    let inbox = p.b.inbox("bob");
    assert!(body_of(&inbox[0]).receipt, "the envelope asks for it");
    id
}

fn reads_of_alice(p: &Pair) -> usize {
    p.a.inbox("alice")
        .iter()
        .filter(|i| i.row.kind == InboxKind::Read)
        .count()
}

#[test]
fn a_read_receipt_signed_by_the_readers_card_key_marks_the_message_and_tells_its_sender_once() {
    let mut p = agents_pair();
    let id = asked_of_bob(&mut p);
    let req = p.receipt_from_b(&agent_key(2, "bob"), vec![id]);
    assert!(matches!(p.b.reply(req), Some(Ok(_))), "sent");
    assert_eq!(p.b.core.metrics().agents.receipts_sent, 1);
    let row = p.a.store.message(&id).expect("reads").expect("indexed");
    let mark = row.read.expect("marked read");
    assert_eq!(
        (mark.node, mark.reader, mark.read_ms),
        (p.b.id(), name("bob"), 77)
    );
    assert_eq!(reads_of_alice(&p), 1);
    assert_eq!(p.a.core.metrics().agents.receipts_received, 1);
    // The same receipt again (a second send, past any dedup): no news.
    p.receipt_from_b(&agent_key(2, "bob"), vec![id]);
    assert_eq!(reads_of_alice(&p), 1, "told once");
    let a = p.a.core.metrics().agents.clone();
    assert_eq!((a.receipts_received, a.receipts_refused), (1, 1));
}

#[test]
fn a_forged_read_receipt_and_one_naming_an_id_never_sent_are_refused_counted_and_mark_nothing() {
    let mut p = agents_pair();
    let id = asked_of_bob(&mut p);
    // Signed by a key other than the one bob's card announced.
    p.receipt_from_b(&agent_key(2, "mallory"), vec![id]);
    let row = p.a.store.message(&id).expect("reads").expect("indexed");
    assert_eq!(row.read, None, "a forged receipt marks nothing");
    assert_eq!(reads_of_alice(&p), 0);
    assert_eq!(p.a.core.metrics().agents.receipts_refused, 1);
    // Signed by bob, for a message alice never sent.
    let never = MsgId::derive(&p.a.id(), epoch(1), &p.b.id(), 99);
    p.receipt_from_b(&agent_key(2, "bob"), vec![never]);
    assert_eq!(reads_of_alice(&p), 0);
    let a = p.a.core.metrics().agents.clone();
    assert_eq!((a.receipts_refused, a.receipt_ids_skipped), (2, 1));
    assert_eq!(a.receipts_received, 0);
    assert_eq!(
        p.a.store
            .message(&id)
            .expect("reads")
            .expect("indexed")
            .read,
        None
    );
    // Both were journaled: the stream stays dense.
    let journaled =
        p.a.journal()
            .into_iter()
            .filter(|r| {
                matches!(r, JournalRecord::Envelope { kind, .. }
                if *kind == mesh_protocol::KIND_READ_RECEIPT)
            })
            .count();
    assert_eq!(journaled, 2);
}

#[test]
fn a_receipt_is_asked_only_of_a_message_to_an_agent_and_no_api_sends_a_mesh_kind() {
    let mut p = agents_pair();
    let to_node = SendMeta {
        receipt: true,
        ..from_to("alice", None)
    };
    let req = p.send_as_a(to_node, b"to the node");
    assert!(
        matches!(p.a.reply(req), Some(Err(SendError::ReceiptWithoutAgent))),
        "{:?}",
        p.a.reply(req)
    );
    // A plain message with a client id may not be of a mesh kind either.
    let meta = SendMeta {
        client_id: Some("c1".into()),
        ..SendMeta::default()
    };
    let req = p.send_from_b(mesh_protocol::KIND_BOUNCE, meta, vec![1, 2, 3]);
    assert!(
        matches!(p.b.reply(req), Some(Err(SendError::ReservedKind(2)))),
        "{:?}",
        p.b.reply(req)
    );
    // A read receipt of an agent this node does not host is refused.
    let r = mesh_protocol::ReadReceipt::sign(
        &agent_key(2, "bob"),
        &p.b.id(),
        (name("nobody"), name("alice")),
        1,
        vec![MsgId([1; 16])],
    );
    let meta = SendMeta {
        read_receipt: true,
        ..SendMeta::default()
    };
    let req = p.send_from_b(mesh_protocol::KIND_READ_RECEIPT, meta, r.encode());
    assert!(
        matches!(p.b.reply(req), Some(Err(SendError::BadReadReceipt(_)))),
        "{:?}",
        p.b.reply(req)
    );
}
