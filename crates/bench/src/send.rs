//! Sending: the bench's messages, one at a time on a kept-alive connection,
//! or as an NDJSON stream with a window of messages in flight (optionally
//! paced at a rate), and waiting for peers' marks.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::Method;
use hyper::body::Frame;
use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::BENCH_MSG_KIND;
use super::http::{Conn, LineReader, shown};
use super::progress::Bar;
use mesh_api::SendResponse;
use mesh_api::StatusResponse;
use mesh_api::client::Client;
use mesh_cluster::NodeProc;

/// The most lines the producer puts in one body frame.
const LINES_PER_FRAME_MAX: usize = 64;
/// Body frames queued between the producer and the connection.
const FRAMES_QUEUED_MAX: usize = 4;
/// The most sends of the paced workload in flight at once.
const PACED_IN_FLIGHT_MAX: usize = 256;
/// How often peers' marks are read while waiting for them.
const MARK_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The messages of one workload run: message `k` goes to `to[k % n]` and
/// its body is `<tag><k>:` padded with `x` to `size` bytes.
#[derive(Debug)]
pub(super) struct Msgs {
    pub(super) to: Vec<String>,
    pub(super) size: usize,
    pub(super) tag: String,
    /// Agent sends (`to` are `AGENT@NODE`; no message kind).
    pub(super) agent: bool,
}

impl Msgs {
    pub(super) fn recipient(&self, k: u64) -> &str {
        &self.to[(k % self.to.len() as u64) as usize]
    }

    /// Appends message `k` as one JSON object (no line end) to `out`.
    pub(super) fn push_json(&self, k: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"to\":\"");
        out.extend_from_slice(self.recipient(k).as_bytes());
        out.extend_from_slice(b"\",\"body\":\"");
        let body_start = out.len();
        // Writing to a Vec cannot fail.
        let _ = write!(out, "{}{k}:", self.tag);
        out.truncate(body_start + (out.len() - body_start).min(self.size));
        out.resize(body_start + self.size, b'x');
        if self.agent {
            out.extend_from_slice(b"\"}");
        } else {
            let _ = write!(out, "\",\"msg_kind\":{BENCH_MSG_KIND}}}");
        }
    }

    /// The number `k` of a body this run sent, if it is one.
    pub(super) fn number_of(&self, body: &str) -> Option<u64> {
        let rest = body.strip_prefix(self.tag.as_str())?;
        let (digits, _) = rest.split_once(':')?;
        digits.parse().ok()
    }
}

/// The highest seq committed so far per recipient.
pub(super) type LastSeqs = HashMap<String, u64>;

fn note_seq(last: &mut LastSeqs, channel: &str, seq: u64) {
    let to = channel.strip_prefix("direct:").unwrap_or(channel);
    match last.get_mut(to) {
        Some(v) => *v = (*v).max(seq),
        None => {
            last.insert(to.to_owned(), seq);
        }
    }
}

/// Sends messages `0..count` one at a time on one connection, each after
/// the previous one's commit. Returns each send's time.
pub(super) async fn each(
    conn: &mut Conn,
    msgs: &Msgs,
    count: u64,
    bar: &Bar,
) -> anyhow::Result<(Vec<Duration>, LastSeqs)> {
    let mut times = Vec::with_capacity(count as usize);
    let mut last = LastSeqs::new();
    let mut body = Vec::new();
    for k in 0..count {
        body.clear();
        msgs.push_json(k, &mut body);
        let t = Instant::now();
        let r: SendResponse = conn
            .post("/v1/send", Bytes::copy_from_slice(&body))
            .await
            .with_context(|| format!("message {k} of {count}"))?;
        times.push(t.elapsed());
        note_seq(&mut last, &r.stream.channel, r.seq);
        bar.inc(1);
    }
    Ok((times, last))
}

