//! A hostile target's files and names (docs/reliability.md, "What a hostile target can and cannot
//! do"): links planted in a chrooted process's root that point at host files or /dev/zero, a
//! FIFO at a JIT process's /tmp/perf-PID.map, a FIFO given as recording.json, the permissions of
//! what leaktrace writes, and what is lost without CAP_CHECKPOINT_RESTORE.
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use leaktrace_tests::runtimes::{node, src as runtimes_src, warnings_with};
use leaktrace_tests::*;

const NOBODY: u32 = 65534;

/// A process that chroots into `root`, drops to nobody and sleeps: a container's process as the
/// agent sees it (its root, its files), with `HOSTNAME` set to `pod`.
fn chrooted_sleeper(root: &Path, pod: &str) -> Command {
    let mut c = Command::new(python());
    c.args([
        "-c",
        "import os, sys, time; os.chroot(sys.argv[1]); os.chdir('/'); os.setgid(65534); os.setuid(65534); time.sleep(600)",
    ])
    .arg(root)
    .env("HOSTNAME", pod);
    c
}

/// `ROOT/var/run/secrets/kubernetes.io/serviceaccount/namespace` made a symlink to `to`.
fn plant_namespace_link(root: &Path, to: &Path) {
    let sa = root.join("var/run/secrets/kubernetes.io/serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    symlink(to, sa.join("namespace")).unwrap();
}

/// A pod's process whose service-account namespace file links to a host file (by absolute path)
/// or to /dev/zero: `--pod` lists the pods it found with their namespaces, and neither the host
/// file's content nor an endless read shows up; the list comes at once.
#[test]
fn a_namespace_link_never_reads_a_host_file_or_dev_zero() {
    require_root();
    let seed = std::process::id() as u64 * 1000 + 41;
    let base = temp_root().join(format!("hostile-ns-{seed}"));
    let _ = std::fs::remove_dir_all(&base);
    let secret = base.join("host-secret");
    std::fs::create_dir_all(&base).unwrap();
    let marker = format!("HOST-SECRET-{seed}");
    std::fs::write(&secret, &marker).unwrap();
    let (shadow_root, zero_root) = (base.join("root-shadow"), base.join("root-zero"));
    plant_namespace_link(&shadow_root, &secret);
    plant_namespace_link(&zero_root, Path::new("/dev/zero"));
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();

    let mut tree = KubeTree::default();
    let uid = |n: u64| format!("{:08x}-0000-4000-8000-{n:012x}", seed as u32);
    let cid = |n: u64| format!("{:064x}", seed * 100 + n);
    let (a, b) = (uid(1), uid(2));
    let dir_a = tree.cgroup(&format!("kubepods/besteffort/pod{a}/{}", cid(1)));
    let dir_b = tree.cgroup(&format!("kubepods/besteffort/pod{b}/{}", cid(2)));
    let pa = tree.start_in(&dir_a, chrooted_sleeper(&shadow_root, "shadow-pod"));
    let pb = tree.start_in(&dir_b, chrooted_sleeper(&zero_root, "zero-pod"));
    wait_for(Duration::from_secs(10), || {
        let chrooted = |p: u32, r: &Path| std::fs::read_link(format!("/proc/{p}/root")).ok().as_deref() == Some(r);
        (chrooted(pa, &shadow_root) && chrooted(pb, &zero_root)).then_some(())
    })
    .expect("the sleepers chroot");

    let out = OutDir::new("hostile-ns");
    let mut cmd = leaktrace(["record", "--pod", "no-such-pod", "--duration", "1s", "--out"]);
    cmd.arg(&out.path).env("LEAKTRACE_CRI_CONFIG", base.join("no-cri/{id}/config.json"));
    let t0 = Instant::now();
    let o = run(cmd, None, Duration::from_secs(60));
    let took = t0.elapsed();
    drop(tree);
    let _ = std::fs::remove_dir_all(&base);
    let err = assert_error(&o, &["no pod no-such-pod"]);
    assert!(err.contains("shadow-pod") && err.contains("zero-pod"), "both pods listed: {err}\n{}", o.describe());
    assert!(!o.stderr.contains(&marker) && !o.stdout.contains(&marker), "host file read:\n{}", o.describe());
    assert!(took < Duration::from_secs(20), "took {took:?}: /dev/zero read?\n{}", o.describe());
}

/// An unprivileged Node process (no --perf-basic-prof: it writes no map of its own) with a FIFO
/// planted at its /tmp/perf-PID.map: a 5 s record ends in about 5 s, and a longer one ends on
/// SIGTERM, instead of blocking for good in an open() of the FIFO; then with a link to /dev/zero
/// there: a 5 s record ends in about 5 s, without reading it.
#[test]
fn a_fifo_perf_map_does_not_hold_a_recording() {
    require_root();
    // The script copied where `nobody` can read it (a clone under /root is not).
    let script = temp_root().join("fifo-perf-map-grow.js");
    std::fs::copy(runtimes_src("grow.js"), &script).unwrap();
    std::fs::set_permissions(temp_root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut node_cmd = node();
    node_cmd.arg(&script).args(["offheap", "2000", "4096"]).uid(NOBODY).gid(NOBODY).env("HOME", "/tmp");
    let target = Target::spawn(node_cmd);
    target.expect_pid_line();
    let pid = target.pid;
    let map = format!("/tmp/perf-{pid}.map");
    let _ = std::fs::remove_file(&map);
    let c = std::ffi::CString::new(map.clone()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {map}");
    std::os::unix::fs::chown(&map, Some(NOBODY), Some(NOBODY)).unwrap();
    std::thread::sleep(Duration::from_secs(2)); // the JIT code is allocating

    let out = OutDir::new("hostile-fifo-map");
    let mut cmd = leaktrace(["record", "--pid", &pid.to_string(), "--interval", "500ms", "--duration", "5s", "--out"]);
    cmd.arg(&out.path);
    let t0 = Instant::now();
    let o = run(cmd, None, Duration::from_secs(120));
    let took = t0.elapsed();

    let out2 = OutDir::new("hostile-fifo-map-term");
    let mut cmd = leaktrace(["record", "--pid", &pid.to_string(), "--interval", "500ms", "--duration", "10m", "--out"]);
    cmd.arg(&out2.path);
    let running = Running::spawn(cmd, None);
    std::thread::sleep(Duration::from_secs(6));
    running.signal(libc::SIGTERM);
    let t1 = Instant::now();
    let o2 = running.wait(Duration::from_secs(120));
    let term_took = t1.elapsed();

    // The map replaced by a link to /dev/zero (owned by the target's user): refused, no endless read.
    let _ = std::fs::remove_file(&map);
    symlink("/dev/zero", &map).unwrap();
    std::os::unix::fs::lchown(&map, Some(NOBODY), Some(NOBODY)).unwrap();
    let out3 = OutDir::new("hostile-zero-map");
    let mut cmd = leaktrace(["record", "--pid", &pid.to_string(), "--interval", "500ms", "--duration", "5s", "--out"]);
    cmd.arg(&out3.path);
    let t2 = Instant::now();
    let o3 = run(cmd, None, Duration::from_secs(120));
    let zero_took = t2.elapsed();
    let _ = std::fs::remove_file(&map);
    drop(target);

    o.assert_success();
    assert!(took < Duration::from_secs(40), "a 5 s record took {took:?}\n{}", o.describe());
    assert!(!Report::load(&out.path).sites().is_empty(), "{}", o.describe());
    assert!(term_took < Duration::from_secs(30), "SIGTERM took {term_took:?} to end it\n{}", o2.describe());
    assert!(out2.path.join("recording.json").exists(), "the SIGTERM'd recording is kept\n{}", o2.describe());
    o3.assert_success();
    assert!(zero_took < Duration::from_secs(40), "a 5 s record took {zero_took:?}\n{}", o3.describe());
}

/// `report DIR` and `compare` given a FIFO as recording.json: one error line, exit 2, at once.
#[test]
fn a_fifo_recording_is_refused_at_once() {
    let d = OutDir::new("fifo-recording");
    std::fs::create_dir_all(&d.path).unwrap();
    let c = std::ffi::CString::new(d.path.join("recording.json").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for args in [vec!["report".to_string()], vec!["compare".to_string(), d.path.display().to_string()]] {
        let mut cmd = leaktrace(&args);
        cmd.arg(&d.path);
        let t0 = Instant::now();
        let o = run(cmd, None, Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(10), "{args:?} took {:?}\n{}", t0.elapsed(), o.describe());
        assert_error(&o, &["not a regular file"]);
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Every directory leaktrace makes is 0700 and every file 0600 by default, whatever the umask;
/// `--out-mode 0750` gives directories 0750 and files 0640; a mode giving write to others is
/// refused in one line.
#[test]
fn reports_are_private_by_default_and_out_mode_widens_them() {
    require_root();
    let fx = fixtures();
    for (extra, dir_mode, file_mode) in [(None, 0o700, 0o600), (Some("0750"), 0o750, 0o640)] {
        let out = OutDir::new("out-mode");
        let mut cmd = leaktrace(["record", "--interval", "250ms", "--out"]);
        cmd.arg(&out.path);
        if let Some(m) = extra {
            cmd.args(["--out-mode", m]);
        }
        cmd.arg("--").arg(&fx.leaky).args(["malloc", "200", "400"]);
        // SAFETY: umask in the child before exec; 0 would make 0777/0666 without the fix.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
        let o = run(cmd, None, TIMEOUT);
        o.assert_success();
        let mut seen = 0;
        let mut stack = vec![out.path.clone()];
        while let Some(d) = stack.pop() {
            assert_eq!(mode(&d), dir_mode, "{} ({extra:?})", d.display());
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    assert_eq!(mode(&p), file_mode, "{} ({extra:?})", p.display());
                    seen += 1;
                }
            }
        }
        assert!(seen >= 3, "files written: {seen}");
    }
    let out = OutDir::new("out-mode-bad");
    let mut cmd = leaktrace(["report", "--out-mode", "0777"]);
    cmd.arg(&out.path);
    assert_error(&run(cmd, None, TIMEOUT), &["--out-mode 0777"]);
}

/// `leaktrace record --pid PID --duration 3s` run by root with the bounding set `caps` (setpriv:
/// its permitted and effective sets become exactly these); the report and the run's output.
fn record_with_caps(name: &str, caps: &str, pid: u32) -> (Report, Output) {
    let out = OutDir::new(name);
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--bounding-set=-all,{caps}")).args(["--inh-caps=-all", "--"]);
    cmd.arg(leaktrace_bin()).args(["record", "--pid", &pid.to_string(), "--duration", "3s", "--out"]);
    cmd.arg(&out.path);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    (Report::load(&out.path), o)
}

/// With the DaemonSet's rights only (BPF, PERFMON, SYS_PTRACE), /proc/PID/map_files cannot be
/// opened: the recording still names the leak and says once what is lost. Adding
/// CAP_CHECKPOINT_RESTORE is enough to open it (no note).
#[test]
fn without_checkpoint_restore_the_report_says_what_map_files_would_give() {
    require_root();
    let fx = fixtures();
    let mut leaky = Command::new(&fx.leaky);
    leaky.args(["malloc", "100000", "200"]);
    let target = Target::spawn(leaky);
    let (r, o) = record_with_caps("no-map-files", "+bpf,+perfmon,+sys_ptrace", target.pid);
    let (r2, o2) = record_with_caps("map-files-cr", "+bpf,+perfmon,+sys_ptrace,+checkpoint_restore", target.pid);
    drop(target);
    let notes = warnings_with(&r, "map_files could not be opened");
    assert_eq!(notes.len(), 1, "one note\n{}\n{}", o.describe(), r.summary());
    assert!(notes[0].contains("memfd") && notes[0].contains("deleted"), "{}", notes[0]);
    for (r, o) in [(&r, &o), (&r2, &o2)] {
        let leaks = r.leak_functions();
        assert!(leaks.contains(&leak_function("malloc").as_str()), "the leak is named: {leaks:?}\n{}", o.describe());
    }
    assert!(warnings_with(&r2, "map_files could not be opened").is_empty(), "{}", r2.summary());
}

/// The program of [`map_files_fixture`]: a non-PIE executable that dlopens one library and
/// deletes it, and another from a memfd (dlopen of /proc/self/fd/N), then leaks from a function
/// of each and of its own, 200 times a second each.
const MAPPED_MAIN: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>
__attribute__((noinline)) void *main_exe_leak(void) { void *p = malloc(1000); memset(p, 1, 1000); return p; }
int main(int argc, char **argv) {
    void *del = dlopen(argv[1], RTLD_NOW);
    if (!del) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    unlink(argv[1]);
    int src = open(argv[2], O_RDONLY), mfd = memfd_create("libmemfdleak", 0);
    char buf[65536]; ssize_t n;
    while ((n = read(src, buf, sizeof buf)) > 0) write(mfd, buf, n);
    char path[64]; snprintf(path, sizeof path, "/proc/self/fd/%d", mfd);
    void *mem = dlopen(path, RTLD_NOW);
    if (!mem) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void *(*d)(void) = (void *(*)(void))dlsym(del, "deleted_lib_leak");
    void *(*m)(void) = (void *(*)(void))dlsym(mem, "memfd_lib_leak");
    printf("PID %d\n", getpid()); fflush(stdout);
    for (;;) { main_exe_leak(); d(); m(); usleep(5000); }
}
"#;

/// Build the fixture: (the non-PIE executable, the library deleted after dlopen, the one loaded
/// from a memfd). Each library is built under its own name per call (it is deleted by the run).
fn map_files_fixture(tag: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let dir = fixture_build_dir("map-files");
    let lib = |name: &str, func: &str| {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(
            &c,
            format!(
                "#include <stdlib.h>\n#include <string.h>\n__attribute__((noinline)) void *{func}(void) {{ void *p = malloc(1000); memset(p, 2, 1000); return p; }}\n"
            ),
        )
        .unwrap();
        let so = dir.join(format!("{name}-{tag}.so"));
        let mut cc = Command::new("gcc");
        cc.args(["-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-o"]).arg(&so).arg(&c);
        run_build_step(&mut cc, "a map_files fixture library");
        so
    };
    let deleted = lib("libdeleted", "deleted_lib_leak");
    let memfd = lib("libmemfd", "memfd_lib_leak");
    let main_c = dir.join("mapped_main.c");
    std::fs::write(&main_c, MAPPED_MAIN).unwrap();
    let exe = dir.join("mapped_main");
    if !exe.exists() {
        let mut cc = Command::new("gcc");
        cc.args(["-no-pie", "-fno-pie", "-O1", "-g", "-fno-omit-frame-pointer", "-o"]).arg(&exe).arg(&main_c);
        run_build_step(&mut cc, "the non-PIE map_files fixture");
    }
    (exe, deleted, memfd)
}

/// As root (map_files allowed): a non-PIE executable, a library deleted after it was mapped and
/// one mapped from a memfd are all symbolized (their files read through /proc/PID/map_files,
/// named without leading zeros), and the report carries no map_files note.
#[test]
fn deleted_memfd_and_non_pie_objects_are_symbolized_through_map_files() {
    require_root();
    let (exe, deleted, memfd) = map_files_fixture("root");
    let mut cmd = Command::new(&exe);
    cmd.arg(&deleted).arg(&memfd);
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    assert!(!deleted.exists(), "the fixture deleted its library");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid)).unwrap();
    assert!(maps.lines().any(|l| l.starts_with("004")), "non-PIE: mapped at 0x400000\n{maps}");
    assert!(maps.contains("(deleted)") && maps.contains("memfd:libmemfdleak"), "{maps}");
    let out = OutDir::new("map-files-root");
    let mut lt =
        leaktrace(["record", "--pid", &target.pid.to_string(), "--interval", "500ms", "--duration", "4s", "--out"]);
    lt.arg(&out.path);
    let o = run(lt, None, TIMEOUT);
    drop(target);
    let _ = std::fs::remove_file(&memfd);
    o.assert_success();
    let r = Report::load(&out.path);
    let leaks = r.leak_functions();
    for f in ["main_exe_leak", "deleted_lib_leak", "memfd_lib_leak"] {
        assert!(leaks.contains(&f), "{f} named: {leaks:?}\n{}\n{}", o.describe(), r.summary());
    }
    assert!(warnings_with(&r, "map_files could not be opened").is_empty(), "{}", r.summary());
}
