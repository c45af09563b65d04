//! One `mesh daemon` process in a data dir of its own, and the `mesh` client
//! commands run against it, each as its own process: what a person types.
//!
//! Everything is bounded: a daemon that does not print its ticket within
//! [`READY_TIMEOUT`], a command that runs longer than [`COMMAND_TIMEOUT`] and
//! a daemon that does not exit within [`STOP_TIMEOUT`] of SIGTERM are killed
//! and reported as errors. A [`DaemonProcess`] kills its daemon when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process};

/// How long a starting daemon may take to print its ticket (debug builds on
/// two busy cores start slowly).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one client command may run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon gets to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How often a running process is checked for its exit.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// A private temp dir, removed when dropped.
pub fn temp_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::tempdir().context("cannot create a temp dir")
}

/// Parses `text` as JSON.
pub fn parse_json(text: &str) -> anyhow::Result<serde_json::Value> {
    serde_json::from_str(text).with_context(|| format!("not JSON: {text:?}"))
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Output {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Output {
    /// Whether it exited with status 0.
    pub fn ok(&self) -> bool {
        self.status.success()
    }

    /// The cursor a paging command printed on stderr as `next: CURSOR`.
    ///
    /// # Panics
    /// If it printed none (a test's check).
    #[track_caller]
    pub fn next_cursor(&self) -> String {
        self.stderr
            .lines()
            .find_map(|l| l.strip_prefix("next: "))
            .unwrap_or_else(|| panic!("no next cursor: {self:?}"))
            .to_owned()
    }
}

/// Its stdout, once `out` is seen to have exited with status 0.
///
/// # Panics
/// If it did not (a test's check), showing all it printed.
#[track_caller]
pub fn ok(out: Output) -> String {
    assert!(out.ok(), "failed: {out:?}");
    out.stdout
}

/// Checks that `out` printed nothing on stdout and each of `words` on stderr.
///
/// # Panics
/// At the first that does not hold (a test's check), showing all it printed.
#[track_caller]
pub fn assert_says(out: &Output, words: &[&str]) {
    assert!(out.stdout.is_empty(), "printed on stdout: {out:?}");
    for w in words {
        assert!(out.stderr.contains(w), "no {w:?} in: {out:?}");
    }
}

/// A loopback address on a port the OS picks.
pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Runs `bin` with `args` (and `stdin` written to it), killing it after
/// [`COMMAND_TIMEOUT`].
pub fn run(bin: &Path, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    run_command(cmd, stdin)
}

/// Runs `cmd` (and writes `stdin` to it), killing it after [`COMMAND_TIMEOUT`].
/// Logs and backtraces are off, so stderr holds what a user sees.
pub fn run_command(mut cmd: Command, stdin: Option<&str>) -> anyhow::Result<Output> {
    for var in ["RUST_LOG", "RUST_BACKTRACE", "RUST_LIB_BACKTRACE"] {
        cmd.env_remove(var);
    }
    run_command_as_is(cmd, stdin)
}

/// As [`run_command`], with the environment `cmd` was given (e.g.
/// `RUST_BACKTRACE=1`, to see that a user's error still prints one line).
pub fn run_command_as_is(mut cmd: Command, stdin: Option<&str>) -> anyhow::Result<Output> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {what}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .context("cannot write the command's stdin")?;
    }
    let stdout = reader(child.stdout.take());
    let stderr = reader(child.stderr.take());
    let status = wait_bounded(&mut child, COMMAND_TIMEOUT).context(what)?;
    let collect = |h: std::thread::JoinHandle<String>| h.join().unwrap_or_default();
    Ok(Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    })
}

/// Reads a pipe to its end on a thread.
fn reader(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut text);
        }
        text
    })
}

/// Waits for `child` to exit, killing it after `timeout`.
fn wait_bounded(child: &mut Child, timeout: Duration) -> anyhow::Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("did not exit within {timeout:?}; killed");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// The lines a process prints on stdout, as they come.
pub struct LineReader {
    lines: mpsc::Receiver<String>,
}

impl LineReader {
    /// Reads `pipe` line by line on a thread.
    pub fn new(pipe: ChildStdout) -> Self {
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        LineReader { lines }
    }

    /// The next line, waiting at most until `deadline`; `None` when the
    /// process closed its stdout.
    pub fn next_until(&self, deadline: Instant) -> anyhow::Result<Option<String>> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => Ok(Some(line)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(None),
            Err(mpsc::RecvTimeoutError::Timeout) => bail!("no line within the time allowed"),
        }
    }
}

/// A `mesh daemon` process.
pub struct DaemonProcess {
    bin: PathBuf,
    data: PathBuf,
    child: Child,
    node: String,
    ticket: String,
}

impl DaemonProcess {
    /// Runs `bin daemon --data data --bind bind` and waits until it has
    /// printed its ticket (it serves its socket from then on).
    pub fn start(bin: &Path, data: &Path, bind: SocketAddr) -> anyhow::Result<Self> {
        Self::start_with_env(bin, data, bind, &[])
    }

    /// As [`DaemonProcess::start`], bound to [`loopback`].
    pub fn start_local(bin: &Path, data: &Path) -> anyhow::Result<Self> {
        Self::start(bin, data, loopback())
    }

