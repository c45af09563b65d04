//! `mesh mcp --agent NAME`: an MCP server on stdio for one agent, a client
//! of that agent's socket (the same API the CLI and `curl` use, so the
//! same cursors, ids and errors).
//!
//! Tools: `mesh_send`, `mesh_inbox`, `mesh_ack`, `mesh_request`,
//! `mesh_reply`, `mesh_agents`, `mesh_status`. A tool's result is the API's
//! JSON answer (as text and as structured content); a refusal is a tool
//! error whose structured content is the API's error: `{code, fault,
//! message}`. Sends and requests carry a client id (one is made when none
//! is given), so a client that retries a call that timed out does not send
//! twice.
//!
//! **Unread and ack.** `mesh_inbox` without `after` reads the agent's
//! unread entries (after its durable read position). The session keeps the
//! `next` of its last page that had entries; the following `mesh_inbox`
//! (with `ack_previous`, the default) first acks it: asking for more says
//! the previous page is read. A session that ends, or a daemon killed,
//! before that call leaves the page unread, and a new session is given it
//! again: at least once to the agent's attention, never silently skipped.
//! `mesh_ack` moves the position explicitly.
//!
//! **Push.** The inbox is the resource `mesh://inbox/NAME` (its unread
//! entries as JSON; reading it acks nothing). Once the client is
//! initialized (or first listens), one task per session long-polls the
//! inbox from the read position on and, for each new entry, sends
//! `notifications/claude/channel` (`{content, meta: {kind, id, from, to,
//! in_reply_to, cursor}}`, the capability `claude/channel` is declared for
//! Claude Code's channels) and `notifications/resources/updated` for that
//! uri with the entry's `cursor` (and `id`) in `_meta`: to a session that
//! sent `resources/subscribe`, and on each `subscriptions/listen` stream
//! (protocol 2026-07-28) that asked for the uri. A notification acks
//! nothing. While the daemon does not answer, the task asks again with a
//! backoff, going on after the last entry it told of; it ends with the
//! session. The backlog (what was unread when the session began) is read
//! without waiting and told of as its first [`WATCH_BACKLOG_TOLD_MAX`]
//! entries and one summary of the rest.
//!
//! The design is in `docs/design.md` ("Agents").
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use mesh_api::client::{Client, ClientError};
use mesh_api::{
    AgentSendRequest, AgentSendResponse, AgentsResponse, BodyEncoding, CursorBody, Fault,
    InboxEntry, InboxPage, Reply, ReplyRequest, StatusResponse, ThreadResponse, path_segment,
    wait_reply,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, CustomNotification, ExperimentalCapabilities, Implementation,
    ListResourcesResult, NotificationMetaObject, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Resource, ResourceContents,
    ResourceUpdatedNotification, ResourceUpdatedNotificationParam, ServerCapabilities,
    ServerConfig, ServerNotification, SubscribeRequestParams, SubscriptionFilter,
    UnsubscribeRequestParams,
};
use rmcp::service::{
    NotificationContext, Peer, RequestContext, SubscriptionContext, SubscriptionSink,
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceError, ServiceExt, tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::Deserialize;

/// The longest a `mesh_request` waits for its reply, in seconds.
pub const REQUEST_TIMEOUT_SECS_MAX: u64 = 3_600;

/// How long a `mesh_request` waits when it does not say, in seconds.
pub const REQUEST_TIMEOUT_SECS_DEFAULT: u64 = 60;

/// The uri of an agent's inbox as a resource, before the agent's name.
pub const INBOX_URI_PREFIX: &str = "mesh://inbox/";

/// The experimental capability of Claude Code's channels.
pub const CLAUDE_CHANNEL: &str = "claude/channel";

/// The notification of Claude Code's channels: one per new inbox entry.
pub const CLAUDE_CHANNEL_NOTIFICATION: &str = "notifications/claude/channel";

/// The most unread entries a read of the inbox resource returns.
pub const RESOURCE_ENTRIES_MAX: u32 = 100;

/// The most entries of the backlog (what was unread when the session
/// began) a session is told of one by one; the rest are told of in one
/// summary, so that a long-unread inbox does not flood the model's context.
pub const WATCH_BACKLOG_TOLD_MAX: usize = 5;

/// The most entries one long poll of the watcher asks for.
pub const WATCH_PAGE_ENTRIES: u32 = 100;

/// How long one long poll of the watcher waits, in seconds.
pub const WATCH_WAIT_SECS: u64 = 60;

/// The first wait before the watcher asks a daemon that did not answer again.
pub const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// The longest wait before the watcher asks again.
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// `mesh_send`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendArgs {
    /// The recipient: `AGENT@NODE` (node by id or alias), or a node alone
    /// for that node's own journal.
    pub to: String,
    /// The message text.
    pub body: String,
    /// An id for this message, 1 to 128 bytes: a retry with the same id
    /// answers the first send and sends nothing again. One is made if absent.
    #[serde(default)]
    pub client_id: Option<String>,
    /// The id of the message this one answers (use `mesh_reply` to answer
    /// a message in the inbox).
    #[serde(default)]
    pub in_reply_to: Option<String>,
    /// A supersede key, 1 to 128 bytes: this message replaces an earlier
    /// one of this agent to the same recipient with the same key that has
    /// not been sent yet; that one is then `superseded` (its recipient
    /// gets a tombstone in its place). For status updates and heartbeats.
    #[serde(default)]
    pub key: Option<String>,
    /// Ask for a read receipt (only to `AGENT@NODE`): once the recipient
    /// agent acks past this message, this agent's inbox gets a `read`
    /// entry (reader, ids, read_ms) and the message's status says `read`.
    #[serde(default)]
    pub receipt: bool,
}

