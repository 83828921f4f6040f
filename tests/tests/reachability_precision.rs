//! `record --reachability` as precise as LeakSanitizer and valgrind memcheck, on
//! real processes (tests/fixtures/precision.c, built -O0 and -O2 without frame pointers): each
//! kind of false root or blind spot of a conservative scan has a block with a known answer,
//! asserted exactly, and each fixture runs 10 times in its test (the figures must repeat):
//! - the allocator's own data is no root: a lost 1,000-byte block whose last 8 bytes hold the
//!   top chunk's header (`main_arena.top` points there) is lost;
//! - dead words below a thread's stack pointer are no roots: a block whose only pointer is a
//!   dead word just below main's stack pointer is lost; a block held in a frame is named by
//!   that frame's function, not by a code pointer stored below it;
//! - glibc's stack cache holds the DTVs of exited threads, and a thread on a malloc'd stack
//!   holds its own: no DTV is lost;
//! - a pointer held only in %xmm15 is a root;
//! - a block with a page made PROT_NONE is read all the same (/proc/PID/mem): the block its
//!   pointer there holds is held, and nothing is said to be "unmapped";
//! - names: a one-letter C function `f` is not `float`; a block held by a static of libc's is
//!   named by its symbol from libc's debug file (libc6-dbg);
//! - a launched program that exits is scanned at `exit`'s entry, LSan's limit: a block kept
//!   only by a stale word in a dead frame is lost, one in main's live frame is held (exit from
//!   main), and lost when main has returned;
//! - a child that allocates right after `fork` (--follow-forks), launched or attached: held as
//!   its fork returns to it until followed, its first blocks are in its scan.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use leaktrace_tests::*;

/// Fixture runs per test: the same figures every time.
const RUNS: usize = 10;

/// tests/fixtures/precision.c built at `opt` ("-O0" or "-O2"), without frame pointers, once per
/// run ([`built_once`]: `reachability_precision-OPT`).
fn precision_bin(opt: &str) -> PathBuf {
    built_once(&format!("reachability_precision{opt}"), |dir| {
        let flags = [opt, "-fomit-frame-pointer", "-pthread"];
        compile_with("gcc", &[&fixture_source("precision.c")], &dir.join(format!("precision{opt}")), &flags);
    })
    .join(format!("precision{opt}"))
}

/// The reachability site of `function` (exactly one).
fn site<'a>(r: &'a Value, function: &str, ctx: &str) -> &'a Value {
    let sites = r["sites"].as_array().expect("reachability.sites");
    let found: Vec<&Value> = sites.iter().filter(|s| s["function"].as_str() == Some(function)).collect();
    assert_eq!(found.len(), 1, "sites of {function}\n{ctx}");
    found[0]
}

/// (reachable bytes, reachable blocks, unreachable bytes, unreachable blocks) of a site.
fn figures(s: &Value) -> (u64, u64, u64, u64) {
    (
        u64_of(s, "reachable_bytes"),
        u64_of(s, "reachable_blocks"),
        u64_of(s, "unreachable_bytes"),
        u64_of(s, "unreachable_blocks"),
    )
}

