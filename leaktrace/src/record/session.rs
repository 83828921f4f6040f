//! The session loop: polls every traced process every 100 ms (exit, ring buffer, new mappings,
//! forks, execs, teardowns), takes the checkpoints (periodic, and `check`'s batches) and decides
//! when the recording ends. It reaches the kernel and the processes through the [`Tracing`]
//! trait only (the real one is `live.rs`), so its batch, fork and exit logic is unit-tested
//! here against a fake, without root.

use std::time::{Duration, Instant};

use leaktrace_common::MapEvent;
use leaktrace_common::event::Event;

use crate::discover::WorkProbeSpec;
use leaktrace_analysis::recording::{Checkpoint, EndReason};

use super::{BatchSize, RecordOptions, Schedule};

/// What the session loop keeps of each traced process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SessionState {
    /// Set when this process's recording ended before the run (it exited).
    pub(super) end_reason: Option<EndReason>,
    /// Its teardown is watched in the kernel (the TEARDOWN map holds it).
    pub(super) teardown_watched: bool,
    /// It began its teardown and is held stopped: the teardown checkpoint is due.
    pub(super) teardown_pending: bool,
    /// Child processes it forked that are not traced (no --follow-forks).
    pub(super) untraced_children: u32,
    /// The OOM killer chose it (oom:mark_victim), with its anonymous RSS then, KiB.
    pub(super) oom_victim_anon_kib: Option<u64>,
}

/// One traced process as the session loop sees it.
pub(super) trait Tracee {
    /// Its PID (host namespace).
    fn pid(&self) -> u32;
    /// leaktrace started it (`record -- CMD`): it is held at its teardown and its execs, and
    /// resumed (its followed children are held the same way).
    fn launched(&self) -> bool;
    /// The `--work-probe` function was found and probed in it.
    fn work_attached(&self) -> bool;
    fn state(&self) -> &SessionState;
    fn state_mut(&mut self) -> &mut SessionState;
    /// Add a warning line to its recording.
    fn warn(&mut self, line: String);
    /// Its checkpoints so far, oldest first.
    fn checkpoints(&self) -> &[Checkpoint];
    fn last_checkpoint_mut(&mut self) -> Option<&mut Checkpoint>;
    /// Apply a mapping event (mmap, munmap, mremap, brk) to its address space.
    fn apply(&mut self, ev: &MapEvent);
}

/// What the session loop asks of the tracer, of /proc and of the outside world (clock, stderr,
/// status line, periodic hooks). `live.rs` is the real one; the unit tests below use a fake.
pub(super) trait Tracing {
    /// A traced process.
    type Proc: Tracee;
    /// The current instant (the real clock; a fake one in tests).
    fn now(&self) -> Instant;
    /// Kernel events queued since the last call (the `EVENTS` ring buffer), in order.
    fn events(&mut self) -> Vec<MapEvent>;
    /// Calls of the work-probe function in `pid` since attach.
    fn work_units(&self, pid: u32) -> u64;
    /// `pid` is a process (thread-group leader), not a new thread: sched_process_fork fires for
    /// both.
    fn is_process(&self, pid: u32) -> bool;
    /// Attach to `child`, forked by a traced process (`--follow-forks`). Ok(None): it is gone
    /// already (its objects could not be listed). Errors: probes could not be placed.
    fn follow(&mut self, child: u32) -> anyhow::Result<Option<Self::Proc>>;
    /// Take a checkpoint of `p` at `t_s` (seconds since the first checkpoint), closing `check`'s
    /// batch `batch` if given. Returns (live bytes, RSS bytes) when one was taken.
    fn checkpoint(&mut self, p: &mut Self::Proc, t_s: f64, batch: Option<u32>) -> Option<(u64, u64)>;
    /// `p` has ended (it records how).
    fn gone(&mut self, p: &mut Self::Proc) -> bool;
    /// Look at a live process between checkpoints (poll number `polls`): its cgroup, an exec seen
    /// without the tracepoint, new objects to symbolize, its runtime.
    fn poll(&mut self, p: &mut Self::Proc, polls: u64, t_s: f64);
    /// `p` exec'd (the exec tracepoint): re-discover it.
    fn exec(&mut self, p: &mut Self::Proc, t_s: f64);
    /// Probe what `p` mapped since the last rescan (dlopen), at a periodic checkpoint.
    fn rescan(&mut self, p: &mut Self::Proc, t_s: f64);
    /// Start (`on`) or stop watching `pid`'s teardown in the kernel; failures are ignored.
    fn watch_teardown(&mut self, pid: u32, on: bool);
    /// Wait (briefly, at most 0.5 s) until `pid`, stopped by the kernel side at its teardown, is
    /// stopped.
    fn wait_stopped(&self, pid: u32);
    /// Let `pid`, held at its teardown or at an exec, continue (SIGCONT).
    fn resume(&mut self, pid: u32);
    /// `p` is held stopped at its teardown (libc `exit`'s entry), its teardown checkpoint taken:
    /// the reachability scan at exit (`--reachability`), as LeakSanitizer's check runs there.
    fn at_teardown(&mut self, _p: &mut Self::Proc, _t_s: f64) {}
    /// Hold `pid`'s execs (after the first `pass`) and, with `children`, its untraced children's
    /// until they are probed (see `Tracer::hold_execs`); failures are ignored (the exec is then
    /// re-discovered as it runs).
    fn hold_execs(&mut self, pid: u32, pass: u32, children: bool);
    /// Stop holding `pid`'s execs; failures are ignored.
    fn release_execs(&mut self, pid: u32);
    /// Hold (`on`) or stop holding `pid`'s new child processes at their fork's return until they
    /// are followed (see `Tracer::hold_forks`); failures are ignored (a child is then followed
    /// from the agent's next poll, as without the hold).
    fn hold_forks(&mut self, pid: u32, on: bool);
    /// Tell the user one line (stderr, the status line cleared first).
    fn say(&mut self, line: &str);
    /// Checkpoints were taken at `t_s`: (index in `targets`, live bytes, RSS bytes) each.
    fn checkpoints_taken(&mut self, targets: &[Self::Proc], taken: &[(usize, u64, u64)], t_s: f64);
    /// A round of checkpoints of several processes begins (`true`) or ends (`false`): what every
    /// checkpoint reads alike (the kernel's site table, its counters) may be read once for the
    /// round (`Tracer::begin_round`).
    fn round(&mut self, _begin: bool) {}
    /// The `n`th periodic checkpoint was taken (reachability scans, pushes); `start` is time 0.
    fn periodic(&mut self, targets: &mut [Self::Proc], n: u64, opts: &RecordOptions, start: Instant);
}

