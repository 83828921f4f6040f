//! The census's heap graph with the native blocks in it: the Python objects and their own
//! references, the traced live blocks that extension objects point into, one root over the
//! modules and live frames' locals; its dominator tree
//! ([`leaktrace_analysis::dominators`]) gives what each container retains, native bytes
//! included. Filled into the holders whose objects own native blocks.

use leaktrace_analysis::dominators::{Dominators, GraphBuilder};
use leaktrace_analysis::retain::Retained;
use leaktrace_analysis::runtimes::python::heap::{HolderKind, PyCensus};
use leaktrace_common::SiteKey;

use super::census;
use super::decode::Label;
use super::mem::FastMap;
use super::walk::{self, State, Walk};

/// Runtime number of Python objects in the graph.
const PYTHON: u8 = 1;

/// The node that holds node `i` in a container: going up from `i`, the referrer of the first
/// edge from the root that is a key, an index or a member (`__main__.PENDING` for
/// `__main__.PENDING['job-1']`); `i`'s root when there is none.
fn container(w: &Walk<'_>, i: u32) -> u32 {
    let chain = w.chain_to(i);
    for pair in chain.windows(2) {
        let l = w.nodes[pair[1] as usize].label;
        if matches!(l, Label::Key(_) | Label::Index(_) | Label::Any | Label::SetItem | Label::KeyObj) {
            return pair[0];
        }
    }
    chain[0]
}

/// Fill `Holder::retained` of census `c` from walk `w` (nothing when no object owns a block).
pub(super) fn fill(w: &Walk<'_>, c: &mut PyCensus) {
    if w.owned.is_empty() {
        return;
    }
    let n = w.nodes.len() as u32;
    let mut b = GraphBuilder::with_capacity(1 + w.nodes.len() + w.blocks.len(), w.edges.len() + w.owned.len());
    for node in &w.nodes {
        b.add_managed(PYTHON, node.ty, node.size);
    }
    for &(_, size, _) in &w.blocks {
        b.add_native(size, 0);
    }
    for (i, node) in w.nodes.iter().enumerate() {
        if node.state == State::Path && node.parent == walk::NONE {
            b.add_edge(0, i as u32 + 1);
        }
    }
    for &(f, t) in &w.edges {
        b.add_edge(f + 1, t + 1);
    }
    for &(f, blk) in &w.owned {
        b.add_edge(f + 1, n + 1 + blk);
    }
    let g = b.build();
    let d = Dominators::of(&g);
    // Per (type, signature) of objects on a path: their blocks, bytes, sites, one object.
    let mut owned_by: FastMap<u32, Vec<u32>> = FastMap::default();
    for &(f, blk) in &w.owned {
        owned_by.entry(f).or_default().push(blk);
    }
    type Group = (u64, u64, FastMap<SiteKey, u64>, u32);
    let mut groups: FastMap<(u32, u32), Group> = FastMap::default();
    for (&f, blks) in &owned_by {
        let node = &w.nodes[f as usize];
        if node.state != State::Path {
            continue;
        }
        let g = groups.entry((node.ty, node.sig)).or_insert_with(|| (0, 0, FastMap::default(), f));
        let mut seen = blks.clone();
        seen.sort_unstable();
        seen.dedup();
        for blk in seen {
            let (_, size, site) = w.blocks[blk as usize];
            g.0 += 1;
            g.1 = g.1.saturating_add(size);
            *g.2.entry(site).or_default() += 1;
        }
    }
    for ((ty, sig), (blocks, block_bytes, sites, example)) in groups {
        let name = &*w.types[ty as usize].name;
        let pattern = census::pattern(w, sig);
        let Some(t) = c.types.iter_mut().find(|t| t.name == name) else { continue };
        let Some(h) = t.holders.iter_mut().find(|h| h.kind == HolderKind::Path && h.pattern == pattern) else {
            continue;
        };
        let holder = container(w, example);
        let container = pattern.find('[').map_or_else(|| pattern.clone(), |i| pattern[..i].to_string());
        h.retained = Some(Retained::of(container, d.retained(holder as usize + 1), (blocks, block_bytes), sites));
    }
}
