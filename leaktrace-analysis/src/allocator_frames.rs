//! Which function names are allocator internals or thin wrappers (never shown as the culprit
//! of a site), and which are libc's wrappers of the mapping system calls: name tables read by
//! the analysis (culprits, runtime rules) and by `leaktrace::allocators` (the hooked entry points).

/// Function names (demangled, as blazesym reports them) that belong to the allocator or to thin
/// wrappers around it: a site's culprit is the first frame, innermost first, that is not one of
/// these. Prefix entries end with '*'.
pub const ALLOCATOR_FRAMES: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "__libc_malloc",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__libc_valloc",
    "__libc_pvalloc",
    "__posix_memalign",
    // Static glibc's internal names (a `gcc -static` program has no __libc_malloc symbol).
    "__malloc",
    "__calloc",
    "__realloc",
    "__free",
    "_int_malloc",
    "_int_realloc",
    "_int_memalign",
    "_mid_memalign",
    "tcache_init",
    "malloc_hook_ini",
    "strdup",
    "strndup",
    "__strdup",
    "__strndup",
    "wcsdup",
    // CPython's allocator API and pymalloc (hooked with --pymalloc; without it, malloc's
    // callers inside them).
    "PyObject_Malloc",
    "PyObject_Calloc",
    "PyObject_Realloc",
    "PyObject_Free",
    "PyMem_Malloc",
    "PyMem_Calloc",
    "PyMem_Realloc",
    "PyMem_Free",
    "PyMem_RawMalloc",
    "PyMem_RawCalloc",
    "PyMem_RawRealloc",
    "_PyObject_Malloc",
    "_PyObject_Calloc",
    "_PyObject_Realloc",
    "_PyMem_RawMalloc",
    "_PyMem_RawCalloc",
    "_PyMem_RawRealloc",
    "pymalloc_alloc",
    "pymalloc_realloc",
    "je_*",
    "_rjem_*",
    "tc_*",
    "mi_*",
    "_mi_*",
    "mallocx",
    "rallocx",
    "dallocx",
    "sdallocx",
    "tcmalloc::*",
    "(anonymous namespace)::do_malloc*",
    "(anonymous namespace)::cpp_alloc*",
    "__rust_dealloc",
    // musl's (mallocng) names for the same entry points, as its symbol table has them.
    "default_malloc",
    "default_calloc",
    "default_realloc",
    "default_free",
    "__libc_malloc_impl",
    "__libc_realloc_impl",
    "__simple_malloc",
    "__malloc_donate",
    // glibc's internal aliases, as its debug info names them.
    "__GI___libc_*",
    "__GI___strdup",
    "__GI___strndup",
    "__libc_calloc",
    "__libc_free",
    "operator new*",
    "operator delete*",
    "__rust_alloc",
    "__rust_alloc_zeroed",
    "__rust_realloc",
    "__rdl_alloc",
    "__rdl_alloc_zeroed",
    "__rdl_realloc",
    "alloc::alloc::*",
    "<alloc::alloc::Global as core::alloc::Allocator>::*",
    "std::sys::alloc::*",
    "__gnu_cxx::new_allocator*",
    "std::__new_allocator*",
    "std::allocator_traits*",
    "std::allocator*",
];

/// libc's wrappers of the mapping system calls, as blazesym names them: an "mmap" site's frame 0
/// is one of these (the libc mmap probe) or syscall(2) (a raw `syscall(SYS_mmap, ...)` seen at
/// the system call), and its culprit is the first frame after them.
pub const MAPPING_FRAMES: &[&str] =
    &["mmap", "mmap64", "__mmap", "__mmap64", "__GI___mmap", "__GI___mmap64", "syscall", "__syscall", "__GI_syscall"];

/// True when `function` is a libc wrapper of the mapping system calls ([`MAPPING_FRAMES`]).
pub fn is_mapping_frame(function: &str) -> bool {
    MAPPING_FRAMES.contains(&function)
}

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
        assert!(is_allocator_frame("default_malloc"), "musl's malloc");
        assert!(is_allocator_frame("operator new(unsigned long)"));
        assert!(is_allocator_frame("operator new[](unsigned long)"));
        assert!(!is_allocator_frame("handle_request(unsigned long)"));
        assert!(!is_allocator_frame("mallocate_things"));
        assert!(is_mapping_frame("mmap64") && is_mapping_frame("syscall"));
        assert!(!is_mapping_frame("map_buffers"));
    }
}