/// A recording session: the tracer and the processes it traces.
pub(super) struct Session<H: Tracing> {
    pub(super) host: H,
    pub(super) targets: Vec<H::Proc>,
    /// Processes recorded beside the targets by the same tracer (`watch`'s exact windows, on
    /// processes that are also targets): they get their mapping events here, and nothing else
    /// of the loop (their owner takes their checkpoints).
    pub(super) beside: Vec<H::Proc>,
    /// Time 0: the first checkpoint ([`Session::begin`]).
    pub(super) start: Instant,
    pub(super) work_probe: Option<WorkProbeSpec>,
    pub(super) follow_forks: bool,
    /// Children not followed are counted in their parent's recording but not said on stderr
    /// (`leaktrace watch`: its selector finds them and they are watched in their own right).
    pub(super) quiet_forks: bool,
    /// The traced processes' objects are rescanned (dlopen'd libraries probed, runtime
    /// detected) at every this many periodic checkpoints: 1 for `record`, more for `watch`
    /// (reading every process's maps each second was a fifth of the agent's CPU).
    pub(super) rescan_every: u64,
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

/// Where the loop is between two polls.
#[derive(Clone, Debug)]
pub(super) struct Progress {
    /// When the next periodic checkpoint is due.
    next: Instant,
    /// `--duration`'s end.
    deadline: Option<Instant>,
    /// `check`'s batches.
    batch: Option<BatchPlan>,
    /// Polls so far.
    polls: u64,
    /// Periodic checkpoints taken (not the first, nor batch checkpoints).
    periodic: u64,
    /// The work probe was reported missing.
    work_missing_told: bool,
}

/// How often the loop polls under `opts`: batches counted in units of work end at a call count,
/// so it looks more often and a batch overshoots by few calls.
pub(super) fn poll_interval(opts: &RecordOptions) -> Duration {
    match opts.schedule {
        Schedule::Batches { size: BatchSize::Units(_), .. } => POLL / 5,
        _ => POLL,
    }
}

/// Stop watching `t`'s teardown and holding its execs in the kernel (at its exit, and at the
/// end of the session); a hold it never had is a no-op.
fn release_watches<H: Tracing>(host: &mut H, t: &mut H::Proc) {
    if t.state().teardown_watched {
        host.watch_teardown(t.pid(), false);
        t.state_mut().teardown_watched = false;
    }
    host.release_execs(t.pid());
    host.hold_forks(t.pid(), false);
}

impl<H: Tracing> Session<H> {
    /// Seconds since time 0.
    pub(super) fn t_s(&self) -> f64 {
        self.host.now().saturating_duration_since(self.start).as_secs_f64()
    }

