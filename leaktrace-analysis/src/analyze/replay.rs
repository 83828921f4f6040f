//! The analysis proper: checkpoints replayed into per-site and per-process series, the steady
//! window, process figures, then each site and the verdict.

use std::collections::BTreeMap;

use leaktrace_common::counter;

use super::*;
use crate::recording::{EndReason, Mode, Recording, StackKind};
use crate::runtimes::MemoryKind;
use crate::timeline::{KindSeries, Timeline};

/// One site's series, one entry per time-sorted checkpoint (a view into the [`Timeline`]).
pub(super) struct Series<'a> {
    pub(super) live_bytes: &'a [u64],
    pub(super) live_count: &'a [u64],
    pub(super) last: &'a crate::recording::SiteSample,
    /// Mappings: resident bytes at the last checkpoint that had the figure.
    pub(super) resident: Option<u64>,
    /// Threads' memory ([`crate::runtimes::is_thread_stack`]); for a thread stack `live_bytes`
    /// holds its resident bytes.
    pub(super) threads: bool,
    /// Per checkpoint, the sum of the live blocks' birth times (ms, the recording's clock);
    /// None without birth times ([`Timeline::live_born_ms`]).
    pub(super) live_born_ms: Option<&'a [i64]>,
}

/// Analyse a recording. Never panics on odd input (no checkpoint, one checkpoint, zero duration,
/// missing memory figures, samples that refer to unknown stacks); such cases lower the confidence
/// and add a warning instead.
pub fn analyze(rec: &Recording, opts: &AnalyzeOptions) -> Analysis {
    analyze_timeline(rec, &Timeline::new(rec), opts)
}

/// [`analyze`] with the recording's [`Timeline`] already built.
///
/// A launched command whose teardown was caught (a checkpoint with
/// [`crate::recording::Checkpoint::teardown`], followed by the checkpoint after exit) is judged
/// on the checkpoints up to its teardown: static destructors, atexit handlers and interpreter
/// finalization free what the program held, and a leak released only at exit is still a leak
/// of the running program. What the teardown freed is reported apart
/// ([`Analysis::freed_at_exit`]); what remained after exit stays in [`Analysis::at_exit`].
pub fn analyze_timeline(rec: &Recording, tl: &Timeline, opts: &AnalyzeOptions) -> Analysis {
    let Some((head, td)) = before_teardown(rec, tl) else {
        let mut a = analyze_span(rec, tl, opts);
        a.at_exit = (rec.end_reason == EndReason::TargetExited).then(|| at_exit_of(rec, &a.sites, tl));
        return a;
    };
    let htl = Timeline::new(&head);
    let mut a = analyze_span(&head, &htl, opts);
    a.at_exit = (rec.end_reason == EndReason::TargetExited).then(|| at_exit_of(rec, &a.sites, tl));
    let mut freed = Vec::new();
    for (i, s) in a.sites.iter().enumerate() {
        let Some(&si) = tl.index.get(&s.id) else { continue };
        let (b0, b1) = (tl.live_bytes[si][td], tl.live_bytes[si].last().copied().unwrap_or(0));
        let (c0, c1) = (tl.live_count[si][td], tl.live_count[si].last().copied().unwrap_or(0));
        if b0 > b1 {
            freed.push((i, b0 - b1, c0.saturating_sub(c1)));
        }
    }
    freed.sort_by_key(|&(i, b, _)| (std::cmp::Reverse(b), i));
    let t0 = tl.times.first().copied().unwrap_or(0.0);
    if !rec.checkpoints.iter().any(|c| c.teardown) {
        a.warnings.push(format!(
            "the process's finalization (from {:.1} s: frees of blocks allocated before attach, until its exit) is left out of the growth analysis",
            tl.times[td] - t0
        ));
    }
    a.freed_at_exit = Some(FreedAtExit {
        teardown_s: tl.times[td] - t0,
        bytes: freed.iter().map(|f| f.1).sum(),
        blocks: freed.iter().map(|f| f.2).sum(),
        sites: freed,
    });
    a
}

/// The part of `rec` up to its teardown checkpoint, and that checkpoint's position in `tl`;
/// without one (an attached process is not held at its exit), up to the start of the final
/// surge of frees of blocks allocated before attach that its finalization makes
/// ([`super::finalization::start`]); None when neither is found or nothing was recorded after.
fn before_teardown(rec: &Recording, tl: &Timeline) -> Option<(Recording, usize)> {
    let td =
        tl.order.iter().position(|&i| rec.checkpoints[i].teardown).or_else(|| super::finalization::start(rec, tl))?;
    if td + 1 >= tl.order.len() {
        return None;
    }
    let cut = tl.raw_times[td];
    let head = Recording {
        checkpoints: rec.checkpoints.iter().filter(|c| c.t_s.is_finite() && c.t_s <= cut).cloned().collect(),
        ..rec.clone()
    };
    Some((head, td))
}

