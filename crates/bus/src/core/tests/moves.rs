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
        let req = node.take_req();
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
    // Each node the agent leaves hosted it (or takes no notice of it leaving).
    m.host(3, "kim", &agent());
    m.host(1, "kim", &agent());
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
    m.host(2, "kim", &agent());
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
    m.host(2, "kim", &agent());
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
        let req = node.take_req();
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
        let req = node.take_req();
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
        self.forward_of(n, to, mesh_protocol::KIND_FORWARD, forward)
    }

    /// Has node `n` pass on a payload of forward kind `kind` to node `to`.
    fn forward_of(
        &mut self,
        n: u8,
        to: u8,
        kind: u16,
        forward: Vec<u8>,
    ) -> Result<SendReceipt, SendError> {
        let node = self.node(n);
        let req = node.take_req();
        let out = node.run(Input::Forward {
            req,
            to: id(to),
            kind,
            payload: forward,
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
    let new = m.inbox_of(3, "kim");
    assert_eq!(new, kept, "as its author wrote it, with its id");
    // Passed on again (a crash before the pump's cursor moved, or a
    // forward given up on the way): indexed once.
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

#[test]
fn a_trimmed_forward_puts_its_loss_in_the_agents_inbox_at_the_new_host() {
    let mut m = Mesh::new(3, &[(1, 3)]);
    m.link(1, 3);
    m.host(1, "kim", &agent());
    m.host(3, "kim", &agent());
    m.import(3, notice(1, 3, 1));
    let kim = AgentName::new("kim").expect("a name");
    let trimmed = mesh_protocol::ForwardTrimmed {
        agent: kim.clone(),
        from: 4,
        to: 9,
    };
    m.forward_of(1, 3, mesh_protocol::KIND_FORWARD_TRIMMED, trimmed.encode())
        .expect("passed on");
    let items = m.node(3).store.inbox(&kim, 0, 100).expect("reads");
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0].row.kind, mesh_store::InboxKind::Lost);
    let JournalRecord::Envelope { kind, payload, .. } = &items[0].item.record else {
        panic!("an envelope: {items:?}");
    };
    assert_eq!(*kind, mesh_protocol::KIND_FORWARD_TRIMMED);
    assert_eq!(mesh_protocol::ForwardTrimmed::decode(payload), Ok(trimmed));
    // One of the wrong kind's bytes, or an empty range, is refused.
    for (kind, payload) in [
        (mesh_protocol::KIND_FORWARD_TRIMMED, b"no".to_vec()),
        (mesh_protocol::KIND_FORWARD_TRIMMED, {
            let mut b = mesh_protocol::ForwardTrimmed {
                agent: kim.clone(),
                from: 9,
                to: 9,
            }
            .encode();
            let n = b.len();
            b[n - 2] = 10;
            b
        }),
        (mesh_protocol::KIND_AGENT, b"x".to_vec()),
    ] {
        let refused = m.forward_of(1, 3, kind, payload);
        assert!(
            matches!(refused, Err(SendError::Internal(_))),
            "{refused:?}"
        );
    }
    assert_eq!(m.node(3).store.inbox(&kim, 0, 100).expect("reads").len(), 1);
}

impl Mesh {
    /// The agents node `n` last said every peer follows the drain of.
    fn drains_followed(&mut self, n: u8) -> Vec<NodeId> {
        self.node(n)
            .other
            .iter()
            .rev()
            .find_map(|e| match e {
                Effect::DrainsFollowed { agents } => Some(agents.clone()),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// What node `at` journaled for its agent kim, by body.
    fn kim_bodies(&mut self, at: u8) -> Vec<Vec<u8>> {
        self.inbox_of(at, "kim").into_iter().map(|m| m.2).collect()
    }
}

/// Node 1 hosts kim, node 2's bob writes to it, nodes 1..=3 are linked
/// in a triangle (and node 4, if `four`, knows nodes 1 and 3 only).
fn kim_at_1(four: bool) -> Mesh {
    let edges: &[(u8, u8)] = if four {
        &[(1, 2), (2, 3), (1, 3), (1, 4), (3, 4)]
    } else {
        &[(1, 2), (2, 3), (1, 3)]
    };
    let mut m = Mesh::new(if four { 4 } else { 3 }, edges);
    m.link(1, 2);
    m.link(2, 3);
    m.link(1, 3);
    m.host(1, "kim", &agent());
    m.host(2, "bob", &SecretKey::from_bytes(&[60; 32]));
    m
}

#[test]
fn a_contact_writes_to_the_new_host_once_it_knows_and_the_old_host_learns_every_peer_followed() {
    let mut m = kim_at_1(false);
    // Bob's first message goes while node 2 cannot reach node 1: queued.
    m.cut(1, 2);
    m.send_agent(2, "bob", ("kim", 1), b"before");
    // kim moves to node 3; node 2 learns it from node 3.
    m.host(3, "kim", &agent());
    m.import(3, notice(1, 3, 1));
    assert_eq!(m.held(2), Some(notice(1, 3, 1)));
    assert!(
        m.drains_followed(1).is_empty(),
        "node 2 has not said it follows"
    );
    // Node 2 follows from its next Hello on: its queued message (seq 1)
    // reaches node 1 and only then is the drain followed.
    m.link(1, 2);
    assert_eq!(m.kim_bodies(1), vec![b"before".to_vec()]);
    assert_eq!(m.drains_followed(1), vec![agent().public()]);
    assert!(m.node(2).core.metrics().agents.follows_sent >= 1);
    // A later send to kim@1 goes to node 3, not to node 1.
    m.send_agent(2, "bob", ("kim", 1), b"after");
    assert_eq!(m.kim_bodies(3), vec![b"after".to_vec()]);
    assert_eq!(m.kim_bodies(1), vec![b"before".to_vec()]);
    assert_eq!(m.node(1).received(&stream(2, 2, 1)).len(), 1);
}

#[test]
fn a_peer_that_says_more_than_has_come_holds_the_drain_until_it_has() {
    let mut m = kim_at_1(false);
    m.host(3, "kim", &agent());
    m.import(3, notice(1, 3, 1));
    assert_eq!(m.drains_followed(1), vec![agent().public()]);
    // Node 2 now says seqs up to 2 may hold a message for kim: node 1
    // has none of them, so the drain is no longer followed.
    let conn = m
        .links
        .iter()
        .find(|(a, b, _)| (*a, *b) == (1, 2))
        .expect("linked")
        .2;
    m.queue.push_back((
        1,
        2,
        conn,
        Frame::Followed {
            stream: stream(2, 2, 1),
            through: 2,
            agents: vec![agent().public()],
        },
    ));
    m.settle();
    assert!(m.drains_followed(1).is_empty());
    // Two sends of node 2's own to node 1 (a plain message, no agent): once
    // node 1 has them, every peer is followed again.
    for body in [b"one".as_slice(), b"two"] {
        let node = m.node(2);
        let req = node.take_req();
        let out = node.run(Input::Send {
            req,
            to: id(1),
            kind: 20,
            payload: body.to_vec(),
        });
        m.sent_by(2, out);
        m.settle();
    }
    assert_eq!(m.drains_followed(1), vec![agent().public()]);
}

#[test]
fn a_drain_is_followed_only_once_every_peer_follows_also_one_that_connects_late() {
    let mut m = kim_at_1(true);
    m.host(3, "kim", &agent());
    m.import(3, notice(1, 3, 1));
    assert!(
        m.drains_followed(1).is_empty(),
        "node 4, a peer of node 1, has not followed"
    );
    // Node 4 never saw kim's card; it learns from node 1's own notice
    // (node 1 took it for its agent of that key) that kim@1 moved.
    m.link(1, 4);
    m.link(3, 4);
    assert_eq!(m.drains_followed(1), vec![agent().public()]);
    m.host(4, "ann", &SecretKey::from_bytes(&[61; 32]));
    m.send_agent(4, "ann", ("kim", 1), b"from ann");
    assert_eq!(m.kim_bodies(3), vec![b"from ann".to_vec()]);
}

#[test]
fn a_member_cannot_claim_another_nodes_agent_moved_to_it() {
    let mut m = kim_at_1(false);
    // Node 2 signs, with a key of its own, that "kim" left node 1 for it.
    let forger = SecretKey::from_bytes(&[62; 32]);
    let name = AgentName::new("kim").expect("a name");
    let forged = AgentMove::sign(&forger, name, (id(1), id(2)), 1, 1);
    for to in [1u8, 3] {
        let conn = m
            .links
            .iter()
            .find(|(a, b, _)| (*a, *b) == (to.min(2), to.max(2)))
            .expect("linked")
            .2;
        m.queue.push_back((
            to,
            2,
            conn,
            Frame::Moves {
                notices: vec![forged.clone()],
                more: false,
            },
        ));
    }
    m.settle();
    assert_eq!(m.node(1).core.agent_move(&forger.public()), None);
    // Refused from node 2, and again when node 3 passed it on.
    assert_eq!(m.node(1).core.metrics().agents.moves_refused, 2);
    // Node 3 keeps the notice (any node may pass one on) but still writes
    // to kim at node 1: node 1 said kim has another key.
    m.host(3, "ann", &SecretKey::from_bytes(&[61; 32]));
    m.send_agent(3, "ann", ("kim", 1), b"for the real kim");
    assert_eq!(m.kim_bodies(1), vec![b"for the real kim".to_vec()]);
    assert!(m.kim_bodies(2).is_empty());
}

#[test]
fn a_send_held_through_a_store_outage_goes_to_the_new_host_if_the_move_comes_meanwhile() {
    let mut m = kim_at_1(false);
    let node = m.node(2);
    node.store.set_unavailable(true);
    let req = node.take_req();
    let meta = crate::core::SendMeta {
        from: Some(AgentName::new("bob").expect("a name")),
        to: Some(AgentName::new("kim").expect("a name")),
        ..crate::core::SendMeta::default()
    };
    let out = node.run(Input::SendWith {
        req,
        to: id(1),
        kind: 0,
        payload: b"held".to_vec(),
        meta,
    });
    assert!(node.reply(req).is_none(), "held while the store is down");
    m.sent_by(2, out);
    m.settle();
    // kim moves to node 3 meanwhile; node 2 learns it with its store down.
    m.host(3, "kim", &agent());
    m.import(3, notice(1, 3, 1));
    let node = m.node(2);
    node.store.set_unavailable(false);
    node.now = node.now.plus(node.config.store_retry_ms);
    let out = node.run(Input::Timer);
    assert!(
        matches!(node.reply(req), Some(Ok(_))),
        "committed once the store is back"
    );
    m.sent_by(2, out);
    m.settle();
    assert_eq!(m.kim_bodies(3), vec![b"held".to_vec()]);
    assert!(m.kim_bodies(1).is_empty());
}
