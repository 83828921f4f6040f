//! One site's trend, evidence and class (leak, cache, temporary, flat).

use super::replay::Series;
use super::*;
use crate::recording::{Stack, StackKind};
use crate::runtimes::MemoryKind;

/// What every site's analysis shares.
pub(super) struct SiteContext<'a> {
    /// Checkpoint times, sorted, seconds.
    pub(super) times: &'a [f64],
    /// Units of work at each checkpoint (None: not counted).
    pub(super) units: &'a [Option<u64>],
    /// Duration of the analysed span, seconds.
    pub(super) duration: f64,
    pub(super) win: &'a Windows,
    /// Confidence factor for losses.
    pub(super) f_drops: f64,
    /// Sampled mode: mean distance between samples, bytes (0 otherwise).
    pub(super) sample_bytes: u64,
    /// Growth mode: pages first touched by stack, no allocator probes.
    pub(super) growth: bool,
}

pub(super) fn analyze_site(
    st: &Stack,
    ser: &Series<'_>,
    ctx: &SiteContext<'_>,
    memory_kind: MemoryKind,
) -> SiteAnalysis {
    let (culprit_frame, function) = culprit(st);
    let f = Facts::gather(st, ser, ctx);
    let verdict = classify(&f, ctx);
    let (verdict, not_significant) = mark_not_significant(&f, verdict);
    let verdict = judge_collected(&f, ctx, memory_kind, verdict);
    // A runtime's warm-up (JIT compilation, code caches: a catalog look-alike marked warm_up) in
    // the runtime's own or managed memory grows while the program's hot code gets compiled: not
    // a leak, however steady within the recording.
    let lookalike = patterns::lookalike(&st.frames);
    let verdict = judge_warm_up(&f, ctx, memory_kind, lookalike.as_ref(), verdict);
    let (threads, Verdict { class, confidence, reason }) = judge_threads(&f, st, ser, ctx, verdict);
    // A leak in steps keeps its envelope's rate (no interval: the steps are its evidence).
    let by_envelope = f.envelope.filter(|_| class == SiteClass::Leak && f.envelope_leak());

    // The release a leaking stack likely misses: for a site that leaks, or that never freed any
    // of the blocks it holds; a site whose blocks are freed (the same API, its result released)
    // is not missing the release.
    let releasing = ser.last.free_count > 0 && class != SiteClass::Leak;
    // Growth mode: a fault names who first wrote a page, not who allocated or holds it, so no
    // fault site gets a missing release; one inside malloc (or an allocating API) names no holder.
    // A mapping the allocator made (jemalloc's extents) is the heap growing through it: the same.
    let first_touch_in = super::first_touch::first_touch_in(st, culprit_frame)
        .or_else(|| ctx.growth.then(|| crate::frame_origin::mapped_by_allocator(st)).flatten());
    let likely_missing_release = if releasing || ser.last.live_count() == 0 || st.kind == StackKind::Fault {
        None
    } else {
        patterns::release_hint(&st.frames, culprit_frame)
    };

    SiteAnalysis {
        id: st.id,
        kind: st.kind,
        memory_kind,
        origin: None,
        function,
        culprit_frame,
        frames: st.frames.clone(),
        stack_lost: st.lost,
        stack_truncated: st.truncated.clone(),
        live_bytes: ser.last.live_bytes(),
        live_allocations: ser.last.live_count(),
        allocated_bytes: ser.last.alloc_bytes,
        allocations: ser.last.alloc_count,
        freed_bytes: ser.last.free_bytes,
        frees: ser.last.free_count,
        growth_bytes: f.growth_bytes,
        growth_bytes_per_s: by_envelope.map_or(f.steady.slope_bytes_per_s, |e| e.rate),
        growth_ci95_bytes_per_s: if by_envelope.is_some() { None } else { f.steady.ci95_bytes_per_s },
        growth_bytes_per_unit: f.per_unit.map(|t| t.slope_bytes_per_s),
        growth_ci95_bytes_per_unit: f.per_unit.and_then(|t| t.ci95_bytes_per_s),
        resident_bytes: if st.kind == StackKind::Mmap { ser.resident } else { None },
        shared_mapping: st.kind == StackKind::Mmap && st.shared,
        threads,
        likely_missing_release,
        first_touch_in,
        lookalike,
        class,
        confidence,
        evidence: SiteEvidence {
            steady: f.steady,
            early: f.early,
            late: f.late,
            noise_floor_bytes_per_s: f.floor,
            steady_growth_allocations: f.steady_growth_allocations,
            peak_live_bytes: f.peak,
            first_live_bytes: f.first_live,
            rise_bytes: f.rise,
            steady_sd_bytes: f.sd_steady,
            turnover: f.turnover,
            plateau: f.plateau,
            steps: by_envelope.map_or(f.steps.len(), |e| e.steps),
            single_step: f.single_step && class == SiteClass::Cache,
            not_significant,
            mean_age_s: f.ages.map(|a| a.mean_age_s),
            reason,
        },
    }
}

/// A site's class, its confidence (0–1) and the sentence that explains it.
struct Verdict {
    class: SiteClass,
    confidence: f64,
    reason: String,
}

