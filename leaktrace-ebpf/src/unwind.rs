//! The user stack walk: frame by frame with the objects' unwind tables (CFI from `.eh_frame` /
//! `.debug_frame`, turned into compact rows by the agent), and by the frame-pointer chain in
//! code that has no table. See docs/kernel.md ("Stack walk").
//!
//! Per frame: the rule for the program counter (`unwind_rule.rs`) comes from a per-CPU
//! direct-mapped cache keyed by (tgid, pc); on a miss, `bpf_find_vma` gives the VMA of the pc, its file's (device, inode) is
//! looked up in `UNWIND_OBJECTS`, and the object's rows (a slice of `UNWIND_ROWS`) are
//! binary-searched. The rule gives the CFA (%rsp or %rbp plus an offset, or the PLT form); the
//! return address is read at CFA − 8 and the caller's %rbp where the rule says it was saved.
//! Frames are walked in a `bpf_loop` callback, so the verifier checks one frame's code, not 127
//! copies of it.
//!
//! Stack memory is read a window at a time (`STACK_WINDOW`: up to 2 KiB, never past the end of
//! the page it starts in): each `bpf_probe_read_user` costs ~40 ns whatever its size up to a few
//! KiB, and a stack's frames are next to each other, so one read serves several frames.
//!
//! At allocator entries each thread remembers its last walk ([`WalkMemo`]: the starting
//! registers and every stack word the walk read). A call made from the same registers whose
//! words all still hold the same values would walk the same frames: one copy of the stack and a
//! compare ([`memo_check`]) replace the walk. Any difference, and the walk is made.

use aya_ebpf::helpers::generated::bpf_loop;
use aya_ebpf::helpers::generated::bpf_probe_read_user as probe_read_user_raw;
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::map,
    maps::{Array, PerCpuArray},
};
use leaktrace_common::{MAX_STACK_DEPTH, StackFrames, UnwindRow, counter, unwind, walk_end};

use crate::maps::{MEMO_WORDS, WalkMemo, count, thread_memo, walk_buffer};
use crate::unwind_rule::mix;
use crate::unwind_rule::{leaktrace_unwind_rule, unpack};

/// Bumped by the agent whenever it loads tables: cached rules of an older generation are stale
/// (a pc cached as "no table" may have one now).
#[map]
static UNWIND_GEN: Array<u64> = Array::with_max_entries(1, 0);

/// Largest window of stack bytes read at once (a power of two; see `StackWindow`).
const WINDOW_BYTES: u64 = 2048;
const WINDOW_WORDS: usize = (WINDOW_BYTES / 8) as usize;

/// A copy of user stack memory, `len` bytes from `base`, made by the walk `owner` on this CPU.
#[repr(C)]
pub struct StackWindow {
    /// The `StackFrames::generation` of the walk that filled it. A walk on this CPU that runs in
    /// between (the first one preempted) writes its own here before it overwrites `bytes`, so a
    /// read that still finds its walk's value after copying a word got that walk's bytes.
    owner: u64,
    /// User address of `words[0]` (8-aligned).
    base: u64,
    /// Bytes of `words` that are valid (0: empty).
    len: u64,
    words: [u64; WINDOW_WORDS],
}

/// This CPU's window of the stack being walked (see `leaktrace_stack_word`).
#[map]
static STACK_WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);

/// Largest distance between two frames that the walk follows (bytes): a default thread stack is
/// 8 MiB, so no real frame is larger.
const MAX_FRAME_BYTES: u64 = 8 << 20;
/// End of the x86-64 user address space (47-bit): return addresses are below it.
const USER_SPACE_END: u64 = 0x0000_8000_0000_0000;

/// The registers the walk starts from.
#[derive(Clone, Copy)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
}

