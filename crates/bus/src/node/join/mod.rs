//! Joining with one invite: the inviter, the one owner of this node's
//! invites, and the joiner's side of the exchange.
//!
//! The inviter is a task of its own beside the node task. It takes the
//! connections the transport hands over on the join ALPN (from any node:
//! at most [`JOIN_ATTEMPTS_MAX`] at once, each read within
//! [`JOIN_TIMEOUT`] and capped at [`JOIN_MESSAGE_BYTES_MAX`]) and the
//! node handle's invite requests (make, revoke), and decides one at a time,
//! so two decisions never race on one invite's record. Every write goes
//! through the node (the store's one writer) and is answered once durable:
//!
//! 1. the invite is claimed for the presenting key for [`INVITE_LEASE_MS`]
//!    (`claimed_by`, `claimed_until`), committed;
//! 2. the key is made a peer at its card's addresses, committed;
//! 3. only then is the use spent, committed, and the newcomer welcomed.
//!
//! A failure at any step answers [`JoinAnswer::TryAgain`] with nothing
//! spent (a claim stays the presenter's until its lease ends). A key that
//! lost the answer after the spend may finish inside the lease with a new,
//! proven request; a redelivered one is refused ([`decide`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iroh::endpoint::{Connection, RecvStream, SendStream};
use iroh::{Endpoint, RelayUrl};
use mesh_protocol::{
    InviteCode, InviteId, InviteSecret, JOIN_ALPN, JOIN_MESSAGE_BYTES_MAX, JoinAnswer,
    JoinError as WireError, JoinRefusal, JoinRequest, NodeCard, NodeId, RequestId, SecretKey,
    decode_join, encode_join,
};
use mesh_store::{
    INVITE_SPEND_REQUESTS_MAX, INVITE_USES_MAX, InviteRecord, InviteSpend, MeshStore, StoreError,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::timeout;
use tracing::{debug, info, warn};

use super::actor::{Cmd, PeerChange, now};
use super::link::{ReadError, read_capped};
use super::{NodeError, ask};
use crate::core::LocalWrite;
use crate::net::{close_code, close_connection as close};

/// The most join attempts handled at once; more are refused with
/// [`close_code::JOIN_BUSY`].
pub const JOIN_ATTEMPTS_MAX: usize = 8;

/// How long one join attempt may take, on either side.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an invite stays claimed for a presenting key, and how long
/// after the spend that key may still finish a join whose answer it lost.
pub const INVITE_LEASE_MS: u64 = 120_000;

/// The longest an invite may live.
pub const INVITE_TTL_MS_MAX: u64 = 30 * 24 * 3_600_000;

/// The hint sent with [`JoinAnswer::TryAgain`].
pub const TRY_AGAIN_MS: u32 = 1_000;

/// Invite requests waiting for the inviter.
const INVITE_CMDS_MAX: usize = 64;

/// How long the inviter waits, after writing its answer, for the joiner to
/// read it and close the connection.
const ANSWER_LINGER: Duration = Duration::from_secs(2);

/// Why an invite could not be made or revoked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InviteError {
    /// The caller's fault: uses out of 1..=[`INVITE_USES_MAX`].
    #[error("an invite has 1 to {INVITE_USES_MAX} uses, not {0}")]
    BadUses(u32),
    /// The caller's fault: a time to live of 0 or past [`INVITE_TTL_MS_MAX`].
    #[error("an invite lives 1 ms to 30 days, not {0} ms")]
    BadTtl(u64),
    /// No such invite.
    #[error("no invite {0}; `mesh invite list` shows them")]
    Unknown(InviteId),
    /// The store could not be read, or the node could not write.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// Why a join did not make this node a member.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The inviter refused for good.
    #[error("the inviter refused: {0}")]
    Refused(JoinRefusal),
    /// Nothing was spent; the same invite may work in a moment.
    #[error(
        "the inviter asks to try again in {after_ms} ms (the invite is in use or its store is busy)"
    )]
    TryAgain {
        /// The inviter's hint.
        after_ms: u32,
    },
    /// The inviter could not be reached, or the exchange broke off.
    #[error("cannot reach the inviter: {0}")]
    Unreachable(String),
    /// The inviter's answer is not one (a bad message, or a card not its own).
    #[error("the inviter's answer is not valid: {0}")]
    BadAnswer(String),
    /// This node could not make the inviter its peer.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// A request to the inviter from the node handle.
