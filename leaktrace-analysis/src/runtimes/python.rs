//! CPython (checked on 3.11: pyenv's shared libpython3.11.so and Debian's /usr/bin/python3.11,
//! whose interpreter is linked into the executable).
//!
//! - Managed: what the interpreter allocates. CPython allocates through its allocator API
//!   (PyObject_Malloc/Calloc/Realloc, PyMem_*): small objects from pymalloc arenas, which
//!   `_PyObject_ArenaMmap` maps (1 MiB each in 3.11), larger ones from malloc called by
//!   `_PyObject_Malloc`, `_PyMem_RawMalloc` and friends. Those wrappers tail-call malloc, so the
//!   direct caller seen is often the interpreter function that called the API (`list_resize`,
//!   `_PyObject_Malloc`): every malloc whose nearest caller is in the interpreter (libpython or
//!   a python executable) is managed.
//! - Native: malloc called from anything else — C extensions, ctypes-loaded libraries, the C
//!   libraries they use. An extension that calls PyMem_Malloc allocates managed memory.
//! - Off-heap: anonymous mappings not made by pymalloc (the mmap module, extensions).
//! - Runtime: the dynamic loader's mappings and allocations (extension modules being loaded).
//!
//! PYTHONMALLOC=malloc (or *_debug) bypasses pymalloc: every object is a malloc call whose caller
//! is still the interpreter, so it stays managed; there are no arenas, and the probe overhead
//! per object is higher. The recorder reports the variable from /proc/PID/environ.

use super::{MemoryKind, callers, first_caller, function, is_loader, object_name};
use crate::recording::{Frame, Stack, StackKind};

/// pymalloc's arena allocator: mappings made here are the Python heap.
const ARENA_FUNCTIONS: &[&str] =
    &["_PyObject_ArenaMmap", "_PyObject_VirtualAlloc", "new_arena", "_PyObject_ArenaMalloc"];

/// CPython's allocator API and its implementation functions: memory allocated through them is
/// the Python heap's (managed), whoever called them.
const PYTHON_ALLOCATOR_API: &[&str] = &[
    "PyObject_Malloc",
    "PyObject_Calloc",
    "PyObject_Realloc",
    "PyMem_Malloc",
    "PyMem_Calloc",
    "PyMem_Realloc",
    "_PyObject_Malloc",
    "_PyObject_Calloc",
    "_PyObject_Realloc",
    "pymalloc_alloc",
    "PyMem_RawMalloc",
    "PyMem_RawCalloc",
    "PyMem_RawRealloc",
    "_PyMem_RawMalloc",
    "_PyMem_RawCalloc",
    "_PyMem_RawRealloc",
];

/// Interpreter functions that allocate objects (their callers' frames in a stripped interpreter
/// are exported names): an arena mapped below them is pymalloc's.
const OBJECT_ALLOCATION: &[&str] = &[
    "PyType_GenericAlloc",
    "_PyObject_GC_New",
    "_PyObject_New",
    "PyObject_Malloc",
    "PyMem_Malloc",
    "PyObject_Calloc",
    "PyMem_Calloc",
    "PyObject_Realloc",
    "PyMem_Realloc",
    "PyUnicode_New",
    "PyBytes_FromStringAndSize",
    "PyTuple_New",
    "PyList_New",
    "PyDict_New",
    "_PyObject_GC_Malloc",
    "PyFloat_FromDouble",
    "PyLong_From",
];

/// The interpreter's object: libpython*.so, or a python executable with the interpreter inside.
fn is_interpreter(f: &Frame) -> bool {
    let o = object_name(f);
    o.starts_with("libpython") || (o.starts_with("python") && !o.contains(".so"))
}

/// Python's rules (None: the default for the site's kind).
pub fn classify(stack: &Stack) -> Option<MemoryKind> {
    match stack.kind {
        StackKind::Mmap => {
            if callers(stack).take(4).any(|f| ARENA_FUNCTIONS.contains(&function(f))) {
                return Some(MemoryKind::Managed);
            }
            // A stripped interpreter (Debian's /usr/bin/python3.11) has no name for its arena
            // function: an anonymous mapping whose nearest caller is the interpreter's own code,
            // below an object allocation, is a pymalloc arena.
            if first_caller(stack).is_some_and(is_interpreter)
                && callers(stack).take(6).any(|f| OBJECT_ALLOCATION.iter().any(|n| function(f).starts_with(n)))
            {
                return Some(MemoryKind::Managed);
            }
            if callers(stack).take(4).any(is_loader) {
                return Some(MemoryKind::Runtime);
            }
            None
        }
        StackKind::Malloc => {
            // Through CPython's allocator API (PyMem_Malloc from an extension, PyObject_Malloc
            // from the interpreter; with --pymalloc it is the probed function itself): managed.
            if stack.frames.iter().take(4).any(|f| PYTHON_ALLOCATOR_API.contains(&function(f))) {
                return Some(MemoryKind::Managed);
            }
            let f = first_caller(stack).or_else(|| callers(stack).next())?;
            if is_loader(f) {
                Some(MemoryKind::Runtime)
            } else if is_interpreter(f) {
                Some(MemoryKind::Managed)
            } else {
                Some(MemoryKind::Native)
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{LIBC, st};
    use super::*;

    const LIBPY: &str = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";

    #[test]
    fn rules() {
        let arena = st("mmap", &[("__GI___mmap64", LIBC), ("_PyObject_ArenaMmap", LIBPY)]);
        assert_eq!(classify(&arena), Some(MemoryKind::Managed));
        // Debian's stripped interpreter: the arena function has no name, its caller does.
        let mut stripped = st(
            "mmap",
            &[("__GI___mmap64", LIBC), ("x", "/usr/bin/python3.11"), ("PyType_GenericAlloc", "/usr/bin/python3.11")],
        );
        std::sync::Arc::make_mut(&mut stripped.frames[1]).function = None;
        assert_eq!(classify(&stripped), Some(MemoryKind::Managed));
        let big = st("malloc", &[("__GI___libc_malloc", LIBC), ("_PyObject_Malloc", LIBPY), ("?", "")]);
        assert_eq!(classify(&big), Some(MemoryKind::Managed));
        let list = st("malloc", &[("__GI___libc_realloc", LIBC), ("list_resize", LIBPY)]);
        assert_eq!(classify(&list), Some(MemoryKind::Managed));
        let static_exe = st("malloc", &[("malloc", LIBC), ("PyMem_RawMalloc", "/usr/bin/python3.11")]);
        assert_eq!(classify(&static_exe), Some(MemoryKind::Managed));
        let ext = st(
            "malloc",
            &[
                ("malloc", LIBC),
                ("parse_record", "/tmp/libcleak.so"),
                ("ffi_call", "/usr/lib/libffi.so.8"),
                ("_ctypes_callproc", LIBPY),
            ],
        );
        assert_eq!(classify(&ext), Some(MemoryKind::Native));
        let loader = st(
            "mmap",
            &[("__mmap64", "/lib64/ld-linux-x86-64.so.2"), ("_dl_map_segments", "/lib64/ld-linux-x86-64.so.2")],
        );
        assert_eq!(classify(&loader), Some(MemoryKind::Runtime));
        let user_map = st(
            "mmap",
            &[("__GI___mmap64", LIBC), ("new_mmap_object", "/x/lib-dynload/mmap.cpython-311-x86_64-linux-gnu.so")],
        );
        assert_eq!(classify(&user_map), None);
        assert_eq!(
            super::super::classify_site(Some(crate::recording::Runtime::Python), &user_map),
            MemoryKind::OffHeap
        );
    }
}
