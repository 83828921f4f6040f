//! `record --pod NAME [--namespace NS] [--container NAME]`: the processes of a Kubernetes pod
//! on this node, found without the API server.
//!
//! 1. Every process's cgroup (/proc/PID/cgroup) is matched against the kubelet's layouts: the
//!    systemd driver (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID>.slice/
//!    cri-containerd-<ID>.scope`, `crio-<ID>.scope`, `docker-<ID>.scope`; UID with '_' for '-';
//!    Guaranteed pods directly under `kubepods.slice`) and the cgroupfs driver
//!    (`/kubepods/burstable/pod<UID>/<ID>`, `/kubepods/pod<UID>/<ID>`). That gives the pod UID
//!    and the container ID of each process.
//! 2. Each container's name, pod name and namespace come from the runtime itself through the
//!    CRI (`ListPodSandbox`, `ListContainers` on its socket: `$LEAKTRACE_CRI_SOCKET`, else
//!    containerd's, k3s's or CRI-O's usual one; see [`crate::cri`]), which also says which
//!    containers are sandboxes. Failing that, from the runtime's OCI config
//!    (annotations `io.kubernetes.cri.sandbox-name`/`-namespace`/`container-name` of containerd,
//!    `io.kubernetes.pod.name`/`.namespace`/`io.kubernetes.container.name` of CRI-O and docker's
//!    labels), read from [`CONFIG_PATHS`] (and the templates in `$LEAKTRACE_CRI_CONFIG`,
//!    colon-separated, `{id}` standing for the container ID: e.g. another containerd root).
//!    Without one, the pod name is the process's `HOSTNAME` (/proc/PID/environ: the runtime
//!    sets it to the hostname the kubelet gives a pod with its own network, its name or
//!    `spec.hostname`; a hostNetwork pod gets none, and its HOSTNAME is the node's name)
//!    and the namespace the service account's
//!    (/var/run/secrets/kubernetes.io/serviceaccount/namespace inside the process's root, read
//!    through [`crate::target_fs`]: its links resolve in that root, never to a host file).
//! 3. `--pod` matches the pod name or its UID; `--namespace` the namespace; `--container` the
//!    container name. Sandbox ("pause") containers are left out. No match, or a name found in
//!    several namespaces without `--namespace`, is a one-line error naming what there is.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Where runtimes keep a container's config (with `{id}` for the container ID), tried in order:
/// containerd (kubeadm, k3s), CRI-O, docker.
pub const CONFIG_PATHS: &[&str] = &[
    "/run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
    "/run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
    "/run/containers/storage/overlay-containers/{id}/userdata/config.json",
    "/var/lib/containers/storage/overlay-containers/{id}/userdata/config.json",
    "/var/lib/docker/containers/{id}/config.v2.json",
];

/// The `--pod` options of `record` (flattened into its arguments). `--container NAME` (an
/// option `record` already has for container IDs) names a container of the pod when `--pod` is
/// given.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PodArgs {
    /// Trace the processes of this Kubernetes pod on this node (pod name or UID), found from the
    /// kubelet's cgroups and the container runtime's state, without the API server. With
    /// --container NAME: only that container of the pod.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["command", "pid", "cgroup"])]
    pub pod: Option<String>,
    /// Namespace of --pod (needed when pods of that name run in several namespaces).
    #[arg(long, value_name = "NS", requires = "pod")]
    pub namespace: Option<String>,
    /// The container runtime's CRI socket, asked first for the pods' names (else
    /// $LEAKTRACE_CRI_SOCKET, then containerd's, k3s's and CRI-O's usual sockets).
    #[arg(long, value_name = "PATH", requires = "pod")]
    pub cri_socket: Option<std::path::PathBuf>,
}

/// Which pod (and container) to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSelector {
    /// Pod name or UID.
    pub pod: String,
    pub namespace: Option<String>,
    /// Container name within the pod.
    pub container: Option<String>,
}

