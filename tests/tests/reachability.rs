//! `record --reachability` on real processes (tests/fixtures/reach.c): lost blocks,
//! blocks held by a global list (with the chain from its symbol), a bounded cache, blocks of
//! exited threads, blocks held only by a table allocated before attach; the target runs on with
//! its data intact, and is never left stopped, even when the agent is killed during the scan.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use leaktrace_tests::*;

fn reach_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        built_once("reachability-reach", |dir| {
            let out = dir.join("reach");
            compile_with("gcc", &[&fixture_source("reach.c")], &out, &["-pthread"]);
        })
        .join("reach")
    })
}

/// The scheduler state letter of /proc/PID/stat (after the command's closing parenthesis).
fn state_of(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Start `reach MODE N`, attach `leaktrace record --reachability`, start the work once attached,
/// and end the recording (SIGINT) a checkpoint after it is done. Returns the target (waiting for
/// SIGUSR2) and the running leaktrace (scanning, then writing its outputs).
fn start(mode: &str, n: u64, extra: &[&str], out: &OutDir) -> (Target, Running) {
    let mut c = Command::new(reach_bin());
    c.args([mode, &n.to_string()]);
    start_cmd(c, extra, out)
}

/// [`start`] for any target that speaks the same protocol ("PID n", SIGUSR1 to work, "done",
/// SIGUSR2 to print "sum S" and exit).
fn start_cmd(cmd: Command, extra: &[&str], out: &OutDir) -> (Target, Running) {
    let target = Target::spawn(cmd);
    target.expect_pid_line();
    let mut cmd = leaktrace(["record", "--reachability", "--interval", "500ms"]);
    cmd.arg("--pid").arg(target.pid.to_string()).arg("--out").arg(&out.path).args(extra);
    let mut lt = Running::spawn(cmd, None);
    lt.wait_for_stderr_line("leaktrace: attached", TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    target.signal(libc::SIGUSR1);
    assert_eq!(
        target.next_line(Duration::from_secs(60)).as_deref(),
        Some("done"),
        "the target did not finish its work"
    );
    std::thread::sleep(Duration::from_millis(1200));
    lt.signal(libc::SIGINT);
    (target, lt)
}

/// SIGUSR2: the target prints the checksum of what it holds and exits 0.
fn finish(mut target: Target) -> u64 {
    target.signal(libc::SIGUSR2);
    let line = target.next_line(Duration::from_secs(10)).expect("no checksum line: the target is not running");
    let st = target.wait(Duration::from_secs(10)).expect("the target did not exit");
    assert!(st.success(), "target exit {st:?}");
    line.strip_prefix("sum ").and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad line {line:?}"))
}

fn reach_site<'a>(r: &'a Report, function: &str) -> &'a Value {
    let sites = r.get(&["reachability", "sites"]).as_array().expect("reachability.sites");
    sites
        .iter()
        .find(|s| s["function"].as_str().is_some_and(|f| same_function(f, function)))
        .unwrap_or_else(|| panic!("no reachability site {function}\n{}", serde_json::to_string_pretty(sites).unwrap()))
}

/// Lost, held by a global list (chain from `g_list`) and a bounded cache, within 5 % of the
/// truth; the target's data are intact (checksum) and it exits normally.
#[test]
fn lost_held_and_cached_blocks() {
    require_root();
    lost_held_and_cached("reach-three", &[]);
}

/// The same with `--max-allocs 8192`: the kernel's fast block table has 1024 buckets of 4 slots
/// for ~6000 live blocks, so most buckets fill and their further blocks go to the `ALLOCS` hash
/// map. The scan reads both tables: the same figures, the same chains.
#[test]
fn lost_held_and_cached_blocks_past_the_fast_table() {
    require_root();
    let (r, ctx) = lost_held_and_cached("reach-three-overflow", &["--max-allocs", "8192"]);
    assert_eq!(r.get(&["drops", "total"]).as_u64(), Some(0), "drops\n{ctx}");
}

