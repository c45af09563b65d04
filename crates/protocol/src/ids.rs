//! Identities: nodes, store epochs, channels and streams.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};

/// A node's identity: its iroh endpoint id, an ed25519 public key.
pub type NodeId = iroh_base::PublicKey;

/// A node's secret key; its public half is the [`NodeId`].
pub type SecretKey = iroh_base::SecretKey;

/// A sequence number within one stream. Dense, starting at 1; 0 means "none yet".
pub type Seq = u64;

/// The longest topic name, in bytes.
pub const MAX_TOPIC_NAME_BYTES: usize = 64;

/// Errors parsing an id from text or bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// A topic name was empty, too long, or had a character outside `[a-z0-9._/-]`.
    #[error("bad topic name {name:?}: {why}")]
    BadTopicName {
        /// The rejected name (cut to a printable length).
        name: String,
        /// What was wrong with it.
        why: &'static str,
    },
    /// An epoch was not 32 hex digits.
    #[error("bad epoch {0:?}: expected 32 hex digits")]
    BadEpoch(String),
}

/// A store's epoch: random 128 bits chosen when the store is created.
///
/// A node that loses its store but keeps its key starts a new epoch, so its
/// fresh sequence numbers are never mistaken for replays of the old ones.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Epoch(pub [u8; 16]);

impl Epoch {
    /// The epoch's bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The first 4 bytes in hex, for logs.
    pub fn fmt_short(&self) -> String {
        data_encoding::HEXLOWER.encode(&self.0[..4])
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&data_encoding::HEXLOWER.encode(&self.0))
    }
}

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Epoch({})", self.fmt_short())
    }
}

impl FromStr for Epoch {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = data_encoding::HEXLOWER_PERMISSIVE
            .decode(s.as_bytes())
            .map_err(|_| IdError::BadEpoch(cut(s)))?;
        let arr: [u8; 16] = bytes.try_into().map_err(|_| IdError::BadEpoch(cut(s)))?;
        Ok(Epoch(arr))
    }
}

/// A topic's name: 1 to [`MAX_TOPIC_NAME_BYTES`] bytes of `[a-z0-9._/-]`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct TopicName(String);

impl TopicName {
    /// Checks `name` and wraps it.
    pub fn new(name: &str) -> Result<Self, IdError> {
        let bad = |why| IdError::BadTopicName {
            name: cut(name),
            why,
        };
        if name.is_empty() {
            return Err(bad("it is empty"));
        }
        if name.len() > MAX_TOPIC_NAME_BYTES {
            return Err(bad("it is longer than 64 bytes"));
        }
        if !name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'/' | b'-'))
        {
            return Err(bad("only a-z, 0-9 and . _ / - are allowed"));
        }
        Ok(TopicName(name.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for TopicName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Borrowing would fail on owned inputs; a String is at most the frame cap.
        let s = String::deserialize(d)?;
        TopicName::new(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Topic({})", self.0)
    }
}

/// Where a stream goes: one recipient node, or every member of a topic.
// Equality is by key bytes (see `same_node`); Hash and Ord are by the same
// bytes, so the derived ones agree with it.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Channel {
    /// Messages for exactly one node.
    Direct(#[serde(with = "node_id_serde")] NodeId),
    /// Messages for every member of a topic (replication comes in a later layer).
    Topic(TopicName),
}

impl PartialEq for Channel {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Channel::Direct(a), Channel::Direct(b)) => same_node(a, b),
            (Channel::Topic(a), Channel::Topic(b)) => a == b,
            _ => false,
        }
    }
}

/// Whether `a` and `b` are the same node: their key bytes compared plainly.
///
/// `PublicKey`'s own `==` is constant-time (a `subtle` compare, byte by
/// byte behind an optimisation barrier), which a public key does not need;
/// streams are compared per message on the hot path (the store's index
/// runs, the core's maps), where it was a measured share of the store
/// writer's time (`docs/benchmarks.md`, "Agent-addressed sends").
pub fn same_node(a: &NodeId, b: &NodeId) -> bool {
    a.as_bytes() == b.as_bytes()
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Channel::Direct(to) => write!(f, "Direct({})", to.fmt_short()),
            Channel::Topic(t) => write!(f, "{t:?}"),
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Channel::Direct(to) => write!(f, "direct:{to}"),
            Channel::Topic(t) => write!(f, "topic:{t}"),
        }
    }
}

/// One stream: every envelope one author wrote in one store epoch to one channel.
///
/// Sequence numbers are dense per stream, starting at 1, so "everything after
/// N" is well defined for every reader.
// Equality as `Channel`'s: by key bytes, which Hash and Ord also use.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StreamId {
    /// The node that writes and signs the stream.
    #[serde(with = "node_id_serde")]
    pub author: NodeId,
    /// The author's store epoch.
    pub epoch: Epoch,
    /// Where the stream goes.
    pub channel: Channel,
}

impl PartialEq for StreamId {
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch
            && same_node(&self.author, &other.author)
            && self.channel == other.channel
    }
}

impl StreamId {
    /// A direct stream from `author` (in `epoch`) to `to`.
    pub fn direct(author: NodeId, epoch: Epoch, to: NodeId) -> Self {
        StreamId {
            author,
            epoch,
            channel: Channel::Direct(to),
        }
    }

