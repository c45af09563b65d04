//! The optional `<data>/config.toml`: every key has a built-in default, an
//! unknown key or a bad value is an error that names the key.
//!
//! `config/meshd.toml` in the repository lists every key with its default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mesh_protocol::NodeName;
use mesh_store::{OnFull, OutboxBounds};
use serde::{Deserialize, Deserializer};

use crate::bus::{MdnsMode, RELAYS_MAX, RelayUrl};

/// The largest config file read, in bytes; a config is a few hundred bytes.
pub const CONFIG_FILE_BYTES_MAX: u64 = 64 * 1024;

/// The default per-subscription buffer, in journal entries.
pub const SUBSCRIBER_BUFFER_DEFAULT: usize = 1024;

/// The largest per-subscription buffer accepted, in journal entries.
pub const SUBSCRIBER_BUFFER_MAX: usize = 1 << 20;

/// The default time a live subscriber may take nothing from a full buffer, in ms.
pub const SUBSCRIBER_STALL_MS_DEFAULT: u64 = 5_000;

/// The accepted range of `api.subscriber_stall_ms`.
pub const SUBSCRIBER_STALL_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=3_600_000;

/// The accepted range of `api.request_head_timeout_ms` and
/// `api.idle_timeout_ms`.
pub const CONNECTION_TIMEOUT_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=86_400_000;

/// The default bytes buffered per live subscription (its entries as sent).
pub const SUBSCRIBER_BUFFER_BYTES_DEFAULT: u64 = 16 << 20;

/// The accepted range of `api.subscriber_buffer_bytes`.
pub const SUBSCRIBER_BUFFER_BYTES_RANGE: std::ops::RangeInclusive<u64> = (64 << 10)..=(1 << 30);

/// The accepted range of `store.hold_ms`.
pub const HOLD_MS_RANGE: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// The smallest `journal.max_bytes` accepted: a few rows.
pub const JOURNAL_BYTES_MIN: u64 = 1 << 20;

/// The shortest `journal.max_age` accepted (other than `"0"`, no bound), in ms.
pub const JOURNAL_AGE_MS_MIN: u64 = 60_000;

/// The daemon's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Config {
    /// Address to listen on for peers (`--bind` overrides it). With port 0
    /// the port picked on the first start is asked for again on later ones.
    pub bind: SocketAddr,
    /// This node.
    pub node: NodeSection,
    /// Retention of each outgoing stream.
    pub outbox: OutboxConfig,
    /// The local API.
    pub api: ApiConfig,
    /// Networking between daemons.
    pub net: NetConfig,
    /// The agents' sockets.
    pub agents: AgentsConfig,
    /// The store: how long a send is held while it cannot commit.
    pub store: StoreConfig,
    /// Retention of the journal.
    pub journal: JournalConfig,
    /// Finding peers on the LAN.
    pub discovery: DiscoveryConfig,
    /// Topics joined at start, and the default bounds of a topic.
    pub topics: TopicsConfig,
    /// How the daemon logs.
    pub log: LogConfig,
    /// The dashboard (`mesh web`).
    pub web: WebConfig,
}

/// `[web]`: the read-only dashboard, served on a TCP port only when asked
/// (`mesh web`), or from the start when `listen` is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct WebConfig {
    /// Where to serve it from the start (kept on); unset: only once `mesh
    /// web` asks, on `127.0.0.1` and a port the system picks.
    pub listen: Option<SocketAddr>,
    /// Whether `listen` may be an address other hosts reach (every request
    /// still needs the per-start token); without it only loopback is taken.
    pub allow_remote: bool,
}

/// `[log]`: how `mesh daemon` writes its log to stderr (`RUST_LOG` picks
/// what is logged, default `info`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct LogConfig {
    /// The line format; `mesh daemon --log-format` overrides it.
    pub format: LogFormat,
}

/// The format of the daemon's log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum LogFormat {
    /// A timestamp, the level, the target and the message; coloured only
    /// when stderr is a terminal and `NO_COLOR` is unset or empty.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`),
    /// for log shippers; never coloured.
    Json,
    /// For systemd's journal: each line starts with its syslog priority
    /// (`<3>` error to `<7>` trace, which journald stores as the entry's
    /// priority) and carries no timestamp (journald stamps each line);
    /// never coloured.
    Journald,
}

impl LogFormat {
    /// The names `--log-format` and `[log] format` take.
    pub const NAMES: [&'static str; 3] = ["text", "json", "journald"];
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            "journald" => Ok(LogFormat::Journald),
            other => Err(format!(
                "unknown log format {other:?} (one of: {})",
                LogFormat::NAMES.join(", ")
            )),
        }
    }
}

