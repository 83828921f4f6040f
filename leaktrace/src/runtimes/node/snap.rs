//! `record --heap-snapshots`: two V8 heap snapshots of a Node process over the
//! inspector the sampling profiler already uses (`HeapProfiler.takeHeapSnapshot`, its JSON
//! streamed as `addHeapSnapshotChunk` events), one at attach and one at the end: the objects of
//! the second whose ids the first did not have, by constructor, and the shortest path from the
//! GC roots to one new instance of the top growing constructor (`(GC roots) → … → auditTrail
//! (Array) → [17] → AuditEntry`), read from the snapshot's own layout (`snapshot.meta`:
//! `node_fields`, `edge_fields`, their types; `nodes`, `edges`, `strings`).
//!
//! A snapshot pauses the process while V8 walks its heap and needs up to twice the heap in
//! memory: it is refused, in one line, when the target's memory cgroup (the tightest of its and
//! its ancestors' limits) has less headroom (limit − usage) than twice the JS heap used
//! (`Runtime.getHeapUsage`), or when that heap is larger than `--heap-dump-max-size`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// Longest wait for a snapshot's whole JSON.
pub(super) const SNAPSHOT_WAIT: Duration = Duration::from_secs(60);
/// Constructors listed.
pub(super) const MAX_CONSTRUCTORS: usize = 50;

/// The first snapshot, as kept until the second.
pub struct First {
    pub(crate) at: Instant,
    pub(crate) took_s: f64,
    pub(crate) ids: HashSet<u64>,
    pub(crate) counts: HashMap<String, u64>,
    pub(crate) objects: u64,
    pub(crate) used: u64,
    pub(crate) cost: leaktrace_analysis::holds::SnapshotCost,
}

#[derive(Deserialize)]
struct Raw {
    snapshot: RawHead,
    nodes: Vec<u64>,
    edges: Vec<u64>,
    strings: Vec<String>,
}

#[derive(Deserialize)]
struct RawHead {
    meta: Meta,
}

#[derive(Deserialize)]
struct Meta {
    node_fields: Vec<String>,
    node_types: Vec<serde_json::Value>,
    edge_fields: Vec<String>,
    edge_types: Vec<serde_json::Value>,
}

/// A parsed snapshot: flat node and edge arrays with the field offsets from its meta.
pub struct Heap {
    raw: Raw,
    nf: usize,
    ef: usize,
    n_type: usize,
    n_name: usize,
    pub(crate) n_id: usize,
    pub(super) n_size: usize,
    e_type: usize,
    e_name: usize,
    e_to: usize,
    node_types: Vec<String>,
    edge_types: Vec<String>,
    /// Node i's edges are edge records `first_edge[i]..first_edge[i + 1]`.
    first_edge: Vec<usize>,
}

/// Parse a snapshot's JSON.
pub fn parse(text: &str) -> Result<Heap, String> {
    let raw: Raw = serde_json::from_str(text).map_err(|e| format!("heap snapshot: {e}"))?;
    let m = &raw.snapshot.meta;
    let at = |fields: &[String], f: &str| {
        fields.iter().position(|x| x == f).ok_or(format!("no `{f}` in the snapshot's meta"))
    };
    let names = |types: &[serde_json::Value]| -> Vec<String> {
        types
            .first()
            .and_then(|t| t.as_array())
            .map_or_else(Vec::new, |a| a.iter().map(|s| s.as_str().unwrap_or("").to_string()).collect())
    };
    let (nf, ef) = (m.node_fields.len(), m.edge_fields.len());
    let n_edges = at(&m.node_fields, "edge_count")?;
    let mut h = Heap {
        nf,
        ef,
        n_type: at(&m.node_fields, "type")?,
        n_name: at(&m.node_fields, "name")?,
        n_id: at(&m.node_fields, "id")?,
        n_size: at(&m.node_fields, "self_size")?,
        e_type: at(&m.edge_fields, "type")?,
        e_name: at(&m.edge_fields, "name_or_index")?,
        e_to: at(&m.edge_fields, "to_node")?,
        node_types: names(&m.node_types),
        edge_types: names(&m.edge_types),
        first_edge: Vec::new(),
        raw,
    };
    if nf == 0 || ef == 0 || !h.raw.nodes.len().is_multiple_of(nf) || !h.raw.edges.len().is_multiple_of(ef) {
        return Err("heap snapshot: node or edge arrays do not match their fields".into());
    }
    // The edge counts come from the target: summed with checks, never past the edge records.
    let records = h.raw.edges.len() / ef;
    let mut e = 0usize;
    h.first_edge.reserve(h.count() + 1);
    for i in 0..h.count() {
        h.first_edge.push(e);
        e = usize::try_from(h.raw.nodes[i * nf + n_edges])
            .ok()
            .and_then(|n| e.checked_add(n))
            .filter(|&e| e <= records)
            .ok_or("heap snapshot: the nodes' edge counts add up to more than its edges")?;
    }
    h.first_edge.push(e);
    if e != records {
        return Err("heap snapshot: the nodes' edge counts do not add up to its edges".into());
    }
    Ok(h)
}

