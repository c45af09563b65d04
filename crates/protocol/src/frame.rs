//! Frames between daemons: a 4-byte big-endian length, then a postcard body.
//!
//! The length is checked against [`MAX_FRAME_BYTES`] before anything is read
//! or decoded, and a body with bytes left over after the frame is refused.

use std::fmt;

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::batch::{MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES, SignedBatch};
use crate::ids::{Epoch, NodeId, Seq, StreamId};

/// The protocol version a node speaks, sent in [`Frame::Hello`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Bytes of the length prefix in front of every frame body.
pub const FRAME_HEADER_BYTES: usize = 4;

/// The largest frame body: a full batch's payloads plus room for its headers.
pub const MAX_FRAME_BYTES: usize = MAX_BATCH_PAYLOAD_BYTES as usize + 64 * 1024;

/// The most marks one [`Frame::Hello`] may carry.
pub const MAX_HELLO_MARKS: usize = 4096;

/// A receiver's mark on a stream: every envelope up to `seq` is committed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mark {
    /// The stream.
    pub stream: StreamId,
    /// The highest seq such that every envelope up to it is committed.
    pub seq: Seq,
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
        node: NodeId,
        /// The sender's store epoch.
        epoch: Epoch,
        /// The sender's marks for streams the receiver authors.
        marks: Vec<Mark>,
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
        }
    }
}

/// Variant names by postcard tag, in declaration order.
const FRAME_NAMES: [&str; 6] = ["Hello", "Batch", "Ack", "Resync", "ResyncGap", "ResyncDone"];

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
}

/// Appends `frame` to `out` as a length prefix and a postcard body.
///
/// Errors (and leaves `out` as it was) if the body would exceed [`MAX_FRAME_BYTES`].
pub fn encode_frame(frame: &Frame, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    let taken = std::mem::take(out);
    let mut buf = match postcard::to_extend(frame, taken) {
        Ok(buf) => buf,
        // Unreachable for these types; keep the caller's bytes either way.
        Err(e) => {
            return Err(FrameError::Malformed { frame: frame.name(), why: e.to_string() });
        }
    };
    let len = buf.len() - start - FRAME_HEADER_BYTES;
    if len > MAX_FRAME_BYTES {
        buf.truncate(start);
        *out = buf;
        return Err(FrameError::TooLarge { len, max: MAX_FRAME_BYTES });
    }
    // len <= MAX_FRAME_BYTES < u32::MAX.
    buf[start..start + FRAME_HEADER_BYTES].copy_from_slice(&(len as u32).to_be_bytes());
    *out = buf;
    Ok(())
}

/// The body length a frame header announces, refused if over [`MAX_FRAME_BYTES`].
pub fn frame_body_len(header: [u8; FRAME_HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len, max: MAX_FRAME_BYTES });
    }
    if len == 0 {
        return Err(FrameError::Empty);
    }
    Ok(len)
}

/// Decodes one frame body (without its length prefix).
pub fn decode_frame(body: &[u8]) -> Result<Frame, FrameError> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { len: body.len(), max: MAX_FRAME_BYTES });
    }
    let tag = *body.first().ok_or(FrameError::Empty)?;
    let name = *FRAME_NAMES.get(usize::from(tag)).ok_or(FrameError::UnknownTag(tag))?;
    let (frame, rest) = postcard::take_from_bytes::<Frame>(body)
        .map_err(|e| FrameError::Malformed { frame: name, why: e.to_string() })?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes { frame: name, extra: rest.len() });
    }
    if let Frame::Hello { marks, .. } = &frame {
        if marks.len() > MAX_HELLO_MARKS {
            return Err(FrameError::TooManyMarks(marks.len()));
        }
    }
    Ok(frame)
}
