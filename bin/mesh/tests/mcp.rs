//! `mesh mcp --agent NAME` spawned as a child and driven by a real MCP
//! client (rmcp's), against real daemons: initialize, list the tools, send,
//! page the inbox with its cursor, request and reply between two agents,
//! and a refusal as a tool error with the API's code.
#![allow(clippy::unwrap_used)] // A test fails by panicking.

use std::path::Path;
use std::time::Duration;

use mesh_tests::daemon::{DaemonProcess, ok, temp_dir};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::{Value, json};

const MESH: &str = env!("CARGO_BIN_EXE_mesh");
/// How long one tool call may take (a wait inside it is shorter).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

fn start(data: &Path) -> DaemonProcess {
    DaemonProcess::start_local(Path::new(MESH), data).unwrap()
}

type Session = RunningService<RoleClient, ()>;

/// `mesh --data DATA --agent AGENT mcp` as a child, with an MCP client on it.
async fn mcp(data: &Path, agent: &str) -> Session {
    let cmd = tokio::process::Command::new(MESH).configure(|c| {
        c.arg("--data")
            .arg(data)
            .args(["--agent", agent, "mcp"])
            .env_remove("RUST_LOG");
    });
    let transport = TokioChildProcess::new(cmd).unwrap();
    tokio::time::timeout(CALL_TIMEOUT, ().serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

/// Calls `tool` with `args`; the result and its structured content.
async fn call(s: &Session, tool: &'static str, args: Value) -> (CallToolResult, Value) {
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
async fn call_ok(s: &Session, tool: &'static str, args: Value) -> Value {
    let (r, v) = call(s, tool, args).await;
    assert_ne!(r.is_error, Some(true), "{tool} failed: {v}");
    v
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
    let alice = mcp(a.data(), "alice").await;
    let bob = mcp(b.data(), "bob").await;

    // Initialize said who it is; the tools are the six, each described.
    let info = alice.peer_info().expect("the server's info");
    let server = info.server_info.clone().expect("the server names itself");
    assert_eq!(server.name, "agent-mesh");
    let tools = alice.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "mesh_agents",
            "mesh_inbox",
            "mesh_reply",
            "mesh_request",
            "mesh_send",
            "mesh_status"
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

    let agents = call_ok(&alice, "mesh_agents", json!({})).await;
    assert_eq!(agents["local"][0]["name"], "alice", "{agents}");
    let status = call_ok(&alice, "mesh_status", json!({})).await;
    assert_eq!(status["node"], a.node());
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
}
