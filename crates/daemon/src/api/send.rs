//! `POST /v1/send` and `POST /v1/send/batch` (a JSON array, or NDJSON streamed in).
//!
//! NDJSON (`Content-Type: application/x-ndjson`): one send request per line.
//! Lines are committed in chunks as they arrive (a chunk is whatever has
//! arrived, up to a signed batch's worth), so a long stream never sits in
//! memory. The first chunk is committed before the answer starts, so a bad
//! first line or a full outbox is a plain error status. After it, the next
//! chunk is read, parsed and handed to the node while the one before
//! commits (at most [`NDJSON_CHUNKS_IN_FLIGHT`] at once), so consecutive
//! chunks can share a commit. The answer is NDJSON: one `{id, stream, seq}`
//! line per message, in order, each after its commit, then exactly one final
//! line, `{"done": {"count": N}}` or `{"error": {code, message, committed:
//! N}}` — the first N lines were committed; a line that is not a valid
//! send request stops the stream with nothing after it committed, and if
//! the node refuses a chunk while later ones were already handed to it,
//! the error's message says how many of those were committed too.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Write as _;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::{FutureExt as _, StreamExt as _};
use http_body_util::BodyExt as _;
use mesh_protocol::{Cursor, MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES, StreamId};

use super::json::{BatchResponse, SendRequest, StreamJson};
use super::node::PendingSends;
use super::routes::{parse_json, parse_node_id, read_body};
use super::{
    ApiError, ApiState, BATCH_MSGS_MAX, BATCH_REQUEST_BYTES_MAX, OutMessage,
    SEND_REQUEST_BYTES_MAX, Sent,
};

/// NDJSON chunks handed to the node and not yet answered, at most: one
/// committing and the rest waiting to share the next commit. Each holds at
/// most a signed batch's worth (1 MiB of payload). 4 rather than 2 made the
/// sender's CPU per message 15 % lower in `mesh bench local send-pipelined`
/// (bigger commits), at the same rate.
pub(super) const NDJSON_CHUNKS_IN_FLIGHT: usize = 4;

/// Checks one send request and turns it into a message.
fn message(req: SendRequest) -> Result<OutMessage, ApiError> {
    let to = parse_node_id(&req.to)?;
    let body = req
        .encoding
        .decode(req.body)
        .map_err(ApiError::BadRequest)?;
    if body.len() as u64 > MAX_BATCH_PAYLOAD_BYTES {
        return Err(ApiError::BadRequest(format!(
            "the message body is {} bytes, more than the {MAX_BATCH_PAYLOAD_BYTES} a message may carry",
            body.len()
        )));
    }
    Ok(OutMessage {
        to,
        kind: req.msg_kind,
        body,
    })
}

/// Writes send answers (`{id, stream, seq}`) as JSON, each stream's JSON
/// made once for a run of answers on it rather than once per answer.
#[derive(Default)]
struct Answers {
    stream: Option<(StreamId, Vec<u8>)>,
}

impl Answers {
    /// Appends the answer to `sent` to `out`, as `SendResponse` would be written.
    fn push(&mut self, st: &ApiState, sent: &Sent, out: &mut Vec<u8>) {
        if self.stream.as_ref().is_none_or(|(s, _)| *s != sent.stream) {
            let json = serde_json::to_vec(&StreamJson::from(&sent.stream)).unwrap_or_default();
            self.stream = Some((sent.stream.clone(), json));
        }
        let cursor = Cursor::new(&st.inner.node, st.inner.epoch, sent.arrival);
        // Writing to a Vec cannot fail; the cursor is base32 with a plain
        // prefix, so it needs no escaping.
        let _ = write!(out, "{{\"id\":\"{cursor}\",\"stream\":");
        if let Some((_, json)) = &self.stream {
            out.extend_from_slice(json);
        }
        let _ = write!(out, ",\"seq\":{}}}", sent.seq);
    }

    /// The answer lines of `sent`, one per message.
    fn lines(&mut self, st: &ApiState, sent: &[Sent]) -> Bytes {
        let mut out = Vec::with_capacity(sent.len() * 256);
        for s in sent {
            self.push(st, s, &mut out);
            out.push(b'\n');
        }
        out.into()
    }
}

