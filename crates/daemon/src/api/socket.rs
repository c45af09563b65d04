//! The control socket: binding it safely and telling who is on the other end.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::time::Sleep;

use super::gate::{ConnState, Gate};

/// How long probing an existing socket file for a live daemon may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The socket file's mode: owner read/write only.
const SOCKET_MODE: u32 = 0o600;

/// An agent socket's mode: anyone may connect, the peer's uid decides.
const AGENT_SOCKET_MODE: u32 = 0o666;

/// Why the control socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// A daemon is answering on the socket already.
    #[error("another mesh daemon is running on {path}; stop it first or use another --data dir")]
    AnotherDaemon {
        /// The socket path.
        path: PathBuf,
    },
    /// Something that is not a socket is in the way.
    #[error("{path} exists and is not a socket; move it aside")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Binding, removing a stale socket or setting its mode failed.
    #[error("cannot bind the control socket {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A bound control socket, mode 0600, ready to serve.
#[derive(Debug)]
pub struct ApiSocket {
    pub(super) listener: UnixListener,
    pub(super) path: PathBuf,
    /// Device and inode of the socket file we made, so shutdown removes only ours.
    pub(super) ino: (u64, u64),
}

impl ApiSocket {
    /// Binds `path`: a stale socket left by a dead daemon is removed, a live
    /// one (a connect succeeds) is [`BindError::AnotherDaemon`].
    pub async fn bind(path: &Path) -> Result<ApiSocket, BindError> {
        Self::bind_with_mode(path, SOCKET_MODE).await
    }

    /// Binds an agent's socket at `path`, as [`ApiSocket::bind`] but with
    /// mode 0666: who may act as the agent is decided by the peer's uid
    /// (SO_PEERCRED), which a process cannot forge, so that an agent of
    /// another uid than the daemon's can connect at all (a daemon that is
    /// not root cannot give a socket to another uid).
    pub(crate) async fn bind_agent(path: &Path) -> Result<ApiSocket, BindError> {
        Self::bind_with_mode(path, AGENT_SOCKET_MODE).await
    }

