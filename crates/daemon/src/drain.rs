//! The previous inbox of an agent that moved away (`docs/design.md`, "As
//! built: moving an agent"): this node keeps journaling what still comes
//! for the agent, in its inbox here, and a pump passes each message on to
//! the agent's new host, in inbox order, under a cursor of its own.
//!
//! The cursor (the agent's named cursor [`EXPORT_CURSOR`], a name the API
//! never takes) is set at the export to how far the agent had read (by
//! default the last entry this node handed to it, [`SERVED_CURSOR`]), so
//! what it never saw here, and what came between then and this node
//! learning of the move, is passed on too. A forward is a message on this
//! node's own stream to the new host, in order; the pump passes on a page
//! of them and moves the cursor past the page only once the new host has
//! acknowledged every forward of it (committed it there). While a forward
//! is unacknowledged the outbox to the new host makes no room by a loss,
//! whatever its policy (the bus refuses a send instead), so no message its
//! author was told was delivered is given up on the way on. The page in
//! flight at a crash (that guard is in memory), one found given up all
//! the same, or one on a stream of an earlier store of this node, is
//! passed on again: the new host indexes a message once however often it
//! comes. Nothing is acknowledged on the agent's behalf. Where journal
//! retention here removed entries of the previous inbox before they were
//! passed on (the new host away longer than `[journal]` keeps them), the
//! pump passes on a trimmed forward in their place, so the agent is told
//! at its new host what it cannot have.
//!
//! The drain ends once the previous inbox is passed on to its end (every
//! forward acknowledged) and either every peer follows the move (it sends
//! to the new host now and this node has received its stream as far as it
//! said: the bus's `drains_followed`), or `drain_days` have passed since
//! the move.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mesh_protocol::{
    AgentName, Forward, ForwardTrimmed, KIND_AGENT, KIND_FORWARD, KIND_FORWARD_TRIMMED, NodeId,
};
use mesh_store::{InboxItem, JournalRecord, MeshStore, RedbStore, StoreError};

use crate::agents::{Agent, Registry, now_ms};
use crate::bus::{Bus, LocalWrite};

/// The named cursor of a moved agent's previous inbox: how far it has
/// been passed on (the API's cursor names cannot hold a `:`).
pub(crate) const EXPORT_CURSOR: &str = "mesh:exported";

/// The named cursor of the last inbox entry this node handed to an agent
/// (an inbox page, or its subscription): a move or export without an
/// `after` passes on what comes after it, what the agent never saw here.
pub(crate) const SERVED_CURSOR: &str = "mesh:served";

/// The named cursor of an agent's read position: the last inbox entry it
/// acknowledged (`POST /v1/agents/{name}/ack`). `inbox?unread=true` reads
/// after it; only an ack moves it, and never back.
pub(crate) const READ_CURSOR: &str = "mesh:read";

/// Inbox entries one page of the pump reads (each at most a batch's
/// payload, so a page holds at most 16 MiB).
const PAGE_ENTRIES: usize = 16;

/// How long the pump waits before trying a refused forward again (the new
/// host is not a peer yet, the outbox is full, the store is down), or one
/// the outbox gave up.
const RETRY: Duration = Duration::from_secs(5);

/// The first and the longest pause between two looks at whether the new
/// host acknowledged a page of forwards (the pause doubles in between).
const ACK_POLL_FIRST: Duration = Duration::from_millis(10);
const ACK_POLL_MAX: Duration = Duration::from_secs(1);

/// Starts a pump for every agent that moved away and has none running;
/// each drains for `drain_days` after its move (`[agents] drain_days`).
pub(crate) fn start_pumps(
    registry: &Arc<Registry>,
    store: &Arc<RedbStore>,
    bus: &Bus,
    drain_days: u64,
) {
    for agent in registry.all() {
        if agent.moved_to().is_some() && !agent.draining.swap(true, Ordering::AcqRel) {
            let pump = Pump {
                agent,
                registry: registry.clone(),
                store: store.clone(),
                bus: bus.clone(),
                drain_days,
            };
            tokio::spawn(pump.run());
        }
    }
}

/// Why a drain ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Every peer follows the move.
    Followed,
    /// `drain_days` passed.
    Deadline,
}

struct Pump {
    agent: Arc<Agent>,
    registry: Arc<Registry>,
    store: Arc<RedbStore>,
    bus: Bus,
    drain_days: u64,
}

