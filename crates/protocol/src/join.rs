//! Joining a mesh with one invite: the invite code a member hands out, and
//! the two messages of the join exchange (its own ALPN, [`JOIN_ALPN`]).
//!
//! The newcomer dials the inviter at the addresses in the code and sends a
//! [`JoinRequest`]: the invite's id and secret, a fresh request id, its own
//! [`NodeCard`] and a proof — its signature over the request
//! ([`JoinRequest::proof_bytes`]). The inviter answers one [`JoinAnswer`].
//! Both messages are framed like peer frames (a 4-byte big-endian length,
//! then postcard) and capped at [`JOIN_MESSAGE_BYTES_MAX`].

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::card::{NodeCard, addrs_max};
use crate::frame::encoded_len;
use crate::ids::{NodeId, SecretKey, cut};
use crate::ticket::{read_text, write_text};

/// The ALPN of the join exchange; the only one a node that is not a peer
/// may reach.
pub const JOIN_ALPN: &[u8] = b"agent-mesh-join/1";

/// The largest join message body, in bytes (a request with a full card is
/// under 800).
pub const JOIN_MESSAGE_BYTES_MAX: usize = 2048;

/// The most addresses an invite code names (as a node ticket).
pub const INVITE_ADDRS_MAX: usize = 16;

/// The domain tag of a join proof's signed bytes.
pub const JOIN_PROOF_DOMAIN: &[u8] = b"agent-mesh/join-proof/v1\0";

/// The domain tag hashed before an invite secret.
pub const INVITE_SECRET_DOMAIN: &[u8] = b"agent-mesh/invite-secret/v1\0";

/// Text prefix of every invite code; the digit is the format version.
const INVITE_PREFIX: &str = "meshinvite1";

/// The longest invite code text accepted before decoding is tried.
const INVITE_TEXT_BYTES_MAX: usize = 1024;

/// An invite's id: 8 random bytes, shown as 16 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct InviteId(pub [u8; 8]);

impl fmt::Display for InviteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&data_encoding::HEXLOWER.encode(&self.0))
    }
}

impl fmt::Debug for InviteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InviteId({self})")
    }
}

impl FromStr for InviteId {
    type Err = JoinError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || JoinError::BadInviteId(cut(s));
        let bytes = data_encoding::HEXLOWER_PERMISSIVE
            .decode(s.trim().as_bytes())
            .map_err(|_| bad())?;
        Ok(InviteId(bytes.try_into().map_err(|_| bad())?))
    }
}

/// An invite's secret: 16 random bytes, only ever in the invite code and
/// the join request. The inviter stores [`InviteSecret::hash`] alone.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteSecret(pub [u8; 16]);

impl InviteSecret {
    /// BLAKE3 of [`INVITE_SECRET_DOMAIN`] and the secret: what the inviter keeps.
    pub fn hash(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(INVITE_SECRET_DOMAIN);
        h.update(&self.0);
        *h.finalize().as_bytes()
    }
}

impl fmt::Debug for InviteSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InviteSecret(..)")
    }
}

/// What `mesh invite` prints and `mesh join` takes: where to reach the
/// inviter, which invite, and its secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InviteCode {
    /// The inviting node.
    #[serde(with = "crate::ids::node_id_serde")]
    pub inviter: NodeId,
    /// Where it listens (at most [`INVITE_ADDRS_MAX`]).
    #[serde(deserialize_with = "addrs_max")]
    pub addrs: Vec<SocketAddr>,
    /// The invite.
    pub id: InviteId,
    /// The invite's secret.
    pub secret: InviteSecret,
}

impl fmt::Debug for InviteCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InviteCode")
            .field("inviter", &format_args!("{}", self.inviter.fmt_short()))
            .field("addrs", &self.addrs)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for InviteCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_text(f, INVITE_PREFIX, self)
    }
}

impl FromStr for InviteCode {
    type Err = JoinError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        read_text(text, INVITE_PREFIX, INVITE_TEXT_BYTES_MAX).map_err(|why| {
            JoinError::BadInviteCode {
                text: cut(text),
                why,
            }
        })
    }
}