impl Heap {
    pub(crate) fn count(&self) -> usize {
        self.raw.nodes.len() / self.nf
    }
    /// Node `i`'s self size, bytes.
    pub(super) fn self_size(&self, i: usize) -> u64 {
        self.field(i, self.n_size)
    }
    /// The nodes node `i` refers to through edges that are not weak.
    pub(super) fn targets(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        self.edges_of(i).filter_map(move |e| {
            let (t, to) = self.edge_kind(e);
            (t != "weak" && to < self.count()).then_some(to)
        })
    }
    /// Node `i`'s edge records.
    pub(super) fn edges_of(&self, i: usize) -> std::ops::Range<usize> {
        self.first_edge[i]..self.first_edge[i + 1]
    }
    /// Edge record `e`: its type's name and its target node (an index that may be out of range
    /// in a broken snapshot: the callers check).
    pub(super) fn edge_kind(&self, e: usize) -> (&str, usize) {
        let r = &self.raw.edges[e * self.ef..(e + 1) * self.ef];
        (self.edge_types.get(r[self.e_type] as usize).map_or("?", String::as_str), r[self.e_to] as usize / self.nf)
    }
    pub(crate) fn field(&self, i: usize, f: usize) -> u64 {
        self.raw.nodes[i * self.nf + f]
    }
    fn string(&self, k: u64) -> &str {
        self.raw.strings.get(k as usize).map_or("?", String::as_str)
    }
    fn node_type(&self, i: usize) -> &str {
        self.node_types.get(self.field(i, self.n_type) as usize).map_or("?", String::as_str)
    }

    /// The node's group as DevTools names it: the constructor of an object, V8's label else.
    pub(crate) fn class(&self, i: usize) -> String {
        match self.node_type(i) {
            "object" | "native" | "synthetic" => self.string(self.field(i, self.n_name)).to_string(),
            "string" | "concatenated string" | "sliced string" => "(string)".into(),
            "hidden" => "(system)".into(),
            "code" => "(compiled code)".into(),
            t => format!("({t})"),
        }
    }

    /// Edge record `e`: (type name, label, target node index).
    fn edge(&self, e: usize) -> (&str, String, usize) {
        let r = &self.raw.edges[e * self.ef..(e + 1) * self.ef];
        let t = self.edge_types.get(r[self.e_type] as usize).map_or("?", String::as_str);
        let label = match t {
            "element" | "hidden" => format!("[{}]", r[self.e_name]),
            _ => self.string(r[self.e_name]).to_string(),
        };
        (t, label, r[self.e_to] as usize / self.nf)
    }

    /// Breadth first from the snapshot's root (node 0), weak edges not followed: each node's
    /// parent edge (None: the root or not reached) and whether it was reached.
    pub(super) fn walk(&self) -> (Vec<Option<(usize, usize)>>, Vec<bool>) {
        let n = self.count();
        let mut parent = vec![None; n];
        let mut seen = vec![false; n];
        let mut q = VecDeque::new();
        if n > 0 {
            seen[0] = true;
            q.push_back(0);
        }
        while let Some(i) = q.pop_front() {
            for e in self.first_edge[i]..self.first_edge[i + 1] {
                let (t, _, to) = self.edge(e);
                if t == "weak" || to >= n || seen[to] {
                    continue;
                }
                seen[to] = true;
                parent[to] = Some((i, e));
                q.push_back(to);
            }
        }
        (parent, seen)
    }

