//! pprof output (`profile.pb.gz`, `growth.pb.gz` in every recording directory), read by the
//! real pprof client, `go tool pprof`: on `leaky malloc` (1000 B leaked per iteration in
//! leak_malloc, a 32 KiB cache, 4 KiB temporary blocks) and its fixed build (`-DFIXED`), in exact
//! and sampled mode.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use leaktrace_tests::*;

const RATE: &str = "200";

/// `leaky` built with -DFIXED (leak_malloc frees the previous block).
fn leaky_fixed() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("pprof-leaky-fixed", |dir| {
            let out = dir.join("leaky");
            compile_with("gcc", &[&fixture_source("leaky.c")], &out, &["-DFIXED"]);
        })
        .join("leaky")
    })
}

/// Record `BIN malloc ITERATIONS RATE` launched, with `extra` options; asserts it ran to its end.
fn record_leaky(name: &str, bin: &Path, iterations: u64, rate: &str, extra: &[&str]) -> OutDir {
    let out = OutDir::new(name);
    let mut target = Command::new(bin);
    target.args(["malloc", &iterations.to_string(), rate]);
    let o = record_launch(&out, extra, target);
    o.assert_success();
    assert!(
        o.stdout.contains(&format!("done mode=malloc iterations={iterations} ")),
        "the target did not run to its end\n{}",
        o.describe()
    );
    out
}

fn site_value(r: &Report, function: &str, key: &str) -> i64 {
    i64_of(r.site(function), key)
}

/// The leak is first in `-top` of inuse_space with report.json's live bytes (within 1 %),
/// alloc_space ranks temp_work (the most allocated), `-traces` shows the leak's stack and labels,
/// growth.pb.gz names the leak, and `-diff_base` against the fixed build shows the leak's bytes
/// as a negative difference.
#[test]
fn pprof_top_traces_growth_and_diff_base() {
    require_root();
    const N: u64 = 600;
    let before = record_leaky("pprof-leaky", &fixtures().leaky, N, RATE, &[]);
    let r = Report::load(&before.path);
    let ctx = format!("report {}:\n{}", before.path.display(), r.summary());
    let profile = before.file("profile.pb.gz");

    // inuse_space (the default view, asked for explicitly too).
    let live = site_value(&r, "leak_malloc", "live_bytes");
    assert_within("leak_malloc live_bytes in report.json", live as f64, (N * LEAK_BYTES) as f64, 0.10, &ctx);
    for args in [&["-top", "-unit=B"][..], &["-top", "-unit=B", "-sample_index=inuse_space"][..]] {
        let text = go_pprof(args, &[&profile]);
        let rows = top_rows(&text);
        assert!(!rows.is_empty(), "no rows in\n{text}");
        assert_eq!(rows[0].1, "leak_malloc", "first row of {args:?}:\n{text}\n{ctx}");
        assert_within(
            "pprof inuse_space of leak_malloc",
            rows[0].0 as f64,
            live as f64,
            0.01,
            &format!("{text}\n{ctx}"),
        );
        assert!(text.contains("Type: inuse_space"), "{text}");
        // The allocator's frames are not in the profile: malloc has no flat bytes.
        assert!(!rows.iter().any(|(_, f)| f == "malloc"), "{text}");
    }

    // alloc_space: temp_work allocates the most (4096 B per iteration).
    let text = go_pprof(&["-top", "-unit=B", "-sample_index=alloc_space"], &[&profile]);
    let rows = top_rows(&text);
    assert_eq!(rows.first().map(|r| r.1.as_str()), Some("temp_work"), "alloc_space top:\n{text}\n{ctx}");
    // temp_work holds nothing at the end, so report.json does not list it: recording.json has
    // its totals; each iteration allocates TEMP_BYTES there.
    let allocated = recorded_totals(&before.path, "temp_work").alloc_bytes;
    assert_eq!(allocated, N * TEMP_BYTES, "{ctx}");
    assert_within(
        "pprof alloc_space of temp_work",
        rows[0].0 as f64,
        allocated as f64,
        0.01,
        &format!("{text}\n{ctx}"),
    );
    let leak_alloc = rows.iter().find(|(_, f)| f == "leak_malloc").map(|r| r.0).unwrap_or(0);
    assert_within(
        "pprof alloc_space of leak_malloc",
        leak_alloc as f64,
        site_value(&r, "leak_malloc", "allocated_bytes") as f64,
        0.01,
        &text,
    );

    // -traces: the leak's stack, innermost first, with its labels.
    let text = go_pprof(&["-traces", "-sample_index=inuse_space"], &[&profile]);
    let trace = text
        .split("-----------+")
        .find(|t| t.lines().any(|l| l.trim_end().ends_with(" leak_malloc")))
        .unwrap_or_else(|| panic!("no trace with leak_malloc in\n{text}"));
    let funcs: Vec<&str> = trace.lines().filter_map(|l| l.split_whitespace().last()).collect();
    let (i, m) = (funcs.iter().position(|f| *f == "leak_malloc"), funcs.iter().position(|f| *f == "main"));
    assert!(matches!((i, m), (Some(i), Some(m)) if i < m), "leak_malloc then main in\n{trace}");
    // Labels are printed as "     class:  leak".
    let labels: Vec<(&str, &str)> =
        trace.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim(), v.trim())).collect();
    let pid = i64_of(r.get(&["target"]), "pid").to_string();
    for label in
        [("class", "leak"), ("memory_kind", "native"), ("runtime", "native"), ("kind", "malloc"), ("pid", pid.as_str())]
    {
        assert!(labels.contains(&label), "no label {label:?} in\n{trace}");
    }

    // Mappings: the executable's, with its file offset and its GNU build ID (as readelf reads
    // it from the file).
    let exe = fixtures().leaky.display().to_string();
    let readelf = Command::new("readelf").arg("-n").arg(&exe).output().expect("readelf (binutils)");
    let notes = String::from_utf8_lossy(&readelf.stdout);
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build ID in the fixture:\n{notes}"))
        .trim()
        .to_string();
    let raw = go_pprof(&["-raw"], &[&profile]);
    let mappings = raw.split("Mappings").nth(1).unwrap_or_else(|| panic!("no Mappings in\n{raw}"));
    let line = mappings
        .lines()
        .find(|l| l.contains(&format!(" {exe} ")))
        .unwrap_or_else(|| panic!("no mapping of {exe} in\n{raw}"));
    assert!(line.contains(&build_id), "build ID {build_id} missing from {line:?}");
    // "1: 0xSTART/0xLIMIT/0xOFFSET path build-id [FN]": the text segment is not at offset 0.
    let offset = line.split_whitespace().nth(1).and_then(|r| r.split('/').nth(2)).unwrap_or("");
    assert!(offset.starts_with("0x") && offset != "0x0", "file offset {offset:?} in {line:?}");

    // growth.pb.gz: what grew over the steady window is the leak.
    let text = go_pprof(&["-top", "-unit=B"], &[&before.file("growth.pb.gz")]);
    let rows = top_rows(&text);
    assert_eq!(rows.first().map(|r| r.1.as_str()), Some("leak_malloc"), "growth top:\n{text}\n{ctx}");
    assert!(text.contains("Type: growth_space"), "{text}");
    // About half the run's leak (the steady window is the last half of the span).
    assert!(rows[0].0 > (live / 4) && rows[0].0 <= live, "growth of leak_malloc {} vs live {live}\n{text}", rows[0].0);

    // After the fix: the difference is the leak's bytes, negative.
    let after = record_leaky("pprof-fixed", leaky_fixed(), N, RATE, &[]);
    let ra = Report::load(&after.path);
    let after_live = ra.sites_of("leak_malloc").iter().map(|s| i64_of(s, "live_bytes")).sum::<i64>();
    let text = go_pprof(
        &["-top", "-unit=B", "-sample_index=inuse_space", "-diff_base"],
        &[&profile, &after.file("profile.pb.gz")],
    );
    let leak = top_rows(&text)
        .into_iter()
        .find(|(_, f)| f == "leak_malloc")
        .unwrap_or_else(|| panic!("no leak_malloc row in the diff\n{text}"));
    let expected = after_live - live;
    assert!(leak.0 < 0, "the leak's difference is not negative\n{text}");
    assert_within("diff of leak_malloc", leak.0 as f64, expected as f64, 0.01, &format!("{text}\n{ctx}"));
}

