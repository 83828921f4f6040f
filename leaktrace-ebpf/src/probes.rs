//! The probe programs and maps (bpf target only).

use crate::maps::{INFLIGHT, WalkMemo, count, walk_buffer};
use aya_ebpf::helpers::generated::{
    bpf_get_current_task_btf, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_send_signal, bpf_task_pt_regs,
};
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use leaktrace_common::{
    AllocInfo, AllocKey, BUCKET_SLOTS, BlockBucket, InFlight, MapEvent, MmapCall, SiteKey, SiteStats, StackFrames,
    SyscallArgs, counter, exec_hold, kernel_offset, map_event, op, owner, sampling, site_kind, tp_field,
};

/// The agent's own tgid (set at load time): its allocations are never traced.
#[unsafe(no_mangle)]
static AGENT_TGID: u32 = 0;

/// The kernel's monotonic clock (ns) when the agent loaded the programs (set at load
/// time): blocks' birth times (`AllocInfo::born_ms`) are milliseconds since then.
#[unsafe(no_mangle)]
static TIME_BASE_NS: u64 = 0;

/// Outstanding blocks, the fast table: buckets of `BUCKET_SLOTS` slots, the bucket chosen by the
/// block's tag (`block_tag`), a slot claimed and released by compare-and-swap on its tag: an
/// insert or a free is a few loads and one atomic, no hashing helper, no lock, no allocation.
/// Preallocated; sized by the agent (`BLOCKS_MASK` + 1 buckets, from --max-allocs). Blocks that
/// find their bucket full go to `ALLOCS`.
#[map]
static BLOCKS: Array<BlockBucket> = Array::with_max_entries(1 << 16, 0);

/// `BLOCKS`' bucket count minus one (a power of two minus one; set by the agent at load).
#[unsafe(no_mangle)]
static BLOCKS_MASK: u64 = (1 << 16) - 1;

/// Outstanding blocks whose `BLOCKS` bucket was full: (tgid, address) → size, site. Sized by the
/// agent (--max-allocs).
#[map]
static ALLOCS: HashMap<AllocKey, AllocInfo> = HashMap::with_max_entries(1 << 20, BPF_F_NO_PREALLOC);

/// Pages where the allocator's blocks began since attach: (tgid, page address) → 1, freed blocks
/// included. The agent finds the allocator's mappings by them, whenever they were made
/// (`mappings::block_regions`). LRU: when full, the pages least recently noted go first.
#[map]
static BLOCK_PAGES: LruHashMap<AllocKey, u32> = LruHashMap::with_max_entries(1 << 16, 0);

/// Per CPU: the last page noted in `BLOCK_PAGES` (most allocations follow one on the same page:
/// they skip the map update).
#[map]
static LAST_PAGE: PerCpuArray<AllocKey> = PerCpuArray::with_max_entries(1, 0);

/// Call-stack sites: `SiteKey` → the site's index in `SITE_STATS` (given once, when the site is
/// first seen; entries are never removed, so an index stays the site's). Sized by the agent
/// (--max-sites).
#[map]
static SITES: HashMap<SiteKey, u32> = HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// Per-site totals by site index (`SITES`' values; `AllocInfo::index`): an array, so that the
/// free of a block updates its site without hashing its key. Sized by the agent (--max-sites,
/// preallocated: 48 bytes a site).
#[map]
static SITE_STATS: Array<SiteStats> = Array::with_max_entries(1 << 16, 0);

/// The next site index to give (index 0). Read, then added to atomically: two CPUs may read the
/// same value, so an index is the site's only once claimed in `SITE_INDICES`. Indices skipped
/// that way, or claimed by a site that lost the race to insert itself into `SITES`, stay unused.
#[map]
static NEXT_SITE: Array<u64> = Array::with_max_entries(1, 0);

/// Site indices given (index → 1): the insert (`BPF_NOEXIST`) that claims an index is atomic,
/// which the counter alone is not (the eBPF target here has no fetch-and-add). Sized by the
/// agent (--max-sites).
#[map]
static SITE_INDICES: HashMap<u32, u32> = HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// A site and its index, as cached in `SITE_CACHE`; `check` mixes both, so an entry torn by a
/// program that interrupted the writer is not taken.
#[repr(C)]
#[derive(Clone, Copy)]
struct CachedSite {
    key: SiteKey,
    index: u64,
    check: u64,
}

const SITE_CACHE_SLOTS: u32 = 256;

/// Per CPU, direct-mapped by the site's hash: sites whose index was looked up (an allocation
/// from a site seen before skips the `SITES` lookup).
#[map]
static SITE_CACHE: PerCpuArray<CachedSite> = PerCpuArray::with_max_entries(SITE_CACHE_SLOTS, 0);

/// User call stacks by the 64-bit hash of their frames (walked by `walk_stack`, not
/// bpf_get_stackid: see there). Written once per distinct stack, never overwritten; a full map
/// is counted. Sized by the agent (--max-stacks).
#[map]
static STACKS: HashMap<u64, StackFrames> = HashMap::with_max_entries(1 << 14, BPF_F_NO_PREALLOC);

/// Keys of stacks already in `STACKS`, per CPU, direct-mapped by their low bits: a walk that finds
/// its key here skips the `STACKS` lookup (stacks stay in `STACKS` once a walk has checked them,
/// so a hit is right; a miss only costs the lookup).
#[map]
static STACKS_SEEN: PerCpuArray<u64> = PerCpuArray::with_max_entries(STACKS_SEEN_SLOTS, 0);
const STACKS_SEEN_SLOTS: u32 = 256;

/// Processes whose mmap/munmap/mremap/brk syscalls are tracked (the syscall tracepoints fire for
/// every process; uprobes are attached per process and need no filter).
#[map]
static TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// mmap/munmap/mremap/brk events for the agent, which keeps the address ranges.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Arguments of a tracked syscall between sys_enter and sys_exit, by pid_tgid.
#[map]
static SYSCALLS: HashMap<u64, SyscallArgs> = HashMap::with_max_entries(1 << 14, BPF_F_NO_PREALLOC);

/// libc mmap() calls in flight, by pid_tgid.
#[map]
static MMAP_CALLS: HashMap<u64, MmapCall> = HashMap::with_max_entries(1 << 14, BPF_F_NO_PREALLOC);

/// Units of work done by each process: calls of the --work-probe function.
#[map]
static WORK: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);

