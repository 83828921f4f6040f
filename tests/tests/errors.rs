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
