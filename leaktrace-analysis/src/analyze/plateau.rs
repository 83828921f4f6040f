//! Load-spike plateaus: RSS (anon) that rose in steps, each at a burst of
//! allocation, and stayed flat between them while the live bytes fell back after each burst.
//! The allocator keeps the pages a peak made resident (glibc returns only the top of a heap, and
//! a block kept above the freed ones pins them; jemalloc keeps dirty pages until they decay): a
//! plateau raised by load, not a leak. Found on the whole analysed span, whatever the verdict's
//! class; the verdict's sentence names the steps when it is not a leak.

use std::collections::HashMap;
use std::ops::Range;

use serde::Serialize;

use super::Analysis;
use crate::recording::{Recording, StackKind};
use crate::timeline::Timeline;

/// RSS (anon) must rise by at least this much over the span, bytes: below it a plateau is not
/// worth a clause (a thread cache, one arena's first heap).
pub const PLATEAU_MIN_BYTES: u64 = 4 << 20;

/// A step is a run of checkpoint intervals in which RSS rose, by at least this many bytes in all
/// (256 pages) and [`PLATEAU_STEP_SHARE`] of RSS's whole rise.
pub const PLATEAU_STEP_MIN_BYTES: u64 = 1 << 20;

/// A step's share of RSS's whole rise (its highest value over the span − its first).
pub const PLATEAU_STEP_SHARE: f64 = 0.1;

/// Between the steps RSS may rise by at most this share of the steps' sum ("flat between"), and
/// the live bytes after the steps may exceed their start by at most this share too (they fell
/// back after each burst).
pub const PLATEAU_DRIFT_SHARE: f64 = 0.25;

/// A step coincides with a burst of allocation when its intervals allocated at least this many
/// times the median allocation of an interval outside the steps (per interval), and at least
/// half the step's bytes.
pub const PLATEAU_BURST_FACTOR: f64 = 4.0;

/// One step of RSS at a burst of allocation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlateauStep {
    /// Time of the first checkpoint that saw RSS risen, seconds since the first checkpoint.
    pub t_s: f64,
    /// How much RSS (anon) rose over the step's intervals, bytes.
    pub bytes: u64,
    /// Bytes allocated (every traced site) over the step's intervals: the burst.
    pub allocated_bytes: u64,
    /// The site that allocated most in it (its culprit function) and its bytes; None when no
    /// site is known.
    pub top_function: Option<String>,
    pub top_allocated_bytes: u64,
    /// The highest traced live bytes at the step's checkpoints: the peak it served.
    pub live_peak_bytes: u64,
}

/// RSS raised in steps by load spikes and flat between them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plateau {
    /// The steps, in time order (at least two).
    pub steps: Vec<PlateauStep>,
    /// RSS (anon) at the start of the analysed span, and its median over the span's last half
    /// (what the plateau holds; robust to a process that frees all before it exits), bytes.
    pub rss_anon_start_bytes: u64,
    pub rss_anon_late_bytes: u64,
    /// RSS's rise outside the steps (the net move of each stretch between them, positive ones
    /// summed), bytes.
    pub between_bytes: u64,
    /// Traced live bytes (every site) at the start of the span, their median at the checkpoints
    /// outside the steps (between the spikes), and their highest, bytes.
    pub live_start_bytes: u64,
    pub live_between_bytes: u64,
    pub live_peak_bytes: u64,
}

/// One checkpoint of the span: time (s), RSS anon, traced live bytes, bytes allocated so far.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Point {
    pub(super) t: f64,
    pub(super) rss: u64,
    pub(super) live: u64,
    pub(super) allocated: u64,
}

/// The first interval after start-up: the first step's when the span starts at the process's
/// start (`startup`), else 0.
fn startup_end(steps: &[Range<usize>], startup: bool) -> usize {
    steps.first().filter(|_| startup).map_or(0, |r| r.start)
}

