//! The managed-runtime tests' shared helpers (tests/tests/runtimes*.rs): the fixtures'
//! sources, recording a launched or attached workload, and the assertions
//! on its memory by kind.
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::*;

/// Recording length of every test but Node's.
pub const DURATION: &str = "8s";
/// Node's: the first checkpoint symbolizes stacks in the 100 MB node executable, which took up to
/// 8 s with another test running beside it.
pub const NODE_DURATION: &str = "16s";
/// A kind that should not grow may move by at most this share of the growing kind's slope
/// (what the workload itself adds there: the Java objects of direct buffers, the V8 objects of
/// Buffers, the Go slice of C pointers).
pub const FLAT_SHARE: f64 = 0.10;

/// A source file of the runtime fixtures (tests/fixtures/runtimes/NAME).
pub fn src(name: &str) -> PathBuf {
    fixture_source("runtimes").join(name)
}

/// Run a build step (`what` names it in the failure message); panics when it fails.
pub fn check(cmd: &mut Command, what: &str) {
    run_build_step(cmd, what)
}

/// `node`, without the environment's NODE_EXTRA_CA_CERTS: with it, node parses every extra CA
/// certificate at start-up (~900,000 allocator calls under tracing here, against ~32,000 without:
/// seconds of a recording on a loaded machine before the fixture's first line of JavaScript).
/// `node`, run from this test binary's temporary directory: V8 writes files into its working
/// directory (an `isolate-*-v8.log` with `--perf-basic-prof`), which must not land in the tree.
pub fn node() -> Command {
    let mut c = Command::new("node");
    c.env_remove("NODE_EXTRA_CA_CERTS").current_dir(temp_root());
    c
}

/// Attach to the running node `pid` for 12 s (250 ms checkpoints); the report, its context for
/// messages, and the output directory. The recording must succeed and see a Node runtime.
pub fn record_node_attached(name: &str, pid: u32) -> (Report, String, OutDir) {
    let out = OutDir::new(name);
    let mut lt = leaktrace(["record", "--pid", &pid.to_string(), "--interval", "250ms", "--duration", "12s", "--out"]);
    lt.arg(&out.path);
    let o = run(lt, None, Duration::from_secs(300));
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("{}\nreport {}:\n{}", o.describe(), out.path.display(), r.summary());
    assert_runtime(&r, "node", &ctx);
    (r, ctx, out)
}

/// Record the launched `cmd` for [`DURATION`] ([`record_with`]): the report, a context string
/// for failure messages, and the output directory.
pub fn record(name: &str, cmd: Command) -> (Report, String, OutDir) {
    record_for(name, cmd, DURATION)
}

/// Record the launched `cmd` for `duration` ([`record_with`]).
pub fn record_for(name: &str, cmd: Command, duration: &str) -> (Report, String, OutDir) {
    record_with(name, cmd, &["--duration", duration])
}

/// Record `cmd` with these leaktrace options (`--duration` among them).
pub fn record_with(name: &str, cmd: Command, options: &[&str]) -> (Report, String, OutDir) {
    let out = OutDir::new(name);
    let o = record_launch(&out, options, cmd);
    o.assert_success();
    let r = Report::load(&out.path);
    let kinds = r.get(&["summary", "by_kind"]).clone();
    let ctx = format!(
        "report {}:\nverdict: {}\nby kind: {kinds:#}\n{}\nleaktrace stderr:\n{}",
        out.path.display(),
        r.json["verdict"],
        r.summary(),
        o.stderr
    );
    // The measured numbers, for the log (`--nocapture`).
    let slopes: Vec<String> = kinds
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| {
            format!(
                "{} {:.0} B/s{}",
                k["kind"].as_str().unwrap_or("?"),
                k["growth_bytes_per_s"].as_f64().unwrap_or(0.0),
                if k["grows"] == true { " (grows)" } else { "" }
            )
        })
        .collect();
    eprintln!("{name}: {}; verdict: {}", slopes.join(", "), r.json["verdict"]["summary"].as_str().unwrap_or(""));
    (r, ctx, out)
}

