//! An agent's inbox: reading and waiting on its entries, their JSON form,
//! and the named cursors kept on it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use mesh_api::{BodyEncoding, InboxEntry, InboxPage, LocalAgentStatus, UNREAD_COUNT_MAX, Unread};
use mesh_protocol::{
    AgentEnvelope, AgentName, Bounce, Forward, ForwardTrimmed, KIND_AGENT, KIND_BOUNCE,
    KIND_FORWARD, KIND_FORWARD_TRIMMED, KIND_READ_RECEIPT, KIND_TOMBSTONE, MsgId, NodeId,
    Tombstone, TombstoneReason,
};
use mesh_store::{Arrival, InboxItem, InboxKind, JournalRecord, MeshStore};
use serde::Deserialize;

use crate::api::error::node_error;
use crate::api::routes::{check_cursor_name, cursor_json, cursor_to_put, cut, query, read_store};
use crate::api::{
    ApiError, ApiState, CallerError, EVENTS_LIMIT_DEFAULT, EVENTS_LIMIT_MAX, EVENTS_PAGE_BYTES_MAX,
    NotFound,
};
use crate::bus::LocalWrite;

/// The longest `wait` of an inbox read, in seconds.
pub const INBOX_WAIT_SECS_MAX: u64 = 600;

/// Inbox index rows a filtered read (`in_reply_to`) looks at, at most, per
/// request: it answers with what it found and a cursor past what it read.
pub const INBOX_SCAN_ROWS_MAX: usize = 10_000;

