//! The API's errors, grouped by who is at fault, and their one mapping to an
//! HTTP status, a stable code and a fault class (which decides the CLI's
//! exit code): `{"error": {"code", "fault", "message"}}`.
//!
//! | fault | status | what |
//! |---|---|---|
//! | [`CallerError`] | 400, 403, 405, 409 | bad input, not allowed, an unverified sender, a cursor of another node, an ambiguous name, a refused join |
//! | [`NotFound`] | 404 | unknown peer, agent, message, cursor, invite or route |
//! | [`Capacity`] | 429, 409, 503 | a full peer outbox, a busy node, a socket whose connections are all held, an inviter asking to try again; too many peers or agents |
//! | [`Unavailable`] | 503 | the store or the node cannot serve now |
//! | [`Bug`] | 500 | nothing the caller can change |
//!
//! A full peer outbox is 429, not 409: the request is right and the same
//! request succeeds once the peer has caught up, which is what 429 tells a
//! client (slow down, retry later), while 409 says the request itself must
//! change. Too many peers is 409: waiting does not help, removing one does.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mesh_api::{ErrorCode, Fault};
use mesh_protocol::{CursorError, NodeId};
use mesh_store::{Arrival, StoreError};

use crate::bus::{
    CoreSendError, InviteError, JoinError, JoinRefusal, NodeError, PeerChangeError, PeerError,
    SendError,
};

/// Why a request failed: what went wrong, where (an item or line of a
/// batch), and a note on what else the request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    kind: ErrorKind,
    /// Where in the request, e.g. `line 3`.
    place: Option<String>,
    /// What else happened, e.g. how many of a batch were committed.
    note: Option<String>,
}

/// What went wrong, by who is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request was wrong or not allowed.
    #[error(transparent)]
    Caller(#[from] CallerError),
    /// What the request names does not exist.
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// A bound was reached; the same request may succeed later.
    #[error(transparent)]
    Capacity(#[from] Capacity),
    /// The node cannot serve now.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A bug.
    #[error(transparent)]
    Bug(#[from] Bug),
    /// Another node refused what this one asked of it (an agent import),
    /// by its own code and class.
    #[error(transparent)]
    Refused(#[from] Refused),
}

/// Another node's refusal, passed on with its code and fault class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    /// Its code.
    pub code: ErrorCode,
    /// Its class.
    pub fault: Fault,
    /// What it said, and what this node adds.
    pub message: String,
}

/// The caller's fault: change the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallerError {
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
    /// The body could not be read to its end.
    #[error("cannot read the request body: {0}")]
    BodyUnreadable(String),
    /// The text is not a node id.
    #[error("{text:?} is not a node id ({why}); node ids are printed by `mesh id`")]
    BadNodeId {
        /// The text, cut to a length fit for a message.
        text: String,
        /// Why not.
        why: String,
    },
    /// A value of the right type that is not acceptable (a ticket, base64, a limit, a name).
    #[error("{0}")]
    BadValue(String),
    /// The message's payload can never be sent.
    #[error("the message body is {len} bytes, more than the {max} a message may carry")]
    PayloadTooLarge {
        /// The payload's length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A node does not send to itself over the mesh.
    #[error("cannot send to this node itself")]
    ToSelf,
    /// The peer cannot be added as asked (this node itself, too many addresses).
    #[error("{0}")]
    BadPeer(String),
    /// The text is not a cursor.
    #[error("{0}")]
    BadCursor(String),
    /// A cursor of this node and epoch past the journal head: forged or damaged.
    #[error("cursor points at arrival {arrival}, past the journal head {head}")]
    CursorPastHead {
        /// Where it points.
        arrival: Arrival,
        /// The journal head.
        head: Arrival,
    },
    /// An agent acked a cursor that is not of an entry of its own inbox.
    #[error(
        "cursor points at arrival {arrival}, which is not an entry of agent {agent}'s inbox \
         (a cursor of another agent's inbox?): ack an entry's `cursor` or a page's `next` \
         from this agent's own inbox"
    )]
    CursorNotInInbox {
        /// The agent that acked.
        agent: String,
        /// Where the cursor points.
        arrival: Arrival,
    },
    /// The cursor was issued by another node.
    #[error("{0}; cursors are only valid on the node that issued them")]
    CursorOtherNode(String),
    /// The cursor was issued under another store epoch of this node.
    #[error("{0}; the store was recreated since, so page from the start (omit `after`)")]
    CursorOtherEpoch(String),
    /// The connecting uid may not use this node.
    #[error("uid {uid} may not use this node's socket; only root and uid {daemon_uid} may")]
    Forbidden {
        /// The peer's uid.
        uid: u32,
        /// The daemon's uid.
        daemon_uid: u32,
    },
    /// The route exists but not with this method.
    #[error("method not allowed for this route")]
    MethodNotAllowed,
    /// The caller is not the agent it acts as: another uid, another
    /// agent's socket, an agent that no longer exists, or a send as an
    /// agent that did not come through the agent's socket.
    #[error("unverified sender: {0}")]
    UnverifiedSender(String),
    /// A name matches more than one node; the message lists them.
    #[error("{0}")]
    AmbiguousName(String),
    /// A client id was already used for another message.
    #[error("{0}")]
    ClientIdReused(String),
    /// An agent of that name exists already.
    #[error("there is an agent {0} on this node already")]
    AgentExists(String),
    /// The agent has inbox entries it was never handed; the message says how many.
    #[error("{0}")]
    UnreadEntries(String),
    /// The agent moved to another node; the message says where.
    #[error("{0}")]
    AgentMoved(String),
    /// The inviter refused the join for good (its code says why).
    #[error("{why}; ask the inviter for a new invite (`mesh invite` on a member)")]
    JoinRefused {
        /// Expired, revoked or spent.
        refusal: JoinRefusal,
        /// What the inviter said.
        why: String,
    },
}

