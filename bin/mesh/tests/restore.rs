//! A store that goes back in time, with real `mesh daemon` processes: the
//! harness is `mesh_tests::restore`; see `docs/reliability.md`.

use std::collections::BTreeSet;
use std::path::Path;

use mesh_tests::restore::CloneSends;

fn run<T>(name: &str, f: impl AsyncFnOnce(&Path, &Path) -> anyhow::Result<T>) -> T {
    let bin = Path::new(env!("CARGO_BIN_EXE_mesh"));
    // One dir per process: it is cleared first, and two copies of this
    // test may run at once.
    let out = mesh_tests::run_dir(bin, &format!("{name}-{}", std::process::id()));
    if out.exists() {
        std::fs::remove_dir_all(&out).expect("clear the run dir");
    }
    std::fs::create_dir_all(&out).expect("make the run dir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(f(bin, &out))
        .unwrap_or_else(|e| panic!("the {name} run failed (files in {}): {e:#}", out.display()))
}

/// The user's story from the issue: A's data dir restored from a backup
/// taken before it sent old-6..10, which B holds; A then sends new-1..5,
/// answered with seqs 6..10 of the old stream, before it hears from B.
#[test]
fn a_store_restored_from_a_backup_starts_a_new_epoch_and_new_messages_arrive_once() {
    let r = run(
        "restore-from-backup",
        mesh_tests::restore::restore_from_backup,
    );
    let (before, after) = &r.epochs;
    assert_ne!(before, after, "A started a new epoch: {r:#?}");
    assert_eq!(
        r.new_answers.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![6, 7, 8, 9, 10],
        "the restored store answered the old stream's next seqs: {r:#?}"
    );
    // B: old-1..10 under the old epoch, new-1..5 once each under the new one.
    let want_old: Vec<(String, String, u64)> = (1..=10)
        .map(|i| (format!("old-{i}"), before.clone(), i))
        .collect();
    let want_new: Vec<(String, String, u64)> = (1..=5)
        .map(|i| (format!("new-{i}"), after.clone(), i))
        .collect();
    assert_eq!(r.at_b, [want_old, want_new].concat(), "{r:#?}");
    assert_eq!(r.b_ended, vec![(before.clone(), 10)], "{r:#?}");
    // Both journals say what the rollback lost: 6..10 of the old stream.
    assert_eq!(r.a_rolled_back, vec![(before.clone(), 6, 10)], "{r:#?}");
    assert_eq!(r.b_rolled_back, vec![(before.clone(), 6, 10)], "{r:#?}");
}

/// As above for a topic: A restored from a backup taken before it
/// published old-3..4, which B holds, learns from B's marks that its topic
/// stream went back, starts a new epoch and publishes new-1 on it.
#[test]
fn a_store_restored_from_a_backup_publishes_to_a_topic_on_a_new_epochs_stream() {
    let r = run(
        "restore-topic-from-backup",
        mesh_tests::restore::restore_topic_from_backup,
    );
    let (before, after) = &r.epochs;
    assert_ne!(before, after, "A started a new epoch: {r:#?}");
    assert_eq!(r.new_answer, (1, after.clone()), "{r:#?}");
    // B: old-1..4 under the old epoch, new-1 once under the new one.
    let mut want: Vec<(String, String, u64)> = (1..=4)
        .map(|i| (format!("old-{i}"), before.clone(), i))
        .collect();
    want.push(("new-1".to_owned(), after.clone(), 1));
    assert_eq!(r.at_b, want, "{r:#?}");
    // Both journals say what the restore lost: 3..4 of the old stream.
    assert_eq!(r.a_rolled_back, vec![(before.clone(), 3, 4)], "{r:#?}");
    assert_eq!(r.b_rolled_back, vec![(before.clone(), 3, 4)], "{r:#?}");
}

/// A copied data dir run twice at once, the copy sending after B has
/// everything A sent: an identity conflict at both ends, and every message
/// either copy acknowledged reaches B exactly once.
#[test]
fn a_data_dir_run_twice_is_an_identity_conflict_and_loses_nothing_acknowledged() {
    check_clone_run(CloneSends::OneAfterTheOther);
}

/// As above, with both copies sending in turn before B has seen the
/// conflict.
#[test]
fn a_data_dir_run_twice_while_both_copies_send_delivers_each_message_once() {
    check_clone_run(CloneSends::Interleaved);
}

fn check_clone_run(sends: CloneSends) {
    let r = run(&format!("clone-run-twice-{sends:?}"), async |bin, out| {
        mesh_tests::restore::clone_run_twice(bin, out, sends).await
    });
    assert!(
        r.b_conflict
            .as_deref()
            .is_some_and(|w| w.contains("two processes")),
        "{r:#?}"
    );
    assert!(r.refused_conflict.is_some(), "{r:#?}");
    let bodies: Vec<&str> = r.at_b.iter().map(|(b, ..)| b.as_str()).collect();
    let unique: BTreeSet<&str> = bodies.iter().copied().collect();
    assert_eq!(unique.len(), bodies.len(), "nothing twice: {r:#?}");
    let acked: BTreeSet<&str> = r.acknowledged.keys().map(String::as_str).collect();
    assert_eq!(
        unique, acked,
        "everything acknowledged, nothing else: {r:#?}"
    );
}
