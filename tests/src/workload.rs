//! The workload: clients that send unique, numbered messages to random peers
//! through a node's socket (`POST /v1/send`), and publish some to a topic
//! every node is a member of (`POST /v1/topics/{name}/publish`), and some
//! from their node's sender agent to a roaming agent
//! (`POST /v1/agents/{name}/send`), and record what happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mesh_api::client::{Client, ClientError, path_segment};
use mesh_api::{AgentSendRequest, PublishRequest, SendRequest, StreamJson};
use mesh_protocol::Seq;
use tokio::sync::watch;

use crate::history::{History, Op, agent_client_id, body};
use crate::rng::SimRng;

/// How the clients behave.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Clients per node.
    pub clients_per_node: usize,
    /// The pause between one client's sends (bounds the rate).
    pub interval: Duration,
    /// The most messages one client sends or publishes (bounds the count).
    pub sends_max: u64,
    /// How long a send may take before it is recorded as `unknown`.
    pub send_timeout: Duration,
    /// The pause after a definite failure to reach the node (it is down).
    pub down_backoff: Duration,
    /// The topic every node is a member of, if any: clients publish to it.
    pub topic: Option<String>,
    /// One message in this many (drawn at random) is published to
    /// [`WorkloadConfig::topic`] instead of sent to one node; 0: none.
    pub publish_one_in: u64,
    /// Of the rest, one in this many (drawn at random) is an agent send to
    /// the roaming agent, if the client has a sender agent and there is a
    /// [`Roamer`]; 0: none.
    pub agent_send_one_in: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            clients_per_node: 2,
            interval: Duration::from_millis(40),
            sends_max: 50_000,
            send_timeout: Duration::from_secs(5),
            down_backoff: Duration::from_millis(200),
            topic: None,
            publish_one_in: 0,
            agent_send_one_in: 0,
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
    /// Its node's sender agent (name, a client of its socket), if any.
    pub agent: Option<(String, Client)>,
    /// The agent its agent sends go to.
    pub roamer: Option<Roamer>,
}

/// The roaming agent, as the workload knows it: its name, its first host,
/// and the host it was last moved to (the nemesis moves it).
#[derive(Clone, Debug)]
pub struct Roamer {
    /// Its name.
    pub name: String,
    /// The node it was created on, by index.
    pub home: usize,
    /// The node the last move that answered put it on, by index.
    pub host: Arc<AtomicUsize>,
}

impl Roamer {
    /// The node it is on, as far as the last move that answered says.
    pub fn host(&self) -> usize {
        self.host.load(Ordering::Acquire)
    }
}

/// One address in this many of an agent send names the roaming agent's
/// first host rather than the one it was last moved to: its contacts must
/// follow the move.
const HOME_ADDRESS_ONE_IN: u64 = 4;

/// Runs one client until `stop` turns true or it has sent or published
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
        let topic = cfg
            .topic
            .as_ref()
            .filter(|_| cfg.publish_one_in > 0 && rng.chance(1, cfg.publish_one_in));
        let agent = match (&spec.agent, &spec.roamer) {
            (Some(a), Some(r))
                if topic.is_none()
                    && cfg.agent_send_one_in > 0
                    && rng.chance(1, cfg.agent_send_one_in) =>
            {
                Some((a, r))
            }
            _ => None,
        };
        let ended = match (topic, agent) {
            (_, Some(((name, api), roamer))) => {
                let to = if rng.chance(1, HOME_ADDRESS_ONE_IN) {
                    roamer.home
                } else {
                    roamer.host()
                };
                let send = AgentSend {
                    client: spec.client,
                    c,
                    from: spec.node,
                    from_agent: name.clone(),
                    to_agent: roamer.name.clone(),
                    to,
                    to_id: spec.node_ids[to].clone(),
                };
                send.run(api, &history, cfg.send_timeout).await
            }
            (Some(topic), None) => {
                let publish = Publish {
                    client: spec.client,
                    c,
                    from: spec.node,
                    from_id: spec.node_ids[spec.node].clone(),
                    topic: topic.clone(),
                };
                publish.run(&spec.api, &history, cfg.send_timeout).await
            }
            (None, None) => {
                let to = others[rng.index(others.len())];
                let send = Send {
                    client: spec.client,
                    c,
                    from: spec.node,
                    to,
                    to_id: spec.node_ids[to].clone(),
                };
                send.run(&spec.api, &history, cfg.send_timeout).await
            }
        };
        let pause = match ended {
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

/// How a recorded send or publish ended.
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
        let answer = tokio::time::timeout(timeout, api.post("/v1/send", &req)).await;
        let answer = answer.map(|a| a.map(|r: mesh_api::SendResponse| (r.stream, r.seq, None)));
        record_outcome(history, self.client, self.c, answer, timeout)
    }
}

