//! The binary and the machine.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Path of the leaktrace binary under test.
pub fn leaktrace_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("LEAKTRACE_BIN") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "LEAKTRACE_BIN={} does not exist: run `cargo xtask test`", p.display());
            return p;
        }
        // The test binary is <target>/<profile>/deps/<name>-<hash>.
        let exe = std::env::current_exe().expect("current_exe");
        let mut candidates = Vec::new();
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            candidates.push(profile_dir.join("leaktrace"));
            if let Some(target) = profile_dir.parent() {
                candidates.push(target.join("release/leaktrace"));
                candidates.push(target.join("debug/leaktrace"));
            }
        }
        candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
            panic!(
                "the leaktrace binary was not found (LEAKTRACE_BIN is not set and there is no \
                 target/release/leaktrace or target/debug/leaktrace): run the end-to-end tests with \
                 `cargo xtask test`, which builds it"
            )
        })
    })
}

/// The end-to-end tests load eBPF for real: fail (never skip) when not root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the end-to-end tests must run as root (they load eBPF programs and attach uprobes): run \
         `cargo xtask test` as root"
    );
}
