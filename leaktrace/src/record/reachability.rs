//! Reachability hook: at the end of a session, before the probes are detached (the ALLOCS
//! map still holds every live block), scan each traced process that still runs
//! ([`crate::reach`]) and keep the result for its recording.

use std::collections::HashMap;
use std::time::Instant;

use leaktrace_common::SiteKey;

use crate::probes::{Mode, Tracer};
use crate::reach::{self, Names};
use leaktrace_analysis::reachability::Reachability;

use super::traced::Traced;

/// The recorder's names for the scan: stack ids (symbolized on first sight) and functions.
struct TracedNames<'a> {
    tracer: &'a Tracer,
    traced: &'a mut Traced,
}

impl Names for TracedNames<'_> {
    fn site(&mut self, key: SiteKey) -> (u32, Option<String>) {
        let id = self.traced.stack_for(self.tracer, key);
        let f = self.traced.stacks.get(id as usize).map(|s| leaktrace_analysis::analyze::culprit(s).1);
        (id, f)
    }

    fn function(&mut self, ip: u64) -> Option<String> {
        self.traced.symbolizer.symbolize(&[ip]).into_iter().find_map(|f| f.function.clone())
    }
}

/// Scan every live target (exact mode only: the other modes keep no block list). A target that
/// cannot be scanned gets one warning line in its recording and on stderr; the others go on. A
/// target already scanned at its exit (held at its teardown) is not scanned again.
pub(super) fn scan_all(
    tracer: &Tracer,
    targets: &mut [Traced],
    mode: Mode,
    opts: reach::ScanOptions,
    start: Instant,
) -> HashMap<u32, Reachability> {
    let mut out = HashMap::new();
    for t in targets.iter_mut() {
        if t.session.end_reason.is_some() || !crate::procinfo::alive(t.pid) || t.reach_at_exit.is_some() {
            continue;
        }
        if let Some(r) = scan_one(tracer, t, mode, opts, start.elapsed().as_secs_f64()) {
            out.insert(t.pid, r);
        }
    }
    out
}

/// Scan one target (see [`scan_all`]); None when it could not be scanned (a warning line is
/// added to its recording and printed). `opts.at_exit`: the target is held at its teardown
/// stop (`exit`'s entry), which the result's notes say.
pub(super) fn scan_one(
    tracer: &Tracer,
    t: &mut Traced,
    mode: Mode,
    opts: reach::ScanOptions,
    t_s: f64,
) -> Option<Reachability> {
    if !matches!(mode, Mode::Exact) {
        if !t.warnings.iter().any(|w| w.starts_with("--reachability needs exact mode")) {
            t.warnings.push("--reachability needs exact mode: no scan".into());
        }
        return None;
    }
    let Some(map) = tracer.live_block_maps() else {
        t.warnings.push("reachability: the BLOCKS or ALLOCS map is missing: no scan".into());
        return None;
    };
    let pid = t.pid;
    let when = if opts.at_exit { " at its exit" } else { "" };
    crate::note!("leaktrace: reachability of PID {pid}{when}: stopping the target for the scan");
    let allocator_mapped = t.space.allocator_ranges();
    match reach::scan(pid, map, &|| tracer.site_keys(pid), opts, &allocator_mapped) {
        Ok(scan) => {
            crate::note!(
                "leaktrace: reachability of PID {pid}{when}: {} live block(s) scanned, target paused {:.1} ms",
                scan.blocks(),
                scan.pause().as_secs_f64() * 1e3
            );
            Some(scan.finish(t_s, &mut TracedNames { tracer, traced: t }))
        }
        Err(e) => {
            crate::note!("leaktrace: reachability of PID {pid}{when}: {e:#}");
            t.warnings.push(format!("reachability scan failed: {e:#}"));
            None
        }
    }
}
