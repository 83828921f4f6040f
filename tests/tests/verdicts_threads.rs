//! Thread verdicts (tests/fixtures/kinds.c) on real processes with known truth: rising
//! concurrency and a thread pool recreated are not leaks; threads never joined are.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use leaktrace_tests::*;

/// tests/fixtures/kinds.c, compiled once (gcc -O2 -g -pthread: no frame pointers, the stacks are
/// unwound with the objects' CFI).
fn kinds_fixture() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("verdicts_threads-kinds", |dir| {
            let bin = dir.join("kinds");
            let o = Command::new("gcc")
                .args(["-O2", "-g", "-pthread", "-Wall", "-o"])
                .arg(&bin)
                .arg(fixture_source("kinds.c"))
                .output()
                .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
            assert!(o.status.success(), "compiling kinds.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
        })
        .join("kinds")
    })
}

/// Record `kinds MODE SECONDS` launched under leaktrace (interval 250 ms); asserts it ran to its
/// end and returns its output directory (kept while it lives), its report, the context to print
/// on failure and the threads it started.
fn record_kinds(name: &str, mode: &str, seconds: u32) -> (OutDir, Report, String, u64) {
    let out = OutDir::new(name);
    let mut target = Command::new(kinds_fixture());
    target.args([mode, &seconds.to_string()]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let threads: u64 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("done {mode} {seconds} ")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("kinds {mode} did not run to its end\n{}", o.describe()));
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    (out, r, ctx, threads)
}

/// Rising concurrency is not a leak. One more worker thread every 800 ms for 16 s; each loops
/// over batches: take_batch() mallocs 64 blocks of 1 KiB, the worker sleeps 20 ms and frees them.
/// The blocks in flight grow with the workers, so take_batch's live bytes rise steadily, but no
/// block outlives a checkpoint interval: its site is temporary ("in flight grows with
/// concurrency"), its live blocks' mean age at the end below one interval, never a leak. The
/// leak decoy in the same process, worker 0's keep_result() (one 1 KiB block per 25 ms batch,
/// never freed), stays a leak at 40,960 B/s ± 15 % and is what the verdict names.
#[test]
fn rising_concurrency_is_not_a_leak() {
    require_root();
    let (_out, r, ctx, threads) = record_kinds("concurrency", "concurrency", 16);
    assert!(threads >= 15, "{threads} workers started\n{ctx}");
    let batch = r.site("take_batch");
    // The decoy is real: its blocks in flight rose with the workers (else this tests nothing).
    assert!(f64_of(batch, "growth_bytes_per_s") > 10_000.0, "{ctx}");
    assert!(u64_of(batch, "live_allocations") >= 4 * 64, "{ctx}");
    for s in r.sites_of("take_batch") {
        assert_ne!(str_of(s, "class"), "leak", "rising concurrency called a leak\n{ctx}");
    }
    assert_eq!(str_of(batch, "class"), "temporary", "{ctx}");
    assert!(str_of(batch, "reason").contains("in flight grows with concurrency"), "{ctx}");
    let age = batch["evidence"]["mean_age_s"].as_f64().unwrap_or_else(|| panic!("no mean_age_s\n{ctx}"));
    assert!(age < 0.25, "take_batch's blocks are {age} s old on average\n{ctx}");
    let leak = r.site("keep_result");
    assert_eq!(str_of(leak, "class"), "leak", "{ctx}");
    assert_within("keep_result growth (B/s)", f64_of(leak, "growth_bytes_per_s"), 40_960.0, 0.15, &ctx);
    assert!(leak["evidence"]["mean_age_s"].as_f64().unwrap_or(0.0) > 1.0, "kept blocks are old\n{ctx}");
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    assert!(str_of(verdict, "summary").starts_with("leak: keep_result"), "{ctx}");
    assert!(!str_of(verdict, "summary").contains("take_batch"), "{ctx}");
    eprintln!(
        "concurrency: {threads} workers; take_batch {} ({} blocks, mean age {age:.3} s); verdict {}",
        batch["class"],
        batch["live_allocations"],
        str_of(verdict, "summary")
    );
}

