//! A cluster of real `mesh daemon` processes, linked in a full mesh, on
//! `mesh_cluster`'s launcher.
//!
//! Each node has its own data dir (in one temp dir) and socket. As root the
//! nodes run in network namespaces ([`Netns`]) and listen on
//! `10.213.0.(10+I)`; otherwise they listen on `127.0.0.1`. Which port a
//! restarted node listens on is [`ClusterConfig::restart_port`]'s: the one
//! its first start picked (found where its peers' tickets say), or a new
//! one its peers must learn. The cluster kills every daemon it started when
//! dropped.

use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use mesh_api::{EventEntry, NodeStatus};
use mesh_cluster::{Placement, Stopped};

pub use mesh_cluster::RestartPort;

use crate::netns::{self, Netns};

pub use mesh_cluster::{CALL_TIMEOUT, JournalTail, STOP_TIMEOUT, call, log_tail, read_journal};

/// The peer port every node listens on inside its own namespace.
pub const NETNS_PEER_PORT: u16 = 4919;

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
    /// Which port a restarted node listens on.
    pub restart_port: RestartPort,
}

impl ClusterConfig {
    /// `nodes` nodes of `bin`, namespaces when possible, logs at `info`
    /// (`CHAOS_RUST_LOG` overrides it).
    pub fn new(bin: impl Into<PathBuf>, nodes: usize) -> Self {
        ClusterConfig {
            bin: bin.into(),
            nodes,
            isolation: Isolation::Auto,
            log_dir: None,
            rust_log: std::env::var("CHAOS_RUST_LOG").unwrap_or_else(|_| "info".into()),
            daemon_config: None,
            data_dirs: Default::default(),
            restart_port: RestartPort::Kept,
        }
    }
}

/// N linked daemons, in namespaces when it can. Dropping it kills them all
/// (and then removes the namespaces). The node operations are
/// [`mesh_cluster::Cluster`]'s.
#[derive(Debug)]
pub struct Cluster {
    // Declared (so dropped) before `net`: the daemons die before their namespaces.
    inner: mesh_cluster::Cluster,
    net: Option<Netns>,
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
        let port = match cfg.restart_port {
            RestartPort::Kept => NETNS_PEER_PORT,
            RestartPort::Remembered | RestartPort::Fresh => 0,
        };
        let placements = match &net {
            Some(n) => (0..cfg.nodes)
                .map(|i| Placement {
                    bind: SocketAddr::new(IpAddr::V4(n.node_ip(i)), port),
                    prefix: ["ip", "netns", "exec", n.node_ns(i)]
                        .map(Into::into)
                        .to_vec(),
                    restart_port: cfg.restart_port,
                })
                .collect(),
            None => (0..cfg.nodes)
                .map(|_| Placement {
                    restart_port: cfg.restart_port,
                    ..Placement::default()
                })
                .collect(),
        };
        let mut launch = mesh_cluster::ClusterConfig::new(cfg.bin, cfg.nodes);
        launch.log_dir = cfg.log_dir;
        launch.rust_log = cfg.rust_log;
        launch.daemon_config = cfg.daemon_config;
        launch.data_dirs = cfg.data_dirs;
        launch.placements = placements;
        let inner = mesh_cluster::Cluster::start(launch).await?;
        Ok(Cluster { inner, net })
    }

    /// The namespaces, when the cluster runs in them.
    pub fn netns(&self) -> Option<&Netns> {
        self.net.as_ref()
    }

    /// SIGTERM node `i` (resuming it first if paused) and waits for it to
    /// exit; kills it if it takes longer than [`STOP_TIMEOUT`].
    ///
    /// # Errors
    /// If it cannot be signalled.
    pub async fn stop(&mut self, i: usize) -> anyhow::Result<()> {
        if self.inner.stop(i).await? == Stopped::Killed {
            eprintln!("chaos: node {i} did not stop on SIGTERM within {STOP_TIMEOUT:?}; killed it");
        }
        Ok(())
    }

    /// Heals the network, resumes paused nodes and restarts stopped ones.
    ///
    /// # Errors
    /// If a node cannot be resumed or restarted, or the network healed.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        if let Some(net) = &self.net {
            net.heal()?;
        }
        self.inner.heal_all().await
    }

    /// Node `i`'s status.
    ///
    /// # Errors
    /// If the call fails or takes longer than [`CALL_TIMEOUT`].
    pub async fn status(&self, i: usize) -> anyhow::Result<NodeStatus> {
        Ok(self.inner.status(i).await?.node)
    }
}

impl Deref for Cluster {
    type Target = mesh_cluster::Cluster;

    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

/// Writes node `i`'s journal to `dir/journal-node-I.jsonl`, one entry a line.
///
/// # Errors
/// If the file cannot be written.
pub fn write_journal(dir: &Path, i: usize, journal: &[EventEntry]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(create_file(&dir.join(format!("journal-node-{i}.jsonl")))?);
    for e in journal {
        serde_json::to_writer(&mut f, e)?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(())
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
