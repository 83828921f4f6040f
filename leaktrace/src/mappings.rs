//! Address-range bookkeeping of a target's anonymous mappings, fed by the kernel's
//! mmap/munmap/mremap/brk events (see `leaktrace_common::MapEvent`).
//!
//! Each mmap made outside an allocator call is an off-heap region owned by the call stack that
//! made it; each one made inside an allocator call (glibc's arenas, its mmap'ed large chunks)
//! belongs to the allocator. Regions are exact address ranges: a partial munmap trims or splits
//! them, mremap moves or resizes them, MAP_FIXED over an existing region replaces it. Mappings
//! made before attach are unknown and never counted. Resident bytes come from
//! /proc/PID/pagemap (present bit of each page).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt as _;

use leaktrace_common::event::MapEventKind;
use leaktrace_common::{MapEvent, SiteKey, SiteStats, owner};

/// Page size used for resident-byte counts.
pub const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    end: u64,
    owner: u32,
    /// Site of an off-heap region (tgid cleared); None for the allocator's.
    site: Option<SiteKey>,
}

/// Anonymous regions of one process, with per-site totals for off-heap mappings.
#[derive(Debug, Default)]
pub struct AddressSpace {
    regions: BTreeMap<u64, Region>,
    /// Cumulative totals per off-heap site: alloc_* = mapped, free_* = unmapped (bytes, count).
    sites: HashMap<SiteKey, SiteStats>,
    /// Off-heap sites (tgid cleared) that made a MAP_SHARED mapping: shared memory, not anonymous.
    shared: HashSet<SiteKey>,
    /// Current program break (from brk events).
    pub brk: Option<u64>,
}

impl AddressSpace {
    /// Apply one kernel event.
    pub fn apply(&mut self, ev: &MapEvent) {
        let Ok(kind) = MapEventKind::try_from(ev.kind) else { return };
        match kind {
            MapEventKind::Mmap if ev.len > 0 => {
                let len = round_up(ev.len);
                let site = (ev.owner == owner::OFFHEAP).then_some(SiteKey { tgid: 0, ..ev.site });
                // MAP_FIXED may replace what was there.
                self.remove(ev.addr, ev.addr + len, true);
                self.regions.insert(ev.addr, Region { end: ev.addr + len, owner: ev.owner, site });
                if let Some(site) = site {
                    let s = self.sites.entry(site).or_default();
                    s.alloc_bytes += len;
                    s.alloc_count += 1;
                    if is_shared_mapping(ev.flags) {
                        self.shared.insert(site);
                    }
                }
            }
            MapEventKind::Munmap if ev.len > 0 => {
                self.remove(ev.addr, ev.addr + round_up(ev.len), true);
            }
            MapEventKind::Mremap => self.mremap(ev.old_addr, round_up(ev.old_len), ev.addr, round_up(ev.len)),
            MapEventKind::Brk => self.brk = Some(ev.addr),
            _ => {}
        }
    }

    /// Whether off-heap site `key` (any tgid) made a MAP_SHARED mapping (a memfd, shm_open, a
    /// shared file mapping): its pages are shared memory (RssShmem or RssFile), not anonymous.
    pub fn is_shared(&self, key: &SiteKey) -> bool {
        self.shared.contains(&SiteKey { tgid: 0, ..*key })
    }

    fn mremap(&mut self, old: u64, old_len: u64, new: u64, new_len: u64) {
        let removed = self.remove(old, old + old_len, false);
        let Some(&(_, _, first)) = removed.first() else { return };
        let removed_bytes: u64 = removed.iter().map(|(s, e, _)| e - s).sum();
        if let Some(site) = first.site {
            let s = self.sites.entry(site).or_default();
            s.free_bytes += removed_bytes;
            s.alloc_bytes += new_len;
        }
        self.remove(new, new + new_len, true);
        self.regions.insert(new, Region { end: new + new_len, ..first });
    }

