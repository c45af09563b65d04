//! The `mesh` command line: its parsing, the client commands (each a
//! client of the node's socket API), `mesh demo`, and how a failure is
//! printed (one line) and exited (one code per fault class).
//!
//! `mesh daemon` and `mesh bench` are parsed here and run by `mesh-daemon`
//! and `mesh-bench`; the `mesh` executable dispatches.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
// Tests unwrap: a panic there is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod agents;
pub mod check;
mod commands;
pub mod demo;
pub mod doctor;
mod hook;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use mesh_api::client::{Client, ClientError};
use mesh_api::{DataDir, EXIT_OTHER, EXIT_USAGE, Fault};

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

    /// Act as this agent of the node (`send`, `inbox`, `ack`, `reply`,
    /// `request`, `thread`, `mcp`), through its own socket.
    #[arg(long, global = true, value_name = "NAME", env = mesh_api::paths::AGENT_ENV)]
    pub agent: Option<String>,

    /// The agent's socket (default: `<data>/agents/NAME.sock`; `mesh agent
    /// list` shows each agent's).
    #[arg(long, global = true, value_name = "PATH", env = mesh_api::paths::AGENT_SOCKET_ENV)]
    pub agent_socket: Option<PathBuf>,

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
    /// Check this node's health for monitoring (Nagios plugin exit codes).
    ///
    /// Exits 0 OK, 1 WARNING, 2 CRITICAL (also when no daemon answers), 3
    /// UNKNOWN (a bad argument, an answer it cannot read), and prints one
    /// line with perfdata after `|`, or `--json`, or `--format prometheus`.
    /// Checks that the store can commit, peers connected (`--peers-min`),
    /// each peer's queue and the age of its oldest queued message, each
    /// local agent's oldest unread message, the journal against its bound,
    /// and gap and loss records in the recent journal; a bound not given is
    /// not checked, except the journal's (80 %/95 %) and losses (1 warns).
    Check(check::CheckArgs),
    /// Find what keeps this node from working, and say how to fix each thing.
    ///
    /// Looks at the data dir's and the key's modes, the disk, whether a
    /// daemon answers (and if not: no socket, a stale one, or one this user
    /// may not reach), the store, the journal against its bound, each peer
    /// (not connected and where it is dialed, no usable address, paused,
    /// another protocol version, a card dated in the future, two processes
    /// with one key) and each agent's socket against its uid. Prints one
    /// line per finding and a `fix:` line under each problem; exits 1 if
    /// there is any problem.
    Doctor(doctor::DoctorArgs),
    /// Open the dashboard: prints its URL (with a token made at each start).
    ///
    /// Asks the daemon to serve its read-only dashboard on 127.0.0.1 and a
    /// port the system picks (or `[web] listen`), if it does not yet, and
    /// prints the URL; opens nothing else. The page shows the peers and
    /// their queues, agents, topics, the journal live and a message's state
    /// by id. Anyone with the URL can read the node: share it with no one.
    Web {
        /// Print JSON (`url`, `listen`) instead of the URL alone.
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
    /// Invite a node: prints one line, a code the new node passes to `mesh join`.
    ///
    /// The code holds this node's id and addresses and the invite's secret
    /// (shown once: the node keeps only its hash). When the new node joins,
    /// both become each other's peers; nothing is needed here. `mesh invite
    /// list` shows the invites, `mesh invite revoke ID` ends one.
    #[command(args_conflicts_with_subcommands = true)]
    Invite {
        /// List or revoke invites instead of making one.
        #[command(subcommand)]
        cmd: Option<InviteCommand>,
        /// How many nodes may join with it.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        uses: u32,
        /// How long it is good for: e.g. `90s`, `30m`, `1h`, `2d` (at most 30 days).
        #[arg(long, default_value = "1h", value_parser = parse_duration_ms)]
        ttl: u64,
        /// Print JSON (the code and the invite) instead of the code.
        #[arg(long)]
        json: bool,
    },
    /// Join the mesh of the node that printed CODE with `mesh invite`.
    ///
    /// This node dials the inviter, proves its key, and once the inviter
    /// answers both are each other's peers, stored. Exits 5 if the inviter
    /// asks to try again (its invite is in use, or its store is busy).
    Join {
        /// The invite code (`meshinvite1…`).
        code: String,
        /// Print JSON (the inviter's id, name and addresses).
        #[arg(long)]
        json: bool,
    },
    /// Send a message; prints its seq (with `--agent`: its message id) once
    /// it is durably committed.
    ///
    /// Without `--agent`, TO is a peer (its node id or alias) and the
    /// message goes to that node's journal. With `--agent NAME`, the agent
    /// sends: TO is `AGENT@NODE` (node by id or alias), or a node alone
    /// for its journal; a message for an agent the node does not host
    /// comes back as a bounce in the sender's inbox.
    ///
    /// Exits non-zero with the reason if it was not committed: 3 for a bad
    /// request or an unverified sender, 4 for an unknown peer or agent, 5
    /// for a full peer outbox or a busy node (retry later), 6 if the daemon
    /// is not running or its store is down (see `mesh --help`).
    Send {
        /// The recipient: a node id or alias, or (with --agent) `AGENT@NODE`.
        peer: String,
        /// The message text, or `-` to read it from stdin.
        text: String,
        /// With `-`: send each line of stdin as its own message.
        #[arg(long)]
        lines: bool,
        /// A sender-chosen id: a retry with the same id within the node's
        /// dedup window gets the first answer and is not sent again.
        #[arg(long, value_name = "TEXT")]
        id: Option<String>,
        /// A supersede key (with --agent): this message replaces an earlier
        /// one of this agent to the same recipient with the same key that
        /// has not been sent yet (held through a store outage, or queued
        /// for a peer that is away). The earlier send answers `superseded`
        /// (exit 0: it is not an error to retry) and its recipient gets a
        /// tombstone in its place. For status updates and heartbeats.
        #[arg(long, value_name = "KEY")]
        key: Option<String>,
        /// Ask for a read receipt (with --agent, to `AGENT@NODE`): once the
        /// recipient agent acks past the message, `mesh message ID` says
        /// `read` (by whom, when) and this agent's inbox gets a `read` entry.
        #[arg(long)]
        receipt: bool,
        /// Print JSON (id, stream, seq) instead of the seq.
        #[arg(long)]
        json: bool,
    },
    /// Print this agent's inbox (`--agent NAME`): messages to it, bounces
    /// of its messages, lag records of its subscriptions.
    ///
    /// Prints the entries, then `next: CURSOR` on stderr: pass it as
    /// `--after` to continue exactly where this page ended.
    Inbox {
        /// Start after this cursor (default: the beginning).
        #[arg(long, value_name = "CURSOR", conflicts_with = "unread")]
        after: Option<String>,
        /// Start after this agent's read position (what it acked with
        /// `mesh ack`): its unread entries, oldest first. Reading does not
        /// move the position; `mesh ack` does.
        #[arg(long)]
        unread: bool,
        /// The most entries to print (1..=1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// If there are none, wait this many seconds for the first to commit (0..=600).
        #[arg(long, value_name = "SECS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
        wait: u64,
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
        /// Print the unread entries as an AI agent's hook takes them (with
        /// --unread): `claude` for a Claude Code hook (UserPromptSubmit:
        /// added to the prompt's context; Stop: keeps the agent from ending
        /// its turn with mail waiting), `gemini` for a Gemini CLI hook
        /// (BeforeAgent and AfterAgent, the same way). Prints nothing (for
        /// gemini `{}`) when there is none; reading acks nothing. See
        /// docs/claude-code.md.
        #[arg(long, value_name = "AGENT", value_parser = ["claude", "gemini"], requires = "unread",
              conflicts_with_all = ["json", "after", "wait", "limit"])]
        hook: Option<String>,
        /// The hook's event (with --hook): `user-prompt-submit` or `stop`
        /// for claude, `before-agent` or `after-agent` for gemini
        /// (default: `hook_event_name` of the JSON the client writes to
        /// the hook's stdin).
        #[arg(long, value_parser = ["user-prompt-submit", "stop", "before-agent", "after-agent"],
              requires = "hook")]
        event: Option<String>,
    },
    /// Mark this agent's inbox (`--agent NAME`) read up to CURSOR (an
    /// entry's cursor, or the `next:` of a page): `inbox --unread` starts
    /// after it from then on, also across restarts. An ack before the
    /// current read position changes nothing.
    ///
    /// Prints the read position after the ack.
    Ack {
        /// The cursor read up to.
        cursor: String,
    },
    /// Reply to a message in this agent's inbox (`--agent NAME`).
    Reply {
        /// The message's id (as `mesh inbox` prints it).
        id: String,
        /// The reply, or `-` to read it from stdin.
        text: String,
        /// Print JSON instead of the reply's id.
        #[arg(long)]
        json: bool,
    },
    /// Print the thread of a message this agent (`--agent NAME`) sent or
    /// received: what it answers, the message, and every reply to it and
    /// to its replies, as far as this agent's inbox and sent messages on
    /// this node hold them.
    ///
    /// One line per message, in the order this node journaled them,
    /// indented by its depth in the thread, with its state (sent: queued,
    /// delivered, bounced, superseded or lost; received: received). Says
    /// on stderr when the thread was cut (at 1000 messages or 4 MiB of
    /// bodies, or where the search for replies stopped).
    Thread {
        /// The message's id (as `mesh inbox` or `mesh send` printed it).
        id: String,
        /// Print the API's answer (`GET /v1/agents/NAME/thread/ID`) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send as this agent (`--agent NAME`) and wait for the reply.
    ///
    /// Prints the reply's body; exits 8 if none came in time (a late reply
    /// still lands in the inbox).
    Request {
        /// The recipient, `AGENT@NODE`.
        to: String,
        /// The message text, or `-` to read it from stdin.
        text: String,
        /// How long to wait for the reply, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        timeout: u64,
        /// Print the reply as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Where a message is: queued, delivered (committed at the recipient
    /// node), bounced, or lost (with its loss record).
    Message {
        /// The message's id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The agents on this node and on its peers, online or offline.
    Agents {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Manage this node's agents: add, list, remove, and move one to
    /// another node (`mesh agent move NAME --to PEER` over the mesh, its
    /// key encrypted to the peer; or `export`/`import` with a file).
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Topics: many-to-many streams that every member journals and relays.
    ///
    /// A node that joined a topic journals every member's messages of it
    /// exactly once, in order per author (`mesh events` shows them as
    /// `topic:NAME`), and passes them on to the members it is linked to:
    /// A—B—C in a line share a topic though A and C are not peers.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Publish a message to a topic this node is a member of; prints its
    /// seq in this node's stream of the topic once it is durably committed.
    ///
    /// With `- --lines`, each line of stdin is its own message, published
    /// in order 1000 to a request (`POST /v1/topics/NAME/publish/batch`):
    /// each request's messages are published together or refused together.
    ///
    /// Exits 3 if this node is not a member (`mesh topic join NAME` first)
    /// or the message is too large, 5 if the node is busy, 6 if the daemon
    /// is not running or its store is down.
    Publish {
        /// The topic.
        topic: String,
        /// The message text, or `-` to read it from stdin.
        text: String,
        /// With `-`: publish each line of stdin as its own message.
        #[arg(long)]
        lines: bool,
        /// Print JSON (id, stream, seq) instead of the seq.
        #[arg(long)]
        json: bool,
    },
    /// Serve MCP on stdio as this agent (`--agent NAME`): tools mesh_send,
    /// mesh_inbox, mesh_request, mesh_reply, mesh_agents, mesh_status.
    ///
    /// A client of the agent's socket, for an MCP client's config (see the
    /// README).
    Mcp,
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
    /// Starts three real nodes (`mesh daemon` processes of this executable,
    /// each with its store, endpoint on 127.0.0.1 and API socket) in a temp
    /// dir and narrates each step with the real ids, seqs, marks and
    /// cursors, read through their socket APIs. Takes seconds; removes its
    /// temp dir.
    Demo,
    /// Run a node in the foreground (logs to stderr; RUST_LOG is honoured).
    ///
    /// Creates the data dir (mode 0700), the node key and the store on first
    /// run. Stops cleanly on SIGINT or SIGTERM; a second signal exits at once.
    Daemon {
        /// Address to listen on for peers [default: `bind` in config.toml, else 0.0.0.0:0].
        #[arg(long, value_name = "ADDR")]
        bind: Option<SocketAddr>,
        /// Log line format: `text` (coloured only on a terminal, never with
        /// NO_COLOR set), `json` (one object per line, for log shippers) or
        /// `journald` (a syslog priority prefix, no timestamp)
        /// [default: `[log] format` in config.toml, else text].
        #[arg(long, value_name = "FORMAT", value_parser = ["text", "json", "journald"])]
        log_format: Option<String>,
    },
    /// Measure a mesh: send rates, catch-up, latency and queued memory.
    ///
    /// `mesh bench local` starts daemons in a temp dir, linked over
    /// loopback; `mesh bench peer PEER_ID` measures from this node to a
    /// peer it is linked with. Prints a table, or JSON with `--json`.
    #[command(subcommand)]
    Bench(mesh_bench::BenchCommand),
}

/// `mesh agent ...`.
#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Add an agent: its key, and its socket, through which it acts.
    Add {
        /// The agent's name, `[a-z0-9._-]{1,64}`, unique on this node.
        name: String,
        /// The uid whose processes may act as it [default: yours].
        #[arg(long)]
        uid: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List this node's agents.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an agent (its inbox index and key; its messages stay in the journal).
    ///
    /// Refused (`unread_entries`, exit 3) while the agent has inbox entries
    /// this node never handed to it, by an inbox read or its subscription:
    /// read them, move the agent, or pass --force.
    Remove {
        /// The agent's name.
        name: String,
        /// Remove it even if its inbox has entries it never read.
        #[arg(long)]
        force: bool,
    },
    /// Write an agent's export file, to move it to another node with
    /// `mesh agent import FILE` there.
    ///
    /// The file holds the agent's SECRET KEY: whoever has it can act as
    /// the agent. `--out` writes it with mode 0600 (without it, it goes to
    /// stdout: redirect it to a file only you can read); delete it once it
    /// is imported. The agent goes on acting here until its new host
    /// announces the move; from then on it acts only there, and what came
    /// for it here after `--after` is passed on to it there.
    Export {
        /// The agent's name.
        name: String,
        /// How far the agent has read its inbox here (the cursor of the
        /// last entry it handled, as `mesh --agent NAME inbox` prints it):
        /// what comes after is passed on to its new host [default: the
        /// last entry this node handed to the agent, by an inbox read or
        /// its subscription: what it never saw here is passed on].
        #[arg(long)]
        after: Option<String>,
        /// Write the file here (mode 0600; an existing file is not replaced).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Move an agent to a peer over the mesh: export and import in one step.
    ///
    /// This node exports the agent (as `mesh agent export`, without a
    /// file) and hands the export, which holds the agent's SECRET KEY, to
    /// the peer over the mesh: on a connection of its own (ALPN
    /// amesh-move/1), encrypted by QUIC's TLS 1.3 to that node's key, so
    /// only that node can read it. The peer imports it as `mesh agent
    /// import` would (its uid there is that daemon's) and announces the
    /// move, signed by the agent's key; from then on the agent acts only
    /// there, and what comes for it here is passed on to it there. PEER
    /// must be a peer of this node, and this node one of PEER's. If
    /// anything fails before PEER says it imported the agent, the agent
    /// stays here and the error says so; if the answer was lost, running
    /// the move again is safe.
    Move {
        /// The agent's name.
        name: String,
        /// The peer to move it to: a node id, its name or a local alias.
        #[arg(long)]
        to: String,
        /// How far the agent has read its inbox here (as for `mesh agent
        /// export`): what comes after is passed on to its new host
        /// [default: the last entry this node handed to the agent: what it
        /// never saw here is passed on].
        #[arg(long)]
        after: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Host an agent exported from another node (`mesh agent export`): its
    /// key moves here and this node announces the move to the mesh, signed
    /// by the agent's key.
    Import {
        /// The export file (`-` for stdin).
        file: PathBuf,
        /// The uid whose processes may act as it here [default: yours].
        #[arg(long)]
        uid: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `mesh invite list` and `mesh invite revoke`.
#[derive(Debug, Subcommand)]
pub enum InviteCommand {
    /// List the invites this node made: state, uses left, expiry, who joined.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke an invite: refused to everyone from now on (nodes that joined
    /// with it stay peers).
    Revoke {
        /// The invite's id, as `mesh invite list` shows it.
        id: String,
    },
}

/// A duration as `90s`, `30m`, `1h`, `2d`, `500ms` (or plain seconds), in ms.
fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 90s, 30m, 1h or 2d"))?;
    let ms_per = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: the unit is one of ms, s, m, h, d")),
    };
    let ms = n
        .checked_mul(ms_per)
        .ok_or_else(|| format!("{text:?} is too long"))?;
    if ms == 0 {
        return Err("a duration of 0 is no time at all".into());
    }
    Ok(ms)
}

/// `mesh topic ...`.
#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Join a topic (or change its bounds): this node journals and relays
    /// every member's messages of it from now on, and catches up on what
    /// its linked members still hold.
    Join {
        /// The topic: 1 to 64 bytes of `[a-z0-9._/-]`.
        name: String,
        /// The most messages held of each author's stream, to relay
        /// (default 100000); the oldest go first. This node's own beyond
        /// it are journaled as lost.
        #[arg(long, value_name = "N")]
        max_msgs: Option<u64>,
        /// The most payload bytes held of each author's stream (default 64 MiB).
        #[arg(long, value_name = "BYTES")]
        max_bytes: Option<u64>,
        /// Print the topic as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Leave a topic: replication stops; what was journaled stays.
    Leave {
        /// The topic.
        name: String,
        /// Print what was kept as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The topics this node is a member of: the members linked now, and
    /// each author's stream with this node's mark and what it holds.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `mesh peer ...`.
#[derive(Debug, Subcommand)]
pub enum PeerCommand {
    /// Give a peer a local alias, so `AGENT@ALIAS` and `mesh send ALIAS` name it.
    Name {
        /// The peer's node id (or its current alias).
        id: String,
        /// The alias, `[a-z0-9._-]{1,64}`.
        alias: String,
    },
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
    /// List agent-mesh nodes on the LAN (found by mDNS) that are not peers.
    ///
    /// Finding a node never makes it a peer: invite it (`mesh invite`, then
    /// `mesh join` there) to exchange messages.
    Nearby {
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

impl Cli {
    /// Parses the process's arguments; `--help` ends with the exit codes.
    /// A bad command line prints clap's message and exits with
    /// [`EXIT_USAGE`].
    pub fn parse_args() -> Cli {
        let parsed = Cli::command()
            .after_help(Fault::exit_code_help())
            .try_get_matches()
            .and_then(|m| Cli::from_arg_matches(&m));
        parsed.unwrap_or_else(|e| {
            // A monitoring system reads a bad `mesh check` line as UNKNOWN.
            if e.use_stderr() && subcommand(std::env::args().skip(1)).as_deref() == Some("check") {
                let _ = e.print();
                std::process::exit(i32::from(check::State::Unknown.code()));
            }
            // Claude Code reads exit 2 as "block" (a Stop hook would keep the
            // agent going on a usage error): a hook's bad line exits 1.
            if e.use_stderr() && std::env::args().any(|a| a == "--hook" || a.starts_with("--hook="))
            {
                let _ = e.print();
                std::process::exit(i32::from(EXIT_OTHER));
            }
            e.exit()
        })
    }

    /// The data dir `--data`, `MESH_DATA` or the default names.
    ///
    /// # Errors
    /// If none is given and there is no home dir to default to.
    pub fn data_dir(&self) -> anyhow::Result<DataDir> {
        Ok(DataDir::resolve(self.data.as_deref())?)
    }
}

/// The subcommand's name in `args` (after the program name): the first
/// word that is neither a flag nor the value of a global flag.
fn subcommand(args: impl Iterator<Item = String>) -> Option<String> {
    let mut args = args;
    while let Some(a) = args.next() {
        if ["--data", "--agent", "--agent-socket"].contains(&a.as_str()) {
            args.next();
        } else if !a.starts_with('-') {
            return Some(a);
        }
    }
    None
}

/// A command line that parsed but asks for something that cannot be done
/// (`mesh send ID TEXT --lines`): exits with [`EXIT_USAGE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Runs a client command or `mesh demo` against the node in `dir`; `bin`
/// is the `mesh` executable the demo starts its daemons with.
///
/// # Errors
/// The command's failure: a [`ClientError`] (with its fault) for what the
/// daemon refused or could not be asked, a [`UsageError`], or another error.
pub fn run(cli: Cli, dir: &DataDir, bin: &Path) -> anyhow::Result<()> {
    let agent = agents::AgentArgs::new(&cli, dir);
    let command = cli.command;
    // Client commands need little: one thread answers one request at a time.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    if let Command::Demo = command {
        let mut out = std::io::stdout().lock();
        return rt.block_on(demo::run(bin, &mut out));
    }
    let c = Client::new(dir.socket_path());
    // Long because it is one arm per client command, each a call; splitting
    // it would only hide that dispatch table.
    rt.block_on(async move {
        match command {
            Command::Daemon { .. } | Command::Bench(_) | Command::Demo | Command::Mcp => {
                Err(UsageError(
                    "`mesh daemon`, `mesh bench` and `mesh mcp` are not client commands".into(),
                )
                .into())
            }
            Command::Status { json } => commands::status(&c, json).await,
            Command::Check(args) => check::run(&c, &args).await,
            Command::Doctor(args) => doctor::run(&c, dir, &args).await,
            Command::Web { json } => commands::web(&c, json).await,
            Command::Id => commands::id(&c).await,
            Command::Ticket => commands::ticket(&c).await,
            Command::Peer(cmd) => commands::peer(&c, cmd).await,
            Command::Topic(cmd) => commands::topic(&c, cmd).await,
            Command::Publish {
                topic,
                text,
                lines,
                json,
            } => commands::publish(&c, &topic, text, lines, json).await,
            Command::Invite {
                cmd,
                uses,
                ttl,
                json,
            } => commands::invite(&c, cmd, uses, ttl, json).await,
            Command::Join { code, json } => commands::join(&c, code, json).await,
            Command::Send {
                peer,
                text,
                lines,
                id,
                key,
                receipt,
                json,
            } => match agent.client().await? {
                Some(a) => {
                    let opts = agents::SendOpts {
                        lines,
                        id,
                        key,
                        receipt,
                    };
                    agents::send(&a, peer, text, opts, json).await
                }
                None if receipt => Err(UsageError(
                    "--receipt needs a sending agent (--agent NAME) and a recipient agent \
                     (AGENT@NODE): only an agent reads, and acks, a message"
                        .into(),
                )
                .into()),
                None if key.is_some() => Err(UsageError(
                    "--key needs a sending agent (--agent NAME): a supersede key travels in an \
                     agent message; a node's plain messages carry none"
                        .into(),
                )
                .into()),
                None => commands::send(&c, peer, text, lines, id, json).await,
            },
            Command::Inbox {
                hook: Some(client),
                event,
                ..
            } => match hook::Client::named(&client) {
                Ok(client) => hook::run(client, &agent, event.as_deref()).await,
                Err(e) => Err(e),
            }
            .map_err(hook::failed),
            Command::Inbox {
                after,
                unread,
                limit,
                wait,
                json,
                hook: None,
                event: _,
            } => {
                let c = agent.required("inbox").await?;
                agents::inbox(&c, after, unread, limit, wait, json).await
            }
            Command::Thread { id, json } => {
                agents::thread(&agent.required("thread").await?, id, json).await
            }
            Command::Ack { cursor } => agents::ack(&agent.required("ack").await?, cursor).await,
            Command::Reply { id, text, json } => {
                agents::reply(&agent.required("reply").await?, id, text, json).await
            }
            Command::Request {
                to,
                text,
                timeout,
                json,
            } => agents::request(&agent.required("request").await?, to, text, timeout, json).await,
            Command::Message { id, json } => {
                let c = agent.client().await?.unwrap_or(c);
                agents::message(&c, id, json).await
            }
            Command::Agents { json } => {
                let c = agent.client().await?.unwrap_or(c);
                agents::agents(&c, json).await
            }
            Command::Agent(cmd) => agents::agent(&c, cmd).await,
            Command::Events { after, limit, json } => {
                commands::events(&c, after, limit, json).await
            }
            Command::Tail { after, json } => commands::tail(&c, after, json).await,
        }
    })
}

/// A client of the socket of the agent `cli` names (`--agent`,
/// `--agent-socket`), for `mesh mcp`, and the agent's name.
///
/// # Errors
/// No `--agent`, or no such agent's socket.
pub fn agent_client(cli: &Cli, dir: &DataDir) -> anyhow::Result<(Client, String)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let args = agents::AgentArgs::new(cli, dir);
    let client = rt.block_on(args.required("mcp"))?;
    let name = client.agent().unwrap_or_default().to_owned();
    Ok((client, name))
}

/// The exit code for `error`: its fault class's for what the daemon refused
/// or could not be asked, [`EXIT_USAGE`] for a [`UsageError`],
/// [`mesh_api::EXIT_TIMEOUT`] for a request without a reply in time,
/// [`EXIT_OTHER`] for anything else.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if let Some(e) = cause.downcast_ref::<ClientError>() {
            return e.fault().exit_code();
        }
        if cause.is::<UsageError>() {
            return EXIT_USAGE;
        }
        if let Some(check::CheckExit(code)) = cause.downcast_ref() {
            return *code;
        }
        if cause.is::<hook::HookFailed>() {
            return EXIT_OTHER;
        }
        if cause.is::<agents::NoReply>() {
            return mesh_api::EXIT_TIMEOUT;
        }
        if cause.is::<agents::NoAgent>() {
            return Fault::Caller.exit_code();
        }
    }
    EXIT_OTHER
}

/// Ends `mesh`: exit 0, or the error on one line of stderr (never a
/// backtrace, whatever `RUST_BACKTRACE` says) and its [`exit_code`].
pub fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `mesh check` printed its report; only the code is left to give.
        Err(e) if e.is::<check::CheckExit>() => ExitCode::from(exit_code(&e)),
        Err(e) => {
            // `{:#}` is the chain of causes on one line; `{:?}` would add a
            // backtrace when RUST_BACKTRACE is set.
            let text = format!("{e:#}");
            eprintln!("error: {}", text.replace('\n', " "));
            ExitCode::from(exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests;
