//! The modes fixture (tests/fixtures/modes.c).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::*;

/// `modes WORKLOAD N` (tests/fixtures/modes.c: sites, pairs, realloc, grow), compiled on first
/// use (gcc -O1 -g -fno-omit-frame-pointer), once per run ([`built_once`]).
pub fn modes_fixture() -> &'static Path {
    static MODES: OnceLock<PathBuf> = OnceLock::new();
    MODES.get_or_init(|| {
        built_once("fixtures-modes", |d| compile("gcc", &fixture_source("modes.c"), &d.join("modes"))).join("modes")
    })
}

/// Record `modes WORKLOAD N` launched under leaktrace with `extra` options; asserts it ran to
/// its end.
pub fn record_modes(name: &str, extra: &[&str], workload: &str, n: u64) -> (OutDir, Output) {
    let out = OutDir::new(name);
    let mut target = Command::new(modes_fixture());
    target.args([workload, &n.to_string()]);
    let o = record_launch(&out, extra, target);
    o.assert_success();
    assert!(
        o.stdout.contains(&format!("done {workload} {n}")),
        "modes {workload} {n} did not run to its end\n{}",
        o.describe()
    );
    (out, o)
}
