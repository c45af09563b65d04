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
    /// Show this node: id, epoch, addresses, peers, queues and store size.
    Status {
        /// Print JSON instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Print this node's id alone.
    Id,
    /// Print a ticket other nodes pass to `mesh peer add`.
    Ticket,
    /// Manage the peers this node exchanges messages with.
    #[command(subcommand)]
    Peer(PeerCommand),
    /// Send a message to a peer; prints its seq once it is durably committed.
    ///
    /// Exits non-zero with the reason if it was not committed (unknown peer,
    /// outbox full, store unavailable, daemon not running).
    Send {
        /// The recipient's node id (as printed by `mesh id` on that node).
        peer: String,
        /// The message text, or `-` to read it from stdin.
        text: String,
        /// With `-`: send each line of stdin as its own message.
        #[arg(long)]
        lines: bool,
        /// Print JSON (id, stream, seq) instead of the seq.
        #[arg(long)]
        json: bool,
    },
    /// Print journal entries (sent, received, gaps, losses) after a cursor.
    ///
    /// Prints the entries, then `next: CURSOR` on stderr: pass it as
    /// `--after` to continue exactly where this page ended.
    Events {
        /// Start after this cursor (default: the beginning).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// The most entries to print (1..=1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Follow the journal live: the backlog after the cursor, then new entries.
    Tail {
        /// Start after this cursor (default: the beginning).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Watch three nodes at work: start, link, send, stop one, catch up, a gap.
    ///
    /// Starts three real nodes (stores, endpoints on 127.0.0.1, API sockets)
    /// in a temp dir in this process and narrates each step with the real
    /// ids, seqs, marks and cursors. Takes seconds; removes its temp dir.
    Demo,
    /// Run a node in the foreground (logs to stderr; RUST_LOG is honoured).
    ///
    /// Creates the data dir (mode 0700), the node key and the store on first
    /// run. Stops cleanly on SIGINT or SIGTERM; a second signal exits at once.
    Daemon {
        /// Address to listen on for peers [default: `bind` in config.toml, else 0.0.0.0:0].
        #[arg(long, value_name = "ADDR")]
        bind: Option<SocketAddr>,
    },
    /// Measure a mesh: send rates, catch-up, latency and queued memory.
    ///
    /// `mesh bench local` starts daemons in a temp dir, linked over
    /// loopback; `mesh bench peer PEER_ID` measures from this node to a
    /// peer it is linked with. Prints a table, or JSON with `--json`.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
}

/// `mesh peer ...`.
#[derive(Debug, Subcommand)]
pub enum PeerCommand {
    /// Add a peer from the ticket it printed with `mesh ticket`.
    Add {
        /// The peer's ticket.
        ticket: String,
    },
    /// List known peers with their connection state and queues.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Forget a peer (what was exchanged stays in the journal).
    Remove {
        /// The peer's node id.
        id: String,
    },
    /// Stop talking to a peer until `mesh peer resume` (maintenance, a metered link).
    ///
    /// Closes the connection to the peer, does not dial it and refuses its
    /// connections (QUIC close code 503, "link paused"). Messages sent to it
    /// are committed and queued in its outbox as for an offline peer, and go
    /// out after the resume. The pause is not stored: it ends when this
    /// daemon restarts.
    Pause {
        /// The peer's node id.
        id: String,
        /// Print the peer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Talk to a paused peer again: dials it at once, and what is queued goes out.
    Resume {
        /// The peer's node id.
        id: String,
        /// Print the peer as JSON.
        #[arg(long)]
        json: bool,
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
        assert!(matches!(cli.command, Command::Daemon { bind: Some(bind) } if bind.port() == 7000));
        assert!(Cli::try_parse_from(["mesh", "daemon", "--bind", "not-an-addr"]).is_err());
    }
}
