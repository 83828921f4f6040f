//! The seam between `--heap-census` and the runtimes: a runtime's census of one process
//! ([`RuntimeCensus`]), made by its `RuntimeInstance::census` (`crate::runtimes`), and the
//! censuses of the JVM ([`JvmHolds`]: class histograms and `--heap-dump`), Go
//! ([`crate::runtimes::go::census::GoCensus`]) and Node ([`crate::runtimes::node::census::NodeCensus`]) behind it. [`super::HeapCensus`]
//! drives them and names no runtime.

use std::path::Path;

use leaktrace_analysis::holds::{HeapPaths, RuntimeHolds};

use crate::runtimes::go::census::GoCensus;
use crate::runtimes::jvm::census::JvmCensus;
use crate::runtimes::jvm::heapdump::{DumpOptions, Natives};
use crate::runtimes::node::census::NodeCensus;

/// What the recording asks of a census (from `RecordOptions`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CensusOptions {
    /// `--heap-dump` / `--heap-snapshots` and their bounds (None: neither).
    pub dump: Option<DumpOptions>,
}

/// One runtime's "what holds it" census of one traced process, driven by [`super::HeapCensus`]:
/// [`RuntimeCensus::attach`] (a running process, before its probes, when the runtime's instance
/// made the census at attach), [`RuntimeCensus::tick`] at every poll, then at the end, in this
/// order, [`RuntimeCensus::finish`] and [`RuntimeCensus::heap_dump`] (the probes in place, the
/// process still running), [`RuntimeCensus::finish_detached`] once the probes are detached (only
/// for a census whose [`RuntimeCensus::after_detach`] is true), and [`RuntimeCensus::take`].
pub trait RuntimeCensus: Send {
    /// At attach to a running process, before its probes are placed (may wait for the runtime,
    /// bounded).
    fn attach(&mut self) {}

    /// At every poll; `t_s`: seconds since the recording's start, `units`: units of work so far.
    /// Never blocks on the runtime.
    fn tick(&mut self, t_s: f64, units: Option<u64>);

    /// End of the recording, the probes still in place: the last snapshot (`alive`: the process
    /// still runs and may be asked; `now_s` gives the seconds since the recording's start).
    fn finish(&mut self, _alive: bool, _now_s: &dyn Fn() -> f64, _units: Option<u64>) {}

    /// After every census' [`RuntimeCensus::finish`]: `--heap-dump`'s dump, written in `dir`
    /// (the output directory).
    fn heap_dump(
        &mut self,
        _dir: &Path,
        _alive: bool,
        _now_s: &dyn Fn() -> f64,
        _units: Option<u64>,
        _n: &mut Natives<'_>,
    ) {
    }

    /// At a periodic checkpoint early in the recording, the probes in place and the process
    /// running: `--heap-dump`'s first dump, written in `dir`, when its runtime takes one; false
    /// while it waits to be taken (asked again at the next checkpoint).
    fn first_dump(&mut self, _dir: &Path, _now_s: &dyn Fn() -> f64, _units: Option<u64>, _n: &mut Natives<'_>) -> bool {
        true
    }

    /// Whether the census ends in [`RuntimeCensus::finish_detached`], once the probes are
    /// detached (the recorder then waits for the detach).
    fn after_detach(&self) -> bool {
        false
    }

    /// End of the recording, once the probes are detached.
    fn finish_detached(&mut self, _alive: bool, _now_s: &dyn Fn() -> f64) {}

    /// What the census found, put into the recording's `holds` (its runtime's members).
    fn take(self: Box<Self>, holds: &mut RuntimeHolds);
}

/// The JVM's census: its class histograms and, with `--heap-dump`, one heap dump after the last.
pub struct JvmHolds {
    census: JvmCensus,
    /// `--heap-dump` (None: not asked, or `--heap-snapshots` only).
    dump: Option<DumpOptions>,
    /// What the heap dump found.
    dumped: Option<HeapPaths>,
    /// What the first heap dump found; whether it was tried.
    first: Option<HeapPaths>,
    first_tried: bool,
}

impl JvmHolds {
    /// The census of JVM `pid` (finds its jcmd now).
    pub fn new(pid: u32, opts: CensusOptions) -> JvmHolds {
        JvmHolds {
            census: JvmCensus::new(pid),
            dump: opts.dump.filter(|d| d.jvm),
            dumped: None,
            first: None,
            first_tried: false,
        }
    }
}

impl RuntimeCensus for JvmHolds {
    fn tick(&mut self, t_s: f64, units: Option<u64>) {
        self.census.tick(t_s, units);
    }

    fn finish(&mut self, alive: bool, now_s: &dyn Fn() -> f64, units: Option<u64>) {
        self.census.finish(alive, now_s, units);
    }

    fn heap_dump(&mut self, dir: &Path, alive: bool, now_s: &dyn Fn() -> f64, units: Option<u64>, n: &mut Natives<'_>) {
        if let Some(o) = self.dump
            && alive
        {
            self.dumped = self.census.heap_dump(dir, o, now_s, units, n);
        }
    }

    /// Once the first class histogram was taken (jcmd is free then).
    fn first_dump(&mut self, dir: &Path, now_s: &dyn Fn() -> f64, units: Option<u64>, n: &mut Natives<'_>) -> bool {
        let Some(o) = self.dump.filter(|_| !self.first_tried) else { return true };
        if self.census.census.start.is_none() {
            return false;
        }
        self.first_tried = true;
        self.first = self.census.first_heap_dump(dir, o, now_s, units, n);
        true
    }

    fn take(self: Box<Self>, holds: &mut RuntimeHolds) {
        holds.jvm = Some(self.census.census);
        holds.jvm_heap_dump = self.dumped;
        holds.jvm_first_dump = self.first;
    }
}

impl RuntimeCensus for GoCensus {
    fn tick(&mut self, t_s: f64, units: Option<u64>) {
        GoCensus::tick(self, t_s, units);
    }

    fn finish(&mut self, alive: bool, now_s: &dyn Fn() -> f64, units: Option<u64>) {
        GoCensus::finish(self, alive, now_s(), units);
    }

    fn take(self: Box<Self>, holds: &mut RuntimeHolds) {
        holds.go = Some(self.census);
    }
}

/// Node's census: the sampling profiler started at attach (a running process) or at the first
/// poll; its end (the last heap snapshot, the profile, the inspector closed) once the probes are
/// detached — V8 builds a snapshot with hundreds of thousands of malloc calls, 10–20 times
/// slower under the probes (docs/benchmarks.md, "What holds it").
pub fn node(pid: u32, opts: CensusOptions) -> Box<dyn RuntimeCensus> {
    let mut n = NodeCensus::new(pid);
    n.snapshot_max = opts.dump.filter(|d| d.node).map(|d| d.max_bytes);
    Box::new(n)
}

impl RuntimeCensus for NodeCensus {
    fn attach(&mut self) {
        self.start_at_attach();
    }

    fn tick(&mut self, _t_s: f64, _units: Option<u64>) {
        NodeCensus::tick(self);
    }

    fn after_detach(&self) -> bool {
        true
    }

    fn finish_detached(&mut self, alive: bool, now_s: &dyn Fn() -> f64) {
        NodeCensus::finish(self, alive, now_s);
    }

    fn take(mut self: Box<Self>, holds: &mut RuntimeHolds) {
        holds.node_snapshots = self.snapshots.take();
        holds.node = Some(std::mem::take(&mut self.census));
    }
}
