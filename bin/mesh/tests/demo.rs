//! `mesh demo` end to end: three real `mesh daemon` processes, narrated.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::time::Duration;

const MESH: &str = env!("CARGO_BIN_EXE_mesh");

/// The test fails rather than hangs.
const TEST_TIMEOUT: Duration = Duration::from_secs(180);

async fn bounded<T>(f: impl Future<Output = T>) -> Result<T, tokio::time::error::Elapsed> {
    tokio::time::timeout(TEST_TIMEOUT, f).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_demo_narrates_the_catch_up_and_the_gap_and_removes_its_dir() {
    bounded(async {
        let mut out = Vec::new();
        mesh_cli::demo::run(Path::new(MESH), &mut out)
            .await
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        for want in [
            "bravo joined alpha's mesh with it",
            "charlie joined bravo with bravo's code",
            "alpha-bravo, alpha-charlie and bravo-charlie are connected",
            "charlie's marks: 1 for alpha's stream, 1 for bravo's stream.",
            "alpha -> charlie: 5 messages, seqs #2..=#6",
            "bravo -> charlie: 6 messages, seqs #2..=#7",
            "LOSS outbox_evicted: bravo's stream to charlie #2..=#2",
            "LOSS outbox_evicted: bravo's stream to charlie #4..=#4",
            "GAP  from bravo #2..=#4",
            "5 messages from alpha (#2..=#6) and 3 from bravo (#5..=#7).",
            "bravo no longer held #2..=#4 of its stream to charlie",
            "charlie's marks now: 6 for alpha's stream, 7 for bravo's stream.",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        let dir = text
            .lines()
            .find_map(|l| l.strip_prefix("QUIC endpoint on 127.0.0.1 and API socket, in "))
            .unwrap();
        assert!(!Path::new(dir).exists(), "{dir} is left behind");
    })
    .await
    .expect("the demo did not finish in time");
}
