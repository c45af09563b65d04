//! A journal cursor as a local client hands it to `mesh events --after`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_protocol::fuzzing::cursor(data));
