//! What `leaktrace watch` keeps of each watched process between windows, bounded: its labels,
//! the last window's verdict, how many windows in a row said "leak", its escalations, and the
//! last [`SERIES_SPAN`] of its memory series (one sample a second). A process that has gone is
//! forgotten [`FORGET_AFTER`] later (its OOM-time report, if any, is written by then).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// How much of a process's memory series is kept (the OOM-time report prints it).
pub const SERIES_SPAN: Duration = Duration::from_secs(300);

/// How long a process that has gone stays in the state (and its metrics on the endpoint).
pub const FORGET_AFTER: Duration = Duration::from_secs(120);

/// Where a process runs, for the metrics' labels and the report directory's name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    /// /proc/PID/comm.
    pub comm: String,
    /// Kubernetes pod, namespace and container names when the process is in a kubelet pod
    /// cgroup (`crate::pod`); None elsewhere.
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub container: Option<String>,
}

/// One sample of a process's memory (/proc/PID/status), bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Unix time of the sample, milliseconds.
    pub unix_ms: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub rss_shmem: u64,
}

/// The last window's analysis of a process, in brief.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowVerdict {
    /// The process class (`ProcessClass::as_str`: leak, cache, flat, fragmentation, ...), or
    /// "inconclusive" when the numbers could not tell.
    pub class: String,
    /// The verdict's sentence (report/verdict.rs).
    pub sentence: String,
    /// Steady-window slope of RssAnon, bytes per second (0 without memory figures).
    pub growth_bytes_per_s: f64,
    /// Events lost in the window (the analysis' `drops_total`).
    pub lost_events: u64,
}

/// Stacks kept per process in [`Proc::grown`], at most.
pub const GROWN_STACKS: usize = 20;

/// A stack's growth summed over the windows since a process was first watched: growth mode's
/// pages first touched under it (each window's `growth_bytes` when positive), bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct GrownStack {
    /// The site's culprit function.
    pub function: String,
    /// Its frames' functions, innermost first (at most 12).
    pub stack: Vec<String>,
    pub bytes: u64,
}

/// An escalation's outcome, kept for the OOM-time report.
#[derive(Clone, Debug, PartialEq)]
pub struct EscalationSummary {
    /// Its report directory.
    pub dir: std::path::PathBuf,
    /// The verdict's sentence (leading with the exact window's).
    pub sentence: String,
    /// The exact window's sites with live bytes, most first: (function, live bytes, growth in
    /// bytes per second), at most `--top`.
    pub sites: Vec<(String, u64, f64)>,
}

/// One watched process.
#[derive(Clone, Debug)]
pub struct Proc {
    pub labels: Labels,
    /// The last window's verdict; None before the first window that traced it ended.
    pub verdict: Option<WindowVerdict>,
    /// Windows in a row whose verdict was a conclusive leak.
    pub leak_streak: u32,
    /// Exact windows taken on it (escalations), started ones included.
    pub escalations: u32,
    /// When its last escalation started.
    pub last_escalation: Option<Instant>,
    /// Its last escalation's report, once written.
    pub last_escalation_report: Option<EscalationSummary>,
    /// The OOM killer took it (oom:mark_victim, or its cgroup's oom_kill counter).
    pub oom_killed: bool,
    /// Its memory, one sample a second, the last [`SERIES_SPAN`].
    pub series: VecDeque<Sample>,
    /// When it was last seen alive (selected by a rescan, or sampled).
    pub last_seen: Instant,
    /// It has gone (exited or killed).
    pub gone: bool,
    /// What grew since it was first watched, by stack, most first (at most [`GROWN_STACKS`]).
    pub grown: Vec<GrownStack>,
    /// Its memory cgroup's OOM-kill counter file and the count when it was first watched
    /// (`record::ending::memory_events_of`): a process that vanishes between two windows while
    /// the count rose was most likely taken by the OOM killer. None without a memory cgroup.
    pub oom_events: Option<(std::path::PathBuf, u64)>,
}

impl Proc {
    pub fn new(labels: Labels, now: Instant) -> Proc {
        Proc {
            labels,
            verdict: None,
            leak_streak: 0,
            escalations: 0,
            last_escalation: None,
            last_escalation_report: None,
            oom_killed: false,
            series: VecDeque::new(),
            last_seen: now,
            gone: false,
            grown: Vec::new(),
            oom_events: None,
        }
    }

    /// Add a window's growth by stack to [`Proc::grown`] (the same stack's bytes summed), keeping
    /// the [`GROWN_STACKS`] largest.
    pub fn add_growth(&mut self, window: Vec<GrownStack>) {
        for g in window {
            match self.grown.iter_mut().find(|x| x.stack == g.stack && x.function == g.function) {
                Some(x) => x.bytes += g.bytes,
                None => self.grown.push(g),
            }
        }
        self.grown.sort_by_key(|g| std::cmp::Reverse(g.bytes));
        self.grown.truncate(GROWN_STACKS);
    }

