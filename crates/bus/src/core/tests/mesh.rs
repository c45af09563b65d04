//! Several cores linked in a test: nodes 1..=n, their links, and the
//! frames in flight between them.

use super::*;

/// Nodes 1..=n, the links between them, and the frames in flight.
pub(super) struct Mesh {
    pub(super) nodes: Vec<Node>,
    /// Live links: the pair of node numbers and their connection.
    pub(super) links: Vec<(u8, u8, ConnId)>,
    next_conn: u64,
    /// Frames in flight: to node, from node, connection, frame.
    pub(super) queue: VecDeque<(u8, u8, ConnId, Frame)>,
}

impl Mesh {
    /// Nodes 1..=n; `edges` lists who knows whom (both ways).
    pub(super) fn new(n: u8, edges: &[(u8, u8)]) -> Mesh {
        Mesh::with_config(n, edges, &Config::default())
    }

    /// As [`Mesh::new`], each node with `config`.
    pub(super) fn with_config(n: u8, edges: &[(u8, u8)], config: &Config) -> Mesh {
        let nodes = (1..=n)
            .map(|i| {
                let peers: Vec<u8> = edges
                    .iter()
                    .filter_map(|(a, b)| match (*a == i, *b == i) {
                        (true, _) => Some(*b),
                        (_, true) => Some(*a),
                        _ => None,
                    })
                    .collect();
                Node::new(i, i, &peers, config.clone())
            })
            .collect();
        Mesh {
            nodes,
            links: Vec::new(),
            next_conn: 1,
            queue: VecDeque::new(),
        }
    }

    pub(super) fn node(&mut self, n: u8) -> &mut Node {
        &mut self.nodes[usize::from(n - 1)]
    }

    /// Queues what node `from` sent.
    pub(super) fn sent_by(&mut self, from: u8, out: Vec<(NodeId, ConnId, Frame)>) {
        for (to, conn, frame) in out {
            let to = (1..=self.nodes.len() as u8)
                .find(|n| id(*n) == to)
                .expect("a node of the mesh");
            self.queue.push_back((to, from, conn, frame));
        }
    }

    pub(super) fn is_live(&self, conn: ConnId) -> bool {
        self.links.iter().any(|(_, _, c)| *c == conn)
    }

    /// Delivers frames until none are in flight.
    pub(super) fn settle(&mut self) {
        for _ in 0..100_000 {
            let Some((to, from, conn, frame)) = self.queue.pop_front() else {
                return;
            };
            if !self.is_live(conn) {
                continue;
            }
            let out = self.node(to).run(frame_input(id(from), conn, frame));
            self.sent_by(to, out);
        }
        panic!("the mesh did not settle");
    }

    pub(super) fn link(&mut self, a: u8, b: u8) {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.links.push((a, b, conn));
        let out = self.node(a).run(Input::PeerConnected { peer: id(b), conn });
        self.sent_by(a, out);
        let out = self.node(b).run(Input::PeerConnected { peer: id(a), conn });
        self.sent_by(b, out);
        self.settle();
    }

    /// Cuts the link of `a` and `b`: what is in flight on it is lost.
    pub(super) fn cut(&mut self, a: u8, b: u8) {
        let Some(i) = self
            .links
            .iter()
            .position(|(x, y, _)| (*x, *y) == (a, b) || (*x, *y) == (b, a))
        else {
            return;
        };
        let (_, _, conn) = self.links.remove(i);
        self.node(a)
            .run(Input::PeerDisconnected { peer: id(b), conn });
        self.node(b)
            .run(Input::PeerDisconnected { peer: id(a), conn });
    }
}