/// Sends message `k` at `k / rate` seconds from now, each on its own
/// `POST /v1/send` (on a pool of kept-alive connections, at most
/// [`PACED_IN_FLIGHT_MAX`] at once), as independent agents would; records
/// when each went in `sent_at`. Returns how long each waited for its
/// commit at the sender, in no particular order.
pub(super) async fn paced(
    socket: &Path,
    msgs: Arc<Msgs>,
    count: u64,
    rate: u32,
    sent_at: Arc<Mutex<Vec<Option<std::time::Instant>>>>,
    bar: &Bar,
) -> anyhow::Result<Vec<Duration>> {
    let pool: Arc<Mutex<Vec<Conn>>> = Arc::default();
    let mut tasks: JoinSet<anyhow::Result<Duration>> = JoinSet::new();
    let mut answered = Vec::with_capacity(count as usize);
    let start = Instant::now();
    for k in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(k as f64 / f64::from(rate))).await;
        while let Some(done) = tasks.try_join_next() {
            answered.push(done??);
            bar.inc(1);
        }
        while tasks.len() >= PACED_IN_FLIGHT_MAX {
            if let Some(done) = tasks.join_next().await {
                answered.push(done??);
                bar.inc(1);
            }
        }
        let (pool, msgs, sent_at) = (pool.clone(), msgs.clone(), sent_at.clone());
        let socket = socket.to_owned();
        tasks.spawn(async move {
            let mut body = Vec::new();
            msgs.push_json(k, &mut body);
            let at = std::time::Instant::now();
            if let Ok(mut s) = sent_at.lock()
                && let Some(slot) = s.get_mut(k as usize)
            {
                *slot = Some(at);
            }
            let idle = pool.lock().ok().and_then(|mut p| p.pop());
            let mut conn = match idle {
                Some(c) => c,
                None => Conn::open(&socket).await?,
            };
            let _: SendResponse = conn
                .post("/v1/send", Bytes::from(body))
                .await
                .with_context(|| format!("message {k}"))?;
            let took = at.elapsed();
            if let Ok(mut p) = pool.lock() {
                p.push(conn);
            }
            Ok(took)
        });
    }
    while let Some(done) = tasks.join_next().await {
        answered.push(done??);
        bar.inc(1);
    }
    Ok(answered)
}

/// One NDJSON answer line, read without copying what the bench does not use.
#[derive(Deserialize)]
struct AnswerLine<'a> {
    seq: Option<u64>,
    #[serde(borrow)]
    stream: Option<StreamChannel<'a>>,
    done: Option<serde::de::IgnoredAny>,
    error: Option<serde_json::Value>,
}

/// The channel of an answer's stream.
#[derive(Deserialize)]
struct StreamChannel<'a> {
    #[serde(borrow)]
    channel: std::borrow::Cow<'a, str>,
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends messages `0..count` in one NDJSON stream to `path` (`POST
/// /v1/send/batch`, or an agent's `.../send/batch`), keeping at most
/// `window` sent but not yet answered (committed at the sender).
pub(super) async fn stream(
    client: &Client,
    path: &str,
    msgs: Arc<Msgs>,
    count: u64,
    window: usize,
    bar: &Bar,
) -> anyhow::Result<LastSeqs> {
    let window = window.max(1);
    let credit = Arc::new(Semaphore::new(window));
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(FRAMES_QUEUED_MAX);
    let producer = spawn_frames(msgs, count, window, credit.clone(), tx);
    let _producer = AbortOnDrop(producer);
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .map(|chunk| chunk.map(Frame::data));
    let body = StreamBody::new(body).boxed_unsync();
    let resp = client
        .send(Method::POST, path, Some("application/x-ndjson"), body)
        .await?;
    let status = resp.status();
    if !status.is_success() {
        let bytes = resp.into_body().collect().await?.to_bytes();
        bail!(
            "the first messages were refused: HTTP {status}: {}",
            shown(&bytes)
        );
    }
    read_answers(LineReader::new(resp.into_body()), count, &credit, bar).await
}

/// Writes messages `0..count` as NDJSON frames to `tx`, each line taking a
/// permit of `credit` (a quarter of `window`, or more if free, per frame),
/// until all are written or the body is dropped.
fn spawn_frames(
    msgs: Arc<Msgs>,
    count: u64,
    window: usize,
    credit: Arc<Semaphore>,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut k = 0u64;
        let mut frame_bytes = 0;
        while k < count {
            // Wait for a quarter window of credit (up to a frame's worth)
            // rather than send a line per answer: the API commits what
            // has arrived, so a writer that trickles gets a commit per line.
            let want = (window as u64 / 4)
                .clamp(1, LINES_PER_FRAME_MAX as u64)
                .min(count - k);
            let Ok(permit) = credit.acquire_many(want as u32).await else {
                return;
            };
            permit.forget();
            let mut n = want;
            while n < LINES_PER_FRAME_MAX as u64 && k + n < count {
                match credit.try_acquire() {
                    Ok(p) => p.forget(),
                    Err(_) => break,
                }
                n += 1;
            }
            let mut buf = Vec::with_capacity(frame_bytes);
            for j in k..k + n {
                msgs.push_json(j, &mut buf);
                buf.push(b'\n');
            }
            frame_bytes = frame_bytes.max(buf.len());
            if tx.send(Ok(Bytes::from(buf))).await.is_err() {
                return;
            }
            k += n;
        }
    })
}

