//! "What holds it" for the managed runtimes whose own heap tools leaktrace drives from outside
//! (`record --heap-census`): the JVM's class histogram (`jcmd PID GC.class_histogram`)
//! and Go's goroutines and heap profile (read from the runtime's `allgs` and `mbuckets` through
//! /proc/PID/mem), each taken at the
//! start and at the end of the recording, and what grew between the two, per second and per unit
//! of work. The model of `recording.json`'s `runtime_holds` and the growth computed from it;
//! rendered by `report/holds.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::retain::{RetainPath, RootKind};

/// Classes kept of one histogram (the largest by bytes); the rest are summed in its totals.
pub const MAX_CLASSES: usize = 1000;

/// Everything the runtimes' own tools said (`record --heap-census`); one member per runtime.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RuntimeHolds {
    /// The JVM's class histograms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jvm: Option<Census<ClassHistogram>>,
    /// Go's goroutines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub go: Option<Census<Goroutines>>,
    /// Node's sampling heap profile: one snapshot, `end` (it covers the recording from the
    /// moment sampling started, `JsSampling::started_t_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Census<JsSampling>>,
    /// `--heap-dump`: the JVM's heap dump taken after the last histogram, and the paths from
    /// the GC roots to the instances of the classes that grew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jvm_heap_dump: Option<HeapPaths>,
    /// `--heap-dump`: the JVM's first heap dump, early in the recording (its off-heap
    /// retainers, against which the last dump's are compared; no paths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jvm_first_dump: Option<HeapPaths>,
    /// `--heap-snapshots`: Node's two heap snapshots and the objects new in the second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_snapshots: Option<JsSnapshots>,
}

/// Two V8 heap snapshots (`HeapProfiler.takeHeapSnapshot` over the inspector, at attach and at
/// the end): the objects of the second that were not in the first (V8 keeps an object's id
/// across the snapshots of one process), by constructor.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JsSnapshots {
    /// When each was taken; `took_s`: the snapshot's whole time (the process is paused while
    /// V8 writes it).
    pub first: Taken,
    pub second: Taken,
    /// Nodes (objects) in each snapshot.
    pub objects_first: u64,
    pub objects_second: u64,
    /// JS heap used before each snapshot (`Runtime.getHeapUsage`), bytes.
    pub heap_used_first: u64,
    pub heap_used_second: u64,
    /// Objects new in the second by constructor, most new objects first (at most 50).
    pub new_objects: Vec<JsNewObjects>,
    /// The shortest path from the GC roots to one new instance of the top growing constructor
    /// (the first in `new_objects` not named in parentheses by V8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<RetainerPath>,
    /// The object that holds that instance on the path (its last step before it: the array of
    /// `auditTrail (Array) → [17] → AuditEntry`), in the second snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<JsHolder>,
    /// Where each snapshot's time went (first, second); empty in recordings made before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub costs: Vec<SnapshotCost>,
}

/// The object holding the top growing constructor's instance on the retainer path.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JsHolder {
    /// As the path names it: `auditTrail (Array)` (the edge it is reached by, its class).
    pub name: String,
    /// Its self size and its retained size (itself and every object it dominates: what would
    /// be freed with it; computed from the second snapshot's dominator tree as Chrome DevTools
    /// computes it), bytes.
    pub self_bytes: u64,
    pub retained_bytes: u64,
    /// Instances of the top growing constructor it refers to directly (all of them, not only
    /// the new ones), and their retained sizes summed (bytes).
    pub instances: u64,
    pub instances_retained_bytes: u64,
}

/// One heap snapshot's costs, timed by leaktrace (seconds) over the inspector connection.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SnapshotCost {
    /// From sending `HeapProfiler.takeHeapSnapshot` to V8's first chunk: V8 stopping the
    /// program and building the snapshot graph (and the command waiting for the main thread).
    pub first_chunk_s: f64,
    /// From the first chunk to the command's answer: V8 writing the JSON (the program still
    /// stopped) while the chunks cross the connection.
    pub transfer_s: f64,
    /// The snapshot's JSON, bytes, and the chunks it came in.
    pub bytes: u64,
    pub chunks: u64,
    /// leaktrace parsing the JSON, then analysing it (ids, constructors; for the second, the
    /// dominator tree, retained sizes and the retainer path): the program runs meanwhile.
    pub parse_s: f64,
    pub analyse_s: f64,
}

