//! The local API: HTTP/1.1 + JSON (and Server-Sent Events) on the node's
//! Unix socket, `<data>/mesh.sock`.
//!
//! Every connection is checked with SO_PEERCRED: root and the daemon's own
//! uid may use the node, anyone else gets 403 and changes nothing. Errors are
//! `{"error": {"code", "fault", "message"}}` with the status of
//! [`ApiError::status`] (the classes are in [`error`]).
//!
//! Routes: `GET /v1/status`, `GET /v1/ticket`, `POST /v1/peers {ticket}`,
//! `GET /v1/peers`, `GET /v1/peers/nearby`, `DELETE /v1/peers/{id}`, `POST /v1/peers/{id}/pause`,
//! `POST /v1/peers/{id}/resume`, `PUT /v1/peers/{id}/alias`, `POST /v1/invites {uses, ttl_ms}`,
//! `GET /v1/invites`, `POST /v1/invites/{id}/revoke`, `POST /v1/join {code}`,
//! `POST /v1/send`,
//! `POST /v1/send/batch` (a JSON array, or NDJSON with
//! `Content-Type: application/x-ndjson`), `GET /v1/events?after=&limit=`,
//! `GET /v1/subscribe?after=` (SSE), `PUT`/`GET /v1/cursors/{name}`,
//! `POST`/`GET /v1/agents`, `DELETE /v1/agents/{name}`,
//! `GET /v1/messages/{id}`, `GET /metrics`; and an agent's own routes
//! (`agents`), served on its socket (`agent_socket`).
//!
//! Wiring (`Daemon::start`): build an `ApiState` from `ApiParts`, bind an
//! [`ApiSocket`], then `serve` until the shutdown future resolves. A send
//! goes route (`send`, `ndjson`) → `ApiState::submit` → the node's one
//! submit call (`crate::bus`).

mod agent_socket;
mod agents;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod gate;
mod invites;
mod json;
mod metrics;
mod ndjson;
mod peers;
mod resolve;
mod routes;
mod send;
mod socket;
mod subscribe;
mod topics;
mod web;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use mesh_protocol::{AgentName, Epoch, NodeId};
use mesh_store::{Arrival, RedbStore};
use tokio::sync::watch;
use tracing::Instrument as _;

use crate::agents::Registry;
use crate::bus::Bus;

pub(crate) use agent_socket::start_agent_servers;
pub(crate) use agents::serve_moves;

pub use agents::{
    INBOX_SCAN_ROWS_MAX, INBOX_WAIT_SECS_MAX, LOSS_SCAN_ENTRIES_MAX, THREAD_ANCESTORS_MAX,
    THREAD_BODY_BYTES_MAX, THREAD_ENTRIES_MAX, THREAD_SCAN_ROWS_MAX,
};
pub use error::{ApiError, Bug, CallerError, Capacity, ErrorKind, NotFound, Refused, Unavailable};
pub(crate) use gate::Timeouts;
pub use gate::{
    CONNECTIONS_MAX, CONNECTIONS_RESERVE, IDLE_TIMEOUT_MS_DEFAULT, PENDING_MAX,
    REQUEST_HEAD_TIMEOUT_MS_DEFAULT,
};
pub use socket::{ApiSocket, BindError, PeerCred, daemon_uid};
pub use web::{WEB_CONNECTIONS_MAX, WEB_PENDING_MAX};
pub(crate) use web::{Web, on_at_start as web_on_at_start};

/// The largest body of a plain JSON request (peers, cursors), in bytes.
pub const REQUEST_BYTES_MAX: usize = 64 * 1024;
/// The largest body of `POST /v1/send`, and of one NDJSON line, in bytes:
/// room for a 1 MiB payload written as base64 or escaped text.
pub const SEND_REQUEST_BYTES_MAX: usize = 4 << 20;
/// The largest body of a JSON-array `POST /v1/send/batch`, in bytes.
pub const BATCH_REQUEST_BYTES_MAX: usize = 16 << 20;
/// The most messages in one JSON-array batch.
pub const BATCH_MSGS_MAX: usize = 1024;
/// Entries per `GET /v1/events` page when `limit` is absent.
pub const EVENTS_LIMIT_DEFAULT: usize = 100;
/// The largest `limit` of `GET /v1/events`.
pub const EVENTS_LIMIT_MAX: usize = 1000;
/// Payload bytes after which a `GET /v1/events` page is cut short (its
/// `next` cursor then continues from there).
pub const EVENTS_PAGE_BYTES_MAX: usize = 8 << 20;
/// The longest named cursor, in bytes (the store's limit).
pub const CURSOR_NAME_BYTES_MAX: usize = mesh_store::CURSOR_NAME_BYTES_MAX;