/// The evidence about one site that the class decisions and adjustments share.
struct Facts<'a> {
    /// The site's live bytes and live blocks at each checkpoint.
    live: &'a [u64],
    count: &'a [u64],
    /// Live bytes at the first and last checkpoint, and their peak.
    first_live: u64,
    last_live: u64,
    peak: u64,
    /// Last minus first live bytes, bytes.
    growth_bytes: i64,
    steady: Trend,
    per_unit: Option<Trend>,
    early: Option<Trend>,
    late: Option<Trend>,
    /// Noise floor, bytes/s, and whether the blocks themselves are the evidence instead.
    floor: f64,
    evident: bool,
    never_freed: bool,
    /// Blocks the site freed, in all.
    free_count: u64,
    /// Live blocks gained over the steady window, and live blocks at the end.
    steady_growth_allocations: i64,
    count_end: u64,
    /// Mean live bytes over the steady window minus the first live bytes, and their deviation.
    rise: f64,
    sd_steady: f64,
    /// Allocated bytes / peak live bytes.
    turnover: Option<f64>,
    grows: bool,
    plateau: bool,
    /// Time (s) of the steady window's last rise, when the live set was replaced since it
    /// ([`replaced_since_rise`]).
    replaced_after: Option<f64>,
    count_grew: bool,
    count_ok: bool,
    f_n: f64,
    f_share: f64,
    /// Bytes the noise floor allows over the whole run.
    floor_bytes: f64,
    wide: bool,
    too_short: bool,
    /// First checkpoint of the analysed span (the early window's start).
    span_start: usize,
    steps: Vec<std::ops::Range<usize>>,
    stepwise: bool,
    /// Live bytes rising in stairs that only go up ([`super::envelope::envelope`]).
    envelope: Option<super::envelope::Envelope>,
    single_step: bool,
    /// Mean live blocks over the steady window, and their mean lifetime, seconds.
    mean_blocks: f64,
    lifetime_s: Option<f64>,
    /// Median checkpoint interval, seconds.
    interval: f64,
    ages: Option<BlockAges>,
    young: bool,
    rose_and_flat: bool,
    evicting_cache: bool,
}

/// Whether a site's growth is evidence instead of a byte floor, and the noise floor that follows.
struct Floor {
    floor: f64,
    evident: bool,
    never_freed: bool,
    blocks_monotonic: bool,
    steady_growth_allocations: i64,
    count_end: u64,
}

