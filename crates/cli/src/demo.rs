//! `mesh demo`: three real nodes in a temp dir, narrated.
//!
//! Each node is a `mesh daemon` process of the running executable (its own
//! key, redb store, iroh endpoint on 127.0.0.1 and API socket), driven only
//! through its socket API, as `mesh` and agents drive one. The demo links
//! the three, sends both ways, stops one, sends more to it, restarts it and
//! shows the catch-up, and shows the gap a node journals when a sender's
//! outbox overflowed while it was away; then two agents on two nodes talk
//! by address, reply, and see a bounce. Every figure printed (ids, seqs,
//! marks, cursors, arrivals) is read back from the nodes. It stops the
//! nodes and removes its temp dir however it ends, and gives up after
//! [`DEMO_TIMEOUT`].

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{
    AddAgentRequest, AgentJson, AgentSendRequest, AgentSendResponse, AliasRequest, BatchResponse,
    EventEntry, EventRecord, EventsPage, InboxEntry, InboxPage, InviteRequest, InviteResponse,
    JoinBody, JoinResponse, PeerStatus, ReplyRequest, SendRequest, SendResponse, StatusResponse,
};
use mesh_cluster::{NodeProc, NodeSpec, Placement, RestartPort, Stopped, call};

/// The whole demo finishes within this, or stops with an error.
pub const DEMO_TIMEOUT: Duration = Duration::from_secs(90);
/// How often a node is asked whether what the demo waits for has happened.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How many times before a wait gives up (about 30 s).
const POLLS_MAX: u32 = 1500;
/// bravo's tiny outbox: the most messages it keeps per peer.
const BRAVO_OUTBOX_MSGS: u64 = 3;
/// Messages alpha sends charlie while charlie is stopped.
const AWAY_FROM_ALPHA: usize = 5;
/// Messages bravo sends charlie while charlie is stopped (more than its outbox keeps).
const AWAY_FROM_BRAVO: usize = 6;
/// The longest message text shown in a journal line.
const SHOWN_BODY_CHARS_MAX: usize = 40;

/// Runs the demo in a new temp dir with daemons of the `mesh` executable
/// `bin`, writing the narration to `out`; the dir is removed however it ends.
///
/// # Errors
/// If a node does not start, a step does not happen within its wait, or the
/// whole demo takes longer than [`DEMO_TIMEOUT`].
pub async fn run(bin: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("mesh-demo-")
        .tempdir()
        .context("cannot create the demo's temp dir")?;
    match tokio::time::timeout(DEMO_TIMEOUT, demo(bin, out, tmp.path())).await {
        Ok(result) => result,
        Err(_) => bail!("the demo did not finish within {DEMO_TIMEOUT:?}"),
    }
}

async fn demo(bin: &Path, out: &mut impl Write, root: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut say = Narrator { out };
    say.line(format_args!(
        "agent-mesh demo: three real nodes, each a `mesh daemon` process with its own key, store,\n\
         QUIC endpoint on 127.0.0.1 and API socket, in {}\n",
        root.display()
    ))?;
    let [alpha, bravo, mut charlie] = start_nodes(&mut say, bin, root).await?;
    link(&mut say, [&alpha, &bravo, &charlie]).await?;
    let cursor = send_each_way(&mut say, &alpha, &bravo, &charlie).await?;

    say.line(format_args!(
        "4. Stop charlie. Its key and store stay in {}.",
        charlie.proc.data_dir().display()
    ))?;
    charlie.stop().await?;
    say.line("")?;

    send_while_away(&mut say, &alpha, &bravo, &charlie).await?;
    catch_up(&mut say, &alpha, &bravo, &mut charlie, &cursor).await?;
    agents_talk(&mut say, &alpha, &charlie).await?;

    say.line(format_args!(
        "8. Stop all three nodes and remove {}.",
        root.display()
    ))?;
    for mut n in [alpha, bravo, charlie] {
        n.stop().await?;
    }
    say.line(format_args!(
        "\nDone in {:.1} s. Run a node of your own with `mesh daemon`; the README shows a \
         two-node session.",
        started.elapsed().as_secs_f64()
    ))?;
    Ok(())
}