/// What the API is built from.
pub(crate) struct ApiParts {
    /// The node: sends, peers, status, and the API's own durable writes.
    pub(crate) bus: Bus,
    /// Reads: journal pages, named cursors, marks.
    pub(crate) store: Arc<RedbStore>,
    /// The store's file, for its size in `GET /v1/status`.
    pub(crate) store_file: PathBuf,
    /// Journal entries buffered per live subscription (`[api] subscriber_buffer`).
    pub(crate) subscriber_buffer: usize,
    /// Bytes buffered per live subscription (`[api] subscriber_buffer_bytes`).
    pub(crate) subscriber_buffer_bytes: u64,
    /// How long a live subscriber may take nothing from its full buffer
    /// before it is lagged (`[api] subscriber_stall_ms`).
    pub(crate) subscriber_stall: Duration,
    /// This node's agents.
    pub(crate) registry: Arc<Registry>,
    /// Where the agents' sockets are.
    pub(crate) agent_socket_dir: PathBuf,
    /// Whether that dir is inside the data dir (mode 0700: only the
    /// daemon's uid and root can reach a socket there).
    pub(crate) agent_sockets_private: bool,
    /// The node aliases in the store.
    pub(crate) aliases: Vec<(String, NodeId)>,
    /// A topic's bounds when a join names none (`[topics]`): msgs, bytes.
    pub(crate) topic_bounds: (u64, u64),
    /// The journal's bound in bytes (`[journal] max_bytes`), for `GET /v1/status`.
    pub(crate) journal_bytes_max: u64,
    /// The dashboard (`[web]`, `POST /v1/web`).
    pub(crate) web: Web,
    /// How long a connection may wait to send a request (`[api]`).
    pub(crate) timeouts: Timeouts,
}

/// The API's shared state; cheap to clone.
#[derive(Clone)]
pub(crate) struct ApiState {
    inner: Arc<Inner>,
}

struct Inner {
    node: NodeId,
    bus: Bus,
    store: Arc<RedbStore>,
    store_file: PathBuf,
    head: watch::Receiver<Arrival>,
    subscriber_buffer: usize,
    subscriber_buffer_bytes: u64,
    subscriber_stall: std::time::Duration,
    daemon_uid: u32,
    /// Set to true when the server stops: live subscriptions end.
    closing: watch::Sender<bool>,
    /// Set to true [`SHUTDOWN_GRACE`] after that: connections still open are cut.
    abort: watch::Sender<bool>,
    /// The control socket's admission (each agent's socket has its own).
    gate: Arc<gate::Gate>,
    timeouts: Timeouts,
    counters: Counters,
    registry: Arc<Registry>,
    agent_socket_dir: PathBuf,
    agent_sockets_private: bool,
    topic_bounds: (u64, u64),
    journal_bytes_max: u64,
    web: Web,
    /// Node aliases (`mesh peer name`), as in the store.
    aliases: RwLock<BTreeMap<String, NodeId>>,
    /// Each agent's socket server.
    agent_servers: Mutex<HashMap<AgentName, agent_socket::AgentServer>>,
    /// Held while an agent's served cursor is read and written, so that
    /// the stored cursor only ever grows (`agents::inbox`).
    served_writes: tokio::sync::Mutex<()>,
}

/// The API's own counters, rendered by `GET /metrics`.
#[derive(Default)]
struct Counters {
    requests_ok: AtomicU64,
    requests_client_error: AtomicU64,
    requests_server_error: AtomicU64,
    refused_uid: AtomicU64,
    subscribers: AtomicU64,
    subscriber_lags: AtomicU64,
    loss_records_failed: AtomicU64,
    sent: AtomicU64,
    next_subscriber: AtomicU64,
    refused_agent: AtomicU64,
    agent_sent: AtomicU64,
    /// Agents' acks refused (a cursor not of the agent's inbox, of another
    /// node or epoch, past the head, or malformed).
    acks_refused: AtomicU64,
    /// Inbox reads waiting for an entry now.
    inbox_waits: AtomicU64,
    /// The number the next request's span gets.
    next_request: AtomicU64,
}

