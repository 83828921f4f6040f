//! Stop every thread of a process for the scan, and let it go again: PTRACE_SEIZE +
//! PTRACE_INTERRUPT of each thread (no signal is sent, the target sees nothing), PTRACE_DETACH
//! when [`Stopped`] is dropped. If the agent dies (even kill -9) the kernel detaches its tracees
//! and they run on: the target is never left stopped.

use std::collections::BTreeSet;

/// A stopped thread and its general-purpose registers.
pub struct Thread {
    /// Host thread id.
    pub tid: i32,
    /// Registers at the stop.
    pub regs: libc::user_regs_struct,
}

/// The threads stopped by [`stop_all`]; dropping it resumes them all.
pub struct Stopped {
    pub threads: Vec<Thread>,
    /// Seized threads and the signal to hand back at detach (a signal-delivery stop met while
    /// waiting for the interrupt: detaching with it delivers it, nothing is swallowed).
    seized: Vec<(i32, i32)>,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &(tid, sig) in &self.seized {
            // SAFETY: plain ptrace request on a thread this process seized; errors (the thread
            // exited) are harmless.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize) };
        }
    }
}

fn tids(pid: u32) -> std::io::Result<BTreeSet<i32>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// Seize and interrupt every thread of `pid` (threads started meanwhile too), wait until each
/// is stopped and read its registers. Errors (one line): the process is gone, or a thread
/// cannot be seized (already traced by a debugger, or ptrace forbidden); every thread seized
/// so far is resumed first.
pub fn stop_all(pid: u32) -> anyhow::Result<Stopped> {
    let mut st = Stopped { threads: Vec::new(), seized: Vec::new() };
    let mut done: BTreeSet<i32> = BTreeSet::new();
    for _round in 0..100 {
        let now = tids(pid).map_err(|e| anyhow::anyhow!("cannot list the threads of PID {pid}: {e}"))?;
        let new: Vec<i32> = now.difference(&done).copied().collect();
        if new.is_empty() {
            break;
        }
        for tid in new {
            done.insert(tid);
            // SAFETY: plain ptrace requests on a thread id; no memory is passed.
            let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ESRCH) {
                    continue; // exited meanwhile
                }
                if e.raw_os_error() == Some(libc::EPERM) && crate::procinfo::thread_exited(pid, tid as u32) {
                    // An exited thread (a main thread that called pthread_exit stays a zombie
                    // until the last thread ends): nothing to stop, no stack to scan.
                    continue;
                }
                anyhow::bail!("cannot stop thread {tid} of PID {pid} for the scan (ptrace: {e})");
            }
            st.seized.push((tid, 0));
            // SAFETY: as above.
            unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) };
        }
    }
    for i in 0..st.seized.len() {
        let tid = st.seized[i].0;
        let mut status = 0;
        // SAFETY: waits for a tracee of this process; status is a local.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        if r != tid || !libc::WIFSTOPPED(status) {
            continue; // exited
        }
        // status >> 16 is PTRACE_EVENT_STOP for the interrupt (or a group stop); 0 is a
        // signal-delivery stop: that signal is handed back at detach.
        if status >> 16 == 0 && libc::WSTOPSIG(status) != libc::SIGTRAP {
            st.seized[i].1 = libc::WSTOPSIG(status);
        }
        // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it for a stopped tracee.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut regs as *mut _ as usize) };
        if r == 0 {
            st.threads.push(Thread { tid, regs });
        }
    }
    anyhow::ensure!(!st.threads.is_empty(), "PID {pid} has no thread left to scan");
    Ok(st)
}

/// The registers that may hold a pointer (everything but the instruction and stack pointers,
/// flags and segments), by name.
pub fn pointer_registers(r: &libc::user_regs_struct) -> [(&'static str, u64); 15] {
    [
        ("rax", r.rax),
        ("rbx", r.rbx),
        ("rcx", r.rcx),
        ("rdx", r.rdx),
        ("rsi", r.rsi),
        ("rdi", r.rdi),
        ("rbp", r.rbp),
        ("r8", r.r8),
        ("r9", r.r9),
        ("r10", r.r10),
        ("r11", r.r11),
        ("r12", r.r12),
        ("r13", r.r13),
        ("r14", r.r14),
        ("r15", r.r15),
    ]
}
