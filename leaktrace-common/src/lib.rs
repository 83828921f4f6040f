//! Wire types shared by the leaktrace eBPF programs (`leaktrace-ebpf`) and the agent (`leaktrace`).
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of pointers so that the kernel side and the
//! user side agree on the byte layout of every map key and value. Nothing else is shared.
#![no_std]

/// What kind of allocation a call-stack site holds. Stored in [`SiteKey::kind`].
pub mod site_kind {
    /// malloc-family allocation (malloc, calloc, realloc, posix_memalign, ...).
    pub const MALLOC: u32 = 0;
    /// Anonymous mapping made outside the allocator (off-heap).
    pub const MMAP: u32 = 1;
    /// First-touch page faults (growth mode): each counts one page (4096 bytes) made resident.
    pub const FAULT: u32 = 2;
}

/// Sampled mode: entries of the fixed-point tables the agent fills in (`SAMPLING` map).
pub mod sampling {
    /// Entries of each table.
    pub const TABLE: u32 = 1024;
    /// Fixed-point scale of the tables (values are multiplied by 2^16).
    pub const SHIFT: u32 = 16;
    /// Index of the first entry of the exponential table: `-ln((i + 0.5) / TABLE)`, so that
    /// `mean * table[random] >> SHIFT` is an exponentially distributed byte distance.
    pub const EXP_BASE: u32 = 0;
    /// Index of the first entry of the weight table: `g(x) = x / (1 - exp(-x))` for
    /// `x = i * 8 / TABLE`, so that an allocation of `size` sampled with mean distance `mean`
    /// stands for `mean * g(size / mean)` bytes (unbiased, as in tcmalloc's heap profiler);
    /// for `x >= 8`, `g(x) = x` (the weight is the size).
    pub const WEIGHT_BASE: u32 = TABLE;
    /// Size of the `SAMPLING` array (the two tables; each process's mean distance is in its
    /// [`TargetMode`](super::TargetMode)).
    pub const LEN: u32 = 2 * TABLE;
}

/// How the kernel side traces one process: the value of its `TARGETS` entry, set by the agent
/// when it starts tracing the process and whenever it switches the process's mode (growth
/// mode's escalation to exact). One loaded object serves processes in every mode at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetMode {
    /// [`target_mode`]'s `EXACT`, `SAMPLED` or `GROWTH`.
    pub mode: u32,
    pub _pad: u32,
    /// Sampled mode: the mean distance between samples, bytes (> 0); 0 in the other modes.
    pub sample_mean: u64,
}

/// What a managed runtime's full collections left, as uprobes on its collector saw them (the
/// value of a process's `GC_FULL` entry, made by the agent and written by the kernel side):
/// V8's mark-compacts, each followed by the old generation's size of objects it left (the
/// `current_size` V8 gives its limit computation right after the collection).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcFull {
    /// Full collections ended (`MarkCompactCollector::Finish` entered) since the probes went in.
    pub ended: u64,
    /// Of those, the ones whose size was then read (written last, after `bytes` and `at_ns`).
    pub measured: u64,
    /// The old generation's size of objects after the last measured collection, bytes.
    pub bytes: u64,
    /// When it was read: the kernel's monotonic clock, ns.
    pub at_ns: u64,
    /// 1 between a collection's end and its size's reading.
    pub armed: u64,
}

/// [`TargetMode::mode`]'s values.
pub mod target_mode {
    /// Every allocator call of the process traced (its allocator probes attached).
    pub const EXACT: u32 = 0;
    /// About one allocated byte in `sample_mean` takes the stack walk and the map work.
    pub const SAMPLED: u32 = 1;
    /// No allocator probe: its first-touch page faults are counted by call stack.
    pub const GROWTH: u32 = 2;
}

/// Which allocator entry point an in-flight call is for. Stored in [`InFlight::op`].
pub mod op {
    pub const MALLOC: u32 = 1;
    pub const CALLOC: u32 = 2;
    pub const REALLOC: u32 = 3;
    pub const REALLOCARRAY: u32 = 4;
    pub const POSIX_MEMALIGN: u32 = 5;
    pub const ALIGNED_ALLOC: u32 = 6;
    pub const MEMALIGN: u32 = 7;
    pub const VALLOC: u32 = 8;
    pub const PVALLOC: u32 = 9;
    /// A wrapper that allocates through a hooked function (strdup → malloc): its size is taken
    /// from the nested call, its call stack from its own entry (where the frame-pointer walk is
    /// still intact; glibc's strdup reuses %rbp before it calls malloc).
    pub const WRAPPER: u32 = 10;
    /// Sampled mode: a call that was not sampled. It is still in flight (so the calls it makes
    /// are folded into it and its mappings are the allocator's), and its return records nothing.
    pub const UNSAMPLED: u32 = 11;
}

/// Indexes of the loss and event counters in the `COUNTERS` per-CPU array: the typed
/// [`counter::Counter`] and its table (names, losses) in counter.rs.
#[macro_use]
mod wire;
pub mod counter;

/// Key of the live-allocation map: one outstanding block of process `tgid` at address `addr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocKey {
    /// Thread-group id (the process id as the host kernel sees it).
    pub tgid: u32,
    pub _pad: u32,
    /// User-space address returned by the allocator.
    pub addr: u64,
}

