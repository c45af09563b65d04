//! Real `mesh daemon` processes for the bench, the demo and the fault harness.
//!
//! A [`NodeProc`] is one daemon process of a `mesh` executable on its own
//! data dir: started, waited for until it answers on its socket, stopped
//! with SIGTERM, killed, paused with SIGSTOP and restarted on the port its
//! first start picked, so its peers find it where its ticket says. A
//! [`Cluster`] is several of them in one temp dir, every pair linked.
//!
//! Every wait is bounded and polls the node's API; nothing sleeps to
//! synchronise. A process is killed when its [`NodeProc`] is dropped, and
//! where `setpriv` exists each daemon also dies with the thread that started
//! it (`--pdeathsig KILL`), so a killed test or bench leaves no daemon behind.
//! The daemon itself knows nothing of this: it is started exactly as a
//! person starts it, `mesh daemon --data DIR --bind ADDR`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Tests unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod node;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use mesh_api::client::{Client, ClientError};
use mesh_api::{EventEntry, EventsPage, StatusResponse};

pub use node::{NodeProc, NodeSpec, Placement, RestartPort, Stopped};

/// How often a starting, stopping or linking node is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// How many times a starting daemon's socket is polled before giving up
/// (with [`POLL_INTERVAL`], about 60 s: debug builds on two busy cores start slowly).
pub const READY_POLLS_MAX: u32 = 2400;
/// How long one API call may take before it is given up.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a SIGTERM'd daemon gets to exit before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a SIGKILL'd daemon gets to be reaped.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long linked nodes get to connect to each other.
pub const LINK_TIMEOUT: Duration = Duration::from_secs(60);
/// Entries asked for per journal page.
pub const JOURNAL_PAGE_LIMIT: usize = 1000;
/// The most journal pages read from one node (a bound, far above any run).
pub const JOURNAL_PAGES_MAX: usize = 100_000;
/// The most nodes in one cluster.
pub const NODES_MAX: usize = 64;
/// Lines of a daemon's log shown when it fails.
const LOG_TAIL_LINES: usize = 30;

/// How to start a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The `mesh` executable.
    pub bin: PathBuf,
    /// How many nodes (1 to [`NODES_MAX`]).
    pub nodes: usize,
    /// Where the cluster's temp dir is made [default: the system's temp dir].
    pub temp_parent: Option<PathBuf>,
    /// Where each daemon's output is appended (`node-I.log`) [default: the temp dir].
    pub log_dir: Option<PathBuf>,
    /// `RUST_LOG` for the daemons.
    pub rust_log: String,
    /// Written to each node's `config.toml` before its first start, if any.
    pub daemon_config: Option<String>,
    /// Data dirs for some nodes (by index) instead of `node-I` in the temp dir.
    pub data_dirs: BTreeMap<usize, PathBuf>,
    /// Where each node runs, by index; a node without one runs on 127.0.0.1.
    pub placements: Vec<Placement>,
    /// Keep the temp dir when the cluster is dropped (its path is printed).
    pub keep_dir: bool,
}

impl ClusterConfig {
    /// `nodes` nodes of `bin` on 127.0.0.1, logging warnings.
    pub fn new(bin: impl Into<PathBuf>, nodes: usize) -> Self {
        ClusterConfig {
            bin: bin.into(),
            nodes,
            temp_parent: None,
            log_dir: None,
            rust_log: "warn".into(),
            daemon_config: None,
            data_dirs: BTreeMap::new(),
            placements: Vec::new(),
            keep_dir: false,
        }
    }
}

/// Linked daemons in one temp dir. Dropping it kills them all, then removes
/// the temp dir (unless [`ClusterConfig::keep_dir`]).
#[derive(Debug)]
pub struct Cluster {
    // Declared before `dir`: the daemons die before their files go.
    nodes: Vec<NodeProc>,
    dir: Option<tempfile::TempDir>,
    keep_dir: bool,
}

