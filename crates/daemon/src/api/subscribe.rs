//! `GET /v1/subscribe?after=CURSOR`: the journal as Server-Sent Events.
//!
//! Each subscription has a pump task that reads the journal from the store
//! (never from the writer's path) into the subscription's own bounded buffer
//! of `subscriber_buffer` entries and `subscriber_buffer_bytes` bytes (an
//! entry's bytes are its event as sent; one larger than the whole bound
//! waits for the buffer to empty). Backlog — everything committed before the
//! subscription was opened, or before it resumed after a lag — is paced by the
//! reader. Entries committed later are live: the pump waits for room in the
//! buffer as long as the reader keeps taking entries, however slowly (it then
//! falls behind the head, and memory stays bounded by the buffer because the
//! pump reads from the durable journal). A subscriber whose buffer is full
//! and who takes nothing from it for `subscriber_stall` has stopped reading:
//! it has lagged. Then the pump writes a durable loss record
//! (`subscriber_lagged`, naming the skipped arrivals), and when the reader
//! takes items again it gets a `lagged` event with the cursor to re-read
//! from, and the stream goes on after the skipped range (if the loss record
//! could not be written, the next entry carries `losses_unrecorded: true`).
//! No writer and no other subscriber ever waits for a subscriber: the head
//! is a watch, and each pump only reads. Progress, not distance, decides a
//! lag: a reader far behind the head after one large commit, still taking
//! entries, is not lagged.
//!
//! Events: `entry` (data: an [`EventEntry`], id: its cursor) and `lagged`
//! (data: a [`LaggedEvent`]). `Last-Event-ID` is honoured when `after` is absent.
//!
//! `GET /v1/agents/{name}/subscribe?after=CURSOR` is the same for one
//! agent's inbox: its entries only (`entry` data: an [`InboxEntry`]), each
//! subscription with its own buffer, and its lag records written to the
//! agent's inbox as well as the journal.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Extension;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use mesh_store::Arrival;
use serde::Deserialize;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

use super::routes::query;
use super::routes::{JOURNAL_READ_BYTES, JOURNAL_READ_ENTRIES};
use super::{ApiError, ApiState, PeerCred};
use crate::bus::LocalWrite;
use mesh_api::{EventEntry, InboxEntry, LaggedEvent};
use mesh_protocol::AgentName;

/// What a subscription reads: the node's journal, or one agent's inbox.
#[derive(Clone, Debug)]
enum Source {
    Journal,
    Inbox(AgentName),
}

/// How often an idle stream sends an SSE comment, so a vanished client is noticed.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// `GET /v1/subscribe` query.
#[derive(Debug, Deserialize)]
pub(super) struct SubscribeQuery {
    after: Option<String>,
}

pub(super) async fn subscribe(
    State(st): State<ApiState>,
    cred: Option<Extension<PeerCred>>,
    headers: HeaderMap,
    q: Result<Query<SubscribeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    open(st, cred, headers, q, Source::Journal).await
}

/// `GET /v1/agents/{name}/subscribe?after=`: the agent's inbox live.
pub(super) async fn subscribe_inbox(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    cred: Option<Extension<PeerCred>>,
    headers: HeaderMap,
    q: Result<Query<SubscribeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let agent = AgentName::new(&name).map_err(|e| super::CallerError::BadValue(e.to_string()))?;
    if st.inner.registry.get(&agent).is_none() {
        return Err(super::NotFound::UnknownAgent(name).into());
    }
    open(st, cred, headers, q, Source::Inbox(agent)).await
}

