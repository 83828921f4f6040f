//! Node.js detection: a mapped node, nodejs or libnode.so that exports N-API. The frame rules
//! are in `leaktrace_analysis::runtimes::node`.
//!
//! The V8 heap's trend comes from its full collections, seen by two uprobes on V8's own
//! functions (node's binary keeps its C++ symbols), with no inspector and no flag on the
//! target: `MarkCompactCollector::Finish()` marks the end of a mark-compact of the main isolate,
//! and the `MemoryController<V8HeapTrait>::CalculateAllocationLimit(heap, current_size, …)` call
//! that follows it in the same pause (`Heap::RecomputeLimits`) carries `current_size`, the old
//! generation's size of objects once the collection's dead bytes are taken off, the base V8
//! itself sets its next limit from. One point per mark-compact, placed at the time it ran, as
//! the JVM's hsperfdata and Go's `heapMarked` give theirs (`leaktrace_analysis::analyze::managed`).
//! V8 versions without both symbols (the limit computation was renamed after V8 11) are said in
//! one line, and their heap is measured from its pages as before.

use std::path::{Path, PathBuf};

pub mod cdp;
pub mod census;
pub mod dom;
pub mod guard;
pub mod snap;
pub mod snapshots;

use leaktrace_analysis::runtimes::node::is_node_object;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use super::{RuntimeInfo, RuntimeInstance, RuntimeOptions, file_name};
use crate::holds::census::{CensusOptions, RuntimeCensus};
use crate::objects::MappedObject;
use crate::probes::Tracer;
use leaktrace_analysis::analyze::managed::MARKED_BY_LAST_GC;
use leaktrace_analysis::recording::{ManagedHeap, Runtime};

/// `v8::internal::MarkCompactCollector::Finish()`.
const FINISH: &str = "_ZN2v88internal20MarkCompactCollector6FinishEv";
/// `v8::internal::MemoryController<v8::internal::V8HeapTrait>::CalculateAllocationLimit(
/// v8::internal::Heap*, unsigned long, …`: the heap, then the current size.
const LIMIT_PREFIX: &str =
    "_ZN2v88internal16MemoryControllerINS0_11V8HeapTraitEE24CalculateAllocationLimitEPNS0_4HeapEm";

/// Detect Node: a mapped object named node/nodejs/libnode.so that exports N-API.
pub fn detect(_pid: u32, objects: &[MappedObject]) -> Option<RuntimeInfo> {
    node_object(objects).map(|obj| RuntimeInfo {
        name: Runtime::Node,
        version: None,
        notes: vec![format!(
            "Node.js runtime detected ({}): managed = V8 heap pages (resident bytes), its trend judged \
             on what each mark-compact left; off-heap = ArrayBuffer/Buffer backing stores; native = \
             malloc from addons",
            obj.path.display()
        )],
    })
}

/// The object that holds V8: node, nodejs or libnode.so exporting N-API.
fn node_object(objects: &[MappedObject]) -> Option<&MappedObject> {
    objects.iter().find(|o| {
        is_node_object(&file_name(&o.path))
            && crate::discover::function_offsets(&o.open_path, &["napi_create_object"]).is_ok_and(|m| !m.is_empty())
    })
}

/// File offsets of the two GC functions in `path` (`FINISH`, then the first symbol starting with
/// `LIMIT_PREFIX`); an error says which is missing.
fn gc_offsets(path: &Path) -> Result<(u64, u64), String> {
    let data = object::ReadCache::new(std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
    let file = object::File::parse(&data).map_err(|e| format!("{}: not an ELF object: {e}", path.display()))?;
    let (mut finish, mut limit) = (None, None);
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.is_undefined() || sym.kind() != object::SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let slot = if name == FINISH {
            &mut finish
        } else if name.starts_with(LIMIT_PREFIX) {
            &mut limit
        } else {
            continue;
        };
        if slot.is_some() {
            continue;
        }
        let Some(section) = sym.section_index().and_then(|i| file.section_by_index(i).ok()) else { continue };
        let Some((file_off, _)) = section.file_range() else { continue };
        *slot = Some(sym.address() - section.address() + file_off);
        if finish.is_some() && limit.is_some() {
            break;
        }
    }
    match (finish, limit) {
        (Some(f), Some(l)) => Ok((f, l)),
        (None, _) => Err("no symbol v8::internal::MarkCompactCollector::Finish()".into()),
        (_, None) => {
            Err("no symbol v8::internal::MemoryController<V8HeapTrait>::CalculateAllocationLimit(Heap*, size_t, …)"
                .into())
        }
    }
}

