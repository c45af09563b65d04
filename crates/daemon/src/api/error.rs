//! The API's one error type and its JSON form `{"error": {"code", "message"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mesh_protocol::{CursorError, NodeId};
use mesh_store::StoreError;
use serde::Serialize;

/// Every way a request can fail, grouped by who is at fault; each has a stable
/// `code` and an HTTP status.
///
/// The caller's fault: 400 (bad input), 404 (unknown peer, cursor or route),
/// 405, 409 (a cursor from another node or store epoch). Not allowed: 403. The
/// environment: 507 (a peer's outbox is full), 503 (the store or the node is
/// unavailable). A bug: 500.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The body is not JSON, or not the expected shape (a missing field, a wrong type).
    #[error("bad JSON body: {0}")]
    BadJson(String),
    /// The body is larger than the route accepts.
    #[error("request body is larger than the {limit_bytes} bytes allowed{hint}")]
    BodyTooLarge {
        /// The route's limit.
        limit_bytes: usize,
        /// What to do instead, starting with "; " (or empty).
        hint: &'static str,
    },
    /// A value has the right type but is not acceptable (a bad node id, base64, limit…).
    #[error("{0}")]
    BadRequest(String),
    /// The text is not a cursor.
    #[error("{0}")]
    BadCursor(String),
    /// The connecting uid may not use this node.
    #[error("uid {uid} may not use this node's socket; only root and uid {daemon_uid} may")]
    Forbidden {
        /// The peer's uid.
        uid: u32,
        /// The daemon's uid.
        daemon_uid: u32,
    },
    /// The peer is not known to this node.
    #[error("unknown peer {0}; add it first with `mesh peer add TICKET`")]
    UnknownPeer(NodeId),
    /// No named cursor of that name.
    #[error("no cursor named {0:?}; set it with PUT /v1/cursors/{{name}}")]
    UnknownCursor(String),
    /// No such route.
    #[error("no route {method} {path}; the routes are under /v1 (see the README)")]
    NoRoute {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// The route exists but not with this method.
    #[error("method not allowed for this route")]
    MethodNotAllowed,
    /// The cursor was issued by another node.
    #[error("{0}; cursors are only valid on the node that issued them")]
    CursorOtherNode(String),
    /// The cursor was issued under another store epoch of this node.
    #[error("{0}; the store was recreated since, so page from the start (omit `after`)")]
    CursorOtherEpoch(String),
    /// The peer's outbox is full of unacknowledged envelopes and the policy is `reject`.
    #[error("{0}")]
    OutboxFull(String),
    /// The store cannot be read or written right now.
    #[error("{0}")]
    StoreUnavailable(String),
    /// The node (bus) cannot take the request right now (starting, stopping).
    #[error("{0}")]
    NodeUnavailable(String),
    /// A bug: a store conflict or a task that died.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// Adds `note` to the message, keeping the kind (and so the status).
    pub fn with_note(self, note: &str) -> Self {
        use ApiError::*;
        match self {
            OutboxFull(m) => OutboxFull(format!("{m}; {note}")),
            StoreUnavailable(m) => StoreUnavailable(format!("{m}; {note}")),
            NodeUnavailable(m) => NodeUnavailable(format!("{m}; {note}")),
            BadRequest(m) => BadRequest(format!("{m}; {note}")),
            Internal(m) => Internal(format!("{m}; {note}")),
            other => other,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        use ApiError::*;
        match self {
            BadJson(_) | BodyTooLarge { .. } | BadRequest(_) | BadCursor(_) => {
                StatusCode::BAD_REQUEST
            }
            Forbidden { .. } => StatusCode::FORBIDDEN,
            UnknownPeer(_) | UnknownCursor(_) | NoRoute { .. } => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            CursorOtherNode(_) | CursorOtherEpoch(_) => StatusCode::CONFLICT,
            OutboxFull(_) => StatusCode::INSUFFICIENT_STORAGE,
            StoreUnavailable(_) | NodeUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        use ApiError::*;
        match self {
            BadJson(_) => "bad_json",
            BodyTooLarge { .. } => "body_too_large",
            BadRequest(_) => "bad_request",
            BadCursor(_) => "bad_cursor",
            Forbidden { .. } => "forbidden",
            UnknownPeer(_) => "unknown_peer",
            UnknownCursor(_) => "unknown_cursor",
            NoRoute { .. } => "no_route",
            MethodNotAllowed => "method_not_allowed",
            CursorOtherNode(_) => "cursor_other_node",
            CursorOtherEpoch(_) => "cursor_other_epoch",
            OutboxFull(_) => "outbox_full",
            StoreUnavailable(_) => "store_unavailable",
            NodeUnavailable(_) => "node_unavailable",
            Internal(_) => "internal",
        }
    }

    /// The JSON body, with `extra` fields (if an object) merged into `error`.
    pub fn to_json(&self, extra: Option<serde_json::Value>) -> serde_json::Value {
        let mut inner = serde_json::json!({ "code": self.code(), "message": self.to_string() });
        if let (Some(serde_json::Value::Object(extra)), serde_json::Value::Object(inner)) =
            (extra, &mut inner)
        {
            inner.extend(extra);
        }
        serde_json::json!({ "error": inner })
    }
}

/// The wire shape of an error, for clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// `{code, message}` inside [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ErrorDetail {
    /// The stable code, e.g. `unknown_peer`.
    pub code: String,
    /// A sentence a person can act on.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(code = self.code(), "api error: {self}");
        } else {
            tracing::debug!(code = self.code(), "api error: {self}");
        }
        (status, axum::Json(self.to_json(None))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(_) => ApiError::Internal(e.to_string()),
            // Unavailable, Closed, and a store that failed to open or is damaged:
            // nothing the caller did, and nothing was written.
            _ => ApiError::StoreUnavailable(e.to_string()),
        }
    }
}

impl From<CursorError> for ApiError {
    fn from(e: CursorError) -> Self {
        match e {
            CursorError::OtherNode { .. } => ApiError::CursorOtherNode(e.to_string()),
            CursorError::OtherEpoch { .. } => ApiError::CursorOtherEpoch(e.to_string()),
            _ => ApiError::BadCursor(e.to_string()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_their_statuses() {
        assert_eq!(
            ApiError::from(StoreError::Unavailable("disk".into())).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ApiError::from(StoreError::Closed).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ApiError::from(StoreError::Conflict("x".into())).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn the_error_body_has_code_and_message_and_extra_fields() {
        let v = ApiError::BadRequest("nope".into())
            .to_json(Some(serde_json::json!({ "committed": 3 })));
        assert_eq!(v["error"]["code"], "bad_request");
        assert_eq!(v["error"]["message"], "nope");
        assert_eq!(v["error"]["committed"], 3);
    }
}
