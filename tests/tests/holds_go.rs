//! What holds the Go heap (`record --heap-census`): a typed walk of the live heap from the
//! package-level variables, their types from the executable's DWARF, read from outside (no
//! pprof in the program). The fixture (`runtimes/go-holds`) memoizes every response in a
//! package-level `map[string][]byte` under keys that never repeat, beside a bounded map of 256
//! sessions and a `sync.Pool`; built by the Go on PATH (1.19 here, `cargo xtask setup`) as the
//! toolchain builds by default, without optimizations (`-gcflags=all=-N -l`), as a
//! position-independent executable, and stripped (`-ldflags=-s -w`). With `local`, it also
//! appends to a slice field of a heap object reached only from `main.main`'s local `l`: the
//! goroutine-local root is named by its frame's function and the local (`main.main.l`).
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;

use leaktrace_tests::*;

/// Requests a second the fixture serves (each memoized, never dropped).
const RATE: f64 = 200.0;
/// Bytes of each memoized response.
const VALUE_BYTES: u64 = 1000;
/// Bytes a memo entry keeps, as typed: the response (1000), its key's bytes
/// ("request-%08d": 16) and its slot's share of the buckets (a `bucket<string,[]uint8>` is
/// 336 B for 8 slots, the map between 6.5/8 and 3.25/8 full: 52–103 B; 60 taken).
const ENTRY_BYTES: f64 = (VALUE_BYTES + 16 + 60) as f64;

/// The fixture built with `flags` (a build of its own per variant, once per run).
fn go_holds(variant: &str, flags: &[&str]) -> PathBuf {
    let name = format!("holds_go-{variant}");
    built_once(&name, |dir| {
        run_build_step(
            Command::new("go")
                .arg("build")
                .args(flags)
                .arg("-o")
                .arg(dir.join("go-holds"))
                .arg(".")
                .current_dir(fixture_source("runtimes").join("go-holds"))
                .env("CGO_ENABLED", "0")
                .env("GOCACHE", dir.join("gocache"))
                .env("GOFLAGS", "-mod=mod")
                .env("GO111MODULE", "on"),
            "go build",
        );
    })
    .join("go-holds")
}

/// Record the fixture at `bin` (its arguments after the rate and size: `more`) with
/// `--heap-census` for 10 s: the report, report.md, a context.
fn record(name: &str, bin: &Path, more: &[&str]) -> (Report, String, String, OutDir) {
    let out = OutDir::new(name);
    let mut cmd = Command::new(bin);
    cmd.args([RATE.to_string(), VALUE_BYTES.to_string()]).args(more);
    let o = record_launch(&out, &["--heap-census", "--duration", "10s"], cmd);
    o.assert_success();
    let r = Report::load(&out.path);
    let md = std::fs::read_to_string(out.file("report.md")).unwrap_or_default();
    let holds = md.find("## What holds it").map(|i| md[i..].split("\n## ").next().unwrap_or("").to_string());
    let ctx = format!(
        "report {}:\nverdict: {}\nholder: {}\nroots: {:#}\nerrors: {}\n{}\nleaktrace stderr:\n{}",
        out.path.display(),
        r.json["verdict"]["summary"],
        r.json["verdict"]["holder"],
        r.json["runtime_holds"]["go"]["roots"],
        r.json["runtime_holds"]["go"]["errors"],
        holds.unwrap_or_else(|| "(no What holds it section)".into()),
        o.stderr
    );
    (r, md, ctx, out)
}

