//! `leaktrace watch`: one long-running agent for a node. Every process the selector
//! picks (`--pid`, `--cgroup`, `--pod`; none: the whole host) is recorded in growth mode (page
//! faults by stack, RSS by kind; no allocator probes) by one tracer ([`record::Recorder`]: the
//! eBPF programs loaded once); the selector is rescanned every 5 s, so processes that start are
//! attached then and those that end are dropped, and each process's recording is cut every
//! `--window` (at once when it ends). Each window's recording of each process is
//! analysed by the same analysis as `record` ([`leaktrace_analysis::analyze::analyze`]), giving the online
//! verdict. A process whose verdict is a leak in `--escalate-after` windows in a row gets an
//! exact window (`record/escalate.rs`'s, `--escalate-for` long; at most `--max-escalations` at
//! once, none again within `--cooldown`) in the same session, on the tracer already loaded
//! ([`record::Recorder::escalate`]), and its report (the growth window and the exact one) is
//! written to `--out/NAME/TIME/`. A process the OOM killer takes gets its OOM-time report
//! (`oom.rs`). Memory stays bounded: recordings live one window, per-process state is
//! `state.rs`'s (a 5-minute memory series), and processes gone are forgotten after 2 minutes.
//!
//! Files: `cli.rs` the command line; `state.rs` what is kept per process and the escalation
//! rules; `window.rs` one window's verdicts and the escalations; `oom.rs` the OOM-time report;
//! `metrics.rs` the Prometheus endpoint.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::probes::Mode;
use crate::record::{self, RecordOptions};
use leaktrace_analysis::output::OutDir;
use leaktrace_analysis::recording::{EndReason, Recording};

pub mod budget;
pub mod cli;
pub mod metrics;
mod oom;
pub mod state;
mod window;

use state::{EscalationPolicy, Labels, Proc, Sample, WatchState};

/// Which processes `watch` follows, rescanned before every window.
#[derive(Clone, Debug)]
pub enum Selector {
    /// Every process of the host with an address space (kernel threads left out), leaktrace
    /// itself excepted.
    Host,
    /// These PIDs, while they live.
    Pids(Vec<u32>),
    /// The processes of a cgroup (v2, or a v1 hierarchy's) and of the cgroups below it.
    Cgroup(PathBuf),
    /// The processes of a Kubernetes pod (`crate::pod`).
    Pod(crate::pod::PodSelector),
}

impl Selector {
    /// A selector that can never match is a mistake to say at once, as `record` does: a
    /// `--pid` that is no process, a `--cgroup` that is no cgroup directory. (A pod may
    /// start later: none is waited for.)
    pub fn check(&self) -> anyhow::Result<()> {
        match self {
            Selector::Pids(p) => {
                for pid in p {
                    anyhow::ensure!(crate::procinfo::alive(*pid), "--pid {pid}: no such process");
                }
            }
            Selector::Cgroup(c) => {
                let dir = record::cgroup_dir(c);
                anyhow::ensure!(
                    dir.join("cgroup.procs").exists(),
                    "--cgroup {}: no such cgroup directory (no cgroup.procs in {})",
                    c.display(),
                    dir.display()
                );
                crate::note!("leaktrace: watch: --cgroup {}: {}", c.display(), crate::cgroups::describe(&dir));
            }
            Selector::Host | Selector::Pod(_) => {}
        }
        Ok(())
    }

