//! What holds it, in Python: `record --python-heap` on real CPython processes
//! launched by leaktrace, censuses of their heap read from outside (ptrace stop +
//! process_vm_readv) at the first checkpoint and at the end.
//!
//! - An event-bus worker (tests/fixtures/pyheap/event_bus.py) subscribes a closure per message on
//!   the module-level `bus` and never removes it: function, list and dict objects grow at the
//!   message rate (within 10 % of the rate the fixture says it ran), the retaining path runs
//!   from `__main__.bus` through `._handlers` to the message dict, the verdict names
//!   `__main__.bus._handlers`; the full `lru_cache(256)` and `deque(maxlen=500)` beside it are
//!   held and not growing. Under pyenv's shared-libpython 3.11, Debian's static
//!   /usr/bin/python3.11, 3.8, 3.9, 3.12 and 3.13.
//! - A ZIP service (zip_service.py) parks a ZIP of ~24 KiB as `bytes` in `_PENDING` per failed
//!   download: `bytes` grows at the failure rate (±15 %, count and bytes), held by
//!   `__main__._PENDING`, under both 3.11 interpreters.
//!
//! The targets keep running through the censuses: their own progress lines go on to the end.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::Path;

use leaktrace_tests::*;

const PYENV: &str = "/root/.pyenv/versions";

/// Record `script` (args `args`) under `interp` with `--python-heap` for `secs` seconds; the
/// report and the fixture's progress lines (`word N T`) as (N, T).
fn record_heap(
    name: &str,
    interp: &Path,
    script: &str,
    args: &[&str],
    secs: u32,
    word: &str,
) -> (Report, Vec<(f64, f64)>, OutDir) {
    record_heap_with(name, interp, &[], (script, args), secs, word)
}

/// [`record_heap`] with `extra` leaktrace options.
fn record_heap_with(
    name: &str,
    interp: &Path,
    extra: &[&str],
    (script, args): (&str, &[&str]),
    secs: u32,
    word: &str,
) -> (Report, Vec<(f64, f64)>, OutDir) {
    require_root();
    assert!(interp.exists(), "{} is missing (cargo xtask setup installs it)", interp.display());
    let out = OutDir::new(name);
    let mut cmd = leaktrace(["record", "--interval", "1s", "--python-heap", "--duration"]);
    cmd.arg(format!("{secs}s")).args(extra).arg("--out").arg(&out.path).arg("--").arg(interp);
    cmd.arg(fixture_source("pyheap").join(script)).args(args);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    assert_no_panic(&o);
    let progress = o.progress(word);
    let censuses = o.stderr.lines().filter(|l| l.contains("Python heap of PID")).count();
    assert_eq!(censuses, 2, "one census at the first checkpoint, one at the end\n{}", o.describe());
    (Report::load(&out.path), progress, out)
}

/// The rate the fixture ran at between the first and the last census, per second, from its
/// progress lines (N, wall-clock T) interpolated at the censuses' wall-clock times; and it ran
/// to the end.
fn actual_rate(progress: &[(f64, f64)], secs: u32, dir: &Path, ctx: &str) -> f64 {
    let (first, last) = (progress.first().expect(ctx), progress.last().expect(ctx));
    assert!(
        last.1 - first.1 >= f64::from(secs) - 4.0,
        "the target stopped making progress during the recording\n{ctx}"
    );
    let rec: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("recording.json")).expect("recording.json"))
            .expect("json");
    let censuses = rec["python_heap"].as_array().cloned().unwrap_or_default();
    let at = |c: &Value| {
        let t = c["unix_ms"].as_f64().unwrap_or(0.0) / 1e3;
        let k = progress.partition_point(|p| p.1 <= t).clamp(1, progress.len() - 1);
        let (a, b) = (progress[k - 1], progress[k]);
        (a.0 + (b.0 - a.0) * (t - a.1) / (b.1 - a.1), t)
    };
    let (n0, t0) = at(censuses.first().expect(ctx));
    let (n1, t1) = at(censuses.last().expect(ctx));
    (n1 - n0) / (t1 - t0)
}

