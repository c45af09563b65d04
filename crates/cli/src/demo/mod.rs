//! `mesh demo`: three real nodes in a temp dir, narrated.
//!
//! Each node is a `mesh daemon` process of the running executable (its own
//! key, redb store, iroh endpoint on 127.0.0.1 and API socket), driven only
//! through its socket API, as `mesh` and agents drive one. The demo links
//! the three, sends both ways, stops one, sends more to it, restarts it and
//! shows the catch-up, and shows the gap a node journals when a sender's
//! outbox overflowed while it was away; then two agents on two nodes talk
//! by address, reply, and see a bounce. Every figure printed (ids, seqs,
//! marks, cursors, arrivals) is read back from the nodes. It stops the
//! nodes and removes its temp dir however it ends, and gives up after
//! [`DEMO_TIMEOUT`].

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mesh_api::{EventEntry, EventRecord};

/// The whole demo finishes within this, or stops with an error.
pub const DEMO_TIMEOUT: Duration = Duration::from_secs(90);
/// How often a node is asked whether what the demo waits for has happened.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How many times before a wait gives up (about 30 s).
const POLLS_MAX: u32 = 1500;
/// bravo's tiny outbox: the most messages it keeps per peer.
const BRAVO_OUTBOX_MSGS: u64 = 3;
/// Messages alpha sends charlie while charlie is stopped.
const AWAY_FROM_ALPHA: usize = 5;
/// Messages bravo sends charlie while charlie is stopped (more than its outbox keeps).
const AWAY_FROM_BRAVO: usize = 6;
/// The longest message text shown in a journal line.
const SHOWN_BODY_CHARS_MAX: usize = 40;

mod agents;
mod narrator;
mod node;

use agents::agents_talk;
use narrator::{Narrator, numbered, seq_range, seqs_from, short, span};
use node::{DemoNode, wait_acknowledged, wait_connected};

/// Runs the demo in a new temp dir with daemons of the `mesh` executable
/// `bin`, writing the narration to `out`; the dir is removed however it ends.
///
/// # Errors
/// If a node does not start, a step does not happen within its wait, or the
/// whole demo takes longer than [`DEMO_TIMEOUT`].
pub async fn run(bin: &Path, out: &mut impl Write) -> anyhow::Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("mesh-demo-")
        .tempdir()
        .context("cannot create the demo's temp dir")?;
    match tokio::time::timeout(DEMO_TIMEOUT, demo(bin, out, tmp.path())).await {
        Ok(result) => result,
        Err(_) => bail!("the demo did not finish within {DEMO_TIMEOUT:?}"),
    }
}

async fn demo(bin: &Path, out: &mut impl Write, root: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut say = Narrator { out };
    say.line(format_args!(
        "agent-mesh demo: three real nodes, each a `mesh daemon` process with its own key, store,\n\
         QUIC endpoint on 127.0.0.1 and API socket, in {}\n",
        root.display()
    ))?;
    let [alpha, bravo, mut charlie] = start_nodes(&mut say, bin, root).await?;
    link(&mut say, [&alpha, &bravo, &charlie]).await?;
    let cursor = send_each_way(&mut say, &alpha, &bravo, &charlie).await?;

    say.line(format_args!(
        "4. Stop charlie. Its key and store stay in {}.",
        charlie.proc.data_dir().display()
    ))?;
    charlie.stop().await?;
    say.line("")?;

    send_while_away(&mut say, &alpha, &bravo, &charlie).await?;
    catch_up(&mut say, &alpha, &bravo, &mut charlie, &cursor).await?;
    agents_talk(&mut say, &alpha, &charlie).await?;

    say.line(format_args!(
        "8. Stop all three nodes and remove {}.",
        root.display()
    ))?;
    for mut n in [alpha, bravo, charlie] {
        n.stop().await?;
    }
    say.line(format_args!(
        "\nDone in {:.1} s. Run a node of your own with `mesh daemon`; the README shows a \
         two-node session.",
        started.elapsed().as_secs_f64()
    ))?;
    Ok(())
}

