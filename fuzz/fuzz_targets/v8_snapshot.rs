//! Fuzz target: `leaktrace::fuzzing::v8_snapshot` (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leaktrace::fuzzing::v8_snapshot(data));
