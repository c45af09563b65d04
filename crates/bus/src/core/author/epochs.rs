//! Epochs: checking a peer's Hello mark, rollback reports, the epoch switch, the carry-over.

use mesh_protocol::{Channel, Epoch, Mark, NewEnvelope, NodeId, Seq, StreamId};
use mesh_store::{EndedOwn, StoreError, StoredBatch};

use super::{Author, HelloCheck, Loaded};
use crate::core::commit::{CarryWork, Report};
use crate::core::{Config, Effect, LoadId, Out};

impl Author {
    /// Checks a peer's Hello mark for our current stream to it (`None`: it
    /// names none) against what is committed.
    pub(in crate::core) fn check_hello(&self, peer: NodeId, mark: Option<&Mark>) -> HelloCheck {
        let Some(mark) = mark.filter(|m| m.seq > 0) else {
            return HelloCheck::Trust(0);
        };
        let own = self.own_view(peer);
        if mark.seq >= own.next_seq {
            return HelloCheck::RolledBack { mark: mark.seq };
        }
        match mark.cid {
            // A batch evicted is one the peer acknowledged (or a loss it
            // was told of): nothing left to compare.
            Some(cid) if mark.seq >= own.first_retained => HelloCheck::Verify {
                mark: mark.seq,
                cid,
            },
            _ => HelloCheck::Trust(mark.seq),
        }
    }

    /// The ended streams to `peer` it holds more of than this store does:
    /// what to journal as rolled back and tell it (a `StreamEnded` frame).
    pub(in crate::core) fn ended_reports(&self, peer: NodeId, marks: &[Mark]) -> Vec<Report> {
        marks
            .iter()
            .filter_map(|m| {
                let e = self.ended.get(&m.stream)?;
                (m.stream.channel == Channel::Direct(peer) && m.seq > e.held).then(|| Report {
                    stream: m.stream.clone(),
                    held: e.held,
                    world: m.seq,
                    detail: rolled_back_detail(peer, e.held, m.seq, None),
                })
            })
            .collect()
    }

    /// The report of our current stream to `peer`, which holds it up to
    /// `world`: the store holds it as the peer has it only up to its acked
    /// mark; a new epoch `epoch` takes over.
    pub(in crate::core) fn current_report(&self, peer: NodeId, world: Seq, epoch: Epoch) -> Report {
        let own = self.own_view(peer);
        Report {
            stream: own.stream.clone(),
            held: own.last_acked,
            world,
            detail: rolled_back_detail(peer, own.last_acked, world, Some(epoch)),
        }
    }

    /// Stops every feed: a new epoch is under way, and nothing more goes
    /// out on the old streams.
    pub(in crate::core) fn freeze(&mut self) {
        self.frozen = true;
        let peers: Vec<NodeId> = self.feeds.keys().copied().collect();
        for p in peers {
            self.drop_feed(p);
        }
    }

    /// Whether a new epoch is under way.
    pub(in crate::core) fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// The new epoch `epoch` is committed: the current streams are ended
    /// (`ended` from the store), those with envelopes left to carry keep
    /// their outbox for it, and the new epoch's streams start empty.
    pub(in crate::core) fn switched(&mut self, epoch: Epoch, ended: &[EndedOwn]) {
        for e in ended {
            self.ended.insert(e.stream.clone(), e.clone());
        }
        for (_, o) in std::mem::take(&mut self.own) {
            if o.last_acked + 1 < o.next_seq {
                self.old.insert(o.stream.clone(), o);
            }
        }
        self.epoch = epoch;
        self.frozen = false;
        self.carry_load = None;
        // The new streams start empty: nothing of them went out yet.
        self.sent.clear();
    }

    /// Ended streams changed by a commit (carried on, reported).
    pub(in crate::core) fn ended_changed(&mut self, ended: &[EndedOwn]) {
        for e in ended {
            self.ended.insert(e.stream.clone(), e.clone());
        }
    }