/// The noise floor of a site (bytes/s) and whether its blocks alone are evidence of growth.
fn noise_floor(ser: &Series<'_>, ctx: &SiteContext<'_>, steady: &Trend, peak: u64) -> Floor {
    let SiteContext { duration, win, sample_bytes, .. } = *ctx;
    let count = ser.live_count;
    // The relative parts of the noise floor (share of the peak, sampling steps); the absolute
    // part (SITE_FLOOR_BYTES_PER_S) is added below unless the blocks themselves are evidence.
    let floor_rel = if duration > 0.0 {
        (SITE_FLOOR_FRACTION * peak as f64 / duration).max(2.0 * sample_bytes as f64 / duration)
    } else {
        0.0
    };
    let count_at_start = count.get(win.steady.start).copied().unwrap_or(0);
    let count_end = count.last().copied().unwrap_or(0);
    let steady_growth_allocations =
        (count_end as i128 - count_at_start as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    // Evidence instead of a byte floor: the site never freed one of its blocks, its live blocks
    // never fell from one checkpoint to the next and grew by at least MIN_EVIDENT_BLOCKS over
    // the steady window. Such growth is a leak however slow, as long as the fit is significant
    // (its 95 % interval above zero) and does not level off.
    let never_freed = ser.last.free_count == 0;
    let blocks_monotonic = count.windows(2).all(|w| w[1] >= w[0]);
    // Blocks freed too (the leak shares its stack with freed blocks): more new blocks, and a
    // fall by no more than the blocks in flight when a checkpoint reads the site.
    let shared_evident = !never_freed
        && count.windows(2).all(|w| w[1] + IN_FLIGHT_BLOCKS >= w[0])
        && steady_growth_allocations >= MIN_EVIDENT_SHARED_BLOCKS;
    let evident = ((never_freed && blocks_monotonic && steady_growth_allocations >= MIN_EVIDENT_BLOCKS)
        || shared_evident)
        && steady.n >= MIN_WINDOW_POINTS
        && steady.significant_growth
        && steady.slope_bytes_per_s > floor_rel
        && steady.slope_bytes_per_s <= floor_rel.max(SITE_FLOOR_BYTES_PER_S);
    let floor = if evident { floor_rel } else { floor_rel.max(SITE_FLOOR_BYTES_PER_S) };
    Floor { floor, evident, never_freed, blocks_monotonic, steady_growth_allocations, count_end }
}

/// Mean and sample standard deviation of `vals` (0 for too few values).
fn mean_sd(vals: &[f64]) -> (f64, f64) {
    let mean = if vals.is_empty() { 0.0 } else { vals.iter().sum::<f64>() / vals.len() as f64 };
    let sd = if vals.len() < 2 {
        0.0
    } else {
        (vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (vals.len() - 1) as f64).sqrt()
    };
    (mean, sd)
}

/// The runs of checkpoint intervals in `span_start..steady_end` in which live blocks rose.
fn block_steps(count: &[u64], span_start: usize, steady_end: usize) -> Vec<std::ops::Range<usize>> {
    // Steps: separate runs of checkpoint intervals in which live blocks rose, for a site that
    // never freed a block and whose blocks never fell, not counting a run that starts at the
    // first interval of the recording (start-up, or what happened before the first checkpoint
    // after attach). A run of at most two intervals is abrupt (a burst).
    let mut steps: Vec<std::ops::Range<usize>> = Vec::new();
    for i in span_start..steady_end.saturating_sub(1) {
        if count.get(i + 1).copied().unwrap_or(0) > count.get(i).copied().unwrap_or(0) {
            match steps.last_mut() {
                Some(r) if r.end == i => r.end = i + 1,
                _ => steps.push(i..i + 1),
            }
        }
    }
    steps.retain(|r| r.start != 0);
    steps
}

/// A rise is a new high of live bytes at least this factor above the previous high.
const RISE_FACTOR: f64 = 1.1;

/// Some(time of the last rise, s) when a site's live set was replaced after its last rise in
/// the steady window (`steady`, indexes into `times`): live bytes reached a new high (≥
/// [`RISE_FACTOR`] × the one before) at that checkpoint, did not grow significantly above
/// `floor` after it, over at least a quarter of the steady window and [`MIN_PLATEAU_POINTS`]
/// checkpoints, and the live blocks at the end were born, on average, after it (their birth
/// times, `live_born_ms`: ms on the recording's clock, summed per checkpoint). A leak keeps the
/// blocks that made its rise, so its live blocks' mean birth stays before the rise; a bounded set
/// replaced in full after it (a job's kept results, dropped at the next job) is no leak, though
/// its rise came late in the window (a JIT tier-up that moved a JavaScript function's
/// allocations to a new call stack half-way through the recording: the new stack's site rises
/// from zero at that moment). None without birth times or such a rise.
fn replaced_since_rise(
    times: &[f64],
    live: &[u64],
    count: &[u64],
    live_born_ms: Option<&[i64]>,
    steady: std::ops::Range<usize>,
    floor: f64,
) -> Option<f64> {
    let born = live_born_ms?;
    let end = steady.end.min(times.len()).min(live.len()).min(count.len()).min(born.len());
    if end < steady.start + MIN_WINDOW_POINTS {
        return None;
    }
    let mut high = live[steady.start];
    let mut rise = None;
    for (i, &v) in live.iter().enumerate().take(end).skip(steady.start + 1) {
        if v as f64 >= RISE_FACTOR * high as f64 && v > high {
            rise = Some(i);
        }
        high = high.max(v);
    }
    let rise = rise?;
    let (t_rise, t_end) = (times[rise], times[end - 1]);
    let tail = fit(&points(times, live, rise..end));
    let n_live = count[end - 1];
    let flat_tail = end - rise >= MIN_PLATEAU_POINTS
        && t_end - t_rise >= 0.25 * (t_end - times[steady.start])
        && !(tail.significant_growth && tail.slope_bytes_per_s > floor);
    let mean_birth_s = (n_live > 0).then(|| born[end - 1] as f64 / n_live as f64 / 1000.0)?;
    (flat_tail && mean_birth_s > t_rise).then_some(t_rise)
}

/// The median gap between checkpoints in `span_start..steady_end`, seconds (0 without one).
fn median_interval(times: &[f64], span_start: usize, steady_end: usize) -> f64 {
    let mut gaps: Vec<f64> = times[span_start..steady_end.min(times.len())].windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_by(f64::total_cmp);
    gaps.get(gaps.len() / 2).copied().unwrap_or(0.0)
}

impl<'a> Facts<'a> {
    /// The windows' fits, the noise floor, the growth shape, steps and block lifetimes of a site.
    fn gather(st: &Stack, ser: &Series<'a>, ctx: &SiteContext<'_>) -> Facts<'a> {
        let SiteContext { times, units, duration, win, .. } = *ctx;
        let live = ser.live_bytes;
        let count = ser.live_count;
        let first_live = live.first().copied().unwrap_or(0);
        let last_live = live.last().copied().unwrap_or(0);
        let peak = live.iter().copied().max().unwrap_or(0);
        let growth_bytes = (last_live as i128 - first_live as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;

        let steady = fit(&points(times, live, win.steady.clone()));
        let per_unit = unit_fit(units, live, win.steady.clone());
        let early = win.early.clone().map(|r| fit(&points(times, live, r)));
        let late = win.late.clone().map(|r| fit(&points(times, live, r)));

        let Floor { floor, evident, never_freed, blocks_monotonic, steady_growth_allocations, count_end } =
            noise_floor(ser, ctx, &steady, peak);
        let steady_vals: Vec<f64> = win.steady.clone().filter_map(|i| live.get(i)).map(|&v| v as f64).collect();
        let (mean_steady, sd_steady) = mean_sd(&steady_vals);
        let rise = mean_steady - first_live as f64;
        let turnover = (ser.last.alloc_bytes > 0).then(|| ser.last.alloc_bytes as f64 / peak.max(1) as f64);
        let mut f = Facts {
            live,
            count,
            first_live,
            last_live,
            peak,
            growth_bytes,
            steady,
            per_unit,
            early,
            late,
            floor,
            evident,
            never_freed,
            free_count: ser.last.free_count,
            steady_growth_allocations,
            count_end,
            rise,
            sd_steady,
            turnover,
            grows: false,
            plateau: false,
            replaced_after: replaced_since_rise(times, live, count, ser.live_born_ms, win.steady.clone(), floor),
            count_grew: false,
            count_ok: false,
            f_n: f_points(steady.n),
            f_share: if win.whole_run { 0.6 } else { 1.0 },
            // Bytes the noise floor allows over the whole run.
            floor_bytes: floor * duration.max(1.0),
            wide: false,
            too_short: false,
            span_start: win.early.as_ref().map_or(win.steady.start, |e| e.start),
            steps: Vec::new(),
            stepwise: false,
            envelope: None,
            single_step: false,
            mean_blocks: 0.0,
            lifetime_s: None,
            interval: 0.0,
            ages: None,
            young: false,
            rose_and_flat: false,
            evicting_cache: false,
        };
        let flattened = f.growth_shape(st);
        f.block_history(ser, ctx, blocks_monotonic, flattened);
        f.envelope = super::envelope::envelope(times, live, f.span_start, win.steady.end, win.steady.start)
            .filter(|e| e.rate > floor && f.growth_bytes as f64 > f.floor_bytes);
        f
    }

    /// Sets grows, plateau, count_ok, wide and too_short; returns whether the growth flattened.
    fn growth_shape(&mut self, st: &Stack) -> bool {
        let (steady, floor) = (self.steady, self.floor);
        // Growth mode: a fault site that gained fewer than MIN_FAULT_LEAK_PAGES pages over the steady
        // window (one page faulted late by a stack seen once, a walk cut short) shows no growth.
        let few_pages = st.kind == StackKind::Fault && self.steady_growth_allocations < MIN_FAULT_LEAK_PAGES;
        let grows = steady.significant_growth && steady.slope_bytes_per_s > floor && !few_pages;
        self.grows = grows;
        self.plateau = grows
            && (self.replaced_after.is_some()
                || self.late.is_some_and(|l| {
                    !(l.significant_growth && l.slope_bytes_per_s > floor)
                        && l.slope_bytes_per_s < PLATEAU_RATIO * steady.slope_bytes_per_s
                }));
        // Live blocks must not fall: either more blocks, or the same blocks enlarged (realloc).
        let count_grew = self.steady_growth_allocations > 0;
        let enlarged = self.steady_growth_allocations == 0 && self.count_end > 0;
        self.count_grew = count_grew;
        self.count_ok = count_grew || enlarged;
        // A cache is growth that levels off: the steady window must be clearly slower than the
        // first part. A steady slope that is merely not significant (few checkpoints) while it
        // keeps the early pace is no evidence of a plateau.
        let flattened = steady.slope_bytes_per_s <= floor
            || self.early.is_none_or(|e| steady.slope_bytes_per_s < PLATEAU_RATIO * e.slope_bytes_per_s.max(0.0));
        // Growth through the run whose steady-window slope is above the floor but not significant:
        // its 95 % interval reaches zero, as wide as the slope (few checkpoints, or batches allocated
        // and freed scattering the series: protobuf's upb arenas, "+20.4 KiB/s ± 20.7 KiB/s"). No
        // leak verdict rests on it: the site keeps the class its other evidence
        // gives, `evidence.not_significant` says so, and the process verdict is inconclusive.
        self.wide = !grows
            && steady.n >= MIN_WINDOW_POINTS
            && !flattened
            && self.count_ok
            && steady.slope_bytes_per_s > floor
            && self.early.is_some_and(|e| e.significant_growth && e.slope_bytes_per_s > floor);
        // Too few checkpoints for any fit (a process traced late, a short run), but live bytes never
        // fell and grew beyond what the noise floor allows: not "no growth".
        let live = self.live;
        let rising = live.len() >= 2 && live.windows(2).all(|w| w[1] >= w[0]);
        self.too_short = !grows
            && steady.n < MIN_WINDOW_POINTS
            && count_grew
            && rising
            && self.growth_bytes as f64 > self.floor_bytes;
        flattened
    }

    /// Sets the steps of never-freed blocks, block lifetimes and ages, and the cache shapes.
    fn block_history(&mut self, ser: &Series<'_>, ctx: &SiteContext<'_>, blocks_monotonic: bool, flattened: bool) {
        let SiteContext { times, duration, win, .. } = *ctx;
        let (count, span_start) = (self.count, self.span_start);
        if self.never_freed && blocks_monotonic {
            self.steps = block_steps(count, span_start, win.steady.end);
        }
        // Repeated bursts of never-freed blocks, the last one in the steady window: a leak in steps.
        self.stepwise = self.steps.len() >= 2 && self.steps.last().is_some_and(|r| r.end > win.steady.start);
        // One abrupt step of never-freed blocks: a burst leak and a cache filled once look alike.
        self.single_step = self.steps.len() == 1 && self.steps[0].len() <= 2;

        // Mean lifetime of the site's blocks (Little's law): mean live blocks over the steady window
        // / frees per second over the span. A bounded cache that keeps evicting turns its memory over
        // many times (like short-lived blocks) but its blocks outlive a checkpoint interval; the
        // churn of short-lived blocks lives for microseconds.
        let steady_counts: Vec<f64> = win.steady.clone().filter_map(|i| count.get(i)).map(|&v| v as f64).collect();
        let mean_blocks =
            if steady_counts.is_empty() { 0.0 } else { steady_counts.iter().sum::<f64>() / steady_counts.len() as f64 };
        self.mean_blocks = mean_blocks;
        self.lifetime_s =
            (ser.last.free_count > 0 && duration > 0.0).then(|| mean_blocks / (ser.last.free_count as f64 / duration));
        let interval = median_interval(times, span_start, win.steady.end);
        self.interval = interval;
        // Block age (the kernel's birth time of every block, summed per site): growth made of young
        // blocks is more blocks in flight at once (rising concurrency, load), not retention.
        self.ages = BlockAges::of(ser, times, win, interval);
        self.young = self.ages.as_ref().is_some_and(|a| a.young);
        self.rose_and_flat =
            self.rise > self.floor_bytes && self.rise > 3.0 * self.sd_steady && self.growth_bytes > 0 && flattened;
        self.evicting_cache = self.rose_and_flat
            && interval > 0.0
            && self.lifetime_s.is_some_and(|l| l >= interval.min(CACHE_MIN_LIFETIME_S));
    }
}

/// The site's class from its facts: the first decision that applies, in order.
fn classify(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    if f.young && (f.grows || f.wide || f.too_short) {
        young_temporary(f, ctx)
    } else if f.too_short {
        too_short_leak(f, ctx)
    } else if f.grows && f.count_ok && !f.plateau {
        growth_leak(f, ctx)
    } else if f.stepwise && f.growth_bytes as f64 > f.floor_bytes {
        stepwise_leak(f, ctx)
    } else if f.envelope_leak() {
        envelope_leak(f, ctx)
    } else if f.turnover.is_some_and(|t| t >= TEMPORARY_TURNOVER) && f.free_count > 0 && !f.grows && !f.evicting_cache {
        churn_temporary(f, ctx)
    } else if (f.grows && (f.plateau || !f.count_ok)) || f.rose_and_flat {
        cache(f, ctx)
    } else {
        flat(f, ctx)
    }
}

/// Temporary: growth made of young blocks, more blocks in flight at once.
fn young_temporary(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let a = f.ages.as_ref().copied().unwrap_or_default();
    let interval = f.interval;
    let confidence = clamp_conf(f.f_n * ctx.f_drops * (1.0 - a.max_mean_age_s / interval).max(0.2));
    let reason = format!(
        "in flight grows with concurrency: live blocks rose by {} over the steady window ({:.1} \
         B/s), but they are young: {} live at the end, on average {:.0} ms old, and at no later \
         checkpoint older on average than one checkpoint interval ({:.2} s); blocks kept since \
         the window began would be older. More blocks in flight at once (rising concurrency \
         or load), not retained: temporary",
        a.new_blocks,
        f.steady.slope_bytes_per_s,
        a.live_blocks,
        a.mean_age_s * 1000.0,
        interval,
    );
    Verdict { class: SiteClass::Temporary, confidence, reason }
}

/// Leak, weakly: live bytes never fell but there are too few checkpoints for a fit.
fn too_short_leak(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let confidence = clamp_conf(0.5 * f.f_n * f.f_share * ctx.f_drops);
    let reason = format!(
        "live bytes never fell and grew by {} in all, but {} checkpoint(s) are too few \
         to tell a leak from a cache that is still filling; record longer or with a shorter \
         --interval to be sure",
        crate::human::bytes(f.growth_bytes.max(0) as u64),
        f.live.len()
    );
    Verdict { class: SiteClass::Leak, confidence, reason }
}

/// Leak: significant growth above the floor that does not level off, with blocks not falling.
fn growth_leak(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let (steady, floor, win) = (&f.steady, f.floor, ctx.win);
    let steady_growth_allocations = f.steady_growth_allocations;
    let count_end = f.count_end;
    let f_margin = 1.0 - 0.5 * floor / steady.slope_bytes_per_s;
    let f_blocks = if f.count_grew { 1.0 } else { 0.8 };
    let f_idle = if win.late_idle { 0.6 } else { 1.0 };
    let confidence = clamp_conf(f_tstat(steady) * f.f_n * f_margin * f.f_share * ctx.f_drops * f_blocks * f_idle);
    let blocks = if f.count_grew {
        format!("live blocks grew by {steady_growth_allocations}")
    } else {
        format!("the same {count_end} live block(s) keep being enlarged (realloc)")
    };
    let mut reason = format!(
        "live bytes grow {:.1} B/s (95 % CI ±{:.1}, t {}, {} checkpoints) over the steady \
         window, above the noise floor of {:.1} B/s, and {blocks}",
        steady.slope_bytes_per_s,
        steady.ci95_bytes_per_s.unwrap_or(0.0),
        fmt_t(steady.t_stat),
        steady.n,
        floor,
    );
    if f.evident && f.never_freed {
        reason.push_str(&format!(
            "; slower than the {SITE_FLOOR_BYTES_PER_S} B/s floor, but not one of the site's \
             {count_end} blocks was ever freed and live blocks never fell: slow, not noise"
        ));
    } else if f.evident {
        reason.push_str(&format!(
            "; slower than the {SITE_FLOOR_BYTES_PER_S} B/s floor, but while the site's other \
             blocks are freed its live blocks rose by {steady_growth_allocations} and never \
             fell by more than the {IN_FLIGHT_BLOCKS} a checkpoint may catch in flight: some \
             of its blocks are never freed (an error path?), slow, not noise"
        ));
    }
    if win.late_idle {
        reason.push_str(
            "; the process made no allocation or free in the last quarter of the run, so \
             whether the growth would have levelled off (a cache) is unknown",
        );
    }
    Verdict { class: SiteClass::Leak, confidence, reason }
}

/// Leak: repeated bursts of never-freed blocks, the last in the steady window.
fn stepwise_leak(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let f_steps = (0.25 * f.steps.len() as f64).min(1.0);
    let confidence = clamp_conf(f_steps * f.f_share * ctx.f_drops);
    let reason = format!(
        "live blocks rose in {} separate steps (flat in between), none ever freed, the last \
         in the steady window: {} retained in all, a leak in bursts",
        f.steps.len(),
        crate::human::bytes(f.growth_bytes.max(0) as u64)
    );
    Verdict { class: SiteClass::Leak, confidence, reason }
}

impl Facts<'_> {
    /// A leak judged by its envelope: stairs that only go up, where neither the least-squares
    /// slope (a leak) nor steps of never-freed blocks (a leak in bursts) decided (the order of
    /// [`classify`]).
    fn envelope_leak(&self) -> bool {
        self.envelope.is_some()
            && !self.too_short
            && !(self.grows && self.count_ok && !self.plateau)
            && !(self.stepwise && self.growth_bytes as f64 > self.floor_bytes)
    }
}