impl ApiState {
    /// Up to `limit` entries of `agent`'s inbox after `after` (answering
    /// `in_reply_to`, if given, and at most [`EVENTS_PAGE_BYTES_MAX`] of
    /// bodies), and the arrival read up to.
    pub(crate) async fn read_inbox(
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
                crate::api::routes::JOURNAL_READ_ENTRIES
            } else {
                (limit - out.len()).min(crate::api::routes::JOURNAL_READ_ENTRIES)
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

    /// Notes that the inbox entry at `arrival` was handed to `agent` (an
    /// unfiltered page, or its subscription), and writes how far that went
    /// to the store in the background ([`crate::drain::SERVED_CURSOR`]):
    /// one write at a time per agent, the last value wins. A write lost to
    /// a crash leaves the cursor behind, so a later move passes on more,
    /// never less.
    pub(crate) fn note_served(&self, agent: &AgentName, arrival: Arrival) {
        let Some(a) = self.inner.registry.get(agent) else {
            return;
        };
        // SeqCst with the writer's reset below: a note is never lost between them.
        if a.served.fetch_max(arrival, Ordering::SeqCst) >= arrival
            || a.served_writing.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let st = self.clone();
        let name = agent.clone();
        tokio::spawn(async move {
            let mut written = 0;
            loop {
                let want = a.served.load(Ordering::SeqCst);
                if want > written {
                    if let Err(e) = st.put_served(&name, want).await {
                        tracing::debug!(agent = %name, "the served cursor is not written: {e}");
                        a.served_writing.store(false, Ordering::SeqCst);
                        return;
                    }
                    written = want;
                    continue;
                }
                a.served_writing.store(false, Ordering::SeqCst);
                // A note between the load and the store above finds the
                // flag still set: look once more.
                if a.served.load(Ordering::SeqCst) <= written
                    || a.served_writing.swap(true, Ordering::SeqCst)
                {
                    return;
                }
            }
        });
    }

    /// Writes `agent`'s served cursor: at least `arrival`, never back (a
    /// daemon restarted counts from 0 again in memory; every write of it
    /// goes through here, one at a time).
    pub(crate) async fn put_served(
        &self,
        agent: &AgentName,
        arrival: Arrival,
    ) -> Result<(), ApiError> {
        let _one = self.inner.served_writes.lock().await;
        let stored = self.stored_served(agent).await?;
        if stored >= arrival {
            return Ok(());
        }
        self.put_agent_cursor(agent, crate::drain::SERVED_CURSOR, arrival)
            .await
    }

    /// `agent`'s read position: the last inbox entry it acknowledged (0:
    /// none yet).
    pub(crate) async fn read_position(&self, agent: &AgentName) -> Result<Arrival, ApiError> {
        let a = agent.clone();
        Ok(read_store(&self.inner.store, move |s| {
            s.agent_cursor(&a, crate::drain::READ_CURSOR)
        })
        .await?
        .unwrap_or(0))
    }

    /// `agent`'s unread mail: its inbox entries after its read position,
    /// counted in one inbox read of at most [`UNREAD_COUNT_MAX`]` + 1`.
    pub(crate) async fn unread(&self, agent: &AgentName) -> Result<Unread, ApiError> {
        let after = self.read_position(agent).await?;
        let a = agent.clone();
        let max = usize::try_from(UNREAD_COUNT_MAX).unwrap_or(usize::MAX);
        let items = read_store(&self.inner.store, move |s| s.inbox(&a, after, max + 1)).await?;
        let oldest_ms = items.first().and_then(|i| match i.item.record {
            JournalRecord::Envelope { created_ms, .. } => Some(created_ms),
            _ => None,
        });
        Ok(Unread {
            count: items.len().min(max) as u64,
            more: items.len() > max,
            oldest_ms,
        })
    }

    /// This node's agents and their unread mail, `online` saying which are
    /// using the node now.
    pub(crate) async fn local_agents(
        &self,
        online: impl Fn(&AgentName) -> bool,
    ) -> Result<Vec<LocalAgentStatus>, ApiError> {
        let mut out = Vec::new();
        for a in self.inner.registry.all().iter() {
            let name = &a.record.name;
            out.push(LocalAgentStatus {
                name: name.to_string(),
                online: online(name),
                unread: self.unread(name).await?,
            });
        }
        Ok(out)
    }

    /// Moves `agent`'s read position to `arrival` if that is past it (an
    /// ack before it is a no-op, never a jump back); the position after.
    /// An `arrival` past it must be an entry of `agent`'s own inbox: a
    /// cursor of another agent's inbox would mark this one's entries before
    /// it read. Writes go one at a time, as the served cursor's do.
    pub(crate) async fn ack_read(
        &self,
        agent: &AgentName,
        arrival: Arrival,
    ) -> Result<Arrival, ApiError> {
        let _one = self.inner.served_writes.lock().await;
        let stored = self.read_position(agent).await?;
        if stored >= arrival {
            return Ok(stored);
        }
        let a = agent.clone();
        let next = read_store(&self.inner.store, move |s| {
            s.inbox(&a, arrival.saturating_sub(1), 1)
        })
        .await?;
        if next.first().is_none_or(|i| i.item.arrival != arrival) {
            return Err(CallerError::CursorNotInInbox {
                agent: agent.to_string(),
                arrival,
            }
            .into());
        }
        self.put_agent_cursor(agent, crate::drain::READ_CURSOR, arrival)
            .await?;
        // Committed: the receipt pump may now receipt what this ack passed.
        self.inner.registry.acked.notify_one();
        Ok(arrival)
    }

    /// `agent`'s served cursor as the store has it (0: none).
    async fn stored_served(&self, agent: &AgentName) -> Result<Arrival, ApiError> {
        let a = agent.clone();
        Ok(read_store(&self.inner.store, move |s| {
            s.agent_cursor(&a, crate::drain::SERVED_CURSOR)
        })
        .await?
        .unwrap_or(0))
    }

    /// Writes every agent's served cursor that this run of the daemon
    /// moved and has not written yet (the server is stopping: after this,
    /// a restart knows what each agent saw).
    pub(crate) async fn flush_served(&self) {
        for a in self.inner.registry.all() {
            let served = a.served.load(Ordering::SeqCst);
            if served == 0 {
                continue;
            }
            if let Err(e) = self.put_served(&a.record.name, served).await {
                tracing::warn!(agent = %a.record.name, "the served cursor is not written: {e}");
            }
        }
    }

    /// How far this node handed `agent` its inbox: the larger of the
    /// stored served cursor and what this run of the daemon handed it.
    pub(crate) async fn served_cursor(&self, agent: &AgentName) -> Result<Arrival, ApiError> {
        let stored = self.stored_served(agent).await?;
        let here = self
            .inner
            .registry
            .get(agent)
            .map_or(0, |a| a.served.load(Ordering::SeqCst));
        Ok(stored.max(here))
    }

    /// The JSON form of an inbox entry.
    pub(crate) fn inbox_entry(&self, item: &InboxItem) -> InboxEntry {
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
            superseded_by: None,
            forwarded_by: None,
            ids: None,
            read_ms: None,
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
                    KIND_AGENT => Self::fill_message(&mut e, &stream.author, me, payload),
                    KIND_BOUNCE => Self::fill_bounce(&mut e, &stream.author, me, payload),
                    KIND_TOMBSTONE => Self::fill_tombstone(&mut e, &stream.author, me, payload),
                    KIND_READ_RECEIPT => Self::fill_read(&mut e, &stream.author, me, payload),
                    KIND_FORWARD => match Forward::decode(payload) {
                        Ok(f) => {
                            Self::fill_message(&mut e, &f.author, me, &f.envelope);
                            e.forwarded_by = Some(stream.author.to_string());
                        }
                        Err(err) => e.body = format!("a forward that does not decode: {err}"),
                    },
                    KIND_FORWARD_TRIMMED => {
                        e.forwarded_by = Some(stream.author.to_string());
                        match ForwardTrimmed::decode(payload) {
                            Ok(t) => Self::fill_forward_trimmed(&mut e, &stream.author, &t),
                            Err(err) => {
                                e.body = format!("a trimmed forward that does not decode: {err}");
                            }
                        }
                    }
                    _ => {}
                }
            }
            JournalRecord::Loss {
                stream: lost_on,
                from,
                to,
                reason,
                detail,
            } => {
                e.kind = "lost".into();
                e.to = lost_on.recipient().map(|n| n.to_string());
                e.reason = Some(crate::api::json::loss_reason_name(*reason).to_owned());
                let recipient = e.to.as_deref().unwrap_or("its recipient");
                e.body = format!(
                    "messages at seqs {from}..={to} of this node's stream to {recipient}, \
                     yours among them, were given up before {recipient} had them ({detail}); \
                     `mesh message ID` says which of yours"
                );
            }
            JournalRecord::Trimmed { from, to } => {
                e.kind = "trimmed".into();
                let what = if from == to {
                    format!("arrival {to}")
                } else {
                    format!("arrivals {from}..={to}, entries of this inbox among them,")
                };
                e.body = format!(
                    "journal retention ([journal] max_bytes / max_age) removed {what} \
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

    /// Fills `e` from an agent message `payload` written by `author`, read
    /// on node `me` (or says in its body that it does not decode).
    fn fill_message(e: &mut InboxEntry, author: &NodeId, me: &NodeId, payload: &[u8]) {
        match AgentEnvelope::decode(payload) {
            Ok(m) => {
                e.kind = "message".into();
                e.id = Some(m.id.to_string());
                e.from = Some(Self::address(&m.from, author));
                e.to = m.to.as_ref().map(|t| Self::address(t, me));
                e.in_reply_to = m.in_reply_to.map(|i| i.to_string());
                let (encoding, body) = BodyEncoding::encode(&m.body);
                e.encoding = encoding;
                e.body = body;
            }
            Err(err) => e.body = format!("an agent message that does not decode: {err}"),
        }
    }

    /// Fills `e` from a read receipt `payload` sent by node `author`, read
    /// on node `me` (or says in its body that it does not decode).
    fn fill_read(e: &mut InboxEntry, author: &NodeId, me: &NodeId, payload: &[u8]) {
        match mesh_protocol::ReadReceipt::decode(payload) {
            Ok(r) => {
                e.kind = "read".into();
                let reader = Self::address(&r.reader, author);
                e.from = Some(reader.clone());
                e.to = Some(Self::address(&r.to, me));
                e.read_ms = Some(r.read_ms);
                e.body = format!(
                    "{reader} read {} of your messages (its read receipt); `mesh message ID` says read",
                    r.ids.len()
                );
                e.ids = Some(r.ids.iter().map(ToString::to_string).collect());
            }
            Err(err) => e.body = format!("a read receipt that does not decode: {err}"),
        }
    }

    /// Fills `e` from a trimmed forward `t` passed on by `by`, the node the
    /// agent moved away from.
    fn fill_forward_trimmed(e: &mut InboxEntry, by: &NodeId, t: &ForwardTrimmed) {
        e.kind = "trimmed".into();
        let what = if t.from == t.to {
            format!("arrival {}", t.to)
        } else {
            format!("arrivals {}..={}", t.from, t.to)
        };
        e.body = format!(
            "journal retention at {by}, the node this agent moved away from, removed {what} \
             of its journal, entries of this agent's inbox there among them, before they were \
             passed on here: what they said is gone (their senders were told they were delivered)"
        );
    }

    /// Fills `e` from a tombstone `payload` written by `author`, read on
    /// node `me` (or says in its body that it does not decode).
    fn fill_tombstone(e: &mut InboxEntry, author: &NodeId, me: &NodeId, payload: &[u8]) {
        match Tombstone::decode(payload) {
            Ok(t) => {
                e.kind = "superseded".into();
                e.id = Some(t.id.to_string());
                e.from = Some(Self::address(&t.from, author));
                e.to = t.to.as_ref().map(|a| Self::address(a, me));
                e.body = match t.reason {
                    TombstoneReason::Superseded { by } => {
                        e.superseded_by = Some(by.to_string());
                        format!(
                            "superseded: message {} (key {:?}) was replaced by {by} before it was sent",
                            t.id,
                            t.key.as_str()
                        )
                    }
                    _ => format!("message {} was replaced before it was sent", t.id),
                };
            }
            Err(err) => e.body = format!("a tombstone that does not decode: {err}"),
        }
    }

    /// Fills `e` from a bounce `payload` sent by node `author`, read on node
    /// `me` (or says in its body that it does not decode).
    fn fill_bounce(e: &mut InboxEntry, author: &NodeId, me: &NodeId, payload: &[u8]) {
        match Bounce::decode(payload) {
            Ok(b) => {
                e.kind = "bounce".into();
                e.id = Some(b.id.to_string());
                e.from = Some(author.to_string());
                e.to = Some(Self::address(&b.to, me));
                e.reason = Some(b.reason.as_str().to_owned());
                let missing = b
                    .missing
                    .as_ref()
                    .map_or_else(|| "the recipient".to_owned(), |m| format!("{m}"));
                e.body = format!(
                    "undeliverable: {}: node {} has no agent {missing}; message {} was not delivered to anyone",
                    b.reason.as_str(),
                    author,
                    b.id
                );
            }
            Err(err) => e.body = format!("a bounce that does not decode: {err}"),
        }
    }
}

/// `GET /v1/agents/{name}/inbox` query.
#[derive(Debug, Deserialize)]
pub(crate) struct InboxQuery {
    after: Option<String>,
    limit: Option<String>,
    wait: Option<String>,
    in_reply_to: Option<String>,
    unread: Option<String>,
}

/// `GET /v1/agents/{name}/inbox?after=&limit=&wait=&in_reply_to=&unread=`:
/// the agent's entries after `after` (with `unread=true`, after its read
/// position instead; reading does not move it); with `wait=SECS`, if there
/// are none yet, the first ones to commit within that time.
pub(crate) async fn inbox(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    q: Result<Query<InboxQuery>, QueryRejection>,
) -> Result<Json<InboxPage>, ApiError> {
    let agent = st.reader(&name)?;
    let q = query(q)?;
    let after = if inbox_unread(q.unread.as_deref())? {
        if q.after.as_deref().is_some_and(|a| !a.is_empty()) {
            return Err(CallerError::BadValue(
                "give after or unread=true, not both: unread reads after the agent's read position"
                    .into(),
            )
            .into());
        }
        st.read_position(&agent).await?
    } else {
        st.parse_after(q.after.as_deref())?
    };
    let limit = inbox_limit(q.limit.as_deref())?;
    let wait = inbox_wait_secs(q.wait.as_deref())?;
    let in_reply_to = q
        .in_reply_to
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(str::parse::<MsgId>)
        .transpose()
        .map_err(|e| CallerError::BadValue(e.to_string()))?;
    let (items, read_to) = st
        .read_inbox_or_wait(&agent, after, limit, in_reply_to, wait)
        .await?;
    let next = if in_reply_to.is_some() {
        read_to
    } else {
        items.last().map_or(after, |i| i.item.arrival)
    };
    // What a filtered read skips over was not handed to the agent.
    if let (None, Some(last)) = (in_reply_to, items.last()) {
        st.note_served(&agent, last.item.arrival);
    }
    Ok(Json(InboxPage {
        entries: items.iter().map(|i| st.inbox_entry(i)).collect(),
        next: st.cursor_text(next),
    }))
}

/// Whether an inbox read is of the unread entries: `unread=true`/`1`
/// (`false`, `0` or absent: not).
///
/// # Errors
/// [`CallerError::BadValue`] for any other value.
fn inbox_unread(text: Option<&str>) -> Result<bool, ApiError> {
    match text {
        None | Some("" | "false" | "0") => Ok(false),
        Some("true" | "1") => Ok(true),
        Some(text) => Err(CallerError::BadValue(format!(
            "unread must be true or false, not {:?}",
            cut(text)
        ))
        .into()),
    }
}

/// `POST /v1/agents/{name}/ack` `{cursor}`: the agent has read its inbox up
/// to `cursor` (an entry's cursor or a page's `next`). Its read position
/// moves there, or stays if it is already at or past it. A cursor of
/// another node or epoch, a malformed one or one past the journal head is
/// refused and changes nothing. Answers `{cursor}`: the read position after.
pub(crate) async fn ack(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let agent = st.reader(&name)?;
    let acked = async {
        let arrival = cursor_to_put(&st, req).await?;
        st.ack_read(&agent, arrival).await
    };
    match acked.await {
        Ok(now) => Ok(Json(serde_json::json!({ "cursor": st.cursor_text(now) }))),
        Err(e) => {
            if matches!(e.kind(), crate::api::ErrorKind::Caller(_)) {
                st.inner
                    .counters
                    .acks_refused
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e)
        }
    }
}

/// The `limit` of an inbox read: [`EVENTS_LIMIT_DEFAULT`] if not given.
///
/// # Errors
/// [`CallerError::BadValue`] if it is not a number from 1 to
/// [`EVENTS_LIMIT_MAX`].
fn inbox_limit(text: Option<&str>) -> Result<usize, ApiError> {
    match text {
        None | Some("") => Ok(EVENTS_LIMIT_DEFAULT),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=EVENTS_LIMIT_MAX).contains(&n) => Ok(n),
            _ => Err(CallerError::BadValue(format!(
                "limit must be a number from 1 to {EVENTS_LIMIT_MAX}, not {:?}",
                cut(text)
            ))
            .into()),
        },
    }
}

