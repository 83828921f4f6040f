//! The session loop: polls every traced process every 100 ms (exit, ring buffer, new mappings,
//! forks), takes the checkpoints (periodic, and `check`'s batches) and decides when the recording
//! ends.

use std::time::{Duration, Instant};

use crate::discover::{self, WorkProbeSpec};
use crate::probes::{Mode, Tracer};
use crate::procinfo;
use crate::recording::EndReason;

use super::*;

pub(super) struct Session {
    pub(super) tracer: Tracer,
    pub(super) targets: Vec<Traced>,
    pub(super) start: Instant,
    /// The live status line (issue #12, status.rs).
    pub(super) status: crate::status::Status,
    /// `--push`: the push worker (issue #12).
    pub(super) push: Option<crate::push::Pusher>,
    pub(super) mode: Mode,
    pub(super) work_probe: Option<WorkProbeSpec>,
    pub(super) follow_forks: bool,
    pub(super) pymalloc: bool,
    /// `RecordOptions::python_frames`, for forked children.
    pub(super) python_frames: bool,
    /// `RecordOptions::jvm_perf_map`, for forked children.
    pub(super) jvm_perf_map: bool,
}

/// Where the current batch of `leaktrace check` ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BatchMark {
    /// At this instant.
    Time(Instant),
    /// When the work probe has counted this many calls since attach.
    Units(u64),
}

/// The batch schedule of `leaktrace check` (first target only): the warm-up closes batch 0 (the
/// baseline), then `count` batches of `size` follow, each starting where the previous one's
/// checkpoint measured.
#[derive(Clone, Copy, Debug)]
pub(super) struct BatchPlan {
    /// Batches after the baseline.
    pub(super) count: u32,
    pub(super) size: BatchSize,
    /// The batch that closes next (0: the baseline).
    pub(super) next: u32,
    /// Where it closes.
    pub(super) mark: BatchMark,
}

impl BatchPlan {
    /// The plan at the start of the session: the baseline closes `warmup` after `start`.
    pub(super) fn new(start: Instant, warmup: Duration, count: u32, size: BatchSize) -> BatchPlan {
        BatchPlan { count, size, next: 0, mark: BatchMark::Time(start + warmup) }
    }

    /// Whether the current batch is done at `now`; `units` (the work probe's count so far) is
    /// read only for a batch of units.
    pub(super) fn due(&self, now: Instant, units: impl FnOnce() -> u64) -> bool {
        match self.mark {
            BatchMark::Time(t) => now >= t,
            BatchMark::Units(u) => units() >= u,
        }
    }

    /// The current batch ([`BatchPlan::next`]) is the last: once it closes, the test ends.
    pub(super) fn finished(&self) -> bool {
        self.next >= self.count
    }

    /// Move on after the current batch closed at `now`: the next one ends `size` later, counted
    /// from `now` or from `units_at_close` (the units the closing checkpoint measured).
    pub(super) fn advance(&mut self, now: Instant, units_at_close: impl FnOnce() -> u64) {
        self.mark = match self.size {
            BatchSize::Seconds(d) => BatchMark::Time(now + d),
            BatchSize::Units(k) => BatchMark::Units(units_at_close() + k),
        };
        self.next += 1;
    }
}

/// Seconds after which a work probe that could not be placed is reported (a launched command
/// loads its libraries first).
pub(super) const WORK_PROBE_GRACE_S: f64 = 2.0;

/// How often the loop looks at the targets (exit, new mappings, forks) between checkpoints.
pub(super) const POLL: Duration = Duration::from_millis(100);