/// `[topics]`: topics this node joins when it starts (it stays a member of
/// any it joined since), and what a topic holds of each author by default.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct TopicsConfig {
    /// Topics to be a member of (joined at start if not yet), at most 256.
    pub join: Vec<String>,
    /// The most messages held of each author's stream of a topic, to relay
    /// (at least 1); a `mesh topic join --max-msgs` overrides it.
    pub max_msgs: u64,
    /// The most payload bytes held of each author's stream (at least 1).
    pub max_bytes: u64,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            join: Vec::new(),
            max_msgs: TOPIC_MAX_MSGS_DEFAULT,
            max_bytes: TOPIC_MAX_BYTES_DEFAULT,
        }
    }
}

/// The default of `topics.max_msgs`.
pub const TOPIC_MAX_MSGS_DEFAULT: u64 = 100_000;

/// The default of `topics.max_bytes` (64 MiB).
pub const TOPIC_MAX_BYTES_DEFAULT: u64 = 64 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: SocketAddr::from(([0, 0, 0, 0], 0)),
            node: NodeSection::default(),
            outbox: OutboxConfig::default(),
            api: ApiConfig::default(),
            net: NetConfig::default(),
            agents: AgentsConfig::default(),
            store: StoreConfig::default(),
            journal: JournalConfig::default(),
            discovery: DiscoveryConfig::default(),
            topics: TopicsConfig::default(),
            log: LogConfig::default(),
            web: WebConfig::default(),
        }
    }
}

/// `[store]`: what happens to a local send while the store cannot commit it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct StoreConfig {
    /// How long a send is held, unanswered and retried, while the store
    /// cannot commit it, in ms ([`HOLD_MS_RANGE`]); then it is answered 503
    /// and journaled as lost once the store is back.
    pub hold_ms: u64,
    /// The most sends held at once (1 to the bus's waiting bound); a send
    /// past it is answered 503 at once.
    pub hold_max_msgs: usize,
    /// The most payload bytes held at once (1 to the bus's waiting bound).
    pub hold_max_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            hold_ms: crate::bus::HOLD_MS,
            hold_max_msgs: crate::bus::HOLD_MSGS_MAX,
            hold_max_bytes: crate::bus::HOLD_BYTES_MAX,
        }
    }
}

impl Config {
    /// The node's name: `[node] name`, else this host's name (made valid).
    pub fn node_name(&self) -> NodeName {
        match &self.node.name {
            // Checked when the config was read.
            Some(name) => NodeName::new(name).unwrap_or_else(|_| NodeName::from_hostname(name)),
            None => NodeName::from_hostname(&hostname()),
        }
    }

    /// The relays of `[net] relays`, parsed (checked when the config was read).
    pub fn relays(&self) -> Vec<RelayUrl> {
        self.net
            .relays
            .iter()
            .filter_map(|u| u.parse().ok())
            .collect()
    }
}

/// This host's name, or empty if it cannot be read.
fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// `[node]`: this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct NodeSection {
    /// Its name for people, in its card and `mesh status`: 1 to 63 bytes of
    /// `[a-z0-9._-]`, starting with a letter or digit. Default: the host's
    /// name, lowercased, with other characters replaced by `-`.
    pub name: Option<String>,
}

/// `[discovery]`: finding peers on the LAN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct DiscoveryConfig {
    /// mDNS on the interfaces the node listens on (none when bound to loopback).
    pub mdns: MdnsConfig,
}

impl MdnsConfig {
    /// What the transport does.
    pub fn mode(self) -> MdnsMode {
        match self {
            MdnsConfig::On => MdnsMode::On,
            MdnsConfig::Resolve => MdnsMode::Resolve,
            MdnsConfig::Off => MdnsMode::Off,
        }
    }
}

/// `[journal]`: how much of the journal is kept; the oldest entries go
/// first, and their payloads with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct JournalConfig {
    /// The most bytes the journal's rows may take (at least [`JOURNAL_BYTES_MIN`]).
    pub max_bytes: u64,
    /// The oldest an entry may get, written as `"30d"`, `"12h"`, `"90m"`,
    /// `"600s"`, or `"0"` for no age bound; in ms here.
    #[serde(deserialize_with = "age_ms")]
    pub max_age: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            max_bytes: crate::bus::JOURNAL_BYTES_MAX,
            max_age: crate::bus::JOURNAL_AGE_MS_MAX,
        }
    }
}

/// Reads an age like `"30d"` (units `s`, `m`, `h`, `d`; `"0"`: none) as ms.
fn age_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let text = String::deserialize(d)?;
    parse_age_ms(&text).map_err(serde::de::Error::custom)
}

