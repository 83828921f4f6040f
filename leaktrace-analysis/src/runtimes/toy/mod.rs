//! A toy runtime that exists only in this crate's unit tests: what adding a runtime takes on the
//! analysis side, done (docs/ARCHITECTURE.md, "Adding a runtime"). Its interpreter is a library
//! `libtoy.so` whose heap is mapped by `toy_heap_grow`; its allocations through `toy_alloc` are
//! its own bookkeeping. It is registered by `#[cfg(test)]` lines only: `pub mod toy;` and one
//! arm of `rules` in runtimes/mod.rs, and its `Runtime` variant in recording.rs.

use super::{MemoryKind, RuntimeRules, callers, function};
use crate::recording::{Stack, StackKind};

/// The toy runtime's rules.
pub struct Toy;

impl RuntimeRules for Toy {
    fn classify(&self, stack: &Stack) -> Option<MemoryKind> {
        let f = callers(stack).find(|f| function(f).starts_with("toy_"))?;
        Some(match (stack.kind, function(f)) {
            (StackKind::Mmap, "toy_heap_grow") => MemoryKind::Managed,
            _ => MemoryKind::Runtime,
        })
    }

    fn heap_name(&self) -> &'static str {
        "toy heap"
    }

    fn kind_origin(&self, kind: MemoryKind) -> &'static str {
        match kind {
            MemoryKind::Managed => "toy objects",
            MemoryKind::Runtime => "the toy interpreter",
            MemoryKind::Native | MemoryKind::OffHeap => "native code",
        }
    }

    fn heap_tool(&self) -> &'static str {
        "toy-heapdump"
    }

    fn managed_from_sites(&self) -> &'static str {
        "its sites: toy heap pages mapped"
    }

    fn is_program_code_frame(&self, f: &crate::recording::Frame) -> bool {
        f.function.as_deref().is_some_and(|n| n.starts_with("toy:"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{Frame, Runtime};
    use std::sync::Arc;

    fn stack(kind: StackKind, names: &[&str]) -> Stack {
        let frames = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                Arc::new(Frame {
                    addr: 0x1000 + i as u64,
                    object: Some("/opt/toy/libtoy.so".into()),
                    function: Some((*n).into()),
                    ..Frame::default()
                })
            })
            .collect();
        Stack { id: 1, kind, frames, lost: false, truncated: None, shared: false }
    }

    #[test]
    fn a_runtime_registered_by_its_folder_and_lines_is_read_everywhere_the_runtimes_are() {
        // Its name in recording.json and the reports.
        assert!(Runtime::ALL.contains(&Runtime::Toy));
        assert_eq!(serde_json::to_string(&Runtime::Toy).unwrap(), "\"toy\"");
        assert_eq!(serde_json::from_str::<Runtime>("\"toy\"").unwrap(), Runtime::Toy);
        // Its rules, found by runtime and among every runtime's.
        assert_eq!(super::super::rules(Runtime::Toy).heap_name(), "toy heap");
        assert!(super::super::all().any(|r| r.heap_tool() == "toy-heapdump"));
        // Site classification for a target detected to run it.
        let grow = stack(StackKind::Mmap, &["mmap", "toy_heap_grow", "toy_eval"]);
        assert_eq!(super::super::classify_site(Some(Runtime::Toy), &grow), MemoryKind::Managed);
        let own = stack(StackKind::Malloc, &["malloc", "toy_alloc", "toy_eval"]);
        assert_eq!(super::super::classify_site(Some(Runtime::Toy), &own), MemoryKind::Runtime);
        // Another runtime's target: the toy's rules are not applied.
        assert_eq!(super::super::classify_site(Some(Runtime::Go), &grow), MemoryKind::OffHeap);
        // The culprit rules read every runtime's: a frame of the program's toy code is named.
        assert!(
            super::super::all()
                .any(|r| r.is_program_code_frame(&Frame { function: Some("toy:handler".into()), ..Frame::default() }))
        );
    }
}
