//! Interpreter (CPython) frames at an allocation: the allocating thread's own thread state, then
//! along its frame chain, the code object and instruction position of each frame. See
//! docs/kernel.md ("Python frames").
//!
//! The agent sets, per traced CPython process (`PY_TARGETS`), where the pointer to the GIL
//! holder's thread state is, where the pointer to the main interpreter is, and the structure
//! offsets of the running version. A thread state is the allocating thread's when its
//! `thread_id` (`pthread_self()`, the thread's TLS base on x86-64) is the current task's
//! `thread.fsbase` (offset from the kernel's BTF, `TASK_FSBASE`): no pid namespace is involved.
//! The GIL holder is tried first (one pointer path, the common case); when it is another thread
//! (the allocating thread released the GIL around a C call: ctypes, `Py_BEGIN_ALLOW_THREADS` in
//! zlib, sqlite3, I/O, ...; or another Python thread runs), the interpreter's list of thread
//! states is searched (at most `MAX_PY_THREADS` of them, one per `bpf_loop` iteration). A thread
//! that releases the GIL keeps its frame chain, so its frames are those of the Python code that
//! made the call. Without the fsbase offset, thread states are told apart by `native_thread_id`
//! (3.11+), compared with the tid as the host numbers it (right outside pid namespaces only);
//! 3.8–3.10 then have no field to compare and read the GIL holder's frames for whichever thread
//! allocates.

use aya_ebpf::helpers::generated::{self as raw, bpf_get_current_task, bpf_loop};
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use leaktrace_common::{MAX_PY_FRAMES, MAX_PY_THREADS, PyFrame, PyStack, PyTarget, py_offset};

/// Byte offset of `thread.fsbase` in `task_struct` (the x86-64 TLS base of the task, which is
/// the thread's `pthread_self()`), set by the agent from the kernel's BTF at load time. 0: not
/// known (thread states are then told apart by `native_thread_id`, see the module doc).
#[unsafe(no_mangle)]
static TASK_FSBASE: u32 = 0;

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

/// State of a frame walk between iterations (the `bpf_loop` context of both loops).
#[repr(C)]
struct Walk {
    target: PyTarget,
    /// The thread's innermost frame (found by the first loop), then the next frame to store
    /// (0: none).
    frame: u64,
    hash: u64,
    /// Frames stored.
    n: u64,
    /// The allocating thread's tid (host pid namespace).
    tid: u64,
    /// The allocating thread's key (its fsbase, or its tid) and the offset of the thread state's
    /// field that holds it (`thread_key`), set at the first loop's iteration 0.
    key: u64,
    key_off: u32,
    _pad: u32,
    /// While the thread states are searched: the next one to look at (0: the end of the list).
    cursor: u64,
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

/// Whether any traced process is a CPython interpreter (`PY_ANY`): without one, no allocation
/// needs [`leaktrace_py_walk`] (an array read, inlined by the verifier; the call it saves is not).
#[inline(always)]
pub(crate) fn any() -> bool {
    PY_ANY.get(0).copied().unwrap_or(0) != 0
}

/// Read the interpreter frames of process `tgid`'s thread `tid` (the current task) into this
/// CPU's buffer; returns the hash of the frames (never 0), or None when the process is not a traced
/// interpreter, the thread has no thread state among the first `MAX_PY_THREADS` of the list or
/// has no frame (the buffer's `len` is then 0).
///
/// Everything past the `PY_TARGETS` lookup runs in two `bpf_loop` callbacks: `find` (iteration 0
/// reads the fsbase and tries the GIL holder, the next ones search the thread states one by one)
/// and `step` (one frame per iteration). Their branches are verified with the callbacks, and do
/// not multiply the states of the program that walks the stack.
#[inline(always)]
fn walk(tgid: u32, tid: u32) -> Option<u64> {
    let buf = buffer()?;
    // SAFETY: this CPU's frame buffer (a per-CPU array value, valid while the program runs),
    // written through the pointer, no reference kept: `step` writes its frames meanwhile.
    unsafe { (*buf).len = 0 };
    if PY_ANY.get(0).copied().unwrap_or(0) == 0 {
        return None;
    }
    // SAFETY: a value the lookup returned, copied at once.
    let target = unsafe { *PY_TARGETS.get_ptr(tgid)? };
    let mut w = Walk {
        target,
        frame: 0,
        hash: 0x6a09_e667_f3bc_c908,
        n: 0,
        tid: tid as u64,
        key: 0,
        key_off: 0,
        _pad: 0,
        cursor: 0,
    };
    let find = find as extern "C" fn(u64, *mut Walk) -> i64;
    // SAFETY: `find` has bpf_loop's callback signature; `w` outlives the call.
    unsafe { bpf_loop(1 + MAX_PY_THREADS as u32, find as *mut core::ffi::c_void, (&raw mut w).cast(), 0) };
    let step = step as extern "C" fn(u64, *mut Walk) -> i64;
    // SAFETY: as above (`step`; with no frame found, its first iteration stops).
    unsafe { bpf_loop(MAX_PY_FRAMES as u32, step as *mut core::ffi::c_void, (&raw mut w).cast(), 0) };
    // SAFETY: as above: the buffer's `len`, written through the pointer.
    unsafe { (*buf).len = w.n as u32 };
    if w.n == 0 {
        None
    } else {
        // Never 0 (the stack walk takes 0 for "no Python frames").
        Some(crate::unwind_rule::mix(w.hash ^ w.n) | 1)
    }
}

/// [`walk`] as a global BPF function (exported to the linker by build.rs): the hash of the
/// current thread's Python frames, 0 when it has none. The verifier checks it once, on its own,
/// and the stack walk that calls it goes on from one state whatever it found (inlined, each of
/// its outcomes went through the native walk after it as another state).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_py_walk(tgid: u64, tid: u64) -> u64 {
    match walk(tgid as u32, tid as u32) {
        Some(h) => h,
        None => 0,
    }
}

