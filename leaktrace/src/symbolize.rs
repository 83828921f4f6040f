//! Call stacks → frames, with blazesym.
//!
//! The symbolizer keeps a snapshot of the target's executable mappings and an open file handle
//! for every object it maps (opened through /proc/PID/map_files, i.e. the very file the target
//! mapped, whatever its mount namespace). An address is turned into (object, file offset) with
//! that snapshot and symbolized from the object's ELF/DWARF (`Source::Elf` + `Input::FileOffset`).
//! So stacks can still be symbolized after the target has exited, and PIE executables, shared
//! libraries and containers need nothing special. Demangling (C++, Rust), file:line and inlined
//! functions are enabled.
//!
//! One blazesym symbolizer and one open handle per object (device, inode) serve every traced
//! process: a library mapped by 50 processes is read and cached once (blazesym caches by the
//! path it is given, here the shared handle's /proc/self/fd path), not 50 times.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::sync::Arc;

use blazesym::symbolize::{
    CodeInfo, Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};

use leaktrace_analysis::recording::Frame;

/// One executable mapping of the target.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    /// File offset mapped at `start`.
    offset: u64,
    /// (device, inode) of the object: key of `objects`.
    key: (String, u64),
}

/// An object the target maps, kept open.
struct Object {
    /// Path as the target sees it.
    path: String,
    /// Open handle, so the file can be read after the target exits or unmaps it (shared by all
    /// processes that map the object: `SHARED`).
    file: Arc<File>,
    /// GNU build id (hex), read once when the object is first symbolized.
    build_id: Option<Option<String>>,
    /// Exports a `PyInit_*` function (a CPython extension module), read once for the mappings.
    python_init: Option<bool>,
}

/// What all processes' symbolizers share: blazesym's symbolizer (its caches of parsed ELF and
/// DWARF) and one open handle per object, by (device, inode).
struct Shared {
    symbolizer: Symbolizer,
    files: HashMap<(String, u64), Arc<File>>,
    /// Each object's build id and whether it exports `PyInit_*`, read once whatever the number
    /// of processes that map it (`leaktrace watch`: 50 processes map the same python3).
    facts: HashMap<(String, u64), (Option<String>, bool)>,
}

thread_local! {
    /// The shared state, per thread (blazesym's symbolizer is not `Send`; a `StackSymbolizer`,
    /// like the one it replaces, stays on the thread that made it).
    static SHARED: RefCell<Shared> = RefCell::new(Shared {
        symbolizer: Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            // Demangled by `demangle` (mangled names only): blazesym's own tries a C++
            // demangler on any name of unknown language, and a one-letter C function `f`
            // becomes `float`.
            .enable_demangling(false)
            .build(),
        files: HashMap::new(),
        facts: HashMap::new(),
    });
}

/// A function's name as a reader knows it: a Rust symbol (`_ZN…E` with its hash, `_R…`)
/// demangled without the hash, a C++ symbol (Itanium ABI: `_Z…`) demangled with its
/// parameters; any other name (C, already demangled) as it is.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z")
        && let Some(d) = cpp_demangle::Symbol::new(name).ok().and_then(|s| s.demangle().ok())
    {
        return d;
    }
    name.to_string()
}

/// Symbolizes user addresses of one process.
pub struct StackSymbolizer {
    pid: u32,
    maps: Vec<Mapping>,
    objects: HashMap<(String, u64), Object>,
    /// /proc/PID/maps text of the last snapshot, to skip re-parsing when nothing changed.
    last_maps: String,
    /// When /proc/PID/maps was last read for it ([`StackSymbolizer::refresh_if_older`]).
    read_at: std::time::Instant,
    /// Executable file mappings of the last snapshot (start, end, offset, object): the frames
    /// cache stays valid while they do not change (anonymous mappings come and go all the time).
    last_exec: Vec<(u64, u64, u64, (String, u64))>,
    /// Frames already made for an address in a mapped file, by (address, whether it is the
    /// probed instruction rather than a return address): stacks share most of their frames (every
    /// Python allocation's goes through the same eval-loop frames), and blazesym's lookup with
    /// file:line and demangling is the agent's main cost when thousands of stacks are new.
    /// Cleared when the executable mappings change.
    frames_cache: HashMap<(u64, bool), Vec<Arc<Frame>>>,
    /// The runtime's perf map (JIT code names), once read.
    perf_map: PerfMap,
    /// JIT frames named from a perf map written before they were seen, by address, with when
    /// they were seen. A snapshot map (the JVM's `Compiler.perfmap`) names what was at an
    /// address when it was written: code compiled since into freed space (a C1 compiler
    /// thread's "C1 temporary CodeBuffer", freed with its thread) takes the old blob's name. Such
    /// a name is provisional: the first map written after the frame was seen names it again.
    provisional_jit: HashMap<u64, std::time::SystemTime>,
    /// Every distinct frame the recording's stacks hold, once ([`StackSymbolizer::intern`]):
    /// stacks keep `Arc`s into it, so their memory grows with distinct frames, not with
    /// stacks × depth (17,000 Python stacks of ~100 frames share a few thousand frames).
    pool: std::collections::HashSet<Arc<Frame>>,
}

