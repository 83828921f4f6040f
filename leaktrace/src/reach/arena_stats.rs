//! glibc malloc's own figure of the memory it holds, read from outside at every checkpoint
//! (the allocator's own figures where it exposes them): each arena's `system_mem`
//! (bytes the arena obtained from the system: the brk heap's extent for `main_arena`, its
//! heaps' read-write part for a thread arena; large chunks served by mmap are not in it), summed
//! over the arenas on `main_arena`'s `next` list. `main_arena` is libc's local symbol, from its
//! detached debug file when libc is stripped (libc6-dbg); without it the figure is not read and
//! the reason is given once. The words are read through /proc/PID/mem without stopping the
//! target: an arena growing meanwhile is read before or after its growth.

use std::os::unix::fs::FileExt as _;

use super::allocator::{ARENA_SIZE, BINS, NEXT};

/// Offset of `system_mem` in glibc's `struct malloc_state` on x86-64 (2.26 and later: after
/// `next`, `next_free` and `attached_threads`).
const SYSTEM_MEM: u64 = NEXT + 24;

/// Arenas followed at most.
const MAX_ARENAS: u32 = 1024;

/// Offset of `top` in `struct malloc_state` (x86-64, 2.26 and later: after the mutex, `flags`,
/// `have_fastchunks` and the 10 fastbin heads).
const TOP: u64 = 96;

/// Where the fields of glibc's `struct malloc_state` are, bytes from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) size: u64,
    pub(super) top: u64,
    pub(super) bins: u64,
    pub(super) next: u64,
    pub(super) system_mem: u64,
}

/// glibc 2.26 and later on x86-64: the layout used when libc's DWARF is not installed.
pub(super) const KNOWN_LAYOUT: Layout =
    Layout { size: ARENA_SIZE, top: TOP, bins: BINS, next: NEXT, system_mem: SYSTEM_MEM };

/// Largest `struct malloc_state` believed (glibc's is 2,200 bytes on x86-64).
const MAX_STATE_SIZE: u64 = 8192;

impl Layout {
    /// The layout from `struct malloc_state`'s byte size and member offsets (libc's DWARF), when
    /// it is one glibc could have: every field inside the structure, 8-byte aligned, `top` before
    /// the 254 words of `bins`, `bins` before `next`, `next` before `system_mem`.
    pub(super) fn from_members(size: u64, members: &std::collections::HashMap<String, u64>) -> Result<Layout, String> {
        let get = |n: &str| members.get(n).copied().ok_or_else(|| format!("struct malloc_state has no member {n}"));
        let l =
            Layout { size, top: get("top")?, bins: get("bins")?, next: get("next")?, system_mem: get("system_mem")? };
        let aligned = [l.top, l.bins, l.next, l.system_mem].iter().all(|o| o % 8 == 0);
        let ordered =
            l.top < l.bins && l.bins + 254 * 8 <= l.next && l.next < l.system_mem && l.system_mem + 8 <= l.size;
        if !aligned || !ordered || l.size > MAX_STATE_SIZE {
            return Err(format!("struct malloc_state's layout in libc's DWARF is not glibc's: {l:?}"));
        }
        Ok(l)
    }
}

/// The layout of `struct malloc_state` in the libc at `path` (mapped by `pid`), from its DWARF
/// (libc6-dbg's debug file, found by build ID inside the target's root); else [`KNOWN_LAYOUT`]
/// and why (said once as a warning).
fn layout_of(pid: u32, path: &str) -> (Layout, Option<String>) {
    let dwarf = super::symbols::dwarf_of(pid, path).ok_or_else(|| format!("no DWARF for {path} (install libc6-dbg)"));
    let found = dwarf.and_then(|data| {
        let file = object::File::parse(&*data).map_err(|e| format!("{path}'s debug file: {e}"))?;
        let structs = crate::runtimes::go::census::structs(&file, &["malloc_state"])?;
        let (size, members) = structs.get("malloc_state").ok_or("no struct malloc_state in libc's DWARF")?;
        Layout::from_members(*size, members)
    });
    match found {
        Ok(l) => (l, None),
        Err(e) => (
            KNOWN_LAYOUT,
            Some(format!("{e}: the known offsets of glibc 2.26+ on x86-64 are used for struct malloc_state")),
        ),
    }
}

/// Free chunks followed at most in one read, over every arena's bins: past it this checkpoint
/// has no free figure (a heap with that many free chunks is not walked at every checkpoint).
const MAX_FREE_CHUNKS: u32 = 20_000;

