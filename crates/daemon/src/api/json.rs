//! The journal's entries in their JSON form (the wire types are `mesh_api`'s).

use mesh_api::{BodyEncoding, EventEntry, EventRecord};
use mesh_protocol::{Cursor, Epoch, NodeId};
use mesh_store::{JournalItem, JournalRecord, LossReason};

/// The JSON form of `item` from the journal of `node` at `epoch`.
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
pub(super) fn loss_reason_name(reason: LossReason) -> &'static str {
    match reason {
        LossReason::OutboxEvicted => "outbox_evicted",
        LossReason::SubscriberLagged => "subscriber_lagged",
        _ => "other",
    }
}
