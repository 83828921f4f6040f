//! Launch mode (`leaktrace record -- CMD`): each allocator of `leaky` leaks 1000 B per iteration
//! and leaktrace must find that site, by name, with the exact size; the cache and temporary
//! decoys must not be called leaks. Also C++ `new[]`.
use std::process::Command;

use leaktrace_tests::*;

const ITERATIONS: u64 = 400;
const RATE: &str = "200";

fn launch_mode(mode: &str) {
    require_root();
    let fx = fixtures();
    let out = OutDir::new(mode);
    let mut target = Command::new(&fx.leaky);
    target.args([mode, &ITERATIONS.to_string(), RATE]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    assert!(
        o.stderr.lines().any(|l| l.starts_with("leaktrace: attached")),
        "no 'leaktrace: attached' line on stderr\n{}",
        o.describe()
    );
    assert!(
        o.stdout.contains(&format!("done mode={mode} iterations={ITERATIONS} ")),
        "the target did not run to its end\n{}",
        o.describe()
    );
    assert_outputs_exist(&out.path);
    let r = Report::load(&out.path);
    let pid = pid_line(&o.stdout).unwrap_or_else(|| panic!("no PID line\n{}", o.describe()));
    let t = r.get(&["target"]);
    assert_eq!(t["pid"].as_u64(), Some(pid as u64), "target.pid: {t}");
    assert_eq!(t["launched"].as_bool(), Some(true), "target.launched: {t}");
    assert_eq!(t["exit_status"].as_i64(), Some(0), "target.exit_status: {t}");
    let command = str_of(t, "command");
    assert!(command.contains("leaky") && command.contains(mode), "target.command {command:?}");
    assert!(str_of(t, "exe").ends_with("/leaky"), "target.exe: {t}");
    // 400 iterations at 200/s take 2 s (+ 0.3 s linger).
    let duration = r.get(&["duration_s"]).as_f64().expect("duration_s");
    assert!((1.8..20.0).contains(&duration), "duration_s {duration}");
    assert_leaky_report(&r, mode, ITERATIONS);
}

#[test]
fn malloc_leak_found_in_launch_mode() {
    launch_mode("malloc");
}

#[test]
fn calloc_leak_found_in_launch_mode() {
    launch_mode("calloc");
}

#[test]
fn realloc_growth_found_in_launch_mode() {
    launch_mode("realloc");
}

#[test]
fn posix_memalign_leak_found_in_launch_mode() {
    launch_mode("posix_memalign");
}

#[test]
fn strdup_leak_found_in_launch_mode() {
    launch_mode("strdup");
}

/// `new char[1000]` goes through libstdc++'s operator new[] to malloc: the culprit is leak_new.
#[test]
fn cpp_operator_new_leak_found() {
    require_root();
    let fx = fixtures();
    let out = OutDir::new("cpp");
    let mut target = Command::new(&fx.leaky_new);
    target.args([&ITERATIONS.to_string(), RATE]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}", out.path.display(), r.summary());
    let leak = r.site("leak_new");
    let largest = str_of(r.largest_growth(), "function");
    assert!(same_function(largest, "leak_new"), "largest growth is {largest}\n{ctx}");
    let expected = (ITERATIONS * LEAK_BYTES) as f64;
    assert_within("leak_new live_bytes", u64_of(leak, "live_bytes") as f64, expected, 0.10, &ctx);
    assert_within(
        "leak_new growth per iteration",
        i64_of(leak, "growth_bytes") as f64 / ITERATIONS as f64,
        LEAK_BYTES as f64,
        0.10,
        &ctx,
    );
    assert_eq!(u64_of(leak, "live_allocations"), ITERATIONS, "leak_new live_allocations\n{ctx}");
    assert_eq!(str_of(leak, "class"), "leak", "class of leak_new\n{ctx}");
    assert_culprit_frames(leak, "leak_new", "leaky_new.cpp", &["run_workload", "main"], &ctx);
    // operator new is in the stack, as an allocator frame.
    let frames = leak["frames"].as_array().unwrap();
    assert!(
        frames.iter().any(|f| f["function"].as_str().is_some_and(|n| n.starts_with("operator new"))
            && f["allocator"].as_bool() == Some(true)),
        "operator new should appear as an allocator frame of leak_new's site\n{ctx}"
    );
    assert_eq!(r.get(&["drops", "total"]).as_u64(), Some(0), "drops.total\n{ctx}");
    assert_eq!(r.get(&["target", "exit_status"]).as_i64(), Some(0));
}

/// `leaktrace demo` unpacks its program into the temporary directory and removes it at the end;
/// run from that directory, its report (default ./leaktrace-demo-PID-TIMESTAMP) must survive, and name the
/// demo's leak.
#[test]
fn demo_run_from_the_temp_dir_keeps_its_report() {
    require_root();
    let mut cmd = leaktrace(["demo", "--duration", "4s"]);
    cmd.current_dir(std::env::temp_dir());
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    let dir = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Open ")?.split("/report.md").next())
        .unwrap_or_else(|| panic!("demo printed no report path\n{}", o.describe()));
    let dir = std::env::temp_dir().join(dir);
    let report = std::fs::read_to_string(dir.join("report.md"))
        .unwrap_or_else(|e| panic!("{}/report.md: {e}\n{}", dir.display(), o.describe()));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(report.contains("remember_message"), "the demo's leak is not in its report:\n{report}");
}
