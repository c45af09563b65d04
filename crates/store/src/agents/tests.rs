use mesh_protocol::{Epoch, SecretKey};

use super::*;

fn stream(b: u8) -> StreamId {
    let n = SecretKey::from_bytes(&[b; 32]).public();
    StreamId::direct(n, Epoch([b; 16]), n)
}

#[test]
fn runs_resolve_each_journaled_seq_to_its_arrival_and_nothing_else() {
    let (a, b) = (stream(1), stream(2));
    let mut runs = Vec::new();
    for (s, seq, arrival) in [(&a, 5, 10), (&a, 6, 11), (&b, 1, 12), (&a, 7, 13)] {
        note_envelope(&mut runs, s, seq, arrival);
    }
    assert_eq!(runs.len(), 3);
    assert_eq!(arrival_of(&runs, &a, 6), Some(11));
    assert_eq!(arrival_of(&runs, &a, 7), Some(13));
    assert_eq!(arrival_of(&runs, &b, 1), Some(12));
    assert_eq!(arrival_of(&runs, &a, 8), None);
    assert_eq!(arrival_of(&runs, &b, 2), None);
}
