//! One node of the demo (a `mesh daemon` process) and the waits on it.

use std::path::Path;

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{
    AddAgentRequest, AgentJson, BatchResponse, EventEntry, EventRecord, EventsPage, InviteRequest,
    InviteResponse, JoinBody, JoinResponse, PeerStatus, SendRequest, SendResponse, StatusResponse,
};
use mesh_cluster::{NodeProc, NodeSpec, Placement, RestartPort, Stopped, call};

use super::{POLL_INTERVAL, POLLS_MAX};

/// One node of the demo: a `mesh daemon` process on `<root>/<name>`.
pub(super) struct DemoNode {
    pub(super) name: &'static str,
    pub(super) proc: NodeProc,
}

impl DemoNode {
    /// Starts a node on 127.0.0.1 (a port its first start picks and it
    /// remembers for its restarts); `config` is written to its
    /// `config.toml` first.
    pub(super) async fn start(
        bin: &Path,
        root: &Path,
        name: &'static str,
        config: Option<&str>,
    ) -> anyhow::Result<Self> {
        let dir = root.join(name);
        if let Some(text) = config {
            std::fs::create_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            std::fs::write(dir.join(mesh_api::paths::CONFIG_FILE), text)
                .with_context(|| format!("cannot write {name}'s config.toml"))?;
        }
        let mut proc = NodeProc::new(NodeSpec {
            name: name.to_owned(),
            bin: bin.to_owned(),
            data: dir,
            log: root.join(format!("{name}.log")),
            placement: Placement {
                // `mesh daemon --bind 127.0.0.1:0` every time, as a person
                // runs it: the node asks for the port it remembers.
                restart_port: RestartPort::Remembered,
                ..Placement::default()
            },
            rust_log: "warn".into(),
        });
        proc.start().await?;
        Ok(DemoNode { name, proc })
    }

    pub(super) fn id(&self) -> &str {
        self.proc.id()
    }

    /// `mesh invite --uses USES`: the code.
    pub(super) async fn invite(&self, uses: u32) -> anyhow::Result<String> {
        let req = InviteRequest {
            uses: Some(uses),
            ttl_ms: None,
        };
        let made: InviteResponse = call(self.client().post("/v1/invites", &req))
            .await
            .with_context(|| format!("{} making an invite", self.name))?;
        Ok(made.code)
    }

    /// `mesh join CODE`.
    pub(super) async fn join(&self, code: &str) -> anyhow::Result<()> {
        let body = JoinBody {
            code: code.to_owned(),
        };
        let _: JoinResponse = call(self.client().post("/v1/join", &body))
            .await
            .with_context(|| format!("{} joining", self.name))?;
        Ok(())
    }

    pub(super) fn client(&self) -> &Client {
        self.proc.client()
    }

    pub(super) async fn stop(&mut self) -> anyhow::Result<()> {
        match self.proc.stop().await? {
            Stopped::Exited => Ok(()),
            Stopped::Killed => bail!("{} did not stop on SIGTERM; killed", self.name),
        }
    }

    pub(super) async fn restart(&mut self) -> anyhow::Result<()> {
        self.proc.start().await.map(|_| ())
    }

    /// Adds agent `name`; a client of its socket.
    pub(super) async fn add_agent(&self, name: &str) -> anyhow::Result<Client> {
        let a: AgentJson = self
            .client()
            .post(
                "/v1/agents",
                &AddAgentRequest {
                    name: name.into(),
                    uid: None,
                },
            )
            .await?;
        let socket = a.socket.context("the node named no socket for its agent")?;
        Ok(Client::for_agent(socket, name))
    }

    pub(super) async fn peer(&self, other: &DemoNode) -> anyhow::Result<PeerStatus> {
        let st: StatusResponse = self.client().get("/v1/status").await?;
        st.node
            .peers
            .into_iter()
            .find(|p| p.node == other.id())
            .with_context(|| format!("{} does not list {}", self.name, other.name))
    }

    /// Sends `bodies` to `to` in one batch, in order.
    pub(super) async fn send(
        &self,
        to: &DemoNode,
        bodies: Vec<String>,
    ) -> anyhow::Result<Vec<SendResponse>> {
        let reqs: Vec<SendRequest> = bodies
            .into_iter()
            .map(|body| SendRequest {
                to: to.id().to_owned(),
                body,
                encoding: Default::default(),
                msg_kind: 0,
                client_id: None,
            })
            .collect();
        let res: BatchResponse = self.client().post("/v1/send/batch", &reqs).await?;
        Ok(res.sent)
    }

    /// Every journal entry after `after` (empty: from the start).
    pub(super) async fn events_after(&self, after: &str) -> anyhow::Result<Vec<EventEntry>> {
        let mut entries = Vec::new();
        let mut after = after.to_owned();
        loop {
            let page: EventsPage = self
                .client()
                .get(&format!(
                    "/v1/events?after={}&limit=1000",
                    mesh_api::path_segment(&after)
                ))
                .await?;
            if page.entries.is_empty() {
                return Ok(entries);
            }
            entries.extend(page.entries);
            after = page.next;
        }
    }

    /// The cursor after the last journal entry now.
    pub(super) async fn journal_cursor(&self) -> anyhow::Result<String> {
        let entries = self.events_after("").await?;
        Ok(entries.last().map(|e| e.cursor.clone()).unwrap_or_default())
    }

    /// Waits until the journal after `after` holds the message with seq
    /// `last` from each `(author, last)`; returns the entries after `after`.
    pub(super) async fn wait_for_messages(
        &self,
        after: &str,
        want: &[(&DemoNode, u64)],
        what: &str,
    ) -> anyhow::Result<Vec<EventEntry>> {
        for _ in 0..POLLS_MAX {
            let entries = self.events_after(after).await?;
            let has = |author: &DemoNode, last: u64| {
                entries.iter().any(|e| {
                    matches!(&e.record, EventRecord::Envelope { stream, seq, .. }
                        if stream.author == author.id() && *seq == last)
                })
            };
            if want.iter().all(|(n, last)| has(n, *last)) {
                return Ok(entries);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        bail!("gave up waiting for {what}")
    }

    /// This node's marks for the given authors' streams, as text.
    pub(super) async fn marks(&self, authors: &[&DemoNode]) -> anyhow::Result<String> {
        let mut parts = Vec::new();
        for a in authors {
            let p = self.peer(a).await?;
            let mark = p.marks.iter().map(|m| m.mark).max().unwrap_or(0);
            parts.push(format!("{} for {}'s stream", mark, a.name));
        }
        Ok(parts.join(", "))
    }
}

pub(super) async fn wait_connected(a: &DemoNode, b: &DemoNode) -> anyhow::Result<()> {
    for _ in 0..POLLS_MAX {
        if a.peer(b).await?.connected && b.peer(a).await?.connected {
            return Ok(());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!("gave up waiting for {} and {} to connect", a.name, b.name)
}

/// Waits until `to` has acknowledged everything `from` sent it.
pub(super) async fn wait_acknowledged(from: &DemoNode, to: &DemoNode) -> anyhow::Result<()> {
    for _ in 0..POLLS_MAX {
        if from.peer(to).await?.queued_msgs == 0 {
            return Ok(());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!(
        "gave up waiting for {} to acknowledge {}",
        to.name,
        from.name
    )
}
