//! `mesh --agent NAME inbox --unread --hook claude`: an agent's unread
//! inbox as a Claude Code hook hands it to the model, so the agent is told
//! of its mail without asking for it.
//!
//! Claude Code's hook contract, as this command relies on it (its "Hooks"
//! reference, docs.claude.com/en/docs/claude-code/hooks):
//!
//! - The hook command gets one JSON object on stdin: `session_id`,
//!   `transcript_path`, `cwd`, `hook_event_name` (`"UserPromptSubmit"`,
//!   `"Stop"`, ...) and per event more; for `Stop`, `stop_hook_active`:
//!   true when the agent is already going on because a Stop hook blocked
//!   its stop (blocking again could loop forever).
//! - Exit 0: stdout, if it is JSON, is the hook's answer. For
//!   `UserPromptSubmit`, `{"hookSpecificOutput": {"hookEventName":
//!   "UserPromptSubmit", "additionalContext": TEXT}}` adds TEXT to the
//!   context of the prompt. For `Stop`, `{"decision": "block", "reason":
//!   TEXT}` keeps the agent from ending its turn and tells it TEXT. Empty
//!   stdout: nothing happens.
//! - Exit 2 is a blocking error (stderr goes to the model; a Stop hook's
//!   keeps it going): never used here. Any other non-zero exit is a
//!   non-blocking error whose stderr the user sees: this command's failures
//!   (no daemon, no such agent, bad input) exit 1 with one line on stderr.
//!
//! `--hook gemini` answers Gemini CLI's hooks the same way (its "Hooks
//! reference", geminicli.com/docs/hooks/reference): the stdin JSON's
//! `hook_event_name` is `"BeforeAgent"` (after the user's prompt, before
//! planning: `hookSpecificOutput.additionalContext` is appended to the
//! prompt for this turn) or `"AfterAgent"` (after the turn's final answer:
//! `{"decision": "deny", "reason": TEXT}` rejects it and sends TEXT to the
//! agent as a new prompt; `stop_hook_active` is true when it already runs
//! as part of such a retry). Gemini CLI parses stdout as JSON on exit 0,
//! so with nothing to say the answer is `{}`; another exit is a warning
//! and the CLI goes on (exit 2 would block: never used).
//!
//! Reading acks nothing: the agent acks what it handled with `mesh --agent
//! NAME ack CURSOR`, and until then each prompt shows the mail again.

use std::io::{IsTerminal as _, Read as _};
use std::time::Duration;

use mesh_api::{BodyEncoding, InboxEntry, InboxPage, path_segment};
use serde::Deserialize;

use crate::agents::AgentArgs;

/// The most unread entries one hook answer shows.
pub(crate) const HOOK_ENTRIES_MAX: usize = 20;

/// About the most bytes of text one hook answer holds (a body is cut to
/// fit; the first entry is always shown).
pub(crate) const HOOK_TEXT_BYTES_MAX: usize = 16 * 1024;

/// Unread entries read to count what waits beyond what is shown.
const HOOK_READ_ENTRIES: usize = 100;

/// The most bytes of the hook's JSON read from stdin.
const HOOK_STDIN_BYTES_MAX: u64 = 1 << 20;

/// How long the hook waits for its stdin to end (Claude Code writes it
/// and closes it at once; a pipe left open by someone else is not waited on
/// for ever).
const HOOK_STDIN_WAIT: Duration = Duration::from_secs(5);

/// The hook failed: exits 1 (a non-blocking error for Claude Code) with
/// the reason on one line of stderr.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct HookFailed(String);

/// `error` as a [`HookFailed`], its causes on one line.
pub(crate) fn failed(error: anyhow::Error) -> anyhow::Error {
    HookFailed(format!("mesh hook: {error:#}")).into()
}

/// The hook events answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    UserPromptSubmit,
    Stop,
}

/// What of the hook's stdin JSON is read (the rest is ignored).
#[derive(Debug, Default, Deserialize)]
struct HookInput {
    hook_event_name: Option<String>,
    #[serde(default)]
    stop_hook_active: bool,
}

/// The AI agents whose hooks `--hook` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Client {
    /// Claude Code: `UserPromptSubmit` and `Stop`.
    Claude,
    /// Gemini CLI: `BeforeAgent` and `AfterAgent`.
    Gemini,
}

impl Client {
    /// The client `--hook` names.
    pub(crate) fn named(name: &str) -> anyhow::Result<Client> {
        match name {
            "claude" => Ok(Client::Claude),
            "gemini" => Ok(Client::Gemini),
            other => anyhow::bail!("--hook {other:?}: use claude or gemini"),
        }
    }

