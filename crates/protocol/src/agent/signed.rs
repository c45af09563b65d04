//! The signed notices about an agent: its card (where it is hosted and
//! whether it is online), its move notice (which host it moved to) and its
//! read receipts (which messages it read).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{
    AGENT_CARD_DOMAIN, AGENT_MOVE_DOMAIN, AgentError, AgentName, MAX_AGENT_NAME_BYTES, MsgId,
    READ_RECEIPT_DOMAIN, decode_canonical,
};
use crate::ids::{NodeId, SecretKey};

/// A node's announcement of one of its agents, signed by the agent's own
/// key so that no relay can invent or alter one.
///
/// The signature covers [`AGENT_CARD_DOMAIN`] and the postcard encoding of
/// `(node, name, key, online, issued_ms)`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCard {
    /// The node that hosts the agent.
    #[serde(with = "crate::ids::node_id_serde")]
    pub node: NodeId,
    /// The agent's name on that node.
    pub name: AgentName,
    /// The agent's public key.
    #[serde(with = "crate::ids::node_id_serde")]
    pub key: NodeId,
    /// Whether the agent is using its node now.
    pub online: bool,
    /// When the card was signed, ms since the Unix epoch (a newer card replaces an older).
    pub issued_ms: u64,
    /// ed25519 by `key` over the fields above.
    #[serde(with = "crate::batch::sig_bytes")]
    pub sig: [u8; 64],
}

impl fmt::Debug for AgentCard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentCard")
            .field("node", &format_args!("{}", self.node.fmt_short()))
            .field("name", &self.name)
            .field("online", &self.online)
            .field("issued_ms", &self.issued_ms)
            .finish_non_exhaustive()
    }
}

/// The fields an agent card's signature covers, borrowed for encoding.
#[derive(Serialize)]
struct CardFields<'a> {
    #[serde(with = "crate::ids::node_id_serde")]
    node: &'a NodeId,
    name: &'a AgentName,
    #[serde(with = "crate::ids::node_id_serde")]
    key: &'a NodeId,
    online: bool,
    issued_ms: u64,
}

impl AgentCard {
    /// A card for the agent `name` of `node`, signed with the agent's `secret`.
    pub fn sign(
        secret: &SecretKey,
        node: NodeId,
        name: AgentName,
        online: bool,
        issued_ms: u64,
    ) -> AgentCard {
        let mut card = AgentCard {
            node,
            name,
            key: secret.public(),
            online,
            issued_ms,
            sig: [0; 64],
        };
        card.sig = secret.sign(&card.signed_bytes()).to_bytes();
        card
    }

    /// The bytes the signature covers.
    pub fn signed_bytes(&self) -> Vec<u8> {
        domain_bytes(
            AGENT_CARD_DOMAIN,
            &CardFields {
                node: &self.node,
                name: &self.name,
                key: &self.key,
                online: self.online,
                issued_ms: self.issued_ms,
            },
        )
    }

    /// Checks the signature (`verify_strict`) under the card's agent key.
    pub fn verify(&self) -> Result<(), AgentError> {
        verify_agent(&self.key, &self.name, &self.signed_bytes(), &self.sig)
    }
}

/// An agent's word that it is now hosted by `node`, signed by the agent's
/// own key (which moved there with it), so that any node may pass it on
/// and none can invent or alter one.
///
/// `version` only grows from one move of an agent to the next: a notice
/// wins over another of the same agent if its `(version, node)` is higher,
/// so two moves made in a race (one exported key imported twice) settle on
/// the same host everywhere. The signature covers [`AGENT_MOVE_DOMAIN`]
/// and the postcard encoding of `(key, name, from, node, version, issued_ms)`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMove {
    /// The agent's public key: who moved.
    #[serde(with = "crate::ids::node_id_serde")]
    pub key: NodeId,
    /// The agent's name (the same on its new host).
    pub name: AgentName,
    /// The node it left.
    #[serde(with = "crate::ids::node_id_serde")]
    pub from: NodeId,
    /// The node that hosts it now.
    #[serde(with = "crate::ids::node_id_serde")]
    pub node: NodeId,
    /// 1 for the first move, one more for each move after.
    pub version: u64,
    /// When the notice was signed, ms since the Unix epoch (for people).
    pub issued_ms: u64,
    /// ed25519 by `key` over the fields above.
    #[serde(with = "crate::batch::sig_bytes")]
    pub sig: [u8; 64],
}

