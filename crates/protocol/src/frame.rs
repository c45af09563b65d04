//! Frames between daemons: a 4-byte big-endian length, then a postcard body.
//!
//! The length is checked against [`MAX_FRAME_BYTES`] before anything is read
//! or decoded, and a body with bytes left over after the frame is refused.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::agent::{AgentCard, AgentMove, MAX_AGENT_CARDS};
use crate::batch::{Cid, MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES, SignedBatch};
use crate::card::NodeCard;
use crate::ids::{Epoch, NodeId, Seq, StreamId, TopicName};

/// The protocol version a node speaks, sent in [`Frame::Hello`] (and, as
/// its digit, in the connection preamble).
/// 3: [`Frame::Topics`]. 4: [`Frame::Moves`]. 5: [`Frame::Followed`].
/// 6: read receipts ([`crate::KIND_READ_RECEIPT`], the envelope flags byte).
pub const PROTOCOL_VERSION: u32 = 6;

/// Bytes of the length prefix in front of every frame body.
pub const FRAME_HEADER_BYTES: usize = 4;

/// The largest frame body: a full batch's payloads plus room for its headers.
pub const MAX_FRAME_BYTES: usize = MAX_BATCH_PAYLOAD_BYTES as usize + 64 * 1024;

/// The most marks one [`Frame::Hello`] (or [`Frame::Topics`]) may carry.
pub const MAX_HELLO_MARKS: usize = 4096;

/// The most topics one [`Frame::Topics`] may name.
pub const MAX_FRAME_TOPICS: usize = 256;

/// The most move notices one [`Frame::Moves`] may carry.
pub const MAX_FRAME_MOVES: usize = 256;

/// A receiver's mark on a stream: every envelope up to `seq` is committed.
///
/// `cid` is the payload hash of the envelope at `seq` as the receiver
/// committed it, when it has one (not after a gap record moved the mark):
/// it lets the author check that the receiver holds *its* envelope at that
/// seq, and so tell a store that went back in time (or a clone writing the
/// same stream) from a receiver that is merely ahead.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mark {
    /// The stream.
    pub stream: StreamId,
    /// The highest seq such that every envelope up to it is committed.
    pub seq: Seq,
    /// The payload hash of the envelope at `seq`, if known.
    pub cid: Option<Cid>,
}

