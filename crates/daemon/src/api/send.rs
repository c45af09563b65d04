//! `POST /v1/send` and `POST /v1/send/batch` (a JSON array, or NDJSON streamed in).
//!
//! NDJSON (`Content-Type: application/x-ndjson`): one send request per line.
//! Lines are committed in chunks as they arrive (a chunk is whatever has
//! arrived, up to a signed batch's worth), so a long stream never sits in
//! memory. The first chunk is committed before the answer starts, so a bad
//! first line or a full outbox is a plain error status. The answer is NDJSON:
//! one `{id, stream, seq}` line per message, in order, then exactly one
//! final line, `{"done": {"count": N}}` or `{"error": {code, message,
//! committed: N}}` — the first N lines were committed, none after.

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt as _;
use http_body_util::BodyExt as _;
use mesh_protocol::{MAX_BATCH_ENTRIES, MAX_BATCH_PAYLOAD_BYTES};
use tokio::sync::mpsc;

use super::json::{BatchResponse, SendRequest, SendResponse};
use super::routes::{parse_json, parse_node_id, read_body};
use super::{
    ApiError, ApiState, BATCH_MSGS_MAX, BATCH_REQUEST_BYTES_MAX, OutMessage,
    SEND_REQUEST_BYTES_MAX, Sent,
};

/// Answer lines buffered between the NDJSON committer and the connection.
const NDJSON_ANSWER_LINES_MAX: usize = 1024;

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

impl ApiState {
    fn answer(&self, sent: &Sent) -> SendResponse {
        SendResponse {
            id: self.cursor_text(sent.arrival),
            stream: (&sent.stream).into(),
            seq: sent.seq,
        }
    }

    async fn commit_batch(&self, msgs: Vec<OutMessage>) -> Result<Vec<Sent>, ApiError> {
        let n = msgs.len();
        let sent = self.inner.node_api.send_batch(msgs).await?;
        if sent.len() != n {
            return Err(ApiError::Internal(format!(
                "the node answered {} sends for {n} messages",
                sent.len()
            )));
        }
        self.inner
            .counters
            .sent
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(sent)
    }
}

pub(super) async fn send_one(
    State(st): State<ApiState>,
    req: Request,
) -> Result<Json<SendResponse>, ApiError> {
    let bytes = read_body(
        req.into_body(),
        SEND_REQUEST_BYTES_MAX,
        "; a message body may be at most 1 MiB",
    )
    .await?;
    let msg = message(parse_json(&bytes)?)?;
    let sent = st.inner.node_api.send(msg).await?;
    st.inner.counters.sent.fetch_add(1, Ordering::Relaxed);
    Ok(Json(st.answer(&sent)))
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

/// Prefixes a caller error with the item it is about.
fn at_item(e: ApiError, index: usize) -> ApiError {
    match e {
        ApiError::BadRequest(m) => ApiError::BadRequest(format!("item {index}: {m}")),
        ApiError::BadJson(m) => ApiError::BadJson(format!("item {index}: {m}")),
        other => other,
    }
}

/// NDJSON lines read from a streamed body.
struct Lines {
    body: Body,
    buf: Vec<u8>,
    eof: bool,
    /// Lines taken so far (1-based number of the last one).
    line_no: usize,
}

impl Lines {
    /// The next complete line already buffered (the remainder at the end of the body).
    fn take_line(&mut self) -> Result<Option<Vec<u8>>, ApiError> {
        let line = if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=i).collect();
            line.pop();
            line
        } else if self.buf.len() > SEND_REQUEST_BYTES_MAX {
            return Err(ApiError::BodyTooLarge {
                limit_bytes: SEND_REQUEST_BYTES_MAX,
                hint: "; that is the limit of one NDJSON line",
            });
        } else if self.eof && !self.buf.is_empty() {
            std::mem::take(&mut self.buf)
        } else {
            return Ok(None);
        };
        self.line_no += 1;
        Ok(Some(line))
    }

    /// Takes in one frame of the body; false at its end.
    fn absorb(
        &mut self,
        frame: Option<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>,
    ) -> Result<bool, ApiError> {
        match frame {
            None => {
                self.eof = true;
                Ok(false)
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    self.buf.extend_from_slice(&data);
                }
                Ok(true)
            }
            Some(Err(e)) => Err(ApiError::BadRequest(format!(
                "reading the request body failed: {e}"
            ))),
        }
    }

    /// The next chunk of messages: what has arrived, at least one, at most a
    /// signed batch's worth; empty at the end of the body.
    async fn next_chunk(&mut self) -> Result<Vec<OutMessage>, ApiError> {
        let mut chunk = Vec::new();
        let mut bytes = 0u64;
        loop {
            while let Some(line) = self.take_line()? {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let no = self.line_no;
                let msg = parse_json::<SendRequest>(&line)
                    .and_then(message)
                    .map_err(|e| at_line(e, no))?;
                bytes += msg.body.len() as u64;
                chunk.push(msg);
                if chunk.len() >= MAX_BATCH_ENTRIES || bytes >= MAX_BATCH_PAYLOAD_BYTES {
                    return Ok(chunk);
                }
            }
            if self.eof {
                return Ok(chunk);
            }
            if chunk.is_empty() {
                let frame = self.body.frame().await;
                self.absorb(frame)?;
            } else {
                // Commit what has arrived rather than wait for a slow writer;
                // polling a body frame is cancel-safe.
                match self.body.frame().now_or_never() {
                    Some(frame) => {
                        self.absorb(frame)?;
                    }
                    None => return Ok(chunk),
                }
            }
        }
    }
}

fn at_line(e: ApiError, line: usize) -> ApiError {
    match e {
        ApiError::BadRequest(m) => ApiError::BadRequest(format!("line {line}: {m}")),
        ApiError::BadJson(m) => ApiError::BadJson(format!("line {line}: {m}")),
        other => other,
    }
}

fn json_line(v: &impl serde::Serialize) -> bytes::Bytes {
    let mut line = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line.into()
}

async fn send_ndjson(st: ApiState, body: Body) -> Response {
    let mut lines = Lines {
        body,
        buf: Vec::new(),
        eof: false,
        line_no: 0,
    };
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
    let (tx, mut rx) = mpsc::channel::<bytes::Bytes>(NDJSON_ANSWER_LINES_MAX);
    tokio::spawn(async move {
        let mut committed = 0u64;
        let mut sent = first;
        loop {
            for s in &sent {
                if tx.send(json_line(&st.answer(s))).await.is_err() {
                    // The client went away; stop reading its body.
                    return;
                }
                committed += 1;
            }
            let chunk = match lines.next_chunk().await {
                Ok(chunk) if chunk.is_empty() => {
                    let _ = tx
                        .send(json_line(
                            &serde_json::json!({ "done": { "count": committed } }),
                        ))
                        .await;
                    return;
                }
                Ok(chunk) => chunk,
                Err(e) => {
                    let _ = tx
                        .send(json_line(
                            &e.to_json(Some(serde_json::json!({ "committed": committed }))),
                        ))
                        .await;
                    return;
                }
            };
            sent = match st.commit_batch(chunk).await {
                Ok(sent) => sent,
                Err(e) => {
                    let _ = tx
                        .send(json_line(
                            &e.to_json(Some(serde_json::json!({ "committed": committed }))),
                        ))
                        .await;
                    return;
                }
            };
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| o.map(Ok::<_, Infallible>))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;

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
}