/// Key of a call-stack site: the stack the allocation was made from.
///
/// `stack` is the hash of the walked frames and the key of the `STACKS` map (0: no stack was
/// stored, see [`counter::STACKS_FULL`]; the bytes stay with `caller`). `caller` is the return
/// address found at the stack pointer (at an entry probe: the direct caller, which a
/// frame-pointer walk from a function's first instruction skips); the agent puts it back as the
/// second frame unless the walk already has it there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SiteKey {
    pub tgid: u32,
    /// One of [`site_kind`].
    pub kind: u32,
    /// Key of the frames in `STACKS` (a 64-bit hash of them); 0 = no stack.
    pub stack: u64,
    pub caller: u64,
}

/// Value of the live-allocation map (16 bytes: at 10 M live blocks, each byte here is 10 MB of
/// kernel memory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocInfo {
    /// Requested size in bytes (what the caller asked for, not the allocator's chunk size).
    pub size: u64,
    /// The owning site's index in the kernel's `SITE_STATS` array: the value of `SITES` for its
    /// `SiteKey` (given once, never reused).
    pub index: u32,
    /// When the block was allocated: milliseconds of the kernel's monotonic clock since the agent
    /// loaded the programs (`TIME_BASE_NS`; wraps after 49 days), to the kernel's tick (1000 / HZ
    /// ms: read from jiffies, which the agent ties to the monotonic clock at load; from
    /// `bpf_ktime_get_ns` when it cannot). Summed per site in
    /// [`SiteStats::alloc_born_ms`] / [`SiteStats::free_born_ms`], which give the mean age of a
    /// site's live blocks.
    pub born_ms: u32,
}

/// Slots of a [`BlockBucket`].
pub const BUCKET_SLOTS: usize = 4;

/// One outstanding block in the kernel's fast block table (`BLOCKS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockSlot {
    /// The block's tag (`leaktrace-ebpf`'s `block_tag` of its tgid and address: a 64-bit hash,
    /// odd); 0: the slot is empty. Claimed and released with compare-and-swap.
    pub tag: u64,
    /// User-space address returned by the allocator.
    pub addr: u64,
    /// Size, site and birth, as in the `ALLOCS` map.
    pub info: AllocInfo,
}

/// A bucket of the kernel's fast block table `BLOCKS` (an array of buckets, 136 bytes each,
/// preallocated: `--max-allocs` / 16 buckets rounded up to a power of two, so that a quarter of
/// `--max-allocs` blocks fit before buckets fill). A block goes to the bucket its tag selects;
/// when all [`BUCKET_SLOTS`] are taken it goes to the `ALLOCS` hash map and the bucket is marked
/// `overflowed`. The process of a block is its site's (`SiteKey::tgid` of `info.index`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockBucket {
    /// Not 0 once a block of this bucket went to `ALLOCS` (never cleared): frees and inserts of
    /// the bucket's blocks then look there too.
    pub overflowed: u64,
    pub slots: [BlockSlot; BUCKET_SLOTS],
}

/// Per-site totals kept in the kernel. All four counters only grow; live bytes and live count are
/// `alloc_* - free_*`. Updated with atomic adds from any CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteStats {
    /// Bytes requested by allocations from this site since attach.
    pub alloc_bytes: u64,
    /// Number of allocations from this site since attach.
    pub alloc_count: u64,
    /// Bytes of this site's allocations that were freed since attach.
    pub free_bytes: u64,
    /// Number of this site's allocations that were freed since attach.
    pub free_count: u64,
    /// Sum of [`AllocInfo::born_ms`] over this site's allocations since attach (ms).
    pub alloc_born_ms: u64,
    /// Sum of [`AllocInfo::born_ms`] over this site's freed allocations (ms). The live blocks'
    /// birth times sum to `alloc_born_ms - free_born_ms`: at time `now_ms` their ages sum to
    /// `live_count * now_ms - (alloc_born_ms - free_born_ms)`. Zero for off-heap mappings.
    pub free_born_ms: u64,
}

impl SiteStats {
    /// Bytes allocated from this site and not yet freed.
    pub fn live_bytes(&self) -> u64 {
        self.alloc_bytes.saturating_sub(self.free_bytes)
    }
    /// Blocks allocated from this site and not yet freed.
    pub fn live_count(&self) -> u64 {
        self.alloc_count.saturating_sub(self.free_count)
    }
}

/// Arguments of an allocator call between its entry and return probes, one per thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InFlight {
    /// Stack pointer at entry (points at the return address). The matching return probe sees
    /// `sp + 8`; a hooked call made from inside this one sees a lower stack pointer.
    pub sp: u64,
    /// Requested size in bytes.
    pub size: u64,
    /// realloc: the old pointer; posix_memalign: the `memptr` out-parameter.
    pub ptr: u64,
    /// One of [`op`].
    pub op: u32,
    /// Hooked functions this call tail-jumped into (entered with the same stack pointer, e.g.
    /// reallocarray → realloc): their return probes fire first, at the same return, and are
    /// skipped.
    pub tail_calls: u32,
    /// Site of the call, taken at entry.
    pub site: SiteKey,
    /// Sampled mode: bytes the thread still allocates before its next sample (0: not drawn
    /// yet). Kept across calls (the slot lives as long as the thread), so sampling needs no
    /// second per-thread lookup.
    pub sample_left: i64,
}

/// Values of the kernel side's `EXEC_HOLD` map (tgid → these bits), set by the agent for the
/// processes of a launched tree (the command, and its children followed with --follow-forks):
/// an `execve` of such a process (or, with [`exec_hold::CHILDREN`], of a
/// child that is not traced yet) stops it until the agent has probed the new image.
pub mod exec_hold {
    /// Execs still to let through without a stop (the launch's own exec of the command).
    pub const PASS_MASK: u32 = 0xffff;
    /// The process's children are followed: hold their execs too (`map_event::CHILD_EXEC`).
    pub const CHILDREN: u32 = 1 << 16;
}