    /// Its names of the two events: (the prompt's, the turn's end), as the
    /// stdin JSON says them and as `--event` does.
    fn events(self) -> [(&'static str, &'static str); 2] {
        match self {
            Client::Claude => [("UserPromptSubmit", "user-prompt-submit"), ("Stop", "stop")],
            Client::Gemini => [
                ("BeforeAgent", "before-agent"),
                ("AfterAgent", "after-agent"),
            ],
        }
    }
}

/// Runs the hook of `client` for the agent of `args`: `event` is `--event`
/// (else the stdin JSON's `hook_event_name`).
pub(crate) async fn run(
    client: Client,
    args: &AgentArgs,
    event: Option<&str>,
) -> anyhow::Result<()> {
    let input = read_input()?;
    let [(prompt_json, prompt_arg), (stop_json, stop_arg)] = client.events();
    let hook = match client {
        Client::Claude => "claude",
        Client::Gemini => "gemini",
    };
    let event = match (event, input.hook_event_name.as_deref()) {
        (Some(e), _) if e == prompt_arg => Event::UserPromptSubmit,
        (None, Some(e)) if e == prompt_json => Event::UserPromptSubmit,
        (Some(e), _) if e == stop_arg => Event::Stop,
        (None, Some(e)) if e == stop_json => Event::Stop,
        (Some(other), _) => {
            anyhow::bail!("--event {other:?}: --hook {hook} takes {prompt_arg} or {stop_arg}")
        }
        (None, Some(other)) => anyhow::bail!(
            "hook_event_name {other:?}: --hook {hook} answers {prompt_json} and {stop_json} \
             (set the hook on those events only)"
        ),
        (None, None) => anyhow::bail!(
            "which hook event? pass --event {prompt_arg}|{stop_arg}, or give the hook's JSON \
             (with hook_event_name) on stdin, as the client does"
        ),
    };
    // Nothing to say: Claude Code takes empty stdout, Gemini CLI `{}`.
    let nothing = || {
        if client == Client::Gemini {
            println!("{{}}");
        }
    };
    // The agent is already going on because of such a hook: let it stop.
    if event == Event::Stop && input.stop_hook_active {
        nothing();
        return Ok(());
    }
    let c = args.required("inbox --hook").await?;
    let agent = c.agent().unwrap_or_default().to_owned();
    let path = format!(
        "/v1/agents/{}/inbox?unread=true&limit={HOOK_READ_ENTRIES}",
        path_segment(&agent)
    );
    let page: InboxPage = c.get(&path).await?;
    let Some(text) = unread_text(&agent, &page.entries) else {
        nothing();
        return Ok(());
    };
    let answer = match (event, client) {
        (Event::UserPromptSubmit, _) => serde_json::json!({
            "hookSpecificOutput": {
                "hookEventName": prompt_json,
                "additionalContext": text,
            }
        }),
        (Event::Stop, Client::Claude) => serde_json::json!({ "decision": "block", "reason": text }),
        // Rejects the turn's answer: the reason goes to the agent as a new prompt.
        (Event::Stop, Client::Gemini) => serde_json::json!({ "decision": "deny", "reason": text }),
    };
    println!("{answer}");
    Ok(())
}

/// The hook's stdin JSON: none if stdin is a terminal or empty.
///
/// # Errors
/// If stdin cannot be read, is not JSON, or does not end within
/// [`HOOK_STDIN_WAIT`].
fn read_input() -> anyhow::Result<HookInput> {
    if std::io::stdin().is_terminal() {
        return Ok(HookInput::default());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    // A thread, so that a pipe nobody closes is waited on for a bounded time.
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let read = std::io::stdin()
            .lock()
            .take(HOOK_STDIN_BYTES_MAX)
            .read_to_end(&mut text)
            .map(|_| text);
        let _ = tx.send(read);
    });
    let text = match rx.recv_timeout(HOOK_STDIN_WAIT) {
        Ok(read) => read.map_err(|e| anyhow::anyhow!("cannot read stdin: {e}"))?,
        Err(_) => anyhow::bail!(
            "stdin did not end within {} s: a hook reads its client's JSON there (pass \
             --event and close stdin when running it by hand)",
            HOOK_STDIN_WAIT.as_secs()
        ),
    };
    if text.iter().all(u8::is_ascii_whitespace) {
        return Ok(HookInput::default());
    }
    serde_json::from_slice(&text)
        .map_err(|e| anyhow::anyhow!("stdin is not the JSON object of a hook: {e}"))
}

