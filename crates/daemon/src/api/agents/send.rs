//! What an agent sends as itself: a message, a batch of them, a reply to a
//! message in its inbox; and the checks and answers they share.

use std::sync::atomic::Ordering;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use mesh_api::{AgentSendRequest, AgentSendResponse, BodyEncoding, ReplyRequest, StreamJson};
use mesh_protocol::{AgentName, MsgId, NodeId, StreamId, SupersedeKey};
use mesh_store::{CLIENT_ID_BYTES_MAX, MessageDir};

use crate::api::agent_socket::Acting;
use crate::api::routes::{parse_json, read_body};
use crate::api::{ApiError, ApiState, Bug, CallerError, SEND_REQUEST_BYTES_MAX};
use crate::bus::{Outgoing, SendMeta};

impl ApiState {
    /// The message an agent send request asks for.
    pub(crate) fn agent_message(
        &self,
        from: &AgentName,
        req: AgentSendRequest,
    ) -> Result<Outgoing, ApiError> {
        let (to, agent) = self.resolve_recipient(&req.to)?;
        let in_reply_to = req
            .in_reply_to
            .as_deref()
            .map(|t| t.parse::<MsgId>())
            .transpose()
            .map_err(|e| CallerError::BadValue(e.to_string()))?;
        let key = req
            .key
            .as_deref()
            .map(SupersedeKey::new)
            .transpose()
            .map_err(|e| CallerError::BadValue(e.to_string()))?;
        let meta = MessageMeta {
            agent,
            in_reply_to,
            client_id: req.client_id,
            key,
            receipt: req.receipt,
        };
        self.meta_message(from, to, meta, req.body, req.encoding)
    }

    fn meta_message(
        &self,
        from: &AgentName,
        to: NodeId,
        meta: MessageMeta,
        body: String,
        encoding: BodyEncoding,
    ) -> Result<Outgoing, ApiError> {
        let MessageMeta {
            agent,
            in_reply_to,
            client_id,
            key,
            receipt,
        } = meta;
        let payload = crate::api::send::payload_of(encoding, body)?;
        check_client_id(client_id.as_deref())?;
        let meta = SendMeta {
            from: Some(from.clone()),
            to: agent,
            in_reply_to,
            client_id,
            key,
            receipt,
            read_receipt: false,
        };
        Ok(Outgoing {
            to,
            kind: 0,
            payload,
            meta: Some(Box::new(meta)),
        })
    }

    /// The address an agent message goes to, as an answer shows it (made
    /// only where one is answered: a batch's answers carry none).
    fn recipient_text(msg: &Outgoing) -> String {
        match msg.meta.as_ref().and_then(|m| m.to.as_ref()) {
            Some(a) => Self::address(a, &msg.to),
            None => msg.to.to_string(),
        }
    }

    /// The id of the message committed with `receipt` (agent messages).
    pub(crate) fn msg_id(&self, stream: &StreamId, seq: u64) -> MsgId {
        let to = stream.recipient().unwrap_or(self.inner.node);
        MsgId::derive(&stream.author, stream.epoch, &to, seq)
    }
}

/// What an agent message carries besides its sender, node and body.
struct MessageMeta {
    /// The recipient agent.
    agent: Option<AgentName>,
    in_reply_to: Option<MsgId>,
    client_id: Option<String>,
    key: Option<SupersedeKey>,
    /// Whether a read receipt is asked.
    receipt: bool,
}

/// Checks a client id: 1 to [`CLIENT_ID_BYTES_MAX`] bytes.
pub(crate) fn check_client_id(id: Option<&str>) -> Result<(), ApiError> {
    match id {
        Some(t) if t.is_empty() || t.len() > CLIENT_ID_BYTES_MAX => {
            Err(CallerError::BadValue(format!(
                "a client id is 1 to {CLIENT_ID_BYTES_MAX} bytes, not {}",
                t.len()
            ))
            .into())
        }
        _ => Ok(()),
    }
}

