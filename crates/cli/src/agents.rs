//! The agent commands: `mesh agent add|list|remove`, `mesh agents`, and
//! what an agent does as itself (`--agent NAME`): send, inbox, reply,
//! request, thread; `mesh message`.

use std::io::{BufRead, Read as _, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use mesh_api::Reply;
use mesh_api::client::Client;
use mesh_api::{
    AddAgentRequest, AgentExport, AgentJson, AgentSendRequest, AgentSendResponse, AgentsResponse,
    DataDir, ExportAgentRequest, ImportAgentRequest, InboxEntry, InboxPage, MessageStatus,
    MoveAgentRequest, MoveAgentResponse, ReplyRequest, ThreadResponse, path_segment,
};

use crate::commands::print_json;
use crate::{AgentCommand, Cli, UsageError};

/// No reply came in time (`mesh request`): exits with
/// [`mesh_api::EXIT_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error(
    "no reply to message {id} within {secs} s; a late reply still lands in the inbox (`mesh --agent {agent} inbox`)"
)]
pub(crate) struct NoReply {
    id: String,
    secs: u64,
    agent: String,
}

/// The agent named has no socket here: not an agent of this node (exits 3).
#[derive(Debug, thiserror::Error)]
#[error(
    "no agent {name} here: there is no socket at {path}; `mesh agent list` shows this node's agents and their sockets (or pass --agent-socket)"
)]
pub(crate) struct NoAgent {
    name: String,
    path: PathBuf,
}

/// The agent a command acts as (`--agent`, `--agent-socket`).
pub(crate) struct AgentArgs {
    name: Option<String>,
    /// `--agent-socket`, if given.
    socket: Option<PathBuf>,
    /// The node's own socket, asked where the agent's socket is when it is
    /// not in the data dir (`[agents] socket_dir`).
    node: Client,
    dir: DataDir,
}

impl AgentArgs {
    pub(crate) fn new(cli: &Cli, dir: &DataDir) -> AgentArgs {
        AgentArgs {
            name: cli.agent.clone(),
            socket: cli.agent_socket.clone(),
            node: Client::new(dir.socket_path()),
            dir: dir.clone(),
        }
    }

    /// A client of the agent's socket, if `--agent` is given: at
    /// `--agent-socket`, else in the data dir, else where the node says.
    pub(crate) async fn client(&self) -> anyhow::Result<Option<Client>> {
        let Some(name) = &self.name else {
            return Ok(None);
        };
        let socket = match &self.socket {
            Some(s) => s.clone(),
            None => {
                let default = self.dir.agent_socket_path(name);
                if default.exists() {
                    default
                } else {
                    self.socket_from_node(name).await.unwrap_or(default)
                }
            }
        };
        if !socket.exists() {
            return Err(NoAgent {
                name: name.clone(),
                path: socket,
            }
            .into());
        }
        Ok(Some(Client::for_agent(socket, name)))
    }

    /// Where the node says agent `name`'s socket is, if it can be asked.
    async fn socket_from_node(&self, name: &str) -> Option<PathBuf> {
        let all: AgentsResponse = self.node.get("/v1/agents").await.ok()?;
        all.local
            .into_iter()
            .find(|a| a.name == name)
            .and_then(|a| a.socket)
            .map(PathBuf::from)
    }

    /// The agent's client, which `command` needs.
    pub(crate) async fn required(&self, command: &str) -> anyhow::Result<Client> {
        self.client().await?.ok_or_else(|| {
            UsageError(format!(
                "`mesh {command}` acts as an agent: pass --agent NAME (or set MESH_AGENT)"
            ))
            .into()
        })
    }
}

/// The acting agent of `c` (set by [`AgentArgs::client`]).
fn me(c: &Client) -> &str {
    c.agent().unwrap_or("")
}

/// A client id for a send that did not get one: unique per process and moment.
pub(crate) fn fresh_client_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cli-{}-{nanos:x}", std::process::id())
}

fn read_text(text: String) -> anyhow::Result<String> {
    if text != "-" {
        return Ok(text);
    }
    let mut body = String::new();
    std::io::stdin()
        .lock()
        .read_to_string(&mut body)
        .context("cannot read stdin")?;
    Ok(body)
}

fn print_agent_sent(sent: &AgentSendResponse, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(sent);
    }
    println!("{}", sent.id);
    if let Some(by) = &sent.superseded_by {
        eprintln!(
            "superseded by {by} before it was sent: its recipient gets a tombstone in its place"
        );
    }
    Ok(())
}

