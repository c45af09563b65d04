//! [`Daemon`]: one node (store, bus node and local API) that `mesh daemon`
//! and tests start and stop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mesh_api::{DataDir, DataDirError};
use mesh_protocol::{Epoch, NodeId, NodeTicket};
use mesh_store::{MeshStore, RedbStore, StoreError, StoreHandle};

use crate::agents::Registry;

use crate::api::{ApiParts, ApiSocket, ApiState, BindError};
use crate::bus::{Bus, CoreConfig, NetConfig, Node, NodeConfig, NodeError};
use crate::config::{Config, ConfigError};

/// How long [`Daemon::shutdown`] waits for the last reader of the store
/// (a subscription finishing a read or its loss record) to let go of it.
/// It returns as soon as the store is released; the bound only matters on a
/// machine so loaded that a blocking read waits seconds for a thread.
pub const STORE_RELEASE_WAIT: Duration = Duration::from_secs(30);

/// How often [`Daemon::shutdown`] looks whether the store is released.
const STORE_RELEASE_POLL: Duration = Duration::from_millis(10);

/// Why a daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The data dir could not be created.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// `config.toml` is unreadable or has a bad key or value.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store cannot be opened (held by another daemon, damaged, disk error).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The control socket cannot be bound (another daemon answers on it).
    #[error(transparent)]
    Socket(#[from] BindError),
    /// The node key cannot be used, the transport cannot bind, or the node
    /// cannot read its state.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The dashboard's token could not be drawn from the system's random source.
    #[error("cannot make the dashboard's token: {0}")]
    WebToken(std::io::Error),
}

/// A running node: its store, its bus node (iroh endpoint) and its local API
/// on `<data>/mesh.sock`.
///
/// [`Daemon::start`] brings it up; [`Daemon::shutdown`] stops the API (live
/// subscriptions end, requests in flight finish), then the node (commits
/// under way are answered), then the store, and returns once the store file
/// is closed, so the same data dir can be started again, in this process or
/// another. Dropping a daemon without [`Daemon::shutdown`] stops it in the
/// background, without waiting.
pub struct Daemon {
    dir: DataDir,
    config: Config,
    node: Arc<Node>,
    handle: StoreHandle<RedbStore>,
    store: Weak<RedbStore>,
    /// Counts 0 once the store's file is closed (see [`RedbStore::closed_watch`]).
    store_closed: Weak<()>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Announces agents going online and offline.
    presence: tokio::task::JoinHandle<()>,
    /// Sends this node's agents' read receipts (`[agents] read_receipts`).
    receipts: Option<crate::receipts::ReceiptPump>,
}

