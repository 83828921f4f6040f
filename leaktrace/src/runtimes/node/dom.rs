//! Retained sizes in a V8 heap snapshot (`--heap-snapshots`): the snapshot graph's
//! dominator tree and each object's retained size — its self size plus the self sizes of the
//! objects it dominates, i.e. the bytes freed if it alone were released — computed as Chrome
//! DevTools' heap snapshot view computes them (`HeapSnapshot.ts`: `buildPostOrderIndex`,
//! `buildDominatorTree`, `calculateRetainedSizes`), so the figures match what a person sees when
//! loading the same snapshot there:
//!
//! - an edge counts when it is not `weak`, and a `shortcut` edge only from the root (V8 marks
//!   the user's global object with one there);
//! - the objects reachable from those global objects are the program's ("page-owned"): an edge
//!   from an object that is not the program's to one that is does not count (the debugger's own
//!   references would otherwise change the dominators of the program's objects);
//! - a depth-first post order from the root, then the nodes with only weak retainers (and their
//!   subgraphs) placed under the root; the iterative algorithm of Cooper, Harvey and Kennedy ("A
//!   Simple, Fast Dominance Algorithm", 2001) over the retainers, re-examining only the nodes
//!   whose retainers' dominators changed.
//!
//! Objects reached by neither walk (none in a snapshot V8 wrote after its collection) have no
//! dominator and keep their self size.

use super::snap::Heap;

/// No index (not reached, not set).
const NONE: u32 = u32::MAX;
/// Edge kinds that matter here.
const NORMAL: u8 = 0;
const WEAK: u8 = 1;
const SHORTCUT: u8 = 2;

/// A snapshot's dominator tree and retained sizes; node indices are the snapshot's (node 0 is
/// its root).
pub struct Dominators {
    /// Node → immediate dominator (node index); [`NONE`] for the root and unreached nodes.
    idom: Vec<u32>,
    /// Node → retained size, bytes.
    retained: Vec<u64>,
    /// Dominator-tree children: node i's are `children[first_child[i]..first_child[i + 1]]`.
    first_child: Vec<u32>,
    children: Vec<u32>,
}

/// The graph in flat arrays: edge targets and kinds, and the retainers of each node.
struct Graph {
    n: usize,
    first_edge: Vec<u32>,
    to: Vec<u32>,
    kind: Vec<u8>,
    first_ret: Vec<u32>,
    ret_node: Vec<u32>,
    ret_edge: Vec<u32>,
}

impl Graph {
    fn of(h: &Heap) -> Graph {
        let n = h.count();
        let mut first_edge = Vec::with_capacity(n + 1);
        let (mut to, mut kind) = (Vec::new(), Vec::new());
        for i in 0..n {
            first_edge.push(to.len() as u32);
            for e in h.edges_of(i) {
                let (t, target) = h.edge_kind(e);
                to.push(if target < n { target as u32 } else { NONE });
                kind.push(match t {
                    "weak" => WEAK,
                    "shortcut" => SHORTCUT,
                    _ => NORMAL,
                });
            }
        }
        first_edge.push(to.len() as u32);
        let mut first_ret = vec![0u32; n + 1];
        for &t in to.iter().filter(|&&t| t != NONE) {
            first_ret[t as usize + 1] += 1;
        }
        for i in 0..n {
            first_ret[i + 1] += first_ret[i];
        }
        let mut fill = first_ret.clone();
        let (mut ret_node, mut ret_edge) = (vec![0u32; to.len()], vec![0u32; to.len()]);
        for i in 0..n {
            for e in first_edge[i]..first_edge[i + 1] {
                let t = to[e as usize];
                if t != NONE {
                    let slot = &mut fill[t as usize];
                    ret_node[*slot as usize] = i as u32;
                    ret_edge[*slot as usize] = e;
                    *slot += 1;
                }
            }
        }
        Graph { n, first_edge, to, kind, first_ret, ret_node, ret_edge }
    }

    fn edges(&self, i: usize) -> std::ops::Range<usize> {
        self.first_edge[i] as usize..self.first_edge[i + 1] as usize
    }

