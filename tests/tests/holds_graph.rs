//! What holds it, across languages: one heap graph of Python objects and traced native blocks.
//!
//! An image-upload worker (tests/fixtures/pyheap/upload_worker.py) decodes `imgbuf.Buffer`
//! objects with a C extension of its own (imgbuf_ext.c, built here with the interpreter's headers,
//! -O2), each owning a 3,000-byte malloc'd pixel buffer (`img_alloc_buffer` ← `decode_batch`); it
//! files one per upload in the module-level `PENDING` dict and never removes it, keeps another in
//! a bounded LRU cache (`CACHE`, the newest 200) and frees three temporaries per upload.
//! `record --python-heap` (exact mode: the live blocks are read in the census's stop) must say
//! that `__main__.PENDING` retains the native bytes (within 10 % of the fixture's own count at
//! the last census), name it in the verdict with the allocating functions, list `CACHE` as not
//! a leak, and say nothing of the temporaries.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;

use leaktrace_tests::*;

const PYTHON: &str = "/root/.pyenv/versions/3.11.7/bin/python3";
/// Bytes of each Buffer's pixel buffer (upload_worker.py's SIZE).
const SIZE: f64 = 3000.0;

/// imgbuf_ext.c built for `interp` (once per test run).
fn build_imgbuf(interp: &Path) -> PathBuf {
    build_python_extension(interp, "fixtures-imgbuf-311", "imgbuf", "imgbuf_ext.c")
}

/// The fixture's `uploads N T` lines as (N entries in PENDING, wall-clock T), interpolated at
/// wall-clock time `t`.
fn pending_at(progress: &[(f64, f64)], t: f64) -> f64 {
    let k = progress.partition_point(|p| p.1 <= t).clamp(1, progress.len() - 1);
    let (a, b) = (progress[k - 1], progress[k]);
    a.0 + (b.0 - a.0) * (t - a.1) / (b.1 - a.1)
}

