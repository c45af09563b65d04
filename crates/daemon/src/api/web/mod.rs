//! The dashboard: one read-only page and the reads it makes, served on a
//! TCP port the daemon opens only when asked (`POST /v1/web`, what `mesh
//! web` calls) or from the start when `[web] listen` is set.
//!
//! Every request needs the token made at this start (`?token=` or
//! `Authorization: Bearer`), else 401: the port is reachable by every local
//! user, the control socket only by the daemon's. Only `GET` routes exist,
//! each one of the control socket's own reads (status, agents, topics, a
//! message, journal pages, the journal's live stream), so the page sees
//! what `mesh` sees and can change nothing (`/api/overview` is the status,
//! agents and topics reads as one answer: the page's periodic refresh).
//! The page is one HTML file compiled in (no CDN, no build step). Its connections pass the same gate
//! as the control socket's (`super::gate`): at most [`WEB_CONNECTIONS_MAX`]
//! served at once and a 503 past them, at most [`WEB_PENDING_MAX`] waiting
//! for their first request, and the `[api]` head and idle timeouts, so a
//! client that opens connections and sends nothing cannot keep the page
//! from its operator.

mod history;
mod tail;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt as _;
use mesh_api::{AgentsResponse, StatusResponse, TopicsResponse, WebResponse};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use super::error::node_error;
use super::gate::Gate;
use super::socket::{Bounded, Peer};
use super::{ApiError, ApiState, Unavailable};
use crate::config::WebConfig;

pub(crate) use history::History;

/// Connections the dashboard serves at once (a page holds one for its live
/// tail and a few for its reads); a further one is answered 503 at once.
pub const WEB_CONNECTIONS_MAX: usize = 64;

/// Connections the dashboard keeps open before their first request head;
/// a new one past these closes the oldest of them.
pub const WEB_PENDING_MAX: usize = 256;

/// How many journal entries the live tail starts before the head.
const TAIL_BACKLOG: u64 = 200;

/// The page.
const INDEX_HTML: &str = include_str!("index.html");

/// Random bytes in the token (hex in the URL).
const TOKEN_BYTES: usize = 16;

/// What must be sent with every request: the page's policy forbids any
/// script or style not in the page, any frame, and any request elsewhere;
/// the token is in the URL, so no referrer leaves it.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; \
                   base-uri 'none'; form-action 'none'";

/// The dashboard's state in the API: its config, its token, where it
/// listens once opened, and its history of counters.
pub(crate) struct Web {
    config: WebConfig,
    token: String,
    running: tokio::sync::Mutex<Option<SocketAddr>>,
    history: Arc<History>,
}

impl Web {
    /// The dashboard of one start of the daemon, with a new token.
    pub(crate) fn new(config: WebConfig) -> io::Result<Web> {
        Ok(Web {
            config,
            token: new_token()?,
            running: tokio::sync::Mutex::new(None),
            history: Arc::new(History::default()),
        })
    }
}

/// A token from the system's random source, as hex.
fn new_token() -> io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(data_encoding::HEXLOWER.encode(&bytes))
}

/// Compares without stopping at the first difference.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl ApiState {
    /// Opens the dashboard if it is not open yet; answers where it listens.
    pub(crate) async fn open_web(&self) -> Result<SocketAddr, ApiError> {
        let web = &self.inner.web;
        let mut running = web.running.lock().await;
        if let Some(addr) = *running {
            return Ok(addr);
        }
        let want = web
            .config
            .listen
            .unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
        let listener = TcpListener::bind(want).await.map_err(|e| {
            ApiError::from(Unavailable::Node(format!(
                "cannot open the dashboard on {want}: {e}"
            )))
        })?;
        let addr = listener.local_addr().map_err(|e| {
            ApiError::from(Unavailable::Node(format!("the dashboard's address: {e}")))
        })?;
        let app = self.web_router();
        let mut closing = self.inner.closing.subscribe();
        let app = app
            .layer(axum::middleware::from_fn(super::gate::admit))
            .into_make_service_with_connect_info::<Peer>();
        let listener = Bounded {
            listener: listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            }),
            gate: Gate::with_bounds(WEB_CONNECTIONS_MAX, 0, WEB_PENDING_MAX, self.inner.timeouts),
            abort: self.inner.abort.subscribe(),
            activity: None,
        };
        tokio::spawn(async move {
            let stop = async move {
                let _ = closing.wait_for(|c| *c).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::warn!("the dashboard stopped: {e}");
            }
        });
        tokio::spawn(history::sample(self.clone(), web.history.clone()));
        tracing::info!(%addr, "dashboard listening (`mesh web` prints its URL)");
        *running = Some(addr);
        Ok(addr)
    }

    /// The URL of the dashboard at `addr`, with the token.
    fn web_url(&self, addr: SocketAddr) -> String {
        format!("http://{addr}/?token={}", self.inner.web.token)
    }

    fn web_router(&self) -> Router {
        Router::new()
            .route("/", get(index))
            .route("/api/overview", get(overview))
            .route("/api/status", get(super::peers::status))
            .route("/api/agents", get(super::agents::list_agents))
            .route("/api/topics", get(super::topics::list_topics))
            .route("/api/messages/{id}", get(super::agents::message))
            .route("/api/events", get(super::routes::events))
            .route("/api/subscribe", get(tail))
            .route("/api/history", get(history::history))
            .fallback(super::routes::no_route)
            .method_not_allowed_fallback(super::routes::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                authorize,
            ))
            .with_state(self.clone())
    }
}

