//! leaktrace's kernel side: uprobes on the target's allocator entry points.
//!
//! Data path (all keyed by the host tgid, so one loaded object can serve several targets):
//! entry probe → `INFLIGHT` (arguments and call stack, one per thread) → return probe →
//! `BLOCKS` (one slot per outstanding block; `ALLOCS` when its bucket is full) and `SITE_STATS`
//! (per call-stack totals, by the site's index in `SITES`). `free` finds the block there and
//! credits its site by that index. Every loss increments a slot of `COUNTERS` (see `leaktrace_common::counter`). No
//! per-event ring-buffer traffic: the agent reads `SITES`, `SITE_STATS`, `STACKS` and `COUNTERS`
//! at each checkpoint.
// Built for the bpf target by leaktrace/build.rs (aya-build). A host build (`cargo test
// --workspace`) compiles an empty binary.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Atomic adds on map values (BPF_ATOMIC_ADD): the bpf target has no compare-and-swap, so
// `AtomicU64::fetch_add` is not offered; the intrinsic lowers to the BPF instruction directly.
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
mod forks;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod probes;
#[cfg(target_arch = "bpf")]
mod python;
#[cfg(target_arch = "bpf")]
mod unwind;
#[cfg(target_arch = "bpf")]
mod unwind_rule;
