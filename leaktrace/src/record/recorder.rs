//! A recorder that outlives its windows (`leaktrace watch`): the eBPF programs are
//! loaded once, processes are attached as a selector finds them and dropped when they end or
//! leave the selection, and each process's recording is cut per window — the same
//! [`Recording`] shape `record` makes, so the analysis of a window is `record`'s. What is costly
//! to make per process (its probes, unwind tables, symbolizer, runtime detection, Python frame
//! offsets) is kept from one window to the next and forgotten with the process.
//!
//! [`Recorder::start`] loads, [`Recorder::add`] attaches, [`Recorder::run_for`] polls (the same
//! session loop as `record`: exits, mapping events, a checkpoint every interval),
//! [`Recorder::cut`] hands back the window's recordings and starts the next window where this
//! one ended (no gap), [`Recorder::finish`] detaches everything.
//!
//! [`Recorder::escalate`] opens an exact window on one recorded process in the same session
//! (`escalate.rs`: its allocator probes attached for it alone, its mode switched in the
//! kernel's `TARGETS`); [`Recorder::run_for`] takes its checkpoints between its polls, closes
//! it when it is over, and [`Recorder::take_windows`] hands back its recording. Its growth-mode
//! windows go on meanwhile (its page faults are not counted during the exact window).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::live::Live;
use super::session::{Progress, Session, Tracee as _};
use super::sink::{PushSink, Sinks};
use super::traced::Traced;
use super::{RecordOptions, procinfo};
use crate::discover;
use crate::probes::{Mode, Tracer};
use leaktrace_analysis::recording::{EndReason, Recording};

/// Periodic checkpoints between two rescans of a process's objects (libraries it loaded since,
/// its runtime): every 10 s at `watch`'s default interval.
const RESCAN_EVERY: u64 = 10;

/// What the recorder spent, seconds of CPU time of the thread that runs it (user and system;
/// the wall time is longer on a loaded host), since it started: for the agent's own cost
/// figures (docs/benchmarks.md).
#[derive(Clone, Debug, Default)]
pub struct RecorderCosts {
    /// Loading the eBPF programs (once).
    pub load_s: f64,
    /// Attaching processes: objects listed, unwind tables built, runtime detected, probes placed.
    pub attach_s: f64,
    /// Processes attached.
    pub attached: u64,
    /// Polls of the session loop (checkpoints, exits, mapping events, rescans).
    pub polls_s: f64,
    /// Cutting windows (a last checkpoint of every process and the recordings).
    pub cuts_s: f64,
}

/// One process that stopped being recorded at a cut or by [`Recorder::remove`].
#[derive(Clone, Debug)]
pub struct Dropped {
    pub pid: u32,
    /// How it ended, when it did (exit, signal, OOM killer); None: it left the selection.
    pub ended: Option<String>,
}

/// An exact window running in the recorder's session ([`Recorder::escalate`]); its process's
/// exact-mode recording is in `session.beside` meanwhile.
struct ExactWindow {
    pid: u32,
    /// Where the process's probes stood before the window's ([`super::escalate::close_window`]).
    mark: crate::probes::ProcessMark,
    /// The window's options (`escalate::window_options`): exact mode, its checkpoint interval.
    opts: RecordOptions,
    /// Its first checkpoint (`t_s` = 0), and its Unix time, ms.
    start: Instant,
    started_unix_ms: u64,
    /// When its next checkpoint is due, and when it ends.
    next: Instant,
    end: Instant,
}

/// An exact window that ended ([`Recorder::take_windows`]).
pub struct WindowDone {
    pub pid: u32,
    /// Its recording, or why it could not be made.
    pub recording: anyhow::Result<Recording>,
}

/// The long-lived recorder (see the module's docs).
pub struct Recorder {
    session: Session<Live>,
    /// Exact windows running ([`Recorder::escalate`]).
    windows: Vec<ExactWindow>,
    /// Exact windows ended, not yet taken.
    done: Vec<WindowDone>,
    progress: Progress,
    opts: RecordOptions,
    /// Unix time of the session's time 0 (`t_s` = 0), ms.
    start_unix_ms: u64,
    /// Time between two polls.
    poll: Duration,
    costs: RecorderCosts,
}

