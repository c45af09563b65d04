//! The on-disk store: one redb file, `<data>/mesh.redb`.
//!
//! Schema (every table name carries its version):
//!
//! | table            | key                          | value                                   |
//! |------------------|------------------------------|-----------------------------------------|
//! | `meta-v1`        | `"schema_version"`, `"epoch"`, `"max_lamport"`, `"journal_first"`, `"journal_bytes"`, `"last_write_ms"`, `"index_through"`, `"index_deferred_bytes"` | little-endian u32, 16 bytes, then little-endian u64s |
//! | `outbox-v2`      | (postcard `StreamId`, first seq) | postcard (last seq, msgs, bytes, `SignedBatch`, arrival of its first envelope) |
//! | `outbox-payloads-v1` | (postcard `StreamId`, first seq) | postcard payloads of an outbox batch whose journal rows are gone |
//! | `own-streams-v3` | postcard `StreamId`          | postcard (next seq, first retained, last acked, msgs, bytes, evictable msgs, evictable bytes) |
//! | `ended-own-v1`   | postcard `StreamId`          | postcard (held, reported, carried) of an own stream of an earlier epoch |
//! | `marks-v2`       | postcard `StreamId`          | mark                                    |
//! | `mark-cids-v1`   | postcard `StreamId`          | payload hash (32 bytes) of the envelope at the mark |
//! | `journal-v2`     | last arrival in the row      | postcard `Row`: a run of envelopes (from schema 5 maybe with the agent index entries of its envelopes), or one other record |
//! | `journal-times-v1` | first arrival of a commit  | its time, ms since the Unix epoch (one a minute at most) |
//! | `peers-v2`       | node id bytes                | postcard `PeerRecord`                   |
//! | `cursors-v2`     | name                         | arrival                                 |
//! | `cards-v1`       | node id bytes                | postcard `NodeCard`: the newest card of this node and of each peer |
//! | `invites-v1`     | invite id (8 bytes)          | postcard `InviteRecord`                 |
//! | `topics-v1`      | topic name                   | postcard `TopicRecord`: a topic this node is a member of |
//!
//! `cards-v1` and `invites-v1` were added to schema 3 without a version
//! bump (new tables change no existing encoding): a file written before
//! them lacks them, reads take a missing one as empty, and the first
//! commit creates them.
//!
//! `topics-v1` was added to schema 4 in the same way: a file written before
//! it is a member of no topic. A topic's streams need no table of their
//! own: this node's stream of a topic is an own stream like any other, and
//! the batches of another member's stream that it holds for relaying are
//! outbox rows too, under an `own-streams-v3` row whose `last_acked` is one
//! below its `next_seq` (so that all of it may go, quietly).
//!
//! and the agent tables, `agents-v1`, `inbox-v1`, `messages-v1`,
//! `dedup-v1`, `aliases-v1` and `agent-cursors-v1` (`agents.rs`): added
//! after schema 3 without changing it, so a file written before them reads
//! as having no rows in them. `read-v1` (read receipts' marks of sent
//! messages) was added to schema 5 the same way: a file written before it
//! has nothing marked read, and the first receipt creates it.
//!
//! The meta table keeps its name across schema versions, so that a file of
//! another version is recognised by its `schema_version`: one of schema 2,
//! 3 or 4 is migrated when it is opened, one durable transaction per
//! version (2 to 3: its `own-streams-v2` rows gain their evictable counts,
//! counted from the outbox; 3 to 4: the journal's size is counted and the
//! new tables made; 4 to 5: the agent index counts as folded up to the
//! journal's head); any other is refused, and a build of schema 4 refuses
//! a file of schema 5 in the same way (its journal rows may hold index
//! entries that build cannot read).
//!
//! **The agent index is folded, not written per commit** (schema 5). A
//! commit's `inbox-v1` and `messages-v1` entries travel in the journal
//! rows of the envelopes they name (an `Indexed` run: the entries before
//! the envelopes, so that they read without the payloads); once
//! [`INDEX_FOLD_ARRIVALS`] arrivals or [`INDEX_FOLD_BYTES`] of rows were
//! journaled since the last fold (`index_deferred_bytes`), a commit folds
//! them into the two tables and moves `index_through` to its head, where
//! it stays while no row holds an entry. Index
//! readers read the tables up to `index_through` and the rows after it,
//! in one read transaction, so they see every entry exactly once; a crash
//! loses nothing, the rows being in the journal. Writing two tables'
//! pages on every commit cost ~70-90 bytes of disk per agent message
//! (`docs/benchmarks.md`); a row's entries cost 3-8. A commit folds too
//! when it removes an agent, trims the journal or the inboxes past
//! `index_through`, or has an entry a row cannot hold (one at no envelope
//! of its runs, or a message id not its stream's own: a forward, a
//! tombstone), so a row holds only what its stream's tag and seqs rebuild.
//!
//! The journal is trimmed from its oldest row (`WriteOp::Trim`); what is
//! left starts at `journal_first`, and `journal_bytes` counts its rows'
//! keys and values.
//!
//! A journal row holds consecutive envelopes of one stream written in one
//! commit (up to [`JOURNAL_ROW_BYTES_MAX`]), the stream named once: one
//! B-tree insert per row rather than per envelope is what lets a receiver
//! journal a catch-up commit of thousands of envelopes quickly. A row is
//! keyed by its last arrival, so the row holding arrival `a` is the first
//! with a key `>= a`.
//!
//! An outbox row holds its batch's signed headers, not its payloads: the
//! same commit journals every envelope of an own batch, so `read_outbox`
//! takes the payloads from the journal (checking stream, seqs and lengths)
//! and a send writes each payload once. Before a trim removes the journal
//! rows of a batch still in the outbox and unacknowledged, its payloads
//! are copied to `outbox-payloads-v1`, where `read_outbox` looks first.
//!
//! Postcard is canonical for these types, so a stored `SignedBatch` decodes
//! to the value that was signed and re-encodes to the same bytes.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use mesh_protocol::{Cid, Epoch, InviteId, Mark, NodeCard, Seq, SignedBatch, StreamId};
use redb::backends::InMemoryBackend;
use redb::{
    Builder, Database, Durability, ReadableDatabase, ReadableTable, StorageBackend, Table,
    TableDefinition, TableError,
};
use serde::{Deserialize, Serialize};
use serde_bytes::Bytes;

