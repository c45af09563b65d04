//! Each agent's own socket, `<socket_dir>/NAME.sock`, and the check that
//! whoever uses it is that agent.
//!
//! Who a caller is comes from what another local process cannot copy out
//! of a request: the socket it connected to (one per agent) and its uid,
//! which the kernel reports (SO_PEERCRED). The uid must be the one the
//! agent was added with; root is no exception (root acts as an agent only
//! if the agent was added for uid 0). A request on an agent's socket that
//! names another agent (in its path, or in the `x-mesh-agent` header) is
//! refused the same way. Every refusal is 403 `unverified_sender` and
//! writes nothing. The socket is mode 0666 and its dir must be one the
//! agent's uid can enter (`[agents] socket_dir`): the kernel's uid, not
//! the file's mode, decides.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use mesh_api::AGENT_HEADER;
use mesh_protocol::AgentName;

use super::socket::{ApiSocket, BindError, Bounded, Peer};
use super::{ApiError, ApiState, CallerError};
use crate::agents::Agent;

/// One agent's socket server: stopped when the agent is removed or the
/// daemon stops.
pub(crate) struct AgentServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// The agent a request on its socket acts as, once checked.
#[derive(Clone, Debug)]
pub(crate) struct Acting(pub(crate) AgentName);

impl ApiState {
    /// The socket of agent `name`.
    pub(crate) fn agent_socket_path(&self, name: &AgentName) -> PathBuf {
        mesh_api::agent_socket_in(&self.inner.agent_socket_dir, name.as_str())
    }

    /// Binds and serves `agent`'s socket (replacing a server it had).
    pub(crate) async fn start_agent_server(
        &self,
        agent: &Arc<Agent>,
    ) -> Result<PathBuf, BindError> {
        let name = agent.record.name.clone();
        self.stop_agent_server(&name).await;
        let dir = &self.inner.agent_socket_dir;
        make_socket_dir(dir, self.inner.agent_sockets_private).map_err(|source| BindError::Io {
            path: dir.clone(),
            source,
        })?;
        let path = self.agent_socket_path(&name);
        let ApiSocket {
            listener,
            path,
            ino,
        } = ApiSocket::bind_agent(&path).await?;
        let app = self
            .agent_router(name.clone())
            .layer(axum::middleware::from_fn(super::gate::admit))
            .into_make_service_with_connect_info::<Peer>();
        let listener = Bounded {
            listener,
            gate: super::gate::Gate::new(self.inner.timeouts),
            abort: self.inner.abort.subscribe(),
            activity: Some(agent.activity.clone()),
        };
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut closing = self.inner.closing.subscribe();
        let socket = path.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                tokio::select! {
                    _ = stop_rx => {}
                    _ = closing.wait_for(|c| *c) => {}
                }
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::warn!(socket = %socket.display(), "an agent socket stopped with an error: {e}");
            }
            ApiSocket::remove_file(&socket, ino);
        });
        let server = AgentServer {
            stop: Some(stop),
            task,
        };
        self.servers().insert(name, server);
        tracing::info!(socket = %path.display(), "agent socket listening");
        Ok(path)
    }

    /// Stops agent `name`'s socket server and removes its socket.
    pub(crate) async fn stop_agent_server(&self, name: &AgentName) {
        let server = self.servers().remove(name);
        if let Some(mut s) = server {
            if let Some(stop) = s.stop.take() {
                let _ = stop.send(());
            }
            // It ends once its connections have; one that does not within
            // the grace period ends in the background (its socket file is
            // unbound already, and a new server of the name replaces it).
            let _ = tokio::time::timeout(super::SHUTDOWN_GRACE, &mut s.task).await;
        }
    }

    /// Stops every agent's socket server.
    pub(super) async fn stop_agent_servers(&self) {
        let names: Vec<AgentName> = self.servers().keys().cloned().collect();
        for name in names {
            self.stop_agent_server(&name).await;
        }
    }

    fn servers(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<AgentName, AgentServer>> {
        // A server is inserted or removed whole under the lock.
        self.inner
            .agent_servers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves the socket of every agent in the registry.
///
/// # Errors
/// The first socket that cannot be bound.
pub(crate) async fn start_agent_servers(st: &ApiState) -> Result<(), BindError> {
    for agent in st.inner.registry.all() {
        st.start_agent_server(&agent).await?;
    }
    Ok(())
}

/// Creates the socket dir if it is missing: 0700 inside the data dir,
/// 0711 elsewhere (other uids may enter it, not list it).
fn make_socket_dir(dir: &Path, private: bool) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(if private { 0o700 } else { 0o711 })
        .create(dir)
}

/// Lets a request through only if its caller is the socket's agent: the
/// agent exists, the caller's uid is the agent's, and the request names
/// no other agent.
pub(super) async fn authorize_agent(
    State((st, name)): State<(ApiState, AgentName)>,
    mut req: Request,
    next: Next,
) -> Response {
    let cred = req
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.cred);
    let uid = cred.and_then(|c| c.uid);
    let agent = st.inner.registry.get(&name);
    if agent.is_none()
        && let Some(to) = moved_away(&st, &name)
    {
        // Its drain here ended: it is gone from here, but the mesh knows where.
        st.inner
            .counters
            .refused_agent
            .fetch_add(1, Ordering::Relaxed);
        return ApiError::from(CallerError::AgentMoved(format!(
            "agent {name} moved to node {to}; it acts only there now"
        )))
        .into_response();
    }
    let why = match (&agent, uid) {
        (None, _) => Some(format!(
            "there is no agent {name} on this node (it was removed)"
        )),
        (Some(_), None) => Some("the socket would not say who is connected".to_owned()),
        (Some(a), Some(uid)) if uid != a.record.uid => Some(format!(
            "uid {uid} may not act as agent {name}; only uid {} may",
            a.record.uid
        )),
        _ => named_other(&req, &name),
    };
    if let Some(why) = why {
        st.inner
            .counters
            .refused_agent
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(agent = %name, ?uid, pid = ?cred.and_then(|c| c.pid), path = %req.uri().path(), "refused an agent request: {why}");
        return ApiError::from(CallerError::UnverifiedSender(why)).into_response();
    }
    if let Some(a) = agent {
        a.activity.touch();
    }
    if let Some(cred) = cred {
        req.extensions_mut().insert(cred);
    }
    req.extensions_mut().insert(Acting(name));
    next.run(req).await
}

/// The node the agent `name` moved to from this one, by the move notice
/// this node holds of it, if it left.
fn moved_away(st: &ApiState, name: &AgentName) -> Option<mesh_protocol::NodeId> {
    let me = st.inner.node;
    st.inner
        .bus
        .agent_moves()
        .borrow()
        .iter()
        .find(|m| &m.name == name && m.from == me && m.node != me)
        .map(|m| m.node)
}

/// Why `req` on `name`'s socket names another agent, if it does.
fn named_other(req: &Request, name: &AgentName) -> Option<String> {
    if let Some(h) = req.headers().get(AGENT_HEADER) {
        let claimed = h.to_str().unwrap_or("");
        if claimed != name.as_str() {
            return Some(format!(
                "this socket is agent {name}'s; the request claims to be {:?}",
                super::routes::cut(claimed)
            ));
        }
    }
    let path = req.uri().path();
    if let Some(rest) = path.strip_prefix("/v1/agents/") {
        let named = rest.split('/').next().unwrap_or("");
        if !named.is_empty() && named != name.as_str() {
            return Some(format!(
                "this socket is agent {name}'s; the request is for agent {:?}",
                super::routes::cut(named)
            ));
        }
    }
    None
}