/// Step 1: alpha, bravo (with a tiny evicting outbox) and charlie.
async fn start_nodes(
    say: &mut Narrator<'_, impl Write>,
    bin: &Path,
    root: &Path,
) -> anyhow::Result<[DemoNode; 3]> {
    say.line("1. Start three nodes.")?;
    let alpha = DemoNode::start(bin, root, "alpha", None).await?;
    let bravo_config =
        format!("[outbox]\nmax_msgs = {BRAVO_OUTBOX_MSGS}\non_full = \"evict-oldest\"\n");
    let bravo = DemoNode::start(bin, root, "bravo", Some(&bravo_config)).await?;
    let charlie = DemoNode::start(bin, root, "charlie", None).await?;
    for n in [&alpha, &bravo, &charlie] {
        say.line(format_args!(
            "   {:8} node {}  peers dial it at 127.0.0.1:{}",
            n.name,
            short(n.id()),
            n.proc.peer_addr().port()
        ))?;
    }
    say.line(format_args!(
        "   bravo's config.toml keeps at most {BRAVO_OUTBOX_MSGS} unacknowledged messages per peer \
         and evicts the oldest when full\n   ([outbox] max_msgs = {BRAVO_OUTBOX_MSGS}, \
         on_full = \"evict-oldest\"); the default is a million, and refusing new sends.\n"
    ))?;
    Ok([alpha, bravo, charlie])
}

/// Step 2: alpha invites bravo and charlie, bravo invites charlie; they join.
async fn link(say: &mut Narrator<'_, impl Write>, nodes: [&DemoNode; 3]) -> anyhow::Result<()> {
    let [alpha, bravo, charlie] = nodes;
    say.line(
        "2. Link them with invites: alpha invites two nodes (`mesh invite --uses 2`), bravo one\n   \
         (`mesh invite`); the new nodes join with the code (`mesh join CODE`). Joining makes both\n   \
         sides peers: no ticket is copied by hand, nothing is run on the inviter.",
    )?;
    let t = Instant::now();
    let code = alpha.invite(2).await?;
    say.line(format_args!(
        "   alpha's code: {}… (its id and addresses, and the invite's secret)",
        code.chars().take(40).collect::<String>()
    ))?;
    for joiner in [bravo, charlie] {
        joiner.join(&code).await?;
        say.line(format_args!(
            "   {} joined alpha's mesh with it",
            joiner.name
        ))?;
    }
    let code = bravo.invite(1).await?;
    charlie.join(&code).await?;
    say.line("   charlie joined bravo with bravo's code")?;
    let pairs = [(alpha, bravo), (alpha, charlie), (bravo, charlie)];
    for (a, b) in pairs {
        wait_connected(a, b).await?;
    }
    say.line(format_args!(
        "   alpha-bravo, alpha-charlie and bravo-charlie are connected ({:.1} s).\n",
        t.elapsed().as_secs_f64()
    ))
}

/// Step 3: one message each way; answers charlie's cursor after them.
async fn send_each_way(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    bravo: &DemoNode,
    charlie: &DemoNode,
) -> anyhow::Result<String> {
    say.line("3. Send, each way. A send answers once the message is committed to disk.")?;
    for (from, to, text) in [
        (alpha, bravo, "hello bravo, alpha here"),
        (bravo, alpha, "hi alpha, bravo here"),
        (alpha, charlie, "hello charlie, alpha here"),
        (bravo, charlie, "hello charlie, bravo here"),
    ] {
        let sent = from.send(to, vec![text.to_owned()]).await?;
        say.line(format_args!(
            "   {:7} -> {:7} {:28} seq {} of {}'s stream to {}",
            from.name,
            to.name,
            format!("{text:?}"),
            sent[0].seq,
            from.name,
            to.name
        ))?;
    }
    let first = charlie
        .wait_for_messages(
            "",
            &[(alpha, 1), (bravo, 1)],
            "charlie to receive the first messages",
        )
        .await?;
    for (a, b) in [
        (alpha, bravo),
        (bravo, alpha),
        (alpha, charlie),
        (bravo, charlie),
    ] {
        wait_acknowledged(a, b).await?;
    }
    say.line("   charlie's journal (`mesh events` on charlie):")?;
    say.entries(&first, &[alpha, bravo, charlie])?;
    let cursor = first.last().map(|e| e.cursor.clone()).unwrap_or_default();
    say.line(format_args!(
        "   Every sender's outbox is acknowledged; charlie's marks: {}.\n   \
         charlie's cursor after its last entry: {cursor}\n   \
         (`mesh events --after CURSOR` on charlie pages on from there, across restarts.)\n",
        charlie.marks(&[alpha, bravo]).await?
    ))?;
    Ok(cursor)
}