/// Where a process sits in the kubelet's cgroup tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeCgroup {
    /// Pod UID with dashes (`0b1c...-...`).
    pub pod_uid: String,
    /// Container ID (hex), when the process is in a container's cgroup.
    pub container_id: Option<String>,
    /// "containerd", "cri-o", "docker" or "" (cgroupfs driver: not in the name).
    pub runtime: &'static str,
}

/// Parse one cgroup path (`/kubepods.slice/...`) into its pod UID and container ID. None when
/// it is not a pod's cgroup.
pub fn parse_kube_cgroup(path: &str) -> Option<KubeCgroup> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let start = segs.iter().position(|s| *s == "kubepods" || *s == "kubepods.slice")?;
    let mut uid = None;
    let mut rest = &segs[start + 1..];
    while let Some((seg, tail)) = rest.split_first() {
        rest = tail;
        // systemd: kubepods-pod<UID>.slice, kubepods-burstable-pod<UID>.slice
        if let Some(s) = seg.strip_suffix(".slice")
            && let Some(i) = s.rfind("-pod")
        {
            uid = Some(s[i + 4..].replace('_', "-"));
            break;
        }
        // cgroupfs: pod<UID>
        if let Some(u) = seg.strip_prefix("pod")
            && u.len() >= 32
        {
            uid = Some(u.to_string());
            break;
        }
    }
    let pod_uid = uid.filter(|u| u.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))?;
    let (container_id, runtime) = match rest.first() {
        Some(seg) => {
            let s = seg.strip_suffix(".scope").unwrap_or(seg);
            let (id, rt) = if let Some(id) = s.strip_prefix("cri-containerd-") {
                (id, "containerd")
            } else if s.starts_with("crio-conmon-") {
                // CRI-O's monitor process, not the container.
                return Some(KubeCgroup { pod_uid, container_id: None, runtime: "cri-o" });
            } else if let Some(id) = s.strip_prefix("crio-") {
                (id, "cri-o")
            } else if let Some(id) = s.strip_prefix("docker-") {
                (id, "docker")
            } else {
                (s, "")
            };
            let ok = id.len() >= 12 && id.chars().all(|c| c.is_ascii_hexdigit());
            (ok.then(|| id.to_string()), rt)
        }
        None => (None, ""),
    };
    Some(KubeCgroup { pod_uid, container_id, runtime })
}

/// The pod cgroup of a process from its /proc/PID/cgroup (`ID:CONTROLLERS:PATH` lines: the v1
/// hierarchies' and cgroup2's `0::PATH`), the first line that is a pod's.
pub fn kube_cgroup_of(proc_cgroup: &str) -> Option<KubeCgroup> {
    proc_cgroup.lines().filter_map(|l| l.splitn(3, ':').nth(2)).find_map(parse_kube_cgroup)
}

/// What is known of a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Identity {
    pod: Option<String>,
    namespace: Option<String>,
    container: Option<String>,
    sandbox: bool,
}

/// The identity in a runtime's config file (OCI `annotations`, or docker's `Config.Labels`).
fn identity_from_config(text: &str) -> Option<Identity> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let maps = [v.get("annotations"), v.pointer("/Config/Labels")];
    let get = |keys: &[&str]| -> Option<String> {
        maps.iter()
            .flatten()
            .find_map(|m| keys.iter().find_map(|k| m.get(*k).and_then(|x| x.as_str()).map(str::to_string)))
    };
    let pod = get(&["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"]);
    let namespace = get(&["io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"]);
    let container = get(&["io.kubernetes.cri.container-name", "io.kubernetes.container.name"]);
    let kind =
        get(&["io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType", "io.kubernetes.docker.type"]);
    if pod.is_none() && namespace.is_none() && container.is_none() {
        return None;
    }
    let sandbox = kind.as_deref() == Some("sandbox")
        || kind.as_deref() == Some("podsandbox")
        || container.as_deref() == Some("POD");
    Some(Identity { pod, namespace, container, sandbox })
}

