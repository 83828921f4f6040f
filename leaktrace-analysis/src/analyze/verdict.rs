//! The process verdict: its class, confidence and the sentence that names the culprit; losses
//! and runtimes adjust it.

use std::collections::BTreeMap;

use leaktrace_common::counter;

use super::*;
use crate::recording::{Runtime, Stack, StackKind};
use crate::runtimes::MemoryKind;

pub(super) struct ProcessInput<'a> {
    pub(super) sites: &'a [SiteAnalysis],
    pub(super) n: usize,
    pub(super) win: &'a Windows,
    pub(super) duration: f64,
    pub(super) native_trend: &'a Trend,
    pub(super) traced_trend: &'a Trend,
    pub(super) rss_anon_trend: Option<&'a Trend>,
    pub(super) rss_anon: &'a [(f64, u64)],
    pub(super) allocator_trend: Option<&'a Trend>,
    pub(super) allocator: &'a [(f64, u64)],
    pub(super) f_drops: f64,
    /// What one unit of work is ("call of handle_message"), None without a work probe.
    pub(super) unit: Option<&'a str>,
}

/// Off-heap program memory: an anonymous mapping that is neither the allocator's, the loader's
/// nor a runtime's ([`crate::runtimes::classify_site`]).
pub(super) fn is_offheap_mapping(s: &SiteAnalysis) -> bool {
    s.kind == StackKind::Mmap && matches!(s.memory_kind, MemoryKind::OffHeap | MemoryKind::Native)
}

/// Share of traced allocator calls whose bytes were lost (0..1), from the loss counters that
/// leave live bytes incomplete ([`counter::byte_losses`]; the others lose call stacks, never
/// bytes).
pub fn lost_share(drops: &BTreeMap<String, u64>, events: &BTreeMap<String, u64>) -> f64 {
    let lost: u64 = counter::byte_losses().filter_map(|c| drops.get(c.name)).sum();
    let seen = events.get("allocs").copied().unwrap_or(0) + lost;
    if seen == 0 { 0.0 } else { lost as f64 / seen as f64 }
}

/// When more than 1 % of the allocations were lost (a full map), what looks flat or like
/// fragmentation may be untraced memory: such a verdict becomes "inconclusive", and a leak found
/// anyway is said to be a lower bound. The losses are named on the verdict line.
pub(super) fn losses_verdict(v: Verdict, drops: &BTreeMap<String, u64>, events: &BTreeMap<String, u64>) -> Verdict {
    let share = lost_share(drops, events);
    if share <= 0.01 {
        return v;
    }
    let named: Vec<String> = counter::byte_losses()
        .filter_map(|c| drops.get(c.name).filter(|n| **n > 0).map(|n| format!("{} {n}", c.name)))
        .collect();
    let why = format!(
        "{:.0} % of allocator calls were not traced ({}; raise --max-allocs / --max-sites)",
        share * 100.0,
        named.join(", ")
    );
    match v.class {
        ProcessClass::Leak | ProcessClass::OffHeap => Verdict {
            summary: format!("{}; {why}: the growth is a lower bound", v.summary),
            confidence: clamp_conf(v.confidence * (1.0 - share)),
            ..v
        },
        _ => Verdict {
            class: ProcessClass::Flat,
            confidence: clamp_conf(0.1 * (1.0 - share)),
            summary: format!("inconclusive: {why}; without them: {}", v.summary),
            inconclusive: true,
        },
    }
}

