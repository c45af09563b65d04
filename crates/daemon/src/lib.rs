//! The agent-mesh daemon: configuration, service wiring, local API and CLI.
//!
//! The design is in `docs/design.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Tests unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod api;
pub mod bench;
pub mod cli;
mod commands;
pub mod config;
pub mod demo;
pub mod run;
pub mod service;

pub use run::run;
