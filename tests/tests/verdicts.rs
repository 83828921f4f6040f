//! Verdicts that fooled leaktrace before, on real processes with known truth
//! (tests/fixtures/verdicts.c): a tiny leak under heavy churn, a leak seen as one burst and in
//! repeated bursts, shared memory (memfd, shm_open, SysV) and file-backed pages, a one-shot
//! leak from two call sites on one line (one at-exit entry), a mapped reservation ranked by its
//! resident bytes,
//! a bounded cache with constant eviction, compare against report, frees of blocks from before
//! attach. Arenas and allocator regions from before attach: verdicts_arenas.rs; threads:
//! verdicts_threads.rs.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use leaktrace_tests::*;

/// tests/fixtures/verdicts.c, compiled once (gcc -O1 -g -fno-omit-frame-pointer).
fn verdicts_fixture() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("verdicts-verdicts", |dir| {
            let bin = dir.join("verdicts");
            let o = Command::new("gcc")
                .args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o"])
                .arg(&bin)
                .arg(fixture_source("verdicts.c"))
                .output()
                .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
            assert!(o.status.success(), "compiling verdicts.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
        })
        .join("verdicts")
    })
}

/// Record `verdicts MODE SECONDS` launched under leaktrace (interval 250 ms) with `extra`
/// options; asserts it ran to its end and returns its report.
fn record_verdicts(name: &str, extra: &[&str], mode: &str, seconds: u32) -> (OutDir, Report, String) {
    let out = OutDir::new(name);
    let mut target = Command::new(verdicts_fixture());
    target.args([mode, &seconds.to_string()]);
    if mode == "filemap" {
        // Its file on disk: /tmp may be a tmpfs (whose pages are shared memory, not file-backed).
        target.env("TMPDIR", env!("CARGO_TARGET_TMPDIR"));
    }
    let o = record_launch(&out, extra, target);
    o.assert_success();
    assert!(
        o.stdout.contains(&format!("done {mode} {seconds}")),
        "verdicts {mode} did not run to its end\n{}",
        o.describe()
    );
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    (out, r, ctx)
}

/// Item 1: one malloc(40) a second never freed, under 200,000 malloc/free pairs a second, for
/// 20 s. client_info is a leak at 40 B/s ± 25 % (below the 64 B/s byte floor: decided on its
/// blocks, never freed and never falling); the churn and the ring of command names are not.
#[test]
fn tiny_leak_under_heavy_churn_is_a_leak() {
    require_root();
    let (_out, r, ctx) = record_verdicts("tiny-leak-churn", &[], "churn", 20);
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    assert!(str_of(verdict, "summary").contains("client_info"), "{ctx}");
    let leak = r.site("client_info");
    assert_eq!(str_of(leak, "class"), "leak", "{ctx}");
    let rate = f64_of(leak, "growth_bytes_per_s");
    assert_within("client_info growth (B/s)", rate, 40.0, 0.25, &ctx);
    assert_eq!(u64_of(leak, "frees"), 0, "{ctx}");
    assert_eq!(u64_of(leak, "live_bytes") % 40, 0, "{ctx}");
    for decoy in ["run_command", "client_list"] {
        for s in r.sites_of(decoy) {
            assert_ne!(str_of(s, "class"), "leak", "decoy {decoy} called a leak\n{ctx}");
        }
    }
    let leaks: Vec<&str> = r.leak_functions();
    assert_eq!(leaks, ["client_info"], "{ctx}");
    eprintln!("tiny leak: verdict {} ({}); client_info {rate:.1} B/s", verdict["class"], verdict["confidence"]);
}

/// Item 1 when the leak shares its stack: one request a second fails and returns without
/// freeing its 48-byte header, the other 50,000 a second free theirs — the same call stack
/// (parse_header ← handle_request). Below the byte floor and with frees at its site, it is
/// still a leak, on its blocks (one more live a second, never falling by more than a checkpoint
/// catches in flight): 48 B/s ± 25 %, and `check` on the same stack agrees (it failed while the
/// report said "temporary").
#[test]
fn leak_on_an_error_path_sharing_the_stack_is_a_leak() {
    require_root();
    let (_out, r, ctx) = record_verdicts("errpath", &[], "errpath", 20);
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    assert!(str_of(verdict, "summary").contains("parse_header"), "{ctx}");
    let leak = r.site("parse_header");
    assert_eq!(str_of(leak, "class"), "leak", "{ctx}");
    assert_within("parse_header growth (B/s)", f64_of(leak, "growth_bytes_per_s"), 48.0, 0.25, &ctx);
    assert!(u64_of(leak, "frees") > 100_000, "the normal path's frees are at the same site\n{ctx}");
    eprintln!("errpath: verdict {} ({})", verdict["class"], verdict["confidence"]);
}