/// The report's `summary.by_kind` entry of memory kind `k` ("managed", "native", ...).
pub fn kind<'a>(r: &'a Report, k: &str, ctx: &str) -> &'a Value {
    r.get(&["summary", "by_kind"])
        .as_array()
        .and_then(|a| a.iter().find(|v| v["kind"] == k))
        .unwrap_or_else(|| panic!("summary.by_kind has no {k}\n{ctx}"))
}

/// Assert `k` grows (significantly, above its floor) at least `min_rate` B/s; returns its slope.
pub fn assert_grows(r: &Report, k: &str, min_rate: f64, ctx: &str) -> f64 {
    let v = kind(r, k, ctx);
    let slope = f64_of(v, "growth_bytes_per_s");
    assert_eq!(v["grows"].as_bool(), Some(true), "{k} should grow\n{ctx}");
    assert!(slope >= min_rate, "{k} grows {slope:.0} B/s, expected at least {min_rate:.0}\n{ctx}");
    slope
}

/// Assert each of `kinds` moves by less than FLAT_SHARE of `growing` B/s.
pub fn assert_flat(r: &Report, kinds: &[&str], growing: f64, ctx: &str) {
    for k in kinds {
        let slope = f64_of(kind(r, k, ctx), "growth_bytes_per_s");
        assert!(
            slope.abs() < FLAT_SHARE * growing,
            "{k} should stay flat: {slope:.0} B/s is not below {:.0}% of the growing kind's {growing:.0} B/s\n{ctx}",
            FLAT_SHARE * 100.0
        );
    }
}

/// Assert the report detected runtime `name` and has the memory-by-kind series and table.
pub fn assert_runtime(r: &Report, name: &str, ctx: &str) {
    assert_eq!(r.get(&["target", "runtime"]).as_str(), Some(name), "target.runtime\n{ctx}");
    let managed = r.get(&["memory", "managed_bytes"]).as_array().expect("memory.managed_bytes");
    assert!(!managed.is_empty(), "memory.managed_bytes is empty\n{ctx}");
    for s in ["native_live_bytes", "offheap_live_bytes", "rss_bytes"] {
        assert!(r.get(&["memory", s]).as_array().is_some_and(|a| !a.is_empty()), "memory.{s}\n{ctx}");
    }
    let md = std::fs::read_to_string(r.dir.join("report.md")).unwrap();
    assert!(md.contains("## Memory by kind"), "report.md has no memory-by-kind table\n{ctx}");
}

/// Assert the verdict is a leak whose sentence starts with `prefix`.
pub fn assert_verdict_starts(r: &Report, prefix: &str, ctx: &str) {
    assert_eq!(r.json["verdict"]["class"], "leak", "verdict class\n{ctx}");
    let s = str_of(&r.json["verdict"], "summary");
    assert!(s.starts_with(prefix), "the verdict should start with {prefix:?}: {s}\n{ctx}");
}

/// The site with the largest growth among those of memory kind `k`.
pub fn top_site_of_kind<'a>(r: &'a Report, k: &str, ctx: &str) -> &'a Value {
    r.sites()
        .iter()
        .filter(|s| s["memory_kind"] == k)
        .max_by(|a, b| f64_of(a, "growth_bytes_per_s").total_cmp(&f64_of(b, "growth_bytes_per_s")))
        .unwrap_or_else(|| panic!("no site of kind {k}\n{ctx}"))
}

/// The report's warnings (caveats) that contain `text`.
pub fn warnings_with<'a>(r: &'a Report, text: &str) -> Vec<&'a str> {
    r.json["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains(text))
        .collect()
}

/// The function names of a site's frames, innermost first ("?" for an unnamed frame).
pub fn frame_names(site: &Value) -> Vec<&str> {
    site["frames"].as_array().into_iter().flatten().map(|f| f["function"].as_str().unwrap_or("?")).collect()
}

/// The JVM (on `jcmd PID Compiler.perfmap`) and node (with `--perf-basic-prof`) write
/// /tmp/perf-PID.map and leave it: removed after a test.
pub fn remove_perf_map(r: &Report) {
    if let Some(pid) = r.get(&["target", "pid"]).as_u64() {
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    }
}
