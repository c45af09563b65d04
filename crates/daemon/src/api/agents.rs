//! The agent routes: adding, listing and removing agents (the node's
//! socket), and what an agent does as itself (its socket): send, reply,
//! read and wait on its inbox, keep named cursors; where a message is.
//!
//! An agent's inbox is an index of the journal written in the commits that
//! journal its entries (messages to it, bounces of its messages, lag
//! records of its subscriptions), so a page reads only the agent's entries
//! and a cursor is an ordinary journal cursor. A wait (`wait=SECS`) returns
//! as soon as an entry commits: it wakes on the journal head, never on a
//! timer.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::response::{IntoResponse, Response};
use mesh_api::{
    AddAgentRequest, AgentJson, AgentSendRequest, AgentSendResponse, AgentsResponse, BodyEncoding,
    CursorBody, InboxEntry, InboxPage, MessageStatus, ReplyRequest, StreamJson,
};
use mesh_protocol::{
    AgentCard, AgentEnvelope, AgentName, Bounce, KIND_AGENT, KIND_BOUNCE, MAX_AGENT_CARDS,
    MAX_BATCH_PAYLOAD_BYTES, MsgId, NodeId, StreamId,
};
use mesh_store::{
    AgentRecord, Arrival, CLIENT_ID_BYTES_MAX, InboxItem, InboxKind, JournalRecord, MeshStore,
    MessageDir,
};
use serde::Deserialize;

use super::agent_socket::Acting;
use super::error::node_error;
use super::routes::{cut, parse_json, query, read_body, read_json, read_store};
use super::{
    ApiError, ApiState, Bug, CURSOR_NAME_BYTES_MAX, CallerError, Capacity, EVENTS_LIMIT_DEFAULT,
    EVENTS_LIMIT_MAX, EVENTS_PAGE_BYTES_MAX, NotFound, PeerCred, REQUEST_BYTES_MAX,
    SEND_REQUEST_BYTES_MAX,
};
use crate::agents::now_ms;
use crate::bus::{LocalWrite, Outgoing, SendMeta};

/// The longest `wait` of an inbox read, in seconds.
pub const INBOX_WAIT_SECS_MAX: u64 = 600;

/// Inbox index rows a filtered read (`in_reply_to`) looks at, at most, per
/// request: it answers with what it found and a cursor past what it read.
pub const INBOX_SCAN_ROWS_MAX: usize = 10_000;

/// Journal entries after a message that `GET /v1/messages/{id}` reads, at
/// most, looking for the loss record of a message evicted unacknowledged.
pub const LOSS_SCAN_ENTRIES_MAX: usize = 100_000;

/// An agent's name from a path, checked.
fn agent_name(text: &str) -> Result<AgentName, ApiError> {
    AgentName::new(text).map_err(|e| CallerError::BadValue(e.to_string()).into())
}

impl ApiState {
    /// The agent a send of `name` acts as: only through `name`'s own
    /// socket, by `name` itself ([`Acting`], set by its socket's check).
    fn sender(&self, acting: Option<Extension<Acting>>, name: &str) -> Result<AgentName, ApiError> {
        let name = agent_name(name)?;
        match acting {
            Some(Extension(Acting(a))) if a == name => Ok(name),
            _ => {
                self.inner
                    .counters
                    .refused_agent
                    .fetch_add(1, Ordering::Relaxed);
                Err(CallerError::UnverifiedSender(format!(
                    "agent {name} sends only through its own socket, {}",
                    self.agent_socket_path(&name).display()
                ))
                .into())
            }
        }
    }

    /// The agent whose inbox or cursors `name` names: on its socket, itself
    /// (checked there); on the node's socket, any agent of the node.
    fn reader(&self, name: &str) -> Result<AgentName, ApiError> {
        let name = agent_name(name)?;
        if self.inner.registry.get(&name).is_none() {
            return Err(NotFound::UnknownAgent(name.to_string()).into());
        }
        Ok(name)
    }

    /// `NAME@NODE_ID`.
    fn address(agent: &AgentName, node: &NodeId) -> String {
        format!("{agent}@{node}")
    }