/// Step 1: alpha, bravo (with a tiny evicting outbox) and charlie.
async fn start_nodes(
    say: &mut Narrator<'_, impl Write>,
    bin: &Path,
    root: &Path,
) -> anyhow::Result<[DemoNode; 3]> {
    say.line("1. Start three nodes.")?;
    let alpha = DemoNode::start(bin, root, "alpha", None).await?;
    let bravo_config =
        format!("[outbox]\nmax_msgs = {BRAVO_OUTBOX_MSGS}\non_full = \"evict-oldest\"\n");
    let bravo = DemoNode::start(bin, root, "bravo", Some(&bravo_config)).await?;
    let charlie = DemoNode::start(bin, root, "charlie", None).await?;
    for n in [&alpha, &bravo, &charlie] {
        say.line(format_args!(
            "   {:8} node {}  peers dial it at 127.0.0.1:{}",
            n.name,
            short(n.id()),
            n.proc.peer_addr().port()
        ))?;
    }
    say.line(format_args!(
        "   bravo's config.toml keeps at most {BRAVO_OUTBOX_MSGS} unacknowledged messages per peer \
         and evicts the oldest when full\n   ([outbox] max_msgs = {BRAVO_OUTBOX_MSGS}, \
         on_full = \"evict-oldest\"); the default is a million, and refusing new sends.\n"
    ))?;
    Ok([alpha, bravo, charlie])
}

/// Step 2: alpha invites bravo and charlie, bravo invites charlie; they join.
async fn link(say: &mut Narrator<'_, impl Write>, nodes: [&DemoNode; 3]) -> anyhow::Result<()> {
    let [alpha, bravo, charlie] = nodes;
    say.line(
        "2. Link them with invites: alpha invites two nodes (`mesh invite --uses 2`), bravo one\n   \
         (`mesh invite`); the new nodes join with the code (`mesh join CODE`). Joining makes both\n   \
         sides peers: no ticket is copied by hand, nothing is run on the inviter.",
    )?;
    let t = Instant::now();
    let code = alpha.invite(2).await?;
    say.line(format_args!(
        "   alpha's code: {}… (its id and addresses, and the invite's secret)",
        code.chars().take(40).collect::<String>()
    ))?;
    for joiner in [bravo, charlie] {
        joiner.join(&code).await?;
        say.line(format_args!(
            "   {} joined alpha's mesh with it",
            joiner.name
        ))?;
    }
    let code = bravo.invite(1).await?;
    charlie.join(&code).await?;
    say.line("   charlie joined bravo with bravo's code")?;
    let pairs = [(alpha, bravo), (alpha, charlie), (bravo, charlie)];
    for (a, b) in pairs {
        wait_connected(a, b).await?;
    }
    say.line(format_args!(
        "   alpha-bravo, alpha-charlie and bravo-charlie are connected ({:.1} s).\n",
        t.elapsed().as_secs_f64()
    ))
}

