//! Growth analysis on workloads whose truth is known (tests/fixtures/growth.c): a leak measured
//! per unit of work next to a bounded cache, a cache that warms up and levels off, glibc
//! fragmentation (RSS grows while live bytes do not), and off-heap mappings never unmapped
//! (through libc's mmap and through a raw syscall), each with its decoys.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use leaktrace_tests::*;

/// Bytes leak_message leaks per call of handle_message.
const LEAK_UNIT_BYTES: f64 = 1200.0;
const CACHE_ENTRY_BYTES: u64 = 1024;
/// Blocks and block size of one fragmentation round (fill_arena).
const FRAG_BLOCKS: u64 = 4096;
const FRAG_BLOCK_BYTES: u64 = 100;
const MAP_LEAK_LIBC_BYTES: f64 = 16384.0;
const MAP_LEAK_RAW_BYTES: f64 = 8192.0;
const MAP_SCRATCH_BYTES: u64 = 16384;
const STATIC_REGIONS_BYTES: u64 = 8 << 20;

/// tests/fixtures/growth.c, compiled once (gcc -O1 -g -fno-omit-frame-pointer -pthread).
fn growth_fixture() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("growth-growth", |dir| {
            let bin = dir.join("growth");
            let o = Command::new("gcc")
                .args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-pthread", "-o"])
                .arg(&bin)
                .arg(fixture_source("growth.c"))
                .output()
                .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
            assert!(o.status.success(), "compiling growth.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
        })
        .join("growth")
    })
}

/// Record `growth ARGS...` launched under leaktrace (interval 250 ms) with `extra` options;
/// asserts it ran to its end and returns its report.
fn record_growth(name: &str, extra: &[&str], args: &[&str]) -> (OutDir, Report, String) {
    let out = OutDir::new(name);
    let mut target = Command::new(growth_fixture());
    target.args(args);
    let o = record_launch(&out, extra, target);
    o.assert_success();
    assert!(
        o.stdout.contains(&format!("done {} {}", args[0], args[1])),
        "growth {} did not run to its end\n{}",
        args.join(" "),
        o.describe()
    );
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    (out, r, ctx)
}

fn no_site_is_a_leak(r: &Report, ctx: &str) {
    let leaks: Vec<&str> = r.leak_functions();
    assert!(leaks.is_empty(), "sites called a leak: {leaks:?}\n{ctx}");
}