/// State of a walk between frames, in this CPU's [`WALK_STATE`].
#[repr(C)]
pub struct Walk {
    pc: u64,
    sp: u64,
    fp: u64,
    hash: u64,
    n: u64,
    tgid: u32,
    end: u32,
    generation: u64,
    /// The current pc was interrupted by a signal (not a return address): look it up as is.
    exact: u64,
    /// This walk's tag in `STACK_WINDOW` (its `StackFrames::generation`).
    owner: u64,
    /// Where the walk started (its first %rsp) when it records the words it reads for a
    /// [`WalkMemo`] (`MEMO_REC`); 0: it records nothing.
    base: u64,
    /// 1 while `fp` is still the %rbp the walk started with (no frame has restored it from the
    /// stack yet).
    fp_reg: u64,
    /// 1 once the starting %rbp was used (as a CFA base or a frame pointer): the memo's key
    /// then holds it.
    fp_used: u64,
}

/// This CPU's walk in progress (see [`Walk`]): in a map value, not on the BPF stack, because the
/// kernel verifies a `bpf_loop` callback as if it ran any number of times, until the states at
/// its entry repeat; a `Walk` on the stack carried every end code, flag and count the steps
/// wrote into the next state (204 passes over `step`, 53 K instructions of every allocator
/// entry's verification on kernel 6.18), while values in a map are not followed at all. A walk
/// that preempts this one on the CPU overwrites it; `walk`'s caller detects that by the walk
/// buffer's generation (`StackFrames::generation`) and drops the stack.
#[map]
static WALK_STATE: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// Walk the user stack from `r` into `buf` (frames, count, why it ended); returns the hash of the
/// frames (never 0).
///
/// `FAULT`: the walk runs in the page-fault tracepoint, with interrupts off, where
/// `bpf_find_vma` can look up only one mapping per CPU until they are on again: mappings are
/// then kept in `VMA_CACHE`.
///
/// `record`: the walk notes, in this CPU's `MEMO_REC`, every stack word it reads (its offset
/// from `r.sp` and its value), for [`leaktrace_memo_save`].
#[inline(always)]
pub fn walk<const FAULT: bool>(r: Regs, tgid: u32, buf: &mut StackFrames, record: bool) -> u64 {
    buf.ips[0] = r.ip;
    let generation = UNWIND_GEN.get(0).copied().unwrap_or(0);
    if record {
        leaktrace_memo_open(buf.generation, generation);
    }
    let Some(state) = WALK_STATE.get_ptr_mut(0) else {
        buf.len = 1;
        buf.end = walk_end::READ_FAULT;
        return mix(0xcbf2_9ce4_8422_2325 ^ r.ip) | 1;
    };
    // SAFETY: this CPU's walk state (a per-CPU array value, valid while the program runs),
    // written whole here and read back after the loop (see `WALK_STATE`).
    unsafe {
        *state = Walk {
            pc: r.ip,
            sp: r.sp,
            fp: r.fp,
            hash: mix(0xcbf2_9ce4_8422_2325 ^ r.ip),
            n: 1,
            tgid,
            end: walk_end::DEPTH,
            generation,
            exact: 0,
            owner: buf.generation,
            base: if record { r.sp } else { 0 },
            fp_reg: 1,
            fp_used: 0,
        }
    };
    let callback = step::<FAULT> as extern "C" fn(u64, *mut core::ffi::c_void) -> i64;
    // SAFETY: `step` has bpf_loop's callback signature and takes no context (a null one).
    unsafe { bpf_loop((MAX_STACK_DEPTH - 1) as u32, callback as *mut core::ffi::c_void, core::ptr::null_mut(), 0) };
    // The fields the loop wrote, read from the map value after it (volatile: the compiler
    // cannot see `step`'s writes through bpf_loop).
    // SAFETY: volatile reads of fields of the same map value as above.
    let (n, end, hash) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*state).n),
            core::ptr::read_volatile(&raw const (*state).end),
            core::ptr::read_volatile(&raw const (*state).hash),
        )
    };
    buf.len = n as u32;
    buf.end = end;
    if record {
        // SAFETY: as above.
        let (owner, fp_used) = unsafe {
            (core::ptr::read_volatile(&raw const (*state).owner), core::ptr::read_volatile(&raw const (*state).fp_used))
        };
        leaktrace_memo_close(owner, fp_used, end as u64);
    }
    if end != walk_end::COMPLETE {
        count(counter::STACK_TRUNCATED);
        // --debug-unwind only: AYA_LOG_LEVEL is 0 otherwise, a constant the verifier folds.
        let why: &str = match end {
            walk_end::DEPTH => "depth limit",
            walk_end::NO_UNWIND_INFO => "no unwind info and no frame pointer",
            walk_end::BAD_FRAME => "implausible frame",
            walk_end::VMA_BUSY => "address space busy",
            _ => "stack unreadable",
        };
        aya_log_ebpf::debug!(&(), "walk of pid {} stopped after {} frames: {}", tgid, n, why);
    }
    let hash = mix(hash ^ n);
    if hash == 0 { 1 } else { hash }
}