/// The memo named with its growth (entries and retained bytes within 20 % of the fixture's), the
/// bounded map listed as not growing, the verdict naming the map.
fn assert_memo_named(name: &str, bin: &Path) {
    let (r, md, ctx, _out) = record(name, bin, &[]);
    let go = &r.json["runtime_holds"]["go"];
    let roots = go["roots"].as_array().cloned().unwrap_or_default();
    let root = |n: &str| roots.iter().find(|x| x["name"] == n).cloned();
    let memo = root("main.memo").unwrap_or_else(|| panic!("main.memo is not among the roots\n{ctx}"));
    assert_eq!(roots[0]["name"], "main.memo", "the memo grows fastest\n{ctx}");
    assert_eq!(memo["type"], "map[string][]byte", "{ctx}");
    assert_eq!(memo["growing"], true, "{ctx}");
    let (entries, retained) = (f64_of(&memo, "entries_per_s"), f64_of(&memo, "retained_bytes_per_s"));
    eprintln!("{name}: main.memo {entries:.1} entries/s, retains {retained:.0} B/s");
    assert_within("main.memo entries/s", entries, RATE, 0.20, &ctx);
    assert_within("main.memo retained B/s", retained, RATE * ENTRY_BYTES, 0.20, &ctx);
    let sessions = root("main.sessions").unwrap_or_else(|| panic!("the bounded map is not listed\n{ctx}"));
    assert_eq!(sessions["growing"], false, "the bounded map is not a leak\n{ctx}");
    assert_eq!(u64_of(&sessions, "entries_end"), 256, "{ctx}");
    assert_eq!(u64_of(&sessions, "entries_start"), 256, "{ctx}");
    assert!(roots.iter().filter(|x| x["growing"] == true).count() == 1, "only the memo grows\n{ctx}");
    assert!(go["walk_end"]["cut"].is_null(), "the walk was cut short\n{ctx}");
    let holder = r.json["verdict"]["holder"].as_str().unwrap_or("");
    assert!(holder.starts_with("`main.memo` (map[string][]byte) +"), "verdict.holder: {holder}\n{ctx}");
    assert!(holder.contains(" entries/s, retains +"), "verdict.holder: {holder}\n{ctx}");
    // report.md's "What holds it": each root's line, then its path to its type.
    let line =
        |name: &str| md.lines().find(|l| l.starts_with(&format!("- **`{name}`** (package variable, go): holds ")));
    let memo = line("main.memo").unwrap_or_else(|| panic!("report.md\n{ctx}"));
    assert!(memo.contains("**growing**"), "report.md\n{ctx}");
    assert!(md.contains("path: `main.memo (package variable) → map[string][]byte`"), "report.md\n{ctx}");
    let sessions = line("main.sessions").unwrap_or_else(|| panic!("report.md\n{ctx}"));
    assert!(sessions.contains("holds 256 entries") && sessions.contains("not growing"), "report.md\n{ctx}");
    assert!(md.contains("path: `main.sessions (package variable) → map[int]*main.session`"), "report.md\n{ctx}");
}

/// Go 1.19, `go build` with the toolchain's defaults (optimized, not position-independent).
#[test]
fn go_map_memo_named_default_build() {
    require_root();
    assert_memo_named("holds-go-memo", &go_holds("default", &[]));
}

/// Go 1.19 without optimizations or inlining (`-gcflags=all=-N -l`, as under a debugger).
#[test]
fn go_map_memo_named_without_optimizations() {
    require_root();
    assert_memo_named("holds-go-memo-nl", &go_holds("nl", &["-gcflags=all=-N -l"]));
}

/// Go 1.19 as a position-independent executable (`-buildmode=pie`: the link addresses of the
/// variables and type descriptors are shifted by the load bias).
#[test]
fn go_map_memo_named_pie() {
    require_root();
    assert_memo_named("holds-go-memo-pie", &go_holds("pie", &["-buildmode=pie"]));
}