/// A JIT runtime's perf map (`/tmp/perf-PID.map`: one `START SIZE NAME` line per compiled
/// function, hex without 0x; written by Node with `--perf-basic-prof`, by the JVM with
/// `jcmd PID Compiler.perfmap` or `-XX:+DumpPerfMapAtExit`), read inside the target's root
/// ([`crate::target_fs`]) so a container's /tmp is used, under the PID the process has in its own
/// namespace. /tmp may be shared with other users, who can plant a file of that name for a
/// runtime that writes none: the map is read only when it is a regular file (a FIFO or a device
/// there is refused at once, never waited on), not a link, owned by one of the target's user
/// ids, and at most [`crate::target_fs::caps::PERF_MAP`] bytes. Re-read when
/// the file has changed: grown (Node appends as it compiles) or rewritten (each `jcmd
/// Compiler.perfmap` writes the JVM's whole code cache anew).
#[derive(Default)]
pub struct PerfMap {
    /// (start, end, name), sorted by start.
    entries: Vec<(u64, u64, String)>,
    /// Size and modification time of the file when last read.
    read_len: u64,
    read_mtime: Option<std::time::SystemTime>,
}

impl PerfMap {
    /// The map of process `pid` whose PID in its own namespace is `ns_pid`, open, when it is
    /// one leaktrace may read (see [`PerfMap`]).
    fn open(pid: u32, ns_pid: u32) -> Option<File> {
        use crate::target_fs::{Links, open, owned_by_process};
        let f = open(pid, Path::new(&format!("/tmp/perf-{ns_pid}.map")), Links::NotLast).ok()?;
        owned_by_process(&f, pid).then_some(f)
    }

    /// Re-read the map if it has grown. Returns whether a map exists.
    fn refresh(&mut self, pid: u32, ns_pid: u32) -> bool {
        let Some(f) = Self::open(pid, ns_pid) else { return !self.entries.is_empty() };
        let Ok(meta) = f.metadata() else { return !self.entries.is_empty() };
        let mtime = meta.modified().ok();
        if meta.len() == self.read_len && mtime == self.read_mtime {
            return true;
        }
        let read = crate::target_fs::read_capped(f, crate::target_fs::caps::PERF_MAP, "the perf map");
        let Ok(bytes) = read else { return !self.entries.is_empty() };
        self.entries = parse_perf_map(&String::from_utf8_lossy(&bytes));
        self.read_len = meta.len();
        self.read_mtime = mtime;
        true
    }

    /// The function whose code holds `addr`, if the map has one (the latest entry wins where
    /// code was recompiled at the same address).
    fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.entries.partition_point(|e| e.0 <= addr);
        self.entries[..i].iter().rev().take(8).find(|e| addr < e.1).map(|e| e.2.as_str())
    }
}

/// Parse perf-map text (`START SIZE NAME`, hex), sorted by start; bad lines are skipped.
pub fn parse_perf_map(text: &str) -> Vec<(u64, u64, String)> {
    let mut v: Vec<(u64, u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let start = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
            let size = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
            let name = it.next()?.trim();
            (!name.is_empty()).then(|| (start, start.saturating_add(size), name.to_string()))
        })
        .collect();
    v.sort_by_key(|e| e.0);
    v
}

