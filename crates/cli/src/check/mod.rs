//! `mesh check`: one node's health for a monitoring system, with the
//! Nagios plugin convention (exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN;
//! one line of text with perfdata after `|`), `--json`, or Prometheus text.
//!
//! What is read (the status, the local agents' oldest unread entry, the
//! last arrivals of the journal) is gathered into a [`Reading`]; the
//! thresholds are applied to it by [`evaluate`], a pure function, so each
//! bound is tested without a daemon.

use std::fmt::Write as _;

use mesh_api::client::{Client, ClientError};
use mesh_api::{AgentsResponse, EventRecord, EventsPage, InboxPage, NodeStatus, path_segment};
use serde::Serialize;

/// The most journal arrivals `--recent` may look back over.
pub const RECENT_MAX: u64 = 100_000;

/// The most local agents whose unread mail is read (one request each).
const AGENTS_READ_MAX: usize = 256;

/// Journal entries asked for per page while counting losses.
const EVENTS_PAGE: u64 = 1000;

/// The thresholds and output of `mesh check`.
#[derive(Clone, Debug, clap::Args)]
pub struct CheckArgs {
    /// CRITICAL when fewer peers than this are connected (a paused link
    /// counts as not connected).
    #[arg(long, value_name = "N")]
    pub peers_min: Option<usize>,
    /// WARNING when a peer has this many messages or more queued.
    #[arg(long, value_name = "N")]
    pub queue_warn: Option<u64>,
    /// CRITICAL when a peer has this many messages or more queued.
    #[arg(long, value_name = "N")]
    pub queue_crit: Option<u64>,
    /// WARNING when the oldest message queued for a peer is this old
    /// (`90s`, `30m`, `1h`, `2d`).
    #[arg(long, value_name = "AGE", value_parser = crate::parse_duration_ms)]
    pub queue_age_warn: Option<u64>,
    /// CRITICAL when the oldest message queued for a peer is this old.
    #[arg(long, value_name = "AGE", value_parser = crate::parse_duration_ms)]
    pub queue_age_crit: Option<u64>,
    /// WARNING when a local agent's oldest unread message is this old.
    #[arg(long, value_name = "AGE", value_parser = crate::parse_duration_ms)]
    pub unread_age_warn: Option<u64>,
    /// CRITICAL when a local agent's oldest unread message is this old.
    #[arg(long, value_name = "AGE", value_parser = crate::parse_duration_ms)]
    pub unread_age_crit: Option<u64>,
    /// WARNING when the journal holds this percent of `[journal] max_bytes`
    /// (past it, retention trims the oldest entries).
    #[arg(long, value_name = "PERCENT", default_value_t = 80.0, value_parser = percent)]
    pub journal_warn: f64,
    /// CRITICAL when the journal holds this percent of its bound.
    #[arg(long, value_name = "PERCENT", default_value_t = 95.0, value_parser = percent)]
    pub journal_crit: f64,
    /// WARNING when the recent journal holds this many gap or loss records
    /// (`gap`, `loss`, `lost`, `rolled_back`); 0 turns it off.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub losses_warn: u64,
    /// CRITICAL when the recent journal holds this many of them.
    #[arg(long, value_name = "N")]
    pub losses_crit: Option<u64>,
    /// How many of the journal's last arrivals count as recent (at most 100000).
    #[arg(long, value_name = "ARRIVALS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=RECENT_MAX))]
    pub recent: u64,
    /// Print JSON instead of one line (the same as `--format json`).
    #[arg(long)]
    pub json: bool,
    /// `text` (one line, Nagios perfdata after `|`), `json` or `prometheus`
    /// (text exposition format, for a textfile collector).
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json", "prometheus"])]
    pub format: Option<String>,
}

/// A percent above 0 and at most 100 (`80`, `0.5`).
fn percent(text: &str) -> Result<f64, String> {
    match text.trim().trim_end_matches('%').parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 100.0 => Ok(p),
        _ => Err(format!("{text:?} is not a percent above 0 and at most 100")),
    }
}

