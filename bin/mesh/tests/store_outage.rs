//! Store outage: a node's data dir on a tmpfs that fills up while it takes
//! sends. The harness is `mesh_tests::outage`; see `docs/reliability.md`.

use std::path::Path;

/// While the disk is full, sends are held (their requests open), the node
/// answers its status, and each held send ends once: 503 after the hold
/// (with a `lost` record once the store is back) or committed when the store
/// returns within it; a node stopped during a hold acknowledges nothing;
/// the store reopens by itself when the disk has room again (redb refuses
/// every later write on a handle after an I/O error).
///
/// It mounts a tmpfs, which needs root: without root it fails, saying so,
/// rather than pass without having run (CI runs as root).
#[test]
fn a_full_disk_holds_sends_and_each_ends_once_committed_or_let_go_and_nothing_is_lost() {
    let report = outage_run(
        "store-outage",
        "a_full_disk",
        mesh_tests::outage::run_blocking,
    );
    assert!(report.passed(), "{report:#?}");
}

/// Runs an outage scenario (`run`) in the run dir `name`; fails, naming
/// the `--skip` that leaves it out, where there is no root to mount a
/// tmpfs with, rather than pass without having run.
fn outage_run<T>(name: &str, skip: &str, run: fn(&Path, &Path) -> anyhow::Result<T>) -> T {
    assert!(
        mesh_tests::netns::is_root(),
        "the {name} test mounts a tmpfs, which needs root: run it as root \
         (CI does), or leave it out with `--skip {skip}`"
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_mesh"));
    let out = mesh_tests::run_dir(bin, name);
    run(bin, &out).unwrap_or_else(|e| panic!("the {name} run could not be carried out: {e:#}"))
}

/// Two keyed agent messages held while the disk is full: once it has room,
/// the older is committed as its own tombstone and answered `superseded_by`
/// the newer, and the recipient's inbox shows the tombstone, then the newer.
/// Root, as above.
#[test]
fn a_keyed_send_held_with_a_newer_one_of_its_key_is_superseded_at_both_ends() {
    let report = outage_run(
        "store-outage-supersede",
        "a_keyed_send_held",
        mesh_tests::outage::supersede::run_blocking,
    );
    assert!(report.passed(), "{report:#?}");
}

/// A topic publish held while the disk is full, and a batch behind it:
/// once it has room, each is committed at the seq after the one before, in
/// the order asked, and the other member journals every publish once, in
/// order. Root, as above.
#[test]
fn a_full_disk_holds_publishes_and_each_is_committed_once_in_order_at_every_member() {
    let report = outage_run(
        "store-outage-publish",
        "a_full_disk_holds_publishes",
        mesh_tests::outage::publish::run_blocking,
    );
    assert!(report.passed(), "{report:#?}");
}
