//! The snapshot of a node that [`super::Node::status`] answers.

use std::net::SocketAddr;

use mesh_protocol::{Epoch, NodeCard, NodeId, NodeTicket};
use mesh_store::{Arrival, JournalBounds, OwnStream};

use crate::core::Metrics;
use crate::net::{ConnId, NetCounters};

/// A snapshot of the node for status pages and metrics, taken by the node
/// task between two of its turns.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeStatus {
    /// This node's id.
    pub node: NodeId,
    /// Its store epoch.
    pub epoch: Epoch,
    /// Its newest card: its name and the addresses its Hellos announce.
    pub card: NodeCard,
    /// A ticket other nodes can add.
    pub ticket: NodeTicket,
    /// Every known peer, by id.
    pub peers: Vec<NodePeer>,
    /// The nodes mDNS found on the LAN that are not peers, by id.
    pub nearby: Vec<crate::net::NearbyNode>,
    /// This node's agents' current cards (an agent without one yet is not listed).
    pub agents: Vec<mesh_protocol::AgentCard>,
    /// The last journal position written.
    pub journal_head: Arrival,
    /// The journal's retained range and bytes, as the last trim found them.
    pub journal: Option<JournalBounds>,
    /// Why the store cannot commit now (sends are held meanwhile), if it cannot.
    pub store_down: Option<String>,
    /// Transport counters.
    pub net: NetCounters,
    /// Core counters.
    pub core: Metrics,
    /// The topics this node is a member of, by name.
    pub topics: Vec<NodeTopic>,
    /// The move notice held of each agent that moved, by agent key.
    pub moves: Vec<mesh_protocol::AgentMove>,
}

/// One topic this node is a member of, in a [`NodeStatus`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeTopic {
    /// Its record: name, when joined, the bounds of what is held per author.
    pub record: mesh_store::TopicRecord,
    /// Every author stream of it this node holds or receives, with this
    /// node's mark of each (its own stream's: its last seq).
    pub streams: Vec<TopicStream>,
    /// The live peers whose last word said they are members.
    pub members: Vec<NodeId>,
}

/// One author stream of a topic, in a [`NodeTopic`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TopicStream {
    /// The stream.
    pub stream: mesh_protocol::StreamId,
    /// Every envelope up to here is journaled here.
    pub mark: mesh_protocol::Seq,
    /// What this node holds of it to relay, as committed.
    pub held: Option<OwnStream>,
}

/// One peer in a [`NodeStatus`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodePeer {
    /// The peer.
    pub node: NodeId,
    /// Where it is dialed: where its newest card says it listens, or the
    /// addresses it was added with before any card came.
    pub addrs: Vec<SocketAddr>,
    /// Its newest card held (its name, addresses and when it issued it).
    pub card: Option<NodeCard>,
    /// Why its last connection was refused for another protocol version,
    /// until one is live again.
    pub refused: Option<String>,
    /// Its live connection, if any.
    pub conn: Option<ConnId>,
    /// This node's stream to it, as committed (`None` before the first message).
    pub own_stream: Option<OwnStream>,
    /// Whether the link to it is paused ([`Node::set_peer_paused`](super::Node::set_peer_paused)).
    pub paused: bool,
    /// The agents it announced on its last connection.
    pub agents: Vec<mesh_protocol::AgentCard>,
    /// The last identity conflict seen on the link (two live processes
    /// share one node key), for a person.
    pub identity_conflict: Option<String>,
    /// Unacknowledged envelopes of an ended epoch's stream to the peer,
    /// still to be carried into this epoch's (queued, though not in
    /// `own_stream`).
    pub carrying: u64,
}
