//! "What holds it" from the runtimes' own heap tools (`record --heap-census`): the
//! JVM's class histogram at the start and the end, and Go's goroutines read from outside. Each
//! test runs a real runtime on a fixture whose truth is known and asserts the growth the
//! runtime's tool reports, at a stated tolerance, and the decoys beside it.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use leaktrace_tests::*;

fn src(name: &str) -> PathBuf {
    fixture_source("runtimes").join(name)
}

/// The directory holding HoldsJvm.class, JniLeak.class and libjnileak.so (built against the JDK
/// whose `javac` is on PATH), once per run ([`built_once`]: `runtime_holds-java`).
fn jvm_fixture() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        built_once("runtime_holds-java", |out| {
            run_build_step(
                Command::new("javac").arg("-d").arg(out).arg(src("HoldsJvm.java")).arg(src("JniLeak.java")),
                "javac",
            );
            build_jni_leak_library(out);
        })
    })
}

/// The Go goroutine-leak fixture, built with the Go on PATH (1.19 here), cgo off, once per run
/// ([`built_once`]: `runtime_holds-go-goroutines`, with its own GOCACHE inside).
fn go_goroutines() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        built_once("runtime_holds-go-goroutines", |dir| {
            run_build_step(
                Command::new("go")
                    .args(["build", "-o"])
                    .arg(dir.join("go-goroutines"))
                    .arg(".")
                    .current_dir(src("go-goroutines"))
                    .env("CGO_ENABLED", "0")
                    .env("GOCACHE", dir.join("gocache"))
                    .env("GOFLAGS", "-mod=mod")
                    .env("GO111MODULE", "on"),
                "go build",
            );
        })
        .join("go-goroutines")
    })
}

/// Record `cmd` with `--heap-census` for `duration`; the report and a context for messages.
fn record_census(name: &str, cmd: Command, duration: &str) -> (Report, String, OutDir) {
    record_census_with(name, &[], cmd, duration)
}

/// [`record_census`] with `extra` options.
fn record_census_with(name: &str, extra: &[&str], cmd: Command, duration: &str) -> (Report, String, OutDir) {
    let out = OutDir::new(name);
    let args: Vec<&str> = ["--heap-census", "--duration", duration].iter().chain(extra).copied().collect();
    let o = record_launch(&out, &args, cmd);
    o.assert_success();
    let r = Report::load(&out.path);
    let md = std::fs::read_to_string(out.file("report.md")).unwrap_or_default();
    let holds = md.find("## What holds it").map(|i| md[i..].split("\n## ").next().unwrap_or("").to_string());
    let ctx = format!(
        "report {}:\nverdict: {}\nruntime_holds: {:#}\n{}\nleaktrace stderr:\n{}",
        out.path.display(),
        r.json["verdict"]["summary"],
        r.json["runtime_holds"],
        holds.unwrap_or_else(|| "(no What holds it section)".into()),
        o.stderr
    );
    (r, ctx, out)
}

/// The entry named `name` of a growth list, if it grew.
/// A retaining path of report.json (`step`s) as the runtime's labels, root first: the root's
/// name, each edge, each object's type.
fn labels(path: &Value) -> Vec<String> {
    fn label(s: &Value) -> Option<&str> {
        match s["step"].as_str() {
            Some("root") => s["name"].as_str(),
            Some("edge") => s["edge"].as_str(),
            Some("object") => s["type"].as_str(),
            _ => None,
        }
    }
    path.as_array().into_iter().flatten().filter_map(|s| label(s).map(String::from)).collect()
}

fn grown<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array().and_then(|a| a.iter().find(|g| g["name"] == name))
}

