//! The stopped target's memory, read with process_vm_readv in 64 KiB chunks kept for the
//! census (objects sit together in pymalloc's arenas: one read serves hundreds of them), up
//! to a byte budget; past it, reads go straight to the target.

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
    chunks: FastMap<u64, Option<Box<[u8]>>>,
    cached: usize,
    budget: usize,
    /// Bytes read from the target.
    pub bytes_read: u64,
}

impl Mem {
    /// The memory of `pid`, keeping at most `budget` bytes of copies.
    pub fn new(pid: u32, budget: usize) -> Mem {
        Mem { pid, chunks: FastMap::default(), cached: 0, budget, bytes_read: 0 }
    }

    /// Copy `out.len()` bytes at `addr`; false when any of them cannot be read.
    pub fn read(&mut self, addr: u64, out: &mut [u8]) -> bool {
        let mut done = 0usize;
        while done < out.len() {
            let a = addr + done as u64;
            let base = a & !(CHUNK - 1);
            let off = (a - base) as usize;
            let n = (out.len() - done).min(CHUNK as usize - off);
            if !self.chunks.contains_key(&base) {
                if self.cached + CHUNK as usize > self.budget {
                    // Over budget: straight from the target.
                    if crate::reach::read_remote(self.pid, &mut out[done..done + n], &[(a, n)]) < n {
                        return false;
                    }
                    self.bytes_read += n as u64;
                    done += n;
                    continue;
                }
                self.load(base);
            }
            match self.chunks.get(&base) {
                Some(Some(c)) if off + n <= c.len() => out[done..done + n].copy_from_slice(&c[off..off + n]),
                // Not in the copy (a mapping starting or ending inside the chunk): directly.
                _ => {
                    if crate::reach::read_remote(self.pid, &mut out[done..done + n], &[(a, n)]) < n {
                        return false;
                    }
                    self.bytes_read += n as u64;
                }
            }
            done += n;
        }
        true
    }

    /// Read the chunk at `base` (a short read keeps what was readable: the end of a mapping).
    fn load(&mut self, base: u64) {
        let mut buf = vec![0u8; CHUNK as usize];
        let got = crate::reach::read_remote(self.pid, &mut buf, &[(base, CHUNK as usize)]);
        if got == 0 {
            // Unmapped (or its head is): reads there fail.
            self.chunks.insert(base, None);
            return;
        }
        let got = got & !7;
        buf.truncate(got);
        self.bytes_read += got as u64;
        self.cached += got;
        self.chunks.insert(base, Some(buf.into_boxed_slice()));
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
            if !self.read(addr + out.len() as u64, &mut b) {
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
