//! Chaos runs of real `mesh daemon` processes: kill -9, SIGSTOP, partitions
//! and packet loss under a recorded workload, judged by the history checker;
//! and an agent moved back and forth between the daemons meanwhile, that
//! the others' agents send to. The harness is `mesh_tests::chaos`; see
//! `docs/reliability.md`.

use mesh_tests::chaos::{ChaosConfig, Report, run_blocking};

/// The fewest faults the short run must carry out.
const SHORT_FAULTS_MIN: u64 = 20;

fn judge(report: &Report) {
    assert!(
        report
            .faults
            .get("kill_during_resync")
            .copied()
            .unwrap_or(0)
            >= 1,
        "no kill during resync was carried out\n{report}"
    );
    if report.topic.is_some() {
        let t = &report.summary.total;
        assert!(
            t.topic_acked > 0 && t.topic_delivered > 0,
            "no published message was acknowledged and delivered\n{report}"
        );
    }
    let s = &report.summary;
    if s.agent_sends.invoked > 0 {
        assert!(
            s.agent_moves >= 1,
            "the roaming agent was never moved\n{report}"
        );
        assert!(
            s.agent_total.acked > 0 && s.agent_total.read > 0,
            "no agent send was acknowledged and read\n{report}"
        );
        assert_eq!(
            (s.agent_total.lost, s.agent_total.duplicated),
            (0, 0),
            "an agent send was lost or read twice\n{report}"
        );
    }
    assert!(report.passed(), "the chaos run broke a guarantee\n{report}");
}

#[test]
fn a_short_seeded_chaos_run_loses_nothing() {
    let cfg = ChaosConfig::short(env!("CARGO_BIN_EXE_mesh"));
    let report = match run_blocking(cfg) {
        Ok(r) => r,
        Err(e) => panic!("the chaos run could not be carried out: {e:#}"),
    };
    assert!(
        report.faults_total >= SHORT_FAULTS_MIN,
        "only {} faults were carried out\n{report}",
        report.faults_total
    );
    assert!(
        report.resync_kills_while_behind >= 1,
        "no kill landed while the node was catching up\n{report}"
    );
    judge(&report);
}

/// `just chaos SECONDS` runs this with `CHAOS_SECONDS` (and `CHAOS_SEED`).
#[test]
#[ignore = "long: run it with `just chaos SECONDS`"]
fn a_long_chaos_run_loses_nothing() {
    let cfg = ChaosConfig::long(env!("CARGO_BIN_EXE_mesh"));
    let report = match run_blocking(cfg) {
        Ok(r) => r,
        Err(e) => panic!("the chaos run could not be carried out: {e:#}"),
    };
    judge(&report);
}

/// Checks a finished run's folder again: `CHAOS_RECHECK=DIR`.
#[test]
#[ignore = "needs CHAOS_RECHECK=DIR, a finished run's folder"]
fn recheck_a_finished_run() {
    let Some(dir) = std::env::var_os("CHAOS_RECHECK") else {
        panic!("set CHAOS_RECHECK to a run's folder");
    };
    let summary = match mesh_tests::chaos::recheck(std::path::Path::new(&dir)) {
        Ok(s) => s,
        Err(e) => panic!("cannot recheck: {e:#}"),
    };
    eprintln!("total: {}", summary.total);
    for (agent, c) in &summary.per_agent {
        eprintln!("agent {agent}: {c}");
    }
    for e in &summary.examples {
        eprintln!("  {e}");
    }
    assert!(summary.passed());
}