/// JVM: HoldsJvm keeps 500 AuditRecords a second (24 B each with compressed oops)
/// with a 200-byte payload each (a byte[] of 216 B) in a static ArrayList, calls a JNI function
/// that leaks 1024 B of native memory per request, and churns a 256-entry Session cache. With
/// `--heap-census` the class histograms at the start and the end show the record class and its
/// byte arrays growing at 500 instances/s ± 20 % (and their bytes ± 20 %); the Session cache
/// does not grow; the JNI leak stays native (Java_JniLeak_parse, 512,000 B/s ± 15 %); each
/// histogram's jcmd time (the bound of its full-GC pause) is stated.
#[test]
fn jvm_class_histogram_names_the_growing_class() {
    require_root();
    let dir = jvm_fixture();
    let mut cmd = Command::new("java");
    cmd.args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp"])
        .arg(dir)
        .arg("HoldsJvm")
        .arg(dir.join("libjnileak.so"))
        .args(["500", "200", "1"]);
    let (r, ctx, out) = record_census("holds-jvm", cmd, "12s");
    let jvm = &r.json["runtime_holds"]["jvm"];
    assert!(jvm.is_object(), "no JVM census in report.json\n{ctx}");
    for at in ["start", "end"] {
        let took = jvm[at]["taken"]["took_s"].as_f64().unwrap_or_else(|| panic!("no {at} histogram\n{ctx}"));
        assert!(took > 0.0 && took < 30.0, "{at}: jcmd time {took} s\n{ctx}");
    }
    let span = f64_of(&jvm["end"]["taken"], "t_s") - f64_of(&jvm["start"]["taken"], "t_s");
    assert!(span >= 5.0, "the histograms are {span:.1} s apart\n{ctx}");
    let list = &jvm["growing_classes"];
    let record = grown(list, "HoldsJvm$AuditRecord").unwrap_or_else(|| panic!("the record class does not grow\n{ctx}"));
    assert_eq!(list[0]["name"], "byte[]", "the payloads grow fastest in bytes\n{ctx}");
    let payload = &list[0];
    eprintln!(
        "holds-jvm: AuditRecord {:.1}/s {:.0} B/s; byte[] {:.1}/s {:.0} B/s over {span:.1} s",
        f64_of(record, "instances_per_s"),
        f64_of(record, "bytes_per_s"),
        f64_of(payload, "instances_per_s"),
        f64_of(payload, "bytes_per_s")
    );
    assert_within("AuditRecord instances/s", f64_of(record, "instances_per_s"), 500.0, 0.20, &ctx);
    assert_within("AuditRecord bytes/s", f64_of(record, "bytes_per_s"), 500.0 * 24.0, 0.20, &ctx);
    assert_within("byte[] instances/s", f64_of(payload, "instances_per_s"), 500.0, 0.20, &ctx);
    assert_within("byte[] bytes/s", f64_of(payload, "bytes_per_s"), 500.0 * 216.0, 0.20, &ctx);
    if let Some(s) = grown(list, "HoldsJvm$Session") {
        assert!(f64_of(s, "instances_per_s") < 25.0, "the bounded Session cache grows\n{ctx}");
    }
    // The JNI leak beside it stays native, named after the JNI function.
    let native = r.sites().iter().find(|s| str_of(s, "memory_kind") == "native" && str_of(s, "class") == "leak");
    let native = native.unwrap_or_else(|| panic!("no native leak site\n{ctx}"));
    assert_eq!(str_of(native, "function"), "Java_JniLeak_parse", "{ctx}");
    assert_within("Java_JniLeak_parse B/s", f64_of(native, "growth_bytes_per_s"), 500.0 * 1024.0, 0.15, &ctx);
    let md = std::fs::read_to_string(out.file("report.md")).unwrap_or_default();
    assert!(md.contains("### JVM: class histogram"), "no JVM subsection in report.md\n{ctx}");
    assert!(md.contains("**HoldsJvm$AuditRecord**"), "report.md does not name the record class\n{ctx}");
    let holder = r.json["verdict"]["holder"].as_str().unwrap_or("");
    assert!(holder.starts_with("class HoldsJvm$AuditRecord +"), "verdict.holder: {holder}\n{ctx}");
}