/// How a leaking site grows, for the verdict: per unit of work first when measured, then per
/// second, over the steady `window`; what it holds at the end (mapped and resident bytes for a
/// mapping).
pub(super) fn leak_phrase(s: &SiteAnalysis, unit: Option<&str>, window: &str) -> String {
    use crate::human::{bytes as hb, rate as hr};
    let per_s = format!(
        "{} ({:.0} B/s ± {:.0} at 95 %)",
        hr(s.growth_bytes_per_s),
        s.growth_bytes_per_s,
        s.growth_ci95_bytes_per_s.unwrap_or(0.0)
    );
    let map = s.kind == StackKind::Mmap;
    let growth = match (s.growth_bytes_per_unit, unit, map) {
        (Some(u), Some(unit), false) => format!(
            "{} holds {u:.0} B more live bytes per {unit} (± {:.0} at 95 %), {per_s} over the \
             steady window ({window})",
            s.function,
            s.growth_ci95_bytes_per_unit.unwrap_or(0.0)
        ),
        (Some(u), Some(unit), true) => format!(
            "{} maps {u:.0} B per {unit} (± {:.0} at 95 %) in anonymous mappings it never unmaps, \
             {per_s} over the steady window ({window})",
            s.function,
            s.growth_ci95_bytes_per_unit.unwrap_or(0.0)
        ),
        (_, _, false) => format!("{} holds {per_s} more live bytes over the steady window ({window})", s.function),
        (_, _, true) => format!(
            "{} maps {per_s} more in anonymous mappings it never unmaps over the steady window \
             ({window})",
            s.function
        ),
    };
    let held = match (map, s.resident_bytes) {
        (true, Some(r)) => format!("{} ({} B) mapped, {} resident at the end", hb(s.live_bytes), s.live_bytes, hb(r)),
        (true, None) => format!("{} ({} B) mapped at the end", hb(s.live_bytes), s.live_bytes),
        _ => format!("{} ({} B) live at the end", hb(s.live_bytes), s.live_bytes),
    };
    format!("{growth}; {held}")
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

pub(super) fn process_verdict(p: &ProcessInput<'_>) -> Verdict {
    use crate::human::{bytes as hb, rate as hr};
    let f_n = f_points(p.native_trend.n);
    let window = format!("{:.0}–{:.0} s", p.native_trend.from_s, p.native_trend.to_s);

    // Leak: the fastest-growing leaking site names the culprit. Off-heap mappings and malloc-heap
    // sites are told apart; the class is the one that grows faster in all, the other is named too.
    let mut leaks: Vec<&SiteAnalysis> = p.sites.iter().filter(|s| s.class == SiteClass::Leak).collect();
    leaks.sort_by(|a, b| b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s));
    if !leaks.is_empty() {
        let (maps, heap): (Vec<&SiteAnalysis>, Vec<&SiteAnalysis>) = leaks.iter().partition(|s| is_offheap_mapping(s));
        let sum = |v: &[&SiteAnalysis]| v.iter().map(|s| s.growth_bytes_per_s).sum::<f64>();
        let offheap = sum(&maps) > sum(&heap);
        let (first, second) = if offheap { (&maps, &heap) } else { (&heap, &maps) };
        let top = first[0];
        let (class, name, other) = if offheap {
            (ProcessClass::OffHeap, "off-heap", "a leak in the malloc heap")
        } else {
            (ProcessClass::Leak, "leak", "an off-heap leak")
        };
        let mut summary = format!("{name}: {}", leak_phrase(top, p.unit, &window));
        if first.len() > 1 {
            summary.push_str(&format!(
                "; {} leaking {}sites in all, {} in total",
                first.len(),
                if offheap { "mapping " } else { "" },
                hr(sum(first))
            ));
        }
        if let Some(o) = second.first() {
            summary.push_str(&format!("; also {other}: {}", leak_phrase(o, p.unit, &window)));
            if second.len() > 1 {
                summary.push_str(&format!(" ({} sites, {} in total)", second.len(), hr(sum(second))));
            }
        }
        return Verdict { class, confidence: top.confidence, summary, inconclusive: false };
    }

    let share = if p.win.whole_run { 0.6 } else { 1.0 };
    // `grows` grows significantly above its floor while `live` grows slower than a quarter of
    // it. Flat means slow compared with `grows`, whatever its significance: a noisy live slope
    // close to it is not evidence of fragmentation.
    let outgrows = |grows: &Trend, floor: f64, live: &Trend| {
        grows.n >= MIN_WINDOW_POINTS
            && grows.significant_growth
            && grows.slope_bytes_per_s > floor
            && live.slope_bytes_per_s < FRAGMENTATION_RATIO * grows.slope_bytes_per_s
    };
    let gap = |grows: &Trend, live: &Trend| 1.0 - (live.slope_bytes_per_s.max(0.0) / grows.slope_bytes_per_s).min(1.0);

    // Fragmentation, measured: the allocator's own resident memory (brk heap and arenas) grows,
    // live malloc bytes do not.
    let alloc_grows =
        p.allocator_trend.filter(|at| outgrows(at, process_floor(p.allocator, p.duration), p.native_trend));
    if let Some(at) = alloc_grows {
        let confidence = clamp_conf(f_tstat(at) * f_points(at.n) * gap(at, p.native_trend) * share * p.f_drops);
        let summary = format!(
            "fragmentation: the allocator's resident memory (heap and arenas) grows {} ({:.0} B/s \
             ± {:.0}) over the steady window while live native bytes stay flat ({:.0} B/s): freed \
             memory is kept by the allocator (fragmentation or retention), not leaked",
            hr(at.slope_bytes_per_s),
            at.slope_bytes_per_s,
            at.ci95_bytes_per_s.unwrap_or(0.0),
            p.native_trend.slope_bytes_per_s
        );
        return Verdict { class: ProcessClass::Fragmentation, confidence, summary, inconclusive: false };
    }

    // Fragmentation, inferred: RSS-anon grows significantly, traced live bytes do not.
    let rss_grows = p.rss_anon_trend.filter(|rt| outgrows(rt, process_floor(p.rss_anon, p.duration), p.traced_trend));
    if let Some(rt) = rss_grows {
        // With the allocator's footprint measured (and not growing), the growth is not the
        // malloc heap's.
        let heap_flat = p.allocator_trend.is_some_and(|t| t.n >= MIN_WINDOW_POINTS);
        let cause = if heap_flat {
            "the malloc heap's own footprint does not grow, so the memory comes from elsewhere \
             (an allocator that is not traced, thread stacks, mappings made before attach)"
        } else {
            "the allocator holds freed memory (fragmentation) or memory comes from an allocator \
             that is not traced"
        };
        let f_heap = if heap_flat { 0.7 } else { 1.0 };
        let confidence =
            clamp_conf((f_tstat(rt) * f_points(rt.n) * gap(rt, p.traced_trend) * share * p.f_drops * f_heap).min(0.8));
        let summary = format!(
            "fragmentation: RSS (anon) grows {} ({:.0} B/s ± {:.0}) over the steady window while \
             traced live bytes stay flat ({:.0} B/s): {cause} — not a leak of traced allocations",
            hr(rt.slope_bytes_per_s),
            rt.slope_bytes_per_s,
            rt.ci95_bytes_per_s.unwrap_or(0.0),
            p.traced_trend.slope_bytes_per_s
        );
        return Verdict { class: ProcessClass::Fragmentation, confidence, summary, inconclusive: false };
    }

    if p.n < MIN_WINDOW_POINTS {
        return Verdict {
            class: ProcessClass::Flat,
            confidence: clamp_conf(0.1 * p.f_drops),
            inconclusive: true,
            summary: format!("inconclusive: only {} checkpoint(s), growth cannot be measured; no leak found", p.n),
        };
    }

    // Cache: the largest retained growth among caches names it.
    let mut caches: Vec<&SiteAnalysis> = p.sites.iter().filter(|s| s.class == SiteClass::Cache).collect();
    caches.sort_by_key(|s| std::cmp::Reverse(s.growth_bytes));
    let native_flat_factor = if p.native_trend.significant_growth { 0.7 } else { 1.0 };
    if let Some(top) = caches.first() {
        let total: i64 = caches.iter().map(|s| s.growth_bytes.max(0)).sum();
        let summary = format!(
            "no leak: memory rose and levelled off (cache-like retention); largest: {} holds {} \
             (+{} since the first checkpoint, {:.0} B/s over the steady window); {} cache site(s) \
             retain {} in all",
            top.function,
            hb(top.live_bytes),
            hb(top.growth_bytes.max(0) as u64),
            top.growth_bytes_per_s,
            caches.len(),
            hb(total as u64)
        );
        return Verdict {
            class: ProcessClass::Cache,
            confidence: clamp_conf(top.confidence * native_flat_factor),
            summary,
            inconclusive: false,
        };
    }

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
        let churn: u64 = temps.iter().map(|s| s.freed_bytes).sum();
        let allocs: u64 = temps.iter().map(|s| s.frees).sum();
        return Verdict {
            class: ProcessClass::Temporary,
            confidence: clamp_conf(f_flat * f_n * p.f_drops),
            inconclusive: false,
            summary: format!(
                "no leak: allocations are short-lived — {} site(s) allocated and freed {} in {} \
                 blocks; live native bytes stay flat ({:.0} B/s)",
                temps.len(),
                hb(churn),
                allocs,
                p.native_trend.slope_bytes_per_s
            ),
        };
    }
    Verdict {
        class: ProcessClass::Flat,
        confidence: clamp_conf(f_flat * f_n * p.f_drops),
        inconclusive: false,
        summary: format!(
            "no leak: no allocation site grows beyond noise (live native bytes {:.0} B/s over the \
             steady window)",
            p.native_trend.slope_bytes_per_s
        ),
    }
}

