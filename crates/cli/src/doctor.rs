//! `mesh doctor`: walks what usually goes wrong with a node and says, for
//! each thing found, what to do. Each finding is one line, and a fix line
//! under it; `--json` prints them as a list.
//!
//! The local checks (the data dir, the socket, the disk) run whether or not
//! a daemon answers; the rest read its status and agents.

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use mesh_api::client::{Client, ClientError};
use mesh_api::{AgentsResponse, DataDir, NodeStatus};
use serde::Serialize;

/// The part of the journal's bound past which retention is near.
const JOURNAL_NEAR_PERCENT: f64 = 90.0;

/// How far in the future a peer's card may be dated before its clock (or
/// this one) counts as off.
const CLOCK_SKEW_MS: u64 = 60_000;

/// The free disk, as a share of the filesystem, below which it is nearly full.
const DISK_FREE_PERCENT_MIN: f64 = 5.0;

/// `mesh doctor`'s options.
#[derive(Clone, Debug, clap::Args)]
pub struct DoctorArgs {
    /// Free bytes on the data dir's filesystem below which the disk counts
    /// as nearly full (also below 5 % free).
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    pub disk_free_min: u64,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Checked and fine.
    Ok,
    /// Works, but not as it should (a peer away, a journal near its bound).
    Warn,
    /// Broken: the mesh does not work here until it is fixed.
    Fail,
}

/// One thing checked.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// What was checked: `data_dir`, `key`, `daemon`, `store`, `disk`,
    /// `journal`, `peer`, `agent_socket`.
    pub check: &'static str,
    /// How bad.
    pub severity: Severity,
    /// What was found, for a person.
    pub what: String,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(check: &'static str, what: String) -> Finding {
    Finding {
        check,
        severity: Severity::Ok,
        what,
        fix: None,
    }
}

fn bad(check: &'static str, severity: Severity, what: String, fix: String) -> Finding {
    Finding {
        check,
        severity,
        what,
        fix: Some(fix),
    }
}

fn my_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `mesh doctor`: prints the findings; fails (exit 1) if any is not ok.
pub(crate) async fn run(c: &Client, dir: &DataDir, args: &DoctorArgs) -> anyhow::Result<()> {
    let findings = examine(c, dir, args).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&findings)?);
    } else {
        for f in &findings {
            let tag = match f.severity {
                Severity::Ok => "ok  ",
                Severity::Warn => "WARN",
                Severity::Fail => "FAIL",
            };
            println!("{tag}  {}: {}", f.check, f.what);
            if let Some(fix) = &f.fix {
                println!("      fix: {fix}");
            }
        }
    }
    let problems = findings
        .iter()
        .filter(|f| f.severity != Severity::Ok)
        .count();
    if problems > 0 {
        return Err(Problems(problems).into());
    }
    Ok(())
}

/// `mesh doctor` found this many problems (its findings are printed).
#[derive(Debug, thiserror::Error)]
#[error("mesh doctor found {0} problem(s)")]
pub struct Problems(pub usize);

/// Every finding, in the order a person would look.
pub async fn examine(c: &Client, dir: &DataDir, args: &DoctorArgs) -> Vec<Finding> {
    let mut out = Vec::new();
    let root = dir.root();
    let Some(meta) = data_dir(root, &mut out) else {
        return out;
    };
    key_file(dir, &mut out);
    disk(root, args.disk_free_min, &mut out);
    let Some(status) = daemon(c, dir, &meta, &mut out).await else {
        return out;
    };
    out.push(match &status.store_down {
        Some(why) => bad(
            "store",
            Severity::Fail,
            format!("the store cannot commit: {why} (local sends are held, then answered 503)"),
            format!(
                "free space on the filesystem of {} and check that the daemon's user may write \
                 its store file; the daemon retries by itself",
                root.display()
            ),
        ),
        None => ok("store", "the store commits".into()),
    });
    journal(&status, &mut out);
    peers(&status, now_ms(), &mut out);
    match c.get::<AgentsResponse>("/v1/agents").await {
        Ok(agents) => agent_sockets(&agents, &mut out),
        Err(e) => out.push(bad(
            "agent_socket",
            Severity::Warn,
            format!("cannot list the agents: {e}"),
            "run `mesh agents` to see why".into(),
        )),
    }
    out
}

