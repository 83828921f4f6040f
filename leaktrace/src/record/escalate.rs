//! Growth mode's escalation. Growth mode charges a page to the stack that first
//! touches it; when that stack runs inside malloc, it names whoever asked the allocator for
//! memory when its heap reached a new page, not the code whose blocks hold it. So when a
//! process's growth-mode window shows such growth (a leaking fault site that touched its pages
//! inside the allocator: `leaktrace_analysis`'s `first_touch_in`), leaktrace traces every
//! allocator call of that process for a bounded window afterwards (`--escalate-for`, default
//! 10 s; `--no-escalate` refuses), as exact mode does, and removes those probes again. The
//! window's recording goes into the process's recording (`escalation`), and its verdict leads
//! the report's.
//!
//! Bounds: one window per process, only when the recording ended by `--duration` (not by a
//! signal: the user asked to stop) and the process still runs; the window's probes are the same
//! as `record --mode exact`'s (their cost is docs/benchmarks.md's exact mode) and are detached
//! before the report is written; the target is never stopped.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use super::{RecordOptions, Schedule, TargetSpec, Traced};
use crate::analyze::{AnalyzeOptions, ProcessClass, SiteClass, analyze};
use crate::procinfo;
use crate::recording::Mode;
use crate::recording::{EndReason, Recording};

/// Checkpoints of the exact window: about this many over its duration.
const WINDOW_CHECKPOINTS: u32 = 20;

/// For each traced process whose growth-mode window showed memory growing through the
/// allocator, an exact window of `opts.escalate` on it: PID → its recording. Empty unless
/// `opts.mode` is growth and `opts.escalate` is set. A process that could not be escalated
/// (the recording was interrupted, the process exited, attaching failed) gets a warning saying
/// why, on stderr and in its report's caveats.
pub(super) fn escalate_all(
    targets: &mut [Traced],
    opts: &RecordOptions,
    end_reason: EndReason,
    started_unix_ms: u64,
    dir: &Path,
) -> BTreeMap<u32, Recording> {
    let mut windows = BTreeMap::new();
    let Some(window) = opts.escalate.filter(|_| opts.mode == Mode::Growth) else { return windows };
    for t in targets.iter_mut() {
        let Some(under) = grows_through_allocator(t, opts, started_unix_ms) else { continue };
        let ended = t.session.end_reason.unwrap_or(end_reason);
        let why_not = if ended != EndReason::Duration {
            Some(format!("the recording ended by {ended}, not --duration"))
        } else if !procinfo::alive(t.pid) {
            Some("the process has exited".to_string())
        } else {
            None
        };
        if let Some(why) = why_not {
            note(t, format!("growth mode saw {under}; no exact window: {why}"));
            continue;
        }
        crate::note!(
            "leaktrace: growth mode: PID {}'s memory grows through the allocator ({under}); \
             exact window: tracing its allocator calls for {:.1} s to name the function whose blocks grow \
             (--no-escalate to refuse)",
            t.pid,
            window.as_secs_f64()
        );
        match exact_window(t.pid, window, opts, dir) {
            Ok(rec) => {
                crate::note!("leaktrace: exact window on PID {} done; its probes are removed", t.pid);
                windows.insert(t.pid, rec);
            }
            Err(e) => note(t, format!("growth mode: the exact window on PID {} failed: {e:#}", t.pid)),
        }
    }
    windows
}

/// What the fastest-growing leaking site whose pages came through the allocator measured ("pages
/// first touched under F inside the allocator (_int_realloc)" for a fault site, "pages mapped by
/// the allocator (jemalloc) under F" for the allocator's own mapping: `through_allocator`),
/// from an analysis of the growth-mode window as it is now; None when there is
/// no such site, or when the process verdict is already fragmentation (glibc's own headers say
/// the arenas keep freed memory: an exact window would only cost).
fn grows_through_allocator(t: &mut Traced, opts: &RecordOptions, started_unix_ms: u64) -> Option<String> {
    let rec = t.snapshot(opts, started_unix_ms);
    let a = analyze(&rec, &AnalyzeOptions { top: opts.top });
    if a.verdict.class == ProcessClass::Fragmentation {
        return None;
    }
    a.sites
        .iter()
        .filter(|s| s.class == SiteClass::Leak && s.first_touch_in.is_some())
        .max_by(|x, y| x.growth_bytes_per_s.total_cmp(&y.growth_bytes_per_s))
        .and_then(|s| s.through_allocator())
}

/// Record `pid` in exact mode for `window` (checkpoints every window / [`WINDOW_CHECKPOINTS`],
/// at least 100 ms, at most the growth mode's interval), nothing else asked of it (no scans, no
/// censuses, no push), and return its recording once its probes are detached.
pub(crate) fn exact_window(pid: u32, window: Duration, opts: &RecordOptions, dir: &Path) -> anyhow::Result<Recording> {
    let interval = (window / WINDOW_CHECKPOINTS).clamp(Duration::from_millis(100), opts.interval);
    let exact = RecordOptions {
        duration: Some(window),
        interval,
        out: Some(dir.to_path_buf()),
        status_line: false,
        schedule: Schedule::Periodic,
        mode: Mode::Exact,
        follow_forks: false,
        jvm_perf_map: false,
        heap_census: false,
        heap_dump: None,
        reachability: None,
        python_heap: None,
        push: None,
        escalate: None,
        ..opts.clone()
    };
    let mut recorded = super::record_all(TargetSpec::Pid(pid), &exact)?;
    recorded.wait_detached();
    recorded.processes.pop().map(|p| p.recording).context("the exact window recorded no process")
}

/// A warning on stderr and in the process's report caveats.
fn note(t: &mut Traced, line: String) {
    crate::note!("leaktrace: {line}");
    t.warnings.push(line);
}
