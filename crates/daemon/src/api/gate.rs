//! Who gets served on a socket: admission, a reserve for the operator's
//! reads, and the timeouts that close a connection nobody uses.
//!
//! A socket never makes a client wait in its listen backlog: every
//! connection is accepted at once and is *pending* until its first request
//! head has arrived. Then it is *admitted* — it takes one of the socket's
//! [`CONNECTIONS_MAX`] places until it closes — or, if none is free,
//! answered at once with a 503 (`too_many_connections`) and closed. The
//! operator's reads (`GET /v1/status` and `GET /metrics`) may also take one
//! of [`CONNECTIONS_RESERVE`] more places, so that a node whose places are
//! all held still says how it is; such a connection closes after its answer.
//!
//! A pending connection costs one file descriptor and nothing else, and at
//! most [`PENDING_MAX`] are kept: a new one past that closes the oldest
//! still pending, so that connections which never send a request cannot
//! keep a new client out. A connection that takes longer than the head
//! timeout (`[api] request_head_timeout_ms`) to send its first request
//! head, or that sits idle between requests for the idle timeout (`[api]
//! idle_timeout_ms`), is closed; one with a request in flight (a live
//! subscription, a long inbox wait) never is.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Context;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::task::AtomicWaker;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use super::error::{ApiError, Capacity};
use super::socket::Peer;

/// The connections one socket serves at once (each live subscription holds
/// one); a client past them is answered 503 at once.
pub const CONNECTIONS_MAX: usize = 1024;

/// The places past [`CONNECTIONS_MAX`] kept for `GET /v1/status` and
/// `GET /metrics`, so that they are answered when every other place is held.
pub const CONNECTIONS_RESERVE: usize = 32;

/// The connections one socket keeps open before their first request head
/// has arrived; a new one past these closes the oldest of them.
pub const PENDING_MAX: usize = 4096;

/// The default time a new connection may take to send its first request
/// head, in ms (`[api] request_head_timeout_ms`).
pub const REQUEST_HEAD_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// The default time a connection may sit idle between requests, in ms
/// (`[api] idle_timeout_ms`).
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;

/// One socket's admission: its places, its reserve, its pending connections
/// and its counters.
pub(crate) struct Gate {
    places: Arc<Semaphore>,
    places_max: usize,
    reserve: Arc<Semaphore>,
    /// Connections in the order they were accepted, while pending (entries
    /// admitted or closed since are skipped and compacted away).
    pending: Mutex<VecDeque<Weak<ConnState>>>,
    pending_now: AtomicUsize,
    pending_max: usize,
    head_timeout: Duration,
    idle_timeout: Duration,
    counters: GateCounters,
}

/// What a [`Gate`] counts, for `GET /metrics`.
#[derive(Default)]
pub(crate) struct GateCounters {
    /// Connections open now.
    pub(crate) open: AtomicU64,
    /// Connections accepted, over the socket's life.
    pub(crate) accepted: AtomicU64,
    /// Requests answered 503 because every place was held.
    pub(crate) refused_full: AtomicU64,
    /// Connections admitted to the reserve.
    pub(crate) reserve_admitted: AtomicU64,
    /// Pending connections closed to make room for a new one.
    pub(crate) evicted_pending: AtomicU64,
    /// Connections closed for sending no request head in time.
    pub(crate) head_timeouts: AtomicU64,
    /// Connections closed for sitting idle between requests.
    pub(crate) idle_timeouts: AtomicU64,
}

/// The timeouts of a socket's connections.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    /// For the first request head.
    pub(crate) head: Duration,
    /// Between requests.
    pub(crate) idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            head: Duration::from_millis(REQUEST_HEAD_TIMEOUT_MS_DEFAULT),
            idle: Duration::from_millis(IDLE_TIMEOUT_MS_DEFAULT),
        }
    }
}

impl Gate {
    /// A gate with the default bounds and `timeouts`.
    pub(crate) fn new(timeouts: Timeouts) -> Arc<Gate> {
        Self::with_bounds(CONNECTIONS_MAX, CONNECTIONS_RESERVE, PENDING_MAX, timeouts)
    }