/// The key of a stack: the native frames' hash `native`, mixed with the Python frames' hash
/// `py` when there are any (`py` not 0), never 0. A global BPF function (exported by build.rs):
/// the caller does not branch on `py`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn leaktrace_py_key(native: u64, py: u64) -> u64 {
    if py == 0 {
        return native;
    }
    match crate::unwind_rule::mix(native ^ py) {
        0 => 1,
        x => x,
    }
}

/// 8 bytes of the target's memory at `addr`; 0 when they cannot be read. Branch-free for the
/// verifier: the callbacks below reach the same states whatever a read finds, and a walk through
/// a NULL pointer (a read near address 0 fails) ends at 0 without a test at each step.
#[inline(always)]
fn read0(addr: u64) -> u64 {
    let mut v = 0u64;
    // SAFETY: a checked copy (bpf_probe_read_user) into a local; on failure the helper zeroes it.
    unsafe { raw::bpf_probe_read_user((&raw mut v).cast(), 8, addr as *const core::ffi::c_void) };
    v
}

/// The key of the allocating thread's thread state and where a thread state holds it: the
/// task's `thread.fsbase` and `thread_id` (`pthread_self()`), or, when the fsbase offset is not
/// known, the tid and `native_thread_id` (3.11+; [`py_offset::NONE`] before: no check).
#[inline(always)]
fn thread_key(w: &Walk) -> (u64, u32) {
    // SAFETY: a read of this object's own global; volatile, as the agent sets it at load time.
    let off = unsafe { core::ptr::read_volatile(&TASK_FSBASE) };
    if off == 0 {
        return (w.tid, w.target.offsets[py_offset::TSTATE_THREAD_ID]);
    }
    let mut fsbase = 0u64;
    // SAFETY: the current task (valid while the program runs), read by a checked copy
    // (bpf_probe_read_kernel) into a local.
    unsafe {
        raw::bpf_probe_read_kernel(
            (&raw mut fsbase).cast(),
            8,
            (bpf_get_current_task() + off as u64) as *const core::ffi::c_void,
        )
    };
    (fsbase, w.target.offsets[py_offset::TSTATE_PTHREAD_ID])
}

