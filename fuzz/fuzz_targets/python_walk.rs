//! Fuzz target: `leaktrace::fuzzing::python_walk` (see fuzz/Cargo.toml).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| leaktrace::fuzzing::python_walk(data));
