//! The JSON shapes of the agent routes: agents, agent sends and replies,
//! inbox entries, message states, node aliases.

use serde::{Deserialize, Serialize};

use crate::json::{BodyEncoding, StreamJson};

/// The HTTP header a client of an agent socket may send with the agent it
/// means to act as; a request whose header names another agent than the
/// socket's is refused (`unverified_sender`). Identity comes from the
/// socket and its peer's uid, never from this header.
pub const AGENT_HEADER: &str = "x-mesh-agent";

/// `POST /v1/agents`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddAgentRequest {
    /// The agent's name (`[a-z0-9._-]{1,64}`), unique on this node.
    pub name: String,
    /// The uid whose processes may act as the agent [default: the uid
    /// of the process that asks].
    #[serde(default)]
    pub uid: Option<u32>,
}

/// One agent, of this node or of a peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentJson {
    /// Its name on its node.
    pub name: String,
    /// Its address, `NAME@NODE_ID`.
    pub address: String,
    /// Its node's id.
    pub node: String,
    /// Its node's local alias here, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_alias: Option<String>,
    /// Its public key (hex).
    pub key: Option<String>,
    /// Whether it is using its node now (as its node last announced).
    pub online: bool,
    /// For an agent of this node: the uid allowed to act as it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// For an agent of this node: its socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// For an agent of this node that moved to another node (its move
    /// notice says so): that node's id. It no longer acts here, and its
    /// drain runs: what comes for it here is passed on to that node until
    /// `[agents] drain_days` after the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_to: Option<String>,
    /// For an agent imported back to a node it had left: the cursor its
    /// inbox here is to be read after. What came before it was passed on
    /// to the host it moved to (it read it there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbox_after: Option<String>,
    /// For an agent of this node: its unread mail (absent for a peer's
    /// agents, and from older daemons' answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread: Option<Unread>,
}

/// The most unread entries the daemon counts per agent when it lists its
/// agents or its status (each count is one bounded inbox read): past it,
/// [`Unread::more`] says there are more.
pub const UNREAD_COUNT_MAX: u64 = 999;

/// A local agent's unread mail: what `mesh --agent NAME inbox --unread`
/// would page through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unread {
    /// Its inbox entries after its read position, counted up to
    /// [`UNREAD_COUNT_MAX`].
    pub count: u64,
    /// Whether more than `count` are unread.
    pub more: bool,
    /// When the oldest unread entry was written, if it is a message (ms
    /// since the Unix epoch, its author's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_ms: Option<u64>,
}

impl std::fmt::Display for Unread {
    /// `3 unread`, `999+ unread`, or `no unread`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.count, self.more) {
            (0, _) => write!(f, "no unread"),
            (n, true) => write!(f, "{n}+ unread"),
            (n, false) => write!(f, "{n} unread"),
        }
    }
}

/// One local agent as `GET /v1/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalAgentStatus {
    /// Its name on this node.
    pub name: String,
    /// Whether it is using this node now.
    pub online: bool,
    /// Its unread mail.
    pub unread: Unread,
}

/// `GET /v1/agents`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentsResponse {
    /// This node's agents.
    pub local: Vec<AgentJson>,
    /// The agents its peers announced (a peer offline keeps its last announcement).
    pub peers: Vec<AgentJson>,
    /// Where each agent that ever moved is now, by its move notice (absent
    /// from older daemons' answers).
    #[serde(default)]
    pub moves: Vec<AgentMoveJson>,
}

/// One agent's move notice: the newest this node holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMoveJson {
    /// The agent's name.
    pub name: String,
    /// Its address now, `NAME@NODE_ID`.
    pub address: String,
    /// Its public key (hex).
    pub key: String,
    /// The node it left.
    pub from: String,
    /// The node that hosts it now.
    pub node: String,
    /// 1 for its first move, one more for each after.
    pub version: u64,
    /// When the new host signed the notice, ms since the Unix epoch.
    pub issued_ms: u64,
}

