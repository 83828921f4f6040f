//! Entry points of the fuzz targets (`fuzz/`, `cargo xtask fuzz`) for the parsers of what a
//! target sends: each takes the bytes as the target would send them and runs everything the
//! recorder runs on them. They never panic, hang or allocate past their caps on any input:
//! that is what the fuzzing checks. Re-exported as [`crate::fuzzing`].

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use leaktrace_analysis::holds::{SnapshotCost, Taken};
use serde_json::Value;

use crate::runtimes::go::heap::{BucketLayout, read_heap};
use crate::runtimes::node::dom::Dominators;
use crate::runtimes::node::snap::{First, Heap, parse};
use crate::runtimes::node::snapshots::{NewObjects, top_path};

/// An HPROF heap dump: read (with a time limit), then the paths to a few classes.
pub fn hprof(data: &[u8]) {
    if let Ok(g) = crate::runtimes::jvm::hprof::read(data, Instant::now() + Duration::from_secs(5)) {
        let _ = g.paths_to(&["java.lang.Object[]".into(), "byte[]".into(), "Rec".into(), "class@0x64".into()]);
    }
}

/// The first snapshot's summary, as [`crate::runtimes::node::census::NodeCensus`] keeps it.
fn first_of(h: &Heap) -> First {
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut ids = HashSet::with_capacity(h.count());
    for i in 0..h.count() {
        ids.insert(h.field(i, h.n_id));
        *counts.entry(h.class(i)).or_default() += 1;
    }
    let cost = SnapshotCost::default();
    First { at: Instant::now(), took_s: 0.0, ids, counts, objects: h.count() as u64, used: 0, cost }
}

/// A V8 heap snapshot's JSON: parsed, then compared with itself minus its first half of ids
/// as the second snapshot is: new objects by constructor, dominators, the top path.
pub fn v8_snapshot(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(h) = parse(text) else { return };
    let mut first = first_of(&h);
    let keep: Vec<u64> = first.ids.iter().copied().filter(|id| id % 2 == 0).collect();
    first.ids = keep.into_iter().collect();
    let new = NewObjects::of(&h, &first);
    let dom = Dominators::of(&h);
    let list = new.constructors(&h, &dom, &first);
    for top in list.iter().take(3) {
        let _ = top_path(&h, &dom, &new.is_new, top);
    }
    for i in 0..h.count().min(64) {
        let _ = (dom.retained(i), dom.idom(i));
    }
}

/// What the inspector answers: the bytes up to the first NUL are the reply to `/json/list`,
/// the rest is one protocol message (a snapshot chunk, an answer, or a sampling profile).
pub fn cdp(data: &[u8]) {
    let (list, rest) = data.split_at(data.iter().position(|&b| b == 0).unwrap_or(data.len()));
    let _ = crate::runtimes::node::cdp::ws_url(&crate::runtimes::node::cdp::read_list_reply(list));
    let Ok(v) = serde_json::from_slice::<Value>(rest.get(1..).unwrap_or(&[])) else { return };
    let mut c = crate::runtimes::node::cdp::Collected { text: String::new(), first_s: None, chunks: 0 };
    for _ in 0..3 {
        let _ = c.absorb(&v, "HeapProfiler.takeHeapSnapshot", "HeapProfiler.addHeapSnapshotChunk", 7, 1 << 16);
    }
    let _ = crate::runtimes::node::census::sampling(&v["result"]["profile"], Taken::default(), 0.0);
    let _ = crate::runtimes::node::census::sampling(&v, Taken::default(), 0.0);
}

/// A Go executable: its symbols, `runtime.g`'s and `runtime.bucket`'s DWARF layouts, and its
/// types and package variables (the typed heap walk's).
pub fn go_binary(data: &[u8]) {
    if let Ok(file) = object::File::parse(data) {
        let _ = crate::runtimes::go::census::parse_binary_for_fuzzing(&file);
        let _ = crate::runtimes::go::dwarf::read(&file);
    }
}

/// Go's memory-profile buckets: the first 32 bytes are the bucket layout (size, allnext,
/// nstk), the head and the profiling rate; the rest is the target's memory from 0x10000.
pub fn go_buckets(data: &[u8]) {
    let _ = go_buckets_sites(data);
}

/// [`go_buckets`]: the sites read.
fn go_buckets_sites(data: &[u8]) -> Option<Vec<leaktrace_analysis::holds::GoHeapSite>> {
    let (head, mem) = data.split_first_chunk::<40>()?;
    let word = |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    let layout = BucketLayout { size: word(0) & 0xffff, allnext: word(1) & 0xffff, nstk: word(2) & 0xffff };
    const BASE: u64 = 0x10000;
    let read = |addr: u64, len: usize| -> Result<Vec<u8>, String> {
        let at = addr.checked_sub(BASE).and_then(|a| usize::try_from(a).ok()).ok_or("unmapped")?;
        mem.get(at..at.checked_add(len).ok_or("unmapped")?).map(<[u8]>::to_vec).ok_or_else(|| "unmapped".into())
    };
    let mut names = |pcs: &[u64]| pcs.iter().map(|pc| format!("f{}", pc % 7)).collect::<Vec<String>>();
    read_heap(&read, word(3), layout, word(4), &mut names).ok().map(|(sites, _)| sites)
}

#[cfg(test)]
mod tests {
    /// A crash `cargo xtask fuzz` found (fuzz/regressions/go_buckets): two buckets whose
    /// in-use bytes add up past 2^64 for one function; the sum saturates (it overflowed).
    #[test]
    fn go_bucket_sums_saturate() {
        let data =
            include_bytes!("../../../fuzz/regressions/go_buckets/crash-3ddc7a71d4ab423c4a94c3dd0d484180fdfc8e53");
        let sites = super::go_buckets_sites(data).expect("the buckets read");
        assert!(sites.iter().any(|s| s.inuse_bytes == u64::MAX || s.inuse_objects == u64::MAX), "{sites:?}");
    }

    /// Crashes `cargo xtask fuzz` found (fuzz/regressions/python_walk): a type whose item size
    /// times an object's `ob_size` passes 2^64, then such a size plus a managed dict's 16
    /// bytes; the object's size and the census's total saturate (they overflowed).
    #[test]
    fn python_object_sizes_saturate() {
        for data in [
            &include_bytes!("../../../fuzz/regressions/python_walk/crash-47dd9302e0c094c66fe01defdb392c3dc31c70ed")[..],
            &include_bytes!("../../../fuzz/regressions/python_walk/crash-356331b2e96efc9fab4593f4b04841f94e94495d")[..],
        ] {
            let census = crate::runtimes::python::heap::walk_image(data).expect("a census");
            assert!(census.types.iter().any(|t| t.bytes == u64::MAX), "{:?}", census.types);
            assert_eq!(census.bytes, u64::MAX, "the total saturates too");
        }
    }
}
