//! Runs the `mesh` subcommands.

use std::net::SocketAddr;

use anyhow::Context;

use crate::cli::{Cli, Command};
use crate::client::Client;
use crate::commands;
use crate::paths::DataDir;

/// Runs one parsed command line to completion.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let dir = DataDir::resolve(cli.data.as_deref())?;
    if let Command::Daemon { bind } = cli.command {
        init_tracing();
        let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
        return rt.block_on(daemon(dir, bind));
    }
    // Client commands need little: one thread answers one request at a time.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let c = Client::new(dir.socket_path());
    rt.block_on(async move {
        match cli.command {
            Command::Daemon { .. } => unreachable!("handled above"),
            Command::Status { json } => commands::status(&c, json).await,
            Command::Id => commands::id(&c).await,
            Command::Ticket => commands::ticket(&c).await,
            Command::Peer(cmd) => commands::peer(&c, cmd).await,
            Command::Send {
                peer,
                text,
                lines,
                json,
            } => commands::send(&c, peer, text, lines, json).await,
            Command::Events { after, limit, json } => {
                commands::events(&c, after, limit, json).await
            }
            Command::Tail { after, json } => commands::tail(&c, after, json).await,
        }
    })
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
