//! An invite code as a person pastes it into `mesh join`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_protocol::fuzzing::invite(data));