/// Node.js ([`super::RuntimeDetector`]).
pub struct Node;

impl super::RuntimeDetector for Node {
    fn detect(&self, pid: u32, objects: &[MappedObject], _opts: RuntimeOptions) -> Option<Box<dyn RuntimeInstance>> {
        let info = detect(pid, objects)?;
        Some(Box::new(NodeInstance { info, pid, gc: Gc::NotYet }))
    }
}

/// Whether the process's full collections are seen.
enum Gc {
    /// The probes are not placed yet (at the first sync of its objects).
    NotYet,
    /// Seen, by the probes placed in this object.
    Watched(PathBuf),
    /// Not seen (said once in the warnings).
    Unseen,
}

/// Node in one process: its JIT frames are named from the perf map node writes itself; its
/// full collections are seen by uprobes on V8.
struct NodeInstance {
    info: RuntimeInfo,
    pid: u32,
    gc: Gc,
}

impl RuntimeInstance for NodeInstance {
    fn info(&self) -> &RuntimeInfo {
        &self.info
    }

    /// At the first sync: the GC probes in the object holding V8.
    fn sync_mappings(&mut self, tracer: &mut Tracer, objects: &[MappedObject], warnings: &mut Vec<String>) {
        if !matches!(self.gc, Gc::NotYet) {
            return;
        }
        let Some(obj) = node_object(objects) else { return };
        let placed = gc_offsets(&obj.open_path).and_then(|(finish, limit)| {
            tracer.attach_gc_probes(self.pid, &obj.open_path, finish, limit).map_err(|e| format!("{e:#}"))
        });
        self.gc = match placed {
            Ok(()) => Gc::Watched(obj.path.clone()),
            Err(why) => {
                tracer.unwatch_gc(self.pid);
                warnings.push(format!(
                    "the V8 heap's mark-compacts cannot be seen in {} ({why}; supported: Node 12 to 21, V8 7.6 to \
                     11.x): its trend is measured from its pages, garbage between collections included",
                    obj.path.display()
                ));
                Gc::Unseen
            }
        };
    }

    /// What the last mark-compact of the main isolate left (V8's old generation's size of
    /// objects), the mark-compacts measured so far and when the last ran: figures beside the
    /// heap's pages (which stay its occupied part), the heap's trend judged on them.
    fn heap(&mut self, kernel: &dyn super::KernelFigures) -> Option<ManagedHeap> {
        let Gc::Watched(path) = &self.gc else { return None };
        let (g, ago) = kernel.gc_full(self.pid)?;
        let mut heap = ManagedHeap {
            used_bytes: g.bytes,
            source: format!("V8's old generation after its last mark-compact (uprobes in {})", path.display()),
            collections: Some(g.measured),
            last_collection_ago_s: (g.measured > 0).then_some(ago),
            figures_only: true,
            ..Default::default()
        };
        heap.spaces.insert(MARKED_BY_LAST_GC.into(), g.bytes);
        Some(heap)
    }

    fn detach(&mut self, tracer: &mut Tracer) {
        tracer.unwatch_gc(self.pid);
    }

    /// Its sampling heap profile (and `--heap-snapshots`), started at attach to a running
    /// process (before its probes), else at the first poll; ended once the probes are detached.
    fn census(&self, pid: u32, opts: CensusOptions, _at_attach: bool) -> Option<Box<dyn RuntimeCensus>> {
        Some(crate::holds::census::node(pid, opts))
    }

    fn unnamed_jit_advice(&self) -> Option<String> {
        Some(
            "JIT frames (JavaScript) are unnamed: start node with --perf-basic-prof (or \
             --perf-basic-prof-only-functions) so it writes /tmp/perf-PID.map, which leaktrace reads"
                .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node this machine runs (setup installs Node 20) has both GC functions.
    #[test]
    fn node_has_the_gc_functions() {
        let Some(node) = ["/usr/bin/node", "/usr/local/bin/node"].into_iter().map(Path::new).find(|p| p.exists())
        else {
            return;
        };
        let (finish, limit) = gc_offsets(node).expect("GC functions");
        assert!(finish > 0 && limit > 0 && finish != limit);
        assert!(gc_offsets(Path::new("/bin/true")).unwrap_err().contains("MarkCompactCollector"));
    }
}
