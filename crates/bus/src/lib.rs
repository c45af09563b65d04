//! The bus of agent-mesh: durable direct streams between daemons.
//!
//! [`core`] is the sans-IO state machine that makes every decision (streams,
//! outbox policy, acks, resync, gaps, replay defense, reorder buffer);
//! [`net`] carries frames between daemons over iroh; [`node`] runs the two
//! together with the store. The design is in
//! `docs/design.md`.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod core;
pub mod net;
pub mod node;