    /// Remove [start, end) from the regions, splitting the ones that straddle it. Returns the
    /// removed pieces; with `account`, credits them to their sites as unmapped.
    fn remove(&mut self, start: u64, end: u64, account: bool) -> Vec<(u64, u64, Region)> {
        let mut touched: Vec<(u64, Region)> = Vec::new();
        if let Some((&s, &r)) = self.regions.range(..start).next_back()
            && r.end > start
        {
            touched.push((s, r));
        }
        touched.extend(self.regions.range(start..end).map(|(&s, &r)| (s, r)));
        let mut removed = Vec::new();
        for (s, r) in touched {
            self.regions.remove(&s);
            if s < start {
                self.regions.insert(s, Region { end: start, ..r });
            }
            if r.end > end {
                self.regions.insert(end, r);
            }
            let (cs, ce) = (s.max(start), r.end.min(end));
            if account && let Some(site) = r.site {
                let st = self.sites.entry(site).or_default();
                st.free_bytes += ce - cs;
                if cs == s && ce == r.end {
                    st.free_count += 1;
                }
            }
            removed.push((cs, ce, r));
        }
        removed
    }

    /// Address ranges [start, end) of the off-heap regions (mappings made outside an allocator
    /// call since attach), in address order.
    pub fn offheap_ranges(&self) -> Vec<(u64, u64)> {
        self.regions.iter().filter(|(_, r)| r.site.is_some()).map(|(&s, r)| (s, r.end)).collect()
    }

    /// Address ranges [start, end) of the regions the allocator mapped from inside a
    /// malloc-family call since attach (glibc's arena heaps and large chunks, jemalloc's,
    /// tcmalloc's and mimalloc's extents, spans, segments and metadata), in address order.
    pub fn allocator_ranges(&self) -> Vec<(u64, u64)> {
        self.regions.iter().filter(|(_, r)| r.owner == owner::ALLOCATOR).map(|(&s, r)| (s, r.end)).collect()
    }

    /// Address ranges [start, end) of every region traced since attach (off-heap and the
    /// allocator's), in address order.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.regions.iter().map(|(&s, r)| (s, r.end)).collect()
    }

    /// Cumulative totals of every off-heap site (mapped = alloc, unmapped = free).
    pub fn offheap_sites(&self) -> impl Iterator<Item = (&SiteKey, &SiteStats)> {
        self.sites.iter()
    }

    /// Bytes currently mapped by the allocator itself (arenas, large chunks), not counting brk.
    pub fn allocator_mapped_bytes(&self) -> u64 {
        self.regions
            .values()
            .zip(self.regions.keys())
            .filter(|(r, _)| r.owner == owner::ALLOCATOR)
            .map(|(r, s)| r.end - s)
            .sum()
    }

    /// Resident bytes per off-heap site and of the allocator's regions, from /proc/PID/pagemap;
    /// the allocator's regions are counted outside `exclude` only (address ranges counted
    /// elsewhere: the arena heaps found in /proc/PID/maps). None when pagemap cannot be read
    /// (process gone).
    pub fn resident(&self, pid: u32, exclude: &[(u64, u64)]) -> Option<(HashMap<SiteKey, u64>, u64)> {
        let pagemap = File::open(format!("/proc/{}/pagemap", crate::procinfo::mm_task(pid))).ok()?;
        let mut per_site: HashMap<SiteKey, u64> = HashMap::new();
        let mut allocator = 0;
        for (&start, r) in &self.regions {
            match r.site {
                Some(site) => *per_site.entry(site).or_default() += resident_bytes(&pagemap, start, r.end)?,
                None => {
                    for (s, e) in outside(start, r.end, exclude) {
                        allocator += resident_bytes(&pagemap, s, e)?;
                    }
                }
            }
        }
        Some((per_site, allocator))
    }
}