/// Parses an age like `"30d"` as ms; `"0"` is 0 (no bound).
pub fn parse_age_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(0);
    }
    let bad = || {
        format!(
            "{text:?} is not an age: write a number and a unit s, m, h or d (\"30d\"), or \"0\" for none"
        )
    };
    let (n, unit) = t.split_at(t.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| bad())?;
    let ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms).ok_or_else(bad)
}

/// `discovery.mdns`, spelled as in the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MdnsConfig {
    /// `"on"`: announce this node and find others (the default).
    #[default]
    On,
    /// `"resolve"`: find others, announce nothing.
    Resolve,
    /// `"off"`: no mDNS at all.
    Off,
}

/// `[agents]`: where the agents' sockets are, and how long a moved agent's
/// previous inbox is read.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct AgentsConfig {
    /// The dir of the agents' sockets (default: `<data>/agents`). The data
    /// dir is mode 0700, so an agent of another uid than the daemon's can
    /// reach its socket only in a dir outside it that its uid may enter
    /// (e.g. `/run/agent-mesh`); the daemon creates a missing dir with mode
    /// 0711.
    pub socket_dir: Option<PathBuf>,
    /// For how many days after an agent moved away what still comes for it
    /// here is passed on to its new host [default: 30, at most 3650]. Then
    /// the drain ends (journaled) and the agent is removed here: what comes
    /// for it later is bounced to its sender. 0 ends it once what is held
    /// has been passed on.
    pub drain_days: u64,
    /// Whether this node sends read receipts [default: true]: when one of
    /// its agents acks past a message whose sender asked for one
    /// (`--receipt`), its signed receipt goes back to the sender's node.
    /// `false` sends none; what was acked meanwhile is receipted once it
    /// is turned on again (the pump's cursor stays where it was).
    pub read_receipts: bool,
}

impl Default for AgentsConfig {
    fn default() -> Self {
        AgentsConfig {
            socket_dir: None,
            drain_days: DRAIN_DAYS_DEFAULT,
            read_receipts: true,
        }
    }
}

/// The default of `agents.drain_days`.
pub const DRAIN_DAYS_DEFAULT: u64 = 30;
/// The most `agents.drain_days` may be.
pub const DRAIN_DAYS_MAX: u64 = 3650;

/// The default of `api.dedup_window`.
pub const DEDUP_WINDOW_DEFAULT: &str = "24h";

/// The accepted range of `api.dedup_window`, in milliseconds (1 s to 30 days).
pub const DEDUP_WINDOW_MS_RANGE: std::ops::RangeInclusive<u64> = 1_000..=30 * 24 * 3_600_000;

/// Parses a duration written as a number and a unit (`ms`, `s`, `m`, `h`,
/// `d`), in milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = t.split_at(split);
    let n: u64 = n.parse().ok()?;
    let per = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(per)
}

/// `[outbox]`: the bounds of each outgoing stream and what happens when one is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct OutboxConfig {
    /// The most envelopes kept per stream (at least 1).
    pub max_msgs: u64,
    /// The most payload bytes kept per stream (at least 1).
    pub max_bytes: u64,
    /// What to do when only unacknowledged envelopes remain and a send does not fit.
    pub on_full: OnFullConfig,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        let b = OutboxBounds::default();
        OutboxConfig {
            max_msgs: b.max_msgs,
            max_bytes: b.max_bytes,
            on_full: match b.on_full {
                OnFull::EvictOldest => OnFullConfig::EvictOldest,
                OnFull::Reject => OnFullConfig::Reject,
            },
        }
    }
}

impl OutboxConfig {
    /// The store's bounds for one stream.
    pub fn bounds(&self) -> OutboxBounds {
        OutboxBounds {
            max_msgs: self.max_msgs,
            max_bytes: self.max_bytes,
            on_full: match self.on_full {
                OnFullConfig::Reject => OnFull::Reject,
                OnFullConfig::EvictOldest => OnFull::EvictOldest,
            },
        }
    }
}

/// `outbox.on_full`, spelled as in the file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFullConfig {
    /// `"reject"`: the sender gets "peer outbox full" and nothing is written.
    #[default]
    Reject,
    /// `"evict-oldest"`: the oldest unacknowledged envelopes go, with a durable loss record
    /// (except while the stream carries an unacknowledged forward of a moved
    /// agent's message: then as `reject`).
    EvictOldest,
}

