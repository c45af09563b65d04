//! Read receipts, the reader's side (`docs/design.md`, "As built: read
//! receipts"): when one of this node's agents acks past messages whose
//! senders asked for a receipt, a pump signs one with the agent's key and
//! sends it to each sender's node.
//!
//! The pump reads each agent's inbox between its own named cursor
//! [`RECEIPTS_CURSOR`] and the agent's read position
//! ([`crate::drain::READ_CURSOR`]), groups the messages asking a receipt
//! by author node and sender agent, sends one receipt per group (at most
//! [`MAX_RECEIPT_IDS`] ids each) as a node message of kind
//! [`KIND_READ_RECEIPT`], and moves its cursor past the page only once
//! every one of them is committed here. A receipt's client id is derived
//! from what it names, so the page sent again after a crash between the
//! commits and the cursor's write is answered with the first send within
//! the dedup window (or refused as reused: sent already); past the window
//! it goes again, and the author's store, which marks a message read once,
//! refuses it as telling nothing new. Entries other than agent messages
//! (bounces, read receipts, lag records) never ask one: acking a `read`
//! entry sends nothing back.
//!
//! A receipt for a message between two agents of this node goes to this
//! node itself, on its stream to itself, and is indexed in the commit
//! that writes it, as a message between them is.
//!
//! Not sent: receipts for messages passed on from a host the agent moved
//! away from (their author would find them sent to another node), and for
//! a sender node that is no longer a peer (logged).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mesh_protocol::{
    AgentHeader, AgentName, KIND_AGENT, KIND_READ_RECEIPT, MAX_RECEIPT_IDS, MsgId, NodeId,
    ReadReceipt,
};
use mesh_store::{InboxItem, InboxKind, JournalRecord, MeshStore, RedbStore, StoreError};

use crate::agents::{Agent, Registry, now_ms};
use crate::bus::{Bus, CoreSendError, LocalWrite, Outgoing, SendError, SendMeta};

/// The named cursor of the last inbox entry of an agent whose receipts
/// are sent (the API's cursor names cannot hold a `:`).
pub(crate) const RECEIPTS_CURSOR: &str = "mesh:receipts";

/// Inbox entries one page of the pump reads.
const PAGE_ENTRIES: usize = 64;

/// How often the pump looks without an ack waking it (an ack wakes it at
/// once; this bounds what a lost wake-up costs).
const POLL: Duration = Duration::from_secs(5);

/// The receipt pump's task; stopped and awaited by [`ReceiptPump::stop`]
/// before the store closes (it holds the store).
pub(crate) struct ReceiptPump {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ReceiptPump {
    /// Starts the pump for every agent of `registry`.
    pub(crate) fn start(registry: Arc<Registry>, store: Arc<RedbStore>, bus: Bus) -> ReceiptPump {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let pump = Pump {
            me: bus.node_id(),
            registry,
            store,
            bus,
        };
        ReceiptPump {
            stop,
            task: tokio::spawn(pump.run(stopped)),
        }
    }

    /// Stops the pump and waits until its task has ended (and dropped its
    /// hold on the store). A page half sent is sent again at the next start.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::warn!("the receipt pump's task failed: {e}");
        }
    }
}

struct Pump {
    me: NodeId,
    registry: Arc<Registry>,
    store: Arc<RedbStore>,
    bus: Bus,
}

/// A receipt to send: to whom (the author node and its sender agent) and
/// what for.
type Groups = BTreeMap<([u8; 32], AgentName), (NodeId, Vec<MsgId>)>;

