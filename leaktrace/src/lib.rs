//! leaktrace: an eBPF allocation tracer that answers "is this memory growth a leak, and which
//! call stacks hold it?" for a live process.
//!
//! The data takes one road, and the modules follow it:
//! target → [`discover`] (objects, allocator entry points) → [`probes`] (load the eBPF object,
//! attach uprobes; [`unwind`] tables for the stack walk, [`btf`] offsets) → kernel (`leaktrace-ebpf`) → [`record`] (a checkpoint every interval, with
//! [`procinfo`] memory figures and [`symbolize`]d stacks) → [`recording`] (saved, replayable) →
//! [`analyze`] (growth per site and per process) → [`report`] (report.md, report.json, flame
//! graphs). [`launch`] starts a command held before exec for `record -- CMD`.
pub mod allocators;
pub mod analyze;
pub mod btf;
pub mod check;
pub mod compare;
pub mod discover;
pub mod launch;
pub mod mappings;
pub mod output;
pub mod placement;
pub mod probes;
pub mod procinfo;
pub mod record;
pub mod recording;
pub mod report;
pub mod runtimes;
pub mod symbolize;
pub mod unwind;
