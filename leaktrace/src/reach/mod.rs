//! `record --reachability`: which traced live blocks are still pointed at, and by what.
//!
//! At the end of a recording the target's threads are stopped ([`stop`]: ptrace seize +
//! interrupt, released on drop and by the kernel if the agent dies), the live blocks of the
//! process are read from the kernel's ALLOCS map ([`blocks`]), and memory is scanned
//! conservatively with process_vm_readv: every aligned 8-byte word of a root ([`roots`]: thread
//! registers and stacks, objects' writable data, heap memory that is no traced block) that
//! points into a traced block (start or interior) marks it; marked blocks are scanned the same
//! way, breadth first, so each block's recorded holder gives a shortest chain to a root. The
//! threads are resumed before anything is named ([`finish`]: sites, symbols). Nothing read from
//! the target leaves this module except addresses, sizes, offsets and symbol names. How it
//! works and what it cannot see: docs/reachability.md.

mod allocator;
pub mod arena_stats;
pub mod blocks;
mod descriptors;
mod frames;
pub mod roots;
pub mod stop;
mod symbols;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use leaktrace_common::SiteKey;

use blocks::Block;
use leaktrace_analysis::reachability::{Link, Reachability, SiteReach};
use leaktrace_analysis::system_libs::is_glibc;
use roots::{Region, RootKind};

/// Options of the scan.
#[derive(Clone, Copy, Debug)]
pub struct ScanOptions {
    /// Longest pause of the target: the scan stops there (marked so, `complete: false`) and the
    /// threads are resumed.
    pub max_pause: Duration,
    /// Also scan at every this many periodic checkpoints (`--reachability-every N`); None:
    /// only at the end.
    pub every: Option<u32>,
    /// The target is held at its teardown stop (libc `exit`'s entry): no thread's red zone is
    /// scanned (the words below a function's entry are dead), and the result says where it
    /// was taken.
    pub at_exit: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions { max_pause: Duration::from_secs(5), every: None, at_exit: false }
    }
}

/// Where the first pointer to a block was found.
#[derive(Clone, Copy, Debug)]
enum Origin {
    Register {
        tid: i32,
        reg: &'static str,
    },
    /// `ret`: the nearest return address below the slot, minus 1 (the call), or the thread's ip:
    /// names the frame that owns the slot.
    Stack {
        tid: i32,
        ret: u64,
    },
    Global {
        region: u32,
        addr: u64,
    },
    Untraced {
        region: &'static str,
        addr: u64,
    },
    Block {
        parent: u32,
        offset: u64,
    },
}

/// What the scan found, before naming (the target already runs again).
pub struct Scan {
    pid: u32,
    blocks: Vec<Block>,
    /// Per block: its holder (None: nothing points at it) and its depth (1 = held by a root).
    origin: Vec<Option<(Origin, u32)>>,
    regions: Vec<Region>,
    bases: HashMap<String, u64>,
    /// Data symbols of the objects, for naming globals (loaded with libc's before the stop).
    syms: symbols::Symbols,
    pause: Duration,
    threads: u32,
    complete: bool,
    notes: Vec<String>,
    root_bytes: u64,
    untraced_bytes: u64,
    block_bytes_scanned: u64,
}

/// Longest chain kept: the root, an elision, the links nearest the block.
const MAX_CHAIN: usize = 32;

/// Bytes read per process_vm_readv (roots in chunks, blocks in batches).
const CHUNK: usize = 4 << 20;

/// Most untraced memory kept in the agent during a scan (then blocks are read one batch at a
/// time instead): 1 GiB.
const COPY_BUDGET: usize = 1 << 30;

/// Sites of a process by their index (the kernel's SITES map read backwards).
pub type SiteIndex = std::collections::HashMap<u32, leaktrace_common::SiteKey>;

