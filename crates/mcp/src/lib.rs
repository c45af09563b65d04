//! `mesh mcp --agent NAME`: an MCP server on stdio for one agent, a client
//! of that agent's socket (the same API the CLI and `curl` use, so the
//! same cursors, ids and errors).
//!
//! Tools: `mesh_send`, `mesh_inbox`, `mesh_request`, `mesh_reply`,
//! `mesh_agents`, `mesh_status`. A tool's result is the API's JSON answer
//! (as text and as structured content); a refusal is a tool error whose
//! structured content is the API's error: `{code, fault, message}`. Sends
//! and requests carry a client id (one is made when none is given), so a
//! client that retries a call that timed out does not send twice.
//!
//! The design is in `docs/design.md` ("Agents").
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::time::Duration;

use anyhow::Context as _;
use mesh_api::client::{Client, ClientError};
use mesh_api::{
    AgentSendRequest, AgentSendResponse, AgentsResponse, InboxPage, Reply, ReplyRequest,
    StatusResponse, path_segment, wait_reply,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ErrorData, ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

/// The longest a `mesh_request` waits for its reply, in seconds.
pub const REQUEST_TIMEOUT_SECS_MAX: u64 = 3_600;

/// How long a `mesh_request` waits when it does not say, in seconds.
pub const REQUEST_TIMEOUT_SECS_DEFAULT: u64 = 60;

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
}

/// `mesh_inbox`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct InboxArgs {
    /// The cursor to read after: the `next` of the previous page (absent:
    /// from the start).
    #[serde(default)]
    pub after: Option<String>,
    /// The most entries to return, 1 to 1000 (default 100).
    #[serde(default)]
    pub limit: Option<u32>,
    /// If there are none yet, wait up to this many seconds (0 to 600) for
    /// the first to arrive.
    #[serde(default)]
    pub wait: Option<u64>,
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

/// The MCP server of one agent.
#[derive(Clone)]
pub struct MeshServer {
    client: Client,
    agent: String,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for MeshServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshServer")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
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
        description = "Send a message as this agent to AGENT@NODE (or to a node's own journal). Returns its id once it is durably committed here. A retry with the same client_id is answered without sending again."
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
        };
        result(self.send_as(req).await)
    }

    #[tool(
        name = "mesh_inbox",
        description = "Read this agent's inbox after a cursor: messages to it, bounces and losses of its messages, lag records. Returns the entries (id, from, to, in_reply_to, body, cursor) and `next`, the cursor to pass as `after` for the next page. With `wait`, waits for the first entry to arrive."
    )]
    async fn mesh_inbox(
        &self,
        Parameters(a): Parameters<InboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut path = format!(
            "{}?limit={}&wait={}",
            self.path("inbox"),
            a.limit.unwrap_or(100),
            a.wait.unwrap_or(0)
        );
        if let Some(after) = &a.after {
            path.push_str(&format!("&after={}", path_segment(after)));
        }
        result(self.client.get::<InboxPage>(&path).await)
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
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agent-mesh", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "agent-mesh, as agent {}: send durable messages to agents on other nodes \
                 (AGENT@NODE), read and wait on this agent's inbox with a cursor, request and \
                 reply. Nothing is lost silently: a message is delivered once, bounced, or its \
                 loss is recorded.",
                self.agent
            ))
    }
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
        let server = MeshServer::new(client, agent)
            .serve(rmcp::transport::stdio())
            .await
            .context("the MCP session did not start")?;
        server.waiting().await.context("the MCP session failed")?;
        Ok(())
    })
}