/// [`lost_held_and_cached_blocks`] with `extra` options; returns the report and its context.
fn lost_held_and_cached(name: &str, extra: &[&str]) -> (Report, String) {
    const N: u64 = 3000;
    let out = OutDir::new(name);
    let (target, lt) = start("three", N, extra, &out);
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    let sum = finish(target);
    // Σ(i + 1) over the list, the cache slots' last values, the last scratch block.
    let mut want: u64 = (1..=N).sum();
    want += (N - 64..N).map(|i| i & 0x7f).sum::<u64>();
    want += (N - 1) & 0x7f;
    assert_eq!(sum, want, "the target's data changed");

    let r = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.stderr, serde_json::to_string_pretty(r.get(&["reachability"])).unwrap());
    let rc = r.get(&["reachability"]);
    assert_eq!(rc["complete"], true, "{ctx}");
    assert!(f64_of(rc, "pause_ms") > 0.0, "{ctx}");
    assert!(u64_of(rc, "root_bytes_scanned") > 0 && u64_of(rc, "untraced_bytes_scanned") > 0, "{ctx}");

    let lost = reach_site(&r, "make_lost");
    assert_within(
        "make_lost unreachable_bytes",
        u64_of(lost, "unreachable_bytes") as f64,
        ((N - 1) * 200) as f64,
        0.05,
        &ctx,
    );
    assert!(u64_of(lost, "reachable_blocks") <= N / 20, "{ctx}");

    let list = reach_site(&r, "list_add");
    assert_within("list_add reachable_bytes", u64_of(list, "reachable_bytes") as f64, (N * 64) as f64, 0.05, &ctx);
    assert!(u64_of(list, "unreachable_blocks") <= N / 20, "{ctx}");
    let chain = list["retained_by"].as_array().expect("retained_by");
    assert_eq!(chain[0]["kind"], "global", "{ctx}");
    assert_eq!(chain[0]["symbol"], "g_list", "{ctx}");
    assert!(str_of(&chain[0], "object").ends_with("/reach"), "{ctx}");

    let cache = reach_site(&r, "cache_put");
    assert_within("cache_put reachable_bytes", u64_of(cache, "reachable_bytes") as f64, (64 * 128) as f64, 0.05, &ctx);
    assert_eq!(u64_of(cache, "unreachable_blocks"), 0, "{ctx}");

    let md = std::fs::read_to_string(out.file("report.md")).unwrap();
    assert!(md.contains("lost (nothing points at them)"), "{md}");
    assert!(md.contains("held by g_list (reach)"), "{md}");
    assert!(md.contains("- **`g_list (reach)`** (global, native): holds "), "{md}");
    assert_eq!(chain.last().map(|s| &s["step"]), Some(&Value::from("native")), "the path ends at the block\n{ctx}");
    (r, ctx)
}

/// Blocks made by threads that exited (their stacks cached by glibc, stale) are lost; blocks
/// held only by a table allocated before attach (an untraced block) are reachable.
#[test]
fn exited_threads_lost_pretable_reachable() {
    require_root();
    const N: u64 = 1000;
    let out = OutDir::new("reach-threads");
    let (target, lt) = start("threads", N, &[], &out);
    lt.wait(TIMEOUT).assert_success();
    finish(target);
    let r = Report::load(&out.path);
    let ctx = serde_json::to_string_pretty(r.get(&["reachability"])).unwrap();
    // The threads' blocks may be split over several stacks (e.g. the first malloc of a thread
    // walks through its arena's creation): summed over every site named thread_main.
    reach_site(&r, "thread_main");
    let lost: u64 = r
        .get(&["reachability", "sites"])
        .as_array()
        .expect("sites")
        .iter()
        .filter(|s| s["function"].as_str().is_some_and(|f| same_function(f, "thread_main")))
        .map(|s| u64_of(s, "unreachable_bytes"))
        .sum();
    assert_within("thread_main unreachable_bytes", lost as f64, (8 * N * 100) as f64, 0.05, &ctx);

    let out = OutDir::new("reach-pretable");
    let (target, lt) = start("pretable", N, &[], &out);
    lt.wait(TIMEOUT).assert_success();
    finish(target);
    let r = Report::load(&out.path);
    let ctx = serde_json::to_string_pretty(r.get(&["reachability"])).unwrap();
    let t = reach_site(&r, "table_put");
    assert_eq!(u64_of(t, "reachable_bytes"), N * 96, "{ctx}");
    assert_eq!(u64_of(t, "unreachable_blocks"), 0, "{ctx}");
    assert_eq!(t["retained_by"][0]["kind"], "untraced", "{ctx}");
}

