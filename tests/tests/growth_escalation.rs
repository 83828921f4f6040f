//! Growth mode's escalation (issue 34) on tests/fixtures/growth_decoy.c: a program that leaks six
//! small asprintf strings per request beside a per-request getline buffer that it frees. Page
//! faults charge the leak's pages to the getline buffer's realloc (it first writes the heap's
//! new top), so growth mode alone must not call getline a leak culprit with a "missing
//! free" hint; its exact window names remember_request at the rate the program reports.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use leaktrace_tests::*;

/// tests/fixtures/growth_decoy.c built as distributions build: -O2, no frame pointers.
fn decoy() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = temp_root().join("fixtures-growth-decoy");
        std::fs::create_dir_all(&dir).expect("create fixtures-growth-decoy");
        let bin = dir.join("growth_decoy");
        let o = Command::new("gcc")
            .args(["-O2", "-g", "-fomit-frame-pointer", "-Wall", "-o"])
            .arg(&bin)
            .arg(fixture_source("growth_decoy.c"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
        assert!(o.status.success(), "compiling growth_decoy.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
        bin
    })
}

/// Record the decoy (2,000 requests a second) in growth mode for 12 s with `extra` options.
fn record_decoy(name: &str, extra: &[&str]) -> (OutDir, Report, Output, String) {
    let out = OutDir::new(name);
    let mut args = vec!["--mode", "growth", "--duration", "12s", "--quiet"];
    args.extend_from_slice(extra);
    let mut target = Command::new(decoy());
    target.arg("2000");
    let o = record_launch(&out, &args, target);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}\nleaktrace stderr:\n{}", out.path.display(), r.summary(), o.stderr);
    (out, r, o, ctx)
}

/// No site carries a missing-release hint for the getline buffer, and no fault site that
/// touched its pages inside the allocator has any hint at all.
fn no_getline_hint(r: &Report, ctx: &str) {
    for s in r.sites() {
        let hint = &s["likely_missing_release"];
        assert!(
            hint.is_null() || !hint.to_string().contains("getdelim") && !hint.to_string().contains("getline"),
            "a site is given getline's missing free: {s}\n{ctx}"
        );
        if !s["first_touch_in"].is_null() {
            assert!(hint.is_null(), "a first touch inside the allocator has a missing-release hint: {s}\n{ctx}");
        }
    }
    assert!(!str_of(r.get(&["verdict"]), "summary").contains("getdelim"), "{ctx}");
}

/// The verdict says the growth's pages were first touched under the line reader: `getline`
/// (glibc's inline wrapper, compiled into the program at -O2) or its caller.
fn first_touched_under_the_reader(summary: &str) -> bool {
    ["getline", "handle_request"].iter().any(|f| summary.contains(&format!("pages first touched under {f} ")))
}

/// With escalation (the default; an 8 s window here): the verdict leads with the exact window's
/// leak, remember_request, within 30 % of the rate the program reports (its probes slow it a
/// little; the rate it prints is over its whole run); the getline buffer is not a leak there.
#[test]
fn growth_mode_escalates_and_names_the_leaking_function_not_the_first_toucher() {
    require_root();
    let (_out, r, o, ctx) = record_decoy("growth-escalation", &["--escalate-for", "8s"]);
    no_getline_hint(&r, &ctx);
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(
        summary.contains("exact window") && summary.contains("remember_request holds"),
        "the verdict does not lead with the exact window's remember_request\n{ctx}"
    );
    assert!(first_touched_under_the_reader(summary), "{ctx}");
    let esc = r.get(&["escalation"]);
    assert!(f64_of(esc, "duration_s") >= 6.0, "exact window too short: {esc}\n{ctx}");
    let sites = esc["sites"].as_array().expect("escalation.sites");
    let top = &sites[0];
    assert_eq!(str_of(top, "function"), "remember_request", "{ctx}");
    assert_eq!(str_of(top, "class"), "leak", "{ctx}");
    assert!(
        !sites.iter().any(|s| s["function"] == "handle_request" && s["class"] == "leak"),
        "the getline buffer's caller is a leak in the exact window\n{ctx}"
    );
    let truth = o
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("leak_rate ")?.trim().parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("growth_decoy printed no leak_rate\n{ctx}"));
    assert_within("exact window's remember_request growth (B/s)", f64_of(top, "growth_bytes_per_s"), truth, 0.3, &ctx);
    assert!(o.stderr.contains("exact window on PID"), "the window is not stated on stderr\n{ctx}");
}

/// `--no-escalate`: growth mode says what it measured — pages first touched under
/// handle_request inside the allocator — and names no holder and no missing free.
#[test]
fn growth_mode_without_escalation_says_pages_first_touched() {
    require_root();
    let (_out, r, o, ctx) = record_decoy("growth-no-escalation", &["--no-escalate"]);
    no_getline_hint(&r, &ctx);
    let summary = str_of(r.get(&["verdict"]), "summary");
    assert!(first_touched_under_the_reader(summary), "{ctx}");
    assert!(!summary.contains("getline holds") && !summary.contains("handle_request holds"), "{ctx}");
    assert_eq!(r.get(&["escalation"]), &Value::Null, "{ctx}");
    assert!(!o.stderr.contains("exact window on PID"), "{ctx}");
    let top = r.largest_growth();
    assert!(
        top["first_touch_in"].as_str().is_some_and(|f| !f.is_empty()),
        "the top fault site is not said to be first touched inside the allocator: {top}\n{ctx}"
    );
}
