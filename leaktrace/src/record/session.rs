//! The session loop: polls every traced process every 100 ms (exit, ring buffer, new mappings,
//! forks), takes the checkpoints (periodic, and `check`'s batches) and decides when the recording
//! ends.

use std::io::Write as _;
use std::time::{Duration, Instant};

use crate::discover::{self, WorkProbeSpec};
use crate::probes::{Mode, Tracer};
use crate::procinfo;
use crate::recording::EndReason;
use leaktrace_analysis::human;

use super::*;

pub(super) struct Session {
    pub(super) tracer: Tracer,
    pub(super) targets: Vec<Traced>,
    pub(super) start: Instant,
    pub(super) status_line: bool,
    pub(super) mode: Mode,
    pub(super) work_probe: Option<WorkProbeSpec>,
    pub(super) follow_forks: bool,
}

/// Where the current batch of `leaktrace check` ends.
#[derive(Clone, Copy, Debug)]
pub(super) enum BatchMark {
    Time(Instant),
    Units(u64),
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
        // Batch state (first target only): (next batch number, units or time at which it closes).
        let mut batch: Option<(u32, BatchMark)> = match &opts.schedule {
            Schedule::Periodic => None,
            Schedule::Batches { warmup, .. } => Some((0, BatchMark::Time(self.start + *warmup))),
        };
        // Batches counted in units of work end at a call count: look more often, so a batch
        // overshoots by few calls.
        let poll = match opts.schedule {
            Schedule::Batches { size: BatchSize::Units(_), .. } => POLL / 5,
            _ => POLL,
        };
        let mut polls: u64 = 0;
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
            let t_s = self.start.elapsed().as_secs_f64();
            for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
                if t.gone() {
                    // Its maps still hold everything it allocated: one last checkpoint.
                    t.checkpoint(&self.tracer, t_s, None, self.work_probe.is_some());
                    t.end_reason = Some(EndReason::TargetExited);
                } else {
                    t.symbolizer.refresh();
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
            if let (Some((n, mark)), Schedule::Batches { count, size, .. }) = (batch, &opts.schedule) {
                let first = self.targets[0].pid;
                let due = match mark {
                    BatchMark::Time(t) => now >= t,
                    BatchMark::Units(u) => self.tracer.work_units(first) >= u,
                };
                if due {
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
                    if n >= *count {
                        return EndReason::BatchesDone;
                    }
                    // The next batch starts where the checkpoint just taken measured, not after it
                    // (symbolizing new stacks can take a while).
                    let cp = self.targets[0].checkpoints.last();
                    let mark = match size {
                        BatchSize::Seconds(d) => BatchMark::Time(now + *d),
                        BatchSize::Units(k) => BatchMark::Units(
                            cp.and_then(|c| c.units_of_work).unwrap_or_else(|| self.tracer.work_units(first)) + k,
                        ),
                    };
                    batch = Some((n + 1, mark));
                    next = now + opts.interval;
                    continue;
                }
            }
            if now >= next {
                let t_s = self.start.elapsed().as_secs_f64();
                for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
                    t.rescan(&mut self.tracer, self.mode, self.work_probe.as_ref(), t_s);
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
                next += opts.interval;
                if next < now {
                    next = now + opts.interval;
                }
            }
        }
    }

    /// Apply queued mapping events to their process; with --follow-forks, attach to new children
    /// of traced processes.
    pub(super) fn drain_events(&mut self) {
        let mut forks = Vec::new();
        let targets = &mut self.targets;
        self.tracer.drain_map_events(|ev| {
            if ev.kind == leaktrace_common::map_event::FORK {
                forks.push((ev.tgid, ev.addr as u32));
                return;
            }
            if let Some(t) = targets.iter_mut().find(|t| t.pid == ev.tgid && t.end_reason.is_none()) {
                t.space.apply(ev);
            }
        });
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
            let opts =
                RecordOptions { work_probe: self.work_probe.clone(), mode: self.mode, ..RecordOptions::default() };
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

    pub(super) fn checkpoint_all(&mut self, batch: Option<u32>) {
        self.drain_events();
        let t_s = self.start.elapsed().as_secs_f64();
        let (mut live, mut rss, mut n) = (0, 0, 0);
        for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
            if let Some((l, r)) = t.checkpoint(&self.tracer, t_s, batch, self.work_probe.is_some()) {
                live += l;
                rss += r;
                n += 1;
            }
        }
        if self.status_line {
            let who = if n == 1 { format!("PID {}", self.targets[0].pid) } else { format!("{n} processes") };
            eprint!("\r\x1b[2K[{t_s:6.1}s] {who}: live {}, RSS {}", human::bytes(live), human::bytes(rss));
            let _ = std::io::stderr().flush();
        }
    }

    pub(super) fn clear_status(&self) {
        if self.status_line {
            eprint!("\r\x1b[2K");
        }
    }
}