/// Leak: live bytes rising in stairs that only go up, each step above the last high-water mark;
/// the rate is the envelope's (the line through the steps' high-water marks).
fn envelope_leak(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let Some(e) = f.envelope else { return flat(f, ctx) };
    let f_steps = (0.25 * e.steps as f64).min(1.0);
    let confidence = clamp_conf(f_steps * f.f_share * ctx.f_drops);
    let blocks = if f.count_grew {
        format!("live blocks grew by {}", f.steady_growth_allocations)
    } else {
        format!("the same {} live block(s) enlarged (realloc), never shrunk", f.count_end)
    };
    let reason = format!(
        "live bytes rose in {} steps, flat in between, each above the last high-water mark and \
         never falling, the last in the steady window; {blocks}: growth by its envelope at {:.1} \
         B/s (a least-squares slope through the steps reads {:.1} B/s ± {:.1}), a leak in steps",
        e.steps,
        e.rate,
        f.steady.slope_bytes_per_s,
        f.steady.ci95_bytes_per_s.unwrap_or(0.0),
    );
    Verdict { class: SiteClass::Leak, confidence, reason }
}

/// Temporary: short-lived blocks, allocated many times the peak and freed, no growth.
fn churn_temporary(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let floor = f.floor;
    let to = f.turnover.unwrap_or(TEMPORARY_TURNOVER);
    let f_turn = 1.0 - 2.0 / to;
    let f_flat = 1.0 - 0.5 * (f.steady.slope_bytes_per_s.abs() / floor).min(1.0);
    let confidence = clamp_conf(f_turn * f_flat * f.f_n * ctx.f_drops);
    let churn = if f.peak == 0 {
        "every block was freed before the next checkpoint".to_string()
    } else {
        format!("allocated {to:.1}× its peak live bytes and freed them")
    };
    let reason = format!(
        "{churn}: short-lived blocks; live bytes do not grow beyond noise ({:.1} B/s, floor \
         {:.1} B/s)",
        f.steady.slope_bytes_per_s, floor
    );
    Verdict { class: SiteClass::Temporary, confidence, reason }
}