/// Item 5 with blocks that live less than a checkpoint interval: the 4,000-value cache turned
/// over 5,000 times a second (each value lives 0.8 s) recorded at a 1 s interval is a cache at
/// 4,000 live blocks, not temporary.
#[test]
fn fast_evicting_cache_is_a_cache() {
    require_root();
    let out = OutDir::new("lru-fast");
    let mut lt = leaktrace(["record", "--interval", "1s", "--out"]);
    lt.arg(&out.path).arg("--").arg(verdicts_fixture()).args(["lru-fast", "15"]);
    let o = run(lt, None, TIMEOUT);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    let cache = r.site("lru_put");
    assert_eq!(str_of(cache, "class"), "cache", "{ctx}");
    assert_eq!(u64_of(cache, "live_allocations"), 4000, "{ctx}");
    assert_eq!(str_of(r.get(&["verdict"]), "class"), "cache", "{ctx}");
}

/// Item 2: 500 blocks of 64 B leaked at once at 1.5 s, nothing more in an 8 s run (one step
/// seen). The live bytes are exact (32,000 B) and the verdict is never a confident cache: a leak,
/// or inconclusive asking for at least two periods with a cache confidence ≤ 0.2.
#[test]
fn one_burst_is_never_a_confident_cache() {
    require_root();
    let (_out, r, ctx) = record_verdicts("burst-leak", &[], "burst", 8);
    let site = r.site("leak_batch");
    assert_eq!(u64_of(site, "live_bytes"), 32_000, "{ctx}");
    assert_eq!(u64_of(site, "live_allocations"), 500, "{ctx}");
    let verdict = r.get(&["verdict"]);
    match str_of(site, "class") {
        "leak" => assert_eq!(str_of(verdict, "class"), "leak", "{ctx}"),
        "cache" => {
            assert!(site["evidence"]["single_step"].as_bool().unwrap_or(false), "{ctx}");
            assert!(f64_of(site, "confidence") <= 0.2, "{ctx}");
            assert_eq!(verdict["inconclusive"], true, "{ctx}");
            let summary = str_of(verdict, "summary");
            assert!(summary.contains("record at least two periods") && summary.contains("leak_batch"), "{ctx}");
        }
        other => panic!("leak_batch called {other}\n{ctx}"),
    }
    eprintln!("burst: verdict {} ({}); leak_batch {}", verdict["class"], verdict["confidence"], site["class"]);
}

