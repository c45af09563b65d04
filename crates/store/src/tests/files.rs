//! The redb store on real files: reopening, locking, damaged files.

use std::path::Path;
use std::process::Command;

use redb::{ReadableDatabase, TableDefinition};

use super::util::*;
use crate::{
    Eviction, JournalRecord, LossReason, MeshStore, RedbStore, SCHEMA_VERSION, STORE_FILE_NAME,
    StoreError, WriteOp,
};

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn fill(s: &dyn MeshStore) {
    append_ok(s, own(s, PEER, 1, 3, 100));
    commit1(
        s,
        vec![
            WriteOp::Accept {
                batch: peer_batch(PEER, 1, 2),
                from: 1,
            },
            WriteOp::Gap {
                stream: peer_stream(3),
                earliest_available: 4,
            },
            WriteOp::PutCursor {
                name: "c".into(),
                arrival: 2,
            },
        ],
    )
    .expect("commits");
}

#[test]
fn a_reopened_store_keeps_everything_and_its_epoch() {
    let dir = tempdir();
    let (epoch, before) = {
        let s = RedbStore::open(dir.path()).expect("creates");
        fill(&s);
        (s.meta().epoch, dump(&s, &["c"]).expect("dump"))
    };
    assert_eq!(before.head, 6);
    let s = RedbStore::open(dir.path()).expect("reopens");
    assert_eq!(s.meta().epoch, epoch);
    assert_eq!(dump(&s, &["c"]).expect("dump"), before);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    assert_eq!(
        names,
        vec![STORE_FILE_NAME.to_string()],
        "no temporary file is left"
    );
}

#[test]
fn two_new_stores_get_different_epochs() {
    let (a, b) = (tempdir(), tempdir());
    let ea = RedbStore::open(a.path()).expect("creates").meta().epoch;
    let eb = RedbStore::open(b.path()).expect("creates").meta().epoch;
    assert_ne!(ea, eb);
}

#[test]
fn a_second_open_in_the_same_process_is_refused_as_already_open() {
    let dir = tempdir();
    let _first = RedbStore::open(dir.path()).expect("creates");
    match RedbStore::open(dir.path()) {
        Err(StoreError::AlreadyOpen { path }) => {
            assert!(path.contains(&dir.path().display().to_string()), "{path}");
        }
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
}

const CHILD_DIR_ENV: &str = "MESH_STORE_TEST_CHILD_DIR";
const CHILD_MARKER: &str = "child saw AlreadyOpen";

#[test]
fn a_second_open_from_another_process_is_refused_naming_the_dir() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        // The child half: the parent holds the store open.
        match RedbStore::open(Path::new(&dir)) {
            Err(e @ StoreError::AlreadyOpen { .. }) => {
                assert!(e.to_string().contains(&dir), "{e}");
                println!("{CHILD_MARKER}");
                return;
            }
            other => panic!("expected AlreadyOpen, got {other:?}"),
        }
    }
    let dir = tempdir();
    let _held = RedbStore::open(dir.path()).expect("creates");
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "tests::files::a_second_open_from_another_process_is_refused_naming_the_dir",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir.path())
        .output()
        .expect("child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(CHILD_MARKER),
        "the child did not run the check: {stdout}"
    );
}

