//! The unwind rule of one program counter, for the stack walk (`unwind.rs`): a per-CPU cache
//! keyed by (tgid, pc); on a miss, `bpf_find_vma` gives the pc's VMA, its file's (device,
//! inode) is looked up in `UNWIND_OBJECTS`, and the object's rows (a slice of `UNWIND_ROWS`) are
//! binary-searched. Also the kernel structure offsets the agent sets at load, and the hash
//! step the walks and site keys share. See docs/kernel.md ("Stack walk").

use aya_ebpf::helpers::generated::bpf_probe_read_kernel as probe_read_kernel_raw;
use aya_ebpf::helpers::generated::{bpf_find_vma, bpf_get_current_task_btf, bpf_loop};
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use leaktrace_common::{ObjectId, ObjectTable, UnwindRow, counter, kernel_offset, unwind};

use crate::maps::count;

/// Kernel structure field offsets (`leaktrace_common::kernel_offset`), set by the agent from the
/// running kernel's BTF at load time. All zero: the agent found none, unwind tables are off and
/// every frame is walked by frame pointers.
#[unsafe(no_mangle)]
static KERNEL_OFFSETS: [u32; kernel_offset::NUM] = [0; kernel_offset::NUM];

/// Object identity → its slice of `UNWIND_ROWS`. Filled by the agent for every object a target
/// maps (shared by all processes that map the same file).
#[map]
static UNWIND_OBJECTS: HashMap<ObjectId, ObjectTable> = HashMap::with_max_entries(4096, 0);

/// Every object's rows, one after another (each object's sorted by pc). Sized by the agent
/// (--max-unwind-rows); rows of objects that do not fit are not loaded (counted by the agent).
#[map]
static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, 0);

/// A cached rule for (tgid, pc): the row's fields, or `NO_RULE` with `no_table` set.
#[repr(C)]
#[derive(Clone, Copy)]
struct CachedRule {
    pc: u64,
    generation: u32,
    tgid: u32,
    row: UnwindRow,
}

const CACHE_SLOTS: u32 = 4096;

/// Steps of the row binary search: objects have at most 2^24 rows.
const ROW_SEARCH_STEPS: u32 = 24;
/// log2 of the page size.
const PAGE_SHIFT: u64 = 12;

/// Per-CPU direct-mapped cache of rules by (tgid, pc): a stack walked before costs one lookup and
/// one or two stack reads per frame.
#[map]
static UNWIND_CACHE: PerCpuArray<CachedRule> = PerCpuArray::with_max_entries(CACHE_SLOTS, 0);

/// A 64-bit mixing step (multiply, then fold the high half down), so that every input bit
/// reaches every output bit before the next frame is combined.
#[inline(always)]
pub fn mix(x: u64) -> u64 {
    let h = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 32)
}

#[inline(always)]
pub(crate) fn offset(i: usize) -> u64 {
    // Read through a volatile load: the agent sets the global at load time.
    // SAFETY: a read of this object's own global (aligned, initialized); volatile, so the value
    // the agent set at load is read.
    unsafe { core::ptr::read_volatile(&KERNEL_OFFSETS[i]) as u64 }
}

/// The rule for `pc` of process `tgid` ([`rule`]), as a global BPF function (exported to the
/// linker by build.rs): the verifier checks it once, on its own, with any arguments, instead of
/// once per state of the walk that calls it. Returns the row's 8 bytes (see [`unpack`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_unwind_rule(tgid: u64, pc: u64, generation: u64, fault: u64) -> u64 {
    let row =
        if fault != 0 { rule::<true>(tgid as u32, pc, generation) } else { rule::<false>(tgid as u32, pc, generation) };
    (row.pc as u64)
        | ((row.cfa_offset as u64) << 32)
        | ((row.rbp_offset as u8 as u64) << 48)
        | ((row.kind as u64) << 56)
}

/// The row packed by [`leaktrace_unwind_rule`].
#[inline(always)]
pub(crate) fn unpack(x: u64) -> UnwindRow {
    UnwindRow { pc: x as u32, cfa_offset: (x >> 32) as u16, rbp_offset: (x >> 48) as u8 as i8, kind: (x >> 56) as u8 }
}

