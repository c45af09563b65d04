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
//! may or may not arrive; they are counted for information.

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
        self.total.clean()
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
    for op in ops {
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
            sends.insert(op.message(), sent);
            continue;
        }
        let sent = sends.get_mut(&op.message());
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
    summary.examples = examples.into_values().flatten().collect();
    summary
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
                stream, seq, body, ..
            } if stream.author != r => {
                n.delivered += 1;
                n.topic_delivered += u64::from(is_topic(stream));
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
}
