//! NDJSON `POST /v1/send/batch` (`Content-Type: application/x-ndjson`): one
//! send request per line, read and committed in chunks as they arrive.
//!
//! A chunk is whatever has arrived, up to a signed batch's worth, so a long
//! stream never sits in memory. The first chunk is committed before the
//! answer starts, so a bad first line or a full outbox is a plain error
//! status. After it, the next chunk is read, parsed and handed to the node
//! while the one before commits (at most [`NDJSON_CHUNKS_IN_FLIGHT`] at
//! once), so consecutive chunks can share a commit. The answer is NDJSON:
//! one `{id, stream, seq}` line per message, in order, each after its
//! commit, then exactly one final line, `{"done": {"count": N}}` or
//! `{"error": {code, fault, message, committed: N}}` — the first N lines
//! were committed; a line that is not a valid send request stops the
//! stream with nothing after it committed, and if the node refuses a chunk
//! while later ones were already handed to it, the error's message says
//! how many of those were committed too.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::Json;
use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures_util::{FutureExt as _, StreamExt as _};
use http_body_util::BodyExt as _;
use mesh_protocol::{MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES};

use super::send::{Answers, Pending};
use super::{ApiError, CallerError, SEND_REQUEST_BYTES_MAX};
use crate::bus::Outgoing;

/// NDJSON chunks handed to the node and not yet answered, at most: one
/// committing and the rest waiting to share the next commit. Each holds at
/// most a signed batch's worth (1 MiB of payload).
pub(super) const NDJSON_CHUNKS_IN_FLIGHT: usize = 4;

/// Whether a request's body is NDJSON (`application/x-ndjson` or
/// `application/jsonl`), not a JSON array.
pub(super) fn is_ndjson(req: &axum::extract::Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            let v = v.split(';').next().unwrap_or("").trim();
            v.eq_ignore_ascii_case("application/x-ndjson")
                || v.eq_ignore_ascii_case("application/jsonl")
        })
        .unwrap_or(false)
}

/// How a chunk is handed to the node: resolves once it is queued, with the
/// future of its answers (`ApiState::submit` in the daemon).
pub(super) trait Submit: Fn(Vec<Outgoing>) -> Self::Queued + Send + Sync + 'static {
    /// The hand-over.
    type Queued: Future<Output = Pending> + Send;
}

impl<F, Q> Submit for F
where
    F: Fn(Vec<Outgoing>) -> Q + Send + Sync + 'static,
    Q: Future<Output = Pending> + Send,
{
    type Queued = Q;
}

/// How one NDJSON line becomes a message (a node send, an agent send).
pub(super) type ParseLine = Box<dyn Fn(&[u8]) -> Result<Outgoing, ApiError> + Send + Sync>;

/// NDJSON lines read from a streamed body and parsed into the next chunk.
/// Every await in here is cancel-safe: what was read is kept in `buf` and
/// what was parsed in `chunk`.
struct Lines {
    body: Body,
    parse: ParseLine,
    buf: BytesMut,
    /// Bytes at the start of `buf` already searched for a line end.
    scanned: usize,
    eof: bool,
    /// Lines taken so far (1-based number of the last one).
    line_no: usize,
    /// Messages parsed and not yet handed on, and their payload bytes.
    chunk: Vec<Outgoing>,
    chunk_bytes: u64,
}