impl ApiState {
    fn count_sent(&self, n: usize) {
        self.inner
            .counters
            .sent
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Hands `msgs` to the node; resolves once they are handed over, with
    /// the future of their answers (checked to be one per message).
    async fn submit(&self, msgs: Vec<OutMessage>) -> PendingSends {
        let n = msgs.len();
        let pending = self.inner.node_api.clone().submit_batch(msgs).await;
        let st = self.clone();
        PendingSends::new(async move {
            let sent = pending.answers().await?;
            if sent.len() != n {
                return Err(ApiError::Internal(format!(
                    "the node answered {} sends for {n} messages",
                    sent.len()
                )));
            }
            st.count_sent(n);
            Ok(sent)
        })
    }

    async fn commit_batch(&self, msgs: Vec<OutMessage>) -> Result<Vec<Sent>, ApiError> {
        self.submit(msgs).await.answers().await
    }
}

pub(super) async fn send_one(State(st): State<ApiState>, req: Request) -> Response {
    let answer = async {
        let bytes = read_body(
            req.into_body(),
            SEND_REQUEST_BYTES_MAX,
            "; a message body may be at most 1 MiB",
        )
        .await?;
        let msg = message(parse_json(&bytes)?)?;
        let sent = st.inner.node_api.send(msg).await?;
        st.count_sent(1);
        let mut out = Vec::with_capacity(256);
        Answers::default().push(&st, &sent, &mut out);
        Ok::<_, ApiError>(out)
    };
    match answer.await {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn send_batch(State(st): State<ApiState>, req: Request) -> Response {
    let ndjson = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let v = v.split(';').next().unwrap_or("").trim();
            v.eq_ignore_ascii_case("application/x-ndjson")
                || v.eq_ignore_ascii_case("application/jsonl")
        })
        .unwrap_or(false);
    if ndjson {
        send_ndjson(st, req.into_body()).await
    } else {
        send_array(st, req.into_body())
            .await
            .map(IntoResponse::into_response)
            .unwrap_or_else(IntoResponse::into_response)
    }
}

async fn send_array(st: ApiState, body: Body) -> Result<Json<BatchResponse>, ApiError> {
    let bytes = read_body(
        body,
        BATCH_REQUEST_BYTES_MAX,
        "; send larger batches as NDJSON (Content-Type: application/x-ndjson)",
    )
    .await?;
    let reqs: Vec<SendRequest> = parse_json(&bytes)?;
    if reqs.is_empty() || reqs.len() > BATCH_MSGS_MAX {
        return Err(ApiError::BadRequest(format!(
            "a batch holds 1 to {BATCH_MSGS_MAX} messages, not {}",
            reqs.len()
        )));
    }
    let msgs = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| message(r).map_err(|e| at_item(e, i)))
        .collect::<Result<Vec<_>, _>>()?;
    let sent = st.commit_batch(msgs).await?;
    Ok(Json(BatchResponse {
        sent: sent.iter().map(|s| st.answer(s)).collect(),
    }))
}

impl ApiState {
    fn answer(&self, sent: &Sent) -> super::json::SendResponse {
        super::json::SendResponse {
            id: self.cursor_text(sent.arrival),
            stream: (&sent.stream).into(),
            seq: sent.seq,
        }
    }
}

/// Prefixes a caller error with the item it is about.
fn at_item(e: ApiError, index: usize) -> ApiError {
    match e {
        ApiError::BadRequest(m) => ApiError::BadRequest(format!("item {index}: {m}")),
        ApiError::BadJson(m) => ApiError::BadJson(format!("item {index}: {m}")),
        other => other,
    }
}

/// NDJSON lines read from a streamed body and parsed into the next chunk.
/// Every await in here is cancel-safe: what was read is kept in `buf` and
/// what was parsed in `chunk`.
struct Lines {
    body: Body,
    buf: BytesMut,
    /// Bytes at the start of `buf` already searched for a line end.
    scanned: usize,
    eof: bool,
    /// Lines taken so far (1-based number of the last one).
    line_no: usize,
    /// Messages parsed and not yet handed on, and their payload bytes.
    chunk: Vec<OutMessage>,
    chunk_bytes: u64,
}

impl Lines {
    fn new(body: Body) -> Lines {
        Lines {
            body,
            buf: BytesMut::new(),
            scanned: 0,
            eof: false,
            line_no: 0,
            chunk: Vec::new(),
            chunk_bytes: 0,
        }
    }

