//! A local client's JSON request body: every shape the API decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_daemon::api::fuzzing::json_body(data));
