//! Replays the committed fuzz corpus of the local decoders
//! (`fuzz/corpus/json_body/`, `fuzz/corpus/ndjson_lines/`) through the same
//! harness the fuzz targets call, on every `cargo test`, without nightly or
//! cargo-fuzz.
//!
//! The seed files (`seed-*`, `garbage-*`) are made here;
//! `the_committed_seeds_are_the_current_ones` checks them, and writes them
//! instead when `MESH_BLESS_CORPUS=1` is set.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::{Path, PathBuf};

use mesh_daemon::api::fuzzing;
use mesh_protocol::fuzzing::corpus::Harness;
use mesh_protocol::{Cursor, Epoch, NodeTicket, SecretKey};

/// Each fuzz target's corpus folder and the harness function it calls.
const TARGETS: [(&str, Harness); 2] = [
    ("json_body", fuzzing::json_body),
    ("ndjson_lines", fuzzing::ndjson),
];

/// The committed corpus: `fuzz/corpus/` at the workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

/// A valid invite code: the one pinned in mesh-protocol's known answers.
const INVITE: &str = "meshinvite1ha4e7nbk17opbvaircmjpeiteb56e2dv3ma146vjei403d0fdte0406000103dp604g023do0000000000000000000re9g1081g81860s4alalalalalalalalalalalalak";

/// The seed inputs of each target, by file name.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let node = SecretKey::from_bytes(&[1; 32]).public();
    let ticket = NodeTicket::new(node, vec!["192.0.2.1:4433".parse().unwrap()])
        .unwrap()
        .to_string();
    let cursor = Cursor::new(&node, Epoch([2; 16]), 42).to_string();
    let send = format!(r#"{{"to":"{node}","body":"hello"}}"#);
    let send_b64 =
        format!(r#"{{"to":"{node}","body":"aGVsbG8=","encoding":"base64","msg_kind":7}}"#);
    let mut out = Vec::new();
    let mut json = |name: &str, text: String| {
        out.push(("json_body", name.to_owned(), text.into_bytes()));
    };
    json("seed-send", send.clone());
    json("seed-send-base64", send_b64.clone());
    json("seed-batch", format!("[{send},{send_b64}]"));
    json("seed-peer", format!(r#"{{"ticket":"{ticket}"}}"#));
    json("seed-cursor", format!(r#"{{"cursor":"{cursor}"}}"#));
    json("seed-invite", r#"{"uses":3,"ttl_ms":600000}"#.to_owned());
    json("seed-join", format!(r#"{{"code":"{INVITE}"}}"#));
    json("seed-agent", r#"{"name":"planner","uid":1000}"#.to_owned());
    json(
        "seed-agent-send",
        r#"{"to":"bob@build-box","body":"hi","in_reply_to":"0000000000000000000000000000002a","client_id":"r-1"}"#.to_owned(),
    );
    json(
        "seed-reply",
        r#"{"id":"0000000000000000000000000000002a","body":"aGk=","encoding":"base64"}"#.to_owned(),
    );
    json("seed-alias", r#"{"alias":"build-box"}"#.to_owned());
    json(
        "seed-topic",
        r#"{"name":"builds","max_msgs":100}"#.to_owned(),
    );
    json(
        "seed-publish",
        r#"{"body":"green","msg_kind":0}"#.to_owned(),
    );
    json("seed-export", format!(r#"{{"after":"{cursor}"}}"#));
    let agent = mesh_protocol::SecretKey::from_bytes(&[3; 32]);
    json(
        "seed-import",
        format!(
            r#"{{"export":{{"format":"{}","name":"planner","key":"{}","secret_key":"{}","from":"{node}","version":1}},"uid":1000}}"#,
            mesh_api::AGENT_EXPORT_FORMAT,
            agent.public(),
            data_encoding::HEXLOWER.encode(&agent.to_bytes()),
        ),
    );
    // The move link: an offer (an export's JSON) and both answers, and
    // the route's body.
    json(
        "seed-move-offer",
        format!(
            r#"{{"format":"{}","name":"planner","key":"{}","secret_key":"{}","from":"{node}","version":0}}"#,
            mesh_api::AGENT_EXPORT_FORMAT,
            agent.public(),
            data_encoding::HEXLOWER.encode(&agent.to_bytes()),
        ),
    );
    json(
        "seed-move-imported",
        format!(
            r#"{{"imported":{{"agent":{{"name":"planner","address":"planner@{node}","node":"{node}","key":"{}","online":false,"uid":1000,"socket":"/run/agent-mesh/planner.sock"}},"version":1}}}}"#,
            agent.public()
        ),
    );
    json(
        "seed-move-refused",
        r#"{"refused":{"error":{"code":"agent_exists","fault":"caller","message":"an agent planner exists here"}}}"#.to_owned(),
    );
    json(
        "seed-move",
        format!(r#"{{"to":"{node}","after":"{cursor}"}}"#),
    );
    json(
        "garbage-agent-bad-name",
        r#"{"name":"Planner!"}"#.to_owned(),
    );
    json(
        "garbage-send-bad-base64",
        format!(r#"{{"to":"{node}","body":"!!","encoding":"base64"}}"#),
    );
    json(
        "garbage-send-unknown-field",
        format!(r#"{{"to":"{node}","body":"x","colour":"red"}}"#),
    );
    json(
        "garbage-send-bad-node",
        r#"{"to":"bob","body":"x","msg_kind":70000}"#.to_owned(),
    );
    json("garbage-truncated", send[..send.len() / 2].to_owned());
    json(
        "garbage-escapes",
        r#"{"to":"\ud800","body":"\u0000\n"}"#.to_owned(),
    );
    let mut ndjson = |name: &str, step: u8, text: &str| {
        let mut bytes = vec![step];
        bytes.extend_from_slice(text.as_bytes());
        out.push(("ndjson_lines", name.to_owned(), bytes));
    };
    ndjson("seed-lines", 7, &format!("{send}\n{send_b64}\n"));
    ndjson("seed-lines-no-last-newline", 1, &format!("{send}\n{send}"));
    ndjson("seed-lines-blank", 3, &format!("\n \n{send}\r\n\n"));
    ndjson("garbage-lines", 2, "{\n}\n[1,2]\nnull\n\u{feff}{}");
    out
}

mesh_protocol::corpus_tests! {
    root: root(),
    targets: TARGETS,
    seeds: seeds(),
    seeds_test: the_committed_seeds_are_the_current_ones,
}

#[test]
fn the_harnesses_catch_what_they_check() {
    // The splitter's oracle holds on a body cut at every size.
    let body = b"{\"to\":\"x\",\"body\":\"a\"}\n\nzz\n";
    for step in 1..=u8::try_from(body.len()).unwrap() {
        let mut input = vec![step];
        input.extend_from_slice(body);
        fuzzing::ndjson(&input);
    }
    fuzzing::json_body(b"");
    fuzzing::ndjson(b"");
}
