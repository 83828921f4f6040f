//! Managed runtimes: for Python, the JVM, Go and Node, two workloads each whose truth is known —
//! one grows the runtime's managed heap, the other native or off-heap memory — traced by
//! `leaktrace record -- CMD`. Each test asserts the runtime detected, that the right kind of
//! memory grows (at the expected rate where the bytes are known exactly) and that the other kinds
//! stay flat: their steady-window slope below [`FLAT_SHARE`] of the growing kind's. This file holds
//! Python and Go; runtimes_jvm.rs and runtimes_node.rs the JVM and Node; their shared helpers are
//! in tests/src/runtimes.rs.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use leaktrace_tests::runtimes::*;
use leaktrace_tests::*;

/// libcleak.so: parse_record mallocs and never frees.
fn cleak() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        built_once("runtimes-cleak", |dir| {
            check(
                Command::new("gcc")
                    .args(["-O1", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o"])
                    .arg(dir.join("libcleak.so"))
                    .arg(src("cleak.c")),
                "gcc",
            );
        })
        .join("libcleak.so")
    })
}

/// The directory holding pymem_ext*.so (pymem_ext.c built against the test's python3).
fn pymem_ext() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        built_once("runtimes-pymem_ext", |dir| {
            let cfg = |var: &str| {
                let o = Command::new(python())
                    .args([
                        "-c",
                        &format!(
                            "import sysconfig; print(sysconfig.get_config_var('{var}') or sysconfig.get_paths()['include'])"
                        ),
                    ])
                    .output()
                    .expect("python3");
                String::from_utf8_lossy(&o.stdout).trim().to_string()
            };
            let include = cfg("INCLUDEPY");
            let suffix = cfg("EXT_SUFFIX");
            check(
                Command::new("gcc")
                    .args(["-O2", "-g", "-shared", "-fPIC", "-I", &include, "-o"])
                    .arg(dir.join(format!("pymem_ext{suffix}")))
                    .arg(src("pymem_ext.c")),
                "gcc (pymem_ext.c)",
            );
        })
    })
}

/// The Go fixture tests/fixtures/runtimes/NAME built with `go build` (cgo on or off), once per
/// run ([`built_once`]: `runtimes-NAME`, with its own GOCACHE inside).
fn go_build(name: &str, cgo: bool) -> PathBuf {
    built_once(&format!("runtimes-{name}"), |dir| {
        check(
            Command::new("go")
                .args(["build", "-o"])
                .arg(dir.join(name))
                .arg(".")
                .current_dir(src(name))
                .env("CGO_ENABLED", if cgo { "1" } else { "0" })
                .env("GOCACHE", dir.join("gocache"))
                .env("GOFLAGS", "-mod=mod")
                .env("GO111MODULE", "on"),
            "go build",
        );
    })
    .join(name)
}

fn go_cgo() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| go_build("go-cgo", true))
}

fn go_pure() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| go_build("go-pure", false))
}

// ----------------------------------------------------------------------------------------------
// Python

#[test]
fn python_objects_grow_the_python_heap() {
    require_root();
    let mut cmd = Command::new(python());
    cmd.arg(src("grow.py")).args(["managed", "6000"]);
    let (r, ctx, _out) = record("py-managed", cmd);
    assert_runtime(&r, "python", &ctx);
    // A dict with a string, an int list: several hundred bytes per iteration.
    let g = assert_grows(&r, "managed", 500_000.0, &ctx);
    assert_flat(&r, &["native", "off-heap"], g, &ctx);
    assert_verdict_starts(&r, "managed leak: the Python heap grows", &ctx);
}

