//! A typed walk of a live Go heap from its package-level variables, read from outside
//! (`--heap-census`): each variable's value decoded with its DWARF type ([`super::dwarf`]),
//! pointers followed to the objects they point to — structures by their fields, slices (their
//! `cap` elements counted, their `len` elements walked), strings (their bytes, never read), maps
//! through the runtime's `hmap` and its buckets (the live slots of `buckets`, `oldbuckets` during
//! a growth and every overflow bucket; keys and values walked), channels' buffers, interfaces
//! through their type word (named by the type descriptor's `DW_AT_go_runtime_type`; the data
//! word is the value itself for a pointer-shaped type, `kindDirectIface`).
//!
//! Objects are told apart by address and counted once. Each object belongs to the one root that
//! reaches it, or to no root when two or more do ("shared"): a root's objects and bytes are
//! those reachable from it alone — what would be freed with it, its retained size at the level of
//! the roots (the roots' dominator tree, exactly). Bytes are the types' sizes (`cap` × element
//! for a slice's array, `len` for a string), not rounded up to the allocator's size classes.
//! Pointers into the executable's own image (its other variables, read-only data) are not
//! followed: they are not the heap.
//!
//! The process is not stopped: the reads (`/proc/PID/mem`, in 64 KiB chunks, each read once per
//! walk) race with the program; a map written meanwhile may be seen mid-growth (both bucket
//! arrays are walked and only live slots counted), and a root's entries are the runtime's own
//! `hmap.count`. Nothing is written to the target, every read is bounded, and the walk stops at
//! its budget ([`Budget`]: objects, bytes read, depth, time), saying so.

use std::collections::HashMap;
use std::os::unix::fs::FileExt as _;
use std::time::{Duration, Instant};

use leaktrace_analysis::holds::{GoRoot, GoWalk};

use super::dwarf::{MAX_TYPE_SIZE, NONE, Shape, TypeId, Types};
pub use super::dwarf::{Memory, is_program_root};
use super::stack::{StackRoots, Stacks};

/// Bytes of a chunk read from the target at once.
const CHUNK: u64 = 64 << 10;
/// A map's `B` believed at most (2^30 buckets).
const MAX_B: u8 = 30;
/// `hmap.flags`' `sameSizeGrow`.
const SAME_SIZE_GROW: u8 = 8;
/// Lowest `tophash` of a live slot (`minTopHash`).
const MIN_TOP_HASH: u8 = 5;
/// `_type.kind` (offset 23 in Go 1.19–1.22's `_type`) and its `kindDirectIface` bit.
const TYPE_KIND_OFFSET: u64 = 23;
const KIND_DIRECT_IFACE: u8 = 1 << 5;
/// No single root owns the object.
const SHARED: u32 = u32::MAX;
/// Roots kept in a snapshot (the largest; the others are in its totals).
pub const KEPT_ROOTS: usize = 100;

/// How far one walk may go.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub max_objects: u64,
    pub max_read_bytes: u64,
    pub max_depth: u32,
    pub time: Duration,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            max_objects: 4_000_000,
            max_read_bytes: 512 << 20,
            max_depth: 10_000_000,
            time: Duration::from_secs(3),
        }
    }
}

/// `/proc/PID/mem`, read in [`CHUNK`]s kept for the walk.
pub struct ProcMem {
    file: std::fs::File,
    chunks: AddrMap<Option<Box<[u8]>>>,
    read: u64,
}

impl ProcMem {
    pub fn open(pid: u32) -> Result<ProcMem, String> {
        let file = std::fs::File::open(format!("/proc/{pid}/mem")).map_err(|e| format!("/proc/PID/mem: {e}"))?;
        Ok(ProcMem { file, chunks: AddrMap::default(), read: 0 })
    }

    fn direct(&mut self, addr: u64, len: usize, out: &mut Vec<u8>) -> bool {
        out.clear();
        out.resize(len, 0);
        self.read += len as u64;
        self.file.read_exact_at(out, addr).is_ok()
    }
}

