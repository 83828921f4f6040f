//! The probe programs and maps (bpf target only).

use crate::maps::{INFLIGHT, ThreadSlot, WalkMemo, count, walk_buffer};
use aya_ebpf::helpers::generated::{
    bpf_get_current_task_btf, bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_send_signal, bpf_task_pt_regs,
};
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, Queue, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use leaktrace_common::{
    AllocInfo, AllocKey, BUCKET_SLOTS, BlockBucket, GcFull, InFlight, MapEvent, MmapCall, SiteKey, SiteStats,
    StackFrames, SyscallArgs, TargetMode, counter, exec_hold, kernel_offset, map_event, op, owner, sampling, site_kind,
    target_mode, tp_field,
};

mod mappings;
mod process;
mod walk;

pub(crate) use process::parent_tgid;
use walk::{probe_regs, site_here, user_regs};

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

/// Call-stack sites: `SiteKey` → the site's index in `SITE_STATS` (given when the site is first
/// seen; the agent removes a process's entries when it stops tracing it and, later, gives their
/// indices back through `FREE_SITES`). Sized by the agent (--max-sites).
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

/// Site indices the agent gave back (`Tracer::release_process`: their process is no longer
/// traced, its `SITES` entries are gone, its probes detached, the slot's totals zeroed):
/// taken before a new one from `NEXT_SITE`. Their `SITE_INDICES` claims stay, so the two never
/// give one index twice. Sized by the agent (--max-sites).
#[map]
static FREE_SITES: Queue<u32> = Queue::with_max_entries(1 << 16, 0);

/// Bumped by the agent (index 0) whenever it removes `SITES` entries: a `SITE_CACHE` entry
/// made under another epoch is not taken, so no cached index outlives its site (a reused PID
/// with the same stack looks its site up anew).
#[map]
static SITE_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// Per site index: the birth time (ms, as `AllocInfo::born_ms`) before which a block is not
/// the index's present site's, set by the agent when it gives the index back. A block of the
/// index's former owner retired later (its address reused by a process with its PID) is not
/// credited to the new one. Sized by the agent (--max-sites).
#[map]
static SITE_SINCE: Array<u32> = Array::with_max_entries(1 << 16, 0);

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

/// Traced processes and how each is traced (growth, exact or sampled, and its sampling mean):
/// the mmap/munmap/mremap/brk syscalls of these are tracked (the syscall tracepoints fire for
/// every process; uprobes are attached per process and need no filter), the page faults of those
/// in growth mode counted, the allocator calls of those in sampled mode sampled.
#[map]
static TARGETS: HashMap<u32, TargetMode> = HashMap::with_max_entries(1024, 0);

/// Bumped by the agent (index 0) after each change of a `TARGETS` entry: a thread's cached mode
/// (`ThreadSlot::mode`) made under another generation is read again from `TARGETS`.
#[map]
static MODE_GEN: Array<u64> = Array::with_max_entries(1, 0);

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

/// Full collections of each Node process's main isolate and what the last one left (tgid →
/// `GcFull`, the entry made by the agent when it probes the process's V8).
#[map]
static GC_FULL: HashMap<u32, GcFull> = HashMap::with_max_entries(1024, 0);