#[test]
fn python_c_library_leak_is_native() {
    require_root();
    let mut cmd = Command::new(python());
    cmd.arg(src("grow.py")).args(["native", "5000"]).env("CLEAK", cleak());
    let (r, ctx, _out) = record("py-native", cmd);
    assert_runtime(&r, "python", &ctx);
    let g = assert_grows(&r, "native", 0.8 * 5_000_000.0, &ctx);
    assert!(g < 1.2 * 5_000_000.0, "native grows {g:.0} B/s, expected 5000 × 1000 B/s ± 20%\n{ctx}");
    assert_flat(&r, &["managed", "off-heap"], g, &ctx);
    let top = top_site_of_kind(&r, "native", &ctx);
    assert_eq!(top["function"], "parse_record", "the top native site\n{ctx}");
    assert_eq!(top["class"], "leak", "parse_record's class\n{ctx}");
    // libcleak.so is a plain C library called through ctypes.CDLL, not a C extension.
    assert_eq!(top["memory_origin"], "libcleak.so via ctypes", "parse_record's origin\n{ctx}");
    assert_verdict_starts(&r, "native leak in parse_record (libcleak.so via ctypes), Python heap flat", &ctx);
}

/// Debian's CPython 3.11: the interpreter statically linked into the executable, built with LTO.
const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

/// An extension leaking PyMem_Malloc blocks (pymalloc: no malloc call) under `interpreter`
/// (pymem_ext built against pyenv's 3.11; Debian's 3.11 loads it too, same ABI): with
/// --pymalloc the leaking function is named, its leaking sites grow leaked bytes / loop seconds
/// ± 10 % (the script prints both) and hold the leaked bytes ± 10 %, the balanced objects are
/// no leak, and no note says to bypass pymalloc; without --pymalloc the site is invisible, the
/// Python heap's arenas grow, and the verdict and a note say what --pymalloc or
/// PYTHONMALLOC=malloc would show.
fn pymem_leak_named_with_pymalloc_hooks(tag: &str, interpreter: &Path) {
    require_root();
    assert!(interpreter.exists(), "{} is not installed", interpreter.display());
    let run = |name: &str, extra: &[&str], rate: &str| {
        let out = OutDir::new(name);
        let mut cmd = Command::new(interpreter);
        cmd.arg(src("pymem_leak.py")).arg(pymem_ext()).args([rate, "6"]);
        let o = record_launch(&out, extra, cmd);
        o.assert_success();
        let said = |key: &str| -> f64 {
            o.stdout
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name}: no {key} line\n{}", o.describe()))
        };
        let (leaked, elapsed) = (said("leaked_bytes"), said("elapsed"));
        let ctx = format!("{}\nreport: {}", o.describe(), out.path.display());
        (Report::load(&out.path), out, leaked, elapsed, ctx)
    };
    let pymalloc_note = |r: &Report| warnings_with(r, "PYTHONMALLOC=malloc").len();
    let (r, out, leaked, elapsed, ctx) = run(&format!("py-pymalloc-{tag}"), &["--pymalloc"], "200");
    assert!(leaked > 100.0 * 512.0, "the workload leaked only {leaked} B\n{ctx}");
    let sites = r.sites_of("split_fields");
    assert!(!sites.is_empty(), "no split_fields site\n{ctx}");
    let live: f64 = sites.iter().map(|s| u64_of(s, "live_bytes") as f64).sum();
    assert_within("split_fields live bytes", live, leaked, 0.10, &ctx);
    let leaking: Vec<&&Value> = sites.iter().filter(|s| str_of(s, "class") == "leak").collect();
    assert!(!leaking.is_empty(), "no split_fields site is classified leak\n{ctx}");
    let rate: f64 = leaking.iter().map(|s| f64_of(s, "growth_bytes_per_s")).sum();
    let truth = leaked / elapsed;
    eprintln!("py-pymalloc-{tag}: split_fields grows {rate:.0} B/s (truth {truth:.0} B/s)");
    assert_within("split_fields growth (B/s)", rate, truth, 0.10, &ctx);
    // The balanced objects the workload makes (strings, ints, tuples) hold nothing that grows.
    for s in r.sites().iter().filter(|s| str_of(s, "class") == "leak") {
        let frames = s["frames"].as_array().unwrap();
        assert!(
            frames.iter().any(|f| f["function"].as_str() == Some("split_fields")),
            "a leak site outside split_fields: {}\n{ctx}",
            str_of(s, "function")
        );
    }
    assert_eq!(pymalloc_note(&r), 0, "a note says to bypass pymalloc although --pymalloc hooks it\n{ctx}");
    let verdict = str_of(&r.json["verdict"], "summary");
    assert!(!verdict.contains("record with --pymalloc"), "{verdict}\n{ctx}");
    drop(out);
    // Ten times the rate: 512 kB/s of leaked blocks, a new 1 MiB arena every 2 s (at 51 kB/s
    // the 6 s run's steady window may see no arena mapped, and the Python heap flat).
    let (r, _out, _, _, ctx) = run(&format!("py-no-pymalloc-{tag}"), &[], "2000");
    assert!(r.sites_of("split_fields").is_empty(), "split_fields seen without --pymalloc?\n{ctx}");
    assert_eq!(pymalloc_note(&r), 1, "no PYTHONMALLOC=malloc note\n{ctx}");
    let verdict = str_of(&r.json["verdict"], "summary");
    assert!(
        verdict.starts_with("managed leak: the Python heap grows")
            && verdict.contains(
                "pymalloc's arenas (_PyObject_ArenaMmap) grow and pymalloc was not hooked: record with \
                 --pymalloc (or run the target with PYTHONMALLOC=malloc) to name the function and line that allocate"
            ),
        "the verdict does not say what --pymalloc would show: {verdict}\n{ctx}"
    );
}

