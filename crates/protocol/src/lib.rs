//! Wire types of agent-mesh: ids, signed batches, frames, node cards,
//! journal cursors, node tickets, invite codes and the join exchange, and
//! the agent payload formats (agent messages, bounces, agent cards).
//!
//! This crate is pure: no IO, no clock, no async runtime. Everything a peer or
//! a local client can send is decoded here, behind a size cap, into types that
//! cannot hold an invalid value: a [`SignedBatch`] off the wire only becomes a
//! [`VerifiedBatch`] after its signature checks, and an [`Envelope`] only exists
//! together with the proof that its payload's hash sits at its index in a
//! verified batch.
//!
//! The design is in `docs/design.md`; the exact bytes are in `docs/protocol.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Tests unwrap freely: a panic is how a test reports its failure.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod agent;
mod batch;
mod card;
mod cursor;
mod frame;
#[doc(hidden)]
pub mod fuzzing;
mod ids;
mod join;
mod ticket;

pub use agent::{
    AGENT_CARD_DOMAIN, AGENT_MOVE_DOMAIN, AgentCard, AgentEnvelope, AgentError, AgentHeader,
    AgentMove, AgentName, Bounce, BounceReason, Forward, ForwardTrimmed, KIND_AGENT, KIND_BOUNCE,
    KIND_FORWARD, KIND_FORWARD_TRIMMED, KIND_MESH_MAX, KIND_MESH_MIN, KIND_READ_RECEIPT,
    KIND_TOMBSTONE, MAX_AGENT_CARDS, MAX_AGENT_NAME_BYTES, MAX_FORWARD_OVERHEAD_BYTES,
    MAX_READ_RECEIPT_BYTES, MAX_RECEIPT_IDS, MAX_SUPERSEDE_KEY_BYTES, MAX_TOMBSTONE_BYTES,
    MSG_ID_DOMAIN, MsgId, READ_RECEIPT_DOMAIN, ReadReceipt, SupersedeKey, Tombstone,
    TombstoneReason, is_forward_kind, is_mesh_kind, stamp_msg_id,
};
pub use batch::{
    BATCH_DOMAIN, Cid, EntryHeader, Envelope, MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES,
    NewEnvelope, OpenBatch, SignedBatch, VerifiedBatch, VerifyError,
};
pub use card::{
    CARD_ADDRS_MAX, CARD_DOMAIN, CardError, NODE_NAME_BYTES_MAX, NameError, NodeCard, NodeName,
};
pub use cursor::{Cursor, CursorError};
pub use frame::{
    FRAME_HEADER_BYTES, Frame, FrameError, MAX_FRAME_BYTES, MAX_FRAME_MOVES, MAX_FRAME_TOPICS,
    MAX_HELLO_MARKS, Mark, PROTOCOL_VERSION, Payloads, decode_frame, encode_frame, frame_body_len,
};
pub use ids::{
    Channel, Epoch, IdError, MAX_TOPIC_NAME_BYTES, NodeId, SecretKey, Seq, StreamId, TopicName,
    parse_node_id, same_node,
};
pub use join::{
    INVITE_ADDRS_MAX, INVITE_SECRET_DOMAIN, InviteCode, InviteId, InviteSecret, JOIN_ALPN,
    JOIN_MESSAGE_BYTES_MAX, JOIN_PROOF_DOMAIN, JoinAnswer, JoinError, JoinRefusal, JoinRequest,
    RequestId, decode_join, encode_join,
};
pub use ticket::{MAX_TICKET_ADDRS, NodeTicket, TicketError};

/// The ALPN of the agent move link: a node hands one agent export (its
/// secret key) to a peer, which imports it and answers. Its version is in
/// its name; the frame protocol's version is not involved. The bytes are
/// in `docs/protocol.md` ("The move link").
pub const MOVE_ALPN: &[u8] = b"amesh-move/1";

/// The most bytes of one message on the move link (an offer or its
/// answer), after its 4-byte big-endian length header; a longer one is
/// refused before its body is read.
pub const MOVE_MESSAGE_BYTES_MAX: usize = 16 * 1024;
