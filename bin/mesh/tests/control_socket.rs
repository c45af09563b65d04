//! The control socket under a leaky local client: connections that never
//! finish a request, or that hold every place, do not keep `mesh status`
//! out, and the ones that send nothing are closed by the timeout.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use mesh_tests::daemon::{DaemonProcess, parse_json, temp_dir};

/// Half-open connections the first test holds (the count).
const HALF_OPEN: usize = 2000;
/// `[api] request_head_timeout_ms` of the first test's daemon.
const HEAD_TIMEOUT: Duration = Duration::from_millis(3000);
/// The longest `mesh status` may take while the socket is flooded.
const STATUS_WITHIN: Duration = Duration::from_secs(1);

fn mesh_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_mesh"))
}

fn start(config: &str) -> (tempfile::TempDir, DaemonProcess) {
    let tmp = temp_dir().unwrap();
    let data = tmp.path().join("d");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("config.toml"), config).unwrap();
    let d = DaemonProcess::start_local(mesh_bin(), &data).unwrap();
    (tmp, d)
}

/// Connects to `socket`, failing the test with the reason if this process
/// is out of files (the test needs one per connection).
fn connect(socket: &Path) -> UnixStream {
    UnixStream::connect(socket).unwrap_or_else(|e| {
        panic!(
            "cannot open a connection to {} ({e}); this test holds {HALF_OPEN} at once: \
             raise `ulimit -n`",
            socket.display()
        )
    })
}

/// Runs `mesh status --json` and returns how long it took; fails the test
/// if it did not answer.
fn timed_status(d: &DaemonProcess) -> Duration {
    let t = Instant::now();
    let out = d.mesh(&["status", "--json"]).unwrap();
    let took = t.elapsed();
    assert!(out.ok(), "mesh status failed while flooded: {out:?}");
    let v = parse_json(&out.stdout).unwrap();
    assert_eq!(v["node"], d.node(), "{v}");
    took
}

/// A whole HTTP/1.1 request on `stream`, its response read to its end
/// (`Content-Length` bytes after the head); returns the status line and
/// the body.
fn request(stream: &mut UnixStream, method: &str, path: &str, close: bool) -> (String, String) {
    let connection = if close { "close" } else { "keep-alive" };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: mesh\r\nConnection: {connection}\r\n\r\n"
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed before a whole response: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or_else(|| panic!("no content-length in {head}"));
            if got.len() >= end + 4 + len {
                let status = head.lines().next().unwrap().to_owned();
                let body = text[end + 4..end + 4 + len].to_owned();
                return (status, body);
            }
        }
    }
}

/// The value of the metric sample `name` (with its labels) in `text`.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

/// Waits until the daemon closes `stream` (a read sees the end or an
/// error) or `deadline` passes; whether it was closed.
fn closed_by(mut stream: &UnixStream, deadline: Instant) -> bool {
    stream.set_nonblocking(false).unwrap();
    let mut b = [0u8; 64];
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return false;
        };
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match stream.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
}

