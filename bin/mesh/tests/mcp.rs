//! `mesh mcp --agent NAME` spawned as a child and driven by a real MCP
//! client (rmcp's), against real daemons: initialize, list the tools, send,
//! page the inbox with its cursor, request and reply between two agents,
//! a refusal as a tool error with the API's code; a read receipt asked
//! with `mesh_send` and its `read` entry; the unread inbox read and
//! acked page by page across restarts and a kill; and new entries pushed
//! into the session as notifications (resource updates, on both the
//! `resources/subscribe` and the `subscriptions/listen` lifecycle, and
//! Claude Code's channel notifications).
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::time::Duration;

use mesh_tests::daemon::{DaemonProcess, ok, parse_json, temp_dir};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, CustomNotification, GetMeta, NotificationMetaObject,
    ProtocolVersion, ReadResourceRequestParams, ResourceContents, ResourceUpdatedNotificationParam,
    ServerNotification, SubscribeRequestParams, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// How long one tool call may take (a wait inside it is shorter).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// How soon a session hears of an entry once it is committed at its sender.
const TOLD_WITHIN: Duration = Duration::from_secs(2);
/// How long a node may take to answer again once it is back (the watcher's
/// backoff is at most 5 s).
const BACK_WITHIN: Duration = Duration::from_secs(30);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

/// What a session's client heard from the server, unasked.
#[derive(Debug)]
enum Heard {
    /// `notifications/resources/updated`: the uri and the `cursor` in its `_meta`.
    Updated { uri: String, cursor: Option<String> },
    /// `notifications/claude/channel`: its params.
    Channel(Value),
    /// Any other custom notification's method.
    #[allow(dead_code)] // Read through `Debug`, in the message of a failing test.
    Other(String),
}

/// A client that records the notifications it gets.
#[derive(Clone)]
struct Recorder {
    heard: mpsc::UnboundedSender<Heard>,
}

impl ClientHandler for Recorder {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        let cursor = params
            .meta
            .as_ref()
            .and_then(|m| m.get("cursor").cloned())
            .or_else(|| context.meta.get("cursor").cloned())
            // rmcp's client leaves a notification's `_meta` in the extensions.
            .or_else(|| {
                let meta = context.extensions.get::<NotificationMetaObject>()?;
                meta.get("cursor").cloned()
            })
            .and_then(|c| c.as_str().map(str::to_owned));
        let _ = self.heard.send(Heard::Updated {
            uri: params.uri,
            cursor,
        });
    }

    async fn on_custom_notification(
        &self,
        n: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        let heard = if n.method == "notifications/claude/channel" {
            Heard::Channel(n.params.unwrap_or(Value::Null))
        } else {
            Heard::Other(n.method)
        };
        let _ = self.heard.send(heard);
    }
}

type Session = RunningService<RoleClient, Recorder>;

/// `mesh --data DATA --agent AGENT mcp` as a child, with an MCP client on
/// it in `lifecycle`, and what that client hears.
async fn mcp_with(
    data: &Path,
    agent: &str,
    lifecycle: ClientLifecycleMode,
) -> (Session, mpsc::UnboundedReceiver<Heard>) {
    let cmd = tokio::process::Command::new(MESH).configure(|c| {
        c.arg("--data")
            .arg(data)
            .args(["--agent", agent, "mcp"])
            .env_remove("RUST_LOG");
    });
    let transport = TokioChildProcess::new(cmd).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let session = tokio::time::timeout(
        CALL_TIMEOUT,
        Recorder { heard: tx }.serve_with_lifecycle(transport, lifecycle),
    )
    .await
    .expect("initialize in time")
    .expect("initialize");
    (session, rx)
}

/// [`mcp_with`] in the `initialize` lifecycle (protocol versions before
/// 2026-07-28: what Claude Code speaks).
async fn mcp(data: &Path, agent: &str) -> (Session, mpsc::UnboundedReceiver<Heard>) {
    mcp_with(data, agent, ClientLifecycleMode::Initialize).await
}

/// Calls `tool` with `args`; the result and its structured content.
async fn call(s: &Peer<RoleClient>, tool: &'static str, args: Value) -> (CallToolResult, Value) {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    let params = CallToolRequestParams::new(tool).with_arguments(args);
    let r = tokio::time::timeout(CALL_TIMEOUT, s.call_tool(params))
        .await
        .expect("answered in time")
        .expect("a tool result");
    let v = r.structured_content.clone().unwrap_or(Value::Null);
    (r, v)
}