/// RSS's rise between the steps: over each stretch of intervals outside them (`in_step` false),
/// its net move (an RSS that swings up and down as a runtime collects rises by nothing), the
/// positive ones summed, bytes.
pub(super) fn rise_between(moves: &[i128], in_step: impl Fn(usize) -> bool) -> i128 {
    let (mut total, mut stretch) = (0i128, 0i128);
    for (i, &m) in moves.iter().enumerate() {
        if in_step(i) {
            total += stretch.max(0);
            stretch = 0;
        } else {
            stretch += m;
        }
    }
    total + stretch.max(0)
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// The steps of `pts` (checkpoints in time order) as ranges of intervals (interval `i` is from
/// point `i` to `i + 1`), when the series is a load-spike plateau:
/// - RSS's highest value exceeds its first by at least [`PLATEAU_MIN_BYTES`];
/// - a step is a run of intervals in which RSS rose (each by at least 1/20 of that rise and 64
///   pages), by at least [`PLATEAU_STEP_MIN_BYTES`] and [`PLATEAU_STEP_SHARE`] of the rise in
///   all, not starting at the first interval when `startup` (the span starts with the process's
///   start-up, not after idle checkpoints: that run is neither a step nor a rise between them), and whose intervals allocated at least
///   half its bytes and [`PLATEAU_BURST_FACTOR`] × the median allocation of the other intervals
///   per interval (a burst); at least two such steps;
/// - flat between: RSS rose by at most [`PLATEAU_DRIFT_SHARE`] of the steps' sum outside them
///   (the net move of each stretch between steps, positive ones summed: [`rise_between`]),
///   and its median over the last half of the span still holds at least half of it (not
///   returned);
/// - live bytes bounded: their median over the checkpoints outside the steps exceeds their
///   level after start-up (when `startup`, everything before the first step: a runtime's own
///   heap made at start-up) by at most [`PLATEAU_DRIFT_SHARE`] of the steps' sum (they fall back after each burst).
pub(super) fn steps(pts: &[Point], startup: bool) -> Option<Vec<Range<usize>>> {
    if pts.len() < 5 {
        return None;
    }
    let first = pts[0];
    let rise = pts.iter().map(|p| p.rss).max()?.saturating_sub(first.rss);
    if rise < PLATEAU_MIN_BYTES {
        return None;
    }
    let moves: Vec<i128> = pts.windows(2).map(|w| w[1].rss as i128 - w[0].rss as i128).collect();
    let alloc: Vec<u64> = pts.windows(2).map(|w| w[1].allocated.saturating_sub(w[0].allocated)).collect();
    let rising = (rise / 20).max(64 * 4096) as i128;
    let mut runs: Vec<Range<usize>> = Vec::new();
    for (i, &m) in moves.iter().enumerate() {
        if m >= rising {
            match runs.last_mut() {
                Some(r) if r.end == i => r.end = i + 1,
                _ => runs.push(i..i + 1),
            }
        }
    }
    let step_min = ((PLATEAU_STEP_SHARE * rise as f64) as u64).max(PLATEAU_STEP_MIN_BYTES);
    let run_rise = |r: &Range<usize>| pts[r.end].rss.saturating_sub(pts[r.start].rss);
    // A run at the first interval is the process's start-up (when the span starts at the
    // recording's start): neither a step nor a rise between steps.
    let startup_run = runs.first().filter(|r| startup && r.start == 0).cloned();
    runs.retain(|r| !(startup && r.start == 0) && run_rise(r) >= step_min);
    let in_runs = |i: usize| runs.iter().any(|r| r.contains(&i));
    let baseline = median((0..moves.len()).filter(|&i| !in_runs(i)).map(|i| alloc[i]).collect());
    let steps: Vec<Range<usize>> = runs
        .iter()
        .filter(|&r| {
            let burst: u64 = alloc[r.clone()].iter().sum();
            burst as f64 >= 0.5 * run_rise(r) as f64
                && burst as f64 >= PLATEAU_BURST_FACTOR * baseline as f64 * r.len() as f64
        })
        .cloned()
        .collect();
    if steps.len() < 2 {
        return None;
    }
    // With the span starting at the process's start, everything before the first step is its
    // start-up (a runtime loading and setting up its heap, over several checkpoints when the
    // machine is loaded): neither a rise between steps nor live bytes between spikes.
    let startup_end = startup_end(&steps, startup);
    let in_steps = |i: usize| i < startup_end || steps.iter().chain(&startup_run).any(|r| r.contains(&i));
    let sum: u64 = steps.iter().map(run_rise).sum();
    let between = rise_between(&moves, in_steps);
    let drift = PLATEAU_DRIFT_SHARE * sum as f64;
    // What RSS still holds: its median over the last half of the span (a process that frees
    // all at exit returns its pages at the last checkpoint; that is no return after each peak).
    let kept = median(pts[pts.len() / 2..].iter().map(|p| p.rss).collect()).saturating_sub(first.rss);
    // Live bytes between the bursts: their median at the checkpoints outside the steps (the
    // first one and every one ending an interval that is no step's; a checkpoint may catch a
    // later burst in flight).
    let outside = std::iter::once(startup_end).chain((0..moves.len()).filter(|&i| !in_steps(i)).map(|i| i + 1));
    let live_between = median(outside.map(|k| pts[k].live).collect());
    // Against the live bytes after start-up: a runtime's start-up makes its own heap (V8's
    // pages, the interpreter's arenas) before any spike.
    let live_base = pts[startup_end].live;
    let live_bounded = live_between.saturating_sub(live_base) as f64 <= drift;
    (between as f64 <= drift && kept as f64 >= 0.5 * sum as f64 && live_bounded).then_some(steps)
}

/// The load-spike plateau of `a` (analysed from `rec` and its timeline `tl`) over its analysed
/// span, with what allocated most in each step; None when RSS did not rise in such steps, in
/// growth mode (no allocation is seen there), or without memory figures.
pub fn plateau(rec: &Recording, tl: &Timeline, a: &Analysis) -> Option<Plateau> {
    let (pts, snaps) = span_points(rec, tl, a.span_from_s, a.span_to_s)?;
    let ranges = steps(&pts, a.span_from_s <= 0.0)?;
    let name = |id: u32| a.sites.iter().find(|s| s.id == id).map(|s| s.function.clone());
    let steps = ranges
        .iter()
        .map(|r| {
            let (before, after) = (&snaps[r.start], &snaps[r.end]);
            let top = after
                .iter()
                .map(|(id, b)| (*id, b.saturating_sub(before.get(id).copied().unwrap_or(0))))
                .max_by_key(|&(id, b)| (b, std::cmp::Reverse(id)));
            PlateauStep {
                t_s: pts[r.start + 1].t,
                bytes: pts[r.end].rss.saturating_sub(pts[r.start].rss),
                allocated_bytes: pts[r.end].allocated.saturating_sub(pts[r.start].allocated),
                top_function: top.and_then(|(id, _)| name(id)),
                top_allocated_bytes: top.map_or(0, |t| t.1),
                live_peak_bytes: pts[r.start + 1..=r.end].iter().map(|p| p.live).max().unwrap_or(0),
            }
        })
        .collect();
    let first = pts[0];
    let begin = startup_end(&ranges, a.span_from_s <= 0.0);
    let outside = |i: &usize| *i >= begin && !ranges.iter().any(|r| r.contains(i));
    let live_between = median(
        std::iter::once(pts[begin].live).chain((0..pts.len() - 1).filter(outside).map(|i| pts[i + 1].live)).collect(),
    );
    let moves: Vec<i128> = pts.windows(2).map(|w| w[1].rss as i128 - w[0].rss as i128).collect();
    let between = u64::try_from(rise_between(&moves, |i| !outside(&i))).unwrap_or(u64::MAX);
    Some(Plateau {
        rss_anon_start_bytes: first.rss,
        rss_anon_late_bytes: median(pts[pts.len() / 2..].iter().map(|p| p.rss).collect()),
        between_bytes: between,
        live_start_bytes: first.live,
        live_between_bytes: live_between,
        live_peak_bytes: pts.iter().map(|p| p.live).max().unwrap_or(0),
        steps,
    })
}

/// The load spikes of a plateau ([`spikes`]): when the managed heap rose at them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Spikes {
    /// Every burst of allocation in the span, as (start, end) of its checkpoint interval, in the
    /// timeline's seconds (the checkpoints' clock); in time order.
    pub(super) bursts: Vec<(f64, f64)>,
    /// RSS's rise over the plateau's steps, summed, bytes.
    pub(super) steps_bytes: u64,
}