/// Objects of one constructor new in the second snapshot.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JsNewObjects {
    /// The constructor's name (`AuditEntry`, `Array`, `Object`), or V8's label for other nodes
    /// (`(string)`, `(closure)`, `(array)`, `(system)`, ...).
    pub constructor: String,
    /// New objects and their shallow (self) bytes.
    pub count: u64,
    pub self_bytes: u64,
    /// The new objects' retained size (bytes, from the second snapshot's dominator tree, as
    /// Chrome DevTools computes it): each one's own bytes and those of the objects only it keeps
    /// alive, a new object dominated by another new one of the constructor counted once. 0 in
    /// recordings made before.
    #[serde(default)]
    pub retained_bytes: u64,
    /// Objects of the constructor in each snapshot.
    pub count_first: u64,
    pub count_second: u64,
}

/// Paths from GC roots to the instances of the classes that grew, read from one heap dump
/// (`record --heap-dump`: the JVM's HPROF file written by `jcmd PID GC.heap_dump`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HeapPaths {
    /// When the dump was asked for and how long the tool ran (jcmd: the whole dump, an upper
    /// bound of the JVM's pause, which includes a full GC).
    pub taken: Taken,
    /// The dump's size, bytes.
    pub file_bytes: u64,
    /// Where the dump was kept (`--keep-heap-dump`); None: deleted after parsing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
    /// Objects in the dump (instances, arrays, classes).
    pub objects: u64,
    /// Seconds leaktrace took to parse the dump and find the paths.
    pub parse_s: f64,
    /// One per class asked about (the classes that grew most), in that order.
    pub paths: Vec<RetainerPath>,
    /// The GC roots' objects that retain off-heap memory: traced native blocks owned by direct
    /// buffers (`java.nio.Buffer.address` matched to a live block), most off-heap bytes first;
    /// `container` names the root (`App.BUFFERS`). Empty without traced blocks (growth or
    /// sampled mode) or direct buffers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retainers: Vec<crate::retain::Retained>,
}

/// The shortest path from a GC root to one instance of a class, for the root that holds most
/// of the class's instances.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RetainerPath {
    /// The class as Java spells it (`HoldsJvm$AuditRecord`, `byte[]`).
    pub class: String,
    /// Its instances in the dump.
    pub instances: u64,
    /// Those whose shortest path from a GC root starts at this path's root.
    pub held: u64,
    /// `static field`, `JNI global`, `thread local`, `thread`, `system class`, `monitor`, ...
    pub root_kind: String,
    /// The steps from the root to the instance: the root (`HoldsJvm.AUDIT`), then the field or
    /// array each object refers through (`java.util.ArrayList.elementData`,
    /// `java.lang.Object[]`), then the class of the instance.
    pub path: Vec<String>,
}

impl RetainerPath {
    /// The path in words: `HoldsJvm.AUDIT → java.util.ArrayList.elementData → … → Record`.
    pub fn describe(&self) -> String {
        self.path.join(" → ")
    }

    /// The path as a [`RetainPath`] of `runtime` (`jvm`, `node`): the root by its kind, then
    /// fields, indices and the objects they lead to.
    pub fn retain_path(&self, runtime: &str) -> RetainPath {
        let kind = match self.root_kind.as_str() {
            "static field" => RootKind::StaticField,
            "JNI global" | "JNI local" => RootKind::JniReference,
            "thread local" | "thread" | "thread block" | "native stack" => RootKind::ThreadLocal,
            _ => RootKind::GcRoot,
        };
        RetainPath::of_labels(runtime, kind, &self.path)
    }
}