impl Daemon {
    /// Starts a node in `dir` (created with mode 0700 if missing), with its
    /// optional `config.toml`, listening for peers on `bind` (default: the
    /// config's `bind`).
    ///
    /// # Errors
    /// See [`StartError`]; a second daemon on the same dir is
    /// [`StartError::Store`] (the store's lock).
    pub async fn start(dir: DataDir, bind: Option<SocketAddr>) -> Result<Daemon, StartError> {
        dir.create()?;
        let config = Config::load(&dir.config_path())?;
        let bind = bind.unwrap_or(config.bind);
        let key = crate::bus::load_or_create_node_key(dir.root()).map_err(NodeError::from)?;
        // The store lock is what refuses a second daemon on the same data dir.
        let store = Arc::new(RedbStore::open(dir.root())?);
        let store_file = dir.root().join(mesh_store::STORE_FILE_NAME);
        let handle = StoreHandle::spawn(store.clone())?;
        let socket = ApiSocket::bind(&dir.socket_path()).await?;
        let port = read_port(&dir).or_else(|| card_port(&store, &key.public()));
        let node_config = node_config(&config, bind, port);
        let node = Arc::new(Node::start(node_config, key, handle.clone()).await?);
        remember_port(&dir, node.local_port());
        let bus = Bus::new(node.clone());
        let registry = Arc::new(Registry::new(node.node_id(), dir.agent_keys_dir()));
        let aliases = restore_agents(&store, &registry, &dir).await?;
        let agent_socket_dir = config
            .agents
            .socket_dir
            .clone()
            .unwrap_or_else(|| dir.agent_sockets_dir());
        let state = ApiState::new(ApiParts {
            bus: bus.clone(),
            store: store.clone(),
            store_file,
            subscriber_buffer: config.api.subscriber_buffer,
            subscriber_buffer_bytes: config.api.subscriber_buffer_bytes,
            subscriber_stall: Duration::from_millis(config.api.subscriber_stall_ms),
            registry: registry.clone(),
            agent_sockets_private: agent_socket_dir.starts_with(dir.root()),
            agent_socket_dir,
            aliases,
            topic_bounds: (config.topics.max_msgs, config.topics.max_bytes),
            journal_bytes_max: config.journal.max_bytes,
            web: crate::api::Web::new(config.web).map_err(StartError::WebToken)?,
            timeouts: crate::api::Timeouts {
                head: Duration::from_millis(config.api.request_head_timeout_ms),
                idle: Duration::from_millis(config.api.idle_timeout_ms),
            },
        });
        if crate::api::web_on_at_start(&config.web) {
            // The dashboard is for looking; a port it cannot have is said
            // in the log, and `mesh web` says it again.
            if let Err(e) = state.open_web().await {
                tracing::warn!("{e}");
            }
        }
        join_configured_topics(&bus, &config).await?;
        crate::agents::note_moves(&registry, &bus.agent_moves().borrow());
        let drain_days = config.agents.drain_days;
        crate::drain::start_pumps(&registry, &store, &bus, drain_days);
        crate::api::start_agent_servers(&state).await?;
        // Agents peers move here over the mesh; the task ends with the node.
        if let Some(offers) = bus.take_move_offers() {
            drop(crate::api::serve_moves(state.clone(), offers));
        }
        crate::agents::announce(&registry, &bus, true).await;
        let receipts = config.agents.read_receipts.then(|| {
            crate::receipts::ReceiptPump::start(registry.clone(), store.clone(), bus.clone())
        });
        let presence = spawn_presence(registry, bus, (store.clone(), drain_days));
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(crate::api::serve(socket, state, async move {
            let _ = stop_rx.await;
        }));
        Ok(Daemon {
            dir,
            config,
            node,
            handle,
            store: Arc::downgrade(&store),
            store_closed: store.closed_watch(),
            stop,
            server,
            presence,
            receipts,
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node.node_id()
    }

    /// This node's store epoch now (a new one if its store was found to
    /// have gone back in time).
    pub fn epoch(&self) -> Epoch {
        self.node.epoch()
    }

    /// A ticket other nodes pass to `mesh peer add`.
    pub fn ticket(&self) -> NodeTicket {
        self.node.ticket()
    }

    /// The data dir.
    pub fn dir(&self) -> &DataDir {
        &self.dir
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The control socket.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.socket_path()
    }

    /// Stops the API, then the node, then the store; returns once the store
    /// file is closed (or after [`STORE_RELEASE_WAIT`], with a warning, if a
    /// reader still holds it).
    pub async fn shutdown(self) {
        let Daemon {
            dir,
            node,
            handle,
            store,
            store_closed,
            stop,
            server,
            presence,
            receipts,
            ..
        } = self;
        presence.abort();
        let _ = stop.send(());
        match server.await {
            Ok(Err(e)) => tracing::warn!("local API stopped with an error: {e}"),
            Err(e) => tracing::warn!("local API task failed: {e}"),
            Ok(Ok(())) => {}
        }
        // Awaited while the node still answers its sends, and before the
        // store is closed: the pump holds the store.
        if let Some(pump) = receipts {
            pump.stop().await;
        }
        node.shutdown().await;
        drop(node);
        handle.close().await;
        wait_released(&store, &store_closed, dir.root()).await;
    }
}

/// The bus node's settings from `config`, listening on `bind` and preferring
/// `port`, the one this data dir's node had last.
fn node_config(config: &Config, bind: SocketAddr, port: Option<u16>) -> NodeConfig {
    NodeConfig {
        net: NetConfig {
            preferred_port: port,
            relays: config.relays(),
            mdns: config.discovery.mdns.mode(),
            ..NetConfig::with_bind_addr(bind)
        },
        core: CoreConfig {
            outbox: config.outbox.bounds(),
            dedup_window_ms: config.api.dedup_window_ms(),
            hold_ms: config.store.hold_ms,
            hold_msgs_max: config.store.hold_max_msgs,
            hold_bytes_max: config.store.hold_max_bytes,
            journal_bytes_max: config.journal.max_bytes,
            journal_age_ms_max: config.journal.max_age,
            ..Default::default()
        },
        name: config.node_name(),
    }
}

/// Puts the store's agents, with their keys from `dir`, into `registry`,
/// and returns the store's node aliases.
///
/// # Errors
/// The store cannot be read, a key file cannot be read, or a key file does
/// not hold its agent's key ([`StoreError::Corrupt`]).
async fn restore_agents(
    store: &Arc<RedbStore>,
    registry: &Arc<Registry>,
    dir: &DataDir,
) -> Result<Vec<(String, NodeId)>, StartError> {
    let (records, aliases) = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || {
            Ok::<_, StoreError>((store.agents()?, store.aliases()?))
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("store read task failed: {e}")))??
    };
    for record in records {
        let r = registry.clone();
        let name = record.name.clone();
        let secret = tokio::task::spawn_blocking(move || r.key(&name))
            .await
            .map_err(|e| StoreError::Unavailable(format!("key task failed: {e}")))?
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        if secret.public() != record.key {
            return Err(StoreError::Corrupt {
                path: dir.agent_keys_dir().display().to_string(),
                why: format!("agent {}'s key file does not hold its key", record.name),
            }
            .into());
        }
        registry.insert(record, secret);
    }
    Ok(aliases)
}

