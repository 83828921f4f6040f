//! Python heap census (`record --python-heap`): the objects of a live CPython
//! process counted by type, and what holds them, read from outside while its threads are
//! stopped ([`crate::reach::stop`]: ptrace seize + interrupt, released on drop and by the
//! kernel if the agent dies) with process_vm_readv.
//!
//! The walk ([`walk`]): the containers of the collector's generation lists (`PyGC_Head` lists in
//! the interpreter's gc state, [`layout`]), then breadth first from every module object
//! (`__main__` first) and every local variable of the live threads' running frames
//! ([`frames`]) through the references leaktrace decodes ([`decode`]: dict items, list,
//! tuple, set and deque members, instance attributes, function defaults and closure cells,
//! bound methods), so each object reached gets a shortest retaining path from a root;
//! then the containers not reached, whose reference count exceeds the references found to
//! them ("referenced from nowhere") or not (unreachable cycles). Objects are grouped by type
//! and by the pattern of their path ([`census`]). The target is resumed before this module
//! returns; the walk stops at the pause cap and the object cap, and says so. What it reads and
//! what it cannot see: docs/runtimes.md ("Python heap").

mod census;
pub mod decode;
pub mod frames;
pub mod layout;
pub mod mem;
mod retain;
pub mod walk;

use std::time::{Duration, Instant};

use crate::runtimes::python::heap::decode::{Kind, Label};
use crate::runtimes::python::heap::walk::{Edge, State, Walk};
use leaktrace_analysis::runtimes::python::heap::PyCensus;

/// Options of the census (`--python-heap-*`).
#[derive(Clone, Copy, Debug)]
pub struct HeapOptions {
    /// Longest pause of the target: the walk stops there (`complete: false`).
    pub max_pause: Duration,
    /// Also take a census at every this many periodic checkpoints; None: at the first and at
    /// the end only.
    pub every: Option<u32>,
    /// Most objects walked (memory bound: about 100 bytes of the agent's memory each).
    pub max_objects: usize,
}

impl Default for HeapOptions {
    fn default() -> Self {
        HeapOptions { max_pause: Duration::from_secs(2), every: None, max_objects: 5_000_000 }
    }
}

/// Where a process's interpreter keeps its gc state.
#[derive(Clone, Copy, Debug)]
pub struct Located {
    pub layout: layout::HeapLayout,
    /// The address of the pointer to the main interpreter (3.9+), or of `_PyRuntime` + the
    /// offset of `interpreters.main` (3.8, where the gc state is in `_PyRuntime`).
    interp_ptr: u64,
    runtime_interp: u64,
    /// Where the threads' frames and their locals are (None: the locals are not roots).
    frames: Option<frames::FrameLayout>,
}

/// Find the interpreter of `pid` (the object defining `_PyRuntime`, as for Python frames).
/// Err: one line, why no census can be taken.
pub fn locate(pid: u32) -> Result<Located, String> {
    let objects = crate::discover::mapped_objects(pid).map_err(|e| format!("Python heap: {e}"))?;
    let (interp, target) = crate::runtimes::python::frames::locate(pid, &objects)
        .map_err(|e| e.replace("Python frames are not read", "no Python heap census"))?;
    let v = interp.layout.version;
    let layout = layout::for_version(v)
        .ok_or_else(|| format!("no Python heap census: CPython {}.{} is not supported (3.8–3.13)", v.0, v.1))?;
    Ok(Located {
        layout,
        interp_ptr: target.interp_addr,
        runtime_interp: interp.layout.runtime_interp,
        frames: frames::FrameLayout::new(&interp.layout),
    })
}