#[test]
fn python_pymem_leak_named_with_pymalloc_hooks() {
    pymem_leak_named_with_pymalloc_hooks("pyenv", python());
}

/// Debian's LTO build inlines pymalloc into its own C API, but an extension's PyMem_Malloc and
/// PyMem_Free are calls to the exported functions, which --pymalloc hooks.
#[test]
fn python_pymem_leak_debian_static_311() {
    pymem_leak_named_with_pymalloc_hooks("debian", Path::new(DEBIAN_PYTHON));
}

/// A leak that the interpreter's finalization releases. teardown_leak.py calls
/// pymem_ext.remember_session(1000) 100 times a second for 8 s (blocks malloc'd into a registry
/// freed by a Py_AtExit handler inside Py_FinalizeEx) and ends normally, without os._exit. Judged
/// on the checkpoints up to the teardown (caught at Py_FinalizeEx), remember_session is a leak
/// at 100,000 B/s ± 25 %, and the report says finalization freed its blocks; the 8 KiB bytes
/// object made and dropped at every call is not a leak.
#[test]
fn python_leak_released_at_finalization_is_a_leak() {
    require_root();
    let out = OutDir::new("py-teardown");
    let mut cmd = Command::new(python());
    cmd.arg(src("teardown_leak.py")).arg(pymem_ext()).args(["100", "8"]);
    let o = record_launch(&out, &[], cmd);
    o.assert_success();
    assert!(o.stdout.contains("done"), "teardown_leak.py did not run to its end\n{}", o.describe());
    let r = Report::load(&out.path);
    let ctx = format!("{}\nreport {}:\n{}", o.describe(), out.path.display(), r.summary());
    let verdict = r.get(&["verdict"]);
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    let summary = str_of(verdict, "summary");
    assert!(summary.contains("remember_session"), "{ctx}");
    assert!(summary.contains("released only at exit"), "{ctx}");
    // The interpreter's adaptive specialization can give the same call two stacks: sum them.
    let leaking: Vec<&Value> =
        r.sites_of("remember_session").into_iter().filter(|s| str_of(s, "class") == "leak").collect();
    assert!(!leaking.is_empty(), "no remember_session leak site\n{ctx}");
    let rate: f64 = leaking.iter().map(|s| f64_of(s, "growth_bytes_per_s")).sum();
    assert_within("remember_session growth (B/s)", rate, 100_000.0, 0.25, &ctx);
    let freed = r.get(&["freed_at_exit", "sites"]).as_array().cloned().unwrap_or_default();
    let freed_blocks: u64 = freed
        .iter()
        .filter(|s| s["function"] == "remember_session" && s["class"] == "leak")
        .map(|s| u64_of(s, "blocks"))
        .sum();
    let live_blocks: u64 = leaking.iter().map(|s| u64_of(s, "live_allocations")).sum();
    assert!(live_blocks >= 600, "{live_blocks} remember_session blocks live at the teardown\n{ctx}");
    assert_eq!(freed_blocks, live_blocks, "finalization freed every remember_session block\n{ctx}");
    for s in r.sites().iter().filter(|s| str_of(s, "class") == "leak") {
        assert_eq!(str_of(s, "function"), "remember_session", "another site called a leak\n{ctx}");
    }
}

