//! Entry points for the fuzz targets in `fuzz/` and for the corpus replay test.
//!
//! Each function takes untrusted bytes, runs them through the decoders a peer
//! or a local client can reach, and checks what must hold for any input:
//! nothing panics, and whatever decodes re-encodes to the same value (for
//! frames: to the same bytes). A panic here is a bug, never an expected outcome.
//! Not a stable API: it exists so the fuzz crate and the tests share one harness.

pub mod corpus;

use std::str::FromStr;

use crate::agent::{AgentEnvelope, Bounce};
use crate::batch::Cid;
use crate::cursor::{Cursor, CursorError};
use crate::frame::{FRAME_HEADER_BYTES, Frame, decode_frame, encode_frame, frame_body_len};
use crate::ids::NodeId;
use crate::join::{
    INVITE_ADDRS_MAX, InviteCode, JoinAnswer, JoinRequest, decode_join, encode_join,
};
use crate::ticket::{MAX_TICKET_ADDRS, NodeTicket};

/// Feeds `data` to the frame decoder as one frame body (no length prefix);
/// a batch that decodes is verified and, if its signature holds, opened.
///
/// Also reads the first [`FRAME_HEADER_BYTES`] of `data` as a length header.
/// Panics if a decoded frame does not re-encode to exactly `data`, or if an
/// opened batch hands out an envelope whose payload misses its signed hash.
pub fn frame(data: &[u8]) {
    if let Some(header) = data.first_chunk::<FRAME_HEADER_BYTES>() {
        let _ = frame_body_len(*header);
    }
    let Ok(frame) = decode_frame(data) else {
        return;
    };
    let mut out = Vec::with_capacity(data.len() + FRAME_HEADER_BYTES);
    if let Err(e) = encode_frame(&frame, &mut out) {
        panic!("a decoded {} frame does not re-encode: {e}", frame.name());
    }
    assert!(
        out.get(FRAME_HEADER_BYTES..) == Some(data),
        "a decoded {} frame re-encodes to other bytes",
        frame.name()
    );
    if let Frame::Agents { cards } = &frame {
        for card in cards {
            // Either outcome is fine; checking must not panic.
            let _ = card.verify();
        }
        return;
    }
    let Frame::Batch { batch, payloads } = frame else {
        return;
    };
    let Ok(verified) = batch.verify() else { return };
    let Ok(open) = verified.open(payloads.0) else {
        return;
    };
    for (seq, e) in (open.batch().first_seq()..).zip(open.envelopes()) {
        assert_eq!(e.seq, seq, "envelopes out of sequence");
        assert!(
            Cid::of(e.payload) == e.header.payload_cid,
            "payload misses its signed hash"
        );
    }
}

/// Feeds `data` to the decoders of the mesh's own payload formats (an
/// agent message, a bounce, a tombstone, a forward, a trimmed forward, a
/// read receipt), as a receiving node does with an envelope of that kind.
///
/// Panics if a decoded value does not re-encode to exactly `data`.
pub fn agent_payload(data: &[u8]) {
    let full = AgentEnvelope::decode(data);
    if let Ok(e) = &full {
        assert!(
            e.encode() == data,
            "a decoded agent envelope re-encodes to other bytes"
        );
    }
    let header = crate::agent::AgentHeader::decode(data);
    assert!(
        header.is_ok() == full.is_ok(),
        "the header decoder and the envelope decoder disagree"
    );
    if let (Ok(h), Ok(e)) = (header, full) {
        assert!(h.body == e.body.as_slice() && h.id == e.id && h.from == e.from);
        assert!(
            h.receipt == e.receipt,
            "the decoders disagree on the receipt flag"
        );
    }
    if let Ok(r) = crate::ReadReceipt::decode(data) {
        assert!(
            r.encode() == data,
            "a decoded read receipt re-encodes to other bytes"
        );
        assert!(
            (1..=crate::MAX_RECEIPT_IDS).contains(&r.ids.len())
                && r.ids.windows(2).all(|w| w[0] < w[1]),
            "a read receipt's ids out of bounds or order"
        );
        // Either outcome is fine; checking must not panic.
        let _ = r.verify(&some_node(), &some_node());
    }
    if let Ok(b) = Bounce::decode(data) {
        assert!(
            b.encode() == data,
            "a decoded bounce re-encodes to other bytes"
        );
    }
    if let Ok(t) = crate::Tombstone::decode(data) {
        assert!(
            t.encode() == data,
            "a decoded tombstone re-encodes to other bytes"
        );
    }
    if let Ok(f) = crate::Forward::decode(data) {
        assert!(
            f.encode() == data,
            "a decoded forward re-encodes to other bytes"
        );
        assert!(AgentEnvelope::decode(&f.envelope).is_ok());
    }
    if let Ok(t) = crate::ForwardTrimmed::decode(data) {
        assert!(
            t.encode() == data,
            "a decoded trimmed forward re-encodes to other bytes"
        );
        assert!(t.from <= t.to, "a trimmed forward of an empty range");
    }
}

