//! `record --pod NAME [--namespace NS] [--container NAME]`, on cgroups made the way a kubelet
//! makes them, with real processes in them:
//!
//! - pod A, systemd driver (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID>.slice/
//!   cri-containerd-<ID>.scope`), containerd's config annotations (pod `web-N` in namespace
//!   `shop`): container `app` (leaky, 1000 B leaked per iteration in leak_malloc), container
//!   `sidecar` (sleep) and the sandbox (sleep, container-type sandbox: never traced);
//! - pod B, cgroupfs driver (`kubepods/burstable/pod<UID>/<ID>`), no runtime config: its name
//!   is the process's HOSTNAME, also `web-N`, namespace unknown.
use std::path::Path;
use std::process::Command;

use leaktrace_tests::*;

/// A 32-hex-digit UID in the 8-4-4-4-12 form, and a 64-hex-digit container ID, from `seed`.
fn uid(seed: u64) -> String {
    let h = format!("{:016x}{:016x}", seed.wrapping_mul(0x9e3779b97f4a7c15), seed ^ 0x5bd1e995);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}
fn cid(seed: u64) -> String {
    format!("{:016x}", seed.wrapping_mul(0xff51afd7ed558ccd)).repeat(4)
}

/// containerd's config.json with the CRI annotations.
fn write_config(dir: &Path, id: &str, pod: &str, ns: &str, container: &str, kind: &str) {
    let d = dir.join(id);
    std::fs::create_dir_all(&d).unwrap();
    let json = format!(
        r#"{{"ociVersion":"1.1.0","annotations":{{"io.kubernetes.cri.container-type":"{kind}","io.kubernetes.cri.sandbox-name":"{pod}","io.kubernetes.cri.sandbox-namespace":"{ns}","io.kubernetes.cri.container-name":"{container}"}}}}"#
    );
    std::fs::write(d.join("config.json"), json).unwrap();
}

fn leaky() -> Command {
    let mut c = Command::new(&fixtures().leaky);
    c.args(["malloc", "100000", "200"]);
    c
}

fn sleep() -> Command {
    let mut c = Command::new("sleep");
    c.arg("600");
    c
}

/// `leaktrace record --duration 2s --out OUT ARGS...` with the test's runtime config path.
fn record(out: &OutDir, cri: &Path, args: &[&str]) -> Output {
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--duration", "2s", "--out"]);
    cmd.arg(&out.path).args(args);
    cmd.env("LEAKTRACE_CRI_CONFIG", format!("{}/{{id}}/config.json", cri.display()));
    run(cmd, None, TIMEOUT)
}

