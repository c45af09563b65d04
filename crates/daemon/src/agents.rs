//! The daemon's agents: their keys (one file each in the data dir, mode
//! 0600), who may act as each (a uid), and whether each is online.
//!
//! An agent acts through its own socket (`api::agent_socket`); the
//! registry is what that socket checks a caller against. Whether an agent
//! is online is decided here and announced by signing a new card with the
//! agent's key: online while a connection to its socket is open or it made
//! a request in the last [`AGENT_ONLINE_MS`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesh_protocol::{AgentCard, AgentName, NodeId, SecretKey};
use mesh_store::AgentRecord;

use crate::bus::{Bus, NodeError, load_or_create_key, store_key};

/// How long after its last request an agent counts as online.
pub const AGENT_ONLINE_MS: u64 = 60_000;

/// How often agents' online state is looked at (a change is announced at once
/// when a connection opens; going offline waits for this tick).
pub const PRESENCE_TICK: Duration = Duration::from_secs(5);

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What an agent's socket counts of its use.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Connections open now.
    open: AtomicUsize,
    /// The last request, ms since the Unix epoch.
    last_ms: AtomicU64,
    /// The online state last announced.
    announced_online: AtomicBool,
}

/// Holds one connection of an agent's socket open in its [`Activity`].
#[derive(Debug)]
pub(crate) struct OpenGuard(Arc<Activity>);

impl Activity {
    /// A connection opened: counted until the guard is dropped.
    pub(crate) fn open(self: &Arc<Self>) -> OpenGuard {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.touch();
        OpenGuard(self.clone())
    }

    /// A request came.
    pub(crate) fn touch(&self) {
        self.last_ms.store(now_ms(), Ordering::Relaxed);
    }

