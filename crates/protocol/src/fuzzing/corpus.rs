//! The committed fuzz corpus (`fuzz/corpus/<target>/`), replayed by the
//! corpus tests of each crate with fuzz targets: one replay, not a copy per
//! crate. Every function panics on what it finds wrong: it is a test's check.

use std::path::{Path, PathBuf};

/// A fuzz harness: takes any bytes, panics only on a bug.
pub type Harness = fn(&[u8]);

/// Set to write the seeds instead of checking them.
pub const BLESS_VAR: &str = "MESH_BLESS_CORPUS";

/// The corpus folder of fuzz target `target` under `root` (`fuzz/corpus`).
pub fn dir(root: &Path, target: &str) -> PathBuf {
    root.join(target)
}

/// Every file of `target`'s corpus with its bytes, by path.
///
/// # Panics
/// If the folder or a file in it cannot be read.
pub fn read(root: &Path, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = dir(root, target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read the {target} corpus at {}: {e}", dir.display()));
    let mut files: Vec<_> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())))
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes =
                std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// Checks that each of `targets` has a corpus under `root` with a file in it.
///
/// # Panics
/// At the first empty (or unreadable) corpus.
pub fn assert_none_empty(root: &Path, targets: &[(&str, Harness)]) {
    for (target, _) in targets {
        assert!(
            !read(root, target).is_empty(),
            "the {target} corpus is empty"
        );
    }
}

/// Runs every corpus input of each target through its harness.
///
/// # Panics
/// Naming the first input that panics its harness.
pub fn replay(root: &Path, targets: &[(&str, Harness)]) {
    for (target, harness) in targets {
        for (path, bytes) in read(root, target) {
            let run = std::panic::catch_unwind(|| harness(&bytes));
            assert!(
                run.is_ok(),
                "{target}: {} panics the harness",
                path.display()
            );
        }
    }
}

/// Checks that each `(target, name, bytes)` seed is committed as `bytes`;
/// with [`BLESS_VAR`] set, writes them instead.
///
/// # Panics
/// At the first seed missing or stale (or, when blessing, not written).
pub fn check_seeds(root: &Path, seeds: Vec<(&str, String, Vec<u8>)>) {
    let bless = std::env::var_os(BLESS_VAR).is_some();
    for (target, name, bytes) in seeds {
        let path = dir(root, target).join(&name);
        if bless {
            std::fs::create_dir_all(dir(root, target))
                .and_then(|()| std::fs::write(&path, &bytes))
                .unwrap_or_else(|e| panic!("cannot write seed {}: {e}", path.display()));
            continue;
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "seed {} missing ({e}); rerun with {BLESS_VAR}=1",
                path.display()
            )
        });
        assert!(
            committed == bytes,
            "seed {} is stale; rerun with {BLESS_VAR}=1",
            path.display()
        );
    }
}

/// The corpus tests of a crate with fuzz targets, written once: every
/// target has a non-empty corpus ([`assert_none_empty`]), every input runs
/// through its harness without a panic ([`replay`]), and the committed
/// seeds are the current ones ([`check_seeds`], in the test named
/// `seeds_test`).
///
/// `root` is the corpus folder, `targets` the `(target, harness)` table and
/// `seeds` the seeds as [`check_seeds`] takes them; each is an expression
/// evaluated in the test.
#[macro_export]
#[doc(hidden)]
macro_rules! corpus_tests {
    (
        root: $root:expr,
        targets: $targets:expr,
        seeds: $seeds:expr,
        seeds_test: $seeds_test:ident $(,)?
    ) => {
        #[test]
        fn every_fuzz_target_has_a_non_empty_corpus() {
            $crate::fuzzing::corpus::assert_none_empty(&$root, &$targets);
        }

        #[test]
        fn every_corpus_input_runs_through_its_harness_without_a_panic() {
            $crate::fuzzing::corpus::replay(&$root, &$targets);
        }

        #[test]
        fn $seeds_test() {
            $crate::fuzzing::corpus::check_seeds(&$root, $seeds);
        }
    };
}
