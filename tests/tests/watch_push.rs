//! `leaktrace watch --push URL` (issues 34 and 29): each watched process's growth profile is
//! pushed periodically with its pod labels. A pod made as a kubelet makes it (systemd driver,
//! containerd's config annotations: pod `web-p<PID>` in namespace `shop`, container `app`) runs
//! a leaker (growth.c `leak-cache`, 600,000 B/s through leak_message); `watch --pod` pushes to a
//! small HTTP server on the loopback (`leaktrace_tests::pushserver`, 503 to the first request).
//! The pushes carry the pod, namespace and container in Pyroscope's application name, and the
//! growth profile, decoded by the real `go tool pprof`, holds the pages first touched under
//! run_messages at the leak's rate.
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
    write_cri_config(&cri, &cid, &pod, "shop", "app");
    let mut tree = KubeTree::default();
    let app = tree.systemd_container(&uid, &cid);
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
    // Growth mode charges a page to the stack that first touched it: here scratch()'s memset
    // touches the heap's new pages just past each block leak_message() leaves behind (the
    // growth mode's decoy; without --no-escalate an exact window would name leak_message).
    // So the pushed profile is checked for what growth mode measures: the program's own frames,
    // named, and the bytes first touched under run_messages at the leak's rate.
    assert!(traces.contains("run_messages"), "the pushed growth profile has no run_messages frame:\n{traces}\n{ctx}");
    let secs = traces
        .lines()
        .find_map(|l| l.strip_prefix("Duration: ")?.split('s').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no Duration in the pushed profile:\n{traces}"));
    // Its cumulative growth (`-top -cum`: flat, flat%, sum%, cum, cum%, name).
    let top = go_pprof(&["-top", "-cum", "-unit=B"], &[&file]);
    let cum = top.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find_map(|c| {
        (c.len() == 6 && c[5] == "run_messages").then(|| c[3].trim_end_matches('B').parse::<f64>().unwrap_or(0.0))
    });
    let rate = cum.unwrap_or(0.0) / secs.max(1e-3);
    eprintln!(
        "pushed growth profile: run_messages {cum:?} B over {secs} s = {rate:.0} B/s; {} accepted pushes",
        accepted.len()
    );
    // 600,000 B/s leaked; the pages touched follow it within 40 % over a 3 s window.
    assert!(
        (0.6 * 600_000.0..=1.4 * 600_000.0).contains(&rate),
        "run_messages grows {rate:.0} B/s in the pushed profile, expected 600,000 B/s ± 40 %:\n{top}\n{ctx}"
    );
    let _ = std::fs::remove_dir_all(&cri);
}