/// `mesh_inbox`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct InboxArgs {
    /// The cursor to read after: the `next` of an earlier page, or an
    /// entry's `cursor`. Absent: read the unread entries (after this
    /// agent's read position).
    #[serde(default)]
    pub after: Option<String>,
    /// Whether everything the previous `mesh_inbox` page of this session
    /// gave you is read (default true): if so, the read position moves past
    /// it before this page is read. Give false to see those entries again.
    #[serde(default)]
    pub ack_previous: Option<bool>,
    /// The most entries to return, 1 to 1000 (default 100).
    #[serde(default)]
    pub limit: Option<u32>,
    /// If there are none yet, wait up to this many seconds (0 to 600) for
    /// the first to arrive.
    #[serde(default)]
    pub wait: Option<u64>,
}

/// `mesh_ack`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AckArgs {
    /// An entry's `cursor` or a page's `next`: this agent has read its
    /// inbox up to there.
    pub cursor: String,
}

/// `mesh_request`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RequestArgs {
    /// The recipient, `AGENT@NODE`.
    pub to: String,
    /// The message text.
    pub body: String,
    /// How long to wait for the reply, in seconds (default 60, at most 3600).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// As for `mesh_send`; one is made if absent.
    #[serde(default)]
    pub client_id: Option<String>,
}

/// `mesh_reply`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReplyArgs {
    /// The id of a message in this agent's inbox.
    pub id: String,
    /// The reply text.
    pub body: String,
    /// As for `mesh_send`; one is made if absent.
    #[serde(default)]
    pub client_id: Option<String>,
}

/// `mesh_thread`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ThreadArgs {
    /// The id of a message this agent sent or received.
    pub id: String,
}

