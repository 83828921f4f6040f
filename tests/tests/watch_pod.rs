//! `leaktrace watch --pod` follows a pod's processes as they come and go, without a
//! restart: a pod made as a kubelet makes it (systemd driver, containerd's config annotations:
//! pod `web-w<PID>` in namespace `shop`, container `app`) first runs an idle process; while
//! `watch` runs, a leaker (growth.c `leak-cache`, 600,000 B/s) starts in the container and the
//! idle process exits. The metrics endpoint then shows the leaker with its pod labels and a leak
//! verdict and no longer the idle process, and the leaker's escalation report lands in
//! OUT/shop_web-w<PID>_app/TIME/ naming leak_message (the idle process, killed by a signal, gets
//! no OOM-time report).
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use leaktrace_tests::*;

/// The metrics endpoint's text, once it answers.
fn metrics(port: u16) -> Option<String> {
    http_get(port, "/metrics").filter(|(s, _)| s.contains("200")).map(|(_, b)| b)
}

#[test]
fn watch_follows_a_pods_processes_as_they_come_and_go() {
    require_root();
    let me = std::process::id() as u64;
    let pod = format!("web-w{me}");
    let (uid, cid) = (format!("{:08x}-1111-2222-3333-{:012x}", me, me), format!("{:016x}", me * 31).repeat(4));
    let cri = temp_root().join(format!("cri-watch-{me}"));
    write_cri_config(&cri, &cid, &pod, "shop", "app");
    let mut tree = KubeTree::default();
    let app = tree.systemd_container(&uid, &cid);
    let mut sleep = Command::new("sleep");
    sleep.arg("600");
    let idle = tree.start_in(&app, sleep);

    let out = OutDir::new("watch-pod");
    let port = free_port();
    let mut cmd = leaktrace(["watch", "--pod", &pod, "--namespace", "shop", "--window", "5s", "--interval", "500ms"]);
    cmd.args(["--escalate-after", "2", "--escalate-for", "3s", "--duration", "60s"]);
    cmd.args(["--metrics-listen", &format!("127.0.0.1:{port}"), "--out"]).arg(&out.path);
    cmd.env("LEAKTRACE_CRI_CONFIG", format!("{}/{{id}}/config.json", cri.display()));
    let watch = Running::spawn(cmd, None);
    let labels = format!("comm=\"%s\",pod=\"{pod}\",namespace=\"shop\",container=\"app\"");
    let idle_verdict = format!("leaktrace_process_verdict{{pid=\"{idle}\",{}", labels.replace("%s", "sleep"));
    let seen = wait_for(Duration::from_secs(60), || metrics(port).filter(|m| m.contains(&idle_verdict)));
    assert!(seen.is_some(), "no verdict of the idle process {idle_verdict}\n{}", watch.stderr_so_far());

    // The leaker comes, the idle process goes.
    let mut leak = Command::new(growth_o2());
    leak.args(["leak-cache", "100000000", "500"]);
    let leaker = tree.start_in(&app, leak);
    tree.stop(idle);
    let leak_verdict =
        format!("leaktrace_process_verdict{{pid=\"{leaker}\",{},verdict=\"leak\"}} 1", labels.replace("%s", "growth"));
    let m = wait_for(Duration::from_secs(60), || {
        metrics(port)
            .filter(|m| m.contains(&leak_verdict) && !m.contains(&idle_verdict))
            // The idle process was killed by a signal, not by the OOM killer.
            .filter(|m| m.contains("\nleaktrace_oom_kills_total 0\n"))
    });
    assert!(
        m.is_some(),
        "the leaker {leak_verdict} is not there, or the idle process still is\n{:?}\n{}",
        metrics(port),
        watch.stderr_so_far()
    );

    let o = watch.wait(Duration::from_secs(120));
    o.assert_success();
    let dir = out.path.join(format!("shop_{pod}_app"));
    let reports: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("no report directory {}: {e}\n{}", dir.display(), o.describe()))
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(reports.len(), 1, "one escalation, no OOM-time report: {reports:?}\n{}", o.describe());
    let r = Report::load(&reports[0]);
    let summary = str_of(r.get(&["verdict"]), "summary").to_string();
    assert!(summary.contains("leak_message holds"), "{summary}\n{}", o.describe());
    assert_eq!(r.get(&["target", "pid"]).as_u64(), Some(leaker as u64), "{}", o.describe());
    let _ = std::fs::remove_dir_all(&cri);
}
