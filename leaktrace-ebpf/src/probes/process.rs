//! A traced process's life: units of work, its teardown, the OOM killer's victim, its forks and
//! execs.

use super::*;

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

/// The main thread's `GC_FULL` entry, when the agent made one for its process: V8 collects an
/// isolate on the isolate's own thread, and the main isolate's is the main thread (a Worker's
/// isolate, on its own thread, is not counted).
#[inline(always)]
fn main_thread_gc() -> Option<*mut GcFull> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    if id as u32 != tgid {
        return None;
    }
    GC_FULL.get_ptr_mut(&tgid)
}

/// Entry of V8's `MarkCompactCollector::Finish()`: a full collection of the main isolate ended;
/// the next limit computation reads what it left.
#[uprobe]
pub fn gc_full_enter(_ctx: ProbeContext) -> u32 {
    if let Some(g) = main_thread_gc() {
        // SAFETY: a value the lookup returned, valid while the program runs; only the main
        // thread (this one) and the agent's reads touch it.
        unsafe {
            (*g).ended += 1;
            (*g).armed = 1;
        }
    }
    0
}

/// Entry of V8's `MemoryController<V8HeapTrait>::CalculateAllocationLimit(heap, current_size,
/// …)`: right after a full collection (armed), `current_size` is the old generation's size of
/// objects it left (V8's own base for its next limit); after a scavenge it is not read.
#[uprobe]
pub fn gc_limit_enter(ctx: ProbeContext) -> u32 {
    if let Some(g) = main_thread_gc() {
        let size = crate::probes::arg(&ctx, 1);
        // SAFETY: as in `gc_full_enter`; `measured` is written last, so a reader that sees it
        // grown sees the size and time of that collection.
        unsafe {
            if (*g).armed != 0 {
                (*g).armed = 0;
                (*g).bytes = size;
                (*g).at_ns = bpf_ktime_get_ns();
                core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
                (*g).measured += 1;
            }
        }
    }
    0
}

/// Entry of libc's `exit` or CPython's `Py_FinalizeEx` in a launched command: its teardown
/// (static destructors, atexit handlers, interpreter finalization) begins. The first call in
/// a watched process stops the whole process (SIGSTOP, delivered before the function's first
/// instruction runs) and tells the agent, which takes a checkpoint of what was live before the
/// teardown frees anything, then sends SIGCONT.
#[uprobe]
pub fn teardown_enter(_ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if TEARDOWN.remove(&tgid).is_err() {
        return 0;
    }
    // The process stops as this probe returns to user space.
    stop_and_tell(MapEvent { kind: map_event::TEARDOWN, tgid, ..Default::default() });
    0
}

/// The OOM killer chose a task as its victim (oom:mark_victim, before the kill is delivered): a
/// traced process's `pid` is its tgid (the killer picks processes by their leader and marks that
/// task, or its first thread that still has an mm when the leader has exited: then this misses
/// it, and the cgroup's oom_kill counter is what the agent has). Tell the agent, with the
/// victim's anonymous RSS (KiB).
#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    // SAFETY: reads of this object's own global; volatile, as the agent sets it at load time.
    let (pid_off, rss_off) = unsafe {
        (
            core::ptr::read_volatile(&TP_OFFSETS[tp_field::OOM_VICTIM_PID]) as usize,
            core::ptr::read_volatile(&TP_OFFSETS[tp_field::OOM_VICTIM_ANON_RSS]) as usize,
        )
    };
    // SAFETY: bpf_probe_read_kernel of the record at the format file's offsets.
    let pid = unsafe { ctx.read_at::<u32>(pid_off) }.unwrap_or(0);
    if pid == 0 || !is_target(pid) {
        return 0;
    }
    // SAFETY: as above.
    let anon_rss_kib = unsafe { ctx.read_at::<u64>(rss_off) }.unwrap_or(0);
    emit(&MapEvent { kind: map_event::OOM_VICTIM, tgid: pid, addr: anon_rss_kib, ..Default::default() });
    0
}