/// The MCP server of one agent: one per session (`mesh mcp` serves one
/// session on stdio), so what it keeps is the session's.
#[derive(Clone)]
pub struct MeshServer {
    client: Client,
    agent: String,
    session: Arc<Session>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for MeshServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshServer")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// What a session keeps between calls.
#[derive(Default)]
struct Session {
    /// The `next` of this session's last `mesh_inbox` page that had
    /// entries and is not acked yet: what `ack_previous` acks.
    last_page: Mutex<Option<String>>,
    /// Whether the client subscribed to the inbox (`resources/subscribe`).
    subscribed: AtomicBool,
    /// The `subscriptions/listen` streams that asked for the inbox.
    listeners: Mutex<Vec<SubscriptionSink>>,
    /// The task that tells the client of new entries, once started.
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Locks `m`; a panic of another holder leaves only plain data behind, so
/// a poisoned lock is used as it is.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A client id for a call that gave none: unique per process and moment.
fn fresh_client_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("mcp-{}-{nanos:x}", std::process::id())
}

/// A tool's answer: `value` as structured content.
fn answer(value: impl serde::Serialize) -> CallToolResult {
    CallToolResult::structured(serde_json::to_value(value).unwrap_or_default())
}

/// A tool error carrying the API's error (`code`, `fault`, `message`).
fn refusal(e: &ClientError) -> CallToolResult {
    let (code, status) = match e {
        ClientError::Api { code, status, .. } => (code.clone(), Some(*status)),
        ClientError::NotRunning { .. } => ("not_running".to_owned(), None),
        ClientError::Connect { .. } | ClientError::Http(_) => ("node_unavailable".to_owned(), None),
        _ => ("internal".to_owned(), None),
    };
    let message = match e {
        ClientError::Api { message, .. } => message.clone(),
        other => other.to_string(),
    };
    CallToolResult::structured_error(serde_json::json!({
        "code": code,
        "fault": e.fault().as_str(),
        "status": status,
        "message": message,
    }))
}

fn result<T: serde::Serialize>(r: Result<T, ClientError>) -> Result<CallToolResult, ErrorData> {
    Ok(match r {
        Ok(v) => answer(v),
        Err(e) => refusal(&e),
    })
}

#[tool_router]
impl MeshServer {
    /// The server of `agent`, a client of its socket `client`.
    pub fn new(client: Client, agent: &str) -> Self {
        MeshServer {
            client,
            agent: agent.to_owned(),
            session: Arc::default(),
            tool_router: Self::tool_router(),
        }
    }

    fn path(&self, route: &str) -> String {
        format!("/v1/agents/{}/{route}", path_segment(&self.agent))
    }

    async fn send_as(&self, req: AgentSendRequest) -> Result<AgentSendResponse, ClientError> {
        self.client.post(&self.path("send"), &req).await
    }

