//! Which objects are the C library or the dynamic loader, by file name: the one predicate the
//! analysis (runtime rules: a frame in libc is no culprit) and the agent (`exit` for the teardown
//! probe, launched commands' libc, another malloc than libc's, glibc's `main_arena` for
//! `--reachability`) read. Each takes a path or a bare file name (the last `/` component is
//! looked at).
//!
//! Names: glibc's `libc.so.6` (older glibc: `libc-2.NN.so`), musl's `libc.musl-ARCH.so.1` and
//! `ld-musl-ARCH.so.1` (musl's libc is its own dynamic loader), glibc's loader
//! `ld-linux-ARCH.so.N`.

/// The last path component of `path` (`path` itself without a `/`).
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// glibc's C library: `libc.so*` or `libc-VERSION.so`.
pub fn is_glibc(path: &str) -> bool {
    let name = file_name(path);
    name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
}

/// musl's C library (which is also its dynamic loader): `libc.musl-*` or `ld-musl-*`.
pub fn is_musl(path: &str) -> bool {
    let name = file_name(path);
    name.starts_with("libc.musl") || name.starts_with("ld-musl")
}

/// The C library, glibc's or musl's.
pub fn is_libc(path: &str) -> bool {
    is_glibc(path) || is_musl(path)
}

/// A dynamic loader: glibc's `ld-linux-*`, or musl's (its libc).
pub fn is_loader(path: &str) -> bool {
    let name = file_name(path);
    name.starts_with("ld-linux") || name.starts_with("ld-musl")
}

/// A system library: the C library or the dynamic loader.
pub fn is_system_library(path: &str) -> bool {
    is_libc(path) || is_loader(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_glibc_musl_and_the_loaders() {
        assert!(is_glibc("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_glibc("/lib/x86_64-linux-gnu/libc-2.31.so"));
        assert!(!is_glibc("/usr/lib/libc-client.so.2007e"), "UW IMAP's c-client is not glibc");
        assert!(is_musl("/lib/ld-musl-x86_64.so.1") && is_musl("/lib/libc.musl-x86_64.so.1"));
        assert!(is_libc("libc.so.6") && is_libc("/lib/ld-musl-x86_64.so.1") && !is_libc("/lib64/ld-linux-x86-64.so.2"));
        assert!(is_loader("/lib64/ld-linux-x86-64.so.2") && is_loader("ld-musl-x86_64.so.1"));
        assert!(is_system_library("/lib64/ld-linux-x86-64.so.2") && is_system_library("libc.so.6"));
        assert!(!is_system_library("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"));
        assert!(!is_system_library("/usr/lib/x86_64-linux-gnu/libcrypto.so.3"), "libc prefix without a dot");
    }
}