/// JVM `--heap-dump`: after the last histogram one HPROF dump (jcmd GC.heap_dump,
/// written in the output directory) read by leaktrace: the shortest path from a GC root to the
/// growing record class starts at the static field that keeps it (`HoldsJvm.AUDIT`), through
/// the ArrayList's array, and holds every record in the dump (at least 95 %: the list's own
/// last add may race the dump); the byte arrays' path goes on through `AuditRecord.payload`.
/// The verdict's holder names the field; the dump is deleted (no `--keep-heap-dump`).
#[test]
fn jvm_heap_dump_path_names_the_static_field() {
    require_root();
    let dir = jvm_fixture();
    let mut cmd = Command::new("java");
    cmd.args(["-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp"])
        .arg(dir)
        .arg("HoldsJvm")
        .arg(dir.join("libjnileak.so"))
        .args(["500", "200", "0"]);
    let (r, ctx, out) = record_census_with("holds-jvm-dump", &["--heap-dump"], cmd, "8s");
    let d = &r.json["runtime_holds"]["jvm_heap_dump"];
    assert!(d.is_object(), "no heap dump in report.json\n{ctx}");
    let paths = d["paths"].as_array().cloned().unwrap_or_default();
    let record = paths.iter().find(|p| p["class"] == "HoldsJvm$AuditRecord");
    let record = record.unwrap_or_else(|| panic!("no path to the record class\n{ctx}"));
    let steps = labels(&record["path"]);
    eprintln!(
        "holds-jvm-dump: {} of {} records via {:?}; dump {} B, {} objects, jcmd {:.2} s, read {:.3} s",
        record["held"],
        record["instances"],
        steps,
        d["file_bytes"],
        d["objects"],
        f64_of(&d["taken"], "took_s"),
        f64_of(d, "parse_s")
    );
    assert_eq!(
        steps,
        ["HoldsJvm.AUDIT", "java.util.ArrayList.elementData", "java.lang.Object[]", "HoldsJvm$AuditRecord"],
        "{ctx}"
    );
    assert_eq!(record["root_kind"], "static field", "{ctx}");
    assert_eq!(record["path"][0]["kind"], "static_field", "{ctx}");
    let (held, n) = (f64_of(record, "held"), f64_of(record, "instances"));
    assert!(n >= 1000.0 && held >= 0.95 * n, "{held} of {n} records held by AUDIT\n{ctx}");
    if let Some(p) = paths.iter().find(|p| p["class"] == "byte[]") {
        assert!(labels(&p["path"]).iter().any(|s| s == "HoldsJvm$AuditRecord.payload"), "{ctx}");
    }
    let holder = r.json["verdict"]["holder"].as_str().unwrap_or("");
    assert!(
        holder.contains("held by HoldsJvm.AUDIT → java.util.ArrayList.elementData"),
        "verdict.holder: {holder}\n{ctx}"
    );
    assert_eq!(d["kept"], Value::Null, "{ctx}");
    let left: Vec<_> = std::fs::read_dir(&out.path)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".hprof"))
        .collect();
    assert!(left.is_empty(), "the dump was not deleted: {left:?}\n{ctx}");
}

/// Go 1.19: the fixture starts 100 goroutines a second that block forever on an
/// unbuffered send (`main.handle`), beside 8 workers waiting to receive (`main.worker`). With
/// `--heap-census` the goroutines read from outside (no pprof endpoint in the program) grow by
/// 100/s ± 15 % in the group "waiting (chan send), started by main.handle", with their stacks'
/// bytes; the workers' group does not grow.
#[test]
fn go_goroutine_leak_named_with_its_start_function() {
    require_root();
    let mut cmd = Command::new(go_goroutines());
    cmd.arg("100");
    let (r, ctx, out) = record_census("holds-go", cmd, "10s");
    let go = &r.json["runtime_holds"]["go"];
    assert!(go.is_object(), "no Go census in report.json\n{ctx}");
    let list = &go["growing_groups"];
    let leak = grown(list, "waiting (chan send), started by main.handle")
        .unwrap_or_else(|| panic!("the blocked handlers are not a growing group\n{ctx}"));
    assert_eq!(list[0]["name"], leak["name"], "the leak grows fastest\n{ctx}");
    eprintln!(
        "holds-go: {:.1} goroutines/s, stacks {:.0} B/s",
        f64_of(leak, "goroutines_per_s"),
        f64_of(leak, "bytes_per_s")
    );
    assert_within("blocked goroutines/s", f64_of(leak, "goroutines_per_s"), 100.0, 0.15, &ctx);
    assert!(f64_of(leak, "bytes_per_s") >= 100.0 * 2048.0 * 0.85, "their stacks (2 KiB at least each)\n{ctx}");
    assert!(grown(list, "waiting (chan receive), started by main.worker").is_none(), "the worker pool grows\n{ctx}");
    // The pool's eight workers may be split between states (waiting, runnable) at the end.
    let groups = go["end"]["groups"].as_array().cloned().unwrap_or_default();
    let workers: u64 = groups.iter().filter(|g| g["start_function"] == "main.worker").map(|g| u64_of(g, "count")).sum();
    assert_eq!(workers, 8, "main.worker goroutines at the end\n{ctx}");
    assert!(
        !list.as_array().unwrap().iter().any(|g| g["name"].as_str().unwrap_or("").ends_with("main.worker")),
        "a worker group is listed as growing\n{ctx}"
    );
    let md = std::fs::read_to_string(out.file("report.md")).unwrap_or_default();
    assert!(md.contains("goroutines/s** waiting (chan send), started by main.handle"), "report.md\n{ctx}");
    let holder = r.json["verdict"]["holder"].as_str().unwrap_or("");
    assert!(
        holder.ends_with("goroutines/s waiting (chan send), started by main.handle"),
        "verdict.holder: {holder}\n{ctx}"
    );
    // The program never references runtime.MemProfile: the linker turned its heap profile off.
    assert_eq!(u64_of(&go["end"], "mem_profile_rate"), 0, "{ctx}");
    assert!(md.contains("heap profile is off"), "report.md does not say the heap profile is off\n{ctx}");
}

