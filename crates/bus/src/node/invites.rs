//! The node handle's calls for invites and joins: making and revoking an
//! invite (through the inviter task) and joining another node's mesh.

use mesh_protocol::{InviteCode, InviteId, InviteSecret, JoinAnswer, NodeCard};
use mesh_store::InviteRecord;
use tokio::sync::oneshot;
use tracing::info;

use super::join::{self, InviteCmd, InviteError, JoinError};
use super::{Node, NodeError};
use crate::net::{PeerError, endpoint_addrs};

impl Node {
    /// Makes an invite for `uses` nodes, good for `ttl_ms`; answers its
    /// code (this node's id and addresses, the invite's id and secret) once
    /// its record is committed. The secret is in the code only: the store
    /// keeps its hash.
    ///
    /// # Errors
    /// [`InviteError::BadUses`], [`InviteError::BadTtl`], or the node's.
    pub async fn create_invite(&self, uses: u32, ttl_ms: u64) -> Result<InviteCode, InviteError> {
        let id = InviteId(rand::random());
        let secret = InviteSecret(rand::random());
        let (reply, answer) = oneshot::channel();
        let cmd = InviteCmd::Create {
            uses,
            ttl_ms,
            reply,
            secret: secret.clone(),
            id,
        };
        self.invites
            .send(cmd)
            .await
            .map_err(|_| NodeError::Stopped)?;
        answer.await.map_err(|_| NodeError::Stopped)??;
        Ok(InviteCode {
            inviter: self.id,
            addrs: endpoint_addrs(&self.endpoint),
            id,
            secret,
        })
    }

    /// Revokes the invite `id`: refused to everyone from now on (nodes that
    /// joined with it stay peers). Answers its record as committed.
    ///
    /// # Errors
    /// [`InviteError::Unknown`], or the node's.
    pub async fn revoke_invite(&self, id: InviteId) -> Result<InviteRecord, InviteError> {
        let (reply, answer) = oneshot::channel();
        self.invites
            .send(InviteCmd::Revoke { id, reply })
            .await
            .map_err(|_| NodeError::Stopped)?;
        answer.await.map_err(|_| NodeError::Stopped)?
    }

    /// Joins the mesh of `code`'s inviter: presents a fresh proven request
    /// on the join ALPN, and when the inviter welcomes this node, makes the
    /// inviter a peer (durably) at the addresses of its card. Answers the
    /// inviter's card.
    ///
    /// # Errors
    /// [`JoinError::Refused`] (for good), [`JoinError::TryAgain`] (nothing
    /// spent), [`JoinError::Unreachable`], [`JoinError::BadAnswer`], or
    /// the node's when adding the inviter.
    pub async fn join(&self, code: &InviteCode) -> Result<NodeCard, JoinError> {
        if code.inviter == self.id {
            return Err(NodeError::from(PeerError::SelfPeer).into());
        }
        let card = self.status().await?.card;
        let req = join::request(&self.secret, code, card);
        match join::present(&self.endpoint, code, &self.relays, &req).await? {
            JoinAnswer::Welcome { card } => {
                if card.node != code.inviter || card.verify().is_err() {
                    return Err(JoinError::BadAnswer(
                        "the welcome carries a card that is not the inviter's".into(),
                    ));
                }
                let addrs = if card.addrs.is_empty() {
                    code.addrs.clone()
                } else {
                    card.addrs.clone()
                };
                self.add_peer(code.inviter, addrs).await?;
                info!(inviter = %code.inviter.fmt_short(), name = %card.name, "joined");
                Ok(card)
            }
            JoinAnswer::TryAgain { after_ms } => Err(JoinError::TryAgain { after_ms }),
            JoinAnswer::Refused { refusal } => Err(JoinError::Refused(refusal)),
        }
    }
}