/// The load spikes of the span from `span_from_s` to `span_to_s` (seconds since the first
/// checkpoint) when RSS rose there in a load-spike plateau ([`steps`]): every interval that
/// allocated like the plateau's steps did (at least half the allocation per interval of its
/// smallest step, and [`PLATEAU_BURST_FACTOR`] × the median interval's), so the later spikes
/// that raised RSS no more are bursts too. None without a plateau, in growth mode, or without
/// memory figures.
pub(super) fn spikes(rec: &Recording, tl: &Timeline, span_from_s: f64, span_to_s: f64) -> Option<Spikes> {
    let (pts, _) = span_points(rec, tl, span_from_s, span_to_s)?;
    let ranges = steps(&pts, span_from_s <= 0.0)?;
    let alloc: Vec<u64> = pts.windows(2).map(|w| w[1].allocated.saturating_sub(w[0].allocated)).collect();
    let per_interval = |r: &Range<usize>| alloc[r.clone()].iter().sum::<u64>() / r.len().max(1) as u64;
    let smallest = ranges.iter().map(per_interval).min()?;
    let threshold = (smallest / 2).max((PLATEAU_BURST_FACTOR * median(alloc.clone()) as f64) as u64).max(1);
    let t0 = tl.times.first().copied()?;
    let bursts =
        (0..alloc.len()).filter(|&i| alloc[i] >= threshold).map(|i| (pts[i].t + t0, pts[i + 1].t + t0)).collect();
    let steps_bytes = ranges.iter().map(|r| pts[r.end].rss.saturating_sub(pts[r.start].rss)).sum();
    Some(Spikes { bursts, steps_bytes })
}