/// Reads a batch send's answer `lines` for `count` messages, giving back a
/// permit of `credit` per message committed, and returns the last seq of each
/// stream.
///
/// # Errors
/// An answer line does not parse, a message is refused, or the answer ends
/// before all `count` are committed.
async fn read_answers(
    mut lines: LineReader,
    count: u64,
    credit: &Semaphore,
    bar: &Bar,
) -> anyhow::Result<LastSeqs> {
    let mut last = LastSeqs::new();
    let mut answered = 0u64;
    while let Some(line) = lines.next().await? {
        if line.is_empty() {
            continue;
        }
        let a: AnswerLine = serde_json::from_slice(line)
            .with_context(|| format!("unexpected answer line: {}", shown(line)))?;
        if let (Some(seq), Some(stream)) = (a.seq, &a.stream) {
            note_seq(&mut last, &stream.channel, seq);
            answered += 1;
            credit.add_permits(1);
            bar.inc(1);
        } else if a.done.is_some() {
            break;
        } else if let Some(e) = a.error {
            bail!("refused after {answered} of {count} were committed: {e}");
        }
    }
    if answered != count {
        bail!("the answer ended after {answered} of {count} messages");
    }
    Ok(last)
}

/// Waits until each receiver's mark of `sender`'s stream to it reaches its
/// entry in `targets`; the bar shows the marks' sum above `base`. A receiver
/// that does not answer yet (starting) counts as not there.
pub(super) async fn wait_marks(
    receivers: &[NodeProc],
    sender: &NodeProc,
    targets: &LastSeqs,
    base: u64,
    bar: &Bar,
) -> anyhow::Result<()> {
    loop {
        let mut done = true;
        let mut sum = 0u64;
        for r in receivers {
            let target = targets.get(r.id()).copied().unwrap_or(0);
            let mark = match r.client().get::<StatusResponse>("/v1/status").await {
                Ok(st) => super::status::mark_from(&st, sender.id(), sender.epoch()),
                Err(_) => 0,
            };
            sum += mark.min(target);
            done &= mark >= target;
        }
        bar.set(sum.saturating_sub(base));
        if done {
            return Ok(());
        }
        tokio::time::sleep(MARK_POLL_INTERVAL).await;
    }
}

/// The sum of every target: with `base` subtracted, the messages to wait for.
pub(super) fn total(targets: &LastSeqs) -> u64 {
    targets.values().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_json_of_the_asked_size_and_names_its_number() {
        let msgs = Msgs {
            to: vec!["a".into(), "b".into()],
            size: 40,
            tag: "l1-".into(),
            agent: false,
        };
        let mut out = Vec::new();
        msgs.push_json(7, &mut out);
        let req: mesh_api::SendRequest = serde_json::from_slice(&out).unwrap();
        assert_eq!(req.to, "b");
        assert_eq!(req.body.len(), 40);
        assert_eq!(req.msg_kind, BENCH_MSG_KIND);
        assert_eq!(msgs.number_of(&req.body), Some(7));
        assert_eq!(msgs.number_of("p1-7:xx"), None);
        let agent = Msgs {
            to: vec!["bob@a".into()],
            agent: true,
            ..msgs
        };
        out.clear();
        agent.push_json(3, &mut out);
        let req: mesh_api::AgentSendRequest = serde_json::from_slice(&out).unwrap();
        assert_eq!((req.to.as_str(), req.body.len()), ("bob@a", 40));
    }
}