/// The word at byte `offset` of an arena's `struct malloc_state` (`state`, read whole).
fn field(state: &[u8], offset: u64) -> u64 {
    let at = offset as usize;
    state.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// Bytes free in the arena at `arena` (`state`: its `struct malloc_state`, read in one call):
/// its top chunk and the chunks in its bins (the unsorted bin, the small and large bins: bins
/// 1..=127), followed through their `fd` links with `word` (one read per chunk header and
/// link). Fastbins (chunks of at most 160 bytes, their links mangled since glibc 2.32) and the
/// threads' tcaches are not followed: their chunks count as in use, as `mallinfo` counts
/// tcache's. None when a link is not a chunk's (the target relinked a bin while it was read) or
/// the walk passes `budget` chunks in all.
fn arena_free_bytes(
    word: &dyn Fn(u64) -> Option<u64>,
    l: &Layout,
    arena: u64,
    state: &[u8],
    budget: &mut u32,
) -> Option<u64> {
    let size_of = |chunk: u64| word(chunk + 8).map(|s| s & !7);
    let top = field(state, l.top);
    let mut free = if top != 0 { size_of(top)? } else { 0 };
    for i in 1..=127u64 {
        // bin_at(arena, i): the bin's head seen as a chunk, whose fd and bk are its two words.
        let head = arena + l.bins + (i - 1) * 16 - 16;
        let mut cur = field(state, l.bins + (i - 1) * 16);
        while cur != head {
            if !cur.is_multiple_of(16) || *budget == 0 {
                return None;
            }
            *budget -= 1;
            free = free.saturating_add(size_of(cur)?);
            cur = word(cur + 16)?;
        }
    }
    Some(free)
}

/// Where glibc's arenas are in one process.
enum State {
    /// libc is not mapped yet (a launched command before the loader mapped it).
    Pending,
    /// `main_arena`'s address and the layout of its `struct malloc_state`.
    Found(u64, Layout),
    /// Why it cannot be read (said once).
    Failed,
}

/// glibc's arena figures of one process ([`GlibcArenaStats::read`]).
pub struct GlibcArenaStats {
    pid: u32,
    state: State,
    /// Why the layout is not libc's DWARF's, to be said once ([`GlibcArenaStats::take_note`]).
    note: Option<String>,
}

/// The arenas' own figure at one checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaFigures {
    /// Σ `system_mem` over the arenas, bytes.
    pub system_mem_bytes: u64,
    /// Arenas counted (`main_arena` and the thread arenas on its `next` list).
    pub arenas: u32,
    /// Σ over the arenas of their free bytes: the top chunk and the chunks in the bins
    /// ([`arena_free_bytes`]); None when a bin could not be followed at this read.
    /// `system_mem_bytes` − this is glibc's own count of the bytes its arenas have in use.
    pub free_bytes: Option<u64>,
}

impl GlibcArenaStats {
    pub fn new(pid: u32) -> GlibcArenaStats {
        GlibcArenaStats { pid, state: State::Pending, note: None }
    }

    /// Why `struct malloc_state`'s layout is the known offsets rather than libc's DWARF, once,
    /// after the first read that found `main_arena`.
    pub fn take_note(&mut self) -> Option<String> {
        self.note.take()
    }

    /// Find `main_arena` when libc is mapped: Ok(None) while it is not (try again at the next
    /// checkpoint), Err with the reason when its symbol is missing or not glibc's layout.
    fn locate(&mut self) -> Result<Option<(u64, Layout)>, String> {
        match self.state {
            State::Found(a, l) => return Ok(Some((a, l))),
            State::Failed => return Ok(None),
            State::Pending => {}
        }
        let mm = crate::procinfo::mm_task(self.pid);
        let maps = std::fs::read_to_string(format!("/proc/{mm}/maps")).map_err(|e| e.to_string())?;
        let Some((path, base)) = super::libc_of(&maps) else { return Ok(None) };
        let found = super::symbols::Symbols::new(self.pid).find(&path, base, "main_arena");
        let (layout, note) = layout_of(self.pid, &path);
        let result = match found {
            Some((addr, size)) if size == layout.size => Ok(addr),
            Some((_, size)) => {
                Err(format!("{path}'s main_arena is {size} bytes, not the {} of its struct malloc_state", layout.size))
            }
            None => Err(format!("no main_arena symbol in {path} or its debug file (install libc6-dbg)")),
        };
        match result {
            Ok(a) => {
                self.state = State::Found(a, layout);
                self.note = note;
                Ok(Some((a, layout)))
            }
            Err(e) => {
                self.state = State::Failed;
                Err(e)
            }
        }
    }

