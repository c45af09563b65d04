//! A small HTTP/1.1 client for the node's Unix socket: what the CLI uses.
//!
//! One connection per request (a Unix socket connect is cheap). JSON in and
//! out; API errors come back as [`ClientError::Api`] with the server's code
//! and message; response lines (NDJSON, Server-Sent Events) can be streamed.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

use crate::error::{ErrorBody, Fault};

/// The largest whole response read, in bytes.
pub const RESPONSE_BYTES_MAX: usize = 64 << 20;
/// The longest line of a streamed response, in bytes.
pub const LINE_BYTES_MAX: usize = 8 << 20;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error(
        "the mesh daemon is not running (no daemon answers on {path}); start it with `mesh daemon`"
    )]
    NotRunning {
        /// The socket tried.
        path: PathBuf,
    },
    /// The socket exists but may not be used, or another OS error.
    #[error("cannot connect to the mesh daemon at {path}: {source}")]
    Connect {
        /// The socket tried.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The connection failed mid-request.
    #[error("the connection to the mesh daemon failed: {0}")]
    Http(String),
    /// The daemon answered with an error.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable error code, e.g. `unknown_peer`.
        code: String,
        /// Who is at fault (from the answer, else from its status).
        fault: Fault,
        /// The daemon's message.
        message: String,
    },
    /// The answer was not what the API promises.
    #[error("unexpected answer from the mesh daemon: {0}")]
    BadResponse(String),
}

impl ClientError {
    /// Who is at fault: the daemon's word for an error answer; a daemon
    /// that cannot be reached is unavailable; an answer the API does not
    /// promise is a bug.
    pub fn fault(&self) -> Fault {
        match self {
            ClientError::Api { fault, .. } => *fault,
            ClientError::BadResponse(_) => Fault::Bug,
            ClientError::NotRunning { .. } | ClientError::Connect { .. } | ClientError::Http(_) => {
                Fault::Unavailable
            }
        }
    }
}

/// `text` escaped for use as one path segment or one query value of a URL:
/// every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b))
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A client of one node's socket (or of one agent's socket).
#[derive(Clone, Debug)]
pub struct Client {
    socket: PathBuf,
    /// Sent as [`crate::AGENT_HEADER`] with every request.
    agent: Option<String>,
}

/// A request body.
type ReqBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

