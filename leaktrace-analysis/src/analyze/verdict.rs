//! The process verdict: its class, confidence and the facts it rests on ([`Reason`], the runtime
//! split, the losses); `report::verdict` turns them into the sentence.

use std::collections::BTreeMap;

use leaktrace_common::counter::{self, Counter};

use super::*;
use crate::recording::{Runtime, Stack, StackKind};
use crate::runtimes::MemoryKind;

pub(super) struct ProcessInput<'a> {
    pub(super) sites: &'a [SiteAnalysis],
    pub(super) n: usize,
    pub(super) win: &'a Windows,
    pub(super) duration: f64,
    pub(super) native_trend: &'a Trend,
    /// Theil–Sen slope of the live malloc bytes over the steady window ([`median_slope`]),
    /// bytes per second; None with too few points.
    pub(super) native_median_bytes_per_s: Option<f64>,
    pub(super) traced_trend: &'a Trend,
    pub(super) rss_anon_trend: Option<&'a Trend>,
    pub(super) rss_anon: &'a [(f64, u64)],
    pub(super) allocator_trend: Option<&'a Trend>,
    /// The allocator's resident bytes over the whole analysed span (not only the steady window).
    pub(super) allocator_span_trend: Option<&'a Trend>,
    /// Slope of the live malloc bytes over the whole span, bytes per second: the smaller of the
    /// least-squares and the Theil–Sen slope.
    pub(super) native_span_bytes_per_s: f64,
    pub(super) allocator: &'a [(f64, u64)],
    /// The allocator's own figure (glibc's arenas' `system_mem`), where it was read.
    pub(super) allocator_own: &'a [(f64, u64)],
    /// glibc's own count of its bytes in use (system_mem − free chunks), where it was read.
    pub(super) allocator_in_use: &'a [(f64, u64)],
    /// Every traced site's live bytes (native, off-heap and managed) at each checkpoint.
    pub(super) traced: &'a [(f64, u64)],
    /// The probed allocator library (jemalloc, tcmalloc, mimalloc); None for the C library's.
    pub(super) allocator_family: Option<&'static str>,
    pub(super) rss_shmem_trend: Option<&'a Trend>,
    pub(super) rss_shmem: &'a [(f64, u64)],
    pub(super) rss_file_trend: Option<&'a Trend>,
    pub(super) rss_file: &'a [(f64, u64)],
    /// Each mapping site's resident bytes at the first and the last checkpoint of the analysed
    /// span that read them: (stack id, first, last).
    pub(super) mapping_resident: &'a [(u32, u64, u64)],
    pub(super) f_drops: f64,
    /// Start of the last quarter of the analysed span and its end, seconds (the checkpoints'
    /// time base); None without a late window.
    pub(super) late_from: Option<f64>,
    pub(super) span_to: f64,
    /// Growth mode: the fault sites' pages are returned and faulted in again (RSS-anon does not
    /// follow them; see `replay`): churn is the answer, not a few pages touched once.
    pub(super) faults_returned: bool,
    /// Leaking sites turned into warm-up ([`super::settled::settle_warm_up`]).
    pub(super) settled: Option<&'a super::settled::Settled>,
    /// glibc's arenas at the last checkpoint that read their headers (0: not read).
    pub(super) glibc_arenas: u32,
}

/// True when `series` ((time, bytes)) grew over the steady window (`steady`) but not through the
/// last quarter of the span (`from`..=`to`): its late slope is not significant growth above
/// `floor` and is below [`PLATEAU_RATIO`] of the steady slope, over at least
/// [`MIN_WINDOW_POINTS`] points. A process series that rose and stayed flat (a runtime sizing up
/// its heap) levelled off.
pub(super) fn levelled_off(series: &[(f64, u64)], from: Option<f64>, to: f64, steady: &Trend, floor: f64) -> bool {
    let Some(from) = from.filter(|_| steady.slope_bytes_per_s > 0.0) else { return false };
    let pts: Vec<(f64, f64)> = series.iter().filter(|p| p.0 >= from && p.0 <= to).map(|p| (p.0, p.1 as f64)).collect();
    let late = fit(&pts);
    late.n >= MIN_WINDOW_POINTS
        && !(late.significant_growth && late.slope_bytes_per_s > floor)
        && late.slope_bytes_per_s < PLATEAU_RATIO * steady.slope_bytes_per_s
}

/// Off-heap program memory: an anonymous mapping that is neither the allocator's, the loader's
/// nor a runtime's ([`crate::runtimes::classify_site`]), nor, in growth mode, one the allocator
/// made under the program's malloc (`first_touch_in`: jemalloc's extents are heap growth).
pub(super) fn is_offheap_mapping(s: &SiteAnalysis) -> bool {
    s.kind == StackKind::Mmap
        && matches!(s.memory_kind, MemoryKind::OffHeap | MemoryKind::Native)
        && s.first_touch_in.is_none()
}