/// LeakSanitizer's list at exit: the sites (positions in `sites`) still holding memory at the
/// last checkpoint of `tl` (after exit), apart from libc's and the runtime's one-time
/// allocations, each with what the reachability scan at exit found of its blocks.
fn at_exit_of(rec: &Recording, sites: &[SiteAnalysis], tl: &Timeline) -> AtExit {
    let live = |i: usize| {
        tl.index.get(&sites[i].id).map_or((0, 0), |&si| {
            (tl.live_bytes[si].last().copied().unwrap_or(0), tl.live_count[si].last().copied().unwrap_or(0))
        })
    };
    let (kept, one_time): (Vec<usize>, Vec<usize>) = (0..sites.len())
        .filter(|&i| live(i).0 > 0)
        .partition(|&i| !frames::is_one_time_site(&sites[i].frames, sites[i].memory_kind));
    let mut kept: Vec<(usize, u64, u64)> = kept.into_iter().map(|i| (i, live(i).0, live(i).1)).collect();
    kept.sort_by_key(|&(i, b, _)| (std::cmp::Reverse(b), i));
    // One entry per symbolized stack: two return addresses in one function at the same line (a
    // loop unrolled) are one call path to the reader. The entry is its largest site's, with the
    // bytes and blocks of all of them.
    let mut entries: Vec<(usize, u64, u64, Vec<u32>)> = Vec::with_capacity(kept.len());
    let mut by_key: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    for (i, b, c) in kept {
        let s = &sites[i];
        let key = crate::merge::symbolic_stack_key(s.kind, s.stack_lost, &s.frames);
        match key.as_ref().and_then(|k| by_key.get(k)) {
            Some(&e) => {
                let entry = &mut entries[e];
                entry.1 += b;
                entry.2 += c;
                entry.3.push(s.id);
            }
            None => {
                if let Some(k) = key {
                    by_key.insert(k, entries.len());
                }
                entries.push((i, b, c, Vec::new()));
            }
        }
    }
    for e in &mut entries {
        e.3.sort_unstable();
    }
    entries.sort_by_key(|&(i, b, _, _)| (std::cmp::Reverse(b), i));
    let reach_of = |e: &(usize, u64, u64, Vec<u32>)| {
        let scan = rec.reachability.as_ref()?;
        let ids: Vec<u32> = std::iter::once(sites[e.0].id).chain(e.3.iter().copied()).collect();
        let seen: Vec<_> = scan.sites.iter().filter(|s| ids.contains(&s.stack)).collect();
        (!seen.is_empty())
            .then(|| (seen.iter().map(|s| s.reachable_bytes).sum(), seen.iter().map(|s| s.unreachable_bytes).sum()))
    };
    AtExit {
        reach: entries.iter().map(reach_of).collect(),
        live_bytes: entries.iter().map(|k| k.1).sum(),
        live_allocations: entries.iter().map(|k| k.2).sum(),
        sites: entries.iter().map(|k| k.0).collect(),
        held: entries.iter().map(|k| (k.1, k.2)).collect(),
        folded: entries.into_iter().map(|k| k.3).collect(),
        one_time_sites: one_time.len(),
        one_time_bytes: one_time.iter().map(|&i| live(i).0).sum(),
    }
}

