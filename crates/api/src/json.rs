//! The JSON shapes of the local API: requests, answers and journal entries.
//! The daemon encodes them and its clients decode the same types.

use std::net::SocketAddr;

use mesh_protocol::{Seq, StreamId};
use serde::{Deserialize, Serialize};

/// A stream in JSON: its author, the author's store epoch and its channel
/// (`direct:<node id>` or `topic:<name>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamJson {
    /// The author's node id.
    pub author: String,
    /// The author's store epoch (hex).
    pub epoch: String,
    /// `direct:<node id>` or `topic:<name>`.
    pub channel: String,
}

impl From<&StreamId> for StreamJson {
    fn from(s: &StreamId) -> Self {
        StreamJson {
            author: s.author.to_string(),
            epoch: s.epoch.to_string(),
            channel: s.channel.to_string(),
        }
    }
}

/// How a message body is written in JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BodyEncoding {
    /// UTF-8 text, as is.
    #[default]
    Text,
    /// Standard base64 (with padding) of the bytes.
    Base64,
}

impl BodyEncoding {
    /// Encodes `bytes` as text when they are UTF-8, else as base64.
    pub fn encode(bytes: &[u8]) -> (BodyEncoding, String) {
        match std::str::from_utf8(bytes) {
            Ok(s) => (BodyEncoding::Text, s.to_owned()),
            Err(_) => (BodyEncoding::Base64, data_encoding::BASE64.encode(bytes)),
        }
    }

    /// Decodes `body` written in this encoding.
    pub fn decode(self, body: String) -> Result<Vec<u8>, String> {
        match self {
            BodyEncoding::Text => Ok(body.into_bytes()),
            BodyEncoding::Base64 => data_encoding::BASE64
                .decode(body.as_bytes())
                .map_err(|e| format!("body is not valid base64: {e}")),
        }
    }
}

/// One journal entry as `GET /v1/events` and `GET /v1/subscribe` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventEntry {
    /// The cursor just after this entry: `after=` this resumes past it.
    pub cursor: String,
    /// The entry's local arrival position.
    pub arrival: u64,
    /// What the entry is.
    #[serde(flatten)]
    pub record: EventRecord,
    /// Set on a live entry when a subscriber lag before it could not be
    /// recorded durably.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub losses_unrecorded: bool,
}

/// An agent message in the node's journal, as its envelope says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentMessageJson {
    /// The message id.
    pub id: String,
    /// `AGENT@NODE`: the sending agent, on the stream's author.
    pub from: String,
    /// `AGENT@NODE`: the recipient agent, on the stream's recipient (absent
    /// for a message to the node's own journal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The message it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// How `body` is written: UTF-8 `text` when valid, else `base64`.
    pub encoding: BodyEncoding,
    /// The message's body.
    pub body: String,
}

