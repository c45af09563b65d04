//! The workload: clients that send unique, numbered messages to random peers
//! through a node's socket (`POST /v1/send`) and record what happened.

use std::sync::Arc;
use std::time::Duration;

use mesh_api::client::{Client, ClientError};
use mesh_api::{SendRequest, SendResponse};
use tokio::sync::watch;

use crate::history::{History, Op, body};
use crate::rng::SimRng;

/// How the clients behave.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Clients per node.
    pub clients_per_node: usize,
    /// The pause between one client's sends (bounds the rate).
    pub interval: Duration,
    /// The most sends one client makes (bounds the count).
    pub sends_max: u64,
    /// How long a send may take before it is recorded as `unknown`.
    pub send_timeout: Duration,
    /// The pause after a definite failure to reach the node (it is down).
    pub down_backoff: Duration,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            clients_per_node: 2,
            interval: Duration::from_millis(40),
            sends_max: 50_000,
            send_timeout: Duration::from_secs(5),
            down_backoff: Duration::from_millis(200),
        }
    }
}

/// One client: which node it talks to and who it may send to.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    /// The client's number (its messages' origin).
    pub client: u32,
    /// The index of the node whose socket it uses.
    pub node: usize,
    /// The node's socket client.
    pub api: Client,
    /// Every node's id, by index (the client picks another node at random).
    pub node_ids: Vec<String>,
}

/// How a send ended, as the history records it.
enum Outcome {
    Ok(SendResponse),
    Fail(String),
    Unknown(String),
}

/// Runs one client until `stop` turns true or it has sent
/// [`WorkloadConfig::sends_max`] messages; answers how many it invoked.
pub async fn run_client(
    spec: ClientSpec,
    cfg: WorkloadConfig,
    mut rng: SimRng,
    history: Arc<History>,
    mut stop: watch::Receiver<bool>,
) -> u64 {
    let others: Vec<usize> = (0..spec.node_ids.len())
        .filter(|&i| i != spec.node)
        .collect();
    if others.is_empty() {
        return 0;
    }
    let mut c = 0u64;
    while c < cfg.sends_max && !*stop.borrow() {
        c += 1;
        let to = others[rng.index(others.len())];
        let send = Send {
            client: spec.client,
            c,
            from: spec.node,
            to,
            to_id: spec.node_ids[to].clone(),
        };
        let pause = match send.run(&spec.api, &history, cfg.send_timeout).await {
            Ended::Ok | Ended::Unknown => cfg.interval,
            Ended::Fail => cfg.down_backoff.max(cfg.interval),
        };
        // Pacing, not synchronisation: the rate is part of the workload.
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
    c
}

/// One message to send and record.
#[derive(Clone, Debug)]
pub struct Send {
    /// The origin client.
    pub client: u32,
    /// The client's counter for this message.
    pub c: u64,
    /// The sending node's index.
    pub from: usize,
    /// The receiving node's index.
    pub to: usize,
    /// The receiving node's id.
    pub to_id: String,
}

/// How a recorded send ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Committed.
    Ok,
    /// Not written.
    Fail,
    /// No answer.
    Unknown,
}

impl Send {
    /// Records `invoke`, sends through `api` (at most `timeout`), records
    /// the outcome, and answers it.
    pub async fn run(self, api: &Client, history: &History, timeout: Duration) -> Ended {
        history.record(Op::Invoke {
            t_ms: history.now_ms(),
            client: self.client,
            c: self.c,
            from: self.from,
            to: self.to,
            to_id: self.to_id.clone(),
        });
        let req = SendRequest {
            to: self.to_id,
            body: body(self.client, self.c),
            encoding: Default::default(),
            msg_kind: 0,
            client_id: None,
        };
        let outcome =
            match tokio::time::timeout(timeout, api.post::<SendResponse>("/v1/send", &req)).await {
                Ok(Ok(resp)) => Outcome::Ok(resp),
                Ok(Err(e)) => classify(e),
                Err(_) => Outcome::Unknown(format!("no answer within {timeout:?}")),
            };
        let (t_ms, client, c) = (history.now_ms(), self.client, self.c);
        match outcome {
            Outcome::Ok(resp) => {
                history.record(Op::Ok {
                    t_ms,
                    client,
                    c,
                    stream: resp.stream,
                    seq: resp.seq,
                });
                Ended::Ok
            }
            Outcome::Fail(error) => {
                history.record(Op::Fail {
                    t_ms,
                    client,
                    c,
                    error,
                });
                Ended::Fail
            }
            Outcome::Unknown(error) => {
                history.record(Op::Unknown {
                    t_ms,
                    client,
                    c,
                    error,
                });
                Ended::Unknown
            }
        }
    }
}

/// Sorts a client error into "nothing was written" and "may have been written".
fn classify(e: ClientError) -> Outcome {
    match e {
        // Nothing listens: the request never reached a daemon.
        ClientError::NotRunning { .. } | ClientError::Connect { .. } => {
            Outcome::Fail(e.to_string())
        }
        // The API answers these only for a send it did not commit.
        // `node_unavailable` is not among them: a node that stops mid-send
        // cannot say whether the commit happened.
        ClientError::Api {
            status, ref code, ..
        } if (400..500).contains(&status)
            || code == "outbox_full"
            || code == "store_unavailable" =>
        {
            Outcome::Fail(e.to_string())
        }
        _ => Outcome::Unknown(e.to_string()),
    }
}