    /// Poll until the session ends: [`Session::step`] every [`poll_interval`]; a signal (SIGINT,
    /// SIGTERM, SIGHUP) ends it with a last checkpoint.
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
        let mut progress = self.begin(opts);
        let poll = poll_interval(opts);
        loop {
            tokio::select! {
                _ = recv(&mut sigint) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = recv(&mut sigterm) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = recv(&mut sighup) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = tokio::time::sleep(poll) => {}
            }
            // A signal that came while attaching, before the handlers above listened.
            if crate::stopping::signalled() {
                self.checkpoint_all(None);
                return EndReason::Signal;
            }
            if let Some(end) = self.step(opts, &mut progress) {
                return end;
            }
        }
    }

    /// Start the session: time 0 is the first checkpoint, taken now that every probe is in place
    /// (attaching can take seconds); --duration counts from here too.
    pub(super) fn begin(&mut self, opts: &RecordOptions) -> Progress {
        self.start = self.host.now();
        self.checkpoint_all(None);
        Progress {
            next: self.host.now() + opts.interval,
            deadline: opts.duration.map(|d| self.start + d),
            batch: match &opts.schedule {
                Schedule::Periodic => None,
                Schedule::Batches { warmup, count, size } => Some(BatchPlan::new(self.start, *warmup, *count, *size)),
            },
            polls: 0,
            periodic: 0,
            work_missing_told: false,
        }
    }

    /// One poll: events, teardowns, exits; then the deadline, the batch due, the periodic
    /// checkpoint. Returns why the session ends, when it does (the last checkpoint taken).
    pub(super) fn step(&mut self, opts: &RecordOptions, p: &mut Progress) -> Option<EndReason> {
        p.polls += 1;
        self.drain_events();
        self.take_teardowns();
        let t_s = self.t_s();
        for t in self.targets.iter_mut().filter(|t| t.state().end_reason.is_none()) {
            if self.host.gone(t) {
                // Its maps still hold everything it allocated: one last checkpoint.
                self.host.checkpoint(t, t_s, None);
                t.state_mut().end_reason = Some(EndReason::TargetExited);
                // Its kernel entries go (a PID reused by another process must not be held).
                release_watches(&mut self.host, t);
            } else {
                self.host.poll(t, p.polls, t_s);
            }
        }
        if self.targets.iter().all(|t| t.state().end_reason.is_some()) {
            return Some(EndReason::TargetExited);
        }
        let now = self.host.now();
        if p.deadline.is_some_and(|d| now >= d) {
            self.checkpoint_all(None);
            return Some(EndReason::Duration);
        }
        if let Some(plan) = p.batch.as_mut() {
            let first = self.targets[0].pid();
            if plan.due(now, || self.host.work_units(first)) {
                let (n, count) = (plan.next, plan.count);
                self.checkpoint_all(Some(n));
                let what =
                    if n == 0 { "warm-up done, baseline taken".to_string() } else { format!("batch {n}/{count} done") };
                let line = format!("{what} at {:.1}s", self.t_s());
                self.host.say(&line);
                if plan.finished() {
                    return Some(EndReason::BatchesDone);
                }
                // The next batch starts where the checkpoint just taken measured, not after it
                // (symbolizing new stacks can take a while).
                let cp = self.targets[0].checkpoints().last();
                let host = &self.host;
                plan.advance(now, || cp.and_then(|c| c.units_of_work).unwrap_or_else(|| host.work_units(first)));
                p.next = now + opts.interval;
                return None;
            }
        }
        if now >= p.next {
            let t_s = self.t_s();
            let rescan = (p.periodic + 1).is_multiple_of(self.rescan_every.max(1));
            for t in self.targets.iter_mut().filter(|t| rescan && t.state().end_reason.is_none()) {
                self.host.rescan(t, t_s);
            }
            // A work probe that cannot be placed once the command has loaded its libraries is a
            // mistake to report, not to wait on: `check` by units would never end.
            if let (Some(spec), false) = (&self.work_probe, self.targets[0].work_attached())
                && t_s >= WORK_PROBE_GRACE_S
                && !p.work_missing_told
            {
                p.work_missing_told = true;
                let line = format!(
                    "warning: --work-probe {spec}: no function `{}` in the objects PID {} maps after {t_s:.0} s",
                    spec.symbol,
                    self.targets[0].pid()
                );
                self.host.say(&line);
                if matches!(opts.schedule, Schedule::Batches { size: BatchSize::Units(_), .. }) {
                    self.checkpoint_all(None);
                    return Some(EndReason::WorkProbeMissing);
                }
            }
            self.checkpoint_all(None);
            p.periodic += 1;
            self.host.periodic(&mut self.targets, p.periodic, opts, self.start);
            p.next += opts.interval;
            if p.next < now {
                p.next = now + opts.interval;
            }
        }
        None
    }