/// Whether the daemon has closed `stream` already (a read sees the end or an error).
fn closed(mut stream: &UnixStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut b = [0u8; 64];
    match stream.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

#[test]
fn two_thousand_half_open_connections_do_not_keep_status_out_and_are_closed_by_the_timeout() {
    let (_tmp, d) = start(&format!(
        "[api]\nrequest_head_timeout_ms = {}\n",
        HEAD_TIMEOUT.as_millis()
    ));
    let socket = d.socket();
    let opened = Instant::now();
    let half: Vec<UnixStream> = (0..HALF_OPEN)
        .map(|_| {
            let mut s = connect(&socket);
            // Half a request line, then nothing.
            s.write_all(b"GET /v1/stat").unwrap();
            s
        })
        .collect();
    // Throughout the time they are held open, status answers at once.
    let mut answered = 0;
    while opened.elapsed() < HEAD_TIMEOUT.mul_f32(0.8) {
        let took = timed_status(&d);
        assert!(
            took < STATUS_WITHIN,
            "mesh status took {took:?} with {HALF_OPEN} half-open connections"
        );
        answered += 1;
    }
    assert!(answered >= 2, "status answered only {answered} times");
    // They were still held then: this is not a daemon that drops them all.
    if opened.elapsed() < HEAD_TIMEOUT {
        let open = half.iter().take(50).filter(|s| !closed(s)).count();
        assert!(
            open > 0 || opened.elapsed() >= HEAD_TIMEOUT,
            "the daemon closed the half-open connections before their timeout"
        );
    }
    // Then the timeout closes every one of them.
    let deadline = opened + HEAD_TIMEOUT + Duration::from_secs(20);
    let open = half.iter().filter(|s| !closed_by(s, deadline)).count();
    assert_eq!(
        open,
        0,
        "{open} of {HALF_OPEN} half-open connections still open {:?} after they were opened",
        opened.elapsed()
    );
    let (status, metrics) = request(&mut connect(&socket), "GET", "/metrics", true);
    assert!(status.contains(" 200 "), "{status}");
    let timed_out = sample(
        &metrics,
        "mesh_api_connections_closed_total{reason=\"head_timeout\"}",
    );
    assert!(
        timed_out >= HALF_OPEN as u64,
        "{timed_out} closed by the head timeout\n{metrics}"
    );
}

#[test]
fn a_socket_with_every_place_held_answers_503_at_once_and_status_from_its_reserve() {
    let (_tmp, d) = start("[api]\nidle_timeout_ms = 600000\n");
    let socket = d.socket();
    // Every place taken by a connection that made a request and stays idle.
    let mut held: Vec<UnixStream> = (0..mesh_daemon::api::CONNECTIONS_MAX)
        .map(|_| {
            let mut s = connect(&socket);
            let (status, _) = request(&mut s, "GET", "/v1/ticket", false);
            assert!(status.contains(" 200 "), "{status}");
            s
        })
        .collect();
    // A new client is told at once, with the reason, and not kept waiting.
    let t = Instant::now();
    let (status, body) = request(&mut connect(&socket), "GET", "/v1/peers", false);
    assert!(status.contains(" 503 "), "{status} {body}");
    assert!(body.contains("connections"), "{body}");
    assert!(
        t.elapsed() < STATUS_WITHIN,
        "the 503 took {:?}",
        t.elapsed()
    );
    let out = d.mesh(&["ticket"]).unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "a full socket is a capacity fault: {out:?}"
    );
    assert!(out.stderr.contains("connections"), "{out:?}");
    // The operator's reads are answered from the reserve.
    let took = timed_status(&d);
    assert!(took < STATUS_WITHIN, "mesh status took {took:?}");
    let (status, metrics) = request(&mut connect(&socket), "GET", "/metrics", false);
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        sample(
            &metrics,
            "mesh_api_connections_closed_total{reason=\"full\"}"
        ) >= 2
    );
    // A place given back is taken by the next client.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = d.mesh(&["ticket"]).unwrap();
        if out.ok() {
            break;
        }
        assert!(Instant::now() < deadline, "no place came free: {out:?}");
    }
}

#[test]
fn a_connection_idle_between_requests_is_closed_but_a_live_subscription_is_not() {
    let (_tmp, d) = start("[api]\nidle_timeout_ms = 300\n");
    let socket = d.socket();
    let mut idle = connect(&socket);
    let (status, _) = request(&mut idle, "GET", "/v1/ticket", false);
    assert!(status.contains(" 200 "), "{status}");
    let mut sub = connect(&socket);
    write!(
        sub,
        "GET /v1/subscribe HTTP/1.1\r\nHost: mesh\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    assert!(
        closed_by(&idle, Instant::now() + Duration::from_secs(20)),
        "an idle connection outlived its timeout"
    );
    // Well past the idle timeout, the subscription is still open.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(900) {
        let _ = timed_status(&d);
    }
    assert!(!closed(&sub), "a live subscription was closed as idle");
}
