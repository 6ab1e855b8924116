//! A partition table, alone and with the cluster's settings, decoded and then used.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tessera_proto::fuzzing::table(data));
