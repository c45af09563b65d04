//! How the API says a request failed: `{"error": {"code", "fault", "message"}}`,
//! the stable codes, the fault classes, and the `mesh` exit code of each class.

use serde::{Deserialize, Serialize};

/// Who is at fault when a request fails, and so what a caller can do about it.
///
/// Each class has one `mesh` exit code ([`Fault::exit_code`]), so a script
/// or an agent branches on the class without parsing messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Fault {
    /// The request was wrong (bad input, not allowed): change it, do not retry it.
    Caller,
    /// What the request names does not exist (a peer, a cursor, a route).
    NotFound,
    /// A bound was reached (a full peer outbox, a busy bus): retry later.
    Capacity,
    /// The node cannot serve now (not running, stopping, store down): retry once it is back.
    Unavailable,
    /// A bug in the node or the client: report it.
    Bug,
}

/// The exit code of `mesh` when it fails for a reason that is none of the fault classes
/// (a daemon that cannot start, stdout closed).
pub const EXIT_OTHER: u8 = 1;
/// The exit code of `mesh` for a command line it cannot parse.
pub const EXIT_USAGE: u8 = 2;
/// The exit code of `mesh request` when no reply came in time (the reply
/// still lands in the inbox if it comes later).
pub const EXIT_TIMEOUT: u8 = 8;

impl Fault {
    /// Every class, in exit-code order.
    pub const ALL: [Fault; 5] = [
        Fault::Caller,
        Fault::NotFound,
        Fault::Capacity,
        Fault::Unavailable,
        Fault::Bug,
    ];

    /// The exit code of `mesh` when a command fails for this reason.
    pub const fn exit_code(self) -> u8 {
        match self {
            Fault::Caller => 3,
            Fault::NotFound => 4,
            Fault::Capacity => 5,
            Fault::Unavailable => 6,
            Fault::Bug => 7,
        }
    }

