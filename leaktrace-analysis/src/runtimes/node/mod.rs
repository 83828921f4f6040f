//! Node.js (checked on Node 20 / V8 11.3; the node executable has symbols and frame pointers).
//!
//! - Managed: the V8 heap. V8 maps its pages itself (`v8::base::OS::Allocate` from
//!   `v8::internal::MemoryAllocator`, the code range, cppgc): every mapping whose nearest named
//!   frame is V8's (`v8::`, `cppgc::`, `heap::`).
//! - Off-heap ("external" memory in V8's terms): ArrayBuffer and Buffer backing stores, allocated
//!   by node's ArrayBufferAllocator (`node::NodeArrayBufferAllocator::Allocate` → calloc/malloc
//!   from `v8::internal::BackingStore::Allocate`), and `node::Buffer` copies.
//! - Runtime: any other malloc from the node executable (V8's and node's own C++ objects, libuv,
//!   OpenSSL, ICU, all linked in), and thread stacks.
//! - Native: malloc from addons (`*.node`) and the libraries they load, and malloc by node inside
//!   an N-API function (`napi_*`) called by an addon.

use super::{MemoryKind, callers, function, is_libc, is_thread_stack, object_name};
use crate::recording::{Frame, Stack, StackKind};

/// The node executable or a shared libnode.
pub fn is_node_object(name: &str) -> bool {
    name == "node" || name == "nodejs" || name.starts_with("libnode.so")
}

/// C/C++ support libraries whose frames say nothing about who allocates.
fn is_support_library(f: &Frame) -> bool {
    let o = object_name(f);
    is_libc(f) || o.starts_with("libstdc++") || o.starts_with("libgcc_s") || o.starts_with("libc++")
}

fn is_backing_store(name: &str) -> bool {
    name.contains("ArrayBufferAllocator")
        || name.starts_with("v8::internal::BackingStore::")
        || name.starts_with("node::Buffer::")
}

/// True for a mapping of V8's young generation: a stack through `v8::internal::SemiSpace`,
/// `NewSpace` or `PagedNewSpace` code. Its size is bounded by `--max-semi-space-size` (16 MiB
/// per semi-space by default on 64-bit) and changes with allocation pressure.
pub fn is_young_generation(stack: &Stack) -> bool {
    stack.kind == StackKind::Mmap
        && stack.frames.iter().take(16).any(|f| {
            let n = function(f);
            ["v8::internal::SemiSpace", "v8::internal::NewSpace", "v8::internal::PagedNewSpace"]
                .iter()
                .any(|p| n.starts_with(p))
        })
}

/// True for a frame of V8's garbage collector (`Heap::CollectGarbage`, the scavenger, the
/// mark-compact collector): a page it maps (a semi-space grown, old-space pages for the objects
/// it promotes) holds whatever survived, not what the JavaScript function below it (the one whose
/// allocation triggered the collection) allocated.
pub fn is_collector_frame(name: &str) -> bool {
    const COLLECTOR: &[&str] = &[
        "v8::internal::Heap::CollectGarbage",
        "v8::internal::Heap::CollectAllGarbage",
        "v8::internal::Heap::PerformGarbageCollection",
        "v8::internal::Heap::Scavenge",
        "v8::internal::Heap::MarkCompact",
        "v8::internal::Scavenger",
        "v8::internal::MarkCompactCollector",
        "v8::internal::MinorMarkCompactCollector",
        "v8::internal::MinorMarkSweepCollector",
    ];
    // A template's name starts with its return type ("heap::base::SlotCallbackResult
    // v8::internal::Scavenger::ScavengeObject<...>").
    let n = match name.split_once(' ') {
        Some((ret, rest)) if !ret.contains('(') && !ret.contains('<') => rest,
        _ => name,
    };
    COLLECTOR.iter().any(|p| n.starts_with(p) || name.starts_with(p))
}

/// Node's rules (None: the default for the site's kind).
pub fn classify(stack: &Stack) -> Option<MemoryKind> {
    match stack.kind {
        StackKind::Malloc => {
            if callers(stack).take(6).any(|f| is_backing_store(function(f))) {
                return Some(MemoryKind::OffHeap);
            }
            if super::native_interface_caller(&stack.frames).is_some() {
                // An addon's memory allocated by node inside an N-API function (napi_*).
                return Some(MemoryKind::Native);
            }
            let f = callers(stack).find(|f| !is_support_library(f))?;
            Some(if is_node_object(object_name(f)) { MemoryKind::Runtime } else { MemoryKind::Native })
        }
        StackKind::Mmap => {
            // Frame 0 counts here: V8's page allocator makes the raw syscall itself.
            for f in stack.frames.iter().filter(|f| !is_libc(f)).take(8) {
                let name = function(f);
                if is_backing_store(name) {
                    return Some(MemoryKind::OffHeap);
                }
                if name.starts_with("v8::") || name.starts_with("cppgc::") || name.starts_with("heap::") {
                    return Some(MemoryKind::Managed);
                }
            }
            if is_thread_stack(stack) {
                return Some(MemoryKind::Runtime);
            }
            None
        }
        _ => None,
    }
}

/// Node's and V8's rules ([`super::RuntimeRules`]).
pub struct Node;

impl super::RuntimeRules for Node {
    fn classify(&self, stack: &Stack) -> Option<MemoryKind> {
        classify(stack)
    }