/// Stop `pid`, take a census, resume. `start`: time 0 (the first checkpoint); the census's
/// time is when the target is stopped. Errors (one line): the process cannot be stopped, or its
/// gc state cannot be read.
/// `blocks`: the traced live native blocks (sorted by address), read once the target is
/// stopped, so that extension objects' pointers into them are edges of the same heap graph.
pub fn census(
    pid: u32,
    at: &Located,
    opts: HeapOptions,
    start: Instant,
    blocks: &dyn Fn() -> Vec<crate::reach::blocks::Block>,
) -> anyhow::Result<PyCensus> {
    let t0 = Instant::now();
    let t_s = t0.duration_since(start).as_secs_f64();
    let unix_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mm = crate::procinfo::mm_task(pid);
    let mut mem = mem::Mem::new(mm, 1 << 30);
    let cpu0 = thread_cpu();
    let urgent = Urgent::raise();
    let stop = crate::reach::stop::wait_for(opts.max_pause);
    let stopped = crate::reach::stop::stop_all(pid, stop, t0 + opts.max_pause + crate::reach::stop::HARD_MARGIN)?;
    // A thread's `pthread_self()` is its fsbase: the thread states' `thread_id` to thread ids.
    let tids: mem::FastMap<u64, i32> = stopped.threads.iter().map(|t| (t.regs.fs_base, t.tid)).collect();
    let mut w = Walk::new(&mut mem, at.layout, t0 + opts.max_pause, opts.max_objects);
    w.blocks = blocks().into_iter().map(|b| (b.addr, b.size, b.site)).collect();
    let walked = walk_all(&mut w, at, &tids, pid);
    let mut c = walked.map(|collecting| {
        let mut c = census::aggregate(&mut w, collecting);
        retain::fill(&w, &mut c);
        c
    });
    drop(w);
    let not_stopped = stopped.not_stopped.clone();
    let notes = crate::reach::stop_notes(&not_stopped, stopped.resume(), opts.max_pause);
    drop(urgent);
    let pause = t0.elapsed();
    if let Ok(c) = c.as_mut() {
        c.t_s = t_s;
        c.unix_ms = unix_ms;
        c.pause_ms = pause.as_secs_f64() * 1e3;
        c.cpu_ms = (thread_cpu() - cpu0).as_secs_f64() * 1e3;
        c.version = format!("{}.{}", at.layout.version.0, at.layout.version.1);
        c.notes.extend(notes);
        if mem.bytes_read > 0 {
            c.notes.push(format!("{:.1} MiB of the target's memory read", mem.bytes_read as f64 / 1048576.0));
        }
    }
    c
}

/// The CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The census thread's scheduling priority raised to nice −10 while the target is stopped
/// (every millisecond it waits for a CPU on a loaded host is a millisecond of the target's
/// pause), its former nice value restored on drop. Best effort: without CAP_SYS_NICE the
/// priority stays.
struct Urgent(Option<i32>);

impl Urgent {
    fn raise() -> Urgent {
        // SAFETY: gettid, getpriority and setpriority on this thread only; errors are returned.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let old = libc::getpriority(libc::PRIO_PROCESS, tid);
            if *libc::__errno_location() != 0 || old <= -10 {
                return Urgent(None);
            }
            Urgent((libc::setpriority(libc::PRIO_PROCESS, tid, -10) == 0).then_some(old))
        }
    }
}

impl Drop for Urgent {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            // SAFETY: as in `raise`.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, old) };
        }
    }
}

/// The census's walk over `data` as the target's memory, for the fuzz targets
/// ([`crate::fuzzing::python_walk`]): its first byte picks the CPython layout, the rest is
/// memory at 0x10000 whose first word is the address of the main interpreter (3.8: `_PyRuntime`'s
/// `interpreters.main`). The collector's lists, the walk from the module objects, the
/// unreached containers and the census, with a 200 ms pause cap and 20 000 objects at most;
/// when the lists do not read, every 16th address is tried as an object (their decoding).
pub fn walk_image(data: &[u8]) -> Option<PyCensus> {
    walk_image_capped(data, 20_000).map(|(c, _)| c)
}

/// [`walk_image`] with at most `max_objects` objects: the census and how many objects the walk
/// made.
fn walk_image_capped(data: &[u8], max_objects: usize) -> Option<(PyCensus, usize)> {
    const BASE: u64 = 0x10000;
    let (&v, image) = data.split_first()?;
    let layout = layout::HEAP_LAYOUTS[v as usize % layout::HEAP_LAYOUTS.len()];
    let mut mem = mem::Mem::image(BASE, image.to_vec(), 1 << 24);
    let at = Located { layout, interp_ptr: BASE, runtime_interp: 0, frames: None };
    let mut w = Walk::new(&mut mem, layout, Instant::now() + Duration::from_millis(200), max_objects);
    let collecting = match walk_all(&mut w, &at, &mem::FastMap::default(), 0) {
        Ok(c) => c,
        Err(_) => {
            let mut edges = Vec::new();
            for a in (BASE..BASE + image.len() as u64).step_by(16).take(512) {
                if let Some(i) = w.node(a, true) {
                    w.children(i, &mut edges);
                }
            }
            from_roots(&mut w, &[]);
            unreached(&mut w);
            false
        }
    };
    let census = census::aggregate(&mut w, collecting);
    Some((census, w.nodes.len()))
}

/// The gc state's address: in the main interpreter (3.9+) or in `_PyRuntime` (3.8).
fn gc_state(w: &mut Walk<'_>, at: &Located) -> anyhow::Result<u64> {
    if at.layout.gc_in_runtime {
        return Ok(at.interp_ptr - at.runtime_interp + at.layout.gc_state);
    }
    let interp = w.mem.u64(at.interp_ptr).filter(|&a| a != 0);
    let interp = interp.ok_or_else(|| anyhow::anyhow!("cannot read the main interpreter's address"))?;
    Ok(interp.wrapping_add(at.layout.gc_state))
}