/// Cache: growth that levelled off, rose then stayed flat, or fewer larger blocks.
fn cache(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let (steady, floor, grows, count_ok, plateau) = (&f.steady, f.floor, f.grows, f.count_ok, f.plateau);
    let retained = (f.growth_bytes.max(0) as f64).max(f.rise).max(1.0);
    let f_rise = (1.0 - 0.5 * f.floor_bytes / retained).clamp(0.0, 1.0);
    let steady_span = (steady.to_s - steady.from_s).max(0.0);
    let f_flat = if plateau || (grows && !count_ok) {
        0.5
    } else {
        1.0 - (steady.slope_bytes_per_s.max(0.0) * steady_span / retained).min(1.0) * 0.8
    };
    let confidence = if f.single_step {
        clamp_conf((f_rise * f_flat * f.f_n * f.f_share * ctx.f_drops).min(SINGLE_STEP_CONFIDENCE))
    } else {
        clamp_conf(f_rise * f_flat * f.f_n * f.f_share * ctx.f_drops)
    };
    let reason = if f.single_step {
        format!(
            "inconclusive: live blocks rose in one step ({} at once), none ever freed, then \
             stayed flat; one step is not a plateau (a leak in bursts looks the same): record \
             at least two periods",
            crate::human::bytes(f.growth_bytes.max(0) as u64)
        )
    } else if grows && !count_ok {
        format!(
            "live bytes grow {:.1} B/s while the number of live blocks falls by {}: fewer, \
             larger blocks; check that the size is bounded",
            steady.slope_bytes_per_s, -f.steady_growth_allocations
        )
    } else if f.evicting_cache && f.turnover.is_some_and(|t| t >= TEMPORARY_TURNOVER) {
        format!(
            "live bytes rose by {} and stayed there while the site kept evicting: {:.0} blocks \
             live for about {:.1} s each (longer than a checkpoint interval) and turned over \
             {:.1}×: a bounded cache with eviction",
            crate::human::bytes(f.rise.max(0.0) as u64),
            f.mean_blocks,
            f.lifetime_s.unwrap_or(0.0),
            f.turnover.unwrap_or(0.0)
        )
    } else if let Some(t) = f.replaced_after.filter(|_| plateau) {
        format!(
            "live bytes grew ({:.1} B/s over the steady window) to {} at {t:.1} s and have not \
             risen since, while the blocks live then were freed: every block live at the end was \
             allocated after that rise. A set of bounded size, replaced, not one that keeps its \
             blocks: levelled off",
            steady.slope_bytes_per_s,
            crate::human::bytes(f.last_live)
        )
    } else if plateau {
        format!(
            "live bytes grew ({:.1} B/s over the steady window) but stopped in the last \
             quarter ({:.1} B/s): levelled off",
            steady.slope_bytes_per_s,
            f.late.map_or(0.0, |l| l.slope_bytes_per_s)
        )
    } else {
        format!(
            "live bytes rose by {} ({:.0} B), then stayed flat over the steady window ({:.1} \
             B/s: below the noise floor of {:.1} B/s or not significant)",
            crate::human::bytes(f.rise.max(0.0) as u64),
            f.rise,
            steady.slope_bytes_per_s,
            floor
        )
    };
    Verdict { class: SiteClass::Cache, confidence, reason }
}

