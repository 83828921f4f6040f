//! A real program nobody here wrote: CPython (with a shared libpython) growing a list of 1 KiB
//! bytes objects, traced by `leaktrace record --pid PID` until the script says it is done (then
//! SIGINT ends the recording: the test does not depend on how fast a loaded machine runs it).
//!
//! Python frames: a C extension built -O2 without frame pointers leaks the strdup'd
//! copy of every record (tsparse_ext.parse_record), called from Python code whose lines the test
//! reads from the script; the leaking site's stack names the Python functions and lines in
//! place of the eval loop, in report.json, report.md, stacks.folded and live.svg, under pyenv's
//! shared-libpython 3.11 (exact and sampled), 3.8, 3.9, 3.10, 3.12 and 3.13, and Debian's statically linked
//! /usr/bin/python3.11.
//!
//! A missing Py_DECREF (tagsum_ext.tag_checksum, pymalloc objects, with --pymalloc and
//! --python-frames on) is named by the extension's function, with the Python caller's line and
//! the growth rate, under both 3.11 interpreters (Debian's with PYTHONMALLOC=malloc: see there).
//!
//! Threads without the GIL: a strdup leak through ctypes.CDLL (which releases the GIL around
//! the call) names the Python function and line that make the call, with its rate, under pyenv's
//! 3.11, 3.9 and 3.8 and Debian's static 3.11; with two Python threads (a leaking one and a
//! decoy that frees what it allocates) each thread's blocks carry its own Python frames (3.8,
//! 3.10, 3.11, 3.12, 3.13, and 3.11 in a PID namespace).
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use leaktrace_tests::*;

const OBJECTS: u64 = 10_000;

#[test]
fn python_list_growth_traced_into_libpython() {
    require_root();
    let fx = fixtures();
    let mut cmd = Command::new(python());
    cmd.arg(&fx.grow_list_py).args([&OBJECTS.to_string(), "10000"]).env("WAIT_FOR_SIGNAL", "1").env("LINGER_S", "30");
    let target = Target::spawn(cmd);
    target.expect_pid_line();

    let out = OutDir::new("python");
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--interval", "500ms", "--out"]);
    lt.arg(&out.path);
    let mut running = Running::spawn(lt, None);
    running.wait_for_stderr_line("leaktrace: attached", Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
    target.signal(libc::SIGUSR1);
    let done = wait_for(Duration::from_secs(90), || {
        target.next_line(Duration::from_millis(500)).filter(|l| l.starts_with("done"))
    });
    assert!(done.is_some(), "the python script did not finish growing its list in 90 s");
    // One more checkpoint with everything live, then stop.
    std::thread::sleep(Duration::from_millis(1200));
    running.signal(libc::SIGINT);
    let o = running.wait(TIMEOUT);
    o.assert_success();
    assert!(target.exit_status().is_none(), "python exited before the end of the recording");
    assert_outputs_exist(&out.path);

    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}", out.path.display(), r.summary());
    let python_frames: Vec<&Value> = r
        .sites()
        .iter()
        .flat_map(|s| s["frames"].as_array().into_iter().flatten())
        .filter(|f| {
            f["object"].as_str().is_some_and(|o| o.contains("libpython"))
                && f["function"].as_str().is_some_and(|n| !n.is_empty())
        })
        .collect();
    assert!(!python_frames.is_empty(), "no frame in libpython with a function name\n{ctx}");

    // The 10 000 objects of 1 KiB (+ object header) are live at the end.
    let live: u64 = r.sites().iter().map(|s| u64_of(s, "live_bytes")).sum();
    let expected = OBJECTS * 1024;
    assert!(live >= expected * 9 / 10, "live bytes {live} < 90% of {expected}\n{ctx}");
    // The largest site is reached through libpython, and its culprit is named.
    let top = &r.sites()[0];
    assert!(!str_of(top, "function").is_empty(), "largest site has no culprit name\n{ctx}");
    assert!(
        top["frames"].as_array().unwrap().iter().any(|f| f["object"].as_str().is_some_and(|o| o.contains("libpython"))),
        "the largest site has no libpython frame\n{ctx}"
    );
    let t = r.get(&["target"]);
    assert_eq!(t["pid"].as_u64(), Some(target.pid as u64));
    assert_eq!(t["launched"].as_bool(), Some(false));
    assert_eq!(r.get(&["end_reason"]).as_str(), Some("signal"), "ended by SIGINT\n{ctx}");
}

/// Debian's CPython 3.11: the interpreter statically linked into the executable.
const DEBIAN_PYTHON: &str = "/usr/bin/python3.11";

/// pyenv's CPython 3.10 (shared libpython).
const PYENV_310: &str = "/root/.pyenv/versions/3.10.13/bin/python3.10";

/// pyenv's CPython 3.8 and 3.9 (shared libpython).
const PYENV_38: &str = "/root/.pyenv/versions/3.8.18/bin/python3.8";
const PYENV_39: &str = "/root/.pyenv/versions/3.9.18/bin/python3.9";

/// pyenv's CPython 3.13 (shared libpython).
const PYENV_313: &str = "/root/.pyenv/versions/3.13.0/bin/python3.13";

/// pyenv's CPython 3.12 (shared libpython).
const PYENV_312: &str = "/root/.pyenv/versions/3.12.1/bin/python3.12";

/// The directory holding tsparse_ext*.so built -O2 without frame pointers against the test's
/// python3, which must be 3.11 (the extension is loaded by Debian's 3.11 too: same ABI).
fn tsparse_ext_311() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| tsparse_ext_for(python(), "3.11"))
}