/// The `format` of an agent export file.
pub const AGENT_EXPORT_FORMAT: &str = "agent-mesh-agent-export/v1";

/// What `mesh agent export` writes (`POST /v1/agents/{name}/export`) and
/// `mesh agent import` reads: the agent's secret key, so whoever holds it
/// can act as the agent. Keep it as the key file it is (mode 0600), move
/// it to the new host, and delete it once imported.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentExport {
    /// [`AGENT_EXPORT_FORMAT`].
    pub format: String,
    /// The agent's name (the same on its new host).
    pub name: String,
    /// Its public key (hex).
    pub key: String,
    /// Its secret key (hex, 64 digits).
    pub secret_key: String,
    /// The node it is exported from.
    pub from: String,
    /// The version of its last move (0: it never moved); the import's
    /// notice is one more.
    pub version: u64,
}

impl std::fmt::Debug for AgentExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentExport")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("from", &self.from)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// `POST /v1/agents/{name}/export` (every field optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportAgentRequest {
    /// How far the agent has read its inbox here (a cursor): what comes
    /// after it is passed on to its new host [default: the last entry
    /// this node handed to the agent, by an inbox read or its
    /// subscription; what it never saw here is passed on].
    #[serde(default)]
    pub after: Option<String>,
}

/// `POST /v1/agents/import`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportAgentRequest {
    /// The export file's content.
    pub export: AgentExport,
    /// The uid whose processes may act as the agent here [default: the
    /// uid of the process that asks].
    #[serde(default)]
    pub uid: Option<u32>,
}

/// `POST /v1/agents/{name}/move` (node socket): export the agent and hand
/// it to the peer `to` over the mesh, which imports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveAgentRequest {
    /// The peer to move it to: a node id, a node name or a local alias.
    pub to: String,
    /// How far the agent has read its inbox here, as for an export
    /// ([`ExportAgentRequest::after`]) [default: the last entry this node
    /// handed to the agent].
    #[serde(default)]
    pub after: Option<String>,
}

/// The answer to `POST /v1/agents/{name}/move`: the agent as its new host
/// hosts it, and the version of the move notice it signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveAgentResponse {
    /// The agent on its new host (its address, key, uid and socket there).
    pub agent: AgentJson,
    /// The version of the new host's move notice.
    pub version: u64,
    /// Whether the new host had imported it already (an earlier move
    /// whose answer was lost): nothing was done twice.
    #[serde(default)]
    pub already: bool,
}

/// The one answer a node sends on the move link (`amesh-move/1`) to an
/// agent export a peer offered it (the offer is the [`AgentExport`]'s JSON
/// bytes). Both are at most `mesh_protocol::MOVE_MESSAGE_BYTES_MAX` bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MoveAnswer {
    /// Imported: the node hosts the agent and signed its move notice.
    Imported {
        /// The agent as it is hosted there.
        agent: AgentJson,
        /// The notice's version.
        version: u64,
        /// It was imported there already (by an earlier offer).
        #[serde(default)]
        already: bool,
    },
    /// Refused, as `mesh agent import` would have been there: nothing was
    /// imported.
    Refused {
        /// The import's error (its code, fault and message).
        error: crate::ErrorDetail,
    },
}