impl Client {
    /// A client of the socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Client {
            socket: socket.into(),
            agent: None,
        }
    }

    /// A client of agent `agent`'s socket at `socket`: every request says
    /// which agent it means to act as, and the daemon refuses it
    /// (`unverified_sender`) if the socket is another agent's.
    pub fn for_agent(socket: impl Into<PathBuf>, agent: &str) -> Self {
        Client {
            socket: socket.into(),
            agent: Some(agent.to_owned()),
        }
    }

    /// The agent this client acts as, if any.
    pub fn agent(&self) -> Option<&str> {
        self.agent.as_deref()
    }

    /// The socket this client uses.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one request and returns the response head and body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: ReqBody,
    ) -> Result<hyper::Response<Incoming>, ClientError> {
        let stream = UnixStream::connect(&self.socket).await.map_err(|source| {
            use std::io::ErrorKind::*;
            match source.kind() {
                NotFound | ConnectionRefused => ClientError::NotRunning {
                    path: self.socket.clone(),
                },
                _ => ClientError::Connect {
                    path: self.socket.clone(),
                    source,
                },
            }
        })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        // The connection's own errors reach the request as its error.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "localhost");
        if let Some(ct) = content_type {
            req = req.header(hyper::header::CONTENT_TYPE, ct);
        }
        if let Some(agent) = &self.agent {
            req = req.header(crate::AGENT_HEADER, agent.as_str());
        }
        let req = req
            .body(body)
            .map_err(|e| ClientError::Http(format!("bad request {path}: {e}")))?;
        sender
            .send_request(req)
            .await
            .map_err(|e| ClientError::Http(e.to_string()))
    }

    /// Sends a request with an optional JSON body and decodes a JSON answer;
    /// an error status becomes [`ClientError::Api`].
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T, ClientError> {
        let (status, bytes) = self.raw(method, path, body).await?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::BadResponse(format!("{path}: {e}")))
    }

    /// Sends a request with an optional JSON body; returns the status and the
    /// whole body, whatever the status.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let (ct, body) =
            match body {
                Some(b) => (
                    Some("application/json"),
                    Bytes::from(serde_json::to_vec(b).map_err(|e| {
                        ClientError::Http(format!("cannot encode the request: {e}"))
                    })?),
                ),
                None => (None, Bytes::new()),
            };
        self.raw_bytes(method, path, ct, body).await
    }

    /// Sends `body` as is; returns the status and the whole body.
    pub async fn raw_bytes(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let body = Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync();
        let resp = self.send(method, path, content_type, body).await?;
        let status = resp.status();
        let bytes = http_body_util::Limited::new(resp.into_body(), RESPONSE_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| ClientError::Http(format!("reading the answer failed: {e}")))?
            .to_bytes();
        Ok((status, bytes))
    }

    /// `GET path`, JSON answer.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.json(Method::GET, path, None::<&()>).await
    }

    /// `GET path`, the answer as text (e.g. `/metrics`); an error status
    /// becomes [`ClientError::Api`].
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let (status, bytes) = self.raw(Method::GET, path, None::<&()>).await?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        String::from_utf8(bytes.to_vec())
            .map_err(|_| ClientError::BadResponse(format!("{path}: not UTF-8")))
    }

    /// `POST path` with a JSON body, JSON answer.
    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T, ClientError> {
        self.json(Method::POST, path, Some(body)).await
    }

    /// `PUT path` with a JSON body, JSON answer.
    pub async fn put<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T, ClientError> {
        self.json(Method::PUT, path, Some(body)).await
    }

    /// `DELETE path`, JSON answer.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.json(Method::DELETE, path, None::<&()>).await
    }

    /// Sends a streamed body (e.g. NDJSON lines as they are produced) and
    /// returns the answer's lines as they arrive; an error status becomes
    /// [`ClientError::Api`].
    pub async fn stream_lines<S>(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: S,
    ) -> Result<Lines, ClientError>
    where
        S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        use futures_util::StreamExt as _;
        let body = StreamBody::new(body.map(|r| r.map(Frame::data))).boxed_unsync();
        let resp = self.send(method, path, Some(content_type), body).await?;
        Lines::from_response(resp).await
    }

    /// `GET path` and return the answer's lines as they arrive (for NDJSON and SSE).
    pub async fn get_lines(&self, path: &str) -> Result<Lines, ClientError> {
        let body = Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed_unsync();
        let resp = self.send(Method::GET, path, None, body).await?;
        Lines::from_response(resp).await
    }

    /// Opens `GET path` (e.g. `/v1/subscribe?after=…`) as Server-Sent Events.
    pub async fn subscribe(&self, path: &str) -> Result<SseStream, ClientError> {
        Ok(SseStream {
            lines: self.get_lines(path).await?,
        })
    }
}

fn api_error(status: StatusCode, bytes: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(b) => ClientError::Api {
            status: status.as_u16(),
            code: b.error.code,
            fault: b
                .error
                .fault
                .unwrap_or_else(|| Fault::from_status(status.as_u16())),
            message: b.error.message,
        },
        Err(_) => ClientError::Api {
            status: status.as_u16(),
            code: "unknown".into(),
            fault: Fault::from_status(status.as_u16()),
            message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
        },
    }
}

/// The lines of a streamed answer.
pub struct Lines {
    body: Incoming,
    buf: Vec<u8>,
    done: bool,
}

impl Lines {
    async fn from_response(resp: hyper::Response<Incoming>) -> Result<Lines, ClientError> {
        let status = resp.status();
        if !status.is_success() {
            let bytes = http_body_util::Limited::new(resp.into_body(), RESPONSE_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| ClientError::Http(format!("reading the answer failed: {e}")))?
                .to_bytes();
            return Err(api_error(status, &bytes));
        }
        Ok(Lines {
            body: resp.into_body(),
            buf: Vec::new(),
            done: false,
        })
    }

    /// The next line without its line end; `None` when the answer ends.
    pub async fn next_line(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return String::from_utf8(line)
                    .map(Some)
                    .map_err(|_| ClientError::BadResponse("a line is not UTF-8".into()));
            }
            if self.buf.len() > LINE_BYTES_MAX {
                return Err(ClientError::BadResponse(format!(
                    "a line is longer than {LINE_BYTES_MAX} bytes"
                )));
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let rest = std::mem::take(&mut self.buf);
                return String::from_utf8(rest)
                    .map(Some)
                    .map_err(|_| ClientError::BadResponse("a line is not UTF-8".into()));
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(ClientError::Http(e.to_string())),
            }
        }
    }
}

