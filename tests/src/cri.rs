//! Pods made through the CRI the way the kubelet makes them (`tests/fixtures/cri.py` speaks the
//! gRPC): RunPodSandbox with the kubelet's labels (`io.kubernetes.pod.{name,namespace,uid}`)
//! and cgroup parent (`/kubepods/<qos>/pod<uid>`, cgroupfs driver), then CreateContainer and
//! StartContainer for each container. Pods use the host's network (no CNI) and get no
//! hostname, as the kubelet does for hostNetwork pods; with `own_network` (a containerd
//! started `with_network`) a pod has its own network namespace on the CNI bridge and its name
//! as its hostname, as the kubelet gives it.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::*;

/// One container of a pod.
#[derive(Clone, Default)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// (host path, container path, read-only)
    pub mounts: Vec<(PathBuf, String, bool)>,
    /// `linux.security_context` (LinuxContainerSecurityContext, protobuf JSON); the pod's
    /// namespace options are added to it.
    pub security: Value,
    /// `linux.resources.memory_limit_in_bytes` (the pod is then Burstable).
    pub memory_limit: Option<u64>,
}

/// A pod to make.
#[derive(Default)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The host's PID namespace for every container (hostPID).
    pub host_pid: bool,
    /// Its own network namespace (CNI) instead of the host's (hostNetwork).
    pub own_network: bool,
    pub containers: Vec<ContainerSpec>,
}

/// A running pod.
#[derive(Debug)]
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub sandbox: String,
    /// (container name, container ID, host PID of its first process)
    pub containers: Vec<(String, String, u32)>,
    /// How long RunPodSandbox + Create/StartContainer took.
    pub seconds: f64,
}

impl Pod {
    pub fn container(&self, name: &str) -> (&str, u32) {
        let c = self.containers.iter().find(|c| c.0 == name).unwrap_or_else(|| panic!("no container {name}"));
        (&c.1, c.2)
    }
    /// PID of the sandbox's pause process.
    pub fn sandbox_pid(&self, ctrd: &Containerd) -> u32 {
        let s = ctrd.cri(
            "call",
            &json!({"method": "PodSandboxStatus", "request": {"pod_sandbox_id": self.sandbox, "verbose": true}}),
        );
        let info: Value = serde_json::from_str(s["info"]["info"].as_str().unwrap_or("{}")).unwrap_or_default();
        info["pid"].as_u64().unwrap_or(0) as u32
    }
}

/// A UID for a pod in the kubelet's 8-4-4-4-12 form, unique in this test binary.
pub fn pod_uid(seed: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325 ^ std::process::id() as u64;
    for b in seed.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    let x = format!("{h:016x}{:016x}", h.rotate_left(29) ^ 0x5bd1e9955bd1e995);
    format!("{}-{}-{}-{}-{}", &x[..8], &x[8..12], &x[12..16], &x[16..20], &x[20..32])
}

impl Containerd {
    /// Make `spec` through the CRI; panics with containerd's log when it fails.
    pub fn run_pod(&self, spec: &PodSpec) -> Pod {
        let qos = if spec.containers.iter().any(|c| c.memory_limit.is_some()) { "burstable" } else { "besteffort" };
        let cgroup_parent = format!("/kubepods/{qos}/pod{}", spec.uid);
        self.track_cgroup(cgroup_parent.trim_start_matches('/').to_string());
        let labels = json!({
            "io.kubernetes.pod.name": spec.name,
            "io.kubernetes.pod.namespace": spec.namespace,
            "io.kubernetes.pod.uid": spec.uid,
        });
        let pid_ns = if spec.host_pid { "NODE" } else { "CONTAINER" };
        let net_ns = if spec.own_network { "POD" } else { "NODE" };
        let log_dir = self.dir.join("logs").join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        std::fs::create_dir_all(&log_dir).unwrap();
        let mut sandbox = json!({
            "metadata": {"name": spec.name, "namespace": spec.namespace, "uid": spec.uid, "attempt": 0},
            "log_directory": log_dir,
            "labels": labels,
            "annotations": {"kubernetes.io/config.source": "api"},
            "linux": {
                "cgroup_parent": cgroup_parent,
                "security_context": {"namespace_options": {
                    "network": net_ns, "pid": if spec.host_pid { "NODE" } else { "POD" }, "ipc": "POD"}},
            },
        });
        if spec.own_network {
            // The kubelet's hostname for a pod with its own network: its name.
            sandbox["hostname"] = json!(spec.name);
        }
        let containers: Vec<Value> = spec
            .containers
            .iter()
            .map(|c| {
                let mut sc = if c.security.is_object() { c.security.clone() } else { json!({}) };
                sc["namespace_options"] = json!({"network": net_ns, "pid": pid_ns, "ipc": "POD"});
                let mut linux = json!({"security_context": sc});
                if let Some(limit) = c.memory_limit {
                    linux["resources"] = json!({"memory_limit_in_bytes": limit});
                }
                let mut l = labels.clone();
                l["io.kubernetes.container.name"] = json!(c.name);
                json!({
                    "metadata": {"name": c.name, "attempt": 0},
                    "image": {"image": c.image},
                    "command": c.command,
                    "args": c.args,
                    "envs": c.env.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
                    "mounts": c.mounts.iter().map(|(h, p, ro)| json!({"host_path": h, "container_path": p, "readonly": ro})).collect::<Vec<_>>(),
                    "labels": l,
                    "log_path": format!("{}/0.log", c.name),
                    "linux": linux,
                })
            })
            .collect();
        let r = self.cri("run_pod", &json!({"sandbox": sandbox, "containers": containers}));
        self.note_shim_sockets();
        let ids: Vec<(String, String, u32)> = spec
            .containers
            .iter()
            .zip(r["containers"].as_array().unwrap())
            .map(|(c, v)| {
                (c.name.clone(), v["id"].as_str().unwrap().to_string(), v["pid"].as_u64().unwrap_or(0) as u32)
            })
            .collect();
        Pod {
            name: spec.name.clone(),
            namespace: spec.namespace.clone(),
            uid: spec.uid.clone(),
            sandbox: r["sandbox"].as_str().unwrap().to_string(),
            containers: ids,
            seconds: r["seconds"].as_f64().unwrap_or(0.0),
        }
    }

    /// The container's state (CONTAINER_RUNNING, CONTAINER_EXITED...) and exit code.
    pub fn container_state(&self, id: &str) -> (String, i64) {
        let s = self.cri("status", &json!({"container": id}));
        (s["state"].as_str().unwrap_or("").to_string(), s["exitCode"].as_i64().unwrap_or(-1))
    }

    /// Wait until container `id` has exited; its exit code (None on timeout).
    pub fn wait_exit(&self, id: &str, timeout: Duration) -> Option<i64> {
        wait_for(timeout, || {
            let (state, code) = self.container_state(id);
            (state == "CONTAINER_EXITED").then_some(code)
        })
    }

    /// The container's log (CRI log format: "TIME STREAM P|F LINE"), as its lines.
    pub fn container_log(&self, pod: &Pod, container: &str) -> String {
        let f = self
            .dir
            .join("logs")
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
            .join(format!("{container}/0.log"));
        std::fs::read_to_string(&f)
            .unwrap_or_default()
            .lines()
            .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stop and remove a pod (StopPodSandbox, RemovePodSandbox).
    pub fn remove_pod(&self, pod: &Pod) {
        for method in ["StopPodSandbox", "RemovePodSandbox"] {
            self.cri("call", &json!({"method": method, "request": {"pod_sandbox_id": pod.sandbox}}));
        }
    }
}