/// Step 3: one message each way; answers charlie's cursor after them.
async fn send_each_way(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    bravo: &DemoNode,
    charlie: &DemoNode,
) -> anyhow::Result<String> {
    say.line("3. Send, each way. A send answers once the message is committed to disk.")?;
    for (from, to, text) in [
        (alpha, bravo, "hello bravo, alpha here"),
        (bravo, alpha, "hi alpha, bravo here"),
        (alpha, charlie, "hello charlie, alpha here"),
        (bravo, charlie, "hello charlie, bravo here"),
    ] {
        let sent = from.send(to, vec![text.to_owned()]).await?;
        say.line(format_args!(
            "   {:7} -> {:7} {:28} seq {} of {}'s stream to {}",
            from.name,
            to.name,
            format!("{text:?}"),
            sent[0].seq,
            from.name,
            to.name
        ))?;
    }
    let first = charlie
        .wait_for_messages(
            "",
            &[(alpha, 1), (bravo, 1)],
            "charlie to receive the first messages",
        )
        .await?;
    for (a, b) in [
        (alpha, bravo),
        (bravo, alpha),
        (alpha, charlie),
        (bravo, charlie),
    ] {
        wait_acknowledged(a, b).await?;
    }
    say.line("   charlie's journal (`mesh events` on charlie):")?;
    say.entries(&first, &[alpha, bravo, charlie])?;
    let cursor = first.last().map(|e| e.cursor.clone()).unwrap_or_default();
    say.line(format_args!(
        "   Every sender's outbox is acknowledged; charlie's marks: {}.\n   \
         charlie's cursor after its last entry: {cursor}\n   \
         (`mesh events --after CURSOR` on charlie pages on from there, across restarts.)\n",
        charlie.marks(&[alpha, bravo]).await?
    ))?;
    Ok(cursor)
}

/// Step 5: alpha and bravo send to the stopped charlie; bravo's outbox overflows.
async fn send_while_away(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    bravo: &DemoNode,
    charlie: &DemoNode,
) -> anyhow::Result<()> {
    say.line("5. Send to charlie while it is away.")?;
    let sent = alpha
        .send(
            charlie,
            numbered("from alpha, while you were away", AWAY_FROM_ALPHA),
        )
        .await?;
    say.line(format_args!(
        "   alpha -> charlie: {} messages, seqs {}, committed to alpha's outbox; {} queued for charlie.",
        sent.len(),
        seq_range(&sent),
        alpha.peer(charlie).await?.queued_msgs
    ))?;
    let bravo_head = bravo.journal_cursor().await?;
    // One at a time, as `mesh send` does: each is its own commit and batch.
    let mut sent = Vec::new();
    for body in numbered("from bravo, while you were away", AWAY_FROM_BRAVO) {
        sent.extend(bravo.send(charlie, vec![body]).await?);
    }
    say.line(format_args!(
        "   bravo -> charlie: {} messages, seqs {}. bravo keeps only {BRAVO_OUTBOX_MSGS}, so each send \
         past that\n   evicted the oldest unacknowledged one, and bravo journaled each loss \
         (`mesh events` on bravo):",
        sent.len(),
        seq_range(&sent)
    ))?;
    let losses: Vec<EventEntry> = bravo
        .events_after(&bravo_head)
        .await?
        .into_iter()
        .filter(|e| matches!(e.record, EventRecord::Loss { .. }))
        .collect();
    say.entries(&losses, &[alpha, bravo, charlie])?;
    say.line("")
}

/// Step 6: charlie restarts and catches up, with a gap where bravo evicted.
async fn catch_up(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    bravo: &DemoNode,
    charlie: &mut DemoNode,
    cursor: &str,
) -> anyhow::Result<()> {
    say.line("6. Restart charlie from the same data dir: same key, same store, same port.")?;
    let t = Instant::now();
    charlie.restart().await?;
    let alpha_last = AWAY_FROM_ALPHA as u64 + 1;
    let bravo_last = AWAY_FROM_BRAVO as u64 + 1;
    let caught_up = charlie
        .wait_for_messages(
            cursor,
            &[(alpha, alpha_last), (bravo, bravo_last)],
            "charlie to catch up",
        )
        .await?;
    let took = t.elapsed().as_secs_f64();
    say.line(format_args!(
        "   It reconnected and sent each peer its marks; each peer sent what came after them.\n   \
         charlie's journal after the cursor above (`mesh events --after {cursor}`):"
    ))?;
    say.entries(&caught_up, &[alpha, bravo, charlie])?;
    let (from_alpha, from_bravo) = (seqs_from(&caught_up, alpha), seqs_from(&caught_up, bravo));
    say.line(format_args!(
        "   Catch-up in {took:.1} s: {} messages from alpha ({}) and {} from bravo ({}).",
        from_alpha.len(),
        span(&from_alpha),
        from_bravo.len(),
        span(&from_bravo)
    ))?;
    let gaps: Vec<String> = caught_up
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Gap { stream, from, to } if stream.author == bravo.id() => {
                Some(format!("#{from}..=#{to}"))
            }
            _ => None,
        })
        .collect();
    if gaps.is_empty() {
        bail!("charlie journaled no gap for bravo's evicted messages");
    }
    say.line(format_args!(
        "   And a gap: bravo no longer held {} of its stream to charlie, so charlie \
         journaled\n   a gap record in their place. Nothing was skipped silently: \
         every reader sees it.",
        gaps.join(", ")
    ))?;
    say.line(format_args!(
        "   charlie's marks now: {}.\n",
        charlie.marks(&[alpha, bravo]).await?
    ))
}

