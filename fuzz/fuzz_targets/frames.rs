//! A stream of frames as a server or client reads them, each header decoded by its kind.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_proto::fuzzing::frames(data));
