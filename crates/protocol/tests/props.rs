//! Property tests of the codec, the batch and card signatures, cursors,
//! tickets, invite codes and join messages.
//!
//! Case counts are kept small: signing and verifying run unoptimised here.

// Tests unwrap freely: a panic is how a test reports its failure.
#![allow(clippy::unwrap_used)]

mod common;

use common::{
    arb_addr, arb_agent_card, arb_agent_envelope, arb_bounce, arb_card, arb_epoch, arb_forward,
    arb_frame, arb_invite, arb_node, arb_open_batch, arb_read_receipt, arb_stream,
};
use mesh_protocol::{
    AgentEnvelope, AgentHeader, Bounce, Channel, Cursor, CursorError, FRAME_HEADER_BYTES, Frame,
    FrameError, InviteCode, JoinAnswer, JoinRequest, MAX_FRAME_BYTES, MAX_TICKET_ADDRS, NodeCard,
    NodeTicket, Payloads, ReadReceipt, RequestId, SignedBatch, StreamId, VerifyError, decode_frame,
    decode_join, encode_frame, encode_join, frame_body_len, same_node,
};
use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

fn body(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(frame, &mut out).unwrap();
    let len = frame_body_len(out[..FRAME_HEADER_BYTES].try_into().unwrap()).unwrap();
    assert_eq!(
        len,
        out.len() - FRAME_HEADER_BYTES,
        "the header names the body length"
    );
    out.split_off(FRAME_HEADER_BYTES)
}

/// Flips bit `bit` (mod the bit length) of `bytes`.
fn flip(bytes: &mut [u8], bit: usize) {
    let bit = bit % (bytes.len() * 8);
    bytes[bit / 8] ^= 1 << (bit % 8);
}

/// A stream's hash under the std hasher.
fn hash_of(s: &StreamId) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(s)
}

