//! Agents: their names, their announcement cards, and the payload formats
//! of the mesh's own envelope kinds (an agent message, a bounce).
//!
//! An agent message travels as the payload of an envelope of kind
//! [`KIND_AGENT`] inside an ordinary signed batch, so its sender and
//! recipient agents are covered by the batch signature (through the
//! payload's BLAKE3 hash). Each payload format here is decoded by one pure
//! function that refuses anything but its one canonical encoding.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

use crate::batch::MAX_BATCH_PAYLOAD_BYTES;
use crate::frame::encoded_len;
use crate::ids::{Epoch, NodeId, SecretKey, Seq, cut};

/// The first envelope kind reserved for the mesh's own payload formats.
pub const KIND_MESH_MIN: u16 = 1;
/// The last envelope kind reserved for the mesh's own payload formats; a
/// local client may not send a plain message of a kind in
/// [`KIND_MESH_MIN`]`..=`[`KIND_MESH_MAX`].
pub const KIND_MESH_MAX: u16 = 15;
/// An agent message: the payload is an [`AgentEnvelope`].
pub const KIND_AGENT: u16 = 1;
/// A bounce: the payload is a [`Bounce`], sent back to the author of an
/// agent message that could not be delivered.
pub const KIND_BOUNCE: u16 = 2;
/// A tombstone: the payload is a [`Tombstone`], in the place (the seq and
/// the id) of an agent message that was replaced before it was sent.
pub const KIND_TOMBSTONE: u16 = 3;
/// A forward: the payload is a [`Forward`], an agent message the old host
/// of a moved agent passes on to its new host.
pub const KIND_FORWARD: u16 = 4;
/// A trimmed forward: the payload is a [`ForwardTrimmed`], in the place of
/// messages for a moved agent that the old host's journal retention
/// removed before they were passed on, so the agent is told.
pub const KIND_FORWARD_TRIMMED: u16 = 5;

/// The longest agent name, in bytes.
pub const MAX_AGENT_NAME_BYTES: usize = 64;
/// The longest supersede key, in bytes.
pub const MAX_SUPERSEDE_KEY_BYTES: usize = 128;

/// The most bytes an [`AgentEnvelope`] takes besides its body: the id, two
/// names, what it answers and a key, each with its length or tag, and the
/// body's length.
const ENVELOPE_HEAD_BYTES_MAX: usize = 16
    + (1 + MAX_AGENT_NAME_BYTES)
    + (2 + MAX_AGENT_NAME_BYTES)
    + 17
    + (3 + MAX_SUPERSEDE_KEY_BYTES)
    + 10;
/// The most cards one [`crate::Frame::Agents`] may carry (also the most
/// agents a node hosts).
pub const MAX_AGENT_CARDS: usize = 256;

/// The domain tag signed before an agent card's fields.
pub const AGENT_CARD_DOMAIN: &[u8] = b"agent-mesh/agent-card/v1\0";
/// The domain tag signed before an agent move notice's fields.
pub const AGENT_MOVE_DOMAIN: &[u8] = b"agent-mesh/agent-move/v1\0";
/// The domain tag hashed before the fields a message id is derived from.
pub const MSG_ID_DOMAIN: &[u8] = b"agent-mesh/msg-id/v1\0";

/// Whether `kind` is one of the mesh's own envelope kinds.
pub fn is_mesh_kind(kind: u16) -> bool {
    (KIND_MESH_MIN..=KIND_MESH_MAX).contains(&kind)
}

/// Whether `kind` is one an old host passes on to a moved agent's new host
/// ([`KIND_FORWARD`], [`KIND_FORWARD_TRIMMED`]).
pub fn is_forward_kind(kind: u16) -> bool {
    matches!(kind, KIND_FORWARD | KIND_FORWARD_TRIMMED)
}