    /// The message an agent send request asks for.
    pub(super) fn agent_message(
        &self,
        from: &AgentName,
        req: AgentSendRequest,
    ) -> Result<(Outgoing, String), ApiError> {
        let (to, agent) = self.resolve_recipient(&req.to)?;
        let in_reply_to = req
            .in_reply_to
            .as_deref()
            .map(|t| t.parse::<MsgId>())
            .transpose()
            .map_err(|e| CallerError::BadValue(e.to_string()))?;
        self.meta_message(
            from,
            to,
            agent,
            in_reply_to,
            req.body,
            req.encoding,
            req.client_id,
        )
    }

    #[allow(clippy::too_many_arguments)] // The fields of one agent send, taken apart.
    fn meta_message(
        &self,
        from: &AgentName,
        to: NodeId,
        agent: Option<AgentName>,
        in_reply_to: Option<MsgId>,
        body: String,
        encoding: BodyEncoding,
        client_id: Option<String>,
    ) -> Result<(Outgoing, String), ApiError> {
        let payload = encoding.decode(body).map_err(CallerError::BadValue)?;
        if payload.len() as u64 > MAX_BATCH_PAYLOAD_BYTES {
            return Err(CallerError::PayloadTooLarge {
                len: payload.len() as u64,
                max: MAX_BATCH_PAYLOAD_BYTES,
            }
            .into());
        }
        check_client_id(client_id.as_deref())?;
        let to_text = match &agent {
            Some(a) => Self::address(a, &to),
            None => to.to_string(),
        };
        let meta = SendMeta {
            from: Some(from.clone()),
            to: agent,
            in_reply_to,
            client_id,
        };
        let msg = Outgoing {
            to,
            kind: 0,
            payload,
            meta: Some(Box::new(meta)),
        };
        Ok((msg, to_text))
    }

    /// The id of the message committed with `receipt` (agent messages).
    pub(super) fn msg_id(&self, stream: &StreamId, seq: u64) -> MsgId {
        let to = stream.recipient().unwrap_or(self.inner.node);
        MsgId::derive(&stream.author, stream.epoch, &to, seq)
    }

    /// Up to `limit` entries of `agent`'s inbox after `after` (answering
    /// `in_reply_to`, if given, and at most [`EVENTS_PAGE_BYTES_MAX`] of
    /// bodies), and the arrival read up to.
    pub(super) async fn read_inbox(
        &self,
        agent: &AgentName,
        after: Arrival,
        limit: usize,
        in_reply_to: Option<MsgId>,
    ) -> Result<(Vec<InboxItem>, Arrival), ApiError> {
        let mut out = Vec::new();
        let mut pos = after;
        let mut scanned = 0usize;
        let mut bytes = 0usize;
        while out.len() < limit && scanned < INBOX_SCAN_ROWS_MAX {
            let want = if in_reply_to.is_some() {
                super::routes::JOURNAL_READ_ENTRIES
            } else {
                (limit - out.len()).min(super::routes::JOURNAL_READ_ENTRIES)
            };
            let a = agent.clone();
            let chunk = read_store(&self.inner.store, move |s| s.inbox(&a, pos, want)).await?;
            if chunk.is_empty() {
                break;
            }
            for item in chunk {
                scanned += 1;
                pos = item.item.arrival;
                if in_reply_to.is_some_and(|id| item.row.in_reply_to != Some(id)) {
                    continue;
                }
                bytes += match &item.item.record {
                    JournalRecord::Envelope { payload, .. } => payload.len(),
                    _ => 0,
                };
                out.push(item);
                if out.len() >= limit || bytes >= EVENTS_PAGE_BYTES_MAX {
                    return Ok((out, pos));
                }
            }
        }
        Ok((out, pos))
    }

