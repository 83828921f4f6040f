//! Outputs (to be written).