/// A join attempt's id: 16 random bytes, new for every attempt, so the
/// inviter tells a redelivered request from a fresh one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub [u8; 16]);

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RequestId({})",
            data_encoding::HEXLOWER.encode(&self.0[..4])
        )
    }
}

/// The newcomer's request.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The invite.
    pub invite: InviteId,
    /// The invite's secret.
    pub secret: InviteSecret,
    /// This attempt.
    pub request: RequestId,
    /// The newcomer's card: its id (the connection's key), name and addresses.
    pub card: NodeCard,
    /// Its signature over [`JoinRequest::proof_bytes`]; `None` is refused.
    #[serde(with = "opt_sig")]
    pub proof: Option<[u8; 64]>,
}

impl fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinRequest")
            .field("invite", &self.invite)
            .field("request", &self.request)
            .field("card", &self.card)
            .field("proof", &self.proof.is_some())
            .finish_non_exhaustive()
    }
}

/// The fields a join proof covers, borrowed for encoding.
#[derive(Serialize)]
struct ProofFields<'a> {
    inviter: &'a NodeId,
    invite: &'a InviteId,
    secret_hash: [u8; 32],
    request: &'a RequestId,
    card: &'a NodeCard,
}

impl JoinRequest {
    /// A request for `code`'s invite by the node `key` (whose card is
    /// `card`), proven with `key`.
    pub fn new(key: &SecretKey, code: &InviteCode, request: RequestId, card: NodeCard) -> Self {
        let mut req = JoinRequest {
            invite: code.id,
            secret: code.secret.clone(),
            request,
            card,
            proof: None,
        };
        req.proof = Some(key.sign(&req.proof_bytes(&code.inviter)).to_bytes());
        req
    }

    /// The bytes the proof signs: [`JOIN_PROOF_DOMAIN`], then postcard of
    /// `(inviter, invite, hash of the secret, request, card)`. Naming the
    /// inviter and the request makes a proof good for this one request to
    /// this one inviter only.
    pub fn proof_bytes(&self, inviter: &NodeId) -> Vec<u8> {
        let fields = ProofFields {
            inviter,
            invite: &self.invite,
            secret_hash: self.secret.hash(),
            request: &self.request,
            card: &self.card,
        };
        let out = JOIN_PROOF_DOMAIN.to_vec();
        // Serializing plain structs into a Vec cannot fail.
        postcard::to_extend(&fields, out).unwrap_or_else(|_| unreachable!("postcard into Vec"))
    }

    /// Checks that the proof is the card's node's signature over this
    /// request to `inviter` (`verify_strict`).
    ///
    /// # Errors
    /// [`JoinRefusal::ProofRequired`] without one, [`JoinRefusal::BadProof`]
    /// if it does not verify.
    pub fn check_proof(&self, inviter: &NodeId) -> Result<(), JoinRefusal> {
        let proof = self.proof.ok_or(JoinRefusal::ProofRequired)?;
        let sig = iroh_base::Signature::from_bytes(&proof);
        self.card
            .node
            .verify(&self.proof_bytes(inviter), &sig)
            .map_err(|_| JoinRefusal::BadProof)
    }
}

/// Why the inviter refused a join for good (a retry with the same invite
/// gets the same answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum JoinRefusal {
    /// No such invite, or the secret does not match.
    #[error("the inviter knows no such invite (or its secret does not match)")]
    UnknownInvite,
    /// The invite's time is up.
    #[error("the invite has expired; ask for a new one")]
    Expired,
    /// The inviter revoked the invite.
    #[error("the invite was revoked; ask for a new one")]
    Revoked,
    /// Every use of the invite is spent (by other nodes, or by this one
    /// longer ago than its lease).
    #[error("the invite is spent; ask for a new one")]
    Spent,
    /// The request carries no proof.
    #[error("the request carries no proof of the joining node's key")]
    ProofRequired,
    /// The proof is not the joining node's signature over this request.
    #[error("the request's proof does not verify for this request")]
    BadProof,
    /// The request was already seen: a redelivery, not a fresh attempt.
    #[error("this request was already handled (a redelivery); a new attempt gets a new request id")]
    Redelivered,
    /// The card names another node than the connection's key, or its
    /// signature does not verify.
    #[error("the joining node's card is not its own or does not verify")]
    BadCard,
}

