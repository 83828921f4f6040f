//! Hostile conditions on the file side (docs/reliability.md): symlinks and files
//! planted at output paths, directories others can write, a full disk mid-write (a real 64 KiB
//! tmpfs), and hostile or broken recordings given to `report` and `compare`.
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use leaktrace_tests::*;

/// A real recording (the demo's), also the seed of the analysis crate's fuzz-like test.
const SEED: &[u8] = include_bytes!("../../leaktrace-analysis/testdata/demo-recording.json");

/// Exit code 2, exactly one `leaktrace: error:` line mentioning each of `mentions`, no panic
/// (it may have attached: a full disk is found after recording).
fn assert_one_error(o: &Output, mentions: &[&str]) -> String {
    assert_no_panic(o);
    assert_eq!(o.code(), Some(2), "exit code\n{}", o.describe());
    let errors: Vec<&str> = o.stderr.lines().filter(|l| l.starts_with("leaktrace: error:")).collect();
    assert_eq!(errors.len(), 1, "exactly one 'leaktrace: error:' line expected\n{}", o.describe());
    for m in mentions {
        assert!(errors[0].contains(m), "the error line should mention {m:?}: {}\n{}", errors[0], o.describe());
    }
    errors[0].to_string()
}

/// `leaktrace record --out OUT -- leaky malloc 200 400` (200 leaks of 1000 B, half a second).
fn record_leaky(out: &Path, env: &[(&str, &Path)]) -> Output {
    let fx = fixtures();
    let mut cmd = leaktrace(["record", "--interval", "250ms", "--out"]);
    cmd.arg(out).arg("--").arg(&fx.leaky).args(["malloc", "200", "400"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(cmd, None, TIMEOUT)
}

/// A scratch directory (mode 0755, root's) removed at the end.
fn scratch(name: &str) -> OutDir {
    let d = OutDir::new(name);
    std::fs::create_dir_all(&d.path).unwrap();
    std::fs::set_permissions(&d.path, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_symlink_at_the_out_path_is_refused_before_recording() {
    require_root();
    let d = scratch("link-out");
    let victim = d.path.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let out = d.path.join("out");
    std::os::unix::fs::symlink(&victim, &out).unwrap();
    let o = record_leaky(&out, &[]);
    let e = assert_error(&o, &[out.to_str().unwrap(), "is a symlink"]);
    assert!(!o.stdout.contains("done mode="), "the command ran\n{}", o.describe());
    assert!(entries(&victim).is_empty(), "something was written through the link: {:?} ({e})", entries(&victim));
    assert!(std::fs::symlink_metadata(&out).unwrap().file_type().is_symlink(), "the link is left as it was");
}

#[test]
fn a_file_at_the_out_path_is_refused_and_left_alone() {
    require_root();
    let d = scratch("file-out");
    let out = d.path.join("out");
    std::fs::write(&out, b"someone's file").unwrap();
    let o = record_leaky(&out, &[]);
    assert_error(&o, &[out.to_str().unwrap(), "is not a directory"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"someone's file");
}

#[test]
fn an_existing_out_others_can_write_or_own_is_refused() {
    require_root();
    let d = scratch("shared-out");
    // Like /tmp itself: world-writable and sticky.
    let shared = d.path.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let o = record_leaky(&shared, &[]);
    assert_error(&o, &[shared.to_str().unwrap(), "writable by other users"]);
    // Owned by another user (nobody), even if private to them.
    let theirs = d.path.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let o = record_leaky(&theirs, &[]);
    assert_error(&o, &[theirs.to_str().unwrap(), "owned by uid 65534"]);
    assert!(entries(&shared).is_empty() && entries(&theirs).is_empty(), "nothing written");
}

#[test]
fn symlinks_planted_at_output_file_names_are_replaced_not_followed() {
    require_root();
    let d = scratch("link-files");
    let victims = d.path.join("victims");
    std::fs::create_dir(&victims).unwrap();
    // An existing, private --out with a link at every output name but the run markers (a marker
    // would make it "an earlier run").
    let out = d.path.join("out");
    std::fs::create_dir(&out).unwrap();
    let planted =
        ["report.md", "stacks.folded", "live.svg", "growth.svg", "memory.svg", "profile.pb.gz", "growth.pb.gz"];
    for name in planted {
        std::fs::write(victims.join(name), b"precious").unwrap();
        std::os::unix::fs::symlink(victims.join(name), out.join(name)).unwrap();
    }
    record_leaky(&out, &[]).assert_success();
    assert_outputs_exist(&out);
    for name in planted {
        assert_eq!(std::fs::read(victims.join(name)).unwrap(), b"precious", "{name}: written through the link");
        let m = std::fs::symlink_metadata(out.join(name)).unwrap();
        assert!(m.file_type().is_file(), "{name} is now leaktrace's own file");
    }
    assert_eq!(recorded_totals(&out, "leak_malloc").alloc_bytes, 200 * LEAK_BYTES, "the recording is right");

    // `report DIR` re-renders into the recording's directory: a link planted there is replaced too.
    std::fs::remove_file(out.join("report.json")).unwrap();
    std::os::unix::fs::symlink(victims.join("report.md"), out.join("report.json")).unwrap();
    let mut cmd = leaktrace(["report"]);
    cmd.arg(&out);
    run(cmd, None, TIMEOUT).assert_success();
    assert_eq!(std::fs::read(victims.join("report.md")).unwrap(), b"precious", "report wrote through the link");
    assert!(std::fs::symlink_metadata(out.join("report.json")).unwrap().file_type().is_file());
    let files = entries(&out);
    assert!(!files.iter().any(|f| f.ends_with(".tmp")), "temporaries left behind: {files:?}");
}

#[test]
fn report_does_not_write_through_a_symlinked_dir() {
    let d = scratch("report-link");
    let rec = d.path.join("rec");
    std::fs::create_dir(&rec).unwrap();
    std::fs::write(rec.join("recording.json"), SEED).unwrap();
    let link = d.path.join("link");
    std::os::unix::fs::symlink(&rec, &link).unwrap();
    let mut cmd = leaktrace(["report"]);
    cmd.arg(&link);
    assert_one_error(&run(cmd, None, TIMEOUT), &[link.to_str().unwrap(), "is a symlink"]);
    assert_eq!(entries(&rec), vec!["recording.json"], "nothing written through the link");
    // The directory itself is fine.
    let mut cmd = leaktrace(["report"]);
    cmd.arg(&rec);
    run(cmd, None, TIMEOUT).assert_success();
    assert_outputs_exist(&rec);
}

#[test]
fn a_default_output_name_taken_by_a_symlink_is_not_used() {
    // `compare` names its directory leaktrace-compare-YYYYmmdd-HHMMSS in the current one: plant
    // a link at that name for every second of the next two minutes.
    let d = scratch("default-name");
    let victim = d.path.join("victim");
    std::fs::create_dir(&victim).unwrap();
    let rec = d.path.join("rec");
    std::fs::create_dir(&rec).unwrap();
    std::fs::write(rec.join("recording.json"), SEED).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    for s in 0..120 {
        let t = now + s;
        // SAFETY: libc::tm is plain data; all-zero is a valid value.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: localtime_r writes only the given struct.
        unsafe { libc::localtime_r(&t, &mut tm) };
        let name = format!(
            "leaktrace-compare-{:04}{:02}{:02}-{:02}{:02}{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec
        );
        std::os::unix::fs::symlink(&victim, d.path.join(name)).unwrap();
    }
    let mut cmd = leaktrace(["compare", "rec", "rec"]);
    cmd.current_dir(&d.path);
    let o = run(cmd, None, TIMEOUT);
    o.assert_success();
    assert!(entries(&victim).is_empty(), "compare wrote through a planted link: {:?}", entries(&victim));
    let made: Vec<String> = entries(&d.path)
        .into_iter()
        .filter(|n| n.starts_with("leaktrace-compare-"))
        .filter(|n| !std::fs::symlink_metadata(d.path.join(n)).unwrap().file_type().is_symlink())
        .collect();
    assert_eq!(made.len(), 1, "one new directory beside the planted link\n{}", o.describe());
    assert!(d.path.join(&made[0]).join("compare.json").is_file(), "{}", o.describe());
}

/// A tmpfs of `size` mounted on a new directory; unmounted when dropped.
struct Tmpfs {
    dir: OutDir,
    mnt: PathBuf,
}

impl Tmpfs {
    fn mount(name: &str, size: &str) -> Tmpfs {
        let dir = scratch(name);
        let mnt = dir.path.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"])
            .arg(&mnt)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t tmpfs failed");
        Tmpfs { dir, mnt }
    }

    /// Fill the file system: one file written until ENOSPC.
    fn fill(&self) {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.mnt.join("filler")).unwrap();
        let chunk = [0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.write_all(&[0u8; 1]);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // The directory (self.dir) is removed after this, once the tmpfs is gone.
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// The path in "saved to PATH instead" / "saved in PATH" of an error line.
fn saved_path(line: &str) -> Option<PathBuf> {
    for marker in ["saved to ", "saved in "] {
        if let Some(i) = line.find(marker) {
            let rest = &line[i + marker.len()..];
            return Some(PathBuf::from(rest.split([' ', ')']).next().unwrap()));
        }
    }
    None
}

/// No file under a final output name holds a partial write: what is there parses, and no
/// temporary is left.
fn assert_no_partial_files(out: &Path) {
    for f in entries(out) {
        assert!(!f.ends_with(".tmp"), "temporary {f} left in {}", out.display());
        if f.ends_with(".json") {
            let text = std::fs::read(out.join(&f)).unwrap();
            serde_json::from_slice::<Value>(&text).unwrap_or_else(|e| panic!("{f} is partial: {e}"));
        }
    }
}

#[test]
fn a_full_disk_keeps_the_recording_in_a_temporary_file() {
    require_root();
    let fs = Tmpfs::mount("enospc-full", "64k");
    fs.fill();
    let fallback = fs.dir.path.join("fallback");
    std::fs::create_dir(&fallback).unwrap();
    let out = fs.mnt.join("out");
    let o = record_leaky(&out, &[("TMPDIR", &fallback)]);
    let e = assert_one_error(&o, &["recording.json", "No space left on device", "saved to"]);
    let kept = saved_path(&e).unwrap_or_else(|| panic!("no path in {e}"));
    assert!(kept.starts_with(&fallback), "kept in $TMPDIR: {e}");
    assert_eq!(entries(&out), Vec::<String>::new(), "nothing under a final name, no temporary left");
    // The kept file is the whole recording: the report renders from it.
    let rdir = fs.dir.path.join("from-fallback");
    std::fs::create_dir(&rdir).unwrap();
    std::fs::rename(&kept, rdir.join("recording.json")).unwrap();
    assert_eq!(recorded_totals(&rdir, "leak_malloc").alloc_bytes, 200 * LEAK_BYTES, "the recording was kept whole");
    let mut cmd = leaktrace(["report"]);
    cmd.arg(&rdir);
    run(cmd, None, TIMEOUT).assert_success();
    assert_eq!(Report::load(&rdir).site("leak_malloc")["live_bytes"].as_u64(), Some(200 * LEAK_BYTES));
}

#[test]
fn a_disk_filling_up_mid_report_loses_nothing() {
    require_root();
    // 64 KiB: recording.json (~15 KiB) fits, the report (report.json, three SVGs, ...) does not.
    let fs = Tmpfs::mount("enospc-mid", "64k");
    let fallback = fs.dir.path.join("fallback");
    std::fs::create_dir(&fallback).unwrap();
    let out = fs.mnt.join("out");
    let o = record_leaky(&out, &[("TMPDIR", &fallback)]);
    let e = assert_one_error(&o, &["No space left on device"]);
    assert_no_partial_files(&out);
    let rec = if out.join("recording.json").exists() {
        assert!(e.contains("the recording is saved in") && e.contains(out.to_str().unwrap()), "{e}");
        out.clone()
    } else {
        let kept = saved_path(&e).unwrap_or_else(|| panic!("no path in {e}"));
        let rdir = fs.dir.path.join("from-fallback");
        std::fs::create_dir(&rdir).unwrap();
        std::fs::rename(&kept, rdir.join("recording.json")).unwrap();
        rdir
    };
    assert_eq!(recorded_totals(&rec, "leak_malloc").alloc_bytes, 200 * LEAK_BYTES, "the recording was kept whole\n{e}");
}

/// Run `leaktrace ARGS` with its address space capped at 1 GiB: reading a file of the size it
/// claims, or any unbounded allocation, would abort instead of giving the one-line error.
fn run_capped(args: &[&std::ffi::OsStr]) -> Output {
    let mut cmd = leaktrace(args);
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 1 << 30, rlim_max: 1 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run(cmd, None, TIMEOUT)
}

/// (name, recording.json bytes (None: a sparse 10 GB file), what the error says).
fn hostile_recordings() -> Vec<(&'static str, Option<Vec<u8>>, &'static str)> {
    let seed: Value = serde_json::from_slice(SEED).unwrap();
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = seed.clone();
        f(&mut v);
        Some(serde_json::to_vec(&v).unwrap())
    };
    let text = String::from_utf8_lossy(SEED).into_owned();
    vec![
        ("truncated", Some(SEED[..SEED.len() * 2 / 3].to_vec()), "not valid JSON"),
        ("empty", Some(Vec::new()), "not valid JSON"),
        ("binary", Some((0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect()), "not valid JSON"),
        ("nan", Some(text.replacen("\"interval_s\":0.5", "\"interval_s\":NaN", 1).into_bytes()), "not valid JSON"),
        ("deep", Some(format!("{}{}", "[".repeat(1 << 20), "]".repeat(1 << 20)).into_bytes()), "recursion limit"),
        ("stack-without-stack", edit(&|v| v["stacks"] = Value::Array(vec![])), "which the recording does not have"),
        (
            "free-over-alloc",
            edit(&|v| {
                let s = &mut v["checkpoints"][1]["sites"][0];
                s["free_bytes"] = (s["alloc_bytes"].as_u64().unwrap() + 4096).into();
            }),
            "but allocated only",
        ),
        ("time-backwards", edit(&|v| v["checkpoints"][2]["t_s"] = Value::from(-5.0)), "finite number of seconds"),
        ("wrong-shape", edit(&|v| v["checkpoints"] = Value::from("many")), "not a leaktrace recording"),
        ("huge", None, "more than the 1073741824 bytes"),
    ]
}

fn write_recording(dir: &Path, data: &Option<Vec<u8>>) {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("recording.json");
    match data {
        Some(d) => std::fs::write(&p, d).unwrap(),
        None => std::fs::File::create(&p).unwrap().set_len(10 << 30).unwrap(),
    }
}

#[test]
fn report_refuses_hostile_recordings_in_one_line() {
    let d = scratch("hostile-report");
    for (name, data, says) in hostile_recordings() {
        let dir = d.path.join(name);
        write_recording(&dir, &data);
        let o = run_capped(&["report".as_ref(), dir.as_os_str()]);
        let e = assert_one_error(&o, &[says, "recording.json"]);
        assert_eq!(entries(&dir), vec!["recording.json"], "{name}: report wrote outputs of a refused recording: {e}");
    }
    // The cap is the environment's when it sets one.
    let dir = d.path.join("capped");
    write_recording(&dir, &Some(SEED.to_vec()));
    let mut cmd = leaktrace(["report"]);
    cmd.arg(&dir).env("LEAKTRACE_MAX_RECORDING_BYTES", "1000");
    assert_one_error(&run(cmd, None, TIMEOUT), &[&format!("is {} bytes, more than the 1000 bytes", SEED.len())]);
}

#[test]
fn compare_refuses_hostile_recordings_in_one_line() {
    let d = scratch("hostile-compare");
    let good = d.path.join("good");
    write_recording(&good, &Some(SEED.to_vec()));
    for (name, data, says) in hostile_recordings() {
        let dir = d.path.join(name);
        write_recording(&dir, &data);
        let out = d.path.join(format!("out-{name}"));
        // The hostile one after, then before.
        let o = run_capped(&["compare".as_ref(), good.as_os_str(), dir.as_os_str(), "--out".as_ref(), out.as_os_str()]);
        assert_one_error(&o, &[says, "AFTER"]);
        let o = run_capped(&["compare".as_ref(), dir.as_os_str(), good.as_os_str(), "--out".as_ref(), out.as_os_str()]);
        assert_one_error(&o, &[says, "BEFORE"]);
        assert!(!out.exists(), "{name}: compare made its output directory for a refused recording");
    }
}

#[test]
fn a_full_disk_with_several_processes_keeps_every_recording() {
    require_root();
    // A forking server followed into its children: one recording per process, in pid-N
    // subdirectories. None fits: each is kept in $TMPDIR and the error line lists them.
    let forker = fixtures().dir.join("forker-hostile");
    compile_with("gcc", &[&fixture_source("forker.c")], &forker, &[]);
    let fs = Tmpfs::mount("enospc-multi", "64k");
    fs.fill();
    let fallback = fs.dir.path.join("fallback");
    std::fs::create_dir(&fallback).unwrap();
    let out = fs.mnt.join("out");
    let mut cmd = leaktrace(["record", "--follow-forks", "--interval", "250ms", "--out"]);
    cmd.arg(&out).arg("--").arg(&forker).args(["2", "50", "200"]).env("TMPDIR", &fallback);
    let o = run(cmd, None, TIMEOUT);
    let e = assert_one_error(&o, &["No space left on device", "saved to"]);
    let kept = entries(&fallback);
    assert_eq!(kept.len(), 3, "the parent's and both children's recordings are kept: {kept:?}\n{e}");
    let mut leaked = 0;
    for (i, k) in kept.iter().enumerate() {
        assert!(e.contains(k.as_str()), "the error line names {k}: {e}");
        let rdir = fs.dir.path.join(format!("kept-{i}"));
        std::fs::create_dir(&rdir).unwrap();
        std::fs::rename(fallback.join(k), rdir.join("recording.json")).unwrap();
        leaked += recorded_totals(&rdir, "child_leak").alloc_bytes;
    }
    assert_eq!(leaked, 2 * 50 * LEAK_BYTES, "both children's leaks are in the kept recordings\n{e}");
    for sub in entries(&out) {
        assert!(sub.starts_with("pid-"), "only the per-process directories: {sub}");
        assert_eq!(entries(&out.join(&sub)), Vec::<String>::new(), "nothing under a final name in {sub}");
    }
}