/// Why an agent name, message id, payload or card was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// An agent name was empty, too long, or had a character outside `[a-z0-9._-]`.
    #[error("bad agent name {name:?}: {why}")]
    BadName {
        /// The rejected name (cut to a printable length).
        name: String,
        /// What was wrong with it.
        why: &'static str,
    },
    /// A message id was not 32 hex digits.
    #[error("bad message id {0:?}: expected 32 hex digits")]
    BadMsgId(String),
    /// A supersede key was empty, too long or held a control character.
    #[error("bad supersede key: {0}")]
    BadKey(&'static str),
    /// A payload is larger than a batch may carry.
    #[error(
        "{what} payload of {len} bytes is larger than the {MAX_BATCH_PAYLOAD_BYTES}-byte limit"
    )]
    TooLarge {
        /// Which payload format.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// A payload does not decode as its format, or not canonically.
    #[error("malformed {what}: {why}")]
    Malformed {
        /// Which payload format.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
    /// An agent card's signature does not verify under its agent key.
    #[error("the card of agent {0} does not verify under its key")]
    BadSignature(String),
}

/// An agent's name: 1 to [`MAX_AGENT_NAME_BYTES`] bytes of `[a-z0-9._-]`,
/// unique on its node. Its address is `NAME@NODE`.
///
/// Shared, not copied, when cloned: every message names two agents, and
/// the send path and the indexes hold each name several times.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct AgentName(std::sync::Arc<str>);

impl AgentName {
    /// Checks `name` and wraps it.
    pub fn new(name: &str) -> Result<Self, AgentError> {
        let bad = |why| AgentError::BadName {
            name: cut(name),
            why,
        };
        if name.is_empty() {
            return Err(bad("it is empty"));
        }
        if name.len() > MAX_AGENT_NAME_BYTES {
            return Err(bad("it is longer than 64 bytes"));
        }
        if !name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        {
            return Err(bad("only a-z, 0-9 and . _ - are allowed"));
        }
        Ok(AgentName(name.into()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for AgentName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Read in place where the format allows (postcard from a payload):
        // the name's one allocation is its own.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = AgentName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an agent name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AgentName, E> {
                AgentName::new(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

impl FromStr for AgentName {
    type Err = AgentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AgentName::new(s)
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Agent({})", self.0)
    }
}

/// A message's id: 16 bytes, written as 32 lowercase hex digits.
///
/// The author's core assigns it when it signs the message
/// ([`MsgId::derive`]); it stays the same wherever the message goes, and it
/// is what an inbox, a reply (`in_reply_to`) and `mesh message` name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MsgId(pub [u8; 16]);

impl MsgId {
    /// The id of the envelope `seq` of the stream `(author, epoch,
    /// Direct(recipient))`: the first 8 bytes of BLAKE3 over
    /// [`MSG_ID_DOMAIN`], the author, the epoch and the recipient (the
    /// stream's tag), then the seq, big-endian. Unique because that
    /// envelope is (two streams share a tag with odds of 2^-64); the ids of
    /// one stream sort in seq order, so an index keyed by them grows at its
    /// end rather than in random places.
    pub fn derive(author: &NodeId, epoch: Epoch, recipient: &NodeId, seq: Seq) -> MsgId {
        MsgId::in_stream(MsgId::stream_tag(author, epoch, recipient), seq)
    }

    /// The first 8 bytes of the ids of the stream `(author, epoch,
    /// Direct(recipient))` (see [`MsgId::derive`]).
    pub fn stream_tag(author: &NodeId, epoch: Epoch, recipient: &NodeId) -> [u8; 8] {
        let mut h = blake3::Hasher::new();
        h.update(MSG_ID_DOMAIN);
        h.update(author.as_bytes());
        h.update(epoch.as_bytes());
        h.update(recipient.as_bytes());
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&h.finalize().as_bytes()[..8]);
        tag
    }

    /// The id of `seq` in the stream whose tag is `tag`.
    pub fn in_stream(tag: [u8; 8], seq: Seq) -> MsgId {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&tag);
        id[8..].copy_from_slice(&seq.to_be_bytes());
        MsgId(id)
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for MsgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&data_encoding::HEXLOWER.encode(&self.0))
    }
}

impl fmt::Debug for MsgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MsgId({})", data_encoding::HEXLOWER.encode(&self.0[..4]))
    }
}

impl FromStr for MsgId {
    type Err = AgentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bytes = data_encoding::HEXLOWER_PERMISSIVE
            .decode(t.as_bytes())
            .map_err(|_| AgentError::BadMsgId(cut(s)))?;
        let arr: [u8; 16] = bytes.try_into().map_err(|_| AgentError::BadMsgId(cut(s)))?;
        Ok(MsgId(arr))
    }
}

