//! The client subcommands: each talks to the running daemon over its socket.

use std::io::{BufRead, Write};

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{
    AddPeerRequest, AliasRequest, BatchResponse, BodyEncoding, EventEntry, EventRecord, EventsPage,
    InviteJson, InviteRequest, InviteResponse, InvitesResponse, JoinBody, JoinResponse,
    LaggedEvent, NearbyResponse, NodeStatus, PeerStatus, PeersResponse, SendRequest, SendResponse,
    StatusResponse, TicketResponse, path_segment,
};

use crate::{InviteCommand, PeerCommand, TopicCommand, UsageError};

/// The most messages `mesh send --lines` puts in one request.
const SEND_LINES_CHUNK: usize = 1000;

/// `mesh web`.
pub(crate) async fn web(c: &Client, json: bool) -> anyhow::Result<()> {
    let w: mesh_api::WebResponse = c.post("/v1/web", &serde_json::json!({})).await?;
    if json {
        return print_json(&w);
    }
    println!("{}", w.url);
    Ok(())
}

/// `mesh status`.
pub(crate) async fn status(c: &Client, json: bool) -> anyhow::Result<()> {
    let st: serde_json::Value = c.get("/v1/status").await?;
    if json {
        return print_json(&st);
    }
    let st: StatusResponse = serde_json::from_value(st).context("unexpected status answer")?;
    let agents = st.agents;
    let st = st.node;
    println!("node    {}", st.node);
    println!("name    {}", st.name);
    println!("epoch   {}", st.epoch);
    let addrs: Vec<String> = st.addrs.iter().map(|a| a.to_string()).collect();
    println!("listen  {}", addrs.join(", "));
    if let Some(b) = st.store_bytes {
        println!("store   {b} bytes");
    }
    if let Some(why) = &st.store_down {
        println!("store   DOWN: {why} (sends are held, then answered 503)");
    }
    if let Some(j) = st.journal {
        if j.first > j.head {
            println!("journal empty after arrival {} ({} bytes)", j.head, j.bytes);
        } else {
            println!(
                "journal arrivals {}..={} ({} bytes){}",
                j.first,
                j.head,
                j.bytes,
                if j.first > 1 {
                    format!("; 1..={} trimmed", j.first - 1)
                } else {
                    String::new()
                }
            );
        }
    }
    println!("peers   {}", st.peers.len());
    print_peers(&st.peers);
    if !agents.is_empty() {
        println!("agents  {}", agents.len());
        for a in &agents {
            let state = if a.online { "online" } else { "offline" };
            println!(
                "  {:16}  {state:7}  {}",
                a.name,
                crate::agents::unread_text(&a.unread)
            );
        }
    }
    Ok(())
}

fn print_peers(peers: &[PeerStatus]) {
    for p in peers {
        let state = match (p.paused, p.connected, &p.refused) {
            (true, _, _) => "paused",
            (false, true, _) => "connected",
            (false, false, Some(_)) => "refused",
            (false, false, None) => "offline",
        };
        let marks: Vec<String> = p.marks.iter().map(|m| m.mark.to_string()).collect();
        let alias = p
            .alias
            .as_ref()
            .map_or_else(String::new, |a| format!(" ({a})"));
        let addrs: Vec<String> = p.addrs.iter().map(|a| a.to_string()).collect();
        println!(
            "  {}{alias}  {:12}  {state:9}  queued {} msgs, outbox {} bytes  received marks [{}]  at {}",
            p.node,
            p.name.as_deref().unwrap_or("-"),
            p.queued_msgs,
            p.outbox_bytes,
            marks.join(", "),
            if addrs.is_empty() {
                "(no address yet)".to_owned()
            } else {
                addrs.join(", ")
            }
        );
        if let Some(why) = &p.refused {
            println!("      refused: {why}");
        }
        if let Some(why) = &p.identity_conflict {
            println!("      IDENTITY CONFLICT: {why}");
        }
    }
}

/// `mesh id`.
pub(crate) async fn id(c: &Client) -> anyhow::Result<()> {
    let st: NodeStatus = c.get("/v1/status").await?;
    println!("{}", st.node);
    Ok(())
}

