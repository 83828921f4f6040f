//! Stop every thread of a process for the scan, and let it go again: PTRACE_SEIZE +
//! PTRACE_INTERRUPT of each thread (no signal is sent, the target sees nothing), PTRACE_DETACH
//! when [`Stopped`] is dropped.
//!
//! Every ptrace request is made from one short-lived tracer thread (a tracee belongs to the
//! thread that seized it). It waits for each thread's stop without blocking (`waitpid` with
//! `WNOHANG`, polled) until a deadline: a thread that does not stop by then (blocked in the
//! kernel where ptrace cannot stop it: a `vfork` parent waiting for its child, a read of a hung
//! FUSE or NFS file) is named in [`Stopped::not_stopped`] and the others are scanned without
//! it. The tracer resumes every thread when [`Stopped`] is dropped, or by itself at the hard
//! deadline given to [`stop_all`] whatever the scan is doing (a read blocked in the kernel);
//! when it ends, the kernel detaches whatever it still traces (a thread that never stopped). If
//! the agent dies (even kill -9) the kernel detaches its tracees too: the target is never left
//! stopped.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
    /// Threads seized that had not stopped by the wait's deadline (blocked in the kernel): not
    /// scanned, and never held.
    pub not_stopped: Vec<i32>,
    /// Set by the tracer when it resumed the threads by itself at the hard deadline.
    forced: Arc<AtomicBool>,
    resume: Option<mpsc::Sender<()>>,
    tracer: Option<std::thread::JoinHandle<()>>,
}

impl Stopped {
    /// Resume every thread now (the tracer detaches them and ends); true when the tracer had
    /// already resumed them by itself at the hard deadline, before the scan ended.
    pub fn resume(mut self) -> bool {
        drop(self.resume.take());
        if let Some(t) = self.tracer.take() {
            let _ = t.join();
        }
        self.forced.load(Ordering::Relaxed)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        drop(self.resume.take());
        if let Some(t) = self.tracer.take() {
            let _ = t.join();
        }
    }
}

fn tids(pid: u32) -> std::io::Result<BTreeSet<i32>> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// How long the tracer waits for every thread to stop, for a pause cap of `max_pause`: half of
/// it, at most 2 s (a thread not stopped by then is blocked in the kernel).
pub fn wait_for(max_pause: Duration) -> Duration {
    (max_pause / 2).min(Duration::from_secs(2))
}

/// The tracer resumes the target by itself this long after the pause cap, whatever the scan
/// is doing (a read blocked in the kernel).
pub const HARD_MARGIN: Duration = Duration::from_millis(500);

/// What the tracer thread hands back once the threads are stopped (or not).
type Report = anyhow::Result<(Vec<Thread>, Vec<i32>)>;

/// Seize and interrupt every thread of `pid` (threads started meanwhile too), wait until each
/// is stopped (at most `wait`) and read its registers. The threads are resumed when the result
/// is dropped, and at `hard_deadline` at the latest. Errors (one line): the process is gone, or
/// a thread cannot be seized (already traced by a debugger, or ptrace forbidden), or none
/// stopped; every thread seized so far is resumed first.
pub fn stop_all(pid: u32, wait: Duration, hard_deadline: Instant) -> anyhow::Result<Stopped> {
    let (report_tx, report_rx) = mpsc::channel::<Report>();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let forced = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&forced);
    let tracer = std::thread::Builder::new()
        .name("reach-tracer".into())
        .spawn(move || tracer(pid, wait, hard_deadline, &report_tx, &resume_rx, &f))
        .map_err(|e| anyhow::anyhow!("cannot start the tracer thread: {e}"))?;
    let mut st =
        Stopped { threads: Vec::new(), not_stopped: Vec::new(), forced, resume: Some(resume_tx), tracer: Some(tracer) };
    match report_rx.recv() {
        Ok(Ok((threads, not_stopped))) => {
            st.threads = threads;
            st.not_stopped = not_stopped;
            anyhow::ensure!(!st.threads.is_empty(), "PID {pid}: no thread of it could be stopped for the scan");
            Ok(st)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => anyhow::bail!("the tracer thread ended without an answer"),
    }
}

