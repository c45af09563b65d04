//! One `mesh daemon` process: [`NodeProc`].

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{AddPeerRequest, EventEntry, StatusResponse, TicketResponse};
use rustix::process::{Pid, Signal, kill_process};

use crate::{
    CALL_TIMEOUT, KILL_TIMEOUT, POLL_INTERVAL, READY_POLLS_MAX, STOP_TIMEOUT, call, log_tail,
    read_journal,
};

/// Where a node's daemon runs: the address it listens on for peers, and the
/// command its `mesh` runs under (e.g. `ip netns exec NS`), if any.
#[derive(Clone, Debug)]
pub struct Placement {
    /// `--bind`; port 0 picks one at the first start (see `restart_port`).
    pub bind: SocketAddr,
    /// Words run before the `mesh` executable; it must exec it, so that
    /// signals reach the daemon.
    pub prefix: Vec<OsString>,
    /// Which port a restart listens on, when `bind` has port 0.
    pub restart_port: RestartPort,
}

/// Which port a restarted daemon listens on, for a `bind` with port 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestartPort {
    /// The harness passes the port the first start picked (`--bind IP:PORT`).
    #[default]
    Kept,
    /// The daemon is started with `--bind IP:0` every time, as a person
    /// does: it asks for the port it remembers in its data dir.
    Remembered,
    /// `--bind IP:0` with the daemon's remembered port forgotten first: a
    /// new port at every start, which its peers must learn.
    Fresh,
}

impl Default for Placement {
    /// 127.0.0.1, a port the first start picks and restarts keep, no prefix.
    fn default() -> Self {
        Placement {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            prefix: Vec::new(),
            restart_port: RestartPort::Kept,
        }
    }
}

/// What one node is.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Its name in messages (`node-0`, `alpha`).
    pub name: String,
    /// The `mesh` executable.
    pub bin: PathBuf,
    /// Its data dir (created by the daemon if missing).
    pub data: PathBuf,
    /// Where its stdout and stderr are appended.
    pub log: PathBuf,
    /// Where it runs.
    pub placement: Placement,
    /// `RUST_LOG` for the daemon.
    pub rust_log: String,
}

/// How a stopped daemon ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It was not running, or exited on SIGTERM within [`STOP_TIMEOUT`].
    Exited,
    /// It did not exit on SIGTERM in time and was killed.
    Killed,
}

/// One `mesh daemon` process and what is needed to start it again.
#[derive(Debug)]
pub struct NodeProc {
    spec: NodeSpec,
    /// Where it listens now (port 0 until its first start answered).
    addr: SocketAddr,
    client: Client,
    id: String,
    epoch: String,
    child: Option<Child>,
    paused: bool,
    starts: u32,
}