/// One run of `precision attached` under `record --pid --reachability` (ended by SIGINT once
/// the fixture is waiting); returns the report's `reachability` and a context for messages.
fn attached_run(bin: &Path, name: &str) -> (Value, String) {
    let out = OutDir::new(name);
    let mut target = Target::spawn({
        let mut c = Command::new(bin);
        c.arg("attached");
        c
    });
    target.expect_pid_line();
    let mut cmd = leaktrace(["record", "--reachability", "--interval", "500ms"]);
    cmd.arg("--pid").arg(target.pid.to_string()).arg("--out").arg(&out.path);
    let mut lt = Running::spawn(cmd, None);
    lt.wait_for_stderr_line("leaktrace: attached", TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    target.signal(libc::SIGUSR1);
    assert_eq!(target.next_line(Duration::from_secs(60)).as_deref(), Some("done"), "the fixture did not finish");
    std::thread::sleep(Duration::from_millis(1200));
    lt.signal(libc::SIGINT);
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    target.signal(libc::SIGUSR2);
    assert_eq!(target.next_line(Duration::from_secs(10)).as_deref(), Some("sum 1"), "the fixture's data changed");
    assert!(target.wait(Duration::from_secs(10)).is_some_and(|s| s.success()), "the fixture did not exit 0");
    let r = Report::load(&out.path);
    let reach = r.get(&["reachability"]).clone();
    let ctx = format!("{}\n{}", o.stderr, serde_json::to_string_pretty(&reach).unwrap());
    (reach, ctx)
}

fn attached_precision(opt: &str) {
    require_root();
    let bin = precision_bin(opt);
    for run in 0..RUNS {
        let (r, ctx) = attached_run(&bin, &format!("precision-attached{opt}-{run}"));
        let ctx = format!("run {run} of {RUNS} ({opt})\n{ctx}");
        assert_eq!(r["complete"], true, "{ctx}");
        // The newest block, lost, though main_arena.top points into its last 8 bytes.
        assert_eq!(figures(site(&r, "leak_top", &ctx)), (0, 0, 1000, 1), "leak_top\n{ctx}");
        // Its only pointer is a dead word just below main's stack pointer.
        assert_eq!(figures(site(&r, "make_planted", &ctx)), (0, 0, 48, 1), "make_planted\n{ctx}");
        // Only in %xmm15 of the main thread.
        let x = site(&r, "stash_in_xmm", &ctx);
        assert_eq!(figures(x), (88, 1, 0, 0), "stash_in_xmm\n{ctx}");
        assert_eq!(x["retained_by"][0]["kind"], "register", "{ctx}");
        assert_eq!(x["retained_by"][0]["register"], "xmm15", "{ctx}");
        // In hold_and_wait's frame, a code pointer (decoy_function) below the slot.
        let h = site(&r, "hold_and_wait", &ctx);
        assert_eq!(figures(h), (72, 1, 0, 0), "hold_and_wait\n{ctx}");
        assert_eq!(h["retained_by"][0]["kind"], "stack", "{ctx}");
        assert_eq!(h["retained_by"][0]["function"], "hold_and_wait", "{ctx}");
        let g = site(&r, "keep_global", &ctx);
        assert_eq!(figures(g), (64, 1, 0, 0), "keep_global\n{ctx}");
        assert_eq!(g["retained_by"][0]["symbol"], "g_keep", "{ctx}");
        // A page of `guard`'s block made PROT_NONE holds guarded_child's only pointer: read all
        // the same (the data is there), and not called "unmapped".
        assert_eq!(figures(site(&r, "guard", &ctx)), (12288, 1, 0, 0), "guard\n{ctx}");
        assert_eq!(figures(site(&r, "guarded_child", &ctx)), (40, 1, 0, 0), "guarded_child\n{ctx}");
        let notes: Vec<&str> = r["notes"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(notes.iter().any(|n| n.starts_with("1 block(s) in memory the program made inaccessible")), "{ctx}");
        assert!(!notes.iter().any(|n| n.contains("unmapped")), "{ctx}");
        // A one-letter C function is `f`, not `float`.
        let f = site(&r, "f", &ctx);
        assert_eq!(figures(f), (24, 1, 0, 0), "f\n{ctx}");
        assert_eq!(f["retained_by"][0]["symbol"], "g_f", "{ctx}");
        // getpwuid's 1,024-byte buffer, held by libc's static `buffer` (a local symbol: named
        // from libc's debug file, libc6-dbg).
        let sites = r["sites"].as_array().unwrap();
        let by_buffer: Vec<&Value> = sites.iter().filter(|s| s["retained_by"][0]["symbol"] == "buffer").collect();
        assert_eq!(by_buffer.len(), 1, "no site held by libc's `buffer` (is libc6-dbg installed?)\n{ctx}");
        assert_eq!(figures(by_buffer[0]), (1024, 1, 0, 0), "{ctx}");
        assert!(str_of(&by_buffer[0]["retained_by"][0], "object").contains("/libc.so"), "{ctx}");
        // `threads`: the 256 KiB stack (g_stack) and every DTV (4 exited threads' in glibc's
        // stack cache, reused by the holder thread's; the malloc'd-stack thread's own) held.
        let th: Vec<&Value> = sites.iter().filter(|s| s["function"] == "threads").collect();
        let lost: u64 = th.iter().map(|s| u64_of(s, "unreachable_bytes")).sum();
        let held: u64 = th.iter().map(|s| u64_of(s, "reachable_blocks")).sum();
        assert_eq!(lost, 0, "threads: DTVs lost\n{ctx}");
        assert_eq!(held, 6, "threads: the stack and 5 DTVs held\n{ctx}");
        assert!(th.iter().any(|s| s["retained_by"][0]["region"] == "thread descriptor (glibc stack cache)"), "{ctx}");
    }
}

/// Allocator data, dead stack words, DTVs, %xmm15: -O0.
#[test]
fn attached_scan_precision_o0() {
    attached_precision("-O0");
}

/// The same at -O2.
#[test]
fn attached_scan_precision_o2() {
    attached_precision("-O2");
}

/// `record --reachability -- precision MODE`: the scan at exit, RUNS times.
fn at_exit(opt: &str) {
    require_root();
    let bin = precision_bin(opt);
    for run in 0..RUNS {
        for mode in ["exit", "return"] {
            let out = OutDir::new(&format!("precision-{mode}{opt}-{run}"));
            let mut c = Command::new(&bin);
            c.arg(mode);
            let o = record_launch(&out, &["--reachability"], c);
            o.assert_success();
            let rep = Report::load(&out.path);
            let r = rep.get(&["reachability"]);
            let ctx = format!(
                "run {run} of {RUNS} ({mode} {opt})\n{}\n{}",
                o.stderr,
                serde_json::to_string_pretty(r).unwrap()
            );
            assert!(r.is_object(), "no scan at exit\n{ctx}");
            assert_eq!(r["complete"], true, "{ctx}");
            let notes = r["notes"].as_array().expect("notes");
            assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("at the program's exit"))), "{ctx}");
            // LSan's exit_atexit_stale_stack: only a dead frame points at it.
            assert_eq!(figures(site(r, "leak_to_dead_frame", &ctx)), (0, 0, 100, 1), "{ctx}");
            let g = site(r, "keep_global", &ctx);
            assert_eq!(figures(g), (64, 1, 0, 0), "{ctx}");
            assert_eq!(g["retained_by"][0]["symbol"], "g_keep", "{ctx}");
            let s = site(r, "keep_on_stack", &ctx);
            if mode == "exit" {
                // exit(0) from main: main's frame is live, above exit's entry.
                assert_eq!(figures(s), (32, 1, 0, 0), "{ctx}");
                assert_eq!(s["retained_by"][0]["kind"], "stack", "{ctx}");
                assert_eq!(s["retained_by"][0]["function"], "main", "{ctx}");
            } else {
                // main returned: its frame is dead below exit's caller.
                assert_eq!(figures(s), (0, 0, 32, 1), "{ctx}");
            }
        }
    }
}

