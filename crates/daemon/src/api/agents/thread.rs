//! A message's thread as one agent holds it (`GET
//! /v1/agents/{name}/thread/{id}`): what it answers, up the `in_reply_to`
//! chain, and every reply to it and to its replies that the agent received
//! or sent on this node.
//!
//! What it answers is found through the message index (`messages-v1`, by
//! id). Replies are found by scanning forward from the message: the
//! agent's inbox index for the ones it received (its rows carry
//! `in_reply_to`), and the journal for the ones it sent, since nothing
//! indexes an agent's sent messages by what they answer. Both scans are
//! bounded ([`THREAD_SCAN_ROWS_MAX`] rows each) and the answer says when
//! one stopped before the journal's head.
//!
//! A reply is journaled here after what it answers (it can only be written,
//! or arrive, once that message is committed), so one pass in arrival order
//! finds replies to replies. A message passed on from the host an agent
//! moved away from is journaled when it is passed on; a reply to it that
//! came straight, earlier, is not shown under it.

use std::collections::{HashMap, HashSet};

use axum::Json;
use axum::extract::{Path, State};
use mesh_api::{BodyEncoding, ThreadEntry, ThreadResponse};

use mesh_protocol::{
    AgentEnvelope, AgentHeader, AgentName, Forward, KIND_AGENT, KIND_FORWARD, KIND_TOMBSTONE,
    MsgId, NodeId,
};
use mesh_store::{Arrival, InboxKind, JournalRecord, MeshStore, MessageDir, MessageRow};

use super::status::{message_row, state_name};
use crate::api::error::node_error;
use crate::api::routes::{JOURNAL_READ_BYTES, JOURNAL_READ_ENTRIES, read_store};
use crate::api::{ApiError, ApiState, NotFound};
use crate::bus::NodeStatus;

/// The most messages a thread answer holds.
pub const THREAD_ENTRIES_MAX: usize = 1000;

/// Body bytes after which a thread answer is cut (after the message that
/// crosses them; the first is always given).
pub const THREAD_BODY_BYTES_MAX: usize = 4 << 20;

/// The most messages a thread follows up from the one asked about (its
/// `in_reply_to` chain).
pub const THREAD_ANCESTORS_MAX: usize = 100;

/// Rows a thread read scans for replies, at most, in each of the agent's
/// inbox index and the journal.
pub const THREAD_SCAN_ROWS_MAX: usize = 100_000;

/// Whether an agent sent a message or received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Sent,
    Received,
}

/// A reply found by a scan: its place, its id and what it answers.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    arrival: Arrival,
    id: MsgId,
    parent: MsgId,
    dir: Dir,
}

/// A message of the thread, before its body is read.
struct Member {
    id: MsgId,
    row: MessageRow,
    dir: Dir,
    depth: u32,
}

impl ApiState {
    /// Whether `agent` sent the message of `row` from this node or has it
    /// in its inbox here (`None`: neither).
    fn dir_of(&self, agent: &AgentName, row: &MessageRow) -> Option<Dir> {
        let me = self.inner.node;
        if row.dir == MessageDir::Sent && row.stream.author == me && &row.from == agent {
            return Some(Dir::Sent);
        }
        let to_me = match row.dir {
            MessageDir::Received => row.undelivered.is_none(),
            MessageDir::Sent => row.stream.recipient() == Some(me),
        };
        (to_me && row.to.as_ref() == Some(agent)).then_some(Dir::Received)
    }

