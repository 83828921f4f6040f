//! Python heap censuses (`record --python-heap`): objects of a live CPython process
//! counted by type, read from outside while its threads are briefly stopped, with what holds
//! them (the retaining path from a module global). Made by the recorder
//! (`leaktrace/src/runtimes/python/heap/`, described in docs/runtimes.md "Python heap"), stored in
//! recording.json, turned into growth by type and rendered by `runtimes/python/report.rs`. Only type
//! names, counts, sizes and short path labels (attribute names, dict keys' reprs cut to 40
//! characters) leave the target: never object contents otherwise.

use serde::{Deserialize, Serialize};

use crate::retain::{EdgeKind, RetainPath, RetainStep, Retained, Root, RootKind, is_growing};

/// One census of one process's Python heap.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PyCensus {
    /// When the census stopped the target, seconds since the first checkpoint.
    pub t_s: f64,
    /// The same moment on the wall clock, milliseconds since the Unix epoch (to line the
    /// census up with the target's own logs).
    #[serde(default)]
    pub unix_ms: u64,
    /// How long the target's threads were stopped, milliseconds (first thread stopped to the
    /// last one resumed).
    pub pause_ms: f64,
    /// CPU time the agent's census thread used during the pause, ms: the census's own work
    /// (the rest of the pause is waiting for a CPU on a loaded host). 0 in older recordings.
    #[serde(default)]
    pub cpu_ms: f64,
    /// CPython version read ("3.11").
    pub version: String,
    /// False when the walk stopped early (the pause cap or the object cap): counts are then
    /// lower bounds, and objects not reached are missing from every type.
    pub complete: bool,
    /// Why the census is incomplete, or other notes (one line each).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Container objects found in the collector's generation lists.
    pub gc_objects: u64,
    /// Objects counted: the containers, and the objects their decoded references reach
    /// (str, bytes, int, float, untracked dicts and tuples ...), each once.
    pub objects: u64,
    /// Their bytes (see [`TypeCensus::bytes`]).
    pub bytes: u64,
    /// Per type, most objects first.
    pub types: Vec<TypeCensus>,
}

/// The objects of one type at a census.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TypeCensus {
    /// The type's name: `tp_name` for built-in and extension types (`dict`,
    /// `collections.deque`), `module.qualname` for classes defined in Python
    /// (`__main__.EventBus`).
    pub name: String,
    /// Objects of the type.
    pub count: u64,
    /// Their bytes: `tp_basicsize + tp_itemsize × size` per object, plus the collector's
    /// header for containers and the out-of-line storage of dicts (keys and values tables),
    /// lists (item array) and sets (hash table). Not the memory of buffers it does not decode.
    pub bytes: u64,
    /// What holds them: the objects grouped by the pattern of their retaining path, most
    /// objects first (at most [`MAX_HOLDERS`]; the rest is not listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
}

/// Most holder patterns kept per type.
pub const MAX_HOLDERS: usize = 6;

/// Objects of one type held the same way.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Holder {
    /// How they are held.
    pub kind: HolderKind,
    /// The retaining path's pattern, root first, with dict keys, list and tuple indices and
    /// set members generalised to `[…]`: `__main__.bus._handlers[…][…].__defaults__[0]`, or
    /// from a live frame's local `local `cache` of worker()[…]`. Empty for [`HolderKind::Nowhere`] and [`HolderKind::Garbage`].
    pub pattern: String,
    /// Objects of the type held this way.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The shortest retaining path of one of them, root first: each step is the edge taken
    /// (`__main__`, `.bus`, `['ack:17']`, `[0]`, `.__defaults__[0]`) and the type of the object
    /// it leads to (`function on_ack` for a function).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub example: Vec<PathStep>,
    /// [`HolderKind::Nowhere`] with the allocator's calls traced (`--pymalloc`, or objects
    /// large enough for malloc): the function that allocated most of a sample of these objects
    /// (the culprit of their traced blocks' stack, e.g. the C extension's function that leaked
    /// the reference). None when no sampled object lies in a traced block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_by: Option<String>,
    /// That stack's id (`sites[].id` in report.json, `stacks[].id` in recording.json).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_stack: Option<u32>,
    /// Addresses of up to [`NOWHERE_SAMPLE`] of these objects ([`HolderKind::Nowhere`] only),
    /// which the recorder matches against the traced blocks to fill `allocated_by`; not saved.
    #[serde(skip)]
    pub sample_addrs: Vec<u64>,
    /// What the container these objects are filed in retains, native blocks included
    /// ([`HolderKind::Path`] holders whose objects own traced native blocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retained: Option<Retained>,
}

