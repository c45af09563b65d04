//! Journal cursors: opaque text tokens naming (node, store epoch, arrival seq).
//!
//! A cursor is only meaningful on the node and store epoch that issued it:
//! arrival order is local. [`Cursor::arrival_for`] refuses a cursor from any
//! other node or epoch with a typed error instead of reinterpreting it.

use std::fmt;
use std::str::FromStr;

use crate::ids::{Epoch, NodeId, cut};

/// Text prefix of every cursor token; the digit is the token format version.
const PREFIX: &str = "mc1";
/// Bytes of the node id kept in a cursor: enough to tell nodes apart.
const NODE_TAG_BYTES: usize = 8;
/// Bytes of checksum at the end of the token, so a mistyped cursor is caught.
const CHECK_BYTES: usize = 4;
/// node tag + epoch + arrival + checksum.
const RAW_BYTES: usize = NODE_TAG_BYTES + 16 + 8 + CHECK_BYTES;
/// The longest text accepted before decoding is even tried.
const MAX_TEXT: usize = 128;

/// A position in one node's journal: after the entry with this arrival seq.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cursor {
    node_tag: [u8; NODE_TAG_BYTES],
    epoch: Epoch,
    arrival: u64,
}

/// Why a cursor was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CursorError {
    /// The text is not a cursor token (or is damaged: its checksum fails).
    #[error("{0:?} is not a cursor (cursors look like mc1…, as printed by `mesh events`)")]
    Malformed(String),
    /// The cursor was issued by another node.
    #[error("cursor belongs to another node ({theirs}…), not this one ({ours}…)")]
    OtherNode {
        /// The issuing node's tag, hex.
        theirs: String,
        /// This node's tag, hex.
        ours: String,
    },
    /// The cursor was issued by this node under an earlier or other store epoch.
    #[error("cursor belongs to store epoch {theirs}, but this node's store is epoch {ours}")]
    OtherEpoch {
        /// The cursor's epoch.
        theirs: Epoch,
        /// This store's epoch.
        ours: Epoch,
    },
}

fn node_tag(node: &NodeId) -> [u8; NODE_TAG_BYTES] {
    let mut t = [0; NODE_TAG_BYTES];
    t.copy_from_slice(&node.as_bytes()[..NODE_TAG_BYTES]);
    t
}

impl Cursor {
    /// The cursor after arrival `arrival` in the journal of `node` at `epoch`.
    pub fn new(node: &NodeId, epoch: Epoch, arrival: u64) -> Self {
        Cursor {
            node_tag: node_tag(node),
            epoch,
            arrival,
        }
    }

    /// The arrival seq, if the cursor was issued by `node` at `epoch`.
    pub fn arrival_for(&self, node: &NodeId, epoch: Epoch) -> Result<u64, CursorError> {
        let ours = node_tag(node);
        if self.node_tag != ours {
            return Err(CursorError::OtherNode {
                theirs: data_encoding::HEXLOWER.encode(&self.node_tag),
                ours: data_encoding::HEXLOWER.encode(&ours),
            });
        }
        if self.epoch != epoch {
            return Err(CursorError::OtherEpoch {
                theirs: self.epoch,
                ours: epoch,
            });
        }
        Ok(self.arrival)
    }

    /// Parses `text` and checks it belongs to `node` at `epoch`.
    pub fn parse_for(text: &str, node: &NodeId, epoch: Epoch) -> Result<u64, CursorError> {
        text.parse::<Cursor>()?.arrival_for(node, epoch)
    }

    /// The store epoch the cursor names.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn raw(&self) -> [u8; RAW_BYTES] {
        let mut raw = [0u8; RAW_BYTES];
        raw[..8].copy_from_slice(&self.node_tag);
        raw[8..24].copy_from_slice(&self.epoch.0);
        raw[24..32].copy_from_slice(&self.arrival.to_be_bytes());
        let check = blake3::hash(&raw[..32]);
        raw[32..].copy_from_slice(&check.as_bytes()[..CHECK_BYTES]);
        raw
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}",
            data_encoding::BASE32_DNSSEC.encode(&self.raw())
        )
    }
}

impl fmt::Debug for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cursor({}@{:?})", self.arrival, self.epoch)
    }
}

impl FromStr for Cursor {
    type Err = CursorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || CursorError::Malformed(cut(text));
        let text = text.trim();
        if text.len() > MAX_TEXT {
            return Err(bad());
        }
        let body = text.strip_prefix(PREFIX).ok_or_else(bad)?;
        let raw = data_encoding::BASE32_DNSSEC
            .decode(body.as_bytes())
            .map_err(|_| bad())?;
        let raw: [u8; RAW_BYTES] = raw.try_into().map_err(|_| bad())?;
        let mut node_tag = [0; NODE_TAG_BYTES];
        node_tag.copy_from_slice(&raw[..8]);
        let mut epoch = [0; 16];
        epoch.copy_from_slice(&raw[8..24]);
        let mut arrival = [0; 8];
        arrival.copy_from_slice(&raw[24..32]);
        let c = Cursor {
            node_tag,
            epoch: Epoch(epoch),
            arrival: u64::from_be_bytes(arrival),
        };
        if c.raw() != raw {
            return Err(bad());
        }
        Ok(c)
    }
}
