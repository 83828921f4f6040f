//! `cargo xtask test`'s runner: leaktrace's binary and every test binary of the workspace built
//! by one cargo command (`cargo build --release --workspace --exclude leaktrace-ebpf --tests
//! --examples --bin leaktrace`: one feature resolution, so no crate is compiled twice), then run from one pool, N jobs at a time.
//!
//! - A job is one end-to-end test (`BIN --exact NAME --test-threads=1 --nocapture`: its own
//!   process, its output in its own log) or one unit-test binary (all its tests; libtest's
//!   threads).
//! - The end-to-end tests mostly wait on a fixture, so N is above the core count
//!   ([`DEFAULT_JOBS`]).
//! - Each job has a weight in the pool's N slots: 1, except the tests of [`TIMED`] (rates
//!   against the wall clock: N − 1, so at most one other job runs beside one), of [`RATED`]
//!   (rates against the program's own: half the slots) — never two of those at once — and of
//!   [`ALONE`] (N: nothing beside them). [`ONE_AT_A_TIME`] names tests that share a host-wide
//!   resource and run one at a time.
//! - Timed and rated tests start first, one after another from the start of the run, each
//!   beside the ordinary jobs its weight leaves room for: they are the run's one serial chain,
//!   and left to the end (as they once were) they ran with the pool otherwise empty. Timed ones
//!   come before rated ones (a rated test ending leaves too many jobs running for a timed one to
//!   fit, and it would wait until the ordinary jobs ran out). Alone tests run last.
//! - Within each of those ranks (ordinary jobs and unit-test binaries together) jobs start
//!   longest first by the durations of the previous run (`target/xtask-test/durations.tsv`),
//!   else by those of a run committed in [`COMMITTED_DURATIONS`] (so a fresh clone orders them
//!   too), else in file order.
//! - The fixtures every test shares are built once per run: the run's directory is handed to
//!   the tests in `LEAKTRACE_TEST_FIXTURES` (tests/src/fixture.rs, `built_once`).
//! - A failing job's log is printed in full when it ends; at the end come the failures' names,
//!   the ten slowest jobs and the closing line `N passed, N failed`. No retries.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::{cargo, release_binary, show};

/// Tests run with nothing else beside them (prefixes of `FILE::TEST`).
pub(crate) const ALONE: &[&str] = &[
    // A process whose main thread has exited loses its uprobes when another tracer detaches
    // from a library it maps (docs/reliability.md): no other recording may end beside it.
    "production::leak_found_after_the_main_thread_exits",
    // One agent watching a node of 50 processes, with rates within 30 %.
    "watch_node::",
    // Pages touched follow 600,000 B/s within 40 % over a 2 s steady window: beside another job
    // it once measured 244,000 B/s.
    "watch_push::watch_pushes_growth_profiles_with_pod_labels",
];

/// Tests that compare a traced rate with the wall clock, or two runs, within a stated tolerance:
/// each runs beside at most one other job (N − 1 of the N slots), never beside another timed or
/// rated test.
pub(crate) const TIMED: &[&str] = &[
    // The arenas' growth is the fixture's 2 MiB/s within 30 %.
    "verdicts_arenas::growth_mode_tells_fragmentation_from_a_leak_by_glibcs_headers",
    // The leaker's growth within 20 % of 600,000 B/s, through a real Prometheus.
    "watch_metrics::watch_metrics_scraped_by_prometheus_and_the_leaker_escalated",
    // Sampled mode's figures within 15 % of a second, exact, run.
    "modes::sampled_estimates_within_15_percent_of_exact",
    // glibc's arenas retain the fixture's 1 MiB/s and 384 KiB/s within 30 %, the leak beneath at
    // 20 KiB/s within 20 %; the warm-up's table follows the fixture's clock through a 30 s window.
    "verdicts_retention::",
    // The Java heap judged on what each collection left: beside four other jobs the JVM saw
    // only three collections in 16 s, too few to tell its growth from zero at 95 %.
    "runtimes_jvm::jvm_array_list_grows_the_java_heap",
    // The Java heap's growth on a 30 s attach within 10 % of the static list's rate (its clock is
    // the wall clock), on the 2 to 4 collections the JVM runs in that time.
    "verdicts_managed::jvm_g1_leak_on_few_collections_is_a_managed_leak",
    "verdicts_managed::jvm_parallel_leak_on_few_collections_is_a_managed_leak",
    // The Go heap's growth on a 30 s attach within 10 % of the slice's rate (kept against the
    // wall clock), on what each collection marked live.
    "verdicts_managed::go_leak_judged_on_what_each_collection_marked",
    // The V8 heap's growth on a 30 s attach within 10 % of the arrays' rate (kept against the
    // wall clock), on what each mark-compact left.
    "verdicts_managed::node_leak_judged_on_what_each_mark_compact_left",
];

