//! The stopped target's memory, read with process_vm_readv in 64 KiB chunks kept for the
//! census (objects sit together in pymalloc's arenas: one read serves hundreds of them), up
//! to a byte budget; past it, reads go straight to the target. Chunks are read within the
//! target's readable mappings (/proc/PID/maps, read once the target is stopped): an address
//! outside them (a word that only looks like a pointer: a float's bits, a hash) fails without
//! a system call. The census's object index lives here too ([`Mem::object`]): a slot per 16
//! bytes of each chunk kept.
//!
//! Measured on a heap of 1.02 M objects (pyenv 3.11; docs/benchmarks.md): 65 MiB read in about
//! a thousand reads; before the mappings were checked, the undecoded words of every float were
//! tried as pointers (a 64 KiB read each) and the index was a hash table of a million entries,
//! which made the pause 1.8–5.5 s.

use std::collections::HashMap;

const CHUNK: u64 = 64 << 10;

/// An FxHash-style hasher for addresses and small keys: the census does millions of lookups,
/// and SipHash's resistance to chosen keys buys nothing against the target's own addresses.
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        // The product's well-mixed high bits to the low ones, where the table picks its bucket
        // (addresses are multiples of 16: their product's low bits are not).
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
}

/// A `HashMap` with [`AddrHasher`].
pub type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<AddrHasher>>;

/// A read-through chunk cache of one process's memory.
pub struct Mem {
    pid: u32,
    /// Bytes standing for the target's memory at an address (the fuzz targets' input), in
    /// place of process_vm_readv: the walk is then a pure function of them.
    image: Option<(u64, Vec<u8>)>,
    /// Chunk base → index in `bufs`, or [`NO_CHUNK`] (unreadable).
    chunks: FastMap<u64, u32>,
    bufs: Vec<Box<[u8]>>,
    /// Per chunk of `bufs`: where its bytes start in the chunk (a mapping starting inside it).
    lo: Vec<u32>,
    /// Per chunk of `bufs`, the object index of each 16-byte-aligned address in it
    /// ([`Mem::object`]), allocated at the first object found there; `u32::MAX`: none.
    slots: Vec<Option<Box<[u32]>>>,
    /// Objects elsewhere (not 16-byte aligned, or in memory not kept).
    other: FastMap<u64, u32>,
    /// The last chunk used (base, index): most reads fall in the chunk of the one before.
    last: (u64, u32),
    /// Readable mappings [start, end), sorted (read from /proc/PID/maps at the first read, when
    /// the target is stopped); empty when it could not be read (then every address is tried).
    maps: Vec<(u64, u64)>,
    maps_read: bool,
    cached: usize,
    budget: usize,
    /// Bytes read from the target.
    pub bytes_read: u64,
    /// process_vm_readv calls made.
    pub reads: u64,
}

const NO_CHUNK: u32 = u32::MAX;

impl Mem {
    /// The memory of `pid`, keeping at most `budget` bytes of copies.
    pub fn new(pid: u32, budget: usize) -> Mem {
        Mem {
            pid,
            image: None,
            chunks: FastMap::default(),
            bufs: Vec::new(),
            lo: Vec::new(),
            slots: Vec::new(),
            other: FastMap::default(),
            last: (u64::MAX, NO_CHUNK),
            maps: Vec::new(),
            maps_read: false,
            cached: 0,
            budget,
            bytes_read: 0,
            reads: 0,
        }
    }

    /// A memory of `bytes` at `base` (one readable mapping), nothing else readable.
    pub fn image(base: u64, bytes: Vec<u8>, budget: usize) -> Mem {
        let mut m = Mem::new(0, budget);
        m.maps = vec![(base, base.saturating_add(bytes.len() as u64))];
        m.maps_read = true;
        m.image = Some((base, bytes));
        m
    }

    /// Read `out.len()` bytes at `addr` from the target (or the image): how many were read.
    fn read_target(&self, out: &mut [u8], addr: u64) -> usize {
        match &self.image {
            None => crate::reach::read_remote(self.pid, out, &[(addr, out.len())]),
            Some((base, bytes)) => {
                let at = addr.checked_sub(*base).and_then(|a| usize::try_from(a).ok()).unwrap_or(usize::MAX);
                let have = bytes.get(at..).unwrap_or(&[]);
                let n = have.len().min(out.len());
                out[..n].copy_from_slice(&have[..n]);
                n
            }
        }
    }