/// Item 10: bcc memleak's test program in miniature, one 30,000-byte allocation by leak_once()
/// of each of its eight kinds, kept until exit 300 ms later; and the same freed; recorded as the
/// issue ran it (`record --interval 200ms`). The run is too short to
/// classify, every time ("inconclusive: too short to classify", not a coin-flip class), and the
/// list of what was still allocated at exit holds exactly leak_once's 30,000 B in 1 block (kept)
/// or nothing (freed): stdio's buffer and the loader's and libc's one-time allocations are left
/// out. malloc and the freed variant are recorded three times each.
#[test]
fn one_shot_command_is_too_short_and_lists_what_it_held_at_exit() {
    require_root();
    let kinds = ["malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign", "valloc", "pvalloc"];
    let runs = kinds
        .iter()
        .map(|k| ("oneshot", *k))
        .chain([("oneshot", "malloc"), ("oneshot", "malloc")])
        .chain([("oneshot-free", "malloc"); 3]);
    for (n, (mode, kind)) in runs.enumerate() {
        let out = OutDir::new(&format!("oneshot-{n}-{mode}-{kind}"));
        let mut lt = leaktrace(["record", "--interval", "200ms", "--out"]);
        lt.arg(&out.path).arg("--").arg(verdicts_fixture()).args([mode, kind]);
        let o = run(lt, None, TIMEOUT);
        o.assert_success();
        assert!(o.stdout.contains(&format!("done {mode} {kind}")), "{}", o.describe());
        let r = Report::load(&out.path);
        let ctx =
            format!("{mode} {kind}: report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
        let verdict = r.get(&["verdict"]);
        assert_eq!(verdict["inconclusive"], true, "{ctx}");
        assert!(str_of(verdict, "summary").starts_with("inconclusive: too short to classify"), "{ctx}");
        let at_exit = r.get(&["still_allocated_at_exit"]);
        let sites = at_exit["sites"].as_array().unwrap_or_else(|| panic!("no still_allocated_at_exit\n{ctx}"));
        if mode == "oneshot" {
            assert_eq!(sites.len(), 1, "only leak_once's block\n{ctx}");
            assert!(same_function(str_of(&sites[0], "function"), "leak_once"), "{ctx}");
            assert_eq!(u64_of(&sites[0], "live_bytes"), 30_000, "{ctx}");
            assert_eq!(u64_of(&sites[0], "live_allocations"), 1, "{ctx}");
            assert_eq!(u64_of(at_exit, "live_bytes"), 30_000, "{ctx}");
        } else {
            assert!(sites.is_empty(), "nothing held at exit\n{ctx}");
            assert!(str_of(verdict, "summary").contains("nothing was still allocated"), "{ctx}");
        }
        assert!(u64_of(at_exit, "one_time_sites") >= 1, "stdio's buffer at least\n{ctx}");
        eprintln!("{mode} {kind}: {}", str_of(verdict, "summary"));
    }
}

/// A one-shot command whose leak comes from two malloc calls on one line (leak_pair: two return
/// addresses, the same function, file and line; 3 blocks of 1,000 B each): "still allocated at
/// exit" lists it once, 6,000 B in 6 blocks, folding the other stack in (folded_ids), in
/// report.json and report.md. The decoy, leak_apart's two calls on two lines (500 B each), stays
/// two entries.
#[test]
fn at_exit_list_merges_call_sites_on_one_line() {
    require_root();
    let out = OutDir::new("oneshot-pair");
    let mut target = Command::new(verdicts_fixture());
    target.args(["pair", "0"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    assert!(o.stdout.contains("done pair 0"), "{}", o.describe());
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    let at_exit = r.get(&["still_allocated_at_exit"]);
    let sites = at_exit["sites"].as_array().unwrap_or_else(|| panic!("no still_allocated_at_exit\n{ctx}"));
    let of = |f: &str| -> Vec<&Value> { sites.iter().filter(|s| same_function(str_of(s, "function"), f)).collect() };
    let pair = of("leak_pair");
    assert_eq!(pair.len(), 1, "leak_pair's two call sites are one entry: {pair:?}\n{ctx}");
    assert_eq!((u64_of(pair[0], "live_bytes"), u64_of(pair[0], "live_allocations")), (6000, 6), "{ctx}");
    assert_eq!(pair[0]["folded_ids"].as_array().map(Vec::len), Some(1), "{ctx}");
    let apart = of("leak_apart");
    assert_eq!(apart.len(), 2, "leak_apart's two lines stay apart: {apart:?}\n{ctx}");
    assert!(apart.iter().all(|s| u64_of(s, "live_bytes") == 500 && u64_of(s, "live_allocations") == 1), "{ctx}");
    let md = std::fs::read_to_string(out.path.join("report.md")).expect("report.md");
    assert!(
        md.lines().any(|l| l.starts_with("- 5.9 KiB in 6 block(s) from leak_pair")
            && l.ends_with("(2 stacks with these frames at other return addresses):")),
        "{ctx}\n{md}"
    );
}

/// "Sites by live bytes" ranks a mapping by its resident bytes: reserve_arena's 64 MiB mapping,
/// of which 64 KiB is touched, does not top report.json's sites nor report.md's table over
/// load_table's 2 MiB malloc'd and filled; its resident bytes (64 KiB, + 16 KiB for pages the
/// kernel faults around) and mapped bytes (64 MiB) are both in report.json, and the table says
/// "resident" and "mapped".
#[test]
fn mapped_reservation_does_not_top_the_sites_by_live_bytes() {
    require_root();
    let out = OutDir::new("reserve");
    let mut target = Command::new(verdicts_fixture());
    target.args(["reserve", "30"]);
    let o = record_launch(&out, &["--duration", "3s"], target);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    let arena = r.site("reserve_arena");
    assert_eq!(u64_of(arena, "mapped_bytes"), 64 << 20, "{ctx}");
    let resident = u64_of(arena, "resident_bytes");
    assert!((64 << 10..=80 << 10).contains(&resident), "reserve_arena resident {resident} B\n{ctx}");
    assert!(same_function(str_of(&r.sites()[0], "function"), "load_table"), "sites[0]\n{ctx}");
    let at = |f: &str| r.sites().iter().position(|s| same_function(str_of(s, "function"), f)).unwrap();
    assert!(at("load_table") < at("reserve_arena"), "{ctx}");
    let md = std::fs::read_to_string(out.path.join("report.md")).expect("report.md");
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| #")).collect();
    let row = |f: &str| rows.iter().position(|l| l.contains(&format!("| {f}"))).unwrap_or_else(|| panic!("{f}\n{md}"));
    assert!(row("load_table") < row("reserve_arena"), "{md}");
    assert!(rows[row("reserve_arena")].contains("| resident "), "{md}");
    assert!(rows[row("reserve_arena")].contains(", mapped 64.0 MiB |"), "{md}");
}

/// Item 3: shared memory. 50 frames a second for 10 s; every 4th frame's 64 KiB MAP_SHARED
/// memfd mapping is never unmapped (819,200 B/s). submit_frame is found as a leaking mapping
/// site at 819,200 B/s ± 10 %, the verdict is not "temporary" and names it, and the report
/// splits RSS by kind (RssShmem grows, RssAnon does not). Decoys: the accepted frames, the 1 MiB
/// ring mapped once, the staging buffer.
#[test]
fn shared_memory_leak_is_found() {
    require_root();
    let (_out, r, ctx) = record_verdicts("shm-leak", &[], "shm", 10);
    let verdict = r.get(&["verdict"]);
    assert_ne!(str_of(verdict, "class"), "temporary", "{ctx}");
    assert!(str_of(verdict, "summary").contains("submit_frame"), "{ctx}");
    let leak =
        r.sites_of("submit_frame").into_iter().find(|s| s["kind"] == "mmap").expect("an mmap site of submit_frame");
    assert_eq!(str_of(leak, "class"), "leak", "{ctx}");
    let rate = f64_of(leak, "growth_bytes_per_s");
    assert_within("submit_frame mapped growth (B/s)", rate, 819_200.0, 0.10, &ctx);
    for s in r.sites_of("map_ring") {
        assert_ne!(str_of(s, "class"), "leak", "the ring is mapped once\n{ctx}");
    }
    for s in r.sites_of("submit_frame").into_iter().filter(|s| s["kind"] == "malloc") {
        assert_ne!(str_of(s, "class"), "leak", "the staging buffer is freed\n{ctx}");
    }
    let shmem = r.get(&["memory", "rss_shmem_bytes"]).as_array().expect("memory.rss_shmem_bytes");
    let (first, last) = (
        shmem.first().expect("points")[1].as_u64().unwrap_or(0),
        shmem.last().expect("points")[1].as_u64().unwrap_or(0),
    );
    assert!(last > first + 4 * 819_200, "RssShmem {first} → {last}\n{ctx}");
    let md = std::fs::read_to_string(r.dir.join("report.md")).expect("report.md");
    assert!(md.contains("- RSS by kind: anon "), "{ctx}");
    eprintln!(
        "shm: verdict {} ({}); submit_frame {rate:.0} B/s; RssShmem {first} → {last}",
        verdict["class"], verdict["confidence"]
    );
}

/// First and last values of report.json's memory series `key` (`memory.rss_shmem_bytes`, …).
fn series_ends(r: &Report, key: &str) -> (u64, u64) {
    let pts = r.get(&["memory", key]).as_array().unwrap_or_else(|| panic!("memory.{key}"));
    let at = |p: Option<&Value>| p.and_then(|p| p[1].as_u64()).unwrap_or_else(|| panic!("memory.{key} is empty"));
    (at(pts.first()), at(pts.last()))
}

/// Item 3 through POSIX shared memory: shm's leak made with shm_open + ftruncate +
/// mmap(MAP_SHARED) (50 segments a second for 10 s, every 4th one's 64 KiB mapping never
/// unmapped: 819,200 B/s). publish_segment is a leaking mapping site at 819,200 B/s ± 10 %, the
/// verdict names it and is not "temporary", RssShmem grows by at least 4 s of the leak while
/// RssAnon stays flat (under 512 KiB more: the staging buffer is freed at once).
#[test]
fn posix_shared_memory_leak_is_found() {
    require_root();
    let (_out, r, ctx) = record_verdicts("shm-open-leak", &[], "shmopen", 10);
    let verdict = r.get(&["verdict"]);
    assert_ne!(str_of(verdict, "class"), "temporary", "{ctx}");
    assert!(str_of(verdict, "summary").contains("publish_segment"), "{ctx}");
    let leak = r
        .sites_of("publish_segment")
        .into_iter()
        .find(|s| s["kind"] == "mmap")
        .unwrap_or_else(|| panic!("no mmap site of publish_segment\n{ctx}"));
    assert_eq!(str_of(leak, "class"), "leak", "{ctx}");
    let rate = f64_of(leak, "growth_bytes_per_s");
    assert_within("publish_segment mapped growth (B/s)", rate, 819_200.0, 0.10, &ctx);
    for s in r.sites_of("publish_segment").into_iter().filter(|s| s["kind"] == "malloc") {
        assert_ne!(str_of(s, "class"), "leak", "the staging buffer is freed\n{ctx}");
    }
    let (shm0, shm1) = series_ends(&r, "rss_shmem_bytes");
    assert!(shm1 > shm0 + 4 * 819_200, "RssShmem {shm0} → {shm1}\n{ctx}");
    let (anon0, anon1) = series_ends(&r, "rss_anon_bytes");
    assert!(anon1 < anon0 + (512 << 10), "RssAnon {anon0} → {anon1}\n{ctx}");
    eprintln!(
        "shm_open: verdict {} ({}); publish_segment {rate:.0} B/s; RssShmem {shm0} → {shm1}; RssAnon {anon0} → {anon1}",
        verdict["class"], verdict["confidence"]
    );
}

/// Item 3, "RSS grows, nothing traced grows": a 64 MiB SysV segment (shmget/shmat: shmat is not
/// mmap, so no traced call maps it) of which 200 new pages are touched a second for 10 s
/// (819,200 B/s of RssShmem, RssAnon flat), while a 256 B block is malloc'd and freed every
/// 20 ms. The verdict says RSS grows and names shared memory (RssShmem) at 819,200 B/s ± 10 %,
/// as the unit test `untraced_shared_memory_growth_is_named` does; it is off-heap, never "no
/// leak", flat, temporary or a cache, and no site is called a leak (nothing traced leaks).
#[test]
fn untraced_shared_memory_growth_is_named() {
    require_root();
    let (_out, r, ctx) = record_verdicts("sysv-shm", &[], "sysv", 10);
    let verdict = r.get(&["verdict"]);
    let summary = str_of(verdict, "summary");
    assert_eq!(str_of(verdict, "class"), "off-heap", "{ctx}");
    assert!(summary.starts_with("RSS grows and nothing traced explains it: shared memory (RssShmem) grows"), "{ctx}");
    assert!(!summary.starts_with("no leak"), "{ctx}");
    let rate = summary_rate(summary, "(RssShmem) grows").unwrap_or_else(|| panic!("no rate in the summary\n{ctx}"));
    assert_within("RssShmem growth in the verdict (B/s)", rate, 819_200.0, 0.10, &ctx);
    let (shm0, shm1) = series_ends(&r, "rss_shmem_bytes");
    assert!(shm1 > shm0 + 4 * 819_200, "RssShmem {shm0} → {shm1}\n{ctx}");
    let (anon0, anon1) = series_ends(&r, "rss_anon_bytes");
    assert!(anon1 < anon0 + (512 << 10), "RssAnon {anon0} → {anon1}\n{ctx}");
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.is_empty(), "{leaks:?}\n{ctx}");
    eprintln!("sysv: {summary}");
}

/// Item 3, file-backed pages: map_file() maps a 64 MiB file on disk MAP_SHARED before the loop
/// (a traced mapping site, mapped once), and 200 new pages of it are written a second for 10 s
/// (819,200 B/s of RssFile; RssAnon and RssShmem flat). The verdict says RSS grows through
/// file-backed memory (RssFile) at 819,200 B/s ± 10 % and names map_file as the traced mapping
/// site holding the pages; off-heap, never "no leak", flat, temporary or a cache.
#[test]
fn file_backed_rss_growth_is_named() {
    require_root();
    let (_out, r, ctx) = record_verdicts("filemap", &[], "filemap", 10);
    let verdict = r.get(&["verdict"]);
    let summary = str_of(verdict, "summary");
    assert_eq!(str_of(verdict, "class"), "off-heap", "{ctx}");
    assert!(
        summary.starts_with("RSS grows and nothing traced explains it: file-backed memory (RssFile) grows"),
        "{ctx}"
    );
    assert!(
        summary.contains("the pages are in mappings made at map_file (a traced mapping site: 64.0 MiB mapped"),
        "{ctx}"
    );
    let rate = summary_rate(summary, "(RssFile) grows").unwrap_or_else(|| panic!("no rate in the summary\n{ctx}"));
    assert_within("RssFile growth in the verdict (B/s)", rate, 819_200.0, 0.10, &ctx);
    let (file0, file1) = series_ends(&r, "rss_file_bytes");
    assert!(file1 > file0 + 4 * 819_200, "RssFile {file0} → {file1}\n{ctx}");
    for key in ["rss_anon_bytes", "rss_shmem_bytes"] {
        let (a, b) = series_ends(&r, key);
        assert!(b < a + (512 << 10), "{key} {a} → {b}\n{ctx}");
    }
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.is_empty(), "{leaks:?}\n{ctx}");
    eprintln!("filemap: {summary}");
}

/// Item 2, repeated bursts: leak_batch() leaks 500 blocks of 64 B at 1.5 s and every 3 s after
/// (4 bursts in a 13 s run, never freed, flat in between: 10,667 B/s on average). It is a leak
/// at 10,667 B/s ± 25 % with at least 2 steps in its evidence, never freed, holding a whole
/// number of bursts; the verdict is a leak naming it, and the working block freed every 100 ms
/// is no leak.
#[test]
fn leak_in_bursts_is_a_leak() {
    require_root();
    let (_out, r, ctx) = record_verdicts("bursts-leak", &[], "bursts", 13);
    let site = r.site("leak_batch");
    assert_eq!(str_of(site, "class"), "leak", "{ctx}");
    let steps = site["evidence"]["steps"].as_u64().unwrap_or(0);
    assert!(steps >= 2, "{steps} step(s)\n{ctx}");
    let rate = f64_of(site, "growth_bytes_per_s");
    assert_within("leak_batch growth (B/s)", rate, 32_000.0 / 3.0, 0.25, &ctx);
    assert_eq!(u64_of(site, "frees"), 0, "{ctx}");
    let live = u64_of(site, "live_bytes");
    assert!(live.is_multiple_of(32_000) && live >= 3 * 32_000, "leak_batch holds {live} B\n{ctx}");
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    assert!(str_of(verdict, "summary").contains("leak_batch"), "{ctx}");
    let leaks: Vec<&str> = r.leak_functions();
    assert_eq!(leaks, ["leak_batch"], "{ctx}");
    eprintln!("bursts: {steps} steps; leak_batch {rate:.0} B/s, {live} B; {}", str_of(verdict, "summary"));
}

/// tests/fixtures/teardown.cpp, compiled once (g++ -O2 -fomit-frame-pointer: no frame pointers).
fn teardown_fixture() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("verdicts-teardown", |dir| {
            let bin = dir.join("teardown");
            let o = Command::new("g++")
                .args(["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-o"])
                .arg(&bin)
                .arg(fixture_source("teardown.cpp"))
                .output()
                .unwrap_or_else(|e| panic!("cannot run g++: {e}"));
            assert!(o.status.success(), "compiling teardown.cpp failed:\n{}", String::from_utf8_lossy(&o.stderr));
        })
        .join("teardown")
    })
}

