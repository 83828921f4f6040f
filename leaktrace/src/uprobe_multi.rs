//! uprobe_multi links (Linux 6.6+), made through bpf(2) for the programs aya loaded: one link
//! places one program at many offsets of one file, for one process. aya 0.14 cannot create them
//! (its uprobes are perf events, one per offset); the programs are loaded for them with the
//! vendored `UProbe::load_multi` (vendor/aya/PATCH.md).
//!
//! Why: removing a uprobe waits for RCU grace periods. A perf-event uprobe is removed with its
//! own waits, one probe at a time; a uprobe_multi link unregisters all its offsets and then waits
//! once. Attaching is one system call per link instead of a perf_event_open and an ioctl per
//! offset.

use std::ffi::CString;
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::path::Path;

/// BPF_PROG_LOAD and BPF_LINK_CREATE commands of bpf(2).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
/// `bpf_prog_type::BPF_PROG_TYPE_KPROBE` (uprobe programs are of this type).
const BPF_PROG_TYPE_KPROBE: u32 = 2;
/// `bpf_attach_type::BPF_TRACE_UPROBE_MULTI`.
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_F_UPROBE_MULTI_RETURN`: the link's program runs at function return (a uretprobe).
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// Environment variable that forces single (perf-event) uprobes even where uprobe_multi links
/// work: `LEAKTRACE_SINGLE_UPROBES=1`. For tests of the fallback and for comparing the two.
pub const FORCE_SINGLE_ENV: &str = "LEAKTRACE_SINGLE_UPROBES";

/// The `link_create` member of `union bpf_attr` with its `uprobe_multi` part
/// (include/uapi/linux/bpf.h); 64 bytes, the rest of the union is zero.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
}

/// The first members of `union bpf_attr`'s BPF_PROG_LOAD part, up to `expected_attach_type`.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
    // SAFETY: attr is a repr(C) prefix of union bpf_attr for `cmd`, alive across the call; the
    // pointers in it (set by the callers) point at live buffers of the sizes they state.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: on success these commands return a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Create a uprobe_multi link running the program `prog_fd` (loaded with
/// `expected_attach_type = BPF_TRACE_UPROBE_MULTI`) at each of `offsets` (file offsets, bytes)
/// of the file at `path`, in process `pid` only; at function return if `ret`. The link is
/// removed when the returned descriptor is closed.
///
/// Errors: the kernel's errno (EINVAL for a program not loaded for uprobe_multi or an offset not
/// on an instruction boundary the kernel accepts, ESRCH for a PID gone, ENOENT/EBADF for a path).
pub fn attach(prog_fd: RawFd, path: &Path, offsets: &[u64], pid: u32, ret: bool) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let path =
        CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut attr = LinkCreate {
        prog_fd: prog_fd as u32,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cnt: offsets.len() as u32,
        multi_flags: if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
        pid,
        ..Default::default()
    };
    sys_bpf(BPF_LINK_CREATE, &mut attr)
}

/// Whether this kernel makes uprobe_multi links with a correct process filter, found as libbpf
/// does (`probe_uprobe_multi_link`): a two-instruction program loaded for uprobe_multi, then a
/// link on "/" (not a regular file) must fail with EBADF, and the same with PID -1 with EINVAL
/// (kernels whose first uprobe_multi filtered threads, not processes, answer ESRCH). Off also
/// when [`FORCE_SINGLE_ENV`] is set to anything but "0" or empty.
///
/// Returns Err with the reason when links cannot be used (for the log and the recording).
pub fn supported() -> Result<(), String> {
    if std::env::var(FORCE_SINGLE_ENV).is_ok_and(|v| !v.is_empty() && v != "0") {
        return Err(format!("{FORCE_SINGLE_ENV} is set"));
    }
    // r0 = 0; exit
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    let mut load = ProgLoad {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: 2,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: BPF_TRACE_UPROBE_MULTI,
        ..Default::default()
    };
    let prog = sys_bpf(BPF_PROG_LOAD, &mut load).map_err(|e| format!("loading a uprobe_multi program: {e}"))?;
    use std::os::fd::AsRawFd as _;
    let fd = prog.as_raw_fd();
    match attach(fd, Path::new("/"), &[0], 0, false) {
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
        Err(e) => return Err(format!("the kernel has no uprobe_multi links ({e})")),
        Ok(_) => return Err("the kernel accepted a uprobe_multi link on \"/\"".into()),
    }
    match attach(fd, Path::new("/"), &[0], u32::MAX, false) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(format!("this kernel's uprobe_multi links filter threads, not processes ({e})")),
        Ok(_) => Err("the kernel accepted a uprobe_multi link on \"/\"".into()),
    }
}
