//! The journal rows a commit writes: runs of envelopes (with their agent
//! index entries, between folds) and other records.

use super::*;

impl Tables<'_> {
    /// Writes `pending` as journal rows keyed by their last arrival: a run
    /// of envelopes (see [`run_len`]) to a row, with the entries of `inbox`
    /// and `messages` at its arrivals (taken from their fronts), any other
    /// record alone; returns the bytes of the rows.
    pub(super) fn write_rows(
        &mut self,
        pending: &[(Arrival, JournalRecord)],
        inbox: &mut &[agents::InboxEntry],
        messages: &mut &[agents::MessageEntry],
    ) -> Result<u64, StoreError> {
        let werr = write_err(self.name);
        let mut buf = Vec::new();
        let mut rest = pending;
        let mut key = Vec::new();
        let mut index = Vec::new();
        let mut written = 0u64;
        while let Some(((arrival, record), _)) = rest.split_first() {
            let n = run_len(rest);
            let row = match record {
                JournalRecord::Envelope { stream, seq, .. } if n > 0 => {
                    let entries = run_entries(&rest[..n]);
                    encode_into(&mut key, stream)?;
                    match agents::run_index(*arrival, n, inbox, messages) {
                        Some(ix) => {
                            encode_into(&mut index, &ix)?;
                            RowRef::Indexed {
                                stream: Bytes::new(&key),
                                first_seq: *seq,
                                index: Bytes::new(&index),
                                entries,
                            }
                        }
                        None => RowRef::Run {
                            stream: Bytes::new(&key),
                            first_seq: *seq,
                            entries,
                        },
                    }
                }
                other => RowRef::Record(other),
            };
            encode_into(&mut buf, &row)?;
            let taken = n.max(1);
            let last = arrival + taken as u64 - 1;
            self.journal.insert(last, buf.as_slice()).map_err(werr)?;
            written += row_bytes(buf.len());
            rest = &rest[taken..];
        }
        if !inbox.is_empty() || !messages.is_empty() {
            // `can_hold` said every entry is at an envelope of these runs.
            return Err(StoreError::Unavailable(format!(
                "{}: {} index entries named no envelope of the commit's runs",
                self.name,
                inbox.len() + messages.len()
            )));
        }
        Ok(written)
    }
}

/// Whether the rows of `pending` can hold every entry of `inbox` and
/// `messages`: each names an envelope of a run of `pending`, and each
/// message's id is its direct stream's own (tag and seq). Anything else (a
/// loss record's inbox entries, a forward or a tombstone naming another
/// message's id) goes straight to the tables, so that the rows hold only
/// what a fold can rebuild from a row's tag and seqs, and no trim of the
/// message index can reach an entry a row holds.
pub(super) fn can_hold(
    pending: &[(Arrival, JournalRecord)],
    inbox: &[agents::InboxEntry],
    messages: &[agents::MessageEntry],
) -> bool {
    let Some((first, _)) = pending.first() else {
        return false;
    };
    let in_run = |arrival: Arrival| {
        arrival
            .checked_sub(*first)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| pending.get(i))
            .is_some_and(|(a, r)| *a == arrival && matches!(r, JournalRecord::Envelope { .. }))
    };
    if !inbox.iter().all(|(_, a, _)| in_run(*a)) {
        return false;
    }
    // The tag of the last stream seen: messages come a run at a time.
    let mut tag: Option<(&StreamId, [u8; 8])> = None;
    for (id, p) in messages {
        let mesh_protocol::Channel::Direct(to) = &p.stream.channel else {
            return false;
        };
        let t = match tag {
            Some((s, t)) if *s == p.stream => t,
            _ => {
                let t = mesh_protocol::MsgId::stream_tag(&p.stream.author, p.stream.epoch, to);
                tag = Some((&p.stream, t));
                t
            }
        };
        if !in_run(p.arrival) || *id != mesh_protocol::MsgId::in_stream(t, p.seq) {
            return false;
        }
    }
    true
}

/// The envelopes of the run `records`, borrowed for encoding.
fn run_entries(records: &[(Arrival, JournalRecord)]) -> Vec<EntryRef<'_>> {
    let mut entries = Vec::with_capacity(records.len());
    for (_, r) in records {
        if let JournalRecord::Envelope {
            lamport,
            created_ms,
            kind,
            payload,
            ..
        } = r
        {
            entries.push(EntryRef {
                lamport: *lamport,
                created_ms: *created_ms,
                kind: *kind,
                payload: Bytes::new(payload),
            });
        }
    }
    entries
}

/// How many of `records` (consecutive arrivals) open a journal row of
/// envelopes: consecutive seqs of one stream, within [`JOURNAL_ROW_BYTES_MAX`]
/// (at least one). 0 if the first is not an envelope.
fn run_len(records: &[(Arrival, JournalRecord)]) -> usize {
    let Some((
        (
            arrival,
            JournalRecord::Envelope {
                stream,
                seq,
                payload,
                ..
            },
        ),
        more,
    )) = records.split_first()
    else {
        return 0;
    };
    let mut bytes = ROW_OVERHEAD_BYTES + payload.len() + ROW_ENTRY_OVERHEAD_BYTES;
    let mut n = 1;
    for (a, r) in more {
        let JournalRecord::Envelope {
            stream: s,
            seq: q,
            payload: p,
            ..
        } = r
        else {
            break;
        };
        let add = p.len() + ROW_ENTRY_OVERHEAD_BYTES;
        if s != stream
            || Some(*q) != seq.checked_add(n as u64)
            || Some(*a) != arrival.checked_add(n as u64)
            || bytes + add > JOURNAL_ROW_BYTES_MAX
        {
            break;
        }
        bytes += add;
        n += 1;
    }
    n
}
