//! HotSpot's dynamic attach, spoken by leaktrace itself: no `jcmd` (nor any other program) is
//! run, so nothing of the target's JDK ever executes with leaktrace's rights.
//!
//! The protocol (JDK 10+, `attachListener_linux.cpp`, the JDK's `VirtualMachineImpl.java`):
//! the JVM listens on the UNIX socket `/tmp/.java_pid<NSPID>` of its own root (NSPID: its PID in
//! its PID namespace) once its attach listener runs; it starts it on SIGQUIT when a file
//! `.attach_pid<NSPID>` owned by root or by its effective uid is in its cwd or its /tmp. A client
//! sends `1\0jcmd\0<command line>\0\0\0`; the JVM answers a status line (`0` for success) and the
//! command's output, then closes. The JVM accepts a peer whose uid and gid (SO_PEERCRED, as seen
//! from its user namespace) are root's or its own.
//!
//! Here: every path in the target is resolved inside its root (`openat2` from `/proc/PID/root`
//! with `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, the last component never followed); the socket
//! must be a socket owned by the JVM's effective uid (or root) with no group or other access, as
//! the JDK's own client checks; the attach file is created (`O_EXCL`) in the target's /tmp, given
//! to the JVM's uid and gid, and removed again. The connection is made from a short-lived thread
//! that first takes the JVM's effective uid and gid (its own credentials only, through the raw
//! system calls; it has no capabilities left): the JVM sees its own user whatever its user
//! namespace, and leaktrace can do through the socket only what that user could. The reply is
//! read with a byte cap ([`MAX_REPLY`]) and the whole exchange within a deadline.

use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Most bytes of one reply read (a class histogram of 10,000 classes is about 1 MB).
pub const MAX_REPLY: usize = 32 << 20;
/// Longest wait for the listener to start after SIGQUIT (jcmd's own default is 10 s).
const LISTENER_WAIT: Duration = Duration::from_secs(10);

/// The JVM `pid` as seen for attaching: its PID in its namespace, its effective uid and gid.
struct Jvm {
    pid: u32,
    ns_pid: u32,
    uid: u32,
    gid: u32,
}

impl Jvm {
    fn of(pid: u32) -> Result<Jvm, String> {
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("/proc/{pid}/status: {e}"))?;
        // "Uid:\treal\teffective\tsaved\tfs": the effective one.
        let effective = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().nth(1)?.parse::<u32>().ok())
                .ok_or_else(|| format!("no {key} line in /proc/{pid}/status"))
        };
        let ns_pid = crate::procinfo::nspid(pid).last().copied().unwrap_or(pid);
        Ok(Jvm { pid, ns_pid, uid: effective("Uid:")?, gid: effective("Gid:")? })
    }

    fn socket_name(&self) -> String {
        format!("tmp/.java_pid{}", self.ns_pid)
    }
}

/// `path` (relative, in the target's root) opened with `flags`, resolved inside `root`: no
/// link leads out of it, no magic link is followed.
fn open_in_root(root: &OwnedFd, path: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(root, path, flags | OFlags::CLOEXEC, mode, ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS)
}

fn open_root(pid: u32) -> Result<OwnedFd, String> {
    crate::target_fs::root_dir(pid).map_err(|e| e.to_string())
}

/// The JVM's attach socket, as an O_PATH descriptor: None when there is none (yet). An error
/// when the name is there but is not a socket the JVM's user alone may use.
fn find_socket(root: &OwnedFd, jvm: &Jvm) -> Result<Option<OwnedFd>, String> {
    let name = jvm.socket_name();
    let fd = match open_in_root(root, &name, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(format!("/{name} in the target's root: {e}")),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("/{name}: {e}"))?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    if kind != rustix::fs::FileType::Socket {
        return Err(format!("/{name} in the target's root is not a socket ({kind:?})"));
    }
    if st.st_uid != jvm.uid && st.st_uid != 0 {
        return Err(format!("/{name} belongs to uid {}, not to the JVM's uid {}", st.st_uid, jvm.uid));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(format!("/{name} may be used by others (mode {:o})", st.st_mode & 0o777));
    }
    Ok(Some(fd))
}

