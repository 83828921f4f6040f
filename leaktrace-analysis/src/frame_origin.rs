//! Whose code a frame is, by its function and object names alone: an allocator's, system or
//! standard-library code, a managed runtime's own object. The culprit rules (analyze/frames.rs)
//! and the runtime rules (runtimes/) both read these; they depend on neither.

use crate::allocator_frames::is_allocator_frame;
use crate::recording::Frame;

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