/// Launched commands whose teardown is watched (tgid → 0, inserted by the agent). The first
/// teardown call deletes its entry (atomically: one caller wins), so each process stops once.
#[map]
static TEARDOWN: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Launched processes whose execs stop until the agent has probed the new image (tgid →
/// `leaktrace_common::exec_hold` bits, set by the agent; see `sched_process_exec`).
#[map]
static EXEC_HOLD: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Sampled mode: the tables and mean distance of `leaktrace_common::sampling`, filled by the agent.
#[map]
static SAMPLING: Array<u64> = Array::with_max_entries(sampling::LEN, 0);

const EEXIST: i32 = -17;
const MAP_ANONYMOUS: u64 = 0x20;
/// Shared mappings (of a memfd, shm_open or any file) are the program's memory too: RssShmem.
const MAP_SHARED: u64 = 0x01;
/// Mappings that are traced: anonymous ones and shared ones (private file mappings, such as the
/// loader's, are not).
const MAP_TRACED: u64 = MAP_ANONYMOUS | MAP_SHARED;

#[inline(always)]
fn agent_tgid() -> u32 {
    // SAFETY: a read of this object's own global (aligned, initialized); volatile, so the value
    // the agent set at load time is read, not the zero it was compiled with.
    unsafe { core::ptr::read_volatile(&AGENT_TGID) }
}

/// The kernel's jiffies when the monotonic clock read `TIME_BASE_NS` (set by the agent at load,
/// from /proc/timer_list; with [`MS_PER_JIFFY_Q16`]).
#[unsafe(no_mangle)]
static JIFFIES_AT_BASE: u64 = 0;

/// Milliseconds per jiffy (1000 / HZ) in 16.16 fixed point, set by the agent at load; 0: the
/// agent could not tie jiffies to the monotonic clock, and birth times are read from it.
#[unsafe(no_mangle)]
static MS_PER_JIFFY_Q16: u64 = 0;

/// Now, in milliseconds since `TIME_BASE_NS` (the monotonic clock, CLOCK_MONOTONIC): from the
/// jiffies counter when the agent tied it to that clock (an inlined load, no helper call; to
/// the tick, 1000 / HZ ms), else from `bpf_ktime_get_ns` (a helper call, ~60 ns here).
#[inline(always)]
fn now_ms() -> u32 {
    // SAFETY: reads of this object's own globals, as in `agent_tgid`.
    let mul = unsafe { core::ptr::read_volatile(&raw const MS_PER_JIFFY_Q16) };
    if mul != 0 {
        // SAFETY: as above.
        let base = unsafe { core::ptr::read_volatile(&raw const JIFFIES_AT_BASE) };
        // SAFETY: a helper without arguments (inlined by the verifier: a load of jiffies_64).
        let now = unsafe { aya_ebpf::helpers::generated::bpf_jiffies64() };
        return ((now.wrapping_sub(base) & ((1 << 40) - 1)) * mul >> 16) as u32;
    }
    // SAFETY: as above.
    let base = unsafe { core::ptr::read_volatile(&TIME_BASE_NS) };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    (now.wrapping_sub(base) / 1_000_000) as u32
}

#[inline(always)]
fn stack_pointer(regs: *const aya_ebpf::bindings::pt_regs) -> u64 {
    // SAFETY: a probe context's register set (`ctx.regs`), valid for the whole program run.
    user_regs(unsafe { &*regs }).sp
}

#[inline(always)]
fn atomic_add(p: *mut u64, v: u64) {
    // SAFETY: callers pass a field of a map value they looked up (valid while the program runs,
    // aligned); the add is atomic, as other CPUs add to the same value.
    unsafe { core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, v) };
}

/// Entry of an allocating call: remember its arguments and call stack for the return probe.
#[inline(always)]
fn enter(ctx: &ProbeContext, op: u32, size: u64, ptr: u64) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == agent_tgid() {
        return 0;
    }
    let sp = stack_pointer(ctx.regs);
    let Some(slot) = INFLIGHT.current(true) else {
        // No slot for this thread (its task storage could not be allocated, or is busy in a
        // program this one interrupted): the call cannot be followed to its return.
        count(counter::INFLIGHT_FULL);
        return 0;
    };
    // SAFETY: this thread's task-storage value, valid for the whole program run (the kernel frees
    // it with the thread). The only `&mut` to its call in this program, and the only reference
    // to its memo (the walk's `leaktrace_memo_save` writes the memo through its own lookup,
    // after the check's last read): no other program uses them meanwhile (only this thread's
    // programs do, and they do not nest: a uprobe or tracepoint program that would interrupt
    // one on the same CPU is skipped by the kernel, `bpf_prog_active`).
    let cur = unsafe { &mut (*slot).call };
    let memo = unsafe { &raw const (*slot).memo };
    let mean = sampling_mean();
    if cur.sp != 0 {
        if sp < cur.sp {
            // Called from inside an allocator call of this thread: the outer call accounts for
            // it. A wrapper (strdup) learns its size from the call it makes, and in sampled
            // mode is sampled on that size.
            if cur.op == op::WRAPPER && cur.size == 0 {
                if mean == 0 {
                    cur.size = size;
                } else {
                    match sample(&mut cur.sample_left, size, mean) {
                        Some(weight) => cur.size = weight,
                        None => cur.op = op::UNSAMPLED,
                    }
                }
            }
            count(counter::NESTED_CALL);
            return 0;
        }
        if sp == cur.sp {
            // A tail jump from one hooked function into another: the same call goes on.
            cur.tail_calls += 1;
            count(counter::NESTED_CALL);
            return 0;
        }
        // An older call of this thread never returned through its return probe.
        count(counter::MISSED_RETURN);
        cur.sp = 0;
    }
    let mut size = size;
    // A wrapper's size is known only at the call it makes: sampled there (above).
    if mean != 0 && op != op::WRAPPER {
        match sample(&mut cur.sample_left, size, mean) {
            Some(weight) => size = weight,
            None => {
                // Not sampled: no stack walk, no map work, but the call is marked in flight so
                // that the calls it makes are folded into it (not sampled a second time) and its
                // mappings are the allocator's. A realloc still retires its old block, which may
                // have been sampled (a failed realloc, rare, is missed).
                if (op == op::REALLOC || op == op::REALLOCARRAY) && ptr != 0 {
                    free_addr(tgid, ptr);
                }
                *cur = InFlight {
                    sp,
                    size: 0,
                    ptr: 0,
                    op: op::UNSAMPLED,
                    tail_calls: 0,
                    site: SiteKey::default(),
                    ..*cur
                };
                return 0;
            }
        }
    }
    let site = site_here::<false, true>(probe_regs(ctx), pid_tgid, site_kind::MALLOC, memo);
    *cur = InFlight { sp, size, ptr, op, tail_calls: 0, site, ..*cur };
    0
}

#[inline(always)]
fn sampling_mean() -> u64 {
    SAMPLING.get(sampling::MEAN).copied().unwrap_or(0)
}

#[inline(always)]
fn table(base: u32, i: u64) -> u64 {
    SAMPLING.get(base + (i as u32 & (sampling::TABLE - 1))).copied().unwrap_or(1 << sampling::SHIFT)
}

