//! Hostile targets (docs/reliability.md, "What a hostile target can and cannot do"): each test
//! plays the target for real (an unprivileged user's own JDK, a thread ptrace cannot stop, an
//! agent killed while the target's debugger port is open) and asserts what the target did not
//! get.
#![allow(
    clippy::print_stderr,
    reason = "end-to-end tests tell their measured figures on stderr (shown with --nocapture)"
)]
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use leaktrace_tests::*;

/// The unprivileged user that plays the target.
const NOBODY: u32 = 65534;

/// A scratch directory (mode 0755, root's) removed at the end.
fn scratch(name: &str) -> OutDir {
    let d = OutDir::new(name);
    std::fs::create_dir_all(&d.path).unwrap();
    std::fs::set_permissions(&d.path, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn sh(script: &str) {
    let o = Command::new("sh").args(["-c", script]).output().expect("sh");
    assert!(o.status.success(), "`{script}` failed: {}", String::from_utf8_lossy(&o.stderr));
}

/// A copy of the installed JDK 17 in `dir`, owned by `nobody`, whose `bin/jcmd` (and `bin/jps`,
/// `bin/java`'s siblings an attach client might run) writes a line to `marker` instead:
/// whoever runs it leaves a trace. Returns the copy's home.
fn hostile_jdk(dir: &Path, marker: &Path) -> PathBuf {
    let home = dir.join("jdk");
    let installed = std::fs::canonicalize("/usr/lib/jvm/java-17-openjdk-amd64").expect("JDK 17 installed");
    std::fs::create_dir(&home).unwrap();
    let i = installed.display();
    sh(&format!("for x in bin conf lib release; do [ ! -e '{i}'/$x ] || cp -a '{i}'/$x '{}'/; done", home.display()));
    for tool in ["jcmd", "jps", "jhsdb", "jmap"] {
        let p = home.join("bin").join(tool);
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, format!("#!/bin/sh\necho \"uid $(id -u) ran {tool} $*\" >> '{}'\n", marker.display()))
            .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    sh(&format!("chown -hR {NOBODY}:{NOBODY} '{}'", home.display()));
    home
}

/// The target's own JDK is not run: a JVM of `nobody` started from a JDK copy that `nobody`
/// owns, whose `bin/jcmd` is a script leaving a marker. `record --heap-census --jvm-perf-map`
/// gets the class histograms (naming the fixture's `KeepsTickets$Ticket`, growing) and the
/// JVM's flags through HotSpot's attach socket, spoken by leaktrace itself as the JVM's user;
/// the marker is never written (by anyone), and the attach file leaktrace created is gone.
#[test]
fn the_jvms_own_jcmd_is_never_run() {
    require_root();
    let d = scratch("hostile-jdk");
    let markers = d.path.join("markers");
    std::fs::create_dir(&markers).unwrap();
    std::fs::set_permissions(&markers, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = markers.join("ran");
    let home = hostile_jdk(&d.path, &marker);
    let classes = d.path.join("classes");
    std::fs::create_dir(&classes).unwrap();
    run_build_step(
        Command::new("javac").arg("-d").arg(&classes).arg(fixture_source("hostile").join("KeepsTickets.java")),
        "javac",
    );
    sh(&format!("chmod -R a+rX '{}'", classes.display()));
    let mut cmd = Command::new(home.join("bin/java"));
    cmd.args(["-Xmx64m", "-XX:+UseSerialGC", "-cp"]).arg(&classes).arg("KeepsTickets");
    cmd.current_dir(&d.path).uid(NOBODY).gid(NOBODY);
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    let out = OutDir::new("hostile-jdk-out");
    let mut lt = leaktrace([
        "record",
        "--heap-census",
        "--jvm-perf-map",
        "--pid",
        &target.pid.to_string(),
        "--duration",
        "8s",
        "--out",
    ]);
    lt.arg(&out.path);
    let o = run(lt, None, Duration::from_secs(180));
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(ran.is_empty(), "the target's own JDK tools were run:\n{ran}\n{}", o.describe());
    o.assert_success();
    let r = Report::load(&out.path);
    let jvm = &r.json["runtime_holds"]["jvm"];
    let ctx = format!("{}\nruntime_holds: {:#}", o.describe(), r.json["runtime_holds"]);
    for at in ["start", "end"] {
        assert!(jvm[at]["taken"]["took_s"].as_f64().is_some(), "no {at} histogram\n{ctx}");
    }
    let list = jvm["growing_classes"].as_array().cloned().unwrap_or_default();
    let ticket = list.iter().find(|g| g["name"] == "KeepsTickets$Ticket");
    let ticket = ticket.unwrap_or_else(|| panic!("KeepsTickets$Ticket does not grow\n{ctx}"));
    // 200 a second asked (5 ms sleeps; fewer on a loaded machine).
    let rate = f64_of(ticket, "instances_per_s");
    assert!((100.0..=220.0).contains(&rate), "Ticket grows {rate:.1}/s\n{ctx}");
    assert!(
        r.json.to_string().contains("jcmd VM.flags: PreserveFramePointer = false"),
        "VM.flags was not read over the attach socket\n{ctx}"
    );
    let pid = target.pid;
    assert!(!Path::new(&format!("/tmp/.attach_pid{pid}")).exists(), "the attach file was left behind");
    drop(target);
    // The socket the JVM made (it is killed, not ended: it cannot remove it).
    let _ = std::fs::remove_file(format!("/tmp/.java_pid{pid}"));
    assert!(!marker.exists(), "marker written");
}

/// tests/fixtures/hostile/vfork_stuck.c, built once.
fn vfork_stuck() -> PathBuf {
    let out = fixture_build_dir("hostile_targets").join("vfork_stuck");
    if !out.exists() {
        compile_with("gcc", &[&fixture_source("hostile").join("vfork_stuck.c")], &out, &["-pthread"]);
    }
    out
}

/// The thread of `pid` in state D (uninterruptible), if any.
fn thread_in_d(pid: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).find(|&t| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{t}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('D')))
    })
}

