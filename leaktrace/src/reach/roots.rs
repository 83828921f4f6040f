//! Which memory of the target is a root of the scan, from /proc/PID/maps and the stopped
//! threads' stack pointers: thread stacks, the writable data of mapped objects (.data, .bss
//! and relro), and heap memory that is no traced block (the brk heap, anonymous writable
//! mappings: arenas, blocks allocated before attach, runtimes' heaps).

use crate::procinfo;

/// What a root region is.
#[derive(Clone, Debug, PartialEq)]
pub enum RootKind {
    /// A thread's stack, from its stack pointer (− the 128-byte red zone for a thread
    /// interrupted in user code) to the mapping's end.
    Stack {
        /// Host thread id.
        tid: i32,
        /// The thread's instruction pointer (names the innermost frame).
        ip: u64,
    },
    /// Writable data (or relro) of the object at `path`; `base` is its load bias (start − file
    /// offset of its first mapping).
    Global { path: String },
    /// Heap memory that is not a traced block: "[heap]" or "anonymous".
    Untraced { region: &'static str },
}

/// One region to scan as a root, [start, end).
#[derive(Clone, Debug)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub kind: RootKind,
}

/// Leave the allocator's own mappings out of the untraced roots: `ranges`, [start, end), are
/// what the allocator mapped from inside a malloc-family call since attach
/// ([`crate::mappings::AddressSpace::allocator_ranges`]). What they hold is the allocator's:
/// its bookkeeping (jemalloc's extent descriptors point at every extent's first byte, so at the
/// first block of each slab and at every large block), freed regions with stale words, and
/// blocks, which are all traced (they were allocated after attach) and scanned as blocks when
/// reached. Mappings made before attach stay roots: the blocks in them are not traced.
pub fn leave_out(layout: &mut Layout, ranges: &[(u64, u64)]) {
    if ranges.is_empty() {
        return;
    }
    let regions = std::mem::take(&mut layout.regions);
    for r in regions {
        if !matches!(r.kind, RootKind::Untraced { .. }) {
            layout.regions.push(r);
            continue;
        }
        for (start, end) in crate::mappings::outside(r.start, r.end, ranges) {
            layout.regions.push(Region { start, end, kind: r.kind.clone() });
        }
    }
}

/// A stopped thread as the layout needs it.
#[derive(Clone, Copy, Debug)]
pub struct StoppedThread {
    pub tid: i32,
    /// Its stack pointer at the stop.
    pub sp: u64,
    /// Its instruction pointer at the stop.
    pub ip: u64,
    /// Scan the 128 bytes below the stack pointer too (the red zone of an interrupted leaf).
    pub red_zone: bool,
}

/// The maps of a process, reduced to what the scan needs.
pub struct Layout {
    /// Root regions, in address order within each kind.
    pub regions: Vec<Region>,
    /// Thread stacks no live thread uses, [start, end): glibc's cache of exited threads'
    /// stacks (and stacks of exited threads not joined yet). Their words are not roots, only
    /// the thread descriptor at their top (see [`descriptor_at_top`]).
    pub cached_stacks: Vec<(u64, u64)>,
    /// Executable mappings [start, end): a stack word inside one is a return address.
    pub code: Vec<(u64, u64)>,
    /// Object path → load bias (lowest start − its file offset), for naming globals.
    pub bases: std::collections::HashMap<String, u64>,
}

/// The end of each mapped ELF object's image (its loadable segments, `.bss` included), an
/// absolute address, by path: `base + max(p_vaddr + p_memsz)` over PT_LOAD (no base for a
/// non-PIE executable), rounded up to a page. Read from the ELF and program headers of the
/// very file mapped ([`crate::target_fs::open_mapped_or_path`], first 64 KiB), before the target is stopped.
/// Objects whose headers cannot be read are missing from the map.
pub fn image_ends(pid: u32, maps: &str) -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    for l in maps.lines().filter_map(procinfo::parse_maps_line) {
        if l.offset != 0 || !l.path.starts_with('/') || out.contains_key(&l.path) {
            continue;
        }
        let Ok(f) = crate::target_fs::open_mapped_or_path(pid, l.range, &l.path, l.dev, l.inode) else { continue };
        let mut head = Vec::with_capacity(64 << 10);
        if std::io::Read::read_to_end(&mut std::io::Read::take(f, 64 << 10), &mut head).is_err() {
            continue;
        }
        if let Some(end) = elf_image_end(&head, l.start) {
            out.insert(l.path.clone(), end);
        }
    }
    out
}

