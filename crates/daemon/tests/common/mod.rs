//! Helpers shared by the daemon's integration tests (`api.rs`, `e2e.rs`).

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Every test finishes well within this, or fails.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `f`, failing the test if it takes longer than [`TEST_TIMEOUT`].
pub(crate) async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test timed out")
}

/// How often a condition is polled.
#[allow(dead_code)] // Not every test file polls.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How many polls before a wait fails (about 60 s: two cores, debug build,
/// other tests running).
#[allow(dead_code)]
pub(crate) const POLLS_MAX: u32 = 3000;

/// Polls `f` until it gives a value, at most [`POLLS_MAX`] times.
#[allow(dead_code)]
pub(crate) async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..POLLS_MAX {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    panic!("gave up waiting for {what}");
}

/// The `error.code` of an API error answer.
pub(crate) fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<none>")
}

/// Reads the response head of a raw subscription request, then leaves the
/// rest unread: a subscriber that stopped reading.
pub(crate) async fn open_unread_subscription(socket: &Path) -> tokio::net::UnixStream {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    s.write_all(b"GET /v1/subscribe HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}