    /// Add a memory sample, dropping those older than [`SERIES_SPAN`] before it.
    pub fn push_sample(&mut self, s: Sample) {
        let span_ms = SERIES_SPAN.as_millis() as u64;
        while self.series.front().is_some_and(|f| f.unix_ms + span_ms < s.unix_ms) {
            self.series.pop_front();
        }
        self.series.push_back(s);
    }

    /// Record a window's verdict: the leak streak grows on a conclusive leak, else restarts.
    pub fn set_verdict(&mut self, v: WindowVerdict) {
        self.leak_streak = if v.class == "leak" { self.leak_streak + 1 } else { 0 };
        self.verdict = Some(v);
    }

    /// The name of its report directory under --out: `NAMESPACE_POD` for a pod's process (with
    /// `_CONTAINER` when known), else `pid-PID`. The names come from the process (its HOSTNAME,
    /// its root's files), so they are made one safe path component ([`safe_component`]): no
    /// `/`, no `..`, no leading dot, at most 200 bytes.
    pub fn dir_name(&self, pid: u32) -> String {
        match (&self.labels.pod, &self.labels.namespace) {
            (Some(p), ns) => {
                let mut n = match ns {
                    Some(ns) => format!("{ns}_{p}"),
                    None => p.clone(),
                };
                if let Some(c) = &self.labels.container {
                    n.push('_');
                    n.push_str(c);
                }
                safe_component(&n)
            }
            (None, _) => format!("pid-{pid}"),
        }
    }
}

/// `name` as one directory name that cannot leave the directory it is made in: every byte but
/// ASCII letters, digits, `-`, `_` and `.` becomes `_`, a leading `.` becomes `_` (so neither
/// `.`, `..` nor a hidden name), empty becomes `_`, and it is cut to 200 bytes.
pub fn safe_component(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .take(200)
        .collect();
    if s.starts_with('.') || s.is_empty() {
        s.replace_range(..s.len().min(1), "_");
    }
    s
}

/// The escalation rules (`watch --escalate-after`, `--max-escalations`, `--cooldown`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EscalationPolicy {
    /// Windows in a row with a leak verdict before a process is escalated.
    pub after_windows: u32,
    /// Exact windows running at once, at most.
    pub max_concurrent: usize,
    /// No process is escalated twice within this long (from the start of its last one).
    pub cooldown: Duration,
    /// Length of the exact window; None: never escalate (`--no-escalate`).
    pub window: Option<Duration>,
}

/// Everything `watch` knows, shared by the window loop, the sampler and the metrics endpoint.
#[derive(Debug, Default)]
pub struct WatchState {
    pub procs: BTreeMap<u32, Proc>,
    /// Exact windows running now.
    pub escalating: usize,
    /// Growth-mode windows completed.
    pub windows: u64,
    /// OOM kills of watched processes seen.
    pub oom_kills: u64,
    /// Report directories written (escalations and OOM-time reports), for the log.
    pub reports: Vec<std::path::PathBuf>,
    /// The agent's CPU use over the last minute and `--max-cpu` (percent of one core) while
    /// the use is above the limit (`budget.rs`): no escalation starts then.
    pub cpu_over: Option<(f64, f64)>,
    /// Escalations refused for `--max-cpu` (a process due in several windows counts each time).
    pub escalations_refused: u64,
}

impl WatchState {
    /// The processes to escalate now, by the policy, fastest-growing first, as many as the
    /// free escalation slots allow. They are not marked; [`WatchState::start_escalation`] does.
    pub fn due_escalations(&self, policy: &EscalationPolicy, now: Instant) -> Vec<u32> {
        if policy.window.is_none() {
            return Vec::new();
        }
        let mut due: Vec<(u32, f64)> = self
            .procs
            .iter()
            .filter(|(_, p)| !p.gone && p.leak_streak >= policy.after_windows.max(1))
            .filter(|(_, p)| p.last_escalation.is_none_or(|t| now.duration_since(t) >= policy.cooldown))
            .map(|(pid, p)| (*pid, p.verdict.as_ref().map_or(0.0, |v| v.growth_bytes_per_s)))
            .collect();
        due.sort_by(|a, b| b.1.total_cmp(&a.1));
        due.truncate(policy.max_concurrent.saturating_sub(self.escalating));
        due.into_iter().map(|(pid, _)| pid).collect()
    }

