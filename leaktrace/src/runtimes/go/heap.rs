//! Go's own heap profile read from outside (`--heap-census`): the runtime's memory-profile
//! buckets (`runtime.mbuckets`, linked by `allnext`), each a `bucket` header, its allocation
//! stack (`nstk` return addresses) and its `memRecord`, whose `active` cycle is the profile
//! `pprof heap` reports: in-use objects and bytes as of the last completed GC, sampled by the
//! runtime once per `runtime.MemProfileRate` bytes on average and scaled here as pprof scales
//! them (`scaleHeapSample`, runtime/pprof/protomem.go). No pprof endpoint is needed in the
//! program; the profile is empty when the runtime does not profile (`MemProfileRate` 0: the
//! linker sets `runtime.disableMemoryProfiling` in a program that never references
//! `runtime.MemProfile`).

use std::collections::HashMap;

use leaktrace_analysis::holds::GoHeapSite;

/// Buckets read at most.
pub const MAX_BUCKETS: usize = 200_000;
/// Frames of a bucket's stack at most (the runtime keeps 32).
const MAX_STACK: u64 = 64;
/// Largest `runtime.bucket` header believed from the DWARF (it is 48 B).
const MAX_BUCKET_HEADER: u64 = 4096;
/// Frames kept of a site's stack in the recording.
const KEPT_FRAMES: usize = 12;

/// Where the fields of `runtime.bucket` are (DWARF), bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketLayout {
    /// `unsafe.Sizeof(bucket{})`: the stack follows the header.
    pub size: u64,
    pub allnext: u64,
    pub nstk: u64,
}

/// pprof's estimate of the objects and bytes a bucket's samples stand for.
pub fn scale(count: u64, bytes: u64, rate: u64) -> (u64, u64) {
    if count == 0 || bytes == 0 || rate <= 1 {
        return (count, bytes);
    }
    let avg = bytes as f64 / count as f64;
    let s = 1.0 / (1.0 - (-avg / rate as f64).exp());
    ((count as f64 * s) as u64, (bytes as f64 * s) as u64)
}