/// A check's outcome, ordered by severity (UNKNOWN counts as worse than
/// WARNING and better than CRITICAL when they are combined, as Nagios does
/// for its exit code only: [`State::worst`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum State {
    /// Within every bound.
    Ok,
    /// Past a warning bound.
    Warning,
    /// Past a critical bound, or the daemon does not answer.
    Critical,
    /// It could not be told.
    Unknown,
}

impl State {
    /// The plugin exit code: 0, 1, 2, 3.
    pub fn code(self) -> u8 {
        match self {
            State::Ok => 0,
            State::Warning => 1,
            State::Critical => 2,
            State::Unknown => 3,
        }
    }

    fn rank(self) -> u8 {
        match self {
            State::Ok => 0,
            State::Warning => 1,
            State::Unknown => 2,
            State::Critical => 3,
        }
    }

    /// The more severe of two: CRITICAL over UNKNOWN over WARNING over OK.
    pub fn worst(self, other: State) -> State {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }

    fn word(self) -> &'static str {
        match self {
            State::Ok => "OK",
            State::Warning => "WARNING",
            State::Critical => "CRITICAL",
            State::Unknown => "UNKNOWN",
        }
    }
}

/// What was read of the node for one check run.
#[derive(Clone, Debug)]
pub struct Reading {
    /// `GET /v1/status`.
    pub status: NodeStatus,
    /// Per local agent, when its oldest unread message was written (ms
    /// since the Unix epoch, its author's clock); `None`: nothing unread.
    /// `Err`: it could not be read.
    pub unread: Result<Vec<(String, Option<u64>)>, String>,
    /// Gap and loss records among the last `recent` arrivals, and how many
    /// arrivals were looked at; `Err`: the journal could not be read.
    pub losses: Result<(u64, u64), String>,
}

/// One check's finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// `store`, `peers`, `queue`, `queue_age`, `unread_age`, `journal`, `losses`.
    pub check: &'static str,
    /// Its state.
    pub state: State,
    /// For a person: what was found, and the bound it crossed.
    pub detail: String,
}

/// One measured value, as perfdata and as a Prometheus sample.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measure {
    /// The metric's name (a Prometheus name, `mesh_check_` prefixed there).
    pub name: &'static str,
    /// Its label (`peer` or `agent`) and the label's value, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<(&'static str, String)>,
    /// The value.
    pub value: f64,
    /// Its warning and critical bounds, where set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warn: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[allow(missing_docs)]
    pub crit: Option<f64>,
    /// Whether the bounds are minimums (alert below them) rather than
    /// maximums (alert at or above them).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub at_least: bool,
}

/// The whole outcome of a check run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The worst finding's state.
    pub state: State,
    /// Its exit code.
    pub code: u8,
    /// The one line of text (without perfdata).
    pub summary: String,
    /// The node checked, if it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Every check's finding.
    pub checks: Vec<Finding>,
    /// What was measured.
    pub measures: Vec<Measure>,
}

fn finding(check: &'static str, state: State, detail: String) -> Finding {
    Finding {
        check,
        state,
        detail,
    }
}

/// The state of `value` against `warn` and `crit` (each reached at or above).
fn against(value: f64, warn: Option<f64>, crit: Option<f64>) -> State {
    if crit.is_some_and(|c| value >= c) {
        State::Critical
    } else if warn.is_some_and(|w| value >= w) {
        State::Warning
    } else {
        State::Ok
    }
}

