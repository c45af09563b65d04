//! The invite routes (make, list, revoke) and the join route, answered by
//! the bus node's inviter and join exchange.

use axum::Json;
use axum::extract::{Path, Request, State};
use mesh_api::{
    InviteJson, InviteRequest, InviteResponse, InvitesResponse, JoinBody, JoinResponse,
};
use mesh_protocol::{InviteCode, InviteId};
use mesh_store::{InviteRecord, MeshStore};

use super::error::{invite_error, join_error};
use super::routes::{read_json, read_store};
use super::{ApiError, ApiState, CallerError, REQUEST_BYTES_MAX};

/// How long an invite is good for when the request does not say: one hour.
pub(crate) const INVITE_TTL_MS_DEFAULT: u64 = 3_600_000;

/// An invite as the API shows it, at `now_ms`.
fn invite_json(r: &InviteRecord, now_ms: u64) -> InviteJson {
    let claimed = r.claimed_by.filter(|_| r.claimed_until_ms >= now_ms);
    let state = if r.revoked {
        "revoked"
    } else if r.uses_left() == 0 {
        "spent"
    } else if now_ms > r.expires_ms {
        "expired"
    } else if claimed.is_some() {
        "claimed"
    } else {
        "open"
    };
    InviteJson {
        id: r.id.to_string(),
        state: state.to_owned(),
        uses: r.uses,
        uses_left: r.uses_left(),
        created_ms: r.created_ms,
        expires_ms: r.expires_ms,
        claimed_by: claimed.map(|k| k.to_string()),
        claimed_until_ms: claimed.map(|_| r.claimed_until_ms),
        joined: r.spent.iter().map(|s| s.by.to_string()).collect(),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) async fn create_invite(
    State(st): State<ApiState>,
    req: Request,
) -> Result<Json<InviteResponse>, ApiError> {
    let body: InviteRequest = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let uses = body.uses.unwrap_or(1);
    let ttl_ms = body.ttl_ms.unwrap_or(INVITE_TTL_MS_DEFAULT);
    let code = st
        .inner
        .bus
        .create_invite(uses, ttl_ms)
        .await
        .map_err(invite_error)?;
    let id = code.id;
    let record = read_store(&st.inner.store, move |s| s.invite(&id))
        .await?
        .ok_or_else(|| super::Bug::new("the invite just made is not stored"))?;
    Ok(Json(InviteResponse {
        code: code.to_string(),
        invite: invite_json(&record, now_ms()),
    }))
}

pub(super) async fn list_invites(
    State(st): State<ApiState>,
) -> Result<Json<InvitesResponse>, ApiError> {
    let records = read_store(&st.inner.store, |s| s.invites()).await?;
    let now = now_ms();
    Ok(Json(InvitesResponse {
        invites: records.iter().map(|r| invite_json(r, now)).collect(),
    }))
}

pub(super) async fn revoke_invite(
    State(st): State<ApiState>,
    Path(id): Path<String>,
) -> Result<Json<InviteJson>, ApiError> {
    let id: InviteId = id
        .parse()
        .map_err(|e: mesh_protocol::JoinError| CallerError::BadValue(e.to_string()))?;
    let record = st.inner.bus.revoke_invite(id).await.map_err(invite_error)?;
    Ok(Json(invite_json(&record, now_ms())))
}

pub(super) async fn join(
    State(st): State<ApiState>,
    req: Request,
) -> Result<Json<JoinResponse>, ApiError> {
    let body: JoinBody = read_json(req.into_body(), REQUEST_BYTES_MAX).await?;
    let code: InviteCode = body
        .code
        .parse()
        .map_err(|e: mesh_protocol::JoinError| CallerError::BadValue(e.to_string()))?;
    let card = st.inner.bus.join(&code).await.map_err(join_error)?;
    Ok(Json(JoinResponse {
        inviter: card.node.to_string(),
        name: card.name.to_string(),
        addrs: card.addrs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::{RequestId, SecretKey};
    use mesh_store::InviteSpend;

    #[test]
    fn an_invite_shows_the_state_a_person_needs() {
        let k = SecretKey::from_bytes(&[4; 32]).public();
        let open = InviteRecord {
            id: InviteId([1; 8]),
            secret_hash: [0; 32],
            uses: 2,
            created_ms: 0,
            expires_ms: 100,
            claimed_by: None,
            claimed_until_ms: 0,
            claimed_request: None,
            spent: vec![],
            revoked: false,
        };
        assert_eq!(invite_json(&open, 50).state, "open");
        assert_eq!(invite_json(&open, 101).state, "expired");
        let claimed = InviteRecord {
            claimed_by: Some(k),
            claimed_until_ms: 60,
            ..open.clone()
        };
        let j = invite_json(&claimed, 50);
        assert_eq!(
            (j.state.as_str(), j.claimed_until_ms),
            ("claimed", Some(60))
        );
        assert_eq!(invite_json(&claimed, 61).state, "open", "the lease ended");
        let spend = InviteSpend {
            by: k,
            requests: vec![RequestId([0; 16])],
            until_ms: 60,
        };
        let spent = InviteRecord {
            spent: vec![spend.clone(), spend],
            ..open.clone()
        };
        let j = invite_json(&spent, 50);
        assert_eq!(
            (j.state.as_str(), j.uses_left, j.joined.len()),
            ("spent", 0, 2)
        );
        let revoked = InviteRecord {
            revoked: true,
            ..open
        };
        assert_eq!(invite_json(&revoked, 50).state, "revoked");
    }
}