proptest! {
    #![proptest_config(config(48))]

    /// Streams compare node ids by their bytes (not iroh's constant-time
    /// `==`): that must agree with the keys' own equality, with `Ord` and
    /// with `Hash`, or maps keyed by streams would split or merge them.
    #[test]
    fn stream_equality_agrees_with_key_equality_order_and_hash(
        a in arb_stream(),
        other in arb_stream(),
        keep in any::<(bool, bool, bool)>(),
    ) {
        // Each field from `a` or from `other`, so streams that share some
        // fields and differ in others are compared too.
        let b = StreamId {
            author: if keep.0 { a.author } else { other.author },
            epoch: if keep.1 { a.epoch } else { other.epoch },
            channel: if keep.2 { a.channel.clone() } else { other.channel },
        };
        let by_keys = a.author == b.author
            && a.epoch == b.epoch
            && match (&a.channel, &b.channel) {
                (Channel::Direct(x), Channel::Direct(y)) => x == y,
                (Channel::Topic(x), Channel::Topic(y)) => x == y,
                _ => false,
            };
        prop_assert_eq!(a == b, by_keys);
        prop_assert_eq!(a == b, a.cmp(&b) == std::cmp::Ordering::Equal);
        prop_assert_eq!(a.channel == b.channel, a.channel.cmp(&b.channel) == std::cmp::Ordering::Equal);
        if a == b {
            prop_assert_eq!(hash_of(&a), hash_of(&b));
        }
        prop_assert_eq!(same_node(&a.author, &b.author), a.author == b.author);
    }

    #[test]
    fn an_agent_envelope_round_trips_and_every_strict_prefix_is_refused(e in arb_agent_envelope()) {
        let bytes = e.encode();
        prop_assert_eq!(AgentEnvelope::decode(&bytes), Ok(e.clone()));
        for n in 0..bytes.len() {
            let prefix = AgentEnvelope::decode(&bytes[..n]);
            if e.receipt && n == bytes.len() - 1 {
                // Without its flags byte, it is the same message not asking.
                let unasked = AgentEnvelope { receipt: false, ..e.clone() };
                prop_assert_eq!(prefix, Ok(unasked));
            } else {
                prop_assert!(prefix.is_err());
            }
        }
    }

    #[test]
    fn an_agent_envelope_with_any_other_trailing_bytes_is_refused(
        e in arb_agent_envelope(),
        extra in proptest::collection::vec(any::<u8>(), 1..4),
    ) {
        let mut bytes = e.encode();
        bytes.extend_from_slice(&extra);
        let once_asked = !e.receipt && extra == [1];
        prop_assert_eq!(AgentEnvelope::decode(&bytes).is_ok(), once_asked);
        prop_assert_eq!(AgentHeader::decode(&bytes).is_ok(), once_asked);
    }

    #[test]
    fn a_forward_round_trips_and_refuses_trailing_bytes_or_a_bad_message(
        f in arb_forward(),
        extra in any::<u8>(),
    ) {
        let mut bytes = f.encode();
        prop_assert_eq!(mesh_protocol::Forward::decode(&bytes), Ok(f.clone()));
        bytes.push(extra);
        prop_assert!(mesh_protocol::Forward::decode(&bytes).is_err());
        let mut bad = f;
        // Two bytes: one 0x01 alone would be a receipt flag.
        bad.envelope.extend([extra, 0]);
        prop_assert!(mesh_protocol::Forward::decode(&bad.encode()).is_err());
    }

    #[test]
    fn a_read_receipt_round_trips_and_any_bit_flip_fails_decode_or_verify(
        (r, node, key) in arb_read_receipt(),
        bit in any::<usize>(),
    ) {
        let bytes = r.encode();
        prop_assert_eq!(ReadReceipt::decode(&bytes), Ok(r.clone()));
        prop_assert!(r.verify(&node, &key).is_ok());
        let mut flipped = bytes.clone();
        let bit = bit % (bytes.len() * 8);
        flipped[bit / 8] ^= 1 << (bit % 8);
        if let Ok(other) = ReadReceipt::decode(&flipped) {
            prop_assert!(other.verify(&node, &key).is_err());
        }
    }

    #[test]
    fn a_bounce_round_trips_and_refuses_trailing_bytes(b in arb_bounce(), extra in any::<u8>()) {
        let mut bytes = b.encode();
        prop_assert_eq!(Bounce::decode(&bytes), Ok(b));
        bytes.push(extra);
        prop_assert!(Bounce::decode(&bytes).is_err());
    }

    #[test]
    fn an_agent_card_verifies_and_any_bit_flip_of_it_fails_decode_or_verify(
        card in arb_agent_card(),
        bit in any::<usize>(),
    ) {
        prop_assert!(card.verify().is_ok());
        let frame = Frame::Agents { cards: vec![card] };
        let mut b = body(&frame);
        // Skip the tag and the count: a flip there is another frame.
        let bit = 16 + bit % ((b.len() - 2) * 8);
        flip(&mut b, bit);
        if let Ok(Frame::Agents { cards }) = decode_frame(&b) {
            prop_assert!(cards.len() != 1 || cards[0].verify().is_err());
        }
    }

    #[test]
    fn every_frame_variant_round_trips_through_encode_and_decode(frame in arb_frame()) {
        let b = body(&frame);
        prop_assert_eq!(decode_frame(&b), Ok(frame));
    }

    #[test]
    fn a_frame_with_trailing_bytes_is_refused(
        frame in arb_frame(),
        extra in proptest::collection::vec(any::<u8>(), 1..8),
    ) {
        let mut b = body(&frame);
        b.extend_from_slice(&extra);
        prop_assert_eq!(
            decode_frame(&b),
            Err(FrameError::TrailingBytes { frame: frame.name(), extra: extra.len() })
        );
    }

    #[test]
    fn every_strict_prefix_of_a_frame_is_refused(frame in arb_frame()) {
        let b = body(&frame);
        for end in 0..b.len() {
            prop_assert!(decode_frame(&b[..end]).is_err(), "prefix of {} bytes decoded", end);
        }
    }

    #[test]
    fn any_single_bit_flip_of_an_encoded_signed_batch_fails_decode_or_verify(
        batch in arb_open_batch(),
        bit in any::<usize>(),
    ) {
        let signed = batch.batch().signed().clone();
        let mut bytes = postcard::to_stdvec(&signed).unwrap();
        prop_assert!(postcard::from_bytes::<SignedBatch>(&bytes).unwrap().verify().is_ok());
        flip(&mut bytes, bit);
        // Decoding may stop early and leave bytes over; the value is still refused.
        if let Ok((flipped, _rest)) = postcard::take_from_bytes::<SignedBatch>(&bytes) {
            prop_assert!(flipped.verify().is_err(), "a flipped batch verified");
        }
    }

    #[test]
    fn no_single_bit_flip_of_a_batch_frame_yields_an_open_batch(
        batch in arb_open_batch(),
        bit in any::<usize>(),
    ) {
        let (verified, payloads) = batch.into_parts();
        let frame = Frame::Batch { batch: verified.into_signed(), payloads: Payloads(payloads) };
        let mut b = body(&frame);
        flip(&mut b, bit);
        if let Ok(Frame::Batch { batch, payloads }) = decode_frame(&b) {
            let opened = batch.verify().and_then(|v| v.open(payloads.0));
            prop_assert!(opened.is_err(), "a flipped batch frame opened");
        }
    }

    #[test]
    fn any_single_bit_flip_of_a_payload_makes_open_fail(
        batch in arb_open_batch(),
        which in any::<usize>(),
        bit in any::<usize>(),
    ) {
        let (verified, mut payloads) = batch.into_parts();
        let first_seq = verified.first_seq();
        // Only non-empty payloads have a bit to flip.
        let nonempty: Vec<usize> = (0..payloads.len()).filter(|&i| !payloads[i].is_empty()).collect();
        prop_assume!(!nonempty.is_empty());
        let i = nonempty[which % nonempty.len()];
        flip(&mut payloads[i], bit);
        prop_assert_eq!(
            verified.open(payloads).err(),
            Some(VerifyError::PayloadMismatch { seq: first_seq + i as u64 })
        );
    }

    #[test]
    fn a_batch_signed_by_one_key_does_not_verify_as_another_authors(
        batch in arb_open_batch(),
        other in arb_node(),
    ) {
        let mut signed = batch.batch().signed().clone();
        prop_assume!(other != signed.author);
        signed.author = other;
        prop_assert!(matches!(signed.verify(), Err(VerifyError::BadSignature(_))));
    }

    #[test]
    fn a_cursor_round_trips_through_its_text(
        node in arb_node(),
        epoch in arb_epoch(),
        arrival in any::<u64>(),
    ) {
        let cursor = Cursor::new(&node, epoch, arrival);
        let text = cursor.to_string();
        prop_assert_eq!(text.parse::<Cursor>(), Ok(cursor));
        prop_assert_eq!(Cursor::parse_for(&text, &node, epoch), Ok(arrival));
        // Letter case and surrounding whitespace do not matter in the body.
        let loud = format!("  mc1{}\n", text[3..].to_uppercase());
        prop_assert_eq!(loud.parse::<Cursor>(), Ok(cursor));
    }

    #[test]
    fn a_cursor_from_another_node_or_epoch_is_refused_not_reinterpreted(
        node in arb_node(),
        other_node in arb_node(),
        epoch in arb_epoch(),
        other_epoch in arb_epoch(),
        arrival in any::<u64>(),
    ) {
        // Cursors tell nodes apart by the first 8 bytes of their ids.
        prop_assume!(node.as_bytes()[..8] != other_node.as_bytes()[..8]);
        prop_assume!(epoch != other_epoch);
        let text = Cursor::new(&node, epoch, arrival).to_string();
        let other = Cursor::parse_for(&text, &other_node, epoch);
        prop_assert!(matches!(other, Err(CursorError::OtherNode { .. })), "{:?}", other);
        prop_assert_eq!(
            Cursor::parse_for(&text, &node, other_epoch),
            Err(CursorError::OtherEpoch { theirs: epoch, ours: other_epoch })
        );
    }

    #[test]
    fn a_damaged_cursor_is_refused(
        node in arb_node(),
        epoch in arb_epoch(),
        arrival in any::<u64>(),
        at in any::<usize>(),
        with in "[0-9a-v]",
    ) {
        let text = Cursor::new(&node, epoch, arrival).to_string();
        // Replace one base32 digit of the body with another.
        let at = 3 + at % (text.len() - 3);
        prop_assume!(text[at..=at] != *with);
        let damaged = format!("{}{}{}", &text[..at], with, &text[at + 1..]);
        prop_assert!(matches!(damaged.parse::<Cursor>(), Err(CursorError::Malformed(_))));
    }

    #[test]
    fn a_ticket_round_trips_through_its_text(
        node in arb_node(),
        addrs in proptest::collection::vec(arb_addr(), 0..=MAX_TICKET_ADDRS),
    ) {
        let ticket = NodeTicket::new(node, addrs).unwrap();
        prop_assert_eq!(ticket.to_string().parse::<NodeTicket>(), Ok(ticket));
    }

    #[test]
    fn a_card_round_trips_and_verifies(card in arb_card()) {
        let bytes = postcard::to_stdvec(&card).unwrap();
        let back: NodeCard = postcard::from_bytes(&bytes).unwrap();
        prop_assert!(back.verify().is_ok());
        prop_assert_eq!(back, card);
    }

    #[test]
    fn any_single_bit_flip_of_an_encoded_card_fails_decode_or_verify(
        card in arb_card(),
        bit in any::<usize>(),
    ) {
        let mut bytes = postcard::to_stdvec(&card).unwrap();
        flip(&mut bytes, bit);
        if let Ok(c) = postcard::from_bytes::<NodeCard>(&bytes) {
            prop_assert!(c.verify().is_err() || c == card);
        }
    }

    #[test]
    fn an_invite_code_round_trips_through_its_text(code in arb_invite()) {
        prop_assert_eq!(code.to_string().parse::<InviteCode>(), Ok(code));
    }

    #[test]
    fn a_join_request_round_trips_and_its_proof_holds(
        code in arb_invite(),
        request in any::<[u8; 16]>(),
        joiner in common::arb_secret(),
        name in common::arb_name(),
    ) {
        let card = NodeCard::sign(&joiner, name, vec![], 1).unwrap();
        let req = JoinRequest::new(&joiner, &code, RequestId(request), card);
        let mut out = Vec::new();
        encode_join(&req, &mut out).unwrap();
        let back: JoinRequest = decode_join(&out[4..]).unwrap();
        prop_assert!(back.check_proof(&code.inviter).is_ok());
        prop_assert_eq!(back, req);
    }

    #[test]
    fn a_join_answer_round_trips(card in arb_card(), after_ms in any::<u32>()) {
        for answer in [JoinAnswer::Welcome { card: card.clone() }, JoinAnswer::TryAgain { after_ms }] {
            let mut out = Vec::new();
            encode_join(&answer, &mut out).unwrap();
            prop_assert_eq!(decode_join::<JoinAnswer>(&out[4..]), Ok(answer));
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn decode_frame_never_panics_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let _ = decode_frame(&bytes);
    }

    #[test]
    fn decode_frame_never_panics_on_a_known_tag_and_arbitrary_bytes(
        tag in 0u8..8,
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut b = vec![tag];
        b.extend_from_slice(&bytes);
        let _ = decode_frame(&b);
    }

    #[test]
    fn decode_join_never_panics_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let _ = decode_join::<JoinRequest>(&bytes);
        let _ = decode_join::<JoinAnswer>(&bytes);
    }

    #[test]
    fn a_length_header_above_the_cap_is_refused(len in (MAX_FRAME_BYTES as u32 + 1)..=u32::MAX) {
        prop_assert_eq!(
            frame_body_len(len.to_be_bytes()),
            Err(FrameError::TooLarge { len: len as usize, max: MAX_FRAME_BYTES })
        );
    }

    #[test]
    fn a_length_header_within_the_cap_is_the_body_length(len in 1..=(MAX_FRAME_BYTES as u32)) {
        prop_assert_eq!(frame_body_len(len.to_be_bytes()), Ok(len as usize));
    }
}

#[test]
fn the_largest_ticket_fits_the_text_limit() {
    let node = common::author();
    let addrs = vec![
        "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
            .parse()
            .unwrap();
        MAX_TICKET_ADDRS
    ];
    let ticket = NodeTicket::new(node, addrs).unwrap();
    assert_eq!(ticket.to_string().parse::<NodeTicket>(), Ok(ticket));
}