/// Go 1.19: beside the goroutine leak, `main.remember` keeps 2000 slices of 1000 B a
/// second (1024 B with their size class) in a map that only grows; the program profiles its own
/// heap (`runtime.MemProfileRate = 64 KiB`) but has no pprof endpoint and writes no profile. The
/// runtime's heap profile read from outside names `main.remember` (inlined into `main.main`:
/// named from DWARF) as the Go function whose in-use heap grows fastest, at 2000 objects and
/// 2,048,000 B a second, −30 %/+15 %: the profile is the heap as of the GC before last (GOGC=5
/// here keeps that lag small), so it trails the truth.
#[test]
fn go_heap_profile_names_the_map_growing_function() {
    require_root();
    let mut cmd = Command::new(go_goroutines());
    cmd.args(["100", "2000"]).env("GOGC", "5");
    let (r, ctx, out) = record_census("holds-go-heap", cmd, "10s");
    let go = &r.json["runtime_holds"]["go"];
    assert_eq!(u64_of(&go["end"], "mem_profile_rate"), 65536, "{ctx}");
    let top = &go["heap_growth"][0];
    assert_eq!(top["name"], "main.remember", "the map-growing function grows the heap fastest\n{ctx}");
    let (objects, bytes) = (f64_of(top, "objects_per_s"), f64_of(top, "bytes_per_s"));
    eprintln!("holds-go-heap: main.remember {objects:.0} objects/s, {bytes:.0} B/s in use");
    for (what, got, truth) in [("objects/s", objects, 2000.0), ("bytes/s", bytes, 2000.0 * 1024.0)] {
        assert!(
            got > 0.70 * truth && got < 1.15 * truth,
            "main.remember {what} {got:.0}, truth {truth} (−30 %/+15 %)\n{ctx}"
        );
    }
    let md = std::fs::read_to_string(out.file("report.md")).unwrap_or_default();
    assert!(md.contains("- **main.remember**:"), "report.md does not name main.remember\n{ctx}");
    let holder = r.json["verdict"]["holder"].as_str().unwrap_or("");
    assert!(holder.contains("Go heap in use under main.remember"), "verdict.holder: {holder}\n{ctx}");
}

