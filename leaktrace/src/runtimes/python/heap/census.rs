//! The walk's objects counted by type and grouped by the pattern of their retaining path.

use leaktrace_analysis::runtimes::python::heap::{
    Holder, HolderKind, MAX_HOLDERS, NOWHERE_SAMPLE, PathStep, PyCensus, TypeCensus,
};

use super::decode::{self, Kind, Label};
use super::mem::FastMap;
use super::walk::{self, State, Walk};

/// The signature of objects referenced from nowhere (and what they reach).
pub(crate) const NOWHERE: u32 = u32::MAX - 1;

/// Addresses of up to [`NOWHERE_SAMPLE`] objects referenced from nowhere, per type, spread
/// evenly over them (the walk's order is not their age: the growing ones are most of a growing
/// group, so an even spread mostly finds them).
fn nowhere_samples(w: &Walk<'_>) -> FastMap<u32, Vec<u64>> {
    let mut all: FastMap<u32, Vec<u64>> = FastMap::default();
    for n in w.nodes.iter().filter(|n| n.state != State::Path && n.sig == NOWHERE) {
        all.entry(n.ty).or_default().push(n.addr);
    }
    for v in all.values_mut() {
        let step = v.len().div_ceil(NOWHERE_SAMPLE).max(1);
        *v = v.iter().step_by(step).copied().collect();
    }
    all
}

/// Longest example path kept (steps nearest the root, an elision, the last ones).
const MAX_STEPS: usize = 24;

/// One holder group of a type: (kind, signature, count, bytes, example node).
type Group = (HolderKind, u32, u64, u64, u32);

/// The census of the walk. `collecting`: the collector was running at the stop.
pub(crate) fn aggregate(w: &mut Walk<'_>, collecting: bool) -> PyCensus {
    // (type, kind, signature) → (count, bytes, example node).
    let mut groups: FastMap<(u32, HolderKind, u32), (u64, u64, u32)> = FastMap::default();
    let mut types: FastMap<u32, (u64, u64)> = FastMap::default();
    for (i, n) in w.nodes.iter().enumerate() {
        let t = types.entry(n.ty).or_default();
        t.0 += 1;
        t.1 = t.1.saturating_add(n.size);
        let (kind, sig) = match (n.state, n.sig) {
            (State::Path, s) => (HolderKind::Path, s),
            (_, NOWHERE) => (HolderKind::Nowhere, NOWHERE),
            _ => (HolderKind::Garbage, walk::NONE),
        };
        let g = groups.entry((n.ty, kind, sig)).or_insert((0, 0, i as u32));
        g.0 += 1;
        g.1 = g.1.saturating_add(n.size);
        // The example: the newest; of objects referenced from nowhere, the newest such root.
        if kind != HolderKind::Nowhere || n.parent == walk::NONE {
            g.2 = i as u32;
        }
    }
    let samples = nowhere_samples(w);
    let mut by_type: FastMap<u32, Vec<Group>> = FastMap::default();
    for ((ty, kind, sig), (c, b, ex)) in groups {
        by_type.entry(ty).or_default().push((kind, sig, c, b, ex));
    }
    let mut out_types = Vec::new();
    for (ty, (count, bytes)) in types {
        let mut hs = by_type.remove(&ty).unwrap_or_default();
        hs.sort_by_key(|h| (std::cmp::Reverse(h.2), h.1));
        hs.truncate(MAX_HOLDERS);
        let holders = hs
            .into_iter()
            .map(|(kind, sig, c, b, ex)| Holder {
                kind,
                pattern: if kind == HolderKind::Path { pattern(w, sig) } else { String::new() },
                count: c,
                bytes: b,
                example: if kind == HolderKind::Garbage { Vec::new() } else { example(w, ex, kind) },
                sample_addrs: if kind == HolderKind::Nowhere {
                    samples.get(&ty).cloned().unwrap_or_default()
                } else {
                    Vec::new()
                },
                ..Default::default()
            })
            .collect();
        out_types.push(TypeCensus { name: w.types[ty as usize].name.to_string(), count, bytes, holders });
    }
    out_types.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
    let mut notes = Vec::new();
    if let Some(why) = w.out_of_budget {
        notes.push(format!(
            "the census stopped at the {why} ({} objects): counts are lower bounds, objects not reached by then are missing",
            w.nodes.len()
        ));
    }
    if collecting {
        notes.push("the collector was running at the stop: containers in its working lists may be missing".into());
    }
    if w.bad_refs > 0 {
        notes.push(format!("{} reference(s) could not be read as objects", w.bad_refs));
    }
    PyCensus {
        complete: w.out_of_budget.is_none() && !collecting,
        notes,
        gc_objects: w.nodes.iter().filter(|n| n.gc).count() as u64,
        objects: w.nodes.len() as u64,
        bytes: w.nodes.iter().fold(0u64, |a, n| a.saturating_add(n.size)),
        types: out_types,
        ..Default::default()
    }
}

