//! `mesh web` driven in a real browser: two real daemons with agents and
//! messages, the dashboard of one opened in Debian's headless `chromium`
//! through its `chromedriver` over WebDriver (the W3C protocol, spoken by
//! the small client below). The page must show the peer in its picture, a
//! message sent after it loaded in its journal tail within 2 s without a
//! reload, a message's state when its id is searched, and the agents'
//! unread mail; the port must refuse a request without the token (401).
//! A screenshot is left in the target dir (`CARGO_TARGET_TMPDIR`).
//!
//! The browser and its driver are Debian's `chromium` and `chromium-driver`:
//! `.ci/run` installs them; run as root without them, this test installs
//! them with apt; otherwise it fails saying so.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mesh_tests::daemon::{DaemonProcess, ok, parse_json, temp_dir};
use serde_json::{Value, json};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long a state the test waits for may take (the mesh's own work).
const SETTLE: Duration = Duration::from_secs(60);
/// How soon a message committed here must be in the page's tail.
const LIVE_WITHIN: Duration = Duration::from_secs(2);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

fn as_agent(d: &DaemonProcess, agent: &str, args: &[&str]) -> String {
    let mut all = vec!["--agent", agent];
    all.extend_from_slice(args);
    ok(d.mesh(&all).unwrap()).trim().to_owned()
}

/// Installs Debian's browser and driver if they are missing and this is
/// root (apt waits for another install's lock); else fails saying how.
fn ensure_browser() {
    if Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists() {
        return;
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    assert!(
        root,
        "this test needs Debian's chromium and its driver: \
         apt-get install chromium chromium-driver (.ci/run installs them)"
    );
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=600", "-y", "-qq"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let installed = apt(&["install", "chromium", "chromium-driver"])
        || (apt(&["update"]) && apt(&["install", "chromium", "chromium-driver"]));
    assert!(installed, "apt-get install chromium chromium-driver failed");
}

/// One HTTP/1.1 request on its own connection; the status and the body.
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(SETTLE)).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Read the head, then the body by its length (a driver may keep the
    // connection open whatever the request says), by chunks, or to EOF.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before a whole head: {raw:?}");
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {head:?}"));
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let mut body = raw[head_end..].to_vec();
    if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while body.len() < len {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed before a whole body");
            body.extend_from_slice(&buf[..n]);
        }
        body.truncate(len);
        return (status, String::from_utf8_lossy(&body).into_owned());
    }
    s.read_to_end(&mut body).unwrap();
    let body = String::from_utf8_lossy(&body).into_owned();
    let chunked = header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    (status, if chunked { unchunk(&body) } else { body })
}

/// A chunked body, whole.
fn unchunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// A free loopback port (for the driver, which wants one named).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `chromedriver` and one browser session in it; both go at drop.
struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
}