/// Stop `pid`, read its live blocks from `allocs` (the BLOCKS and ALLOCS maps; their sites by index from
/// what `sites` reads once the target is stopped, see [`blocks::read`]), scan, resume. The
/// target is resumed before this returns, whatever happened. Errors (one line): the process
/// cannot be stopped (gone, already traced), the block list or the sites cannot be read.
pub fn scan(
    pid: u32,
    allocs: blocks::LiveMaps<'_>,
    sites: &dyn Fn() -> anyhow::Result<SiteIndex>,
    opts: ScanOptions,
    allocator_mapped: &[(u64, u64)],
) -> anyhow::Result<Scan> {
    // Its memory through a live thread when the main thread has exited (procinfo::mm_task).
    let mm = crate::procinfo::mm_task(pid);
    // The objects' image ends are read from their files before the target is stopped.
    let maps_before = std::fs::read_to_string(format!("/proc/{mm}/maps")).unwrap_or_default();
    let image_ends = roots::image_ends(mm, &maps_before);
    // libc's `main_arena` (from its debug file when libc is stripped), read before the stop.
    let mut syms = symbols::Symbols::new(pid);
    let libc = libc_of(&maps_before);
    let main_arena = libc.as_ref().and_then(|(path, base)| syms.find(path, *base, "main_arena"));
    let pthread = libc.as_ref().and_then(|(path, base)| descriptors::pthread_fields(pid, mm, path, *base));
    // At exit: the thread held at `exit`'s entry is known by its instruction pointer.
    let exit_fn = libc
        .as_ref()
        .filter(|_| opts.at_exit)
        .and_then(|(path, base)| symbols::function_address(pid, path, *base, "exit"));
    // The sites are read before the stop; read again (while stopped) only when a live block's
    // site is newer than that read.
    let mut site_index = sites()?;
    let t0 = Instant::now();
    let stopped = stop::stop_all(pid, stop::wait_for(opts.max_pause), t0 + opts.max_pause + stop::HARD_MARGIN)?;
    let mut blocks = blocks::read(allocs, pid, &site_index)?;
    if blocks.iter().any(|b| b.site == SiteKey::default()) {
        site_index = sites()?;
        blocks = blocks::read(allocs, pid, &site_index)?;
    }
    let maps = std::fs::read_to_string(format!("/proc/{mm}/maps"))
        .map_err(|e| anyhow::anyhow!("cannot read /proc/{pid}/maps: {e}"))?;
    // A thread's stack is scanned from its stack pointer up; the 128-byte red zone below it
    // only for a thread interrupted in user code (a leaf function may keep live data there),
    // never at exit (the thread is at a function's entry: the words below are dead).
    let threads: Vec<roots::StoppedThread> = stopped
        .threads
        .iter()
        .map(|t| roots::StoppedThread {
            tid: t.tid,
            sp: t.regs.rsp,
            ip: t.regs.rip,
            red_zone: t.in_user_code() && !opts.at_exit,
        })
        .collect();
    let mut layout = roots::layout(&maps, &threads, &image_ends);
    roots::leave_out(&mut layout, allocator_mapped);
    allocator_and_descriptors(mm, &mut layout, main_arena.map(|(a, _)| a), pthread);
    let mut m = Marker::new(mm, &blocks, t0 + opts.max_pause, &layout.code);
    m.walk_frames(&stopped.threads, &maps);
    // A block reachable from several roots is retained by the first that reaches it: globals
    // (and everything reachable from them) first, then registers and stacks, then untraced
    // memory, so the retaining chain names the most telling root (a static array rather than a
    // stale word in the brk heap).
    let phase = |k: &roots::RootKind| match k {
        roots::RootKind::Global { .. } => 0,
        roots::RootKind::Stack { .. } => 1,
        roots::RootKind::Untraced { .. } => 2,
    };
    // The untraced memory is read (copied) first, without marking from it yet: the traced blocks
    // inside it are then scanned from the copy whichever round reaches them (a list of a million
    // nodes in the heap is one read, not a million).
    for r in layout.regions.iter().filter(|r| phase(&r.kind) == 2) {
        if m.out_of_time() {
            break;
        }
        m.copy_untraced(r);
    }
    for p in 0..3 {
        if p == 1 {
            m.mark_registers(&stopped.threads, exit_fn);
        }
        for (ri, r) in layout.regions.iter().enumerate().filter(|(_, r)| phase(&r.kind) == p) {
            if m.out_of_time() {
                break;
            }
            m.scan_region(ri as u32, r);
        }
        m.drain();
    }
    let pause_before_resume = t0.elapsed();
    let not_stopped = stopped.not_stopped.clone();
    let forced = stopped.resume();
    let pause = t0.elapsed().max(pause_before_resume);
    let mut notes = stop_notes(&not_stopped, forced, opts.max_pause);
    if opts.at_exit {
        notes.push(
            "scanned at the program's exit (held at the entry of libc `exit`, or of CPython's `Py_FinalizeEx`, before the teardown freed anything), as LeakSanitizer checks: each thread's stack from its stack pointer up, the frames of the exit path not scanned".to_string(),
        );
    }
    if m.timed_out {
        notes.push(format!(
            "the scan stopped at the pause cap ({} ms): blocks not reached by then are counted unreachable, so \"lost\" figures are not conclusive",
            opts.max_pause.as_millis()
        ));
    }
    if m.forced_reads > 0 {
        notes.push(format!(
            "{} block(s) in memory the program made inaccessible (mprotect PROT_NONE) were read through /proc/PID/mem",
            m.forced_reads
        ));
    }
    if m.read_errors > 0 {
        notes.push(format!("{} region(s) or block(s) could not be read (unmapped meanwhile)", m.read_errors));
    }
    let Marker { origin, root_bytes, untraced_bytes, block_bytes_scanned, timed_out, .. } = m;
    Ok(Scan {
        pid,
        threads: threads.len() as u32,
        blocks,
        origin,
        regions: layout.regions,
        bases: layout.bases,
        syms,
        pause,
        complete: !timed_out && not_stopped.is_empty() && !forced,
        notes,
        root_bytes,
        untraced_bytes,
        block_bytes_scanned,
    })
}

