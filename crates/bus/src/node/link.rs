//! What the two one-exchange links (joining, moving an agent) share: a
//! length-prefixed message read under a cap.

use iroh::endpoint::RecvStream;
use mesh_protocol::FRAME_HEADER_BYTES;

/// Why a message could not be read.
pub(super) enum ReadError {
    /// Its header announces this many bytes, more than the cap.
    TooLarge(usize),
    /// The stream broke.
    Stream(String),
}

/// Reads one message with a 4-byte big-endian length header, refusing one
/// of more than `max` bytes before reading its body.
pub(super) async fn read_capped(recv: &mut RecvStream, max: usize) -> Result<Vec<u8>, ReadError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    recv.read_exact(&mut header)
        .await
        .map_err(|e| ReadError::Stream(e.to_string()))?;
    let len = capped_len(header, max)
        .ok_or_else(|| ReadError::TooLarge(u32::from_be_bytes(header) as usize))?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body)
        .await
        .map_err(|e| ReadError::Stream(e.to_string()))?;
    Ok(body)
}

/// The length `header` announces, if it is at most `max`.
pub(super) fn capped_len(header: [u8; FRAME_HEADER_BYTES], max: usize) -> Option<usize> {
    let len = u32::from_be_bytes(header) as usize;
    (len <= max).then_some(len)
}