/// Tests that compare a traced rate with the rate the program says it ran, within a stated
/// tolerance (the program's own clock slows with it, not the checkpoints'): each takes half the
/// slots, and never runs beside another timed or rated test.
pub(crate) const RATED: &[&str] = &[
    // The escalated leak's rate within 30 % of the rate the program reports.
    "growth_escalation::growth_mode_escalates_and_names_the_leaking_function",
    // The ctypes leak's rate within 10 % of the script's.
    "python::python_ctypes_leak_",
    // Python objects grow at the call or message rate within 10 %.
    "python_holds::python_heap_event_bus_",
    "python_holds::python_heap_reference_leaked_by_an_extension_311",
    // The native bytes a dict retains within 10 % of the fixture's own count at the census.
    "holds_graph::",
    // The stepwise leak's envelope within 20 % and the leaking caller's rate within 10 % of the
    // fixture's own.
    "verdicts_miss::leak_growing_in_doubling_steps_is_judged_by_its_envelope",
    "verdicts_miss::constructor_called_from_several_places_names_the_leaking_caller",
    // The memo map's entries and retained bytes within 20 % of the fixture's own request rate.
    "holds_go::go_map_memo_named_",
];

/// Groups of tests that run one at a time (name, prefixes of `FILE::TEST`).
pub(crate) const ONE_AT_A_TIME: &[(&str, &[&str])] = &[
    // Each opens its node target's inspector on the default port 9229, one per host.
    ("node-inspector", &["runtime_holds::node_"]),
    // Each makes pods under /kubepods (a private containerd's, or cgroups laid out as the kubelet
    // lays them) and some assert that none is left when they end or watch every pod of a QoS
    // class: one such tree on the host at a time.
    ("kubepods", &["containers::", "containers_net::", "pod::", "hostile_paths::", "watch_pod::"]),
];

/// Durations (seconds, `FILE::TEST`) of a whole run, committed: the order of a run on a fresh
/// clone, which has no `target/xtask-test/durations.tsv` yet. A test missing from it counts as
/// 0 s (it starts last in its rank); refresh it from a run's durations.tsv now and then.
pub(crate) const COMMITTED_DURATIONS: &str = "xtask/test-durations.tsv";

/// The jobs run at once: `--jobs`, else `LEAKTRACE_TEST_JOBS`, else [`DEFAULT_JOBS`].
pub(crate) const DEFAULT_JOBS: usize = 6;

/// What `cargo xtask test` was asked.
pub(crate) struct Args {
    pub(crate) jobs: Option<usize>,
    /// Print the jobs in order with their weights and groups, run nothing.
    pub(crate) list: bool,
    /// Test filters, libtest's way: a test runs when its `FILE::TEST` name contains one (equals
    /// one with `--exact`); `--skip PATTERN` leaves out those that contain it.
    pub(crate) filters: Vec<String>,
    pub(crate) exact: bool,
    pub(crate) skip: Vec<String>,
}

