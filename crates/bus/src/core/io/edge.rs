//! The checks a peer's frames pass at the edge, before they reach the core.

use mesh_protocol::{AgentCard, OpenBatch, SignedBatch, VerifyError};

/// Why an agent card frame was refused at the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadCards {
    /// A card's signature does not verify under its agent key.
    #[error("an agent card does not verify")]
    BadSignature,
}

/// Verifies every card of an `Agents` frame: the only way cards reach the
/// core. Pure and thread-safe, run where the frame is read.
pub fn open_cards(cards: Vec<AgentCard>) -> Result<Vec<AgentCard>, BadCards> {
    if cards.iter().all(|c| c.verify().is_ok()) {
        Ok(cards)
    } else {
        Err(BadCards::BadSignature)
    }
}

/// Checks every move notice's signature under its agent's key: a `Moves`
/// frame with one bad notice is refused whole, as an `Agents` frame is.
pub fn open_moves(
    notices: Vec<mesh_protocol::AgentMove>,
) -> Result<Vec<mesh_protocol::AgentMove>, BadCards> {
    if notices.iter().all(|m| m.verify().is_ok()) {
        Ok(notices)
    } else {
        Err(BadCards::BadSignature)
    }
}

/// Why a peer's batch frame was refused before it reached the core's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadBatch {
    /// The signature does not verify under the author's key.
    #[error("bad signature")]
    BadSignature,
    /// The batch breaks a shape limit (entries, bytes, first seq).
    #[error("malformed batch")]
    Malformed,
    /// A payload does not match its signed hash, or the count differs.
    #[error("a payload does not match its signed hash")]
    CidMismatch,
}

/// Verifies a received batch's signature and every payload's hash: the only
/// way a peer's batch reaches the core. Pure and thread-safe; the driver runs
/// it in each connection's reader task, in parallel, off the node task.
pub fn open_batch(batch: SignedBatch, payloads: Vec<Vec<u8>>) -> Result<OpenBatch, BadBatch> {
    let verified = batch.verify().map_err(|e| match e {
        VerifyError::BadSignature(_) => BadBatch::BadSignature,
        _ => BadBatch::Malformed,
    })?;
    verified.open(payloads).map_err(|_| BadBatch::CidMismatch)
}
