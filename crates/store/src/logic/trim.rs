//! Journal retention: trimming the oldest rows past the byte and age
//! bounds, and keeping the outbox whole when its rows go.

use mesh_protocol::{Seq, StreamId};

use super::{Base, Fail, GroupView, JOURNAL_TIME_STEP_MS, TRIM_ROWS_MAX, Write, refuse};
use crate::{Arrival, OwnStream, TrimReport};

/// Journal rows read at a time while trimming.
const TRIM_READ_ROWS: usize = 64;

/// The seqs a trim takes of each received direct stream, by the stream's
/// message id tag: from the first to the last (a stream's rows go in seq
/// order, so nothing between them stays).
#[derive(Default)]
struct Received(std::collections::BTreeMap<[u8; 8], (Seq, Seq)>);

impl Received {
    fn note(&mut self, stream: &StreamId, first_seq: Seq, n: u64) {
        let mesh_protocol::Channel::Direct(to) = &stream.channel else {
            return;
        };
        let tag = mesh_protocol::MsgId::stream_tag(&stream.author, stream.epoch, to);
        let last = first_seq + n - 1;
        let range = self.0.entry(tag).or_insert((first_seq, last));
        range.0 = range.0.min(first_seq);
        range.1 = range.1.max(last);
    }
}

impl<B: Base> GroupView<'_, B> {
    /// Trims the oldest journal rows while the journal is over its bounds
    /// (see [`WriteOp::Trim`](crate::WriteOp::Trim)).
    pub(super) fn trim(
        &mut self,
        now_ms: u64,
        bytes_max: u64,
        age_ms_max: u64,
    ) -> Result<(), Fail> {
        if self.counters.now_ms.is_some() {
            return refuse("a commit trims the journal once at most".into());
        }
        self.counters.now_ms = Some(now_ms);
        let aged = self.aged_before(now_ms, age_ms_max)?;
        let (first_before, mut rows, mut more) = (self.counters.journal_first, 0usize, false);
        let mut last_trimmed = None;
        let mut received = Received::default();
        // Most trims take a row or two: read few first, more if need be.
        let mut read = 4;
        'read: loop {
            let over = self.counters.journal_bytes > bytes_max;
            if !over && aged <= self.counters.journal_first {
                break;
            }
            let batch = self.base.journal_rows(self.counters.journal_first, read)?;
            read = (read * 2).min(TRIM_READ_ROWS);
            if batch.is_empty() {
                break;
            }
            for row in batch {
                if row.first < self.counters.journal_first {
                    return Err(self.corrupt(format!(
                        "a journal row starts at {} inside the trimmed range (first {})",
                        row.first, self.counters.journal_first
                    )));
                }
                let over = self.counters.journal_bytes > bytes_max;
                if !over && row.last >= aged {
                    break 'read;
                }
                if rows >= TRIM_ROWS_MAX {
                    more = true;
                    break 'read;
                }
                if let Some((stream, first_seq, n)) = &row.run
                    && !self.free_for_trim(stream, *first_seq, *n)?
                {
                    received.note(stream, *first_seq, *n);
                }
                self.counters.journal_bytes = self.counters.journal_bytes.saturating_sub(row.bytes);
                self.counters.journal_first = row.last + 1;
                last_trimmed = Some(row.last);
                rows += 1;
            }
        }
        let (next_due_ms, keep) = self.next_age_due(self.counters.journal_first, age_ms_max)?;
        if let Some(last) = last_trimmed {
            self.writes.push(Write::DelJournal {
                first: first_before,
                last,
            });
            self.writes.push(Write::DelTimesBefore(keep));
            // The agents' inbox entries of the trimmed rows go with them.
            self.writes
                .push(Write::Agents(crate::agents::AgentWrite::TrimInboxes {
                    before: self.counters.journal_first,
                }));
            // And the message rows of the received messages among them.
            for (tag, (from, to)) in received.0 {
                self.writes
                    .push(Write::Agents(crate::agents::AgentWrite::TrimMessages {
                        tag,
                        from,
                        to,
                    }));
            }
        }
        self.trim = Some(TrimReport {
            bounds: self.counters.bounds(),
            more,
            next_due_ms,
        });
        Ok(())
    }

    /// The arrival before which every row was written more than
    /// `age_ms_max` ms before `now_ms` (0 if none is known to be, or no bound).
    ///
    /// A dated position `(a, t)` says: rows before `a` were written before
    /// the commit that started at `a`, at `t`; and rows from `a` up to the
    /// next dated one within [`JOURNAL_TIME_STEP_MS`] after `t` (a commit
    /// that came later would have been dated).
    fn aged_before(&mut self, now_ms: u64, age_ms_max: u64) -> Result<Arrival, Fail> {
        if age_ms_max == 0 || now_ms < age_ms_max {
            return Ok(0);
        }
        let cutoff = now_ms - age_ms_max;
        if self.counters.last_write_ms != 0 && self.counters.last_write_ms <= cutoff {
            // Nothing was written since: every row is old.
            return Ok(self.counters.journal_head + 1);
        }
        let mut bound = 0;
        let mut prev: Option<u64> = None;
        let mut after = 0;
        loop {
            let times = self.base.journal_times(after, TRIM_READ_ROWS)?;
            let Some(&(last, _)) = times.last() else {
                return Ok(bound);
            };
            for (a, t) in times {
                if t > cutoff {
                    let step_done =
                        prev.is_some_and(|p| p.saturating_add(JOURNAL_TIME_STEP_MS) <= cutoff);
                    return Ok(if step_done { a } else { bound });
                }
                bound = a;
                prev = Some(t);
            }
            after = last;
        }
    }

    /// When the row at `first` passes the age bound (see
    /// [`GroupView::aged_before`]), and the dated position to keep (the last
    /// at or before `first`: the dates before it are of trimmed rows).
    fn next_age_due(
        &mut self,
        first: Arrival,
        age_ms_max: u64,
    ) -> Result<(Option<u64>, Arrival), Fail> {
        let mut at_or_before: Option<(Arrival, u64)> = None;
        let mut next: Option<u64> = None;
        let mut after = 0;
        'scan: loop {
            let times = self.base.journal_times(after, TRIM_READ_ROWS)?;
            let Some(&(last, _)) = times.last() else {
                break;
            };
            for (a, t) in times {
                if a > first {
                    next = Some(t);
                    break 'scan;
                }
                at_or_before = Some((a, t));
            }
            after = last;
        }
        let keep = at_or_before.map_or(first, |(a, _)| a);
        if age_ms_max == 0 || first > self.counters.journal_head {
            return Ok((None, keep));
        }
        let written_by = match (at_or_before, next) {
            (Some((_, t)), Some(_)) => t.saturating_add(JOURNAL_TIME_STEP_MS),
            (None, Some(t)) => t,
            (_, None) => self.counters.last_write_ms,
        };
        Ok((Some(written_by.saturating_add(age_ms_max)), keep))
    }

    /// Before the journal row holding envelopes `first_seq..first_seq + n`
    /// of `stream` goes: if `stream` is an own stream, its outbox batches
    /// that hold them lose their payloads with the row — so an acknowledged
    /// one (then the oldest retained) is evicted, and an unacknowledged
    /// one gets its payloads copied into the outbox. Returns whether it is
    /// an own stream (or one held to relay).
    fn free_for_trim(&mut self, stream: &StreamId, first_seq: Seq, n: u64) -> Result<bool, Fail> {
        let Some(mut own) = self.own_stream(stream)? else {
            return Ok(false);
        };
        let last_seq = first_seq + n - 1;
        if last_seq < own.first_retained {
            return Ok(true);
        }
        // Batches are contiguous from the first retained one.
        let start = first_seq.max(own.first_retained);
        let mut at = if start == own.first_retained {
            start
        } else {
            self.base
                .batch_holding(stream, start)?
                .map_or(start, |(b, _)| b.max(own.first_retained))
        };
        let mut changed = false;
        while at <= last_seq && at < own.next_seq {
            let meta = self.meta_at(&own, at)?;
            if at == own.first_retained && own.evictable_msgs > 0 {
                self.evict_oldest(&mut own)?;
                changed = true;
            } else if !self.batch_moved(stream, at)? {
                let first_arrival = self.batch_first_arrival(&own, at)?;
                self.writes.push(Write::MovePayloads {
                    stream: stream.clone(),
                    first_seq: at,
                    first_arrival,
                    n: meta.msgs,
                });
                self.moved.insert((stream.clone(), at));
            }
            at = meta.last_seq + 1;
        }
        if changed {
            self.set_own(own);
        }
        Ok(true)
    }

    fn batch_first_arrival(&mut self, own: &OwnStream, first_seq: Seq) -> Result<Arrival, Fail> {
        match self.base.batch_first_arrival(&own.stream, first_seq)? {
            Some(a) if a > 0 => Ok(a),
            _ => Err(self.corrupt(format!(
                "the outbox batch of {:?} at {first_seq} has no journal position",
                own.stream
            ))),
        }
    }
}