/// The pymem extension leak on Debian's statically linked /usr/bin/python3.11 without
/// --pymalloc: the interpreter is in the executable, which has no .symtab, so
/// `_PyObject_ArenaMmap` and pymalloc are unnamed frames (`python3.11+0x22d099`); the arenas
/// they map, below the exported `PyMem_Malloc` in the executable, are still the Python heap.
/// Verdict: a managed leak of the Python heap at the leak's rate (leaked bytes / 10 s, ±20 %),
/// never "no leak", and off-heap memory does not grow (it was classed off-heap, and the verdict
/// said "no leak" while off-heap grew).
#[test]
fn python_pymem_leak_on_static_python_is_the_python_heap() {
    require_root();
    const SECONDS: f64 = 10.0;
    let mut cmd = Command::new("/usr/bin/python3.11");
    cmd.arg(src("pymem_leak.py")).arg(pymem_ext()).args(["200", &SECONDS.to_string()]);
    let out = OutDir::new("py-static-pymem");
    let o = record_launch(&out, &[], cmd);
    o.assert_success();
    let leaked: f64 = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("leaked_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no leaked_bytes line\n{}", o.describe()));
    let r = Report::load(&out.path);
    let ctx = format!(
        "report {}:\nverdict: {}\nby kind: {:#}\n{}",
        out.path.display(),
        r.json["verdict"],
        r.get(&["summary", "by_kind"]),
        o.describe()
    );
    assert!(leaked > 400.0 * 512.0, "the workload leaked only {leaked} B\n{ctx}");
    let verdict = r.get(&["verdict"]);
    let summary = str_of(verdict, "summary");
    assert_eq!(str_of(verdict, "class"), "leak", "{ctx}");
    assert!(summary.starts_with("managed leak: the Python heap grows"), "{ctx}");
    assert!(!summary.contains("no leak"), "{ctx}");
    let managed = assert_grows(&r, "managed", 0.0, &ctx);
    assert_within("Python heap growth (B/s)", managed, leaked / SECONDS, 0.20, &ctx);
    assert_ne!(kind(&r, "off-heap", &ctx)["grows"].as_bool(), Some(true), "off-heap grows\n{ctx}");
    // The arenas mapped from the executable's unnamed frames are managed, none off-heap.
    let unnamed_exe_maps: Vec<&Value> = r
        .sites()
        .iter()
        .filter(|s| str_of(s, "kind") == "mmap")
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .skip(1)
                .find(|f| !f["object"].as_str().unwrap_or("").contains("libc"))
                .is_some_and(|f| f["object"] == "/usr/bin/python3.11" && f["function"].is_null())
        })
        .collect();
    assert!(!unnamed_exe_maps.is_empty(), "no mapping from the executable's unnamed frames\n{ctx}");
    for s in unnamed_exe_maps {
        assert_eq!(str_of(s, "memory_kind"), "managed", "{}\n{ctx}", s["frames"]);
    }
}

// ----------------------------------------------------------------------------------------------
// Go

#[test]
fn go_map_grows_the_go_heap() {
    require_root();
    let mut cmd = Command::new(go_cgo());
    cmd.args(["managed", "5000"]);
    let (r, ctx, _out) = record("go-managed", cmd);
    assert_runtime(&r, "go", &ctx);
    let g = assert_grows(&r, "managed", 0.4 * 5_000_000.0, &ctx);
    assert_flat(&r, &["native", "off-heap"], g, &ctx);
    assert_verdict_starts(&r, "managed leak: the Go heap grows", &ctx);
}

