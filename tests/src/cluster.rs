//! A cluster of real `mesh daemon` processes, linked in a full mesh.
//!
//! Each node has its own data dir (in one temp dir) and socket. As root the
//! nodes run in network namespaces ([`Netns`]) and listen on
//! `10.213.0.(10+I):4919`; otherwise they listen on `127.0.0.1`, on the port
//! the first start picked, so a restarted node is found where its peers'
//! tickets say. The cluster kills every daemon it started when dropped.

use std::fs::{File, OpenOptions};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use mesh_api::NodeStatus;
use mesh_api::client::Client;
use mesh_api::{AddPeerRequest, EventEntry, EventsPage, TicketResponse};
use rustix::process::{Pid, Signal, kill_process};

use crate::netns::{self, Netns};

/// The peer port every node listens on inside its own namespace.
pub const NETNS_PEER_PORT: u16 = 4919;
/// How often readiness and exits are polled.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// How many times a starting daemon's socket is polled before giving up
/// (with [`POLL_INTERVAL`], about 60 s: debug builds on two cores start slowly).
pub const READY_POLLS_MAX: u32 = 2400;
/// How long one API call may take before the harness gives up on it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a SIGTERM'd daemon gets to exit before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Entries asked for per journal page.
pub const JOURNAL_PAGE_LIMIT: usize = 1000;
/// The most journal pages read from one node (a bound, far above any run).
pub const JOURNAL_PAGES_MAX: usize = 100_000;

/// Where the daemons' network lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Network namespaces when running as root with iproute2, else loopback.
    Auto,
    /// 127.0.0.1 in the host's namespace; no partitions.
    Loopback,
}

/// How to start a cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The `mesh` executable.
    pub bin: PathBuf,
    /// How many nodes (1 to [`netns::NODES_MAX`]).
    pub nodes: usize,
    /// Namespaces or loopback.
    pub isolation: Isolation,
    /// Where each daemon's stderr is appended (`node-I.log`); `None` puts it
    /// in the cluster's temp dir.
    pub log_dir: Option<PathBuf>,
    /// `RUST_LOG` for the daemons.
    pub rust_log: String,
    /// Written to each node's `config.toml` before its first start, if any.
    pub daemon_config: Option<String>,
    /// Data dirs for some nodes (by index) instead of one in the cluster's
    /// temp dir, e.g. on a filesystem a test can fill up.
    pub data_dirs: std::collections::BTreeMap<usize, PathBuf>,
}

impl ClusterConfig {
    /// `nodes` nodes of `bin`, namespaces when possible, logs at `info`.
    pub fn new(bin: impl Into<PathBuf>, nodes: usize) -> Self {
        ClusterConfig {
            bin: bin.into(),
            nodes,
            isolation: Isolation::Auto,
            log_dir: None,
            rust_log: std::env::var("CHAOS_RUST_LOG").unwrap_or_else(|_| "info".into()),
            daemon_config: None,
            data_dirs: Default::default(),
        }
    }
}

/// One daemon and what is needed to start it again.
#[derive(Debug)]
struct NodeProc {
    data: PathBuf,
    log: PathBuf,
    client: Client,
    bind: SocketAddr,
    id: String,
    child: Option<Child>,
    paused: bool,
    starts: u32,
}

/// N linked daemons. Dropping it kills them all (and removes the namespaces).
#[derive(Debug)]
pub struct Cluster {
    cfg: ClusterConfig,
    nodes: Vec<NodeProc>,
    // Declared (so dropped) after `nodes`' processes are killed in `drop`.
    net: Option<Netns>,
    _tmp: tempfile::TempDir,
    pdeathsig: bool,
}