#[test]
fn pod_by_name_namespace_container_and_uid() {
    require_root();
    let seed = std::process::id() as u64 * 1000 + 7;
    let pod_name = format!("web-{}", std::process::id());
    let cri = temp_root().join(format!("cri-{seed}"));
    let mut tree = KubeTree::default();

    // Pod A: systemd driver, containerd.
    let (uid_a, app, side, sandbox) = (uid(seed), cid(seed + 1), cid(seed + 2), cid(seed + 3));
    let pod_a =
        format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", uid_a.replace('-', "_"));
    let app_dir = tree.cgroup(&format!("{pod_a}/cri-containerd-{app}.scope"));
    let side_dir = tree.cgroup(&format!("{pod_a}/cri-containerd-{side}.scope"));
    let sandbox_dir = tree.cgroup(&format!("{pod_a}/cri-containerd-{sandbox}.scope"));
    write_config(&cri, &app, &pod_name, "shop", "app", "container");
    write_config(&cri, &side, &pod_name, "shop", "sidecar", "container");
    write_config(&cri, &sandbox, &pod_name, "shop", "", "sandbox");
    let leaky_pid = tree.start_in(&app_dir, leaky());
    let side_pid = tree.start_in(&side_dir, sleep());
    let sandbox_pid = tree.start_in(&sandbox_dir, sleep());

    // Pod B: cgroupfs driver, no runtime config, HOSTNAME = the same pod name.
    let (uid_b, b_id) = (uid(seed + 10), cid(seed + 11));
    let b_dir = tree.cgroup(&format!("kubepods/burstable/pod{uid_b}/{b_id}"));
    let mut b = leaky();
    b.env("HOSTNAME", &pod_name);
    let b_pid = tree.start_in(&b_dir, b);
    let ctx = format!(
        "pod {pod_name}: A {uid_a} (app {leaky_pid}, sidecar {side_pid}, sandbox {sandbox_pid}), B {uid_b} ({b_pid})"
    );

    // The name alone is ambiguous: both pods are named so (B by its HOSTNAME).
    let out = OutDir::new("pod-ambiguous");
    let o = record(&out, &cri, &["--pod", &pod_name]);
    assert_eq!(o.code(), Some(2), "{ctx}\n{}", o.describe());
    let err = o.stderr.lines().find(|l| l.starts_with("leaktrace: error:")).unwrap_or_default();
    assert!(
        err.contains("is ambiguous")
            && err.contains(&format!("shop (UID {uid_a})"))
            && err.contains(&format!("namespace unknown (UID {uid_b})"))
            && err.contains("--namespace"),
        "{ctx}\n{}",
        o.describe()
    );

    // One container of pod A: the leak, in the process leaktrace found.
    let out = OutDir::new("pod-app");
    let o = record(&out, &cri, &["--pod", &pod_name, "--namespace", "shop", "--container", "app"]);
    o.assert_success();
    let r = Report::load(&out.path);
    assert_eq!(u64_of(r.get(&["target"]), "pid"), leaky_pid as u64, "{ctx}\n{}", o.describe());
    assert_eq!(str_of(r.site("leak_malloc"), "class"), "leak", "{ctx}\n{}", r.summary());
    assert!(u64_of(r.site("leak_malloc"), "live_bytes") > 0);

    // The whole of pod A: app and sidecar, never the sandbox.
    let out = OutDir::new("pod-all");
    let o = record(&out, &cri, &["--pod", &pod_name, "--namespace", "shop"]);
    o.assert_success();
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.file("summary.json")).expect("summary.json"))
            .expect("summary.json is JSON");
    let text = summary.to_string();
    for pid in [leaky_pid, side_pid] {
        assert!(out.path.join(format!("pid-{pid}")).is_dir(), "pid-{pid} missing\n{text}\n{ctx}");
    }
    assert!(!out.path.join(format!("pid-{sandbox_pid}")).exists(), "the sandbox was traced\n{ctx}");
    assert!(!out.path.join(format!("pid-{b_pid}")).exists(), "pod B was traced\n{ctx}");

    // Pod B by its UID (cgroupfs layout).
    let out = OutDir::new("pod-uid");
    let o = record(&out, &cri, &["--pod", &uid_b]);
    o.assert_success();
    let r = Report::load(&out.path);
    assert_eq!(u64_of(r.get(&["target"]), "pid"), b_pid as u64, "{ctx}\n{}", o.describe());

    // Clear one-line errors.
    let out = OutDir::new("pod-errors");
    for (args, wanted) in [
        (vec!["--pod", "no-such-pod"], "no pod no-such-pod on this node; pods on this node: ".to_string()),
        (
            vec!["--pod", pod_name.as_str(), "--namespace", "shop", "--container", "nginx"],
            "has no container nginx; its containers: app, sidecar".to_string(),
        ),
        (vec!["--pod", pod_name.as_str(), "--namespace", "prod"], format!("no pod {pod_name} in namespace prod")),
    ] {
        let o = record(&out, &cri, &args);
        assert_eq!(o.code(), Some(2), "{args:?}\n{}", o.describe());
        let errs: Vec<&str> = o.stderr.lines().filter(|l| l.starts_with("leaktrace: error:")).collect();
        assert_eq!(errs.len(), 1, "{args:?}\n{}", o.describe());
        assert!(errs[0].contains(&wanted), "{args:?}: no {wanted:?}\n{}", o.describe());
        assert!(!out.path.exists(), "an error left an output directory\n{}", o.describe());
    }
    assert!(std::fs::read_to_string(format!("/proc/{leaky_pid}/status")).is_ok(), "the pod's process must still run");
}