/// Objects of a "referenced from nowhere" holder whose blocks are looked up for its stack.
pub const NOWHERE_SAMPLE: usize = 64;

/// Where a group of objects is held from.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum HolderKind {
    /// Reached from a root — a module's globals (`sys.modules`' modules, classes and everything
    /// they reach) or a local variable of a function running in a live thread (pattern
    /// "local `cache` of worker()[…]") — by the path in [`Holder::pattern`].
    #[default]
    Path,
    /// No path from any module or live frame's local, and more references than the Python
    /// objects read hold on it (`ob_refcnt` above the references found): held from outside the
    /// Python heap — a frame's evaluation stack or the interpreter's C state for a few; when
    /// they grow, a reference leaked by native code (a missing `Py_DECREF`). The objects these
    /// reach are counted here too.
    Nowhere,
    /// No path from any module and no reference from outside: an unreachable cycle the
    /// collector has not freed yet.
    Garbage,
}

/// One edge of a retaining path.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PathStep {
    /// The edge in Python terms: a module name for the root (or a live frame's local: "local
    /// `cache` of worker() (thread 4242, app.py:17)", the thread's id, `main thread`, and the
    /// line the frame was at), then `.attr`, `[key repr]`,
    /// `[index]`, `.__defaults__[i]`, `.__closure__[i]`, `.cell_contents`, `.__self__`,
    /// `.__func__`, `.<+0x48>` (a reference found at that offset of an object whose layout
    /// leaktrace does not decode).
    pub edge: String,
    /// The type of the object the edge leads to (`function name` for functions).
    #[serde(rename = "type")]
    pub type_name: String,
}

impl Holder {
    /// The example path in one line: `__main__.bus._handlers['ack:17'][0].__defaults__[0]`.
    pub fn example_path(&self) -> String {
        self.example.iter().map(|s| s.edge.as_str()).collect()
    }

    /// The root and first attribute of the path, `__main__.bus`, or the pattern's first two
    /// edges in general: what a verdict names.
    pub fn root_attr(&self, edges: usize) -> String {
        self.example.iter().take(edges).map(|s| s.edge.as_str()).collect()
    }
}

/// A Python retaining path (a holder's example) as a [`RetainPath`]: the root (a module's
/// global `__main__.PENDING`, or a live frame's local), then each edge and the object it leads
/// to; with `native`, the traced block the last object points into (its culprit and mean size).
pub fn retain_path(example: &[PathStep], native: Option<&Retained>) -> RetainPath {
    let object = |t: &str| RetainStep::Object { runtime: "python".into(), type_name: t.into() };
    let mut steps = Vec::new();
    let mut rest = example.iter().peekable();
    if let Some(first) = rest.next() {
        let (kind, name, type_name) = if first.edge.starts_with("local ") {
            (RootKind::FrameLocal, first.edge.clone(), first.type_name.as_str())
        } else if first.edge.starts_with('(') {
            (RootKind::Unreferenced, first.edge.clone(), first.type_name.as_str())
        } else {
            // A module and its global: `__main__` + `.PENDING` is the root `__main__.PENDING`.
            match rest.next_if(|s| s.edge.starts_with('.')) {
                Some(g) => (RootKind::ModuleGlobal, format!("{}{}", first.edge, g.edge), g.type_name.as_str()),
                None => (RootKind::ModuleGlobal, first.edge.clone(), first.type_name.as_str()),
            }
        };
        steps.push(RetainStep::Root(Root::named(kind, name, "python")));
        steps.push(object(type_name));
    }
    for s in rest {
        if s.edge == "…" && s.type_name.is_empty() {
            steps.push(RetainStep::Elided { steps: 0 });
            continue;
        }
        steps.push(RetainStep::Edge { kind: EdgeKind::of_label(&s.edge), edge: s.edge.clone() });
        steps.push(object(&s.type_name));
    }
    if let Some(r) = native.filter(|r| r.blocks > 0) {
        steps.push(RetainStep::Native {
            stack: r.allocated_stack,
            allocated_by: r.allocated_by.clone(),
            bytes: Some(r.block_bytes / r.blocks.max(1)),
            offset: None,
        });
    }
    RetainPath(steps)
}