/// The tracer thread: seize, wait (bounded), report, hold until told (or the hard deadline),
/// detach. Its end detaches whatever it still traces.
fn tracer(
    pid: u32,
    wait: Duration,
    hard_deadline: Instant,
    report: &mpsc::Sender<Report>,
    resume: &mpsc::Receiver<()>,
    forced: &AtomicBool,
) {
    let mut seized: Vec<i32> = Vec::new();
    if let Err(e) = seize_all(pid, &mut seized) {
        let _ = report.send(Err(e));
        return;
    }
    // Each seized thread's state: None while not stopped, Some(signal to hand back at detach).
    let mut state: Vec<Option<i32>> = vec![None; seized.len()];
    let mut gone = vec![false; seized.len()];
    let mut threads = Vec::new();
    let until = (Instant::now() + wait).min(hard_deadline);
    loop {
        for i in 0..seized.len() {
            if state[i].is_some() || gone[i] {
                continue;
            }
            match poll_stop(seized[i]) {
                Polled::Running => {}
                Polled::Gone => gone[i] = true,
                Polled::Stopped(sig, regs) => {
                    state[i] = Some(sig);
                    if let Some(regs) = regs {
                        threads.push(Thread { tid: seized[i], regs: *regs, xmm: read_xmm(seized[i]) });
                    }
                }
            }
        }
        let pending = (0..seized.len()).any(|i| state[i].is_none() && !gone[i]);
        if !pending || Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let not_stopped: Vec<i32> =
        (0..seized.len()).filter(|&i| state[i].is_none() && !gone[i]).map(|i| seized[i]).collect();
    let _ = report.send(Ok((threads, not_stopped)));
    // Hold until the scan is done (the sender dropped), or the hard deadline.
    let left = hard_deadline.saturating_duration_since(Instant::now());
    if let Err(mpsc::RecvTimeoutError::Timeout) = resume.recv_timeout(left) {
        forced.store(true, Ordering::Relaxed);
    }
    for (i, &tid) in seized.iter().enumerate() {
        let sig = match state[i] {
            Some(sig) => sig,
            // Stopped since? Detached with its signal; else left to this thread's end.
            None if !gone[i] => match poll_stop(tid) {
                Polled::Stopped(sig, _) => sig,
                _ => continue,
            },
            None => continue,
        };
        // SAFETY: plain ptrace request on a thread this thread seized; errors (the thread
        // exited) are harmless.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize) };
    }
}

/// Seize and interrupt every thread of `pid`, into `seized`.
fn seize_all(pid: u32, seized: &mut Vec<i32>) -> anyhow::Result<()> {
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
            seized.push(tid);
            // SAFETY: as above.
            unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) };
        }
    }
    Ok(())
}

enum Polled {
    Running,
    Gone,
    /// Stopped: the signal to hand back at detach, its registers (None: refused).
    Stopped(i32, Option<Box<libc::user_regs_struct>>),
}

/// One non-blocking look at seized thread `tid`.
fn poll_stop(tid: i32) -> Polled {
    let mut status = 0;
    // SAFETY: waits (without blocking) for a tracee of this thread; status is a local.
    let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
    if r == 0 || (r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)) {
        return Polled::Running;
    }
    if r != tid || !libc::WIFSTOPPED(status) {
        // Exited. When it was a launched command's main thread, this wait reaped the
        // command: its status is handed to the session's wait (launch::try_wait).
        if r == tid {
            crate::launch::reaped_elsewhere(tid as u32, status);
        }
        return Polled::Gone;
    }
    // status >> 16 is PTRACE_EVENT_STOP for the interrupt (or a group stop); 0 is a
    // signal-delivery stop: that signal is handed back at detach.
    let sig = if status >> 16 == 0 && libc::WSTOPSIG(status) != libc::SIGTRAP { libc::WSTOPSIG(status) } else { 0 };
    // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it for a stopped tracee.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: PTRACE_GETREGS writes one user_regs_struct into the local `regs`.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut regs as *mut _ as usize) };
    Polled::Stopped(sig, (r == 0).then(|| Box::new(regs)))
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
