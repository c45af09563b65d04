//! Each threshold of `mesh check` against readings made by hand: it trips
//! at its bound and not below it.

use clap::Parser as _;
use serde_json::json;

use super::*;
use crate::{Cli, Command};

const NOW: u64 = 1_000_000_000;

fn args(flags: &[&str]) -> CheckArgs {
    let mut argv = vec!["mesh", "check"];
    argv.extend_from_slice(flags);
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Check(a) => a,
        other => panic!("{other:?}"),
    }
}

/// A node with one peer (`queued` messages, the oldest written `age_ms`
/// ago), a journal of `journal_bytes` of 1,000,000, and `unread` the age
/// of agent bob's oldest unread message.
fn reading(queued: u64, age_ms: Option<u64>, journal_bytes: u64, unread: Option<u64>) -> Reading {
    let status = json!({
        "node": "a".repeat(64),
        "epoch": "00",
        "addrs": [],
        "ticket": "t",
        "peers": [{
            "node": "b".repeat(64),
            "addrs": [],
            "connected": true,
            "epoch": null,
            "marks": [],
            "queued_msgs": queued,
            "outbox_bytes": queued * 10,
            "oldest_queued_ms": age_ms.map(|a| NOW - a),
        }],
        "store_bytes": null,
        "journal": {"first": 1, "head": 10, "bytes": journal_bytes, "max_bytes": 1_000_000},
    });
    Reading {
        status: serde_json::from_value(status).unwrap(),
        unread: Ok(vec![("bob".into(), unread.map(|a| NOW - a))]),
        losses: Ok((0, 10)),
    }
}

fn state_of(r: &Report, check: &str) -> State {
    r.checks.iter().find(|f| f.check == check).unwrap().state
}