/// One frame: find the caller of `w.pc` and append its return address. Returns 1 to stop.
///
/// Iteration `index` has `index + 1` frames so far (each iteration adds one or stops). The
/// position comes from `index`, which the verifier sees as an unknown number, not from a count
/// kept in `w`: a count it can follow exactly would make each iteration a new state to verify.
extern "C" fn step<const FAULT: bool>(index: u64, _ctx: *mut core::ffi::c_void) -> i64 {
    let Some(w) = WALK_STATE.get_ptr_mut(0) else { return 1 };
    // SAFETY: this CPU's walk state, written by `walk` before the loop (see `WALK_STATE`).
    let w = unsafe { &mut *w };
    // (bpf_loop runs at most MAX_STACK_DEPTH - 1 iterations; `push` checks the buffer's bound
    // where it writes: a check here would let the compiler drop that one, which the verifier
    // needs.)
    // A return address points after its call: look its rule up at the call (pc − 1), which is
    // still inside the caller even when the call was the function's last instruction.
    let lookup = if index == 0 || w.exact != 0 { w.pc } else { w.pc - 1 };
    let row = unpack(leaktrace_unwind_rule(w.tgid as u64, lookup, w.generation, FAULT as u64));
    let (ret, cfa) = match row.kind {
        unwind::END => {
            w.end = walk_end::COMPLETE;
            return 1;
        }
        unwind::NO_VMA => {
            // The previous step's return address is not code (see `unwind::NO_VMA`).
            w.end = walk_end::BAD_FRAME;
            return 1;
        }
        unwind::CFA_RSP | unwind::CFA_RBP | unwind::PLT => {
            let base = if row.kind == unwind::CFA_RBP { w.fp } else { w.sp };
            // (Branch-free: the verifier follows fewer states.)
            w.fp_used |= w.fp_reg & (row.kind == unwind::CFA_RBP) as u64;
            let mut cfa = base + row.cfa_offset as u64 * 8;
            if row.kind == unwind::PLT && (w.pc & 15) >= row.rbp_offset as u8 as u64 {
                cfa += 8;
            }
            if cfa <= w.sp || cfa - w.sp > MAX_FRAME_BYTES {
                w.end = walk_end::BAD_FRAME;
                return 1;
            }
            if row.kind != unwind::PLT && row.rbp_offset == -2 {
                // The usual frame (push %rbp after the call): saved %rbp and return address
                // side by side, one read.
                let ret = word(w, cfa - 8);
                if ret == READ_FAILED {
                    w.end = walk_end::READ_FAULT;
                    return 1;
                }
                w.fp = word(w, cfa - 16);
                w.fp_reg = 0;
                return push(w, index, ret, cfa);
            }
            let ret = word(w, cfa - 8);
            if ret == READ_FAILED {
                w.end = walk_end::READ_FAULT;
                return 1;
            }
            if row.kind != unwind::PLT && row.rbp_offset != 0 {
                w.fp = word(w, cfa.wrapping_add((row.rbp_offset as i64 * 8) as u64));
                w.fp_reg = 0;
            }
            (ret, cfa)
        }
        unwind::SIGNAL => {
            // The kernel's signal frame: the interrupted registers in the ucontext at %rsp. The
            // interrupted stack may be another one (sigaltstack): no ordering check.
            // SAFETY: checked copies (bpf_probe_read_user).
            let at = |off: u64| unsafe { bpf_probe_read_user((w.sp + off) as *const u64) };
            let (Ok(ip), Ok(sp), Ok(fp)) = (at(unwind::SIGNAL_RIP), at(unwind::SIGNAL_RSP), at(unwind::SIGNAL_RBP))
            else {
                w.end = walk_end::READ_FAULT;
                return 1;
            };
            leaktrace_memo_spoil(w.owner);
            w.fp = fp;
            let r = push(w, index, ip, sp);
            w.exact = 1;
            return r;
        }
        unwind::CFA_DEREF_RBP => {
            leaktrace_memo_spoil(w.owner);
            let at = w.fp.wrapping_add((row.rbp_offset as i64 * 8) as u64);
            let (Ok(cfa), Ok(fp)) =
            // SAFETY: checked copies (bpf_probe_read_user).
                (unsafe { bpf_probe_read_user(at as *const u64) }, unsafe { bpf_probe_read_user(w.fp as *const u64) })
            else {
                w.end = walk_end::READ_FAULT;
                return 1;
            };
            if cfa <= w.sp || cfa - w.sp > MAX_FRAME_BYTES {
                w.end = walk_end::BAD_FRAME;
                return 1;
            }
            // SAFETY: a checked copy (bpf_probe_read_user).
            let Ok(ret) = (unsafe { bpf_probe_read_user((cfa - 8) as *const u64) }) else {
                w.end = walk_end::READ_FAULT;
                return 1;
            };
            w.fp = fp;
            (ret, cfa)
        }
        unwind::GO_SYSTEMSTACK => match go_systemstack_frame(w, &row) {
            Some(frame) => frame,
            None => return 1,
        },
        _ => {
            // No rule: the frame-pointer chain, when %rbp looks like a frame of this stack.
            let fp = w.fp;
            w.fp_used |= w.fp_reg;
            let busy = row.kind == unwind::BUSY;
            if fp == 0 && index > 0 && !busy {
                // The ABI's mark of the outermost frame (_start clears %rbp): hand-written entry
                // code without CFI (ld.so's _start, _dl_start_user) ends here. Not when the
                // mapping could not be looked at: code built without frame pointers uses %rbp
                // as it likes.
                w.end = walk_end::COMPLETE;
                return 1;
            }
            let why = if busy { walk_end::VMA_BUSY } else { walk_end::NO_UNWIND_INFO };
            if fp < w.sp || fp - w.sp > MAX_FRAME_BYTES || fp & 7 != 0 {
                w.end = why;
                return 1;
            }
            let ret = word(w, fp + 8);
            if ret == READ_FAILED {
                w.end = why;
                return 1;
            }
            count(counter::FP_FRAMES);
            w.fp = word(w, fp);
            w.fp_reg = 0;
            (ret, fp + 16)
        }
    };
    push(w, index, ret, cfa)
}

