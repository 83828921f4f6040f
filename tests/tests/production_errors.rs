//! Production attach, bad input: a PID that is gone, a kernel thread, a zombie, a process that
//! exits during the attach, no root, a stripped static binary, a read-only output directory.
//! Each one a clear one-line error (exit code 2) that harms nothing. All real, as root.
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use leaktrace_tests::*;

/// A fixture of this file, compiled into the fixtures directory (once per test binary).
fn fixture(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let out = fixtures().dir.join(format!("errors-{name}"));
    if built.iter().any(|b| b == name) {
        return out;
    }
    let src = fixture_source;
    match name {
        "leaky_stripped" => {
            compile_with("gcc", &[&src("leaky.c")], &out, &["-static"]);
            let st = Command::new("strip").arg("--strip-all").arg(&out).status().expect("cannot run strip");
            assert!(st.success(), "strip --strip-all {} failed", out.display());
        }
        "zombie" => compile_with("gcc", &[&src("zombie.c")], &out, &[]),
        other => panic!("unknown fixture {other}"),
    }
    built.push(name.to_string());
    out
}

/// `exe malloc 10 100` (a leaky fixture), started and waiting for a signal after its PID line.
fn waiting_target(exe: &std::path::Path) -> Target {
    let mut cmd = Command::new(exe);
    cmd.args(["malloc", "10", "100"]).env("WAIT_FOR_SIGNAL", "1");
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    target
}

/// A test that cannot run here says so on stderr (and passes).
fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

#[test]
fn exited_pid_is_an_error() {
    require_root();
    let mut child = Command::new("true").spawn().expect("run true");
    let pid = child.id();
    child.wait().expect("wait true");
    let (out, o) = record_pid_2s("exited", &pid.to_string());
    assert_error(&o, &[&pid.to_string()]);
    assert!(!out.path.exists(), "an output directory was created");
}

#[test]
fn kernel_thread_is_an_error() {
    require_root();
    let pid = if comm_of(2).as_deref() == Some("kthreadd") {
        Some(2)
    } else {
        // In a PID namespace PID 2 may be anything: any child of kthreadd will do.
        std::fs::read_dir("/proc").ok().and_then(|d| {
            d.flatten().find_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let status = std::fs::read_to_string(e.path().join("status")).ok()?;
                status
                    .lines()
                    .any(|l| l.starts_with("PPid:") && l.split_ascii_whitespace().nth(1) == Some("2"))
                    .then_some(pid)
            })
        })
    };
    let Some(pid) = pid else {
        return skip("kernel_thread_is_an_error", "no kernel thread is visible from here");
    };
    let (_out, o) = record_pid_2s("kthread", &pid.to_string());
    assert_error(&o, &[&format!("PID {pid} "), "kernel thread"]);
}