/// Kinds of [`MapEvent`]: the typed [`event::MapEventKind`] and its constants, and the
/// [`event::Event`] the agent decodes each event into (event.rs).
pub mod event;
pub use event::map_event;

/// Who made a mapping. Stored in [`MapEvent::owner`].
pub mod owner {
    /// Made outside any allocator call: off-heap memory of the program.
    pub const OFFHEAP: u32 = 0;
    /// Made from inside a malloc-family call: the allocator's own heap (arenas, large chunks).
    pub const ALLOCATOR: u32 = 1;
}

/// One successful mmap/munmap/mremap/brk of a traced process, sent through the `EVENTS` ring
/// buffer (address-range bookkeeping is done by the agent, which handles partial unmaps and
/// moves exactly).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MapEvent {
    /// One of [`map_event`].
    pub kind: u32,
    pub tgid: u32,
    /// Start of the new range (mmap, mremap), start of the removed range (munmap), or the new
    /// program break (brk).
    pub addr: u64,
    /// Length in bytes of the new (mmap, mremap) or removed (munmap) range.
    pub len: u64,
    /// mremap: the old range.
    pub old_addr: u64,
    pub old_len: u64,
    /// mmap protection and flags.
    pub prot: u32,
    pub flags: u32,
    /// One of [`owner`].
    pub owner: u32,
    pub _pad: u32,
    /// The call stack of an mmap (kind [`site_kind::MMAP`]); zero for the other kinds.
    pub site: SiteKey,
}

/// State of one thread between sys_enter and sys_exit of a tracked syscall.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallArgs {
    pub nr: u32,
    pub owner: u32,
    pub a0: u64,
    pub a1: u64,
    pub a2: u64,
    pub a3: u64,
    pub site: SiteKey,
}

/// A libc mmap() call in flight on a thread (uprobe at entry), so the syscall tracepoint can use
/// its call stack (with the direct caller restored) and owner.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MmapCall {
    /// Stack pointer at entry of mmap().
    pub sp: u64,
    pub owner: u32,
    pub _pad: u32,
    pub site: SiteKey,
}

/// Deepest user call stack kept, in frames (the kernel's default `perf_event_max_stack`).
pub const MAX_STACK_DEPTH: usize = 127;

/// A user call stack as the eBPF walk found it: value of the `STACKS` map.
///
/// `ips[0]` is the instruction pointer where the probe fired; `ips[1..len]` are the return
/// addresses of the callers (innermost first), found frame by frame with the objects' unwind
/// tables (see [`unwind`]) or, in code without a table, by the frame-pointer chain.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackFrames {
    /// Bumped by each walk that uses the per-CPU buffer; a walk that finds it changed before its
    /// copy is stored was interrupted by another, and stores nothing.
    pub generation: u64,
    /// Number of valid entries of `ips`.
    pub len: u32,
    /// Why the walk ended: one of [`walk_end`].
    pub end: u32,
    pub ips: [u64; MAX_STACK_DEPTH],
}

/// Most interpreter (Python) frames read per stack, innermost first; deeper ones are left out.
pub const MAX_PY_FRAMES: usize = 32;

/// Most thread states of an interpreter's list looked at to find the allocating thread's own
/// (when it does not hold the GIL); a thread further down the list gets a native-only stack.
pub const MAX_PY_THREADS: usize = 64;

/// One interpreter frame as the kernel reads it at an allocation: the code object's address and
/// the frame's instruction position, both raw from the target's memory (for CPython 3.11+ the
/// `prev_instr` pointer, for 3.10 and older the `f_lasti` index in its low 32 bits). The agent
/// reads the code object's names and line table from the target (/proc/PID/mem).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PyFrame {
    pub code: u64,
    pub instr: u64,
}

/// The interpreter frames of one stack (`PY_STACKS`, keyed like `STACKS` by the stack's hash,
/// which covers these frames too): `len` valid entries of `frames`, innermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    pub len: u32,
    pub _pad: u32,
    pub frames: [PyFrame; MAX_PY_FRAMES],
}

/// Where a traced CPython process keeps its frames (`PY_TARGETS`, by tgid), set by the agent at
/// attach: the address of the pointer to the thread state holding the GIL, the address of the
/// pointer to the main interpreter (whose list of thread states is searched for the allocating
/// thread's own when that thread does not hold the GIL), and the structure offsets of the running
/// version ([`py_offset`], bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PyTarget {
    /// Address in the target of the `PyThreadState *` of the thread holding the GIL (3.11:
    /// `&_PyRuntime.gilstate.tstate_current`), or of the first pointer of the path to it
    /// ([`py_offset::TSTATE_PATH1`]).
    pub tstate_addr: u64,
    /// Address in the target of the `PyInterpreterState *` of the main interpreter
    /// (`&_PyRuntime.interpreters.main`; 3.13: `.head`, from `_Py_DebugOffsets`); 0: the thread
    /// states are not searched (only the GIL holder's frames are read).
    pub interp_addr: u64,
    /// Field offsets in bytes, indexed by [`py_offset`].
    pub offsets: [u32; py_offset::NUM],
    /// 0 (the structure has no implicit padding).
    pub _pad: u32,
}