/// The options of `mesh --agent NAME send`.
pub(crate) struct SendOpts {
    /// Send each line of stdin.
    pub(crate) lines: bool,
    /// The client id.
    pub(crate) id: Option<String>,
    /// The supersede key.
    pub(crate) key: Option<String>,
    /// Ask for a read receipt.
    pub(crate) receipt: bool,
}

/// `mesh --agent NAME send TO TEXT`: prints the message id once committed.
pub(crate) async fn send(
    c: &Client,
    to: String,
    text: String,
    opts: SendOpts,
    json: bool,
) -> anyhow::Result<()> {
    let SendOpts {
        lines,
        id,
        key,
        receipt,
    } = opts;
    let path = format!("/v1/agents/{}/send", path_segment(me(c)));
    if lines {
        if text != "-" {
            return Err(UsageError("--lines reads stdin: pass `-` as the text".into()).into());
        }
        if id.is_some() {
            return Err(
                UsageError("--id names one message; it does not go with --lines".into()).into(),
            );
        }
        for line in std::io::stdin().lock().lines() {
            let req = AgentSendRequest {
                to: to.clone(),
                body: line.context("cannot read stdin")?,
                encoding: Default::default(),
                in_reply_to: None,
                client_id: None,
                key: key.clone(),
                receipt,
            };
            let sent: AgentSendResponse = c.post(&path, &req).await?;
            print_agent_sent(&sent, json)?;
        }
        return Ok(());
    }
    let req = AgentSendRequest {
        to,
        body: read_text(text)?,
        encoding: Default::default(),
        in_reply_to: None,
        client_id: id,
        key,
        receipt,
    };
    let sent: AgentSendResponse = c.post(&path, &req).await?;
    print_agent_sent(&sent, json)
}

fn short(text: &str) -> String {
    match text.split_once('@') {
        Some((agent, node)) => format!("{agent}@{}", node.chars().take(10).collect::<String>()),
        None => text.chars().take(10).collect(),
    }
}

fn print_inbox_entry(e: &InboxEntry, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(e);
    }
    let id = e.id.as_deref().unwrap_or("-");
    let line = match e.kind.as_str() {
        "message" => {
            let from = e.from.as_deref().map(short).unwrap_or_default();
            let reply = e
                .in_reply_to
                .as_deref()
                .map_or_else(String::new, |r| format!(" (reply to {r})"));
            let unverified = if e.verified {
                ""
            } else {
                " [sender unverified]"
            };
            let via = e.forwarded_by.as_deref().map_or_else(String::new, |n| {
                format!(" (via {}, the host it left)", short(n))
            });
            format!("{id} from {from}{reply}{via}{unverified}: {}", e.body)
        }
        "bounce" => format!("BOUNCE {id}: {}", e.body),
        "lagged" => format!("LAGGED {}", e.body),
        "superseded" => format!("SUPERSEDED {id}: {}", e.body),
        "lost" => format!("LOST {}", e.body),
        "read" => {
            let by = e.from.as_deref().map(short).unwrap_or_default();
            let ids = e.ids.as_deref().unwrap_or_default().join(" ");
            let at = e.read_ms.map_or_else(String::new, |ms| format!(" at {ms}"));
            format!("READ by {by}{at}: {ids}")
        }
        other => format!("({other}) {}", e.body),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "[{}] {line}", e.arrival)?;
    Ok(())
}

/// `mesh --agent NAME inbox`.
pub(crate) async fn inbox(
    c: &Client,
    after: Option<String>,
    unread: bool,
    limit: u32,
    wait: u64,
    json: bool,
) -> anyhow::Result<()> {
    let mut path = format!(
        "/v1/agents/{}/inbox?limit={limit}&wait={wait}",
        path_segment(me(c))
    );
    if let Some(a) = &after {
        path.push_str(&format!("&after={}", path_segment(a)));
    }
    if unread {
        path.push_str("&unread=true");
    }
    let page: InboxPage = c.get(&path).await?;
    for e in &page.entries {
        print_inbox_entry(e, json)?;
    }
    eprintln!("next: {}", page.next);
    Ok(())
}

/// `mesh --agent NAME ack CURSOR`: prints the read position after it.
pub(crate) async fn ack(c: &Client, cursor: String) -> anyhow::Result<()> {
    let path = format!("/v1/agents/{}/ack", path_segment(me(c)));
    let now: serde_json::Value = c
        .post(&path, &serde_json::json!({ "cursor": cursor }))
        .await?;
    println!("{}", now["cursor"].as_str().unwrap_or_default());
    Ok(())
}