/// The content of a journal entry; `kind` tells which.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventRecord {
    /// A message this node sent or received.
    Envelope {
        /// Its stream.
        stream: StreamJson,
        /// Its seq in the stream.
        seq: Seq,
        /// The author's Lamport clock.
        lamport: u64,
        /// The author's wall clock, ms since the Unix epoch.
        created_ms: u64,
        /// Application-defined kind.
        msg_kind: u16,
        /// How `body` is written: UTF-8 `text` when valid, else `base64`.
        encoding: BodyEncoding,
        /// The payload.
        body: String,
        /// An agent message (`msg_kind` 1) read out of its envelope in
        /// `body`: absent for other kinds, and for one that does not decode.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<AgentMessageJson>,
    },
    /// This node can never have `from..=to` of `stream`: the author no longer holds it.
    Gap {
        /// The stream.
        stream: StreamJson,
        /// First missing seq.
        from: Seq,
        /// Last missing seq.
        to: Seq,
    },
    /// Envelopes `from..=to` of `stream` were given up (`outbox_evicted`).
    Loss {
        /// The stream.
        stream: StreamJson,
        /// First seq concerned.
        from: Seq,
        /// Last seq concerned.
        to: Seq,
        /// Why: `outbox_evicted`.
        reason: String,
        /// Free text for a person.
        detail: String,
    },
    /// A live subscriber stopped reading: the journal entries at arrivals
    /// `from..=to` were not delivered to it live. They are still in the
    /// journal; `resume` is the cursor to re-read them from.
    Lagged {
        /// Who lagged, for a person.
        subscriber: String,
        /// First arrival not delivered live.
        from: u64,
        /// Last arrival not delivered live.
        to: u64,
        /// `GET /v1/events?after=` this to re-read them.
        resume: String,
        /// Free text for a person.
        detail: String,
    },
    /// Local sends to `to` were held while the store could not commit them,
    /// past the hold bound, and let go: their senders were answered 503,
    /// and none of them was written or sent.
    Lost {
        /// The recipient node.
        to: String,
        /// How many sends.
        msgs: u64,
        /// Their payload bytes.
        bytes: u64,
        /// When the first was taken, ms since the Unix epoch.
        first_ms: u64,
        /// When the last was taken.
        last_ms: u64,
        /// Free text for a person.
        detail: String,
    },
    /// The author of `stream` started a new store epoch: this node holds the
    /// stream up to `last`, and nothing later of it can ever arrive.
    EpochEnded {
        /// The ended stream.
        stream: StreamJson,
        /// The last seq this node holds.
        last: Seq,
        /// Free text for a person.
        detail: String,
    },
    /// The author's store of `stream` went back in time (a restored backup,
    /// or a copy run as a second node): seqs `from..=to` are what was seen
    /// of the stream but its author's store lost, or holds others under.
    RolledBack {
        /// The stream.
        stream: StreamJson,
        /// First seq concerned.
        from: Seq,
        /// Last seq concerned.
        to: Seq,
        /// Free text for a person.
        detail: String,
    },
    /// A batch of `stream` came with another envelope at `seq` than the one
    /// held here: two writers used one stream and seq. It was not taken.
    Conflict {
        /// The stream.
        stream: StreamJson,
        /// The seq.
        seq: Seq,
        /// The payload hash held here (hex).
        ours: String,
        /// The payload hash the batch carried (hex).
        theirs: String,
        /// Free text for a person.
        detail: String,
    },
    /// The journal's entries at arrivals `from..=to` were trimmed by
    /// retention (`[journal] max_bytes`, `max_age`): a read from before
    /// the retained range gets this first, never a silent skip.
    Trimmed {
        /// First trimmed arrival asked for.
        from: u64,
        /// Last trimmed arrival.
        to: u64,
        /// How many entries (arrivals are dense: `to - from + 1`).
        entries: u64,
        /// Free text for a person.
        detail: String,
    },
    /// The drain of `agent`, which moved to `to`, ended: what came for it
    /// here up to this entry was passed on to `to`; what comes later is
    /// bounced to its sender.
    DrainEnded {
        /// The agent's name.
        agent: String,
        /// Its host now.
        to: String,
        /// Free text for a person.
        detail: String,
    },
    /// An entry of a kind this build does not know.
    Other {},
}

/// A page of the journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsPage {
    /// The entries, in arrival order.
    pub entries: Vec<EventEntry>,
    /// The cursor to pass as `after` for the next page: the last entry's, or
    /// the request's when the page is empty.
    pub next: String,
}

/// The `lagged` event of a live subscription.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaggedEvent {
    /// Re-read the journal from here (`GET /v1/events?after=`) to get what was skipped.
    pub resume: String,
    /// First arrival not delivered live.
    pub skipped_from: u64,
    /// Last arrival not delivered live; the stream goes on after it.
    pub skipped_to: u64,
    /// Whether the durable loss record was written.
    pub loss_recorded: bool,
}

/// `POST /v1/send` (and each item of `POST /v1/send/batch`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    /// The recipient's node id.
    pub to: String,
    /// The message.
    pub body: String,
    /// How `body` is written: `text` (default) or `base64`.
    #[serde(default)]
    pub encoding: BodyEncoding,
    /// Application-defined kind (default 0; 1 to 15 are the mesh's own).
    #[serde(default)]
    pub msg_kind: u16,
    /// An id chosen by the sender: a retry with the same id within the
    /// node's dedup window gets the first send's answer, and nothing is
    /// sent again (1 to 128 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

/// The answer to a send: the message is committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendResponse {
    /// The message's journal cursor on this node (as in `/v1/events`).
    pub id: String,
    /// Its stream.
    pub stream: StreamJson,
    /// Its seq in the stream.
    pub seq: Seq,
}

/// The answer to a JSON-array batch send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse {
    /// One answer per message, in request order.
    pub sent: Vec<SendResponse>,
}

