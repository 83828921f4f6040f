//! leaktrace: an eBPF allocation tracer that answers "is this memory growth a leak, and which
//! call stacks hold it?" for a live process.
//!
//! This crate is the live half: targets, discovery, probes, the recorder and the command line.
//! The data takes one road, and the modules follow it:
//! target → [`discover`] (objects, allocator entry points) → [`probes`] (load the eBPF object,
//! attach uprobes; [`unwind`] tables for the stack walk, with [`btf`] field offsets) → kernel (`leaktrace-ebpf`) → [`record`] (a checkpoint every interval, with
//! [`procinfo`] memory figures and [`symbolize`]d stacks) → [`leaktrace_analysis::recording`] → [`pipeline`] (saved,
//! analysed once, reported).
//! Everything after the recording — `analyze`, `report`, the evaluation of [`check`], `compare`
//! — is in the `leaktrace-analysis` crate, which this crate names by its own name
//! (`leaktrace_analysis::report`), so a path says which crate it is in.
//! [`launch`] starts a command held before exec for `record -- CMD`. What the library has to tell
//! the user goes through one reporter, [`notes`] (the command line installs it): no module
//! prints to stderr itself.
pub mod allocators;
pub mod args;
pub mod bpf_batch;
pub mod btf;
pub mod cgroups;
pub mod check;
pub mod cri;
pub mod discover;
pub mod fuzzing;
/// `record --heap-census`: the runtimes' own heap tools driven from outside.
pub mod holds;
pub mod launch;
pub mod mappings;
pub mod notes;
pub mod objects;
pub mod pipeline;
pub mod placement;
/// `--pod` (Kubernetes pods on this node).
pub mod pod;
pub mod probes;
pub mod procinfo;
/// `--push` to Pyroscope.
pub mod push;
/// `record --reachability`: stop the target briefly and scan it for pointers to blocks.
pub mod reach;
pub mod record;
pub mod runtimes;
pub mod seccomp;
pub mod site_recycle;
/// The live status line.
pub mod status;
pub mod stopping;
pub mod symbolize;
pub mod target_fs;
pub mod tracepoints;
pub mod unwind;
pub mod uprobe_multi;
// `leaktrace watch`, the node agent.
pub mod watch;