impl Recorder {
    /// Load the eBPF programs for `opts.mode` (`opts.duration` is ignored: windows are cut by
    /// the caller). Nothing is attached yet. Errors: not root, the programs refused.
    pub fn start(opts: &RecordOptions, poll: Duration) -> anyhow::Result<Recorder> {
        crate::probes::check_privileges()?;
        let began = thread_cpu_s();
        // No work probe, census, end-of-exit scan or forked children here; windows and pushes
        // are the caller's.
        let process = super::ProcessOptions { work_probe: None, heap_census: false, ..opts.process.clone() };
        let opts = RecordOptions {
            process,
            duration: None,
            follow_forks: false,
            push: None,
            reachability: None,
            ..opts.clone()
        };
        let tracer = Tracer::load(opts.limits, opts.process.mode, opts.process.sample_bytes)?;
        let load_s = thread_cpu_s() - began;
        let host = Live::new(tracer, false, Sinks::default(), opts.clone());
        let mut session = Session {
            host,
            targets: Vec::new(),
            beside: Vec::new(),
            start: Instant::now(),
            work_probe: None,
            follow_forks: false,
            quiet_forks: true,
            rescan_every: RESCAN_EVERY,
        };
        let progress = session.begin(&opts);
        Ok(Recorder {
            session,
            windows: Vec::new(),
            done: Vec::new(),
            progress,
            opts,
            start_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            poll,
            costs: RecorderCosts { load_s, ..Default::default() },
        })
    }

    /// `--push` (`push.rs`): from now on, at the periodic checkpoint after each
    /// `cfg.interval`, every process's recording of its current window is pushed, with the
    /// labels `labels` gives for its PID; [`Recorder::finish`] waits for the last push.
    pub fn push_to(&mut self, cfg: crate::push::PushConfig, labels: crate::push::LabelsOf) {
        self.session.host.sinks.push(Box::new(PushSink::start(cfg, self.start_unix_ms, Some(labels))));
    }

    /// The PIDs being recorded now.
    pub fn pids(&self) -> Vec<u32> {
        self.session.targets.iter().map(|t| t.pid).collect()
    }

    /// What the recorder spent so far.
    pub fn costs(&self) -> &RecorderCosts {
        &self.costs
    }

    /// Attach to `pid` (a running process) and take its first checkpoint: its recording starts
    /// now, in the current window. Returns its command line (for the caller's one line saying
    /// it is watched). Errors: it cannot be traced (gone, a kernel thread, leaktrace itself), or
    /// its probes were refused.
    pub fn add(&mut self, pid: u32) -> anyhow::Result<String> {
        anyhow::ensure!(pid != std::process::id(), "PID {pid} is leaktrace itself");
        anyhow::ensure!(!self.session.targets.iter().any(|t| t.pid == pid), "PID {pid} is already recorded");
        let began = thread_cpu_s();
        discover::check_pid(pid)?;
        if self.opts.process.mode != Mode::Growth {
            crate::seccomp::check_target(pid, self.opts.process.allow_seccomp_risk)?;
        }
        let objects = discover::mapped_objects(pid)?;
        let command = procinfo::cmdline(pid);
        let line = super::command_line(&command);
        let tracer = &mut self.session.host.tracer;
        let mut t = Traced::attach(tracer, pid, objects, command, procinfo::exe(pid), false, &self.opts)?;
        let t_s = self.session.t_s();
        use super::session::Tracing as _;
        self.session.host.checkpoint(&mut t, t_s, None);
        self.session.targets.push(t);
        self.costs.attach_s += thread_cpu_s() - began;
        self.costs.attached += 1;
        Ok(line)
    }