/// The attach file leaktrace created in the target's /tmp, removed when dropped.
struct AttachFile {
    tmp: OwnedFd,
    name: String,
}

impl AttachFile {
    /// Create it; None when the name is already there (another client's request in flight,
    /// leaktrace's own for another command, or a file left behind): that one is used as it is.
    fn create(root: &OwnedFd, jvm: &Jvm) -> Result<Option<AttachFile>, String> {
        let tmp = open_in_root(root, "tmp", OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| format!("the target's /tmp: {e}"))?;
        let name = format!(".attach_pid{}", jvm.ns_pid);
        let flags =
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&tmp, name.as_str(), flags, Mode::RUSR | Mode::WUSR) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => return Ok(None),
            Err(e) => return Err(format!("cannot create /tmp/{name} in the target's root: {e}")),
        };
        let file = AttachFile { tmp, name };
        let owner = (rustix::process::Uid::from_raw(jvm.uid), rustix::process::Gid::from_raw(jvm.gid));
        rustix::fs::fchown(&fd, Some(owner.0), Some(owner.1))
            .map_err(|e| format!("cannot give /tmp/{} to uid {}: {e}", file.name, jvm.uid))?;
        Ok(Some(file))
    }
}

impl Drop for AttachFile {
    fn drop(&mut self) {
        // The name in the directory leaktrace resolved (unlinkat never removes a directory).
        let _ = rustix::fs::unlinkat(&self.tmp, self.name.as_str(), rustix::fs::AtFlags::empty());
    }
}

/// The attach socket of JVM `jvm`, its listener started first when it is not up (attach file,
/// SIGQUIT, then polled until `deadline`).
fn socket(root: &OwnedFd, jvm: &Jvm, deadline: Instant) -> Result<OwnedFd, String> {
    if let Some(fd) = find_socket(root, jvm)? {
        return Ok(fd);
    }
    if !catches_sigquit(jvm.pid) {
        return Err(NOT_ATTACHABLE.to_string());
    }
    let _file = AttachFile::create(root, jvm)?;
    // SAFETY: kill(2) of the target with a signal it catches (checked just above).
    if unsafe { libc::kill(jvm.pid as i32, libc::SIGQUIT) } != 0 {
        return Err(format!("SIGQUIT: {}", std::io::Error::last_os_error()));
    }
    let until = crate::stopping::cap(deadline.min(Instant::now() + LISTENER_WAIT));
    let mut nap = Duration::from_millis(20);
    loop {
        if let Some(fd) = find_socket(root, jvm)? {
            return Ok(fd);
        }
        if Instant::now() >= until {
            return Err(format!(
                "no attach listener within {} s of SIGQUIT (/{} never appeared; attach disabled with -XX:+DisableAttachMechanism?)",
                LISTENER_WAIT.as_secs(),
                jvm.socket_name()
            ));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(200));
    }
}

/// A connection to the socket `sock` (an O_PATH descriptor) made from a thread holding only the
/// JVM's effective uid and gid.
fn connect_as(sock: &OwnedFd, jvm: &Jvm) -> Result<UnixStream, String> {
    let path = format!("/proc/self/fd/{}", sock.as_fd().as_raw_fd());
    let (uid, gid) = (jvm.uid, jvm.gid);
    std::thread::scope(|s| {
        s.spawn(move || {
            if uid != 0 || gid != 0 {
                // SAFETY: raw setgroups/setresgid/setresuid change this thread's credentials only
                // (glibc's wrappers would change every thread's); the thread ends after connect.
                unsafe {
                    if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
                        || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                        || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
                    {
                        return Err(format!("cannot take uid {uid} gid {gid}: {}", std::io::Error::last_os_error()));
                    }
                }
            }
            UnixStream::connect(&path).map_err(|e| format!("connect to the attach socket as uid {uid}: {e}"))
        })
        .join()
        .map_err(|_| "the connecting thread panicked".to_string())?
    })
}

