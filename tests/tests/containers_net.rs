//! Pods with their own network namespace on a real container runtime: Debian's containerd 1.6
//! started by the test (tests/src/containerd.rs) with a CNI bridge of its own (tests/src/cni.rs:
//! Debian's bridge, host-local and loopback plugins; no gateway, no masquerade, a private
//! subnet), pods made through the CRI as the kubelet makes them (tests/src/cri.rs).
//!
//! A leaker pod with its own network (an address on the bridge, its name as its hostname, the
//! service account's namespace file mounted as the kubelet mounts it) beside a hostNetwork pod:
//! `record --pod` finds the first through the CRI, and without a CRI socket by its processes'
//! `HOSTNAME`; the hostNetwork pod's `HOSTNAME` is the node's name, so without the CRI it is
//! not found by its name. The test takes its containerd down and asserts that no bridge, veth,
//! network namespace, containerd, shim or cgroup of it is left.
#![allow(clippy::print_stderr, reason = "the test tells its measured figures on stderr (shown with --nocapture)")]
use std::path::Path;

use leaktrace_tests::*;

const LEAKER_IMAGE: &str = "docker.io/leaktrace/leaker:test";
/// `leaky malloc ITERATIONS RATE`: 1000 B leaked in leak_malloc per iteration, 200 per second.
const LEAK_RATE_PER_S: f64 = 200.0;

/// The value of `key` in /proc/PID/environ.
fn env_of(pid: u32, key: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let prefix = format!("{key}=");
    env.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

fn netns(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).map(|p| p.display().to_string()).unwrap_or_default()
}

#[test]
fn pod_with_its_own_network_found_by_record_pod() {
    require_root();
    let ctrd = Containerd::with_network();
    let bridge = ctrd.bridge.clone().expect("a bridge network");
    ctrd.import(&Image {
        name: LEAKER_IMAGE.into(),
        files: vec![(static_fixture("leaky.c"), "/leaky".into())],
        dirs: vec![],
        entrypoint: vec!["/leaky".into()],
    });
    // The service account's namespace, mounted where the kubelet mounts its projected volume.
    let sa = ctrd.dir.join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("namespace"), "team-n").unwrap();
    let me = std::process::id();
    let pod = |name: &str, own_network: bool| {
        let p = ctrd.run_pod(&PodSpec {
            name: name.into(),
            namespace: "team-n".into(),
            uid: pod_uid(name),
            host_pid: false,
            own_network,
            containers: vec![ContainerSpec {
                name: "app".into(),
                image: LEAKER_IMAGE.into(),
                args: vec!["malloc".into(), "100000".into(), format!("{LEAK_RATE_PER_S}")],
                mounts: vec![(sa.clone(), "/var/run/secrets/kubernetes.io/serviceaccount".into(), true)],
                ..Default::default()
            }],
        });
        eprintln!("pod {name} (own network: {own_network}) made through the CRI in {:.2} s", p.seconds);
        let pid = p.container("app").1;
        (p, pid)
    };
    let name = format!("net-{me}");
    let host_name = format!("hostnet-{me}");
    let (_own, pid) = pod(&name, true);
    let (_host, host_pid) = pod(&host_name, false);

    // Its own network namespace, with an address on the bridge's subnet; the other pod the host's.
    assert_ne!(netns(&pid.to_string()), netns("self"), "the pod shares the host's network namespace");
    assert_eq!(netns(&host_pid.to_string()), netns("self"), "the hostNetwork pod has a network namespace of its own");
    let o = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n", "ip", "-o", "-4", "addr", "show"])
        .output()
        .expect("run nsenter");
    let addrs = String::from_utf8_lossy(&o.stdout).into_owned();
    let net_prefix = bridge.subnet.trim_end_matches("0/24");
    assert!(addrs.contains(&format!("inet {net_prefix}")), "no address in {} in the pod:\n{addrs}", bridge.subnet);
    let ports = bridge.ports();
    assert_eq!(ports.len(), 1, "one veth on the bridge {}: {ports:?}", bridge.name);

    // The hostname the kubelet gives: the pod's name with its own network, the node's without.
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert_eq!(env_of(pid, "HOSTNAME").as_deref(), Some(name.as_str()));
    assert_eq!(env_of(host_pid, "HOSTNAME").as_deref(), Some(node.as_str()));

    let record = |args: &[&str], socket: Option<&Path>| {
        let out = OutDir::new("net-pod");
        let mut cmd = leaktrace(["record", "--interval", "250ms", "--duration", "2s", "--out"]);
        cmd.arg(&out.path).args(args).env_remove("LEAKTRACE_CRI_CONFIG");
        match socket {
            Some(s) => cmd.env("LEAKTRACE_CRI_SOCKET", s),
            None => cmd.env("LEAKTRACE_CRI_SOCKET", "/nonexistent/cri.sock"),
        };
        (run(cmd, None, TIMEOUT), out)
    };
    let selector = ["--pod", name.as_str(), "--namespace", "team-n"];
    for (socket, how) in [
        (Some(ctrd.socket.as_path()), format!("the CRI at {}", ctrd.socket.display())),
        (None, "the process's HOSTNAME".to_string()),
    ] {
        let (o, out) = record(&selector, socket);
        o.assert_success();
        assert!(o.stderr.contains(&format!("PID {pid} (pod named through {how})")), "found how?\n{}", o.describe());
        let r = Report::load(&out.path);
        assert_eq!(u64_of(r.get(&["target"]), "pid"), pid as u64, "{}", o.describe());
        let leak = r.site("leak_malloc");
        assert_eq!(str_of(leak, "class"), "leak", "{}", r.summary());
    }
    // The hostNetwork pod without the CRI: its HOSTNAME is the node's name.
    let (o, _) = record(&["--pod", &host_name, "--namespace", "team-n"], None);
    let err = assert_error(&o, &["LEAKTRACE_CRI_SOCKET", "hostNetwork", "HOSTNAME"]);
    assert!(err.contains(&format!("team-n/{node}")), "the hostNetwork pod is not listed by the node's name: {err}");

    let left = ctrd.shutdown();
    assert!(left.is_empty(), "left behind: {left:#?}");
    let links = ip(&["-o", "link", "show"]);
    for dev in std::iter::once(&bridge.name).chain(&ports) {
        assert!(
            !links.contains(&format!(": {dev}:")) && !links.contains(&format!(": {dev}@")),
            "{dev} is left:\n{links}"
        );
    }
}
