//! What leaktrace knows about allocators: which entry points it hooks, with which eBPF program
//! (`leaktrace_common::program`).
//! Which function names are allocator internals (never shown as the culprit of a site) is the
//! analysis' business: `leaktrace_analysis::allocator_frames`.

use leaktrace_common::program::{self, Program};

/// One hooked allocator entry point (a template: families add their symbol prefix).
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    /// Symbol without the family's prefix (e.g. "malloc"; with prefix "je_": "je_malloc").
    pub function: &'static str,
    /// eBPF program for the entry probe; the arguments it reads ([`Program::args`]) must be the
    /// function's.
    pub entry_program: &'static Program,
    /// eBPF program for the return probe, if the call returns a block.
    pub return_program: Option<&'static Program>,
    /// A call with a NULL first argument does nothing (free): the entry probe may be placed
    /// after the function's NULL check (see `placement`).
    pub null_is_noop: bool,
}

impl Hook {
    /// How many integer argument registers the entry program reads (%rdi, %rsi, ... in that
    /// order, [`Program::args_read`]): probe placement must not skip an instruction that changes
    /// one of them.
    pub fn args_read(&self) -> usize {
        self.entry_program.args_read()
    }
}

const RET: Option<&Program> = Some(&program::ALLOC_RETURN);

const fn alloc(function: &'static str, entry_program: &'static Program) -> Hook {
    Hook { function, entry_program, return_program: RET, null_is_noop: false }
}
const fn dealloc(function: &'static str) -> Hook {
    Hook { function, entry_program: &program::FREE_ENTER, return_program: None, null_is_noop: true }
}

/// The malloc API (C standard, POSIX and GNU), hooked under each family prefix. `free` has no
/// return probe.
pub const MALLOC_API: &[Hook] = &[
    alloc("malloc", &program::MALLOC_ENTER),
    alloc("calloc", &program::CALLOC_ENTER),
    alloc("realloc", &program::REALLOC_ENTER),
    alloc("reallocarray", &program::REALLOCARRAY_ENTER),
    alloc("posix_memalign", &program::POSIX_MEMALIGN_ENTER),
    alloc("aligned_alloc", &program::ALIGNED_ALLOC_ENTER),
    alloc("memalign", &program::MEMALIGN_ENTER),
    alloc("valloc", &program::VALLOC_ENTER),
    alloc("pvalloc", &program::PVALLOC_ENTER),
    dealloc("free"),
    dealloc("cfree"),
    // jemalloc's non-standard API: mallocx(size, flags), rallocx(ptr, size, flags),
    // dallocx(ptr, flags), sdallocx(ptr, size, flags). (xallocx resizes in place: not traced.)
    alloc("mallocx", &program::MALLOC_ENTER),
    alloc("rallocx", &program::REALLOC_ENTER),
    dealloc("dallocx"),
    dealloc("sdallocx"),
    // tcmalloc's and mimalloc's extra names.
    dealloc("free_sized"),
    dealloc("free_size"),
    dealloc("free_aligned"),
    alloc("zalloc", &program::MALLOC_ENTER),
    alloc("malloc_aligned", &program::MALLOC_ENTER),
    alloc("zalloc_aligned", &program::MALLOC_ENTER),
    alloc("realloc_aligned", &program::REALLOC_ENTER),
    alloc("new", &program::MALLOC_ENTER),
    alloc("newarray", &program::MALLOC_ENTER),
    alloc("new_nothrow", &program::MALLOC_ENTER),
    alloc("newarray_nothrow", &program::MALLOC_ENTER),
    alloc("new_aligned", &program::MALLOC_ENTER),
    alloc("newarray_aligned", &program::MALLOC_ENTER),
    alloc("new_aligned_nothrow", &program::MALLOC_ENTER),
    alloc("newarray_aligned_nothrow", &program::MALLOC_ENTER),
    dealloc("delete"),
    dealloc("deletearray"),
    dealloc("delete_nothrow"),
    dealloc("deletearray_nothrow"),
    dealloc("delete_sized"),
    dealloc("deletearray_sized"),
    dealloc("delete_aligned"),
    dealloc("deletearray_aligned"),
    dealloc("delete_aligned_nothrow"),
    dealloc("deletearray_aligned_nothrow"),
    dealloc("delete_sized_aligned"),
    dealloc("deletearray_sized_aligned"),
];

/// An allocator family: objects defining `{prefix}malloc` and `{prefix}free` are probed for
/// [`MALLOC_API`] under that prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// Name in the coverage table.
    pub name: &'static str,
    /// Symbol prefix: "" (glibc, musl, and allocators that replace malloc: jemalloc, tcmalloc,
    /// mimalloc), "je_" (jemalloc built with a prefix), "_rjem_" (Rust's tikv-jemallocator),
    /// "tc_" (tcmalloc), "mi_" (mimalloc).
    pub prefix: &'static str,
}

/// Families, most common first.
pub const FAMILIES: &[Family] = &[
    Family { name: "malloc", prefix: "" },
    Family { name: "jemalloc (je_)", prefix: "je_" },
    Family { name: "jemalloc (_rjem_)", prefix: "_rjem_" },
    Family { name: "tcmalloc (tc_)", prefix: "tc_" },
    Family { name: "mimalloc (mi_)", prefix: "mi_" },
];