/// The unwind rule for `pc` of process `tgid`: from the per-CPU cache, else found and cached.
#[inline(always)]
fn rule<const FAULT: bool>(tgid: u32, pc: u64, generation: u64) -> UnwindRow {
    let slot = (mix(pc ^ ((tgid as u64) << 47)) as u32) & (CACHE_SLOTS - 1);
    let cached = UNWIND_CACHE.get_ptr_mut(slot);
    if let Some(c) = cached {
        // SAFETY: a valid per-CPU map value (get_ptr_mut checked the index); read once.
        let c = unsafe { &*c };
        if c.pc == pc && c.tgid == tgid && c.generation == generation as u32 {
            return c.row;
        }
    }
    // Both walks go through the mapping cache: `bpf_find_vma` only try-locks the address space,
    // and another tracer attaching a uprobe to a library the process maps holds its lock for
    // writing (uprobe registration), so a lookup in a malloc probe fails while tests or agents
    // attach beside it. Taken for no rule, that made the frame-pointer chain go on from a
    // general-purpose %rbp (0: a false outermost frame).
    let _ = FAULT;
    let Some(row) = lookup_cached(tgid, pc, generation) else {
        // The VMA could not be looked at now (its lock was busy): this pc's rule from an
        // older generation of the tables, when this CPU cached one (a pc keeps its rule while
        // its object stays mapped); else BUSY, not cached.
        if let Some(c) = cached {
            // SAFETY: as above.
            let c = unsafe { &*c };
            if c.pc == pc && c.tgid == tgid {
                return c.row;
            }
        }
        return UnwindRow { kind: unwind::BUSY, ..UnwindRow::default() };
    };
    if let Some(c) = cached {
        // SAFETY: the same map value, written whole.
        unsafe { *c = CachedRule { pc, generation: generation as u32, tgid, row } };
    }
    row
}

/// What `bpf_find_vma`'s callback reports about the VMA of a pc.
#[repr(C)]
struct VmaInfo {
    start: u64,
    end: u64,
    pgoff: u64,
    dev: u64,
    ino: u64,
    /// The mapping's inode address: 0 for anonymous memory (JIT code), which has no object.
    found: u64,
}

/// 8 bytes of kernel memory at `addr`, 0 when the read fails (the helper zeroes its destination
/// then, so no branch is needed: see [`vma_info`]).
#[inline(always)]
fn kernel_word(addr: u64) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: a checked copy of kernel memory into a local (bpf_probe_read_kernel).
    unsafe { probe_read_kernel_raw((&raw mut v).cast(), 8, addr as *const core::ffi::c_void) };
    v
}

/// `bpf_find_vma` callback: the VMA's start, end, page offset and file identity.
///
/// Branch-free: the kernel verifies a callback as if it ran any number of times, until the
/// states at its entry repeat, and each branch here (a zero on one path, a value on the other,
/// written to the caller's `VmaInfo`) made a new one: 728 passes, 69 K instructions of the
/// 157 K of every allocator-entry program on kernel 6.18. A read through a null or failed
/// pointer reads 0, so an anonymous mapping ends with `found` 0.
extern "C" fn vma_info(_task: *mut core::ffi::c_void, vma: *mut core::ffi::c_void, out: *mut VmaInfo) -> i64 {
    // SAFETY: bpf_find_vma passes the context given to it: `lookup`'s `VmaInfo`.
    let out = unsafe { &mut *out };
    let vma = vma as u64;
    let file = kernel_word(vma + offset(kernel_offset::VM_FILE));
    let inode = kernel_word(file + offset(kernel_offset::F_INODE));
    let sb = kernel_word(inode + offset(kernel_offset::I_SB));
    out.start = kernel_word(vma + offset(kernel_offset::VM_START));
    out.end = kernel_word(vma + offset(kernel_offset::VM_END));
    out.pgoff = kernel_word(vma + offset(kernel_offset::VM_PGOFF));
    out.ino = kernel_word(inode + offset(kernel_offset::I_INO));
    // s_dev is a 32-bit dev_t.
    out.dev = kernel_word(sb + offset(kernel_offset::S_DEV)) & 0xffff_ffff;
    out.found = inode;
    0
}

/// The VMA of `pc` in the current task's address space (`bpf_find_vma`) and its object's table.
/// Err(None): the VMA could not be looked at now (busy); Err(Some(row)): no mapping holds the
/// pc (`NO_VMA`), or one the walk has no rows for (no-rule).
#[inline(always)]
fn vma_table(pc: u64) -> Result<(VmaInfo, ObjectTable), Option<UnwindRow>> {
    let mut info = VmaInfo { start: 0, end: 0, pgoff: 0, dev: 0, ino: 0, found: 0 };
    let callback = vma_info as extern "C" fn(*mut core::ffi::c_void, *mut core::ffi::c_void, *mut VmaInfo) -> i64;
    // SAFETY: `vma_info` has bpf_find_vma's callback signature; `info` outlives the call.
    let r = unsafe {
        bpf_find_vma(
            bpf_get_current_task_btf().cast(),
            pc,
            callback as *mut core::ffi::c_void,
            (&raw mut info).cast(),
            0,
        )
    };
    if r == -16 {
        // -EBUSY: the address space's lock is taken, or (interrupts off) the CPU's deferred
        // unlock of an earlier lookup has not run yet.
        return Err(None);
    }
    if r == -2 {
        // -ENOENT: no mapping holds the pc.
        return Err(Some(UnwindRow { kind: unwind::NO_VMA, ..UnwindRow::default() }));
    }
    if r != 0 || info.found == 0 || info.end <= info.start {
        return Err(Some(UnwindRow::default()));
    }
    let id = ObjectId { dev: info.dev, ino: info.ino };
    // SAFETY: a hash-map lookup; the value is copied out at once.
    let Some(table) = (unsafe { UNWIND_OBJECTS.get(&id) }).copied() else {
        count(counter::UNWIND_NO_TABLE);
        return Err(Some(UnwindRow::default()));
    };
    Ok((info, table))
}