/// Config path templates: `$LEAKTRACE_CRI_CONFIG` first, then [`CONFIG_PATHS`].
fn config_templates() -> Vec<String> {
    let mut t: Vec<String> = std::env::var("LEAKTRACE_CRI_CONFIG")
        .map(|v| v.split(':').filter(|s| s.contains("{id}")).map(str::to_string).collect())
        .unwrap_or_default();
    t.extend(CONFIG_PATHS.iter().map(|s| s.to_string()));
    t
}

fn container_identity(id: &str, templates: &[String]) -> Option<Identity> {
    templates
        .iter()
        .filter_map(|t| std::fs::read_to_string(t.replace("{id}", id)).ok())
        .find_map(|text| identity_from_config(&text))
}

/// The service account's namespace file, as a pod's container sees it.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Identity of a process from its own environment and root: HOSTNAME and the service account's
/// namespace. Sandbox: its command is `pause`.
fn process_identity(pid: u32) -> Identity {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let pod = env
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"HOSTNAME="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| !v.is_empty());
    // Inside the process's root (a projected volume's `namespace -> ..data/namespace` link
    // resolves there, never to a host file), a regular file of at most 4 KiB.
    let namespace = crate::target_fs::read_to_string(
        pid,
        std::path::Path::new(SERVICE_ACCOUNT_NAMESPACE),
        crate::target_fs::Links::InRoot,
        crate::target_fs::caps::NAMESPACE,
    )
    .ok()
    .map(|s| s.trim().to_string())
    .filter(|s| !s.is_empty());
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    Identity { pod, namespace, container: None, sandbox: comm.trim() == "pause" }
}

/// One process of a pod, as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodProcess {
    pub pid: u32,
    pub pod_uid: String,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub container: Option<String>,
    pub container_id: Option<String>,
    /// How its pod was named: "the CRI at SOCKET", "the runtime's config.json" or "the
    /// process's HOSTNAME".
    pub found_by: String,
}

/// Every process of every pod on this node (sandboxes left out), from /proc.
pub fn pod_processes() -> Vec<PodProcess> {
    let templates = config_templates();
    let cri = crate::cri::query();
    let mut by_container: HashMap<String, Option<Identity>> = HashMap::new();
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(cg) = std::fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        let Some(kc) = kube_cgroup_of(&cg) else {
            continue;
        };
        let Some(cid) = kc.container_id.clone() else {
            continue;
        };
        if let Some(v) = &cri {
            if v.sandboxes.contains(&cid) {
                continue;
            }
            if let Some(c) = v.containers.get(&cid) {
                out.push(PodProcess {
                    pid,
                    pod_uid: kc.pod_uid,
                    pod: Some(c.pod.clone()),
                    namespace: Some(c.namespace.clone()),
                    container: Some(c.container.clone()),
                    container_id: Some(cid),
                    found_by: format!("the CRI at {}", v.socket.display()),
                });
                continue;
            }
        }
        let from_config =
            by_container.entry(cid.clone()).or_insert_with(|| container_identity(&cid, &templates)).clone();
        let own = process_identity(pid);
        let found_by =
            if from_config.is_some() { "the runtime's config.json" } else { "the process's HOSTNAME" }.to_string();
        let id = match from_config {
            Some(c) => Identity {
                pod: c.pod.or(own.pod),
                namespace: c.namespace.or(own.namespace),
                container: c.container,
                sandbox: c.sandbox || own.sandbox,
            },
            None => own,
        };
        if id.sandbox {
            continue;
        }
        out.push(PodProcess {
            pid,
            pod_uid: kc.pod_uid,
            pod: id.pod,
            namespace: id.namespace,
            container: id.container,
            container_id: Some(cid),
            found_by,
        });
    }
    out.sort_by_key(|p| p.pid);
    out
}

