//! Store outage: a node's data dir on a tmpfs that fills up while it takes
//! sends. The harness is `mesh_tests::outage`; see `docs/reliability.md`.

use std::path::Path;

/// While the disk is full, sends are refused (503) and nothing acknowledged
/// is lost; once it has room again the node takes sends again by itself:
/// the store reopens redb after a failed write, because redb refuses every
/// later write on the same handle ("Previous I/O error occurred").
#[test]
fn a_full_disk_refuses_sends_loses_nothing_and_recovers_by_itself() {
    if !mesh_tests::netns::is_root() {
        eprintln!("SKIPPED: the store outage test mounts a tmpfs, which needs root");
        return;
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_mesh"));
    let out = mesh_tests::run_dir(bin, "store-outage");
    let report = match mesh_tests::outage::run_blocking(bin, &out) {
        Ok(r) => r,
        Err(e) => panic!("the store outage run could not be carried out: {e:#}"),
    };
    assert!(report.passed(), "{report:#?}");
}
