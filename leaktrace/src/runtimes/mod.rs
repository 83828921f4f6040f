//! Managed runtimes (Python, JVM, Go, Node) in a live target: which one it runs (from the
//! objects it maps and its executable) and, for the JVM, the gauge of its managed heap sampled at
//! every checkpoint. The rules that classify recorded stacks by runtime are in
//! `leaktrace_analysis::runtimes`; the recorder calls [`detect`] on the target's mapped objects
//! and, at every checkpoint, the [`HeapGauge`] of the runtime if it has one. Each runtime is one
//! module with one [`RuntimeDetector`] value, listed in [`RUNTIMES`]. With
//! `--jvm-perf-map`, [`jcmd`] runs the JVM's diagnostic commands (its perf map, its flags).

use std::path::Path;

use crate::objects::MappedObject;
use crate::recording::{ManagedHeap, Runtime};

pub mod go;
pub mod gostats;
pub mod jcmd;
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

/// One managed runtime's side in the agent: how a live target is recognised as running it, and
/// the gauge of its managed heap if it has one. One value per runtime, in its module.
pub trait RuntimeDetector: Sync {
    /// Which runtime this is.
    fn runtime(&self) -> Runtime;

    /// The runtime of `pid` when the objects it maps (or its executable) are this runtime's;
    /// None otherwise. `pymalloc`: CPython's allocator API is hooked (`--pymalloc`).
    fn detect(&self, pid: u32, objects: &[MappedObject], pymalloc: bool) -> Option<RuntimeInfo>;

    /// The gauge of its managed heap, sampled at every checkpoint; None (the default): the heap
    /// is measured from its sites.
    fn gauge(&self, _pid: u32) -> Option<Box<dyn HeapGauge>> {
        None
    }
}

/// The runtimes, in the order they are tried: JVM, Python, Node, Go (a JVM or Node embedding
/// Python is rare; a Go program never maps libjvm or libpython). A new runtime is one line here.
pub const RUNTIMES: &[&dyn RuntimeDetector] = &[&jvm::Jvm, &python::Python, &node::Node, &go::Go];

/// Detect the runtime of `pid` from the objects it maps (and its executable): the first of
/// [`RUNTIMES`] that recognises it wins. `pymalloc`: CPython's allocator API is hooked
/// (`--pymalloc`), which changes what the Python notes say.
pub fn detect(pid: u32, objects: &[MappedObject], pymalloc: bool) -> Option<RuntimeInfo> {
    RUNTIMES.iter().find_map(|r| r.detect(pid, objects, pymalloc))
}

/// The heap gauge of a detected runtime, if it has one.
pub fn gauge(pid: u32, runtime: &RuntimeInfo) -> Option<Box<dyn HeapGauge>> {
    RUNTIMES.iter().find(|r| r.runtime() == runtime.name)?.gauge(pid)
}

/// Last path component of `path`.
pub(crate) fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