impl StackSymbolizer {
    /// A symbolizer for `pid`, with a first snapshot of its mappings.
    pub fn new(pid: u32) -> Self {
        let mut s = StackSymbolizer {
            pid,
            maps: Vec::new(),
            objects: HashMap::new(),
            last_maps: String::new(),
            read_at: std::time::Instant::now(),
            last_exec: Vec::new(),
            frames_cache: HashMap::new(),
            perf_map: PerfMap::default(),
            provisional_jit: HashMap::new(),
            pool: Default::default(),
        };
        s.refresh();
        s
    }

    /// Re-read /proc/PID/maps and open objects not seen before. Mappings of earlier snapshots
    /// are kept (newest first wins), so addresses in a library unmapped since stay resolvable.
    /// Does nothing once the process is gone.
    pub fn refresh(&mut self) {
        // Through a live thread when the main thread has exited (procinfo::mm_task).
        let mm = crate::procinfo::mm_task(self.pid);
        let Ok(text) = std::fs::read_to_string(format!("/proc/{mm}/maps")) else {
            self.read_at = std::time::Instant::now();
            return;
        };
        self.refresh_from(mm, &text);
    }

    /// [`StackSymbolizer::refresh`] unless maps were read for it less than `age` ago (by a
    /// refresh, or by a checkpoint through [`StackSymbolizer::refresh_from`]).
    pub fn refresh_if_older(&mut self, age: std::time::Duration) {
        if self.read_at.elapsed() >= age {
            self.refresh();
        }
    }

    /// [`StackSymbolizer::refresh`] from /proc/MM/maps as the caller has just read it (`mm`:
    /// the process's [`crate::procinfo::mm_task`]), instead of a read of its own. Unchanged
    /// or empty text changes nothing.
    pub fn refresh_from(&mut self, mm: u32, text: &str) {
        self.read_at = std::time::Instant::now();
        if text == self.last_maps || text.is_empty() {
            return;
        }
        let mut fresh = Vec::new();
        for l in text.lines().filter_map(crate::procinfo::parse_maps_line) {
            if !l.perms.contains('x') || !l.path.starts_with('/') {
                continue;
            }
            let (range, path) = (l.range, &l.path);
            let key = (l.dev.to_string(), l.inode);
            if !self.objects.contains_key(&key) {
                let shared = SHARED.with_borrow(|sh| sh.files.get(&key).cloned());
                // The very file mapped (map_files); the path in the target's root only when it is
                // still that file (same inode): a file replaced on disk since is never read.
                let file = shared.map(Ok).unwrap_or_else(|| {
                    let file = crate::target_fs::open_mapped_or_path(mm, range, path, l.dev, l.inode)?;
                    let file = Arc::new(file);
                    SHARED.with_borrow_mut(|sh| sh.files.insert(key.clone(), Arc::clone(&file)));
                    Ok::<_, std::io::Error>(file)
                });
                match file {
                    Ok(file) => {
                        self.objects.insert(
                            key.clone(),
                            Object { path: l.path.clone(), file, build_id: None, python_init: None },
                        );
                    }
                    Err(_) => continue,
                }
            }
            fresh.push(Mapping { start: l.start, end: l.end, offset: l.offset, key });
        }
        // Newest snapshot first; older mappings stay behind it for unmapped libraries.
        let exec: Vec<_> = fresh.iter().map(|m| (m.start, m.end, m.offset, m.key.clone())).collect();
        if exec != self.last_exec {
            self.frames_cache.clear();
            self.last_exec = exec;
        }
        fresh.append(&mut self.maps);
        self.maps = fresh;
        self.last_maps = text.to_string();
    }