/// One agent send to record: a message from a sender agent to the roaming
/// agent, with a client id (so a retry would be answered, not sent again).
#[derive(Clone, Debug)]
pub struct AgentSend {
    /// The origin client.
    pub client: u32,
    /// The client's counter for this message.
    pub c: u64,
    /// The sending node's index.
    pub from: usize,
    /// The sending agent.
    pub from_agent: String,
    /// The recipient agent.
    pub to_agent: String,
    /// The node its address names, by index.
    pub to: usize,
    /// That node's id.
    pub to_id: String,
}

impl AgentSend {
    /// Records `agent_send`, sends through the sender agent's socket
    /// client `api` (at most `timeout`), records the outcome, and answers it.
    pub async fn run(self, api: &Client, history: &History, timeout: Duration) -> Ended {
        history.record(Op::AgentSend {
            t_ms: history.now_ms(),
            client: self.client,
            c: self.c,
            from: self.from,
            from_agent: self.from_agent.clone(),
            to_agent: self.to_agent.clone(),
            to: self.to,
            to_id: self.to_id.clone(),
        });
        let req = AgentSendRequest {
            to: format!("{}@{}", self.to_agent, self.to_id),
            body: body(self.client, self.c),
            encoding: Default::default(),
            in_reply_to: None,
            client_id: Some(agent_client_id(self.client, self.c)),
            key: None,
            receipt: false,
        };
        let path = format!("/v1/agents/{}/send", path_segment(&self.from_agent));
        let answer = tokio::time::timeout(timeout, api.post(&path, &req)).await;
        let answer =
            answer.map(|a| a.map(|r: mesh_api::AgentSendResponse| (r.stream, r.seq, Some(r.id))));
        record_outcome(history, self.client, self.c, answer, timeout)
    }
}

/// One message to publish to a topic and record.
#[derive(Clone, Debug)]
pub struct Publish {
    /// The origin client.
    pub client: u32,
    /// The client's counter for this message.
    pub c: u64,
    /// The publishing node's index.
    pub from: usize,
    /// The publishing node's id.
    pub from_id: String,
    /// The topic.
    pub topic: String,
}

impl Publish {
    /// Records `publish`, publishes through `api` (at most `timeout`),
    /// records the outcome, and answers it.
    pub async fn run(self, api: &Client, history: &History, timeout: Duration) -> Ended {
        history.record(Op::Publish {
            t_ms: history.now_ms(),
            client: self.client,
            c: self.c,
            from: self.from,
            from_id: self.from_id,
            topic: self.topic.clone(),
        });
        let req = PublishRequest {
            body: body(self.client, self.c),
            encoding: Default::default(),
            msg_kind: 0,
        };
        let path = format!("/v1/topics/{}/publish", path_segment(&self.topic));
        let answer = tokio::time::timeout(timeout, api.post(&path, &req)).await;
        let answer = answer.map(|a| a.map(|r: mesh_api::SendResponse| (r.stream, r.seq, None)));
        record_outcome(history, self.client, self.c, answer, timeout)
    }
}

/// What a committed send was answered: its stream, its seq and, for an
/// agent send, its message id.
type Answered = (StreamJson, Seq, Option<String>);

/// Records how message (`client`, `c`) ended from the daemon's `answer`
/// (`Err`: none within `timeout`), and answers it.
fn record_outcome(
    history: &History,
    client: u32,
    c: u64,
    answer: Result<Result<Answered, ClientError>, tokio::time::error::Elapsed>,
    timeout: Duration,
) -> Ended {
    let t_ms = history.now_ms();
    let (op, ended) = match answer {
        Ok(Ok((stream, seq, id))) => (
            Op::Ok {
                t_ms,
                client,
                c,
                stream,
                seq,
                id,
            },
            Ended::Ok,
        ),
        Ok(Err(e)) if is_refusal(&e) => (
            Op::Fail {
                t_ms,
                client,
                c,
                error: e.to_string(),
            },
            Ended::Fail,
        ),
        Ok(Err(e)) => (
            Op::Unknown {
                t_ms,
                client,
                c,
                error: e.to_string(),
            },
            Ended::Unknown,
        ),
        Err(_) => (
            Op::Unknown {
                t_ms,
                client,
                c,
                error: format!("no answer within {timeout:?}"),
            },
            Ended::Unknown,
        ),
    };
    history.record(op);
    ended
}

/// Whether a client error says nothing was written (else it may have been).
pub(crate) fn is_refusal(e: &ClientError) -> bool {
    match e {
        // Nothing listens: the request never reached a daemon.
        ClientError::NotRunning { .. } | ClientError::Connect { .. } => true,
        // The API answers these only for a send or publish it did not
        // commit. `node_unavailable` is not among them: a node that stops
        // mid-send cannot say whether the commit happened.
        ClientError::Api { status, code, .. } => {
            (400..500).contains(status) || code == "outbox_full" || code == "store_unavailable"
        }
        _ => false,
    }
}