fn growing<'a>(r: &'a Report, ty: &str, ctx: &str) -> &'a Value {
    r.get(&["python_heap", "growing"])
        .as_array()
        .and_then(|g| g.iter().find(|x| x["type"] == ty))
        .unwrap_or_else(|| panic!("type {ty} is not among the growing types\n{ctx}"))
}

/// How long the event-bus fixture is recorded, seconds.
const EVENT_BUS_SECS: u32 = 6;

fn event_bus(name: &str, interp: &Path) {
    // 6 s: the censuses at the first checkpoint and at the end count ~1,000 messages' objects
    // apart, against the fixture's own count over the same wall-clock times.
    let (r, progress, out) = record_heap(name, interp, "event_bus.py", &["200"], EVENT_BUS_SECS, "messages");
    let md = std::fs::read_to_string(out.path.join("report.md")).unwrap_or_default();
    let ctx = format!("report {}:\n{}\npython_heap: {:#}", out.path.display(), r.summary(), r.get(&["python_heap"]));
    let rate = actual_rate(&progress, EVENT_BUS_SECS, &out.path, &ctx);
    assert!(rate > 100.0, "the fixture ran {rate:.0} messages/s, far from its 200/s\n{ctx}");
    for (ty, pattern) in [
        ("function", "__main__.bus._handlers[…][…]"),
        ("list", "__main__.bus._handlers[…]"),
        ("dict", "__main__.bus._handlers[…][…].__defaults__[0]"),
    ] {
        let g = growing(&r, ty, &ctx);
        eprintln!("{name}: {ty} {:+.1}/s (fixture {rate:.1} messages/s)", f64_of(g, "count_per_s"));
        assert_within(&format!("{ty} growth, objects/s"), f64_of(g, "count_per_s"), rate, 0.10, &ctx);
        assert_eq!(g["holder"]["kind"], "path", "{ty}\n{ctx}");
        assert_eq!(g["holder"]["pattern"], pattern, "{ty}\n{ctx}");
        assert_within(&format!("{ty} holder growth"), f64_of(&g["holder"], "count_per_s"), rate, 0.10, &ctx);
    }
    // The path of one message dict, root first, in Python terms: the module global, then each
    // edge and the object it leads to.
    let path = growing(&r, "dict", &ctx)["holder"]["path"].as_array().cloned().unwrap_or_default();
    assert_eq!((path[0]["step"].as_str(), path[0]["kind"].as_str()), (Some("root"), Some("module_global")), "{ctx}");
    assert_eq!(path[0]["name"], "__main__.bus", "{ctx}");
    let of = |step: &str, key: &str| -> Vec<String> {
        path.iter().filter(|s| s["step"] == step).map(|s| s[key].as_str().unwrap_or("").to_string()).collect()
    };
    let (edges, types) = (of("edge", "edge"), of("object", "type"));
    assert_eq!(edges.len(), 4, "{edges:?}\n{ctx}");
    assert_eq!(edges[0], "._handlers", "{ctx}");
    assert!(edges[1].starts_with("['ack:") && edges[2] == "[0]" && edges[3] == ".__defaults__[0]", "{edges:?}\n{ctx}");
    assert_eq!(types[0], "__main__.EventBus", "{ctx}");
    assert_eq!(types[3], "function handle_message.<locals>.on_ack", "{ctx}");
    assert_eq!(types[4], "dict", "{ctx}");
    assert_eq!(r.get(&["python_heap", "held_by"]), "__main__.bus._handlers", "{ctx}");
    let handlers = "listeners or handlers appended and never removed";
    assert_eq!(growing(&r, "function", &ctx)["leak_pattern"], handlers, "{ctx}");
    let verdict = str_of(r.get(&["verdict"]), "summary");
    assert!(verdict.contains("held by `__main__.bus._handlers`"), "{verdict}\n{ctx}");
    assert!(verdict.contains(handlers), "{verdict}\n{ctx}");
    assert!(md.contains("## What holds it") && md.contains("`__main__.bus._handlers[…][…]`"), "{md}");
    // The bounded look-alikes: held, full, not growing.
    let all = r.get(&["python_heap", "growing"]).as_array().cloned().unwrap_or_default();
    for g in &all {
        let p = g["holder"]["pattern"].as_str().unwrap_or("");
        assert!(!p.starts_with("__main__.recent") && !p.starts_with("__main__.render"), "{p} grows\n{ctx}");
    }
    let steady = r.get(&["python_heap", "steady"]).as_array().cloned().unwrap_or_default();
    let held = |prefix: &str, ty: &str, n: u64| {
        steady.iter().any(|s| {
            s["type"] == ty
                && s["holder"]["pattern"].as_str().is_some_and(|p| p.starts_with(prefix))
                && u64_of(s, "count_last") == n
                && u64_of(s, "count_first") == n
        })
    };
    assert!(held("__main__.recent[…]", "tuple", 500), "the deque's 500 tuples, steady\n{ctx}");
    let deque =
        steady.iter().find(|s| s["holder"]["pattern"].as_str().is_some_and(|p| p.starts_with("__main__.recent")));
    assert_eq!(deque.map(|d| &d["look_alike"]), Some(&Value::from("a full deque(maxlen=…)")), "{ctx}");
    assert!(held("__main__.render.", "functools._lru_list_elem", 256), "the lru_cache's 256 entries, steady\n{ctx}");
}