    /// For the mappings of the pprof profiles: every executable mapping seen so far
    /// (unmapped ones included), by start address, each with its object's GNU build ID (read
    /// from the open file once per object, the same cached value the frames carry).
    pub fn mappings(&mut self) -> Vec<leaktrace_analysis::recording::ObjectMapping> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for m in &self.maps {
            let Some(obj) = self.objects.get_mut(&m.key) else { continue };
            if !seen.insert((m.start, m.end)) {
                continue;
            }
            let (build_id, python_extension) = object_facts(&m.key, obj);
            out.push(leaktrace_analysis::recording::ObjectMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                path: obj.path.clone(),
                build_id,
                python_extension,
            });
        }
        out.sort_by_key(|m| m.start);
        out
    }

    fn locate(&self, addr: u64) -> Option<(&Mapping, u64)> {
        self.maps.iter().find(|m| (m.start..m.end).contains(&addr)).map(|m| (m, addr - m.start + m.offset))
    }

    /// Frames for `ips` (innermost first; `ips[0]` is the instruction the probe hit, the others
    /// are return addresses, looked up at `ip - 1` so the line is that of the call). An address
    /// with inlined calls yields several frames, innermost first. Never fails: what cannot be
    /// resolved keeps its address (and object, when known).
    /// Frames are shared: the same frame (an address's, or an equal one) is one `Arc` in every
    /// stack ([`StackSymbolizer::intern`]).
    pub fn symbolize(&mut self, ips: &[u64]) -> Vec<Arc<Frame>> {
        if ips.iter().any(|ip| self.locate(*ip).is_none()) {
            self.refresh();
        }
        // Group by object so each object is asked once; addresses made into frames before come
        // from the cache.
        let mut by_object: HashMap<(String, u64), Vec<(usize, u64)>> = HashMap::new();
        let mut cached: Vec<Option<Vec<Arc<Frame>>>> = vec![None; ips.len()];
        for (i, &ip) in ips.iter().enumerate() {
            if let Some(frames) = self.frames_cache.get(&(ip, i == 0)) {
                cached[i] = Some(frames.clone());
                continue;
            }
            let probe_addr = if i == 0 { ip } else { ip.saturating_sub(1) };
            if let Some((m, off)) = self.locate(probe_addr) {
                by_object.entry(m.key.clone()).or_default().push((i, off));
            }
        }
        // Code outside any mapped file (JIT code): named from the runtime's perf map, if any.
        let jit: Vec<usize> = (0..ips.len()).filter(|&i| self.locate(jit_addr(ips, i)).is_none()).collect();
        let have_map = !jit.is_empty() && self.perf_map.refresh(self.pid, self.ns_pid());
        let resolved: std::collections::HashSet<usize> = by_object.values().flatten().map(|(i, _)| *i).collect();
        let mut per_ip: Vec<Vec<Arc<Frame>>> = ips
            .iter()
            .enumerate()
            .zip(cached)
            .map(|((i, &ip), cached)| {
                if let Some(frames) = cached {
                    return frames;
                }
                let function = if have_map && jit.contains(&i) {
                    let name = self.perf_map.lookup(jit_addr(ips, i)).map(str::to_string);
                    let now = std::time::SystemTime::now();
                    if name.is_some() && self.perf_map.read_mtime.is_none_or(|m| m < now) {
                        self.provisional_jit.entry(ip).or_insert(now);
                    }
                    name
                } else {
                    None
                };
                let frame = Frame { addr: ip, function, ..Default::default() };
                // An address of a mapped object gets its real frames below: only what stays
                // (JIT code, unmapped addresses) is interned.
                vec![if resolved.contains(&i) { Arc::new(frame) } else { self.intern(frame) }]
            })
            .collect();
        for (key, items) in by_object {
            let Some(obj) = self.objects.get_mut(&key) else { continue };
            let fd_path = format!("/proc/self/fd/{}", obj.file.as_raw_fd());
            let build_id = obj.build_id.get_or_insert_with(|| read_build_id(&fd_path)).clone();
            let obj = &*obj;
            let offsets: Vec<u64> = items.iter().map(|(_, o)| *o).collect();
            let src = Source::Elf(Elf::new(fd_path));
            let (cache, pool) = (&mut self.frames_cache, &mut self.pool);
            SHARED.with_borrow(|sh| {
                let results = sh.symbolizer.symbolize(&src, Input::FileOffset(&offsets)).unwrap_or_default();
                for (j, (i, off)) in items.iter().enumerate() {
                    let ip = ips[*i];
                    let object = Some(obj.path.clone());
                    // The offset of the instruction itself (a return address's frame is looked up
                    // one byte back, inside the call; the label gives the return address's offset).
                    let file_offset = Some(if *i == 0 { *off } else { off + 1 });
                    let build_id = build_id.clone();
                    let frames = match results.get(j) {
                        Some(Symbolized::Sym(sym)) => {
                            let mut v = Vec::new();
                            // blazesym lists inlined callees outermost first, each with the location
                            // inside itself; emit them innermost first.
                            for f in sym.inlined.iter().rev() {
                                let (file, line) = code_location(f.code_info.as_ref());
                                v.push(Frame {
                                    addr: ip,
                                    object: object.clone(),
                                    function: Some(demangle(&f.name)),
                                    file,
                                    line,
                                    inlined: true,
                                    file_offset,
                                    build_id: build_id.clone(),
                                    ..Default::default()
                                });
                            }
                            let (file, line) = code_location(sym.code_info.as_deref());
                            v.push(Frame {
                                addr: ip,
                                object,
                                function: Some(demangle(&sym.name)),
                                file,
                                line,
                                inlined: false,
                                file_offset,
                                build_id,
                                ..Default::default()
                            });
                            v
                        }
                        _ => vec![Frame { addr: ip, object, file_offset, build_id, ..Default::default() }],
                    };
                    let frames: Vec<Arc<Frame>> = frames.into_iter().map(|f| intern_in(pool, f)).collect();
                    cache.insert((ip, *i == 0), frames.clone());
                    per_ip[*i] = frames;
                }
            });
        }
        per_ip.into_iter().flatten().collect()
    }
}

