//! Runs the `mesh` subcommands.

use std::net::SocketAddr;

use anyhow::Context;

use crate::cli::{Cli, Command};
use crate::paths::DataDir;

/// Runs one parsed command line to completion.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Daemon { bind } => {
            init_tracing();
            let dir = DataDir::resolve(cli.data.as_deref())?;
            let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            rt.block_on(daemon(dir, bind))
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn daemon(dir: DataDir, bind: SocketAddr) -> anyhow::Result<()> {
    dir.create()?;
    tracing::info!(data = %dir.root().display(), %bind, "starting");
    wait_for_signal().await
}

/// Waits for SIGINT or SIGTERM.
async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received, shutting down");
    Ok(())
}
