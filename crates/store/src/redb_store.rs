//! The on-disk store: one redb file, `<data>/mesh.redb`.
//!
//! Schema (every table name carries its version):
//!
//! | table            | key                          | value                                   |
//! |------------------|------------------------------|-----------------------------------------|
//! | `meta-v1`        | `"schema_version"`, `"epoch"`, `"max_lamport"` | little-endian u32, 16 bytes, little-endian u64 |
//! | `outbox-v2`      | (postcard `StreamId`, first seq) | postcard (last seq, msgs, bytes, `SignedBatch`, arrival of its first envelope) |
//! | `own-streams-v3` | postcard `StreamId`          | postcard (next seq, first retained, last acked, msgs, bytes, evictable msgs, evictable bytes) |
//! | `marks-v2`       | postcard `StreamId`          | mark                                    |
//! | `journal-v2`     | last arrival in the row      | postcard `Row`: a run of envelopes, or one other record |
//! | `peers-v2`       | node id bytes                | postcard `PeerRecord`                   |
//! | `cursors-v2`     | name                         | arrival                                 |
//!
//! The meta table keeps its name across schema versions, so that a file of
//! another version is recognised by its `schema_version`: one of schema 2
//! is migrated when it is opened (its `own-streams-v2` rows gain their
//! evictable counts, counted from the outbox, in one durable
//! transaction); any other is refused.
//!
//! A journal row holds consecutive envelopes of one stream written in one
//! commit (up to [`JOURNAL_ROW_BYTES_MAX`]), the stream named once: one
//! B-tree insert per row rather than per envelope is what lets a receiver
//! journal a catch-up commit of thousands of envelopes quickly. A row is
//! keyed by its last arrival, so the row holding arrival `a` is the first
//! with a key `>= a`.
//!
//! An outbox row holds its batch's signed headers, not its payloads: the
//! same commit journals every envelope of an own batch and the journal is
//! never trimmed, so `read_outbox` takes the payloads from the journal
//! (checking stream, seqs and lengths) and a send writes each payload once.
//!
//! Postcard is canonical for these types, so a stored `SignedBatch` decodes
//! to the value that was signed and re-encodes to the same bytes.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use mesh_protocol::{Epoch, Mark, Seq, SignedBatch, StreamId};
use redb::backends::InMemoryBackend;
use redb::{
    Builder, Database, Durability, ReadableDatabase, ReadableTable, StorageBackend, Table,
    TableDefinition, TableError,
};
use serde::{Deserialize, Serialize};
use serde_bytes::Bytes;

use crate::logic::{self, Base, BatchMeta, Fail, TxCounters, Write};
use crate::mem::gather;
use crate::{
    Arrival, JournalItem, JournalRecord, MeshStore, OwnStream, PeerRecord, Receipt, SCHEMA_VERSION,
    StoreError, StoreMeta, StoredBatch, WriteOp,
};

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
const OWN: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("own-streams-v3");
/// The own-streams table of schema 2, read only to migrate it.
const OWN_V2: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("own-streams-v2");

/// The schema version this build migrates to [`SCHEMA_VERSION`] when it opens a file.
const SCHEMA_VERSION_MIGRATED: u32 = 2;
const MARKS: TableDefinition<'_, &[u8], u64> = TableDefinition::new("marks-v2");
const JOURNAL: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("journal-v2");
const PEERS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("peers-v2");
const CURSORS: TableDefinition<'_, &str, u64> = TableDefinition::new("cursors-v2");

const META_SCHEMA: &str = "schema_version";
const META_EPOCH: &str = "epoch";
const META_MAX_LAMPORT: &str = "max_lamport";

/// What retention needs of a stored batch, first in its value so that it
/// decodes without the batch (decoding a node id validates a curve point).
#[derive(Serialize, Deserialize)]
struct StoredMeta {
    last_seq: Seq,
    msgs: u64,
    bytes: u64,
}

/// A stored outbox batch, borrowed for encoding. Its payloads are the
/// journal's envelopes from `first_arrival` on (the journal is never
/// trimmed; a batch is journaled in the commit that stores it).
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

