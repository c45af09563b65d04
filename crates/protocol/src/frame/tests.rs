use super::*;
use crate::ids::{Epoch, SecretKey, StreamId};

fn node(b: u8) -> NodeId {
    SecretKey::from_bytes(&[b; 32]).public()
}

fn ack(upto: Seq) -> Frame {
    Frame::Ack {
        stream: StreamId::direct(node(1), Epoch([3; 16]), node(2)),
        upto,
    }
}

fn card(b: u8) -> NodeCard {
    let name = crate::card::NodeName::new("n").unwrap();
    NodeCard::sign(&SecretKey::from_bytes(&[b; 32]), name, vec![], 1).unwrap()
}

/// A batch of node 1 to node 2 with no entries (and no valid signature).
fn empty_batch() -> SignedBatch {
    SignedBatch {
        author: node(1),
        epoch: Epoch([3; 16]),
        channel: crate::Channel::Direct(node(2)),
        first_seq: 1,
        entries: vec![],
        sig: [0; 64],
    }
}

fn hello(marks: usize) -> Frame {
    let mark = Mark {
        stream: StreamId::direct(node(1), Epoch([3; 16]), node(2)),
        seq: 1,
        cid: Some(Cid([5; 32])),
    };
    Frame::Hello {
        version: PROTOCOL_VERSION,
        node: node(2),
        epoch: Epoch([4; 16]),
        marks: vec![mark; marks],
        card: Box::new(card(2)),
    }
}

fn body(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(frame, &mut out).unwrap();
    out.split_off(FRAME_HEADER_BYTES)
}

#[test]
fn each_frame_name_is_the_one_its_postcard_tag_selects() {
    let batch = empty_batch();
    let stream = StreamId::direct(node(1), Epoch([3; 16]), node(2));
    let frames = [
        hello(1),
        Frame::Batch {
            batch,
            payloads: Payloads::default(),
        },
        ack(1),
        Frame::Resync {
            stream: stream.clone(),
            after: 1,
        },
        Frame::ResyncGap {
            stream: stream.clone(),
            earliest_available: 1,
        },
        Frame::ResyncDone {
            stream: stream.clone(),
            upto: 1,
        },
        Frame::CardQuery { node: node(3) },
        Frame::CardAnswer {
            node: node(3),
            card: Some(Box::new(card(3))),
        },
        Frame::Agents { cards: vec![] },
        Frame::StreamEnded { stream, held: 1 },
        Frame::Topics {
            topics: vec![TopicName::new("t").unwrap()],
            marks: vec![],
            more: false,
        },
        Frame::Moves {
            notices: vec![],
            more: false,
        },
        Frame::Followed {
            stream: StreamId::direct(node(1), Epoch([3; 16]), node(2)),
            through: 0,
            agents: vec![],
        },
    ];
    for (i, f) in frames.iter().enumerate() {
        let b = body(f);
        assert_eq!(usize::from(b[0]), i, "{} is tag {i}", f.name());
        assert_eq!(FRAME_NAMES[usize::from(b[0])], f.name());
    }
}

#[test]
fn encode_frame_appends_after_bytes_already_in_the_buffer() {
    let mut out = b"prefix".to_vec();
    encode_frame(&ack(2), &mut out).unwrap();
    assert_eq!(&out[..6], b"prefix");
    let len = frame_body_len(out[6..10].try_into().unwrap()).unwrap();
    assert_eq!(len, out.len() - 10);
    assert_eq!(decode_frame(&out[10..]).unwrap(), ack(2));
}

#[test]
fn encode_frame_refuses_a_hello_the_decoder_would_refuse_and_keeps_the_buffer() {
    let mut out = b"keep".to_vec();
    assert_eq!(
        encode_frame(&hello(MAX_HELLO_MARKS + 1), &mut out),
        Err(FrameError::TooManyMarks(MAX_HELLO_MARKS + 1))
    );
    assert_eq!(out, b"keep");
    encode_frame(&hello(MAX_HELLO_MARKS), &mut out).unwrap();
    assert!(decode_frame(&out[4 + FRAME_HEADER_BYTES..]).is_ok());
}

#[test]
fn decode_frame_refuses_a_hello_with_too_many_marks() {
    // Build the oversized hello by hand: encode_frame would refuse it.
    let b = postcard::to_stdvec(&hello(MAX_HELLO_MARKS + 1)).unwrap();
    assert!(b.len() <= MAX_FRAME_BYTES);
    assert_eq!(
        decode_frame(&b),
        Err(FrameError::TooManyMarks(MAX_HELLO_MARKS + 1))
    );
}