/// Commits `msg` and answers it as an agent send to `to`.
async fn send_answer(st: &ApiState, msg: Outgoing) -> Result<AgentSendResponse, ApiError> {
    let to = ApiState::recipient_text(&msg);
    #[cfg(feature = "fault-hooks")]
    let abort_after = msg
        .meta
        .as_ref()
        .and_then(|m| m.client_id.clone())
        .filter(|id| std::env::var("MESH_FAULT_ABORT_AFTER_COMMIT").ok().as_ref() == Some(id));
    let sent = st.submit(vec![msg]).await.answers().await?;
    let Some(r) = sent.first() else {
        return Err(Bug::new("the node answered no receipt for one message").into());
    };
    #[cfg(feature = "fault-hooks")]
    if abort_after.is_some() {
        // Test-only: dies as a crash would, after the commit and before
        // the answer.
        std::process::abort();
    }
    st.inner.counters.agent_sent.fetch_add(1, Ordering::Relaxed);
    Ok(AgentSendResponse {
        id: st.msg_id(&r.stream, r.seq).to_string(),
        to,
        cursor: st.cursor_text(r.arrival),
        stream: StreamJson::from(&r.stream),
        seq: r.seq,
        superseded_by: r.superseded_by.map(|b| b.to_string()),
    })
}

/// `POST /v1/agents/{name}/send`, on the agent's socket.
pub(crate) async fn send(
    State(st): State<ApiState>,
    acting: Option<Extension<Acting>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<AgentSendResponse>, ApiError> {
    let (from, body) = sender_and_request(
        &st,
        acting,
        &name,
        req,
        "; a message body may be at most 1 MiB",
    )
    .await?;
    let msg = st.agent_message(&from, body)?;
    Ok(Json(send_answer(&st, msg).await?))
}

/// The verified sending agent of a request to its socket, and the request
/// body (at most [`SEND_REQUEST_BYTES_MAX`]) parsed as a `T`; `hint` ends
/// the refusal of one too large.
async fn sender_and_request<T: serde::de::DeserializeOwned>(
    st: &ApiState,
    acting: Option<Extension<Acting>>,
    name: &str,
    req: Request,
    hint: &'static str,
) -> Result<(AgentName, T), ApiError> {
    let from = st.sender(acting, name)?;
    let bytes = read_body(req.into_body(), SEND_REQUEST_BYTES_MAX, hint).await?;
    Ok((from, parse_json(&bytes)?))
}

/// `POST /v1/agents/{name}/send/batch`, NDJSON of [`AgentSendRequest`]
/// lines, answered as `POST /v1/send/batch` is, each line
/// `{id, cursor, stream, seq}` with the message id.
pub(crate) async fn send_batch(
    State(st): State<ApiState>,
    acting: Option<Extension<Acting>>,
    Path(name): Path<String>,
    req: Request,
) -> Response {
    let from = match st.sender(acting, &name) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let parser_st = st.clone();
    let parse = move |line: &[u8]| -> Result<Outgoing, ApiError> {
        let req: AgentSendRequest = parse_json(line)?;
        parser_st.agent_message(&from, req)
    };
    let answers = st.answers().with_msg_ids();
    crate::api::ndjson::respond(st.submitter(), answers, req.into_body(), parse).await
}

/// `POST /v1/agents/{name}/reply`: answers a message in the agent's inbox.
pub(crate) async fn reply(
    State(st): State<ApiState>,
    acting: Option<Extension<Acting>>,
    Path(name): Path<String>,
    req: Request,
) -> Result<Json<AgentSendResponse>, ApiError> {
    let (from, body): (_, ReplyRequest) = sender_and_request(
        &st,
        acting,
        &name,
        req,
        "; a reply body may be at most 1 MiB",
    )
    .await?;
    let (id, row) = super::status::message_row(&st, &body.id).await?;
    let me = st.inner.node;
    let to_me = row.dir == MessageDir::Received || row.stream.recipient() == Some(me);
    if !to_me || row.to.as_ref() != Some(&from) {
        return Err(CallerError::BadValue(format!(
            "message {id} was not sent to agent {from}: an agent replies to messages in its inbox"
        ))
        .into());
    }
    let meta = MessageMeta {
        agent: Some(row.from),
        in_reply_to: Some(id),
        client_id: body.client_id,
        key: None,
        receipt: false,
    };
    let msg = st.meta_message(&from, row.stream.author, meta, body.body, body.encoding)?;
    Ok(Json(send_answer(&st, msg).await?))
}

impl crate::api::send::Answers {
    /// Answers that carry each message's id (agent sends).
    pub(crate) fn with_msg_ids(mut self) -> Self {
        self.msg_ids = true;
        self
    }
}
