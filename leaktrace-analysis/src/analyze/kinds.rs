//! Growth by kind of memory (managed, native, off-heap, runtime): each kind's process series
//! fitted over the steady window against its noise floor; a collected heap measured at its
//! post-collection troughs ([`post_gc_troughs`]), and judged levelled off when it rose and then
//! stayed flat.

use super::*;
use crate::recording::{Recording, StackKind};
use crate::runtimes::MemoryKind;
use crate::timeline::KindSeries;

/// What every kind's growth is judged against.
pub(super) struct KindContext<'a> {
    /// Start of the steady window, seconds (the checkpoints' clock).
    pub(super) steady_from: f64,
    /// End of the analysed span, seconds.
    pub(super) span_to: f64,
    /// Start of the late window (the last quarter of the span), seconds; None without one.
    pub(super) late_from: Option<f64>,
    /// Peak of RSS anon over the run, bytes (0 without the figure).
    pub(super) rss_anon_peak: u64,
    /// Duration of the analysed span, seconds.
    pub(super) span_duration: f64,
    /// Every site, classified.
    pub(super) sites: &'a [SiteAnalysis],
    /// The load spikes of a plateau over the span ([`super::plateau::spikes`]); None without one.
    pub(super) spikes: Option<&'a super::plateau::Spikes>,
}

/// The growth of each kind: the managed heap first (a runtime's target only: its gauge, else
/// its sites without the young generation; judged on its collections when the runtime counts
/// them, [`super::managed`]), then native, off-heap and runtime, from `memory`'s series.
/// `span_from`: start of the analysed span, seconds.
pub(super) fn kind_list(
    ctx: &KindContext<'_>,
    rec: &Recording,
    memory: &MemorySeries,
    by_kind: &KindSeries,
    gauge_used: bool,
    span_from: f64,
    warnings: &mut Vec<String>,
) -> Vec<KindGrowth> {
    let mut kind_list = Vec::new();
    if rec.target.runtime.is_some() {
        // Summed from sites, the managed heap's growth is measured without the young generation
        // (V8's semi-spaces: bounded, resized under allocation pressure — after attach, its new
        // pages are seen while the old ones, mapped before, were unmapped unseen).
        let fitted: Vec<(f64, u64)> = if gauge_used {
            memory.managed_bytes.clone()
        } else {
            memory
                .managed_bytes
                .iter()
                .zip(&by_kind.managed_young)
                .map(|(&(t, b), &(_, y))| (t, b.saturating_sub(y)))
                .collect()
        };
        let source = if gauge_used { "hsperfdata" } else { "sites" };
        let mut managed = kind_growth(ctx, MemoryKind::Managed, source, &fitted);
        let series = super::managed::collection_series(rec);
        let judged = super::managed::on_collections(&series, span_from, ctx.steady_from, ctx.span_to)
            // Figures read beside the sites that tell no trend (too few collections) leave a heap
            // whose pages grow judged on its pages.
            .filter(|c| gauge_used || c.trend.is_some() || !managed.grows);
        if let Some(c) = judged {
            if !gauge_used {
                // Figures read beside the sites (Go's): the heap is what its collections marked
                // live, not the bytes of the arenas mapped since attach.
                let mut span = series.iter().filter(|p| p.t_s >= span_from - 1e-9 && p.t_s <= ctx.span_to + 1e-9);
                managed.source = super::managed::MARKED_SOURCE.to_string();
                managed.start_bytes = span.next().map_or(managed.start_bytes, |p| p.bytes);
                managed.end_bytes = span.next_back().map_or(managed.start_bytes, |p| p.bytes);
            }
            super::managed::judge(&mut managed, c, rec.target.runtime, warnings);
        } else if managed.grows
            && let Some(rises) =
                ctx.spikes.and_then(|s| rose_at_spikes(ctx, s, &fitted, managed.noise_floor_bytes_per_s))
        {
            managed.grows = false;
            managed.at_load_spikes = Some(rises);
        }
        kind_list.push(managed);
    }
    kind_list.push(kind_growth(ctx, MemoryKind::Native, "sites", &memory.native_live_bytes));
    kind_list.push(kind_growth(ctx, MemoryKind::OffHeap, "sites", &memory.offheap_live_bytes));
    kind_list.push(kind_growth(ctx, MemoryKind::Runtime, "sites", &memory.runtime_live_bytes));
    kind_list
}