/// A stripped binary (`-ldflags=-s -w`: no symbols, no DWARF): one line says why there is no
/// path, the recording and its verdict are whole, nothing else is claimed.
#[test]
fn go_stripped_binary_says_why_no_path() {
    require_root();
    let (r, md, ctx, _out) = record("holds-go-stripped", &go_holds("stripped", &["-ldflags=-s -w"]), &[]);
    let go = &r.json["runtime_holds"]["go"];
    let errors: Vec<&str> =
        go["errors"].as_array().map(|a| a.iter().filter_map(|e| e.as_str()).collect()).unwrap_or_default();
    let why = "no path from the package variables to the Go heap: the executable has no DWARF (built with -ldflags='-s -w' or '-w')";
    assert_eq!(errors.iter().filter(|e| **e == why).count(), 1, "{ctx}");
    assert_eq!(md.matches(why).count(), 1, "report.md says it once\n{ctx}");
    assert!(go["roots"].as_array().is_some_and(|a| a.is_empty()), "{ctx}");
    assert!(r.json["verdict"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "no verdict\n{ctx}");
    assert!(!r.json["verdict"]["holder"].as_str().unwrap_or("").contains("main.memo"), "{ctx}");
}

/// Bytes a ledger entry keeps: its 1000-byte array and its share of the `[][]byte` backing
/// array (24 B a slot, `cap` between 1 and 2 times `len`: 24–48 B; 36 taken).
const LEDGER_ENTRY_BYTES: f64 = (VALUE_BYTES + 36) as f64;

/// The ledger, reached only from `main.main`'s local `l` (the main goroutine, started at
/// `runtime.main`), named by its frame's function and the local, growing as the fixture appends
/// to it; the memo still named beside it.
fn assert_local_named(name: &str, bin: &Path) {
    let (r, md, ctx, _out) = record(name, bin, &["local"]);
    let go = &r.json["runtime_holds"]["go"];
    let roots = go["roots"].as_array().cloned().unwrap_or_default();
    let l = roots
        .iter()
        .find(|x| x["name"] == "main.main.l")
        .cloned()
        .unwrap_or_else(|| panic!("main.main.l is not among the roots\n{ctx}"));
    assert_eq!(l["kind"], "goroutine local", "{ctx}");
    assert_eq!(l["type"], "*main.ledger", "{ctx}");
    assert_eq!(l["goroutines"], 1, "{ctx}");
    assert_eq!(l["started_at"], "runtime.main", "{ctx}");
    assert_eq!(l["growing"], true, "{ctx}");
    let retained = f64_of(&l, "retained_bytes_per_s");
    eprintln!("{name}: main.main.l retains {retained:.0} B/s");
    assert_within("main.main.l retained B/s", retained, RATE * LEDGER_ENTRY_BYTES, 0.20, &ctx);
    let memo = roots.iter().find(|x| x["name"] == "main.memo").cloned().unwrap_or_default();
    assert_eq!(memo["kind"], "package variable", "{ctx}");
    assert_eq!(memo["growing"], true, "{ctx}");
    assert!(go["walk_end"]["goroutines"].as_u64().is_some_and(|g| g >= 1), "{ctx}");
    let l = md.lines().find(|l| l.starts_with("- **`main.main.l`** (goroutine local, go): holds "));
    let l = l.unwrap_or_else(|| panic!("report.md\n{ctx}"));
    assert!(l.contains("(a local of 1 goroutine started at runtime.main)") && l.contains("**growing**"), "{ctx}");
    assert!(md.contains("path: `main.main.l (goroutine local) → *main.ledger`"), "report.md\n{ctx}");
}

/// Go 1.19 as the toolchain builds by default: `l` is spilled to `main.main`'s frame across
/// the calls it is parked in, its location list says where.
#[test]
fn go_local_root_named_default_build() {
    require_root();
    assert_local_named("holds-go-local", &go_holds("default", &[]));
}

/// Go 1.19 without optimizations: `l` has its frame slot for all its scope.
#[test]
fn go_local_root_named_without_optimizations() {
    require_root();
    assert_local_named("holds-go-local-nl", &go_holds("nl", &["-gcflags=all=-N -l"]));
}

/// Go 1.19 as a position-independent executable: the pcs and the frames' tables shifted by the
/// load bias.
#[test]
fn go_local_root_named_pie() {
    require_root();
    assert_local_named("holds-go-local-pie", &go_holds("pie", &["-buildmode=pie"]));
}
