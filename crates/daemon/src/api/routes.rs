//! The journal routes (pages, named cursors), the request-reading helpers
//! every route uses, and the answers to unknown routes.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use http_body_util::BodyExt;
use mesh_api::{CursorBody, EventEntry, EventsPage};
use mesh_protocol::{Cursor, NodeId};
use mesh_store::{Arrival, JournalItem, MeshStore, RedbStore};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::node_error;
use super::{
    ApiError, ApiState, Bug, CURSOR_NAME_BYTES_MAX, CallerError, EVENTS_LIMIT_DEFAULT,
    EVENTS_LIMIT_MAX, EVENTS_PAGE_BYTES_MAX, NotFound, REQUEST_BYTES_MAX,
};

/// Reads a whole body of at most `limit` bytes.
pub(super) async fn read_body(
    body: Body,
    limit: usize,
    hint: &'static str,
) -> Result<bytes::Bytes, ApiError> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(CallerError::BodyTooLarge {
            limit_bytes: limit,
            hint,
        }
        .into()),
        Err(e) => Err(CallerError::BodyUnreadable(e.to_string()).into()),
    }
}

/// Decodes JSON, naming the field and position of the first problem.
pub(super) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| CallerError::BadJson(e.to_string()).into())
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
    store: &Arc<RedbStore>,
    f: impl FnOnce(&RedbStore) -> Result<T, mesh_store::StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| Bug::new(format!("store read task failed: {e}")))?
        .map_err(ApiError::from)
}

/// Maps a query-string rejection to a 400.
pub(super) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(t)| t)
        .map_err(|e| CallerError::BadValue(format!("bad query string: {}", e.body_text())).into())
}

impl ApiState {
    /// The arrival after which `after` points; absent or empty is the start.
    pub(super) fn parse_after(&self, after: Option<&str>) -> Result<Arrival, ApiError> {
        match after.map(str::trim).filter(|s| !s.is_empty()) {
            None => Ok(0),
            Some(text) => Ok(Cursor::parse_for(text, &self.inner.node, self.epoch())?),
        }
    }

    /// The cursor text after arrival `arrival`.
    pub(super) fn cursor_text(&self, arrival: Arrival) -> String {
        Cursor::new(&self.inner.node, self.epoch(), arrival).to_string()
    }

    /// Up to `limit` journal entries after `after`, stopping after the one
    /// that crosses `max_bytes` of payload (a trimmed entry first if `after`
    /// is before the retained journal).
    pub(super) async fn journal_page(
        &self,
        after: Arrival,
        limit: usize,
        max_bytes: u64,
    ) -> Result<Vec<JournalItem>, ApiError> {
        read_store(&self.inner.store, move |s| {
            s.journal_page(after, limit, max_bytes)
        })
        .await
    }

    /// The JSON form of a journal entry.
    pub(super) fn entry(&self, item: &JournalItem) -> EventEntry {
        super::json::entry(&self.inner.node, self.epoch(), item)
    }
}

/// Parses a node id, with a message naming what was wrong.
pub(super) fn parse_node_id(text: &str) -> Result<NodeId, ApiError> {
    // Memoised per thread: a send names its recipient in every message.
    mesh_protocol::parse_node_id(text.trim()).map_err(|e| {
        CallerError::BadNodeId {
            text: cut(text),
            why: e.to_string(),
        }
        .into()
    })
}

/// `text` cut to a length fit for an error message.
pub(super) fn cut(text: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 80;
    text.chars().take(SHOWN_CHARS_MAX).collect()
}

/// Journal entries read from the store at a time.
pub(super) const JOURNAL_READ_ENTRIES: usize = 64;

/// Payload bytes after which a read from the store stops (past the one
/// entry that crosses it): what one read holds in memory.
pub(super) const JOURNAL_READ_BYTES: u64 = 1 << 20;

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
                return Err(CallerError::BadValue(format!(
                    "limit must be a number from 1 to {EVENTS_LIMIT_MAX}, not {:?}",
                    cut(text)
                ))
                .into());
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
        let left = (EVENTS_PAGE_BYTES_MAX - bytes) as u64;
        let chunk = st
            .journal_page(
                pos,
                (limit - items.len()).min(JOURNAL_READ_ENTRIES),
                left.min(JOURNAL_READ_BYTES),
            )
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

/// Checks a cursor name (a node's or an agent's named cursor): 1 to 64
/// bytes of `[A-Za-z0-9._-]`.
pub(crate) fn check_cursor_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= CURSOR_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(CallerError::BadValue(format!(
            "bad cursor name {:?}: use 1 to {CURSOR_NAME_BYTES_MAX} characters of A-Z a-z 0-9 . _ -",
            cut(name)
        ))
        .into())
    }
}

/// The arrival a `PUT` of a named cursor (the node's or an agent's) sets:
/// its body's cursor, of this node and epoch and not past the head.
pub(crate) async fn cursor_to_put(st: &ApiState, req: Request) -> Result<Arrival, ApiError> {
    let body: CursorBody = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let arrival = st.parse_after(Some(&body.cursor))?;
    let head = read_store(&st.inner.store, |s| s.journal_head()).await?;
    if arrival > head {
        // Only a forged or damaged cursor of this node and epoch gets here.
        return Err(CallerError::CursorPastHead { arrival, head }.into());
    }
    Ok(arrival)
}

/// A named cursor's answer: `{name, cursor}`.
pub(crate) fn cursor_json(
    st: &ApiState,
    name: String,
    arrival: Arrival,
) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "name": name, "cursor": st.cursor_text(arrival) }))
}

pub(super) async fn put_cursor(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_cursor_name(&name)?;
    let arrival = cursor_to_put(&st, req).await?;
    st.inner
        .bus
        .put_cursor(name.clone(), arrival)
        .await
        .map_err(node_error)?;
    Ok(cursor_json(&st, name, arrival))
}

pub(super) async fn get_cursor(
    State(st): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_cursor_name(&name)?;
    let key = name.clone();
    match read_store(&st.inner.store, move |s| s.cursor(&key)).await? {
        Some(arrival) => Ok(cursor_json(&st, name, arrival)),
        None => Err(NotFound::UnknownCursor(name).into()),
    }
}

pub(super) async fn no_route(req: Request) -> ApiError {
    NotFound::NoRoute {
        method: req.method().to_string(),
        path: cut(req.uri().path()),
    }
    .into()
}

pub(super) async fn method_not_allowed() -> ApiError {
    CallerError::MethodNotAllowed.into()
}
