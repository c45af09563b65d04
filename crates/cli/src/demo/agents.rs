//! Step 7 of the demo: two agents on two nodes talk by address.

use std::io::Write;

use anyhow::{Context, bail};
use mesh_api::client::Client;
use mesh_api::{
    AgentSendRequest, AgentSendResponse, AliasRequest, InboxEntry, InboxPage, PeerStatus,
    ReplyRequest,
};

use super::narrator::{Narrator, short};
use super::node::DemoNode;

/// Step 7: an agent on alpha and one on charlie talk by address.
pub(super) async fn agents_talk(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    charlie: &DemoNode,
) -> anyhow::Result<()> {
    say.line(
        "7. Two agents: `planner` on alpha, `coder` on charlie, each with its own key and its \
         own socket
   (`mesh agent add NAME`). alpha names charlie `charlie` (`mesh peer name`).",
    )?;
    let planner = alpha.add_agent("planner").await?;
    let coder = charlie.add_agent("coder").await?;
    let _: PeerStatus = alpha
        .client()
        .put(
            &format!("/v1/peers/{}/alias", charlie.id()),
            &AliasRequest {
                alias: Some("charlie".into()),
            },
        )
        .await?;
    let answer = ask_and_reply(say, &planner, &coder).await?;
    let lost = agent_send(&planner, "planner", "tester@charlie", "run the tests").await?;
    let bounced = inbox_wait(&planner, "planner", Some(&answer.cursor)).await?;
    let bounce = bounced
        .iter()
        .find(|e| e.kind == "bounce" && e.id.as_deref() == Some(lost.id.as_str()))
        .context("planner's inbox holds no bounce")?;
    say.line(format_args!(
        "   planner -> tester@charlie: charlie has no agent `tester`; the message is journaled \
         there as
   undeliverable and comes back to planner: {}\n",
        bounce.reason.as_deref().unwrap_or("?")
    ))
}

/// planner asks coder@charlie for a review, coder reads it and replies, and
/// planner reads the reply, which it returns.
async fn ask_and_reply(
    say: &mut Narrator<'_, impl Write>,
    planner: &Client,
    coder: &Client,
) -> anyhow::Result<InboxEntry> {
    let ask = agent_send(
        planner,
        "planner",
        "coder@charlie",
        "please review the parser",
    )
    .await?;
    say.line(format_args!(
        "   planner -> coder@charlie: \"please review the parser\"  (message {})",
        short(&ask.id)
    ))?;
    let got = inbox_wait(coder, "coder", None).await?;
    let first = got
        .iter()
        .find(|e| e.id.as_deref() == Some(ask.id.as_str()))
        .context("coder's inbox does not hold planner's message")?;
    say.line(format_args!(
        "   coder's inbox (`mesh --agent coder inbox`): from {} \"{}\", sender verified: {}",
        short_address(first.from.as_deref().unwrap_or("")),
        first.body,
        first.verified
    ))?;
    let req = ReplyRequest {
        id: ask.id.clone(),
        body: "looks good".into(),
        encoding: Default::default(),
        client_id: None,
    };
    let reply: AgentSendResponse = coder.post("/v1/agents/coder/reply", &req).await?;
    let back = inbox_wait(planner, "planner", Some(&ask.cursor)).await?;
    let answer = back
        .into_iter()
        .find(|e| e.id.as_deref() == Some(reply.id.as_str()))
        .context("planner's inbox does not hold the reply")?;
    say.line(format_args!(
        "   coder replies; planner's inbox: \"{}\" in reply to {}",
        answer.body,
        short(answer.in_reply_to.as_deref().unwrap_or(""))
    ))?;
    Ok(answer)
}

/// Sends `body` as `agent` through its socket client `c`.
async fn agent_send(
    c: &Client,
    agent: &str,
    to: &str,
    body: &str,
) -> anyhow::Result<AgentSendResponse> {
    let req = AgentSendRequest {
        to: to.into(),
        body: body.into(),
        encoding: Default::default(),
        in_reply_to: None,
        client_id: None,
        key: None,
        receipt: false,
    };
    Ok(c.post(&format!("/v1/agents/{agent}/send"), &req).await?)
}

/// `agent`'s inbox after `after`, waiting for its first entry.
async fn inbox_wait(
    c: &Client,
    agent: &str,
    after: Option<&str>,
) -> anyhow::Result<Vec<InboxEntry>> {
    let mut path = format!("/v1/agents/{agent}/inbox?wait=30");
    if let Some(a) = after {
        path.push_str(&format!("&after={}", mesh_api::path_segment(a)));
    }
    let page: InboxPage = c.get(&path).await?;
    if page.entries.is_empty() {
        bail!("{agent}'s inbox got nothing within 30 s");
    }
    Ok(page.entries)
}

fn short_address(address: &str) -> String {
    match address.split_once('@') {
        Some((agent, node)) => format!("{agent}@{}", short(node)),
        None => short(address),
    }
}