impl Session {
    pub(super) async fn run(&mut self, opts: &RecordOptions) -> EndReason {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigint = signal(SignalKind::interrupt()).ok();
        let mut sigterm = signal(SignalKind::terminate()).ok();
        let mut sighup = signal(SignalKind::hangup()).ok();
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        // Time 0 is the first checkpoint, taken now that every probe is in place (attaching can
        // take seconds); --duration counts from here too.
        self.start = Instant::now();
        self.checkpoint_all(None);
        let mut next = Instant::now() + opts.interval;
        let deadline = opts.duration.map(|d| self.start + d);
        let mut batch: Option<BatchPlan> = match &opts.schedule {
            Schedule::Periodic => None,
            Schedule::Batches { warmup, count, size } => Some(BatchPlan::new(self.start, *warmup, *count, *size)),
        };
        // Batches counted in units of work end at a call count: look more often, so a batch
        // overshoots by few calls.
        let poll = match opts.schedule {
            Schedule::Batches { size: BatchSize::Units(_), .. } => POLL / 5,
            _ => POLL,
        };
        let mut polls: u64 = 0;
        // Periodic checkpoints taken (not the first, nor batch checkpoints).
        let mut periodic: u64 = 0;
        let mut work_missing_told = false;
        loop {
            polls += 1;
            tokio::select! {
                _ = recv(&mut sigint) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = recv(&mut sigterm) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = recv(&mut sighup) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = tokio::time::sleep(poll) => {}
            }
            self.drain_events();
            self.take_teardowns();
            let t_s = self.start.elapsed().as_secs_f64();
            for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
                if t.gone() {
                    // Its maps still hold everything it allocated: one last checkpoint.
                    t.checkpoint(&self.tracer, t_s, None, self.work_probe.is_some());
                    t.end_reason = Some(EndReason::TargetExited);
                } else {
                    t.watch_cgroup();
                    if self.tracer.mappings_unavailable.is_some() {
                        // No exec tracepoint: an exec shows as a new /proc/PID/exe (a program
                        // re-exec'ing itself goes unnoticed this way).
                        let id = traced::exe_identity(t.pid);
                        if t.exe_id.is_none() {
                            t.exe_id = id;
                        } else if id.is_some() && id != t.exe_id {
                            t.launch_exec_pending = false;
                            t.on_exec(&mut self.tracer, self.mode, self.pymalloc, self.work_probe.as_ref(), t_s);
                        }
                    }
                    t.symbolizer.refresh();
                    t.jvm_tick();
                    if t.runtime.is_none() && t.exe_resolved && polls.is_multiple_of(5) && polls <= 100 {
                        // A launched runtime maps its libraries right after exec: detect it
                        // early (twice a second, for 10 s) rather than at the first periodic
                        // checkpoint only; later libraries are seen by the periodic rescan.
                        if let Ok(objects) = discover::mapped_objects(t.pid) {
                            t.detect_runtime(&objects);
                        }
                    }
                }
            }
            if self.targets.iter().all(|t| t.end_reason.is_some()) {
                return EndReason::TargetExited;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.checkpoint_all(None);
                return EndReason::Duration;
            }
            if let Some(plan) = batch.as_mut() {
                let first = self.targets[0].pid;
                if plan.due(now, || self.tracer.work_units(first)) {
                    let (n, count) = (plan.next, plan.count);
                    self.checkpoint_all(Some(n));
                    self.clear_status();
                    eprintln!(
                        "leaktrace: {} at {:.1}s",
                        if n == 0 {
                            "warm-up done, baseline taken".to_string()
                        } else {
                            format!("batch {n}/{count} done")
                        },
                        self.start.elapsed().as_secs_f64()
                    );
                    if plan.finished() {
                        return EndReason::BatchesDone;
                    }
                    // The next batch starts where the checkpoint just taken measured, not after it
                    // (symbolizing new stacks can take a while).
                    let cp = self.targets[0].checkpoints.last();
                    plan.advance(now, || {
                        cp.and_then(|c| c.units_of_work).unwrap_or_else(|| self.tracer.work_units(first))
                    });
                    next = now + opts.interval;
                    continue;
                }
            }
            if now >= next {
                let t_s = self.start.elapsed().as_secs_f64();
                for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
                    t.rescan(&mut self.tracer, self.mode, self.pymalloc, self.work_probe.as_ref(), t_s);
                }
                // A work probe that cannot be placed once the command has loaded its libraries
                // is a mistake to report, not to wait on: `check` by units would never end.
                if let (Some(spec), false) = (&self.work_probe, self.targets[0].work_attached)
                    && t_s >= WORK_PROBE_GRACE_S
                    && !work_missing_told
                {
                    work_missing_told = true;
                    self.clear_status();
                    eprintln!(
                        "leaktrace: warning: --work-probe {spec}: no function `{}` in the objects PID {} maps after {t_s:.0} s",
                        spec.symbol, self.targets[0].pid
                    );
                    if matches!(opts.schedule, Schedule::Batches { size: BatchSize::Units(_), .. }) {
                        self.checkpoint_all(None);
                        return EndReason::WorkProbeMissing;
                    }
                }
                self.checkpoint_all(None);
                periodic += 1;
                // Reachability hook (#14): a scan at every Nth periodic checkpoint.
                if let Some(o) = opts.reachability
                    && o.every.is_some_and(|n| periodic.is_multiple_of(u64::from(n)))
                {
                    self.clear_status();
                    let mut scans =
                        super::reachability::scan_all(&self.tracer, &mut self.targets, self.mode, o, self.start);
                    for t in self.targets.iter_mut() {
                        if let Some(r) = scans.remove(&t.pid) {
                            t.reach_scans.push(r);
                        }
                    }
                }
                next += opts.interval;
                if next < now {
                    next = now + opts.interval;
                }
                // Hook (issue #12, push): a periodic push, handed to the push thread.
                if self.push.as_ref().is_some_and(crate::push::Pusher::due) {
                    let targets = &mut self.targets;
                    if let Some(p) = self.push.as_mut() {
                        let started = p.started_unix_ms();
                        p.tick(|| targets.iter_mut().map(|t| t.snapshot(opts, started)).collect());
                    }
                }
            }
        }
    }

    /// Apply queued mapping events to their process; with --follow-forks, attach to new children
    /// of traced processes.
    pub(super) fn drain_events(&mut self) {
        self.tracer.flush_log();
        let mut forks = Vec::new();
        let mut execs = Vec::new();
        let targets = &mut self.targets;
        self.tracer.drain_map_events(|ev| {
            if ev.kind == leaktrace_common::map_event::FORK {
                forks.push((ev.tgid, ev.addr as u32));
                return;
            }
            if ev.kind == leaktrace_common::map_event::EXEC {
                execs.push(ev.tgid);
                return;
            }
            if ev.kind == leaktrace_common::map_event::TEARDOWN {
                if let Some(t) = targets.iter_mut().find(|t| t.pid == ev.tgid) {
                    t.teardown_watched = false;
                    t.teardown_pending = true;
                }
                return;
            }
            if let Some(t) = targets.iter_mut().find(|t| t.pid == ev.tgid && t.end_reason.is_none()) {
                t.space.apply(ev);
            }
        });
        // An exec replaced a traced process's image (issue #15): note it and re-discover.
        let t_s = self.start.elapsed().as_secs_f64();
        for tgid in execs {
            if let Some(t) = self.targets.iter_mut().find(|t| t.pid == tgid && t.end_reason.is_none()) {
                self.status.clear();
                t.on_exec(&mut self.tracer, self.mode, self.pymalloc, self.work_probe.as_ref(), t_s);
            }
        }
        for (parent, child) in forks {
            // sched_process_fork also fires for new threads: keep new processes only.
            let is_process = std::fs::read_to_string(format!("/proc/{child}/status"))
                .ok()
                .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:")).map(|v| v.trim() == child.to_string()))
                .unwrap_or(false);
            if !is_process || self.targets.iter().any(|t| t.pid == child) {
                continue;
            }
            if !self.follow_forks {
                // A wrapper script or a forking server: say plainly that the children are not traced.
                if let Some(p) = self.targets.iter_mut().find(|t| t.pid == parent) {
                    p.untraced_children += 1;
                    if p.untraced_children == 1 {
                        self.clear_status();
                        eprintln!(
                            "leaktrace: warning: PID {parent} forked PID {child}, which is not traced (add --follow-forks to trace children)"
                        );
                    }
                }
                continue;
            }
            let Ok(objects) = discover::mapped_objects(child) else { continue };
            let opts = RecordOptions {
                work_probe: self.work_probe.clone(),
                mode: self.mode,
                pymalloc: self.pymalloc,
                python_frames: self.python_frames,
                jvm_perf_map: self.jvm_perf_map,
                ..RecordOptions::default()
            };
            match Traced::attach(
                &mut self.tracer,
                child,
                objects,
                procinfo::cmdline(child),
                procinfo::exe(child),
                false,
                &opts,
            ) {
                Ok(mut t) => {
                    let t_s = self.start.elapsed().as_secs_f64();
                    t.warnings.push(format!("forked by PID {parent}; traced from t={t_s:.1}s"));
                    self.clear_status();
                    eprintln!("leaktrace: following PID {child}, forked by PID {parent}");
                    t.checkpoint(&self.tracer, t_s, None, self.work_probe.is_some());
                    self.targets.push(t);
                }
                Err(e) => {
                    if let Some(p) = self.targets.iter_mut().find(|t| t.pid == parent) {
                        p.warnings.push(format!("could not follow child PID {child}: {e:#}"));
                    }
                }
            }
        }
    }

    /// Launched commands that began their teardown (the kernel side stopped them at `exit` or
    /// `Py_FinalizeEx`): wait until the stop has taken effect, take the teardown checkpoint (what
    /// was live before the teardown's frees), and let them continue.
    pub(super) fn take_teardowns(&mut self) {
        let t_s = self.start.elapsed().as_secs_f64();
        let work = self.work_probe.is_some();
        for t in self.targets.iter_mut().filter(|t| t.teardown_pending) {
            t.teardown_pending = false;
            // SIGSTOP is delivered as the probe returns to user space: wait for it, briefly (a
            // checkpoint taken a little late only misses frees, never invents them).
            let deadline = Instant::now() + Duration::from_millis(500);
            while !procinfo::stopped(t.pid) && Instant::now() < deadline && procinfo::alive(t.pid) {
                std::thread::sleep(Duration::from_millis(2));
            }
            if t.end_reason.is_none()
                && t.checkpoint(&self.tracer, t_s, None, work).is_some()
                && let Some(c) = t.checkpoints.last_mut()
            {
                c.teardown = true;
            }
            resume(t.pid);
        }
    }

    /// At the end of the session: stop watching every teardown and let any process held at its
    /// teardown go on (a launched command is then stopped or waited for as before).
    pub(super) fn release_teardowns(&mut self) {
        for t in self.targets.iter_mut() {
            if t.teardown_watched {
                let _ = self.tracer.watch_teardown(t.pid, false);
                t.teardown_watched = false;
            }
        }
        // A stop queued just before the watch ended still comes through as an event.
        self.drain_events();
        for t in self.targets.iter_mut().filter(|t| t.launched) {
            t.teardown_pending = false;
            if t.end_reason.is_none() {
                resume(t.pid);
            }
        }
    }

    pub(super) fn checkpoint_all(&mut self, batch: Option<u32>) {
        self.drain_events();
        let t_s = self.start.elapsed().as_secs_f64();
        let mut taken: Vec<(usize, u64, u64)> = Vec::new();
        for (i, t) in self.targets.iter_mut().enumerate().filter(|(_, t)| t.end_reason.is_none()) {
            if let Some((l, r)) = t.checkpoint(&self.tracer, t_s, batch, self.work_probe.is_some()) {
                taken.push((i, l, r));
            }
        }
        // Hook (issue #12, status line): what each process shows, drawn by status.rs.
        let procs: Vec<crate::status::ProcessStatus<'_>> = taken
            .iter()
            .map(|&(i, live_bytes, rss_bytes)| {
                let t = &self.targets[i];
                crate::status::ProcessStatus {
                    pid: t.pid,
                    live_bytes,
                    rss_bytes,
                    stacks: &t.stacks,
                    last_samples: &t.last_samples,
                    first: t.checkpoints.first(),
                    latest: t.checkpoints.last(),
                }
            })
            .collect();
        self.status.update(t_s, &procs);
    }

    pub(super) fn clear_status(&self) {
        self.status.clear();
    }
}

