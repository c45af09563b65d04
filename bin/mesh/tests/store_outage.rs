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
    assert!(
        mesh_tests::netns::is_root(),
        "the store outage test mounts a tmpfs, which needs root: run it as root \
         (CI does), or leave it out with `--skip a_full_disk`"
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_mesh"));
    let out = mesh_tests::run_dir(bin, "store-outage");
    let report = match mesh_tests::outage::run_blocking(bin, &out) {
        Ok(r) => r,
        Err(e) => panic!("the store outage run could not be carried out: {e:#}"),
    };
    assert!(report.passed(), "{report:#?}");
}

/// Two keyed agent messages held while the disk is full: once it has room,
/// the older is committed as its own tombstone and answered `superseded_by`
/// the newer, and the recipient's inbox shows the tombstone, then the newer.
/// Root, as above.
#[test]
fn a_keyed_send_held_with_a_newer_one_of_its_key_is_superseded_at_both_ends() {
    assert!(
        mesh_tests::netns::is_root(),
        "the supersede outage test mounts a tmpfs, which needs root: run it as root \
         (CI does), or leave it out with `--skip a_keyed_send_held`"
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_mesh"));
    let out = mesh_tests::run_dir(bin, "store-outage-supersede");
    let report = match mesh_tests::outage::supersede::run_blocking(bin, &out) {
        Ok(r) => r,
        Err(e) => panic!("the supersede outage run could not be carried out: {e:#}"),
    };
    assert!(report.passed(), "{report:#?}");
}
