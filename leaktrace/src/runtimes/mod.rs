//! Managed runtimes (Python, JVM, Go, Node): detection, and the rules that tell the runtime's
//! managed heap apart from native allocations and off-heap mappings.
//!
//! Runtime knowledge lives here, in one module per runtime, not in conditionals across the code.
//! The recorder calls [`detect`] on the target's mapped objects and, at every checkpoint, the
//! [`HeapGauge`] of the runtime if it has one (the JVM's hsperfdata). Site classification
//! ([`classify_site`]) is a pure function of a recorded stack, applied at analysis time.

use crate::discover::MappedObject;
use crate::recording::{ManagedHeap, Stack};

/// What kind of memory a site holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryKind {
    /// The runtime's managed heap (Python objects, Java heap, Go heap, V8 heap).
    Managed,
    /// malloc-family allocations from native code (C extensions, JNI, cgo, addons, plain C).
    Native,
    /// Memory outside the allocator and the managed heap: anonymous mappings, direct buffers,
    /// ArrayBuffer backing stores.
    OffHeap,
    /// The runtime's own bookkeeping (JVM's native memory, interpreter internals).
    Runtime,
}

/// The runtime of a target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// "python", "jvm", "go", "node", or "native" (none detected).
    pub name: String,
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

/// Detect the runtime of `pid` from the objects it maps (and its executable).
pub fn detect(_pid: u32, _objects: &[MappedObject]) -> Option<RuntimeInfo> {
    None
}

/// The heap gauge of a detected runtime, if it has one.
pub fn gauge(_pid: u32, _runtime: &RuntimeInfo) -> Option<Box<dyn HeapGauge>> {
    None
}

/// Classify a recorded site of a target running `runtime` ("native" when none).
pub fn classify_site(_runtime: &str, stack: &Stack) -> MemoryKind {
    match stack.kind.as_str() {
        "mmap" => MemoryKind::OffHeap,
        _ => MemoryKind::Native,
    }
}
