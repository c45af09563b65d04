//! The workload's history: what each client asked and what it was told.
//!
//! One JSON object a line (`history.jsonl`), in the order the harness saw
//! them: `invoke` before a send to one node or `publish` before a publish
//! to a topic, then exactly one of `ok` (the daemon answered with the
//! message's stream and seq: it is committed), `fail` (the daemon or the
//! socket said it was not sent) or `unknown` (no answer: a timeout, a crash
//! mid-request). A message is named by its origin client and that client's
//! counter, which the body carries as `{"o":…,"c":…}`. A history written
//! before topics has no `publish` lines and reads the same.
//!
//! Agent moves add three kinds a history written before them simply lacks:
//! `agent_send` (an agent's message to the roaming agent, then `ok` with the
//! message `id`, `fail` or `unknown` as above), `agent_read` (what the
//! roaming agent read of its inbox at one host: every message entry's id
//! and body) and `agent_move` (an export and import of it, and how each
//! ended).

use std::io::{BufRead as _, BufWriter, Write as _};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context;
use mesh_api::StreamJson;
use mesh_protocol::Seq;
use serde::{Deserialize, Serialize};

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Op {
    /// A client is about to send message (`client`, `c`) from node `from` to node `to`.
    Invoke {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The client (origin).
        client: u32,
        /// The client's message counter, from 1.
        c: u64,
        /// The sending node's index.
        from: usize,
        /// The receiving node's index.
        to: usize,
        /// The receiving node's id.
        to_id: String,
    },
    /// A client is about to publish message (`client`, `c`) to `topic`
    /// through node `from`, which authors it: every other member should get it.
    Publish {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The client (origin).
        client: u32,
        /// The client's message counter, from 1.
        c: u64,
        /// The publishing node's index.
        from: usize,
        /// The publishing node's id (the author of its topic stream).
        from_id: String,
        /// The topic's name.
        topic: String,
    },
    /// Agent `from_agent` on node `from` is about to send message
    /// (`client`, `c`) to agent `to_agent@to_id`, under the client id
    /// [`agent_client_id`] names.
    AgentSend {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The client (origin).
        client: u32,
        /// The client's message counter, from 1.
        c: u64,
        /// The sending node's index.
        from: usize,
        /// The sending agent.
        from_agent: String,
        /// The recipient agent's name.
        to_agent: String,
        /// The node the address names, by index (where the workload
        /// believes the agent is, or a host it had).
        to: usize,
        /// That node's id.
        to_id: String,
    },
    /// The roaming agent read its inbox at node `node` after `after` (from
    /// its start if `None`), up to `next`.
    AgentRead {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The host read at, by index.
        node: usize,
        /// The agent.
        agent: String,
        /// Where the read started.
        after: Option<String>,
        /// Where it ended: the next read there starts after it.
        next: Option<String>,
        /// Every message entry read, in order.
        entries: Vec<ReadEntry>,
        /// Entries of other kinds (bounces, loss records, ...), for a person.
        #[serde(default)]
        other: Vec<String>,
    },
    /// The roaming agent was exported from `from` (read up to `after`) and
    /// imported on `to`; `outcome` says how far that went.
    AgentMove {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The agent.
        agent: String,
        /// The host it left, by index.
        from: usize,
        /// The host it was imported on, by index.
        to: usize,
        /// The export's `after`: how far it had read at `from`.
        after: Option<String>,
        /// `moved` (the import answered), `export_failed` or
        /// `import_failed` (it stays at `from`), with the error.
        outcome: String,
        /// The import's `inbox_after`: where its inbox at `to` is read from
        /// (a host it had before); `None` from its start.
        inbox_after: Option<String>,
        /// What went wrong, if anything.
        #[serde(default)]
        error: String,
    },
    /// The send or publish was committed as `seq` of `stream`.
    Ok {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The client.
        client: u32,
        /// The client's message counter.
        c: u64,
        /// The stream the daemon answered.
        stream: StreamJson,
        /// The seq the daemon answered.
        seq: Seq,
        /// For an agent send: the message id the daemon answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// The send or publish was refused: nothing was written.
    Fail {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The client.
        client: u32,
        /// The client's message counter.
        c: u64,
        /// Why.
        error: String,
    },
    /// No answer: the message may or may not have been written.
    Unknown {
        /// Milliseconds since the run started.
        t_ms: u64,
        /// The client.
        client: u32,
        /// The client's message counter.
        c: u64,
        /// What happened instead of an answer.
        error: String,
    },
}

/// One message entry an agent read of its inbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadEntry {
    /// The message id.
    pub id: String,
    /// Its body (the workload's bodies name their message).
    pub body: String,
    /// Its arrival in the host's journal.
    pub arrival: u64,
    /// The node that passed it on, if it came through a host the agent left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_by: Option<String>,
}

impl Op {
    /// The message this op is about: (client, counter); `None` for the
    /// ops that are about no one message (reads, moves).
    pub fn message(&self) -> Option<(u32, u64)> {
        match self {
            Op::Invoke { client, c, .. }
            | Op::Publish { client, c, .. }
            | Op::AgentSend { client, c, .. }
            | Op::Ok { client, c, .. }
            | Op::Fail { client, c, .. }
            | Op::Unknown { client, c, .. } => Some((*client, *c)),
            Op::AgentRead { .. } | Op::AgentMove { .. } => None,
        }
    }
}

/// The client id an agent send of message (`client`, `c`) carries, so a
/// retry of it is answered, not sent again.
pub fn agent_client_id(client: u32, c: u64) -> String {
    format!("chaos-{client}-{c}")
}