impl ApiState {
    /// The state for `parts`.
    pub(crate) fn new(parts: ApiParts) -> Self {
        ApiState {
            inner: Arc::new(Inner {
                node: parts.bus.node_id(),
                head: parts.bus.journal_head(),
                bus: parts.bus,
                store: parts.store,
                store_file: parts.store_file,
                subscriber_buffer: parts.subscriber_buffer.max(1),
                subscriber_buffer_bytes: parts.subscriber_buffer_bytes.max(1),
                subscriber_stall: parts.subscriber_stall,
                daemon_uid: daemon_uid(),
                closing: watch::Sender::new(false),
                abort: watch::Sender::new(false),
                gate: gate::Gate::new(parts.timeouts),
                timeouts: parts.timeouts,
                counters: Counters::default(),
                registry: parts.registry,
                agent_socket_dir: parts.agent_socket_dir,
                agent_sockets_private: parts.agent_sockets_private,
                topic_bounds: parts.topic_bounds,
                journal_bytes_max: parts.journal_bytes_max,
                web: parts.web,
                aliases: RwLock::new(parts.aliases.into_iter().collect()),
                agent_servers: Mutex::new(HashMap::new()),
                served_writes: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The routes, with the peer-credential check in front of all of them.
    fn router(&self) -> Router {
        Router::new()
            .route("/v1/status", get(peers::status))
            .route("/v1/ticket", get(peers::ticket))
            .route("/v1/peers", post(peers::add_peer).get(peers::list_peers))
            .route("/v1/peers/nearby", get(peers::nearby))
            .route("/v1/peers/{id}", axum::routing::delete(peers::remove_peer))
            .route("/v1/peers/{id}/pause", post(peers::pause_peer))
            .route("/v1/peers/{id}/resume", post(peers::resume_peer))
            .route("/v1/peers/{id}/alias", put(peers::put_alias))
            .route(
                "/v1/invites",
                post(invites::create_invite).get(invites::list_invites),
            )
            .route("/v1/invites/{id}/revoke", post(invites::revoke_invite))
            .route("/v1/join", post(invites::join))
            .route(
                "/v1/topics",
                post(topics::join_topic).get(topics::list_topics),
            )
            .route("/v1/topics/{name}", delete(topics::leave_topic))
            .route("/v1/topics/{name}/publish", post(topics::publish))
            .route(
                "/v1/topics/{name}/publish/batch",
                post(topics::publish_batch),
            )
            .route("/v1/send", post(send::send_one))
            .route("/v1/send/batch", post(send::send_batch))
            .route("/v1/events", get(routes::events))
            .route("/v1/subscribe", get(subscribe::subscribe))
            .route(
                "/v1/cursors/{name}",
                put(routes::put_cursor).get(routes::get_cursor),
            )
            .route(
                "/v1/agents",
                post(agents::add_agent).get(agents::list_agents),
            )
            .route("/v1/agents/{name}", delete(agents::remove_agent))
            .route("/v1/agents/{name}/export", post(agents::export_agent))
            .route("/v1/agents/import", post(agents::import_agent))
            .route("/v1/agents/{name}/move", post(agents::move_agent))
            .route("/v1/web", post(web::open))
            .merge(Self::agent_routes())
            .route("/metrics", get(metrics::metrics))
            .fallback(routes::no_route)
            .method_not_allowed_fallback(routes::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                authorize,
            ))
            .layer(axum::middleware::from_fn_with_state(
                (self.clone(), None),
                request_span,
            ))
            .with_state(self.clone())
    }

    /// The routes an agent uses (on its socket, as itself; on the node's
    /// socket the reads only, for the node's operator).
    fn agent_routes() -> Router<ApiState> {
        Router::new()
            .route("/v1/agents/{name}/send", post(agents::send))
            .route("/v1/agents/{name}/send/batch", post(agents::send_batch))
            .route("/v1/agents/{name}/reply", post(agents::reply))
            .route("/v1/agents/{name}/inbox", get(agents::inbox))
            .route("/v1/agents/{name}/ack", post(agents::ack))
            .route("/v1/agents/{name}/thread/{id}", get(agents::thread))
            .route(
                "/v1/agents/{name}/subscribe",
                get(subscribe::subscribe_inbox),
            )
            .route(
                "/v1/agents/{name}/cursors/{cursor}",
                put(agents::put_cursor).get(agents::get_cursor),
            )
            .route("/v1/messages/{id}", get(agents::message))
    }

    /// The routes of agent `name`'s socket, behind the check that the
    /// caller is that agent.
    fn agent_router(&self, name: AgentName) -> Router {
        Router::new()
            .route("/v1/status", get(peers::status))
            .route("/v1/agents", get(agents::list_agents))
            .merge(Self::agent_routes())
            .fallback(routes::no_route)
            .method_not_allowed_fallback(routes::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                (self.clone(), name.clone()),
                agent_socket::authorize_agent,
            ))
            .layer(axum::middleware::from_fn_with_state(
                (self.clone(), Some(name)),
                request_span,
            ))
            .with_state(self.clone())
    }

    /// Ends every live subscription (the server is stopping).
    fn close_subscriptions(&self) {
        self.inner.closing.send_replace(true);
    }

    fn read_head(&self) -> Arrival {
        *self.inner.head.borrow()
    }

    /// The store's epoch now: cursors are issued and checked under it.
    fn epoch(&self) -> Epoch {
        self.inner.bus.epoch()
    }
}

/// How long a stopping server lets open connections finish (a response
/// still being written, a request still being read) before it cuts them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Serves the API on `socket` until `shutdown` resolves, then ends live
/// subscriptions, lets requests in flight finish for up to
/// [`SHUTDOWN_GRACE`], cuts the connections still open (a client that
/// stopped reading would otherwise hold the daemon forever) and removes the
/// socket file.
pub(crate) async fn serve(
    socket: ApiSocket,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let ApiSocket {
        listener,
        path,
        ino,
    } = socket;
    tracing::info!(socket = %path.display(), "local API listening");
    let closing = state.clone();
    let app = state
        .router()
        .layer(axum::middleware::from_fn(gate::admit))
        .into_make_service_with_connect_info::<socket::Peer>();
    let abort = state.inner.abort.clone();
    let listener = socket::Bounded {
        listener,
        gate: state.inner.gate.clone(),
        abort: abort.subscribe(),
        activity: None,
    };
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            closing.close_subscriptions();
            tokio::spawn(async move {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
                // Connections hold a receiver each while they live.
                if abort.receiver_count() > 0 {
                    tracing::warn!(
                        "cutting local API connections still open {SHUTDOWN_GRACE:?} after \
                         shutdown began (a client that stopped reading)"
                    );
                }
                abort.send_replace(true);
            });
        })
        .await;
    ApiSocket::remove_file(&path, ino);
    state.stop_agent_servers().await;
    state.flush_served().await;
    result
}

