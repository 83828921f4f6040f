//! Files read out of a target process: the one way the agent opens a path inside a target's
//! root (`/proc/PID/root`) or a file the target mapped (`/proc/PID/map_files`).
//!
//! A target's files, links and file types are the target's to forge: a containerised or chrooted
//! process can plant `…/serviceaccount/namespace -> /etc/shadow`, a FIFO at `/tmp/perf-PID.map`,
//! or `/dev/zero` where a library should be. Opened the plain way (`std::fs::read` of
//! `/proc/PID/root/...`), an absolute link resolves against the *agent's* root (the host file is
//! read into a label), a FIFO blocks the reading thread for good, and `/dev/zero` fills memory.
//! Here every open:
//!
//! - starts from a directory fd of `/proc/PID/root` and resolves the path with `openat2(2)` and
//!   `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`: `..` and absolute links stay inside the target's
//!   root, `/proc/self/...`-style magic links are refused; [`Links::None`] adds
//!   `RESOLVE_NO_SYMLINKS` (no link at all) and [`Links::NotLast`] `O_NOFOLLOW` (links in the
//!   directories, none as the file itself);
//! - opens `O_PATH` first (no open side effect of a device or FIFO), `fstat`s the result, and
//!   refuses anything but a regular file before the file is opened for reading (reopened through
//!   `/proc/self/fd/N`, `O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY`);
//! - reads at most a cap in bytes chosen per kind of file ([`caps`]): a larger file is an error
//!   ([`std::io::ErrorKind::FileTooLarge`]), never a partial read taken for the whole;
//! - has no fallback to the host path of the same name.
//!
//! Errors are `std::io::Error`s whose message names the path as the target sees it; the
//! kernel's own errors keep their kind (`PermissionDenied` for EPERM/EACCES, `NotFound`, ...)
//! so callers can tell "not there" from "not allowed". Sources: openat2(2), open(2) (O_PATH,
//! O_NOFOLLOW), proc(5) (`/proc/PID/root`, `/proc/PID/map_files`: opening an entry of the latter
//! needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN in the target's user namespace, see the
//! kernel's `proc_map_files_get_link`).

use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

/// Byte caps per kind of file read out of a target. A file larger than its cap is refused.
pub mod caps {
    /// A Kubernetes service account's namespace file (a namespace name is at most 63 bytes).
    pub const NAMESPACE: u64 = 4 << 10;
    /// Small text files of a runtime (a JDK's `release`).
    pub const SMALL_TEXT: u64 = 64 << 10;
    /// A JVM's hsperfdata file (64 KiB by default, `-XX:PerfDataMemorySize` raises it).
    pub const HSPERFDATA: u64 = 16 << 20;
    /// A JIT runtime's perf map (`/tmp/perf-PID.map`): one line per compiled function; a long
    /// Node run with `--perf-basic-prof` writes tens of MiB.
    pub const PERF_MAP: u64 = 256 << 20;
    /// An ELF object or its detached debug file read whole for its symbol tables.
    pub const ELF: u64 = 1 << 30;
}

/// Which symbolic links a path inside a target's root may go through. Every link resolves
/// inside the target's root (`RESOLVE_IN_ROOT`), never through a magic link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Links {
    /// Links anywhere on the path, the file itself included (a Kubernetes projected volume's
    /// `namespace -> ..data/namespace`, a library path through `/lib -> usr/lib`).
    InRoot,
    /// Links in the directories, not as the file itself (`O_NOFOLLOW`): files the runtime or
    /// leaktrace creates under a fixed name (`/tmp/perf-PID.map`, a heap dump).
    NotLast,
    /// No link at all (`RESOLVE_NO_SYMLINKS`).
    None,
}

/// A directory fd of `/proc/PID/root` (`O_PATH`): the target's root as the agent reaches it.
pub fn root_dir(pid: u32) -> io::Result<OwnedFd> {
    rustix::fs::open(format!("/proc/{pid}/root"), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| with_path(e.into(), pid, Path::new("/")))
}

/// `path` (as the target sees it, absolute or not) opened `O_PATH` inside `pid`'s root with
/// `links`: for callers that need a path to something that is not read (a UNIX socket to
/// connect to, through [`fd_path`]) or only its metadata. The file type is not checked.
pub fn open_path(pid: u32, path: &Path, links: Links) -> io::Result<OwnedFd> {
    let root = root_dir(pid)?;
    open_path_in(&root, pid, path, links)
}

fn open_path_in(root: &OwnedFd, pid: u32, path: &Path, links: Links) -> io::Result<OwnedFd> {
    let mut resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    match links {
        Links::InRoot => {}
        Links::NotLast => flags |= OFlags::NOFOLLOW,
        Links::None => {
            resolve |= ResolveFlags::NO_SYMLINKS;
            flags |= OFlags::NOFOLLOW;
        }
    }
    // A relative path is taken from the root, as an absolute one is under RESOLVE_IN_ROOT.
    let rel = path.strip_prefix("/").unwrap_or(path);
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    rustix::fs::openat2(root, rel, flags, Mode::empty(), resolve).map_err(|e| {
        // O_NOFOLLOW on a final link is ELOOP with O_PATH too; say what it was.
        let e: io::Error = e.into();
        with_path(e, pid, path)
    })
}