/// What the report says of threads that could not be stopped, and of a resume forced at the
/// hard deadline.
pub(crate) fn stop_notes(not_stopped: &[i32], forced: bool, max_pause: Duration) -> Vec<String> {
    let mut notes = Vec::new();
    if !not_stopped.is_empty() {
        let tids: Vec<String> = not_stopped.iter().map(i32::to_string).collect();
        notes.push(format!(
            "{} thread(s) could not be stopped within {} ms (blocked in the kernel, e.g. a vfork parent or a read of a hung file): thread(s) {} ran on during the scan and their registers and stacks were not scanned, so blocks only they hold may be counted unreachable",
            not_stopped.len(),
            stop::wait_for(max_pause).as_millis(),
            tids.join(", ")
        ));
    }
    if forced {
        notes.push(format!(
            "the target was resumed at the pause cap + {} ms while the scan still read its memory: the scan is not conclusive",
            stop::HARD_MARGIN.as_millis()
        ));
    }
    notes
}

/// glibc's path and load bias in /proc/PID/maps text (the object named libc.so.6 or libc-*.so:
/// [`is_glibc`]).
fn libc_of(maps: &str) -> Option<(String, u64)> {
    let lines = maps.lines().filter_map(crate::procinfo::parse_maps_line);
    let mut found: Option<(String, u64)> = None;
    for l in lines.filter(|l| is_glibc(&l.path)) {
        let b = l.start.saturating_sub(l.offset);
        match &mut found {
            Some((p, base)) if *p == l.path => *base = (*base).min(b),
            Some(_) => {}
            None => found = Some((l.path.clone(), b)),
        }
    }
    found
}

/// With the target stopped: the allocator's own data out of the roots (glibc's arenas:
/// [`allocator`]), and the thread descriptor at the top of each cached thread stack in
/// (glibc's stack cache keeps the exited threads' descriptors, which point at their DTVs;
/// not their argument and collected result: [`descriptors`]).
fn allocator_and_descriptors(
    mm: u32,
    layout: &mut roots::Layout,
    main_arena: Option<u64>,
    pthread: Option<descriptors::PthreadFields>,
) {
    let libc_data: Vec<(u64, Vec<u8>)> = layout
        .regions
        .iter()
        .filter(|r| matches!(&r.kind, RootKind::Global { path } if is_glibc(path)))
        .map(|r| {
            let len = (r.end - r.start) as usize;
            let mut b = vec![0u8; len];
            let n = read_remote(mm, &mut b, &[(r.start, len)]);
            b.truncate(n);
            (r.start, b)
        })
        .collect();
    let read = |p: u64| -> Option<u64> {
        for (s, b) in &libc_data {
            if p >= *s && p + 8 <= s + b.len() as u64 {
                let o = (p - s) as usize;
                return b[o..o + 8].try_into().ok().map(u64::from_ne_bytes);
            }
        }
        let mut w = [0u8; 8];
        (read_remote(mm, &mut w, &[(p, 8)]) == 8).then(|| u64::from_ne_bytes(w))
    };
    let spans: Vec<(u64, u64)> = libc_data.iter().map(|(s, b)| (*s, s + b.len() as u64)).collect();
    let arenas = allocator::glibc_arenas(&read, main_arena, &spans);
    layout.regions = allocator::subtract(std::mem::take(&mut layout.regions), &arenas);
    for &(start, end) in &layout.cached_stacks {
        let len = ((end - start) as usize).min(16 << 10);
        let mut top = vec![0u8; len];
        if read_remote(mm, &mut top, &[(end - len as u64, len)]) != len {
            continue;
        }
        if let Some((s, e)) = roots::descriptor_at_top(end, &top) {
            layout.regions.extend(descriptors::roots(s, e, &top, end - len as u64, pthread));
        }
    }
}