    /// The replies to `root` (journaled at `from`) and to its replies that
    /// `agent` received or sent, in arrival order, at most `limit`; and
    /// why the search stopped short, if it did.
    async fn thread_replies(
        &self,
        agent: &AgentName,
        root: MsgId,
        from: Arrival,
        limit: usize,
    ) -> Result<(Vec<Candidate>, Option<String>), ApiError> {
        let (mut found, mut cut) = self.received_replies(agent, from).await?;
        let (sent, sent_cut) = self.sent_replies(agent, from).await?;
        found.extend(sent);
        cut = cut.or(sent_cut);
        found.sort_by_key(|c| c.arrival);
        let mut held = HashSet::from([root]);
        let mut out = Vec::new();
        for c in found {
            if !held.contains(&c.parent) || !held.insert(c.id) {
                continue;
            }
            if out.len() == limit {
                cut = Some(format!(
                    "the thread has more than {THREAD_ENTRIES_MAX} messages: the first are shown"
                ));
                break;
            }
            out.push(c);
        }
        Ok((out, cut))
    }

    /// The messages in `agent`'s inbox after `from` that answer another
    /// (within [`THREAD_SCAN_ROWS_MAX`] inbox rows).
    async fn received_replies(
        &self,
        agent: &AgentName,
        from: Arrival,
    ) -> Result<(Vec<Candidate>, Option<String>), ApiError> {
        let mut out = Vec::new();
        let mut pos = from;
        let mut scanned = 0usize;
        loop {
            if scanned >= THREAD_SCAN_ROWS_MAX {
                let why = format!(
                    "the search for replies in the inbox stopped after {THREAD_SCAN_ROWS_MAX} \
                     entries, at {}: later replies are not shown",
                    self.cursor_text(pos)
                );
                return Ok((out, Some(why)));
            }
            let a = agent.clone();
            let chunk = read_store(&self.inner.store, move |s| {
                s.inbox(&a, pos, JOURNAL_READ_ENTRIES)
            })
            .await?;
            if chunk.is_empty() {
                return Ok((out, None));
            }
            for item in chunk {
                scanned += 1;
                pos = item.item.arrival;
                let Some(parent) = item.row.in_reply_to else {
                    continue;
                };
                if item.row.kind != InboxKind::Message {
                    continue;
                }
                if let JournalRecord::Envelope { kind, payload, .. } = &item.item.record
                    && let Some(id) = message_id(*kind, payload)
                {
                    out.push(Candidate {
                        arrival: pos,
                        id,
                        parent,
                        dir: Dir::Received,
                    });
                }
            }
        }
    }

    /// The messages `agent` sent from this node, journaled after `from`,
    /// that answer another (within [`THREAD_SCAN_ROWS_MAX`] journal
    /// entries: no index holds an agent's sent messages, so this reads the
    /// journal).
    async fn sent_replies(
        &self,
        agent: &AgentName,
        from: Arrival,
    ) -> Result<(Vec<Candidate>, Option<String>), ApiError> {
        let me = self.inner.node;
        let mut out = Vec::new();
        let mut pos = from;
        let mut scanned = 0usize;
        loop {
            if scanned >= THREAD_SCAN_ROWS_MAX {
                let why = format!(
                    "the search for this agent's sent replies stopped after \
                     {THREAD_SCAN_ROWS_MAX} journal entries, at {}: later replies are not shown",
                    self.cursor_text(pos)
                );
                return Ok((out, Some(why)));
            }
            let chunk = self
                .journal_page(pos, JOURNAL_READ_ENTRIES, JOURNAL_READ_BYTES)
                .await?;
            if chunk.is_empty() {
                return Ok((out, None));
            }
            for item in chunk {
                scanned += 1;
                pos = item.arrival;
                let JournalRecord::Envelope {
                    stream,
                    kind: KIND_AGENT,
                    payload,
                    ..
                } = &item.record
                else {
                    continue;
                };
                if stream.author != me {
                    continue;
                }
                if let Ok(m) = AgentHeader::decode(payload)
                    && &m.from == agent
                    && let Some(parent) = m.in_reply_to
                {
                    out.push(Candidate {
                        arrival: pos,
                        id: m.id,
                        parent,
                        dir: Dir::Sent,
                    });
                }
            }
        }
    }