pub(super) enum InviteCmd {
    Create {
        uses: u32,
        ttl_ms: u64,
        reply: oneshot::Sender<Result<InviteRecord, InviteError>>,
        secret: InviteSecret,
        id: InviteId,
    },
    Revoke {
        id: InviteId,
        reply: oneshot::Sender<Result<InviteRecord, InviteError>>,
    },
}

/// What the inviter does with one proven request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Refuse for good.
    Refuse(JoinRefusal),
    /// Another key holds the invite: nothing changes.
    TryAgain,
    /// The key spent a use and lost the answer: write this (the request
    /// remembered), then welcome it again.
    Reenter(InviteRecord),
    /// Claim it for the key (this record), then make it a peer and spend.
    Claim(InviteRecord),
}

/// The inviter's rule for `req`, made by `remote` (the connection's key)
/// to this node `me`, against the invite as stored, at `now_ms`:
///
/// - no such invite, or another secret: [`JoinRefusal::UnknownInvite`];
/// - a card that is not `remote`'s or does not verify: `BadCard`; no proof,
///   or one that is not `remote`'s signature over this very request to
///   `me`: `ProofRequired`, `BadProof`;
/// - `remote` already spent a use: a request it made before is
///   `Redelivered`; a new one inside the lease re-enters (no second use);
///   after the lease, `Spent`;
/// - revoked, expired, every use spent: `Revoked`, `Expired`, `Spent`;
/// - claimed by another key inside its lease: try again; a claim of
///   `remote`'s own request again is `Redelivered`;
/// - otherwise it is claimed for `remote`.
pub(crate) fn decide(
    invite: Option<&InviteRecord>,
    req: &JoinRequest,
    remote: NodeId,
    me: NodeId,
    now_ms: u64,
) -> Decision {
    let Some(inv) = invite.filter(|i| i.secret_hash == req.secret.hash()) else {
        return Decision::Refuse(JoinRefusal::UnknownInvite);
    };
    if req.card.node != remote || req.card.verify().is_err() {
        return Decision::Refuse(JoinRefusal::BadCard);
    }
    if let Err(refusal) = req.check_proof(&me) {
        return Decision::Refuse(refusal);
    }
    if let Some(i) = inv.spent.iter().position(|s| s.by == remote) {
        let spend = &inv.spent[i];
        if spend.requests.contains(&req.request) {
            return Decision::Refuse(JoinRefusal::Redelivered);
        }
        if now_ms > spend.until_ms || spend.requests.len() >= INVITE_SPEND_REQUESTS_MAX {
            return Decision::Refuse(JoinRefusal::Spent);
        }
        let mut again = inv.clone();
        again.spent[i].requests.push(req.request);
        return Decision::Reenter(again);
    }
    if inv.revoked {
        return Decision::Refuse(JoinRefusal::Revoked);
    }
    if now_ms > inv.expires_ms {
        return Decision::Refuse(JoinRefusal::Expired);
    }
    if inv.uses_left() == 0 {
        return Decision::Refuse(JoinRefusal::Spent);
    }
    let leased = inv.claimed_until_ms >= now_ms;
    match inv.claimed_by {
        Some(k) if k != remote && leased => return Decision::TryAgain,
        Some(k) if k == remote && leased && inv.claimed_request == Some(req.request) => {
            return Decision::Refuse(JoinRefusal::Redelivered);
        }
        _ => {}
    }
    let mut claimed = inv.clone();
    claimed.claimed_by = Some(remote);
    claimed.claimed_until_ms = now_ms.saturating_add(INVITE_LEASE_MS);
    claimed.claimed_request = Some(req.request);
    Decision::Claim(claimed)
}

