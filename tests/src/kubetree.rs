//! Cgroups made the way a kubelet makes them, and the container runtime's config.json that names
//! a container's pod, for the `--pod` tests (pod.rs, watch_pod.rs, watch_push.rs, watch_node.rs).

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

    /// Make the cgroup of container `cid` of pod `uid` as the kubelet's systemd driver names it
    /// (a burstable pod, containerd's scope).
    pub fn systemd_container(&mut self, uid: &str, cid: &str) -> PathBuf {
        let pod_dir =
            format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", uid.replace('-', "_"));
        self.cgroup(&format!("{pod_dir}/cri-containerd-{cid}.scope"))
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

/// Write `cri/CID/config.json` as containerd writes it for a container: the annotations that
/// name its pod `pod`, namespace `ns` and container `container` (what `--pod` resolves through
/// `LEAKTRACE_CRI_CONFIG`).
pub fn write_cri_config(cri: &Path, cid: &str, pod: &str, ns: &str, container: &str) {
    let dir = cri.join(cid);
    std::fs::create_dir_all(&dir).expect("create the runtime config directory");
    std::fs::write(
        dir.join("config.json"),
        format!(
            r#"{{"annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-name":"{pod}","io.kubernetes.cri.sandbox-namespace":"{ns}","io.kubernetes.cri.container-name":"{container}"}}}}"#
        ),
    )
    .expect("write config.json");
}
