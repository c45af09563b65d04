//! The receiver side: accepting a peer's batch after the mark, and a gap
//! where the peer no longer has what comes after it.

use mesh_protocol::{Seq, StreamId};

use super::{Base, Fail, GroupView, refuse};
use crate::JournalRecord;

impl<B: Base> GroupView<'_, B> {
    pub(super) fn accept(
        &mut self,
        batch: mesh_protocol::OpenBatch,
        from: Seq,
    ) -> Result<(), Fail> {
        let (vb, payloads) = batch.into_parts();
        let stream = vb.stream().clone();
        if from < vb.first_seq() || from > vb.last_seq() {
            return refuse(format!(
                "accept of {stream:?} from seq {from}, outside the batch {}..={}",
                vb.first_seq(),
                vb.last_seq()
            ));
        }
        let mark = self.mark(&stream)?;
        if mark != from - 1 {
            return refuse(format!(
                "accept of {stream:?} from seq {from}, but the mark is {mark}"
            ));
        }
        let skip = usize::try_from(from - vb.first_seq()).unwrap_or(usize::MAX);
        let last_cid = vb.entries().last().map(|h| h.payload_cid);
        for (i, (h, p)) in vb.entries().iter().zip(payloads).enumerate().skip(skip) {
            self.lamport(h.lamport);
            self.journal(JournalRecord::Envelope {
                stream: stream.clone(),
                seq: vb.first_seq() + i as u64,
                lamport: h.lamport,
                created_ms: h.created_ms,
                kind: h.kind,
                payload: p,
            });
        }
        let last = vb.last_seq();
        self.marks.insert(stream.clone(), last);
        self.mark_cids.insert(stream, last_cid);
        Ok(())
    }

    pub(super) fn gap(&mut self, stream: StreamId, earliest_available: Seq) -> Result<(), Fail> {
        let mark = self.mark(&stream)?;
        if earliest_available <= mark.saturating_add(1) {
            return refuse(format!(
                "gap of {stream:?} up to earliest available seq {earliest_available}, \
                 but the mark is already {mark}"
            ));
        }
        let to = earliest_available - 1;
        self.journal(JournalRecord::Gap {
            stream: stream.clone(),
            from: mark + 1,
            to,
        });
        self.marks.insert(stream.clone(), to);
        self.mark_cids.insert(stream.clone(), None);
        self.topic_gap(&stream, earliest_available)
    }
}