#[test]
fn python_dict_of_extension_objects_retains_their_native_buffers() {
    require_root();
    let interp = Path::new(PYTHON);
    assert!(interp.exists(), "{PYTHON} is missing (cargo xtask setup installs it)");
    let ext = build_imgbuf(interp);
    let out = OutDir::new("holds-graph-py");
    let mut cmd = leaktrace(["record", "--interval", "1s", "--python-heap", "--duration", "12s", "--out"]);
    cmd.arg(&out.path).arg("--").arg(interp).arg(fixture_source("pyheap").join("upload_worker.py"));
    cmd.arg(&ext).args(["50", "3600"]);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    assert_no_panic(&o);
    let progress = o.progress("uploads");
    let r = Report::load(&out.path);
    let md = std::fs::read_to_string(out.path.join("report.md")).unwrap_or_default();
    let ctx = format!("report {}:\n{}\npython_heap: {:#}", out.path.display(), r.summary(), r.get(&["python_heap"]));
    assert!(progress.len() >= 4, "the fixture made no progress\n{}", o.describe());
    let rec: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path.join("recording.json")).expect("recording.json"))
            .expect("json");
    let last = rec["python_heap"].as_array().and_then(|c| c.last().cloned()).expect(&ctx);
    let truth = pending_at(&progress, last["unix_ms"].as_f64().unwrap_or(0.0) / 1e3) * SIZE;

    let retainers = r.get(&["python_heap", "retainers"]).as_array().cloned().unwrap_or_default();
    let find = |c: &str| retainers.iter().find(|x| x["container"] == c).cloned();
    let pending = find("__main__.PENDING").unwrap_or_else(|| panic!("no retainer __main__.PENDING\n{ctx}"));
    let native = pending["retained_last"]["native"].as_f64().unwrap_or(0.0);
    eprintln!("holds_graph: __main__.PENDING retains {native:.0} native bytes (fixture: {truth:.0})");
    assert_within("native bytes retained by __main__.PENDING", native, truth, 0.10, &ctx);
    assert_eq!(pending["type"], "imgbuf.Buffer", "{ctx}");
    assert_eq!(pending["leak"], true, "{ctx}");
    assert!(f64_of(&pending, "native_share") > 0.9, "{ctx}");
    // The retaining path on the wire: the root, the dict, the key, a Buffer, its native block.
    let path = pending["retain_path"].as_array().cloned().unwrap_or_default();
    let steps: Vec<&str> = path.iter().map(|s| s["step"].as_str().unwrap_or("")).collect();
    assert_eq!(steps, ["root", "object", "edge", "object", "native"], "{ctx}");
    assert_eq!((path[0]["kind"].as_str(), path[0]["name"].as_str()), (Some("module_global"), Some("__main__.PENDING")));
    assert_eq!(path[3]["type"], "imgbuf.Buffer", "{ctx}");
    assert_eq!(path[4]["bytes"], 3000, "{ctx}");
    // The same holder in the one list of every producer's holders.
    let held = r.get(&["what_holds"]).as_array().cloned().unwrap_or_default();
    let listed = held.iter().find(|h| h["holder"] == "__main__.PENDING").unwrap_or_else(|| panic!("{ctx}"));
    assert_eq!((listed["kind"].as_str(), listed["growing"].as_bool()), (Some("module_global"), Some(true)), "{ctx}");
    assert_eq!(listed["retained"]["native"], pending["retained_last"]["native"], "{ctx}");
    let by = pending["allocated_by"].as_str().unwrap_or_else(|| panic!("no allocated_by\n{ctx}"));
    assert_eq!(by, "img_alloc_buffer ← decode_batch", "{ctx}");

    // The bounded cache: listed, not a leak; its native bytes are its 200 buffers.
    let cache = find("__main__.CACHE").unwrap_or_else(|| panic!("no retainer __main__.CACHE\n{ctx}"));
    assert_eq!(cache["leak"], false, "{ctx}");
    assert_within(
        "native bytes retained by the cache",
        f64_of(&cache["retained_last"], "native"),
        200.0 * SIZE,
        0.10,
        &ctx,
    );
    // The temporaries: held by nothing that retains them (the interpreter's own holders of
    // native blocks, e.g. locks in module globals, may be listed: none of them leaks).
    for x in &retainers {
        let c = x["container"].as_str().unwrap_or("");
        if x["type"] == "imgbuf.Buffer" {
            assert!(c == "__main__.PENDING" || c == "__main__.CACHE", "{c}\n{ctx}");
        } else {
            assert_eq!(x["leak"], false, "{c}\n{ctx}");
        }
    }

    let verdict = str_of(r.get(&["verdict"]), "summary");
    assert!(verdict.contains("`__main__.PENDING` retains +"), "{verdict}\n{ctx}");
    assert!(verdict.contains("native, allocated by `img_alloc_buffer` ← `decode_batch`"), "{verdict}\n{ctx}");
    assert!(!verdict.contains("CACHE"), "{verdict}\n{ctx}");
    assert!(md.contains("- **`__main__.PENDING`** (module global, python)"), "{md}");
    assert!(md.contains("- **`__main__.CACHE`**") && md.contains("not growing: not a leak"), "{md}");
}

/// Bytes of each of DirectHolds.java's direct buffers, and the buffers its list keeps.
const FRAME: f64 = 16384.0;
const LEAK_COUNT: f64 = 700.0;