/// A label as written in a path.
fn edge(w: &Walk<'_>, l: Label) -> String {
    let s = |i: u32| w.strs.list.get(i as usize).map_or("?", String::as_str);
    match l {
        Label::Root(i) => s(i).to_string(),
        Label::Local(_, i) => s(i).to_string(),
        Label::Attr(i) => format!(".{}", s(i)),
        Label::Key(i) => format!("[{}]", s(i)),
        Label::Index(i) => format!("[{i}]"),
        Label::Defaults(i) => format!(".__defaults__[{i}]"),
        Label::KwDefaults(i) => format!(".__kwdefaults__['{}']", s(i)),
        Label::Closure(i) => format!(".__closure__[{i}]"),
        Label::CellContents => ".cell_contents".into(),
        Label::Func => ".__func__".into(),
        Label::SelfRef => ".__self__".into(),
        Label::DictOf => ".__dict__".into(),
        Label::Field(o) => format!(".<+{o:#x}>"),
        Label::SetItem => "{…}".into(),
        Label::KeyObj => ".keys()[…]".into(),
        Label::Any => "[…]".into(),
    }
}

/// A signature's pattern, root first.
pub(crate) fn pattern(w: &Walk<'_>, mut sig: u32) -> String {
    let mut parts = Vec::new();
    while sig != walk::NONE && (sig as usize) < w.sigs.len() && parts.len() < 64 {
        let (parent, l) = w.sigs[sig as usize];
        parts.push(edge(w, l));
        sig = parent;
    }
    parts.reverse();
    parts.concat()
}

/// The type of node `i` as a path tells it: `function qualname` for functions.
fn step_type(w: &mut Walk<'_>, i: u32) -> String {
    let (addr, ty) = (w.nodes[i as usize].addr, w.nodes[i as usize].ty as usize);
    let t = &w.types[ty];
    if t.kind == Kind::Func {
        let l = w.l;
        let q = w.mem.u64(addr.wrapping_add(l.func_qualname)).and_then(|q| decode::read_str(w.mem, &l, q, 80));
        return format!("function {}", q.unwrap_or_default());
    }
    t.name.to_string()
}

/// The example path of node `i`, root first.
fn example(w: &mut Walk<'_>, i: u32, kind: HolderKind) -> Vec<PathStep> {
    let mut chain = w.chain_to(i);
    if chain.len() > MAX_STEPS {
        let tail = chain.split_off(chain.len() - (MAX_STEPS - 8));
        chain.truncate(7);
        chain.push(walk::NONE);
        chain.extend(tail);
    }
    let mut steps = Vec::new();
    for (k, &n) in chain.iter().enumerate() {
        if n == walk::NONE {
            steps.push(PathStep { edge: "…".into(), type_name: String::new() });
            continue;
        }
        let label = w.nodes[n as usize].label;
        let e = if k == 0 && kind == HolderKind::Nowhere {
            "(referenced from nowhere)".to_string()
        } else {
            edge(w, label)
        };
        let type_name = step_type(w, n);
        steps.push(PathStep { edge: e, type_name });
    }
    steps
}