/// V8's sampling heap profile (`HeapProfiler.getSamplingProfile` over the inspector): the
/// objects sampled since `HeapProfiler.startSampling` that are still alive, by the JS function
/// that allocated them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JsSampling {
    /// When the profile was read.
    pub taken: Taken,
    /// When sampling started, seconds since the recording's first checkpoint.
    pub started_t_s: f64,
    /// Mean bytes between samples (`samplingInterval`).
    pub sampling_interval: u64,
    /// Live sampled bytes by allocating function, most first (V8's estimate, scaled from the
    /// samples).
    pub functions: Vec<JsFunction>,
    /// Sum over every node of the profile.
    pub total_bytes: u64,
}

/// Live bytes allocated under one JS function (the top frame of the allocation stack).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct JsFunction {
    /// `recordAudit`, `(anonymous)`, or V8's own labels (`(V8 API)`, `(BYTECODE_COMPILER)`).
    pub function: String,
    /// Script URL and line (1-based) of the function, when it has one.
    pub url: String,
    pub line: u32,
    pub live_bytes: u64,
    /// Its callers' names, innermost first (of the stack that held most bytes).
    pub stack: Vec<String>,
}

/// Two snapshots of one runtime's own view, at the start and at the end of the recording.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Census<T> {
    /// The first snapshot (None: it could not be taken, see `errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<T>,
    /// The last snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<T>,
    /// Why a snapshot is missing or partial, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl<T> Default for Census<T> {
    fn default() -> Self {
        Census { start: None, end: None, errors: Vec::new() }
    }
}

/// When a snapshot was taken.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Taken {
    /// Seconds since the recording's first checkpoint, when the answer came.
    pub t_s: f64,
    /// How long the tool took, seconds (jcmd: its whole run, an upper bound of the JVM's pause;
    /// Go: the memory reads, with no pause).
    pub took_s: f64,
    /// Units of work done by then (`--work-probe`), from the last checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub units_of_work: Option<u64>,
}

/// `jcmd PID GC.class_histogram`: the live objects by class after a full GC.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClassHistogram {
    pub taken: Taken,
    /// Largest classes by bytes, at most [`MAX_CLASSES`].
    pub classes: Vec<ClassCount>,
    /// The histogram's `Total` line: every instance and byte, kept classes or not.
    pub total_instances: u64,
    pub total_bytes: u64,
}

/// One line of a class histogram.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ClassCount {
    /// The class as Java spells it (`byte[]`, `java.lang.Object[]`, `HoldsJvm$AuditRecord`).
    pub class: String,
    /// Live instances.
    pub instances: u64,
    /// Their shallow size, bytes (the histogram's `#bytes`).
    pub bytes: u64,
}

/// Goroutines of a Go process, grouped.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Goroutines {
    pub taken: Taken,
    /// Goroutines not dead (`_Gdead` ones are kept for reuse by the runtime and not counted).
    pub total: u64,
    /// Their stacks' bytes (`stack.hi - stack.lo`).
    pub stack_bytes: u64,
    /// By (state, wait reason, start function), largest count first.
    pub groups: Vec<GoroutineGroup>,
    /// The runtime's own heap profile (`runtime.mbuckets`), in use by Go function, most bytes
    /// first; empty when the program does not profile (`runtime.MemProfileRate` 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heap: Vec<GoHeapSite>,
    /// `runtime.MemProfileRate` when read: one sample per this many bytes allocated on
    /// average (0: the heap profile is off; the linker turns it off in a program that never
    /// references `runtime.MemProfile`).
    #[serde(default)]
    pub mem_profile_rate: u64,
    /// The typed walk of the heap from the package variables (None: not walked, see the
    /// census' errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk: Option<GoWalk>,
}

/// One typed walk of the Go heap from the package-level variables (their DWARF types).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GoWalk {
    /// The largest roots by retained bytes (at most 100).
    pub roots: Vec<GoRoot>,
    /// Package variables walked (holding pointers), objects and bytes reached from them all.
    pub roots_walked: u64,
    pub objects: u64,
    pub bytes: u64,
    /// Objects reached from two roots or more (counted to none).
    pub shared_objects: u64,
    pub shared_bytes: u64,
    /// Bytes read from the process, and the walk's time (seconds; the process runs meanwhile).
    pub read_bytes: u64,
    pub took_s: f64,
    /// Why the walk stopped short (its budget), when it did: the counts are then a lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<String>,
    /// Goroutines whose stacks were looked at, those running (not unwound: their registers are
    /// on a thread), frames unwound.
    #[serde(default)]
    pub goroutines: u64,
    #[serde(default)]
    pub goroutines_running: u64,
    #[serde(default)]
    pub frames: u64,
    /// CPU time of the agent's thread for the walk, stacks unwound included (seconds).
    #[serde(default)]
    pub cpu_s: f64,
    /// Why the goroutines' locals were not walked, when they were not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_stack_roots: Option<String>,
}

