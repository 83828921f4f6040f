//! The attach/detach part of `cargo xtask bench` (`--attach-only` runs just this): what a
//! recording costs beyond its `--duration`, with uprobe_multi links and with single perf-event
//! uprobes (`LEAKTRACE_SINGLE_UPROBES=1`), on
//! - one process with ~100 probes: xtask/bench/attach_target.cpp (libc and libstdc++ linked,
//!   and the allocator libraries of [`EXTRA_LIBS`] that are installed dlopen'ed);
//! - `--cgroup` over 50 such processes (libc and libstdc++ only), in a cgroup made for it.
//!
//! Each run is `leaktrace record --duration 3s --quiet` with `RUST_LOG=leaktrace=info`, whose
//! timing lines (leaktrace/src/probes.rs: programs loaded, probes attached per process, links
//! detached) give the parts; the agent's CPU time and peak RSS come from wait4's rusage. The
//! results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md.

use std::io::Write as _;

use super::*;

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- attach bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- attach bench: end -->";

/// Allocator libraries dlopen'ed into the 100-probe target, when installed (Debian's names).
const EXTRA_LIBS: &[&str] = &["libjemalloc.so.2", "libtcmalloc_minimal.so.4", "libmimalloc.so.2"];
/// Processes of the `--cgroup` case.
const CGROUP_PROCESSES: usize = 50;
/// Allocation rounds a second of each `--cgroup` process (`ATTACH_TARGET_RATE`): at the
/// one-process case's 1000, 50 processes (each waking 1000 times a second) keep both CPUs busy
/// by themselves, and the agent's attach and detach wait for CPU (measured: 4.3 s of overhead
/// against 2.4 s at 100).
pub(super) const CGROUP_RATE: u32 = 100;
/// `--duration` of every recording, seconds.
const DURATION_S: f64 = 3.0;

/// One recording's figures.
struct Run {
    /// Start to exit of `leaktrace record`, s.
    total_s: f64,
    /// Start to the last "leaktrace: attached" line, s.
    attached_s: f64,
    /// Loading (verifying) the eBPF programs, s.
    load_s: f64,
    /// Creating the probes, summed over processes, s.
    attach_s: f64,
    probes: u64,
    links: u64,
    /// Removing every link at the end, s.
    detach_s: f64,
    /// The agent's user + system CPU time, s.
    cpu_s: f64,
    /// The agent's peak RSS, KiB.
    maxrss_kib: u64,
}

/// The number before " s" after `key` in `line` (leaktrace's timing log lines).
fn seconds_after(line: &str, key: &str) -> Option<f64> {
    let rest = &line[line.find(key)? + key.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// `reps` runs of uprobe_multi (each after a wait for a quiet machine if `wait_quiet`), then
/// `single_reps` of single uprobes, each tagged `TAG-multi-N` / `TAG-single-N`; the load average
/// at each start is added to `loads`.
fn both_variants(
    work: &Path,
    args: &[String],
    (reps, single_reps): (usize, usize),
    tag: &str,
    wait_quiet: bool,
    loads: &mut Vec<f64>,
) -> Result<(Vec<Run>, Vec<Run>)> {
    let (mut multi, mut single) = (Vec::new(), Vec::new());
    // Every uprobe_multi run first, then the single-uprobe ones: a single-uprobe run's detach
    // leaves the machine loaded (2000 probes over 50 processes: ~3 minutes of threads waiting in
    // the kernel) and the runs after it would measure that. With one target, each uprobe_multi
    // run starts on a quiet machine (or after 2 minutes).
    let quiet = |loads: &mut Vec<f64>| {
        if wait_quiet {
            eprintln!("xtask: bench: {}", wait_for_quiet(1.5, Duration::from_secs(120)));
        }
        loads.extend(loadavg());
    };
    for rep in 0..reps.max(1) {
        quiet(loads);
        multi.push(record(work, args, false, &format!("{tag}-multi-{rep}"))?);
    }
    for rep in 0..single_reps.max(1) {
        // The comparison: measured back to back, after the uprobe_multi runs.
        loads.extend(loadavg());
        single.push(record(work, args, true, &format!("{tag}-single-{rep}"))?);
    }
    Ok((multi, single))
}

/// Run `leaktrace record ARGS --duration 3s --quiet --out DIR`, single uprobes if `single`.
fn record(work: &Path, args: &[String], single: bool, tag: &str) -> Result<Run> {
    let out = work.join(format!("rec-{tag}"));
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(release_binary());
    cmd.arg("record")
        .args(args)
        .args(["--duration", "3s", "--quiet", "--out"])
        .arg(&out)
        .env("RUST_LOG", "leaktrace=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if single {
        cmd.env("LEAKTRACE_SINGLE_UPROBES", "1");
    } else {
        cmd.env_remove("LEAKTRACE_SINGLE_UPROBES");
    }
    eprintln!("xtask: $ {}", show(&cmd));
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        BufReader::new(err).lines().map_while(Result::ok).map(|l| (started.elapsed(), l)).collect::<Vec<_>>()
    });
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 writes it and the status of our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) of our own child writes the locals `status` and `usage`.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let total_s = started.elapsed().as_secs_f64();
    if r != pid {
        bail!("wait4 on leaktrace: {}", std::io::Error::last_os_error());
    }
    let lines = reader.join().map_err(|_| anyhow::anyhow!("stderr reader panicked"))?;
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        bail!("leaktrace record failed (status {status}):\n{}", text.join("\n"));
    }
    let mut run = Run {
        total_s,
        attached_s: f64::NAN,
        load_s: f64::NAN,
        attach_s: 0.0,
        probes: 0,
        links: 0,
        detach_s: f64::NAN,
        cpu_s: usage.ru_utime.tv_sec as f64
            + usage.ru_utime.tv_usec as f64 / 1e6
            + usage.ru_stime.tv_sec as f64
            + usage.ru_stime.tv_usec as f64 / 1e6,
        maxrss_kib: usage.ru_maxrss as u64,
    };
    for (at, l) in &lines {
        if l.starts_with("leaktrace: attached") {
            run.attached_s = at.as_secs_f64();
        } else if let Some(s) = seconds_after(l, "programs loaded in ") {
            run.load_s = s;
        } else if l.contains(" probes attached with ") {
            // "PID 123: 40 probes attached with 13 links in 0.012 s"
            let words: Vec<&str> = l.split_whitespace().collect();
            let num_before = |w: &str| words.iter().position(|x| *x == w).and_then(|i| words.get(i - 1)?.parse().ok());
            run.probes += num_before("probes").unwrap_or(0);
            run.links += num_before("links").unwrap_or(0);
            run.attach_s += seconds_after(l, " links in ").unwrap_or(0.0);
        } else if l.contains("detached ") && l.contains(" links in ") {
            run.detach_s = seconds_after(l, " links in ").unwrap_or(f64::NAN);
        }
    }
    if run.probes == 0 {
        let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        bail!("leaktrace logged no probes attached:\n{}", text.join("\n"));
    }
    Ok(run)
}

