//! Where a message is (`GET /v1/messages/{id}`): received, delivered,
//! queued in the outbox, bounced, or lost with its loss record.

use axum::Json;
use axum::extract::{Path, State};
use mesh_api::{MessageStatus, StreamJson};
use mesh_protocol::{BounceReason, MsgId, NodeId};
use mesh_store::{JournalRecord, MeshStore, MessageDir, MessageRow};

use crate::api::error::node_error;
use crate::api::routes::read_store;
use crate::api::{ApiError, ApiState, CallerError, NotFound};
use crate::bus::NodeStatus;

/// Journal entries after a message that `GET /v1/messages/{id}` reads, at
/// most, looking for the loss record of a message evicted unacknowledged.
pub const LOSS_SCAN_ENTRIES_MAX: usize = 100_000;

/// The message id `text` and its index row (a message this node sent or
/// received).
pub(crate) async fn message_row(
    st: &ApiState,
    text: &str,
) -> Result<(MsgId, mesh_store::MessageRow), ApiError> {
    let id: MsgId = text
        .parse()
        .map_err(|e: mesh_protocol::AgentError| CallerError::BadValue(e.to_string()))?;
    let row = read_store(&st.inner.store, move |s| s.message(&id))
        .await?
        .ok_or_else(|| NotFound::UnknownMessage(id.to_string()))?;
    Ok((id, row))
}

/// `GET /v1/messages/{id}`: where the message is.
pub(crate) async fn message(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<MessageStatus>, ApiError> {
    let (id, row) = message_row(&st, &id).await?;
    let me = st.inner.node;
    let recipient = row.stream.recipient().unwrap_or(me);
    let to = match &row.to {
        Some(a) => ApiState::address(a, &recipient),
        None => recipient.to_string(),
    };
    let superseded_by = row.superseded_by.map(|b| b.to_string());
    let (state, detail) = match row_state(&row, me) {
        RowState::Superseded => (
            "superseded",
            format!(
                "a later message with its key replaced it before it was sent ({}); {}",
                superseded_by.as_deref().unwrap_or_default(),
                match row.dir {
                    MessageDir::Sent => "its recipient gets a tombstone in its place",
                    MessageDir::Received => "this node received the tombstone in its place",
                }
            ),
        ),
        RowState::Undeliverable(reason) => (
            "undeliverable",
            format!(
                "received here for an agent this node does not host ({}); it was bounced to its sender",
                reason.as_str()
            ),
        ),
        RowState::Received => ("received", "received here".to_owned()),
        RowState::Bounced(reason) => (
            "bounced",
            format!(
                "the recipient node has no such agent ({}); it was delivered to no one",
                reason.as_str()
            ),
        ),
        RowState::DeliveredHere => match &row.read {
            Some(m) => (
                "read",
                format!(
                    "delivered to an agent of this node, and read by {}",
                    ApiState::address(&m.reader, &m.node)
                ),
            ),
            None => ("delivered", "delivered to an agent of this node".to_owned()),
        },
        RowState::SentAway => match &row.read {
            // Read implies delivered: its reader's node had it.
            Some(m) => (
                "read",
                format!(
                    "read by {} (its read receipt came back)",
                    ApiState::address(&m.reader, &m.node)
                ),
            ),
            None => sent_state(&st, &row).await?,
        },
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
        superseded_by,
        read_by: row
            .read
            .as_ref()
            .map(|m| ApiState::address(&m.reader, &m.node)),
        read_ms: row.read.as_ref().map(|m| m.read_ms),
    }))
}

