//! Outputs of an analysed recording, all written atomically into one directory:
//!
//! | file | content |
//! |---|---|
//! | `report.json` | machine-readable report ([`json`], `docs/report-json.md`) |
//! | `report.md` | short human report ([`markdown`]) |
//! | `stacks.folded` | folded stacks of live bytes at the end ([`flame::folded_live`]) |
//! | `live.svg` | flame graph of live bytes at the end |
//! | `growth.svg` | flame graph of bytes that became live and stayed live |
//! | `memory.svg` | RSS, RSS-anon and live native bytes over time ([`plot`]) |
//! | `profile.pb.gz` | pprof heap profile, Go's heap layout ([`pprof`]) |
//! | `growth.pb.gz` | pprof profile of live bytes gained over the steady window ([`pprof`]) |

use std::path::PathBuf;

use crate::analyze::{Analysis, AnalyzeOptions, analyze};
use crate::output::OutDir;
use crate::recording::Recording;

/// Growth mode's escalation: first touches in the allocator, the exact window.
pub mod at_exit;
pub mod escalation;
pub mod flame;
pub mod holds;
pub mod json;
pub mod markdown;
/// The occupied heap to RSS with its parts.
pub mod occupied;
pub mod offheap;
/// RSS raised in steps by load spikes.
pub mod plateau;
pub mod plot;
pub mod pprof;
/// Growth of the Python heap by type and what holds it.
/// Reachability hook.
pub mod reach;
/// A site's call stack as report.md prints it.
pub mod stack;
pub mod summary;
pub mod verdict;
/// Every producer's holders in one list ("What holds it").
pub mod what_holds;

/// File names written by [`write_all`], in order.
pub const FILES: [&str; 8] = [
    "report.json",
    "report.md",
    "stacks.folded",
    "live.svg",
    "growth.svg",
    "memory.svg",
    pprof::PROFILE_FILE,
    pprof::GROWTH_FILE,
];

/// Analyse `rec` and write every output file into `dir`. Returns the paths written, in
/// [`FILES`] order. Errors name the file that could not be written.
pub fn write_all(rec: &Recording, dir: &OutDir, opts: &AnalyzeOptions) -> anyhow::Result<Vec<PathBuf>> {
    render_all(rec, &analyze(rec, opts), dir)
}

/// Analyse `rec` and write only its pprof profiles ([`pprof::PROFILE_FILE`],
/// [`pprof::GROWTH_FILE`]) into `dir`: `leaktrace report --format pprof`. Returns the two paths.
/// Errors name the file that could not be written.
pub fn write_pprof(rec: &Recording, dir: &OutDir, opts: &AnalyzeOptions) -> anyhow::Result<Vec<PathBuf>> {
    let (profile, growth) = pprof::profiles(rec, &analyze(rec, opts));
    [(pprof::PROFILE_FILE, profile), (pprof::GROWTH_FILE, growth)]
        .into_iter()
        .map(|(name, data)| dir.write(name, &data))
        .collect()
}

/// Write every output file of `rec`, rendered from its analysis `a`, into `dir`. Returns the
/// paths written, in [`FILES`] order. Errors name the file that could not be written.
pub fn render_all(rec: &Recording, a: &Analysis, dir: &OutDir) -> anyhow::Result<Vec<PathBuf>> {
    render(rec, a)?.into_iter().map(|(name, data)| dir.write(name, &data)).collect()
}