/// One package-level variable and what it alone keeps alive.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GoRoot {
    /// `main.sessions`.
    pub name: String,
    /// Its Go type (`map[string][]byte`).
    pub type_name: String,
    /// A map's entries (`hmap.count`), a slice's `len`, a channel's queued values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// Objects and bytes reachable from this root and from no other (its retained size).
    pub objects: u64,
    pub bytes: u64,
    /// A goroutine's local (`function.local`, named by the frame's function): in how many
    /// goroutines' frames it was found (None: a package variable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goroutines: Option<u64>,
    /// The function the first of those goroutines was started at (`runtime.main` for `main`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
}

/// A package variable's growth between the first and the last walk.
#[derive(Clone, Debug, PartialEq)]
pub struct RootGrowth {
    pub name: String,
    pub type_name: String,
    /// A goroutine-local root: in how many goroutines' frames (last walk), started where.
    pub goroutines: Option<u64>,
    pub started_at: Option<String>,
    pub entries_start: Option<u64>,
    pub entries_end: Option<u64>,
    pub bytes_start: u64,
    pub bytes_end: u64,
    pub objects_start: u64,
    pub objects_end: u64,
    /// Entries per second (0 for a root without entries), retained bytes per second.
    pub entries_per_s: f64,
    pub bytes_per_s: f64,
    /// Per unit of work (`--work-probe`).
    pub bytes_per_unit: Option<f64>,
    /// Judged growing: its retained bytes rose by more than 10 % and 64 KiB, and its entries
    /// (when it has any) rose too.
    pub growing: bool,
}

/// In-use memory of the runtime's heap profile under one Go function, as `pprof heap` reports
/// it: as of the last completed GC, scaled from the runtime's samples (`scaleHeapSample`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GoHeapSite {
    /// The first frame of the allocation stack outside package `runtime`.
    pub function: String,
    /// The stack of its largest bucket, innermost first (function names).
    pub stack: Vec<String>,
    /// In-use objects and bytes (estimated from the samples).
    pub inuse_objects: u64,
    pub inuse_bytes: u64,
}

/// Goroutines with the same state, wait reason and start function.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GoroutineGroup {
    /// `running`, `runnable`, `syscall`, `waiting`, ... (`g.atomicstatus`).
    pub state: String,
    /// Why it waits (`chan send`, `select`, `sleep`: the runtime's `waitReasonStrings`); None
    /// unless waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_reason: Option<String>,
    /// The function the goroutine was started with (`g.startpc`, symbolized).
    pub start_function: String,
    pub count: u64,
    /// Their stacks' bytes.
    pub stack_bytes: u64,
}

/// What grew of one thing counted (a class, a goroutine group) between the two snapshots.
#[derive(Clone, Debug, PartialEq)]
pub struct Growth {
    /// The class, or the goroutine group in words.
    pub name: String,
    pub count_start: u64,
    pub count_end: u64,
    pub bytes_start: u64,
    pub bytes_end: u64,
    /// Instances (goroutines) per second.
    pub count_per_s: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Per unit of work (`--work-probe`), when units were counted at both snapshots.
    pub count_per_unit: Option<f64>,
    pub bytes_per_unit: Option<f64>,
}

/// Seconds and units of work between two snapshots (None: not after one another).
fn span(a: &Taken, b: &Taken) -> Option<(f64, Option<f64>)> {
    let dt = b.t_s - a.t_s;
    (dt > 0.0).then(|| {
        let units = match (a.units_of_work, b.units_of_work) {
            (Some(x), Some(y)) if y > x => Some((y - x) as f64),
            _ => None,
        };
        (dt, units)
    })
}