/// tsparse_ext*.so built against `interpreter`'s headers, which must be CPython `version`.
fn tsparse_ext_for(interpreter: &Path, version: &str) -> PathBuf {
    extension_for("tsparse_ext", interpreter, version)
}

/// The directory holding `name`*.so (tests/fixtures/runtimes/`name`.c built -O2 without frame
/// pointers) built against `interpreter`'s headers, which must be CPython `version`; once per run
/// ([`built_once`]: `python-NAME-VERSION`, one interpreter per version here).
fn extension_for(name: &str, interpreter: &Path, version: &str) -> PathBuf {
    built_once(&format!("python-{name}-{version}"), |dir| {
        let cfg = |var: &str| {
            let o = Command::new(interpreter)
                .args(["-c", &format!("import sysconfig; print(sysconfig.get_config_var('{var}'))")])
                .output()
                .expect("python3");
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        let (include, suffix, found) = (cfg("INCLUDEPY"), cfg("EXT_SUFFIX"), cfg("py_version_short"));
        assert_eq!(found, version, "{} is not CPython {version}", interpreter.display());
        let o = Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-g", "-shared", "-fPIC", "-I", &include, "-o"])
            .arg(dir.join(format!("{name}{suffix}")))
            .arg(fixture_source("runtimes").join(format!("{name}.c")))
            .output()
            .expect("gcc");
        assert!(o.status.success(), "gcc {name}.c: {}", String::from_utf8_lossy(&o.stderr));
    })
}

/// The 1-based line of `script` that contains `text`.
fn script_line(script: &Path, text: &str) -> u64 {
    let src = std::fs::read_to_string(script).expect("read the script");
    src.lines().position(|l| l.contains(text)).map(|i| i as u64 + 1).unwrap_or_else(|| panic!("no `{text}` in script"))
}

/// Record pyframes_leak.py under `interpreter` (extra leaktrace options `extra`) and check that
/// the leak's stack reads strdup ← parse_record ← Handler.handle (line of the parse_record call)
/// ← serve (line of the handle call) ← <module>, in every output.
fn python_frames_name_the_callers(name: &str, interpreter: &Path, ext: &Path, version: &str, extra: &[&str]) -> Report {
    require_root();
    assert!(interpreter.exists(), "{} is not installed", interpreter.display());
    let script = fixture_source("runtimes").join("pyframes_leak.py");
    let leak_line = script_line(&script, "tsparse_ext.parse_record(rec)");
    let call_line = script_line(&script, "h.handle(i)");
    let out = OutDir::new(name);
    let mut cmd = Command::new(interpreter);
    cmd.arg(&script).arg(ext).arg("60");
    let mut args = vec!["--duration", "8s"];
    args.extend_from_slice(extra);
    let o = record_launch(&out, &args, cmd);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("{}\nreport {}:\n{}", o.describe(), out.path.display(), r.summary());
    assert!(
        r.json["warnings"].as_array().into_iter().flatten().any(|w| w.as_str().is_some_and(
            |w| w.starts_with(&format!("Python frames (function, file, line) read from CPython {version}"))
        )),
        "no note that Python frames are read\n{ctx}"
    );
    // The leak, named by the extension's function (the culprit stays native).
    let site = r
        .sites()
        .iter()
        .filter(|s| str_of(s, "function") == "parse_record")
        .max_by_key(|s| u64_of(s, "live_bytes"))
        .unwrap_or_else(|| panic!("no parse_record site\n{ctx}"));
    assert_eq!(str_of(site, "class"), "leak", "{ctx}");
    // A real extension module (its PyInit_tsparse_ext export, its name) keeps the label.
    assert_eq!(str_of(site, "memory_origin"), "C extension", "{ctx}");
    let frames = site["frames"].as_array().unwrap();
    let at = frames.iter().position(|f| f["function"] == "parse_record").expect("parse_record frame");
    // The Python frames after parse_record, in order (3.11+: right after it, the call being
    // specialized to a direct C call; 3.10: after the vectorcall helpers).
    let py: Vec<&Value> = frames[at + 1..].iter().filter(|f| f["kind"] == "python").collect();
    // Before 3.11 code objects have no qualified name.
    let handle = if ["3.8", "3.9", "3.10"].contains(&version) { "handle" } else { "Handler.handle" };
    let expect = [(handle, Some(leak_line)), ("serve", Some(call_line)), ("<module>", None)];
    assert_eq!(py.len(), expect.len(), "Python frames after parse_record: {py:?}\n{ctx}");
    for (f, (func, line)) in py.iter().zip(expect) {
        assert_eq!(f["function"], func, "{f}\n{ctx}");
        if let Some(line) = line {
            assert_eq!(f["line"].as_u64(), Some(line), "{func}'s line: {f}\n{ctx}");
        }
        assert!(str_of(f, "file").ends_with("pyframes_leak.py"), "{f}\n{ctx}");
    }
    assert!(
        !frames.iter().any(|f| f["function"] == "_PyEval_EvalFrameDefault"),
        "the eval loop's frames are still in the stack\n{ctx}"
    );
    assert!(frames[..at].iter().all(|f| f["kind"] == "native"), "{ctx}");
    // The same stack in the other outputs.
    let read = |f: &str| std::fs::read_to_string(out.path.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let handle = format!("{handle} (pyframes_leak.py:{leak_line})");
    let serve = format!("serve (pyframes_leak.py:{call_line});");
    let in_order = |l: &str| {
        let (s, h, p) = (l.find(&serve), l.find(&handle), l.find(";parse_record;"));
        matches!((s, h, p), (Some(s), Some(h), Some(p)) if s < h && h < p)
    };
    assert!(
        read("stacks.folded").lines().any(in_order),
        "no folded stack with `{serve}`, then `{handle}`, then parse_record\n{ctx}"
    );
    assert!(read("live.svg").contains(&handle), "no `{handle}` in live.svg\n{ctx}");
    assert!(read("report.md").contains(&format!("[py] {handle}")), "no `[py] {handle}` in report.md\n{ctx}");
    r
}

#[test]
fn python_frames_shared_libpython_311() {
    python_frames_name_the_callers("pyframes-pyenv", python(), tsparse_ext_311(), "3.11", &[]);
}

#[test]
fn python_frames_shared_libpython_311_sampled() {
    python_frames_name_the_callers(
        "pyframes-pyenv-sampled",
        python(),
        tsparse_ext_311(),
        "3.11",
        &["--sample-bytes", "4096"],
    );
}

#[test]
fn python_frames_debian_static_311() {
    python_frames_name_the_callers("pyframes-debian", Path::new(DEBIAN_PYTHON), tsparse_ext_311(), "3.11", &[]);
}

/// 3.10: frame objects (`f_lasti`, the PEP 626 line table), one eval-loop frame per Python frame.
#[test]
fn python_frames_shared_libpython_310() {
    let py = Path::new(PYENV_310);
    python_frames_name_the_callers("pyframes-310", py, &tsparse_ext_for(py, "3.10"), "3.10", &[]);
}

/// 3.12: the GIL holder is found through the main interpreter's GIL (`last_holder`), and the
/// C stack's shim frames are left out.
#[test]
fn python_frames_shared_libpython_312() {
    let py = Path::new(PYENV_312);
    python_frames_name_the_callers("pyframes-312", py, &tsparse_ext_for(py, "3.12"), "3.12", &[]);
}

/// 3.13: the offsets are the interpreter's own (`_Py_DebugOffsets`, said in the note), the
/// thread state holds the frame (`current_frame`), frames name their code in `f_executable`.
#[test]
fn python_frames_shared_libpython_313() {
    let py = Path::new(PYENV_313);
    let r = python_frames_name_the_callers("pyframes-313", py, &tsparse_ext_for(py, "3.13"), "3.13", &[]);
    let note =
        "Python frames (function, file, line) read from CPython 3.13's frame chain (offsets from its _Py_DebugOffsets)";
    assert!(
        r.json["warnings"].as_array().into_iter().flatten().any(|w| w.as_str().is_some_and(|w| w.starts_with(note))),
        "no note that the offsets are the interpreter's own: {}",
        r.json["warnings"]
    );
}

/// 3.9 and 3.8: frame objects as 3.10, with `f_lasti` in bytes and the `co_lnotab` line table.
#[test]
fn python_frames_shared_libpython_39() {
    let py = Path::new(PYENV_39);
    python_frames_name_the_callers("pyframes-39", py, &tsparse_ext_for(py, "3.9"), "3.9", &[]);
}

#[test]
fn python_frames_shared_libpython_38() {
    let py = Path::new(PYENV_38);
    python_frames_name_the_callers("pyframes-38", py, &tsparse_ext_for(py, "3.8"), "3.8", &[]);
}

/// A pure Python allocation (with --pymalloc and --python-frames on): the objects grow.py keeps in its list are made by
/// the interpreter for one line of the script, which is the culprit of their sites
/// (`<module> (grow.py:LINE)`), not an interpreter function. Attached once the script has
/// printed its PID (its imports are done): every object allocation is traced and slowed many
/// times over, and a launched recording of a few seconds on a loaded machine saw mostly the
/// imports' unmarshalled code objects. (--max-stacks: every object allocation is traced.)
#[test]
fn python_frames_name_the_line_of_a_pure_python_leak() {
    require_root();
    let script = fixture_source("runtimes").join("grow.py");
    let line = script_line(&script, "hoard.append(");
    let out = OutDir::new("pyframes-pure");
    let mut cmd = Command::new(python());
    cmd.arg(&script).args(["managed", "5000"]);
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--interval", "250ms"]);
    lt.args(["--pymalloc", "--python-frames", "on", "--max-stacks", "200000", "--duration", "8s", "--out"])
        .arg(&out.path);
    let o = Running::spawn(lt, None).wait(TIMEOUT);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("{}\nreport {}:\n{}", o.describe(), out.path.display(), r.summary());
    let want = format!("<module> (grow.py:{line})");
    let leaks: Vec<&Value> = r.sites().iter().filter(|s| str_of(s, "class") == "leak").collect();
    assert!(!leaks.is_empty(), "no leak site\n{ctx}");
    assert_eq!(str_of(leaks[0], "function"), want, "the largest leak's culprit\n{ctx}");
    let culprit = leaks[0]["culprit_frame"].as_u64().expect("culprit index") as usize;
    let f = &leaks[0]["frames"][culprit];
    assert_eq!((f["kind"].as_str(), f["line"].as_u64()), (Some("python"), Some(line)), "{f}\n{ctx}");
    // Most of the leaking bytes are this line's.
    let of_line: u64 = leaks.iter().filter(|s| str_of(s, "function") == want).map(|s| u64_of(s, "live_bytes")).sum();
    let all: u64 = leaks.iter().map(|s| u64_of(s, "live_bytes")).sum();
    assert!(of_line * 10 >= all * 8, "{of_line} of {all} leaking bytes are the line's\n{ctx}");
}

/// An interpreter whose version has no layout (pyenv's 3.7) with `--python-frames on`: one note
/// says so in the report and one line on stderr, the stacks stay native only, and the verdict
/// calls no positive rate flat without its reason.
#[test]
fn python_frames_unsupported_version_is_noted() {
    require_root();
    let py = Path::new("/root/.pyenv/versions/3.7.16/bin/python3.7");
    assert!(py.exists(), "{} is not installed", py.display());
    let out = OutDir::new("pyframes-37");
    let mut cmd = Command::new(py);
    cmd.args(["-c", "import time\nx = []\nfor i in range(200):\n    x.append(bytes(4000))\n    time.sleep(0.01)\n"]);
    let o = record_launch(&out, &["--duration", "4s", "--python-frames", "on"], cmd);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("{}\nreport {}", o.describe(), out.path.display());
    // Said while recording too: one stderr line.
    let said: Vec<&str> = o.stderr.lines().filter(|l| l.contains("Python frames are not read")).collect();
    assert_eq!(said.len(), 1, "{said:?}\n{ctx}");
    assert!(said[0].starts_with("leaktrace: PID ") && said[0].contains("CPython 3.7 is not supported"), "{}", said[0]);
    // The verdict never calls a positive rate flat without saying why.
    let verdict = str_of(&r.json["verdict"], "summary");
    for (i, _) in verdict.match_indices(" flat (+") {
        let part = &verdict[i..verdict[i..].find(')').map_or(verdict.len(), |e| i + e + 1)];
        assert!(
            part.contains("noise floor")
                || part.contains("not told apart from zero")
                || part.contains("too few points"),
            "a positive rate called flat without its reason: {part}\n{verdict}\n{ctx}"
        );
    }
    let notes: Vec<&str> = r.json["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w.as_str())
        .filter(|w| w.starts_with("Python frames"))
        .collect();
    assert_eq!(
        notes,
        [
            "Python frames are not read: CPython 3.7 is not supported (supported: 3.8, 3.9, 3.10, 3.11, 3.12, 3.13); stacks are native only"
        ],
        "{ctx}"
    );
    assert!(!r.sites().is_empty(), "no sites\n{ctx}");
    assert!(
        r.sites().iter().flat_map(|s| s["frames"].as_array().into_iter().flatten()).all(|f| f["kind"] == "native"),
        "a Python frame under 3.7\n{ctx}"
    );
}

/// The directory holding tagsum_ext*.so (tests/fixtures/runtimes/tagsum_ext.c) built against the
/// test's python3, which must be 3.11 (Debian's 3.11 loads it too: same ABI).
fn tagsum_ext_311() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| extension_for("tagsum_ext", python(), "3.11"))
}

/// Calls a second to each of tag_checksum and its decoy in decref_leak.py.
const DECREF_RATE: u64 = 400;

/// How long decref_leak.py runs once signalled.
const DECREF_SECONDS: u64 = 10;

/// Record interpreter `pid` (running a fixture script, `target`, that waits for SIGUSR1 and
/// prints `KEY VALUE` lines and "done") attached, with `extra` options, at a 250 ms interval into
/// `name`: the script is signalled once leaktrace has attached, its lines are read until "done"
/// (at most `seconds` + 90 s), and the recording ends with it. Returns the output directory,
/// leaktrace's output (asserted successful) and the script's lines.
fn record_signalled(
    name: &str,
    target: &Target,
    pid: u32,
    extra: &[&str],
    seconds: u64,
) -> (OutDir, Output, Vec<String>) {
    let out = OutDir::new(name);
    let mut lt = leaktrace(["record", "--pid", &pid.to_string(), "--interval", "250ms"]);
    lt.args(extra).arg("--out").arg(&out.path);
    let mut running = Running::spawn(lt, None);
    running.wait_for_stderr_line("leaktrace: attached", Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: kill has no memory-safety preconditions; `pid` is the interpreter, alive (it waits
    // for this signal).
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR1) };
    let mut lines = Vec::new();
    let done = wait_for(Duration::from_secs(seconds + 90), || {
        let l = target.next_line(Duration::from_millis(500))?;
        lines.push(l.clone());
        (l == "done").then_some(())
    });
    assert!(done.is_some(), "{name}: the script did not finish: {lines:?}");
    let o = running.wait(TIMEOUT);
    o.assert_success();
    (out, o, lines)
}

/// The value of the script's `KEY VALUE` line `key` among `lines` (panics naming `name`).
fn said(name: &str, lines: &[String], key: &str) -> f64 {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name}: no `{key}` line in {lines:?}"))
}

