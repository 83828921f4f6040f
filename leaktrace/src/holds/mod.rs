//! "What holds it" from the runtimes' own heap tools, driven from outside (`record
//! --heap-census`): the JVM's class histogram ([`jvm`]), Go's goroutines ([`go`]) and
//! heap profile ([`crate::runtimes::go::heap`]), Node's sampling heap profile ([`crate::runtimes::node::census`]), each taken near the start
//! of the recording and at its end; the analysis (`leaktrace_analysis::holds`) says what grew
//! between the two. Each runtime's census sits behind [`census::RuntimeCensus`], made by the
//! runtime's own `RuntimeInstance::census`. One [`HeapCensus`] per traced process; the recorder
//! calls [`HeapCensus::tick`] at every poll and [`HeapCensus::finish`] at the end, while the
//! process still runs.

use leaktrace_analysis::holds::RuntimeHolds;

use crate::runtimes::RuntimeInstance;
use leaktrace_analysis::recording::Runtime;

pub mod census;
pub mod fuzzing;

use census::{CensusOptions, RuntimeCensus};

/// The census of one traced process: one [`RuntimeCensus`] per runtime it ran (a process that
/// exec'd may run two), each made by that runtime's instance (`RuntimeInstance::census`), in the
/// order they were made. Names no runtime.
#[derive(Default)]
pub struct HeapCensus {
    /// `--heap-census` was given (or `--heap-dump` / `--heap-snapshots`).
    on: bool,
    opts: CensusOptions,
    censuses: Vec<(Runtime, Box<dyn RuntimeCensus>)>,
}

impl HeapCensus {
    /// A census that does something only when `on` (`--heap-census`).
    pub fn new(on: bool) -> HeapCensus {
        HeapCensus { on, ..Default::default() }
    }

    /// With `--heap-dump` or `--heap-snapshots` (`dump`): a JVM's heap dump after its last
    /// histogram, a Node process's two heap snapshots.
    pub fn with_dump(self, dump: Option<crate::runtimes::jvm::heapdump::DumpOptions>) -> HeapCensus {
        HeapCensus { on: self.on || dump.is_some(), opts: CensusOptions { dump }, ..self }
    }

    /// The census of `runtime` in process `pid`, made by its instance at the first call
    /// (`at_attach`: at attach, before the probes); None: the runtime has none (then).
    fn census_of(
        &mut self,
        pid: u32,
        runtime: &dyn RuntimeInstance,
        at_attach: bool,
    ) -> Option<&mut Box<dyn RuntimeCensus>> {
        let name = runtime.info().name;
        let i = match self.censuses.iter().position(|(r, _)| *r == name) {
            Some(i) => i,
            None => {
                let c = runtime.census(pid, self.opts, at_attach)?;
                self.censuses.push((name, c));
                self.censuses.len() - 1
            }
        };
        Some(&mut self.censuses[i].1)
    }

    /// At every poll of process `pid` running `runtime` (None: not known yet): start the census
    /// of a runtime newly seen, take or collect its first snapshot. Never blocks on the JVM;
    /// reads Go's memory (milliseconds). `t_s`: seconds since the recording's start.
    pub fn tick(&mut self, pid: u32, runtime: Option<&dyn RuntimeInstance>, t_s: f64, units: Option<u64>) {
        if !self.on {
            return;
        }
        if let Some(c) = runtime.and_then(|r| self.census_of(pid, r, false)) {
            c.tick(t_s, units);
        }
    }

    /// At attach to a running process whose runtime is known: a census its runtime starts now
    /// (Node's sampling heap profiler, waiting for its inspector, at most 10 s), not at the
    /// first poll.
    pub fn attach(&mut self, pid: u32, runtime: Option<&dyn RuntimeInstance>) {
        if !self.on {
            return;
        }
        if let Some(c) = runtime.and_then(|r| self.census_of(pid, r, true)) {
            c.attach();
        }
    }

    /// End of the recording, the probes still in place: every census' last snapshot (`alive`:
    /// the process still runs and may be asked; the JVM's is waited for, at most
    /// `jcmd::TIMEOUT`). `now_s` gives the seconds since the recording's start. Node's is left
    /// to [`HeapCensus::finish_detached`].
    pub fn finish(&mut self, alive: bool, now_s: &dyn Fn() -> f64, units: Option<u64>) {
        for (_, c) in &mut self.censuses {
            c.finish(alive, now_s, units);
        }
    }

    /// After [`HeapCensus::finish`], with `--heap-dump`: a JVM's heap dump, written in `dir`
    /// (the output directory), and the paths from the GC roots to the classes that grew.
    /// `n`: the process's traced blocks, for the off-heap memory its objects own.
    pub fn heap_dump(
        &mut self,
        dir: &std::path::Path,
        alive: bool,
        (now_s, units): (&dyn Fn() -> f64, Option<u64>),
        n: &mut crate::runtimes::jvm::heapdump::Natives<'_>,
    ) {
        for (_, c) in &mut self.censuses {
            c.heap_dump(dir, alive, now_s, units, n);
        }
    }

    /// At a periodic checkpoint, with `--heap-dump`: a runtime's first heap dump, written in
    /// `dir`, when it takes one (the JVM, once its first class histogram was taken); true once
    /// every census took it or has none to take (false before any census was made).
    pub fn first_dump(
        &mut self,
        dir: &std::path::Path,
        (now_s, units): (&dyn Fn() -> f64, Option<u64>),
        n: &mut crate::runtimes::jvm::heapdump::Natives<'_>,
    ) -> bool {
        // No census yet: the runtime is not known yet, asked again at the next checkpoint.
        let mut done = !self.censuses.is_empty();
        for (_, c) in &mut self.censuses {
            done &= c.first_dump(dir, now_s, units, n);
        }
        done
    }

    /// Whether `--heap-dump` was asked.
    pub fn dumps(&self) -> bool {
        self.opts.dump.is_some_and(|d| d.jvm)
    }

    /// Whether a census waits for [`HeapCensus::finish_detached`] (Node's).
    pub fn after_detach(&self) -> bool {
        self.censuses.iter().any(|(_, c)| c.after_detach())
    }

    /// End of the recording, once the probes are detached: Node's last heap snapshot (V8 builds
    /// it with hundreds of thousands of malloc calls, 10–20 times slower under the probes:
    /// docs/benchmarks.md, "What holds it") and its sampling profile; the inspector closed.
    pub fn finish_detached(&mut self, alive: bool, now_s: &dyn Fn() -> f64) {
        for (_, c) in self.censuses.iter_mut().filter(|(_, c)| c.after_detach()) {
            c.finish_detached(alive, now_s);
        }
    }

    /// What the census found, for the recording (None: no census was run).
    pub fn take(&mut self) -> Option<RuntimeHolds> {
        if self.censuses.is_empty() {
            return None;
        }
        let mut holds = RuntimeHolds::default();
        for (_, c) in self.censuses.drain(..) {
            c.take(&mut holds);
        }
        Some(holds)
    }
}
