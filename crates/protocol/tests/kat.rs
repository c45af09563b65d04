//! Known-answer tests: the exact bytes of the fixed batch, its signature, every
//! frame variant, a node card and its signature, a cursor, a ticket, an
//! invite code, a join request, its proof's signed bytes and every join answer. Any change to the wire format, the
//! signed bytes or the text formats fails here first; if the change is meant,
//! bump the version it touches and update these values and `docs/protocol.md`.

// Tests unwrap freely: a panic is how a test reports its failure.
#![allow(clippy::unwrap_used)]

mod common;

use mesh_protocol::{
    AGENT_CARD_DOMAIN, AGENT_MOVE_DOMAIN, AgentEnvelope, AgentHeader, BATCH_DOMAIN, Bounce,
    CARD_DOMAIN, Cursor, FRAME_HEADER_BYTES, InviteCode, JOIN_PROOF_DOMAIN, JoinAnswer,
    JoinRequest, NodeTicket, READ_RECEIPT_DOMAIN, ReadReceipt, SignedBatch, decode_frame,
    decode_join, encode_join, frame_body_len,
};

fn hex(b: &[u8]) -> String {
    data_encoding::HEXLOWER.encode(b)
}

/// Compares bytes as hex, printing the whole actual value on a mismatch.
#[track_caller]
fn assert_hex(what: &str, got: &[u8], want: &str) {
    let got = hex(got);
    assert!(got == want, "{what} changed:\n  got  {got}\n  want {want}");
}

fn unhex(s: &str) -> Vec<u8> {
    data_encoding::HEXLOWER.decode(s.as_bytes()).unwrap()
}

/// Compares a text form with its pinned value, printing both on a mismatch.
#[track_caller]
fn assert_text(what: &str, got: &str, want: &str) {
    assert!(
        got == want,
        "{what} text changed:\n  got  {got}\n  want {want}"
    );
}

const AUTHOR_HEX: &str = "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c";
const RECIPIENT_HEX: &str = "8139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b394";
const SIGNED_BYTES_HEX: &str = "6167656e742d6d6573682f7369676e65642d62617463682f7631008a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39401020180d0eab6b73300ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f050281d0eab6b73301d7894ae9716d38d2dfad0ec55424ca321ee12453d51f1b3adeb77d0475ed988c05";
const SIG_HEX: &str = "4b2ed530c32cf3d41ba7df85103eb081a4c908e06bceb68575d1784ce68a3e787a8e8392c8ef2271a25f898758be5346231e47a86faf8d8141c254e12ed6ad06";
const HELLO_HEX: &str = "0000015d00068139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b394eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee028a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b3940201d7894ae9716d38d2dfad0ec55424ca321ee12453d51f1b3adeb77d0475ed988c8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f010e6167656e74732f706c616e6e6572ac02008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39405627261766f0100c0000202b72680d0eab6b733ce7257391fc8b2799571d394f44f248544d541a99d4cee39e7c305614aae374fde450fd5b4fa31030d3199a4913e8ac72e79d99f993ef53680335910f9d61a09";
const BATCH_HEX: &str = "000000f3018a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39401020180d0eab6b73300ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f050281d0eab6b73301d7894ae9716d38d2dfad0ec55424ca321ee12453d51f1b3adeb77d0475ed988c054b2ed530c32cf3d41ba7df85103eb081a4c908e06bceb68575d1784ce68a3e787a8e8392c8ef2271a25f898758be5346231e47a86faf8d8141c254e12ed6ad06020568656c6c6f05776f726c64";
const ACK_HEX: &str = "00000053028a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39402";
const RESYNC_HEX: &str = "00000053038a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39401";
const RESYNC_GAP_HEX: &str = "00000043048a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f010e6167656e74732f706c616e6e6572ac02";
const RESYNC_DONE_HEX: &str = "00000053058a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39402";
const CARD_QUERY_HEX: &str =
    "00000021068a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c";
