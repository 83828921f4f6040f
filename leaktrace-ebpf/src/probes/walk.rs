//! The stack walk at a probe: the user registers it starts from, the walk itself (unwind rows,
//! frame pointers where there are none, the walk memo), and the site key of the stack walked.

use super::*;

/// User registers a stack walk starts from.
#[derive(Clone, Copy)]
pub(super) struct UserRegs {
    pub(super) ip: u64,
    pub(super) sp: u64,
    pub(super) fp: u64,
}

/// Instruction, stack and frame pointer of a register set: the one place that names the
/// architecture's registers.
#[inline(always)]
pub(super) fn user_regs(r: &aya_ebpf::bindings::pt_regs) -> UserRegs {
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
pub(super) fn probe_regs(ctx: &ProbeContext) -> UserRegs {
    // SAFETY: the probe context's register set, valid for the whole program run.
    user_regs(unsafe { &*ctx.regs })
}

/// The current task's user registers (at a tracepoint: where it entered the kernel); None when
/// they cannot be read.
///
/// None, not zeros: a walk from constant registers is one the verifier follows value by value
/// (every frame a new state), and that path alone took sys_enter_mmap past the verifier's
/// 1 M-instruction limit (45 s of verification, then "program is too large").
#[inline(always)]
pub(super) fn task_regs() -> Option<UserRegs> {
    // SAFETY: helpers on the current task (a BTF pointer from the kernel); its pt_regs pointer is
    // checked for null and read with a checked copy (bpf_probe_read_kernel).
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const aya_ebpf::bindings::pt_regs;
        if regs.is_null() {
            return None;
        }
        // The three registers, not the whole 168-byte pt_regs: a copy on the stack would take
        // a third of the program's 512 bytes, and the walk's frames need the rest.
        #[cfg(not(bpf_target_arch = "aarch64"))]
        let (ip, sp, fp) = (&raw const (*regs).rip, &raw const (*regs).rsp, &raw const (*regs).rbp);
        #[cfg(bpf_target_arch = "aarch64")]
        let (ip, sp, fp) = (&raw const (*regs).pc, &raw const (*regs).sp, &raw const (*regs).regs[29]);
        match (bpf_probe_read_kernel(ip), bpf_probe_read_kernel(sp), bpf_probe_read_kernel(fp)) {
            (Ok(ip), Ok(sp), Ok(fp)) => Some(UserRegs { ip, sp, fp }),
            _ => None,
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
pub(super) fn walk_stack<const FAULT: bool, const MEMO: bool>(
    r: UserRegs,
    pid_tgid: u64,
    memo: *const WalkMemo,
) -> (u64, u64) {
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
    // A walk that preempted this one on the CPU used the same walk state and buffer
    // (`unwind::WALK_STATE`): the hash may then be of its frames, not of this stack.
    // SAFETY: a volatile read of a field of the buffer (aligned, initialized).
    if unsafe { core::ptr::read_volatile(&raw const buf.generation) } != generation {
        count(counter::STACK_ERROR);
        return (0, generation);
    }
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
pub(super) fn site_here<const FAULT: bool, const MEMO: bool>(
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
