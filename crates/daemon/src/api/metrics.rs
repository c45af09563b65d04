//! `GET /metrics`: the API's and the bus's counters as Prometheus text, each
//! metric family once.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::ApiState;
use super::gate::Gate;
use crate::bus::{DropReason, NodeStatus};

pub(super) async fn metrics(State(st): State<ApiState>) -> Response {
    // A node that has stopped has no counters to give; the API's still count.
    let bus = st.inner.bus.status().await.ok();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&st, bus.as_ref()),
    )
        .into_response()
}

/// Prometheus text: metric families, each `# HELP` and `# TYPE` line once
/// with all its samples after them.
#[derive(Default)]
struct Text {
    out: String,
}

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str, samples: &[(&str, u64)]) {
        // Writing to a String cannot fail.
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(self.out, "{name}{labels} {v}");
        }
    }

    fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.family(name, "counter", help, &[("", v)]);
    }
}

/// The text of `GET /metrics`: the API's counters, the journal head, and
/// the bus's counters from `bus` if the node answered.
fn render(st: &ApiState, bus: Option<&NodeStatus>) -> String {
    let c = &st.inner.counters;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut t = Text::default();
    t.family(
        "mesh_api_requests_total",
        "counter",
        "Local API requests answered, by status class.",
        &[
            ("{class=\"ok\"}", load(&c.requests_ok)),
            ("{class=\"client_error\"}", load(&c.requests_client_error)),
            ("{class=\"server_error\"}", load(&c.requests_server_error)),
        ],
    );
    t.counter(
        "mesh_api_refused_uid_total",
        "Local API requests refused because the connecting uid is not allowed.",
        load(&c.refused_uid),
    );
    t.counter(
        "mesh_api_sent_total",
        "Messages committed through the local API.",
        load(&c.sent),
    );
    t.counter(
        "mesh_api_agent_sent_total",
        "Agent messages committed through agents' sockets.",
        load(&c.agent_sent),
    );
    t.counter(
        "mesh_api_agent_acks_refused_total",
        "Agents' acks refused: a cursor not of the agent's own inbox, of another node or store epoch, past the head, or malformed.",
        load(&c.acks_refused),
    );
    t.family(
        "mesh_api_inbox_waits",
        "gauge",
        "Agents' inbox reads waiting for an entry now.",
        &[("", load(&c.inbox_waits))],
    );
    t.counter(
        "mesh_api_unverified_sender_total",
        "Requests on an agent's socket refused as not from that agent.",
        load(&c.refused_agent),
    );
    t.family(
        "mesh_api_subscribers",
        "gauge",
        "Live subscriptions open now.",
        &[("", load(&c.subscribers))],
    );
    t.counter(
        "mesh_api_subscriber_lags_total",
        "Times a live subscriber stopped reading and was lagged.",
        load(&c.subscriber_lags),
    );
    t.counter(
        "mesh_api_loss_records_failed_total",
        "Subscriber lags whose durable loss record could not be written.",
        load(&c.loss_records_failed),
    );
    render_gate(&mut t, &st.inner.gate);
    let head = bus.map_or_else(|| st.read_head(), |b| b.journal_head);
    t.family(
        "mesh_journal_head",
        "gauge",
        "The last journal arrival committed.",
        &[("", head)],
    );
    if let Some(bus) = bus {
        render_bus(&mut t, bus);
    }
    t.out
}

/// The control socket's connections: open, pending, refused and closed.
fn render_gate(t: &mut Text, gate: &Gate) {
    let c = gate.counters();
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    t.family(
        "mesh_api_connections",
        "gauge",
        "Connections open on the control socket now, and of them those that have sent no request yet.",
        &[
            ("{state=\"open\"}", load(&c.open)),
            ("{state=\"pending\"}", gate.pending_now() as u64),
        ],
    );
    t.counter(
        "mesh_api_connections_accepted_total",
        "Connections accepted on the control socket.",
        load(&c.accepted),
    );
    t.family(
        "mesh_api_connections_closed_total",
        "counter",
        "Control socket connections the daemon closed, by why: every place held (answered 503), \
         pending when a newer one needed room, no request head in time, idle too long.",
        &[
            ("{reason=\"full\"}", load(&c.refused_full)),
            ("{reason=\"evicted_pending\"}", load(&c.evicted_pending)),
            ("{reason=\"head_timeout\"}", load(&c.head_timeouts)),
            ("{reason=\"idle_timeout\"}", load(&c.idle_timeouts)),
        ],
    );
    t.counter(
        "mesh_api_connections_reserve_total",
        "Status and metrics requests served from the reserve while every other place was held.",
        load(&c.reserve_admitted),
    );
}