/// The parts of [start, end) outside every range of `exclude` (sorted or not).
pub fn outside(start: u64, end: u64, exclude: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut cut: Vec<(u64, u64)> = exclude.iter().copied().filter(|&(s, e)| s < end && e > start).collect();
    cut.sort_unstable();
    let mut out = Vec::new();
    let mut at = start;
    for (s, e) in cut {
        if s > at {
            out.push((at, s.min(end)));
        }
        at = at.max(e);
        if at >= end {
            break;
        }
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// glibc's HEAP_MAX_SIZE on 64-bit targets (2 × DEFAULT_MMAP_THRESHOLD_MAX = 64 MiB): every heap
/// of a non-main arena is reserved at an address aligned to it, readable and writable from its
/// start (the part in use) and PROT_NONE after (the reserve the heap grows into).
pub const GLIBC_HEAP_MAX: u64 = 64 << 20;

/// The heaps of glibc's non-main arenas in `maps` (the text of /proc/PID/maps), whenever they
/// were made: anonymous private mappings that start at a [`GLIBC_HEAP_MAX`]-aligned address,
/// read-write, followed by the PROT_NONE rest of their reservation so that the two together
/// span exactly [`GLIBC_HEAP_MAX`] (a heap grown to its full size is one read-write mapping of
/// a multiple of it, when the kernel merged neighbours). Returns the read-write parts as
/// [start, end), in address order. Thread stacks (guard page below, not above) and other
/// mappings do not have this shape. The main arena is the brk heap (`[heap]`), not listed.
pub fn glibc_arena_heaps(maps: &str) -> Vec<(u64, u64)> {
    let lines: Vec<crate::procinfo::MapsLine<'_>> = maps.lines().filter_map(crate::procinfo::parse_maps_line).collect();
    let anon = crate::procinfo::MapsLine::is_anonymous;
    let mut out = Vec::new();
    for (k, l) in lines.iter().enumerate() {
        if !anon(l) || l.perms != "rw-p" || !l.start.is_multiple_of(GLIBC_HEAP_MAX) {
            continue;
        }
        let len = l.end - l.start;
        let reserve = lines
            .get(k + 1)
            .filter(|n| anon(n) && n.perms == "---p" && n.start == l.end)
            .map_or(0, |n| n.end.min(l.start + GLIBC_HEAP_MAX).saturating_sub(n.start));
        let partial = len < GLIBC_HEAP_MAX && len + reserve == GLIBC_HEAP_MAX;
        let full = len.is_multiple_of(GLIBC_HEAP_MAX);
        if partial || full {
            out.push((l.start, l.end));
        }
    }
    out
}

/// The allocator's mappings found by the blocks it handed out, whenever they were made: the
/// anonymous private read-write mappings of `maps` (the text of /proc/PID/maps) that hold one of
/// `blocks` (addresses where blocks began since attach, freed ones included, sorted: the
/// kernel's BLOCK_PAGES) or overlap one of `known` (the mappings found so at earlier
/// checkpoints), as [start, end) in address order. jemalloc's extents,
/// mimalloc's segments and tcmalloc's spans (when it maps rather than extends the brk heap) are
/// anonymous mmaps with no shape of their own; a block the process's malloc returned lies in
/// memory its allocator owns, which thread stacks, a runtime's heap or the program's own
/// mappings never hold. Left out: named mappings (the brk heap, `[stack]`, files) and mappings
/// overlapping `skip` (glibc's arena heaps, counted as such). What this cannot tell: a mapping
/// where no block began since attach is not found, and the kernel merges neighbouring
/// anonymous mappings of the same flags into one, so a mapping of the program's made next to
/// the allocator's (before attach) counts with it.
pub fn block_regions(maps: &str, blocks: &[u64], known: &[(u64, u64)], skip: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let overlaps = |ranges: &[(u64, u64)], s: u64, e: u64| ranges.iter().any(|&(a, b)| a < e && b > s);
    maps.lines()
        .filter_map(crate::procinfo::parse_maps_line)
        .filter(|l| l.is_anonymous() && l.perms == "rw-p" && !overlaps(skip, l.start, l.end))
        .filter(|l| {
            let first = blocks.partition_point(|&b| b < l.start);
            blocks.get(first).is_some_and(|&b| b < l.end) || overlaps(known, l.start, l.end)
        })
        .map(|l| (l.start, l.end))
        .collect()
}

/// Smallest mapping [`unclaimed_regions`] counts: jemalloc grows its virtual memory by at least
/// 2 MiB (a huge page), mimalloc's segments are 32 MiB, tcmalloc maps at least 1 MiB; the
/// loader's and the C library's small anonymous mappings (TLS, stdio) are under it.
pub const UNCLAIMED_MIN: u64 = 1 << 20;

/// Largest PROT_NONE mapping [`unclaimed_regions`] takes for a thread stack's guard.
const MAX_GUARD: u64 = 1 << 20;

/// The anonymous mappings of `maps` (the text of /proc/PID/maps) that nothing else claims: private,
/// read-write, unnamed, at least [`UNCLAIMED_MIN`] long, not a thread's stack (a PROT_NONE guard
/// of at most 1 MiB right below it: glibc's `pthread_create` stacks; a larger PROT_NONE mapping
/// there is a reservation's tail, as mimalloc leaves them) and overlapping none of `skip` (glibc's
/// arena heaps, the mappings found by their blocks, the mappings traced since attach), as
/// [start, end) in address order. In a process whose malloc is jemalloc, mimalloc or tcmalloc
/// and that runs no managed runtime, these are the allocator's mappings where no block began
/// since attach (memory it holds from before attach: retained, dirty or muzzy extents,
/// abandoned segments): their own allocators are the only other makers of large anonymous
/// mappings, and the program's own mappings made before attach cannot be told from them, which
/// is why the report calls them "likely" the allocator's.
pub fn unclaimed_regions(maps: &str, skip: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let lines: Vec<crate::procinfo::MapsLine<'_>> = maps.lines().filter_map(crate::procinfo::parse_maps_line).collect();
    let anon = crate::procinfo::MapsLine::is_anonymous;
    let overlaps = |s: u64, e: u64| skip.iter().any(|&(a, b)| a < e && b > s);
    let mut out = Vec::new();
    for (k, l) in lines.iter().enumerate() {
        if !anon(l) || l.perms != "rw-p" || l.end - l.start < UNCLAIMED_MIN || overlaps(l.start, l.end) {
            continue;
        }
        // A guard page is small (glibc's default is one page; JVM guard zones a few dozen); a
        // large PROT_NONE mapping right below is another allocator reservation's unused tail
        // (mimalloc's segments and arenas are reserved ahead and committed as used).
        let guarded = k > 0
            && anon(&lines[k - 1])
            && lines[k - 1].perms == "---p"
            && lines[k - 1].end == l.start
            && lines[k - 1].end - lines[k - 1].start <= MAX_GUARD;
        if !guarded {
            out.push((l.start, l.end));
        }
    }
    out
}

/// Resident bytes of [start, end), from pagemap entries (bit 63: page present in RAM).
pub fn resident_bytes(pagemap: &File, start: u64, end: u64) -> Option<u64> {
    let mut resident = 0;
    let mut page = start / PAGE;
    let last = end.div_ceil(PAGE);
    let mut buf = vec![0u8; 8 * 512];
    while page < last {
        let n = ((last - page) as usize).min(512);
        let bytes = &mut buf[..n * 8];
        pagemap.read_exact_at(bytes, page * 8).ok()?;
        resident +=
            bytes.chunks_exact(8).filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1).count() as u64;
        page += n as u64;
    }
    Some(resident * PAGE)
}

/// mmap `flags` of a shared mapping: MAP_SHARED (1) or MAP_SHARED_VALIDATE (3), not MAP_PRIVATE (2).
fn is_shared_mapping(flags: u32) -> bool {
    matches!(flags & 0x3, 0x1 | 0x3)
}

fn round_up(len: u64) -> u64 {
    len.div_ceil(PAGE) * PAGE
}

#[cfg(test)]
mod tests {
    use leaktrace_common::map_event;

    use super::*;

    #[test]
    fn glibc_arena_heaps_are_found_by_their_shape() {
        let maps = "\
55d4c8a00000-55d4c8a21000 rw-p 00000000 00:00 0                          [heap]
7f3a94000000-7f3a94132000 rw-p 00000000 00:00 0 
7f3a94132000-7f3a98000000 ---p 00000000 00:00 0 
7f3a98000000-7f3a9c000000 rw-p 00000000 00:00 0 
7f3a9c000000-7f3a9c021000 rw-p 00000000 00:00 0 
7f3a9c021000-7f3aa0000000 ---p 00000000 00:00 0 
7f3aa0000000-7f3aa0001000 ---p 00000000 00:00 0 
7f3aa0001000-7f3aa0801000 rw-p 00000000 00:00 0 
7f3aa4000000-7f3aa4100000 rw-p 00000000 00:00 0 
7f3aa4100000-7f3aa4200000 ---p 00000000 00:00 0 
7f3aa8000000-7f3aa8100000 rw-p 00000000 00:00 0          /memfd:x (deleted)
7f3aac000000-7f3aac021000 rw-p 00000000 fe:01 42        /usr/lib/x.so
";
        assert_eq!(
            glibc_arena_heaps(maps),
            vec![(0x7f3a94000000, 0x7f3a94132000), (0x7f3a98000000, 0x7f3a9c000000), (0x7f3a9c000000, 0x7f3a9c021000)]
        );
    }

    #[test]
    fn block_regions_are_the_mappings_holding_blocks() {
        let maps = "\
55d4c8a00000-55d4c8a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000400000 rw-p 00000000 00:00 0 
7f0000400000-7f0000600000 ---p 00000000 00:00 0 
7f0000600000-7f0000800000 rw-p 00000000 00:00 0 
7f1000000000-7f1000200000 rw-p 00000000 00:00 0 
7f2000000000-7f2000001000 ---p 00000000 00:00 0 
7f2000001000-7f2000801000 rw-p 00000000 00:00 0 
7f3000000000-7f3000100000 rw-p 00000000 00:00 0          /memfd:x (deleted)
7f3a94000000-7f3a94132000 rw-p 00000000 00:00 0 
7f3a94132000-7f3a98000000 ---p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        let arena = (0x7f3a94000000, 0x7f3a94132000);
        // Blocks in the first extent, in the brk heap, in a memfd, in the arena heap and on the
        // stack: only the extent is found (the others are named or counted elsewhere); the
        // PROT_NONE reserve, the thread stack and the mapping with no block are not.
        let blocks = [0x55d4c8a00100, 0x7f0000000010, 0x7f00003fff00, 0x7f3000000100, 0x7f3a94000100, 0x7ffd00000100];
        let found = block_regions(maps, &blocks, &[], &[arena]);
        assert_eq!(found, vec![(0x7f0000000000, 0x7f0000400000)]);
        // A block at the very end of a mapping is not in it; the one that starts there is.
        assert_eq!(block_regions(maps, &[0x7f0000800000], &[], &[]), Vec::<(u64, u64)>::new());
        assert_eq!(block_regions(maps, &[0x7f0000600000], &[], &[]), vec![(0x7f0000600000, 0x7f0000800000)]);
        // Found before, no block now: still the allocator's while a mapping overlaps it (here
        // grown by a merge).
        let known = [(0x7f1000000000, 0x7f1000100000)];
        assert_eq!(block_regions(maps, &[], &known, &[arena]), vec![(0x7f1000000000, 0x7f1000200000)]);
    }

    #[test]
    fn unclaimed_regions_leave_out_stacks_small_and_claimed_mappings() {
        // jemalloc-like extents (1 MiB-aligned, holes between), a thread stack under its guard
        // page, a small TLS mapping, a memfd, an arena heap and a claimed mapping.
        let maps = "\
55d4c8a00000-55d4c8a21000 rw-p 00000000 00:00 0                          [heap]
7f304bc00000-7f3084200000 rw-p 00000000 00:00 0 
7f3084300000-7f3084e00000 rw-p 00000000 00:00 0 
7f3085000000-7f3085200000 rw-p 00000000 00:00 0 
7f308adfc000-7f308adfd000 ---p 00000000 00:00 0 
7f308adfd000-7f308b5fd000 rw-p 00000000 00:00 0 
7f308d817000-7f308d81a000 rw-p 00000000 00:00 0 
7f3090000000-7f3090400000 rw-p 00000000 00:00 0          /memfd:x (deleted)
7f3a94000000-7f3a94132000 rw-p 00000000 00:00 0 
7f3a94132000-7f3a98000000 ---p 00000000 00:00 0 
7ffd00000000-7ffd00821000 rw-p 00000000 00:00 0                          [stack]
";
        let skip = [(0x7f3a94000000, 0x7f3a94132000), (0x7f3085100000, 0x7f3085101000)];
        assert_eq!(
            unclaimed_regions(maps, &skip),
            vec![(0x7f304bc00000, 0x7f3084200000), (0x7f3084300000, 0x7f3084e00000)]
        );
        assert_eq!(unclaimed_regions(maps, &[]).len(), 4);
        // mimalloc's reservations back to back: each read-write part sits on the previous one's
        // large PROT_NONE tail, which is no guard page.
        let maps = "\
7f5000000000-7f5000d00000 rw-p 00000000 00:00 0 
7f5000d00000-7f5004000000 ---p 00000000 00:00 0 
7f5004000000-7f5004d00000 rw-p 00000000 00:00 0 
7f5004d00000-7f5008000000 ---p 00000000 00:00 0 
";
        assert_eq!(
            unclaimed_regions(maps, &[]),
            vec![(0x7f5000000000, 0x7f5000d00000), (0x7f5004000000, 0x7f5004d00000)]
        );
    }

    #[test]
    fn ranges_outside_exclusions() {
        assert_eq!(outside(0, 100, &[]), vec![(0, 100)]);
        assert_eq!(outside(0, 100, &[(20, 30), (0, 10)]), vec![(10, 20), (30, 100)]);
        assert_eq!(outside(0, 100, &[(50, 200)]), vec![(0, 50)]);
        assert!(outside(10, 20, &[(0, 100)]).is_empty());
    }

    fn site(n: i32) -> SiteKey {
        SiteKey { stack: n as u64, kind: 1, ..Default::default() }
    }
    fn mmap(addr: u64, len: u64, own: u32, s: i32) -> MapEvent {
        MapEvent { kind: map_event::MMAP, addr, len, owner: own, site: site(s), ..Default::default() }
    }
    fn munmap(addr: u64, len: u64) -> MapEvent {
        MapEvent { kind: map_event::MUNMAP, addr, len, ..Default::default() }
    }
    fn live(a: &AddressSpace, s: i32) -> u64 {
        a.sites.get(&site(s)).map(|x| x.live_bytes()).unwrap_or(0)
    }

    #[test]
    fn partial_munmap_splits() {
        let mut a = AddressSpace::default();
        a.apply(&mmap(0x10000, 4 * PAGE, owner::OFFHEAP, 1));
        a.apply(&munmap(0x10000 + PAGE, PAGE));
        assert_eq!(live(&a, 1), 3 * PAGE);
        assert_eq!(a.regions.len(), 2);
        a.apply(&munmap(0x10000, 4 * PAGE));
        assert_eq!(live(&a, 1), 0);
        assert!(a.regions.is_empty());
    }

    #[test]
    fn munmap_across_regions_and_unknown_ranges() {
        let mut a = AddressSpace::default();
        a.apply(&mmap(0x10000, 2 * PAGE, owner::OFFHEAP, 1));
        a.apply(&mmap(0x12000, 2 * PAGE, owner::OFFHEAP, 2));
        a.apply(&munmap(0x8000, 0x9000)); // covers [0x8000, 0x11000): half of region 1
        assert_eq!(live(&a, 1), PAGE);
        assert_eq!(live(&a, 2), 2 * PAGE);
        a.apply(&munmap(0x100000, PAGE)); // never mapped since attach: ignored
        assert_eq!(live(&a, 2), 2 * PAGE);
    }

    #[test]
    fn mremap_moves_and_grows() {
        let mut a = AddressSpace::default();
        a.apply(&mmap(0x10000, PAGE, owner::OFFHEAP, 1));
        a.apply(&MapEvent {
            kind: map_event::MREMAP,
            old_addr: 0x10000,
            old_len: PAGE,
            addr: 0x40000,
            len: 3 * PAGE,
            ..Default::default()
        });
        assert_eq!(live(&a, 1), 3 * PAGE);
        assert_eq!(a.regions.keys().copied().collect::<Vec<_>>(), vec![0x40000]);
        a.apply(&munmap(0x40000, 3 * PAGE));
        assert_eq!(live(&a, 1), 0);
    }

    #[test]
    fn shared_mappings_are_told_from_private_ones() {
        let mut a = AddressSpace::default();
        let flagged = |addr, s, flags| MapEvent { flags, ..mmap(addr, PAGE, owner::OFFHEAP, s) };
        a.apply(&flagged(0x10000, 1, 0x22)); // MAP_PRIVATE | MAP_ANONYMOUS
        a.apply(&flagged(0x20000, 2, 0x01)); // MAP_SHARED (a memfd)
        a.apply(&flagged(0x30000, 3, 0x21)); // MAP_SHARED | MAP_ANONYMOUS
        a.apply(&flagged(0x40000, 4, 0x03)); // MAP_SHARED_VALIDATE
        let shared: Vec<bool> = (1..=4).map(|s| a.is_shared(&SiteKey { tgid: 42, ..site(s) })).collect();
        assert_eq!(shared, [false, true, true, true]);
    }

    #[test]
    fn allocator_regions_are_not_offheap() {
        let mut a = AddressSpace::default();
        a.apply(&mmap(0x10000, 33 * PAGE, owner::ALLOCATOR, 0));
        assert_eq!(a.allocator_mapped_bytes(), 33 * PAGE);
        assert_eq!(a.offheap_sites().count(), 0);
        a.apply(&munmap(0x10000, 33 * PAGE));
        assert_eq!(a.allocator_mapped_bytes(), 0);
    }

    #[test]
    fn resident_of_own_pages() {
        let mut v = vec![1u8; 64 * 1024];
        v[0] = 2;
        let start = v.as_ptr() as u64 / PAGE * PAGE + PAGE;
        let f = File::open("/proc/self/pagemap").unwrap();
        // Unprivileged readers see zeroed entries: this test runs as root, like the tracer.
        let r = resident_bytes(&f, start, start + 8 * PAGE).unwrap();
        assert_eq!(r, 8 * PAGE, "touched pages must be resident (run the tests as root)");
    }
}