/// A traced process forked (or made a thread): tell the agent, which follows new processes
/// with --follow-forks (sched:sched_process_fork's `child_pid`).
#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_target(tgid) {
        return 0;
    }
    // SAFETY: a read of this object's own global; volatile, as the agent sets it at load time.
    let off = unsafe { core::ptr::read_volatile(&TP_OFFSETS[tp_field::FORK_CHILD_PID]) } as usize;
    // SAFETY: a bpf_probe_read_kernel of the record at the format file's offset.
    let child = unsafe { ctx.read_at::<u32>(off) }.unwrap_or(0);
    emit(&MapEvent { kind: map_event::FORK, tgid, addr: child as u64, ..Default::default() });
    0
}

/// A traced process completed an `execve` (sched:sched_process_exec, after the new image is in
/// place; the exec'ing thread is the leader by now, so its tgid is the process's): tell the
/// agent, which re-discovers the new image's objects and notes where the image changed.
///
/// A launched process (`EXEC_HOLD`) is stopped here (SIGSTOP, delivered before the new image's
/// first instruction) until the agent has probed the new image: a wrapper's exec (`env`,
/// `taskset`, a script's `exec`) would otherwise run the program unprobed until the agent's
/// next poll, and a short one entirely. So is an untraced child of a launched process whose
/// children are followed, which the agent then follows.
#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if is_target(tgid) {
        let held = match EXEC_HOLD.get_ptr_mut(&tgid) {
            // SAFETY: a value the lookup returned, valid while the program runs; only this
            // process's exec (one at a time) and the agent write it.
            Some(h) => unsafe {
                if *h & exec_hold::PASS_MASK != 0 {
                    *h -= 1;
                    false
                } else {
                    true
                }
            },
            // A child just followed, whose own entry the agent has not made yet.
            None => parent_holds_children(parent_tgid()),
        };
        let ev = MapEvent { kind: map_event::EXEC, tgid, ..Default::default() };
        if held {
            stop_and_tell(ev);
        } else {
            emit(&ev);
        }
        return 0;
    }
    let parent = parent_tgid();
    if parent_holds_children(parent) {
        stop_and_tell(MapEvent { kind: map_event::CHILD_EXEC, tgid, addr: parent as u64, ..Default::default() });
    }
    0
}

/// Whether `parent` (a tgid, 0: unknown) holds its children's execs (`exec_hold::CHILDREN`).
#[inline(always)]
fn parent_holds_children(parent: u32) -> bool {
    // SAFETY: a value the lookup returned, copied at once.
    parent != 0 && EXEC_HOLD.get_ptr(&parent).is_some_and(|h| unsafe { *h } & exec_hold::CHILDREN != 0)
}

/// The tgid of the current task's parent (`task_struct.real_parent->tgid`, offsets from the
/// kernel's BTF set by the agent); 0 when the offsets are not known or a read fails.
#[inline(always)]
pub(crate) fn parent_tgid() -> u32 {
    let (parent_off, tgid_off) = (
        crate::unwind_rule::offset(kernel_offset::TASK_REAL_PARENT),
        crate::unwind_rule::offset(kernel_offset::TASK_TGID),
    );
    if parent_off == 0 || tgid_off == 0 {
        return 0;
    }
    // SAFETY: bpf_get_current_task returns the current task's address; the reads are checked
    // copies of kernel memory (bpf_probe_read_kernel): a bad address is an error, not a fault.
    unsafe {
        let task = aya_ebpf::helpers::bpf_get_current_task();
        let Ok(parent) = bpf_probe_read_kernel((task + parent_off) as *const u64) else { return 0 };
        if parent == 0 {
            return 0;
        }
        bpf_probe_read_kernel((parent + tgid_off) as *const u32).unwrap_or(0)
    }
}
