//! The local API of an agent-mesh node, as both sides see it: the JSON
//! shapes of requests, answers, journal entries and errors ([`json`],
//! [`error`]), where a node keeps its files ([`paths`]) and, with the
//! `client` feature, a client of the node's Unix socket ([`client`]).
//!
//! The daemon serves these types; the CLI, the bench and the tests decode
//! them. The design is in `docs/design.md` ("Local API").
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
