//! Node names and node cards: a node's name and current listen addresses,
//! signed by its key with a timestamp, so any peer may pass them on and no
//! one can forge or roll them back.

use std::fmt;
use std::net::SocketAddr;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::ids::{NodeId, SecretKey, cut};

/// The longest node name, in bytes.
pub const NODE_NAME_BYTES_MAX: usize = 63;

/// The most addresses one card may carry.
pub const CARD_ADDRS_MAX: usize = 16;

/// The domain tag signed before a card's fields, so a card signature can
/// never be taken for a signature over anything else.
pub const CARD_DOMAIN: &[u8] = b"agent-mesh/node-card/v1\0";

/// A node's name for people: 1 to [`NODE_NAME_BYTES_MAX`] bytes of
/// `[a-z0-9._-]`, starting with a letter or digit (the default is the
/// host's name, see [`NodeName::from_hostname`]).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NodeName(String);

/// Why a node name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad node name {name:?}: {why}")]
pub struct NameError {
    /// The rejected name (cut to a printable length).
    pub name: String,
    /// What was wrong with it.
    pub why: &'static str,
}

impl NodeName {
    /// Checks `name` and wraps it.
    ///
    /// # Errors
    /// [`NameError`] if it is empty, longer than [`NODE_NAME_BYTES_MAX`],
    /// has a byte outside `[a-z0-9._-]` or does not start with a letter or digit.
    pub fn new(name: &str) -> Result<Self, NameError> {
        let bad = |why| NameError {
            name: cut(name),
            why,
        };
        if name.is_empty() {
            return Err(bad("it is empty"));
        }
        if name.len() > NODE_NAME_BYTES_MAX {
            return Err(bad("it is longer than 63 bytes"));
        }
        if !name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        {
            return Err(bad("only a-z, 0-9 and . _ - are allowed"));
        }
        if !name.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(bad("it must start with a letter or a digit"));
        }
        Ok(NodeName(name.to_owned()))
    }

    /// A valid name made from a host name: lowercased, every byte outside
    /// `[a-z0-9._-]` replaced by `-`, leading punctuation dropped, cut to
    /// [`NODE_NAME_BYTES_MAX`]; `node` if nothing is left.
    pub fn from_hostname(host: &str) -> NodeName {
        let mapped: String = host
            .trim()
            .chars()
            .map(|c| c.to_ascii_lowercase())
            .map(|c| match c {
                'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
                _ => '-',
            })
            .skip_while(|c| !c.is_ascii_alphanumeric())
            .take(NODE_NAME_BYTES_MAX)
            .collect();
        NodeName::new(&mapped).unwrap_or_else(|_| NodeName("node".to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for NodeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        NodeName::new(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeName({})", self.0)
    }
}

impl std::str::FromStr for NodeName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NodeName::new(s)
    }
}

/// Why a card was refused or could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CardError {
    /// More than [`CARD_ADDRS_MAX`] addresses.
    #[error("a node card carries at most {CARD_ADDRS_MAX} addresses, not {0}")]
    TooManyAddrs(usize),
    /// The signature does not verify under the card's node key.
    #[error("the card of {0} is not signed by that node")]
    BadSignature(String),
}

/// A node's name and listen addresses as it announced them at `issued_ms`,
/// signed by its key.
///
/// Of two valid cards of one node the one with the larger `issued_ms` is
/// newer; a node issues its cards with strictly growing timestamps.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCard {
    /// The node (whose key signed the card).
    #[serde(with = "crate::ids::node_id_serde")]
    pub node: NodeId,
    /// Its name.
    pub name: NodeName,
    /// Where it listens, at most [`CARD_ADDRS_MAX`] (refused while decoding past that).
    #[serde(deserialize_with = "addrs_max")]
    pub addrs: Vec<SocketAddr>,
    /// When it issued the card, ms since the Unix epoch (by its own clock).
    pub issued_ms: u64,
    /// ed25519 over [`CARD_DOMAIN`] and the fields above.
    #[serde(with = "crate::batch::sig_bytes")]
    pub sig: [u8; 64],
}

/// The fields a card signature covers, borrowed for encoding.
#[derive(Serialize)]
struct Unsigned<'a> {
    node: &'a NodeId,
    name: &'a NodeName,
    addrs: &'a [SocketAddr],
    issued_ms: u64,
}

impl NodeCard {
    /// The card of `secret`'s node, signed.
    ///
    /// # Errors
    /// [`CardError::TooManyAddrs`] past [`CARD_ADDRS_MAX`].
    pub fn sign(
        secret: &SecretKey,
        name: NodeName,
        addrs: Vec<SocketAddr>,
        issued_ms: u64,
    ) -> Result<NodeCard, CardError> {
        if addrs.len() > CARD_ADDRS_MAX {
            return Err(CardError::TooManyAddrs(addrs.len()));
        }
        let node = secret.public();
        let msg = signed_bytes(&Unsigned {
            node: &node,
            name: &name,
            addrs: &addrs,
            issued_ms,
        });
        let sig = secret.sign(&msg).to_bytes();
        Ok(NodeCard {
            node,
            name,
            addrs,
            issued_ms,
            sig,
        })
    }

    /// The bytes the signature covers: [`CARD_DOMAIN`], then postcard of
    /// `(node, name, addrs, issued_ms)`.
    pub fn signed_bytes(&self) -> Vec<u8> {
        signed_bytes(&Unsigned {
            node: &self.node,
            name: &self.name,
            addrs: &self.addrs,
            issued_ms: self.issued_ms,
        })
    }