    /// DevTools' `isEssentialEdge`: not weak, and a shortcut only from the root.
    fn essential(&self, from: usize, e: usize) -> bool {
        match self.kind[e] {
            WEAK => false,
            SHORTCUT => from == 0,
            _ => true,
        }
    }

    /// The program's objects: reachable, through edges that are not weak, from the targets of
    /// the root's shortcut edges (the global objects).
    fn page_owned(&self) -> Vec<bool> {
        let mut page = vec![false; self.n];
        let mut todo = Vec::new();
        if self.n == 0 {
            return page;
        }
        for e in self.edges(0) {
            let t = self.to[e];
            if self.kind[e] == SHORTCUT && t != NONE && !page[t as usize] {
                page[t as usize] = true;
                todo.push(t as usize);
            }
        }
        while let Some(i) = todo.pop() {
            for e in self.edges(i) {
                let t = self.to[e];
                if self.kind[e] != WEAK && t != NONE && !page[t as usize] {
                    page[t as usize] = true;
                    todo.push(t as usize);
                }
            }
        }
        page
    }

    /// Whether every retainer edge of `i` is weak or a shortcut (none at all included).
    fn only_weak_retainers(&self, i: usize) -> bool {
        (self.first_ret[i] as usize..self.first_ret[i + 1] as usize)
            .all(|r| self.kind[self.ret_edge[r] as usize] != NORMAL)
    }
}

/// The depth-first post order: node of each index, the root last; index of each node.
fn post_order(g: &Graph, page: &[bool]) -> (Vec<u32>, Vec<u32>) {
    let n = g.n;
    let mut order = Vec::with_capacity(n);
    let mut po_of = vec![NONE; n];
    let mut seen = vec![false; n];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut walk = |start: usize, order: &mut Vec<u32>, seen: &mut Vec<bool>| {
        seen[start] = true;
        stack.push((start, g.first_edge[start] as usize));
        while let Some(top) = stack.last_mut() {
            let (v, e) = *top;
            if e < g.first_edge[v + 1] as usize {
                top.1 += 1;
                let c = g.to[e];
                if !g.essential(v, e) || c == NONE || seen[c as usize] {
                    continue;
                }
                let c = c as usize;
                if v != 0 && page[c] && !page[v] {
                    continue;
                }
                seen[c] = true;
                stack.push((c, g.first_edge[c] as usize));
            } else {
                po_of[v] = order.len() as u32;
                order.push(v as u32);
                stack.pop();
            }
        }
    };
    if n == 0 {
        return (order, po_of);
    }
    walk(0, &mut order, &mut seen);
    if order.len() < n {
        // Nodes with only weak retainers, and what they reach, go under the root.
        order.pop();
        for i in 0..n {
            if !seen[i] && g.only_weak_retainers(i) {
                walk(i, &mut order, &mut seen);
            }
        }
        po_of[0] = order.len() as u32;
        order.push(0);
    }
    (order, po_of)
}

/// The immediate dominator of each post-order index (a post-order index; the root's is itself).
fn dominators(g: &Graph, page: &[bool], order: &[u32], po_of: &[u32]) -> Vec<u32> {
    let m = order.len();
    let root = m - 1;
    let mut dom = vec![NONE; m];
    dom[root] = root as u32;
    let mut affected = vec![false; m];
    for e in g.edges(0) {
        if g.essential(0, e) && g.to[e] != NONE && po_of[g.to[e] as usize] != NONE {
            affected[po_of[g.to[e] as usize] as usize] = true;
        }
    }
    let mut changed = true;
    // Bounded in case of a malformed snapshot (a few passes converge on V8's).
    let mut passes = 0;
    while changed && passes < 1000 {
        changed = false;
        passes += 1;
        for p in (0..root).rev() {
            if !std::mem::take(&mut affected[p]) || dom[p] == root as u32 {
                continue;
            }
            let v = order[p] as usize;
            let mut new = NONE;
            let mut orphan = true;
            for r in g.first_ret[v] as usize..g.first_ret[v + 1] as usize {
                let u = g.ret_node[r] as usize;
                if !g.essential(u, g.ret_edge[r] as usize) {
                    continue;
                }
                orphan = false;
                if u != 0 && page[v] && !page[u] {
                    continue;
                }
                let mut rp = po_of[u];
                if rp == NONE || dom[rp as usize] == NONE {
                    continue;
                }
                if new == NONE {
                    new = rp;
                } else {
                    while rp != new && rp != NONE && new != NONE {
                        while rp < new {
                            rp = dom[rp as usize];
                        }
                        while new < rp {
                            new = dom[new as usize];
                        }
                    }
                }
                if new == root as u32 {
                    break;
                }
            }
            if orphan {
                new = root as u32;
            }
            if new != NONE && dom[p] != new {
                dom[p] = new;
                changed = true;
                for e in g.edges(v) {
                    if g.to[e] != NONE && po_of[g.to[e] as usize] != NONE {
                        affected[po_of[g.to[e] as usize] as usize] = true;
                    }
                }
            }
        }
    }
    dom
}