/// Byte-based Poisson sampling, per thread: each allocated byte is sampled with probability
/// 1/mean. `left` is the thread's bytes still to allocate before its next sample
/// (`InFlight::sample_left`, 0: not drawn yet). Returns the estimated bytes a sampled allocation
/// of `size` stands for.
#[inline(always)]
fn sample(left: &mut i64, size: u64, mean: u64) -> Option<u64> {
    // SAFETY: a helper without arguments.
    let random = || unsafe { bpf_get_prandom_u32() } as u64;
    let next_distance = || (mean * table(sampling::EXP_BASE, random())) >> sampling::SHIFT;
    if *left == 0 {
        *left = next_distance() as i64;
    }
    let remaining = *left - size as i64;
    if remaining > 0 {
        *left = remaining;
        return None;
    }
    *left = next_distance() as i64;
    count(counter::SAMPLED);
    // x = size / mean in table steps of 8 / TABLE.
    let idx = size * (sampling::TABLE as u64 / 8) / mean;
    let weight = if idx >= sampling::TABLE as u64 {
        size
    } else {
        (mean * table(sampling::WEIGHT_BASE, idx)) >> sampling::SHIFT
    };
    Some(if weight < size { size } else { weight })
}

/// Credit a retired block to its site.
#[inline(always)]
fn account_free(info: &AllocInfo) {
    if let Some(s) = SITE_STATS.get_ptr_mut(info.index) {
        // SAFETY: field addresses of a SITE_STATS value, no reference made (other CPUs add to it).
        atomic_add(unsafe { &raw mut (*s).free_bytes }, info.size);
        // SAFETY: as above.
        atomic_add(unsafe { &raw mut (*s).free_count }, 1);
        // SAFETY: as above.
        atomic_add(unsafe { &raw mut (*s).free_born_ms }, info.born_ms as u64);
    }
    count(counter::FREES);
}

#[inline(always)]
fn site_check(site: &SiteKey, index: u64) -> u64 {
    let h = crate::unwind::mix(site.stack ^ ((site.tgid as u64) << 32 | site.kind as u64));
    crate::unwind::mix(h ^ site.caller ^ (index << 40))
}

/// The index of `site` in `SITE_STATS`: from this CPU's `SITE_CACHE`, else from `SITES`, else a
/// new one (`NEXT_SITE`) inserted there. None when `SITES` or `SITE_STATS` is full.
#[inline(always)]
fn site_index(site: &SiteKey) -> Option<u32> {
    let h = crate::unwind::mix(site.stack ^ site.caller ^ ((site.tgid as u64) << 32 | site.kind as u64));
    let slot = SITE_CACHE.get_ptr_mut(h as u32 & (SITE_CACHE_SLOTS - 1));
    if let Some(c) = slot {
        // SAFETY: this CPU's slot of a per-CPU array value (get_ptr_mut checked the index), valid
        // while the program runs; copied, then checked as a whole.
        let c = unsafe { *c };
        if c.key == *site && c.check == site_check(site, c.index) {
            return Some(c.index as u32);
        }
    }
    let index = match SITES.get_ptr(site) {
        // SAFETY: a value the lookup returned (never changed once inserted), copied at once.
        Some(i) => unsafe { *i },
        None => {
            let fresh = new_site_index()?;
            match SITES.insert(site, fresh, BPF_NOEXIST as u64) {
                Ok(()) => fresh,
                // Another CPU inserted the site meanwhile: its index is the site's.
                // SAFETY: as above.
                Err(EEXIST) => unsafe { *SITES.get_ptr(site)? },
                Err(_) => return None,
            }
        }
    };
    if let Some(c) = slot {
        // SAFETY: the slot read above, written whole.
        unsafe { *c = CachedSite { key: *site, index: index as u64, check: site_check(site, index as u64) } };
    }
    Some(index)
}

/// A site index no other site has (claimed in `SITE_INDICES`); None when `SITE_STATS` is full
/// or four claims in a row lost their race.
#[inline(always)]
fn new_site_index() -> Option<u32> {
    let next = NEXT_SITE.get_ptr_mut(0)?;
    for _ in 0..4 {
        // SAFETY: the array's one value (get_ptr_mut checked the index), valid while the program
        // runs; read plainly, then added to atomically (other CPUs take indices too).
        let fresh = unsafe { core::ptr::read_volatile(next) };
        atomic_add(next, 1);
        if fresh > u32::MAX as u64 || SITE_STATS.get_ptr(fresh as u32).is_none() {
            return None;
        }
        if SITE_INDICES.insert(fresh as u32, 1, BPF_NOEXIST as u64).is_ok() {
            return Some(fresh as u32);
        }
    }
    None
}

/// Add one block of `bytes` born at `born_ms` to the site at `index`.
#[inline(always)]
fn account_alloc(index: u32, bytes: u64, born_ms: u32) -> bool {
    match SITE_STATS.get_ptr_mut(index) {
        Some(s) => {
            // The birth time first: a reader that sees it without the count computes an age
            // sum short by this block's (a block counted without its birth time would look as
            // old as the clock).
            // SAFETY: field addresses of a SITE_STATS value, no reference made (other CPUs add to it).
            atomic_add(unsafe { &raw mut (*s).alloc_born_ms }, born_ms as u64);
            // SAFETY: as above.
            atomic_add(unsafe { &raw mut (*s).alloc_bytes }, bytes);
            // SAFETY: as above.
            atomic_add(unsafe { &raw mut (*s).alloc_count }, 1);
            true
        }
        None => false,
    }
}

/// The tag of the block at `addr` of process `tgid` in `BLOCKS`: a 64-bit hash, odd (0 marks
/// an empty slot). Its high half picks the bucket. Two live blocks with one tag would need a
/// 64-bit collision between the same address in two processes (the address is compared too).
#[inline(always)]
fn block_tag(tgid: u32, addr: u64) -> u64 {
    crate::unwind::mix(addr ^ (tgid as u64).rotate_right(20)) | 1
}

/// The `BLOCKS` bucket of `tag`.
#[inline(always)]
fn block_bucket(tag: u64) -> Option<*mut BlockBucket> {
    // SAFETY: a read of this object's own global, as in `agent_tgid`.
    let mask = unsafe { core::ptr::read_volatile(&raw const BLOCKS_MASK) };
    BLOCKS.get_ptr_mut(((tag >> 32) & mask) as u32)
}

/// Compare-and-swap of a map value's word: true when `*p` was `old` and is now `new`.
#[inline(always)]
fn cas(p: *mut u64, old: u64, new: u64) -> bool {
    // SAFETY: callers pass a field of a map value they looked up (valid while the program runs,
    // aligned); other CPUs compare-and-swap the same word.
    unsafe {
        core::intrinsics::atomic_cxchg::<
            u64,
            { core::intrinsics::AtomicOrdering::SeqCst },
            { core::intrinsics::AtomicOrdering::SeqCst },
        >(p, old, new)
        .1
    }
}