    /// Apply queued mapping events to their process; note execs and teardowns; with
    /// --follow-forks, attach to new children of traced processes. Processes the kernel side
    /// held at an exec (launched trees) continue once probed.
    pub(super) fn drain_events(&mut self) {
        let mut forks = Vec::new();
        let mut execs = Vec::new();
        let mut held = Vec::new();
        for ev in self.host.events() {
            let Ok(event) = Event::decode(&ev) else { continue };
            match event {
                Event::Fork { child } => forks.push((ev.tgid, child)),
                Event::ForkHeld { parent } => {
                    // A child stopped as its fork returned to it: followed, then let go.
                    forks.push((parent, ev.tgid));
                    held.push(ev.tgid);
                }
                Event::Exec { held: is_held } => {
                    execs.push(ev.tgid);
                    if is_held {
                        held.push(ev.tgid);
                    }
                }
                Event::ChildExec { parent } => {
                    // A child of a launched process, held at its exec before it was followed,
                    // or followed since (its exec came between its discovery and its entry in
                    // the kernel's filter): then it is re-discovered like any traced exec.
                    if self.targets.iter().any(|t| t.pid() == ev.tgid) {
                        execs.push(ev.tgid);
                    } else {
                        forks.push((parent, ev.tgid));
                    }
                    held.push(ev.tgid);
                }
                Event::OomVictim { anon_kib } => {
                    if let Some(t) = self.targets.iter_mut().find(|t| t.pid() == ev.tgid) {
                        t.state_mut().oom_victim_anon_kib = Some(anon_kib);
                    }
                }
                Event::Teardown => {
                    if let Some(t) = self.targets.iter_mut().find(|t| t.pid() == ev.tgid) {
                        let s = t.state_mut();
                        s.teardown_watched = false;
                        s.teardown_pending = true;
                    }
                }
                Event::Mapping(_) => {
                    let live = |t: &&mut H::Proc| t.pid() == ev.tgid && t.state().end_reason.is_none();
                    if let Some(t) = self.targets.iter_mut().find(live) {
                        t.apply(&ev);
                    }
                    for t in self.beside.iter_mut().filter(live) {
                        t.apply(&ev);
                    }
                }
            }
        }
        // A held process is probed once its stop has taken effect (the SIGSTOP is delivered as
        // its exec returns to user space): until then it may still be mapping its libraries.
        for &pid in &held {
            self.host.wait_stopped(pid);
        }
        // An exec replaced a traced process's image: note it and re-discover.
        let t_s = self.t_s();
        for tgid in execs {
            if let Some(t) = self.targets.iter_mut().find(|t| t.pid() == tgid && t.state().end_reason.is_none()) {
                self.host.exec(t, t_s);
            }
        }
        for (parent, child) in forks {
            // sched_process_fork also fires for new threads: keep new processes only.
            if !self.host.is_process(child) || self.targets.iter().any(|t| t.pid() == child) {
                continue;
            }
            if !self.follow_forks {
                // A wrapper script or a forking server: say plainly that the children are not traced.
                if let Some(p) = self.targets.iter_mut().find(|t| t.pid() == parent) {
                    p.state_mut().untraced_children += 1;
                    if p.state().untraced_children == 1 && !self.quiet_forks {
                        self.host.say(&format!(
                            "warning: PID {parent} forked PID {child}, which is not traced (add --follow-forks to trace children)"
                        ));
                    }
                }
                continue;
            }
            match self.host.follow(child) {
                Ok(None) => {}
                Ok(Some(mut t)) => {
                    if self.targets.iter().any(|t| t.launched()) {
                        // Part of a launched tree: its execs, and its children's, are held too.
                        self.host.hold_execs(child, 0, true);
                    }
                    self.host.hold_forks(child, true);
                    let t_s = self.t_s();
                    t.warn(format!("forked by PID {parent}; traced from t={t_s:.1}s"));
                    self.host.say(&format!("following PID {child}, forked by PID {parent}"));
                    self.host.checkpoint(&mut t, t_s, None);
                    self.targets.push(t);
                }
                Err(e) => {
                    if let Some(p) = self.targets.iter_mut().find(|t| t.pid() == parent) {
                        p.warn(format!("could not follow child PID {child}: {e:#}"));
                    }
                }
            }
        }
        for pid in held {
            self.host.resume(pid);
        }
    }

    /// Launched commands that began their teardown (the kernel side stopped them at `exit` or
    /// `Py_FinalizeEx`): wait until the stop has taken effect, take the teardown checkpoint (what
    /// was live before the teardown's frees), and let them continue.
    pub(super) fn take_teardowns(&mut self) {
        let t_s = self.t_s();
        for t in self.targets.iter_mut().filter(|t| t.state().teardown_pending) {
            t.state_mut().teardown_pending = false;
            self.host.wait_stopped(t.pid());
            if t.state().end_reason.is_none()
                && self.host.checkpoint(t, t_s, None).is_some()
                && let Some(c) = t.last_checkpoint_mut()
            {
                c.teardown = true;
            }
            if t.state().end_reason.is_none() {
                self.host.at_teardown(t, t_s);
            }
            self.host.resume(t.pid());
        }
    }

