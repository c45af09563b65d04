//! Fixtures and proptest strategies shared by the protocol's integration tests.
//!
//! The fixed values here are the ones `docs/protocol.md` uses as worked
//! examples; `kat.rs` pins their bytes.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::net::SocketAddr;

use mesh_protocol::{
    AgentCard, AgentEnvelope, AgentMove, AgentName, Bounce, BounceReason, Channel, Cid, Cursor,
    Epoch, Forward, Frame, InviteCode, InviteId, InviteSecret, JoinAnswer, JoinRefusal,
    JoinRequest, Mark, MsgId, NewEnvelope, NodeCard, NodeId, NodeName, NodeTicket, OpenBatch,
    PROTOCOL_VERSION, Payloads, ReadReceipt, RequestId, SecretKey, StreamId, SupersedeKey,
    TopicName, encode_frame,
};
use proptest::prelude::*;

/// The author of every fixed stream.
pub(crate) fn author_secret() -> SecretKey {
    SecretKey::from_bytes(&[1u8; 32])
}

/// The author's node id.
pub(crate) fn author() -> NodeId {
    author_secret().public()
}

/// The recipient's secret key.
pub(crate) fn recipient_secret() -> SecretKey {
    SecretKey::from_bytes(&[2u8; 32])
}

/// The recipient of the fixed direct stream.
pub(crate) fn recipient() -> NodeId {
    recipient_secret().public()
}

/// The recipient's fixed card: `bravo` at 192.0.2.2:4919, issued at [`CREATED_MS`].
pub(crate) fn recipient_card() -> NodeCard {
    let name = NodeName::new("bravo").unwrap();
    let addrs = vec!["192.0.2.2:4919".parse().unwrap()];
    NodeCard::sign(&recipient_secret(), name, addrs, CREATED_MS).unwrap()
}

/// The author's fixed card: `alpha` at 192.0.2.1:4919 and [2001:db8::1]:4919.
pub(crate) fn author_card() -> NodeCard {
    let name = NodeName::new("alpha").unwrap();
    let addrs = vec![
        "192.0.2.1:4919".parse().unwrap(),
        "[2001:db8::1]:4919".parse().unwrap(),
    ];
    NodeCard::sign(&author_secret(), name, addrs, CREATED_MS).unwrap()
}

/// The author's fixed invite code: its card's addresses, invite id
/// `0102030405060708`, secret 16 bytes of `aa`.
pub(crate) fn invite_code() -> InviteCode {
    InviteCode {
        inviter: author(),
        addrs: author_card().addrs,
        id: InviteId([1, 2, 3, 4, 5, 6, 7, 8]),
        secret: InviteSecret([0xaa; 16]),
    }
}

/// The recipient's fixed join request for [`invite_code`], request id 16
/// bytes of `bb`, proven with its key.
pub(crate) fn join_request() -> JoinRequest {
    JoinRequest::new(
        &recipient_secret(),
        &invite_code(),
        RequestId([0xbb; 16]),
        recipient_card(),
    )
}

/// One fixed join answer of every kind.
pub(crate) fn join_answers() -> Vec<JoinAnswer> {
    vec![
        JoinAnswer::Welcome {
            card: author_card(),
        },
        JoinAnswer::TryAgain { after_ms: 500 },
        JoinAnswer::Refused {
            refusal: JoinRefusal::Redelivered,
        },
    ]
}

/// The author's store epoch: bytes 00 01 .. 0f.
pub(crate) const AUTHOR_EPOCH: Epoch = Epoch([
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
]);

/// The recipient's store epoch.
pub(crate) const RECIPIENT_EPOCH: Epoch = Epoch([0xee; 16]);

/// 2026-01-01T00:00:00Z in Unix milliseconds.
pub(crate) const CREATED_MS: u64 = 1_767_225_600_000;

/// The fixed direct stream: author -> recipient.
pub(crate) fn direct_stream() -> StreamId {
    StreamId::direct(author(), AUTHOR_EPOCH, recipient())
}

/// The fixed topic stream: author -> topic `agents/planner`.
pub(crate) fn topic_stream() -> StreamId {
    StreamId {
        author: author(),
        epoch: AUTHOR_EPOCH,
        channel: Channel::Topic(TopicName::new("agents/planner").unwrap()),
    }
}