    /// The recipient of a direct stream, `None` for a topic.
    pub fn recipient(&self) -> Option<NodeId> {
        match &self.channel {
            Channel::Direct(to) => Some(*to),
            Channel::Topic(_) => None,
        }
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Stream({}/{}/{:?})",
            self.author.fmt_short(),
            self.epoch.fmt_short(),
            self.channel
        )
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.author, self.epoch, self.channel)
    }
}

/// The most node ids each per-thread memo below remembers; a memo is
/// emptied when full.
const NODE_ID_MEMO_MAX: usize = 1024;

/// Looks `key` up in `memo`, else runs `parse` and remembers what it gave.
///
/// Checking a node id — that its 32 bytes are a point on the curve — costs
/// a point decompression (tens of microseconds), and a mesh has few nodes:
/// remembering the ids already checked keeps that cost off per-message paths.
fn memoised<K, E>(
    memo: &'static std::thread::LocalKey<std::cell::RefCell<std::collections::HashMap<K, NodeId>>>,
    key: &K,
    parse: impl FnOnce() -> Result<NodeId, E>,
) -> Result<NodeId, E>
where
    K: Clone + Eq + std::hash::Hash,
{
    if let Some(id) = memo.with(|m| m.borrow().get(key).copied()) {
        return Ok(id);
    }
    let id = parse()?;
    memo.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= NODE_ID_MEMO_MAX {
            m.clear();
        }
        m.insert(key.clone(), id);
    });
    Ok(id)
}

thread_local! {
    static NODE_IDS_BY_BYTES: std::cell::RefCell<std::collections::HashMap<[u8; 32], NodeId>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
    static NODE_IDS_BY_TEXT: std::cell::RefCell<std::collections::HashMap<Box<str>, NodeId>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Parses a node id from its text form (as `NodeId`'s `FromStr` does),
/// checking each distinct text once per thread: clients name the same few
/// peers in every message.
///
/// # Errors
/// What `NodeId::from_str` says of a text that is not a node id.
pub fn parse_node_id(text: &str) -> Result<NodeId, <NodeId as FromStr>::Err> {
    let key: Box<str> = text.into();
    memoised(&NODE_IDS_BY_TEXT, &key, || text.parse::<NodeId>())
}

/// Serde for node ids in binary encodings, with a bounded memo of keys
/// already validated ([`memoised`]): every batch frame carries two ids.
/// Human-readable formats and the encoding itself are unchanged.
pub(crate) mod node_id_serde {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{NODE_IDS_BY_BYTES, NodeId, memoised};

    pub(crate) fn serialize<S: Serializer>(id: &NodeId, s: S) -> Result<S::Ok, S::Error> {
        id.serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NodeId, D::Error> {
        if d.is_human_readable() {
            return NodeId::deserialize(d);
        }
        let bytes = <[u8; 32]>::deserialize(d)?;
        memoised(&NODE_IDS_BY_BYTES, &bytes, || {
            NodeId::from_bytes(&bytes).map_err(serde::de::Error::custom)
        })
    }
}

/// Cuts untrusted text to a length fit for an error message.
pub(crate) fn cut(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_are_bounded_and_restricted() {
        assert!(TopicName::new("agents/planner.v1").is_ok());
        assert!(TopicName::new("").is_err());
        assert!(TopicName::new(&"a".repeat(65)).is_err());
        assert!(TopicName::new(&"a".repeat(64)).is_ok());
        assert!(TopicName::new("Upper").is_err());
        assert!(TopicName::new("sp ace").is_err());
    }

    #[test]
    fn a_topic_name_that_breaks_the_rules_does_not_decode() {
        let bytes = postcard::to_stdvec(&"UPPER".to_string()).unwrap();
        assert!(postcard::from_bytes::<TopicName>(&bytes).is_err());
    }

    #[test]
    fn an_invalid_node_key_never_decodes_even_after_valid_ones_are_memoised() {
        let bad = (0u8..=255)
            .map(|b| [b; 32])
            .find(|k| NodeId::from_bytes(k).is_err())
            .expect("some constant 32-byte string is not a curve point");
        let good = SecretKey::from_bytes(&[9; 32]).public();
        let stream = StreamId::direct(good, Epoch([1; 16]), good);
        let bytes = postcard::to_stdvec(&stream).unwrap();
        for _ in 0..2 {
            assert_eq!(postcard::from_bytes::<StreamId>(&bytes).unwrap(), stream);
        }
        let mut forged = bytes.clone();
        forged[..32].copy_from_slice(&bad);
        for _ in 0..2 {
            assert!(postcard::from_bytes::<StreamId>(&forged).is_err());
        }
    }

    #[test]
    fn a_node_id_parsed_from_text_is_checked_once_and_never_memoised_when_bad() {
        let good = SecretKey::from_bytes(&[9; 32]).public();
        let text = good.to_string();
        for _ in 0..2 {
            assert_eq!(parse_node_id(&text).unwrap(), good);
        }
        let bad = (0u8..=255)
            .map(|b| [b; 32])
            .find(|k| NodeId::from_bytes(k).is_err())
            .expect("some constant 32-byte string is not a curve point");
        let bad_text = data_encoding::HEXLOWER.encode(&bad);
        for _ in 0..2 {
            assert!(parse_node_id(&bad_text).is_err());
            assert!(parse_node_id("not a node id").is_err());
        }
    }

    #[test]
    fn epochs_round_trip_through_text() {
        let e = Epoch([7; 16]);
        assert_eq!(e.to_string().parse::<Epoch>().unwrap(), e);
        assert!("xyz".parse::<Epoch>().is_err());
    }
}
