//! An agent move offered by hand on the move link (`amesh-move/1`), as a
//! node key of the test's choosing: what a node does for `mesh agent move`,
//! for a test that makes the same offer twice (an answer lost after the
//! import).

use std::time::Duration;

use anyhow::Context as _;
use iroh::endpoint::{PortmapperConfig, presets};
use iroh::{Endpoint, EndpointAddr, RelayMode};
use mesh_protocol::{MOVE_ALPN, MOVE_MESSAGE_BYTES_MAX, NodeTicket, SecretKey};

/// How long the offer may take in all.
const OFFER_TIMEOUT: Duration = Duration::from_secs(60);

/// Offers `body` to the node of `to` as the node `key` (on a fresh
/// endpoint on 127.0.0.1) and returns the answer's bytes.
///
/// # Errors
/// The dial, the exchange or the time failed, or the answer is over the cap.
pub async fn offer(key: SecretKey, to: &NodeTicket, body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let endpoint = Endpoint::builder(presets::Minimal)
        .secret_key(key)
        .relay_mode(RelayMode::Disabled)
        .clear_address_lookup()
        .portmapper_config(PortmapperConfig::Disabled)
        .clear_ip_transports()
        .bind_addr(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?
        .bind()
        .await?;
    let mut addr = EndpointAddr::new(to.node);
    for a in &to.addrs {
        addr = addr.with_ip_addr(*a);
    }
    let exchange = async {
        let conn = endpoint.connect(addr, MOVE_ALPN).await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let mut out = u32::try_from(body.len())?.to_be_bytes().to_vec();
        out.extend_from_slice(body);
        send.write_all(&out).await?;
        send.finish()?;
        let all = recv.read_to_end(4 + MOVE_MESSAGE_BYTES_MAX).await?;
        conn.close(0u32.into(), b"done");
        anyhow::ensure!(all.len() >= 4, "no answer: {} bytes", all.len());
        Ok::<_, anyhow::Error>(all[4..].to_vec())
    };
    let answer = tokio::time::timeout(OFFER_TIMEOUT, exchange)
        .await
        .context("no answer in time")?;
    endpoint.close().await;
    answer
}