/// The two fixed envelopes: "hello" (kind 0) and "world" (kind 1).
pub(crate) fn envelopes() -> Vec<NewEnvelope> {
    vec![
        NewEnvelope {
            lamport: 1,
            created_ms: CREATED_MS,
            kind: 0,
            payload: b"hello".to_vec(),
        },
        NewEnvelope {
            lamport: 2,
            created_ms: CREATED_MS + 1,
            kind: 1,
            payload: b"world".to_vec(),
        },
    ]
}

/// The fixed batch: both envelopes on the direct stream, from seq 1.
pub(crate) fn batch() -> OpenBatch {
    OpenBatch::sign(
        &author_secret(),
        AUTHOR_EPOCH,
        Channel::Direct(recipient()),
        1,
        envelopes(),
    )
    .unwrap()
}

/// One fixed frame of every variant, in tag order.
pub(crate) fn frames() -> Vec<(&'static str, Frame)> {
    let (batch, payloads) = batch().into_parts();
    vec![
        (
            "Hello",
            Frame::Hello {
                version: PROTOCOL_VERSION,
                node: recipient(),
                epoch: RECIPIENT_EPOCH,
                marks: vec![
                    // Seq 2 of the fixed batch is "world".
                    Mark {
                        stream: direct_stream(),
                        seq: 2,
                        cid: Some(Cid::of(b"world")),
                    },
                    Mark {
                        stream: topic_stream(),
                        seq: 300,
                        cid: None,
                    },
                ],
                card: Box::new(recipient_card()),
            },
        ),
        (
            "Batch",
            Frame::Batch {
                batch: batch.into_signed(),
                payloads: Payloads(payloads),
            },
        ),
        (
            "Ack",
            Frame::Ack {
                stream: direct_stream(),
                upto: 2,
            },
        ),
        (
            "Resync",
            Frame::Resync {
                stream: direct_stream(),
                after: 1,
            },
        ),
        (
            "ResyncGap",
            Frame::ResyncGap {
                stream: topic_stream(),
                earliest_available: 300,
            },
        ),
        (
            "ResyncDone",
            Frame::ResyncDone {
                stream: direct_stream(),
                upto: 2,
            },
        ),
        ("CardQuery", Frame::CardQuery { node: author() }),
        (
            "CardAnswer",
            Frame::CardAnswer {
                node: author(),
                card: Some(Box::new(author_card())),
            },
        ),
        (
            "Agents",
            Frame::Agents {
                cards: vec![agent_card()],
            },
        ),
        (
            "StreamEnded",
            Frame::StreamEnded {
                stream: direct_stream(),
                held: 2,
            },
        ),
        (
            "Topics",
            Frame::Topics {
                topics: vec![TopicName::new("agents/planner").unwrap()],
                marks: vec![Mark {
                    stream: topic_stream(),
                    seq: 300,
                    cid: None,
                }],
                more: false,
            },
        ),
        (
            "Moves",
            Frame::Moves {
                notices: vec![agent_move()],
                more: false,
            },
        ),
        (
            "Followed",
            Frame::Followed {
                stream: direct_stream(),
                through: 2,
                agents: vec![agent_secret().public()],
            },
        ),
    ]
}

/// The fixed move notice: agent `planner` moved from the author to the
/// recipient, its first move.
pub(crate) fn agent_move() -> AgentMove {
    AgentMove::sign(
        &agent_secret(),
        agent("planner"),
        (author(), recipient()),
        1,
        CREATED_MS,
    )
}

/// The fixed agent's secret key: 32 bytes of `03`.
pub(crate) fn agent_secret() -> SecretKey {
    SecretKey::from_bytes(&[3u8; 32])
}

/// An agent name known to be valid.
pub(crate) fn agent(name: &str) -> AgentName {
    AgentName::new(name).unwrap()
}

/// The fixed card: agent `planner` of the author, online, issued at [`CREATED_MS`].
pub(crate) fn agent_card() -> AgentCard {
    AgentCard::sign(
        &agent_secret(),
        author(),
        agent("planner"),
        true,
        CREATED_MS,
    )
}

/// The id of the fixed direct stream's seq 1.
pub(crate) fn msg_id() -> MsgId {
    MsgId::derive(&author(), AUTHOR_EPOCH, &recipient(), 1)
}

