//! A managed heap judged on its collections, from the runtime's own counters:
//! what each collection left (the JVM's hsperfdata: used bytes of the survivor and old spaces,
//! which change only when a collection runs; Go: the bytes its last collection marked live,
//! `gcController.heapMarked`), how many collections ran (the collectors' invocation counts; Go's
//! `memstats.numgc`) and when the last one ended (the JVM's `lastExitTime`; Go's
//! `memstats.last_gc_unix`). V8's (Node) come from uprobes on its collector: the old
//! generation's size of objects after each mark-compact, the mark-compacts counted, each placed
//! at the time it ran.
//!
//! Between two collections a heap's used bytes climb with the garbage the program makes; a line
//! through them measures the allocation rate, not a leak. What survives each collection is the
//! signal: one point per collection, placed at the time it ran. With [`MIN_WINDOW_POINTS`]
//! collections in the steady window the trend is fitted there; with fewer, on the collections of
//! the whole analysed span, and two are enough when each left more than the one before (the
//! rate is then the line through them). With fewer than two nothing can be told: the trend is
//! unknown, never flat nor a leak, and the verdict says how many ran and how long to record.

use serde::Serialize;

use super::stats::fit;
use super::{KindGrowth, MIN_WINDOW_POINTS, Trend};
use crate::recording::{ManagedHeap, Recording, Runtime};

/// Collections needed in the steady window for a trend fitted there alone.
pub const COLLECTIONS_FOR_A_TREND: usize = MIN_WINDOW_POINTS;

/// Collections needed in the analysed span for a trend at all: two, each leaving more than the
/// one before, are a growth with a rate.
pub const COLLECTIONS_AT_LEAST: usize = 2;

/// Share of the analysed span that fewer than [`COLLECTIONS_FOR_A_TREND`] collections must span
/// for a trend.
pub const MIN_SPREAD: f64 = 0.25;

/// Bytes of the heap that survived its last collection: used − the eden spaces (young objects
/// allocated since; the survivor and old spaces change only at a collection). None when the
/// runtime does not split its heap so (no space named `*.eden`).
pub fn after_collection_bytes(m: &ManagedHeap) -> Option<u64> {
    let eden: Vec<u64> = m.spaces.iter().filter(|(k, _)| k.ends_with(".eden")).map(|(_, v)| *v).collect();
    (!eden.is_empty()).then(|| m.used_bytes.saturating_sub(eden.iter().sum()))
}

/// The space of a runtime's figures holding the bytes its last collection marked live (Go's
/// `gcController.heapMarked`).
pub const MARKED_BY_LAST_GC: &str = "marked_by_last_gc";

/// The managed kind's `source` when it is judged on [`MARKED_BY_LAST_GC`] (Go).
pub const MARKED_SOURCE: &str = "gc-marked";

/// Bytes the last collection left, as the runtime says it: what it marked live when the runtime
/// gives that ([`MARKED_BY_LAST_GC`], Go), else [`after_collection_bytes`] (the JVM). None when
/// the runtime gives neither.
pub fn left_by_collection(m: &ManagedHeap) -> Option<u64> {
    m.spaces.get(MARKED_BY_LAST_GC).copied().or_else(|| after_collection_bytes(m))
}

/// One checkpoint of a heap judged on its collections ([`collection_series`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AfterCollection {
    /// The checkpoint, seconds.
    pub t_s: f64,
    /// Bytes left by the last collection.
    pub bytes: u64,
    /// Collections so far.
    pub collections: u64,
    /// When the last collection ended, seconds (the checkpoint's time when the runtime does not
    /// say).
    pub collected_at_s: f64,
}

/// The runtime's after-collection figure ([`left_by_collection`]) and collection count at the
/// checkpoints that have both, in time order; figures read for the occupied heap only (Go's)
/// count too. Empty when the runtime does not give them.
pub(super) fn collection_series(rec: &Recording) -> Vec<AfterCollection> {
    let mut v: Vec<AfterCollection> = rec
        .checkpoints
        .iter()
        .filter(|c| c.t_s.is_finite())
        .filter_map(|c| {
            let m = c.managed.as_ref()?;
            let t_s = (c.t_s * 1e9).round() / 1e9;
            let ago = m.last_collection_ago_s.filter(|a| a.is_finite() && *a >= 0.0).unwrap_or(0.0);
            Some(AfterCollection {
                t_s,
                bytes: left_by_collection(m)?,
                collections: m.collections?,
                collected_at_s: t_s - ago,
            })
        })
        .collect();
    v.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    v
}