use crate::logic::{self, Base, BatchMeta, Fail, RowInfo, TxCounters, Write};
use crate::mem::gather;
use crate::{
    Arrival, EndedOwn, InviteRecord, JournalBounds, JournalItem, JournalRecord, MeshStore,
    OwnStream, PeerRecord, Receipt, SCHEMA_VERSION, StoreError, StoreMeta, StoredBatch, WriteOp,
};

mod agents;
mod open;
mod read;
mod rows;
mod write;

use open::{init, read_meta, read_u64};
use rows::{EntryRef, INDEXED_TAG, IndexedHead, RowRef, RowView};
use write::outbox_meta;

/// The store file's name inside the data dir.
pub const STORE_FILE_NAME: &str = "mesh.redb";

/// The most memory redb may use to cache the file's pages (reads and the
/// write buffer of a transaction), in bytes.
pub const CACHE_BYTES: usize = 32 << 20;

/// The most bytes (estimated before encoding) of one journal row: a run of
/// envelopes stops growing before it would pass this, so that a row of
/// small envelopes fills one 16 KiB redb page. A single larger envelope is
/// a row of its own.
pub(crate) const JOURNAL_ROW_BYTES_MAX: usize = (16 << 10) - 256;

/// Bytes counted for a run's stream and framing, and for each entry besides
/// its payload (varint lamport, clock, kind and length, with room to spare).
const ROW_OVERHEAD_BYTES: usize = 128;
const ROW_ENTRY_OVERHEAD_BYTES: usize = 32;