/// The fixed agent message: `planner` to `coder`, "hi".
pub(crate) fn agent_envelope() -> AgentEnvelope {
    AgentEnvelope {
        id: msg_id(),
        from: agent("planner"),
        to: Some(agent("coder")),
        in_reply_to: None,
        key: None,
        body: b"hi".to_vec(),
        receipt: false,
    }
}

/// The fixed agent message asking for a read receipt.
pub(crate) fn agent_envelope_receipt() -> AgentEnvelope {
    AgentEnvelope {
        receipt: true,
        ..agent_envelope()
    }
}

/// The fixed read receipt: `planner` (the fixed agent key, hosted by the
/// author) read [`msg_id`] and one more from `coder`, at [`CREATED_MS`].
pub(crate) fn read_receipt() -> ReadReceipt {
    ReadReceipt::sign(
        &agent_secret(),
        &author(),
        (agent("planner"), agent("coder")),
        CREATED_MS,
        vec![
            msg_id(),
            MsgId::derive(&author(), AUTHOR_EPOCH, &recipient(), 2),
        ],
    )
}

/// The fixed reply: `coder` to `planner`, answering [`msg_id`], with a key.
pub(crate) fn agent_reply() -> AgentEnvelope {
    AgentEnvelope {
        id: MsgId([0xaa; 16]),
        from: agent("coder"),
        to: Some(agent("planner")),
        in_reply_to: Some(msg_id()),
        key: Some(SupersedeKey::new("k").unwrap()),
        body: b"ok".to_vec(),
        receipt: false,
    }
}

/// The fixed bounce: [`msg_id`] could not reach `coder`.
pub(crate) fn bounce() -> Bounce {
    Bounce {
        id: msg_id(),
        to: agent("planner"),
        missing: Some(agent("coder")),
        reason: BounceReason::NoSuchAgent,
    }
}

/// The fixed forward: the fixed agent message, written by the author,
/// passed on by the node its recipient moved away from.
pub(crate) fn forward() -> Forward {
    Forward {
        author: author(),
        envelope: agent_envelope().encode(),
    }
}

/// The fixed trimmed forward: arrivals 5 to 9 of the planner's previous inbox.
pub(crate) fn forward_trimmed() -> mesh_protocol::ForwardTrimmed {
    mesh_protocol::ForwardTrimmed {
        agent: agent("planner"),
        from: 5,
        to: 9,
    }
}

/// The fixed cursor: after arrival 42 in the author's journal.
pub(crate) fn cursor() -> Cursor {
    Cursor::new(&author(), AUTHOR_EPOCH, 42)
}

/// The fixed ticket: the author at one IPv4 and one IPv6 documentation address.
pub(crate) fn ticket() -> NodeTicket {
    let addrs: Vec<SocketAddr> = vec![
        "192.0.2.1:4433".parse().unwrap(),
        "[2001:db8::1]:4433".parse().unwrap(),
    ];
    NodeTicket::new(author(), addrs).unwrap()
}

/// `frame` as encode_frame writes it: length prefix and body.
pub(crate) fn encoded(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(frame, &mut out).unwrap();
    out
}

// ---- proptest strategies ----

/// Any node id (derived from arbitrary secret bytes, so always a valid key).
pub(crate) fn arb_secret() -> impl Strategy<Value = SecretKey> {
    any::<[u8; 32]>().prop_map(|b| SecretKey::from_bytes(&b))
}

/// Any node id.
pub(crate) fn arb_node() -> impl Strategy<Value = NodeId> {
    arb_secret().prop_map(|s| s.public())
}

/// Any epoch.
pub(crate) fn arb_epoch() -> impl Strategy<Value = Epoch> {
    any::<[u8; 16]>().prop_map(Epoch)
}

/// Any valid topic name.
pub(crate) fn arb_topic() -> impl Strategy<Value = TopicName> {
    "[a-z0-9._/-]{1,64}".prop_map(|s| TopicName::new(&s).unwrap())
}

/// Any channel.
pub(crate) fn arb_channel() -> impl Strategy<Value = Channel> {
    prop_oneof![
        arb_node().prop_map(Channel::Direct),
        arb_topic().prop_map(Channel::Topic)
    ]
}

