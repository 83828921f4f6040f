//! What leaktrace knows about allocators: which entry points it hooks, with which eBPF program,
//! and which function names are allocator internals (never shown as the culprit of a site).

/// One hooked allocator entry point.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    /// Symbol in the allocator's ELF object (dynamic or static symbol table).
    pub function: &'static str,
    /// eBPF program for the entry probe (`leaktrace-ebpf`).
    pub entry_program: &'static str,
    /// eBPF program for the return probe, if the call returns a block.
    pub return_program: Option<&'static str>,
    /// A call with a NULL first argument does nothing (free): the entry probe may be placed
    /// after the function's NULL check (see `placement`).
    pub null_is_noop: bool,
}

const RET: Option<&str> = Some("alloc_return");

/// The malloc family of glibc (and any libc with the same API). `free` has no return probe.
pub const LIBC_HOOKS: &[Hook] = &[
    Hook { function: "malloc", entry_program: "malloc_enter", return_program: RET, null_is_noop: false },
    Hook { function: "calloc", entry_program: "calloc_enter", return_program: RET, null_is_noop: false },
    Hook { function: "realloc", entry_program: "realloc_enter", return_program: RET, null_is_noop: false },
    Hook { function: "reallocarray", entry_program: "reallocarray_enter", return_program: RET, null_is_noop: false },
    Hook { function: "posix_memalign", entry_program: "posix_memalign_enter", return_program: RET, null_is_noop: false },
    Hook { function: "aligned_alloc", entry_program: "aligned_alloc_enter", return_program: RET, null_is_noop: false },
    Hook { function: "memalign", entry_program: "memalign_enter", return_program: RET, null_is_noop: false },
    Hook { function: "valloc", entry_program: "valloc_enter", return_program: RET, null_is_noop: false },
    Hook { function: "pvalloc", entry_program: "pvalloc_enter", return_program: RET, null_is_noop: false },
    Hook { function: "free", entry_program: "free_enter", return_program: None, null_is_noop: true },
    // Not an allocation: gives anonymous mappings their caller's stack (see `mappings`).
    Hook { function: "mmap", entry_program: "mmap_enter", return_program: None, null_is_noop: false },
];

/// The functions an object must define (all of them) to be probed as a malloc-family allocator.
pub const REQUIRED: &[&str] = &["malloc", "free"];

/// Function names (demangled, as blazesym reports them) that belong to the allocator or to thin
/// wrappers around it: a site's culprit is the first frame, innermost first, that is not one of
/// these. Prefix entries end with '*'.
pub const ALLOCATOR_FRAMES: &[&str] = &[
    "malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc", "__libc_malloc", "__libc_calloc", "__libc_realloc",
    "__libc_memalign", "__libc_valloc", "__libc_pvalloc", "__posix_memalign", "_int_malloc",
    "_int_realloc", "_int_memalign", "_mid_memalign", "tcache_init", "malloc_hook_ini",
    "strdup", "strndup", "__strdup", "__strndup", "wcsdup",
    // glibc's internal aliases, as its debug info names them.
    "__GI___libc_*", "__GI___strdup", "__GI___strndup", "__libc_calloc", "__libc_free",
    "operator new*", "operator delete*",
    "__rust_alloc", "__rust_alloc_zeroed", "__rust_realloc", "__rdl_alloc", "__rdl_alloc_zeroed",
    "__rdl_realloc", "alloc::alloc::*", "<alloc::alloc::Global as core::alloc::Allocator>::*",
    "std::sys::alloc::*", "__gnu_cxx::new_allocator*", "std::__new_allocator*",
    "std::allocator_traits*", "std::allocator*",
];

/// True when `function` is an allocator internal or a thin allocation wrapper.
pub fn is_allocator_frame(function: &str) -> bool {
    ALLOCATOR_FRAMES.iter().any(|pat| match pat.strip_suffix('*') {
        Some(prefix) => function.starts_with(prefix),
        None => function == *pat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_frames() {
        assert!(is_allocator_frame("malloc"));
        assert!(is_allocator_frame("__GI___libc_malloc"));
        assert!(is_allocator_frame("operator new(unsigned long)"));
        assert!(is_allocator_frame("operator new[](unsigned long)"));
        assert!(!is_allocator_frame("handle_request(unsigned long)"));
        assert!(!is_allocator_frame("mallocate_things"));
    }
}