/// `claimed` (claimed for `by`) with one use spent by `by`, the claim cleared.
pub(crate) fn spend(claimed: &InviteRecord, by: NodeId) -> InviteRecord {
    let mut spent = claimed.clone();
    spent.spent.push(InviteSpend {
        by,
        requests: claimed.claimed_request.into_iter().collect(),
        until_ms: claimed.claimed_until_ms,
    });
    spent.claimed_by = None;
    spent.claimed_until_ms = 0;
    spent.claimed_request = None;
    spent
}

/// The inviter task (see the module doc).
pub(super) struct Inviter<S: MeshStore + ?Sized> {
    pub(super) me: NodeId,
    pub(super) commands: mpsc::Sender<Cmd>,
    pub(super) store: Arc<S>,
    pub(super) joins: mpsc::Receiver<Connection>,
    pub(super) cmds: mpsc::Receiver<InviteCmd>,
    pub(super) closing: watch::Receiver<bool>,
}

/// A join request read off its connection.
struct Presented {
    connection: Connection,
    send: SendStream,
    request: JoinRequest,
}

/// A channel's two ends.
type Channel<T> = (mpsc::Sender<T>, mpsc::Receiver<T>);

/// The channels the transport (join connections) and the node handle
/// (invite requests) use to reach the inviter.
pub(super) fn channels() -> (Channel<Connection>, Channel<InviteCmd>) {
    (
        mpsc::channel(JOIN_ATTEMPTS_MAX),
        mpsc::channel(INVITE_CMDS_MAX),
    )
}

impl<S: MeshStore + ?Sized> Inviter<S> {
    pub(super) async fn run(mut self) {
        // One value per turn, on the stack.
        #[allow(clippy::large_enum_variant)]
        enum Step {
            Join(Connection),
            Cmd(InviteCmd),
            Read(Option<Presented>),
            Answered,
            Stop,
        }
        let mut reading: JoinSet<Option<Presented>> = JoinSet::new();
        let mut answering: JoinSet<()> = JoinSet::new();
        loop {
            let step = tokio::select! {
                _ = self.closing.wait_for(|c| *c) => Step::Stop,
                Some(connection) = self.joins.recv() => Step::Join(connection),
                Some(cmd) = self.cmds.recv() => Step::Cmd(cmd),
                Some(read) = reading.join_next(), if !reading.is_empty() => {
                    Step::Read(read.ok().flatten())
                }
                Some(_) = answering.join_next(), if !answering.is_empty() => Step::Answered,
                else => Step::Stop,
            };
            match step {
                Step::Stop => break,
                Step::Join(connection) => {
                    if reading.len() + answering.len() >= JOIN_ATTEMPTS_MAX {
                        close(
                            &connection,
                            close_code::JOIN_BUSY,
                            "too many joins at once; try again",
                        );
                        continue;
                    }
                    reading.spawn(read_request(connection));
                }
                Step::Cmd(cmd) => self.on_cmd(cmd).await,
                Step::Read(Some(p)) => {
                    let answer = self.on_request(&p).await;
                    answering.spawn(write_answer(p.connection, p.send, answer));
                }
                Step::Read(None) | Step::Answered => {}
            }
        }
        reading.shutdown().await;
        answering.shutdown().await;
    }

    async fn on_cmd(&mut self, cmd: InviteCmd) {
        match cmd {
            InviteCmd::Create {
                uses,
                ttl_ms,
                reply,
                secret,
                id,
            } => {
                let _ = reply.send(self.create(id, secret, uses, ttl_ms).await);
            }
            InviteCmd::Revoke { id, reply } => {
                let _ = reply.send(self.revoke(id).await);
            }
        }
    }