/// Item A: a leak that a C++ static destructor frees inside exit(). remember_request() keeps a
/// 512-byte block every 100 ms in a global std::vector that the program never prunes; the
/// vector's destructor frees them all when main returns. Judged on the checkpoints up to the
/// teardown (caught at libc's exit), it is a leak at 5,120 B/s ± 25 %, and the report says the
/// teardown freed its blocks; the 4 KiB scratch buffer (malloc/free every 10 ms) is not a leak.
#[test]
fn leak_freed_by_a_static_destructor_is_a_leak() {
    require_root();
    let out = OutDir::new("teardown-cxx");
    let mut target = Command::new(teardown_fixture());
    target.arg("10");
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let kept: u64 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("done teardown 10 "))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("teardown did not run to its end\n{}", o.describe()));
    assert_eq!(kept, 100, "{}", o.describe());
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(summary.contains("remember_request"), "{ctx}");
    assert!(summary.contains("released only at exit"), "{ctx}");
    let leak = r.site("remember_request");
    assert_eq!(str_of(leak, "class"), "leak", "{ctx}");
    assert_within("remember_request growth (B/s)", f64_of(leak, "growth_bytes_per_s"), 5120.0, 0.25, &ctx);
    // Its blocks were live at the teardown and freed by it; nothing of it is left after exit.
    assert_eq!(u64_of(leak, "live_bytes") % 512, 0, "{ctx}");
    assert!(u64_of(leak, "live_bytes") >= 90 * 512, "{ctx}");
    let freed = r.get(&["freed_at_exit"]);
    let mine = freed["sites"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["function"].as_str().is_some_and(|f| f.contains("remember_request"))))
        .unwrap_or_else(|| panic!("remember_request not in freed_at_exit\n{ctx}"));
    assert_eq!(u64_of(mine, "bytes"), u64_of(leak, "live_bytes"), "{ctx}");
    assert_eq!(u64_of(mine, "blocks"), u64_of(mine, "bytes") / 512, "{ctx}");
    let left = r.get(&["still_allocated_at_exit", "sites"]).as_array().cloned().unwrap_or_default();
    assert!(!left.iter().any(|s| s["function"].as_str().is_some_and(|f| f.contains("remember_request"))), "{ctx}");
    // The decoy is traced (1,000 malloc/free pairs, none live) and not called a leak.
    let scratch = totals_where(&out.path, |frames| {
        frames.iter().any(|f| f["function"].as_str().is_some_and(|n| n.contains("scratch_buffer")))
    });
    assert!(scratch.alloc_count >= 900 && scratch.alloc_count == scratch.free_count, "{scratch:?}\n{ctx}");
    for s in r.sites_of("scratch_buffer") {
        assert_ne!(str_of(s, "class"), "leak", "decoy scratch_buffer called a leak\n{ctx}");
    }
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.iter().all(|f| f.contains("remember_request")), "{leaks:?}\n{ctx}");
}