/// A missing Py_DECREF: decref_leak.py's ingest() calls tagsum_ext.tag_checksum,
/// which leaks one 240-byte bytes object per call (sys.getsizeof(bytes(207)) = 240, a pymalloc
/// size class: no malloc call), and the decoy verify_checksum, which makes the same object and
/// releases it, DECREF_RATE times a second each for DECREF_SECONDS. Recorded with --pymalloc and
/// --python-frames on, attached after the interpreter's startup (its imports make thousands of
/// stacks with Python frames, which the agent takes seconds to resolve: no checkpoint meanwhile): the site that grows most is tag_checksum's, with ingest's frame and the
/// line of the call right after it; its growth is calls/s × 240 B ± 20 % (the script reports its
/// calls and time) and its live bytes leaked × 240 B ± 10 %; no leak site is the decoy's.
fn decref_leak_names_the_extension_and_the_line(name: &str, interpreter: &Path, env: &[(&str, &str)]) {
    require_root();
    assert!(interpreter.exists(), "{} is not installed", interpreter.display());
    let script = fixture_source("runtimes").join("decref_leak.py");
    let leak_line = script_line(&script, "tagsum_ext.tag_checksum(rec)");
    let decoy_line = script_line(&script, "tagsum_ext.verify_checksum(rec");
    let mut cmd = Command::new(interpreter);
    cmd.arg(&script).arg(tagsum_ext_311()).args([&DECREF_RATE.to_string(), &DECREF_SECONDS.to_string()]);
    cmd.envs(env.iter().copied());
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    let (out, o, lines) =
        record_signalled(name, &target, target.pid, &["--pymalloc", "--python-frames", "on"], DECREF_SECONDS);
    let said = |key: &str| said(name, &lines, key);
    let (tag_bytes, leaked, elapsed) = (said("tag_bytes"), said("leaked"), said("elapsed"));
    assert_eq!(tag_bytes, 240.0, "the leaked object's size");
    assert!(leaked >= 0.8 * (DECREF_SECONDS * DECREF_RATE) as f64, "the workload made only {leaked} calls");
    let r = Report::load(&out.path);
    let ctx = format!("{}\nreport {}:\n{}", o.describe(), out.path.display(), r.summary());
    let leaks: Vec<&Value> = r.sites().iter().filter(|s| str_of(s, "class") == "leak").collect();
    let top = leaks
        .iter()
        .max_by(|a, b| f64_of(a, "growth_bytes_per_s").total_cmp(&f64_of(b, "growth_bytes_per_s")))
        .unwrap_or_else(|| panic!("no leak site\n{ctx}"));
    assert_eq!(str_of(top, "function"), "tag_checksum", "the culprit of the site that grows most\n{ctx}");
    let frames = top["frames"].as_array().unwrap();
    let at = top["culprit_frame"].as_u64().expect("culprit index") as usize;
    assert_eq!((frames[at]["kind"].as_str(), frames[at]["function"].as_str()), (Some("native"), Some("tag_checksum")));
    let caller =
        frames[at + 1..].iter().find(|f| f["kind"] == "python").unwrap_or_else(|| panic!("no Python frame\n{ctx}"));
    assert_eq!(caller["function"], "ingest", "{caller}\n{ctx}");
    // The leak-pattern catalog: the new reference PyBytes_FromStringAndSize returned is never
    // released: Py_DECREF, in report.json and report.md (the verdict, a managed leak of the
    // Python heap, names no site).
    assert_eq!(top["likely_missing_release"]["release"], "Py_DECREF", "{}\n{ctx}", top["likely_missing_release"]);
    assert_eq!(top["likely_missing_release"]["acquire"], "PyBytes_FromStringAndSize", "{ctx}");
    let md = std::fs::read_to_string(out.path.join("report.md")).expect("report.md");
    assert!(
        md.contains("whose result must be released with Py_DECREF: likely missing"),
        "report.md: no Py_DECREF pattern\n{ctx}"
    );
    assert_eq!(caller["line"].as_u64(), Some(leak_line), "ingest's line: {caller}\n{ctx}");
    assert!(str_of(caller, "file").ends_with("decref_leak.py"), "{caller}\n{ctx}");
    // The interpreter's adaptive specialization can give the same call two stacks: sum them.
    let ours: Vec<&&Value> = leaks.iter().filter(|s| str_of(s, "function") == "tag_checksum").collect();
    let rate: f64 = ours.iter().map(|s| f64_of(s, "growth_bytes_per_s")).sum();
    let truth = leaked * tag_bytes / elapsed;
    eprintln!("{name}: tag_checksum grows {rate:.0} B/s (truth {truth:.0} B/s) over {} site(s)", ours.len());
    assert_within("tag_checksum growth (B/s)", rate, truth, 0.20, &ctx);
    // Every object tag_checksum made is live, whatever its stack (the first calls, before the
    // call is specialized, have their own, which stops growing).
    let live: f64 = r.sites_of("tag_checksum").iter().map(|s| u64_of(s, "live_bytes") as f64).sum();
    assert_within("tag_checksum live bytes", live, leaked * tag_bytes, 0.10, &ctx);
    // The decoy makes as many objects and releases them.
    for s in &leaks {
        let frames = s["frames"].as_array().unwrap();
        assert!(
            !frames.iter().any(|f| f["function"] == "verify_checksum"
                || (f["kind"] == "python" && f["line"].as_u64() == Some(decoy_line))),
            "a leak site through the decoy: {}\n{ctx}",
            str_of(s, "function")
        );
    }
    // Nor does any site through the decoy (its tags released) carry a hint.
    for s in
        r.sites().iter().filter(|s| s["frames"].as_array().unwrap().iter().any(|f| f["function"] == "verify_checksum"))
    {
        assert!(s["likely_missing_release"].is_null(), "the decoy verify_checksum gets a hint\n{ctx}");
    }
}