/// Step 7: an agent on alpha and one on charlie talk by address.
async fn agents_talk(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    charlie: &DemoNode,
) -> anyhow::Result<()> {
    say.line(
        "7. Two agents: `planner` on alpha, `coder` on charlie, each with its own key and its \
         own socket
   (`mesh agent add NAME`). alpha names charlie `charlie` (`mesh peer name`).",
    )?;
    let planner = alpha.add_agent("planner").await?;
    let coder = charlie.add_agent("coder").await?;
    let _: PeerStatus = alpha
        .client()
        .put(
            &format!("/v1/peers/{}/alias", charlie.id()),
            &AliasRequest {
                alias: Some("charlie".into()),
            },
        )
        .await?;
    let ask = agent_send(
        &planner,
        "planner",
        "coder@charlie",
        "please review the parser",
    )
    .await?;
    say.line(format_args!(
        "   planner -> coder@charlie: \"please review the parser\"  (message {})",
        short(&ask.id)
    ))?;
    let got = inbox_wait(&coder, "coder", None).await?;
    let first = got
        .iter()
        .find(|e| e.id.as_deref() == Some(ask.id.as_str()))
        .context("coder's inbox does not hold planner's message")?;
    say.line(format_args!(
        "   coder's inbox (`mesh --agent coder inbox`): from {} \"{}\", sender verified: {}",
        short_address(first.from.as_deref().unwrap_or("")),
        first.body,
        first.verified
    ))?;
    let req = ReplyRequest {
        id: ask.id.clone(),
        body: "looks good".into(),
        encoding: Default::default(),
        client_id: None,
    };
    let reply: AgentSendResponse = coder.post("/v1/agents/coder/reply", &req).await?;
    let back = inbox_wait(&planner, "planner", Some(&ask.cursor)).await?;
    let answer = back
        .iter()
        .find(|e| e.id.as_deref() == Some(reply.id.as_str()))
        .context("planner's inbox does not hold the reply")?;
    say.line(format_args!(
        "   coder replies; planner's inbox: \"{}\" in reply to {}",
        answer.body,
        short(answer.in_reply_to.as_deref().unwrap_or(""))
    ))?;
    let lost = agent_send(&planner, "planner", "tester@charlie", "run the tests").await?;
    let bounced = inbox_wait(&planner, "planner", Some(&answer.cursor)).await?;
    let bounce = bounced
        .iter()
        .find(|e| e.kind == "bounce" && e.id.as_deref() == Some(lost.id.as_str()))
        .context("planner's inbox holds no bounce")?;
    say.line(format_args!(
        "   planner -> tester@charlie: charlie has no agent `tester`; the message is journaled \
         there as
   undeliverable and comes back to planner: {}\n",
        bounce.reason.as_deref().unwrap_or("?")
    ))
}

