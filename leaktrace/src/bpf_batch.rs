//! The BPF_MAP_*_BATCH commands of the bpf(2) system call, which aya 0.14 does not offer: one
//! system call for many map entries (writing unwind rows, reading every live block).

/// BPF_MAP_LOOKUP_BATCH: read up to `count` entries after the `in_batch` token.
pub const LOOKUP: libc::c_long = 24;
/// BPF_MAP_UPDATE_BATCH: write `count` entries.
pub const UPDATE: libc::c_long = 26;

/// The batch member of `union bpf_attr` (include/uapi/linux/bpf.h). Pointers are user
/// addresses; `count` is in/out (entries asked for / done).
#[repr(C)]
#[derive(Default)]
pub struct Attr {
    pub in_batch: u64,
    pub out_batch: u64,
    pub keys: u64,
    pub values: u64,
    pub count: u32,
    pub map_fd: u32,
    pub elem_flags: u64,
    pub flags: u64,
}

/// Run batch command `cmd` ([`LOOKUP`], [`UPDATE`]) with `attr`. Errors: the kernel's errno
/// (ENOENT from a lookup means the end of the map; EINVAL or ENOTSUPP an old kernel).
///
/// # Safety
/// `attr`'s pointers must be valid for `count` keys and values of the map's key and value
/// sizes (and, for a lookup, the tokens for the map's token size), alive across the call.
pub unsafe fn run(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<()> {
    // SAFETY: the caller guarantees what attr points at; the kernel reads size_of::<Attr>().
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, std::mem::size_of::<Attr>()) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}