/// Which allocator API discovery found in an object (an object may provide several): what the
/// coverage lines name in brackets, e.g. `[malloc, pymalloc (CPython's allocator API)]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocatorFamily {
    /// The malloc API under one of [`FAMILIES`]' prefixes: the object is an allocator.
    Malloc(Family),
    /// CPython's allocator API ([`PYMALLOC_API`], `--pymalloc`).
    Pymalloc,
    /// The C++ runtime's operator new ([`CXX_NEW`]) in an object that is not an allocator.
    CxxNew,
    /// Rust's allocator shims ([`RUST_API`]): a process without any malloc family.
    RustShims,
}

impl std::fmt::Display for AllocatorFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AllocatorFamily::Malloc(fam) => fam.name,
            AllocatorFamily::Pymalloc => "pymalloc (CPython's allocator API)",
            AllocatorFamily::CxxNew => "C++ runtime operator new",
            AllocatorFamily::RustShims => "Rust allocator shims",
        })
    }
}

/// C++ operator new in all its forms (plain, array, nothrow, aligned). Hooked wherever defined:
/// the C++ runtime's operator new (libstdc++) calls malloc without a frame of its own, so a probe
/// on malloc alone would lose the function that called `new`; with operator new hooked, the
/// malloc inside is folded into it.
pub const CXX_NEW: &[Hook] = &[
    alloc("_Znwm", &program::MALLOC_ENTER),
    alloc("_Znam", &program::MALLOC_ENTER),
    alloc("_ZnwmRKSt9nothrow_t", &program::MALLOC_ENTER),
    alloc("_ZnamRKSt9nothrow_t", &program::MALLOC_ENTER),
    alloc("_ZnwmSt11align_val_t", &program::MALLOC_ENTER),
    alloc("_ZnamSt11align_val_t", &program::MALLOC_ENTER),
    alloc("_ZnwmSt11align_val_tRKSt9nothrow_t", &program::MALLOC_ENTER),
    alloc("_ZnamSt11align_val_tRKSt9nothrow_t", &program::MALLOC_ENTER),
];

/// C++ operator delete in all its forms (plain, array, sized, nothrow, aligned). Hooked in
/// objects that are allocators themselves (tcmalloc, jemalloc, mimalloc define their own); the
/// C++ runtime's operator delete calls free, which is hooked already.
pub const CXX_DELETE: &[Hook] = &[
    dealloc("_ZdlPv"),
    dealloc("_ZdaPv"),
    dealloc("_ZdlPvm"),
    dealloc("_ZdaPvm"),
    dealloc("_ZdlPvRKSt9nothrow_t"),
    dealloc("_ZdaPvRKSt9nothrow_t"),
    dealloc("_ZdlPvSt11align_val_t"),
    dealloc("_ZdaPvSt11align_val_t"),
    dealloc("_ZdlPvmSt11align_val_t"),
    dealloc("_ZdaPvmSt11align_val_t"),
    dealloc("_ZdlPvSt11align_val_tRKSt9nothrow_t"),
    dealloc("_ZdaPvSt11align_val_tRKSt9nothrow_t"),
];

/// C library functions that allocate through malloc but break the frame-pointer chain before
/// calling it (glibc's strdup keeps the length in %rbp): hooked at their own entry, where the
/// caller's stack is intact; the size comes from the malloc they call.
pub const WRAPPERS: &[Hook] = &[
    alloc("strdup", &program::WRAPPER_ENTER),
    alloc("strndup", &program::WRAPPER_ENTER),
    alloc("wcsdup", &program::WRAPPER_ENTER),
];

/// Rust's allocator shims, hooked only when a process has no other allocator family (they
/// forward to the global allocator, which is normally malloc or a hooked jemalloc).
/// `__rust_realloc(ptr, old_size, align, new_size)` has its own argument layout.
pub const RUST_API: &[Hook] = &[
    alloc("__rust_alloc", &program::MALLOC_ENTER),
    alloc("__rust_alloc_zeroed", &program::MALLOC_ENTER),
    alloc("__rust_realloc", &program::RUST_REALLOC_ENTER),
    dealloc("__rust_dealloc"),
];

/// CPython's allocator API (`--pymalloc`): pymalloc serves blocks of up to 512 bytes from its own
/// arenas without a malloc call, so an extension's PyMem_Malloc leak or Python objects kept alive
/// are seen by their call stacks only with these hooked. Larger blocks are malloc calls made
/// inside them (folded into the outer call). Python allocates at a high rate: every call pays a
/// probe (docs/benchmarks.md), so this is opt-in.
pub const PYMALLOC_API: &[Hook] = &[
    alloc("PyObject_Malloc", &program::MALLOC_ENTER),
    alloc("PyObject_Calloc", &program::CALLOC_ENTER),
    alloc("PyObject_Realloc", &program::REALLOC_ENTER),
    dealloc("PyObject_Free"),
    alloc("PyMem_Malloc", &program::MALLOC_ENTER),
    alloc("PyMem_Calloc", &program::CALLOC_ENTER),
    alloc("PyMem_Realloc", &program::REALLOC_ENTER),
    dealloc("PyMem_Free"),
];

/// Not an allocation: libc's mmap gives anonymous mappings their caller's stack (see
/// `mappings`). Hooked in objects of the unprefixed family.
pub const MMAP_HOOK: Hook =
    Hook { function: "mmap", entry_program: &program::MMAP_ENTER, return_program: None, null_is_noop: false };
