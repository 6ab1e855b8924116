//! A header decoded as a request, a response and a notice.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_proto::fuzzing::messages(data));