#[test]
fn go_cstring_never_freed_is_native() {
    require_root();
    let mut cmd = Command::new(go_cgo());
    cmd.args(["native", "5000"]);
    let (r, ctx, out) = record("go-native", cmd);
    assert_runtime(&r, "go", &ctx);
    let g = assert_grows(&r, "native", 0.8 * 5_000_000.0, &ctx);
    assert!(g < 1.2 * 5_000_000.0, "native grows {g:.0} B/s, expected 5000 × 1000 B/s ± 20%\n{ctx}");
    assert_flat(&r, &["managed", "off-heap"], g, &ctx);
    // The walk crosses cgo's switch to the system stack: the Go function that called
    // C.CString (inlined into main.main by the compiler, named from DWARF) is the culprit, and
    // the stack goes on to the goroutine's start.
    let top = top_site_of_kind(&r, "native", &ctx);
    assert_eq!(str_of(top, "function"), "main.lookupRoute", "the Go caller of C.CString is the culprit\n{ctx}");
    let frames: Vec<&str> = top["frames"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).collect();
    let at = |name: &str| frames.iter().position(|f| *f == name);
    assert!(
        at("runtime.asmcgocall") < at("main._Cfunc_CString") && at("main._Cfunc_CString") < at("main.lookupRoute"),
        "stack through the switch: {frames:?}\n{ctx}"
    );
    assert!(frames.contains(&"runtime.goexit"), "stack to the goroutine's start: {frames:?}\n{ctx}");
    assert!(top["stack_truncated"].is_null(), "{frames:?}\n{ctx}");
    assert_eq!(top["frees"], 0, "the freed copies of normalize() are another site\n{ctx}");
    assert_verdict_starts(&r, "native leak in main.lookupRoute", &ctx);
    // The leak-pattern catalog: C.CString's result must be released with C.free, in report.json,
    // the verdict and report.md.
    assert_eq!(top["likely_missing_release"]["release"], "C.free", "{ctx}");
    let summary = str_of(&r.json["verdict"], "summary");
    assert!(summary.contains("likely missing C.free"), "the verdict does not name C.free: {summary}\n{ctx}");
    let md = std::fs::read_to_string(out.file("report.md")).expect("report.md");
    assert!(
        md.contains("whose result must be released with C.free: likely missing"),
        "report.md: no C.free pattern\n{ctx}"
    );
    // The decoy: the same cgo malloc from normalize(), freed each call, is its own stack, and
    // no leak site passes through it (nor does any site through it carry a hint).
    let rec: Value = serde_json::from_slice(&std::fs::read(out.path.join("recording.json")).unwrap()).unwrap();
    let through =
        |st: &Value, name: &str| st["frames"].as_array().unwrap().iter().any(|f| f["function"].as_str() == Some(name));
    assert!(
        rec["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|st| through(st, "main.normalize") && !through(st, "main.lookupRoute")),
        "no stack of normalize's C.CString\n{ctx}"
    );
    for s in r.sites().iter().filter(|s| s["class"] == "leak") {
        assert!(!through(s, "main.normalize"), "normalize's freed copies flagged: {s:#}\n{ctx}");
    }
    for s in r.sites().iter().filter(|s| through(s, "main.normalize")) {
        assert!(s["likely_missing_release"].is_null(), "normalize's freed copies get a hint: {s:#}\n{ctx}");
    }
}

#[test]
fn go_without_cgo_is_traced_through_its_mappings() {
    require_root();
    let mut cmd = Command::new(go_pure());
    cmd.arg("5000");
    let (r, ctx, _out) = record("go-pure", cmd);
    assert_runtime(&r, "go", &ctx);
    assert!(r.json["probes"].as_array().is_some_and(|p| p.is_empty()), "no malloc to probe in a pure-Go binary\n{ctx}");
    let g = assert_grows(&r, "managed", 0.4 * 5_000_000.0, &ctx);
    assert_flat(&r, &["native", "off-heap"], g, &ctx);
}