/// kill -9 of the agent while the target is stopped for the scan: the target runs on (state not
/// t/T) and its data are intact.
#[test]
fn target_runs_on_when_the_agent_is_killed_during_the_scan() {
    require_root();
    const N: u64 = 1_000_000;
    let out = OutDir::new("reach-kill");
    let (target, mut lt) = start("big", N, &[], &out);
    lt.wait_for_stderr_line("leaktrace: reachability of PID", TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    // Wait until the target is seen stopped by the scan, then kill the agent.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen_stopped = false;
    while Instant::now() < deadline {
        if state_of(target.pid) == Some('t') {
            seen_stopped = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    lt.signal(libc::SIGKILL);
    let o = lt.wait(TIMEOUT);
    assert!(seen_stopped, "the target was never seen stopped for the scan\n{}", o.describe());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut state = state_of(target.pid);
    while matches!(state, Some('t' | 'T')) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        state = state_of(target.pid);
    }
    assert!(!matches!(state, Some('t' | 'T') | None), "target state {state:?} after the agent was killed");
    let want: u64 = (1..=N).sum();
    assert_eq!(finish(target), want, "the target's data changed");
}

/// The directory holding tsparse_ext*.so (tests/fixtures/runtimes/tsparse_ext.c built -O2,
/// without frame pointers, against the test's python3).
fn tsparse_ext() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        built_once("reachability-tsparse_ext", |dir| {
            let cfg = |var: &str| {
                let o = Command::new(python())
                    .args(["-c", &format!("import sysconfig; print(sysconfig.get_config_var('{var}'))")])
                    .output()
                    .expect("python3");
                String::from_utf8_lossy(&o.stdout).trim().to_string()
            };
            let (include, suffix) = (cfg("INCLUDEPY"), cfg("EXT_SUFFIX"));
            let o = Command::new("gcc")
                .args(["-O2", "-fomit-frame-pointer", "-g", "-shared", "-fPIC", "-I", &include, "-o"])
                .arg(dir.join(format!("tsparse_ext{suffix}")))
                .arg(fixture_source("runtimes").join("tsparse_ext.c"))
                .output()
                .expect("gcc");
            assert!(o.status.success(), "gcc tsparse_ext.c: {}", String::from_utf8_lossy(&o.stderr));
        })
    })
}