/// A cgroup v2 directory for the bench, its processes killed and itself removed on drop.
pub(super) struct Cgroup {
    pub(super) path: PathBuf,
    children: Vec<KillOnDrop>,
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.children.clear();
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("xtask: bench: could not remove the cgroup {}", self.path.display());
    }
}

/// Start `n` attach targets (no extra library, [`CGROUP_RATE`] rounds a second) in a new cgroup.
pub(super) fn cgroup_of_targets(target: &Path, n: usize) -> Result<Cgroup> {
    // The cgroup v2 mount: /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid).
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_ascii_whitespace().next()? == "cgroup2").then_some(())?;
            pre.split_ascii_whitespace().nth(4).map(PathBuf::from)
        })
        .collect();
    mounts.sort_by_key(|p| !p.starts_with("/sys/fs/cgroup"));
    let root = mounts.first().context("no cgroup v2 hierarchy is mounted (no cgroup2 in /proc/self/mountinfo)")?;
    let path = root.join(format!("leaktrace-bench-{}", std::process::id()));
    std::fs::create_dir(&path).with_context(|| format!("cannot create the cgroup {}", path.display()))?;
    let mut cg = Cgroup { path, children: Vec::new() };
    for _ in 0..n {
        let mut child = Command::new(target)
            .env("ATTACH_TARGET_RATE", CGROUP_RATE.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id();
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut first)?;
        if !first.starts_with("PID ") {
            bail!("attach_target printed {first:?}");
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(cg.path.join("cgroup.procs"))?
            .write_all(pid.to_string().as_bytes())
            .with_context(|| format!("moving PID {pid} into {}", cg.path.display()))?;
        cg.children.push(KillOnDrop(child));
    }
    Ok(cg)
}

fn medians(runs: &[Run], f: impl Fn(&Run) -> f64) -> f64 {
    median(&runs.iter().map(f).collect::<Vec<_>>())
}

/// The table rows of one case: (multi runs, single runs).
fn rows(s: &mut String, runs: &[(&[Run], &str)]) {
    s.push_str("| figure |");
    for (_, name) in runs {
        s.push_str(&format!(" {name} |"));
    }
    s.push_str("\n| --- |");
    for _ in runs {
        s.push_str(" ---: |");
    }
    s.push('\n');
    let row = |s: &mut String, label: &str, f: &dyn Fn(&[Run]) -> String| {
        s.push_str(&format!("| {label} |"));
        for (r, _) in runs {
            s.push_str(&format!(" {} |", f(r)));
        }
        s.push('\n');
    };
    row(s, "probes placed (all processes)", &|r| format!("{}", r.last().map_or(0, |x| x.probes)));
    row(s, "links / perf events made", &|r| format!("{}", r.last().map_or(0, |x| x.links)));
    row(s, "start → exit, s (median)", &|r| format!("{:.2}", medians(r, |x| x.total_s)));
    row(s, "**overhead: start → exit − 3 s**, s", &|r| {
        let v: Vec<String> = r.iter().map(|x| format!("{:.2}", x.total_s - DURATION_S)).collect();
        format!("**{:.2}** ({})", medians(r, |x| x.total_s - DURATION_S), v.join(", "))
    });
    row(s, "start → last process attached, s", &|r| format!("{:.2}", medians(r, |x| x.attached_s)));
    row(s, "of which loading the eBPF programs (verifier), s", &|r| format!("{:.2}", medians(r, |x| x.load_s)));
    row(s, "of which creating the probes (all processes), s", &|r| format!("{:.3}", medians(r, |x| x.attach_s)));
    row(s, "detaching every probe and tracepoint, s", &|r| format!("{:.2}", medians(r, |x| x.detach_s)));
    row(s, "agent CPU (user + system), s", &|r| format!("{:.2}", medians(r, |x| x.cpu_s)));
    row(s, "agent peak RSS, MiB", &|r| format!("{:.0}", medians(r, |x| x.maxrss_kib as f64) / 1024.0));
}

