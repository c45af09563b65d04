//! `POST /v1/send` and `POST /v1/send/batch` (a JSON array, or NDJSON streamed
//! in: [`super::ndjson`]), and the one path every send takes to the node:
//! [`ApiState::submit`], the bus's one submit call.

use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use mesh_api::{BatchResponse, SendRequest, SendResponse, StreamJson};
use mesh_protocol::{Cursor, Epoch, MAX_BATCH_PAYLOAD_BYTES, NodeId, StreamId};

use super::error::send_error;
use super::routes::{parse_json, parse_node_id, read_body};
use super::{
    ApiError, ApiState, BATCH_MSGS_MAX, BATCH_REQUEST_BYTES_MAX, Bug, CallerError,
    SEND_REQUEST_BYTES_MAX,
};
use crate::bus::{Outgoing, SendError, SendMeta, SendReceipt};

/// The answers of messages handed to the node, to come: every receipt, in
/// order, or the first refusal (noting how many of the others were committed).
pub(super) struct Pending(pub(super) PendingAnswers);

/// The future inside [`Pending`].
pub(super) type PendingAnswers =
    Pin<Box<dyn Future<Output = Result<Vec<SendReceipt>, ApiError>> + Send>>;

impl Pending {
    /// Answers `answers` will give.
    pub(super) fn new(
        answers: impl Future<Output = Result<Vec<SendReceipt>, ApiError>> + Send + 'static,
    ) -> Pending {
        Pending(Box::pin(answers))
    }

    /// Waits for the answers.
    pub(super) async fn answers(self) -> Result<Vec<SendReceipt>, ApiError> {
        self.0.await
    }
}

impl ApiState {
    /// Hands `msgs` to the node; resolves once every one is queued there, with
    /// their answers to come. Messages handed over after it resolves get
    /// later seqs, and may share a commit with these.
    pub(super) async fn submit(&self, msgs: Vec<Outgoing>) -> Pending {
        let tos: Vec<NodeId> = msgs.iter().map(|m| m.to).collect();
        let receipts = self.inner.bus.submit(msgs).await;
        let st = self.clone();
        Pending::new(async move {
            let sent = answer(receipts.await, &tos)?;
            st.inner
                .counters
                .sent
                .fetch_add(sent.len() as u64, Ordering::Relaxed);
            Ok(sent)
        })
    }

    /// [`ApiState::submit`] as a function to hand chunks to.
    pub(super) fn submitter(
        &self,
    ) -> impl Fn(Vec<Outgoing>) -> Pin<Box<dyn Future<Output = Pending> + Send>> + Send + Sync + 'static
    {
        let st = self.clone();
        move |msgs| {
            let st = st.clone();
            Box::pin(async move { st.submit(msgs).await })
        }
    }

    /// A writer of this node's send answers.
    pub(super) fn answers(&self) -> Answers {
        Answers::new(self.inner.node, self.epoch())
    }
}

/// The answer to messages sent to `tos` from the bus's receipts, in order.
/// Each message is committed or refused on its own: if any is refused, the
/// error is the first refusal and says how many of the others were committed.
fn answer(
    receipts: Vec<Result<SendReceipt, SendError>>,
    tos: &[NodeId],
) -> Result<Vec<SendReceipt>, ApiError> {
    let n = tos.len();
    if receipts.len() != n {
        return Err(Bug::new(format!(
            "the node answered {} sends for {n} messages",
            receipts.len()
        ))
        .into());
    }
    let committed = receipts.iter().filter(|r| r.is_ok()).count();
    let mut first = None;
    let mut sent = Vec::with_capacity(n);
    for (i, (r, to)) in receipts.into_iter().zip(tos).enumerate() {
        match r {
            Ok(r) => sent.push(r),
            Err(e) if first.is_none() => first = Some((i, send_error(*to, e))),
            Err(_) => {}
        }
    }
    match first {
        None => Ok(sent),
        // A single send: which one and how many were committed go without saying.
        Some((_, e)) if n == 1 => Err(e),
        Some((i, e)) => Err(e.with_note(&format!(
            "message {i} of {n} was refused; {committed} of the {n} were committed \
             (GET /v1/events shows which)"
        ))),
    }
}

