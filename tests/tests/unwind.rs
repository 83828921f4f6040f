//! Full call stacks through code without frame pointers: leaks made inside Debian's libc, libz,
//! libssl, libsqlite3 and libstdc++ (none keep frame pointers) from fixtures built `-O2
//! -fomit-frame-pointer`, and a Rust release build. Each test names the user's function that
//! holds the bug, checks its live bytes against the fixture's own count, and checks that the
//! balanced decoy taking the same library path is a separate site that does not grow.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use leaktrace_tests::*;
use serde_json::Value;

/// The three fixtures, built the way distributions and cargo build: -O2 without frame pointers,
/// once per run ([`built_once`]: `unwind-nofp`).
struct NoFp {
    c: PathBuf,
    cxx: PathBuf,
    rust: PathBuf,
}

fn nofp() -> &'static NoFp {
    static BIN: OnceLock<NoFp> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = built_once("unwind-nofp", build_nofp);
        NoFp { c: dir.join("nofp"), cxx: dir.join("nofp_cxx"), rust: dir.join("nofp_rust") }
    })
}

/// Build nofp.c, nofp_cxx.cpp and nofp_rust.rs into `dir` (-O2, no frame pointers).
fn build_nofp(dir: &Path) {
    let build = |cmd: &mut Command, what: &str| {
        let o = cmd.output().unwrap_or_else(|e| panic!("cannot build {what}: {e}"));
        assert!(
            o.status.success(),
            "building {what} failed (`cargo xtask setup` installs zlib1g-dev, libssl-dev, libsqlite3-dev):\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let c = dir.join("nofp");
    build(
        Command::new("gcc")
            .args(["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-o"])
            .arg(&c)
            .arg(fixture_source("nofp.c"))
            .args(["-lz", "-lssl", "-lcrypto", "-lsqlite3"]),
        "nofp.c",
    );
    let cxx = dir.join("nofp_cxx");
    build(
        Command::new("g++")
            .args(["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-o"])
            .arg(&cxx)
            .arg(fixture_source("nofp_cxx.cpp")),
        "nofp_cxx.cpp",
    );
    let rust = dir.join("nofp_rust");
    build(
        Command::new("rustc")
            .args(["-C", "opt-level=3", "-C", "debuginfo=1", "--edition", "2021", "-o"])
            .arg(&rust)
            .arg(fixture_source("nofp_rust.rs")),
        "nofp_rust.rs",
    );
}

/// This test process's own directory for the variants a test derives from the fixtures at test
/// time (stripped, without `.eh_frame`...): `temp_root()/fixtures-nofp`.
fn scratch_dir() -> PathBuf {
    fixture_build_dir("fixtures-nofp")
}

/// A recorded fixture run: its recording directory, report, and the bytes it says it leaked.
struct Run {
    out: OutDir,
    report: Report,
    leaked: f64,
    /// `leaked` is in glibc chunk bytes (mallinfo2), not requested bytes.
    chunk_truth: bool,
    ctx: String,
}

fn record(name: &str, extra: &[&str], bin: &Path, args: &[&str]) -> Run {
    let out = OutDir::new(name);
    let mut target = Command::new(bin);
    // nofp.c's mallinfo2 truth needs freed chunks out of glibc's in-use count (no tcache, no
    // fastbins); leaktrace's own figures do not depend on it.
    target.args(args).env("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0");
    let o = record_launch(&out, extra, target);
    o.assert_success();
    assert!(o.stdout.contains("done "), "{name}: the fixture did not run to its end\n{}", o.describe());
    let truth =
        |prefix: &str| o.stdout.lines().find_map(|l| l.strip_prefix(prefix)).and_then(|v| v.trim().parse::<f64>().ok());
    let (leaked, chunk_truth) = match (truth("leaked_bytes "), truth("leaked_chunk_bytes ")) {
        (Some(b), _) => (b, false),
        (None, Some(b)) => (b, true),
        _ => panic!("{name}: no leaked_bytes line\n{}", o.describe()),
    };
    let report = Report::load(&out.path);
    let ctx = format!("{}\nreport: {}", o.describe(), out.path.display());
    Run { out, report, leaked, chunk_truth, ctx }
}

fn names(frames: &[Value]) -> Vec<&str> {
    frames.iter().filter_map(|f| f["function"].as_str()).collect()
}

fn has(frames: &[Value], function: &str) -> bool {
    names(frames).iter().any(|n| function_base(n) == function || n.ends_with(&format!("::{function}")))
}

/// Live bytes at the end, over the stacks whose frames include `function`.
fn live_through(run: &Run, function: &str) -> f64 {
    let t = totals_where(&run.out.path, |f| has(f, function));
    t.alloc_bytes as f64 - t.free_bytes as f64
}

/// Bytes allocated over the run, over the stacks whose frames include `function`.
fn allocated_through(run: &Run, function: &str) -> f64 {
    totals_where(&run.out.path, |f| has(f, function)).alloc_bytes as f64
}

/// The recording's stacks (symbolized frames, truncation) whose frames include `function`.
fn stacks_through(run: &Run, function: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(run.out.file("recording.json")).expect("recording.json");
    let rec: Value = serde_json::from_str(&text).expect("recording.json parses");
    rec["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["frames"].as_array().is_some_and(|f| has(f, function)))
        .cloned()
        .collect()
}

/// The leak is found through `culprit` down to `main`, with its bytes within 10 % of the
/// fixture's count; the decoy's stacks are other stacks and hold (almost) nothing at the end.
fn assert_found(run: &Run, culprit: &str, decoy: &str, library: &str) {
    let ctx = &run.ctx;
    let stacks = stacks_through(run, culprit);
    assert!(!stacks.is_empty(), "no stack goes through {culprit}\n{ctx}");
    for s in &stacks {
        let frames = s["frames"].as_array().unwrap();
        assert!(has(frames, "main"), "{culprit}'s stack does not reach main: {:?}\n{ctx}", names(frames));
        assert!(!has(frames, decoy), "a stack holds both {culprit} and the decoy {decoy}\n{ctx}");
        assert!(s.get("truncated").is_none(), "{culprit}'s stack is truncated: {}\n{ctx}", s["truncated"]);
        assert!(
            frames.iter().any(|f| f["object"].as_str().is_some_and(|o| o.contains(library))),
            "{culprit}'s stack has no frame in {library}: {:?}\n{ctx}",
            names(frames)
        );
    }
    if run.chunk_truth {
        // glibc chunk bytes: each block's requested size + 8, rounded up to 16 (at least 32),
        // i.e. between +8 and +23 bytes a block: +15.5 on average.
        let t = totals_where(&run.out.path, |f| has(f, culprit));
        let blocks = t.alloc_count as f64 - t.free_count as f64;
        let chunk_bytes = t.alloc_bytes as f64 - t.free_bytes as f64 + 15.5 * blocks;
        assert_within(&format!("live chunk bytes through {culprit}"), chunk_bytes, run.leaked, 0.10, ctx);
    } else {
        assert_within(&format!("live bytes through {culprit}"), live_through(run, culprit), run.leaked, 0.10, ctx);
    }
    let decoy_alloc = allocated_through(run, decoy);
    assert!(decoy_alloc > 0.0, "the decoy {decoy} was not seen\n{ctx}");
    let decoy_live = live_through(run, decoy);
    assert!(
        decoy_live <= 0.02 * decoy_alloc.max(run.leaked),
        "the balanced decoy {decoy} holds {decoy_live} bytes at the end (allocated {decoy_alloc})\n{ctx}"
    );
    // The report's leaking sites name the user's function, not the library.
    let leak_sites: Vec<&Value> = run.report.sites().iter().filter(|s| str_of(s, "class") == "leak").collect();
    assert!(!leak_sites.is_empty(), "no site classified leak\n{ctx}");
    assert_eq!(
        function_base(str_of(run.report.largest_growth(), "function")),
        culprit,
        "the top growing site's culprit\n{ctx}"
    );
    for s in leak_sites {
        let frames = s["frames"].as_array().unwrap();
        assert!(has(frames, culprit), "a leak site does not go through {culprit}: {:?}\n{ctx}", names(frames));
    }
}

/// The leak-pattern catalog's hint on the leak: the top growing site (through `culprit`) and
/// every leak site carry `likely_missing_release` with `release` (first), the verdict's
/// sentence says "likely missing RELEASE" and report.md has the site's pattern line; no site
/// through the balanced `decoy` (the same API, its result released) carries a hint.
fn assert_hint(run: &Run, culprit: &str, release: &str, decoy: &str) {
    let ctx = &run.ctx;
    let top = run.report.largest_growth();
    assert_eq!(function_base(str_of(top, "function")), culprit, "the top growing site\n{ctx}");
    assert_eq!(top["likely_missing_release"]["release"], release, "the top site's missing release\n{ctx}");
    for s in run.report.sites() {
        let frames = s["frames"].as_array().unwrap();
        // A leak site of the same bug through another API of the library names its own release
        // ("sqlite3_finalize (or sqlite3_reset)" for what sqlite3_step allocated).
        if str_of(s, "class") == "leak" {
            let hint = s["likely_missing_release"]["release"].as_str().unwrap_or("");
            assert!(hint.starts_with(release), "a leak site's hint {hint:?}: {:?}\n{ctx}", names(frames));
        }
        if has(frames, decoy) {
            assert!(
                s["likely_missing_release"].is_null(),
                "the balanced decoy {decoy}'s site has a hint: {}\n{ctx}",
                s["likely_missing_release"]
            );
        }
    }
    let decoys = run.report.sites().iter().filter(|s| has(s["frames"].as_array().unwrap(), decoy)).count();
    eprintln!("{culprit}: {decoys} site(s) through the decoy {decoy} in report.json");
    let summary = str_of(run.report.get(&["verdict"]), "summary");
    assert!(summary.contains(&format!("likely missing {release}")), "verdict: {summary}\n{ctx}");
    let md = std::fs::read_to_string(run.out.file("report.md")).expect("report.md");
    assert!(
        md.contains(&format!("whose result must be released with {release}: likely missing")),
        "report.md has no pattern line naming {release}\n{ctx}"
    );
}

#[test]
fn asprintf_leak_in_libc_names_build_page() {
    require_root();
    let run = record("unwind-asprintf", &[], &nofp().c, &["asprintf", "700"]);
    assert_found(&run, "build_page", "format_line", "libc.so");
    assert_hint(&run, "build_page", "free", "format_line");
    // libc's own frames are named with file and line from its separate debug file
    // (/usr/lib/debug/.build-id/…, Debian's libc6-dbg, which `cargo xtask setup` installs).
    let stacks = stacks_through(&run, "build_page");
    let vasprintf = stacks[0]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"].as_str() == Some("__vasprintf_internal"))
        .unwrap_or_else(|| panic!("no __vasprintf_internal frame\n{}", run.ctx));
    assert!(
        vasprintf["file"].as_str().is_some_and(|f| f.ends_with("vasprintf.c")),
        "libc frame without its source file: {vasprintf}\n{}",
        run.ctx
    );
}

/// Case 26 of the shared cases, rebuilt: inflateInit2 without inflateEnd on a truncated message.
#[test]
fn zlib_inflate_without_end_names_decode_message() {
    require_root();
    let run = record("unwind-zlib", &[], &nofp().c, &["zlib", "700"]);
    assert_found(&run, "decode_message", "read_header", "libz.so");
    assert_hint(&run, "decode_message", "inflateEnd", "read_header");
    // Both leaked blocks (the inflate state from inflateInit2_ and the window from inflate) are
    // attributed to decode_message, not merged with uncompress's balanced inflateInit2_.
    let stacks = stacks_through(&run, "decode_message");
    assert!(stacks.iter().any(|s| has(s["frames"].as_array().unwrap(), "inflate")), "no window stack\n{}", run.ctx);
}

#[test]
fn ssl_new_without_free_names_open_session() {
    require_root();
    let run = record("unwind-ssl", &[], &nofp().c, &["ssl", "600"]);
    assert_found(&run, "open_session", "probe_session", "libssl.so");
    assert_hint(&run, "open_session", "SSL_free", "probe_session");
}

#[test]
fn sqlite_prepare_without_finalize_names_run_query() {
    require_root();
    let run = record("unwind-sqlite", &[], &nofp().c, &["sqlite", "600"]);
    assert_found(&run, "run_query", "count_rows", "libsqlite3.so");
    assert_hint(&run, "run_query", "sqlite3_finalize", "count_rows");
}

#[test]
fn libstdcxx_growth_names_append_record() {
    require_root();
    let run = record("unwind-cxx", &[], &nofp().cxx, &["700"]);
    assert_found(&run, "append_record", "render_temp", "libstdc++.so");
}

#[test]
fn rust_release_leak_has_its_caller_and_main() {
    require_root();
    let run = record("unwind-rust", &[], &nofp().rust, &["700"]);
    let ctx = &run.ctx;
    let stacks = stacks_through(&run, "remember_request");
    assert!(!stacks.is_empty(), "no stack through remember_request\n{ctx}");
    for s in &stacks {
        let frames = s["frames"].as_array().unwrap();
        let n = names(frames);
        let at = |f: &str| n.iter().position(|x| x.ends_with(f) || function_base(x) == f);
        let (Some(r), Some(h), Some(m)) = (at("remember_request"), at("handle_request"), at("main")) else {
            panic!("remember_request ← handle_request ← main not all in {n:?}\n{ctx}");
        };
        assert!(r < h && h < m, "frames out of order: {n:?}\n{ctx}");
        assert!(s.get("truncated").is_none(), "truncated: {}\n{ctx}", s["truncated"]);
    }
    assert_within("live bytes through remember_request", live_through(&run, "remember_request"), run.leaked, 0.10, ctx);
    // The culprit is the user's function, not the `alloc::` internals
    // (`RawVec`, `vec::from_elem`, `Box::leak`) inlined between it and the allocator.
    let top = run.report.largest_growth();
    let culprit = str_of(top, "function");
    assert!(culprit.ends_with("remember_request"), "the top site's culprit is {culprit:?}\n{ctx}");
    for internal in ["alloc::", "core::", "std::", "<", "__rust", "__rdl"] {
        assert!(!culprit.starts_with(internal), "the culprit {culprit:?} is standard-library code\n{ctx}");
    }
    let frames = top["frames"].as_array().unwrap();
    let at = top["culprit_frame"].as_u64().unwrap_or_else(|| panic!("no culprit_frame\n{ctx}")) as usize;
    assert_eq!(frames[at]["function"].as_str(), Some(culprit), "culprit_frame is not the culprit\n{ctx}");
    assert_eq!(str_of(top, "class"), "leak", "{ctx}");
    let verdict = run.report.get(&["verdict"]);
    assert_eq!(verdict["class"], "leak", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(
        summary.starts_with(&format!("leak: {culprit} holds")),
        "the verdict does not name {culprit}: {summary}\n{ctx}"
    );
}

/// For a stripped shared object: a C library built -O2 without frame pointers
/// and stripped (`strip --strip-all`; its leaking function is static, so no symbol names it),
/// dlopened by a host program, leaks 1000 B a call through malloc (`keep_entry`, 400 calls) beside
/// a balanced calloc decoy. The culprit is the library's frame, labelled `libstripped.so+0xOFFSET`
/// (the file offset addr2line on the unstripped build turns back into keep_entry), in report.json
/// and in the verdict, never libc's `malloc`/`__GI___libc_malloc`/`__libc_calloc`.
#[test]
fn stripped_shared_object_culprit_is_object_and_offset_not_malloc() {
    require_root();
    let dir = scratch_dir();
    let run_tool = |cmd: &mut Command, what: &str| {
        let o = cmd.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        assert!(o.status.success(), "{what} failed:\n{}", String::from_utf8_lossy(&o.stderr));
    };
    let (full, lib, host) = (dir.join("libstripped-full.so"), dir.join("libstripped.so"), dir.join("plugin_host_nofp"));
    run_tool(
        Command::new("gcc")
            .args(["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-shared", "-fPIC", "-o"])
            .arg(&full)
            .arg(fixture_source("stripped_lib.c")),
        "building stripped_lib.c",
    );
    run_tool(Command::new("strip").arg("--strip-all").arg("-o").arg(&lib).arg(&full), "strip");
    run_tool(
        Command::new("gcc")
            .args(["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-o"])
            .arg(&host)
            .arg(fixture_source("plugin_host.c"))
            .arg("-ldl"),
        "building plugin_host.c",
    );
    let iterations: u64 = 400;
    let out = OutDir::new("unwind-stripped-so");
    let mut target = Command::new(&host);
    target.arg(&lib).args([&iterations.to_string(), "200"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    assert!(
        o.stdout.contains(&format!("done iterations={iterations}")),
        "the host did not run to its end\n{}",
        o.describe()
    );
    let report = Report::load(&out.path);
    let ctx = format!("{}\nreport: {}\n{}", o.describe(), out.path.display(), report.summary());
    let top = report.largest_growth();
    let culprit = str_of(top, "function").to_string();
    let off = culprit
        .strip_prefix("libstripped.so+0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| panic!("the top site's culprit {culprit:?} is not libstripped.so+0xOFFSET\n{ctx}"));
    let frames = top["frames"].as_array().unwrap();
    let at = top["culprit_frame"].as_u64().unwrap_or_else(|| panic!("no culprit_frame\n{ctx}")) as usize;
    let f = &frames[at];
    assert!(f["object"].as_str().is_some_and(|o| o.ends_with("/libstripped.so")), "culprit frame {f}\n{ctx}");
    assert!(f["function"].as_str().is_none_or(str::is_empty), "a stripped frame with a name: {f}\n{ctx}");
    assert_eq!(f["file_offset"].as_u64(), Some(off), "label and file_offset differ\n{ctx}");
    assert!(
        at > 0 && frames[..at].iter().all(|f| f["allocator"] == true),
        "the frames inside the culprit are not all the allocator's: {:?}\n{ctx}",
        names(frames)
    );
    // The offset of a return address: addr2line takes the call's address (offset - 1).
    let a2l = Command::new("addr2line")
        .args(["-f", "-e"])
        .arg(&full)
        .arg(format!("{:#x}", off - 1))
        .output()
        .expect("addr2line");
    let name = String::from_utf8_lossy(&a2l.stdout).lines().next().unwrap_or("").to_string();
    assert_eq!(name, "keep_entry", "addr2line on the unstripped build names {name:?}\n{ctx}");
    assert_eq!(str_of(top, "class"), "leak", "{ctx}");
    // The first calls after dlopen can be walked before the new object's unwind table is in the
    // kernel (a truncated stack, its own site): every leaked byte is still keep_entry's label.
    let live: u64 = report.sites_of(&culprit).iter().map(|s| u64_of(s, "live_bytes")).sum();
    assert_within("live bytes of the stripped leak", live as f64, (iterations * 1000) as f64, 0.02, &ctx);
    let allocator =
        |name: &str| ["malloc", "calloc", "__GI___libc_malloc", "__libc_calloc"].iter().any(|a| name.contains(a));
    for s in report.sites().iter().filter(|s| str_of(s, "class") == "leak") {
        let function = str_of(s, "function");
        assert!(!allocator(function), "a leak site named after the allocator: {function}\n{ctx}");
        assert_eq!(function, culprit, "another leak site (the calloc decoy?)\n{ctx}");
    }
    let verdict = report.get(&["verdict"]);
    assert_eq!(verdict["class"], "leak", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(
        summary.starts_with(&format!("leak: {culprit} holds")),
        "the verdict does not name {culprit}: {summary}\n{ctx}"
    );
    assert!(!allocator(summary), "the verdict names the allocator: {summary}\n{ctx}");
}

#[test]
fn twenty_calls_deep_without_frame_pointers_reaches_main() {
    require_root();
    let run = record("unwind-deep", &[], &nofp().c, &["deep", "500"]);
    let ctx = &run.ctx;
    let stacks = stacks_through(&run, "leak_deep");
    assert!(!stacks.is_empty(), "no stack through leak_deep\n{ctx}");
    for s in &stacks {
        let frames = s["frames"].as_array().unwrap();
        for k in 1..=20 {
            assert!(has(frames, &format!("level_{k}")), "level_{k} missing: {:?}\n{ctx}", names(frames));
        }
        assert!(has(frames, "main"), "main missing: {:?}\n{ctx}", names(frames));
        assert!(s.get("truncated").is_none(), "truncated: {}\n{ctx}", s["truncated"]);
    }
    assert_within("live bytes through leak_deep", live_through(&run, "leak_deep"), run.leaked, 0.10, ctx);
}

/// One malloc call site (make_record) reached from three callers with the same frame size, so
/// malloc is entered with the same registers and stack pointer from each, the caller changing
/// every few calls: the kernel side's walk memo (a thread's last walk, taken again when every
/// word it read is unchanged) must see the one word that differs, the return address into the
/// caller. Each caller's live bytes match the fixture's count, the two leaks grow at their
/// ratio (192 : 256 bytes an iteration), the balanced decoy is not a leak, and the memo was
/// used (without it this would test nothing).
#[test]
fn one_call_site_under_callers_with_the_same_stack_pointer_is_told_apart() {
    require_root();
    let n: u64 = 400;
    let run = record("unwind-twins", &[], &nofp().c, &["twins", &n.to_string()]);
    let ctx = &run.ctx;
    let callers = ["keep_left", "keep_right", "check_record"];
    for caller in callers {
        let stacks = stacks_through(&run, caller);
        assert!(!stacks.is_empty(), "no stack through {caller}\n{ctx}");
        for s in &stacks {
            let frames = s["frames"].as_array().unwrap();
            for other in callers.iter().filter(|c| **c != caller) {
                assert!(!has(frames, other), "a stack holds both {caller} and {other}: {:?}\n{ctx}", names(frames));
            }
            assert!(has(frames, "make_record") && has(frames, "main"), "{caller}: {:?}\n{ctx}", names(frames));
            assert!(s.get("truncated").is_none(), "{caller}'s stack is truncated: {}\n{ctx}", s["truncated"]);
        }
    }
    assert_within("live bytes through keep_left", live_through(&run, "keep_left"), (n * 3 * 64) as f64, 0.10, ctx);
    assert_within("live bytes through keep_right", live_through(&run, "keep_right"), (n * 2 * 128) as f64, 0.10, ctx);
    let decoy = allocated_through(&run, "check_record");
    assert_within("bytes allocated through check_record", decoy, (n * 96) as f64, 0.10, ctx);
    assert!(live_through(&run, "check_record") <= 0.02 * decoy, "the decoy check_record holds bytes\n{ctx}");

    let leaks: Vec<&Value> = run.report.sites().iter().filter(|s| str_of(s, "class") == "leak").collect();
    let rate = |caller: &str| -> f64 {
        leaks
            .iter()
            .filter(|s| s["frames"].as_array().is_some_and(|f| has(f, caller)))
            .map(|s| f64_of(s, "growth_bytes_per_s"))
            .sum()
    };
    let (left, right) = (rate("keep_left"), rate("keep_right"));
    assert!(left > 0.0 && right > 0.0, "not both callers leak: {left} and {right} B/s\n{ctx}");
    assert_within("keep_left's growth over keep_right's", left / right, 192.0 / 256.0, 0.10, ctx);
    assert_eq!(rate("check_record"), 0.0, "the decoy check_record is a leak site\n{ctx}");
    let reused = run.report.get(&["events", "walks_reused"]).as_u64().unwrap_or(0);
    assert!(reused >= n, "the walk memo was used {reused} times over {n} iterations (3 a iteration expected)\n{ctx}");
}

/// An allocation in a signal handler: the walk goes through the kernel's signal frame (glibc's
/// __restore_rt) to the interrupted code and on to main.
#[test]
fn signal_handler_stack_reaches_the_interrupted_code_and_main() {
    require_root();
    let run = record("unwind-signal", &[], &nofp().c, &["signal", "400"]);
    let ctx = &run.ctx;
    let stacks = stacks_through(&run, "on_alarm");
    assert!(!stacks.is_empty(), "no stack through on_alarm\n{ctx}");
    let complete = stacks
        .iter()
        .filter(|s| {
            let f = s["frames"].as_array().unwrap();
            s.get("truncated").is_none() && has(f, "busy_worker") && has(f, "main")
        })
        .count();
    // The interrupted pc is anywhere in spin/busy_worker; every stack must cross the frame.
    assert_eq!(
        complete,
        stacks.len(),
        "{complete} of {} stacks through on_alarm reach busy_worker and main\n{ctx}",
        stacks.len()
    );
    assert_within("live bytes through on_alarm", live_through(&run, "on_alarm"), run.leaked, 0.10, ctx);
}

/// Growth mode: the first touch of a fresh heap page happens inside glibc's _int_malloc (it
/// writes the next chunk's header); the full stack names the user's function that keeps the
/// small blocks.
#[test]
fn growth_mode_names_the_user_function_not_int_malloc() {
    require_root();
    let run = record("unwind-growth", &["--mode", "growth"], &nofp().c, &["small", "400"]);
    let ctx = &run.ctx;
    let top = run.report.largest_growth();
    assert_eq!(str_of(top, "function"), "remember_small", "top growing site\n{ctx}");
    // One 64-byte chunk per 48-byte block: the blocks fill n * 64 * 64 bytes of fresh pages.
    let resident = totals_where(&run.out.path, |f| has(f, "remember_small")).alloc_bytes as f64;
    assert_within("pages made resident through remember_small", resident, 400.0 * 64.0 * 64.0, 0.10, ctx);
}

/// Growth mode walks from the page-fault tracepoint, where interrupts are off and the kernel can
/// look up one mapping per CPU until they are on again (`bpf_find_vma` answers "busy"); the walk
/// keeps the mappings it has looked up per CPU. On Debian's interpreter (no frame pointers,
/// statically linked libpython, plus libc and zlib), nearly every distinct stack is walked to its
/// outermost frame: without the mapping cache more than half ended at their second object.
#[test]
fn growth_mode_walks_a_distro_interpreter_to_the_end() {
    require_root();
    let py = Path::new("/usr/bin/python3.11");
    assert!(py.exists(), "Debian's python3.11 (package python3.11-minimal) is needed");
    let out = OutDir::new("unwind-growth-python");
    let mut target = Command::new(py);
    target.arg(fixture_source("runtimes/fault_walk.py")).arg("60");
    let o = record_launch(&out, &["--mode", "growth", "--duration", "12s"], target);
    o.assert_success();
    let ctx = format!("{}\nreport: {}", o.describe(), out.path.display());
    let rec: Value = serde_json::from_slice(&std::fs::read(out.path.join("recording.json")).unwrap()).unwrap();
    let stacks = rec["stacks"].as_array().unwrap();
    let truncated: Vec<&str> = stacks.iter().filter_map(|s| s["truncated"].as_str()).collect();
    assert!(stacks.len() >= 50, "only {} stacks\n{ctx}", stacks.len());
    assert!(
        truncated.len() * 100 <= stacks.len() * 15,
        "{} of {} stacks truncated (at most 15 %); first reasons: {:?}\n{ctx}",
        truncated.len(),
        stacks.len(),
        &truncated[..truncated.len().min(8)]
    );
    // The Python code's stacks reach the interpreter's main through the eval loop.
    let through_step = stacks
        .iter()
        .filter(|s| {
            let f: Vec<&str> = s["frames"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).collect();
            f.contains(&"_PyEval_EvalFrameDefault") && f.contains(&"Py_BytesMain")
        })
        .count();
    assert!(through_step >= 10, "{through_step} stacks from the eval loop to Py_BytesMain\n{ctx}");
}

/// `nofp` with its `.eh_frame` removed (and no frame pointers): the user's frames have no unwind
/// info, so the walk stops in them; the report says where and why, and --debug-unwind prints
/// the kernel side's reason as it happens.
#[test]
fn stack_without_unwind_info_is_truncated_honestly() {
    require_root();
    let bin = scratch_dir().join("nofp-no-eh-frame");
    let o = Command::new("objcopy")
        .args(["--remove-section", ".eh_frame", "--remove-section", ".eh_frame_hdr"])
        .arg(&nofp().c)
        .arg(&bin)
        .output()
        .expect("objcopy (binutils)");
    assert!(o.status.success(), "objcopy: {}", String::from_utf8_lossy(&o.stderr));
    let out = OutDir::new("unwind-truncated");
    let mut target = Command::new(&bin);
    target.args(["deep", "300"]);
    let o = record_launch(&out, &["--debug-unwind"], target);
    o.assert_success();
    let ctx = format!("{}\nreport: {}", o.describe(), out.path.display());
    assert!(o.stderr.contains("leaktrace: kernel: walk of pid"), "--debug-unwind printed no kernel-side reason\n{ctx}");
    let run = Run { report: Report::load(&out.path), out, leaked: 0.0, chunk_truth: false, ctx };
    let stacks = stacks_through(&run, "leak_deep");
    assert!(!stacks.is_empty(), "no stack through leak_deep\n{}", run.ctx);
    for s in &stacks {
        let why = s["truncated"].as_str().unwrap_or_else(|| panic!("not marked truncated: {s}\n{}", run.ctx));
        assert!(
            why.starts_with("no unwind info for") && why.contains("nofp-no-eh-frame+0x"),
            "truncation reason {why:?}\n{}",
            run.ctx
        );
        assert!(!has(s["frames"].as_array().unwrap(), "main"), "reached main without unwind info?\n{}", run.ctx);
    }
    let md = std::fs::read_to_string(run.out.file("report.md")).unwrap();
    assert!(
        md.contains("[stack truncated: no unwind info for"),
        "report.md does not say the stack is truncated\n{}",
        run.ctx
    );
    assert!(
        run.report.get(&["events"])["stack_truncated"].as_u64().unwrap_or(0) > 0,
        "stack_truncated not counted\n{}",
        run.ctx
    );
}

/// A stripped executable: its frames have no names, and each is labelled by its object and file
/// offset, which addr2line on the unstripped build turns back into the function.
#[test]
fn stripped_frames_are_object_and_file_offset() {
    require_root();
    let bin = scratch_dir().join("nofp-stripped");
    let o = Command::new("strip").arg("--strip-all").arg("-o").arg(&bin).arg(&nofp().c).output().expect("strip");
    assert!(o.status.success(), "strip: {}", String::from_utf8_lossy(&o.stderr));
    let out = OutDir::new("unwind-stripped");
    let mut target = Command::new(&bin);
    target.args(["deep", "300"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let ctx = format!("{}\nreport: {}", o.describe(), out.path.display());
    let top = Report::load(&out.path).largest_growth().clone();
    let function = str_of(&top, "function").to_string();
    let off = function
        .strip_prefix("nofp-stripped+0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| panic!("top site {function:?} is not labelled nofp-stripped+0xOFFSET\n{ctx}"));
    let frame = top["frames"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["object"].as_str().is_some_and(|o| o.ends_with("nofp-stripped")))
        .unwrap_or_else(|| panic!("no frame in the stripped executable\n{ctx}"));
    assert_eq!(frame["file_offset"].as_u64(), Some(off), "label and file_offset differ\n{ctx}");
    assert!(frame["build_id"].as_str().is_some_and(|b| b.len() >= 16), "no build id\n{ctx}");
    // The offset of a return address: addr2line takes the call's address (offset - 1).
    let a2l = Command::new("addr2line")
        .args(["-f", "-e"])
        .arg(&nofp().c)
        .arg(format!("{:#x}", off - 1))
        .output()
        .expect("addr2line (binutils)");
    let name = String::from_utf8_lossy(&a2l.stdout).lines().next().unwrap_or("").to_string();
    assert_eq!(name, "leak_deep", "addr2line on the unstripped build names {name:?}\n{ctx}");
}
