//! Fuzz target: `leaktrace::fuzzing::cdp` (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leaktrace::fuzzing::cdp(data));