/// Node 20: audit.js keeps a 200 kB string 20 times a second in a module-level array
/// (`recordAudit`) beside a decoy that makes the same copy and drops it (`checkSession`); node
/// runs without `--perf-basic-prof` and without an inspector. Attached with `--heap-census`,
/// leaktrace opens the inspector (SIGUSR1), samples the heap with the DevTools protocol and
/// closes the inspector: the sampling profile's live objects are named after `recordAudit` (the
/// program's frame above node's `Buffer#toString`) at 20 × 200,000 B/s ± 20 % over the time
/// sampling ran — from attach, before the session's first checkpoints (slow on node's 100 MB
/// executable): at least 10 of the 12 s recorded —, the decoy holds nothing, and node runs on
/// (its progress lines continue) with no inspector listening afterwards.
#[test]
fn node_sampling_profile_names_the_javascript_function() {
    let _port = node_inspector_port();
    require_root();
    let mut cmd = Command::new("node");
    cmd.env_remove("NODE_EXTRA_CA_CERTS").arg(fixture_source("runtimes").join("audit.js")).args(["20", "200000"]);
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    assert!(!listens(target.pid), "node listens before leaktrace opened its inspector");
    let out = OutDir::new("holds-node");
    let mut lt = leaktrace(["record", "--heap-census", "--pid", &target.pid.to_string(), "--duration", "12s", "--out"]);
    lt.arg(&out.path);
    let o = run(lt, None, Duration::from_secs(300));
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("{}\nruntime_holds: {:#}", o.describe(), r.json["runtime_holds"]);
    let node = &r.json["runtime_holds"]["node"];
    let top = &node["sampling_profile"]["functions"][0];
    eprintln!(
        "holds-node: {} {:.0} B/s live over {:.1} s",
        top["function"],
        f64_of(top, "bytes_per_s"),
        f64_of(&node["sampling_profile"]["taken"], "t_s") - f64_of(&node["sampling_profile"], "started_t_s")
    );
    assert_eq!(top["function"], "recordAudit", "{ctx}");
    let sampled = f64_of(&node["sampling_profile"]["taken"], "t_s") - f64_of(&node["sampling_profile"], "started_t_s");
    assert!(sampled >= 10.0, "sampled {sampled:.1} s of the 12 s recorded\n{ctx}");
    assert!(str_of(top, "url").ends_with("audit.js"), "{ctx}");
    assert_within("recordAudit live B/s", f64_of(top, "bytes_per_s"), 20.0 * 200_000.0, 0.20, &ctx);
    let functions = node["sampling_profile"]["functions"].as_array().cloned().unwrap_or_default();
    let decoy: u64 =
        functions.iter().filter(|f| f["function"] == "checkSession").map(|f| u64_of(f, "live_bytes")).sum();
    assert!(decoy * 10 < u64_of(top, "live_bytes"), "checkSession's garbage counted live: {decoy} B\n{ctx}");
    assert!(node["errors"].as_array().is_some_and(|e| e.is_empty()), "{ctx}");
    // The target runs on, its inspector closed.
    assert!(target.exit_status().is_none(), "node ended\n{ctx}");
    assert!(target.next_line(Duration::from_secs(5)).is_some(), "node stopped printing progress\n{ctx}");
    assert!(!listens(target.pid), "the inspector still listens\n{ctx}");
}

/// Wait until audit-objects.js says (`progress N ...`) that it holds at least `n` AuditEntry
/// objects; panics after 30 s.
fn wait_for_audit_entries(target: &Target, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let Some(line) = target.next_line(Duration::from_secs(5)) else { continue };
        let held = line.strip_prefix("progress ").and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok());
        if held.is_some_and(|h| h >= n) {
            return;
        }
    }
    panic!("audit-objects.js did not reach {n} AuditEntry objects in 30 s");
}

/// Node 20 `--heap-snapshots`: audit-objects.js appends 200 `AuditEntry` objects a
/// second to the module-level array `auditTrail` beside a Map cache of 500 `Session`s whose
/// entries are replaced (as many new objects, no growth). Attached with `--heap-snapshots`,
/// leaktrace takes two heap snapshots over the inspector (at attach and at the end): AuditEntry
/// grows by 200/s ± 20 % between them, Session by less than 10 % of that; the retainer path of a
/// new AuditEntry from the GC roots goes through `auditTrail (Array)`; node runs on with no
/// inspector listening afterwards.
#[test]
fn node_heap_snapshots_name_the_array_that_holds_the_objects() {
    let _port = node_inspector_port();
    require_root();
    let mut cmd = Command::new("node");
    cmd.env_remove("NODE_EXTRA_CA_CERTS").arg(fixture_source("runtimes").join("audit-objects.js")).arg("200");
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    // The Session cache is full (500 entries) 2.5 s after the start: the first snapshot is taken
    // after that, so that the cache's filling is not counted as growth between the snapshots.
    wait_for_audit_entries(&target, 600);
    let out = OutDir::new("holds-node-snapshots");
    let mut lt =
        leaktrace(["record", "--heap-snapshots", "--pid", &target.pid.to_string(), "--duration", "10s", "--out"]);
    lt.arg(&out.path);
    let o = run(lt, None, Duration::from_secs(300));
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("{}\nruntime_holds: {:#}", o.describe(), r.json["runtime_holds"]);
    let s = &r.json["runtime_holds"]["node_snapshots"];
    assert!(s.is_object(), "no heap snapshots\n{ctx}");
    let span = f64_of(&s["second"], "t_s") - f64_of(&s["first"], "t_s");
    let list = s["new_objects"].as_array().cloned().unwrap_or_default();
    let of = |c: &str| list.iter().find(|x| x["constructor"] == c).cloned();
    let entry = of("AuditEntry").unwrap_or_else(|| panic!("no new AuditEntry\n{ctx}"));
    let net = |x: &Value| (f64_of(x, "count_second") - f64_of(x, "count_first")) / span;
    eprintln!(
        "holds-node-snapshots: AuditEntry {:+.1}/s net, {} new; Session {:+.1}/s net; over {span:.1} s; paused {:.2} s and {:.2} s; path {}",
        net(&entry),
        entry["count"],
        of("Session").map_or(0.0, |x| net(&x)),
        f64_of(&s["first"], "took_s"),
        f64_of(&s["second"], "took_s"),
        s["path"]["path"]
    );
    assert!(span >= 6.0, "snapshots {span:.1} s apart\n{ctx}");
    assert_within("AuditEntry net growth /s", net(&entry), 200.0, 0.20, &ctx);
    if let Some(sess) = of("Session") {
        assert!(net(&sess) < 20.0, "the bounded Session cache grows\n{ctx}");
    }
    assert_eq!(s["path"]["constructor"], "AuditEntry", "{ctx}");
    // `auditTrail (Array)` on the wire: the edge `auditTrail` to an object of type `Array`.
    let steps = labels(&s["path"]["path"]);
    assert!(steps.windows(2).any(|w| w == ["auditTrail", "Array"]), "the path does not name auditTrail\n{ctx}");
    assert_eq!(steps.last().map(String::as_str), Some("AuditEntry"), "{ctx}");
    let holder = r.json["verdict"]["holder"].as_str().unwrap_or("");
    assert!(holder.starts_with("constructor AuditEntry +"), "verdict.holder: {holder}\n{ctx}");
    assert_retained_sizes(s, &entry, &ctx);
    assert!(target.exit_status().is_none(), "node ended\n{ctx}");
    assert!(target.next_line(Duration::from_secs(5)).is_some(), "node stopped printing progress\n{ctx}");
    assert!(!listens(target.pid), "the inspector still listens\n{ctx}");
}

