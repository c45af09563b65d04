//! The history checker: from the workload's history and every receiver's
//! journal, count what the mesh promised and broke.
//!
//! A message is either sent to one node (`invoke`) or published to a topic
//! (`publish`). Every node with a journal is taken to be a member of every
//! topic published to, so a published message is for every such node but
//! its author, on the author's stream of the topic (`topic:NAME`); a sent
//! one is for its one receiver, on its author's `direct:R` stream.
//!
//! Per receiver R, the messages delivered to R are the envelopes in R's
//! journal written by another node. The counts:
//! - **lost**: acknowledged (`ok` in the history) for R, never delivered to
//!   R, and not inside a gap record R holds for that stream;
//! - **unexpected**: delivered to R but never invoked for R (a body the
//!   workload never wrote, a message sent to another node, a sent message on
//!   a topic stream or a published one on a direct stream);
//! - **duplicated**: a (stream, seq) or a message delivered more than once;
//! - **reordered**: per stream, delivered after a higher seq of that stream;
//! - **gap records** (and the seqs they cover) — allowed, and counted.
//!
//! And four more that a correct mesh also keeps at zero:
//! - **holes**: a seq below a delivered one that is neither delivered nor
//!   covered by a gap record (a silent skip, whatever the history says);
//! - **misplaced**: delivered at another (stream, seq) than the `ok` said;
//! - **phantom**: the send was answered `fail` yet the message arrived;
//! - **unexplained gap seqs**: seqs inside a receiver's gap record that the
//!   author's journal does not record as evicted (`loss`, `outbox_evicted`).
//!   An author evicts unacknowledged envelopes only with such a record, and
//!   acknowledged ones only after the receiver committed them, so a gap
//!   over anything else means something was acknowledged before it was
//!   durable. A topic stream has no acks: its author records every seq its
//!   bound evicts, and with one bound at every member a relay has dropped
//!   only seqs the author already evicted, so a topic gap is explained the
//!   same way. (This holds while no node loses its store, as in these runs.)
//!
//! A run passes only if all of these except gaps are zero. `unknown` sends
//! may or may not arrive; they are counted for information. Envelopes of
//! the mesh's own kinds (agent messages, forwards, bounces) take seqs of the
//! streams like any other, so they count for holes, duplicates and order,
//! but what they carry is judged per agent:
//!
//! Per agent A (an `agent_send` to A), over every `agent_read` of A's inbox
//! at whichever host it was read:
//! - **lost**: answered `ok`, never read, and neither given up by its
//!   sending node with a record (an `outbox_evicted` loss record over the
//!   seq it was answered with: its sender was told, in its inbox) nor
//!   bounced (a bounce naming its id in a journal: a host the agent had
//!   left, whose drain had ended, sent it back to its sender);
//! - **duplicated**: read more than once (at one host or across hosts);
//! - **unexpected**: read, but never sent to A (a body the workload never
//!   wrote, or a message for another agent), or read under another message
//!   id than its send was answered with;
//! - **phantom**: answered `fail`, read all the same;
//! - **forward evicted** (counted, allowed, but worth a person's look): never
//!   read, but passed on by a host the agent had left, and that forward was
//!   given up under `evict-oldest` with the forwarder's `outbox_evicted`
//!   record (its new host holds a gap record for it): the node journals say
//!   so, the agent's inbox does not;
//! - **bounced and read**: read, and bounced to its sender as well.
//!
//! `unknown` agent sends may be read once or not at all.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use mesh_api::{EventEntry, EventRecord, StreamJson};
use mesh_protocol::Seq;
use serde::Serialize;

use crate::history::{Op, parse_body};

/// Examples kept per kind of problem, for a person to start from.
pub const EXAMPLES_MAX: usize = 10;

/// What the checker counted for one receiver, or in total.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Messages acknowledged for this receiver (sent to it or published).
    pub acked: u64,
    /// Of them, published to a topic.
    pub topic_acked: u64,
    /// Envelopes from other nodes in the receiver's journal.
    pub delivered: u64,
    /// Of them, on topic streams.
    pub topic_delivered: u64,
    /// Acknowledged, not delivered, not covered by a gap.
    pub lost: u64,
    /// Delivered but never sent to this receiver.
    pub unexpected: u64,
    /// Delivered more than once.
    pub duplicated: u64,
    /// Delivered after a higher seq of the same stream.
    pub reordered: u64,
    /// Gap records in the receiver's journal.
    pub gap_records: u64,
    /// Of them, of topic streams.
    pub topic_gap_records: u64,
    /// Seqs the gap records cover.
    pub gap_seqs: u64,
    /// Acknowledged messages not delivered because a gap record covers them.
    pub gap_covered: u64,
    /// Of them, published to a topic.
    pub topic_gap_covered: u64,
    /// Seqs below a delivered one, neither delivered nor covered by a gap.
    pub holes: u64,
    /// Delivered at another (stream, seq) than the one acknowledged.
    pub misplaced: u64,
    /// Answered `fail`, delivered all the same.
    pub phantom: u64,
    /// Seqs in gap records that the author never recorded as evicted.
    pub gap_unexplained: u64,
    /// `unknown` sends that were delivered.
    pub unknown_delivered: u64,
    /// `unknown` sends that were not.
    pub unknown_missing: u64,
    /// Envelopes from other nodes of the mesh's own kinds (agent messages,
    /// forwards, bounces): their seqs count here, their messages per agent.
    pub mesh_kind: u64,
}

impl Counts {
    /// Whether nothing that breaks a guarantee was counted.
    pub fn clean(&self) -> bool {
        self.lost == 0
            && self.unexpected == 0
            && self.duplicated == 0
            && self.reordered == 0
            && self.holes == 0
            && self.misplaced == 0
            && self.phantom == 0
            && self.gap_unexplained == 0
    }

    fn add(&mut self, o: &Counts) {
        self.acked += o.acked;
        self.topic_acked += o.topic_acked;
        self.delivered += o.delivered;
        self.topic_delivered += o.topic_delivered;
        self.lost += o.lost;
        self.unexpected += o.unexpected;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.gap_records += o.gap_records;
        self.topic_gap_records += o.topic_gap_records;
        self.gap_seqs += o.gap_seqs;
        self.gap_covered += o.gap_covered;
        self.topic_gap_covered += o.topic_gap_covered;
        self.holes += o.holes;
        self.misplaced += o.misplaced;
        self.phantom += o.phantom;
        self.gap_unexplained += o.gap_unexplained;
        self.unknown_delivered += o.unknown_delivered;
        self.unknown_missing += o.unknown_missing;
        self.mesh_kind += o.mesh_kind;
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lost={} unexpected={} duplicated={} reordered={} gaps={} (topic {}, seqs {}, \
             acked covered {} (topic {}), unexplained {}) holes={} misplaced={} phantom={} | \
             acked={} (topic {}) delivered={} (topic {}) unknown delivered={} missing={}",
            self.lost,
            self.unexpected,
            self.duplicated,
            self.reordered,
            self.gap_records,
            self.topic_gap_records,
            self.gap_seqs,
            self.gap_covered,
            self.topic_gap_covered,
            self.gap_unexplained,
            self.holes,
            self.misplaced,
            self.phantom,
            self.acked,
            self.topic_acked,
            self.delivered,
            self.topic_delivered,
            self.unknown_delivered,
            self.unknown_missing
        )
    }
}

