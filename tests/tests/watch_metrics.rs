//! `leaktrace watch` on tests/fixtures/growth.c: a leaker (`leak-cache`: 1,200 bytes
//! leaked per message at 500 messages a second, so 600,000 B/s, beside a bounded cache) and a
//! decoy (`cache`: a cache that warms in 3 s and then stays flat). A real Prometheus (Debian's
//! `prometheus`, on the loopback, scraping every second) scrapes `--metrics-listen`; PromQL over
//! its HTTP API gives the leaker's growth within 20 % of the truth and the decoy's metric with no
//! leak verdict. The leaker, and only it, is escalated: its report names leak_message.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use leaktrace_tests::*;
use serde_json::Value;

/// The leaker's truth: LEAK_UNIT_BYTES (1200) × 500 messages a second, bytes per second.
const LEAK_BPS: f64 = 1200.0 * 500.0;

/// Percent-encode a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The result vector of an instant PromQL query through Prometheus's HTTP API.
fn promql(port: u16, q: &str) -> Vec<Value> {
    let (status, body) = http_get(port, &format!("/api/v1/query?query={}", encode(q))).expect("query Prometheus");
    assert!(status.contains("200"), "{q}: {status}\n{body}");
    let v: Value = serde_json::from_str(&body).expect("Prometheus answers JSON");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The single sample's value of a query result.
fn value(r: &[Value], q: &str) -> f64 {
    assert_eq!(r.len(), 1, "{q}: one series expected: {r:?}");
    r[0]["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{q}: no value: {r:?}"))
}