    /// The next complete line already buffered (the remainder at the end of the body).
    fn take_line(&mut self) -> Result<Option<Bytes>, ApiError> {
        let line = if let Some(i) = find_newline(&self.buf[self.scanned..]) {
            let mut line = self.buf.split_to(self.scanned + i + 1);
            line.truncate(line.len() - 1);
            line.freeze()
        } else if self.buf.len() > SEND_REQUEST_BYTES_MAX {
            return Err(ApiError::BodyTooLarge {
                limit_bytes: SEND_REQUEST_BYTES_MAX,
                hint: "; that is the limit of one NDJSON line",
            });
        } else if self.eof && !self.buf.is_empty() {
            self.buf.split().freeze()
        } else {
            self.scanned = self.buf.len();
            return Ok(None);
        };
        self.scanned = 0;
        self.line_no += 1;
        Ok(Some(line))
    }

    /// Whether the chunk holds a signed batch's worth.
    fn chunk_full(&self) -> bool {
        self.chunk.len() >= MAX_BATCH_ENTRIES || self.chunk_bytes >= MAX_BATCH_PAYLOAD_BYTES
    }

    /// Parses buffered lines into the chunk until it is full.
    fn parse_buffered(&mut self) -> Result<(), ApiError> {
        while !self.chunk_full() {
            let Some(line) = self.take_line()? else {
                return Ok(());
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let no = self.line_no;
            let msg = parse_json::<SendRequest>(&line)
                .and_then(message)
                .map_err(|e| at_line(e, no))?;
            self.chunk_bytes += msg.body.len() as u64;
            self.chunk.push(msg);
        }
        Ok(())
    }

    /// Takes in one frame of the body.
    fn absorb(
        &mut self,
        frame: Option<Result<hyper::body::Frame<Bytes>, axum::Error>>,
    ) -> Result<(), ApiError> {
        match frame {
            None => self.eof = true,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    self.buf.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => {
                return Err(ApiError::BadRequest(format!(
                    "reading the request body failed: {e}"
                )));
            }
        }
        Ok(())
    }

    /// Waits for the next frame of the body and takes it in (cancel-safe).
    async fn read_frame(&mut self) -> Result<(), ApiError> {
        let frame = self.body.frame().await;
        self.absorb(frame)
    }

    /// Parses what has arrived; true when the chunk should be handed on:
    /// it is full, or the body ended, or nothing more has arrived yet (a
    /// chunk is committed rather than held for a slow writer).
    fn chunk_ready(&mut self) -> Result<bool, ApiError> {
        loop {
            self.parse_buffered()?;
            if self.chunk.is_empty() {
                return Ok(false);
            }
            if self.chunk_full() || self.eof {
                return Ok(true);
            }
            // Polling a body frame is cancel-safe.
            match self.body.frame().now_or_never() {
                Some(frame) => self.absorb(frame)?,
                None => return Ok(true),
            }
        }
    }

    fn take_chunk(&mut self) -> Vec<OutMessage> {
        self.chunk_bytes = 0;
        std::mem::take(&mut self.chunk)
    }

    /// The next chunk: what has arrived, at least one message, at most a
    /// signed batch's worth; empty at the end of the body.
    async fn next_chunk(&mut self) -> Result<Vec<OutMessage>, ApiError> {
        loop {
            if self.chunk_ready()? {
                return Ok(self.take_chunk());
            }
            if self.eof {
                return Ok(Vec::new());
            }
            self.read_frame().await?;
        }
    }
}

/// Where the first `\n` of `bytes` is. Looks at a block of bytes at a time
/// (the compiler turns each block's test into a few vector instructions):
/// a byte-at-a-time search was the largest cost of parsing a 1 KiB line.
fn find_newline(bytes: &[u8]) -> Option<usize> {
    const BLOCK: usize = 32;
    let mut blocks = bytes.chunks_exact(BLOCK);
    let mut at = 0;
    for block in &mut blocks {
        if block.iter().fold(false, |found, &b| found | (b == b'\n')) {
            return block.iter().position(|&b| b == b'\n').map(|i| at + i);
        }
        at += BLOCK;
    }
    blocks
        .remainder()
        .iter()
        .position(|&b| b == b'\n')
        .map(|i| at + i)
}

fn at_line(e: ApiError, line: usize) -> ApiError {
    match e {
        ApiError::BadRequest(m) => ApiError::BadRequest(format!("line {line}: {m}")),
        ApiError::BadJson(m) => ApiError::BadJson(format!("line {line}: {m}")),
        other => other,
    }
}

fn json_line(v: &impl serde::Serialize) -> Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line.into()
}