/// What the request names does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotFound {
    /// The peer is not known to this node.
    #[error("unknown peer {0}; add it first with `mesh peer add TICKET`")]
    UnknownPeer(NodeId),
    /// No named cursor of that name.
    #[error("no cursor named {0:?}; set it with PUT /v1/cursors/{{name}}")]
    UnknownCursor(String),
    /// No agent of that name on this node.
    #[error("no agent {0} on this node; `mesh agent list` shows them")]
    UnknownAgent(String),
    /// No message of that id is known to this node.
    #[error("no message {0} is known to this node (it neither sent nor received it)")]
    UnknownMessage(String),
    /// The message is known to this node, but the agent asked about
    /// neither sent it nor received it here.
    #[error(
        "agent {agent} neither sent nor received message {id} on this node (`mesh --agent {agent} inbox` shows what it received)"
    )]
    NotAgentsMessage {
        /// The message id.
        id: String,
        /// The agent.
        agent: String,
    },
    /// No node has that name or alias.
    #[error(
        "no node is named {0:?}: not a node id, a peer's alias (`mesh peer name`) or a node's name (its card's)"
    )]
    UnknownName(String),
    /// No such invite (here, or at the inviter of a join).
    #[error("{0}")]
    UnknownInvite(String),
    /// No such route.
    #[error("no route {method} {path}; the routes are under /v1 (see the README)")]
    NoRoute {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
}

/// A bound was reached: the same request may succeed later (or once
/// something is removed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Capacity {
    /// The peer's outbox is full of unacknowledged envelopes and its policy
    /// is `reject`; nothing was written.
    #[error("{0}")]
    OutboxFull(String),
    /// The node has as many requests of this kind waiting as it holds.
    #[error("{0}")]
    Busy(String),
    /// The node knows as many peers as it may.
    #[error("{0}")]
    TooManyPeers(String),
    /// The node hosts as many agents as it may.
    #[error("{0}")]
    TooManyAgents(String),
    /// Every place of the socket is held by another connection; nothing
    /// was read past the request head.
    #[error(
        "the daemon is serving {max} connections on this socket already; retry in a moment \
         (a local client may be leaking connections: `mesh status` shows them)"
    )]
    TooManyConnections {
        /// The socket's places.
        max: usize,
    },
    /// The inviter asks to try the join again: the invite is in use by
    /// another node, or the inviter's store is busy or down. Nothing spent.
    #[error("{0}; run `mesh join` again in a moment")]
    TryAgain(String),
}

/// The node cannot serve now; nothing the caller did, and nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// The store cannot be read or written.
    #[error("{0}")]
    Store(String),
    /// The node (bus) is stopping or has stopped.
    #[error("{0}")]
    Node(String),
    /// The inviter of a join cannot be reached.
    #[error("{0}; is the inviter running and reachable at the addresses in the code?")]
    Inviter(String),
    /// A peer asked to take an agent could not be reached, does not speak
    /// the move link, or gave no answer in time.
    #[error("{0}")]
    Peer(String),
}

/// A bug in the node: a store conflict, a task that died, an answer that
/// does not add up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Bug {
    /// What went wrong.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Bug {
    /// A bug described by `what`.
    pub fn new(what: impl Into<String>) -> Bug {
        Bug::Internal(what.into())
    }
}

