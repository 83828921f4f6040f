//! Maps and per-thread state that the probe programs (probes.rs) and the stack walk (unwind.rs)
//! share: the loss counters, the walk buffer, and each thread's slot (its call in flight and its
//! walk memo). A module of their own so that neither file depends on the other for them.

use aya_ebpf::helpers::generated::bpf_get_current_task_btf;
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::{btf_map, map},
    maps::PerCpuArray,
};
use leaktrace_common::{InFlight, StackFrames, counter};

/// Loss and event counters, indexed by `leaktrace_common::counter::*`.
#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::NUM, 0);

#[inline(always)]
pub(crate) fn count(idx: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(idx) {
        // SAFETY: this CPU's slot of a per-CPU array value (get_ptr_mut checked the index),
        // valid while the program runs; a program interrupting this one on the CPU can at worst
        // lose one count.
        unsafe { *p += 1 };
    }
}

/// The frame-pointer walk's buffer (one per CPU: a StackFrames is too big for the BPF stack).
#[map]
static WALK: PerCpuArray<StackFrames> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's walk buffer (see `WALK`).
#[inline(always)]
pub(crate) fn walk_buffer() -> Option<*mut StackFrames> {
    WALK.get_ptr_mut(0)
}

/// A BTF map definition of a task-local storage map (aya-ebpf 0.2 has none): one value per
/// thread, created on first use, freed by the kernel when the thread exits; a lookup is a few
/// loads from the task struct, no hashing.
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; aya_ebpf::bindings::bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: placeholder pointers the loader reads from BTF; never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        TaskStorage {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current thread's value; with `create`, a zeroed one is made if there is none. None
    /// when there is none, or when it cannot be made (no memory, or the storage is busy in a
    /// program this one interrupted).
    #[inline(always)]
    pub(crate) fn current(&self, create: bool) -> Option<*mut T> {
        let flags = if create { aya_ebpf::bindings::BPF_LOCAL_STORAGE_GET_F_CREATE as u64 } else { 0 };
        // SAFETY: the helper's arguments as it expects them: this map's definition (the loader
        // puts the map's fd in its place), the current task (a BTF pointer from the kernel), no
        // initial value. It returns null or this thread's value.
        let p = unsafe {
            aya_ebpf::helpers::generated::bpf_task_storage_get(
                core::ptr::from_ref(self).cast_mut().cast(),
                bpf_get_current_task_btf().cast(),
                core::ptr::null_mut(),
                flags,
            )
        };
        (!p.is_null()).then_some(p.cast())
    }
}

/// A thread's slot ([`INFLIGHT`]): its allocator call in flight and its last native walk at an
/// allocator entry, together so that an entry probe finds both with one lookup.
#[repr(C)]
pub struct ThreadSlot {
    /// The call between entry and return (`sp == 0`: none).
    pub(crate) call: InFlight,
    /// The thread's last walk (`unwind::memo_check`, `unwind::leaktrace_memo_save`).
    pub(crate) memo: WalkMemo,
    /// Its process's sampling mean (0: every call traced) as read from `TARGETS`, for
    /// `mode_tgid` under `MODE_GEN`'s `mode_gen`: an entry probe reads the process's mode from
    /// here (one array lookup), not from the `TARGETS` hash, until the agent changes a mode.
    pub(crate) mode: CachedMode,
}

/// A process's mode as cached in a thread's slot ([`ThreadSlot::mode`]).
#[repr(C)]
pub struct CachedMode {
    pub(crate) generation: u64,
    pub(crate) tgid: u64,
    pub(crate) sample_mean: u64,
}

/// Allocator calls between entry and return, one slot per thread (nested calls are folded into
/// the outermost one), beside the thread's walk memo. A thread's slot lives as long as the
/// thread (`sp == 0`: no call in flight), so a call costs two task-storage lookups (entry and
/// return) and no map insert or delete.
#[btf_map]
pub(crate) static INFLIGHT: TaskStorage<ThreadSlot> = TaskStorage::new();

/// The current thread's walk memo, in its [`INFLIGHT`] slot (made by the entry probe that walks).
#[inline(always)]
pub(crate) fn thread_memo() -> Option<*mut WalkMemo> {
    // SAFETY: a field address of this thread's task-storage value; no reference made.
    INFLIGHT.current(false).map(|p| unsafe { &raw mut (*p).memo })
}

/// Most stack words a [`WalkMemo`] holds: a walk that reads more is not remembered. Frames of
/// code with unwind tables take one or two words each (the return address, the saved %rbp), so
/// this is 16 to 32 frames.
pub(crate) const MEMO_WORDS: usize = 32;
/// A thread's last remembered native walk: where it started, and every stack word it read.
/// Another walk from the same registers that finds the same words would take the same steps
/// (a rule depends only on the pc, the pc and %rsp of each frame only on the words read and the
/// starting registers), so it ends with the same frames and the same hash.
#[repr(C)]
pub struct WalkMemo {
    /// The walk's native hash (see [`walk`]); 0: nothing remembered.
    pub(crate) hash: u64,
    pub(crate) tgid: u64,
    pub(crate) ip: u64,
    pub(crate) sp: u64,
    /// The starting %rbp, compared only when `fp_used` is 1 (code without frame pointers keeps
    /// data in %rbp, which changes from call to call without changing the stack).
    pub(crate) fp: u64,
    pub(crate) fp_used: u64,
    /// `UNWIND_GEN` of the walk: tables loaded since may give other rules.
    pub(crate) unwind_gen: u64,
    pub(crate) n: u64,
    pub(crate) span: u64,
    pub(crate) off: [u64; MEMO_WORDS],
    pub(crate) val: [u64; MEMO_WORDS],
}
