//! Fuzz target: `leaktrace::fuzzing::go_buckets` (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leaktrace::fuzzing::go_buckets(data));