/// Sends `body` as `agent` through its socket client `c`.
async fn agent_send(
    c: &Client,
    agent: &str,
    to: &str,
    body: &str,
) -> anyhow::Result<AgentSendResponse> {
    let req = AgentSendRequest {
        to: to.into(),
        body: body.into(),
        encoding: Default::default(),
        in_reply_to: None,
        client_id: None,
    };
    Ok(c.post(&format!("/v1/agents/{agent}/send"), &req).await?)
}

/// `agent`'s inbox after `after`, waiting for its first entry.
async fn inbox_wait(
    c: &Client,
    agent: &str,
    after: Option<&str>,
) -> anyhow::Result<Vec<InboxEntry>> {
    let mut path = format!("/v1/agents/{agent}/inbox?wait=30");
    if let Some(a) = after {
        path.push_str(&format!("&after={}", mesh_api::path_segment(a)));
    }
    let page: InboxPage = c.get(&path).await?;
    if page.entries.is_empty() {
        bail!("{agent}'s inbox got nothing within 30 s");
    }
    Ok(page.entries)
}

fn short_address(address: &str) -> String {
    match address.split_once('@') {
        Some((agent, node)) => format!("{agent}@{}", short(node)),
        None => short(address),
    }
}

/// The seqs of the messages from `author` among `entries`.
fn seqs_from(entries: &[EventEntry], author: &DemoNode) -> Vec<u64> {
    entries
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Envelope { stream, seq, .. } if stream.author == author.id() => Some(*seq),
            _ => None,
        })
        .collect()
}

/// Writes the narration.
struct Narrator<'a, W: Write> {
    out: &'a mut W,
}

impl<W: Write> Narrator<'_, W> {
    fn line(&mut self, text: impl std::fmt::Display) -> anyhow::Result<()> {
        writeln!(self.out, "{text}").context("cannot write the narration")?;
        self.out.flush().context("cannot write the narration")
    }

    /// One line per journal entry, naming authors by their demo names.
    fn entries(&mut self, entries: &[EventEntry], nodes: &[&DemoNode]) -> anyhow::Result<()> {
        let name = |id: &str| {
            nodes
                .iter()
                .find(|n| n.id() == id)
                .map_or_else(|| short(id), |n| n.name.to_owned())
        };
        let recipient = |channel: &str| name(channel.trim_start_matches("direct:"));
        for e in entries {
            let mut line = format!("     [arrival {}] ", e.arrival);
            match &e.record {
                EventRecord::Envelope {
                    stream, seq, body, ..
                } => {
                    let shown: String = body.chars().take(SHOWN_BODY_CHARS_MAX).collect();
                    let _ = write!(line, "from {} #{seq}: {shown:?}", name(&stream.author));
                }
                EventRecord::Gap { stream, from, to } => {
                    let _ = write!(
                        line,
                        "GAP  from {} #{from}..=#{to}: can never arrive (the author no longer holds them)",
                        name(&stream.author)
                    );
                }
                EventRecord::Loss {
                    stream,
                    from,
                    to,
                    reason,
                    ..
                } => {
                    let _ = write!(
                        line,
                        "LOSS {reason}: {}'s stream to {} #{from}..=#{to}",
                        name(&stream.author),
                        recipient(&stream.channel)
                    );
                }
                EventRecord::Lagged {
                    subscriber,
                    from,
                    to,
                    ..
                } => {
                    let _ = write!(line, "LAGGED {subscriber}: arrivals {from}..={to}");
                }
                EventRecord::Lost { msgs, to, .. } => {
                    let _ = write!(line, "LOST {msgs} sends to {}", name(to));
                }
                EventRecord::EpochEnded { stream, last, .. } => {
                    let _ = write!(
                        line,
                        "EPOCH ENDED {}'s stream at #{last}",
                        name(&stream.author)
                    );
                }
                EventRecord::RolledBack {
                    stream, from, to, ..
                } => {
                    let _ = write!(
                        line,
                        "ROLLED BACK {}'s stream #{from}..=#{to}",
                        name(&stream.author)
                    );
                }
                EventRecord::Conflict { stream, seq, .. } => {
                    let _ = write!(line, "CONFLICT {}'s stream #{seq}", name(&stream.author));
                }
                EventRecord::Trimmed { from, to, .. } => {
                    let _ = write!(line, "TRIMMED arrivals {from}..={to}");
                }
                EventRecord::Other {} => line.push_str("(an entry this build does not know)"),
            }
            self.line(line)?;
        }
        Ok(())
    }
}

