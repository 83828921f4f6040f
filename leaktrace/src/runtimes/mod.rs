//! Managed runtimes (Python, JVM, Go, Node) in a live target, the agent's side: which one it
//! runs (from the objects it maps and its executable) and, per process, the runtime's own state.
//! The rules that classify recorded stacks by runtime are in `leaktrace_analysis::runtimes`.
//!
//! As the OpenTelemetry eBPF profiler keeps its interpreters (`interpreter/types.go`: a loader
//! per ELF, an instance per process with its own symbolization, metrics and detach): each
//! runtime is one module with one [`RuntimeDetector`] value, listed in [`RUNTIMES`], whose
//! `detect` returns a [`RuntimeInstance`] for the process. The instance owns what the runtime
//! keeps for that process: its heap gauge (the JVM's hsperfdata), the frames it adds to stacks
//! (CPython's, read by the kernel), its diagnostic commands (the JVM's [`jcmd`] and perf map,
//! `--jvm-perf-map`), its "what holds it" census (`--heap-census`, `crate::holds::census`), and
//! what it takes out of the kernel's maps when the process leaves it. The recorder
//! (`record/traced/runtime.rs`, `holds::HeapCensus`) calls the instance and names no runtime.

use std::path::Path;
use std::sync::Arc;

use crate::holds::census::{CensusOptions, RuntimeCensus};
use crate::objects::MappedObject;
use crate::probes::Tracer;
use crate::symbolize::StackSymbolizer;
use leaktrace_analysis::recording::{Frame, ManagedHeap, Runtime, Stack};

pub mod go;
pub mod jvm;
pub mod node;
pub mod python;

/// The runtime of a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// Which runtime.
    pub name: Runtime,
    /// Version when known (e.g. "3.11").
    pub version: Option<String>,
    /// Notes for the report (e.g. PYTHONMALLOC=malloc changes the picture).
    pub notes: Vec<String>,
}

/// Samples a runtime's own figure for its managed heap.
pub trait HeapGauge: Send {
    /// The managed heap now; None when it cannot be read (process gone, file missing).
    fn sample(&mut self) -> Option<ManagedHeap>;
}

/// What the kernel side counted for a runtime, read at a checkpoint (the tracer's maps).
pub trait KernelFigures {
    /// The full collections of process `tgid` seen by the GC probes, and seconds since the
    /// last one's size was read; None when they are not watched.
    fn gc_full(&self, tgid: u32) -> Option<(leaktrace_common::GcFull, f64)>;
}

impl KernelFigures for Tracer {
    fn gc_full(&self, tgid: u32) -> Option<(leaktrace_common::GcFull, f64)> {
        Tracer::gc_full(self, tgid)
    }
}

/// What the recording asks of the runtimes (from `RecordOptions`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RuntimeOptions {
    /// CPython's allocator API is hooked (`--pymalloc`): changes what the Python notes say.
    pub pymalloc: bool,
    /// The kernel is to read CPython's frames at allocations (`--python-frames`).
    pub python_frames: bool,
    /// leaktrace may run jcmd on a JVM target for its perf map (`--jvm-perf-map`).
    pub jvm_perf_map: bool,
}

/// One managed runtime's side in the agent, as a loader: how a live target is recognised as
/// running it. One value per runtime, in its module, listed in [`RUNTIMES`].
pub trait RuntimeDetector: Sync {
    /// The runtime of `pid` when the objects it maps (or its executable, the first of them) are
    /// this runtime's, as an instance that keeps its state for that process; None otherwise.
    fn detect(&self, pid: u32, objects: &[MappedObject], opts: RuntimeOptions) -> Option<Box<dyn RuntimeInstance>>;
}

/// A runtime found in one traced process (as the OpenTelemetry eBPF profiler's interpreter
/// `Instance`): what it is, its own heap gauge, the frames it adds to stacks, the work it does
/// at every poll and at the end (the JVM's jcmd and perf map), and what it takes back from the
/// kernel's maps when the process leaves it (an exec). The recorder calls these and knows no
/// runtime by name; every method but [`RuntimeInstance::info`] has a default that does nothing.
/// Notes for the report are pushed onto `warnings` (the recording's warnings, in order).
pub trait RuntimeInstance: Send {
    /// Which runtime, its version and the notes of its detection.
    fn info(&self) -> &RuntimeInfo;