/// `mesh ticket`.
pub(crate) async fn ticket(c: &Client) -> anyhow::Result<()> {
    let t: TicketResponse = c.get("/v1/ticket").await?;
    println!("{}", t.ticket);
    Ok(())
}

/// `mesh peer ...`.
pub(crate) async fn peer(c: &Client, cmd: PeerCommand) -> anyhow::Result<()> {
    match cmd {
        PeerCommand::Name { id, alias } => {
            let path = format!("/v1/peers/{}/alias", path_segment(&id));
            let p: PeerStatus = c.put(&path, &AliasRequest { alias: Some(alias) }).await?;
            println!(
                "peer {} is {} here now",
                p.node,
                p.alias.as_deref().unwrap_or("unnamed")
            );
        }
        PeerCommand::Add { ticket } => {
            let p: PeerStatus = c.post("/v1/peers", &AddPeerRequest { ticket }).await?;
            println!("added peer {}", p.node);
        }
        PeerCommand::List { json } => return peer_list(c, json).await,
        PeerCommand::Nearby { json } => return peer_nearby(c, json).await,
        PeerCommand::Remove { id } => {
            let _: serde_json::Value = c
                .delete(&format!("/v1/peers/{}", path_segment(&id)))
                .await?;
            println!("removed peer {id}");
        }
        PeerCommand::Pause { id, json } => {
            if let Some(p) = set_paused(c, &id, "pause", json).await? {
                println!(
                    "paused peer {}: {} msgs queued; `mesh peer resume {}` ends the pause (so does a restart)",
                    p.node, p.queued_msgs, p.node
                );
            }
        }
        PeerCommand::Resume { id, json } => {
            if let Some(p) = set_paused(c, &id, "resume", json).await? {
                println!(
                    "resumed peer {}: dialing it; {} msgs queued",
                    p.node, p.queued_msgs
                );
            }
        }
    }
    Ok(())
}

/// `mesh peer list`.
async fn peer_list(c: &Client, json: bool) -> anyhow::Result<()> {
    let peers: serde_json::Value = c.get("/v1/peers").await?;
    if json {
        return print_json(&peers);
    }
    let peers: PeersResponse = serde_json::from_value(peers).context("unexpected peers answer")?;
    let peers = peers.peers;
    if peers.is_empty() {
        println!(
            "no peers yet: invite one with `mesh invite` (or add one with `mesh peer add TICKET`)"
        );
    }
    print_peers(&peers);
    Ok(())
}

/// `mesh peer nearby`.
async fn peer_nearby(c: &Client, json: bool) -> anyhow::Result<()> {
    let nearby: serde_json::Value = c.get("/v1/peers/nearby").await?;
    if json {
        return print_json(&nearby);
    }
    let nearby: NearbyResponse =
        serde_json::from_value(nearby).context("unexpected nearby answer")?;
    if nearby.nearby.is_empty() {
        println!("no other agent-mesh nodes found on the LAN (mDNS)");
    }
    for n in &nearby.nearby {
        let addrs: Vec<String> = n.addrs.iter().map(|a| a.to_string()).collect();
        println!(
            "  {}  {:12}  at {}",
            n.node,
            n.name.as_deref().unwrap_or("-"),
            addrs.join(", ")
        );
    }
    Ok(())
}

/// `mesh invite ...`.
pub(crate) async fn invite(
    c: &Client,
    cmd: Option<InviteCommand>,
    uses: u32,
    ttl_ms: u64,
    json: bool,
) -> anyhow::Result<()> {
    match cmd {
        None => {
            let req = InviteRequest {
                uses: Some(uses),
                ttl_ms: Some(ttl_ms),
            };
            let made: serde_json::Value = c.post("/v1/invites", &req).await?;
            if json {
                return print_json(&made);
            }
            let made: InviteResponse =
                serde_json::from_value(made).context("unexpected invite answer")?;
            println!("{}", made.code);
        }
        Some(InviteCommand::List { json }) => {
            let list: serde_json::Value = c.get("/v1/invites").await?;
            if json {
                return print_json(&list);
            }
            let list: InvitesResponse =
                serde_json::from_value(list).context("unexpected invites answer")?;
            if list.invites.is_empty() {
                println!("no invites yet: make one with `mesh invite`");
            }
            for i in &list.invites {
                print_invite(i);
            }
        }
        Some(InviteCommand::Revoke { id }) => {
            let path = format!("/v1/invites/{}/revoke", path_segment(&id));
            let i: InviteJson = c.post(&path, &()).await?;
            println!("revoked invite {}", i.id);
        }
    }
    Ok(())
}

