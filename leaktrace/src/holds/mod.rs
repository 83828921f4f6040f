//! "What holds it" from the runtimes' own heap tools, driven from outside (`record
//! --heap-census`, issue 33): the JVM's class histogram ([`jvm`]) and Go's goroutines ([`go`]) and heap profile ([`goheap`]),
//! each taken once near the start of the recording and once at its end; the analysis
//! (`leaktrace_analysis::holds`) says what grew between the two. One [`HeapCensus`] per traced
//! process; the recorder calls [`HeapCensus::tick`] at every poll and [`HeapCensus::finish`]
//! at the end, while the process still runs.

use leaktrace_analysis::holds::RuntimeHolds;

use crate::recording::Runtime;

pub mod go;
pub mod goheap;
pub mod heapdump;
pub mod hprof;
pub mod jvm;
pub mod node;
pub mod node_snapshots;
pub mod nodedom;
pub mod nodesnap;

/// The census of one traced process.
#[derive(Default)]
pub struct HeapCensus {
    /// `--heap-census` was given.
    on: bool,
    jvm: Option<jvm::JvmCensus>,
    go: Option<go::GoCensus>,
    node: Option<node::NodeCensus>,
    /// `--heap-dump` (JVM) and what it found.
    dump: Option<heapdump::DumpOptions>,
    dumped: Option<leaktrace_analysis::holds::HeapPaths>,
}

impl HeapCensus {
    /// A census that does something only when `on` (`--heap-census`).
    pub fn new(on: bool) -> HeapCensus {
        HeapCensus { on, ..Default::default() }
    }

    /// The Node census of `pid`, made at the first call (with `--heap-snapshots`' limit).
    fn node_census(&mut self, pid: u32) -> &mut node::NodeCensus {
        let max = self.dump.filter(|d| d.node).map(|d| d.max_bytes);
        self.node.get_or_insert_with(|| {
            let mut n = node::NodeCensus::new(pid);
            n.snapshot_max = max;
            n
        })
    }

    /// With `--heap-dump` or `--heap-snapshots` (`dump`): a JVM's heap dump after its last
    /// histogram, a Node process's two heap snapshots.
    pub fn with_dump(self, dump: Option<heapdump::DumpOptions>) -> HeapCensus {
        HeapCensus { on: self.on || dump.is_some(), dump, ..self }
    }

    /// After [`HeapCensus::finish`], with `--heap-dump`: a JVM's heap dump, written in `dir`
    /// (the output directory), and the paths from the GC roots to the classes that grew.
    pub fn heap_dump(&mut self, dir: &std::path::Path, alive: bool, now_s: &dyn Fn() -> f64, units: Option<u64>) {
        let (Some(o), Some(j)) = (self.dump.filter(|d| d.jvm), self.jvm.as_mut()) else { return };
        if alive {
            self.dumped = j.heap_dump(dir, o, now_s, units);
        }
    }

    /// At every poll of process `pid` running `runtime` (None: not known yet): start the census
    /// of a runtime newly seen, take or collect its first snapshot. Never blocks on the JVM;
    /// reads Go's memory (milliseconds). `t_s`: seconds since the recording's start.
    pub fn tick(&mut self, pid: u32, runtime: Option<Runtime>, t_s: f64, units: Option<u64>) {
        if !self.on {
            return;
        }
        match runtime {
            Some(Runtime::Jvm) => self.jvm.get_or_insert_with(|| jvm::JvmCensus::new(pid)).tick(t_s, units),
            Some(Runtime::Go) => self.go.get_or_insert_with(|| go::GoCensus::new(pid)).tick(t_s, units),
            Some(Runtime::Node) => self.node_census(pid).tick(),
            _ => {}
        }
    }

    /// At attach to a running process whose runtime is known: Node's sampling heap profiler is
    /// started now (waiting for its inspector, at most 10 s), not at the first poll.
    pub fn attach(&mut self, pid: u32, runtime: Option<Runtime>) {
        if self.on && runtime == Some(Runtime::Node) {
            self.node_census(pid).start_at_attach();
        }
    }

    /// End of the recording, the probes still in place: the JVM's and Go's last snapshots
    /// (`alive`: the process still runs and may be asked; the JVM's is waited for, at most
    /// `jcmd::TIMEOUT`). `now_s` gives the seconds since the recording's start. Node's is left
    /// to [`HeapCensus::finish_node`].
    pub fn finish(&mut self, alive: bool, now_s: &dyn Fn() -> f64, units: Option<u64>) {
        if let Some(j) = self.jvm.as_mut() {
            j.finish(alive, now_s, units);
        }
        if let Some(g) = self.go.as_mut() {
            g.finish(alive, now_s(), units);
        }
    }

    /// Whether a Node census waits for [`HeapCensus::finish_node`].
    pub fn has_node(&self) -> bool {
        self.node.is_some()
    }

    /// End of the recording, once the probes are detached: Node's last heap snapshot (V8 builds
    /// it with hundreds of thousands of malloc calls, 10–20 times slower under the probes:
    /// docs/benchmarks.md, "What holds it") and its sampling profile; the inspector closed.
    pub fn finish_node(&mut self, alive: bool, now_s: &dyn Fn() -> f64) {
        if let Some(n) = self.node.as_mut() {
            n.finish(alive, now_s);
        }
    }

    /// What the census found, for the recording (None: no census was run).
    pub fn take(&mut self) -> Option<RuntimeHolds> {
        let jvm = self.jvm.take().map(|j| j.census);
        let go = self.go.take().map(|g| g.census);
        let node_snapshots = self.node.as_mut().and_then(|n| n.snapshots.take());
        let node = self.node.take().map(|n| n.census);
        let jvm_heap_dump = self.dumped.take();
        (jvm.is_some() || go.is_some() || node.is_some()).then_some(RuntimeHolds {
            jvm,
            go,
            node,
            jvm_heap_dump,
            node_snapshots,
        })
    }
}