    fn online(&self, now_ms: u64) -> bool {
        self.open.load(Ordering::Relaxed) > 0
            || now_ms.saturating_sub(self.last_ms.load(Ordering::Relaxed)) < AGENT_ONLINE_MS
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// One agent of this node.
#[derive(Debug)]
pub(crate) struct Agent {
    pub(crate) record: AgentRecord,
    secret: SecretKey,
    pub(crate) activity: Arc<Activity>,
    /// Turns true when the agent is removed: its waits and subscriptions end.
    removed: tokio::sync::watch::Sender<bool>,
    /// The node it moved to, once a move notice of its key names another
    /// node than this one: it no longer acts here (no sends, no cards).
    moved_to: std::sync::Mutex<Option<NodeId>>,
    /// A pump passes its previous inbox on (`crate::drain`).
    pub(crate) draining: AtomicBool,
    /// The last inbox entry this node handed to the agent in this run of
    /// the daemon (an unfiltered inbox page, or its subscription), or 0:
    /// where a move without `--after` starts passing its inbox on.
    pub(crate) served: AtomicU64,
    /// A write of [`Agent::served`] to the store is under way.
    pub(crate) served_writing: AtomicBool,
}

impl Agent {
    /// The node it moved to, if it moved away from this one.
    pub(crate) fn moved_to(&self) -> Option<NodeId> {
        *self.moved_to.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its secret key (for its export).
    pub(crate) fn secret(&self) -> &SecretKey {
        &self.secret
    }

    /// A watch that turns true when the agent is removed.
    pub(crate) fn removed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.removed.subscribe()
    }

    /// A card of the agent on `node`, signed now.
    fn card(&self, node: NodeId, online: bool) -> AgentCard {
        AgentCard::sign(
            &self.secret,
            node,
            self.record.name.clone(),
            online,
            now_ms(),
        )
    }
}

/// This node's agents, by name, as the sockets and routes see them.
#[derive(Debug)]
pub(crate) struct Registry {
    node: NodeId,
    keys_dir: PathBuf,
    agents: RwLock<BTreeMap<AgentName, Arc<Agent>>>,
    /// Woken by an ack: the receipt pump looks at once (`crate::receipts`).
    pub(crate) acked: tokio::sync::Notify,
}

/// Why an agent's key could not be made or read.
#[derive(Debug, thiserror::Error)]
#[error("the key of agent {name}: {source}")]
pub(crate) struct KeyError {
    name: AgentName,
    #[source]
    source: NodeError,
}

impl Registry {
    /// A registry of node `node`, keeping keys in `keys_dir`.
    pub(crate) fn new(node: NodeId, keys_dir: PathBuf) -> Registry {
        Registry {
            node,
            keys_dir,
            agents: RwLock::new(BTreeMap::new()),
            acked: tokio::sync::Notify::new(),
        }
    }

    /// The agent's key file name.
    fn key_file(name: &AgentName) -> String {
        format!("{name}.key")
    }

    /// Loads (or makes) the key of `name`: blocking file IO.
    pub(crate) fn key(&self, name: &AgentName) -> Result<SecretKey, KeyError> {
        create_private_dir(&self.keys_dir).map_err(|e| KeyError {
            name: name.clone(),
            source: NodeError::Store(mesh_store::StoreError::Unavailable(format!(
                "cannot create {}: {e}",
                self.keys_dir.display()
            ))),
        })?;
        load_or_create_key(&self.keys_dir, &Self::key_file(name)).map_err(|e| KeyError {
            name: name.clone(),
            source: NodeError::Net(e),
        })
    }

    /// Keeps `secret` as the key of `name` (an imported agent): blocking
    /// file IO; refused if another key of that name is there.
    pub(crate) fn import_key(&self, name: &AgentName, secret: &SecretKey) -> Result<(), KeyError> {
        let err = |source| KeyError {
            name: name.clone(),
            source,
        };
        create_private_dir(&self.keys_dir).map_err(|e| {
            err(NodeError::Store(mesh_store::StoreError::Unavailable(
                format!("cannot create {}: {e}", self.keys_dir.display()),
            )))
        })?;
        store_key(&self.keys_dir, &Self::key_file(name), secret).map_err(|e| err(NodeError::Net(e)))
    }

    /// Marks each agent whose key `moves` places on another node as moved
    /// there; returns the agents newly marked.
    pub(crate) fn note_moves(&self, moves: &[mesh_protocol::AgentMove]) -> Vec<Arc<Agent>> {
        let mut newly = Vec::new();
        for agent in self.all() {
            let away = moves
                .iter()
                .find(|m| m.key == agent.record.key && m.node != self.node)
                .map(|m| m.node);
            let mut slot = agent.moved_to.lock().unwrap_or_else(|p| p.into_inner());
            if away.is_some() && slot.is_none() {
                newly.push(agent.clone());
            }
            *slot = away;
        }
        newly
    }

    /// Removes the key file of `name` (the agent is gone).
    pub(crate) fn forget_key(&self, name: &AgentName) {
        let path = self.keys_dir.join(Self::key_file(name));
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), "cannot remove an agent's key: {e}");
        }
    }

    /// Adds (or replaces) an agent with its key.
    pub(crate) fn insert(&self, record: AgentRecord, secret: SecretKey) -> Arc<Agent> {
        let agent = Arc::new(Agent {
            record,
            secret,
            activity: Arc::new(Activity::default()),
            removed: tokio::sync::watch::Sender::new(false),
            moved_to: std::sync::Mutex::new(None),
            draining: AtomicBool::new(false),
            served: AtomicU64::new(0),
            served_writing: AtomicBool::new(false),
        });
        self.write()
            .insert(agent.record.name.clone(), agent.clone());
        agent
    }

    /// Removes an agent; its waits and subscriptions end.
    pub(crate) fn remove(&self, name: &AgentName) -> Option<Arc<Agent>> {
        let agent = self.write().remove(name);
        if let Some(a) = &agent {
            a.removed.send_replace(true);
        }
        agent
    }

    /// The agent `name`, if this node hosts it.
    pub(crate) fn get(&self, name: &AgentName) -> Option<Arc<Agent>> {
        self.read().get(name).cloned()
    }

    /// Every agent, by name.
    pub(crate) fn all(&self) -> Vec<Arc<Agent>> {
        self.read().values().cloned().collect()
    }

    /// How many agents.
    pub(crate) fn len(&self) -> usize {
        self.read().len()
    }

    /// A card of `agent` with its online state now, and whether that state
    /// differs from the one last announced (it is then the announced one).
    pub(crate) fn card_if_changed(&self, agent: &Agent, force: bool) -> Option<AgentCard> {
        let online = agent.activity.online(now_ms());
        let was = agent
            .activity
            .announced_online
            .swap(online, Ordering::Relaxed);
        (force || was != online).then(|| agent.card(self.node, online))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<AgentName, Arc<Agent>>> {
        // The map is replaced whole under the lock: never half-written.
        self.agents.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<AgentName, Arc<Agent>>> {
        self.agents.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Announces every agent whose online state changed (all of them with
/// `force`), signing a new card for each.
pub(crate) async fn announce(registry: &Registry, bus: &Bus, force: bool) {
    for agent in registry
        .all()
        .into_iter()
        .filter(|a| a.moved_to().is_none())
    {
        if let Some(card) = registry.card_if_changed(&agent, force)
            && let Err(e) = bus.announce_agent(card).await
        {
            tracing::debug!("agent card not announced: {e}");
            return;
        }
    }
}

/// Marks the agents that `moves` places on another node as moved there
/// (they no longer act here), saying so once for each.
pub(crate) fn note_moves(registry: &Registry, moves: &[mesh_protocol::AgentMove]) {
    for agent in registry.note_moves(moves) {
        tracing::info!(
            agent = %agent.record.name,
            to = %agent.moved_to().map(|n| n.fmt_short().to_string()).unwrap_or_default(),
            "agent moved to another node: it no longer acts here"
        );
    }
}

/// Creates `dir` (and parents) with mode 0700 if it is missing.
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