/// Things that grew in count and bytes from `start` to `end` ((count, bytes) by name; a name
/// absent at the start counts from 0), fastest-growing bytes first.
fn growth(
    start: &BTreeMap<String, (u64, u64)>,
    end: &BTreeMap<String, (u64, u64)>,
    dt: f64,
    units: Option<f64>,
) -> Vec<Growth> {
    let mut out: Vec<Growth> = end
        .iter()
        .filter_map(|(name, &(c1, b1))| {
            let (c0, b0) = start.get(name).copied().unwrap_or((0, 0));
            (c1 > c0 && b1 >= b0).then(|| Growth {
                name: name.clone(),
                count_start: c0,
                count_end: c1,
                bytes_start: b0,
                bytes_end: b1,
                count_per_s: (c1 - c0) as f64 / dt,
                bytes_per_s: (b1 - b0) as f64 / dt,
                count_per_unit: units.map(|u| (c1 - c0) as f64 / u),
                bytes_per_unit: units.map(|u| (b1 - b0) as f64 / u),
            })
        })
        .collect();
    out.sort_by(|a, b| b.bytes_per_s.total_cmp(&a.bytes_per_s).then(b.count_per_s.total_cmp(&a.count_per_s)));
    out
}

impl Census<ClassHistogram> {
    /// The classes whose instance count and bytes grew, fastest bytes first; empty without both
    /// histograms.
    pub fn growth(&self) -> Vec<Growth> {
        let (Some(a), Some(b)) = (&self.start, &self.end) else { return Vec::new() };
        let Some((dt, units)) = span(&a.taken, &b.taken) else { return Vec::new() };
        let by = |h: &ClassHistogram| h.classes.iter().map(|c| (c.class.clone(), (c.instances, c.bytes))).collect();
        growth(&by(a), &by(b), dt, units)
    }
}

impl GoroutineGroup {
    /// The group in words: `waiting (chan send), started by main.handle`.
    pub fn describe(&self) -> String {
        match &self.wait_reason {
            Some(w) => format!("{} ({w}), started by {}", self.state, self.start_function),
            None => format!("{}, started by {}", self.state, self.start_function),
        }
    }
}

impl Census<Goroutines> {
    /// The goroutine groups that grew, fastest first (bytes: their stacks); empty without both
    /// snapshots. A group counts only when its start function's goroutines grew in all: a pool
    /// whose workers moved from waiting to runnable between the snapshots has a state group that
    /// grew and no more goroutines.
    pub fn growth(&self) -> Vec<Growth> {
        let (Some(a), Some(b)) = (&self.start, &self.end) else { return Vec::new() };
        let Some((dt, units)) = span(&a.taken, &b.taken) else { return Vec::new() };
        let by = |g: &Goroutines| g.groups.iter().map(|x| (x.describe(), (x.count, x.stack_bytes))).collect();
        let per_function = |g: &Goroutines| {
            let mut m: BTreeMap<String, u64> = BTreeMap::new();
            g.groups.iter().for_each(|x| *m.entry(x.start_function.clone()).or_default() += x.count);
            m
        };
        let (before, after) = (per_function(a), per_function(b));
        let function_grew = |f: &str| after.get(f).copied().unwrap_or(0) > before.get(f).copied().unwrap_or(0);
        let grew: Vec<String> =
            b.groups.iter().filter(|x| function_grew(&x.start_function)).map(|x| x.describe()).collect();
        let mut v = growth(&by(a), &by(b), dt, units);
        v.retain(|g| grew.contains(&g.name));
        v.sort_by(|a, b| b.count_per_s.total_cmp(&a.count_per_s));
        v
    }
}

impl Census<Goroutines> {
    /// The Go functions whose in-use heap (the runtime's heap profile) grew, most bytes per
    /// second first; empty without both snapshots.
    pub fn heap_growth(&self) -> Vec<Growth> {
        let (Some(a), Some(b)) = (&self.start, &self.end) else { return Vec::new() };
        let Some((dt, units)) = span(&a.taken, &b.taken) else { return Vec::new() };
        let by =
            |g: &Goroutines| g.heap.iter().map(|x| (x.function.clone(), (x.inuse_objects, x.inuse_bytes))).collect();
        growth(&by(a), &by(b), dt, units)
    }
}