fn zip_service(name: &str, interp: &Path) {
    let (r, progress, out) = record_heap(name, interp, "zip_service.py", &["40", "3600", "5"], 10, "jobs");
    let ctx = format!("report {}:\n{}\npython_heap: {:#}", out.path.display(), r.summary(), r.get(&["python_heap"]));
    // Every 5th job's ZIP stays.
    let leak = actual_rate(&progress, 10, &out.path, &ctx) / 5.0;
    let g = growing(&r, "bytes", &ctx);
    eprintln!(
        "{name}: bytes {:+.2}/s, {:+.0} B/s (fixture leaks {leak:.2}/s, {:.0} B/s)",
        f64_of(g, "count_per_s"),
        f64_of(g, "bytes_per_s"),
        leak * (24.0 * 1024.0 + 250.0)
    );
    assert_within("bytes growth, objects/s", f64_of(g, "count_per_s"), leak, 0.15, &ctx);
    // A ZIP: 24 KiB of data, the archive's headers, the bytes object's header.
    let zip = 24.0 * 1024.0 + 250.0;
    assert_within("bytes growth, B/s", f64_of(g, "bytes_per_s"), leak * zip, 0.15, &ctx);
    assert_eq!(g["holder"]["pattern"], "__main__._PENDING[…]", "{ctx}");
    // Root (the module global), the dict, the key's edge, the bytes object.
    let path = g["holder"]["path"].as_array().cloned().unwrap_or_default();
    assert_eq!(path.len(), 4, "{ctx}");
    assert_eq!(path[0]["name"], "__main__._PENDING", "{ctx}");
    assert!(path[2]["edge"].as_str().is_some_and(|e| e.starts_with("['job-")), "{ctx}");
    assert_eq!(r.get(&["python_heap", "held_by"]), "__main__._PENDING", "{ctx}");
    assert!(g["leak_pattern"].as_str().is_some_and(|p| p.starts_with("a dict keyed by ids")), "{ctx}");
    let verdict = str_of(r.get(&["verdict"]), "summary");
    assert!(verdict.contains("held by `__main__._PENDING`"), "{verdict}\n{ctx}");
}

