//! Tests of the store: one conformance suite run against every
//! implementation, then the on-disk and crash tests of the redb store.

mod actor;
mod agents;
mod conformance;
mod crash;
mod durable;
mod files;
mod topics;
pub(crate) mod util;

use mesh_protocol::Epoch;

use crate::{MemStore, MeshStore, StoreError, WriteOp};
use util::*;

#[test]
fn an_unavailable_mem_store_fails_every_group_and_writes_nothing() {
    let s = MemStore::new(Epoch([9; 16]));
    s.set_unavailable(true);
    let results = s.commit(vec![
        vec![WriteOp::Accept {
            batch: peer_batch(PEER, 1, 1),
            from: 1,
        }],
        vec![WriteOp::Accept {
            batch: peer_batch(3, 1, 1),
            from: 1,
        }],
    ]);
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(StoreError::Unavailable(_)))),
        "{results:?}"
    );
    assert_eq!(s.journal_head().expect("head"), 0);
    s.set_unavailable(false);
    accept1(&s, peer_batch(PEER, 1, 1), 1).expect("commits");
}

#[test]
fn a_forked_mem_store_keeps_the_state_and_then_goes_its_own_way() {
    let s = MemStore::new(Epoch([9; 16]));
    accept1(&s, peer_batch(PEER, 1, 1), 1).expect("commits");
    let f = s.fork();
    assert_eq!(dump(&f, &[]).expect("dump"), dump(&s, &[]).expect("dump"));
    accept1(&f, peer_batch(PEER, 2, 1), 2).expect("commits");
    assert_eq!(
        (
            s.journal_head().expect("head"),
            f.journal_head().expect("head")
        ),
        (1, 2)
    );
}