/// Item 5: a bounded cache with constant eviction. lru_put() fills a cache of 4,000 values of
/// 1,125 B (4.5 MB) in 4 s and then evicts the oldest on every insert (1,000 a second, each value
/// lives 4 s: a turnover far above the temporary threshold), for 20 s. Its site is a cache at
/// 4,000 live blocks, not temporary and not a leak, and the verdict names lru_put, not the 1 MiB
/// pool allocated once at start.
#[test]
fn bounded_cache_with_constant_eviction_is_a_cache() {
    require_root();
    let (_out, r, ctx) = record_verdicts("lru-cache", &[], "lru", 20);
    let cache = r.site("lru_put");
    assert_eq!(str_of(cache, "class"), "cache", "{ctx}");
    assert_eq!(u64_of(cache, "live_allocations"), 4000, "{ctx}");
    assert_eq!(u64_of(cache, "live_bytes"), 4000 * 1125, "{ctx}");
    assert!(u64_of(cache, "frees") >= 10_000, "the cache turns over\n{ctx}");
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "cache", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(summary.contains("lru_put"), "{ctx}");
    assert!(!summary.contains("make_pool"), "{ctx}");
    for s in r.sites_of("make_pool") {
        assert_ne!(str_of(s, "class"), "leak", "the pool is allocated once\n{ctx}");
    }
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.is_empty(), "{leaks:?}\n{ctx}");
    eprintln!(
        "lru: verdict {} ({}); lru_put {} B in {} blocks, turnover {}",
        verdict["class"],
        verdict["confidence"],
        cache["live_bytes"],
        cache["live_allocations"],
        cache["evidence"]["turnover"]
    );
}