/// The caller of a cgo call's C code, which ran on the system stack: asmcgocall saved where the
/// goroutine's stack pointer was (see `unwind::GO_SYSTEMSTACK`). Another stack: no ordering
/// check. (return address, CFA), or `None` with `w.end` set.
#[inline(always)]
fn go_systemstack_frame(w: &mut Walk, row: &UnwindRow) -> Option<(u64, u64)> {
    leaktrace_memo_spoil(w.owner);
    // SAFETY: checked copies (bpf_probe_read_user).
    let at = |a: u64| unsafe { bpf_probe_read_user(a as *const u64) };
    let (Ok(g), Ok(depth)) = (at(w.sp + row.cfa_offset as u64 * 8), at(w.sp + (row.rbp_offset as u8 as u64) * 8))
    else {
        w.end = walk_end::READ_FAULT;
        return None;
    };
    let old_sp = if g == 0 {
        depth
    } else {
        match at(g + unwind::GO_G_STACK_HI) {
            Ok(hi) => hi.wrapping_sub(depth),
            Err(_) => {
                w.end = walk_end::READ_FAULT;
                return None;
            }
        }
    };
    if old_sp & 7 != 0 {
        w.end = walk_end::BAD_FRAME;
        return None;
    }
    let Ok(ret) = at(old_sp) else {
        w.end = walk_end::READ_FAULT;
        return None;
    };
    // %rbp is the Go caller's frame pointer (callee-saved through the C code).
    Some((ret, old_sp + 8))
}