/// `mesh --agent NAME reply MSG_ID TEXT`.
pub(crate) async fn reply(c: &Client, id: String, text: String, json: bool) -> anyhow::Result<()> {
    let req = ReplyRequest {
        id,
        body: read_text(text)?,
        encoding: Default::default(),
        client_id: Some(fresh_client_id()),
    };
    let path = format!("/v1/agents/{}/reply", path_segment(me(c)));
    let sent: AgentSendResponse = c.post(&path, &req).await?;
    print_agent_sent(&sent, json)
}

/// `mesh --agent NAME request TO TEXT`: sends, then waits for the reply.
pub(crate) async fn request(
    c: &Client,
    to: String,
    text: String,
    timeout: u64,
    json: bool,
) -> anyhow::Result<()> {
    let req = AgentSendRequest {
        to,
        body: read_text(text)?,
        encoding: Default::default(),
        in_reply_to: None,
        client_id: Some(fresh_client_id()),
        key: None,
        receipt: false,
    };
    let agent = me(c).to_owned();
    let path = format!("/v1/agents/{}/send", path_segment(&agent));
    let sent: AgentSendResponse = c.post(&path, &req).await?;
    let reply = mesh_api::wait_reply(c, &agent, &sent, Duration::from_secs(timeout)).await?;
    match reply {
        Reply::Answer(e) if json => print_json(&e),
        Reply::Answer(e) => {
            println!("{}", e.body);
            Ok(())
        }
        Reply::Bounced(e) => anyhow::bail!("{}", e.body),
        Reply::TimedOut => Err(NoReply {
            id: sent.id,
            secs: timeout,
            agent,
        }
        .into()),
    }
}

/// `mesh message MSG_ID`.
pub(crate) async fn message(c: &Client, id: String, json: bool) -> anyhow::Result<()> {
    let st: MessageStatus = c
        .get(&format!("/v1/messages/{}", path_segment(&id)))
        .await?;
    if json {
        return print_json(&st);
    }
    println!("{}  {}  {} -> {}", st.id, st.state, st.from, st.to);
    println!("  {}", st.detail);
    if let (Some(by), Some(ms)) = (&st.read_by, st.read_ms) {
        println!("  read by {by} at {ms} (ms since the Unix epoch)");
    }
    Ok(())
}

/// `mesh --agent NAME thread MSG_ID`: one line per message, indented by
/// its depth, with its state; or the answer as JSON.
pub(crate) async fn thread(c: &Client, id: String, json: bool) -> anyhow::Result<()> {
    let path = format!(
        "/v1/agents/{}/thread/{}",
        path_segment(me(c)),
        path_segment(&id)
    );
    let t: ThreadResponse = c.get(&path).await?;
    if json {
        print_json(&t)?;
    } else {
        let mut out = std::io::stdout().lock();
        for e in &t.entries {
            let indent = "  ".repeat(usize::try_from(e.depth).unwrap_or(0).min(40));
            let mark = if e.id == t.id { "*" } else { " " };
            let base64 = match e.encoding {
                mesh_api::BodyEncoding::Base64 => " (base64)",
                _ => "",
            };
            // One line per message: a body's line breaks are shown, not made.
            let body = e.body.replace('\n', "\\n");
            writeln!(
                out,
                "[{}]{mark}{indent}{} {} -> {} {}{base64}: {body}",
                e.arrival,
                e.id,
                short(&e.from),
                short(&e.to),
                e.state,
            )?;
        }
    }
    if let Some(why) = &t.truncated_why {
        eprintln!("cut: {why}");
    }
    Ok(())
}

fn print_agent(a: &AgentJson) {
    let state = match &a.moved_to {
        Some(to) => format!("moved to {to} (draining: what comes here is passed on)"),
        None if a.online => "online".to_owned(),
        None => "offline".to_owned(),
    };
    let alias = a
        .node_alias
        .as_ref()
        .map_or_else(String::new, |n| format!(" ({n})"));
    let unread = a
        .unread
        .map_or_else(String::new, |u| format!("  {}", unread_text(&u)));
    println!("  {}{alias}  {state}{unread}", a.address);
}

/// `3 unread (oldest 42 s ago)`, `no unread`.
pub(crate) fn unread_text(u: &mesh_api::Unread) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    match u.oldest_ms {
        Some(ms) if u.count > 0 => {
            let secs = now.saturating_sub(ms) / 1000;
            format!("{u} (oldest {})", age_text(secs))
        }
        _ => u.to_string(),
    }
}

/// An age for a person: `42 s`, `5 min`, `3 h`, `2 days` ago.
fn age_text(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs} s ago"),
        120..7200 => format!("{} min ago", secs / 60),
        7200..172_800 => format!("{} h ago", secs / 3600),
        _ => format!("{} days ago", secs / 86_400),
    }
}

