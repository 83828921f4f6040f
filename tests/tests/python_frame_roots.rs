//! The live threads' frame locals are roots of the Python heap census:
//! tests/fixtures/pyheap/frame_locals.py runs a worker thread whose function `worker` appends a
//! `Job` per step to its LOCAL list `cache` (100 a second; held by the worker's frame and by
//! nothing else), beside a C extension (refleak_ext.c) that leaks a dict and a list per call
//! (100 calls a second, a missing `Py_DECREF`), recorded with `--python-heap`.
//!
//! Checked: every `Job` of the last census is held by "local `cache` of worker()" (its example
//! path starts at that local, with the worker's thread id and the frame's line, then the list),
//! their count is the jobs the worker made by then (±5 %), none is "referenced from nowhere";
//! the extension's lists and dicts are still referenced from nowhere, as many as its calls
//! (±10 %, counted from the first census after the calls began), and with `--pymalloc` their
//! holder names the extension function that allocated them (`record`, or `remember` where it is
//! inlined). Under pyenv 3.12 and 3.9 with `--pymalloc`, pyenv 3.11 and Debian's static
//! /usr/bin/python3.11 without it (3.8–3.10 keep frames as objects with `f_localsplus`, 3.11+
//! `_PyInterpreterFrame`s).
//! Before the locals were roots, the jobs were "referenced from nowhere" (the verdict called
//! them a reference leaked by native code).
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};

use leaktrace_tests::*;

const PYENV: &str = "/root/.pyenv/versions";

/// N at wall-clock time `t` (s), interpolated between the progress lines around it (or
/// extrapolated at their pace from the last one, for the census at the end, at most 2 s after
/// it: a line is printed every second). None before the first line ("N 0" at the start).
fn made_by(p: &[(f64, f64)], t: f64, ctx: &str) -> Option<f64> {
    assert!(
        p.len() >= 2 && t < p[p.len() - 1].1 + 2.0,
        "no progress lines around the census at {t:.3}: {:?}\n{ctx}",
        &p[p.len().saturating_sub(3)..]
    );
    if t < p[0].1 {
        return None;
    }
    let k = p.partition_point(|x| x.1 <= t).clamp(1, p.len() - 1);
    let (a, b) = (p[k - 1], p[k]);
    Some(a.0 + (b.0 - a.0) * (t - a.1) / (b.1 - a.1))
}

/// The holders of type `ty` in a census of recording.json.
fn holders<'a>(census: &'a Value, ty: &str) -> &'a [Value] {
    census["types"]
        .as_array()
        .and_then(|t| t.iter().find(|x| x["name"] == ty))
        .and_then(|t| t["holders"].as_array())
        .map_or(&[], Vec::as_slice)
}