impl ApiError {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// Who is at fault.
    pub fn fault(&self) -> Fault {
        match &self.kind {
            ErrorKind::Caller(_) => Fault::Caller,
            ErrorKind::NotFound(_) => Fault::NotFound,
            ErrorKind::Capacity(_) => Fault::Capacity,
            ErrorKind::Unavailable(_) => Fault::Unavailable,
            ErrorKind::Bug(_) => Fault::Bug,
            ErrorKind::Refused(r) => r.fault,
        }
    }

    /// Says where in the request it went wrong (`line 3`, `item 0`); the
    /// message starts with it.
    pub fn at(mut self, place: String) -> Self {
        self.place = Some(place);
        self
    }

    /// Adds `note` to the message, keeping the kind (and so the status).
    pub fn with_note(mut self, note: &str) -> Self {
        self.note = Some(match self.note.take() {
            Some(n) => format!("{n}; {note}"),
            None => note.to_owned(),
        });
        self
    }

    /// The HTTP status and the stable code.
    pub fn status_and_code(&self) -> (StatusCode, ErrorCode) {
        use StatusCode as S;
        match &self.kind {
            ErrorKind::Caller(e) => match e {
                CallerError::BadJson(_) => (S::BAD_REQUEST, ErrorCode::BadJson),
                CallerError::BodyTooLarge { .. } => (S::BAD_REQUEST, ErrorCode::BodyTooLarge),
                CallerError::BadCursor(_)
                | CallerError::CursorPastHead { .. }
                | CallerError::CursorNotInInbox { .. } => (S::BAD_REQUEST, ErrorCode::BadCursor),
                CallerError::CursorOtherNode(_) => (S::CONFLICT, ErrorCode::CursorOtherNode),
                CallerError::CursorOtherEpoch(_) => (S::CONFLICT, ErrorCode::CursorOtherEpoch),
                CallerError::Forbidden { .. } => (S::FORBIDDEN, ErrorCode::Forbidden),
                CallerError::MethodNotAllowed => {
                    (S::METHOD_NOT_ALLOWED, ErrorCode::MethodNotAllowed)
                }
                CallerError::UnverifiedSender(_) => (S::FORBIDDEN, ErrorCode::UnverifiedSender),
                CallerError::AmbiguousName(_) => (S::CONFLICT, ErrorCode::AmbiguousName),
                CallerError::ClientIdReused(_) => (S::CONFLICT, ErrorCode::ClientIdReused),
                CallerError::AgentExists(_) => (S::CONFLICT, ErrorCode::AgentExists),
                CallerError::AgentMoved(_) => (S::CONFLICT, ErrorCode::AgentMoved),
                CallerError::UnreadEntries(_) => (S::CONFLICT, ErrorCode::UnreadEntries),
                CallerError::JoinRefused { refusal, .. } => match refusal {
                    JoinRefusal::Expired => (S::CONFLICT, ErrorCode::InviteExpired),
                    JoinRefusal::Revoked => (S::CONFLICT, ErrorCode::InviteRevoked),
                    _ => (S::CONFLICT, ErrorCode::InviteSpent),
                },
                CallerError::BodyUnreadable(_)
                | CallerError::BadNodeId { .. }
                | CallerError::BadValue(_)
                | CallerError::PayloadTooLarge { .. }
                | CallerError::ToSelf
                | CallerError::BadPeer(_) => (S::BAD_REQUEST, ErrorCode::BadRequest),
            },
            ErrorKind::NotFound(e) => match e {
                NotFound::UnknownPeer(_) => (S::NOT_FOUND, ErrorCode::UnknownPeer),
                NotFound::UnknownCursor(_) => (S::NOT_FOUND, ErrorCode::UnknownCursor),
                NotFound::UnknownInvite(_) => (S::NOT_FOUND, ErrorCode::UnknownInvite),
                NotFound::NoRoute { .. } => (S::NOT_FOUND, ErrorCode::NoRoute),
                NotFound::UnknownAgent(_) => (S::NOT_FOUND, ErrorCode::UnknownAgent),
                NotFound::UnknownMessage(_) | NotFound::NotAgentsMessage { .. } => {
                    (S::NOT_FOUND, ErrorCode::UnknownMessage)
                }
                NotFound::UnknownName(_) => (S::NOT_FOUND, ErrorCode::UnknownPeer),
            },
            ErrorKind::Capacity(e) => match e {
                Capacity::OutboxFull(_) => (S::TOO_MANY_REQUESTS, ErrorCode::OutboxFull),
                Capacity::Busy(_) => (S::TOO_MANY_REQUESTS, ErrorCode::Busy),
                // 503, not 429: this client sent nothing wrong or too
                // often; the socket is full of other connections.
                Capacity::TooManyConnections { .. } => (S::SERVICE_UNAVAILABLE, ErrorCode::Busy),
                Capacity::TooManyPeers(_) => (S::CONFLICT, ErrorCode::TooManyPeers),
                Capacity::TooManyAgents(_) => (S::CONFLICT, ErrorCode::TooManyAgents),
                Capacity::TryAgain(_) => (S::TOO_MANY_REQUESTS, ErrorCode::TryAgain),
            },
            ErrorKind::Unavailable(e) => match e {
                Unavailable::Store(_) => (S::SERVICE_UNAVAILABLE, ErrorCode::StoreUnavailable),
                Unavailable::Node(_) => (S::SERVICE_UNAVAILABLE, ErrorCode::NodeUnavailable),
                Unavailable::Inviter(_) => (S::SERVICE_UNAVAILABLE, ErrorCode::InviterUnreachable),
                Unavailable::Peer(_) => (S::SERVICE_UNAVAILABLE, ErrorCode::PeerUnreachable),
            },
            ErrorKind::Bug(_) => (S::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
            ErrorKind::Refused(r) => {
                let status = match r.fault {
                    Fault::Caller => S::CONFLICT,
                    Fault::NotFound => S::NOT_FOUND,
                    Fault::Capacity => S::TOO_MANY_REQUESTS,
                    Fault::Unavailable => S::SERVICE_UNAVAILABLE,
                    _ => S::INTERNAL_SERVER_ERROR,
                };
                (status, r.code)
            }
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status_and_code().0
    }

    /// The stable machine-readable code.
    pub fn code(&self) -> ErrorCode {
        self.status_and_code().1
    }

    /// The JSON body, with `extra` fields (if an object) merged into `error`.
    pub fn to_json(&self, extra: Option<serde_json::Value>) -> serde_json::Value {
        let mut inner = serde_json::json!({
            "code": self.code().as_str(),
            "fault": self.fault(),
            "message": self.to_string(),
        });
        if let (Some(serde_json::Value::Object(extra)), serde_json::Value::Object(inner)) =
            (extra, &mut inner)
        {
            inner.extend(extra);
        }
        serde_json::json!({ "error": inner })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(place) = &self.place {
            write!(f, "{place}: ")?;
        }
        write!(f, "{}", self.kind)?;
        if let Some(note) = &self.note {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl From<ErrorKind> for ApiError {
    fn from(kind: ErrorKind) -> Self {
        ApiError {
            kind,
            place: None,
            note: None,
        }
    }
}

/// `From` for each error that is an [`ErrorKind`], through it.
macro_rules! api_error_from {
    ($($t:ty),*) => {$(
        impl From<$t> for ApiError {
            fn from(e: $t) -> Self {
                ErrorKind::from(e).into()
            }
        }
    )*};
}

api_error_from!(
    Refused,
    CallerError,
    NotFound,
    Capacity,
    Unavailable,
    Bug,
    StoreError,
    CursorError
);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(code = %self.code(), "api error: {self}");
        } else {
            tracing::debug!(code = %self.code(), "api error: {self}");
        }
        (status, axum::Json(self.to_json(None))).into_response()
    }
}

impl From<StoreError> for ErrorKind {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Busy { .. } => Capacity::Busy(e.to_string()).into(),
            StoreError::Conflict(_) => Bug::new(e.to_string()).into(),
            // Unavailable, Closed, and a store that failed to open or is damaged:
            // nothing the caller did, and nothing was written.
            _ => Unavailable::Store(e.to_string()).into(),
        }
    }
}

