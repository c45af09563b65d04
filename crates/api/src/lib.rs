//! The local API of an agent-mesh node, as both sides see it: the JSON
//! shapes of requests, answers, journal entries and errors ([`json`],
//! [`error`]), where a node keeps its files ([`paths`]) and, with the
//! `client` feature, a client of the node's Unix socket ([`client`]).
//!
//! The daemon serves these types; the CLI, the bench and the tests decode
//! them. The design is in `docs/design.md` ("Local API").
//!
//! An agent in Rust, with the `client` feature: send a message, then read
//! its own unread mail and acknowledge it (the next unread read starts
//! after the acknowledged entry, also after a daemon restart). Each agent
//! has a socket of its own; the daemon knows the agent by that socket and
//! the caller's uid.
//!
//! ```no_run
//! # #[cfg(feature = "client")]
//! # async fn agent() -> Result<(), mesh_api::ClientError> {
//! use mesh_api::{AgentSendResponse, Client, DataDir, InboxPage};
//! use serde_json::json;
//!
//! let data = DataDir::resolve(None).expect("a data dir");
//! let alice = Client::for_agent(data.agent_socket_path("alice"), "alice");
//! let sent: AgentSendResponse = alice
//!     .post("/v1/agents/alice/send", &json!({ "to": "bob@b", "body": "review the parser?" }))
//!     .await?;
//! println!("sent {} ({})", sent.id, sent.cursor);
//!
//! let page: InboxPage = alice.get("/v1/agents/alice/inbox?unread=true").await?;
//! for entry in &page.entries {
//!     println!("{} from {:?}: {:?}", entry.kind, entry.from, entry.body);
//! }
//! if !page.entries.is_empty() {
//!     let _: serde_json::Value = alice
//!         .post("/v1/agents/alice/ack", &json!({ "cursor": page.next }))
//!         .await?;
//! }
//! # Ok(())
//! # }
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Tests unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod agents;
#[cfg(feature = "client")]
pub mod client;
pub mod error;
pub mod json;
pub mod paths;

pub use agents::*;
#[cfg(feature = "client")]
pub use client::{
    Client, ClientError, Lines, Reply, SseEvent, SseStream, path_segment, wait_reply,
};
pub use error::{EXIT_OTHER, EXIT_TIMEOUT, EXIT_USAGE, ErrorBody, ErrorCode, ErrorDetail, Fault};
pub use json::*;
pub use paths::{DataDir, DataDirError, agent_socket_in};