fn print_invite(i: &InviteJson) {
    let joined = if i.joined.is_empty() {
        String::new()
    } else {
        let short: Vec<String> = i
            .joined
            .iter()
            .map(|n| n.chars().take(10).collect())
            .collect();
        format!("  joined: {}", short.join(", "))
    };
    println!(
        "  {}  {:8}  {}/{} uses left  {}{joined}",
        i.id,
        i.state,
        i.uses_left,
        i.uses,
        expiry_text(i.expires_ms, now_ms())
    );
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// When an invite that expires at `expires_ms` does, as a person reads it
/// at `now_ms`: `expires in 23h 59m`, `expired 5m ago`.
pub(crate) fn expiry_text(expires_ms: u64, now_ms: u64) -> String {
    let span = |ms: u64| {
        let m = ms / 60_000;
        match (m / (24 * 60), m / 60 % 24, m % 60) {
            (0, 0, 0) => format!("{}s", ms / 1000),
            (0, 0, m) => format!("{m}m"),
            (0, h, m) => format!("{h}h {m}m"),
            (d, h, _) => format!("{d}d {h}h"),
        }
    };
    if expires_ms > now_ms {
        format!("expires in {}", span(expires_ms - now_ms))
    } else {
        format!("expired {} ago", span(now_ms - expires_ms))
    }
}

/// `mesh join`.
pub(crate) async fn join(c: &Client, code: String, json: bool) -> anyhow::Result<()> {
    let joined: serde_json::Value = c.post("/v1/join", &JoinBody { code }).await?;
    if json {
        return print_json(&joined);
    }
    let joined: JoinResponse = serde_json::from_value(joined).context("unexpected join answer")?;
    println!("joined: {} ({}) is a peer now", joined.inviter, joined.name);
    Ok(())
}

/// `POST /v1/peers/{id}/{verb}` (pause or resume): prints the JSON answer
/// with `json`, else returns the peer for the caller to describe.
async fn set_paused(
    c: &Client,
    id: &str,
    verb: &str,
    json: bool,
) -> anyhow::Result<Option<PeerStatus>> {
    let path = format!("/v1/peers/{}/{verb}", path_segment(id));
    let p: serde_json::Value = c.post(&path, &()).await?;
    if json {
        print_json(&p)?;
        return Ok(None);
    }
    let p = serde_json::from_value(p).context("unexpected peer answer")?;
    Ok(Some(p))
}

/// `mesh send`.
pub(crate) async fn send(
    c: &Client,
    peer: String,
    text: String,
    lines: bool,
    id: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    if lines && id.is_some() {
        return Err(
            UsageError("--id names one message; it does not go with --lines".into()).into(),
        );
    }
    if text != "-" {
        if lines {
            return Err(UsageError("--lines reads stdin: pass `-` as the text".into()).into());
        }
        let sent: SendResponse = c.post("/v1/send", &request(&peer, text, id)).await?;
        return print_sent(&sent, json);
    }
    let stdin = std::io::stdin();
    if !lines {
        let mut body = String::new();
        std::io::Read::read_to_string(&mut stdin.lock(), &mut body).context("cannot read stdin")?;
        let sent: SendResponse = c.post("/v1/send", &request(&peer, body, id)).await?;
        return print_sent(&sent, json);
    }
    let mut chunk = Vec::with_capacity(SEND_LINES_CHUNK);
    for line in stdin.lock().lines() {
        chunk.push(request(&peer, line.context("cannot read stdin")?, None));
        if chunk.len() == SEND_LINES_CHUNK {
            send_chunk(c, std::mem::take(&mut chunk), json).await?;
        }
    }
    if !chunk.is_empty() {
        send_chunk(c, chunk, json).await?;
    }
    Ok(())
}

fn request(peer: &str, body: String, client_id: Option<String>) -> SendRequest {
    SendRequest {
        to: peer.to_owned(),
        body,
        encoding: Default::default(),
        msg_kind: 0,
        client_id,
    }
}

async fn send_chunk(c: &Client, chunk: Vec<SendRequest>, json: bool) -> anyhow::Result<()> {
    let res: BatchResponse = c.post("/v1/send/batch", &chunk).await?;
    for sent in &res.sent {
        print_sent(sent, json)?;
    }
    Ok(())
}

fn print_sent(sent: &SendResponse, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(sent);
    }
    println!("{}", sent.seq);
    Ok(())
}