/// One journal envelope in a run, borrowed for encoding.
#[derive(Serialize)]
struct EntryRef<'a> {
    lamport: u64,
    created_ms: u64,
    kind: u16,
    payload: &'a Bytes,
}

/// One journal row, borrowed for encoding. The variants' order is the
/// encoding: it must match [`RowView`].
#[derive(Serialize)]
enum RowRef<'a> {
    /// Envelopes `first_seq..` of a stream (its key bytes, so that a reader
    /// can match it without decoding a node id), at consecutive arrivals.
    Run {
        stream: &'a Bytes,
        first_seq: Seq,
        entries: Vec<EntryRef<'a>>,
    },
    /// A record that is not an envelope (a gap or a loss).
    Record(&'a JournalRecord),
}

/// One journal envelope in a run, decoded in place.
#[derive(Deserialize)]
struct EntryView<'a> {
    lamport: u64,
    created_ms: u64,
    kind: u16,
    payload: &'a [u8],
}

/// One journal row, decoded in place.
#[derive(Deserialize)]
enum RowView<'a> {
    Run {
        stream: &'a [u8],
        first_seq: Seq,
        #[serde(borrow)]
        entries: Vec<EntryView<'a>>,
    },
    Record(JournalRecord),
}

impl RowView<'_> {
    /// The arrival of the row's first record, given its last.
    fn first_arrival(&self, last: Arrival) -> Arrival {
        let n = match self {
            RowView::Run { entries, .. } => entries.len() as u64,
            RowView::Record(_) => 1,
        };
        (last + 1).saturating_sub(n)
    }

    /// Appends the row's records at `from` or later to `out`, until it holds `limit`.
    fn push_items(
        self,
        name: &str,
        last: Arrival,
        from: Arrival,
        limit: usize,
        out: &mut Vec<JournalItem>,
    ) -> Result<(), StoreError> {
        let first = self.first_arrival(last);
        match self {
            RowView::Run {
                stream,
                first_seq,
                entries,
            } => {
                let stream: StreamId = decode(name, "stream id", stream)?;
                let skip = usize::try_from(from.saturating_sub(first)).unwrap_or(usize::MAX);
                for (i, e) in entries.into_iter().enumerate().skip(skip) {
                    if out.len() >= limit {
                        break;
                    }
                    out.push(JournalItem {
                        arrival: first + i as u64,
                        record: JournalRecord::Envelope {
                            stream: stream.clone(),
                            seq: first_seq + i as u64,
                            lamport: e.lamport,
                            created_ms: e.created_ms,
                            kind: e.kind,
                            payload: e.payload.to_vec(),
                        },
                    });
                }
            }
            RowView::Record(record) => {
                if last >= from && out.len() < limit {
                    out.push(JournalItem {
                        arrival: last,
                        record,
                    });
                }
            }
        }
        Ok(())
    }
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
    meta: StoreMeta,
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("name", &self.name)
            .field("epoch", &self.meta.epoch)
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

    fn open_existing(path: &Path, name: &str, len: u64) -> Result<Self, StoreError> {
        if len == 0 {
            // A store is created under another name and linked in whole, so an
            // empty file was never a store: refuse rather than initialise it.
            return Err(corrupt(name, "the file is empty"));
        }
        guarded(name, || {
            // Look before redb may write: a writable open repairs and commits,
            // which must not happen to a file that is not an agent-mesh store.
            match Builder::new().open_read_only(path) {
                Ok(ro) => {
                    let rx = ro
                        .begin_read()
                        .map_err(|e| from_redb(name, "cannot read", e))?;
                    read_meta(&rx, name, true)?;
                }
                // Not closed cleanly (a crash): only a writable open can repair
                // it, and the meta is checked after that.
                Err(redb::DatabaseError::RepairAborted) => {}
                Err(e) => return Err(from_redb(name, "cannot open", e)),
            }
            let db = builder()
                .set_check_integrity_on_open(true)
                .open(path)
                .map_err(|e| from_redb(name, "cannot open", e))?;
            Self::load(db, name, Some(path))
        })
    }

    /// Creates the store under a temporary name and links it in, so that
    /// `mesh.redb` either does not exist or is a complete store.
    fn create(data_dir: &Path, path: &Path, name: &str) -> Result<Self, StoreError> {
        let tmp: PathBuf = data_dir.join(format!(
            "{STORE_FILE_NAME}.new-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let made = guarded(name, || {
            let db = builder()
                .create(&tmp)
                .map_err(|e| from_redb(name, "cannot create", e))?;
            init(&db, name)?;
            Ok(db)
        });
        let db = match made {
            Ok(db) => db,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        // A hard link never replaces an existing file: if another process
        // created the store meanwhile, ours is dropped and theirs is opened.
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(data_dir).map_err(|e| unavailable(name, "cannot sync the dir of", e))?;
                Self::load(db, name, Some(path))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                drop(db);
                let len = fs::metadata(path)
                    .map_err(|e| unavailable(name, "cannot read", e))?
                    .len();
                Self::open_existing(path, name, len)
            }
            Err(e) => Err(unavailable(name, "cannot create", e)),
        }
    }

    /// Checks the store in `db` (migrating one of the previous schema) and wraps it.
    fn load(db: Database, name: &str, path: Option<&Path>) -> Result<Self, StoreError> {
        let read = |strict: bool| {
            let rx = db
                .begin_read()
                .map_err(|e| from_redb(name, "cannot read", e))?;
            read_meta(&rx, name, !strict)
        };
        let mut meta = read(false)?;
        if meta.schema_version == SCHEMA_VERSION_MIGRATED {
            migrate_v2(&db, name)?;
            meta = read(true)?;
        }
        Ok(RedbStore {
            db: RwLock::new(Some(db)),
            path: path.map(Path::to_owned),
            name: name.to_owned(),
            meta,
        })
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
                if meta.epoch != self.meta.epoch {
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

    /// The payloads of own `batch` (of the stream with key `stream`), read
    /// from its envelopes in the journal, journaled from `first_arrival` on.
    fn journal_payloads(
        &self,
        journal: &impl ReadableTable<u64, &'static [u8]>,
        stream: &[u8],
        batch: &SignedBatch,
        first_arrival: Arrival,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let n = batch.entries.len();
        let mut out: Vec<Vec<u8>> = Vec::with_capacity(n);
        let missing = |why: &str| {
            corrupt(
                &self.name,
                format!(
                    "the outbox batch at seq {} has {why} in the journal from arrival {first_arrival}",
                    batch.first_seq
                ),
            )
        };
        let rows = journal
            .range(first_arrival..)
            .map_err(|e| self.read_err(e))?;
        for row in rows {
            if out.len() == n {
                break;
            }
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let row: RowView = decode(&self.name, "journal row", v.value())?;
            let first = row.first_arrival(k.value());
            let RowView::Run {
                stream: s,
                first_seq,
                entries,
            } = row
            else {
                return Err(missing("another record"));
            };
            if s != stream {
                return Err(missing("another stream's envelopes"));
            }
            let skip = usize::try_from(first_arrival.saturating_sub(first)).unwrap_or(usize::MAX);
            for (i, e) in entries.iter().enumerate().skip(skip) {
                let Some(h) = batch.entries.get(out.len()) else {
                    break;
                };
                let seq = batch.first_seq + out.len() as u64;
                if first_seq + i as u64 != seq || e.payload.len() != h.payload_len as usize {
                    return Err(missing("other envelopes"));
                }
                out.push(e.payload.to_vec());
            }
        }
        if out.len() != n {
            return Err(missing("fewer envelopes"));
        }
        Ok(out)
    }

    fn try_commit(
        &self,
        groups: Vec<Vec<WriteOp>>,
    ) -> Result<Vec<Result<Receipt, StoreError>>, StoreError> {
        let name = self.name.as_str();
        let werr = |e: redb::Error| from_redb(name, "cannot write", e);
        let db = self.db.read().unwrap_or_else(|p| p.into_inner());
        let mut tx = db
            .as_ref()
            .ok_or_else(|| self.closed())?
            .begin_write()
            .map_err(|e| werr(e.into()))?;
        tx.set_durability(Durability::Immediate)
            .map_err(|e| werr(e.into()))?;
        let mut out = Vec::with_capacity(groups.len());
        {
            let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
            let mut t = Tables {
                name,
                epoch: self.meta.epoch,
                outbox: tx.open_table(OUTBOX).map_err(|e| werr(e.into()))?,
                own: tx.open_table(OWN).map_err(|e| werr(e.into()))?,
                marks: tx.open_table(MARKS).map_err(|e| werr(e.into()))?,
                journal: tx.open_table(JOURNAL).map_err(|e| werr(e.into()))?,
                peers: tx.open_table(PEERS).map_err(|e| werr(e.into()))?,
                cursors: tx.open_table(CURSORS).map_err(|e| werr(e.into()))?,
                journal_pending: Vec::new(),
                marks_pending: HashMap::new(),
                own_pending: HashMap::new(),
            };
            let journal_head = t
                .journal
                .last()
                .map_err(|e| werr(e.into()))?
                .map_or(0, |(k, _)| k.value());
            let max_lamport = read_u64(&meta, META_MAX_LAMPORT, name)?;
            let before = TxCounters {
                journal_head,
                max_lamport,
            };
            let mut counters = before;
            for ops in groups {
                match logic::plan_group(&mut t, &mut counters, ops) {
                    Ok(plan) => {
                        t.apply(plan.writes)?;
                        out.push(Ok(plan.receipt));
                    }
                    Err(Fail::Refused(e)) => out.push(Err(e)),
                    // Dropping the transaction aborts it: nothing of any group is written.
                    Err(Fail::Fatal(e)) => return Err(e),
                }
            }
            t.flush()?;
            if counters.max_lamport != before.max_lamport {
                meta.insert(
                    META_MAX_LAMPORT,
                    counters.max_lamport.to_le_bytes().as_slice(),
                )
                .map_err(|e| werr(e.into()))?;
            }
        }
        tx.commit().map_err(|e| werr(e.into()))?;
        Ok(out)
    }
}

/// The meta of the outbox batch of the stream with key `stream` that
/// starts at `first_seq`, if there is one.
fn outbox_meta(
    outbox: &impl ReadableTable<(&'static [u8], u64), &'static [u8]>,
    stream: &[u8],
    first_seq: Seq,
    name: &str,
) -> Result<Option<BatchMeta>, StoreError> {
    let v = outbox
        .get((stream, first_seq))
        .map_err(|e| from_redb(name, "cannot read", e))?;
    let Some(v) = v else { return Ok(None) };
    // Only the leading meta is decoded: the batch and payloads follow it.
    let (m, _): (StoredMeta, _) = postcard::take_from_bytes(v.value())
        .map_err(|e| corrupt(name, format!("a stored outbox batch does not decode: {e}")))?;
    Ok(Some(BatchMeta {
        last_seq: m.last_seq,
        msgs: m.msgs,
        bytes: m.bytes,
    }))
}

/// Rewrites a store of schema [`SCHEMA_VERSION_MIGRATED`] as
/// [`SCHEMA_VERSION`], in one durable transaction: each own stream's row
/// moves from `own-streams-v2` to `own-streams-v3`, with its evictable
/// envelopes counted from the outbox (the batches from the first retained
/// on that lie wholly at or below its acked mark). Nothing else changed
/// between the two.
fn migrate_v2(db: &Database, name: &str) -> Result<(), StoreError> {
    let werr = |e: redb::Error| from_redb(name, "cannot migrate", e);
    let mut tx = db.begin_write().map_err(|e| werr(e.into()))?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| werr(e.into()))?;
    let mut streams = 0;
    {
        let old = tx.open_table(OWN_V2).map_err(|e| werr(e.into()))?;
        let outbox = tx.open_table(OUTBOX).map_err(|e| werr(e.into()))?;
        let mut own = tx.open_table(OWN).map_err(|e| werr(e.into()))?;
        for row in old.iter().map_err(|e| werr(e.into()))? {
            let (k, v) = row.map_err(|e| werr(e.into()))?;
            let stream: StreamId = decode(name, "stream id", k.value())?;
            let c: OwnCountersV2 = decode(name, "schema 2 own stream", v.value())?;
            let mut counters = OwnCounters {
                next_seq: c.next_seq,
                first_retained: c.first_retained,
                last_acked: c.last_acked,
                msgs: c.msgs,
                bytes: c.bytes,
                evictable_msgs: 0,
                evictable_bytes: 0,
            };
            loop {
                let at = counters.first_retained + counters.evictable_msgs;
                if at >= counters.next_seq || at > counters.last_acked {
                    break;
                }
                let meta = outbox_meta(&outbox, k.value(), at, name)?.ok_or_else(|| {
                    corrupt(name, format!("outbox of {stream:?} has no batch at {at}"))
                })?;
                if meta.last_seq > counters.last_acked {
                    break;
                }
                counters.evictable_msgs += meta.msgs;
                counters.evictable_bytes += meta.bytes;
            }
            let checked = counters.with(stream, name)?;
            let v = encode(&OwnCounters::of(&checked))?;
            own.insert(k.value(), v.as_slice())
                .map_err(|e| werr(e.into()))?;
            streams += 1;
        }
        let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
        meta.insert(META_SCHEMA, SCHEMA_VERSION.to_le_bytes().as_slice())
            .map_err(|e| werr(e.into()))?;
    }
    tx.delete_table(OWN_V2).map_err(|e| werr(e.into()))?;
    tx.commit().map_err(|e| werr(e.into()))?;
    tracing::info!(store = %name, streams, from = SCHEMA_VERSION_MIGRATED, to = SCHEMA_VERSION, "store migrated");
    Ok(())
}

/// Reads and checks the meta table, and that every table of its schema
/// exists: [`SCHEMA_VERSION`], or also [`SCHEMA_VERSION_MIGRATED`] if
/// `migratable` (the caller then migrates it).
fn read_meta(
    rx: &redb::ReadTransaction,
    name: &str,
    migratable: bool,
) -> Result<StoreMeta, StoreError> {
    let meta = match rx.open_table(META) {
        Ok(t) => t,
        Err(TableError::TableDoesNotExist(_)) => {
            return Err(corrupt(
                name,
                "it has no meta-v1 table: it is not an agent-mesh store",
            ));
        }
        Err(e) => return Err(from_redb(name, "cannot read", e)),
    };
    let get = |key: &str| -> Result<Option<Vec<u8>>, StoreError> {
        Ok(meta
            .get(key)
            .map_err(|e| from_redb(name, "cannot read", e))?
            .map(|v| v.value().to_vec()))
    };
    let version = get(META_SCHEMA)?
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| corrupt(name, "its schema version is missing"))?;
    let migrates = migratable && version == SCHEMA_VERSION_MIGRATED;
    if version != SCHEMA_VERSION && !migrates {
        return Err(StoreError::SchemaVersion {
            path: name.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let epoch = get(META_EPOCH)?
        .and_then(|v| <[u8; 16]>::try_from(v.as_slice()).ok())
        .map(Epoch)
        .ok_or_else(|| corrupt(name, "its epoch is missing"))?;
    read_u64(&meta, META_MAX_LAMPORT, name)?;
    let check = |r: Result<(), TableError>| r.map_err(|e| from_redb(name, "cannot read", e));
    check(rx.open_table(OUTBOX).map(drop))?;
    check(rx.open_table(if migrates { OWN_V2 } else { OWN }).map(drop))?;
    check(rx.open_table(MARKS).map(drop))?;
    check(rx.open_table(JOURNAL).map(drop))?;
    check(rx.open_table(PEERS).map(drop))?;
    check(rx.open_table(CURSORS).map(drop))?;
    Ok(StoreMeta {
        epoch,
        schema_version: version,
    })
}

fn read_u64(
    meta: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
    name: &str,
) -> Result<u64, StoreError> {
    let v = meta
        .get(key)
        .map_err(|e| from_redb(name, "cannot read", e))?;
    v.and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| corrupt(name, format!("meta {key} is missing")))
}

/// Writes the meta row and creates every table, in one durable commit.
fn init(db: &Database, name: &str) -> Result<(), StoreError> {
    let werr = |e: redb::Error| from_redb(name, "cannot initialise", e);
    let mut tx = db.begin_write().map_err(|e| werr(e.into()))?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| werr(e.into()))?;
    {
        let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
        let epoch: [u8; 16] = rand::random();
        meta.insert(META_SCHEMA, SCHEMA_VERSION.to_le_bytes().as_slice())
            .map_err(|e| werr(e.into()))?;
        meta.insert(META_EPOCH, epoch.as_slice())
            .map_err(|e| werr(e.into()))?;
        meta.insert(META_MAX_LAMPORT, 0u64.to_le_bytes().as_slice())
            .map_err(|e| werr(e.into()))?;
        tx.open_table(OUTBOX).map_err(|e| werr(e.into()))?;
        tx.open_table(OWN).map_err(|e| werr(e.into()))?;
        tx.open_table(MARKS).map_err(|e| werr(e.into()))?;
        tx.open_table(JOURNAL).map_err(|e| werr(e.into()))?;
        tx.open_table(PEERS).map_err(|e| werr(e.into()))?;
        tx.open_table(CURSORS).map_err(|e| werr(e.into()))?;
    }
    tx.commit().map_err(|e| werr(e.into()))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// The tables of one write transaction.
struct Tables<'tx> {
    name: &'tx str,
    epoch: Epoch,
    outbox: Table<'tx, (&'static [u8], u64), &'static [u8]>,
    own: Table<'tx, &'static [u8], &'static [u8]>,
    marks: Table<'tx, &'static [u8], u64>,
    journal: Table<'tx, u64, &'static [u8]>,
    peers: Table<'tx, &'static [u8], &'static [u8]>,
    cursors: Table<'tx, &'static str, u64>,
    /// Journal records of the groups applied so far, in arrival order;
    /// written as rows at [`Tables::flush`], when every run is complete.
    journal_pending: Vec<(Arrival, JournalRecord)>,
    /// The latest mark and own-stream state per stream, written once per
    /// commit at [`Tables::flush`] however many groups moved them; reads
    /// in the transaction look here first.
    marks_pending: HashMap<StreamId, Seq>,
    own_pending: HashMap<StreamId, OwnStream>,
}

