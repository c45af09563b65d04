//! `mesh daemon`: one node in the foreground until SIGINT or SIGTERM.

use std::net::SocketAddr;

use mesh_api::DataDir;

use crate::config::{Config, LogFormat};
use crate::daemon::{Daemon, StartError};

/// Why `mesh daemon` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The node could not start.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The async runtime or the signal handlers could not be set up.
    #[error("cannot {what}: {source}")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Runs a node on `dir` (listening for peers on `bind`, default the
/// config's) until SIGINT or SIGTERM, logging to stderr (`RUST_LOG`,
/// default `info`) in `log_format`, default the config's `[log] format`. Prints the node's id, epoch, data dir, socket and
/// ticket on stdout once it serves, one per line. A second signal exits
/// the process at once (everything acknowledged is durable already).
///
/// # Errors
/// [`RunError::Start`] if the node cannot start (another daemon on the same
/// dir, a bad config, ...); [`RunError::Setup`] if the runtime cannot.
pub fn run_foreground(
    dir: DataDir,
    bind: Option<SocketAddr>,
    log_format: Option<LogFormat>,
) -> Result<(), RunError> {
    // The config is read again, and its errors reported, by the start; here
    // only its log format is wanted, before anything is logged.
    let format = log_format.unwrap_or_else(|| {
        Config::load(&dir.config_path())
            .map(|c| c.log.format)
            .unwrap_or_default()
    });
    init_tracing(format);
    raise_open_files_limit();
    let rt = tokio::runtime::Runtime::new().map_err(|source| RunError::Setup {
        what: "start the async runtime",
        source,
    })?;
    rt.block_on(foreground(dir, bind))
}

/// Raises this process's soft limit of open files to its hard limit: each
/// connection to a socket is a file, and a socket keeps up to
/// `api::CONNECTIONS_MAX` served and `api::PENDING_MAX` pending ones (a
/// soft limit of 1024, common, would run out first).
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let from = limit.current;
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!("cannot raise the open files limit from {from:?}: {e}");
        }
    }
}

fn init_tracing(format: LogFormat) {
    use tracing_subscriber::fmt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A subscriber set already (a test process) keeps its own.
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour_wanted()).try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
        LogFormat::Journald => builder
            .with_ansi(false)
            .event_format(Priority(fmt::format().without_time().with_ansi(false)))
            .try_init(),
    };
}

/// Colour in the text log only on a terminal, and never when `NO_COLOR` is
/// set to anything but the empty string (<https://no-color.org>).
fn colour_wanted() -> bool {
    use std::io::IsTerminal;
    let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_colour && std::io::stderr().is_terminal()
}

/// An event format that starts each line with its syslog priority (`<3>`
/// error ... `<7>` trace), which journald reads as the entry's priority.
struct Priority<F>(F);

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Priority<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let priority = match *event.metadata().level() {
            tracing::Level::ERROR => 3,
            tracing::Level::WARN => 4,
            tracing::Level::INFO => 6,
            tracing::Level::DEBUG | tracing::Level::TRACE => 7,
        };
        write!(writer, "<{priority}>")?;
        self.0.format_event(ctx, writer, event)
    }
}

async fn foreground(dir: DataDir, bind: Option<SocketAddr>) -> Result<(), RunError> {
    // Watch before anything is printed: whoever reads the ticket line may
    // send SIGTERM at once, and a signal during start-up stops the node
    // cleanly once it is up.
    let mut signals = Signals::watch()?;
    let d = Daemon::start(dir, bind).await?;
    println!("node    {}", d.node_id());
    println!("epoch   {}", d.epoch());
    println!("data    {}", d.dir().root().display());
    println!("socket  {}", d.socket_path().display());
    println!("ticket  {}", d.ticket());
    signals.recv().await;
    tracing::info!("signal received, shutting down (a second signal exits at once)");
    tokio::spawn(async move {
        signals.recv().await;
        eprintln!("second signal: exiting now");
        std::process::exit(130);
    });
    d.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// SIGINT and SIGTERM, caught from [`Signals::watch`] on.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn watch() -> Result<Signals, RunError> {
        use tokio::signal::unix::{SignalKind, signal};
        let setup = |what| move |source| RunError::Setup { what, source };
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(setup("watch SIGTERM"))?,
            int: signal(SignalKind::interrupt()).map_err(setup("watch SIGINT"))?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM.
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
