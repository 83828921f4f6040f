//! The session loop's real tracer ([`Live`]): the eBPF [`Tracer`], /proc and the [`Traced`]
//! processes behind the loop's [`Tracing`] trait; what consumes the checkpoints (the status line,
//! periodic reachability scans, heap censuses, pushes) are its [`Sinks`] (`sink.rs`).

use std::time::{Duration, Instant};

use leaktrace_common::MapEvent;

use crate::probes::Tracer;
use crate::procinfo;
use leaktrace_analysis::recording::Checkpoint;

use super::session::{SessionState, Tracee, Tracing};
use super::sink::{SinkCx, Sinks};
use super::traced::{self, Traced};
use super::{RecordOptions, reachability};

/// How often a poll reads /proc/PID/maps for the symbolizer when no checkpoint has (intervals
/// over 1 s): new objects are known to it within this long.
const SYMBOLIZER_MAPS_EVERY: Duration = Duration::from_secs(2);

/// The real tracer of a session.
pub(super) struct Live {
    pub(super) tracer: Tracer,
    /// leaktrace launched the command: the processes it forks are a launched tree (their
    /// teardown watched, their execs held).
    pub(super) launched_tree: bool,
    /// A hold_execs failed (told once).
    pub(super) hold_failed: bool,
    /// What consumes the checkpoints (`sink.rs`): told at each checkpoint, at each periodic
    /// one, and interrupted before anything is said.
    pub(super) sinks: Sinks,
    /// The session's options (built once, by the command): its mode, work probe and
    /// allocator options for every process, forked children included; `reachability`: a
    /// launched command is also scanned at its exit.
    pub(super) opts: RecordOptions,
}

impl Live {
    /// The tracer of a session (`record`'s, or the long-lived [`super::Recorder`]'s) over
    /// `tracer`, under `opts`, told to `sinks`; `launched_tree`: leaktrace launched the command.
    pub(super) fn new(tracer: Tracer, launched_tree: bool, sinks: Sinks, opts: RecordOptions) -> Live {
        Live { tracer, launched_tree, hold_failed: false, sinks, opts }
    }
}

impl Tracee for Traced {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn launched(&self) -> bool {
        self.launched
    }

    fn work_attached(&self) -> bool {
        self.work_attached
    }

    fn state(&self) -> &SessionState {
        &self.session
    }

    fn state_mut(&mut self) -> &mut SessionState {
        &mut self.session
    }

    fn warn(&mut self, line: String) {
        self.warnings.push(line);
    }

    fn checkpoints(&self) -> &[Checkpoint] {
        &self.checkpoints
    }

    fn last_checkpoint_mut(&mut self) -> Option<&mut Checkpoint> {
        self.checkpoints.last_mut()
    }

    fn apply(&mut self, ev: &MapEvent) {
        self.space.apply(ev);
    }
}

impl Tracing for Live {
    type Proc = Traced;

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn events(&mut self) -> Vec<MapEvent> {
        self.tracer.flush_log();
        let mut out = Vec::new();
        self.tracer.drain_map_events(|ev| out.push(*ev));
        out
    }

    fn work_units(&self, pid: u32) -> u64 {
        self.tracer.work_units(pid)
    }

    fn is_process(&self, pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:")).map(|v| v.trim() == pid.to_string()))
            .unwrap_or(false)
    }

    fn follow(&mut self, child: u32) -> anyhow::Result<Option<Traced>> {
        // A child held at its exec has not loaded its libraries yet (see `exec_objects`).
        let Ok(objects) = super::targets::exec_objects(child) else { return Ok(None) };
        // The session's per-process options (what is asked once for the session is not
        // repeated for each child).
        let opts = self.opts.per_process();
        let exe = procinfo::exe(child);
        let kept = if self.launched_tree { objects.clone() } else { Vec::new() };
        let mut t = Traced::attach(&mut self.tracer, child, objects, procinfo::cmdline(child), exe, false, &opts)?;
        if self.launched_tree {
            t.in_launched_tree = true;
            t.place_teardown_probes(&mut self.tracer, &kept);
        }
        Ok(Some(t))
    }

    fn checkpoint(&mut self, t: &mut Traced, t_s: f64, batch: Option<u32>) -> Option<(u64, u64)> {
        t.checkpoint(&self.tracer, t_s, batch, self.opts.process.work_probe.is_some())
    }

    fn round(&mut self, begin: bool) {
        if begin {
            self.tracer.begin_round();
        } else {
            self.tracer.end_round();
        }
    }

    fn gone(&mut self, t: &mut Traced) -> bool {
        t.gone()
    }

