//! Cgroups made the way a kubelet makes them, for the `--pod` tests (pod.rs, watch_pod.rs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::*;

/// Cgroup directories made for a test (removed in reverse order, only those it created) and
/// the processes put in them (killed).
#[derive(Default)]
pub struct KubeTree {
    made: Vec<PathBuf>,
    children: Vec<Child>,
}

impl KubeTree {
    /// Make `rel` (and its missing parents) under the cgroup v2 root.
    pub fn cgroup(&mut self, rel: &str) -> PathBuf {
        let mut p = cgroup2_mount().unwrap_or_else(|e| panic!("{e}"));
        for seg in rel.split('/') {
            p = p.join(seg);
            if !p.exists() {
                std::fs::create_dir(&p).unwrap_or_else(|e| panic!("cannot create {}: {e}", p.display()));
                self.made.push(p.clone());
            }
        }
        p
    }

    /// Start `cmd` and move it into the cgroup `dir`; its PID.
    pub fn start_in(&mut self, dir: &Path, mut cmd: Command) -> u32 {
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
        let pid = child.id();
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("cannot move {pid} into {}: {e}", dir.display()));
        self.children.push(child);
        pid
    }

    /// Kill and reap the process `pid` started here.
    pub fn stop(&mut self, pid: u32) {
        for c in self.children.iter_mut().filter(|c| c.id() == pid) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for KubeTree {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in self.made.iter().rev() {
            let _ = wait_for(Duration::from_secs(5), || std::fs::remove_dir(d).ok());
        }
    }
}
