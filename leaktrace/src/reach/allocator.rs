//! The allocator's own bookkeeping is not a root: glibc's arenas (`struct malloc_state`: the
//! fastbin and bin heads, the top-chunk pointer) hold pointers to chunk headers, and a chunk
//! header is the last 8 bytes of the block before it when that block's request uses the next
//! chunk's `prev_size` field (a 1,000-byte request in a 1,008-byte chunk): `main_arena.top` would
//! then keep the newest block "reachable". The arenas are found from `main_arena` (libc's
//! symbol, from its debug file when the library is stripped: libc6-dbg) and their `next` list,
//! or, without symbols, by their shape in libc's data: empty bins point at themselves.

/// glibc's `struct malloc_state` on x86-64 (2.26 and later): its size, and the offsets of
/// `bins` and `next`.
pub(super) const ARENA_SIZE: u64 = 2200;
pub(super) const BINS: u64 = 112;
pub(super) const NEXT: u64 = 2160;
/// Bins 1..=127 (NBINS is 128; index 0 is unused): the last few large bins are all but always
/// empty.
const LAST_BINS: std::ops::RangeInclusive<u64> = 119..=127;

/// Most arenas followed (glibc's default limit is 8 per core).
const MAX_ARENAS: usize = 1024;

/// An empty bin `i` of the arena at `s` points at itself (`bin_at(m, i)`: the address of its
/// fd/bk pair minus 16): the signature of a malloc_state.
/// The word right after the last bin (`binmap`, a bitmap) is no such pointer: that anchors the
/// bins (with every bin empty, an address 16 bytes lower would match as well).
fn looks_like_arena(read: &dyn Fn(u64) -> Option<u64>, s: u64) -> bool {
    let empty = |i: u64| {
        let at = s + BINS + 16 * (i - 1);
        read(at) == Some(at - 16) && read(at + 8) == Some(at - 16)
    };
    LAST_BINS.clone().all(empty) && !empty(128)
}

/// [`looks_like_arena`], and its `next` is itself (the only arena) or looks like an arena too:
/// an address where a run of empty bins ends just before a non-empty one would match the bins
/// alone.
fn is_arena(read: &dyn Fn(u64) -> Option<u64>, s: u64) -> bool {
    looks_like_arena(read, s) && read(s + NEXT).is_some_and(|n| n == s || looks_like_arena(read, n))
}

/// The arenas [start, end) of the process: from `main_arena` at `main` (when known) or found in
/// `libc_data` (libc's writable data regions, [start, end)) by their shape, then every arena on
/// its `next` list. `read` reads one word of the stopped target.
pub(super) fn glibc_arenas(
    read: &dyn Fn(u64) -> Option<u64>,
    main: Option<u64>,
    libc_data: &[(u64, u64)],
) -> Vec<(u64, u64)> {
    let first = main.filter(|&m| looks_like_arena(read, m)).or_else(|| {
        libc_data.iter().find_map(|&(start, end)| {
            // (An arena may run on past the region: libc's .data into its .bss.)
            (start..end).step_by(8).find(|&s| is_arena(read, s))
        })
    });
    let Some(first) = first else { return Vec::new() };
    let mut out = vec![(first, first + ARENA_SIZE)];
    let mut cur = first;
    while out.len() < MAX_ARENAS {
        match read(cur + NEXT) {
            Some(n) if n != first && n != 0 && looks_like_arena(read, n) && !out.iter().any(|a| a.0 == n) => {
                out.push((n, n + ARENA_SIZE));
                cur = n;
            }
            _ => break,
        }
    }
    out
}

/// `regions` minus the ranges `holes` ([start, end) each): the parts of each region outside them.
pub(super) fn subtract(regions: Vec<super::roots::Region>, holes: &[(u64, u64)]) -> Vec<super::roots::Region> {
    let mut out = Vec::with_capacity(regions.len());
    for r in regions {
        let mut parts = vec![(r.start, r.end)];
        for &(hs, he) in holes {
            parts = parts
                .into_iter()
                .flat_map(|(s, e)| {
                    if he <= s || hs >= e {
                        vec![(s, e)]
                    } else {
                        [(s, hs.max(s)), (he.min(e), e)].into_iter().filter(|(a, b)| a < b).collect()
                    }
                })
                .collect();
        }
        out.extend(parts.into_iter().map(|(start, end)| super::roots::Region { start, end, kind: r.kind.clone() }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reach::roots::{Region, RootKind};

    /// Two arenas built in this process's memory shape: found from the first by the signature,
    /// the second by `next`; a region is cut around them.
    #[test]
    fn arenas_by_shape_and_next() {
        let mut mem = std::collections::HashMap::new();
        let a = 0x10000u64;
        let b = 0x90000u64;
        for s in [a, b] {
            for i in 1..=127u64 {
                let at = s + BINS + 16 * (i - 1);
                mem.insert(at, at - 16);
                mem.insert(at + 8, at - 16);
            }
        }
        mem.insert(a + NEXT, b);
        mem.insert(b + NEXT, a);
        let read = |p: u64| Some(mem.get(&p).copied().unwrap_or(0));
        assert_eq!(glibc_arenas(&read, None, &[(0xf000, 0x12000)]), vec![(a, a + ARENA_SIZE), (b, b + ARENA_SIZE)]);
        assert_eq!(glibc_arenas(&read, Some(b), &[]).len(), 2);
        assert!(glibc_arenas(&read, Some(a + 8), &[]).is_empty());
        let r = Region { start: 0xf000, end: 0x12000, kind: RootKind::Global { path: "/lib/libc.so.6".into() } };
        let got: Vec<(u64, u64)> = subtract(vec![r], &[(a, a + ARENA_SIZE)]).iter().map(|r| (r.start, r.end)).collect();
        assert_eq!(got, vec![(0xf000, a), (a + ARENA_SIZE, 0x12000)]);
    }

    /// This process's own glibc: the arena found by its shape in libc's writable data is
    /// `main_arena` (the symbol, from libc6-dbg when installed; else only found).
    #[test]
    fn main_arena_of_this_process_by_shape() {
        let p = Box::new([0u8; 100]); // malloc is initialised
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let Some((libc, base)) = super::super::libc_of(&maps) else { return }; // not glibc
        let data: Vec<(u64, u64)> = maps
            .lines()
            .filter_map(crate::procinfo::parse_maps_line)
            .filter(|l| l.path == libc && l.perms == "rw-p")
            .map(|l| (l.start, l.end))
            .collect();
        let pid = std::process::id();
        let read = |a: u64| {
            let mut w = [0u8; 8];
            (super::super::read_remote(pid, &mut w, &[(a, 8)]) == 8).then(|| u64::from_ne_bytes(w))
        };
        let found = glibc_arenas(&read, None, &data);
        assert!(!found.is_empty(), "no arena in {data:x?}");
        if let Some((addr, size)) = super::super::symbols::Symbols::new(pid).find(&libc, base, "main_arena") {
            assert_eq!((found[0].0, size), (addr, ARENA_SIZE));
        }
        drop(p);
    }
}
