//! One heap graph across languages and its dominator tree: nodes are roots, native blocks (a
//! traced allocation: its size and stack) and managed objects (a runtime's object: its type and
//! size); an edge says "this node holds a pointer to that one". A node's immediate dominator is
//! the last node every path from the root to it goes through; its retained size is its own size
//! plus the sizes of the nodes it dominates — the bytes freed if it alone were released — split
//! into native, managed and off-heap bytes.
//!
//! The dominators are computed by the iterative algorithm of Cooper, Harvey and Kennedy ("A
//! Simple, Fast Dominance Algorithm", 2001): a depth-first post order from the root, then passes
//! in reverse post order intersecting the dominators of each node's predecessors until nothing
//! changes. Everything lives in flat index arrays (compressed successor and predecessor lists,
//! `u32` indices): no allocation per node, a few tens of bytes per node in all
//! (`cargo xtask bench`, docs/benchmarks.md).
//!
//! Node 0 is the graph's root (the process); [`GraphBuilder::add_root`] adds the roots proper
//! (a module, a global variable, a thread's stack), each held by node 0. Nodes the root does not
//! reach have no dominator and retain only themselves.

/// No index (unreached, not set).
pub const NONE: u32 = u32::MAX;

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The graph's root, or a root proper (a module, a global, a thread): no bytes of its own.
    Root,
    /// A traced native block (malloc and its kin) not owned by a managed runtime's buffer.
    Native,
    /// A managed object of a runtime (Python, JVM, V8, Go).
    Managed,
    /// A native block that backs a managed buffer's off-heap memory (`DirectByteBuffer`,
    /// `ArrayBuffer` backing stores).
    OffHeap,
}

const KINDS: [Kind; 4] = [Kind::Root, Kind::Native, Kind::Managed, Kind::OffHeap];

/// Bytes split by where they live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bytes {
    pub native: u64,
    pub managed: u64,
    pub off_heap: u64,
}

impl Bytes {
    pub fn total(&self) -> u64 {
        self.native.saturating_add(self.managed).saturating_add(self.off_heap)
    }

    fn add(&mut self, o: &Bytes) {
        self.native = self.native.saturating_add(o.native);
        self.managed = self.managed.saturating_add(o.managed);
        self.off_heap = self.off_heap.saturating_add(o.off_heap);
    }
}

/// Nodes and edges as they are found; [`GraphBuilder::build`] makes the [`Graph`].
pub struct GraphBuilder {
    kind: Vec<u8>,
    size: Vec<u64>,
    /// Native and off-heap blocks: the stack id; managed objects: the type id; roots: the
    /// caller's label id.
    tag: Vec<u32>,
    /// Managed objects: the runtime (the caller's numbering); 0 otherwise.
    runtime: Vec<u8>,
    edges: Vec<(u32, u32)>,
}

impl Default for GraphBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GraphBuilder {
    /// A graph with its root, node 0.
    pub fn new() -> GraphBuilder {
        GraphBuilder::with_capacity(1, 0)
    }

    /// The same, with room for `nodes` nodes and `edges` edges.
    pub fn with_capacity(nodes: usize, edges: usize) -> GraphBuilder {
        let mut b = GraphBuilder {
            kind: Vec::with_capacity(nodes),
            size: Vec::with_capacity(nodes),
            tag: Vec::with_capacity(nodes),
            runtime: Vec::with_capacity(nodes),
            edges: Vec::with_capacity(edges),
        };
        b.push(Kind::Root, 0, 0, 0);
        b
    }

    fn push(&mut self, k: Kind, size: u64, tag: u32, runtime: u8) -> u32 {
        let i = self.kind.len() as u32;
        self.kind.push(KINDS.iter().position(|&x| x == k).unwrap_or(0) as u8);
        self.size.push(size);
        self.tag.push(tag);
        self.runtime.push(runtime);
        i
    }

    /// Nodes so far (the root included).
    pub fn len(&self) -> usize {
        self.kind.len()
    }

    /// Never: the root is always there.
    pub fn is_empty(&self) -> bool {
        self.kind.is_empty()
    }