/// Build xtask/bench/attach_target.cpp into `work/attach_target` (g++ -O1 -g); its path.
pub(super) fn build_target(work: &Path) -> Result<PathBuf> {
    let target = work.join("attach_target");
    run(Command::new("g++")
        .args(["-O1", "-g", "-o"])
        .arg(&target)
        .arg(root().join("xtask/bench/attach_target.cpp"))
        .arg("-ldl"))?;
    Ok(target)
}

/// Measure `reps` recordings of each case and way; the markdown section (between the markers).
pub(super) fn measure(reps: usize) -> Result<String> {
    let work = root().join("target/bench/attach");
    std::fs::create_dir_all(&work)?;
    let target = build_target(&work)?;
    let libs: Vec<&str> = EXTRA_LIBS
        .iter()
        .copied()
        .filter(|l| {
            let name = std::ffi::CString::new(*l).expect("no NUL");
            // SAFETY: dlopen with a NUL-terminated name (alive for the call); the handle is closed
            // at once.
            let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
            if !h.is_null() {
                // SAFETY: the handle dlopen just returned, closed once.
                unsafe { libc::dlclose(h) };
            }
            !h.is_null()
        })
        .collect();
    let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let mut loads = Vec::new();

    // One process, ~100 probes.
    let mut one = Spawned::new({
        let mut c = Command::new(&target);
        c.args(&libs);
        c
    })?;
    one.wait_stdout_line("PID ", Duration::from_secs(10))?;
    let args = vec!["--pid".to_string(), one.pid().to_string()];
    let (m1, s1) = both_variants(&work, &args, (reps, reps), "one", true, &mut loads)?;
    drop(one);

    // --cgroup over 50 processes.
    let cg = cgroup_of_targets(&target, CGROUP_PROCESSES)?;
    let args = vec!["--cgroup".to_string(), cg.path.display().to_string()];
    // Single uprobes over 50 processes take ~3 minutes a run to detach: one run, as a comparison.
    let (m50, s50) = both_variants(&work, &args, (reps, 1), "cg", false, &mut loads)?;
    drop(cg);

    let load = load_range(&loads);
    let mut s = String::new();
    s.push_str(BEGIN);
    s.push('\n');
    s.push_str(&format!(
        "Measured by `cargo xtask bench` ({date}; `--attach-only` runs just this part), {} run(s) of each variant \
         (one of single uprobes under `--cgroup`: ~3 minutes each), the uprobe_multi runs first (a single-uprobe run's detach \
         leaves threads waiting in the kernel for minutes), each one-process uprobe_multi run after waiting up to 2 minutes for a \
         1-minute load average below 1.5, 1-minute load {load} at the starts (2 CPUs). Every run is \
         `RUST_LOG=leaktrace=info leaktrace record ... --duration 3s --quiet --out DIR` (exact mode); \
         \"uprobe_multi\" is the default, \"single\" the fallback forced by `LEAKTRACE_SINGLE_UPROBES=1`. The parts come \
         from leaktrace's timing log lines (leaktrace/src/probes.rs), CPU and peak RSS from wait4's rusage.\n\n",
        m1.len()
    ));
    s.push_str(&format!(
        "**One process, ~100 probes**: `target/bench/attach/attach_target {}` (xtask/bench/attach_target.cpp: \
         libc and libstdc++ linked, the others dlopen'ed), `leaktrace record --pid PID`.\n\n",
        libs.join(" ")
    ));
    rows(&mut s, &[(&m1, "uprobe_multi"), (&s1, "single")]);
    s.push_str(&format!(
        "\n**`--cgroup` over {CGROUP_PROCESSES} processes** each mapping libc and libstdc++ \
         (`attach_target` without arguments, `ATTACH_TARGET_RATE={CGROUP_RATE}`: {CGROUP_RATE} rounds of new/delete and \
         malloc/free a second each, moved into a new cgroup v2), `leaktrace record --cgroup PATH`.\n\n"
    ));
    rows(&mut s, &[(&m50, "uprobe_multi"), (&s50, "single")]);
    s.push('\n');
    s.push_str(END);
    s.push('\n');
    Ok(s)
}
