//! Attach mode (`leaktrace record --pid PID`): the fixture waits for SIGUSR1, which the test sends
//! once leaktrace printed `leaktrace: attached`; leaktrace ends when the target exits.
//! Probes are uprobe_multi links where the kernel has them (6.6+), single perf-event uprobes
//! with `LEAKTRACE_SINGLE_UPROBES=1` (the fallback of older kernels): the kernel's view (the
//! types of the agent's BPF links, from /proc/PID/fdinfo) is checked for both.
use std::process::Command;
use std::time::{Duration, SystemTime};

use leaktrace_tests::*;

/// How leaktrace places its uprobes in a test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Uprobes {
    /// The default: uprobe_multi links where the kernel has them.
    Default,
    /// `LEAKTRACE_SINGLE_UPROBES=1`: one perf-event uprobe per probe.
    Single,
}

/// BPF links process `pid` holds: (perf-event links: single uprobes and tracepoints, uprobe_multi
/// and uretprobe_multi links), from the `link_type` lines of /proc/PID/fdinfo.
fn bpf_links(pid: u32) -> (usize, usize) {
    let (mut perf, mut multi) = (0, 0);
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("reading the agent's fdinfo").flatten() {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        match info.lines().find_map(|l| l.strip_prefix("link_type:")).map(str::trim) {
            Some("perf") | Some("perf_event") => perf += 1,
            Some("uprobe_multi") | Some("uretprobe_multi") => multi += 1,
            _ => {}
        }
    }
    (perf, multi)
}

/// Whether this kernel is 6.6 or newer (uprobe_multi links with a process filter).
fn kernel_has_uprobe_multi() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = release.trim().split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0)) >= (6, 6)
}

fn attach_mode(mode: &str) {
    attach_mode_with(mode, Uprobes::Default);
}

fn attach_mode_with(mode: &str, uprobes: Uprobes) {
    require_root();
    let fx = fixtures();
    let mut cmd = Command::new(&fx.leaky);
    cmd.args([mode, "400", "200"]).env("WAIT_FOR_SIGNAL", "1");
    let mut target = Target::spawn(cmd);
    target.expect_pid_line();

    let out = OutDir::new(&format!("attach-{mode}-{uprobes:?}"));
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--interval", "250ms", "--out"]);
    lt.arg(&out.path);
    match uprobes {
        Uprobes::Default => lt.env_remove("LEAKTRACE_SINGLE_UPROBES"),
        Uprobes::Single => lt.env("LEAKTRACE_SINGLE_UPROBES", "1"),
    };
    let mut running = Running::spawn(lt, None);
    let attached =
        running.wait_for_stderr_line("leaktrace: attached", Duration::from_secs(90)).unwrap_or_else(|e| panic!("{e}"));
    // "leaktrace: attached to PID N (...): K probes in ..."
    let probes: usize = attached
        .split("): ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no probe count in {attached:?}"));
    assert!(probes >= 10, "{probes} probes in {attached:?}");
    // The tracepoints (8 syscalls, fork, exec, the 4 fork returns of --follow-forks' hold,
    // oom:mark_victim) are perf-event links either way.
    const TRACEPOINTS: usize = 15;
    let (perf, multi) = bpf_links(running.pid());
    match uprobes {
        Uprobes::Single => assert!(
            perf >= probes + TRACEPOINTS && multi == 0,
            "{perf} perf-event and {multi} uprobe_multi links for {probes} single uprobes\n{}",
            running.stderr_so_far()
        ),
        Uprobes::Default if kernel_has_uprobe_multi() => assert!(
            perf == TRACEPOINTS && (2..probes).contains(&multi),
            "{perf} perf-event and {multi} uprobe_multi links for {probes} probes\n{}",
            running.stderr_so_far()
        ),
        Uprobes::Default => {}
    }
    target.signal(libc::SIGUSR1);

    let status = target.wait(Duration::from_secs(20)).expect("the target did not finish within 20 s");
    let target_exit = SystemTime::now();
    assert!(status.success(), "target exit status {status:?}");
    let o = running.wait(TIMEOUT);
    let lag = target_exit.elapsed().unwrap_or_default();
    o.assert_success();
    // The recording ends when the target exits (the default --duration of 30 s would otherwise
    // keep it going): the outputs are written right after. Detaching the probes may take the
    // process a little longer.
    let written = std::fs::metadata(out.file("report.json")).and_then(|m| m.modified()).expect("report.json mtime");
    let write_lag = written.duration_since(target_exit).unwrap_or_default();
    assert!(
        write_lag < Duration::from_secs(3),
        "report.json was written {write_lag:?} after the target exited\n{}",
        o.describe()
    );
    assert!(lag < Duration::from_secs(15), "leaktrace exited {lag:?} after the target\n{}", o.describe());

    assert_outputs_exist(&out.path);
    let r = Report::load(&out.path);
    assert_eq!(r.get(&["end_reason"]), "target-exited", "end_reason");
    let t = r.get(&["target"]);
    assert_eq!(t["pid"].as_u64(), Some(target.pid as u64), "target.pid: {t}");
    assert_eq!(t["launched"].as_bool(), Some(false), "target.launched: {t}");
    assert!(t["exit_status"].is_null(), "target.exit_status is null when attached: {t}");
    assert!(str_of(t, "command").contains("leaky"), "target.command: {t}");
    assert_leaky_report(&r, mode, 400);
}

#[test]
fn malloc_leak_found_in_attach_mode() {
    attach_mode("malloc");
}

#[test]
fn realloc_growth_found_in_attach_mode() {
    attach_mode("realloc");
}

/// The fallback of kernels without uprobe_multi links, forced: the same findings.
#[test]
fn malloc_leak_found_with_single_uprobes() {
    attach_mode_with("malloc", Uprobes::Single);
}