impl Scan {
    /// Traced live blocks found at the scan.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// How long the target was stopped.
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// Name everything (after the target was resumed): `names` gives a block's site as the
    /// recording's stack id with its culprit function, and the function at a code address.
    /// `t_s`: when the scan ran, seconds since the first checkpoint.
    pub fn finish(mut self, t_s: f64, names: &mut impl Names) -> Reachability {
        let mut n = Cached { names, by_key: HashMap::new() };
        let mut sites: std::collections::BTreeMap<u32, (SiteReach, Option<(u32, usize)>)> = Default::default();
        for (i, b) in self.blocks.iter().enumerate() {
            let (id, _) = n.site(b.site);
            let e = sites.entry(id).or_insert_with(|| (SiteReach { stack: id, ..Default::default() }, None));
            match self.origin[i] {
                Some((_, depth)) => {
                    e.0.reachable_blocks += 1;
                    e.0.reachable_bytes += b.size;
                    if e.1.is_none_or(|(d, _)| depth < d) {
                        e.1 = Some((depth, i));
                    }
                }
                None => {
                    e.0.unreachable_blocks += 1;
                    e.0.unreachable_bytes += b.size;
                }
            }
        }
        let mut syms = std::mem::replace(&mut self.syms, symbols::Symbols::new(self.pid));
        let mut out_sites = Vec::new();
        for (_, (mut s, rep)) in sites {
            if let Some((_, i)) = rep {
                s.retained_by = self.chain(i, &mut n, &mut syms);
            }
            out_sites.push(s);
        }
        Reachability {
            t_s,
            pause_ms: self.pause.as_secs_f64() * 1e3,
            threads: self.threads,
            complete: self.complete,
            notes: self.notes.clone(),
            blocks: self.blocks.len() as u64,
            block_bytes: self.blocks.iter().map(|b| b.size).sum(),
            root_bytes_scanned: self.root_bytes,
            untraced_bytes_scanned: self.untraced_bytes,
            block_bytes_scanned: self.block_bytes_scanned,
            sites: out_sites,
        }
    }

    /// The holders of block `i`, root first.
    fn chain<N: Names>(&self, i: usize, n: &mut Cached<'_, N>, syms: &mut symbols::Symbols) -> Vec<Link> {
        let mut rev = Vec::new();
        let mut cur = i;
        let mut root = None;
        while let Some((o, _)) = self.origin[cur] {
            match o {
                Origin::Block { parent, offset } => {
                    let (stack, f) = n.site(self.blocks[parent as usize].site);
                    rev.push(Link::Block { stack, site_function: f, offset });
                    cur = parent as usize;
                }
                other => {
                    root = Some(other);
                    break;
                }
            }
        }
        let mut links = Vec::new();
        if let Some(r) = root {
            links.push(match r {
                Origin::Register { tid, reg } => Link::Register { thread: tid as u32, register: reg.to_string() },
                Origin::Stack { tid, ret } => Link::Stack { thread: tid as u32, function: n.names.function(ret) },
                Origin::Untraced { region, addr } => Link::Untraced { region: region.to_string(), addr },
                Origin::Global { region, addr } => {
                    let path = match &self.regions[region as usize].kind {
                        RootKind::Global { path } => path.clone(),
                        _ => String::new(),
                    };
                    let base = self.bases.get(&path).copied().unwrap_or(0);
                    match syms.lookup(&path, base, addr) {
                        Some((symbol, offset)) => Link::Global { symbol: Some(symbol), offset, object: path },
                        None => Link::Global { symbol: None, offset: addr.saturating_sub(base), object: path },
                    }
                }
                // Followed in the loop above; never a root.
                Origin::Block { offset, .. } => Link::Untraced { region: "?".into(), addr: offset },
            });
        }
        rev.reverse();
        if rev.len() + links.len() > MAX_CHAIN {
            let keep = MAX_CHAIN - 2;
            let elided = rev.len() - keep;
            links.push(Link::Elided { links: elided as u64 });
            links.extend(rev.drain(elided..));
        } else {
            links.extend(rev);
        }
        links
    }
}

/// Names for the scan's findings, given by the recorder (it owns the stacks and the symbolizer).
pub trait Names {
    /// The recording's stack id of a kernel site key (tgid cleared) and its culprit function.
    fn site(&mut self, key: SiteKey) -> (u32, Option<String>);
    /// The function containing code address `ip`, if known.
    fn function(&mut self, ip: u64) -> Option<String>;
}

/// [`Names::site`] once per key.
struct Cached<'n, N: Names> {
    names: &'n mut N,
    by_key: HashMap<SiteKey, (u32, Option<String>)>,
}

impl<N: Names> Cached<'_, N> {
    fn site(&mut self, mut k: SiteKey) -> (u32, Option<String>) {
        k.tgid = 0;
        if let Some(v) = self.by_key.get(&k) {
            return v.clone();
        }
        let v = self.names.site(k);
        self.by_key.insert(k, v.clone());
        v
    }
}

/// The marking state: blocks by address, their holders, the work queue, counters.
struct Marker<'a> {
    pid: u32,
    starts: Vec<u64>,
    ends: Vec<u64>,
    lo: u64,
    hi: u64,
    origin: Vec<Option<(Origin, u32)>>,
    queue: VecDeque<u32>,
    deadline: Instant,
    timed_out: bool,
    code: &'a [(u64, u64)],
    read_errors: u64,
    /// Blocks read through /proc/PID/mem because the program made them inaccessible.
    forced_reads: u64,
    root_bytes: u64,
    untraced_bytes: u64,
    block_bytes_scanned: u64,
    buf: Vec<u8>,
    /// Copies of the untraced memory read as roots, (start, bytes) in address order: the
    /// traced blocks inside are scanned from them (one read of the heap, not one per block).
    cache: Vec<(u64, Vec<u8>)>,
    cache_bytes: usize,
    /// Code addresses already checked by [`Marker::is_return_address`].
    return_addresses: HashMap<u64, bool>,
    /// Each stopped thread's frames, by tid ([`frames::walk`]): they name a stack slot's frame.
    frames: HashMap<i32, frames::Frames>,
}