impl Cluster {
    /// Starts `cfg.nodes` daemons, waits until each serves its socket, and
    /// links every pair both ways (`POST /v1/peers` with the other's ticket).
    ///
    /// # Errors
    /// If a daemon does not start or answer, or linking fails.
    pub async fn start(cfg: ClusterConfig) -> anyhow::Result<Cluster> {
        if cfg.nodes == 0 || cfg.nodes > netns::NODES_MAX {
            bail!(
                "a cluster has 1 to {} nodes, not {}",
                netns::NODES_MAX,
                cfg.nodes
            );
        }
        let net = match cfg.isolation {
            Isolation::Loopback => None,
            Isolation::Auto => match netns::unavailable_reason() {
                None => Some(Netns::create(cfg.nodes)?),
                Some(why) => {
                    eprintln!(
                        "chaos: {why}: daemons run on 127.0.0.1 without network namespaces; \
                         partitions and packet loss are SKIPPED"
                    );
                    None
                }
            },
        };
        let tmp = tempfile::Builder::new()
            .prefix("mesh-cluster-")
            .tempdir()
            .context("cannot make the cluster's temp dir")?;
        let log_dir = cfg.log_dir.clone().unwrap_or_else(|| tmp.path().to_owned());
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("cannot create {}", log_dir.display()))?;
        let nodes = (0..cfg.nodes)
            .map(|i| {
                let data = cfg
                    .data_dirs
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| tmp.path().join(format!("n{i}")));
                let bind = match &net {
                    Some(n) => SocketAddr::new(IpAddr::V4(n.node_ip(i)), NETNS_PEER_PORT),
                    None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                };
                NodeProc {
                    client: Client::new(data.join("mesh.sock")),
                    data,
                    log: log_dir.join(format!("node-{i}.log")),
                    bind,
                    id: String::new(),
                    child: None,
                    paused: false,
                    starts: 0,
                }
            })
            .collect();
        let pdeathsig = Command::new("setpriv")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        let mut cluster = Cluster {
            cfg,
            nodes,
            net,
            _tmp: tmp,
            pdeathsig,
        };
        for i in 0..cluster.len() {
            if let Some(toml) = &cluster.cfg.daemon_config {
                let data = &cluster.nodes[i].data;
                std::fs::create_dir_all(data)
                    .with_context(|| format!("cannot create {}", data.display()))?;
                std::fs::write(data.join("config.toml"), toml)
                    .with_context(|| format!("cannot write node {i}'s config.toml"))?;
            }
            cluster.spawn(i)?;
        }
        for i in 0..cluster.len() {
            let status = cluster.wait_ready(i).await?;
            let node = &mut cluster.nodes[i];
            node.id = status.node.clone();
            if node.bind.port() == 0 {
                // Keep the port the daemon picked, so its peers find it again
                // after a restart.
                let ip = node.bind.ip();
                node.bind = status
                    .addrs
                    .iter()
                    .copied()
                    .find(|a| a.ip() == ip && a.port() != 0)
                    .with_context(|| {
                        format!("node {i} lists no {ip} address: {:?}", status.addrs)
                    })?;
            }
        }
        cluster.link_all().await?;
        Ok(cluster)
    }

    /// Adds every node as a peer of every other.
    async fn link_all(&self) -> anyhow::Result<()> {
        let mut tickets = Vec::new();
        for i in 0..self.len() {
            let t: TicketResponse = call(self.client(i).get("/v1/ticket"))
                .await
                .with_context(|| format!("ticket of node {i}"))?;
            tickets.push(t.ticket);
        }
        for i in 0..self.len() {
            for (j, ticket) in tickets.iter().enumerate() {
                if i == j {
                    continue;
                }
                let req = AddPeerRequest {
                    ticket: ticket.clone(),
                };
                call(self.client(i).post::<serde_json::Value>("/v1/peers", &req))
                    .await
                    .with_context(|| format!("adding node {j} to node {i}"))?;
            }
        }
        Ok(())
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes (never, once started).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The namespaces, when the cluster runs in them.
    pub fn netns(&self) -> Option<&Netns> {
        self.net.as_ref()
    }

    /// Node `i`'s API client.
    pub fn client(&self, i: usize) -> &Client {
        &self.nodes[i].client
    }

    /// Node `i`'s id.
    pub fn node_id(&self, i: usize) -> &str {
        &self.nodes[i].id
    }

    /// Every node's id, by index.
    pub fn node_ids(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.id.clone()).collect()
    }

    /// Node `i`'s data dir.
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.nodes[i].data
    }

    /// The address node `i` listens on for peers.
    pub fn peer_addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].bind
    }

    /// Whether node `i`'s process runs (it may be paused).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.reap(i);
        self.nodes[i].child.is_some()
    }

    /// Whether node `i` is stopped with SIGSTOP.
    pub fn is_paused(&self, i: usize) -> bool {
        self.nodes[i].paused
    }

    /// How many times node `i` was started.
    pub fn starts(&self, i: usize) -> u32 {
        self.nodes[i].starts
    }

    /// Node `i`'s process id, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Starts node `i`'s daemon process (it must not be running).
    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        self.reap(i);
        let node = &self.nodes[i];
        if node.child.is_some() {
            bail!("node {i} is already running");
        }
        // `ip netns exec` and `setpriv` exec what follows: the child's pid
        // is the daemon's, so signals reach it directly.
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(n) = &self.net {
            argv.extend(["ip", "netns", "exec", n.node_ns(i)].map(Into::into));
        }
        if self.pdeathsig {
            // Dies with the test's thread even if the test is killed: no orphans.
            argv.extend(["setpriv", "--pdeathsig", "KILL"].map(Into::into));
        }
        argv.push(self.cfg.bin.clone().into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("cannot open {}", node.log.display()))?;
        let child = cmd
            .arg("daemon")
            .arg("--data")
            .arg(&node.data)
            .arg("--bind")
            .arg(node.bind.to_string())
            .env("RUST_LOG", &self.cfg.rust_log)
            .env("NO_COLOR", "1")
            .env_remove("MESH_DATA")
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("cannot share the log file")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", self.cfg.bin.display()))?;
        let node = &mut self.nodes[i];
        node.child = Some(child);
        node.paused = false;
        node.starts += 1;
        Ok(())
    }

    /// Polls node `i`'s socket until `GET /v1/status` answers, a bounded
    /// number of times; fails at once if the process exits.
    async fn wait_ready(&mut self, i: usize) -> anyhow::Result<NodeStatus> {
        for _ in 0..READY_POLLS_MAX {
            if !self.is_running(i) {
                bail!(
                    "node {i}'s daemon exited while starting; its log ends with:\n{}",
                    log_tail(&self.nodes[i].log)
                );
            }
            let probe = self.nodes[i].client.get::<NodeStatus>("/v1/status");
            if let Ok(Ok(status)) = tokio::time::timeout(CALL_TIMEOUT, probe).await {
                return Ok(status);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        bail!(
            "node {i}'s daemon did not serve {} after {} polls; its log ends with:\n{}",
            self.nodes[i].client.socket().display(),
            READY_POLLS_MAX,
            log_tail(&self.nodes[i].log)
        )
    }

    /// Starts node `i` again on its data dir and peer address, and waits
    /// until it serves its socket.
    ///
    /// # Errors
    /// If it is running, or does not start.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.spawn(i)?;
        let status = self.wait_ready(i).await?;
        if status.node != self.nodes[i].id {
            bail!(
                "node {i} came back as {} instead of {}",
                status.node,
                self.nodes[i].id
            );
        }
        Ok(())
    }

    /// `kill -9` node `i` and reaps it. Nothing if it is not running.
    ///
    /// # Errors
    /// If the process does not die within the bound.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        self.signal_and_reap(i, Signal::KILL, Duration::from_secs(5))
            .await
    }

    /// SIGTERM node `i` (resuming it first if paused) and waits for it to
    /// exit; kills it if it takes longer than [`STOP_TIMEOUT`].
    ///
    /// # Errors
    /// If it cannot be signalled.
    pub async fn stop(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes[i].paused {
            self.resume(i)?;
        }
        if self
            .signal_and_reap(i, Signal::TERM, STOP_TIMEOUT)
            .await
            .is_err()
        {
            eprintln!(
                "chaos: node {i} did not stop on SIGTERM within {STOP_TIMEOUT:?}; killing it"
            );
            self.kill(i).await?;
        }
        Ok(())
    }

    async fn signal_and_reap(
        &mut self,
        i: usize,
        sig: Signal,
        within: Duration,
    ) -> anyhow::Result<()> {
        if !self.is_running(i) {
            return Ok(());
        }
        self.signal(i, sig)?;
        let polls = (within.as_millis() / POLL_INTERVAL.as_millis()).max(1);
        for _ in 0..polls {
            if !self.is_running(i) {
                self.nodes[i].paused = false;
                return Ok(());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        bail!("node {i} did not exit within {within:?}")
    }

    /// SIGSTOP node `i`.
    ///
    /// # Errors
    /// If it is not running or cannot be signalled.
    pub fn pause(&mut self, i: usize) -> anyhow::Result<()> {
        self.signal(i, Signal::STOP)?;
        self.nodes[i].paused = true;
        Ok(())
    }

    /// SIGCONT node `i`.
    ///
    /// # Errors
    /// If it is not running or cannot be signalled.
    pub fn resume(&mut self, i: usize) -> anyhow::Result<()> {
        self.signal(i, Signal::CONT)?;
        self.nodes[i].paused = false;
        Ok(())
    }

    fn signal(&mut self, i: usize, sig: Signal) -> anyhow::Result<()> {
        let pid = self
            .pid(i)
            .and_then(|p| Pid::from_raw(p as i32))
            .with_context(|| format!("node {i} is not running"))?;
        kill_process(pid, sig).with_context(|| format!("cannot signal node {i}"))?;
        Ok(())
    }

    /// Forgets node `i`'s process if it has exited.
    fn reap(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(child) = &mut node.child
            && !matches!(child.try_wait(), Ok(None))
        {
            node.child = None;
            node.paused = false;
        }
    }

    /// Heals the network, resumes paused nodes and restarts stopped ones.
    ///
    /// # Errors
    /// If a node cannot be resumed or restarted, or the network healed.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        if let Some(net) = &self.net {
            net.heal()?;
        }
        for i in 0..self.len() {
            if self.nodes[i].paused {
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
    pub async fn status(&self, i: usize) -> anyhow::Result<NodeStatus> {
        call(self.client(i).get::<NodeStatus>("/v1/status")).await
    }

    /// Node `i`'s whole journal, paged through `GET /v1/events`.
    ///
    /// # Errors
    /// If a page cannot be read, or the journal has more than
    /// [`JOURNAL_PAGES_MAX`] pages.
    pub async fn journal(&self, i: usize) -> anyhow::Result<Vec<EventEntry>> {
        read_journal(self.client(i)).await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                // SIGKILL works on a stopped process too.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Runs an API call with [`CALL_TIMEOUT`].
///
/// # Errors
/// The call's error, or a timeout.
pub async fn call<T>(
    f: impl Future<Output = Result<T, mesh_api::client::ClientError>>,
) -> anyhow::Result<T> {
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
            let path = if self.after.is_empty() {
                format!("/v1/events?limit={JOURNAL_PAGE_LIMIT}")
            } else {
                format!("/v1/events?limit={JOURNAL_PAGE_LIMIT}&after={}", self.after)
            };
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
    const TAIL_LINES: usize = 30;
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Creates `path`'s file for writing, with its parent dirs.
///
/// # Errors
/// If it cannot be created.
pub fn create_file(path: &Path) -> anyhow::Result<File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    File::create(path).with_context(|| format!("cannot create {}", path.display()))
}