impl From<CursorError> for ErrorKind {
    fn from(e: CursorError) -> Self {
        match e {
            CursorError::OtherNode { .. } => CallerError::CursorOtherNode(e.to_string()).into(),
            CursorError::OtherEpoch { .. } => CallerError::CursorOtherEpoch(e.to_string()).into(),
            _ => CallerError::BadCursor(e.to_string()).into(),
        }
    }
}

/// The API error for a failed node operation (peers, status, the API's own
/// writes): the one mapping of the bus's errors outside sends.
pub(crate) fn node_error(e: NodeError) -> ApiError {
    match e {
        NodeError::Store(s) => ErrorKind::from(s).into(),
        NodeError::PeerChange(c) => match c {
            PeerChangeError::SelfPeer => CallerError::BadPeer(c.to_string()).into(),
            PeerChangeError::Busy { .. } => Capacity::Busy(c.to_string()).into(),
            PeerChangeError::Store(s) => ErrorKind::from(s).into(),
            other => Bug::new(other.to_string()).into(),
        },
        NodeError::Peer(p) => match p {
            PeerError::UnknownPeer(id) => NotFound::UnknownPeer(id).into(),
            PeerError::TooManyPeers => Capacity::TooManyPeers(p.to_string()).into(),
            PeerError::SelfPeer | PeerError::TooManyAddrs(_) => {
                CallerError::BadPeer(p.to_string()).into()
            }
            PeerError::ShutDown => Unavailable::Node(p.to_string()).into(),
            other => Bug::new(other.to_string()).into(),
        },
        NodeError::Stopped => Unavailable::Node("the node is stopping".into()).into(),
        NodeError::Net(n) => Unavailable::Node(n.to_string()).into(),
        other => Bug::new(other.to_string()).into(),
    }
}