impl<'a> Marker<'a> {
    fn new(pid: u32, blocks: &[Block], deadline: Instant, code: &'a [(u64, u64)]) -> Self {
        let starts: Vec<u64> = blocks.iter().map(|b| b.addr).collect();
        let ends: Vec<u64> = blocks.iter().map(|b| b.addr.saturating_add(b.size.max(1))).collect();
        Marker {
            pid,
            lo: starts.first().copied().unwrap_or(u64::MAX),
            hi: ends.iter().copied().max().unwrap_or(0),
            starts,
            ends,
            origin: vec![None; blocks.len()],
            queue: VecDeque::new(),
            deadline,
            timed_out: false,
            code,
            read_errors: 0,
            forced_reads: 0,
            root_bytes: 0,
            untraced_bytes: 0,
            block_bytes_scanned: 0,
            buf: Vec::new(),
            cache: Vec::new(),
            cache_bytes: 0,
            return_addresses: HashMap::new(),
            frames: HashMap::new(),
        }
    }

    /// Walk each stopped thread's frames ([`frames::walk`]) with the unwind tables of the
    /// objects in `maps` (built on first use, during the pause).
    fn walk_frames(&mut self, threads: &[stop::Thread], maps: &str) {
        let mut rules = frames::Rules::new(self.pid, maps);
        let pid = self.pid;
        let mut read = |a: u64| {
            let mut b = [0u8; 8];
            (read_remote(pid, &mut b, &[(a, 8)]) == 8).then(|| u64::from_ne_bytes(b))
        };
        for t in threads {
            let f = frames::walk(t.regs.rip, t.regs.rsp, t.regs.rbp, &mut |pc| rules.rule(pc), &mut read);
            self.frames.insert(t.tid, f);
        }
    }

    fn out_of_time(&mut self) -> bool {
        if !self.timed_out && Instant::now() >= crate::stopping::cap(self.deadline) {
            self.timed_out = true;
        }
        self.timed_out
    }

    /// Mark from the threads' registers. A thread at `exit`'s entry (`exit_fn`, the scan at
    /// exit): the caller-saved registers are dead there (exit's one argument, %rdi, aside), and
    /// so are the vector registers.
    fn mark_registers(&mut self, threads: &[stop::Thread], exit_fn: Option<u64>) {
        for t in threads {
            let at_entry = exit_fn.is_some_and(|e| t.regs.rip >= e && t.regs.rip < e + 16);
            let regs = stop::pointer_registers(&t.regs)
                .into_iter()
                .filter(|(r, _)| !at_entry || stop::CALLEE_SAVED_AND_RDI.contains(r))
                .chain(if at_entry { Vec::new() } else { stop::vector_registers(t) });
            for (reg, v) in regs {
                self.root_bytes += 8;
                if let Some(i) = self.find(v) {
                    self.mark(i, Origin::Register { tid: t.tid, reg }, 0);
                }
            }
        }
    }

    /// The block that `p` points into (start or interior).
    #[inline]
    fn find(&self, p: u64) -> Option<usize> {
        if p < self.lo || p >= self.hi {
            return None;
        }
        let idx = self.starts.partition_point(|&a| a <= p);
        (idx > 0 && p < self.ends[idx - 1]).then(|| idx - 1)
    }

    fn mark(&mut self, i: usize, o: Origin, depth: u32) {
        if self.origin[i].is_none() {
            self.origin[i] = Some((o, depth + 1));
            self.queue.push_back(i as u32);
        }
    }

    /// Read [addr, addr + len) into `self.buf`; the bytes read (a short read stops at the
    /// first unreadable page).
    fn read(&mut self, addr: u64, len: usize) -> usize {
        self.buf.resize(len, 0);
        read_remote(self.pid, &mut self.buf, &[(addr, len)])
    }

    fn is_code(&self, w: u64) -> bool {
        let i = self.code.partition_point(|&(s, _)| s <= w);
        i > 0 && w < self.code[i - 1].1
    }

    /// `w` is a return address: it is in code and the instruction before it is a call (so a
    /// function pointer or a stale code address in a frame does not name the frame above it).
    fn is_return_address(&mut self, w: u64) -> bool {
        if !self.is_code(w) || w < 7 {
            return false;
        }
        if let Some(&known) = self.return_addresses.get(&w) {
            return known;
        }
        let mut b = [0u8; 7];
        let ok = read_remote(self.pid, &mut b, &[(w - 7, 7)]) == 7 && follows_call(&b);
        self.return_addresses.insert(w, ok);
        ok
    }

