//! Test harness (to be written).
