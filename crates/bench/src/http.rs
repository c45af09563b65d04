//! What the bench needs beyond [`mesh_api::client::Client`]: one kept-alive
//! connection for request after request (as an agent library would hold
//! one), and a line reader that does not copy the rest of its buffer per line.

use std::path::Path;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, header};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use mesh_api::client::LINE_BYTES_MAX;

/// Bytes of an error answer shown in a message.
const ERROR_SHOWN_BYTES_MAX: usize = 300;

/// One HTTP/1.1 connection to a node's socket, reused for every request.
pub(super) struct Conn {
    sender: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Conn {
    pub(super) async fn open(socket: &Path) -> anyhow::Result<Conn> {
        let stream = UnixStream::connect(socket)
            .await
            .with_context(|| format!("cannot connect to {}", socket.display()))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake on the node's socket failed")?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender, task })
    }

    /// `POST path` with a JSON body; the decoded JSON answer.
    pub(super) async fn post<T: DeserializeOwned>(
        &mut self,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<T> {
        self.sender
            .ready()
            .await
            .context("the node closed the connection")?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .context("cannot build the request")?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .context("the request failed")?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("reading the answer failed")?
            .to_bytes();
        if !status.is_success() {
            bail!("{path}: HTTP {status}: {}", shown(&bytes));
        }
        serde_json::from_slice(&bytes).with_context(|| format!("{path}: unexpected answer"))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The start of an answer, as text, for an error message.
pub(super) fn shown(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(ERROR_SHOWN_BYTES_MAX)]).into_owned()
}

/// The lines of a streamed answer.
pub(super) struct LineReader {
    body: Incoming,
    buf: Vec<u8>,
    /// Where the next line starts in `buf`.
    pos: usize,
    done: bool,
}

impl LineReader {
    pub(super) fn new(body: Incoming) -> LineReader {
        LineReader {
            body,
            buf: Vec::new(),
            pos: 0,
            done: false,
        }
    }

    /// The next line without its `\n`; `None` at the end of the answer.
    pub(super) async fn next(&mut self) -> anyhow::Result<Option<&[u8]>> {
        loop {
            if let Some(i) = self.buf[self.pos..].iter().position(|&b| b == b'\n') {
                let (start, end) = (self.pos, self.pos + i);
                self.pos = end + 1;
                return Ok(Some(&self.buf[start..end]));
            }
            if self.buf.len() - self.pos > LINE_BYTES_MAX {
                bail!("an answer line is longer than {LINE_BYTES_MAX} bytes");
            }
            if self.done {
                if self.pos < self.buf.len() {
                    let start = self.pos;
                    self.pos = self.buf.len();
                    return Ok(Some(&self.buf[start..]));
                }
                return Ok(None);
            }
            // Keep only the unread part before reading more.
            self.buf.drain(..self.pos);
            self.pos = 0;
            match self.body.frame().await {
                None => self.done = true,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => bail!("reading the answer failed: {e}"),
            }
        }
    }
}
