//! Stop every thread of a process for the scan, and let it go again: PTRACE_SEIZE +
//! PTRACE_INTERRUPT of each thread (no signal is sent, the target sees nothing), PTRACE_DETACH
//! when [`Stopped`] is dropped. If the agent dies (even kill -9) the kernel detaches its tracees
//! and they run on: the target is never left stopped.

use std::collections::BTreeSet;

/// A stopped thread and its registers.
pub struct Thread {
    /// Host thread id.
    pub tid: i32,
    /// General-purpose registers at the stop.
    pub regs: libc::user_regs_struct,
    /// The SSE registers %xmm0..15 at the stop (PTRACE_GETFPREGS, the FXSAVE area), two
    /// 64-bit lanes each; None when the kernel refused the request.
    pub xmm: Option<[[u64; 2]; 16]>,
}

impl Thread {
    /// The thread was stopped in user code (not inside a system call: `orig_rax` is −1), so
    /// the function it was interrupted in may be a leaf keeping live data in its red zone.
    pub fn in_user_code(&self) -> bool {
        self.regs.orig_rax as i64 == -1
    }
}

/// %xmm0..15 of a stopped tracee (PTRACE_GETFPREGS); None on error.
fn read_xmm(tid: i32) -> Option<[[u64; 2]; 16]> {
    // SAFETY: user_fpregs_struct is plain data; PTRACE_GETFPREGS fills it for a stopped tracee.
    let mut fp: libc::user_fpregs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETFPREGS writes one user_fpregs_struct into the local `fp`.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETFPREGS, tid, 0usize, &mut fp as *mut _ as usize) };
    if r != 0 {
        return None;
    }
    let mut out = [[0u64; 2]; 16];
    for (i, x) in out.iter_mut().enumerate() {
        let w = &fp.xmm_space[i * 4..i * 4 + 4];
        *x = [u64::from(w[0]) | u64::from(w[1]) << 32, u64::from(w[2]) | u64::from(w[3]) << 32];
    }
    Some(out)
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
            // Exited. When it was a launched command's main thread, this wait reaped the
            // command: its status is handed to the session's wait (launch::try_wait).
            if r == tid {
                crate::launch::reaped_elsewhere(tid as u32, status);
            }
            continue;
        }
        // status >> 16 is PTRACE_EVENT_STOP for the interrupt (or a group stop); 0 is a
        // signal-delivery stop: that signal is handed back at detach.
        if status >> 16 == 0 && libc::WSTOPSIG(status) != libc::SIGTRAP {
            st.seized[i].1 = libc::WSTOPSIG(status);
        }
        // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it for a stopped tracee.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS writes one user_regs_struct into the local `regs`.
        let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut regs as *mut _ as usize) };
        if r == 0 {
            st.threads.push(Thread { tid, regs, xmm: read_xmm(tid) });
        }
    }
    anyhow::ensure!(!st.threads.is_empty(), "PID {pid} has no thread left to scan");
    Ok(st)
}

/// Names of the vector registers' 64-bit lanes, as [`vector_registers`] gives them.
const XMM_NAMES: [[&str; 2]; 16] = [
    ["xmm0", "xmm0[1]"],
    ["xmm1", "xmm1[1]"],
    ["xmm2", "xmm2[1]"],
    ["xmm3", "xmm3[1]"],
    ["xmm4", "xmm4[1]"],
    ["xmm5", "xmm5[1]"],
    ["xmm6", "xmm6[1]"],
    ["xmm7", "xmm7[1]"],
    ["xmm8", "xmm8[1]"],
    ["xmm9", "xmm9[1]"],
    ["xmm10", "xmm10[1]"],
    ["xmm11", "xmm11[1]"],
    ["xmm12", "xmm12[1]"],
    ["xmm13", "xmm13[1]"],
    ["xmm14", "xmm14[1]"],
    ["xmm15", "xmm15[1]"],
];

/// The 64-bit lanes of %xmm0..15 (a pointer kept only in a vector register, as -O2 code
/// does when it spills to one), by name ("xmm0" the low lane, "xmm0[1]" the high one).
pub fn vector_registers(t: &Thread) -> Vec<(&'static str, u64)> {
    let Some(x) = &t.xmm else { return Vec::new() };
    x.iter().zip(XMM_NAMES.iter()).flat_map(|(v, n)| [(n[0], v[0]), (n[1], v[1])]).collect()
}

/// The registers still live at a function's entry besides its arguments: the callee-saved ones,
/// and %rdi (the first argument: `exit`'s status).
pub const CALLEE_SAVED_AND_RDI: [&str; 7] = ["rbx", "rbp", "r12", "r13", "r14", "r15", "rdi"];

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