/// The NDJSON answer after its first chunk: reads, parses and hands on
/// chunks while earlier ones commit, and yields each chunk's answer lines
/// once it is committed, in order.
struct NdjsonSends {
    st: ApiState,
    lines: Lines,
    answers: Answers,
    /// Chunks handed to the node, oldest first.
    in_flight: VecDeque<PendingSends>,
    /// Lines answered so far.
    committed: u64,
    /// A line that stopped the stream, reported once the chunks before it are answered.
    stopped: Option<ApiError>,
    finished: bool,
}

impl NdjsonSends {
    /// The next piece of the answer; `None` after the final line.
    async fn next(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        loop {
            // Parse what has arrived even while no chunk may be handed on,
            // so the buffer holds at most one unfinished line.
            if self.stopped.is_none()
                && let Err(e) = self.lines.parse_buffered()
            {
                self.stopped = Some(e);
            }
            if self.stopped.is_none() && self.in_flight.len() < NDJSON_CHUNKS_IN_FLIGHT {
                match self.lines.chunk_ready() {
                    Ok(true) => {
                        let chunk = self.lines.take_chunk();
                        let pending = self.st.submit(chunk).await;
                        self.in_flight.push_back(pending);
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => self.stopped = Some(e),
                }
            }
            let reading = self.stopped.is_none() && !self.lines.eof && !self.lines.chunk_full();
            let Some(front) = self.in_flight.front_mut() else {
                if reading {
                    if let Err(e) = self.lines.read_frame().await {
                        self.stopped = Some(e);
                    }
                    continue;
                }
                self.finished = true;
                let last = match self.stopped.take() {
                    Some(e) => e.to_json(Some(serde_json::json!({ "committed": self.committed }))),
                    None => serde_json::json!({ "done": { "count": self.committed } }),
                };
                return Some(json_line(&last));
            };
            let body = &mut self.lines.body;
            let answer = tokio::select! {
                biased;
                answer = &mut front.0 => answer,
                frame = body.frame(), if reading => {
                    if let Err(e) = self.lines.absorb(frame) {
                        self.stopped = Some(e);
                    }
                    continue;
                }
            };
            self.in_flight.pop_front();
            match answer {
                Ok(sent) => {
                    self.committed += sent.len() as u64;
                    return Some(self.answers.lines(&self.st, &sent));
                }
                Err(e) => return Some(self.refused(e).await),
            }
        }
    }

    /// The final line after the node refused a chunk: waits for the chunks
    /// handed on after it and says how many of their messages were committed.
    async fn refused(&mut self, e: ApiError) -> Bytes {
        self.finished = true;
        let (mut later, mut later_ok, mut later_failed) = (0usize, 0usize, 0usize);
        while let Some(pending) = self.in_flight.pop_front() {
            later += 1;
            match pending.answers().await {
                Ok(sent) => later_ok += sent.len(),
                Err(_) => later_failed += 1,
            }
        }
        let e = if later == 0 {
            e
        } else {
            let mut note = format!(
                "{later_ok} messages of the {later} chunks handed to the node after this one were committed"
            );
            if later_failed > 0 {
                note.push_str(&format!(
                    ", and {later_failed} of those chunks were refused in part or whole"
                ));
            }
            note.push_str(" (GET /v1/events shows which)");
            e.with_note(&note)
        };
        json_line(&e.to_json(Some(serde_json::json!({ "committed": self.committed }))))
    }
}

async fn send_ndjson(st: ApiState, body: Body) -> Response {
    let mut lines = Lines::new(body);
    let error_response = |e: ApiError| {
        let status = e.status();
        (
            status,
            Json(e.to_json(Some(serde_json::json!({ "committed": 0 })))),
        )
            .into_response()
    };
    let first = match lines.next_chunk().await {
        Ok(chunk) if chunk.is_empty() => {
            return error_response(ApiError::BadRequest(
                "the NDJSON body holds no messages".into(),
            ));
        }
        Ok(chunk) => chunk,
        Err(e) => return error_response(e),
    };
    let first = match st.commit_batch(first).await {
        Ok(sent) => sent,
        Err(e) => return error_response(e),
    };
    let mut answers = Answers::default();
    let head = answers.lines(&st, &first);
    let rest = NdjsonSends {
        st,
        lines,
        answers,
        in_flight: VecDeque::new(),
        committed: first.len() as u64,
        stopped: None,
        finished: false,
    };
    let stream =
        futures_util::stream::once(std::future::ready(head))
            .chain(futures_util::stream::unfold(rest, |mut rest| async move {
                rest.next().await.map(|b| (b, rest))
            }));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream.map(Ok::<_, Infallible>)),
    )
        .into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;
    use mesh_protocol::NodeId;

    #[test]
    fn a_send_request_must_name_a_node_and_carry_a_decodable_body() {
        let node = mesh_protocol::SecretKey::from_bytes(&[7; 32]).public();
        let ok = SendRequest {
            to: node.to_string(),
            body: "aGk=".into(),
            encoding: super::super::json::BodyEncoding::Base64,
            msg_kind: 3,
        };
        let m = message(ok.clone()).unwrap();
        assert_eq!((m.to, m.kind, m.body.as_slice()), (node, 3, &b"hi"[..]));
        let bad_to = SendRequest {
            to: "bob".into(),
            ..ok.clone()
        };
        assert_eq!(message(bad_to).unwrap_err().code(), "bad_request");
        let bad_b64 = SendRequest {
            body: "!!".into(),
            ..ok.clone()
        };
        assert_eq!(message(bad_b64).unwrap_err().code(), "bad_request");
        let big = SendRequest {
            body: "x".repeat(MAX_BATCH_PAYLOAD_BYTES as usize + 1),
            encoding: super::super::json::BodyEncoding::Text,
            ..ok
        };
        assert_eq!(message(big).unwrap_err().code(), "bad_request");
    }

    use std::sync::Arc;

    use mesh_protocol::{Epoch, SecretKey};
    use mesh_store::{Arrival, MemStore};
    use tokio::sync::{Semaphore, mpsc, watch};

    use super::super::json::SendResponse;
    use super::super::node::{BoxFuture, NodeApi, NodeStatus, PeerStatus};
    use super::super::{ApiParts, ApiState};

    /// A node that takes messages at once and commits a chunk only when the
    /// test hands it a permit, so the test decides what is in flight.
    struct GatedNode {
        me: NodeId,
        epoch: Epoch,
        /// Bodies handed over so far, in order.
        handed: watch::Sender<Vec<Vec<u8>>>,
        /// One permit per chunk allowed to commit.
        commits: Semaphore,
    }

    fn not_here<T: Send + 'static>() -> BoxFuture<'static, Result<T, ApiError>> {
        Box::pin(async { Err(ApiError::Internal("not in this test".into())) })
    }

    impl NodeApi for GatedNode {
        fn send_batch(&self, _: Vec<OutMessage>) -> BoxFuture<'_, Result<Vec<Sent>, ApiError>> {
            not_here()
        }

        fn submit_batch(
            self: Arc<Self>,
            msgs: Vec<OutMessage>,
        ) -> BoxFuture<'static, PendingSends> {
            Box::pin(async move {
                let mut first = 0;
                self.handed.send_modify(|h| {
                    first = h.len() as u64;
                    h.extend(msgs.iter().map(|m| m.body.clone()));
                });
                PendingSends::new(async move {
                    self.commits
                        .acquire()
                        .await
                        .map_err(|e| ApiError::Internal(e.to_string()))?
                        .forget();
                    Ok(msgs
                        .iter()
                        .zip(first + 1..)
                        .map(|(m, seq)| Sent {
                            stream: StreamId::direct(self.me, self.epoch, m.to),
                            seq,
                            arrival: seq,
                        })
                        .collect())
                })
            })
        }

        fn status(&self) -> BoxFuture<'_, Result<NodeStatus, ApiError>> {
            not_here()
        }

        fn ticket(&self) -> BoxFuture<'_, Result<mesh_protocol::NodeTicket, ApiError>> {
            not_here()
        }

        fn add_peer(
            &self,
            _: mesh_protocol::NodeTicket,
        ) -> BoxFuture<'_, Result<PeerStatus, ApiError>> {
            not_here()
        }

        fn list_peers(&self) -> BoxFuture<'_, Result<Vec<PeerStatus>, ApiError>> {
            not_here()
        }

        fn remove_peer(&self, _: NodeId) -> BoxFuture<'_, Result<(), ApiError>> {
            not_here()
        }

        fn put_cursor(&self, _: String, _: Arrival) -> BoxFuture<'_, Result<(), ApiError>> {
            not_here()
        }

        fn record_subscriber_lag(
            &self,
            _: String,
            _: Arrival,
            _: Arrival,
        ) -> BoxFuture<'_, Result<Arrival, ApiError>> {
            not_here()
        }
    }

    fn gated_api() -> (ApiState, Arc<GatedNode>) {
        let me = SecretKey::from_bytes(&[1; 32]).public();
        let epoch = Epoch([2; 16]);
        let node = Arc::new(GatedNode {
            me,
            epoch,
            handed: watch::Sender::new(Vec::new()),
            commits: Semaphore::new(0),
        });
        let (_, head) = watch::channel::<Arrival>(0);
        let st = ApiState::new(ApiParts {
            node: me,
            epoch,
            store: Arc::new(MemStore::new(epoch)),
            head,
            node_api: node.clone(),
            metrics: None,
            subscriber_buffer: 16,
            subscriber_stall: std::time::Duration::from_secs(1),
        });
        (st, node)
    }

    /// Runs a test that waits on the handler, failing it rather than hanging.
    async fn bounded(test: impl std::future::Future<Output = ()>) {
        tokio::time::timeout(std::time::Duration::from_secs(60), test)
            .await
            .expect("the test did not finish in 60 s");
    }

    fn send_line(to: &NodeId, i: u64) -> String {
        format!("{{\"to\":\"{to}\",\"body\":\"m{i}\"}}\n")
    }

    #[tokio::test]
    async fn ndjson_lines_arriving_while_chunks_commit_are_handed_on_and_answered_once_in_order() {
        bounded(async {
            let (st, node) = gated_api();
            let to = SecretKey::from_bytes(&[3; 32]).public();
            let (tx, rx) = mpsc::channel::<Bytes>(8);
            let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
            }));
            let mut handed = node.handed.subscribe();
            let frame = |lines: std::ops::Range<u64>| -> Bytes {
                lines.map(|i| send_line(&to, i)).collect::<String>().into()
            };

            // The first chunk (lines 1–3) commits before the answer starts.
            tx.send(frame(1..4)).await.unwrap();
            node.commits.add_permits(1);
            let resp = send_ndjson(st, body).await;
            assert_eq!(resp.status(), StatusCode::OK);
            let (lines_tx, mut answers) = mpsc::unbounded_channel::<String>();
            let reader = tokio::spawn(async move {
                let mut body = resp.into_body();
                let mut buf = Vec::new();
                while let Some(frame) = body.frame().await {
                    if let Ok(data) = frame.unwrap().into_data() {
                        buf.extend_from_slice(&data);
                    }
                    while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=i).collect();
                        lines_tx.send(String::from_utf8(line).unwrap()).unwrap();
                    }
                }
            });
            for seq in 1..=3 {
                let a: SendResponse = serde_json::from_str(&answers.recv().await.unwrap()).unwrap();
                assert_eq!(a.seq, seq);
            }

            // Chunks of two lines are handed on while the ones before them wait
            // for their commit, up to the limit of chunks in flight; one more
            // line is read but waits until a chunk is answered.
            let mut next = 4u64;
            for _ in 0..NDJSON_CHUNKS_IN_FLIGHT {
                tx.send(frame(next..next + 2)).await.unwrap();
                next += 2;
                handed
                    .wait_for(|h| h.len() as u64 == next - 1)
                    .await
                    .unwrap();
            }
            let last = next;
            tx.send(frame(last..last + 1)).await.unwrap();
            drop(tx);
            assert!(
                answers.try_recv().is_err(),
                "nothing is answered before its commit"
            );
            assert_eq!(node.handed.borrow().len() as u64, last - 1);

            // Each commit answers its own lines, in order, exactly once; then
            // the waiting line is handed on.
            node.commits.add_permits(1);
            for seq in 4..=5 {
                let a: SendResponse = serde_json::from_str(&answers.recv().await.unwrap()).unwrap();
                assert_eq!(a.seq, seq);
            }
            handed.wait_for(|h| h.len() as u64 == last).await.unwrap();
            node.commits.add_permits(NDJSON_CHUNKS_IN_FLIGHT);
            for seq in 6..=last {
                let a: SendResponse = serde_json::from_str(&answers.recv().await.unwrap()).unwrap();
                assert_eq!(a.seq, seq);
                assert_eq!(a.stream.channel, format!("direct:{to}"));
            }
            let done: serde_json::Value =
                serde_json::from_str(&answers.recv().await.unwrap()).unwrap();
            assert_eq!(done, serde_json::json!({ "done": { "count": last } }));
            reader.await.unwrap();
            assert!(
                answers.recv().await.is_none(),
                "nothing after the final line"
            );
            let bodies: Vec<Vec<u8>> = (1..=last).map(|i| format!("m{i}").into_bytes()).collect();
            assert_eq!(
                *node.handed.borrow(),
                bodies,
                "each line handed on once, in order"
            );
        })
        .await;
    }

    #[tokio::test]
    async fn a_bad_line_after_lines_in_flight_is_reported_after_their_answers() {
        bounded(async {
            let (st, node) = gated_api();
            let to = SecretKey::from_bytes(&[3; 32]).public();
            let body = format!("{}{}", send_line(&to, 1), send_line(&to, 2));
            let (tx, rx) = mpsc::channel::<Bytes>(8);
            tx.send(body.into()).await.unwrap();
            let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
            }));
            node.commits.add_permits(1);
            let resp = send_ndjson(st, body).await;
            let collect =
                tokio::spawn(async move { resp.into_body().collect().await.unwrap().to_bytes() });
            let mut handed = node.handed.subscribe();
            tx.send(send_line(&to, 3).into()).await.unwrap();
            handed.wait_for(|h| h.len() == 3).await.unwrap();
            tx.send(format!("not json\n{}", send_line(&to, 5)).into())
                .await
                .unwrap();
            drop(tx);
            node.commits.add_permits(1);
            let out = collect.await.unwrap();
            let lines: Vec<serde_json::Value> = out
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).unwrap())
                .collect();
            assert_eq!(lines.len(), 4, "{lines:?}");
            assert_eq!(lines[2]["seq"], 3);
            assert_eq!(lines[3]["error"]["code"], "bad_json");
            assert_eq!(lines[3]["error"]["committed"], 3);
            assert_eq!(
                node.handed.borrow().len(),
                3,
                "nothing after the bad line is handed on"
            );
        })
        .await;
    }

    #[test]
    fn find_newline_finds_the_first_line_end_in_and_between_blocks() {
        for len in [0usize, 1, 31, 32, 33, 64, 100] {
            let mut bytes = vec![b'x'; len];
            assert_eq!(find_newline(&bytes), None);
            for at in [0, len / 2, len.saturating_sub(1)] {
                if at < len {
                    bytes[at] = b'\n';
                    assert_eq!(find_newline(&bytes), Some(at), "len {len} at {at}");
                    bytes[len - 1] = b'\n';
                    assert_eq!(find_newline(&bytes), Some(at), "len {len} at {at}");
                    bytes.fill(b'x');
                }
            }
        }
    }

    #[test]
    fn an_answer_is_written_as_serde_writes_a_send_response() {
        let (st, _) = gated_api();
        let me = SecretKey::from_bytes(&[1; 32]).public();
        let mut answers = Answers::default();
        let mut out = Vec::new();
        for (to, seq) in [([3u8; 32], 7), ([3; 32], 8), ([4; 32], 1)] {
            let to = SecretKey::from_bytes(&to).public();
            let sent = Sent {
                stream: StreamId::direct(me, Epoch([2; 16]), to),
                seq,
                arrival: 40 + seq,
            };
            out.clear();
            answers.push(&st, &sent, &mut out);
            assert_eq!(out, serde_json::to_vec(&st.answer(&sent)).unwrap());
        }
    }
}