    /// The arenas' figures now: Ok(None) when libc is not mapped yet or the figures could not be
    /// read before (said then), Err once with the reason they cannot be read.
    pub fn read(&mut self) -> Result<Option<ArenaFigures>, String> {
        let Some((main, l)) = self.locate()? else { return Ok(None) };
        let mm = crate::procinfo::mm_task(self.pid);
        let Ok(mem) = std::fs::File::open(format!("/proc/{mm}/mem")) else { return Ok(None) };
        let word = |at: u64| {
            let mut b = [0u8; 8];
            mem.read_exact_at(&mut b, at).ok().map(|_| u64::from_le_bytes(b))
        };
        let mut f = ArenaFigures { system_mem_bytes: 0, arenas: 0, free_bytes: Some(0) };
        let mut budget = MAX_FREE_CHUNKS;
        let mut state = vec![0u8; l.size as usize];
        let mut cur = main;
        while f.arenas < MAX_ARENAS {
            // The whole malloc_state in one read: system_mem, top, the bin heads and next.
            if mem.read_exact_at(&mut state, cur).is_err() {
                return Ok(None);
            }
            f.system_mem_bytes = f.system_mem_bytes.saturating_add(field(&state, l.system_mem));
            f.arenas += 1;
            let free = f.free_bytes.and_then(|_| arena_free_bytes(&word, &l, cur, &state, &mut budget));
            f.free_bytes = f.free_bytes.zip(free).map(|(a, b)| a.saturating_add(b));
            // The next arena: an 8-aligned user-space address (the target's memory is untrusted).
            match field(&state, l.next) {
                n if n != main && n != 0 && n % 8 == 0 && n < (1 << 47) => cur = n,
                _ => break,
            }
        }
        Ok(Some(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// An arena at `A` whose bins are all empty (each head points at itself) but bin 1 (the
    /// unsorted bin: two chunks) and bin 100 (one chunk), with a top chunk.
    fn arena() -> (HashMap<u64, u64>, u64) {
        const A: u64 = 0x10_0000;
        let mut m = HashMap::new();
        for i in 1..=127u64 {
            let head = A + BINS + (i - 1) * 16 - 16;
            m.insert(head + 16, head);
            m.insert(head + 24, head);
        }
        let top = 0x20_0000;
        m.insert(A + TOP, top);
        m.insert(top + 8, 0x2_0000 | 1);
        let unsorted = A + BINS - 16;
        let (c1, c2) = (0x30_0000, 0x40_0000);
        m.insert(unsorted + 16, c1);
        m.insert(c1 + 8, 0x1_0000 | 1);
        m.insert(c1 + 16, c2);
        m.insert(c2 + 8, 0x8000 | 5);
        m.insert(c2 + 16, unsorted);
        let bin100 = A + BINS + 99 * 16 - 16;
        let c3 = 0x50_0000;
        m.insert(bin100 + 16, c3);
        m.insert(c3 + 8, 0x4000);
        m.insert(c3 + 16, bin100);
        (m, A)
    }

    /// The arena's `struct malloc_state` as one read gives it: the words of `m` at `a`.
    fn state(m: &HashMap<u64, u64>, a: u64) -> Vec<u8> {
        (0..ARENA_SIZE).step_by(8).flat_map(|o| m.get(&(a + o)).copied().unwrap_or(0).to_le_bytes()).collect()
    }

    /// This machine's libc (glibc 2.36, libc6-dbg installed by setup): the layout read from its
    /// DWARF is the known x86-64 one; a layout out of order is refused.
    #[test]
    fn malloc_state_layout_from_libcs_dwarf() {
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let (l, note) = layout_of(std::process::id(), libc);
        assert_eq!(note, None, "libc6-dbg's DWARF was not used");
        assert_eq!(l, KNOWN_LAYOUT);
        let mut m: HashMap<String, u64> =
            [("top", 96), ("bins", 112), ("next", 2160), ("system_mem", 2184)].map(|(k, v)| (k.to_string(), v)).into();
        assert_eq!(Layout::from_members(2200, &m), Ok(KNOWN_LAYOUT));
        m.insert("next".into(), 200);
        assert!(Layout::from_members(2200, &m).is_err());
        m.remove("next");
        assert!(Layout::from_members(2200, &m).is_err());
        let (l, note) = layout_of(std::process::id(), "/nonexistent/libc.so.6");
        assert_eq!(l, KNOWN_LAYOUT);
        assert!(note.is_some_and(|n| n.contains("known offsets")));
    }

    #[test]
    fn free_bytes_are_the_top_chunk_and_the_binned_chunks() {
        let (m, a) = arena();
        let word = |at: u64| m.get(&at).copied();
        let mut budget = 10;
        assert_eq!(
            arena_free_bytes(&word, &KNOWN_LAYOUT, a, &state(&m, a), &mut budget),
            Some(0x2_0000 + 0x1_0000 + 0x8000 + 0x4000)
        );
        assert_eq!(budget, 7);
        // Out of budget, or a link that is no chunk (relinked while read): no figure.
        let mut small = 2;
        assert_eq!(arena_free_bytes(&word, &KNOWN_LAYOUT, a, &state(&m, a), &mut small), None);
        let mut broken = m.clone();
        broken.insert(0x30_0000 + 16, 0x40_0008);
        let word = |at: u64| broken.get(&at).copied();
        assert_eq!(arena_free_bytes(&word, &KNOWN_LAYOUT, a, &state(&broken, a), &mut 10), None);
    }
}