/// The in-use heap by Go function: walk the buckets from `head` (the value of
/// `runtime.mbuckets`), `read(address, length)` reading the target's memory and `names(pcs)`
/// naming a stack of return addresses, innermost first (inlined calls as frames of their own).
/// Errors: the first bucket cannot be read.
pub fn read_heap(
    read: &dyn Fn(u64, usize) -> Result<Vec<u8>, String>,
    head: u64,
    layout: BucketLayout,
    rate: u64,
    names: &mut dyn FnMut(&[u64]) -> Vec<String>,
) -> Result<(Vec<GoHeapSite>, bool), String> {
    // The layout comes from the target's DWARF: a header it cannot hold is refused.
    if layout.size > MAX_BUCKET_HEADER
        || layout.allnext.saturating_add(8) > layout.size
        || layout.nstk.saturating_add(8) > layout.size
    {
        return Err(format!("runtime.bucket's DWARF layout does not hold together: {layout:?}"));
    }
    let u64_at = |b: &[u8], o: u64| {
        b.get(o as usize..o as usize + 8).map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
    };
    let mut by_function: HashMap<String, GoHeapSite> = HashMap::new();
    let mut largest: HashMap<String, u64> = HashMap::new();
    let mut b = head;
    let mut n = 0;
    while b != 0 && n < MAX_BUCKETS {
        let header = match read(b, layout.size as usize) {
            Ok(h) => h,
            Err(e) if n == 0 => return Err(e),
            Err(_) => break,
        };
        n += 1;
        let nstk = u64_at(&header, layout.nstk).min(MAX_STACK);
        let next = u64_at(&header, layout.allnext);
        let Ok(rest) = read(b.wrapping_add(layout.size), (nstk * 8 + 32) as usize) else {
            b = next;
            continue;
        };
        b = next;
        let rec = nstk * 8;
        let (allocs, frees) = (u64_at(&rest, rec), u64_at(&rest, rec + 8));
        let (alloc_bytes, free_bytes) = (u64_at(&rest, rec + 16), u64_at(&rest, rec + 24));
        let (objects, bytes) = scale(allocs.saturating_sub(frees), alloc_bytes.saturating_sub(free_bytes), rate);
        if bytes == 0 {
            continue;
        }
        let pcs: Vec<u64> = (0..nstk).map(|i| u64_at(&rest, i * 8)).collect();
        let stack = names(&pcs);
        let function = stack.iter().find(|f| !f.starts_with("runtime.")).or(stack.first()).cloned().unwrap_or_default();
        let site = by_function
            .entry(function.clone())
            .or_insert_with(|| GoHeapSite { function: function.clone(), ..Default::default() });
        site.inuse_objects = site.inuse_objects.saturating_add(objects);
        site.inuse_bytes = site.inuse_bytes.saturating_add(bytes);
        let top = largest.entry(function).or_default();
        if bytes > *top {
            *top = bytes;
            site.stack = stack.into_iter().take(KEPT_FRAMES).collect();
        }
    }
    let mut sites: Vec<GoHeapSite> = by_function.into_values().collect();
    sites.sort_by(|a, b| b.inuse_bytes.cmp(&a.inuse_bytes).then_with(|| a.function.cmp(&b.function)));
    Ok((sites, b != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_scaled_as_pprof_does() {
        // 10 samples of 1024 B at the default rate (512 KiB): each stands for ~512 objects.
        let (o, b) = scale(10, 10 * 1024, 512 * 1024);
        assert!((5100..5200).contains(&o), "{o}");
        assert_eq!(b, o * 1024 + (b - o * 1024));
        assert!((b as f64 / o as f64 - 1024.0).abs() < 1.0);
        assert_eq!(scale(10, 10_240, 1), (10, 10_240));
        assert_eq!(scale(0, 0, 512 * 1024), (0, 0));
    }

    #[test]
    fn buckets_walked_and_grouped_by_go_function() {
        // Two buckets: header of 48 B (allnext at 8, nstk at 40), then the stack, then the record.
        let layout = BucketLayout { size: 48, allnext: 8, nstk: 40 };
        let mut mem: HashMap<u64, Vec<u8>> = HashMap::new();
        let bucket = |allnext: u64, stk: &[u64], rec: [u64; 4]| {
            let mut h = vec![0u8; 48];
            h[8..16].copy_from_slice(&allnext.to_le_bytes());
            h[40..48].copy_from_slice(&(stk.len() as u64).to_le_bytes());
            let mut rest: Vec<u8> = stk.iter().flat_map(|p| p.to_le_bytes()).collect();
            rest.extend(rec.iter().flat_map(|x| x.to_le_bytes()));
            (h, rest)
        };
        let (h1, r1) = bucket(0x2000, &[0x101, 0x201], [10, 2, 10_240, 2048]);
        let (h2, r2) = bucket(0, &[0x101, 0x301], [5, 5, 5120, 5120]);
        mem.insert(0x1000, h1);
        mem.insert(0x1030, r1);
        mem.insert(0x2000, h2);
        mem.insert(0x2030, r2);
        let read = |a: u64, l: usize| mem.get(&a).map(|v| v[..l].to_vec()).ok_or(format!("{a:#x}"));
        let mut names = |pcs: &[u64]| -> Vec<String> {
            pcs.iter()
                .map(|&pc| match pc - 1 {
                    0x100 => "runtime.mallocgc".to_string(),
                    0x200 => "main.remember".to_string(),
                    _ => "main.other".to_string(),
                })
                .collect()
        };
        let (sites, cut) = read_heap(&read, 0x1000, layout, 1, &mut names).expect("read");
        assert!(!cut);
        assert_eq!(sites.len(), 1, "the freed bucket holds nothing: {sites:?}");
        assert_eq!(sites[0].function, "main.remember");
        assert_eq!((sites[0].inuse_objects, sites[0].inuse_bytes), (8, 8192));
        assert_eq!(sites[0].stack, ["runtime.mallocgc", "main.remember"]);
    }
}
