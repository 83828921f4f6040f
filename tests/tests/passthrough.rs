//! Tracing does not change the target: its output, input and exit status pass through.
use std::process::Command;

use leaktrace_tests::*;

/// The fixture's stdout (minus the PID line) is the same alone and under leaktrace.
#[test]
fn target_stdout_unchanged() {
    require_root();
    let fx = fixtures();
    let alone = Command::new(&fx.leaky).args(["calloc", "300", "600"]).output().expect("run leaky");
    assert!(alone.status.success());
    let alone = String::from_utf8(alone.stdout).unwrap();
    let alone_lines: Vec<&str> = alone.lines().skip(1).collect();
    assert_eq!(alone_lines.len(), 4, "3 progress lines and the done line: {alone}");

    let out = OutDir::new("stdout");
    let mut target = Command::new(&fx.leaky);
    target.args(["calloc", "300", "600"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let traced: Vec<&str> = o.stdout.lines().collect();
    assert!(traced.first().is_some_and(|l| l.starts_with("PID ")), "first line\n{}", o.describe());
    // The target's lines come first and unchanged; leaktrace may print its own after them.
    assert!(
        traced.len() > alone_lines.len() && traced[1..=alone_lines.len()] == alone_lines[..],
        "stdout under leaktrace differs from the target's own:\nalone:\n{}\ntraced:\n{}",
        alone_lines.join("\n"),
        o.stdout
    );
}

/// stdin reaches the launched command.
#[test]
fn target_stdin_passes_through() {
    require_root();
    let out = OutDir::new("stdin");
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--out"]);
    cmd.arg(&out.path).args(["--", "/bin/cat"]);
    let o = run(cmd, Some(b"hello\nworld\n"), TIMEOUT);
    o.assert_success();
    assert!(o.stdout.starts_with("hello\nworld\n"), "cat's output under leaktrace\n{}", o.describe());
    let r = Report::load(&out.path);
    assert_eq!(r.get(&["target", "exit_status"]).as_i64(), Some(0));
    // target.exe is /proc/PID/exe: the resolved path (/bin/cat is /usr/bin/cat on merged /usr).
    let exe = std::fs::canonicalize("/bin/cat").unwrap();
    assert_eq!(str_of(r.get(&["target"]), "exe"), exe.to_str().unwrap(), "target.exe");
}

/// The launched command's exit code is reported.
#[test]
fn target_exit_code_reported() {
    require_root();
    let fx = fixtures();
    let out = OutDir::new("exit3");
    let mut target = Command::new(&fx.leaky);
    target.args(["malloc", "50", "500"]).env("EXIT_CODE", "3");
    let o = record_launch(&out, &[], target);
    assert!(o.code().is_some(), "leaktrace was killed\n{}", o.describe());
    let r = Report::load(&out.path);
    assert_eq!(
        r.get(&["target", "exit_status"]).as_i64(),
        Some(3),
        "target.exit_status with EXIT_CODE=3\n{}",
        o.describe()
    );
    assert_eq!(r.site("leak_malloc")["live_bytes"].as_u64(), Some(50 * LEAK_BYTES), "{}", r.summary());
}

/// A command killed by a signal is reported as 128 + signal number.
#[test]
fn target_killed_by_signal_reported() {
    require_root();
    let out = OutDir::new("sigterm");
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--out"]);
    cmd.arg(&out.path).args(["--", "/bin/sh", "-c", "kill -TERM $$"]);
    let o = run(cmd, None, TIMEOUT);
    assert!(o.code().is_some(), "leaktrace was killed\n{}", o.describe());
    let r = Report::load(&out.path);
    assert_eq!(r.get(&["target", "exit_status"]).as_i64(), Some(128 + libc::SIGTERM as i64), "{}", o.describe());
}
