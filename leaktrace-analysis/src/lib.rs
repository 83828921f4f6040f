//! leaktrace-analysis: everything after the recording, as pure functions of it. No eBPF, no
//! root, no /proc: `leaktrace report DIR` and `leaktrace compare` run here, offline, and the
//! compiler checks that the analysis reads nothing but the [`recording::Recording`].
//!
//! The rooms, in the order the data goes through them:
//! [`recording`] (the model of recording.json, the seam with the recorder; [`merge`] folds the
//! stacks of recompiled JIT code into one site) → [`timeline`] (its
//! checkpoints sorted once and replayed into per-site series) → [`analyze`] (growth
//! per site and per process, classes, the verdict), with [`runtimes`] (which memory a stack holds
//! in a managed runtime) and [`allocator_frames`] (which frames are the allocator's) →
//! [`report`] (report.md, report.json, flame graphs, memory plot, byte formatting) →
//! [`check`] (the growth test's evaluation) and [`compare`] (before/after). [`human`] formats
//! bytes, rates and numbers for all of them (a leaf); [`output`] writes files atomically.
//! Nothing here prints to stderr: what the user reads, the callers print.
pub mod allocator_frames;
pub mod analyze;
pub mod check;
pub mod compare;
/// One heap graph across languages: dominators and retained bytes.
pub mod dominators;
pub mod frame_origin;
/// `record --heap-census`: the JVM's class histograms, Go's goroutines.
pub mod holds;
#[cfg(test)]
mod hostile_tests;
pub mod human;
pub mod merge;
pub mod output;
/// `record --reachability`: lost vs still-referenced blocks, retaining chains.
pub mod reachability;
pub mod recording;
pub mod recording_file;
pub mod report;
pub mod retain;
pub mod runtimes;
pub mod system_libs;
pub mod timeline;
