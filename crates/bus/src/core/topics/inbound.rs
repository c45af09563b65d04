//! Other members' topic batches and gaps this node receives: queued for a
//! commit when they follow what it holds, and the marks that move when
//! they are committed.

use mesh_protocol::{Frame, NodeId, OpenBatch, Seq, StreamId};
use mesh_store::OwnStream;

use super::{Topics, room, topic_of};
use crate::core::commit::{InboundQueue, InboundWork};
use crate::core::{ConnId, DropReason, Out};

impl Topics {
    /// A member's topic batch from `peer`: queued for the next commit if it
    /// follows the pending mark, a counted duplicate if it is old, and
    /// asked for again from `peer` if it is early.
    pub(in crate::core) fn on_batch(
        &mut self,
        peer: NodeId,
        conn: ConnId,
        open: OpenBatch,
        queue: &mut InboundQueue,
        out: &mut Out,
    ) {
        let stream = open.batch().stream().clone();
        let Some(topic) = topic_of(&stream).cloned() else {
            return;
        };
        let Some(record) = self.joined.get(&topic) else {
            out.drop(DropReason::NotAMember);
            return;
        };
        let (first, last) = (open.batch().first_seq(), open.batch().last_seq());
        // The sender has it up to `last`: nothing of it goes back.
        if let Some(feed) = self.feeds.get_mut(&(stream.clone(), peer)) {
            feed.cursor = feed.cursor.max(last);
        }
        if stream.author == self.me {
            out.drop(DropReason::Duplicate);
            return;
        }
        if self.is_full(&stream, &topic) {
            out.drop(DropReason::TopicStreamsFull);
            return;
        }
        let marks = self.marks.entry(stream.clone()).or_default();
        if last <= marks.pending {
            out.drop(DropReason::Duplicate);
            out.metrics.duplicate_envelopes += last - first + 1;
            return;
        }
        if first > marks.pending + 1 {
            out.drop(DropReason::OutsideWindow);
            let after = marks.pending;
            let key = (stream.clone(), peer);
            if self.asked.get(&key) != Some(&after) {
                self.asked.insert(key, after);
                out.send(peer, conn, Frame::Resync { stream, after });
            }
            return;
        }
        let bytes = open.batch().payload_bytes();
        if !queue.has_room(bytes) {
            out.drop(DropReason::QueueFull);
            // Asked again once a commit empties the queue: by the next batch.
            return;
        }
        let from = marks.pending + 1;
        marks.pending = last;
        let evict = Some(room(record, &open));
        out.metrics.topics.batches_accepted += 1;
        queue.push(InboundWork::TopicAccept {
            peer,
            from,
            batch: open,
            evict,
        });
    }

    /// The member that relayed a batch no longer holds what `stream` lacks
    /// before `earliest`: the gap is queued for the next commit.
    pub(in crate::core) fn on_resync_gap(
        &mut self,
        stream: StreamId,
        earliest: Seq,
        queue: &mut InboundQueue,
        out: &mut Out,
    ) {
        let Some(topic) = topic_of(&stream) else {
            return;
        };
        if !self.joined.contains_key(topic) || stream.author == self.me {
            out.drop(DropReason::UnknownStream);
            return;
        }
        if self.is_full(&stream, topic) {
            out.drop(DropReason::TopicStreamsFull);
            return;
        }
        let marks = self.marks.entry(stream.clone()).or_default();
        if earliest <= marks.pending + 1 || !queue.has_room(0) {
            return;
        }
        marks.pending = earliest - 1;
        queue.push(InboundWork::TopicGap { stream, earliest });
    }

    /// The author `peer`, now writing store epoch `epoch`, says its topic
    /// `stream` of an earlier epoch ended with `held` as its store has it:
    /// what this node holds of it past that, the author's store lost, and
    /// that is journaled (once per range). A member's mark of a stream is
    /// kept as long as the stream is (an ended one counts against
    /// [`super::TOPIC_STREAMS_MAX`] too: its batches are still held and
    /// relayed, and forgetting its mark would take them again).
    pub(in crate::core) fn on_stream_ended(
        &mut self,
        (peer, epoch): (NodeId, mesh_protocol::Epoch),
        stream: StreamId,
        held: Seq,
        queue: &mut InboundQueue,
        out: &mut Out,
    ) {
        let Some(topic) = topic_of(&stream) else {
            return;
        };
        if stream.author != peer {
            out.drop(DropReason::WrongAuthor);
            return;
        }
        if stream.epoch == epoch {
            // The author's current stream has not ended.
            out.drop(DropReason::UnknownStream);
            return;
        }
        if !self.joined.contains_key(topic) {
            return;
        }
        let committed = self.mark(&stream);
        let reported = self.rolled_back.get(&stream).copied().unwrap_or(0);
        let from = held.max(reported) + 1;
        if committed < from || !queue.has_room(0) {
            return;
        }
        self.rolled_back.insert(stream.clone(), committed);
        queue.push(InboundWork::RolledBack {
            stream,
            from,
            to: committed,
        });
    }

    /// A rolled-back record of `stream` from `from` did not commit: the
    /// author's next word queues it again.
    pub(in crate::core) fn rolled_back_unrecorded(&mut self, stream: &StreamId, from: Seq) {
        if let Some(r) = self.rolled_back.get_mut(stream) {
            *r = (*r).min(from.saturating_sub(1));
        }
    }

    /// A member's batch (or a gap) of `stream` up to `last` was committed
    /// (`ok`) or not: the marks move, or go back to what is committed.
    pub(in crate::core) fn committed_mark(&mut self, stream: &StreamId, last: Seq, ok: bool) {
        let Some(m) = self.marks.get_mut(stream) else {
            return;
        };
        if ok {
            m.committed = m.committed.max(last);
            self.asked.retain(|(s, _), _| s != stream);
        } else {
            m.pending = m.committed;
        }
    }

    /// A commit wrote these streams (only topic streams are taken).
    pub(in crate::core) fn committed(&mut self, streams: &[OwnStream]) {
        for o in streams {
            if topic_of(&o.stream).is_some() {
                self.held.insert(o.stream.clone(), o.clone());
            }
        }
    }
}