    /// The envelopes of ended streams to `peer` still to be carried over.
    pub(in crate::core) fn to_carry(&self, peer: NodeId) -> u64 {
        self.old
            .iter()
            .filter(|(s, _)| s.channel == Channel::Direct(peer))
            .map(|(s, o)| {
                let carried = self.ended.get(s).map_or(o.last_acked, |e| e.carried);
                let after = carried
                    .max(o.last_acked)
                    .max(o.first_retained.saturating_sub(1));
                o.next_seq.saturating_sub(1).saturating_sub(after)
            })
            .sum()
    }

    /// Whether envelopes of ended streams are still to be carried over
    /// (new sends wait until they are, so they come after them).
    pub(in crate::core) fn has_carry(&self) -> bool {
        self.frozen || !self.old.is_empty()
    }

    /// Reads the next envelopes to carry over, unless a read is under way:
    /// the oldest ended stream's, after what is carried.
    pub(in crate::core) fn next_carry(&mut self, config: &Config, out: &mut Out) {
        if self.frozen || self.carry_load.is_some() {
            return;
        }
        let Some((stream, o)) = self.old.iter().next() else {
            return;
        };
        let carried = self.ended.get(stream).map_or(o.last_acked, |e| e.carried);
        let after = carried.max(o.first_retained.saturating_sub(1));
        let load = LoadId(self.next_load);
        self.next_load += 1;
        self.carry_load = Some((load, stream.clone()));
        out.metrics.loads += 1;
        let Channel::Direct(peer) = stream.channel else {
            return;
        };
        out.push(Effect::LoadOutbox {
            load,
            peer,
            stream: stream.clone(),
            after,
            max_bytes: config.catchup_chunk_bytes,
        });
    }

    /// A carry-over chunk committed (`Ok`) or not: the next may be read.
    pub(in crate::core) fn carry_done(&mut self, from: &StreamId, upto: Seq, ok: bool) {
        if ok
            && let Some(o) = self.old.get(from)
            && upto + 1 >= o.next_seq
        {
            self.old.remove(from);
        }
    }

    /// Turns a carry-over read into the envelopes to re-sign, those after
    /// what is carried of `stream`.
    pub(super) fn carry_loaded(
        &mut self,
        stream: StreamId,
        result: Result<Vec<StoredBatch>, StoreError>,
        out: &mut Out,
    ) -> Loaded {
        let Ok(batches) = result else {
            out.metrics.load_failures += 1;
            return Loaded::Done;
        };
        let Some(o) = self.old.get(&stream) else {
            return Loaded::Done;
        };
        let carried = self.ended.get(&stream).map_or(o.last_acked, |e| e.carried);
        let Channel::Direct(to) = stream.channel else {
            return Loaded::Done;
        };
        let mut envelopes = Vec::new();
        for sb in batches {
            for (i, (h, p)) in sb.batch.entries.iter().zip(sb.payloads).enumerate() {
                let seq = sb.batch.first_seq + i as u64;
                if seq > carried {
                    envelopes.push((
                        seq,
                        NewEnvelope {
                            lamport: 0,
                            created_ms: h.created_ms,
                            kind: h.kind,
                            payload: p,
                        },
                    ));
                }
            }
        }
        // Empty: nothing retained past what is carried (evicted under
        // evict-oldest, with its loss record); the ended outbox just goes.
        Loaded::Carry(CarryWork {
            from: stream,
            to,
            envelopes,
        })
    }
}

/// The sentence of a rolled-back stream's record, for a person.
fn rolled_back_detail(peer: NodeId, held: Seq, world: Seq, new: Option<Epoch>) -> String {
    let mut d = format!(
        "this node's store went back in time (a restored backup, or a copy run as a second \
         node): peer {} holds this stream up to seq {world}, but this store holds it as the \
         peer has it only up to {held}",
        peer.fmt_short()
    );
    if let Some(e) = new {
        d.push_str(&format!(
            "; it started store epoch {}, and re-sends what the peer never acknowledged \
             there from seq 1",
            e.fmt_short()
        ));
    }
    d
}