/// The growth of one kind's series `pts` ((time s, bytes)), from `source` ("sites",
/// "hsperfdata"): its steady-window trend (a managed heap's at its post-GC troughs), its noise
/// floor, whether it grows or levelled off.
pub(super) fn kind_growth(ctx: &KindContext<'_>, kind: MemoryKind, source: &str, pts: &[(f64, u64)]) -> KindGrowth {
    let ts: Vec<f64> = pts.iter().map(|p| p.0).collect();
    let vs: Vec<u64> = pts.iter().map(|p| p.1).collect();
    let window = points(&ts, &vs, time_range(&ts, ctx.steady_from, ctx.span_to));
    // A collected heap is measured at its post-GC troughs (rising troughs are the signal;
    // the garbage between collections is not growth).
    let post_gc = if kind == MemoryKind::Managed { post_gc_troughs(&window) } else { None };
    let troughs = post_gc.as_ref().map_or(0, Vec::len);
    let trend = fit(post_gc.as_deref().unwrap_or(&window));
    let peak = vs.iter().copied().max().unwrap_or(0);
    // A managed heap is judged against the process's anonymous memory too: summed from its
    // sites it is only what was mapped since attach (a slice of the heap), and a rise over
    // the run under 1 % of RSS-anon is what a collected heap moves by between collections
    // (a few pages promoted into V8's old space), not evidence of a leak.
    let scale = if kind == MemoryKind::Managed { peak.max(ctx.rss_anon_peak) } else { peak };
    // Native bytes are exact malloc sizes (a site's floor); the other series hold pages.
    let abs_floor = if kind == MemoryKind::Native { SITE_FLOOR_BYTES_PER_S } else { KIND_FLOOR_BYTES_PER_S };
    let floor = if ctx.span_duration > 0.0 {
        (SITE_FLOOR_FRACTION * scale as f64 / ctx.span_duration).max(abs_floor)
    } else {
        abs_floor
    };
    let levelled_off = kind == MemoryKind::Managed
        && trend.significant_growth
        && trend.slope_bytes_per_s > floor
        && !block_site_keeps_growing(ctx.sites, &trend)
        && levelled_late(ctx, &ts, &vs, post_gc.is_some(), &trend, floor);
    KindGrowth {
        kind,
        source: source.to_string(),
        start_bytes: vs.first().copied().unwrap_or(0),
        end_bytes: vs.last().copied().unwrap_or(0),
        grows: trend.significant_growth
            && trend.slope_bytes_per_s > 0.0
            && trend.slope_bytes_per_s > floor
            && !levelled_off,
        levelled_off,
        trend,
        troughs,
        noise_floor_bytes_per_s: floor,
        collections: None,
        at_load_spikes: None,
    }
}

/// A managed heap seen without its collections (summed from its sites: V8's pages) that rose
/// over the steady window only at the load spikes of a plateau (`spikes`): each rise of `pts`
/// ((time s, bytes)) in the window in a burst's checkpoint interval or the one after it (the
/// collection at the job's end), the stretches between spikes flat (their net rises, summed, at
/// most `floor` × the window's duration), and the whole rise at most
/// [`super::plateau::PLATEAU_DRIFT_SHARE`] of the plateau's steps (the bound the plateau gives
/// live bytes between spikes). The heap sized up for the spikes' objects: part of the plateau,
/// not growth. Some(the rises at spikes), None otherwise.
fn rose_at_spikes(
    ctx: &KindContext<'_>,
    spikes: &super::plateau::Spikes,
    pts: &[(f64, u64)],
    floor: f64,
) -> Option<usize> {
    let eps = 1e-6;
    let window: Vec<(f64, u64)> =
        pts.iter().copied().filter(|p| p.0 >= ctx.steady_from - eps && p.0 <= ctx.span_to + eps).collect();
    let (first, last) = (window.first()?, window.last()?);
    let at_spike = |i: usize| {
        let (a, b) = (window[i].0, window[i + 1].0);
        spikes.bursts.iter().any(|&(s, e)| s < b - eps && a < e + (e - s) - eps)
    };
    let moves: Vec<i128> = window.windows(2).map(|w| i128::from(w[1].1) - i128::from(w[0].1)).collect();
    let rises = (0..moves.len()).filter(|&i| moves[i] > 0 && at_spike(i)).count();
    let between = super::plateau::rise_between(&moves, at_spike) as f64;
    let rise = last.1.saturating_sub(first.1) as f64;
    (rises > 0
        && between <= floor * (last.0 - first.0)
        && rise <= super::plateau::PLATEAU_DRIFT_SHARE * spikes.steps_bytes as f64)
        .then_some(rises)
}