    /// Checks the address bound and the signature (`verify_strict`).
    ///
    /// # Errors
    /// [`CardError::TooManyAddrs`], [`CardError::BadSignature`].
    pub fn verify(&self) -> Result<(), CardError> {
        if self.addrs.len() > CARD_ADDRS_MAX {
            return Err(CardError::TooManyAddrs(self.addrs.len()));
        }
        let sig = iroh_base::Signature::from_bytes(&self.sig);
        self.node
            .verify(&self.signed_bytes(), &sig)
            .map_err(|_| CardError::BadSignature(self.node.fmt_short().to_string()))
    }

    /// Whether this card is newer than `other` (a card of the same node).
    pub fn is_newer_than(&self, other: &NodeCard) -> bool {
        self.issued_ms > other.issued_ms
    }
}

impl fmt::Debug for NodeCard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeCard")
            .field("node", &format_args!("{}", self.node.fmt_short()))
            .field("name", &self.name)
            .field("addrs", &self.addrs)
            .field("issued_ms", &self.issued_ms)
            .finish_non_exhaustive()
    }
}

fn signed_bytes(u: &Unsigned<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(CARD_DOMAIN.len() + 64 + u.addrs.len() * 20);
    out.extend_from_slice(CARD_DOMAIN);
    // Serializing plain structs into a Vec cannot fail: postcard only errors on
    // unsupported types (none here) or a full fixed buffer (a Vec grows).
    postcard::to_extend(u, out).unwrap_or_else(|_| unreachable!("postcard into Vec"))
}

/// Decodes a list of addresses, refusing more than [`CARD_ADDRS_MAX`]
/// before allocating for them.
pub(crate) fn addrs_max<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SocketAddr>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<SocketAddr>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "at most {CARD_ADDRS_MAX} socket addresses")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            // The declared length is untrusted: never preallocate past the cap.
            let hint = seq.size_hint().unwrap_or(0).min(CARD_ADDRS_MAX);
            let mut out = Vec::with_capacity(hint);
            while let Some(a) = seq.next_element::<SocketAddr>()? {
                if out.len() == CARD_ADDRS_MAX {
                    return Err(serde::de::Error::invalid_length(out.len() + 1, &self));
                }
                out.push(a);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(V)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> SecretKey {
        SecretKey::from_bytes(&[5; 32])
    }

    fn card(issued_ms: u64) -> NodeCard {
        let name = NodeName::new("alpha").unwrap();
        NodeCard::sign(
            &secret(),
            name,
            vec!["192.0.2.7:4919".parse().unwrap()],
            issued_ms,
        )
        .unwrap()
    }

    #[test]
    fn node_names_are_bounded_and_restricted() {
        assert!(NodeName::new("build-01.lab").is_ok());
        assert!(NodeName::new("").is_err());
        assert!(NodeName::new(&"a".repeat(64)).is_err());
        assert!(NodeName::new(&"a".repeat(63)).is_ok());
        assert!(NodeName::new("Upper").is_err());
        assert!(NodeName::new("a@b").is_err());
        assert!(NodeName::new("-dash").is_err());
    }

    #[test]
    fn a_host_name_becomes_a_valid_node_name() {
        assert_eq!(
            NodeName::from_hostname("Build-01.LAB\n").as_str(),
            "build-01.lab"
        );
        assert_eq!(NodeName::from_hostname("my host").as_str(), "my-host");
        assert_eq!(NodeName::from_hostname("--x").as_str(), "x");
        assert_eq!(NodeName::from_hostname("").as_str(), "node");
        assert_eq!(NodeName::from_hostname("日本").as_str(), "node");
        assert_eq!(NodeName::from_hostname(&"h".repeat(200)).as_str().len(), 63);
    }

    #[test]
    fn a_signed_card_verifies_and_any_change_breaks_it() {
        let c = card(10);
        assert_eq!(c.verify(), Ok(()));
        let mut moved = c.clone();
        moved.addrs = vec!["192.0.2.8:4919".parse().unwrap()];
        assert!(matches!(moved.verify(), Err(CardError::BadSignature(_))));
        let mut renamed = c.clone();
        renamed.name = NodeName::new("mallory").unwrap();
        assert!(renamed.verify().is_err());
        let mut rolled_back = c.clone();
        rolled_back.issued_ms = 99;
        assert!(rolled_back.verify().is_err());
        let mut other = c;
        other.node = SecretKey::from_bytes(&[6; 32]).public();
        assert!(other.verify().is_err());
    }

    #[test]
    fn a_card_is_newer_only_with_a_larger_timestamp() {
        assert!(card(11).is_newer_than(&card(10)));
        assert!(!card(10).is_newer_than(&card(10)));
        assert!(!card(9).is_newer_than(&card(10)));
    }

    #[test]
    fn a_card_with_too_many_addresses_is_neither_signed_nor_decoded() {
        let addrs: Vec<SocketAddr> = (0..=CARD_ADDRS_MAX as u16)
            .map(|p| SocketAddr::from(([192, 0, 2, 1], 4000 + p)))
            .collect();
        let name = NodeName::new("x").unwrap();
        assert_eq!(
            NodeCard::sign(&secret(), name, addrs.clone(), 1),
            Err(CardError::TooManyAddrs(CARD_ADDRS_MAX + 1))
        );
        let mut big = card(1);
        big.addrs = addrs;
        let bytes = postcard::to_stdvec(&big).unwrap();
        assert!(postcard::from_bytes::<NodeCard>(&bytes).is_err());
        assert!(matches!(big.verify(), Err(CardError::TooManyAddrs(_))));
    }

    #[test]
    fn a_card_with_a_bad_name_does_not_decode() {
        let mut c = card(1);
        c.name = NodeName("Bad Name".to_owned());
        let bytes = postcard::to_stdvec(&c).unwrap();
        assert!(postcard::from_bytes::<NodeCard>(&bytes).is_err());
    }
}