/// Flat: no growth beyond noise.
fn flat(f: &Facts<'_>, ctx: &SiteContext<'_>) -> Verdict {
    let f_flat = 1.0 - 0.5 * (f.steady.slope_bytes_per_s.abs() / f.floor).min(1.0);
    let confidence = clamp_conf(f_flat * f.f_n * ctx.f_drops);
    let reason = format!(
        "no growth beyond noise ({:.1} B/s over the steady window, floor {:.1} B/s)",
        f.steady.slope_bytes_per_s, f.floor
    );
    Verdict { class: SiteClass::Flat, confidence, reason }
}

/// Marks a non-leak site whose growth is not significant (`wide`): returns the verdict and the flag.
fn mark_not_significant(f: &Facts<'_>, v: Verdict) -> (Verdict, bool) {
    let Verdict { class, confidence, mut reason } = v;
    let not_significant = f.wide && class != SiteClass::Leak;
    if not_significant {
        let numbers = format!(
            "live bytes grew {:.1} B/s in the first part, then {:.1} B/s ± {:.1} over the steady window \
             (95 %, {} checkpoints): not significant, the interval is as wide as the slope, and no leak \
             verdict rests on it",
            f.early.map_or(0.0, |e| e.slope_bytes_per_s),
            f.steady.slope_bytes_per_s,
            f.steady.ci95_bytes_per_s.unwrap_or(f64::INFINITY),
            f.steady.n
        );
        // "No growth beyond noise" would hide the growth: the site is inconclusive.
        reason = if class == SiteClass::Flat {
            format!("inconclusive: {numbers}; record longer or under steadier load")
        } else {
            format!("{reason}; its {numbers}")
        };
    }
    (Verdict { class, confidence, reason }, not_significant)
}