/// The innermost frame of thread state `tstate` (0: none).
#[inline(always)]
fn current_frame(w: &Walk, tstate: u64) -> u64 {
    let off = |i: usize| w.target.offsets[i] as u64;
    let holder = if w.target.offsets[py_offset::TSTATE_CFRAME] != py_offset::NONE {
        read0(tstate + off(py_offset::TSTATE_CFRAME))
    } else {
        tstate
    };
    read0(holder + off(py_offset::CURRENT_FRAME))
}

/// Iteration 0: the GIL holder (3.12+: the GIL's last holder) when it is the allocating thread
/// (or when threads cannot be told apart), else the start of the search of the main
/// interpreter's thread states.
#[inline(always)]
fn first(w: &mut Walk) -> i64 {
    let (key, key_off) = thread_key(w);
    w.key = key;
    w.key_off = key_off;
    let off = |i: usize| w.target.offsets[i];
    let mut tstate = read0(w.target.tstate_addr);
    for hop in [py_offset::TSTATE_PATH1, py_offset::TSTATE_PATH2] {
        if off(hop) != py_offset::NONE {
            tstate = read0(tstate + off(hop) as u64);
        }
    }
    if key_off == py_offset::NONE {
        w.frame = current_frame(w, tstate);
        return 1;
    }
    if tstate != 0 && read0(tstate + key_off as u64) == key {
        w.frame = current_frame(w, tstate);
        return 1;
    }
    if w.target.interp_addr == 0 {
        return 1;
    }
    let interp = read0(w.target.interp_addr);
    w.cursor = read0(interp + off(py_offset::INTERP_THREADS) as u64);
    (interp == 0 || w.cursor == 0) as i64
}

/// The first loop's iterations: 0 is `first`, each next one looks at one thread state of the
/// list: the allocating thread's (its innermost frame is the walk's start), or move to the next.
/// Returns 1 to stop.
extern "C" fn find(index: u64, w: *mut Walk) -> i64 {
    // SAFETY: bpf_loop passes the context given to it: `walk`'s `Walk` on its stack.
    let w = unsafe { &mut *w };
    if index == 0 {
        return first(w);
    }
    let tstate = w.cursor;
    if tstate == 0 {
        return 1;
    }
    if read0(tstate + w.key_off as u64) == w.key {
        w.frame = current_frame(w, tstate);
        return 1;
    }
    w.cursor = read0(tstate + w.target.offsets[py_offset::TSTATE_NEXT] as u64);
    (w.cursor == 0) as i64
}

/// The second loop's iterations: one frame each: store its code object and instruction
/// position, move to its caller. Returns 1 to stop.
extern "C" fn step(index: u64, w: *mut Walk) -> i64 {
    // SAFETY: bpf_loop passes the context given to it: `walk`'s `Walk` on its stack.
    let w = unsafe { &mut *w };
    if w.frame == 0 {
        return 1;
    }
    let off = |i: usize| w.target.offsets[i] as u64;
    let Some(code) = read_u64(w.frame + off(py_offset::FRAME_CODE)) else { return 1 };
    let Some(instr) = read_u64(w.frame + off(py_offset::FRAME_INSTR)) else { return 1 };
    let Some(buf) = buffer() else { return 1 };
    // Bounds-checked on the very value used as the index (see unwind.rs `push`).
    let i = index as usize;
    // SAFETY: a volatile read of a local.
    let i = unsafe { core::ptr::read_volatile(&i) };
    // SAFETY: `buf` is this CPU's frame buffer (`buffer`, a valid map value); `get_mut` checks
    // the bound.
    match unsafe { (*buf).frames.get_mut(i) } {
        Some(slot) => *slot = PyFrame { code, instr },
        None => return 1,
    }
    w.n = index + 1;
    w.hash = crate::unwind_rule::mix(crate::unwind_rule::mix(w.hash ^ code) ^ instr);
    w.frame = read_u64(w.frame + off(py_offset::FRAME_PREVIOUS)).unwrap_or(0);
    0
}