/// As [`call`], expecting success.
async fn call_ok(s: &Peer<RoleClient>, tool: &'static str, args: Value) -> Value {
    let (r, v) = call(s, tool, args).await;
    assert_ne!(r.is_error, Some(true), "{tool} failed: {v}");
    v
}

/// As [`call`], expecting a tool error; its structured content.
async fn call_err(s: &Peer<RoleClient>, tool: &'static str, args: Value) -> Value {
    let (r, v) = call(s, tool, args).await;
    assert_eq!(r.is_error, Some(true), "{tool} did not fail: {v}");
    v
}

/// The bodies of a page's entries.
fn bodies(page: &Value) -> Vec<String> {
    page["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("a page: {page}"))
        .iter()
        .map(|e| e["body"].as_str().unwrap().to_owned())
        .collect()
}

/// `mesh_inbox` with no arguments: the unread entries' bodies, and the page.
async fn unread(s: &Peer<RoleClient>) -> (Vec<String>, Value) {
    let page = call_ok(s, "mesh_inbox", json!({})).await;
    (bodies(&page), page)
}

/// The inbox resource `uri` read: its page of unread entries.
async fn read_inbox(s: &Peer<RoleClient>, uri: &str) -> Value {
    let r = s
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    let [ResourceContents::TextResourceContents { text, .. }] = &r.contents[..] else {
        panic!("one text content: {r:?}")
    };
    parse_json(text).unwrap()
}

/// `mesh --agent AGENT send TO BODY` on `d`; the message id.
fn send_as(d: &DaemonProcess, agent: &str, to: &str, body: &str) -> String {
    let out = ok(d.mesh(&["--agent", agent, "send", to, body]).unwrap());
    out.lines().next().unwrap().trim().to_owned()
}

/// What `heard` hears of one entry within `within`: its resource update's
/// cursor (if `updates`) and its channel notification's params.
async fn told(
    heard: &mut mpsc::UnboundedReceiver<Heard>,
    uri: &str,
    updates: bool,
    within: Duration,
) -> (Option<String>, Value) {
    let deadline = tokio::time::Instant::now() + within;
    let (mut cursor, mut channel) = (None, None);
    while (updates && cursor.is_none()) || channel.is_none() {
        let h = tokio::time::timeout_at(deadline, heard.recv())
            .await
            .unwrap_or_else(|_| {
                panic!("not told in {within:?}: update {cursor:?}, channel {channel:?}")
            })
            .expect("the session is open");
        match h {
            Heard::Updated { uri: u, cursor: c } if u == uri && updates => {
                cursor = Some(c.expect("an update carries its cursor"));
            }
            Heard::Channel(p) => channel = Some(p),
            other => panic!("heard {other:?}"),
        }
    }
    (cursor, channel.unwrap())
}

/// Nothing more was heard (of what came before now).
fn heard_nothing_more(heard: &mut mpsc::UnboundedReceiver<Heard>) {
    if let Ok(h) = heard.try_recv() {
        panic!("heard {h:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_sends_pages_the_inbox_and_requests_and_replies_through_mesh_mcp() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let (alice, _) = mcp(a.data(), "alice").await;
    let (bob, _) = mcp(b.data(), "bob").await;

    // Initialize said who it is; the tools are the eight, each described.
    let info = alice.peer_info().expect("the server's info");
    let server = info.server_info.clone().expect("the server names itself");
    assert_eq!(server.name, "agent-mesh");
    let tools = alice.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "mesh_ack",
            "mesh_agents",
            "mesh_inbox",
            "mesh_reply",
            "mesh_request",
            "mesh_send",
            "mesh_status",
            "mesh_thread"
        ]
    );
    assert!(
        tools
            .iter()
            .all(|t| t.description.as_ref().is_some_and(|d| d.len() > 20))
    );

    // Send, and page bob's inbox with the cursor.
    let to_bob = format!("bob@{}", b.node());
    let sent = call_ok(&alice, "mesh_send", json!({ "to": to_bob, "body": "one" })).await;
    let id = sent["id"].as_str().unwrap().to_owned();
    call_ok(&alice, "mesh_send", json!({ "to": to_bob, "body": "two" })).await;
    let page = call_ok(&bob, "mesh_inbox", json!({ "limit": 1, "wait": 60 })).await;
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{page}");
    assert_eq!(
        (entries[0]["id"].as_str(), entries[0]["body"].as_str()),
        (Some(id.as_str()), Some("one"))
    );
    let page = call_ok(
        &bob,
        "mesh_inbox",
        json!({ "after": page["next"], "wait": 60 }),
    )
    .await;
    let bodies: Vec<&str> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["two"], "{page}");
    // The same cursor text works on the CLI.
    let next = page["next"].as_str().unwrap();
    let out = ok(b
        .mesh(&["--agent", "bob", "inbox", "--after", next])
        .unwrap());
    assert!(out.is_empty(), "{out}");

    // Request and reply between the two agents.
    let after = page["next"].clone();
    let asking = {
        let to = to_bob.clone();
        tokio::spawn(async move {
            let r = call_ok(
                &alice,
                "mesh_request",
                json!({ "to": to, "body": "ping", "timeout_secs": 90 }),
            )
            .await;
            (alice, r)
        })
    };
    let page = call_ok(&bob, "mesh_inbox", json!({ "after": after, "wait": 60 })).await;
    let ping = &page["entries"][0];
    assert_eq!(ping["body"], "ping", "{page}");
    call_ok(
        &bob,
        "mesh_reply",
        json!({ "id": ping["id"], "body": "pong" }),
    )
    .await;
    let (alice, answered) = asking.await.unwrap();
    assert_eq!(answered["reply"]["body"], "pong", "{answered}");
    assert_eq!(answered["reply"]["in_reply_to"], ping["id"]);

    // A refusal is a tool error with the API's code.
    let (r, err) = call(
        &alice,
        "mesh_send",
        json!({ "to": "carol@nowhere", "body": "x" }),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{err}");
    assert_eq!(err["code"], "unknown_peer", "{err}");
    assert_eq!(err["fault"], "not_found");
    // A request that gets no reply in time says so.
    let (r, err) = call(
        &alice,
        "mesh_request",
        json!({ "to": to_bob, "body": "anyone?", "timeout_secs": 1 }),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{err}");
    assert_eq!(err["code"], "timeout", "{err}");

    // alice answers the answer: a three-message thread across the two
    // nodes, read from either end once bob has the third.
    let thanks = call_ok(
        &alice,
        "mesh_reply",
        json!({ "id": answered["reply"]["id"], "body": "thanks" }),
    )
    .await;
    let mut after = ping["cursor"].clone();
    loop {
        let page = call_ok(
            &bob,
            "mesh_inbox",
            json!({ "after": after, "wait": 60, "ack_previous": false }),
        )
        .await;
        let entries = page["entries"].as_array().unwrap();
        assert!(!entries.is_empty(), "the third message did not reach bob");
        if entries.iter().any(|e| e["id"] == thanks["id"]) {
            break;
        }
        after = page["next"].clone();
    }
    let shape = |thread: &Value| -> Vec<(String, String, u64)> {
        thread["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["body"].as_str().unwrap().to_owned(),
                    e["dir"].as_str().unwrap().to_owned(),
                    e["depth"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let want = |dirs: [&str; 3]| -> Vec<(String, String, u64)> {
        ["ping", "pong", "thanks"]
            .iter()
            .zip(dirs)
            .zip(0..)
            .map(|((b, d), depth)| ((*b).to_owned(), d.to_owned(), depth))
            .collect()
    };
    let thread = call_ok(&alice, "mesh_thread", json!({ "id": ping["id"] })).await;
    assert_eq!(
        shape(&thread),
        want(["sent", "received", "sent"]),
        "{thread}"
    );
    assert_eq!(thread["truncated"], false, "{thread}");
    let thread = call_ok(
        &bob,
        "mesh_thread",
        json!({ "id": answered["reply"]["id"] }),
    )
    .await;
    assert_eq!(
        shape(&thread),
        want(["received", "sent", "received"]),
        "{thread}"
    );
    let (r, err) = call(
        &alice,
        "mesh_thread",
        json!({ "id": "00000000000000000000000000000000" }),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{err}");
    assert_eq!(err["code"], "unknown_message", "{err}");

    // The reply is alice's one unread entry (mesh_request read it, acked nothing).
    let agents = call_ok(&alice, "mesh_agents", json!({})).await;
    assert_eq!(agents["local"][0]["name"], "alice", "{agents}");
    assert_eq!(agents["local"][0]["unread"]["count"], 1, "{agents}");
    let status = call_ok(&alice, "mesh_status", json!({})).await;
    assert_eq!(status["node"], a.node());
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_for_a_subscribed_session_is_announced_then_read_once_and_stays_read_after_a_restart()
 {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    for agent in ["alice", "carol"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let (alice, mut heard) = mcp(a.data(), "alice").await;

    // The server says it pushes: resources it can subscribe to, and
    // Claude Code's channel.
    let info = alice.peer_info().expect("the server's info");
    let caps = &info.capabilities;
    assert_eq!(
        caps.resources.as_ref().and_then(|r| r.subscribe),
        Some(true)
    );
    let experimental = caps
        .experimental
        .as_ref()
        .expect("experimental capabilities");
    assert!(
        experimental.contains_key("claude/channel"),
        "{experimental:?}"
    );
    let uri = "mesh://inbox/alice";
    let resources = alice.list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, [uri]);
    #[allow(deprecated)] // The subscription of the initialize lifecycle, Claude Code's.
    alice
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    #[allow(deprecated)]
    let other = alice
        .subscribe(SubscribeRequestParams::new("mesh://inbox/carol"))
        .await;
    assert!(other.is_err(), "{other:?}");

    // The link from b is up before the clock starts: a message to carol
    // delivered (carol's entries are not alice's: nothing is heard).
    let warm = send_as(&b, "bob", &format!("carol@{}", a.node()), "warm-up");
    b.wait_message_state(&warm, "delivered", Duration::from_secs(60));
    let id = send_as(&b, "bob", &format!("alice@{}", a.node()), "hello alice");
    let (cursor, channel) = told(&mut heard, uri, true, TOLD_WITHIN).await;
    let cursor = cursor.unwrap();
    assert_eq!(channel["content"], "hello alice", "{channel}");
    let meta = &channel["meta"];
    assert_eq!(meta["id"], id.as_str(), "{channel}");
    assert_eq!(
        meta["from"],
        format!("bob@{}", b.node()).as_str(),
        "{channel}"
    );
    assert_eq!(meta["cursor"], cursor.as_str(), "{channel}");
    assert!(
        meta.as_object().unwrap().values().all(Value::is_string),
        "{channel}"
    );

    // A notification acks nothing: the resource and the first page have it.
    let page = read_inbox(&alice, uri).await;
    assert_eq!(bodies(&page), ["hello alice"], "{page}");
    let (got, page) = unread(&alice).await;
    assert_eq!(got, ["hello alice"], "{page}");
    assert_eq!(page["entries"][0]["cursor"], cursor.as_str());
    assert_eq!(page["entries"][0]["id"], id.as_str());
    // The second page acks the first: nothing is unread any more.
    let (got, page) = unread(&alice).await;
    assert!(got.is_empty(), "{page}");
    assert!(bodies(&read_inbox(&alice, uri).await).is_empty());
    heard_nothing_more(&mut heard);
    alice.cancel().await.unwrap();

    // Across a restart of the daemon, for a new session too.
    let (data, addr) = (a.data().to_owned(), a.peer_addr().unwrap());
    a.terminate().unwrap();
    let a = DaemonProcess::start(Path::new(MESH), &data, addr).unwrap();
    let (alice, _) = mcp(a.data(), "alice").await;
    let (got, page) = unread(&alice).await;
    assert!(got.is_empty(), "{page}");
    let out = ok(a.mesh(&["--agent", "alice", "inbox", "--unread"]).unwrap());
    assert!(out.is_empty(), "{out}");
    alice.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_not_acked_before_a_kill_comes_again_and_the_session_hears_on_after_the_restart() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    for agent in ["alice", "bob"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    let to = format!("alice@{}", a.node());
    let uri = "mesh://inbox/alice";
    let (first, mut heard) = mcp(a.data(), "alice").await;
    #[allow(deprecated)] // As above.
    first
        .subscribe(SubscribeRequestParams::new(uri))
        .await
        .unwrap();
    send_as(&a, "bob", &to, "one");
    told(&mut heard, uri, true, TOLD_WITHIN).await;
    let (got, _) = unread(&first).await;
    assert_eq!(got, ["one"]);

    // Killed (SIGKILL) after the page and before the call that acks it.
    let (data, addr) = (a.data().to_owned(), a.peer_addr().unwrap());
    drop(a);
    let a = DaemonProcess::start(Path::new(MESH), &data, addr).unwrap();
    let (second, _) = mcp(a.data(), "alice").await;
    let (got, _) = unread(&second).await;
    assert_eq!(got, ["one"], "a new session is given what was never acked");

    // The first session lived through it: its watch goes on after what it
    // told of, and its next page acks the one before the kill.
    send_as(&a, "bob", &to, "two");
    let (_, channel) = told(&mut heard, uri, true, BACK_WITHIN).await;
    assert_eq!(channel["content"], "two", "{channel}");
    let (got, _) = unread(&first).await;
    assert_eq!(got, ["two"]);
    let (got, page) = unread(&first).await;
    assert!(got.is_empty(), "{page}");
    // The second session's ack of its older page moves nothing back.
    let (got, page) = unread(&second).await;
    assert!(got.is_empty(), "{page}");
    first.cancel().await.unwrap();
    second.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_ack_moves_the_read_position_and_refuses_another_nodes_cursor_or_garbage() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    for agent in ["alice", "bob"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    ok(b.mesh(&["agent", "add", "carol"]).unwrap());
    let to = format!("alice@{}", a.node());
    for body in ["one", "two"] {
        send_as(&a, "bob", &to, body);
    }
    let (alice, _) = mcp(a.data(), "alice").await;
    let (carol, _) = mcp(b.data(), "carol").await;
    let theirs = call_ok(&carol, "mesh_inbox", json!({})).await["next"].clone();
    let page = call_ok(&alice, "mesh_inbox", json!({ "ack_previous": false })).await;
    assert_eq!(bodies(&page), ["one", "two"]);

    // Refused with the API's code, and nothing moved.
    let err = call_err(&alice, "mesh_ack", json!({ "cursor": "not-a-cursor" })).await;
    assert_eq!(err["code"], "bad_cursor", "{err}");
    assert_eq!(err["fault"], "caller", "{err}");
    let err = call_err(&alice, "mesh_ack", json!({ "cursor": theirs })).await;
    assert_eq!(err["code"], "cursor_other_node", "{err}");
    let page = call_ok(&alice, "mesh_inbox", json!({ "ack_previous": false })).await;
    assert_eq!(bodies(&page), ["one", "two"], "{page}");

    // Acked up to the first: the second is what is unread; an ack back is
    // a no-op, answered with the position as it is.
    let cursors: Vec<Value> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["cursor"].clone())
        .collect();
    let now = call_ok(&alice, "mesh_ack", json!({ "cursor": cursors[0] })).await;
    assert_eq!(now["cursor"], cursors[0], "{now}");
    let page = call_ok(&alice, "mesh_inbox", json!({ "ack_previous": false })).await;
    assert_eq!(bodies(&page), ["two"], "{page}");
    call_ok(&alice, "mesh_ack", json!({ "cursor": cursors[1] })).await;
    let now = call_ok(&alice, "mesh_ack", json!({ "cursor": cursors[0] })).await;
    assert_eq!(now["cursor"], cursors[1], "{now}");
    let (got, page) = unread(&alice).await;
    assert!(got.is_empty(), "{page}");
    alice.cancel().await.unwrap();
    carol.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_session_listening_on_the_inbox_hears_of_each_entry_with_its_cursor() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    for agent in ["alice", "bob"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let (alice, mut heard) = mcp_with(a.data(), "alice", lifecycle).await;
    let uri = "mesh://inbox/alice";
    let filter = SubscriptionFilter::builder()
        .resource_subscription(uri)
        .resource_subscription("mesh://inbox/bob")
        .build();
    let mut listening = tokio::time::timeout(CALL_TIMEOUT, alice.listen(filter))
        .await
        .expect("acknowledged in time")
        .unwrap();
    assert_eq!(
        listening.acknowledged().resource_subscriptions.as_deref(),
        Some(&[uri.to_owned()][..])
    );

    let id = send_as(&a, "bob", &format!("alice@{}", a.node()), "hi");
    let n = tokio::time::timeout(TOLD_WITHIN, listening.next())
        .await
        .expect("told in time")
        .unwrap()
        .expect("an update");
    let meta_cursor = n.get_meta().get("cursor").cloned();
    let ServerNotification::ResourceUpdatedNotification(update) = n else {
        panic!("a resource update: {n:?}")
    };
    assert_eq!(update.params.uri, uri);
    // The channel notification comes outside the listen stream.
    let (_, channel) = told(&mut heard, uri, false, TOLD_WITHIN).await;
    assert_eq!(channel["meta"]["id"], id.as_str(), "{channel}");
    let (got, page) = unread(&alice).await;
    assert_eq!(got, ["hi"], "{page}");
    let cursor = n_cursor(&update.params)
        .or(meta_cursor)
        .expect("an update carries its cursor");
    assert_eq!(cursor, page["entries"][0]["cursor"], "{page}");
    listening.cancel().await.unwrap();
    alice.cancel().await.unwrap();
}

/// The `cursor` in a resource update's `_meta`, where rmcp left it.
fn n_cursor(p: &ResourceUpdatedNotificationParam) -> Option<Value> {
    p.meta.as_ref().and_then(|m| m.get("cursor").cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_unread_backlog_is_told_of_in_a_few_notifications_and_one_summary() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    for agent in ["alice", "bob"] {
        ok(a.mesh(&["agent", "add", agent]).unwrap());
    }
    let to = format!("alice@{}", a.node());
    let mut last = String::new();
    for n in 0..8 {
        last = send_as(&a, "bob", &to, &format!("old {n}"));
    }
    a.wait_message_state(&last, "delivered", Duration::from_secs(60));
    // A session begins with 8 unread: 5 told one by one, then one summary.
    let (alice, mut heard) = mcp(a.data(), "alice").await;
    let mut channel = Vec::new();
    while channel.len() < 6 {
        match tokio::time::timeout(TOLD_WITHIN * 5, heard.recv())
            .await
            .expect("told of the backlog in time")
            .expect("the session is open")
        {
            Heard::Channel(p) => channel.push(p),
            Heard::Updated { .. } => {}
            other => panic!("heard {other:?}"),
        }
    }
    // rmcp's client may hand notifications on out of order: compare sets.
    let (summary, entries): (Vec<&Value>, Vec<&Value>) =
        channel.iter().partition(|p| p["meta"]["kind"] == "unread");
    let mut contents: Vec<&str> = entries
        .iter()
        .map(|p| p["content"].as_str().unwrap())
        .collect();
    contents.sort_unstable();
    assert_eq!(contents, ["old 0", "old 1", "old 2", "old 3", "old 4"]);
    assert_eq!(summary.len(), 1, "{channel:?}");
    assert_eq!(summary[0]["meta"]["count"], "3", "{}", summary[0]);
    // Nothing was acked by it: all 8 are unread.
    let (bodies, _) = unread(&alice).await;
    assert_eq!(bodies.len(), 8, "{bodies:?}");
    // What comes after is told of one by one.
    send_as(&a, "bob", &to, "new");
    let (_, p) = told(&mut heard, "mesh://inbox/alice", false, TOLD_WITHIN).await;
    assert_eq!(p["content"], "new", "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_send_with_receipt_brings_a_read_entry_to_mesh_inbox_once_the_reader_acks() {
    let tmp = temp_dir().unwrap();
    let a = start(&tmp.path().join("a"));
    let b = start(&tmp.path().join("b"));
    ok(a.mesh(&["peer", "add", b.ticket()]).unwrap());
    ok(b.mesh(&["peer", "add", a.ticket()]).unwrap());
    ok(a.mesh(&["agent", "add", "alice"]).unwrap());
    ok(b.mesh(&["agent", "add", "bob"]).unwrap());
    let (alice, _) = mcp(a.data(), "alice").await;
    let (bob, _) = mcp(b.data(), "bob").await;
    let tools = alice.list_all_tools().await.unwrap();
    let send = tools.iter().find(|t| t.name == "mesh_send").unwrap();
    let receipt = &send.input_schema["properties"]["receipt"];
    assert!(
        receipt["description"]
            .as_str()
            .is_some_and(|d| d.contains("read")),
        "{receipt}"
    );
    let to_bob = format!("bob@{}", b.node());
    let sent = call_ok(
        &alice,
        "mesh_send",
        json!({ "to": to_bob, "body": "read me", "receipt": true }),
    )
    .await;
    let id = sent["id"].as_str().unwrap().to_owned();
    let page = call_ok(&bob, "mesh_inbox", json!({ "wait": 60 })).await;
    assert_eq!(page["entries"][0]["id"], id.as_str(), "{page}");
    call_ok(&bob, "mesh_ack", json!({ "cursor": page["next"] })).await;
    let page = call_ok(&alice, "mesh_inbox", json!({ "wait": 60 })).await;
    let read = &page["entries"][0];
    assert_eq!(read["kind"], "read", "{page}");
    assert_eq!(read["ids"], json!([id]), "{page}");
    assert_eq!(read["from"], to_bob.as_str());
    assert!(read["read_ms"].as_u64().is_some(), "{page}");
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    for d in [a, b] {
        assert!(d.terminate().unwrap().success());
    }
}
