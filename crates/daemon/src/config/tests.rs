//! Unit tests of reading and checking the config file.

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("config.toml"))
}

/// The example file with every commented-out key line switched on,
/// but for keys whose default is computed (shown as `"<...>"`).
fn example_uncommented() -> String {
    let text = include_str!("../../../../config/meshd.toml");
    text.lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| l.starts_with('[') || l.contains(" = "))
        .filter(|l| !l.contains("= \"<"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_example_file_lists_every_key_with_its_default() {
    let full = include_str!("../../../../config/meshd.toml");
    assert!(
        full.contains("# name = \"<hostname>\""),
        "[node] name is listed"
    );
    let text = example_uncommented();
    for key in [
        "bind",
        "[node]",
        "[outbox]",
        "max_msgs",
        "max_bytes",
        "on_full",
        "[api]",
        "subscriber_buffer",
        "subscriber_stall_ms",
        "dedup_window",
        "subscriber_buffer_bytes",
        "[net]",
        "relays",
        "[agents]",
        "[store]",
        "hold_ms",
        "hold_max_msgs",
        "hold_max_bytes",
        "[journal]",
        "max_age",
        "[discovery]",
        "mdns",
        "[topics]",
        "join",
        "[log]",
        "format",
        "[web]",
        "allow_remote",
    ] {
        assert!(text.contains(key), "{key} missing from config/meshd.toml");
    }
    assert_eq!(parse(&text).unwrap(), Config::default());
}

#[test]
fn the_default_name_is_the_host_name_made_valid() {
    let name = Config::default().node_name();
    assert_eq!(name, NodeName::from_hostname(&hostname()));
}

#[test]
fn an_empty_or_missing_file_gives_the_defaults() {
    assert_eq!(parse("").unwrap(), Config::default());
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(
        Config::load(&tmp.path().join("config.toml")).unwrap(),
        Config::default()
    );
}

#[test]
fn values_map_to_store_bounds() {
    let c = parse(
        "bind = \"127.0.0.1:7000\"\n[node]\nname = \"lab-1\"\n[outbox]\nmax_msgs = 5\nmax_bytes = 10\non_full = \"evict-oldest\"\n[api]\nsubscriber_buffer = 8\n[net]\nrelays = [\"http://127.0.0.1:3340\"]\n[discovery]\nmdns = \"resolve\"\n",
    )
    .unwrap();
    assert_eq!(c.bind.port(), 7000);
    assert_eq!(
        c.outbox.bounds(),
        OutboxBounds {
            max_msgs: 5,
            max_bytes: 10,
            on_full: OnFull::EvictOldest
        }
    );
    assert_eq!(c.api.subscriber_buffer, 8);
    assert_eq!(c.relays().len(), 1);
    assert_eq!(c.node_name().as_str(), "lab-1");
    assert_eq!(c.discovery.mdns, MdnsConfig::Resolve);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let e = parse("[outbox]\nmax_msg = 5\n").unwrap_err().to_string();
    assert!(e.contains("max_msg"), "{e}");
    let e = parse("colour = \"red\"\n").unwrap_err().to_string();
    assert!(e.contains("colour"), "{e}");
    let e = parse("[nett]\n").unwrap_err().to_string();
    assert!(e.contains("nett"), "{e}");
}

#[test]
fn a_bad_value_is_refused_naming_its_key() {
    let e = parse("[outbox]\non_full = \"drop\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("on_full") && e.contains("drop"), "{e}");
    let e = parse("bind = \"nowhere\"\n").unwrap_err().to_string();
    assert!(e.contains("bind"), "{e}");
    let e = parse("[outbox]\nmax_bytes = -1\n").unwrap_err().to_string();
    assert!(e.contains("max_bytes"), "{e}");
    let e = parse("[outbox]\nmax_msgs = 0\n").unwrap_err().to_string();
    assert!(e.contains("outbox.max_msgs"), "{e}");
    let e = parse("[api]\nsubscriber_buffer = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("api.subscriber_buffer"), "{e}");
    let e = parse("[api]\nsubscriber_stall_ms = 5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("api.subscriber_stall_ms"), "{e}");
    let e = parse("[node]\nname = \"Bad Name\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("node.name"), "{e}");
    let e = parse("[net]\nrelays = [\"not a url\"]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("net.relays"), "{e}");
    let e = parse("[discovery]\nmdns = \"loud\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("mdns") && e.contains("loud"), "{e}");
}

#[test]
fn store_and_journal_keys_are_read_and_checked() {
    let c = parse(
        "[store]\nhold_ms = 5000\nhold_max_msgs = 10\nhold_max_bytes = 4096\n[journal]\nmax_bytes = 67108864\nmax_age = \"12h\"\n[api]\nsubscriber_buffer_bytes = 1048576\n",
    )
    .unwrap();
    assert_eq!(
        (
            c.store.hold_ms,
            c.store.hold_max_msgs,
            c.store.hold_max_bytes
        ),
        (5000, 10, 4096)
    );
    assert_eq!(
        (c.journal.max_bytes, c.journal.max_age),
        (64 << 20, 12 * 3_600_000)
    );
    assert_eq!(c.api.subscriber_buffer_bytes, 1 << 20);
    assert_eq!(
        parse("[journal]\nmax_age = \"0\"\n")
            .unwrap()
            .journal
            .max_age,
        0
    );
    for (text, key) in [
        ("[store]\nhold_ms = 5\n", "store.hold_ms"),
        ("[store]\nhold_max_msgs = 0\n", "store.hold_max_msgs"),
        ("[store]\nhold_max_bytes = 0\n", "store.hold_max_bytes"),
        ("[journal]\nmax_bytes = 10\n", "journal.max_bytes"),
        ("[journal]\nmax_age = \"30s\"\n", "journal.max_age"),
        ("[journal]\nmax_age = \"a week\"\n", "max_age"),
        (
            "[api]\nsubscriber_buffer_bytes = 10\n",
            "api.subscriber_buffer_bytes",
        ),
        ("[web]\nlisten = \"0.0.0.0:8717\"\n", "web.allow_remote"),
        ("[log]\nformat = \"xml\"\n", "journald"),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}

#[test]
fn an_oversized_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("config.toml");
    std::fs::write(&path, "#".repeat(CONFIG_FILE_BYTES_MAX as usize + 1)).unwrap();
    assert!(matches!(
        Config::load(&path),
        Err(ConfigError::TooLarge { .. })
    ));
}

#[test]
fn topics_to_join_and_their_bounds_are_read_and_checked() {
    let c = parse(
        "[topics]\njoin = [\"builds\", \"agents/planner\"]\nmax_msgs = 10\nmax_bytes = 2048\n",
    )
    .unwrap();
    assert_eq!(c.topics.join, ["builds", "agents/planner"]);
    assert_eq!((c.topics.max_msgs, c.topics.max_bytes), (10, 2048));
    for (text, key) in [
        ("[topics]\njoin = [\"Not Valid\"]\n", "topics.join"),
        ("[topics]\nmax_msgs = 0\n", "topics.max_msgs"),
        ("[topics]\nmax_bytes = 0\n", "topics.max_bytes"),
    ] {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    let many: Vec<String> = (0..257).map(|i| format!("\"t{i}\"")).collect();
    let err = parse(&format!("[topics]\njoin = [{}]\n", many.join(",")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("at most 256"), "{err}");
}

#[test]
fn the_dashboard_takes_a_remote_address_only_when_told_to() {
    let c = parse("[web]\nlisten = \"127.0.0.1:8717\"\n").unwrap();
    assert_eq!(c.web.listen, Some("127.0.0.1:8717".parse().unwrap()));
    assert!(parse("[web]\nlisten = \"[::1]:8717\"\n").is_ok());
    assert!(parse("[web]\nlisten = \"192.168.1.5:8717\"\n").is_err());
    let c = parse("[web]\nlisten = \"192.168.1.5:8717\"\nallow_remote = true\n").unwrap();
    assert!(c.web.allow_remote);
    assert_eq!(parse("").unwrap().web.listen, None);
}
