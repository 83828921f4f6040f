//! A memory cgroup with a limit for one test (the OOM tests of hostile.rs and watch_oom.rs).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A memory cgroup for one test, removed when dropped (after its processes are gone).
pub struct MemCgroup {
    /// The cgroup's directory.
    pub dir: PathBuf,
}

impl MemCgroup {
    /// A child cgroup with `limit` bytes of memory and no swap: under the cgroup v2 root when
    /// it has the memory controller, else under cgroup v1's memory hierarchy.
    pub fn new(name: &str, limit: u64) -> MemCgroup {
        let v2 = Path::new("/sys/fs/cgroup");
        let v2_memory = std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
        let (dir, limit_file, swap_file) = if v2_memory {
            (v2.join(name), "memory.max", "memory.swap.max")
        } else {
            let v1 = Path::new("/sys/fs/cgroup/memory");
            assert!(
                v1.join("memory.limit_in_bytes").exists(),
                "no memory cgroup controller (cgroup v2 with memory in /sys/fs/cgroup/cgroup.subtree_control, or v1 \
                 at /sys/fs/cgroup/memory): this test needs one"
            );
            (v1.join(name), "memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        };
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        let cg = MemCgroup { dir };
        std::fs::write(cg.dir.join(limit_file), limit.to_string()).expect("set the memory limit");
        if v2_memory {
            let _ = std::fs::write(cg.dir.join(swap_file), "0");
        } else if cg.dir.join(swap_file).exists() {
            let _ = std::fs::write(cg.dir.join(swap_file), limit.to_string());
        }
        cg
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("could not remove cgroup {}", self.dir.display());
    }
}