/// The analysis of the checkpoints in `tl` (all of them: the caller cuts at the teardown), in
/// named steps: the timeline's caveats and the sites' series ([`site_series`]), the analysed
/// span and its windows ([`span_windows`]), units of work, counters, each site
/// ([`analyze_sites`]), the process series ([`process_memory`]), growth by kind
/// ([`super::kinds`]), the process trends ([`ProcessTrends`]), growth mode's churned faults
/// ([`return_churned_faults`]), the summary ([`summary`]), the verdict and its adjustments.
fn analyze_span(rec: &Recording, tl: &Timeline, opts: &AnalyzeOptions) -> Analysis {
    let mut warnings = Vec::new();
    let order = &tl.order;
    let times = &tl.times;
    let n = times.len();
    let t0 = times.first().copied().unwrap_or(0.0);
    let duration = times.last().map_or(0.0, |t| t - t0).max(0.0);
    timeline_warnings(rec, tl, &mut warnings);
    let stacks = &tl.stacks;
    // Thread stacks are judged by their resident bytes: each maps 8 MiB (glibc's default) that a
    // thread mostly never touches.
    let thread_site: Vec<bool> = stacks.iter().map(crate::runtimes::is_thread_stack).collect();
    let thread_resident = thread_resident(tl, &thread_site);
    let series = site_series(tl, &thread_site, &thread_resident);
    let sw = span_windows(rec, tl, &mut warnings);
    let (span, win, span_duration) = (sw.span.clone(), &sw.win, sw.duration);
    let (units, units_of_work) = units_of_work(rec, order, win, &mut warnings);
    // Counters (cumulative: the last checkpoint).
    let Counters { drops, events, drops_total, f_drops } = counters(rec, order, &mut warnings);
    let sample_bytes = sample_bytes(rec, &mut warnings);
    let growth = rec.mode == crate::recording::Mode::Growth;
    let ctx = SiteContext { times, units: &units, duration: span_duration, win, f_drops, sample_bytes, growth };
    let (mut sites, settled) = analyze_sites(rec, tl, &series, &ctx, &mut warnings);
    let (mut memory, live) = process_memory(rec, tl, &mut warnings);
    let LiveByKind { native, mmap, fault, other_malloc } = &live;
    let native_trend = fit(&points(times, native, win.steady.clone()));
    let traced: Vec<u64> = (0..n)
        .map(|k| native[k].saturating_add(mmap[k]).saturating_add(fault[k]).saturating_add(other_malloc[k]))
        .collect();
    let (span_from, span_to) = (
        times.get(span.start).copied().unwrap_or(0.0),
        span.end.checked_sub(1).and_then(|e| times.get(e)).copied().unwrap_or(0.0),
    );
    // The runtime split: managed, native, off-heap and runtime series and their trends.
    let by_kind = crate::timeline::memory_by_kind(tl);
    let gauge_used = managed_series(rec, times, &by_kind, &mut memory);
    let steady_from = times.get(win.steady.start).copied().unwrap_or(0.0);
    let late_from = win.late.as_ref().and_then(|r| times.get(r.start)).copied();
    let spikes = super::plateau::spikes(rec, tl, span_from - t0, span_to - t0);
    let kind_ctx = super::kinds::KindContext {
        steady_from,
        span_to,
        late_from,
        rss_anon_peak: memory.rss_anon_bytes.iter().map(|p| p.1).max().unwrap_or(0),
        span_duration,
        sites: &sites,
        spikes: spikes.as_ref(),
    };
    let kind_list = super::kinds::kind_list(&kind_ctx, rec, &memory, &by_kind, gauge_used, span_from, &mut warnings);
    let trends = ProcessTrends::fit(&memory, span_from, span_to);
    let churn = return_churned_faults(&mut sites, trends.rss_anon.as_ref(), &mut warnings);
    let traced_trend = held_trend(tl, &series, &traced, win, churn.as_deref());
    let mapping_resident = mapping_resident(tl, span.clone());
    let traced_unit_trend = unit_fit(&units, &traced, win.steady.clone());
    let live_served = live_served(times, &live, &by_kind);
    let summary = summary(
        rec,
        &SummaryInput {
            order,
            times,
            memory: &memory,
            live: &live,
            units: &units,
            win,
            trends: &trends,
            native_trend: &native_trend,
            traced_trend: &traced_trend,
            traced_unit_trend,
        },
    );
    let verdict = process_verdict(&ProcessInput {
        sites: &sites,
        n: sw.steady_points,
        win,
        duration: span_duration,
        native_trend: &native_trend,
        native_median_bytes_per_s: median_slope(&points(times, native, win.steady.clone())),
        traced_trend: &traced_trend,
        rss_anon_trend: trends.rss_anon.as_ref(),
        rss_anon: &memory.rss_anon_bytes,
        allocator_trend: trends.allocator.as_ref(),
        allocator_span_trend: trends.allocator_span.as_ref(),
        native_span_bytes_per_s: low_slope(&points(times, native, span.clone())),
        allocator: &memory.allocator_resident_bytes,
        allocator_own: &memory.allocator_own_bytes,
        allocator_in_use: &memory.allocator_in_use_bytes,
        traced: &live_served,
        allocator_family: summary.allocator_family,
        rss_shmem_trend: trends.rss_shmem.as_ref(),
        rss_shmem: &memory.rss_shmem_bytes,
        rss_file_trend: trends.rss_file.as_ref(),
        rss_file: &memory.rss_file_bytes,
        mapping_resident: &mapping_resident,
        f_drops,
        late_from,
        span_to,
        faults_returned: churn.is_some(),
        settled: settled.as_ref(),
        glibc_arenas: last_glibc_arenas(rec),
    });
    let verdict = kind_verdict(verdict, rec.target.runtime, &kind_list, &sites, f_drops);
    let verdict = losses_verdict(verdict, &drops, &events);
    flat_kinds_hold_caches(rec, &kind_list, &mut sites);
    let verdict = too_short_verdict(rec, &sw, f_drops, verdict);

    let mut analysis = Analysis {
        scale: None,
        occupied: None,
        plateau: None,
        at_exit: None,
        freed_at_exit: None,
        checkpoints: n,
        duration_s: duration,
        span_from_s: span_from - t0,
        span_to_s: span_to - t0,
        steady_from_s: times.get(win.steady.start).map_or(0.0, |t| t - t0),
        steady_is_whole_run: win.whole_run,
        sites,
        memory,
        summary,
        native_trend,
        rss_anon_trend: trends.rss_anon,
        allocator_trend: trends.allocator,
        drops,
        drops_total,
        events,
        verdict,
        warnings,
        top: opts.top,
        runtime: rec.target.runtime,
        kinds: kind_list,
        pymalloc_hooked: rec.probes.iter().any(|p| {
            p.function == crate::runtimes::python::PYMALLOC_ENTRY && p.kind == crate::recording::ProbeKind::Entry
        }),
        runtime_holder: crate::report::holds::holder_sentence(rec),
        python_holds: crate::runtimes::python::heap::holds(&rec.python_heap, &|t| {
            rec.checkpoints.iter().filter(|c| c.t_s <= t + 0.5).filter_map(|c| c.units_of_work).next_back()
        }),
        work_probe: rec.work_probe.clone(),
        escalation: rec.escalation.as_ref().map(|e| {
            let mut ea = analyze(e, opts);
            super::first_touch::judge_exact_window(&mut ea, e);
            Box::new(ea)
        }),
        units_of_work,
        traced_trend,
        traced_unit_trend,
    };
    super::first_touch::judge_growth_through_allocator(&mut analysis);
    analysis.scale = super::scale::scale(&analysis, rec.target.memory_limit_bytes);
    analysis.occupied = super::occupied::occupied(rec, &analysis);
    analysis.summary.occupied_heap_to_rss_ratio = analysis.occupied.as_ref().and_then(|o| o.ratio);
    analysis.plateau = super::plateau::plateau(rec, tl, &analysis);
    analysis
}

/// Caveats about the timeline itself: checkpoints with an invalid time, duplicate stack ids,
/// samples that refer to a stack the recording lacks.
fn timeline_warnings(rec: &Recording, tl: &Timeline, warnings: &mut Vec<String>) {
    if tl.order.len() != rec.checkpoints.len() {
        warnings.push(format!(
            "{} checkpoint(s) with an invalid time were ignored",
            rec.checkpoints.len() - tl.order.len()
        ));
    }
    if tl.duplicate_ids {
        warnings.push("the recording has duplicate stack ids; only the first is used".into());
    }
    if tl.unknown_stacks > 0 {
        warnings.push(format!(
            "{} site(s) refer to a stack missing from the recording (shown as [unknown])",
            tl.unknown_stacks
        ));
    }
}

/// For each stack, its resident bytes at each checkpoint (0 where unread) when it is a thread
/// stack's mapping (`thread_site`), else None.
fn thread_resident(tl: &Timeline, thread_site: &[bool]) -> Vec<Option<Vec<u64>>> {
    (0..tl.stacks.len())
        .map(|si| {
            (thread_site[si] && tl.stacks[si].kind == StackKind::Mmap)
                .then(|| tl.resident[si].iter().map(|r| r.unwrap_or(0)).collect())
        })
        .collect()
}

