//! Bad input: one `leaktrace: error:` line and exit code 2, before anything is recorded.
use leaktrace_tests::*;

#[test]
fn nonexistent_pid() {
    require_root();
    let out = OutDir::new("nopid");
    let mut cmd = leaktrace(["record", "--pid", "999999999", "--duration", "2s", "--out"]);
    cmd.arg(&out.path);
    let o = run(cmd, None, TIMEOUT);
    assert_error(&o, &["999999999"]);
    assert!(!out.file("report.json").exists(), "a report was written for a nonexistent pid");
}

#[test]
fn unwritable_out_dir_fails_before_recording() {
    require_root();
    let fx = fixtures();
    let mut cmd = leaktrace(["record", "--out", "/proc/forbidden-dir", "--"]);
    cmd.arg(&fx.leaky).args(["malloc", "100", "1000"]);
    let o = run(cmd, None, TIMEOUT);
    assert_error(&o, &["/proc/forbidden-dir"]);
    assert!(!o.stdout.contains("done mode="), "the command ran although --out is unwritable\n{}", o.describe());
}

#[test]
fn report_of_nonexistent_dir() {
    let o = run(leaktrace(["report", "/nonexistent"]), None, TIMEOUT);
    assert_error(&o, &["/nonexistent"]);
}

#[test]
fn record_without_target_is_a_usage_error() {
    let o = run(leaktrace(["record"]), None, TIMEOUT);
    assert_eq!(o.code(), Some(2), "exit code\n{}", o.describe());
    assert!(!o.stderr.trim().is_empty(), "no message\n{}", o.describe());
}

#[test]
fn launch_of_missing_command() {
    require_root();
    let out = OutDir::new("nocmd");
    let mut cmd = leaktrace(["record", "--out"]);
    cmd.arg(&out.path).args(["--", "/nonexistent/program"]);
    let o = run(cmd, None, TIMEOUT);
    assert_error(&o, &["/nonexistent/program"]);
}

/// A negative duration or interval is told as such (not taken for an option, with clap's
/// `-- -5s` tip), and nothing runs.
#[test]
fn negative_durations_are_a_clear_usage_error() {
    for args in [["--duration", "-5s"], ["--interval", "-1s"], ["--duration", "-5"]] {
        let mut cmd = leaktrace(["record"]);
        cmd.args(args).args(["--", "/bin/true"]);
        let o = run(cmd, None, TIMEOUT);
        assert_eq!(o.code(), Some(2), "exit code\n{}", o.describe());
        assert!(o.stderr.contains("must be greater than zero"), "{args:?}\n{}", o.describe());
        assert!(!o.stderr.contains("tip:"), "{args:?}\n{}", o.describe());
    }
}

/// The `bpf(2)` calls and the processes a leaktrace command made before it ended: run under
/// `strace -f` (Debian's strace, installed by `cargo xtask setup`), whose log is returned with
/// leaktrace's output.
fn under_strace(args: &[&str], log: &std::path::Path) -> (Output, String) {
    let mut cmd = std::process::Command::new("strace");
    cmd.args(["-f", "-qq", "-e", "trace=bpf,execve", "-o"]).arg(log).arg(leaktrace_bin()).args(args);
    let o = run(cmd, None, TIMEOUT);
    let traced = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("no strace log {}: {e}", log.display()));
    (o, traced)
}

/// `--out` naming a regular file is refused with one line (exit 2) before
/// leaktrace loads any eBPF program (no `bpf(2)` call) or starts the command (no `execve` of
/// it), by `record --pid`, `record -- CMD` and `watch`; the file is left as it was. Before, the
/// programs were loaded first (minutes on a loaded machine) and the error came after.
#[test]
fn out_naming_a_regular_file_fails_before_loading_or_starting_anything() {
    require_root();
    let out = OutDir::new("out-is-a-file");
    std::fs::create_dir_all(&out.path).expect("mkdir");
    let file = out.file("notes.txt");
    std::fs::write(&file, "keep me\n").expect("write");
    let file_s = file.to_str().expect("utf-8 path");
    let log = out.file("strace.log");
    let mut sleeper = std::process::Command::new("sleep").arg("60").spawn().expect("sleep");
    let pid = sleeper.id().to_string();
    let runs: [Vec<&str>; 3] = [
        vec!["record", "--pid", &pid, "--duration", "2s", "--out", file_s],
        vec!["record", "--duration", "2s", "--out", file_s, "--", "/bin/echo", "started"],
        vec!["watch", "--pid", &pid, "--duration", "2s", "--out", file_s],
    ];
    for args in runs {
        let (o, traced) = under_strace(&args, &log);
        let ctx = format!("{args:?}\n{}\nstrace:\n{traced}", o.describe());
        assert_error(&o, &[file_s, "not a directory"]);
        assert!(!traced.contains("bpf("), "eBPF was loaded before --out was refused\n{ctx}");
        let execs = traced.lines().filter(|l| l.contains("execve(")).count();
        assert_eq!(execs, 1, "something besides leaktrace was started\n{ctx}");
        assert!(!o.stdout.contains("started"), "the command ran\n{ctx}");
    }
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "keep me\n");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