/// Walk everything; Ok(true) when the collector was running at the stop. `tids`: the stopped
/// threads by fsbase ([`frames::local_roots`]).
fn walk_all(w: &mut Walk<'_>, at: &Located, tids: &mem::FastMap<u64, i32>, pid: u32) -> anyhow::Result<bool> {
    let gc = gc_state(w, at)?;
    let collecting = w.mem.u64(gc.wrapping_add(at.layout.gc_collecting)).is_some_and(|v| v as u32 != 0);
    let heads: Vec<u64> = (0..3)
        .map(|g| gc.wrapping_add(at.layout.gc_generations + 24 * g))
        .chain([gc.wrapping_add(at.layout.gc_permanent)])
        .collect();
    for &h in &heads {
        let first = w.mem.u64(h).unwrap_or(0) & !3;
        // The first container's prev pointer comes back to the head (flags in its low bits).
        if first != h && w.mem.u64(first.wrapping_add(8)).map(|p| p & !3) != Some(h) {
            anyhow::bail!(
                "the collector's lists do not read as CPython {}.{}'s (gc state at {gc:#x})",
                at.layout.version.0,
                at.layout.version.1
            );
        }
    }
    for &h in &heads {
        let mut p = w.mem.u64(h).unwrap_or(h) & !3;
        let mut n = 0u64;
        while p != h && p != 0 {
            n += 1;
            if n.is_multiple_of(256) && w.over() {
                break;
            }
            if w.node(p.wrapping_add(layout::GC_HEAD), true).is_none() {
                w.bad_refs += 1;
            }
            match w.mem.u64(p) {
                Some(next) => p = next & !3,
                None => break,
            }
        }
    }
    let interp = w.mem.u64(at.interp_ptr).unwrap_or(0);
    let locals = match at.frames {
        Some(fl) if interp != 0 => frames::local_roots(w.mem, &at.layout, &fl, interp, tids, pid),
        _ => Vec::new(),
    };
    from_roots(w, &locals);
    unreached(w);
    Ok(collecting)
}

/// Breadth first from the module objects, `__main__` first, and from the live frames' `locals`
/// (queued ahead of the modules' attributes: a local is a root, as a module is).
fn from_roots(w: &mut Walk<'_>, locals: &[frames::LocalRoot]) {
    let mut roots = Vec::new();
    for i in 0..w.nodes.len() as u32 {
        let t = &w.types[w.nodes[i as usize].ty as usize];
        if &*t.name == "module" && t.kind == Kind::Other {
            let mut edges = Vec::new();
            w.children(i, &mut edges);
            let name = edges.iter().find_map(|&(v, lab, _)| match lab {
                Label::Attr(s) if w.strs.list[s as usize] == "__name__" => Some(v),
                _ => None,
            });
            let name = name.and_then(|v| decode::read_str(w.mem, &w.l, v, 80)).unwrap_or_else(|| "?".into());
            roots.push((name != "__main__", i, name, edges));
        }
    }
    roots.sort_by_key(|r| r.0);
    let mut queue = std::collections::VecDeque::new();
    for (_, i, name, _) in &roots {
        let s = w.strs.id(name);
        let n = &mut w.nodes[*i as usize];
        n.state = State::Path;
        n.label = Label::Root(s);
        let sig = w.sig(walk::NONE, Label::Root(s));
        w.nodes[*i as usize].sig = sig;
    }
    for (_, i, _, edges) in roots {
        visit(w, i, &edges, &mut queue);
    }
    // A local holding a module or one of their attributes leaves its path as it is.
    let mut local_roots = Vec::new();
    for r in locals {
        let Some(i) = w.node(r.obj, false) else { continue };
        w.refs_in[i as usize] += 1;
        if w.nodes[i as usize].state != State::Seen {
            continue;
        }
        let label = Label::Local(w.strs.id(&r.pattern), w.strs.id(&r.example));
        let sig = w.sig(walk::NONE, label);
        let n = &mut w.nodes[i as usize];
        (n.state, n.label, n.sig) = (State::Path, label, sig);
        local_roots.push(i);
    }
    for &i in local_roots.iter().rev() {
        queue.push_front(i);
    }
    let mut edges = Vec::new();
    // The budgets are checked by steps taken, not by the queue's length: a chain of objects
    // (each holding the next) keeps the queue at one entry for ever.
    let mut steps = 0u64;
    while let Some(i) = queue.pop_front() {
        steps += 1;
        if steps.is_multiple_of(256) && w.over() {
            return;
        }
        w.children(i, &mut edges);
        visit(w, i, &edges, &mut queue);
    }
}