/// Any stream.
pub(crate) fn arb_stream() -> impl Strategy<Value = StreamId> {
    (arb_node(), arb_epoch(), arb_channel()).prop_map(|(author, epoch, channel)| StreamId {
        author,
        epoch,
        channel,
    })
}

/// Any sequence number, biased to the edges where varints change width.
pub(crate) fn arb_seq() -> impl Strategy<Value = u64> {
    prop_oneof![0..300u64, any::<u64>(), Just(u64::MAX)]
}

/// Any envelope to sign: small payloads, arbitrary header fields.
pub(crate) fn arb_envelope() -> impl Strategy<Value = NewEnvelope> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u16>(),
        proptest::collection::vec(any::<u8>(), 0..48),
    )
        .prop_map(|(lamport, created_ms, kind, payload)| NewEnvelope {
            lamport,
            created_ms,
            kind,
            payload,
        })
}

/// Any correctly signed batch of 1 to 6 envelopes.
pub(crate) fn arb_open_batch() -> impl Strategy<Value = OpenBatch> {
    (
        arb_secret(),
        arb_epoch(),
        arb_channel(),
        1..u64::MAX / 2,
        proptest::collection::vec(arb_envelope(), 1..6),
    )
        .prop_map(|(secret, epoch, channel, first_seq, envs)| {
            OpenBatch::sign(&secret, epoch, channel, first_seq, envs).unwrap()
        })
}

/// Any valid node name.
pub(crate) fn arb_name() -> impl Strategy<Value = NodeName> {
    "[a-z0-9][a-z0-9._-]{0,62}".prop_map(|s| NodeName::new(&s).unwrap())
}

/// Any correctly signed card with 0 to 16 addresses.
pub(crate) fn arb_card() -> impl Strategy<Value = NodeCard> {
    (
        arb_secret(),
        arb_name(),
        proptest::collection::vec(arb_addr(), 0..=16),
        any::<u64>(),
    )
        .prop_map(|(secret, name, addrs, issued_ms)| {
            NodeCard::sign(&secret, name, addrs, issued_ms).unwrap()
        })
}

/// Any frame of any variant.
pub(crate) fn arb_frame() -> impl Strategy<Value = Frame> {
    let cid = proptest::option::of(any::<[u8; 32]>().prop_map(Cid));
    let mark =
        (arb_stream(), arb_seq(), cid).prop_map(|(stream, seq, cid)| Mark { stream, seq, cid });
    prop_oneof![
        (
            any::<u32>(),
            arb_node(),
            arb_epoch(),
            proptest::collection::vec(mark, 0..4),
            arb_card(),
        )
            .prop_map(|(version, node, epoch, marks, card)| Frame::Hello {
                version,
                node,
                epoch,
                marks,
                card: Box::new(card),
            }),
        arb_open_batch().prop_map(|b| {
            let (batch, payloads) = b.into_parts();
            Frame::Batch {
                batch: batch.into_signed(),
                payloads: Payloads(payloads),
            }
        }),
        (arb_stream(), arb_seq()).prop_map(|(stream, upto)| Frame::Ack { stream, upto }),
        (arb_stream(), arb_seq()).prop_map(|(stream, after)| Frame::Resync { stream, after }),
        (arb_stream(), arb_seq()).prop_map(|(stream, earliest_available)| Frame::ResyncGap {
            stream,
            earliest_available
        }),
        (arb_stream(), arb_seq()).prop_map(|(stream, upto)| Frame::ResyncDone { stream, upto }),
        arb_node().prop_map(|node| Frame::CardQuery { node }),
        (arb_node(), proptest::option::of(arb_card())).prop_map(|(node, card)| {
            Frame::CardAnswer {
                node,
                card: card.map(Box::new),
            }
        }),
        proptest::collection::vec(arb_agent_card(), 0..3).prop_map(|cards| Frame::Agents { cards }),
        (arb_stream(), arb_seq()).prop_map(|(stream, held)| Frame::StreamEnded { stream, held }),
        (
            proptest::collection::vec("[a-z0-9]{1,8}", 0..3),
            proptest::collection::vec(
                (arb_stream(), arb_seq()).prop_map(|(stream, seq)| Mark {
                    stream,
                    seq,
                    cid: None
                }),
                0..3
            ),
            any::<bool>(),
        )
            .prop_map(|(names, marks, more)| Frame::Topics {
                topics: names
                    .iter()
                    .map(|n| mesh_protocol::TopicName::new(n).unwrap())
                    .collect(),
                marks,
                more,
            }),
        (
            proptest::collection::vec(arb_agent_move(), 0..3),
            any::<bool>()
        )
            .prop_map(|(notices, more)| Frame::Moves { notices, more }),
        (
            arb_stream(),
            arb_seq(),
            proptest::collection::vec(arb_node(), 0..3)
        )
            .prop_map(|(stream, through, agents)| Frame::Followed {
                stream,
                through,
                agents
            }),
    ]
}