impl Args {
    /// Parse the arguments after `cargo xtask test` (filters, `--exact`, `--skip P`, `--jobs N`,
    /// `--list`).
    pub(crate) fn parse(raw: &[std::ffi::OsString]) -> Result<Args> {
        let mut a = Args { jobs: None, list: false, filters: Vec::new(), exact: false, skip: Vec::new() };
        let mut it = raw.iter().map(|s| s.to_string_lossy().into_owned());
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--exact" => a.exact = true,
                "--list" => a.list = true,
                "--skip" => a.skip.push(it.next().context("--skip needs a pattern")?),
                "--jobs" | "-j" => {
                    let n = it.next().context("--jobs needs a number")?;
                    a.jobs = Some(n.parse().ok().filter(|&n| n > 0).with_context(|| format!("bad --jobs {n}"))?);
                }
                a_ if a_.starts_with('-') => bail!(
                    "unknown option {a_} (cargo xtask test [--jobs N] [--list] [--exact] [--skip PATTERN] [FILTER...])"
                ),
                _ => a.filters.push(arg),
            }
        }
        Ok(a)
    }

    /// Whether the end-to-end test `name` (`FILE::TEST`) is asked for.
    pub(crate) fn selects(&self, name: &str) -> bool {
        let short = name.split_once("::").map_or(name, |(_, t)| t);
        let hit = |f: &String| if self.exact { name == f || short == f } else { name.contains(f.as_str()) };
        (self.filters.is_empty() || self.filters.iter().any(hit))
            && !self.skip.iter().any(|s| name.contains(s.as_str()))
    }

    fn jobs(&self) -> usize {
        self.jobs
            .or_else(|| std::env::var("LEAKTRACE_TEST_JOBS").ok().and_then(|s| s.parse().ok()))
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_JOBS)
    }
}

/// A test executable cargo built.
pub(crate) struct Binary {
    /// The target's name (`production`, or `leaktrace` for a crate's unit tests).
    pub(crate) target: String,
    pub(crate) package: String,
    pub(crate) kind: String,
    pub(crate) exe: PathBuf,
    /// The package's directory: cargo runs its tests there.
    pub(crate) dir: PathBuf,
}

impl Binary {
    fn e2e(&self) -> bool {
        self.package == "leaktrace-tests" && self.kind == "test"
    }
}