/// Checks one send request and turns it into a message; `to` is a node
/// id, or resolved by `resolve` (aliases, names).
pub(super) fn message(
    req: SendRequest,
    resolve: impl FnOnce(&str) -> Result<NodeId, ApiError>,
) -> Result<Outgoing, ApiError> {
    let to = match parse_node_id(&req.to) {
        Ok(id) => id,
        Err(e) => resolve(&req.to).map_err(|_| e)?,
    };
    super::agents::check_client_id(req.client_id.as_deref())?;
    let payload = payload_of(req.encoding, req.body)?;
    let mut msg = Outgoing::plain(to, req.msg_kind, payload);
    if let Some(client_id) = req.client_id {
        msg.meta = Some(Box::new(SendMeta {
            client_id: Some(client_id),
            ..SendMeta::default()
        }));
    }
    Ok(msg)
}

/// The bytes of a message `body` written as `encoding`, refused if they
/// do not decode or are more than a batch holds.
pub(super) fn payload_of(
    encoding: mesh_api::BodyEncoding,
    body: String,
) -> Result<Vec<u8>, ApiError> {
    let payload = encoding.decode(body).map_err(CallerError::BadValue)?;
    if payload.len() as u64 > MAX_BATCH_PAYLOAD_BYTES {
        return Err(CallerError::PayloadTooLarge {
            len: payload.len() as u64,
            max: MAX_BATCH_PAYLOAD_BYTES,
        }
        .into());
    }
    Ok(payload)
}

/// Writes send answers (`{id, stream, seq}`, as [`SendResponse`]) as JSON,
/// each stream's JSON made once for a run of answers on it rather than once
/// per answer. With `msg_ids` (agent sends), `id` is the message id and
/// the journal cursor follows as `cursor`.
pub(super) struct Answers {
    node: NodeId,
    epoch: Epoch,
    /// The last stream answered on: its JSON and its message ids' tag.
    stream: Option<(StreamId, Vec<u8>, [u8; 8])>,
    pub(super) msg_ids: bool,
}

impl Answers {
    /// Answers of the node `node` at `epoch` (their ids are its cursors).
    pub(super) fn new(node: NodeId, epoch: Epoch) -> Answers {
        Answers {
            node,
            epoch,
            stream: None,
            msg_ids: false,
        }
    }

    /// Appends the answer to `sent` to `out`, as `SendResponse` would be written.
    fn push(&mut self, sent: &SendReceipt, out: &mut Vec<u8>) {
        if self
            .stream
            .as_ref()
            .is_none_or(|(s, _, _)| *s != sent.stream)
        {
            let json = serde_json::to_vec(&StreamJson::from(&sent.stream)).unwrap_or_default();
            let to = sent.stream.recipient().unwrap_or(self.node);
            let tag = mesh_protocol::MsgId::stream_tag(&self.node, sent.stream.epoch, &to);
            self.stream = Some((sent.stream.clone(), json, tag));
        }
        let cursor = Cursor::new(&self.node, self.epoch, sent.arrival);
        // Writing to a Vec cannot fail; the cursor is base32 with a plain
        // prefix and the id hex, so neither needs escaping.
        match &self.stream {
            Some((_, _, tag)) if self.msg_ids => {
                let id = mesh_protocol::MsgId::in_stream(*tag, sent.seq);
                let _ = write!(out, "{{\"id\":\"{id}\",\"cursor\":\"{cursor}\",\"stream\":");
            }
            _ => {
                let _ = write!(out, "{{\"id\":\"{cursor}\",\"stream\":");
            }
        }
        if let Some((_, json, _)) = &self.stream {
            out.extend_from_slice(json);
        }
        let _ = write!(out, ",\"seq\":{}", sent.seq);
        if let Some(by) = sent.superseded_by {
            let _ = write!(out, ",\"superseded_by\":\"{by}\"");
        }
        out.push(b'}');
    }

    /// The answer lines of `sent`, one per message.
    pub(super) fn lines(&mut self, sent: &[SendReceipt]) -> Bytes {
        let mut out = Vec::with_capacity(sent.len() * 256);
        for s in sent {
            self.push(s, &mut out);
            out.push(b'\n');
        }
        out.into()
    }