#[test]
fn zombie_is_an_error() {
    require_root();
    let parent = Target::spawn(Command::new(fixture("zombie")));
    parent.expect_pid_line();
    let line = parent.next_line(Duration::from_secs(10)).expect("no ZOMBIE line");
    let zombie: u32 =
        line.strip_prefix("ZOMBIE ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("unexpected line {line:?}"));
    assert!(!process_alive(zombie), "PID {zombie} should be a zombie");
    assert!(std::path::Path::new(&format!("/proc/{zombie}")).exists(), "PID {zombie} should still exist (a zombie)");
    let (_out, o) = record_pid_2s("zombie", &zombie.to_string());
    assert_error(&o, &[&zombie.to_string(), "zombie"]);
}

/// Processes that exit within a few ms of start, at various moments of the attach: either an
/// error naming the PID, or a recording that ended with the target; never a panic.
#[test]
fn pid_exiting_during_attach() {
    require_root();
    let mut outcomes = Vec::new();
    for linger_ms in [0, 10, 30, 60, 100, 150, 250, 400] {
        let mut cmd = Command::new(&fixtures().leaky);
        cmd.args(["malloc", "1", "1000"]).env("LINGER_MS", linger_ms.to_string());
        let target = Target::spawn(cmd);
        let pid = target.pid;
        let out = OutDir::new(&format!("exiting-{linger_ms}"));
        let mut lt = leaktrace(["record", "--pid", &pid.to_string(), "--interval", "100ms", "--out"]);
        lt.arg(&out.path);
        let o = run(lt, None, TIMEOUT);
        assert_no_panic(&o);
        match o.code() {
            Some(2) => {
                assert_error(&o, &[&pid.to_string()]);
                outcomes.push(format!("{linger_ms} ms: error"));
            }
            Some(0) => {
                let r = Report::load(&out.path);
                assert_eq!(r.get(&["end_reason"]), "target-exited", "end_reason\n{}", o.describe());
                outcomes.push(format!("{linger_ms} ms: recorded"));
            }
            _ => panic!("unexpected outcome\n{}", o.describe()),
        }
        drop(target);
    }
    let _ = writeln!(std::io::stderr(), "pid_exiting_during_attach: {}", outcomes.join(", "));
}

#[test]
fn not_root_is_an_error() {
    require_root();
    let target = waiting_target(&fixtures().leaky);
    let out = OutDir::new("not-root");
    let mut lt = Command::new("setpriv");
    lt.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(leaktrace_bin())
        .args(["record", "--pid", &target.pid.to_string(), "--duration", "2s", "--out"])
        .arg(&out.path);
    let o = run(lt, None, TIMEOUT);
    assert_error(&o, &["root"]);
    assert!(!out.path.exists(), "an output directory was created");
    assert!(process_alive(target.pid), "the target died");
}

/// gcc -static, then strip --strip-all: no symbol says where malloc is.
#[test]
fn stripped_static_binary_is_an_error() {
    require_root();
    let exe = fixture("leaky_stripped");
    let target = waiting_target(&exe);
    let out = OutDir::new("stripped");
    let mut lt = leaktrace(["record", "--pid", &target.pid.to_string(), "--duration", "2s", "--out"]);
    lt.arg(&out.path);
    let o = run(lt, None, TIMEOUT);
    let line = assert_error(&o, &[&target.pid.to_string(), "searched", &exe.display().to_string()]);
    assert!(
        line.contains("symbols") && line.contains("link it dynamically"),
        "the error should say what to do: {line}"
    );
    assert!(process_alive(target.pid), "the target died");
}

#[test]
fn stripped_static_binary_launched_is_an_error() {
    require_root();
    let exe = fixture("leaky_stripped");
    let out = OutDir::new("stripped-launch");
    let mut cmd = Command::new(&exe);
    cmd.args(["malloc", "10", "100"]);
    let o = record_launch(&out, &[], cmd);
    assert_error(&o, &["searched", &exe.display().to_string(), "symbols"]);
    assert!(!o.stdout.contains("done mode="), "the command ran untraced\n{}", o.describe());
}

/// --out on a read-only bind mount (in a private mount namespace, nothing changes for the host).
#[test]
fn read_only_out_is_an_error() {
    require_root();
    let target = waiting_target(&fixtures().leaky);
    let ro = temp_root().join("read-only");
    std::fs::create_dir_all(&ro).expect("create the read-only dir");
    let rec = ro.join("rec");
    let mut lt = Command::new("unshare");
    lt.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"d=$1; shift; mount --bind "$d" "$d" && mount -o remount,ro,bind "$d" && exec "$@""#)
        .arg("sh")
        .arg(&ro)
        .arg(leaktrace_bin())
        .args(["record", "--pid", &target.pid.to_string(), "--duration", "2s", "--out"])
        .arg(&rec);
    let o = run(lt, None, TIMEOUT);
    assert_error(&o, &[&rec.display().to_string(), "Read-only"]);
    assert!(!rec.exists(), "{} was created", rec.display());
    assert!(process_alive(target.pid), "the target died");
}

/// `leaktrace record --pid PID --duration 2s --out DIR`, run to completion: the output
/// directory and the result.
fn record_pid_2s(name: &str, pid: &str) -> (OutDir, Output) {
    let out = OutDir::new(name);
    let mut cmd = leaktrace(["record", "--pid", pid, "--duration", "2s", "--out"]);
    cmd.arg(&out.path);
    let o = run(cmd, None, TIMEOUT);
    (out, o)
}