/// A C extension that never releases a record dict per call: dict and list objects grow at the
/// call rate (within 10 %), referenced from nowhere; the verdict says so.
#[test]
fn python_heap_reference_leaked_by_an_extension_311() {
    let (r, progress, out) = record_refleak("pyheap-refleak-311", &[], 10);
    let ctx = format!("report {}:\n{}\npython_heap: {:#}", out.path.display(), r.summary(), r.get(&["python_heap"]));
    let rate = actual_rate(&progress, 10, &out.path, &ctx);
    for ty in ["dict", "list"] {
        let g = growing(&r, ty, &ctx);
        eprintln!("refleak: {ty} {:+.1}/s (fixture {rate:.1} calls/s)", f64_of(g, "count_per_s"));
        assert_within(&format!("{ty} growth, objects/s"), f64_of(g, "count_per_s"), rate, 0.10, &ctx);
        assert_eq!(g["holder"]["kind"], "nowhere", "{ty}\n{ctx}");
        assert_within(&format!("{ty} holder growth"), f64_of(&g["holder"], "count_per_s"), rate, 0.10, &ctx);
    }
    let verdict = str_of(r.get(&["verdict"]), "summary");
    assert!(verdict.contains("referenced from nowhere"), "{verdict}\n{ctx}");
}

/// The same extension with `--pymalloc` (every object's block traced by stack): the objects
/// referenced from nowhere are matched to their blocks, whose stack names the extension's
/// function that allocated them (`record`, or `remember` when it is inlined there), and the
/// verdict says so. (CPython's dict and list free lists hand `remember` the objects `release`
/// freed, so the callers in that stack may be `release`'s: the stack of an object's first
/// allocation, as tracemalloc reports it too.) 16 s: `--pymalloc` slows the interpreter's
/// start-up, so the first census comes before the calls begin and the rates are not checked.
#[test]
fn python_heap_reference_leak_names_the_extension_function_311() {
    let (r, _, out) = record_refleak("pyheap-refleak-pymalloc-311", &["--pymalloc"], 16);
    let ctx = format!("report {}:\n{}\npython_heap: {:#}", out.path.display(), r.summary(), r.get(&["python_heap"]));
    for ty in ["dict", "list"] {
        let g = growing(&r, ty, &ctx);
        assert_eq!(g["holder"]["kind"], "nowhere", "{ty}\n{ctx}");
        let by = g["holder"]["allocated_by"].as_str().unwrap_or_else(|| panic!("{ty}: no allocated_by\n{ctx}"));
        assert!(["remember", "record"].contains(&by), "{ty} allocated by {by}\n{ctx}");
        let id = g["holder"]["allocated_stack"].as_u64().unwrap_or_else(|| panic!("{ty}: no allocated_stack\n{ctx}"));
        let site =
            r.sites().iter().find(|s| s["id"].as_u64() == Some(id)).unwrap_or_else(|| panic!("site {id}\n{ctx}"));
        let frames: Vec<&str> =
            site["frames"].as_array().into_iter().flatten().filter_map(|f| f["function"].as_str()).collect();
        assert!(frames.contains(&"record") || frames.contains(&"remember"), "{ty}: {frames:?}\n{ctx}");
    }
    let verdict = str_of(r.get(&["verdict"]), "summary");
    assert!(verdict.contains("allocated by remember") || verdict.contains("allocated by record"), "{verdict}\n{ctx}");
}

/// Build tests/fixtures/pyheap/refleak_ext.c for pyenv 3.11 and record refleak.py (100 calls a
/// second) for `secs` with `extra` options.
fn record_refleak(name: &str, extra: &[&str], secs: u32) -> (Report, Vec<(f64, f64)>, OutDir) {
    let interp = pyenv("3.11.7");
    let dir = build_refleak_extension(&interp, "311");
    let dir_arg = dir.to_string_lossy().into_owned();
    record_heap_with(name, &interp, extra, ("refleak.py", &[&dir_arg, "100", "3600"]), secs, "calls")
}

fn pyenv(v: &str) -> std::path::PathBuf {
    Path::new(PYENV).join(v).join("bin/python3")
}

#[test]
fn python_heap_event_bus_shared_311() {
    event_bus("pyheap-bus-311", &pyenv("3.11.7"));
}

#[test]
fn python_heap_event_bus_debian_static_311() {
    event_bus("pyheap-bus-deb311", Path::new("/usr/bin/python3.11"));
}

#[test]
fn python_heap_event_bus_39() {
    event_bus("pyheap-bus-39", &pyenv("3.9.18"));
}