/// The shared copy of `f` in `pool` (see [`StackSymbolizer::intern`]).
fn intern_in(pool: &mut std::collections::HashSet<Arc<Frame>>, f: Frame) -> Arc<Frame> {
    if let Some(k) = pool.get(&f) {
        return Arc::clone(k);
    }
    let a = Arc::new(f);
    pool.insert(Arc::clone(&a));
    a
}

/// The address to look `ips[i]` up at: a return address one byte back, inside its call.
fn jit_addr(ips: &[u64], i: usize) -> u64 {
    if i == 0 { ips[0] } else { ips[i].saturating_sub(1) }
}

impl StackSymbolizer {
    /// The process's PID in its own PID namespace (the name of its perf map).
    fn ns_pid(&self) -> u32 {
        crate::procinfo::nspid(self.pid).last().copied().unwrap_or(self.pid)
    }

    /// The shared copy of `f`: the one already held when an equal frame was interned before,
    /// else `f`, now held. Frames are never dropped from the pool (a recording keeps them all).
    pub fn intern(&mut self, f: Frame) -> Arc<Frame> {
        intern_in(&mut self.pool, f)
    }

    /// Distinct frames interned so far.
    pub fn distinct_frames(&self) -> usize {
        self.pool.len()
    }

    /// Name the JIT frames of `stacks` that are still unnamed (no object, no function) from the
    /// runtime's perf map as it is now (re-read if it changed): a map written after a stack was
    /// first symbolized (`jcmd PID Compiler.perfmap`, or a function Node compiled later) names
    /// it. A frame named from a map older than the frame ([`StackSymbolizer::is_provisional`])
    /// is named again from a map written after it was seen, which keeps the old name only when
    /// it has no entry there. A return address is looked up one byte back, as in
    /// [`StackSymbolizer::symbolize`]. Returns how many frames were named or renamed (0 without
    /// a map).
    pub fn name_jit_frames(&mut self, stacks: &mut [leaktrace_analysis::recording::Stack]) -> usize {
        let unnamed = |f: &Frame| f.object.is_none() && f.function.is_none();
        let pending = |f: &Frame| unnamed(f) || self.is_provisional(f);
        if !stacks.iter().any(|s| s.frames.iter().any(|f| pending(f)))
            || !self.perf_map.refresh(self.pid, self.ns_pid())
        {
            return 0;
        }
        let map_mtime = self.perf_map.read_mtime;
        let mut named = 0;
        for s in stacks {
            for (i, f) in s.frames.iter_mut().enumerate() {
                let renaming = !unnamed(f) && self.is_provisional(f);
                if !unnamed(f) && !renaming {
                    continue;
                }
                if renaming {
                    // Settled only by a map written after the frame was seen.
                    let seen = self.provisional_jit[&f.addr];
                    if map_mtime.is_none_or(|m| m < seen) {
                        continue;
                    }
                    self.provisional_jit.remove(&f.addr);
                }
                let at = if i == 0 { f.addr } else { f.addr.saturating_sub(1) };
                if let Some(name) = self.perf_map.lookup(at)
                    && f.function.as_deref() != Some(name)
                {
                    let named_frame = Frame { function: Some(name.to_string()), ..(**f).clone() };
                    *f = self.intern(named_frame);
                    named += 1;
                }
            }
        }
        named
    }

