//! `leaktrace watch`'s OOM-time report: a watched process in a memory cgroup limited
//! to 48 MiB (cgroup v2 memory.max when the root has the memory controller, else cgroup v1's
//! memory.limit_in_bytes) leaks 1 MiB blocks, touched, one a second (slow enough for the first
//! window to attach on a loaded machine), in leak_until_oom
//! (tests/fixtures/hostile.c) until the OOM killer takes it. The report written then names the
//! allocating stack with the bytes its pages hold, the cgroup's limit, and its memory series
//! climbing to the limit.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use leaktrace_tests::*;
use serde_json::Value;

const LIMIT: u64 = 48 << 20;

/// tests/fixtures/hostile.c, -O2 without frame pointers.
fn hostile() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("watch_oom-hostile", |dir| {
            let bin = dir.join("hostile");
            let o = Command::new("gcc")
                .args(["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-o"])
                .arg(&bin)
                .arg(fixture_source("hostile.c"))
                .output()
                .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
            assert!(o.status.success(), "compiling hostile.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
        })
        .join("hostile")
    })
}

/// The one `*-oom` report directory under `dir`.
fn oom_dir(dir: &Path, ctx: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("no directory {}: {e}\n{ctx}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with("-oom")))
        .collect();
    assert_eq!(found.len(), 1, "one OOM-time report: {found:?}\n{ctx}");
    found[0].clone()
}

/// The OOM-time report: how it ended, the cgroup's 48 MiB limit, leak_until_oom's stack with the
/// pages it first touched since it was watched (at least a third of the limit: the first window
/// attaches a few seconds after the leak starts), and a memory series that climbed past half
/// the limit.
#[test]
fn watch_writes_the_oom_time_report_of_a_watched_process() {
    require_root();
    let cg = MemCgroup::new(&format!("leaktrace-test-watch-oom-{}", std::process::id()), LIMIT);
    let mut cmd = Command::new(hostile());
    cmd.args(["oom", "1000", "1"]).env("LEAK_CGROUP", &cg.dir);
    let mut target = Target::spawn(cmd);
    target.expect_pid_line();
    // It moves itself into the cgroup, then waits 500 ms before leaking.
    std::thread::sleep(Duration::from_millis(400));
    let out = OutDir::new("watch-oom");
    let p = target.pid.to_string();
    let mut cmd = leaktrace(["watch", "--pid", &p, "--window", "5s", "--interval", "500ms", "--duration", "100s"]);
    cmd.args(["--no-escalate", "--out"]).arg(&out.path);
    let o = Running::spawn(cmd, None).wait(Duration::from_secs(180));
    o.assert_success();
    let status = target.wait(Duration::from_secs(5));
    let ctx = format!("target ended: {status:?}\n{}", o.describe());
    assert!(o.stderr.contains(&format!("PID {p} was killed by the OOM killer")), "{ctx}");
    let dir = oom_dir(&out.path.join(format!("pid-{p}")), &ctx);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("oom.json")).expect("oom.json"))
        .expect("oom.json is JSON");
    let ctx = format!("{}\n{ctx}", serde_json::to_string_pretty(&doc["held"]).unwrap_or_default());
    assert!(str_of(&doc, "ended").contains("killed by the OOM killer"), "{ctx}");
    assert_eq!(doc["memory_limit_bytes"].as_u64(), Some(LIMIT), "{ctx}");
    let through_leak = |h: &&Value| {
        h["function"] == "leak_until_oom"
            || h["stack"].as_array().is_some_and(|s| s.iter().any(|f| f == "leak_until_oom"))
    };
    // The window it died in (none when it died between two windows, while the next attached).
    let held = doc["held"].as_array().cloned().unwrap_or_default();
    let last = held.iter().find(through_leak).map_or(0, |h| u64_of(h, "bytes"));
    let grown = doc["grown_since_watched"].as_array().cloned().unwrap_or_default();
    let all = grown.iter().find(through_leak).unwrap_or_else(|| panic!("no grown stack through leak_until_oom\n{ctx}"));
    let all = u64_of(all, "bytes");
    eprintln!(
        "measured: leak_until_oom's stack: {last} B first touched in the last window, {all} B since watched (limit {LIMIT})"
    );
    assert!(last <= LIMIT, "leak_until_oom holds {last} B in the last window\n{ctx}");
    assert!((LIMIT / 3..=LIMIT).contains(&all), "leak_until_oom grew {all} B since watched\n{ctx}");
    let series = doc["memory_series"].as_array().cloned().unwrap_or_default();
    let peak = series.iter().map(|s| u64_of(s, "rss_anon")).max().unwrap_or(0);
    eprintln!("measured: {} memory samples, peak RSS anon {peak} B", series.len());
    assert!(series.len() >= 5, "{} samples\n{ctx}", series.len());
    assert!((LIMIT / 2..=LIMIT).contains(&peak), "peak RSS anon {peak}\n{ctx}");
    let md = std::fs::read_to_string(dir.join("oom.md")).expect("oom.md");
    assert!(md.contains("Memory cgroup limit: 48") && md.contains("leak_until_oom"), "{md}");
    // The window's own report is there when it died within a window; between two windows (the
    // next one attaching) there is no window of its death: oom.json's figures only.
    let within_a_window = !str_of(&doc, "ended").contains("between two windows");
    assert_eq!(dir.join("report.json").exists(), within_a_window, "{ctx}");
    assert_eq!(dir.join("recording.json").exists(), within_a_window, "{ctx}");
    drop(cg);
}
