//! The reachability part of `cargo xtask bench`: how long `record --reachability` stops a
//! process holding many live blocks (tests/fixtures/reach.c in mode `big`: N 100-byte nodes on a
//! global linked list, one chain N links long, the worst case for the breadth-first marking).
//!
//! Each run: start `reach big N`, attach `leaktrace record --reachability`, let the fixture build
//! its list, end the recording with SIGINT (the scan runs then), read the figures from
//! report.json's `reachability`, and check the fixture's checksum afterwards (its data intact).
//! The results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md.

use super::*;

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- reachability bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- reachability bench: end -->";

/// One scan's figures, from report.json.
struct Run {
    pause_ms: f64,
    blocks: u64,
    block_bytes_scanned: u64,
    untraced_bytes_scanned: u64,
    complete: bool,
    agent_hwm_kib: u64,
}

fn one_run(work: &Path, fixture: &Path, n: u64, rep: usize) -> Result<Run> {
    let mut target = Spawned::new({
        let mut c = Command::new(fixture);
        c.args(["big", &n.to_string()]);
        c
    })?;
    target.wait_stdout_line("PID ", Duration::from_secs(10))?;
    let out = work.join(format!("reach-{rep}"));
    let mut cmd = Command::new(release_binary());
    cmd.args(["record", "--reachability", "--quiet", "--max-allocs"])
        .arg((n + n / 5 + 65536).to_string())
        .arg("--pid")
        .arg(target.pid().to_string())
        .arg("--out")
        .arg(&out);
    let mut lt = Spawned::new(cmd)?;
    lt.wait_stderr_line("leaktrace: attached", Duration::from_secs(120))?;
    // SAFETY: kill has no memory-safety preconditions; the fixture is our child, not reaped.
    unsafe { libc::kill(target.pid() as libc::pid_t, libc::SIGUSR1) };
    target.wait_stdout_line("done", Duration::from_secs(300))?;
    std::thread::sleep(Duration::from_millis(1500));
    let lt_pid = lt.pid();
    lt.interrupt();
    // The agent's peak RSS, read while it scans and writes (it ends soon after).
    let mut agent_hwm_kib = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        match status_kib(lt_pid, "VmHWM") {
            Ok(k) => agent_hwm_kib = agent_hwm_kib.max(k),
            Err(_) => break,
        }
        if std::fs::read_to_string(format!("/proc/{lt_pid}/stat")).is_ok_and(|s| s.contains(") Z")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    lt.wait(Duration::from_secs(300))?;
    // SAFETY: as above.
    unsafe { libc::kill(target.pid() as libc::pid_t, libc::SIGUSR2) };
    let sum = target.wait_stdout_line("sum ", Duration::from_secs(30))?;
    let want: u64 = (1..=n).sum();
    if sum != format!("sum {want}") {
        bail!("the fixture's data changed during the scan: {sum}, expected sum {want}");
    }
    target.wait(Duration::from_secs(30))?;
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("report.json")).with_context(|| format!("{}/report.json", out.display()))?,
    )?;
    let r = &report["reachability"];
    let u = |k: &str| r[k].as_u64().unwrap_or(0);
    Ok(Run {
        pause_ms: r["pause_ms"].as_f64().unwrap_or(f64::NAN),
        blocks: u("blocks"),
        block_bytes_scanned: u("block_bytes_scanned"),
        untraced_bytes_scanned: u("untraced_bytes_scanned"),
        complete: r["complete"].as_bool().unwrap_or(false),
        agent_hwm_kib,
    })
}

/// Measure `reps` scans of `n` live blocks; the markdown section (between the markers).
pub(super) fn measure(reps: usize, n: u64) -> Result<String> {
    let work = root().join("target/bench/reach");
    std::fs::create_dir_all(&work)?;
    let fixture = work.join("reach");
    run(Command::new("gcc")
        .args(["-O1", "-g", "-pthread", "-o"])
        .arg(&fixture)
        .arg(root().join("tests/fixtures/reach.c")))?;
    let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let mut runs = Vec::new();
    let mut loads = Vec::new();
    for rep in 0..reps.max(1) {
        loads.extend(loadavg());
        runs.push(one_run(&work, &fixture, n, rep)?);
    }
    let pauses: Vec<f64> = runs.iter().map(|r| r.pause_ms).collect();
    let (min, max) = (pauses.iter().copied().fold(f64::INFINITY, f64::min), pauses.iter().copied().fold(0.0, f64::max));
    let last = runs.last().expect("at least one run");
    let load = load_range(&loads);
    let mut s = String::new();
    s.push_str(BEGIN);
    s.push('\n');
    s.push_str(&format!(
        "Measured by `cargo xtask bench` ({date}; `--reach-only` runs just this part), {} run(s), 1-minute load {load} at the starts. \
         `tests/fixtures/reach.c big {n}`: {n} nodes of 100 bytes on one global linked list, traced in exact mode, then \
         `leaktrace record --reachability` ends (SIGINT) and scans it; the fixture's checksum is checked after every run.\n\n",
        runs.len()
    ));
    s.push_str("| figure | value |\n| --- | ---: |\n");
    s.push_str(&format!("| live blocks at the scan | {} |\n", last.blocks));
    s.push_str(&format!(
        "| pause, threads stopped → resumed (median of {}; min–max) | {:.0} ms ({:.0}–{:.0}) |\n",
        runs.len(),
        median(&pauses),
        min,
        max
    ));
    s.push_str(&format!("| block bytes scanned | {} |\n", last.block_bytes_scanned));
    s.push_str(&format!("| untraced heap scanned as roots | {} bytes |\n", last.untraced_bytes_scanned));
    s.push_str(&format!("| scan complete (not cut by the pause cap) | {} |\n", yes(runs.iter().all(|r| r.complete))));
    s.push_str(&format!("| agent peak RSS (VmHWM, last run) | {:.0} MiB |\n", last.agent_hwm_kib as f64 / 1024.0));
    s.push('\n');
    s.push_str(END);
    s.push('\n');
    Ok(s)
}