    /// A root proper, held by the graph's root; `label`: the caller's id for it.
    pub fn add_root(&mut self, label: u32) -> u32 {
        let i = self.push(Kind::Root, 0, label, 0);
        self.edges.push((0, i));
        i
    }

    /// A traced native block of `size` bytes allocated at stack `stack`.
    pub fn add_native(&mut self, size: u64, stack: u32) -> u32 {
        self.push(Kind::Native, size, stack, 0)
    }

    /// A native block backing a managed buffer's off-heap memory.
    pub fn add_off_heap(&mut self, size: u64, stack: u32) -> u32 {
        self.push(Kind::OffHeap, size, stack, 0)
    }

    /// A managed object of runtime `runtime`, type `ty`, `size` bytes.
    pub fn add_managed(&mut self, runtime: u8, ty: u32, size: u64) -> u32 {
        self.push(Kind::Managed, size, ty, runtime)
    }

    /// `from` holds a pointer to `to` (edges out of range are ignored at build).
    pub fn add_edge(&mut self, from: u32, to: u32) {
        self.edges.push((from, to));
    }

    /// The graph in compressed arrays.
    pub fn build(self) -> Graph {
        let n = self.kind.len();
        let mut edges = self.edges;
        edges.retain(|&(f, t)| (f as usize) < n && (t as usize) < n);
        let (first_succ, succ) = csr(n, &edges, |&(f, t)| (f, t));
        let (first_pred, pred) = csr(n, &edges, |&(f, t)| (t, f));
        Graph {
            kind: self.kind,
            size: self.size,
            tag: self.tag,
            runtime: self.runtime,
            first_succ,
            succ,
            first_pred,
            pred,
        }
    }
}

/// Compressed adjacency: node i's neighbours are `list[first[i]..first[i + 1]]`.
fn csr(n: usize, edges: &[(u32, u32)], key: impl Fn(&(u32, u32)) -> (u32, u32)) -> (Vec<u32>, Vec<u32>) {
    let mut first = vec![0u32; n + 1];
    for e in edges {
        first[key(e).0 as usize + 1] += 1;
    }
    for i in 0..n {
        first[i + 1] += first[i];
    }
    let mut fill = first.clone();
    let mut list = vec![0u32; edges.len()];
    for e in edges {
        let (a, b) = key(e);
        list[fill[a as usize] as usize] = b;
        fill[a as usize] += 1;
    }
    (first, list)
}

/// The graph: nodes in parallel arrays, edges both ways.
pub struct Graph {
    kind: Vec<u8>,
    size: Vec<u64>,
    tag: Vec<u32>,
    runtime: Vec<u8>,
    first_succ: Vec<u32>,
    succ: Vec<u32>,
    first_pred: Vec<u32>,
    pred: Vec<u32>,
}

impl Graph {
    pub fn len(&self) -> usize {
        self.kind.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kind.is_empty()
    }

    pub fn kind(&self, i: usize) -> Kind {
        KINDS[self.kind[i] as usize]
    }

    /// The node's own bytes.
    pub fn size(&self, i: usize) -> u64 {
        self.size[i]
    }

    /// Stack id (blocks), type id (managed objects) or label (roots).
    pub fn tag(&self, i: usize) -> u32 {
        self.tag[i]
    }

    pub fn runtime(&self, i: usize) -> u8 {
        self.runtime[i]
    }

    pub fn successors(&self, i: usize) -> &[u32] {
        &self.succ[self.first_succ[i] as usize..self.first_succ[i + 1] as usize]
    }

    pub fn predecessors(&self, i: usize) -> &[u32] {
        &self.pred[self.first_pred[i] as usize..self.first_pred[i + 1] as usize]
    }

    /// The node's own bytes, by where they live.
    pub fn own(&self, i: usize) -> Bytes {
        let s = self.size[i];
        match self.kind(i) {
            Kind::Root => Bytes::default(),
            Kind::Native => Bytes { native: s, ..Bytes::default() },
            Kind::Managed => Bytes { managed: s, ..Bytes::default() },
            Kind::OffHeap => Bytes { off_heap: s, ..Bytes::default() },
        }
    }