    /// The messages `id` (of `row`) answers, nearest first, while `agent`
    /// holds them (at most [`THREAD_ANCESTORS_MAX`]).
    async fn thread_ancestors(
        &self,
        agent: &AgentName,
        id: MsgId,
        row: &MessageRow,
    ) -> Result<Vec<(MsgId, MessageRow, Dir)>, ApiError> {
        let mut seen = HashSet::from([id]);
        let mut out = Vec::new();
        let mut up = row.in_reply_to;
        while let Some(parent) = up {
            // A peer's message may name any id as what it answers, itself too.
            if out.len() >= THREAD_ANCESTORS_MAX || !seen.insert(parent) {
                break;
            }
            let Some(prow) = read_store(&self.inner.store, move |s| s.message(&parent)).await?
            else {
                break;
            };
            let Some(dir) = self.dir_of(agent, &prow) else {
                break;
            };
            up = prow.in_reply_to;
            out.push((parent, prow, dir));
        }
        Ok(out)
    }
}

/// The id of the agent message in a journal entry of `kind` (a message, or
/// one passed on from the host its recipient left).
fn message_id(kind: u16, payload: &[u8]) -> Option<MsgId> {
    match kind {
        KIND_AGENT => AgentHeader::decode(payload).ok().map(|m| m.id),
        KIND_FORWARD => {
            let f = Forward::decode(payload).ok()?;
            AgentHeader::decode(&f.envelope).ok().map(|m| m.id)
        }
        _ => None,
    }
}

/// What a thread entry shows of the journal entry of a message: its body,
/// how it is written, the author's clock, and for a message passed on by
/// another node, the node that wrote it.
fn entry_body(
    record: Option<&JournalRecord>,
) -> (BodyEncoding, String, Option<u64>, Option<NodeId>) {
    let Some(JournalRecord::Envelope {
        kind,
        payload,
        created_ms,
        ..
    }) = record
    else {
        return (
            BodyEncoding::Text,
            "(its journal entry is gone: retention took it)".to_owned(),
            None,
            None,
        );
    };
    let (body, author) = match *kind {
        KIND_AGENT => (AgentEnvelope::decode(payload).map(|m| m.body), None),
        KIND_FORWARD => match Forward::decode(payload) {
            Ok(f) => (
                AgentEnvelope::decode(&f.envelope).map(|m| m.body),
                Some(f.author),
            ),
            Err(e) => (Err(e), None),
        },
        KIND_TOMBSTONE => {
            let text = "(superseded before it was sent: a later message with its key replaced it)";
            return (BodyEncoding::Text, text.to_owned(), Some(*created_ms), None);
        }
        _ => {
            let text = format!("(a journal entry of kind {kind}, not an agent message)");
            return (BodyEncoding::Text, text, Some(*created_ms), None);
        }
    };
    match body {
        Ok(body) => {
            let (encoding, text) = BodyEncoding::encode(&body);
            (encoding, text, Some(*created_ms), author)
        }
        Err(e) => (
            BodyEncoding::Text,
            format!("(an agent message that does not decode: {e})"),
            Some(*created_ms),
            None,
        ),
    }
}