/// A supersede key: 1 to [`MAX_SUPERSEDE_KEY_BYTES`] bytes of UTF-8
/// without control characters. Reserved: a newer message with the same key
/// will replace an older one not yet sent.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Debug)]
pub struct SupersedeKey(String);

impl SupersedeKey {
    /// Checks `key` and wraps it.
    pub fn new(key: &str) -> Result<Self, AgentError> {
        if key.is_empty() {
            return Err(AgentError::BadKey("it is empty"));
        }
        if key.len() > MAX_SUPERSEDE_KEY_BYTES {
            return Err(AgentError::BadKey("it is longer than 128 bytes"));
        }
        if key.chars().any(char::is_control) {
            return Err(AgentError::BadKey("it holds a control character"));
        }
        Ok(SupersedeKey(key.to_owned()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for SupersedeKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SupersedeKey::new(&s).map_err(serde::de::Error::custom)
    }
}

/// The payload of an envelope of kind [`KIND_AGENT`]: one agent's message
/// to another agent (`to`), or to the recipient node itself (`to: None`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentEnvelope {
    /// The message's id. Always the first 16 bytes of the encoding, so the
    /// author can stamp it after measuring the payload ([`stamp_msg_id`]).
    pub id: MsgId,
    /// The sending agent, on the envelope's author node.
    pub from: AgentName,
    /// The recipient agent on the envelope's recipient node, or `None` for
    /// the recipient node's own journal.
    pub to: Option<AgentName>,
    /// The message this one answers.
    pub in_reply_to: Option<MsgId>,
    /// The supersede key: a later message of the same sender to the same
    /// recipient with the same key replaces this one if it is still
    /// waiting to be sent (a [`Tombstone`] goes in its place).
    pub key: Option<SupersedeKey>,
    /// The message.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

impl AgentEnvelope {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        // Sized up front: the body is most of it, and growing a Vec piece
        // by piece reallocates (and copies) the body on every agent send.
        let room = self.body.len() + ENVELOPE_HEAD_BYTES_MAX;
        // Serializing plain structs into a Vec cannot fail.
        postcard::to_extend(self, Vec::with_capacity(room))
            .unwrap_or_else(|_| unreachable!("postcard into Vec"))
    }

    /// Decodes a payload of kind [`KIND_AGENT`]: at most
    /// [`MAX_BATCH_PAYLOAD_BYTES`], canonical postcard, nothing left over,
    /// every name and key checked.
    pub fn decode(payload: &[u8]) -> Result<AgentEnvelope, AgentError> {
        decode_canonical(payload, "agent envelope")
    }
}

/// An [`AgentEnvelope`] decoded without copying its body: what a receiving
/// node needs to route it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHeader<'a> {
    /// As [`AgentEnvelope::id`].
    pub id: MsgId,
    /// As [`AgentEnvelope::from`].
    pub from: AgentName,
    /// As [`AgentEnvelope::to`].
    pub to: Option<AgentName>,
    /// As [`AgentEnvelope::in_reply_to`].
    pub in_reply_to: Option<MsgId>,
    /// As [`AgentEnvelope::key`].
    pub key: Option<SupersedeKey>,
    /// The body, borrowed from the payload.
    #[serde(borrow)]
    pub body: &'a [u8],
}

impl<'a> AgentHeader<'a> {
    /// Decodes `payload` exactly as [`AgentEnvelope::decode`] does (the
    /// same checks, the same refusals), borrowing the body.
    pub fn decode(payload: &'a [u8]) -> Result<AgentHeader<'a>, AgentError> {
        decode_canonical(payload, "agent envelope")
    }
}

/// Writes `id` into `payload`, an encoded [`AgentEnvelope`] (its id is its
/// first 16 bytes). Returns `false`, changing nothing, if `payload` is
/// shorter than an id.
pub fn stamp_msg_id(payload: &mut [u8], id: MsgId) -> bool {
    match payload.get_mut(..16) {
        Some(head) => {
            head.copy_from_slice(&id.0);
            true
        }
        None => false,
    }
}

/// Why an agent message could not be delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BounceReason {
    /// The recipient node has no agent of that name.
    NoSuchAgent,
}

