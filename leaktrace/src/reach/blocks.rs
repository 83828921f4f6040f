//! The traced live blocks of one process, read from the kernel's block tables at scan time:
//! `BLOCKS` (the fast table, an array of `BlockBucket`: a block's process is its site's) and
//! `ALLOCS` (AllocKey{tgid, addr} → AllocInfo{size, site index}: blocks whose bucket was full),
//! with BPF_MAP_LOOKUP_BATCH (Linux 5.6+, a few hundred system calls for a million blocks), else
//! entry by entry.

use std::collections::HashMap;
use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::Context as _;
use leaktrace_common::{AllocInfo, AllocKey, BlockBucket, SiteKey};

/// The kernel maps that hold the traced live blocks (see the module's docs).
#[derive(Clone, Copy)]
pub struct LiveMaps<'a> {
    /// `BLOCKS`: an array of [`BlockBucket`].
    pub blocks: &'a aya::maps::Map,
    /// `ALLOCS`: AllocKey → AllocInfo.
    pub allocs: &'a aya::maps::Map,
}

/// One traced live block.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// Start address in the target.
    pub addr: u64,
    /// Requested size, bytes.
    pub size: u64,
    /// Its site (tgid as the kernel stored it).
    pub site: SiteKey,
}

/// Every live block of `tgid` in `maps`, sorted by address, its site found by its index in
/// `sites` (site index → `SiteKey`, from the SITES map; an index not there, which the kernel
/// never stores, gives the default key). A `BLOCKS` slot is `tgid`'s when its site is. Errors:
/// a map is not of its type, or the kernel refused both the batched and the per-entry read.
pub fn read(maps: LiveMaps<'_>, tgid: u32, sites: &HashMap<u32, SiteKey>) -> anyhow::Result<Vec<Block>> {
    let site = |i: &AllocInfo| sites.get(&i.index).copied().unwrap_or_default();
    let mut out = read_buckets(maps.blocks, tgid, &site)?;
    let map = maps.allocs;
    out.extend(match read_batched(map, tgid, &site) {
        Some(v) => v,
        None => {
            let h: aya::maps::HashMap<&aya::maps::MapData, AllocKey, AllocInfo> =
                aya::maps::HashMap::try_from(map).context("ALLOCS is not a hash map")?;
            let mut v = Vec::new();
            for item in h.iter() {
                match item {
                    Ok((k, i)) if k.tgid == tgid => v.push(Block { addr: k.addr, size: i.size, site: site(&i) }),
                    Ok(_) | Err(aya::maps::MapError::KeyNotFound) => {}
                    Err(e) => return Err(e).context("reading the ALLOCS map"),
                }
            }
            v
        }
    });
    out.sort_unstable_by_key(|b| b.addr);
    out.dedup_by_key(|b| b.addr);
    Ok(out)
}

/// The blocks of `tgid` in the `BLOCKS` array: occupied slots (tag not 0) whose site is the
/// process's. Batched (BPF_MAP_LOOKUP_BATCH, 4096 buckets a call), else bucket by bucket.
/// Errors: the map is not an array of buckets, or a read failed.
fn read_buckets(map: &aya::maps::Map, tgid: u32, site: &dyn Fn(&AllocInfo) -> SiteKey) -> anyhow::Result<Vec<Block>> {
    let mut out = Vec::new();
    let mut take = |b: &BlockBucket| {
        for s in &b.slots {
            if s.tag != 0 {
                let key = site(&s.info);
                if key.tgid == tgid {
                    out.push(Block { addr: s.addr, size: s.info.size, site: key });
                }
            }
        }
    };
    let aya::maps::Map::Array(data) = map else { anyhow::bail!("BLOCKS is not an array") };
    const CHUNK: usize = 4096;
    let fd = data.fd().as_fd().as_raw_fd() as u32;
    let mut keys = vec![0u32; CHUNK];
    let mut values = vec![BlockBucket::default(); CHUNK];
    let (mut token_in, mut token_out) = (0u32, 0u32);
    let mut first = true;
    loop {
        let mut attr = crate::bpf_batch::Attr {
            in_batch: if first { 0 } else { &mut token_in as *mut u32 as u64 },
            out_batch: &mut token_out as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd,
            ..Default::default()
        };
        // SAFETY: attr points at buffers of CHUNK keys (u32, the array's key) and values
        // (BlockBucket, repr(C), the map's value type) and at two 4-byte batch tokens (an
        // array's token is its u32 index), all alive across the call; the kernel writes at most
        // `count` of each.
        let r = unsafe { crate::bpf_batch::run(crate::bpf_batch::LOOKUP, &mut attr) };
        let errno = r.err().and_then(|e| e.raw_os_error()).unwrap_or(0);
        if errno != 0 && errno != libc::ENOENT {
            if !first {
                anyhow::bail!("reading the BLOCKS map: errno {errno}");
            }
            // No batched reads here: bucket by bucket.
            let a: aya::maps::Array<&aya::maps::MapData, BlockBucket> =
                aya::maps::Array::try_from(map).context("BLOCKS is not an array")?;
            for i in 0..a.len() {
                take(&a.get(&i, 0).context("reading the BLOCKS map")?);
            }
            return Ok(out);
        }
        for v in &values[..attr.count as usize] {
            take(v);
        }
        if errno == libc::ENOENT {
            return Ok(out);
        }
        token_in = token_out;
        first = false;
    }
}

/// BPF_MAP_LOOKUP_BATCH over the whole map; None when the kernel does not support it.
fn read_batched(map: &aya::maps::Map, tgid: u32, site: &dyn Fn(&AllocInfo) -> SiteKey) -> Option<Vec<Block>> {
    const CHUNK: usize = 8192;
    let aya::maps::Map::HashMap(data) = map else { return None };
    let fd = data.fd().as_fd().as_raw_fd() as u32;
    let mut keys = vec![AllocKey::default(); CHUNK];
    let mut values = vec![AllocInfo::default(); CHUNK];
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    let mut out = Vec::new();
    loop {
        let mut attr = crate::bpf_batch::Attr {
            in_batch: if first { 0 } else { &mut token_in as *mut u64 as u64 },
            out_batch: &mut token_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd,
            ..Default::default()
        };
        // SAFETY: attr points at buffers of CHUNK keys and values of the map's key and value
        // types (repr(C)) and at two 8-byte batch tokens (the hash map's token is 4 bytes), all
        // alive across the call; the kernel writes at most `count` of each.
        let r = unsafe { crate::bpf_batch::run(crate::bpf_batch::LOOKUP, &mut attr) };
        let errno = r.err().and_then(|e| e.raw_os_error()).unwrap_or(0);
        if errno != 0 && errno != libc::ENOENT {
            return None;
        }
        for i in 0..attr.count as usize {
            if keys[i].tgid == tgid {
                out.push(Block { addr: keys[i].addr, size: values[i].size, site: site(&values[i]) });
            }
        }
        if errno == libc::ENOENT {
            return Some(out);
        }
        token_in = token_out;
        first = false;
    }
}
