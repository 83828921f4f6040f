//! The session's one consumer seam, as lightswitch's `Collector`: a
//! [`CheckpointSink`] is told of every checkpoint the session takes, of every periodic one (with
//! the tracer, for what must read the processes while their probes are in place), and of the end
//! (the recordings as saved). The live status line ([`StatusSink`]), the periodic reachability
//! scans ([`ReachabilitySink`]), the periodic Python heap censuses ([`PyHeapSink`]) and `--push`
//! ([`PushSink`]) are sinks; [`Sinks::for_record`] lists those the options ask for.
//!
//! A sink that writes to stderr, or stops the targets, says so ([`CheckpointSink::speaks_at`]):
//! every sink is then [`CheckpointSink::interrupt`]ed first (the status line clears itself), as
//! before anything else the session says.

use std::time::Instant;

use crate::probes::{Mode, Tracer};
use leaktrace_analysis::recording::Recording;

use super::RecordOptions;
use super::traced::Traced;

/// What a periodic checkpoint hands a sink besides the processes.
pub(super) struct SinkCx<'a> {
    pub(super) tracer: &'a Tracer,
    pub(super) mode: Mode,
    pub(super) opts: &'a RecordOptions,
    /// Time 0 of the session (its first checkpoint).
    pub(super) start: Instant,
}

/// One checkpoint taken of one process: its index in the session's processes, its live bytes
/// and its RSS, bytes.
pub(super) type Taken = (usize, u64, u64);

/// A consumer of the session's checkpoints (see the module's docs). Every method does nothing
/// unless the sink needs it.
pub(super) trait CheckpointSink {
    /// For messages and `Debug`: what the sink is ("status line", "push").
    fn name(&self) -> &'static str;
    /// A checkpoint of every process still traced was just taken (`taken`: those that gave one),
    /// `t_s` seconds after time 0.
    fn taken(&mut self, _targets: &[Traced], _taken: &[Taken], _t_s: f64) {}
    /// True when [`CheckpointSink::periodic`] for the `n`th periodic checkpoint will write to
    /// stderr or stop the processes (the other sinks are interrupted first).
    fn speaks_at(&self, _n: u64) -> bool {
        false
    }
    /// The `n`th periodic checkpoint (1, 2, …) was taken.
    fn periodic(&mut self, _cx: &SinkCx<'_>, _targets: &mut [Traced], _n: u64) {}
    /// Something else is about to write to stderr.
    fn interrupt(&mut self) {}
    /// The session is over and its recordings saved (`recordings`, one per process; empty
    /// when there is nothing more to give).
    fn finish(self: Box<Self>, _recordings: &[Recording]) {}
}

/// The session's sinks, in the order they are told.
#[derive(Default)]
pub(super) struct Sinks(Vec<Box<dyn CheckpointSink>>);

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|s| s.name())).finish()
    }
}

impl Sinks {
    /// The sinks of a `record` session under `opts`: the status line (a line redrawn on a
    /// terminal, a plain one every 10 s otherwise, none with `--quiet`), the periodic
    /// reachability scans (`--reachability-every`), the Python heap censuses (`--python-heap`)
    /// and `--push` (its worker started now; `started_unix_ms` is the `from` of its first push).
    pub(super) fn for_record(opts: &RecordOptions, started_unix_ms: u64) -> Sinks {
        let status = crate::status::Status::new(crate::status::StatusMode::for_stderr(opts.status_line), opts.duration)
            .growth_mode(opts.process.mode == Mode::Growth);
        let mut sinks: Vec<Box<dyn CheckpointSink>> = vec![Box::new(StatusSink(status))];
        if let Some(o) = opts.reachability.filter(|o| o.every.is_some()) {
            sinks.push(Box::new(ReachabilitySink(o)));
        }
        if let Some(o) = opts.python_heap {
            sinks.push(Box::new(PyHeapSink(o)));
        }
        if let Some(c) = opts.push.clone() {
            sinks.push(Box::new(PushSink::start(c, started_unix_ms, None)));
        }
        Sinks(sinks)
    }

    /// Add a sink, told after those already there.
    pub(super) fn push(&mut self, sink: Box<dyn CheckpointSink>) {
        self.0.push(sink);
    }

    /// [`CheckpointSink::taken`] of every sink.
    pub(super) fn taken(&mut self, targets: &[Traced], taken: &[Taken], t_s: f64) {
        for s in self.0.iter_mut() {
            s.taken(targets, taken, t_s);
        }
    }

