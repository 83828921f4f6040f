//! Hostile live-process conditions, each on a real process with real probes: a
//! target under a strict seccomp allow-list, a target that execs mid-recording (itself, or
//! another program), a binary and a library replaced or deleted on disk while they run, a
//! target killed by the OOM killer or by SIGKILL, and two leaktrace runs on one target at once.
//! Fixtures are built -O2 without frame pointers, as distributions build.
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use leaktrace_tests::*;
use serde_json::Value;

fn build(cmd: &mut Command, what: &str) {
    let o = cmd.output().unwrap_or_else(|e| panic!("cannot build {what}: {e}"));
    assert!(o.status.success(), "building {what} failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

fn gcc() -> Command {
    let mut c = Command::new("gcc");
    c.args(["-O2", "-g", "-fomit-frame-pointer", "-Wall"]);
    c
}

/// tests/fixtures/hostile.c, built -O2 without frame pointers.
fn hostile() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("hostile-hostile", |dir| {
            let bin = dir.join("hostile");
            build(gcc().arg("-o").arg(&bin).arg(fixture_source("hostile.c")), "hostile.c");
        })
        .join("hostile")
    })
}

/// tests/fixtures/threads.c (short-lived leaking threads; `LEADER_EXITS=1`: the main thread
/// exits first), built as production.rs builds it.
fn threads() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("hostile-threads", |dir| {
            let bin = dir.join("threads");
            let mut cc = Command::new("gcc");
            cc.args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"]).arg(&bin);
            build(cc.arg(fixture_source("threads.c")), "threads.c");
        })
        .join("threads")
    })
}

/// One exact-mode recording's site totals of `function` (its culprit frame).
fn site_live(report: &Report, function: &str) -> u64 {
    u64_of(report.site(function), "live_bytes")
}

/// A target started with WAIT_FOR_SIGNAL=1 and a leaktrace attached to it (`--pid`, plus
/// `extra`); the target is let go once leaktrace says it attached.
fn attach_and_go(target: &Target, out: &OutDir, extra: &[&str]) -> Running {
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--quiet", "--out"]);
    cmd.arg(&out.path).args(extra).arg("--pid").arg(target.pid.to_string());
    let mut lt = Running::spawn(cmd, None);
    lt.wait_for_stderr_line("leaktrace: attached", TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    target.signal(libc::SIGUSR1);
    lt
}

fn waiting(bin: &Path, args: &[&str]) -> Target {
    let mut cmd = Command::new(bin);
    cmd.args(args).env("WAIT_FOR_SIGNAL", "1");
    let t = Target::spawn(cmd);
    t.expect_pid_line();
    t
}

fn seccomp_field(pid: u32) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("Seccomp:")).map(|v| v.trim().to_string())
}

/// The lines a fixture prints after its PID line (deterministic ones).
fn result_lines(stdout: &str) -> Vec<String> {
    stdout.lines().filter(|l| l.starts_with("checksum ") || l.starts_with("done ")).map(String::from).collect()
}

