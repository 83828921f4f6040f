use super::*;

/// A graph of managed nodes of `sizes[i]` bytes (node 0 the root, size ignored) and `edges`.
fn graph(sizes: &[u64], edges: &[(u32, u32)]) -> Graph {
    let mut b = GraphBuilder::new();
    for &s in &sizes[1..] {
        b.add_managed(1, 0, s);
    }
    for &(f, t) in edges {
        b.add_edge(f, t);
    }
    b.build()
}

fn idoms(d: &Dominators, n: usize) -> Vec<Option<usize>> {
    (0..n).map(|i| d.idom(i)).collect()
}

/// 0 → 1 → {2, 3} → 4: the diamond's join is dominated by its fork.
#[test]
fn diamond() {
    let g = graph(&[0, 1, 10, 100, 1000], &[(0, 1), (1, 2), (1, 3), (2, 4), (3, 4)]);
    let d = Dominators::of(&g);
    assert_eq!(idoms(&d, 5), vec![None, Some(0), Some(1), Some(1), Some(1)]);
    assert_eq!(d.retained(1).managed, 1111);
    assert_eq!(d.retained(2).managed, 10);
    assert_eq!(d.retained(0).managed, 1111);
    assert_eq!(d.chain(4), vec![0, 1, 4]);
    assert!(d.dominates(1, 4) && !d.dominates(2, 4));
}

/// 0 → 1 → 2 → 3 → 1 (a cycle entered at 1), and 3 → 3 (a self-loop): 1 holds them all.
#[test]
fn cycle_and_self_loop() {
    let g = graph(&[0, 5, 6, 7], &[(0, 1), (1, 2), (2, 3), (3, 1), (3, 3)]);
    let d = Dominators::of(&g);
    assert_eq!(idoms(&d, 4), vec![None, Some(0), Some(1), Some(2)]);
    assert_eq!(d.retained(1).managed, 18);
    assert_eq!(d.retained(3).managed, 7);
}

/// A cycle entered at two places (0 → 1, 0 → 2, 1 ⇄ 2): neither dominates the other.
#[test]
fn cycle_entered_twice() {
    let g = graph(&[0, 5, 6, 7], &[(0, 1), (0, 2), (1, 2), (2, 1), (2, 3)]);
    let d = Dominators::of(&g);
    assert_eq!(idoms(&d, 4), vec![None, Some(0), Some(0), Some(2)]);
    assert_eq!(d.retained(2).managed, 13);
}

/// Nodes the root does not reach (4 → 5, 6 alone) have no dominator, keep their own size, and
/// do not count in the root's.
#[test]
fn unreachable_parts() {
    let g = graph(&[0, 1, 2, 3, 40, 50, 60], &[(0, 1), (1, 2), (2, 3), (4, 5), (4, 2)]);
    let d = Dominators::of(&g);
    assert_eq!(idoms(&d, 7), vec![None, Some(0), Some(1), Some(2), None, None, None]);
    assert_eq!(d.retained(4).managed, 40);
    assert_eq!(d.retained(0).managed, 6);
    assert!(d.chain(5).is_empty());
}

/// A module's dict holds extension objects, each owning a native block; a bounded cache and the
/// dict share one: the dict retains the native bytes of the objects only it holds, split by kind.
#[test]
fn retained_bytes_split_by_kind() {
    let mut b = GraphBuilder::new();
    let module = b.add_root(7);
    let dict = b.add_managed(1, 1, 100);
    let cache = b.add_managed(1, 2, 50);
    b.add_edge(module, dict);
    b.add_edge(module, cache);
    let mut objs = Vec::new();
    for _ in 0..3 {
        let o = b.add_managed(1, 3, 32);
        let blk = b.add_native(3000, 9);
        b.add_edge(dict, o);
        b.add_edge(o, blk);
        objs.push(o);
    }
    let direct = b.add_off_heap(4096, 11);
    b.add_edge(dict, direct);
    b.add_edge(cache, objs[2]);
    let g = b.build();
    let d = Dominators::of(&g);
    assert_eq!(g.kind(module as usize), Kind::Root);
    assert_eq!(g.tag(module as usize), 7);
    assert_eq!(d.retained(dict as usize), Bytes { native: 6000, managed: 164, off_heap: 4096 });
    assert_eq!(d.retained(cache as usize), Bytes { native: 0, managed: 50, off_heap: 0 });
    assert_eq!(d.retained(module as usize).total(), 6000 + 3000 + 100 + 50 + 96 + 4096);
    assert_eq!(d.idom(objs[2] as usize), Some(module as usize));
}

/// The dominators by definition, O(n²): `d` dominates `v` when removing `d` makes `v`
/// unreachable from the root; the immediate dominator is the strict dominator that all the
/// others dominate.
fn naive(n: usize, edges: &[(u32, u32)]) -> Vec<Option<usize>> {
    let reach = |removed: Option<usize>| {
        let mut seen = vec![false; n];
        let mut todo = vec![0usize];
        if removed == Some(0) {
            return seen;
        }
        seen[0] = true;
        while let Some(v) = todo.pop() {
            for &(f, t) in edges {
                let t = t as usize;
                if f as usize == v && !seen[t] && Some(t) != removed {
                    seen[t] = true;
                    todo.push(t);
                }
            }
        }
        seen
    };
    let all = reach(None);
    // doms[v]: strict dominators of v.
    let mut doms = vec![Vec::new(); n];
    for dn in 0..n {
        let r = reach(Some(dn));
        for v in 0..n {
            if v != dn && all[v] && !r[v] {
                doms[v].push(dn);
            }
        }
    }
    (0..n)
        .map(|v| {
            if v == 0 || !all[v] {
                return None;
            }
            doms[v].iter().copied().find(|&c| doms[v].iter().all(|&o| o == c || doms[c].contains(&o)))
        })
        .collect()
}

/// xorshift64*: a small seeded generator, so that a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random graphs (sparse and dense, with cycles, self-loops, duplicate edges and unreached
/// parts): the same immediate dominators as the naive computation, and each node's retained
/// bytes the sum of the sizes of the nodes it dominates.
#[test]
fn matches_naive_dominators_on_random_graphs() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..400 {
        let n = 1 + rng.below(40) as usize;
        let m = rng.below(4 * n as u64 + 1) as usize;
        let edges: Vec<(u32, u32)> = (0..m).map(|_| (rng.below(n as u64) as u32, rng.below(n as u64) as u32)).collect();
        let sizes: Vec<u64> = (0..n).map(|_| 1 + rng.below(1000)).collect();
        let g = graph(&sizes, &edges);
        let d = Dominators::of(&g);
        let want = naive(n, &edges);
        assert_eq!(idoms(&d, n), want, "case {case}: {n} nodes, edges {edges:?}");
        for v in 0..n {
            let expect: u64 =
                (1..n).filter(|&w| if v == 0 { want[w].is_some() } else { d.dominates(v, w) }).map(|w| sizes[w]).sum();
            let own = if v == 0 { 0 } else { sizes[v] };
            let expect = if v == 0 { expect } else { expect.max(own) };
            assert_eq!(d.retained(v).managed, expect, "case {case}: node {v}");
        }
    }
}
