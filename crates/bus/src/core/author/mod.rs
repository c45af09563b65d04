//! The author side: this node's own streams, signing, and feeding each
//! peer its stream on the live connection (live, catch-up, resync, gaps,
//! retransmit after silence) as far as the peer acknowledges; checking a
//! peer's mark against the store before trusting it (a store that went back
//! in time, or a clone writing the same stream, is found there), and the own
//! streams of ended epochs, whose unacknowledged envelopes are carried over.
//!
//! `feed` holds the feeds; `epochs` the Hello checks, the rollback
//! reports, the epoch switch and the carry-over.

mod epochs;
mod feed;

use std::collections::{BTreeMap, BTreeSet};

use mesh_protocol::{
    Channel, Cid, Epoch, Mark, NewEnvelope, NodeId, OpenBatch, SecretKey, Seq, StreamId,
    VerifyError,
};
use mesh_store::{EndedOwn, OwnStream};

use super::LoadId;
use super::commit::CarryWork;
use feed::Feed;

/// A peer's Hello mark for our stream, checked against what is committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HelloCheck {
    /// The mark can be taken as it is (as far as the store can tell).
    Trust(Seq),
    /// The mark names an envelope the outbox holds: compare hashes first.
    Verify { mark: Seq, cid: Cid },
    /// The peer holds more of the stream than this store ever wrote: the
    /// store went back in time.
    RolledBack { mark: Seq },
}

/// What an outbox read brought back besides a feed's catch-up.
#[derive(Debug)]
pub(super) enum Loaded {
    /// Nothing more to do (a catch-up chunk was sent, or the read is stale).
    Done,
    /// The peer's mark names our own envelope: feed it from there.
    Verified {
        peer: NodeId,
        mark: Seq,
        reset: bool,
    },
    /// The peer's mark names another envelope than ours at that seq.
    Forked { peer: NodeId, mark: Seq },
    /// The next envelopes of an ended stream to carry over.
    Carry(CarryWork),
}

/// This node's own streams and the feeds that carry them to peers.
///
/// Invariant: a feed exists only for a peer whose Hello came on the
/// connection the feed names.
#[derive(Debug)]
pub(super) struct Author {
    secret: SecretKey,
    me: NodeId,
    epoch: Epoch,
    /// The highest Lamport clock seen or given out.
    lamport: u64,
    /// This node's current-epoch stream to each recipient, as committed.
    own: BTreeMap<NodeId, OwnStream>,
    feeds: BTreeMap<NodeId, Feed>,
    next_load: u64,
    /// Peers whose feed changed since [`Author::take_touched`].
    touched: BTreeSet<NodeId>,
    /// Own streams of earlier epochs of this store.
    ended: BTreeMap<StreamId, EndedOwn>,
    /// The outboxes of ended streams still holding envelopes to carry over.
    old: BTreeMap<StreamId, OwnStream>,
    /// The carry-over read in flight.
    carry_load: Option<(LoadId, StreamId)>,
    /// A new epoch is under way: nothing more goes out on the old streams.
    frozen: bool,
    /// Randomness for new epochs, and how many were made.
    entropy: [u8; 32],
    epochs_made: u64,
    /// The highest seq of the current stream to each peer that may be at
    /// the peer: handed to a connection in this process's life, or
    /// committed before it started (who knows what went out then). Only
    /// what lies above may be replaced (supersede).
    sent: BTreeMap<NodeId, Seq>,
    /// Peers whose outbox the commit in flight replaces a batch of: their
    /// feed reads nothing until it has returned, so that no read sees the
    /// batch it replaces and sends it.
    superseding: BTreeSet<NodeId>,
}

impl Author {
    /// The author of `secret`'s streams in `epoch`, from the committed
    /// streams (other nodes' and other epochs' are ignored).
    pub(super) fn new(
        secret: SecretKey,
        epoch: Epoch,
        streams: Vec<OwnStream>,
        lamport: u64,
        ended: Vec<EndedOwn>,
        entropy: [u8; 32],
    ) -> Author {
        let me = secret.public();
        let ended: BTreeMap<StreamId, EndedOwn> =
            ended.into_iter().map(|e| (e.stream.clone(), e)).collect();
        let mut own = BTreeMap::new();
        let mut old = BTreeMap::new();
        let mut sent = BTreeMap::new();
        for o in streams.into_iter().filter(|o| o.stream.author == me) {
            let Channel::Direct(to) = o.stream.channel else {
                continue;
            };
            if o.stream.epoch == epoch {
                sent.insert(to, o.next_seq - 1);
                own.insert(to, o);
            } else if ended.contains_key(&o.stream) {
                old.insert(o.stream.clone(), o);
            }
        }
        Author {
            secret,
            me,
            epoch,
            lamport,
            own,
            feeds: BTreeMap::new(),
            next_load: 1,
            touched: BTreeSet::new(),
            ended,
            old,
            carry_load: None,
            frozen: false,
            entropy,
            epochs_made: 0,
            sent,
            superseding: BTreeSet::new(),
        }
    }

