//! Local writes: the node's own state, sequenced with every other commit.

use mesh_protocol::{AgentName, NodeId};
use mesh_store::{
    AgentOp, AgentRecord, Arrival, CURSOR_NAME_BYTES_MAX, InboxKind, InboxRow, InviteRecord,
    SUBSCRIBER_NAME_BYTES_MAX, WriteOp,
};

/// A write of local state, sequenced with every other commit of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LocalWrite {
    /// Set the named durable cursor `name` to `arrival` (≤ the journal head).
    PutCursor {
        /// The cursor's name (1..=[`mesh_store::CURSOR_NAME_BYTES_MAX`] bytes).
        name: String,
        /// The journal position.
        arrival: Arrival,
    },
    /// Journal that the local subscriber `subscriber` missed the live
    /// journal entries `from..=to` (arrivals, not seqs): it must re-read them.
    SubscriberLagged {
        /// Who lagged (1..=[`mesh_store::SUBSCRIBER_NAME_BYTES_MAX`] bytes).
        subscriber: String,
        /// First arrival missed.
        from: Arrival,
        /// Last arrival missed.
        to: Arrival,
    },
    /// As [`LocalWrite::SubscriberLagged`], for a subscription to `agent`'s
    /// inbox: the lag record goes to that inbox too.
    AgentLagged {
        /// The agent.
        agent: AgentName,
        /// Who lagged.
        subscriber: String,
        /// First arrival missed.
        from: Arrival,
        /// Last arrival missed.
        to: Arrival,
    },
    /// Add (or replace) a local agent. Once committed the core routes
    /// messages for it to its inbox; it is announced once its card comes
    /// ([`Input::AgentCard`](super::Input::AgentCard)). Refused past [`mesh_protocol::MAX_AGENT_CARDS`] agents.
    PutAgent(AgentRecord),
    /// Remove a local agent (its inbox index and cursors; its journal
    /// entries stay); announced to every live peer once committed.
    RemoveAgent(AgentName),
    /// Set (`Some`) or clear the local alias `alias` of a node.
    PutAlias {
        /// The alias.
        alias: String,
        /// The node.
        node: Option<NodeId>,
    },
    /// Set an agent's named cursor to `arrival` (≤ the journal head).
    PutAgentCursor {
        /// The agent.
        agent: AgentName,
        /// The cursor's name (1..=[`mesh_store::CURSOR_NAME_BYTES_MAX`] bytes).
        name: String,
        /// The journal position.
        arrival: Arrival,
    },
    /// Write an invite's record (made, claimed, spent or revoked). The
    /// node's one owner of invites decides what; the core only sequences it.
    PutInvite(InviteRecord),
    /// Join a topic (or change its bounds). Once committed this node takes
    /// the topic's batches and tells every live peer.
    JoinTopic(mesh_store::TopicRecord),
    /// Leave a topic: replication stops once committed; what was journaled
    /// and what is held stay.
    LeaveTopic(mesh_protocol::TopicName),
    /// Keep a move notice this node signed for an agent it now hosts (an
    /// import): once committed it is told to every live peer.
    PutMove(mesh_protocol::AgentMove),
    /// End the drain of `agent`, which moved to `to`: journal that it
    /// ended, and remove the agent (its inbox index and cursors; its
    /// journal entries stay) in the same group.
    EndDrain {
        /// The agent.
        agent: AgentName,
        /// Its host now.
        to: mesh_protocol::NodeId,
        /// The last inbox arrival passed on: refused if the inbox has more.
        passed: Arrival,
        /// Why, for a person.
        detail: String,
    },
}

impl LocalWrite {
    /// The name it carries, and the longest the store takes (an invite
    /// carries none).
    pub(crate) fn name(&self) -> (&str, usize) {
        match self {
            LocalWrite::PutCursor { name, .. } | LocalWrite::PutAgentCursor { name, .. } => {
                (name, CURSOR_NAME_BYTES_MAX)
            }
            LocalWrite::SubscriberLagged { subscriber, .. }
            | LocalWrite::AgentLagged { subscriber, .. } => (subscriber, SUBSCRIBER_NAME_BYTES_MAX),
            LocalWrite::PutAgent(r) => (r.name.as_str(), mesh_protocol::MAX_AGENT_NAME_BYTES),
            LocalWrite::RemoveAgent(n) => (n.as_str(), mesh_protocol::MAX_AGENT_NAME_BYTES),
            LocalWrite::PutMove(m) => (m.name.as_str(), mesh_protocol::MAX_AGENT_NAME_BYTES),
            LocalWrite::EndDrain { agent, .. } => {
                (agent.as_str(), mesh_protocol::MAX_AGENT_NAME_BYTES)
            }
            LocalWrite::PutAlias { alias, .. } => (alias, mesh_store::ALIAS_BYTES_MAX),
            LocalWrite::PutInvite(_) | LocalWrite::JoinTopic(_) | LocalWrite::LeaveTopic(_) => {
                ("", 0)
            }
        }
    }

    /// The store ops that write it, as one group.
    pub(crate) fn into_ops(self) -> Vec<WriteOp> {
        match self {
            LocalWrite::PutCursor { name, arrival } => vec![WriteOp::PutCursor { name, arrival }],
            LocalWrite::SubscriberLagged {
                subscriber,
                from,
                to,
            } => vec![WriteOp::RecordLag {
                subscriber,
                from,
                to,
            }],
            LocalWrite::AgentLagged {
                agent,
                subscriber,
                from,
                to,
            } => vec![
                WriteOp::RecordLag {
                    subscriber,
                    from,
                    to,
                },
                WriteOp::Agents(AgentOp::InboxLast {
                    agent,
                    row: InboxRow {
                        kind: InboxKind::Lagged,
                        verified: true,
                        in_reply_to: None,
                    },
                }),
            ],
            LocalWrite::PutAgent(r) => vec![WriteOp::Agents(AgentOp::PutAgent(r))],
            LocalWrite::RemoveAgent(n) => vec![WriteOp::Agents(AgentOp::RemoveAgent(n))],
            LocalWrite::PutAlias { alias, node } => {
                vec![WriteOp::Agents(AgentOp::PutAlias { alias, node })]
            }
            LocalWrite::PutAgentCursor {
                agent,
                name,
                arrival,
            } => vec![WriteOp::Agents(AgentOp::PutCursor {
                agent,
                name,
                arrival,
            })],
            LocalWrite::PutInvite(invite) => vec![WriteOp::PutInvite(invite)],
            LocalWrite::JoinTopic(record) => vec![WriteOp::JoinTopic(record)],
            LocalWrite::LeaveTopic(topic) => vec![WriteOp::LeaveTopic { topic }],
            LocalWrite::PutMove(notice) => vec![WriteOp::Agents(AgentOp::PutMove(notice))],
            LocalWrite::EndDrain {
                agent,
                to,
                passed,
                detail,
            } => vec![
                WriteOp::RecordDrainEnded {
                    agent: agent.clone(),
                    to,
                    passed,
                    detail,
                },
                WriteOp::Agents(AgentOp::RemoveAgent(agent)),
            ],
        }
    }
}