/// One message between two daemons on their frame stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// First frame each way: who I am, which store epoch, and my marks for
    /// the streams you author and I receive.
    Hello {
        /// [`PROTOCOL_VERSION`] of the sender.
        version: u32,
        /// The sender's node id (must match the connection's key).
        #[serde(with = "crate::ids::node_id_serde")]
        node: NodeId,
        /// The sender's store epoch.
        epoch: Epoch,
        /// The sender's marks for streams the receiver authors.
        marks: Vec<Mark>,
        /// The sender's newest card: its name and where it listens now
        /// (boxed: a frame stays the size of its common variants).
        card: Box<NodeCard>,
    },
    /// A signed batch with its payloads, one per entry.
    Batch {
        /// The batch, exactly as its author signed it.
        batch: SignedBatch,
        /// The payloads, in entry order.
        payloads: Payloads,
    },
    /// The receiver has committed every envelope of `stream` up to `upto`.
    Ack {
        /// The stream.
        stream: StreamId,
        /// The receiver's new mark.
        upto: Seq,
    },
    /// Please send everything of `stream` after `after`.
    Resync {
        /// The stream.
        stream: StreamId,
        /// The asker's mark.
        after: Seq,
    },
    /// The author no longer holds what the asker wants: the first it still
    /// holds is `earliest_available` (one past its last seq if it holds nothing).
    ResyncGap {
        /// The stream.
        stream: StreamId,
        /// The earliest seq the author can still send.
        earliest_available: Seq,
    },
    /// The author has sent everything of `stream` it has, up to `upto`.
    ResyncDone {
        /// The stream.
        stream: StreamId,
        /// The author's last seq.
        upto: Seq,
    },
    /// Please send me the newest card you hold of `node` (a peer of both of
    /// us that I cannot reach).
    CardQuery {
        /// The node asked about.
        #[serde(with = "crate::ids::node_id_serde")]
        node: NodeId,
    },
    /// The answer to a [`Frame::CardQuery`]: the newest card held of `node`,
    /// if any. The card is signed by `node`, so whoever passes it on cannot
    /// change it.
    CardAnswer {
        /// The node asked about.
        #[serde(with = "crate::ids::node_id_serde")]
        node: NodeId,
        /// Its newest card held here.
        card: Option<Box<NodeCard>>,
    },
    /// Every agent the sender hosts now (at most [`MAX_AGENT_CARDS`]), each
    /// card signed by its agent's key: it replaces what the receiver knew
    /// of the sender's agents.
    Agents {
        /// The cards.
        cards: Vec<AgentCard>,
    },
    /// The author's `stream` (of an epoch it no longer writes) has ended:
    /// its store holds it up to `held` as the receiver may have it, and
    /// nothing later of it will ever come. Sent when the author's store
    /// went back in time (a restored backup, a clone), so that a receiver
    /// that holds more of the stream can say which seqs the author lost.
    StreamEnded {
        /// The ended stream.
        stream: StreamId,
        /// The last seq the author's store holds as it sent it.
        held: Seq,
    },
    /// The topics the sender is a member of now (it replaces what the
    /// receiver knew, once the last page came), and its marks for the
    /// author streams of them it holds: a version vector, the receiver
    /// sends what the sender lacks of the topics both are members of. A
    /// vector of more than [`MAX_HELLO_MARKS`] marks (or more than
    /// [`MAX_FRAME_TOPICS`] topics) comes in pages, each but the last with
    /// `more` set; every page names topics and marks of its own.
    Topics {
        /// Topics the sender is a member of.
        topics: Vec<TopicName>,
        /// The sender's marks for streams of those topics.
        marks: Vec<Mark>,
        /// Another page follows.
        more: bool,
    },
    /// Agents' move notices: the newest the sender holds of each agent that
    /// ever moved (after its `Hello`, in pages of at most
    /// [`MAX_FRAME_MOVES`], each but the last with `more` set), or one it
    /// has just learned. Each is signed by its agent's key, so any node
    /// passes them on; a receiver keeps, per agent, the one that wins.
    Moves {
        /// The notices.
        notices: Vec<AgentMove>,
        /// Another page follows.
        more: bool,
    },
    /// The sender follows the moves of `agents` away from the receiver:
    /// it holds the notice of each and sends to it at its new host from
    /// now on, so nothing for any of them comes on `stream` (the sender's
    /// stream to the receiver) after `through`. At most
    /// [`MAX_FRAME_MOVES`] agents (agent keys) per frame; the old host of
    /// an agent ends its drain once every peer follows and it has
    /// received their streams that far.
    Followed {
        /// The sender's stream to the receiver.
        stream: StreamId,
        /// The last seq of `stream` that may hold a message for one of
        /// `agents`.
        through: Seq,
        /// The agents' keys.
        agents: Vec<NodeId>,
    },
}

impl Frame {
    /// The frame's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        FRAME_NAMES[self.tag()]
    }

    fn tag(&self) -> usize {
        match self {
            Frame::Hello { .. } => 0,
            Frame::Batch { .. } => 1,
            Frame::Ack { .. } => 2,
            Frame::Resync { .. } => 3,
            Frame::ResyncGap { .. } => 4,
            Frame::ResyncDone { .. } => 5,
            Frame::CardQuery { .. } => 6,
            Frame::CardAnswer { .. } => 7,
            Frame::Agents { .. } => 8,
            Frame::StreamEnded { .. } => 9,
            Frame::Topics { .. } => 10,
            Frame::Moves { .. } => 11,
            Frame::Followed { .. } => LAST_TAG,
        }
    }
}

/// The postcard tag of [`Frame::Followed`]: its place in the enum's
/// declaration order (the variant is declared last, so this is also the
/// highest tag).
const LAST_TAG: usize = 12;

/// Variant names by postcard tag, in declaration order.
const FRAME_NAMES: [&str; LAST_TAG + 1] = [
    "Hello",
    "Batch",
    "Ack",
    "Resync",
    "ResyncGap",
    "ResyncDone",
    "CardQuery",
    "CardAnswer",
    "Agents",
    "StreamEnded",
    "Topics",
    "Moves",
    "Followed",
];