/// Record the fixture under `interp`; with `pymalloc`, the allocator's calls are traced and the
/// leaked objects must name the extension's function.
fn frame_roots(name: &str, interp: &Path, pymalloc: bool) {
    require_root();
    assert!(interp.exists(), "{} is missing (cargo xtask setup installs it)", interp.display());
    let ext = build_refleak_extension(interp, name);
    let out = OutDir::new(name);
    let mut cmd = leaktrace(["record", "--interval", "1s", "--python-heap", "--python-heap-every", "4"]);
    // `--pymalloc` slows the interpreter's start-up (8 s and more on a loaded host).
    let secs = if pymalloc { "26s" } else { "14s" };
    cmd.args(["--duration", secs]).args(pymalloc.then_some("--pymalloc"));
    cmd.arg("--out").arg(&out.path).arg("--").arg(interp).arg(fixture_source("pyheap").join("frame_locals.py"));
    cmd.arg(&ext).args(["100", "3600"]);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    assert_no_panic(&o);
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\npython_heap: {:#}", out.path.display(), r.summary(), r.get(&["python_heap"]));
    let rec: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path.join("recording.json")).expect("recording.json"))
            .expect("json");
    let censuses = rec["python_heap"].as_array().cloned().unwrap_or_default();
    let (jobs_p, calls_p) = (o.progress("jobs"), o.progress("calls"));
    let at = |c: &Value| f64_of(c, "unix_ms") / 1e3;
    let last = censuses.last().unwrap_or_else(|| panic!("no census\n{ctx}"));
    let jobs = made_by(&jobs_p, at(last), &ctx).unwrap_or_else(|| panic!("the worker had not started\n{ctx}"));
    let calls = made_by(&calls_p, at(last), &ctx).unwrap_or_else(|| panic!("no call made\n{ctx}"));
    // The baseline of the reference leak: the first census once the calls began (the
    // interpreter's own state has objects referenced from nowhere too).
    let base = censuses.iter().find(|c| made_by(&calls_p, at(c), &ctx).is_some()).expect("census");
    let calls_base = made_by(&calls_p, at(base), &ctx).unwrap_or(0.0);
    assert!(calls - calls_base >= 300.0, "{calls_base:.0} → {calls:.0} calls between the censuses\n{ctx}");

    // The jobs: all held by the worker's local, none from nowhere.
    let job = holders(last, "__main__.Job");
    let held: Vec<&Value> = job.iter().filter(|h| h["pattern"] == "local `cache` of worker()[…]").collect();
    assert_eq!(held.len(), 1, "the jobs held by worker's local `cache`\n{job:#?}\n{ctx}");
    let count = u64_of(held[0], "count") as f64;
    eprintln!("{name}: {count} jobs held by local `cache` of worker() (the worker made {jobs:.0})");
    assert_within("jobs held by the local", count, jobs, 0.05, &ctx);
    assert_eq!(held[0]["kind"], "path", "{ctx}");
    assert!(job.iter().all(|h| h["kind"] != "nowhere"), "jobs referenced from nowhere\n{job:#?}\n{ctx}");
    let root = held[0]["example"][0].clone();
    let edge = str_of(&root, "edge");
    assert!(
        edge.starts_with("local `cache` of worker() (thread ") && edge.contains(", frame_locals.py:"),
        "{edge}\n{ctx}"
    );
    assert_eq!(root["type"], "list", "{ctx}");
    assert_eq!(held[0]["example"][1]["type"], "__main__.Job", "{ctx}");
    let g = r.get(&["python_heap", "growing"]).as_array().cloned().unwrap_or_default();
    let grown = g.iter().find(|x| x["type"] == "__main__.Job").unwrap_or_else(|| panic!("Job not growing\n{ctx}"));
    assert_eq!(grown["holder"]["pattern"], "local `cache` of worker()[…]", "{ctx}");
    let md = std::fs::read_to_string(out.path.join("report.md")).unwrap_or_default();
    assert!(md.contains("`local 'cache' of worker()[…]`"), "{md}");

    // The reference leak beside it: still referenced from nowhere, named by its function.
    for ty in ["dict", "list"] {
        let nowhere =
            |c: &'_ Value| -> Option<Value> { holders(c, ty).iter().find(|h| h["kind"] == "nowhere").cloned() };
        let now = nowhere(last).unwrap_or_else(|| panic!("{ty}: none referenced from nowhere\n{ctx}"));
        let before = nowhere(base).map_or(0, |h| u64_of(&h, "count"));
        let n = (u64_of(&now, "count") - before) as f64;
        eprintln!("{name}: {ty} referenced from nowhere +{n} ({:.0} calls)", calls - calls_base);
        assert_within(&format!("{ty} objects referenced from nowhere"), n, calls - calls_base, 0.10, &ctx);
        if !pymalloc {
            continue;
        }
        let by = now["allocated_by"].as_str().unwrap_or_else(|| panic!("{ty}: no allocated_by\n{ctx}"));
        assert!(["remember", "record"].contains(&by), "{ty} allocated by {by}\n{ctx}");
    }
}

fn pyenv(v: &str) -> PathBuf {
    Path::new(PYENV).join(v).join("bin/python3")
}

#[test]
fn python_heap_frame_locals_are_roots_debian_static_311() {
    frame_roots("pyheap-frames-deb311", Path::new("/usr/bin/python3.11"), false);
}

#[test]
fn python_heap_frame_locals_are_roots_311() {
    frame_roots("pyheap-frames-311", &pyenv("3.11.7"), false);
}

#[test]
fn python_heap_frame_locals_are_roots_312() {
    frame_roots("pyheap-frames-312", &pyenv("3.12.1"), true);
}

#[test]
fn python_heap_frame_locals_are_roots_39() {
    frame_roots("pyheap-frames-39", &pyenv("3.9.18"), true);
}
