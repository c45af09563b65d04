//! The dashboard's journal tail: the journal live, but coalesced, so a page
//! open beside a busy node costs the node (and the browser) a few reads a
//! second however fast entries commit.
//!
//! The control socket's `/v1/subscribe` hands a client every entry, paced
//! by the client; that is what a program that acts on entries needs. A
//! person watching a tail cannot read 60,000 entries a second, and a
//! browser that renders them takes the node's cores from it (measured in
//! `docs/benchmarks.md`, "The dashboard open beside the load"). So this
//! stream reads the journal at most once every [`TAIL_TICK`]: at most
//! [`TAIL_PER_TICK`] of the newest entries since the last read, and a
//! `skipped` event that counts the ones before them it did not send
//! (`mesh events` and `/api/events` have every one). Idle, it waits on the
//! head and reads nothing.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use mesh_store::Arrival;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::routes::JOURNAL_READ_BYTES;
use super::super::subscribe::{entry_event, error_event};
use super::super::{ApiError, ApiState};

/// The shortest time between two reads of the journal for one tail.
pub(super) const TAIL_TICK: Duration = Duration::from_millis(500);

/// The most entries one read sends after the first (the newest of those
/// committed since the read before).
pub(super) const TAIL_PER_TICK: u64 = 25;

/// How often an idle tail sends an SSE comment, so a vanished page is noticed.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// The `skipped` event: entries after `after` up to and including `upto`
/// that this tail did not send.
#[derive(Debug, Serialize)]
struct Skipped {
    /// The cursor the skipped entries come after.
    after: String,
    /// The cursor of the last skipped entry.
    upto: String,
    /// How many entries were skipped.
    count: u64,
    detail: String,
}

/// One tail's position and what it has read but not yet handed over.
struct Tail {
    st: ApiState,
    /// The last arrival sent or counted as skipped.
    pos: Arrival,
    /// The most entries the next read sends.
    per_read: u64,
    head: watch::Receiver<Arrival>,
    closing: watch::Receiver<bool>,
    /// When the journal was last read.
    read_at: Option<Instant>,
    ready: VecDeque<Event>,
    done: bool,
}

/// A tail counts as a live subscription (`subscribers` in the status and
/// `/metrics`) while it is open.
impl Drop for Tail {
    fn drop(&mut self) {
        self.st
            .inner
            .counters
            .subscribers
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl Tail {
    /// The next event, waiting for one as long as it takes; `None` once the
    /// server closes or the head watch is gone.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            if self.done || *self.closing.borrow_and_update() {
                return None;
            }
            let head = *self.head.borrow_and_update();
            if head <= self.pos {
                tokio::select! {
                    changed = self.head.changed() => if changed.is_err() { return None },
                    _ = self.closing.changed() => return None,
                }
                continue;
            }
            if let Some(at) = self.read_at {
                tokio::select! {
                    () = tokio::time::sleep_until(at + TAIL_TICK) => {}
                    _ = self.closing.changed() => return None,
                }
            }
            self.read_at = Some(Instant::now());
            if let Err(e) = self.read().await {
                tracing::warn!("the dashboard's tail failed: {e}");
                self.ready.push_back(error_event(&e));
                self.done = true;
            }
        }
    }

    /// Reads the newest entries up to the head as it is now, at most
    /// `per_read` of them, and counts the ones before them as skipped.
    async fn read(&mut self) -> Result<(), ApiError> {
        let head = *self.head.borrow_and_update();
        let from = head.saturating_sub(self.per_read).max(self.pos);
        if from > self.pos {
            let count = from - self.pos;
            let skipped = Skipped {
                after: self.st.cursor_text(self.pos),
                upto: self.st.cursor_text(from),
                count,
                detail: format!(
                    "{count} entries not shown: the tail shows the newest {TAIL_PER_TICK} each {} ms \
                     (`mesh events` has every one)",
                    TAIL_TICK.as_millis()
                ),
            };
            let data = serde_json::to_string(&skipped).unwrap_or_default();
            self.ready.push_back(
                Event::default()
                    .event("skipped")
                    .id(skipped.upto.clone())
                    .data(data),
            );
            self.pos = from;
        }
        let limit = usize::try_from(head - from).unwrap_or(usize::MAX);
        let page = self
            .st
            .journal_page(from, limit, JOURNAL_READ_BYTES)
            .await?;
        for item in &page {
            let (event, _) = entry_event(&self.st.entry(item));
            self.ready.push_back(event);
            self.pos = self.pos.max(item.arrival);
        }
        // A page cut by its byte bound: the rest waits for the next read.
        self.per_read = TAIL_PER_TICK;
        Ok(())
    }
}

/// The tail after arrival `after`, its first read sending up to `first`
/// entries.
pub(super) fn stream(st: ApiState, after: Arrival, first: u64) -> Response {
    st.inner
        .counters
        .subscribers
        .fetch_add(1, Ordering::Relaxed);
    let tail = Tail {
        head: st.inner.head.clone(),
        closing: st.inner.closing.subscribe(),
        st,
        pos: after,
        per_read: first.max(TAIL_PER_TICK),
        read_at: None,
        ready: VecDeque::new(),
        done: false,
    };
    let events = futures_util::stream::unfold(tail, |mut tail| async move {
        let event = tail.next().await?;
        Some((Ok::<_, Infallible>(event), tail))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE_INTERVAL))
        .into_response()
}