    /// Stop recording `pid` now (it left the selection): no checkpoint of it is taken and what
    /// was kept of it goes, its probes included (its exact window, if one runs, ends with what
    /// it took). Nothing if it is not recorded.
    pub fn remove(&mut self, pid: u32) {
        if let Some(i) = self.windows.iter().position(|w| w.pid == pid) {
            let w = self.windows.swap_remove(i);
            self.close_window(w, EndReason::Signal);
        }
        if let Some(i) = self.session.targets.iter().position(|t| t.pid == pid) {
            let t = self.session.targets.swap_remove(i);
            self.forget(t);
        }
    }

    /// What the tracer keeps of a process no longer recorded goes (its Python frames are no
    /// longer read, its syscalls no longer noted, its uprobe links and `SITES` entries are
    /// released: `Tracer::release_process`), so that processes coming and going for days do not
    /// pile up links, descriptors and map entries.
    fn forget(&mut self, mut t: Traced) {
        // Its exact window, if one runs, ends first: its blocks are found by its sites.
        if let Some(i) = self.windows.iter().position(|w| w.pid == t.pid) {
            let w = self.windows.swap_remove(i);
            self.close_window(w, EndReason::TargetExited);
        }
        let tracer = &mut self.session.host.tracer;
        if let Some(rt) = t.runtime.as_mut() {
            rt.detach(tracer);
        }
        tracer.remove_target(t.pid);
    }

    /// Poll the session loop for `len` (or until `stop` is set): a checkpoint of every process
    /// each interval, exits noticed within a poll. Returns early, false, when `stop` was set.
    pub fn run_for(&mut self, len: Duration, stop: &AtomicBool) -> bool {
        let end = Instant::now() + len;
        loop {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            let now = Instant::now();
            if now >= end {
                return true;
            }
            self.sleep_serving_windows(now + self.poll.min(end - now));
            let began = thread_cpu_s();
            // Every process ended is no end here: the caller adds new ones.
            let _ = self.session.step(&self.opts, &mut self.progress);
            self.costs.polls_s += thread_cpu_s() - began;
        }
    }