#[test]
fn python_decref_leak_shared_libpython_311() {
    decref_leak_names_the_extension_and_the_line("decref-pyenv", python(), &[]);
}

/// Debian's interpreter is built with LTO: PyBytes_FromStringAndSize has pymalloc's allocation
/// inlined (no call to PyObject_Malloc, nothing a uprobe sees), so --pymalloc sees only
/// extensions' direct PyObject_Malloc calls. With PYTHONMALLOC=malloc (what the report advises)
/// every object is a malloc call, traced by its stack: the same size (240 B asked for).
#[test]
fn python_decref_leak_debian_static_311() {
    decref_leak_names_the_extension_and_the_line(
        "decref-debian",
        Path::new(DEBIAN_PYTHON),
        &[("PYTHONMALLOC", "malloc")],
    );
}

/// ctypes_leak.py's calls a second and how long it runs once signalled.
const CTYPES_RATE: u64 = 200;
const CTYPES_SECONDS: u64 = 8;

/// What a run of ctypes_leak.py said and what leaktrace made of it.
struct CtypesRun {
    report: Report,
    out: OutDir,
    /// Leaking calls, seconds they took, bytes of a leaked block (as the script says).
    leaked: f64,
    elapsed: f64,
    leak_bytes: f64,
    ctx: String,
}