/// One node of the demo: a `mesh daemon` process on `<root>/<name>`.
struct DemoNode {
    name: &'static str,
    proc: NodeProc,
}

impl DemoNode {
    /// Starts a node on 127.0.0.1 (a port its first start picks and it
    /// remembers for its restarts); `config` is written to its
    /// `config.toml` first.
    async fn start(
        bin: &Path,
        root: &Path,
        name: &'static str,
        config: Option<&str>,
    ) -> anyhow::Result<Self> {
        let dir = root.join(name);
        if let Some(text) = config {
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            std::fs::write(dir.join(mesh_api::paths::CONFIG_FILE), text)
                .with_context(|| format!("cannot write {name}'s config.toml"))?;
        }
        let mut proc = NodeProc::new(NodeSpec {
            name: name.to_owned(),
            bin: bin.to_owned(),
            data: dir,
            log: root.join(format!("{name}.log")),
            placement: Placement {
                // `mesh daemon --bind 127.0.0.1:0` every time, as a person
                // runs it: the node asks for the port it remembers.
                restart_port: RestartPort::Remembered,
                ..Placement::default()
            },
            rust_log: "warn".into(),
        });
        proc.start().await?;
        Ok(DemoNode { name, proc })
    }

    fn id(&self) -> &str {
        self.proc.id()
    }

    /// `mesh invite --uses USES`: the code.
    async fn invite(&self, uses: u32) -> anyhow::Result<String> {
        let req = InviteRequest {
            uses: Some(uses),
            ttl_ms: None,
        };
        let made: InviteResponse = call(self.client().post("/v1/invites", &req))
            .await
            .with_context(|| format!("{} making an invite", self.name))?;
        Ok(made.code)
    }

    /// `mesh join CODE`.
    async fn join(&self, code: &str) -> anyhow::Result<()> {
        let body = JoinBody {
            code: code.to_owned(),
        };
        let _: JoinResponse = call(self.client().post("/v1/join", &body))
            .await
            .with_context(|| format!("{} joining", self.name))?;
        Ok(())
    }

    fn client(&self) -> &Client {
        self.proc.client()
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        match self.proc.stop().await? {
            Stopped::Exited => Ok(()),
            Stopped::Killed => bail!("{} did not stop on SIGTERM; killed", self.name),
        }
    }

    async fn restart(&mut self) -> anyhow::Result<()> {
        self.proc.start().await.map(|_| ())
    }

    /// Adds agent `name`; a client of its socket.
    async fn add_agent(&self, name: &str) -> anyhow::Result<Client> {
        let a: AgentJson = self
            .client()
            .post(
                "/v1/agents",
                &AddAgentRequest {
                    name: name.into(),
                    uid: None,
                },
            )
            .await?;
        let socket = a.socket.context("the node named no socket for its agent")?;
        Ok(Client::for_agent(socket, name))
    }

    async fn peer(&self, other: &DemoNode) -> anyhow::Result<PeerStatus> {
        let st: StatusResponse = self.client().get("/v1/status").await?;
        st.node
            .peers
            .into_iter()
            .find(|p| p.node == other.id())
            .with_context(|| format!("{} does not list {}", self.name, other.name))
    }