/// Turns a leak whose growth is garbage between a collector's collections into a temporary.
fn judge_collected(f: &Facts<'_>, ctx: &SiteContext<'_>, memory_kind: MemoryKind, v: Verdict) -> Verdict {
    // Memory a collector frees in bulk, judged on what each collection left: the last tooth of
    // a sawtooth is garbage the next collection frees, not growth (collected.rs).
    if v.class == SiteClass::Leak
        && let Some(c) = collected::garbage_between_collections(
            memory_kind,
            ctx.times,
            f.live,
            f.span_start..ctx.win.steady.end,
            f.floor,
        )
    {
        return Verdict {
            class: SiteClass::Temporary,
            confidence: clamp_conf(f.f_n * ctx.f_drops * (1.0 - 1.0 / c.falls as f64)),
            reason: collected_reason(&c, f.last_live, f.steady.slope_bytes_per_s),
        };
    }
    v
}

/// Turns a leak in a runtime's own or managed memory that is the runtime's warm-up into a cache.
fn judge_warm_up(
    f: &Facts<'_>,
    ctx: &SiteContext<'_>,
    memory_kind: MemoryKind,
    lookalike: Option<&patterns::Lookalike>,
    v: Verdict,
) -> Verdict {
    if v.class == SiteClass::Leak
        && matches!(memory_kind, MemoryKind::Runtime | MemoryKind::Managed)
        && let Some(l) = lookalike.filter(|l| l.warm_up)
    {
        return Verdict {
            class: SiteClass::Cache,
            confidence: clamp_conf(0.5 * f.f_n * ctx.f_drops),
            reason: format!(
                "runtime warm-up: {} ({}); grew {:.1} B/s over the steady window, not counted as a leak \
                 (record after the runtime has warmed up to see whether it levels off)",
                l.name, l.why, f.steady.slope_bytes_per_s
            ),
        };
    }
    v
}

