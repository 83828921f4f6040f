//! Managed runtimes: the JVM (see runtimes.rs): the Java heap, direct buffers, JNI, the perf
//! map that names Java methods, JIT warm-up.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use leaktrace_tests::runtimes::*;
use leaktrace_tests::*;

/// The directory holding Grow.class, JniLeak.class, Ledger.class and OrderBook.class, once per
/// run ([`built_once`]).
fn java_classes() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        built_once("runtimes_jvm-java", |out| {
            check(
                Command::new("javac")
                    .arg("-d")
                    .arg(out)
                    .arg(src("Grow.java"))
                    .arg(src("JniLeak.java"))
                    .arg(src("Ledger.java"))
                    .arg(src("OrderBook.java")),
                "javac",
            );
        })
    })
}

/// libjnileak.so (jnileak.c, JniLeak's native methods), built against the JDK whose `javac` is
/// on PATH (its `include/` directory, found from javac's real path), once per run.
fn jnileak() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| built_once("runtimes_jvm-jnileak", |dir| drop(build_jni_leak_library(dir))).join("libjnileak.so"))
}

// ----------------------------------------------------------------------------------------------
// JVM

fn java(mode: &str, rate: &str, size: &str) -> Command {
    java_with(&[], mode, rate, size)
}

/// [`java`] with further JVM options before the class.
fn java_with(opts: &[&str], mode: &str, rate: &str, size: &str) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(opts);
    cmd.args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp"])
        .arg(java_classes())
        .args(["Grow", mode, rate, size]);
    cmd
}

#[test]
fn jvm_array_list_grows_the_java_heap() {
    require_root();
    // 20 s with the young generation fixed at 8 MiB (-Xmn8m): the heap is judged on what each
    // collection left, and a ~6.4 MiB eden filling at 5 MB/s is collected every ~1.3 s, however
    // far the old generation has grown (with the default sizing the young generation grows with
    // the heap: two CI runs saw 3 collections in the steady window of a 16 s recording, too few to
    // tell +3.6 MiB/s from zero at 95 %).
    let (r, ctx, _out) = record_for("jvm-managed", java_with(&["-Xmn8m"], "managed", "5000", "1000"), "20s");
    assert_runtime(&r, "jvm", &ctx);
    let m = kind(&r, "managed", &ctx);
    assert_eq!(m["source"], "hsperfdata", "the Java heap is measured from hsperfdata\n{ctx}");
    // 5000 × (1000 + 16 header) B/s of arrays, with young-generation garbage on top.
    let g = assert_grows(&r, "managed", 0.5 * 5_000_000.0, &ctx);
    assert_flat(&r, &["native", "off-heap"], g, &ctx);
    assert_verdict_starts(&r, "managed leak: the Java heap grows", &ctx);
    // The JVM maps data files (its modules image, hsperfdata, locale archives): no frame can be
    // in them, so no "no unwind table" caveat names them.
    let data: Vec<&str> = warnings_with(&r, "no unwind table")
        .into_iter()
        .filter(|w| ["/lib/modules", "/usr/lib/locale/", "hsperfdata", "gconv"].iter().any(|d| w.contains(d)))
        .collect();
    assert!(data.is_empty(), "caveats name data files: {data:?}\n{ctx}");
}

#[test]
fn jvm_direct_buffers_are_off_heap() {
    require_root();
    let (r, ctx, _out) = record("jvm-offheap", java("offheap", "500", "16384"));
    assert_runtime(&r, "jvm", &ctx);
    let g = assert_grows(&r, "off-heap", 0.8 * 500.0 * 16384.0, &ctx);
    assert!(g < 1.2 * 500.0 * 16384.0, "off-heap grows {g:.0} B/s, expected 500 × 16 KiB/s ± 20%\n{ctx}");
    assert_flat(&r, &["managed", "native"], g, &ctx);
    assert_verdict_starts(&r, "off-heap leak in Unsafe", &ctx);
}

/// JniLeak with `extra` arguments after the library: CALLS_PER_S STRING_LENGTH GARBAGE_BYTES_PER_CALL [release].
fn java_jni(jvm_flags: &[&str], extra: &[&str]) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-Xshare:auto"])
        .args(jvm_flags)
        .arg("-cp")
        .arg(java_classes())
        .arg("JniLeak")
        .arg(jnileak())
        .args(extra);
    cmd
}