/// Run the diagnostic command `line` (`GC.class_histogram`, `VM.flags -all`...) in JVM `pid`
/// through its attach socket, within `deadline`: Ok(its output), or Err(why, one line).
pub fn jcmd(pid: u32, line: &str, deadline: Instant) -> Result<String, String> {
    let jvm = Jvm::of(pid)?;
    let root = open_root(pid)?;
    let sock = socket(&root, &jvm, deadline)?;
    let mut s = connect_as(&sock, &jvm)?;
    drop(sock);
    let left = |what: &str| {
        crate::stopping::cap(deadline)
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{what}: timed out"))
    };
    s.set_write_timeout(Some(left("send")?)).map_err(|e| e.to_string())?;
    let mut request = b"1\0jcmd\0".to_vec();
    request.extend_from_slice(line.as_bytes());
    request.extend_from_slice(b"\0\0\0");
    s.write_all(&request).map_err(|e| format!("send: {e}"))?;
    let reply = read_reply(&mut s, &left)?;
    parse_reply(&reply)
}

/// The whole reply (until the JVM closes), at most [`MAX_REPLY`] bytes, within the deadline.
fn read_reply(s: &mut UnixStream, left: &dyn Fn(&str) -> Result<Duration, String>) -> Result<Vec<u8>, String> {
    let mut reply = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        s.set_read_timeout(Some(left("the reply")?)).map_err(|e| e.to_string())?;
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err("the reply: timed out".to_string());
            }
            Err(e) => return Err(format!("the reply: {e}")),
        };
        if n == 0 {
            return Ok(reply);
        }
        if reply.len() + n > MAX_REPLY {
            return Err(format!("the reply is over {} MiB: not read", MAX_REPLY >> 20));
        }
        reply.extend_from_slice(&buf[..n]);
    }
}

/// A reply: its status line, then the output. Ok(output) for status 0.
fn parse_reply(reply: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(reply);
    let (status, out) = text.split_once('\n').ok_or("the JVM closed the connection without an answer")?;
    match status.trim().parse::<i32>() {
        Ok(0) => Ok(out.to_string()),
        Ok(n) => Err(format!(
            "the JVM answered status {n}: {}",
            out.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no message")
        )),
        Err(_) => Err(format!("not an attach reply: {:?}", status.chars().take(80).collect::<String>())),
    }
}

/// Why no command was run on a JVM that never became [`attachable`].
pub const NOT_ATTACHABLE: &str = "the JVM does not handle SIGQUIT (still starting, or run with -Xrs) and has no attach \
     listener: an attach request (SIGQUIT) would kill it, so none was sent";

/// Whether `pid` catches SIGQUIT (the `SigCgt` mask of /proc/PID/status).
pub fn catches_sigquit(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGQUIT - 1)) != 0)
}

/// Whether JVM `pid`'s attach listener is up: its socket is in its root, a socket its user owns.
pub fn listener_up(pid: u32) -> bool {
    let Ok(jvm) = Jvm::of(pid) else { return false };
    open_root(pid).is_ok_and(|root| matches!(find_socket(&root, &jvm), Ok(Some(_))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_parsed_by_status() {
        assert_eq!(parse_reply(b"0\n12345:\nnum #instances\n").unwrap(), "12345:\nnum #instances\n");
        let e = parse_reply(b"-1\njava.lang.IllegalArgumentException: Unknown diagnostic command\n").unwrap_err();
        assert!(e.contains("status -1") && e.contains("Unknown diagnostic command"), "{e}");
        assert!(parse_reply(b"").is_err());
        assert!(parse_reply(b"HTTP/1.1 200 OK\n").unwrap_err().starts_with("not an attach reply"));
    }

    #[test]
    fn a_reply_over_the_cap_or_the_deadline_is_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let w = std::thread::spawn(move || {
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..(MAX_REPLY >> 20) + 2 {
                if b.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let far = Instant::now() + Duration::from_secs(30);
        let left = move |w: &str| far.checked_duration_since(Instant::now()).ok_or_else(|| format!("{w}: timed out"));
        assert!(read_reply(&mut a, &left).unwrap_err().contains("over"));
        drop(a);
        w.join().unwrap();
        // A peer that says nothing and never closes: the deadline ends the read.
        let (mut a, _b) = UnixStream::pair().unwrap();
        let soon = Instant::now() + Duration::from_millis(300);
        let left = move |w: &str| {
            soon.checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| format!("{w}: timed out"))
        };
        let t = Instant::now();
        assert!(read_reply(&mut a, &left).unwrap_err().contains("timed out"));
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}