/// What [`leaktrace_stack_word`] returns when the read failed. A word that holds this value
/// reads the same: as a return address or a CFA it is not one either (above the user address
/// space), and a saved %rbp is taken as it is (a frame pointer of this value fails the walk's
/// checks where one is followed).
pub(crate) const READ_FAILED: u64 = u64::MAX;

/// The 8 bytes of user memory at `addr`, for the walk `owner`, or [`READ_FAILED`]: from this
/// CPU's window of the stack when they are in it; else the window is filled from `addr` to the
/// end of its page (at most `WINDOW_BYTES`: the page holding `addr` is mapped if the word is, the
/// next one may not be, and a read that faults costs ~10 times one that does not) and the word
/// taken from it. Unaligned addresses are read on their own.
///
/// A global BPF function (exported to the linker by build.rs) for the same reason as
/// [`leaktrace_unwind_rule`]: inlined into every program and frame step, its branches multiplied
/// the verifier's states (40 s to load).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_stack_word(owner: u64, addr: u64) -> u64 {
    let Some(win) = STACK_WINDOW.get_ptr_mut(0) else {
        // SAFETY: a checked copy (bpf_probe_read_user).
        return unsafe { bpf_probe_read_user(addr as *const u64) }.unwrap_or(READ_FAILED);
    };
    if addr & 7 != 0 {
        // SAFETY: a checked copy (bpf_probe_read_user).
        return unsafe { bpf_probe_read_user(addr as *const u64) }.unwrap_or(READ_FAILED);
    }
    // SAFETY: `win` is this CPU's map value (get_ptr_mut checked the index); the fields another
    // walk on this CPU may change are read and written through volatile accesses, `owner` first
    // (see `StackWindow::owner`).
    unsafe {
        let off = addr.wrapping_sub(core::ptr::read_volatile(&raw const (*win).base));
        if core::ptr::read_volatile(&raw const (*win).owner) == owner
            && off < core::ptr::read_volatile(&raw const (*win).len)
            && off < WINDOW_BYTES
        {
            let v = (*win).words[(off / 8) as usize & (WINDOW_WORDS - 1)];
            if core::ptr::read_volatile(&raw const (*win).owner) == owner {
                return v;
            }
        }
        let mut len = 4096 - (addr & 4095);
        if len > WINDOW_BYTES {
            len = WINDOW_BYTES;
        }
        core::ptr::write_volatile(&raw mut (*win).owner, owner);
        core::ptr::write_volatile(&raw mut (*win).len, 0);
        let r = probe_read_user_raw((&raw mut (*win).words).cast(), len as u32, addr as *const core::ffi::c_void);
        if r != 0 {
            return bpf_probe_read_user(addr as *const u64).unwrap_or(READ_FAILED);
        }
        core::ptr::write_volatile(&raw mut (*win).base, addr);
        core::ptr::write_volatile(&raw mut (*win).len, len);
        let v = (*win).words[0];
        if core::ptr::read_volatile(&raw const (*win).owner) == owner {
            v
        } else {
            bpf_probe_read_user(addr as *const u64).unwrap_or(READ_FAILED)
        }
    }
}

