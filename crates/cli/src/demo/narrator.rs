//! The demo's narration and the short forms it prints ids and seqs in.

use std::fmt::Write as _;
use std::io::Write;

use anyhow::Context;
use mesh_api::{EventEntry, EventRecord, SendResponse};

use super::SHOWN_BODY_CHARS_MAX;
use super::node::DemoNode;

/// The seqs of the messages from `author` among `entries`.
pub(super) fn seqs_from(entries: &[EventEntry], author: &DemoNode) -> Vec<u64> {
    entries
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Envelope { stream, seq, .. } if stream.author == author.id() => Some(*seq),
            _ => None,
        })
        .collect()
}

/// Writes the narration.
pub(super) struct Narrator<'a, W: Write> {
    pub(super) out: &'a mut W,
}

impl<W: Write> Narrator<'_, W> {
    pub(super) fn line(&mut self, text: impl std::fmt::Display) -> anyhow::Result<()> {
        writeln!(self.out, "{text}").context("cannot write the narration")?;
        self.out.flush().context("cannot write the narration")
    }

    /// One line per journal entry, naming authors by their demo names.
    pub(super) fn entries(
        &mut self,
        entries: &[EventEntry],
        nodes: &[&DemoNode],
    ) -> anyhow::Result<()> {
        for e in entries {
            self.line(entry_line(e, nodes))?;
        }
        Ok(())
    }
}

/// The narration of journal entry `e`, naming authors by their demo names
/// among `nodes`.
// Long because it is one arm per journal record kind, each its one line of
// text; splitting it would only hide that table.
fn entry_line(e: &EventEntry, nodes: &[&DemoNode]) -> String {
    let name = |id: &str| {
        nodes
            .iter()
            .find(|n| n.id() == id)
            .map_or_else(|| short(id), |n| n.name.to_owned())
    };
    let recipient = |channel: &str| name(channel.trim_start_matches("direct:"));
    let mut line = format!("     [arrival {}] ", e.arrival);
    match &e.record {
        EventRecord::Envelope {
            stream, seq, body, ..
        } => {
            let shown: String = body.chars().take(SHOWN_BODY_CHARS_MAX).collect();
            let _ = write!(line, "from {} #{seq}: {shown:?}", name(&stream.author));
        }
        EventRecord::Gap { stream, from, to } => {
            let _ = write!(
                line,
                "GAP  from {} #{from}..=#{to}: can never arrive (the author no longer holds them)",
                name(&stream.author)
            );
        }
        EventRecord::Loss {
            stream,
            from,
            to,
            reason,
            ..
        } => {
            let _ = write!(
                line,
                "LOSS {reason}: {}'s stream to {} #{from}..=#{to}",
                name(&stream.author),
                recipient(&stream.channel)
            );
        }
        EventRecord::Lagged {
            subscriber,
            from,
            to,
            ..
        } => {
            let _ = write!(line, "LAGGED {subscriber}: arrivals {from}..={to}");
        }
        EventRecord::Lost { msgs, to, .. } => {
            let _ = write!(line, "LOST {msgs} sends to {}", name(to));
        }
        EventRecord::EpochEnded { stream, last, .. } => {
            let _ = write!(
                line,
                "EPOCH ENDED {}'s stream at #{last}",
                name(&stream.author)
            );
        }
        EventRecord::RolledBack {
            stream, from, to, ..
        } => {
            let _ = write!(
                line,
                "ROLLED BACK {}'s stream #{from}..=#{to}",
                name(&stream.author)
            );
        }
        EventRecord::Conflict { stream, seq, .. } => {
            let _ = write!(line, "CONFLICT {}'s stream #{seq}", name(&stream.author));
        }
        EventRecord::Trimmed { from, to, .. } => {
            let _ = write!(line, "TRIMMED arrivals {from}..={to}");
        }
        EventRecord::DrainEnded { agent, to, .. } => {
            let _ = write!(line, "DRAIN ENDED {agent}, now on {}", name(to));
        }
        EventRecord::Other {} => line.push_str("(an entry this build does not know)"),
    }
    line
}

pub(super) fn short(id: &str) -> String {
    id.chars().take(10).collect()
}

pub(super) fn numbered(text: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{text} ({i} of {n})")).collect()
}

pub(super) fn seq_range(sent: &[SendResponse]) -> String {
    let seqs: Vec<u64> = sent.iter().map(|s| s.seq).collect();
    span(&seqs)
}

/// `#a..=#b` for ascending seqs, or the list if they are not one run.
pub(super) fn span(seqs: &[u64]) -> String {
    match (seqs.first(), seqs.last()) {
        (Some(&a), Some(&b)) if b >= a && b - a + 1 == seqs.len() as u64 => {
            format!("#{a}..=#{b}")
        }
        _ => {
            let all: Vec<String> = seqs.iter().map(|s| format!("#{s}")).collect();
            all.join(", ")
        }
    }
}
