//! `mesh bench local --quick` end to end: two real daemon processes, every
//! workload, every figure present, nothing left behind. It asserts no speed.
//!
//! This test has no libtest harness (see `Cargo.toml`): the bench starts
//! its daemons by re-running this executable as `daemon --data DIR --bind
//! ADDR`, which `main` hands to the daemon like `mesh` would.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use clap::Parser as _;
use mesh_daemon::cli::{Cli, Command};
use mesh_daemon::paths::DataDir;

const TEST_NAME: &str = "a_quick_local_bench_gives_every_figure_and_leaves_nothing_behind";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("daemon") {
        return mesh_daemon::run(Cli::parse_from(&args));
    }
    // cargo-nextest lists the tests of a harness-less binary this way.
    if args.iter().any(|a| a == "--list") {
        println!("{TEST_NAME}: test");
        return Ok(());
    }
    a_quick_local_bench_gives_every_figure_and_leaves_nothing_behind();
    println!("test {TEST_NAME} ... ok");
    Ok(())
}

fn a_quick_local_bench_gives_every_figure_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let cli = Cli::try_parse_from([
        "mesh".as_ref(),
        "bench".as_ref(),
        "local".as_ref(),
        "--quick".as_ref(),
        "--dir".as_ref(),
        tmp.path().as_os_str(),
        "--daemon-bin".as_ref(),
        exe.as_os_str(),
    ])
    .unwrap();
    let Command::Bench(cmd) = cli.command else {
        panic!("not a bench command");
    };
    let data = DataDir::resolve(Some(tmp.path())).unwrap();
    let report = mesh_daemon::bench::measure(cmd, &data).unwrap();
    eprintln!("{}", report.table());
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.missing().is_empty(), "{:?}", report.missing());
    for workload in [
        "disk-fsync",
        "store-commit",
        "send-each",
        "send-pipelined",
        "latency",
        "catch-up",
        "queued-memory",
    ] {
        let figures: Vec<_> = report
            .figures
            .iter()
            .filter(|f| f.workload == workload)
            .collect();
        assert!(!figures.is_empty(), "no figure for {workload}");
        for f in figures {
            let v = f.median.unwrap_or(f64::NAN);
            assert!(v.is_finite() && v >= 0.0, "{workload} {}: {v}", f.metric);
        }
    }
    let json = serde_json::to_string(&report).unwrap();
    let back: mesh_daemon::bench::Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back.figures.len(), report.figures.len());
    // The daemons are gone and their temp dir with them.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