    #[tool(
        name = "mesh_send",
        description = "Send a message as this agent to AGENT@NODE (or to a node's own journal). Returns its id once it is durably committed here. A retry with the same client_id is answered without sending again. With receipt: true (to AGENT@NODE only), a `read` entry comes to this inbox once the recipient agent has read and acked it."
    )]
    async fn mesh_send(
        &self,
        Parameters(a): Parameters<SendArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let req = AgentSendRequest {
            to: a.to,
            body: a.body,
            encoding: Default::default(),
            in_reply_to: a.in_reply_to,
            client_id: Some(a.client_id.unwrap_or_else(fresh_client_id)),
            key: a.key,
            receipt: a.receipt,
        };
        result(self.send_as(req).await)
    }

    /// The uri of this agent's inbox as a resource.
    fn inbox_uri(&self) -> String {
        format!("{INBOX_URI_PREFIX}{}", self.agent)
    }

    /// Moves the read position to `cursor`; the position after.
    async fn ack(&self, cursor: &str) -> Result<serde_json::Value, ClientError> {
        self.client
            .post(
                &self.path("ack"),
                &CursorBody {
                    cursor: cursor.to_owned(),
                },
            )
            .await
    }

    /// Up to `limit` inbox entries after the cursor `after` (absent: the
    /// unread ones, after the read position), waiting up to `wait` seconds
    /// for the first.
    async fn inbox_page(
        &self,
        after: Option<&str>,
        limit: u32,
        wait: u64,
    ) -> Result<InboxPage, ClientError> {
        let from = match after {
            None => "unread=true".to_owned(),
            Some(c) => format!("after={}", path_segment(c)),
        };
        let path = format!("{}?{from}&limit={limit}&wait={wait}", self.path("inbox"));
        self.client.get(&path).await
    }

    #[tool(
        name = "mesh_inbox",
        description = "Read this agent's inbox: messages to it, bounces and losses of its messages, lag records. Without `after` it returns the UNREAD entries, oldest first: those after this agent's read position. With `ack_previous` (default true), calling it says that everything the previous mesh_inbox page of this session gave you is read: the read position moves past that page first, so the next call without `after` gives only newer entries. Pass ack_previous=false to get the same unread entries again. The first call of a session acks nothing, so entries given before a restart of the session but never acked come again: handle each entry by its `id` once. Returns the entries (id, from, to, in_reply_to, body, cursor) and `next`. With `after` (an entry's `cursor` or a page's `next`) it reads after that cursor instead. With `wait`, waits for the first entry to arrive. To ack without reading, use mesh_ack."
    )]
    async fn mesh_inbox(
        &self,
        Parameters(a): Parameters<InboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        if a.ack_previous.unwrap_or(true) {
            let previous = lock(&self.session.last_page).take();
            if let Some(cursor) = previous
                && let Err(e) = self.ack(&cursor).await
            {
                // Not asked: ack it next time. Refused: the node will never
                // take it, and its entries come again as unread.
                if e.fault() == Fault::Unavailable {
                    lock(&self.session.last_page).get_or_insert(cursor);
                }
                return Ok(refusal(&e));
            }
        }
        let limit = a.limit.unwrap_or(100);
        let wait = a.wait.unwrap_or(0);
        let page = self.inbox_page(a.after.as_deref(), limit, wait).await;
        if let Ok(p) = &page
            && !p.entries.is_empty()
        {
            *lock(&self.session.last_page) = Some(p.next.clone());
        }
        result(page)
    }

    #[tool(
        name = "mesh_ack",
        description = "Say that this agent has read its inbox up to `cursor` (an entry's `cursor` or a page's `next`): the read position moves there (never back), so mesh_inbox without `after` starts after it, also in later sessions and after a restart. Returns `cursor`, the read position after. A cursor of another node, a malformed one or one past the journal head is a tool error and changes nothing."
    )]
    async fn mesh_ack(
        &self,
        Parameters(a): Parameters<AckArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        result(self.ack(&a.cursor).await)
    }

    #[tool(
        name = "mesh_request",
        description = "Send a message as this agent to AGENT@NODE and wait for the reply that answers it. Returns the reply entry; a `timeout` error if none came in time (a late reply still lands in the inbox)."
    )]
    async fn mesh_request(
        &self,
        Parameters(a): Parameters<RequestArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let timeout = a
            .timeout_secs
            .unwrap_or(REQUEST_TIMEOUT_SECS_DEFAULT)
            .min(REQUEST_TIMEOUT_SECS_MAX);
        let req = AgentSendRequest {
            to: a.to,
            body: a.body,
            encoding: Default::default(),
            in_reply_to: None,
            client_id: Some(a.client_id.unwrap_or_else(fresh_client_id)),
            key: None,
            receipt: false,
        };
        let sent = match self.send_as(req).await {
            Ok(s) => s,
            Err(e) => return Ok(refusal(&e)),
        };
        let waited = wait_reply(
            &self.client,
            &self.agent,
            &sent,
            Duration::from_secs(timeout),
        )
        .await;
        Ok(match waited {
            Ok(Reply::Answer(e)) => answer(serde_json::json!({ "request": sent, "reply": e })),
            Ok(Reply::Bounced(e)) => CallToolResult::structured_error(serde_json::json!({
                "code": "bounced",
                "fault": "not_found",
                "message": e.body,
                "request": sent,
            })),
            Ok(Reply::TimedOut) => CallToolResult::structured_error(serde_json::json!({
                "code": "timeout",
                "fault": "unavailable",
                "message": format!(
                    "no reply to message {} within {timeout} s; a late reply still lands in the inbox",
                    sent.id
                ),
                "request": sent,
            })),
            Err(e) => refusal(&e),
        })
    }

    #[tool(
        name = "mesh_reply",
        description = "Reply as this agent to a message in its inbox, by the message's id. Returns the reply's id once committed."
    )]
    async fn mesh_reply(
        &self,
        Parameters(a): Parameters<ReplyArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let req = ReplyRequest {
            id: a.id,
            body: a.body,
            encoding: Default::default(),
            client_id: Some(a.client_id.unwrap_or_else(fresh_client_id)),
        };
        result(
            self.client
                .post::<AgentSendResponse>(&self.path("reply"), &req)
                .await,
        )
    }

    #[tool(
        name = "mesh_thread",
        description = "The conversation a message of this agent belongs to, by the message's id: what it answers (up its in_reply_to chain), the message, and every reply to it or to a reply, in the order they reached this node. Each entry has id, from, to, in_reply_to, body, dir (sent or received), state (queued, delivered, bounced, superseded, lost or received), depth (0 for the first of the chain) and, for a received one, its cursor. `truncated` says the thread was cut short (at 1000 entries or 4 MiB); what is shown is still in order. Reading a thread acks nothing."
    )]
    async fn mesh_thread(
        &self,
        Parameters(a): Parameters<ThreadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let path = self.path(&format!("thread/{}", path_segment(a.id.trim())));
        result(self.client.get::<ThreadResponse>(&path).await)
    }

    #[tool(
        name = "mesh_agents",
        description = "List the agents on this node and on its peers (AGENT@NODE addresses), online or offline."
    )]
    async fn mesh_agents(&self) -> Result<CallToolResult, ErrorData> {
        result(self.client.get::<AgentsResponse>("/v1/agents").await)
    }

    #[tool(
        name = "mesh_status",
        description = "This node's status: its id, its peers (connected or not, aliases, queued messages) and its journal head."
    )]
    async fn mesh_status(&self) -> Result<CallToolResult, ErrorData> {
        result(self.client.get::<StatusResponse>("/v1/status").await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for MeshServer {
    fn get_info(&self) -> ServerConfig {
        let mut experimental = ExperimentalCapabilities::new();
        // Claude Code's channels: it shows `notifications/claude/channel` to
        // the model as it comes.
        experimental.insert(CLAUDE_CHANNEL.to_owned(), serde_json::Map::new());
        let capabilities = ServerCapabilities::builder()
            .enable_experimental_with(experimental)
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tools()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("agent-mesh", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "agent-mesh, as agent {agent}: send durable messages to agents on other nodes \
                 (AGENT@NODE), read this agent's unread inbox with mesh_inbox (each call acks \
                 the page before it), request and reply. Nothing is lost silently: a message is \
                 delivered once, bounced, or its loss is recorded. New entries are announced \
                 as notifications/claude/channel and, to a subscriber of {uri}, as \
                 notifications/resources/updated; a notification acks nothing.",
                agent = self.agent,
                uri = self.inbox_uri(),
            ))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.start_watching(context.peer);
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let inbox = Resource::new(self.inbox_uri(), format!("inbox of {}", self.agent))
            .with_description(
                "This agent's unread inbox entries (after its read position) as JSON: \
                 {entries, next}. Reading it acks nothing; subscribe to hear of new entries.",
            )
            .with_mime_type("application/json");
        Ok(ListResourcesResult::with_all_items(vec![inbox]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.check_uri(&request.uri)?;
        let page = self
            .inbox_page(None, RESOURCE_ENTRIES_MAX, 0)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let text = serde_json::to_string(&page)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let contents = ResourceContents::text(text, request.uri).with_mime_type("application/json");
        // Unread entries change with every arrival and ack: never cached.
        Ok(ReadResourceResult::new(vec![contents])
            .with_ttl_ms(0)
            .into())
    }

    #[allow(deprecated)] // The subscription of sessions before 2026-07-28 (Claude Code's).
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.check_uri(&request.uri)?;
        self.session.subscribed.store(true, Ordering::SeqCst);
        self.start_watching(context.peer);
        Ok(())
    }

    #[allow(deprecated)] // As `subscribe`.
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.check_uri(&request.uri)?;
        self.session.subscribed.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // rmcp keeps of this what was asked for.
        Some(
            SubscriptionFilter::builder()
                .resource_subscription(self.inbox_uri())
                .build(),
        )
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.start_watching(context.request_context().peer.clone());
        let sink = context.sink().clone();
        let id = sink.id().clone();
        let uri = self.inbox_uri();
        let wants = sink
            .accepted()
            .resource_subscriptions
            .as_ref()
            .is_some_and(|uris| uris.contains(&uri));
        if wants {
            lock(&self.session.listeners).push(sink);
        }
        context.cancelled().await;
        lock(&self.session.listeners).retain(|s| s.id() != &id);
        Ok(())
    }
}

impl MeshServer {
    /// Refuses a resource uri that is not this agent's inbox.
    fn check_uri(&self, uri: &str) -> Result<(), ErrorData> {
        if uri == self.inbox_uri() {
            Ok(())
        } else {
            Err(ErrorData::resource_not_found(
                format!("no resource {uri}: this server has {}", self.inbox_uri()),
                None,
            ))
        }
    }

    /// Starts the task that tells `peer` of new inbox entries, unless it
    /// runs already.
    fn start_watching(&self, peer: Peer<RoleServer>) {
        let mut watcher = lock(&self.session.watcher);
        if watcher.is_none() {
            *watcher = Some(tokio::spawn(self.clone().watch(peer)));
        }
    }

    /// Stops the watcher (the session ended).
    fn stop_watching(&self) {
        if let Some(w) = lock(&self.session.watcher).take() {
            w.abort();
        }
    }

    /// Tells `peer` of each inbox entry as it commits, from the read
    /// position on: a long poll of the inbox (one page of at most
    /// [`WATCH_PAGE_ENTRIES`] at a time), asked again with a backoff from
    /// [`WATCH_BACKOFF_MIN`] to [`WATCH_BACKOFF_MAX`] while the daemon
    /// cannot answer, until the client is gone.
    async fn watch(self, peer: Peer<RoleServer>) {
        // None: from the read position.
        let mut after: Option<String> = None;
        let mut backoff = WATCH_BACKOFF_MIN;
        // Until the first page short of full: how much of the backlog was
        // told of one by one, and what was left to the summary.
        let mut backlog = Some(Backlog::default());
        while !peer.is_transport_closed() {
            // The backlog is read as it is, without waiting: what comes
            // after it is not backlog, and its summary is not held back by
            // a wait when it fills whole pages.
            let wait = if backlog.is_some() {
                0
            } else {
                WATCH_WAIT_SECS
            };
            let page = self
                .inbox_page(after.as_deref(), WATCH_PAGE_ENTRIES, wait)
                .await;
            match page {
                Ok(page) => {
                    backoff = WATCH_BACKOFF_MIN;
                    let full = page.entries.len() >= WATCH_PAGE_ENTRIES as usize;
                    for e in &page.entries {
                        if let Some(b) = backlog.as_mut() {
                            if b.told >= WATCH_BACKLOG_TOLD_MAX {
                                b.skipped += 1;
                                b.last = Some(e.cursor.clone());
                                continue;
                            }
                            b.told += 1;
                        }
                        if let Err(err) = self.tell(&peer, e).await {
                            tracing::debug!(agent = %self.agent, "the client is gone: {err}");
                            return;
                        }
                    }
                    // A page short of full: the backlog is read through.
                    if !full
                        && let Some(b) = backlog.take()
                        && let (true, Some(last)) = (b.skipped > 0, b.last)
                        && let Err(err) = self.tell_more(&peer, b.skipped, &last).await
                    {
                        tracing::debug!(agent = %self.agent, "the client is gone: {err}");
                        return;
                    }
                    after = Some(page.next);
                }
                Err(e) => {
                    tracing::debug!(agent = %self.agent, "the inbox watch is waiting: {e}");
                    // A cursor refused (another epoch after a restore): go
                    // on from the read position.
                    if e.fault() == Fault::Caller {
                        after = None;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(WATCH_BACKOFF_MAX);
                }
            }
        }
    }

    /// Tells `peer` that `count` more unread entries, up to `cursor`, wait
    /// in the inbox: one channel notification and one update of the inbox
    /// resource for them all.
    ///
    /// # Errors
    /// If the client cannot be written to.
    async fn tell_more(
        &self,
        peer: &Peer<RoleServer>,
        count: usize,
        cursor: &str,
    ) -> Result<(), ServiceError> {
        let content = format!(
            "{count} more unread messages are waiting for {}; read them with mesh_inbox",
            self.agent
        );
        let meta = serde_json::json!({
            "kind": "unread",
            "count": count.to_string(),
            "cursor": cursor,
        });
        self.tell_params(
            peer,
            serde_json::json!({ "content": content, "meta": meta }),
            cursor,
            None,
        )
        .await
    }

    /// Tells `peer` of entry `e`: a channel notification, and an update of
    /// the inbox resource to a subscriber. Each carries the entry's cursor.
    ///
    /// # Errors
    /// If the client cannot be written to.
    async fn tell(&self, peer: &Peer<RoleServer>, e: &InboxEntry) -> Result<(), ServiceError> {
        self.tell_params(peer, channel_params(e), &e.cursor, e.id.as_deref())
            .await
    }

    /// Sends the channel notification `params`, and an update of the inbox
    /// resource carrying `cursor` (and the entry's `id`) to a subscriber.
    ///
    /// # Errors
    /// If the client cannot be written to.
    async fn tell_params(
        &self,
        peer: &Peer<RoleServer>,
        params: serde_json::Value,
        cursor: &str,
        id: Option<&str>,
    ) -> Result<(), ServiceError> {
        peer.send_notification(ServerNotification::CustomNotification(
            CustomNotification::new(CLAUDE_CHANNEL_NOTIFICATION, Some(params)),
        ))
        .await?;
        let uri = self.inbox_uri();
        let updated = || {
            let mut meta = NotificationMetaObject::new();
            meta.insert("cursor".to_owned(), cursor.to_owned().into());
            if let Some(id) = id {
                meta.insert("id".to_owned(), id.to_owned().into());
            }
            let mut param = ResourceUpdatedNotificationParam::new(uri.clone());
            param.meta = Some(meta);
            param
        };
        if self.session.subscribed.load(Ordering::SeqCst) {
            peer.notify_resource_updated(updated()).await?;
        }
        let listeners = lock(&self.session.listeners).clone();
        for sink in listeners {
            let n = ResourceUpdatedNotification::new(updated());
            if let Err(err) = sink
                .send(ServerNotification::ResourceUpdatedNotification(n))
                .await
            {
                tracing::debug!(agent = %self.agent, "a listen stream ended: {err}");
                lock(&self.session.listeners).retain(|s| s.id() != sink.id());
            }
        }
        Ok(())
    }
}

/// What the watcher has told of the backlog so far.
#[derive(Default)]
struct Backlog {
    /// Entries told of one by one.
    told: usize,
    /// Entries past [`WATCH_BACKLOG_TOLD_MAX`], left to the summary.
    skipped: usize,
    /// The cursor of the last of them.
    last: Option<String>,
}

/// The params of `notifications/claude/channel` for entry `e`: its body as
/// `content`, and in `meta` (string values only, as Claude Code takes
/// them) what it is, who sent it and its cursor.
fn channel_params(e: &InboxEntry) -> serde_json::Value {
    let mut meta = serde_json::Map::new();
    let fields = [
        ("kind", Some(&e.kind)),
        ("id", e.id.as_ref()),
        ("from", e.from.as_ref()),
        ("to", e.to.as_ref()),
        ("in_reply_to", e.in_reply_to.as_ref()),
        ("reason", e.reason.as_ref()),
        ("cursor", Some(&e.cursor)),
    ];
    for (key, value) in fields {
        if let Some(v) = value {
            meta.insert(key.to_owned(), v.clone().into());
        }
    }
    if e.encoding != BodyEncoding::Text {
        let encoding = serde_json::to_value(e.encoding).unwrap_or_default();
        meta.insert("encoding".to_owned(), encoding);
    }
    serde_json::json!({ "content": e.body, "meta": meta })
}

/// Serves MCP on stdio as `agent` through `client` until the MCP client
/// ends the session (closes stdin).
///
/// # Errors
/// If the runtime cannot start or the session fails.
pub fn run(client: Client, agent: &str) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let server = MeshServer::new(client, agent);
        let running = server
            .clone()
            .serve(rmcp::transport::stdio())
            .await
            .context("the MCP session did not start")?;
        let ended = running.waiting().await;
        server.stop_watching();
        ended.context("the MCP session failed")?;
        Ok(())
    })
}
