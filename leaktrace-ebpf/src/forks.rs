//! Followed forks held from their first instruction (--follow-forks; bpf target only).
//!
//! The agent learns of a fork at its next poll (`sched_process_fork`'s event) and only then
//! attaches the child's probes: a child that allocates right after `fork` did so unseen. So a
//! child of a process in `FORK_HOLD` is stopped as its fork returns to it (the `clone`,
//! `clone3`, `fork` and `vfork` syscall-exit tracepoints fire in the child too, from
//! `ret_from_fork`, with return value 0), before it runs any instruction of its own, and the
//! agent is told (`map_event::FORK_HELD`); the agent attaches to it and sends SIGCONT.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use leaktrace_common::{MapEvent, map_event};

use crate::probes::{parent_tgid, stop_and_tell, syscall_ret};

/// Traced processes whose new child processes are held at their fork's return until the agent
/// has attached to them (tgid → 1, set by the agent with --follow-forks, removed when the
/// process exits or the session ends).
#[map]
static FORK_HOLD: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// A fork's return in the current task: a new process (not a thread: its pid is its tgid) that
/// returns 0 and whose parent is in `FORK_HOLD` is stopped (SIGSTOP, delivered before it
/// returns to user space) and the agent told (`tgid` the child, `addr` the parent).
///
/// Even when the child is a target already: the agent may have heard of it from
/// `sched_process_fork` (fired in the parent, before the child first runs) and be attaching to
/// it right now. Its TARGETS entry comes first, its teardown probe last: a child let through here
/// could allocate and reach `exit` before that probe exists, and its exit scan would be lost.
/// The agent resumes a held child once its attach is complete (at once when it already is).
#[inline(always)]
fn fork_returned(ctx: &TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid != pid_tgid as u32 || syscall_ret(ctx) != Some(0) {
        return 0;
    }
    let parent = parent_tgid();
    if parent == 0 || FORK_HOLD.get_ptr(&parent).is_none() {
        return 0;
    }
    stop_and_tell(MapEvent { kind: map_event::FORK_HELD, tgid, addr: parent as u64, ..Default::default() });
    0
}

/// `clone` returned (glibc's `fork` and the old `posix_spawn`).
#[tracepoint]
pub fn sys_exit_clone(ctx: TracePointContext) -> u32 {
    fork_returned(&ctx)
}

/// `clone3` returned (glibc's `posix_spawn`, `pthread_create`: threads are let through).
#[tracepoint]
pub fn sys_exit_clone3(ctx: TracePointContext) -> u32 {
    fork_returned(&ctx)
}

/// `fork` returned.
#[tracepoint]
pub fn sys_exit_fork(ctx: TracePointContext) -> u32 {
    fork_returned(&ctx)
}

/// `vfork` returned (glibc's `vfork`: the parent waits until the child execs or exits, so it
/// waits for the hold too).
#[tracepoint]
pub fn sys_exit_vfork(ctx: TracePointContext) -> u32 {
    fork_returned(&ctx)
}
