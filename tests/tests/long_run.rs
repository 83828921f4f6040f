//! A long recording in growth mode ("long runs"): an 8-hour recording simulated as
//! 10 minutes at a 100 ms interval (6,000 checkpoints) against a target that keeps making new
//! call stacks (tests/fixtures/newstacks.c: a new stack at every call until 262,144, 500 calls
//! a second). What must stay bounded, and the bounds asserted:
//!
//! - checkpoints: at most `MAX_CHECKPOINTS` (2,000) per process, thinned by halving, still
//!   spanning the whole run;
//! - call stacks: at most `--max-stacks` (16,384 by default); the ones that did not fit are
//!   counted as drops (`stacks_map_full`), not lost silently;
//! - recording.json: at most 64 MiB;
//! - the agent's RSS: at most 512 MiB, and no more than 1.25 × + 32 MiB of what it was a
//!   quarter into the run (after the stack map filled): no growth with time.
//!
//! It is `#[ignore]`d in the normal run: `cargo xtask test` runs it in the background, in
//! parallel with the rest of the suite (it is mostly waiting). `LEAKTRACE_LONG_RUN_S` shortens
//! it (default 600).
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::process::Command;
use std::time::{Duration, Instant};

use leaktrace_tests::*;

fn agent_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

#[test]
#[ignore = "10 minutes: run by `cargo xtask test` in the background (or with --ignored)"]
fn long_growth_recording_stays_bounded() {
    require_root();
    let secs: u64 = std::env::var("LEAKTRACE_LONG_RUN_S").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let dir = temp_root().join("fixtures-long");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("newstacks");
    let o = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-g", "-Wall", "-o"])
        .arg(&bin)
        .arg(fixture_source("newstacks.c"))
        .output()
        .expect("gcc");
    assert!(o.status.success(), "gcc newstacks.c: {}", String::from_utf8_lossy(&o.stderr));
    let target = Target::spawn({
        let mut c = Command::new(&bin);
        c.arg("500");
        c
    });
    target.expect_pid_line();

    let out = OutDir::new("long-run");
    let mut cmd = leaktrace(["record", "--mode", "growth", "--no-escalate", "--interval", "100ms", "--quiet"]);
    cmd.args(["--duration", &format!("{secs}s"), "--pid", &target.pid.to_string(), "--out"]).arg(&out.path);
    let lt = Running::spawn(cmd, None);
    let agent = lt.pid();
    // The agent's RSS every 5 s.
    let started = Instant::now();
    let mut rss: Vec<(f64, u64)> = Vec::new();
    while started.elapsed() < Duration::from_secs(secs + 5) {
        match agent_rss_kib(agent) {
            Some(k) => rss.push((started.elapsed().as_secs_f64(), k)),
            None => break,
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    let o = lt.wait(Duration::from_secs(secs + 180));
    o.assert_success();
    let ctx = format!("{}\nagent RSS (s, KiB): {rss:?}", o.stderr);

    // Checkpoints: thinned, bounded, spanning the run.
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(out.file("recording.json")).unwrap()).unwrap();
    let cps = rec["checkpoints"].as_array().expect("checkpoints");
    let taken = secs * 10;
    assert!(cps.len() <= 2000, "{} checkpoints kept (at most 2000)\n{ctx}", cps.len());
    if taken > 2000 {
        assert!(cps.len() >= 1000, "{} checkpoints kept of {taken}: thinned too far\n{ctx}", cps.len());
    }
    let last_t = cps.last().map(|c| f64_of(c, "t_s")).unwrap_or(0.0);
    assert!(last_t >= secs as f64 - 2.0, "the checkpoints end at {last_t} s of {secs}\n{ctx}");

    // Stacks: bounded by --max-stacks; the overflow is counted.
    let stacks = rec["stacks"].as_array().expect("stacks").len();
    assert!(stacks <= 16384 + 16, "{stacks} stacks\n{ctx}");
    let r = Report::load(&out.path);
    if secs >= 120 {
        assert!(stacks >= 8000, "only {stacks} stacks were recorded of the target's 262,144\n{ctx}");
        let full = r.get(&["drops", "stacks_map_full"]).as_u64().unwrap_or(0);
        assert!(full > 0, "the stack map filled, but no stacks_map_full drops are counted\n{}\n{ctx}", r.summary());
    }

    // recording.json size and the agent's memory.
    let size = std::fs::metadata(out.file("recording.json")).unwrap().len();
    assert!(size <= 64 << 20, "recording.json is {size} bytes\n{ctx}");
    let peak = rss.iter().map(|x| x.1).max().unwrap_or(0);
    assert!(peak <= 512 << 10, "agent peak RSS {peak} KiB\n{ctx}");
    let quarter = rss.iter().find(|x| x.0 >= secs as f64 / 4.0).map(|x| x.1);
    let end = rss.last().map(|x| x.1);
    if let (Some(q), Some(e)) = (quarter, end) {
        assert!(e <= q + q / 4 + (32 << 10), "agent RSS grew from {q} KiB at a quarter to {e} KiB\n{ctx}");
    }
    eprintln!(
        "long run: {secs} s, {} checkpoints kept of {taken}, {stacks} stacks, recording.json {size} B, agent RSS peak {peak} KiB",
        cps.len()
    );
}
