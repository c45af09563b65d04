//! LAN discovery with mDNS (`swarm-discovery`, the engine of
//! `iroh-mdns-address-lookup`, used directly so the interfaces it runs on
//! can be chosen): service `_agent-mesh._udp.local`, each node under its id.
//!
//! It runs only where the node listens: bound to a loopback address it
//! does not start at all; bound to one IPv4 address it joins the group and
//! sends on that address's interface only; bound to `0.0.0.0` it uses the
//! host's default interface (and listens on all). IPv6 binds get no mDNS.
//! An announcement carries the node's id, its listen addresses and port,
//! and its name (TXT `name`); `resolve` announces nothing and only asks.
//!
//! What it finds only ever informs: a known peer's discovered addresses
//! are dialed, a stranger is listed as nearby ([`NEARBY_MAX`] at most);
//! nothing becomes a peer by being discovered.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use mesh_protocol::{MAX_TICKET_ADDRS, NodeId};
use swarm_discovery::{Discoverer, DropGuard, IpClass, Peer};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// The mDNS service name: `_agent-mesh._udp.local`.
pub const MDNS_SERVICE: &str = "agent-mesh";

/// The most strangers listed as nearby; the oldest seen goes first.
pub const NEARBY_MAX: usize = 256;

/// Discoveries waiting for the transport's owner; more are dropped (the
/// next announcement brings them again).
const MDNS_EVENTS_MAX: usize = 256;

/// How often mDNS asks the LAN, at most (swarm-discovery's cadence τ).
const MDNS_CADENCE: Duration = Duration::from_millis(700);

/// The TXT attribute that carries the node's name.
const NAME_ATTRIBUTE: &str = "name";

/// What mDNS does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MdnsMode {
    /// Nothing (the default of a bare transport).
    #[default]
    Off,
    /// Ask for others, announce nothing.
    Resolve,
    /// Announce this node and ask for others.
    On,
}

/// A node found by mDNS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) node: NodeId,
    /// Empty when it expired (no longer answers).
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) name: Option<String>,
}

/// A running discovery; dropping it stops it.
pub(crate) struct Mdns {
    _guard: DropGuard,
    pub(crate) found: mpsc::Receiver<Found>,
}

impl std::fmt::Debug for Mdns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mdns")
    }
}

/// The name a node is known by in mDNS: its id, base32 (lowercase, no
/// padding: 52 characters, one DNS label).
fn label(node: &NodeId) -> String {
    data_encoding::BASE32_NOPAD
        .encode(node.as_bytes())
        .to_ascii_lowercase()
}

fn node_of(label: &str) -> Option<NodeId> {
    let bytes = data_encoding::BASE32_NOPAD
        .decode(label.to_ascii_uppercase().as_bytes())
        .ok()?;
    NodeId::from_bytes(&bytes.try_into().ok()?).ok()
}

/// Which interfaces discovery may use for a node bound to `bind`: `None`
/// if none (loopback or IPv6), else the IPv4 interface address (`None`
/// inside: the default interface, for `0.0.0.0`).
fn interface_for(bind: IpAddr) -> Option<Option<std::net::Ipv4Addr>> {
    match bind {
        IpAddr::V4(ip) if ip.is_loopback() => None,
        IpAddr::V4(ip) if ip.is_unspecified() => Some(None),
        IpAddr::V4(ip) => Some(Some(ip)),
        IpAddr::V6(_) => None,
    }
}

/// Starts discovery for node `me` bound to `bind`, announcing `addrs` and
/// `name` when `mode` is [`MdnsMode::On`]; `None` when it must not run
/// (off, loopback, IPv6) or cannot (logged: a LAN without multicast).
pub(crate) fn start(
    mode: MdnsMode,
    me: NodeId,
    bind: SocketAddr,
    addrs: &[SocketAddr],
    name: &str,
) -> Option<Mdns> {
    if mode == MdnsMode::Off {
        return None;
    }
    let Some(interface) = interface_for(bind.ip()) else {
        info!(%bind, "mDNS off: the node listens on loopback or IPv6 only, so it announces and asks nothing");
        return None;
    };
    let (tx, found) = mpsc::channel(MDNS_EVENTS_MAX);
    let callback = move |label: &str, peer: &Peer| {
        let Some(node) = node_of(label) else {
            debug!(label, "mDNS: an entry that is no node id");
            return;
        };
        if node == me {
            return;
        }
        let addrs = peer
            .addrs()
            .iter()
            .map(|(ip, port)| SocketAddr::new(*ip, *port))
            .take(MAX_TICKET_ADDRS)
            .collect();
        let name = peer
            .txt_attribute(NAME_ATTRIBUTE)
            .flatten()
            .map(|n| n.chars().take(64).collect());
        // A full queue drops this one: the node announces again.
        let _ = tx.try_send(Found { node, addrs, name });
    };
    let mut d = Discoverer::new_interactive(MDNS_SERVICE.to_owned(), label(&me))
        .with_cadence(MDNS_CADENCE)
        .with_ip_class(IpClass::V4Only)
        .with_callback(callback);
    if let Some(ip) = interface {
        d = d.with_multicast_interfaces_v4(vec![ip]);
    }
    if mode == MdnsMode::On {
        let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
        d = d.with_addrs(bind.port().max(addrs.first().map_or(0, |a| a.port())), ips);
        match d.with_txt_attributes([(NAME_ATTRIBUTE.to_owned(), Some(name.to_owned()))]) {
            Ok(with_name) => d = with_name,
            Err(e) => {
                warn!(error = %e, "mDNS: the name does not fit a TXT record; not announcing");
                return None;
            }
        }
    }
    match d.spawn(&tokio::runtime::Handle::current()) {
        Ok(guard) => {
            info!(?mode, ?interface, "mDNS discovery running");
            Some(Mdns {
                _guard: guard,
                found,
            })
        }
        Err(e) => {
            warn!(error = %e, "mDNS cannot run here; peers are dialed at their known addresses only");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_protocol::SecretKey;

    #[test]
    fn a_node_id_is_one_dns_label_and_back() {
        let id = SecretKey::from_bytes(&[3; 32]).public();
        let l = label(&id);
        assert_eq!(l.len(), 52);
        assert!(
            l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_eq!(node_of(&l), Some(id));
        assert_eq!(node_of("not-a-node"), None);
    }

    #[test]
    fn discovery_runs_only_on_the_interfaces_a_node_listens_on() {
        assert_eq!(interface_for("127.0.0.1".parse().expect("ip")), None);
        assert_eq!(interface_for("127.0.0.2".parse().expect("ip")), None);
        assert_eq!(interface_for("::1".parse().expect("ip")), None);
        assert_eq!(interface_for("0.0.0.0".parse().expect("ip")), Some(None));
        assert_eq!(
            interface_for("10.213.0.10".parse().expect("ip")),
            Some(Some("10.213.0.10".parse().expect("ip")))
        );
    }
}