impl BounceReason {
    /// The reason as the API writes it: `no_such_agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            BounceReason::NoSuchAgent => "no_such_agent",
        }
    }
}

/// The payload of an envelope of kind [`KIND_BOUNCE`]: the recipient node
/// of an agent message tells its author that it could not deliver it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounce {
    /// The message that was not delivered.
    pub id: MsgId,
    /// Its sender, on the bounce's recipient node: the agent told.
    pub to: AgentName,
    /// The agent it was addressed to.
    pub missing: Option<AgentName>,
    /// Why.
    pub reason: BounceReason,
}

impl Bounce {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_else(|_| unreachable!("postcard into Vec"))
    }

    /// Decodes a payload of kind [`KIND_BOUNCE`], canonical and whole.
    pub fn decode(payload: &[u8]) -> Result<Bounce, AgentError> {
        decode_canonical(payload, "bounce")
    }
}

/// Why a message was replaced by a [`Tombstone`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TombstoneReason {
    /// A later message of the same sender to the same recipient with the
    /// same supersede key, `by`, replaced it before it was sent.
    Superseded {
        /// The message that replaced it.
        by: MsgId,
    },
}

/// The most bytes a [`Tombstone`] encodes to (names and key at their
/// longest): what an author reserves for a keyed message, which may become
/// one.
pub const MAX_TOMBSTONE_BYTES: u64 = 320;

/// The payload of an envelope of kind [`KIND_TOMBSTONE`]: what stands in
/// the place of an agent message that was replaced before it was sent, so
/// that its recipient is told, at the seq the message had, that it existed
/// and why it will never arrive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// The replaced message's id (the first 16 bytes, as for an
    /// [`AgentEnvelope`], so [`stamp_msg_id`] applies).
    pub id: MsgId,
    /// Its sending agent.
    pub from: AgentName,
    /// Its recipient agent.
    pub to: Option<AgentName>,
    /// Its supersede key.
    pub key: SupersedeKey,
    /// Why it was replaced.
    pub reason: TombstoneReason,
}

impl Tombstone {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_else(|_| unreachable!("postcard into Vec"))
    }

    /// Decodes a payload of kind [`KIND_TOMBSTONE`], canonical and whole.
    pub fn decode(payload: &[u8]) -> Result<Tombstone, AgentError> {
        decode_canonical(payload, "tombstone")
    }
}

/// The payload of an envelope of kind [`KIND_FORWARD`]: an agent message
/// that reached the node an agent moved away from, passed on by that node
/// to the agent's new host on its own stream (so exactly once and in
/// order, as any message), as the author wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forward {
    /// The node that wrote the message (its author).
    #[serde(with = "crate::ids::node_id_serde")]
    pub author: NodeId,
    /// The message's payload as its author signed it: an [`AgentEnvelope`].
    pub envelope: Vec<u8>,
}

/// The most bytes a [`Forward`] adds to the message it carries.
pub const MAX_FORWARD_OVERHEAD_BYTES: usize = 32 + 5;

impl Forward {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_else(|_| unreachable!("postcard into Vec"))
    }

    /// Decodes a payload of kind [`KIND_FORWARD`], canonical and whole,
    /// whose message decodes as an [`AgentEnvelope`].
    pub fn decode(payload: &[u8]) -> Result<Forward, AgentError> {
        let f: Forward = decode_canonical(payload, "forward")?;
        AgentHeader::decode(&f.envelope)?;
        Ok(f)
    }
}

/// The payload of an envelope of kind [`KIND_FORWARD_TRIMMED`]: the old host
/// of a moved agent found that its journal retention had removed arrivals
/// `from..=to` of its journal, entries of the agent's previous inbox among
/// them, before it passed them on. What they said is gone; the new host
/// puts this in the agent's inbox in their place, so the agent is told.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardTrimmed {
    /// The agent whose messages they were.
    pub agent: AgentName,
    /// The first arrival removed, in the old host's journal.
    pub from: u64,
    /// The last arrival removed (at least `from`).
    pub to: u64,
}