/// Joins the topics `[topics] join` lists that this node is not a member
/// of yet, with the configured bounds.
///
/// # Errors
/// The store cannot write a join.
async fn join_configured_topics(bus: &Bus, config: &Config) -> Result<(), StartError> {
    let status = bus.status().await.map_err(StartError::from)?;
    for name in &config.topics.join {
        // Checked when the config was read.
        let Ok(name) = mesh_protocol::TopicName::new(name) else {
            continue;
        };
        if status.topics.iter().any(|t| t.record.name == name) {
            continue;
        }
        let record = mesh_store::TopicRecord {
            name,
            joined_ms: crate::agents::now_ms(),
            max_msgs: config.topics.max_msgs,
            max_bytes: config.topics.max_bytes,
        };
        bus.join_topic(record).await.map_err(StartError::from)?;
    }
    Ok(())
}

/// Every presence tick, announces the agents whose card changed; and as
/// soon as a move notice is taken, marks the agents that moved away.
/// Until aborted.
fn spawn_presence(
    registry: Arc<Registry>,
    bus: Bus,
    (store, drain_days): (Arc<RedbStore>, u64),
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut moves = bus.agent_moves();
        loop {
            tokio::select! {
                () = tokio::time::sleep(crate::agents::PRESENCE_TICK) => {}
                changed = moves.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let held = moves.borrow_and_update().clone();
                    crate::agents::note_moves(&registry, &held);
                    crate::drain::start_pumps(&registry, &store, &bus, drain_days);
                }
            }
            crate::agents::announce(&registry, &bus, false).await;
        }
    })
}

/// The port this node listened on before, if it remembered one.
fn read_port(dir: &DataDir) -> Option<u16> {
    let text = std::fs::read_to_string(dir.listen_port_path()).ok()?;
    match text.trim().parse::<u16>() {
        Ok(0) | Err(_) => {
            tracing::warn!(file = %dir.listen_port_path().display(), "ignoring a remembered port that is not a port");
            None
        }
        Ok(port) => Some(port),
    }
}

/// The port in this node's own card as the store holds it: where its peers
/// last learned to dial it. A data dir written before the port was
/// remembered in a file (or one whose file was lost) has none, and its
/// node, started on a new port, would be out of reach of every peer that
/// only knows the old one (on a LAN without mDNS, or on loopback); asking
/// for the card's port first carries on where it stopped.
fn card_port(store: &RedbStore, me: &NodeId) -> Option<u16> {
    let cards = match store.cards() {
        Ok(cards) => cards,
        Err(e) => {
            tracing::warn!("cannot read this node's card for its last port: {e}");
            return None;
        }
    };
    let port = cards
        .iter()
        .find(|c| c.node == *me)?
        .addrs
        .iter()
        .map(SocketAddr::port)
        .find(|p| *p != 0)?;
    tracing::info!(
        port,
        "no remembered listen port; asking for the one in this node's last card"
    );
    Some(port)
}

/// Remembers `port` for the next start (written whole: a temp file
/// renamed into place, then the dir synced). A failure only costs the next
/// start its port, so it is logged, not fatal.
fn remember_port(dir: &DataDir, port: u16) {
    if port == 0 || read_port(dir) == Some(port) {
        return;
    }
    let path = dir.listen_port_path();
    let tmp = path.with_extension("tmp");
    let written = std::fs::write(&tmp, format!("{port}\n"))
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| std::fs::File::open(dir.root())?.sync_all());
    if let Err(e) = written {
        tracing::warn!(file = %path.display(), error = %e, "cannot remember the listen port; the next start may pick another");
    }
}

/// Waits (at most [`STORE_RELEASE_WAIT`]) until nothing holds the store
/// and its file is closed and unlocked: the store's own count falls to 0
/// as its last holder starts dropping it, on that holder's thread, before
/// the file is closed; `closed` falls to 0 only after (a restart in the same
/// process that looked at the first alone could find the file still open).
async fn wait_released(store: &Weak<RedbStore>, closed: &Weak<()>, root: &Path) {
    let polls = STORE_RELEASE_WAIT.as_millis() / STORE_RELEASE_POLL.as_millis();
    for _ in 0..polls {
        if store.strong_count() == 0 && closed.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(STORE_RELEASE_POLL).await;
    }
    tracing::warn!(
        data = %root.display(),
        "the store is still held {STORE_RELEASE_WAIT:?} after shutdown; it closes when its last reader finishes"
    );
}