impl NodeProc {
    /// A node of `spec`, not started yet.
    pub fn new(spec: NodeSpec) -> NodeProc {
        NodeProc {
            client: Client::new(spec.data.join(mesh_api::paths::SOCKET_FILE)),
            addr: spec.placement.bind,
            spec,
            id: String::new(),
            epoch: String::new(),
            child: None,
            paused: false,
            starts: 0,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Its API client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Its control socket.
    pub fn socket(&self) -> &Path {
        self.client.socket()
    }

    /// Its node id (empty before it first answered).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its store epoch as last seen (empty before it first answered).
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// Its data dir.
    pub fn data_dir(&self) -> &Path {
        &self.spec.data
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.spec.log
    }

    /// The address it listens on for peers (port 0 until its first start
    /// answered; as of its last start).
    pub fn peer_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Listens on `bind` from its next start on (a node moved to a new IP).
    pub fn set_bind(&mut self, bind: SocketAddr) {
        self.spec.placement.bind = bind;
    }

    /// Whether its process runs (it may be paused).
    pub fn is_running(&mut self) -> bool {
        self.reap();
        self.child.is_some()
    }

    /// Whether it is stopped with SIGSTOP.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// How many times it was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Its process id, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the daemon process; it answers on its socket later
    /// ([`NodeProc::wait_ready`]).
    ///
    /// # Errors
    /// If it is running already, or cannot be started.
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        self.reap();
        if self.child.is_some() {
            bail!("{} is already running", self.spec.name);
        }
        let spec = &self.spec;
        if spec.placement.restart_port == RestartPort::Fresh {
            let remembered = spec.data.join(mesh_api::paths::LISTEN_PORT_FILE);
            match std::fs::remove_file(&remembered) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => bail!("cannot forget {}: {e}", remembered.display()),
            }
        }
        // The prefix and `setpriv` exec what follows: the child's pid is the
        // daemon's, so signals reach it directly.
        let mut argv: Vec<OsString> = spec.placement.prefix.clone();
        if pdeathsig_available() {
            argv.extend(["setpriv", "--pdeathsig", "KILL"].map(OsString::from));
        }
        argv.push(spec.bin.clone().into());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        if let Some(dir) = spec.log.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .with_context(|| format!("cannot open {}", spec.log.display()))?;
        let child = cmd
            .arg("daemon")
            .arg("--data")
            .arg(&spec.data)
            .arg("--bind")
            .arg(spec.placement.bind.to_string())
            .env("RUST_LOG", &spec.rust_log)
            .env("NO_COLOR", "1")
            .env_remove(mesh_api::paths::DATA_ENV)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("cannot share the log file")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {} daemon", spec.bin.display()))?;
        self.child = Some(child);
        self.paused = false;
        self.starts += 1;
        Ok(())
    }