    /// Read an untraced region into [`Marker::cache`] chunk by chunk (up to [`COPY_BUDGET`] in
    /// all), without marking from it: [`Marker::scan_region`] marks from the copy later.
    fn copy_untraced(&mut self, r: &Region) {
        let mut addr = r.start & !7;
        while addr < r.end && self.cache_bytes < COPY_BUDGET {
            if self.out_of_time() {
                return;
            }
            let len = ((r.end - addr) as usize).min(CHUNK).min(COPY_BUDGET - self.cache_bytes);
            let n = self.read(addr, len) & !7;
            if n == 0 {
                self.read_errors += 1;
                addr = (addr | 0xfff) + 1;
                continue;
            }
            let mut b = std::mem::take(&mut self.buf);
            b.truncate(n);
            self.cache_bytes += n;
            self.cache.push((addr, b));
            addr += n as u64;
        }
    }

    /// The copy of untraced memory starting exactly at `addr` ([`Marker::copy_untraced`]).
    fn cached_chunk(&self, addr: u64) -> Option<usize> {
        self.cache.binary_search_by_key(&addr, |c| c.0).ok()
    }

    /// Scan one root region, chunk by chunk; untraced regions skip the traced blocks in them
    /// and are scanned from their copy when [`Marker::copy_untraced`] made one.
    fn scan_region(&mut self, ri: u32, r: &Region) {
        let mut addr = r.start & !7;
        // Stack: the walked frame holding the slot names it; above the walked frames, the
        // nearest return address seen so far below the slot.
        let mut last_code = match r.kind {
            RootKind::Stack { ip, .. } => ip,
            _ => 0,
        };
        let walked = match r.kind {
            RootKind::Stack { tid, .. } => self.frames.get(&tid).cloned(),
            _ => None,
        };
        let mut past_walk = false;
        let skip_blocks = matches!(r.kind, RootKind::Untraced { .. });
        // First block ending above the region's start.
        let mut j = self.ends.partition_point(|&e| e <= addr);
        while addr < r.end {
            if self.out_of_time() {
                return;
            }
            let copied = if skip_blocks { self.cached_chunk(addr) } else { None };
            let (n, buf) = match copied {
                Some(k) => (self.cache[k].1.len(), std::mem::take(&mut self.cache[k].1)),
                None => {
                    let len = ((r.end - addr) as usize).min(CHUNK);
                    let n = self.read(addr, len) & !7;
                    if n == 0 {
                        self.read_errors += 1;
                        // Skip the unreadable page.
                        addr = (addr | 0xfff) + 1;
                        continue;
                    }
                    (n, std::mem::take(&mut self.buf))
                }
            };
            let mut off = 0usize;
            while off < n {
                let w_addr = addr + off as u64;
                if skip_blocks {
                    while j < self.starts.len() && self.ends[j] <= w_addr {
                        j += 1;
                    }
                    if j < self.starts.len() && self.starts[j] <= w_addr {
                        // Inside a traced block: jump past it (aligned up).
                        let next = (self.ends[j] + 7) & !7;
                        off = (next - addr) as usize;
                        continue;
                    }
                    self.untraced_bytes += 8;
                } else {
                    self.root_bytes += 8;
                }
                let w = u64::from_ne_bytes(buf[off..off + 8].try_into().unwrap_or_default());
                let in_walk = match walked.as_ref().filter(|_| !past_walk).map(|f| (f.pc_at(w_addr), f.rest)) {
                    Some((Some(pc), _)) => {
                        last_code = pc;
                        true
                    }
                    Some((None, rest)) => {
                        last_code = rest;
                        past_walk = true;
                        false
                    }
                    None => false,
                };
                if let Some(i) = self.find(w) {
                    let o = match r.kind {
                        RootKind::Stack { tid, .. } => Origin::Stack { tid, ret: last_code },
                        RootKind::Global { .. } => Origin::Global { region: ri, addr: w_addr },
                        RootKind::Untraced { region } => Origin::Untraced { region, addr: w_addr },
                    };
                    self.mark(i, o, 0);
                } else if matches!(r.kind, RootKind::Stack { .. }) && !in_walk && self.is_return_address(w) {
                    // The call instruction's last byte: a call that does not return (`exit` at
                    // the end of main) has its return address past the caller's end.
                    last_code = w - 1;
                }
                off += 8;
            }
            if let Some(k) = copied {
                // Put the copy back.
                self.cache[k].1 = buf;
            } else if skip_blocks && self.cache_bytes + n <= COPY_BUDGET {
                // Keep the copy: the traced blocks in it are scanned from it if reached.
                let mut b = buf;
                b.truncate(n);
                self.cache_bytes += n;
                let at = self.cache.partition_point(|c| c.0 < addr);
                self.cache.insert(at, (addr, b));
            } else {
                self.buf = buf;
            }
            addr += n as u64;
        }
    }

