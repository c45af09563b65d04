//! Node tickets: text holding a node id and the addresses it listens on.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::frame::encoded_len;
use crate::ids::{NodeId, cut};

/// Text prefix of every ticket; the digit is the ticket format version.
const PREFIX: &str = "meshnode1";
/// The most addresses one ticket may carry.
pub const MAX_TICKET_ADDRS: usize = 16;
/// The longest ticket text accepted before decoding is tried.
const MAX_TEXT: usize = 1024;

/// What a node hands to a peer so the peer can dial it: its id and addresses.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTicket {
    /// The node's id (its public key).
    pub node: NodeId,
    /// Direct addresses it listens on.
    pub addrs: Vec<SocketAddr>,
}

/// Why a ticket was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TicketError {
    /// The text is not a ticket.
    #[error(
        "{text:?} is not a node ticket ({why}); tickets look like meshnode1…, as printed by `mesh ticket`"
    )]
    Malformed {
        /// The rejected text (cut).
        text: String,
        /// What was wrong.
        why: &'static str,
    },
    /// More than [`MAX_TICKET_ADDRS`] addresses.
    #[error("ticket lists {0} addresses, more than the {MAX_TICKET_ADDRS} allowed")]
    TooManyAddrs(usize),
}

impl NodeTicket {
    /// A ticket for `node` at `addrs`, refused past [`MAX_TICKET_ADDRS`].
    pub fn new(node: NodeId, addrs: Vec<SocketAddr>) -> Result<Self, TicketError> {
        if addrs.len() > MAX_TICKET_ADDRS {
            return Err(TicketError::TooManyAddrs(addrs.len()));
        }
        Ok(NodeTicket { node, addrs })
    }
}

impl fmt::Display for NodeTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Encoding a NodeId and socket addresses into a Vec cannot fail.
        write_text(f, PREFIX, self)
    }
}

impl fmt::Debug for NodeTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NodeTicket({} @ {:?})",
            self.node.fmt_short(),
            self.addrs
        )
    }
}

impl FromStr for NodeTicket {
    type Err = TicketError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let t: NodeTicket =
            read_text(text, PREFIX, MAX_TEXT).map_err(|why| TicketError::Malformed {
                text: cut(text),
                why,
            })?;
        NodeTicket::new(t.node, t.addrs)
    }
}

/// Writes `value` as text: `prefix`, then the base32 (DNSSEC alphabet) of
/// its postcard encoding.
pub(crate) fn write_text<T: Serialize>(
    f: &mut fmt::Formatter<'_>,
    prefix: &str,
    value: &T,
) -> fmt::Result {
    let bytes = postcard::to_stdvec(value).map_err(|_| fmt::Error)?;
    write!(f, "{prefix}{}", data_encoding::BASE32_DNSSEC.encode(&bytes))
}

/// Reads text written by [`write_text`], trimmed of surrounding whitespace.
///
/// # Errors
/// Why the text is not one `T`: longer than `text_bytes_max`, another
/// prefix, not base32, not a `T`, trailing bytes, or not the canonical
/// encoding of the `T` it decodes to.
pub(crate) fn read_text<T: Serialize + DeserializeOwned>(
    text: &str,
    prefix: &str,
    text_bytes_max: usize,
) -> Result<T, &'static str> {
    let text = text.trim();
    if text.len() > text_bytes_max {
        return Err("too long");
    }
    let body = text.strip_prefix(prefix).ok_or("wrong prefix")?;
    let raw = data_encoding::BASE32_DNSSEC
        .decode(body.as_bytes())
        .map_err(|_| "not base32")?;
    let (value, rest) = postcard::take_from_bytes::<T>(&raw).map_err(|_| "does not decode")?;
    if !rest.is_empty() {
        return Err("trailing bytes");
    }
    // A varint with redundant bytes decodes but re-encodes shorter: one
    // value, one text (up to letter case and surrounding whitespace).
    if encoded_len(&value).ok() != Some(raw.len()) {
        return Err("not canonical");
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SecretKey;

    #[test]
    fn a_ticket_with_a_redundant_varint_byte_is_refused() {
        let node = SecretKey::from_bytes(&[1; 32]).public();
        let t = NodeTicket::new(node, vec!["192.0.2.1:80".parse().unwrap()]).unwrap();
        let raw = postcard::to_stdvec(&t).unwrap();
        // The port is the last field: 80 = 0x50, which postcard also reads from 0xd0 0x00.
        assert_eq!(raw.last(), Some(&0x50));
        let mut padded = raw[..raw.len() - 1].to_vec();
        padded.extend_from_slice(&[0xd0, 0x00]);
        let text = format!("{PREFIX}{}", data_encoding::BASE32_DNSSEC.encode(&padded));
        assert!(matches!(
            text.parse::<NodeTicket>(),
            Err(TicketError::Malformed {
                why: "not canonical",
                ..
            })
        ));
        assert_eq!(t.to_string().parse::<NodeTicket>(), Ok(t));
    }

    #[test]
    fn a_ticket_over_the_address_limit_does_not_parse() {
        let node = SecretKey::from_bytes(&[1; 32]).public();
        let addrs: Vec<SocketAddr> = (0..=MAX_TICKET_ADDRS as u16)
            .map(|p| SocketAddr::from(([192, 0, 2, 1], 4000 + p)))
            .collect();
        assert_eq!(
            NodeTicket::new(node, addrs.clone()),
            Err(TicketError::TooManyAddrs(MAX_TICKET_ADDRS + 1))
        );
        // Fields are public, so such a ticket can still be built and printed.
        let text = NodeTicket { node, addrs }.to_string();
        assert_eq!(
            text.parse::<NodeTicket>(),
            Err(TicketError::TooManyAddrs(MAX_TICKET_ADDRS + 1))
        );
    }
}