    /// Whether `f` is a JIT frame named from a perf map written before the frame was seen, not
    /// named again since (see [`StackSymbolizer::name_jit_frames`]): a runtime that writes its
    /// map on demand should write it again.
    pub fn is_provisional(&self, f: &Frame) -> bool {
        f.object.is_none() && f.function.is_some() && self.provisional_jit.contains_key(&f.addr)
    }

    /// Whether the runtime's perf map (`/tmp/perf-PID.map` in the target's root) exists.
    pub fn has_perf_map(&self) -> bool {
        PerfMap::open(self.pid, self.ns_pid()).is_some() || !self.perf_map.entries.is_empty()
    }
}

fn code_location(ci: Option<&CodeInfo<'_>>) -> (Option<String>, Option<u32>) {
    match ci {
        Some(ci) => (Some(ci.to_path().display().to_string()), ci.line),
        None => (None, None),
    }
}

/// The GNU build id of the ELF file at `path`, as lowercase hex (None: unreadable, not ELF, or
/// no build-id note).
/// `obj`'s build id and whether it exports `PyInit_*` (see [`exports_python_init`]): from the
/// object, else from what every process's symbolizer on this thread shares (`Shared::facts`),
/// else read from its file.
fn object_facts(key: &(String, u64), obj: &mut Object) -> (Option<String>, bool) {
    if let (Some(b), Some(p)) = (&obj.build_id, obj.python_init) {
        return (b.clone(), p);
    }
    let facts = SHARED.with_borrow(|sh| sh.facts.get(key).cloned()).unwrap_or_else(|| {
        let fd_path = format!("/proc/self/fd/{}", obj.file.as_raw_fd());
        let facts = (read_build_id(&fd_path), crate::runtimes::python::names::exports_python_init(&fd_path));
        SHARED.with_borrow_mut(|sh| sh.facts.insert(key.clone(), facts.clone()));
        facts
    });
    obj.build_id = Some(facts.0.clone());
    obj.python_init = Some(facts.1);
    facts
}