/// Run `ctypes_leak.py MODE` under `interpreter`, traced by `leaktrace record --pid` from before
/// the script's first call to its end (SIGUSR1 starts the calls once leaktrace is attached).
///
/// `pid_namespace`: the interpreter runs as PID 1 of its own PID namespace (`unshare --pid
/// --fork`), and leaktrace is given its host PID.
fn record_ctypes_leak(name: &str, interpreter: &Path, mode: &str, pid_namespace: bool) -> CtypesRun {
    require_root();
    assert!(interpreter.exists(), "{} is not installed", interpreter.display());
    let script = fixture_source("runtimes").join("ctypes_leak.py");
    let mut cmd = if pid_namespace {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--kill-child"]).arg(interpreter);
        c
    } else {
        Command::new(interpreter)
    };
    cmd.arg(&script).args([mode, &CTYPES_RATE.to_string(), &CTYPES_SECONDS.to_string()]);
    let target = Target::spawn(cmd);
    let pid = if pid_namespace {
        let line = target.next_line(Duration::from_secs(10)).expect("the interpreter printed no PID line");
        assert_eq!(line, "PID 1", "inside its PID namespace the interpreter is PID 1");
        let exe = interpreter.file_name().unwrap().to_string_lossy().to_string();
        wait_for(Duration::from_secs(10), || {
            children_of(target.pid).into_iter().find(|&c| comm_of(c).is_some_and(|n| exe.starts_with(&n)))
        })
        .expect("no child of unshare runs the interpreter")
    } else {
        target.expect_pid_line();
        target.pid
    };
    let (out, o, lines) = record_signalled(name, &target, pid, &[], CTYPES_SECONDS);
    let said = |key: &str| said(name, &lines, key);
    let (leak_bytes, leaked, elapsed) = (said("leak_bytes"), said("leaked"), said("elapsed"));
    assert!(leaked >= 0.8 * (CTYPES_SECONDS * CTYPES_RATE) as f64, "the workload made only {leaked} calls");
    let report = Report::load(&out.path);
    let ctx = format!("{}\nreport {}:\n{}", o.describe(), out.path.display(), report.summary());
    // The note says whose frames an allocation gets (this machine's kernel has the fsbase in BTF).
    assert!(
        report.json["warnings"].as_array().into_iter().flatten().any(|w| w
            .as_str()
            .is_some_and(|w| w.starts_with("Python frames (function, file, line) read from CPython")
                && w.contains("(the allocating thread's own, with or without the GIL)"))),
        "no note that each thread's own frames are read: {}",
        report.json["warnings"]
    );
    CtypesRun { report, out, leaked, elapsed, leak_bytes, ctx }
}