/// A thread ptrace cannot stop does not hold the target stopped: vfork_stuck's side thread
/// waits in the kernel for its vfork child (state D, where PTRACE_INTERRUPT does not reach it).
/// `record --reachability --reachability-max-pause 2s`: the main thread's own heartbeat never
/// misses more than the cap + 1 s (a gap it measures itself), the run ends, the report names
/// the thread that was not stopped and calls the scan not complete, and no thread of the target
/// is left traced.
#[test]
fn a_thread_that_cannot_be_stopped_does_not_hold_the_target() {
    require_root();
    let target = Target::spawn(Command::new(vfork_stuck()));
    target.expect_pid_line();
    let stuck = wait_for(Duration::from_secs(10), || thread_in_d(target.pid))
        .expect("the side thread never waited for its vfork child");
    let out = OutDir::new("hostile-vfork");
    let mut lt = leaktrace(["record", "--reachability", "--reachability-max-pause", "2s", "--duration", "3s"]);
    lt.arg("--pid").arg(target.pid.to_string()).arg("--out").arg(&out.path);
    let t = Instant::now();
    let o = run(lt, None, Duration::from_secs(120));
    let took = t.elapsed();
    let mut gaps = Vec::new();
    while let Some(l) = target.next_line(Duration::from_millis(500)) {
        if let Some(ms) = l.strip_prefix("gap ").and_then(|g| g.parse::<f64>().ok()) {
            gaps.push(ms);
        }
    }
    let worst = gaps.iter().copied().fold(0.0, f64::max);
    eprintln!("hostile-vfork: leaktrace took {took:?}; the target's longest gap {worst:.0} ms (gaps {gaps:?})");
    o.assert_success();
    assert!(worst <= 3000.0, "the target was held {worst:.0} ms (cap 2 s + 1 s)\n{}", o.describe());
    let r = Report::load(&out.path);
    let reach = r.json["reachability"].to_string();
    assert!(
        reach.contains("could not be stopped") && reach.contains(&stuck.to_string()),
        "the report does not name thread {stuck} as not stopped: {reach}\n{}",
        o.describe()
    );
    assert_eq!(r.json["reachability"]["complete"], false, "{reach}");
    for task in std::fs::read_dir(format!("/proc/{}/task", target.pid)).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap_or_default();
        let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).unwrap_or("0").trim().to_string();
        assert_eq!(tracer, "0", "a thread of the target is still traced");
    }
    assert!(target.exit_status().is_none(), "the target ended");
}