/// The payloads of a batch frame, each encoded as length-prefixed bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Payloads(pub Vec<Vec<u8>>);

impl fmt::Debug for Payloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payloads({} items)", self.0.len())
    }
}

impl Serialize for Payloads {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for p in &self.0 {
            seq.serialize_element(serde_bytes::Bytes::new(p))?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Payloads {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Payloads;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "at most {MAX_BATCH_ENTRIES} payloads")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Payloads, A::Error> {
                // The declared length is untrusted: never preallocate past the cap.
                let hint = seq.size_hint().unwrap_or(0).min(MAX_BATCH_ENTRIES);
                let mut out = Vec::with_capacity(hint);
                while let Some(p) = seq.next_element::<serde_bytes::ByteBuf>()? {
                    if out.len() == MAX_BATCH_ENTRIES {
                        return Err(serde::de::Error::invalid_length(out.len() + 1, &self));
                    }
                    out.push(p.into_vec());
                }
                Ok(Payloads(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix (or an encoded body) exceeds [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// The declared or encoded length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The body is empty.
    #[error("empty frame body")]
    Empty,
    /// The first byte names no known frame.
    #[error("unknown frame tag {0}")]
    UnknownTag(u8),
    /// The body does not decode as the frame its tag names.
    #[error("malformed {frame} frame: {why}")]
    Malformed {
        /// The frame kind the tag named.
        frame: &'static str,
        /// What postcard reported.
        why: String,
    },
    /// Bytes are left after a whole frame.
    #[error("{frame} frame has {extra} trailing bytes")]
    TrailingBytes {
        /// The frame kind.
        frame: &'static str,
        /// How many bytes were left.
        extra: usize,
    },
    /// A hello carries more than [`MAX_HELLO_MARKS`] marks.
    #[error("Hello frame carries {0} marks, more than the {MAX_HELLO_MARKS} allowed")]
    TooManyMarks(usize),
    /// An agents frame carries more than [`MAX_AGENT_CARDS`] cards.
    #[error("Agents frame carries {0} cards, more than the {MAX_AGENT_CARDS} allowed")]
    TooManyCards(usize),
    /// A topics frame names more than [`MAX_FRAME_TOPICS`] topics or
    /// carries more than [`MAX_HELLO_MARKS`] marks.
    #[error(
        "Topics frame names {topics} topics and {marks} marks, more than the \
         {MAX_FRAME_TOPICS} and {MAX_HELLO_MARKS} allowed"
    )]
    TooManyTopics {
        /// Topics named.
        topics: usize,
        /// Marks carried.
        marks: usize,
    },
    /// A moves frame carries more than [`MAX_FRAME_MOVES`] notices.
    #[error("Moves frame carries {0} notices, more than the {MAX_FRAME_MOVES} allowed")]
    TooManyMoves(usize),
    /// A followed frame names more than [`MAX_FRAME_MOVES`] agents.
    #[error("Followed frame names {0} agents, more than the {MAX_FRAME_MOVES} allowed")]
    TooManyFollowed(usize),
}

/// Appends `frame` to `out` as a length prefix and a postcard body.
///
/// Errors (and leaves `out` as it was) if the body would exceed
/// [`MAX_FRAME_BYTES`] or a [`Frame::Hello`] carries more than
/// [`MAX_HELLO_MARKS`] marks: the same limits [`decode_frame`] enforces, so a
/// frame this encodes is never one a peer must refuse for its size.
pub fn encode_frame(frame: &Frame, out: &mut Vec<u8>) -> Result<(), FrameError> {
    check_counts(frame)?;
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    // Serialize in place: no copy of a 1 MiB body, and `out` is never moved
    // out, so an error below can always restore the caller's bytes.
    if let Err(e) = postcard::to_extend(frame, Append(out)) {
        // Unreachable for these types (postcard only fails on unsupported
        // types or a full fixed buffer); keep the caller's bytes either way.
        out.truncate(start);
        return Err(FrameError::Malformed {
            frame: frame.name(),
            why: e.to_string(),
        });
    }
    let len = out.len() - start - FRAME_HEADER_BYTES;
    if len > MAX_FRAME_BYTES {
        out.truncate(start);
        return Err(FrameError::TooLarge {
            len,
            max: MAX_FRAME_BYTES,
        });
    }
    // len <= MAX_FRAME_BYTES < u32::MAX.
    out[start..start + FRAME_HEADER_BYTES].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// Refuses a hello with more than [`MAX_HELLO_MARKS`] marks and an agents
/// frame with more than [`MAX_AGENT_CARDS`] cards.
fn check_counts(frame: &Frame) -> Result<(), FrameError> {
    match frame {
        Frame::Hello { marks, .. } if marks.len() > MAX_HELLO_MARKS => {
            Err(FrameError::TooManyMarks(marks.len()))
        }
        Frame::Agents { cards } if cards.len() > MAX_AGENT_CARDS => {
            Err(FrameError::TooManyCards(cards.len()))
        }
        Frame::Topics { topics, marks, .. }
            if topics.len() > MAX_FRAME_TOPICS || marks.len() > MAX_HELLO_MARKS =>
        {
            Err(FrameError::TooManyTopics {
                topics: topics.len(),
                marks: marks.len(),
            })
        }
        Frame::Moves { notices, .. } if notices.len() > MAX_FRAME_MOVES => {
            Err(FrameError::TooManyMoves(notices.len()))
        }
        Frame::Followed { agents, .. } if agents.len() > MAX_FRAME_MOVES => {
            Err(FrameError::TooManyFollowed(agents.len()))
        }
        _ => Ok(()),
    }
}

/// Lets postcard append to a borrowed `Vec` (it takes its writer by value).
struct Append<'a>(&'a mut Vec<u8>);

impl Extend<u8> for Append<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

/// The body length a frame header announces, refused if over [`MAX_FRAME_BYTES`].
pub fn frame_body_len(header: [u8; FRAME_HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len,
            max: MAX_FRAME_BYTES,
        });
    }
    if len == 0 {
        return Err(FrameError::Empty);
    }
    Ok(len)
}

/// Decodes one frame body (without its length prefix).
///
/// Refuses, with the error naming the frame kind where known: a body over
/// [`MAX_FRAME_BYTES`], an empty body, an unknown tag, a body that does not
/// decode or is not in canonical form (an integer written with redundant
/// varint bytes), trailing bytes after the frame, and a hello with more than
/// [`MAX_HELLO_MARKS`] marks or an agents frame with more than
/// [`MAX_AGENT_CARDS`] cards. So every frame has exactly one encoding: the one
/// [`encode_frame`] writes. A batch frame is decoded, not verified: call
/// [`SignedBatch::verify`] and then open it with its payloads.
pub fn decode_frame(body: &[u8]) -> Result<Frame, FrameError> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: body.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    // A first byte below the number of variants is a one-byte canonical varint tag.
    let tag = *body.first().ok_or(FrameError::Empty)?;
    let name = *FRAME_NAMES
        .get(usize::from(tag))
        .ok_or(FrameError::UnknownTag(tag))?;
    let (frame, rest) =
        postcard::take_from_bytes::<Frame>(body).map_err(|e| FrameError::Malformed {
            frame: name,
            why: e.to_string(),
        })?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes {
            frame: name,
            extra: rest.len(),
        });
    }
    check_counts(&frame)?;
    // postcard accepts varints with redundant continuation bytes (0x81 0x00 is
    // 1). Each such varint is longer than the canonical one, and every other
    // field has one encoding, so "re-encodes to the same length" is exactly
    // "canonical". Without this a batch frame would have many encodings.
    let canonical = encoded_len(&frame).map_err(|e| FrameError::Malformed {
        frame: name,
        why: e.to_string(),
    })?;
    if canonical != body.len() {
        return Err(FrameError::Malformed {
            frame: name,
            why: format!(
                "not canonical: {} bytes re-encode as {canonical}",
                body.len()
            ),
        });
    }
    Ok(frame)
}

/// The length of `value`'s postcard encoding, counted without writing it.
pub(crate) fn encoded_len<T: Serialize>(value: &T) -> Result<usize, postcard::Error> {
    postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
}

#[cfg(test)]
mod tests;
