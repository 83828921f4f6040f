//! Fuzz target: `leaktrace::fuzzing::go_binary` (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leaktrace::fuzzing::go_binary(data));