    /// The depth-first post order from node 0 (the root last) and each node's index in it
    /// ([`NONE`]: not reached).
    fn post_order(&self) -> (Vec<u32>, Vec<u32>) {
        let n = self.len();
        let mut order = Vec::with_capacity(n);
        let mut po_of = vec![NONE; n];
        if n == 0 {
            return (order, po_of);
        }
        // Before its post-order index is set, a node on the stack is marked seen by this value.
        const SEEN: u32 = NONE - 1;
        let mut stack: Vec<(u32, u32)> = vec![(0, self.first_succ[0])];
        po_of[0] = SEEN;
        while let Some(top) = stack.last_mut() {
            let (v, e) = *top;
            if e < self.first_succ[v as usize + 1] {
                top.1 += 1;
                let c = self.succ[e as usize];
                if po_of[c as usize] == NONE {
                    po_of[c as usize] = SEEN;
                    stack.push((c, self.first_succ[c as usize]));
                }
            } else {
                po_of[v as usize] = order.len() as u32;
                order.push(v);
                stack.pop();
            }
        }
        (order, po_of)
    }
}

/// The dominator tree of a [`Graph`] and each node's retained bytes.
pub struct Dominators {
    idom: Vec<u32>,
    retained: Vec<Bytes>,
}

/// Cooper–Harvey–Kennedy's intersection, on post-order indices.
fn intersect(dom: &[u32], mut a: u32, mut b: u32) -> u32 {
    while a != b {
        while a < b {
            a = dom[a as usize];
        }
        while b < a {
            b = dom[b as usize];
        }
    }
    a
}

impl Dominators {
    /// Dominators and retained bytes of every node of `g`.
    pub fn of(g: &Graph) -> Dominators {
        let n = g.len();
        let (order, po_of) = g.post_order();
        let mut idom = vec![NONE; n];
        let mut retained: Vec<Bytes> = (0..n).map(|i| g.own(i)).collect();
        if order.is_empty() {
            return Dominators { idom, retained };
        }
        let m = order.len();
        let root = (m - 1) as u32;
        // Post-order index → its immediate dominator's post-order index.
        let mut dom = vec![NONE; m];
        dom[root as usize] = root;
        let mut changed = true;
        while changed {
            changed = false;
            for p in (0..m - 1).rev() {
                let v = order[p] as usize;
                let mut new = NONE;
                for &u in g.predecessors(v) {
                    let q = po_of[u as usize];
                    if q == NONE || dom[q as usize] == NONE {
                        continue;
                    }
                    new = if new == NONE { q } else { intersect(&dom, q, new) };
                }
                if new != NONE && dom[p] != new {
                    dom[p] = new;
                    changed = true;
                }
            }
        }
        // A node's dominator comes after it in post order: adding in post order sums subtrees.
        for p in 0..m - 1 {
            let (v, d) = (order[p] as usize, order[dom[p] as usize] as usize);
            idom[v] = d as u32;
            let r = retained[v];
            retained[d].add(&r);
        }
        Dominators { idom, retained }
    }

    /// Node `i`'s immediate dominator (None: the root, or not reached).
    pub fn idom(&self, i: usize) -> Option<usize> {
        self.idom.get(i).filter(|&&d| d != NONE).map(|&d| d as usize)
    }

    /// Node `i`'s retained bytes (its own included).
    pub fn retained(&self, i: usize) -> Bytes {
        self.retained[i]
    }

    /// Whether `a` dominates `b` (every node dominates itself); walks `b`'s dominator chain.
    pub fn dominates(&self, a: usize, b: usize) -> bool {
        let mut v = Some(b);
        while let Some(x) = v {
            if x == a {
                return true;
            }
            v = self.idom(x);
        }
        false
    }

    /// `i`'s dominators from the root down to `i` itself (empty when not reached).
    pub fn chain(&self, i: usize) -> Vec<usize> {
        if i != 0 && self.idom(i).is_none() {
            return Vec::new();
        }
        let mut c = vec![i];
        while let Some(d) = self.idom(*c.last().unwrap_or(&0)) {
            c.push(d);
        }
        c.reverse();
        c
    }
}

#[cfg(test)]
#[path = "dominators_tests.rs"]
mod tests;
