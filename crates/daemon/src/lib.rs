//! The agent-mesh daemon: configuration, service wiring, the local API and
//! its subscriptions. Clients (the CLI, the bench) are other crates and
//! speak to it only through its socket.
//!
//! The design is in `docs/design.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Tests unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod agents;
pub mod api;
mod bus;
pub mod config;
mod daemon;
mod drain;
mod foreground;
mod receipts;

pub use agents::{AGENT_ONLINE_MS, PRESENCE_TICK};
pub use daemon::{Daemon, STORE_RELEASE_WAIT, StartError};
pub use foreground::{RunError, run_foreground};