impl fmt::Debug for AgentMove {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentMove")
            .field("name", &self.name)
            .field("key", &format_args!("{}", self.key.fmt_short()))
            .field("from", &format_args!("{}", self.from.fmt_short()))
            .field("node", &format_args!("{}", self.node.fmt_short()))
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// The fields a move notice's signature covers, borrowed for encoding.
#[derive(Serialize)]
struct MoveFields<'a> {
    #[serde(with = "crate::ids::node_id_serde")]
    key: &'a NodeId,
    name: &'a AgentName,
    #[serde(with = "crate::ids::node_id_serde")]
    from: &'a NodeId,
    #[serde(with = "crate::ids::node_id_serde")]
    node: &'a NodeId,
    version: u64,
    issued_ms: u64,
}

impl AgentMove {
    /// A notice that the agent of `secret`, named `name`, left `from` and
    /// is hosted by `node` from its move numbered `version` on.
    pub fn sign(
        secret: &SecretKey,
        name: AgentName,
        (from, node): (NodeId, NodeId),
        version: u64,
        issued_ms: u64,
    ) -> AgentMove {
        let mut notice = AgentMove {
            key: secret.public(),
            name,
            from,
            node,
            version,
            issued_ms,
            sig: [0; 64],
        };
        notice.sig = secret.sign(&notice.signed_bytes()).to_bytes();
        notice
    }

    /// The bytes the signature covers.
    pub fn signed_bytes(&self) -> Vec<u8> {
        domain_bytes(
            AGENT_MOVE_DOMAIN,
            &MoveFields {
                key: &self.key,
                name: &self.name,
                from: &self.from,
                node: &self.node,
                version: self.version,
                issued_ms: self.issued_ms,
            },
        )
    }

    /// Checks the signature (`verify_strict`) under the agent's key.
    pub fn verify(&self) -> Result<(), AgentError> {
        verify_agent(&self.key, &self.name, &self.signed_bytes(), &self.sig)
    }

    /// Whether this notice wins over `other`, a notice of the same agent:
    /// a higher version, or the same version and a higher node id (two
    /// imports of one exported key). The same notice does not win.
    pub fn wins_over(&self, other: &AgentMove) -> bool {
        (self.version, self.node.as_bytes()) > (other.version, other.node.as_bytes())
    }
}

/// The most message ids one [`ReadReceipt`] names.
pub const MAX_RECEIPT_IDS: usize = 256;

/// The most bytes a [`ReadReceipt`] encodes to: two names at their longest
/// with their lengths, the time as a varint, the id count as a varint, the
/// ids, the signature.
pub const MAX_READ_RECEIPT_BYTES: usize =
    2 * (1 + MAX_AGENT_NAME_BYTES) + 10 + 2 + MAX_RECEIPT_IDS * 16 + 64;

/// The payload of an envelope of kind [`super::KIND_READ_RECEIPT`]: agent
/// `reader`, hosted by the envelope's author node, read the messages `ids`
/// that the agent `to` of the envelope's recipient node sent it.
///
/// Signed by the reader agent's own key, so neither a relay nor the
/// reader's node on its own account can invent one for another agent. The
/// signature covers [`READ_RECEIPT_DOMAIN`] and the postcard encoding of
/// `(node, key, reader, to, read_ms, ids)`, where `node` is the reader's
/// host and `key` its agent key: a receipt cannot be replayed as if from
/// another host or another key. The ids are 1 to [`MAX_RECEIPT_IDS`],
/// strictly ascending (one encoding per set).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadReceipt {
    /// The agent that read the messages, on the envelope's author node.
    pub reader: AgentName,
    /// The agent that sent them, on the envelope's recipient node: the
    /// agent told.
    pub to: AgentName,
    /// When the reader acked past them, ms since the Unix epoch.
    pub read_ms: u64,
    /// The messages read, strictly ascending.
    pub ids: Vec<MsgId>,
    /// ed25519 by the reader's agent key over the fields above, its node
    /// and its key.
    #[serde(with = "crate::batch::sig_bytes")]
    pub sig: [u8; 64],
}