/// Retire the block at `addr` of process `tgid`, if it is tracked: its `BLOCKS` slot, else (the
/// bucket having overflowed) its `ALLOCS` entry.
#[inline(always)]
fn free_addr(tgid: u32, addr: u64) {
    let tag = block_tag(tgid, addr);
    if let Some(b) = block_bucket(tag) {
        for i in 0..BUCKET_SLOTS {
            // SAFETY: a slot of a BLOCKS value (get_ptr_mut checked the index; `i` is below the
            // array's length), valid while the program runs; fields read through the pointer
            // (other CPUs claim and release slots), the tag with a volatile load.
            unsafe {
                let slot = &raw mut (*b).slots[i];
                if core::ptr::read_volatile(&raw const (*slot).tag) == tag && (*slot).addr == addr {
                    let info = (*slot).info;
                    // The one caller whose swap empties the slot credits the block's site.
                    if cas(&raw mut (*slot).tag, tag, 0) {
                        account_free(&info);
                    }
                    return;
                }
            }
        }
        // SAFETY: as above.
        if unsafe { core::ptr::read_volatile(&raw const (*b).overflowed) } == 0 {
            if sampling_mean() == 0 {
                count(counter::UNTRACKED_FREE);
            }
            return;
        }
    }
    let key = AllocKey { tgid, _pad: 0, addr };
    let info = match ALLOCS.get_ptr(key) {
        // SAFETY: a value the lookup returned, copied at once (valid while the program runs,
        // even if another CPU deletes the entry).
        Some(p) => unsafe { *p },
        None => {
            if sampling_mean() == 0 {
                count(counter::UNTRACKED_FREE);
            }
            return;
        }
    };
    if ALLOCS.remove(key).is_ok() {
        account_free(&info);
    }
}

/// Put a new block of `tgid` at `addr` in `BLOCKS`: in its bucket's slot already holding the
/// address, or in its `ALLOCS` entry when the bucket has overflowed (the free of the old block
/// was not seen: it is retired, counted in `address_reused`), else in an empty slot. Returns
/// false when the bucket is full (the bucket is marked overflowed: the caller puts the block in
/// `ALLOCS`) or there is no bucket; true when it was placed.
#[inline(always)]
fn block_insert(tgid: u32, addr: u64, info: AllocInfo) -> bool {
    let tag = block_tag(tgid, addr);
    let Some(b) = block_bucket(tag) else { return false };
    let mut empty = BUCKET_SLOTS;
    for i in 0..BUCKET_SLOTS {
        // SAFETY: as in `free_addr`.
        unsafe {
            let slot = &raw mut (*b).slots[i];
            let t = core::ptr::read_volatile(&raw const (*slot).tag);
            if t == tag && (*slot).addr == addr {
                count(counter::ADDRESS_REUSED);
                let old = (*slot).info;
                account_free(&old);
                (*slot).info = info;
                return true;
            }
            if t == 0 && empty == BUCKET_SLOTS {
                empty = i;
            }
        }
    }
    // SAFETY: as in `free_addr`.
    if unsafe { core::ptr::read_volatile(&raw const (*b).overflowed) } != 0
        && let Some(old) = ALLOCS.get_ptr_mut(AllocKey { tgid, _pad: 0, addr })
    {
        // The address is live in ALLOCS (its bucket was full when it was allocated before): the
        // free of that block was not seen.
        // SAFETY: a value the lookup returned, valid while the program runs; the only reference
        // to it here (as in `record`).
        let old = unsafe { &mut *old };
        count(counter::ADDRESS_REUSED);
        account_free(old);
        *old = info;
        return true;
    }
    if empty < BUCKET_SLOTS {
        // An empty slot seen above, then any other (another CPU may have taken it meanwhile).
        for i in 0..BUCKET_SLOTS {
            if i < empty {
                continue;
            }
            // SAFETY: as in `free_addr`.
            unsafe {
                let slot = &raw mut (*b).slots[i];
                if core::ptr::read_volatile(&raw const (*slot).tag) == 0 && cas(&raw mut (*slot).tag, 0, tag) {
                    (*slot).addr = addr;
                    (*slot).info = info;
                    return true;
                }
            }
        }
    }
    // SAFETY: as in `free_addr`.
    unsafe { core::ptr::write_volatile(&raw mut (*b).overflowed, 1) };
    false
}

/// Note the page where a block of `tgid` begins in `BLOCK_PAGES`, unless it is this CPU's last.
#[inline(always)]
fn note_page(tgid: u32, addr: u64) {
    let key = AllocKey { tgid, _pad: 0, addr: addr & !0xfff };
    if let Some(last) = LAST_PAGE.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array (get_ptr_mut checked the index), valid while
        // the program runs; a program that interrupts this one on the CPU can at worst make an
        // update repeat (the page is still inserted below by whichever wrote it last).
        unsafe {
            if (*last).tgid == tgid && (*last).addr == key.addr {
                return;
            }
            *last = key;
        }
    }
    let _ = BLOCK_PAGES.insert(&key, &1, 0);
}

/// Record a new outstanding block.
#[inline(always)]
fn record(tgid: u32, addr: u64, size: u64, site: SiteKey) {
    let Some(index) = site_index(&site) else {
        count(counter::SITES_FULL);
        return;
    };
    note_page(tgid, addr);
    let key = AllocKey { tgid, _pad: 0, addr };
    let born_ms = now_ms();
    let info = AllocInfo { size, index, born_ms };
    if block_insert(tgid, addr, info) {
        if account_alloc(index, size, born_ms) {
            count(counter::ALLOCS);
        }
        return;
    }
    match ALLOCS.insert(key, info, BPF_NOEXIST as u64) {
        Ok(()) => {}
        Err(EEXIST) => {
            // The address is live already: the free of the old block was not seen.
            if let Some(old) = ALLOCS.get_ptr_mut(key) {
                // SAFETY: a value the lookup returned, valid while the program runs; the only
                // reference to it here (the entry of a live address: the target itself would
                // race if another thread freed it now).
                let old = unsafe { &mut *old };
                count(counter::ADDRESS_REUSED);
                account_free(old);
                *old = info;
            }
        }
        Err(_) => {
            count(counter::ALLOCS_FULL);
            return;
        }
    }
    if account_alloc(index, size, born_ms) {
        count(counter::ALLOCS);
    }
}