/// The Python frames of a site's stack, innermost first, as (function, line).
fn python_frames_of(site: &Value) -> Vec<(String, Option<u64>)> {
    site["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["kind"] == "python")
        .map(|f| (str_of(f, "function").to_string(), f["line"].as_u64()))
        .collect()
}

/// The leak sites whose innermost Python frame is `function` at `line`, and the one of them that
/// grows most (the interpreter's adaptive specialization can give one call two stacks).
fn leak_sites_in<'a>(r: &'a Report, function: &str, line: u64, ctx: &str) -> (Vec<&'a Value>, &'a Value) {
    let ours: Vec<&Value> = r
        .sites()
        .iter()
        .filter(|s| str_of(s, "class") == "leak")
        .filter(|s| python_frames_of(s).first() == Some(&(function.to_string(), Some(line))))
        .collect();
    let top = r
        .sites()
        .iter()
        .filter(|s| str_of(s, "class") == "leak")
        .max_by(|a, b| f64_of(a, "growth_bytes_per_s").total_cmp(&f64_of(b, "growth_bytes_per_s")))
        .unwrap_or_else(|| panic!("no leak site\n{ctx}"));
    assert!(
        ours.iter().any(|s| std::ptr::eq(*s, top)),
        "the leak that grows most is not {function} (line {line}): {:?}\n{ctx}",
        python_frames_of(top)
    );
    (ours, top)
}

/// The leak's rate (summed over its sites) is the script's within 10 %, and its live bytes too.
fn assert_ctypes_rate(run: &CtypesRun, sites: &[&Value], what: &str) {
    let rate: f64 = sites.iter().map(|s| f64_of(s, "growth_bytes_per_s")).sum();
    let truth = run.leaked * run.leak_bytes / run.elapsed;
    eprintln!("{what}: grows {rate:.0} B/s (truth {truth:.0} B/s) over {} site(s)", sites.len());
    assert_within(&format!("{what} growth (B/s)"), rate, truth, 0.10, &run.ctx);
    let live: f64 = sites.iter().map(|s| u64_of(s, "live_bytes") as f64).sum();
    assert_within(&format!("{what} live bytes"), live, run.leaked * run.leak_bytes, 0.10, &run.ctx);
}

