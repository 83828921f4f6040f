//! The probe programs and maps (bpf target only).

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use aya_ebpf::helpers::generated::{bpf_get_current_task_btf, bpf_get_prandom_u32, bpf_task_pt_regs};
use leaktrace_common::{
    counter, map_event, op, owner, sampling, site_kind, AllocInfo, AllocKey, InFlight, MapEvent, MmapCall, SiteKey,
    SiteStats, SyscallArgs,
};

/// The agent's own tgid (set at load time): its allocations are never traced.
#[unsafe(no_mangle)]
static AGENT_TGID: u32 = 0;

/// Outstanding blocks: (tgid, address) → size, time, site. Sized by the agent (--max-allocs).
#[map]
static ALLOCS: HashMap<AllocKey, AllocInfo> = HashMap::with_max_entries(1 << 20, BPF_F_NO_PREALLOC);

/// Per call-stack totals. Sized by the agent (--max-sites).
#[map]
static SITES: HashMap<SiteKey, SiteStats> = HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// User call stacks, by id (bpf_get_stackid without BPF_F_REUSE_STACKID: a collision is counted,
/// never silently overwritten). Sized by the agent (--max-stacks).
#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(1 << 14, 0);

/// Allocator calls between entry and return, by pid_tgid (one per thread: nested calls are folded
/// into the outermost one).
#[map]
static INFLIGHT: HashMap<u64, InFlight> = HashMap::with_max_entries(1 << 14, 0);

/// Loss and event counters, indexed by `leaktrace_common::counter::*`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::NUM, 0);

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

/// Sampled mode: the tables and mean distance of `leaktrace_common::sampling`, filled by the agent.
#[map]
static SAMPLING: Array<u64> = Array::with_max_entries(sampling::LEN, 0);

/// Sampled mode: bytes each thread still allocates before its next sample, by tid.
#[map]
static SAMPLER: LruHashMap<u32, i64> = LruHashMap::with_max_entries(1 << 14, 0);

const EEXIST: i32 = -17;
const MAP_ANONYMOUS: u64 = 0x20;

#[inline(always)]
fn count(idx: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn agent_tgid() -> u32 {
    unsafe { core::ptr::read_volatile(&AGENT_TGID) }
}

#[inline(always)]
fn stack_pointer(regs: *const aya_ebpf::bindings::pt_regs) -> u64 {
    #[cfg(not(bpf_target_arch = "aarch64"))]
    {
        unsafe { (*regs).rsp }
    }
    #[cfg(bpf_target_arch = "aarch64")]
    {
        unsafe { (*regs).sp }
    }
}

#[inline(always)]
fn atomic_add(p: *mut u64, v: u64) {
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, v)
    };
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
    if let Some(cur) = INFLIGHT.get_ptr_mut(pid_tgid) {
        let cur_sp = unsafe { (*cur).sp };
        if sp < cur_sp {
            // Called from inside an allocator call of this thread: the outer call accounts for
            // it. A wrapper (strdup) learns its size from the call it makes.
            unsafe {
                if (*cur).op == op::WRAPPER && (*cur).size == 0 {
                    (*cur).size = size;
                }
            }
            count(counter::NESTED_CALL);
            return 0;
        }
        if sp == cur_sp {
            // A tail jump from one hooked function into another: the same call goes on.
            unsafe { (*cur).tail_calls += 1 };
            count(counter::NESTED_CALL);
            return 0;
        }
        // An older call of this thread never returned through its return probe.
        count(counter::MISSED_RETURN);
    }
    let mean = sampling_mean();
    let mut size = size;
    if mean != 0 {
        match sample(pid_tgid as u32, size, mean) {
            Some(weight) => size = weight,
            None => {
                // Not sampled: no stack walk, no map work. A realloc still retires its old
                // block, which may have been sampled (a failed realloc, rare, is missed).
                if (op == op::REALLOC || op == op::REALLOCARRAY) && ptr != 0 {
                    free_addr(tgid, ptr);
                }
                return 0;
            }
        }
    }
    let site = site_here(ctx, tgid, sp, site_kind::MALLOC);
    let rec = InFlight { sp, size, ptr, op, tail_calls: 0, site };
    if INFLIGHT.insert(pid_tgid, rec, 0).is_err() {
        count(counter::INFLIGHT_FULL);
    }
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
/// 1/mean. Returns the estimated bytes a sampled allocation of `size` stands for.
#[inline(always)]
fn sample(tid: u32, size: u64, mean: u64) -> Option<u64> {
    let next_distance = || (mean * table(sampling::EXP_BASE, unsafe { bpf_get_prandom_u32() } as u64)) >> sampling::SHIFT;
    let left = match SAMPLER.get_ptr_mut(tid) {
        Some(p) => p,
        None => {
            let _ = SAMPLER.insert(tid, next_distance() as i64, 0);
            SAMPLER.get_ptr_mut(tid)?
        }
    };
    let remaining = unsafe { *left } - size as i64;
    if remaining > 0 {
        unsafe { *left = remaining };
        return None;
    }
    unsafe { *left = next_distance() as i64 };
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
    if let Some(s) = SITES.get_ptr_mut(info.site) {
        atomic_add(unsafe { &raw mut (*s).free_bytes }, info.size);
        atomic_add(unsafe { &raw mut (*s).free_count }, 1);
    }
    count(counter::FREES);
}

