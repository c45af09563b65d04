//! The invites this node hands out, as the store keeps them.

use mesh_protocol::{InviteId, NodeId, RequestId};
use serde::{Deserialize, Serialize};

/// The most uses one invite may have.
pub const INVITE_USES_MAX: u32 = 64;

/// The most requests one spend of an invite remembers: the one that spent
/// it and those that finished it again after a lost answer.
pub const INVITE_SPEND_REQUESTS_MAX: usize = 8;

/// One use of an invite, spent by a node that joined with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteSpend {
    /// The node that joined.
    pub by: NodeId,
    /// The request that spent it, then each that finished the join again
    /// (at most [`INVITE_SPEND_REQUESTS_MAX`]): a request seen here is a
    /// redelivery.
    pub requests: Vec<RequestId>,
    /// Until when the same node may finish a join whose answer it lost, by
    /// proving a new request (ms since the Unix epoch).
    pub until_ms: u64,
}

/// An invite this node handed out, as kept in `invites-v1`.
///
/// Its uses are spent one per joining node; while a node is joining, the
/// invite is claimed for it (`claimed_by` until `claimed_until_ms`), and
/// another node presenting it is asked to try again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteRecord {
    /// The invite.
    pub id: InviteId,
    /// BLAKE3 of the secret ([`mesh_protocol::InviteSecret::hash`]); the
    /// secret itself is not kept.
    pub secret_hash: [u8; 32],
    /// How many nodes may join with it (1..=[`INVITE_USES_MAX`]).
    pub uses: u32,
    /// When it was made (ms since the Unix epoch).
    pub created_ms: u64,
    /// After this it is refused (ms since the Unix epoch).
    pub expires_ms: u64,
    /// The node it is claimed for, if any.
    pub claimed_by: Option<NodeId>,
    /// Until when the claim holds (ms since the Unix epoch).
    pub claimed_until_ms: u64,
    /// The request that made the claim.
    pub claimed_request: Option<RequestId>,
    /// The uses spent, oldest first (at most `uses`).
    pub spent: Vec<InviteSpend>,
    /// Revoked by `mesh invite revoke`.
    pub revoked: bool,
}

impl InviteRecord {
    /// Uses not yet spent.
    pub fn uses_left(&self) -> u32 {
        self.uses.saturating_sub(self.spent.len() as u32)
    }
}
