//! `leaktrace watch` on selectors that cannot match: a `--pid` that is no process
//! and a `--cgroup` that is no cgroup are one-line errors before anything is watched, and a
//! watch of `--pid`s that all exit ends by itself, saying so, instead of waiting forever.
use std::process::Command;
use std::time::{Duration, Instant};

use leaktrace_tests::*;

/// A PID no process has: the highest one the kernel hands out, plus one.
fn no_such_pid() -> String {
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304);
    (max + 1).to_string()
}

#[test]
fn watch_of_no_process_or_no_cgroup_is_a_one_line_error() {
    require_root();
    let out = OutDir::new("watch-no-pid");
    let mut cmd = leaktrace(["watch", "--duration", "5s", "--pid", &no_such_pid(), "--out"]);
    cmd.arg(&out.path);
    assert_error(&run(cmd, None, TIMEOUT), &["--pid", "no such process"]);
    let mut cmd = leaktrace(["watch", "--duration", "5s", "--cgroup", "/leaktrace-no-such-cgroup", "--out"]);
    cmd.arg(&out.path);
    assert_error(&run(cmd, None, TIMEOUT), &["--cgroup", "no such cgroup"]);
}

/// `--pid` of a process that exits 3 s into a 30 s window, with no --duration: the watch ends
/// once its window is over (not at --duration, which is unset) and says every process exited.
#[test]
fn watch_ends_when_every_pid_has_exited() {
    require_root();
    let out = OutDir::new("watch-pid-exits");
    let mut target = Command::new("sleep").arg("3").spawn().expect("sleep");
    let mut cmd = leaktrace(["watch", "--window", "10s", "--interval", "1s", "--no-escalate", "--out"]);
    cmd.arg(&out.path).arg("--pid").arg(target.id().to_string());
    let t0 = Instant::now();
    let o = run(cmd, None, TIMEOUT);
    let _ = target.wait();
    assert_no_panic(&o);
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert!(o.stderr.contains("every process of --pid"), "{}", o.describe());
    assert!(t0.elapsed() < Duration::from_secs(120), "took {:?}\n{}", t0.elapsed(), o.describe());
}

/// `--duration 2s` (shorter than a window, as short as a verdict allows) gives
/// one window and its verdict, not none: the watch ends by itself, says "done after 1
/// window(s)", and names the watched process's verdict. Before, the 2 s counted from after
/// loading were a few ms short of the 2 s minimum and no window was taken ("done after 0").
#[test]
fn watch_with_a_duration_shorter_than_a_window_takes_one_window() {
    require_root();
    let out = OutDir::new("watch-short");
    let mut sleeper = Command::new("sleep").arg("120").spawn().expect("sleep");
    let pid = sleeper.id().to_string();
    let mut cmd = leaktrace(["watch", "--duration", "2s", "--no-escalate", "--pid", &pid, "--out"]);
    cmd.arg(&out.path);
    let o = run(cmd, None, TIMEOUT);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_no_panic(&o);
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert!(o.stderr.contains("done after 1 window(s)"), "{}", o.describe());
    assert!(o.stderr.contains(&format!("watch: PID {pid} (sleep): ")), "no verdict for the process\n{}", o.describe());
}
