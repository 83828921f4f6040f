//! A real program nobody here wrote: CPython (with a shared libpython) growing a list of 1 KiB
//! bytes objects, traced by `leaktrace record --pid PID` until the script says it is done (then
//! SIGINT ends the recording: the test does not depend on how fast a loaded machine runs it).
use std::process::Command;
use std::time::Duration;

use leaktrace_tests::*;

const OBJECTS: u64 = 10_000;

#[test]
fn python_list_growth_traced_into_libpython() {
    require_root();
    let fx = fixtures();
    let mut cmd = Command::new(python());
    cmd.arg(&fx.grow_list_py).args([&OBJECTS.to_string(), "10000"]).env("WAIT_FOR_SIGNAL", "1").env("LINGER_S", "30");
    let target = Target::spawn(cmd);
    target.expect_pid_line();

    let out = OutDir::new("python");
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--interval", "500ms", "--out"]);
    lt.arg(&out.path);
    let mut running = Running::spawn(lt, None);
    running.wait_for_stderr_line("leaktrace: attached", Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"));
    target.signal(libc::SIGUSR1);
    let done = wait_for(Duration::from_secs(90), || {
        target.next_line(Duration::from_millis(500)).filter(|l| l.starts_with("done"))
    });
    assert!(done.is_some(), "the python script did not finish growing its list in 90 s");
    // One more checkpoint with everything live, then stop.
    std::thread::sleep(Duration::from_millis(1200));
    running.signal(libc::SIGINT);
    let o = running.wait(TIMEOUT);
    o.assert_success();
    assert!(target.exit_status().is_none(), "python exited before the end of the recording");
    assert_outputs_exist(&out.path);

    let r = Report::load(&out.path);
    let ctx = format!("report {}:\n{}", out.path.display(), r.summary());
    let python_frames: Vec<&Value> = r
        .sites()
        .iter()
        .flat_map(|s| s["frames"].as_array().into_iter().flatten())
        .filter(|f| {
            f["object"].as_str().is_some_and(|o| o.contains("libpython"))
                && f["function"].as_str().is_some_and(|n| !n.is_empty())
        })
        .collect();
    assert!(!python_frames.is_empty(), "no frame in libpython with a function name\n{ctx}");

    // The 10 000 objects of 1 KiB (+ object header) are live at the end.
    let live: u64 = r.sites().iter().map(|s| u64_of(s, "live_bytes")).sum();
    let expected = OBJECTS * 1024;
    assert!(live >= expected * 9 / 10, "live bytes {live} < 90% of {expected}\n{ctx}");
    // The largest site is reached through libpython, and its culprit is named.
    let top = &r.sites()[0];
    assert!(!str_of(top, "function").is_empty(), "largest site has no culprit name\n{ctx}");
    assert!(
        top["frames"].as_array().unwrap().iter().any(|f| f["object"].as_str().is_some_and(|o| o.contains("libpython"))),
        "the largest site has no libpython frame\n{ctx}"
    );
    let t = r.get(&["target"]);
    assert_eq!(t["pid"].as_u64(), Some(target.pid as u64));
    assert_eq!(t["launched"].as_bool(), Some(false));
    assert_eq!(r.get(&["end_reason"]).as_str(), Some("signal"), "ended by SIGINT\n{ctx}");
}