#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == agent_tgid() {
        return 0;
    }
    let sp = stack_pointer(ctx.regs);
    // SAFETY: this thread's task-storage value, as in `enter`: valid for the program run, the
    // only reference to it in this program.
    let slot = INFLIGHT.current(false).map(|p| unsafe { &mut (*p).call });
    let Some(slot) = slot.filter(|s| s.sp != 0) else {
        if sampling_mean() == 0 {
            count(counter::ORPHAN_RETURN);
        }
        return 0;
    };
    let cur = *slot;
    if sp < cur.sp + 8 {
        // Return of a nested call that was folded into the outer one.
        return 0;
    }
    if sp == cur.sp + 8 && cur.tail_calls > 0 {
        // The return probe of a function tail-jumped into fires first at the same return.
        slot.tail_calls -= 1;
        return 0;
    }
    slot.sp = 0;
    if cur.op == op::UNSAMPLED {
        return 0;
    }
    if sp != cur.sp + 8 {
        // The outer call's frame is gone without its return being seen.
        count(counter::MISSED_RETURN);
        return 0;
    }
    let ret: u64 = ctx.ret();
    let addr = match cur.op {
        op::POSIX_MEMALIGN => {
            if ret as u32 != 0 {
                count(counter::FAILED_ALLOC);
                return 0;
            }
            // SAFETY: a checked copy (bpf_probe_read_user): a bad address is an error, not a fault.
            match unsafe { bpf_probe_read_user(cur.ptr as *const u64) } {
                Ok(a) if a != 0 => a,
                _ => {
                    count(counter::FAILED_ALLOC);
                    return 0;
                }
            }
        }
        op::REALLOC | op::REALLOCARRAY => {
            if ret == 0 {
                if cur.size == 0 && cur.ptr != 0 {
                    // glibc: realloc(p, 0) frees p and returns NULL.
                    free_addr(tgid, cur.ptr);
                } else {
                    // Failed realloc: the old block stays valid and live.
                    count(counter::FAILED_ALLOC);
                }
                return 0;
            }
            if cur.ptr != 0 {
                // Moved or resized in place: the old block is retired either way.
                free_addr(tgid, cur.ptr);
            }
            ret
        }
        _ => {
            if ret == 0 {
                count(counter::FAILED_ALLOC);
                return 0;
            }
            ret
        }
    };
    record(tgid, addr, cur.size, cur.site);
    0
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    let addr: u64 = ctx.arg(0).unwrap_or(0);
    if addr == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == agent_tgid() {
        return 0;
    }
    if let Some(cur) = INFLIGHT.current(false) {
        // SAFETY: this thread's task-storage value (as in `enter`), read once.
        let cur_sp = unsafe { (*cur).call.sp };
        if cur_sp != 0 && stack_pointer(ctx.regs) < cur_sp {
            // free called by a hooked allocator function: the outer call accounts for it.
            count(counter::NESTED_CALL);
            return 0;
        }
    }
    free_addr(tgid, addr);
    0
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::MALLOC, arg(&ctx, 0), 0)
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::CALLOC, arg(&ctx, 0).wrapping_mul(arg(&ctx, 1)), 0)
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::REALLOC, arg(&ctx, 1), arg(&ctx, 0))
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::REALLOCARRAY, arg(&ctx, 1).wrapping_mul(arg(&ctx, 2)), arg(&ctx, 0))
}

/// An allocating wrapper (strdup, strndup, wcsdup): size from the nested allocator call.
#[uprobe]
pub fn wrapper_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::WRAPPER, 0, 0)
}

/// `__rust_realloc(ptr, old_size, align, new_size)`.
#[uprobe]
pub fn rust_realloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::REALLOC, arg(&ctx, 3), arg(&ctx, 0))
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::POSIX_MEMALIGN, arg(&ctx, 2), arg(&ctx, 0))
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::ALIGNED_ALLOC, arg(&ctx, 1), 0)
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::MEMALIGN, arg(&ctx, 1), 0)
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::VALLOC, arg(&ctx, 0), 0)
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, op::PVALLOC, arg(&ctx, 0), 0)
}

/// User registers a stack walk starts from.
#[derive(Clone, Copy)]
struct UserRegs {
    ip: u64,
    sp: u64,
    fp: u64,
}

/// Instruction, stack and frame pointer of a register set: the one place that names the
/// architecture's registers.
#[inline(always)]
fn user_regs(r: &aya_ebpf::bindings::pt_regs) -> UserRegs {
    #[cfg(not(bpf_target_arch = "aarch64"))]
    {
        UserRegs { ip: r.rip, sp: r.rsp, fp: r.rbp }
    }
    #[cfg(bpf_target_arch = "aarch64")]
    {
        UserRegs { ip: r.pc, sp: r.sp, fp: r.regs[29] }
    }
}

/// The registers of a uprobe's context (the user registers at the probed instruction).
#[inline(always)]
fn probe_regs(ctx: &ProbeContext) -> UserRegs {
    // SAFETY: the probe context's register set, valid for the whole program run.
    user_regs(unsafe { &*ctx.regs })
}

/// The current task's user registers (at a tracepoint: where it entered the kernel).
#[inline(always)]
fn task_regs() -> UserRegs {
    // SAFETY: helpers on the current task (a BTF pointer from the kernel); its pt_regs pointer is
    // checked for null and read with a checked copy (bpf_probe_read_kernel).
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const aya_ebpf::bindings::pt_regs;
        if regs.is_null() {
            return UserRegs { ip: 0, sp: 0, fp: 0 };
        }
        match bpf_probe_read_kernel(regs) {
            Ok(r) => user_regs(&r),
            Err(_) => UserRegs { ip: 0, sp: 0, fp: 0 },
        }
    }
}