impl Analysis {
    /// [`Analysis::drops`] by counter name, in name order: how report.json and report.md list
    /// them (and the loss warning names them).
    pub fn drops_by_name(&self) -> Vec<(&'static str, u64)> {
        drops_by_name(&self.drops)
    }
}

/// Loss counters by name, in name order.
pub(super) fn drops_by_name(drops: &BTreeMap<Counter, u64>) -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = drops.iter().map(|(c, &n)| (c.name(), n)).collect();
    v.sort_unstable_by_key(|&(name, _)| name);
    v
}

/// Serialize [`Analysis::drops`] as a map from counter name to count, in name order (as the
/// map of names it replaced).
pub(super) fn serialize_drops<S: serde::Serializer>(drops: &BTreeMap<Counter, u64>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(drops_by_name(drops))
}

/// Share of traced allocator calls whose bytes were lost (0..1), from the loss counters that
/// leave live bytes incomplete ([`counter::byte_losses`]; the others lose call stacks, never
/// bytes).
pub fn lost_share(drops: &BTreeMap<Counter, u64>, events: &BTreeMap<String, u64>) -> f64 {
    let lost = counter::byte_losses().filter_map(|c| drops.get(&c.counter)).fold(0u64, |a, &n| a.saturating_add(n));
    let seen = events.get(counter::Counter::Allocs.name()).copied().unwrap_or(0).saturating_add(lost);
    if seen == 0 { 0.0 } else { lost as f64 / seen as f64 }
}

/// When more than 1 % of the allocations were lost (a full map), what looks flat or like
/// fragmentation may be untraced memory: such a verdict becomes "inconclusive", and a leak found
/// anyway is said to be a lower bound. The losses are named on the verdict line.
pub(super) fn losses_verdict(v: Verdict, drops: &BTreeMap<Counter, u64>, events: &BTreeMap<String, u64>) -> Verdict {
    let share = lost_share(drops, events);
    if share <= 0.01 {
        return v;
    }
    let counters: Vec<(String, u64)> = counter::byte_losses()
        .filter_map(|c| drops.get(&c.counter).filter(|n| **n > 0).map(|n| (c.name.to_string(), *n)))
        .collect();
    match v.class {
        ProcessClass::Leak | ProcessClass::OffHeap => Verdict {
            confidence: clamp_conf(v.confidence * (1.0 - share)),
            losses: Some(Losses { share, counters, lower_bound: true }),
            ..v
        },
        _ => Verdict {
            class: ProcessClass::Flat,
            confidence: clamp_conf(0.1 * (1.0 - share)),
            inconclusive: true,
            losses: Some(Losses { share, counters, lower_bound: false }),
            ..v
        },
    }
}

/// Noise floor of a process series (RSS, allocator footprint), bytes per second:
/// max([`RSS_FLOOR_BYTES_PER_S`], [`SITE_FLOOR_FRACTION`] × its peak / span duration).
pub(super) fn process_floor(series: &[(f64, u64)], duration: f64) -> f64 {
    let peak = series.iter().map(|x| x.1).max().unwrap_or(0);
    if duration > 0.0 {
        (SITE_FLOOR_FRACTION * peak as f64 / duration).max(RSS_FLOOR_BYTES_PER_S)
    } else {
        RSS_FLOOR_BYTES_PER_S
    }
}

/// A verdict from its class, confidence and reason (no runtime split, no losses yet).
fn verdict(class: ProcessClass, confidence: f64, reason: Reason) -> Verdict {
    let inconclusive = matches!(
        reason,
        Reason::TooFewCheckpoints { .. } | Reason::NotSignificant { .. } | Reason::WarmUpSettled { .. }
    );
    Verdict { class, confidence, inconclusive, reason, by_kind: None, losses: None }
}

/// The process verdict: the first rule that answers, in order — leaking sites, warm-up, the
/// allocator's footprint (steady window, whole span, retention), RSS-anon, shared memory,
/// file-backed pages, too few checkpoints, growth not significant, caches, temporary sites,
/// flat. Each rule is its own function below.
pub(super) fn process_verdict(p: &ProcessInput<'_>) -> Verdict {
    arenas_hold_freed(p)
        .or_else(|| leak_verdict(p).map(|leak| retention_over_leaks(p, leak)))
        .or_else(|| warm_up_verdict(p))
        .or_else(|| allocator_verdict(p))
        .or_else(|| retention_verdict(p))
        .or_else(|| rss_anon_verdict(p))
        .or_else(|| shmem_verdict(p))
        .or_else(|| file_backed_verdict(p))
        .or_else(|| settled_verdict(p))
        .or_else(|| too_few_verdict(p))
        .or_else(|| not_significant_verdict(p))
        .or_else(|| cache_verdict(p))
        .unwrap_or_else(|| flat_verdict(p))
}

/// Sites with their index in `p.sites`, fastest-growing first.
type Ranked<'s> = Vec<(usize, &'s SiteAnalysis)>;

