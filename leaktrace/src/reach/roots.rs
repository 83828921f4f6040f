//! Which memory of the target is a root of the scan, from /proc/PID/maps and the stopped
//! threads' stack pointers: thread stacks, the writable data of mapped objects (.data, .bss
//! and relro), and heap memory that is no traced block (the brk heap, anonymous writable
//! mappings: arenas, blocks allocated before attach, runtimes' heaps).

use crate::procinfo;

/// What a root region is.
#[derive(Clone, Debug, PartialEq)]
pub enum RootKind {
    /// A thread's stack, from its stack pointer (− the 128-byte red zone) to the mapping's end.
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

/// The maps of a process, reduced to what the scan needs.
pub struct Layout {
    /// Root regions, in address order within each kind.
    pub regions: Vec<Region>,
    /// Executable mappings [start, end): a stack word inside one is a return address.
    pub code: Vec<(u64, u64)>,
    /// Object path → load bias (lowest start − its file offset), for naming globals.
    pub bases: std::collections::HashMap<String, u64>,
}

/// The end of each mapped ELF object's image (its loadable segments, `.bss` included), an
/// absolute address, by path: `base + max(p_vaddr + p_memsz)` over PT_LOAD (no base for a
/// non-PIE executable), rounded up to a page. Read from the ELF and program headers of the
/// very file mapped (through /proc/PID/map_files, first 64 KiB), before the target is stopped.
/// Objects whose headers cannot be read are missing from the map.
pub fn image_ends(pid: u32, maps: &str) -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    for l in maps.lines().filter_map(procinfo::parse_maps_line) {
        if l.offset != 0 || !l.path.starts_with('/') || out.contains_key(&l.path) {
            continue;
        }
        let Ok(f) = std::fs::File::open(format!("/proc/{pid}/map_files/{}", l.range)) else { continue };
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
pub fn layout(maps: &str, threads: &[(i32, u64, u64)], image_end: &std::collections::HashMap<String, u64>) -> Layout {
    let lines: Vec<procinfo::MapsLine<'_>> = maps.lines().filter_map(procinfo::parse_maps_line).collect();
    let mut regions = Vec::new();
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
        let here: Vec<&(i32, u64, u64)> = threads.iter().filter(|t| t.1 >= l.start && t.1 < l.end).collect();
        if !here.is_empty() {
            for &&(tid, sp, ip) in &here {
                let from = sp.saturating_sub(128).max(l.start) & !7;
                regions.push(Region { start: from, end: l.end, kind: RootKind::Stack { tid, ip } });
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
                    // A thread stack no live thread uses (glibc's stack cache): stale words.
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
    Layout { regions, code, bases }
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
        let threads = [(10, 0x7ffc000ff000, 0x55d0a0001100), (11, 0x7f0000800000, 0x55d0a0001200)];
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
        assert_eq!(l.bases["/srv/server"], 0x55d0a0000000);
        assert_eq!(l.code, vec![(0x55d0a0001000, 0x55d0a0002000)]);
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