/// Feeds `data` (if UTF-8) to the journal cursor parser.
///
/// Panics if a parsed cursor does not survive printing and parsing again, or
/// if checking it against its own epoch fails for any reason but the node.
pub fn cursor(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cursor) = Cursor::from_str(text) else {
        return;
    };
    let again = cursor.to_string().parse::<Cursor>();
    assert!(
        again == Ok(cursor),
        "cursor {cursor:?} does not survive printing"
    );
    // Asked with its own epoch, a cursor is either this node's (and then is
    // exactly the cursor this node would print) or another node's.
    let node = some_node();
    match cursor.arrival_for(&node, cursor.epoch()) {
        Ok(arrival) => assert!(Cursor::new(&node, cursor.epoch(), arrival) == cursor),
        Err(CursorError::OtherNode { .. }) => {}
        Err(e) => panic!("cursor {cursor:?} refused under its own epoch: {e}"),
    }
}

/// Feeds `data` (if UTF-8) to the node ticket parser.
///
/// Panics if a parsed ticket breaks its address limit or does not survive
/// printing and parsing again.
pub fn ticket(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(ticket) = NodeTicket::from_str(text) else {
        return;
    };
    assert!(
        ticket.addrs.len() <= MAX_TICKET_ADDRS,
        "ticket over the address limit"
    );
    let again = ticket.to_string().parse::<NodeTicket>();
    assert!(
        again.as_ref() == Ok(&ticket),
        "ticket {ticket:?} does not survive printing"
    );
}

/// Feeds `data` to the join decoders as one message body (no length
/// prefix), as a request (the inviter's side) and as an answer (the
/// joiner's); a request that decodes has its card and proof checked.
///
/// Panics if a decoded message does not re-encode to exactly `data`.
pub fn join(data: &[u8]) {
    if let Ok(req) = decode_join::<JoinRequest>(data) {
        assert_reencodes(&req, data, "join request");
        let _ = req.card.verify();
        let _ = req.check_proof(&some_node());
    }
    if let Ok(answer) = decode_join::<JoinAnswer>(data) {
        assert_reencodes(&answer, data, "join answer");
        if let JoinAnswer::Welcome { card } = &answer {
            let _ = card.verify();
        }
    }
}

fn assert_reencodes<T: serde::Serialize>(msg: &T, data: &[u8], what: &str) {
    let mut out = Vec::with_capacity(data.len() + FRAME_HEADER_BYTES);
    if let Err(e) = encode_join(msg, &mut out) {
        panic!("a decoded {what} does not re-encode: {e}");
    }
    assert!(
        out.get(FRAME_HEADER_BYTES..) == Some(data),
        "a decoded {what} re-encodes to other bytes"
    );
}

/// Feeds `data` (if UTF-8) to the invite code parser.
///
/// Panics if a parsed code breaks its address limit or does not survive
/// printing and parsing again.
pub fn invite(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(code) = InviteCode::from_str(text) else {
        return;
    };
    assert!(
        code.addrs.len() <= INVITE_ADDRS_MAX,
        "invite code over the address limit"
    );
    let again = code.to_string().parse::<InviteCode>();
    assert!(
        again.as_ref() == Ok(&code),
        "invite code {code:?} does not survive printing"
    );
}

/// A fixed valid node id (the ed25519 base point's encoding, so no key
/// derivation runs per input).
fn some_node() -> NodeId {
    const BASE_POINT: [u8; 32] = [
        0x58, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66,
        0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66, 0x66,
        0x66, 0x66,
    ];
    match NodeId::from_bytes(&BASE_POINT) {
        Ok(node) => node,
        Err(e) => panic!("the ed25519 base point is a valid key: {e}"),
    }
}