    /// Right after detection, and at every rescan of the process's objects (`objects`, all it
    /// maps now): set up what needs the objects (CPython's frames read by the kernel, the JVM's
    /// jcmd).
    fn sync_mappings(&mut self, _tracer: &mut Tracer, _objects: &[MappedObject], _warnings: &mut Vec<String>) {}

    /// A stack is seen for the first time: put the runtime's own frames into the native
    /// `frames` (symbolized, innermost first) of kernel stack `stack` (its key in the kernel's
    /// STACKS map, 0 = no stack). True when frames of the runtime were added (the stack is then
    /// not merged with its native twin).
    fn symbolize(
        &mut self,
        _tracer: &Tracer,
        _stack: u64,
        _frames: &mut Vec<Arc<Frame>>,
        _symbolizer: &mut StackSymbolizer,
        _warnings: &mut Vec<String>,
    ) -> bool {
        false
    }

    /// The runtime's own figure for its managed heap, sampled at every checkpoint; None: not
    /// measured so (the heap is then measured from its sites).
    fn heap(&mut self, _kernel: &dyn KernelFigures) -> Option<ManagedHeap> {
        None
    }

    /// At every poll of the session loop (never blocks).
    fn tick(&mut self, _p: Process<'_>) {}

    /// The recording ends (`running`: the process still runs): last work with the runtime, then
    /// JIT frames named from the perf map as it is now. The default only names them.
    fn finish(&mut self, p: Process<'_>, _running: bool) {
        p.symbolizer.name_jit_frames(p.stacks);
    }

    /// JIT frames stayed unnamed and no perf map was read: what to run the runtime with so they
    /// are named; None: nothing to say.
    fn unnamed_jit_advice(&self) -> Option<String> {
        None
    }

    /// The process leaves the runtime (it exec'd): take its entries out of the kernel's maps.
    fn detach(&mut self, _tracer: &mut Tracer) {}

    /// `--heap-census`: the runtime's "what holds it" census of process `pid`, asked once at
    /// attach to a running process (`at_attach`, before its probes: a census that must start
    /// then) and at every poll until one is made; None: no census (now).
    fn census(&self, _pid: u32, _opts: CensusOptions, _at_attach: bool) -> Option<Box<dyn RuntimeCensus>> {
        None
    }
}

/// The parts of a traced process a runtime instance works on at a poll and at the end.
pub struct Process<'a> {
    /// The recording's stacks, by id.
    pub stacks: &'a mut Vec<Stack>,
    /// The process's symbolizer (its perf map names JIT frames).
    pub symbolizer: &'a mut StackSymbolizer,
    /// The recording's warnings.
    pub warnings: &'a mut Vec<String>,
}

impl Process<'_> {
    /// The same parts, borrowed again for a call that takes them by value.
    pub fn reborrow(&mut self) -> Process<'_> {
        Process { stacks: self.stacks, symbolizer: self.symbolizer, warnings: self.warnings }
    }
}

/// The runtimes, in the order they are tried: JVM, Python, Node, Go (a JVM or Node embedding
/// Python is rare; a Go program never maps libjvm or libpython). A new runtime is one module
/// and one line here.
pub const RUNTIMES: &[&dyn RuntimeDetector] = &[&jvm::Jvm, &python::Python, &node::Node, &go::Go];

/// Detect the runtime of `pid` from the objects it maps (and its executable): the first of
/// [`RUNTIMES`] that recognises it wins.
pub fn detect(pid: u32, objects: &[MappedObject], opts: RuntimeOptions) -> Option<Box<dyn RuntimeInstance>> {
    RUNTIMES.iter().find_map(|r| r.detect(pid, objects, opts))
}

/// A frame in code outside any mapped file (JIT code) that has no name yet.
pub fn unnamed_jit(f: &Frame) -> bool {
    f.object.is_none() && f.function.is_none()
}

/// Last path component of `path`.
pub(crate) fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