/// A JNI library's leak made by libjvm's allocator wrapper. JniLeak.parse takes
/// GetStringUTFChars copies of a 1023-character string 200 times a second and never releases them
/// (1024 B each: 204,800 B/s), beside 64 KiB of young-generation garbage per call (13 MB/s of
/// 4 KiB arrays nothing keeps). The site is native and named after the JNI function
/// (Java_JniLeak_parse), not libjvm's os::malloc, at 204,800 B/s ± 10 %, with
/// ReleaseStringUTFChars as the missing release; the Java heap is measured at its post-GC troughs
/// and does not grow; no other site is a leak.
#[test]
fn jvm_jni_leak_through_the_jvm_allocator_is_native() {
    require_root();
    let cmd = java_jni(&["-XX:TieredStopAtLevel=1"], &["200", "1023", "65536"]);
    let (r, ctx, _out) = record_for("jvm-jni", cmd, "10s");
    assert_runtime(&r, "jvm", &ctx);
    let expected = 200.0 * 1024.0;
    let g = assert_grows(&r, "native", 0.9 * expected, &ctx);
    assert!(g < 1.1 * expected, "native grows {g:.0} B/s, expected 200 × 1024 B/s ± 10%\n{ctx}");
    let m = kind(&r, "managed", &ctx);
    assert_eq!(m["grows"], false, "the churning Java heap does not grow\n{ctx}");
    assert!(u64_of(m, "post_gc_troughs") >= 3, "the Java heap was not fitted on its post-GC troughs\n{ctx}");
    let top = top_site_of_kind(&r, "native", &ctx);
    assert_eq!(str_of(top, "function"), "Java_JniLeak_parse", "the JNI function is the culprit\n{ctx}");
    assert_eq!(str_of(top, "class"), "leak", "{ctx}");
    assert_within("Java_JniLeak_parse growth (B/s)", f64_of(top, "growth_bytes_per_s"), expected, 0.10, &ctx);
    assert_eq!(top["likely_missing_release"]["release"], "ReleaseStringUTFChars", "{ctx}");
    for s in r.sites().iter().filter(|s| str_of(s, "class") == "leak") {
        assert_eq!(str_of(s, "function"), "Java_JniLeak_parse", "another site called a leak\n{ctx}");
    }
    assert_verdict_starts(&r, "native leak in Java_JniLeak_parse (JNI code), Java heap flat", &ctx);
}

/// Ledger (Ledger.java): `rate` records a second of `size` bytes from Unsafe.allocateMemory in
/// `appendRecord`, never freed, beside the decoy `scratch` (as many calls, each freed). C1 only
/// (one compiled version of each method, compiled after a few hundred calls), and neither
/// method is inlined into main's loop, so each keeps its own JIT frame (inlined, a leak would
/// be named after the method it was inlined into).
fn ledger(jvm_flags: &[&str], rate: u32, size: u32) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-Xshare:auto", "-XX:TieredStopAtLevel=1"])
        .args(["-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,Ledger::*"])
        .args(jvm_flags)
        .arg("-cp")
        .arg(java_classes())
        .args(["Ledger", &rate.to_string(), &size.to_string()]);
    cmd
}