/// The sites `keep` selects, with their indices, fastest-growing first.
fn ranked<'s>(p: &ProcessInput<'s>, keep: impl Fn(&SiteAnalysis) -> bool) -> Ranked<'s> {
    let mut v: Ranked<'s> = p.sites.iter().enumerate().filter(|(_, s)| keep(s)).collect();
    v.sort_by(|a, b| b.1.growth_bytes_per_s.total_cmp(&a.1.growth_bytes_per_s));
    v
}

/// Leak: the fastest-growing leaking site names the culprit. Off-heap mappings and malloc-heap
/// sites are told apart; the class is the one that grows faster in all, the other is named too.
fn leak_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let leaks = ranked(p, |s| s.class == SiteClass::Leak);
    if leaks.is_empty() {
        return None;
    }
    // Thread stacks that leak are threads never joined: a leak of threads, not of mappings.
    let (maps, heap): (Ranked<'_>, Ranked<'_>) =
        leaks.iter().partition(|(_, s)| is_offheap_mapping(s) && s.threads.is_none());
    let sum = |v: &[(usize, &SiteAnalysis)]| v.iter().map(|(_, s)| s.growth_bytes_per_s).sum::<f64>();
    let offheap = sum(&maps) > sum(&heap);
    let (first, second) = if offheap { (&maps, &heap) } else { (&heap, &maps) };
    let (top, top_site) = first[0];
    let class = if offheap { ProcessClass::OffHeap } else { ProcessClass::Leak };
    let reason = Reason::Leaks {
        offheap,
        top,
        count: first.len(),
        total_bytes_per_s: sum(first),
        also: second.first().map(|(o, _)| (*o, second.len(), sum(second))),
        window_s: (p.native_trend.from_s, p.native_trend.to_s),
    };
    Some(verdict(class, top_site.confidence, reason))
}

/// A class is the headline only when it explains at least this share of what grows: leaking
/// sites that grow less than this share of the allocator's resident memory are listed beneath
/// its retention, which is the headline.
pub(super) const HEADLINE_SHARE: f64 = 0.5;

/// The headline when sites leak: the leak, unless the allocator's resident memory grows (by
/// [`allocator_verdict`]'s rule) at least 1 / [`HEADLINE_SHARE`] × as fast as every malloc-heap
/// leak together, taking the low end of its 95 % interval (a footprint that rises in a few
/// uneven steps in a short run is not known well enough to outrank a steady leak): then most of
/// what the user sees growing is memory the allocator retains, and the verdict is that
/// retention, with the leaking sites beneath it (their share named). Off-heap leaks (mappings)
/// are not the allocator's: they stay the headline.
fn retention_over_leaks(p: &ProcessInput<'_>, leak: Verdict) -> Verdict {
    let Reason::Leaks { offheap: false, top, count, total_bytes_per_s, also: None, .. } = leak.reason else {
        return leak;
    };
    let Some(mut v) = allocator_verdict(p) else { return leak };
    if let Reason::AllocatorRetains { trend, beneath, .. } = &mut v.reason
        && let Some(ci) = trend.ci95_bytes_per_s
        && total_bytes_per_s < HEADLINE_SHARE * (trend.slope_bytes_per_s - ci)
    {
        *beneath = Some((top, count, total_bytes_per_s));
        return v;
    }
    leak
}

/// glibc's own figures over `trend`'s window, when its arena headers were read.
fn glibc_figures(p: &ProcessInput<'_>, trend: &Trend) -> Option<super::retention::GlibcArenas> {
    let span_from = p.allocator.first().map_or(0.0, |x| x.0).max(p.span_to - p.duration);
    super::retention::glibc_arenas(
        p.allocator_own,
        p.allocator_in_use,
        p.glibc_arenas,
        span_from,
        (trend.from_s, trend.to_s),
    )
}

/// The fault sites' growth may exceed the arenas' by this factor and still be theirs (pages
/// are counted once touched, `system_mem` when the arena grows: the two move in steps).
const ARENAS_EXPLAIN_RATIO: f64 = 1.5;