impl ForwardTrimmed {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_else(|_| unreachable!("postcard into Vec"))
    }

    /// Decodes a payload of kind [`KIND_FORWARD_TRIMMED`], canonical and
    /// whole, with `from <= to`.
    pub fn decode(payload: &[u8]) -> Result<ForwardTrimmed, AgentError> {
        let t: ForwardTrimmed = decode_canonical(payload, "trimmed forward")?;
        if t.from > t.to {
            return Err(AgentError::Malformed {
                what: "trimmed forward",
                why: format!("its range {}..={} is empty", t.from, t.to),
            });
        }
        Ok(t)
    }
}

/// Decodes `payload` as the one canonical postcard encoding of a `T`.
fn decode_canonical<'a, T: Serialize + Deserialize<'a>>(
    payload: &'a [u8],
    what: &'static str,
) -> Result<T, AgentError> {
    if payload.len() as u64 > MAX_BATCH_PAYLOAD_BYTES {
        return Err(AgentError::TooLarge {
            what,
            len: payload.len(),
        });
    }
    let malformed = |why: String| AgentError::Malformed { what, why };
    let (value, rest) =
        postcard::take_from_bytes::<T>(payload).map_err(|e| malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(malformed(format!("{} trailing bytes", rest.len())));
    }
    // As for frames: a varint with redundant bytes re-encodes shorter.
    let canonical = encoded_len(&value).map_err(|e| malformed(e.to_string()))?;
    if canonical != payload.len() {
        return Err(malformed(format!(
            "not canonical: {} bytes re-encode as {canonical}",
            payload.len()
        )));
    }
    Ok(value)
}

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
        let key = secret.public();
        let msg = card_bytes(&CardFields {
            node: &node,
            name: &name,
            key: &key,
            online,
            issued_ms,
        });
        AgentCard {
            node,
            name,
            key,
            online,
            issued_ms,
            sig: secret.sign(&msg).to_bytes(),
        }
    }

    /// The bytes the signature covers.
    pub fn signed_bytes(&self) -> Vec<u8> {
        card_bytes(&CardFields {
            node: &self.node,
            name: &self.name,
            key: &self.key,
            online: self.online,
            issued_ms: self.issued_ms,
        })
    }

    /// Checks the signature (`verify_strict`) under the card's agent key.
    pub fn verify(&self) -> Result<(), AgentError> {
        let sig = iroh_base::Signature::from_bytes(&self.sig);
        self.key
            .verify(&self.signed_bytes(), &sig)
            .map_err(|_| AgentError::BadSignature(self.name.to_string()))
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
        let key = secret.public();
        let msg = move_bytes(&MoveFields {
            key: &key,
            name: &name,
            from: &from,
            node: &node,
            version,
            issued_ms,
        });
        AgentMove {
            key,
            name,
            from,
            node,
            version,
            issued_ms,
            sig: secret.sign(&msg).to_bytes(),
        }
    }

    /// The bytes the signature covers.
    pub fn signed_bytes(&self) -> Vec<u8> {
        move_bytes(&MoveFields {
            key: &self.key,
            name: &self.name,
            from: &self.from,
            node: &self.node,
            version: self.version,
            issued_ms: self.issued_ms,
        })
    }

    /// Checks the signature (`verify_strict`) under the agent's key.
    pub fn verify(&self) -> Result<(), AgentError> {
        let sig = iroh_base::Signature::from_bytes(&self.sig);
        self.key
            .verify(&self.signed_bytes(), &sig)
            .map_err(|_| AgentError::BadSignature(self.name.to_string()))
    }

    /// Whether this notice wins over `other`, a notice of the same agent:
    /// a higher version, or the same version and a higher node id (two
    /// imports of one exported key). The same notice does not win.
    pub fn wins_over(&self, other: &AgentMove) -> bool {
        (self.version, self.node.as_bytes()) > (other.version, other.node.as_bytes())
    }
}

fn move_bytes(fields: &MoveFields<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(AGENT_MOVE_DOMAIN.len() + 160);
    out.extend_from_slice(AGENT_MOVE_DOMAIN);
    postcard::to_extend(fields, out).unwrap_or_else(|_| unreachable!("postcard into Vec"))
}