/// `mesh events`.
pub(crate) async fn events(
    c: &Client,
    after: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let mut path = format!("/v1/events?limit={limit}");
    if let Some(a) = &after {
        path.push_str(&format!("&after={}", path_segment(a)));
    }
    let page: EventsPage = c.get(&path).await?;
    let me = node_id(c).await?;
    for e in &page.entries {
        print_entry(e, &me, json)?;
    }
    eprintln!("next: {}", page.next);
    Ok(())
}

/// `mesh tail`.
pub(crate) async fn tail(c: &Client, after: Option<String>, json: bool) -> anyhow::Result<()> {
    let me = node_id(c).await?;
    let mut path = "/v1/subscribe".to_owned();
    if let Some(a) = &after {
        path.push_str(&format!("?after={}", path_segment(a)));
    }
    let mut sse = c.subscribe(&path).await?;
    while let Some(ev) = sse.next().await? {
        match ev.event.as_str() {
            "entry" => {
                let e: EventEntry =
                    serde_json::from_str(&ev.data).context("unexpected entry from the daemon")?;
                print_entry(&e, &me, json)?;
            }
            "lagged" => {
                let l: LaggedEvent =
                    serde_json::from_str(&ev.data).context("unexpected lagged event")?;
                eprintln!(
                    "lagged: entries {}..={} were not shown live; run `mesh events --after {}` to read them",
                    l.skipped_from, l.skipped_to, l.resume
                );
                if json {
                    print_json(&serde_json::json!({"lagged": l}))?;
                }
            }
            "error" => bail!("the daemon ended the subscription: {}", ev.data),
            _ => {}
        }
    }
    eprintln!("the daemon closed the subscription");
    Ok(())
}

async fn node_id(c: &Client) -> anyhow::Result<String> {
    let st: NodeStatus = c.get("/v1/status").await?;
    Ok(st.node)
}

fn print_entry(e: &EventEntry, me: &str, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(e);
    }
    let short = |id: &str| id.chars().take(10).collect::<String>();
    let line = match &e.record {
        EventRecord::Envelope {
            stream,
            seq,
            body,
            encoding,
            agent,
            ..
        } => {
            let dir = if stream.author == me {
                format!(
                    "to   {}",
                    short(stream.channel.trim_start_matches("direct:"))
                )
            } else {
                format!("from {}", short(&stream.author))
            };
            let enc = |e: &BodyEncoding| match e {
                BodyEncoding::Text => "",
                BodyEncoding::Base64 => " (base64)",
            };
            // An agent message reads as what its envelope says.
            let address = |a: &str| match a.split_once('@') {
                Some((name, node)) => format!("{name}@{}", short(node)),
                None => a.to_owned(),
            };
            match agent {
                Some(m) => {
                    let to = m.to.as_deref().map_or("the node".to_owned(), address);
                    format!(
                        "{dir} #{seq} {} {} -> {to}{}: {}",
                        m.id,
                        address(&m.from),
                        enc(&m.encoding),
                        m.body
                    )
                }
                None => format!("{dir} #{seq}{}: {body}", enc(encoding)),
            }
        }
        EventRecord::Gap { stream, from, to } => format!(
            "GAP  from {}: messages #{from}..=#{to} can never arrive (the author no longer holds them)",
            short(&stream.author)
        ),
        EventRecord::Loss {
            stream,
            from,
            to,
            reason,
            detail,
        } => format!(
            "LOSS {reason} on stream of {} #{from}..=#{to}: {detail}",
            short(&stream.author)
        ),
        EventRecord::Lagged { detail, .. } => format!("LAGGED {detail}"),
        EventRecord::Lost {
            to, msgs, detail, ..
        } => format!("LOST {msgs} sends to {}: {detail}", short(to)),
        EventRecord::EpochEnded { detail, .. } => format!("EPOCH ENDED {detail}"),
        EventRecord::RolledBack {
            stream,
            from,
            to,
            detail,
        } => format!(
            "ROLLED BACK stream of {} #{from}..=#{to}: {detail}",
            short(&stream.author)
        ),
        EventRecord::Conflict { detail, .. } => format!("CONFLICT {detail}"),
        EventRecord::Trimmed { detail, .. } => format!("TRIMMED {detail}"),
        EventRecord::DrainEnded { agent, to, detail } => {
            format!("DRAIN ENDED {agent}, now on {}: {detail}", short(to))
        }
        EventRecord::Other {} => "(an entry this build does not know)".to_owned(),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "[{}] {line}", e.arrival)?;
    Ok(())
}

pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

/// `mesh topic ...`.
pub(crate) async fn topic(c: &Client, cmd: TopicCommand) -> anyhow::Result<()> {
    match cmd {
        TopicCommand::Join {
            name,
            max_msgs,
            max_bytes,
            json,
        } => {
            let body = mesh_api::JoinTopicRequest {
                name,
                max_msgs,
                max_bytes,
            };
            let t: mesh_api::TopicJson = c.post("/v1/topics", &body).await?;
            if json {
                return print_json(&t);
            }
            println!(
                "member of topic {}: holds up to {} msgs / {} bytes of each author; {} members linked now",
                t.name,
                t.max_msgs,
                t.max_bytes,
                t.members.len()
            );
        }
        TopicCommand::Leave { name, json } => {
            let path = format!("/v1/topics/{}", path_segment(&name));
            let t: mesh_api::TopicJson = c.delete(&path).await?;
            if json {
                return print_json(&t);
            }
            let msgs: u64 = t.streams.iter().map(|s| s.mark).sum();
            println!(
                "left topic {}: its {} messages from {} authors stay in the journal; nothing more comes",
                t.name,
                msgs,
                t.streams.len()
            );
        }
        TopicCommand::List { json } => {
            let r: mesh_api::TopicsResponse = c.get("/v1/topics").await?;
            if json {
                return print_json(&r);
            }
            if r.topics.is_empty() {
                println!("a member of no topic (`mesh topic join NAME`)");
            }
            for t in r.topics {
                println!("{}  members linked: {}", t.name, t.members.len());
                for s in t.streams {
                    println!(
                        "  author {}  mark {}  held {} msgs from seq {}",
                        s.stream.author, s.mark, s.held_msgs, s.first_held
                    );
                }
            }
        }
    }
    Ok(())
}

/// `mesh publish`.
pub(crate) async fn publish(
    c: &Client,
    topic: &str,
    text: String,
    lines: bool,
    json: bool,
) -> anyhow::Result<()> {
    if lines {
        if text != "-" {
            return Err(UsageError("--lines reads stdin: pass `-` as the text".into()).into());
        }
        let path = format!("/v1/topics/{}/publish/batch", path_segment(topic));
        let mut chunk = Vec::with_capacity(SEND_LINES_CHUNK);
        for line in std::io::stdin().lock().lines() {
            chunk.push(publish_request(line.context("cannot read stdin")?));
            if chunk.len() == SEND_LINES_CHUNK {
                publish_chunk(c, &path, std::mem::take(&mut chunk), json).await?;
            }
        }
        if !chunk.is_empty() {
            publish_chunk(c, &path, chunk, json).await?;
        }
        return Ok(());
    }
    let body = if text == "-" {
        let mut body = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut body)
            .context("cannot read stdin")?;
        body
    } else {
        text
    };
    let path = format!("/v1/topics/{}/publish", path_segment(topic));
    let sent: SendResponse = c.post(&path, &publish_request(body)).await?;
    print_sent(&sent, json)
}

fn publish_request(body: String) -> mesh_api::PublishRequest {
    mesh_api::PublishRequest {
        body,
        encoding: BodyEncoding::Text,
        msg_kind: 0,
    }
}

async fn publish_chunk(
    c: &Client,
    path: &str,
    chunk: Vec<mesh_api::PublishRequest>,
    json: bool,
) -> anyhow::Result<()> {
    let res: BatchResponse = c.post(path, &chunk).await?;
    for sent in &res.sent {
        print_sent(sent, json)?;
    }
    Ok(())
}
