//! An envelope payload of one of the mesh's own kinds (an agent message, a
//! bounce, a tombstone, a forward, a read receipt): decode, and re-encode to the same bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_protocol::fuzzing::agent_payload(data));
