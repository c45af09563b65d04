//! Runs the `mesh` subcommands.

use std::net::SocketAddr;
use std::sync::Arc;

use mesh_bus::node::{Node, NodeConfig};
use mesh_store::{RedbStore, StoreHandle};

use anyhow::Context;

use crate::api::node::StoreWriter;
use crate::api::{ApiParts, ApiSocket, ApiState};
use crate::cli::{Cli, Command};
use crate::client::Client;
use crate::commands;
use crate::config::Config;
use crate::paths::DataDir;
use crate::service::BusApi;

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

async fn daemon(dir: DataDir, bind: Option<SocketAddr>) -> anyhow::Result<()> {
    dir.create()?;
    let config = Config::load(&dir.config_path())?;
    if config.net.relays {
        anyhow::bail!(
            "{}: [net] relays = true is not supported yet; this build dials direct addresses only",
            dir.config_path().display()
        );
    }
    let bind = bind.unwrap_or(config.bind);
    let key = mesh_bus::net::load_or_create_node_key(dir.root())?;
    // The store lock is what refuses a second daemon on the same data dir.
    let store = Arc::new(RedbStore::open(dir.root())?);
    let store_file = dir.root().join(mesh_store::STORE_FILE_NAME);
    let handle = StoreHandle::spawn(store.clone())?;
    let socket = ApiSocket::bind(&dir.socket_path()).await?;
    let node_config = NodeConfig {
        net: mesh_bus::net::NetConfig::with_bind_addr(bind),
        core: mesh_bus::core::Config {
            outbox: config.outbox.bounds(),
            ..Default::default()
        },
    };
    let node = Arc::new(Node::start(node_config, key, handle.clone()).await?);
    let id = node.node_id();
    let epoch = node.epoch();
    println!("node    {id}");
    println!("epoch   {epoch}");
    println!("data    {}", dir.root().display());
    println!("socket  {}", dir.socket_path().display());
    println!("ticket  {}", node.ticket());
    let metrics_node = node.clone();
    let metrics = move |out: &mut String| {
        // The bus answers status on its task; metrics are rendered in a
        // request handler of the multi-threaded runtime, where blocking this
        // worker briefly is allowed.
        let rt = tokio::runtime::Handle::current();
        if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return;
        }
        let status = tokio::task::block_in_place(|| rt.block_on(metrics_node.status()));
        if let Ok(status) = status {
            crate::service::render_metrics(&status, out);
        }
    };
    let state = ApiState::new(ApiParts {
        node: id,
        epoch,
        store: store.clone(),
        writer: Arc::new(StoreWriter::new(handle.clone(), node.journal_head_sender())),
        head: node.journal_head(),
        node_api: Arc::new(BusApi::new(node.clone(), store.clone(), store_file)),
        metrics: Some(Arc::new(metrics)),
        subscriber_buffer: config.api.subscriber_buffer,
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::api::serve(socket, state, async move {
        let _ = stop_rx.await;
    }));
    wait_for_signal().await?;
    // A second signal exits at once: everything acknowledged is already durable.
    tokio::spawn(async {
        if wait_for_signal().await.is_ok() {
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        }
    });
    let _ = stop_tx.send(());
    match server.await {
        Ok(Err(e)) => tracing::warn!("local API stopped with an error: {e}"),
        Err(e) => tracing::warn!("local API task failed: {e}"),
        Ok(Ok(())) => {}
    }
    node.shutdown().await;
    handle.close().await;
    tracing::info!("stopped");
    Ok(())
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
    tracing::info!("signal received, shutting down (a second signal exits at once)");
    Ok(())
}
