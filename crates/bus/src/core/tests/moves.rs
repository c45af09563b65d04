//! Agents' move notices through several cores: passed along a line, the
//! newer (then the higher node) winning everywhere, forgeries refused,
//! told to a peer that connects later, kept across a restart.

use mesh_protocol::{AgentMove, AgentName};

use super::mesh::Mesh;
use super::*;

/// The moving agent's key.
fn agent() -> SecretKey {
    SecretKey::from_bytes(&[50; 32])
}

/// The agent's move from node `from` to node `to`, numbered `version`.
fn notice(from: u8, to: u8, version: u64) -> AgentMove {
    let name = AgentName::new("kim").expect("a name");
    AgentMove::sign(&agent(), name, (id(from), id(to)), version, 1)
}

impl Mesh {
    /// Node `n` commits `notice` as its own (an import) and tells its peers.
    fn import(&mut self, n: u8, notice: AgentMove) {
        let node = self.node(n);
        let req = ReqId(node.next_req);
        node.next_req += 1;
        let out = node.run(Input::Write {
            req,
            write: LocalWrite::PutMove(notice),
        });
        assert!(
            matches!(
                node.other.last(),
                Some(Effect::Written { result: Ok(_), .. })
            ),
            "the import is committed"
        );
        self.sent_by(n, out);
        self.settle();
    }

    /// The notice node `n` holds of the agent, in its core and its store.
    fn held(&mut self, n: u8) -> Option<AgentMove> {
        let node = self.node(n);
        let core = node.core.agent_move(&agent().public()).cloned();
        let stored = node.store.moves().expect("reads");
        assert_eq!(
            stored,
            core.iter().cloned().collect::<Vec<_>>(),
            "node {n} stored it"
        );
        core
    }
}

#[test]
fn a_notice_goes_along_a_line_and_a_newer_one_wins_everywhere() {
    let mut m = Mesh::new(3, &[(1, 2), (2, 3)]);
    m.link(1, 2);
    m.link(2, 3);
    m.import(1, notice(3, 1, 1));
    for n in 1..=3 {
        assert_eq!(m.held(n), Some(notice(3, 1, 1)), "node {n}");
    }
    // The agent moves on to node 3, which says so.
    m.import(3, notice(1, 3, 2));
    for n in 1..=3 {
        assert_eq!(m.held(n), Some(notice(1, 3, 2)), "node {n}");
    }
    // The older notice, passed on again late, never wins.
    let conn = m.links[0].2;
    m.queue.push_back((
        2,
        1,
        conn,
        Frame::Moves {
            notices: vec![notice(3, 1, 1)],
            more: false,
        },
    ));
    m.settle();
    for n in 1..=3 {
        assert_eq!(m.held(n), Some(notice(1, 3, 2)), "node {n}");
    }
}

#[test]
fn two_moves_in_a_race_settle_on_the_higher_node_everywhere() {
    let mut m = Mesh::new(3, &[(1, 2), (2, 3)]);
    // One exported key imported at nodes 1 and 3 while they are apart.
    m.import(1, notice(2, 1, 4));
    m.import(3, notice(2, 3, 4));
    m.link(1, 2);
    m.link(2, 3);
    let winner = if id(1).as_bytes() > id(3).as_bytes() {
        notice(2, 1, 4)
    } else {
        notice(2, 3, 4)
    };
    for n in 1..=3 {
        assert_eq!(m.held(n), Some(winner.clone()), "node {n}");
    }
}

#[test]
fn a_forged_notice_is_refused_whole_and_counted() {
    let mut m = Mesh::new(2, &[(1, 2)]);
    m.link(1, 2);
    let mut forged = notice(1, 1, 9);
    forged.node = id(2);
    let conn = m.links[0].2;
    m.queue.push_back((
        2,
        1,
        conn,
        Frame::Moves {
            notices: vec![notice(1, 1, 1), forged],
            more: false,
        },
    ));
    m.settle();
    assert_eq!(m.held(2), None, "not even the good notice of the frame");
    assert_eq!(m.node(2).core.metrics().agents.moves_refused, 1);
}

#[test]
fn a_peer_that_connects_later_is_told_and_a_restart_keeps_what_was_held() {
    let mut m = Mesh::new(2, &[(1, 2)]);
    m.import(1, notice(2, 1, 1));
    m.node(1).restart();
    assert_eq!(m.held(1), Some(notice(2, 1, 1)), "kept across a restart");
    assert_eq!(m.held(2), None);
    m.link(1, 2);
    assert_eq!(m.held(2), Some(notice(2, 1, 1)), "told after the Hello");
    // Node 2 took it from a peer: written with its next commit, and read
    // back after its own restart.
    m.node(2).restart();
    assert_eq!(m.held(2), Some(notice(2, 1, 1)));
}

impl Mesh {
    /// Node `n` hosts the agent `name` of key `key` (its card announced).
    fn host(&mut self, n: u8, name: &str, key: &SecretKey) {
        let agent = AgentName::new(name).expect("a name");
        let node = self.node(n);
        let req = ReqId(node.next_req);
        node.next_req += 1;
        let record = mesh_store::AgentRecord {
            name: agent.clone(),
            key: key.public(),
            uid: 0,
            created_ms: 1,
        };
        let mut out = node.run(Input::Write {
            req,
            write: LocalWrite::PutAgent(record),
        });
        let card = mesh_protocol::AgentCard::sign(key, id(n), agent, true, 1);
        out.extend(node.run(Input::AgentCard { card }));
        self.sent_by(n, out);
        self.settle();
    }