/// `/proc/self/fd/N` of an fd of this process: a path the kernel resolves to that very open
/// file (connect(2) to a socket opened `O_PATH`, or a reopen). Valid while `fd` is open.
pub fn fd_path(fd: &impl std::os::fd::AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The regular file `path` inside `pid`'s root, open for reading. Refused (an error naming the
/// type): FIFOs, sockets, devices, directories.
pub fn open(pid: u32, path: &Path, links: Links) -> io::Result<File> {
    let root = root_dir(pid)?;
    let fd = open_path_in(&root, pid, path, links)?;
    reopen_regular(fd, &format!("{path:?} in the root of process {pid}"))
}

/// The whole regular file `path` inside `pid`'s root, at most `cap` bytes (a larger file is a
/// `FileTooLarge` error).
pub fn read(pid: u32, path: &Path, links: Links, cap: u64) -> io::Result<Vec<u8>> {
    read_capped(open(pid, path, links)?, cap, &format!("{path:?} in the root of process {pid}"))
}

/// [`read`], as UTF-8 text (invalid bytes replaced).
pub fn read_to_string(pid: u32, path: &Path, links: Links, cap: u64) -> io::Result<String> {
    read(pid, path, links, cap).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The file process `pid` maps at `range` ("start-end" as in /proc/PID/maps; the entry name is
/// made the kernel's way by [`map_files_name`]), open for reading through
/// `/proc/PID/map_files`: the very file mapped, even deleted or replaced since, or a memfd.
/// `PermissionDenied` when the agent lacks CAP_CHECKPOINT_RESTORE/CAP_SYS_ADMIN; only regular
/// files (a memfd is one) are opened.
pub fn open_mapped(pid: u32, range: &str) -> io::Result<File> {
    let name = map_files_name(range);
    let path = format!("/proc/{pid}/map_files/{name}");
    let fd = rustix::fs::open(&path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
        if e == rustix::io::Errno::PERM {
            MAP_FILES_DENIED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        io::Error::from(e)
    })?;
    reopen_regular(fd, &path)
}

/// Whether an open of a `/proc/PID/map_files` entry was refused for want of a capability
/// (EPERM: the agent lacks CAP_CHECKPOINT_RESTORE and CAP_SYS_ADMIN), since this process started.
static MAP_FILES_DENIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What is lost when `/proc/PID/map_files` cannot be opened ([`map_files_denied`]): the note a
/// recording carries once.
pub const MAP_FILES_NOTE: &str = "/proc/PID/map_files could not be opened (EPERM: it needs \
    CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN): mapped objects were opened by their path inside the \
    target's root instead, so a library deleted or replaced after it was mapped and memfd \
    mappings are neither probed nor symbolized";

/// Whether an open through `/proc/PID/map_files` has been refused with EPERM in this process.
pub fn map_files_denied() -> bool {
    MAP_FILES_DENIED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The file process `mm` maps at `range` (a line of its maps with `dev` "major:minor" in hex
/// and `inode`): through `/proc/PID/map_files` ([`open_mapped`]), else, when that is not allowed
/// or not there, the mapped path inside the target's root ([`open`], links resolved there) only
/// while it is still that very file (same device and inode): a file replaced since is never read.
pub fn open_mapped_or_path(mm: u32, range: &str, path: &str, dev: &str, inode: u64) -> io::Result<File> {
    open_mapped(mm, range).or_else(|_| {
        let f = open(mm, Path::new(path.trim_end_matches(" (deleted)")), Links::InRoot)?;
        if same_file(&f, dev, inode) {
            Ok(f)
        } else {
            Err(io::Error::other(format!("{path}: a different file is at the mapped path now")))
        }
    })
}

/// Whether `f` is the file of a maps line's device ("fe:01", hex) and inode.
pub fn same_file(f: &File, dev: &str, inode: u64) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(m) = f.metadata() else { return false };
    let want = dev
        .split_once(':')
        .and_then(|(a, b)| Some((u32::from_str_radix(a, 16).ok()?, u32::from_str_radix(b, 16).ok()?)));
    want == Some((rustix::fs::major(m.dev()), rustix::fs::minor(m.dev()))) && m.ino() == inode
}

/// The name of a mapping's entry in `/proc/PID/map_files`: the kernel writes it `%lx-%lx`, hex
/// without leading zeros (`400000-401000`), whereas /proc/PID/maps pads to 8 digits
/// (`00400000-00401000`).
pub fn map_files_name(range: &str) -> String {
    let trim = |s: &str| {
        let t = s.trim_start_matches('0');
        if t.is_empty() { "0".to_string() } else { t.to_string() }
    };
    match range.split_once('-') {
        Some((a, b)) => format!("{}-{}", trim(a), trim(b)),
        None => range.to_string(),
    }
}

/// Whether the file open as `f` is owned by one of the user ids (real, effective, saved,
/// file system) of process `pid`, from /proc/PID/status. False when either cannot be read.
pub fn owned_by_process(f: &File, pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = f.metadata() else { return false };
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let Some(uids) = status.lines().find_map(|l| l.strip_prefix("Uid:")) else { return false };
    uids.split_whitespace().filter_map(|u| u.parse::<u32>().ok()).any(|u| u == meta.uid())
}

/// Reopen an `O_PATH` fd for reading once `fstat` says it is a regular file.
fn reopen_regular(fd: OwnedFd, shown: &str) -> io::Result<File> {
    let st = rustix::fs::fstat(&fd)?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{shown} is not a regular file ({})", type_name(kind)),
        ));
    }
    let file = rustix::fs::open(
        fd_path(&fd),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    // The reopened file is the same inode (a magic link to the O_PATH fd's file).
    let st2 = rustix::fs::fstat(&file)?;
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) {
        return Err(io::Error::other(format!("{shown} changed while it was opened")));
    }
    Ok(File::from(file))
}

/// All of `f`, at most `cap` bytes; a longer file is a `FileTooLarge` error.
pub fn read_capped(f: File, cap: u64, shown: &str) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    f.take(cap.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{shown} is larger than the {cap} bytes read of such a file"),
        ));
    }
    Ok(out)
}