    /// The wire name (`caller`, `not_found`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Fault::Caller => "caller",
            Fault::NotFound => "not_found",
            Fault::Capacity => "capacity",
            Fault::Unavailable => "unavailable",
            Fault::Bug => "bug",
        }
    }

    /// What the class means, in a few words.
    pub const fn meaning(self) -> &'static str {
        match self {
            Fault::Caller => "the request was wrong or not allowed; change it",
            Fault::NotFound => "no such peer, agent, message, cursor, invite or route",
            Fault::Capacity => "a bound was reached (peer outbox full, node busy); retry later",
            Fault::Unavailable => "the daemon is not running, stopping, or its store is down",
            Fault::Bug => "a bug in the daemon or the client; please report it",
        }
    }

    /// The class an answer's HTTP status implies, for an error body that
    /// does not name its fault (an older daemon, or not JSON at all).
    pub fn from_status(status: u16) -> Fault {
        match status {
            404 => Fault::NotFound,
            429 => Fault::Capacity,
            400..=499 => Fault::Caller,
            503 => Fault::Unavailable,
            _ => Fault::Bug,
        }
    }

    /// The exit-code table `mesh --help` prints.
    pub fn exit_code_help() -> String {
        let mut text = String::from("Exit codes:\n  0  success\n");
        text.push_str(&format!(
            "  {EXIT_OTHER}  another failure (the daemon could not start, output could not be written)\n"
        ));
        text.push_str(&format!("  {EXIT_USAGE}  the command line is wrong\n"));
        for f in Fault::ALL {
            text.push_str(&format!(
                "  {}  {}: {}\n",
                f.exit_code(),
                f.as_str(),
                f.meaning()
            ));
        }
        text.push_str(&format!(
            "  {EXIT_TIMEOUT}  no reply in time (`mesh request`); a late reply still lands in the inbox\n"
        ));
        text
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stable machine-readable code of an error; several codes share a [`Fault`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The body is not JSON, or not the expected shape.
    BadJson,
    /// The body is larger than the route accepts.
    BodyTooLarge,
    /// A value has the right type but is not acceptable.
    BadRequest,
    /// The text is not a cursor, or points past the journal head.
    BadCursor,
    /// The connecting uid may not use the node.
    Forbidden,
    /// The route exists, not with this method.
    MethodNotAllowed,
    /// The cursor was issued by another node.
    CursorOtherNode,
    /// The cursor was issued under another store epoch of this node.
    CursorOtherEpoch,
    /// The peer is not known to this node.
    UnknownPeer,
    /// No named cursor of that name.
    UnknownCursor,
    /// No such route.
    NoRoute,
    /// The peer's outbox is full of unacknowledged messages.
    OutboxFull,
    /// The node has too many requests of this kind waiting.
    Busy,
    /// The node knows as many peers as it may.
    TooManyPeers,
    /// The store cannot be written or read now.
    StoreUnavailable,
    /// The node is starting or stopping.
    NodeUnavailable,
    /// A bug.
    Internal,
    /// The caller is not the agent it acts as (another uid, another
    /// agent's socket, an agent that no longer exists).
    UnverifiedSender,
    /// A name matches more than one node; the message lists them.
    AmbiguousName,
    /// A client id was already used for another message.
    ClientIdReused,
    /// An agent of that name exists already.
    AgentExists,
    /// The agent moved to another node: it no longer acts here.
    AgentMoved,
    /// The agent has inbox entries this node never handed to it; removing
    /// it needs `force`.
    UnreadEntries,
    /// No agent of that name on this node.
    UnknownAgent,
    /// No message of that id is known to this node.
    UnknownMessage,
    /// The node hosts as many agents as it may.
    TooManyAgents,
    /// The inviter asks to try the join again shortly; nothing was spent.
    TryAgain,
    /// The inviter knows no such invite (or its secret does not match).
    UnknownInvite,
    /// The invite has expired.
    InviteExpired,
    /// The invite was revoked.
    InviteRevoked,
    /// Every use of the invite is spent.
    InviteSpent,
    /// The inviter cannot be reached at the addresses in the invite code.
    InviterUnreachable,
    /// A peer asked to do something (take an agent that moves) could not be
    /// reached, does not speak the link, or gave no answer in time.
    PeerUnreachable,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 33] = [
        ErrorCode::BadJson,
        ErrorCode::BodyTooLarge,
        ErrorCode::BadRequest,
        ErrorCode::BadCursor,
        ErrorCode::Forbidden,
        ErrorCode::MethodNotAllowed,
        ErrorCode::CursorOtherNode,
        ErrorCode::CursorOtherEpoch,
        ErrorCode::UnknownPeer,
        ErrorCode::UnknownCursor,
        ErrorCode::NoRoute,
        ErrorCode::OutboxFull,
        ErrorCode::Busy,
        ErrorCode::TooManyPeers,
        ErrorCode::StoreUnavailable,
        ErrorCode::NodeUnavailable,
        ErrorCode::Internal,
        ErrorCode::UnverifiedSender,
        ErrorCode::AmbiguousName,
        ErrorCode::ClientIdReused,
        ErrorCode::AgentExists,
        ErrorCode::AgentMoved,
        ErrorCode::UnreadEntries,
        ErrorCode::UnknownAgent,
        ErrorCode::UnknownMessage,
        ErrorCode::TooManyAgents,
        ErrorCode::TryAgain,
        ErrorCode::UnknownInvite,
        ErrorCode::InviteExpired,
        ErrorCode::InviteRevoked,
        ErrorCode::InviteSpent,
        ErrorCode::InviterUnreachable,
        ErrorCode::PeerUnreachable,
    ];

    /// The code as it is written in `error.code`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadJson => "bad_json",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::BadCursor => "bad_cursor",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::CursorOtherNode => "cursor_other_node",
            ErrorCode::CursorOtherEpoch => "cursor_other_epoch",
            ErrorCode::UnknownPeer => "unknown_peer",
            ErrorCode::UnknownCursor => "unknown_cursor",
            ErrorCode::NoRoute => "no_route",
            ErrorCode::OutboxFull => "outbox_full",
            ErrorCode::Busy => "busy",
            ErrorCode::TooManyPeers => "too_many_peers",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::NodeUnavailable => "node_unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::UnverifiedSender => "unverified_sender",
            ErrorCode::AmbiguousName => "ambiguous_name",
            ErrorCode::ClientIdReused => "client_id_reused",
            ErrorCode::AgentExists => "agent_exists",
            ErrorCode::AgentMoved => "agent_moved",
            ErrorCode::UnreadEntries => "unread_entries",
            ErrorCode::UnknownAgent => "unknown_agent",
            ErrorCode::UnknownMessage => "unknown_message",
            ErrorCode::TooManyAgents => "too_many_agents",
            ErrorCode::TryAgain => "try_again",
            ErrorCode::UnknownInvite => "unknown_invite",
            ErrorCode::InviteExpired => "invite_expired",
            ErrorCode::InviteRevoked => "invite_revoked",
            ErrorCode::InviteSpent => "invite_spent",
            ErrorCode::InviterUnreachable => "inviter_unreachable",
            ErrorCode::PeerUnreachable => "peer_unreachable",
        }
    }

    /// The code written as `text`, if it is one this build knows.
    pub fn parse(text: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == text)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// `{code, fault, message}` inside [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// The stable code, e.g. `unknown_peer` (see [`ErrorCode`]).
    pub code: String,
    /// Who is at fault; absent from older daemons' answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// A sentence a person can act on.
    pub message: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;

    #[test]
    fn every_fault_class_has_its_own_exit_code_apart_from_success_usage_and_other() {
        let mut codes: Vec<u8> = Fault::ALL.iter().map(|f| f.exit_code()).collect();
        codes.extend([0, EXIT_OTHER, EXIT_USAGE, EXIT_TIMEOUT]);
        let n = codes.len();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), n, "{codes:?}");
        let help = Fault::exit_code_help();
        for f in Fault::ALL {
            assert!(
                help.contains(&format!("  {}  {}", f.exit_code(), f)),
                "{help}"
            );
        }
    }

    #[test]
    fn codes_and_faults_round_trip_through_their_wire_names() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
        }
        assert_eq!(ErrorCode::parse("nonsense"), None);
        for f in Fault::ALL {
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{f}\""));
            assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), f);
        }
    }

    #[test]
    fn an_error_body_without_a_fault_still_decodes() {
        let b: ErrorBody =
            serde_json::from_str(r#"{"error":{"code":"internal","message":"x"}}"#).unwrap();
        assert_eq!(b.error.fault, None);
        assert_eq!(Fault::from_status(507), Fault::Bug);
        assert_eq!(Fault::from_status(429), Fault::Capacity);
        assert_eq!(Fault::from_status(409), Fault::Caller);
        assert_eq!(Fault::from_status(503), Fault::Unavailable);
    }
}
