//! The topic routes: join, leave, list, publish (`docs/design.md`, "Topics").

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use mesh_api::{
    JoinTopicRequest, PublishRequest, StreamJson, TopicJson, TopicStreamJson, TopicsResponse,
};
use mesh_protocol::TopicName;
use mesh_store::TopicRecord;

use super::error::{node_error, send_error};
use super::routes::{parse_json, read_body, read_json};
use super::{
    ApiError, ApiState, BATCH_MSGS_MAX, BATCH_REQUEST_BYTES_MAX, CallerError, REQUEST_BYTES_MAX,
    SEND_REQUEST_BYTES_MAX,
};
use crate::bus::NodeTopic;

fn topic_name(name: &str) -> Result<TopicName, ApiError> {
    TopicName::new(name).map_err(|e| CallerError::BadValue(e.to_string()).into())
}

pub(super) fn topic_json(t: NodeTopic) -> TopicJson {
    TopicJson {
        name: t.record.name.to_string(),
        joined_ms: t.record.joined_ms,
        max_msgs: t.record.max_msgs,
        max_bytes: t.record.max_bytes,
        members: t.members.iter().map(ToString::to_string).collect(),
        streams: t
            .streams
            .into_iter()
            .map(|s| TopicStreamJson {
                stream: StreamJson::from(&s.stream),
                mark: s.mark,
                held_msgs: s.held.as_ref().map_or(0, |h| h.msgs),
                held_bytes: s.held.as_ref().map_or(0, |h| h.bytes),
                first_held: s.held.as_ref().map_or(0, |h| h.first_retained),
            })
            .collect(),
    }
}

impl ApiState {
    /// The topics this node is a member of now.
    async fn topics_now(&self) -> Result<Vec<TopicJson>, ApiError> {
        let status = self.inner.bus.status().await.map_err(node_error)?;
        Ok(status.topics.into_iter().map(topic_json).collect())
    }

    /// The topic `name` if this node is a member, else a caller's error.
    async fn topic_now(&self, name: &TopicName) -> Result<TopicJson, ApiError> {
        self.topics_now()
            .await?
            .into_iter()
            .find(|t| t.name == name.as_str())
            .ok_or_else(|| not_a_member(name))
    }
}

fn not_a_member(name: &TopicName) -> ApiError {
    CallerError::BadValue(format!(
        "this node is not a member of topic {name}; join it first (`mesh topic join {name}`)"
    ))
    .into()
}

/// `GET /v1/topics`.
pub(super) async fn list_topics(
    State(st): State<ApiState>,
) -> Result<Json<TopicsResponse>, ApiError> {
    Ok(Json(TopicsResponse {
        topics: st.topics_now().await?,
    }))
}

/// `POST /v1/topics`: joins a topic, or changes its bounds.
pub(super) async fn join_topic(
    State(st): State<ApiState>,
    req: Request,
) -> Result<Json<TopicJson>, ApiError> {
    let body: JoinTopicRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let name = topic_name(&body.name)?;
    let (default_msgs, default_bytes) = st.inner.topic_bounds;
    let max_msgs = body.max_msgs.unwrap_or(default_msgs);
    let max_bytes = body.max_bytes.unwrap_or(default_bytes);
    if max_msgs == 0 || max_bytes == 0 {
        return Err(
            CallerError::BadValue("max_msgs and max_bytes must be at least 1".into()).into(),
        );
    }
    let joined = st.topics_now().await?;
    if joined.len() >= mesh_store::TOPICS_MAX && !joined.iter().any(|t| t.name == name.as_str()) {
        return Err(CallerError::BadValue(format!(
            "this node is a member of {} topics, the most it may be; leave one first",
            joined.len()
        ))
        .into());
    }
    let joined_ms = joined
        .iter()
        .find(|t| t.name == name.as_str())
        .map_or_else(crate::agents::now_ms, |t| t.joined_ms);
    let record = TopicRecord {
        name: name.clone(),
        joined_ms,
        max_msgs,
        max_bytes,
    };
    st.inner.bus.join_topic(record).await.map_err(node_error)?;
    Ok(Json(st.topic_now(&name).await?))
}