/// A Python C extension (pip-style .so, no frame pointers) under a running interpreter: the
/// strdup'd copies parse_record forgets are lost; the copies it keeps in its static array g_held
/// are reachable, the chain starting at g_held in the extension; its bounded zone_cache is
/// reachable from zone_cache. Within 5 % of the truth; the extension's data are intact.
#[test]
fn python_extension_lost_and_held_by_its_static_array() {
    require_root();
    const N: u64 = 2000;
    let out = OutDir::new("reach-python");
    let mut cmd = Command::new(python());
    cmd.arg(fixture_source("runtimes").join("tsparse_reach.py")).arg(tsparse_ext()).arg(N.to_string());
    let (target, lt) = start_cmd(cmd, &[], &out);
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    let held = N.div_ceil(4);
    let sum = finish(target);
    assert_eq!(sum, held * 100 + 64 * "Zone/0000".len() as u64, "the extension's data changed");

    let r = Report::load(&out.path);
    let ctx = format!("{}\n{}", o.stderr, serde_json::to_string_pretty(r.get(&["reachability"])).unwrap());
    assert_eq!(r.get(&["reachability", "complete"]), &Value::Bool(true), "{ctx}");
    // strdup rounds nothing: 501-byte copies, lost (a stale pointer in a register or on the
    // stack may keep the last few reachable).
    let lost = reach_site(&r, "parse_record");
    assert_within(
        "parse_record unreachable_bytes",
        u64_of(lost, "unreachable_bytes") as f64,
        (N * 501) as f64,
        0.05,
        &ctx,
    );
    assert!(u64_of(lost, "reachable_blocks") <= N / 20, "{ctx}");

    let kept = reach_site(&r, "hold_record");
    assert_within(
        "hold_record reachable_bytes",
        u64_of(kept, "reachable_bytes") as f64,
        (held * 101) as f64,
        0.05,
        &ctx,
    );
    assert!(u64_of(kept, "unreachable_blocks") <= held / 20, "{ctx}");
    let chain = kept["retained_by"].as_array().unwrap_or_else(|| panic!("no retained_by\n{ctx}"));
    assert_eq!(chain[0]["kind"], "global", "{ctx}");
    assert_eq!(chain[0]["symbol"], "g_held", "{ctx}");
    assert!(str_of(&chain[0], "object").contains("tsparse_ext"), "{ctx}");

    let zones = reach_site(&r, "remember_zone");
    assert_eq!(u64_of(zones, "unreachable_blocks"), 0, "{ctx}");
    assert_eq!(u64_of(zones, "reachable_blocks"), 64, "{ctx}");
    assert_eq!(zones["retained_by"][0]["symbol"], "zone_cache", "{ctx}");
}

/// `--reachability-every 2`: a scan at every second checkpoint while the extension works at a
/// steady rate; at every scan parse_record's lost bytes are higher (a forgotten free) and
/// hold_record's still-referenced bytes are higher (retention), and report.md says which is
/// which. The target's data are intact after the repeated pauses.
#[test]
fn periodic_scans_show_lost_and_held_bytes_rising() {
    require_root();
    const N: u64 = 2400;
    let out = OutDir::new("reach-every");
    let mut cmd = Command::new(python());
    cmd.arg(fixture_source("runtimes").join("tsparse_reach.py")).arg(tsparse_ext()).args([&N.to_string(), "400"]);
    let (target, lt) = start_cmd(cmd, &["--reachability-every", "2"], &out);
    let o = lt.wait(TIMEOUT);
    o.assert_success();
    let sum = finish(target);
    assert_eq!(sum, N.div_ceil(4) * 100 + 64 * "Zone/0000".len() as u64, "the extension's data changed");

    let r = Report::load(&out.path);
    let rc = r.get(&["reachability"]);
    let ctx = format!("{}\n{}", o.stderr, serde_json::to_string_pretty(rc).unwrap());
    let scans = rc["scans"].as_array().expect("reachability.scans");
    // 6 s of work at a 500 ms interval: a scan every second, and one at the end.
    assert!(scans.len() >= 4, "{} scan(s)\n{ctx}", scans.len());
    assert!(scans.windows(2).all(|w| f64_of(&w[0], "t_s") < f64_of(&w[1], "t_s")), "{ctx}");
    let at = |site: &Value, key: &str| -> Vec<u64> {
        site[key].as_array().expect(key).iter().map(|v| v.as_u64().unwrap_or(0)).collect()
    };
    let lost = reach_site(&r, "parse_record");
    let lost_at = at(lost, "unreachable_bytes_at_scans");
    assert_eq!(lost_at.len(), scans.len(), "{ctx}");
    assert!(lost_at.windows(2).all(|w| w[1] >= w[0]) && lost_at[lost_at.len() - 1] > lost_at[0], "{lost_at:?}\n{ctx}");
    assert!(str_of(lost, "trend").starts_with("lost bytes rise at every scan"), "{ctx}");
    let held = reach_site(&r, "hold_record");
    assert!(str_of(held, "trend").starts_with("still-referenced bytes rise at every scan"), "{ctx}");
    let md = std::fs::read_to_string(out.file("report.md")).unwrap();
    assert!(md.contains(&format!("Lost bytes at each of the {} scans", scans.len())), "{md}");
}