/// A launched program that exits is scanned at `exit`'s entry: -O0.
#[test]
fn scan_at_exit_o0() {
    at_exit("-O0");
}

/// The same at -O2: main's large frame holds, in some runs, a stale return address into ld.so's
/// `init_cpu_features` below the slot; the slot is still main's (frames walked by CFI).
#[test]
fn scan_at_exit_o2() {
    at_exit("-O2");
}

/// `record --reachability --follow-forks -- precision fork`: the child allocates at once after
/// `fork`, before the agent's next poll; held as its fork returns to it until followed, both
/// its blocks are in its scan at its exit (the leak lost, the global's block held), RUNS times.
/// Without the hold the child was over before it was followed: no blocks, no scan.
fn forked_child(opt: &str) {
    require_root();
    let bin = precision_bin(opt);
    for run in 0..RUNS {
        let out = OutDir::new(&format!("precision-fork{opt}-{run}"));
        let mut c = Command::new(&bin);
        c.arg("fork");
        let o = record_launch(&out, &["--reachability", "--follow-forks"], c);
        o.assert_success();
        let reports: Vec<Report> = std::fs::read_dir(&out.path)
            .expect("the output directory")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("pid-"))
            .map(|e| Report::load(&e.path()))
            .collect();
        let warnings: Vec<String> =
            reports.iter().map(|r| format!("{}: warnings {}", r.dir.display(), r.json["warnings"])).collect();
        let ctx = format!("run {run} of {RUNS} ({opt})\n{}\n{}", o.describe(), warnings.join("\n"));
        assert_eq!(reports.len(), 2, "the parent's and the child's reports\n{ctx}");
        for r in &reports {
            assert!(r.json["reachability"]["sites"].is_array(), "{}: no reachability scan\n{ctx}", r.dir.display());
        }
        let has = |r: &Report, f: &str| {
            r.get(&["reachability", "sites"]).as_array().is_some_and(|s| s.iter().any(|s| s["function"] == f))
        };
        let child: Vec<&Report> = reports.iter().filter(|r| has(r, "keep_global")).collect();
        assert_eq!(child.len(), 1, "one scan holds the child's blocks\n{ctx}");
        let parent = reports.iter().find(|r| !has(r, "keep_global")).expect("the parent's report");
        assert!(!has(parent, "leak_to_dead_frame"), "the child's leak in the parent's scan\n{ctx}");
        let r = child[0].get(&["reachability"]);
        let ctx = format!("{ctx}\n{}", serde_json::to_string_pretty(r).unwrap());
        assert_eq!(r["complete"], true, "{ctx}");
        let notes = r["notes"].as_array().expect("notes");
        assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("at the program's exit"))), "{ctx}");
        assert_eq!(figures(site(r, "leak_to_dead_frame", &ctx)), (0, 0, 100, 1), "{ctx}");
        let g = site(r, "keep_global", &ctx);
        assert_eq!(figures(g), (64, 1, 0, 0), "{ctx}");
        assert_eq!(g["retained_by"][0]["symbol"], "g_keep", "{ctx}");
    }
}

