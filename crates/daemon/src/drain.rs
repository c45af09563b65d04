//! The previous inbox of an agent that moved away (`docs/design.md`, "As
//! built: moving an agent"): this node keeps journaling what still comes
//! for the agent, in its inbox here, and a pump passes each message on to
//! the agent's new host, in inbox order, under a cursor of its own.
//!
//! The cursor (the agent's named cursor [`EXPORT_CURSOR`], a name the API
//! never takes) is set at the export to how far the agent had read (by
//! default the journal head), so what came between then and this node
//! learning of the move is passed on too. A forward is a message on this
//! node's own stream to the new host (exactly once, in order), and the
//! cursor moves in the commit that writes it, so a crash never passes a
//! message on twice (and the new host indexes a message once however often
//! it comes). Nothing is acknowledged on the agent's behalf.
//!
//! The drain ends once the previous inbox is passed on to its end and
//! either every peer follows the move (it sends to the new host now and
//! this node has received its stream as far as it said: the bus's
//! `drains_followed`), or `drain_days` have passed since the move.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mesh_protocol::{AgentName, Forward, KIND_AGENT, KIND_FORWARD, NodeId};
use mesh_store::{InboxItem, JournalRecord, MeshStore, RedbStore, StoreError};

use crate::agents::{Agent, Registry, now_ms};
use crate::bus::{Bus, LocalWrite};

/// The named cursor of a moved agent's previous inbox: how far it has
/// been passed on (the API's cursor names cannot hold a `:`).
pub(crate) const EXPORT_CURSOR: &str = "mesh:exported";

/// Inbox entries one page of the pump reads (each at most a batch's
/// payload, so a page holds at most 16 MiB).
const PAGE_ENTRIES: usize = 16;

/// How long the pump waits before trying a refused forward again (the new
/// host is not a peer yet, the outbox is full, the store is down).
const RETRY: Duration = Duration::from_secs(5);

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
        loop {
            let here = self
                .registry
                .get(&name)
                .is_some_and(|a| Arc::ptr_eq(&a, &self.agent));
            let Some(host) = self.agent.moved_to().filter(|_| here) else {
                break;
            };
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
            match self.pass_on(&name, host, &page).await {
                Ok((n, last)) => {
                    passed += n;
                    after = last;
                }
                Err((n, last, e)) => {
                    passed += n;
                    after = last;
                    tracing::warn!(
                        agent = %name,
                        host = %host.fmt_short(),
                        "a message for the agent cannot be passed on to its new host yet: {e}"
                    );
                    tokio::time::sleep(RETRY).await;
                }
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

    /// Passes on the messages of `page` in order; answers how many and
    /// the arrival passed, or also why it stopped.
    async fn pass_on(
        &self,
        name: &AgentName,
        host: NodeId,
        page: &[InboxItem],
    ) -> Result<(u64, u64), (u64, u64, String)> {
        let mut n = 0;
        let mut last = page.first().map_or(0, |i| i.item.arrival.saturating_sub(1));
        for item in page {
            let arrival = item.item.arrival;
            if let Some(forward) = forward_of(&item.item.record) {
                let cursor = Some((name.clone(), EXPORT_CURSOR.to_owned(), arrival));
                if let Err(e) = self.bus.forward(host, forward, cursor).await {
                    return Err((n, last, e.to_string()));
                }
                n += 1;
            }
            last = arrival;
        }
        Ok((n, last))
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

/// The forward of a journal entry of the previous inbox: an agent message
/// as its author wrote it, or a forward come here before the agent moved
/// on (passed on as it is). Bounces and other entries stay here.
fn forward_of(record: &JournalRecord) -> Option<Vec<u8>> {
    let JournalRecord::Envelope {
        stream,
        kind,
        payload,
        ..
    } = record
    else {
        return None;
    };
    match *kind {
        KIND_AGENT => Some(
            Forward {
                author: stream.author,
                envelope: payload.clone(),
            }
            .encode(),
        ),
        KIND_FORWARD => Some(payload.clone()),
        _ => None,
    }
}