fn card_bytes(fields: &CardFields<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(AGENT_CARD_DOMAIN.len() + 160);
    out.extend_from_slice(AGENT_CARD_DOMAIN);
    postcard::to_extend(fields, out).unwrap_or_else(|_| unreachable!("postcard into Vec"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> AgentName {
        AgentName::new(s).unwrap()
    }

    fn envelope() -> AgentEnvelope {
        AgentEnvelope {
            id: MsgId([7; 16]),
            from: name("alice"),
            to: Some(name("bob")),
            in_reply_to: None,
            key: None,
            body: b"hi".to_vec(),
        }
    }

    #[test]
    fn a_forward_adds_at_most_its_overhead_to_the_message_it_carries() {
        let author = SecretKey::from_bytes(&[1; 32]).public();
        for len in [
            0usize,
            127,
            128,
            16_383,
            16_384,
            MAX_BATCH_PAYLOAD_BYTES as usize,
        ] {
            let f = Forward {
                author,
                envelope: vec![0; len],
            };
            let extra = f.encode().len() - len;
            assert!(extra <= MAX_FORWARD_OVERHEAD_BYTES, "{len}: {extra}");
        }
    }

    #[test]
    fn a_move_notice_verifies_only_as_signed_and_the_higher_version_then_node_wins() {
        let agent = SecretKey::from_bytes(&[5; 32]);
        let (a, b) = (
            SecretKey::from_bytes(&[1; 32]).public(),
            SecretKey::from_bytes(&[2; 32]).public(),
        );
        let first = AgentMove::sign(&agent, name("bob"), (b, a), 1, 10);
        first.verify().unwrap();
        let mut altered = first.clone();
        altered.node = b;
        assert!(altered.verify().is_err(), "a relay cannot change the host");
        let forged = AgentMove::sign(&SecretKey::from_bytes(&[6; 32]), name("bob"), (a, b), 9, 10);
        let mut forged_as_bob = forged.clone();
        forged_as_bob.key = agent.public();
        assert!(
            forged_as_bob.verify().is_err(),
            "only the agent's key signs"
        );
        let second = AgentMove::sign(&agent, name("bob"), (a, b), 2, 20);
        assert!(second.wins_over(&first) && !first.wins_over(&second));
        assert!(!second.wins_over(&second), "the same notice does not win");
        // Two imports of one export: the same version, the higher node wins.
        let (lo, hi) = if a.as_bytes() < b.as_bytes() {
            (a, b)
        } else {
            (b, a)
        };
        let race_lo = AgentMove::sign(&agent, name("bob"), (hi, lo), 3, 30);
        let race_hi = AgentMove::sign(&agent, name("bob"), (lo, hi), 3, 30);
        assert!(race_hi.wins_over(&race_lo) && !race_lo.wins_over(&race_hi));
    }

    #[test]
    fn agent_names_are_bounded_and_restricted() {
        assert!(AgentName::new("planner.v1_a-b").is_ok());
        assert!(AgentName::new("").is_err());
        assert!(AgentName::new(&"a".repeat(65)).is_err());
        assert!(AgentName::new(&"a".repeat(64)).is_ok());
        assert!(AgentName::new("Bob").is_err());
        assert!(AgentName::new("a/b").is_err());
        assert!(AgentName::new("a@b").is_err());
    }

    #[test]
    fn an_envelope_round_trips_and_its_id_is_its_first_sixteen_bytes() {
        let e = envelope();
        let mut bytes = e.encode();
        assert_eq!(&bytes[..16], &[7; 16]);
        assert_eq!(AgentEnvelope::decode(&bytes).unwrap(), e);
        assert!(stamp_msg_id(&mut bytes, MsgId([9; 16])));
        assert_eq!(AgentEnvelope::decode(&bytes).unwrap().id, MsgId([9; 16]));
        assert!(!stamp_msg_id(&mut [0u8; 15], MsgId([9; 16])));
    }

    #[test]
    fn an_envelope_with_a_bad_name_trailing_bytes_or_padding_is_refused() {
        let mut bytes = envelope().encode();
        bytes.push(0);
        assert!(AgentEnvelope::decode(&bytes).is_err());
        let bad = AgentEnvelope {
            from: AgentName("Bad".into()),
            ..envelope()
        };
        assert!(AgentEnvelope::decode(&bad.encode()).is_err());
        // The body length is the last varint before the body: pad it.
        let e = envelope();
        let bytes = e.encode();
        let n = bytes.len();
        let mut padded = bytes[..n - 3].to_vec();
        padded.extend_from_slice(&[0x82, 0x00]);
        padded.extend_from_slice(b"hi");
        assert_eq!(postcard::from_bytes::<AgentEnvelope>(&padded).unwrap(), e);
        assert!(matches!(
            AgentEnvelope::decode(&padded),
            Err(AgentError::Malformed { why, .. }) if why.contains("not canonical")
        ));
    }

    #[test]
    fn a_header_decodes_as_its_envelope_does_without_copying_the_body() {
        let e = envelope();
        let bytes = e.encode();
        let h = AgentHeader::decode(&bytes).unwrap();
        assert_eq!(
            (h.id, &h.from, &h.to, h.body),
            (e.id, &e.from, &e.to, &b"hi"[..])
        );
        let mut long = bytes.clone();
        long.push(0);
        assert!(AgentHeader::decode(&long).is_err());
    }

    #[test]
    fn message_ids_differ_by_every_field_they_are_derived_from() {
        let a = SecretKey::from_bytes(&[1; 32]).public();
        let b = SecretKey::from_bytes(&[2; 32]).public();
        let e = Epoch([3; 16]);
        let id = MsgId::derive(&a, e, &b, 1);
        assert_ne!(id, MsgId::derive(&b, e, &a, 1));
        assert_ne!(id, MsgId::derive(&a, Epoch([4; 16]), &b, 1));
        assert_ne!(id, MsgId::derive(&a, e, &b, 2));
        assert!(
            MsgId::derive(&a, e, &b, 2) > id,
            "one stream's ids sort by seq"
        );
        assert_eq!(id.to_string().parse::<MsgId>().unwrap(), id);
        assert!("xyz".parse::<MsgId>().is_err());
    }

    #[test]
    fn a_card_verifies_only_as_signed() {
        let agent = SecretKey::from_bytes(&[5; 32]);
        let node = SecretKey::from_bytes(&[6; 32]).public();
        let card = AgentCard::sign(&agent, node, name("alice"), true, 10);
        assert!(card.verify().is_ok());
        let mut forged = card.clone();
        forged.online = false;
        assert!(forged.verify().is_err());
        let mut other = card.clone();
        other.key = SecretKey::from_bytes(&[7; 32]).public();
        assert!(other.verify().is_err());
    }

    #[test]
    fn mesh_kinds_are_a_small_reserved_range() {
        assert!(!is_mesh_kind(0));
        assert!(is_mesh_kind(KIND_AGENT) && is_mesh_kind(KIND_BOUNCE));
        assert!(is_mesh_kind(KIND_TOMBSTONE) && is_mesh_kind(KIND_FORWARD));
        assert!(!is_mesh_kind(16));
        assert!(!is_mesh_kind(0x6d62));
    }

    #[test]
    fn a_tombstone_decodes_only_as_encoded_and_takes_a_stamped_id() {
        let mut t = Tombstone {
            id: MsgId([0; 16]),
            from: name("alice"),
            to: Some(name("bob")),
            key: SupersedeKey::new("status").unwrap(),
            reason: TombstoneReason::Superseded { by: MsgId([9; 16]) },
        };
        let mut bytes = t.encode();
        assert!(stamp_msg_id(&mut bytes, MsgId([7; 16])));
        t.id = MsgId([7; 16]);
        assert_eq!(Tombstone::decode(&bytes).unwrap(), t);
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Tombstone::decode(&longer).is_err(), "trailing bytes");
        assert!(Tombstone::decode(&bytes[..bytes.len() - 1]).is_err());
        // The reason is an enum of one variant: any other tag is refused.
        let last = bytes.len() - 17;
        let mut other = bytes.clone();
        other[last] = 1;
        assert!(Tombstone::decode(&other).is_err(), "unknown reason");
        let longest = Tombstone {
            id: MsgId([0xff; 16]),
            from: name(&"a".repeat(MAX_AGENT_NAME_BYTES)),
            to: Some(name(&"b".repeat(MAX_AGENT_NAME_BYTES))),
            key: SupersedeKey::new(&"k".repeat(MAX_SUPERSEDE_KEY_BYTES)).unwrap(),
            reason: TombstoneReason::Superseded {
                by: MsgId([0xff; 16]),
            },
        };
        assert!(longest.encode().len() as u64 <= MAX_TOMBSTONE_BYTES);
    }
}