/// Step 5: alpha and bravo send to the stopped charlie; bravo's outbox overflows.
async fn send_while_away(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    bravo: &DemoNode,
    charlie: &DemoNode,
) -> anyhow::Result<()> {
    say.line("5. Send to charlie while it is away.")?;
    let sent = alpha
        .send(
            charlie,
            numbered("from alpha, while you were away", AWAY_FROM_ALPHA),
        )
        .await?;
    say.line(format_args!(
        "   alpha -> charlie: {} messages, seqs {}, committed to alpha's outbox; {} queued for charlie.",
        sent.len(),
        seq_range(&sent),
        alpha.peer(charlie).await?.queued_msgs
    ))?;
    let bravo_head = bravo.journal_cursor().await?;
    // One at a time, as `mesh send` does: each is its own commit and batch.
    let mut sent = Vec::new();
    for body in numbered("from bravo, while you were away", AWAY_FROM_BRAVO) {
        sent.extend(bravo.send(charlie, vec![body]).await?);
    }
    say.line(format_args!(
        "   bravo -> charlie: {} messages, seqs {}. bravo keeps only {BRAVO_OUTBOX_MSGS}, so each send \
         past that\n   evicted the oldest unacknowledged one, and bravo journaled each loss \
         (`mesh events` on bravo):",
        sent.len(),
        seq_range(&sent)
    ))?;
    let losses: Vec<EventEntry> = bravo
        .events_after(&bravo_head)
        .await?
        .into_iter()
        .filter(|e| matches!(e.record, EventRecord::Loss { .. }))
        .collect();
    say.entries(&losses, &[alpha, bravo, charlie])?;
    say.line("")
}

/// Step 6: charlie restarts and catches up, with a gap where bravo evicted.
async fn catch_up(
    say: &mut Narrator<'_, impl Write>,
    alpha: &DemoNode,
    bravo: &DemoNode,
    charlie: &mut DemoNode,
    cursor: &str,
) -> anyhow::Result<()> {
    say.line("6. Restart charlie from the same data dir: same key, same store, same port.")?;
    let t = Instant::now();
    charlie.restart().await?;
    let alpha_last = AWAY_FROM_ALPHA as u64 + 1;
    let bravo_last = AWAY_FROM_BRAVO as u64 + 1;
    let caught_up = charlie
        .wait_for_messages(
            cursor,
            &[(alpha, alpha_last), (bravo, bravo_last)],
            "charlie to catch up",
        )
        .await?;
    let took = t.elapsed().as_secs_f64();
    say.line(format_args!(
        "   It reconnected and sent each peer its marks; each peer sent what came after them.\n   \
         charlie's journal after the cursor above (`mesh events --after {cursor}`):"
    ))?;
    say.entries(&caught_up, &[alpha, bravo, charlie])?;
    let (from_alpha, from_bravo) = (seqs_from(&caught_up, alpha), seqs_from(&caught_up, bravo));
    say.line(format_args!(
        "   Catch-up in {took:.1} s: {} messages from alpha ({}) and {} from bravo ({}).",
        from_alpha.len(),
        span(&from_alpha),
        from_bravo.len(),
        span(&from_bravo)
    ))?;
    let gaps: Vec<String> = caught_up
        .iter()
        .filter_map(|e| match &e.record {
            EventRecord::Gap { stream, from, to } if stream.author == bravo.id() => {
                Some(format!("#{from}..=#{to}"))
            }
            _ => None,
        })
        .collect();
    if gaps.is_empty() {
        bail!("charlie journaled no gap for bravo's evicted messages");
    }
    say.line(format_args!(
        "   And a gap: bravo no longer held {} of its stream to charlie, so charlie \
         journaled\n   a gap record in their place. Nothing was skipped silently: \
         every reader sees it.",
        gaps.join(", ")
    ))?;
    say.line(format_args!(
        "   charlie's marks now: {}.\n",
        charlie.marks(&[alpha, bravo]).await?
    ))
}