    /// What is watched, for messages: `--pid 12 34`, `--cgroup X`, `--pod NAME`, `the host`.
    fn describe(&self) -> String {
        match self {
            Selector::Host => "the host".into(),
            Selector::Pids(p) => format!("--pid {}", p.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")),
            Selector::Cgroup(c) => format!("--cgroup {}", c.display()),
            Selector::Pod(_) => "the pod".into(),
        }
    }

    /// The live processes selected now (an empty list when the pod or cgroup has none, or is
    /// gone), leaktrace itself and kernel threads left out.
    pub fn scan(&self) -> Vec<u32> {
        let me = std::process::id();
        let pids = match self {
            Selector::Host => std::fs::read_dir("/proc")
                .map(|d| d.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).collect())
                .unwrap_or_default(),
            Selector::Pids(p) => p.clone(),
            Selector::Cgroup(c) => record::cgroup_tree_pids(&record::cgroup_dir(c)),
            Selector::Pod(sel) => crate::pod::resolve(sel).unwrap_or_default(),
        };
        let set: BTreeSet<u32> =
            pids.into_iter().filter(|&p| p != me && crate::procinfo::memory(p).is_some()).collect();
        set.into_iter().collect()
    }
}

/// Options of `leaktrace watch` (see `cli.rs` for each one's flag).
#[derive(Clone, Debug)]
pub struct WatchOptions {
    pub selector: Selector,
    /// Stop after this long; None: until SIGINT or SIGTERM.
    pub duration: Option<Duration>,
    /// Output directory; None: ./leaktrace-watch-TIMESTAMP.
    pub out: Option<PathBuf>,
    /// Length of a growth-mode window.
    pub window: Duration,
    /// Time between checkpoints in a window.
    pub interval: Duration,
    pub policy: EscalationPolicy,
    /// Serve Prometheus metrics there.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Sites listed in each report.md.
    pub top: usize,
    /// `--max-cpu`: the agent's own CPU limit, percent of one core over the last minute
    /// (`budget.rs`): above it, no escalation starts.
    pub max_cpu_pct: f64,
    /// `--push`: every process's profiles of its current window sent every `interval` (which
    /// `cli.rs` sets), labelled with its pod, namespace and container ([`push_labels`]).
    pub push: Option<crate::push::PushConfig>,
    /// `--max-sites`: distinct call-stack sites of the processes traced at once (kernel map
    /// size; a process's sites are given back when it is no longer watched).
    pub max_sites: u32,
}

/// Shortest window worth taking at the end of `--duration`: a verdict needs checkpoints.
const MIN_WINDOW: Duration = Duration::from_secs(2);