impl Memory for ProcMem {
    fn read(&mut self, addr: u64, len: usize, out: &mut Vec<u8>) -> bool {
        let end = addr.saturating_add(len as u64);
        if len as u64 > CHUNK / 2 || end == u64::MAX {
            return self.direct(addr, len, out);
        }
        out.clear();
        let mut at = addr;
        while at < end {
            let base = at & !(CHUNK - 1);
            if !self.chunks.contains_key(&base) {
                let mut buf = vec![0u8; CHUNK as usize];
                self.read += CHUNK;
                let ok = self.file.read_exact_at(&mut buf, base).is_ok();
                self.chunks.insert(base, ok.then(|| buf.into_boxed_slice()));
            }
            let Some(Some(c)) = self.chunks.get(&base) else { return self.direct(addr, len, out) };
            let (from, to) = ((at - base) as usize, (end.min(base + CHUNK) - base) as usize);
            out.extend_from_slice(&c[from..to]);
            at = base + CHUNK;
        }
        true
    }

    fn bytes_read(&self) -> u64 {
        self.read
    }
}

/// Hashes an address (the owner map's key) with one multiplication: SipHash was most of the
/// walk's time. Addresses are the target's to choose; colliding ones cost time, which the walk's
/// time budget bounds.
#[derive(Clone, Copy, Default)]
pub struct AddrHash(u64);

impl std::hash::Hasher for AddrHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type AddrMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<AddrHash>>;

/// One object to visit: `count` values of type `ty` at `addr` (the first `scan` walked), or
/// `count` bytes holding no pointers (`ty` [`NONE`]).
#[derive(Clone, Copy, Debug)]
struct Item {
    addr: u64,
    ty: TypeId,
    count: u64,
    scan: u64,
    shared: bool,
    depth: u32,
}

fn word(b: &[u8], at: u64) -> u64 {
    b.get(at as usize..(at as usize).saturating_add(8))
        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
}

/// The walk's state.
struct Walk<'a> {
    types: &'a Types,
    mem: &'a mut dyn Memory,
    bias: u64,
    /// The executable's image as loaded: pointers into it are not followed.
    image: (u64, u64),
    budget: Budget,
    started: Instant,
    owner: AddrMap<(u32, u64)>,
    roots: Vec<GoRoot>,
    shared: (u64, u64),
    stack: Vec<Item>,
    /// Type word → (dynamic type, data word is the value).
    dynamic: AddrMap<(TypeId, bool)>,
    cut: Option<String>,
    buf: Vec<u8>,
    /// The object being walked (kept between objects: one allocation per walk).
    object: Vec<u8>,
    /// Objects taken from the stack so far.
    visits: u64,
    /// Root name → index in `roots`.
    by_name: HashMap<String, u32>,
}

/// Walk the heap from `types`' package variables (`keep(name)`), then from the goroutines'
/// locals `stacks` ([`super::stack`]), `bias` added to link addresses; `image`: the
/// executable's loaded range.
pub fn walk(
    types: &Types,
    mem: &mut dyn Memory,
    bias: u64,
    image: (u64, u64),
    budget: Budget,
    keep: &dyn Fn(&str) -> bool,
    stacks: &StackRoots,
) -> GoWalk {
    let started = Instant::now();
    let mut w = Walk {
        types,
        mem,
        bias,
        image,
        budget,
        started,
        owner: AddrMap::default(),
        roots: Vec::new(),
        shared: (0, 0),
        stack: Vec::new(),
        dynamic: AddrMap::default(),
        cut: None,
        buf: Vec::new(),
        object: Vec::new(),
        visits: 0,
        by_name: HashMap::new(),
    };
    let mut unwalked = 0u64;
    for (name, addr, ty) in &types.variables {
        if !keep(name) || *types.shape(*ty) == Shape::NoPtr {
            continue;
        }
        if w.cut.is_some() {
            unwalked += 1;
            continue;
        }
        w.root(name, addr.wrapping_add(bias), *ty);
    }
    for l in &stacks.roots {
        if w.cut.is_some() {
            unwalked += 1;
            continue;
        }
        w.walk_root(&l.name, &l.value, l.ty, Some(&l.started_at));
    }
    let mut out = GoWalk {
        roots_walked: w.roots.len() as u64,
        objects: w.owner.len() as u64,
        bytes: w.owner.values().map(|v| v.1).sum(),
        shared_objects: w.shared.0,
        shared_bytes: w.shared.1,
        read_bytes: w.mem.bytes_read(),
        took_s: started.elapsed().as_secs_f64(),
        cut: w.cut.take().map(|c| if unwalked > 0 { format!("{c}; {unwalked} roots not walked") } else { c }),
        roots: std::mem::take(&mut w.roots),
        goroutines: stacks.goroutines,
        goroutines_running: stacks.running,
        frames: stacks.frames,
        no_stack_roots: None,
        cpu_s: 0.0,
    };
    out.roots.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    out.roots.truncate(KEPT_ROOTS);
    out
}