/// Growth mode only (every leaking site is a fault site: no malloc probes saw the blocks):
/// fragmentation, measured by glibc itself. Some when, over the steady window, Σ `system_mem` of
/// its arenas grows significantly above its floor, glibc's own count of its bytes in use
/// (system_mem − free chunks, read from the same headers) grows less than
/// [`FRAGMENTATION_RATIO`] of that, and the arenas' growth explains the fault sites' (they grow
/// at most [`ARENAS_EXPLAIN_RATIO`] × as fast): the pages the sites first touched are freed
/// memory the arenas keep. Confidence as the allocator's other rules, at most 0.8 (glibc's
/// bins were read while the process ran).
pub(super) fn arenas_hold_freed(p: &ProcessInput<'_>) -> Option<Verdict> {
    let leaks = ranked(p, |s| s.class == SiteClass::Leak);
    let &(top, _) = leaks.first()?;
    if leaks.iter().any(|(_, s)| s.kind != StackKind::Fault) {
        return None;
    }
    let window = |series: &[(f64, u64)]| -> Vec<(f64, f64)> {
        let (from, to) = (p.native_trend.from_s, p.native_trend.to_s);
        series.iter().filter(|q| q.0 >= from - 1e-9 && q.0 <= to + 1e-9).map(|q| (q.0, q.1 as f64)).collect()
    };
    let own = fit(&window(p.allocator_own));
    let in_use_pts = window(p.allocator_in_use);
    if in_use_pts.len() < MIN_WINDOW_POINTS {
        return None;
    }
    let in_use = fit(&in_use_pts).slope_bytes_per_s.min(median_slope(&in_use_pts).unwrap_or(f64::INFINITY));
    let sites_bytes_per_s: f64 = leaks.iter().map(|(_, s)| s.growth_bytes_per_s).sum();
    let floor = process_floor(p.allocator_own, p.duration);
    if !outgrows(&own, floor, in_use) || sites_bytes_per_s > ARENAS_EXPLAIN_RATIO * own.slope_bytes_per_s {
        return None;
    }
    let confidence = clamp_conf((f_tstat(&own) * f_points(own.n) * gap(&own, in_use) * p.f_drops).min(0.8));
    let reason = Reason::ArenasHoldFreed { trend: own, in_use_bytes_per_s: in_use, top, sites_bytes_per_s };
    Some(verdict(ProcessClass::Fragmentation, confidence, reason))
}

/// No leak, but a runtime's warm-up sites (JIT compilation, code caches) grow significantly:
/// the runtime is compiling the program's hot code; what RSS does meanwhile is its doing.
fn warm_up_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let warm = ranked(p, |s| {
        s.lookalike.as_ref().is_some_and(|l| l.warm_up)
            && s.evidence.steady.significant_growth
            && s.growth_bytes_per_s > s.evidence.noise_floor_bytes_per_s
    });
    let &(top, top_site) = warm.first()?;
    let reason = Reason::WarmUp {
        top,
        count: warm.len(),
        total_bytes_per_s: warm.iter().map(|(_, s)| s.growth_bytes_per_s).sum(),
        rss_anon_bytes_per_s: p.rss_anon_trend.map(|t| t.slope_bytes_per_s),
    };
    Some(verdict(ProcessClass::Cache, clamp_conf(top_site.confidence.min(0.7)), reason))
}

/// The confidence factor of the steady window: 0.6 when it is the whole run, else 1.
fn window_share(p: &ProcessInput<'_>) -> f64 {
    if p.win.whole_run { 0.6 } else { 1.0 }
}

/// True when `grows` grows significantly above its floor while `live` grows slower than
/// [`FRAGMENTATION_RATIO`] of it. Flat means slow compared with `grows`, whatever its
/// significance: a noisy live slope close to it is not evidence of fragmentation.
fn outgrows(grows: &Trend, floor: f64, live: f64) -> bool {
    grows.n >= MIN_WINDOW_POINTS
        && grows.significant_growth
        && grows.slope_bytes_per_s > floor
        && live < FRAGMENTATION_RATIO * grows.slope_bytes_per_s
}

/// The share of `grows`' slope that `live` does not explain (0..1).
fn gap(grows: &Trend, live: f64) -> f64 {
    1.0 - (live.max(0.0) / grows.slope_bytes_per_s).min(1.0)
}

/// Live malloc bytes' slope over the steady window: the smaller of the least-squares and the
/// Theil–Sen one (blocks caught live at a checkpoint or two between their malloc and free, a
/// batch allocated and freed at once, pull a least-squares slope, not the median).
fn native_live(p: &ProcessInput<'_>) -> f64 {
    p.native_trend.slope_bytes_per_s.min(p.native_median_bytes_per_s.unwrap_or(f64::INFINITY))
}

/// Fragmentation, measured: the allocator's own resident memory (brk heap and arenas) grows,
/// live malloc bytes do not, over the steady window; else the same over the whole span, when
/// the steady window alone is too noisy to tell (an allocator returning part of its footprint
/// now and then): growth that did not level off through the last quarter, with live native
/// bytes flat over the span too. Confidence as for a whole-run window (× 0.6) then.
fn allocator_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let native_live = native_live(p);
    let alloc_floor = process_floor(p.allocator, p.duration);
    let alloc_grows = p.allocator_trend.filter(|at| outgrows(at, alloc_floor, native_live));
    if let Some(at) = alloc_grows {
        let confidence = clamp_conf(f_tstat(at) * f_points(at.n) * gap(at, native_live) * window_share(p) * p.f_drops);
        let glibc = glibc_figures(p, at);
        let reason = Reason::AllocatorRetains {
            trend: *at,
            native_bytes_per_s: native_live,
            whole_span: false,
            glibc,
            beneath: None,
        };
        return Some(verdict(ProcessClass::Fragmentation, confidence, reason));
    }
    let native_span = p.native_span_bytes_per_s;
    let alloc_span_grows = p.allocator_span_trend.filter(|at| {
        !p.win.whole_run
            && outgrows(at, alloc_floor, native_span.max(native_live))
            && !levelled_off(p.allocator, p.late_from, p.span_to, at, alloc_floor)
    });
    let at = alloc_span_grows?;
    let native = native_span.max(native_live);
    let confidence = clamp_conf(f_tstat(at) * f_points(at.n) * gap(at, native) * 0.6 * p.f_drops);
    let glibc = glibc_figures(p, at);
    let reason =
        Reason::AllocatorRetains { trend: *at, native_bytes_per_s: native, whole_span: true, glibc, beneath: None };
    Some(verdict(ProcessClass::Fragmentation, confidence, reason))
}

