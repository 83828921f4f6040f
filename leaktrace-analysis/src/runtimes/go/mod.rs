//! Go (checked on Go 1.19, with and without cgo).
//!
//! - Managed: the Go heap (spans, goroutine stacks, the runtime's persistent allocations) is
//!   mapped by the runtime itself: `runtime.sysReserve`/`sysMap`/`sysAlloc` from
//!   `(*mheap).grow`, `persistentalloc`, ... With cgo linked in, `runtime.mmap` calls libc's mmap
//!   through `x_cgo_mmap`; without it, it makes the raw syscall. Either way the nearest named
//!   caller is `x_cgo_mmap` or a `runtime.` function. Go builds with frame pointers, so the
//!   walk reaches the runtime frames.
//! - Native: malloc from C code reached through cgo (`C.CString`, `C.malloc`, a preamble's or a
//!   library's functions). The stack walk crosses cgo's switch to the system stack
//!   (`runtime.asmcgocall`), so the Go callers follow the C frames; for cgo's own malloc
//!   (`C.CString`) the culprit is the Go function that called it ([`is_cgo_bridge`]).
//! - Runtime: malloc by cgo's own C support code (`x_cgo_*`, `_cgo_*` thread start-up), and
//!   thread stacks.
//! - Off-heap: mappings made through package syscall or x/sys/unix (`syscall.Mmap`).
//!
//! leaktrace never places a return probe on a Go function (goroutine stacks move). A statically
//! linked program without cgo has no malloc at all: `discover` then lets the recording go on with
//! the mmap/munmap tracepoints only, which see the Go heap's mappings.

pub mod report;

use super::{MemoryKind, callers, function, is_libc, is_thread_stack};
use crate::recording::{Stack, StackKind};

/// cgo's own C support code.
fn is_cgo_runtime(name: &str) -> bool {
    name.starts_with("x_cgo_")
        || name.starts_with("_cgo_sys_thread")
        || name.starts_with("_cgo_try_pthread")
        || name == "crosscall_amd64"
        || name == "crosscall1"
}

/// cgo's generated bridge between a Go caller and C code: the C side of a call
/// (`_cgo_<hash>_Cfunc_<name>`, which also makes `C.CString`/`C.CBytes`/`C.malloc`'s malloc),
/// the runtime's switch to the system stack (`runtime.cgocall`, `runtime.asmcgocall`) and the
/// Go side (`<pkg>._Cfunc_<name>`, `<pkg>._cgo_cmalloc`). The stack walk crosses the switch
/// (unwind rows of kind `GO_SYSTEMSTACK`), so the Go function that called C follows these.
pub fn is_cgo_bridge(name: &str) -> bool {
    let name = name.strip_suffix(".abi0").unwrap_or(name);
    if name.starts_with("_cgo_") && name.contains("_Cfunc_") {
        return true;
    }
    if matches!(name, "runtime.cgocall" | "runtime.asmcgocall") {
        return true;
    }
    // The Go side: the last path element's function (`main._Cfunc_CString`,
    // `example.com/x/db._cgo_cmalloc`).
    let func = name.rsplit('/').next().unwrap_or(name);
    func.split_once('.').is_some_and(|(_, f)| f.starts_with("_Cfunc_") || f == "_cgo_cmalloc")
}

/// Go's rules (None: the default for the site's kind).
pub fn classify(stack: &Stack) -> Option<MemoryKind> {
    match stack.kind {
        StackKind::Malloc => {
            let f = callers(stack).find(|f| !is_libc(f))?;
            let name = function(f);
            Some(if is_cgo_runtime(name) || name.starts_with("runtime.") {
                MemoryKind::Runtime
            } else {
                MemoryKind::Native
            })
        }
        StackKind::Mmap => {
            for f in callers(stack).filter(|f| !is_libc(f)).take(8) {
                let name = function(f);
                if name.starts_with("syscall.") || name.starts_with("golang.org/x/sys/unix.") {
                    return Some(MemoryKind::OffHeap);
                }
                if name == "x_cgo_mmap" || name.starts_with("runtime.") {
                    return Some(MemoryKind::Managed);
                }
                if is_cgo_runtime(name) {
                    // cgo's support code (thread start-up): judged below.
                    break;
                }
                if is_cgo_bridge(name) {
                    // C code called from Go mapped it (the Go frames beyond are its callers).
                    return None;
                }
            }
            if is_thread_stack(stack) {
                // Threads (Ms) are started by the runtime, through cgo when it is linked in.
                return Some(MemoryKind::Runtime);
            }
            None
        }
        _ => None,
    }
}

/// Go's rules ([`super::RuntimeRules`]).
pub struct Go;

impl super::RuntimeRules for Go {
    fn classify(&self, stack: &Stack) -> Option<MemoryKind> {
        classify(stack)
    }

