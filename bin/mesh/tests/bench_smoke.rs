//! `mesh bench local --quick` and `mesh bench peer --quick` end to end: two
//! real `mesh daemon` processes, every workload, every figure present,
//! nothing left behind. They assert no speed.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser as _;
use mesh_api::DataDir;
use mesh_api::client::Client;
use mesh_cli::{Cli, Command};
use serde_json::{Value, json};

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
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(report.missing().is_empty(), "{:?}", report.missing());
    for workload in WORKLOADS {
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
    let _one = ONE_BENCH_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
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
    let json = serde_json::to_string(&report).unwrap();
    let back: mesh_bench::Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back.figures.len(), report.figures.len());
    // The daemons are gone and their temp dir with them.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A `mesh daemon` process, killed on drop.
struct DaemonChild(Child);

impl DaemonChild {
    fn start(dir: &Path) -> DaemonChild {
        let child = std::process::Command::new(MESH)
            .args(["daemon", "--data"])
            .arg(dir)
            .args(["--bind", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        DaemonChild(child)
    }
}

impl Drop for DaemonChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` every 20 ms, for at most 60 s.
async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..3000 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("gave up waiting for {what}");
}

/// The peer `id` in `client`'s status.
async fn peer_of(client: &Client, id: &str) -> Value {
    let st: Value = client.get("/v1/status").await.unwrap();
    st["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["node"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn a_quick_peer_bench_pauses_the_link_gives_every_figure_and_leaves_nothing_queued() {
    let _one = ONE_BENCH_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    let _a = DaemonChild::start(&a_dir);
    let _b = DaemonChild::start(&b_dir);
    let a_data = DataDir::resolve(Some(&a_dir)).unwrap();
    let a = Client::new(a_data.socket_path());
    let b = Client::new(DataDir::resolve(Some(&b_dir)).unwrap().socket_path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (a_id, b_id) = rt.block_on(async {
        let mut ids = Vec::new();
        let mut tickets = Vec::new();
        for c in [&a, &b] {
            let st: Value = wait_for("a daemon to answer", async || {
                c.get::<Value>("/v1/status").await.ok()
            })
            .await;
            ids.push(st["node"].as_str().unwrap().to_owned());
            let t: Value = c.get("/v1/ticket").await.unwrap();
            tickets.push(t["ticket"].clone());
        }
        let _: Value = a
            .post("/v1/peers", &json!({ "ticket": tickets[1] }))
            .await
            .unwrap();
        let _: Value = b
            .post("/v1/peers", &json!({ "ticket": tickets[0] }))
            .await
            .unwrap();
        let (a_id, b_id) = (ids[0].clone(), ids[1].clone());
        wait_for("a and b to connect", async || {
            let up = peer_of(&a, &b_id).await["connected"] == true
                && peer_of(&b, &a_id).await["connected"] == true;
            up.then_some(())
        })
        .await;
        (a_id, b_id)
    });
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
        let p = peer_of(&a, &b_id).await;
        assert_eq!(
            (&p["paused"], &p["queued_msgs"]),
            (&json!(false), &json!(0)),
            "{p}"
        );
        let q = peer_of(&b, &a_id).await;
        assert!(q["marks"][0]["mark"].as_u64().unwrap() > 0, "{q}");
    });
}