/// Launched commands whose teardown is watched (tgid → 0, inserted by the agent). The first
/// teardown call deletes its entry (atomically: one caller wins), so each process stops once.
#[map]
static TEARDOWN: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Launched processes whose execs stop until the agent has probed the new image (tgid →
/// `leaktrace_common::exec_hold` bits, set by the agent; see `sched_process_exec`).
#[map]
static EXEC_HOLD: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Sampled mode: the tables of `leaktrace_common::sampling`, filled by the agent (each process's
/// mean distance is in its `TARGETS` entry).
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
    let mean = slot_sample_mean(slot, tgid);
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
                    free_addr(tgid, ptr, Some(slot));
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

/// The sampling mean of process `tgid` (0: not sampled), from the thread's cached copy while
/// `MODE_GEN` has not changed since it was read from `TARGETS`.
#[inline(always)]
fn slot_sample_mean(slot: *mut ThreadSlot, tgid: u32) -> u64 {
    // SAFETY: an array value (get checked the index), copied at once.
    let generation = MODE_GEN.get(0).map_or(0, |v| unsafe { core::ptr::read_volatile(v) });
    // SAFETY: this thread's task-storage value (as in `enter`), valid for the program run; only
    // this thread's programs use it, and they do not nest.
    unsafe {
        let cached = &raw mut (*slot).mode;
        if (*cached).generation == generation && (*cached).tgid == tgid as u64 {
            return (*cached).sample_mean;
        }
        let mean = target_sample_mean(tgid);
        *cached = crate::maps::CachedMode { generation, tgid: tgid as u64, sample_mean: mean };
        mean
    }
}

/// The sampling mean of process `tgid` as `TARGETS` says (0: not sampled, or not a target).
#[inline(always)]
fn target_sample_mean(tgid: u32) -> u64 {
    match TARGETS.get_ptr(tgid) {
        // SAFETY: a value the lookup returned, read at once.
        Some(t) => unsafe { if (*t).mode == target_mode::SAMPLED { (*t).sample_mean } else { 0 } },
        None => 0,
    }
}

/// Whether process `tgid` is sampled (then a free or a return of an unsampled call is no loss):
/// the cached mode in the thread's slot (`slot`, looked up by the caller) when it is current,
/// else `TARGETS`.
#[inline(always)]
fn sampled(tgid: u32, slot: Option<*mut ThreadSlot>) -> bool {
    match slot {
        Some(slot) => slot_sample_mean(slot, tgid) != 0,
        None => target_sample_mean(tgid) != 0,
    }
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
    // SAFETY: an array value (get checked the index), copied at once.
    let since = SITE_SINCE.get(info.index).map_or(0, |v| unsafe { core::ptr::read_volatile(v) });
    if info.born_ms < since {
        // A block of the index's former site: its totals went when the index was given back.
        count(counter::FREES);
        return;
    }
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
fn site_check(site: &SiteKey, index: u64, epoch: u64) -> u64 {
    let h = crate::unwind_rule::mix(site.stack ^ ((site.tgid as u64) << 32 | site.kind as u64));
    crate::unwind_rule::mix(h ^ site.caller ^ (index << 40) ^ crate::unwind_rule::mix(epoch))
}

/// The index of `site` in `SITE_STATS`: from this CPU's `SITE_CACHE`, else from `SITES`, else a
/// new one (`FREE_SITES`, else `NEXT_SITE`) inserted there. None when `SITES` or `SITE_STATS`
/// is full. The epoch is read before `SITES`: an entry cached by a lookup that raced the
/// agent's removal of the site carries the epoch before the agent's bump, and is not taken.
#[inline(always)]
fn site_index(site: &SiteKey) -> Option<u32> {
    // SAFETY: the array's one value (get checked the index), copied at once.
    let epoch = SITE_EPOCH.get(0).map_or(0, |e| unsafe { core::ptr::read_volatile(e) });
    let h = crate::unwind_rule::mix(site.stack ^ site.caller ^ ((site.tgid as u64) << 32 | site.kind as u64));
    let slot = SITE_CACHE.get_ptr_mut(h as u32 & (SITE_CACHE_SLOTS - 1));
    if let Some(c) = slot {
        // SAFETY: this CPU's slot of a per-CPU array value (get_ptr_mut checked the index), valid
        // while the program runs; copied, then checked as a whole.
        let c = unsafe { *c };
        if c.key == *site && c.check == site_check(site, c.index, epoch) {
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
                // Another CPU inserted the site meanwhile: its index is the site's, and `fresh`
                // (unused, its totals zero) goes back for the next new site.
                Err(EEXIST) => {
                    let _ = FREE_SITES.push(fresh, 0);
                    // SAFETY: as above.
                    unsafe { *SITES.get_ptr(site)? }
                }
                Err(_) => {
                    let _ = FREE_SITES.push(fresh, 0);
                    return None;
                }
            }
        }
    };
    if let Some(c) = slot {
        // SAFETY: the slot read above, written whole.
        unsafe { *c = CachedSite { key: *site, index: index as u64, check: site_check(site, index as u64, epoch) } };
    }
    Some(index)
}

/// A site index no other site has: one the agent gave back (`FREE_SITES`), else a new one
/// (claimed in `SITE_INDICES`); None when `SITE_STATS` is full or four claims in a row lost
/// their race.
#[inline(always)]
fn new_site_index() -> Option<u32> {
    if let Ok(Some(i)) = FREE_SITES.pop() {
        return Some(i);
    }
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
    crate::unwind_rule::mix(addr ^ (tgid as u64).rotate_right(20)) | 1
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
/// bucket having overflowed) its `ALLOCS` entry. `slot`: the thread's slot, if it has one.
#[inline(always)]
fn free_addr(tgid: u32, addr: u64, slot: Option<*mut ThreadSlot>) {
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
            if !sampled(tgid, slot) {
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
            if !sampled(tgid, slot) {
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
    let thread = INFLIGHT.current(false);
    // SAFETY: this thread's task-storage value, as in `enter`: valid for the program run, the
    // only reference to its call in this program (its cached mode, another field, is read
    // through the pointer by `sampled`).
    let slot = thread.map(|p| unsafe { &mut (*p).call });
    let Some(slot) = slot.filter(|s| s.sp != 0) else {
        if !sampled(tgid, thread) {
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
                    free_addr(tgid, cur.ptr, thread);
                } else {
                    // Failed realloc: the old block stays valid and live.
                    count(counter::FAILED_ALLOC);
                }
                return 0;
            }
            if cur.ptr != 0 {
                // Moved or resized in place: the old block is retired either way.
                free_addr(tgid, cur.ptr, thread);
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
    let thread = INFLIGHT.current(false);
    if let Some(cur) = thread {
        // SAFETY: this thread's task-storage value (as in `enter`), read once.
        let cur_sp = unsafe { (*cur).call.sp };
        if cur_sp != 0 && stack_pointer(ctx.regs) < cur_sp {
            // free called by a hooked allocator function: the outer call accounts for it.
            count(counter::NESTED_CALL);
            return 0;
        }
    }
    free_addr(tgid, addr, thread);
    0
}

#[inline(always)]
pub(crate) fn arg(ctx: &ProbeContext, n: usize) -> u64 {
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

/// A traced process in growth mode (its page faults are counted).
#[inline(always)]
pub(crate) fn in_growth_mode(tgid: u32) -> bool {
    // SAFETY: a value the lookup returned, read at once.
    TARGETS.get_ptr(tgid).is_some_and(|t| unsafe { (*t).mode } == target_mode::GROWTH)
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

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
