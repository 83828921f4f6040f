//! Harness of leaktrace's end-to-end tests: the real `leaktrace` binary traces real programs
//! (the fixtures in `tests/fixtures/`, compiled here) with real eBPF, as root, and the tests
//! assert on the numbers and names of its `report.json`.
//!
//! - [`leaktrace_bin`]: the binary under test (`LEAKTRACE_BIN`, else next to the test binary's
//!   target directory). `cargo xtask test` builds it and sets `LEAKTRACE_BIN`.
//! - [`fixtures`]: the fixtures, compiled once per run ([`built_once`]: `cargo xtask test` hands
//!   its test processes one directory in `LEAKTRACE_TEST_FIXTURES`).
//! - [`Running`] / [`run`]: a leaktrace process with a timeout; on timeout it is killed (with its
//!   process group) and the test fails showing leaktrace's stderr.
//! - [`Target`]: a fixture started by the test (attach mode), killed when dropped.
//! - [`Report`]: `report.json`, with lookups of sites by culprit function.
//! - [`assert_leaky_report`]: the checks every `leaky` recording must pass.
//!
//! One file per job: `machine.rs` (the binary under test, root), `tempdir.rs` (temporary
//! directories), `fixture.rs` (compiling the fixtures), `running.rs` (running leaktrace),
//! `target.rs` (a target started by the test), `report.rs` (report.json and its checks),
//! `modes.rs` (the modes fixture), `cgroup.rs` (a memory cgroup with a limit), `containerd.rs`, `cri.rs` and `cni.rs` (a private containerd, images made from files, pods made through the CRI, a CNI bridge for pods with their own network), `kubetree.rs` (kubelet-style pod cgroups), `http.rs` (GETs on the loopback), `pprof.rs` (`go tool pprof`), `pushserver.rs` (a profile store on the loopback for the `--push` tests), `production.rs` (production attach: other compilers and
//! libraries, C++ names, processes, cgroups, eBPF programs).
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]

use std::time::Duration;

pub use serde_json::Value;

/// Bytes leaked per iteration by every leak function of the fixtures.
pub const LEAK_BYTES: u64 = 1000;
/// Capacity of `cache_put`'s cache in `leaky.c`: 64 slots of 512 bytes.
pub const CACHE_SLOTS: u64 = 64;
pub const CACHE_CAPACITY_BYTES: u64 = CACHE_SLOTS * 512;
/// Size of `temp_work`'s temporary block in `leaky.c`.
pub const TEMP_BYTES: u64 = 4096;
/// Longest a leaktrace run may take before the test kills it and fails. Generous: on a loaded
/// 2-core machine (load average 8) loading the eBPF object and attaching alone took 40-50 s.
pub const TIMEOUT: Duration = Duration::from_secs(180);
/// The nine files a recording directory holds.
pub const OUTPUT_FILES: &[&str] = &[
    "recording.json",
    "report.json",
    "report.md",
    "live.svg",
    "growth.svg",
    "stacks.folded",
    "memory.svg",
    "profile.pb.gz",
    "growth.pb.gz",
];

mod cgroup;
mod cni;
mod containerd;
mod cri;
mod fixture;
mod http;
mod kubetree;
mod machine;
mod modes;
mod pprof;
mod production;
pub mod pushserver;
mod report;
mod running;
/// The managed-runtime tests' shared helpers (`use leaktrace_tests::runtimes::*`).
pub mod runtimes;
mod target;
mod tempdir;

pub use cgroup::*;
pub use cni::*;
pub use containerd::*;
pub use cri::*;
pub use fixture::*;
pub use http::*;
pub use kubetree::*;
pub use machine::*;
pub use modes::*;
pub use pprof::*;
pub use production::*;
pub use report::*;
pub use running::*;
pub use target::*;
pub use tempdir::*;
