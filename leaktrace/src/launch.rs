//! Launch mode: start a command held just before `execve`, so that probes can be attached to its
//! PID before its first allocation, then let it run with its stdin, stdout and stderr untouched.
//!
//! Must be called before the process starts other threads (the child runs only async-signal-safe
//! code between fork and exec).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// A command forked and waiting for [`HeldChild::release`] to exec.
pub struct HeldChild {
    /// PID of the child (the future command).
    pub pid: u32,
    /// Executable that will be exec'd (resolved through PATH).
    pub exe: PathBuf,
    /// argv of the command.
    pub argv: Vec<String>,
    go_write: libc::c_int,
    err_read: libc::c_int,
}

/// How a launched command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// exit(code).
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl ExitStatus {
    /// Shell convention: the code, or 128 + signal number.
    pub fn as_shell(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// The usual name of signal `sig` ("SIGKILL"), or "signal N".
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        31 => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit code {c}"),
            ExitStatus::Signal(s) => write!(f, "killed by signal {s} ({})", signal_name(*s)),
        }
    }
}

/// Resolve `cmd` like execvp does: a name with a '/' is used as is, otherwise PATH is searched.
pub fn resolve_command(cmd: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let is_exec = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if cmd.as_os_str().as_bytes().contains(&b'/') {
        if is_exec(cmd) {
            return Ok(cmd.to_path_buf());
        }
        bail!("cannot run {}: no such executable file", cmd.display());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| is_exec(p))
        .with_context(|| format!("cannot run {}: command not found in PATH", cmd.display()))
}

/// Fork a child that waits, then execs `argv`. Call before any other thread exists.
pub fn spawn_held(argv: &[OsString]) -> anyhow::Result<HeldChild> {
    let first = argv.first().context("no command given after --")?;
    let exe = resolve_command(Path::new(first))?;
    let c_exe = CString::new(exe.as_os_str().as_bytes()).context("command path contains a NUL byte")?;
    let c_args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).context("argument contains a NUL byte"))
        .collect::<anyhow::Result<_>>()?;
    let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    c_argv.push(std::ptr::null());

    let mut go = [0; 2];
    let mut err = [0; 2];
    // SAFETY: pipe2(2) writes two file descriptors into each 2-element array it is given.
    unsafe {
        if libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0 || libc::pipe2(err.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            bail!("pipe2: {}", std::io::Error::last_os_error());
        }
    }
    // SAFETY: fork(2) before any other thread exists (the caller's contract); the child below
    // runs only async-signal-safe calls and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        // Child: async-signal-safe calls only.
        // SAFETY: in the forked child: close, read, execv, write and _exit are async-signal-safe;
        // every buffer was made before the fork (`c_exe`, `c_argv` NUL-terminated and alive, `b`
        // and `e` on this stack), and `_exit` ends the child without running the parent's
        // destructors or atexit handlers.
        unsafe {
            libc::close(go[1]);
            libc::close(err[0]);
            let mut b = 0u8;
            let n = libc::read(go[0], (&raw mut b).cast(), 1);
            if n == 1 {
                libc::execv(c_exe.as_ptr(), c_argv.as_ptr());
                let e = *libc::__errno_location();
                libc::write(err[1], (&raw const e).cast(), std::mem::size_of::<i32>());
            }
            libc::_exit(127);
        }
    }
    // SAFETY: the child's ends of the two pipes, created above and closed once, here.
    unsafe {
        libc::close(go[0]);
        libc::close(err[1]);
    }
    Ok(HeldChild {
        pid: pid as u32,
        exe,
        argv: argv.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
        go_write: go[1],
        err_read: err[0],
    })
}

