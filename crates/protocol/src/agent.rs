//! Agents: their names, their announcement cards, and the payload formats
//! of the mesh's own envelope kinds (an agent message, a bounce, a read
//! receipt).
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
use crate::ids::{Epoch, NodeId, Seq, cut};

mod signed;

pub use signed::{AgentCard, AgentMove, MAX_READ_RECEIPT_BYTES, MAX_RECEIPT_IDS, ReadReceipt};

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
/// A read receipt: the payload is a [`ReadReceipt`], sent back to the
/// author of agent messages that asked for one once their reader acked
/// past them.
pub const KIND_READ_RECEIPT: u16 = 6;

/// The longest agent name, in bytes.
pub const MAX_AGENT_NAME_BYTES: usize = 64;
/// The longest supersede key, in bytes.
pub const MAX_SUPERSEDE_KEY_BYTES: usize = 128;

/// The most bytes an [`AgentEnvelope`] takes besides its body: the id, two
/// names, what it answers and a key, each with its length or tag, the
/// body's length and the trailing flags byte.
const ENVELOPE_HEAD_BYTES_MAX: usize = 16
    + (1 + MAX_AGENT_NAME_BYTES)
    + (2 + MAX_AGENT_NAME_BYTES)
    + 17
    + (3 + MAX_SUPERSEDE_KEY_BYTES)
    + 10
    + 1;
/// The trailing flags byte of an [`AgentEnvelope`] that asks for a read
/// receipt. An envelope without flags ends after its body, so every
/// envelope written before receipts existed decodes unchanged.
const FLAG_RECEIPT: u8 = 0x01;
/// The most cards one [`crate::Frame::Agents`] may carry (also the most
/// agents a node hosts).
pub const MAX_AGENT_CARDS: usize = 256;

/// The domain tag signed before an agent card's fields.
pub const AGENT_CARD_DOMAIN: &[u8] = b"agent-mesh/agent-card/v1\0";
/// The domain tag signed before an agent move notice's fields.
pub const AGENT_MOVE_DOMAIN: &[u8] = b"agent-mesh/agent-move/v1\0";
/// The domain tag signed before a read receipt's fields.
pub const READ_RECEIPT_DOMAIN: &[u8] = b"agent-mesh/read-receipt/v1\0";
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
    /// An agent card's (or notice's, or receipt's) signature does not
    /// verify under its agent key.
    #[error("the signature of agent {0} does not verify under its key")]
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
    /// Whether the sender asks for a [`ReadReceipt`] once the recipient
    /// agent has read it. Not a postcard field: the one trailing flags
    /// byte `FLAG_RECEIPT` (0x01) after the body, present only when `true`.
    #[serde(skip)]
    pub receipt: bool,
}

impl AgentEnvelope {
    /// The payload bytes: the postcard fields, then the flags byte if
    /// `receipt`.
    pub fn encode(&self) -> Vec<u8> {
        // Sized up front: the body is most of it, and growing a Vec piece
        // by piece reallocates (and copies) the body on every agent send.
        let room = self.body.len() + ENVELOPE_HEAD_BYTES_MAX;
        // Serializing plain structs into a Vec cannot fail.
        let mut out = postcard::to_extend(self, Vec::with_capacity(room))
            .unwrap_or_else(|_| unreachable!("postcard into Vec"));
        if self.receipt {
            out.push(FLAG_RECEIPT);
        }
        out
    }

    /// Decodes a payload of kind [`KIND_AGENT`]: at most
    /// [`MAX_BATCH_PAYLOAD_BYTES`], canonical postcard, then nothing (no
    /// receipt asked) or exactly the flags byte `FLAG_RECEIPT` (0x01); every
    /// name and key checked.
    pub fn decode(payload: &[u8]) -> Result<AgentEnvelope, AgentError> {
        let (mut e, receipt): (AgentEnvelope, bool) = decode_flagged(payload)?;
        e.receipt = receipt;
        Ok(e)
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
    /// As [`AgentEnvelope::receipt`] (the trailing flags byte).
    #[serde(skip)]
    pub receipt: bool,
}

impl<'a> AgentHeader<'a> {
    /// Decodes `payload` exactly as [`AgentEnvelope::decode`] does (the
    /// same checks, the same refusals), borrowing the body.
    pub fn decode(payload: &'a [u8]) -> Result<AgentHeader<'a>, AgentError> {
        let (mut h, receipt): (AgentHeader<'a>, bool) = decode_flagged(payload)?;
        h.receipt = receipt;
        Ok(h)
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

/// Decodes `payload` as the one canonical encoding of an agent envelope:
/// a `T`'s canonical postcard, then nothing (`false`) or exactly
/// `FLAG_RECEIPT` (`true`).
fn decode_flagged<'a, T: Serialize + Deserialize<'a>>(
    payload: &'a [u8],
) -> Result<(T, bool), AgentError> {
    decode_then(payload, "agent envelope", |rest| match rest {
        [] => Ok(false),
        [FLAG_RECEIPT] => Ok(true),
        [b] => Err(format!("unknown flags byte {b:#04x}")),
        _ => Err(format!("{} trailing bytes", rest.len())),
    })
}

/// Decodes `payload` as the one canonical postcard encoding of a `T`.
fn decode_canonical<'a, T: Serialize + Deserialize<'a>>(
    payload: &'a [u8],
    what: &'static str,
) -> Result<T, AgentError> {
    let (value, ()) = decode_then(payload, what, |rest| match rest {
        [] => Ok(()),
        _ => Err(format!("{} trailing bytes", rest.len())),
    })?;
    Ok(value)
}

/// Decodes a `T` from the start of `payload` (at most
/// [`MAX_BATCH_PAYLOAD_BYTES`]), hands what follows it to `rest` (which
/// says what it means, or why it is refused), and refuses a `T` that is
/// not canonical postcard.
fn decode_then<'a, T: Serialize + Deserialize<'a>, R>(
    payload: &'a [u8],
    what: &'static str,
    rest: impl FnOnce(&[u8]) -> Result<R, String>,
) -> Result<(T, R), AgentError> {
    if payload.len() as u64 > MAX_BATCH_PAYLOAD_BYTES {
        return Err(AgentError::TooLarge {
            what,
            len: payload.len(),
        });
    }
    let malformed = |why: String| AgentError::Malformed { what, why };
    let (value, tail) =
        postcard::take_from_bytes::<T>(payload).map_err(|e| malformed(e.to_string()))?;
    let after = rest(tail).map_err(malformed)?;
    // As for frames: a varint with redundant bytes re-encodes shorter.
    let fields = payload.len() - tail.len();
    let canonical = encoded_len(&value).map_err(|e| malformed(e.to_string()))?;
    if canonical != fields {
        return Err(malformed(format!(
            "not canonical: {fields} bytes re-encode as {canonical}"
        )));
    }
    Ok((value, after))
}

#[cfg(test)]
mod tests;
