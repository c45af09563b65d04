//! Child daemons: started, linked, stopped and restarted on the same port,
//! and always killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use tokio::time::Instant;

use super::PARENT_ENV;
use super::measure::TempDir;
use mesh_api::client::{Client, ClientError};
use mesh_api::{AddPeerRequest, TicketResponse};
use mesh_api::{NodeStatus, PeerStatus};

/// How often a starting or stopping daemon is looked at.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long a daemon has to answer on its socket after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon has to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the nodes have to connect to each other after being linked.
const LINK_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of a daemon's log shown when it fails.
const LOG_TAIL_BYTES: usize = 2000;

/// `GET /v1/status` with the journal head the API adds.
#[derive(Clone, Debug, Deserialize)]
pub(super) struct StatusView {
    #[serde(flatten)]
    pub(super) node: NodeStatus,
    pub(super) journal_head: u64,
}

impl StatusView {
    /// The peer `id` as this node sees it.
    pub(super) fn peer(&self, id: &str) -> Option<&PeerStatus> {
        self.node.peers.iter().find(|p| p.node == id)
    }

    /// This node's mark of the stream `author` (at `epoch`) writes to `me`.
    pub(super) fn mark_from(&self, author: &str, epoch: &str) -> u64 {
        let channel = format!("direct:{}", self.node.node);
        self.peer(author)
            .into_iter()
            .flat_map(|p| p.marks.iter())
            .filter(|m| {
                m.stream.author == author && m.stream.epoch == epoch && m.stream.channel == channel
            })
            .map(|m| m.mark)
            .max()
            .unwrap_or(0)
    }
}

/// One child daemon.
pub(super) struct Daemon {
    pub(super) name: String,
    pub(super) dir: PathBuf,
    bin: PathBuf,
    /// The UDP port it binds (0 before the first start; kept for restarts).
    port: u16,
    child: Option<Child>,
    pub(super) client: Client,
    pub(super) id: String,
    pub(super) epoch: String,
    log: PathBuf,
}

impl Daemon {
    fn new(bin: &Path, base: &Path, name: String) -> Daemon {
        let dir = base.join(&name);
        Daemon {
            client: Client::new(dir.join("mesh.sock")),
            log: base.join(format!("{name}.log")),
            name,
            dir,
            bin: bin.to_owned(),
            port: 0,
            child: None,
            id: String::new(),
            epoch: String::new(),
        }
    }

    /// The running process's id.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(super) fn socket(&self) -> &Path {
        self.client.socket()
    }

    /// Starts the process (it answers on its socket later: see [`Daemon::ready`]).
    pub(super) fn spawn(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("{} is already running", self.name);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let level = std::env::var("MESH_BENCH_LOG").unwrap_or_else(|_| "warn".into());
        let child = Command::new(&self.bin)
            .arg("daemon")
            .arg("--data")
            .arg(&self.dir)
            .arg("--bind")
            .arg(format!("127.0.0.1:{}", self.port))
            .env("RUST_LOG", level)
            .env(PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {} daemon", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the daemon answers on its socket; learns its id, epoch and port.
    pub(super) async fn ready(&mut self) -> anyhow::Result<StatusView> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "{} exited ({status}) before it answered; the end of its log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            match self.client.get::<StatusView>("/v1/status").await {
                Ok(st) => {
                    self.id = st.node.node.clone();
                    self.epoch = st.node.epoch.clone();
                    if let Some(a) = st.node.addrs.iter().find(|a| a.port() != 0) {
                        self.port = a.port();
                    }
                    return Ok(st);
                }
                Err(ClientError::NotRunning { .. } | ClientError::Connect { .. }) => {}
                Err(e) => return Err(e).with_context(|| format!("{} status", self.name)),
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer on its socket within {START_TIMEOUT:?}; the end of its log:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Stops the daemon with SIGTERM (SIGKILL after [`STOP_TIMEOUT`]) and
    /// waits until it has exited.
    pub(super) async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = i32::try_from(child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                child.wait()?;
                bail!("{} did not stop within {STOP_TIMEOUT:?}; killed", self.name);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Its status, through the API.
    pub(super) async fn status(&self) -> anyhow::Result<StatusView> {
        self.client
            .get::<StatusView>("/v1/status")
            .await
            .with_context(|| format!("{} status", self.name))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(LOG_TAIL_BYTES);
        String::from_utf8_lossy(&text[start..]).into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Daemons in a temp dir, every one linked with every other.
pub(super) struct Cluster {
    /// Declared before `base`: the daemons die before their files go.
    pub(super) nodes: Vec<Daemon>,
    base: TempDir,
}

impl Cluster {
    /// Starts `n` daemons of `bin` under a new temp dir in `parent`, links
    /// them pairwise and waits until every pair is connected.
    pub(super) async fn start(bin: &Path, parent: &Path, n: usize) -> anyhow::Result<Cluster> {
        let base = TempDir::new(parent)?;
        let mut cluster = Cluster {
            nodes: (0..n)
                .map(|i| Daemon::new(bin, base.path(), format!("node-{i}")))
                .collect(),
            base,
        };
        for d in &mut cluster.nodes {
            d.spawn()?;
        }
        for d in &mut cluster.nodes {
            d.ready().await?;
        }
        let mut tickets = Vec::new();
        for d in &cluster.nodes {
            let t: TicketResponse = d.client.get("/v1/ticket").await?;
            tickets.push(t.ticket);
        }
        for (i, d) in cluster.nodes.iter().enumerate() {
            for (j, ticket) in tickets.iter().enumerate() {
                if i != j {
                    let req = AddPeerRequest {
                        ticket: ticket.clone(),
                    };
                    let _: PeerStatus = d
                        .client
                        .post("/v1/peers", &req)
                        .await
                        .with_context(|| format!("linking node-{i} to node-{j}"))?;
                }
            }
        }
        cluster.wait_connected().await?;
        Ok(cluster)
    }

    pub(super) fn base(&self) -> &Path {
        self.base.path()
    }

    /// Waits until every running node sees every other running node connected.
    pub(super) async fn wait_connected(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + LINK_TIMEOUT;
        loop {
            let mut missing = Vec::new();
            for d in self.nodes.iter().filter(|d| d.pid().is_some()) {
                let st = d.status().await?;
                for other in self.nodes.iter().filter(|o| o.pid().is_some()) {
                    if other.id != d.id && !st.peer(&other.id).is_some_and(|p| p.connected) {
                        missing.push(format!("{}→{}", d.name, other.name));
                    }
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "not connected after {LINK_TIMEOUT:?}: {}",
                    missing.join(", ")
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}