/// The 8 bytes at `addr` when this CPU's stack window holds them for the walk `owner`, else
/// [`READ_FAILED`] (nothing is read: the caller goes on to [`leaktrace_stack_word`]). Inlined:
/// after a walk or a memo check the word at the entry's %rsp is there, and a global function's
/// call and return cost more than this test.
#[inline(always)]
pub(crate) fn window_word(owner: u64, addr: u64) -> u64 {
    let Some(win) = STACK_WINDOW.get_ptr(0) else { return READ_FAILED };
    // SAFETY: this CPU's map value (get_ptr checked the index), its shared fields read through
    // volatile loads, `owner` before and after the word, as in `leaktrace_stack_word`.
    unsafe {
        let off = addr.wrapping_sub(core::ptr::read_volatile(&raw const (*win).base));
        if addr & 7 != 0
            || core::ptr::read_volatile(&raw const (*win).owner) != owner
            || off >= core::ptr::read_volatile(&raw const (*win).len)
            || off >= WINDOW_BYTES
        {
            return READ_FAILED;
        }
        let v = (*win).words[(off / 8) as usize & (WINDOW_WORDS - 1)];
        if core::ptr::read_volatile(&raw const (*win).owner) != owner {
            return READ_FAILED;
        }
        v
    }
}

/// A word of the stack for the walk `w` ([`leaktrace_walk_word`]).
#[inline(always)]
fn word(w: &Walk, addr: u64) -> u64 {
    leaktrace_walk_word(w.owner, addr, w.base)
}

/// `MemoRecord::n` of a walk that cannot be remembered (it read more words than
/// [`MEMO_WORDS`], or memory the record does not hold, or ended early).
const MEMO_SPOILED: u64 = u64::MAX;

/// The words a walk read, as it reads them (this CPU's `MEMO_REC`), before they become a
/// thread's [`WalkMemo`].
#[repr(C)]
pub struct MemoRecord {
    /// The walk recording (its `StackFrames::generation`); a walk that preempts it on this CPU
    /// writes its own here first, and the first walk's record is then not saved.
    owner: u64,
    /// `UNWIND_GEN` when the walk began.
    unwind_gen: u64,
    /// 1 when the walk used its starting %rbp (see `Walk::fp_used`).
    fp_used: u64,
    /// Words recorded, or [`MEMO_SPOILED`].
    n: u64,
    /// Bytes from the walk's first %rsp to the end of the highest word read.
    span: u64,
    /// Offset of each word from the first %rsp (bytes, 8-aligned, below `WINDOW_BYTES`).
    off: [u64; MEMO_WORDS],
    /// The value each word had.
    val: [u64; MEMO_WORDS],
}

/// This CPU's record of the walk in progress (see [`MemoRecord`]).
#[map]
static MEMO_REC: PerCpuArray<MemoRecord> = PerCpuArray::with_max_entries(1, 0);

/// Start this CPU's record for the walk `owner` (see [`MemoRecord`]), with the walk's
/// `UNWIND_GEN`. A global BPF function (exported by build.rs), as the two below: the walk that
/// calls them does not branch on what they find. Returns 0 (a global function returns a
/// number).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_memo_open(owner: u64, unwind_gen: u64) -> u64 {
    if let Some(rec) = MEMO_REC.get_ptr_mut(0) {
        // SAFETY: this CPU's map value (get_ptr_mut checked the index); `owner` first, as in
        // `STACK_WINDOW`: a walk that preempts this one takes the record over.
        unsafe {
            core::ptr::write_volatile(&raw mut (*rec).owner, owner);
            (*rec).n = 0;
            (*rec).span = 0;
            (*rec).fp_used = 0;
            (*rec).unwind_gen = unwind_gen;
        }
    }
    0
}

/// The walk `owner` read memory the record does not hold (a signal frame, a DRAP or cgo frame):
/// it cannot be remembered.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_memo_spoil(owner: u64) -> u64 {
    if let Some(rec) = MEMO_REC.get_ptr_mut(0) {
        // SAFETY: as in `leaktrace_memo_open`; written only while the record is the walk's.
        unsafe {
            if core::ptr::read_volatile(&raw const (*rec).owner) == owner {
                (*rec).n = MEMO_SPOILED;
            }
        }
    }
    0
}

