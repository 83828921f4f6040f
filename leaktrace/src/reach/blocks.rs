//! The traced live blocks of one process, read from the kernel's block tables at scan time:
//! `BLOCKS` (the fast table, an array of `BlockBucket`: a block's process is its site's) and
//! `ALLOCS` (AllocKey{tgid, addr} → AllocInfo{size, site index}: blocks whose bucket was full),
//! with BPF_MAP_LOOKUP_BATCH (Linux 5.6+, a few hundred system calls for a million blocks), else
//! entry by entry.

use std::collections::HashMap;
use std::os::fd::AsFd as _;

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
    // SAFETY: BLOCKS is an array of BlockBucket (repr(C), the kernel side's value type) by u32
    // index, whose batch token is a u32 index.
    let batched = unsafe {
        crate::bpf_batch::lookup_all::<u32, BlockBucket, u32>(data.fd().as_fd(), 4096, |_, v| {
            v.iter().for_each(&mut take)
        })
    };
    match batched {
        Ok(true) => Ok(out),
        Ok(false) => {
            // No batched reads here: bucket by bucket.
            let a: aya::maps::Array<&aya::maps::MapData, BlockBucket> =
                aya::maps::Array::try_from(map).context("BLOCKS is not an array")?;
            for i in 0..a.len() {
                take(&a.get(&i, 0).context("reading the BLOCKS map")?);
            }
            Ok(out)
        }
        Err(e) => Err(e).context("reading the BLOCKS map"),
    }
}

/// BPF_MAP_LOOKUP_BATCH over the whole map; None when the kernel does not support it.
fn read_batched(map: &aya::maps::Map, tgid: u32, site: &dyn Fn(&AllocInfo) -> SiteKey) -> Option<Vec<Block>> {
    let aya::maps::Map::HashMap(data) = map else { return None };
    let mut out = Vec::new();
    // SAFETY: ALLOCS maps AllocKey to AllocInfo (repr(C), the kernel side's types); a hash map's
    // batch token is 4 bytes, which a u64 holds.
    let read = unsafe {
        crate::bpf_batch::lookup_all::<AllocKey, AllocInfo, u64>(data.fd().as_fd(), 8192, |keys, values| {
            for (k, v) in keys.iter().zip(values) {
                if k.tgid == tgid {
                    out.push(Block { addr: k.addr, size: v.size, site: site(v) });
                }
            }
        })
    };
    // (A later call failing loses the part read: the caller then reads entry by entry.)
    matches!(read, Ok(true)).then_some(out)
}