impl HeldChild {
    /// Let the child exec. Returns once the exec has succeeded; an exec failure is an error.
    pub fn release(&mut self) -> anyhow::Result<()> {
        let b = 1u8;
        // SAFETY: a 1-byte write from a local to the pipe this value owns, then its close (once:
        // the descriptor is set to -1 below).
        unsafe {
            libc::write(self.go_write, (&raw const b).cast(), 1);
            libc::close(self.go_write);
        }
        self.go_write = -1;
        let mut e = 0i32;
        // SAFETY: a read of at most size_of::<i32>() bytes into the local `e`, from the pipe this
        // value owns.
        let n = unsafe { libc::read(self.err_read, (&raw mut e).cast(), std::mem::size_of::<i32>()) };
        // SAFETY: the pipe this value owns, closed once (set to -1 below).
        unsafe { libc::close(self.err_read) };
        self.err_read = -1;
        if n == std::mem::size_of::<i32>() as isize {
            let _ = wait_blocking(self.pid);
            bail!("cannot run {}: {}", self.exe.display(), std::io::Error::from_raw_os_error(e));
        }
        Ok(())
    }

    /// Abandon the child before exec (it exits with status 127 and is reaped).
    pub fn abandon(mut self) {
        // SAFETY: closes the pipe ends this value still owns (>= 0), once (set to -1 below).
        unsafe {
            if self.go_write >= 0 {
                libc::close(self.go_write);
            }
            if self.err_read >= 0 {
                libc::close(self.err_read);
            }
        }
        self.go_write = -1;
        self.err_read = -1;
        let _ = wait_blocking(self.pid);
    }
}

/// A small process that lets a launched command go on if leaktrace dies without doing so itself
/// (SIGKILL, OOM kill) while the command is held stopped at its teardown (a teardown probe
/// SIGSTOPs it until the agent's last checkpoint, then the agent sends SIGCONT): every 100 ms it
/// checks that its parent (the agent) is alive; once reparented, it sends SIGCONT to the command
/// and to the agent's process group (children of the command stopped the same way) and exits.
/// With --follow-forks on attached processes ([`Guardian::for_groups`]) it sends SIGCONT to
/// their process groups instead: a child held at its fork (the kernel side stops it before its
/// first instruction, so it is still in its parent's group) goes on.
/// It closes every file descriptor (it holds no BPF link, map or pipe of the agent's), ignores
/// the terminal's signals (Ctrl-C is the agent's to handle) and is killed and reaped when this
/// value is dropped.
pub struct Guardian {
    pid: libc::pid_t,
}

impl Guardian {
    /// Fork the guardian of the launched command `command`. Errors: fork failed.
    pub fn start(command: u32) -> anyhow::Result<Guardian> {
        // SAFETY: a plain system call.
        let group = unsafe { libc::getpgrp() };
        Guardian::spawn(&[command as libc::pid_t, -group])
    }

    /// Fork a guardian that resumes the process groups of the attached processes `pids`
    /// (followed with --follow-forks: their children are held at their fork) if leaktrace dies.
    /// Errors: fork failed, or no group could be read.
    pub fn for_groups(pids: &[u32]) -> anyhow::Result<Guardian> {
        // SAFETY: getpgid(2) of a PID; -1 (gone) is left out.
        let mut targets: Vec<libc::pid_t> =
            pids.iter().map(|&p| unsafe { libc::getpgid(p as libc::pid_t) }).filter(|&g| g > 0).map(|g| -g).collect();
        targets.sort_unstable();
        targets.dedup();
        anyhow::ensure!(!targets.is_empty(), "no process group of the targets could be read");
        Guardian::spawn(&targets)
    }