fn data_dir(root: &Path, out: &mut Vec<Finding>) -> Option<std::fs::Metadata> {
    let meta = match std::fs::metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            out.push(bad(
                "data_dir",
                Severity::Fail,
                format!("there is no data dir at {}", root.display()),
                format!(
                    "start a node on it: `mesh daemon --data {}` creates it; or point at the \
                     right one with --data or MESH_DATA (the service's is /var/lib/agent-mesh)",
                    root.display()
                ),
            ));
            return None;
        }
        Err(e) => {
            out.push(bad(
                "data_dir",
                Severity::Fail,
                format!("cannot look at the data dir {}: {e}", root.display()),
                "run mesh as the user that owns it, or as root".into(),
            ));
            return None;
        }
    };
    let mode = meta.permissions().mode() & 0o777;
    let fix = format!("chmod 700 {}", root.display());
    if mode & 0o066 != 0 {
        out.push(bad(
            "data_dir",
            Severity::Fail,
            format!(
                "the data dir {} is mode {mode:04o}: other users may list or change what is in \
                 it (the store holds every message)",
                root.display()
            ),
            fix,
        ));
    } else if mode & 0o011 != 0 {
        out.push(bad(
            "data_dir",
            Severity::Warn,
            format!(
                "the data dir {} is mode {mode:04o}: other users may enter it and reach a \
                 file whose name they know, if its own mode lets them",
                root.display()
            ),
            fix,
        ));
    } else {
        out.push(ok(
            "data_dir",
            format!(
                "{} is mode {mode:04o}, owned by uid {}",
                root.display(),
                meta.uid()
            ),
        ));
    }
    Some(meta)
}

fn key_file(dir: &DataDir, out: &mut Vec<Finding>) {
    let path = dir.key_path();
    let Ok(meta) = std::fs::metadata(&path) else {
        // No key yet (never started) or not readable as this user: the
        // daemon check says which.
        return;
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        out.push(bad(
            "key",
            Severity::Fail,
            format!(
                "the node key {} is mode {mode:04o}: whoever reads it can act as this node",
                path.display()
            ),
            format!(
                "chmod 600 {}; if other users could read it, the node's identity is no longer \
                 its own",
                path.display()
            ),
        ));
    }
}

fn disk(root: &Path, free_min: u64, out: &mut Vec<Finding>) {
    let st = match rustix::fs::statvfs(root) {
        Ok(st) => st,
        Err(e) => {
            out.push(bad(
                "disk",
                Severity::Warn,
                format!("cannot read the free space of {}: {e}", root.display()),
                "check the filesystem with `df -h`".into(),
            ));
            return;
        }
    };
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let total = st.f_blocks.saturating_mul(st.f_frsize);
    let percent = if total == 0 {
        100.0
    } else {
        free as f64 * 100.0 / total as f64
    };
    if free < free_min || percent < DISK_FREE_PERCENT_MIN {
        out.push(bad(
            "disk",
            Severity::Fail,
            format!(
                "the disk of {} is nearly full: {free} bytes free ({percent:.1} %), less than \
                 {free_min} bytes or {DISK_FREE_PERCENT_MIN} %; when it is full the store stops \
                 committing (sends are held, then answered 503)",
                root.display()
            ),
            "free space on that filesystem, or lower [journal] max_bytes in config.toml and \
             restart (retention then trims the journal to it)"
                .into(),
        ));
    } else {
        out.push(ok(
            "disk",
            format!("{free} bytes free ({percent:.1} %) on the data dir's filesystem"),
        ));
    }
}