/// Indexes of [`PyTarget::offsets`]: the fields the kernel follows from the thread state to the
/// innermost frame and along the frame chain.
pub mod py_offset {
    /// `PyThreadState` → the pointer followed to reach the current frame's holder (3.11:
    /// `cframe`); [`NONE`] when the thread state holds the frame pointer itself (3.10: `frame`
    /// is read at [`CURRENT_FRAME`] of the thread state).
    pub const TSTATE_CFRAME: usize = 0;
    /// Offset of the current frame pointer in the holder (3.11: `_PyCFrame.current_frame`).
    pub const CURRENT_FRAME: usize = 1;
    /// `PyThreadState.native_thread_id` (the thread's Linux tid, as the target's pid namespace
    /// numbers it; 3.11+). Compared with the allocating thread's tid only when
    /// [`TSTATE_PTHREAD_ID`] cannot be used (the kernel's BTF gave no `thread_struct.fsbase`);
    /// [`NONE`] skips the check.
    pub const TSTATE_THREAD_ID: usize = 2;
    /// Frame → its code object (3.11: `_PyInterpreterFrame.f_code`).
    pub const FRAME_CODE: usize = 3;
    /// Frame → its instruction position (3.11: `prev_instr`).
    pub const FRAME_INSTR: usize = 4;
    /// Frame → the calling frame (3.11: `previous`).
    pub const FRAME_PREVIOUS: usize = 5;
    /// When not [`NONE`]: the pointer read at [`super::PyTarget::tstate_addr`] is not the thread
    /// state yet, but the structure whose field at this offset is followed (3.12: `_PyRuntime
    /// .interpreters.main` → `PyInterpreterState.ceval.gil`).
    pub const TSTATE_PATH1: usize = 6;
    /// When not [`NONE`]: one more pointer followed after [`TSTATE_PATH1`] (3.12:
    /// `_gil_runtime_state.last_holder`, the thread state that took the GIL last).
    pub const TSTATE_PATH2: usize = 7;
    /// `PyInterpreterState` → the first thread state of its list (3.8–3.10: `tstate_head`,
    /// 3.11+: `threads.head`).
    pub const INTERP_THREADS: usize = 8;
    /// `PyThreadState.next`: the next thread state of the interpreter's list (NULL at the end).
    pub const TSTATE_NEXT: usize = 9;
    /// `PyThreadState.thread_id`: the thread's `pthread_self()`, which on x86-64 (glibc and musl)
    /// is its TLS base, the `fsbase` the kernel keeps for the task: the allocating thread's own
    /// thread state is the one whose value is the current task's fsbase (no pid namespace in
    /// the way). All versions.
    pub const TSTATE_PTHREAD_ID: usize = 10;
    /// Number of offsets.
    pub const NUM: usize = 11;
    /// An offset that is not used.
    pub const NONE: u32 = u32::MAX;
}

/// Why a stack walk ended. Stored in [`StackFrames::end`]; every value but
/// [`walk_end::COMPLETE`] means the stack is truncated (its outer callers are unknown).
pub mod walk_end {
    /// The outermost frame was reached (its return address is undefined in the unwind table,
    /// e.g. `_start` or a thread's start routine, or is 0, or the frame-pointer chain ended at 0).
    pub const COMPLETE: u32 = 0;
    /// [`super::MAX_STACK_DEPTH`] frames were walked.
    pub const DEPTH: u32 = 1;
    /// The last frame's code has no unwind table row (no table for its object, JIT or anonymous
    /// code, an unsupported CFA expression) and its frame pointer does not continue the chain.
    pub const NO_UNWIND_INFO: u32 = 2;
    /// The unwind rule gave an impossible frame (a CFA not above the stack pointer, a return
    /// address outside user space).
    pub const BAD_FRAME: u32 = 3;
    /// The stack memory at the computed CFA could not be read.
    pub const READ_FAULT: u32 = 4;
    /// The next frame's mapping could not be looked up: `bpf_find_vma` found the address space
    /// busy (its lock taken for writing, as uprobe registration by any tracer does for every
    /// process mapping the library; or, in the page-fault tracepoint where interrupts are off,
    /// the CPU's one deferred unlock still pending), and no rule for that pc was cached on the
    /// CPU. Both walks keep the mappings they looked up in a per-CPU cache, so this ends only
    /// walks that reach a mapping not seen before on that CPU.
    pub const VMA_BUSY: u32 = 5;
}

