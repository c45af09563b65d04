//! A local client's NDJSON send body, cut into frames: the line splitter
//! and each line's decoding.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_daemon::api::fuzzing::ndjson(data));
