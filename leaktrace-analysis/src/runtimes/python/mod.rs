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

pub mod compare;
pub mod heap;
pub mod report;

use super::{MemoryKind, callers, first_caller, function, is_libc, is_loader, object_name};
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

/// The entry of CPython's object allocator: a recording whose probes hold it hooked the
/// allocator's API (`--pymalloc`).
pub const PYMALLOC_ENTRY: &str = "PyObject_Malloc";

/// Whether a probe on `function` hooks CPython's object allocator (`--pymalloc`).
pub fn is_pymalloc_probe(function: &str) -> bool {
    function.starts_with("PyObject_")
}

/// True for a CPython extension module's object: one the recorder saw export a `PyInit_*`
/// function (`exporters`: their paths, from [`crate::recording::ObjectMapping::python_extension`]),
/// one named as the interpreter names extension modules (`NAME.cpython-311-x86_64-linux-gnu.so`,
/// `NAME.abi3.so`), or a `.so` installed where extension modules live (`site-packages`,
/// `dist-packages`, `lib-dynload`) other than the shared libraries wheels bundle beside them
/// (`numpy.libs/libopenblas*.so`). System libraries (libc, libffi, libssl) are none of these.
pub fn is_extension_object(path: &str, exporters: &std::collections::HashSet<String>) -> bool {
    if exporters.contains(path) {
        return true;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext_name = name.ends_with(".abi3.so")
        || name.split_once(".cpython-").is_some_and(|(stem, rest)| !stem.is_empty() && rest.ends_with(".so"));
    let mut dirs = path.split('/').rev().skip(1);
    let in_packages = path.split('/').any(|d| matches!(d, "site-packages" | "dist-packages" | "lib-dynload"))
        && name.contains(".so")
        && !dirs.next().is_some_and(|d| d.ends_with(".libs"));
    ext_name || in_packages
}

/// libffi, through which ctypes calls a C function.
fn is_libffi(f: &Frame) -> bool {
    object_name(f).starts_with("libffi") || function(f).starts_with("ffi_call")
}

/// Where a Python target's native (malloc from native code) memory comes from, in words, from
/// its stack (`frames`, innermost first), walked outwards until the first Python frame or
/// interpreter frame:
/// - a C extension's frame ([`is_extension_object`]) is met first: "C extension" (also when the
///   extension called a library that allocated);
/// - libffi's frame is met first: a library called through ctypes, named by the object of the
///   last frame before libffi (the function ctypes called): "libc.so.6 via ctypes" ("via cffi"
///   when cffi's `_cffi_backend` made the call, "via libffi" when the caller is unknown);
/// - neither: the nearest object outside libc and the loader, "native library libfoo.so"; else
///   the nearest object at all ("libc.so.6"); else "native code".
pub fn native_origin(frames: &[std::sync::Arc<Frame>], exporters: &std::collections::HashSet<String>) -> String {
    let mut called: Option<&str> = None;
    for (i, f) in frames.iter().enumerate().take(64) {
        if f.kind == crate::recording::FrameKind::Python || is_interpreter(f) {
            break;
        }
        if is_libffi(f) {
            // Whose libffi call: ctypes' (_ctypes), cffi's (_cffi_backend), else unknown.
            // (_ctypes may be built into the interpreter: known by its functions then.)
            let caller =
                frames[i..].iter().find(|f| !is_libffi(f) && (!object_name(f).is_empty() || !function(f).is_empty()));
            let ctypes_fn = ["_call_function_pointer", "_ctypes_callproc", "PyCFuncPtr_call"];
            let via = match caller {
                Some(f) if object_name(f).starts_with("_ctypes") || ctypes_fn.contains(&function(f)) => "ctypes",
                Some(f) if object_name(f).starts_with("_cffi_backend") => "cffi",
                _ => "libffi",
            };
            return format!("{} via {via}", called.unwrap_or("a library"));
        }
        if f.object.as_deref().is_some_and(|o| is_extension_object(o, exporters)) {
            return "C extension".to_string();
        }
        if !object_name(f).is_empty() {
            called = Some(object_name(f));
        }
    }
    let named =
        |f: &&std::sync::Arc<Frame>| f.kind == crate::recording::FrameKind::Native && !object_name(f).is_empty();
    if let Some(f) = frames.iter().filter(named).find(|f| !is_libc(f) && !is_interpreter(f)) {
        return format!("native library {}", object_name(f));
    }
    frames.iter().find(named).map_or_else(|| "native code".to_string(), |f| object_name(f).to_string())
}

/// An anonymous mapping made by pymalloc in an interpreter whose arena function has no name:
/// the nearest caller outside libc is the interpreter's code, and one of the nearest frames is an
/// object allocation or the allocator API in the interpreter (`PyMem_Malloc` called by an
/// extension, `PyType_GenericAlloc`), with only the interpreter's frames between. An extension's
/// own mapping (its object is the nearest caller) is not one, nor one the interpreter's code
/// makes outside the allocator (no allocator frame among the nearest).
fn arena_below_allocator(stack: &Stack) -> bool {
    if !first_caller(stack).is_some_and(is_interpreter) {
        return false;
    }
    let skip = if stack.lost { 0 } else { 1 };
    for f in stack.frames.iter().skip(skip).take(8) {
        if is_libc(f) {
            continue;
        }
        if !is_interpreter(f) {
            // Code outside the interpreter below any allocator frame: not pymalloc's mapping.
            return false;
        }
        if OBJECT_ALLOCATION.iter().any(|n| function(f).starts_with(n)) {
            return true;
        }
    }
    false
}

/// Where a mapping was made: its nearest caller outside libc, when that is an unnamed frame of
/// the interpreter (object and file offset, else address).
fn unnamed_mapping_call_site(stack: &Stack) -> Option<(String, u64)> {
    let f = first_caller(stack).filter(|f| is_interpreter(f) && f.function.is_none())?;
    Some((f.object.clone().unwrap_or_default(), f.file_offset.unwrap_or(f.addr)))
}

/// The interpreter's arena-mapping call sites in a recording: the unnamed nearest callers of the
/// mappings that [`arena_below_allocator`] recognises (`python3.11+0x22d099`, inside the
/// unnamed `_PyObject_ArenaMmap`). The same call site maps every arena and, in 3.11, the
/// interpreter's 16 KiB frame-stack chunks (`_PyObject_VirtualAlloc`), whoever asked: an arena
/// that filled while an object was made by a function with no name or no place in
/// [`OBJECT_ALLOCATION`] (`PyFunction_NewWithQualName`) is still known by its call site.
pub fn arena_call_sites(stacks: &[Stack]) -> std::collections::HashSet<(String, u64)> {
    stacks
        .iter()
        .filter(|s| s.kind == StackKind::Mmap && arena_below_allocator(s))
        .filter_map(unnamed_mapping_call_site)
        .collect()
}

/// True for a mapping made at one of `sites` ([`arena_call_sites`]).
pub fn made_at(stack: &Stack, sites: &std::collections::HashSet<(String, u64)>) -> bool {
    stack.kind == StackKind::Mmap && unnamed_mapping_call_site(stack).is_some_and(|k| sites.contains(&k))
}

/// Python's rules (None: the default for the site's kind).
pub fn classify(stack: &Stack) -> Option<MemoryKind> {
    match stack.kind {
        StackKind::Mmap => {
            if callers(stack).take(4).any(|f| ARENA_FUNCTIONS.contains(&function(f))) {
                return Some(MemoryKind::Managed);
            }
            // A stripped interpreter (Debian's /usr/bin/python3.11: no .symtab, the arena
            // function is a local symbol) has no name for its arena function: an anonymous
            // mapping whose nearest caller is the interpreter's own code, below an object
            // allocation or the allocator API (exported: named) in the interpreter, is a pymalloc
            // arena. The raw frames are searched: [`callers`] skips the allocator API's frames
            // (PyMem_Malloc is an allocator frame), which are the evidence here. Other mappings
            // the interpreter's code makes are below no allocator function.
            if arena_below_allocator(stack) {
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

/// CPython's rules ([`super::RuntimeRules`]).
pub struct Python;

impl super::RuntimeRules for Python {
    fn classify(&self, stack: &Stack) -> Option<MemoryKind> {
        classify(stack)
    }

    /// In a target whose arena function has no name (Debian's static python3.11), the call site
    /// that maps arenas is learnt from the stacks where an allocator frame shows it
    /// ([`arena_call_sites`]): every mapping made from that call site is the Python heap's too.
    fn classify_together(&self, stacks: &[Stack], kinds: &mut [MemoryKind]) {
        let arena_sites = arena_call_sites(stacks);
        for (k, st) in kinds.iter_mut().zip(stacks) {
            if *k == MemoryKind::OffHeap && made_at(st, &arena_sites) {
                *k = MemoryKind::Managed;
            }
        }
    }

    fn heap_name(&self) -> &'static str {
        "Python heap"
    }

    fn kind_origin(&self, kind: MemoryKind) -> &'static str {
        match kind {
            MemoryKind::Native => "C extension",
            MemoryKind::OffHeap => "anonymous mapping",
            MemoryKind::Runtime => "interpreter internals",
            MemoryKind::Managed => "managed heap",
        }
    }

    /// Native memory is named from the site's stack ([`native_origin`]: a system library called
    /// through ctypes is not a C extension).
    fn site_origin(
        &self,
        kind: MemoryKind,
        frames: &[std::sync::Arc<Frame>],
        extensions: &std::collections::HashSet<String>,
    ) -> String {
        match kind {
            MemoryKind::Native => native_origin(frames, extensions),
            _ => self.kind_origin(kind).to_string(),
        }
    }

    fn heap_tool(&self) -> &'static str {
        "tracemalloc or a heap dump (objgraph, guppy) shows which objects"
    }

    fn managed_from_sites(&self) -> &'static str {
        "its sites: pymalloc arenas' resident pages and objects malloc'd"
    }

    /// A Python frame read from the interpreter (the function and its line).
    fn is_program_code_frame(&self, f: &Frame) -> bool {
        f.kind == crate::recording::FrameKind::Python
    }

    /// CPython's own code (libpython, or an interpreter executable such as `python3.11` with the
    /// interpreter linked in) allocating for its caller.
    fn is_allocating_api_frame(&self, f: &Frame) -> bool {
        crate::frame_origin::is_runtime_frame(f)
            && f.object
                .as_deref()
                .map(crate::frame_origin::basename)
                .is_some_and(|b| b.starts_with("python") || b.starts_with("libpython"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{LIBC, st};
    use super::*;

    const LIBPY: &str = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0";

    /// Where native memory comes from: a system library called through ctypes is named as such,
    /// a C extension only when it is one (PyInit_ exported, an extension module's name, or a
    /// module under site-packages / dist-packages / lib-dynload, not a wheel's bundled library).
    #[test]
    fn native_origin_tells_ctypes_from_extensions() {
        use std::collections::HashSet;
        let none = HashSet::new();
        let frames = |s: Stack| s.frames;
        const FFI: &str = "/usr/lib/x86_64-linux-gnu/libffi.so.8";
        const CTYPES: &str = "/x/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so";
        let via = |lib: (&'static str, &'static str)| {
            frames(st(
                "malloc",
                &[("malloc", LIBC), lib, ("ffi_call_unix64", FFI), ("_ctypes_callproc", CTYPES), ("x", LIBPY)],
            ))
        };
        assert_eq!(native_origin(&via(("__GI___strdup", LIBC)), &none), "libc.so.6 via ctypes");
        assert_eq!(native_origin(&via(("make_buf", "/tmp/libcleak.so")), &none), "libcleak.so via ctypes");
        // An unnamed libffi frame is libffi's by its object.
        let mut unnamed = via(("__GI___strdup", LIBC));
        std::sync::Arc::make_mut(&mut unnamed[2]).function = None;
        assert_eq!(native_origin(&unnamed, &none), "libc.so.6 via ctypes");
        // cffi's ABI mode calls through libffi too: not ctypes.
        let cffi = frames(st(
            "malloc",
            &[
                ("malloc", LIBC),
                ("__GI___strdup", LIBC),
                ("ffi_call", FFI),
                ("cdata_call", "/srv/venv/lib/python3.11/site-packages/_cffi_backend.cpython-311-x86_64-linux-gnu.so"),
                ("x", LIBPY),
            ],
        ));
        assert_eq!(native_origin(&cffi, &none), "libc.so.6 via cffi");
        // _ctypes built into the interpreter executable: told by its functions.
        let builtin = frames(st(
            "malloc",
            &[("__GI___strdup", LIBC), ("ffi_call", FFI), ("_ctypes_callproc", "/usr/bin/python3.11")],
        ));
        assert_eq!(native_origin(&builtin, &none), "libc.so.6 via ctypes");
        // Extensions: by name, by directory, by PyInit_ export; one calling a library is still one.
        let ext = |lib: &'static str| frames(st("malloc", &[("malloc", LIBC), ("parse", lib), ("x", LIBPY)]));
        assert_eq!(native_origin(&ext("/tmp/t/tsparse_ext.cpython-311-x86_64-linux-gnu.so"), &none), "C extension");
        assert_eq!(
            native_origin(&ext("/srv/venv/lib/python3.11/site-packages/fast/_speed.abi3.so"), &none),
            "C extension"
        );
        assert_eq!(native_origin(&ext("/usr/lib/python3/dist-packages/yaml/_yaml.so"), &none), "C extension");
        assert_eq!(native_origin(&ext("/opt/app/fastparse.so"), &none), "native library fastparse.so");
        let exporters: HashSet<String> = ["/opt/app/fastparse.so".to_string()].into();
        assert_eq!(native_origin(&ext("/opt/app/fastparse.so"), &exporters), "C extension");
        let lxml = frames(st(
            "malloc",
            &[
                ("malloc", LIBC),
                ("xmlStrdup", "/usr/lib/x86_64-linux-gnu/libxml2.so.2"),
                ("parse", "/srv/venv/lib/python3.11/site-packages/lxml/etree.cpython-311-x86_64-linux-gnu.so"),
                ("x", LIBPY),
            ],
        ));
        assert_eq!(native_origin(&lxml, &none), "C extension");
        // A wheel's bundled library beside the extensions is not one; libc alone is named as is.
        let bundled = ext("/srv/venv/lib/python3.11/site-packages/numpy.libs/libopenblas64_p-r0.so");
        assert_eq!(native_origin(&bundled, &none), "native library libopenblas64_p-r0.so");
        let libc_only = frames(st("malloc", &[("malloc", LIBC), ("x", LIBPY)]));
        assert_eq!(native_origin(&libc_only, &none), "libc.so.6");
        assert!(!is_extension_object(LIBC, &none) && !is_extension_object(FFI, &none));
    }

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
        // Debian's python3.11 mapping an arena for an extension's PyMem_Malloc (the recording of
        // case 30): two unnamed interpreter frames (_PyObject_ArenaMmap, pymalloc), then the
        // exported PyMem_Malloc, which is an allocator frame, then the extension.
        const DEB: &str = "/usr/bin/python3.11";
        const EXT: &str = "/tmp/30/build/fieldsplit.cpython-311-x86_64-linux-gnu.so";
        let unnamed = |mut s: Stack, at: &[usize]| {
            for &i in at {
                std::sync::Arc::make_mut(&mut s.frames[i]).function = None;
            }
            s
        };
        let pymem = unnamed(
            st(
                "mmap",
                &[
                    ("__GI___mmap64", LIBC),
                    ("a", DEB),
                    ("b", DEB),
                    ("PyMem_Malloc", DEB),
                    ("split_fields", EXT),
                    ("PyEval_EvalCode", DEB),
                ],
            ),
            &[1, 2],
        );
        assert_eq!(classify(&pymem), Some(MemoryKind::Managed));
        // Decoys: the extension's own 1 MiB mapping, and a mapping by the interpreter's own
        // code outside the allocator (unnamed frames of the interpreter, no allocator among them).
        let ext_map = st("mmap", &[("__GI___mmap64", LIBC), ("map_table", EXT), ("PyEval_EvalCode", DEB)]);
        assert_eq!(classify(&ext_map), None);
        let interp_map = unnamed(
            st("mmap", &[("__GI___mmap64", LIBC), ("map_x", DEB), ("call_y", DEB), ("PyEval_EvalCode", DEB)]),
            &[1, 2],
        );
        assert_eq!(classify(&interp_map), None);
        // The call site that maps arenas, learnt from the stack above (the e2e run's second
        // arena filled while PyFunction_NewWithQualName made a function, an allocator not in
        // the list): every mapping made from it is the Python heap's; the interpreter's other
        // unnamed mapping code, and the extension's own mapping, are not.
        let at = |mut s: Stack, offsets: &[(usize, u64)]| {
            for &(i, off) in offsets {
                std::sync::Arc::make_mut(&mut s.frames[i]).file_offset = Some(off);
            }
            s
        };
        let pymem = at(pymem, &[(1, 0x22d099), (2, 0xfb707)]);
        let function_new = at(
            unnamed(
                st(
                    "mmap",
                    &[
                        ("__GI___mmap64", LIBC),
                        ("a", DEB),
                        ("b", DEB),
                        ("PyFunction_NewWithQualName", DEB),
                        ("_PyEval_EvalFrameDefault", DEB),
                    ],
                ),
                &[1, 2],
            ),
            &[(1, 0x22d099), (2, 0xfb707)],
        );
        assert_eq!(classify(&function_new), None, "alone, its stack does not tell");
        let interp_map = at(interp_map, &[(1, 0x1234)]);
        let stacks = [pymem, function_new, interp_map, ext_map];
        use super::super::classify_sites;
        use crate::recording::Runtime;
        assert_eq!(
            classify_sites(Some(Runtime::Python), &stacks),
            [MemoryKind::Managed, MemoryKind::Managed, MemoryKind::OffHeap, MemoryKind::OffHeap]
        );
        assert_eq!(classify_sites(Some(Runtime::Python), &stacks[1..]), [MemoryKind::OffHeap; 3]);
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