    /// [`CheckpointSink::periodic`] of every sink, every one interrupted first when one of them
    /// speaks at this checkpoint.
    pub(super) fn periodic(&mut self, cx: &SinkCx<'_>, targets: &mut [Traced], n: u64) {
        if self.0.iter().any(|s| s.speaks_at(n)) {
            self.interrupt();
        }
        for s in self.0.iter_mut() {
            s.periodic(cx, targets, n);
        }
    }

    /// [`CheckpointSink::interrupt`] of every sink.
    pub(super) fn interrupt(&mut self) {
        for s in self.0.iter_mut() {
            s.interrupt();
        }
    }

    /// [`CheckpointSink::finish`] of every sink, in order; the sinks are gone after it.
    pub(super) fn finish(&mut self, recordings: &[Recording]) {
        for s in std::mem::take(&mut self.0) {
            s.finish(recordings);
        }
    }
}

/// The live status line (`status.rs`): drawn at each checkpoint, cleared before anything else
/// is said.
pub(super) struct StatusSink(pub(super) crate::status::Status);

impl CheckpointSink for StatusSink {
    fn name(&self) -> &'static str {
        "status line"
    }

    fn taken(&mut self, targets: &[Traced], taken: &[Taken], t_s: f64) {
        let procs: Vec<crate::status::ProcessStatus<'_>> = taken
            .iter()
            .map(|&(i, live_bytes, rss_bytes)| {
                let t = &targets[i];
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
        self.0.update(t_s, &procs);
    }

    fn interrupt(&mut self) {
        self.0.clear();
    }
}

/// `--reachability-every N`: a reachability scan of every process at every Nth
/// periodic checkpoint, kept in its recording's `reachability_scans`.
struct ReachabilitySink(crate::reach::ScanOptions);

impl CheckpointSink for ReachabilitySink {
    fn name(&self) -> &'static str {
        "reachability scans"
    }

    fn speaks_at(&self, n: u64) -> bool {
        self.0.every.is_some_and(|every| n.is_multiple_of(u64::from(every)))
    }

    fn periodic(&mut self, cx: &SinkCx<'_>, targets: &mut [Traced], n: u64) {
        if !self.speaks_at(n) {
            return;
        }
        let mut scans = super::reachability::scan_all(cx.tracer, targets, cx.mode, self.0, cx.start);
        for t in targets.iter_mut() {
            if let Some(r) = scans.remove(&t.pid) {
                t.reach_scans.push(r);
            }
        }
    }
}

/// `--python-heap`: a census of CPython targets' objects at the first and every Nth
/// periodic checkpoint.
struct PyHeapSink(crate::runtimes::python::heap::HeapOptions);

impl CheckpointSink for PyHeapSink {
    fn name(&self) -> &'static str {
        "python heap censuses"
    }

    fn speaks_at(&self, n: u64) -> bool {
        super::pyheap::due(&self.0, n)
    }

    fn periodic(&mut self, cx: &SinkCx<'_>, targets: &mut [Traced], n: u64) {
        if self.speaks_at(n) {
            super::pyheap::census_all(cx.tracer, targets, self.0, cx.start);
        }
    }
}

/// `--push` (`push.rs`): every `--push-interval` a snapshot of every process handed to
/// the push worker; at the end the recordings as saved, the last push waited for.
pub(super) struct PushSink(crate::push::Pusher);

impl PushSink {
    /// Start the push worker; `labels` adds labels per process to the `--push-label`s.
    pub(super) fn start(
        cfg: crate::push::PushConfig,
        started_unix_ms: u64,
        labels: Option<crate::push::LabelsOf>,
    ) -> PushSink {
        PushSink(crate::push::Pusher::start_labelled(cfg, started_unix_ms, labels))
    }
}

impl CheckpointSink for PushSink {
    fn name(&self) -> &'static str {
        "push"
    }

    fn periodic(&mut self, cx: &SinkCx<'_>, targets: &mut [Traced], _n: u64) {
        if self.0.due() {
            let started = self.0.started_unix_ms();
            self.0.tick(|| targets.iter_mut().map(|t| t.snapshot(cx.opts, started)).collect());
        }
    }

    fn finish(self: Box<Self>, recordings: &[Recording]) {
        self.0.finish(recordings.to_vec());
    }
}
