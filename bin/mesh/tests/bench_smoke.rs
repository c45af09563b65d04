//! `mesh bench local --quick` and `mesh bench peer --quick` end to end: two
//! real `mesh daemon` processes, every workload, every figure present,
//! nothing left behind. They assert no speed.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::sync::Mutex;

use clap::Parser as _;
use mesh_api::DataDir;
use mesh_cli::{Cli, Command};
use mesh_cluster::{Cluster, ClusterConfig};
use serde_json::json;

const MESH: &str = env!("CARGO_BIN_EXE_mesh");

/// The two benches run one at a time, as `mesh bench` runs: each measures
/// the whole machine.
static ONE_BENCH_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Every figure of a quick bench (all workloads), besides the probes'.
const WORKLOADS: [&str; 7] = [
    "disk-fsync",
    "store-commit",
    "send-each",
    "send-pipelined",
    "latency",
    "catch-up",
    "queued-memory",
];

/// Every workload has figures, each a finite non-negative median.
fn assert_every_figure(report: &mesh_bench::Report) {
    assert_figures(report, &WORKLOADS);
}

/// Each of `workloads` has figures, each a finite non-negative median.
fn assert_figures(report: &mesh_bench::Report, workloads: &[&str]) {
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.missing().is_empty(), "{:?}", report.missing());
    for &workload in workloads {
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
}

#[test]
fn a_quick_local_bench_gives_every_figure_and_leaves_nothing_behind() {
    let _one = one_bench_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let exe = Path::new(MESH);
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
    let report = mesh_bench::measure(cmd, &data).unwrap();
    eprintln!("{}", report.table());
    assert_every_figure(&report);
    // bench local also sends as an agent to an agent of the peer, and
    // publishes to a topic the peer joined.
    assert_figures(
        &report,
        &["agent-pipelined", "topic-fanout", "topic-batched"],
    );
    let json = serde_json::to_string(&report).unwrap();
    let back: mesh_bench::Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back.figures.len(), report.figures.len());
    // The daemons are gone and their temp dir with them.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The bench's lock, held by one test at a time.
fn one_bench_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_BENCH_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_quick_peer_bench_pauses_the_link_gives_every_figure_and_leaves_nothing_queued() {
    let _one = one_bench_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Two linked `mesh daemon` processes, a and b.
    let cluster = rt.block_on(async {
        let mut c = Cluster::start(ClusterConfig::new(MESH, 2)).await.unwrap();
        c.wait_connected().await.unwrap();
        c
    });
    let (a_id, b_id) = (cluster.node_id(0).to_owned(), cluster.node_id(1).to_owned());
    let a_data = DataDir::resolve(Some(cluster.data_dir(0))).unwrap();
    let peer_of = async |i: usize, id: &str| {
        let st = cluster.status(i).await.unwrap();
        let p = st.node.peers.into_iter().find(|p| p.node == id);
        serde_json::to_value(p).unwrap()
    };
    let cli = Cli::try_parse_from(["mesh", "bench", "peer", "--quick", &b_id]).unwrap();
    let Command::Bench(cmd) = cli.command else {
        panic!("not a bench command");
    };
    let report = mesh_bench::measure(cmd, &a_data).unwrap();
    eprintln!("{}", report.table());
    assert_every_figure(&report);
    for metric in ["rate", "connect", "sender_cpu/msg"] {
        assert!(
            report
                .figures
                .iter()
                .any(|f| f.workload == "catch-up" && f.metric == metric),
            "no catch-up {metric}"
        );
    }
    assert!(
        report.notes.iter().any(|n| n.contains("0x6d62")),
        "{:?}",
        report.notes
    );
    // The link is resumed and everything was acknowledged: the peer holds
    // every message the bench sent, and a holds none unacknowledged.
    rt.block_on(async {
        let p = peer_of(0, &b_id).await;
        assert_eq!(
            (&p["paused"], &p["queued_msgs"]),
            (&json!(false), &json!(0)),
            "{p}"
        );
        let q = peer_of(1, &a_id).await;
        assert!(q["marks"][0]["mark"].as_u64().unwrap() > 0, "{q}");
    });
}
