//! The live status line of `record`: redrawn in place in a real terminal (tmux), plain
//! `leaktrace: status:` lines in a pipe, nothing with `--quiet`.
use std::process::Command;
use std::time::{Duration, Instant};

use leaktrace_tests::*;

/// `tmux ARGS...`, its stdout.
fn tmux(args: &[&str]) -> String {
    let o = Command::new("tmux")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run tmux (`cargo xtask setup` installs it): {e}"));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Kills the tmux session when the test ends.
struct Session(String);
impl Drop for Session {
    fn drop(&mut self) {
        tmux(&["kill-session", "-t", &self.0]);
    }
}

/// The status lines on the screen: lines with "] PID " and the duration.
fn status_lines(screen: &str) -> Vec<String> {
    screen.lines().filter(|l| l.contains("s/8s] PID ")).map(|l| l.trim().to_string()).collect()
}

/// Elapsed seconds of a status line "[   2.3s/8s] PID ...".
fn elapsed(line: &str) -> f64 {
    line.trim_start_matches('[')
        .split('s')
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no elapsed time in {line:?}"))
}

/// In a terminal: one status line, redrawn (its elapsed time moves on, no second line appears),
/// naming the leak as the fastest-growing site; erased at the end.
#[test]
fn status_line_redrawn_in_a_terminal() {
    require_root();
    let out = OutDir::new("status-tty");
    let name = format!("leaktrace-status-{}", std::process::id());
    let script = format!(
        "'{}' record --interval 250ms --duration 8s --out '{}' -- '{}' malloc 100000 200 >/dev/null; echo EXIT=$?; sleep 120",
        leaktrace_bin().display(),
        out.path.display(),
        fixtures().leaky.display()
    );
    tmux(&["new-session", "-d", "-s", &name, "-x", "220", "-y", "30", &script]);
    let _session = Session(name.clone());
    let capture = || tmux(&["capture-pane", "-p", "-t", &name]);

    // Wait for the status line, then watch it for a few seconds.
    let first = wait_for(Duration::from_secs(30), || {
        let s = capture();
        let l = status_lines(&s);
        (!l.is_empty() && elapsed(&l[0]) >= 1.0).then_some(s)
    })
    .unwrap_or_else(|| panic!("no status line on the terminal:\n{}", capture()));
    let lines = status_lines(&first);
    assert_eq!(lines.len(), 1, "one status line, redrawn:\n{first}");
    let t1 = elapsed(&lines[0]);
    std::thread::sleep(Duration::from_secs(3));
    let second = capture();
    let lines2 = status_lines(&second);
    assert_eq!(lines2.len(), 1, "still one status line:\n{second}");
    let t2 = elapsed(&lines2[0]);
    assert!(t2 > t1 + 1.0, "the line was not redrawn: {t1} → {t2}\n{first}\n{second}");
    let l = &lines2[0];
    for part in ["RSS ", "live ", "/s)", "fastest: leak_malloc +", "; lost 0"] {
        assert!(l.contains(part), "no {part:?} in the status line {l:?}");
    }

    // At the end the line is erased.
    let start = Instant::now();
    let end = wait_for(Duration::from_secs(60), || {
        let s = capture();
        s.contains("EXIT=").then_some(s)
    })
    .unwrap_or_else(|| panic!("leaktrace did not end in {:?}:\n{}", start.elapsed(), capture()));
    assert!(end.contains("EXIT=0"), "{end}");
    assert!(status_lines(&end).is_empty(), "the status line was not erased:\n{end}");
}

/// In a pipe: plain `leaktrace: status:` lines (no terminal escapes); with --quiet none.
#[test]
fn status_plain_in_a_pipe_and_quiet() {
    require_root();
    let out = OutDir::new("status-pipe");
    let mut target = Command::new(&fixtures().leaky);
    target.args(["malloc", "400", "200"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let plain: Vec<&str> = o.stderr.lines().filter(|l| l.starts_with("leaktrace: status: [")).collect();
    assert!(!plain.is_empty(), "no plain status line\n{}", o.describe());
    assert!(plain[0].contains("] PID ") && plain[0].contains("RSS ") && plain[0].contains("live "), "{plain:?}");
    assert!(!o.stderr.contains('\x1b') && !o.stderr.contains('\r'), "terminal escapes in a pipe\n{}", o.describe());

    let out = OutDir::new("status-quiet");
    let mut target = Command::new(&fixtures().leaky);
    target.args(["malloc", "400", "200"]);
    let o = record_launch(&out, &["--quiet"], target);
    o.assert_success();
    assert!(!o.stderr.contains("leaktrace: status:"), "--quiet printed a status\n{}", o.describe());
    assert!(o.stderr.contains("leaktrace: attached"), "{}", o.describe());
}