/// `DELETE /v1/topics/{name}`: leaves it; answers what was kept.
pub(super) async fn leave_topic(
    State(st): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<TopicJson>, ApiError> {
    let name = topic_name(&name)?;
    let kept = st.topic_now(&name).await?;
    st.inner
        .bus
        .leave_topic(name.clone())
        .await
        .map_err(node_error)?;
    Ok(Json(kept))
}

/// `POST /v1/topics/{name}/publish`: answered once committed. While the
/// store cannot commit, the publish is held and the request stays open
/// until it ends: committed once the store is back, or 503 past
/// `[store] hold_ms`, or 503 at once past the hold bounds (which sends
/// share).
pub(super) async fn publish(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Response {
    let answer = async {
        let name = topic_name(&name)?;
        let body: PublishRequest = read_json(req.into_body(), SEND_REQUEST_BYTES_MAX).await?;
        let payload = super::send::payload_of(body.encoding, body.body)?;
        let sent = st
            .inner
            .bus
            .publish(name.clone(), body.msg_kind, payload)
            .await
            .map_err(|e| match e {
                crate::bus::SendError::Refused(crate::bus::CoreSendError::NotAMember(_)) => {
                    not_a_member(&name)
                }
                e => send_error(st.inner.node, e),
            })?;
        let mut answers = st.answers();
        Ok::<_, ApiError>(answers.lines(&[sent]))
    };
    match answer.await {
        Ok(mut json) => {
            // One answer, without its line's end.
            let json = json.split_to(json.len().saturating_sub(1));
            ([(header::CONTENT_TYPE, "application/json")], json).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// The publishes of a batch's body, each a kind and a payload: a JSON
/// array, or NDJSON (blank lines skipped), 1 to [`BATCH_MSGS_MAX`] of them.
fn batch_of(bytes: &[u8], ndjson: bool) -> Result<Vec<(u16, Vec<u8>)>, ApiError> {
    let reqs: Vec<PublishRequest> = if ndjson {
        bytes
            .split(|b| *b == b'\n')
            .enumerate()
            .filter(|(_, l)| !l.trim_ascii().is_empty())
            .map(|(i, l)| parse_json(l).map_err(|e: ApiError| e.at(format!("line {}", i + 1))))
            .collect::<Result<_, _>>()?
    } else {
        parse_json(bytes)?
    };
    if reqs.is_empty() || reqs.len() > BATCH_MSGS_MAX {
        return Err(CallerError::BadValue(format!(
            "a batch holds 1 to {BATCH_MSGS_MAX} messages, not {}",
            reqs.len()
        ))
        .into());
    }
    reqs.into_iter()
        .enumerate()
        .map(|(i, r)| {
            let place = if ndjson { "message" } else { "item" };
            super::send::payload_of(r.encoding, r.body)
                .map(|p| (r.msg_kind, p))
                .map_err(|e| e.at(format!("{place} {i}")))
        })
        .collect()
}

/// `POST /v1/topics/{name}/publish/batch`: 1 to [`BATCH_MSGS_MAX`]
/// publishes in one request, as a JSON array of publish requests or as
/// NDJSON (`Content-Type: application/x-ndjson`, one per line), at most
/// [`BATCH_REQUEST_BYTES_MAX`] in all. They are queued together, in order,
/// or refused together with nothing written, and answered once all are
/// committed (consecutive ones share commits): an array with
/// `{"sent": [...]}`, NDJSON with one `{id, stream, seq}` line per message
/// and a final `{"done": {"count": N}}`. While the store cannot commit
/// they are held together, the request open, as a single publish is. If
/// a commit fails part way otherwise, the error says how many of them
/// were committed (`committed`; `mesh events` shows which).
pub(super) async fn publish_batch(
    State(st): State<ApiState>,
    Path(name): Path<String>,
    req: Request,
) -> Response {
    let ndjson = super::ndjson::is_ndjson(&req);
    let mut committed = 0;
    let answer = async {
        let name = topic_name(&name)?;
        let bytes = read_body(
            req.into_body(),
            BATCH_REQUEST_BYTES_MAX,
            "; send larger batches in several requests",
        )
        .await?;
        let msgs = batch_of(&bytes, ndjson)?;
        let answers = st.inner.bus.publish_many(name.clone(), msgs).await;
        committed = answers.iter().filter(|a| a.is_ok()).count();
        answers
            .into_iter()
            .map(|a| match a {
                Err(crate::bus::SendError::Refused(crate::bus::CoreSendError::NotAMember(_))) => {
                    Err(not_a_member(&name))
                }
                a => a.map_err(|e| send_error(st.inner.node, e)),
            })
            .collect::<Result<Vec<_>, ApiError>>()
    };
    let sent = match answer.await {
        Ok(sent) => sent,
        Err(e) => {
            let status = e.status();
            let body = e.to_json(Some(serde_json::json!({ "committed": committed })));
            return (status, Json(body)).into_response();
        }
    };
    let mut answers = st.answers();
    if ndjson {
        let mut out = answers.lines(&sent).to_vec();
        out.extend_from_slice(
            format!(
                "{}\n",
                serde_json::json!({ "done": { "count": sent.len() } })
            )
            .as_bytes(),
        );
        ([(header::CONTENT_TYPE, "application/x-ndjson")], out).into_response()
    } else {
        Json(mesh_api::BatchResponse {
            sent: sent.iter().map(|s| answers.response(s)).collect(),
        })
        .into_response()
    }
}