    /// The JSON form of an inbox entry.
    pub(super) fn inbox_entry(&self, item: &InboxItem) -> InboxEntry {
        let me = &self.inner.node;
        let arrival = item.item.arrival;
        let cursor = self.cursor_text(arrival);
        let mut e = InboxEntry {
            kind: "other".into(),
            id: None,
            from: None,
            to: None,
            in_reply_to: None,
            body: String::new(),
            encoding: BodyEncoding::Text,
            cursor,
            arrival,
            verified: item.row.verified,
            reason: None,
            created_ms: None,
        };
        match &item.item.record {
            JournalRecord::Envelope {
                stream,
                kind,
                payload,
                created_ms,
                ..
            } => {
                e.created_ms = Some(*created_ms);
                match *kind {
                    KIND_AGENT => match AgentEnvelope::decode(payload) {
                        Ok(m) => {
                            e.kind = "message".into();
                            e.id = Some(m.id.to_string());
                            e.from = Some(Self::address(&m.from, &stream.author));
                            e.to = m.to.as_ref().map(|t| Self::address(t, me));
                            e.in_reply_to = m.in_reply_to.map(|i| i.to_string());
                            let (encoding, body) = BodyEncoding::encode(&m.body);
                            e.encoding = encoding;
                            e.body = body;
                        }
                        Err(err) => {
                            e.body = format!("an agent message that does not decode: {err}")
                        }
                    },
                    KIND_BOUNCE => match Bounce::decode(payload) {
                        Ok(b) => {
                            e.kind = "bounce".into();
                            e.id = Some(b.id.to_string());
                            e.from = Some(stream.author.to_string());
                            e.to = Some(Self::address(&b.to, me));
                            e.reason = Some(b.reason.as_str().to_owned());
                            let missing = b
                                .missing
                                .as_ref()
                                .map_or_else(|| "the recipient".to_owned(), |m| format!("{m}"));
                            e.body = format!(
                                "undeliverable: {}: node {} has no agent {missing}; message {} was not delivered to anyone",
                                b.reason.as_str(),
                                stream.author,
                                b.id
                            );
                        }
                        Err(err) => e.body = format!("a bounce that does not decode: {err}"),
                    },
                    _ => {}
                }
            }
            JournalRecord::Trimmed { .. } => {
                e.kind = "trimmed".into();
                e.body = format!(
                    "journal retention ([journal] max_bytes / max_age) removed arrival {arrival} \
                     before it was read: what it said is gone"
                );
            }
            JournalRecord::SubscriberLagged {
                subscriber,
                from,
                to,
            } => {
                e.kind = "lagged".into();
                let resume = self.cursor_text(from.saturating_sub(1));
                e.body = format!(
                    "{subscriber} stopped reading; journal arrivals {from}..={to} were not delivered to it live: \
                     read the inbox again with after={resume}"
                );
            }
            _ => {}
        }
        if item.row.kind == InboxKind::Lagged {
            e.kind = "lagged".into();
        }
        e
    }
}

/// Checks a client id: 1 to [`CLIENT_ID_BYTES_MAX`] bytes.
pub(super) fn check_client_id(id: Option<&str>) -> Result<(), ApiError> {
    match id {
        Some(t) if t.is_empty() || t.len() > CLIENT_ID_BYTES_MAX => {
            Err(CallerError::BadValue(format!(
                "a client id is 1 to {CLIENT_ID_BYTES_MAX} bytes, not {}",
                t.len()
            ))
            .into())
        }
        _ => Ok(()),
    }
}

/// `POST /v1/agents`: adds an agent, makes its key and serves its socket.
pub(super) async fn add_agent(
    State(st): State<ApiState>,
    cred: Option<Extension<PeerCred>>,
    req: Request,
) -> Result<Json<AgentJson>, ApiError> {
    let body: AddAgentRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let name = agent_name(&body.name)?;
    let daemon_uid = st.inner.daemon_uid;
    let uid = body
        .uid
        .or(cred.and_then(|c| c.0.uid))
        .unwrap_or(daemon_uid);
    let registry = st.inner.registry.clone();
    if registry.get(&name).is_some() {
        return Err(CallerError::AgentExists(name.to_string()).into());
    }
    if registry.len() >= MAX_AGENT_CARDS {
        return Err(Capacity::TooManyAgents(format!(
            "this node hosts {MAX_AGENT_CARDS} agents, as many as it may; remove one first"
        ))
        .into());
    }
    if uid != daemon_uid && uid != 0 && st.inner.agent_sockets_private {
        return Err(CallerError::BadValue(format!(
            "uid {uid} could not reach agent {name}'s socket: it would be in {}, inside the \
             data dir, which only uid {daemon_uid} may enter; set [agents] socket_dir in \
             config.toml to a dir uid {uid} may enter (e.g. /run/agent-mesh) and restart",
            st.inner.agent_socket_dir.display()
        ))
        .into());
    }
    let key = {
        let registry = registry.clone();
        let name = name.clone();
        tokio::task::spawn_blocking(move || registry.key(&name))
            .await
            .map_err(|e| Bug::new(format!("key task failed: {e}")))?
            .map_err(|e| super::Unavailable::Store(e.to_string()))?
    };
    let record = AgentRecord {
        name: name.clone(),
        key: key.public(),
        uid,
        created_ms: now_ms(),
    };
    st.inner
        .bus
        .local_write(LocalWrite::PutAgent(record.clone()))
        .await
        .map_err(node_error)?;
    let agent = registry.insert(record, key);
    let socket = st
        .start_agent_server(&agent)
        .await
        .map_err(|e| super::Unavailable::Node(e.to_string()))?;
    crate::agents::announce(&registry, &st.inner.bus, true).await;
    tracing::info!(agent = %name, uid, socket = %socket.display(), "agent added");
    Ok(Json(AgentJson {
        address: ApiState::address(&name, &st.inner.node),
        name: name.to_string(),
        node: st.inner.node.to_string(),
        node_alias: None,
        key: Some(agent.record.key.to_string()),
        online: false,
        uid: Some(uid),
        socket: Some(socket.display().to_string()),
    }))
}

