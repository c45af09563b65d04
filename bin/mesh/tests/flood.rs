//! Hostile input: a linked peer floods a daemon with frames it must refuse
//! while an honest peer keeps sending. The harness is `mesh_tests::flood`;
//! see `docs/reliability.md`. `FLOOD_FRAMES` sets the frame count.

use std::path::Path;

/// Frames in the run `cargo test` makes (the full flood is
/// `FLOOD_FRAMES=1000000`).
const FRAMES_DEFAULT: u64 = 20_000;

#[test]
fn a_flood_of_hostile_frames_changes_nothing_and_honest_traffic_flows() {
    let bin = Path::new(env!("CARGO_BIN_EXE_mesh"));
    let frames = std::env::var("FLOOD_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FRAMES_DEFAULT);
    let out = mesh_tests::run_dir(bin, "flood");
    let report = match mesh_tests::flood::run_blocking(bin, &out, frames) {
        Ok(r) => r,
        Err(e) => panic!("the flood could not be carried out: {e:#}"),
    };
    assert!(report.passed(), "{report:#?}");
}
