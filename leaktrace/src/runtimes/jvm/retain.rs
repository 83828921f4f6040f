//! The JVM heap dump's graph with the off-heap memory in it: the dump's objects and references,
//! and the traced native blocks that direct buffers own (`java.nio.Buffer.address` of a
//! `java.nio.Direct*` instance, the memory `Unsafe.allocateMemory` took from malloc) matched by
//! address; one root over the GC roots. Its dominator tree
//! ([`leaktrace_analysis::dominators`]) gives what each GC root's object retains, off-heap bytes
//! included: the holders of the off-heap blocks, named by their root (`App.BUFFERS`).

use std::collections::HashMap;

use leaktrace_analysis::dominators::{Dominators, GraphBuilder};
use leaktrace_analysis::retain::Retained;
use leaktrace_common::SiteKey;

use super::hprof::Graph;
use crate::reach::blocks::Block;

/// Runtime number of JVM objects in the graph.
const JVM: u8 = 2;
/// Holders kept, most off-heap bytes first.
const MAX_HOLDERS: usize = 20;
/// Dominators followed up from a block at most before its holder is given up.
const MAX_DEPTH: usize = 1 << 16;

/// The block of `blocks` (sorted by address) holding address `a`.
fn holding(blocks: &[Block], a: u64) -> Option<usize> {
    let i = blocks.partition_point(|b| b.addr <= a).checked_sub(1)?;
    (a < blocks[i].addr.saturating_add(blocks[i].size.max(1))).then_some(i)
}

/// The GC roots' objects that retain off-heap blocks of `blocks` (the traced live blocks,
/// sorted by address) through direct buffers: for each block owned by a direct buffer, the
/// nearest dominator that a GC root refers to; most off-heap bytes first, at most
/// [`MAX_HOLDERS`]. `Retained::sites` lists the blocks' sites for the caller to name.
pub fn retainers(g: &Graph, blocks: &[Block]) -> Vec<Retained> {
    let objs = g.objs();
    let n = objs.len() as u32;
    let mut b = GraphBuilder::with_capacity(1 + objs.len() + g.direct.len(), objs.len() * 2);
    for (i, o) in objs.iter().enumerate() {
        b.add_managed(JVM, (o.class & 0xffff_ffff) as u32, o.size as u64);
        for to in g.references(i as u32) {
            b.add_edge(i as u32 + 1, to + 1);
        }
    }
    let mut block_node: HashMap<usize, u32> = HashMap::new();
    for &(obj, addr) in &g.direct {
        let Some(k) = holding(blocks, addr) else { continue };
        let node = *block_node.entry(k).or_insert_with(|| b.add_off_heap(blocks[k].size, 0));
        b.add_edge(obj + 1, node);
    }
    if block_node.is_empty() {
        return Vec::new();
    }
    // The roots' objects, static fields first (root_objects' order): the first root names it.
    let mut named: HashMap<u32, (String, String)> = HashMap::new();
    for (kind, name, obj) in g.root_objects() {
        b.add_edge(0, obj + 1);
        named.entry(obj + 1).or_insert_with(|| (kind.to_string(), name.to_string()));
    }
    let graph = b.build();
    let d = Dominators::of(&graph);
    type Group = (u64, u64, HashMap<SiteKey, u64>);
    let mut groups: HashMap<u32, Group> = HashMap::new();
    for (&k, &node) in &block_node {
        let mut v = d.idom(node as usize);
        let mut depth = 0;
        while let Some(x) = v {
            if x == 0 || depth > MAX_DEPTH {
                break;
            }
            if named.contains_key(&(x as u32)) {
                let e = groups.entry(x as u32).or_default();
                e.0 += 1;
                e.1 = e.1.saturating_add(blocks[k].size);
                *e.2.entry(blocks[k].site).or_default() += 1;
                break;
            }
            v = d.idom(x);
            depth += 1;
        }
    }
    let mut out: Vec<Retained> = groups
        .into_iter()
        .filter(|&(x, _)| x <= n)
        .map(|(x, (blocks, block_bytes, sites))| {
            let (kind, name) = &named[&x];
            let container =
                if kind == "static field" { name.clone() } else { format!("{name} ({})", g.class_of(x - 1)) };
            Retained::of(container, d.retained(x as usize), (blocks, block_bytes), sites)
        })
        .collect();
    out.sort_by(|a, b| b.off_heap.cmp(&a.off_heap).then_with(|| a.container.cmp(&b.container)));
    out.truncate(MAX_HOLDERS);
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::hprof::tests::{Dump, class_dump, id, instance};
    use super::*;

    /// `App.LIST` → an Object[] of two direct buffers (one pointing 8 bytes into its block), a
    /// third buffer held by `App.OTHER` itself, and a `Deallocator` (a root of its own) holding
    /// the first buffer's address: the list retains its two blocks, the Deallocator shares none
    /// (were it an edge, the first block would be held by two roots and counted to neither).
    #[test]
    fn direct_buffers_blocks_go_to_the_root_that_holds_them() {
        let mut d = Dump::new();
        let names =
            ["App", "java/nio/DirectByteBuffer", "java/nio/DirectByteBuffer$Deallocator", "[Ljava/lang/Object;"];
        for (i, s) in names.iter().chain(&["LIST", "address", "OTHER"]).enumerate() {
            d.string(1 + i as u64, s);
        }
        for (k, c) in [100u64, 101, 102, 103].iter().enumerate() {
            d.load_class(k as u32 + 1, *c, k as u64 + 1);
        }
        let mut h = Vec::new();
        class_dump(&mut h, 100, 0, &[(5, 300), (7, 402)], &[]);
        class_dump(&mut h, 101, 0, &[], &[(6, 11)]);
        class_dump(&mut h, 102, 0, &[], &[(6, 11)]);
        class_dump(&mut h, 103, 0, &[], &[]);
        h.push(0x22);
        id(&mut h, 300);
        h.extend(0u32.to_be_bytes());
        h.extend(2u32.to_be_bytes());
        id(&mut h, 103);
        for v in [400u64, 401] {
            id(&mut h, v);
        }
        instance(&mut h, 400, 101, &0x1000u64.to_be_bytes());
        instance(&mut h, 401, 101, &0x2008u64.to_be_bytes());
        instance(&mut h, 402, 101, &0x3000u64.to_be_bytes());
        instance(&mut h, 403, 102, &0x1000u64.to_be_bytes());
        h.push(0xFF);
        id(&mut h, 403);
        d.record(0x1C, &h);
        let g = super::super::hprof::read(d.0.as_slice(), Instant::now() + Duration::from_secs(5)).expect("a dump");
        let site = SiteKey::default();
        let block = |addr, size| Block { addr, size, site };
        let blocks = [block(0x1000, 100), block(0x2000, 64), block(0x3000, 32), block(0x5000, 8)];
        let r = retainers(&g, &blocks);
        let got: Vec<(&str, u64, u64)> = r.iter().map(|x| (x.container.as_str(), x.off_heap, x.blocks)).collect();
        assert_eq!(got, [("App.LIST", 164, 2), ("App.OTHER", 32, 1)]);
        assert!(r[0].managed > 0, "the list's own objects are counted as managed bytes");
        assert!(retainers(&g, &blocks[3..]).is_empty(), "no block owned by a buffer: no holder");
    }
}