const CARD_ANSWER_HEX: &str = "000000a9078a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c018a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c05616c7068610200c0000201b7260120010db8000000000000000000000001b72680d0eab6b73352caf44066a597cd3a17cb8e9a188f3bfe392f601561abf19d26d2a9f37d21fbd7db1b44851f87ef1aed40e7c5f88c5b6d863a22c89be5378717a4c7e11e6601";
const CARD_SIGNED_BYTES_HEX: &str = "6167656e742d6d6573682f6e6f64652d636172642f7631008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39405627261766f0100c0000202b72680d0eab6b733";
const CARD_SIG_HEX: &str = "ce7257391fc8b2799571d394f44f248544d541a99d4cee39e7c305614aae374fde450fd5b4fa31030d3199a4913e8ac72e79d99f993ef53680335910f9d61a09";
const INVITE_TEXT: &str = "meshinvite1ha4e7nbk17opbvaircmjpeiteb56e2dv3ma146vjei403d0fdte0406000103dp604g023do0000000000000000000re9g1081g81860s4alalalalalalalalalalalalak";
const JOIN_PROOF_BYTES_HEX: &str = "6167656e742d6d6573682f6a6f696e2d70726f6f662f7631008a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c0102030405060708f3f000a22fd9328572fead94e6abca7b12e7af9bacd069bbbe3baee39b1f165fbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb8139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39405627261766f0100c0000202b72680d0eab6b733ce7257391fc8b2799571d394f44f248544d541a99d4cee39e7c305614aae374fde450fd5b4fa31030d3199a4913e8ac72e79d99f993ef53680335910f9d61a09";
const JOIN_REQUEST_HEX: &str = "000000dd0102030405060708aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb8139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39405627261766f0100c0000202b72680d0eab6b733ce7257391fc8b2799571d394f44f248544d541a99d4cee39e7c305614aae374fde450fd5b4fa31030d3199a4913e8ac72e79d99f993ef53680335910f9d61a0901914f54a4755d4e6b55317771e9dbdaa558a046e229f6125fe56016f2d1576165f37575b54fb3f8ac6fa7bffae4f37f637f6d0497dfd81fc2ce257cde230d2806";
const JOIN_ANSWER_HEX: [&str; 3] = [
    "00000088008a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c05616c7068610200c0000201b7260120010db8000000000000000000000001b72680d0eab6b73352caf44066a597cd3a17cb8e9a188f3bfe392f601561abf19d26d2a9f37d21fbd7db1b44851f87ef1aed40e7c5f88c5b6d863a22c89be5378717a4c7e11e6601",
    "0000000301f403",
    "000000020206",
];
const AGENTS_HEX: &str = "0000009108018a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c07706c616e6e6572ed4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d10180d0eab6b733c2e639972c69611964156ce2594df9b41b4324d4eb7604618e67e14ec3eac0f14c0d9b8c06a978574ac796caf1e18f449470f389258679e4c93e481c485ff501";
const MSG_ID_HEX: &str = "b4672bf683bcfd810000000000000001";
const AGENT_ENVELOPE_HEX: &str =
    "b4672bf683bcfd81000000000000000107706c616e6e65720105636f6465720000026869";
const AGENT_REPLY_HEX: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa05636f6465720107706c616e6e657201b4672bf683bcfd81000000000000000101016b026f6b";
const BOUNCE_HEX: &str = "b4672bf683bcfd81000000000000000107706c616e6e65720105636f64657200";
const AGENT_CARD_SIGNED_BYTES_HEX: &str = "6167656e742d6d6573682f6167656e742d636172642f7631008a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c07706c616e6e6572ed4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d10180d0eab6b733";
const STREAM_ENDED_HEX: &str = "00000053098a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39402";
/// Every frame variant's pinned bytes, in the order of `common::frames()`.
const FRAMES_HEX: [&str; 13] = [
    HELLO_HEX,
    BATCH_HEX,
    ACK_HEX,
    RESYNC_HEX,
    RESYNC_GAP_HEX,
    RESYNC_DONE_HEX,
    CARD_QUERY_HEX,
    CARD_ANSWER_HEX,
    AGENTS_HEX,
    STREAM_ENDED_HEX,
    TOPICS_HEX,
    MOVES_HEX,
    FOLLOWED_HEX,
];
const FOLLOWED_HEX: &str = "000000740c8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f008139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b3940201ed4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d1";
const FORWARD_HEX: &str = "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c24b4672bf683bcfd81000000000000000107706c616e6e65720105636f6465720000026869";
const FORWARD_TRIMMED_HEX: &str = "07706c616e6e65720509";
const MOVES_HEX: &str = "000000b20b01ed4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d107706c616e6e65728a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c8139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b3940180d0eab6b733759f230d61cdd8d7c8094d70422edb579a1498c38a69d2006f634a5cd3ab64fd0573dc0366f96818d7ce11f70aca9a8976feefb853bf7bbfb38996a14992950800";
const AGENT_MOVE_SIGNED_BYTES_HEX: &str = "6167656e742d6d6573682f6167656e742d6d6f76652f763100ed4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d107706c616e6e65728a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c8139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b3940180d0eab6b733";
const TOPICS_HEX: &str = "000000560a010e6167656e74732f706c616e6e6572018a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c000102030405060708090a0b0c0d0e0f010e6167656e74732f706c616e6e6572ac020000";
const CURSOR_TEXT: &str = "mc1ha4e7nbk17opa001081g81860s40i2gb1g6gs3o00000000000l2qqh86o";
const TICKET_TEXT: &str = "meshnode1ha4e7nbk17opbvaircmjpeiteb56e2dv3ma146vjei403d0fdte0406000103k9204g023do0000000000000000000t28g";