/// Build leaktrace's binary (`target/release/leaktrace`) and every test binary of the workspace
/// in one cargo command; the test binaries cargo built.
///
/// One command, not `cargo build -p leaktrace` then `cargo test --workspace --no-run`: cargo
/// resolves features over the packages of a command, and the workspace's other members turn on
/// features of serde, serde_json, syn and memchr that leaktrace alone does not, so the two
/// commands compiled leaktrace, leaktrace-analysis, prost, syn and five more crates twice
/// (docs/benchmarks.md). `--tests --examples` builds what `cargo test --no-run` built, and
/// `--bin leaktrace` the agent itself (not xtask's binary: `cargo xtask` runs a debug one).
/// leaktrace-ebpf is left out: built for the host it is an empty `main` without tests, and its
/// binary, also named `leaktrace`, would take the agent's place in `target/release` (the eBPF
/// object is built by leaktrace/build.rs).
pub(crate) fn build_test_binaries() -> Result<Vec<Binary>> {
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--workspace", "--exclude", "leaktrace-ebpf"])
        .args(["--tests", "--examples", "--bin", "leaktrace", "--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit());
    eprintln!("xtask: $ {}", show(&cmd));
    let out = cmd.output().context("cannot run cargo build --tests")?;
    if !out.status.success() {
        bail!("building leaktrace and the tests failed (see above)");
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(m) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let Some(exe) = m["executable"].as_str() else { continue };
        if m["reason"] != "compiler-artifact" || m["profile"]["test"] != true {
            continue;
        }
        let manifest = PathBuf::from(m["manifest_path"].as_str().unwrap_or_default());
        let package = manifest.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
        bins.push(Binary {
            target: m["target"]["name"].as_str().unwrap_or_default().to_string(),
            package: match package.as_deref() {
                Some("tests") => "leaktrace-tests".to_string(),
                Some(p) => p.to_string(),
                None => String::new(),
            },
            kind: m["target"]["kind"][0].as_str().unwrap_or_default().to_string(),
            exe: PathBuf::from(exe),
            dir: manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
        });
    }
    Ok(bins)
}

/// How a job shares the pool.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Class {
    Ordinary,
    Rated,
    Timed,
    Alone,
}

/// One process of the run.
pub(crate) struct Job {
    /// `FILE::TEST` for an end-to-end test, `unit:PACKAGE:KIND:TARGET` for a unit-test binary.
    pub(crate) name: String,
    pub(crate) class: Class,
    /// The one-at-a-time group it belongs to (timed tests are all in `timed`).
    pub(crate) group: Option<&'static str>,
    exe: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    unit: bool,
}

/// The class and group of the end-to-end test `name`.
pub(crate) fn classify(name: &str) -> (Class, Option<&'static str>) {
    if ALONE.iter().any(|p| name.starts_with(p)) {
        return (Class::Alone, None);
    }
    if TIMED.iter().any(|p| name.starts_with(p)) {
        return (Class::Timed, Some("timed"));
    }
    if RATED.iter().any(|p| name.starts_with(p)) {
        return (Class::Rated, Some("timed"));
    }
    let group = ONE_AT_A_TIME.iter().find(|(_, ps)| ps.iter().any(|p| name.starts_with(p))).map(|(g, _)| *g);
    (Class::Ordinary, group)
}

/// The tests `exe --list` names (ignored ones left out); `exe` is run from `dir`.
fn list_tests(exe: &Path, dir: &Path) -> Result<Vec<String>> {
    let list = |ignored: bool| -> Result<Vec<String>> {
        let mut c = Command::new(exe);
        c.args(["--list", "--format", "terse"]).current_dir(dir).stdin(Stdio::null());
        if ignored {
            c.arg("--ignored");
        }
        let out = c.output().with_context(|| format!("cannot run {} --list", exe.display()))?;
        if !out.status.success() {
            bail!("{} --list failed: {}", exe.display(), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(str::to_string)
            .collect())
    };
    let ignored = list(true)?;
    Ok(list(false)?.into_iter().filter(|t| !ignored.contains(t)).collect())
}

/// The jobs of the run, in the order the pool takes them ([`rank`], then longest first by
/// `previous` durations). With no filter, every
/// prefix of [`ALONE`], [`TIMED`] and [`ONE_AT_A_TIME`] must name a test (a renamed test would
/// otherwise lose its group quietly).
pub(crate) fn plan(bins: &[Binary], args: &Args, previous: &BTreeMap<String, f64>) -> Result<Vec<Job>> {
    let mut jobs = Vec::new();
    let mut all_names = Vec::new();
    for b in bins {
        if !b.e2e() {
            // Unit tests: the filters go to libtest as they are.
            let mut a: Vec<String> = args.filters.clone();
            if args.exact {
                a.push("--exact".into());
            }
            for s in &args.skip {
                a.extend(["--skip".into(), s.clone()]);
            }
            jobs.push(Job {
                name: format!("unit:{}:{}:{}", b.package, b.kind, b.target),
                class: Class::Ordinary,
                group: None,
                exe: b.exe.clone(),
                args: a,
                dir: b.dir.clone(),
                unit: true,
            });
            continue;
        }
        for test in list_tests(&b.exe, &b.dir)? {
            let name = format!("{}::{test}", b.target);
            all_names.push(name.clone());
            if !args.selects(&name) {
                continue;
            }
            let (class, group) = classify(&name);
            jobs.push(Job {
                name,
                class,
                group,
                exe: b.exe.clone(),
                args: vec!["--exact".into(), test, "--test-threads=1".into(), "--nocapture".into()],
                dir: b.dir.clone(),
                unit: false,
            });
        }
    }
    if args.filters.is_empty() && args.skip.is_empty() {
        let prefixes = ALONE.iter().chain(TIMED).chain(RATED).chain(ONE_AT_A_TIME.iter().flat_map(|(_, ps)| ps.iter()));
        let stale: Vec<&str> = prefixes.filter(|p| !all_names.iter().any(|n| n.starts_with(*p))).copied().collect();
        if !stale.is_empty() {
            bail!("xtask/src/suite.rs names tests that do not exist (renamed? update the list): {}", stale.join(", "));
        }
    }
    // Stable: file order among jobs without a previous duration.
    jobs.sort_by(|a, b| {
        let d = |j: &Job| previous.get(&j.name).copied().unwrap_or(0.0);
        rank(a.class).cmp(&rank(b.class)).then(d(b).total_cmp(&d(a)))
    });
    Ok(jobs)
}

/// Where a job of `class` stands in the pool's order: the timed, then the rated tests (the
/// serial chain, beside everything else from the start), then ordinary jobs and unit-test
/// binaries, then alone tests.
pub(crate) fn rank(class: Class) -> u8 {
    match class {
        Class::Timed => 0,
        Class::Rated => 1,
        Class::Ordinary => 2,
        Class::Alone => 3,
    }
}

/// The slots a job of `class` takes in a pool of `capacity`.
pub(crate) fn weight(class: Class, capacity: usize) -> usize {
    match class {
        Class::Ordinary => 1,
        Class::Rated => capacity.div_ceil(2),
        Class::Timed => capacity.saturating_sub(1).max(1),
        Class::Alone => capacity,
    }
}

/// The position in `pending` of the next job to start, if one fits: the first in order whose
/// weight fits the free slots and whose group runs nothing; only an alone test is passed by
/// nothing (it waits for the pool to empty).
pub(crate) fn pick(pending: &[(Class, Option<&str>)], capacity: usize, used: usize, groups: &[&str]) -> Option<usize> {
    for (pos, (class, group)) in pending.iter().enumerate() {
        let fits = used + weight(*class, capacity) <= capacity && group.is_none_or(|g| !groups.contains(&g));
        if fits {
            return Some(pos);
        }
        if *class == Class::Alone {
            return None;
        }
    }
    None
}

/// How one job ended.
struct Outcome {
    name: String,
    secs: f64,
    passed: usize,
    failed: usize,
    ok: bool,
    log: PathBuf,
}

/// Counts of libtest's summary line (`test result: ok. 12 passed; 0 failed; ...`) in `log`.
fn summary_counts(log: &str) -> Option<(usize, usize)> {
    let line = log.lines().rev().find(|l| l.starts_with("test result: "))?;
    let count = |what: &str| {
        line.split(';')
            .find_map(|p| p.trim().strip_suffix(what).and_then(|n| n.trim().rsplit(' ').next()?.parse().ok()))
    };
    Some((count(" passed")?, count(" failed")?))
}

/// Run `jobs` from a pool of `capacity` slots; every outcome, in the order they ended.
fn run_pool(jobs: Vec<Job>, capacity: usize, logs: &Path, env: &[(&str, &Path)]) -> Result<Vec<Outcome>> {
    let total = jobs.len();
    let mut pending: Vec<Job> = jobs;
    let mut running: BTreeMap<usize, (String, usize, Option<&'static str>, Instant)> = BTreeMap::new();
    let (tx, rx) = mpsc::channel::<(usize, Result<std::process::ExitStatus, String>)>();
    let mut outcomes = Vec::new();
    let mut next_id = 0usize;
    let mut logs_of: BTreeMap<usize, (PathBuf, bool, u32)> = BTreeMap::new();
    let mut last_note = Instant::now();
    while !pending.is_empty() || !running.is_empty() {
        loop {
            let used: usize = running.values().map(|r| r.1).sum();
            let groups: Vec<&str> = running.values().filter_map(|r| r.2).collect();
            let keys: Vec<(Class, Option<&str>)> = pending.iter().map(|j| (j.class, j.group)).collect();
            let Some(pos) = pick(&keys, capacity, used, &groups) else { break };
            let job = pending.remove(pos);
            let log = logs.join(format!("{}.log", job.name.replace([':', '/'], "_")));
            let file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
            let mut cmd = Command::new(&job.exe);
            cmd.args(&job.args).current_dir(&job.dir).stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let mut child = cmd.spawn().with_context(|| format!("cannot run {}", job.exe.display()))?;
            let id = next_id;
            next_id += 1;
            running.insert(id, (job.name.clone(), weight(job.class, capacity), job.group, Instant::now()));
            logs_of.insert(id, (log, job.unit, child.id()));
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = tx.send((id, child.wait().map_err(|e| e.to_string())));
            });
        }
        let Ok((id, status)) = rx.recv_timeout(Duration::from_secs(60)) else {
            if last_note.elapsed() >= Duration::from_secs(300) {
                last_note = Instant::now();
                let long: Vec<String> =
                    running.values().map(|(n, _, _, t)| format!("{n} ({:.0} s)", t.elapsed().as_secs_f64())).collect();
                eprintln!("xtask: test: still running: {}", long.join(", "));
            }
            continue;
        };
        let (name, _, _, started) = running.remove(&id).expect("a job that ran");
        let (log, unit, pid) = logs_of.remove(&id).expect("its log");
        let secs = started.elapsed().as_secs_f64();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let counts = summary_counts(&text);
        // An end-to-end job passes when its one test ran and passed (`--exact` matching nothing
        // would pass with 0 tests run).
        let ok = matches!(&status, Ok(s) if s.success()) && (unit || counts == Some((1, 0)));
        let (passed, failed) = match (unit, counts) {
            (true, Some((p, f))) => (p, if ok { f } else { f.max(1) }),
            _ => (usize::from(ok), usize::from(!ok)),
        };
        let done = outcomes.len() + 1;
        if ok && !unit {
            remove_temp_root(pid);
        }
        if ok {
            eprintln!("xtask: PASS {secs:7.1} s  {name}  [{done}/{total}, {} running]", running.len());
        } else {
            let why = match &status {
                Ok(s) if s.success() => "it ran no test, or more than one".to_string(),
                Ok(s) => s.to_string(),
                Err(e) => format!("cannot wait for it: {e}"),
            };
            eprintln!(
                "xtask: FAIL {secs:7.1} s  {name}  ({why}) [{done}/{total}]\n---- {name}: full output ({}) ----\n{text}\n---- end of {name} ----",
                log.display()
            );
        }
        outcomes.push(Outcome { name, secs, passed, failed, ok, log });
    }
    Ok(outcomes)
}

/// Remove the temporary directory of the passed test process `pid` (`leaktrace-tests-PID-*` in
/// the temporary directory, tests/src/tempdir.rs): with a process per test they would pile up
/// by the hundred. A failed test's is kept for inspection.
fn remove_temp_root(pid: u32) {
    let prefix = format!("leaktrace-tests-{pid}-");
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Where a run keeps its logs and the durations of the last run.
fn work_dir() -> PathBuf {
    release_binary().parent().and_then(Path::parent).map(|t| t.join("xtask-test")).unwrap_or_default()
}

fn read_durations(path: &Path) -> BTreeMap<String, f64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter_map(|(s, n)| Some((n.to_string(), s.parse().ok()?)))
        .collect()
}

/// Build, list and run the tests, the long-run one in the background when no filter is given;
/// prints the failures, the ten slowest and the closing line `N passed, N failed` last. Ok(true)
/// when everything passed.
pub(crate) fn run(args: &Args, leaktrace: &Path) -> Result<bool> {
    let bins = build_test_binaries()?;
    let work = work_dir();
    let durations = work.join("durations.tsv");
    let mut previous = read_durations(&crate::root().join(COMMITTED_DURATIONS));
    previous.extend(read_durations(&durations));
    let jobs = plan(&bins, args, &previous)?;
    let capacity = args.jobs();
    if args.list {
        for j in &jobs {
            let g = j.group.map(|g| format!(", group {g}")).unwrap_or_default();
            println!("{}\t{:?}, weight {}{g}", j.name, j.class, weight(j.class, capacity));
        }
        return Ok(true);
    }
    let logs = work.join("logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let fixtures = std::env::temp_dir().join(format!("leaktrace-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&fixtures).with_context(|| format!("cannot create {}", fixtures.display()))?;
    let env: [(&str, &Path); 2] = [("LEAKTRACE_BIN", leaktrace), ("LEAKTRACE_TEST_FIXTURES", &fixtures)];
    // The long-run test (tests/tests/long_run.rs, 10 minutes, mostly waiting) runs in the
    // background beside the rest of the suite; not when only some tests are asked for.
    let long =
        if args.filters.is_empty() && args.skip.is_empty() { Some(LongRun::start(&bins, &env, &work)?) } else { None };
    eprintln!(
        "xtask: test: {} jobs, {capacity} at a time (logs in {}, fixtures in {})",
        jobs.len(),
        logs.display(),
        fixtures.display()
    );
    let started = Instant::now();
    let mut outcomes = run_pool(jobs, capacity, &logs, &env)?;
    let wall = started.elapsed();
    if let Some(l) = long {
        outcomes.push(l.finish()?);
    }
    let _ = std::fs::remove_dir_all(&fixtures);
    let mut merged = previous;
    merged.extend(outcomes.iter().map(|o| (o.name.clone(), o.secs)));
    let text: String = merged.iter().fold(String::new(), |mut s, (n, d)| {
        let _ = writeln!(s, "{d:.1}\t{n}");
        s
    });
    let _ = std::fs::write(&durations, text);
    summarize(&outcomes, wall);
    let (passed, failed) = outcomes.iter().fold((0, 0), |(p, f), o| (p + o.passed, f + o.failed));
    println!("{passed} passed, {failed} failed");
    Ok(outcomes.iter().all(|o| o.ok))
}

fn summarize(outcomes: &[Outcome], wall: Duration) {
    let mut slow: Vec<&Outcome> = outcomes.iter().collect();
    slow.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    eprintln!("xtask: test: the ten slowest:");
    for o in slow.iter().take(10) {
        eprintln!("  {:7.1} s  {}", o.secs, o.name);
    }
    let busy: f64 = outcomes.iter().map(|o| o.secs).sum();
    eprintln!(
        "xtask: test: pool wall time {:.1} min ({:.0} s), {:.1} min of jobs",
        wall.as_secs_f64() / 60.0,
        wall.as_secs_f64(),
        busy / 60.0
    );
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok).collect();
    if !failed.is_empty() {
        eprintln!("xtask: test: failed (full output above, and in the logs):");
        for o in &failed {
            eprintln!("  {}  ({})", o.name, o.log.display());
        }
    }
}