/// Where a message this node sent to another node is, by the node's
/// status.
enum SentPlace {
    /// Its recipient node acknowledged it.
    Delivered,
    /// Still in the outbox (the detail says why it is not acknowledged).
    Queued(&'static str),
    /// Evicted from the outbox unacknowledged.
    Lost,
}

/// Where the message of `row`, which this node sent to another node, is
/// by `status`.
fn sent_place(status: &NodeStatus, row: &MessageRow) -> SentPlace {
    let recipient = row.stream.recipient();
    let own = status
        .peers
        .iter()
        .find(|p| Some(p.node) == recipient)
        .and_then(|p| p.own_stream.as_ref())
        .filter(|o| o.stream == row.stream);
    let Some(own) = own else {
        // The stream of an older epoch of this node, or of a removed peer.
        return SentPlace::Queued(
            "the recipient node is not a peer now, or the stream is of an earlier store of this node",
        );
    };
    if row.seq <= own.last_acked {
        SentPlace::Delivered
    } else if row.seq >= own.first_retained {
        SentPlace::Queued(
            "committed here, in the outbox; the recipient node has not acknowledged it yet",
        )
    } else {
        SentPlace::Lost
    }
}

/// What a message's index row says of it on node `me`, before the node's
/// status is asked (which only a message sent to another node needs).
enum RowState {
    /// Replaced by a later message with its key before it was sent.
    Superseded,
    /// Received for an agent this node does not host (and bounced).
    Undeliverable(BounceReason),
    /// Received here.
    Received,
    /// Bounced by its recipient node.
    Bounced(BounceReason),
    /// Sent to an agent of this node.
    DeliveredHere,
    /// Sent to another node: where it is, the node's status says.
    SentAway,
}

fn row_state(row: &MessageRow, me: NodeId) -> RowState {
    match (row.dir, row.undelivered) {
        (_, None) if row.superseded_by.is_some() => RowState::Superseded,
        (MessageDir::Received, Some(reason)) => RowState::Undeliverable(reason),
        (MessageDir::Received, None) => RowState::Received,
        (MessageDir::Sent, Some(reason)) => RowState::Bounced(reason),
        (MessageDir::Sent, None) if row.stream.recipient().unwrap_or(me) == me => {
            RowState::DeliveredHere
        }
        (MessageDir::Sent, None) => RowState::SentAway,
    }
}

/// The state `GET /v1/messages/{id}` gives the message of `row` on node
/// `me`, without its detail. `status` is needed for a message sent to
/// another node that was neither bounced nor superseded; without it, such
/// a message is `queued`.
pub(crate) fn state_name(
    row: &MessageRow,
    me: NodeId,
    status: Option<&NodeStatus>,
) -> &'static str {
    match row_state(row, me) {
        RowState::Superseded => "superseded",
        RowState::Undeliverable(_) => "undeliverable",
        RowState::Received => "received",
        RowState::Bounced(_) => "bounced",
        RowState::DeliveredHere | RowState::SentAway if row.read.is_some() => "read",
        RowState::DeliveredHere => "delivered",
        RowState::SentAway => match status.map(|s| sent_place(s, row)) {
            Some(SentPlace::Delivered) => "delivered",
            Some(SentPlace::Queued(_)) | None => "queued",
            Some(SentPlace::Lost) => "lost",
        },
    }
}

/// Where a message this node sent is: acknowledged by its recipient node
/// (delivered), still in the outbox (queued), or given up (lost, with the
/// loss record).
async fn sent_state(st: &ApiState, row: &MessageRow) -> Result<(&'static str, String), ApiError> {
    let status = st.inner.bus.status().await.map_err(node_error)?;
    Ok(match sent_place(&status, row) {
        SentPlace::Delivered => (
            "delivered",
            "committed at the recipient node (it acknowledged it)".to_owned(),
        ),
        SentPlace::Queued(detail) => ("queued", detail.to_owned()),
        SentPlace::Lost => ("lost", loss_detail(st, row).await?),
    })
}

/// Why a message evicted from the outbox unacknowledged was lost: its loss
/// record, found after it in the journal within [`LOSS_SCAN_ENTRIES_MAX`]
/// entries, or a general word if none is found there.
async fn loss_detail(st: &ApiState, row: &MessageRow) -> Result<String, ApiError> {
    let stream = row.stream.clone();
    let seq = row.seq;
    let mut pos = row.arrival;
    let mut read = 0usize;
    while read < LOSS_SCAN_ENTRIES_MAX {
        let chunk = st
            .journal_page(
                pos,
                crate::api::routes::JOURNAL_READ_ENTRIES,
                crate::api::routes::JOURNAL_READ_BYTES,
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
                return Ok(format!(
                    "given up before the recipient node had it: {detail} (loss record {})",
                    st.cursor_text(item.arrival)
                ));
            }
        }
    }
    Ok("evicted from the outbox before the recipient node acknowledged it".to_owned())
}