impl Browser {
    fn start(profile: &Path) -> Browser {
        ensure_browser();
        let port = free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group, so that drop ends the browser with it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let driver = cmd.spawn().expect("chromedriver starts");
        let deadline = Instant::now() + SETTLE;
        loop {
            let up = TcpStream::connect(addr).is_ok()
                && http(addr, "GET", "/status", None)
                    .1
                    .contains("\"ready\":true");
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver never got ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
        };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--no-first-run",
                         "--window-size=1400,1100",
                         format!("--user-data-dir={}", profile.display())],
            },
        }}});
        let v = b.call("POST", "/session", Some(&caps));
        b.session = v["sessionId"].as_str().unwrap().to_owned();
        b
    }

    /// A WebDriver command; its `value`.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, text) = http(self.addr, method, path, body);
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}: {text:?}"));
        assert_eq!(status, 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn session(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn go(&self, url: &str) {
        self.session("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    fn run(&self, script: &str, args: Value) -> Value {
        self.session(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": args })),
        )
    }

    /// Polls `script` until it answers something other than null/false.
    #[track_caller]
    fn wait(&self, what: &str, within: Duration, script: &str, args: Value) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.run(script, args.clone());
            if !(v.is_null() || v == Value::Bool(false)) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: not within {within:?}");
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The element `css` (W3C element reference).
    fn element(&self, css: &str) -> String {
        let v = self.session(
            "POST",
            "/element",
            Some(&json!({"using": "css selector", "value": css})),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_owned()
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.element(css);
        self.session("POST", &format!("/element/{e}/clear"), Some(&json!({})));
        self.session(
            "POST",
            &format!("/element/{e}/value"),
            Some(&json!({ "text": text })),
        );
    }

    fn click(&self, css: &str) {
        let e = self.element(css);
        self.session("POST", &format!("/element/{e}/click"), Some(&json!({})));
    }

    fn screenshot(&self, to: &Path) {
        let v = self.session("GET", "/screenshot", None);
        let png = data_encoding::BASE64
            .decode(v.as_str().unwrap().as_bytes())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(to, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http(
                self.addr,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            );
        }
        // The group first (a browser left by a failed session), then the
        // driver itself: not every kernel this runs on signals a group.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Where the screenshot goes: the target dir, one per run.
fn screenshot_path() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("dashboard-{}.png", std::process::id()))
}

/// The texts of the tail's entries, newest first.
const TAIL_TEXTS: &str =
    "return [...document.querySelectorAll('#tail li.entry')].map(e => e.textContent);";

#[test]
fn the_dashboard_shows_the_mesh_live_in_a_real_browser_and_refuses_a_request_without_its_token() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["peer", "name", b.node(), "gpu"]).unwrap());
    ok(b.mesh(&["peer", "name", a.node(), "laptop"]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let first = as_agent(&a, "alice", &["send", "bob@gpu", "before the page"]);
    a.wait_message_state(&first, "delivered", SETTLE);
    let to_alice = as_agent(&b, "bob", &["send", "alice@laptop", "unread for alice"]);
    b.wait_message_state(&to_alice, "delivered", SETTLE);

    let web = parse_json(&ok(a.mesh(&["web", "--json"]).unwrap())).unwrap();
    let url = web["url"].as_str().unwrap().to_owned();
    let listen: SocketAddr = web["listen"].as_str().unwrap().parse().unwrap();
    assert!(listen.ip().is_loopback(), "{web}");
    // Asked again, the same dashboard: one port, one token a start.
    let again = parse_json(&ok(a.mesh(&["web", "--json"]).unwrap())).unwrap();
    assert_eq!(again["url"], web["url"]);
    let token = url.split_once("token=").unwrap().1.to_owned();

    // Without the token, or with another, nothing is served.
    for path in ["/", "/api/status", "/api/subscribe", "/?token=0123"] {
        let (status, body) = http(listen, "GET", path, None);
        assert_eq!(status, 401, "{path}: {body}");
        assert!(!body.contains(a.node()), "{path} leaked: {body}");
    }
    // With it, reads only: there is nothing to post to.
    let (status, _) = http(listen, "GET", &format!("/api/status?token={token}"), None);
    assert_eq!(status, 200);
    let (status, body) = http(
        listen,
        "POST",
        &format!("/api/status?token={token}"),
        Some(&json!({})),
    );
    assert_eq!(status, 405, "{body}");
    // The page's refresh is one read: status, agents and topics together,
    // alice's unread mail counted once and the same in both.
    let (status, body) = http(listen, "GET", &format!("/api/overview?token={token}"), None);
    assert_eq!(status, 200, "{body}");
    let o = parse_json(&body).unwrap();
    assert_eq!(o["status"]["node"], json!(a.node()), "{o}");
    assert_eq!(o["status"]["agents"][0]["unread"]["count"], json!(1), "{o}");
    assert_eq!(o["agents"]["local"][0]["name"], json!("alice"), "{o}");
    assert_eq!(o["agents"]["local"][0]["unread"]["count"], json!(1), "{o}");
    assert!(o["topics"]["topics"].is_array(), "{o}");

    let browser = Browser::start(&tmp.path().join("chromium"));
    browser.go(&url);

    // The peer in the picture, connected, under the name it gave itself.
    browser.wait(
        "the peer in the mesh picture",
        SETTLE,
        "const p = document.querySelector(`#mesh g.peer[data-node='${arguments[0]}']`);
         const row = document.querySelector(`#peers tr[data-node='${arguments[0]}']`);
         return !!p && !!row && row.textContent.includes('connected')
           && !row.textContent.includes('not connected');",
        json!([b.node()]),
    );
    // The agents: alice here with one unread message, bob on the peer.
    browser.wait(
        "alice's unread count and bob on the peer",
        SETTLE,
        "const alice = document.querySelector(`#agents tr[data-agent='alice@${arguments[0]}'] td.unread`);
         const bob = document.querySelector(`#agents tr[data-agent='bob@${arguments[1]}']`);
         return !!alice && alice.textContent.startsWith('1') && !!bob;",
        json!([a.node(), b.node()]),
    );
    // The tail is live, and already holds what came before the page.
    browser.wait(
        "the live tail with the backlog",
        SETTLE,
        "return document.getElementById('live').textContent === 'live'
           && [...document.querySelectorAll('#tail li.entry')]
                .some(e => e.textContent.includes('before the page'));",
        json!([]),
    );

    // A message sent now is in the tail within 2 s, with no reload (the
    // mark set on this page's window is still there).
    browser.run("window.__mark = 'this load'; return null;", json!([]));
    let sent = Instant::now();
    let live = as_agent(&a, "alice", &["send", "bob@gpu", "after the page loaded"]);
    let committed = Instant::now();
    browser.wait(
        "the new message in the tail",
        SETTLE,
        "return [...document.querySelectorAll('#tail li.entry')]
           .some(e => e.dataset.kind === 'message' && e.textContent.includes(arguments[0]));",
        json!([live]),
    );
    let shown = committed.elapsed();
    assert!(
        shown <= LIVE_WITHIN,
        "the message took {shown:?} after its commit to show (send took {:?})",
        committed - sent
    );
    let mark = browser.run("return window.__mark || null;", json!([]));
    assert_eq!(mark, json!("this load"), "the page reloaded");

    // The kind filter hides what is not of its kind.
    browser.run(
        "const f = document.getElementById('kind-filter'); f.value = 'gap';
         f.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );
    let shown_messages = browser.run(
        "return [...document.querySelectorAll('#tail li.entry')]
           .filter(e => !e.hidden && e.dataset.kind === 'message').length;",
        json!([]),
    );
    assert_eq!(shown_messages, json!(0));
    browser.run(
        "const f = document.getElementById('kind-filter'); f.value = '';
         f.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );

    // Hidden, the page reads nothing and closes its stream; shown again, it
    // reads again and the stream resumes where it was, so what came while
    // it was hidden is in the tail.
    let hidden = browser.run(
        "window.__fetches = 0;
         const real = window.fetch;
         window.fetch = (...args) => { window.__fetches++; return real(...args); };
         Object.defineProperty(document, 'hidden', { value: true, configurable: true });
         document.dispatchEvent(new Event('visibilitychange'));
         refresh(); charts();
         return [window.__fetches, document.getElementById('live').textContent];",
        json!([]),
    );
    assert_eq!(hidden, json!([0, "paused (page hidden)"]));
    let while_hidden = as_agent(
        &a,
        "alice",
        &["send", "bob@gpu", "while the page was hidden"],
    );
    browser.run(
        "Object.defineProperty(document, 'hidden', { value: false, configurable: true });
         document.dispatchEvent(new Event('visibilitychange'));
         return null;",
        json!([]),
    );
    browser.wait(
        "the message sent while hidden in the tail, and reads again",
        SETTLE,
        "return window.__fetches > 0 && document.getElementById('live').textContent === 'live'
           && [...document.querySelectorAll('#tail li.entry')]
                .some(e => e.dataset.kind === 'message' && e.textContent.includes(arguments[0]));",
        json!([while_hidden]),
    );

    // The search: the live message once the peer has it, then an unknown id.
    a.wait_message_state(&live, "delivered", SETTLE);
    browser.type_into("#msg-id", &live);
    browser.click("#msg-go");
    let state = browser.wait(
        "the searched message's state",
        SETTLE,
        "const s = document.getElementById('msg-state');
         return s && document.getElementById('msg-result').textContent.includes(arguments[0])
           ? s.dataset.state : null;",
        json!([live]),
    );
    assert_eq!(state, json!("delivered"));
    let unknown = "0".repeat(32);
    browser.type_into("#msg-id", &unknown);
    browser.click("#msg-go");
    let state = browser.wait(
        "the unknown id's answer",
        SETTLE,
        "const s = document.getElementById('msg-state');
         return s && !document.getElementById('msg-result').textContent.includes(arguments[0])
           ? s.dataset.state : null;",
        json!([live]),
    );
    assert_eq!(state, json!("error"));

    browser.screenshot(&screenshot_path());
    let tail = browser.run(TAIL_TEXTS, json!([]));
    assert!(
        tail.as_array().unwrap().len() >= 3,
        "the tail holds the sends and the arrival: {tail}"
    );
}

/// Whether the daemon closes `s` (a read sees the end or an error) before
/// `deadline`.
fn closed_by(s: &mut TcpStream, deadline: Instant) -> bool {
    let mut b = [0u8; 256];
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return false;
        };
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
}

/// A whole keep-alive request on `s` and its answer's head (the status
/// line); the body, sized by its length, is read and dropped.
fn keep_alive(s: &mut TcpStream, path: &str) -> String {
    write!(s, "GET {path} HTTP/1.1\r\nHost: mesh\r\n\r\n").unwrap();
    s.set_read_timeout(Some(SETTLE)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before a whole answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end]).into_owned();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no content-length in {head}"));
        if got.len() >= end + 4 + len {
            return head.lines().next().unwrap().to_owned();
        }
    }
}