/// A process under a strict seccomp allow-list (kill on anything else, the `uretprobe` syscall
/// not listed) is traced with entry and return probes, launched and attached: it survives, its
/// output is that of an untraced run, and its leak is measured to the byte. On this kernel
/// (6.18: the `uretprobe` syscall passes seccomp) leaktrace does not refuse; the refusal on
/// 6.11–6.13 is unit-tested in leaktrace/src/seccomp.rs.
#[test]
fn seccomp_filtered_target_survives_tracing() {
    require_root();
    const N: u64 = 300;
    let plain = Command::new(hostile()).args(["seccomp", "300", "100"]).output().expect("run hostile");
    assert!(plain.status.success(), "the untraced run failed: {plain:?}");
    let expected = result_lines(&String::from_utf8_lossy(&plain.stdout));
    assert_eq!(expected.len(), 2, "untraced output: {plain:?}");

    // Launched: the filter is installed by the command after the probes are in place.
    let out = OutDir::new("seccomp-launch");
    let mut target = Command::new(hostile());
    target.args(["seccomp", "300", "100"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    assert_eq!(result_lines(&o.stdout), expected, "the traced run's output changed\n{}", o.describe());
    let report = Report::load(&out.path);
    assert_eq!(report.get(&["target", "exit_status"]).as_i64(), Some(0), "{}", o.describe());
    assert_eq!(site_live(&report, "leak_under_seccomp"), N * LEAK_BYTES, "{}", report.summary());

    // Attached to a process already under its filter (Seccomp: 2 in /proc/PID/status).
    let mut t = waiting(hostile(), &["seccomp", "300", "100"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while seccomp_field(t.pid).as_deref() != Some("2") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(seccomp_field(t.pid).as_deref(), Some("2"), "the fixture did not install its filter");
    let out = OutDir::new("seccomp-attach");
    let o = attach_and_go(&t, &out, &[]).wait(TIMEOUT);
    o.assert_success();
    assert!(
        !o.stderr.contains("seccomp filter") && !o.stderr.contains("allow-seccomp-risk"),
        "no seccomp refusal or warning expected on this kernel\n{}",
        o.describe()
    );
    let status = t.wait(Duration::from_secs(30)).expect("the target ended");
    assert!(
        status.success(),
        "the seccomp-filtered target did not survive tracing: {status:?} (signal {:?})",
        status.signal()
    );
    let mut lines = Vec::new();
    while let Some(l) = t.next_line(Duration::from_secs(1)) {
        lines.push(l);
    }
    assert_eq!(result_lines(&lines.join("\n")), expected, "the attached run's output changed");
    let report = Report::load(&out.path);
    assert_eq!(site_live(&report, "leak_under_seccomp"), N * LEAK_BYTES, "{}", report.summary());
}

/// The recording's `target.execs`.
fn execs(report: &Report) -> Vec<Value> {
    report.get(&["target", "execs"]).as_array().cloned().unwrap_or_default()
}

/// A worker that re-execs itself (the same file: the same inode) mid-recording, attached with
/// --pid: the leak made before the exec and the other leak made after are both measured to the
/// byte, and the exec is noted in report.json and report.md.
#[test]
fn exec_of_itself_mid_recording_keeps_both_images_leaks() {
    require_root();
    const N: u64 = 150;
    let mut t = waiting(hostile(), &["exec", "150", "100"]);
    let out = OutDir::new("exec-self");
    let o = attach_and_go(&t, &out, &[]).wait(TIMEOUT);
    o.assert_success();
    let status = t.wait(Duration::from_secs(30)).expect("the target ended");
    assert!(status.success(), "target: {status:?}");
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_eq!(site_live(&report, "leak_before_exec"), N * LEAK_BYTES, "{ctx}");
    assert_eq!(site_live(&report, "leak_after_exec"), 2 * N * LEAK_BYTES, "{ctx}");
    let ex = execs(&report);
    assert_eq!(ex.len(), 1, "one exec expected in target.execs: {ex:?}\n{ctx}");
    assert!(str_of(&ex[0], "command").contains("hostile after 150"), "{ex:?}");
    assert!(str_of(&ex[0], "to").ends_with("/hostile"), "{ex:?}");
    // N iterations at 100/s before the exec: noticed after ~1.5 s, well before the end.
    let t_s = f64_of(&ex[0], "t_s");
    assert!(t_s > 0.5 && t_s < f64_of(&report.json, "duration_s"), "exec at {t_s}\n{ctx}");
    let md = std::fs::read_to_string(out.file("report.md")).expect("report.md");
    assert!(md.contains("exec'd `hostile after 150 100`"), "report.md does not note the exec:\n{md}");
    assert!(o.stderr.contains("exec'd"), "{}", o.describe());
}

/// A wrapper that execs another program (leaky), launched: the wrapper's leak and the
/// program's are both there, and the exec names the new executable.
#[test]
fn wrapper_exec_into_another_program_is_followed() {
    require_root();
    let out = OutDir::new("exec-wrap");
    let leaky = &fixtures().leaky;
    let mut target = Command::new(hostile());
    target.args(["wrap", "100", "100"]).arg(leaky).args(["malloc", "200", "100"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_eq!(site_live(&report, "leak_in_wrapper"), 100 * LEAK_BYTES, "{ctx}");
    assert_eq!(site_live(&report, "leak_malloc"), 200 * LEAK_BYTES, "{ctx}");
    let ex = execs(&report);
    assert_eq!(ex.len(), 1, "{ex:?}\n{ctx}");
    assert!(str_of(&ex[0], "from").ends_with("/hostile"), "{ex:?}");
    assert!(str_of(&ex[0], "to").ends_with("/leaky"), "{ex:?}");
    assert!(report.get(&["target", "exe"]).as_str().is_some_and(|e| e.ends_with("/leaky")), "{ctx}");
}

/// A launched wrapper from the distribution (`/usr/bin/env`) execs a program built -O2 without
/// frame pointers that is done in about a millisecond (200 leaks at 1 M/s): the kernel side
/// holds the exec until the new image is probed and its unwind tables loaded, so every leak is
/// measured to the byte under its function's name with its caller (without the hold the
/// program ran unprobed but for the wrapper's libc: its stacks ended at the culprit, no table
/// for it yet) and the report names the program.
#[test]
fn short_program_behind_an_exec_wrapper_is_traced_from_its_start() {
    require_root();
    let out = OutDir::new("exec-env-short");
    let mut target = Command::new("/usr/bin/env");
    target.arg("LEAKTRACE_TEST=1").arg(hostile()).args(["after", "200", "1000000"]);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_eq!(site_live(&report, "leak_after_exec"), 200 * 2 * LEAK_BYTES, "{ctx}");
    assert_culprit_frames(report.site("leak_after_exec"), "leak_after_exec", "hostile.c", &["main"], &ctx);
    let ex = execs(&report);
    assert_eq!(ex.len(), 1, "{ex:?}\n{ctx}");
    assert!(str_of(&ex[0], "to").ends_with("/hostile"), "{ex:?}");
    assert!(report.get(&["target", "exe"]).as_str().is_some_and(|e| e.ends_with("/hostile")), "{ctx}");
}

/// A launched shell (`/bin/sh -c`, dash: it forks a child that execs the program) with
/// --follow-forks: the child, not yet followed when it execs (the agent learns of forks at its
/// polls), is held at the exec until followed and probed, libraries the loader will load
/// included, so the short program's leaks are all there, with their callers, in the child's
/// own report (without the hold it was over before the agent saw the fork).
#[test]
fn short_child_of_a_launched_shell_is_followed_from_its_exec() {
    require_root();
    let out = OutDir::new("exec-sh-child");
    let mut target = Command::new("/bin/sh");
    target.arg("-c").arg(format!("{} after 200 1000000; true", hostile().display()));
    let o = record_launch(&out, &["--follow-forks"], target);
    o.assert_success();
    let reports: Vec<Report> = std::fs::read_dir(&out.path)
        .expect("the output directory")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("pid-"))
        .map(|e| Report::load(&e.path()))
        .collect();
    let child: Vec<&Report> = reports
        .iter()
        .filter(|r| r.get(&["target", "exe"]).as_str().is_some_and(|e| e.ends_with("/hostile")))
        .collect();
    assert_eq!(child.len(), 1, "one report of the program, in {} reports\n{}", reports.len(), o.describe());
    let ctx = format!("{}\n{}", o.describe(), child[0].summary());
    assert_eq!(site_live(child[0], "leak_after_exec"), 200 * 2 * LEAK_BYTES, "{ctx}");
    assert_culprit_frames(child[0].site("leak_after_exec"), "leak_after_exec", "hostile.c", &["main"], &ctx);
}

/// The program and its library are replaced on disk by other builds (the program renamed over,
/// as deployments do; the library deleted) after the process started and before leaktrace
/// attaches: discovery, the unwind tables and symbols come from the mapped files (map_files),
/// so both leaks carry their own function names, and no name of the other build appears.
#[test]
fn replaced_and_deleted_files_are_read_from_the_mapping() {
    require_root();
    let root = temp_root().join("replaced");
    let (a, b, run) = (root.join("a"), root.join("b"), root.join("run"));
    for d in [&a, &b, &run] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let src = fixture_source("replaced.c");
    for (dir, variant) in [(&a, None), (&b, Some("-DVARIANT_B"))] {
        let lib = dir.join("libreplaced.so");
        build(gcc().args(variant).args(["-DLIB", "-shared", "-fPIC", "-o"]).arg(&lib).arg(&src), "libreplaced.so");
        build(
            gcc()
                .args(variant)
                .arg("-o")
                .arg(dir.join("replaced"))
                .arg(&src)
                .arg("-L")
                .arg(dir)
                .args(["-lreplaced", "-Wl,-rpath,$ORIGIN"]),
            "replaced",
        );
    }
    for f in ["replaced", "libreplaced.so"] {
        std::fs::copy(a.join(f), run.join(f)).expect("copy build A");
    }
    const N: u64 = 200;
    let mut t = waiting(&run.join("replaced"), &["200", "100"]);
    // The deployment: the program replaced by build B (a new file renamed over the path), the
    // library deleted.
    std::fs::copy(b.join("replaced"), run.join("replaced.new")).expect("copy build B");
    std::fs::rename(run.join("replaced.new"), run.join("replaced")).expect("rename over");
    std::fs::remove_file(run.join("libreplaced.so")).expect("delete the library");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).expect("maps");
    assert!(maps.contains("replaced (deleted)"), "the mapped files should show as deleted:\n{maps}");

    let out = OutDir::new("replaced");
    let o = attach_and_go(&t, &out, &[]).wait(TIMEOUT);
    o.assert_success();
    assert!(t.wait(Duration::from_secs(30)).is_some_and(|s| s.success()), "the target failed");
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_eq!(site_live(&report, "exe_leak"), N * LEAK_BYTES, "{ctx}");
    assert_eq!(site_live(&report, "lib_leak"), 2 * N * LEAK_BYTES, "{ctx}");
    for f in ["exe_leak", "lib_leak"] {
        let frames = report.site(f)["frames"].as_array().cloned().unwrap_or_default();
        let names: Vec<&str> = frames.iter().filter_map(|f| f["function"].as_str()).collect();
        assert!(names.iter().any(|n| function_base(n) == "main"), "{f}: the walk should reach main: {names:?}");
    }
    let rec = std::fs::read_to_string(out.file("recording.json")).expect("recording.json");
    assert!(!rec.contains("variant_b_"), "a frame was symbolized from the replacing build B\n{ctx}");
}

/// A launched command that moves itself into a cgroup with 48 MiB of memory and leaks 1 MiB
/// blocks until the OOM killer kills it: the outputs are written, the report says it was
/// killed by the OOM killer (exit status 137 and oom:mark_victim naming it, with its anonymous
/// RSS then: most of the limit), and the leak site is there with the bytes it held.
#[test]
fn oom_killed_target_is_reported_with_its_leak() {
    require_root();
    const LIMIT: u64 = 48 << 20;
    let cg = MemCgroup::new(&format!("leaktrace-test-oom-{}", std::process::id()), LIMIT);
    let out = OutDir::new("oom");
    let mut target = Command::new(hostile());
    target.args(["oom", "1000", "50"]).env("LEAK_CGROUP", &cg.dir);
    let o = record_launch(&out, &[], target);
    o.assert_success();
    assert_outputs_exist(&out.path);
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_eq!(report.get(&["target", "exit_status"]).as_i64(), Some(137), "killed by SIGKILL\n{ctx}");
    assert_oom_victim(&report, LIMIT, &ctx);
    assert!(o.stdout.contains("command ended: killed by the OOM killer"), "{}", o.describe());
    let md = std::fs::read_to_string(out.file("report.md")).expect("report.md");
    assert!(md.contains("killed by the OOM killer"), "report.md:\n{md}");
    // It held (nearly) the cgroup's memory in 1 MiB blocks when killed.
    let live = site_live(&report, "leak_until_oom");
    assert_eq!(live % (1 << 20), 0, "whole 1 MiB blocks\n{ctx}");
}

/// A target the OOM killer took while it leaked 1 MiB blocks into a cgroup of `limit` bytes: the
/// recording ended with it, `target.ended` says oom:mark_victim chose it, with an anonymous RSS
/// between a third of the limit and the limit (the leak's blocks were resident), and
/// `leak_until_oom` holds 16 MiB up to the limit. Returns `target.ended`.
fn assert_oom_victim(report: &Report, limit: u64, ctx: &str) -> String {
    assert_eq!(str_of(&report.json, "end_reason"), "target-exited", "{ctx}");
    let ended = report.get(&["target", "ended"]).as_str().unwrap_or_default().to_string();
    assert!(
        ended.starts_with("killed by the OOM killer (oom:mark_victim chose it at anon-rss "),
        "target.ended: {ended:?}\n{ctx}"
    );
    let kib: u64 = ended
        .split("anon-rss ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no anon-rss in {ended:?}\n{ctx}"));
    assert!((limit / 3..=limit).contains(&(kib << 10)), "anon-rss {kib} KiB, limit {limit} B\n{ctx}");
    let live = site_live(report, "leak_until_oom");
    assert!((16 << 20..=limit).contains(&live), "leak_until_oom live {live} B\n{ctx}");
    ended
}

/// An attached process that moves itself into a cgroup with 48 MiB of memory and leaks until
/// the OOM killer kills it: an attached tracer has no exit status, yet oom:mark_victim named the
/// process, so the report says it was killed by the OOM killer (not "most likely"), and the
/// leak site holds what it held.
#[test]
fn attached_target_killed_by_the_oom_killer_is_named_so() {
    require_root();
    const LIMIT: u64 = 48 << 20;
    let cg = MemCgroup::new(&format!("leaktrace-test-oom-attached-{}", std::process::id()), LIMIT);
    let mut cmd = Command::new(hostile());
    cmd.args(["oom", "1000", "50"]).env("WAIT_FOR_SIGNAL", "1").env("LEAK_CGROUP", &cg.dir);
    let mut t = Target::spawn(cmd);
    t.expect_pid_line();
    let out = OutDir::new("oom-attached");
    let lt = attach_and_go(&t, &out, &[]);
    assert!(t.wait(TIMEOUT).is_some_and(|s| s.signal() == Some(libc::SIGKILL)), "the target was not SIGKILLed");
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    assert_outputs_exist(&out.path);
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_oom_victim(&report, LIMIT, &ctx);
}

/// Another process of the traced one's memory cgroup is OOM-killed, then the traced process is
/// killed with a plain SIGKILL: oom:mark_victim did not name it, so the report says it was
/// killed, notes the cgroup's OOM kill as another's, and never calls it the OOM killer's (the
/// cgroup counter alone would have said "most likely killed by the OOM killer").
#[test]
fn oom_kill_of_another_process_in_the_cgroup_is_not_the_targets() {
    require_root();
    const LIMIT: u64 = 48 << 20;
    let cg = MemCgroup::new(&format!("leaktrace-test-oom-other-{}", std::process::id()), LIMIT);
    let mut t = waiting(hostile(), &["steady", "100000", "50"]);
    std::fs::write(cg.dir.join("cgroup.procs"), t.pid.to_string()).expect("move the target into the cgroup");
    let out = OutDir::new("oom-other");
    let lt = attach_and_go(&t, &out, &[]);
    // The agent reads the cgroup's counter at its next poll: then the other process leaks.
    std::thread::sleep(Duration::from_millis(1500));
    let mut other = Command::new(hostile());
    other.args(["oom", "1000", "50"]).env("LEAK_CGROUP", &cg.dir).stdout(std::process::Stdio::null());
    let st = other.status().expect("run the other leaker");
    assert_eq!(st.signal(), Some(libc::SIGKILL), "the other process was not OOM-killed: {st:?}");
    std::thread::sleep(Duration::from_millis(500));
    t.signal(libc::SIGKILL);
    assert!(t.wait(TIMEOUT).is_some_and(|s| s.signal() == Some(libc::SIGKILL)));
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    let ended = report.get(&["target", "ended"]).as_str().unwrap_or_default();
    assert!(
        ended.starts_with("exited (an attached process's exit status is visible only to its parent; the OOM killer did not choose it); its cgroup's OOM killer fired meanwhile (oom_kill of "),
        "target.ended: {ended:?}\n{ctx}"
    );
    assert!(!ended.contains("killed by the OOM killer"), "target.ended: {ended:?}\n{ctx}");
    assert!(site_live(&report, "leak_steady") > 0, "{ctx}");
    // The agent knew the cgroup to the end (its limit, the counter's file).
    assert_eq!(report.get(&["target", "memory_limit_bytes"]).as_u64(), Some(LIMIT), "{ctx}");
}

/// An attached process whose main thread exits while its other threads run stays in its memory
/// cgroup for the agent: the zombie main thread's /proc/PID/cgroup reads as the root cgroup on
/// cgroup v1 ("N:memory:/", as does any task that has begun to exit: a target killed between
/// two of the agent's reads once lost its cgroup so), yet the report keeps the cgroup's limit
/// and notes another process's OOM kill there after the main thread exited.
#[test]
fn cgroup_kept_after_the_main_thread_exits() {
    require_root();
    const LIMIT: u64 = 48 << 20;
    let cg = MemCgroup::new(&format!("leaktrace-test-oom-leader-{}", std::process::id()), LIMIT);
    let mut cmd = Command::new(threads());
    // The main thread exits at SIGUSR1; 12 threads, 4 at a time, 50 blocks each at 100/s: 1.5 s
    // of leaking, then 5 s of lingering while the other process is OOM-killed.
    cmd.args(["12", "50", "100"]).env("WAIT_FOR_SIGNAL", "1").env("LEADER_EXITS", "1").env("LINGER_MS", "5000");
    let mut t = Target::spawn(cmd);
    t.expect_pid_line();
    std::fs::write(cg.dir.join("cgroup.procs"), t.pid.to_string()).expect("move the target into the cgroup");
    let out = OutDir::new("oom-leader");
    let lt = attach_and_go(&t, &out, &[]);
    // Four of the agent's polls with the main thread exited.
    std::thread::sleep(Duration::from_millis(1000));
    let mut other = Command::new(hostile());
    other.args(["oom", "1000", "50"]).env("LEAK_CGROUP", &cg.dir).stdout(std::process::Stdio::null());
    let st = other.status().expect("run the other leaker");
    assert_eq!(st.signal(), Some(libc::SIGKILL), "the other process was not OOM-killed: {st:?}");
    assert!(t.wait(TIMEOUT).is_some_and(|s| s.success()), "the target did not exit 0 after its linger");
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_eq!(report.get(&["target", "memory_limit_bytes"]).as_u64(), Some(LIMIT), "{ctx}");
    let ended = report.get(&["target", "ended"]).as_str().unwrap_or_default();
    assert!(
        ended.contains("; its cgroup's OOM killer fired meanwhile (oom_kill of "),
        "target.ended: {ended:?}\n{ctx}"
    );
}

/// An attached target killed by SIGKILL mid-run: outputs written, the leak so far kept, and the
/// report says what an attached tracer can know (no exit status, no OOM kill).
#[test]
fn attached_target_killed_mid_run_keeps_its_recording() {
    require_root();
    let mut t = waiting(hostile(), &["steady", "100000", "200"]);
    let out = OutDir::new("sigkill");
    let lt = attach_and_go(&t, &out, &[]);
    std::thread::sleep(Duration::from_secs(3));
    t.signal(libc::SIGKILL);
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    assert!(t.wait(Duration::from_secs(10)).is_some_and(|s| s.signal() == Some(libc::SIGKILL)));
    assert_outputs_exist(&out.path);
    let report = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.describe(), report.summary());
    assert_eq!(str_of(&report.json, "end_reason"), "target-exited", "{ctx}");
    let ended = report.get(&["target", "ended"]).as_str().unwrap_or_default();
    assert!(ended.starts_with("exited (an attached process's exit status"), "target.ended: {ended:?}\n{ctx}");
    let md = std::fs::read_to_string(out.file("report.md")).expect("report.md");
    assert!(md.contains("the process ended during the recording: exited (an attached"), "report.md:\n{md}");
    // ~3 s at 200/s: at least 1 s worth, at most 6 s worth.
    let live = site_live(&report, "leak_steady");
    assert!((200 * LEAK_BYTES..=1200 * LEAK_BYTES).contains(&live), "leak_steady live {live} B\n{ctx}");
}

/// leaktrace SIGKILLed while the command it launched is held stopped (as at the command's
/// teardown, between the teardown probe's SIGSTOP and the agent's SIGCONT after its last
/// checkpoint): the command goes on — leaktrace's guardian process, which outlives it, sends
/// SIGCONT — instead of staying stopped forever. leaktrace runs under a shell that stays (as in
/// a script, a CI job or `kubectl exec`): its process group is not orphaned, so the kernel's
/// SIGHUP+SIGCONT to an orphaned group does not come to the rescue. Without the guardian the
/// command stays in state T.
#[test]
fn launched_command_is_not_left_stopped_when_leaktrace_is_killed() {
    require_root();
    let out = OutDir::new("guardian");
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg("\"$0\" \"$@\"; sleep 30").arg(leaktrace_bin());
    cmd.args(["record", "--duration", "60s", "--out"]).arg(&out.path).arg("--");
    cmd.arg(hostile()).args(["steady", "100000", "200"]);
    let mut sh = Running::spawn(cmd, None);
    let line = sh.wait_for_stderr_line("leaktrace: attached to PID ", TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    let pid: i32 = line
        .trim_start_matches("leaktrace: attached to PID ")
        .split(' ')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no PID in {line:?}"));
    let stat = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    let state = |pid: i32| {
        stat(pid).and_then(|s| s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next().map(str::to_string)))
    };
    // The command's parent is leaktrace (ppid: the second field after the name).
    let agent: i32 = stat(pid)
        .and_then(|s| s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1).and_then(|p| p.parse().ok())))
        .expect("the command's parent");
    assert_ne!(agent as u32, sh.pid(), "leaktrace is not the command's parent");
    // SAFETY: signals to the test's own processes.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while state(pid).as_deref() != Some("T") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(state(pid).as_deref(), Some("T"), "the command did not stop");
    // SAFETY: as above.
    unsafe { libc::kill(agent, libc::SIGKILL) };
    // The guardian checks every 100 ms.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while state(pid).as_deref() == Some("T") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = state(pid);
    // SAFETY: as above; the command and the shell's group (its `sleep`) are ended either way.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::kill(-(sh.pid() as i32), libc::SIGKILL);
    }
    let o = sh.wait(TIMEOUT);
    assert!(
        after.is_some() && after.as_deref() != Some("T"),
        "the command stayed stopped ({after:?})\n{}",
        o.describe()
    );
}

