//! Opening, creating, migrating and checking the store file.

use super::*;

impl RedbStore {
    pub(super) fn open_existing(path: &Path, name: &str, len: u64) -> Result<Self, StoreError> {
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
    pub(super) fn create(data_dir: &Path, path: &Path, name: &str) -> Result<Self, StoreError> {
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

    /// Checks the store in `db` (migrating one of a previous schema, one
    /// version at a time) and wraps it.
    pub(super) fn load(db: Database, name: &str, path: Option<&Path>) -> Result<Self, StoreError> {
        let read = |strict: bool| {
            let rx = db
                .begin_read()
                .map_err(|e| from_redb(name, "cannot read", e))?;
            read_meta(&rx, name, !strict)
        };
        let mut meta = read(false)?;
        if meta.schema_version == 2 {
            migrate_v2(&db, name)?;
            meta = read(false)?;
        }
        if meta.schema_version == 3 {
            migrate_v3(&db, name)?;
            meta = read(false)?;
        }
        if meta.schema_version == 4 {
            migrate_v4(&db, name)?;
            meta = read(true)?;
        }
        Ok(RedbStore {
            db: RwLock::new(Some(db)),
            path: path.map(Path::to_owned),
            name: name.to_owned(),
            meta: RwLock::new(meta),
            fold: IndexFold::DEFAULT,
            alive: std::sync::Arc::new(()),
        })
    }
}

/// Sets the meta row `key` to `version` in `tx`.
fn set_version(tx: &redb::WriteTransaction, name: &str, version: u32) -> Result<(), StoreError> {
    let werr = |e: redb::Error| from_redb(name, "cannot migrate", e);
    let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
    meta.insert(META_SCHEMA, version.to_le_bytes().as_slice())
        .map_err(|e| werr(e.into()))?;
    Ok(())
}

/// Rewrites a store of schema 2 as schema 3, in one durable transaction:
/// each own stream's row moves from `own-streams-v2` to `own-streams-v3`,
/// with its evictable envelopes counted from the outbox (the batches from
/// the first retained on that lie wholly at or below its acked mark).
/// Nothing else changed between the two.
pub(super) fn migrate_v2(db: &Database, name: &str) -> Result<(), StoreError> {
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
    }
    set_version(&tx, name, 3)?;
    tx.delete_table(OWN_V2).map_err(|e| werr(e.into()))?;
    tx.commit().map_err(|e| werr(e.into()))?;
    tracing::info!(store = %name, streams, from = 2, to = 3, "store migrated");
    Ok(())
}

/// Rewrites a store of schema 3 as schema 4, in one durable transaction:
/// the journal, never trimmed before, starts at arrival 1 and its rows'
/// bytes are counted; its rows count as written now (the age bound starts
/// from the migration); the tables schema 4 adds are made. Nothing stored
/// is re-encoded.
pub(super) fn migrate_v3(db: &Database, name: &str) -> Result<(), StoreError> {
    let werr = |e: redb::Error| from_redb(name, "cannot migrate", e);
    let mut tx = db.begin_write().map_err(|e| werr(e.into()))?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| werr(e.into()))?;
    let mut bytes = 0u64;
    let mut rows = 0u64;
    {
        let journal = tx.open_table(JOURNAL).map_err(|e| werr(e.into()))?;
        for row in journal.iter().map_err(|e| werr(e.into()))? {
            let (_, v) = row.map_err(|e| werr(e.into()))?;
            bytes += row_bytes(v.value().len());
            rows += 1;
        }
        let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
        for (key, value) in [
            (META_JOURNAL_FIRST, 1),
            (META_JOURNAL_BYTES, bytes),
            (META_LAST_WRITE_MS, now_ms()),
        ] {
            meta.insert(key, value.to_le_bytes().as_slice())
                .map_err(|e| werr(e.into()))?;
        }
        open_v4_tables(&tx, name)?;
    }
    set_version(&tx, name, 4)?;
    tx.commit().map_err(|e| werr(e.into()))?;
    tracing::info!(store = %name, journal_rows = rows, journal_bytes = bytes, from = 3, to = 4, "store migrated");
    Ok(())
}