/// How a managed heap was judged on its collections ([`on_collections`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OnCollections {
    /// Collections the runtime ran in the steady window and in the whole analysed span.
    pub in_window: u64,
    pub in_span: u64,
    /// The analysed span, seconds.
    pub span_s: f64,
    /// Collections counted over the whole recording (its first to its last checkpoint), and its
    /// duration, seconds: what an unknown trend's verdict says.
    pub in_recording: u64,
    pub recorded_s: f64,
    /// The trend was fitted on the collections of the whole span: the window had fewer than
    /// [`COLLECTIONS_FOR_A_TREND`].
    pub widened: bool,
    /// Every collection fitted left more than the one before (a rise, however few they are).
    pub rising: bool,
    /// Least-squares fit of the bytes after each collection against the time it ran; None:
    /// unknown (fewer than [`COLLECTIONS_AT_LEAST`] collections in the span).
    pub trend: Option<Trend>,
    /// How long to record for a trend, seconds, at least: the time [`COLLECTIONS_AT_LEAST`]
    /// collections take at the pace seen over the recording, and at least the recording; None
    /// when no collection was seen at all (the pace is unknown).
    pub record_for_s: Option<f64>,
}

/// Judge the heap of `series` ([`collection_series`]) on its collections between `span_from` and
/// `span_to` (seconds, the recording's times), the steady window starting at `steady_from`.
/// None when the series has fewer than 2 points in the span.
pub(super) fn on_collections(
    series: &[AfterCollection],
    span_from: f64,
    steady_from: f64,
    span_to: f64,
) -> Option<OnCollections> {
    let span: Vec<&AfterCollection> =
        series.iter().filter(|p| p.t_s >= span_from - 1e-9 && p.t_s <= span_to + 1e-9).collect();
    if span.len() < 2 {
        return None;
    }
    // One point per checkpoint that counted new collections: the bytes they left, at the time
    // the last of them ended (after the checkpoint before, which had not counted it). The bytes
    // are read at the last checkpoint that still counts as many collections: they change only at
    // a collection, and a checkpoint that read the runtime while one ran has its count already
    // raised but its spaces not yet (HotSpot raises a collector's invocations when the
    // collection starts: its survivor and old spaces still held the previous figure).
    let events: Vec<(f64, f64)> = span
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1].collections > w[0].collections)
        .map(|(i, w)| {
            let settled =
                span[i + 1..].iter().take_while(|p| p.collections == w[1].collections).last().unwrap_or(&w[1]);
            (settled.collected_at_s.clamp(w[0].t_s, w[1].t_s), settled.bytes as f64)
        })
        .collect();
    let count = |from: f64| {
        let first = span.iter().find(|p| p.t_s >= from - 1e-9).map_or(0, |p| p.collections);
        span.last().map_or(0, |p| p.collections).saturating_sub(first)
    };
    let (in_window, in_span) = (count(steady_from), count(span_from));
    let duration = span_to - span_from;
    let (first, last) = (series.first()?, series.last()?);
    let in_recording = last.collections.saturating_sub(first.collections);
    let recorded_s = last.t_s - first.t_s;
    let record_for_s = (in_recording > 0 && recorded_s > 0.0)
        .then(|| COLLECTIONS_AT_LEAST as f64 * recorded_s / in_recording as f64)
        .map(|s| s.max(recorded_s).round());
    let window: Vec<(f64, f64)> = events.iter().copied().filter(|p| p.0 >= steady_from - 1e-9).collect();
    let widened = window.len() < COLLECTIONS_FOR_A_TREND;
    let used = if widened { events } else { window };
    let rising = used.len() >= COLLECTIONS_AT_LEAST && used.windows(2).all(|w| w[1].1 > w[0].1);
    // Fewer points than a trend needs tell a rate only when they are apart: a burst of
    // collections (V8's memory reducer runs two or three in a row) says nothing of one.
    let spread = used.last().zip(used.first()).map_or(0.0, |(l, f)| l.0 - f.0);
    let apart = used.len() >= COLLECTIONS_FOR_A_TREND || spread >= duration * MIN_SPREAD;
    let trend = (used.len() >= COLLECTIONS_AT_LEAST && apart).then(|| fit(&used));
    let record_for_s = match record_for_s {
        Some(s) if trend.is_none() && in_recording >= COLLECTIONS_AT_LEAST as u64 => {
            Some(s.max(2.0 * recorded_s).round())
        }
        r => r,
    };
    Some(OnCollections {
        in_window,
        in_span,
        span_s: duration,
        in_recording,
        recorded_s,
        widened,
        rising,
        trend,
        record_for_s,
    })
}