/// The retained sizes of `--heap-snapshots` (the second snapshot's dominator tree): each new
/// AuditEntry (56 B of self size in Node 20) retains itself, its user name, its time (a heap
/// number) and its note: a concatenated string of `request N ` and 480–486 `x`s that V8's
/// `repeat` builds from cons-string halves partly shared between entries (those count at their
/// common dominator, the array), so 400–800 B each and at least 5 times its self size (a
/// leaktrace run: 516 B; on a snapshot the same program wrote of itself, 485 B each, and
/// `auditTrail` 346,440 B, the figures memlab's own Lengauer–Tarjan computes on that file). The
/// array `auditTrail` retains all its entries (only it holds them): its retained size covers
/// their retained sizes summed and exceeds it by at most its backing store and the shared
/// string halves (8 B per slot, up to twice the entries, and a few KB: ≤ 5 %).
fn assert_retained_sizes(s: &Value, entry: &Value, ctx: &str) {
    let (count, self_bytes, retained) =
        (f64_of(entry, "count"), f64_of(entry, "self_bytes"), f64_of(entry, "retained_bytes"));
    let per_entry = retained / count;
    let h = &s["holder"];
    eprintln!(
        "holds-node-snapshots: new AuditEntry {count} self {self_bytes} B retained {retained} B ({per_entry:.0} B each); holder {} self {} retained {} B, its {} AuditEntries retain {} B; costs {}",
        h["name"], h["self_bytes"], h["retained_bytes"], h["instances"], h["instances_retained_bytes"], s["costs"]
    );
    assert!((400.0..=800.0).contains(&per_entry), "a new AuditEntry retains {per_entry:.0} B\n{ctx}");
    assert!(retained >= 5.0 * self_bytes, "retained {retained} B vs self {self_bytes} B\n{ctx}");
    assert_eq!(h["name"], "auditTrail (Array)", "{ctx}");
    assert_eq!(u64_of(h, "instances"), u64_of(entry, "count_second"), "every AuditEntry is in the array\n{ctx}");
    let (held, of_entries) = (f64_of(h, "retained_bytes"), f64_of(h, "instances_retained_bytes"));
    assert!(
        held >= of_entries && held <= 1.05 * of_entries,
        "auditTrail retains {held} B, its AuditEntries {of_entries} B\n{ctx}"
    );
    let costs = s["costs"].as_array().cloned().unwrap_or_default();
    assert_eq!(costs.len(), 2, "{ctx}");
    for c in &costs {
        assert!(u64_of(c, "bytes") > 1_000_000 && u64_of(c, "chunks") > 0, "{ctx}");
    }
}