/// Prometheus on the loopback, scraping 127.0.0.1:`target` every second; stopped when dropped.
struct Prometheus {
    child: std::process::Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target: u16) -> Prometheus {
        let port = free_port();
        let dir = temp_root().join(format!("prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the Prometheus directory");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: leaktrace\n    \
                 static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus (cargo xtask setup installs it): {e}"));
        let p = Prometheus { child, port, dir };
        let ready = wait_for(Duration::from_secs(30), || {
            http_get(port, "/-/ready").filter(|(s, _)| s.contains("200")).map(|_| ())
        });
        assert!(ready.is_some(), "prometheus did not get ready on port {port}");
        p
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Start growth.c in `mode` at `rate` messages a second (until killed).
fn start_growth(mode: &str, rate: &str) -> Target {
    let mut cmd = Command::new(growth_o2());
    cmd.args([mode, "100000000", rate]);
    let t = Target::spawn(cmd);
    t.expect_pid_line();
    t
}

/// The leaker's growth over Prometheus (the growth gauge, and `deriv` of its RSS anon gauge)
/// within 20 % of 600,000 B/s; the decoy's RSS metric and verdict present, its verdict not a
/// leak; the leaker escalated once, the decoy never; the leaker's report names leak_message.
/// The exact windows' report directories `watch` wrote for process `pid` under `out`
/// (`pid-N/…`); panics with the watch's output when there is no such directory.
fn escalation_reports(out: &OutDir, pid: &str, o: &Output) -> Vec<PathBuf> {
    let pdir = out.path.join(format!("pid-{pid}"));
    std::fs::read_dir(&pdir)
        .unwrap_or_else(|e| panic!("no report directory {}: {e}\n{}", pdir.display(), o.describe()))
        .flatten()
        .map(|e| e.path())
        .collect()
}

#[test]
fn watch_metrics_scraped_by_prometheus_and_the_leaker_escalated() {
    require_root();
    let leaker = start_growth("leak-cache", "500");
    let decoy = start_growth("cache", "200");
    // The decoy's cache is full after 3 s: the windows see it flat.
    std::thread::sleep(Duration::from_secs(4));
    let out = OutDir::new("watch-metrics");
    let metrics = free_port();
    let (l, d) = (leaker.pid.to_string(), decoy.pid.to_string());
    let mut cmd = leaktrace(["watch", "--pid", &l, "--pid", &d, "--window", "10s", "--escalate-after", "2"]);
    // Ended by SIGINT once the metrics are checked (the duration only bounds a run gone wrong).
    cmd.args(["--escalate-for", "5s", "--duration", "120s", "--metrics-listen", &format!("127.0.0.1:{metrics}")]);
    cmd.arg("--out").arg(&out.path);
    let watch = Running::spawn(cmd, None);
    let prom = Prometheus::start(metrics);
    let started = Instant::now();
    // Three windows (10 s each, plus attaching) and the escalation (5 s) done, and two more
    // windows after it: without the cool-down the leaker would have been escalated again.
    std::thread::sleep(Duration::from_secs(50).saturating_sub(started.elapsed()));
    let ctx = || format!("leaktrace stderr so far:\n{}", watch.stderr_so_far());

    let q = format!("leaktrace_process_growth_bytes_per_second{{pid=\"{l}\"}}");
    let growth = value(&promql(prom.port, &q), &q);
    assert_within("the growth gauge", growth, LEAK_BPS, 0.20, &ctx());
    let q = format!("deriv(leaktrace_process_rss_bytes{{pid=\"{l}\",kind=\"anon\"}}[20s])");
    let deriv = value(&promql(prom.port, &q), &q);
    assert_within("deriv of RSS anon", deriv, LEAK_BPS, 0.20, &ctx());
    eprintln!("measured: growth gauge {growth:.0} B/s, deriv(RSS anon) {deriv:.0} B/s; truth {LEAK_BPS} B/s");
    let q = format!("leaktrace_process_verdict{{pid=\"{l}\"}}");
    let r = promql(prom.port, &q);
    assert_eq!(r.len(), 1, "{q}: {r:?}\n{}", ctx());
    assert_eq!(r[0]["metric"]["verdict"], "leak", "{}", ctx());
    let q = format!("leaktrace_process_rss_bytes{{pid=\"{d}\",kind=\"anon\"}}");
    assert!(value(&promql(prom.port, &q), &q) > 0.0, "{}", ctx());
    let q = format!("leaktrace_process_verdict{{pid=\"{d}\"}}");
    let r = promql(prom.port, &q);
    assert_eq!(r.len(), 1, "the decoy has a verdict: {r:?}\n{}", ctx());
    assert_ne!(r[0]["metric"]["verdict"], "leak", "the decoy is not a leak\n{}", ctx());
    let q = format!("leaktrace_process_escalations_total{{pid=\"{l}\"}}");
    assert_eq!(value(&promql(prom.port, &q), &q), 1.0, "{}", ctx());
    let q = format!("leaktrace_process_escalations_total{{pid=\"{d}\"}}");
    assert_eq!(value(&promql(prom.port, &q), &q), 0.0, "{}", ctx());
    let q = "leaktrace_agent_resident_bytes";
    assert!(value(&promql(prom.port, q), q) > 0.0);

    watch.signal(libc::SIGINT);
    let o = watch.wait(Duration::from_secs(60));
    o.assert_success();
    let reports = escalation_reports(&out, &l, &o);
    assert_eq!(reports.len(), 1, "one escalation within the cool-down: {reports:?}\n{}", o.describe());
    let r = Report::load(&reports[0]);
    let summary = str_of(r.get(&["verdict"]), "summary").to_string();
    assert!(summary.contains("exact window") && summary.contains("leak_message holds"), "{summary}\n{}", o.describe());
    let esc = r.get(&["escalation", "sites"]).as_array().cloned().unwrap_or_default();
    let top = esc.first().unwrap_or_else(|| panic!("no escalation sites\n{summary}"));
    assert_eq!(str_of(top, "function"), "leak_message", "{summary}");
    let exact = f64_of(top, "growth_bytes_per_s");
    eprintln!("measured: the exact window's leak_message {exact:.0} B/s");
    assert_within("the exact window's leak", exact, LEAK_BPS, 0.30, &summary);
    assert!(!out.path.join(format!("pid-{d}")).exists(), "the decoy was escalated\n{}", o.describe());
    drop(prom);
    leaker.signal(libc::SIGKILL);
    decoy.signal(libc::SIGKILL);
}

/// The line of `name{pid="PID",…}` in a scrape of `/metrics` on `port`.
fn scraped(port: u16, name: &str, pid: &str) -> Option<String> {
    let (_, body) = http_get(port, "/metrics")?;
    let prefix = format!("{name}{{");
    body.lines().find(|l| l.starts_with(&prefix) && l.contains(&format!("pid=\"{pid}\""))).map(str::to_string)
}

/// watch's escalation runs in its own session: the agent loads its eBPF object once (its log
/// counts each load: "programs loaded in … (eBPF object N of this process)"), the exact window
/// still names leak_message at the leaker's rate, and the leaker is back in growth mode after
/// it (the growth gauge of a window after the exact one within 20 % of the truth: its page
/// faults are counted again).
#[test]
fn a_watch_escalation_loads_no_second_ebpf_object_and_returns_to_growth_mode() {
    require_root();
    let leaker = start_growth("leak-cache", "500");
    std::thread::sleep(Duration::from_secs(2));
    let out = OutDir::new("watch-escalation-one-load");
    let metrics = free_port();
    let l = leaker.pid.to_string();
    let mut cmd = leaktrace(["watch", "--pid", &l, "--window", "6s", "--interval", "1s", "--escalate-after", "1"]);
    cmd.args(["--escalate-for", "4s", "--duration", "32s", "--metrics-listen", &format!("127.0.0.1:{metrics}")]);
    cmd.arg("--out").arg(&out.path).env("RUST_LOG", "leaktrace=info");
    let watch = Running::spawn(cmd, None);
    let ctx = || format!("leaktrace stderr so far:\n{}", watch.stderr_so_far());
    let done = wait_for(Duration::from_secs(40), || {
        watch.stderr_so_far().contains(&format!("exact window on PID {l} done")).then_some(Instant::now())
    })
    .unwrap_or_else(|| panic!("no exact window ended\n{}", ctx()));
    // Two whole growth-mode windows after the exact one: the last one's growth is that of a
    // window in growth mode only.
    std::thread::sleep(Duration::from_secs(14).saturating_sub(done.elapsed()));
    let growth = scraped(metrics, "leaktrace_process_growth_bytes_per_second", &l)
        .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no growth gauge for PID {l}\n{}", ctx()));
    // The window's verdict is a leak again: growth mode names sites whose pages grow (its page
    // faults are counted again), not an RSS growing with no site.
    let verdict = scraped(metrics, "leaktrace_process_verdict", &l).unwrap_or_default();
    assert!(verdict.contains("verdict=\"leak\""), "after the exact window: {verdict}\n{}", ctx());
    eprintln!("measured: growth gauge after the exact window {growth:.0} B/s; truth {LEAK_BPS} B/s");
    assert_within("the growth gauge after the exact window", growth, LEAK_BPS, 0.20, &ctx());
    let o = watch.wait(Duration::from_secs(60));
    o.assert_success();
    let loads: Vec<&str> = o.stderr.lines().filter(|l| l.contains("programs loaded in ")).collect();
    assert_eq!(loads.len(), 1, "eBPF object loads: {loads:?}\n{}", o.describe());
    assert!(loads[0].contains("(eBPF object 1 of this process)"), "{}", o.describe());
    // The window's blocks (2,000 leaked in 4 s at least) are forgotten in the kernel's block
    // tables when it closes: the tracer outlives it.
    let forgotten = o
        .stderr
        .lines()
        .find_map(|line| {
            line.split(&format!("exact window on PID {l}: ")).nth(1)?.split(' ').next()?.parse::<u64>().ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "no blocks forgotten
{}",
                o.describe()
            )
        });
    assert!(
        forgotten >= 1500,
        "{forgotten} blocks forgotten
{}",
        o.describe()
    );
    let reports = escalation_reports(&out, &l, &o);
    assert!(!reports.is_empty(), "no escalation report\n{}", o.describe());
    let r = Report::load(&reports[0]);
    let summary = str_of(r.get(&["verdict"]), "summary").to_string();
    let esc = r.get(&["escalation", "sites"]).as_array().cloned().unwrap_or_default();
    let top = esc.first().unwrap_or_else(|| panic!("no escalation sites\n{summary}\n{}", o.describe()));
    assert_eq!(str_of(top, "function"), "leak_message", "{summary}\n{}", o.describe());
    assert_within("the exact window's leak", f64_of(top, "growth_bytes_per_s"), LEAK_BPS, 0.30, &summary);
    // The window counts from its start: no page-fault site of the growth-mode windows in it.
    assert!(!esc.iter().any(|s| s["kind"].to_string().contains("fault")), "fault sites in the exact window\n{summary}");
    leaker.signal(libc::SIGKILL);
}
