//! Envelopes and signed batches.
//!
//! The unit of signing is a batch of consecutive envelopes of one stream. The
//! signature covers [`BATCH_DOMAIN`] followed by the postcard encoding of every
//! header field (author, epoch, channel, first seq, entries); each entry carries
//! the BLAKE3 hash of its payload, so a verified header vouches for every payload.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{Channel, Epoch, NodeId, SecretKey, Seq, StreamId};

/// The domain tag signed before a batch header, so a batch signature can never
/// be replayed as a signature over anything else.
pub const BATCH_DOMAIN: &[u8] = b"agent-mesh/signed-batch/v1\0";

/// The most envelopes one batch may carry.
pub const MAX_BATCH_ENTRIES: usize = 256;

/// The most payload bytes one batch may carry, summed over its entries.
pub const MAX_BATCH_PAYLOAD_BYTES: u64 = 1 << 20;

/// A payload's content id: its BLAKE3 hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cid(pub [u8; 32]);

impl Cid {
    /// The content id of `payload`.
    pub fn of(payload: &[u8]) -> Cid {
        Cid(*blake3::hash(payload).as_bytes())
    }
}

impl fmt::Debug for Cid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cid({})", data_encoding::HEXLOWER.encode(&self.0[..6]))
    }
}

impl fmt::Display for Cid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&data_encoding::HEXLOWER.encode(&self.0))
    }
}

/// The signed header of one envelope inside a batch. Its sequence number is
/// the batch's `first_seq` plus its index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryHeader {
    /// The author's Lamport clock when it wrote the envelope.
    pub lamport: u64,
    /// The author's wall clock, milliseconds since the Unix epoch (informative only).
    pub created_ms: u64,
    /// An application-defined kind; 0 is a plain message.
    pub kind: u16,
    /// BLAKE3 of the payload.
    pub payload_cid: Cid,
    /// The payload's length in bytes.
    pub payload_len: u32,
}

impl EntryHeader {
    /// A header for `payload`, hashing it.
    pub fn for_payload(lamport: u64, created_ms: u64, kind: u16, payload: &[u8]) -> Self {
        EntryHeader {
            lamport,
            created_ms,
            kind,
            payload_cid: Cid::of(payload),
            // A payload longer than u32::MAX can never fit a batch; saturate so
            // the batch size check rejects it instead of wrapping.
            payload_len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        }
    }
}

/// A batch as received: signed by someone, checked by no one yet.
///
/// Only [`SignedBatch::verify`] turns it into a [`VerifiedBatch`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedBatch {
    /// The stream's author, whose key signed the batch.
    #[serde(with = "crate::ids::node_id_serde")]
    pub author: NodeId,
    /// The author's store epoch.
    pub epoch: Epoch,
    /// The stream's channel.
    pub channel: Channel,
    /// The sequence number of the first entry.
    pub first_seq: Seq,
    /// One header per envelope, in sequence order.
    pub entries: Vec<EntryHeader>,
    /// ed25519 over [`BATCH_DOMAIN`] and the fields above.
    #[serde(with = "sig_bytes")]
    pub sig: [u8; 64],
}

impl fmt::Debug for SignedBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SignedBatch")
            .field("author", &format_args!("{}", self.author.fmt_short()))
            .field("epoch", &self.epoch)
            .field("channel", &self.channel)
            .field("first_seq", &self.first_seq)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// The fields a batch signature covers, borrowed for encoding.
#[derive(Serialize)]
struct Unsigned<'a> {
    author: &'a NodeId,
    epoch: &'a Epoch,
    channel: &'a Channel,
    first_seq: Seq,
    entries: &'a [EntryHeader],
}

/// Why a batch or its payloads were refused. Every variant is the peer's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The batch has no entries.
    #[error("batch has no entries")]
    Empty,
    /// The batch has more than [`MAX_BATCH_ENTRIES`] entries.
    #[error("batch has {0} entries, more than the {MAX_BATCH_ENTRIES} allowed")]
    TooManyEntries(usize),
    /// The entries' payloads add up to more than [`MAX_BATCH_PAYLOAD_BYTES`].
    #[error("batch carries {0} payload bytes, more than the {MAX_BATCH_PAYLOAD_BYTES} allowed")]
    TooManyBytes(u64),
    /// `first_seq` is 0, or the last sequence would overflow.
    #[error("batch starts at seq {0}, which is not a valid first seq")]
    BadFirstSeq(Seq),
    /// The signature does not verify under the author's key.
    #[error("batch signature does not verify for author {0}")]
    BadSignature(String),
    /// The number of payloads differs from the number of entries.
    #[error("batch has {entries} entries but {payloads} payloads")]
    PayloadCount {
        /// Entries in the header.
        entries: usize,
        /// Payloads that came with it.
        payloads: usize,
    },
    /// A payload's length or hash differs from its entry.
    #[error("payload for seq {seq} does not match its signed hash")]
    PayloadMismatch {
        /// The envelope whose payload is wrong.
        seq: Seq,
    },
}