async fn open(
    st: ApiState,
    cred: Option<Extension<PeerCred>>,
    headers: HeaderMap,
    q: Result<Query<SubscribeQuery>, QueryRejection>,
    source: Source,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let after = q.after.or_else(|| {
        headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let start = st.parse_after(after.as_deref())?;
    let id = st
        .inner
        .counters
        .next_subscriber
        .fetch_add(1, Ordering::Relaxed)
        + 1;
    let uid = cred.and_then(|c| c.0.uid);
    let (tx, mut rx) = mpsc::channel::<Item>(st.inner.subscriber_buffer);
    let bytes_max = u32::try_from(st.inner.subscriber_buffer_bytes).unwrap_or(u32::MAX);
    let budget = Arc::new(Semaphore::new(bytes_max as usize));
    let taken = Arc::new(Notify::new());
    // Everything committed from now on is live for this subscriber.
    let backlog_to = st.read_head();
    tracing::debug!(
        subscriber = id,
        ?uid,
        start,
        backlog_to,
        "subscription opened"
    );
    let pump = Pump {
        st: st.clone(),
        source,
        id,
        uid,
        pos: start,
        backlog_to,
        unrecorded: false,
        lagged: false,
        buffer: Buffer {
            tx,
            budget,
            bytes_max,
            taken: taken.clone(),
        },
    };
    // An agent's entries count as handed to it once its reader takes them.
    let served = match &pump.source {
        Source::Inbox(agent) => Some((st.clone(), agent.clone())),
        Source::Journal => None,
    };
    tokio::spawn(pump.run());
    let stream = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| {
            o.map(|(event, bytes, arrival)| {
                // Taken: its bytes are the buffer's again, and the pump
                // sees progress.
                drop(bytes);
                taken.notify_one();
                if let (Some((st, agent)), true) = (&served, arrival > 0) {
                    st.note_served(agent, arrival);
                }
                Ok::<_, Infallible>(event)
            })
        })
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE_INTERVAL))
        .into_response())
}

/// Counts an open subscription while it lives.
struct Open<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An event in a subscription's buffer, holding its share of the byte
/// bound, and the arrival of its entry (0: not an entry).
type Item = (Event, OwnedSemaphorePermit, Arrival);

/// A subscription's buffer: bounded in entries (the channel) and in bytes
/// (the semaphore's permits, one per byte of the events in it).
struct Buffer {
    tx: mpsc::Sender<Item>,
    budget: Arc<Semaphore>,
    bytes_max: u32,
    /// Notified each time the reader takes an event.
    taken: Arc<Notify>,
}

impl Buffer {
    /// The permits an event of `bytes` takes: an event larger than the
    /// whole bound waits for the buffer to empty.
    fn permits(&self, bytes: usize) -> u32 {
        u32::try_from(bytes).unwrap_or(u32::MAX).min(self.bytes_max)
    }

    /// Puts `event` (of the entry at `arrival`, or 0) in the buffer,
    /// waiting as long as it takes; `Err` once the reader is gone.
    async fn send(&self, event: Event, bytes: usize, arrival: Arrival) -> Result<(), ()> {
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(self.permits(bytes))
            .await
            .map_err(|_| ())?;
        self.tx.send((event, permit, arrival)).await.map_err(|_| ())
    }
}

/// One subscription's reader of the journal.
struct Pump {
    st: ApiState,
    source: Source,
    id: u64,
    uid: Option<u32>,
    /// The last arrival handed to the buffer.
    pos: Arrival,
    /// Entries up to here are backlog (paced by the reader); later ones are live.
    backlog_to: Arrival,
    /// A lag's loss record could not be written; tell the next entry.
    unrecorded: bool,
    /// The subscription lagged: it skipped entries its reader never got,
    /// so what it hands over from then on does not count as handed to an
    /// agent (its served cursor would pass the skipped ones).
    lagged: bool,
    buffer: Buffer,
}

impl Pump {
    async fn run(mut self) {
        let st = self.st.clone();
        let counters = &st.inner.counters;
        counters.subscribers.fetch_add(1, Ordering::Relaxed);
        let _open = Open(&counters.subscribers);
        let mut head = st.inner.head.clone();
        let mut closing = st.inner.closing.subscribe();
        // An inbox subscription also ends when its agent is removed.
        if let Source::Inbox(agent) = &self.source {
            let Some(a) = st.inner.registry.get(agent) else {
                return;
            };
            let (tx, rx) = tokio::sync::watch::channel(false);
            let mut removed = a.removed();
            let mut global = st.inner.closing.subscribe();
            tokio::spawn(async move {
                tokio::select! {
                    _ = removed.wait_for(|r| *r) => {}
                    _ = global.wait_for(|c| *c) => {}
                    // The subscription ended first.
                    () = tx.closed() => return,
                }
                let _ = tx.send(true);
            });
            closing = rx;
        }
        let result = self.pump(&mut head, &mut closing).await;
        match result {
            Ok(()) => tracing::debug!(subscriber = self.id, "subscription closed"),
            Err(e) => {
                tracing::warn!(subscriber = self.id, "subscription failed: {e}");
                // Best effort: the stream ends either way.
                let event = error_event(&e);
                if let Ok(permit) = self.buffer.budget.clone().try_acquire_many_owned(1) {
                    let _ = self.buffer.tx.try_send((event, permit, 0));
                }
            }
        }
    }