/// `[api]`: the local socket API.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ApiConfig {
    /// Journal entries buffered per live subscription
    /// (1 to [`SUBSCRIBER_BUFFER_MAX`]).
    pub subscriber_buffer: usize,
    /// How long a live subscriber may take nothing from its full buffer
    /// before it counts as lagged, in milliseconds
    /// ([`SUBSCRIBER_STALL_MS_RANGE`]).
    pub subscriber_stall_ms: u64,
    /// How long a send with a client id is remembered (a retry of it within
    /// this gets the first answer), as a number and a unit: `"24h"`,
    /// `"90m"` ([`DEDUP_WINDOW_MS_RANGE`]).
    pub dedup_window: String,
    /// Bytes buffered per live subscription, its entries as sent
    /// ([`SUBSCRIBER_BUFFER_BYTES_RANGE`]); the buffer is full at
    /// `subscriber_buffer` entries or at these bytes, whichever comes first.
    pub subscriber_buffer_bytes: u64,
    /// How long a new connection to a socket may take to send its first
    /// request head before it is closed, in milliseconds
    /// ([`CONNECTION_TIMEOUT_MS_RANGE`]).
    pub request_head_timeout_ms: u64,
    /// How long a connection may sit with no request in flight before it is
    /// closed, in milliseconds ([`CONNECTION_TIMEOUT_MS_RANGE`]); a live
    /// subscription or a waiting inbox read is a request in flight.
    pub idle_timeout_ms: u64,
}

impl ApiConfig {
    /// `dedup_window` in milliseconds (checked when the config is read).
    pub fn dedup_window_ms(&self) -> u64 {
        parse_duration_ms(&self.dedup_window).unwrap_or(86_400_000)
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            subscriber_buffer: SUBSCRIBER_BUFFER_DEFAULT,
            subscriber_stall_ms: SUBSCRIBER_STALL_MS_DEFAULT,
            dedup_window: DEDUP_WINDOW_DEFAULT.to_owned(),
            subscriber_buffer_bytes: SUBSCRIBER_BUFFER_BYTES_DEFAULT,
            request_head_timeout_ms: crate::api::REQUEST_HEAD_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: crate::api::IDLE_TIMEOUT_MS_DEFAULT,
        }
    }
}

/// `[net]`: networking between daemons.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct NetConfig {
    /// Relay servers (URLs of self-hosted `iroh-relay`s, at most
    /// [`RELAYS_MAX`]) for peers with no direct route. Empty: relays off.
    pub relays: Vec<String>,
}

/// Why the config file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file exists but could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is larger than [`CONFIG_FILE_BYTES_MAX`].
    #[error("config {path} is {bytes} bytes, more than the {CONFIG_FILE_BYTES_MAX} allowed")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// Not TOML, an unknown key, or a value of the wrong type; the message names the key.
    #[error("bad config {path}: {message}")]
    Parse {
        /// The file (or `<text>`).
        path: PathBuf,
        /// The parser's message, naming the key and its line.
        message: String,
    },
    /// A value of the right type but out of range.
    #[error("bad config {path}: `{key}` {why}")]
    Value {
        /// The file (or `<text>`).
        path: PathBuf,
        /// The dotted key.
        key: &'static str,
        /// What is wrong with its value.
        why: String,
    },
}