#[test]
fn the_fixed_keys_are_the_documented_node_ids() {
    assert_hex("author id", common::author().as_bytes(), AUTHOR_HEX);
    assert_hex(
        "recipient id",
        common::recipient().as_bytes(),
        RECIPIENT_HEX,
    );
}

#[test]
fn the_signed_bytes_of_the_fixed_batch_are_pinned() {
    let batch = common::batch();
    let signed = batch.batch().signed().signed_bytes();
    assert!(signed.starts_with(BATCH_DOMAIN));
    assert_hex("signed bytes", &signed, SIGNED_BYTES_HEX);
}

#[test]
fn the_signature_of_the_fixed_batch_is_pinned_and_verifies() {
    let batch = common::batch();
    assert_hex("signature", &batch.batch().signed().sig, SIG_HEX);
    let again: SignedBatch = batch.batch().signed().clone();
    assert!(again.verify().is_ok());
}

#[test]
fn every_frame_variant_encodes_to_its_pinned_bytes() {
    let frames = common::frames();
    assert_eq!(frames.len(), FRAMES_HEX.len());
    for ((name, frame), want) in frames.iter().zip(FRAMES_HEX) {
        assert_eq!(frame.name(), *name);
        assert_hex(name, &common::encoded(frame), want);
    }
}

#[test]
fn every_pinned_frame_decodes_to_its_fixed_value() {
    for ((name, frame), want) in common::frames().into_iter().zip(FRAMES_HEX) {
        let bytes = unhex(want);
        let (header, body) = bytes.split_at(FRAME_HEADER_BYTES);
        assert_eq!(
            frame_body_len(header.try_into().unwrap()),
            Ok(body.len()),
            "{name}"
        );
        assert_eq!(decode_frame(body), Ok(frame), "{name}");
    }
}

#[test]
fn the_fixed_cursor_prints_as_its_pinned_text() {
    assert_text("cursor", &common::cursor().to_string(), CURSOR_TEXT);
    let parsed: Cursor = CURSOR_TEXT.parse().unwrap();
    assert_eq!(
        parsed.arrival_for(&common::author(), common::AUTHOR_EPOCH),
        Ok(42)
    );
}

#[test]
fn the_fixed_ticket_prints_as_its_pinned_text() {
    assert_text("ticket", &common::ticket().to_string(), TICKET_TEXT);
    assert_eq!(TICKET_TEXT.parse::<NodeTicket>(), Ok(common::ticket()));
}

#[test]
fn the_fixed_message_id_is_pinned() {
    assert_hex("message id", common::msg_id().as_bytes(), MSG_ID_HEX);
    assert_eq!(common::msg_id().to_string(), MSG_ID_HEX);
}

#[test]
fn the_fixed_agent_payloads_encode_to_their_pinned_bytes_and_decode_back() {
    let cases = [
        (
            "agent envelope",
            common::agent_envelope(),
            AGENT_ENVELOPE_HEX,
        ),
        ("agent reply", common::agent_reply(), AGENT_REPLY_HEX),
    ];
    for (what, value, want) in cases {
        assert_hex(what, &value.encode(), want);
        let bytes = unhex(want);
        assert_eq!(AgentEnvelope::decode(&bytes), Ok(value), "{what}");
    }
    assert_hex("bounce", &common::bounce().encode(), BOUNCE_HEX);
    assert_hex("forward", &common::forward().encode(), FORWARD_HEX);
    assert_eq!(
        mesh_protocol::Forward::decode(&unhex(FORWARD_HEX)),
        Ok(common::forward())
    );
    assert_eq!(Bounce::decode(&unhex(BOUNCE_HEX)), Ok(common::bounce()));
    assert_hex(
        "trimmed forward",
        &common::forward_trimmed().encode(),
        FORWARD_TRIMMED_HEX,
    );
    assert_eq!(
        mesh_protocol::ForwardTrimmed::decode(&unhex(FORWARD_TRIMMED_HEX)),
        Ok(common::forward_trimmed())
    );
    // An empty range is refused.
    assert!(mesh_protocol::ForwardTrimmed::decode(&unhex("07706c616e6e65720905")).is_err());
}

const AGENT_ENVELOPE_RECEIPT_HEX: &str =
    "b4672bf683bcfd81000000000000000107706c616e6e65720105636f646572000002686901";