/// Item 8: `compare` agrees with `report`. `service` and `service-fixed` (36 s each) share a
/// cache of 4,000 values filled at 150 a second (27 s) and then evicting: a cache in both reports,
/// still filling in the first half of compare's window (18-36 s), where its fit alone is
/// significant growth of tens of KB/s; and a
/// pending queue of 0-16 blocks of 256 B that random-walks (tens of B/s either way); `service`
/// leaks 100 sessions of 100 B a second in remember_session (10,000 B/s), `service-fixed` frees
/// them. compare: remember_session is fixed (10,000 B/s ± 15 % before); lru_put, a cache in both
/// reports, is not still leaking, nor is the total it makes grow; the queue's noise-level
/// difference fails nothing: PASS.
#[test]
fn compare_agrees_with_report() {
    require_root();
    let (before, rb, ctx_b) = record_verdicts("service-leaky", &[], "service", 36);
    let (after, ra, ctx_a) = record_verdicts("service-fixed", &[], "service-fixed", 36);
    for (r, ctx) in [(&rb, &ctx_b), (&ra, &ctx_a)] {
        assert_eq!(str_of(r.site("lru_put"), "class"), "cache", "{ctx}");
        for s in r.sites_of("queue_step") {
            assert_ne!(str_of(s, "class"), "leak", "the pending queue is bounded\n{ctx}");
        }
    }
    let leak = rb.site("remember_session");
    assert_eq!(str_of(leak, "class"), "leak", "{ctx_b}");
    assert_within("remember_session growth (B/s)", f64_of(leak, "growth_bytes_per_s"), 10_000.0, 0.15, &ctx_b);
    for s in ra.sites_of("remember_session") {
        assert_ne!(str_of(s, "class"), "leak", "fixed\n{ctx_a}");
    }

    let cmp_out = OutDir::new("compare-service");
    let mut cmd = leaktrace(["compare"]);
    cmd.arg(&before.path).arg(&after.path).arg("--out").arg(&cmp_out.path);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    let c: Value = serde_json::from_str(&std::fs::read_to_string(cmp_out.file("compare.json")).unwrap()).unwrap();
    let ctx = format!("compare stdout:\n{}\ncompare.json: {c}", o.stdout);
    let matched = |f: &str| -> Vec<&Value> {
        c["matched"].as_array().map(|m| m.iter().filter(|s| s["function"] == f).collect()).unwrap_or_default()
    };
    let session = matched("remember_session");
    assert_eq!(session.len(), 1, "{ctx}");
    assert_eq!(session[0]["status"], "fixed", "{ctx}");
    assert_within("remember_session before (B/s)", f64_of(&session[0]["before"], "slope"), 10_000.0, 0.15, &ctx);
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("leak in remember_session:"))
        .unwrap_or_else(|| panic!("no verdict line for remember_session\n{ctx}"));
    assert!(line.ends_with("— fixed"), "{line}\n{ctx}");
    let cache = matched("lru_put");
    assert!(!cache.is_empty(), "{ctx}");
    for s in &cache {
        assert_ne!(s["status"], "still-leaking", "{ctx}");
        assert_ne!(s["status"], "new-leak", "{ctx}");
    }
    assert!(!o.stdout.lines().any(|l| l.contains("lru_put") && l.contains("still leaking")), "{ctx}");
    // The fit alone calls the filling cache growth (else this would test nothing): the report's
    // class decides, for the site and for the total it makes grow.
    assert!(
        cache.iter().any(|s| s["after"]["significant"] == true && s["after"]["not_a_leak_in_report"] == true),
        "{ctx}"
    );
    assert_eq!(c["after"]["overall"]["leak"], false, "{ctx}");
    let mut queue_diff = 0.0;
    for s in matched("queue_step") {
        assert_eq!(s["status"], "no-leak", "{ctx}");
        queue_diff = f64_of(s, "change");
        assert!(queue_diff.abs() < 500.0, "the queue is noise: {queue_diff} B/s\n{ctx}");
    }
    assert_eq!(c["after_flat"], true, "{ctx}");
    assert!(o.stdout.contains("PASS — after: flat"), "{ctx}");
    eprintln!(
        "compare: remember_session {} → {} B/s; lru_put {:?}; queue change {queue_diff:.0} B/s; {}",
        session[0]["before"]["slope"],
        session[0]["after"]["slope"],
        cache
            .iter()
            .map(|s| format!("{} before {} after {}", s["status"], s["before"], s["after"]))
            .collect::<Vec<_>>(),
        str_of(&c, "conclusion")
    );
}