/// Any valid agent name.
pub(crate) fn arb_agent() -> impl Strategy<Value = AgentName> {
    "[a-z0-9._-]{1,64}".prop_map(|s| AgentName::new(&s).unwrap())
}

/// Any message id.
pub(crate) fn arb_msg_id() -> impl Strategy<Value = MsgId> {
    any::<[u8; 16]>().prop_map(MsgId)
}

/// Any correctly signed agent card.
pub(crate) fn arb_agent_card() -> impl Strategy<Value = AgentCard> {
    (
        arb_secret(),
        arb_node(),
        arb_agent(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(secret, node, name, online, issued_ms)| {
            AgentCard::sign(&secret, node, name, online, issued_ms)
        })
}

/// Any correctly signed move notice.
pub(crate) fn arb_agent_move() -> impl Strategy<Value = AgentMove> {
    (
        arb_secret(),
        arb_agent(),
        (arb_node(), arb_node()),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(secret, name, hosts, version, issued_ms)| {
            AgentMove::sign(&secret, name, hosts, version, issued_ms)
        })
}

/// Any agent envelope with a small body.
pub(crate) fn arb_agent_envelope() -> impl Strategy<Value = AgentEnvelope> {
    (
        arb_msg_id(),
        arb_agent(),
        proptest::option::of(arb_agent()),
        proptest::option::of(arb_msg_id()),
        proptest::option::of("[ -~]{1,128}"),
        proptest::collection::vec(any::<u8>(), 0..64),
        any::<bool>(),
    )
        .prop_map(
            |(id, from, to, in_reply_to, key, body, receipt)| AgentEnvelope {
                id,
                from,
                to,
                in_reply_to,
                key: key.map(|k| SupersedeKey::new(&k).unwrap()),
                body,
                receipt,
            },
        )
}

/// Any read receipt, with its signer's node and agent key.
pub(crate) fn arb_read_receipt() -> impl Strategy<Value = (ReadReceipt, NodeId, NodeId)> {
    (
        arb_secret(),
        arb_node(),
        (arb_agent(), arb_agent()),
        any::<u64>(),
        proptest::collection::btree_set(arb_msg_id(), 1..8),
    )
        .prop_map(|(secret, node, names, read_ms, ids)| {
            let r = ReadReceipt::sign(&secret, &node, names, read_ms, ids.into_iter().collect());
            (r, node, secret.public())
        })
}

/// Any bounce.
pub(crate) fn arb_bounce() -> impl Strategy<Value = Bounce> {
    (arb_msg_id(), arb_agent(), proptest::option::of(arb_agent())).prop_map(|(id, to, missing)| {
        Bounce {
            id,
            to,
            missing,
            reason: BounceReason::NoSuchAgent,
        }
    })
}

/// Any forward of any agent message.
pub(crate) fn arb_forward() -> impl Strategy<Value = Forward> {
    (arb_node(), arb_agent_envelope()).prop_map(|(author, e)| Forward {
        author,
        envelope: e.encode(),
    })
}

/// Any invite code.
pub(crate) fn arb_invite() -> impl Strategy<Value = InviteCode> {
    (
        arb_node(),
        proptest::collection::vec(arb_addr(), 0..=16),
        any::<[u8; 8]>(),
        any::<[u8; 16]>(),
    )
        .prop_map(|(inviter, addrs, id, secret)| InviteCode {
            inviter,
            addrs,
            id: InviteId(id),
            secret: InviteSecret(secret),
        })
}

/// Any socket address, v4 or v6.
pub(crate) fn arb_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((ip, port))),
    ]
}