impl Tables<'_> {
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        from_redb(self.name, "cannot write", e)
    }

    fn apply(&mut self, writes: Vec<Write>) -> Result<(), StoreError> {
        let name = self.name;
        for w in writes {
            match w {
                Write::OwnStream(o) => {
                    self.own_pending.insert(o.stream.clone(), o);
                }
                Write::PutBatch {
                    first_seq,
                    batch,
                    first_arrival,
                } => {
                    let k = stream_key(&batch_stream(&batch))?;
                    let m = BatchMeta::of(&batch);
                    let v = encode(&BatchRef {
                        meta: StoredMeta {
                            last_seq: m.last_seq,
                            msgs: m.msgs,
                            bytes: m.bytes,
                        },
                        batch: &batch,
                        first_arrival,
                    })?;
                    self.outbox
                        .insert((k.as_slice(), first_seq), v.as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::DelBatch { stream, first_seq } => {
                    let k = stream_key(&stream)?;
                    self.outbox
                        .remove((k.as_slice(), first_seq))
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::Mark { stream, seq } => {
                    self.marks_pending.insert(stream, seq);
                }
                Write::Journal { arrival, record } => {
                    self.journal_pending.push((arrival, record));
                }
                Write::PutPeer(p) => {
                    let v = encode(&p)?;
                    self.peers
                        .insert(p.node.as_bytes().as_slice(), v.as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::RemovePeer(n) => {
                    self.peers
                        .remove(n.as_bytes().as_slice())
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
                Write::Cursor {
                    name: cursor,
                    arrival,
                } => {
                    self.cursors
                        .insert(cursor.as_str(), arrival)
                        .map_err(|e| from_redb(name, "cannot write", e))?;
                }
            }
        }
        Ok(())
    }

    /// Writes what [`Tables::apply`] deferred: marks, own streams, and the
    /// journal packed into rows.
    fn flush(&mut self) -> Result<(), StoreError> {
        let name = self.name;
        let werr = |e| from_redb(name, "cannot write", e);
        let mut marks: Vec<_> = self.marks_pending.drain().collect();
        marks.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (stream, seq) in marks {
            let k = stream_key(&stream)?;
            self.marks.insert(k.as_slice(), seq).map_err(werr)?;
        }
        let mut own: Vec<_> = self.own_pending.drain().map(|(_, o)| o).collect();
        own.sort_unstable_by(|a, b| a.stream.cmp(&b.stream));
        for o in own {
            let k = stream_key(&o.stream)?;
            let v = encode(&OwnCounters::of(&o))?;
            self.own.insert(k.as_slice(), v.as_slice()).map_err(werr)?;
        }
        let pending = std::mem::take(&mut self.journal_pending);
        let mut buf = Vec::new();
        let mut rest = pending.as_slice();
        let mut key = Vec::new();
        while let Some(((arrival, record), _)) = rest.split_first() {
            let n = run_len(rest);
            let row = match record {
                JournalRecord::Envelope { stream, seq, .. } if n > 0 => {
                    let mut entries = Vec::with_capacity(n);
                    for (_, r) in &rest[..n] {
                        if let JournalRecord::Envelope {
                            lamport,
                            created_ms,
                            kind,
                            payload,
                            ..
                        } = r
                        {
                            entries.push(EntryRef {
                                lamport: *lamport,
                                created_ms: *created_ms,
                                kind: *kind,
                                payload: Bytes::new(payload),
                            });
                        }
                    }
                    encode_into(&mut key, stream)?;
                    RowRef::Run {
                        stream: Bytes::new(&key),
                        first_seq: *seq,
                        entries,
                    }
                }
                other => RowRef::Record(other),
            };
            encode_into(&mut buf, &row)?;
            let taken = n.max(1);
            let last = arrival + taken as u64 - 1;
            self.journal.insert(last, buf.as_slice()).map_err(werr)?;
            rest = &rest[taken..];
        }
        Ok(())
    }
}

/// How many of `records` (consecutive arrivals) open a journal row of
/// envelopes: consecutive seqs of one stream, within [`JOURNAL_ROW_BYTES_MAX`]
/// (at least one). 0 if the first is not an envelope.
fn run_len(records: &[(Arrival, JournalRecord)]) -> usize {
    let Some((
        (
            arrival,
            JournalRecord::Envelope {
                stream,
                seq,
                payload,
                ..
            },
        ),
        more,
    )) = records.split_first()
    else {
        return 0;
    };
    let mut bytes = ROW_OVERHEAD_BYTES + payload.len() + ROW_ENTRY_OVERHEAD_BYTES;
    let mut n = 1;
    for (a, r) in more {
        let JournalRecord::Envelope {
            stream: s,
            seq: q,
            payload: p,
            ..
        } = r
        else {
            break;
        };
        let add = p.len() + ROW_ENTRY_OVERHEAD_BYTES;
        if s != stream
            || Some(*q) != seq.checked_add(n as u64)
            || Some(*a) != arrival.checked_add(n as u64)
            || bytes + add > JOURNAL_ROW_BYTES_MAX
        {
            break;
        }
        bytes += add;
        n += 1;
    }
    n
}

impl Base for Tables<'_> {
    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn name(&self) -> &str {
        self.name
    }

    fn own_stream(&mut self, stream: &StreamId) -> Result<Option<OwnStream>, StoreError> {
        if let Some(o) = self.own_pending.get(stream) {
            return Ok(Some(o.clone()));
        }
        let k = stream_key(stream)?;
        let v = self.own.get(k.as_slice()).map_err(|e| self.err(e))?;
        let counters: Option<OwnCounters> = v
            .map(|v| decode(self.name, "own stream", v.value()))
            .transpose()?;
        counters
            .map(|c| c.with(stream.clone(), self.name))
            .transpose()
    }

    fn batch_meta(
        &mut self,
        stream: &StreamId,
        first_seq: Seq,
    ) -> Result<Option<BatchMeta>, StoreError> {
        let k = stream_key(stream)?;
        outbox_meta(&self.outbox, &k, first_seq, self.name)
    }

    fn mark(&mut self, stream: &StreamId) -> Result<Option<Seq>, StoreError> {
        if let Some(m) = self.marks_pending.get(stream) {
            return Ok(Some(*m));
        }
        let k = stream_key(stream)?;
        Ok(self
            .marks
            .get(k.as_slice())
            .map_err(|e| self.err(e))?
            .map(|v| v.value()))
    }
}

impl MeshStore for RedbStore {
    fn meta(&self) -> StoreMeta {
        self.meta.clone()
    }

    fn commit(&self, groups: Vec<Vec<WriteOp>>) -> Vec<Result<Receipt, StoreError>> {
        let n = groups.len();
        if self.db.read().unwrap_or_else(|p| p.into_inner()).is_none() {
            self.reopen();
        }
        match self.try_commit(groups) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(store = %self.name, error = %e, groups = n, "store commit failed");
                if matches!(e, StoreError::Unavailable(_)) {
                    self.reopen();
                }
                vec![Err(e); n]
            }
        }
    }

    fn own_streams(&self) -> Result<Vec<OwnStream>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(OWN).map_err(|e| self.read_err(e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let stream: StreamId = decode(&self.name, "stream id", k.value())?;
            let counters: OwnCounters = decode(&self.name, "own stream", v.value())?;
            out.push(counters.with(stream, &self.name)?);
        }
        Ok(out)
    }

    fn marks(&self) -> Result<Vec<Mark>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(MARKS).map_err(|e| self.read_err(e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            out.push(Mark {
                stream: decode(&self.name, "stream id", k.value())?,
                seq: v.value(),
            });
        }
        Ok(out)
    }

    fn read_outbox(
        &self,
        stream: &StreamId,
        after: Seq,
        max_bytes: u64,
    ) -> Result<Vec<StoredBatch>, StoreError> {
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let k = stream_key(stream)?;
        let k = k.as_slice();
        let rx = self.begin_read()?;
        let t = rx.open_table(OUTBOX).map_err(|e| self.read_err(e))?;
        // The batch holding `next` starts at or before it; later ones start after it.
        let first = t
            .range((k, 0)..=(k, next))
            .map_err(|e| self.read_err(e))?
            .next_back();
        let rest = t
            .range((k, next.saturating_add(1))..=(k, u64::MAX))
            .map_err(|e| self.read_err(e))?;
        let rest = if next == u64::MAX { None } else { Some(rest) };
        let rows = first.into_iter().chain(rest.into_iter().flatten());
        let batches = rows.map(|row| {
            let (_, v) = row.map_err(|e| self.read_err(e))?;
            decode::<BatchOwned>(&self.name, "outbox batch", v.value())
        });
        let chosen = gather(batches, |b| &b.batch, after, max_bytes)?;
        let journal = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        chosen
            .into_iter()
            .map(|b| {
                let payloads = self.journal_payloads(&journal, k, &b.batch, b.first_arrival)?;
                Ok(StoredBatch {
                    batch: b.batch,
                    payloads,
                })
            })
            .collect()
    }

    fn journal(&self, after: Arrival, limit: usize) -> Result<Vec<JournalItem>, StoreError> {
        let Some(next) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rx = self.begin_read()?;
        let t = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        let mut out = Vec::new();
        // Rows are keyed by their last arrival: the first row at or after
        // `next` holds it (and maybe earlier arrivals, skipped).
        for row in t.range(next..).map_err(|e| self.read_err(e))? {
            let (k, v) = row.map_err(|e| self.read_err(e))?;
            let row: RowView = decode(&self.name, "journal row", v.value())?;
            row.push_items(&self.name, k.value(), next, limit, &mut out)?;
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    fn journal_head(&self) -> Result<Arrival, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(JOURNAL).map_err(|e| self.read_err(e))?;
        Ok(t.last()
            .map_err(|e| self.read_err(e))?
            .map_or(0, |(k, _)| k.value()))
    }

    fn peers(&self) -> Result<Vec<PeerRecord>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(PEERS).map_err(|e| self.read_err(e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| self.read_err(e))? {
            let (_, v) = row.map_err(|e| self.read_err(e))?;
            out.push(decode(&self.name, "peer", v.value())?);
        }
        Ok(out)
    }

    fn cursor(&self, name: &str) -> Result<Option<Arrival>, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(CURSORS).map_err(|e| self.read_err(e))?;
        Ok(t.get(name)
            .map_err(|e| self.read_err(e))?
            .map(|v| v.value()))
    }

    fn max_lamport(&self) -> Result<u64, StoreError> {
        let rx = self.begin_read()?;
        let t = rx.open_table(META).map_err(|e| self.read_err(e))?;
        read_u64(&t, META_MAX_LAMPORT, &self.name)
    }
}