const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta-v1");
const OUTBOX: TableDefinition<'_, (&[u8], u64), &[u8]> = TableDefinition::new("outbox-v2");
const OUTBOX_PAYLOADS: TableDefinition<'_, (&[u8], u64), &[u8]> =
    TableDefinition::new("outbox-payloads-v1");
const OWN: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("own-streams-v3");
const ENDED_OWN: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("ended-own-v1");
/// The own-streams table of schema 2, read only to migrate it.
const OWN_V2: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("own-streams-v2");

/// The oldest schema version this build migrates to [`SCHEMA_VERSION`].
const SCHEMA_VERSION_OLDEST: u32 = 2;
const MARKS: TableDefinition<'_, &[u8], u64> = TableDefinition::new("marks-v2");
const MARK_CIDS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("mark-cids-v1");
const JOURNAL: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("journal-v2");
const JOURNAL_TIMES: TableDefinition<'_, u64, u64> = TableDefinition::new("journal-times-v1");
const PEERS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("peers-v2");
const CURSORS: TableDefinition<'_, &str, u64> = TableDefinition::new("cursors-v2");
const CARDS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("cards-v1");
const INVITES: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("invites-v1");
const TOPICS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("topics-v1");

const META_SCHEMA: &str = "schema_version";
const META_EPOCH: &str = "epoch";
const META_MAX_LAMPORT: &str = "max_lamport";
const META_JOURNAL_FIRST: &str = "journal_first";
const META_JOURNAL_BYTES: &str = "journal_bytes";
const META_LAST_WRITE_MS: &str = "last_write_ms";
const META_INDEX_THROUGH: &str = "index_through";
const META_INDEX_DEFERRED_BYTES: &str = "index_deferred_bytes";

/// A commit folds the agent index entries held in journal rows into the
/// index tables once this many arrivals were journaled since the last fold,
/// or [`INDEX_FOLD_BYTES`] of rows: what an index read scans of the journal
/// is bounded by these (and one commit).
pub(crate) const INDEX_FOLD_ARRIVALS: u64 = 4096;
/// See [`INDEX_FOLD_ARRIVALS`].
pub(crate) const INDEX_FOLD_BYTES: u64 = 4 << 20;

/// The bytes a journal row takes, as `journal_bytes` counts them.
fn row_bytes(value_len: usize) -> u64 {
    8 + value_len as u64
}

/// An ended own stream's counters; the stream is the row's key.
#[derive(Serialize, Deserialize)]
struct EndedCounters {
    held: Seq,
    reported: Seq,
    carried: Seq,
}

/// What retention needs of a stored batch, first in its value so that it
/// decodes without the batch (decoding a node id validates a curve point).
#[derive(Serialize, Deserialize)]
struct StoredMeta {
    last_seq: Seq,
    msgs: u64,
    bytes: u64,
}

/// A stored outbox batch, borrowed for encoding. Its payloads are the
/// journal's envelopes from `first_arrival` on (a batch is journaled in the
/// commit that stores it), unless `outbox-payloads-v1` holds them.
#[derive(Serialize)]
struct BatchRef<'a> {
    meta: StoredMeta,
    batch: &'a SignedBatch,
    first_arrival: Arrival,
}

/// A stored outbox batch, decoded.
#[derive(Deserialize)]
struct BatchOwned {
    #[allow(dead_code)] // Decoded to reach the batch; read through `StoredMeta` alone.
    meta: StoredMeta,
    batch: SignedBatch,
    first_arrival: Arrival,
}

/// An own stream's counters; the stream is the row's key.
#[derive(Serialize, Deserialize)]
struct OwnCounters {
    next_seq: Seq,
    first_retained: Seq,
    last_acked: Seq,
    msgs: u64,
    bytes: u64,
    evictable_msgs: u64,
    evictable_bytes: u64,
}