impl Walk<'_> {
    /// Walk one package variable at `addr` (as loaded).
    fn root(&mut self, name: &str, addr: u64, ty: TypeId) {
        let size = self.types.size(ty);
        let mut value = Vec::new();
        if size == 0 || !self.mem.read(addr, size as usize, &mut value) {
            return;
        }
        self.walk_root(name, &value, ty, None);
    }

    /// Walk a root's `value` of type `ty`: a package variable, or a goroutine's local (the
    /// goroutine's start function `started_at`); roots of the same name are one.
    fn walk_root(&mut self, name: &str, value: &[u8], ty: TypeId, started_at: Option<&str>) {
        let entries = self.entries(value, ty);
        let r = match self.by_name.get(name) {
            Some(&r) => r,
            None => {
                let r = self.roots.len() as u32;
                self.by_name.insert(name.to_string(), r);
                self.roots.push(GoRoot {
                    name: name.into(),
                    type_name: self.types.go_name(ty),
                    started_at: started_at.map(str::to_string),
                    ..Default::default()
                });
                r
            }
        };
        if let Some(root) = self.roots.get_mut(r as usize) {
            root.entries = match (root.entries, entries) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            };
            if started_at.is_some() {
                root.goroutines = Some(root.goroutines.unwrap_or(0) + 1);
            }
        }
        self.scan(value, 0, ty, false, 0);
        while let Some(it) = self.stack.pop() {
            if self.over_budget() {
                break;
            }
            self.visit(it, r);
        }
        self.stack.clear();
    }

    /// A map's `hmap.count`, a slice's `len`, a channel's `qcount`.
    fn entries(&mut self, value: &[u8], ty: TypeId) -> Option<u64> {
        match self.types.shape(ty).clone() {
            Shape::Slice(_) => Some(word(value, 8)),
            Shape::Ptr(h) => match self.types.shape(h) {
                Shape::Hash(l) => {
                    let (p, at) = (word(value, 0), l.count);
                    if p == 0 {
                        return Some(0);
                    }
                    self.mem.read(p.wrapping_add(at), 8, &mut self.buf).then(|| word(&self.buf, 0))
                }
                _ => None,
            },
            Shape::Chan { hchan, .. } => match self.types.shape(hchan) {
                Shape::Hchan { qcount, .. } => {
                    let (p, at) = (word(value, 0), *qcount);
                    (p != 0 && self.mem.read(p.wrapping_add(at), 8, &mut self.buf)).then(|| word(&self.buf, 0))
                }
                _ => None,
            },
            _ => None,
        }
    }

    fn over_budget(&mut self) -> bool {
        if self.cut.is_some() {
            return true;
        }
        self.visits += 1;
        let b = self.budget;
        let why = if self.owner.len() as u64 >= b.max_objects {
            format!("the walk stopped at {} objects", b.max_objects)
        } else if self.mem.bytes_read() >= b.max_read_bytes {
            format!("the walk stopped after reading {} MiB", b.max_read_bytes >> 20)
        } else if self.visits.is_multiple_of(4096) && self.started.elapsed() > b.time {
            format!("the walk stopped at its time budget ({:.1} s)", b.time.as_secs_f64())
        } else {
            return false;
        };
        self.cut = Some(format!("{why}: the counts are partial (a lower bound)"));
        true
    }

    /// Count object `it` to root `r` (or to no root, when another reached it first), then walk it.
    fn visit(&mut self, it: Item, r: u32) {
        let bytes = if it.ty == NONE { it.count } else { self.types.size(it.ty).saturating_mul(it.count) };
        if bytes > MAX_TYPE_SIZE {
            return;
        }
        let mut shared = it.shared;
        match self.owner.get_mut(&it.addr) {
            None => {
                let o = if shared { SHARED } else { r };
                self.owner.insert(it.addr, (o, bytes));
                self.count(o, 1, bytes as i64);
            }
            Some((o, _)) if *o == SHARED || (*o == r && !shared) => return,
            Some((o, b)) => {
                let (was, b) = (*o, *b);
                *o = SHARED;
                self.count(was, -1, -(b as i64));
                self.count(SHARED, 1, b as i64);
                shared = true;
            }
        }
        if it.ty == NONE || *self.types.shape(it.ty) == Shape::NoPtr || it.scan == 0 {
            return;
        }
        let size = self.types.size(it.ty);
        let len = size.saturating_mul(it.scan.min(it.count));
        let mut buf = std::mem::take(&mut self.object);
        if len > 0 && len <= MAX_TYPE_SIZE && self.mem.read(it.addr, len as usize, &mut buf) {
            for i in 0..it.scan.min(it.count) {
                self.scan(&buf, i * size, it.ty, shared, it.depth);
            }
        }
        self.object = buf;
    }

    fn count(&mut self, owner: u32, objects: i64, bytes: i64) {
        if owner == SHARED {
            self.shared.0 = self.shared.0.saturating_add_signed(objects);
            self.shared.1 = self.shared.1.saturating_add_signed(bytes);
        } else if let Some(root) = self.roots.get_mut(owner as usize) {
            root.objects = root.objects.saturating_add_signed(objects);
            root.bytes = root.bytes.saturating_add_signed(bytes);
        }
    }

    /// Queue the object at `addr` unless it is nil or in the executable's image.
    fn follow(&mut self, addr: u64, ty: TypeId, count: u64, scan: u64, shared: bool, depth: u32) {
        if addr < 4096 || (addr >= self.image.0 && addr < self.image.1) || count == 0 {
            return;
        }
        if depth >= self.budget.max_depth {
            self.cut.get_or_insert_with(|| format!("the walk stopped at depth {}", self.budget.max_depth));
            return;
        }
        self.stack.push(Item { addr, ty, count, scan, shared, depth: depth + 1 });
    }

    /// Walk the value of type `ty` at `b[at..]`, queueing what it points to.
    fn scan(&mut self, b: &[u8], at: u64, ty: TypeId, shared: bool, depth: u32) {
        let types = self.types;
        match types.shape(ty) {
            Shape::NoPtr | Shape::Hchan { .. } => {}
            Shape::Ptr(t) => self.follow(word(b, at), *t, 1, 1, shared, depth),
            Shape::Str => self.follow(word(b, at), NONE, word(b, at + 8), 0, shared, depth),
            Shape::Slice(elem) => {
                let (p, len, cap) = (word(b, at), word(b, at + 8), word(b, at + 16));
                if types.size(*elem) > 0 && cap <= MAX_TYPE_SIZE / types.size(*elem) {
                    self.follow(p, *elem, cap, len.min(cap), shared, depth);
                }
            }
            Shape::Iface { eface } => self.interface(b, at, *eface, shared, depth),
            Shape::Chan { hchan, elem } => {
                let p = word(b, at);
                let Shape::Hchan { dataqsiz, buf, .. } = types.shape(*hchan) else { return };
                self.follow(p, *hchan, 1, 1, shared, depth);
                if p < 4096 || !self.mem.read(p, types.size(*hchan) as usize, &mut self.buf) {
                    return;
                }
                let (n, data) = (word(&self.buf, *dataqsiz), word(&self.buf, *buf));
                if n > 0 && types.size(*elem) > 0 && n <= MAX_TYPE_SIZE / types.size(*elem) {
                    self.follow(data, *elem, n, n, shared, depth);
                }
            }
            Shape::Struct(fields) => {
                for &(off, t) in fields {
                    self.scan(b, at + off, t, shared, depth);
                }
            }
            Shape::Array { elem, count } => {
                let size = types.size(*elem);
                // A size of 0 is a forged type: nothing to walk.
                for i in 0..(*count).min((b.len() as u64).checked_div(size).map_or(0, |n| n + 1)) {
                    if at + i * size >= b.len() as u64 {
                        break;
                    }
                    self.scan(b, at + i * size, *elem, shared, depth);
                }
            }
            Shape::Hash(l) => {
                let flags = b.get((at + l.flags) as usize).copied().unwrap_or(0);
                let bits = b.get((at + l.b) as usize).copied().unwrap_or(0).min(MAX_B);
                let n = 1u64 << bits;
                self.follow(word(b, at + l.buckets), l.bucket, n, n, shared, depth);
                let old = if flags & SAME_SIZE_GROW != 0 { n } else { (n / 2).max(1) };
                self.follow(word(b, at + l.oldbuckets), l.bucket, old, old, shared, depth);
            }
            Shape::Bucket(l) => {
                for slot in 0..8u64 {
                    if b.get((at + l.tophash + slot) as usize).is_none_or(|&h| h < MIN_TOP_HASH) {
                        continue;
                    }
                    self.scan(b, at + l.keys + slot * l.key_size, l.key, shared, depth);
                    self.scan(b, at + l.values + slot * l.value_size, l.value, shared, depth);
                }
                self.follow(word(b, at + l.overflow), ty, 1, 1, shared, depth);
            }
        }
    }

    /// An interface at `b[at..]`: its dynamic type from the type word (`eface`) or the itab's
    /// `_type` (at 8), the data word walked as that type.
    fn interface(&mut self, b: &[u8], at: u64, eface: bool, shared: bool, depth: u32) {
        let (tw, data) = (word(b, at), word(b, at + 8));
        if tw < 4096 || data < 4096 {
            return;
        }
        let (dyn_ty, direct) = match self.dynamic.get(&tw) {
            Some(&d) => d,
            None => {
                let rtype = if eface {
                    tw
                } else if self.mem.read(tw + 8, 8, &mut self.buf) {
                    word(&self.buf, 0)
                } else {
                    0
                };
                let ty = self.types.runtime_type(rtype.wrapping_sub(self.bias));
                let direct = rtype != 0
                    && self.mem.read(rtype + TYPE_KIND_OFFSET, 1, &mut self.buf)
                    && self.buf[0] & KIND_DIRECT_IFACE != 0;
                self.dynamic.insert(tw, (ty, direct));
                (ty, direct)
            }
        };
        if dyn_ty == NONE {
            return;
        }
        if direct {
            self.scan(&data.to_le_bytes(), 0, dyn_ty, shared, depth);
        } else {
            self.follow(data, dyn_ty, 1, 1, shared, depth);
        }
    }
}