/// What the agent is told of its unread `entries`, or `None` if there are
/// none: at most [`HOOK_ENTRIES_MAX`] of them and about
/// [`HOOK_TEXT_BYTES_MAX`] bytes, and how many more wait.
fn unread_text(agent: &str, entries: &[InboxEntry]) -> Option<String> {
    let last = entries.len().min(HOOK_ENTRIES_MAX);
    if last == 0 {
        return None;
    }
    let mut text = format!("agent-mesh: you (agent {agent}) have unread messages in your inbox.\n");
    let mut shown = 0;
    for e in &entries[..last] {
        let head = entry_head(e);
        let room = HOOK_TEXT_BYTES_MAX.saturating_sub(text.len() + head.len());
        if shown > 0 && room < 256 {
            break;
        }
        text.push('\n');
        text.push_str(&head);
        push_cut(&mut text, &e.body, room, agent);
        text.push('\n');
        shown += 1;
    }
    let left = entries.len() - shown;
    let more = match left {
        0 => String::new(),
        n if entries.len() >= HOOK_READ_ENTRIES => {
            format!(
                " {n} or more further unread entries wait: `mesh --agent {agent} inbox --unread`."
            )
        }
        1 => format!(" 1 further unread entry waits: `mesh --agent {agent} inbox --unread`."),
        n => format!(" {n} further unread entries wait: `mesh --agent {agent} inbox --unread`."),
    };
    text.push_str(&format!(
        "\nWhen you have handled a message, ack it with `mesh --agent {agent} ack CURSOR` (that \
         entry and every one before it count as read; until then they are shown again). \
         Reply with `mesh --agent {agent} reply ID TEXT`; `mesh --agent {agent} thread ID` \
         shows a conversation.{more}"
    ));
    Some(text)
}

/// The lines before an entry's body: what it is, from whom, its id and
/// cursor.
fn entry_head(e: &InboxEntry) -> String {
    let mut head = match e.kind.as_str() {
        "message" => "message".to_owned(),
        other => format!("{other} (a notice from the mesh, not a message)"),
    };
    if let Some(from) = &e.from {
        head.push_str(&format!("\nfrom: {from}"));
    }
    if let Some(id) = &e.id {
        head.push_str(&format!("\nid: {id}"));
    }
    if let Some(r) = &e.in_reply_to {
        head.push_str(&format!("\nin reply to: {r}"));
    }
    if !e.verified && e.kind == "message" {
        head.push_str("\nsender unverified: its node never announced this agent");
    }
    head.push_str(&format!("\ncursor: {}\n", e.cursor));
    match e.encoding {
        BodyEncoding::Base64 => head.push_str("body (base64):\n"),
        _ => head.push_str("body:\n"),
    }
    head
}

/// Appends `body` to `text`, cut to about `room` bytes (on a character
/// boundary) with a note of what was left out.
fn push_cut(text: &mut String, body: &str, room: usize, agent: &str) {
    if body.len() <= room {
        text.push_str(body);
        return;
    }
    let mut end = room.saturating_sub(200);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    text.push_str(&body[..end]);
    text.push_str(&format!(
        "\n[cut: {} more bytes; `mesh --agent {agent} inbox --unread --json` shows it whole]",
        body.len() - end
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize, body: &str) -> InboxEntry {
        InboxEntry {
            kind: "message".into(),
            id: Some(format!("id{n}")),
            from: Some("bob@node".into()),
            to: Some("alice@here".into()),
            in_reply_to: None,
            body: body.into(),
            encoding: BodyEncoding::Text,
            cursor: format!("mc1cursor{n}"),
            arrival: n as u64,
            verified: true,
            reason: None,
            created_ms: None,
            superseded_by: None,
            forwarded_by: None,
            ids: None,
            read_ms: None,
        }
    }

    #[test]
    fn no_unread_entries_is_no_text() {
        assert_eq!(unread_text("alice", &[]), None);
    }

    #[test]
    fn each_entry_shows_its_sender_id_cursor_body_and_the_ack_line() {
        let text = unread_text("alice", &[entry(1, "hello there")]).unwrap();
        for want in [
            "from: bob@node",
            "id: id1",
            "cursor: mc1cursor1",
            "hello there",
            "mesh --agent alice ack CURSOR",
        ] {
            assert!(text.contains(want), "no {want:?} in {text}");
        }
        assert!(!text.contains("further"), "{text}");
    }

    #[test]
    fn the_text_is_bounded_in_entries_and_bytes_and_says_what_waits() {
        let many: Vec<_> = (0..30).map(|n| entry(n, "short")).collect();
        let text = unread_text("alice", &many).unwrap();
        assert_eq!(text.matches("cursor: ").count(), HOOK_ENTRIES_MAX);
        assert!(text.contains("10 further unread entries wait"), "{text}");
        let big: Vec<_> = (0..3).map(|n| entry(n, &"é".repeat(20_000))).collect();
        let text = unread_text("alice", &big).unwrap();
        assert!(text.len() <= HOOK_TEXT_BYTES_MAX + 1024, "{}", text.len());
        assert!(text.contains("[cut: "), "the first body is cut to fit");
        assert!(text.contains("2 further unread entries wait"), "{text}");
    }
}