/// Allocator retention, decided on the whole recording: the footprint rose (in steps or
/// steadily) and stays risen while live bytes — native, off-heap and managed — stay flat or
/// fall back after each peak. Confidence: the points of the last half × the share of the
/// footprint no live byte needs, at most 0.8 (the footprint may hold the allocator's own
/// metadata too).
fn retention_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let alloc_floor = process_floor(p.allocator, p.duration);
    let span_from = p.allocator.first().map_or(0.0, |x| x.0).max(p.span_to - p.duration);
    let mut r = super::retention::retention(p.allocator, p.traced, span_from, p.span_to, alloc_floor)?;
    r.own = super::retention::own_figures(p.allocator_own, span_from, p.span_to);
    let held_share = r.held_beyond_live_bytes as f64 / r.footprint_late_bytes.max(1) as f64;
    let confidence = clamp_conf((f_points(r.late_points) * held_share).min(0.8) * p.f_drops);
    let reason = Reason::Retention { retention: r, family: p.allocator_family };
    Some(verdict(ProcessClass::Fragmentation, confidence, reason))
}

/// Fragmentation, inferred: RSS-anon grows significantly, traced live bytes do not. RSS that
/// rose and then stayed flat through the last quarter levelled off (V8 sizing up its young
/// generation): not growth.
fn rss_anon_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let traced = p.traced_trend.slope_bytes_per_s;
    let rt = p.rss_anon_trend.filter(|rt| {
        let floor = process_floor(p.rss_anon, p.duration);
        outgrows(rt, floor, traced) && !levelled_off(p.rss_anon, p.late_from, p.span_to, rt, floor)
    })?;
    // With the allocator's footprint measured (and not growing), the growth is not the malloc
    // heap's.
    let heap_flat = p.allocator_trend.is_some_and(|t| t.n >= MIN_WINDOW_POINTS);
    let f_heap = if heap_flat { 0.7 } else { 1.0 };
    let confidence =
        clamp_conf((f_tstat(rt) * f_points(rt.n) * gap(rt, traced) * window_share(p) * p.f_drops * f_heap).min(0.8));
    let reason = Reason::RssOutgrowsTraced { trend: *rt, traced_bytes_per_s: traced, heap_flat };
    Some(verdict(ProcessClass::Fragmentation, confidence, reason))
}

/// Confidence of a verdict on an untraced process series `t` (shared memory, file-backed
/// pages): at most 0.7, the memory is not attributed to a stack.
fn untraced_confidence(p: &ProcessInput<'_>, t: &Trend) -> f64 {
    let traced = p.traced_trend.slope_bytes_per_s;
    clamp_conf((f_tstat(t) * f_points(t.n) * gap(t, traced) * window_share(p) * p.f_drops).min(0.7))
}

/// Shared memory grows, nothing traced does (mappings made before attach, or shared memory the
/// program does not map through a traced call): off-heap memory that grows, never "no leak".
fn shmem_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let traced = p.traced_trend.slope_bytes_per_s;
    let st = p.rss_shmem_trend.filter(|st| outgrows(st, process_floor(p.rss_shmem, p.duration), traced))?;
    let reason = Reason::UntracedShmem { trend: *st, traced_bytes_per_s: traced };
    Some(verdict(ProcessClass::OffHeap, untraced_confidence(p, st), reason))
}

/// File-backed pages grow, nothing traced does: pages of mapped files touched over time (a file
/// mapped shared and written, a file mapped and read). Page-in that rose and levelled off (code
/// and data of the loaded objects at start-up) is not growth. Named as file-backed memory; when
/// a traced mapping site's resident bytes explain at least half of it, that site (its mapped
/// size need not grow).
fn file_backed_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let traced = p.traced_trend.slope_bytes_per_s;
    let ft = p.rss_file_trend.filter(|ft| {
        let floor = process_floor(p.rss_file, p.duration);
        outgrows(ft, floor, traced) && !levelled_off(p.rss_file, p.late_from, p.span_to, ft, floor)
    })?;
    let site = p
        .mapping_resident
        .iter()
        .filter(|(_, first, last)| last > first)
        .max_by_key(|(_, first, last)| last - first)
        .filter(|(_, first, last)| {
            p.duration > 0.0 && (last - first) as f64 / p.duration >= FILE_SITE_SHARE * ft.slope_bytes_per_s
        })
        .and_then(|&(id, first, last)| {
            p.sites.iter().position(|s| s.id == id && s.kind == StackKind::Mmap).map(|i| (i, first, last))
        });
    let reason = Reason::FileBacked { trend: *ft, traced_bytes_per_s: traced, site };
    Some(verdict(ProcessClass::OffHeap, untraced_confidence(p, ft), reason))
}