impl SignedBatch {
    /// The bytes the signature covers: [`BATCH_DOMAIN`], then postcard of
    /// `(author, epoch, channel, first_seq, entries)`.
    pub fn signed_bytes(&self) -> Vec<u8> {
        signed_bytes(&Unsigned {
            author: &self.author,
            epoch: &self.epoch,
            channel: &self.channel,
            first_seq: self.first_seq,
            entries: &self.entries,
        })
    }

    /// Signs `entries` as the batch starting at `first_seq` of the stream
    /// `(secret.public(), epoch, channel)`.
    ///
    /// Errors if the batch breaks a limit: the same checks a receiver makes.
    pub fn sign(
        secret: &SecretKey,
        epoch: Epoch,
        channel: Channel,
        first_seq: Seq,
        entries: Vec<EntryHeader>,
    ) -> Result<VerifiedBatch, VerifyError> {
        let author = secret.public();
        check_shape(first_seq, &entries)?;
        let msg = signed_bytes(&Unsigned {
            author: &author,
            epoch: &epoch,
            channel: &channel,
            first_seq,
            entries: &entries,
        });
        let sig = secret.sign(&msg).to_bytes();
        let batch = SignedBatch {
            author,
            epoch,
            channel,
            first_seq,
            entries,
            sig,
        };
        Ok(VerifiedBatch::new(batch))
    }

    /// Checks the limits and the signature (`verify_strict`).
    pub fn verify(self) -> Result<VerifiedBatch, VerifyError> {
        check_shape(self.first_seq, &self.entries)?;
        let sig = iroh_base::Signature::from_bytes(&self.sig);
        self.author
            .verify(&self.signed_bytes(), &sig)
            .map_err(|_| VerifyError::BadSignature(self.author.fmt_short().to_string()))?;
        Ok(VerifiedBatch::new(self))
    }

    /// The last sequence number in the batch (saturating; a verified batch never saturates).
    pub fn last_seq(&self) -> Seq {
        let n = self.entries.len() as u64;
        self.first_seq.saturating_add(n.saturating_sub(1))
    }
}

fn signed_bytes(u: &Unsigned<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(BATCH_DOMAIN.len() + 96 + u.entries.len() * 64);
    out.extend_from_slice(BATCH_DOMAIN);
    // Serializing plain structs into a Vec cannot fail: postcard only errors on
    // unsupported types (none here) or a full fixed buffer (a Vec grows).
    postcard::to_extend(u, out).unwrap_or_else(|_| unreachable!("postcard into Vec"))
}

fn check_shape(first_seq: Seq, entries: &[EntryHeader]) -> Result<(), VerifyError> {
    if entries.is_empty() {
        return Err(VerifyError::Empty);
    }
    if entries.len() > MAX_BATCH_ENTRIES {
        return Err(VerifyError::TooManyEntries(entries.len()));
    }
    let bytes: u64 = entries.iter().map(|e| u64::from(e.payload_len)).sum();
    if bytes > MAX_BATCH_PAYLOAD_BYTES {
        return Err(VerifyError::TooManyBytes(bytes));
    }
    if first_seq == 0 || first_seq.checked_add(entries.len() as u64).is_none() {
        return Err(VerifyError::BadFirstSeq(first_seq));
    }
    Ok(())
}

/// A batch whose signature has been checked (or that this node signed).
///
/// Holds the original [`SignedBatch`] unchanged, so it is stored and re-sent
/// byte for byte, never re-signed.
#[derive(Clone, PartialEq, Eq)]
pub struct VerifiedBatch {
    batch: SignedBatch,
    stream: StreamId,
}

impl fmt::Debug for VerifiedBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VerifiedBatch({:?} {}..={})",
            self.stream,
            self.batch.first_seq,
            self.last_seq()
        )
    }
}

impl VerifiedBatch {
    fn new(batch: SignedBatch) -> Self {
        let stream = StreamId {
            author: batch.author,
            epoch: batch.epoch,
            channel: batch.channel.clone(),
        };
        VerifiedBatch { batch, stream }
    }

    /// The stream the batch belongs to.
    pub fn stream(&self) -> &StreamId {
        &self.stream
    }

    /// The first sequence number.
    pub fn first_seq(&self) -> Seq {
        self.batch.first_seq
    }

    /// The last sequence number.
    pub fn last_seq(&self) -> Seq {
        self.batch.last_seq()
    }

    /// The signed entry headers, in sequence order.
    pub fn entries(&self) -> &[EntryHeader] {
        &self.batch.entries
    }

    /// The signed batch as it was signed.
    pub fn signed(&self) -> &SignedBatch {
        &self.batch
    }

    /// Gives back the signed batch, for storing or sending.
    pub fn into_signed(self) -> SignedBatch {
        self.batch
    }