fn short(node: &str) -> String {
    node.chars().take(10).collect()
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Applies `args`' thresholds to `r` as of `now_ms`.
pub fn evaluate(r: &Reading, args: &CheckArgs, now_ms: u64) -> Report {
    let st = &r.status;
    let mut checks = Vec::new();
    let mut measures = Vec::new();
    let mut measure = |name, label, value, warn, crit| {
        measures.push(Measure {
            name,
            label,
            value,
            warn,
            crit,
            at_least: false,
        })
    };

    checks.push(match &st.store_down {
        Some(why) => finding(
            "store",
            State::Critical,
            format!("store cannot commit: {why}"),
        ),
        None => finding("store", State::Ok, "store writable".into()),
    });

    let connected = st.peers.iter().filter(|p| p.connected && !p.paused).count();
    measure("peers", None, st.peers.len() as f64, None, None);
    let state = match args.peers_min {
        Some(m) if connected < m => State::Critical,
        _ => State::Ok,
    };
    let bound = args
        .peers_min
        .map(|m| format!(" (at least {m} wanted)"))
        .unwrap_or_default();
    checks.push(finding(
        "peers",
        state,
        format!("{connected}/{} peers connected{bound}", st.peers.len()),
    ));

    let (qw, qc) = (
        args.queue_warn.map(|v| v as f64),
        args.queue_crit.map(|v| v as f64),
    );
    let (aw, ac) = (args.queue_age_warn.map(secs), args.queue_age_crit.map(secs));
    let mut queue = finding("queue", State::Ok, "no queue past its bound".into());
    let mut queue_age = finding("queue_age", State::Ok, "nothing queued too long".into());
    for p in &st.peers {
        let label = Some(("peer", p.node.clone()));
        let q = p.queued_msgs as f64;
        measure("peer_queued_msgs", label.clone(), q, qw, qc);
        measure(
            "peer_outbox_bytes",
            label.clone(),
            p.outbox_bytes as f64,
            None,
            None,
        );
        let s = against(q, qw, qc);
        if s != State::Ok && s.worst(queue.state) == s {
            queue = finding(
                "queue",
                s,
                format!("peer {} has {} queued", short(&p.node), p.queued_msgs),
            );
        }
        let age = p
            .oldest_queued_ms
            .map(|t| secs(now_ms.saturating_sub(t)))
            .unwrap_or(0.0);
        measure("peer_oldest_queued_age_seconds", label, age, aw, ac);
        let s = against(age, aw, ac);
        if s != State::Ok && s.worst(queue_age.state) == s {
            queue_age = finding(
                "queue_age",
                s,
                format!(
                    "peer {}'s oldest queued message is {age:.1} s old",
                    short(&p.node)
                ),
            );
        }
    }
    checks.push(queue);
    checks.push(queue_age);

    let (uw, uc) = (
        args.unread_age_warn.map(secs),
        args.unread_age_crit.map(secs),
    );
    checks.push(match &r.unread {
        Err(why) if uw.is_some() || uc.is_some() => finding(
            "unread_age",
            State::Unknown,
            format!("cannot read the agents' unread mail: {why}"),
        ),
        Err(_) => finding("unread_age", State::Ok, "not asked".into()),
        Ok(agents) => {
            let mut f = finding("unread_age", State::Ok, "no unread mail too old".into());
            for (name, oldest) in agents {
                let age = oldest
                    .map(|t| secs(now_ms.saturating_sub(t)))
                    .unwrap_or(0.0);
                measure(
                    "agent_oldest_unread_age_seconds",
                    Some(("agent", name.clone())),
                    age,
                    uw,
                    uc,
                );
                let s = against(age, uw, uc);
                if s != State::Ok && s.worst(f.state) == s {
                    f = finding(
                        "unread_age",
                        s,
                        format!("agent {name}'s oldest unread message is {age:.1} s old"),
                    );
                }
            }
            f
        }
    });

    checks.push(match (&st.journal, st.journal.and_then(|j| j.max_bytes)) {
        (Some(j), Some(max)) if max > 0 => {
            let pct = j.bytes as f64 * 100.0 / max as f64;
            let (w, c) = (args.journal_warn, args.journal_crit);
            measure("journal_used_percent", None, pct, Some(w), Some(c));
            measure("journal_bytes", None, j.bytes as f64, None, None);
            finding(
                "journal",
                against(pct, Some(w), Some(c)),
                format!("journal at {pct:.1} % of its {max} bytes"),
            )
        }
        _ => finding(
            "journal",
            State::Unknown,
            "the daemon does not say its journal's bound (an older daemon?)".into(),
        ),
    });

    let (lw, lc) = (
        (args.losses_warn > 0).then_some(args.losses_warn as f64),
        args.losses_crit.map(|v| v as f64),
    );
    checks.push(match &r.losses {
        Err(why) => finding(
            "losses",
            State::Unknown,
            format!("cannot read the journal: {why}"),
        ),
        Ok((n, looked)) => {
            measure("recent_loss_records", None, *n as f64, lw, lc);
            finding(
                "losses",
                against(*n as f64, lw, lc),
                format!("{n} gap or loss records in the last {looked} arrivals"),
            )
        }
    });

    measures.insert(
        0,
        Measure {
            name: "peers_connected",
            label: None,
            value: connected as f64,
            warn: None,
            crit: args.peers_min.map(|m| m as f64),
            at_least: true,
        },
    );
    let state = checks.iter().fold(State::Ok, |s, f| s.worst(f.state));
    let shown: Vec<&str> = if state == State::Ok {
        checks
            .iter()
            .filter(|f| f.check == "peers")
            .map(|f| f.detail.as_str())
            .collect()
    } else {
        checks
            .iter()
            .filter(|f| f.state != State::Ok)
            .map(|f| f.detail.as_str())
            .collect()
    };
    Report {
        state,
        code: state.code(),
        summary: format!("MESH {} - {}", state.word(), shown.join("; ")),
        node: Some(st.node.clone()),
        checks,
        measures,
    }
}

/// The report when the daemon could not be asked at all: CRITICAL if it
/// does not run, UNKNOWN for anything else.
pub fn unreachable(e: &ClientError) -> Report {
    let state = match e {
        ClientError::NotRunning { .. } | ClientError::Connect { .. } => State::Critical,
        _ => State::Unknown,
    };
    let detail = e.to_string().replace('\n', " ");
    Report {
        state,
        code: state.code(),
        summary: format!("MESH {} - {detail}", state.word()),
        node: None,
        checks: vec![finding("daemon", state, detail)],
        measures: Vec::new(),
    }
}

/// Nagios perfdata: `'label'=value;warn;crit` for each measure.
fn perfdata(r: &Report) -> String {
    let mut out = String::new();
    for m in &r.measures {
        let label = match &m.label {
            Some((_, v)) => format!("{}_{}", m.name, short(v)),
            None => m.name.to_owned(),
        };
        // A minimum is the Nagios range `N:` (alert below N).
        let colon = if m.at_least { ":" } else { "" };
        let bound = |b: Option<f64>| b.map(|v| format!("{v}{colon}")).unwrap_or_default();
        let _ = write!(
            out,
            " '{label}'={};{};{}",
            m.value,
            bound(m.warn),
            bound(m.crit)
        );
    }
    out
}

/// A Prometheus label value, escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The report as Prometheus text: each check's state, and each measure.
pub fn prometheus(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(
        "# HELP mesh_check_state Each check's state: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.\n\
         # TYPE mesh_check_state gauge\n",
    );
    for f in &r.checks {
        let _ = writeln!(
            out,
            "mesh_check_state{{check=\"{}\"}} {}",
            f.check,
            f.state.code()
        );
    }
    let mut names: Vec<&str> = Vec::new();
    for m in &r.measures {
        if !names.contains(&m.name) {
            names.push(m.name);
        }
    }
    for name in names {
        let _ = writeln!(
            out,
            "# HELP mesh_check_{name} What `mesh check` measured: {}.\n# TYPE mesh_check_{name} gauge",
            name.replace('_', " ")
        );
        for m in r.measures.iter().filter(|m| m.name == name) {
            match &m.label {
                Some((k, v)) => {
                    let _ = writeln!(
                        out,
                        "mesh_check_{name}{{{k}=\"{}\"}} {}",
                        label_value(v),
                        m.value
                    );
                }
                None => {
                    let _ = writeln!(out, "mesh_check_{name} {}", m.value);
                }
            }
        }
    }
    out
}

/// The report in the format `args` asks for.
pub fn render(r: &Report, args: &CheckArgs) -> anyhow::Result<String> {
    Ok(match (args.json, args.format.as_deref()) {
        (true, _) | (false, Some("json")) => serde_json::to_string_pretty(r)? + "\n",
        (false, Some("prometheus")) => prometheus(r),
        _ => format!("{}|{}\n", r.summary, perfdata(r)),
    })
}

/// Reads what the checks need from the daemon behind `c`.
pub async fn read(c: &Client, recent: u64) -> Result<Reading, ClientError> {
    let status: NodeStatus = c.get("/v1/status").await?;
    let unread = read_unread(c).await.map_err(|e| e.to_string());
    let losses = count_losses(c, &status, recent).await;
    Ok(Reading {
        status,
        unread,
        losses,
    })
}

async fn read_unread(c: &Client) -> Result<Vec<(String, Option<u64>)>, ClientError> {
    let agents: AgentsResponse = c.get("/v1/agents").await?;
    let mut out = Vec::new();
    for a in agents
        .local
        .iter()
        .filter(|a| a.moved_to.is_none())
        .take(AGENTS_READ_MAX)
    {
        let path = format!(
            "/v1/agents/{}/inbox?unread=true&limit=1",
            path_segment(&a.name)
        );
        let page: InboxPage = c.get(&path).await?;
        let oldest = page.entries.first().and_then(|e| e.created_ms);
        out.push((a.name.clone(), oldest));
    }
    Ok(out)
}

/// Gap and loss records among the journal's last `recent` arrivals, and how
/// many arrivals that was.
async fn count_losses(c: &Client, st: &NodeStatus, recent: u64) -> Result<(u64, u64), String> {
    let node: mesh_protocol::NodeId = st.node.parse().map_err(|e| format!("node id: {e}"))?;
    let epoch: mesh_protocol::Epoch = st.epoch.parse().map_err(|e| format!("epoch: {e:?}"))?;
    let head = st.journal.map(|j| j.head).unwrap_or(0);
    let from = head.saturating_sub(recent);
    let mut after = mesh_protocol::Cursor::new(&node, epoch, from).to_string();
    let mut count = 0;
    let mut looked = 0;
    // Up to the head read in the status: what arrives meanwhile is the next
    // run's (a busy node would otherwise be read for ever).
    'pages: while looked < head - from {
        let path = format!("/v1/events?after={after}&limit={EVENTS_PAGE}");
        let page: EventsPage = c.get(&path).await.map_err(|e| e.to_string())?;
        if page.entries.is_empty() {
            break;
        }
        for e in &page.entries {
            if e.arrival > head {
                break 'pages;
            }
            looked += 1;
            if matches!(
                e.record,
                EventRecord::Gap { .. }
                    | EventRecord::Loss { .. }
                    | EventRecord::Lost { .. }
                    | EventRecord::RolledBack { .. }
            ) {
                count += 1;
            }
            if e.arrival == head {
                break 'pages;
            }
        }
        after = page.next;
    }
    Ok((count, looked))
}

/// `mesh check`: prints the report and ends with its exit code
/// ([`CheckExit`] for anything but OK).
pub(crate) async fn run(c: &Client, args: &CheckArgs) -> anyhow::Result<()> {
    let report = match read(c, args.recent).await {
        Ok(r) => evaluate(&r, args, now_ms()),
        Err(e) => unreachable(&e),
    };
    print!("{}", render(&report, args)?);
    match report.code {
        0 => Ok(()),
        code => Err(CheckExit(code).into()),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `mesh check` found something: exit with this code, the report printed.
#[derive(Debug, thiserror::Error)]
#[error("check state {0}")]
pub struct CheckExit(pub u8);

#[cfg(test)]
mod tests;
