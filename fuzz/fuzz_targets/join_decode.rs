//! One join message body, as a node that is not a peer may send it on the
//! join ALPN (and as an inviter's answer reaches the joiner).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_protocol::fuzzing::join(data));