/// Walk the user stack (`unwind::walk`: unwind tables, frame pointers where there are none),
/// store the frames in `STACKS` the first time they are seen, and return their key (a 64-bit
/// hash; 0 when they could not be stored) and the walk's generation (its tag in the stack window,
/// `unwind::leaktrace_stack_word`).
///
/// `MEMO` (allocator entries): the thread's last walk is taken again when it would be made step
/// for step (`unwind::memo_check`, with the thread's memo `memo`: same registers, every word it read unchanged) and
/// its stack is stored; else the walk is made, recorded and remembered
/// (`unwind::leaktrace_memo_save`). Counted in `walks_reused`.
///
/// Why not `bpf_get_stackid`: it follows frame pointers only (most libraries and release builds
/// have none), and the kernel's walk goes on until a read faults: on glibc programs the
/// outermost saved `%rbp` is not a frame pointer, so every walk ended in a page fault taken
/// inside the kernel (~0.4 µs here).
#[inline(always)]
fn walk_stack<const FAULT: bool, const MEMO: bool>(r: UserRegs, pid_tgid: u64, memo: *const WalkMemo) -> (u64, u64) {
    let tgid = (pid_tgid >> 32) as u32;
    let Some(buf) = walk_buffer() else { return (0, 0) };
    // SAFETY: this CPU's walk buffer (a per-CPU array value, valid while the program runs). The
    // walk's callback writes frames through the same map value (`unwind::step`), between the
    // accesses made here; a program that interrupts this one on the CPU may reuse it, which the
    // generation check below detects.
    let buf = unsafe { &mut *buf };
    let generation = buf.generation.wrapping_add(1);
    buf.generation = generation;
    // An interpreter's frames (CPython), when this thread runs Python code: part of the key, so
    // that the same native stack under different Python callers is a different stack. (Before
    // the native walk, so that a remembered walk can be checked against the stored stacks.)
    // (Skipped, two calls fewer, when no traced process is an interpreter.)
    let py_hash =
        if crate::python::any() { crate::python::leaktrace_py_walk(tgid as u64, pid_tgid & 0xffff_ffff) } else { 0 };
    // (Through a global function: a branch on `py_hash` here would make the verifier check the
    // native walk below once for each outcome.)
    let with_py = |native: u64| crate::python::leaktrace_py_key(native, py_hash);
    if MEMO {
        // The thread's last walk, when it would be made again step for step (its words
        // verified): its stack is taken if it is stored (else walked and stored below).
        // SAFETY: with `MEMO`, the thread's memo in its slot (see `enter`), valid for the run.
        let memo = match unsafe { memo.as_ref() } {
            Some(m) => crate::unwind::memo_check(m, generation, r.ip, r.sp, r.fp, tgid as u64),
            None => 0,
        };
        if memo != 0 {
            let hash = with_py(memo);
            let seen = STACKS_SEEN.get_ptr_mut(hash as u32 & (STACKS_SEEN_SLOTS - 1));
            // SAFETY: this CPU's slot of a per-CPU array value (get_ptr_mut checked the index),
            // valid while the program runs.
            if let Some(slot) = seen
                && unsafe { *slot } == hash
            {
                count(counter::WALKS_REUSED);
                return (hash, generation);
            }
            if STACKS.get_ptr(hash).is_some() {
                if let Some(slot) = seen {
                    // SAFETY: as above.
                    unsafe { *slot = hash };
                }
                count(counter::WALKS_REUSED);
                return (hash, generation);
            }
        }
    }
    let regs = crate::unwind::Regs { ip: r.ip, sp: r.sp, fp: r.fp };
    let native = crate::unwind::walk::<FAULT>(regs, tgid, buf, MEMO);
    let mut hash = with_py(native);
    let mut py = py_hash != 0;
    if py && crate::python::over_budget() && STACKS.get_ptr(hash).is_none() {
        // No room left for new stacks with Python frames: this one is stored as native only
        // (those stored before keep theirs).
        py = false;
        hash = native;
    }
    let seen = STACKS_SEEN.get_ptr_mut(hash as u32 & (STACKS_SEEN_SLOTS - 1));
    // SAFETY (here and where the slot is written below): this CPU's slot of a per-CPU array value
    // (get_ptr_mut checked the index), valid while the program runs.
    if let Some(slot) = seen
        && unsafe { *slot } == hash
    {
        if MEMO {
            crate::unwind::leaktrace_memo_save(generation, r.ip, r.sp, r.fp, native);
        }
        return (hash, generation);
    }
    if let Some(stored) = STACKS.get_ptr(hash) {
        // A different stack under the same key (64-bit hashes: not expected in practice):
        // attribution is lost rather than given to the other stack. (Entries past `len` are
        // left over from earlier walks: a one-frame stack has no ips[1] to compare.)
        // SAFETY: a value the lookup returned (entries are never overwritten), read in place.
        if unsafe { (*stored).len != buf.len || (buf.len > 1 && (*stored).ips[1] != buf.ips[1]) } {
            count(counter::STACK_ERROR);
            return (0, generation);
        }
    } else {
        if py && let Some(pybuf) = crate::python::buffer() {
            // SAFETY: this CPU's Python frame buffer (a per-CPU array value), copied by the insert.
            match crate::python::PY_STACKS.insert(hash, unsafe { &*pybuf }, BPF_NOEXIST as u64) {
                Ok(()) => crate::python::count_stored(),
                Err(EEXIST) => {}
                Err(_) => {
                    count(counter::STACKS_FULL);
                    return (0, generation);
                }
            }
        }
        match STACKS.insert(hash, &*buf, BPF_NOEXIST as u64) {
            Ok(()) => {
                // Read through a volatile load: another run of this program on this CPU may
                // have changed it since (the reason for the check).
                // SAFETY: a volatile read of a field of the buffer (aligned, initialized).
                if unsafe { core::ptr::read_volatile(&raw const buf.generation) } != generation {
                    // Another walk reused the buffer before the copy: what was stored may be
                    // its frames.
                    let _ = STACKS.remove(hash);
                    let _ = crate::python::PY_STACKS.remove(hash);
                    count(counter::STACK_ERROR);
                    return (0, generation);
                }
            }
            Err(EEXIST) => {}
            Err(_) => {
                count(counter::STACKS_FULL);
                return (0, generation);
            }
        }
    }
    if let Some(slot) = seen {
        // SAFETY: the STACKS_SEEN slot read above.
        unsafe { *slot = hash };
    }
    if MEMO {
        crate::unwind::leaktrace_memo_save(generation, r.ip, r.sp, r.fp, native);
    }
    (hash, generation)
}

/// The site of the code at `r`: its walked call stack and the return address at its stack
/// pointer (the direct caller at an entry probe).
#[inline(always)]
fn site_here<const FAULT: bool, const MEMO: bool>(
    r: UserRegs,
    pid_tgid: u64,
    kind: u32,
    memo: *const WalkMemo,
) -> SiteKey {
    let tgid = (pid_tgid >> 32) as u32;
    let (stack, generation) = walk_stack::<FAULT, MEMO>(r, pid_tgid, memo);
    // At an entry probe the walk's first frame read this word: it is in the stack window.
    let caller = match r.sp {
        0 => 0,
        sp => match crate::unwind::window_word(generation, sp) {
            crate::unwind::READ_FAILED => match crate::unwind::leaktrace_stack_word(generation, sp) {
                crate::unwind::READ_FAILED => 0,
                w => w,
            },
            w => w,
        },
    };
    SiteKey { tgid, kind, stack, caller }
}

/// A thread inside a hooked allocator call: what it maps is the allocator's.
#[inline(always)]
fn in_allocator() -> bool {
    // SAFETY: this thread's task-storage value (as in `enter`), read once.
    INFLIGHT.current(false).is_some_and(|c| unsafe { (*c).call.sp } != 0)
}

#[inline(always)]
pub(crate) fn is_target(tgid: u32) -> bool {
    TARGETS.get_ptr(tgid).is_some()
}

/// Stop the current process (SIGSTOP) and queue `ev` telling the agent, which sends SIGCONT:
/// the event's room is reserved first, so a full ring buffer means no stop (counted in
/// `events_lost`), never a process stopped that the agent does not hear of. An EXEC event's
/// `addr` says whether the stop was sent (1: held).
#[inline(always)]
pub(crate) fn stop_and_tell(ev: MapEvent) {
    let Some(mut entry) = EVENTS.reserve::<MapEvent>(0) else {
        count(counter::EVENTS_LOST);
        return;
    };
    // SIGSTOP (19): delivered as the program returns to user space.
    // SAFETY: a helper taking a signal number; it signals the current process.
    let stopped = unsafe { bpf_send_signal(19) } == 0;
    let ev = if ev.kind == map_event::EXEC { MapEvent { addr: stopped as u64, ..ev } } else { ev };
    entry.write(ev);
    entry.submit(0);
}

#[inline(always)]
fn emit(ev: &MapEvent) {
    if EVENTS.output::<MapEvent>(ev, 0).is_err() {
        count(counter::EVENTS_LOST);
    }
}

/// libc mmap(): remember the caller's stack for the syscall tracepoint (anonymous and shared
/// mappings only).
#[uprobe]
pub fn mmap_enter(ctx: ProbeContext) -> u32 {
    let flags = arg(&ctx, 3);
    if flags & MAP_TRACED == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == agent_tgid() {
        return 0;
    }
    let sp = stack_pointer(ctx.regs);
    let (own, site) = if in_allocator() {
        (owner::ALLOCATOR, SiteKey::default())
    } else {
        (owner::OFFHEAP, site_here::<false, false>(probe_regs(&ctx), pid_tgid, site_kind::MMAP, core::ptr::null()))
    };
    let _ = MMAP_CALLS.insert(pid_tgid, MmapCall { sp, owner: own, _pad: 0, site }, 0);
    0
}

