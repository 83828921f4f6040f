//! Whose code a frame is, by its function and object names alone: an allocator's, system or
//! standard-library code, a managed runtime's own object. The culprit rules (analyze/frames.rs)
//! and the runtime rules (runtimes/) both read these; they depend on neither. Also which
//! allocator made a mapping ([`mapped_by_allocator`]), read by the timeline and the culprit rules.

use crate::allocator_frames::is_allocator_frame;
use crate::recording::{Frame, Stack, StackKind};

/// Last path component of `path` (the whole string when it has no '/').
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// True when `f` is an allocator-internal frame (by function name).
pub fn is_allocator(f: &Frame) -> bool {
    f.function.as_deref().is_some_and(is_allocator_frame)
}

/// True for a frame of system or standard-library code: a shared library installed in a system
/// library directory (libc, libstdc++, libz, libssl, libsqlite3, ...: /lib, /usr/lib, /lib64,
/// /usr/lib64), or a function of the C++ or Rust standard library (`std::`, `__gnu_cxx::`,
/// `alloc::`, `core::`; a Rust trait method `<TYPE as TRAIT>::m` when the trait is the standard
/// library's and the type is too or is a primitive), inlined into user code or not. Packages installed under a system
/// directory are not system code: a Python extension in `dist-packages`/`site-packages`
/// (`/usr/lib/python3/dist-packages/lxml/etree.cpython-311-x86_64-linux-gnu.so`), a Node addon
/// in `node_modules` — they are the third-party extensions whose leaks people trace.
pub fn is_system_frame(f: &Frame) -> bool {
    let in_system_lib = f.object.as_deref().is_some_and(|o| {
        let name = basename(o);
        ["/lib/", "/usr/lib/", "/lib64/", "/usr/lib64/"].iter().any(|d| o.starts_with(d))
            && (name.ends_with(".so") || name.contains(".so."))
            && !["/dist-packages/", "/site-packages/", "/node_modules/"].iter().any(|d| o.contains(d))
    });
    let std_function = f.function.as_deref().is_some_and(|n| {
        const STD: [&str; 4] = ["std::", "__gnu_cxx::", "alloc::", "core::"];
        let std_path = |p: &str| STD.iter().any(|s| p.starts_with(s));
        // A Rust trait method: `<TYPE as TRAIT>::method`. It is the standard library's when the
        // trait is (`core::fmt::Write`, `alloc::vec::spec_from_elem::SpecFromElem`) and so is
        // the type, or the type is a primitive (`<u8 as alloc::..::SpecFromElem>::from_elem`,
        // inlined by `vec![x; n]`); the user's impl of a standard trait
        // (`<app::Config as core::fmt::Display>::fmt`) or a user trait (`<alloc::vec::Vec<T>
        // as app::Store>::put`) is not.
        if let Some((ty, tr)) = rust_trait_impl(n) {
            let ty = ty.trim_start_matches(['&', '*', '[', '(']);
            let ty = ty.strip_prefix("mut ").or_else(|| ty.strip_prefix("const ")).unwrap_or(ty);
            let primitive = !ty.split('<').next().unwrap_or(ty).contains("::");
            return std_path(tr) && (primitive || std_path(ty));
        }
        // An inherent method of a Rust type starts with `<` too (`<alloc::vec::Vec<T>>::push`).
        let n = n.trim_start_matches('<');
        if std_path(n) {
            return true;
        }
        // A C++ name may start with its return type ("void std::vector<...>::...").
        match n.split_once(' ') {
            Some((ret, rest)) if !ret.contains('(') && !ret.contains('<') && !ret.contains("::") => {
                let rest = rest.trim_start_matches('<');
                STD.iter().any(|p| rest.starts_with(p))
            }
            _ => false,
        }
    });
    in_system_lib || std_function
}

/// The type and the trait of a Rust trait method's name, `<TYPE as TRAIT>::method`: the ` as `
/// at the outermost level of the leading `<…>`. None for any other name.
fn rust_trait_impl(name: &str) -> Option<(&str, &str)> {
    let inner = name.strip_prefix('<')?;
    let mut depth = 0usize;
    let mut as_at = None;
    for (i, c) in inner.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' if depth == 0 => return as_at.map(|a| (&inner[..a], &inner[a + 4..i])),
            '>' | ')' | ']' => depth = depth.saturating_sub(1),
            ' ' if depth == 0 && as_at.is_none() && inner[i..].starts_with(" as ") => as_at = Some(i),
            _ => {}
        }
    }
    None
}

/// True when a frame is in a managed runtime's own object (interpreter or VM), whose frames the
/// runtime rules judge (runtimes/): the culprit stays where the runtime code allocated.
pub fn is_runtime_frame(f: &Frame) -> bool {
    f.object.as_deref().map(basename).is_some_and(|b| {
        // python3, python3.11 (a version, nothing else), and the runtimes' own libraries.
        let python_exe = b.strip_prefix("python").is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'));
        python_exe
            || matches!(b, "node" | "nodejs" | "java")
            || ["libpython", "libjvm.so", "libjli.so", "libnode.so"].iter().any(|p| b.starts_with(p))
    })
}