/// Growth by type between the first and the last census of a recording ("What holds it").
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Holds {
    /// Censuses in the recording.
    pub censuses: usize,
    /// Times of the first and the last census, seconds since the first checkpoint.
    pub first_s: f64,
    pub last_s: f64,
    /// Units of work done between them (`--work-probe`), when counted.
    pub units: Option<u64>,
    /// Longest pause of the target among the censuses, milliseconds.
    pub max_pause_ms: f64,
    /// Every census walked the whole heap (no cap reached, the collector idle).
    pub complete: bool,
    /// The censuses' notes, each once.
    pub notes: Vec<String>,
    /// Objects counted at the last census, and their bytes.
    pub objects: u64,
    pub bytes: u64,
    /// Types whose count grew ([`is_growing`]), most bytes per second first.
    pub growing: Vec<TypeGrowth>,
    /// Containers that retain traced native blocks (through the objects filed in them), most
    /// retained-bytes growth first: what the verdict names.
    pub retainers: Vec<RetainerGrowth>,
    /// The largest holders that did not grow (at least 50 objects of a type held from a
    /// module by one pattern, grown by less than [`is_growing`]; at most 6, most objects
    /// first): bounded caches, full deques and the program's own state, said as not leaks.
    pub steady: Vec<TypeGrowth>,
}

/// One type's growth.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct TypeGrowth {
    pub name: String,
    /// Objects at the first and the last census.
    pub count_first: u64,
    pub count_last: u64,
    /// Bytes at the first and the last census.
    pub bytes_first: u64,
    pub bytes_last: u64,
    /// (last − first) / (time between them): objects and bytes per second.
    pub count_per_s: f64,
    pub bytes_per_s: f64,
    /// Objects per unit of work (`--work-probe`), when counted.
    pub count_per_unit: Option<f64>,
    /// The holder whose objects grew most (by its pattern), at the last census; for a type
    /// that did not grow, its largest holder.
    pub holder: Option<Holder>,
    /// That holder's growth, objects per second.
    pub holder_count_per_s: f64,
}

/// A container's retained bytes at the first and the last census (its holder's objects own
/// traced native blocks).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct RetainerGrowth {
    /// The container's path (`__main__.PENDING`).
    pub container: String,
    /// The type of the objects filed in it, and the holder's pattern.
    pub type_name: String,
    pub pattern: String,
    /// Objects of that type so held at the first and the last census.
    pub count_first: u64,
    pub count_last: u64,
    /// What it retained at the first census (zeros when the holder was not there yet) and at
    /// the last.
    pub first: Retained,
    pub last: Retained,
    /// (last − first) / (time between them), all bytes and native bytes, per second.
    pub bytes_per_s: f64,
    pub native_per_s: f64,
    /// Whether its objects grew ([`is_growing`]): a bounded cache does not.
    pub growing: bool,
    /// The retaining path of one of its objects, root first (the holder's example).
    pub example: Vec<PathStep>,
}

impl RetainerGrowth {
    /// The share of native bytes in the retained growth (in the last census's retained bytes
    /// when it did not grow), 0..=1.
    pub fn native_share(&self) -> f64 {
        if self.bytes_per_s > 0.0 {
            (self.native_per_s / self.bytes_per_s).clamp(0.0, 1.0)
        } else if self.last.total() > 0 {
            self.last.native as f64 / self.last.total() as f64
        } else {
            0.0
        }
    }
}

/// The containers of `last` that retain native blocks, with their growth since `first`; most
/// retained-bytes growth first.
fn retainers(first: &PyCensus, last: &PyCensus, dt: f64) -> Vec<RetainerGrowth> {
    let mut out = Vec::new();
    for t in &last.types {
        for h in &t.holders {
            let Some(r) = &h.retained else { continue };
            let before = first
                .types
                .iter()
                .find(|x| x.name == t.name)
                .and_then(|x| x.holders.iter().find(|y| y.kind == h.kind && y.pattern == h.pattern));
            let f = before.and_then(|b| b.retained.clone()).unwrap_or_default();
            let count_first = before.map_or(0, |b| b.count);
            out.push(RetainerGrowth {
                container: r.container.clone(),
                type_name: t.name.clone(),
                pattern: h.pattern.clone(),
                count_first,
                count_last: h.count,
                bytes_per_s: (r.total() as f64 - f.total() as f64) / dt,
                native_per_s: (r.native as f64 - f.native as f64) / dt,
                growing: is_growing(count_first, h.count),
                example: h.example.clone(),
                first: f,
                last: r.clone(),
            });
        }
    }
    out.sort_by(|a, b| {
        b.growing
            .cmp(&a.growing)
            .then(b.bytes_per_s.total_cmp(&a.bytes_per_s))
            .then_with(|| a.container.cmp(&b.container))
    });
    out
}