    /// Hands entries to the buffer until the client goes away, the server
    /// closes, or the head watch is gone (`Ok`), or a read fails.
    async fn pump(
        &mut self,
        head: &mut tokio::sync::watch::Receiver<Arrival>,
        closing: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), ApiError> {
        loop {
            if *closing.borrow_and_update() {
                return Ok(());
            }
            let h = *head.borrow_and_update();
            let page = if self.pos < h {
                self.page().await?
            } else {
                Vec::new()
            };
            if page.is_empty() {
                tokio::select! {
                    changed = head.changed() => if changed.is_err() { return Ok(()) },
                    _ = self.buffer.tx.closed() => return Ok(()),
                    _ = closing.changed() => return Ok(()),
                }
                continue;
            }
            for (arrival, event, bytes) in page {
                let served = if self.lagged { 0 } else { arrival };
                if arrival > self.backlog_to {
                    match self.offer(event, bytes, served, closing).await {
                        Offer::Taken => {}
                        Offer::Lagged => {
                            let head_now = *head.borrow();
                            self.lag(arrival, head_now, closing).await?;
                            break;
                        }
                        Offer::Stop => return Ok(()),
                    }
                } else {
                    tokio::select! {
                        sent = self.buffer.send(event, bytes, served) => if sent.is_err() { return Ok(()) },
                        _ = closing.changed() => return Ok(()),
                    }
                }
                self.unrecorded = false;
                self.pos = arrival;
            }
        }
    }

    /// The next entries after `pos`, as events with their sizes in bytes.
    async fn page(&self) -> Result<Vec<(Arrival, Event, usize)>, ApiError> {
        match &self.source {
            Source::Journal => Ok(self
                .st
                .journal_page(self.pos, JOURNAL_READ_ENTRIES, JOURNAL_READ_BYTES)
                .await?
                .into_iter()
                .map(|item| {
                    let mut entry = self.st.entry(&item);
                    entry.losses_unrecorded = self.unrecorded;
                    let (event, bytes) = entry_event(&entry);
                    (item.arrival, event, bytes)
                })
                .collect()),
            Source::Inbox(agent) => Ok(self
                .st
                .read_inbox(agent, self.pos, JOURNAL_READ_ENTRIES, None)
                .await?
                .0
                .iter()
                .map(|item| {
                    let entry = self.st.inbox_entry(item);
                    let (event, bytes) = inbox_event(&entry);
                    (item.item.arrival, event, bytes)
                })
                .collect()),
        }
    }