/// Native allocators whose library maps its own memory (their objects are often stripped, so
/// their internal frames have no name: the object says whose they are).
const ALLOCATOR_LIBRARIES: &[&str] = &["libjemalloc", "libtcmalloc", "libmimalloc"];

/// Function-name prefixes of native allocators linked into the program (Rust's
/// tikv-jemallocator `_rjem_je_*`, jemalloc's `je_*`, tcmalloc, mimalloc).
const ALLOCATOR_PREFIXES: &[&str] = &["je_", "_rjem_", "tc_", "tcmalloc::", "mi_", "_mi_"];

/// The native allocator a growth-mode mapping was made by: for an "mmap" stack that
/// passes through jemalloc, tcmalloc or mimalloc (by object or function name) or glibc's malloc
/// (an allocator function in libc), the allocator's name (`jemalloc`, `glibc malloc`); None for
/// any other stack, and for one through a managed runtime's own code (a runtime maps its heap
/// through its own rules, runtimes/). Such a mapping is heap growth through the allocator, whose
/// pages hold whatever blocks it carves from them: not off-heap memory of the function that
/// asked for a block. Growth mode only — in exact mode the blocks are traced at the malloc sites.
pub(crate) fn mapped_by_allocator(st: &Stack) -> Option<String> {
    if st.kind != StackKind::Mmap || st.frames.iter().any(|f| is_runtime_frame(f)) {
        return None;
    }
    st.frames.iter().find_map(|f| {
        let object = f.object.as_deref().map(basename).unwrap_or("");
        if let Some(lib) = ALLOCATOR_LIBRARIES.iter().find(|l| object.starts_with(**l)) {
            return Some(lib.trim_start_matches("lib").to_string());
        }
        let function = f.function.as_deref().unwrap_or("");
        if ALLOCATOR_PREFIXES.iter().any(|p| function.starts_with(p)) {
            return Some(function.to_string());
        }
        (is_allocator(f) && crate::system_libs::is_glibc(object)).then(|| "glibc malloc".to_string())
    })
}

/// Test helpers shared with the analysis' other frame tests (analyze/first_touch.rs).
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    fn frame(function: &str, object: &str) -> Arc<Frame> {
        Arc::new(Frame { function: Some(function.to_string()), object: Some(object.to_string()), ..Default::default() })
    }

    /// A stack of id 1 of `kind` whose frames are `(function, object)`, innermost first.
    pub(crate) fn stack(kind: StackKind, names: &[(&str, &str)]) -> Stack {
        Stack {
            id: 1,
            kind,
            frames: names.iter().map(|(f, o)| frame(f, o)).collect(),
            lost: false,
            truncated: None,
            shared: false,
        }
    }

    pub(crate) const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

    /// jemalloc (Debian's libjemalloc2, stripped: its frames have no name) mapping an
    /// extent under the program's malloc is the allocator's heap growth, not an off-heap mapping
    /// of the program; the program's own mmap, and one through a runtime, are not.
    #[test]
    fn a_mapping_made_inside_an_allocator_library_is_the_allocators() {
        const JE: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
        let unnamed = |o: &str| Arc::new(Frame { object: Some(o.to_string()), ..Default::default() });
        let mut je = stack(StackKind::Mmap, &[("mmap64", LIBC)]);
        je.frames.extend([unnamed(JE), unnamed(JE), frame("malloc", JE)]);
        je.frames.extend(stack(StackKind::Mmap, &[("remember_request", "/srv/app"), ("main", "/srv/app")]).frames);
        assert_eq!(mapped_by_allocator(&je).as_deref(), Some("jemalloc"));
        let glibc = stack(
            StackKind::Mmap,
            &[("mmap64", LIBC), ("sysmalloc", LIBC), ("_int_malloc", LIBC), ("malloc", LIBC), ("load", "/srv/app")],
        );
        assert_eq!(mapped_by_allocator(&glibc).as_deref(), Some("glibc malloc"));
        let tikv = stack(StackKind::Mmap, &[("mmap", LIBC), ("_rjem_je_pages_map", "/srv/app"), ("main", "/srv/app")]);
        assert_eq!(mapped_by_allocator(&tikv).as_deref(), Some("_rjem_je_pages_map"));
        let own = stack(StackKind::Mmap, &[("mmap64", LIBC), ("map_buffers", "/srv/app"), ("main", "/srv/app")]);
        assert_eq!(mapped_by_allocator(&own), None);
        let py = stack(
            StackKind::Mmap,
            &[("mmap64", LIBC), ("_PyObject_ArenaMmap", "/usr/bin/python3.11"), ("malloc", LIBC)],
        );
        assert_eq!(mapped_by_allocator(&py), None, "a runtime's heap is the runtime rules' business");
        assert_eq!(mapped_by_allocator(&Stack { kind: StackKind::Fault, ..je }), None);
    }
}
