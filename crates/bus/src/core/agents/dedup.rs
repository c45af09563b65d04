//! Retried sends: the records that answer a retry with its first send's receipt, within bounds.

use std::collections::{BTreeSet, HashMap};

use mesh_protocol::{AgentName, MsgId, NodeId};
use mesh_store::{AgentOp, DedupKey, WriteOp};

use crate::core::{Core, Millis, ReqId, SendError, SendReceipt};

/// The most retried-send records kept (within the window); past it the
/// oldest are forgotten early, and counted.
pub const DEDUP_ENTRIES_MAX: usize = 65_536;

/// The most bytes of retried-send records kept (estimated per record).
pub const DEDUP_BYTES_MAX: usize = 32 << 20;

/// The default of [`crate::core::Config::dedup_window_ms`]: 24 hours.
pub const DEDUP_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;

/// Bytes counted per retried-send record besides its key's text.
const DEDUP_ENTRY_OVERHEAD_BYTES: usize = 256;

/// One retried-send record.
#[derive(Debug)]
struct DedupEntry {
    at_ms: u64,
    digest: [u8; 16],
    state: DedupState,
}

#[derive(Debug)]
enum DedupState {
    /// The first send is waiting for its commit; these retries wait with it.
    Pending { waiters: Vec<ReqId> },
    /// The first send's receipt.
    Done(SendReceipt),
}

/// What [`Dedup::check`] says of a send with a client id.
pub(super) enum DedupCheck {
    /// The first of its key: send it.
    Fresh,
    /// A retry of a committed send: answer this.
    Answer(Result<SendReceipt, SendError>),
    /// A retry of a send still waiting: it gets the same answer.
    Waits,
}

/// Retried-send records in memory, mirrored in the store.
///
/// Invariants: `order` holds exactly the keys of `entries` with their
/// times; `bytes` is their estimated size; `by_req` names only pending
/// entries; within [`DEDUP_ENTRIES_MAX`] and [`DEDUP_BYTES_MAX`] but for
/// pending ones.
#[derive(Debug, Default)]
pub(super) struct Dedup {
    entries: HashMap<DedupKey, DedupEntry>,
    order: BTreeSet<(u64, DedupKey)>,
    bytes: usize,
    by_req: HashMap<ReqId, DedupKey>,
}

fn entry_bytes(key: &DedupKey) -> usize {
    key.client_id.len()
        + key.sender.as_ref().map_or(0, |s| s.as_str().len())
        + DEDUP_ENTRY_OVERHEAD_BYTES
}

impl Dedup {
    /// The records read back after a restart; `superseded` names the
    /// messages among them that a later one of their key replaced, and by
    /// what, so that a retry is answered as the first send was.
    pub(super) fn recover(
        records: Vec<mesh_store::DedupRecord>,
        superseded: &[(MsgId, MsgId)],
    ) -> Dedup {
        let by: HashMap<MsgId, MsgId> = superseded.iter().copied().collect();
        let mut d = Dedup::default();
        for r in records {
            let receipt = SendReceipt {
                superseded_by: r.msg.and_then(|id| by.get(&id).copied()),
                stream: r.stream,
                seq: r.seq,
                arrival: r.arrival,
            };
            d.insert(r.key, r.at_ms, r.digest, DedupState::Done(receipt));
        }
        d
    }

    fn insert(&mut self, key: DedupKey, at_ms: u64, digest: [u8; 16], state: DedupState) {
        self.bytes += entry_bytes(&key);
        self.order.insert((at_ms, key.clone()));
        let old = self.entries.insert(
            key,
            DedupEntry {
                at_ms,
                digest,
                state,
            },
        );
        debug_assert!(old.is_none(), "one record per key");
    }

    fn remove(&mut self, key: &DedupKey) -> Option<DedupEntry> {
        let e = self.entries.remove(key)?;
        self.order.remove(&(e.at_ms, key.clone()));
        self.bytes -= entry_bytes(key);
        Some(e)
    }