/// Opens `dir`, expecting [`StoreError::Corrupt`], and checks the file kept its bytes.
fn assert_refused_as_corrupt(dir: &Path) {
    let path = dir.join(STORE_FILE_NAME);
    let before = std::fs::read(&path).expect("read");
    match RedbStore::open(dir) {
        Err(e @ StoreError::Corrupt { .. }) => {
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(
        std::fs::read(&path).expect("read") == before,
        "the file was changed"
    );
}

#[test]
fn an_empty_file_is_refused_as_corrupt_and_left_as_is() {
    let dir = tempdir();
    std::fs::write(dir.path().join(STORE_FILE_NAME), b"").expect("write");
    assert_refused_as_corrupt(dir.path());
}

#[test]
fn random_bytes_are_refused_as_corrupt_and_left_as_is() {
    let dir = tempdir();
    let bytes: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.path().join(STORE_FILE_NAME), bytes).expect("write");
    assert_refused_as_corrupt(dir.path());
}

#[test]
fn a_truncated_store_is_refused_as_corrupt_and_left_as_is() {
    let dir = tempdir();
    {
        let s = RedbStore::open(dir.path()).expect("creates");
        for seq in 1..=50 {
            append_ok(&s, own(&s, PEER, seq, 1, 2000));
        }
    }
    let path = dir.path().join(STORE_FILE_NAME);
    let len = std::fs::metadata(&path).expect("stat").len();
    for keep in [len / 2, 4096, 100] {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(keep).expect("truncate");
        drop(f);
        assert_refused_as_corrupt(dir.path());
    }
}

#[test]
fn a_redb_file_that_is_not_a_mesh_store_is_refused_as_corrupt() {
    let dir = tempdir();
    let db = redb::Database::create(dir.path().join(STORE_FILE_NAME)).expect("create");
    let tx = db.begin_write().expect("tx");
    {
        let mut t = tx
            .open_table(TableDefinition::<u64, u64>::new("other"))
            .expect("table");
        t.insert(1, 2).expect("insert");
    }
    tx.commit().expect("commit");
    drop(db);
    assert_refused_as_corrupt(dir.path());
}

#[test]
fn a_store_of_another_schema_version_is_refused() {
    const NEXT: u32 = SCHEMA_VERSION + 1;
    let dir = tempdir();
    drop(RedbStore::open(dir.path()).expect("creates"));
    let db = redb::Database::open(dir.path().join(STORE_FILE_NAME)).expect("open");
    let tx = db.begin_write().expect("tx");
    {
        let mut t = tx
            .open_table(TableDefinition::<&str, &[u8]>::new("meta-v1"))
            .expect("table");
        t.insert("schema_version", NEXT.to_le_bytes().as_slice())
            .expect("insert");
    }
    tx.commit().expect("commit");
    drop(db);
    match RedbStore::open(dir.path()) {
        Err(StoreError::SchemaVersion {
            found: NEXT,
            supported: SCHEMA_VERSION,
            ..
        }) => {}
        other => panic!("expected SchemaVersion, got {other:?}"),
    }
    // Reading with redb directly shows nothing was reset.
    let db = redb::Database::open(dir.path().join(STORE_FILE_NAME)).expect("open");
    let rx = db.begin_read().expect("rx");
    let t = rx
        .open_table(TableDefinition::<&str, &[u8]>::new("meta-v1"))
        .expect("table");
    assert_eq!(
        t.get("schema_version").expect("get").expect("row").value(),
        NEXT.to_le_bytes()
    );
}

/// A version 1 file, as the first schema laid it out: the meta row and its
/// tables, with one journal entry per row.
fn write_v1_store(path: &Path) {
    let db = redb::Database::create(path).expect("create");
    let tx = db.begin_write().expect("tx");
    {
        let mut t = tx
            .open_table(TableDefinition::<&str, &[u8]>::new("meta-v1"))
            .expect("table");
        t.insert("schema_version", 1u32.to_le_bytes().as_slice())
            .expect("insert");
        t.insert("epoch", [1u8; 16].as_slice()).expect("insert");
        t.insert("max_lamport", 0u64.to_le_bytes().as_slice())
            .expect("insert");
        let mut j = tx
            .open_table(TableDefinition::<u64, &[u8]>::new("journal-v1"))
            .expect("table");
        j.insert(1, [0u8; 8].as_slice()).expect("insert");
    }
    tx.commit().expect("commit");
}

#[test]
fn a_version_1_store_is_refused_as_another_schema_not_misread() {
    let dir = tempdir();
    write_v1_store(&dir.path().join(STORE_FILE_NAME));
    match RedbStore::open(dir.path()) {
        Err(e @ StoreError::SchemaVersion { found: 1, .. }) => {
            assert!(e.to_string().contains("schema version 1"), "{e}");
        }
        other => panic!("expected SchemaVersion, got {other:?}"),
    }
}

const CRASH_DIR_ENV: &str = "MESH_STORE_TEST_CRASH_DIR";
const CRASH_MARKER: &str = "child committed and exits without closing";

#[test]
fn a_store_left_open_by_a_dead_process_reopens_with_every_commit() {
    if let Ok(dir) = std::env::var(CRASH_DIR_ENV) {
        // The child half: commit, then exit without running any destructor,
        // so redb never records a clean shutdown.
        let s = RedbStore::open(Path::new(&dir)).expect("creates");
        fill(&s);
        let d = dump(&s, &["c"]).expect("dump");
        println!("{CRASH_MARKER} {}", digest(&d));
        std::process::exit(0);
    }
    let dir = tempdir();
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "tests::files::a_store_left_open_by_a_dead_process_reopens_with_every_commit",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_DIR_ENV, dir.path())
        .output()
        .expect("child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.find(CRASH_MARKER).map(|i| &l[i..]))
        .unwrap_or_else(|| {
            panic!(
                "the child did not commit: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let path = dir.path().join(STORE_FILE_NAME);
    // redb's read-only open refuses a file that needs repair: proof the child did not close it.
    assert!(matches!(
        redb::Builder::new().open_read_only(&path),
        Err(redb::DatabaseError::RepairAborted)
    ));
    let s = RedbStore::open(dir.path()).expect("reopens after repair");
    let d = dump(&s, &["c"]).expect("dump");
    assert_eq!(d.head, 6);
    assert_eq!(line, format!("{CRASH_MARKER} {}", digest(&d)));
}

/// A data dir as the store of schema 2 left it: written by the build before
/// own streams counted their evictable envelopes (commit 2d6bf58), with
/// these commits in order: own batches to node 2 of seqs 1..=3 (10 bytes
/// each), 4..=5 (20) and 6 (30), acknowledged up to 5; to node 3, 1..=3 (5
/// bytes each), acknowledged up to 2; to node 4 under evict-oldest with 2
/// msgs at most, 1..=2 then 3 (7 bytes each; the first batch evicted and
/// recorded as lost); node 5's batch 1..=2 accepted with node 6's gap up to
/// 3; peer 2 and cursor `reader` at 3; and a subscriber's lag as a loss
/// record against a topic stream.
const STORE_V2: &[u8] = include_bytes!("data/store-v2.redb");

// One file's story from the migration to a reopen; each step needs the last.
#[test]
fn a_schema_2_store_is_migrated_on_open_and_keeps_everything() {
    let dir = tempdir();
    let path = dir.path().join(STORE_FILE_NAME);
    std::fs::write(&path, STORE_V2).expect("write");
    let s = RedbStore::open(dir.path()).expect("migrates");
    assert_eq!(s.meta().schema_version, SCHEMA_VERSION);
    let counts = |to: u8| {
        let o = own_state(&s, &own_stream_id(&s, to)).expect("stream");
        let n = (o.next_seq, o.first_retained, o.last_acked, o.msgs, o.bytes);
        (n, (o.evictable_msgs, o.evictable_bytes))
    };
    // Acked up to 5 covers the first two batches whole.
    assert_eq!(counts(PEER), ((7, 1, 5, 6, 100), (5, 70)));
    // Acked up to 2 ends inside the only batch.
    assert_eq!(counts(3), ((4, 1, 2, 3, 15), (0, 0)));
    assert_eq!(counts(4), ((4, 3, 0, 1, 7), (0, 0)));
    let out = outbox(&s, &own_stream_id(&s, PEER));
    let want = [
        own(&s, PEER, 1, 3, 10),
        own(&s, PEER, 4, 2, 20),
        own(&s, PEER, 6, 1, 30),
    ];
    assert_eq!(out.len(), 3);
    for (got, want) in out.iter().zip(&want) {
        assert_eq!(got.batch, *want.batch().signed(), "byte for byte as signed");
        assert!(got.payloads == want.payloads());
    }
    let j = journal(&s);
    assert_eq!(j.len(), 17);
    assert!(matches!(
        &j[11].record,
        JournalRecord::Loss {
            from: 1,
            to: 2,
            reason: LossReason::OutboxEvicted,
            ..
        }
    ));
    assert!(matches!(
        &j[15].record,
        JournalRecord::Gap { from: 1, to: 3, .. }
    ));
    assert!(matches!(
        &j[16].record,
        JournalRecord::Loss { from: 2, to: 4, reason: LossReason::SubscriberLagged, detail, .. }
            if detail == "subscriber 1 stopped reading"
    ));
    assert_eq!(mark(&s, &peer_stream(5)), 2);
    assert_eq!(mark(&s, &peer_stream(6)), 3);
    assert_eq!(s.cursor("reader").expect("cursor"), Some(3));
    assert_eq!(s.peers().expect("peers").len(), 1);
    assert_eq!(s.max_lamport().expect("lamport"), 6);
    // Tables added to schema 3 later are not in the file yet: empty, then made.
    assert_eq!(s.cards().expect("cards"), vec![]);
    assert_eq!(s.invites().expect("invites"), vec![]);
    let card = super::conformance::card(PEER, 1);
    commit1(&s, vec![WriteOp::PutCard(card.clone())]).expect("the first write makes the table");
    assert_eq!(s.cards().expect("cards"), vec![card]);
    // It works on as schema 3: what the migration counted evictable goes.
    let evict = Eviction {
        msgs_max: 1,
        bytes_max: u64::MAX,
        loss: None,
    };
    commit1(
        &s,
        vec![WriteOp::AppendOwn {
            batch: own(&s, PEER, 7, 1, 10),
            evict: Some(evict),
        }],
    )
    .expect("the first two batches are acknowledged");
    assert_eq!(counts(PEER), ((8, 6, 5, 2, 40), (0, 0)));
    let before = dump(&s, &["reader"]).expect("dump");
    drop(s);
    // Reopened, it is a schema 3 store, and the old table is gone.
    let s = RedbStore::open(dir.path()).expect("reopens");
    assert_eq!(dump(&s, &["reader"]).expect("dump"), before);
    drop(s);
    let db = redb::Database::open(&path).expect("open");
    let rx = db.begin_read().expect("rx");
    assert!(
        rx.open_table(TableDefinition::<&[u8], &[u8]>::new("own-streams-v2"))
            .is_err(),
        "the schema 2 table is dropped"
    );
    let meta = rx
        .open_table(TableDefinition::<&str, &[u8]>::new("meta-v1"))
        .expect("meta");
    assert_eq!(
        meta.get("schema_version")
            .expect("get")
            .expect("row")
            .value(),
        SCHEMA_VERSION.to_le_bytes()
    );
}

/// A file written before the agent tables existed (the schema 2 fixture,
/// migrated) has none of their rows, takes them, and keeps them.
#[test]
fn a_store_written_before_the_agent_tables_reads_none_and_then_keeps_them() {
    use crate::{AgentOp, AgentRecord};
    use mesh_protocol::{AgentName, MsgId};
    let dir = tempdir();
    std::fs::write(dir.path().join(STORE_FILE_NAME), STORE_V2).expect("write");
    let s = RedbStore::open(dir.path()).expect("opens");
    let bob = AgentName::new("bob").expect("name");
    assert_eq!(s.agents().expect("reads"), vec![]);
    assert_eq!(s.inbox(&bob, 0, 10).expect("reads"), vec![]);
    assert_eq!(s.message(&MsgId([1; 16])).expect("reads"), None);
    assert_eq!(s.dedup().expect("reads"), vec![]);
    assert_eq!(s.aliases().expect("reads"), vec![]);
    assert_eq!(s.agent_cursor(&bob, "main").expect("reads"), None);
    let record = AgentRecord {
        name: bob.clone(),
        key: node(9),
        uid: 1000,
        created_ms: 1,
    };
    commit1(&s, vec![WriteOp::Agents(AgentOp::PutAgent(record.clone()))]).expect("commits");
    drop(s);
    let s = RedbStore::open(dir.path()).expect("reopens");
    assert_eq!(s.agents().expect("reads"), vec![record]);
}

/// A data dir as the store of schema 3 left it: written by the build at
/// commit d854b2d (its `crates/store` with a scratch example program, run
/// on an empty dir), with these commits in order: own batches to node 2 of
/// seqs 1..=3 (10 bytes each) and 4..=5 (20), acknowledged up to 3; to node
/// 3, seq 1 (5 bytes); node 5's batch 1..=2 (16 bytes each) accepted;
/// node 6's gap up to 2; peer 2 (epoch `[2; 16]`, at 127.0.0.1:7000);
/// cursor `reader` at 4; a subscriber's lag of arrivals 2..=3.
const STORE_V3: &[u8] = include_bytes!("data/store-v3.redb");

// One file's story from the migration to a trim and a reopen; each step needs the last.
#[test]
fn a_schema_3_store_is_migrated_on_open_and_keeps_everything() {
    let dir = tempdir();
    let path = dir.path().join(STORE_FILE_NAME);
    std::fs::write(&path, STORE_V3).expect("write");
    let s = RedbStore::open(dir.path()).expect("migrates");
    assert_eq!(s.meta().schema_version, SCHEMA_VERSION);
    let to2 = own_stream_id(&s, PEER);
    let o = own_state(&s, &to2).expect("stream");
    assert_eq!(
        (o.next_seq, o.last_acked, o.msgs, o.bytes, o.evictable_msgs),
        (6, 3, 5, 70, 3)
    );
    let out = outbox(&s, &to2);
    let want = [own(&s, PEER, 1, 3, 10), own(&s, PEER, 4, 2, 20)];
    assert_eq!(out.len(), 2);
    for (got, want) in out.iter().zip(&want) {
        assert_eq!(got.batch, *want.batch().signed(), "byte for byte as signed");
        assert!(got.payloads == want.payloads());
    }
    let j = journal(&s);
    assert_eq!(j.len(), 10);
    assert!(matches!(
        &j[8].record,
        JournalRecord::Gap { from: 1, to: 2, .. }
    ));
    assert!(matches!(
        &j[9].record,
        JournalRecord::SubscriberLagged { from: 2, to: 3, .. }
    ));
    let b = s.journal_bounds().expect("bounds");
    assert_eq!((b.first, b.head), (1, 10));
    assert!(b.bytes > 0);
    let marks = s.marks().expect("marks");
    assert_eq!(marks.len(), 2);
    assert!(
        marks.iter().all(|m| m.seq == 2 && m.cid.is_none()),
        "schema 3 kept no payload hash of a mark: {marks:?}"
    );
    assert_eq!(s.cursor("reader").expect("cursor"), Some(4));
    assert_eq!(s.peers().expect("peers").len(), 1);
    assert!(s.ended_own().expect("ended").is_empty());
    // It works on as schema 4: a trim of everything keeps the outbox whole.
    let r = commit1(
        &s,
        vec![WriteOp::Trim {
            now_ms: 1,
            bytes_max: 0,
            age_ms_max: 0,
        }],
    )
    .expect("trims");
    assert_eq!(r.trim.expect("report").bounds.first, 11);
    let out = outbox(&s, &to2);
    assert_eq!(out.len(), 1, "the acknowledged batch went with its rows");
    assert!(out[0].payloads == want[1].payloads());
    let before = dump(&s, &["reader"]).expect("dump");
    drop(s);
    let s = RedbStore::open(dir.path()).expect("reopens");
    assert_eq!(dump(&s, &["reader"]).expect("dump"), before);
    assert_eq!(
        s.journal(0, 5).expect("page")[0].record,
        JournalRecord::Trimmed { from: 1, to: 10 }
    );
}

/// A data dir of schema 3 with the membership tables, written by the build
/// at commit c230d62 (its `crates/store` with a scratch example program, run
/// on an empty dir): peer 2 (epoch `[2; 16]`, at 127.0.0.1:7000); the cards
/// of node 1 (issued at 100) and node 2 (at 200), each `node-N` at
/// 127.0.0.1:400N; invite `[3; 8]` (3 uses, one spent by node 2 with
/// request `[1; 16]` until 30) and invite `[4; 8]` (1 use, revoked).
const STORE_V3_CARDS: &[u8] = include_bytes!("data/store-v3-cards.redb");

#[test]
fn a_schema_3_store_with_cards_and_invites_keeps_them_through_the_migration() {
    let dir = tempdir();
    std::fs::write(dir.path().join(STORE_FILE_NAME), STORE_V3_CARDS).expect("write");
    let s = RedbStore::open(dir.path()).expect("migrates");
    assert_eq!(s.meta().schema_version, SCHEMA_VERSION);
    let check = |s: &RedbStore| {
        let cards = s.cards().expect("cards");
        let want: Vec<_> = [(1, 100), (2, 200)]
            .into_iter()
            .map(|(n, at)| super::conformance::card(n, at))
            .collect();
        let mut got = cards.clone();
        got.sort_by_key(|c| c.issued_ms);
        assert_eq!(got, want, "byte for byte as signed");
        let invites = s.invites().expect("invites");
        assert_eq!(invites.len(), 2);
        let used = s
            .invite(&mesh_protocol::InviteId([3; 8]))
            .expect("invite")
            .expect("kept");
        assert_eq!((used.uses, used.uses_left(), used.revoked), (3, 2, false));
        assert_eq!(used.spent[0].by, node(2));
        assert_eq!(
            used.spent[0].requests,
            vec![mesh_protocol::RequestId([1; 16])]
        );
        let revoked = s
            .invite(&mesh_protocol::InviteId([4; 8]))
            .expect("invite")
            .expect("kept");
        assert!(revoked.revoked);
        assert_eq!(s.peers().expect("peers").len(), 1);
        let b = s.journal_bounds().expect("bounds");
        assert_eq!((b.first, b.head, b.bytes), (1, 0, 0), "nothing journaled");
    };
    check(&s);
    // The tables take writes as schema 4, and a removed peer loses its card.
    commit1(&s, vec![WriteOp::RemovePeer(node(2))]).expect("removes");
    assert_eq!(
        s.cards().expect("cards"),
        vec![super::conformance::card(1, 100)]
    );
    drop(s);
    let s = RedbStore::open(dir.path()).expect("reopens");
    assert_eq!(s.cards().expect("cards").len(), 1);
    assert_eq!(s.invites().expect("invites").len(), 2);
}

#[test]
fn a_new_epoch_survives_a_reopen() {
    let dir = tempdir();
    let s = RedbStore::open(dir.path()).expect("opens");
    append_ok(&s, own(&s, PEER, 1, 2, 10));
    let epoch = mesh_protocol::Epoch([0x77; 16]);
    commit1(&s, vec![WriteOp::NewEpoch { epoch }]).expect("new epoch");
    assert_eq!(s.meta().epoch, epoch);
    let before = dump(&s, &[]).expect("dump");
    drop(s);
    let s = RedbStore::open(dir.path()).expect("reopens");
    assert_eq!(s.meta().epoch, epoch);
    assert_eq!(dump(&s, &[]).expect("dump"), before);
    append_ok(&s, own(&s, PEER, 1, 1, 10));
}

/// A data dir of schema 4 written before topics existed, by the build at
/// commit a258ed2 (its `crates/store` with a scratch example program, run on
/// an empty dir), in one commit: peer 2 (epoch `[2; 16]`, at
/// 127.0.0.1:7000); an own batch to node 2 of seqs 1..=2; node 2's batch
/// 1..=3 to this node accepted (16 bytes each).
const STORE_V4: &[u8] = include_bytes!("data/store-v4.redb");

#[test]
fn a_schema_4_store_from_before_topics_is_a_member_of_none_and_takes_topics_and_moves() {
    let dir = tempdir();
    std::fs::write(dir.path().join(STORE_FILE_NAME), STORE_V4).expect("write");
    let s = RedbStore::open(dir.path()).expect("opens");
    assert_eq!(s.meta().schema_version, SCHEMA_VERSION);
    assert!(s.topics().expect("topics").is_empty());
    assert!(s.moves().expect("moves").is_empty(), "no move notices yet");
    let to2 = own_stream_id(&s, PEER);
    assert_eq!(own_state(&s, &to2).expect("stream").next_seq, 3);
    assert_eq!(s.journal_head().expect("head"), 5);
    assert_eq!(s.peers().expect("peers").len(), 1);
    commit1(
        &s,
        vec![
            member_of(topic(), 10),
            WriteOp::AcceptTopic {
                batch: topic_batch(3, 1, 2),
                from: 1,
                evict: None,
            },
        ],
    )
    .expect("joins and takes a topic batch");
    let notice = mesh_protocol::AgentMove::sign(
        &key(40),
        mesh_protocol::AgentName::new("kim").expect("a name"),
        (node(1), node(2)),
        1,
        7,
    );
    commit1(
        &s,
        vec![WriteOp::Agents(crate::AgentOp::PutMove(notice.clone()))],
    )
    .expect("takes a move notice");
    let before = dump(&s, &[]).expect("dump");
    drop(s);
    let s = RedbStore::open(dir.path()).expect("reopens");
    assert_eq!(dump(&s, &[]).expect("dump"), before);
    assert_eq!(s.moves().expect("moves"), vec![notice]);
    assert_eq!(s.topics().expect("topics")[0].name, topic());
    assert_eq!(outbox(&s, &topic_stream(3)).len(), 1);
    assert_eq!(outbox(&s, &to2).len(), 1, "the direct stream as it was");
}