impl Dominators {
    /// The dominator tree of `h` and every node's retained size (bytes, from the snapshot's
    /// self sizes).
    pub fn of(h: &Heap) -> Dominators {
        let g = Graph::of(h);
        let n = g.n;
        let page = g.page_owned();
        let (order, po_of) = post_order(&g, &page);
        let mut idom = vec![NONE; n];
        let mut retained: Vec<u64> = (0..n).map(|i| h.self_size(i)).collect();
        if !order.is_empty() {
            let dom = dominators(&g, &page, &order, &po_of);
            for p in 0..order.len() - 1 {
                let d = dom[p];
                if d != NONE {
                    let (v, d) = (order[p] as usize, order[d as usize] as usize);
                    idom[v] = d as u32;
                    retained[d] = retained[d].saturating_add(retained[v]);
                }
            }
        }
        let mut first_child = vec![0u32; n + 1];
        for &d in idom.iter().filter(|&&d| d != NONE) {
            first_child[d as usize + 1] += 1;
        }
        for i in 0..n {
            first_child[i + 1] += first_child[i];
        }
        let mut fill = first_child.clone();
        let mut children = vec![0u32; first_child[n] as usize];
        for (v, &d) in idom.iter().enumerate().filter(|(_, d)| **d != NONE) {
            children[fill[d as usize] as usize] = v as u32;
            fill[d as usize] += 1;
        }
        Dominators { idom, retained, first_child, children }
    }

    /// Node `i`'s retained size, bytes.
    pub fn retained(&self, i: usize) -> u64 {
        self.retained[i]
    }

    /// Node `i`'s immediate dominator (None: the root, or not reached).
    pub fn idom(&self, i: usize) -> Option<usize> {
        self.idom.get(i).filter(|&&d| d != NONE).map(|&d| d as usize)
    }