/// Warm-up: the sites that grew did so by a sliver of the allocation rate and stopped before
/// the last third of the span ([`super::settled`]): inconclusive, flat so far, never a leak.
fn settled_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let s = p.settled?;
    let top = p.sites.iter().position(|x| s.ids.contains(&x.id))?;
    let reason = Reason::WarmUpSettled {
        top,
        count: s.ids.len(),
        bytes_per_s: s.bytes_per_s,
        allocated_bytes_per_s: s.allocated_bytes_per_s,
        last_rise_s: s.last_rise_s,
        last_part_from_s: s.last_part_from_s,
    };
    Some(verdict(ProcessClass::Flat, clamp_conf(0.3 * f_points(p.n) * p.f_drops), reason))
}

/// Too few checkpoints in the steady window to fit a trend: flat, inconclusive.
fn too_few_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    (p.n < MIN_WINDOW_POINTS)
        .then(|| verdict(ProcessClass::Flat, clamp_conf(0.1 * p.f_drops), Reason::TooFewCheckpoints { n: p.n }))
}

/// Growth through the run whose steady slopes are not significant (95 % intervals as wide as
/// the slopes): inconclusive — never a leak, and not "no leak" either. Before the caches: a
/// process whose start-up filled caches would hide it.
fn not_significant_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let wide = ranked(p, |s| s.evidence.not_significant);
    let &(top, _) = wide.first()?;
    let reason = Reason::NotSignificant { top, count: wide.len() };
    Some(verdict(ProcessClass::Flat, clamp_conf(0.3 * f_points(p.native_trend.n) * p.f_drops), reason))
}

/// Cache: the largest retained growth among caches names it. libc's and the runtime's one-time
/// allocations (the loader's segments, stdio buffers) rise once at start-up: they make no cache
/// verdict. Pages faulted in and returned again dwarf a cache of a few pages touched once (a
/// stack page, static data): churn is the answer then.
fn cache_verdict(p: &ProcessInput<'_>) -> Option<Verdict> {
    let mut caches: Ranked<'_> = p
        .sites
        .iter()
        .enumerate()
        .filter(|(_, s)| s.class == SiteClass::Cache && !super::frames::is_one_time_site(&s.frames, s.memory_kind))
        .collect();
    caches.sort_by_key(|(_, s)| std::cmp::Reverse(s.growth_bytes));
    let native_flat_factor = if p.native_trend.significant_growth { 0.7 } else { 1.0 };
    let fault_churn: u64 = p
        .sites
        .iter()
        .filter(|s| s.kind == StackKind::Fault && s.class == SiteClass::Temporary)
        .map(|s| s.allocated_bytes)
        .sum();
    let cache_total: u64 = caches.iter().map(|(_, s)| s.growth_bytes.max(0) as u64).sum();
    if p.faults_returned && cache_total < fault_churn / 100 {
        caches.clear();
    }
    let &(top, top_site) = caches.first()?;
    let total: i64 = caches.iter().map(|(_, s)| s.growth_bytes.max(0)).sum();
    let single_step = top_site.evidence.single_step;
    let reason = Reason::Caches { top, count: caches.len(), retained_bytes: total as u64, single_step };
    let mut v = verdict(ProcessClass::Cache, clamp_conf(top_site.confidence * native_flat_factor), reason);
    v.inconclusive = single_step;
    Some(v)
}

/// No leak, fragmentation nor cache: temporary sites (short-lived churn), else flat. Confidence
/// falls as the live malloc bytes' slope nears the noise floor of the sites' peaks.
fn flat_verdict(p: &ProcessInput<'_>) -> Verdict {
    let f_n = f_points(p.native_trend.n);
    let floor_native = {
        let peak = p.sites.iter().map(|s| s.evidence.peak_live_bytes).sum::<u64>();
        if p.duration > 0.0 {
            (SITE_FLOOR_FRACTION * peak as f64 / p.duration).max(SITE_FLOOR_BYTES_PER_S)
        } else {
            SITE_FLOOR_BYTES_PER_S
        }
    };
    let f_flat = 1.0 - 0.5 * (p.native_trend.slope_bytes_per_s.abs() / floor_native).min(1.0);
    let temps: Vec<&SiteAnalysis> = p.sites.iter().filter(|s| s.class == SiteClass::Temporary).collect();
    if !temps.is_empty() {
        // A fault site's pages are returned unseen (munmap): what it faulted in is its churn.
        let fault = |s: &&&SiteAnalysis| s.kind == StackKind::Fault;
        let churn: u64 = temps.iter().map(|s| if fault(&s) { s.allocated_bytes } else { s.freed_bytes }).sum();
        let allocs: u64 = temps.iter().map(|s| if fault(&s) { s.allocations } else { s.frees }).sum();
        let reason = Reason::ShortLived {
            count: temps.len(),
            freed_bytes: churn,
            freed_blocks: allocs,
            native_bytes_per_s: p.native_trend.slope_bytes_per_s,
        };
        return verdict(ProcessClass::Temporary, clamp_conf(f_flat * f_n * p.f_drops), reason);
    }
    let reason = Reason::Flat { native_bytes_per_s: p.native_trend.slope_bytes_per_s };
    verdict(ProcessClass::Flat, clamp_conf(f_flat * f_n * p.f_drops), reason)
}