/// JVM: DirectHolds (tests/fixtures/runtimes/DirectHolds.java) files one
/// `ByteBuffer.allocateDirect(16384)` a frame in the static list `LEAKED` (100 frames a second,
/// up to 700), keeps the newest 200 frames' buffers in the static LRU map `CACHE` (full from the start), and drops
/// three temporaries a frame. With `--heap-dump` (a first dump once the first class histogram is
/// taken, the last at the end) each dump's direct buffers are matched by `Buffer.address` to the
/// traced malloc'd blocks: `DirectHolds.LEAKED` retains the 700 buffers' off-heap bytes (within
/// 15 %) and grew between the dumps (a leak), allocated by the fixture's `DirectHolds.frame`
/// (-XX:+PreserveFramePointer and `--jvm-perf-map` name the JIT frames; libjvm's allocator and
/// the JDK's classes are skipped); `CACHE` retains its 200 and is not a leak; no other holder is
/// a leak.
#[test]
fn jvm_static_list_of_direct_buffers_retains_their_off_heap_bytes() {
    require_root();
    let dir = built_once("holds_graph-java", |out| {
        let src = fixture_source("runtimes").join("DirectHolds.java");
        run_build_step(Command::new("javac").arg("-d").arg(out).arg(src), "javac");
    });
    let mut cmd = Command::new("java");
    cmd.args(["-Xms32m", "-Xmx128m", "-XX:MaxDirectMemorySize=96m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
        // frame() stays a method of its own, should main's loop be compiled on stack replacement.
        .args([
            "-XX:+PreserveFramePointer",
            "-XX:CompileCommand=quiet",
            "-XX:CompileCommand=dontinline,DirectHolds::frame",
        ])
        .arg("-cp")
        .arg(dir)
        .arg("DirectHolds")
        .args(["100", &format!("{FRAME}"), &format!("{LEAK_COUNT}")]);
    let out = OutDir::new("holds-graph-jvm");
    let o = record_launch(&out, &["--heap-dump", "--jvm-perf-map", "--duration", "14s"], cmd);
    o.assert_success();
    assert_no_panic(&o);
    let r = Report::load(&out.path);
    let md = std::fs::read_to_string(out.path.join("report.md")).unwrap_or_default();
    let holds = &r.json["runtime_holds"];
    let ctx = format!(
        "report {}:\n{}\noff_heap_retainers: {:#}\nJVM census errors: {}\nlast dump taken: {}\nleaktrace stderr:\n{}",
        out.path.display(),
        r.summary(),
        holds["off_heap_retainers"],
        holds["jvm"]["errors"],
        holds["jvm_heap_dump"]["taken"],
        o.stderr
    );
    assert!(o.stdout.contains(&format!("leaked {LEAK_COUNT} done")), "the list never filled\n{}", o.describe());
    let retainers = holds["off_heap_retainers"].as_array().cloned().unwrap_or_default();
    let find = |c: &str| retainers.iter().find(|x| x["container"] == c).cloned();
    let leaked = find("DirectHolds.LEAKED").unwrap_or_else(|| panic!("no retainer DirectHolds.LEAKED\n{ctx}"));
    let off_heap = f64_of(&leaked["retained_last"], "off_heap");
    eprintln!(
        "holds_graph jvm: DirectHolds.LEAKED retains {off_heap:.0} off-heap bytes (fixture: {:.0}), first dump {}",
        LEAK_COUNT * FRAME,
        f64_of(&leaked["retained_first"], "off_heap")
    );
    assert_within("off-heap bytes retained by DirectHolds.LEAKED", off_heap, LEAK_COUNT * FRAME, 0.15, &ctx);
    assert_eq!(leaked["leak"], true, "{ctx}");
    let cache = find("DirectHolds.CACHE").unwrap_or_else(|| panic!("no retainer DirectHolds.CACHE\n{ctx}"));
    let cached = f64_of(&cache["retained_last"], "off_heap");
    eprintln!("holds_graph jvm: DirectHolds.CACHE retains {cached:.0} off-heap bytes (fixture: {:.0})", 200.0 * FRAME);
    assert_within("off-heap bytes retained by the cache", cached, 200.0 * FRAME, 0.15, &ctx);
    assert_eq!(cache["leak"], false, "{ctx}");
    for x in &retainers {
        if x["container"] != "DirectHolds.LEAKED" {
            assert_eq!(x["leak"], false, "{}\n{ctx}", x["container"]);
        }
    }
    assert_eq!(retainers[0]["container"], "DirectHolds.LEAKED", "{ctx}");
    let line = md.lines().find(|l| l.starts_with("- **`DirectHolds.LEAKED`**")).unwrap_or_else(|| panic!("{md}"));
    assert!(line.contains("; retains ") && line.contains("**growing**"), "{md}");
    let holder = r.json["verdict"]["holder"].as_str().unwrap_or("");
    assert!(holder.starts_with("`DirectHolds.LEAKED` retains +"), "verdict.holder: {holder}\n{ctx}");
    leaktrace_tests::runtimes::remove_perf_map(&r);
    // Allocated by the fixture's own method (JIT code named from the perf map), not by
    // libjvm's os::malloc nor the JDK's DirectByteBuffer; its caller, main, may be interpreted.
    let by = leaked["allocated_by"].as_str().unwrap_or("");
    assert!(by.starts_with("DirectHolds.frame(int, long)"), "allocated_by: {by}\n{ctx}");
    assert!(by == "DirectHolds.frame(int, long)" || by.ends_with("← DirectHolds.main(java.lang.String[])"), "{by}");
    assert!(md.contains("allocated by `DirectHolds.frame(int, long)"), "{md}");
}