impl Config {
    /// Reads `path`; a missing file gives the defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let read = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(e) => return Err(read(e)),
        };
        if meta.len() > CONFIG_FILE_BYTES_MAX {
            return Err(ConfigError::TooLarge {
                path: path.to_owned(),
                bytes: meta.len(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        Config::parse(&text, path)
    }

    /// Parses config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.check(origin)?;
        Ok(config)
    }

    // Long because it is one bound check per config key, in the order the
    // first bad key is reported; splitting it would only hide that list.
    fn check(&self, origin: &Path) -> Result<(), ConfigError> {
        let bad = |key, why: String| ConfigError::Value {
            path: origin.to_owned(),
            key,
            why,
        };
        if let Some(name) = &self.node.name
            && let Err(e) = NodeName::new(name)
        {
            return Err(bad("node.name", e.why.to_owned()));
        }
        if self.net.relays.len() > RELAYS_MAX {
            return Err(bad(
                "net.relays",
                format!(
                    "lists {} relays, at most {RELAYS_MAX}",
                    self.net.relays.len()
                ),
            ));
        }
        for url in &self.net.relays {
            if let Err(e) = url.parse::<RelayUrl>() {
                return Err(bad("net.relays", format!("{url:?} is not a URL: {e}")));
            }
        }
        if let Some(addr) = self.web.listen
            && !addr.ip().is_loopback()
            && !self.web.allow_remote
        {
            return Err(bad(
                "web.listen",
                format!(
                    "{addr} is not a loopback address: the dashboard would be reachable from \
                     other hosts; set web.allow_remote = true if that is meant (every request \
                     still needs the token)"
                ),
            ));
        }
        if self.outbox.max_msgs == 0 {
            return Err(bad("outbox.max_msgs", "must be at least 1".into()));
        }
        if self.agents.drain_days > DRAIN_DAYS_MAX {
            return Err(bad(
                "agents.drain_days",
                format!("must be at most {DRAIN_DAYS_MAX}"),
            ));
        }
        if self.outbox.max_bytes == 0 {
            return Err(bad("outbox.max_bytes", "must be at least 1".into()));
        }
        if !(1..=SUBSCRIBER_BUFFER_MAX).contains(&self.api.subscriber_buffer) {
            return Err(bad(
                "api.subscriber_buffer",
                format!("must be between 1 and {SUBSCRIBER_BUFFER_MAX}"),
            ));
        }
        match parse_duration_ms(&self.api.dedup_window) {
            Some(ms) if DEDUP_WINDOW_MS_RANGE.contains(&ms) => {}
            _ => {
                return Err(bad(
                    "api.dedup_window",
                    "must be a number and a unit (ms, s, m, h, d) from 1s to 30d, e.g. \"24h\""
                        .into(),
                ));
            }
        }
        if !SUBSCRIBER_BUFFER_BYTES_RANGE.contains(&self.api.subscriber_buffer_bytes) {
            return Err(bad(
                "api.subscriber_buffer_bytes",
                format!(
                    "must be between {} and {}",
                    SUBSCRIBER_BUFFER_BYTES_RANGE.start(),
                    SUBSCRIBER_BUFFER_BYTES_RANGE.end()
                ),
            ));
        }
        if !HOLD_MS_RANGE.contains(&self.store.hold_ms) {
            return Err(bad(
                "store.hold_ms",
                format!(
                    "must be between {} and {} (milliseconds)",
                    HOLD_MS_RANGE.start(),
                    HOLD_MS_RANGE.end()
                ),
            ));
        }
        let msgs_max = crate::bus::WAITING_SENDS_MAX;
        if !(1..=msgs_max).contains(&self.store.hold_max_msgs) {
            return Err(bad(
                "store.hold_max_msgs",
                format!("must be between 1 and {msgs_max}"),
            ));
        }
        let bytes_max = crate::bus::WAITING_SEND_BYTES_MAX;
        if !(1..=bytes_max).contains(&self.store.hold_max_bytes) {
            return Err(bad(
                "store.hold_max_bytes",
                format!("must be between 1 and {bytes_max}"),
            ));
        }
        if self.journal.max_bytes < JOURNAL_BYTES_MIN {
            return Err(bad(
                "journal.max_bytes",
                format!("must be at least {JOURNAL_BYTES_MIN}"),
            ));
        }
        if self.journal.max_age != 0 && self.journal.max_age < JOURNAL_AGE_MS_MIN {
            return Err(bad(
                "journal.max_age",
                "must be \"0\" (no bound) or at least a minute".into(),
            ));
        }
        if self.topics.join.len() > mesh_store::TOPICS_MAX {
            return Err(bad(
                "topics.join",
                format!(
                    "lists {} topics, at most {}",
                    self.topics.join.len(),
                    mesh_store::TOPICS_MAX
                ),
            ));
        }
        for name in &self.topics.join {
            if let Err(e) = mesh_protocol::TopicName::new(name) {
                return Err(bad("topics.join", e.to_string()));
            }
        }
        if self.topics.max_msgs == 0 {
            return Err(bad("topics.max_msgs", "must be at least 1".into()));
        }
        if self.topics.max_bytes == 0 {
            return Err(bad("topics.max_bytes", "must be at least 1".into()));
        }
        for (key, ms) in [
            (
                "api.request_head_timeout_ms",
                self.api.request_head_timeout_ms,
            ),
            ("api.idle_timeout_ms", self.api.idle_timeout_ms),
        ] {
            if !CONNECTION_TIMEOUT_MS_RANGE.contains(&ms) {
                return Err(bad(
                    key,
                    format!(
                        "must be between {} and {} (milliseconds)",
                        CONNECTION_TIMEOUT_MS_RANGE.start(),
                        CONNECTION_TIMEOUT_MS_RANGE.end()
                    ),
                ));
            }
        }
        if !SUBSCRIBER_STALL_MS_RANGE.contains(&self.api.subscriber_stall_ms) {
            return Err(bad(
                "api.subscriber_stall_ms",
                format!(
                    "must be between {} and {} (milliseconds)",
                    SUBSCRIBER_STALL_MS_RANGE.start(),
                    SUBSCRIBER_STALL_MS_RANGE.end()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests;