/// What the checker counted for one agent's messages, or in total.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgentCounts {
    /// Agent sends to it answered `ok`.
    pub acked: u64,
    /// Of them, read (once or more).
    pub read: u64,
    /// Of them, read after a host the agent left passed them on (the
    /// entry says `forwarded_by`).
    pub read_forwarded: u64,
    /// Answered `ok`, never read, given up with a record its sender got.
    pub evicted: u64,
    /// Answered `ok`, never read, bounced to its sender.
    pub bounced: u64,
    /// Read, and bounced to its sender too.
    pub bounced_read: u64,
    /// Answered `ok`, never read, passed on by a host the agent left as a
    /// forward that host then evicted with a record (its node journal says
    /// so; neither the agent nor its sender is told): a loss.
    pub forward_evicted: u64,
    /// Answered `ok`, never read, nothing says why.
    pub lost: u64,
    /// Reads beyond the first of one message.
    pub duplicated: u64,
    /// Read, never sent to this agent (or under another id).
    pub unexpected: u64,
    /// Answered `fail`, read all the same.
    pub phantom: u64,
    /// `unknown` sends that were read.
    pub unknown_read: u64,
    /// `unknown` sends that were not.
    pub unknown_missing: u64,
}

impl AgentCounts {
    /// Whether nothing that breaks a guarantee was counted.
    pub fn clean(&self) -> bool {
        self.lost == 0
            && self.forward_evicted == 0
            && self.duplicated == 0
            && self.unexpected == 0
            && self.phantom == 0
            && self.bounced_read == 0
    }

    fn add(&mut self, o: &AgentCounts) {
        self.acked += o.acked;
        self.read += o.read;
        self.read_forwarded += o.read_forwarded;
        self.evicted += o.evicted;
        self.bounced += o.bounced;
        self.bounced_read += o.bounced_read;
        self.forward_evicted += o.forward_evicted;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.unexpected += o.unexpected;
        self.phantom += o.phantom;
        self.unknown_read += o.unknown_read;
        self.unknown_missing += o.unknown_missing;
    }
}

impl fmt::Display for AgentCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lost={} duplicated={} unexpected={} phantom={} bounced and read={} | acked={} \
             read={} (passed on {}) sender told: evicted={} bounced={} | forward evicted \
             (agent not told)={} | unknown read={} missing={}",
            self.lost,
            self.duplicated,
            self.unexpected,
            self.phantom,
            self.bounced_read,
            self.acked,
            self.read,
            self.read_forwarded,
            self.evicted,
            self.bounced,
            self.forward_evicted,
            self.unknown_read,
            self.unknown_missing
        )
    }
}

/// The checker's verdict.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Counts per receiver node id.
    pub per_receiver: BTreeMap<String, Counts>,
    /// The sum over receivers.
    pub total: Counts,
    /// Messages invoked (sent or published), and how they ended.
    pub invoked: u64,
    /// Messages answered `ok`.
    pub ok: u64,
    /// Messages answered `fail`.
    pub failed: u64,
    /// Messages with no answer.
    pub unknown: u64,
    /// Invoked messages the history has no outcome for (the run was cut short).
    pub unfinished: u64,
    /// Of the messages, those published to a topic, and how they ended.
    pub published: Outcomes,
    /// Agent sends (not among the messages above), and how they ended.
    pub agent_sends: Outcomes,
    /// Agent counts per recipient agent name.
    pub per_agent: BTreeMap<String, AgentCounts>,
    /// The sum over agents.
    pub agent_total: AgentCounts,
    /// Inbox reads and moves of the roaming agents the history records.
    pub agent_reads: u64,
    /// Moves whose import answered.
    pub agent_moves: u64,
    /// A few examples of each problem, for a person.
    pub examples: Vec<String>,
}

/// How the publishes of a history ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Outcomes {
    /// Invoked.
    pub invoked: u64,
    /// Answered `ok`.
    pub ok: u64,
    /// Answered `fail`.
    pub failed: u64,
    /// With no answer.
    pub unknown: u64,
    /// With no outcome in the history.
    pub unfinished: u64,
}

impl Summary {
    /// Whether the run kept every guarantee.
    pub fn passed(&self) -> bool {
        self.total.clean() && self.agent_total.clean()
    }
}

/// A stream as a hashable key.
type StreamKey = (String, String, String);

fn key(s: &StreamJson) -> StreamKey {
    (s.author.clone(), s.epoch.clone(), s.channel.clone())
}

/// How a send ended.
#[derive(Clone, Debug)]
enum Outcome {
    Pending,
    Ok(StreamKey, Seq),
    Fail,
    Unknown,
}

/// Whom a message is for.
#[derive(Clone, Debug)]
enum Target {
    /// The one node it was sent to.
    Node(String),
    /// Every member of `topic` but `author`, the node that published it.
    Topic { topic: String, author: String },
}

#[derive(Clone, Debug)]
struct Sent {
    target: Target,
    outcome: Outcome,
}

impl Sent {
    /// Whether it is for receiver `r`.
    fn is_for(&self, r: &str) -> bool {
        match &self.target {
            Target::Node(to) => to == r,
            Target::Topic { author, .. } => author != r,
        }
    }

    /// Whether `stream` is one it may arrive on at receiver `r`.
    fn may_arrive_on(&self, r: &str, stream: &StreamJson) -> bool {
        match &self.target {
            Target::Node(to) => stream.channel.strip_prefix("direct:") == Some(to) && to == r,
            Target::Topic { topic, author } => {
                stream.channel.strip_prefix("topic:") == Some(topic) && &stream.author == author
            }
        }
    }

    /// For an example: whom it was for.
    fn describe(&self) -> String {
        match &self.target {
            Target::Node(to) => format!("sent to {to}"),
            Target::Topic { topic, author } => format!("published to topic {topic} by {author}"),
        }
    }

    fn is_topic(&self) -> bool {
        matches!(self.target, Target::Topic { .. })
    }
}

fn is_topic(stream: &StreamJson) -> bool {
    stream.channel.starts_with("topic:")
}

