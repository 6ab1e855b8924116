//! The handshake, on the server's side and on the client's, with a peer sending these bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_proto::fuzzing::handshake(data));