/// `GET /v1/agents/{name}/thread/{id}`: the message `id` (one the agent
/// sent or received here), what it answers and its replies, in arrival
/// order ([`ThreadResponse`]), bounded by [`THREAD_ENTRIES_MAX`] and
/// [`THREAD_BODY_BYTES_MAX`].
///
/// # Errors
/// [`NotFound::UnknownMessage`] if this node does not know `id`, and
/// [`NotFound::NotAgentsMessage`] if the agent neither sent nor received it.
pub(crate) async fn thread(
    State(st): State<ApiState>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<ThreadResponse>, ApiError> {
    let agent = st.reader(&name)?;
    let (id, row) = message_row(&st, &id).await?;
    let Some(dir) = st.dir_of(&agent, &row) else {
        return Err(NotFound::NotAgentsMessage {
            id: id.to_string(),
            agent: agent.to_string(),
        }
        .into());
    };
    let above = st.thread_ancestors(&agent, id, &row).await?;
    let top = u32::try_from(above.len()).unwrap_or(u32::MAX);
    let limit = THREAD_ENTRIES_MAX - 1 - above.len();
    let (replies, mut cut) = st.thread_replies(&agent, id, row.arrival, limit).await?;
    let mut members: Vec<Member> = Vec::with_capacity(above.len() + 1 + replies.len());
    for (depth, (pid, prow, pdir)) in (0..top).rev().zip(above) {
        members.push(Member {
            id: pid,
            row: prow,
            dir: pdir,
            depth,
        });
    }
    members.push(Member {
        id,
        row,
        dir,
        depth: top,
    });
    let mut depths = HashMap::from([(id, top)]);
    for c in &replies {
        let depth = depths.get(&c.parent).map_or(top, |d| d.saturating_add(1));
        depths.insert(c.id, depth);
        let cid = c.id;
        // Trimmed since the scan read it: it is not shown.
        let Some(crow) = read_store(&st.inner.store, move |s| s.message(&cid)).await? else {
            continue;
        };
        members.push(Member {
            id: c.id,
            row: crow,
            dir: c.dir,
            depth,
        });
    }
    members.sort_by_key(|m| m.row.arrival);
    let (entries, bytes_cut) = st.thread_entries(members).await?;
    cut = bytes_cut.or(cut);
    Ok(Json(ThreadResponse {
        id: id.to_string(),
        entries,
        truncated: cut.is_some(),
        truncated_why: cut,
    }))
}

impl ApiState {
    /// The entries of `members` (in their order) with their bodies and
    /// states, cut after the one that crosses [`THREAD_BODY_BYTES_MAX`]
    /// (and why, if it was).
    async fn thread_entries(
        &self,
        members: Vec<Member>,
    ) -> Result<(Vec<ThreadEntry>, Option<String>), ApiError> {
        let me = self.inner.node;
        // The node's status says where sent messages are; asked once.
        let mut status: Option<NodeStatus> = None;
        let mut out = Vec::with_capacity(members.len());
        let mut bytes = 0usize;
        let total = members.len();
        for m in members {
            if bytes >= THREAD_BODY_BYTES_MAX {
                let why = format!(
                    "the bodies shown reached {THREAD_BODY_BYTES_MAX} bytes: {} of {total} \
                     messages are shown",
                    out.len()
                );
                return Ok((out, Some(why)));
            }
            let arrival = m.row.arrival;
            let record = read_store(&self.inner.store, move |s| {
                s.journal_page(arrival.saturating_sub(1), 1, JOURNAL_READ_BYTES)
            })
            .await?
            .into_iter()
            .find(|i| i.arrival == arrival)
            .map(|i| i.record);
            let (encoding, body, created_ms, author) = entry_body(record.as_ref());
            bytes += body.len();
            let state = match m.dir {
                Dir::Received if m.row.superseded_by.is_some() => "superseded",
                Dir::Received => "received",
                Dir::Sent => {
                    let remote = m.row.stream.recipient().is_some_and(|r| r != me);
                    if status.is_none() && remote && m.row.undelivered.is_none() {
                        status = Some(self.inner.bus.status().await.map_err(node_error)?);
                    }
                    state_name(&m.row, me, status.as_ref())
                }
            };
            let recipient = m.row.stream.recipient().unwrap_or(me);
            out.push(ThreadEntry {
                id: m.id.to_string(),
                from: ApiState::address(&m.row.from, &author.unwrap_or(m.row.stream.author)),
                to: match &m.row.to {
                    Some(a) => ApiState::address(a, &recipient),
                    None => recipient.to_string(),
                },
                in_reply_to: m.row.in_reply_to.map(|i| i.to_string()),
                body,
                encoding,
                dir: match m.dir {
                    Dir::Sent => "sent",
                    Dir::Received => "received",
                }
                .to_owned(),
                state: state.to_owned(),
                depth: m.depth,
                cursor: self.cursor_text(arrival),
                arrival,
                created_ms,
            });
        }
        Ok((out, None))
    }
}