/// A mapping a walk looked up: its range and where its object's rows are.
#[repr(C)]
#[derive(Clone, Copy)]
struct CachedVma {
    tgid: u64,
    generation: u64,
    start: u64,
    end: u64,
    /// The object's virtual address of a pc in this mapping is `pc + bias`.
    bias: i64,
    first_row: u32,
    rows: u32,
}

const VMA_CACHE_SLOTS: u32 = 256;

/// Per-CPU direct-mapped cache of mappings by (tgid, pc / 1 MiB), for both walks. Entries are
/// as stale as the rule cache's: checked by tgid, generation and range.
#[map]
static VMA_CACHE: PerCpuArray<CachedVma> = PerCpuArray::with_max_entries(VMA_CACHE_SLOTS, 0);

/// Find the row for `pc` in the current task's address space: its mapping from `VMA_CACHE`,
/// else from `bpf_find_vma` (then cached), the mapping's object, the object's rows. None when
/// the mapping could not be looked at (busy); a default (no-rule) row when there is no VMA, no
/// file, no table or no row. Only file mappings with a table are cached.
#[inline(always)]
fn lookup_cached(tgid: u32, pc: u64, generation: u64) -> Option<UnwindRow> {
    if offset(kernel_offset::VM_FILE) == 0 {
        return Some(UnwindRow::default());
    }
    let slot = (mix((pc >> 20) ^ ((tgid as u64) << 40)) as u32) & (VMA_CACHE_SLOTS - 1);
    let Some(entry) = VMA_CACHE.get_ptr_mut(slot) else {
        // (Never: the index is masked to the map's size. Not `lookup`: a second row search
        // would be a second copy of its loop for the verifier.)
        return Some(UnwindRow::default());
    };
    // SAFETY: a per-CPU map value; a walk preempted by another on this CPU reads an entry of
    // the other's, told apart by tgid, generation and range.
    let e = unsafe { &mut *entry };
    if !(e.tgid == tgid as u64 && e.generation == generation && e.start <= pc && pc < e.end) {
        let (info, table) = match vma_table(pc) {
            Ok(found) => found,
            Err(row) => return row,
        };
        *e = CachedVma {
            tgid: tgid as u64,
            generation,
            start: info.start,
            end: info.end,
            bias: table.vaddr_minus_offset + ((info.pgoff << PAGE_SHIFT) as i64) - info.start as i64,
            first_row: table.first_row,
            rows: table.rows,
        };
    }
    // Read back from the map value (not from the values above): one state for the search.
    let vaddr = (pc as i64).wrapping_add(e.bias) as u64;
    if vaddr > u32::MAX as u64 {
        return Some(UnwindRow::default());
    }
    Some(search(e.first_row, e.rows, vaddr as u32))
}

/// State of a row binary search (the `bpf_loop` context of `search_step`): the answer, if any,
/// is in `[lo, lo + len)`.
#[repr(C)]
struct Search {
    lo: u64,
    len: u64,
    pc: u64,
}

/// One halving step of the row search. Returns 1 to stop.
extern "C" fn search_step(_index: u64, s: *mut Search) -> i64 {
    // SAFETY: bpf_loop passes the context given to it: `search`'s `Search` on its stack.
    let s = unsafe { &mut *s };
    if s.len <= 1 {
        return 1;
    }
    let half = s.len / 2;
    let mid = s.lo + half;
    match UNWIND_ROWS.get(mid as u32) {
        Some(r) if r.pc as u64 <= s.pc => s.lo = mid,
        Some(_) => {}
        None => {
            s.len = 0;
            return 1;
        }
    }
    s.len -= half;
    0
}

/// The last row of `rows[first..first + count]` whose pc is at or below `pc` (no-rule when none).
/// The halving steps run in a `bpf_loop` callback: as a plain loop, the verifier explores every
/// branch of every step.
#[inline(always)]
fn search(first: u32, count: u32, pc: u32) -> UnwindRow {
    if count == 0 {
        return UnwindRow::default();
    }
    let mut s = Search { lo: first as u64, len: count as u64, pc: pc as u64 };
    let callback = search_step as extern "C" fn(u64, *mut Search) -> i64;
    // SAFETY: `search_step` has bpf_loop's callback signature; `s` outlives the call.
    unsafe { bpf_loop(ROW_SEARCH_STEPS, callback as *mut core::ffi::c_void, (&raw mut s).cast(), 0) };
    if s.len == 0 {
        return UnwindRow::default();
    }
    match UNWIND_ROWS.get(s.lo as u32) {
        Some(r) if r.pc <= pc => *r,
        _ => UnwindRow::default(),
    }
}