/// A leak through ctypes.CDLL, which releases the GIL around the C call: the block
/// is allocated by a thread that does not hold the GIL, whose own thread state the kernel finds
/// in the interpreter's list. The leaking site's stack names leak_record at the line of the
/// strdup call, then serve at the line of its call; its culprit is that Python line; its
/// growth and live bytes are the script's within 10 %.
fn ctypes_leak_names_the_python_caller(name: &str, interpreter: &Path, version: &str) {
    let script = fixture_source("runtimes").join("ctypes_leak.py");
    let leak_line = script_line(&script, "# the leaking call");
    let call_line = script_line(&script, "leak_record(RECORD)");
    let run = record_ctypes_leak(name, interpreter, "single", false);
    let ctx = &run.ctx;
    let (ours, top) = leak_sites_in(&run.report, "leak_record", leak_line, ctx);
    assert_eq!(
        python_frames_of(top).get(1),
        Some(&("serve".to_string(), Some(call_line))),
        "leak_record's caller ({version})\n{ctx}"
    );
    assert_eq!(str_of(top, "function"), format!("leak_record (ctypes_leak.py:{leak_line})"), "{ctx}");
    let frames = top["frames"].as_array().unwrap();
    assert!(frames.iter().any(|f| f["kind"] == "python" && str_of(f, "file").ends_with("ctypes_leak.py")), "{ctx}");
    assert!(frames[0]["kind"] == "native", "the innermost frame is strdup's\n{ctx}");
    assert_ctypes_rate(&run, &ours, "leak_record");
    // libc called through ctypes is named so, not "C extension", in the verdict and report.md.
    assert_eq!(str_of(top, "memory_origin"), "libc.so.6 via ctypes", "{ctx}");
    let verdict = str_of(&run.report.json["verdict"], "summary");
    assert!(
        verdict.starts_with(&format!("native leak in leak_record (ctypes_leak.py:{leak_line}) (libc.so.6 via ctypes)")),
        "{verdict}\n{ctx}"
    );
    let md = std::fs::read_to_string(run.out.path.join("report.md")).expect("report.md");
    assert!(!md.contains("C extension"), "report.md calls the ctypes call a C extension\n{ctx}");
}

#[test]
fn python_ctypes_leak_shared_libpython_311() {
    ctypes_leak_names_the_python_caller("ctypes-311", python(), "3.11");
}

#[test]
fn python_ctypes_leak_debian_static_311() {
    ctypes_leak_names_the_python_caller("ctypes-debian", Path::new(DEBIAN_PYTHON), "3.11");
}

#[test]
fn python_ctypes_leak_shared_libpython_39() {
    ctypes_leak_names_the_python_caller("ctypes-39", Path::new(PYENV_39), "3.9");
}

#[test]
fn python_ctypes_leak_shared_libpython_38() {
    ctypes_leak_names_the_python_caller("ctypes-38", Path::new(PYENV_38), "3.8");
}

/// Two Python threads: leak_in_worker leaks a strdup'd record per call through
/// ctypes.CDLL, churn_in_decoy mallocs and frees 256 bytes per call the same way, as often,
/// while the main thread waits in join(). Each thread's blocks carry its own Python frames:
/// the leak site names leak_in_worker at the line of its strdup call (rate and live bytes
/// within 10 %); the decoy's stacks (churn_in_decoy at its line) made about as many blocks,
/// freed them all, and no leak site is the decoy's.
fn ctypes_threads_name_each_thread(name: &str, interpreter: &Path, pid_namespace: bool) {
    let script = fixture_source("runtimes").join("ctypes_leak.py");
    let leak_line = script_line(&script, "# the worker's leak");
    let decoy_line = script_line(&script, "# the decoy: freed at once");
    let run = record_ctypes_leak(name, interpreter, "threads", pid_namespace);
    let ctx = &run.ctx;
    let (ours, top) = leak_sites_in(&run.report, "leak_in_worker", leak_line, ctx);
    assert_eq!(str_of(top, "function"), format!("leak_in_worker (ctypes_leak.py:{leak_line})"), "{ctx}");
    assert_ctypes_rate(&run, &ours, "leak_in_worker");
    for s in run.report.sites().iter().filter(|s| str_of(s, "class") == "leak") {
        assert!(
            !python_frames_of(s).iter().any(|(f, _)| f == "churn_in_decoy"),
            "a leak site through the decoy: {}\n{ctx}",
            str_of(s, "function")
        );
    }
    let decoy = totals_where(&run.out.path, |frames| {
        frames
            .iter()
            .find(|f| f["kind"] == "python")
            .is_some_and(|f| f["function"] == "churn_in_decoy" && f["line"].as_u64() == Some(decoy_line))
    });
    assert!(
        decoy.alloc_count as f64 >= 0.8 * run.leaked,
        "the decoy's stacks (churn_in_decoy at line {decoy_line}) made {} blocks, the worker {}: {decoy:?}\n{ctx}",
        decoy.alloc_count,
        run.leaked
    );
    assert!(decoy.free_count + 2 >= decoy.alloc_count, "the decoy's blocks are freed: {decoy:?}\n{ctx}");
}

#[test]
fn python_ctypes_threads_shared_libpython_311() {
    ctypes_threads_name_each_thread("ctypes-threads-311", python(), false);
}

/// 3.12: the kernel tries the GIL's last holder first, which for a ctypes call is mostly the
/// allocating thread itself (it released the GIL just before): this one checks that the search
/// of the thread states keeps each thread's frames its own.
#[test]
fn python_ctypes_threads_shared_libpython_312() {
    ctypes_threads_name_each_thread("ctypes-threads-312", Path::new(PYENV_312), false);
}

/// 3.8: no native_thread_id; thread states are told apart by their pthread_self().
#[test]
fn python_ctypes_threads_shared_libpython_38() {
    ctypes_threads_name_each_thread("ctypes-threads-38", Path::new(PYENV_38), false);
}

/// 3.10: frame objects (`tstate->frame`), no `native_thread_id`: only `thread_id` tells threads
/// apart.
#[test]
fn python_ctypes_threads_shared_libpython_310() {
    ctypes_threads_name_each_thread("ctypes-threads-310", Path::new(PYENV_310), false);
}

