//! Load-spike plateaus under Node (the issue's own case): a Node service whose
//! heavy job at each spike allocates many native buffers (their backing stores malloc'd by
//! Node's ArrayBuffer allocator) and keeps 1 in 64; glibc keeps the peak's pages, so RSS rises in
//! steps at the spikes and stays flat between them. The verdict names the steps, says "not a
//! leak", and the occupied heap to RSS carries the V8 heap's part. tests/fixtures/runtimes/spikes.js
//! says why it collects its garbage with `global.gc()` at each job's end (`--expose-gc`).
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use leaktrace_tests::runtimes::*;
use leaktrace_tests::*;

/// spikes.js recorded 30 s, a service still running when the recording ends (spikes from ~2 s
/// after node starts, every 4 s, of 8, 16, 24, 32, 32, ... MiB of 4 KiB Buffers, 1 in 64 kept
/// until the next spike) under `--perf-basic-prof` (the JavaScript function is named): RSS anon rises by
/// ~9 MiB at each of the first four spikes (the buffers' backing stores and their BackingStore
/// records in glibc's heap, the Buffers' objects in V8's heap; measured without leaktrace: 6.5 →
/// 16.1 → 25.1 → 34.9 → 43.7 MiB) and stays flat between them. The verdict is not a leak and
/// names 3 or 4 steps at spikes (and at most one more before them: node's start-up, when a loaded
/// machine delays it past the recording's first checkpoints), each 6–14 MiB, 3–5 s after the one
/// before, with at least 4 MiB allocated in it (half the first spike), allocated
/// mostly by `spike` (its perf-map frame); report.json's `summary.occupied` carries a V8 part
/// (`managed_bytes` > 0, `managed_source` naming V8) and a ratio above 5 % (measured 20 %). No
/// site is a leak. (The report: "no leak" with nothing about the steps, the occupied
/// ratio 0.0 %; fixed by the plateau and occupied-heap rules before this test was written.)
/// With mmap tracing working (kernel 6.18), V8's old space seen rising at some of the later
/// spikes (+24, +8, +232 KiB over the steady window) read "managed leak: the V8 heap grows
/// +19.1 KiB/s" until a managed heap that rises only at a plateau's spikes was judged part of it.
#[test]
fn node_load_spike_plateau_is_named_with_its_steps_and_v8_part() {
    require_root();
    let mut cmd = node();
    cmd.args(["--expose-gc", "--perf-basic-prof"]).arg(src("spikes.js")).arg("60");
    let (r, ctx, _out) = record_with("node-spikes", cmd, &["--duration", "30s"]);
    assert_runtime(&r, "node", &ctx);
    let ctx = format!("{ctx}\noccupied: {:#}", r.json["summary"]["occupied"]);
    let (verdict, summary) = assert_plateau_verdict(&r, &ctx);
    let steps = verdict["plateau"]["steps"].as_array().unwrap_or_else(|| panic!("no verdict.plateau.steps\n{ctx}"));
    // Under a loaded machine node's own start-up (V8 setting up its heap) can come seconds after
    // the recording began, and then reads as a first step; every other step is a spike's.
    let is_spike = |s: &&serde_json::Value| s["top_function"].as_str().is_some_and(|f| f.contains("spike"));
    let spikes: Vec<&serde_json::Value> = steps.iter().filter(is_spike).collect();
    assert!((3..=4).contains(&spikes.len()), "{} steps at spikes\n{ctx}", spikes.len());
    let others = steps.len() - spikes.len();
    assert!(
        others <= 1 && steps[others..].iter().all(|s| is_spike(&s)),
        "a step not at a spike after the first\n{ctx}"
    );
    for s in &spikes {
        let mib = f64_of(s, "bytes") / (1 << 20) as f64;
        assert!((6.0..=14.0).contains(&mib), "a step of {mib:.1} MiB\n{ctx}");
        // A spike's allocation can straddle checkpoints, and a step holds only the intervals
        // in which RSS rose: measured 7.0–30.6 MiB (the 8 MiB first spike: 7.0, 9.2, 9.4 MiB).
        assert!(f64_of(s, "allocated_bytes") >= 4.0 * (1 << 20) as f64, "{ctx}");
    }
    for w in spikes.windows(2) {
        let gap = f64_of(w[1], "t_s") - f64_of(w[0], "t_s");
        assert!((3.0..=5.0).contains(&gap), "steps {gap:.2} s apart\n{ctx}");
    }
    let occupied = &r.json["summary"]["occupied"];
    assert!(occupied["managed_bytes"].as_u64().unwrap_or(0) > 0, "no managed part in the occupied heap\n{ctx}");
    let source = occupied["managed_source"].as_str().unwrap_or("");
    assert!(source.contains("V8"), "managed part's source {source:?} does not name V8\n{ctx}");
    let ratio = occupied["ratio"].as_f64().unwrap_or(0.0);
    assert!(ratio > 0.05, "occupied heap to RSS {ratio}\n{ctx}");
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.is_empty(), "{leaks:?}\n{ctx}");
    eprintln!("{summary}\noccupied: {occupied}");
}