/// Growth by type of a recording's censuses; None with fewer than two (or no time between).
/// `units_at(t)`: units of work counted by time `t` (s), when known.
pub fn holds(censuses: &[PyCensus], units_at: &dyn Fn(f64) -> Option<u64>) -> Option<Holds> {
    let (first, last) = (censuses.first()?, censuses.last()?);
    let dt = last.t_s - first.t_s;
    if censuses.len() < 2 || dt <= 0.0 {
        return None;
    }
    let units = match (units_at(first.t_s), units_at(last.t_s)) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    let mut growing = Vec::new();
    let mut steady: Vec<(u64, u64, TypeGrowth)> = Vec::new();
    for t in &last.types {
        let f = first.types.iter().find(|x| x.name == t.name);
        let (c0, b0) = f.map_or((0, 0), |x| (x.count, x.bytes));
        let holder_growth = |h: &Holder| {
            let before = f.and_then(|x| x.holders.iter().find(|y| y.kind == h.kind && y.pattern == h.pattern));
            h.count as f64 - before.map_or(0.0, |y| y.count as f64)
        };
        let best = t.holders.iter().max_by(|a, b| holder_growth(a).total_cmp(&holder_growth(b)));
        let g = TypeGrowth {
            name: t.name.clone(),
            count_first: c0,
            count_last: t.count,
            bytes_first: b0,
            bytes_last: t.bytes,
            count_per_s: (t.count as f64 - c0 as f64) / dt,
            bytes_per_s: (t.bytes as f64 - b0 as f64) / dt,
            count_per_unit: units.map(|u| (t.count as f64 - c0 as f64) / u as f64),
            holder: None,
            holder_count_per_s: 0.0,
        };
        for h in t.holders.iter().filter(|h| h.kind == HolderKind::Path && h.count >= 50) {
            let before = h.count as f64 - holder_growth(h);
            if !is_growing(before.max(0.0) as u64, h.count) {
                let s = TypeGrowth {
                    holder: Some(h.clone()),
                    holder_count_per_s: (h.count as f64 - before) / dt,
                    ..g.clone()
                };
                steady.push((h.count, before as u64, s));
            }
        }
        if is_growing(c0, t.count) {
            let holder_count_per_s = best.map_or(0.0, |h| holder_growth(h) / dt);
            growing.push(TypeGrowth { holder: best.cloned(), holder_count_per_s, ..g });
        }
    }
    growing.sort_by(|a, b| b.bytes_per_s.total_cmp(&a.bytes_per_s).then_with(|| a.name.cmp(&b.name)));
    // The program's own (`__main__`) holders first, then the largest.
    let main = |g: &TypeGrowth| !g.holder.as_ref().is_some_and(|h| h.pattern.starts_with("__main__"));
    steady.sort_by(|a, b| main(&a.2).cmp(&main(&b.2)).then(b.0.cmp(&a.0)).then_with(|| a.2.name.cmp(&b.2.name)));
    // The holder's counts in place of the type's: what is bounded is the holder.
    let steady = steady
        .into_iter()
        .take(6)
        .map(|(last, first, g)| TypeGrowth { count_first: first, count_last: last, ..g })
        .collect();
    let mut notes: Vec<String> = Vec::new();
    for n in censuses.iter().flat_map(|c| c.notes.iter()) {
        if !n.ends_with("memory read") && !notes.contains(n) {
            notes.push(n.clone());
        }
    }
    Some(Holds {
        censuses: censuses.len(),
        first_s: first.t_s,
        last_s: last.t_s,
        units,
        max_pause_ms: censuses.iter().map(|c| c.pause_ms).fold(0.0, f64::max),
        complete: censuses.iter().all(|c| c.complete),
        notes,
        objects: last.objects,
        bytes: last.bytes,
        growing,
        retainers: retainers(first, last, dt),
        steady,
    })
}