/// The API error for an invite that could not be made or revoked.
pub(crate) fn invite_error(e: InviteError) -> ApiError {
    match e {
        InviteError::BadUses(_) | InviteError::BadTtl(_) => {
            CallerError::BadValue(e.to_string()).into()
        }
        InviteError::Unknown(_) => NotFound::UnknownInvite(e.to_string()).into(),
        InviteError::Node(n) => node_error(n),
        other => Bug::new(other.to_string()).into(),
    }
}

/// The API error for a join that did not make this node a member: the
/// inviter's refusals by their own codes, "try again", an inviter that
/// cannot be reached; a refusal of this node's own request (no proof, a
/// bad one, a redelivery, a bad card) is a bug here.
pub(crate) fn join_error(e: JoinError) -> ApiError {
    match e {
        JoinError::Refused(refusal) => match refusal {
            JoinRefusal::UnknownInvite => NotFound::UnknownInvite(format!(
                "the inviter refused: {refusal}; check the code, or ask for a new invite"
            ))
            .into(),
            JoinRefusal::Expired | JoinRefusal::Revoked | JoinRefusal::Spent => {
                CallerError::JoinRefused {
                    refusal,
                    why: format!("the inviter refused: {refusal}"),
                }
                .into()
            }
            other => Bug::new(format!("the inviter refused this node's request: {other}")).into(),
        },
        e @ JoinError::TryAgain { .. } => Capacity::TryAgain(e.to_string()).into(),
        e @ JoinError::Unreachable(_) => Unavailable::Inviter(e.to_string()).into(),
        JoinError::Node(n) => node_error(n),
        other => Bug::new(other.to_string()).into(),
    }
}

/// The API error for a send to `to` the bus refused or failed: the one
/// mapping of the bus's send errors.
pub(crate) fn send_error(to: NodeId, e: SendError) -> ApiError {
    match e {
        SendError::Refused(r) => match r {
            CoreSendError::UnknownPeer(_) => NotFound::UnknownPeer(to).into(),
            CoreSendError::ToSelf => CallerError::ToSelf.into(),
            CoreSendError::TooLarge { len, max } => {
                CallerError::PayloadTooLarge { len, max }.into()
            }
            e @ CoreSendError::Busy { .. } => Capacity::Busy(e.to_string()).into(),
            e @ CoreSendError::OutboxFull { .. } => Capacity::OutboxFull(e.to_string()).into(),
            e @ (CoreSendError::Store(_)
            | CoreSendError::Held { .. }
            | CoreSendError::StoreDown { .. }) => Unavailable::Store(e.to_string()).into(),
            e @ CoreSendError::UnknownAgent(_) => {
                CallerError::UnverifiedSender(e.to_string()).into()
            }
            CoreSendError::NoSuchLocalAgent(n) => match n {
                Some(n) => NotFound::UnknownAgent(n.to_string()).into(),
                None => CallerError::BadValue(
                    "a message to this node itself must name one of its agents (AGENT@NODE)".into(),
                )
                .into(),
            },
            e @ CoreSendError::ClientIdReused { .. } => {
                CallerError::ClientIdReused(e.to_string()).into()
            }
            e @ (CoreSendError::ReservedKind(_)
            | CoreSendError::NotAnAgentMessage
            | CoreSendError::ReceiptWithoutAgent) => CallerError::BadValue(e.to_string()).into(),
            e => Bug::new(e.to_string()).into(),
        },
        e @ SendError::Stopped => Unavailable::Node(e.to_string()).into(),
        e => Bug::new(e.to_string()).into(),
    }
}

#[cfg(test)]
mod tests;