/// One Server-Sent Event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (`message` when absent).
    pub event: String,
    /// The `id:` field, if any.
    pub id: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// A Server-Sent Events stream.
pub struct SseStream {
    lines: Lines,
}

impl SseStream {
    /// The next event; `None` when the stream ends.
    pub async fn next(&mut self) -> Result<Option<SseEvent>, ClientError> {
        let mut ev = SseEvent::default();
        let mut fields = 0usize;
        let mut data_lines = 0usize;
        let finish = |mut ev: SseEvent| {
            if ev.event.is_empty() {
                ev.event = "message".into();
            }
            ev
        };
        loop {
            let Some(line) = self.lines.next_line().await? else {
                return Ok((fields > 0).then(|| finish(ev)));
            };
            if line.is_empty() {
                if fields > 0 {
                    return Ok(Some(finish(ev)));
                }
                continue;
            }
            if line.starts_with(':') {
                // A comment (keep-alive).
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line.as_str(), ""),
            };
            fields += 1;
            match field {
                "event" => ev.event = value.to_owned(),
                "id" => ev.id = Some(value.to_owned()),
                "data" => {
                    if data_lines > 0 {
                        ev.data.push('\n');
                    }
                    ev.data.push_str(value);
                    data_lines += 1;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A test fails by panicking.
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_says_the_daemon_is_not_running_with_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("mesh.sock");
        let err = Client::new(&path)
            .get::<serde_json::Value>("/v1/status")
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ClientError::NotRunning { .. }), "{text}");
        assert!(text.contains("not running") && text.contains(&path.display().to_string()));
        assert!(!text.contains('\n'));
    }

    #[tokio::test]
    async fn a_dead_socket_file_says_the_daemon_is_not_running() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("mesh.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let err = Client::new(&path)
            .get::<serde_json::Value>("/v1/status")
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::NotRunning { .. }), "{err}");
        assert_eq!(err.fault(), Fault::Unavailable);
    }

    #[test]
    fn a_path_segment_keeps_ids_and_cursors_and_escapes_the_rest() {
        let id = "8f46723240abcdef";
        assert_eq!(path_segment(id), id);
        assert_eq!(path_segment("a/b c?d&e"), "a%2Fb%20c%3Fd%26e");
        assert_eq!(path_segment("é"), "%C3%A9");
    }
}

/// What came of waiting for the reply to an agent's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The reply: a message in the agent's inbox that answers it.
    Answer(crate::InboxEntry),
    /// It was bounced: the recipient node has no such agent.
    Bounced(crate::InboxEntry),
    /// Nothing came in time (a late reply still lands in the inbox).
    TimedOut,
}

/// The most seconds one inbox wait asks the daemon for (its limit).
pub const INBOX_WAIT_SECS_MAX: u64 = 600;

/// Waits (at most `timeout`) for the reply to `sent`, a message `agent`
/// sent through `c` (its socket): the first entry of its inbox after the
/// message that answers it, or its bounce. Each round is a long poll
/// that returns as soon as an entry commits.
///
/// # Errors
/// What the daemon refused or could not be asked.
pub async fn wait_reply(
    c: &Client,
    agent: &str,
    sent: &crate::AgentSendResponse,
    timeout: std::time::Duration,
) -> Result<Reply, ClientError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut after = sent.cursor.clone();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let secs = left.as_secs().min(INBOX_WAIT_SECS_MAX);
        // Bounces are inbox entries too: look at every entry, not only replies.
        let path = format!(
            "/v1/agents/{}/inbox?after={}&limit=100&wait={secs}",
            path_segment(agent),
            path_segment(&after)
        );
        let page: crate::InboxPage = c.get(&path).await?;
        for e in page.entries {
            if e.kind == "message" && e.in_reply_to.as_deref() == Some(sent.id.as_str()) {
                return Ok(Reply::Answer(e));
            }
            if e.kind == "bounce" && e.id.as_deref() == Some(sent.id.as_str()) {
                return Ok(Reply::Bounced(e));
            }
        }
        after = page.next;
        if secs == 0 || tokio::time::Instant::now() >= deadline {
            return Ok(Reply::TimedOut);
        }
    }
}