impl Cluster {
    /// Starts `cfg.nodes` daemons, waits until each serves its socket, and
    /// links every pair both ways (`POST /v1/peers` with the other's ticket).
    /// It does not wait for the links to connect ([`Cluster::wait_connected`]).
    ///
    /// # Errors
    /// If a daemon does not start or answer, or linking fails.
    pub async fn start(cfg: ClusterConfig) -> anyhow::Result<Cluster> {
        if !(1..=NODES_MAX).contains(&cfg.nodes) {
            bail!("a cluster has 1 to {NODES_MAX} nodes, not {}", cfg.nodes);
        }
        let mut builder = tempfile::Builder::new();
        builder.prefix("mesh-cluster-");
        let dir = match &cfg.temp_parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .context("cannot make the cluster's temp dir")?;
        let log_dir = cfg.log_dir.clone().unwrap_or_else(|| dir.path().to_owned());
        let mut nodes = Vec::with_capacity(cfg.nodes);
        for i in 0..cfg.nodes {
            let name = format!("node-{i}");
            let data = cfg
                .data_dirs
                .get(&i)
                .cloned()
                .unwrap_or_else(|| dir.path().join(&name));
            if let Some(toml) = &cfg.daemon_config {
                std::fs::create_dir_all(&data)
                    .with_context(|| format!("cannot create {}", data.display()))?;
                std::fs::write(data.join(mesh_api::paths::CONFIG_FILE), toml)
                    .with_context(|| format!("cannot write {name}'s config.toml"))?;
            }
            nodes.push(NodeProc::new(NodeSpec {
                log: log_dir.join(format!("{name}.log")),
                name,
                bin: cfg.bin.clone(),
                data,
                placement: cfg.placements.get(i).cloned().unwrap_or_default(),
                rust_log: cfg.rust_log.clone(),
            }));
        }
        let mut cluster = Cluster {
            nodes,
            dir: Some(dir),
            keep_dir: cfg.keep_dir,
        };
        for n in &mut cluster.nodes {
            n.spawn()?;
        }
        for n in &mut cluster.nodes {
            n.wait_ready().await?;
        }
        cluster.link_all().await?;
        Ok(cluster)
    }

    /// Adds every node as a peer of every other.
    async fn link_all(&self) -> anyhow::Result<()> {
        for a in &self.nodes {
            for b in self.nodes.iter().filter(|b| b.id() != a.id()) {
                a.add_peer(b).await?;
            }
        }
        Ok(())
    }

    /// Waits (at most [`LINK_TIMEOUT`]) until every running node sees every
    /// other running node connected.
    ///
    /// # Errors
    /// If a status cannot be read, or a pair is not connected in time.
    pub async fn wait_connected(&mut self) -> anyhow::Result<()> {
        let polls = LINK_TIMEOUT.as_millis() / POLL_INTERVAL.as_millis();
        let mut missing = Vec::new();
        for _ in 0..polls {
            missing.clear();
            let running: Vec<usize> = (0..self.len()).filter(|i| self.is_running(*i)).collect();
            for &i in &running {
                let st = self.nodes[i].status().await?;
                for &j in running.iter().filter(|j| **j != i) {
                    let other = &self.nodes[j];
                    let up = st
                        .node
                        .peers
                        .iter()
                        .any(|p| p.node == other.id() && p.connected);
                    if !up {
                        missing.push(format!("{}→{}", self.nodes[i].name(), other.name()));
                    }
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        bail!(
            "not connected after {LINK_TIMEOUT:?}: {}",
            missing.join(", ")
        )
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes (never, once started).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes, by index.
    pub fn nodes(&self) -> &[NodeProc] {
        &self.nodes
    }

    /// The nodes, by index, to start and stop.
    pub fn nodes_mut(&mut self) -> &mut [NodeProc] {
        &mut self.nodes
    }

    /// The cluster's temp dir.
    pub fn base(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }

    /// Node `i`'s API client.
    pub fn client(&self, i: usize) -> &Client {
        self.nodes[i].client()
    }

    /// Node `i`'s id.
    pub fn node_id(&self, i: usize) -> &str {
        self.nodes[i].id()
    }

    /// Every node's id, by index.
    pub fn node_ids(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.id().to_owned()).collect()
    }

    /// Node `i`'s data dir.
    pub fn data_dir(&self, i: usize) -> &Path {
        self.nodes[i].data_dir()
    }

    /// The address node `i` listens on for peers.
    pub fn peer_addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].peer_addr()
    }

    /// Whether node `i`'s process runs (it may be paused).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.nodes[i].is_running()
    }

    /// Whether node `i` is stopped with SIGSTOP.
    pub fn is_paused(&self, i: usize) -> bool {
        self.nodes[i].is_paused()
    }