/// `image_ends` of one object from the start of its file, mapped (offset 0) at `start`.
fn elf_image_end(head: &[u8], start: u64) -> Option<u64> {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let hdr = object::elf::FileHeader64::<object::Endianness>::parse(head).ok()?;
    let endian = hdr.endian().ok()?;
    let phdrs = hdr.program_headers(endian, head).ok()?;
    let loads = phdrs.iter().filter(|p| p.p_type(endian) == object::elf::PT_LOAD);
    let lowest = loads.clone().map(|p| p.p_vaddr(endian)).min()?;
    let end = loads.map(|p| p.p_vaddr(endian).saturating_add(p.p_memsz(endian))).max()?;
    // ET_EXEC: addresses are absolute; ET_DYN: relative to the load bias (start − lowest page).
    let bias = if hdr.e_type(endian) == object::elf::ET_EXEC { 0 } else { start.saturating_sub(lowest & !0xfff) };
    Some((bias.saturating_add(end) + 0xfff) & !0xfff)
}

/// Threads' (tid, stack pointer, instruction pointer) and /proc/PID/maps → the root regions.
/// Thread stacks of threads that exited (glibc keeps them mapped for reuse) are not roots: an
/// anonymous writable mapping right above a small inaccessible one (a guard page) and holding
/// no live thread's stack pointer is skipped. An anonymous mapping right after an object's
/// last mapping is its `.bss` up to the object's image end (`image_end`, from
/// [`image_ends`]; the whole mapping when unknown), and untraced memory beyond (the kernel
/// merges an adjacent anonymous mapping, e.g. an allocator's, into the .bss tail).
pub fn layout(maps: &str, threads: &[StoppedThread], image_end: &std::collections::HashMap<String, u64>) -> Layout {
    let lines: Vec<procinfo::MapsLine<'_>> = maps.lines().filter_map(procinfo::parse_maps_line).collect();
    let mut regions = Vec::new();
    let mut cached_stacks = Vec::new();
    let mut code = Vec::new();
    let mut bases = std::collections::HashMap::new();
    for l in &lines {
        if l.path.starts_with('/') {
            let b = l.start.saturating_sub(l.offset);
            bases.entry(l.path.clone()).and_modify(|x: &mut u64| *x = (*x).min(b)).or_insert(b);
        }
    }
    for (i, l) in lines.iter().enumerate() {
        let prev = if i > 0 { lines.get(i - 1) } else { None };
        let next = lines.get(i + 1);
        if l.perms.as_bytes().get(2) == Some(&b'x') {
            code.push((l.start, l.end));
        }
        let rw = l.perms == "rw-p";
        let file = l.path.starts_with('/');
        // Threads whose stack pointer is in this mapping: their stacks, from the pointer up.
        let here: Vec<&StoppedThread> = threads.iter().filter(|t| t.sp >= l.start && t.sp < l.end).collect();
        if !here.is_empty() {
            for t in &here {
                let below = if t.red_zone { 128 } else { 0 };
                let from = t.sp.saturating_sub(below).max(l.start) & !7;
                regions.push(Region { start: from, end: l.end, kind: RootKind::Stack { tid: t.tid, ip: t.ip } });
            }
            continue;
        }
        if file {
            // .data (rw-p) and relro (r--p right below the object's rw-p data).
            let relro =
                l.perms == "r--p" && next.is_some_and(|n| n.start == l.end && n.path == l.path && n.perms == "rw-p");
            if rw || relro {
                regions.push(Region { start: l.start, end: l.end, kind: RootKind::Global { path: l.path.clone() } });
            }
            continue;
        }
        if !rw {
            continue;
        }
        match l.path.as_str() {
            "[heap]" => {
                regions.push(Region { start: l.start, end: l.end, kind: RootKind::Untraced { region: "[heap]" } })
            }
            "" => {
                let after_file = prev.is_some_and(|p| p.end == l.start && p.path.starts_with('/'));
                let after_guard = prev.is_some_and(|p| {
                    p.end == l.start && p.path.is_empty() && p.perms == "---p" && p.end - p.start <= 64 << 10
                });
                if after_file {
                    // The .bss beyond the file's last page, then whatever was mapped after it.
                    let path = prev.map(|p| p.path.clone()).unwrap_or_default();
                    let bss_end = image_end.get(&path).map_or(l.end, |&e| e.clamp(l.start, l.end));
                    if bss_end > l.start {
                        regions.push(Region { start: l.start, end: bss_end, kind: RootKind::Global { path } });
                    }
                    if bss_end < l.end {
                        regions.push(Region {
                            start: bss_end,
                            end: l.end,
                            kind: RootKind::Untraced { region: "anonymous" },
                        });
                    }
                } else if after_guard && l.start % (64 << 20) != 0 {
                    // A thread stack no live thread uses (glibc's stack cache): stale words,
                    // but its thread descriptor (and the DTV it points at) is glibc's.
                    cached_stacks.push((l.start, l.end));
                } else {
                    regions.push(Region {
                        start: l.start,
                        end: l.end,
                        kind: RootKind::Untraced { region: "anonymous" },
                    });
                }
            }
            // [stack] of an exited main thread, [vvar], [vdso], [vsyscall], named anon ([anon:..]).
            p if p.starts_with("[anon") => {
                regions.push(Region { start: l.start, end: l.end, kind: RootKind::Untraced { region: "anonymous" } })
            }
            _ => {}
        }
    }
    Layout { regions, cached_stacks, code, bases }
}