#[test]
fn a_followed_frame_of_more_agents_than_the_cap_is_refused_both_ways() {
    let followed = |n: usize| Frame::Followed {
        stream: StreamId::direct(node(1), Epoch([3; 16]), node(2)),
        through: 7,
        agents: (0..n).map(|i| node(i as u8)).collect(),
    };
    let mut out = Vec::new();
    assert_eq!(
        encode_frame(&followed(MAX_FRAME_MOVES + 1), &mut out),
        Err(FrameError::TooManyFollowed(MAX_FRAME_MOVES + 1))
    );
    assert!(out.is_empty());
    let b = postcard::to_stdvec(&followed(MAX_FRAME_MOVES + 1)).unwrap();
    assert_eq!(
        decode_frame(&b),
        Err(FrameError::TooManyFollowed(MAX_FRAME_MOVES + 1))
    );
    let b = postcard::to_stdvec(&followed(MAX_FRAME_MOVES)).unwrap();
    assert_eq!(decode_frame(&b), Ok(followed(MAX_FRAME_MOVES)));
}

#[test]
fn encode_frame_refuses_a_body_over_the_cap_and_keeps_the_buffer() {
    let batch = empty_batch();
    let frame = Frame::Batch {
        batch,
        payloads: Payloads(vec![vec![0; MAX_FRAME_BYTES]]),
    };
    let mut out = b"keep".to_vec();
    assert!(matches!(
        encode_frame(&frame, &mut out),
        Err(FrameError::TooLarge {
            max: MAX_FRAME_BYTES,
            ..
        })
    ));
    assert_eq!(out, b"keep");
}

#[test]
fn an_agents_frame_over_the_card_limit_is_refused_both_ways() {
    let card = crate::AgentCard::sign(
        &SecretKey::from_bytes(&[5; 32]),
        node(1),
        crate::AgentName::new("a").unwrap(),
        false,
        1,
    );
    let frame = Frame::Agents {
        cards: vec![card; MAX_AGENT_CARDS + 1],
    };
    let mut out = b"keep".to_vec();
    assert_eq!(
        encode_frame(&frame, &mut out),
        Err(FrameError::TooManyCards(MAX_AGENT_CARDS + 1))
    );
    assert_eq!(out, b"keep");
    let b = postcard::to_stdvec(&frame).unwrap();
    assert_eq!(
        decode_frame(&b),
        Err(FrameError::TooManyCards(MAX_AGENT_CARDS + 1))
    );
}

#[test]
fn decode_frame_refuses_a_body_over_the_cap_before_decoding() {
    let mut b = body(&ack(1));
    b.resize(MAX_FRAME_BYTES + 1, 0);
    assert_eq!(
        decode_frame(&b),
        Err(FrameError::TooLarge {
            len: MAX_FRAME_BYTES + 1,
            max: MAX_FRAME_BYTES
        })
    );
}

#[test]
fn a_varint_with_redundant_bytes_is_refused_so_each_frame_has_one_encoding() {
    let canonical = body(&ack(2));
    // `upto` is the last field: 0x02, which postcard also reads from 0x82 0x00.
    assert_eq!(canonical.last(), Some(&0x02));
    let mut padded = canonical[..canonical.len() - 1].to_vec();
    padded.extend_from_slice(&[0x82, 0x00]);
    assert_eq!(postcard::from_bytes::<Frame>(&padded).unwrap(), ack(2));
    assert!(matches!(
        decode_frame(&padded),
        Err(FrameError::Malformed { frame: "Ack", why }) if why.contains("not canonical")
    ));
    assert_eq!(decode_frame(&canonical), Ok(ack(2)));
}

#[test]
fn unknown_tags_and_empty_bodies_are_refused() {
    assert_eq!(decode_frame(&[]), Err(FrameError::Empty));
    assert_eq!(
        decode_frame(&[FRAME_NAMES.len() as u8]),
        Err(FrameError::UnknownTag(FRAME_NAMES.len() as u8))
    );
    // A multi-byte tag varint is never a known frame.
    assert_eq!(
        decode_frame(&[0x80, 0x00]),
        Err(FrameError::UnknownTag(0x80))
    );
    assert_eq!(frame_body_len([0; 4]), Err(FrameError::Empty));
}