/// What the walk needs of one process's executable, read once.
pub struct Walker {
    types: Types,
    bias: u64,
    image: (u64, u64),
    /// The goroutines' frames (None: they cannot be unwound; `stacks_error` says why).
    stacks: Option<Stacks>,
    stacks_error: Option<String>,
}

impl Walker {
    /// Read process `pid`'s executable (through /proc/PID/exe); an error that says why no
    /// path can be walked (a stripped binary).
    pub fn new(pid: u32) -> Result<Walker, String> {
        use object::{Object as _, ObjectSegment as _};
        let data = std::fs::read(format!("/proc/{pid}/exe")).map_err(|e| format!("/proc/{pid}/exe: {e}"))?;
        let file = object::File::parse(&*data).map_err(|e| format!("not an ELF file: {e}"))?;
        let types = super::dwarf::read(&file)?;
        if types.variables.is_empty() {
            return Err("the executable's DWARF names no package variable".into());
        }
        let bias = if file.kind() == object::ObjectKind::Dynamic { super::dwarf::load_bias(pid, &file)? } else { 0 };
        let lo = file.segments().map(|s| s.address()).min().unwrap_or(0);
        let hi = file.segments().map(|s| s.address().saturating_add(s.size())).max().unwrap_or(0);
        let (stacks, stacks_error) = match Stacks::new(&file, &types) {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(format!("no goroutine-local roots: {e}"))),
        };
        Ok(Walker { types, bias, image: (lo.wrapping_add(bias), hi.wrapping_add(bias)), stacks, stacks_error })
    }

    /// One walk of process `pid`'s heap from its program's package variables and its
    /// goroutines' locals.
    pub fn walk(&self, pid: u32, budget: Budget) -> Result<GoWalk, String> {
        let cpu = thread_cpu_s();
        let mut mem = ProcMem::open(pid)?;
        let stacks = self.stacks.as_ref().map(|s| s.roots(&mut mem, self.bias, &self.types)).unwrap_or_default();
        let mut w = walk(&self.types, &mut mem, self.bias, self.image, budget, &is_program_root, &stacks);
        w.no_stack_roots.clone_from(&self.stacks_error);
        if let Some(c) = stacks.cut {
            w.cut = Some(w.cut.map_or(c.clone(), |w| format!("{w}; {c}")));
        }
        w.cpu_s = thread_cpu_s() - cpu;
        Ok(w)
    }
}