/// `PUT /v1/cursors/{name}` and the answer of `GET`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CursorBody {
    /// The cursor.
    pub cursor: String,
}

/// `POST /v1/peers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddPeerRequest {
    /// The peer's ticket, as printed by `mesh ticket`.
    pub ticket: String,
}

/// `GET /v1/ticket`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketResponse {
    /// The ticket.
    pub ticket: String,
}

/// The node's state as `GET /v1/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This node's id.
    pub node: String,
    /// Its name (`[node] name`, default the host's name).
    #[serde(default)]
    pub name: String,
    /// This node's store epoch (hex).
    pub epoch: String,
    /// Addresses it listens on for peers.
    pub addrs: Vec<SocketAddr>,
    /// A ticket other nodes can add.
    pub ticket: String,
    /// Every known peer.
    pub peers: Vec<PeerStatus>,
    /// The store file's size in bytes, if known.
    pub store_bytes: Option<u64>,
    /// The journal's retained range and size (absent from older daemons).
    #[serde(default)]
    pub journal: Option<JournalStatus>,
    /// Why the store cannot commit now, if it cannot (local sends are held
    /// meanwhile, up to `[store] hold_ms`).
    #[serde(default)]
    pub store_down: Option<String>,
}

/// The journal's retained range and size, in `GET /v1/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalStatus {
    /// The first retained arrival (`head + 1` when nothing is retained).
    pub first: u64,
    /// The last arrival written.
    pub head: u64,
    /// The bytes its rows take in the store.
    pub bytes: u64,
    /// The most bytes its rows may take (`[journal] max_bytes`; absent
    /// from older daemons): retention trims the oldest rows past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// The whole answer of `GET /v1/status`: the node, and what the API adds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// The node.
    #[serde(flatten)]
    pub node: NodeStatus,
    /// The last journal arrival committed.
    pub journal_head: u64,
    /// Live subscriptions open now.
    pub subscribers: u64,
    /// The process serving the socket, so a local tool (`mesh bench peer`)
    /// can read its memory and CPU from `/proc`.
    pub pid: u32,
    /// This node's agents and their unread mail (absent from older
    /// daemons' answers).
    #[serde(default)]
    pub agents: Vec<crate::LocalAgentStatus>,
}

/// One peer as `GET /v1/peers` and `GET /v1/status` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// The peer's id.
    pub node: String,
    /// Its name, from its newest card, if one came.
    #[serde(default)]
    pub name: Option<String>,
    /// Addresses this node dials it at: where its newest card says it
    /// listens (learned from its Hello or from another peer), or the
    /// addresses it was added with before any card came.
    pub addrs: Vec<SocketAddr>,
    /// When the peer issued its newest card held here (ms since the Unix
    /// epoch, by its clock), if one came.
    #[serde(default)]
    pub card_issued_ms: Option<u64>,
    /// Whether a connection is up now.
    pub connected: bool,
    /// The peer's store epoch as last seen (hex), if any.
    pub epoch: Option<String>,
    /// This node's receive marks for the peer's streams.
    pub marks: Vec<StreamMark>,
    /// Envelopes queued for the peer (unacknowledged, in the outbox).
    pub queued_msgs: u64,
    /// Payload bytes in the peer's outbox.
    pub outbox_bytes: u64,
    /// When the oldest message still queued for the peer was written (ms
    /// since the Unix epoch, this node's clock); only in `GET /v1/status`,
    /// absent when nothing of this node's own stream is queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_queued_ms: Option<u64>,
    /// Whether the link to it is paused (`mesh peer pause`); absent means no.
    #[serde(default)]
    pub paused: bool,
    /// This node's local alias for it (`mesh peer name`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// The last identity conflict seen on the link: two live processes run
    /// with one node key (a copied data dir run twice); absent means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_conflict: Option<String>,
    /// Why its last connection was refused for speaking another protocol
    /// version (by either side), until a connection is live again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// The answer of `GET /v1/peers`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeersResponse {
    /// Every known peer.
    pub peers: Vec<PeerStatus>,
}

/// A receive mark: every envelope of `stream` up to `mark` is committed here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamMark {
    /// The stream.
    pub stream: StreamJson,
    /// The mark.
    pub mark: Seq,
}