    /// Open an exact window of `window` on `pid` (recorded here in growth mode) in this session,
    /// on the tracer already loaded (`escalate.rs`'s [`super::escalate::open_window`]): its first
    /// checkpoint is taken now, the next ones by [`Recorder::run_for`] (about 20 over the
    /// window); it ends after `window`, or when the process ends or is removed, or at
    /// [`Recorder::end_windows`]: its probes detached, the process back in growth mode, its
    /// recording handed back by [`Recorder::take_windows`]. Errors: `pid` is not recorded here
    /// or already in an exact window, or the window could not be opened (nothing of it is left
    /// attached then).
    pub fn escalate(&mut self, pid: u32, window: Duration) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.session.targets.iter().any(|t| t.pid == pid && t.session.end_reason.is_none()),
            "PID {pid} is not recorded"
        );
        anyhow::ensure!(!self.windows.iter().any(|w| w.pid == pid), "an exact window on PID {pid} is running");
        let began = thread_cpu_s();
        let opts = super::escalate::window_options(window, &self.opts, std::path::Path::new(""));
        let tracer = &mut self.session.host.tracer;
        let (mut t, mark) = super::escalate::open_window(tracer, pid, &opts)?;
        let start = Instant::now();
        t.checkpoint(tracer, 0.0, None, false);
        self.session.beside.push(t);
        let started_unix_ms = super::escalate::unix_ms_now();
        let (next, end) = (start + opts.interval, start + window);
        self.windows.push(ExactWindow { pid, mark, opts, start, started_unix_ms, next, end });
        self.costs.attach_s += thread_cpu_s() - began;
        Ok(())
    }

    /// The exact windows that ended since the last call.
    pub fn take_windows(&mut self) -> Vec<WindowDone> {
        std::mem::take(&mut self.done)
    }

    /// Exact windows running now.
    pub fn windows_running(&self) -> usize {
        self.windows.len()
    }

    /// End every exact window now (a last checkpoint each; `end_reason`: why), its recording
    /// handed back by [`Recorder::take_windows`].
    pub fn end_windows(&mut self, end_reason: EndReason) {
        for w in std::mem::take(&mut self.windows) {
            self.close_window(w, end_reason);
        }
    }

    /// Sleep until `until`, taking the exact windows' checkpoints when due and closing those
    /// that are over.
    fn sleep_serving_windows(&mut self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let due = self.windows.iter().map(|w| w.next.min(w.end)).min().map_or(until, |d| d.min(until));
            std::thread::sleep(due.saturating_duration_since(now));
            if !self.windows.is_empty() {
                let began = thread_cpu_s();
                self.serve_windows();
                self.costs.polls_s += thread_cpu_s() - began;
            }
        }
    }

    /// The exact windows' checkpoints due now; those over (their time up, their process ended or
    /// no longer recorded here) closed.
    fn serve_windows(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.windows.len() {
            let w = &mut self.windows[i];
            let pid = w.pid;
            let recorded = self.session.targets.iter().any(|t| t.pid == pid && t.session.end_reason.is_none());
            let t = self.session.beside.iter_mut().find(|t| t.pid == pid);
            let ended = match t.map(|t| (t.gone(), t)) {
                None | Some((true, _)) => Some(EndReason::TargetExited),
                Some(_) if !recorded => Some(EndReason::Signal),
                Some(_) if now >= w.end => Some(EndReason::Duration),
                Some((false, t)) => {
                    if now >= w.next {
                        t.checkpoint(&self.session.host.tracer, (now - w.start).as_secs_f64(), None, false);
                        w.next = (w.next + w.opts.interval).max(now);
                    }
                    None
                }
            };
            match ended {
                Some(end) => {
                    let w = self.windows.swap_remove(i);
                    self.close_window(w, end);
                }
                None => i += 1,
            }
        }
    }

    /// Close the exact window `w`: a last checkpoint of its process (its kernel maps still hold
    /// what it allocated, even when it has just exited); its probes detached, its blocks
    /// forgotten in the kernel's tables and, if it is still recorded, its mode back to growth;
    /// its recording (ended by `end_reason` unless it ended on its own) to
    /// [`Recorder::take_windows`].
    fn close_window(&mut self, w: ExactWindow, end_reason: EndReason) {
        let recorded = self.session.targets.iter().any(|t| t.pid == w.pid && t.session.end_reason.is_none());
        let Some(i) = self.session.beside.iter().position(|t| t.pid == w.pid) else { return };
        let mut t = self.session.beside.swap_remove(i);
        let tracer = &mut self.session.host.tracer;
        t.checkpoint(tracer, w.start.elapsed().as_secs_f64(), None, false);
        if end_reason == EndReason::TargetExited {
            t.session.end_reason = Some(EndReason::TargetExited);
        }
        let pid = w.pid;
        let closed = super::escalate::close_window(tracer, w.mark, recorded && procinfo::alive(pid));
        // Its blocks' records go from the kernel's tables (this tracer outlives the window).
        match tracer.forget_blocks(pid) {
            Ok(n) => log::info!("exact window on PID {pid}: {n} blocks forgotten in the kernel's tables"),
            Err(e) => t
                .warnings
                .push(format!("the exact window's blocks could not be forgotten in the kernel's tables: {e:#}")),
        }
        let recording = closed.and_then(|()| super::escalate::recording_of(t, end_reason, &w.opts, w.started_unix_ms));
        self.done.push(WindowDone { pid, recording });
    }

    /// End the window: a last checkpoint of every live process, then one recording per process
    /// of what was taken since the last cut (or since it was attached), `t_s` counted from the
    /// window's start, ending `end_reason` for those still running. The next window starts with
    /// that last checkpoint (whole, not sparse), so no time falls between two windows. Processes
    /// that ended are dropped (returned with how they ended).
    pub fn cut(&mut self, end_reason: EndReason) -> (Vec<Recording>, Vec<Dropped>) {
        let began = thread_cpu_s();
        self.session.checkpoint_all(None);
        let out = self.take(true, end_reason);
        self.costs.cuts_s += thread_cpu_s() - began;
        out
    }

    /// The recordings of the processes that ended since the last cut (their window ends there:
    /// an OOM-time report is written at once, not at the window's end), those processes
    /// dropped. Empty when none ended.
    pub fn take_ended(&mut self) -> (Vec<Recording>, Vec<Dropped>) {
        if !self.session.targets.iter().any(|t| t.state().end_reason.is_some()) {
            return (Vec::new(), Vec::new());
        }
        self.take(false, EndReason::TargetExited)
    }

    /// The window's recordings of every process (`all`) or of those that ended only; those
    /// that ended are dropped.
    fn take(&mut self, all: bool, end_reason: EndReason) -> (Vec<Recording>, Vec<Dropped>) {
        let (mut recordings, mut dropped) = (Vec::new(), Vec::new());
        for mut t in std::mem::take(&mut self.session.targets) {
            let ended = t.state().end_reason.is_some();
            if all || ended {
                recordings.push(window_recording(&mut t, &self.opts, end_reason, self.start_unix_ms));
            }
            if ended {
                dropped.push(Dropped { pid: t.pid, ended: t.ended.clone() });
                self.forget(t);
            } else {
                self.session.targets.push(t);
            }
        }
        (recordings, dropped)
    }

    /// Detach every probe and unload the programs (in the background; the handle waits for it),
    /// once the sinks are finished.
    pub fn finish(mut self) -> std::thread::JoinHandle<()> {
        self.session.release_teardowns();
        let Recorder { session, .. } = self;
        let Session { host: Live { tracer, mut sinks, .. }, .. } = session;
        // `--push`: the push under way finished (at most `push::FINAL_WAIT`).
        sinks.finish(&[]);
        std::thread::spawn(move || tracer.shutdown())
    }
}

