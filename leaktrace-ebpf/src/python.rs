//! Interpreter (CPython) frames at an allocation: from the thread state holding the GIL along
//! the frame chain, code object and instruction position of each frame. See
//! docs/ARCHITECTURE.md ("Python frames").
//!
//! The agent sets, per traced CPython process (`PY_TARGETS`), where the pointer to the GIL
//! holder's thread state is and the structure offsets of the running version. The frames are
//! read only when that thread is the one allocating (its `native_thread_id` is the current tid):
//! a thread that allocates without the GIL gets a native-only stack.

use aya_ebpf::helpers::generated::bpf_loop;
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use leaktrace_common::{MAX_PY_FRAMES, PyFrame, PyStack, PyTarget, py_offset};

/// Traced CPython processes: tgid → where their frames are. Filled by the agent at attach.
#[map]
static PY_TARGETS: HashMap<u32, PyTarget> = HashMap::with_max_entries(1024, 0);

/// Interpreter frames of the stacks that have any, by the same key as `STACKS` (the hash of the
/// native frames and of these). Written once per distinct stack. Sized by the agent (as STACKS).
#[map]
pub(crate) static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(1 << 14, BPF_F_NO_PREALLOC);

/// The frame walk's buffer (one per CPU: a PyStack is too big for the BPF stack).
#[map]
static PY_WALK: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// State of a frame walk between frames (the `bpf_loop` context).
#[repr(C)]
struct Walk {
    frame: u64,
    hash: u64,
    n: u64,
    off_code: u64,
    off_instr: u64,
    off_prev: u64,
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// This CPU's frame buffer.
#[inline(always)]
pub(crate) fn buffer() -> Option<*mut PyStack> {
    PY_WALK.get_ptr_mut(0)
}

/// Read the interpreter frames of process `tgid`'s thread `tid` into this CPU's buffer; returns
/// the hash of the frames, or None when the process is not a traced interpreter, the thread does
/// not hold the GIL or has no frame (the buffer's `len` is then 0).
#[inline(always)]
pub(crate) fn walk(tgid: u32, tid: u32) -> Option<u64> {
    let buf = buffer()?;
    unsafe { (*buf).len = 0 };
    let t = unsafe { *PY_TARGETS.get_ptr(tgid)? };
    let off = |i: usize| t.offsets[i];
    let mut tstate = read_u64(t.tstate_addr)?;
    for hop in [py_offset::TSTATE_PATH1, py_offset::TSTATE_PATH2] {
        if tstate == 0 {
            return None;
        }
        if off(hop) != py_offset::NONE {
            tstate = read_u64(tstate + off(hop) as u64)?;
        }
    }
    if tstate == 0 {
        return None;
    }
    if off(py_offset::TSTATE_THREAD_ID) != py_offset::NONE {
        let owner = read_u64(tstate + off(py_offset::TSTATE_THREAD_ID) as u64)?;
        if owner != tid as u64 {
            return None;
        }
    }
    let holder = if off(py_offset::TSTATE_CFRAME) != py_offset::NONE {
        read_u64(tstate + off(py_offset::TSTATE_CFRAME) as u64)?
    } else {
        tstate
    };
    if holder == 0 {
        return None;
    }
    let frame = read_u64(holder + off(py_offset::CURRENT_FRAME) as u64)?;
    if frame == 0 {
        return None;
    }
    let mut w = Walk {
        frame,
        hash: 0x6a09_e667_f3bc_c908,
        n: 0,
        off_code: off(py_offset::FRAME_CODE) as u64,
        off_instr: off(py_offset::FRAME_INSTR) as u64,
        off_prev: off(py_offset::FRAME_PREVIOUS) as u64,
    };
    let callback = step as extern "C" fn(u64, *mut Walk) -> i64;
    // SAFETY: `step` has bpf_loop's callback signature; `w` outlives the call.
    unsafe { bpf_loop(MAX_PY_FRAMES as u32, callback as *mut core::ffi::c_void, (&raw mut w).cast(), 0) };
    unsafe { (*buf).len = w.n as u32 };
    if w.n == 0 { None } else { Some(crate::unwind::mix(w.hash ^ w.n)) }
}

/// One frame: store its code object and instruction position, move to its caller. Returns 1 to
/// stop.
extern "C" fn step(index: u64, w: *mut Walk) -> i64 {
    // SAFETY: bpf_loop passes the context given to it: `walk`'s `Walk` on its stack.
    let w = unsafe { &mut *w };
    if w.frame == 0 {
        return 1;
    }
    let Some(code) = read_u64(w.frame + w.off_code) else { return 1 };
    let Some(instr) = read_u64(w.frame + w.off_instr) else { return 1 };
    let Some(buf) = buffer() else { return 1 };
    // Bounds-checked on the very value used as the index (see unwind.rs `push`).
    let i = index as usize;
    let i = unsafe { core::ptr::read_volatile(&i) };
    match unsafe { (*buf).frames.get_mut(i) } {
        Some(slot) => *slot = PyFrame { code, instr },
        None => return 1,
    }
    w.n = index + 1;
    w.hash = crate::unwind::mix(crate::unwind::mix(w.hash ^ code) ^ instr);
    w.frame = read_u64(w.frame + w.off_prev).unwrap_or(0);
    0
}
