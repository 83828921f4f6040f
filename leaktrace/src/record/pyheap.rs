//! Python heap hook (#31, `--python-heap`): a census of each traced CPython process at the
//! first periodic checkpoint, at every Nth one (`--python-heap-every`) and at the end
//! ([`crate::pyheap`]), kept for its recording.

use std::time::Instant;

use crate::pyheap::HeapOptions;

use super::traced::Traced;

/// Whether the `n`th periodic checkpoint takes a census.
pub(super) fn due(o: &HeapOptions, n: u64) -> bool {
    n == 1 || o.every.is_some_and(|e| n.is_multiple_of(u64::from(e)))
}

/// A census of every live CPython target. A target whose heap cannot be read gets one warning
/// (once) in its recording and on stderr; the others go on.
pub(super) fn census_all(targets: &mut [Traced], opts: HeapOptions, start: Instant) {
    for t in targets.iter_mut() {
        if t.session.end_reason.is_some()
            || !crate::procinfo::alive(t.pid)
            || t.runtime.as_ref().is_none_or(|r| r.name != crate::recording::Runtime::Python)
        {
            continue;
        }
        let pid = t.pid;
        let located = t.py_heap.located.get_or_insert_with(|| crate::pyheap::locate(pid));
        let at = match located {
            Ok(at) => *at,
            Err(why) => {
                let why = std::mem::take(why);
                if !why.is_empty() {
                    crate::note!("leaktrace: PID {pid}: {why}");
                    t.warnings.push(why);
                }
                continue;
            }
        };
        match crate::pyheap::census(pid, &at, opts, start) {
            Ok(c) => {
                crate::note!(
                    "leaktrace: Python heap of PID {pid}: {} objects ({} containers), target paused {:.1} ms{}",
                    c.objects,
                    c.gc_objects,
                    c.pause_ms,
                    if c.complete { "" } else { " (partial)" }
                );
                t.py_heap.censuses.push(c);
            }
            Err(e) => {
                let line = format!("Python heap census failed: {e:#}");
                crate::note!("leaktrace: PID {pid}: {line}");
                if !t.warnings.contains(&line) {
                    t.warnings.push(line);
                }
            }
        }
    }
}
