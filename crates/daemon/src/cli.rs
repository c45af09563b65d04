//! The `mesh` command line: parsing and dispatch.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// agent-mesh: a durable peer-to-peer message mesh for hosts that run AI agents.
///
/// One daemon runs on each host; local agents talk to it over a Unix socket
/// in its data dir; daemons talk to each other over QUIC (iroh), dialed by
/// public key. A message is delivered exactly once and in order, or the
/// reader is told exactly what it cannot have.
#[derive(Debug, Parser)]
#[command(name = "mesh", version, propagate_version = true)]
pub struct Cli {
    /// The node's data dir (key, store, socket). Default: $MESH_DATA, else
    /// $XDG_DATA_HOME/agent-mesh, else ~/.local/share/agent-mesh.
    #[arg(long, global = true, value_name = "DIR")]
    pub data: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node in the foreground (logs to stderr; RUST_LOG is honoured).
    ///
    /// Creates the data dir (mode 0700), the node key and the store on first
    /// run. Stops cleanly on SIGINT or SIGTERM; a second signal exits at once.
    Daemon {
        /// Address to listen on for peers.
        #[arg(long, default_value = "0.0.0.0:0", value_name = "ADDR")]
        bind: SocketAddr,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn daemon_takes_data_and_bind() {
        let cli = Cli::try_parse_from([
            "mesh",
            "daemon",
            "--data",
            "/tmp/x",
            "--bind",
            "127.0.0.1:7000",
        ])
        .unwrap();
        assert_eq!(cli.data.as_deref(), Some(std::path::Path::new("/tmp/x")));
        assert!(matches!(cli.command, Command::Daemon { bind } if bind.port() == 7000));
        assert!(Cli::try_parse_from(["mesh", "daemon", "--bind", "not-an-addr"]).is_err());
    }
}
