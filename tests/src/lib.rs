//! Multi-node and multi-process tests of agent-mesh: the fault harness and
//! its history checker.
//!
//! The harness runs real `mesh daemon` processes ([`cluster`]), optionally in
//! network namespaces ([`netns`]), drives them with a recorded [`workload`],
//! injects seeded faults ([`nemesis`]) and judges the result ([`checker`]);
//! [`chaos`] ties it together. [`outage`] fills a node's disk and
//! [`flood`] sends it hostile frames; [`restore`] rolls a store back and
//! runs a copied one twice; [`daemon`] runs one daemon and the CLI
//! as a person would. The process-level tests live in `bin/mesh/tests/`,
//! where the `mesh` executable's path is known. What the fault harness does
//! and how to run it: `docs/reliability.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod chaos;
pub mod checker;
pub mod cluster;
pub mod daemon;
pub mod flood;
pub mod history;
pub mod move_link;
pub mod nemesis;
pub mod netns;
pub mod outage;
pub mod restore;
pub mod rng;
pub mod workload;

use std::path::{Path, PathBuf};

/// Where a process-level run of the `mesh` executable `bin` keeps its files:
/// `<target>/chaos/<name>` beside the build, else the temp dir.
pub fn run_dir(bin: &Path, name: &str) -> PathBuf {
    bin.parent()
        .and_then(Path::parent)
        .map_or_else(std::env::temp_dir, Path::to_owned)
        .join("chaos")
        .join(name)
}