/// Unwind tables for the kernel-side walk, built by the agent from the objects' `.eh_frame` /
/// `.debug_frame` (x86-64 only).
///
/// One table per ELF object (not per process): the rows of every object are stored in one array
/// (`UNWIND_ROWS`), and `UNWIND_OBJECTS` maps an object's identity (device and inode of the
/// mapped file, as the kernel's VMA has them) to its slice of rows. The eBPF walk finds the VMA
/// of a program counter with `bpf_find_vma`, turns the address into the object's virtual address
/// (`pc - vm_start + vm_pgoff * 4096 + vaddr_minus_offset`), binary-searches the slice for the
/// last row at or below it, and applies the rule.
pub mod unwind {
    /// Code with no rule (a gap between functions, the end of a function's range, or a CFA
    /// expression the walk does not evaluate): the walk tries the frame-pointer chain.
    pub const NO_RULE: u8 = 0;
    /// CFA = %rsp + cfa_offset.
    pub const CFA_RSP: u8 = 1;
    /// CFA = %rbp + cfa_offset.
    pub const CFA_RBP: u8 = 2;
    /// PLT entry (the expression compilers emit for .plt): CFA = %rsp + cfa_offset, plus 8 when
    /// `(pc & 15) >= rbp_offset as u8` (rbp_offset holds the threshold, 10 or 11).
    pub const PLT: u8 = 3;
    /// The outermost frame: the return address is undefined (`_start`, thread start).
    pub const END: u8 = 4;
    /// Stack realigned through a DRAP register (gcc): CFA = *(%rbp + 8 × rbp_offset), and the
    /// caller's %rbp is saved at [%rbp].
    pub const CFA_DEREF_RBP: u8 = 5;
    /// A signal trampoline (glibc's `__restore_rt`): %rsp points at the kernel's `ucontext_t`;
    /// the interrupted %rip, %rsp and %rbp are read from its saved registers
    /// ([`SIGNAL_RIP`], [`SIGNAL_RSP`], [`SIGNAL_RBP`] bytes above %rsp), and the next frame is
    /// looked up at the interrupted %rip itself (it is not a return address).
    pub const SIGNAL: u8 = 6;
    /// Kernel side only, never in a table: the pc's mapping could not be looked up now
    /// (`bpf_find_vma` busy): not cached; the walk tries the frame-pointer chain, and ends with
    /// `walk_end::VMA_BUSY` when it does not continue.
    pub const BUSY: u8 = 9;
    /// Kernel side only, never in a table: no mapping at all holds the pc (a garbage return
    /// address from following a frame pointer through code that has none): the walk ends there.
    pub const NO_VMA: u8 = 7;
    /// Go's `runtime.asmcgocall` at its call of a C function (cgo): the C code ran on the
    /// thread's system stack, and the goroutine's stack pointer is found from what asmcgocall
    /// saved at the system stack pointer (the CFA of the C frame): `g` at %rsp + 8 × cfa_offset
    /// and the depth below `g.stack.hi` at %rsp + 8 × rbp_offset (`g.stack.hi` is `g`'s second
    /// word; when `g` is 0 the call was made on a system stack already and the depth slot holds
    /// the old stack pointer itself). The return address into the Go caller is at that stack
    /// pointer; %rbp is the Go caller's frame pointer, preserved through the C code.
    pub const GO_SYSTEMSTACK: u8 = 8;
    /// Offset of `stack.hi` in Go's `g` (the goroutine's stack bounds are its first field).
    pub const GO_G_STACK_HI: u64 = 8;
    /// Offset of the saved %rip in x86-64's `ucontext_t` (uc_mcontext.gregs[REG_RIP]: 40 + 16 × 8).
    pub const SIGNAL_RIP: u64 = 168;
    /// Offset of the saved %rsp (gregs[REG_RSP]).
    pub const SIGNAL_RSP: u64 = 160;
    /// Offset of the saved %rbp (gregs[REG_RBP]).
    pub const SIGNAL_RBP: u64 = 120;
    /// Largest `cfa_offset` a row can hold, in bytes (u16 in 8-byte units).
    pub const MAX_CFA_OFFSET: u64 = (u16::MAX as u64) * 8;
}

/// One row of an unwind table: from `pc` (the object's virtual address) up to the next row's
/// `pc`, how to find the caller's frame. x86-64: the return address is at CFA − 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// First virtual address (in the ELF object's address space) the row covers.
    pub pc: u32,
    /// CFA offset in 8-byte units (from %rsp or %rbp, see [`unwind`]).
    pub cfa_offset: u16,
    /// Where the caller's %rbp is saved, as CFA + 8 × rbp_offset; 0: %rbp is not saved (the
    /// caller's value is still in the register). For [`unwind::PLT`]: the threshold.
    pub rbp_offset: i8,
    /// One of [`unwind`]'s kinds.
    pub kind: u8,
}

/// Identity of a mapped file as the kernel sees it: key of `UNWIND_OBJECTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ObjectId {
    /// The superblock's device number (`s_dev`: major << 20 | minor, as /proc/PID/maps prints
    /// it split in two).
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
}

/// Where an object's unwind table is: value of `UNWIND_OBJECTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectTable {
    /// Index of the object's first row in `UNWIND_ROWS`.
    pub first_row: u32,
    /// Number of rows (sorted by `pc`).
    pub rows: u32,
    /// ELF virtual address minus file offset of the executable segment: the object's virtual
    /// address of a file offset `o` is `o + vaddr_minus_offset`.
    pub vaddr_minus_offset: i64,
}

/// Fields the kernel side reads from tracepoint records: indexes into the eBPF object's
/// `TP_OFFSETS` global, which the agent sets at load from the tracepoints' own format files
/// (tracefs `events/GROUP/EVENT/format`, leaktrace/src/tracepoints.rs): a record's layout is the
/// kernel's to change (`sched_process_fork` had fixed-size names before 6.x, so `child_pid` moved).
/// [`FIELDS`](tp_field::FIELDS) names each one and gives the offset this project's kernel (6.18)
/// has, used when tracefs cannot be read.
pub mod tp_field {
    /// `syscalls:sys_enter_mmap` `len`.
    pub const MMAP_LEN: usize = 0;
    /// `syscalls:sys_enter_mmap` `prot`.
    pub const MMAP_PROT: usize = 1;
    /// `syscalls:sys_enter_mmap` `flags`.
    pub const MMAP_FLAGS: usize = 2;
    /// `syscalls:sys_enter_munmap` `addr`.
    pub const MUNMAP_ADDR: usize = 3;
    /// `syscalls:sys_enter_munmap` `len`.
    pub const MUNMAP_LEN: usize = 4;
    /// `syscalls:sys_enter_mremap` `addr`.
    pub const MREMAP_ADDR: usize = 5;
    /// `syscalls:sys_enter_mremap` `old_len`.
    pub const MREMAP_OLD_LEN: usize = 6;
    /// `syscalls:sys_enter_mremap` `new_len`.
    pub const MREMAP_NEW_LEN: usize = 7;
    /// `syscalls:sys_enter_mremap` `flags`.
    pub const MREMAP_FLAGS: usize = 8;
    /// `syscalls:sys_enter_brk` `brk`.
    pub const BRK_BRK: usize = 9;
    /// `ret` of the `syscalls:sys_exit_*` events traced (mmap, munmap, mremap, brk: one offset,
    /// checked for each).
    pub const SYS_EXIT_RET: usize = 10;
    /// `sched:sched_process_fork` `child_pid` (4 bytes).
    pub const FORK_CHILD_PID: usize = 11;
    /// `exceptions:page_fault_user` `error_code`.
    pub const FAULT_ERROR_CODE: usize = 12;
    /// `oom:mark_victim` `pid` (4 bytes): the task the OOM killer chose.
    pub const OOM_VICTIM_PID: usize = 13;
    /// `oom:mark_victim` `anon_rss` (8 bytes, KiB).
    pub const OOM_VICTIM_ANON_RSS: usize = 14;
    /// Number of fields.
    pub const NUM: usize = 15;

