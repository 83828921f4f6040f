//! Analysis of a recording (to be written).