    /// Polls the socket until `GET /v1/status` answers, a bounded number of
    /// times; fails at once if the process exits. Learns the node's id,
    /// epoch and (after a start on port 0) its port.
    ///
    /// # Errors
    /// If it exits, does not answer in time, or comes back as another node.
    pub async fn wait_ready(&mut self) -> anyhow::Result<StatusResponse> {
        for _ in 0..READY_POLLS_MAX {
            if !self.is_running() {
                bail!(
                    "{}'s daemon exited while starting; its log ends with:\n{}",
                    self.spec.name,
                    self.log_tail()
                );
            }
            let probe = self.client.get::<StatusResponse>("/v1/status");
            if let Ok(Ok(status)) = tokio::time::timeout(CALL_TIMEOUT, probe).await {
                self.learn(&status)?;
                return Ok(status);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        bail!(
            "{}'s daemon did not serve {} after {READY_POLLS_MAX} polls; its log ends with:\n{}",
            self.spec.name,
            self.socket().display(),
            self.log_tail()
        )
    }

    fn learn(&mut self, status: &StatusResponse) -> anyhow::Result<()> {
        let st = &status.node;
        if !self.id.is_empty() && self.id != st.node {
            bail!(
                "{} came back as {} instead of {}",
                self.spec.name,
                st.node,
                self.id
            );
        }
        self.id = st.node.clone();
        self.epoch = st.epoch.clone();
        let bind = self.spec.placement.bind;
        self.addr = bind;
        if bind.port() == 0 {
            let ip = bind.ip();
            let at = st
                .addrs
                .iter()
                .copied()
                .find(|a| (a.ip() == ip || ip.is_unspecified()) && a.port() != 0)
                .with_context(|| {
                    format!("{} lists no {ip} address: {:?}", self.spec.name, st.addrs)
                })?;
            self.addr = at;
            if self.spec.placement.restart_port == RestartPort::Kept {
                // Keep the port the daemon picked, so its peers find it again
                // after a restart.
                self.spec.placement.bind = at;
            }
        }
        Ok(())
    }

    /// Starts the daemon and waits until it answers ([`NodeProc::spawn`],
    /// then [`NodeProc::wait_ready`]).
    ///
    /// # Errors
    /// As those two.
    pub async fn start(&mut self) -> anyhow::Result<StatusResponse> {
        self.spawn()?;
        self.wait_ready().await
    }

    /// Sends SIGTERM (resuming a paused daemon first) and waits for the
    /// exit; kills the daemon if it takes longer than [`STOP_TIMEOUT`].
    ///
    /// # Errors
    /// If it cannot be signalled or reaped.
    pub async fn stop(&mut self) -> anyhow::Result<Stopped> {
        if self.paused {
            self.resume()?;
        }
        if self
            .signal_and_reap(Signal::TERM, STOP_TIMEOUT)
            .await
            .is_ok()
        {
            return Ok(Stopped::Exited);
        }
        self.kill().await?;
        Ok(Stopped::Killed)
    }

    /// `kill -9` and reap. Nothing if it is not running.
    ///
    /// # Errors
    /// If the process does not die within [`KILL_TIMEOUT`].
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.signal_and_reap(Signal::KILL, KILL_TIMEOUT).await
    }

    async fn signal_and_reap(&mut self, sig: Signal, within: Duration) -> anyhow::Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        self.signal(sig)?;
        let polls = (within.as_millis() / POLL_INTERVAL.as_millis()).max(1);
        for _ in 0..polls {
            if !self.is_running() {
                return Ok(());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        bail!("{} did not exit within {within:?}", self.spec.name)
    }

    /// SIGSTOP.
    ///
    /// # Errors
    /// If it is not running or cannot be signalled.
    pub fn pause(&mut self) -> anyhow::Result<()> {
        self.signal(Signal::STOP)?;
        self.paused = true;
        Ok(())
    }

    /// SIGCONT.
    ///
    /// # Errors
    /// If it is not running or cannot be signalled.
    pub fn resume(&mut self) -> anyhow::Result<()> {
        self.signal(Signal::CONT)?;
        self.paused = false;
        Ok(())
    }

    fn signal(&mut self, sig: Signal) -> anyhow::Result<()> {
        let pid = self
            .pid()
            .and_then(|p| i32::try_from(p).ok())
            .and_then(Pid::from_raw)
            .with_context(|| format!("{} is not running", self.spec.name))?;
        kill_process(pid, sig).with_context(|| format!("cannot signal {}", self.spec.name))?;
        Ok(())
    }

    /// Forgets the process if it has exited.
    fn reap(&mut self) {
        if let Some(child) = &mut self.child
            && !matches!(child.try_wait(), Ok(None))
        {
            self.child = None;
            self.paused = false;
        }
    }

    /// Its status.
    ///
    /// # Errors
    /// If the call fails or takes longer than [`CALL_TIMEOUT`].
    pub async fn status(&self) -> anyhow::Result<StatusResponse> {
        call(self.client.get::<StatusResponse>("/v1/status"))
            .await
            .with_context(|| format!("{} status", self.spec.name))
    }

    /// Its whole journal, paged through `GET /v1/events`.
    ///
    /// # Errors
    /// As [`read_journal`].
    pub async fn journal(&self) -> anyhow::Result<Vec<EventEntry>> {
        read_journal(&self.client).await
    }

    /// Adds `other` as a peer (`POST /v1/peers` with its ticket).
    ///
    /// # Errors
    /// If either call fails.
    pub async fn add_peer(&self, other: &NodeProc) -> anyhow::Result<()> {
        let t: TicketResponse = call(other.client.get("/v1/ticket"))
            .await
            .with_context(|| format!("{}'s ticket", other.spec.name))?;
        let req = AddPeerRequest { ticket: t.ticket };
        call(self.client.post::<serde_json::Value>("/v1/peers", &req))
            .await
            .with_context(|| format!("adding {} to {}", other.spec.name, self.spec.name))?;
        Ok(())
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.spec.log)
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL works on a stopped process too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether `setpriv --pdeathsig` can run here (looked up once).
fn pdeathsig_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("setpriv")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}