/// JVM with -XX:+PreserveFramePointer and --jvm-perf-map. Ledger.appendRecord leaks
/// 500 × 4096 B/s of Unsafe.allocateMemory blocks from JIT-compiled code; leaktrace runs `jcmd
/// PID Compiler.perfmap` and names the JIT frames from the map. The leak's sites name the Java
/// method (HotSpot's perf-map form, `void Ledger.appendRecord(long)`) as their culprit and grow,
/// together, at 2,048,000 B/s ± 10 %; the verdict names the method; the stack goes on through
/// the interpreted main loop into libjvm's JavaCalls (the walk crosses compiled and interpreted
/// Java frames). The decoy `Ledger.scratch` (same calls, each block freed) is seen, named, and
/// not a leak. No note asks for the flag or for -XX:+PreserveFramePointer.
#[test]
fn jvm_perf_map_names_the_java_method_that_leaks() {
    require_root();
    let cmd = ledger(&["-XX:+PreserveFramePointer"], 500, 4096);
    let (r, ctx, _out) = record_with("jvm-perfmap", cmd, &["--duration", "12s", "--jvm-perf-map"]);
    remove_perf_map(&r);
    assert_eq!(r.get(&["target", "runtime"]).as_str(), Some("jvm"), "target.runtime\n{ctx}");
    let leaking: Vec<&Value> = r
        .sites()
        .iter()
        .filter(|s| str_of(s, "class") == "leak" && str_of(s, "function").contains("Ledger.appendRecord"))
        .collect();
    assert!(!leaking.is_empty(), "no leak site named after Ledger.appendRecord\n{ctx}");
    for s in &leaking {
        assert_eq!(str_of(s, "function"), "void Ledger.appendRecord(long)", "HotSpot's perf-map name\n{ctx}");
        assert_eq!(str_of(s, "memory_kind"), "off-heap", "{ctx}");
    }
    let expected = 500.0 * 4096.0;
    let rate: f64 = leaking.iter().map(|s| f64_of(s, "growth_bytes_per_s")).sum();
    assert_within("Ledger.appendRecord growth (B/s)", rate, expected, 0.10, &ctx);
    // The walk: libjvm's Unsafe entry, the compiled method, main's loop (interpreted, or
    // compiled on stack replacement), the JVM's call into Java: a frame-pointer walk through JIT
    // and interpreter code, then unwind tables again.
    let top = leaking.iter().max_by(|a, b| f64_of(a, "growth_bytes_per_s").total_cmp(&f64_of(b, "growth_bytes_per_s")));
    let names = frame_names(top.unwrap());
    let after = |from: usize, pred: &dyn Fn(&str) -> bool| names[from..].iter().position(|n| pred(n)).map(|i| from + i);
    let walked = after(0, &|n| n.starts_with("Unsafe_AllocateMemory0"))
        .and_then(|i| after(i, &|n| n == "void Ledger.appendRecord(long)"))
        .and_then(|i| after(i + 1, &|n| n == "Interpreter" || n.contains("Ledger.main(")))
        .and_then(|i| after(i, &|n| n.starts_with("JavaCalls::call_helper")));
    assert!(
        walked.is_some(),
        "the stack does not go Unsafe_AllocateMemory0 → Ledger.appendRecord → main's loop (Interpreter) → \
         JavaCalls::call_helper: {names:?}\n{ctx}"
    );
    let verdict = str_of(&r.json["verdict"], "summary");
    assert!(verdict.contains("Ledger.appendRecord"), "the verdict does not name the method: {verdict}\n{ctx}");
    // The decoy: seen and named in the recording (its stacks: thousands of calls, each block
    // freed — one may be in flight at the last checkpoint), and no site of it is a leak.
    let decoy = totals_where(&r.dir, |frames| frames.iter().any(|f| f["function"] == "long Ledger.scratch(long)"));
    assert!(decoy.alloc_count >= 2000, "the decoy Ledger.scratch was not seen (or not named): {decoy:?}\n{ctx}");
    assert!(decoy.free_count + 1 >= decoy.alloc_count, "the decoy's blocks are not all freed: {decoy:?}\n{ctx}");
    let flagged: Vec<&str> = r
        .sites()
        .iter()
        .filter(|s| str_of(s, "class") == "leak" && frame_names(s).iter().any(|n| n.contains("Ledger.scratch")))
        .map(|s| str_of(s, "function"))
        .collect();
    assert!(flagged.is_empty(), "the decoy Ledger.scratch is called a leak: {flagged:?}\n{ctx}");
    assert!(warnings_with(&r, "Java frames named from the JVM's perf map").len() == 1, "no perf-map note\n{ctx}");
    for unwanted in ["--jvm-perf-map", "PreserveFramePointer", "Compiler.perfmap` failed"] {
        let w: Vec<&str> =
            warnings_with(&r, unwanted).into_iter().filter(|w| !w.starts_with("Java frames named")).collect();
        assert!(w.is_empty(), "unexpected note about {unwanted}: {w:?}\n{ctx}");
    }
}