    /// Events leaktrace can do without: when their format file is missing, their fields keep
    /// the defaults and their program is not attached (the agent says what is lost).
    pub const OPTIONAL_EVENTS: [&str; 1] = ["oom/mark_victim"];

    /// (index, `GROUP/EVENT`, field name, size in bytes, offset in 6.18's format files).
    pub const FIELDS: [(usize, &str, &str, u32, u32); 18] = [
        (MMAP_LEN, "syscalls/sys_enter_mmap", "len", 8, 24),
        (MMAP_PROT, "syscalls/sys_enter_mmap", "prot", 8, 32),
        (MMAP_FLAGS, "syscalls/sys_enter_mmap", "flags", 8, 40),
        (MUNMAP_ADDR, "syscalls/sys_enter_munmap", "addr", 8, 16),
        (MUNMAP_LEN, "syscalls/sys_enter_munmap", "len", 8, 24),
        (MREMAP_ADDR, "syscalls/sys_enter_mremap", "addr", 8, 16),
        (MREMAP_OLD_LEN, "syscalls/sys_enter_mremap", "old_len", 8, 24),
        (MREMAP_NEW_LEN, "syscalls/sys_enter_mremap", "new_len", 8, 32),
        (MREMAP_FLAGS, "syscalls/sys_enter_mremap", "flags", 8, 40),
        (BRK_BRK, "syscalls/sys_enter_brk", "brk", 8, 16),
        (SYS_EXIT_RET, "syscalls/sys_exit_mmap", "ret", 8, 16),
        (SYS_EXIT_RET, "syscalls/sys_exit_munmap", "ret", 8, 16),
        (SYS_EXIT_RET, "syscalls/sys_exit_mremap", "ret", 8, 16),
        (SYS_EXIT_RET, "syscalls/sys_exit_brk", "ret", 8, 16),
        (FORK_CHILD_PID, "sched/sched_process_fork", "child_pid", 4, 20),
        (FAULT_ERROR_CODE, "exceptions/page_fault_user", "error_code", 8, 24),
        (OOM_VICTIM_PID, "oom/mark_victim", "pid", 4, 8),
        (OOM_VICTIM_ANON_RSS, "oom/mark_victim", "anon_rss", 8, 24),
    ];

    /// The offsets of [`FIELDS`] in index order (the first entry of each index).
    pub const fn defaults() -> [u32; NUM] {
        let mut out = [0u32; NUM];
        let mut i = FIELDS.len();
        while i > 0 {
            i -= 1;
            out[FIELDS[i].0] = FIELDS[i].4;
        }
        out
    }
}