    /// The retained size of each group of nodes (`group[i]`: node i's group, or None), each node
    /// counted once: the sum of the retained sizes of the group's nodes that no other node of
    /// the same group dominates (DevTools' retained size of a constructor). Bytes, by group.
    pub fn retained_by_group(&self, group: &[Option<u32>], groups: usize) -> Vec<u64> {
        let mut total = vec![0u64; groups];
        let mut active = vec![0u32; groups];
        if self.idom.is_empty() {
            return total;
        }
        // Depth first over the dominator tree; (node, leaving).
        let mut stack = vec![(0usize, false)];
        while let Some((v, leaving)) = stack.pop() {
            let g = group.get(v).copied().flatten().filter(|&g| (g as usize) < groups);
            if leaving {
                if let Some(g) = g {
                    active[g as usize] -= 1;
                }
                continue;
            }
            if let Some(g) = g {
                if active[g as usize] == 0 {
                    total[g as usize] = total[g as usize].saturating_add(self.retained[v]);
                }
                active[g as usize] += 1;
            }
            stack.push((v, true));
            let kids = &self.children[self.first_child[v] as usize..self.first_child[v + 1] as usize];
            stack.extend(kids.iter().map(|&c| (c as usize, false)));
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::super::snap::parse;
    use super::*;

    /// A snapshot in V8's layout whose dominators are known by hand. Nodes (self size):
    /// 0 root, 1 (GC roots) 0, 2 global 10 (shortcut from the root), 3 array 100, 4 entry A 40,
    /// 5 entry B 40, 6 string of A 500, 7 string shared by A and B 300, 8 object only weakly
    /// held by the array 1000, 9 a debugger object 5 (from (GC roots), not the program's) that
    /// also refers to A, 10 a cycle C 8 ⇄ 11 D 8 under the array.
    fn snapshot() -> String {
        // node fields: type name id self_size edge_count; types: 0 hidden 1 object 2 synthetic.
        let nodes: Vec<u64> = [
            (2, 0, 2),
            (2, 1, 2),
            (1, 10, 1),
            (1, 100, 5),
            (1, 40, 2),
            (1, 40, 1),
            (0, 500, 0),
            (0, 300, 0),
            (1, 1000, 0),
            (1, 5, 1),
            (1, 8, 1),
            (1, 8, 1),
        ]
        .iter()
        .enumerate()
        .flat_map(|(i, &(t, size, edges))| [t, 0, 2 * i as u64 + 1, size, edges])
        .collect();
        // edge types: 0 element 1 property 2 weak 3 shortcut; (type, name, to node).
        let edges: Vec<u64> = [
            (0, 1, 1),
            (3, 0, 2), // root → (GC roots), root ⇢ global
            (0, 1, 2),
            (0, 2, 9), // (GC roots) → global, → debugger object
            (1, 0, 3), // global → array
            (0, 0, 4),
            (0, 1, 5),
            (2, 0, 8),
            (0, 2, 10),
            (3, 0, 7), // array → A, B, ~> 8, → C, ⇢ shared
            (1, 0, 6),
            (1, 0, 7), // A → its string, → shared
            (1, 0, 7), // B → shared
            (1, 0, 4), // debugger object → A
            (1, 0, 11),
            (1, 0, 10), // C → D → C
        ]
        .iter()
        .flat_map(|&(t, name, to)| [t, name, to * 5])
        .collect();
        format!(
            r#"{{"snapshot":{{"meta":{{"node_fields":["type","name","id","self_size","edge_count"],
            "node_types":[["hidden","object","synthetic"],"string","number","number","number"],
            "edge_fields":["type","name_or_index","to_node"],
            "edge_types":[["element","property","weak","shortcut"],"string_or_number","node"]}}}},
            "nodes":{nodes:?},"edges":{edges:?},"strings":["","x"]}}"#
        )
    }

    #[test]
    fn dominators_and_retained_sizes_as_devtools_computes_them() {
        let h = parse(&snapshot()).expect("a snapshot");
        let d = Dominators::of(&h);
        // A is held by the array and by the debugger object, which is not the program's: its
        // edge does not count, so the array dominates A.
        assert_eq!(d.idom(4), Some(3));
        // The shared string is held by A and B: the array dominates it (a shortcut from the
        // array does not count).
        assert_eq!(d.idom(7), Some(3));
        assert_eq!(d.idom(6), Some(4));
        assert_eq!(d.idom(11), Some(10));
        assert_eq!(d.retained(4), 40 + 500);
        assert_eq!(d.retained(5), 40);
        // The array: itself, A with its string, B, the shared string, the cycle; not the object
        // it holds weakly (only weak retainers: placed under the root).
        assert_eq!(d.retained(3), 100 + 540 + 40 + 300 + 16);
        assert_eq!(d.idom(8), Some(0));
        assert_eq!(d.retained(2), 10 + 996);
        assert_eq!(d.retained(0), (0..12).map(|i| h.field(i, h.n_size)).sum::<u64>());
        // Entries A and B as one group: 540 + 40; with the array in it too, the array only.
        let mut group = vec![None; 12];
        group[4] = Some(0);
        group[5] = Some(0);
        assert_eq!(d.retained_by_group(&group, 1), vec![580]);
        group[3] = Some(0);
        assert_eq!(d.retained_by_group(&group, 1), vec![996]);
    }
}