/// One leak whose method the JIT compiles again while it is traced stays one site.
/// OrderBook (OrderBook.java) leaks 500 × 4096 B/s from `stashQuote`; the JVM runs it in C1
/// code, then C2 (low tier-4 thresholds: after about 10 s), then throws the C2 code away when
/// the quotes start to alternate sides at 11 s (a branch it never took: deoptimization), and
/// compiles it again (C1, then C2). Each version is a new native stack with the same named
/// frames. leaktrace attaches once the first version runs (`--pid`, 20 s, `--jvm-perf-map`).
/// The report has ONE site of the leak's path (Unsafe_AllocateMemory0 ← stashQuote), a leak,
/// naming the method, growing at 2,048,000 B/s ± 10 %, made of at least three stacks
/// (`merged_stacks`), and no cache or flat site on that path; the verdict's rate is the same.
/// Neither stashQuote nor the Unsafe wrappers are inlined (an inlined call changes the frames,
/// which no merge of identical stacks undoes); main stays interpreted (its frame never changes).
#[test]
fn jvm_recompiled_method_is_one_leak_site() {
    require_root();
    let mut java = Command::new("java");
    java.args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:+PreserveFramePointer", "-XX:CompileCommand=quiet"])
        .args([
            "-XX:CompileCommand=dontinline,OrderBook::stashQuote",
            "-XX:CompileCommand=dontinline,*Unsafe::allocateMemory",
        ])
        .args(["-XX:CompileCommand=exclude,OrderBook::main", "-XX:Tier4InvocationThreshold=3500"])
        .args(["-XX:Tier4CompileThreshold=4000", "-cp"])
        .arg(java_classes())
        .args(["OrderBook", "500", "4096", "11"]);
    let target = Target::spawn(java);
    target.expect_pid_line();
    assert_eq!(target.next_line(Duration::from_secs(60)).as_deref(), Some("warm"), "OrderBook never warmed up");
    let out = OutDir::new("jvm-recompiled");
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--interval", "250ms", "--duration", "20s"]);
    lt.args(["--jvm-perf-map", "--out"]).arg(&out.path);
    let o = run(lt, None, TIMEOUT);
    o.assert_success();
    drop(target);
    let r = Report::load(&out.path);
    remove_perf_map(&r);
    let ctx = format!(
        "report {}:\nverdict: {}\n{}\nleaktrace stderr:\n{}",
        out.path.display(),
        r.json["verdict"],
        r.summary(),
        o.stderr
    );
    let on_path: Vec<&Value> = r
        .sites()
        .iter()
        .filter(|s| {
            let names = frame_names(s);
            names.iter().any(|n| n.starts_with("Unsafe_AllocateMemory0"))
                && names.iter().any(|n| n.contains("OrderBook.stashQuote"))
        })
        .collect();
    let summary: Vec<String> = on_path
        .iter()
        .map(|s| {
            format!(
                "{} {} {:.0} B/s {}",
                s["id"],
                str_of(s, "class"),
                f64_of(s, "growth_bytes_per_s"),
                s["merged_stacks"]
            )
        })
        .collect();
    eprintln!("jvm-recompiled: sites on the leak's path: {summary:?}");
    assert_eq!(on_path.len(), 1, "the leak's path is not one site: {summary:?}\n{ctx}");
    let leak = on_path[0];
    assert_eq!(str_of(leak, "class"), "leak", "{summary:?}\n{ctx}");
    assert_eq!(str_of(leak, "function"), "void OrderBook.stashQuote(long, boolean)", "{ctx}");
    let merged = leak["merged_stacks"].as_array().map_or(0, Vec::len);
    assert!(
        merged >= 2,
        "fewer than three compiled versions of stashQuote were seen ({merged} merged): {summary:?}\n{ctx}"
    );
    let ids = r.json["sites"].as_array().unwrap().iter().map(|s| s["id"].as_u64().unwrap()).collect::<Vec<_>>();
    let folded = leak["merged_stacks"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>();
    assert!(
        folded.iter().all(|m| *m > leak["id"].as_u64().unwrap() && !ids.contains(m)),
        "merged ids: {folded:?}\n{ctx}"
    );
    let expected = 500.0 * 4096.0;
    assert_within("OrderBook.stashQuote growth (B/s)", f64_of(leak, "growth_bytes_per_s"), expected, 0.10, &ctx);
    let verdict = str_of(&r.json["verdict"], "summary");
    assert!(verdict.contains("OrderBook.stashQuote"), "the verdict does not name the method: {verdict}\n{ctx}");
    // "... holds +2.0 MiB/s more live bytes (2047512 B/s ± 2428 at 95 %)": the exact figure.
    let said: f64 = verdict
        .split(" B/s ±")
        .next()
        .and_then(|h| h.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no rate in the verdict: {verdict}\n{ctx}"));
    assert_within("the verdict's rate (B/s)", said, expected, 0.10, &ctx);
    assert_eq!(warnings_with(&r, "folded into").len(), 1, "no caveat on the merged stacks\n{ctx}");
    // The folded stacks and the live flame graph name the site once, by the kept id's frames.
    let folded_lines = std::fs::read_to_string(out.path.join("stacks.folded")).expect("stacks.folded");
    let leak_lines = folded_lines
        .lines()
        .filter(|l| l.contains("Unsafe_AllocateMemory0") && l.contains("OrderBook.stashQuote"))
        .count();
    assert_eq!(leak_lines, 1, "stacks.folded has the leak's path {leak_lines} times\n{ctx}");
}

/// Without --jvm-perf-map the leak's JIT frames stay unnamed, and the report says how to name
/// them (the flag, or `jcmd PID Compiler.perfmap`); -XX:+PreserveFramePointer is on (from the
/// command line), so no note asks for it.
#[test]
fn jvm_without_perf_map_says_how_to_name_java_frames() {
    require_root();
    let cmd = ledger(&["-XX:+PreserveFramePointer"], 500, 4096);
    let (r, ctx, _out) = record_for("jvm-noperfmap", cmd, "8s");
    let hint = warnings_with(&r, "--jvm-perf-map");
    assert_eq!(hint.len(), 1, "no note on how to name Java frames\n{ctx}");
    assert!(hint[0].contains("jcmd PID Compiler.perfmap"), "{}\n{ctx}", hint[0]);
    // The JVM runs with the flag: the note does not tell the user to add it.
    assert!(!hint[0].contains("PreserveFramePointer"), "{}\n{ctx}", hint[0]);
    assert!(warnings_with(&r, "without -XX:+PreserveFramePointer").is_empty(), "PreserveFramePointer is on\n{ctx}");
    assert!(
        !r.sites().iter().any(|s| frame_names(s).iter().any(|n| n.contains("Ledger."))),
        "a Java frame was named without a perf map\n{ctx}"
    );
}

/// With --jvm-perf-map, a JVM started without -XX:+PreserveFramePointer is told so, from
/// `jcmd PID VM.flags -all` (the report says where the value comes from).
#[test]
fn jvm_without_preserve_frame_pointer_is_said() {
    require_root();
    let cmd = ledger(&[], 500, 4096);
    let (r, ctx, _out) = record_with("jvm-nofp", cmd, &["--duration", "8s", "--jvm-perf-map"]);
    remove_perf_map(&r);
    let notes = warnings_with(&r, "without -XX:+PreserveFramePointer");
    assert_eq!(notes.len(), 1, "no note that PreserveFramePointer is off\n{ctx}");
    assert!(notes[0].contains("jcmd VM.flags"), "not read from the JVM's flags: {}\n{ctx}", notes[0]);
}

/// With --jvm-perf-map on a JVM that refuses attach (-XX:+DisableAttachMechanism), the failure
/// is one caveat line giving the command and the attach's error (no listener came up after
/// SIGQUIT), and no other note asks for a map.
#[test]
fn jvm_perf_map_failure_is_one_caveat() {
    require_root();
    let cmd = ledger(&["-XX:+PreserveFramePointer", "-XX:+DisableAttachMechanism"], 500, 4096);
    let (r, ctx, _out) = record_with("jvm-noattach", cmd, &["--duration", "8s", "--jvm-perf-map"]);
    let failed = warnings_with(&r, "--jvm-perf-map");
    assert_eq!(failed.len(), 1, "one note about --jvm-perf-map expected: {failed:?}\n{ctx}");
    assert!(
        failed[0].contains("failed") && failed[0].contains("no attach listener"),
        "the note does not give the attach's error: {}\n{ctx}",
        failed[0]
    );
    assert!(warnings_with(&r, "Java frames named").is_empty(), "{ctx}");
}

/// Methods in JitWarm.java.
const JIT_METHODS: usize = 4000;

/// The directory holding JitWarm.class: a generated program of [`JIT_METHODS`] small methods,
/// `m0` … `m3999`, each a loop of 20 iterations; `JitWarm PER_STEP` calls the next PER_STEP of
/// them 300 times every 100 ms, so new methods keep getting hot (profiled, then compiled) for
/// JIT_METHODS / PER_STEP / 10 seconds. Nothing is retained by the program itself.
/// Built once per run ([`built_once`]: `runtimes_jvm-jitwarm`).
fn jit_warm_classes() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| built_once("runtimes_jvm-jitwarm", build_jit_warm))
}