    /// The answer to `sent` as a value.
    pub(super) fn response(&self, sent: &SendReceipt) -> SendResponse {
        SendResponse {
            id: Cursor::new(&self.node, self.epoch, sent.arrival).to_string(),
            stream: (&sent.stream).into(),
            seq: sent.seq,
        }
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
        let msg = message(parse_json(&bytes)?, |t| st.resolve_peer_arg(t))?;
        let sent = st.submit(vec![msg]).await.answers().await?;
        let mut out = Vec::with_capacity(256);
        let mut answers = st.answers();
        for s in &sent {
            answers.push(s, &mut out);
        }
        Ok::<_, ApiError>(out)
    };
    match answer.await {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(super) async fn send_batch(State(st): State<ApiState>, req: Request) -> Response {
    if super::ndjson::is_ndjson(&req) {
        let resolver = st.clone();
        let parse = move |line: &[u8]| {
            message(parse_json::<SendRequest>(line)?, |t| {
                resolver.resolve_peer_arg(t)
            })
        };
        super::ndjson::respond(st.submitter(), st.answers(), req.into_body(), parse).await
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
        return Err(CallerError::BadValue(format!(
            "a batch holds 1 to {BATCH_MSGS_MAX} messages, not {}",
            reqs.len()
        ))
        .into());
    }
    let msgs = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| message(r, |t| st.resolve_peer_arg(t)).map_err(|e| e.at(format!("item {i}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let sent = st.submit(msgs).await.answers().await?;
    let answers = st.answers();
    Ok(Json(BatchResponse {
        sent: sent.iter().map(|s| answers.response(s)).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::CoreSendError;
    use mesh_api::BodyEncoding;
    use mesh_protocol::SecretKey;

    #[test]
    fn a_send_request_must_name_a_node_and_carry_a_decodable_body() {
        let node = SecretKey::from_bytes(&[7; 32]).public();
        let ok = SendRequest {
            to: node.to_string(),
            body: "aGk=".into(),
            encoding: BodyEncoding::Base64,
            msg_kind: 30,
            client_id: None,
        };
        let no_names = |_: &str| -> Result<NodeId, ApiError> {
            Err(CallerError::BadValue("no names here".into()).into())
        };
        let m = message(ok.clone(), no_names).unwrap();
        assert_eq!((m.to, m.kind, m.payload.as_slice()), (node, 30, &b"hi"[..]));
        let bad_to = SendRequest {
            to: "bob".into(),
            ..ok.clone()
        };
        assert_eq!(
            message(bad_to, no_names).unwrap_err().code().as_str(),
            "bad_request"
        );
        let bad_b64 = SendRequest {
            body: "!!".into(),
            ..ok.clone()
        };
        assert_eq!(
            message(bad_b64, no_names).unwrap_err().code().as_str(),
            "bad_request"
        );
        let big = SendRequest {
            body: "x".repeat(MAX_BATCH_PAYLOAD_BYTES as usize + 1),
            encoding: BodyEncoding::Text,
            ..ok
        };
        assert_eq!(
            message(big, no_names).unwrap_err().code().as_str(),
            "bad_request"
        );
    }

    fn receipt(to: NodeId, seq: u64) -> SendReceipt {
        let me = SecretKey::from_bytes(&[1; 32]).public();
        SendReceipt {
            stream: StreamId::direct(me, Epoch([2; 16]), to),
            seq,
            arrival: 40 + seq,
            superseded_by: None,
        }
    }

    #[test]
    fn a_batch_answer_is_every_receipt_or_the_first_refusal_saying_how_many_were_committed() {
        let to = SecretKey::from_bytes(&[3; 32]).public();
        let ok = answer(vec![Ok(receipt(to, 1)), Ok(receipt(to, 2))], &[to, to]).unwrap();
        assert_eq!(ok.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);
        let busy = || Err(SendError::Refused(CoreSendError::Busy { waiting: 9 }));
        let e = answer(vec![Ok(receipt(to, 1)), busy(), busy()], &[to, to, to]).unwrap_err();
        assert_eq!(e.status().as_u16(), 429);
        let text = e.to_string();
        assert!(
            text.contains("message 1 of 3 was refused; 1 of the 3 were committed"),
            "{text}"
        );
        let single = answer(vec![busy()], &[to]).unwrap_err();
        assert!(!single.to_string().contains("of 1"), "{single}");
        let short = answer(vec![], &[to]).unwrap_err();
        assert_eq!(short.status().as_u16(), 500);
    }

    #[test]
    fn an_answer_is_written_as_serde_writes_a_send_response() {
        let me = SecretKey::from_bytes(&[1; 32]).public();
        let mut answers = Answers::new(me, Epoch([2; 16]));
        let mut out = Vec::new();
        for (to, seq) in [([3u8; 32], 7), ([3; 32], 8), ([4; 32], 1)] {
            let sent = receipt(SecretKey::from_bytes(&to).public(), seq);
            out.clear();
            answers.push(&sent, &mut out);
            assert_eq!(out, serde_json::to_vec(&answers.response(&sent)).unwrap());
        }
    }
}
