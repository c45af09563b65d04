//! Epochs: ending the own streams of an earlier epoch of this store,
//! reporting what was rolled back, and carrying unacknowledged sends over.

use mesh_protocol::{Epoch, Seq, StreamId};

use super::{Base, Fail, GroupView, Write, check_detail, refuse};
use crate::{EndedOwn, JournalRecord, OwnStream};

impl<B: Base> GroupView<'_, B> {
    /// Ends every own stream of the current epoch and switches to `epoch`.
    pub(super) fn new_epoch(&mut self, epoch: Epoch) -> Result<(), Fail> {
        let old = self.counters.epoch;
        if epoch == old {
            return refuse(format!(
                "the store is in epoch {} already",
                epoch.fmt_short()
            ));
        }
        let mut streams = self.base.own_streams()?;
        streams
            .retain(|o| !self.own.contains_key(&o.stream) && !self.own_dropped.contains(&o.stream));
        streams.extend(self.own.values().cloned());
        if streams.iter().any(|o| o.stream.epoch == epoch) {
            return refuse(format!("epoch {} was written before", epoch.fmt_short()));
        }
        // A topic's stream of the old epoch stays as it is: its batches are
        // still relayed to members that lack them, and nothing is carried.
        let direct = |o: &OwnStream| matches!(o.stream.channel, mesh_protocol::Channel::Direct(_));
        for own in streams
            .into_iter()
            .filter(|o| o.stream.epoch == old && direct(o))
        {
            // Only what the peer acknowledged is known to be as it has it.
            let ended = EndedOwn {
                stream: own.stream.clone(),
                held: own.last_acked,
                reported: own.last_acked,
                carried: own.last_acked,
            };
            if own.last_acked + 1 >= own.next_seq {
                self.drop_outbox(&own.stream);
            }
            self.set_ended(ended);
        }
        self.counters.epoch = epoch;
        self.writes.push(Write::Epoch(epoch));
        Ok(())
    }

    /// Removes the outbox and the row of the own stream `stream`.
    pub(super) fn drop_outbox(&mut self, stream: &StreamId) {
        self.own.remove(stream);
        self.own_changed.retain(|s| s != stream);
        self.own_dropped.insert(stream.clone());
        self.batches.retain(|(s, _), _| s != stream);
        self.moved.retain(|(s, _)| s != stream);
        self.writes.push(Write::DropOutbox(stream.clone()));
        self.writes.push(Write::DelOwn(stream.clone()));
    }

    pub(super) fn ended_or_refuse(&mut self, stream: &StreamId) -> Result<EndedOwn, Fail> {
        match self.ended(stream)? {
            Some(e) => Ok(e),
            None => refuse(format!("{stream:?} is not an ended own stream")),
        }
    }

    /// Drops the outbox of the ended own stream `stream`: nothing is left to carry.
    pub(super) fn drop_ended(&mut self, stream: StreamId) -> Result<(), Fail> {
        let mut e = self.ended_or_refuse(&stream)?;
        if self.own_stream(&stream)?.is_some() {
            self.drop_outbox(&stream);
        }
        e.carried = e.carried.max(e.held);
        self.set_ended(e);
        Ok(())
    }

    pub(super) fn report_rolled_back(
        &mut self,
        stream: StreamId,
        held: Seq,
        world: Seq,
        detail: String,
    ) -> Result<(), Fail> {
        check_detail(&detail)?;
        let mut e = match self.ended(&stream)? {
            Some(e) => e,
            // A topic stream of an earlier epoch is not ended by the new
            // epoch (it is still relayed) and carries nothing: it ends here,
            // as held, once a member shows it more of it.
            None if is_topic(&stream) && stream.epoch != self.counters.epoch => {
                let end = self
                    .own_stream(&stream)?
                    .map_or(0, |o| o.next_seq.saturating_sub(1));
                EndedOwn {
                    stream: stream.clone(),
                    held: end,
                    reported: end,
                    carried: end,
                }
            }
            None => return refuse(format!("{stream:?} is not an ended own stream")),
        };
        let held = e.held.min(held);
        if e.reported == e.held {
            // Nothing reported yet: the report starts after what is held.
            e.reported = held;
        }
        e.held = held;
        if world > e.reported {
            self.journal(JournalRecord::RolledBack {
                stream,
                from: e.reported + 1,
                to: world,
                detail,
            });
            e.reported = world;
        }
        self.set_ended(e);
        Ok(())
    }

    pub(super) fn carry_over(
        &mut self,
        batch: mesh_protocol::OpenBatch,
        from: StreamId,
        upto: Seq,
    ) -> Result<(), Fail> {
        let mut e = self.ended_or_refuse(&from)?;
        let Some(old) = self.own_stream(&from)? else {
            return refuse(format!("{from:?} has no outbox left to carry"));
        };
        if upto <= e.carried || upto >= old.next_seq {
            return refuse(format!(
                "carry of {from:?} up to {upto}, but it is carried to {} and ends at {}",
                e.carried,
                old.next_seq - 1
            ));
        }
        let (vb, payloads) = batch.into_parts();
        let stream = vb.stream().clone();
        let own = self.append_target(&stream, vb.first_seq())?;
        for h in vb.entries() {
            self.lamport(h.lamport);
        }
        let first_seq = vb.first_seq();
        self.writes.push(Write::PutPayloads {
            stream: stream.clone(),
            first_seq,
            payloads,
        });
        self.moved.insert((stream, first_seq));
        self.append_batch(own, vb.into_signed(), 0);
        e.carried = upto;
        if upto + 1 == old.next_seq {
            self.drop_outbox(&from);
        }
        self.set_ended(e);
        Ok(())
    }
}

fn is_topic(stream: &StreamId) -> bool {
    matches!(stream.channel, mesh_protocol::Channel::Topic(_))
}
