//! Supersede: a keyed agent message replaces an earlier one of the same
//! sender, recipient and key that still waits to be sent.
//!
//! Two places a message waits. Held (or merely waiting for the next commit):
//! the older send is committed as a tombstone at its own seq, in the same
//! commit as the newer one, and its sender is answered `superseded`.
//! Queued (committed, never handed to a connection): a keyed message is
//! always the only envelope of its batch, so the author re-signs a
//! tombstone alone at that seq, with the message's clocks, and the store
//! replaces the outbox batch in the commit that appends the newer one
//! (`WriteOp::Supersede`, which checks that the newer one is appended and
//! the older one unacknowledged). Either way the peer receives the
//! tombstone at the message's seq: the stream stays dense, and the
//! recipient is told what it will never get, and why.
//!
//! What may have reached the peer is never replaced: anything handed to a
//! connection in this process's life or committed before it started, and
//! nothing while a read of the peer's outbox is in flight (it could bring
//! back the batch being replaced); the feed reads nothing until the commit
//! has returned.

use std::collections::BTreeMap;

use mesh_protocol::{
    AgentName, KIND_TOMBSTONE, MsgId, NewEnvelope, NodeId, OpenBatch, Seq, SupersedeKey, Tombstone,
    TombstoneReason,
};
use mesh_store::{AgentOp, WriteOp};

use super::{AgentMsg, Tracked};
use crate::core::Core;
use crate::core::commit::{Batch, Group, WaitingSend};

/// The most keyed messages remembered as replaceable (each a few hundred
/// bytes at most): past it, a new one is not remembered, and a later send
/// with its key does not replace it (it is sent; nothing is lost).
pub(in crate::core) const KEYED_MAX: usize = 16_384;

/// Who a keyed message is from and to, and its key: what a later message
/// must share to replace it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::core) struct Slot {
    to: NodeId,
    from: AgentName,
    to_agent: Option<AgentName>,
    key: SupersedeKey,
}

/// A keyed message committed in this process's life: where it is, and the
/// clocks its tombstone keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Queued {
    epoch: mesh_protocol::Epoch,
    seq: Seq,
    lamport: u64,
    created_ms: u64,
}

/// The newest keyed message per slot.
#[derive(Debug, Default)]
pub(in crate::core) struct Keyed {
    by_slot: BTreeMap<Slot, Queued>,
}

/// A queued message to replace: its place, and the send replacing it.
#[derive(Debug)]
pub(in crate::core) struct Replace {
    slot: Slot,
    old: Queued,
    by_seq: Seq,
}

impl AgentMsg {
    fn slot(&self, to: NodeId) -> Option<Slot> {
        let key = self.key.clone()?;
        Some(Slot {
            to,
            from: self.from.clone(),
            to_agent: self.to.clone(),
            key,
        })
    }

    /// Makes the send `payload` belongs to the tombstone of itself, naming
    /// `by` (its id is stamped when it is signed, as a message's is).
    fn tombstone(&mut self, by: MsgId, kind: &mut u16, payload: &mut Vec<u8>) {
        let Some(key) = self.key.clone() else {
            return;
        };
        let tomb = Tombstone {
            id: MsgId([0; 16]),
            from: self.from.clone(),
            to: self.to.clone(),
            key,
            reason: TombstoneReason::Superseded { by },
        }
        .encode();
        let message = std::mem::replace(payload, tomb);
        self.original.get_or_insert((*kind, message));
        *kind = KIND_TOMBSTONE;
        self.superseded_by = Some(by);
    }

    /// Undoes [`AgentMsg::tombstone`]: the send is its message again (a
    /// commit that failed is planned anew, and the send that superseded it
    /// may since have been let go).
    fn restore(&mut self, kind: &mut u16, payload: &mut Vec<u8>) {
        if let Some((k, p)) = self.original.take() {
            *kind = k;
            *payload = p;
        }
        self.superseded_by = None;
    }
}

impl Tracked {
    /// The message that superseded this send, if one did.
    pub(in crate::core) fn superseded_by(&self) -> Option<MsgId> {
        self.agent.as_ref()?.superseded_by
    }
}

impl WaitingSend {
    /// The slot of a keyed agent message.
    pub(in crate::core) fn slot(&self) -> Option<Slot> {
        self.tracked.as_deref()?.agent.as_ref()?.slot(self.to)
    }

    /// Whether it is a keyed agent message (what [`WaitingSend::slot`]
    /// answers, without making the slot).
    pub(in crate::core) fn is_keyed(&self) -> bool {
        self.tracked
            .as_deref()
            .and_then(|t| t.agent.as_ref())
            .is_some_and(|a| a.key.is_some())
    }
}

