//! A node ticket as a person pastes it into `mesh peer add`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_protocol::fuzzing::ticket(data));
