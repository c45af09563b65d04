use super::*;

#[test]
fn the_cli_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn an_error_exits_with_its_fault_class_and_a_usage_error_with_the_usage_code() {
    let refused = ClientError::Api {
        status: 429,
        code: "outbox_full".into(),
        fault: Fault::Capacity,
        message: "full".into(),
    };
    let e = anyhow::Error::from(refused).context("sending");
    assert_eq!(exit_code(&e), Fault::Capacity.exit_code());
    let gone = ClientError::NotRunning { path: "/x".into() };
    assert_eq!(exit_code(&gone.into()), Fault::Unavailable.exit_code());
    assert_eq!(exit_code(&UsageError("no".into()).into()), EXIT_USAGE);
    assert_eq!(exit_code(&anyhow::anyhow!("disk")), EXIT_OTHER);
}

#[test]
fn durations_read_as_a_person_writes_them() {
    assert_eq!(parse_duration_ms("90s"), Ok(90_000));
    assert_eq!(parse_duration_ms("30m"), Ok(1_800_000));
    assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
    assert_eq!(parse_duration_ms("2d"), Ok(172_800_000));
    assert_eq!(parse_duration_ms("500ms"), Ok(500));
    assert_eq!(parse_duration_ms("45"), Ok(45_000));
    assert!(parse_duration_ms("1w").is_err());
    assert!(parse_duration_ms("0s").is_err());
    assert!(parse_duration_ms("h").is_err());
}

#[test]
fn invite_takes_options_or_a_subcommand_but_not_both() {
    let cli = Cli::try_parse_from(["mesh", "invite", "--uses", "3", "--ttl", "30m"]).unwrap();
    assert!(matches!(
        cli.command,
        Command::Invite {
            cmd: None,
            uses: 3,
            ttl: 1_800_000,
            json: false
        }
    ));
    let cli = Cli::try_parse_from(["mesh", "invite", "revoke", "0102030405060708"]).unwrap();
    assert!(matches!(
        cli.command,
        Command::Invite {
            cmd: Some(InviteCommand::Revoke { .. }),
            ..
        }
    ));
    assert!(Cli::try_parse_from(["mesh", "invite", "--uses", "2", "list"]).is_err());
    assert!(Cli::try_parse_from(["mesh", "invite", "--uses", "0"]).is_err());
}

#[test]
fn daemon_takes_data_and_bind() {
    let cli = Cli::try_parse_from([
        "mesh",
        "daemon",
        "--data",
        "/tmp/x",
        "--bind",
        "127.0.0.1:7000",
    ])
    .unwrap();
    assert_eq!(cli.data.as_deref(), Some(std::path::Path::new("/tmp/x")));
    assert!(matches!(cli.command, Command::Daemon { bind: Some(bind), .. } if bind.port() == 7000));
    let cli = Cli::try_parse_from(["mesh", "--agent", "alice", "send", "bob@gpu", "hi"]).unwrap();
    assert_eq!(cli.agent.as_deref(), Some("alice"));
    assert!(Cli::try_parse_from(["mesh", "daemon", "--bind", "not-an-addr"]).is_err());
}

#[test]
fn an_invites_expiry_reads_as_a_span_from_now() {
    use crate::commands::expiry_text;
    let now = 1_796_518_703_512;
    let min = 60_000;
    assert_eq!(expiry_text(now + 30_000, now), "expires in 30s");
    assert_eq!(expiry_text(now + 5 * min, now), "expires in 5m");
    assert_eq!(expiry_text(now + 125 * min, now), "expires in 2h 5m");
    assert_eq!(
        expiry_text(now + (49 * 60 + 1) * min, now),
        "expires in 2d 1h"
    );
    assert_eq!(expiry_text(now - 5 * min, now), "expired 5m ago");
    assert_eq!(expiry_text(now, now), "expired 0s ago");
}

#[test]
fn a_hook_reads_unread_only_and_its_failure_never_exits_2() {
    let cli = Cli::try_parse_from([
        "mesh", "--agent", "a", "inbox", "--unread", "--hook", "claude", "--event", "stop",
    ])
    .unwrap();
    assert!(matches!(
        cli.command,
        Command::Inbox {
            hook: Some(_),
            event: Some(_),
            ..
        }
    ));
    let gemini = Cli::try_parse_from([
        "mesh",
        "--agent",
        "a",
        "inbox",
        "--unread",
        "--hook",
        "gemini",
        "--event",
        "after-agent",
    ]);
    assert!(gemini.is_ok(), "{gemini:?}");
    for bad in [
        &["mesh", "inbox", "--hook", "claude"][..],
        &["mesh", "inbox", "--unread", "--event", "stop"],
        &["mesh", "inbox", "--unread", "--hook", "codex"],
        &["mesh", "inbox", "--unread", "--hook", "claude", "--json"],
        &[
            "mesh", "inbox", "--unread", "--hook", "claude", "--event", "later",
        ],
    ] {
        assert!(Cli::try_parse_from(bad).is_err(), "{bad:?} parsed");
    }
    let e = hook::failed(anyhow::anyhow!("no daemon"));
    assert_eq!(exit_code(&e), EXIT_OTHER);
}