/// Make `kg` (the managed heap's growth) the judgement of `c`: its trend on the bytes left by
/// each collection when known (growing when significant, or rising at every collection, and
/// above the floor), else unknown (not growing); a caveat in `warnings` says when the trend is
/// unknown (and how long to record) or fitted on the whole span's collections.
pub(super) fn judge(kg: &mut KindGrowth, c: OnCollections, runtime: Option<Runtime>, warnings: &mut Vec<String>) {
    let heap = runtime.map_or("managed heap", crate::runtimes::heap_name);
    let record = match c.record_for_s {
        Some(s) => format!("record at least {s:.0} s for {COLLECTIONS_AT_LEAST} collections"),
        None => "record until the runtime collects (none was seen)".to_string(),
    };
    match &c.trend {
        Some(t) => {
            kg.trend = *t;
            kg.troughs = t.n;
            kg.levelled_off = false;
            kg.grows = (t.significant_growth || c.rising) && t.slope_bytes_per_s > kg.noise_floor_bytes_per_s;
            if c.widened {
                warnings.push(format!(
                    "the {heap} was judged on what the {} collection(s) of the whole analysed span left (only {} in the steady window){}",
                    t.n,
                    c.in_window,
                    if c.rising { ", each more than the one before" } else { "" }
                ));
            }
        }
        None => {
            kg.grows = false;
            kg.levelled_off = false;
            kg.troughs = 0;
            warnings.push(format!(
                "the {heap}'s trend is unknown: {} ({} in the steady window, {} in the analysed span; \
                 {COLLECTIONS_AT_LEAST} needed to compare what they left), so its growth between collections may be \
                 garbage; {record}",
                why(&c),
                c.in_window,
                c.in_span
            ));
        }
    }
    kg.collections = Some(c);
}

/// Why a heap's trend is unknown.
fn why(c: &OnCollections) -> &'static str {
    if c.in_window == 0 { "no collection in the window" } else { "too few collections" }
}

/// "Java heap unknown: no collection in the window (record at least 60 s)": the state of a heap
/// whose trend is unknown for want of collections, among the kinds.
pub fn unknown_state(label: &str, c: &OnCollections) -> String {
    match c.record_for_s {
        Some(s) => format!("{label} unknown: {} (record at least {s:.0} s)", why(c)),
        None => format!("{label} unknown: {} (none in the whole run: record until it collects)", why(c)),
    }
}

/// "inconclusive: 1 old-gen collections in 30 s; attach for ≥ 60 s": the state of a heap whose
/// trend is unknown for want of collections. The JVM's are counted as old-gen collections (what
/// its users read in GC logs), V8's as full collections (its mark-compacts); another runtime's
/// (Go's, one kind of collection) as collections.
pub fn unknown_phrase(c: &OnCollections, runtime: Option<Runtime>) -> String {
    let what = match runtime {
        Some(Runtime::Jvm) => "old-gen collections",
        Some(Runtime::Node) => "full collections",
        _ => "collections",
    };
    match c.record_for_s {
        Some(s) => format!("inconclusive: {} {what} in {:.0} s; attach for ≥ {s:.0} s", c.in_recording, c.recorded_s),
        None => format!(
            "inconclusive: 0 {what} in {:.0} s; attach until it has collected {COLLECTIONS_AT_LEAST} times",
            c.recorded_s
        ),
    }
}