#[test]
fn a_quiet_node_is_ok_and_says_its_peers() {
    let r = evaluate(&reading(0, None, 10, None), &args(&[]), NOW);
    assert_eq!(r.state, State::Ok, "{r:?}");
    assert_eq!(r.code, 0);
    assert_eq!(r.summary, "MESH OK - 1/1 peers connected");
    let text = render(&r, &args(&[])).unwrap();
    assert!(text.starts_with("MESH OK - 1/1 peers connected|"), "{text}");
    assert!(text.contains(" 'peers_connected'=1;;"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}

#[test]
fn the_queue_trips_at_its_bounds() {
    let a = args(&["--queue-warn", "3", "--queue-crit", "5"]);
    let at = |q| state_of(&evaluate(&reading(q, Some(0), 10, None), &a, NOW), "queue");
    assert_eq!(at(2), State::Ok);
    assert_eq!(at(3), State::Warning);
    assert_eq!(at(4), State::Warning);
    assert_eq!(at(5), State::Critical);
    let r = evaluate(&reading(5, Some(0), 10, None), &a, NOW);
    assert_eq!(r.code, 2);
    assert!(
        r.summary
            .starts_with("MESH CRITICAL - peer bbbbbbbbbb has 5 queued"),
        "{}",
        r.summary
    );
}

#[test]
fn the_oldest_queued_message_trips_at_its_age() {
    let a = args(&["--queue-age-warn", "60s", "--queue-age-crit", "1h"]);
    let at = |ms| {
        state_of(
            &evaluate(&reading(1, Some(ms), 10, None), &a, NOW),
            "queue_age",
        )
    };
    assert_eq!(at(59_999), State::Ok);
    assert_eq!(at(60_000), State::Warning);
    assert_eq!(at(3_599_999), State::Warning);
    assert_eq!(at(3_600_000), State::Critical);
    // Nothing queued has no age.
    assert_eq!(
        state_of(&evaluate(&reading(0, None, 10, None), &a, NOW), "queue_age"),
        State::Ok
    );
}

#[test]
fn unread_mail_trips_at_its_age_and_an_unreadable_inbox_is_unknown() {
    let a = args(&["--unread-age-warn", "10m", "--unread-age-crit", "1d"]);
    let at = |ms| {
        state_of(
            &evaluate(&reading(0, None, 10, Some(ms)), &a, NOW),
            "unread_age",
        )
    };
    assert_eq!(at(599_999), State::Ok);
    assert_eq!(at(600_000), State::Warning);
    assert_eq!(at(86_400_000), State::Critical);
    let mut r = reading(0, None, 10, None);
    r.unread = Err("refused".into());
    assert_eq!(
        state_of(&evaluate(&r, &a, NOW), "unread_age"),
        State::Unknown
    );
    // Without a bound, an inbox that cannot be read is not a finding.
    assert_eq!(
        state_of(&evaluate(&r, &args(&[]), NOW), "unread_age"),
        State::Ok
    );
}

#[test]
fn the_journal_trips_at_its_percent_of_the_bound() {
    let a = args(&["--journal-warn", "50", "--journal-crit", "90.5"]);
    let at = |b| state_of(&evaluate(&reading(0, None, b, None), &a, NOW), "journal");
    assert_eq!(at(499_999), State::Ok);
    assert_eq!(at(500_000), State::Warning);
    assert_eq!(at(904_999), State::Warning);
    assert_eq!(at(905_000), State::Critical);
    // The defaults: 80 and 95.
    let d = args(&[]);
    let at = |b| state_of(&evaluate(&reading(0, None, b, None), &d, NOW), "journal");
    assert_eq!(at(799_999), State::Ok);
    assert_eq!(at(800_000), State::Warning);
    assert_eq!(at(950_000), State::Critical);
}

#[test]
fn losses_warn_from_one_by_default_and_go_critical_at_their_bound() {
    let mut r = reading(0, None, 10, None);
    r.losses = Ok((1, 10));
    assert_eq!(
        state_of(&evaluate(&r, &args(&[]), NOW), "losses"),
        State::Warning
    );
    assert_eq!(
        state_of(&evaluate(&r, &args(&["--losses-warn", "0"]), NOW), "losses"),
        State::Ok
    );
    let a = args(&["--losses-warn", "2", "--losses-crit", "3"]);
    r.losses = Ok((2, 10));
    assert_eq!(state_of(&evaluate(&r, &a, NOW), "losses"), State::Warning);
    r.losses = Ok((3, 10));
    assert_eq!(state_of(&evaluate(&r, &a, NOW), "losses"), State::Critical);
}

#[test]
fn too_few_peers_or_a_store_that_cannot_commit_is_critical() {
    let r = reading(0, None, 10, None);
    assert_eq!(
        state_of(&evaluate(&r, &args(&["--peers-min", "1"]), NOW), "peers"),
        State::Ok
    );
    let two = evaluate(&r, &args(&["--peers-min", "2"]), NOW);
    assert_eq!(state_of(&two, "peers"), State::Critical);
    assert_eq!(
        two.summary,
        "MESH CRITICAL - 1/1 peers connected (at least 2 wanted)"
    );
    let mut down = reading(0, None, 10, None);
    down.status.store_down = Some("disk full".into());
    let r = evaluate(&down, &args(&[]), NOW);
    assert_eq!((r.state, r.code), (State::Critical, 2));
    assert!(
        r.summary.contains("store cannot commit: disk full"),
        "{}",
        r.summary
    );
}

#[test]
fn critical_outranks_unknown_outranks_warning() {
    assert_eq!(State::Warning.worst(State::Unknown), State::Unknown);
    assert_eq!(State::Unknown.worst(State::Critical), State::Critical);
    assert_eq!(State::Critical.worst(State::Unknown), State::Critical);
    assert_eq!(State::Ok.worst(State::Warning), State::Warning);
    let codes: Vec<u8> = [State::Ok, State::Warning, State::Critical, State::Unknown]
        .iter()
        .map(|s| s.code())
        .collect();
    assert_eq!(codes, [0, 1, 2, 3]);
}

#[test]
fn bad_bounds_are_refused_by_the_parser() {
    for flags in [
        &["--journal-warn", "0"][..],
        &["--journal-crit", "101"],
        &["--recent", "0"],
        &["--recent", "100001"],
        &["--queue-age-warn", "soon"],
        &["--format", "xml"],
    ] {
        let mut argv = vec!["mesh", "check"];
        argv.extend_from_slice(flags);
        assert!(Cli::try_parse_from(argv).is_err(), "{flags:?} accepted");
    }
}

#[test]
fn the_subcommand_is_found_past_the_global_flags() {
    let words = |a: &[&str]| subcommand_of(a);
    assert_eq!(
        words(&["--data", "/x", "check", "--json"]).as_deref(),
        Some("check")
    );
    assert_eq!(
        words(&["--agent", "check", "status"]).as_deref(),
        Some("status")
    );
    assert_eq!(words(&["--json"]), None);
}

fn subcommand_of(args: &[&str]) -> Option<String> {
    crate::subcommand(args.iter().map(|s| (*s).to_owned()))
}