    fn load_maps(&mut self) {
        self.maps_read = true;
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) else { return };
        self.maps = text
            .lines()
            .filter_map(crate::procinfo::parse_maps_line)
            .filter(|m| m.perms.starts_with('r'))
            .map(|m| (m.start, m.end))
            .collect();
        self.maps.sort_unstable();
    }

    /// The readable mapping holding `addr`, when the mappings are known; (0, u64::MAX) when
    /// they are not.
    fn mapping(&mut self, addr: u64) -> Option<(u64, u64)> {
        if !self.maps_read {
            self.load_maps();
        }
        if self.maps.is_empty() {
            return Some((0, u64::MAX));
        }
        let k = self.maps.partition_point(|m| m.0 <= addr);
        let m = *self.maps.get(k.checked_sub(1)?)?;
        (addr < m.1).then_some(m)
    }

    /// Whether the `len` bytes at `addr` lie in one readable mapping of the target (a cheap
    /// test before reading memory a word merely points at).
    pub fn mapped(&mut self, addr: u64, len: u64) -> bool {
        self.mapping(addr).is_some_and(|m| addr.saturating_add(len) <= m.1)
    }

    fn remote(&mut self, out: &mut [u8], addr: u64) -> bool {
        self.reads += 1;
        let n = out.len();
        let ok = self.read_target(out, addr) == n;
        if ok {
            self.bytes_read += n as u64;
        }
        ok
    }

    /// The chunk at `base`: its index in `bufs`, or [`NO_CHUNK`].
    fn chunk(&mut self, base: u64) -> u32 {
        if self.last.0 == base {
            return self.last.1;
        }
        let i = match self.chunks.get(&base) {
            Some(&i) => i,
            None if self.cached + CHUNK as usize > self.budget => return NO_CHUNK,
            None => self.load(base),
        };
        self.last = (base, i);
        i
    }

    /// Copy `out.len()` bytes at `addr`; false when any of them cannot be read.
    pub fn read(&mut self, addr: u64, out: &mut [u8]) -> bool {
        // An address from the target near the top of the address space: nothing to read there.
        if addr.checked_add(out.len() as u64 + CHUNK).is_none() {
            return false;
        }
        let mut done = 0usize;
        while done < out.len() {
            let a = addr + done as u64;
            let base = a & !(CHUNK - 1);
            let off = (a - base) as usize;
            let n = (out.len() - done).min(CHUNK as usize - off);
            let i = self.chunk(base);
            let lo = self.lo.get(i as usize).map_or(0, |&l| l as usize);
            match self.bufs.get(i as usize) {
                Some(c) if off >= lo && off + n <= lo + c.len() => {
                    out[done..done + n].copy_from_slice(&c[off - lo..off - lo + n])
                }
                // Over budget, or not in the copy (a mapping starting or ending inside the
                // chunk): straight from the target.
                _ => {
                    if !self.mapped(a, n as u64) || !self.remote(&mut out[done..done + n], a) {
                        return false;
                    }
                }
            }
            done += n;
        }
        true
    }

    /// Read the chunk at `base`, within its mapping (a chunk across a mapping's start or end
    /// keeps the part in the mapping; reads outside it go to the target).
    fn load(&mut self, base: u64) -> u32 {
        let Some((start, end)) = self.mapping(base).or_else(|| {
            // The chunk's head is unmapped: a mapping may start inside it.
            let k = self.maps.partition_point(|m| m.0 <= base);
            self.maps.get(k).copied().filter(|m| m.0 < base.saturating_add(CHUNK))
        }) else {
            self.chunks.insert(base, NO_CHUNK);
            return NO_CHUNK;
        };
        let base_in = start.max(base);
        let len = (end.min(base.saturating_add(CHUNK)) - base_in) as usize;
        let mut buf = vec![0u8; len];
        self.reads += 1;
        let got = self.read_target(&mut buf, base_in);
        if got == 0 {
            self.chunks.insert(base, NO_CHUNK);
            return NO_CHUNK;
        }
        let got = got & !7;
        buf.truncate(got);
        self.bytes_read += got as u64;
        self.cached += got;
        self.bufs.push(buf.into_boxed_slice());
        self.slots.push(None);
        self.lo.push((base_in - base) as u32);
        let i = self.bufs.len() as u32 - 1;
        self.chunks.insert(base, i);
        i
    }
    /// The index recorded for the object at `addr` ([`Mem::set_object`]). Objects sit in the
    /// chunks read for them: a slot per 16 bytes of each chunk (pymalloc's and malloc's
    /// alignment) makes the lookup an array index, near the previous one in memory, in place
    /// of a probe into a table of a million entries.
    pub fn object(&mut self, addr: u64) -> Option<u32> {
        let slot = self.slot(addr);
        let v = match slot {
            Some((c, k)) => self.slots[c as usize].as_ref().map_or(NO_CHUNK, |s| s[k]),
            None => *self.other.get(&addr)?,
        };
        (v != NO_CHUNK).then_some(v)
    }

    /// Record `index` for the object at `addr`.
    pub fn set_object(&mut self, addr: u64, index: u32) {
        match self.slot(addr) {
            Some((c, k)) => {
                let s = self.slots[c as usize].get_or_insert_with(|| vec![NO_CHUNK; (CHUNK / 16) as usize].into());
                s[k] = index;
            }
            None => {
                self.other.insert(addr, index);
            }
        }
    }

    /// The chunk and slot of an object at `addr` (16-byte aligned, in a chunk kept).
    fn slot(&mut self, addr: u64) -> Option<(u32, usize)> {
        if addr & 15 != 0 {
            return None;
        }
        let base = addr & !(CHUNK - 1);
        let c = self.chunk(base);
        (c != NO_CHUNK).then_some((c, ((addr - base) / 16) as usize))
    }

    /// A little-endian word at `addr`.
    pub fn u64(&mut self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }

    /// `len` bytes at `addr`.
    pub fn bytes(&mut self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.read(addr, &mut b).then_some(b)
    }

    /// A NUL-terminated C string at `addr`, at most `max` bytes.
    pub fn cstr(&mut self, addr: u64, max: usize) -> Option<String> {
        let mut out = Vec::new();
        let mut b = [0u8; 1];
        while out.len() < max {
            if !self.read(addr.wrapping_add(out.len() as u64), &mut b) {
                return None;
            }
            if b[0] == 0 {
                break;
            }
            out.push(b[0]);
        }
        Some(String::from_utf8_lossy(&out).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapping that starts 4 KiB into a 64 KiB chunk, read through [`Mem`] from this
    /// process: its words come from one chunk read (one system call for many reads), the
    /// unmapped head fails without reading, and objects found there are indexed.
    #[test]
    fn chunk_starting_inside_a_mapping_gap() {
        let len = 4 * CHUNK as usize;
        // SAFETY: a fresh private anonymous mapping, unmapped below before the test ends.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let start = p as u64;
        let base = (start + CHUNK) & !(CHUNK - 1);
        let head = (base + 4096 - start) as usize;
        // SAFETY: [start, base + 4096) is inside the mapping made above.
        assert_eq!(unsafe { libc::munmap(p, head) }, 0);
        let data = (base + 4096) as *mut u64;
        for k in 0..64 {
            // SAFETY: the words written lie in the part of the mapping kept.
            unsafe { data.add(k).write(0x1000 + k as u64) };
        }
        let mut mem = Mem::new(std::process::id(), 1 << 20);
        assert_eq!(mem.u64(base + 4096), Some(0x1000));
        assert_eq!(mem.u64(base + 4096 + 8 * 63), Some(0x1000 + 63));
        assert_eq!(mem.reads, 1, "one chunk read serves both words");
        assert_eq!(mem.u64(base), None, "the unmapped head of the chunk");
        assert_eq!(mem.reads, 1, "an unmapped address is not read");
        assert!(mem.mapped(base + 4096, 16) && !mem.mapped(base, 8) && !mem.mapped(0x10, 8));
        mem.set_object(base + 4096 + 32, 7);
        mem.set_object(base + 4096 + 40, 8);
        assert_eq!((mem.object(base + 4096 + 32), mem.object(base + 4096 + 40)), (Some(7), Some(8)));
        assert_eq!(mem.object(base + 4096 + 48), None);
        // SAFETY: the rest of the mapping made above.
        assert_eq!(unsafe { libc::munmap((base + 4096) as *mut libc::c_void, len - head) }, 0);
    }
}
