//! The history checker: from the workload's history and every receiver's
//! journal, count what the mesh promised and broke.
//!
//! Per receiver R, the messages delivered to R are the envelopes in R's
//! journal written by another node. The counts:
//! - **lost**: acknowledged (`ok` in the history) for R, never delivered to
//!   R, and not inside a gap record R holds for that stream;
//! - **unexpected**: delivered to R but never invoked for R (a body the
//!   workload never wrote, a message sent to another node, a stream that is
//!   not `direct:R`);
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
//!   durable. (This holds while no node loses its store, as in these runs.)
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
    /// Sends acknowledged for this receiver.
    pub acked: u64,
    /// Envelopes from other nodes in the receiver's journal.
    pub delivered: u64,
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
    /// Seqs the gap records cover.
    pub gap_seqs: u64,
    /// Acknowledged sends not delivered because a gap record covers them.
    pub gap_covered: u64,
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
        self.delivered += o.delivered;
        self.lost += o.lost;
        self.unexpected += o.unexpected;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.gap_records += o.gap_records;
        self.gap_seqs += o.gap_seqs;
        self.gap_covered += o.gap_covered;
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
            "lost={} unexpected={} duplicated={} reordered={} gaps={} (seqs {}, acked covered {}, \
             unexplained {}) holes={} misplaced={} phantom={} | acked={} delivered={} \
             unknown delivered={} missing={}",
            self.lost,
            self.unexpected,
            self.duplicated,
            self.reordered,
            self.gap_records,
            self.gap_seqs,
            self.gap_covered,
            self.gap_unexplained,
            self.holes,
            self.misplaced,
            self.phantom,
            self.acked,
            self.delivered,
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
    /// Sends invoked, and how they ended.
    pub invoked: u64,
    /// Sends answered `ok`.
    pub ok: u64,
    /// Sends answered `fail`.
    pub failed: u64,
    /// Sends with no answer.
    pub unknown: u64,
    /// Invoked sends the history has no outcome for (the run was cut short).
    pub unfinished: u64,
    /// A few examples of each problem, for a person.
    pub examples: Vec<String>,
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

#[derive(Clone, Debug)]
struct Sent {
    to_id: String,
    outcome: Outcome,
}

/// Checks `ops` (the whole history) against `journals` (each node's whole
/// journal, by node id). Every node id that is a send's target must have a
/// journal; a missing one counts all its acknowledged sends as lost.
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
        match op {
            Op::Invoke { to_id, .. } => {
                summary.invoked += 1;
                sends.insert(
                    op.message(),
                    Sent {
                        to_id: to_id.clone(),
                        outcome: Outcome::Pending,
                    },
                );
            }
            Op::Ok { stream, seq, .. } => {
                summary.ok += 1;
                if let Some(s) = sends.get_mut(&op.message()) {
                    s.outcome = Outcome::Ok(key(stream), *seq);
                }
            }
            Op::Fail { .. } => {
                summary.failed += 1;
                if let Some(s) = sends.get_mut(&op.message()) {
                    s.outcome = Outcome::Fail;
                }
            }
            Op::Unknown { .. } => {
                summary.unknown += 1;
                if let Some(s) = sends.get_mut(&op.message()) {
                    s.outcome = Outcome::Unknown;
                }
            }
        }
    }
    summary.unfinished = sends
        .values()
        .filter(|s| matches!(s.outcome, Outcome::Pending))
        .count() as u64;

    let mut receivers: Vec<&String> = journals.keys().collect();
    for s in sends.values() {
        if !journals.contains_key(&s.to_id) && !receivers.contains(&&s.to_id) {
            receivers.push(&s.to_id);
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
    let channel = format!("direct:{r}");
    let mut seen_at: HashSet<(StreamKey, Seq)> = HashSet::new();
    let mut seen_msg: HashMap<(u32, u64), (StreamKey, Seq)> = HashMap::new();
    let mut high: HashMap<StreamKey, Seq> = HashMap::new();
    let mut gaps: HashMap<StreamKey, Vec<(Seq, Seq)>> = HashMap::new();

    for e in journal {
        match &e.record {
            EventRecord::Gap { stream, from, to } if stream.author != r => {
                n.gap_records += 1;
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
                if sent.to_id != r || stream.channel != channel {
                    n.unexpected += 1;
                    example(
                        "unexpected",
                        format!("{at}: message {m:?} was sent to {}", sent.to_id),
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
        .filter(|(_, s)| s.to_id == r)
        .map(|(m, s)| (*m, s))
        .collect();
    lost.sort_by_key(|(m, _)| *m);
    for (m, sent) in lost {
        match &sent.outcome {
            Outcome::Ok(sk, seq) => {
                n.acked += 1;
                if seen_msg.contains_key(&m) {
                    continue;
                }
                if covered(sk, *seq) {
                    n.gap_covered += 1;
                } else {
                    n.lost += 1;
                    example(
                        "lost",
                        format!(
                            "message {m:?}, acknowledged as {}#{seq}, never arrived",
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
        j.push(EventRecord::Loss {
            stream: stream(A, to),
            from,
            to: upto,
            reason: "outbox_evicted".into(),
            detail: String::new(),
        })
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
}
