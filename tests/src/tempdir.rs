//! Temporary directories.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// This test binary's temporary directory (created once, unique per process).
pub fn temp_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("leaktrace-tests-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        dir
    })
}

/// A not-yet-existing directory for one recording (`--out`). Removed when dropped if the test
/// passed; kept (and its path printed) when it failed.
pub struct OutDir {
    pub path: PathBuf,
}

impl OutDir {
    pub fn new(name: &str) -> OutDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        OutDir { path: temp_root().join(format!("out-{name}-{n}")) }
    }
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("recording kept for inspection: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