/// The walk `owner` ended (`end`, one of `walk_end`), having used its starting %rbp if
/// `fp_used` is 1: only a walk that reached the outermost frame is remembered.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_memo_close(owner: u64, fp_used: u64, end: u64) -> u64 {
    if let Some(rec) = MEMO_REC.get_ptr_mut(0) {
        // SAFETY: as in `leaktrace_memo_open`; written only while the record is the walk's.
        unsafe {
            if core::ptr::read_volatile(&raw const (*rec).owner) == owner {
                (*rec).fp_used = fp_used;
                if end != walk_end::COMPLETE as u64 {
                    (*rec).n = MEMO_SPOILED;
                }
            }
        }
    }
    0
}

/// Record one word a walk read (`leaktrace_walk_word`), or spoil the record.
#[inline(always)]
fn note_word(owner: u64, addr: u64, base: u64, v: u64) {
    let Some(rec) = MEMO_REC.get_ptr_mut(0) else { return };
    // SAFETY: this CPU's map value (get_ptr_mut checked the index); `owner` is read through a
    // volatile load (a walk that preempted this one may own the record now).
    unsafe {
        if core::ptr::read_volatile(&raw const (*rec).owner) != owner {
            return;
        }
        let n = (*rec).n;
        let off = addr.wrapping_sub(base);
        if n >= MEMO_WORDS as u64 || v == READ_FAILED || addr & 7 != 0 || off >= WINDOW_BYTES {
            (*rec).n = MEMO_SPOILED;
            return;
        }
        let i = n as usize & (MEMO_WORDS - 1);
        (*rec).off[i] = off;
        (*rec).val[i] = v;
        (*rec).n = n + 1;
        if off + 8 > (*rec).span {
            (*rec).span = off + 8;
        }
    }
}

/// [`leaktrace_stack_word`] for a walk that records what it reads when `base` (its first %rsp)
/// is not 0 (see [`MemoRecord`]). A global BPF function (exported by build.rs), as the other
/// one: verified once, not once per state of the frame loop.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_walk_word(owner: u64, addr: u64, base: u64) -> u64 {
    let v = leaktrace_stack_word(owner, addr);
    if base != 0 {
        note_word(owner, addr, base, v);
    }
    v
}

/// Remember the walk `owner` just made from (`ip`, `sp`, `fp`) in the current process, whose native
/// hash is `hash`, as the current thread's [`WalkMemo`], when its record is whole (the walk
/// reached the outermost frame, read at most [`MEMO_WORDS`] words, all through the stack
/// window, and no other walk on this CPU took the record over meanwhile). Returns 1 when it
/// was remembered. A global BPF function (exported by build.rs): verified once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_memo_save(owner: u64, ip: u64, sp: u64, fp: u64, hash: u64) -> u64 {
    let tgid = bpf_get_current_pid_tgid() >> 32;
    let Some(rec) = MEMO_REC.get_ptr(0) else { return 0 };
    let Some(memo) = thread_memo() else { return 0 };
    // SAFETY: this CPU's record (a per-CPU map value; `owner` read through volatile loads, as
    // another walk on this CPU may take it over) and this thread's memo in its task-storage slot
    // (only this thread's programs use it, and they do not nest: the kernel skips a program
    // that would interrupt another on its CPU, `bpf_prog_active`; the entry probe that called
    // this holds no reference to the memo).
    unsafe {
        let rec = &*rec;
        let memo = &mut *memo;
        memo.hash = 0;
        let n = rec.n;
        if core::ptr::read_volatile(&raw const rec.owner) != owner || n > MEMO_WORDS as u64 || n == 0 {
            return 0;
        }
        memo.off = rec.off;
        memo.val = rec.val;
        memo.n = n;
        memo.span = rec.span;
        memo.fp_used = rec.fp_used;
        memo.unwind_gen = rec.unwind_gen;
        if core::ptr::read_volatile(&raw const rec.owner) != owner {
            return 0;
        }
        memo.tgid = tgid;
        memo.ip = ip;
        memo.sp = sp;
        memo.fp = fp;
        memo.hash = hash;
    }
    1
}