/// 200 calls of handle_message a second for 7 s: leak_message leaks 1200 B per call, cache_store
/// fills a 600-slot cache of 1 KiB entries in 3 s and then evicts. Growth per unit of work is
/// the leak's 1200 B per call; the cache is a cache.
#[test]
fn leak_per_unit_of_work_next_to_a_bounded_cache() {
    require_root();
    const CALLS: u64 = 1400;
    const SLOTS: u64 = 600;
    let (out, r, ctx) =
        record_growth("leak-cache", &["--work-probe", "handle_message"], &["leak-cache", "1400", "200", "600"]);

    assert_eq!(r.get(&["work_probe"]), "handle_message", "{ctx}");
    assert_eq!(r.get(&["units_of_work"]).as_u64(), Some(CALLS), "every call counted\n{ctx}");
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    assert!(str_of(verdict, "summary").contains("leak_message"), "{ctx}");
    assert!(str_of(verdict, "summary").contains("per call of handle_message"), "{ctx}");

    let leak = r.site("leak_message");
    assert_eq!(str_of(leak, "class"), "leak", "{ctx}");
    assert_eq!(str_of(leak, "kind"), "malloc", "{ctx}");
    assert_eq!(u64_of(leak, "live_bytes"), CALLS * LEAK_UNIT_BYTES as u64, "{ctx}");
    let per_unit = f64_of(leak, "growth_bytes_per_unit");
    assert_within("leak_message growth_bytes_per_unit", per_unit, LEAK_UNIT_BYTES, 0.10, &ctx);
    assert_within(
        "leak_message growth_bytes_per_s",
        f64_of(leak, "growth_bytes_per_s"),
        LEAK_UNIT_BYTES * 200.0,
        0.10,
        &ctx,
    );
    assert_culprit_frames(leak, "leak_message", "growth.c", &["handle_message", "run_messages", "main"], &ctx);

    let cache = r.site("cache_store");
    assert_eq!(str_of(cache, "class"), "cache", "a cache that filled and then evicts\n{ctx}");
    assert_eq!(u64_of(cache, "live_bytes"), SLOTS * CACHE_ENTRY_BYTES, "{ctx}");
    assert!(
        f64_of(cache, "growth_bytes_per_unit").abs() < 0.05 * LEAK_UNIT_BYTES,
        "the full cache does not grow per call\n{ctx}"
    );
    if let Some(s) = r.sites_of("scratch").first() {
        assert_ne!(str_of(s, "class"), "leak", "{ctx}");
    }

    // The process: the leak alone grows per unit of work.
    let summary = r.get(&["summary"]);
    assert_within(
        "summary.growth_bytes_per_unit",
        f64_of(summary, "growth_bytes_per_unit"),
        LEAK_UNIT_BYTES,
        0.10,
        &ctx,
    );
    assert_within(
        "summary.native_growth_bytes_per_unit",
        f64_of(summary, "native_growth_bytes_per_unit"),
        LEAK_UNIT_BYTES,
        0.10,
        &ctx,
    );
    let ratio = f64_of(summary, "occupied_heap_to_rss_ratio");
    assert!(ratio > 0.0 && ratio < 1.5, "occupied_heap_to_rss_ratio {ratio}\n{ctx}");

    eprintln!(
        "leak-cache: verdict {} ({}); leak_message {per_unit:.1} B/unit, {:.0} B/s; cache_store {}, {} B; occupied heap to RSS {ratio}",
        verdict["class"],
        verdict["confidence"],
        f64_of(leak, "growth_bytes_per_s"),
        cache["class"],
        cache["live_bytes"]
    );
    let md = std::fs::read_to_string(out.file("report.md")).unwrap();
    let verdict_line = md.lines().find(|l| l.starts_with("**Verdict")).unwrap_or("");
    assert!(verdict_line.starts_with("**Verdict: leak**") && !verdict_line.contains("— leak:"), "{verdict_line}");
    assert!(verdict_line.contains("B more live bytes per call of handle_message"), "{verdict_line}");
    assert!(md.contains("traced live bytes +") && md.contains(" B per call of handle_message"), "{md}");
}

/// A cache that warms up for 3 s (600 entries at 200 calls/s) and then stays full for 5 s while
/// it keeps evicting: not a leak.
#[test]
fn cache_that_levels_off_is_not_a_leak() {
    require_root();
    let (_out, r, ctx) = record_growth("cache-plateau", &[], &["cache", "1600", "200", "600"]);
    let verdict = r.get(&["verdict"]);
    assert_ne!(str_of(verdict, "class"), "leak", "{ctx}");
    assert_eq!(str_of(verdict, "class"), "cache", "{ctx}");
    assert!(str_of(verdict, "summary").contains("cache_store"), "{ctx}");
    let cache = r.site("cache_store");
    assert_eq!(str_of(cache, "class"), "cache", "{ctx}");
    assert_eq!(u64_of(cache, "live_bytes"), 600 * CACHE_ENTRY_BYTES, "{ctx}");
    no_site_is_a_leak(&r, &ctx);
    eprintln!(
        "cache: verdict {} ({}); cache_store {}, {} B",
        verdict["class"], verdict["confidence"], cache["class"], cache["live_bytes"]
    );
}