    /// Fork the guardian: once leaktrace is gone it sends SIGCONT to each of `targets` (a PID,
    /// or minus a process group) and exits.
    fn spawn(targets: &[libc::pid_t]) -> anyhow::Result<Guardian> {
        // SAFETY: a plain system call.
        let parent = unsafe { libc::getpid() };
        // SAFETY: fork(2); the child runs only async-signal-safe calls (sigaction through
        // signal, close_range, getppid, nanosleep, kill, _exit) and never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: async-signal-safe calls only (see above).
            unsafe {
                for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT, libc::SIGPIPE] {
                    libc::signal(sig, libc::SIG_IGN);
                }
                libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
                let nap = libc::timespec { tv_sec: 0, tv_nsec: 100_000_000 };
                while libc::getppid() == parent {
                    libc::nanosleep(&nap, std::ptr::null_mut());
                }
                for &t in targets {
                    libc::kill(t, libc::SIGCONT);
                }
                libc::_exit(0);
            }
        }
        Ok(Guardian { pid })
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        // SAFETY: kill and waitpid of the guardian this value forked (reaped once, here).
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

/// Non-blocking reap: Some(status) once the child has exited.
pub fn try_wait(pid: u32) -> Option<ExitStatus> {
    if let Some(s) = take_reaped(pid) {
        return Some(s);
    }
    let mut status = 0;
    // SAFETY: waitpid(2) writes the status into the local `status`.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if r == pid as i32 { Some(decode(status)) } else { take_reaped(pid) }
}

fn wait_blocking(pid: u32) -> Option<ExitStatus> {
    if let Some(s) = take_reaped(pid) {
        return Some(s);
    }
    let mut status = 0;
    // SAFETY: waitpid(2) writes the status into the local `status`.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    if r == pid as i32 { Some(decode(status)) } else { take_reaped(pid) }
}

/// Exit statuses (raw waitpid status, by PID) that a ptrace stop for a scan reaped: a launched
/// command whose main thread exits while it is seized is reaped by the scan's waitpid(__WALL),
/// and [`try_wait`] would otherwise never see it end.
static REAPED: std::sync::Mutex<Vec<(u32, i32)>> = std::sync::Mutex::new(Vec::new());

/// Note the raw exit `status` of thread `tid`, reaped by a wait for a scan's stop (only a
/// thread-group leader's matters: it is a launched command's end).
pub fn reaped_elsewhere(tid: u32, status: i32) {
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        REAPED.lock().unwrap_or_else(|e| e.into_inner()).push((tid, status));
    }
}

fn take_reaped(pid: u32) -> Option<ExitStatus> {
    let mut v = REAPED.lock().unwrap_or_else(|e| e.into_inner());
    let i = v.iter().position(|&(p, _)| p == pid)?;
    Some(decode(v.swap_remove(i).1))
}

fn decode(status: i32) -> ExitStatus {
    if libc::WIFEXITED(status) {
        ExitStatus::Code(libc::WEXITSTATUS(status))
    } else {
        ExitStatus::Signal(libc::WTERMSIG(status))
    }
}

/// Stop a launched command that is still running: SIGTERM, then SIGKILL after `grace`.
/// Returns how it ended.
pub fn terminate(pid: u32, grace: std::time::Duration) -> Option<ExitStatus> {
    if let Some(s) = try_wait(pid) {
        return Some(s);
    }
    // SAFETY: kill(2) of the launched command, still unreaped (try_wait above), so its PID is
    // not reused.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Some(s) = try_wait(pid) {
            return Some(s);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: as the SIGTERM above (not reaped: try_wait found it running).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_blocking(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command reaped by a scan's wait ends the session's wait with the status it had.
    #[test]
    fn a_status_reaped_by_a_scan_is_the_commands_end() {
        // A PID that is no child of the test: waitpid fails, only the registry answers.
        let pid = u32::MAX / 2;
        assert_eq!(try_wait(pid), None);
        reaped_elsewhere(pid, 3 << 8); // exited with code 3
        reaped_elsewhere(pid + 1, 0x057f); // stopped by SIGSTOP: not an end, not kept
        assert_eq!(try_wait(pid), Some(ExitStatus::Code(3)));
        assert_eq!(try_wait(pid), None, "taken once");
        assert_eq!(try_wait(pid + 1), None);
    }
}