/// Item 11: memory allocated before attach. preattach keeps 40,000 blocks of 256 B allocated
/// before leaktrace attaches to it and frees 500 a second of them after: the frees of blocks
/// allocated before attach are counted (untracked_free), and report.md's account of the memory
/// outside what was traced names those blocks with the count instead of calling the rest memory
/// the allocator keeps free.
#[test]
fn frees_of_blocks_from_before_attach_are_named() {
    require_root();
    let mut cmd = Command::new(verdicts_fixture());
    cmd.args(["preattach", "120"]);
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    assert_eq!(target.next_line(std::time::Duration::from_secs(30)).as_deref(), Some("ready"));
    let out = OutDir::new("preattach");
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--duration", "8s", "--interval", "500ms"]);
    lt.arg("--out").arg(&out.path);
    let o = run(lt, None, TIMEOUT);
    o.assert_success();
    let r = Report::load(&out.path);
    let md = std::fs::read_to_string(r.dir.join("report.md")).expect("report.md");
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    let untracked = r.get(&["events", "untracked_free"]).as_u64().unwrap_or(0);
    // 500 a second for 8 s, less the time to attach; at most all 39,000 that are ever freed.
    assert!((1000..=39_000).contains(&untracked), "untracked_free {untracked}\n{ctx}");
    let line = md
        .lines()
        .find(|l| l.starts_with("- Memory outside what was traced"))
        .unwrap_or_else(|| panic!("no line on memory outside what was traced\n{md}\n{ctx}"));
    assert!(
        line.contains(&format!(
            "blocks allocated before attach and still live ({untracked} frees of such blocks were seen)"
        )),
        "{line}\n{ctx}"
    );
    assert!(line.contains("in unknown shares"), "{line}\n{ctx}");
    assert!(!md.contains("keeps free"), "{line}\n{ctx}");
    eprintln!("preattach: {untracked} frees of pre-attach blocks; {line}");
}