/// Node running audit.js in a network namespace of its own (its loopback up): its inspector's
/// port 9229 is its own, whatever else runs on the host. Started, its PID line read.
fn node_in_own_netns() -> Target {
    let script = fixture_source("runtimes").join("audit.js");
    let mut cmd = Command::new("unshare");
    cmd.args(["-n", "sh", "-c", "ip link set lo up && exec node \"$0\" 20 20000"]).arg(script);
    cmd.env_remove("NODE_EXTRA_CA_CERTS");
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    assert!(!listens(target.pid), "node listens before leaktrace opened its inspector");
    target
}

/// `record --heap-census` on `target` for a minute, running, once leaktrace has opened the
/// inspector and sampling began (the target listens, then 2 s more).
fn census_in_progress(target: &Target, out: &OutDir) -> Running {
    let mut lt = leaktrace(["record", "--heap-census", "--pid", &target.pid.to_string(), "--duration", "60s", "--out"]);
    lt.arg(&out.path);
    let lt = Running::spawn(lt, None);
    let open = wait_for(Duration::from_secs(60), || listens(target.pid).then_some(()));
    assert!(open.is_some(), "leaktrace never opened the inspector\n{}", lt.stderr_so_far());
    std::thread::sleep(Duration::from_secs(2));
    lt
}

/// The Node inspector is not left open when leaktrace is killed: `kill -9` of leaktrace while
/// a `--heap-census` samples the heap through the inspector it opened → within 5 s nothing of
/// the target listens any more (its guardian closed it), and node runs on.
#[test]
fn a_killed_agent_does_not_leave_the_inspector_open() {
    require_root();
    let target = node_in_own_netns();
    let out = OutDir::new("hostile-node-kill");
    let lt = census_in_progress(&target, &out);
    lt.signal(libc::SIGKILL);
    let o = lt.wait(Duration::from_secs(30));
    let t = Instant::now();
    let closed = wait_for(Duration::from_secs(5), || (!listens(target.pid)).then_some(()));
    eprintln!("hostile-node-kill: the inspector closed {:?} after the agent was killed", t.elapsed());
    assert!(closed.is_some(), "the inspector still listens 5 s after leaktrace was killed\n{}", o.describe());
    assert!(target.exit_status().is_none(), "node ended");
    assert!(target.next_line(Duration::from_secs(5)).is_some(), "node stopped printing progress");
}

/// SIGTERM ends a recording within seconds whatever the target does: node is stopped
/// (SIGSTOP) while leaktrace samples its heap through the inspector, so no protocol answer
/// comes; leaktrace, sent SIGTERM, ends within 10 s with the census' error said. Once node
/// runs again, the inspector leaktrace opened is closed (by its guardian) within 15 s.
#[test]
fn sigterm_ends_a_census_blocked_on_a_stopped_target() {
    require_root();
    let target = node_in_own_netns();
    let out = OutDir::new("hostile-node-term");
    let lt = census_in_progress(&target, &out);
    target.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    lt.signal(libc::SIGTERM);
    let o = lt.wait(Duration::from_secs(120));
    let took = t.elapsed();
    eprintln!("hostile-node-term: leaktrace ended {took:?} after SIGTERM");
    target.signal(libc::SIGCONT);
    assert!(took < Duration::from_secs(10), "leaktrace took {took:?} to end after SIGTERM\n{}", o.describe());
    let closed = wait_for(Duration::from_secs(15), || (!listens(target.pid)).then_some(()));
    assert!(closed.is_some(), "the inspector still listens 15 s after node resumed\n{}", o.describe());
    assert!(target.exit_status().is_none(), "node ended");
}
