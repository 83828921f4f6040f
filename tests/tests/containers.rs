//! leaktrace with a real container runtime: Debian's containerd 1.6 and runc 1.1, started by
//! the test on a private socket (tests/src/containerd.rs), pods made through the CRI as the
//! kubelet makes them (tests/src/cri.rs), images written from files (a static pause, the static
//! `leaky` fixture, leaktrace's own image from the release binary).
//!
//! - The agent in its own container made from deploy/leaktrace-daemonset.yaml's own values
//!   (read from the YAML: hostPID, its securityContext, its volume mounts), running
//!   deploy/leaktrace-job.yaml's `record --pod NAME --namespace NS` against a leaking pod; the
//!   Job has exactly the DaemonSet's rights (`the_jobs_rights_are_the_daemonsets`).
//! - `record --pod` on the host, finding pods through the CRI (a BestEffort and a Burstable pod
//!   of the same name in two namespaces, with a memory limit), and its error without it.
//! - `watch` in the agent's container, with the manifest's args (shorter windows), over a
//!   leaking pod and a warming cache pod: the leaker escalated and labelled with its pod in the
//!   metrics on the node's loopback and in the profiles it pushes to a store on the loopback,
//!   the cache never called a leak, also once its pod is deleted and made again mid-run.
//! - `watch` in the agent's container over a pod that the OOM killer takes at its CRI memory
//!   limit: the OOM-time report.
//! - The agent on the host with exactly the manifest's capabilities as its bounding set
//!   (`setpriv`).
//!
//! Pods with their own network namespace: tests/tests/containers_net.rs.
//!
//! Each test takes its containerd down and asserts that no containerd, shim, mount, cgroup,
//! shim socket or network device of it is left.
#![allow(clippy::print_stderr, reason = "the test tells its measured figures on stderr (shown with --nocapture)")]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use leaktrace_tests::pushserver::{Received, part, query_param, start_server};
use leaktrace_tests::*;
use serde_json::json;

const LEAKER_IMAGE: &str = "docker.io/leaktrace/leaker:test";
const PROBE_IMAGE: &str = "docker.io/leaktrace/probe:test";
const AGENT_IMAGE: &str = "docker.io/leaktrace/leaktrace:test";
/// `leaky malloc ITERATIONS RATE`: 1000 B leaked in leak_malloc per iteration, 200 per second.
const LEAK_RATE_PER_S: f64 = 200.0;

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The DaemonSet's pod template (`spec.template.spec`) and its one container.
fn daemonset() -> (Value, Value) {
    let m = yaml_file(&repo_file("deploy/leaktrace-daemonset.yaml"));
    let spec = m["spec"]["template"]["spec"].clone();
    let containers = spec["containers"].as_array().expect("the DaemonSet has containers");
    assert_eq!(containers.len(), 1, "the DaemonSet has one container");
    let c = containers[0].clone();
    (spec, c)
}

/// The Job's pod template (`spec.template.spec`) and its one container.
fn job() -> (Value, Value) {
    let m = yaml_file(&repo_file("deploy/leaktrace-job.yaml"));
    let spec = m["spec"]["template"]["spec"].clone();
    let containers = spec["containers"].as_array().expect("the Job has containers");
    assert_eq!(containers.len(), 1, "the Job has one container");
    let c = containers[0].clone();
    (spec, c)
}