/// The eBPF programs of `leaktrace-ebpf` (its `#[uprobe]`, `#[uretprobe]` and `#[tracepoint]`
/// functions; a program's name in the object is its function's name) and what each reads: the
/// loader loads and attaches them from this table, probe placement reads [`Program::args`], and
/// a test of the agent checks the table against the built object.
pub mod program {
    /// How a program is attached.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        /// A uprobe at a function's entry (or past its first instructions: the agent's probe
        /// placement).
        Entry,
        /// A return probe (uretprobe) of an allocating function: reads the return value.
        Return,
        /// The tracepoint `group:NAME`, NAME being the program's name; reads its record's fields
        /// ([`crate::tp_field`]).
        Tracepoint {
            /// Tracepoint group (`syscalls`, `sched`, `exceptions`, `oom`).
            group: &'static str,
        },
    }

    /// One eBPF program.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Program {
        /// Its name in the object (the function's name in `leaktrace-ebpf`).
        pub name: &'static str,
        pub kind: Kind,
        /// Entry programs: the integer argument registers it reads, in the C ABI's order (%rdi,
        /// %rsi, %rdx, %rcx, %r8, %r9 on x86-64), by the argument's name; a name starting with
        /// `_` is a register it skips. Probe placement must not move a probe past an instruction
        /// that changes one of the first `args.len()`. Empty for the others.
        pub args: &'static [&'static str],
        /// Loaded and attached in growth mode only.
        pub growth_only: bool,
    }

    impl Program {
        /// How many argument registers it reads, counted from the first (see [`Program::args`]).
        pub const fn args_read(&self) -> usize {
            self.args.len()
        }

        /// A uprobe program (entry or return), as opposed to a tracepoint.
        pub const fn is_uprobe(&self) -> bool {
            matches!(self.kind, Kind::Entry | Kind::Return)
        }
    }

    const fn entry(name: &'static str, args: &'static [&'static str]) -> Program {
        Program { name, kind: Kind::Entry, args, growth_only: false }
    }

    const fn tracepoint(group: &'static str, name: &'static str) -> Program {
        Program { name, kind: Kind::Tracepoint { group }, args: &[], growth_only: false }
    }

    /// `malloc(size)` and every allocator call of that shape (operator new, `mallocx`,
    /// `__rust_alloc`, `PyObject_Malloc`, …).
    pub const MALLOC_ENTER: Program = entry("malloc_enter", &["size"]);
    /// `calloc(nmemb, size)`.
    pub const CALLOC_ENTER: Program = entry("calloc_enter", &["nmemb", "size"]);
    /// `realloc(ptr, size)`.
    pub const REALLOC_ENTER: Program = entry("realloc_enter", &["ptr", "size"]);
    /// `reallocarray(ptr, nmemb, size)`.
    pub const REALLOCARRAY_ENTER: Program = entry("reallocarray_enter", &["ptr", "nmemb", "size"]);
    /// `posix_memalign(memptr, alignment, size)`: the block's address is read at `memptr` on
    /// return.
    pub const POSIX_MEMALIGN_ENTER: Program = entry("posix_memalign_enter", &["memptr", "_alignment", "size"]);
    /// `aligned_alloc(alignment, size)`.
    pub const ALIGNED_ALLOC_ENTER: Program = entry("aligned_alloc_enter", &["_alignment", "size"]);
    /// `memalign(alignment, size)`.
    pub const MEMALIGN_ENTER: Program = entry("memalign_enter", &["_alignment", "size"]);
    /// `valloc(size)`.
    pub const VALLOC_ENTER: Program = entry("valloc_enter", &["size"]);
    /// `pvalloc(size)`.
    pub const PVALLOC_ENTER: Program = entry("pvalloc_enter", &["size"]);
    /// `free(ptr)` and every release of that shape (operator delete, `sdallocx`, …).
    pub const FREE_ENTER: Program = entry("free_enter", &["ptr"]);
    /// An allocating wrapper (`strdup`): no argument, the size comes from the call it makes.
    pub const WRAPPER_ENTER: Program = entry("wrapper_enter", &[]);
    /// `__rust_realloc(ptr, old_size, align, new_size)`.
    pub const RUST_REALLOC_ENTER: Program = entry("rust_realloc_enter", &["ptr", "_old_size", "_align", "new_size"]);
    /// libc's `mmap(addr, length, prot, flags, …)`: the caller's stack for an anonymous or shared
    /// mapping.
    pub const MMAP_ENTER: Program = entry("mmap_enter", &["_addr", "_length", "_prot", "flags"]);
    /// The `--work-probe` function: one unit of work per call.
    pub const WORK_ENTER: Program = entry("work_enter", &[]);
    /// libc's `exit` or CPython's `Py_FinalizeEx` in a launched command: its teardown begins.
    pub const TEARDOWN_ENTER: Program = entry("teardown_enter", &[]);
    /// V8's `MarkCompactCollector::Finish()`: a full collection ended (its size is read next).
    pub const GC_FULL_ENTER: Program = entry("gc_full_enter", &[]);
    /// V8's `MemoryController<V8HeapTrait>::CalculateAllocationLimit(heap, current_size, …)`,
    /// called after every full collection with the old generation's size of objects.
    pub const GC_LIMIT_ENTER: Program = entry("gc_limit_enter", &["_heap", "current_size"]);
    /// The return of every allocating function: the block's address.
    pub const ALLOC_RETURN: Program =
        Program { name: "alloc_return", kind: Kind::Return, args: &[], growth_only: false };
    /// Growth mode: first-touch page faults (`exceptions:page_fault_user`).
    pub const PAGE_FAULT_USER: Program = Program {
        name: "page_fault_user",
        kind: Kind::Tracepoint { group: "exceptions" },
        args: &[],
        growth_only: true,
    };

    /// The OOM killer chose a victim (`oom:mark_victim`): attached on its own, optional
    /// ([`crate::tp_field::OPTIONAL_EVENTS`]).
    pub const OOM_MARK_VICTIM: Program =
        Program { name: "mark_victim", kind: Kind::Tracepoint { group: "oom" }, args: &[], growth_only: false };

    /// Every program, uprobes first; the tracepoints in the order they are attached.
    pub const ALL: &[Program] = &[
        MALLOC_ENTER,
        CALLOC_ENTER,
        REALLOC_ENTER,
        REALLOCARRAY_ENTER,
        POSIX_MEMALIGN_ENTER,
        ALIGNED_ALLOC_ENTER,
        MEMALIGN_ENTER,
        VALLOC_ENTER,
        PVALLOC_ENTER,
        FREE_ENTER,
        ALLOC_RETURN,
        MMAP_ENTER,
        WORK_ENTER,
        RUST_REALLOC_ENTER,
        WRAPPER_ENTER,
        TEARDOWN_ENTER,
        GC_FULL_ENTER,
        GC_LIMIT_ENTER,
        // The address-space bookkeeping (the agent's `mappings`).
        tracepoint("syscalls", "sys_enter_mmap"),
        tracepoint("syscalls", "sys_exit_mmap"),
        tracepoint("syscalls", "sys_enter_munmap"),
        tracepoint("syscalls", "sys_exit_munmap"),
        tracepoint("syscalls", "sys_enter_mremap"),
        tracepoint("syscalls", "sys_exit_mremap"),
        tracepoint("syscalls", "sys_enter_brk"),
        tracepoint("syscalls", "sys_exit_brk"),
        // Forks (--follow-forks) and execs of traced processes.
        tracepoint("sched", "sched_process_fork"),
        tracepoint("sched", "sched_process_exec"),
        // A followed fork's child, held as its fork returns to it (`map_event::FORK_HELD`).
        tracepoint("syscalls", "sys_exit_clone"),
        tracepoint("syscalls", "sys_exit_clone3"),
        tracepoint("syscalls", "sys_exit_fork"),
        tracepoint("syscalls", "sys_exit_vfork"),
        PAGE_FAULT_USER,
        OOM_MARK_VICTIM,
    ];
}