    /// V8's per-page bookkeeping: a stack through `v8::internal::MemoryAllocator::AllocatePage`
    /// (e.g. the per-page free-list categories).
    fn follows_managed_heap(&self, frames: &[std::sync::Arc<Frame>]) -> bool {
        frames.iter().take(16).any(|f| function(f).starts_with("v8::internal::MemoryAllocator::AllocatePage"))
    }

    fn heap_name(&self) -> &'static str {
        "V8 heap"
    }

    fn kind_origin(&self, kind: MemoryKind) -> &'static str {
        match kind {
            MemoryKind::Native => "native addon",
            MemoryKind::OffHeap => "ArrayBuffer/Buffer backing stores",
            MemoryKind::Runtime => "V8/Node internals",
            MemoryKind::Managed => "managed heap",
        }
    }

    fn heap_tool(&self) -> &'static str {
        "a heap snapshot (--heapsnapshot-signal or the inspector) shows which objects"
    }

    fn managed_from_sites(&self) -> &'static str {
        "its sites: V8 heap pages resident"
    }

    /// A JIT frame named from V8's perf map (`JS:*step /srv/app.js:10:14`,
    /// `LazyCompile:~handler /srv/app.js:3`) whose code is the program's, not Node's own library
    /// (`node:internal/...`, `node:buffer`).
    fn is_program_code_frame(&self, f: &Frame) -> bool {
        if f.object.is_some() {
            return false;
        }
        let Some((kind, rest)) = f.function.as_deref().and_then(|n| n.split_once(':')) else { return false };
        let location = rest.split_once(' ').map(|(_, loc)| loc).unwrap_or("");
        matches!(kind, "JS" | "LazyCompile" | "Function" | "InterpretedFunction")
            && !location.is_empty()
            && !location.starts_with("node:")
    }

    /// A frame of V8's garbage collector ([`is_collector_frame`]).
    fn is_collector_frame(&self, f: &Frame) -> bool {
        f.function.as_deref().is_some_and(is_collector_frame)
    }
}

/// A JIT frame's name with V8's tier left out: `JS:*step /srv/app.js:10:14`,
/// `LazyCompile:~step /srv/app.js:10:14` and `JS:^step ...` all read `JS:step /srv/app.js:10:14`.
/// Other names (HotSpot's, V8's builtins and stubs) are returned as they are.
pub fn jit_name(name: &str) -> String {
    if let Some((kind, rest)) = name.split_once(':')
        && matches!(kind, "JS" | "LazyCompile" | "Function" | "InterpretedFunction")
    {
        let rest = rest.strip_prefix(['*', '~', '^', '+']).unwrap_or(rest);
        return format!("JS:{rest}");
    }
    name.to_string()
}
#[cfg(test)]
mod tests {
    use super::super::tests::{LIBC, st};
    use super::*;

    const NODE: &str = "/usr/bin/node";

    #[test]
    fn rules() {
        let page = st(
            "mmap",
            &[
                ("__GI___mmap64", LIBC),
                ("v8::base::OS::Allocate(void*, unsigned long, unsigned long, v8::base::OS::MemoryPermission)", NODE),
                ("v8::internal::MemoryAllocator::AllocatePage", NODE),
            ],
        );
        assert_eq!(classify(&page), Some(MemoryKind::Managed));
        let raw = st(
            "mmap",
            &[("v8::base::OS::Allocate(void*, unsigned long, unsigned long, v8::base::OS::MemoryPermission)", NODE)],
        );
        assert_eq!(classify(&raw), Some(MemoryKind::Managed));
        let store = st(
            "malloc",
            &[
                ("__libc_calloc", LIBC),
                ("node::NodeArrayBufferAllocator::Allocate(unsigned long)", NODE),
                ("v8::internal::Heap::AllocateExternalBackingStore", NODE),
                ("v8::internal::BackingStore::Allocate", NODE),
            ],
        );
        assert_eq!(classify(&store), Some(MemoryKind::OffHeap));
        let obj = st(
            "malloc",
            &[
                ("malloc", LIBC),
                ("operator new(unsigned long)", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"),
                ("v8::internal::(anonymous namespace)::ConstructBuffer", NODE),
            ],
        );
        assert_eq!(classify(&obj), Some(MemoryKind::Runtime));
        let addon = st("malloc", &[("malloc", LIBC), ("Decode", "/app/build/Release/codec.node")]);
        assert_eq!(classify(&addon), Some(MemoryKind::Native));
        let thread = st("mmap", &[("__GI___mmap64", LIBC), ("allocate_stack", LIBC), ("__pthread_create_2_1", LIBC)]);
        assert_eq!(classify(&thread), Some(MemoryKind::Runtime));
    }

    #[test]
    fn collector_frames() {
        assert!(is_collector_frame(
            "v8::internal::Heap::CollectGarbage(v8::internal::AllocationSpace, v8::internal::GarbageCollectionReason, v8::GCCallbackFlags)"
        ));
        assert!(is_collector_frame(
            "heap::base::SlotCallbackResult v8::internal::Scavenger::ScavengeObject<v8::internal::FullHeapObjectSlot>(v8::internal::FullHeapObjectSlot, v8::internal::HeapObject)"
        ));
        assert!(!is_collector_frame("v8::internal::NewLargeObjectSpace::AllocateRaw(int)"));
        assert!(!is_collector_frame(
            "v8::internal::Factory::AllocateRaw(int, v8::internal::AllocationType, v8::internal::AllocationAlignment)"
        ));
    }
}