/// True when `kg`'s trend is unknown for want of collections.
pub fn unknown(kg: &KindGrowth) -> bool {
    kg.collections.as_ref().is_some_and(|c| c.trend.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heap keeping 200 KB/s, collected every `every` seconds (the first at `every`), sampled
    /// every second, each sample saying when the last collection ended (`timed`).
    fn heap_timed(every: f64, secs: usize, timed: bool) -> Vec<AfterCollection> {
        (0..=secs)
            .map(|k| {
                let t = k as f64;
                let n = (t / every).floor();
                AfterCollection {
                    t_s: t,
                    bytes: (3_500_000.0 + 200_000.0 * n * every) as u64,
                    collections: n as u64,
                    collected_at_s: if timed && n > 0.0 { n * every } else { t },
                }
            })
            .collect()
    }

    fn heap(every: f64, secs: usize) -> Vec<AfterCollection> {
        heap_timed(every, secs, false)
    }

    #[test]
    fn leak_measured_after_each_collection() {
        let c = on_collections(&heap(2.0, 30), 0.0, 15.0, 30.0).expect("judged");
        assert!(!c.widened, "{c:?}");
        let t = c.trend.expect("a trend");
        assert!((t.slope_bytes_per_s - 200_000.0).abs() < 2_000.0, "{t:?}");
        assert!(t.significant_growth, "{t:?}");
    }

    /// verdicts_heaps' JVM static list under a loaded CI machine: the checkpoint at 26.95 s read
    /// hsperfdata while the 5th young collection ran: its count raised, the survivor and old
    /// spaces still at the 4th's 4,750,048 B (eden 3.4 MB). Taken as the 5th's figure it broke
    /// the rise ("flat", then "fragmentation"); the next checkpoint's 5,906,872 B is what the 5th
    /// left.
    #[test]
    fn a_checkpoint_read_during_a_collection_is_not_its_figure() {
        let left = [1_375_672u64, 2_500_384, 3_624_320, 4_750_048, 5_906_872];
        let series: Vec<AfterCollection> = (0..=30)
            .map(|k| {
                let t = k as f64;
                let n = ((t - 5.0) / 5.5).floor().max(-1.0) as i64 + 1;
                let n = n.clamp(0, 5) as usize;
                // At the first checkpoint counting the 5th collection, its spaces are not yet read.
                let bytes = if n == 0 {
                    0
                } else if n == 5 && t < 28.0 {
                    left[3]
                } else {
                    left[n - 1]
                };
                AfterCollection { t_s: t, bytes, collections: n as u64, collected_at_s: t }
            })
            .collect();
        let c = on_collections(&series, 0.0, 15.0, 30.0).expect("judged");
        assert!(c.rising, "{c:?}");
        let t = c.trend.expect("a trend");
        assert!((t.slope_bytes_per_s - 205_000.0).abs() < 20_000.0, "{t:?}");
    }

    #[test]
    fn few_collections_widen_to_the_span() {
        let c = on_collections(&heap(7.0, 30), 0.0, 15.0, 30.0).expect("judged");
        assert!(c.widened && c.rising && c.in_window == 2 && c.in_span == 4, "{c:?}");
        let t = c.trend.expect("a trend");
        assert_eq!(t.n, 4, "the four collections of the span");
        assert!((t.slope_bytes_per_s - 200_000.0).abs() < 10_000.0, "{t:?}");
    }

    #[test]
    fn two_collections_that_rise_are_a_rate_at_the_times_they_ran() {
        // Collections at 11.3 s and 22.6 s, seen at the next checkpoints (12 s, 23 s): placed
        // where they ran, the rate is exact; placed at the checkpoints it would be off.
        let every = 11.3;
        let c = on_collections(&heap_timed(every, 30, true), 0.0, 15.0, 30.0).expect("judged");
        assert!(c.widened && c.rising && c.in_span == 2, "{c:?}");
        let t = c.trend.expect("two collections are a trend");
        assert_eq!(t.n, 2);
        assert!((t.slope_bytes_per_s - 200_000.0).abs() < 1.0, "{t:?}");
        // A collection time the runtime forged (after the checkpoint that saw it) is clamped to
        // the interval between the two checkpoints.
        let mut s = heap_timed(every, 30, true);
        s[12].collected_at_s = 1e9;
        let t = on_collections(&s, 0.0, 15.0, 30.0).unwrap().trend.unwrap();
        assert!(t.slope_bytes_per_s.is_finite(), "{t:?}");
    }

    #[test]
    fn fewer_than_two_collections_is_unknown_with_the_time_to_record() {
        let c = on_collections(&heap(100.0, 30), 0.0, 15.0, 30.0).expect("judged");
        assert_eq!((c.in_window, c.in_span, c.trend, c.record_for_s), (0, 0, None, None));
        assert_eq!(
            unknown_phrase(&c, Some(Runtime::Jvm)),
            "inconclusive: 0 old-gen collections in 30 s; attach until it has collected 2 times"
        );
        // One collection, before the window: unknown, and twice the span to see two.
        let mut s = heap(100.0, 30);
        for p in s.iter_mut().filter(|p| p.t_s >= 5.0) {
            p.collections = 1;
        }
        let c = on_collections(&s, 0.0, 15.0, 30.0).expect("judged");
        assert_eq!((c.in_window, c.in_span, c.trend), (0, 1, None));
        assert_eq!(c.record_for_s, Some(60.0));
        assert_eq!(
            unknown_phrase(&c, Some(Runtime::Jvm)),
            "inconclusive: 1 old-gen collections in 30 s; attach for ≥ 60 s"
        );
        assert_eq!(unknown_phrase(&c, Some(Runtime::Go)), "inconclusive: 1 collections in 30 s; attach for ≥ 60 s");
        assert_eq!(
            unknown_phrase(&c, Some(Runtime::Node)),
            "inconclusive: 1 full collections in 30 s; attach for ≥ 60 s"
        );
        // Two collections a second apart (a burst): no rate, and a longer attach asked.
        let mut s = heap(100.0, 30);
        for p in s.iter_mut() {
            p.collections = u64::from(p.t_s >= 20.0) + u64::from(p.t_s >= 21.0);
            p.bytes += 100_000 * p.collections;
        }
        let c = on_collections(&s, 0.0, 15.0, 30.0).expect("judged");
        assert_eq!((c.in_span, c.trend), (2, None), "{c:?}");
        assert_eq!(c.record_for_s, Some(60.0));
    }

    /// The JVM as hsperfdata shows it over 60 s: eden filling with garbage at 1 MB/s and
    /// emptied by a young collection every `every` s; survivor and old spaces keeping `kept`
    /// B/s at each collection. The heap is judged on what the collections left.
    fn jvm(every: f64, kept: f64) -> crate::analyze::Analysis {
        use crate::analyze::fixtures::{mem, no_counters, recording, temp_site, times61};
        use crate::analyze::{AnalyzeOptions, analyze};
        let mut r = recording(&times61(), vec![temp_site()], &|_| mem(200 << 20), &no_counters);
        r.target.runtime = Some(Runtime::Jvm);
        for c in &mut r.checkpoints {
            let gcs = (c.t_s / every).floor();
            let old = (3 << 20) as f64 + kept * gcs * every;
            let eden = 1_000_000.0 * (c.t_s - gcs * every);
            let mut m = ManagedHeap {
                used_bytes: (old + eden) as u64,
                committed_bytes: 256 << 20,
                source: "hsperfdata".into(),
                collections: Some(gcs as u64),
                ..Default::default()
            };
            m.spaces.insert("new.eden".into(), eden as u64);
            m.spaces.insert("old.old".into(), old as u64);
            c.managed = Some(m);
        }
        analyze(&r, &AnalyzeOptions::default())
    }

    #[test]
    fn jvm_heap_judged_on_its_collections() {
        use crate::analyze::MemoryKind;
        let managed = |a: &crate::analyze::Analysis| a.kinds.iter().find(|k| k.kind == MemoryKind::Managed).cloned();
        // Kept 200 KB/s, collected every 4 s: a leak at that rate, not at the garbage's 1 MB/s.
        let a = jvm(4.0, 200_000.0);
        let m = managed(&a).expect("managed");
        assert!(m.grows, "{m:?}");
        assert!((m.trend.slope_bytes_per_s - 200_000.0).abs() < 0.05 * 200_000.0, "{m:?}");
        let o = a.occupied.as_ref().expect("occupied");
        assert!(
            o.managed_after_collection
                && o.managed_source.as_deref().unwrap_or("").contains("after the last collection")
        );
        // Nothing kept: flat, however the garbage saws.
        let m = managed(&jvm(4.0, 0.0)).expect("managed");
        assert!(!m.grows && m.trend.slope_bytes_per_s.abs() < 1.0, "{m:?}");
        // No collection in the 60 s: unknown, never growing, and the caveat says so.
        let a = jvm(1000.0, 0.0);
        let m = managed(&a).expect("managed");
        assert!(!m.grows && unknown(&m), "{m:?}");
        assert!(
            a.warnings.iter().any(|w| w.contains("trend is unknown: no collection in the window")),
            "{:?}",
            a.warnings
        );
        assert_ne!(a.verdict.class, crate::analyze::ProcessClass::Leak);
    }

    /// A Go process over 60 s as its runtime's figures show it: `HeapInuse` sawing with 1 MB/s
    /// of garbage, a collection every `every` s marking `kept` B/s more each time, its time
    /// given (`last_gc_unix`); the Go heap's sites (mapped after attach) flat.
    fn go(every: f64, kept: f64) -> crate::analyze::Analysis {
        use crate::analyze::fixtures::{mem, no_counters, recording, temp_site, times61};
        use crate::analyze::{AnalyzeOptions, analyze};
        let mut r = recording(&times61(), vec![temp_site()], &|_| mem(200 << 20), &no_counters);
        r.target.runtime = Some(Runtime::Go);
        for c in &mut r.checkpoints {
            let gcs = (c.t_s / every).floor();
            let marked = (4 << 20) as f64 + kept * gcs * every;
            let mut m = ManagedHeap {
                used_bytes: (marked + 1_000_000.0 * (c.t_s - gcs * every)) as u64,
                source: "the Go runtime's HeapInuse".into(),
                collections: Some(gcs as u64),
                last_collection_ago_s: (gcs > 0.0).then_some(c.t_s - gcs * every),
                figures_only: true,
                ..Default::default()
            };
            m.spaces.insert(MARKED_BY_LAST_GC.into(), marked as u64);
            c.managed = Some(m);
        }
        analyze(&r, &AnalyzeOptions::default())
    }

    #[test]
    fn go_heap_judged_on_what_each_collection_marked() {
        use crate::analyze::{MemoryKind, ProcessClass};
        let managed = |a: &crate::analyze::Analysis| a.kinds.iter().find(|k| k.kind == MemoryKind::Managed).cloned();
        // Marked 100 KB/s more at every collection (every 2.5 s, between checkpoints): a managed
        // leak at that rate, though its sites are flat.
        let a = go(2.5, 100_000.0);
        let m = managed(&a).expect("managed");
        assert!(m.grows, "{m:?}");
        assert!((m.trend.slope_bytes_per_s - 100_000.0).abs() < 0.02 * 100_000.0, "{m:?}");
        assert_eq!(a.verdict.class, ProcessClass::Leak, "{:?}", a.verdict);
        // Nothing kept: flat, however HeapInuse saws.
        let a = go(2.5, 0.0);
        let m = managed(&a).expect("managed");
        assert!(!m.grows && m.trend.slope_bytes_per_s.abs() < 1.0, "{m:?}");
        assert_ne!(a.verdict.class, ProcessClass::Leak, "{:?}", a.verdict);
        // No collection in the 60 s: unknown, inconclusive, in Go's words.
        let a = go(1000.0, 0.0);
        let m = managed(&a).expect("managed");
        assert!(!m.grows && unknown(&m), "{m:?}");
        assert!(a.verdict.inconclusive, "{:?}", a.verdict);
        // The occupied heap still shows HeapInuse, not the marked bytes.
        let o = go(2.5, 0.0).occupied.expect("occupied");
        assert!(!o.managed_after_collection, "{o:?}");
    }

    #[test]
    fn after_collection_is_used_minus_eden() {
        let mut m = ManagedHeap { used_bytes: 10_000, ..Default::default() };
        assert_eq!(after_collection_bytes(&m), None);
        m.spaces.insert("new.eden".into(), 6_000);
        m.spaces.insert("old.old".into(), 4_000);
        assert_eq!(after_collection_bytes(&m), Some(4_000));
    }
}