/// An own stream's counters as schema 2 stored them.
#[derive(Deserialize)]
struct OwnCountersV2 {
    next_seq: Seq,
    first_retained: Seq,
    last_acked: Seq,
    msgs: u64,
    bytes: u64,
}

impl OwnCounters {
    fn of(o: &OwnStream) -> Self {
        OwnCounters {
            next_seq: o.next_seq,
            first_retained: o.first_retained,
            last_acked: o.last_acked,
            msgs: o.msgs,
            bytes: o.bytes,
            evictable_msgs: o.evictable_msgs,
            evictable_bytes: o.evictable_bytes,
        }
    }

    /// The stream's state, if its counters keep the invariants; a row that
    /// breaks them is a damaged file.
    fn with(self, stream: StreamId, name: &str) -> Result<OwnStream, StoreError> {
        let own = OwnStream {
            stream,
            next_seq: self.next_seq,
            first_retained: self.first_retained,
            last_acked: self.last_acked,
            msgs: self.msgs,
            bytes: self.bytes,
            evictable_msgs: self.evictable_msgs,
            evictable_bytes: self.evictable_bytes,
        };
        match own.broken() {
            None => Ok(own),
            Some(why) => Err(corrupt(name, format!("own stream {:?}: {why}", own.stream))),
        }
    }
}

/// The redb-backed [`MeshStore`].
///
/// Opened by one process at a time (redb's file lock); every commit is
/// `Durability::Immediate`.
pub struct RedbStore {
    /// `None` only between dropping a failed handle and reopening the file.
    db: RwLock<Option<Database>>,
    /// The file, for reopening after an I/O error (`None` on other backends).
    path: Option<PathBuf>,
    /// The file's path, or a name for a store on another backend; for messages.
    name: String,
    /// The epoch moves with a committed `NewEpoch`.
    meta: RwLock<StoreMeta>,
    /// When a commit folds the agent index held in journal rows.
    fold: IndexFold,
    /// Dropped after `db` (fields drop in order): once no strong
    /// reference to it is left, the file is closed and unlocked, not only
    /// about to be ([`RedbStore::closed_watch`]).
    alive: std::sync::Arc<()>,
}

/// When a commit folds the agent index entries held in journal rows into
/// the index tables: once either bound is reached since the last fold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IndexFold {
    /// Arrivals journaled.
    pub(crate) arrivals: u64,
    /// Bytes of journal rows written.
    pub(crate) bytes: u64,
}

impl IndexFold {
    /// The bounds a store runs with.
    const DEFAULT: IndexFold = IndexFold {
        arrivals: INDEX_FOLD_ARRIVALS,
        bytes: INDEX_FOLD_BYTES,
    };
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("name", &self.name)
            .field("epoch", &self.meta_now().epoch)
            .finish_non_exhaustive()
    }
}

fn unavailable(name: &str, what: &str, e: impl fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{what} {name}: {e}"))
}

fn corrupt(name: &str, why: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        path: name.to_owned(),
        why: why.into(),
    }
}

/// Sorts a redb error into ours: a held lock, a damaged file, or the environment.
fn from_redb(name: &str, what: &str, e: impl Into<redb::Error>) -> StoreError {
    match e.into() {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => {
            StoreError::AlreadyOpen {
                path: name.to_owned(),
            }
        }
        redb::Error::Corrupted(why) => corrupt(name, why),
        redb::Error::UpgradeRequired(v) => corrupt(
            name,
            format!("it is in redb file format {v}, which this build does not read"),
        ),
        redb::Error::RepairAborted => corrupt(name, "redb could not repair it"),
        redb::Error::TableDoesNotExist(t) => corrupt(name, format!("table {t} is missing")),
        e @ (redb::Error::TableTypeMismatch { .. } | redb::Error::TypeDefinitionChanged { .. }) => {
            corrupt(name, e.to_string())
        }
        redb::Error::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            corrupt(name, format!("it is not a redb file ({io})"))
        }
        e => unavailable(name, what, e),
    }
}

fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_stdvec(v).map_err(|e| StoreError::Unavailable(format!("encoding failed: {e}")))
}

fn decode<'a, T: Deserialize<'a>>(
    name: &str,
    what: &str,
    bytes: &'a [u8],
) -> Result<T, StoreError> {
    postcard::from_bytes(bytes)
        .map_err(|e| corrupt(name, format!("a stored {what} does not decode: {e}")))
}

/// Encodes `v` into `buf`, replacing what it held (the buffer is reused across rows).
fn encode_into<T: Serialize + ?Sized>(buf: &mut Vec<u8>, v: &T) -> Result<(), StoreError> {
    buf.clear();
    let taken = std::mem::take(buf);
    *buf = postcard::to_extend(v, taken)
        .map_err(|e| StoreError::Unavailable(format!("encoding failed: {e}")))?;
    Ok(())
}

fn stream_key(stream: &StreamId) -> Result<Vec<u8>, StoreError> {
    encode(stream)
}

fn batch_stream(b: &SignedBatch) -> StreamId {
    StreamId {
        author: b.author,
        epoch: b.epoch,
        channel: b.channel.clone(),
    }
}

/// Runs a redb open, turning a panic on a damaged file into [`StoreError::Corrupt`].
///
/// redb checks its invariants with debug assertions, which panic on a file
/// damaged outside redb; a release build returns `Corrupted` instead.
fn guarded<T>(name: &str, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "redb gave up reading it".to_owned());
        Err(corrupt(name, why))
    })
}

/// A redb builder with this store's settings: redb's page cache is held to
/// [`CACHE_BYTES`] (redb's default is 1 GiB, which a daemon with a large
/// outbox would fill: the outbox must live on disk, not in memory).
fn builder() -> Builder {
    let mut b = Builder::new();
    b.set_cache_size(CACHE_BYTES);
    b
}

impl RedbStore {
    /// A watch on this store's file: its strong count falls to 0 once the
    /// store was dropped and its file closed (the last `Arc` of a store
    /// counts 0 before its drop has closed the file; this counts 0 after).
    pub fn closed_watch(&self) -> std::sync::Weak<()> {
        std::sync::Arc::downgrade(&self.alive)
    }

