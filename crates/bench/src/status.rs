//! What the bench reads from a node's `GET /v1/status`.

use mesh_api::{PeerStatus, StatusResponse};

/// The peer `id` as the node of `st` sees it.
pub(crate) fn peer<'a>(st: &'a StatusResponse, id: &str) -> Option<&'a PeerStatus> {
    st.node.peers.iter().find(|p| p.node == id)
}

/// The mark the node of `st` holds of the stream `author` (at `epoch`) writes to it.
pub(crate) fn mark_from(st: &StatusResponse, author: &str, epoch: &str) -> u64 {
    let channel = format!("direct:{}", st.node.node);
    peer(st, author)
        .into_iter()
        .flat_map(|p| p.marks.iter())
        .filter(|m| {
            m.stream.author == author && m.stream.epoch == epoch && m.stream.channel == channel
        })
        .map(|m| m.mark)
        .max()
        .unwrap_or(0)
}
