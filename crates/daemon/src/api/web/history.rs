//! The dashboard's charts: the daemon's own counters sampled every
//! [`SAMPLE_INTERVAL`] while the dashboard is open, the last hour of them
//! kept ([`SAMPLES_MAX`] samples, a few bytes each).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use super::super::ApiState;

/// How often the counters are read.
pub(super) const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);

/// Samples kept: one hour at [`SAMPLE_INTERVAL`].
pub(super) const SAMPLES_MAX: usize = 360;

/// One reading of the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Sample {
    /// When, ms since the Unix epoch.
    at_ms: u64,
    /// Local sends committed since the start (`mesh_sends_ok_total`).
    sent: u64,
    /// The journal's head: every arrival, sent here or received.
    arrivals: u64,
    /// The store file's size in bytes.
    store_bytes: u64,
}

/// The samples, oldest first.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    fn push(&self, s: Sample) {
        let mut v = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() == SAMPLES_MAX {
            v.pop_front();
        }
        v.push_back(s);
    }

    fn all(&self) -> Vec<Sample> {
        let v = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        v.iter().copied().collect()
    }
}

/// Reads the counters into `history` every [`SAMPLE_INTERVAL`] until the
/// API closes.
pub(super) async fn sample(st: ApiState, history: Arc<History>) {
    let mut closing = st.inner.closing.subscribe();
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = closing.wait_for(|c| *c) => return,
        }
        // A node that does not answer now leaves a hole in the chart.
        let Ok(status) = st.inner.bus.status().await else {
            continue;
        };
        let store_bytes = std::fs::metadata(&st.inner.store_file)
            .map(|m| m.len())
            .unwrap_or(0);
        history.push(Sample {
            at_ms: now_ms(),
            sent: status.core.sends_ok,
            arrivals: st.read_head(),
            store_bytes,
        });
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The answer of `GET /api/history`.
#[derive(Debug, Serialize)]
pub(super) struct HistoryJson {
    interval_ms: u64,
    samples: Vec<Sample>,
}

/// `GET /api/history`: the samples of the last hour, oldest first.
pub(super) async fn history(State(st): State<ApiState>) -> Json<HistoryJson> {
    Json(HistoryJson {
        interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
        samples: st.inner.web.history.all(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hour_of_samples_is_kept_and_no_more() {
        let h = History::default();
        for i in 0..(SAMPLES_MAX as u64 + 5) {
            h.push(Sample {
                at_ms: i,
                sent: i,
                arrivals: i,
                store_bytes: 0,
            });
        }
        let all = h.all();
        assert_eq!(all.len(), SAMPLES_MAX);
        assert_eq!(all[0].at_ms, 5);
        assert_eq!(all.last().unwrap().at_ms, SAMPLES_MAX as u64 + 4);
    }
}