/// The threads of a thread-memory site, and its verdict judged as threads' memory.
fn judge_threads(
    f: &Facts<'_>,
    st: &Stack,
    ser: &Series<'_>,
    ctx: &SiteContext<'_>,
    v: Verdict,
) -> (Option<ThreadStacks>, Verdict) {
    let Verdict { mut class, mut confidence, mut reason } = v;
    // Threads' memory (thread stacks judged by their resident bytes): a bounded number of
    // threads is no leak however their stacks fill; threads that keep being created and never
    // joined are one, named as such.
    let threads = ser.threads.then(|| {
        let late_start = ctx.win.late.as_ref().map(|l| l.start);
        let growing = f.steady_growth_allocations >= MIN_EVIDENT_BLOCKS
            && late_start.is_none_or(|ls| f.count_end > f.count.get(ls).copied().unwrap_or(0));
        ThreadStacks { threads: f.count_end, new_threads: f.steady_growth_allocations, growing }
    });
    if let Some(t) = threads {
        let what = if st.kind == StackKind::Mmap {
            "thread stacks (judged by their resident bytes)"
        } else {
            "per-thread memory that pthread_create allocates"
        };
        if class == SiteClass::Leak && !t.growing {
            class = SiteClass::Cache;
            confidence = clamp_conf(confidence.min(0.5));
            reason = format!(
                "{what} of a bounded number of threads ({} live at the end, {:+} over the steady \
                 window, not growing through its end): a thread's stack is bounded by its size, so \
                 they are no leak unless threads keep being created and never joined; {reason}",
                t.threads, t.new_threads
            );
        } else if class == SiteClass::Leak {
            reason = format!(
                "{what}: {} threads not joined ({:+} over the steady window and still growing: \
                 threads created through pthread_create that never end or are never joined); {reason}",
                t.threads, t.new_threads
            );
        }
    }
    (threads, Verdict { class, confidence, reason })
}

/// The ages of a site's live blocks over the steady window, from the kernel's birth times
/// ([`Series::live_born_ms`]).
#[derive(Clone, Copy, Debug, Default)]
struct BlockAges {
    /// Mean age of the live blocks at the steady window's last checkpoint, seconds.
    mean_age_s: f64,
    /// The largest mean age at a checkpoint of the later half of the steady window, seconds.
    max_mean_age_s: f64,
    /// Live blocks at the window's last checkpoint, and how many more than at its start.
    live_blocks: u64,
    new_blocks: i64,
    /// The growth is made of young blocks: live blocks grew over the window, at every
    /// checkpoint of its later half their mean age is below one checkpoint interval, and at
    /// its end their ages sum to less than [`YOUNG_AGE_SHARE`] of what the new blocks alone
    /// would hold had they been kept since they came (new blocks × window / 2: one leaked at
    /// an even pace through the window).
    young: bool,
}

impl BlockAges {
    fn of(ser: &Series<'_>, times: &[f64], win: &Windows, interval: f64) -> Option<BlockAges> {
        let born = ser.live_born_ms?;
        let count = ser.live_count;
        let w = win.steady.clone();
        let end = w.end.checked_sub(1)?;
        let (&n_end, &n_start) = (count.get(end)?, count.get(w.start)?);
        // Sum of the live blocks' ages at checkpoint k, seconds.
        let age_sum = |k: usize| -> Option<f64> {
            Some((count[k] as f64 * times.get(k)? * 1000.0 - *born.get(k)? as f64).max(0.0) / 1000.0)
        };
        let mean = |k: usize| -> Option<f64> { Some(if count[k] == 0 { 0.0 } else { age_sum(k)? / count[k] as f64 }) };
        let later = (w.start + w.len() / 2)..w.end;
        let max_mean_age_s = later.clone().map(mean).try_fold(0.0f64, |m, a| a.map(|a| m.max(a)))?;
        let new_blocks = n_end as i64 - n_start as i64;
        let span = times.get(end)? - times.get(w.start)?;
        let young = w.len() >= MIN_WINDOW_POINTS
            && interval > 0.0
            && new_blocks > 0
            && max_mean_age_s < interval
            && age_sum(end)? < YOUNG_AGE_SHARE * new_blocks as f64 * span / 2.0;
        Some(BlockAges { mean_age_s: mean(end)?, max_mean_age_s, live_blocks: n_end, new_blocks, young })
    }
}

/// The reason of a site whose growth is garbage between collections ([`collected`]).
fn collected_reason(c: &collected::Collected, last_live: u64, slope: f64) -> String {
    format!(
        "freed by the runtime's collections: its live bytes fell at {} checkpoints and right after \
         each fall were {}–{} ({:+.1} B/s: no growth); the {:.1} B/s over the steady window is \
         garbage made since the last collection ({} live at the end), which the next one frees: \
         temporary",
        c.falls,
        crate::human::bytes(c.after_min),
        crate::human::bytes(c.after_max),
        c.slope_bytes_per_s,
        slope,
        crate::human::bytes(last_live),
    )
}