/// CPU time of the calling thread so far, seconds (CLOCK_THREAD_CPUTIME_ID; 0 if unreadable).
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which outlives the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::super::dwarf::{BucketLayout, HashLayout};
    use super::*;

    /// Regions of a fake target's memory.
    struct Fake(Vec<(u64, Vec<u8>)>, u64);

    impl Memory for Fake {
        fn read(&mut self, addr: u64, len: usize, out: &mut Vec<u8>) -> bool {
            self.1 += len as u64;
            let Some((base, b)) = self.0.iter().find(|(a, b)| addr >= *a && addr + len as u64 <= a + b.len() as u64)
            else {
                return false;
            };
            out.clear();
            out.extend_from_slice(&b[(addr - base) as usize..][..len]);
            true
        }

        fn bytes_read(&self) -> u64 {
            self.1
        }
    }

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// `main.a → X → Y`, `main.b → Y`, `main.m` (a map) → {Z, Y} beside an emptied slot.
    #[test]
    fn roots_retain_what_only_they_reach_and_maps_count_live_slots() {
        let names = [
            "int",
            "*main.node",
            "main.node",
            "[]uint8",
            "uint8",
            "map[int]*main.node",
            "hash<int,*main.node>",
            "bucket<int,*main.node>",
        ];
        let bucket = BucketLayout {
            tophash: 0,
            keys: 8,
            key: 0,
            key_size: 8,
            values: 72,
            value: 1,
            value_size: 8,
            overflow: 136,
        };
        let types = Types {
            names: names.iter().map(|s| s.to_string()).collect(),
            sizes: vec![8, 8, 32, 24, 1, 8, 48, 144],
            shapes: vec![
                Shape::NoPtr,
                Shape::Ptr(2),
                Shape::Struct(vec![(0, 1), (8, 3)]),
                Shape::Slice(4),
                Shape::NoPtr,
                Shape::Ptr(6),
                Shape::Hash(HashLayout { count: 0, flags: 8, b: 9, buckets: 16, oldbuckets: 24, bucket: 7 }),
                Shape::Bucket(bucket),
            ],
            by_runtime_type: HashMap::new(),
            variables: vec![
                ("main.a".into(), 0x1000, 1),
                ("main.b".into(), 0x1008, 1),
                ("main.m".into(), 0x1010, 5),
                ("runtime.x".into(), 0x1018, 1),
            ],
            types_range: (0, 0),
            by_die: HashMap::new(),
        };
        let mut b = vec![0u8; 144];
        b[0] = 5;
        b[1] = 1;
        b[2] = 7;
        b[72..80].copy_from_slice(&0x60000u64.to_le_bytes());
        b[80..88].copy_from_slice(&0x70000u64.to_le_bytes());
        b[88..96].copy_from_slice(&0x20000u64.to_le_bytes());
        let mut mem = Fake(
            vec![
                (0x1000, words(&[0x10000, 0x20000, 0x40000, 0x10000])),
                (0x10000, words(&[0x20000, 0x30000, 10, 16])),
                (0x20000, words(&[0, 0, 0, 0])),
                (0x40000, words(&[2, 0, 0x50000, 0, 0, 0])),
                (0x50000, b),
                (0x60000, words(&[0, 0, 0, 0])),
                (0x70000, words(&[0, 0, 0, 0])),
            ],
            0,
        );
        let w =
            walk(&types, &mut mem, 0, (0x1000, 0x2000), Budget::default(), &is_program_root, &StackRoots::default());
        assert_eq!(w.roots_walked, 3, "runtime.x is the runtime's");
        let root = |n: &str| w.roots.iter().find(|r| r.name == n).cloned().unwrap_or_default();
        let (a, bb, m) = (root("main.a"), root("main.b"), root("main.m"));
        assert_eq!((a.objects, a.bytes), (2, 32 + 16), "X and its 16-byte array");
        assert_eq!((bb.objects, bb.bytes), (0, 0), "Y is main.a's too");
        assert_eq!(
            (m.objects, m.bytes, m.entries),
            (3, 48 + 144 + 32, Some(2)),
            "hmap, bucket, Z; not the emptied slot's"
        );
        assert_eq!(m.type_name, "map[int]*main.node");
        assert_eq!((w.shared_objects, w.shared_bytes), (1, 32));
        assert_eq!((w.objects, w.bytes), (6, 48 + 32 + 224));
        assert!(w.cut.is_none());
        let small = Budget { max_objects: 2, ..Budget::default() };
        let w = walk(&types, &mut mem, 0, (0x1000, 0x2000), small, &is_program_root, &StackRoots::default());
        assert!(w.cut.as_deref().is_some_and(|c| c.contains("stopped at 2 objects")), "{:?}", w.cut);
    }
}