const READ_RECEIPT_HEX: &str = "07706c616e6e657205636f64657280d0eab6b73302b4672bf683bcfd810000000000000001b4672bf683bcfd810000000000000002e1185878322fdc3c1bd25c7a8726828032708e1db8b8ac7721e4507d233a7fc80f526d6992f1a2dcc9804d8138eee2f5014bd5e510603067e1d811548c46c80c";
const READ_RECEIPT_SIGNED_BYTES_HEX: &str = "6167656e742d6d6573682f726561642d726563656970742f7631008a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5ced4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d107706c616e6e657205636f64657280d0eab6b73302b4672bf683bcfd810000000000000001b4672bf683bcfd810000000000000002";

#[test]
fn the_fixed_receipt_request_and_read_receipt_are_pinned_and_the_receipt_verifies() {
    let asked = common::agent_envelope_receipt();
    assert_hex(
        "agent envelope asking a receipt",
        &asked.encode(),
        AGENT_ENVELOPE_RECEIPT_HEX,
    );
    // The same bytes as the envelope that does not ask, and one flags byte.
    assert_eq!(
        AGENT_ENVELOPE_RECEIPT_HEX,
        format!("{AGENT_ENVELOPE_HEX}01")
    );
    assert_eq!(
        AgentEnvelope::decode(&unhex(AGENT_ENVELOPE_RECEIPT_HEX)),
        Ok(asked)
    );
    assert!(
        AgentHeader::decode(&unhex(AGENT_ENVELOPE_RECEIPT_HEX))
            .unwrap()
            .receipt
    );
    let receipt = common::read_receipt();
    assert_hex("read receipt", &receipt.encode(), READ_RECEIPT_HEX);
    assert_eq!(
        ReadReceipt::decode(&unhex(READ_RECEIPT_HEX)),
        Ok(receipt.clone())
    );
    let key = common::agent_secret().public();
    let signed = receipt.signed_bytes(&common::author(), &key);
    assert!(signed.starts_with(READ_RECEIPT_DOMAIN));
    assert_hex(
        "read receipt signed bytes",
        &signed,
        READ_RECEIPT_SIGNED_BYTES_HEX,
    );
    assert!(receipt.verify(&common::author(), &key).is_ok());
}

#[test]
fn the_signed_bytes_of_the_fixed_move_notice_are_pinned_and_it_verifies() {
    let notice = common::agent_move();
    let signed = notice.signed_bytes();
    assert!(signed.starts_with(AGENT_MOVE_DOMAIN));
    assert_hex(
        "move notice signed bytes",
        &signed,
        AGENT_MOVE_SIGNED_BYTES_HEX,
    );
    assert!(notice.verify().is_ok());
}

#[test]
fn the_signed_bytes_of_the_fixed_agent_card_are_pinned_and_it_verifies() {
    let card = common::agent_card();
    let signed = card.signed_bytes();
    assert!(signed.starts_with(AGENT_CARD_DOMAIN));
    assert_hex(
        "agent card signed bytes",
        &signed,
        AGENT_CARD_SIGNED_BYTES_HEX,
    );
    assert!(card.verify().is_ok());
}

#[test]
fn the_fixed_card_signs_its_pinned_bytes_and_verifies() {
    let card = common::recipient_card();
    let signed = card.signed_bytes();
    assert!(signed.starts_with(CARD_DOMAIN));
    assert_hex("card signed bytes", &signed, CARD_SIGNED_BYTES_HEX);
    assert_hex("card signature", &card.sig, CARD_SIG_HEX);
    assert!(card.verify().is_ok());
}

#[test]
fn the_fixed_invite_code_prints_as_its_pinned_text() {
    assert_text("invite", &common::invite_code().to_string(), INVITE_TEXT);
    assert_eq!(INVITE_TEXT.parse::<InviteCode>(), Ok(common::invite_code()));
}

#[test]
fn the_fixed_join_request_and_its_proof_are_pinned() {
    let req = common::join_request();
    let proof = req.proof_bytes(&common::author());
    assert!(proof.starts_with(JOIN_PROOF_DOMAIN));
    assert_hex("join proof bytes", &proof, JOIN_PROOF_BYTES_HEX);
    let mut out = Vec::new();
    encode_join(&req, &mut out).unwrap();
    assert_hex("join request", &out, JOIN_REQUEST_HEX);
    let back: JoinRequest = decode_join(&out[FRAME_HEADER_BYTES..]).unwrap();
    assert_eq!(back.check_proof(&common::author()), Ok(()));
    assert_eq!(back, req);
}

#[test]
fn every_join_answer_encodes_to_its_pinned_bytes() {
    for (answer, want) in common::join_answers().into_iter().zip(JOIN_ANSWER_HEX) {
        let mut out = Vec::new();
        encode_join(&answer, &mut out).unwrap();
        assert_hex("join answer", &out, want);
        assert_eq!(
            decode_join::<JoinAnswer>(&out[FRAME_HEADER_BYTES..]),
            Ok(answer)
        );
    }
}
