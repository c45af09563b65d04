//! The request/response routes: status, peers, journal pages, named cursors, metrics.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use mesh_protocol::{Cursor, NodeId, NodeTicket};
use mesh_store::{Arrival, JournalItem, MeshStore};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::json::{AddPeerRequest, CursorBody, EventEntry, EventsPage, TicketResponse};
use super::{
    ApiError, ApiState, CURSOR_NAME_BYTES_MAX, EVENTS_LIMIT_DEFAULT, EVENTS_LIMIT_MAX,
    EVENTS_PAGE_BYTES_MAX, REQUEST_BYTES_MAX,
};

/// Reads a whole body of at most `limit` bytes.
pub(super) async fn read_body(
    body: Body,
    limit: usize,
    hint: &'static str,
) -> Result<bytes::Bytes, ApiError> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::BodyTooLarge {
            limit_bytes: limit,
            hint,
        }),
        Err(e) => Err(ApiError::BadRequest(format!(
            "cannot read the request body: {e}"
        ))),
    }
}

/// Decodes JSON, naming the field and position of the first problem.
pub(super) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::BadJson(e.to_string()))
}

/// Reads and decodes a JSON body of at most `limit` bytes.
pub(super) async fn read_json<T: DeserializeOwned>(
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = read_body(body, limit, "").await?;
    parse_json(&bytes)
}

/// Runs a store read on the blocking pool.
pub(super) async fn read_store<T: Send + 'static>(
    store: &Arc<dyn MeshStore>,
    f: impl FnOnce(&dyn MeshStore) -> Result<T, mesh_store::StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(store.as_ref()))
        .await
        .map_err(|e| ApiError::Internal(format!("store read task failed: {e}")))?
        .map_err(ApiError::from)
}

/// Maps a query-string rejection to a 400.
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(t)| t)
        .map_err(|e| ApiError::BadRequest(format!("bad query string: {}", e.body_text())))
}

impl ApiState {
    /// The arrival after which `after` points; absent or empty is the start.
    pub(super) fn parse_after(&self, after: Option<&str>) -> Result<Arrival, ApiError> {
        match after.map(str::trim).filter(|s| !s.is_empty()) {
            None => Ok(0),
            Some(text) => Ok(Cursor::parse_for(text, &self.inner.node, self.inner.epoch)?),
        }
    }

    /// The cursor text after arrival `arrival`.
    pub(super) fn cursor_text(&self, arrival: Arrival) -> String {
        Cursor::new(&self.inner.node, self.inner.epoch, arrival).to_string()
    }

    /// Up to `limit` journal entries after `after`.
    pub(super) async fn journal(
        &self,
        after: Arrival,
        limit: usize,
    ) -> Result<Vec<JournalItem>, ApiError> {
        read_store(&self.inner.store, move |s| s.journal(after, limit)).await
    }

    /// The JSON form of a journal entry.
    pub(super) fn entry(&self, item: &JournalItem) -> EventEntry {
        EventEntry::from_item(&self.inner.node, self.inner.epoch, item)
    }
}

pub(super) async fn status(State(st): State<ApiState>) -> Result<Response, ApiError> {
    let status = st.inner.node_api.status().await?;
    let mut v = serde_json::to_value(status)
        .map_err(|e| ApiError::Internal(format!("status does not serialize: {e}")))?;
    if let serde_json::Value::Object(m) = &mut v {
        m.insert("journal_head".into(), st.read_head().into());
        m.insert(
            "subscribers".into(),
            st.inner.counters.subscribers.load(Ordering::Relaxed).into(),
        );
        // The process serving this socket, so a local tool (`mesh bench
        // peer`) can read its memory and CPU from /proc.
        m.insert("pid".into(), std::process::id().into());
    }
    Ok(Json(v).into_response())
}

pub(super) async fn ticket(State(st): State<ApiState>) -> Result<Json<TicketResponse>, ApiError> {
    let ticket = st.inner.node_api.ticket().await?;
    Ok(Json(TicketResponse {
        ticket: ticket.to_string(),
    }))
}

pub(super) async fn add_peer(
    State(st): State<ApiState>,
    req: Request,
) -> Result<Response, ApiError> {
    let body: AddPeerRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let ticket: NodeTicket = body
        .ticket
        .parse()
        .map_err(|e: mesh_protocol::TicketError| ApiError::BadRequest(e.to_string()))?;
    let peer = st.inner.node_api.add_peer(ticket).await?;
    Ok(Json(peer).into_response())
}

pub(super) async fn list_peers(State(st): State<ApiState>) -> Result<Response, ApiError> {
    let peers = st.inner.node_api.list_peers().await?;
    Ok(Json(serde_json::json!({ "peers": peers })).into_response())
}

pub(super) async fn remove_peer(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let node = parse_node_id(&id)?;
    st.inner.node_api.remove_peer(node).await?;
    Ok(Json(serde_json::json!({ "removed": node.to_string() })).into_response())
}

pub(super) async fn pause_peer(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let node = parse_node_id(&id)?;
    let peer = st.inner.node_api.set_peer_paused(node, true).await?;
    Ok(Json(peer).into_response())
}

pub(super) async fn resume_peer(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let node = parse_node_id(&id)?;
    let peer = st.inner.node_api.set_peer_paused(node, false).await?;
    Ok(Json(peer).into_response())
}