/// Each stack's [`Series`], a view into `tl` (a thread stack's live bytes are its resident
/// bytes, `thread_resident`).
fn site_series<'a>(tl: &'a Timeline, thread_site: &[bool], thread_resident: &'a [Option<Vec<u64>>]) -> Vec<Series<'a>> {
    (0..tl.stacks.len())
        .map(|si| Series {
            live_bytes: thread_resident[si].as_deref().unwrap_or(&tl.live_bytes[si]),
            threads: thread_site[si],
            live_count: &tl.live_count[si],
            last: &tl.last[si],
            resident: tl.resident[si].last().copied().flatten(),
            live_born_ms: tl.live_born_ms[si].as_deref(),
        })
        .collect()
}

/// The analysed span and the windows fitted in it.
struct SpanWindows {
    /// Positions in the timeline of the analysed span ([`span_of`]).
    span: std::ops::Range<usize>,
    /// The steady and late windows ([`windows`]).
    win: Windows,
    /// Duration of the span, seconds.
    duration: f64,
    /// Checkpoints in the steady window.
    steady_points: usize,
}

/// The analysed span: from the last idle checkpoint before the first allocation or free to the
/// end; when the target exited, only up to the first checkpoint after its last allocation or
/// free (the idle time before exiting says nothing about growth); its windows. Warns when the
/// span is cut, or has too few checkpoints to fit.
fn span_windows(rec: &Recording, tl: &Timeline, warnings: &mut Vec<String>) -> SpanWindows {
    let times = &tl.times;
    let n = times.len();
    let t0 = times.first().copied().unwrap_or(0.0);
    let Span { start: span_start, end: span_end, last_active } = span_of(tl, rec.end_reason);
    let span = span_start..span_end;
    if span_start > 0 {
        warnings.push(format!(
            "no allocation or free in the first {:.1} s: rates are measured from {:.1} s",
            times[span_start] - t0,
            times[span_start] - t0
        ));
    }
    if span_end < n {
        warnings.push(format!(
            "the target made no allocation or free in its last {:.1} s before exiting: rates are \
             measured up to {:.1} s",
            times[n - 1] - times[span_end - 1],
            times[span_end - 1] - t0
        ));
    }
    let win = windows(times, span.clone(), last_active);
    let duration = match (times.get(span.start), span.end.checked_sub(1).and_then(|e| times.get(e))) {
        (Some(a), Some(b)) => (b - a).max(0.0),
        _ => 0.0,
    };
    let steady_points = win.steady.len();
    if n < MIN_WINDOW_POINTS || steady_points < MIN_WINDOW_POINTS {
        warnings.push(format!(
            "only {} checkpoint(s) to fit: growth cannot be measured (at least \
             {MIN_WINDOW_POINTS} are needed); record longer or with a shorter interval",
            steady_points
        ));
    } else if win.whole_run {
        warnings.push(format!(
            "the last half of the run holds fewer than {MIN_WINDOW_POINTS} checkpoints: the trend \
             is fitted over the whole run, start-up growth included"
        ));
    }
    SpanWindows { span, win, duration, steady_points }
}

/// Units of work (calls of the work probe since attach) at each checkpoint in `order`, and the
/// last count (None when no work probe counted). Warns when the probe counted no call over the
/// steady window.
fn units_of_work(
    rec: &Recording,
    order: &[usize],
    win: &Windows,
    warnings: &mut Vec<String>,
) -> (Vec<Option<u64>>, Option<u64>) {
    let units: Vec<Option<u64>> = order.iter().map(|&i| rec.checkpoints[i].units_of_work).collect();
    let units_of_work = if rec.work_probe.is_some() || units.iter().any(Option::is_some) {
        units.iter().rev().find_map(|u| *u)
    } else {
        None
    };
    if let Some(w) = &rec.work_probe {
        let counted = units.get(win.steady.clone()).is_some_and(|u| {
            let c: Vec<u64> = u.iter().flatten().copied().collect();
            c.first() != c.last()
        });
        if !counted {
            warnings.push(format!(
                "the work probe {w} counted no call over the steady window: growth is given per \
                 second only"
            ));
        }
    }
    (units, units_of_work)
}

/// Sampled mode: the mean distance between samples, bytes (0 in other modes); a site's figures
/// move in steps of about one sample, which the caveat says.
fn sample_bytes(rec: &Recording, warnings: &mut Vec<String>) -> u64 {
    let sample_bytes = if rec.mode == Mode::Sampled { rec.sample_bytes.unwrap_or(0) } else { 0 };
    if sample_bytes > 0 {
        warnings.push(format!(
            "sampled mode: per-site figures are estimates from one sample every {sample_bytes} \
             bytes on average; growth below about 2 samples over the run is treated as noise"
        ));
    }
    sample_bytes
}

/// The smaller of the least-squares and the Theil–Sen slope of `pts`, bytes per second.
fn low_slope(pts: &[(f64, f64)]) -> f64 {
    fit(pts).slope_bytes_per_s.min(median_slope(pts).unwrap_or(f64::INFINITY))
}

/// glibc's arenas at the last checkpoint that read their headers (0: never read).
fn last_glibc_arenas(rec: &Recording) -> u32 {
    rec.checkpoints
        .iter()
        .rev()
        .find_map(|c| c.allocator.as_ref().map(|a| a.glibc_arenas).filter(|&n| n > 0))
        .unwrap_or(0)
}

