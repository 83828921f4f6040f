//! `leaktrace watch` under process churn stays bounded: the site indices of a
//! process that ended go back to the kernel side, so `--max-sites` bounds the sites of the
//! processes watched at once, not of every process seen. Twelve `leaky` processes, each
//! waiting for SIGUSR1, are released one after another (3.5 s apart) under `--max-sites 16`:
//! together they make about 30 sites in growth mode (two or three each), more than the 16 slots,
//! yet every one of them, the last ones included, still has its pages counted at its exit.
//! Before the fix the sites past the 16th were not counted (`sites_map_full`) and the last
//! processes ended with nothing allocated.
#![allow(clippy::print_stderr, reason = "test diagnostics")]

use std::process::{Command, Stdio};
use std::time::Duration;

use leaktrace_tests::*;

const PROCESSES: usize = 12;

/// The "N block(s)" of the process's last "still allocated when the command exited" verdict.
fn blocks_at_exit(stderr: &str, pid: u32) -> Option<u64> {
    let prefix = format!("watch: PID {pid} (leaky): ");
    let line =
        stderr.lines().rfind(|l| l.contains(&prefix) && l.contains("still allocated when the command exited"))?;
    let before = line.split(" block(s)").next()?;
    before.rsplit(' ').next()?.parse().ok()
}

#[test]
fn watch_gives_site_indices_back_under_churn() {
    require_root();
    let out = OutDir::new("watch-churn");
    let mut targets: Vec<std::process::Child> = (0..PROCESSES)
        .map(|_| {
            Command::new(&fixtures().leaky)
                .args(["malloc", "30", "20"])
                .env("WAIT_FOR_SIGNAL", "1")
                .env("LINGER_MS", "1500")
                .stdout(Stdio::null())
                .spawn()
                .expect("leaky")
        })
        .collect();
    let pids: Vec<u32> = targets.iter().map(std::process::Child::id).collect();
    let mut cmd =
        leaktrace(["watch", "--max-sites", "16", "--window", "4s", "--interval", "1s", "--no-escalate", "--out"]);
    cmd.arg(&out.path);
    for p in &pids {
        cmd.arg("--pid").arg(p.to_string());
    }
    let mut agent = Running::spawn(cmd, None);
    for p in &pids {
        agent.wait_for_stderr_line(&format!("leaktrace: watch: watching PID {p} "), Duration::from_secs(60)).unwrap();
    }
    for t in &mut targets {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child, which
        // waits for this signal.
        unsafe { libc::kill(t.id() as libc::pid_t, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(3500));
        let _ = t.wait();
    }
    let o = agent.wait(TIMEOUT);
    assert_no_panic(&o);
    let stderr = o.stderr.clone();
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert!(stderr.contains("has exited"), "the watch did not end by itself\n{stderr}");
    let blocks: Vec<Option<u64>> = pids.iter().map(|&p| blocks_at_exit(&stderr, p)).collect();
    eprintln!("blocks at exit, in order: {blocks:?}");
    // Each leaky touches 13–15 pages in growth mode; the last four came after the 16 slots had
    // been used several times over.
    for (p, b) in pids.iter().zip(&blocks).skip(PROCESSES - 4) {
        assert!(b.is_some_and(|b| b >= 8), "PID {p}: {b:?} block(s) at exit (its sites not counted)\n{stderr}");
    }
    let named = pids[PROCESSES / 2..]
        .iter()
        .any(|p| stderr.lines().any(|l| l.contains(&format!("PID {p} (leaky)")) && l.contains("temp_work")));
    assert!(named, "no process of the second half had its growth attributed to temp_work\n{stderr}");
}