/// Checks `ops` (the whole history) against `journals` (each node's whole
/// journal, by node id). Every node id that is a send's target must have a
/// journal; a missing one counts all its acknowledged sends as lost. Every
/// node with a journal is taken to be a member of every topic published to.
pub fn check(ops: &[Op], journals: &BTreeMap<String, Vec<EventEntry>>) -> Summary {
    let mut summary = Summary::default();
    let mut sends: HashMap<(u32, u64), Sent> = HashMap::new();
    let mut examples: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut example = |kind: &'static str, text: String| {
        let list = examples.entry(kind).or_default();
        if list.len() < EXAMPLES_MAX {
            list.push(format!("{kind}: {text}"));
        }
    };
    let mut agent_sends: HashMap<(u32, u64), AgentSent> = HashMap::new();
    for op in ops {
        let Some(message) = op.message() else {
            match op {
                Op::AgentRead { .. } => summary.agent_reads += 1,
                Op::AgentMove { outcome, .. } if outcome == "moved" => summary.agent_moves += 1,
                _ => {}
            }
            continue;
        };
        if let Op::AgentSend { to_agent, .. } = op {
            summary.agent_sends.invoked += 1;
            agent_sends.insert(
                message,
                AgentSent {
                    to_agent: to_agent.clone(),
                    outcome: AgentOutcome::Pending,
                },
            );
            continue;
        }
        if let Some(a) = agent_sends.get_mut(&message) {
            let (outcome, count) = match op {
                Op::Ok {
                    stream, seq, id, ..
                } => (
                    AgentOutcome::Ok {
                        stream: key(stream),
                        seq: *seq,
                        id: id.clone().unwrap_or_default(),
                    },
                    &mut summary.agent_sends.ok,
                ),
                Op::Fail { .. } => (AgentOutcome::Fail, &mut summary.agent_sends.failed),
                _ => (AgentOutcome::Unknown, &mut summary.agent_sends.unknown),
            };
            *count += 1;
            a.outcome = outcome;
            continue;
        }
        let target = match op {
            Op::Invoke { to_id, .. } => Some(Target::Node(to_id.clone())),
            Op::Publish { from_id, topic, .. } => Some(Target::Topic {
                topic: topic.clone(),
                author: from_id.clone(),
            }),
            _ => None,
        };
        if let Some(target) = target {
            summary.invoked += 1;
            let sent = Sent {
                target,
                outcome: Outcome::Pending,
            };
            if sent.is_topic() {
                summary.published.invoked += 1;
            }
            sends.insert(message, sent);
            continue;
        }
        let sent = sends.get_mut(&message);
        let published = sent.as_ref().is_some_and(|s| s.is_topic());
        let (outcome, all, of_published) = match op {
            Op::Ok { stream, seq, .. } => (
                Outcome::Ok(key(stream), *seq),
                &mut summary.ok,
                &mut summary.published.ok,
            ),
            Op::Fail { .. } => (
                Outcome::Fail,
                &mut summary.failed,
                &mut summary.published.failed,
            ),
            _ => (
                Outcome::Unknown,
                &mut summary.unknown,
                &mut summary.published.unknown,
            ),
        };
        *all += 1;
        if published {
            *of_published += 1;
        }
        if let Some(s) = sent {
            s.outcome = outcome;
        }
    }
    for s in sends.values() {
        if matches!(s.outcome, Outcome::Pending) {
            summary.unfinished += 1;
            if s.is_topic() {
                summary.published.unfinished += 1;
            }
        }
    }

    let mut receivers: Vec<&String> = journals.keys().collect();
    for s in sends.values() {
        if let Target::Node(to) = &s.target
            && !receivers.contains(&to)
        {
            receivers.push(to);
        }
    }
    // What each author recorded as evicted from its outboxes.
    let mut evicted: Evicted = HashMap::new();
    for (author, journal) in journals {
        for e in journal {
            if let EventRecord::Loss {
                stream,
                from,
                to,
                reason,
                ..
            } = &e.record
                && reason == "outbox_evicted"
                && &stream.author == author
            {
                evicted.entry(key(stream)).or_default().push((*from, *to));
            }
        }
    }
    let empty = Vec::new();
    for r in receivers {
        let journal = journals.get(r).unwrap_or(&empty);
        let counts = check_receiver(r, journal, &sends, &evicted, &mut example);
        summary.total.add(&counts);
        summary.per_receiver.insert(r.clone(), counts);
    }
    summary.agent_sends.unfinished = agent_sends
        .values()
        .filter(|a| matches!(a.outcome, AgentOutcome::Pending))
        .count() as u64;
    let records = AgentRecords {
        evicted: &evicted,
        bounced: bounced_ids(journals),
        forward_evicted: forward_evicted_ids(journals, &evicted),
    };
    summary.per_agent = check_agents(ops, &agent_sends, &records, &mut example);
    for c in summary.per_agent.values() {
        summary.agent_total.add(c);
    }
    summary.examples = examples.into_values().flatten().collect();
    summary
}

/// How an agent send ended.
#[derive(Clone, Debug)]
enum AgentOutcome {
    Pending,
    Ok {
        stream: StreamKey,
        seq: Seq,
        id: String,
    },
    Fail,
    Unknown,
}

#[derive(Clone, Debug)]
struct AgentSent {
    to_agent: String,
    outcome: AgentOutcome,
}

/// The ids of the agent messages the bounces in `journals` send back.
fn bounced_ids(journals: &BTreeMap<String, Vec<EventEntry>>) -> HashSet<String> {
    let mut ids = HashSet::new();
    for e in journals.values().flatten() {
        if let EventRecord::Envelope {
            msg_kind,
            encoding,
            body,
            ..
        } = &e.record
            && *msg_kind == mesh_protocol::KIND_BOUNCE
            && let Ok(bytes) = encoding.decode(body.clone())
            && let Ok(b) = mesh_protocol::Bounce::decode(&bytes)
        {
            ids.insert(b.id.to_string());
        }
    }
    ids
}

/// The ids of the agent messages passed on in forwards that their
/// forwarder (the forward's author) recorded as evicted (`evicted`).
fn forward_evicted_ids(
    journals: &BTreeMap<String, Vec<EventEntry>>,
    evicted: &Evicted,
) -> HashSet<String> {
    let mut ids = HashSet::new();
    for (node, journal) in journals {
        for e in journal {
            if let EventRecord::Envelope {
                stream,
                seq,
                msg_kind,
                encoding,
                body,
                ..
            } = &e.record
                && *msg_kind == mesh_protocol::KIND_FORWARD
                && &stream.author == node
                && evicted
                    .get(&key(stream))
                    .is_some_and(|r| r.iter().any(|&(lo, hi)| lo <= *seq && *seq <= hi))
                && let Ok(bytes) = encoding.decode(body.clone())
                && let Ok(f) = mesh_protocol::Forward::decode(&bytes)
                && let Ok(m) = mesh_protocol::AgentEnvelope::decode(&f.envelope)
            {
                ids.insert(m.id.to_string());
            }
        }
    }
    ids
}

/// What the journals record of agent sends that were not delivered.
struct AgentRecords<'a> {
    /// Per stream, the seqs its author evicted.
    evicted: &'a Evicted,
    /// The ids of bounced messages.
    bounced: HashSet<String>,
    /// The ids of messages whose forward was evicted.
    forward_evicted: HashSet<String>,
}

