//! Shared test helpers: keys, signed batches, a dump of a store's whole state.

use mesh_protocol::{
    Channel, Epoch, Mark, NewEnvelope, NodeId, OpenBatch, SecretKey, Seq, StreamId, TopicName,
};

use crate::{
    EndedOwn, JournalBounds, JournalItem, JournalRecord, MeshStore, OwnStream, PeerRecord, Receipt,
    StoreError, StoredBatch, TopicRecord, WriteOp,
};

/// Declares, for each store implementation (a module each: `mem`,
/// `redb_in_memory`), one `#[test]` per rule named, each calling the rule
/// (a `fn(&impl MeshStore)` of the calling module) on a fresh store.
macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        store_suite!(@store mem, crate::MemStore::new(mesh_protocol::Epoch([9; 16])); $($name),*);
        store_suite!(
            @store redb_in_memory,
            crate::RedbStore::in_memory().expect("in-memory store opens");
            $($name),*
        );
        // The agent index folded on every commit, as schema 4 wrote it.
        store_suite!(
            @store redb_folding,
            crate::RedbStore::in_memory()
                .expect("in-memory store opens")
                .folding_every_commit();
            $($name),*
        );
    };
    (@store $module:ident, $make:expr; $($name:ident),*) => {
        mod $module {
            $(
                #[test]
                fn $name() {
                    let store = $make;
                    super::$name(&store);
                }
            )*
        }
    };
}
pub(crate) use store_suite;

/// A fixed secret key per `n`.
pub(crate) fn key(n: u8) -> SecretKey {
    SecretKey::from_bytes(&[n; 32])
}

/// Node `n`'s public key.
pub(crate) fn node(n: u8) -> NodeId {
    key(n).public()
}

/// A payload of `len` bytes that differs per `(seq, tag)`.
pub(crate) fn payload(seq: Seq, tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seq as u8)
                .wrapping_mul(31)
                .wrapping_add(tag)
                .wrapping_add(i as u8)
        })
        .collect()
}

/// A batch of `sizes.len()` envelopes of stream `(key(author), epoch, channel)`
/// starting at `first_seq`; lamport = seq, payload i has `sizes[i]` bytes.
pub(crate) fn batch(
    author: u8,
    epoch: Epoch,
    channel: Channel,
    first_seq: Seq,
    sizes: &[usize],
) -> OpenBatch {
    let envs = sizes
        .iter()
        .enumerate()
        .map(|(i, len)| {
            let seq = first_seq + i as u64;
            NewEnvelope {
                lamport: seq,
                created_ms: 1_000 + seq,
                kind: 0,
                payload: payload(seq, author, *len),
            }
        })
        .collect();
    OpenBatch::sign(&key(author), epoch, channel, first_seq, envs)
        .expect("test batch fits the limits")
}

/// The store's own node in the suites.
pub(crate) const ME: u8 = 1;
/// A peer that both receives from and writes to the store's node.
pub(crate) const PEER: u8 = 2;

/// An own batch of the store `s` to `to`, `n` envelopes of `len` bytes.
pub(crate) fn own(s: &dyn MeshStore, to: u8, first_seq: Seq, n: usize, len: usize) -> OpenBatch {
    batch(
        ME,
        s.meta().epoch,
        Channel::Direct(node(to)),
        first_seq,
        &vec![len; n],
    )
}

/// The stream of `own(s, to, ..)`.
pub(crate) fn own_stream_id(s: &dyn MeshStore, to: u8) -> StreamId {
    StreamId::direct(node(ME), s.meta().epoch, node(to))
}

/// A batch the peer `author` wrote to us in its epoch `[author; 16]`.
pub(crate) fn peer_batch(author: u8, first_seq: Seq, n: usize) -> OpenBatch {
    batch(
        author,
        Epoch([author; 16]),
        Channel::Direct(node(ME)),
        first_seq,
        &vec![16; n],
    )
}

/// The stream of `peer_batch(author, ..)`.
pub(crate) fn peer_stream(author: u8) -> StreamId {
    StreamId::direct(node(author), Epoch([author; 16]), node(ME))
}

/// The topic `builds`.
pub(crate) fn topic() -> TopicName {
    TopicName::new("builds").expect("a topic name")
}

/// Membership of `name` holding `max_msgs` envelopes of each author.
pub(crate) fn member_of(name: TopicName, max_msgs: u64) -> WriteOp {
    WriteOp::JoinTopic(TopicRecord {
        name,
        joined_ms: 5,
        max_msgs,
        max_bytes: 1 << 20,
    })
}