    /// Count an escalation of `pid` as started now.
    pub fn start_escalation(&mut self, pid: u32, now: Instant) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.escalations += 1;
            p.last_escalation = Some(now);
            p.leak_streak = 0;
        }
        self.escalating += 1;
    }

    /// Forget the processes gone for longer than [`FORGET_AFTER`].
    pub fn forget_gone(&mut self, now: Instant) {
        self.procs.retain(|_, p| !p.gone || now.duration_since(p.last_seen) < FORGET_AFTER);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leak(rate: f64) -> WindowVerdict {
        WindowVerdict { class: "leak".into(), sentence: String::new(), growth_bytes_per_s: rate, lost_events: 0 }
    }

    #[test]
    fn escalation_needs_a_streak_a_free_slot_and_the_cooldown() {
        let t0 = Instant::now();
        let policy = EscalationPolicy {
            after_windows: 2,
            max_concurrent: 1,
            cooldown: Duration::from_secs(600),
            window: Some(Duration::from_secs(10)),
        };
        let mut s = WatchState::default();
        for (pid, rate) in [(10, 1e3), (20, 5e5)] {
            let mut p = Proc::new(Labels::default(), t0);
            p.set_verdict(leak(rate));
            s.procs.insert(pid, p);
        }
        assert!(s.due_escalations(&policy, t0).is_empty(), "one leak window is not a streak");
        for p in s.procs.values_mut() {
            p.set_verdict(leak(p.verdict.as_ref().unwrap().growth_bytes_per_s));
        }
        assert_eq!(s.due_escalations(&policy, t0), vec![20], "the fastest first, one slot");
        s.start_escalation(20, t0);
        assert!(s.due_escalations(&policy, t0).is_empty(), "no free slot");
        s.escalating = 0;
        assert_eq!(s.due_escalations(&policy, t0), vec![10]);
        for _ in 0..2 {
            let p = s.procs.get_mut(&20).unwrap();
            p.set_verdict(leak(5e5));
        }
        assert!(!s.due_escalations(&policy, t0 + Duration::from_secs(60)).contains(&20), "cool-down");
        assert!(s.due_escalations(&policy, t0 + Duration::from_secs(601)).contains(&20));
        let flat = WindowVerdict { class: "flat".into(), ..leak(0.0) };
        s.procs.get_mut(&10).unwrap().set_verdict(flat);
        assert_eq!(s.procs[&10].leak_streak, 0, "a flat window ends the streak");
        let never = EscalationPolicy { window: None, ..policy };
        assert!(s.due_escalations(&never, t0 + Duration::from_secs(601)).is_empty());
    }

    #[test]
    fn the_series_keeps_its_span_and_gone_processes_are_forgotten() {
        let t0 = Instant::now();
        let mut p = Proc::new(Labels::default(), t0);
        for i in 0..1000u64 {
            p.push_sample(Sample { unix_ms: i * 1000, rss_anon: i, rss_file: 0, rss_shmem: 0 });
        }
        assert_eq!(p.series.len(), SERIES_SPAN.as_secs() as usize + 1);
        assert_eq!(p.series.front().unwrap().unix_ms, (999 - SERIES_SPAN.as_secs()) * 1000);
        let mut s = WatchState::default();
        p.gone = true;
        s.procs.insert(1, p);
        s.forget_gone(t0 + FORGET_AFTER / 2);
        assert_eq!(s.procs.len(), 1);
        s.forget_gone(t0 + FORGET_AFTER);
        assert!(s.procs.is_empty());
    }

    #[test]
    fn growth_by_stack_is_summed_over_windows_and_bounded() {
        let mut p = Proc::new(Labels::default(), Instant::now());
        let g = |f: &str, bytes| GrownStack { function: f.into(), stack: vec![f.into(), "main".into()], bytes };
        p.add_growth(vec![g("leak", 5 << 20), g("other", 1 << 20)]);
        p.add_growth(vec![g("leak", 5 << 20)]);
        assert_eq!(p.grown[0], g("leak", 10 << 20));
        p.add_growth((0..100).map(|i| g(&format!("f{i}"), 2 << 20)).collect());
        assert_eq!(p.grown.len(), GROWN_STACKS);
        assert_eq!(p.grown[0].function, "leak");
        assert!(!p.grown.iter().any(|x| x.function == "other"), "the smallest are dropped");
    }

    #[test]
    fn report_directories_are_named_by_pod_or_pid() {
        let mut p = Proc::new(Labels::default(), Instant::now());
        assert_eq!(p.dir_name(42), "pid-42");
        p.labels.pod = Some("web-1".into());
        p.labels.namespace = Some("shop".into());
        p.labels.container = Some("app".into());
        assert_eq!(p.dir_name(42), "shop_web-1_app");
    }

    /// Names a process chooses (its HOSTNAME as the pod name) never climb out of --out.
    #[test]
    fn report_directory_names_stay_one_component() {
        let mut p = Proc::new(Labels::default(), Instant::now());
        for (pod, want) in [("..", "_."), (".", "_"), ("../../etc", "_._.._etc"), ("a/b\0c", "a_b_c"), ("", "_")] {
            p.labels.pod = Some(pod.into());
            let n = p.dir_name(7);
            assert_eq!(n, want, "{pod:?}");
            assert!(!n.contains('/') && n != "." && n != ".." && !n.starts_with('.'));
        }
        p.labels.pod = Some("x".repeat(5000));
        assert_eq!(p.dir_name(7).len(), 200);
    }
}