impl Holds {
    /// The root of the fastest-growing type's retaining path held from a module, in the
    /// verdict's words: `__main__.bus._handlers` (the pattern up to its first key or index).
    pub fn top_holder(&self) -> Option<String> {
        self.growing.iter().filter_map(|g| g.holder.as_ref()).find(|h| h.kind == HolderKind::Path).map(|h| {
            let p = &h.pattern;
            p.find('[').map_or_else(|| p.clone(), |i| p[..i].to_string())
        })
    }
}

/// Words in an attribute's name that say it keeps callbacks.
const LISTENER_WORDS: &[&str] = &["handler", "listener", "callback", "subscriber", "observer", "hook", "receiver"];

/// The managed leak pattern a growing type's holder matches (the catalog of managed leaks, in
/// the order tried): an unbounded `functools.lru_cache` on its path; an attribute named like a
/// list of listeners (`_handlers`, `callbacks`, ...); a closure cell or a default argument (a
/// closure capturing a per-request object); a dict whose keys carry digits (keyed by ids that
/// only grow). None: no pattern matched, or not held from a module.
pub fn leak_pattern(g: &TypeGrowth) -> Option<&'static str> {
    let h = g.holder.as_ref().filter(|h| h.kind == HolderKind::Path)?;
    if h.example.iter().any(|s| s.type_name == "functools._lru_cache_wrapper") {
        return Some("an unbounded functools.lru_cache (maxsize=None): every distinct argument's result is kept");
    }
    let attrs = h.pattern.split(['.', '[']).map(str::to_ascii_lowercase);
    if attrs.clone().any(|a| LISTENER_WORDS.iter().any(|w| a.contains(w))) {
        return Some("listeners or handlers appended and never removed");
    }
    if h.pattern.contains(".__defaults__[") || h.pattern.contains(".__closure__[") {
        return Some("closures capturing per-request objects (a default argument or a closure cell keeps each)");
    }
    let id_key = h.example.iter().any(|s| s.edge.starts_with("['") && s.edge.chars().any(|c| c.is_ascii_digit()));
    id_key.then_some("a dict keyed by ids that only grows (an entry per id, never removed)")
}