/// Sampled mode: the profile holds the weighted estimates (report.json's live bytes, within
/// 1 %), the leak is first, and `period` is the sampling distance.
#[test]
fn pprof_sampled_mode() {
    require_root();
    const N: u64 = 2000;
    let out = record_leaky("pprof-sampled", &fixtures().leaky, N, "500", &["--sample-bytes", "4096"]);
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}", out.path.display(), r.summary());
    assert_eq!(str_of(&r.json, "mode"), "sampled", "{ctx}");
    let profile = out.file("profile.pb.gz");
    let text = go_pprof(&["-top", "-unit=B", "-sample_index=inuse_space"], &[&profile]);
    let rows = top_rows(&text);
    assert_eq!(rows.first().map(|r| r.1.as_str()), Some("leak_malloc"), "{text}\n{ctx}");
    let live = site_value(&r, "leak_malloc", "live_bytes");
    assert_within(
        "pprof inuse_space of leak_malloc (sampled)",
        rows[0].0 as f64,
        live as f64,
        0.01,
        &format!("{text}\n{ctx}"),
    );
    // The estimate itself: 1000-B blocks sampled at a 4 KiB mean distance have a relative
    // standard deviation of 4 % over 2000 blocks; 25 % is more than 6 σ.
    assert_within("sampled estimate of the leak", live as f64, (N * LEAK_BYTES) as f64, 0.25, &ctx);
    let raw = go_pprof(&["-raw"], &[&profile]);
    assert!(raw.contains("PeriodType: space bytes"), "{raw}");
    assert!(raw.contains("Period: 4096"), "{raw}");

    // `report --format pprof` writes the two profiles again, and nothing else.
    for f in ["profile.pb.gz", "growth.pb.gz", "report.md"] {
        std::fs::remove_file(out.file(f)).unwrap();
    }
    let mut cmd = leaktrace(["report", "--format", "pprof"]);
    cmd.arg(&out.path);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    assert!(!out.file("report.md").exists(), "--format pprof wrote report.md\n{}", o.describe());
    assert!(out.file("growth.pb.gz").exists(), "{}", o.describe());
    let again = go_pprof(&["-top", "-unit=B", "-sample_index=inuse_space"], &[&profile]);
    assert_eq!(top_rows(&again), rows, "{again}\n{text}");
}