/// Run the agent until `--duration` or a signal. Errors: not root, the output directory or the
/// metrics address unusable, the eBPF programs refused (before anything is watched). The eBPF
/// programs are loaded once ([`record::Recorder`]); processes are attached as the selector
/// finds them (rescanned every [`RESCAN`]) and dropped when they end or leave it; each window is
/// cut from the same tracing, without a gap.
pub fn run(opts: WatchOptions) -> anyhow::Result<()> {
    crate::probes::check_privileges()?;
    opts.selector.check()?;
    // The address first: a port in use is said before the output directory is made.
    let listener = match opts.metrics_listen {
        Some(addr) => Some(
            std::net::TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("--metrics-listen {addr}: cannot listen there: {e}"))?,
        ),
        None => None,
    };
    let out = match &opts.out {
        Some(p) => OutDir::for_out(p)?,
        None => OutDir::create_named(&leaktrace_analysis::output::timestamped_dir("watch"))?,
    };
    let state = Arc::new(Mutex::new(WatchState::default()));
    if let Some(l) = listener {
        // The bound address (`:0` asks the kernel for a port: this is the one it gave).
        let addr = l.local_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
        metrics::serve(l, state.clone());
        crate::note!("leaktrace: watch: Prometheus metrics on http://{addr}/metrics");
    }
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(stop.clone());
    sample_memory(state.clone(), stop.clone());
    let rec_opts = window_options(&opts, opts.window);
    let mut recorder = record::Recorder::start(&rec_opts, POLL)?;
    if let Some(cfg) = opts.push.clone() {
        recorder.push_to(cfg, push_labels(state.clone()));
    }
    crate::note!(
        "leaktrace: watch: growth-mode windows of {:.0} s; output in {}",
        opts.window.as_secs_f64(),
        out.path().display()
    );
    let start = Instant::now();
    let mut w = Windows {
        recorder,
        follow: Follow::default(),
        budget: budget::CpuBudget::new(opts.max_cpu_pct),
        analysis_s: 0.0,
        pending: HashMap::new(),
        reports: Vec::new(),
    };
    // From now: the eBPF programs' load (the verifier, a one-off 1–10 s of system CPU by kernel
    // and machine) is not the agent's ongoing use and must not hold back the first minute's
    // escalations; the attaches that follow count.
    w.budget.check(Instant::now(), budget::process_cpu_s());
    let mut windows_taken = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let left = opts.duration.map(|d| d.saturating_sub(start.elapsed()));
        let len = left.map_or(opts.window, |l| l.min(opts.window));
        // The rest of --duration too short for a verdict ends the watch, except for the first
        // window: a --duration of 2 s (measured from here, a few ms short of 2 s) still gets
        // its one window and its verdicts, not none.
        if len.is_zero() || len < MIN_WINDOW && windows_taken > 0 {
            break;
        }
        w.follow.update(&mut w.recorder, &opts.selector, &state, &out);
        if w.recorder.pids().is_empty() {
            if matches!(opts.selector, Selector::Pids(_)) && opts.selector.scan().is_empty() {
                crate::note!("leaktrace: watch: every process of {} has exited", opts.selector.describe());
                break;
            }
            w.follow.say_once(format!("nothing to watch: {} has no process now; waiting", opts.selector.describe()));
            std::thread::sleep(opts.interval.max(Duration::from_secs(1)));
            continue;
        }
        let due = w.one(len, &opts, &state, &out, &stop);
        windows_taken += 1;
        w.reports.retain(|h| !h.is_finished());
        window::escalate(due, &mut w.recorder, &mut w.pending, &state, &opts);
        if let Ok(mut s) = state.lock() {
            s.windows += 1;
            s.forget_gone(Instant::now());
        }
    }
    // Exact windows still running end as they would have (a signal ends them at once), and
    // their reports are written.
    while !stop.load(Ordering::Relaxed) && w.recorder.windows_running() > 0 {
        w.recorder.run_for(POLL, &stop);
        w.report_windows(&state, &out, &opts);
    }
    w.recorder.end_windows(if stop.load(Ordering::Relaxed) { EndReason::Signal } else { EndReason::Duration });
    w.report_windows(&state, &out, &opts);
    let Windows { recorder, analysis_s, reports, .. } = w;
    stop.store(true, Ordering::Relaxed);
    let costs = recorder.costs().clone();
    let _ = recorder.finish().join();
    for h in reports {
        let _ = h.join();
    }
    let s = state.lock().map_err(|_| anyhow::anyhow!("watch state poisoned"))?;
    crate::note!(
        "leaktrace: watch: done after {} window(s); {} report(s) in {}",
        s.windows,
        s.reports.len(),
        out.path().display()
    );
    crate::note!(
        "leaktrace: watch: its own time: eBPF load {:.2} s; {} process(es) attached in {:.2} s; polls and checkpoints {:.2} s; window cuts {:.2} s; analysis {:.2} s (CPU time of the watching thread)",
        costs.load_s,
        costs.attached,
        costs.attach_s,
        costs.polls_s,
        costs.cuts_s,
        analysis_s
    );
    Ok(())
}

/// The window loop's moving parts.
struct Windows {
    recorder: record::Recorder,
    follow: Follow,
    /// `--max-cpu`.
    budget: budget::CpuBudget,
    /// CPU time of the windows' analysis so far, seconds.
    analysis_s: f64,
    /// The growth-mode window of each process in an exact window, until that one ends.
    pending: HashMap<u32, Recording>,
    /// The exact windows' reports being written.
    reports: Vec<std::thread::JoinHandle<()>>,
}

