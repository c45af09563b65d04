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