/// Parses a node id, with a message naming what was wrong.
pub(super) fn parse_node_id(text: &str) -> Result<NodeId, ApiError> {
    // Memoised per thread: a send names its recipient in every message.
    mesh_protocol::parse_node_id(text.trim()).map_err(|e| {
        ApiError::BadRequest(format!(
            "{:?} is not a node id ({e}); node ids are printed by `mesh id`",
            cut(text)
        ))
    })
}

/// `text` cut to a length fit for an error message.
pub(super) fn cut(text: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 80;
    text.chars().take(SHOWN_CHARS_MAX).collect()
}

/// Journal entries read from the store at a time (at most this many payloads
/// of up to 1 MiB are in memory at once).
pub(super) const JOURNAL_READ_ENTRIES: usize = 64;

/// `GET /v1/events` query.
#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    after: Option<String>,
    limit: Option<String>,
}

pub(super) async fn events(
    State(st): State<ApiState>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<EventsPage>, ApiError> {
    let q = query(q)?;
    let after = st.parse_after(q.after.as_deref())?;
    let limit = match q.limit.as_deref() {
        None | Some("") => EVENTS_LIMIT_DEFAULT,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=EVENTS_LIMIT_MAX).contains(&n) => n,
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "limit must be a number from 1 to {EVENTS_LIMIT_MAX}, not {:?}",
                    cut(text)
                )));
            }
        },
    };
    // Read in small chunks and stop after the entry that crosses the byte
    // cap, so a page of large payloads stays bounded in memory (a page
    // always has an entry if any is due).
    let mut items = Vec::new();
    let mut bytes = 0usize;
    let mut pos = after;
    'read: while items.len() < limit {
        let chunk = st
            .journal(pos, (limit - items.len()).min(JOURNAL_READ_ENTRIES))
            .await?;
        if chunk.is_empty() {
            break;
        }
        for item in chunk {
            bytes += entry_bytes(&item);
            pos = item.arrival;
            items.push(item);
            if bytes >= EVENTS_PAGE_BYTES_MAX {
                break 'read;
            }
        }
    }
    let next = items.last().map(|i| i.arrival).unwrap_or(after);
    Ok(Json(EventsPage {
        entries: items.iter().map(|i| st.entry(i)).collect(),
        next: st.cursor_text(next),
    }))
}

/// The payload bytes of a journal entry.
fn entry_bytes(item: &JournalItem) -> usize {
    match &item.record {
        mesh_store::JournalRecord::Envelope { payload, .. } => payload.len(),
        mesh_store::JournalRecord::Loss { detail, .. } => detail.len(),
        _ => 0,
    }
}

/// Checks a cursor name: 1 to 64 bytes of `[A-Za-z0-9._-]`.
fn check_cursor_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= CURSOR_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "bad cursor name {:?}: use 1 to {CURSOR_NAME_BYTES_MAX} characters of A-Z a-z 0-9 . _ -",
            cut(name)
        )))
    }
}

pub(super) async fn put_cursor(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_cursor_name(&name)?;
    let body: CursorBody = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let arrival = st.parse_after(Some(&body.cursor))?;
    let head = read_store(&st.inner.store, |s| s.journal_head()).await?;
    if arrival > head {
        // Only a forged or damaged cursor of this node and epoch gets here.
        return Err(ApiError::BadCursor(format!(
            "cursor points at arrival {arrival}, past the journal head {head}"
        )));
    }
    st.inner.node_api.put_cursor(name.clone(), arrival).await?;
    Ok(Json(
        serde_json::json!({ "name": name, "cursor": st.cursor_text(arrival) }),
    ))
}

pub(super) async fn get_cursor(
    State(st): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_cursor_name(&name)?;
    let key = name.clone();
    match read_store(&st.inner.store, move |s| s.cursor(&key)).await? {
        Some(arrival) => Ok(Json(
            serde_json::json!({ "name": name, "cursor": st.cursor_text(arrival) }),
        )),
        None => Err(ApiError::UnknownCursor(name)),
    }
}

pub(super) async fn metrics(State(st): State<ApiState>) -> Response {
    let c = &st.inner.counters;
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    family(
        "mesh_api_requests_total",
        "counter",
        "Local API requests answered, by status class.",
        &[
            ("{class=\"ok\"}", load(&c.requests_ok)),
            ("{class=\"client_error\"}", load(&c.requests_client_error)),
            ("{class=\"server_error\"}", load(&c.requests_server_error)),
        ],
    );
    family(
        "mesh_api_refused_uid_total",
        "counter",
        "Local API requests refused because the connecting uid is not allowed.",
        &[("", load(&c.refused_uid))],
    );
    family(
        "mesh_api_sent_total",
        "counter",
        "Messages committed through the local API.",
        &[("", load(&c.sent))],
    );
    family(
        "mesh_api_subscribers",
        "gauge",
        "Live subscriptions open now.",
        &[("", load(&c.subscribers))],
    );
    family(
        "mesh_api_subscriber_lags_total",
        "counter",
        "Times a live subscriber stopped reading and was lagged.",
        &[("", load(&c.subscriber_lags))],
    );
    family(
        "mesh_api_loss_records_failed_total",
        "counter",
        "Subscriber lags whose durable loss record could not be written.",
        &[("", load(&c.loss_records_failed))],
    );
    family(
        "mesh_journal_head",
        "gauge",
        "The last journal arrival committed.",
        &[("", st.read_head())],
    );
    if let Some(extra) = &st.inner.metrics {
        extra.render(&mut out);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response()
}

pub(super) async fn no_route(req: Request) -> ApiError {
    ApiError::NoRoute {
        method: req.method().to_string(),
        path: cut(req.uri().path()),
    }
}

pub(super) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