/// The long-run end-to-end test, running in the background outside the pool (it mostly
/// waits): its test binary with `--ignored`, its output in `target/xtask-test/long-run.log`.
struct LongRun {
    /// Its exit status and how long it ran, sent when it ends (not when the pool has ended: it
    /// usually ends first, and its own time is what says whether it bounds the run).
    ended: mpsc::Receiver<(std::io::Result<std::process::ExitStatus>, Duration)>,
    log: PathBuf,
}

impl LongRun {
    fn start(bins: &[Binary], env: &[(&str, &Path)], work: &Path) -> Result<LongRun> {
        let bin =
            bins.iter().find(|b| b.e2e() && b.target == "long_run").context("cargo built no long_run test binary")?;
        let log = work.join("long-run.log");
        let file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(&bin.exe);
        cmd.args(["--ignored", "--nocapture", "--test-threads=1"])
            .current_dir(&bin.dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        eprintln!("xtask: $ {} (in the background; output in {})", show(&cmd), log.display());
        let mut child = cmd.spawn().with_context(|| format!("cannot run {}", bin.exe.display()))?;
        let started = Instant::now();
        let (tx, ended) = mpsc::channel();
        std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send((status, started.elapsed()));
        });
        Ok(LongRun { ended, log })
    }

    /// Wait for it and print its output.
    fn finish(self) -> Result<Outcome> {
        eprintln!("xtask: waiting for the long-run test ({})", self.log.display());
        let (status, took) = self.ended.recv().context("the long-run test's waiting thread is gone")?;
        let status = status.context("cannot wait for the long-run test")?;
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        eprintln!("xtask: long-run test output:\n{text}");
        let ok = status.success();
        Ok(Outcome {
            name: "long_run (background)".to_string(),
            secs: took.as_secs_f64(),
            passed: usize::from(ok),
            failed: usize::from(!ok),
            ok,
            log: self.log,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const O: (Class, Option<&str>) = (Class::Ordinary, None);
    const T: (Class, Option<&str>) = (Class::Timed, Some("timed"));
    const A: (Class, Option<&str>) = (Class::Alone, None);

    #[test]
    fn ordinary_jobs_fill_the_pool() {
        assert_eq!(pick(&[O, O], 6, 5, &[]), Some(0));
        assert_eq!(pick(&[O, O], 6, 6, &[]), None);
    }

    #[test]
    fn a_timed_test_runs_beside_one_job_at_most_and_never_beside_another() {
        // 2 ordinary jobs running: the timed test waits; an ordinary job behind it may pass.
        assert_eq!(pick(&[T, O], 6, 2, &[]), Some(1));
        assert_eq!(pick(&[T], 6, 1, &[]), Some(0));
        // Running a timed test (5 slots) and one job: nothing more.
        assert_eq!(pick(&[T, O], 6, 6, &["timed"]), None);
        // Beside a timed test alone, one ordinary job, not the second timed one.
        assert_eq!(pick(&[T, O], 6, 5, &["timed"]), Some(1));
        // In a pool of 2, timed tests weigh 1 but still never run together.
        assert_eq!(pick(&[T], 2, 1, &["timed"]), None);
    }

    #[test]
    fn a_rated_test_takes_half_the_pool() {
        let r = (Class::Rated, Some("timed"));
        assert_eq!(pick(&[r], 6, 3, &[]), Some(0));
        assert_eq!(pick(&[r, O], 6, 4, &[]), Some(1));
        assert_eq!(pick(&[r], 6, 3, &["timed"]), None);
        assert_eq!(weight(Class::Rated, 5), 3);
    }

    #[test]
    fn an_alone_test_waits_for_an_empty_pool_and_nothing_passes_it() {
        assert_eq!(pick(&[A, O], 6, 1, &[]), None);
        assert_eq!(pick(&[A, O], 6, 0, &[]), Some(0));
        assert_eq!(pick(&[O], 6, 6, &[]), None);
    }

    #[test]
    fn the_timed_and_rated_chain_runs_from_the_start_beside_ordinary_jobs() {
        let r = (Class::Rated, Some("timed"));
        let mut classes = [O, A, r, T, O, r, O, T];
        classes.sort_by_key(|(c, _)| rank(*c));
        assert_eq!(classes, [T, T, r, r, O, O, O, A]);
        // An empty pool starts the first timed test, then one ordinary job beside it.
        assert_eq!(pick(&classes, 6, 0, &[]), Some(0));
        assert_eq!(pick(&classes[1..], 6, 5, &["timed"]), Some(3));
        // The timed test ends beside its one neighbour: the next one fits at once.
        assert_eq!(pick(&[T, r, O, O], 6, 1, &[]), Some(0));
        // The last timed test ends: a rated one fits beside that neighbour, and when it ends
        // beside the three jobs its weight left room for, so does the next.
        assert_eq!(pick(&[r, r, O], 6, 1, &[]), Some(0));
        assert_eq!(pick(&[r, O], 6, 3, &[]), Some(0));
    }

    #[test]
    fn a_one_at_a_time_group_runs_one_test() {
        let n = (Class::Ordinary, Some("node-inspector"));
        assert_eq!(pick(&[n, O], 6, 1, &["node-inspector"]), Some(1));
        assert_eq!(pick(&[n], 6, 1, &[]), Some(0));
    }

    #[test]
    fn the_groups_name_the_leader_exits_watch_node_and_rate_tests() {
        assert_eq!(classify("production::leak_found_after_the_main_thread_exits").0, Class::Alone);
        assert_eq!(classify("watch_node::watch_a_node_of_50_processes").0, Class::Alone);
        assert_eq!(classify("python::python_ctypes_leak_shared_libpython_311"), (Class::Rated, Some("timed")));
        assert_eq!(classify("watch_push::watch_pushes_growth_profiles_with_pod_labels").0, Class::Alone);
        assert_eq!(classify("runtimes_jvm::jvm_array_list_grows_the_java_heap"), (Class::Timed, Some("timed")));
        assert_eq!(classify("runtime_holds::node_heap_snapshots_refused_without_headroom").1, Some("node-inspector"));
        assert_eq!(classify("production::cgroup_leak_found"), (Class::Ordinary, None));
    }

    #[test]
    fn filters_select_like_libtest_on_file_and_test_names() {
        let args = |v: &[&str]| Args::parse(&v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>()).unwrap();
        assert!(args(&[]).selects("growth::x"));
        assert!(args(&["growth::"]).selects("growth::x"));
        assert!(!args(&["growth::"]).selects("growth_escalation::x"));
        assert!(args(&["--exact", "x"]).selects("growth::x"));
        assert!(!args(&["--exact", "x"]).selects("growth::xy"));
        assert!(!args(&["growth", "--skip", "escalation"]).selects("growth_escalation::x"));
        assert_eq!(args(&["-j", "3", "a"]).jobs, Some(3));
        assert!(Args::parse(&["--frobnicate".into()]).is_err());
    }

    #[test]
    fn libtest_summary_counts_are_read() {
        let log = "running 3 tests\n...\ntest result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 4 filtered out; finished in 0.01s\n";
        assert_eq!(summary_counts(log), Some((2, 1)));
        assert_eq!(summary_counts("thread 'main' panicked"), None);
    }
}