/// Lets root and the daemon's uid through; everyone else gets 403.
/// Runs each request inside its own span (`request` with a number, the
/// method, the path and, on an agent's socket, the agent), so that what one
/// request logs reads apart from another's and from the node's.
async fn request_span(
    State((state, agent)): State<(ApiState, Option<AgentName>)>,
    req: Request,
    next: Next,
) -> Response {
    let id = state
        .inner
        .counters
        .next_request
        .fetch_add(1, Ordering::Relaxed);
    let span = tracing::error_span!(
        "request",
        id,
        method = %req.method(),
        path = %req.uri().path(),
        agent = agent.as_ref().map(tracing::field::display),
    );
    next.run(req).instrument(span).await
}

async fn authorize(State(state): State<ApiState>, mut req: Request, next: Next) -> Response {
    let cred = req
        .extensions()
        .get::<ConnectInfo<socket::Peer>>()
        .map(|c| c.0.cred);
    let uid = cred.and_then(|c| c.uid);
    let counters = &state.inner.counters;
    let response = match uid {
        Some(uid) if uid == 0 || uid == state.inner.daemon_uid => {
            if let Some(cred) = cred {
                req.extensions_mut().insert(cred);
            }
            next.run(req).await
        }
        _ => {
            counters.refused_uid.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                uid = ?uid,
                pid = ?cred.and_then(|c| c.pid),
                method = %req.method(),
                path = %req.uri().path(),
                "refused a local API request from another user"
            );
            // Without credentials we fail closed; report the uid as unknown.
            ApiError::from(CallerError::Forbidden {
                uid: uid.unwrap_or(u32::MAX),
                daemon_uid: state.inner.daemon_uid,
            })
            .into_response()
        }
    };
    let status = response.status();
    let counter = if status.is_server_error() {
        &counters.requests_server_error
    } else if status.is_client_error() {
        &counters.requests_client_error
    } else {
        &counters.requests_ok
    };
    counter.fetch_add(1, Ordering::Relaxed);
    response
}