/// The cumulative allocation count of the stacks through `function`, at each checkpoint of the
/// recording in `dir`, as (Unix time in ms, count).
fn count_series(dir: &Path, function: &str) -> Vec<(f64, u64)> {
    let text = std::fs::read_to_string(dir.join("recording.json")).expect("recording.json");
    let rec: Value = serde_json::from_str(&text).expect("recording.json parses");
    let ids: Vec<u64> = rec["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["frames"].as_array().is_some_and(|f| f.iter().any(|f| f["function"].as_str() == Some(function))))
        .filter_map(|s| s["id"].as_u64())
        .collect();
    let start = f64_of(&rec, "started_unix_ms");
    let mut last: std::collections::HashMap<u64, u64> = Default::default();
    let mut out = Vec::new();
    for cp in rec["checkpoints"].as_array().expect("checkpoints") {
        for s in cp["sites"].as_array().into_iter().flatten() {
            let id = s["stack"].as_u64().unwrap_or(u64::MAX);
            if ids.contains(&id) {
                last.insert(id, u64_of(s, "alloc_count"));
            }
        }
        out.push((start + f64_of(cp, "t_s") * 1000.0, last.values().sum()));
    }
    out
}

/// The count of `series` at Unix time `ms` (the last checkpoint at or before it).
fn count_at(series: &[(f64, u64)], ms: f64) -> u64 {
    series.iter().take_while(|(t, _)| *t <= ms).last().map(|(_, c)| *c).unwrap_or(0)
}

/// Two leaktrace runs on one target at once: each sees every call while both run, and when the
/// first one detaches the second's probes stay: it goes on counting every call to the end.
#[test]
fn two_tracers_on_one_target_both_see_every_call() {
    require_root();
    const N: u64 = 1600; // 8 s at 200/s
    const RATE: f64 = 200.0;
    let mut t = waiting(hostile(), &["steady", "1600", "200"]);
    let (out_a, out_b) = (OutDir::new("two-a"), OutDir::new("two-b"));
    let spawn = |out: &OutDir, extra: &[&str]| {
        let mut cmd = leaktrace(["record", "--interval", "250ms", "--quiet", "--out"]);
        cmd.arg(&out.path).args(extra).arg("--pid").arg(t.pid.to_string());
        let mut lt = Running::spawn(cmd, None);
        lt.wait_for_stderr_line("leaktrace: attached", TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
        lt
    };
    let b = spawn(&out_b, &[]);
    let a = spawn(&out_a, &["--duration", "4s"]);
    t.signal(libc::SIGUSR1);
    let oa = a.wait(TIMEOUT);
    oa.assert_success();
    let ob = b.wait(TIMEOUT);
    ob.assert_success();
    assert!(t.wait(Duration::from_secs(30)).is_some_and(|s| s.success()), "the target failed");
    let ctx = format!("--- A ---\n{}\n--- B ---\n{}", oa.describe(), ob.describe());

    // B was attached from before the first call to after the last: every call, exactly.
    let rb = Report::load(&out_b.path);
    let site_b = rb.site("leak_steady");
    assert_eq!(u64_of(site_b, "allocations"), N, "B's count\n{ctx}\n{}", rb.summary());
    assert_eq!(site_live(&rb, "leak_steady"), N * LEAK_BYTES, "{ctx}");

    // While both ran, A counted what B counted (checkpoints at different instants: within
    // 0.4 s of calls at 200/s).
    let (sa, sb) = (count_series(&out_a.path, "leak_steady"), count_series(&out_b.path, "leak_steady"));
    let (a_end_ms, a_count) = *sa.last().expect("A has checkpoints");
    assert!(a_count > 200, "A saw {a_count} calls in its ~4 s\n{ctx}");
    let b_then = count_at(&sb, a_end_ms) as f64;
    let tol = 0.5 * RATE + 0.05 * a_count as f64;
    assert!(
        (a_count as f64 - b_then).abs() <= tol,
        "A counted {a_count} by its end, B {b_then} at that instant (tolerance {tol})\n{ctx}"
    );
    // After A detached, B kept counting at the target's rate (checkpoints from 1 s after A's
    // end until the target's last call).
    let after: Vec<&(f64, u64)> = sb.iter().filter(|(ms, c)| *ms > a_end_ms + 1000.0 && *c < N).collect();
    assert!(after.len() >= 4, "B has too few checkpoints after A ended: {sb:?}\n{ctx}");
    let (first, last) = (after[0], after[after.len() - 1]);
    let rate = (last.1 - first.1) as f64 / ((last.0 - first.0) / 1000.0);
    assert_within("B's calls/s after A detached", rate, RATE, 0.25, &ctx);
    assert!(last.1 > count_at(&sb, a_end_ms), "B's count did not grow after A detached: {sb:?}\n{ctx}");
}
