//! How a node starts: its transport bound with the stored peers, and its
//! core built over what the store recovered, with a new card of this node
//! when its name or addresses changed.

use std::net::SocketAddr;

use iroh::Endpoint;
use mesh_protocol::{MAX_TICKET_ADDRS, NodeCard, NodeName, SecretKey};
use tracing::{Instrument, Span, info};

use super::{NodeConfig, NodeError, actor};
use crate::core::{self, Core, Recovered};
use crate::net::{Transport, endpoint_addrs};

/// Binds the transport with `secret` and makes every stored peer (but this
/// node) known to it.
///
/// # Errors
/// As [`Node::start`]'s `Net` and `Peer`; on a peer it cannot add, the
/// transport is shut down first.
pub(super) async fn bind_transport(
    config: &NodeConfig,
    secret: &SecretKey,
    recovered: &Recovered,
    span: &Span,
) -> Result<Transport<actor::Received>, NodeError> {
    let id = secret.public();
    let mut net = config.net.clone();
    if net.mdns_name.is_empty() {
        net.mdns_name = config.name.to_string();
    }
    let mut transport = Transport::bind(&net, secret.clone(), actor::open)
        .instrument(span.clone())
        .await?;
    let added = span.in_scope(|| {
        recovered
            .peers
            .iter()
            .filter(|p| p.node != id)
            .try_for_each(|p| {
                let addrs = p.addrs.iter().copied().take(MAX_TICKET_ADDRS).collect();
                transport.add_peer(p.node, addrs)
            })
    });
    if let Err(e) = added {
        transport.shutdown().await;
        return Err(e.into());
    }
    Ok(transport)
}

/// The core over `recovered`, fed a new card of this node first if the one
/// it holds no longer matches its name or the addresses of `endpoint`.
pub(super) fn new_core(
    config: &NodeConfig,
    secret: &SecretKey,
    recovered: Recovered,
    endpoint: &Endpoint,
) -> Core {
    let id = secret.public();
    let held = recovered.cards.iter().find(|c| c.node == id).cloned();
    let card = own_card(secret, held.as_ref(), &config.name, endpoint);
    let mut core = Core::new(config.core.clone(), secret.clone(), recovered);
    if let Some(card) = card {
        info!(name = %card.name, addrs = ?card.addrs, "this node issued a new card");
        core.handle(core::Input::OwnCard { card }, actor::now());
    }
    core
}

/// A new card for this node if its name or listen addresses differ from
/// the one it holds (`held`), issued later than that one even if the clock
/// went back; `None` if nothing changed.
fn own_card(
    secret: &SecretKey,
    held: Option<&NodeCard>,
    name: &NodeName,
    endpoint: &Endpoint,
) -> Option<NodeCard> {
    let addrs: Vec<SocketAddr> = endpoint_addrs(endpoint)
        .into_iter()
        .take(mesh_protocol::CARD_ADDRS_MAX)
        .collect();
    if held.is_some_and(|c| c.name == *name && c.addrs == addrs) {
        return None;
    }
    let after = held.map_or(0, |c| c.issued_ms.saturating_add(1));
    let issued_ms = actor::now().0.max(after);
    // At most CARD_ADDRS_MAX addresses: within every bound.
    NodeCard::sign(secret, name.clone(), addrs, issued_ms).ok()
}