/// The body that names message (`client`, `c`): `{"o":client,"c":c}`.
pub fn body(client: u32, c: u64) -> String {
    format!("{{\"o\":{client},\"c\":{c}}}")
}

/// The message a body names, if it is one the workload writes.
pub fn parse_body(body: &str) -> Option<(u32, u64)> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        o: u32,
        c: u64,
    }
    let b: Body = serde_json::from_str(body).ok()?;
    Some((b.o, b.c))
}

/// A history being recorded: kept in memory and appended to a JSONL file.
#[derive(Debug)]
pub struct History {
    start: Instant,
    inner: Mutex<Recorded>,
}

#[derive(Debug)]
struct Recorded {
    ops: Vec<Op>,
    file: Option<BufWriter<std::fs::File>>,
    write_error: Option<String>,
}

impl History {
    /// A history written to `path` as it is recorded (and kept in memory),
    /// or in memory only.
    ///
    /// # Errors
    /// If the file cannot be created.
    pub fn new(path: Option<&Path>) -> anyhow::Result<History> {
        let file = match path {
            Some(p) => Some(BufWriter::new(crate::cluster::create_file(p)?)),
            None => None,
        };
        Ok(History {
            start: Instant::now(),
            inner: Mutex::new(Recorded {
                ops: Vec::new(),
                file,
                write_error: None,
            }),
        })
    }

    /// Milliseconds since the history started.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Records `op`.
    pub fn record(&self, op: Op) {
        let mut r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = &mut r.file {
            let written = serde_json::to_writer(&mut *f, &op)
                .map_err(|e| e.to_string())
                .and_then(|()| f.write_all(b"\n").map_err(|e| e.to_string()));
            if let Err(e) = written {
                r.write_error.get_or_insert(e);
            }
        }
        r.ops.push(op);
    }

    /// Every op so far, in order.
    pub fn ops(&self) -> Vec<Op> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ops
            .clone()
    }

    /// Flushes the file.
    ///
    /// # Errors
    /// If any line could not be written.
    pub fn flush(&self) -> anyhow::Result<()> {
        let mut r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = &mut r.file {
            f.flush().context("cannot write the history")?;
        }
        match &r.write_error {
            Some(e) => anyhow::bail!("cannot write the history: {e}"),
            None => Ok(()),
        }
    }
}

/// Reads a history written by [`History`].
///
/// # Errors
/// If the file cannot be read or a line is not an [`Op`].
pub fn load(path: &Path) -> anyhow::Result<Vec<Op>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut ops = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        ops.push(
            serde_json::from_str(&line)
                .with_context(|| format!("{}:{}: not a history line", path.display(), n + 1))?,
        );
    }
    Ok(ops)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;

    #[test]
    fn a_body_names_its_message_and_nothing_else_parses() {
        assert_eq!(parse_body(&body(3, 17)), Some((3, 17)));
        assert_eq!(parse_body("hello"), None);
        assert_eq!(parse_body("{\"o\":1}"), None);
        assert_eq!(parse_body("{\"o\":1,\"c\":2,\"x\":3}"), None);
    }

    #[test]
    fn a_history_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let h = History::new(Some(&path)).unwrap();
        h.record(Op::Invoke {
            t_ms: 1,
            client: 0,
            c: 1,
            from: 0,
            to: 1,
            to_id: "b".into(),
        });
        h.record(Op::Ok {
            t_ms: 2,
            client: 0,
            c: 1,
            stream: StreamJson {
                author: "a".into(),
                epoch: "e".into(),
                channel: "direct:b".into(),
            },
            seq: 1,
            id: None,
        });
        h.record(Op::Unknown {
            t_ms: 3,
            client: 0,
            c: 2,
            error: "timeout".into(),
        });
        h.record(Op::Publish {
            t_ms: 4,
            client: 0,
            c: 3,
            from: 0,
            from_id: "a".into(),
            topic: "chaos".into(),
        });
        h.record(Op::AgentSend {
            t_ms: 5,
            client: 0,
            c: 4,
            from: 0,
            from_agent: "s0".into(),
            to_agent: "roamer".into(),
            to: 1,
            to_id: "b".into(),
        });
        h.record(Op::AgentRead {
            t_ms: 6,
            node: 1,
            agent: "roamer".into(),
            after: None,
            next: Some("mc1x".into()),
            entries: vec![ReadEntry {
                id: "00ff".into(),
                body: body(0, 4),
                arrival: 7,
                forwarded_by: None,
            }],
            other: Vec::new(),
        });
        h.record(Op::AgentMove {
            t_ms: 7,
            agent: "roamer".into(),
            from: 1,
            to: 2,
            after: Some("mc1x".into()),
            outcome: "moved".into(),
            inbox_after: None,
            error: String::new(),
        });
        h.flush().unwrap();
        assert_eq!(load(&path).unwrap(), h.ops());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\"type\":\"invoke\""), "{text}");
    }

    #[test]
    fn a_history_written_before_agent_moves_still_loads() {
        let old = r#"{"type":"ok","t_ms":2,"client":0,"c":1,"stream":{"author":"a","epoch":"e","channel":"direct:b"},"seq":1}"#;
        let op: Op = serde_json::from_str(old).unwrap();
        assert!(matches!(op, Op::Ok { id: None, .. }), "{op:?}");
        assert_eq!(
            serde_json::to_string(&op).unwrap(),
            old,
            "written as before"
        );
    }
}