/// `DELETE /v1/agents/{name}`: stops its socket, removes it (its inbox
/// index, its cursors and its key; its journal entries stay).
pub(super) async fn remove_agent(
    State(st): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let name = st.reader(&name)?;
    st.inner
        .bus
        .local_write(LocalWrite::RemoveAgent(name.clone()))
        .await
        .map_err(node_error)?;
    let registry = st.inner.registry.clone();
    // Its waits and subscriptions end, then its socket goes.
    registry.remove(&name);
    st.stop_agent_server(&name).await;
    let n = name.clone();
    let _ = tokio::task::spawn_blocking(move || registry.forget_key(&n)).await;
    tracing::info!(agent = %name, "agent removed");
    Ok(Json(serde_json::json!({ "removed": name.to_string() })))
}

fn card_json(card: &AgentCard, alias: Option<String>) -> AgentJson {
    AgentJson {
        name: card.name.to_string(),
        address: ApiState::address(&card.name, &card.node),
        node: card.node.to_string(),
        node_alias: alias,
        key: Some(card.key.to_string()),
        online: card.online,
        uid: None,
        socket: None,
    }
}

/// `GET /v1/agents`: this node's agents and those its peers announced.
pub(super) async fn list_agents(
    State(st): State<ApiState>,
) -> Result<Json<AgentsResponse>, ApiError> {
    let status = st.inner.bus.status().await.map_err(node_error)?;
    let local = st
        .inner
        .registry
        .all()
        .iter()
        .map(|a| {
            let name = &a.record.name;
            let online = status
                .agents
                .iter()
                .find(|c| &c.name == name)
                .is_some_and(|c| c.online);
            AgentJson {
                name: name.to_string(),
                address: ApiState::address(name, &st.inner.node),
                node: st.inner.node.to_string(),
                node_alias: None,
                key: Some(a.record.key.to_string()),
                online,
                uid: Some(a.record.uid),
                socket: Some(st.agent_socket_path(name).display().to_string()),
            }
        })
        .collect();
    let peers = status
        .peers
        .iter()
        .flat_map(|p| {
            let alias = st.alias_of(&p.node);
            p.agents
                .iter()
                .map(move |c| card_json(c, alias.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    Ok(Json(AgentsResponse { local, peers }))
}

/// Commits `msg` and answers it as an agent send to `to`.
async fn send_answer(
    st: &ApiState,
    msg: Outgoing,
    to: String,
) -> Result<AgentSendResponse, ApiError> {
    #[cfg(feature = "fault-hooks")]
    let abort_after = msg
        .meta
        .as_ref()
        .and_then(|m| m.client_id.clone())
        .filter(|id| std::env::var("MESH_FAULT_ABORT_AFTER_COMMIT").ok().as_ref() == Some(id));
    let sent = st.submit(vec![msg]).await.answers().await?;
    let Some(r) = sent.first() else {
        return Err(Bug::new("the node answered no receipt for one message").into());
    };
    #[cfg(feature = "fault-hooks")]
    if abort_after.is_some() {
        // Test-only: dies as a crash would, after the commit and before
        // the answer.
        std::process::abort();
    }
    st.inner.counters.agent_sent.fetch_add(1, Ordering::Relaxed);
    Ok(AgentSendResponse {
        id: st.msg_id(&r.stream, r.seq).to_string(),
        to,
        cursor: st.cursor_text(r.arrival),
        stream: StreamJson::from(&r.stream),
        seq: r.seq,
    })
}

/// `POST /v1/agents/{name}/send`, on the agent's socket.
pub(super) async fn send(
    State(st): State<ApiState>,
    acting: Option<Extension<Acting>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<AgentSendResponse>, ApiError> {
    let from = st.sender(acting, &name)?;
    let bytes = read_body(
        req.into_body(),
        SEND_REQUEST_BYTES_MAX,
        "; a message body may be at most 1 MiB",
    )
    .await?;
    let (msg, to) = st.agent_message(&from, parse_json(&bytes)?)?;
    Ok(Json(send_answer(&st, msg, to).await?))
}

/// `POST /v1/agents/{name}/send/batch`, NDJSON of [`AgentSendRequest`]
/// lines, answered as `POST /v1/send/batch` is, each line
/// `{id, cursor, stream, seq}` with the message id.
pub(super) async fn send_batch(
    State(st): State<ApiState>,
    acting: Option<Extension<Acting>>,
    Path(name): Path<String>,
    req: Request,
) -> Response {
    let from = match st.sender(acting, &name) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let parser_st = st.clone();
    let parse = move |line: &[u8]| -> Result<Outgoing, ApiError> {
        let req: AgentSendRequest = parse_json(line)?;
        parser_st.agent_message(&from, req).map(|(m, _)| m)
    };
    let answers = st.answers().with_msg_ids();
    super::ndjson::respond(st.submitter(), answers, req.into_body(), parse).await
}

/// `POST /v1/agents/{name}/reply`: answers a message in the agent's inbox.
pub(super) async fn reply(
    State(st): State<ApiState>,
    acting: Option<Extension<Acting>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<AgentSendResponse>, ApiError> {
    let from = st.sender(acting, &name)?;
    let bytes = read_body(
        req.into_body(),
        SEND_REQUEST_BYTES_MAX,
        "; a reply body may be at most 1 MiB",
    )
    .await?;
    let body: ReplyRequest = parse_json(&bytes)?;
    let id: MsgId = body
        .id
        .parse()
        .map_err(|e: mesh_protocol::AgentError| CallerError::BadValue(e.to_string()))?;
    let row = read_store(&st.inner.store, move |s| s.message(&id))
        .await?
        .ok_or_else(|| NotFound::UnknownMessage(id.to_string()))?;
    let me = st.inner.node;
    let to_me = row.dir == MessageDir::Received || row.stream.recipient() == Some(me);
    if !to_me || row.to.as_ref() != Some(&from) {
        return Err(CallerError::BadValue(format!(
            "message {id} was not sent to agent {from}: an agent replies to messages in its inbox"
        ))
        .into());
    }
    let (msg, to) = st.meta_message(
        &from,
        row.stream.author,
        Some(row.from),
        Some(id),
        body.body,
        body.encoding,
        body.client_id,
    )?;
    Ok(Json(send_answer(&st, msg, to).await?))
}

/// `GET /v1/agents/{name}/inbox` query.
#[derive(Debug, Deserialize)]
pub(super) struct InboxQuery {
    after: Option<String>,
    limit: Option<String>,
    wait: Option<String>,
    in_reply_to: Option<String>,
}

/// `GET /v1/agents/{name}/inbox?after=&limit=&wait=&in_reply_to=`: the
/// agent's entries after `after`; with `wait=SECS`, if there are none yet,
/// the first ones to commit within that time.
pub(super) async fn inbox(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Result<Json<InboxPage>, ApiError> {
    let agent = st.reader(&name)?;
    let q = query(q)?;
    let after = st.parse_after(q.after.as_deref())?;
    let limit = match q.limit.as_deref() {
        None | Some("") => EVENTS_LIMIT_DEFAULT,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=EVENTS_LIMIT_MAX).contains(&n) => n,
            _ => {
                return Err(CallerError::BadValue(format!(
                    "limit must be a number from 1 to {EVENTS_LIMIT_MAX}, not {:?}",
                    cut(text)
                ))
                .into());
            }
        },
    };
    let wait = match q.wait.as_deref() {
        None | Some("") => 0,
        Some(text) => match text.parse::<u64>() {
            Ok(n) if n <= INBOX_WAIT_SECS_MAX => n,
            _ => {
                return Err(CallerError::BadValue(format!(
                    "wait must be a number of seconds from 0 to {INBOX_WAIT_SECS_MAX}, not {:?}",
                    cut(text)
                ))
                .into());
            }
        },
    };
    let in_reply_to = q
        .in_reply_to
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(str::parse::<MsgId>)
        .transpose()
        .map_err(|e| CallerError::BadValue(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
    let mut head = st.inner.head.clone();
    let mut closing = st.inner.closing.subscribe();
    let mut removed = match st.inner.registry.get(&agent) {
        Some(a) => a.removed(),
        None => return Err(NotFound::UnknownAgent(agent.to_string()).into()),
    };
    let mut pos = after;
    let counters = &st.inner.counters;
    let mut waiting = None;
    let (items, read_to) = loop {
        // Marked seen before the read: an entry committed after it wakes the wait.
        head.borrow_and_update();
        let (items, read_to) = st.read_inbox(&agent, pos, limit, in_reply_to).await?;
        if !items.is_empty() || wait == 0 {
            break (items, read_to);
        }
        pos = read_to;
        if waiting.is_none() {
            waiting = Some(Waiting::new(&counters.inbox_waits));
        }
        tokio::select! {
            changed = head.changed() => if changed.is_err() { break (items, read_to) },
            () = tokio::time::sleep_until(deadline) => break (items, read_to),
            _ = closing.wait_for(|c| *c) => break (items, read_to),
            _ = removed.wait_for(|r| *r) => break (items, read_to),
        }
    };
    let next = if in_reply_to.is_some() {
        read_to
    } else {
        items.last().map_or(after, |i| i.item.arrival)
    };
    Ok(Json(InboxPage {
        entries: items.iter().map(|i| st.inbox_entry(i)).collect(),
        next: st.cursor_text(next),
    }))
}

/// Counts an inbox read that waits, while it waits.
struct Waiting<'a>(&'a std::sync::atomic::AtomicU64);

impl<'a> Waiting<'a> {
    fn new(gauge: &'a std::sync::atomic::AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Checks a cursor name: 1 to 64 bytes of `[A-Za-z0-9._-]`.
fn check_cursor_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= CURSOR_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(CallerError::BadValue(format!(
            "bad cursor name {:?}: use 1 to {CURSOR_NAME_BYTES_MAX} characters of A-Z a-z 0-9 . _ -",
            cut(name)
        ))
        .into())
    }
}

/// `PUT /v1/agents/{name}/cursors/{cursor}`.
pub(super) async fn put_cursor(
    State(st): State<ApiState>,
    Path((name, cursor)): Path<(String, String)>,
    req: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let agent = st.reader(&name)?;
    check_cursor_name(&cursor)?;
    let body: CursorBody = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let arrival = st.parse_after(Some(&body.cursor))?;
    let head = read_store(&st.inner.store, |s| s.journal_head()).await?;
    if arrival > head {
        return Err(CallerError::CursorPastHead { arrival, head }.into());
    }
    st.inner
        .bus
        .local_write(LocalWrite::PutAgentCursor {
            agent,
            name: cursor.clone(),
            arrival,
        })
        .await
        .map_err(node_error)?;
    Ok(Json(
        serde_json::json!({ "name": cursor, "cursor": st.cursor_text(arrival) }),
    ))
}

/// `GET /v1/agents/{name}/cursors/{cursor}`.
pub(super) async fn get_cursor(
    State(st): State<ApiState>,
    Path((name, cursor)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let agent = st.reader(&name)?;
    check_cursor_name(&cursor)?;
    let key = cursor.clone();
    match read_store(&st.inner.store, move |s| s.agent_cursor(&agent, &key)).await? {
        Some(arrival) => Ok(Json(
            serde_json::json!({ "name": cursor, "cursor": st.cursor_text(arrival) }),
        )),
        None => Err(NotFound::UnknownCursor(cursor).into()),
    }
}

/// `GET /v1/messages/{id}`: where the message is.
pub(super) async fn message(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<MessageStatus>, ApiError> {
    let id: MsgId = id
        .parse()
        .map_err(|e: mesh_protocol::AgentError| CallerError::BadValue(e.to_string()))?;
    let row = read_store(&st.inner.store, move |s| s.message(&id))
        .await?
        .ok_or_else(|| NotFound::UnknownMessage(id.to_string()))?;
    let me = st.inner.node;
    let recipient = row.stream.recipient().unwrap_or(me);
    let to = match &row.to {
        Some(a) => ApiState::address(a, &recipient),
        None => recipient.to_string(),
    };
    let (state, detail) = match (row.dir, row.undelivered) {
        (MessageDir::Received, Some(reason)) => (
            "undeliverable",
            format!(
                "received here for an agent this node does not host ({}); it was bounced to its sender",
                reason.as_str()
            ),
        ),
        (MessageDir::Received, None) => ("received", "received here".to_owned()),
        (MessageDir::Sent, Some(reason)) => (
            "bounced",
            format!(
                "the recipient node has no such agent ({}); it was delivered to no one",
                reason.as_str()
            ),
        ),
        (MessageDir::Sent, None) if recipient == me => {
            ("delivered", "delivered to an agent of this node".to_owned())
        }
        (MessageDir::Sent, None) => sent_state(&st, &row).await?,
    };
    Ok(Json(MessageStatus {
        id: id.to_string(),
        state: state.to_owned(),
        from: ApiState::address(&row.from, &row.stream.author),
        to,
        in_reply_to: row.in_reply_to.map(|i| i.to_string()),
        cursor: st.cursor_text(row.arrival),
        stream: StreamJson::from(&row.stream),
        seq: row.seq,
        detail,
    }))
}

/// Where a message this node sent is: acknowledged by its recipient node
/// (delivered), still in the outbox (queued), or given up (lost, with the
/// loss record).
async fn sent_state(
    st: &ApiState,
    row: &mesh_store::MessageRow,
) -> Result<(&'static str, String), ApiError> {
    let status = st.inner.bus.status().await.map_err(node_error)?;
    let recipient = row.stream.recipient();
    let own = status
        .peers
        .iter()
        .find(|p| Some(p.node) == recipient)
        .and_then(|p| p.own_stream.clone())
        .filter(|o| o.stream == row.stream);
    let Some(own) = own else {
        // The stream of an older epoch of this node, or of a removed peer.
        return Ok((
            "queued",
            "the recipient node is not a peer now, or the stream is of an earlier store of this node"
                .to_owned(),
        ));
    };
    if row.seq <= own.last_acked {
        return Ok((
            "delivered",
            "committed at the recipient node (it acknowledged it)".to_owned(),
        ));
    }
    if row.seq >= own.first_retained {
        return Ok((
            "queued",
            "committed here, in the outbox; the recipient node has not acknowledged it yet"
                .to_owned(),
        ));
    }
    // Evicted unacknowledged: find its loss record after it in the journal.
    let stream = row.stream.clone();
    let seq = row.seq;
    let mut pos = row.arrival;
    let mut read = 0usize;
    while read < LOSS_SCAN_ENTRIES_MAX {
        let chunk = st
            .journal_page(
                pos,
                super::routes::JOURNAL_READ_ENTRIES,
                super::routes::JOURNAL_READ_BYTES,
            )
            .await?;
        if chunk.is_empty() {
            break;
        }
        for item in chunk {
            read += 1;
            pos = item.arrival;
            if let JournalRecord::Loss {
                stream: s,
                from,
                to,
                detail,
                ..
            } = &item.record
                && *s == stream
                && (*from..=*to).contains(&seq)
            {
                return Ok((
                    "lost",
                    format!(
                        "given up before the recipient node had it: {detail} (loss record {})",
                        st.cursor_text(item.arrival)
                    ),
                ));
            }
        }
    }
    Ok((
        "lost",
        "evicted from the outbox before the recipient node acknowledged it".to_owned(),
    ))
}

impl super::send::Answers {
    /// Answers that carry each message's id (agent sends).
    pub(super) fn with_msg_ids(mut self) -> Self {
        self.msg_ids = true;
        self
    }
}