/// glibc fragmentation: 40 rounds at 4 a second, each filling a fresh thread arena with 4096
/// blocks of 100 B (fastbin chunks: freed, never coalesced or trimmed) while the previous round's
/// blocks are freed. Live bytes stay at one round's blocks; RSS and the allocator's resident
/// footprint grow about 488 KiB a round (checked by hand with the fixture's own VmRSS and
/// mallinfo2 figures: 3.8 MiB → 21 MiB in 40 rounds, in use flat).
#[test]
fn fragmentation_grows_rss_not_live_bytes() {
    require_root();
    let (_out, r, ctx) = record_growth("frag", &[], &["frag", "40", "4"]);
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "fragmentation", "{ctx}");
    no_site_is_a_leak(&r, &ctx);

    let fill = r.site("fill_arena");
    assert_eq!(u64_of(fill, "live_bytes"), FRAG_BLOCKS * FRAG_BLOCK_BYTES, "the last round's blocks\n{ctx}");
    let summary = r.get(&["summary"]);
    let rss = f64_of(summary, "rss_anon_growth_bytes_per_s");
    let footprint = f64_of(summary, "allocator_resident_growth_bytes_per_s");
    let live = f64_of(summary, "native_growth_bytes_per_s");
    // One round = 4096 chunks of 112 B = 448 KiB at 4 rounds/s: 1.75 MiB/s, plus each arena's
    // own pages.
    let truth = (FRAG_BLOCKS * 112 * 4) as f64;
    assert!(rss > 0.9 * truth && rss < 1.5 * truth, "RSS anon grows {rss} B/s, expected about {truth}\n{ctx}");
    assert!(footprint > 0.9 * truth && footprint < 1.5 * truth, "allocator footprint grows {footprint} B/s\n{ctx}");
    assert!(live.abs() < 0.05 * rss, "live native bytes should stay flat: {live} B/s against RSS {rss} B/s\n{ctx}");
    let ratio = f64_of(summary, "occupied_heap_to_rss_ratio");
    assert!(ratio < 0.2, "occupied heap to RSS {ratio}\n{ctx}");
    let series = r.get(&["memory", "allocator_footprint_bytes"]).as_array().expect("allocator_footprint_bytes");
    assert!(series.len() > 10, "{ctx}");
    eprintln!(
        "frag: verdict {} ({}); RSS anon {rss:.0} B/s, allocator footprint {footprint:.0} B/s, live native {live:.0} B/s (truth {truth} B/s); occupied heap to RSS {ratio}",
        verdict["class"], verdict["confidence"]
    );
}