/// Author `author`'s batch of `n` envelopes of the topic, in its epoch `[author; 16]`.
pub(crate) fn topic_batch(author: u8, first: u64, n: usize) -> OpenBatch {
    batch(
        author,
        Epoch([author; 16]),
        Channel::Topic(topic()),
        first,
        &vec![16; n],
    )
}

/// The stream of `topic_batch(author, ..)`.
pub(crate) fn topic_stream(author: u8) -> StreamId {
    StreamId {
        author: node(author),
        epoch: Epoch([author; 16]),
        channel: Channel::Topic(topic()),
    }
}

/// Commits one group and returns its result.
pub(crate) fn commit1(s: &dyn MeshStore, ops: Vec<WriteOp>) -> Result<Receipt, StoreError> {
    let mut out = s.commit(vec![ops]);
    assert_eq!(out.len(), 1, "one result per group");
    out.remove(0)
}

/// Appends an own batch without eviction and expects success.
/// Commits the acceptance of peer batch `batch` from seq `from`, alone.
pub(crate) fn accept1(
    s: &dyn MeshStore,
    batch: OpenBatch,
    from: Seq,
) -> Result<Receipt, StoreError> {
    commit1(s, vec![WriteOp::Accept { batch, from }])
}

pub(crate) fn append_ok(s: &dyn MeshStore, ops: OpenBatch) -> Receipt {
    commit1(
        s,
        vec![WriteOp::AppendOwn {
            batch: ops,
            evict: None,
        }],
    )
    .expect("append commits")
}

/// The state of the stream `stream` among `s.own_streams()`.
pub(crate) fn own_state(s: &dyn MeshStore, stream: &StreamId) -> Option<OwnStream> {
    s.own_streams()
        .expect("own streams read")
        .into_iter()
        .find(|o| &o.stream == stream)
}

/// The whole journal.
pub(crate) fn journal(s: &dyn MeshStore) -> Vec<JournalItem> {
    s.journal(0, usize::MAX).expect("journal read")
}

/// Every outbox batch of `stream`.
pub(crate) fn outbox(s: &dyn MeshStore, stream: &StreamId) -> Vec<StoredBatch> {
    s.read_outbox(stream, 0, u64::MAX).expect("outbox read")
}

/// The mark of `stream`, 0 if none.
pub(crate) fn mark(s: &dyn MeshStore, stream: &StreamId) -> u64 {
    s.marks()
        .expect("marks read")
        .into_iter()
        .find(|m| &m.stream == stream)
        .map_or(0, |m| m.seq)
}

/// Everything a store holds, as the read API shows it, in a comparable form.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Dump {
    pub(crate) own: Vec<OwnStream>,
    pub(crate) outbox: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    pub(crate) marks: Vec<Mark>,
    pub(crate) journal: Vec<(u64, JournalRecord)>,
    pub(crate) head: u64,
    /// The journal's retained range (its bytes differ between implementations).
    pub(crate) range: (u64, u64),
    pub(crate) ended: Vec<EndedOwn>,
    pub(crate) epoch: Epoch,
    pub(crate) peers: Vec<PeerRecord>,
    pub(crate) cursors: Vec<Option<u64>>,
    pub(crate) max_lamport: u64,
    pub(crate) topics: Vec<crate::TopicRecord>,
}

/// Dumps `s`, reading the named cursors.
pub(crate) fn dump(s: &dyn MeshStore, cursor_names: &[&str]) -> Result<Dump, StoreError> {
    let own = s.own_streams()?;
    let mut outbox = Vec::new();
    for o in &own {
        for b in s.read_outbox(&o.stream, 0, u64::MAX)? {
            let bytes = postcard::to_stdvec(&b.batch).expect("batch encodes");
            outbox.push((bytes, b.payloads));
        }
    }
    let mut marks = s.marks()?;
    marks.sort_by(|a, b| a.stream.cmp(&b.stream));
    Ok(Dump {
        own,
        outbox,
        marks,
        journal: s
            .journal(0, usize::MAX)?
            .into_iter()
            .map(|i| (i.arrival, i.record))
            .collect(),
        head: s.journal_head()?,
        range: {
            let b: JournalBounds = s.journal_bounds()?;
            (b.first, b.head)
        },
        ended: s.ended_own()?,
        epoch: s.meta().epoch,
        peers: s.peers()?,
        cursors: cursor_names
            .iter()
            .map(|n| s.cursor(n))
            .collect::<Result<_, _>>()?,
        max_lamport: s.max_lamport()?,
        topics: s.topics()?,
    })
}

/// A short, deterministic digest of a dump.
pub(crate) fn digest(d: &Dump) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    format!("{d:?}").hash(&mut h);
    h.finish()
}