/// The look-alike a steady holder is (bounded by design, not a leak): a full deque with a
/// maxlen, or a bounded lru_cache; None otherwise.
pub fn look_alike(g: &TypeGrowth) -> Option<&'static str> {
    let h = g.holder.as_ref()?;
    let on_path = |t: &str| h.example.iter().any(|s| s.type_name == t);
    if on_path("collections.deque") {
        Some("a full deque(maxlen=…)")
    } else if on_path("functools._lru_cache_wrapper") {
        Some("a bounded lru_cache, full")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(t_s: f64, types: &[(&str, u64, &str, u64)]) -> PyCensus {
        PyCensus {
            t_s,
            complete: true,
            types: types
                .iter()
                .map(|&(name, count, pattern, held)| TypeCensus {
                    name: name.into(),
                    count,
                    bytes: count * 100,
                    holders: vec![Holder {
                        pattern: pattern.into(),
                        count: held,
                        bytes: held * 100,
                        ..Default::default()
                    }],
                })
                .collect(),
            ..Default::default()
        }
    }

    /// A type that gains 1,000 objects in 5 s under `__main__.bus._handlers[…][…]` grows at
    /// 200/s and names that holder; a full cache (same count) is steady.
    #[test]
    fn growth_by_type_names_the_growing_holder() {
        let a = census(
            1.0,
            &[("function", 1500, "__main__.bus._handlers[…][…]", 200), ("tuple", 700, "__main__.recent[…]", 500)],
        );
        let b = census(
            6.0,
            &[("function", 2500, "__main__.bus._handlers[…][…]", 1200), ("tuple", 702, "__main__.recent[…]", 500)],
        );
        let h = holds(&[a, b], &|t| Some((t * 100.0) as u64)).unwrap();
        assert_eq!(h.growing.len(), 1);
        let f = &h.growing[0];
        assert_eq!(f.name, "function");
        assert!((f.count_per_s - 200.0).abs() < 1e-9);
        assert!((f.holder_count_per_s - 200.0).abs() < 1e-9);
        assert_eq!(f.count_per_unit, Some(2.0));
        assert_eq!(h.top_holder().as_deref(), Some("__main__.bus._handlers"));
        assert_eq!(h.steady[0].name, "tuple");
        assert_eq!(h.steady[0].holder.as_ref().unwrap().pattern, "__main__.recent[…]");
        assert_eq!((h.steady[0].count_first, h.steady[0].count_last), (500, 500));
        assert!(holds(&h_one(), &|_| None).is_none());
    }

    fn growth(pattern: &str, steps: &[(&str, &str)]) -> TypeGrowth {
        let example = steps.iter().map(|&(e, t)| PathStep { edge: e.into(), type_name: t.into() }).collect();
        TypeGrowth {
            holder: Some(Holder { pattern: pattern.into(), example, ..Default::default() }),
            ..Default::default()
        }
    }

    /// The event bus's handlers, a ZIP service's pending dict, a closure's captured request,
    /// an unbounded lru_cache: each its pattern; a path like none of them, none. A full deque
    /// and a bounded lru_cache are look-alikes.
    #[test]
    fn managed_leak_patterns_and_look_alikes() {
        let bus =
            growth("__main__.bus._handlers[…][…].__defaults__[0]", &[("__main__", "module"), ("._handlers", "dict")]);
        assert_eq!(leak_pattern(&bus), Some("listeners or handlers appended and never removed"));
        let zip =
            growth("__main__._PENDING[…]", &[("__main__", "module"), ("._PENDING", "dict"), ("['job-17']", "bytes")]);
        assert!(leak_pattern(&zip).unwrap().starts_with("a dict keyed by ids"));
        let closure = growth("__main__.jobs[…].__closure__[0].cell_contents", &[("__main__", "module")]);
        assert!(leak_pattern(&closure).unwrap().starts_with("closures capturing"));
        let lru = growth(
            "__main__.render.<+0x28>[…]",
            &[("__main__", "module"), (".render", "functools._lru_cache_wrapper")],
        );
        assert!(leak_pattern(&lru).unwrap().starts_with("an unbounded functools.lru_cache"));
        assert_eq!(leak_pattern(&growth("__main__.rows[…]", &[("__main__", "module"), (".rows", "list")])), None);
        assert_eq!(
            look_alike(&growth("__main__.recent[…]", &[(".recent", "collections.deque")])),
            Some("a full deque(maxlen=…)")
        );
        assert_eq!(look_alike(&lru), Some("a bounded lru_cache, full"));
        assert_eq!(look_alike(&zip), None);
    }

    /// A dict whose extension objects own native blocks grows; a full cache of the same objects
    /// does not: the dict is the leaking retainer, named with its rate and native share.
    #[test]
    fn retainers_ranked_by_retained_growth() {
        let holder = |pattern: &str, count: u64, native: u64| Holder {
            pattern: pattern.into(),
            count,
            retained: Some(Retained {
                container: pattern.trim_end_matches("[…]").into(),
                native,
                managed: count * 100,
                allocated_by: Some("img_alloc_buffer ← decode_batch".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let census = |t_s: f64, n: u64| PyCensus {
            t_s,
            types: vec![TypeCensus {
                name: "imgbuf.Buffer".into(),
                count: n + 200,
                holders: vec![holder("__main__.PENDING[…]", n, n * 3000), holder("__main__.CACHE[…]", 200, 600_000)],
                ..Default::default()
            }],
            ..Default::default()
        };
        let h = holds(&[census(1.0, 100), census(11.0, 600)], &|_| None).unwrap();
        assert_eq!(h.retainers.len(), 2);
        let top = &h.retainers[0];
        assert_eq!((top.container.as_str(), top.growing), ("__main__.PENDING", true));
        assert!((top.native_per_s - 150_000.0).abs() < 1e-6);
        assert!((top.native_share() - 3000.0 / 3100.0).abs() < 1e-9);
        assert!(!h.retainers[1].growing);
        let clause = crate::runtimes::python::report::retainer_clause(&h).unwrap();
        assert_eq!(
            clause,
            "`__main__.PENDING` retains +151.4 KiB/s (97 % native, allocated by `img_alloc_buffer` ← `decode_batch`)"
        );
    }

    fn h_one() -> Vec<PyCensus> {
        vec![census(1.0, &[])]
    }
}