fn render_bus(t: &mut Text, status: &NodeStatus) {
    for (name, help, v) in bus_counters(status) {
        t.counter(&format!("mesh_{name}"), help, v);
    }
    for (name, help, v) in agent_counters(status) {
        t.counter(&format!("mesh_{name}"), help, v);
    }
    render_drops(t, status);
    render_topics(t, status);
}

/// The topic layer's counters, and per topic its members linked now, its
/// author streams and what is held of them.
fn render_topics(t: &mut Text, status: &NodeStatus) {
    let c = &status.core.topics;
    t.counter(
        "mesh_topic_published_total",
        "Messages this node published to its topics, committed.",
        c.published,
    );
    t.counter(
        "mesh_topic_batches_accepted_total",
        "Members' topic batches taken into a commit here.",
        c.batches_accepted,
    );
    t.counter(
        "mesh_topic_batches_relayed_total",
        "Topic batches handed to members (this node's own and relayed ones).",
        c.batches_relayed,
    );
    let label = |name: &str| format!("{{topic=\"{name}\"}}");
    let labels: Vec<String> = status
        .topics
        .iter()
        .map(|tp| label(tp.record.name.as_str()))
        .collect();
    let per = |f: &dyn Fn(&crate::bus::NodeTopic) -> u64| -> Vec<(&str, u64)> {
        labels
            .iter()
            .zip(&status.topics)
            .map(|(l, tp)| (l.as_str(), f(tp)))
            .collect()
    };
    t.family(
        "mesh_topic_members",
        "gauge",
        "Live peers that said they are members of the topic.",
        &per(&|tp| tp.members.len() as u64),
    );
    t.family(
        "mesh_topic_streams",
        "gauge",
        "Author streams of the topic this node holds or receives.",
        &per(&|tp| tp.streams.len() as u64),
    );
    t.family(
        "mesh_topic_held_msgs",
        "gauge",
        "Messages of the topic this node holds to relay, over its authors.",
        &per(&|tp| {
            tp.streams
                .iter()
                .filter_map(|s| s.held.as_ref())
                .map(|h| h.msgs)
                .sum()
        }),
    );
}

/// The agent layer's counters: (name after `mesh_`, help, value).
fn agent_counters(status: &NodeStatus) -> [(&'static str, &'static str, u64); 24] {
    let a = &status.core.agents;
    [
        (
            "agent_sends_total",
            "Agent messages taken to send.",
            a.sends,
        ),
        (
            "agent_retries_answered_total",
            "Retried sends answered with the first send's receipt.",
            a.retries_answered,
        ),
        (
            "agent_delivered_total",
            "Agent messages put in an agent's inbox here.",
            a.delivered,
        ),
        (
            "agent_unverified_senders_total",
            "Of those, messages whose sender its node never announced.",
            a.unverified_senders,
        ),
        (
            "agent_undeliverable_total",
            "Agent messages received for an agent this node does not host.",
            a.undeliverable,
        ),
        (
            "agent_bounces_sent_total",
            "Bounces sent back.",
            a.bounces_sent,
        ),
        (
            "agent_bounces_refused_total",
            "Bounces the author's outbox did not take.",
            a.bounces_refused,
        ),
        (
            "agent_superseded_total",
            "Own agent messages superseded before they were sent.",
            a.superseded,
        ),
        (
            "agent_moves_taken_total",
            "Agents' move notices taken (newer than the one held of their agent).",
            a.moves_taken,
        ),
        (
            "agent_moves_refused_total",
            "Move notices refused: a bad signature, or an agent leaving this node that is not its.",
            a.moves_refused,
        ),
        (
            "agent_follows_sent_total",
            "Followed frames sent: this node told a peer it writes to agents that left it at their new host.",
            a.follows_sent,
        ),
        (
            "agent_drains_followed_total",
            "Drains of agents that left this node which every peer came to follow.",
            a.drains_followed,
        ),
        (
            "agent_forwards_sent_total",
            "Messages for an agent that moved away, passed on to its new host.",
            a.forwards_sent,
        ),
        (
            "agent_forwards_received_total",
            "Forwarded messages put in an agent's inbox here.",
            a.forwards_received,
        ),
        (
            "agent_forwards_trimmed_sent_total",
            "Ranges of a moved agent's previous inbox that retention removed before they were passed on, told to its new host.",
            a.forwards_trimmed_sent,
        ),
        (
            "agent_forwards_trimmed_received_total",
            "Trimmed forwards put in an agent's inbox here: messages it lost to its old host's retention.",
            a.forwards_trimmed_received,
        ),
        (
            "agent_supersede_refused_total",
            "Supersedes of a queued message the store refused (evicted or acknowledged meanwhile).",
            a.supersede_refused,
        ),
        (
            "agent_tombstones_received_total",
            "Tombstones of superseded messages put in an agent's inbox here.",
            a.tombstones_received,
        ),
        (
            "agent_bounces_received_total",
            "Bounces put in an agent's inbox here.",
            a.bounces_received,
        ),
        (
            "agent_payloads_malformed_total",
            "Agent envelopes whose payload did not decode.",
            a.malformed,
        ),
        (
            "agent_receipts_sent_total",
            "Read receipts of this node's agents sent to their senders' nodes.",
            a.receipts_sent,
        ),
        (
            "agent_receipts_received_total",
            "Read receipts that marked messages of this node read and went to their sender's inbox.",
            a.receipts_received,
        ),
        (
            "agent_receipts_refused_total",
            "Read receipts refused: malformed, not signed by the reader's announced key, for no agent here, or naming nothing this node sent there unread.",
            a.receipts_refused,
        ),
        (
            "agent_receipt_ids_skipped_total",
            "Ids in accepted read receipts that named no message this node sent to the reader's node, or one already read.",
            a.receipt_ids_skipped,
        ),
    ]
}