/// Whether a daemon answers, and if not, why; its status if it does.
async fn daemon(
    c: &Client,
    dir: &DataDir,
    meta: &std::fs::Metadata,
    out: &mut Vec<Finding>,
) -> Option<NodeStatus> {
    let socket = dir.socket_path();
    let start = format!(
        "start it: `mesh daemon --data {}` (or `systemctl start meshd` for the service)",
        dir.root().display()
    );
    if let Err(e) = std::os::unix::net::UnixStream::connect(&socket) {
        let (what, fix) = match e.kind() {
            ErrorKind::NotFound => (
                format!(
                    "no daemon runs on this data dir: no socket at {}",
                    socket.display()
                ),
                start,
            ),
            ErrorKind::ConnectionRefused => (
                format!(
                    "no daemon listens on {}: the socket was left by one that ended",
                    socket.display()
                ),
                start,
            ),
            ErrorKind::PermissionDenied => (
                format!(
                    "uid {} may not reach {}: the data dir is uid {}'s, mode {:04o}",
                    my_uid(),
                    socket.display(),
                    meta.uid(),
                    meta.permissions().mode() & 0o777
                ),
                format!(
                    "run mesh as uid {} (for the service: `sudo -u agent-mesh mesh ...`) or as \
                     root; an agent of another uid uses its own socket (`mesh agent add NAME \
                     --uid UID` with [agents] socket_dir)",
                    meta.uid()
                ),
            ),
            _ => (
                format!("cannot connect to {}: {e}", socket.display()),
                "check the socket's permissions and that the daemon runs".into(),
            ),
        };
        out.push(bad("daemon", Severity::Fail, what, fix));
        return None;
    }
    match c.get::<NodeStatus>("/v1/status").await {
        Ok(st) => {
            let owner = if meta.uid() != my_uid() && my_uid() != 0 {
                format!(
                    " (the data dir is uid {}'s, this is uid {})",
                    meta.uid(),
                    my_uid()
                )
            } else {
                String::new()
            };
            out.push(ok(
                "daemon",
                format!(
                    "node {} ({}) answers on {}{owner}",
                    st.node,
                    st.name,
                    socket.display()
                ),
            ));
            Some(st)
        }
        Err(ClientError::Api { code, message, .. }) if code == "forbidden" => {
            out.push(bad(
                "daemon",
                Severity::Fail,
                format!("the daemon refuses this user: {message}"),
                "run mesh as the daemon's user or as root".into(),
            ));
            None
        }
        Err(e) => {
            out.push(bad(
                "daemon",
                Severity::Fail,
                format!("the daemon does not answer its status: {e}"),
                "look at its log (`journalctl -u meshd` for the service)".into(),
            ));
            None
        }
    }
}

fn journal(st: &NodeStatus, out: &mut Vec<Finding>) {
    let Some(j) = st.journal else { return };
    let Some(max) = j.max_bytes.filter(|m| *m > 0) else {
        return;
    };
    let percent = j.bytes as f64 * 100.0 / max as f64;
    if percent >= JOURNAL_NEAR_PERCENT {
        let trimmed = if j.first > 1 {
            format!("; arrivals 1..={} are trimmed already", j.first - 1)
        } else {
            String::new()
        };
        out.push(bad(
            "journal",
            Severity::Warn,
            format!(
                "the journal is at {percent:.0} % of [journal] max_bytes ({} of {max} bytes): \
                 retention trims its oldest entries, and a reader behind them gets a `trimmed` \
                 entry instead{trimmed}",
                j.bytes
            ),
            "raise [journal] max_bytes in config.toml and restart, if the disk allows".into(),
        ));
    } else {
        out.push(ok(
            "journal",
            format!("the journal is at {percent:.1} % of its {max} bytes"),
        ));
    }
}

