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

use std::path::Path;

use object::{Object as _, ObjectSection as _};

use super::{MemoryKind, RuntimeInfo, callers, function, is_libc, is_thread_stack};
use crate::discover::MappedObject;
use crate::recording::Stack;

/// The Go toolchain version that built `path` ("go1.19.8"), or Some(None) for a Go binary whose
/// version cannot be read; None when `path` is not a Go binary.
pub fn go_binary_version(path: &Path) -> Option<Option<String>> {
    // Read lazily: only the headers and, for Go binaries, one small section are read.
    let cache = object::read::ReadCache::new(std::fs::File::open(path).ok()?);
    let file = object::File::parse(&cache).ok()?;
    let is_go = file.section_by_name(".go.buildinfo").is_some() || file.section_by_name(".gopclntab").is_some();
    if !is_go {
        return None;
    }
    let version = file.section_by_name(".go.buildinfo").and_then(|s| s.data().ok()).and_then(buildinfo_version);
    Some(version)
}

/// True when `path` is an executable built by the Go toolchain.
pub fn is_go_binary(path: &Path) -> bool {
    go_binary_version(path).is_some()
}

/// The version string of a `.go.buildinfo` section (Go 1.18+: "\xff Go buildinf:", pointer
/// size, flags; with flag 2 the version follows at offset 32 as a varint-prefixed string).
fn buildinfo_version(d: &[u8]) -> Option<String> {
    if d.len() < 33 || &d[..14] != b"\xff Go buildinf:" || d[15] & 2 == 0 {
        return None;
    }
    let (mut len, mut shift, mut i) = (0usize, 0, 32);
    loop {
        let b = *d.get(i)?;
        len |= ((b & 0x7f) as usize) << shift;
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
    let v = d.get(i..i + len)?;
    Some(String::from_utf8_lossy(v).into_owned())
}

/// Detect Go: the executable (the first mapped object) was built by the Go toolchain.
pub fn detect(_pid: u32, objects: &[MappedObject]) -> Option<RuntimeInfo> {
    let exe = objects.first()?;
    let version = go_binary_version(&exe.open_path)?;
    Some(RuntimeInfo {
        name: "go".into(),
        version: version.map(|v| v.trim_start_matches("go").to_string()),
        notes: vec![format!(
            "Go runtime detected ({}): managed = the Go heap's mappings (resident bytes); native = \
             malloc from C code called through cgo",
            exe.path.display()
        )],
    })
}

/// cgo's own C support code.
fn is_cgo_runtime(name: &str) -> bool {
    name.starts_with("x_cgo_") || name.starts_with("_cgo_sys_thread") || name.starts_with("_cgo_try_pthread") || name == "crosscall_amd64" || name == "crosscall1"
}

/// Go's rules (None: the default for the site's kind).
pub fn classify(stack: &Stack) -> Option<MemoryKind> {
    match stack.kind.as_str() {
        "malloc" => {
            let f = callers(stack).find(|f| !is_libc(f))?;
            let name = function(f);
            Some(if is_cgo_runtime(name) || name.starts_with("runtime.") { MemoryKind::Runtime } else { MemoryKind::Native })
        }
        "mmap" => {
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
        let heap = st("mmap", &[("__GI___mmap64", LIBC), ("x_cgo_mmap", EXE), ("runtime.mmap.func1", EXE), ("runtime.sysMapOS", EXE)]);
        assert_eq!(classify(&heap), Some(MemoryKind::Managed));
        let raw = st("mmap", &[("runtime/internal/syscall.Syscall6", EXE), ("runtime.mmap", EXE), ("runtime.sysReserveOS", EXE)]);
        assert_eq!(classify(&raw), Some(MemoryKind::Managed));
        let user = st("mmap", &[("runtime/internal/syscall.Syscall6", EXE), ("syscall.Syscall6", EXE), ("syscall.mmap", EXE), ("syscall.(*mmapper).Mmap", EXE)]);
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

    #[test]
    fn buildinfo() {
        let mut d = b"\xff Go buildinf:".to_vec();
        d.extend_from_slice(&[8, 2]);
        d.resize(32, 0);
        d.push(8);
        d.extend_from_slice(b"go1.19.8");
        d.extend_from_slice(&[0; 8]);
        assert_eq!(buildinfo_version(&d).as_deref(), Some("go1.19.8"));
        d[15] = 0;
        assert_eq!(buildinfo_version(&d), None);
        assert_eq!(buildinfo_version(b"short"), None);
    }
}