/// Write JitWarm.java into `dir` and compile it there.
fn build_jit_warm(dir: &Path) {
    let mut java = String::from("public class JitWarm {\n");
    for k in 0..JIT_METHODS {
        java.push_str(&format!(
            "  static int m{k}(int x) {{ int s = {k}; for (int i = 0; i < x; i++) s = s * 31 + (i ^ {}); return s; }}\n",
            k * 7 + 1
        ));
    }
    java.push_str("  static int call(int k, int x) { switch (k) {\n");
    for k in 0..JIT_METHODS {
        java.push_str(&format!("    case {k}: return m{k}(x);\n"));
    }
    java.push_str(&format!(
        "    default: return 0; }} }}
  static volatile int sink;
  public static void main(String[] a) throws Exception {{
int perStep = Integer.parseInt(a[0]);
System.out.println(\"PID \" + ProcessHandle.current().pid());
System.out.flush();
long start = System.nanoTime();
for (int step = 0; ; step++) {{
  int base = (step * perStep) % {JIT_METHODS};
  for (int rep = 0; rep < 300; rep++)
    for (int k = base; k < base + perStep && k < {JIT_METHODS}; k++) sink = call(k, 20);
  long d = start + (step + 1) * 100_000_000L - System.nanoTime();
  if (d > 0) Thread.sleep(d / 1000000);
}}
  }}
}}
"
    ));
    let file = dir.join("JitWarm.java");
    std::fs::write(&file, java).expect("write JitWarm.java");
    check(Command::new("javac").arg("-d").arg(dir).arg(&file), "javac (JitWarm.java)");
}