/// Item 5, the reported shape: a CPython `functools.lru_cache(maxsize=4000)` whose every call
/// misses (tests/fixtures/lru_cache.py, case 17-py-lru-cache-plateau of ../shared/cases), at 400
/// calls a second for 30 s: full after 10 s, then every miss evicts. render's 1,057-byte values
/// are a cache of 4,000 blocks (4,228,000 B), the verdict is a cache naming render, not one of
/// pymalloc's 1 MiB arenas, and nothing is a leak.
#[test]
fn python_lru_cache_with_eviction_is_a_cache() {
    require_root();
    let out = OutDir::new("py-lru-cache");
    let mut target = Command::new(python());
    target.arg("-u").arg(fixture_source("lru_cache.py")).env("RATE", "400").env("DURATION", "30");
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    // A Python frame's site is named "render (lru_cache.py:LINE)".
    let cache = r
        .sites()
        .iter()
        .find(|s| s["function"].as_str().is_some_and(|f| f.starts_with("render (lru_cache.py:")))
        .unwrap_or_else(|| panic!("no site of render\n{ctx}"));
    assert_eq!(str_of(cache, "class"), "cache", "{ctx}");
    assert_eq!(u64_of(cache, "live_allocations"), 4000, "{ctx}");
    assert_eq!(u64_of(cache, "live_bytes"), 4000 * 1057, "{ctx}");
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "cache", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(summary.contains("largest: render (lru_cache.py:"), "{ctx}");
    assert!(!summary.contains("_PyObject_ArenaMmap"), "{ctx}");
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.is_empty(), "{leaks:?}\n{ctx}");
    eprintln!("py lru_cache: {summary}");
}
