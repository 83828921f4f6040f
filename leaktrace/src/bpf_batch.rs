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

/// Read every entry of the map `fd` with [`LOOKUP`], `chunk` entries a call, handing each call's
/// keys and values (equal lengths) to `each`. Ok(false): the kernel refused the first call (no
/// batched lookups for this map or kernel) and nothing was handed over: the caller reads entry
/// by entry. Ok(true): the whole map was read. Errors: a later call failed (the kernel's errno);
/// `each` has then seen part of the map.
///
/// # Safety
/// `K` and `V` must be the map's key and value types (`repr(C)`, of its key and value sizes),
/// and `T` at least as large as its batch token (an array's is its u32 index, a hash map's a
/// 4-byte bucket number).
pub unsafe fn lookup_all<K: Default + Clone, V: Default + Clone, T: Default + Copy>(
    fd: std::os::fd::BorrowedFd<'_>,
    chunk: usize,
    mut each: impl FnMut(&[K], &[V]),
) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd as _;
    let mut keys = vec![K::default(); chunk];
    let mut values = vec![V::default(); chunk];
    let (mut token_in, mut token_out) = (T::default(), T::default());
    let mut first = true;
    loop {
        let mut attr = Attr {
            in_batch: if first { 0 } else { &raw mut token_in as u64 },
            out_batch: &raw mut token_out as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: attr points at buffers of `chunk` keys and values of the map's key and value
        // types and at two tokens at least the map's token size (the caller's guarantee), all
        // alive across the call; the kernel writes at most `count` of each.
        let r = unsafe { run(LOOKUP, &mut attr) };
        let end = match r {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(_) if first => return Ok(false),
            Err(e) => return Err(e),
        };
        let n = (attr.count as usize).min(chunk);
        each(&keys[..n], &values[..n]);
        if end {
            return Ok(true);
        }
        token_in = token_out;
        first = false;
    }
}

/// Read entries `0..n` of the array map `fd` (values of type `V`) with one [`LOOKUP`] call.
/// Ok(None): the kernel refused it (no batched lookups here); the caller reads entry by entry.
/// Errors: the kernel's errno on a later failure.
///
/// # Safety
/// `V` must be the array's value type (`repr(C)`, of its value size).
pub unsafe fn lookup_array_prefix<V: Default + Clone>(
    fd: std::os::fd::BorrowedFd<'_>,
    n: usize,
) -> std::io::Result<Option<Vec<V>>> {
    use std::os::fd::AsRawFd as _;
    let mut keys = vec![0u32; n];
    let mut values = vec![V::default(); n];
    let mut token_out = 0u32;
    let mut attr = Attr {
        in_batch: 0,
        out_batch: &raw mut token_out as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: n as u32,
        map_fd: fd.as_raw_fd() as u32,
        ..Default::default()
    };
    // SAFETY: attr points at `n` u32 keys and `n` values of the array's value type (the
    // caller's guarantee) and at a u32 token (an array's), all alive across the call.
    match unsafe { run(LOOKUP, &mut attr) } {
        // ENOENT: the array ended before `n` (it has fewer entries): `count` were read.
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(524)) => return Ok(None),
        Err(e) => return Err(e),
    }
    values.truncate((attr.count as usize).min(n));
    Ok(Some(values))
}