impl Census<Goroutines> {
    /// Every package variable of the last walk with its growth since the first, growing ones
    /// first (fastest retained bytes first), then the others by retained bytes; empty without
    /// both walks.
    pub fn root_growth(&self) -> Vec<RootGrowth> {
        let (Some(a), Some(b)) = (&self.start, &self.end) else { return Vec::new() };
        let (Some(wa), Some(wb)) = (&a.walk, &b.walk) else { return Vec::new() };
        let Some((dt, units)) = span(&a.taken, &b.taken) else { return Vec::new() };
        let mut out: Vec<RootGrowth> = wb
            .roots
            .iter()
            .map(|r| {
                let first = wa.roots.iter().find(|x| x.name == r.name);
                let (e0, b0, o0) = first.map_or((r.entries.map(|_| 0), 0, 0), |x| (x.entries, x.bytes, x.objects));
                let de = r.entries.unwrap_or(0) as f64 - e0.unwrap_or(0) as f64;
                let db = r.bytes as f64 - b0 as f64;
                let entries_grew = r.entries.is_none_or(|e| e > e0.unwrap_or(0));
                RootGrowth {
                    name: r.name.clone(),
                    type_name: r.type_name.clone(),
                    goroutines: r.goroutines,
                    started_at: r.started_at.clone(),
                    entries_start: e0,
                    entries_end: r.entries,
                    bytes_start: b0,
                    bytes_end: r.bytes,
                    objects_start: o0,
                    objects_end: r.objects,
                    entries_per_s: de / dt,
                    bytes_per_s: db / dt,
                    bytes_per_unit: units.map(|u| db / u),
                    growing: entries_grew && db > (b0 as f64 * 0.1).max(65536.0),
                }
            })
            .collect();
        out.sort_by(|x, y| {
            y.growing.cmp(&x.growing).then(y.bytes_per_s.total_cmp(&x.bytes_per_s)).then(y.bytes_end.cmp(&x.bytes_end))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(t_s: f64, units: Option<u64>, classes: &[(&str, u64, u64)]) -> ClassHistogram {
        ClassHistogram {
            taken: Taken { t_s, took_s: 0.5, units_of_work: units },
            classes: classes.iter().map(|&(c, i, b)| ClassCount { class: c.into(), instances: i, bytes: b }).collect(),
            total_instances: 0,
            total_bytes: 0,
        }
    }

    #[test]
    fn classes_that_grow_in_count_and_bytes() {
        let c = Census {
            start: Some(hist(1.0, Some(100), &[("byte[]", 1000, 300_000), ("Rec", 10, 240), ("Cache", 50, 5000)])),
            end: Some(hist(
                11.0,
                Some(1100),
                &[("byte[]", 11_000, 3_100_000), ("Rec", 1010, 24_240), ("Cache", 50, 5000), ("New", 5, 80)],
            )),
            errors: Vec::new(),
        };
        let g = c.growth();
        let names: Vec<&str> = g.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["byte[]", "Rec", "New"], "Cache does not grow");
        assert_eq!(g[1].count_per_s, 100.0);
        assert_eq!(g[1].bytes_per_s, 2400.0);
        assert_eq!(g[1].count_per_unit, Some(1.0));
        assert_eq!(g[0].bytes_per_unit, Some(2800.0));
        let one = Census { start: c.start.clone(), end: None, errors: Vec::new() };
        assert!(one.growth().is_empty());
    }

    #[test]
    fn goroutine_groups_that_grow() {
        let group = |state: &str, w: Option<&str>, f: &str, n: u64| GoroutineGroup {
            state: state.into(),
            wait_reason: w.map(Into::into),
            start_function: f.into(),
            count: n,
            stack_bytes: n * 8192,
        };
        let snap = |t_s: f64, gs: Vec<GoroutineGroup>| Goroutines {
            taken: Taken { t_s, took_s: 0.001, units_of_work: None },
            total: gs.iter().map(|g| g.count).sum(),
            stack_bytes: 0,
            groups: gs,
            ..Default::default()
        };
        let c = Census {
            start: Some(snap(
                0.5,
                vec![group("waiting", Some("chan send"), "main.handle", 50), group("running", None, "runtime.main", 1)],
            )),
            end: Some(snap(
                10.5,
                vec![
                    group("waiting", Some("chan send"), "main.handle", 1050),
                    group("running", None, "runtime.main", 1),
                ],
            )),
            errors: Vec::new(),
        };
        let g = c.growth();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].name, "waiting (chan send), started by main.handle");
        assert_eq!(g[0].count_per_s, 100.0);
        assert_eq!(g[0].bytes_per_s, 100.0 * 8192.0);
        assert_eq!(g[0].count_per_unit, None);
    }