fn type_name(kind: FileType) -> &'static str {
    match kind {
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Socket => "a socket",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        _ => "not a regular file",
    }
}

fn with_path(e: io::Error, pid: u32, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{path:?} in the root of process {pid}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A scratch directory this process reaches as "its own root" only through a path; the
    /// tests use their own pid (root /), so absolute links resolve against /, and check the
    /// rules that do not depend on a separate root: file types, caps, O_NOFOLLOW, names.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("leaktrace-target-fs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn map_files_names_have_no_leading_zeros() {
        assert_eq!(map_files_name("00400000-00401000"), "400000-401000");
        assert_eq!(map_files_name("7f0a12340000-7f0a12341000"), "7f0a12340000-7f0a12341000");
        assert_eq!(map_files_name("00000000-00001000"), "0-1000");
    }

    #[test]
    fn refuses_fifos_devices_and_oversized_files() {
        let me = std::process::id();
        let d = scratch("types");
        let fifo = d.join("perf.map");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        let t = std::time::Instant::now();
        let e = read(me, &fifo, Links::InRoot, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        let e = read(me, Path::new("/dev/zero"), Links::InRoot, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let big = d.join("big");
        std::fs::write(&big, vec![b'x'; 5000]).unwrap();
        assert_eq!(read(me, &big, Links::None, 5000).unwrap().len(), 5000);
        assert_eq!(read(me, &big, Links::None, 4999).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn links_by_mode() {
        let me = std::process::id();
        let d = scratch("links");
        std::fs::write(d.join("real"), "ns-a\n").unwrap();
        symlink(d.join("real"), d.join("link")).unwrap();
        symlink("/proc/self/exe", d.join("magic")).unwrap();
        assert_eq!(read_to_string(me, &d.join("link"), Links::InRoot, 100).unwrap(), "ns-a\n");
        assert!(read(me, &d.join("link"), Links::NotLast, 100).is_err());
        assert!(read(me, &d.join("link"), Links::None, 100).is_err());
        assert!(read(me, &d.join("real"), Links::None, 100).is_ok());
        // /proc/PID/exe is a magic link: refused.
        assert!(read(me, &d.join("magic"), Links::InRoot, 1 << 20).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A child chrooted into a scratch directory: an absolute link and `..` in its root resolve
    /// to its own files, never to the host's of the same name.
    #[test]
    fn links_resolve_inside_the_targets_root() {
        let d = scratch("chroot");
        std::fs::create_dir_all(d.join("etc")).unwrap();
        std::fs::create_dir_all(d.join("var/run")).unwrap();
        std::fs::write(d.join("etc/passwd"), "inside\n").unwrap();
        symlink("/etc/passwd", d.join("var/run/abs")).unwrap();
        symlink("../../../../../../etc/passwd", d.join("var/run/up")).unwrap();
        let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the child makes only async-signal-safe calls (chroot, pause, _exit).
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: a NUL-terminated path; the child never returns into the test harness.
            unsafe {
                libc::chroot(c.as_ptr());
                loop {
                    libc::pause();
                }
            }
        }
        let pid = child as u32;
        // Wait until the chroot is visible in /proc/PID/root.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{pid}/root")).ok().as_deref() != Some(d.as_path())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let abs = read_to_string(pid, Path::new("/var/run/abs"), Links::InRoot, 100);
        let up = read_to_string(pid, Path::new("var/run/up"), Links::InRoot, 100);
        let plain = read_to_string(pid, Path::new("/etc/passwd"), Links::None, 100);
        let no_links = read(pid, Path::new("/var/run/abs"), Links::None, 100);
        // SAFETY: our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(abs.unwrap(), "inside\n");
        assert_eq!(up.unwrap(), "inside\n");
        assert_eq!(plain.unwrap(), "inside\n");
        assert!(no_links.is_err());
    }
}