/// JIT compilation is warm-up, not a leak. JitWarm keeps making new methods hot
/// (30 every 100 ms, 4000 in all) and retains nothing: the JVM's profiling data, counters and
/// compiled-method metadata (MethodData in metaspace, nmethod oop maps) grow steadily through the
/// recording. No site is a leak, the sites that grow carry the "warm_up" look-alike with a
/// "runtime warm-up" reason, and the verdict says the runtime is warming up (inconclusive about
/// the Java heap when no collection ran).
#[test]
fn jvm_jit_warm_up_is_not_a_leak() {
    require_root();
    let mut cmd = Command::new("java");
    cmd.args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-Xshare:auto", "-cp"])
        .arg(jit_warm_classes())
        .args(["JitWarm", "30"]);
    let (r, ctx, _out) = record_for("jvm-jit-warm", cmd, "10s");
    assert_runtime(&r, "jvm", &ctx);
    let leaks: Vec<String> = r
        .sites()
        .iter()
        .filter(|s| str_of(s, "class") == "leak")
        .map(|s| format!("{} ({})", str_of(s, "function"), str_of(s, "memory_kind")))
        .collect();
    assert!(leaks.is_empty(), "called leaks in a JVM that only warms up: {leaks:?}\n{ctx}");
    let warming: Vec<&Value> = r
        .sites()
        .iter()
        .filter(|s| s["lookalike"]["warm_up"] == true && f64_of(s, "growth_bytes_per_s") > 1000.0)
        .collect();
    assert!(!warming.is_empty(), "no warm-up site grows: the workload did not keep the JIT busy\n{ctx}");
    assert!(
        warming.iter().any(|s| str_of(s, "reason").starts_with("runtime warm-up:")),
        "no growing warm-up site says it is runtime warm-up\n{ctx}"
    );
    // No collection in a 10 s launch: the Java heap cannot be judged, so the verdict is
    // inconclusive about it and says the runtime is warming up; with a collection, "no leak".
    let summary = str_of(&r.json["verdict"], "summary");
    if r.json["verdict"]["inconclusive"] == true {
        assert!(summary.starts_with("inconclusive: 0 old-gen collections"), "{summary}\n{ctx}");
        assert!(summary.contains("; the runtime is warming up"), "{summary}\n{ctx}");
    } else {
        assert_eq!(str_of(&r.json["verdict"], "class"), "cache", "{ctx}");
        assert!(summary.starts_with("no leak: the runtime is warming up"), "{summary}\n{ctx}");
    }
}