/// Retire the block at `addr` of process `tgid`, if it is tracked.
#[inline(always)]
fn free_addr(tgid: u32, addr: u64) {
    let key = AllocKey { tgid, _pad: 0, addr };
    let info = match ALLOCS.get_ptr(key) {
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

/// Record a new outstanding block.
#[inline(always)]
fn record(tgid: u32, addr: u64, size: u64, site: SiteKey) {
    let key = AllocKey { tgid, _pad: 0, addr };
    let info = AllocInfo { size, ts_ns: unsafe { bpf_ktime_get_ns() }, site };
    match ALLOCS.insert(key, info, BPF_NOEXIST as u64) {
        Ok(()) => {}
        Err(EEXIST) => {
            // The address is live already: the free of the old block was not seen.
            if let Some(old) = ALLOCS.get_ptr_mut(key) {
                let prev = unsafe { *old };
                count(counter::ADDRESS_REUSED);
                account_free(&prev);
                unsafe { *old = info };
            }
        }
        Err(_) => {
            count(counter::ALLOCS_FULL);
            return;
        }
    }
    let mut stats = SITES.get_ptr_mut(site);
    if stats.is_none() {
        // Racing creators are fine: BPF_NOEXIST makes one win, the other finds it below.
        let _ = SITES.insert(site, SiteStats::default(), BPF_NOEXIST as u64);
        stats = SITES.get_ptr_mut(site);
    }
    match stats {
        Some(s) => {
            atomic_add(unsafe { &raw mut (*s).alloc_bytes }, size);
            atomic_add(unsafe { &raw mut (*s).alloc_count }, 1);
            count(counter::ALLOCS);
        }
        None => {
            count(counter::SITES_FULL);
            let _ = ALLOCS.remove(key);
        }
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
    let cur = match INFLIGHT.get_ptr(pid_tgid) {
        Some(p) => unsafe { *p },
        None => {
            if sampling_mean() == 0 {
                count(counter::ORPHAN_RETURN);
            }
            return 0;
        }
    };
    if sp < cur.sp + 8 {
        // Return of a nested call that was folded into the outer one.
        return 0;
    }
    if sp == cur.sp + 8 && cur.tail_calls > 0 {
        // The return probe of a function tail-jumped into fires first at the same return.
        if let Some(p) = INFLIGHT.get_ptr_mut(pid_tgid) {
            unsafe { (*p).tail_calls -= 1 };
        }
        return 0;
    }
    let _ = INFLIGHT.remove(pid_tgid);
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
    if let Some(cur) = INFLIGHT.get_ptr(pid_tgid) {
        if stack_pointer(ctx.regs) < unsafe { (*cur).sp } {
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

/// Call stack of the current call, with the return address found at `sp` as the direct caller.
#[inline(always)]
fn site_here<C: aya_ebpf::programs::tracing::StackIdContext>(ctx: &C, tgid: u32, sp: u64, kind: u32) -> SiteKey {
    let caller = if sp != 0 { unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0) } else { 0 };
    let stack_id = match ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64) {
        Ok(id) => id as i32,
        Err(EEXIST) => {
            count(counter::STACK_COLLISION);
            -1
        }
        Err(_) => {
            count(counter::STACK_ERROR);
            -2
        }
    };
    SiteKey { tgid, stack_id, caller, kind, _pad: 0 }
}

/// A thread inside a hooked allocator call: what it maps is the allocator's.
#[inline(always)]
fn in_allocator(pid_tgid: u64) -> bool {
    INFLIGHT.get_ptr(pid_tgid).is_some()
}

/// User-space stack pointer of the current task (at a syscall tracepoint).
#[inline(always)]
fn user_sp() -> u64 {
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const aya_ebpf::bindings::pt_regs;
        if regs.is_null() {
            return 0;
        }
        bpf_probe_read_kernel(&raw const (*regs).rsp).unwrap_or(0)
    }
}

#[inline(always)]
fn is_target(tgid: u32) -> bool {
    TARGETS.get_ptr(tgid).is_some()
}

#[inline(always)]
fn emit(ev: &MapEvent) {
    if EVENTS.output::<MapEvent>(ev, 0).is_err() {
        count(counter::EVENTS_LOST);
    }
}

/// libc mmap(): remember the caller's stack for the syscall tracepoint (anonymous mappings only).
#[uprobe]
pub fn mmap_enter(ctx: ProbeContext) -> u32 {
    let flags = arg(&ctx, 3);
    if flags & MAP_ANONYMOUS == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == agent_tgid() {
        return 0;
    }
    let sp = stack_pointer(ctx.regs);
    let (own, site) = if in_allocator(pid_tgid) {
        (owner::ALLOCATOR, SiteKey::default())
    } else {
        (owner::OFFHEAP, site_here(&ctx, tgid, sp, site_kind::MMAP))
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
    let a = unsafe { *SYSCALLS.get_ptr(pid_tgid)? };
    let _ = SYSCALLS.remove(pid_tgid);
    if a.nr == nr { Some(a) } else { None }
}

#[inline(always)]
fn tp_u64(ctx: &TracePointContext, off: usize) -> u64 {
    unsafe { ctx.read_at::<u64>(off) }.unwrap_or(0)
}

#[inline(always)]
fn syscall_ret(ctx: &TracePointContext) -> Option<u64> {
    let ret = tp_u64(ctx, 16) as i64;
    if (-4095..0).contains(&ret) { None } else { Some(ret as u64) }
}

#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let flags = tp_u64(&ctx, 40);
    if flags & MAP_ANONYMOUS == 0 {
        return 0;
    }
    let sp = user_sp();
    let libc_call = match MMAP_CALLS.get_ptr(pid_tgid) {
        // The libc wrapper's frame is just below its entry stack pointer.
        Some(c) => {
            let c = unsafe { *c };
            let _ = MMAP_CALLS.remove(pid_tgid);
            if sp <= c.sp && sp + 512 > c.sp { Some(c) } else { None }
        }
        None => None,
    };
    let (own, site) = match libc_call {
        Some(c) => (c.owner, c.site),
        // A raw syscall (syscall(SYS_mmap, ...), a runtime's own wrapper).
        None if in_allocator(pid_tgid) => (owner::ALLOCATOR, SiteKey::default()),
        None => (owner::OFFHEAP, site_here(&ctx, tgid, sp, site_kind::MMAP)),
    };
    save_args(
        pid_tgid,
        SyscallArgs { nr: nr::MMAP, owner: own, a0: tp_u64(&ctx, 24), a1: tp_u64(&ctx, 32), a2: flags, a3: 0, site },
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
        SyscallArgs { nr: nr::MUNMAP, a0: tp_u64(&ctx, 16), a1: tp_u64(&ctx, 24), ..Default::default() },
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
            a0: tp_u64(&ctx, 16),
            a1: tp_u64(&ctx, 24),
            a2: tp_u64(&ctx, 32),
            a3: tp_u64(&ctx, 40),
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
    save_args(pid_tgid, SyscallArgs { nr: nr::BRK, a0: tp_u64(&ctx, 16), ..Default::default() });
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

/// A traced process forked (or made a thread): tell the agent, which follows new processes
/// with --follow-forks. sched:sched_process_fork: child_pid @20.
#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    let child = unsafe { ctx.read_at::<u32>(20) }.unwrap_or(0);
    emit(&MapEvent { kind: map_event::FORK, tgid, addr: child as u64, ..Default::default() });
    0
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
    // exceptions:page_fault_user: address @8, ip @16, error_code @24; bit 0 = protection fault.
    let error_code = tp_u64(&ctx, 24);
    if error_code & 1 != 0 {
        return 0;
    }
    count(counter::PAGE_FAULTS);
    let site = site_here(&ctx, tgid, user_sp(), site_kind::FAULT);
    let mut stats = SITES.get_ptr_mut(site);
    if stats.is_none() {
        let _ = SITES.insert(site, SiteStats::default(), BPF_NOEXIST as u64);
        stats = SITES.get_ptr_mut(site);
    }
    match stats {
        Some(s) => {
            atomic_add(unsafe { &raw mut (*s).alloc_bytes }, 4096);
            atomic_add(unsafe { &raw mut (*s).alloc_count }, 1);
        }
        None => count(counter::SITES_FULL),
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