/// The `mesh_frames_dropped_total` family, one sample per drop reason.
fn render_drops(t: &mut Text, status: &NodeStatus) {
    let labels: Vec<String> = DropReason::ALL
        .iter()
        .map(|r| format!("{{reason=\"{}\"}}", r.name()))
        .collect();
    let samples: Vec<(&str, u64)> = DropReason::ALL
        .iter()
        .zip(&labels)
        .map(|(reason, label)| (label.as_str(), status.core.dropped.get(*reason)))
        .collect();
    t.family(
        "mesh_frames_dropped_total",
        "counter",
        "Frames dropped, by reason.",
        &samples,
    );
}

/// The bus's counters: (name after `mesh_`, help, value).
// Long because it is the table of counters, one entry each, in the order
// they are rendered; splitting it would only scatter the table.
fn bus_counters(status: &NodeStatus) -> [(&'static str, &'static str, u64); 24] {
    let m = &status.core;
    [
        (
            "commits_total",
            "Commits issued by the bus core.",
            m.commits,
        ),
        ("sends_ok_total", "Local sends committed.", m.sends_ok),
        (
            "sends_refused_total",
            "Local sends refused before the store.",
            m.sends_refused,
        ),
        (
            "sends_failed_total",
            "Local sends the store refused or failed.",
            m.sends_failed,
        ),
        (
            "batches_accepted_total",
            "Peer batches accepted into a commit.",
            m.batches_accepted,
        ),
        (
            "duplicate_envelopes_total",
            "Envelopes received at or below the mark.",
            m.duplicate_envelopes,
        ),
        (
            "resyncs_asked_total",
            "Resync frames sent.",
            m.resyncs_asked,
        ),
        (
            "resyncs_served_total",
            "Resync requests served.",
            m.resyncs_served,
        ),
        ("gaps_sent_total", "ResyncGap frames sent.", m.gaps_sent),
        (
            "gaps_recorded_total",
            "Gaps committed to the journal.",
            m.gaps_recorded,
        ),
        (
            "retransmits_total",
            "Streams resent after a silence.",
            m.retransmits,
        ),
        (
            "acks_withheld_total",
            "Acks not sent: the batch came on a connection another has replaced since.",
            m.acks_withheld,
        ),
        (
            "link_paused_refused_total",
            "Incoming connections refused because the link to their peer is paused.",
            status.net.paused_refused,
        ),
        (
            "identity_conflicts_total",
            "Connections refused, here or by the peer, because two live processes share one node key.",
            status.net.identity_conflicts,
        ),
        (
            "sends_held_total",
            "Local sends and topic publishes held after a commit failed for want of a store (each time).",
            m.sends_held,
        ),
        (
            "sends_let_go_total",
            "Held sends and publishes let go after the hold bound (answered 503; sends journaled as lost).",
            m.sends_let_go,
        ),
        (
            "epoch_switches_total",
            "New store epochs started because the store went back in time.",
            m.epoch_switches,
        ),
        (
            "conflicts_total",
            "Peer batches with another message at a committed seq (journaled as conflicts).",
            m.conflicts,
        ),
        (
            "peer_epoch_changes_total",
            "Peers seen with a new store epoch.",
            m.peer_epoch_changes,
        ),
        (
            "journal_trims_total",
            "Commits whose trim took journal rows.",
            m.trims,
        ),
        (
            "unknown_node_refused_total",
            "Incoming connections refused because the remote is not a peer.",
            status.net.refused,
        ),
        (
            "version_refused_total",
            "Connections refused (by either side) for another protocol version.",
            status.net.version_refused,
        ),
        (
            "cards_learned_total",
            "Newer peer cards committed (from Hellos and from other peers).",
            m.cards_learned,
        ),
        (
            "cards_asked_total",
            "Card queries sent about peers without a connection.",
            m.cards_asked,
        ),
    ]
}