    async fn create(
        &self,
        id: InviteId,
        secret: InviteSecret,
        uses: u32,
        ttl_ms: u64,
    ) -> Result<InviteRecord, InviteError> {
        if uses == 0 || uses > INVITE_USES_MAX {
            return Err(InviteError::BadUses(uses));
        }
        if ttl_ms == 0 || ttl_ms > INVITE_TTL_MS_MAX {
            return Err(InviteError::BadTtl(ttl_ms));
        }
        let created_ms = now().0;
        let record = InviteRecord {
            id,
            secret_hash: secret.hash(),
            uses,
            created_ms,
            expires_ms: created_ms.saturating_add(ttl_ms),
            claimed_by: None,
            claimed_until_ms: 0,
            claimed_request: None,
            spent: Vec::new(),
            revoked: false,
        };
        self.write(record.clone()).await?;
        info!(invite = %id, uses, ttl_ms, "invite made");
        Ok(record)
    }

    async fn revoke(&self, id: InviteId) -> Result<InviteRecord, InviteError> {
        let mut record = self.read(id).await?.ok_or(InviteError::Unknown(id))?;
        record.revoked = true;
        self.write(record.clone()).await?;
        info!(invite = %id, "invite revoked");
        Ok(record)
    }

    /// Decides `p` and carries the decision out; the answer to send.
    async fn on_request(&mut self, p: &Presented) -> JoinAnswer {
        let remote = p.connection.remote_id();
        let req = &p.request;
        let try_again = JoinAnswer::TryAgain {
            after_ms: TRY_AGAIN_MS,
        };
        let stored = match self.read(req.invite).await {
            Ok(s) => s,
            Err(e) => {
                warn!(invite = %req.invite, error = %e, "join: cannot read the invite; try again");
                return try_again;
            }
        };
        let decision = decide(stored.as_ref(), req, remote, self.me, now().0);
        debug!(peer = %remote.fmt_short(), invite = %req.invite, ?decision, "join decided");
        let claimed = match decision {
            Decision::Refuse(refusal) => {
                info!(peer = %remote.fmt_short(), invite = %req.invite, %refusal, "join refused");
                return JoinAnswer::Refused { refusal };
            }
            Decision::TryAgain => return try_again,
            Decision::Reenter(record) => {
                if let Err(e) = self.write(record).await {
                    warn!(error = %e, "join: cannot record the re-entry; try again");
                    return try_again;
                }
                info!(peer = %remote.fmt_short(), invite = %req.invite, "join finished again after a lost answer");
                return self.welcome().await.unwrap_or(try_again);
            }
            Decision::Claim(claimed) => claimed,
        };
        // 1. The claim, durable before anything else.
        if let Err(e) = self.write(claimed.clone()).await {
            warn!(error = %e, "join: cannot claim the invite; try again");
            return try_again;
        }
        // 2. The membership.
        let addrs: Vec<SocketAddr> = req.card.addrs.clone();
        let added = ask(&self.commands, |reply| Cmd::Peer {
            change: PeerChange::Add {
                node: remote,
                addrs,
            },
            reply,
        })
        .await;
        if let Err(e) = added.and_then(|r| r) {
            warn!(peer = %remote.fmt_short(), error = %e, "join: cannot add the peer; nothing spent, try again");
            return try_again;
        }
        // 3. Only now the spend.
        if let Err(e) = self.write(spend(&claimed, remote)).await {
            warn!(error = %e, "join: the peer is added but the spend is not written; try again");
            return try_again;
        }
        info!(peer = %remote.fmt_short(), name = %req.card.name, invite = %req.invite, "a node joined");
        self.welcome().await.unwrap_or(try_again)
    }

    /// The welcome: this node's card.
    async fn welcome(&self) -> Option<JoinAnswer> {
        let status = ask(&self.commands, |reply| Cmd::Status { reply })
            .await
            .ok()?;
        Some(JoinAnswer::Welcome { card: status.card })
    }

    async fn read(&self, id: InviteId) -> Result<Option<InviteRecord>, NodeError> {
        let store = self.store.clone();
        super::blocking(move || store.invite(&id))
            .await
            .map_err(NodeError::from)
    }

    async fn write(&self, record: InviteRecord) -> Result<(), NodeError> {
        let write = LocalWrite::PutInvite(record);
        let r: Result<_, StoreError> =
            ask(&self.commands, |reply| Cmd::Write { write, reply }).await?;
        r.map(drop).map_err(NodeError::from)
    }
}