impl JoinRefusal {
    /// The refusal's name in `snake_case`, as the API's error codes spell it.
    pub fn code(self) -> &'static str {
        match self {
            JoinRefusal::UnknownInvite => "unknown_invite",
            JoinRefusal::Expired => "invite_expired",
            JoinRefusal::Revoked => "invite_revoked",
            JoinRefusal::Spent => "invite_spent",
            JoinRefusal::ProofRequired => "proof_required",
            JoinRefusal::BadProof => "bad_proof",
            JoinRefusal::Redelivered => "redelivered",
            JoinRefusal::BadCard => "bad_card",
        }
    }
}

/// The inviter's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JoinAnswer {
    /// Both nodes are each other's peers now; here is the inviter's card.
    Welcome {
        /// The inviter's card.
        card: NodeCard,
    },
    /// Nothing was spent: try again after `after_ms` (the invite is being
    /// used by another node, the inviter's store is down, or it is busy).
    TryAgain {
        /// A hint, in ms.
        after_ms: u32,
    },
    /// Refused for good.
    Refused {
        /// Why.
        refusal: JoinRefusal,
    },
}

/// Why an invite code or join message was refused while decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The text is not an invite code.
    #[error(
        "{text:?} is not an invite code ({why}); codes look like meshinvite1…, as printed by `mesh invite`"
    )]
    BadInviteCode {
        /// The rejected text (cut).
        text: String,
        /// What was wrong.
        why: &'static str,
    },
    /// The text is not an invite id (16 hex digits).
    #[error("{0:?} is not an invite id: expected 16 hex digits, as `mesh invite list` shows")]
    BadInviteId(String),
    /// A message over [`JOIN_MESSAGE_BYTES_MAX`].
    #[error("join message of {0} bytes exceeds the {JOIN_MESSAGE_BYTES_MAX}-byte limit")]
    TooLarge(usize),
    /// A message that does not decode, is not canonical or has trailing bytes.
    #[error("malformed join message: {0}")]
    Malformed(String),
}