    fn heap_name(&self) -> &'static str {
        "Go heap"
    }

    fn kind_origin(&self, kind: MemoryKind) -> &'static str {
        match kind {
            MemoryKind::Native => "C code through cgo",
            MemoryKind::OffHeap => "mapping outside the Go heap",
            MemoryKind::Runtime => "Go runtime internals",
            MemoryKind::Managed => "managed heap",
        }
    }

    fn heap_tool(&self) -> &'static str {
        "the heap profile (pprof) shows which allocations"
    }

    fn managed_from_sites(&self) -> &'static str {
        "its sites: Go heap arenas' resident pages"
    }

    /// cgo's own malloc (`C.CString`, `C.CBytes`, `C.malloc`): the Go function that called it,
    /// beyond cgo's bridge ([`is_cgo_bridge`]) and the runtime's stack switch.
    fn bridge_caller(
        &self,
        frames: &[std::sync::Arc<crate::recording::Frame>],
        first: usize,
        nameable: &dyn Fn(&crate::recording::Frame) -> bool,
    ) -> Option<usize> {
        let cgo = |f: &crate::recording::Frame| f.function.as_deref().is_some_and(is_cgo_bridge);
        if !cgo(&frames[first]) {
            return None;
        }
        frames[first..]
            .iter()
            .position(|f| nameable(f) && !cgo(f) && !f.function.as_deref().is_some_and(|n| n.starts_with("runtime.")))
            .map(|j| first + j)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{LIBC, st};
    use super::*;

    const EXE: &str = "/tmp/work";

    #[test]
    fn rules() {
        let heap = st(
            "mmap",
            &[("__GI___mmap64", LIBC), ("x_cgo_mmap", EXE), ("runtime.mmap.func1", EXE), ("runtime.sysMapOS", EXE)],
        );
        assert_eq!(classify(&heap), Some(MemoryKind::Managed));
        let raw = st(
            "mmap",
            &[("runtime/internal/syscall.Syscall6", EXE), ("runtime.mmap", EXE), ("runtime.sysReserveOS", EXE)],
        );
        assert_eq!(classify(&raw), Some(MemoryKind::Managed));
        let user = st(
            "mmap",
            &[
                ("runtime/internal/syscall.Syscall6", EXE),
                ("syscall.Syscall6", EXE),
                ("syscall.mmap", EXE),
                ("syscall.(*mmapper).Mmap", EXE),
            ],
        );
        assert_eq!(classify(&user), Some(MemoryKind::OffHeap));
        let cstring = st("malloc", &[("__GI___libc_malloc", LIBC), ("_cgo_312310ba1568_Cfunc__Cmalloc", EXE)]);
        assert_eq!(classify(&cstring), Some(MemoryKind::Native));
        let strdup = st("malloc", &[("malloc", LIBC), ("__strdup", LIBC), ("keep_name", EXE)]);
        assert_eq!(classify(&strdup), Some(MemoryKind::Native));
        let ts = st("malloc", &[("malloc", LIBC), ("x_cgo_thread_start", EXE)]);
        assert_eq!(classify(&ts), Some(MemoryKind::Runtime));
        let thread = st("mmap", &[("__GI___mmap64", LIBC), ("allocate_stack", LIBC), ("__pthread_create_2_1", LIBC)]);
        assert_eq!(classify(&thread), Some(MemoryKind::Runtime));
        // C code called from Go maps memory: the walk goes on through the stack switch into
        // runtime.cgocall, which must not make it the Go heap's.
        let c_map = st(
            "mmap",
            &[
                ("__GI___mmap64", LIBC),
                ("ring_alloc", EXE),
                ("_cgo_740f8d7732f3_Cfunc_ring_alloc", EXE),
                ("runtime.asmcgocall", EXE),
                ("runtime.cgocall", EXE),
                ("main._Cfunc_ring_alloc", EXE),
                ("main.openRing", EXE),
            ],
        );
        assert_eq!(classify(&c_map), None);
        // A thread's stack, the walk going on through cgo's thread start into the runtime.
        let m_stack = st(
            "mmap",
            &[
                ("__GI___mmap64", LIBC),
                ("allocate_stack", LIBC),
                ("__pthread_create_2_1", LIBC),
                ("_cgo_try_pthread_create", EXE),
                ("_cgo_sys_thread_start", EXE),
                ("runtime.asmcgocall", EXE),
                ("runtime.newm1", EXE),
            ],
        );
        assert_eq!(classify(&m_stack), Some(MemoryKind::Runtime));
    }

    #[test]
    fn cgo_bridge_frames() {
        for name in [
            "_cgo_740f8d7732f3_Cfunc__Cmalloc",
            "runtime.asmcgocall",
            "runtime.asmcgocall.abi0",
            "runtime.cgocall",
            "main._cgo_cmalloc",
            "main._Cfunc_CString",
            "github.com/x/y/db._Cfunc_sqlite3_open.abi0",
        ] {
            assert!(is_cgo_bridge(name), "{name}");
        }
        for name in ["main.lookupRoute", "runtime.mallocgc", "x_cgo_mmap", "_cgo_sys_thread_start", "ring_alloc"] {
            assert!(!is_cgo_bridge(name), "{name}");
        }
    }
}