impl Pump {
    async fn run(self) {
        let name = self.agent.record.name.clone();
        let mut head = self.bus.journal_head();
        let mut followed = self.bus.drains_followed();
        let key = self.agent.record.key;
        let mut after = match self.read_cursor(&name).await {
            Ok(Some(a)) => a,
            // Moved without an export here: what comes from now on.
            Ok(None) => *head.borrow(),
            Err(e) => {
                tracing::warn!(agent = %name, "the previous inbox cannot be read: {e}");
                self.agent.draining.store(false, Ordering::Release);
                return;
            }
        };
        let mut passed = 0u64;
        while let Some(host) = self.agent.moved_to().filter(|_| self.here(&name)) {
            let every_peer_followed = followed.borrow_and_update().contains(&key);
            let page = match self.read_page(&name, after).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(agent = %name, "the previous inbox cannot be read: {e}");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if page.is_empty() {
                // Read to its end (the followed set was read before the
                // page, so what every peer's stream brought is in it):
                // the drain ends once every peer follows, or its days are over.
                let left = self.deadline_ms().saturating_sub(now_ms());
                let why = if every_peer_followed {
                    Some(End::Followed)
                } else {
                    (left == 0).then_some(End::Deadline)
                };
                if let Some(why) = why {
                    if self.end(&name, host, after, why).await {
                        break;
                    }
                    continue;
                }
                tokio::select! {
                    changed = head.changed() => if changed.is_err() { break },
                    changed = followed.changed() => if changed.is_err() { break },
                    () = tokio::time::sleep(Duration::from_millis(left)) => {}
                }
                continue;
            }
            let before = after;
            let pass = self.pass_on(host, &page).await;
            let delivered = match &pass.sent {
                None => Delivery::Acked,
                Some((stream, seqs)) => self.delivery(&name, host, stream, seqs).await,
            };
            match delivered {
                Delivery::Acked => {
                    passed += pass.forwards();
                    after = pass.last;
                }
                Delivery::Again(why) => {
                    tracing::warn!(
                        agent = %name,
                        host = %host.fmt_short(),
                        "messages passed on to the agent's new host are passed on again: {why}"
                    );
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
                Delivery::Gone => break,
            }
            if let Some(e) = &pass.refused {
                tracing::warn!(
                    agent = %name,
                    host = %host.fmt_short(),
                    "a message for the agent cannot be passed on to its new host yet: {e}"
                );
                tokio::time::sleep(RETRY).await;
            }
            // Entries passed over (bounces, lag records) move the cursor too.
            if after > before {
                let write = LocalWrite::PutAgentCursor {
                    agent: name.clone(),
                    name: EXPORT_CURSOR.to_owned(),
                    arrival: after,
                };
                if let Err(e) = self.bus.local_write(write).await {
                    tracing::debug!(agent = %name, "the previous inbox's cursor is not written: {e}");
                }
            }
            tracing::debug!(agent = %name, passed, "passed on from the previous inbox");
        }
        self.agent.draining.store(false, Ordering::Release);
    }

    /// When the drain ends: `drain_days` after the move notice was signed.
    fn deadline_ms(&self) -> u64 {
        let key = self.agent.record.key;
        let issued = self
            .bus
            .agent_moves()
            .borrow()
            .iter()
            .find(|m| m.key == key)
            .map_or(0, |m| m.issued_ms);
        issued.saturating_add(self.drain_days.saturating_mul(86_400_000))
    }

    /// Ends the drain: journals it, and removes the agent here (what comes
    /// for it later is bounced to its sender); `false` if the store found
    /// inbox entries after `passed` (they came meanwhile: passed on first).
    async fn end(&self, name: &AgentName, host: NodeId, passed: u64, why: End) -> bool {
        let why = match why {
            End::Followed => "every peer sends to the agent's new host now and this node has \
                              what each sent it before"
                .to_owned(),
            End::Deadline => format!(
                "{} day(s) after the move the drain is over ([agents] drain_days)",
                self.drain_days
            ),
        };
        let detail = format!(
            "{why}: what came for the agent here up to this entry was passed on to {host}; \
             what comes later is bounced to its sender"
        );
        let write = LocalWrite::EndDrain {
            agent: name.clone(),
            to: host,
            passed,
            detail,
        };
        match self.bus.local_write(write).await {
            Ok(_) => {}
            Err(crate::bus::NodeError::Store(StoreError::Conflict(why))) => {
                tracing::debug!(agent = %name, "the drain goes on: {why}");
                return false;
            }
            Err(e) => {
                tracing::warn!(agent = %name, "the end of the drain is not written; it ends at the next start: {e}");
                return true;
            }
        }
        self.registry.remove(name);
        let (registry, n) = (self.registry.clone(), name.clone());
        let _ = tokio::task::spawn_blocking(move || registry.forget_key(&n)).await;
        tracing::info!(agent = %name, host = %host.fmt_short(), "the drain of a moved agent ended; it is no longer an agent here");
        true
    }

    /// Whether the agent is still this pump's agent here (not removed,
    /// not imported back anew).
    fn here(&self, name: &AgentName) -> bool {
        self.registry
            .get(name)
            .is_some_and(|a| Arc::ptr_eq(&a, &self.agent))
    }

    /// Passes on the messages of `page` (and, for entries retention
    /// removed, trimmed forwards) in order, up to the first the node refuses.
    async fn pass_on(&self, host: NodeId, page: &[InboxItem]) -> Pass {
        let name = &self.agent.record.name;
        let mut pass = Pass {
            last: page.first().map_or(0, |i| i.item.arrival.saturating_sub(1)),
            sent: None,
            refused: None,
        };
        for item in page {
            if let Some((kind, forward)) = forward_of(name, &item.item.record) {
                if kind == KIND_FORWARD_TRIMMED {
                    tracing::warn!(
                        agent = %name,
                        host = %host.fmt_short(),
                        "journal retention removed entries of the moved agent's previous inbox \
                         before they were passed on; its new host is told"
                    );
                }
                match self.bus.forward(host, kind, forward).await {
                    Ok(r) => match &mut pass.sent {
                        Some((stream, seqs)) if *stream == r.stream => seqs.push(r.seq),
                        Some(_) => {
                            // A new stream mid-page (a new store here): what
                            // is sent on it is looked at with the next page.
                            pass.refused =
                                Some("this node's stream to the new host changed".into());
                            return pass;
                        }
                        None => pass.sent = Some((r.stream, vec![r.seq])),
                    },
                    Err(e) => {
                        pass.refused = Some(e.to_string());
                        return pass;
                    }
                }
            }
            pass.last = item.item.arrival;
        }
        pass
    }

    /// Waits until the new host `host` acknowledged the forwards `seqs` of
    /// `stream` (this node's stream to it), or says why they are to be
    /// passed on again, or that the agent is gone from here.
    async fn delivery(
        &self,
        name: &AgentName,
        host: NodeId,
        stream: &mesh_protocol::StreamId,
        seqs: &[mesh_protocol::Seq],
    ) -> Delivery {
        let mut pause = ACK_POLL_FIRST;
        loop {
            if !self.here(name) {
                return Delivery::Gone;
            }
            let Ok(status) = self.bus.status().await else {
                return Delivery::Gone; // the node stopped
            };
            let own = status
                .peers
                .iter()
                .find(|p| p.node == host)
                .and_then(|p| p.own_stream.as_ref());
            let Some(own) = own else {
                return Delivery::Again(format!("{} is not a peer now", host.fmt_short()));
            };
            if own.stream != *stream {
                return Delivery::Again(
                    "this node's stream to the new host is of a newer store".to_owned(),
                );
            }
            match seqs.iter().find(|&&s| s > own.last_acked) {
                None => return Delivery::Acked,
                Some(&s) if s < own.first_retained => {
                    return Delivery::Again(format!(
                        "seq {s} of this node's stream to it was given up unacknowledged \
                         (the outbox was full and its policy is evict-oldest)"
                    ));
                }
                Some(_) => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(ACK_POLL_MAX);
        }
    }

    async fn read_cursor(&self, name: &AgentName) -> Result<Option<u64>, StoreError> {
        let (store, name) = (self.store.clone(), name.clone());
        tokio::task::spawn_blocking(move || store.agent_cursor(&name, EXPORT_CURSOR))
            .await
            .map_err(|e| StoreError::Unavailable(format!("read task failed: {e}")))?
    }

    async fn read_page(&self, name: &AgentName, after: u64) -> Result<Vec<InboxItem>, StoreError> {
        let (store, name) = (self.store.clone(), name.clone());
        tokio::task::spawn_blocking(move || store.inbox(&name, after, PAGE_ENTRIES))
            .await
            .map_err(|e| StoreError::Unavailable(format!("read task failed: {e}")))?
    }
}

/// One page passed on.
struct Pass {
    /// The arrival of the last entry passed on or over.
    last: u64,
    /// The stream the forwards went on and their seqs, if any went.
    sent: Option<(mesh_protocol::StreamId, Vec<mesh_protocol::Seq>)>,
    /// Why the node refused the next one, if it did.
    refused: Option<String>,
}

impl Pass {
    /// How many forwards went.
    fn forwards(&self) -> u64 {
        self.sent.as_ref().map_or(0, |(_, s)| s.len() as u64)
    }
}

/// Where a page of forwards stands at the new host.
enum Delivery {
    /// Every one is acknowledged.
    Acked,
    /// To be passed on again, for this reason.
    Again(String),
    /// The agent is not this pump's here any more, or the node stopped.
    Gone,
}

/// The forward (its kind and payload) of a journal entry of `agent`'s
/// previous inbox: an agent message as its author wrote it, a forward come
/// here before the agent moved on (passed on as it is, trimmed or not), or
/// a trimmed forward for entries retention removed here. Bounces and other
/// entries stay here.
fn forward_of(agent: &AgentName, record: &JournalRecord) -> Option<(u16, Vec<u8>)> {
    let (stream, kind, payload) = match record {
        JournalRecord::Envelope {
            stream,
            kind,
            payload,
            ..
        } => (stream, *kind, payload),
        JournalRecord::Trimmed { from, to } => {
            let trimmed = ForwardTrimmed {
                agent: agent.clone(),
                from: *from,
                to: *to,
            };
            return Some((KIND_FORWARD_TRIMMED, trimmed.encode()));
        }
        _ => return None,
    };
    match kind {
        KIND_AGENT => {
            let forward = Forward {
                author: stream.author,
                envelope: payload.clone(),
            };
            Some((KIND_FORWARD, forward.encode()))
        }
        KIND_FORWARD | KIND_FORWARD_TRIMMED => Some((kind, payload.clone())),
        _ => None,
    }
}
