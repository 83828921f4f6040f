//! `leaktrace check` (the growth test with a budget and a CI exit code) and `leaktrace compare`
//! (before/after a fix), on `leaky malloc` (1000 B leaked per iteration in leak_malloc) and its
//! fixed build (`-DFIXED`: leak_malloc frees the previous block).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use leaktrace_tests::*;

/// Iterations per second of the fixture; it is given far more iterations than a test lasts
/// (`check` stops it at the end).
const RATE: &str = "200";
const ITERATIONS: &str = "1000000";

/// `leaky` built with -DFIXED.
fn leaky_fixed() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("check_compare-leaky-fixed", |dir| {
            let out = dir.join("leaky");
            let o = Command::new("gcc")
                .args(["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-DFIXED", "-o"])
                .arg(&out)
                .arg(fixture_source("leaky.c"))
                .output()
                .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
            assert!(o.status.success(), "compiling leaky.c -DFIXED failed:\n{}", String::from_utf8_lossy(&o.stderr));
        })
        .join("leaky")
    })
}

/// `leaktrace check --out OUT [args...] -- BIN malloc ITERATIONS RATE`, to its end.
fn check(out: &OutDir, args: &[&str], bin: &Path) -> Output {
    let mut cmd = leaktrace(["check", "--out"]);
    cmd.arg(&out.path).args(args).arg("--").arg(bin).args(["malloc", ITERATIONS, RATE]);
    run(cmd, None, TIMEOUT)
}

