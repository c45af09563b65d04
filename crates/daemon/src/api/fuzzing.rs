//! Entry points for the fuzz targets in `fuzz/` and the corpus replay
//! test: the decoders any local client reaches — the JSON request bodies
//! and the NDJSON line splitter.
//!
//! Each function takes untrusted bytes, runs them through the same code the
//! routes use, and checks what must hold for any input: nothing panics, a
//! request that decodes survives encoding and decoding again, and the line
//! splitter gives back exactly the lines it was fed, however the bytes were
//! cut into frames. A panic here is a bug. Not a stable API.

use bytes::BytesMut;
use mesh_api::{
    AddAgentRequest, AddPeerRequest, AgentSendRequest, AliasRequest, CursorBody,
    ExportAgentRequest, ImportAgentRequest, InviteRequest, JoinBody, JoinTopicRequest,
    MoveAgentRequest, PublishRequest, ReplyRequest, SendRequest,
};
use mesh_protocol::{AgentName, Cursor, InviteCode, MAX_BATCH_PAYLOAD_BYTES, MsgId, NodeTicket};

use super::BATCH_MSGS_MAX;
use super::ndjson::take_line;
use super::routes::parse_json;
use super::send::message;

/// Feeds `data` to every JSON body the API decodes: a send, a batch of
/// sends, a peer to add, a cursor to set, an invite to make, a join, a
/// topic to join, a publish, and
/// the agent routes' bodies (an agent to add, an agent send or one line of
/// a batch of them, a reply, a peer's alias, an export, an import), the
/// move link's offer and answer (a peer reaches those), with
/// the field parsers each route runs on them.
///
/// Panics if a decoded send or agent send does not survive encoding and
/// decoding again, or if a send is taken as a message with a payload over
/// the limit.
pub fn json_body(data: &[u8]) {
    if let Ok(req) = parse_json::<SendRequest>(data) {
        check_send(req);
    }
    if let Ok(reqs) = parse_json::<Vec<SendRequest>>(data) {
        for req in reqs.into_iter().take(BATCH_MSGS_MAX) {
            check_send(req);
        }
    }
    if let Ok(p) = parse_json::<AddPeerRequest>(data) {
        let _ = p.ticket.parse::<NodeTicket>();
    }
    if let Ok(c) = parse_json::<CursorBody>(data) {
        let _ = c.cursor.parse::<Cursor>();
    }
    let _ = parse_json::<InviteRequest>(data);
    if let Ok(j) = parse_json::<JoinBody>(data) {
        let _ = j.code.parse::<InviteCode>();
    }
    if let Ok(t) = parse_json::<JoinTopicRequest>(data) {
        let _ = mesh_protocol::TopicName::new(&t.name);
    }
    if let Ok(p) = parse_json::<PublishRequest>(data) {
        let _ = p.encoding.decode(p.body);
    }
    agent_bodies(data);
}

fn agent_bodies(data: &[u8]) {
    if let Ok(a) = parse_json::<AddAgentRequest>(data) {
        let _ = AgentName::new(&a.name);
    }
    if let Ok(req) = parse_json::<AgentSendRequest>(data) {
        let again = serde_json::to_vec(&req).map(|b| parse_json::<AgentSendRequest>(&b));
        assert!(
            matches!(&again, Ok(Ok(r)) if *r == req),
            "a decoded agent send does not survive encoding: {req:?}"
        );
        let _ = req.in_reply_to.as_deref().map(str::parse::<MsgId>);
        let _ = super::agents::check_client_id(req.client_id.as_deref());
        let _ = req.encoding.decode(req.body);
    }
    if let Ok(r) = parse_json::<ReplyRequest>(data) {
        let _ = r.id.parse::<MsgId>();
        let _ = super::agents::check_client_id(r.client_id.as_deref());
        let _ = r.encoding.decode(r.body);
    }
    if let Ok(a) = parse_json::<AliasRequest>(data) {
        let _ = a.alias.as_deref().map(AgentName::new);
    }
    if let Ok(m) = parse_json::<MoveAgentRequest>(data) {
        let _ = m.after.as_deref().map(str::parse::<Cursor>);
    }
    if let Ok(e) = parse_json::<ExportAgentRequest>(data) {
        let _ = e.after.as_deref().map(str::parse::<Cursor>);
    }
    if let Ok(i) = parse_json::<ImportAgentRequest>(data) {
        let _ = AgentName::new(&i.export.name);
        let _ = super::agents::export_secret(&i.export);
        let _ = mesh_protocol::parse_node_id(i.export.from.trim());
    }
    // What a peer sends on the move link, and what it answers.
    if let Ok(e) = super::agents::decode_offer(data) {
        let _ = AgentName::new(&e.name);
        let _ = super::agents::export_secret(&e);
    }
    let _ = super::agents::decode_answer(data);
}

fn check_send(req: SendRequest) {
    let again = serde_json::to_vec(&req).map(|b| parse_json::<SendRequest>(&b));
    assert!(
        matches!(&again, Ok(Ok(r)) if *r == req),
        "a decoded send request does not survive encoding: {req:?}"
    );
    // No names resolve here: the harness has no node to ask.
    if let Ok(m) = message(req, |name| {
        Err(super::CallerError::BadValue(format!("{name} is not a node id")).into())
    }) {
        assert!(
            m.payload.len() as u64 <= MAX_BATCH_PAYLOAD_BYTES,
            "a message over the payload limit was taken"
        );
    }
}

/// Feeds `data[1..]` to the NDJSON line splitter in frames of `data[0]`
/// bytes (at least 1), then ends the body, and parses each line as a send.
///
/// Panics unless the lines, joined by `\n`, are exactly the bytes fed (a
/// last `\n` aside): no byte is lost, none is added, none moves to another
/// line at a frame boundary.
pub fn ndjson(data: &[u8]) {
    let Some((&step, body)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let mut buf = BytesMut::new();
    let mut scanned = 0;
    let mut lines = Vec::new();
    let frames = body.chunks(step).map(Some).chain([None]);
    for frame in frames {
        let eof = frame.is_none();
        if let Some(f) = frame {
            buf.extend_from_slice(f);
        }
        loop {
            match take_line(&mut buf, &mut scanned, eof) {
                Ok(Some(line)) => lines.push(line),
                Ok(None) => break,
                // A line over the limit is refused; nothing to compare.
                Err(_) => return,
            }
        }
    }
    assert!(buf.is_empty(), "bytes left in the splitter at the end");
    let mut joined = lines.join(&b'\n');
    if body.last() == Some(&b'\n') {
        joined.push(b'\n');
    }
    assert!(joined == body, "the lines are not the bytes fed");
    for line in lines {
        if let Ok(req) = parse_json::<SendRequest>(&line) {
            check_send(req);
        }
    }
}