    /// Node `n`'s agent `from` sends `body` to agent `to` of node `at`.
    fn send_agent(&mut self, n: u8, from: &str, (to, at): (&str, u8), body: &[u8]) {
        let node = self.node(n);
        let req = ReqId(node.next_req);
        node.next_req += 1;
        let meta = crate::core::SendMeta {
            from: Some(AgentName::new(from).expect("a name")),
            to: Some(AgentName::new(to).expect("a name")),
            ..crate::core::SendMeta::default()
        };
        let out = node.run(Input::SendWith {
            req,
            to: id(at),
            kind: 0,
            payload: body.to_vec(),
            meta,
        });
        assert!(matches!(node.reply(req), Some(Ok(_))), "sent");
        self.sent_by(n, out);
        self.settle();
    }

    /// The agent messages in `agent`'s inbox on node `n`: (id, sender, body),
    /// forwarded ones as their author wrote them.
    fn inbox_of(&mut self, n: u8, agent: &str) -> Vec<(mesh_protocol::MsgId, AgentName, Vec<u8>)> {
        let name = AgentName::new(agent).expect("a name");
        let items = self.node(n).store.inbox(&name, 0, 100).expect("reads");
        items
            .iter()
            .filter_map(|i| match &i.item.record {
                JournalRecord::Envelope { kind, payload, .. } => {
                    let bytes = match *kind {
                        mesh_protocol::KIND_AGENT => payload.clone(),
                        mesh_protocol::KIND_FORWARD => {
                            mesh_protocol::Forward::decode(payload)
                                .expect("a forward")
                                .envelope
                        }
                        _ => return None,
                    };
                    let e = mesh_protocol::AgentEnvelope::decode(&bytes).expect("a message");
                    Some((e.id, e.from, e.body))
                }
                _ => None,
            })
            .collect()
    }
}

impl Mesh {
    /// Node `n` passes `forward` on to node `to`, as its daemon's pump does.
    fn forward(&mut self, n: u8, to: u8, forward: Vec<u8>) -> Result<SendReceipt, SendError> {
        let node = self.node(n);
        let req = ReqId(node.next_req);
        node.next_req += 1;
        let cursor = Some((
            AgentName::new("kim").expect("a name"),
            "passed".to_owned(),
            1,
        ));
        let out = node.run(Input::Forward {
            req,
            to: id(to),
            payload: forward,
            cursor,
        });
        let result = node.reply(req).cloned().expect("answered");
        self.sent_by(n, out);
        self.settle();
        result
    }
}

#[test]
fn a_forwarded_message_reaches_the_agent_at_its_new_host_once_however_often_it_is_passed_on() {
    let mut m = Mesh::new(3, &[(1, 2), (2, 3), (1, 3)]);
    m.link(1, 2);
    m.link(2, 3);
    m.link(1, 3);
    m.host(1, "kim", &agent());
    m.host(2, "bob", &SecretKey::from_bytes(&[60; 32]));
    m.send_agent(2, "bob", ("kim", 1), b"for kim");
    // kim moves from node 1 to node 3; node 1 passes on what came for it.
    m.host(3, "kim", &agent());
    m.import(3, notice(1, 3, 1));
    let kept = m.inbox_of(1, "kim");
    assert_eq!(kept.len(), 1, "kept in the previous inbox: {kept:?}");
    let payload = m
        .node(1)
        .received(&stream(2, 2, 1))
        .pop()
        .expect("journaled")
        .1;
    let forward = mesh_protocol::Forward {
        author: id(2),
        envelope: payload,
    }
    .encode();
    m.forward(1, 3, forward.clone()).expect("passed on");
    let kim = AgentName::new("kim").expect("a name");
    let passed = m.node(1).store.agent_cursor(&kim, "passed").expect("reads");
    assert_eq!(passed, Some(1), "the cursor moved in the forward's commit");
    let new = m.inbox_of(3, "kim");
    assert_eq!(new, kept, "as its author wrote it, with its id");
    // Passed on again (a crash before the pump's cursor moved): once.
    m.forward(1, 3, forward.clone()).expect("passed on");
    assert_eq!(m.inbox_of(3, "kim").len(), 1);
    assert_eq!(m.node(1).core.metrics().agents.forwards_sent, 2);
    assert_eq!(m.node(3).core.metrics().agents.forwards_received, 2);
    // A payload that is no forward is refused, and nothing is sent.
    let refused = m.forward(1, 3, b"not a forward".to_vec());
    assert!(
        matches!(refused, Err(SendError::Internal(_))),
        "{refused:?}"
    );
    // kim moves on to node 2, the sender's node: node 3 passes on what
    // came to it (a forward, as it is), and the sender's own message is
    // put in kim's inbox there without touching its sent row.
    m.host(2, "kim", &agent());
    m.import(2, notice(3, 2, 2));
    m.forward(3, 2, forward).expect("passed on");
    let latest = m.inbox_of(2, "kim");
    assert_eq!(latest, kept, "{latest:?}");
    let row = m
        .node(2)
        .store
        .message(&kept[0].0)
        .expect("reads")
        .expect("indexed");
    assert_eq!(row.dir, mesh_store::MessageDir::Sent, "its sent row stays");
}
