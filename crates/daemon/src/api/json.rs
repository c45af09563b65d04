//! The journal's entries in their JSON form (the wire types are `mesh_api`'s).

use mesh_api::{AgentMessageJson, BodyEncoding, EventEntry, EventRecord};
use mesh_protocol::{AgentHeader, Cursor, Epoch, KIND_AGENT, NodeId, StreamId};
use mesh_store::{JournalItem, JournalRecord, LossReason};

/// The JSON form of `item` from the journal of `node` at `epoch`.
// Long because it is one match arm per journal record kind, each mapping its
// fields onto the wire type; splitting it would only hide that table.
pub(super) fn entry(node: &NodeId, epoch: Epoch, item: &JournalItem) -> EventEntry {
    let record = match &item.record {
        JournalRecord::Envelope {
            stream,
            seq,
            lamport,
            created_ms,
            kind,
            payload,
        } => {
            let (encoding, body) = BodyEncoding::encode(payload);
            EventRecord::Envelope {
                stream: stream.into(),
                seq: *seq,
                lamport: *lamport,
                created_ms: *created_ms,
                msg_kind: *kind,
                encoding,
                body,
                agent: (*kind == KIND_AGENT)
                    .then(|| agent_message(node, stream, payload))
                    .flatten(),
            }
        }
        JournalRecord::Gap { stream, from, to } => EventRecord::Gap {
            stream: stream.into(),
            from: *from,
            to: *to,
        },
        JournalRecord::Loss {
            stream,
            from,
            to,
            reason,
            detail,
        } => EventRecord::Loss {
            stream: stream.into(),
            from: *from,
            to: *to,
            reason: loss_reason_name(*reason).to_owned(),
            detail: detail.clone(),
        },
        JournalRecord::SubscriberLagged {
            subscriber,
            from,
            to,
        } => {
            let resume = Cursor::new(node, epoch, from.saturating_sub(1)).to_string();
            let detail = format!(
                "{subscriber} stopped reading; journal arrivals {from}..={to} were not \
                 delivered to it live and are still in the journal: re-read them with \
                 GET /v1/events?after={resume}"
            );
            EventRecord::Lagged {
                subscriber: subscriber.clone(),
                from: *from,
                to: *to,
                resume,
                detail,
            }
        }
        JournalRecord::SendsLost {
            to,
            msgs,
            bytes,
            first_ms,
            last_ms,
            detail,
        } => EventRecord::Lost {
            to: to.to_string(),
            msgs: *msgs,
            bytes: *bytes,
            first_ms: *first_ms,
            last_ms: *last_ms,
            detail: detail.clone(),
        },
        JournalRecord::EpochEnded { stream, last } => EventRecord::EpochEnded {
            stream: stream.into(),
            last: *last,
            detail: format!(
                "its author {} started a new store epoch (its store was lost or went back in \
                 time): this node holds the stream up to #{last}, and nothing later of it can \
                 arrive; the author's new messages come on a new stream",
                stream.author.fmt_short()
            ),
        },
        JournalRecord::RolledBack {
            stream,
            from,
            to,
            detail,
        } => EventRecord::RolledBack {
            stream: stream.into(),
            from: *from,
            to: *to,
            detail: detail.clone(),
        },
        JournalRecord::Conflict {
            stream,
            seq,
            ours,
            theirs,
        } => EventRecord::Conflict {
            stream: stream.into(),
            seq: *seq,
            ours: ours.to_string(),
            theirs: theirs.to_string(),
            detail: format!(
                "a batch from {} came with another message at #{seq} than the one held here: two \
                 processes write this stream (a cloned data dir, or a restored backup); it was \
                 not taken",
                stream.author.fmt_short()
            ),
        },
        JournalRecord::Trimmed { from, to } => {
            let resume = Cursor::new(node, epoch, *to).to_string();
            EventRecord::Trimmed {
                from: *from,
                to: *to,
                entries: to - from + 1,
                detail: format!(
                    "journal arrivals {from}..={to} were trimmed by retention ([journal] max_bytes, \
                     max_age) and can no longer be read; the journal goes on after them \
                     (after={resume})"
                ),
            }
        }
        JournalRecord::DrainEnded { agent, to, detail } => EventRecord::DrainEnded {
            agent: agent.to_string(),
            to: to.to_string(),
            detail: detail.clone(),
        },
        _ => EventRecord::Other {},
    };
    EventEntry {
        cursor: Cursor::new(node, epoch, item.arrival).to_string(),
        arrival: item.arrival,
        record,
        losses_unrecorded: false,
    }
}

/// The wire name of a loss reason.
pub(crate) fn loss_reason_name(reason: LossReason) -> &'static str {
    match reason {
        LossReason::OutboxEvicted => "outbox_evicted",
        LossReason::SubscriberLagged => "subscriber_lagged",
        _ => "other",
    }
}

/// The agent message in `payload`, an envelope of `stream` journaled by
/// `node`, with its sender and recipient as addresses; `None` if it does
/// not decode.
fn agent_message(node: &NodeId, stream: &StreamId, payload: &[u8]) -> Option<AgentMessageJson> {
    let m = AgentHeader::decode(payload).ok()?;
    let recipient = stream.recipient().unwrap_or(*node);
    let (encoding, body) = BodyEncoding::encode(m.body);
    Some(AgentMessageJson {
        id: m.id.to_string(),
        from: format!("{}@{}", m.from, stream.author),
        to: m.to.map(|t| format!("{t}@{recipient}")),
        in_reply_to: m.in_reply_to.map(|i| i.to_string()),
        encoding,
        body,
    })
}