    /// At the end of the session: stop watching every teardown and exec and let any process
    /// held at one go on (a launched command is then stopped or waited for as before).
    pub(super) fn release_teardowns(&mut self) {
        // A stop queued just before a watch ended still comes through as an event, and that
        // last drain may follow a child or re-discover an exec (watching a teardown again):
        // released in the next round.
        for _ in 0..4 {
            for t in self.targets.iter_mut() {
                release_watches(&mut self.host, t);
            }
            let n = self.targets.len();
            self.drain_events();
            if self.targets.len() == n && !self.targets.iter().any(|t| t.state().teardown_watched) {
                break;
            }
        }
        for t in self.targets.iter_mut().filter(|t| t.launched() || t.state().teardown_pending) {
            t.state_mut().teardown_pending = false;
            if t.state().end_reason.is_none() {
                self.host.resume(t.pid());
            }
        }
    }

    /// A checkpoint of every process still traced (`batch`: the batch of `check` it closes).
    pub(super) fn checkpoint_all(&mut self, batch: Option<u32>) {
        self.drain_events();
        let t_s = self.t_s();
        let mut taken: Vec<(usize, u64, u64)> = Vec::new();
        // One process (`record`'s usual case) reads the maps itself, as before.
        let round = self.targets.iter().filter(|t| t.state().end_reason.is_none()).count() > 1;
        if round {
            self.host.round(true);
        }
        for (i, t) in self.targets.iter_mut().enumerate().filter(|(_, t)| t.state().end_reason.is_none()) {
            if let Some((l, r)) = self.host.checkpoint(t, t_s, batch) {
                taken.push((i, l, r));
            }
        }
        if round {
            self.host.round(false);
        }
        self.host.checkpoints_taken(&self.targets, &taken, t_s);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use leaktrace_common::map_event;

    use super::*;

    /// A traced process of the fake: what the loop did to it.
    #[derive(Default)]
    struct FakeProc {
        pid: u32,
        launched: bool,
        work_attached: bool,
        state: SessionState,
        warnings: Vec<String>,
        checkpoints: Vec<Checkpoint>,
        /// Mapping events applied.
        applied: Vec<u32>,
        execs: u32,
        rescans: u32,
    }

    impl FakeProc {
        fn new(pid: u32) -> FakeProc {
            FakeProc { pid, ..Default::default() }
        }
    }

    impl Tracee for FakeProc {
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
            &self.state
        }
        fn state_mut(&mut self) -> &mut SessionState {
            &mut self.state
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
            self.applied.push(ev.kind);
        }
    }