/// The managed heap is judged on its collections and fewer than two ran, and nothing else leaks:
/// what grows between collections may be garbage, and what they leave cannot be compared.
/// Inconclusive, not "no leak".
fn managed_unknown_verdict(v: Verdict, kinds: &[KindGrowth], f_drops: f64) -> Verdict {
    let native = kinds.iter().find(|g| g.kind == MemoryKind::Native).map_or(0.0, |g| g.trend.slope_bytes_per_s);
    let reason = match v.reason {
        Reason::Leaks { .. } => Reason::Flat { native_bytes_per_s: native },
        ref r => r.clone(),
    };
    Verdict {
        class: ProcessClass::Flat,
        confidence: clamp_conf(0.1 * f_drops),
        inconclusive: true,
        reason,
        by_kind: Some(KindReason::ManagedUnknown),
        ..v
    }
}

/// For a target with a managed runtime, name the kind of memory that grows ("native leak in
/// parse_record (C extension), Python heap flat"), with the other kinds' trends; a managed heap
/// that grows significantly is a leak even without a leaking site (the JVM's heap is seen only
/// through its gauge). Without a runtime the verdict is unchanged.
pub(super) fn kind_verdict(
    v: Verdict,
    runtime: Option<Runtime>,
    kinds: &[KindGrowth],
    sites: &[SiteAnalysis],
    f_drops: f64,
) -> Verdict {
    let Some(rt) = runtime else { return v };
    // The kind that leaks: the fastest-growing series among managed, native and off-heap (runtime
    // only when nothing else grows: glibc's arenas, counted there, fill as native leaks grow);
    // without a growing series, the kind whose leaking sites grow fastest in all.
    let managed = kinds.iter().find(|g| g.kind == MemoryKind::Managed);
    let mut growing: Vec<&KindGrowth> = kinds.iter().filter(|g| g.grows && g.kind != MemoryKind::Runtime).collect();
    if growing.is_empty() {
        growing = kinds.iter().filter(|g| g.grows).collect();
    }
    growing.sort_by(|a, b| b.trend.slope_bytes_per_s.total_cmp(&a.trend.slope_bytes_per_s));
    let has_leak_site = |k: MemoryKind| sites.iter().any(|s| s.class == SiteClass::Leak && s.memory_kind == k);
    // The runtime's bookkeeping of the managed heap's pages (V8's per-page free lists) is the
    // managed heap's: it grows as the heap maps pages, and is judged with it.
    let kind_of = |s: &SiteAnalysis| {
        if s.memory_kind == MemoryKind::Runtime && crate::runtimes::follows_managed_heap(rt, &s.frames) {
            MemoryKind::Managed
        } else {
            s.memory_kind
        }
    };
    let mut rates: Vec<(MemoryKind, f64)> = Vec::new();
    for s in sites.iter().filter(|s| s.class == SiteClass::Leak) {
        match rates.iter_mut().find(|(k, _)| *k == kind_of(s)) {
            Some((_, r)) => *r += s.growth_bytes_per_s,
            None => rates.push((kind_of(s), s.growth_bytes_per_s)),
        }
    }
    rates.sort_by(|a, b| b.1.total_cmp(&a.1));
    // A managed heap measured not to grow (slope ≤ 0, or a rise within its noise floor: under
    // 1 % of RSS-anon over the run) does not grow, whatever its sites look like (pages mapped
    // after attach whose predecessors, mapped before, were unmapped unseen; a few pages promoted
    // into V8's old space).
    // The same for the runtime's own memory (its bookkeeping, not the program's): runtime sites
    // that look like leaks while the runtime's series does not grow above its floor (V8's task
    // queue holding one more task at the end) make no leak.
    let measured_flat =
        |k: MemoryKind| kinds.iter().find(|g| g.kind == k).is_some_and(|g| g.trend.n >= MIN_WINDOW_POINTS && !g.grows);
    let flat_kind = |k: MemoryKind| matches!(k, MemoryKind::Managed | MemoryKind::Runtime) && measured_flat(k);
    rates.retain(|(k, _)| !flat_kind(*k));
    let leak_kind = match growing.iter().find(|g| g.kind == MemoryKind::Managed || has_leak_site(g.kind)) {
        Some(g) => Some(g.kind),
        None => rates.first().map(|(k, _)| *k),
    };
    let only_flat_kind_leaks = sites.iter().any(|s| s.class == SiteClass::Leak)
        && sites.iter().filter(|s| s.class == SiteClass::Leak).all(|s| flat_kind(kind_of(s)));
    // A kind the verdict measures (native, off-heap) grows significantly, yet no site of it
    // leaks: the verdict would say "no leak" (no site grows beyond noise, short-lived sites, or
    // only a flat heap's sites leak) while the by-kind part says it grows. The growing kind is
    // the verdict then, with its series' confidence (at most 0.6: no site names it). A managed
    // heap that grows is a managed leak above; warm-up, caches and fragmentation keep theirs.
    let says_no_leak = matches!(
        v.reason,
        Reason::Flat { .. } | Reason::ShortLived { .. } | Reason::NotSignificant { .. } | Reason::WarmUpSettled { .. }
    ) || (only_flat_kind_leaks && v.class == ProcessClass::Leak);
    if leak_kind.is_none()
        && says_no_leak
        && let Some(g) = growing.iter().find(|g| matches!(g.kind, MemoryKind::Native | MemoryKind::OffHeap))
    {
        let class = if g.kind == MemoryKind::OffHeap { ProcessClass::OffHeap } else { ProcessClass::Leak };
        let native = kinds.iter().find(|g| g.kind == MemoryKind::Native).map_or(0.0, |g| g.trend.slope_bytes_per_s);
        let reason = match v.reason {
            Reason::Leaks { .. } => Reason::Flat { native_bytes_per_s: native },
            ref r => r.clone(),
        };
        return Verdict {
            class,
            confidence: clamp_conf((f_tstat(&g.trend) * f_points(g.trend.n) * f_drops).min(0.6)),
            inconclusive: false,
            reason,
            by_kind: Some(KindReason::KindGrows { kind: g.kind }),
            ..v
        };
    }
    // RSS that outgrows the traced bytes may be the heap whose trend is unknown (its pages
    // touched as it fills): no more "fragmentation" than "no leak". A verdict already
    // inconclusive (a heap page's one step), or warm-up's "no leak", says first why the heap
    // cannot be judged.
    let rss_outgrows = matches!(v.reason, Reason::RssOutgrowsTraced { .. });
    let inconclusive = (v.inconclusive || matches!(v.reason, Reason::WarmUp { .. })) && v.class != ProcessClass::Leak;
    if leak_kind.is_none()
        && (says_no_leak || rss_outgrows || inconclusive)
        && managed.is_some_and(super::managed::unknown)
    {
        return managed_unknown_verdict(v, kinds, f_drops);
    }
    if leak_kind.is_none() && only_flat_kind_leaks && v.class == ProcessClass::Leak {
        // The only leaking sites are the managed heap's or the runtime's, and neither grows: no
        // leak.
        let native = kinds.iter().find(|g| g.kind == MemoryKind::Native).map_or(0.0, |g| g.trend.slope_bytes_per_s);
        return Verdict {
            class: ProcessClass::Flat,
            confidence: clamp_conf(v.confidence.min(0.6) * f_drops),
            inconclusive: false,
            reason: Reason::Flat { native_bytes_per_s: native },
            by_kind: Some(KindReason::ByKind),
            ..v
        };
    }
    match leak_kind {
        Some(MemoryKind::Managed) => {
            let Some(m) = managed else { return v };
            let site_conf = sites
                .iter()
                .filter(|s| s.class == SiteClass::Leak && s.memory_kind == MemoryKind::Managed)
                .map(|s| s.confidence)
                .fold(0.0f64, f64::max);
            let gauge_conf = if m.grows { f_tstat(&m.trend) * f_points(m.trend.n) * f_drops } else { 0.0 };
            Verdict {
                class: ProcessClass::Leak,
                confidence: clamp_conf(site_conf.max(gauge_conf)),
                inconclusive: false,
                by_kind: Some(KindReason::ManagedLeak),
                ..v
            }
        }
        Some(k) => {
            let mut of_kind: Vec<(usize, &SiteAnalysis)> =
                sites.iter().enumerate().filter(|(_, s)| s.class == SiteClass::Leak && kind_of(s) == k).collect();
            of_kind.sort_by(|a, b| b.1.growth_bytes_per_s.total_cmp(&a.1.growth_bytes_per_s));
            let Some(&(top_index, top)) = of_kind.first() else { return v };
            let stack = Stack {
                id: top.id,
                kind: top.kind,
                frames: top.frames.clone(),
                lost: top.stack_lost,
                truncated: top.stack_truncated.clone(),
                shared: top.shared_mapping,
            };
            let label = crate::runtimes::site_label(Some(rt), k, &stack).unwrap_or_else(|| top.function.clone());
            let by_kind = KindReason::KindLeak { kind: k, top: top_index, label, count: of_kind.len() };
            // Off-heap mappings that leak keep their class (the runtime split names the kind).
            let class = if k == MemoryKind::OffHeap && v.class == ProcessClass::OffHeap {
                ProcessClass::OffHeap
            } else {
                ProcessClass::Leak
            };
            Verdict { class, confidence: top.confidence, inconclusive: false, by_kind: Some(by_kind), ..v }
        }
        None => Verdict { by_kind: Some(KindReason::ByKind), ..v },
    }
}
