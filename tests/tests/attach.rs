//! Attach mode (`leaktrace record --pid PID`): the fixture waits for SIGUSR1, which the test sends
//! once leaktrace printed `leaktrace: attached`; leaktrace ends when the target exits.
use std::process::Command;
use std::time::{Duration, SystemTime};

use leaktrace_tests::*;

fn attach_mode(mode: &str) {
    require_root();
    let fx = fixtures();
    let mut cmd = Command::new(&fx.leaky);
    cmd.args([mode, "400", "200"]).env("WAIT_FOR_SIGNAL", "1");
    let mut target = Target::spawn(cmd);
    target.expect_pid_line();

    let out = OutDir::new(&format!("attach-{mode}"));
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--interval", "250ms", "--out"]);
    lt.arg(&out.path);
    let mut running = Running::spawn(lt, None);
    running.wait_for_stderr_line("leaktrace: attached", Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
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
