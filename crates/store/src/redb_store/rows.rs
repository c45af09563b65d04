//! The journal's rows as stored: a run of envelopes of one stream (maybe
//! with the agent index entries of its envelopes), or one other record.

use super::*;

/// One journal envelope in a run, borrowed for encoding.
#[derive(Serialize)]
pub(super) struct EntryRef<'a> {
    pub(super) lamport: u64,
    pub(super) created_ms: u64,
    pub(super) kind: u16,
    pub(super) payload: &'a Bytes,
}

/// One journal row, borrowed for encoding. The variants' order is the
/// encoding: it must match [`RowView`].
#[derive(Serialize)]
pub(super) enum RowRef<'a> {
    /// Envelopes `first_seq..` of a stream (its key bytes, so that a reader
    /// can match it without decoding a node id), at consecutive arrivals.
    Run {
        stream: &'a Bytes,
        first_seq: Seq,
        entries: Vec<EntryRef<'a>>,
    },
    /// A record that is not an envelope (a gap or a loss).
    Record(&'a JournalRecord),
    /// As `Run`, with the agent index entries of its envelopes (a postcard
    /// `agents::RunIndex`, as bytes so that a reader of envelopes skips it
    /// without decoding it).
    Indexed {
        stream: &'a Bytes,
        first_seq: Seq,
        index: &'a Bytes,
        entries: Vec<EntryRef<'a>>,
    },
}

/// One journal envelope in a run, decoded in place.
#[derive(Deserialize)]
pub(super) struct EntryView<'a> {
    pub(super) lamport: u64,
    pub(super) created_ms: u64,
    pub(super) kind: u16,
    pub(super) payload: &'a [u8],
}

/// One journal row as stored (see [`RowRef`]).
#[derive(Deserialize)]
enum RowWire<'a> {
    Run {
        stream: &'a [u8],
        first_seq: Seq,
        #[serde(borrow)]
        entries: Vec<EntryView<'a>>,
    },
    Record(JournalRecord),
    Indexed {
        stream: &'a [u8],
        first_seq: Seq,
        #[allow(dead_code)] // Read by `agents::deferred_rows`, not here.
        index: &'a [u8],
        #[serde(borrow)]
        entries: Vec<EntryView<'a>>,
    },
}

/// The head of an `Indexed` journal row: what an index read needs, without
/// the envelopes (decoded from the bytes after the variant's tag).
#[derive(Deserialize)]
pub(super) struct IndexedHead<'a> {
    pub(super) stream: &'a [u8],
    pub(super) first_seq: Seq,
    pub(super) index: &'a [u8],
}

/// The postcard tag of [`RowWire::Indexed`] (a variant's index is its
/// varint tag, one byte below 128).
pub(super) const INDEXED_TAG: u8 = 2;

/// One journal row, decoded in place; an indexed run reads as a run.
pub(super) enum RowView<'a> {
    Run {
        stream: &'a [u8],
        first_seq: Seq,
        entries: Vec<EntryView<'a>>,
    },
    Record(JournalRecord),
}

impl<'a> RowView<'a> {
    /// Decodes the journal row `value` of the store `name`.
    pub(super) fn decode(name: &str, value: &'a [u8]) -> Result<Self, StoreError> {
        Ok(match decode(name, "journal row", value)? {
            RowWire::Run {
                stream,
                first_seq,
                entries,
            }
            | RowWire::Indexed {
                stream,
                first_seq,
                entries,
                ..
            } => RowView::Run {
                stream,
                first_seq,
                entries,
            },
            RowWire::Record(r) => RowView::Record(r),
        })
    }
}

impl RowView<'_> {
    /// The arrival of the row's first record, given its last.
    pub(super) fn first_arrival(&self, last: Arrival) -> Arrival {
        let n = match self {
            RowView::Run { entries, .. } => entries.len() as u64,
            RowView::Record(_) => 1,
        };
        (last + 1).saturating_sub(n)
    }

    /// Appends the row's records at `from` or later to `out`, until it
    /// holds `limit` or `bytes` (payloads and texts read so far) reaches
    /// `max_bytes`.
    pub(super) fn push_items(
        self,
        name: &str,
        last: Arrival,
        from: Arrival,
        (limit, max_bytes): (usize, u64),
        bytes: &mut u64,
        out: &mut Vec<JournalItem>,
    ) -> Result<(), StoreError> {
        let first = self.first_arrival(last);
        match self {
            RowView::Run {
                stream,
                first_seq,
                entries,
            } => {
                let stream: StreamId = decode(name, "stream id", stream)?;
                let skip = usize::try_from(from.saturating_sub(first)).unwrap_or(usize::MAX);
                for (i, e) in entries.into_iter().enumerate().skip(skip) {
                    if out.len() >= limit || (!out.is_empty() && *bytes >= max_bytes) {
                        break;
                    }
                    *bytes += e.payload.len() as u64;
                    out.push(JournalItem {
                        arrival: first + i as u64,
                        record: JournalRecord::Envelope {
                            stream: stream.clone(),
                            seq: first_seq + i as u64,
                            lamport: e.lamport,
                            created_ms: e.created_ms,
                            kind: e.kind,
                            payload: e.payload.to_vec(),
                        },
                    });
                }
            }
            RowView::Record(record) => {
                if last >= from && out.len() < limit && (out.is_empty() || *bytes < max_bytes) {
                    *bytes += crate::mem::record_text_bytes(&record);
                    out.push(JournalItem {
                        arrival: last,
                        record,
                    });
                }
            }
        }
        Ok(())
    }

    /// What trimming needs to know of the row keyed `last` of `value_len` bytes.
    pub(super) fn info(
        self,
        name: &str,
        last: Arrival,
        value_len: usize,
    ) -> Result<RowInfo, StoreError> {
        let first = self.first_arrival(last);
        let run = match self {
            RowView::Run {
                stream,
                first_seq,
                entries,
            } => Some((
                decode(name, "stream id", stream)?,
                first_seq,
                entries.len() as u64,
            )),
            RowView::Record(_) => None,
        };
        Ok(RowInfo {
            first,
            last,
            bytes: row_bytes(value_len),
            run,
        })
    }
}