impl Core {
    /// Supersede among `sends`, the sends to `to` its outbox takes in the
    /// commit being built, from `next_seq` on: every keyed send but the
    /// last of its slot becomes its tombstone, and the queued message the
    /// last one replaces, if any may be, is returned.
    pub(in crate::core) fn plan_supersede(
        &mut self,
        to: NodeId,
        next_seq: Seq,
        sends: &mut [WaitingSend],
    ) -> Vec<Replace> {
        let mut last: BTreeMap<Slot, usize> = BTreeMap::new();
        for (i, s) in sends.iter().enumerate() {
            if let Some(slot) = s.slot() {
                last.insert(slot, i);
            }
        }
        if last.is_empty() {
            return Vec::new();
        }
        let tag = MsgId::stream_tag(&self.me, self.epoch(), &to);
        for (i, s) in sends.iter_mut().enumerate() {
            let Some(slot) = s.slot() else { continue };
            let j = last[&slot];
            let Some(a) = s.tracked.as_deref_mut().and_then(|t| t.agent.as_mut()) else {
                continue;
            };
            a.restore(&mut s.kind, &mut s.payload);
            if j != i {
                let by = MsgId::in_stream(tag, next_seq + j as u64);
                a.tombstone(by, &mut s.kind, &mut s.payload);
            }
        }
        let own = self.author.own_view(to);
        let epoch = self.epoch();
        let mut replace = Vec::new();
        for (slot, j) in last {
            let Some(old) = self.agents.keyed.by_slot.remove(&slot) else {
                continue;
            };
            let queued = old.epoch == epoch
                && old.seq >= own.first_retained
                && old.seq > own.last_acked
                && old.seq < own.next_seq;
            if queued && self.author.may_replace(to, old.seq) {
                replace.push(Replace {
                    slot,
                    old,
                    by_seq: next_seq + j as u64,
                });
            }
        }
        replace
    }

    /// Adds the group that replaces the queued message `r` with its
    /// tombstone to `batch` (after the group appending its replacement).
    pub(in crate::core) fn build_replace(&mut self, batch: &mut Batch, r: Replace) {
        let to = r.slot.to;
        let tag = MsgId::stream_tag(&self.me, self.epoch(), &to);
        let id = MsgId::in_stream(tag, r.old.seq);
        let by = MsgId::in_stream(tag, r.by_seq);
        let payload = Tombstone {
            id,
            from: r.slot.from,
            to: r.slot.to_agent,
            key: r.slot.key,
            reason: TombstoneReason::Superseded { by },
        }
        .encode();
        let envelope = NewEnvelope {
            lamport: r.old.lamport,
            created_ms: r.old.created_ms,
            kind: KIND_TOMBSTONE,
            payload,
        };
        let Ok(signed) = self.author.sign_in_place(to, r.old.seq, envelope) else {
            // A tombstone is far below every limit a message was within.
            debug_assert!(false, "a tombstone always signs");
            return;
        };
        self.author.replacing(to);
        let ops = vec![
            WriteOp::Supersede {
                batch: signed,
                by: r.by_seq,
            },
            WriteOp::Agents(AgentOp::Superseded { id, by }),
        ];
        batch.push(ops, Group::Supersede { to });
    }

    /// Remembers the keyed messages of an own batch to `to` just committed
    /// (not the tombstones): a later send with one's key may replace it.
    pub(in crate::core) fn note_keyed(
        &mut self,
        to: NodeId,
        batch: &OpenBatch,
        tracked: &[Option<Box<Tracked>>],
    ) {
        if to == self.me {
            return;
        }
        let vb = batch.batch();
        let epoch = vb.stream().epoch;
        for (i, (h, t)) in vb.entries().iter().zip(tracked).enumerate() {
            let Some(a) = t.as_deref().and_then(|t| t.agent.as_ref()) else {
                continue;
            };
            if a.superseded_by.is_some() {
                continue;
            }
            let Some(slot) = a.slot(to) else { continue };
            let keyed = &mut self.agents.keyed.by_slot;
            if keyed.len() >= KEYED_MAX && !keyed.contains_key(&slot) {
                // Forget the ones that went out since: they are the peer's.
                let author = &self.author;
                keyed.retain(|s, q| q.epoch == epoch && q.seq > author.sent_upto(s.to));
                if keyed.len() >= KEYED_MAX {
                    continue;
                }
            }
            keyed.insert(
                slot,
                Queued {
                    epoch,
                    seq: vb.first_seq() + i as u64,
                    lamport: h.lamport,
                    created_ms: h.created_ms,
                },
            );
        }
    }

    /// A replacing group's commit returned.
    pub(in crate::core) fn on_replace_committed(&mut self, ok: bool) {
        if ok {
            self.out.metrics.agents.superseded += 1;
        } else {
            self.out.metrics.agents.supersede_refused += 1;
        }
    }
}