/// Judges every agent send against every read of its recipient's inbox
/// (and `records`); answers the counts per recipient agent.
fn check_agents(
    ops: &[Op],
    sends: &HashMap<(u32, u64), AgentSent>,
    records: &AgentRecords<'_>,
    example: &mut impl FnMut(&'static str, String),
) -> BTreeMap<String, AgentCounts> {
    let mut per: BTreeMap<String, AgentCounts> = BTreeMap::new();
    for s in sends.values() {
        per.entry(s.to_agent.clone()).or_default();
    }
    // Message -> (reads, read through a host it left).
    let mut reads: HashMap<(u32, u64), (u64, bool)> = HashMap::new();
    for op in ops {
        let Op::AgentRead {
            node,
            agent,
            entries,
            ..
        } = op
        else {
            continue;
        };
        let n = per.entry(agent.clone()).or_default();
        for e in entries {
            let at = format!("{agent} at node {node}, arrival {}", e.arrival);
            let msg = parse_body(&e.body);
            let Some((m, sent)) = msg.and_then(|m| sends.get(&m).map(|s| (m, s))) else {
                n.unexpected += 1;
                example(
                    "agent unexpected",
                    format!("{at}: body {:?} was never sent", e.body),
                );
                continue;
            };
            if &sent.to_agent != agent {
                n.unexpected += 1;
                example(
                    "agent unexpected",
                    format!("{at}: message {m:?} was sent to {}", sent.to_agent),
                );
                continue;
            }
            if let AgentOutcome::Ok { id, .. } = &sent.outcome
                && id != &e.id
            {
                n.unexpected += 1;
                example(
                    "agent unexpected",
                    format!("{at}: message {m:?} read as id {}, answered {id}", e.id),
                );
                continue;
            }
            let r = reads.entry(m).or_default();
            r.0 += 1;
            r.1 |= e.forwarded_by.is_some();
            if r.0 > 1 {
                n.duplicated += 1;
                example(
                    "agent duplicated",
                    format!("{at}: message {m:?} (id {}) read {} times", e.id, r.0),
                );
            }
        }
    }
    let mut all: Vec<(&(u32, u64), &AgentSent)> = sends.iter().collect();
    all.sort_by_key(|(m, _)| **m);
    for (m, sent) in all {
        let n = per.entry(sent.to_agent.clone()).or_default();
        let read = reads.get(m).copied();
        match &sent.outcome {
            AgentOutcome::Ok { stream, seq, id } => {
                n.acked += 1;
                let was_bounced = records.bounced.contains(id);
                if let Some((_, forwarded)) = read {
                    n.read += 1;
                    n.read_forwarded += u64::from(forwarded);
                    if was_bounced {
                        n.bounced_read += 1;
                        example(
                            "agent bounced and read",
                            format!("message {m:?} (id {id}) to {}", sent.to_agent),
                        );
                    }
                    continue;
                }
                let given_up = records
                    .evicted
                    .get(stream)
                    .is_some_and(|r| r.iter().any(|&(lo, hi)| lo <= *seq && *seq <= hi));
                if given_up {
                    n.evicted += 1;
                } else if was_bounced {
                    n.bounced += 1;
                } else if records.forward_evicted.contains(id) {
                    n.forward_evicted += 1;
                    example(
                        "agent forward evicted",
                        format!(
                            "message {m:?} (id {id}) to {}, acknowledged as {}#{seq}: its \
                             forward was evicted, the agent was not told",
                            sent.to_agent, stream.2
                        ),
                    );
                } else {
                    n.lost += 1;
                    example(
                        "agent lost",
                        format!(
                            "message {m:?} (id {id}) to {}, acknowledged as {}#{seq}, never read",
                            sent.to_agent, stream.2
                        ),
                    );
                }
            }
            AgentOutcome::Fail if read.is_some() => {
                n.phantom += 1;
                example(
                    "agent phantom",
                    format!("message {m:?} to {} was answered fail", sent.to_agent),
                );
            }
            AgentOutcome::Unknown | AgentOutcome::Pending => {
                if read.is_some() {
                    n.unknown_read += 1;
                } else {
                    n.unknown_missing += 1;
                }
            }
            AgentOutcome::Fail => {}
        }
    }
    per
}

/// Per stream, the seq ranges its author recorded as evicted.
type Evicted = HashMap<StreamKey, Vec<(Seq, Seq)>>;

fn check_receiver(
    r: &str,
    journal: &[EventEntry],
    sends: &HashMap<(u32, u64), Sent>,
    evicted: &Evicted,
    example: &mut impl FnMut(&'static str, String),
) -> Counts {
    let mut n = Counts::default();
    let mut seen_at: HashSet<(StreamKey, Seq)> = HashSet::new();
    let mut seen_msg: HashMap<(u32, u64), (StreamKey, Seq)> = HashMap::new();
    let mut high: HashMap<StreamKey, Seq> = HashMap::new();
    let mut gaps: HashMap<StreamKey, Vec<(Seq, Seq)>> = HashMap::new();

    for e in journal {
        match &e.record {
            EventRecord::Gap { stream, from, to } if stream.author != r => {
                n.gap_records += 1;
                n.topic_gap_records += u64::from(is_topic(stream));
                n.gap_seqs += to.saturating_sub(*from) + 1;
                let sk = key(stream);
                let recorded = evicted.get(&sk).map_or(&[][..], Vec::as_slice);
                let unexplained = (*from..=*to)
                    .filter(|seq| !recorded.iter().any(|&(lo, hi)| lo <= *seq && *seq <= hi))
                    .count() as u64;
                if unexplained > 0 {
                    n.gap_unexplained += unexplained;
                    example(
                        "unexplained gap",
                        format!(
                            "arrival {} gap {}#{from}..={to} from {}: {unexplained} seqs were never recorded as evicted",
                            e.arrival, stream.channel, stream.author
                        ),
                    );
                }
                gaps.entry(sk).or_default().push((*from, *to));
            }
            EventRecord::Envelope {
                stream,
                seq,
                body,
                msg_kind,
                ..
            } if stream.author != r => {
                let mesh_kind = mesh_protocol::is_mesh_kind(*msg_kind);
                if mesh_kind {
                    n.mesh_kind += 1;
                } else {
                    n.delivered += 1;
                    n.topic_delivered += u64::from(is_topic(stream));
                }
                let sk = key(stream);
                let at = format!("arrival {} {}#{seq}", e.arrival, stream.channel);
                if !seen_at.insert((sk.clone(), *seq)) {
                    n.duplicated += 1;
                    example("duplicated", format!("{at} from {} again", stream.author));
                    continue;
                }
                let h = high.entry(sk.clone()).or_insert(0);
                if *seq < *h {
                    n.reordered += 1;
                    example(
                        "reordered",
                        format!("{at} from {} after seq {h}", stream.author),
                    );
                } else {
                    *h = *seq;
                }
                if mesh_kind {
                    // An agent's message: judged per agent, from its reads.
                    continue;
                }
                let msg = parse_body(body);
                let sent = msg.and_then(|m| sends.get(&m));
                let (Some(m), Some(sent)) = (msg, sent) else {
                    n.unexpected += 1;
                    example("unexpected", format!("{at}: body {body:?} was never sent"));
                    continue;
                };
                if !sent.is_for(r) || !sent.may_arrive_on(r, stream) {
                    n.unexpected += 1;
                    example(
                        "unexpected",
                        format!(
                            "{at} from {}: message {m:?} was {}",
                            stream.author,
                            sent.describe()
                        ),
                    );
                    continue;
                }
                if let Some((first_sk, first_seq)) = seen_msg.insert(m, (sk.clone(), *seq)) {
                    n.duplicated += 1;
                    example(
                        "duplicated",
                        format!(
                            "{at}: message {m:?} already arrived as {}#{first_seq}",
                            first_sk.2
                        ),
                    );
                    continue;
                }
                match &sent.outcome {
                    Outcome::Ok(ok_sk, ok_seq) if (ok_sk, ok_seq) != (&sk, seq) => {
                        n.misplaced += 1;
                        example(
                            "misplaced",
                            format!("{at}: message {m:?} was acknowledged as seq {ok_seq}"),
                        );
                    }
                    Outcome::Ok(..) => {}
                    Outcome::Fail => {
                        n.phantom += 1;
                        example("phantom", format!("{at}: message {m:?} was answered fail"));
                    }
                    Outcome::Unknown | Outcome::Pending => n.unknown_delivered += 1,
                }
            }
            _ => {}
        }
    }

    let covered = |sk: &StreamKey, seq: Seq| {
        gaps.get(sk)
            .is_some_and(|g| g.iter().any(|&(from, to)| from <= seq && seq <= to))
    };
    let mut lost: Vec<((u32, u64), &Sent)> = sends
        .iter()
        .filter(|(_, s)| s.is_for(r))
        .map(|(m, s)| (*m, s))
        .collect();
    lost.sort_by_key(|(m, _)| *m);
    for (m, sent) in lost {
        let topic = u64::from(sent.is_topic());
        match &sent.outcome {
            Outcome::Ok(sk, seq) => {
                n.acked += 1;
                n.topic_acked += topic;
                if seen_msg.contains_key(&m) {
                    continue;
                }
                if covered(sk, *seq) {
                    n.gap_covered += 1;
                    n.topic_gap_covered += topic;
                } else {
                    n.lost += 1;
                    example(
                        "lost",
                        format!(
                            "message {m:?}, {}, acknowledged as {}#{seq}, never arrived",
                            sent.describe(),
                            sk.2
                        ),
                    );
                }
            }
            Outcome::Unknown if !seen_msg.contains_key(&m) => n.unknown_missing += 1,
            _ => {}
        }
    }

    let mut streams: Vec<(&StreamKey, &Seq)> = high.iter().collect();
    streams.sort();
    for (sk, &top) in streams {
        for seq in 1..top {
            if !seen_at.contains(&(sk.clone(), seq)) && !covered(sk, seq) {
                n.holes += 1;
                example(
                    "hole",
                    format!("{}#{seq} from {} skipped, no gap record", sk.2, sk.0),
                );
            }
        }
    }
    n
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use mesh_api::BodyEncoding;

    use super::*;
    use crate::history::body;

    const A: &str = "aaaa";
    const B: &str = "bbbb";
    const C: &str = "cccc";

    fn stream(from: &str, to: &str) -> StreamJson {
        StreamJson {
            author: from.into(),
            epoch: "e1".into(),
            channel: format!("direct:{to}"),
        }
    }

    const TOPIC: &str = "chaos";

    fn topic_stream(author: &str) -> StreamJson {
        StreamJson {
            author: author.into(),
            epoch: "e1".into(),
            channel: format!("topic:{TOPIC}"),
        }
    }

    /// A history builder: client 0 on node A sends to B unless told otherwise.
    #[derive(Default)]
    struct H {
        ops: Vec<Op>,
    }

    impl H {
        fn invoke(&mut self, c: u64, to: &str) -> &mut Self {
            self.ops.push(Op::Invoke {
                t_ms: 0,
                client: 0,
                c,
                from: 0,
                to: 1,
                to_id: to.into(),
            });
            self
        }
        fn ok(&mut self, c: u64, to: &str, seq: Seq) -> &mut Self {
            self.invoke(c, to);
            self.ops.push(Op::Ok {
                t_ms: 0,
                client: 0,
                c,
                stream: stream(A, to),
                seq,
                id: None,
            });
            self
        }
        fn fail(&mut self, c: u64, to: &str) -> &mut Self {
            self.invoke(c, to);
            self.ops.push(Op::Fail {
                t_ms: 0,
                client: 0,
                c,
                error: "outbox full".into(),
            });
            self
        }
        /// Client 0 on node A publishes message `c` to the topic, answered
        /// as `seq` of A's topic stream.
        fn publish(&mut self, c: u64, seq: Seq) -> &mut Self {
            self.ops.push(Op::Publish {
                t_ms: 0,
                client: 0,
                c,
                from: 0,
                from_id: A.into(),
                topic: TOPIC.into(),
            });
            self.ops.push(Op::Ok {
                t_ms: 0,
                client: 0,
                c,
                stream: topic_stream(A),
                seq,
                id: None,
            });
            self
        }
        fn unknown(&mut self, c: u64, to: &str) -> &mut Self {
            self.invoke(c, to);
            self.ops.push(Op::Unknown {
                t_ms: 0,
                client: 0,
                c,
                error: "timeout".into(),
            });
            self
        }
    }

    /// A journal builder.
    #[derive(Default)]
    struct J {
        entries: Vec<EventEntry>,
    }

    impl J {
        fn push(&mut self, record: EventRecord) -> &mut Self {
            let arrival = self.entries.len() as u64 + 1;
            self.entries.push(EventEntry {
                cursor: format!("c{arrival}"),
                arrival,
                record,
                losses_unrecorded: false,
            });
            self
        }
        /// Message `c` of client 0 from A, at `seq` of A's stream to `to`.
        fn env(&mut self, to: &str, seq: Seq, c: u64) -> &mut Self {
            self.env_body(A, to, seq, body(0, c))
        }
        fn env_body(&mut self, from: &str, to: &str, seq: Seq, body: String) -> &mut Self {
            self.push(EventRecord::Envelope {
                stream: stream(from, to),
                seq,
                lamport: seq,
                created_ms: 0,
                msg_kind: 0,
                encoding: BodyEncoding::Text,
                body,
                agent: None,
            })
        }
        /// Message `c` of client 0 at `seq` of `stream`.
        fn env_on(&mut self, stream: StreamJson, seq: Seq, c: u64) -> &mut Self {
            self.push(EventRecord::Envelope {
                stream,
                seq,
                lamport: seq,
                created_ms: 0,
                msg_kind: 0,
                encoding: BodyEncoding::Text,
                body: body(0, c),
                agent: None,
            })
        }
        /// Message `c` of client 0 at `seq` of A's topic stream.
        fn topic_env(&mut self, seq: Seq, c: u64) -> &mut Self {
            self.env_on(topic_stream(A), seq, c)
        }
        fn topic_gap(&mut self, from: Seq, upto: Seq) -> &mut Self {
            self.push(EventRecord::Gap {
                stream: topic_stream(A),
                from,
                to: upto,
            })
        }
        fn gap(&mut self, to: &str, from: Seq, upto: Seq) -> &mut Self {
            self.push(EventRecord::Gap {
                stream: stream(A, to),
                from,
                to: upto,
            })
        }
    }

    fn run(h: &H, b: &J) -> Summary {
        let journals = BTreeMap::from([(B.to_owned(), b.entries.clone())]);
        check(&h.ops, &journals)
    }

    /// With A's journal too (where A's evictions are recorded).
    fn run_with_author(h: &H, a: &J, b: &J) -> Summary {
        let journals = BTreeMap::from([
            (A.to_owned(), a.entries.clone()),
            (B.to_owned(), b.entries.clone()),
        ]);
        check(&h.ops, &journals)
    }

    /// A's record that it evicted `from..=to` of its stream to `to`.
    fn evicted<'a>(j: &'a mut J, to: &str, from: Seq, upto: Seq) -> &'a mut J {
        evicted_of(j, stream(A, to), from, upto)
    }

    /// A's record that it evicted `from..=to` of `stream`.
    fn evicted_of(j: &mut J, stream: StreamJson, from: Seq, upto: Seq) -> &mut J {
        j.push(EventRecord::Loss {
            stream,
            from,
            to: upto,
            reason: "outbox_evicted".into(),
            detail: String::new(),
        })
    }

    /// With the journals of A (the publisher), B and C: three members.
    fn run_members(h: &H, a: &J, b: &J, c: &J) -> Summary {
        let journals = BTreeMap::from([
            (A.to_owned(), a.entries.clone()),
            (B.to_owned(), b.entries.clone()),
            (C.to_owned(), c.entries.clone()),
        ]);
        check(&h.ops, &journals)
    }

    /// A publishes messages 1..=3 as seqs 1..=3 of its topic stream.
    fn three_published() -> H {
        let mut h = H::default();
        h.publish(1, 1).publish(2, 2).publish(3, 3);
        h
    }

    /// A journal with A's three publishes: in A's own, they are no deliveries.
    fn all_three() -> J {
        let mut j = J::default();
        j.topic_env(1, 1).topic_env(2, 2).topic_env(3, 3);
        j
    }

    fn three_acked() -> H {
        let mut h = H::default();
        h.ok(1, B, 1).ok(2, B, 2).ok(3, B, 3);
        h
    }

    #[test]
    fn a_clean_run_passes() {
        let h = three_acked();
        let s = run(&h, J::default().env(B, 1, 1).env(B, 2, 2).env(B, 3, 3));
        assert!(s.passed(), "{s:?}");
        assert_eq!(s.total.acked, 3);
        assert_eq!(s.total.delivered, 3);
        assert_eq!((s.invoked, s.ok, s.failed, s.unknown), (3, 3, 0, 0));
    }

    #[test]
    fn an_acknowledged_message_that_never_arrives_is_lost() {
        let h = three_acked();
        let s = run(&h, J::default().env(B, 1, 1).env(B, 2, 2));
        assert_eq!(s.total.lost, 1);
        assert!(!s.passed());
        assert!(
            s.examples
                .iter()
                .any(|e| e.starts_with("lost: message (0, 3)"))
        );
    }

    #[test]
    fn a_loss_covered_by_a_gap_record_is_not_counted_as_lost() {
        let h = three_acked();
        let mut a = J::default();
        evicted(&mut a, B, 1, 1);
        evicted(&mut a, B, 2, 2);
        let s = run_with_author(&h, &a, J::default().gap(B, 1, 2).env(B, 3, 3));
        assert_eq!(s.total.lost, 0);
        assert_eq!(s.total.gap_covered, 2);
        assert_eq!((s.total.gap_records, s.total.gap_seqs), (1, 2));
        assert_eq!((s.total.holes, s.total.gap_unexplained), (0, 0));
        assert!(s.passed(), "{s:?}");
    }

    #[test]
    fn a_gap_over_seqs_the_author_never_evicted_is_unexplained() {
        let h = three_acked();
        let mut a = J::default();
        evicted(&mut a, B, 1, 1);
        let s = run_with_author(&h, &a, J::default().gap(B, 1, 2).env(B, 3, 3));
        assert_eq!(s.total.lost, 0, "the reader was told");
        assert_eq!(s.total.gap_unexplained, 1, "but seq 2 was never evicted");
        assert!(!s.passed());
    }

    #[test]
    fn a_gap_of_another_stream_does_not_cover_a_loss() {
        let h = three_acked();
        let mut j = J::default();
        j.push(EventRecord::Gap {
            stream: stream(C, B),
            from: 1,
            to: 5,
        })
        .env(B, 1, 1)
        .env(B, 2, 2);
        let s = run(&h, &j);
        assert_eq!(s.total.lost, 1);
        assert_eq!(s.total.gap_unexplained, 5);
    }

    #[test]
    fn the_same_seq_delivered_twice_is_a_duplicate() {
        let h = three_acked();
        let s = run(
            &h,
            J::default()
                .env(B, 1, 1)
                .env(B, 2, 2)
                .env(B, 2, 2)
                .env(B, 3, 3),
        );
        assert_eq!(s.total.duplicated, 1);
        assert_eq!(s.total.reordered, 0);
        assert!(!s.passed());
    }

    #[test]
    fn the_same_message_under_two_seqs_is_a_duplicate() {
        let mut h = H::default();
        h.ok(1, B, 1);
        let s = run(&h, J::default().env(B, 1, 1).env(B, 2, 1));
        assert_eq!(s.total.duplicated, 1);
        assert!(!s.passed());
    }

    #[test]
    fn a_lower_seq_after_a_higher_one_is_reordered() {
        let h = three_acked();
        let s = run(&h, J::default().env(B, 1, 1).env(B, 3, 3).env(B, 2, 2));
        assert_eq!(s.total.reordered, 1);
        assert_eq!(s.total.lost, 0);
        assert_eq!(s.total.holes, 0);
        assert!(!s.passed());
    }

    #[test]
    fn a_message_never_sent_is_unexpected() {
        let mut h = H::default();
        h.ok(1, B, 1);
        let s = run(
            &h,
            J::default()
                .env(B, 1, 1)
                .env_body(A, B, 2, body(0, 99))
                .env_body(A, B, 3, "not ours".into()),
        );
        assert_eq!(s.total.unexpected, 2);
        assert!(!s.passed());
    }

    #[test]
    fn a_message_sent_to_another_node_is_unexpected_here() {
        let mut h = H::default();
        h.ok(1, C, 1);
        let s = run(&h, J::default().env(B, 1, 1));
        assert_eq!(s.per_receiver[B].unexpected, 1);
        // And it is lost for C, which has no journal at all.
        assert_eq!(s.per_receiver[C].lost, 1);
    }

    #[test]
    fn a_silently_skipped_seq_is_a_hole_even_when_its_send_had_no_answer() {
        let mut h = H::default();
        h.ok(1, B, 1).unknown(2, B).ok(3, B, 3);
        let s = run(&h, J::default().env(B, 1, 1).env(B, 3, 3));
        assert_eq!(s.total.holes, 1);
        assert_eq!(s.total.lost, 0);
        assert_eq!(s.total.unknown_missing, 1);
        assert!(!s.passed());
    }

    #[test]
    fn a_failed_send_that_arrives_is_a_phantom() {
        let mut h = H::default();
        h.fail(1, B);
        let s = run(&h, J::default().env(B, 1, 1));
        assert_eq!(s.total.phantom, 1);
        assert!(!s.passed());
    }

    #[test]
    fn an_unknown_send_may_arrive_or_not() {
        let mut h = H::default();
        h.unknown(1, B).unknown(2, B);
        let s = run(&h, J::default().env(B, 1, 1));
        assert_eq!((s.total.unknown_delivered, s.total.unknown_missing), (1, 1));
        assert!(s.passed(), "{s:?}");
    }

    #[test]
    fn a_message_at_another_seq_than_acknowledged_is_misplaced() {
        let mut h = H::default();
        h.ok(1, B, 2).unknown(2, B);
        let s = run(&h, J::default().env(B, 1, 1).env(B, 2, 2));
        assert_eq!(s.total.misplaced, 1);
        assert!(!s.passed());
    }

    #[test]
    fn the_receivers_own_sends_are_not_deliveries() {
        let h = H::default();
        let s = run(&h, J::default().env_body(B, A, 1, body(5, 1)));
        assert_eq!(s.total.delivered, 0);
        assert!(s.passed(), "{s:?}");
    }

    #[test]
    fn a_clean_topic_run_passes_with_every_member_but_the_author_counted() {
        let h = three_published();
        let s = run_members(&h, &all_three(), &all_three(), &all_three());
        assert!(s.passed(), "{s:?}");
        assert_eq!((s.total.acked, s.total.topic_acked), (6, 6));
        assert_eq!((s.total.delivered, s.total.topic_delivered), (6, 6));
        assert_eq!(s.per_receiver[A].acked, 0, "the author is no receiver");
        assert_eq!((s.invoked, s.ok), (3, 3));
        assert_eq!((s.published.invoked, s.published.ok), (3, 3));
    }

    #[test]
    fn a_topic_message_missing_at_one_member_is_lost_there() {
        let h = three_published();
        let mut c = J::default();
        c.topic_env(1, 1).topic_env(2, 2);
        let s = run_members(&h, &all_three(), &all_three(), &c);
        assert_eq!((s.per_receiver[B].lost, s.per_receiver[C].lost), (0, 1));
        assert!(!s.passed());
        assert!(
            s.examples
                .iter()
                .any(|e| e.starts_with("lost: message (0, 3), published to topic chaos")),
            "{:?}",
            s.examples
        );
    }

    #[test]
    fn a_topic_message_delivered_twice_is_a_duplicate() {
        let h = three_published();
        let mut b = all_three();
        b.topic_env(3, 3);
        let s = run_members(&h, &all_three(), &b, &all_three());
        assert_eq!(s.per_receiver[B].duplicated, 1);
        assert!(!s.passed());
    }

    #[test]
    fn a_topic_gap_the_author_never_recorded_as_evicted_is_unexplained() {
        let h = three_published();
        let mut a = all_three();
        // Evicted from A's direct stream to B: that explains no topic seq.
        evicted(&mut a, B, 1, 2);
        evicted_of(&mut a, topic_stream(A), 1, 1);
        let mut b = J::default();
        b.topic_gap(1, 2).topic_env(3, 3);
        let s = run_members(&h, &a, &b, &all_three());
        assert_eq!(s.total.lost, 0, "the reader was told");
        assert_eq!(s.total.gap_unexplained, 1, "but seq 2 was never evicted");
        assert_eq!(s.total.topic_gap_records, 1);
        assert!(!s.passed());
    }

    #[test]
    fn a_topic_gap_over_what_the_author_evicted_is_no_loss() {
        let h = three_published();
        let mut a = all_three();
        evicted_of(&mut a, topic_stream(A), 1, 2);
        let mut b = J::default();
        b.topic_gap(1, 2).topic_env(3, 3);
        let s = run_members(&h, &a, &b, &all_three());
        assert!(s.passed(), "{s:?}");
        assert_eq!((s.total.gap_covered, s.total.topic_gap_covered), (2, 2));
        assert_eq!((s.total.holes, s.total.gap_unexplained), (0, 0));
    }

    #[test]
    fn a_topic_seq_skipped_without_a_gap_is_a_hole_and_a_loss() {
        let h = three_published();
        let mut b = J::default();
        b.topic_env(1, 1).topic_env(3, 3);
        let s = run_members(&h, &all_three(), &b, &all_three());
        assert_eq!((s.total.holes, s.total.lost), (1, 1));
        assert!(!s.passed());
    }

    #[test]
    fn a_topic_message_out_of_order_is_reordered() {
        let h = three_published();
        let mut b = J::default();
        b.topic_env(1, 1).topic_env(3, 3).topic_env(2, 2);
        let s = run_members(&h, &all_three(), &b, &all_three());
        assert_eq!(s.total.reordered, 1);
        assert!(!s.passed());
    }

    #[test]
    fn a_sent_message_on_a_topic_stream_and_a_published_one_on_a_direct_stream_are_unexpected() {
        let mut h = H::default();
        h.ok(1, B, 1).publish(2, 1);
        let mut b = J::default();
        b.env_on(topic_stream(A), 1, 1).env_on(stream(A, B), 1, 2);
        let s = run_members(&h, &J::default(), &b, &J::default());
        assert_eq!(s.per_receiver[B].unexpected, 2);
        // Neither counts as delivered where it belonged.
        assert_eq!(s.per_receiver[B].lost, 2);
        assert!(!s.passed());
    }

    #[test]
    fn a_published_message_on_another_authors_topic_stream_is_unexpected() {
        let mut h = H::default();
        h.publish(1, 1);
        let mut b = J::default();
        b.env_on(topic_stream(C), 1, 1);
        let s = run_members(&h, &J::default(), &b, &J::default());
        assert_eq!(s.per_receiver[B].unexpected, 1);
    }

    #[test]
    fn a_failed_publish_that_arrives_is_a_phantom() {
        let mut h = H::default();
        h.ops.push(Op::Publish {
            t_ms: 0,
            client: 0,
            c: 1,
            from: 0,
            from_id: A.into(),
            topic: TOPIC.into(),
        });
        h.ops.push(Op::Fail {
            t_ms: 0,
            client: 0,
            c: 1,
            error: "store unavailable".into(),
        });
        let mut b = J::default();
        b.topic_env(1, 1);
        let s = run_members(&h, &J::default(), &b, &J::default());
        assert_eq!(s.per_receiver[B].phantom, 1);
        assert_eq!((s.published.invoked, s.published.failed), (1, 1));
        assert!(!s.passed());
    }

    /// A history of agent sends from client 0 to agent `R`.
    #[derive(Default)]
    struct AH {
        ops: Vec<Op>,
    }

    const R: &str = "roamer";

    fn msg_id(c: u64) -> String {
        format!("{c:032x}")
    }

    impl AH {
        fn send(&mut self, c: u64) -> &mut Self {
            self.ops.push(Op::AgentSend {
                t_ms: 0,
                client: 0,
                c,
                from: 0,
                from_agent: "s0".into(),
                to_agent: R.into(),
                to: 1,
                to_id: B.into(),
            });
            self
        }
        /// Sent as `seq` of A's stream to B, answered with its id.
        fn ok(&mut self, c: u64, seq: Seq) -> &mut Self {
            self.send(c);
            self.ops.push(Op::Ok {
                t_ms: 0,
                client: 0,
                c,
                stream: stream(A, B),
                seq,
                id: Some(msg_id(c)),
            });
            self
        }
        fn fail(&mut self, c: u64) -> &mut Self {
            self.send(c);
            self.ops.push(Op::Fail {
                t_ms: 0,
                client: 0,
                c,
                error: "store unavailable".into(),
            });
            self
        }
        fn unknown(&mut self, c: u64) -> &mut Self {
            self.send(c);
            self.ops.push(Op::Unknown {
                t_ms: 0,
                client: 0,
                c,
                error: "timeout".into(),
            });
            self
        }
        /// The agent reads messages `cs` at node `node`.
        fn read(&mut self, node: usize, cs: &[u64]) -> &mut Self {
            self.ops.push(Op::AgentRead {
                t_ms: 0,
                node,
                agent: R.into(),
                after: None,
                next: None,
                entries: cs
                    .iter()
                    .map(|&c| crate::history::ReadEntry {
                        id: msg_id(c),
                        body: body(0, c),
                        arrival: c,
                        forwarded_by: None,
                    })
                    .collect(),
                other: Vec::new(),
            });
            self
        }
        fn moved(&mut self, from: usize, to: usize) -> &mut Self {
            self.ops.push(Op::AgentMove {
                t_ms: 0,
                agent: R.into(),
                from,
                to,
                after: None,
                outcome: "moved".into(),
                inbox_after: None,
                error: String::new(),
            });
            self
        }
    }

    fn run_agents(h: &AH, a: &J) -> Summary {
        let journals = BTreeMap::from([(A.to_owned(), a.entries.clone())]);
        check(&h.ops, &journals)
    }

    #[test]
    fn agent_sends_each_read_once_across_two_hosts_pass() {
        let mut h = AH::default();
        h.ok(1, 1)
            .ok(2, 2)
            .read(0, &[1])
            .moved(0, 1)
            .ok(3, 3)
            .read(1, &[2, 3]);
        let s = run_agents(&h, &J::default());
        assert!(s.passed(), "{s:?}");
        let n = &s.per_agent[R];
        assert_eq!((n.acked, n.read, n.lost, n.duplicated), (3, 3, 0, 0));
        assert_eq!((s.agent_sends.invoked, s.agent_sends.ok), (3, 3));
        assert_eq!((s.agent_moves, s.agent_reads), (1, 2));
        assert_eq!(s.invoked, 0, "agent sends are not node sends");
    }

    #[test]
    fn an_agent_message_read_at_the_old_host_and_again_at_the_new_one_is_a_duplicate() {
        let mut h = AH::default();
        h.ok(1, 1)
            .ok(2, 2)
            .read(0, &[1, 2])
            .moved(0, 1)
            .read(1, &[2]);
        let s = run_agents(&h, &J::default());
        assert_eq!(s.per_agent[R].duplicated, 1);
        assert!(!s.passed());
        assert!(
            s.examples
                .iter()
                .any(|e| e.starts_with("agent duplicated: roamer at node 1")),
            "{:?}",
            s.examples
        );
    }

    #[test]
    fn an_acknowledged_agent_send_never_read_is_lost() {
        let mut h = AH::default();
        h.ok(1, 1).ok(2, 2).read(0, &[1]);
        let s = run_agents(&h, &J::default());
        assert_eq!(s.per_agent[R].lost, 1);
        assert!(!s.passed());
        assert!(
            s.examples
                .iter()
                .any(|e| e.starts_with("agent lost: message (0, 2)")),
            "{:?}",
            s.examples
        );
    }

    #[test]
    fn an_agent_send_its_node_gave_up_with_a_record_is_not_lost() {
        let mut h = AH::default();
        h.ok(1, 1).ok(2, 2).read(0, &[1]);
        let mut a = J::default();
        evicted(&mut a, B, 2, 2);
        let s = run_agents(&h, &a);
        assert!(s.passed(), "{s:?}");
        assert_eq!((s.per_agent[R].evicted, s.per_agent[R].lost), (1, 0));
    }

    #[test]
    fn an_errored_agent_send_may_be_absent_but_not_read() {
        let mut h = AH::default();
        h.fail(1).ok(2, 1).read(0, &[2]);
        let s = run_agents(&h, &J::default());
        assert!(s.passed(), "{s:?}");
        assert_eq!(s.agent_sends.failed, 1);
        let mut h = AH::default();
        h.fail(1).read(0, &[1]);
        let s = run_agents(&h, &J::default());
        assert_eq!(s.per_agent[R].phantom, 1);
        assert!(!s.passed());
    }

    #[test]
    fn an_unknown_agent_send_may_be_read_once_or_not_at_all_but_not_twice() {
        let mut h = AH::default();
        h.unknown(1).unknown(2).read(0, &[1]);
        let s = run_agents(&h, &J::default());
        assert!(s.passed(), "{s:?}");
        let n = &s.per_agent[R];
        assert_eq!((n.unknown_read, n.unknown_missing), (1, 1));
        h.read(1, &[1]);
        let s = run_agents(&h, &J::default());
        assert_eq!(s.per_agent[R].duplicated, 1);
        assert!(!s.passed());
    }

    #[test]
    fn an_agent_message_read_under_another_id_or_never_sent_is_unexpected() {
        let mut h = AH::default();
        h.ok(1, 1);
        h.ops.push(Op::AgentRead {
            t_ms: 0,
            node: 0,
            agent: R.into(),
            after: None,
            next: None,
            entries: vec![
                crate::history::ReadEntry {
                    id: msg_id(9),
                    body: body(0, 1),
                    arrival: 1,
                    forwarded_by: None,
                },
                crate::history::ReadEntry {
                    id: msg_id(5),
                    body: "hello".into(),
                    arrival: 2,
                    forwarded_by: None,
                },
            ],
            other: Vec::new(),
        });
        let s = run_agents(&h, &J::default());
        assert_eq!(s.per_agent[R].unexpected, 2);
        assert_eq!(s.per_agent[R].lost, 1, "not read under its own id");
        assert!(!s.passed());
    }

    #[test]
    fn agent_envelopes_fill_their_seqs_without_being_workload_messages() {
        // Node send 1 and 3 on A's stream to B, an agent message at seq 2.
        let mut h = H::default();
        h.ok(1, B, 1).ok(3, B, 3);
        let mut b = J::default();
        b.env(B, 1, 1);
        b.push(EventRecord::Envelope {
            stream: stream(A, B),
            seq: 2,
            lamport: 2,
            created_ms: 0,
            msg_kind: mesh_protocol::KIND_AGENT,
            encoding: BodyEncoding::Base64,
            body: "AAEC".into(),
            agent: None,
        });
        b.env(B, 3, 3);
        let s = run(&h, &b);
        assert!(s.passed(), "{s:?}");
        assert_eq!((s.total.delivered, s.total.mesh_kind), (2, 1));
        assert_eq!((s.total.holes, s.total.unexpected), (0, 0));
    }

    #[test]
    fn an_agent_send_bounced_to_its_sender_is_not_lost_but_must_not_be_read_too() {
        let mut h = AH::default();
        h.ok(1, 1).ok(2, 2).read(0, &[1]);
        let bounce = mesh_protocol::Bounce {
            id: msg_id(2).parse().unwrap(),
            to: R.parse().unwrap(),
            missing: None,
            reason: mesh_protocol::BounceReason::NoSuchAgent,
        };
        let (encoding, body) = BodyEncoding::encode(&bounce.encode());
        let mut a = J::default();
        a.push(EventRecord::Envelope {
            stream: stream(B, A),
            seq: 1,
            lamport: 1,
            created_ms: 0,
            msg_kind: mesh_protocol::KIND_BOUNCE,
            encoding,
            body,
            agent: None,
        });
        let s = run_agents(&h, &a);
        assert!(s.passed(), "{s:?}");
        assert_eq!((s.per_agent[R].bounced, s.per_agent[R].lost), (1, 0));
        h.read(1, &[2]);
        let s = run_agents(&h, &a);
        assert_eq!(s.per_agent[R].bounced_read, 1);
        assert!(!s.passed());
    }

    #[test]
    fn an_agent_send_whose_forward_was_evicted_is_counted_as_such_and_fails_the_run() {
        let mut h = AH::default();
        h.ok(1, 1).ok(2, 2).read(0, &[1]);
        // B, a host the agent left, passed message 2 on to C as seq 5 of
        // its stream to C, and evicted it under evict-oldest.
        let envelope = mesh_protocol::AgentEnvelope {
            id: msg_id(2).parse().unwrap(),
            from: "s0".parse().unwrap(),
            to: Some(R.parse().unwrap()),
            in_reply_to: None,
            key: None,
            body: body(0, 2).into_bytes(),
            receipt: false,
        };
        let forward = mesh_protocol::Forward {
            author: iroh::SecretKey::from_bytes(&[7; 32]).public(),
            envelope: envelope.encode(),
        };
        let (encoding, text) = BodyEncoding::encode(&forward.encode());
        let mut b = J::default();
        b.push(EventRecord::Envelope {
            stream: stream(B, C),
            seq: 5,
            lamport: 5,
            created_ms: 0,
            msg_kind: mesh_protocol::KIND_FORWARD,
            encoding,
            body: text,
            agent: None,
        });
        let s = run_agents(&h, &J::default());
        assert_eq!(s.per_agent[R].lost, 1, "without the eviction it is lost");
        evicted_of(&mut b, stream(B, C), 5, 5);
        let journals = BTreeMap::from([(B.to_owned(), b.entries.clone())]);
        let s = check(&h.ops, &journals);
        assert!(!s.passed(), "nobody was told: {s:?}");
        assert_eq!(
            (s.per_agent[R].forward_evicted, s.per_agent[R].lost),
            (1, 0)
        );
    }
}