/// Rewrites a store of schema 4 as schema 5, in one durable transaction:
/// its agent index entries are all in `inbox-v1` and `messages-v1`, so the
/// index counts as folded up to the journal's head, with nothing deferred.
/// Nothing stored is re-encoded: schema 5 reads a schema 4 journal row as
/// it is.
pub(super) fn migrate_v4(db: &Database, name: &str) -> Result<(), StoreError> {
    let werr = |e: redb::Error| from_redb(name, "cannot migrate", e);
    let mut tx = db.begin_write().map_err(|e| werr(e.into()))?;
    tx.set_durability(Durability::Immediate)
        .map_err(|e| werr(e.into()))?;
    let head;
    {
        let journal = tx.open_table(JOURNAL).map_err(|e| werr(e.into()))?;
        let mut meta = tx.open_table(META).map_err(|e| werr(e.into()))?;
        let first = read_u64(&meta, META_JOURNAL_FIRST, name)?;
        let last_row = journal
            .last()
            .map_err(|e| werr(e.into()))?
            .map_or(0, |(k, _)| k.value());
        head = last_row.max(first.saturating_sub(1));
        for (key, value) in [(META_INDEX_THROUGH, head), (META_INDEX_DEFERRED_BYTES, 0)] {
            meta.insert(key, value.to_le_bytes().as_slice())
                .map_err(|e| werr(e.into()))?;
        }
    }
    set_version(&tx, name, 5)?;
    tx.commit().map_err(|e| werr(e.into()))?;
    tracing::info!(store = %name, index_through = head, from = 4, to = 5, "store migrated");
    Ok(())
}

/// Makes the tables schema 4 added.
fn open_v4_tables(tx: &redb::WriteTransaction, name: &str) -> Result<(), StoreError> {
    let werr = |e: redb::TableError| from_redb(name, "cannot create", e);
    tx.open_table(OUTBOX_PAYLOADS).map_err(werr)?;
    tx.open_table(ENDED_OWN).map_err(werr)?;
    tx.open_table(MARK_CIDS).map_err(werr)?;
    tx.open_table(JOURNAL_TIMES).map_err(werr)?;
    Ok(())
}

/// The clock, ms since the Unix epoch.
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads and checks the meta table, and that every table of its schema
/// exists: [`SCHEMA_VERSION`], or also an older one from
/// [`SCHEMA_VERSION_OLDEST`] on if `migratable` (the caller then migrates it).
pub(super) fn read_meta(
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
    let migrates = migratable && (SCHEMA_VERSION_OLDEST..SCHEMA_VERSION).contains(&version);
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
    check(
        rx.open_table(if version == 2 { OWN_V2 } else { OWN })
            .map(drop),
    )?;
    check(rx.open_table(MARKS).map(drop))?;
    check(rx.open_table(JOURNAL).map(drop))?;
    check(rx.open_table(PEERS).map(drop))?;
    check(rx.open_table(CURSORS).map(drop))?;
    if version >= 4 {
        for key in [META_JOURNAL_FIRST, META_JOURNAL_BYTES, META_LAST_WRITE_MS] {
            read_u64(&meta, key, name)?;
        }
        check(rx.open_table(OUTBOX_PAYLOADS).map(drop))?;
        check(rx.open_table(ENDED_OWN).map(drop))?;
        check(rx.open_table(MARK_CIDS).map(drop))?;
        check(rx.open_table(JOURNAL_TIMES).map(drop))?;
    }
    if version >= 5 {
        for key in [META_INDEX_THROUGH, META_INDEX_DEFERRED_BYTES] {
            read_u64(&meta, key, name)?;
        }
    }
    Ok(StoreMeta {
        epoch,
        schema_version: version,
    })
}

pub(super) fn read_u64(
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
pub(super) fn init(db: &Database, name: &str) -> Result<(), StoreError> {
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
        meta.insert(META_JOURNAL_FIRST, 1u64.to_le_bytes().as_slice())
            .map_err(|e| werr(e.into()))?;
        for key in [
            META_JOURNAL_BYTES,
            META_LAST_WRITE_MS,
            META_INDEX_THROUGH,
            META_INDEX_DEFERRED_BYTES,
        ] {
            meta.insert(key, 0u64.to_le_bytes().as_slice())
                .map_err(|e| werr(e.into()))?;
        }
        open_v4_tables(&tx, name)?;
        tx.open_table(OUTBOX).map_err(|e| werr(e.into()))?;
        tx.open_table(OWN).map_err(|e| werr(e.into()))?;
        tx.open_table(MARKS).map_err(|e| werr(e.into()))?;
        tx.open_table(JOURNAL).map_err(|e| werr(e.into()))?;
        tx.open_table(PEERS).map_err(|e| werr(e.into()))?;
        tx.open_table(CURSORS).map_err(|e| werr(e.into()))?;
        tx.open_table(CARDS).map_err(|e| werr(e.into()))?;
        tx.open_table(INVITES).map_err(|e| werr(e.into()))?;
        tx.open_table(TOPICS).map_err(|e| werr(e.into()))?;
    }
    tx.commit().map_err(|e| werr(e.into()))
}

pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}