/// The `wait` of an inbox read, in seconds: 0 (do not wait) if not given.
///
/// # Errors
/// [`CallerError::BadValue`] if it is not a number from 0 to
/// [`INBOX_WAIT_SECS_MAX`].
fn inbox_wait_secs(text: Option<&str>) -> Result<u64, ApiError> {
    match text {
        None | Some("") => Ok(0),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if n <= INBOX_WAIT_SECS_MAX => Ok(n),
            _ => Err(CallerError::BadValue(format!(
                "wait must be a number of seconds from 0 to {INBOX_WAIT_SECS_MAX}, not {:?}",
                cut(text)
            ))
            .into()),
        },
    }
}

impl ApiState {
    /// [`ApiState::read_inbox`], and if that finds nothing and `wait` is not
    /// 0, reads again as entries commit until one is found, `wait` seconds
    /// pass, the API closes or the agent is removed.
    ///
    /// # Errors
    /// [`NotFound::UnknownAgent`] if `agent` is not hosted here; a store
    /// read's error.
    async fn read_inbox_or_wait(
        &self,
        agent: &AgentName,
        after: Arrival,
        limit: usize,
        in_reply_to: Option<MsgId>,
        wait: u64,
    ) -> Result<(Vec<InboxItem>, Arrival), ApiError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
        let mut head = self.inner.head.clone();
        let mut closing = self.inner.closing.subscribe();
        let mut removed = match self.inner.registry.get(agent) {
            Some(a) => a.removed(),
            None => return Err(NotFound::UnknownAgent(agent.to_string()).into()),
        };
        let mut pos = after;
        let counters = &self.inner.counters;
        let mut waiting = None;
        loop {
            // Marked seen before the read: an entry committed after it wakes the wait.
            head.borrow_and_update();
            let (items, read_to) = self.read_inbox(agent, pos, limit, in_reply_to).await?;
            if !items.is_empty() || wait == 0 {
                return Ok((items, read_to));
            }
            pos = read_to;
            if waiting.is_none() {
                waiting = Some(Waiting::new(&counters.inbox_waits));
            }
            tokio::select! {
                changed = head.changed() => if changed.is_err() { return Ok((items, read_to)) },
                () = tokio::time::sleep_until(deadline) => return Ok((items, read_to)),
                _ = closing.wait_for(|c| *c) => return Ok((items, read_to)),
                _ = removed.wait_for(|r| *r) => return Ok((items, read_to)),
            }
        }
    }
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

/// `PUT /v1/agents/{name}/cursors/{cursor}`.
pub(crate) async fn put_cursor(
    State(st): State<ApiState>,
    Path((name, cursor)): Path<(String, String)>,
    req: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let agent = st.reader(&name)?;
    check_cursor_name(&cursor)?;
    let arrival = cursor_to_put(&st, req).await?;
    st.inner
        .bus
        .local_write(LocalWrite::PutAgentCursor {
            agent,
            name: cursor.clone(),
            arrival,
        })
        .await
        .map_err(node_error)?;
    Ok(cursor_json(&st, cursor, arrival))
}

/// `GET /v1/agents/{name}/cursors/{cursor}`.
pub(crate) async fn get_cursor(
    State(st): State<ApiState>,
    Path((name, cursor)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let agent = st.reader(&name)?;
    check_cursor_name(&cursor)?;
    let key = cursor.clone();
    match read_store(&st.inner.store, move |s| s.agent_cursor(&agent, &key)).await? {
        Some(arrival) => Ok(cursor_json(&st, cursor, arrival)),
        None => Err(NotFound::UnknownCursor(cursor).into()),
    }
}