/// Whether `config` opens the dashboard when the daemon starts.
pub(crate) fn on_at_start(config: &WebConfig) -> bool {
    config.listen.is_some()
}

/// `POST /v1/web` (control socket): opens the dashboard if it is not open,
/// and answers its URL.
pub(super) async fn open(State(st): State<ApiState>) -> Result<axum::Json<WebResponse>, ApiError> {
    let addr = st.open_web().await?;
    Ok(axum::Json(WebResponse {
        url: st.web_url(addr),
        listen: addr,
    }))
}

#[derive(Debug, Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

/// Lets a request through only with the token; sets the page's headers.
async fn authorize(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let from_query = Query::<TokenQuery>::try_from_uri(req.uri())
        .ok()
        .and_then(|q| q.0.token);
    let from_header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let ok = from_query
        .or(from_header)
        .is_some_and(|t| same(&t, &st.inner.web.token));
    let mut response = if ok {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "this dashboard needs its token: open the URL `mesh web` prints\n",
        )
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn index() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        INDEX_HTML,
    )
        .into_response()
}

/// What the page's periodic refresh shows, from one read of the node's
/// status: `GET /api/status`, `/api/agents` and `/api/topics` as one
/// answer, each local agent's unread mail counted once.
#[derive(Debug, Serialize)]
struct Overview {
    status: StatusResponse,
    agents: AgentsResponse,
    topics: TopicsResponse,
}

/// `GET /api/overview`: the page's refresh in one request, so an open page
/// asks the node for its status once per refresh rather than three times.
async fn overview(State(st): State<ApiState>) -> Result<axum::Json<Overview>, ApiError> {
    let bus = st.inner.bus.status().await.map_err(node_error)?;
    let topics = TopicsResponse {
        topics: bus
            .topics
            .iter()
            .cloned()
            .map(super::topics::topic_json)
            .collect(),
    };
    let agents_of = bus.clone();
    let status = st.status_of(bus).await?;
    let unread = status
        .agents
        .iter()
        .map(|a| (a.name.clone(), a.unread))
        .collect();
    let agents = st.agents_of(&agents_of, &unread);
    Ok(axum::Json(Overview {
        status,
        agents,
        topics,
    }))
}

#[derive(Debug, Deserialize)]
struct TailQuery {
    after: Option<String>,
}

/// The journal's live stream, coalesced (`tail`), from `after`, or from
/// where the stream was (`Last-Event-ID`, sent by a reconnecting browser),
/// or from [`TAIL_BACKLOG`] entries before the head.
async fn tail(
    State(st): State<ApiState>,
    headers: HeaderMap,
    Query(q): Query<TailQuery>,
) -> Result<Response, ApiError> {
    let resumed = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let after = match q.after.filter(|a| !a.trim().is_empty()).or(resumed) {
        Some(text) => st.parse_after(Some(&text))?,
        None => st.read_head().saturating_sub(TAIL_BACKLOG),
    };
    Ok(tail::stream(st, after, TAIL_BACKLOG))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_new_each_time_and_compared_whole() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), TOKEN_BYTES * 2);
        assert_ne!(a, b);
        assert!(same(&a, &a.clone()));
        assert!(!same(&a, &b));
        assert!(!same(&a, &a[..a.len() - 1]));
        assert!(!same("", &a));
    }
}