    /// Sends `bodies` to `to` in one batch, in order.
    async fn send(&self, to: &DemoNode, bodies: Vec<String>) -> anyhow::Result<Vec<SendResponse>> {
        let reqs: Vec<SendRequest> = bodies
            .into_iter()
            .map(|body| SendRequest {
                to: to.id().to_owned(),
                body,
                encoding: Default::default(),
                msg_kind: 0,
                client_id: None,
            })
            .collect();
        let res: BatchResponse = self.client().post("/v1/send/batch", &reqs).await?;
        Ok(res.sent)
    }

    /// Every journal entry after `after` (empty: from the start).
    async fn events_after(&self, after: &str) -> anyhow::Result<Vec<EventEntry>> {
        let mut entries = Vec::new();
        let mut after = after.to_owned();
        loop {
            let page: EventsPage = self
                .client()
                .get(&format!(
                    "/v1/events?after={}&limit=1000",
                    mesh_api::path_segment(&after)
                ))
                .await?;
            if page.entries.is_empty() {
                return Ok(entries);
            }
            entries.extend(page.entries);
            after = page.next;
        }
    }

    /// The cursor after the last journal entry now.
    async fn journal_cursor(&self) -> anyhow::Result<String> {
        let entries = self.events_after("").await?;
        Ok(entries.last().map(|e| e.cursor.clone()).unwrap_or_default())
    }

    /// Waits until the journal after `after` holds the message with seq
    /// `last` from each `(author, last)`; returns the entries after `after`.
    async fn wait_for_messages(
        &self,
        after: &str,
        want: &[(&DemoNode, u64)],
        what: &str,
    ) -> anyhow::Result<Vec<EventEntry>> {
        for _ in 0..POLLS_MAX {
            let entries = self.events_after(after).await?;
            let has = |author: &DemoNode, last: u64| {
                entries.iter().any(|e| {
                    matches!(&e.record, EventRecord::Envelope { stream, seq, .. }
                        if stream.author == author.id() && *seq == last)
                })
            };
            if want.iter().all(|(n, last)| has(n, *last)) {
                return Ok(entries);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        bail!("gave up waiting for {what}")
    }

    /// This node's marks for the given authors' streams, as text.
    async fn marks(&self, authors: &[&DemoNode]) -> anyhow::Result<String> {
        let mut parts = Vec::new();
        for a in authors {
            let p = self.peer(a).await?;
            let mark = p.marks.iter().map(|m| m.mark).max().unwrap_or(0);
            parts.push(format!("{} for {}'s stream", mark, a.name));
        }
        Ok(parts.join(", "))
    }
}

async fn wait_connected(a: &DemoNode, b: &DemoNode) -> anyhow::Result<()> {
    for _ in 0..POLLS_MAX {
        if a.peer(b).await?.connected && b.peer(a).await?.connected {
            return Ok(());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!("gave up waiting for {} and {} to connect", a.name, b.name)
}

/// Waits until `to` has acknowledged everything `from` sent it.
async fn wait_acknowledged(from: &DemoNode, to: &DemoNode) -> anyhow::Result<()> {
    for _ in 0..POLLS_MAX {
        if from.peer(to).await?.queued_msgs == 0 {
            return Ok(());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!(
        "gave up waiting for {} to acknowledge {}",
        to.name,
        from.name
    )
}

fn short(id: &str) -> String {
    id.chars().take(10).collect()
}

fn numbered(text: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{text} ({i} of {n})")).collect()
}

fn seq_range(sent: &[SendResponse]) -> String {
    let seqs: Vec<u64> = sent.iter().map(|s| s.seq).collect();
    span(&seqs)
}

/// `#a..=#b` for ascending seqs, or the list if they are not one run.
fn span(seqs: &[u64]) -> String {
    match (seqs.first(), seqs.last()) {
        (Some(&a), Some(&b)) if b >= a && b - a + 1 == seqs.len() as u64 => {
            format!("#{a}..=#{b}")
        }
        _ => {
            let all: Vec<String> = seqs.iter().map(|s| format!("#{s}")).collect();
            all.join(", ")
        }
    }
}