/// Every stack's allocated bytes so far, by stack id, at one checkpoint.
type Allocated = HashMap<u32, u64>;

/// The checkpoints of the span from `span_from_s` to `span_to_s` (seconds since the first
/// checkpoint) that have memory figures, as [`Point`]s, with every stack's allocated bytes so
/// far at each; None in growth mode (no allocation is seen there).
fn span_points(
    rec: &Recording,
    tl: &Timeline,
    span_from_s: f64,
    span_to_s: f64,
) -> Option<(Vec<Point>, Vec<Allocated>)> {
    if tl.stacks.iter().any(|s| s.kind == StackKind::Fault) {
        return None;
    }
    let t0 = tl.times.first().copied()?;
    let in_span = |t: f64| t - t0 >= span_from_s - 1e-6 && t - t0 <= span_to_s + 1e-6;
    // Every stack's allocated bytes so far (samples are cumulative; a stack absent from a
    // checkpoint keeps its last totals), kept at each checkpoint of the span.
    let mut cur: HashMap<u32, u64> = HashMap::new();
    let mut snaps: Vec<HashMap<u32, u64>> = Vec::new();
    let mut pts: Vec<Point> = Vec::new();
    for (k, &ci) in tl.order.iter().enumerate() {
        let c = &rec.checkpoints[ci];
        for s in &c.sites {
            cur.insert(s.stack, s.alloc_bytes);
        }
        let (Some(m), true) = (c.memory.as_ref(), in_span(tl.times[k])) else { continue };
        let live: u64 = (0..tl.stacks.len())
            .map(|si| match tl.stacks[si].kind {
                StackKind::Mmap => tl.resident[si][k].unwrap_or(tl.live_bytes[si][k]),
                _ => tl.live_bytes[si][k],
            })
            .sum();
        pts.push(Point { t: tl.times[k] - t0, rss: m.rss_anon_bytes, live, allocated: cur.values().sum() });
        snaps.push(cur.clone());
    }
    Some((pts, snaps))
}