/// Kernel structure field offsets the walk needs to identify a VMA's file (found by the agent
/// in the running kernel's BTF, /sys/kernel/btf/vmlinux): index into the `KERNEL_OFFSETS`
/// global. All in bytes.
pub mod kernel_offset {
    /// `vm_area_struct.vm_start`.
    pub const VM_START: usize = 0;
    /// `vm_area_struct.vm_pgoff`.
    pub const VM_PGOFF: usize = 1;
    /// `vm_area_struct.vm_file`.
    pub const VM_FILE: usize = 2;
    /// `file.f_inode`.
    pub const F_INODE: usize = 3;
    /// `inode.i_ino`.
    pub const I_INO: usize = 4;
    /// `inode.i_sb`.
    pub const I_SB: usize = 5;
    /// `super_block.s_dev`.
    pub const S_DEV: usize = 6;
    /// `vm_area_struct.vm_end`.
    pub const VM_END: usize = 7;
    /// `task_struct.real_parent`.
    pub const TASK_REAL_PARENT: usize = 8;
    /// `task_struct.tgid`.
    pub const TASK_TGID: usize = 9;
    /// Number of offsets.
    pub const NUM: usize = 10;
}

impl StackFrames {
    /// The valid frames, innermost first.
    pub fn frames(&self) -> &[u64] {
        &self.ips[..(self.len as usize).min(MAX_STACK_DEPTH)]
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // All types below are repr(C), Copy, made of integers, and have explicit padding fields: any
    // byte pattern is a valid value and none has uninitialized padding.
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for AllocKey {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for SiteKey {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for AllocInfo {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for BlockBucket {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for SiteStats {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for InFlight {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for TargetMode {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for MapEvent {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for SyscallArgs {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for MmapCall {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for StackFrames {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for PyStack {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for PyTarget {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for UnwindRow {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for ObjectId {}
    // SAFETY: repr(C) integers with explicit padding (above).
    unsafe impl aya::Pod for ObjectTable {}
    // SAFETY: repr(C) u64s, no padding.
    unsafe impl aya::Pod for GcFull {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::counter::*;

    #[test]
    fn program_table_has_each_name_once_and_every_traced_tracepoint() {
        use crate::program::{ALL, Kind};
        for (i, p) in ALL.iter().enumerate() {
            assert!(ALL[..i].iter().all(|q| q.name != p.name), "{} twice", p.name);
            assert!(p.args_read() <= 6, "{}: six argument registers", p.name);
            assert!(p.kind == Kind::Entry || p.args.is_empty(), "{}: only entry programs read arguments", p.name);
        }
        // Every tracepoint whose fields are read has its program, in its group.
        for (_, event, field, _, _) in crate::tp_field::FIELDS {
            let (group, name) = event.split_once('/').unwrap();
            assert!(
                ALL.iter().any(|p| p.name == name && p.kind == Kind::Tracepoint { group }),
                "{event} ({field}) has no program"
            );
        }
    }

    #[test]
    fn counter_table_is_by_index_and_keeps_the_names() {
        for (i, c) in TABLE.iter().enumerate() {
            assert_eq!(c.counter as usize, i, "{}", c.name);
            assert_eq!(Counter::try_from(i as u32), Ok(c.counter));
            assert_eq!(Counter::ALL[i].name(), c.name);
            assert!(c.is_loss || !c.loses_bytes, "{}: a byte loss is a loss", c.name);
        }
        assert_eq!(NAMES[ALLOCS_FULL as usize], "allocs_map_full");
        assert_eq!(NAMES[SAMPLED as usize], "sampled_allocs");
        assert_eq!(NAMES[PAGE_FAULTS as usize], "page_faults");
        let losses: Vec<&str> = NAMES.iter().zip(IS_LOSS).filter(|(_, l)| *l).map(|(n, _)| *n).collect();
        assert_eq!(
            losses,
            [
                "allocs_map_full",
                "sites_map_full",
                "stacks_map_full",
                "stack_error",
                "inflight_map_full",
                "missed_return",
                "address_reused",
                "map_events_lost"
            ]
        );
        let bytes: Vec<&str> = byte_losses().map(|c| c.name).collect();
        assert_eq!(
            bytes,
            [
                "allocs_map_full",
                "sites_map_full",
                "inflight_map_full",
                "missed_return",
                "address_reused",
                "map_events_lost"
            ]
        );
        assert_eq!(by_name("missed_return").map(|c| (c.loses_bytes, c.full)), Some((true, false)));
        assert_eq!(by_name("nope"), None);
        assert_eq!(Counter::try_from(NUM), Err(UnknownCounter(NUM)));
        assert_eq!(Counter::from_name("walks_reused"), Some(Counter::WalksReused));
    }
}