    /// This node's current store epoch, as the author writes it.
    pub(super) fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// An epoch for this store to start: new with overwhelming likelihood
    /// (drawn from the driver's randomness), never the current one.
    pub(super) fn next_epoch(&mut self) -> Epoch {
        loop {
            self.epochs_made += 1;
            let mut h = blake3::Hasher::new_keyed(&self.entropy);
            h.update(b"agent-mesh/epoch\0");
            h.update(&self.epoch.0);
            h.update(&self.epochs_made.to_le_bytes());
            let mut e = [0u8; 16];
            e.copy_from_slice(&h.finalize().as_bytes()[..16]);
            if Epoch(e) != self.epoch {
                return Epoch(e);
            }
        }
    }

    /// This node's current-epoch stream to `to`.
    pub(super) fn stream_id(&self, to: NodeId) -> StreamId {
        StreamId::direct(self.me, self.epoch, to)
    }

    /// The committed state of the stream to `to` (`None` before its first message).
    pub(super) fn own(&self, to: &NodeId) -> Option<&OwnStream> {
        self.own.get(to)
    }

    /// The committed state of the stream to `to`, empty before its first message.
    pub(super) fn own_view(&self, to: NodeId) -> OwnStream {
        self.own
            .get(&to)
            .cloned()
            .unwrap_or_else(|| OwnStream::empty(self.stream_id(to)))
    }

    /// The Lamport clock moves past one seen on a peer's envelope.
    pub(super) fn observe_lamport(&mut self, lamport: u64) {
        self.lamport = self.lamport.max(lamport);
    }

    /// A commit wrote these own streams (other nodes' and epochs' are ignored).
    pub(super) fn committed(&mut self, streams: &[OwnStream]) {
        for o in streams {
            if let Channel::Direct(to) = o.stream.channel
                && o.stream.author == self.me
                && o.stream.epoch == self.epoch
            {
                debug_assert_eq!(o.broken(), None, "{o:?}");
                // A commit only moves a stream on: seqs are never reused.
                debug_assert!(
                    self.own
                        .get(&to)
                        .is_none_or(|was| was.next_seq <= o.next_seq)
                );
                self.own.insert(to, o.clone());
            }
        }
    }

    /// Signs `envelopes` (without lamports yet) as the batch of the stream
    /// to `to` starting at `first_seq`, each with the next Lamport clock.
    pub(super) fn sign(
        &mut self,
        to: NodeId,
        first_seq: Seq,
        envelopes: impl IntoIterator<Item = NewEnvelope>,
    ) -> Result<OpenBatch, VerifyError> {
        self.sign_on(Channel::Direct(to), first_seq, envelopes)
    }

    /// Signs `envelopes` as the batch of this node's stream on `channel`
    /// (a topic's) starting at `first_seq`, each with the next Lamport clock.
    pub(super) fn sign_on(
        &mut self,
        channel: Channel,
        first_seq: Seq,
        envelopes: impl IntoIterator<Item = NewEnvelope>,
    ) -> Result<OpenBatch, VerifyError> {
        let envelopes = envelopes
            .into_iter()
            .map(|e| {
                self.lamport = self.lamport.saturating_add(1);
                NewEnvelope {
                    lamport: self.lamport,
                    ..e
                }
            })
            .collect();
        OpenBatch::sign(&self.secret, self.epoch, channel, first_seq, envelopes)
    }

    /// Signs `envelope`, lamport and all, alone as the batch of the stream
    /// to `to` at `seq`: a tombstone in the place of an envelope signed
    /// there before, with that envelope's clocks.
    pub(super) fn sign_in_place(
        &mut self,
        to: NodeId,
        seq: Seq,
        envelope: NewEnvelope,
    ) -> Result<OpenBatch, VerifyError> {
        OpenBatch::sign(
            &self.secret,
            self.epoch,
            Channel::Direct(to),
            seq,
            vec![envelope],
        )
    }

    /// Whether the envelope at `seq` of the current stream to `peer` may
    /// be replaced in the outbox: it was never handed to a connection (nor
    /// committed before this process started), no new epoch is under way,
    /// and no outbox read of the peer's feed is in flight (one could bring
    /// back the batch being replaced).
    pub(super) fn may_replace(&self, peer: NodeId, seq: Seq) -> bool {
        !self.frozen
            && peer != self.me
            && seq > self.sent_upto(peer)
            && self.feed_reads_nothing(peer)
    }

    /// The highest seq of the current stream to `peer` that may be at the peer.
    pub(super) fn sent_upto(&self, peer: NodeId) -> Seq {
        self.sent.get(&peer).copied().unwrap_or(0)
    }

    /// A commit replacing a batch of the outbox to `peer` is being issued.
    pub(super) fn replacing(&mut self, peer: NodeId) {
        self.superseding.insert(peer);
    }

    /// Notes that the stream to `peer` was handed to a connection up to `seq`.
    fn note_sent(&mut self, peer: NodeId, seq: Seq) {
        let s = self.sent.entry(peer).or_insert(0);
        *s = (*s).max(seq);
    }

    /// The mark `marks` (a peer's Hello) holds for our current stream to `peer`.
    pub(super) fn mark_in<'m>(&self, peer: NodeId, marks: &'m [Mark]) -> Option<&'m Mark> {
        let mine = self.stream_id(peer);
        marks.iter().find(|m| m.stream == mine)
    }
}
