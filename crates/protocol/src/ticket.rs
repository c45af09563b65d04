//! Node tickets: text holding a node id and the addresses it listens on.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, cut};

/// Text prefix of every ticket; the digit is the ticket format version.
const PREFIX: &str = "meshnode1";
/// The most addresses one ticket may carry.
pub const MAX_TICKET_ADDRS: usize = 16;
/// The longest ticket text accepted before decoding is tried.
const MAX_TEXT: usize = 1024;

/// What a node hands to a peer so the peer can dial it: its id and addresses.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTicket {
    /// The node's id (its public key).
    pub node: NodeId,
    /// Direct addresses it listens on.
    pub addrs: Vec<SocketAddr>,
}

/// Why a ticket was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TicketError {
    /// The text is not a ticket.
    #[error("{text:?} is not a node ticket ({why}); tickets look like meshnode1…, as printed by `mesh ticket`")]
    Malformed {
        /// The rejected text (cut).
        text: String,
        /// What was wrong.
        why: &'static str,
    },
    /// More than [`MAX_TICKET_ADDRS`] addresses.
    #[error("ticket lists {0} addresses, more than the {MAX_TICKET_ADDRS} allowed")]
    TooManyAddrs(usize),
}

impl NodeTicket {
    /// A ticket for `node` at `addrs`, refused past [`MAX_TICKET_ADDRS`].
    pub fn new(node: NodeId, addrs: Vec<SocketAddr>) -> Result<Self, TicketError> {
        if addrs.len() > MAX_TICKET_ADDRS {
            return Err(TicketError::TooManyAddrs(addrs.len()));
        }
        Ok(NodeTicket { node, addrs })
    }
}

impl fmt::Display for NodeTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Encoding a NodeId and socket addresses into a Vec cannot fail.
        let bytes = postcard::to_stdvec(self).map_err(|_| fmt::Error)?;
        write!(f, "{PREFIX}{}", data_encoding::BASE32_DNSSEC.encode(&bytes))
    }
}

impl fmt::Debug for NodeTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeTicket({} @ {:?})", self.node.fmt_short(), self.addrs)
    }
}

impl FromStr for NodeTicket {
    type Err = TicketError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why| TicketError::Malformed { text: cut(text), why };
        let text = text.trim();
        if text.len() > MAX_TEXT {
            return Err(bad("too long"));
        }
        let body = text.strip_prefix(PREFIX).ok_or_else(|| bad("wrong prefix"))?;
        let raw = data_encoding::BASE32_DNSSEC
            .decode(body.as_bytes())
            .map_err(|_| bad("not base32"))?;
        let (t, rest) = postcard::take_from_bytes::<NodeTicket>(&raw)
            .map_err(|_| bad("does not decode"))?;
        if !rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        NodeTicket::new(t.node, t.addrs)
    }
}
