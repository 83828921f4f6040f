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
//!
//! The window runs inside the same session, on the same loaded tracer ([`open_window`]): the
//! process's `TARGETS` entry is switched to exact mode (`Tracer::set_mode`: its page faults are
//! no longer counted), its allocator probes are attached beside its growth-mode ones, for it
//! alone (each uprobe is placed for one process: the others' calls never run it). `record`
//! runs the session loop over it alone for the window, after its growth-mode recording ended;
//! `watch`'s recorder takes the window's checkpoints beside its growth-mode windows, which go
//! on for every process (`Recorder::escalate`). Then those probes are detached
//! (`Tracer::detach_process_to`, [`close_window`]) and the process is switched back to growth
//! mode. No second eBPF object is loaded.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use super::live::Live;
use super::session::Session;
use super::{RecordOptions, Traced};
use crate::probes::{ProcessMark, Tracer};
use crate::procinfo;
use leaktrace_analysis::analyze::{AnalyzeOptions, ProcessClass, SiteClass, analyze};
use leaktrace_analysis::recording::Mode;
use leaktrace_analysis::recording::{EndReason, Recording};

/// Checkpoints of the exact window: about this many over its duration.
const WINDOW_CHECKPOINTS: u32 = 20;

/// For each traced process whose growth-mode window showed memory growing through the
/// allocator, an exact window of `opts.escalate` on it, in `session` (ended, its tracer still
/// loaded): PID → its recording. Empty unless `opts.mode` is growth and `opts.escalate` is set.
/// A process that could not be escalated (the recording was interrupted, the process exited,
/// attaching failed) gets a warning saying why, on stderr and in its report's caveats.
pub(super) fn escalate_all(
    session: &mut Session<Live>,
    opts: &RecordOptions,
    end_reason: EndReason,
    started_unix_ms: u64,
    dir: &Path,
) -> BTreeMap<u32, Recording> {
    let mut windows = BTreeMap::new();
    let Some(window) = opts.escalate.filter(|_| opts.process.mode == Mode::Growth) else { return windows };
    for i in 0..session.targets.len() {
        let t = &mut session.targets[i];
        let Some(under) = grows_through_allocator(t, opts, started_unix_ms) else { continue };
        let pid = t.pid;
        let ended = t.session.end_reason.unwrap_or(end_reason);
        let why_not = if ended != EndReason::Duration {
            Some(format!("the recording ended by {ended}, not --duration"))
        } else if !procinfo::alive(pid) {
            Some("the process has exited".to_string())
        } else {
            None
        };
        if let Some(why) = why_not {
            note(t, format!("growth mode saw {under}; no exact window: {why}"));
            continue;
        }
        crate::note!(
            "leaktrace: growth mode: PID {pid}'s memory grows through the allocator ({under}); \
             exact window: tracing its allocator calls for {:.1} s to name the function whose blocks grow \
             (--no-escalate to refuse)",
            window.as_secs_f64()
        );
        match exact_window(session, pid, window, opts, dir) {
            Ok(rec) => {
                crate::note!("leaktrace: exact window on PID {pid} done; its probes are removed");
                windows.insert(pid, rec);
            }
            Err(e) => {
                note(&mut session.targets[i], format!("growth mode: the exact window on PID {pid} failed: {e:#}"))
            }
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

/// The options of an exact window of `window` on one process of a session under `opts`:
/// checkpoints every window / [`WINDOW_CHECKPOINTS`] (at least 100 ms, at most the growth
/// mode's interval), the session's per-process options in exact mode, nothing else asked of it
/// (no scans, no censuses, no perf map asked of a JVM, no push).
pub(super) fn window_options(window: Duration, opts: &RecordOptions, dir: &Path) -> RecordOptions {
    RecordOptions {
        duration: Some(window),
        interval: (window / WINDOW_CHECKPOINTS).clamp(Duration::from_millis(100), opts.interval),
        out: Some(dir.to_path_buf()),
        process: super::ProcessOptions {
            mode: Mode::Exact,
            jvm_perf_map: false,
            heap_census: false,
            ..opts.process.clone()
        },
        ..opts.per_process()
    }
}

/// Record `pid` in exact mode for `window` in `session` (its tracer loaded, its loop not
/// running) and return its recording once its window's probes are detached. The session's
/// processes, options and sinks are set aside meanwhile and put back after.
fn exact_window(
    session: &mut Session<Live>,
    pid: u32,
    window: Duration,
    opts: &RecordOptions,
    dir: &Path,
) -> anyhow::Result<Recording> {
    let exact = window_options(window, opts, dir);
    let started_unix_ms = unix_ms_now();
    let (t, mark) = open_window(&mut session.host.tracer, pid, &exact)?;
    super::note_attached(std::slice::from_ref(&t), &[]);
    let recorded = run_alone(session, t, &exact);
    close_window(&mut session.host.tracer, mark, true)?;
    let (t, end) = recorded?;
    recording_of(t, end, &exact, started_unix_ms)
}

/// Milliseconds since the Unix epoch now (0 if the clock is before it).
pub(super) fn unix_ms_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Open an exact window under `exact` (see [`window_options`]) on `pid`, a process `tracer`
/// already traces in growth mode: its allocator probes attached beside its growth-mode ones,
/// for it alone (a uprobe placed for one process: the other processes' calls never run it),
/// its `TARGETS` entry switched to exact mode, its sites counted from now. Returns its
/// recording's process (no checkpoint taken yet) and where its probes stood before, for
/// [`close_window`]. Errors: a seccomp filter that its return probes would trip (refused before
/// anything is attached, as `record --mode exact` does), its objects unreadable, the probes
/// refused (those placed are detached again and it is back in growth mode).
pub(super) fn open_window(
    tracer: &mut Tracer,
    pid: u32,
    exact: &RecordOptions,
) -> anyhow::Result<(Traced, ProcessMark)> {
    crate::seccomp::check_target(pid, exact.process.allow_seccomp_risk)?;
    let objects = crate::discover::mapped_objects(pid)?;
    let mark = tracer.process_mark(pid);
    let attached = (|| {
        let mut t = Traced::attach(tracer, pid, objects, procinfo::cmdline(pid), procinfo::exe(pid), false, exact)?;
        tracer.set_mode(pid, Mode::Exact, None)?;
        t.count_sites_from_now(tracer)?;
        Ok::<_, anyhow::Error>(t)
    })();
    match attached {
        Ok(t) => Ok((t, mark)),
        Err(e) => {
            let _ = close_window(tracer, mark, true);
            Err(e)
        }
    }
}

/// Close an exact window opened by [`open_window`]: the probes attached since `mark` detached
/// (its growth-mode ones stay), and, with `back` (the process is still recorded), its `TARGETS`
/// entry back to growth mode: its page faults counted again.
pub(super) fn close_window(tracer: &mut Tracer, mark: ProcessMark, back: bool) -> anyhow::Result<()> {
    let pid = mark.pid();
    tracer.detach_process_to(mark);
    if back {
        tracer.set_mode(pid, Mode::Growth, None)?;
    }
    Ok(())
}

/// The recording of an exact window's process `t` (closed), ended by `end` unless it ended on
/// its own; `started_unix_ms`: its first checkpoint's Unix time.
pub(super) fn recording_of(
    t: Traced,
    end: EndReason,
    exact: &RecordOptions,
    started_unix_ms: u64,
) -> anyhow::Result<Recording> {
    let mut processes = super::assemble(vec![t], Default::default(), end, false, Path::new(""), exact, started_unix_ms);
    processes.pop().map(|p| p.recording).context("the exact window recorded no process")
}

/// Run `session`'s loop over `t` alone under `opts` until it ends (`opts.duration`, a signal, or
/// `t`'s exit); the session's own processes, options, sinks and start are put back after.
fn run_alone(session: &mut Session<Live>, t: Traced, opts: &RecordOptions) -> anyhow::Result<(Traced, EndReason)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let targets = std::mem::replace(&mut session.targets, vec![t]);
    let host_opts = std::mem::replace(&mut session.host.opts, opts.clone());
    let sinks = std::mem::take(&mut session.host.sinks);
    let (start, work_probe, follow_forks) = (session.start, session.work_probe.take(), session.follow_forks);
    session.work_probe = opts.process.work_probe.clone();
    session.follow_forks = false;
    let end = rt.block_on(session.run(opts));
    let t = std::mem::replace(&mut session.targets, targets).pop().context("the exact window's process is gone")?;
    session.host.opts = host_opts;
    session.host.sinks = sinks;
    (session.start, session.work_probe, session.follow_forks) = (start, work_probe, follow_forks);
    Ok((t, end))
}

/// A warning on stderr and in the process's report caveats.
fn note(t: &mut Traced, line: String) {
    crate::note!("leaktrace: {line}");
    t.warnings.push(line);
}