/// True when a leaking site of a managed heap's blocks (each allocation and free traced:
/// pymalloc's objects under --pymalloc, not mapped pages) keeps growing through the last quarter
/// at least as fast as half the heap's steady slope (`trend`): the heap's late flatness is other
/// memory falling (the work ending, the objects of the last iteration freed just before
/// teardown), not the leak stopping; such a heap does not level off.
fn block_site_keeps_growing(sites: &[SiteAnalysis], trend: &Trend) -> bool {
    sites.iter().any(|s| {
        s.class == SiteClass::Leak
            && s.memory_kind == MemoryKind::Managed
            && s.kind != StackKind::Mmap
            && !s.evidence.plateau
            && s.growth_bytes_per_s >= PLATEAU_RATIO * trend.slope_bytes_per_s
            && s.evidence.late.as_ref().is_some_and(|l| {
                l.significant_growth && l.slope_bytes_per_s >= PLATEAU_RATIO * s.evidence.steady.slope_bytes_per_s
            })
    })
}

/// A managed heap that rose and then stayed flat through the last quarter of the run (V8 sizing
/// up its young generation, a heap filled to its working set) levelled off: not growth, as a
/// site that levels off is no leak. Judged on every point of the series (`ts`, `vs`) when no
/// collections were seen, on the troughs otherwise (`collected`: the steady window had enough
/// troughs; then a late window without them says nothing). It must have risen: significantly,
/// above its `floor` (a rise within the floor is flat).
fn levelled_late(ctx: &KindContext<'_>, ts: &[f64], vs: &[u64], collected: bool, trend: &Trend, floor: f64) -> bool {
    ctx.late_from.is_some_and(|from| {
        let late_window = points(ts, vs, time_range(ts, from, ctx.span_to));
        let late_points = match post_gc_troughs(&late_window) {
            Some(t) => t,
            None if collected => return false,
            None => late_window,
        };
        let late = fit(&late_points);
        late.n >= MIN_WINDOW_POINTS
            && !(late.significant_growth && late.slope_bytes_per_s > floor)
            && late.slope_bytes_per_s < PLATEAU_RATIO * trend.slope_bytes_per_s
    })
}

/// Share of the window's range (max − min) a fall must exceed to count as a collection.
const GC_DROP_FRACTION: f64 = 0.25;

/// The post-GC troughs of a collected heap's series `window` ((time, bytes) in time order): the
/// points the series fell to, by more than [`GC_DROP_FRACTION`] of the window's range and at
/// least [`KIND_FLOOR_BYTES_PER_S`] bytes, and rose from (or ended at). None with fewer than
/// [`MIN_WINDOW_POINTS`] such troughs: the heap was not seen being collected often enough to
/// measure what survives, and every point is used.
pub(super) fn post_gc_troughs(window: &[(f64, f64)]) -> Option<Vec<(f64, f64)>> {
    let out = gc_troughs(window);
    (out.len() >= MIN_WINDOW_POINTS).then_some(out)
}

/// Every post-GC trough of `window` as [`post_gc_troughs`] finds them, however few (one per
/// collection seen).
pub(super) fn gc_troughs(window: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let max = window.iter().map(|p| p.1).fold(f64::MIN, f64::max);
    let min = window.iter().map(|p| p.1).fold(f64::MAX, f64::min);
    let min_drop = (GC_DROP_FRACTION * (max - min)).max(KIND_FLOOR_BYTES_PER_S);
    let mut out = Vec::new();
    let mut k = 1;
    while k < window.len() {
        if window[k - 1].1 - window[k].1 > min_drop {
            // Follow the fall to its bottom.
            let mut j = k;
            while j + 1 < window.len() && window[j + 1].1 <= window[j].1 {
                j += 1;
            }
            out.push(window[j]);
            k = j + 1;
        } else {
            k += 1;
        }
    }
    out
}
