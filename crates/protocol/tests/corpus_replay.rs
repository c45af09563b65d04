//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the
//! same harness the fuzz targets call, so every input a fuzzer ever kept runs
//! on every `cargo test`, without nightly or cargo-fuzz.
//!
//! The seed files (`seed-*`, `garbage-*`) are generated from the fixtures in
//! `tests/common`; `the_committed_seeds_are_the_current_encodings` checks
//! them, and writes them instead when `MESH_BLESS_CORPUS=1` is set.

// Tests unwrap freely: a panic is how a test reports its failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use mesh_protocol::{
    FRAME_HEADER_BYTES, Frame, JoinRequest, Payloads, decode_frame, encode_join, fuzzing,
    fuzzing::corpus::Harness,
};

/// Each fuzz target's corpus folder and the harness function it calls.
const TARGETS: [(&str, Harness); 6] = [
    ("frame_decode", fuzzing::frame),
    ("agent_payload", fuzzing::agent_payload),
    ("cursor_parse", fuzzing::cursor),
    ("ticket_parse", fuzzing::ticket),
    ("join_decode", fuzzing::join),
    ("invite_parse", fuzzing::invite),
];

/// The committed corpus: `fuzz/corpus/` at the workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

fn body(frame: &Frame) -> Vec<u8> {
    common::encoded(frame).split_off(FRAME_HEADER_BYTES)
}