/// Reads one join request off `connection` (a bi stream the joiner opens),
/// within [`JOIN_TIMEOUT`]; a connection that breaks the rules is closed
/// with a code and gives nothing.
async fn read_request(connection: Connection) -> Option<Presented> {
    let read = async {
        let (send, mut recv) = connection
            .accept_bi()
            .await
            .map_err(|e| (close_code::SHUTDOWN, e.to_string()))?;
        let body = read_message(&mut recv).await?;
        let request = decode_join::<JoinRequest>(&body)
            .map_err(|e| (close_code::BAD_FRAME, e.to_string()))?;
        Ok::<_, (u32, String)>((send, request))
    };
    match timeout(JOIN_TIMEOUT, read).await {
        Ok(Ok((send, request))) => Some(Presented {
            connection,
            send,
            request,
        }),
        Ok(Err((code, why))) => {
            debug!(peer = %connection.remote_id().fmt_short(), %why, "join request refused");
            close(&connection, code, "bad join request");
            None
        }
        Err(_) => {
            close(&connection, close_code::HANDSHAKE_TIMEOUT, "join timed out");
            None
        }
    }
}

/// Reads one length-prefixed join message, refusing one over
/// [`JOIN_MESSAGE_BYTES_MAX`] before reading its body.
async fn read_message(recv: &mut RecvStream) -> Result<Vec<u8>, (u32, String)> {
    read_capped(recv, JOIN_MESSAGE_BYTES_MAX)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge(len) => (
                close_code::FRAME_TOO_LARGE,
                WireError::TooLarge(len).to_string(),
            ),
            ReadError::Stream(why) => (close_code::BAD_FRAME, why),
        })
}

/// Writes `answer`, then lets the joiner close (at most [`ANSWER_LINGER`]).
async fn write_answer(connection: Connection, mut send: SendStream, answer: JoinAnswer) {
    let mut out = Vec::new();
    if encode_join(&answer, &mut out).is_ok() && send.write_all(&out).await.is_ok() {
        let _ = send.finish();
        let _ = timeout(ANSWER_LINGER, connection.closed()).await;
    }
    close(&connection, close_code::SHUTDOWN, "join answered");
}

/// The joiner's side: presents `req` to the inviter of `code` (dialed at its
/// addresses and through `relays`) and returns its answer.
pub(super) async fn present(
    endpoint: &Endpoint,
    code: &InviteCode,
    relays: &[RelayUrl],
    req: &JoinRequest,
) -> Result<JoinAnswer, JoinError> {
    let unreachable = |e: String| JoinError::Unreachable(e);
    let addr = crate::net::endpoint_addr(
        code.inviter,
        code.addrs.iter().copied(),
        relays.iter().cloned(),
    );
    let exchange = async {
        let connection = endpoint
            .connect(addr, JOIN_ALPN)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let answer = async {
            let (mut send, mut recv) = connection
                .open_bi()
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let mut out = Vec::new();
            encode_join(req, &mut out).map_err(|e| unreachable(e.to_string()))?;
            send.write_all(&out)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let _ = send.finish();
            let body = read_message(&mut recv).await.map_err(|(code, why)| {
                if code == close_code::FRAME_TOO_LARGE {
                    JoinError::BadAnswer(why)
                } else {
                    unreachable(why)
                }
            })?;
            decode_join::<JoinAnswer>(&body).map_err(|e| JoinError::BadAnswer(e.to_string()))
        }
        .await;
        close(&connection, close_code::SHUTDOWN, "join done");
        answer
    };
    match timeout(JOIN_TIMEOUT, exchange).await {
        Ok(r) => r,
        Err(_) => Err(unreachable(format!("no answer within {JOIN_TIMEOUT:?}"))),
    }
}

/// A fresh request for `code` by the node `key` whose card is `card`.
pub(super) fn request(key: &SecretKey, code: &InviteCode, card: NodeCard) -> JoinRequest {
    JoinRequest::new(key, code, RequestId(rand::random()), card)
}

#[cfg(test)]
mod tests;