/// Every site analysed ([`analyze_site`], under its kind of memory), with where its memory
/// comes from in words for a runtime's target (a C extension, a library called through
/// ctypes), most held first (a mapping by its resident bytes: an arena reservation mapped but
/// never touched does not top the list). Warns of live bytes without a call stack.
fn analyze_sites(
    rec: &Recording,
    tl: &Timeline,
    series: &[Series<'_>],
    ctx: &SiteContext<'_>,
    warnings: &mut Vec<String>,
) -> (Vec<SiteAnalysis>, Option<super::settled::Settled>) {
    let mut sites: Vec<SiteAnalysis> = Vec::with_capacity(tl.stacks.len());
    for (si, st) in tl.stacks.iter().enumerate() {
        sites.push(analyze_site(st, &series[si], ctx, tl.kinds[si]));
    }
    // Before the sort: sites[i] is series[i]'s.
    // Growth mode's fault sites name who first wrote a page: no warm-up told from them.
    let settled = (!ctx.growth).then(|| {
        let live: Vec<&[u64]> = series.iter().map(|s| s.live_bytes).collect();
        let span = ctx.win.early.as_ref().map_or(ctx.win.steady.start, |e| e.start)..ctx.win.steady.end;
        super::settled::settle_warm_up(&mut sites, &live, ctx.times, span, ctx.duration)
    });
    let settled = settled.flatten();
    super::callers::name_concentrated_callers(&mut sites);
    if let Some(rt) = rec.target.runtime {
        let extensions: std::collections::HashSet<String> =
            rec.mappings.iter().filter(|m| m.python_extension).map(|m| m.path.clone()).collect();
        for s in &mut sites {
            s.origin = Some(crate::runtimes::site_origin(rt, s.memory_kind, &s.frames, &extensions));
        }
    }
    sites.sort_by(super::by_held_bytes);
    let lost_bytes: u64 = sites.iter().filter(|s| s.stack_lost).map(|s| s.live_bytes).sum();
    if lost_bytes > 0 {
        warnings.push(format!(
            "{lost_bytes} live bytes at the end have no call stack (stack lost): they are counted \
             but not attributed"
        ));
    }
    (sites, settled)
}

/// The process series: /proc's figures ([`checkpoint_memory`]) and the traced live bytes by
/// kind of site ([`live_by_kind`]) as (time, bytes) points. Warns of checkpoints without
/// memory figures.
fn process_memory(rec: &Recording, tl: &Timeline, warnings: &mut Vec<String>) -> (MemorySeries, LiveByKind) {
    let times = &tl.times;
    let n = times.len();
    let mut memory = checkpoint_memory(rec, &tl.order);
    let live = live_by_kind(tl, n);
    if tl.stacks.iter().any(|s| s.kind == StackKind::Fault) {
        memory.fault_bytes = times.iter().copied().zip(live.fault.iter().copied()).collect();
    }
    memory.native_live_bytes = times.iter().copied().zip(live.native.iter().copied()).collect();
    memory.mmap_live_bytes = times.iter().copied().zip(live.mmap.iter().copied()).collect();
    if memory.rss_bytes.len() < n {
        warnings.push(format!(
            "{} of {n} checkpoint(s) have no memory figures (process gone or /proc unreadable)",
            n - memory.rss_bytes.len()
        ));
    }
    (memory, live)
}

/// The managed heap's series (a runtime's target only: the runtime's gauge when it has one, else
/// its sites), off-heap and runtime series, into `memory`. True when the gauge was used.
fn managed_series(rec: &Recording, times: &[f64], by_kind: &KindSeries, memory: &mut MemorySeries) -> bool {
    let with_times =
        |v: &[(f64, u64)]| -> Vec<(f64, u64)> { times.iter().copied().zip(v.iter().map(|p| p.1)).collect() };
    let gauge: Vec<(f64, u64)> =
        crate::timeline::gauge_series(rec).into_iter().map(|(t, b)| ((t * 1e9).round() / 1e9, b)).collect();
    let gauge_used = !gauge.is_empty();
    if rec.target.runtime.is_some() {
        memory.managed_bytes = if gauge.is_empty() { with_times(&by_kind.managed) } else { gauge };
    }
    memory.offheap_live_bytes = with_times(&by_kind.offheap);
    memory.runtime_live_bytes = with_times(&by_kind.runtime);
    gauge_used
}

/// Steady-window trends of the process series over the analysed span (None for a series
/// without points).
struct ProcessTrends {
    rss_anon: Option<Trend>,
    allocator: Option<Trend>,
    /// The allocator's resident bytes over the whole analysed span: an allocator that returns
    /// part of what it keeps now and then (jemalloc's decay) moves its footprint by megabytes
    /// between checkpoints, and half a short recording may not show its growth significantly.
    allocator_span: Option<Trend>,
    rss_shmem: Option<Trend>,
    rss_file: Option<Trend>,
}

impl ProcessTrends {
    /// The trends of `memory`'s series over `span_from..=span_to` (seconds).
    fn fit(memory: &MemorySeries, span_from: f64, span_to: f64) -> ProcessTrends {
        let series_trend = |pts: &[(f64, u64)]| -> Option<Trend> {
            if pts.is_empty() {
                return None;
            }
            let mt: Vec<f64> = pts.iter().map(|p| p.0).collect();
            let mv: Vec<u64> = pts.iter().map(|p| p.1).collect();
            let r = time_range(&mt, span_from, span_to);
            let w = windows(&mt, r.clone(), r.end.saturating_sub(1));
            Some(fit(&points(&mt, &mv, w.steady)))
        };
        let allocator_span = (!memory.allocator_resident_bytes.is_empty()).then(|| {
            let pts = &memory.allocator_resident_bytes;
            let mt: Vec<f64> = pts.iter().map(|p| p.0).collect();
            let mv: Vec<u64> = pts.iter().map(|p| p.1).collect();
            fit(&points(&mt, &mv, time_range(&mt, span_from, span_to)))
        });
        ProcessTrends {
            rss_anon: series_trend(&memory.rss_anon_bytes),
            allocator: series_trend(&memory.allocator_resident_bytes),
            allocator_span,
            rss_shmem: series_trend(&memory.rss_shmem_bytes),
            rss_file: series_trend(&memory.rss_file_bytes),
        }
    }
}

/// Growth mode counts the pages a stack faulted in, never the pages returned since (munmap,
/// MADV_DONTNEED, an arena trimmed): a fault site can only grow. A fault site that grows more
/// than twice as fast as RSS-anon (its 95 % upper bound) cannot be holding its pages: they are
/// returned and faulted in again (churn). Such sites become temporary, and the traced growth
/// leaves them out; a site growing no faster than RSS-anon may hold its pages and stays.
/// Returns the ids of the sites made temporary, None when there are none.
fn return_churned_faults(
    sites: &mut [SiteAnalysis],
    rss_anon_trend: Option<&Trend>,
    warnings: &mut Vec<String>,
) -> Option<Vec<u32>> {
    let anon_bound = rss_anon_trend
        .filter(|t| t.n >= MIN_WINDOW_POINTS)
        .map(|t| (t.slope_bytes_per_s + t.ci95_bytes_per_s.unwrap_or(0.0)).max(0.0));
    let mut returned: Vec<u32> = Vec::new();
    let mut returned_rate = 0.0;
    if let Some(bound) = anon_bound {
        for s in sites
            .iter_mut()
            .filter(|s| s.kind == StackKind::Fault && s.class == SiteClass::Leak && s.growth_bytes_per_s > 2.0 * bound)
        {
            s.class = SiteClass::Temporary;
            s.evidence.reason = format!(
                "it faults in {:.1} B/s of new pages while RSS anon grows at most {bound:.1} B/s: the pages \
                 are returned (munmap, MADV_DONTNEED) and faulted in again, not held (growth mode counts \
                 pages faulted in, not pages returned)",
                s.growth_bytes_per_s
            );
            returned.push(s.id);
            returned_rate += s.growth_bytes_per_s;
        }
    }
    if returned.is_empty() {
        return None;
    }
    warnings.push(format!(
        "{} stack(s) fault in {returned_rate:.1} B/s of new pages while RSS anon grows at most {:.1} B/s: \
         their pages are returned and faulted in again (churn), so they are not called leaks",
        returned.len(),
        anon_bound.unwrap_or(0.0)
    ));
    Some(returned)
}

/// The steady-window trend of the traced live bytes (`traced`, one value per checkpoint), the
/// sites whose pages are returned and faulted in again (`returned`, stack ids) left out.
fn held_trend(tl: &Timeline, series: &[Series<'_>], traced: &[u64], win: &Windows, returned: Option<&[u32]>) -> Trend {
    let Some(returned) = returned else { return fit(&points(&tl.times, traced, win.steady.clone())) };
    let mut held = traced.to_vec();
    for si in (0..tl.stacks.len()).filter(|&si| returned.contains(&tl.stacks[si].id)) {
        for (k, v) in series[si].live_bytes.iter().enumerate() {
            held[k] = held[k].saturating_sub(*v);
        }
    }
    fit(&points(&tl.times, &held, win.steady.clone()))
}

/// Each mapping site's resident bytes at the first and the last checkpoint of the analysed
/// `span` that read them: (stack id, first, last), for the file-backed verdict.
fn mapping_resident(tl: &Timeline, span: std::ops::Range<usize>) -> Vec<(u32, u64, u64)> {
    let stacks = &tl.stacks;
    (0..stacks.len())
        .filter(|&si| stacks[si].kind == StackKind::Mmap)
        .filter_map(|si| {
            let read = || tl.resident[si][span.clone()].iter().flatten().copied();
            Some((stacks[si].id, read().next()?, read().last()?))
        })
        .collect()
}

/// Live bytes the process holds in what it allocated (native and managed malloc sites and
/// off-heap mappings' resident bytes), the allocator's and runtimes' mappings left out: what the
/// allocator's footprint serves, for the retention rule; (time s, bytes) at each checkpoint.
fn live_served(times: &[f64], live: &LiveByKind, by_kind: &KindSeries) -> Vec<(f64, u64)> {
    (0..times.len())
        .map(|k| {
            (
                times[k],
                live.native[k]
                    .saturating_add(live.other_malloc[k])
                    .saturating_add(by_kind.offheap.get(k).map_or(0, |p| p.1)),
            )
        })
        .collect()
}

/// What [`summary`] reads: the process series and the trends fitted on them.
struct SummaryInput<'a> {
    /// Checkpoint positions in time order and their times, seconds.
    order: &'a [usize],
    times: &'a [f64],
    memory: &'a MemorySeries,
    live: &'a LiveByKind,
    /// Units of work at each checkpoint.
    units: &'a [Option<u64>],
    win: &'a Windows,
    trends: &'a ProcessTrends,
    native_trend: &'a Trend,
    /// The traced live bytes' trend (churned faults left out) and its trend per unit of work.
    traced_trend: &'a Trend,
    traced_unit_trend: Option<Trend>,
}

/// Start and end figures and growth rates: RSS, live native bytes, the allocator's footprint and
/// its regions at the last checkpoint that read them, the traced growth per second and per unit
/// of work (over the steady window), off-heap.
fn summary(rec: &Recording, p: &SummaryInput<'_>) -> Summary {
    let SummaryInput { order, times, memory, live, units, win, trends, native_trend, traced_trend, traced_unit_trend } =
        *p;
    let native = &live.native;
    let native_unit_trend = unit_fit(units, native, win.steady.clone());
    let offheap: Vec<u64> = memory.offheap_live_bytes.iter().map(|p| p.1).collect();
    let offheap_trend = fit(&points(times, &offheap, win.steady.clone()));
    let offheap_unit_trend = unit_fit(units, &offheap, win.steady.clone());
    let anon: Vec<Option<u64>> =
        order.iter().map(|&i| rec.checkpoints[i].memory.as_ref().map(|m| m.rss_anon_bytes)).collect();
    let anon_units: Vec<Option<u64>> = units.iter().zip(&anon).map(|(u, a)| a.and(*u)).collect();
    let anon_vals: Vec<u64> = anon.iter().map(|a| a.unwrap_or(0)).collect();
    let rss_anon_unit_trend = unit_fit(&anon_units, &anon_vals, win.steady.clone());
    let last_allocator = order.iter().rev().find_map(|&i| rec.checkpoints[i].allocator.as_ref());
    Summary {
        rss_start_bytes: memory.rss_bytes.first().map(|p| p.1),
        rss_end_bytes: memory.rss_bytes.last().map(|p| p.1),
        rss_anon_start_bytes: memory.rss_anon_bytes.first().map(|p| p.1),
        rss_anon_end_bytes: memory.rss_anon_bytes.last().map(|p| p.1),
        native_live_start_bytes: native.first().copied().unwrap_or(0),
        native_live_end_bytes: native.last().copied().unwrap_or(0),
        native_growth_bytes_per_s: native_trend.slope_bytes_per_s,
        rss_anon_growth_bytes_per_s: trends.rss_anon.map(|t| t.slope_bytes_per_s),
        allocator_resident_start_bytes: memory.allocator_resident_bytes.first().map(|p| p.1),
        allocator_resident_end_bytes: memory.allocator_resident_bytes.last().map(|p| p.1),
        allocator_resident_growth_bytes_per_s: trends.allocator.map(|t| t.slope_bytes_per_s),
        allocator_arena_heaps: last_allocator.map(|f| f.arena_heaps),
        allocator_arena_resident_end_bytes: last_allocator.map(|f| f.arena_resident_bytes),
        allocator_block_regions: last_allocator.map(|f| f.block_regions),
        allocator_block_region_resident_end_bytes: last_allocator.map(|f| f.block_region_resident_bytes),
        allocator_unclaimed_regions: last_allocator.map(|f| f.unclaimed_regions),
        allocator_unclaimed_resident_end_bytes: last_allocator.map(|f| f.unclaimed_region_resident_bytes),
        allocator_family: ["jemalloc", "tcmalloc", "mimalloc"]
            .into_iter()
            .find(|fam| rec.probes.iter().any(|p| p.object.rsplit('/').next().is_some_and(|name| name.contains(fam)))),
        growth_bytes_per_s: traced_trend.slope_bytes_per_s,
        growth_bytes_per_unit: traced_unit_trend.map(|t| t.slope_bytes_per_s),
        native_growth_bytes_per_unit: native_unit_trend.map(|t| t.slope_bytes_per_s),
        offheap_live_start_bytes: offheap.first().copied().unwrap_or(0),
        offheap_live_end_bytes: offheap.last().copied().unwrap_or(0),
        offheap_growth_bytes_per_s: offheap_trend.slope_bytes_per_s,
        offheap_growth_bytes_per_unit: offheap_unit_trend.map(|t| t.slope_bytes_per_s),
        rss_anon_growth_bytes_per_unit: rss_anon_unit_trend.map(|t| t.slope_bytes_per_s),
        // Set with the occupied heap's parts, once the analysis is whole (`occupied::occupied`).
        occupied_heap_to_rss_ratio: None,
    }
}

/// A managed heap measured not to grow makes none of its sites a leak (pages mapped after
/// attach whose predecessors were unmapped unseen, and the runtime's bookkeeping of them): they
/// hold memory of a bounded heap, a cache as look-alikes are. The same for the runtime's own
/// sites while its series does not grow.
fn flat_kinds_hold_caches(rec: &Recording, kind_list: &[KindGrowth], sites: &mut [SiteAnalysis]) {
    let Some(rt) = rec.target.runtime else { return };
    let flat = |k: MemoryKind| kind_list.iter().any(|g| g.kind == k && g.trend.n >= MIN_WINDOW_POINTS && !g.grows);
    let (managed_flat, runtime_flat) = (flat(MemoryKind::Managed), flat(MemoryKind::Runtime));
    for s in sites.iter_mut().filter(|s| s.class == SiteClass::Leak) {
        let follows = s.memory_kind == MemoryKind::Runtime && crate::runtimes::follows_managed_heap(rt, &s.frames);
        let kind = if follows { MemoryKind::Managed } else { s.memory_kind };
        if (kind == MemoryKind::Managed && managed_flat) || (kind == MemoryKind::Runtime && runtime_flat) {
            s.class = SiteClass::Cache;
        }
    }
}

/// A command that exited: what it still held (LeakSanitizer's list at exit, filled in by the
/// caller); when its run was too short to have a shape, that list is the answer and the verdict
/// is inconclusive. Else `verdict` unchanged.
fn too_short_verdict(rec: &Recording, sw: &SpanWindows, f_drops: f64, verdict: Verdict) -> Verdict {
    let exited = rec.end_reason == EndReason::TargetExited;
    let span_checkpoints = sw.span.end.saturating_sub(sw.span.start);
    if exited && (span_checkpoints < MIN_SHAPE_CHECKPOINTS || sw.duration < MIN_SHAPE_SECONDS) {
        Verdict {
            class: ProcessClass::Flat,
            confidence: clamp_conf(0.1 * f_drops),
            inconclusive: true,
            reason: Reason::TooShort { checkpoints: span_checkpoints, duration_s: sw.duration },
            by_kind: None,
            ..verdict
        }
    } else {
        verdict
    }
}

/// The process's memory figures (RSS and its parts, the allocator's resident bytes) at the
/// checkpoints in `order` that read them, as (time s, bytes) points.
fn checkpoint_memory(rec: &Recording, order: &[usize]) -> MemorySeries {
    let mut memory = MemorySeries::default();
    for &ci in order {
        let c = &rec.checkpoints[ci];
        if let Some(m) = &c.memory {
            let t = (c.t_s * 1e9).round() / 1e9;
            memory.rss_bytes.push((t, m.rss_bytes));
            memory.rss_anon_bytes.push((t, m.rss_anon_bytes));
            memory.rss_file_bytes.push((t, m.rss_file_bytes));
            memory.rss_shmem_bytes.push((t, m.rss_shmem_bytes));
        }
        if let Some(al) = &c.allocator {
            let t = (c.t_s * 1e9).round() / 1e9;
            memory.allocator_resident_bytes.push((t, al.resident_bytes()));
            super::retention::push_own_figure(&mut memory.allocator_own_bytes, t, al);
            super::retention::push_in_use_figure(&mut memory.allocator_in_use_bytes, t, al);
        }
    }
    memory
}

/// Live bytes at each checkpoint summed over the sites of each kind.
struct LiveByKind {
    native: Vec<u64>,
    mmap: Vec<u64>,
    fault: Vec<u64>,
    /// malloc sites of a runtime that are not native (managed, off-heap, runtime kinds).
    other_malloc: Vec<u64>,
}

/// Live bytes at each of the `n` checkpoints summed by kind of site (native malloc, mappings,
/// faults, a runtime's other malloc sites).
fn live_by_kind(tl: &Timeline, n: usize) -> LiveByKind {
    let (stacks, kinds) = (&tl.stacks, &tl.kinds);
    let mut native = vec![0u64; n];
    let mut mmap = vec![0u64; n];
    let mut fault = vec![0u64; n];
    // malloc sites of a runtime that are not native (managed, off-heap, runtime kinds).
    let mut other_malloc = vec![0u64; n];
    for (si, st) in stacks.iter().enumerate() {
        let target = match st.kind {
            StackKind::Mmap => &mut mmap,
            StackKind::Fault => &mut fault,
            _ if kinds[si] == MemoryKind::Native => &mut native,
            _ => &mut other_malloc,
        };
        for (k, v) in tl.live_bytes[si].iter().enumerate() {
            target[k] = target[k].saturating_add(*v);
        }
    }
    LiveByKind { native, mmap, fault, other_malloc }
}

/// The recording's event and loss counters at its last checkpoint.
struct Counters {
    /// Lost events by counter, and their sum.
    drops: BTreeMap<counter::Counter, u64>,
    /// Other events by counter name.
    events: BTreeMap<String, u64>,
    drops_total: u64,
    /// Confidence factor for losses (0.2–1).
    f_drops: f64,
}

/// The counters at the last checkpoint in `order`, and the confidence factor their losses allow;
/// warns of any loss.
fn counters(rec: &Recording, order: &[usize], warnings: &mut Vec<String>) -> Counters {
    let mut drops: BTreeMap<counter::Counter, u64> = BTreeMap::new();
    let mut events: BTreeMap<String, u64> = BTreeMap::new();
    for c in &counter::TABLE {
        if c.is_loss {
            drops.insert(c.counter, 0);
        } else {
            events.insert(c.name.to_string(), 0);
        }
    }
    if let Some(&last) = order.last() {
        for (k, &v) in &rec.checkpoints[last].counters {
            if let Some(d) = counter::Counter::from_name(k).and_then(|c| drops.get_mut(&c)) {
                *d = v;
            } else {
                events.insert(k.clone(), v);
            }
        }
    }
    let drops_total = drops.values().fold(0u64, |a, &b| a.saturating_add(b));
    let allocs = events.get(counter::Counter::Allocs.name()).copied().unwrap_or(0);
    let loss_ratio = if drops_total == 0 { 0.0 } else { drops_total as f64 / (allocs as f64 + drops_total as f64) };
    let f_drops = (1.0 - 5.0 * loss_ratio).clamp(0.2, 1.0);
    if drops_total > 0 {
        let names: Vec<String> =
            drops_by_name(&drops).into_iter().filter(|(_, v)| *v > 0).map(|(k, v)| format!("{k} {v}")).collect();
        warnings.push(format!(
            "{drops_total} event(s) were lost ({}; {:.2} % of recorded allocations): figures may \
             be incomplete",
            names.join(", "),
            loss_ratio * 100.0
        ));
    }
    Counters { drops, events, drops_total, f_drops }
}

/// The analysed span of a timeline, as positions in it: from the last idle checkpoint before the
/// first allocation or free to the end; when the target exited, only up to the first checkpoint
/// after its last allocation or free (the idle time before exiting says nothing about growth).
pub(crate) struct Span {
    /// First checkpoint of the span.
    pub(crate) start: usize,
    /// One past its last checkpoint.
    pub(crate) end: usize,
    /// The last checkpoint at which the process allocated or freed (the last one when it never
    /// did).
    pub(crate) last_active: usize,
}

/// The analysed [`Span`] of `tl` for a recording that ended for `end_reason`.
pub(crate) fn span_of(tl: &Timeline, end_reason: EndReason) -> Span {
    let n = tl.len();
    let activity = &tl.activity;
    let changed: Vec<usize> = (1..n).filter(|&k| activity[k] != activity[k - 1]).collect();
    let last_active = changed.last().copied().unwrap_or(n.saturating_sub(1));
    let start = changed.first().map_or(0, |&k| k - 1);
    let end = if end_reason == EndReason::TargetExited && last_active > start { last_active + 1 } else { n };
    Span { start, end, last_active }
}

/// The steady window of a recording, seconds since its first checkpoint: (start of the steady
/// window, end of the analysed span), as [`Analysis::steady_from_s`] and [`Analysis::span_to_s`]
/// give them, without the rest of the analysis.
pub fn steady_window(rec: &Recording, tl: &Timeline) -> (f64, f64) {
    match before_teardown(rec, tl) {
        Some((head, _)) => steady_window_of_span(&head, &Timeline::new(&head)),
        None => steady_window_of_span(rec, tl),
    }
}

/// [`steady_window`] of all the checkpoints in `tl` (the caller cuts at the teardown).
fn steady_window_of_span(rec: &Recording, tl: &Timeline) -> (f64, f64) {
    let times = &tl.times;
    let t0 = times.first().copied().unwrap_or(0.0);
    let span = span_of(tl, rec.end_reason);
    let win = windows(times, span.start..span.end, span.last_active);
    let span_to = span.end.checked_sub(1).and_then(|e| times.get(e)).copied().unwrap_or(0.0);
    (times.get(win.steady.start).map_or(0.0, |t| t - t0), span_to - t0)
}