fn read_build_id(path: &str) -> Option<String> {
    use object::Object as _;
    // Read on demand (headers and notes), not the whole file.
    let data = object::ReadCache::new(File::open(path).ok()?);
    let obj = object::File::parse(&data).ok()?;
    let id = obj.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where a frame's object and offset are, as `object+0xOFFSET`, for messages.
pub fn frame_location(f: &Frame) -> String {
    let object = f.object.as_deref().map(|o| o.rsplit('/').next().unwrap_or(o)).unwrap_or("[unknown object]");
    match f.file_offset {
        Some(off) => format!("{object}+{off:#x}"),
        None => format!("{object}@{:#x}", f.addr),
    }
}

#[cfg(test)]
mod demangle_tests {
    use super::demangle;

    /// C names stay as they are (`f` is not `float`); C++ and Rust symbols are demangled.
    #[test]
    fn only_mangled_names_are_demangled() {
        assert_eq!(demangle("f"), "f");
        assert_eq!(demangle("i"), "i");
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Z11leak_objecti"), "leak_object(int)");
        assert_eq!(demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"), "core::ptr::drop_in_place");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPython extension module (this machine's python3's `_ctypes`, which exports
    /// `PyInit__ctypes`) is told by its exports; libc and libffi, which ctypes calls, are not.
    #[test]
    fn python_extensions_are_told_by_their_pyinit_export() {
        let out = std::process::Command::new("python3")
            .args(["-c", "import _ctypes; print(_ctypes.__file__)"])
            .output()
            .expect("python3");
        let ext = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(ext.ends_with(".so"), "_ctypes is not a shared object here: {ext:?}");
        assert!(crate::runtimes::python::names::exports_python_init(&ext), "{ext}");
        let libs = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = libs.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("libc.so")).unwrap();
        assert!(!crate::runtimes::python::names::exports_python_init(libc), "{libc}");
        assert!(!crate::runtimes::python::names::exports_python_init("/nonexistent/x.so"));
    }

    #[test]
    fn frames_of_an_address_are_made_once() {
        let mut s = StackSymbolizer::new(std::process::id());
        let ip = frames_of_an_address_are_made_once as fn() as usize as u64;
        // The function's first instruction, and a return address one byte into it.
        let first = s.symbolize(&[ip, ip + 1]);
        let named = |frames: &[Arc<Frame>]| {
            frames
                .iter()
                .filter(|f| f.function.as_deref().is_some_and(|n| n.contains("frames_of_an_address_are_made_once")))
                .count()
        };
        assert_eq!(named(&first), 2, "{first:?}");
        assert_eq!(s.frames_cache.len(), 2, "one entry per (address, probed or return)");
        let again = s.symbolize(&[ip, ip + 1]);
        assert_eq!(format!("{first:?}"), format!("{again:?}"), "the cache gives the same frames");
        assert!(first.iter().zip(&again).all(|(a, b)| Arc::ptr_eq(a, b)), "shared, not copied");
        assert_eq!(s.distinct_frames(), first.len());
        // A snapshot whose executable mappings did not change keeps the cache.
        s.last_maps.clear();
        s.refresh();
        assert_eq!(s.frames_cache.len(), 2);
    }

    /// A JVM-style snapshot map written before the code ran names the blob that was at the
    /// address then; the frame is provisional, and the first map written after it was seen
    /// names it again (this process plays the JVM: its own /tmp/perf-PID.map, an address it
    /// has not mapped).
    #[test]
    fn a_name_from_a_map_older_than_the_frame_is_replaced_by_the_next_map() {
        use leaktrace_analysis::recording::{Stack, StackKind};
        let pid = std::process::id();
        let path = format!("/tmp/perf-{pid}.map");
        let jit = 0x7e57_0000_0000u64;
        let write = |name: &str, mtime: std::time::SystemTime| {
            std::fs::write(&path, format!("{jit:#x} 0x1000 {name}\n")).unwrap();
            std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();
        };
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        write("C1 temporary CodeBuffer", hour_ago);
        let mut s = StackSymbolizer::new(pid);
        let frames = s.symbolize(&[jit + 0x10, jit + 0x40]);
        let stale = frames.iter().find(|f| f.addr == jit + 0x40).unwrap().clone();
        assert_eq!(stale.function.as_deref(), Some("C1 temporary CodeBuffer"));
        assert!(s.is_provisional(&stale));
        let mut stacks =
            vec![Stack { id: 1, kind: StackKind::Malloc, frames, lost: false, truncated: None, shared: false }];
        // The same map again names nothing anew.
        assert_eq!(s.name_jit_frames(&mut stacks), 0);
        write("void Ledger.appendRecord(long)", std::time::SystemTime::now() + std::time::Duration::from_secs(1));
        let renamed = s.name_jit_frames(&mut stacks);
        let _ = std::fs::remove_file(&path);
        assert_eq!(renamed, 2);
        for f in &stacks[0].frames {
            assert_eq!(f.function.as_deref(), Some("void Ledger.appendRecord(long)"));
            assert!(!s.is_provisional(f));
        }
    }

    #[test]
    fn perf_map_lines_and_lookup() {
        let text = "7f00 10 JS:*step /tmp/grow.js:11\n\
                    garbage line\n\
                    7e00 100 Builtin:ArgumentsAdaptorTrampoline\n\
                    0x8000 8 LazyCompile:~recordAudit /srv/app.js:3\n\
                    0x0000000000009000 0x0000000000000340 void Ledger.appendRecord(long)\n";
        let map = PerfMap { entries: parse_perf_map(text), ..Default::default() };
        assert_eq!(map.entries.len(), 4);
        // HotSpot's form (`jcmd PID Compiler.perfmap`): 0x-prefixed, the method's external name.
        assert_eq!(map.lookup(0x933f), Some("void Ledger.appendRecord(long)"));
        assert_eq!(map.lookup(0x9340), None);
        assert_eq!(map.lookup(0x7f08), Some("JS:*step /tmp/grow.js:11"));
        assert_eq!(map.lookup(0x7e10), Some("Builtin:ArgumentsAdaptorTrampoline"));
        assert_eq!(map.lookup(0x7e80), Some("Builtin:ArgumentsAdaptorTrampoline"));
        assert_eq!(map.lookup(0x7f10), None, "past both");
        assert_eq!(map.lookup(0x8004), Some("LazyCompile:~recordAudit /srv/app.js:3"));
        assert_eq!(map.lookup(0x8008), None);
        assert_eq!(map.lookup(0x100), None);
    }
}