    fn poll(&mut self, t: &mut Traced, polls: u64, t_s: f64) {
        t.watch_cgroup();
        if self.tracer.mappings_unavailable.is_some() {
            // No exec tracepoint: an exec shows as a new /proc/PID/exe (a program re-exec'ing
            // itself goes unnoticed this way).
            let id = traced::exe_identity(t.pid);
            if t.exe_id.is_none() {
                t.exe_id = id;
            } else if id.is_some() && id != t.exe_id {
                t.launch_exec_pending = false;
                t.on_exec(&mut self.tracer, &self.opts.process, t_s);
            }
        }
        // New objects for the symbolizer: each checkpoint feeds it the maps it reads (at the
        // default 1 s interval that is all); with longer intervals, maps are read for it every
        // SYMBOLIZER_MAPS_EVERY. Stacks with an address outside every known mapping read maps
        // anew when symbolized (StackSymbolizer::symbolize).
        t.symbolizer.refresh_if_older(SYMBOLIZER_MAPS_EVERY);
        t.runtime_tick();
        let units = t.checkpoints.last().and_then(|c| c.units_of_work);
        t.census.tick(t.pid, t.runtime.as_deref(), t_s, units);
        if t.exe_resolved && polls.is_multiple_of(5) && polls <= 100 {
            // A program maps its libraries and loads its extensions (dlopen) right after exec:
            // probe them, load their unwind tables, find the runtime and its Python frames twice
            // a second for 10 s, rather than at the periodic checkpoints only — until then
            // stacks through such a library are cut short (no unwind table) and lack Python
            // frames, and became a site of their own (a leak's first second called a "cache").
            // Later libraries are seen by the periodic rescan.
            self.rescan(t, t_s);
        }
    }

    fn exec(&mut self, t: &mut Traced, t_s: f64) {
        self.sinks.interrupt();
        t.on_exec(&mut self.tracer, &self.opts.process, t_s);
    }

    fn rescan(&mut self, t: &mut Traced, t_s: f64) {
        t.rescan(&mut self.tracer, &self.opts.process, t_s);
    }

    fn watch_teardown(&mut self, pid: u32, on: bool) {
        let _ = self.tracer.watch_teardown(pid, on);
    }

    fn wait_stopped(&self, pid: u32) {
        // SIGSTOP is delivered as the probe returns to user space: wait for it, briefly (a
        // checkpoint taken a little late only misses frees, never invents them).
        let deadline = Instant::now() + Duration::from_millis(500);
        while !procinfo::stopped(pid) && Instant::now() < deadline && procinfo::alive(pid) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn resume(&mut self, pid: u32) {
        // SAFETY: kill(2) with a PID of leaktrace's launched tree that the kernel side stopped;
        // a process already gone makes it fail (ESRCH).
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }

    fn at_teardown(&mut self, t: &mut Traced, t_s: f64) {
        // Where LeakSanitizer runs its check: the process is held at `exit`'s entry, nothing of
        // its teardown has run yet; the scan starts at each thread's stack pointer.
        // A followed child of a launched command is held at its `exit` too (in_launched_tree).
        let Some(o) = self.opts.reachability.filter(|_| t.launched || t.in_launched_tree) else { return };
        self.sinks.interrupt();
        let opts = crate::reach::ScanOptions { at_exit: true, ..o };
        t.reach_at_exit = reachability::scan_one(&self.tracer, t, self.opts.process.mode, opts, t_s);
    }

    fn hold_execs(&mut self, pid: u32, pass: u32, children: bool) {
        if let Err(e) = self.tracer.hold_execs(pid, pass, children)
            && !std::mem::replace(&mut self.hold_failed, true)
        {
            self.say(&format!(
                "warning: {e:#}: PID {pid}'s execs are not held (a program it execs runs unprobed until it is re-discovered)"
            ));
        }
    }

    fn release_execs(&mut self, pid: u32) {
        let _ = self.tracer.release_execs(pid);
    }

    fn hold_forks(&mut self, pid: u32, on: bool) {
        if let Err(e) = self.tracer.hold_forks(pid, on)
            && on
            && !std::mem::replace(&mut self.hold_failed, true)
        {
            self.say(&format!(
                "warning: {e:#}: PID {pid}'s children are not held at their fork (a child runs unprobed until the next poll)"
            ));
        }
    }

    fn say(&mut self, line: &str) {
        self.sinks.interrupt();
        crate::note!("leaktrace: {line}");
    }

    fn checkpoints_taken(&mut self, targets: &[Traced], taken: &[(usize, u64, u64)], t_s: f64) {
        self.sinks.taken(targets, taken, t_s);
    }

    fn periodic(&mut self, targets: &mut [Traced], n: u64, opts: &RecordOptions, start: Instant) {
        let cx = SinkCx { tracer: &self.tracer, mode: self.opts.process.mode, opts, start };
        self.sinks.periodic(&cx, targets, n);
    }
}