/// Thread stacks of a fixed pool are no leak, and are judged by what is resident. recreate_pool()
/// joins its 4 threads and starts 4 new ones every second for 12 s (glibc maps 8 MiB for each
/// stack and reuses the stacks of joined threads): the pool's stacks are a thread-stack site of 4
/// threads, not growing, never a leak, and the verdict neither is a leak nor names their virtual
/// size (32 MiB mapped, a few pages of it resident).
#[test]
fn thread_pool_recreated_is_not_a_leak() {
    require_root();
    let (_out, r, ctx, threads) = record_kinds("thread-pool", "pool", 12);
    assert!(threads >= 40, "{threads} threads started\n{ctx}");
    let stacks = r
        .sites_of("recreate_pool")
        .into_iter()
        .find(|s| s["kind"] == "mmap")
        .unwrap_or_else(|| panic!("no mapping site of recreate_pool\n{ctx}"));
    assert_eq!(stacks["threads"]["threads"], 4, "{ctx}");
    assert_eq!(stacks["threads"]["growing"], false, "{ctx}");
    assert!(u64_of(stacks, "mapped_bytes") >= 4 * (8 << 20), "{ctx}");
    let resident = u64_of(stacks, "resident_bytes");
    assert!(resident < 1 << 20, "the pool's stacks hold {resident} B resident\n{ctx}");
    for s in r.sites_of("recreate_pool") {
        assert_ne!(str_of(s, "class"), "leak", "the pool's threads are joined\n{ctx}");
    }
    let verdict = r.get(&["verdict"]);
    let summary = str_of(verdict, "summary");
    assert!(!["leak", "off-heap"].contains(&str_of(verdict, "class")), "{ctx}");
    assert!(!summary.contains("recreate_pool holds 32.0 MiB"), "the stacks' virtual size leads the verdict\n{ctx}");
    let md = std::fs::read_to_string(r.dir.join("report.md")).expect("report.md");
    assert!(!md.contains("recreate_pool: holds 32.0 MiB"), "report.md ranks the stacks by virtual size\n{ctx}");
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.is_empty(), "{leaks:?}\n{ctx}");
    eprintln!("pool: {threads} threads; stacks {resident} B resident; {summary}");
}

/// A thread leak is a leak, named as one. spawn_blocked() starts a thread every 500 ms for 12 s
/// that blocks forever and is never joined nor detached: its stacks are a leak of threads, "thread
/// stacks: N threads not joined", naming spawn_blocked (which calls pthread_create), with the
/// thread count close to the threads started; the verdict is a leak (not an off-heap mapping
/// judged by its 8 MiB virtual size per thread) and the scratch block freed every 10 ms is no leak.
#[test]
fn threads_never_joined_are_a_leak() {
    require_root();
    let (_out, r, ctx, threads) = record_kinds("thread-leak", "threadleak", 12);
    assert!(threads >= 20, "{threads} threads started\n{ctx}");
    let stacks = r
        .sites_of("spawn_blocked")
        .into_iter()
        .find(|s| s["kind"] == "mmap")
        .unwrap_or_else(|| panic!("no mapping site of spawn_blocked\n{ctx}"));
    assert_eq!(str_of(stacks, "class"), "leak", "{ctx}");
    assert_eq!(stacks["threads"]["growing"], true, "{ctx}");
    // Every thread's stack is still mapped (the first ones may have been started before the
    // probes saw their mmap: none here, the command is launched held).
    let counted = u64_of(&stacks["threads"], "threads");
    assert!(counted + 1 >= threads && counted <= threads, "{counted} stacks for {threads} threads\n{ctx}");
    // Growth is judged by resident bytes (a few pages a thread), not 16 MiB/s of mappings.
    let rate = f64_of(stacks, "growth_bytes_per_s");
    assert!(rate > 0.0 && rate < 1_000_000.0, "thread stacks grow {rate} B/s\n{ctx}");
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(summary.starts_with("leak: thread stacks: "), "{ctx}");
    assert!(summary.contains("threads not joined, created by spawn_blocked"), "{ctx}");
    for s in r.sites_of("scratch") {
        assert_ne!(str_of(s, "class"), "leak", "decoy scratch called a leak\n{ctx}");
    }
    eprintln!("thread leak: {threads} threads; {counted} stacks; {summary}");
}