/// Where to look for what holds a growing managed heap (leaktrace sees the runtime's allocator,
/// not the code that keeps the objects reachable).
pub(super) fn heap_tool(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Python => "tracemalloc or a heap dump (objgraph, guppy) shows which objects",
        Runtime::Jvm => "a class histogram (jcmd PID GC.class_histogram) or a heap dump shows which objects",
        Runtime::Go => "the heap profile (pprof) shows which allocations",
        Runtime::Node => "a heap snapshot (--heapsnapshot-signal or the inspector) shows which objects",
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
    use crate::human::{bytes as hb, rate as hr};
    let Some(rt) = runtime else { return v };
    let heap = crate::runtimes::heap_name(rt);
    let label = |k: MemoryKind| if k == MemoryKind::Managed { heap.to_string() } else { k.as_str().to_string() };
    let state = |g: &KindGrowth| {
        if g.grows {
            format!("{} grows {}", label(g.kind), hr(g.trend.slope_bytes_per_s))
        } else {
            format!("{} flat ({})", label(g.kind), hr(g.trend.slope_bytes_per_s))
        }
    };
    let others = |except: MemoryKind| -> String {
        kinds
            .iter()
            .filter(|g| g.kind != except && (g.kind != MemoryKind::Runtime || g.grows))
            .map(state)
            .collect::<Vec<_>>()
            .join(", ")
    };
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
    let mut rates: Vec<(MemoryKind, f64)> = Vec::new();
    for s in sites.iter().filter(|s| s.class == SiteClass::Leak) {
        match rates.iter_mut().find(|(k, _)| *k == s.memory_kind) {
            Some((_, r)) => *r += s.growth_bytes_per_s,
            None => rates.push((s.memory_kind, s.growth_bytes_per_s)),
        }
    }
    rates.sort_by(|a, b| b.1.total_cmp(&a.1));
    let leak_kind = match growing.iter().find(|g| g.kind == MemoryKind::Managed || has_leak_site(g.kind)) {
        Some(g) => Some(g.kind),
        None => rates.first().map(|(k, _)| *k),
    };
    match leak_kind {
        Some(MemoryKind::Managed) => {
            let Some(m) = managed else { return v };
            let site_conf = sites
                .iter()
                .filter(|s| s.class == SiteClass::Leak && s.memory_kind == MemoryKind::Managed)
                .map(|s| s.confidence)
                .fold(0.0f64, f64::max);
            let gauge_conf = if m.grows { f_tstat(&m.trend) * f_points(m.trend.n) * f_drops } else { 0.0 };
            let source = if m.source == "sites" { String::new() } else { format!(", {}", m.source) };
            Verdict {
                class: ProcessClass::Leak,
                confidence: clamp_conf(site_conf.max(gauge_conf)),
                inconclusive: false,
                summary: format!(
                    "managed leak: the {heap} grows {} ({:.0} B/s ± {:.0} at 95 %{source}) over the \
                     steady window to {}; {}. leaktrace sees the runtime's allocator, not the code \
                     that keeps the objects: {}",
                    hr(m.trend.slope_bytes_per_s),
                    m.trend.slope_bytes_per_s,
                    m.trend.ci95_bytes_per_s.unwrap_or(0.0),
                    hb(m.end_bytes),
                    others(MemoryKind::Managed),
                    heap_tool(rt)
                ),
            }
        }
        Some(k) => {
            let mut of_kind: Vec<&SiteAnalysis> =
                sites.iter().filter(|s| s.class == SiteClass::Leak && s.memory_kind == k).collect();
            of_kind.sort_by(|a, b| b.growth_bytes_per_s.total_cmp(&a.growth_bytes_per_s));
            let Some(top) = of_kind.first() else { return v };
            let stack = Stack { id: top.id, kind: top.kind, frames: top.frames.clone(), lost: top.stack_lost };
            let name = crate::runtimes::site_label(Some(rt), k, &stack).unwrap_or_else(|| top.function.clone());
            let mut summary = format!(
                "{k} leak in {} ({}), {}: {} holds {} more live bytes ({:.0} B/s ± {:.0} at 95 %) \
                 over the steady window; {} ({} B) live at the end",
                name,
                crate::runtimes::kind_origin(rt, k),
                others(k),
                top.function,
                hr(top.growth_bytes_per_s),
                top.growth_bytes_per_s,
                top.growth_ci95_bytes_per_s.unwrap_or(0.0),
                hb(top.live_bytes),
                top.live_bytes
            );
            if of_kind.len() > 1 {
                summary.push_str(&format!("; {} leaking {k} sites in all", of_kind.len()));
            }
            // Off-heap mappings that leak keep their class (the runtime split names the kind).
            let class = if k == MemoryKind::OffHeap && v.class == ProcessClass::OffHeap {
                ProcessClass::OffHeap
            } else {
                ProcessClass::Leak
            };
            Verdict { class, confidence: top.confidence, summary, inconclusive: false }
        }
        None => {
            let all = kinds
                .iter()
                .filter(|g| g.kind != MemoryKind::Runtime || g.grows)
                .map(state)
                .collect::<Vec<_>>()
                .join(", ");
            Verdict { summary: format!("{}; by kind: {all}", v.summary), ..v }
        }
    }
}