    /// How many times node `i` was started.
    pub fn starts(&self, i: usize) -> u32 {
        self.nodes[i].starts()
    }

    /// Node `i`'s process id, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    /// Starts node `i` again on its data dir and peer address, and waits
    /// until it serves its socket as the same node.
    ///
    /// # Errors
    /// If it is running, or does not start.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i].start().await.map(|_| ())
    }

    /// `kill -9` node `i` and reap it ([`NodeProc::kill`]).
    ///
    /// # Errors
    /// If the process does not die in time.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i].kill().await
    }

    /// Stops node `i` ([`NodeProc::stop`]).
    ///
    /// # Errors
    /// If it cannot be signalled or reaped.
    pub async fn stop(&mut self, i: usize) -> anyhow::Result<Stopped> {
        self.nodes[i].stop().await
    }

    /// SIGSTOP node `i`.
    ///
    /// # Errors
    /// If it is not running or cannot be signalled.
    pub fn pause(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i].pause()
    }

    /// SIGCONT node `i`.
    ///
    /// # Errors
    /// If it is not running or cannot be signalled.
    pub fn resume(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i].resume()
    }

    /// Resumes paused nodes and restarts stopped ones.
    ///
    /// # Errors
    /// If a node cannot be resumed or restarted.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        for i in 0..self.len() {
            if self.nodes[i].is_paused() {
                self.resume(i)?;
            }
            if !self.is_running(i) {
                self.restart(i).await?;
            }
        }
        Ok(())
    }

    /// Node `i`'s status.
    ///
    /// # Errors
    /// If the call fails or takes longer than [`CALL_TIMEOUT`].
    pub async fn status(&self, i: usize) -> anyhow::Result<StatusResponse> {
        self.nodes[i].status().await
    }

    /// Node `i`'s whole journal.
    ///
    /// # Errors
    /// As [`read_journal`].
    pub async fn journal(&self, i: usize) -> anyhow::Result<Vec<EventEntry>> {
        self.nodes[i].journal().await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The nodes are killed after this, before the (kept or removed) dir goes.
        if self.keep_dir
            && let Some(dir) = self.dir.take()
        {
            eprintln!("kept {}", dir.keep().display());
        }
    }
}

/// Runs an API call with [`CALL_TIMEOUT`].
///
/// # Errors
/// The call's error, or a timeout.
pub async fn call<T>(f: impl Future<Output = Result<T, ClientError>>) -> anyhow::Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => Ok(r?),
        Err(_) => bail!("no answer within {CALL_TIMEOUT:?}"),
    }
}

/// A whole journal through `client`, paged with `GET /v1/events`.
///
/// # Errors
/// If a page cannot be read, or there are more than [`JOURNAL_PAGES_MAX`] pages.
pub async fn read_journal(client: &Client) -> anyhow::Result<Vec<EventEntry>> {
    let mut tail = JournalTail::default();
    tail.read_new(client).await?;
    Ok(tail.entries)
}

/// One node's journal, read incrementally: each [`JournalTail::read_new`]
/// pages from where the last one ended.
#[derive(Clone, Debug, Default)]
pub struct JournalTail {
    /// The cursor after the last entry read (empty: the start).
    pub after: String,
    /// Every entry read so far, in arrival order.
    pub entries: Vec<EventEntry>,
}

impl JournalTail {
    /// Reads every entry after [`JournalTail::after`]; answers how many.
    ///
    /// # Errors
    /// If a page cannot be read (what was read stays), or there are more
    /// than [`JOURNAL_PAGES_MAX`] pages.
    pub async fn read_new(&mut self, client: &Client) -> anyhow::Result<usize> {
        let before = self.entries.len();
        for _ in 0..JOURNAL_PAGES_MAX {
            let mut path = format!("/v1/events?limit={JOURNAL_PAGE_LIMIT}");
            if !self.after.is_empty() {
                path.push_str("&after=");
                path.push_str(&mesh_api::path_segment(&self.after));
            }
            let page: EventsPage = call(client.get(&path)).await?;
            if page.entries.is_empty() {
                return Ok(self.entries.len() - before);
            }
            self.entries.extend(page.entries);
            self.after = page.next;
        }
        bail!("the journal has more than {JOURNAL_PAGES_MAX} pages")
    }
}

/// The last lines of a log file, for an error message.
pub fn log_tail(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
