//! A frame body off the wire: decode, re-encode, and for a batch verify and open.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_protocol::fuzzing::frame(data));
