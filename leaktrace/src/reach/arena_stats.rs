//! glibc malloc's own figure of the memory it holds, read from outside at every checkpoint
//! (issue 30: the allocator's own figures where it exposes them): each arena's `system_mem`
//! (bytes the arena obtained from the system: the brk heap's extent for `main_arena`, its
//! heaps' read-write part for a thread arena; large chunks served by mmap are not in it), summed
//! over the arenas on `main_arena`'s `next` list. `main_arena` is libc's local symbol, from its
//! detached debug file when libc is stripped (libc6-dbg); without it the figure is not read and
//! the reason is given once. The words are read through /proc/PID/mem without stopping the
//! target: an arena growing meanwhile is read before or after its growth.

use std::os::unix::fs::FileExt as _;

use super::allocator::{ARENA_SIZE, NEXT};

/// Offset of `system_mem` in glibc's `struct malloc_state` on x86-64 (2.26 and later: after
/// `next`, `next_free` and `attached_threads`).
const SYSTEM_MEM: u64 = NEXT + 24;

/// Arenas followed at most.
const MAX_ARENAS: u32 = 1024;

/// Where glibc's arenas are in one process.
enum State {
    /// libc is not mapped yet (a launched command before the loader mapped it).
    Pending,
    /// `main_arena`'s address.
    Found(u64),
    /// Why it cannot be read (said once).
    Failed,
}

/// glibc's arena figures of one process ([`GlibcArenaStats::read`]).
pub struct GlibcArenaStats {
    pid: u32,
    state: State,
}

/// The arenas' own figure at one checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaFigures {
    /// Σ `system_mem` over the arenas, bytes.
    pub system_mem_bytes: u64,
    /// Arenas counted (`main_arena` and the thread arenas on its `next` list).
    pub arenas: u32,
}

impl GlibcArenaStats {
    pub fn new(pid: u32) -> GlibcArenaStats {
        GlibcArenaStats { pid, state: State::Pending }
    }

    /// Find `main_arena` when libc is mapped: Ok(None) while it is not (try again at the next
    /// checkpoint), Err with the reason when its symbol is missing or not glibc's layout.
    fn locate(&mut self) -> Result<Option<u64>, String> {
        match self.state {
            State::Found(a) => return Ok(Some(a)),
            State::Failed => return Ok(None),
            State::Pending => {}
        }
        let mm = crate::procinfo::mm_task(self.pid);
        let maps = std::fs::read_to_string(format!("/proc/{mm}/maps")).map_err(|e| e.to_string())?;
        let Some((path, base)) = super::libc_of(&maps) else { return Ok(None) };
        let found = super::symbols::Symbols::new(self.pid).find(&path, base, "main_arena");
        let result = match found {
            Some((addr, size)) if size == ARENA_SIZE => Ok(addr),
            Some((_, size)) => Err(format!("{path}'s main_arena is {size} bytes, not glibc 2.26+'s {ARENA_SIZE}")),
            None => Err(format!("no main_arena symbol in {path} or its debug file (install libc6-dbg)")),
        };
        match result {
            Ok(a) => {
                self.state = State::Found(a);
                Ok(Some(a))
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
        let Some(main) = self.locate()? else { return Ok(None) };
        let mm = crate::procinfo::mm_task(self.pid);
        let Ok(mem) = std::fs::File::open(format!("/proc/{mm}/mem")) else { return Ok(None) };
        let word = |at: u64| {
            let mut b = [0u8; 8];
            mem.read_exact_at(&mut b, at).ok().map(|_| u64::from_le_bytes(b))
        };
        let mut f = ArenaFigures { system_mem_bytes: 0, arenas: 0 };
        let mut cur = main;
        while f.arenas < MAX_ARENAS {
            let Some(sys) = word(cur + SYSTEM_MEM) else { return Ok(None) };
            f.system_mem_bytes = f.system_mem_bytes.saturating_add(sys);
            f.arenas += 1;
            match word(cur + NEXT) {
                Some(n) if n != main && n != 0 => cur = n,
                _ => break,
            }
        }
        Ok(Some(f))
    }
}
