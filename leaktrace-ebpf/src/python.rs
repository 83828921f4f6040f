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
    maps::{Array, HashMap, PerCpuArray},
};
use leaktrace_common::{MAX_PY_FRAMES, PyFrame, PyStack, PyTarget, py_offset};

/// Traced CPython processes: tgid → where their frames are. Filled by the agent at attach.
#[map]
static PY_TARGETS: HashMap<u32, PyTarget> = HashMap::with_max_entries(1024, 0);

/// Whether any process is in `PY_TARGETS` (index 0: 1 if so, else 0), kept by the agent. A walk
/// in a process that is not an interpreter then skips the `PY_TARGETS` lookup (a hash of its tgid
/// on every allocation); this one is an array read, inlined by the verifier.
#[map]
static PY_ANY: Array<u64> = Array::with_max_entries(1, 0);

/// Interpreter frames of the stacks that have any, by the same key as `STACKS` (the hash of the
/// native frames and of these). Written once per distinct stack. Sized by the agent (as STACKS).
#[map]
pub(crate) static PY_STACKS: HashMap<u64, PyStack> = HashMap::with_max_entries(1 << 14, BPF_F_NO_PREALLOC);

/// How many stacks with Python frames may be stored (set by the agent at load time: --max-stacks;
/// `STACKS` has room for as many more). Past it, a stack whose Python frames were not stored
/// before is stored with its native frames only, so that Python code's many distinct stacks
/// (imports at startup, --pymalloc) cannot crowd the native ones out of `STACKS`.
#[unsafe(no_mangle)]
static PY_STACK_BUDGET: u64 = 0;

/// Stacks with Python frames stored so far (`PY_STACKS` inserts that succeeded).
#[map]
static PY_STACK_COUNT: Array<u64> = Array::with_max_entries(1, 0);

/// Whether the budget of stacks with Python frames is spent.
#[inline(always)]
pub(crate) fn over_budget() -> bool {
    // SAFETY: a read of this object's own global; volatile, as the agent sets it at load time.
    let budget = unsafe { core::ptr::read_volatile(&PY_STACK_BUDGET) };
    PY_STACK_COUNT.get(0).copied().unwrap_or(0) >= budget
}

/// Count a stack with Python frames stored.
#[inline(always)]
pub(crate) fn count_stored() {
    if let Some(p) = PY_STACK_COUNT.get_ptr_mut(0) {
        // SAFETY: the array's one value (get_ptr_mut checked the index), valid while the program
        // runs; added to atomically, as other CPUs add to it too.
        unsafe { core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, 1) };
    }
}

/// The frame walk's buffer (one per CPU: a PyStack is too big for the BPF stack).
#[map]
static PY_WALK: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// State of a frame walk between frames (the `bpf_loop` context).
#[repr(C)]
struct Walk {
    target: PyTarget,
    frame: u64,
    hash: u64,
    n: u64,
    tid: u64,
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: a checked copy (bpf_probe_read_user): a bad address is an error, not a fault.
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
///
/// Everything past the `PY_TARGETS` lookup runs in a `bpf_loop` callback (iteration 0 finds the
/// innermost frame, the others walk the chain): its branches are verified with the callback, and
/// do not multiply the states of the program that walks the stack.
#[inline(always)]
pub(crate) fn walk(tgid: u32, tid: u32) -> Option<u64> {
    let buf = buffer()?;
    // SAFETY: this CPU's frame buffer (a per-CPU array value, valid while the program runs),
    // written through the pointer, no reference kept: `step` writes its frames meanwhile.
    unsafe { (*buf).len = 0 };
    if PY_ANY.get(0).copied().unwrap_or(0) == 0 {
        return None;
    }
    // SAFETY: a value the lookup returned, copied at once.
    let target = unsafe { *PY_TARGETS.get_ptr(tgid)? };
    let mut w = Walk { target, frame: 0, hash: 0x6a09_e667_f3bc_c908, n: 0, tid: tid as u64 };
    let callback = step as extern "C" fn(u64, *mut Walk) -> i64;
    // SAFETY: `step` has bpf_loop's callback signature; `w` outlives the call.
    unsafe { bpf_loop(MAX_PY_FRAMES as u32 + 1, callback as *mut core::ffi::c_void, (&raw mut w).cast(), 0) };
    // SAFETY: as above: the buffer's `len`, written through the pointer.
    unsafe { (*buf).len = w.n as u32 };
    if w.n == 0 { None } else { Some(crate::unwind::mix(w.hash ^ w.n)) }
}

/// The innermost frame of the GIL holder, when it is the thread `w.tid`.
#[inline(always)]
fn innermost(w: &Walk) -> Option<u64> {
    let off = |i: usize| w.target.offsets[i];
    let mut tstate = read_u64(w.target.tstate_addr)?;
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
    if off(py_offset::TSTATE_THREAD_ID) != py_offset::NONE
        && read_u64(tstate + off(py_offset::TSTATE_THREAD_ID) as u64)? != w.tid
    {
        return None;
    }
    let holder = if off(py_offset::TSTATE_CFRAME) != py_offset::NONE {
        read_u64(tstate + off(py_offset::TSTATE_CFRAME) as u64)?
    } else {
        tstate
    };
    if holder == 0 {
        return None;
    }
    read_u64(holder + off(py_offset::CURRENT_FRAME) as u64)
}

/// One frame: store its code object and instruction position, move to its caller. Returns 1 to
/// stop.
extern "C" fn step(index: u64, w: *mut Walk) -> i64 {
    // SAFETY: bpf_loop passes the context given to it: `walk`'s `Walk` on its stack.
    let w = unsafe { &mut *w };
    if index == 0 {
        return match innermost(w) {
            Some(f) if f != 0 => {
                w.frame = f;
                0
            }
            _ => 1,
        };
    }
    if w.frame == 0 {
        return 1;
    }
    let off = |i: usize| w.target.offsets[i] as u64;
    let Some(code) = read_u64(w.frame + off(py_offset::FRAME_CODE)) else { return 1 };
    let Some(instr) = read_u64(w.frame + off(py_offset::FRAME_INSTR)) else { return 1 };
    let Some(buf) = buffer() else { return 1 };
    // Bounds-checked on the very value used as the index (see unwind.rs `push`).
    let i = (index - 1) as usize;
    // SAFETY: a volatile read of a local.
    let i = unsafe { core::ptr::read_volatile(&i) };
    // SAFETY: `buf` is this CPU's frame buffer (`buffer`, a valid map value); `get_mut` checks
    // the bound.
    match unsafe { (*buf).frames.get_mut(i) } {
        Some(slot) => *slot = PyFrame { code, instr },
        None => return 1,
    }
    w.n = index;
    w.hash = crate::unwind::mix(crate::unwind::mix(w.hash ^ code) ^ instr);
    w.frame = read_u64(w.frame + off(py_offset::FRAME_PREVIOUS)).unwrap_or(0);
    0
}