/// 3.13: the list head, `next` and `thread_id` offsets are the interpreter's own
/// (`_Py_DebugOffsets`).
#[test]
fn python_ctypes_threads_shared_libpython_313() {
    ctypes_threads_name_each_thread("ctypes-threads-313", Path::new(PYENV_313), false);
}

/// In a PID namespace (a container's): the interpreter is PID 1 and its threads have other tids
/// than the host's, which the kernel side never compares (threads are told apart by their TLS
/// base): each thread still gets its own frames (3.11, whose `native_thread_id` is the
/// namespace's tid).
#[test]
fn python_ctypes_threads_in_pid_namespace_311() {
    ctypes_threads_name_each_thread("ctypes-threads-pidns", python(), true);
}

/// `--python-frames on` on a program that runs no CPython interpreter (the native leaky
/// fixture): one line on stderr and the same sentence in report.md's caveats and report.json's
/// warnings, naming its PID; the decoy, a python3 recorded the same way, gets no such note (it
/// gets its Python frames).
#[test]
fn python_frames_on_without_an_interpreter_is_noted() {
    require_root();
    let fx = fixtures();
    let note = |pid: u32| format!("--python-frames on: PID {pid} runs no CPython interpreter; no Python frames");
    let out = OutDir::new("pyframes-on-native");
    let mut cmd = Command::new(&fx.leaky);
    cmd.args(["malloc", "200", "100"]);
    let o = record_launch(&out, &["--duration", "4s", "--python-frames", "on"], cmd);
    o.assert_success();
    let ctx = format!("{}\nreport {}", o.describe(), out.path.display());
    let pid = u64_of(&Report::load(&out.path).json["target"], "pid") as u32;
    let said: Vec<&str> = o.stderr.lines().filter(|l| l.contains("--python-frames on")).collect();
    assert_eq!(said, [format!("leaktrace: {}", note(pid))], "{ctx}");
    let md = std::fs::read_to_string(out.path.join("report.md")).expect("report.md");
    let caveats = &md[md.find("## Caveats").unwrap_or_else(|| panic!("no caveats in report.md\n{ctx}"))..];
    assert!(caveats.contains(&note(pid)), "no note in report.md's caveats:\n{caveats}\n{ctx}");
    // The decoy: an interpreter, recorded with the same option, has its frames and no note.
    let out = OutDir::new("pyframes-on-python");
    let mut cmd = Command::new(python());
    cmd.args(["-c", "import time\nx = []\nfor i in range(200):\n    x.append(bytes(4000))\n    time.sleep(0.01)\n"]);
    let o = record_launch(&out, &["--duration", "4s", "--python-frames", "on"], cmd);
    o.assert_success();
    let ctx = format!("{}\nreport {}", o.describe(), out.path.display());
    assert!(!o.stderr.contains("runs no CPython interpreter"), "{ctx}");
    let r = Report::load(&out.path);
    assert!(
        !r.json["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|w| w.as_str().is_some_and(|w| w.contains("--python-frames on"))),
        "{ctx}"
    );
    assert!(
        r.json["warnings"].as_array().into_iter().flatten().any(|w| w
            .as_str()
            .is_some_and(|w| w.starts_with("Python frames (function, file, line) read from CPython"))),
        "the decoy's frames are not read\n{ctx}"
    );
}

/// `--pymalloc` on a program that runs no CPython interpreter (the native leaky fixture): said
/// like `--python-frames on` (one stderr line, the same in report.md's caveats), not silently
/// ignored; a python3 recorded with `--pymalloc` gets no such note (its allocator API is hooked).
#[test]
fn pymalloc_without_an_interpreter_is_noted() {
    require_root();
    let fx = fixtures();
    let note =
        |pid: u32| format!("--pymalloc: PID {pid} runs no CPython interpreter; CPython's allocator API is not hooked");
    let out = OutDir::new("pymalloc-native");
    let mut cmd = Command::new(&fx.leaky);
    cmd.args(["malloc", "200", "100"]);
    let o = record_launch(&out, &["--duration", "4s", "--pymalloc"], cmd);
    o.assert_success();
    let ctx = format!("{}\nreport {}", o.describe(), out.path.display());
    let pid = u64_of(&Report::load(&out.path).json["target"], "pid") as u32;
    let said: Vec<&str> = o.stderr.lines().filter(|l| l.contains("runs no CPython interpreter")).collect();
    assert_eq!(said, [format!("leaktrace: {}", note(pid))], "{ctx}");
    let md = std::fs::read_to_string(out.path.join("report.md")).expect("report.md");
    let caveats = &md[md.find("## Caveats").unwrap_or_else(|| panic!("no caveats in report.md\n{ctx}"))..];
    assert!(caveats.contains(&note(pid)), "no note in report.md's caveats:\n{caveats}\n{ctx}");
    // The decoy: an interpreter recorded with --pymalloc has no note.
    let out = OutDir::new("pymalloc-python");
    let mut cmd = Command::new(python());
    cmd.args(["-c", "import time\nx = []\nfor i in range(200):\n    x.append(bytes(400))\n    time.sleep(0.01)\n"]);
    let o = record_launch(&out, &["--duration", "4s", "--pymalloc"], cmd);
    o.assert_success();
    let ctx = format!("{}\nreport {}", o.describe(), out.path.display());
    assert!(!o.stderr.contains("runs no CPython interpreter"), "{ctx}");
    let md = std::fs::read_to_string(out.path.join("report.md")).expect("report.md");
    assert!(!md.contains("runs no CPython interpreter"), "{ctx}");
}