/// The native hash of the thread's [`WalkMemo`] `memo` (its slot's, see `probes::ThreadSlot`)
/// when a walk from (`ip`, `sp`, `fp`) in the current process (`tgid`) would make the same walk:
/// same starting registers (%rbp only if the walk used it), same `UNWIND_GEN`, and every word it
/// read still holding the value it read. The words are read with one copy of the stack from
/// `sp` into the stack window, tagged `owner` (the walk that asks, which then finds its first
/// words there, and so does its caller's read). 0: no memo, another start, or a word changed
/// (the caller walks).
///
/// Inlined into the entry probe, which has the thread's slot at hand: a global function would
/// need a second task-storage lookup for it (a helper call, ~30 ns here).
#[inline(always)]
pub(crate) fn memo_check(memo: &WalkMemo, owner: u64, ip: u64, sp: u64, fp: u64, tgid: u64) -> u64 {
    let Some(win) = STACK_WINDOW.get_ptr_mut(0) else { return 0 };
    let unwind_gen = UNWIND_GEN.get(0).copied().unwrap_or(0);
    if memo.hash == 0
        || memo.ip != ip
        || memo.sp != sp
        || memo.tgid != tgid
        || (memo.fp_used != 0 && memo.fp != fp)
        || memo.unwind_gen != unwind_gen
    {
        return 0;
    }
    let span = memo.span;
    let n = memo.n;
    if span == 0 || span > WINDOW_BYTES || n > MEMO_WORDS as u64 {
        return 0;
    }
    // SAFETY: this CPU's stack window (its shared fields through volatile accesses, `owner`
    // first, as in `leaktrace_stack_word`); the copy is bounded by the window's size.
    unsafe {
        core::ptr::write_volatile(&raw mut (*win).owner, owner);
        core::ptr::write_volatile(&raw mut (*win).len, 0);
        let r = probe_read_user_raw((&raw mut (*win).words).cast(), span as u32, sp as *const core::ffi::c_void);
        if r != 0 {
            return 0;
        }
        core::ptr::write_volatile(&raw mut (*win).base, sp);
        core::ptr::write_volatile(&raw mut (*win).len, span);
        let mut i = 0;
        while i < MEMO_WORDS {
            if i as u64 >= n {
                break;
            }
            let at = (memo.off[i] / 8) as usize & (WINDOW_WORDS - 1);
            if (*win).words[at] != memo.val[i] {
                return 0;
            }
            i += 1;
        }
        if core::ptr::read_volatile(&raw const (*win).owner) != owner {
            return 0;
        }
    }
    memo.hash
}

/// Append the caller found by iteration `index` (its return address `ret`, the stack pointer
/// after the return `cfa`), or end the walk when `ret` cannot be one. Returns 1 to stop.
#[inline(always)]
fn push(w: &mut Walk, index: u64, ret: u64, cfa: u64) -> i64 {
    let n = index + 1;
    if ret == 0 {
        // A zero return address ends the chain (the outermost frame of some runtimes).
        w.end = walk_end::COMPLETE;
        return 1;
    }
    if !(0x1000..USER_SPACE_END).contains(&ret) {
        w.end = walk_end::BAD_FRAME;
        return 1;
    }
    let Some(buf) = walk_buffer() else {
        w.end = walk_end::READ_FAULT;
        return 1;
    };
    // Bounds-checked on the very value used as the index, which the verifier needs: read back
    // through a volatile load, so the compiler cannot turn the check into one on `index` and
    // compute the index again after it.
    let i = n as usize;
    // SAFETY: a volatile read of a local.
    let i = unsafe { core::ptr::read_volatile(&i) };
    // SAFETY: `buf` is the per-CPU walk buffer `walk_buffer` returned (a valid map value);
    // `get_mut` checks the bound.
    match unsafe { (*buf).ips.get_mut(i) } {
        Some(slot) => *slot = ret,
        None => {
            w.end = walk_end::DEPTH;
            return 1;
        }
    }
    w.hash = mix(w.hash ^ ret);
    w.n = n + 1;
    w.sp = cfa;
    w.pc = ret;
    w.exact = 0;
    0
}