    /// A tracer without a kernel: a clock the test moves, events the test queues, processes
    /// that exit when the test says.
    struct Fake {
        now: Instant,
        queued: Vec<MapEvent>,
        /// Work-probe calls so far, for every process.
        units: u64,
        /// PIDs that are processes (the others are threads).
        processes: BTreeSet<u32>,
        exited: BTreeSet<u32>,
        /// Children whose probes cannot be placed.
        refuse: BTreeSet<u32>,
        said: Vec<String>,
        resumed: Vec<u32>,
        /// hold_execs calls: (pid, pass, children).
        holds: Vec<(u32, u32, bool)>,
        /// release_execs calls.
        released: Vec<u32>,
        /// hold_forks calls: (pid, on).
        fork_holds: Vec<(u32, bool)>,
        unwatched: Vec<u32>,
        /// Periodic hook calls: n each.
        periodic: Vec<u64>,
        /// at_teardown calls (the scan at exit): PIDs.
        teardown_scans: Vec<u32>,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                now: Instant::now(),
                queued: Vec::new(),
                units: 0,
                processes: BTreeSet::new(),
                exited: BTreeSet::new(),
                refuse: BTreeSet::new(),
                said: Vec::new(),
                resumed: Vec::new(),
                holds: Vec::new(),
                released: Vec::new(),
                fork_holds: Vec::new(),
                unwatched: Vec::new(),
                teardown_scans: Vec::new(),
                periodic: Vec::new(),
            }
        }
    }

    impl Tracing for Fake {
        type Proc = FakeProc;
        fn now(&self) -> Instant {
            self.now
        }
        fn events(&mut self) -> Vec<MapEvent> {
            std::mem::take(&mut self.queued)
        }
        fn work_units(&self, _pid: u32) -> u64 {
            self.units
        }
        fn is_process(&self, pid: u32) -> bool {
            self.processes.contains(&pid)
        }
        fn follow(&mut self, child: u32) -> anyhow::Result<Option<FakeProc>> {
            anyhow::ensure!(!self.refuse.contains(&child), "the kernel refused a probe");
            Ok(Some(FakeProc::new(child)))
        }
        fn checkpoint(&mut self, p: &mut FakeProc, t_s: f64, batch: Option<u32>) -> Option<(u64, u64)> {
            p.checkpoints.push(Checkpoint { t_s, batch, units_of_work: Some(self.units), ..Default::default() });
            Some((0, 0))
        }
        fn gone(&mut self, p: &mut FakeProc) -> bool {
            self.exited.contains(&p.pid)
        }
        fn poll(&mut self, _p: &mut FakeProc, _polls: u64, _t_s: f64) {}
        fn exec(&mut self, p: &mut FakeProc, _t_s: f64) {
            p.execs += 1;
        }
        fn rescan(&mut self, p: &mut FakeProc, _t_s: f64) {
            p.rescans += 1;
        }
        fn watch_teardown(&mut self, pid: u32, on: bool) {
            assert!(!on, "the loop only stops watching");
            self.unwatched.push(pid);
        }
        fn wait_stopped(&self, _pid: u32) {}
        fn at_teardown(&mut self, p: &mut FakeProc, _t_s: f64) {
            assert!(!self.resumed.contains(&p.pid), "scanned while held, before it is let go");
            self.teardown_scans.push(p.pid);
        }
        fn resume(&mut self, pid: u32) {
            self.resumed.push(pid);
        }
        fn hold_execs(&mut self, pid: u32, pass: u32, children: bool) {
            self.holds.push((pid, pass, children));
        }
        fn release_execs(&mut self, pid: u32) {
            self.released.push(pid);
        }
        fn hold_forks(&mut self, pid: u32, on: bool) {
            self.fork_holds.push((pid, on));
        }
        fn say(&mut self, line: &str) {
            self.said.push(line.to_string());
        }
        fn checkpoints_taken(&mut self, _targets: &[FakeProc], _taken: &[(usize, u64, u64)], _t_s: f64) {}
        fn periodic(&mut self, _targets: &mut [FakeProc], n: u64, _opts: &RecordOptions, _start: Instant) {
            self.periodic.push(n);
        }
    }

    fn session(pids: &[u32], follow_forks: bool) -> Session<Fake> {
        let host = Fake::new();
        let start = host.now;
        let targets = pids.iter().map(|&p| FakeProc::new(p)).collect();
        Session {
            host,
            targets,
            beside: Vec::new(),
            start,
            work_probe: None,
            follow_forks,
            quiet_forks: false,
            rescan_every: 1,
        }
    }

    fn event(kind: u32, tgid: u32, addr: u64) -> MapEvent {
        MapEvent { kind, tgid, addr, ..Default::default() }
    }

    /// Poll until the session ends (at most `max` polls), the clock moving one poll interval
    /// and the work counter `units_per_poll` each time.
    fn run(s: &mut Session<Fake>, opts: &RecordOptions, units_per_poll: u64, max: u32) -> Option<EndReason> {
        let mut p = s.begin(opts);
        for _ in 0..max {
            s.host.now += poll_interval(opts);
            s.host.units += units_per_poll;
            if let Some(end) = s.step(opts, &mut p) {
                return Some(end);
            }
        }
        None
    }

    #[test]
    fn batches_close_on_work_units_counted_from_each_batch_checkpoint() {
        let opts = RecordOptions {
            interval: Duration::from_secs(60),
            schedule: Schedule::Batches { warmup: Duration::from_secs(1), count: 2, size: BatchSize::Units(100) },
            ..RecordOptions::default()
        };
        let mut s = session(&[10], false);
        s.targets[0].work_attached = true;
        assert_eq!(run(&mut s, &opts, 30, 1000), Some(EndReason::BatchesDone));
        let cps = &s.targets[0].checkpoints;
        let batches: Vec<Option<u32>> = cps.iter().map(|c| c.batch).collect();
        assert_eq!(batches, [None, Some(0), Some(1), Some(2)], "first, baseline, two batches; no periodic one");
        // The baseline closes when the warm-up's second is over (50 polls of 20 ms).
        assert!((cps[1].t_s - 1.0).abs() < 1e-6, "baseline at {} s", cps[1].t_s);
        // Each batch ends 100 units after the units its predecessor's checkpoint measured,
        // overshooting by less than one poll's calls.
        for w in cps[1..].windows(2) {
            let (a, b) = (w[0].units_of_work.unwrap(), w[1].units_of_work.unwrap());
            assert!((100..130).contains(&(b - a)), "batch of {} units ({a} → {b})", b - a);
        }
        let said: Vec<&str> = s.host.said.iter().map(|l| l.split(" at ").next().unwrap()).collect();
        assert_eq!(said, ["warm-up done, baseline taken", "batch 1/2 done", "batch 2/2 done"]);
    }

    #[test]
    fn a_missing_work_probe_ends_a_check_by_units_after_the_grace_period() {
        let opts = RecordOptions {
            interval: Duration::from_secs(1),
            schedule: Schedule::Batches { warmup: Duration::from_secs(30), count: 2, size: BatchSize::Units(100) },
            process: super::super::ProcessOptions {
                work_probe: Some("handle_request".parse().unwrap()),
                ..Default::default()
            },
            ..RecordOptions::default()
        };
        let mut s = session(&[10], false);
        s.work_probe = opts.process.work_probe.clone();
        assert_eq!(run(&mut s, &opts, 0, 10_000), Some(EndReason::WorkProbeMissing));
        let last = s.targets[0].checkpoints.last().unwrap();
        assert!((last.t_s - WORK_PROBE_GRACE_S).abs() < 1e-6, "ended at {} s", last.t_s);
        assert_eq!(s.host.said.len(), 1, "{:?}", s.host.said);
        assert!(
            s.host.said[0].contains("no function `handle_request` in the objects PID 10 maps"),
            "{:?}",
            s.host.said
        );
    }

    #[test]
    fn duration_ends_with_a_checkpoint_after_the_periodic_ones() {
        let opts = RecordOptions {
            duration: Some(Duration::from_secs(1)),
            interval: Duration::from_millis(300),
            ..RecordOptions::default()
        };
        let mut s = session(&[10, 20], false);
        assert_eq!(run(&mut s, &opts, 0, 100), Some(EndReason::Duration));
        for t in &s.targets {
            let at: Vec<String> = t.checkpoints.iter().map(|c| format!("{:.1}", c.t_s)).collect();
            assert_eq!(at, ["0.0", "0.3", "0.6", "0.9", "1.0"], "PID {}", t.pid);
            assert_eq!(t.rescans, 3, "a rescan at each periodic checkpoint");
        }
        assert_eq!(s.host.periodic, [1, 2, 3], "the periodic hooks see each periodic checkpoint once");
    }

    #[test]
    fn forks_without_follow_forks_are_counted_and_told_once() {
        let opts = RecordOptions { interval: Duration::from_secs(60), ..RecordOptions::default() };
        let mut s = session(&[10], false);
        s.host.processes.extend([11, 12]);
        let mut p = s.begin(&opts);
        // Two child processes, and a new thread (13) that sched_process_fork reports too.
        s.host.queued =
            vec![event(map_event::FORK, 10, 11), event(map_event::FORK, 10, 13), event(map_event::FORK, 10, 12)];
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), None);
        assert_eq!(s.targets.len(), 1, "children are not traced");
        assert_eq!(s.targets[0].state.untraced_children, 2, "the thread is not a child process");
        assert_eq!(s.host.said.len(), 1, "{:?}", s.host.said);
        assert!(s.host.said[0].contains("PID 10 forked PID 11, which is not traced"), "{:?}", s.host.said);
    }

    #[test]
    fn followed_forks_are_attached_once_and_checkpointed_from_their_fork() {
        let opts = RecordOptions { interval: Duration::from_secs(60), ..RecordOptions::default() };
        let mut s = session(&[10], true);
        s.host.processes.extend([11, 14]);
        s.host.refuse.insert(14);
        let mut p = s.begin(&opts);
        s.host.now += Duration::from_millis(1500);
        s.host.queued = vec![
            event(map_event::FORK, 10, 11),
            event(map_event::FORK, 10, 13), // a thread
            event(map_event::FORK, 10, 11), // seen twice: attached once
            event(map_event::FORK, 10, 14), // its probes are refused
            event(map_event::MMAP, 11, 0x7000_0000),
        ];
        assert_eq!(s.step(&opts, &mut p), None);
        let pids: Vec<u32> = s.targets.iter().map(|t| t.pid).collect();
        assert_eq!(pids, [10, 11]);
        let child = &s.targets[1];
        assert_eq!(child.warnings, ["forked by PID 10; traced from t=1.5s"]);
        assert_eq!(child.checkpoints.len(), 1, "its first checkpoint is taken at once");
        assert!((child.checkpoints[0].t_s - 1.5).abs() < 1e-6);
        assert!(child.applied.is_empty(), "its mappings before the attach are not its events");
        let parent = &s.targets[0];
        assert_eq!(parent.warnings.len(), 1, "{:?}", parent.warnings);
        assert!(parent.warnings[0].starts_with("could not follow child PID 14: the kernel refused"));
        assert_eq!(s.host.said, ["following PID 11, forked by PID 10"]);
    }

    /// A child the kernel side stopped as its fork returned to it (FORK_HELD) is followed once
    /// (the sched_process_fork event for it too), then let go; its own children are held at
    /// their fork from then on; at the end of the session every fork hold is released.
    #[test]
    fn a_child_held_at_its_fork_is_followed_then_let_go() {
        let opts = RecordOptions { interval: Duration::from_secs(60), ..RecordOptions::default() };
        let mut s = session(&[10], true);
        s.host.processes.extend([11]);
        let mut p = s.begin(&opts);
        s.host.queued = vec![event(map_event::FORK, 10, 11), event(map_event::FORK_HELD, 11, 10)];
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), None);
        let pids: Vec<u32> = s.targets.iter().map(|t| t.pid).collect();
        assert_eq!(pids, [10, 11], "the held child is followed once");
        assert_eq!(s.host.resumed, [11], "let go once followed");
        assert_eq!(s.host.fork_holds, [(11, true)]);
        assert_eq!(s.targets[1].checkpoints.len(), 1, "its first checkpoint, before it runs");
        s.release_teardowns();
        assert!(s.host.fork_holds.contains(&(10, false)) && s.host.fork_holds.contains(&(11, false)));
    }

    /// A launched command held at an exec is re-discovered, then let go; an untraced child held
    /// at its exec is followed (once, with the FORK seen too), its execs held from then on, then
    /// let go; a release at the end stops every hold.
    #[test]
    fn processes_held_at_an_exec_continue_once_probed() {
        let opts = RecordOptions { interval: Duration::from_secs(60), ..RecordOptions::default() };
        let mut s = session(&[10], true);
        s.targets[0].launched = true;
        s.host.processes.extend([11]);
        let mut p = s.begin(&opts);
        s.host.queued =
            vec![event(map_event::EXEC, 10, 1), event(map_event::FORK, 10, 11), event(map_event::CHILD_EXEC, 11, 10)];
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), None);
        let pids: Vec<u32> = s.targets.iter().map(|t| t.pid).collect();
        assert_eq!(pids, [10, 11], "the held child is followed once");
        assert_eq!(s.targets[0].execs, 1);
        assert_eq!(s.host.holds, [(11, 0, true)]);
        assert_eq!(s.host.resumed, [10, 11], "both go on after their probes are placed");
        // An exec that was not held (addr 0) is not resumed.
        s.host.queued = vec![event(map_event::EXEC, 11, 0)];
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), None);
        assert_eq!(s.targets[1].execs, 1);
        assert_eq!(s.host.resumed, [10, 11]);
        s.release_teardowns();
        assert_eq!(s.host.released, [10, 11]);
    }

    #[test]
    fn execs_teardowns_and_exits_go_to_their_process() {
        let opts = RecordOptions { interval: Duration::from_secs(60), ..RecordOptions::default() };
        let mut s = session(&[10, 20], false);
        s.targets[0].launched = true;
        s.targets[0].state.teardown_watched = true;
        let mut p = s.begin(&opts);
        s.host.queued = vec![
            event(map_event::EXEC, 20, 0),
            event(map_event::TEARDOWN, 10, 0),
            event(map_event::MMAP, 20, 0x1000),
            event(map_event::MUNMAP, 99, 0x1000), // not traced
        ];
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), None);
        let (a, b) = (&s.targets[0], &s.targets[1]);
        assert_eq!((a.execs, b.execs), (0, 1));
        assert_eq!(b.applied, [map_event::MMAP]);
        // The teardown checkpoint is taken and the command let go.
        assert_eq!(a.checkpoints.len(), 2);
        assert!(a.checkpoints[1].teardown && !b.checkpoints.iter().any(|c| c.teardown));
        assert_eq!(s.host.teardown_scans, [10], "the scan at exit, while held");
        assert_eq!(s.host.resumed, [10]);
        assert!(!a.state.teardown_pending && !a.state.teardown_watched);

        // PID 20 exits: a last checkpoint, and its later events are not applied.
        s.host.exited.insert(20);
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), None, "PID 10 still runs");
        s.host.queued = vec![event(map_event::MMAP, 20, 0x2000)];
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), None);
        let b = &s.targets[1];
        assert_eq!(b.state.end_reason, Some(EndReason::TargetExited));
        assert_eq!(b.checkpoints.len(), 2, "the first and the last");
        assert_eq!(b.applied, [map_event::MMAP]);

        s.host.exited.insert(10);
        s.host.now += POLL;
        assert_eq!(s.step(&opts, &mut p), Some(EndReason::TargetExited));
        s.release_teardowns();
        assert_eq!(s.host.resumed, [10], "an ended process is not resumed again");
        assert!(s.host.unwatched.is_empty(), "its watch ended with its teardown stop");
    }

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