/// The recording of `t`'s current window (its checkpoints since the last cut, rebased to start
/// at `t_s` = 0 and its blocks' birth times with them), the next window started with the last
/// checkpoint made whole. Stacks, probes and mappings are the process's so far (stack ids stay
/// the same from window to window); warnings are those noted in this window.
fn window_recording(t: &mut Traced, opts: &RecordOptions, end_reason: EndReason, start_unix_ms: u64) -> Recording {
    let mut checkpoints = std::mem::take(&mut t.checkpoints);
    if t.session.end_reason.is_none()
        && let Some(last) = checkpoints.last()
    {
        let mut first = last.clone();
        first.sites = t.last_samples.values().cloned().collect();
        first.sites.sort_by_key(|s| s.stack);
        first.batch = None;
        first.teardown = false;
        t.checkpoints.push(first);
    }
    let t0 = checkpoints.first().map_or(0.0, |c| c.t_s);
    let shift_ms = (t0 * 1000.0).round() as i64;
    for c in checkpoints.iter_mut() {
        c.t_s -= t0;
        for s in c.sites.iter_mut() {
            if let Some(b) = s.alloc_born_ms.as_mut() {
                *b = b.saturating_sub(s.alloc_count as i64 * shift_ms);
            }
            if let Some(b) = s.free_born_ms.as_mut() {
                *b = b.saturating_sub(s.free_count as i64 * shift_ms);
            }
        }
    }
    let mut rec = Recording {
        probes: t.probes.clone(),
        stacks: t.stacks.clone(),
        checkpoints,
        end_reason: t.session.end_reason.unwrap_or(end_reason),
        warnings: std::mem::take(&mut t.warnings),
        ..t.recording_head(opts, start_unix_ms + shift_ms.max(0) as u64)
    };
    leaktrace_analysis::merge::merge_identical_stacks(&mut rec);
    rec
}

/// CPU time of the calling thread so far, seconds (CLOCK_THREAD_CPUTIME_ID; 0 if unreadable).
pub fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which outlives the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}