mod nr {
    pub const MMAP: u32 = 9;
    pub const MUNMAP: u32 = 11;
    pub const BRK: u32 = 12;
    pub const MREMAP: u32 = 25;
}

#[inline(always)]
fn save_args(pid_tgid: u64, a: SyscallArgs) {
    let _ = SYSCALLS.insert(pid_tgid, a, 0);
}

#[inline(always)]
fn take_args(pid_tgid: u64, nr: u32) -> Option<SyscallArgs> {
    // SAFETY: a value the lookup returned, copied at once (valid while the program runs).
    let a = unsafe { *SYSCALLS.get_ptr(pid_tgid)? };
    let _ = SYSCALLS.remove(pid_tgid);
    if a.nr == nr { Some(a) } else { None }
}

/// Offsets of the tracepoint fields read here (`leaktrace_common::tp_field`), set by the agent
/// from the tracepoints' format files at load.
#[unsafe(no_mangle)]
static TP_OFFSETS: [u32; tp_field::NUM] = tp_field::defaults();

/// The 8-byte tracepoint field `field` (a `tp_field` index) of the record.
#[inline(always)]
fn tp_u64(ctx: &TracePointContext, field: usize) -> u64 {
    // SAFETY: a read of this object's own global; volatile, as the agent sets it at load time.
    let off = unsafe { core::ptr::read_volatile(&TP_OFFSETS[field]) } as usize;
    // SAFETY: `read_at` is a bpf_probe_read_kernel of the record at that offset; a bad offset
    // reads an error (0 here), not memory outside the kernel's checks.
    unsafe { ctx.read_at::<u64>(off) }.unwrap_or(0)
}

#[inline(always)]
pub(crate) fn syscall_ret(ctx: &TracePointContext) -> Option<u64> {
    let ret = tp_u64(ctx, tp_field::SYS_EXIT_RET) as i64;
    if (-4095..0).contains(&ret) { None } else { Some(ret as u64) }
}

#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let flags = tp_u64(&ctx, tp_field::MMAP_FLAGS);
    if flags & MAP_TRACED == 0 {
        return 0;
    }
    let regs = task_regs();
    let sp = regs.sp;
    let libc_call = match MMAP_CALLS.get_ptr(pid_tgid) {
        // The libc wrapper's frame is just below its entry stack pointer.
        Some(c) => {
            // SAFETY: a value the lookup returned, copied at once (valid while the program runs).
            let c = unsafe { *c };
            let _ = MMAP_CALLS.remove(pid_tgid);
            if sp <= c.sp && sp + 512 > c.sp { Some(c) } else { None }
        }
        None => None,
    };
    let (own, site) = match libc_call {
        Some(c) => (c.owner, c.site),
        // A raw syscall (syscall(SYS_mmap, ...), a runtime's own wrapper).
        None if in_allocator() => (owner::ALLOCATOR, SiteKey::default()),
        None => (owner::OFFHEAP, site_here::<false, false>(regs, pid_tgid, site_kind::MMAP, core::ptr::null())),
    };
    save_args(
        pid_tgid,
        SyscallArgs {
            nr: nr::MMAP,
            owner: own,
            a0: tp_u64(&ctx, tp_field::MMAP_LEN),
            a1: tp_u64(&ctx, tp_field::MMAP_PROT),
            a2: flags,
            a3: 0,
            site,
        },
    );
    0
}

#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(a) = take_args(pid_tgid, nr::MMAP) else { return 0 };
    let Some(addr) = syscall_ret(&ctx) else { return 0 };
    count(if a.owner == owner::OFFHEAP { counter::OFFHEAP_MAPS } else { counter::ALLOCATOR_MAPS });
    emit(&MapEvent {
        kind: map_event::MMAP,
        tgid: (pid_tgid >> 32) as u32,
        addr,
        len: a.a0,
        old_addr: 0,
        old_len: 0,
        prot: a.a1 as u32,
        flags: a.a2 as u32,
        owner: a.owner,
        _pad: 0,
        site: a.site,
    });
    0
}

#[tracepoint]
pub fn sys_enter_munmap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_target((pid_tgid >> 32) as u32) {
        return 0;
    }
    save_args(
        pid_tgid,
        SyscallArgs {
            nr: nr::MUNMAP,
            a0: tp_u64(&ctx, tp_field::MUNMAP_ADDR),
            a1: tp_u64(&ctx, tp_field::MUNMAP_LEN),
            ..Default::default()
        },
    );
    0
}

#[tracepoint]
pub fn sys_exit_munmap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(a) = take_args(pid_tgid, nr::MUNMAP) else { return 0 };
    if syscall_ret(&ctx).is_none() {
        return 0;
    }
    emit(&MapEvent {
        kind: map_event::MUNMAP,
        tgid: (pid_tgid >> 32) as u32,
        addr: a.a0,
        len: a.a1,
        ..Default::default()
    });
    0
}

#[tracepoint]
pub fn sys_enter_mremap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_target((pid_tgid >> 32) as u32) {
        return 0;
    }
    save_args(
        pid_tgid,
        SyscallArgs {
            nr: nr::MREMAP,
            a0: tp_u64(&ctx, tp_field::MREMAP_ADDR),
            a1: tp_u64(&ctx, tp_field::MREMAP_OLD_LEN),
            a2: tp_u64(&ctx, tp_field::MREMAP_NEW_LEN),
            a3: tp_u64(&ctx, tp_field::MREMAP_FLAGS),
            ..Default::default()
        },
    );
    0
}

#[tracepoint]
pub fn sys_exit_mremap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(a) = take_args(pid_tgid, nr::MREMAP) else { return 0 };
    let Some(addr) = syscall_ret(&ctx) else { return 0 };
    emit(&MapEvent {
        kind: map_event::MREMAP,
        tgid: (pid_tgid >> 32) as u32,
        addr,
        len: a.a2,
        old_addr: a.a0,
        old_len: a.a1,
        flags: a.a3 as u32,
        ..Default::default()
    });
    0
}

#[tracepoint]
pub fn sys_enter_brk(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_target((pid_tgid >> 32) as u32) {
        return 0;
    }
    save_args(pid_tgid, SyscallArgs { nr: nr::BRK, a0: tp_u64(&ctx, tp_field::BRK_BRK), ..Default::default() });
    0
}

#[tracepoint]
pub fn sys_exit_brk(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(_a) = take_args(pid_tgid, nr::BRK) else { return 0 };
    let Some(addr) = syscall_ret(&ctx) else { return 0 };
    emit(&MapEvent { kind: map_event::BRK, tgid: (pid_tgid >> 32) as u32, addr, ..Default::default() });
    0
}

