//! Progress on stderr: a bar redrawn in place (only on a terminal, and only
//! for steps longer than a second), then one summary line per step.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

/// How often the bar is redrawn.
const REDRAW_INTERVAL: Duration = Duration::from_millis(200);
/// A step shorter than this shows no bar.
const QUIET_FOR: Duration = Duration::from_secs(1);
/// Characters of the bar itself.
const BAR_WIDTH: u64 = 24;

/// Makes bars.
#[derive(Clone, Copy, Debug)]
pub(super) struct Progress {
    tty: bool,
}

struct State {
    label: String,
    total: u64,
    unit: &'static str,
    done: AtomicU64,
    start: Instant,
    drawn: AtomicBool,
}

/// One step's bar; cleared when finished or dropped.
pub(super) struct Bar {
    state: Arc<State>,
    ticker: Option<JoinHandle<()>>,
}

impl Progress {
    pub(super) fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// A bar for `total` items of `unit`, labelled `label`.
    pub(super) fn bar(&self, label: String, total: u64, unit: &'static str) -> Bar {
        let state = Arc::new(State {
            label,
            total: total.max(1),
            unit,
            done: AtomicU64::new(0),
            start: Instant::now(),
            drawn: AtomicBool::new(false),
        });
        let ticker = self.tty.then(|| {
            let s = state.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(REDRAW_INTERVAL).await;
                    if s.start.elapsed() >= QUIET_FOR {
                        s.draw();
                    }
                }
            })
        });
        Bar { state, ticker }
    }
}

impl State {
    fn draw(&self) {
        let done = self.done.load(Ordering::Relaxed).min(self.total);
        let secs = self.start.elapsed().as_secs_f64();
        let filled = done * BAR_WIDTH / self.total;
        let bar: String = (0..BAR_WIDTH)
            .map(|i| if i < filled { '#' } else { '-' })
            .collect();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{} [{bar}] {done}/{} {} {rate:.0}/s {secs:.1} s",
            self.label, self.total, self.unit
        );
        let _ = err.flush();
        self.drawn.store(true, Ordering::Relaxed);
    }

    fn clear(&self) {
        if self.drawn.swap(false, Ordering::Relaxed) {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

impl Bar {
    /// `n` more items done.
    pub(super) fn inc(&self, n: u64) {
        self.state.done.fetch_add(n, Ordering::Relaxed);
    }

    /// `v` items done in all.
    pub(super) fn set(&self, v: u64) {
        self.state.done.store(v, Ordering::Relaxed);
    }

    /// Clears the bar and prints `summary` after the label.
    pub(super) fn finish(mut self, summary: &str) {
        self.stop();
        let secs = self.state.start.elapsed().as_secs_f64();
        eprintln!("{}: {summary} ({secs:.1} s)", self.state.label);
    }

    fn stop(&mut self) {
        if let Some(t) = self.ticker.take() {
            t.abort();
        }
        self.state.clear();
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.stop();
    }
}
