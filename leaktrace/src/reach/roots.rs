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

/// Threads' (tid, stack pointer, instruction pointer) and /proc/PID/maps → the root regions.
/// Thread stacks of threads that exited (glibc keeps them mapped for reuse) are not roots: an
/// anonymous writable mapping right above a small inaccessible one (a guard page) and holding
/// no live thread's stack pointer is skipped.
pub fn layout(maps: &str, threads: &[(i32, u64, u64)]) -> Layout {
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
                    // The .bss beyond the file's last page.
                    let path = prev.map(|p| p.path.clone()).unwrap_or_default();
                    regions.push(Region { start: l.start, end: l.end, kind: RootKind::Global { path } });
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
        let l = layout(MAPS, &threads);
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