/// `POST /v1/agents/{name}/send` (and each line of `.../send/batch`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSendRequest {
    /// `AGENT@NODE` (node by id, alias or name), or a node alone for that
    /// node's own journal.
    pub to: String,
    /// The message.
    pub body: String,
    /// How `body` is written: `text` (default) or `base64`.
    #[serde(default)]
    pub encoding: BodyEncoding,
    /// The message this one answers (a message id).
    #[serde(default)]
    pub in_reply_to: Option<String>,
    /// An id chosen by the sender: a retry with the same id within the
    /// node's dedup window gets the first send's answer, and nothing is
    /// sent again (1 to 128 bytes).
    #[serde(default)]
    pub client_id: Option<String>,
    /// A supersede key (1 to 128 bytes of UTF-8 without control
    /// characters): this message replaces an earlier one of this agent to
    /// the same recipient with the same key that has not been sent yet
    /// (held through a store outage, or queued for a peer that is away).
    /// The earlier one is answered, or shown by `mesh message`, as
    /// `superseded`, and its recipient gets a tombstone in its place.
    #[serde(default)]
    pub key: Option<String>,
    /// Asks for a read receipt: once the recipient agent acks past the
    /// message, its node sends back the agent's signed receipt; `mesh
    /// message ID` then says `read`, and the sender's inbox gets a `read`
    /// entry. Only for a message to an agent (`AGENT@NODE`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub receipt: bool,
}

/// `POST /v1/agents/{name}/reply`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyRequest {
    /// The id of the message answered (it must be in this agent's inbox).
    pub id: String,
    /// The reply.
    pub body: String,
    /// How `body` is written.
    #[serde(default)]
    pub encoding: BodyEncoding,
    /// As in [`AgentSendRequest::client_id`].
    #[serde(default)]
    pub client_id: Option<String>,
}

/// The answer to an agent send or reply: the message is committed here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSendResponse {
    /// The message id (32 hex digits): what a reply, `mesh message` and
    /// the recipient's inbox name it by.
    pub id: String,
    /// The recipient, `AGENT@NODE_ID` or `NODE_ID`.
    pub to: String,
    /// The message's cursor in this node's journal (`after=` this is the
    /// place to wait for its reply).
    pub cursor: String,
    /// Its stream.
    pub stream: StreamJson,
    /// Its seq in the stream.
    pub seq: u64,
    /// Set when a later send with the same key superseded this one before
    /// it was committed (it was held): the id of that send. A tombstone
    /// naming it was written in this message's place; this is not an
    /// error, and retrying would send a stale message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
}

/// One entry of an agent's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxEntry {
    /// `message`, `bounce`, `lagged`, `superseded` (a tombstone: the
    /// message `id` was replaced by `superseded_by` before it was sent),
    /// `lost` (the agent's own messages at the seqs its body names were
    /// given up before their recipient node had them; `to` is that node,
    /// `reason` why), `trimmed` (journal retention took the entry
    /// before it was read; with `forwarded_by`, retention at the node the
    /// agent moved away from took entries before they were passed on here),
    /// or `read` (a read receipt: `from` read the messages `ids` this
    /// agent sent it, at `read_ms`; acking it sends nothing back).
    pub kind: String,
    /// The message id (for a bounce: the id of the message it bounces).
    pub id: Option<String>,
    /// The sender, `AGENT@NODE_ID` (for a bounce: the node that bounced it).
    pub from: Option<String>,
    /// The recipient, `AGENT@NODE_ID`.
    pub to: Option<String>,
    /// What it answers.
    pub in_reply_to: Option<String>,
    /// The message (for a bounce or lag record: what happened, for a person).
    pub body: String,
    /// How `body` is written.
    pub encoding: BodyEncoding,
    /// `after=` this resumes past the entry.
    pub cursor: String,
    /// Its arrival in the node's journal.
    pub arrival: u64,
    /// For a message: whether its node announced its sender agent.
    pub verified: bool,
    /// For a bounce: why (`no_such_agent`); for a loss: why (`outbox_evicted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The author's clock when it was written, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    /// For a tombstone: the message that superseded `id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// For a message that reached the node its recipient moved away from
    /// and was passed on from there (or a `trimmed` entry saying what that
    /// node's retention took first): that node's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_by: Option<String>,
    /// For a `read` entry: the ids of the messages read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<String>>,
    /// For a `read` entry: when the reader acked past them, ms since the
    /// Unix epoch (the reader's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_ms: Option<u64>,
}