impl Windows {
    /// The reports of the exact windows that ended, started.
    fn report_windows(&mut self, state: &Arc<Mutex<WatchState>>, out: &OutDir, opts: &WatchOptions) {
        let done = self.recorder.take_windows();
        if !done.is_empty() {
            self.reports.extend(window::report(done, &mut self.pending, state, out, opts));
        }
    }

    /// One window of `len` (or until `stop`): polled every [`POLL`] (the agent's CPU checked
    /// against `--max-cpu`; a process that ended judged at once, its OOM-time report written
    /// then), the selector rescanned every [`RESCAN`] (new processes join), then every
    /// process's recording cut and judged. Returns the processes due for escalation.
    fn one(
        &mut self,
        len: Duration,
        opts: &WatchOptions,
        state: &Arc<Mutex<WatchState>>,
        out: &OutDir,
        stop: &AtomicBool,
    ) -> HashMap<u32, Recording> {
        let end = Instant::now() + len;
        let mut rescanned = Instant::now();
        while self.recorder.run_for(POLL.min(end.saturating_duration_since(Instant::now())), stop)
            && Instant::now() < end
        {
            let over = self.budget.check(Instant::now(), budget::process_cpu_s());
            if let Ok(mut s) = state.lock() {
                s.cpu_over = over.map(|pct| (pct, self.budget.limit_pct()));
            }
            self.report_windows(state, out, opts);
            let (recordings, dropped) = self.recorder.take_ended();
            if !recordings.is_empty() {
                self.follow.ended(dropped);
                self.analysis_s += judge_timed(recordings, state, out, opts, &mut HashMap::new());
            }
            if rescanned.elapsed() >= RESCAN {
                self.follow.update(&mut self.recorder, &opts.selector, state, out);
                rescanned = Instant::now();
            }
        }
        let signal = stop.load(Ordering::Relaxed);
        let (recordings, dropped) = self.recorder.cut(if signal { EndReason::Signal } else { EndReason::Duration });
        self.follow.ended(dropped);
        let mut due = HashMap::new();
        self.analysis_s += judge_timed(recordings, state, out, opts, &mut due);
        due
    }
}

/// [`window::judge`] of `recordings`, the processes due for escalation put in `due`; returns
/// the CPU time it took, seconds.
fn judge_timed(
    recordings: Vec<Recording>,
    state: &Arc<Mutex<WatchState>>,
    out: &OutDir,
    opts: &WatchOptions,
    due: &mut HashMap<u32, Recording>,
) -> f64 {
    let began = record::thread_cpu_s();
    due.extend(window::judge(recordings, state, out, opts));
    record::thread_cpu_s() - began
}

/// How often the recorder looks at the watched processes (exits, mapping events, OOM victims).
/// Once a second: a process's exit is then seen within a second (its OOM kill at once, by the
/// tracepoint's event), and the polls cost a quarter of what 4 a second would.
const POLL: Duration = Duration::from_secs(1);

/// How often the selector is rescanned within a window (new processes join the window then).
const RESCAN: Duration = Duration::from_secs(5);

/// Which processes the recorder follows, and what was said about them (each thing once).
#[derive(Default)]
struct Follow {
    /// PIDs that could not be attached (said once; not tried again while selected).
    refused: BTreeSet<u32>,
    /// The last line said about an empty selection.
    said: String,
}

impl Follow {
    /// Rescan the selector: attach the new processes (one line each: "watching PID …"), stop
    /// recording those alive that left the selection (those that ended are dropped at the cut,
    /// with their window's recording).
    fn update(
        &mut self,
        recorder: &mut record::Recorder,
        selector: &Selector,
        state: &Mutex<WatchState>,
        out: &OutDir,
    ) {
        let recorded: BTreeSet<u32> = recorder.pids().into_iter().collect();
        let pids = rescan(selector, state, out, &recorded);
        let selected: BTreeSet<u32> = pids.iter().copied().collect();
        self.refused.retain(|p| selected.contains(p));
        let fresh: Vec<u32> =
            pids.iter().copied().filter(|p| !recorded.contains(p) && !self.refused.contains(p)).collect();
        for pid in fresh {
            match recorder.add(pid) {
                Ok(command) => crate::note!("leaktrace: watch: watching PID {pid} ({command})"),
                Err(e) => {
                    if crate::procinfo::alive(pid) {
                        crate::note!("leaktrace: watch: PID {pid} cannot be watched: {e:#}");
                    }
                    self.refused.insert(pid);
                }
            }
        }
        for pid in recorded.into_iter().filter(|p| !selected.contains(p) && crate::procinfo::alive(*p)) {
            recorder.remove(pid);
            crate::note!("leaktrace: watch: PID {pid} left {}; no longer watched", selector.describe());
        }
        if !pids.is_empty() {
            self.said.clear();
        }
    }