    /// The steps from the root to node `obj`: synthetic nodes by name (`(GC roots)`), others
    /// as `label (Class)`, the last edge's label then the object's class.
    pub(super) fn path(&self, parent: &[Option<(usize, usize)>], obj: usize) -> Vec<String> {
        let mut chain = Vec::new();
        let mut at = obj;
        while let Some((p, e)) = parent[at] {
            chain.push(e);
            at = p;
        }
        chain.reverse();
        let mut steps = Vec::new();
        for (k, &e) in chain.iter().enumerate() {
            let (_, label, to) = self.edge(e);
            if k + 1 == chain.len() {
                steps.push(label);
                steps.push(self.class(to));
            } else if self.node_type(to) == "synthetic" {
                steps.push(self.class(to));
            } else {
                steps.push(format!("{label} ({})", self.class(to)));
            }
        }
        steps
    }
}

/// The memory cgroup headroom of `pid`: the smallest (limit − usage) of its memory cgroup and
/// its ancestors that have a limit (cgroup v2 `memory.max`/`memory.current`, v1
/// `memory.limit_in_bytes`/`memory.usage_in_bytes`), bytes, with that cgroup's directory.
/// None: no limit.
pub fn cgroup_headroom(pid: u32) -> Option<(u64, std::path::PathBuf)> {
    let events = crate::record::ending::memory_events_of(pid)?;
    let (limit_f, usage_f) = if events.ends_with("memory.events") {
        ("memory.max", "memory.current")
    } else {
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    };
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    for dir in events.parent()?.ancestors() {
        if !dir.join(limit_f).exists() {
            break;
        }
        let (Some(limit), Some(usage)) = (read(dir.join(limit_f)).filter(|v| *v < 1 << 60), read(dir.join(usage_f)))
        else {
            continue;
        };
        let room = limit.saturating_sub(usage);
        if best.as_ref().is_none_or(|b| room < b.0) {
            best = Some((room, dir.to_path_buf()));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot in V8's layout: root → (GC roots) → a context whose `auditTrail` array holds
    /// two AuditEntry objects; a third only through a weak edge.
    #[test]
    fn path_from_the_gc_roots_in_v8_layout() {
        let text = r#"{"snapshot":{"meta":{
            "node_fields":["type","name","id","self_size","edge_count","trace_node_id","detachedness"],
            "node_types":[["hidden","array","string","object","code","closure","regexp","number","native","synthetic"],"string","number","number","number","number","number"],
            "edge_fields":["type","name_or_index","to_node"],
            "edge_types":[["context","element","property","internal","hidden","shortcut","weak"],"string_or_number","node"]},
            "node_count":7,"edge_count":6},
          "nodes":[9,0,1,0,1,0,0, 9,1,3,0,1,0,0, 0,2,5,32,1,0,0, 3,3,7,16,3,0,0, 3,4,9,24,0,0,0, 3,4,11,24,0,0,0, 3,4,13,24,0,0,0],
          "edges":[1,1,7, 4,0,14, 0,5,21, 1,0,28, 1,1,35, 6,6,42],
          "strings":["","(GC roots)","system / Context","Array","AuditEntry","auditTrail","w"]}"#;
        let h = parse(text).expect("a snapshot");
        assert_eq!(h.count(), 7);
        assert_eq!(h.class(3), "Array");
        assert_eq!(h.class(2), "(system)");
        let (parent, seen) = h.walk();
        assert!(seen[4] && seen[5] && !seen[6], "a weak edge keeps nothing");
        assert_eq!(h.path(&parent, 5), ["(GC roots)", "[0] ((system))", "auditTrail (Array)", "[1]", "AuditEntry"]);
        assert!(parse(r#"{"snapshot":{"meta":{"node_fields":[],"node_types":[],"edge_fields":[],"edge_types":[]}},"nodes":[],"edges":[],"strings":[]}"#).is_err());
    }

    /// Edge counts that wrap around when summed (2^64 − 1 + 2 = 1, matching one edge record)
    /// are refused, not used as indices.
    #[test]
    fn wrapping_edge_counts_are_refused() {
        let meta = r#"{"snapshot":{"meta":{"node_fields":["type","name","id","self_size","edge_count"],
            "node_types":[["hidden","object"]],"edge_fields":["type","name_or_index","to_node"],
            "edge_types":[["element","weak"]]}},"#;
        let text =
            format!(r#"{meta}"nodes":[1,0,1,0,18446744073709551615, 1,0,2,0,2],"edges":[0,0,5],"strings":[""]}}"#);
        let e = parse(&text).err().expect("refused");
        assert!(e.contains("more than its edges"), "{e}");
        let text = format!(r#"{meta}"nodes":[1,0,1,0,1, 1,0,2,0,0],"edges":[0,0,5],"strings":[""]}}"#);
        assert_eq!(parse(&text).expect("a snapshot").count(), 2);
    }
}