/// The thread descriptor (glibc's `struct pthread`) at the top of a thread stack mapping
/// [start, end) whose last `top.len()` bytes are `top`: x86-64 glibc puts it at the very top
/// (TLS_TCB_AT_TP), and its first words are `tcbhead_t`: `tcb` (offset 0) and `self` (offset
/// 16) both point at the descriptor itself. Returns [descriptor, end), the descriptor to the
/// mapping's end; None when no such pair of words is found.
pub fn descriptor_at_top(end: u64, top: &[u8]) -> Option<(u64, u64)> {
    let base = end - top.len() as u64;
    let word = |off: usize| top.get(off..off + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
    // The highest candidate first: the descriptor is the last thing in the mapping.
    (0..top.len().saturating_sub(24)).step_by(8).rev().find_map(|off| {
        let at = base + off as u64;
        (word(off) == Some(at) && word(off + 16) == Some(at)).then_some((at, end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0a0000000-55d0a0001000 r--p 00000000 08:01 100 /srv/server
55d0a0001000-55d0a0002000 r-xp 00001000 08:01 100 /srv/server
55d0a0003000-55d0a0004000 r--p 00002000 08:01 100 /srv/server
55d0a0004000-55d0a0005000 rw-p 00003000 08:01 100 /srv/server
55d0a0005000-55d0a0006000 rw-p 00000000 00:00 0
55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7f0000001000-7f0000801000 rw-p 00000000 00:00 0
7f0001000000-7f0001001000 ---p 00000000 00:00 0
7f0001001000-7f0001801000 rw-p 00000000 00:00 0
7f0002000000-7f0002100000 rw-p 00000000 00:00 0
7ffc00000000-7ffc00100000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn regions_by_kind() {
        let t = |tid, sp, ip, red_zone| StoppedThread { tid, sp, ip, red_zone };
        let threads = [t(10, 0x7ffc000ff000, 0x55d0a0001100, false), t(11, 0x7f0000800000, 0x55d0a0001200, true)];
        let l = layout(MAPS, &threads, &Default::default());
        let kinds: Vec<(u64, &RootKind)> = l.regions.iter().map(|r| (r.start, &r.kind)).collect();
        // relro, .data, .bss of the executable.
        assert!(matches!(kinds[0], (0x55d0a0003000, RootKind::Global { .. })));
        assert!(matches!(kinds[1], (0x55d0a0004000, RootKind::Global { .. })));
        assert!(matches!(kinds[2], (0x55d0a0005000, RootKind::Global { .. })));
        assert_eq!(kinds[3], (0x55d0a1000000, &RootKind::Untraced { region: "[heap]" }));
        // Thread 11's stack from its sp − 128; the unused cached stack is skipped; the arena is
        // untraced heap; the main thread's stack.
        assert_eq!(l.regions[4].start, 0x7f0000800000 - 128);
        assert!(matches!(kinds[4].1, RootKind::Stack { tid: 11, .. }));
        assert_eq!(kinds[5], (0x7f0002000000, &RootKind::Untraced { region: "anonymous" }));
        assert!(matches!(kinds[6].1, RootKind::Stack { tid: 10, .. }));
        assert_eq!(l.regions.len(), 7);
        // Thread 10 was stopped in a system call: its stack from its stack pointer exactly.
        assert_eq!(l.regions[6].start, 0x7ffc000ff000);
        assert_eq!(l.cached_stacks, vec![(0x7f0001001000, 0x7f0001801000)]);
        assert_eq!(l.bases["/srv/server"], 0x55d0a0000000);
        assert_eq!(l.code, vec![(0x55d0a0001000, 0x55d0a0002000)]);
    }
}

#[cfg(test)]
mod descriptor_tests {
    use super::*;

    /// The descriptor is found by its self pointers at offsets 0 and 16, the highest pair.
    #[test]
    fn descriptor_by_its_self_pointers() {
        let end = 0x7f0000801000u64;
        let mut top = vec![0u8; 4096];
        let base = end - 4096;
        let pd = end - 0x900;
        let put = |top: &mut Vec<u8>, at: u64, v: u64| {
            let o = (at - base) as usize;
            top[o..o + 8].copy_from_slice(&v.to_ne_bytes());
        };
        put(&mut top, pd, pd);
        put(&mut top, pd + 16, pd);
        put(&mut top, pd + 8, 0x55d0a1000010);
        assert_eq!(descriptor_at_top(end, &top), Some((pd, end)));
        assert_eq!(descriptor_at_top(end, &[0u8; 4096]), None);
    }
}

#[cfg(test)]
mod bss_tests {
    use super::*;

    /// An anonymous mapping after an object's data is its .bss only up to the image's end; the
    /// rest (an arena the kernel placed right after it) is untraced memory.
    #[test]
    fn bss_ends_at_the_image_end() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 100 /lib/libx.so
7f0000001000-7f0000002000 rw-p 00001000 08:01 100 /lib/libx.so
7f0000002000-7f0000200000 rw-p 00000000 00:00 0
";
        let ends = std::collections::HashMap::from([("/lib/libx.so".to_string(), 0x7f0000004000)]);
        let l = layout(maps, &[], &ends);
        let got: Vec<(u64, u64, &RootKind)> = l.regions.iter().map(|r| (r.start, r.end, &r.kind)).collect();
        // relro, .data, .bss, then the arena.
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!((got[1].0, got[1].1), (0x7f0000001000, 0x7f0000002000));
        assert!(matches!(got[2], (0x7f0000002000, 0x7f0000004000, RootKind::Global { .. })));
        let last = &l.regions.last().unwrap();
        assert_eq!((last.start, last.end), (0x7f0000004000, 0x7f0000200000));
        assert_eq!(last.kind, RootKind::Untraced { region: "anonymous" });
    }

    /// The image end of a real object: this test binary's own, from its ELF headers.
    #[test]
    fn image_end_of_a_real_object() {
        let pid = std::process::id();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap().display().to_string();
        let ends = image_ends(pid, &maps);
        let end = ends[&exe];
        // Past every file-backed mapping of the executable, and within a page of the last.
        let last = maps.lines().filter_map(procinfo::parse_maps_line).filter(|l| l.path == exe).map(|l| l.end).max();
        let last = last.unwrap();
        assert!(end >= last && end <= last + (64 << 20), "end {end:#x} last mapping end {last:#x}");
    }
}
