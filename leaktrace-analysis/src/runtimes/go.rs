//! Go (checked on Go 1.19, with and without cgo).
//!
//! - Managed: the Go heap (spans, goroutine stacks, the runtime's persistent allocations) is
//!   mapped by the runtime itself: `runtime.sysReserve`/`sysMap`/`sysAlloc` from
//!   `(*mheap).grow`, `persistentalloc`, ... With cgo linked in, `runtime.mmap` calls libc's mmap
//!   through `x_cgo_mmap`; without it, it makes the raw syscall. Either way the nearest named
//!   caller is `x_cgo_mmap` or a `runtime.` function. Go builds with frame pointers, so the
//!   walk reaches the runtime frames.
//! - Native: malloc from C code reached through cgo (`C.CString`, `C.malloc`, a preamble's or a
//!   library's functions). Its direct caller is the cgo wrapper or the C function; the Go caller
//!   beyond the cgo stack switch is not visible.
//! - Runtime: malloc by cgo's own C support code (`x_cgo_*`, `_cgo_*` thread start-up), and
//!   thread stacks.
//! - Off-heap: mappings made through package syscall or x/sys/unix (`syscall.Mmap`).
//!
//! leaktrace never places a return probe on a Go function (goroutine stacks move). A statically
//! linked program without cgo has no malloc at all: `discover` then lets the recording go on with
//! the mmap/munmap tracepoints only, which see the Go heap's mappings.

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
    }
}