    pub(super) fn check(
        &mut self,
        req: ReqId,
        key: &DedupKey,
        digest: [u8; 16],
        now_ms: u64,
        forgotten: &mut Vec<AgentOp>,
    ) -> DedupCheck {
        if let Some(e) = self.entries.get_mut(key) {
            if e.digest != digest {
                return DedupCheck::Answer(Err(SendError::ClientIdReused {
                    client_id: key.client_id.clone(),
                }));
            }
            return match &mut e.state {
                DedupState::Done(receipt) => DedupCheck::Answer(Ok(receipt.clone())),
                DedupState::Pending { waiters } => {
                    waiters.push(req);
                    DedupCheck::Waits
                }
            };
        }
        // Make room: the oldest committed records go first, and are
        // forgotten in the store too (a retry of them would send again).
        while self.entries.len() >= DEDUP_ENTRIES_MAX || self.bytes > DEDUP_BYTES_MAX {
            let oldest = self
                .order
                .iter()
                .find(|(_, k)| {
                    matches!(
                        self.entries.get(k).map(|e| &e.state),
                        Some(DedupState::Done(_))
                    )
                })
                .cloned();
            let Some((at_ms, k)) = oldest else { break };
            self.remove(&k);
            forgotten.push(AgentOp::ForgetDedup { at_ms, key: k });
        }
        self.insert(
            key.clone(),
            now_ms,
            digest,
            DedupState::Pending {
                waiters: Vec::new(),
            },
        );
        self.by_req.insert(req, key.clone());
        DedupCheck::Fresh
    }

    /// The first send `req` was answered with `result`: the retries that
    /// waited for it. A refused first send leaves no record.
    pub(super) fn resolved(
        &mut self,
        req: ReqId,
        result: &Result<SendReceipt, SendError>,
    ) -> Vec<ReqId> {
        let Some(key) = self.by_req.remove(&req) else {
            return Vec::new();
        };
        let waiters = match self.entries.get_mut(&key) {
            Some(e) => match std::mem::replace(
                &mut e.state,
                DedupState::Pending {
                    waiters: Vec::new(),
                },
            ) {
                DedupState::Pending { waiters } => waiters,
                DedupState::Done(r) => {
                    e.state = DedupState::Done(r);
                    return Vec::new();
                }
            },
            None => return Vec::new(),
        };
        match result {
            Ok(receipt) => {
                if let Some(e) = self.entries.get_mut(&key) {
                    e.state = DedupState::Done(receipt.clone());
                }
            }
            Err(_) => {
                self.remove(&key);
            }
        }
        waiters
    }

    /// Drops the committed records taken before `before_ms`; whether any went.
    pub(super) fn expire(&mut self, before_ms: u64) -> bool {
        let mut any = false;
        while let Some((at_ms, key)) = self.order.first().cloned() {
            if at_ms >= before_ms {
                break;
            }
            if !matches!(
                self.entries.get(&key).map(|e| &e.state),
                Some(DedupState::Done(_))
            ) {
                break;
            }
            self.remove(&key);
            any = true;
        }
        any
    }
}

impl Core {
    /// The retried-send records to forget by now, as store ops for the
    /// next commit (checked at most once a second).
    pub(in crate::core) fn agent_housekeeping(&mut self, now: Millis) -> Vec<WriteOp> {
        if now.0 >= self.agents.expired_at.0.saturating_add(1_000) {
            self.agents.expired_at = now;
            let before_ms = now.0.saturating_sub(self.config.dedup_window_ms);
            if self.agents.dedup.expire(before_ms) {
                self.agents
                    .housekeeping
                    .push(AgentOp::ExpireDedup { before_ms });
            }
        }
        std::mem::take(&mut self.agents.housekeeping)
            .into_iter()
            .map(WriteOp::Agents)
            .collect()
    }
}

/// The digest that tells a retry from another message under the same id.
///
/// A send that asks for a read receipt is digested under a domain tag of
/// its own, so a retry that differs from the first only in asking one is
/// told apart, while the digest of every other send (and of every record
/// written before receipts) stays what it was.
pub(super) fn digest(
    to: NodeId,
    kind: u16,
    from: Option<&AgentName>,
    to_agent: Option<&AgentName>,
    in_reply_to: Option<MsgId>,
    receipt: bool,
    body: &[u8],
) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(if receipt {
        b"agent-mesh/retry-digest/v1+receipt\0".as_slice()
    } else {
        b"agent-mesh/retry-digest/v1\0".as_slice()
    });
    h.update(to.as_bytes());
    h.update(&kind.to_be_bytes());
    for name in [from, to_agent] {
        match name {
            Some(n) => {
                h.update(&[1, n.as_str().len() as u8]);
                h.update(n.as_str().as_bytes());
            }
            None => {
                h.update(&[0]);
            }
        }
    }
    match in_reply_to {
        Some(id) => h.update(&[1]).update(id.as_bytes()),
        None => h.update(&[0]),
    };
    h.update(body);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}
