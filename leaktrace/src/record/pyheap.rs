//! Python heap hook (`--python-heap`): a census of each traced CPython process at the
//! first periodic checkpoint, at every Nth one (`--python-heap-every`) and at the end
//! ([`crate::runtimes::python::heap`]), kept for its recording.

use std::collections::HashMap;
use std::time::Instant;

use leaktrace_analysis::runtimes::python::heap::PyCensus;
use leaktrace_common::SiteKey;

use crate::probes::Tracer;
use crate::runtimes::python::heap::HeapOptions;

use super::session::Tracee as _;
use super::traced::Traced;

/// Whether the `n`th periodic checkpoint takes a census.
pub(super) fn due(o: &HeapOptions, n: u64) -> bool {
    n == 1 || o.every.is_some_and(|e| n.is_multiple_of(u64::from(e)))
}

/// A census of every live CPython target. A target whose heap cannot be read gets one warning
/// (once) in its recording and on stderr; the others go on. The objects referenced from nowhere
/// are matched against the traced blocks (`tracer`'s maps) for the stack that allocated them.
pub(super) fn census_all(tracer: &Tracer, targets: &mut [Traced], opts: HeapOptions, start: Instant) {
    for t in targets.iter_mut() {
        if t.ended()
            || !crate::procinfo::alive(t.pid())
            || t.runtime_name() != Some(leaktrace_analysis::recording::Runtime::Python)
        {
            continue;
        }
        let pid = t.pid();
        let at = match t.py_heap_mut().located(|| crate::runtimes::python::heap::locate(pid)) {
            Ok(at) => at,
            Err(why) => {
                if !why.is_empty() {
                    crate::note!("leaktrace: PID {pid}: {why}");
                    t.warn(why);
                }
                continue;
            }
        };
        // Read once the target is stopped (exact mode; none in growth or sampled mode).
        let live = || match (tracer.live_block_maps(), tracer.site_keys(pid)) {
            (Some(maps), Ok(sites)) => crate::reach::blocks::read(maps, pid, &sites).unwrap_or_default(),
            _ => Vec::new(),
        };
        match crate::runtimes::python::heap::census(pid, &at, opts, start, &live) {
            Ok(mut c) => {
                name_nowhere(tracer, t, &mut c);
                name_retained(tracer, t, &mut c);
                crate::note!(
                    "leaktrace: Python heap of PID {pid}: {} objects ({} containers), target paused {:.1} ms{}",
                    c.objects,
                    c.gc_objects,
                    c.pause_ms,
                    if c.complete { "" } else { " (partial)" }
                );
                t.py_heap_mut().push(c);
            }
            Err(e) => {
                let line = format!("Python heap census failed: {e:#}");
                crate::note!("leaktrace: PID {pid}: {line}");
                t.warn_once(line);
            }
        }
    }
}

/// For each "referenced from nowhere" holder of census `c`: the traced stack whose live blocks
/// contain most of its sampled objects (`Holder::sample_addrs`, read while the target was
/// stopped; the blocks are read now, so an object freed meanwhile is simply not matched), as
/// `allocated_stack` and its culprit function `allocated_by`. Nothing when the blocks cannot be
/// read (growth or sampled mode: no block list) or no sampled object lies in a traced block
/// (pymalloc's objects without `--pymalloc`).
fn name_nowhere(tracer: &Tracer, t: &mut Traced, c: &mut PyCensus) {
    let holders = || c.types.iter().flat_map(|ty| ty.holders.iter());
    if holders().all(|h| h.sample_addrs.is_empty()) {
        return;
    }
    let blocks = match (tracer.live_block_maps(), tracer.site_keys(t.pid())) {
        (Some(maps), Ok(sites)) => crate::reach::blocks::read(maps, t.pid(), &sites).unwrap_or_default(),
        _ => Vec::new(),
    };
    // Sorted by address (blocks::read's order); the block holding `a`, if any.
    let holding = |a: u64| {
        let i = blocks.partition_point(|b| b.addr <= a).checked_sub(1)?;
        let b = &blocks[i];
        (a < b.addr + b.size.max(1)).then_some(b.site)
    };
    let extensions: Vec<String> = t.mappings().into_iter().filter(|m| m.python_extension).map(|m| m.path).collect();
    for h in c.types.iter_mut().flat_map(|ty| ty.holders.iter_mut()) {
        let mut by_site: HashMap<SiteKey, usize> = HashMap::new();
        for &a in &h.sample_addrs {
            if let Some(site) = holding(a) {
                *by_site.entry(site).or_default() += 1;
            }
        }
        h.sample_addrs.clear();
        // Free lists (dict, list, tuple, float) recycle objects, so a block's stack is that of
        // its first allocation: the most common stack through an extension module wins over
        // the interpreter's own, whose objects the extension was handed from a free list.
        let ranked: Vec<(bool, usize, u32)> = by_site
            .into_iter()
            .map(|(key, n)| {
                let id = t.stack_for(tracer, key);
                (through_extension(t, id, &extensions), n, id)
            })
            .collect();
        if let Some(&(_, _, id)) = ranked.iter().max_by_key(|&&(ext, n, id)| (ext, n, std::cmp::Reverse(id))) {
            h.allocated_stack = Some(id);
            h.allocated_by = t.stack(id).map(|s| leaktrace_analysis::analyze::culprit(s).1);
        }
    }
}

/// Stack `id` of `t` has a frame in one of `extensions` (CPython extension modules' paths).
fn through_extension(t: &Traced, id: u32, extensions: &[String]) -> bool {
    t.stack(id)
        .is_some_and(|s| s.frames.iter().any(|f| f.object.as_ref().is_some_and(|o| extensions.iter().any(|e| e == o))))
}

/// Each holder's retained native blocks: their most common site as `allocated_stack`, and its
/// culprit function with the caller (`img_alloc_buffer ← decode_batch`) as `allocated_by`.
fn name_retained(tracer: &Tracer, t: &mut Traced, c: &mut PyCensus) {
    for h in c.types.iter_mut().flat_map(|ty| ty.holders.iter_mut()) {
        let Some(r) = h.retained.as_mut() else { continue };
        let Some(&(key, _)) = r.sites.first() else { continue };
        r.sites.clear();
        let id = t.stack_for(tracer, key);
        r.allocated_stack = Some(id);
        r.allocated_by = t.stack(id).map(allocated_by);
    }
}

/// A stack's culprit function with its caller, for reading (`img_alloc_buffer ← decode_batch`).
pub(super) fn allocated_by(s: &leaktrace_analysis::recording::Stack) -> String {
    let (i, f) = leaktrace_analysis::analyze::culprit(s);
    match i.and_then(|i| s.frames.get(i + 1)).and_then(|fr| fr.function.clone()) {
        Some(caller) => format!("{f} ← {caller}"),
        None => f,
    }
}