#[test]
fn a_leaky_client_of_the_dashboard_port_cannot_keep_the_operator_out() {
    // The dashboard's connections pass the control socket's gate: the
    // head and idle timeouts here are short so that the test sees them.
    let tmp = temp_dir().unwrap();
    let data = tmp.path().join("a");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        "[api]\nrequest_head_timeout_ms = 2000\nidle_timeout_ms = 2000\n",
    )
    .unwrap();
    let a = start(&data);
    let web = parse_json(&ok(a.mesh(&["web", "--json"]).unwrap())).unwrap();
    let url = web["url"].as_str().unwrap().to_owned();
    let listen: SocketAddr = web["listen"].as_str().unwrap().parse().unwrap();
    let token = url.split_once("token=").unwrap().1.to_owned();
    let status_path = format!("/api/status?token={token}");

    // 300 connections that send half a request line and wait (past the
    // 256 kept pending: the oldest are closed to make room).
    let mut half: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = TcpStream::connect(listen).unwrap();
            s.write_all(b"GET /api/sta").unwrap();
            s
        })
        .collect();
    // The operator is answered at once all the same.
    let t = Instant::now();
    let (status, body) = http(listen, "GET", &status_path, None);
    assert_eq!(status, 200, "{body}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the page's read took {:?} behind half-open connections",
        t.elapsed()
    );
    // Every place held by a connection that made a request and keeps it
    // open: the next is told so at once (503), not queued.
    let mut held: Vec<TcpStream> = (0..64)
        .map(|_| {
            let mut s = TcpStream::connect(listen).unwrap();
            let line = keep_alive(&mut s, &status_path);
            assert!(line.contains(" 200 "), "{line}");
            s
        })
        .collect();
    let (status, body) = http(listen, "GET", &status_path, None);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"busy\""), "{body}");

    // The head and idle timeouts close them all, and the page is served.
    let deadline = Instant::now() + SETTLE;
    for s in half.iter_mut().chain(held.iter_mut()) {
        assert!(
            closed_by(s, deadline),
            "a connection the dashboard should have closed is still open"
        );
    }
    let (status, body) = http(listen, "GET", &status_path, None);
    assert_eq!(status, 200, "{body}");
}