/// A page of an agent's inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxPage {
    /// The entries, in arrival order.
    pub entries: Vec<InboxEntry>,
    /// Pass as `after` for the next page.
    pub next: String,
}

/// `GET /v1/messages/{id}`: where a message is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageStatus {
    /// The message id.
    pub id: String,
    /// `queued` (committed here, not yet acknowledged by the recipient
    /// node), `delivered` (committed at the recipient node), `bounced`
    /// (the recipient node has no such agent), `lost` (given up before the
    /// recipient node had it; `detail` is the loss record), `received`
    /// (this node received it), `undeliverable` (this node received it for
    /// an agent it does not host), `superseded` (a later message with its
    /// key replaced it before it was sent: `superseded_by`), `read` (this
    /// node sent it, asking a receipt, and its reader's receipt came
    /// back: `read_by`, `read_ms`).
    pub state: String,
    /// The sender, `AGENT@NODE_ID`.
    pub from: String,
    /// The recipient, `AGENT@NODE_ID` or `NODE_ID`.
    pub to: String,
    /// What it answers.
    pub in_reply_to: Option<String>,
    /// Its cursor in this node's journal.
    pub cursor: String,
    /// Its stream.
    pub stream: StreamJson,
    /// Its seq.
    pub seq: u64,
    /// What happened, for a person.
    pub detail: String,
    /// For a superseded message: the message that replaced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// For a read message: its reader, `AGENT@NODE_ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_by: Option<String>,
    /// For a read message: when it was read, ms since the Unix epoch (the
    /// reader's clock, as its receipt says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_ms: Option<u64>,
}

/// `GET /v1/agents/{name}/thread/{id}`: a message, what it answers, and
/// the replies to it, as far as this agent's inbox and its sent messages
/// on this node hold them.
///
/// The entries are in the order this node journaled them (`arrival`:
/// commit order here), so a reply always comes after what it answers when
/// both are held here; `depth` gives the shape. The answer is bounded
/// (`truncated` says when it was cut, and `truncated_why` why).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadResponse {
    /// The message asked about.
    pub id: String,
    /// The thread: the messages it answers (up the `in_reply_to` chain,
    /// while this agent holds them), the message, and every reply to it or
    /// to a reply, in arrival order.
    pub entries: Vec<ThreadEntry>,
    /// Whether the thread was cut short: at the most entries or body bytes
    /// an answer holds, or where the scan for replies stopped. What is
    /// shown is still in order; what is missing came later.
    pub truncated: bool,
    /// Why it was cut, for a person (absent when it was not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_why: Option<String>,
}

/// One message of a thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadEntry {
    /// The message id.
    pub id: String,
    /// The sender, `AGENT@NODE_ID`.
    pub from: String,
    /// The recipient, `AGENT@NODE_ID` or `NODE_ID`.
    pub to: String,
    /// What it answers.
    pub in_reply_to: Option<String>,
    /// The message.
    pub body: String,
    /// How `body` is written.
    pub encoding: BodyEncoding,
    /// `sent` (this agent sent it) or `received` (it is in this agent's
    /// inbox).
    pub dir: String,
    /// Where it is, as `GET /v1/messages/{id}` says: for a sent message
    /// `queued`, `delivered`, `bounced`, `superseded` or `lost`; for a
    /// received one `received` (or `superseded`: a tombstone came in its
    /// place).
    pub state: String,
    /// How deep it is in the thread: 0 for the first message shown, one
    /// more than what it answers for a reply.
    pub depth: u32,
    /// Its cursor in this node's journal.
    pub cursor: String,
    /// Its arrival in this node's journal (the order of the entries).
    pub arrival: u64,
    /// The author's clock when it was written, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
}

/// `PUT /v1/peers/{id}/alias`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AliasRequest {
    /// The alias (`[a-z0-9._-]{1,64}`), or `null` to remove the peer's alias.
    pub alias: Option<String>,
}