/// Send SIGCONT to `pid` (a launched command held at its teardown).
fn resume(pid: u32) {
    // SAFETY: kill(2) with a PID leaktrace launched; a process already gone makes it fail (ESRCH).
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_of_units_start_where_the_last_checkpoint_measured() {
        let start = Instant::now();
        let mut plan = BatchPlan::new(start, Duration::from_secs(5), 2, BatchSize::Units(1000));
        assert_eq!(plan.next, 0);
        assert!(!plan.due(start + Duration::from_secs(4), || unreachable!("the warm-up is timed")));
        let t = start + Duration::from_secs(5);
        assert!(plan.due(t, || 0));
        assert!(!plan.finished());
        plan.advance(t, || 250);
        assert_eq!((plan.next, plan.mark), (1, BatchMark::Units(1250)));
        assert!(!plan.due(t, || 1249));
        assert!(plan.due(t, || 1250));
        plan.advance(t, || 1260);
        assert_eq!((plan.next, plan.mark), (2, BatchMark::Units(2260)));
        assert!(plan.finished(), "batch 2 of 2 closes the test");
    }

    #[test]
    fn batches_of_seconds_start_when_the_last_one_closed() {
        let start = Instant::now();
        let mut plan = BatchPlan::new(start, Duration::ZERO, 1, BatchSize::Seconds(Duration::from_secs(2)));
        assert!(plan.due(start, || unreachable!()), "no warm-up: the baseline is due at once");
        let closed = start + Duration::from_millis(300);
        plan.advance(closed, || unreachable!("timed batches read no units"));
        assert_eq!(plan.mark, BatchMark::Time(closed + Duration::from_secs(2)));
        assert!(!plan.due(closed + Duration::from_millis(1999), || 0));
        assert!(plan.due(closed + Duration::from_secs(2), || 0));
        assert!(plan.finished());
    }
}