/// Count `edges` of node `i` and queue the referents not reached yet.
fn visit(w: &mut Walk<'_>, i: u32, edges: &[Edge], queue: &mut std::collections::VecDeque<u32>) {
    for &(addr, label, own) in edges {
        let Some(j) = w.node(addr, false) else {
            if addr != 0 {
                w.bad_refs += 1;
            }
            continue;
        };
        if own {
            w.refs_in[j as usize] += 1;
            w.edges.push((i, j));
        }
        if w.nodes[j as usize].state == State::Seen {
            let sig = w.sig(w.nodes[i as usize].sig, label);
            let n = &mut w.nodes[j as usize];
            n.state = State::Path;
            n.parent = i;
            n.label = label;
            n.sig = sig;
            queue.push_back(j);
        }
    }
}

/// The containers no module reaches, and what they reach: decoded, their references counted;
/// then breadth first from those held from outside (reference count above the references
/// found), the "referenced from nowhere" ones (signature [`census::NOWHERE`]).
fn unreached(w: &mut Walk<'_>) {
    let mut edges_of: Vec<(u32, Vec<(u32, Label)>)> = Vec::new();
    let mut edges = Vec::new();
    let mut k = 0;
    while k < w.nodes.len() {
        if k.is_multiple_of(256) && w.over() {
            break;
        }
        if w.nodes[k].state == State::Seen {
            w.nodes[k].state = State::Unreached;
            w.children(k as u32, &mut edges);
            let mut kids = Vec::new();
            for &(addr, label, own) in &edges {
                if let Some(j) = w.node(addr, false) {
                    if own {
                        w.refs_in[j as usize] += 1;
                    }
                    kids.push((j, label));
                }
            }
            edges_of.push((k as u32, kids));
        }
        k += 1;
    }
    let adj: mem::FastMap<u32, Vec<(u32, Label)>> = edges_of.into_iter().collect();
    let mut queue = std::collections::VecDeque::new();
    for (&i, _) in adj.iter() {
        let n = &w.nodes[i as usize];
        // Immortal objects (3.12+) carry a huge count: not a leak.
        if n.state == State::Unreached && n.refcnt > w.refs_in[i as usize] as i64 && n.refcnt < 1 << 29 {
            queue.push_back(i);
        }
    }
    let mut roots: Vec<u32> = queue.iter().copied().collect();
    roots.sort_unstable();
    queue = roots.into_iter().collect();
    for &i in &queue {
        w.nodes[i as usize].sig = census::NOWHERE;
    }
    while let Some(i) = queue.pop_front() {
        for &(j, label) in adj.get(&i).map(Vec::as_slice).unwrap_or_default() {
            let n = &mut w.nodes[j as usize];
            if n.state != State::Path && n.sig == walk::NONE {
                n.sig = census::NOWHERE;
                n.parent = i;
                n.label = label;
                queue.push_back(j);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPython 3.11 heap laid out in bytes (fuzz/seeds/python_walk/py311-module.bin: a
    /// `__main__` module whose `cache` list holds three `Entry` objects, and a list nothing
    /// holds): the walk over an image finds them as it finds them in a live process.
    #[test]
    fn a_heap_image_is_walked() {
        let (c, _) = walk_image_capped(include_bytes!("../../../../../fuzz/seeds/python_walk/py311-module.bin"), 1000)
            .expect("a census");
        assert!(c.complete, "{:?}", c.notes);
        let entry = c.types.iter().find(|t| t.name == "Entry").expect("Entry objects");
        assert_eq!(entry.count, 3);
        assert!(entry.holders[0].pattern.contains("cache"), "{:?}", entry.holders[0].pattern);
    }

    /// Two long chains of lists (each holding the next) from the module keep one entry in the
    /// walk's queue between steps: the object cap still stops it (it was checked only when the
    /// queue's length was a multiple of 256, so a walk like this ran past every cap).
    #[test]
    fn long_chains_stop_at_the_object_cap() {
        let (c, nodes) = walk_image_capped(include_bytes!("../../../../../fuzz/seeds/python_walk/two-chains.bin"), 100)
            .expect("a census");
        assert!(!c.complete);
        assert!(nodes < 100 + 300, "{nodes} objects walked with a cap of 100");
        let (full, all) =
            walk_image_capped(include_bytes!("../../../../../fuzz/seeds/python_walk/two-chains.bin"), 10_000)
                .expect("a census");
        assert!(full.complete && all > 800, "{all} objects in the two chains of 400");
    }
}