impl Lines {
    fn new(body: Body, parse: ParseLine) -> Lines {
        Lines {
            body,
            parse,
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
        let line = take_line(&mut self.buf, &mut self.scanned, self.eof)?;
        if line.is_some() {
            self.line_no += 1;
        }
        Ok(line)
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
            let msg = (self.parse)(&line).map_err(|e| e.at(format!("line {no}")))?;
            self.chunk_bytes += msg.payload.len() as u64;
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
            Some(Err(e)) => return Err(CallerError::BodyUnreadable(e.to_string()).into()),
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

    fn take_chunk(&mut self) -> Vec<Outgoing> {
        self.chunk_bytes = 0;
        std::mem::take(&mut self.chunk)
    }

    /// The next chunk: what has arrived, at least one message, at most a
    /// signed batch's worth; empty at the end of the body.
    async fn next_chunk(&mut self) -> Result<Vec<Outgoing>, ApiError> {
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

/// The next complete line in `buf` (without its `\n`), taken out of it; at
/// the end of the body (`eof`) the remainder is the last line. `scanned`
/// is how much of `buf` was searched for a line end before (so each byte
/// is searched once), kept by the caller between calls. A line longer than
/// [`SEND_REQUEST_BYTES_MAX`] is refused before it is all buffered.
pub(super) fn take_line(
    buf: &mut BytesMut,
    scanned: &mut usize,
    eof: bool,
) -> Result<Option<Bytes>, ApiError> {
    let line = if let Some(i) = memchr::memchr(b'\n', &buf[*scanned..]) {
        let mut line = buf.split_to(*scanned + i + 1);
        line.truncate(line.len() - 1);
        line.freeze()
    } else if buf.len() > SEND_REQUEST_BYTES_MAX {
        return Err(CallerError::BodyTooLarge {
            limit_bytes: SEND_REQUEST_BYTES_MAX,
            hint: "; that is the limit of one NDJSON line",
        }
        .into());
    } else if eof && !buf.is_empty() {
        buf.split().freeze()
    } else {
        *scanned = buf.len();
        return Ok(None);
    };
    *scanned = 0;
    Ok(Some(line))
}

fn json_line(v: &impl serde::Serialize) -> Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line.into()
}

/// The NDJSON answer after its first chunk: reads, parses and hands on
/// chunks while earlier ones commit, and yields each chunk's answer lines
/// once it is committed, in order.
struct NdjsonSends<S> {
    submit: S,
    lines: Lines,
    answers: Answers,
    /// Chunks handed to the node, oldest first.
    in_flight: VecDeque<Pending>,
    /// Lines answered so far.
    committed: u64,
    /// A line that stopped the stream, reported once the chunks before it are answered.
    stopped: Option<ApiError>,
    finished: bool,
}

impl<S: Submit> NdjsonSends<S> {
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
                        let pending = (self.submit)(chunk).await;
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
                    return Some(self.answers.lines(&sent));
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

/// The answer to an NDJSON `POST /v1/send/batch` of `body`: chunks go to
/// the node through `submit`, answers are written by `answers`.
pub(super) async fn respond<S: Submit>(
    submit: S,
    mut answers: Answers,
    body: Body,
    parse: impl Fn(&[u8]) -> Result<Outgoing, ApiError> + Send + Sync + 'static,
) -> Response {
    let mut lines = Lines::new(body, Box::new(parse));
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
            return error_response(
                CallerError::BadValue("the NDJSON body holds no messages".into()).into(),
            );
        }
        Ok(chunk) => chunk,
        Err(e) => return error_response(e),
    };
    let first = match submit(first).await.answers().await {
        Ok(sent) => sent,
        Err(e) => return error_response(e),
    };
    let head = answers.lines(&first);
    let rest = NdjsonSends {
        submit,
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
mod tests {
    use std::sync::Arc;

    use mesh_api::SendResponse;
    use mesh_protocol::{Epoch, NodeId, SecretKey, StreamId};
    use tokio::sync::{Semaphore, mpsc, watch};

    use super::*;
    use crate::bus::SendReceipt;

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

    impl GatedNode {
        fn new() -> Arc<GatedNode> {
            Arc::new(GatedNode {
                me: SecretKey::from_bytes(&[1; 32]).public(),
                epoch: Epoch([2; 16]),
                handed: watch::Sender::new(Vec::new()),
                commits: Semaphore::new(0),
            })
        }

        /// Hands a chunk over at once; answers it once a permit is given.
        fn submitter(self: &Arc<Self>) -> impl Submit {
            let node = self.clone();
            move |msgs: Vec<Outgoing>| {
                let node = node.clone();
                async move {
                    let mut first = 0;
                    node.handed.send_modify(|h| {
                        first = h.len() as u64;
                        h.extend(msgs.iter().map(|m| m.payload.clone()));
                    });
                    Pending::new(async move {
                        node.commits
                            .acquire()
                            .await
                            .map_err(|e| crate::api::Bug::new(e.to_string()))?
                            .forget();
                        Ok(msgs
                            .iter()
                            .zip(first + 1..)
                            .map(|(m, seq)| SendReceipt {
                                stream: StreamId::direct(node.me, node.epoch, m.to),
                                seq,
                                arrival: seq,
                                superseded_by: None,
                            })
                            .collect())
                    })
                }
            }
        }
    }

    fn answers() -> Answers {
        Answers::new(SecretKey::from_bytes(&[1; 32]).public(), Epoch([2; 16]))
    }

    /// Parses a node send line whose `to` is a node id.
    fn parse(line: &[u8]) -> Result<Outgoing, ApiError> {
        let req: mesh_api::SendRequest = crate::api::routes::parse_json(line)?;
        crate::api::send::message(req, |t| {
            Err(CallerError::BadValue(format!("{t} is not a node id")).into())
        })
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
            let node = GatedNode::new();
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
            let resp = respond(node.submitter(), answers(), body, parse).await;
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
            let node = GatedNode::new();
            let to = SecretKey::from_bytes(&[3; 32]).public();
            let body = format!("{}{}", send_line(&to, 1), send_line(&to, 2));
            let (tx, rx) = mpsc::channel::<Bytes>(8);
            tx.send(body.into()).await.unwrap();
            let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
            }));
            node.commits.add_permits(1);
            let resp = respond(node.submitter(), answers(), body, parse).await;
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
}