    /// As [`DaemonProcess::start`], with `env` set for the daemon.
    pub fn start_with_env(
        bin: &Path,
        data: &Path,
        bind: SocketAddr,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stderr(Stdio::inherit());
        Self::spawn(cmd, bin, data, bind, &[])
    }

    /// As [`DaemonProcess::start_local`] with `args` after the daemon's own,
    /// `RUST_LOG` and `env` set, and its stderr (the log) written to `log`.
    pub fn start_logging_to(
        bin: &Path,
        data: &Path,
        args: &[&str],
        rust_log: &str,
        env: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let file = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.env("RUST_LOG", rust_log)
            .envs(env.iter().copied())
            .stderr(file);
        Self::spawn(cmd, bin, data, loopback(), args)
    }

    /// Runs `cmd` (the executable `bin`, its env and stderr set) as
    /// `daemon --data data --bind bind args...` and waits for its ticket.
    fn spawn(
        mut cmd: Command,
        bin: &Path,
        data: &Path,
        bind: SocketAddr,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let bind = bind.to_string();
        let mut child = cmd
            .args(["daemon", "--data"])
            .arg(data)
            .args(["--bind", &bind])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {} daemon", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let mut d = DaemonProcess {
            bin: bin.to_owned(),
            data: data.to_owned(),
            child,
            node: String::new(),
            ticket: String::new(),
        };
        let lines = LineReader::new(stdout);
        let deadline = Instant::now() + READY_TIMEOUT;
        while d.ticket.is_empty() {
            let line = lines
                .next_until(deadline)
                .context("the daemon did not print its ticket")?
                .context("the daemon exited before printing its ticket")?;
            if let Some(id) = line.strip_prefix("node") {
                d.node = id.trim().to_owned();
            }
            if let Some(t) = line.strip_prefix("ticket") {
                d.ticket = t.trim().to_owned();
            }
        }
        Ok(d)
    }

    /// The node id it printed.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The ticket it printed.
    pub fn ticket(&self) -> &str {
        &self.ticket
    }

    /// Its data dir.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// The address its ticket names (where it listens for peers), so a
    /// restart can bind the same one.
    pub fn peer_addr(&self) -> anyhow::Result<SocketAddr> {
        let t: mesh_protocol::NodeTicket = self
            .ticket
            .parse()
            .with_context(|| format!("not a ticket: {}", self.ticket))?;
        t.addrs
            .first()
            .copied()
            .context("the ticket names no address")
    }

    /// Waits (at most [`STOP_TIMEOUT`]) until the daemon has exited by itself.
    pub fn wait_exit(mut self) -> anyhow::Result<ExitStatus> {
        wait_bounded(&mut self.child, STOP_TIMEOUT).context("the daemon's exit")
    }

    /// Its control socket.
    pub fn socket(&self) -> PathBuf {
        self.data.join("mesh.sock")
    }

    /// The value of the sample `name` (a counter or gauge without labels)
    /// in this daemon's `GET /metrics` now; `None` if it is not there.
    ///
    /// # Panics
    /// If the daemon does not answer.
    pub fn metric(&self, name: &str) -> Option<u64> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let client = mesh_api::client::Client::new(self.socket());
        let text = rt
            .block_on(client.get_text("/metrics"))
            .expect("the daemon answers /metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Runs `mesh --data DIR args...` against this daemon.
    pub fn mesh(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.mesh_stdin(args, None)
    }

    /// As [`DaemonProcess::mesh`], with `stdin` written to the command.
    pub fn mesh_stdin(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
        let data = self.data.to_str().context("the data dir is not UTF-8")?;
        let mut all = vec!["--data", data];
        all.extend_from_slice(args);
        run(&self.bin, &all, stdin)
    }

    /// Polls `mesh message ID --json` on this daemon until its state is
    /// `state` (at most `within`); answers the last answer.
    ///
    /// # Panics
    /// If the command fails, or the state is not reached in time.
    pub fn wait_message_state(&self, id: &str, state: &str, within: Duration) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let out = self
                .mesh(&["message", id, "--json"])
                .expect("mesh message runs");
            let st = parse_json(&ok(out)).expect("mesh message --json prints JSON");
            if st["state"] == state {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "message {id} is {st}, not {state}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts `mesh --data DIR args...` without waiting; its stdout comes as lines.
    pub fn spawn_mesh(&self, args: &[&str]) -> anyhow::Result<(Child, LineReader)> {
        let mut child = Command::new(&self.bin)
            .arg("--data")
            .arg(&self.data)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot run mesh {args:?}"))?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        Ok((child, LineReader::new(stdout)))
    }

    /// Sends SIGTERM and waits (at most [`STOP_TIMEOUT`]) for the exit.
    pub fn terminate(mut self) -> anyhow::Result<ExitStatus> {
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(Pid::from_raw)
            .context("the daemon's pid does not fit")?;
        kill_process(pid, Signal::TERM).context("cannot signal the daemon")?;
        wait_bounded(&mut self.child, STOP_TIMEOUT).context("the daemon after SIGTERM")
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