    /// Scan the marked blocks, breadth first, in batches of one process_vm_readv.
    /// Blocks inside the untraced memory already read are scanned from that copy; the others
    /// are read in batches.
    fn drain(&mut self) {
        // The copies (sorted by address) stay for the next round.
        let mut cache = std::mem::take(&mut self.cache);
        cache.sort_unstable_by_key(|c| c.0);
        self.drain_with(&cache);
        self.cache = cache;
    }

    fn drain_with(&mut self, cache: &[(u64, Vec<u8>)]) {
        let cached = |s: u64, len: usize| -> Option<&[u8]> {
            let k = cache.partition_point(|c| c.0 <= s).checked_sub(1)?;
            let (start, data) = &cache[k];
            let off = (s - start) as usize;
            data.get(off..off + len)
        };
        let mut batch: Vec<(u32, u64, usize)> = Vec::new();
        while !self.queue.is_empty() {
            if self.out_of_time() {
                return;
            }
            batch.clear();
            let mut total = 0usize;
            let mut from_copy = 0u32;
            while let Some(&i) = self.queue.front() {
                let len = (self.ends[i as usize] - self.starts[i as usize]) as usize & !7;
                if let Some(bytes) = cached(self.starts[i as usize], len) {
                    self.queue.pop_front();
                    self.scan_block(i, 0, bytes);
                    from_copy += 1;
                    if from_copy >= 1 << 16 {
                        break; // time to look at the clock
                    }
                    continue;
                }
                if !batch.is_empty() && (total + len > CHUNK || batch.len() >= 1024) {
                    break;
                }
                self.queue.pop_front();
                batch.push((i, self.starts[i as usize], len));
                total += len;
            }
            if batch.is_empty() {
                continue;
            }
            if total > CHUNK {
                // One large block: in chunks.
                let (i, start, len) = batch[0];
                let mut off = 0;
                while off < len {
                    if self.out_of_time() {
                        return;
                    }
                    let n = (len - off).min(CHUNK);
                    let mut got = self.read(start + off as u64, n) & !7;
                    if got < n {
                        let mut b = std::mem::take(&mut self.buf);
                        got = read_forced(self.pid, &mut b[..n], start + off as u64) & !7;
                        self.buf = b;
                        if got == n {
                            self.forced_reads += 1;
                        }
                    }
                    let buf = std::mem::take(&mut self.buf);
                    self.scan_block(i, off as u64, &buf[..got]);
                    self.buf = buf;
                    if got < n {
                        self.read_errors += 1;
                        break;
                    }
                    off += n;
                }
                continue;
            }
            self.buf.resize(total, 0);
            let iov: Vec<(u64, usize)> = batch.iter().map(|&(_, s, l)| (s, l)).collect();
            let mut buf = std::mem::take(&mut self.buf);
            let got = read_remote(self.pid, &mut buf, &iov);
            if got < total {
                // A block became unreadable: read them one by one.
                let mut pos = 0;
                for &(i, s, l) in &batch {
                    let mut n = read_remote(self.pid, &mut buf[pos..pos + l], &[(s, l)]) & !7;
                    if n < l {
                        // Made inaccessible (mprotect PROT_NONE)? Still there: read it forced.
                        n = read_forced(self.pid, &mut buf[pos..pos + l], s) & !7;
                        if n == l {
                            self.forced_reads += 1;
                        } else {
                            self.read_errors += 1;
                        }
                    }
                    self.scan_block(i, 0, &buf[pos..pos + n]);
                    pos += l;
                }
            } else {
                let mut pos = 0;
                for &(i, _, l) in &batch {
                    self.scan_block(i, 0, &buf[pos..pos + l]);
                    pos += l;
                }
            }
            self.buf = buf;
        }
    }

    fn scan_block(&mut self, i: u32, base_off: u64, bytes: &[u8]) {
        let depth = self.origin[i as usize].map_or(0, |(_, d)| d);
        self.block_bytes_scanned += bytes.len() as u64;
        for (k, c) in bytes.chunks_exact(8).enumerate() {
            let w = u64::from_ne_bytes(c.try_into().unwrap_or_default());
            if let Some(t) = self.find(w) {
                self.mark(t, Origin::Block { parent: i, offset: base_off + 8 * k as u64 }, depth);
            }
        }
    }
}

/// The 7 bytes `b` before an address end with an x86-64 call instruction: `e8 rel32`, or `ff /2`
/// (an optional REX prefix, then ModRM with reg = 2) with its register, memory, disp8, SIB,
/// disp32 or rip-relative operand.
fn follows_call(b: &[u8; 7]) -> bool {
    let ff2 = |at: usize, len: usize| {
        let m = b[at + 1];
        if b[at] != 0xff || (m >> 3) & 7 != 2 {
            return false;
        }
        let (md, rm) = (m >> 6, m & 7);
        let sib = usize::from(md != 3 && rm == 4);
        let disp = match md {
            0 if rm == 5 => 4,
            0 => 0,
            1 => 1,
            2 => 4,
            _ => 0,
        };
        let disp = if md == 0 && rm == 4 && b.get(at + 2).is_some_and(|s| s & 7 == 5) { 4 } else { disp };
        2 + sib + disp == len
    };
    // (A REX prefix before `ff` changes nothing after it.)
    b[2] == 0xe8 || (1..=5).any(|at| ff2(at, 7 - at))
}