/// A memory cgroup made for one test (cgroup v1 `memory` hierarchy under this process's, or
/// v2's unified one); removed when dropped, after its processes ended.
struct MemoryCgroup {
    dir: PathBuf,
    v1: bool,
}

impl MemoryCgroup {
    fn new(name: &str) -> MemoryCgroup {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
        let v1 = cgroups.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, rel) = (f.next()?, f.next()?, f.next()?);
            ctl.split(',').any(|c| c == "memory").then(|| PathBuf::from("/sys/fs/cgroup/memory").join(&rel[1..]))
        });
        let (parent, v1) = match v1.filter(|p| p.join("memory.limit_in_bytes").exists()) {
            Some(p) => (p, true),
            None => {
                let rel = cgroups.lines().find_map(|l| l.strip_prefix("0::")).expect("no memory cgroup");
                (PathBuf::from("/sys/fs/cgroup").join(&rel[1..]), false)
            }
        };
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create the cgroup {}: {e}", dir.display()));
        MemoryCgroup { dir, v1 }
    }

    fn usage(&self) -> u64 {
        let f = if self.v1 { "memory.usage_in_bytes" } else { "memory.current" };
        std::fs::read_to_string(self.dir.join(f)).unwrap().trim().parse().unwrap()
    }

    fn limit(&self, bytes: u64) {
        let f = if self.v1 { "memory.limit_in_bytes" } else { "memory.max" };
        std::fs::write(self.dir.join(f), bytes.to_string()).expect("set the cgroup's memory limit");
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove the cgroup {}", self.dir.display());
    }
}

/// Node 20 `--heap-snapshots` refused: audit-objects.js with a JS heap of about 30 MB
/// (150,000 preloaded objects) moved into a real memory cgroup whose limit leaves 16 MiB of
/// headroom, under the twice-the-heap a snapshot may need: no snapshot is taken, one line says
/// why (the cgroup and its headroom), and node runs on.
#[test]
fn node_heap_snapshots_refused_without_headroom() {
    let _port = node_inspector_port();
    require_root();
    let cg = MemoryCgroup::new("leaktrace-snapshots");
    let mut cmd = Command::new("node");
    cmd.env_remove("NODE_EXTRA_CA_CERTS")
        .arg(fixture_source("runtimes").join("audit-objects.js"))
        .args(["20", "150000"]);
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    // Once the preload is done (the first progress line), into the cgroup, then the limit.
    assert!(target.next_line(Duration::from_secs(30)).is_some(), "node printed no progress");
    std::fs::write(cg.dir.join("cgroup.procs"), target.pid.to_string()).expect("move node into the cgroup");
    std::thread::sleep(Duration::from_millis(300));
    let limit = cg.usage() + (16 << 20);
    cg.limit(limit);
    let out = OutDir::new("holds-node-refused");
    let mut lt =
        leaktrace(["record", "--heap-snapshots", "--pid", &target.pid.to_string(), "--duration", "3s", "--out"]);
    lt.arg(&out.path);
    let o = run(lt, None, Duration::from_secs(120));
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("{}\nruntime_holds: {:#}", o.describe(), r.json["runtime_holds"]);
    assert_eq!(r.json["runtime_holds"]["node_snapshots"], Value::Null, "{ctx}");
    let errors = r.json["runtime_holds"]["node"]["errors"].as_array().cloned().unwrap_or_default();
    let refused = errors.iter().filter_map(Value::as_str).find(|e| e.contains("refused: the memory cgroup"));
    let refused = refused.unwrap_or_else(|| panic!("no refusal\n{ctx}"));
    eprintln!("holds-node-refused: limit {limit} B: {refused}");
    assert!(refused.contains("under twice the JS heap used"), "{refused}");
    assert!(!refused.contains('\n'), "one line: {refused}");
    assert!(target.exit_status().is_none(), "node ended\n{ctx}");
    assert!(target.next_line(Duration::from_secs(5)).is_some(), "node stopped printing progress\n{ctx}");
}

/// The Node tests run one at a time: each opens its target's inspector with SIGUSR1 on node's
/// default port 9229, which only one process of the host's network namespace can bind (the
/// others' SIGUSR1 would find it taken: leaktrace then says so).
fn node_inspector_port() -> std::sync::MutexGuard<'static, ()> {
    static PORT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PORT.lock().unwrap_or_else(|e| e.into_inner())
}