    /// Opens the store in `data_dir`, creating `mesh.redb` with a new random
    /// epoch if it does not exist.
    ///
    /// Errors: [`StoreError::AlreadyOpen`] if any handle (this process or
    /// another) has it open; [`StoreError::Corrupt`] if the file exists but
    /// is empty, damaged, or not an agent-mesh store (the file is left as it
    /// was); [`StoreError::SchemaVersion`] if another schema wrote it;
    /// [`StoreError::Unavailable`] if the disk fails.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(STORE_FILE_NAME);
        let name = path.display().to_string();
        match fs::metadata(&path) {
            Ok(m) => Self::open_existing(&path, &name, m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Self::create(data_dir, &path, &name)
            }
            Err(e) => Err(unavailable(&name, "cannot read", e)),
        }
    }

    /// A store on redb's in-memory backend, with a random epoch. For tests
    /// where durability is not the point.
    pub fn in_memory() -> Result<Self, StoreError> {
        Self::with_backend(InMemoryBackend::new(), "in-memory store")
    }

    /// A store on any redb backend, `name` naming it in errors. An empty
    /// backend gets a new store with a random epoch; a non-empty one must
    /// hold a store (redb repairs it first if it was not closed cleanly).
    pub fn with_backend(backend: impl StorageBackend, name: &str) -> Result<Self, StoreError> {
        let len = backend
            .len()
            .map_err(|e| unavailable(name, "cannot read", e))?;
        guarded(name, || {
            let mut builder = builder();
            if len > 0 {
                builder.set_check_integrity_on_open(true);
            }
            let db = builder
                .create_with_backend(backend)
                .map_err(|e| from_redb(name, "cannot open", e))?;
            if len == 0 {
                init(&db, name)?;
            }
            Self::load(db, name, None)
        })
    }

    /// This store, folding the agent index on every commit that has
    /// entries (as schema 4 wrote it): for tests of both layouts.
    #[cfg(test)]
    pub(crate) fn folding_every_commit(self) -> Self {
        self.folding_after(0, 0)
    }

    /// This store, folding the agent index after `arrivals` arrivals or
    /// `bytes` of journal rows.
    #[cfg(test)]
    pub(crate) fn folding_after(mut self, arrivals: u64, bytes: u64) -> Self {
        self.fold = IndexFold { arrivals, bytes };
        self
    }

    /// Where the agent index stands: the arrival of the last fold, the
    /// entries journal rows hold since (counted in them), and those rows'
    /// bytes.
    #[cfg(test)]
    pub(crate) fn index_fold(&self) -> (Arrival, u64, u64) {
        let rx = self.begin_read().expect("reads");
        let meta = rx.open_table(META).expect("meta");
        let f = agents::FoldState::read(&meta, &self.name).expect("fold state");
        let journal = rx.open_table(JOURNAL).expect("journal");
        let mut held = 0;
        agents::deferred_rows(&journal, f.through, &self.name, |r| {
            held += r.entries() as u64;
            true
        })
        .expect("rows");
        (f.through, held, f.bytes)
    }

    /// The store's path or name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs redb's full integrity check (walks every page).
    pub fn check_integrity(&mut self) -> Result<bool, StoreError> {
        let name = self.name.clone();
        let closed = self.closed();
        self.db
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
            .ok_or(closed)?
            .check_integrity()
            .map_err(|e| from_redb(&name, "cannot check", e))
    }
    fn closed(&self) -> StoreError {
        unavailable(
            &self.name,
            "cannot use",
            std::io::Error::other("the store is being reopened after an I/O error"),
        )
    }

    fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        let db = self.db.read().unwrap_or_else(|p| p.into_inner());
        db.as_ref()
            .ok_or_else(|| self.closed())?
            .begin_read()
            .map_err(|e| self.read_err(e))
    }

    /// Drops the handle and opens the file again.
    ///
    /// After one failed write (a full disk, say) redb refuses every later
    /// write on the same handle ("Previous I/O error occurred"), so a store
    /// that should recover when the disk has room again must reopen. Nothing
    /// committed is lost: the file is opened like after a crash (repaired if
    /// needed, integrity checked) and must hold the same epoch. If it cannot
    /// be opened yet, the store stays closed and the next commit tries again.
    fn reopen(&self) {
        let Some(path) = &self.path else { return };
        let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
        // Release the file and its lock before opening it again.
        drop(db.take());
        let opened = builder()
            .set_check_integrity_on_open(true)
            .open(path)
            .map_err(|e| from_redb(&self.name, "cannot reopen", e))
            .and_then(|d| {
                let rx = d
                    .begin_read()
                    .map_err(|e| from_redb(&self.name, "cannot read", e))?;
                let meta = read_meta(&rx, &self.name, false)?;
                drop(rx);
                if meta.epoch != self.meta_now().epoch {
                    return Err(corrupt(&self.name, "its epoch changed while it was open"));
                }
                Ok(d)
            });
        match opened {
            Ok(d) => {
                *db = Some(d);
                tracing::info!(store = %self.name, "store reopened after a write error");
            }
            Err(e) => {
                tracing::warn!(store = %self.name, error = %e, "store not reopened yet; the next commit tries again")
            }
        }
    }

    fn read_err(&self, e: impl Into<redb::Error>) -> StoreError {
        from_redb(&self.name, "cannot read", e)
    }

    fn meta_now(&self) -> StoreMeta {
        self.meta.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