    async fn bind_with_mode(path: &Path, mode: u32) -> Result<ApiSocket, BindError> {
        let io = |source| BindError::Io {
            path: path.to_owned(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(BindError::NotASocket {
                    path: path.to_owned(),
                });
            }
            Ok(_) => {
                match tokio::time::timeout(PROBE_TIMEOUT, UnixStream::connect(path)).await {
                    // A timeout means a listener whose backlog is full: alive.
                    Ok(Ok(_)) | Err(_) => {
                        return Err(BindError::AnotherDaemon {
                            path: path.to_owned(),
                        });
                    }
                    Ok(Err(e)) => {
                        tracing::info!(path = %path.display(), "removing a stale control socket ({e})");
                        std::fs::remove_file(path).map_err(io)?;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let listener = UnixListener::bind(path).map_err(io)?;
        // The data dir is 0700 already; this keeps the socket private even if
        // the dir is opened up later.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io)?;
        let meta = std::fs::symlink_metadata(path).map_err(io)?;
        Ok(ApiSocket {
            listener,
            path: path.to_owned(),
            ino: (meta.dev(), meta.ino()),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file if it is still the one this bound.
    pub(super) fn remove_file(path: &Path, ino: (u64, u64)) {
        if let Ok(meta) = std::fs::symlink_metadata(path)
            && (meta.dev(), meta.ino()) == ino
            && let Err(e) = std::fs::remove_file(path)
        {
            tracing::warn!(path = %path.display(), "cannot remove the control socket: {e}");
        }
    }
}

/// Who is connected, from SO_PEERCRED; `None` when the kernel would not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// The connecting process's uid.
    pub uid: Option<u32>,
    /// The connecting process's pid.
    pub pid: Option<i32>,
}

/// A socket's listener: accepts every connection at once and hands it to
/// its [`Gate`], which decides whether it is served. The control and agent
/// sockets listen on a [`UnixListener`], the dashboard on a TCP one.
pub(super) struct Bounded<L = UnixListener> {
    pub(super) listener: L,
    pub(super) gate: Arc<Gate>,
    /// Turns true when connections still open must be cut (see [`Conn`]).
    pub(super) abort: watch::Receiver<bool>,
    /// For an agent's socket: where its open connections are counted.
    pub(super) activity: Option<Arc<crate::agents::Activity>>,
}

/// A connection, with its state in its socket's [`Gate`] (which closes it
/// when it sends no request in time, or to make room).
///
/// Once the server's abort signal turns true, every read and write fails
/// with `ConnectionAborted`, so a connection whose client stopped reading —
/// its socket full, its response stuck mid-write — cannot hold a stopping
/// daemon forever: the graceful shutdown lets it finish for a grace period,
/// then cuts it.
pub(super) struct Conn<S = UnixStream> {
    stream: S,
    conn: Arc<ConnState>,
    /// Wakes the reader at the connection's head or idle deadline.
    deadline: Option<Pin<Box<Sleep>>>,
    abort: Abort,
    /// Counts the connection as its agent's while it is open.
    _open: Option<crate::agents::OpenGuard>,
}

/// A connection's view of the abort signal.
struct Abort {
    /// Resolves when the signal turns true (or the server is gone).
    signal: Pin<Box<dyn Future<Output = ()> + Send>>,
    fired: bool,
}

impl Abort {
    fn new(mut rx: watch::Receiver<bool>) -> Self {
        Abort {
            signal: Box::pin(async move {
                // An error means the sender is gone: the server has ended.
                let _ = rx.wait_for(|abort| *abort).await;
            }),
            fired: false,
        }
    }

    /// `Err` once the connection must be cut; registers `cx` otherwise.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.fired && self.signal.as_mut().poll(cx).is_ready() {
            self.fired = true;
        }
        if self.fired {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the daemon is stopping and this connection did not finish in time",
            ));
        }
        Ok(())
    }
}

impl<L: Listener> Listener for Bounded<L> {
    type Io = Conn<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Conn<L::Io>, Self::Addr) {
        let (stream, addr) = Listener::accept(&mut self.listener).await;
        (
            Conn {
                stream,
                conn: self.gate.accepted(),
                deadline: None,
                abort: Abort::new(self.abort.clone()),
                _open: self.activity.as_ref().map(|a| a.open()),
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.abort.check(cx)?;
        let this = &mut *self;
        this.conn.closed(cx)?;
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if read.is_pending() {
            this.conn.waited(&mut this.deadline, cx)?;
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.abort.check(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.abort.check(cx)?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.abort.check(cx)?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// What a request knows of its connection: who is on the other end, and
/// the connection's state in its socket's gate.
#[derive(Clone)]
pub(crate) struct Peer {
    pub(crate) cred: PeerCred,
    pub(crate) conn: Arc<ConnState>,
}

impl<L> Connected<IncomingStream<'_, Bounded<L>>> for Peer
where
    L: Listener,
    L::Io: Credentials,
{
    fn connect_info(stream: IncomingStream<'_, Bounded<L>>) -> Self {
        let conn = &stream.io();
        Peer {
            cred: conn.stream.credentials(),
            conn: conn.conn.clone(),
        }
    }
}

/// Who is on the other end of a stream, as far as the kernel says.
pub(crate) trait Credentials {
    /// The peer's uid and pid, where known.
    fn credentials(&self) -> PeerCred;
}

impl Credentials for UnixStream {
    fn credentials(&self) -> PeerCred {
        peer_cred(self)
    }
}

/// A TCP peer (the dashboard's) has no uid: it is let in by its token.
impl Credentials for tokio::net::TcpStream {
    fn credentials(&self) -> PeerCred {
        PeerCred {
            uid: None,
            pid: None,
        }
    }
}

fn peer_cred(stream: &UnixStream) -> PeerCred {
    match stream.peer_cred() {
        Ok(c) => PeerCred {
            uid: Some(c.uid()),
            pid: c.pid(),
        },
        Err(e) => {
            tracing::warn!("cannot read the peer credentials of a connection: {e}");
            PeerCred {
                uid: None,
                pid: None,
            }
        }
    }
}

/// The daemon's effective uid.
pub fn daemon_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}