/// The capabilities the manifest adds (after dropping ALL), as written there ("BPF", ...).
fn manifest_caps(c: &Value) -> Vec<String> {
    let caps = &c["securityContext"]["capabilities"];
    assert_eq!(caps["drop"], json!(["ALL"]), "the manifest drops ALL capabilities before adding its own");
    caps["add"].as_array().expect("capabilities.add").iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

/// Capability numbers (linux/capability.h) of the names the manifest may use.
fn cap_bit(name: &str) -> u32 {
    match name {
        "CHOWN" => 0,
        "DAC_OVERRIDE" => 1,
        "DAC_READ_SEARCH" => 2,
        "KILL" => 5,
        "SETUID" => 7,
        "NET_ADMIN" => 12,
        "IPC_LOCK" => 14,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "SYS_RESOURCE" => 24,
        "SYSLOG" => 34,
        "PERFMON" => 38,
        "BPF" => 39,
        "CHECKPOINT_RESTORE" => 40,
        other => panic!("capability {other} in the manifest: add it to this test's table"),
    }
}

/// The kubelet's translation of the container's securityContext into the CRI's
/// LinuxContainerSecurityContext. Any field this does not know fails the test, so the
/// manifest cannot change the agent's rights without the test following.
fn cri_security_context(c: &Value) -> Value {
    let sc = c["securityContext"].as_object().expect("the container has a securityContext");
    let mut out = json!({});
    for (k, v) in sc {
        match k.as_str() {
            "runAsUser" => out["run_as_user"] = json!({"value": v}),
            "privileged" => out["privileged"] = v.clone(),
            "allowPrivilegeEscalation" => out["no_new_privs"] = json!(!v.as_bool().unwrap()),
            "readOnlyRootFilesystem" => out["readonly_rootfs"] = v.clone(),
            "capabilities" => {
                out["capabilities"] = json!({"add_capabilities": v["add"], "drop_capabilities": v["drop"]})
            }
            "seccompProfile" => {
                assert_eq!(v["type"], "Unconfined", "seccompProfile: the test knows Unconfined");
                out["seccomp"] = json!({"profile_type": "Unconfined"});
            }
            "appArmorProfile" => {
                assert_eq!(v["type"], "Unconfined", "appArmorProfile: the test knows Unconfined");
                out["apparmor"] = json!({"profile_type": "Unconfined"});
                out["apparmor_profile"] = json!("unconfined");
            }
            other => panic!("securityContext.{other} in the manifest: translate it here as the kubelet does"),
        }
    }
    out
}

/// The container's volume mounts, hostPath volumes only: (host path, mount path, read-only).
/// The host paths that belong to the node's runtime are given this test's: /run/containerd is
/// the private containerd's state directory (what /run/containerd is on a node), the others
/// a directory of the test; the kernel's (/sys/...) are the host's own.
fn manifest_mounts(spec: &Value, c: &Value, ctrd: &Containerd) -> Vec<(PathBuf, String, bool)> {
    let volumes = spec["volumes"].as_array().expect("volumes");
    c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap();
            let vol = volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no volume {name}"));
            let host = vol["hostPath"]["path"].as_str().unwrap_or_else(|| panic!("volume {name} is not a hostPath"));
            let host = match host {
                "/run/containerd" => ctrd.state.clone(),
                "/run/containers" | "/var/tmp/leaktrace" => {
                    let d = ctrd.dir.join(host.trim_start_matches('/').replace('/', "_"));
                    std::fs::create_dir_all(&d).unwrap();
                    d
                }
                h if h.starts_with("/sys/") => PathBuf::from(h),
                other => panic!("hostPath {other}: say here what it is on this machine"),
            };
            (host, m["mountPath"].as_str().unwrap().to_string(), m["readOnly"].as_bool().unwrap_or(false))
        })
        .collect()
}

fn leaker_pod(ctrd: &Containerd, name: &str, namespace: &str, memory_limit: Option<u64>) -> Pod {
    let spec = PodSpec {
        name: name.into(),
        namespace: namespace.into(),
        uid: pod_uid(&format!("{namespace}/{name}")),
        host_pid: false,
        own_network: false,
        containers: vec![ContainerSpec {
            name: "app".into(),
            image: LEAKER_IMAGE.into(),
            args: vec!["malloc".into(), "100000".into(), format!("{LEAK_RATE_PER_S}")],
            memory_limit,
            ..Default::default()
        }],
    };
    let pod = ctrd.run_pod(&spec);
    eprintln!("pod {name} made through the CRI in {:.2} s: {pod:?}", pod.seconds);
    assert!(pod.seconds < 2.0, "a pod took {:.2} s to start (RunPodSandbox to StartContainer)", pod.seconds);
    pod
}

fn import_workload_images(ctrd: &Containerd) {
    ctrd.import(&Image {
        name: LEAKER_IMAGE.into(),
        files: vec![(static_fixture("leaky.c"), "/leaky".into())],
        dirs: vec![],
        entrypoint: vec!["/leaky".into()],
    });
    ctrd.import(&Image {
        name: PROBE_IMAGE.into(),
        files: vec![(static_fixture("map_files_probe.c"), "/map_files_probe".into())],
        dirs: vec![],
        entrypoint: vec!["/map_files_probe".into()],
    });
}

/// CapEff, CapBnd, NoNewPrivs and Seccomp of a process, from /proc/PID/status.
fn creds(pid: u32) -> (u64, u64, String, String) {
    creds_of(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
}

/// CapEff, CapBnd, NoNewPrivs and Seccomp from lines of /proc/PID/status.
fn creds_of(s: &str) -> (u64, u64, String, String) {
    let field =
        |k: &str| s.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_string()).unwrap_or_else(|| "?".into());
    let hex = |k: &str| u64::from_str_radix(&field(k), 16).unwrap_or(u64::MAX);
    (hex("CapEff:"), hex("CapBnd:"), field("NoNewPrivs:"), field("Seccomp:"))
}

