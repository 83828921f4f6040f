//! `leaktrace watch --push URL` (issues 34 and 29): each watched process's growth profile is
//! pushed periodically with its pod labels. A pod made as a kubelet makes it (systemd driver,
//! containerd's config annotations: pod `web-p<PID>` in namespace `shop`, container `app`) runs
//! a leaker (growth.c `leak-cache`, 600,000 B/s through leak_message); `watch --pod` pushes to a
//! small HTTP server on the loopback (`leaktrace_tests::pushserver`, 503 to the first request).
//! The pushes carry the pod, namespace and container in Pyroscope's application name, and the
//! growth profile, decoded by the real `go tool pprof`, holds leak_message.
#![allow(clippy::print_stderr, reason = "the test tells its measured figures on stderr (shown with --nocapture)")]
use std::process::Command;

use leaktrace_tests::pushserver::{Received, part, query_param, start_server};
use leaktrace_tests::*;

#[test]
fn watch_pushes_growth_profiles_with_pod_labels() {
    require_root();
    let me = std::process::id() as u64;
    let pod = format!("web-p{me}");
    let (uid, cid) = (format!("{:08x}-4444-5555-6666-{:012x}", me, me), format!("{:016x}", me * 37).repeat(4));
    let cri = temp_root().join(format!("cri-watch-push-{me}"));
    std::fs::create_dir_all(cri.join(&cid)).expect("create the runtime config directory");
    std::fs::write(
        cri.join(&cid).join("config.json"),
        format!(
            r#"{{"annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-name":"{pod}","io.kubernetes.cri.sandbox-namespace":"shop","io.kubernetes.cri.container-name":"app"}}}}"#
        ),
    )
    .expect("write config.json");
    let mut tree = KubeTree::default();
    let pod_dir =
        format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", uid.replace('-', "_"));
    let app = tree.cgroup(&format!("{pod_dir}/cri-containerd-{cid}.scope"));
    let mut leak = Command::new(growth_o2());
    leak.args(["leak-cache", "100000000", "500"]);
    let leaker = tree.start_in(&app, leak);

    let (port, got) = start_server();
    let out = OutDir::new("watch-push");
    let mut cmd = leaktrace(["watch", "--pod", &pod, "--namespace", "shop", "--window", "8s", "--interval", "500ms"]);
    cmd.args(["--no-escalate", "--duration", "30s", "--out"]).arg(&out.path);
    cmd.args(["--push", &format!("http://127.0.0.1:{port}"), "--push-interval", "3s"]);
    cmd.env("LEAKTRACE_CRI_CONFIG", format!("{}/{{id}}/config.json", cri.display()));
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    let got = got.lock().unwrap().clone();
    let ctx =
        format!("{} request(s): {:?}\n{}", got.len(), got.iter().map(|g| &g.target).collect::<Vec<_>>(), o.describe());
    assert_eq!(got.first().map(|g| g.status), Some(503), "{ctx}");
    assert!(o.stderr.contains("retry 1/"), "the failed push is not reported with its retry\n{ctx}");

    // Every accepted push of the leaker names its pod, namespace and container.
    let name = format!("growth{{pod={pod},namespace=shop,container=app,pid={leaker}}}");
    let accepted: Vec<&Received> = got.iter().filter(|g| g.status == 200).collect();
    assert!(accepted.len() >= 2, "periodic pushes: at least two accepted\n{ctx}");
    for g in &accepted {
        assert!(g.target.starts_with("/ingest?"), "{}", g.target);
        assert_eq!(query_param(&g.target, "name").as_deref(), Some(name.as_str()), "{ctx}");
    }
    let is_growth = |g: &Received| {
        String::from_utf8_lossy(part(g, "sample_type_config").unwrap_or_default()).contains("growth_space")
    };
    let growth = accepted.iter().rfind(|g| is_growth(g)).unwrap_or_else(|| panic!("no growth profile pushed\n{ctx}"));
    let file = out.path.join("pushed-growth.pb.gz");
    std::fs::write(&file, part(growth, "profile").expect("profile part")).unwrap();
    let traces = go_pprof(&["-traces"], &[&file]);
    assert!(traces.contains("leak_message"), "the pushed growth profile does not hold leak_message:\n{traces}\n{ctx}");
    // Its cumulative growth (`-top -cum`: flat, flat%, sum%, cum, cum%, name).
    let top = go_pprof(&["-top", "-cum", "-unit=B"], &[&file]);
    let cum = top.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find_map(|c| {
        (c.len() == 6 && c[5] == "leak_message").then(|| c[3].trim_end_matches('B').parse::<i64>().unwrap_or(0))
    });
    eprintln!("pushed growth profile: leak_message {cum:?} B cumulative; {} accepted pushes", accepted.len());
    assert!(cum.is_some_and(|b| b > 0), "leak_message has no growth in the pushed profile:\n{top}\n{ctx}");
    let _ = std::fs::remove_dir_all(&cri);
}
