//! Fuzz target: `leaktrace::fuzzing::hprof` (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leaktrace::fuzzing::hprof(data));