/// Read `buf.len()` bytes at `addr` through /proc/PID/mem, which reads pages the program made
/// inaccessible (PROT_NONE: the kernel's forced access for a tracer) that process_vm_readv
/// refuses; the bytes read (0 on error).
fn read_forced(pid: u32, buf: &mut [u8], addr: u64) -> usize {
    use std::os::unix::fs::FileExt as _;
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/mem")) else { return 0 };
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], addr + done as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => done += n,
        }
    }
    done
}

/// process_vm_readv of the remote ranges `iov` (at most 1024) into `buf` (laid end to end);
/// returns the bytes read (0 on error).
pub(crate) fn read_remote(pid: u32, buf: &mut [u8], iov: &[(u64, usize)]) -> usize {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote: Vec<libc::iovec> =
        iov.iter().map(|&(a, l)| libc::iovec { iov_base: a as usize as *mut libc::c_void, iov_len: l }).collect();
    // SAFETY: the local iovec covers `buf`, which outlives the call; remote addresses are only
    // read by the kernel in the target's address space.
    let r = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, remote.as_ptr(), remote.len() as _, 0) };
    if r < 0 { 0 } else { r as usize }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls recognised before a return address; other code bytes are not.
    #[test]
    fn return_addresses_follow_calls() {
        let pad = |tail: &[u8]| {
            let mut b = [0x90u8; 7];
            b[7 - tail.len()..].copy_from_slice(tail);
            b
        };
        assert!(follows_call(&pad(&[0xe8, 1, 2, 3, 4]))); // call rel32
        assert!(follows_call(&pad(&[0xff, 0xd0]))); // call *%rax
        assert!(follows_call(&pad(&[0x41, 0xff, 0xd4]))); // call *%r12
        assert!(follows_call(&pad(&[0xff, 0x15, 1, 2, 3, 4]))); // call *rip+disp32
        assert!(follows_call(&pad(&[0xff, 0x50, 0x08]))); // call *8(%rax)
        assert!(follows_call(&pad(&[0xff, 0x54, 0x24, 0x08]))); // call *8(%rsp)
        assert!(!follows_call(&pad(&[0xc3]))); // ret: a function start after it
        assert!(!follows_call(&[0xcc; 7])); // int3 padding
        assert!(!follows_call(&pad(&[0xff, 0xe0]))); // jmp *%rax
    }

    /// Marking on this process's own memory: a root points into the interior of block A, A
    /// points at B's start, C is pointed at by nothing; an untraced region's words inside a
    /// traced block are skipped.
    #[test]
    fn marks_through_interior_pointers_and_skips_blocks_in_untraced_memory() {
        let b: Box<[u64; 4]> = Box::new([7, 7, 7, 7]);
        let c: Box<[u64; 4]> = Box::new([9, 9, 9, 9]);
        let a: Box<[u64; 4]> = Box::new([1, 2, &*b as *const _ as u64, 3]);
        let root: Box<[u64; 2]> = Box::new([0, &a[1] as *const u64 as u64]);
        let addr = |x: &[u64; 4]| x as *const _ as u64;
        let mut blocks: Vec<Block> = [addr(&a), addr(&b), addr(&c)]
            .into_iter()
            .map(|p| Block { addr: p, size: 32, site: SiteKey::default() })
            .collect();
        blocks.sort_by_key(|x| x.addr);
        let idx = |p: u64| blocks.iter().position(|x| x.addr == p).unwrap();
        let code = [];
        let mut m = Marker::new(std::process::id(), &blocks, Instant::now() + Duration::from_secs(10), &code);
        let r = &*root as *const _ as u64;
        m.scan_region(0, &Region { start: r, end: r + 16, kind: RootKind::Global { path: String::new() } });
        m.drain();
        assert!(matches!(m.origin[idx(addr(&a))], Some((Origin::Global { .. }, 1))));
        assert!(matches!(m.origin[idx(addr(&b))], Some((Origin::Block { offset: 16, .. }, 2))));
        assert!(m.origin[idx(addr(&c))].is_none());
        assert_eq!(m.block_bytes_scanned, 64);

        // Untraced memory covering block A only: A's own words (pointing at B) are skipped.
        let mut m = Marker::new(std::process::id(), &blocks, Instant::now() + Duration::from_secs(10), &code);
        m.scan_region(
            0,
            &Region { start: addr(&a), end: addr(&a) + 32, kind: RootKind::Untraced { region: "[heap]" } },
        );
        assert!(m.origin.iter().all(Option::is_none));
        assert_eq!(m.untraced_bytes, 0);
        drop((a, b, c, root));
    }
}