    /// The sum of the payload lengths the batch vouches for.
    pub fn payload_bytes(&self) -> u64 {
        self.batch
            .entries
            .iter()
            .map(|e| u64::from(e.payload_len))
            .sum()
    }

    /// Checks `payloads` against the signed hashes, one per entry in order.
    pub fn open(self, payloads: Vec<Vec<u8>>) -> Result<OpenBatch, VerifyError> {
        if payloads.len() != self.batch.entries.len() {
            return Err(VerifyError::PayloadCount {
                entries: self.batch.entries.len(),
                payloads: payloads.len(),
            });
        }
        for (i, (e, p)) in self.batch.entries.iter().zip(&payloads).enumerate() {
            if u64::from(e.payload_len) != p.len() as u64 || Cid::of(p) != e.payload_cid {
                return Err(VerifyError::PayloadMismatch {
                    seq: self.batch.first_seq + i as u64,
                });
            }
        }
        Ok(OpenBatch {
            batch: self,
            payloads,
        })
    }
}

/// A verified batch together with payloads that match its signed hashes.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenBatch {
    batch: VerifiedBatch,
    payloads: Vec<Vec<u8>>,
}

impl fmt::Debug for OpenBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Open{:?}", self.batch)
    }
}

/// One new envelope to sign: its header fields and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEnvelope {
    /// The author's Lamport clock for it.
    pub lamport: u64,
    /// Wall clock, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Application-defined kind; 0 is a plain message.
    pub kind: u16,
    /// The payload.
    pub payload: Vec<u8>,
}

impl OpenBatch {
    /// Signs `envelopes` as the batch starting at `first_seq` of the stream
    /// `(secret.public(), epoch, channel)`, hashing each payload once.
    pub fn sign(
        secret: &SecretKey,
        epoch: Epoch,
        channel: Channel,
        first_seq: Seq,
        envelopes: Vec<NewEnvelope>,
    ) -> Result<OpenBatch, VerifyError> {
        let mut entries = Vec::with_capacity(envelopes.len());
        let mut payloads = Vec::with_capacity(envelopes.len());
        for e in envelopes {
            entries.push(EntryHeader::for_payload(
                e.lamport,
                e.created_ms,
                e.kind,
                &e.payload,
            ));
            payloads.push(e.payload);
        }
        let batch = SignedBatch::sign(secret, epoch, channel, first_seq, entries)?;
        Ok(OpenBatch { batch, payloads })
    }

    /// The verified batch.
    pub fn batch(&self) -> &VerifiedBatch {
        &self.batch
    }

    /// The payloads, one per entry.
    pub fn payloads(&self) -> &[Vec<u8>] {
        &self.payloads
    }

    /// Splits into the batch and its payloads.
    pub fn into_parts(self) -> (VerifiedBatch, Vec<Vec<u8>>) {
        (self.batch, self.payloads)
    }

    /// The envelope at `seq`, if the batch holds it.
    pub fn envelope(&self, seq: Seq) -> Option<Envelope<'_>> {
        let i = usize::try_from(seq.checked_sub(self.batch.first_seq())?).ok()?;
        Some(Envelope {
            stream: self.batch.stream(),
            seq,
            header: self.batch.entries().get(i)?,
            payload: self.payloads.get(i)?,
        })
    }

    /// Every envelope, in sequence order.
    pub fn envelopes(&self) -> impl Iterator<Item = Envelope<'_>> {
        let first = self.batch.first_seq();
        self.batch
            .entries()
            .iter()
            .zip(&self.payloads)
            .enumerate()
            .map(move |(i, (header, payload))| Envelope {
                stream: self.batch.stream(),
                seq: first + i as u64,
                header,
                payload,
            })
    }
}

/// One message, borrowed from an [`OpenBatch`]: it exists only together with
/// a verified batch whose header holds its payload's hash at its index.
#[derive(Clone, Copy, Debug)]
pub struct Envelope<'a> {
    /// Its stream.
    pub stream: &'a StreamId,
    /// Its sequence number in the stream.
    pub seq: Seq,
    /// Its signed header.
    pub header: &'a EntryHeader,
    /// Its payload, matching `header.payload_cid`.
    pub payload: &'a [u8],
}

/// Serde for a 64-byte signature as a fixed tuple (no length prefix).
pub(crate) mod sig_bytes {
    use std::fmt;

    use serde::de::{Error, SeqAccess, Visitor};
    use serde::ser::SerializeTuple;
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(sig: &[u8; 64], s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(64)?;
        for b in sig {
            t.serialize_element(b)?;
        }
        t.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 64], D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = [u8; 64];
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("64 signature bytes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[u8; 64], A::Error> {
                let mut out = [0u8; 64];
                for (i, b) in out.iter_mut().enumerate() {
                    *b = seq
                        .next_element()?
                        .ok_or_else(|| A::Error::invalid_length(i, &self))?;
                }
                Ok(out)
            }
        }
        d.deserialize_tuple(64, V)
    }
}
