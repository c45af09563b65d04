//! Topics: membership, and keeping other members' batches to relay them.
//!
//! A topic's stream of another author is held like an own stream's outbox:
//! whole signed batches under an `OwnStream` row, contiguous from its
//! `first_retained`, so that `read_outbox`, eviction and journal trimming
//! work on it unchanged. Its `last_acked` stays one below `next_seq`: every
//! held batch may go without a loss record (this node journaled it; a
//! member that still lacks it is told of a gap by this node, and may find
//! it at another member).

use mesh_protocol::{Channel, OpenBatch, Seq, StreamId, TopicName};

use super::{Base, Fail, GroupView, Write, refuse};
use crate::{Eviction, OwnStream, TOPICS_MAX, TopicRecord};

impl<B: Base> GroupView<'_, B> {
    /// The topic `name`'s record, as this group left it.
    fn topic(&mut self, name: &TopicName) -> Result<Option<TopicRecord>, Fail> {
        if let Some(t) = self.topics.get(name) {
            return Ok(t.clone());
        }
        Ok(self.base.topics()?.into_iter().find(|t| t.name == *name))
    }

    pub(super) fn join_topic(&mut self, record: TopicRecord) -> Result<(), Fail> {
        if record.max_msgs == 0 || record.max_bytes == 0 {
            return refuse(format!(
                "topic {} would hold {} msgs / {} bytes of each author: both must be at least 1",
                record.name, record.max_msgs, record.max_bytes
            ));
        }
        if self.topic(&record.name)?.is_none() {
            let mut names: Vec<TopicName> =
                self.base.topics()?.into_iter().map(|t| t.name).collect();
            for (name, t) in &self.topics {
                names.retain(|n| n != name);
                if t.is_some() {
                    names.push(name.clone());
                }
            }
            if names.len() >= TOPICS_MAX {
                return refuse(format!(
                    "this node is a member of {} topics already, the most it may be",
                    names.len()
                ));
            }
        }
        self.topics
            .insert(record.name.clone(), Some(record.clone()));
        self.writes.push(Write::PutTopic(record));
        Ok(())
    }

    pub(super) fn leave_topic(&mut self, topic: TopicName) -> Result<(), Fail> {
        if self.topic(&topic)?.is_none() {
            return refuse(format!("this node is not a member of topic {topic}"));
        }
        self.topics.insert(topic.clone(), None);
        self.writes.push(Write::DelTopic(topic));
        Ok(())
    }

    /// Accepts a member's topic batch and keeps it as signed, to relay it
    /// (see [`crate::WriteOp::AcceptTopic`]).
    pub(super) fn accept_topic(
        &mut self,
        batch: OpenBatch,
        from: Seq,
        evict: Option<Eviction>,
    ) -> Result<(), Fail> {
        let stream = batch.batch().stream().clone();
        let Channel::Topic(topic) = &stream.channel else {
            return refuse(format!("topic accept of {stream:?}, which is no topic's"));
        };
        if stream.epoch == self.counters.epoch {
            return refuse(format!(
                "topic accept of {stream:?}, a stream of this store's own epoch"
            ));
        }
        if self.topic(topic)?.is_none() {
            return refuse(format!(
                "topic accept of {stream:?}, but this node is not a member of topic {topic}"
            ));
        }
        let first_seq = batch.batch().first_seq();
        // Its payloads are in the journal from here if it is journaled whole.
        let first_arrival = self.counters.journal_head + 1;
        let kept = (from > first_seq).then(|| batch.payloads().to_vec());
        let signed = batch.batch().signed().clone();
        self.accept(batch, from)?;
        let mut held = match self.own_stream(&stream)? {
            // Held batches are contiguous: one that does not follow them
            // (after a gap) starts what is held afresh.
            Some(o) if o.next_seq == first_seq => o,
            Some(_) => {
                self.drop_outbox(&stream);
                relay_row(stream.clone(), first_seq)
            }
            None => relay_row(stream.clone(), first_seq),
        };
        if let Some(evict) = evict {
            // Everything held may go: no loss record, whatever `evict` says.
            self.make_room(
                &mut held,
                Eviction {
                    loss: None,
                    ..evict
                },
            )?;
        }
        if let Some(payloads) = kept {
            self.writes.push(Write::PutPayloads {
                stream: stream.clone(),
                first_seq,
                payloads,
            });
            self.moved.insert((stream.clone(), first_seq));
        }
        let arrival = if self.moved.contains(&(stream.clone(), first_seq)) {
            0
        } else {
            first_arrival
        };
        self.append_batch(held, signed, arrival);
        let mut held = self
            .own
            .get(&stream)
            .cloned()
            .ok_or_else(|| self.corrupt(format!("the held row of {stream:?} went missing")))?;
        all_evictable(&mut held);
        self.set_own(held);
        Ok(())
    }

    /// After a gap in another member's topic stream: what is held of it
    /// ends below the gap, so it starts afresh at `earliest_available`.
    pub(super) fn topic_gap(
        &mut self,
        stream: &StreamId,
        earliest_available: Seq,
    ) -> Result<(), Fail> {
        if !matches!(stream.channel, Channel::Topic(_)) || stream.epoch == self.counters.epoch {
            return Ok(());
        }
        if self.own_stream(stream)?.is_some() {
            self.drop_outbox(stream);
            self.set_own(relay_row(stream.clone(), earliest_available));
        }
        Ok(())
    }
}

/// An empty held row of another member's stream whose next batch starts at `next`.
fn relay_row(stream: StreamId, next: Seq) -> OwnStream {
    OwnStream {
        next_seq: next,
        first_retained: next,
        last_acked: next - 1,
        ..OwnStream::empty(stream)
    }
}

/// Marks everything held of a relayed stream as free to go.
fn all_evictable(o: &mut OwnStream) {
    o.last_acked = o.next_seq - 1;
    o.evictable_msgs = o.msgs;
    o.evictable_bytes = o.bytes;
}