    /// Watched processes ended: one line each.
    fn ended(&mut self, dropped: Vec<record::Dropped>) {
        for d in dropped {
            crate::note!("leaktrace: watch: PID {} ended ({})", d.pid, d.ended.as_deref().unwrap_or("it exited"));
        }
    }

    /// Say `line` (prefixed `leaktrace: watch:`) unless it is what was said last.
    fn say_once(&mut self, line: String) {
        say_once(&mut self.said, line);
    }
}

/// Say `line` (prefixed `leaktrace: watch:`) unless it is what was said last.
fn say_once(said: &mut String, line: String) {
    if *said != line {
        crate::note!("leaktrace: watch: {line}");
        *said = line;
    }
}

/// The growth-mode recording options of one window of length `len`.
fn window_options(opts: &WatchOptions, len: Duration) -> RecordOptions {
    RecordOptions {
        duration: Some(len),
        interval: opts.interval,
        top: opts.top,
        process: record::ProcessOptions { mode: Mode::Growth, python_frames: true, ..Default::default() },
        status_line: false,
        limits: crate::probes::Limits { max_sites: opts.max_sites, ..Default::default() },
        ..RecordOptions::default()
    }
}

/// The selector's processes now; new ones enter the state with their labels, those no longer
/// selected are marked gone. One that vanished while not `recorded` (the recorder had not
/// attached it) while its memory cgroup's OOM-kill count rose gets its OOM-time report (without
/// a window's stacks: what grew since it was watched, its limit, its memory series); a recorded
/// one gets it with its window's stacks when the recorder sees it end.
fn rescan(selector: &Selector, state: &Mutex<WatchState>, out: &OutDir, recorded: &BTreeSet<u32>) -> Vec<u32> {
    let pids = selector.scan();
    let pods: std::collections::HashMap<u32, crate::pod::PodProcess> =
        crate::pod::pod_processes().into_iter().map(|p| (p.pid, p)).collect();
    let now = Instant::now();
    let Ok(mut s) = state.lock() else { return pids };
    let selected: BTreeSet<u32> = pids.iter().copied().collect();
    let mut oom_between = Vec::new();
    for (pid, p) in s.procs.iter_mut() {
        if !selected.contains(pid) && !p.gone {
            p.gone = true;
            p.last_seen = now;
            let rose = p
                .oom_events
                .as_ref()
                .is_some_and(|(f, base)| crate::record::ending::oom_kills(f).is_some_and(|n| n > *base));
            // One being recorded gets its report at the window's cut, with that window's stacks.
            if rose && !crate::procinfo::alive(*pid) && !p.oom_killed && !recorded.contains(pid) {
                p.oom_killed = true;
                oom_between.push((*pid, p.clone()));
            }
        }
    }
    for &pid in &pids {
        let p = s.procs.entry(pid).or_insert_with(|| new_proc(pid, pods.get(&pid), now));
        p.gone = false;
        p.last_seen = now;
    }
    s.oom_kills += oom_between.len() as u64;
    drop(s);
    for (pid, p) in oom_between {
        window::report_oom(pid, None, &p, out, state);
    }
    pids
}