    /// Eight workers, all waiting at the start, four of them runnable at the end: the runnable
    /// group rose from 0 to 4 and the pool did not grow.
    #[test]
    fn workers_changing_state_are_not_growth() {
        let group = |state: &str, w: Option<&str>, n: u64| GoroutineGroup {
            state: state.into(),
            wait_reason: w.map(Into::into),
            start_function: "main.worker".into(),
            count: n,
            stack_bytes: n * 2048,
        };
        let snap = |t_s: f64, groups: Vec<GoroutineGroup>| Goroutines {
            taken: Taken { t_s, took_s: 0.001, units_of_work: None },
            total: 8,
            groups,
            ..Default::default()
        };
        let c = Census {
            start: Some(snap(0.5, vec![group("waiting", Some("chan receive"), 8)])),
            end: Some(snap(10.5, vec![group("waiting", Some("chan receive"), 4), group("runnable", None, 4)])),
            errors: Vec::new(),
        };
        assert!(c.growth().is_empty(), "{:?}", c.growth().iter().map(|g| &g.name).collect::<Vec<_>>());
    }
}

/// A GC root's object that retains off-heap memory (the JVM's direct buffers' blocks) at the
/// first and the last heap dump of `--heap-dump`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OffHeapRetainer {
    /// The root that names it (`App.BUFFERS`).
    pub container: String,
    /// What it retained at the first dump (zeros when it retained nothing then) and at the last.
    pub first: crate::retain::Retained,
    pub last: crate::retain::Retained,
    /// (last − first) / (time between the dumps): all bytes and off-heap bytes, per second.
    pub bytes_per_s: f64,
    pub off_heap_per_s: f64,
    /// Its off-heap blocks grew (at least 20 and 5 %, as [`crate::retain::is_growing`]): a
    /// leak; a bounded cache does not.
    pub growing: bool,
}

/// The off-heap retainers of the last heap dump with their growth since the first; growing ones
/// first, then most retained-bytes growth. Empty without both dumps' retainers (the last alone:
/// listed, nothing said of growth, `growing` false).
pub fn off_heap_retainers(h: &RuntimeHolds) -> Vec<OffHeapRetainer> {
    let Some(last) = &h.jvm_heap_dump else { return Vec::new() };
    let first = h.jvm_first_dump.as_ref();
    let dt = first.map_or(0.0, |f| last.taken.t_s - f.taken.t_s);
    let mut out: Vec<OffHeapRetainer> = last
        .retainers
        .iter()
        .map(|r| {
            let f = first
                .and_then(|f| f.retainers.iter().find(|x| x.container == r.container).cloned())
                .unwrap_or_default();
            let per_s = |a: u64, b: u64| if dt > 0.0 { (a as f64 - b as f64) / dt } else { 0.0 };
            OffHeapRetainer {
                container: r.container.clone(),
                bytes_per_s: per_s(r.total(), f.total()),
                off_heap_per_s: per_s(r.off_heap, f.off_heap),
                growing: dt > 0.0 && crate::retain::is_growing(f.blocks, r.blocks),
                first: f,
                last: r.clone(),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.growing
            .cmp(&a.growing)
            .then(b.bytes_per_s.total_cmp(&a.bytes_per_s))
            .then(b.last.off_heap.cmp(&a.last.off_heap))
            .then_with(|| a.container.cmp(&b.container))
    });
    out
}