fn peers(st: &NodeStatus, now_ms: u64, out: &mut Vec<Finding>) {
    if st.peers.is_empty() {
        out.push(bad(
            "peer",
            Severity::Warn,
            "this node has no peers: nothing it sends to another node can leave".into(),
            "on another node run `mesh invite` and here `mesh join CODE`, or `mesh peer add \
             TICKET` with its `mesh ticket`"
                .into(),
        ));
        return;
    }
    for p in &st.peers {
        let short: String = p.node.chars().take(10).collect();
        let who = match &p.name {
            Some(n) => format!("peer {short} ({n})"),
            None => format!("peer {short}"),
        };
        if let Some(conflict) = &p.identity_conflict {
            out.push(bad(
                "peer",
                Severity::Fail,
                format!("{who}: two processes run with this node's key: {conflict}"),
                "stop one: a copied data dir was started twice; a second node needs its own \
                 data dir, made by `mesh daemon`"
                    .into(),
            ));
        }
        if let Some(why) = &p.refused {
            out.push(bad(
                "peer",
                Severity::Fail,
                format!("{who} speaks another protocol version: {why}"),
                "run the same release on both nodes (`mesh --version` on each)".into(),
            ));
            continue;
        }
        if let Some(issued) = p.card_issued_ms
            && issued > now_ms.saturating_add(CLOCK_SKEW_MS)
        {
            out.push(bad(
                "peer",
                Severity::Warn,
                format!(
                    "{who}'s card is dated {} s in the future: its clock or this one is off",
                    (issued - now_ms) / 1000
                ),
                "keep both clocks synchronised (`timedatectl set-ntp true`)".into(),
            ));
        }
        if p.paused {
            out.push(bad(
                "peer",
                Severity::Warn,
                format!("{who}: the link is paused; {} messages wait", p.queued_msgs),
                format!("mesh peer resume {}", p.node),
            ));
            continue;
        }
        if p.connected {
            out.push(ok("peer", format!("{who} is connected")));
            continue;
        }
        let stale: Vec<String> = p
            .addrs
            .iter()
            .filter(|a| a.port() == 0 || a.ip().is_unspecified())
            .map(|a| a.to_string())
            .collect();
        let fix_addr = format!(
            "run `mesh ticket` on {who} and here `mesh peer add TICKET`: that tells this node \
             where it listens now"
        );
        if p.addrs.is_empty() || stale.len() == p.addrs.len() {
            out.push(bad(
                "peer",
                Severity::Fail,
                format!(
                    "{who} is not connected and no address it can be dialed at is known{}; \
                     {} messages wait",
                    if stale.is_empty() {
                        String::new()
                    } else {
                        format!(" (only {}, which cannot be dialed)", stale.join(", "))
                    },
                    p.queued_msgs
                ),
                fix_addr,
            ));
            continue;
        }
        let addrs: Vec<String> = p.addrs.iter().map(|a| a.to_string()).collect();
        let seen = match p.card_issued_ms {
            Some(t) if t <= now_ms => {
                format!("; its newest card is {} min old", (now_ms - t) / 60_000)
            }
            _ => String::new(),
        };
        out.push(bad(
            "peer",
            Severity::Warn,
            format!(
                "{who} is not connected; this node dials it at {}{seen}; {} messages wait",
                addrs.join(", "),
                p.queued_msgs
            ),
            format!(
                "check that its daemon runs (`mesh status` there) and that UDP to {} is not \
                 blocked; if it listens elsewhere now, {fix_addr}",
                addrs.join(", ")
            ),
        ));
    }
}

/// Whether `uid` may enter every dir above `path`: by the owner's bit if it
/// owns the dir, else by the group's or the others' (groups are not looked
/// up: a dir open to its group counts as reachable).
fn reachable_by(path: &Path, uid: u32) -> Result<(), (PathBuf, u32, u32)> {
    if uid == 0 {
        return Ok(());
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        if let Ok(m) = std::fs::metadata(d) {
            let mode = m.permissions().mode();
            let may = if m.uid() == uid {
                mode & 0o100 != 0
            } else {
                mode & 0o011 != 0
            };
            if !may {
                return Err((d.to_owned(), m.uid(), mode & 0o777));
            }
        }
        dir = d.parent();
    }
    Ok(())
}

fn agent_sockets(agents: &AgentsResponse, out: &mut Vec<Finding>) {
    for a in agents.local.iter().filter(|a| a.moved_to.is_none()) {
        let (Some(uid), Some(socket)) = (a.uid, a.socket.as_deref()) else {
            continue;
        };
        match reachable_by(Path::new(socket), uid) {
            Ok(()) => out.push(ok(
                "agent_socket",
                format!(
                    "agent {}'s socket {socket} is reachable by its uid {uid}",
                    a.name
                ),
            )),
            Err((dir, owner, mode)) => out.push(bad(
                "agent_socket",
                Severity::Fail,
                format!(
                    "agent {}'s uid {uid} cannot reach its socket {socket}: {} is uid {owner}'s, \
                     mode {mode:04o}",
                    a.name,
                    dir.display()
                ),
                format!(
                    "set [agents] socket_dir in config.toml to a dir uid {uid} may enter (e.g. \
                     /run/agent-mesh) and restart, or `chmod o+x {}` if that is meant",
                    dir.display()
                ),
            )),
        }
    }
}