    /// Hands a live entry of `bytes` to the buffer, waiting for room (in
    /// entries and bytes) as long as the reader takes something from it at
    /// least every `subscriber_stall`.
    async fn offer(
        &self,
        event: Event,
        bytes: usize,
        arrival: Arrival,
        closing: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Offer {
        let buffer = &self.buffer;
        let want = buffer.permits(bytes);
        let permit = match buffer.budget.clone().try_acquire_many_owned(want) {
            Ok(p) => Some(p),
            Err(tokio::sync::TryAcquireError::Closed) => return Offer::Stop,
            Err(tokio::sync::TryAcquireError::NoPermits) => None,
        };
        let event = match permit {
            Some(permit) => match buffer.tx.try_send((event, permit, arrival)) {
                Ok(()) => return Offer::Taken,
                Err(TrySendError::Closed(_)) => return Offer::Stop,
                Err(TrySendError::Full((ev, _permit, _))) => ev,
            },
            None => event,
        };
        // The buffer is full, in entries or bytes: what the reader takes
        // makes room, and each take restarts the stall clock.
        let room = async {
            let permit = buffer.budget.clone().acquire_many_owned(want).await.ok()?;
            let slot = buffer.tx.reserve().await.ok()?;
            Some((permit, slot))
        };
        tokio::pin!(room);
        loop {
            tokio::select! {
                got = &mut room => return match got {
                    Some((permit, slot)) => { slot.send((event, permit, arrival)); Offer::Taken }
                    None => Offer::Stop,
                },
                () = buffer.taken.notified() => continue,
                () = tokio::time::sleep(self.st.inner.subscriber_stall) => return Offer::Lagged,
                _ = closing.changed() => return Offer::Stop,
            }
        }
    }

    /// Records that arrivals `from..=to` were not delivered live, then
    /// (paced by the reader) tells the subscriber where to resume.
    async fn lag(
        &mut self,
        from: Arrival,
        head_now: Arrival,
        closing: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), ApiError> {
        let st = &self.st;
        let to = head_now.max(from);
        let buffer = st.inner.subscriber_buffer;
        st.inner
            .counters
            .subscriber_lags
            .fetch_add(1, Ordering::Relaxed);
        let resume = st.cursor_text(from.saturating_sub(1));
        let who = match self.uid {
            Some(uid) => format!("subscriber {} (uid {uid})", self.id),
            None => format!("subscriber {}", self.id),
        };
        let stall_ms = st.inner.subscriber_stall.as_millis();
        tracing::warn!(
            subscriber = self.id,
            from,
            to,
            buffer,
            stall_ms,
            "subscriber lagged: its buffer stayed full"
        );
        let recorded = self.record_lag(who, from, to).await;
        self.unrecorded = !recorded;
        self.lagged = true;
        let lagged = LaggedEvent {
            resume,
            skipped_from: from,
            skipped_to: to,
            loss_recorded: recorded,
        };
        let data = serde_json::to_string(&lagged).unwrap_or_default();
        let bytes = data.len();
        let event = Event::default().event("lagged").data(data);
        tokio::select! {
            sent = self.buffer.send(event, bytes, 0) => if sent.is_err() { return Ok(()) },
            _ = closing.changed() => return Ok(()),
        }
        // What was committed while the reader stood still is backlog now.
        self.pos = to;
        self.backlog_to = self.st.read_head().max(to);
        Ok(())
    }

    /// Writes the durable record that `who` missed arrivals `from..=to`
    /// (in the journal, or in the agent's inbox), and says whether it was
    /// written; a failure is counted and logged, not returned.
    async fn record_lag(&self, who: String, from: Arrival, to: Arrival) -> bool {
        let st = &self.st;
        let written = match &self.source {
            Source::Journal => st
                .inner
                .bus
                .record_subscriber_lag(who, from, to)
                .await
                .map(drop),
            Source::Inbox(agent) => {
                let write = LocalWrite::AgentLagged {
                    agent: agent.clone(),
                    subscriber: format!("{who}, on agent {agent}'s inbox"),
                    from,
                    to,
                };
                st.inner.bus.local_write(write).await.map(drop)
            }
        };
        match written {
            Ok(()) => true,
            Err(e) => {
                st.inner
                    .counters
                    .loss_records_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    subscriber = self.id,
                    from,
                    to,
                    "cannot record a subscriber's loss: {e}"
                );
                false
            }
        }
    }
}

/// What became of a live entry.
enum Offer {
    Taken,
    Lagged,
    Stop,
}

/// The `entry` event of `entry`, and its bytes as the buffer counts them.
pub(super) fn entry_event(entry: &EventEntry) -> (Event, usize) {
    cursor_event(entry, &entry.cursor)
}

/// The `entry` event of an inbox entry, and its bytes as the buffer counts them.
fn inbox_event(entry: &InboxEntry) -> (Event, usize) {
    cursor_event(entry, &entry.cursor)
}

/// An `entry` event of `entry` as JSON with the id `cursor`, and its bytes.
fn cursor_event(entry: &impl serde::Serialize, cursor: &str) -> (Event, usize) {
    let data = serde_json::to_string(entry).unwrap_or_default();
    let bytes = data.len() + cursor.len();
    let event = Event::default().event("entry").id(cursor).data(data);
    (event, bytes)
}

pub(super) fn error_event(e: &ApiError) -> Event {
    Event::default()
        .event("error")
        .data(e.to_json(None).to_string())
}