/// The knob that returns a peak's pages, by allocator (`family`: the probed allocator library,
/// None for the C library's malloc).
pub fn knob(family: Option<&str>) -> &'static str {
    match family {
        None => {
            "glibc returns only the top of a heap above M_TRIM_THRESHOLD (128 KiB by default) and a block kept above \
             the freed ones pins them: malloc_trim(0) after a spike returns the free pages inside the heaps; \
             MALLOC_ARENA_MAX=2 when the spikes run on many threads (one arena each)"
        }
        other => super::retention::allocator_and_knob(other).1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// 41 checkpoints 0.5 s apart; a spike every 8 checkpoints from k = 4 allocates `spike(j)`
    /// bytes in one interval; RSS and live bytes given per checkpoint.
    fn run(rss: impl Fn(usize) -> u64, live: impl Fn(usize) -> u64, background: u64) -> Vec<Point> {
        let mut allocated = 0;
        (0..41)
            .map(|k| {
                allocated += background;
                if k % 8 == 4 {
                    allocated += 40 * MIB;
                }
                Point { t: k as f64 * 0.5, rss: rss(k), live: live(k), allocated }
            })
            .collect()
    }

    /// RSS steps by 8 MiB at the first three spikes and stays flat; live bytes spike and fall
    /// back to ~256 KiB: a plateau of three steps, each at its burst.
    #[test]
    fn rss_raised_in_steps_by_bursts_is_a_plateau() {
        let rss = |k: usize| 40 * MIB + 8 * MIB * ((k + 4) / 8).min(3) as u64;
        let live = |k: usize| if k % 8 == 4 { 30 * MIB } else { 256 << 10 };
        let pts = run(rss, live, 64 << 10);
        let s = steps(&pts, true).expect("a plateau");
        assert_eq!(s, vec![3..4, 11..12, 19..20]);
        // A process that frees all before it exits returns the pages at its last checkpoint:
        // still a plateau over its run.
        let mut exiting = pts.clone();
        exiting.last_mut().expect("points").rss = 300 << 10;
        assert_eq!(steps(&exiting, true), Some(s));
        // A span that starts after idle checkpoints (the first spike is its first activity):
        // its first interval is a step, not start-up; at a process's start it is neither.
        let after_idle: Vec<Point> = pts[3..].to_vec();
        assert_eq!(steps(&after_idle, false), Some(vec![0..1, 8..9, 16..17]));
        assert_eq!(steps(&after_idle, true), Some(vec![8..9, 16..17]));
    }

    /// A runtime's start-up makes its own heap (live bytes 0 → 12 MiB in the first interval,
    /// V8's pages): the live bytes between spikes are measured against what start-up left
    /// (everything before the first step), so the plateau is found; in a span after idle
    /// checkpoints (no start-up) they count from the span's first point and it is not.
    #[test]
    fn live_bytes_made_at_start_up_do_not_hide_a_plateau() {
        let rss = |k: usize| if k == 0 { 0 } else { 12 * MIB + 8 * MIB * ((k + 4) / 8).min(3) as u64 };
        let live = |k: usize| match k {
            0 => 0,
            _ if k % 8 == 4 => 42 * MIB,
            _ => 12 * MIB + (256 << 10),
        };
        let pts = run(rss, live, 64 << 10);
        assert_eq!(steps(&pts, true), Some(vec![3..4, 11..12, 19..20]));
        assert_eq!(steps(&pts, false), None);
    }

    /// RSS that swings up and down between the spikes (a runtime's heap growing and collected,
    /// ±1.5 MiB every checkpoint) rises by nothing there: still a plateau. The positive moves
    /// alone would sum to 3 × 7 × 1.5 MiB, far above a quarter of the steps.
    #[test]
    fn rss_swinging_between_spikes_is_still_a_plateau() {
        let swing = |k: usize| if k % 2 == 1 { 3 * MIB / 2 } else { 0 };
        let rss = |k: usize| 40 * MIB + 8 * MIB * ((k + 4) / 8).min(3) as u64 + swing(k);
        let live = |k: usize| if k % 8 == 4 { 30 * MIB } else { 256 << 10 };
        assert!(steps(&run(rss, live, 64 << 10), true).is_some());
        assert_eq!(rise_between(&[5, -5, 100, 3, -1], |i| i == 2), 2);
        assert_eq!(rise_between(&[5, 1, 100, -3, -1], |i| i == 2), 6);
    }

    /// A leak's RSS rises with its live bytes: no plateau, whatever the bursts.
    #[test]
    fn live_bytes_that_follow_rss_are_no_plateau() {
        let rss = |k: usize| 40 * MIB + 8 * MIB * ((k + 4) / 8) as u64;
        let live = |k: usize| 8 * MIB * ((k + 4) / 8) as u64;
        assert!(steps(&run(rss, live, 64 << 10), true).is_none());
    }

    /// RSS that rises steadily between the spikes is growth, not a plateau; RSS that rises at
    /// steps with no burst of allocation (untraced memory) is not one either.
    #[test]
    fn steady_rise_or_steps_without_bursts_are_no_plateau() {
        let live = |_| 256 << 10;
        let steady = |k: usize| 40 * MIB + 8 * MIB * ((k + 4) / 8).min(3) as u64 + MIB * k as u64;
        assert!(steps(&run(steady, live, 64 << 10), true).is_none());
        let no_burst = |k: usize| 40 * MIB + 8 * MIB * ((k + 2) / 8).min(3) as u64;
        assert!(steps(&run(no_burst, live, 64 << 10), true).is_none());
    }

    /// One step is a warm-up, not a plateau raised by load; a rise under 4 MiB is not worth a
    /// clause; RSS returned after each spike is no plateau.
    #[test]
    fn one_step_small_rises_and_returned_pages_are_no_plateau() {
        let live = |_| 256 << 10;
        let one = |k: usize| 40 * MIB + if k >= 4 { 16 * MIB } else { 0 };
        assert!(steps(&run(one, live, 0), true).is_none());
        let small = |k: usize| 40 * MIB + MIB * ((k + 4) / 8).min(3) as u64;
        assert!(steps(&run(small, live, 0), true).is_none());
        let returned = |k: usize| 40 * MIB + if k % 8 == 4 { 8 * MIB * (k / 8 + 1) as u64 } else { 0 };
        assert!(steps(&run(returned, live, 0), true).is_none());
    }

    /// Through the whole analysis: a job every 10 s allocates 40 MiB in 1 KiB blocks and keeps
    /// 1 in 64 of them (the last job's: bounded) beside 1 MB/s of churn; RSS anon steps by 8 MiB
    /// at the first three jobs and stays flat. The verdict is not a leak and names the three
    /// steps, their times and the job, and glibc's knob.
    #[test]
    fn load_spike_plateau_is_named_in_the_verdict() {
        use crate::analyze::fixtures::*;
        use crate::analyze::{AnalyzeOptions, ProcessClass, analyze};
        use crate::recording::Stack;
        let job = Stack {
            id: 5,
            kind: StackKind::Malloc,
            frames: vec![
                frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
                frame("spike_job", "/opt/server/bin/server", Some(("/build/src/job.c", 7))).into(),
                frame("main", "/opt/server/bin/server", Some(("/build/src/main.c", 3))).into(),
            ],
            lost: false,
            truncated: None,
            shared: false,
        };
        let spikes = |t: f64| ((t as u64 + 5) / 10).min(6);
        let f: SiteFn = Box::new(move |t: f64| {
            let j = spikes(t);
            let kept = if j > 0 { 40 * MIB / 64 } else { 0 };
            (40 * MIB * j + 1, 40 * 1024 * j + 1, 40 * MIB * j + 1 - kept, 40 * 1024 * j + 1 - kept / 1024)
        });
        let rec = recording(
            &times61(),
            vec![(job, f), temp_site()],
            &|t| mem(40 * MIB + 8 * MIB * spikes(t).min(3)),
            &no_counters,
        );
        let a = analyze(&rec, &AnalyzeOptions::default());
        let s = crate::report::verdict::sentence(&a);
        let ctx = format!("{:?}\n{:?}\n{s}", a.plateau, a.verdict);
        assert!(!matches!(a.verdict.class, ProcessClass::Leak | ProcessClass::OffHeap), "{ctx}");
        let p = a.plateau.as_ref().expect(&ctx);
        assert_eq!(p.steps.iter().map(|s| s.t_s).collect::<Vec<_>>(), vec![5.0, 15.0, 25.0], "{ctx}");
        assert!(p.steps.iter().all(|s| s.bytes == 8 * MIB && s.allocated_bytes >= 40 * MIB), "{ctx}");
        assert_eq!(p.steps[0].top_function.as_deref(), Some("spike_job"), "{ctx}");
        assert!(
            s.contains("RSS (anon) rose in 3 steps of ~8.0 MiB at load spikes at t=5.0 s, 15.0 s, 25.0 s"),
            "{ctx}"
        );
        assert!(s.contains("most by spike_job") && s.contains("a plateau raised by load, not a leak"), "{ctx}");
        assert!(s.contains("malloc_trim(0)") && s.contains("M_TRIM_THRESHOLD"), "{ctx}");
    }
}