#[test]
fn python_heap_event_bus_312() {
    event_bus("pyheap-bus-312", &pyenv("3.12.1"));
}

#[test]
fn python_heap_zip_service_shared_311() {
    zip_service("pyheap-zip-311", &pyenv("3.11.7"));
}

#[test]
fn python_heap_zip_service_debian_static_311() {
    zip_service("pyheap-zip-deb311", Path::new("/usr/bin/python3.11"));
}

/// On a target without CPython, `--python-heap` says it did nothing (one line, in the
/// recording's warnings too) and the recording goes on.
#[test]
fn python_heap_on_a_native_target_is_noted() {
    require_root();
    let out = OutDir::new("pyheap-native");
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--python-heap", "--duration", "1s", "--out"]);
    cmd.arg(&out.path).args(["--", "sleep", "5"]);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    let line = "runs no CPython interpreter; no Python heap census";
    assert!(o.stderr.contains(line), "{}", o.describe());
    let r = Report::load(&out.path);
    assert!(r.get(&["python_heap"]).is_null(), "{}", o.describe());
}

/// Bad input: `--python-heap-every` without `--python-heap` is one clear error.
#[test]
fn python_heap_options_need_the_flag() {
    let o = run(leaktrace(["record", "--python-heap-every", "2", "--", "true"]), None, TIMEOUT);
    assert_eq!(o.code(), Some(2), "{}", o.describe());
    assert!(o.stderr.contains("--python-heap"), "{}", o.describe());
}

#[test]
fn python_heap_event_bus_313() {
    event_bus("pyheap-bus-313", &pyenv("3.13.0"));
}

#[test]
fn python_heap_event_bus_38() {
    event_bus("pyheap-bus-38", &pyenv("3.8.18"));
}

/// The target survives 50 censuses in a row with its output unchanged: survive.py (a mixed
/// heap mutated in place every step, 2,000 steps over ~20 s) recorded with a census at every
/// 100 ms checkpoint prints the same checksum as an untraced run, runs all its steps and
/// exits 0.
#[test]
fn python_heap_target_survives_50_censuses() {
    require_root();
    let interp = pyenv("3.11.7");
    let script = fixture_source("pyheap").join("survive.py");
    let untraced = std::process::Command::new(&interp).arg(&script).args(["2000", "20"]).output().expect("python3");
    assert!(untraced.status.success(), "untraced run: {untraced:?}");
    let want = String::from_utf8_lossy(&untraced.stdout).into_owned();
    assert!(want.contains("checksum ") && want.contains("steps 2000"), "untraced run printed {want}");
    let out = OutDir::new("pyheap-survive");
    let mut cmd = leaktrace(["record", "--interval", "100ms", "--python-heap", "--python-heap-every", "1", "--out"]);
    cmd.arg(&out.path).arg("--").arg(&interp).arg(&script).args(["2000", "20"]);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    assert_no_panic(&o);
    let r = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), r.summary());
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(out.path.join("recording.json")).expect("json"))
        .expect("recording.json");
    let censuses = rec["python_heap"].as_array().cloned().unwrap_or_default();
    let pauses: Vec<f64> = censuses.iter().map(|c| f64_of(c, "pause_ms")).collect();
    eprintln!(
        "survive: {} censuses, pauses {:.0}–{:.0} ms",
        censuses.len(),
        pauses.iter().copied().fold(f64::INFINITY, f64::min),
        pauses.iter().copied().fold(0.0, f64::max)
    );
    // The fixture's heap is about 36 k objects once built (the first census may come during
    // its start-up).
    let full = censuses.iter().filter(|c| c["objects"].as_u64().unwrap_or(0) > 20_000).count();
    assert!(full >= 50, "{full} censuses of the built heap ({} in all), fewer than 50\n{ctx}", censuses.len());
    assert_eq!(r.get(&["target", "exit_status"]).as_i64(), Some(0), "{ctx}");
    let got: String = o
        .stdout
        .lines()
        .filter(|l| l.starts_with("checksum ") || l.starts_with("steps "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(got, want, "the target's output changed under the censuses\n{ctx}");
}