/// `POST /v1/invites`: make an invite.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviteRequest {
    /// How many nodes may join with it (default 1).
    #[serde(default)]
    pub uses: Option<u32>,
    /// How long it is good for, in ms (default one hour).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// An invite as `GET /v1/invites` shows it (never its secret).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteJson {
    /// Its id (16 hex digits), for `mesh invite revoke`.
    pub id: String,
    /// `open`, `claimed` (a node is joining with it now), `spent`,
    /// `expired` or `revoked`.
    pub state: String,
    /// How many nodes may join with it.
    pub uses: u32,
    /// How many still may.
    pub uses_left: u32,
    /// When it was made (ms since the Unix epoch).
    pub created_ms: u64,
    /// When it expires (ms since the Unix epoch).
    pub expires_ms: u64,
    /// The node it is claimed for, while claimed.
    pub claimed_by: Option<String>,
    /// Until when that claim holds (ms since the Unix epoch).
    pub claimed_until_ms: Option<u64>,
    /// The nodes that joined with it.
    pub joined: Vec<String>,
}

/// The answer of `POST /v1/invites`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteResponse {
    /// The code to hand to the new node's `mesh join` (it holds the secret:
    /// shown once, never stored).
    pub code: String,
    /// The invite.
    pub invite: InviteJson,
}

/// The answer of `GET /v1/invites`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvitesResponse {
    /// Every invite this node made, by id.
    pub invites: Vec<InviteJson>,
}

/// `POST /v1/join`: join the mesh of an invite's inviter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinBody {
    /// The invite code, as `mesh invite` printed it.
    pub code: String,
}

/// The answer of `POST /v1/join`: the inviter, now a peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinResponse {
    /// The inviter's node id.
    pub inviter: String,
    /// Its name.
    pub name: String,
    /// Where it listens, from its card.
    pub addrs: Vec<SocketAddr>,
}

/// A node on the LAN that is not a peer, as `GET /v1/peers/nearby` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NearbyJson {
    /// Its node id.
    pub node: String,
    /// The name it announces, if any.
    pub name: Option<String>,
    /// Where it announces it listens.
    pub addrs: Vec<SocketAddr>,
}

/// The answer of `GET /v1/peers/nearby`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NearbyResponse {
    /// Nodes mDNS found on the LAN that are not peers (never added by being
    /// found: invite one to make it a peer).
    pub nearby: Vec<NearbyJson>,
}

/// `POST /v1/topics`: join a topic (or change its bounds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinTopicRequest {
    /// The topic: 1 to 64 bytes of `[a-z0-9._/-]`.
    pub name: String,
    /// The most messages held of each author's stream of it (default
    /// `TOPIC_MAX_MSGS_DEFAULT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_msgs: Option<u64>,
    /// The most payload bytes held of each author's stream of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// `POST /v1/topics/{name}/publish`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// The message.
    pub body: String,
    /// How `body` is written: `text` (default) or `base64`.
    #[serde(default)]
    pub encoding: BodyEncoding,
    /// Application-defined kind (default 0; 1 to 15 are the mesh's own).
    #[serde(default)]
    pub msg_kind: u16,
}

/// One author stream of a topic, in a [`TopicJson`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicStreamJson {
    /// The stream.
    pub stream: StreamJson,
    /// Every message of it up to this seq is in this node's journal.
    pub mark: Seq,
    /// Messages of it this node holds to relay to members that lack them.
    pub held_msgs: u64,
    /// Their payload bytes.
    pub held_bytes: u64,
    /// The first seq held (members behind it get a gap from this node).
    pub first_held: Seq,
}

/// A topic this node is a member of, in `GET /v1/topics`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicJson {
    /// The topic.
    pub name: String,
    /// When this node joined it (ms since the Unix epoch).
    pub joined_ms: u64,
    /// The most messages held of each author's stream.
    pub max_msgs: u64,
    /// The most payload bytes held of each author's stream.
    pub max_bytes: u64,
    /// The live peers that said they are members.
    pub members: Vec<String>,
    /// Every author stream of it this node holds or receives.
    pub streams: Vec<TopicStreamJson>,
}

/// `GET /v1/topics`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicsResponse {
    /// The topics this node is a member of, by name.
    pub topics: Vec<TopicJson>,
}

/// The answer of `POST /v1/web`: where the dashboard is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebResponse {
    /// The page's URL, with this start's token (give it to no one who
    /// should not see the node).
    pub url: String,
    /// The address it listens on.
    pub listen: SocketAddr,
}