impl fmt::Debug for ReadReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadReceipt")
            .field("reader", &self.reader)
            .field("to", &self.to)
            .field("read_ms", &self.read_ms)
            .field("ids", &self.ids.len())
            .finish_non_exhaustive()
    }
}

/// The fields a read receipt's signature covers, borrowed for encoding.
#[derive(Serialize)]
struct ReceiptFields<'a> {
    #[serde(with = "crate::ids::node_id_serde")]
    node: &'a NodeId,
    #[serde(with = "crate::ids::node_id_serde")]
    key: &'a NodeId,
    reader: &'a AgentName,
    to: &'a AgentName,
    read_ms: u64,
    ids: &'a [MsgId],
}

impl ReadReceipt {
    /// A receipt by the agent of `secret`, named `reader` on `node`, that
    /// it read `ids` (which the caller keeps to 1..=[`MAX_RECEIPT_IDS`],
    /// strictly ascending, or [`ReadReceipt::decode`] refuses it) from `to`.
    pub fn sign(
        secret: &SecretKey,
        node: &NodeId,
        (reader, to): (AgentName, AgentName),
        read_ms: u64,
        ids: Vec<MsgId>,
    ) -> ReadReceipt {
        let mut r = ReadReceipt {
            reader,
            to,
            read_ms,
            ids,
            sig: [0; 64],
        };
        r.sig = secret
            .sign(&r.signed_bytes(node, &secret.public()))
            .to_bytes();
        r
    }

    /// The bytes the signature covers, for a reader hosted by `node` with
    /// the agent key `key`.
    pub fn signed_bytes(&self, node: &NodeId, key: &NodeId) -> Vec<u8> {
        domain_bytes(
            READ_RECEIPT_DOMAIN,
            &ReceiptFields {
                node,
                key,
                reader: &self.reader,
                to: &self.to,
                read_ms: self.read_ms,
                ids: &self.ids,
            },
        )
    }

    /// Checks the signature (`verify_strict`) as made by the reader with
    /// the agent key `key` (from its announced card) hosted by `node` (the
    /// envelope's author).
    pub fn verify(&self, node: &NodeId, key: &NodeId) -> Result<(), AgentError> {
        verify_agent(key, &self.reader, &self.signed_bytes(node, key), &self.sig)
    }

    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_else(|_| unreachable!("postcard into Vec"))
    }

    /// Decodes a payload of kind [`super::KIND_READ_RECEIPT`]: at most
    /// [`MAX_READ_RECEIPT_BYTES`], canonical and whole, with 1 to
    /// [`MAX_RECEIPT_IDS`] ids strictly ascending. The signature is not
    /// checked here (the key is the caller's to find): see
    /// [`ReadReceipt::verify`].
    pub fn decode(payload: &[u8]) -> Result<ReadReceipt, AgentError> {
        let what = "read receipt";
        let malformed = |why: String| AgentError::Malformed { what, why };
        if payload.len() > MAX_READ_RECEIPT_BYTES {
            return Err(malformed(format!(
                "{} bytes, more than the {MAX_READ_RECEIPT_BYTES} a receipt may take",
                payload.len()
            )));
        }
        let r: ReadReceipt = decode_canonical(payload, what)?;
        if r.ids.is_empty() || r.ids.len() > MAX_RECEIPT_IDS {
            return Err(malformed(format!(
                "it names {} messages, not 1 to {MAX_RECEIPT_IDS}",
                r.ids.len()
            )));
        }
        if !r.ids.windows(2).all(|w| w[0] < w[1]) {
            return Err(malformed("its ids are not strictly ascending".into()));
        }
        Ok(r)
    }
}

/// The bytes an agent's signature covers: `domain`, then the postcard
/// encoding of `fields`.
fn domain_bytes(domain: &[u8], fields: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::with_capacity(domain.len() + 160);
    out.extend_from_slice(domain);
    postcard::to_extend(fields, out).unwrap_or_else(|_| unreachable!("postcard into Vec"))
}

/// Checks `sig` (`verify_strict`) over `signed` under the agent key `key`;
/// the error names the agent `name`.
fn verify_agent(
    key: &NodeId,
    name: &AgentName,
    signed: &[u8],
    sig: &[u8; 64],
) -> Result<(), AgentError> {
    let sig = iroh_base::Signature::from_bytes(sig);
    key.verify(signed, &sig)
        .map_err(|_| AgentError::BadSignature(name.to_string()))
}