/// Render every output file of `rec` from its analysis `a`, in memory: (file name, content) in
/// [`FILES`] order. Errors: a flame graph that cannot be drawn.
pub fn render(rec: &Recording, a: &Analysis) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
    let mut files: Vec<(&'static str, Vec<u8>)> = Vec::with_capacity(FILES.len());
    let mut put = |name: &'static str, data: &[u8]| -> anyhow::Result<()> {
        files.push((name, data.to_vec()));
        Ok(())
    };

    let mut report = serde_json::to_vec_pretty(&json::report_json(rec, a))?;
    report.push(b'\n');
    put("report.json", &report)?;
    put("report.md", markdown::report_md(rec, a).as_bytes())?;

    let live = flame::folded_live(a);
    put("stacks.folded", live.as_bytes())?;
    let command = rec.target.command.join(" ");
    let subtitle = format!("pid {} {}", rec.target.pid, command);
    let live_svg = flame::flame_svg(&live, flame::LIVE_TITLE, Some(subtitle.clone()), "no live bytes at the end")?;
    put("live.svg", &live_svg)?;
    let growth = flame::folded_growth(a);
    let growth_svg = flame::flame_svg(
        &growth,
        flame::GROWTH_TITLE,
        Some(subtitle.clone()),
        "no growth: no site holds more live bytes at the last checkpoint than at the first",
    )?;
    put("growth.svg", &growth_svg)?;
    put("memory.svg", plot::memory_svg(a, &subtitle).as_bytes())?;
    // profile.pb.gz and growth.pb.gz, built in report/pprof.rs.
    let (profile, growth) = pprof::profiles(rec, a);
    put(pprof::PROFILE_FILE, &profile)?;
    put(pprof::GROWTH_FILE, &growth)?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::analyze::fixtures::*;
    use crate::recording::StackKind;

    /// A fresh empty directory under the system temp dir.
    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "leaktrace-report-test-{}-{name}-{}",
            std::process::id(),
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn read_json(dir: &std::path::Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
    }

    #[test]
    fn writes_all_files() {
        let dir = tempdir("mixed");
        let rec = mixed();
        let paths = write_all(&rec, &OutDir::existing(&dir).unwrap(), &AnalyzeOptions::default()).unwrap();
        assert_eq!(paths.len(), FILES.len());
        for f in FILES {
            let p = dir.join(f);
            assert!(p.is_file(), "{f} missing");
            assert!(std::fs::metadata(&p).unwrap().len() > 0, "{f} empty");
        }

        let j = read_json(&dir);
        assert_eq!(j["target"]["pid"], 4242);
        assert_eq!(j["target"]["command"], "./server --port 8080");
        assert_eq!(j["target"]["argv"][1], "--port");
        assert_eq!(j["target"]["nspid"][1], 7);
        assert_eq!(j["target"]["exe"], "/opt/server/bin/server");
        assert_eq!(j["target"]["launched"], true);
        assert_eq!(j["target"]["exit_status"], 0);
        assert_eq!(j["mode"], "exact");
        assert_eq!(j["duration_s"], 60.0);
        assert_eq!(j["interval_s"], 1.0);
        assert_eq!(j["end_reason"], "duration");
        assert_eq!(j["verdict"]["class"], "leak");
        assert!(j["verdict"]["confidence"].as_f64().unwrap() > 0.5);
        assert!(j["verdict"]["summary"].as_str().unwrap().contains("Session::key"));

        let sites = j["sites"].as_array().unwrap();
        assert_eq!(sites.len(), 2, "the temporary site has no live bytes at t=60 and no growth");
        assert!(sites.iter().all(|s| s["id"] != 3));
        let live: Vec<u64> = sites.iter().map(|s| s["live_bytes"].as_u64().unwrap()).collect();
        assert!(live.windows(2).all(|w| w[0] >= w[1]), "sorted by live bytes: {live:?}");
        let leak = sites.iter().find(|s| s["id"] == 1).unwrap();
        for k in [
            "id",
            "kind",
            "function",
            "class",
            "confidence",
            "frames",
            "live_bytes",
            "live_allocations",
            "allocated_bytes",
            "allocations",
            "freed_bytes",
            "frees",
            "growth_bytes",
            "growth_bytes_per_s",
            "growth_ci95_bytes_per_s",
            "stack_lost",
        ] {
            assert!(leak.get(k).is_some(), "site field {k}");
        }
        assert_eq!(leak["class"], "leak");
        assert_eq!(leak["function"], "Session::key");
        assert_eq!(leak["live_bytes"], 60_000);
        assert_eq!(leak["allocated_bytes"], 90_000);
        assert_eq!(leak["freed_bytes"], 30_000);
        assert_eq!(leak["growth_bytes"], 60_000);
        assert!((leak["growth_bytes_per_s"].as_f64().unwrap() - 1000.0).abs() < 10.0);
        let frames = leak["frames"].as_array().unwrap();
        assert_eq!(frames[0]["function"], "malloc");
        assert_eq!(frames[0]["allocator"], true);
        assert_eq!(frames[1]["allocator"], true);
        assert_eq!(frames[2]["inlined"], true);
        assert_eq!(frames[3]["allocator"], false);
        assert_eq!(frames[3]["line"], 42);
        for k in ["function", "file", "line", "object", "addr", "inlined"] {
            assert!(frames[3].get(k).is_some(), "frame field {k}");
        }
        let cache = sites.iter().find(|s| s["id"] == 2).unwrap();
        assert_eq!(cache["class"], "cache");

        for k in ["rss_bytes", "rss_anon_bytes", "rss_file_bytes", "native_live_bytes"] {
            let arr = j["memory"][k].as_array().unwrap();
            assert_eq!(arr.len(), 61, "{k}");
            assert_eq!(arr[60][0], 60.0);
            assert!(arr[60][1].is_u64());
        }
        assert_eq!(j["memory"]["native_live_bytes"][60][1], 960_000);
        for k in [
            "rss_start_bytes",
            "rss_end_bytes",
            "native_live_start_bytes",
            "native_live_end_bytes",
            "native_growth_bytes_per_s",
        ] {
            assert!(j["summary"][k].is_number(), "summary.{k}");
        }
        assert_eq!(j["drops"]["total"], 0);
        assert_eq!(j["drops"]["allocs_map_full"], 0);
        assert!(j["events"].is_object());
        assert_eq!(j["probes"][0]["function"], "malloc");
        assert!(j["warnings"].is_array());

        // Folded stacks: one line per site with live bytes, outermost first, right counts.
        let folded = std::fs::read_to_string(dir.join("stacks.folded")).unwrap();
        let lines: Vec<&str> = folded.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines.contains(&"main;Cache::fill;malloc 900000"), "{folded}");
        assert!(
            lines.contains(&"main;handle_request;Session::remember(std::string const&);Session::key;operator new(unsigned long);malloc 60000"),
            "{folded}"
        );

        let live_svg = std::fs::read_to_string(dir.join("live.svg")).unwrap();
        assert!(live_svg.contains("<svg") && live_svg.contains(flame::LIVE_TITLE));
        assert!(live_svg.contains("Cache::fill"));
        let growth_svg = std::fs::read_to_string(dir.join("growth.svg")).unwrap();
        assert!(growth_svg.contains("<svg") && growth_svg.contains("Bytes that became live"));
        let mem_svg = std::fs::read_to_string(dir.join("memory.svg")).unwrap();
        assert!(mem_svg.starts_with("<?xml") && mem_svg.trim_end().ends_with("</svg>"));
        assert!(mem_svg.contains("MiB") && mem_svg.contains("polyline"));

        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        let verdict_line = md.lines().find(|l| !l.trim().is_empty() && !l.starts_with('#')).unwrap();
        assert!(verdict_line.starts_with("**Verdict: leak**"), "{verdict_line}");
        assert!(md.contains("Session::key (src/session.h:12) [server] (inlined)"), "{md}");
        assert!(md.contains("(via operator new(unsigned long) → malloc)"), "{md}");
        assert!(md.contains("60,000 B"));
        assert!(md.contains("Nothing was dropped"));
        assert!(md.contains("Cache::fill"));
        assert!(md.contains("parse_line"));
        assert!(md.contains("| /lib/x86_64-linux-gnu/libc.so.6 | malloc | entry | 0xa0f0 |"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn per_unit_off_heap_and_sections() {
        let dir = tempdir("per-unit");
        let mut rec = mixed();
        rec.work_probe = Some("handle_request".into());
        for c in &mut rec.checkpoints {
            c.units_of_work = Some(c.t_s as u64 * 10);
        }
        write_all(&rec, &OutDir::existing(&dir).unwrap(), &AnalyzeOptions::default()).unwrap();
        let j = read_json(&dir);
        assert_eq!(j["work_probe"], "handle_request");
        assert_eq!(j["units_of_work"], 600);
        let leak = j["sites"].as_array().unwrap().iter().find(|s| s["id"] == 1).unwrap();
        // 1000 B/s at 10 units/s.
        assert!((leak["growth_bytes_per_unit"].as_f64().unwrap() - 100.0).abs() < 0.01, "{leak}");
        assert!(leak["growth_ci95_bytes_per_unit"].is_number());
        assert!(leak["mapped_bytes"].is_null() && leak["resident_bytes"].is_null());
        // The process: the leak plus the temporary site's 0–2000 B in flight.
        assert!((j["summary"]["growth_bytes_per_unit"].as_f64().unwrap() - 100.0).abs() < 5.0, "{}", j["summary"]);
        assert!((j["summary"]["growth_bytes_per_s"].as_f64().unwrap() - 1000.0).abs() < 50.0, "{}", j["summary"]);
        assert!(j["summary"]["occupied_heap_to_rss_ratio"].as_f64().unwrap() > 0.0);
        for k in ["rss_anon_bytes", "offheap_live_bytes", "allocator_footprint_bytes", "native_live_bytes"] {
            assert!(j["memory"][k].is_array(), "memory.{k}");
        }
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        let verdict_line = md.lines().find(|l| l.starts_with("**Verdict")).unwrap();
        assert!(
            verdict_line.contains("— Session::key holds 100 B more live bytes per call of handle_request"),
            "the class is said once: {verdict_line}"
        );
        assert!(md.contains("- growth: +100 B per call of handle_request (±0 B at 95 %); +1000 B/s"), "{md}");
        assert!(md.contains("traced live bytes +100 B per call of handle_request"), "{md}");
        // Verdict, measurement, retaining stacks, what is not a leak, caveats.
        let at = |h: &str| md.find(h).unwrap_or_else(|| panic!("no {h} in\n{md}"));
        let order = [
            at("**Verdict"),
            at("## Measurement"),
            at("## Retaining stacks"),
            at("## Not a leak"),
            at("## Caveats"),
            at("- Memory outside what was traced: RSS anon is"),
            at("### Losses"),
        ];
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}\n{md}");
        std::fs::remove_dir_all(&dir).unwrap();

        // An off-heap mapping that grows: anonymous, then MAP_SHARED (a memfd: shared memory,
        // named so, not "anonymous").
        for shared in [false, true] {
            let dir = tempdir(if shared { "off-heap-shared" } else { "off-heap" });
            let map = crate::recording::Stack {
                id: 7,
                kind: StackKind::Mmap,
                frames: vec![
                    frame("mmap64", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
                    frame("map_buffers", "/opt/server/bin/server", Some(("/build/src/buf.c", 7))).into(),
                ],
                lost: false,
                truncated: None,
                shared,
            };
            let mut rec = recording(
                &times61(),
                // 20 KiB mapped a second, 4 KiB of it unmapped again (a part of a mapping: no
                // whole one freed).
                vec![(map, Box::new(|t: f64| (20480 * t as u64, t as u64, 4096 * t as u64, 0)))],
                &|t| mem((1 << 20) + 16384 * t as u64),
                &no_counters,
            );
            for c in &mut rec.checkpoints {
                for s in &mut c.sites {
                    s.resident_bytes = Some(s.alloc_bytes - s.free_bytes);
                }
            }
            write_all(&rec, &OutDir::existing(&dir).unwrap(), &AnalyzeOptions::default()).unwrap();
            let j = read_json(&dir);
            assert_eq!(j["verdict"]["class"], "off-heap");
            let s = &j["sites"][0];
            assert_eq!(s["function"], "map_buffers");
            assert_eq!(s["kind"], "mmap");
            assert_eq!(s["class"], "leak");
            assert_eq!(s["mapped_bytes"], 60 * 16384);
            assert_eq!(s["resident_bytes"], 60 * 16384);
            assert_eq!(j["summary"]["offheap_live_end_bytes"], 60 * 16384);
            let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
            let verdict_line = md.lines().find(|l| l.starts_with("**Verdict")).unwrap();
            assert!(verdict_line.starts_with("**Verdict: off-heap** (confidence"), "{verdict_line}");
            assert!(verdict_line.contains("— map_buffers maps +16.0 KiB/s"), "{verdict_line}");
            assert!(md.contains("- mapped at end: 960.0 KiB (983,040 B), resident 960.0 KiB (983,040 B)"), "{md}");
            assert!(md.contains("unmapped 240.0 KiB (245,760 B) in parts of mappings\n"), "{md}");
            assert_eq!(s["shared_mapping"], shared);
            let (mappings, offheap) = if shared {
                (
                    "shared mappings (MAP_SHARED: shared memory, RssShmem) it never unmaps",
                    "- off-heap (shared mappings made by the program (MAP_SHARED: shared memory, RssShmem), resident): ",
                )
            } else {
                (
                    "anonymous mappings it never unmaps",
                    "- off-heap (anonymous mappings made by the program, resident): ",
                )
            };
            assert!(verdict_line.contains(mappings), "{verdict_line}");
            assert!(!verdict_line.contains(if shared { "anonymous" } else { "shared" }), "{verdict_line}");
            assert!(md.contains(offheap), "{md}");
            // RSS anon's accounting leaves shared memory out (it is RssShmem).
            let outside = md.lines().find(|l| l.starts_with("- Memory outside what was traced")).unwrap();
            if shared {
                assert!(outside.contains("off-heap mappings 0 B resident"), "{outside}");
                assert!(
                    outside.contains("(besides, shared mappings 960.0 KiB resident: RssShmem, not RSS anon)"),
                    "{outside}"
                );
            } else {
                assert!(outside.contains("off-heap mappings 960.0 KiB resident"), "{outside}");
                assert!(!outside.contains("RssShmem"), "{outside}");
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn drops_in_report_json() {
        let dir = tempdir("drops");
        let rec = recording(&times61(), vec![leak_site()], &|_| None, &|_| {
            let mut m = BTreeMap::new();
            m.insert("allocs".to_string(), 900);
            m.insert("missed_return".to_string(), 4);
            m.insert("address_reused".to_string(), 1);
            m.insert("nested_call".to_string(), 12);
            m
        });
        write_all(&rec, &OutDir::existing(&dir).unwrap(), &AnalyzeOptions::default()).unwrap();
        let j = read_json(&dir);
        assert_eq!(j["drops"]["missed_return"], 4);
        assert_eq!(j["drops"]["address_reused"], 1);
        assert_eq!(j["drops"]["total"], 5);
        assert_eq!(j["events"]["nested_call"], 12);
        assert!(j["drops"].get("nested_call").is_none());
        assert!(j["memory"]["rss_bytes"].as_array().unwrap().is_empty());
        assert!(j["summary"]["rss_start_bytes"].is_null());
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(md.contains("| missed_return | 4 |"));
        assert!(md.contains("5 event(s) lost"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn empty_recording() {
        let dir = tempdir("empty");
        let rec = recording(&[0.0], vec![], &|_| None, &no_counters);
        write_all(&rec, &OutDir::existing(&dir).unwrap(), &AnalyzeOptions::default()).unwrap();
        let j = read_json(&dir);
        assert_eq!(j["sites"].as_array().unwrap().len(), 0);
        assert_eq!(j["duration_s"], 0.0);
        assert_eq!(j["verdict"]["class"], "flat");
        assert_eq!(std::fs::read_to_string(dir.join("stacks.folded")).unwrap(), "");
        let g = std::fs::read_to_string(dir.join("growth.svg")).unwrap();
        assert!(g.contains("<svg") && g.contains("no growth"));
        let l = std::fs::read_to_string(dir.join("live.svg")).unwrap();
        assert!(l.contains("<svg"));
        let m = std::fs::read_to_string(dir.join("memory.svg")).unwrap();
        assert!(m.contains("no data") || m.contains("polyline") || m.contains("circle"));
        std::fs::remove_dir_all(&dir).unwrap();

        // No checkpoint at all.
        let dir = tempdir("none");
        let rec = recording(&[], vec![cache_site()], &|_| None, &no_counters);
        write_all(&rec, &OutDir::existing(&dir).unwrap(), &AnalyzeOptions::default()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lost_and_unnamed_frames_fold() {
        let dir = tempdir("lost");
        let lost = crate::recording::Stack {
            id: 5,
            kind: StackKind::Malloc,
            frames: vec![],
            lost: true,
            truncated: None,
            shared: false,
        };
        let unnamed = crate::recording::Stack {
            id: 6,
            kind: StackKind::Mmap,
            frames: vec![
                crate::recording::Frame { addr: 0x10, object: Some("/usr/lib/libx.so".into()), ..Default::default() }
                    .into(),
                crate::recording::Frame { addr: 0x20, function: Some("f; [u8; 8]".into()), ..Default::default() }
                    .into(),
            ],
            lost: false,
            truncated: None,
            shared: false,
        };
        let rec = recording(
            &times61(),
            vec![
                (lost, Box::new(|t: f64| ((t as u64 + 1) * 10, t as u64 + 1, 0, 0))),
                (unnamed, Box::new(|_| (4096, 1, 0, 0))),
            ],
            &|t| mem(t as u64 * 4096),
            &no_counters,
        );
        write_all(&rec, &OutDir::existing(&dir).unwrap(), &AnalyzeOptions::default()).unwrap();
        let folded = std::fs::read_to_string(dir.join("stacks.folded")).unwrap();
        assert!(folded.contains("[stack lost] 610\n"), "{folded}");
        assert!(folded.contains("f, [u8, 8];libx.so+0x10 4096\n"), "{folded}");
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(md.contains("stack lost"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
