//! Unit tests of the analysis: synthetic recordings with known truth.

use super::fixtures::*;
use super::*;
use crate::recording::{Frame, Recording, Runtime, Stack, StackKind};
use crate::report::verdict::sentence;
use crate::runtimes::MemoryKind;

mod classes;
mod culprit;
mod escalation;
mod headline;
mod lifetime;
mod losses;
mod managed;
mod memory;
mod spikes;

fn site(a: &Analysis, id: u32) -> &SiteAnalysis {
    a.sites.iter().find(|s| s.id == id).expect("site")
}

/// The dynamic loader's mapping of a library's .bss at start: 1 MiB, never unmapped.
fn loader_site() -> (Stack, SiteFn) {
    const LD: &str = "/lib64/ld-linux-x86-64.so.2";
    let stack = Stack {
        id: 9,
        kind: StackKind::Mmap,
        frames: vec![
            frame("__mmap64", LD, None).into(),
            frame("_dl_map_segments", LD, None).into(),
            frame("_dl_map_object", LD, None).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    (stack, Box::new(|_| (1 << 20, 1, 0, 0)))
}

/// A stack of `function` called from main, in the fixture's executable.
fn user_stack(id: u32, function: &str) -> Stack {
    let mut stack = server_stack(id, function);
    stack.frames.push(frame("main", "/opt/server/bin/server", Some(("/build/src/main.c", 3))).into());
    stack
}

/// A site in `exe` called by `function`, frames innermost first: `inner` (in libc) then the
/// caller and main.
fn stack_of(id: u32, kind: StackKind, inner: &[&str], function: &str) -> Stack {
    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
    const EXE: &str = "/opt/server/bin/server";
    let mut frames: Vec<std::sync::Arc<Frame>> = inner.iter().map(|f| frame(f, LIBC, None).into()).collect();
    frames.push(frame(function, EXE, None).into());
    frames.push(frame("main", EXE, None).into());
    Stack { id, kind, frames, lost: false, truncated: None, shared: false }
}