/// The events of an SSE body read so far: (event name, data) pairs of
/// every whole event.
fn sse_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let Some(whole) = body.rfind("\n\n") else {
        return out;
    };
    for block in body[..whole].split("\n\n") {
        let mut name = "message".to_owned();
        let mut data = String::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                v.trim().clone_into(&mut name);
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim_start());
            }
        }
        if !data.is_empty() {
            out.push((name, serde_json::from_str(&data).unwrap()));
        }
    }
    out
}

#[test]
fn a_burst_is_coalesced_in_the_dashboards_tail_and_every_entry_it_leaves_out_is_counted() {
    // The tail reads the journal at most twice a second, the newest 25
    // entries each time: a burst of 1000 shows as some of its entries and
    // "N not shown" lines that, with them, account for every arrival.
    const BURST: usize = 1000;
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(a.mesh(&["agent", "add", "bob"]).unwrap());
    let web = parse_json(&ok(a.mesh(&["web", "--json"]).unwrap())).unwrap();
    let url = web["url"].as_str().unwrap().to_owned();
    let listen: SocketAddr = web["listen"].as_str().unwrap().parse().unwrap();
    let token = url.split_once("token=").unwrap().1.to_owned();

    let mut s = TcpStream::connect(listen).unwrap();
    write!(
        s,
        "GET /api/subscribe?token={token} HTTP/1.1\r\nHost: mesh\r\n\r\n"
    )
    .unwrap();
    // The tail counts as a live subscription while it is open.
    let deadline = Instant::now() + SETTLE;
    while parse_json(&ok(a.mesh(&["status", "--json"]).unwrap())).unwrap()["subscribers"] != 1 {
        assert!(
            Instant::now() < deadline,
            "the tail is not counted as a subscriber"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let lines: String = (0..BURST).map(|i| format!("line {i}\n")).collect();
    let bob = format!("bob@{}", a.node());
    ok(a.mesh_stdin(
        &["--agent", "alice", "send", &bob, "-", "--lines"],
        Some(&lines),
    )
    .unwrap());
    let last = format!("line {}", BURST - 1);

    // Read the stream until the burst's last message is in it.
    let deadline = Instant::now() + SETTLE;
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let events = loop {
        let body = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|end| unchunk(&String::from_utf8_lossy(&raw[end + 4..])))
            .unwrap_or_default();
        let events = sse_events(&body);
        if events
            .iter()
            .any(|(n, e)| n == "entry" && e["agent"]["body"] == last.as_str())
        {
            break events;
        }
        let left = deadline
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| panic!("the burst's last message is not in the tail: {body}"));
        s.set_read_timeout(Some(left)).unwrap();
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the tail closed: {body}");
        raw.extend_from_slice(&buf[..n]);
    };

    // Every arrival is either sent or counted, once, in order.
    let mut entries = 0;
    let mut skipped_lines = 0;
    let mut skipped_since = 0;
    let mut prev: Option<u64> = None;
    for (name, e) in &events {
        match name.as_str() {
            "entry" => {
                let arrival = e["arrival"].as_u64().unwrap();
                if let Some(p) = prev {
                    assert_eq!(
                        arrival - p - 1,
                        skipped_since,
                        "between #{p} and #{arrival} the tail counted {skipped_since} not shown"
                    );
                }
                prev = Some(arrival);
                skipped_since = 0;
                entries += 1;
            }
            "skipped" => {
                let count = e["count"].as_u64().unwrap();
                assert!(count > 0, "{e}");
                assert!(e["detail"].as_str().unwrap().contains("mesh events"), "{e}");
                skipped_since += count;
                skipped_lines += 1;
            }
            other => panic!("an unexpected {other} event: {e}"),
        }
    }
    assert!(
        skipped_lines > 0,
        "nothing was coalesced: {entries} entries sent"
    );
    assert!(
        entries < BURST,
        "{entries} entries were sent for a burst of {BURST}"
    );
}