/// The seed inputs of each target, by file name.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut frame = |name: &str, bytes: Vec<u8>| out.push(("frame_decode", name.to_owned(), bytes));
    for (name, f) in common::frames() {
        frame(&format!("seed-{}", name.to_lowercase()), body(&f));
    }
    let ack = body(&common::frames()[2].1);
    let batch = body(&common::frames()[1].1);
    frame("garbage-empty", vec![]);
    frame("garbage-unknown-tag", vec![9]);
    {
        // A Hello whose card's signature no longer verifies (its last byte).
        let mut b = body(&common::frames()[0].1);
        *b.last_mut().unwrap() ^= 1;
        frame("garbage-hello-card-bad-sig", b);
    }
    frame("garbage-ack-trailing-byte", [ack.as_slice(), &[0]].concat());
    frame(
        "garbage-ack-redundant-varint",
        [&ack[..ack.len() - 1], &[0x82, 0x00]].concat(),
    );
    frame("garbage-batch-truncated", batch[..batch.len() / 2].to_vec());
    {
        // Decodes and verifies, but the last payload byte misses its hash.
        let mut b = batch.clone();
        *b.last_mut().unwrap() ^= 1;
        frame("garbage-batch-payload-flipped", b);
    }
    {
        // Decodes, but the signature does not verify (last byte of the sig).
        let (verified, payloads) = common::batch().into_parts();
        let mut signed = verified.into_signed();
        signed.sig[63] ^= 1;
        frame(
            "garbage-batch-bad-sig",
            body(&Frame::Batch {
                batch: signed,
                payloads: Payloads(payloads),
            }),
        );
    }
    {
        // One payload short of the signed entries.
        let (verified, mut payloads) = common::batch().into_parts();
        payloads.pop();
        let f = Frame::Batch {
            batch: verified.into_signed(),
            payloads: Payloads(payloads),
        };
        frame("garbage-batch-missing-payload", body(&f));
    }

    let mut agent = |name: &str, bytes: Vec<u8>| {
        out.push(("agent_payload", name.to_owned(), bytes));
    };
    agent("seed-agent-envelope", common::agent_envelope().encode());
    agent("seed-agent-reply", common::agent_reply().encode());
    agent("seed-bounce", common::bounce().encode());
    agent("seed-forward", common::forward().encode());
    agent("seed-forward-trimmed", common::forward_trimmed().encode());
    agent(
        "seed-agent-envelope-receipt",
        common::agent_envelope_receipt().encode(),
    );
    agent("seed-read-receipt", common::read_receipt().encode());
    {
        let mut b = common::agent_envelope_receipt().encode();
        b.push(1);
        agent("garbage-agent-envelope-two-flags", b);
    }
    {
        // Its two ids swapped: no longer strictly ascending.
        let mut r = common::read_receipt();
        r.ids.reverse();
        agent("garbage-read-receipt-unordered", r.encode());
    }
    {
        let mut b = common::agent_envelope().encode();
        b.push(0);
        agent("garbage-agent-envelope-trailing-byte", b);
    }
    {
        let mut b = common::agent_envelope().encode();
        // The first byte of `from`'s length names a longer string.
        b[16] = 0x7f;
        agent("garbage-agent-envelope-bad-length", b);
    }
    {
        let mut b = common::agent_envelope().encode();
        b[17] = b'A';
        agent("garbage-agent-envelope-uppercase-name", b);
    }

    let cursor = common::cursor().to_string();
    out.push((
        "cursor_parse",
        "seed-cursor".into(),
        cursor.clone().into_bytes(),
    ));
    out.push((
        "cursor_parse",
        "seed-cursor-uppercase".into(),
        format!(" mc1{}\n", cursor[3..].to_uppercase()).into_bytes(),
    ));
    out.push((
        "cursor_parse",
        "garbage-cursor-damaged".into(),
        cursor.replace('h', "i").into_bytes(),
    ));
    out.push((
        "cursor_parse",
        "garbage-not-utf8".into(),
        vec![0xff, 0xfe, b'm', b'c', b'1'],
    ));

    let ticket = common::ticket().to_string();
    out.push((
        "ticket_parse",
        "seed-ticket".into(),
        ticket.clone().into_bytes(),
    ));
    let bare = mesh_protocol::NodeTicket::new(common::author(), vec![]).unwrap();
    out.push((
        "ticket_parse",
        "seed-ticket-no-addrs".into(),
        bare.to_string().into_bytes(),
    ));
    out.push((
        "ticket_parse",
        "garbage-ticket-truncated".into(),
        ticket.as_bytes()[..ticket.len() - 4].to_vec(),
    ));
    out.push((
        "ticket_parse",
        "garbage-ticket-wrong-prefix".into(),
        ticket.replacen("meshnode1", "meshnode2", 1).into_bytes(),
    ));

    let join_body = |msg: &dyn Fn(&mut Vec<u8>)| {
        let mut out = Vec::new();
        msg(&mut out);
        out.split_off(FRAME_HEADER_BYTES)
    };
    let req = common::join_request();
    let req_body = join_body(&|out| encode_join(&req, out).unwrap());
    out.push(("join_decode", "seed-join-request".into(), req_body.clone()));
    for (i, a) in common::join_answers().iter().enumerate() {
        let b = join_body(&|out| encode_join(a, out).unwrap());
        out.push(("join_decode", format!("seed-join-answer-{i}"), b));
    }
    {
        let unproven = JoinRequest {
            proof: None,
            ..req.clone()
        };
        let b = join_body(&|out| encode_join(&unproven, out).unwrap());
        out.push(("join_decode", "seed-join-request-no-proof".into(), b));
    }
    out.push((
        "join_decode",
        "garbage-join-request-truncated".into(),
        req_body[..req_body.len() / 2].to_vec(),
    ));
    {
        let mut b = req_body.clone();
        *b.last_mut().unwrap() ^= 1;
        out.push(("join_decode", "garbage-join-request-bad-proof".into(), b));
    }

    let invite = common::invite_code().to_string();
    out.push((
        "invite_parse",
        "seed-invite".into(),
        invite.clone().into_bytes(),
    ));
    out.push((
        "invite_parse",
        "garbage-invite-truncated".into(),
        invite.as_bytes()[..invite.len() - 4].to_vec(),
    ));
    out.push((
        "invite_parse",
        "garbage-invite-wrong-prefix".into(),
        invite
            .replacen("meshinvite1", "meshinvite2", 1)
            .into_bytes(),
    ));
    out
}

mesh_protocol::corpus_tests! {
    root: root(),
    targets: TARGETS,
    seeds: seeds(),
    seeds_test: the_committed_seeds_are_the_current_encodings,
}

#[test]
fn the_frame_seeds_hold_every_variant_and_a_batch_that_opens() {
    let mut seen = Vec::new();
    for (_, name, bytes) in seeds()
        .into_iter()
        .filter(|(t, n, _)| *t == "frame_decode" && n.starts_with("seed-"))
    {
        let frame =
            decode_frame(&bytes).unwrap_or_else(|e| panic!("seed {name} does not decode: {e}"));
        if let Frame::Batch { batch, payloads } = &frame {
            assert!(
                batch
                    .clone()
                    .verify()
                    .unwrap()
                    .open(payloads.0.clone())
                    .is_ok()
            );
        }
        seen.push(frame.name());
    }
    assert_eq!(
        seen,
        [
            "Hello",
            "Batch",
            "Ack",
            "Resync",
            "ResyncGap",
            "ResyncDone",
            "CardQuery",
            "CardAnswer",
            "Agents",
            "StreamEnded",
            "Topics",
            "Moves",
            "Followed"
        ]
    );
}