/// Entry of the unit-of-work function (request handler, message callback): count one unit.
/// No return probe: safe on any function, including Go functions whose stacks move.
#[uprobe]
pub fn work_enter(_ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if WORK.get_ptr_mut(tgid).is_none() {
        let _ = WORK.insert(tgid, 0u64, BPF_NOEXIST as u64);
    }
    if let Some(p) = WORK.get_ptr_mut(tgid) {
        atomic_add(p, 1);
    }
    0
}

/// Entry of libc's `exit` or CPython's `Py_FinalizeEx` in a launched command: its teardown
/// (static destructors, atexit handlers, interpreter finalization) begins. The first call in
/// a watched process stops the whole process (SIGSTOP, delivered before the function's first
/// instruction runs) and tells the agent, which takes a checkpoint of what was live before the
/// teardown frees anything, then sends SIGCONT.
#[uprobe]
pub fn teardown_enter(_ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if TEARDOWN.remove(&tgid).is_err() {
        return 0;
    }
    // The process stops as this probe returns to user space.
    stop_and_tell(MapEvent { kind: map_event::TEARDOWN, tgid, ..Default::default() });
    0
}

/// The OOM killer chose a task as its victim (oom:mark_victim, before the kill is delivered): a
/// traced process's `pid` is its tgid (the killer picks processes by their leader and marks that
/// task, or its first thread that still has an mm when the leader has exited: then this misses
/// it, and the cgroup's oom_kill counter is what the agent has). Tell the agent, with the
/// victim's anonymous RSS (KiB).
#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    // SAFETY: reads of this object's own global; volatile, as the agent sets it at load time.
    let (pid_off, rss_off) = unsafe {
        (
            core::ptr::read_volatile(&TP_OFFSETS[tp_field::OOM_VICTIM_PID]) as usize,
            core::ptr::read_volatile(&TP_OFFSETS[tp_field::OOM_VICTIM_ANON_RSS]) as usize,
        )
    };
    // SAFETY: bpf_probe_read_kernel of the record at the format file's offsets.
    let pid = unsafe { ctx.read_at::<u32>(pid_off) }.unwrap_or(0);
    if pid == 0 || !is_target(pid) {
        return 0;
    }
    // SAFETY: as above.
    let anon_rss_kib = unsafe { ctx.read_at::<u64>(rss_off) }.unwrap_or(0);
    emit(&MapEvent { kind: map_event::OOM_VICTIM, tgid: pid, addr: anon_rss_kib, ..Default::default() });
    0
}

/// A traced process forked (or made a thread): tell the agent, which follows new processes
/// with --follow-forks (sched:sched_process_fork's `child_pid`).
#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    // SAFETY: a read of this object's own global; volatile, as the agent sets it at load time.
    let off = unsafe { core::ptr::read_volatile(&TP_OFFSETS[tp_field::FORK_CHILD_PID]) } as usize;
    // SAFETY: a bpf_probe_read_kernel of the record at the format file's offset.
    let child = unsafe { ctx.read_at::<u32>(off) }.unwrap_or(0);
    emit(&MapEvent { kind: map_event::FORK, tgid, addr: child as u64, ..Default::default() });
    0
}

/// A traced process completed an `execve` (sched:sched_process_exec, after the new image is in
/// place; the exec'ing thread is the leader by now, so its tgid is the process's): tell the
/// agent, which re-discovers the new image's objects and notes where the image changed.
///
/// A launched process (`EXEC_HOLD`) is stopped here (SIGSTOP, delivered before the new image's
/// first instruction) until the agent has probed the new image: a wrapper's exec (`env`,
/// `taskset`, a script's `exec`) would otherwise run the program unprobed until the agent's
/// next poll, and a short one entirely. So is an untraced child of a launched process whose
/// children are followed, which the agent then follows.
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if is_target(tgid) {
        let held = match EXEC_HOLD.get_ptr_mut(&tgid) {
            // SAFETY: a value the lookup returned, valid while the program runs; only this
            // process's exec (one at a time) and the agent write it.
            Some(h) => unsafe {
                if *h & exec_hold::PASS_MASK != 0 {
                    *h -= 1;
                    false
                } else {
                    true
                }
            },
            // A child just followed, whose own entry the agent has not made yet.
            None => parent_holds_children(parent_tgid()),
        };
        let ev = MapEvent { kind: map_event::EXEC, tgid, ..Default::default() };
        if held {
            stop_and_tell(ev);
        } else {
            emit(&ev);
        }
        return 0;
    }
    let parent = parent_tgid();
    if parent_holds_children(parent) {
        stop_and_tell(MapEvent { kind: map_event::CHILD_EXEC, tgid, addr: parent as u64, ..Default::default() });
    }
    0
}

/// Whether `parent` (a tgid, 0: unknown) holds its children's execs (`exec_hold::CHILDREN`).
#[inline(always)]
fn parent_holds_children(parent: u32) -> bool {
    // SAFETY: a value the lookup returned, copied at once.
    parent != 0 && EXEC_HOLD.get_ptr(&parent).is_some_and(|h| unsafe { *h } & exec_hold::CHILDREN != 0)
}

/// The tgid of the current task's parent (`task_struct.real_parent->tgid`, offsets from the
/// kernel's BTF set by the agent); 0 when the offsets are not known or a read fails.
#[inline(always)]
pub(crate) fn parent_tgid() -> u32 {
    let (parent_off, tgid_off) =
        (crate::unwind::offset(kernel_offset::TASK_REAL_PARENT), crate::unwind::offset(kernel_offset::TASK_TGID));
    if parent_off == 0 || tgid_off == 0 {
        return 0;
    }
    // SAFETY: bpf_get_current_task returns the current task's address; the reads are checked
    // copies of kernel memory (bpf_probe_read_kernel): a bad address is an error, not a fault.
    unsafe {
        let task = aya_ebpf::helpers::bpf_get_current_task();
        let Ok(parent) = bpf_probe_read_kernel((task + parent_off) as *const u64) else { return 0 };
        if parent == 0 {
            return 0;
        }
        bpf_probe_read_kernel((parent + tgid_off) as *const u32).unwrap_or(0)
    }
}

/// Growth mode: a user page fault on a page that was not present (first touch: the kernel makes
/// a page resident). Counted per call stack, 4096 bytes each. No allocator probe is involved.
#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    // exceptions:page_fault_user's error_code: bit 0 = protection fault.
    let error_code = tp_u64(&ctx, tp_field::FAULT_ERROR_CODE);
    if error_code & 1 != 0 {
        return 0;
    }
    count(counter::PAGE_FAULTS);
    // A fault is inside a function body, not at its entry: the word at the stack pointer is
    // no return address, so no `caller` (it would split one stack into many sites and put a
    // bogus frame 1 in each).
    let site =
        SiteKey { caller: 0, ..site_here::<true, false>(task_regs(), pid_tgid, site_kind::FAULT, core::ptr::null()) };
    match site_index(&site) {
        Some(index) if account_alloc(index, 4096, now_ms()) => {}
        _ => count(counter::SITES_FULL),
    }
    0
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