impl Pump {
    async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            for agent in self.registry.all() {
                if *stop.borrow() {
                    return;
                }
                if agent.moved_to().is_some() {
                    continue;
                }
                if let Err(e) = self.catch_up(&agent, &stop).await {
                    tracing::warn!(agent = %agent.record.name, "read receipts wait: {e}");
                }
            }
            tokio::select! {
                changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
                () = self.registry.acked.notified() => {}
                () = tokio::time::sleep(POLL) => {}
            }
        }
    }

    /// Sends the receipts of what `agent` acked since the pump's cursor,
    /// a page at a time, moving the cursor past each page once its
    /// receipts are committed.
    async fn catch_up(
        &self,
        agent: &Agent,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), String> {
        let name = &agent.record.name;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let read = self.cursor(name, crate::drain::READ_CURSOR).await?;
            let done = self.cursor(name, RECEIPTS_CURSOR).await?;
            if done >= read {
                return Ok(());
            }
            let page = self.page(name, done).await?;
            let page: Vec<InboxItem> = page
                .into_iter()
                .take_while(|i| i.item.arrival <= read)
                .collect();
            // Nothing left up to the read position (retention took it).
            let last = page.last().map_or(read, |i| i.item.arrival);
            let mut groups = Groups::new();
            for item in &page {
                if let Some((author, sender, id)) = asked(item) {
                    groups
                        .entry((*author.as_bytes(), sender))
                        .or_insert_with(|| (author, Vec::new()))
                        .1
                        .push(id);
                }
            }
            for ((_, sender), (author, mut ids)) in groups {
                ids.sort_unstable();
                ids.dedup();
                for chunk in ids.chunks(MAX_RECEIPT_IDS) {
                    self.send(agent, author, &sender, chunk).await?;
                }
            }
            let write = LocalWrite::PutAgentCursor {
                agent: name.clone(),
                name: RECEIPTS_CURSOR.to_owned(),
                arrival: last,
            };
            self.bus
                .local_write(write)
                .await
                .map_err(|e| format!("the receipts cursor is not written: {e}"))?;
        }
    }

    /// Signs and sends `agent`'s receipt for `ids` of `sender` on
    /// `author`; `Ok` once committed here (or found sent before).
    async fn send(
        &self,
        agent: &Agent,
        author: NodeId,
        sender: &AgentName,
        ids: &[MsgId],
    ) -> Result<(), String> {
        let name = &agent.record.name;
        let receipt = ReadReceipt::sign(
            agent.secret(),
            &self.me,
            (name.clone(), sender.clone()),
            now_ms(),
            ids.to_vec(),
        );
        let meta = SendMeta {
            client_id: Some(client_id(name, &author, sender, ids)),
            read_receipt: true,
            ..SendMeta::default()
        };
        let msg = Outgoing {
            to: author,
            kind: KIND_READ_RECEIPT,
            payload: receipt.encode(),
            meta: Some(Box::new(meta)),
        };
        match self.bus.submit(vec![msg]).await.await.pop() {
            Some(Ok(r)) => {
                tracing::debug!(agent = %name, to = %author.fmt_short(), seq = r.seq, ids = ids.len(), "read receipt sent");
                #[cfg(feature = "fault-hooks")]
                if std::env::var_os("MESH_FAULT_ABORT_AFTER_RECEIPT").is_some() {
                    // Test-only: dies as a crash would, after the receipt's
                    // commit and before the pump's cursor moves past it.
                    std::process::abort();
                }
                Ok(())
            }
            // The same receipt's first send, before a crash, with another
            // time in it: it went.
            Some(Err(SendError::Refused(CoreSendError::ClientIdReused { .. }))) => Ok(()),
            Some(Err(SendError::Refused(CoreSendError::UnknownPeer(_)))) => {
                tracing::warn!(
                    agent = %name,
                    to = %author.fmt_short(),
                    ids = ids.len(),
                    "a read receipt is not sent: its sender's node is no longer a peer"
                );
                Ok(())
            }
            Some(Err(e)) => Err(format!(
                "a read receipt to {} is not sent yet: {e}",
                author.fmt_short()
            )),
            None => Err("the node answered nothing".into()),
        }
    }

    async fn cursor(&self, name: &AgentName, cursor: &'static str) -> Result<u64, String> {
        let (store, name) = (self.store.clone(), name.clone());
        let got = tokio::task::spawn_blocking(move || store.agent_cursor(&name, cursor))
            .await
            .map_err(|e| format!("read task failed: {e}"))?;
        Ok(got.map_err(|e| e.to_string())?.unwrap_or(0))
    }

    async fn page(&self, name: &AgentName, after: u64) -> Result<Vec<InboxItem>, String> {
        let (store, name) = (self.store.clone(), name.clone());
        tokio::task::spawn_blocking(move || store.inbox(&name, after, PAGE_ENTRIES))
            .await
            .map_err(|e| format!("read task failed: {e}"))?
            .map_err(|e: StoreError| e.to_string())
    }
}

/// The author node, sender agent and id of the inbox entry `item` if it is
/// an agent message that came straight from its author (another node, or
/// this one) and whose sender asked for a receipt. A message passed on by a host the agent moved away
/// from is not receipted: its author sent it to that host, and checks a
/// receipt against the node it sent the message to.
fn asked(item: &InboxItem) -> Option<(NodeId, AgentName, MsgId)> {
    if item.row.kind != InboxKind::Message {
        return None;
    }
    let JournalRecord::Envelope {
        stream,
        kind: KIND_AGENT,
        payload,
        ..
    } = &item.item.record
    else {
        return None;
    };
    let h = AgentHeader::decode(payload).ok()?;
    h.receipt.then_some((stream.author, h.from, h.id))
}

/// The client id of `agent`'s receipt for `ids` of `sender` on `author`:
/// derived from what it names, so the same receipt sent again is known.
fn client_id(agent: &AgentName, author: &NodeId, sender: &AgentName, ids: &[MsgId]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(author.as_bytes());
    h.update(sender.as_str().as_bytes());
    h.update(&[0]);
    for id in ids {
        h.update(id.as_bytes());
    }
    let digest = data_encoding::HEXLOWER.encode(&h.finalize().as_bytes()[..16]);
    format!("rcpt:{agent}:{digest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipts_client_id_fits_and_names_what_it_covers() {
        let agent = AgentName::new(&"a".repeat(64)).expect("name");
        let author = mesh_protocol::SecretKey::from_bytes(&[1; 32]).public();
        let sender = AgentName::new("alice").expect("name");
        let one = client_id(&agent, &author, &sender, &[MsgId([1; 16])]);
        assert!(
            one.len() <= mesh_store::CLIENT_ID_BYTES_MAX,
            "{}",
            one.len()
        );
        assert_eq!(one, client_id(&agent, &author, &sender, &[MsgId([1; 16])]));
        assert_ne!(one, client_id(&agent, &author, &sender, &[MsgId([2; 16])]));
    }
}