fn check_json(out: &OutDir) -> Value {
    let p = out.file("check.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const PER_SECOND: &[&str] = &["--warmup", "1s", "--batches", "4", "--batch-seconds", "1", "--budget", "100"];

/// The leaky build fails its budget naming leak_malloc; the fixed build passes; compare of the
/// two says the leak in leak_malloc is fixed.
#[test]
fn check_fails_on_leak_passes_when_fixed_and_compare_says_fixed() {
    require_root();
    let leaky_out = OutDir::new("check-leaky");
    let o = check(&leaky_out, PER_SECOND, &fixtures().leaky);
    assert_eq!(o.code(), Some(1), "check of the leaky build should FAIL (exit 1)\n{}", o.describe());
    assert!(o.stdout.contains("FAIL"), "no FAIL in stdout\n{}", o.describe());
    let growing = o.stdout.split("growing sites:").nth(1).unwrap_or("");
    assert!(growing.contains("leak_malloc"), "leak_malloc not named as a growing site\n{}", o.describe());
    let j = check_json(&leaky_out);
    assert_eq!(j["pass"], false, "{j}");
    assert_eq!(j["unit"], "B/s", "{j}");
    assert_eq!(j["batches"].as_array().map(Vec::len), Some(5), "baseline + 4 batches: {j}");
    assert_eq!(j["growing_sites"][0]["function"], "leak_malloc", "{j}");
    // 1000 B × 200 iterations/s.
    assert_within("slope (B/s)", f64_of(&j, "slope"), 200_000.0, 0.10, &o.describe());
    assert!(leaky_out.file("recording.json").is_file() && leaky_out.file("report.md").is_file());

    let fixed_out = OutDir::new("check-fixed");
    let o = check(&fixed_out, PER_SECOND, leaky_fixed());
    assert_eq!(o.code(), Some(0), "check of the fixed build should PASS (exit 0)\n{}", o.describe());
    assert!(o.stdout.contains("PASS"), "no PASS in stdout\n{}", o.describe());
    let j = check_json(&fixed_out);
    assert_eq!(j["pass"], true, "{j}");
    assert!(j["growing_sites"].as_array().is_some_and(Vec::is_empty), "{j}");

    let cmp_out = OutDir::new("compare");
    let mut cmd = leaktrace(["compare"]);
    cmd.arg(&leaky_out.path).arg(&fixed_out.path).arg("--out").arg(&cmp_out.path);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    let verdict = o
        .stdout
        .lines()
        .find(|l| l.starts_with("leak in leak_malloc:"))
        .unwrap_or_else(|| panic!("no verdict line for leak_malloc\n{}", o.describe()));
    assert!(verdict.ends_with("— fixed"), "{verdict}\n{}", o.describe());
    assert!(verdict.contains("B/s before") && verdict.contains("B/s after"), "{verdict}");
    assert!(o.stdout.contains("PASS — after: flat"), "{}", o.describe());
    for f in ["compare.md", "compare.json", "diff.svg"] {
        let len = std::fs::metadata(cmp_out.file(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{f} missing or empty\n{}", o.describe());
    }
    let c: Value = serde_json::from_str(&std::fs::read_to_string(cmp_out.file("compare.json")).unwrap()).unwrap();
    let site = c["matched"]
        .as_array()
        .and_then(|m| m.iter().find(|s| s["function"] == "leak_malloc"))
        .unwrap_or_else(|| panic!("leak_malloc not matched: {c}"));
    assert_eq!(site["status"], "fixed", "{site}");
    assert_within("leak_malloc before (B/s)", f64_of(&site["before"], "slope"), 200_000.0, 0.10, &c.to_string());
    let svg = std::fs::read_to_string(cmp_out.file("diff.svg")).unwrap();
    assert!(svg.contains("leak_malloc"), "diff.svg does not show leak_malloc");
}

/// With a work probe on a function called once per iteration, the slope is per unit of work:
/// 1000 B per iteration.
#[test]
fn check_per_unit_of_work() {
    require_root();
    let out = OutDir::new("check-units");
    let o = check(
        &out,
        &["--warmup", "1s", "--batches", "4", "--batch-units", "100", "--work-probe", "cache_put", "--budget", "2KiB"],
        &fixtures().leaky,
    );
    assert_eq!(o.code(), Some(0), "1000 B/unit is within a 2 KiB/unit budget\n{}", o.describe());
    let j = check_json(&out);
    assert_eq!(j["unit"], "B/unit", "{j}");
    assert_eq!(j["budget"].as_f64(), Some(2048.0), "{j}");
    let batches = j["batches"].as_array().expect("batches");
    assert_eq!(batches.len(), 5, "{j}");
    for w in batches.windows(2) {
        let du = u64_of(&w[1], "units") - u64_of(&w[0], "units");
        assert!((100..150).contains(&du), "batch of {du} units (expected 100, a little more at most): {j}");
    }
    assert_within("slope (B/unit)", f64_of(&j, "slope"), LEAK_BYTES as f64, 0.10, &o.describe());
    assert!(o.stdout.contains("B/unit") && o.stdout.contains("PASS"), "{}", o.describe());
}

/// Usage and input errors exit 2 (no root needed for these).
#[test]
fn check_and_compare_errors_exit_2() {
    let o =
        run(leaktrace(["check", "--batch-units", "10", "--budget", "0", "--", "true"]), None, Duration::from_secs(10));
    assert_eq!(o.code(), Some(2), "--batch-units without --work-probe\n{}", o.describe());
    let o = run(
        leaktrace(["check", "--batch-seconds", "1", "--budget", "12 parsecs", "--", "true"]),
        None,
        Duration::from_secs(10),
    );
    assert_eq!(o.code(), Some(2), "bad --budget\n{}", o.describe());
    let o = run(leaktrace(["check", "--budget", "0", "--", "true"]), None, Duration::from_secs(10));
    assert_eq!(o.code(), Some(2), "no batch size\n{}", o.describe());
    let missing = temp_root().join("no-such-recording");
    let mut cmd = leaktrace(["compare"]);
    cmd.arg(&missing).arg(&missing);
    let o = run(cmd, None, Duration::from_secs(10));
    assert_eq!(o.code(), Some(2), "compare of a missing directory\n{}", o.describe());
    assert!(o.stderr.contains("leaktrace: error:") && o.stderr.contains("no-such-recording"), "{}", o.describe());
}