/// A newly watched process: its labels (comm, and its pod's names from `pod`), its memory
/// cgroup's OOM-kill count now.
fn new_proc(pid: u32, pod: Option<&crate::pod::PodProcess>, now: Instant) -> Proc {
    let labels = Labels {
        comm: std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string(),
        pod: pod.and_then(|p| p.pod.clone()),
        namespace: pod.and_then(|p| p.namespace.clone()),
        container: pod.and_then(|p| p.container.clone()),
    };
    let mut p = Proc::new(labels, now);
    p.oom_events =
        crate::record::ending::memory_events_of(pid).and_then(|f| crate::record::ending::oom_kills(&f).map(|n| (f, n)));
    p
}

/// The labels a watched process's pushed profiles carry besides `--push-label` and `pid`: its
/// kubelet pod, namespace and container names (those known; none outside a pod), from the
/// watch's state.
pub(super) fn push_labels(state: Arc<Mutex<WatchState>>) -> crate::push::LabelsOf {
    Arc::new(move |pid| {
        let Ok(s) = state.lock() else { return Vec::new() };
        let Some(p) = s.procs.get(&pid) else { return Vec::new() };
        let l = &p.labels;
        [("pod", &l.pod), ("namespace", &l.namespace), ("container", &l.container)]
            .into_iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
            .collect()
    })
}

/// How often [`sample_memory`] samples each process.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// A thread that samples every watched process's memory once a second (the series of the
/// OOM-time report and the metrics' RSS gauges) until `stop`.
fn sample_memory(state: Arc<Mutex<WatchState>>, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let pids: Vec<u32> = match state.lock() {
                Ok(s) => s.procs.iter().filter(|(_, p)| !p.gone).map(|(pid, _)| *pid).collect(),
                Err(_) => return,
            };
            let now_ms = unix_ms();
            let samples: Vec<(u32, Option<Sample>)> = pids
                .into_iter()
                .map(|pid| {
                    // The recorder's checkpoint of this second read the same status file: its
                    // reading, at the time it was taken.
                    let m = crate::procinfo::memory_recent(pid, SAMPLE_EVERY).map(|(m, when)| Sample {
                        unix_ms: when.duration_since(std::time::UNIX_EPOCH).map_or(now_ms, |d| d.as_millis() as u64),
                        rss_anon: m.rss_anon_bytes,
                        rss_file: m.rss_file_bytes,
                        rss_shmem: m.rss_shmem_bytes,
                    });
                    (pid, m)
                })
                .collect();
            if let Ok(mut s) = state.lock() {
                for (pid, sample) in samples {
                    if let (Some(p), Some(sample)) = (s.procs.get_mut(&pid), sample) {
                        p.last_seen = Instant::now();
                        // A reading already sampled (no checkpoint since) is not sampled twice.
                        if p.series.back().is_none_or(|b| b.unix_ms < sample.unix_ms) {
                            p.push_sample(sample);
                        }
                    }
                }
            }
            std::thread::sleep(SAMPLE_EVERY);
        }
    });
}

/// SIGINT or SIGTERM sets `stop` (the window being recorded ends at once too: the recorder
/// listens for them as well).
fn stop_on_signals(stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        stop.store(true, Ordering::Relaxed);
    });
}

/// A new report directory `OUT/NAME/TIMESTAMP[SUFFIX]` (TIMESTAMP in UTC; suffixed -2, -3 …
/// when taken).
pub(crate) fn report_dir(out: &OutDir, name: &str, suffix: &str) -> anyhow::Result<OutDir> {
    anyhow::ensure!(
        name == state::safe_component(name),
        "report directory name {name:?} is not one safe path component: not written"
    );
    let path = out.path().join(name).join(format!("{}{suffix}", utc_stamp()));
    OutDir::create_named(&path)
}

/// Now, milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A UTC time for a directory name: `YYYYMMDDTHHMMSSZ`.
pub(crate) fn utc_stamp() -> String {
    let tm = leaktrace_analysis::output::calendar_now(true);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}