/// Off-heap mappings: each call of handle_message maps 16 KiB with libc's mmap (map_leak_libc)
/// and 8 KiB with syscall(SYS_mmap) (map_leak_raw) and never unmaps them. Decoys: 8 × 1 MiB
/// mapped once at start, a 64 MiB PROT_NONE reservation, 16 KiB mapped and unmapped every call.
#[test]
fn mappings_never_unmapped_are_off_heap() {
    require_root();
    const CALLS: u64 = 600;
    let (out, r, ctx) = record_growth("mmap", &["--work-probe", "handle_message"], &["mmap", "600", "100"]);
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "off-heap", "{ctx}");
    assert!(str_of(verdict, "summary").contains("map_leak_libc"), "{ctx}");

    for (function, bytes) in [("map_leak_libc", MAP_LEAK_LIBC_BYTES), ("map_leak_raw", MAP_LEAK_RAW_BYTES)] {
        let s = r.site(function);
        assert_eq!(str_of(s, "kind"), "mmap", "{function}\n{ctx}");
        assert_eq!(str_of(s, "memory_kind"), "off-heap", "{function}\n{ctx}");
        assert_eq!(str_of(s, "class"), "leak", "{function}\n{ctx}");
        assert_eq!(u64_of(s, "mapped_bytes"), CALLS * bytes as u64, "{function}\n{ctx}");
        assert_eq!(u64_of(s, "live_allocations"), CALLS, "{function}\n{ctx}");
        assert_within(
            &format!("{function} resident_bytes"),
            u64_of(s, "resident_bytes") as f64,
            (CALLS as f64) * bytes,
            0.10,
            &ctx,
        );
        assert_within(
            &format!("{function} growth_bytes_per_unit"),
            f64_of(s, "growth_bytes_per_unit"),
            bytes,
            0.10,
            &ctx,
        );
        assert_within(
            &format!("{function} growth_bytes_per_s"),
            f64_of(s, "growth_bytes_per_s"),
            bytes * 100.0,
            0.10,
            &ctx,
        );
        eprintln!(
            "mmap: {function} {:.1} B/unit, {:.0} B/s, mapped {}, resident {}",
            f64_of(s, "growth_bytes_per_unit"),
            f64_of(s, "growth_bytes_per_s"),
            s["mapped_bytes"],
            s["resident_bytes"]
        );
        let frames: Vec<&str> = s["frames"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).collect();
        let at = frames.iter().position(|f| *f == function).unwrap_or(usize::MAX);
        assert!(
            frames.get(at + 1) == Some(&"handle_message"),
            "{function}: its caller handle_message follows it: {frames:?}\n{ctx}"
        );
    }

    // Decoys.
    let start = r.site("map_static_regions");
    assert_ne!(str_of(start, "class"), "leak", "{ctx}");
    assert_eq!(u64_of(start, "mapped_bytes"), STATIC_REGIONS_BYTES, "{ctx}");
    let reserve = r.site("reserve_address_space");
    assert_ne!(str_of(reserve, "class"), "leak", "{ctx}");
    assert_eq!(u64_of(reserve, "resident_bytes"), 0, "PROT_NONE: nothing resident\n{ctx}");
    if let Some(s) = r.sites_of("map_scratch").first() {
        assert_ne!(str_of(s, "class"), "leak", "{ctx}");
    }
    let scratch = recorded_totals(&out.path, "map_scratch");
    assert_eq!(
        scratch,
        SiteTotals {
            alloc_bytes: CALLS * MAP_SCRATCH_BYTES,
            alloc_count: CALLS,
            free_bytes: CALLS * MAP_SCRATCH_BYTES,
            free_count: CALLS
        },
        "map_scratch: every mapping unmapped\n{ctx}"
    );
    // Nothing the loader mapped is off-heap program memory.
    for s in r.sites().iter().filter(|s| s["kind"] == "mmap") {
        let ld =
            s["frames"].as_array().unwrap().iter().take(3).any(|f| {
                f["object"].as_str().is_some_and(|o| o.rsplit('/').next().unwrap_or(o).starts_with("ld-linux"))
            });
        if ld {
            assert_ne!(str_of(s, "memory_kind"), "off-heap", "a loader mapping: {s}\n{ctx}");
        }
    }

    // Off-heap bytes (resident): the static regions plus 24 KiB per call.
    let summary = r.get(&["summary"]);
    let truth = STATIC_REGIONS_BYTES as f64 + CALLS as f64 * (MAP_LEAK_LIBC_BYTES + MAP_LEAK_RAW_BYTES);
    assert_within(
        "summary.offheap_live_end_bytes",
        u64_of(summary, "offheap_live_end_bytes") as f64,
        truth,
        0.10,
        &ctx,
    );
    let series = r.get(&["memory", "offheap_live_bytes"]).as_array().expect("offheap_live_bytes");
    assert_eq!(series.last().and_then(|p| p[1].as_u64()), Some(u64_of(summary, "offheap_live_end_bytes")), "{ctx}");
    assert_within(
        "summary.offheap_growth_bytes_per_unit",
        f64_of(summary, "offheap_growth_bytes_per_unit"),
        MAP_LEAK_LIBC_BYTES + MAP_LEAK_RAW_BYTES,
        0.10,
        &ctx,
    );
    eprintln!(
        "mmap: verdict {} ({}); off-heap {} B at the end (truth {truth}), {} B/unit",
        verdict["class"],
        verdict["confidence"],
        summary["offheap_live_end_bytes"],
        summary["offheap_growth_bytes_per_unit"]
    );
    let md = std::fs::read_to_string(out.file("report.md")).unwrap();
    assert!(md.contains("**Verdict: off-heap**"), "{md}");
}