/// `mesh agents`.
pub(crate) async fn agents(c: &Client, json: bool) -> anyhow::Result<()> {
    let all: AgentsResponse = c.get("/v1/agents").await?;
    if json {
        return print_json(&all);
    }
    println!("this node ({}):", all.local.len());
    for a in &all.local {
        print_agent(a);
    }
    println!("peers ({}):", all.peers.len());
    for a in &all.peers {
        print_agent(a);
    }
    if !all.moves.is_empty() {
        println!("moved ({}):", all.moves.len());
        for m in &all.moves {
            println!("  {}  from {}  (move {})", m.address, m.from, m.version);
        }
    }
    Ok(())
}

/// Writes `text` to a new file at `path` with mode 0600.
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "cannot create {} (an existing file is not replaced)",
                path.display()
            )
        })?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    Ok(())
}

/// The export file at `path` (`-`: stdin).
fn read_export(path: &std::path::Path) -> anyhow::Result<AgentExport> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not an agent export file (`mesh agent export` writes one)",
            path.display()
        )
    })
}

/// `mesh agent add|list|remove`.
pub(crate) async fn agent(c: &Client, cmd: AgentCommand) -> anyhow::Result<()> {
    match cmd {
        AgentCommand::Add { name, uid, json } => {
            let a: AgentJson = c.post("/v1/agents", &AddAgentRequest { name, uid }).await?;
            if json {
                return print_json(&a);
            }
            println!(
                "added agent {} (uid {}); it acts through its socket {}",
                a.address,
                a.uid.unwrap_or_default(),
                a.socket.as_deref().unwrap_or("?")
            );
        }
        AgentCommand::List { json } => {
            let all: AgentsResponse = c.get("/v1/agents").await?;
            if json {
                return print_json(&all.local);
            }
            if all.local.is_empty() {
                println!("no agents yet: add one with `mesh agent add NAME`");
            }
            for a in &all.local {
                let state = match &a.moved_to {
                    Some(to) => format!("moved to {to} (draining: what comes here is passed on)"),
                    None if a.online => "online".to_owned(),
                    None => "offline".to_owned(),
                };
                println!(
                    "{}  {state}  uid {}  {}",
                    a.name,
                    a.uid.unwrap_or_default(),
                    a.socket.as_deref().unwrap_or("")
                );
            }
        }
        AgentCommand::Export { name, out, after } => {
            let export: AgentExport = c
                .post(
                    &format!("/v1/agents/{}/export", path_segment(&name)),
                    &ExportAgentRequest { after },
                )
                .await?;
            let text = serde_json::to_string_pretty(&export)? + "\n";
            match out {
                Some(path) => {
                    write_private(&path, &text)?;
                    eprintln!(
                        "wrote agent {name}'s export (its secret key) to {} (mode 0600); run `mesh agent import {}` on its new host, then delete the file",
                        path.display(),
                        path.display()
                    );
                }
                None => {
                    print!("{text}");
                    eprintln!(
                        "this is agent {name}'s secret key: keep it where only you can read it, run `mesh agent import FILE` on its new host, then delete it"
                    );
                }
            }
        }
        AgentCommand::Import { file, uid, json } => {
            let export = read_export(&file)?;
            let a: AgentJson = c
                .post("/v1/agents/import", &ImportAgentRequest { export, uid })
                .await?;
            if json {
                return print_json(&a);
            }
            println!(
                "imported agent {} (uid {}); it acts through its socket {}, and the mesh is told it moved here",
                a.address,
                a.uid.unwrap_or_default(),
                a.socket.as_deref().unwrap_or("?")
            );
            if let Some(after) = &a.inbox_after {
                println!(
                    "it was here before: read its inbox here after {after} (what came before that was passed on to the host it left)"
                );
            }
        }
        AgentCommand::Move {
            name,
            to,
            after,
            json,
        } => {
            let moved: MoveAgentResponse = c
                .post(
                    &format!("/v1/agents/{}/move", path_segment(&name)),
                    &MoveAgentRequest { to, after },
                )
                .await?;
            if json {
                return print_json(&moved);
            }
            let how = if moved.already {
                "was imported there already"
            } else {
                "is imported there"
            };
            println!(
                "moved agent {name} to {}: it {how} (move notice version {}) and acts only there; what comes for it here is passed on",
                moved.agent.address, moved.version
            );
        }
        AgentCommand::Remove { name, force } => {
            let force = if force { "?force=true" } else { "" };
            let _: serde_json::Value = c
                .delete(&format!("/v1/agents/{}{force}", path_segment(&name)))
                .await?;
            println!("removed agent {name}");
        }
    }
    Ok(())
}
