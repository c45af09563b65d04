//! The bus of agent-mesh: durable direct streams between daemons.
//!
//! [`core`] is the sans-IO state machine that makes every decision (streams,
//! outbox policy, acks, resync, gaps, replay defense, reorder buffer);
//! [`net`] is the iroh transport; [`node`] is the one task that drives both
//! with the store. The daemon uses what this root re-exports. The design is
//! in `docs/design.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod core;
pub mod net;
pub mod node;

pub use crate::core::{
    AgentCounts, Config as CoreConfig, DropCounts, DropReason, FrameCounts, HOLD_BYTES_MAX,
    HOLD_MS, HOLD_MSGS_MAX, JOURNAL_AGE_MS_MAX, JOURNAL_BYTES_MAX, LocalWrite, Metrics,
    PeerChangeError, SendError as CoreSendError, SendMeta, SendReceipt, TopicCounts,
    WAITING_SEND_BYTES_MAX, WAITING_SENDS_MAX,
};
pub use crate::net::{
    MdnsMode, NearbyNode, NetConfig, NetCounters, PeerError, RELAYS_MAX, close_code,
    load_or_create_key, load_or_create_node_key, store_key,
};
pub use crate::node::{
    AgentMoves, DrainsFollowed, INVITE_LEASE_MS, INVITE_TTL_MS_MAX, InviteError, JOIN_ATTEMPTS_MAX,
    JOIN_TIMEOUT, JoinError, Node, NodeConfig, NodeError, NodeNames, NodePeer, NodeStatus,
    NodeTopic, Outgoing, Receipts, SendError, TRY_AGAIN_MS, TopicStream,
};
pub use crate::node::{MOVE_TIMEOUT, MOVES_AT_ONCE_MAX, MoveError, MoveOffer, MoveOffers};
pub use iroh::RelayUrl;