#[test]
fn agent_in_the_daemonsets_container_records_a_pod() {
    require_root();
    let (spec, c) = daemonset();
    let caps = manifest_caps(&c);
    let mask: u64 = caps.iter().map(|n| 1u64 << cap_bit(n)).sum();
    assert_eq!(spec["hostPID"], true, "the DaemonSet sees the node's processes by their host PIDs");
    assert_eq!(c["securityContext"]["runAsUser"], 0);
    assert_eq!(c["securityContext"]["privileged"], false);

    let ctrd = Containerd::start();
    import_workload_images(&ctrd);
    let t0 = Instant::now();
    ctrd.import(&leaktrace_image(AGENT_IMAGE));
    eprintln!("leaktrace's image imported in {:.1} s", t0.elapsed().as_secs_f64());

    let name = format!("leaker-{}", std::process::id());
    let leaker = leaker_pod(&ctrd, &name, "team-a", None);
    let (_, leaker_pid) = leaker.container("app");
    let pause_pid = leaker.sandbox_pid(&ctrd);
    assert!(leaker_pid > 0 && pause_pid > 0, "{leaker:?}");

    // The agent's pod, from the manifest's values; its args the Job's one-off recording
    // (the Job has the same rights: `the_jobs_rights_are_the_daemonsets`), POD and NAMESPACE
    // set, its duration and interval shorter, its output directory /out/rec.
    let job_args: Vec<String> =
        job().1["args"].as_array().expect("the Job's args").iter().map(|a| a.as_str().unwrap().to_string()).collect();
    let args: Vec<String> = job_args
        .iter()
        .map(|a| match a.as_str() {
            "POD" => name.clone(),
            "NAMESPACE" => "team-a".into(),
            "10m" => "4s".into(),
            "5s" => "250ms".into(),
            "/out/POD" => "/out/rec".into(),
            other => other.to_string(),
        })
        .collect();
    for placeholder in ["POD", "NAMESPACE", "10m", "5s", "/out/POD"] {
        assert!(job_args.iter().any(|a| a == placeholder), "the Job's args changed ({job_args:?}): set them here");
    }
    let mounts = manifest_mounts(&spec, &c, &ctrd);
    let out_host = mounts.iter().find(|m| m.1 == "/out").expect("the manifest mounts /out").0.clone();
    let security = cri_security_context(&c);
    let agent = ctrd.run_pod(&PodSpec {
        name: "leaktrace-node".into(),
        namespace: "kube-system".into(),
        uid: pod_uid("agent"),
        host_pid: true,
        own_network: false,
        containers: vec![
            ContainerSpec {
                name: "leaktrace".into(),
                image: AGENT_IMAGE.into(),
                args,
                mounts: mounts.clone(),
                security: security.clone(),
                ..Default::default()
            },
            ContainerSpec {
                name: "probe".into(),
                image: PROBE_IMAGE.into(),
                args: vec![leaker_pid.to_string()],
                mounts,
                security,
                ..Default::default()
            },
        ],
    });
    let (agent_id, agent_pid) = agent.container("leaktrace");
    let agent_creds = creds(agent_pid);
    let ctx = format!("leaker {leaker_pid} (pause {pause_pid}), agent {agent_pid}, manifest caps {caps:?}");
    // With them, the targets' /proc/PID/map_files entries open (the agent reads mapped files
    // through them).
    let probe_code = ctrd.wait_exit(agent.container("probe").0, Duration::from_secs(30));
    let probe_log = ctrd.container_log(&agent, "probe");
    let probe_creds = creds_of(&probe_log);

    // The agent runs with exactly the manifest's rights.
    for (who, (eff, bnd, nnp, seccomp)) in [("agent", agent_creds), ("probe", probe_creds)] {
        assert_eq!(eff, mask, "{who}'s effective capabilities are not the manifest's ({eff:x} != {mask:x})\n{ctx}");
        assert_eq!(bnd, mask, "{who}'s bounding set is not the manifest's ({bnd:x} != {mask:x})\n{ctx}");
        assert_eq!(nnp, "1", "{who}: no_new_privs (allowPrivilegeEscalation: false)\n{ctx}");
        assert_eq!(seccomp, "0", "{who}: seccomp Unconfined\n{ctx}");
    }
    assert_eq!(
        probe_code,
        Some(0),
        "/proc/{leaker_pid}/map_files with the manifest's capabilities: {probe_log}\n{ctx}"
    );

    let code = ctrd.wait_exit(agent_id, TIMEOUT);
    let log = ctrd.container_log(&agent, "leaktrace");
    assert_eq!(code, Some(0), "the agent's container exited with {code:?}\n{log}\n{ctx}\n{}", ctrd.log_tail());
    assert!(
        log.contains(&format!("PID {leaker_pid} (pod named through the CRI at /run/containerd/containerd.sock)")),
        "the agent says it found the pod through the CRI socket the manifest mounts\n{log}"
    );

    // One process traced: the leaker, not the pause sandbox.
    let rec = out_host.join("rec");
    let r = Report::load(&rec);
    let rctx = format!("{ctx}\n{log}\n{}", r.summary());
    assert_eq!(u64_of(r.get(&["target"]), "pid"), leaker_pid as u64, "{rctx}");
    assert!(!rec.join(format!("pid-{pause_pid}")).exists(), "the pause sandbox was traced\n{rctx}");
    let leak = r.site("leak_malloc");
    assert_eq!(str_of(leak, "class"), "leak", "{rctx}");
    // 200 iterations/s × 1000 B: the rate within 20 %.
    assert_within(
        "leak_malloc growth_bytes_per_s",
        f64_of(leak, "growth_bytes_per_s"),
        LEAK_RATE_PER_S * LEAK_BYTES as f64,
        0.20,
        &rctx,
    );
    assert_culprit_frames(leak, "leak_malloc", "leaky.c", &["run_workload", "main"], &rctx);

    let left = ctrd.shutdown();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// deploy/leaktrace-job.yaml (a one-off `record --pod`) has exactly the DaemonSet's rights:
/// hostPID, the securityContext, the volume mounts and their host paths; and it is not
/// privileged. The agent's rights are those the container tests run it with.
#[test]
fn the_jobs_rights_are_the_daemonsets() {
    let (ds_spec, ds) = daemonset();
    let (job_spec, job) = job();
    assert_eq!(job_spec["hostPID"], true, "the Job sees the node's processes by their host PIDs");
    assert_eq!(job["securityContext"], ds["securityContext"], "the Job's securityContext is not the DaemonSet's");
    assert_eq!(job["securityContext"]["privileged"], false);
    assert_eq!(job["volumeMounts"], ds["volumeMounts"], "the Job's volume mounts are not the DaemonSet's");
    assert_eq!(job_spec["volumes"], ds_spec["volumes"], "the Job's volumes are not the DaemonSet's");
    for k in ["hostIPC", "shareProcessNamespace", "hostUsers"] {
        assert_eq!(job_spec[k], ds_spec[k], "{k}");
    }
    assert_eq!(job["args"][0], "record", "the Job records");
}

/// `record --pod NAME --namespace NS [--container C]` on the host finds CRI pods through the
/// runtime's socket ($LEAKTRACE_CRI_SOCKET) and says so; without a socket that answers, the
/// error names the variable and the hostNetwork HOSTNAME caveat.
#[test]
fn record_pod_found_through_the_cri() {
    require_root();
    let ctrd = Containerd::start();
    import_workload_images(&ctrd);
    let name = format!("web-{}", std::process::id());
    let best_effort = leaker_pod(&ctrd, &name, "team-a", None);
    let burstable = leaker_pod(&ctrd, &name, "team-b", Some(256 << 20));
    let (be_pid, bu_pid) = (best_effort.container("app").1, burstable.container("app").1);
    let cg = std::fs::read_to_string(format!("/proc/{bu_pid}/cgroup")).unwrap_or_default();
    assert!(cg.contains(&format!("/kubepods/burstable/pod{}/", burstable.uid)), "{cg}");
    let socket = ctrd.socket.display().to_string();
    let record = |args: &[&str], socket: Option<&str>| {
        let out = OutDir::new("cri-pod");
        let mut cmd = leaktrace(["record", "--interval", "250ms", "--duration", "2s", "--out"]);
        cmd.arg(&out.path).args(args).env_remove("LEAKTRACE_CRI_CONFIG");
        match socket {
            // One pod through the flag, the other through the variable.
            Some(s) if args.contains(&"team-b") => cmd.args(["--cri-socket", s]),
            Some(s) => cmd.env("LEAKTRACE_CRI_SOCKET", s),
            None => cmd.env("LEAKTRACE_CRI_SOCKET", "/nonexistent/cri.sock"),
        };
        (run(cmd, None, TIMEOUT), out)
    };
    for (ns, pid, extra) in [("team-b", bu_pid, &["--container", "app"][..]), ("team-a", be_pid, &[][..])] {
        let mut args = vec!["--pod", name.as_str(), "--namespace", ns];
        args.extend_from_slice(extra);
        let (o, out) = record(&args, Some(&socket));
        o.assert_success();
        assert!(
            o.stderr.contains(&format!("PID {pid} (pod named through the CRI at {socket})")),
            "{ns}: found how?\n{}",
            o.describe()
        );
        let r = Report::load(&out.path);
        assert_eq!(u64_of(r.get(&["target"]), "pid"), pid as u64, "{ns}\n{}", o.describe());
        assert_eq!(str_of(r.site("leak_malloc"), "class"), "leak", "{ns}\n{}", r.summary());
    }
    // Without the runtime's socket: host-network pods' HOSTNAME is the node's name.
    let (o, _) = record(&["--pod", &name, "--namespace", "team-a"], None);
    let err =
        assert_error(&o, &["--cri-socket", "LEAKTRACE_CRI_SOCKET", "LEAKTRACE_CRI_CONFIG", "hostNetwork", "HOSTNAME"]);
    assert!(err.contains(&format!("no pod {name} in namespace team-a")), "{err}");

    let left = ctrd.shutdown();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// `watch` as the DaemonSet runs it (its container, its args with windows of seconds, its
/// loopback metrics address with a free port) over the BestEffort pods of this node.
#[test]
fn watch_in_the_daemonsets_container() {
    require_root();
    let (spec, c) = daemonset();
    let ctrd = Containerd::start();
    let growth = static_fixture("growth.c");
    ctrd.import(&Image {
        name: "docker.io/leaktrace/growth:test".into(),
        files: vec![(growth, "/growth".into())],
        dirs: vec![],
        entrypoint: vec!["/growth".into()],
    });
    ctrd.import(&leaktrace_image(AGENT_IMAGE));
    let me = std::process::id();
    let pod = |name: &str, uid_seed: &str, mode: &str| {
        let p = ctrd.run_pod(&PodSpec {
            name: name.into(),
            namespace: "team-a".into(),
            uid: pod_uid(uid_seed),
            host_pid: false,
            own_network: false,
            containers: vec![ContainerSpec {
                name: "app".into(),
                image: "docker.io/leaktrace/growth:test".into(),
                args: vec![mode.into(), "100000000".into(), "500".into()],
                ..Default::default()
            }],
        });
        let pid = p.container("app").1;
        (p, pid)
    };
    let cache_name = format!("cache-w{me}");
    let (_leaker, leaker_pid) = pod(&format!("leaker-w{me}"), "leaker", "leak-cache");
    let (cache, cache_pid) = pod(&cache_name, "cache-1", "cache");

    // The manifest's args, windows shortened, the metrics on its address with a free port.
    let port = free_port();
    let mut args: Vec<String> =
        c["args"].as_array().expect("args").iter().map(|a| a.as_str().unwrap().to_string()).collect();
    assert_eq!(args[0], "watch");
    for (flag, value) in [
        ("--window", "5s".to_string()),
        ("--escalate-for", "3s".to_string()),
        ("--metrics-listen", format!("127.0.0.1:{port}")),
    ] {
        let i = args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("the manifest has no {flag}"));
        if flag == "--metrics-listen" {
            assert!(
                args[i + 1].starts_with("127.0.0.1:"),
                "the metrics listen on the node's loopback: {}",
                args[i + 1]
            );
            assert_eq!(spec["hostNetwork"], true, "loopback metrics need hostNetwork");
        }
        args[i + 1] = value;
    }
    // The BestEffort pods' cgroup in the cgroup2 hierarchy (/sys/fs/cgroup/unified on this hybrid
    // host; the manifest mounts the host's /sys/fs/cgroup at the same place).
    let best_effort = cgroup2_mount().unwrap().join("kubepods/besteffort").display().to_string();
    args.extend(["--cgroup".into(), best_effort, "--interval".into(), "500ms".into()]);
    args.extend(["--duration".into(), "75s".into()]);
    // Its profiles pushed to a store on the node's loopback (the agent has the host's network).
    let (push_port, pushed) = start_server();
    args.extend(["--push".into(), format!("http://127.0.0.1:{push_port}"), "--push-interval".into(), "5s".into()]);
    let mounts = manifest_mounts(&spec, &c, &ctrd);
    let out_host = mounts.iter().find(|m| m.1 == "/out").expect("the manifest mounts /out").0.clone();
    let agent = ctrd.run_pod(&PodSpec {
        name: "leaktrace-node".into(),
        namespace: "kube-system".into(),
        uid: pod_uid("watch-agent"),
        host_pid: true,
        own_network: false,
        containers: vec![ContainerSpec {
            name: "leaktrace".into(),
            image: AGENT_IMAGE.into(),
            args,
            mounts,
            security: cri_security_context(&c),
            ..Default::default()
        }],
    });
    let labels = |pod: &str| format!("comm=\"growth\",pod=\"{pod}\",namespace=\"team-a\",container=\"app\"");
    let leak_verdict = format!(
        "leaktrace_process_verdict{{pid=\"{leaker_pid}\",{},verdict=\"leak\"}} 1",
        labels(&format!("leaker-w{me}"))
    );
    let cache_series = format!("leaktrace_process_verdict{{pid=\"{cache_pid}\",{}", labels(&format!("cache-w{me}")));
    let metrics = || http_get(port, "/metrics").filter(|(s, _)| s.contains("200")).map(|(_, b)| b);
    let m = wait_for(Duration::from_secs(90), || {
        metrics().filter(|m| m.contains(&leak_verdict) && m.contains(&cache_series))
    });
    let (agent_id, _) = agent.container("leaktrace");
    assert!(
        m.is_some(),
        "no leak verdict for the leaker with its pod labels ({leak_verdict}) or no cache series\n{:?}\n{}",
        metrics(),
        ctrd.container_log(&agent, "leaktrace")
    );
    let m = m.unwrap();
    let cache_line = m.lines().find(|l| l.starts_with(&cache_series)).unwrap_or_default().to_string();
    assert!(!cache_line.contains("verdict=\"leak\""), "the warming cache was called a leak: {cache_line}");

    // The cache pod deleted and made again (a new pod object of the same name: a new UID) while
    // watch runs: the new process appears with the pod's labels, the old one's series goes.
    ctrd.remove_pod(&cache);
    let (_cache2, cache2_pid) = pod(&cache_name, "cache-2", "cache");
    let cache2_series = format!("leaktrace_process_verdict{{pid=\"{cache2_pid}\",{}", labels(&cache_name));
    let m = wait_for(Duration::from_secs(60), || {
        metrics().filter(|m| m.contains(&cache2_series) && !m.contains(&cache_series))
    });
    assert!(
        m.is_some(),
        "the re-created pod's process {cache2_pid} is not there ({cache2_series}), or the old one {cache_pid} still is\n{:?}\n{}",
        metrics(),
        ctrd.container_log(&agent, "leaktrace")
    );
    let m = m.unwrap();
    let cache2_line = m.lines().find(|l| l.starts_with(&cache2_series)).unwrap_or_default().to_string();
    assert!(!cache2_line.contains("verdict=\"leak\""), "the re-created cache was called a leak: {cache2_line}");

    let code = ctrd.wait_exit(agent_id, TIMEOUT);
    let log = ctrd.container_log(&agent, "leaktrace");
    assert_eq!(code, Some(0), "watch exited with {code:?}\n{log}");
    let dir = out_host.join(format!("team-a_leaker-w{me}_app"));
    let reports: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("no report directory {}: {e}\n{log}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(reports.len(), 1, "one escalation: {reports:?}\n{log}");
    let r = Report::load(&reports[0]);
    let summary = str_of(r.get(&["verdict"]), "summary").to_string();
    assert!(summary.contains("leak_message holds"), "{summary}\n{log}");
    assert!(!out_host.join(format!("team-a_cache-w{me}_app")).exists(), "the cache was escalated\n{log}");
    let pushes = pushed.lock().unwrap().clone();
    assert_pushed_with_pod_labels(
        &pushes,
        &format!("leaker-w{me}"),
        leaker_pid,
        &[(&cache_name, cache_pid), (&cache_name, cache2_pid)],
        &out_host,
        &log,
    );

    let left = ctrd.shutdown();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// A Burstable pod with a 48 MiB memory limit (CRI linux resources) leaks 1 MiB a second
/// (hostile.c `oom`) until the OOM killer takes it; `watch` in the DaemonSet's container (its
/// args, 5 s windows, the pod's cgroup only) writes the OOM-time report naming leak_until_oom.
#[test]
fn watch_reports_a_pod_oom_killed_at_its_limit() {
    require_root();
    let (spec, c) = daemonset();
    let ctrd = Containerd::start();
    ctrd.import(&Image {
        name: "docker.io/leaktrace/hostile:test".into(),
        files: vec![(static_fixture("hostile.c"), "/hostile".into())],
        dirs: vec![],
        entrypoint: vec!["/hostile".into()],
    });
    ctrd.import(&leaktrace_image(AGENT_IMAGE));
    let name = format!("oom-{}", std::process::id());
    let pod = ctrd.run_pod(&PodSpec {
        name: name.clone(),
        namespace: "team-a".into(),
        uid: pod_uid(&name),
        host_pid: false,
        own_network: false,
        containers: vec![ContainerSpec {
            name: "app".into(),
            image: "docker.io/leaktrace/hostile:test".into(),
            args: vec!["oom".into(), "1000".into(), "1".into()],
            memory_limit: Some(48 << 20),
            ..Default::default()
        }],
    });
    let (app_id, app_pid) = pod.container("app");
    let mut args: Vec<String> =
        c["args"].as_array().expect("args").iter().map(|a| a.as_str().unwrap().to_string()).collect();
    for (flag, value) in [("--window", "5s".to_string()), ("--metrics-listen", format!("127.0.0.1:{}", free_port()))] {
        let i = args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("the manifest has no {flag}"));
        args[i + 1] = value;
    }
    let pod_cgroup = cgroup2_mount().unwrap().join(format!("kubepods/burstable/pod{}", pod.uid));
    args.extend(["--cgroup".into(), pod_cgroup.display().to_string(), "--interval".into(), "500ms".into()]);
    args.extend(["--duration".into(), "75s".into()]);
    let mounts = manifest_mounts(&spec, &c, &ctrd);
    let out_host = mounts.iter().find(|m| m.1 == "/out").expect("the manifest mounts /out").0.clone();
    let agent = ctrd.run_pod(&PodSpec {
        name: "leaktrace-node".into(),
        namespace: "kube-system".into(),
        uid: pod_uid("oom-agent"),
        host_pid: true,
        own_network: false,
        containers: vec![ContainerSpec {
            name: "leaktrace".into(),
            image: AGENT_IMAGE.into(),
            args,
            mounts,
            security: cri_security_context(&c),
            ..Default::default()
        }],
    });
    let code = ctrd.wait_exit(agent.container("leaktrace").0, TIMEOUT);
    let log = ctrd.container_log(&agent, "leaktrace");
    assert_eq!(code, Some(0), "watch exited with {code:?}\n{log}");
    let status = ctrd.cri("status", &json!({"container": app_id}));
    assert_eq!(status["reason"], "OOMKilled", "the runtime's view of the pod: {status}\n{log}");
    assert!(log.contains(&format!("PID {app_pid} was killed by the OOM killer")), "{log}");
    let dir = out_host.join(format!("team-a_{name}_app"));
    let oom: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("no report directory {}: {e}\n{log}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with("-oom")))
        .collect();
    assert_eq!(oom.len(), 1, "one OOM-time report: {oom:?}\n{log}");
    let md = std::fs::read_to_string(oom[0].join("oom.md")).expect("oom.md");
    assert!(md.contains("Memory cgroup limit: 48") && md.contains("leak_until_oom"), "{md}\n{log}");

    let left = ctrd.shutdown();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The manifest's capability claim, on the host: the agent with exactly the manifest's
/// capabilities as its bounding set (as root otherwise) records a leak, and opens the target's
/// map_files entries; without CAP_CHECKPOINT_RESTORE they do not open.
#[test]
fn the_daemonsets_capabilities_as_a_bounding_set() {
    require_root();
    let (_, c) = daemonset();
    let caps = manifest_caps(&c);
    let bounding = |caps: &[String]| {
        let mut s = String::from("--bounding-set=-all");
        for cap in caps {
            s.push_str(&format!(",+{}", cap.to_lowercase()));
        }
        s
    };
    let leaky = static_fixture("leaky.c");
    let mut target = Command::new(&leaky);
    target.args(["malloc", "100000", &format!("{LEAK_RATE_PER_S}")]).stdout(std::process::Stdio::null());
    let mut target = KillOnDrop(target.spawn().expect("start leaky"));
    let pid = target.0.id();

    let probe = |caps: &[String]| {
        Command::new("setpriv")
            .arg(bounding(caps))
            .arg("--")
            .arg(static_fixture("map_files_probe.c"))
            .arg(pid.to_string())
            .output()
            .expect("setpriv")
    };
    let o = probe(&caps);
    assert!(o.status.success(), "map_files with {caps:?}: {}", String::from_utf8_lossy(&o.stdout));
    let without: Vec<String> = caps.iter().filter(|c| *c != "CHECKPOINT_RESTORE").cloned().collect();
    let o = probe(&without);
    assert!(!o.status.success(), "map_files opened without CHECKPOINT_RESTORE: the manifest need not grant it");

    let out = OutDir::new("bounding-set");
    let mut cmd = Command::new("setpriv");
    cmd.arg(bounding(&caps)).arg("--").arg(leaktrace_bin());
    cmd.args(["record", "--interval", "250ms", "--duration", "3s", "--pid", &pid.to_string(), "--out"]).arg(&out.path);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    let r = Report::load(&out.path);
    let leak = r.site("leak_malloc");
    assert_eq!(str_of(leak, "class"), "leak", "{}", r.summary());
    assert_within(
        "leak_malloc growth_bytes_per_s",
        f64_of(leak, "growth_bytes_per_s"),
        LEAK_RATE_PER_S * LEAK_BYTES as f64,
        0.20,
        &format!("{}\n{}", o.describe(), r.summary()),
    );
    let _ = target.0.kill();
}

/// What `watch --push` sent (`pushes`, decoded by the real `go tool pprof`): the leaker's
/// profiles are named with its pod, namespace and container, and its growth profile's samples
/// carry the `leak` class; each cache process is pushed with its own pod's labels, never the
/// leaker's, and no sample of its profiles is classed a leak. The growth-mode stacks of this
/// static fixture charge its pages to glibc's `_int_malloc` (first touch), so the growth profile
/// does not name leak_message; the exact window's profile, pushed once with `window=exact`, does,
/// and only the leaker is escalated.
fn assert_pushed_with_pod_labels(
    pushes: &[Received],
    leaker: &str,
    leaker_pid: u32,
    caches: &[(&str, u32)],
    dir: &Path,
    log: &str,
) {
    let ctx = format!("{} push(es): {:?}\n{log}", pushes.len(), pushes.iter().map(|g| &g.target).collect::<Vec<_>>());
    let name = |pod: &str, pid: u32| format!("growth{{pod={pod},namespace=team-a,container=app,pid={pid}}}");
    let of = |pod: &str, pid: u32| -> Vec<&Received> {
        pushes.iter().filter(|g| g.status == 200 && query_param(&g.target, "name") == Some(name(pod, pid))).collect()
    };
    // Every push of a growth process (the pods' sandboxes, `pause`, are watched and pushed too)
    // names its own pod: the labels follow the PID, also across the cache pod's re-creation.
    for g in pushes.iter().filter(|g| g.status == 200) {
        let n = query_param(&g.target, "name").unwrap_or_default();
        if !n.starts_with("growth{") || n.contains("window=exact") {
            continue;
        }
        let known =
            std::iter::once((leaker, leaker_pid)).chain(caches.iter().copied()).any(|(p, pid)| n == name(p, pid));
        assert!(known, "a push not named with its own pod's labels: {n}\n{ctx}");
    }
    let is_growth = |g: &Received| {
        String::from_utf8_lossy(part(g, "sample_type_config").unwrap_or_default()).contains("growth_space")
    };
    // The `class` labels of a pushed growth profile's samples (`go tool pprof -traces`).
    let classes = |g: &Received, file: &str| -> (Vec<String>, String) {
        let file = dir.join(file);
        std::fs::write(&file, part(g, "profile").expect("profile part")).unwrap();
        let traces = go_pprof(&["-traces"], &[&file]);
        let c = traces.lines().filter_map(|l| l.trim().strip_prefix("class:")).map(|c| c.trim().to_string()).collect();
        (c, traces)
    };
    let leaks: Vec<&Received> = of(leaker, leaker_pid).into_iter().filter(|g| is_growth(g)).collect();
    assert!(
        leaks.len() >= 2,
        "the leaker's growth profile pushed every --push-interval: {} push(es)\n{ctx}",
        leaks.len()
    );
    let (c, traces) = classes(leaks[leaks.len() - 1], "pushed-leaker-growth.pb.gz");
    eprintln!("the leaker's last pushed growth profile:\n{traces}");
    assert!(c.iter().any(|c| c == "leak"), "the leaker's pushed growth has no sample classed a leak:\n{traces}\n{ctx}");
    let mut cache_pushes = 0;
    for (i, (pod, pid)) in caches.iter().enumerate() {
        assert!(!of(pod, *pid).is_empty(), "no push named with cache {pod} (PID {pid})'s labels\n{ctx}");
        // A growth profile only when its cache grew in a window's steady part (while warming).
        for g in of(pod, *pid).into_iter().filter(|g| is_growth(g)) {
            cache_pushes += 1;
            let (c, traces) = classes(g, &format!("pushed-cache-{i}.pb.gz"));
            assert!(!c.iter().any(|c| c == "leak"), "cache {pod} (PID {pid}) pushed as a leak:\n{traces}\n{ctx}");
        }
    }
    eprintln!("{} growth push(es) of the leaker, {cache_pushes} of the cache pods", leaks.len());
    // The exact window: pushed for the leaker alone, with its pod's labels, naming leak_message.
    let exact_name = format!("growth{{window=exact,pod={leaker},namespace=team-a,container=app,pid={leaker_pid}}}");
    let exact: Vec<&Received> = pushes
        .iter()
        .filter(|g| g.status == 200 && query_param(&g.target, "name").is_some_and(|n| n.contains("window=exact")))
        .collect();
    assert!(!exact.is_empty(), "no exact window pushed (named {exact_name})\n{ctx}");
    for g in &exact {
        assert_eq!(query_param(&g.target, "name").unwrap_or_default(), exact_name, "{ctx}");
    }
    let heap = exact.iter().find(|g| !is_growth(g)).expect("the exact window's heap profile");
    let file = dir.join("pushed-leaker-exact.pb.gz");
    std::fs::write(&file, part(heap, "profile").expect("profile part")).unwrap();
    let top = go_pprof(&["-top", "-sample_index=inuse_space"], &[&file]);
    eprintln!("the leaker's pushed exact window:\n{top}");
    assert!(top.contains("leak_message"), "the pushed exact window does not name leak_message:\n{top}\n{ctx}");
}

struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