/// A child that allocates right after `fork` (--follow-forks): -O0.
#[test]
fn forked_child_scanned_from_its_first_allocation_o0() {
    forked_child("-O0");
}

/// The same at -O2.
#[test]
fn forked_child_scanned_from_its_first_allocation_o2() {
    forked_child("-O2");
}

/// `record --reachability --follow-forks --pid` of `precision attached-fork`: its child
/// allocates at once after `fork`; held as its fork returns to it until followed, both its
/// blocks are in its scan at the end of the session (the leak lost, the global's block held),
/// RUNS times.
fn attached_forked_child(opt: &str) {
    require_root();
    let bin = precision_bin(opt);
    for run in 0..RUNS {
        let out = OutDir::new(&format!("precision-attached-fork{opt}-{run}"));
        let mut target = Target::spawn({
            let mut c = Command::new(&bin);
            c.arg("attached-fork");
            c
        });
        target.expect_pid_line();
        let mut cmd = leaktrace(["record", "--reachability", "--follow-forks", "--interval", "500ms"]);
        cmd.arg("--pid").arg(target.pid.to_string()).arg("--out").arg(&out.path);
        let mut lt = Running::spawn(cmd, None);
        lt.wait_for_stderr_line("leaktrace: attached", TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
        target.signal(libc::SIGUSR1);
        let line = target.next_line(Duration::from_secs(30)).unwrap_or_default();
        let child: i32 = line.strip_prefix("child ").and_then(|p| p.parse().ok()).expect("the child's PID line");
        lt.wait_for_stderr_line(&format!("leaktrace: following PID {child}"), TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(Duration::from_millis(300));
        lt.signal(libc::SIGINT);
        let o = lt.wait(TIMEOUT);
        o.assert_success();
        // SAFETY: kill(2) of the fixture's child, which waits for it.
        unsafe { libc::kill(child, libc::SIGUSR2) };
        assert!(target.wait(Duration::from_secs(10)).is_some_and(|s| s.success()), "the fixture did not exit 0");
        let ctx = format!("run {run} of {RUNS} ({opt})\n{}", o.describe());
        let r = Report::load(&out.path.join(format!("pid-{child}")));
        let r = r.get(&["reachability"]);
        let ctx = format!("{ctx}\n{}", serde_json::to_string_pretty(r).unwrap());
        assert_eq!(r["complete"], true, "{ctx}");
        assert_eq!(figures(site(r, "leak_to_dead_frame", &ctx)), (0, 0, 100, 1), "{ctx}");
        let g = site(r, "keep_global", &ctx);
        assert_eq!(figures(g), (64, 1, 0, 0), "{ctx}");
        assert_eq!(g["retained_by"][0]["symbol"], "g_keep", "{ctx}");
    }
}

/// An attached process's child that allocates right after `fork` (--follow-forks): -O0.
#[test]
fn attached_forked_child_scanned_from_its_first_allocation_o0() {
    attached_forked_child("-O0");
}

/// The same at -O2.
#[test]
fn attached_forked_child_scanned_from_its_first_allocation_o2() {
    attached_forked_child("-O2");
}