/// Appends `msg` to `out` as a 4-byte big-endian length and its postcard body.
///
/// # Errors
/// [`JoinError::TooLarge`] (and `out` unchanged) past [`JOIN_MESSAGE_BYTES_MAX`].
pub fn encode_join<T: Serialize>(msg: &T, out: &mut Vec<u8>) -> Result<(), JoinError> {
    let body = postcard::to_stdvec(msg).map_err(|e| JoinError::Malformed(e.to_string()))?;
    if body.len() > JOIN_MESSAGE_BYTES_MAX {
        return Err(JoinError::TooLarge(body.len()));
    }
    // body.len() <= JOIN_MESSAGE_BYTES_MAX < u32::MAX.
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// Decodes one join message body (without its length), refusing one over
/// [`JOIN_MESSAGE_BYTES_MAX`], one that is not canonical postcard, and
/// trailing bytes.
///
/// # Errors
/// [`JoinError::TooLarge`], [`JoinError::Malformed`].
pub fn decode_join<T: Serialize + for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, JoinError> {
    if body.len() > JOIN_MESSAGE_BYTES_MAX {
        return Err(JoinError::TooLarge(body.len()));
    }
    let (msg, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|e| JoinError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(JoinError::Malformed(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    if encoded_len(&msg).ok() != Some(body.len()) {
        return Err(JoinError::Malformed("not canonical".into()));
    }
    Ok(msg)
}

/// Serde for an optional 64-byte signature: postcard's option tag, then the
/// 64 raw bytes.
mod opt_sig {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Sig(#[serde(with = "crate::batch::sig_bytes")] [u8; 64]);

    pub(super) fn serialize<S: Serializer>(
        sig: &Option<[u8; 64]>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        sig.map(Sig).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<[u8; 64]>, D::Error> {
        Ok(Option::<Sig>::deserialize(d)?.map(|s| s.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::card::NodeName;

    fn key(b: u8) -> SecretKey {
        SecretKey::from_bytes(&[b; 32])
    }

    fn code() -> InviteCode {
        InviteCode {
            inviter: key(1).public(),
            addrs: vec!["192.0.2.1:4919".parse().unwrap()],
            id: InviteId([7; 8]),
            secret: InviteSecret([9; 16]),
        }
    }

    fn request(r: u8) -> JoinRequest {
        let joiner = key(2);
        let card = NodeCard::sign(&joiner, NodeName::new("newbie").unwrap(), vec![], 5).unwrap();
        JoinRequest::new(&joiner, &code(), RequestId([r; 16]), card)
    }

    #[test]
    fn an_invite_code_round_trips_through_its_text() {
        let text = code().to_string();
        assert!(text.starts_with("meshinvite1"));
        assert_eq!(text.parse::<InviteCode>(), Ok(code()));
        assert_eq!(
            format!(
                " {}\n",
                text.to_uppercase().replace("MESHINVITE1", "meshinvite1")
            )
            .parse::<InviteCode>(),
            Ok(code())
        );
        assert!(
            text.replace("meshinvite1", "meshnode1")
                .parse::<InviteCode>()
                .is_err()
        );
        assert!(text[..text.len() - 3].parse::<InviteCode>().is_err());
    }

    #[test]
    fn an_invite_id_round_trips_through_hex() {
        let id = InviteId([0xab; 8]);
        assert_eq!(id.to_string().parse::<InviteId>(), Ok(id));
        assert!("abc".parse::<InviteId>().is_err());
    }

    #[test]
    fn a_proof_verifies_only_for_its_own_request_and_inviter() {
        let inviter = key(1).public();
        let req = request(1);
        assert_eq!(req.check_proof(&inviter), Ok(()));
        assert_eq!(
            req.check_proof(&key(3).public()),
            Err(JoinRefusal::BadProof)
        );
        let mut other = request(2);
        other.proof = req.proof;
        assert_eq!(other.check_proof(&inviter), Err(JoinRefusal::BadProof));
        let mut none = req.clone();
        none.proof = None;
        assert_eq!(none.check_proof(&inviter), Err(JoinRefusal::ProofRequired));
        let mut forged = req;
        let mallory = key(4);
        forged.proof = Some(mallory.sign(&forged.proof_bytes(&inviter)).to_bytes());
        assert_eq!(forged.check_proof(&inviter), Err(JoinRefusal::BadProof));
    }

    #[test]
    fn join_messages_round_trip_and_are_capped() {
        let mut out = Vec::new();
        encode_join(&request(1), &mut out).unwrap();
        let len = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 4);
        assert!(len < JOIN_MESSAGE_BYTES_MAX);
        assert_eq!(decode_join::<JoinRequest>(&out[4..]), Ok(request(1)));
        let mut trailing = out[4..].to_vec();
        trailing.push(0);
        assert!(decode_join::<JoinRequest>(&trailing).is_err());
        assert_eq!(
            decode_join::<JoinRequest>(&vec![0; JOIN_MESSAGE_BYTES_MAX + 1]),
            Err(JoinError::TooLarge(JOIN_MESSAGE_BYTES_MAX + 1))
        );
        let answer = JoinAnswer::Refused {
            refusal: JoinRefusal::Spent,
        };
        let mut out = Vec::new();
        encode_join(&answer, &mut out).unwrap();
        assert_eq!(decode_join::<JoinAnswer>(&out[4..]), Ok(answer));
    }

    #[test]
    fn every_refusal_has_its_own_code() {
        let all = [
            JoinRefusal::UnknownInvite,
            JoinRefusal::Expired,
            JoinRefusal::Revoked,
            JoinRefusal::Spent,
            JoinRefusal::ProofRequired,
            JoinRefusal::BadProof,
            JoinRefusal::Redelivered,
            JoinRefusal::BadCard,
        ];
        let mut codes: Vec<&str> = all.iter().map(|r| r.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
    }
}
