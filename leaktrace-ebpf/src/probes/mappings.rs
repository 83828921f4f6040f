//! Mappings: libc mmap's caller, the mmap/munmap/mremap/brk syscall tracepoints, and growth
//! mode's first-touch page faults.

use super::walk::task_regs;
use super::*;

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
    let sp = regs.map_or(0, |r| r.sp);
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
        None => match regs {
            Some(r) => (owner::OFFHEAP, site_here::<false, false>(r, pid_tgid, site_kind::MMAP, core::ptr::null())),
            // No registers to walk from: the process's mmap site without a stack.
            None => (owner::OFFHEAP, SiteKey { tgid, kind: site_kind::MMAP, stack: 0, caller: 0 }),
        },
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

/// A traced process enters a syscall: its arguments (`args`, read only then) are kept for the
/// exit tracepoint. The shared entry of munmap, mremap and brk.
#[inline(always)]
fn enter(args: impl FnOnce() -> SyscallArgs) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_target((pid_tgid >> 32) as u32) {
        save_args(pid_tgid, args());
    }
    0
}

/// A syscall `nr` exits: the process (tgid), the arguments kept at its entry and its return
/// value; None when its entry was not kept (an untraced process) or it failed. The arguments
/// are taken out of SYSCALLS either way. The shared exit of mmap, munmap, mremap and brk.
#[inline(always)]
fn exited(ctx: &TracePointContext, nr: u32) -> Option<(u32, SyscallArgs, u64)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let a = take_args(pid_tgid, nr)?;
    let ret = syscall_ret(ctx)?;
    Some(((pid_tgid >> 32) as u32, a, ret))
}

#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    let Some((tgid, a, addr)) = exited(&ctx, nr::MMAP) else { return 0 };
    count(if a.owner == owner::OFFHEAP { counter::OFFHEAP_MAPS } else { counter::ALLOCATOR_MAPS });
    emit(&MapEvent {
        kind: map_event::MMAP,
        tgid,
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
    enter(|| SyscallArgs {
        nr: nr::MUNMAP,
        a0: tp_u64(&ctx, tp_field::MUNMAP_ADDR),
        a1: tp_u64(&ctx, tp_field::MUNMAP_LEN),
        ..Default::default()
    })
}

#[tracepoint]
pub fn sys_exit_munmap(ctx: TracePointContext) -> u32 {
    let Some((tgid, a, _)) = exited(&ctx, nr::MUNMAP) else { return 0 };
    emit(&MapEvent { kind: map_event::MUNMAP, tgid, addr: a.a0, len: a.a1, ..Default::default() });
    0
}

#[tracepoint]
pub fn sys_enter_mremap(ctx: TracePointContext) -> u32 {
    enter(|| SyscallArgs {
        nr: nr::MREMAP,
        a0: tp_u64(&ctx, tp_field::MREMAP_ADDR),
        a1: tp_u64(&ctx, tp_field::MREMAP_OLD_LEN),
        a2: tp_u64(&ctx, tp_field::MREMAP_NEW_LEN),
        a3: tp_u64(&ctx, tp_field::MREMAP_FLAGS),
        ..Default::default()
    })
}

#[tracepoint]
pub fn sys_exit_mremap(ctx: TracePointContext) -> u32 {
    let Some((tgid, a, addr)) = exited(&ctx, nr::MREMAP) else { return 0 };
    emit(&MapEvent {
        kind: map_event::MREMAP,
        tgid,
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
    enter(|| SyscallArgs { nr: nr::BRK, a0: tp_u64(&ctx, tp_field::BRK_BRK), ..Default::default() })
}

#[tracepoint]
pub fn sys_exit_brk(ctx: TracePointContext) -> u32 {
    let Some((tgid, _, addr)) = exited(&ctx, nr::BRK) else { return 0 };
    emit(&MapEvent { kind: map_event::BRK, tgid, addr, ..Default::default() });
    0
}

/// Growth mode: a user page fault on a page that was not present (first touch: the kernel makes
/// a page resident). Counted per call stack, 4096 bytes each. No allocator probe is involved.
#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !in_growth_mode(tgid) {
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
    let site = match task_regs() {
        Some(r) => SiteKey { caller: 0, ..site_here::<true, false>(r, pid_tgid, site_kind::FAULT, core::ptr::null()) },
        // No registers to walk from: the process's fault site without a stack.
        None => SiteKey { tgid, kind: site_kind::FAULT, stack: 0, caller: 0 },
    };
    match site_index(&site) {
        Some(index) if account_alloc(index, 4096, now_ms()) => {}
        _ => count(counter::SITES_FULL),
    }
    0
}