    /// A gate with `places` places, `reserve` more for the operator's
    /// reads, at most `pending_max` pending connections, and `timeouts`.
    pub(crate) fn with_bounds(
        places: usize,
        reserve: usize,
        pending_max: usize,
        timeouts: Timeouts,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            places: Arc::new(Semaphore::new(places)),
            places_max: places,
            reserve: Arc::new(Semaphore::new(reserve)),
            pending: Mutex::new(VecDeque::new()),
            pending_now: AtomicUsize::new(0),
            pending_max: pending_max.max(1),
            head_timeout: timeouts.head,
            idle_timeout: timeouts.idle,
            counters: GateCounters::default(),
        })
    }

    /// Its counters.
    pub(crate) fn counters(&self) -> &GateCounters {
        &self.counters
    }

    /// Connections pending now.
    pub(crate) fn pending_now(&self) -> usize {
        self.pending_now.load(Ordering::Relaxed)
    }

    fn pending_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Weak<ConnState>>> {
        // The queue is only pushed to and popped from under the lock; a
        // panic cannot leave it half-changed.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection was accepted: it is pending, and the oldest pending one
    /// is closed if there are more than the bound.
    pub(crate) fn accepted(self: &Arc<Self>) -> Arc<ConnState> {
        let conn = Arc::new(ConnState {
            gate: Arc::downgrade(self),
            state: AtomicUsize::new(PENDING),
            closed_by_gate: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since: Mutex::new(Instant::now()),
            place: Mutex::new(None),
        });
        self.counters.accepted.fetch_add(1, Ordering::Relaxed);
        self.counters.open.fetch_add(1, Ordering::Relaxed);
        let now = self.pending_now.fetch_add(1, Ordering::AcqRel) + 1;
        let mut queue = self.pending_queue();
        if now > self.pending_max {
            while let Some(old) = queue.pop_front() {
                if let Some(old) = old.upgrade()
                    && old.leave_pending(EVICTED)
                {
                    self.pending_now.fetch_sub(1, Ordering::AcqRel);
                    old.closed_by_gate.store(true, Ordering::Release);
                    old.waker.wake();
                    self.counters
                        .evicted_pending
                        .fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        // Entries of connections admitted or closed since are dropped when
        // they make up half the queue, so it stays within twice the bound.
        if queue.len() >= 2 * self.pending_max {
            queue.retain(|c| c.upgrade().is_some_and(|c| c.is_pending()));
        }
        queue.push_back(Arc::downgrade(&conn));
        conn
    }
}

const PENDING: usize = 0;
const ADMITTED: usize = 1;
const EVICTED: usize = 2;
const CLOSED: usize = 3;

/// One connection's state, shared by its stream ([`Timed`]) and its
/// requests (through [`Peer`]).
pub(crate) struct ConnState {
    gate: Weak<Gate>,
    /// [`PENDING`], [`ADMITTED`], [`EVICTED`] or [`CLOSED`].
    state: AtomicUsize,
    /// Set when the gate closed the connection; its next read fails.
    closed_by_gate: AtomicBool,
    /// The task reading the connection, woken when the gate closes it.
    waker: AtomicWaker,
    /// Requests whose response has not been sent whole.
    in_flight: AtomicUsize,
    /// Requests the connection has made.
    requests: AtomicU64,
    /// Since when no request has been in flight.
    idle_since: Mutex<Instant>,
    /// The place it holds once admitted.
    place: Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnState {
    fn is_pending(&self) -> bool {
        self.state.load(Ordering::Acquire) == PENDING
    }

    /// Moves a pending connection to `to`; false if it was not pending.
    fn leave_pending(&self, to: usize) -> bool {
        self.state
            .compare_exchange(PENDING, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn idle_since(&self) -> std::sync::MutexGuard<'_, Instant> {
        // An Instant is written whole.
        self.idle_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits the connection if a place is free (or, for a reserved
    /// request, a reserve place); `Err` with the 503 to answer otherwise.
    /// Returns whether the connection must close after this answer.
    fn admit(&self, reserved: bool) -> Result<bool, ApiError> {
        let Some(gate) = self.gate.upgrade() else {
            return Ok(true);
        };
        let mut place = self.place.lock().unwrap_or_else(|p| p.into_inner());
        if place.is_some() {
            return Ok(false);
        }
        let (permit, close_after) = match gate.places.clone().try_acquire_owned() {
            Ok(p) => (p, false),
            Err(_) => match reserved.then(|| gate.reserve.clone().try_acquire_owned()) {
                Some(Ok(p)) => {
                    gate.counters
                        .reserve_admitted
                        .fetch_add(1, Ordering::Relaxed);
                    (p, true)
                }
                _ => {
                    gate.counters.refused_full.fetch_add(1, Ordering::Relaxed);
                    return Err(Capacity::TooManyConnections {
                        max: gate.places_max,
                    }
                    .into());
                }
            },
        };
        *place = Some(permit);
        if self.leave_pending(ADMITTED) {
            gate.pending_now.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(close_after)
    }

    /// `Err` once the gate has closed the connection (to make room);
    /// registers `cx` to be woken when it does.
    pub(crate) fn closed(&self, cx: &mut Context<'_>) -> io::Result<()> {
        self.waker.register(cx.waker());
        if self.closed_by_gate.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "closed to make room: too many connections sent no request",
            ));
        }
        Ok(())
    }

    /// A read found nothing to read: `Err` if the connection has waited
    /// too long for a request (the head or the idle timeout), else `sleep`
    /// is set to wake the reader at that deadline.
    pub(crate) fn waited(
        &self,
        sleep: &mut Option<Pin<Box<Sleep>>>,
        cx: &mut Context<'_>,
    ) -> io::Result<()> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            *sleep = None;
            return Ok(());
        }
        let Some(gate) = self.gate.upgrade() else {
            return Ok(());
        };
        let first = self.requests.load(Ordering::Acquire) == 0;
        let wait = if first {
            gate.head_timeout
        } else {
            gate.idle_timeout
        };
        let deadline = *self.idle_since() + wait;
        let sleep = sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            let (counter, why) = if first {
                (
                    &gate.counters.head_timeouts,
                    "no request head within the head timeout",
                )
            } else {
                (&gate.counters.idle_timeouts, "idle past the idle timeout")
            };
            counter.fetch_add(1, Ordering::Relaxed);
            return Err(io::Error::new(io::ErrorKind::TimedOut, why));
        }
        Ok(())
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.upgrade() {
            gate.counters.open.fetch_sub(1, Ordering::Relaxed);
            if self
                .state
                .compare_exchange(PENDING, CLOSED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                gate.pending_now.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// A request in flight on a connection; when its response has been sent
/// whole (or dropped), the connection counts as idle from then.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn start(conn: &Arc<ConnState>) -> InFlight {
        conn.requests.fetch_add(1, Ordering::AcqRel);
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(conn.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since() = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        // The reader may be waiting with no deadline set; let it set one.
        self.0.waker.wake();
    }
}

/// Whether a request may take a reserve place: the operator's reads.
fn is_reserved(req: &Request) -> bool {
    req.method() == Method::GET && matches!(req.uri().path(), "/v1/status" | "/metrics")
}

/// The outermost layer of every socket's router: admits the connection at
/// its first request (or answers 503 and closes it), and counts the request
/// in flight until its response has been sent.
pub(crate) async fn admit(req: Request, next: Next) -> Response {
    let Some(conn) = req
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.conn.clone())
    else {
        // Every socket's service is made with a `Peer`; without one there
        // is nothing to bound.
        return next.run(req).await;
    };
    let in_flight = InFlight::start(&conn);
    let close_after = match conn.admit(is_reserved(&req)) {
        Ok(close) => close,
        Err(e) => {
            let mut response = e.into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
    };
    let mut response = next.run(req).await;
    if close_after {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response.map(|body| {
        Body::new(Counted {
            body,
            _in_flight: in_flight,
        })
    })
}

/// A response body that holds its request [`InFlight`] until it has been
/// sent whole (or dropped); everything else is the inner body's.
struct Counted {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;

    fn gate(places: usize, reserve: usize, pending_max: usize) -> Arc<Gate> {
        Gate::with_bounds(places, reserve, pending_max, Timeouts::default())
    }

    #[test]
    fn a_new_connection_past_the_pending_bound_closes_the_oldest_pending_one() {
        let g = gate(4, 0, 2);
        let first = g.accepted();
        let second = g.accepted();
        assert_eq!(g.pending_now(), 2);
        let third = g.accepted();
        assert!(first.closed_by_gate.load(Ordering::Acquire));
        assert!(!second.closed_by_gate.load(Ordering::Acquire));
        assert!(!third.closed_by_gate.load(Ordering::Acquire));
        assert_eq!(g.pending_now(), 2);
        assert_eq!(g.counters().evicted_pending.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_admitted_connection_is_never_closed_to_make_room() {
        let g = gate(4, 0, 1);
        let admitted = g.accepted();
        assert!(!admitted.admit(false).unwrap());
        assert_eq!(g.pending_now(), 0);
        let pending = g.accepted();
        let newer = g.accepted();
        assert!(!admitted.closed_by_gate.load(Ordering::Acquire));
        assert!(pending.closed_by_gate.load(Ordering::Acquire));
        assert!(!newer.closed_by_gate.load(Ordering::Acquire));
    }

    #[test]
    fn past_its_places_only_a_reserved_request_is_admitted_and_then_closes() {
        let g = gate(1, 1, 8);
        let a = g.accepted();
        assert!(!a.admit(false).unwrap());
        let b = g.accepted();
        assert!(b.admit(false).is_err());
        assert!(
            b.admit(true).unwrap(),
            "a reserve place closes after its answer"
        );
        let c = g.accepted();
        assert!(c.admit(true).is_err(), "the reserve is full too");
        drop(a);
        assert!(!c.admit(false).unwrap(), "a place given back is taken");
        assert_eq!(g.counters().refused_full.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn closed_connections_leave_the_pending_count_and_the_queue_stays_bounded() {
        let g = gate(1, 0, 4);
        for _ in 0..100 {
            drop(g.accepted());
        }
        assert_eq!(g.pending_now(), 0);
        assert!(g.pending_queue().len() <= 2 * 4);
        assert_eq!(g.counters().open.load(Ordering::Relaxed), 0);
    }
}