/// The PIDs `sel` selects among `procs`. Errors (one line each): no pod of that name or UID
/// (naming the pods found), a name in several namespaces without --namespace, no such
/// container (naming the pod's containers), or a container name asked for where the runtime's
/// state does not give names.
pub fn select(procs: &[PodProcess], sel: &PodSelector) -> anyhow::Result<Vec<u32>> {
    let wanted = |p: &PodProcess| p.pod.as_deref() == Some(sel.pod.as_str()) || p.pod_uid == sel.pod;
    let in_ns = |p: &PodProcess| sel.namespace.as_ref().is_none_or(|ns| p.namespace.as_ref() == Some(ns));
    let matching: Vec<&PodProcess> = procs.iter().filter(|p| wanted(p) && in_ns(p)).collect();
    if matching.is_empty() {
        let pods: BTreeSet<String> = procs
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.namespace.as_deref().unwrap_or("?"),
                    p.pod.clone().unwrap_or_else(|| format!("pod{}", p.pod_uid))
                )
            })
            .collect();
        let ns = sel.namespace.as_ref().map(|n| format!(" in namespace {n}")).unwrap_or_default();
        let found = if pods.is_empty() {
            "no pod processes were found on this node (kubelet cgroups under /sys/fs/cgroup/kubepods*)".to_string()
        } else {
            format!("pods on this node: {}", pods.into_iter().collect::<Vec<_>>().join(", "))
        };
        let hint = if procs.iter().any(|p| p.found_by.starts_with("the CRI")) {
            String::new()
        } else {
            format!(
                " (no CRI socket answered: give the runtime's socket with --cri-socket or LEAKTRACE_CRI_SOCKET, tried {}; \
                 or LEAKTRACE_CRI_CONFIG to its config.json paths; without either a pod is named by its \
                 processes' HOSTNAME, which for a hostNetwork pod is the node's name)",
                crate::cri::socket_candidates().iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            )
        };
        anyhow::bail!("no pod {}{ns} on this node; {found}{hint}", sel.pod);
    }
    let uids: BTreeMap<&str, Option<&str>> =
        matching.iter().map(|p| (p.pod_uid.as_str(), p.namespace.as_deref())).collect();
    if uids.len() > 1 {
        let list: Vec<String> =
            uids.iter().map(|(u, ns)| format!("{} (UID {u})", ns.unwrap_or("namespace unknown"))).collect();
        anyhow::bail!(
            "pod {} is ambiguous: {} pods match ({}); give --namespace NS or the pod UID",
            sel.pod,
            uids.len(),
            list.join(", ")
        );
    }
    let Some(c) = &sel.container else {
        return Ok(matching.iter().map(|p| p.pid).collect());
    };
    let names: BTreeSet<&str> = matching.iter().filter_map(|p| p.container.as_deref()).collect();
    if names.is_empty() {
        anyhow::bail!(
            "pod {}: the container runtime's state gives no container names here (looked in {}), so --container {c} cannot be matched; trace the whole pod or use --container with a container ID without --pod",
            sel.pod,
            CONFIG_PATHS.join(", ")
        );
    }
    let pids: Vec<u32> =
        matching.iter().filter(|p| p.container.as_deref() == Some(c.as_str())).map(|p| p.pid).collect();
    if pids.is_empty() {
        anyhow::bail!(
            "pod {} has no container {c}; its containers: {}",
            sel.pod,
            names.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    Ok(pids)
}

/// Resolve `sel` on this node: [`pod_processes`] then [`select`].
pub fn resolve(sel: &PodSelector) -> anyhow::Result<Vec<u32>> {
    select(&pod_processes(), sel)
}

/// [`resolve`], and say on stderr which PIDs were found and how the pod was named (through
/// the CRI, the runtime's config.json or the processes' HOSTNAME).
pub fn resolve_and_tell(sel: &PodSelector) -> anyhow::Result<Vec<u32>> {
    let procs = pod_processes();
    let pids = select(&procs, sel)?;
    let ways: BTreeSet<&str> = procs.iter().filter(|p| pids.contains(&p.pid)).map(|p| p.found_by.as_str()).collect();
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    crate::note!(
        "leaktrace: pod {}: PID {} (pod named through {})",
        sel.pod,
        list.join(", "),
        ways.into_iter().collect::<Vec<_>>().join(" and ")
    );
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
    const CID: &str = "4f5e6d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899a";

    #[test]
    fn kubelet_layouts() {
        let u = UID.replace('-', "_");
        for (path, rt) in [
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope"
                ),
                "containerd",
            ),
            (format!("/kubepods.slice/kubepods-pod{u}.slice/crio-{CID}.scope"), "cri-o"),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/docker-{CID}.scope"
                ),
                "docker",
            ),
            (format!("/kubepods/burstable/pod{UID}/{CID}"), ""),
            (format!("/kubepods/pod{UID}/{CID}"), ""),
        ] {
            let k = parse_kube_cgroup(&path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!(k.pod_uid, UID, "{path}");
            assert_eq!(k.container_id.as_deref(), Some(CID), "{path}");
            assert_eq!(k.runtime, rt, "{path}");
        }
        // Seen from inside another cgroup namespace.
        let other_ns =
            parse_kube_cgroup(&format!("/../../kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{CID}.scope"))
                .unwrap();
        assert_eq!((other_ns.pod_uid.as_str(), other_ns.container_id.as_deref()), (UID, Some(CID)));
        let pod_only = parse_kube_cgroup(&format!("/kubepods/besteffort/pod{UID}")).unwrap();
        assert_eq!(pod_only.container_id, None);
        let conmon =
            parse_kube_cgroup(&format!("/kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{CID}.scope")).unwrap();
        assert_eq!(conmon.container_id, None);
        assert!(parse_kube_cgroup("/system.slice/docker-abc.scope").is_none());
        assert!(parse_kube_cgroup("/user.slice/user-0.slice").is_none());
        assert!(parse_kube_cgroup("/kubepods.slice/kubepods-burstable.slice").is_none());
    }

    /// /proc/PID/cgroup of containers on systemd-driver nodes, as the kernel writes it: a
    /// hybrid host (v1 controllers, systemd's named hierarchy, cgroup2's `0::`) with containerd,
    /// a cgroup2-only host with CRI-O (its `container` sub-cgroup under the scope), and
    /// systemd's own cgroups, which are no pod's.
    #[test]
    fn systemd_driver_proc_cgroup_files() {
        let u = UID.replace('-', "_");
        let hybrid = format!(
            "12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n\
             11:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n\
             1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n\
             0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n"
        );
        let k = kube_cgroup_of(&hybrid).unwrap();
        assert_eq!((k.pod_uid.as_str(), k.container_id.as_deref(), k.runtime), (UID, Some(CID), "containerd"));
        // Guaranteed (no QoS slice), CRI-O on cgroup2 only, the process in the scope's sub-cgroup.
        let crio = format!("0::/kubepods.slice/kubepods-pod{u}.slice/crio-{CID}.scope/container\n");
        let k = kube_cgroup_of(&crio).unwrap();
        assert_eq!((k.pod_uid.as_str(), k.container_id.as_deref(), k.runtime), (UID, Some(CID), "cri-o"));
        // The kubelet and containerd themselves, a user session: no pod.
        let system = "12:memory:/system.slice/kubelet.service\n1:name=systemd:/system.slice/containerd.service\n\
                      0::/system.slice/containerd.service\n";
        assert_eq!(kube_cgroup_of(system), None);
        assert_eq!(kube_cgroup_of("0::/user.slice/user-1000.slice/session-3.scope\n"), None);
        // The pod's slice itself (a process there is in no container).
        let k =
            kube_cgroup_of(&format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice\n"))
                .unwrap();
        assert_eq!((k.pod_uid.as_str(), k.container_id), (UID, None));
    }

    #[test]
    fn configs() {
        let containerd = r#"{"annotations":{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-name":"web-7d9","io.kubernetes.cri.sandbox-namespace":"shop","io.kubernetes.cri.container-name":"app"}}"#;
        assert_eq!(
            identity_from_config(containerd).unwrap(),
            Identity {
                pod: Some("web-7d9".into()),
                namespace: Some("shop".into()),
                container: Some("app".into()),
                sandbox: false
            }
        );
        let sandbox = r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri.sandbox-name":"web-7d9"}}"#;
        assert!(identity_from_config(sandbox).unwrap().sandbox);
        let crio = r#"{"annotations":{"io.kubernetes.pod.name":"db-0","io.kubernetes.pod.namespace":"data","io.kubernetes.container.name":"postgres","io.kubernetes.cri-o.ContainerType":"container"}}"#;
        let i = identity_from_config(crio).unwrap();
        assert_eq!(
            (i.pod.as_deref(), i.namespace.as_deref(), i.container.as_deref()),
            (Some("db-0"), Some("data"), Some("postgres"))
        );
        let docker = r#"{"Config":{"Labels":{"io.kubernetes.pod.name":"x","io.kubernetes.pod.namespace":"y","io.kubernetes.container.name":"POD"}}}"#;
        assert!(identity_from_config(docker).unwrap().sandbox);
        assert!(identity_from_config(r#"{"annotations":{}}"#).is_none());
    }

    fn proc(pid: u32, uid: &str, pod: &str, ns: Option<&str>, c: Option<&str>) -> PodProcess {
        PodProcess {
            pid,
            pod_uid: uid.into(),
            pod: Some(pod.into()),
            namespace: ns.map(Into::into),
            container: c.map(Into::into),
            container_id: Some("ab".repeat(32)),
            found_by: "the runtime's config.json".into(),
        }
    }

    #[test]
    fn selecting() {
        let procs = vec![
            proc(10, "u1", "web", Some("shop"), Some("app")),
            proc(11, "u1", "web", Some("shop"), Some("sidecar")),
            proc(20, "u2", "web", Some("test"), Some("app")),
            proc(30, "u3", "db", None, None),
        ];
        let sel = |pod: &str, ns: Option<&str>, c: Option<&str>| PodSelector {
            pod: pod.into(),
            namespace: ns.map(Into::into),
            container: c.map(Into::into),
        };
        assert_eq!(select(&procs, &sel("web", Some("shop"), None)).unwrap(), vec![10, 11]);
        assert_eq!(select(&procs, &sel("web", Some("shop"), Some("sidecar"))).unwrap(), vec![11]);
        assert_eq!(select(&procs, &sel("u2", None, None)).unwrap(), vec![20]);
        assert_eq!(select(&procs, &sel("db", None, None)).unwrap(), vec![30]);
        let e = select(&procs, &sel("web", None, None)).unwrap_err().to_string();
        assert!(e.contains("ambiguous") && e.contains("shop (UID u1)") && e.contains("test (UID u2)"), "{e}");
        let e = select(&procs, &sel("api", None, None)).unwrap_err().to_string();
        assert!(
            e.starts_with("no pod api on this node; pods on this node: ?/db, shop/web, test/web (no CRI socket"),
            "{e}"
        );
        assert!(e.contains("LEAKTRACE_CRI_SOCKET") && e.contains("hostNetwork pod is the node's name"), "{e}");
        // Pods named through the CRI: the socket answered, no hint.
        let mut cri = procs.clone();
        cri[0].found_by = "the CRI at /run/containerd/containerd.sock".into();
        let e = select(&cri, &sel("api", None, None)).unwrap_err().to_string();
        assert_eq!(e, "no pod api on this node; pods on this node: ?/db, shop/web, test/web");
        let e = select(&procs, &sel("web", Some("shop"), Some("nginx"))).unwrap_err().to_string();
        assert_eq!(e, "pod web has no container nginx; its containers: app, sidecar");
        let e = select(&procs, &sel("db", None, Some("x"))).unwrap_err().to_string();
        assert!(e.contains("gives no container names"), "{e}");
        let e = select(&[], &sel("x", None, None)).unwrap_err().to_string();
        assert!(e.contains("no pod processes were found"), "{e}");
    }
}
