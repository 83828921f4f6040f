//! A managed heap judged on its collections, from the runtime's own counters:
//! what each collection left (the JVM's hsperfdata: used bytes of the survivor and old spaces,
//! which change only when a collection runs) and how many collections ran (the collectors'
//! invocation counts).
//!
//! Between two collections a heap's used bytes climb with the garbage the program makes; a line
//! through them measures the allocation rate, not a leak. What survives each collection is the
//! signal. With no collection in the steady window nothing survived anything there: the trend is
//! unknown, never a leak, and the report says how long to record. With fewer than
//! [`MIN_WINDOW_POINTS`] collections in the window, the collections of the whole analysed span are
//! used (the interval widened by the fewer points, Student t), and the report says so.

use serde::Serialize;

use super::stats::fit;
use super::{KindGrowth, MIN_WINDOW_POINTS, Trend};
use crate::recording::{ManagedHeap, Recording, Runtime};

/// Collections needed in the last half of the run for a trend: the steady window's
/// [`MIN_WINDOW_POINTS`]; the duration to record is the time that many take at the rate seen,
/// twice over (the steady window is the last half).
pub const COLLECTIONS_FOR_A_TREND: usize = MIN_WINDOW_POINTS;

/// Bytes of the heap that survived its last collection: used − the eden spaces (young objects
/// allocated since; the survivor and old spaces change only at a collection). None when the
/// runtime does not split its heap so (no space named `*.eden`).
pub fn after_collection_bytes(m: &ManagedHeap) -> Option<u64> {
    let eden: Vec<u64> = m.spaces.iter().filter(|(k, _)| k.ends_with(".eden")).map(|(_, v)| *v).collect();
    (!eden.is_empty()).then(|| m.used_bytes.saturating_sub(eden.iter().sum()))
}

/// The runtime's after-collection figure and collection count at the checkpoints that have both,
/// in time order: (t_s, bytes after the last collection, collections so far). Empty when the
/// runtime does not give them.
pub(super) fn collection_series(rec: &Recording) -> Vec<(f64, u64, u64)> {
    let mut v: Vec<(f64, u64, u64)> = rec
        .checkpoints
        .iter()
        .filter(|c| c.t_s.is_finite())
        .filter_map(|c| {
            let m = c.managed.as_ref().filter(|m| !m.figures_only)?;
            Some(((c.t_s * 1e9).round() / 1e9, after_collection_bytes(m)?, m.collections?))
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// How a managed heap was judged on its collections ([`on_collections`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OnCollections {
    /// Collections the runtime ran in the steady window and in the whole analysed span.
    pub in_window: u64,
    pub in_span: u64,
    /// The trend was fitted on the collections of the whole span and the level at its start
    /// (what the collection before it left): the window had fewer than
    /// [`COLLECTIONS_FOR_A_TREND`].
    pub widened: bool,
    /// Least-squares fit of the bytes after each collection against its time (the first
    /// checkpoint that counted it); None: unknown (no collection in the window, or fewer than
    /// 2 in the span).
    pub trend: Option<Trend>,
    /// How long to record for a trend, seconds: the time [`COLLECTIONS_FOR_A_TREND`]
    /// collections take at the rate seen, twice (the steady window is the last half); None when
    /// no collection was seen at all (the rate is unknown).
    pub record_for_s: Option<f64>,
}

/// Judge the heap of `series` ([`collection_series`]) on its collections between `span_from` and
/// `span_to` (seconds, the recording's times), the steady window starting at `steady_from`.
/// None when the series has fewer than 2 points in the span.
pub(super) fn on_collections(
    series: &[(f64, u64, u64)],
    span_from: f64,
    steady_from: f64,
    span_to: f64,
) -> Option<OnCollections> {
    let span: Vec<&(f64, u64, u64)> =
        series.iter().filter(|p| p.0 >= span_from - 1e-9 && p.0 <= span_to + 1e-9).collect();
    if span.len() < 2 {
        return None;
    }
    // One point per checkpoint that counted new collections: the bytes they left.
    let events: Vec<(f64, f64)> =
        span.windows(2).filter(|w| w[1].2 > w[0].2).map(|w| (w[1].0, w[1].1 as f64)).collect();
    let count = |from: f64| {
        let first = span.iter().find(|p| p.0 >= from - 1e-9).map_or(0, |p| p.2);
        span.last().map_or(0, |p| p.2).saturating_sub(first)
    };
    let (in_window, in_span) = (count(steady_from), count(span_from));
    let duration = span_to - span_from;
    let record_for_s = (in_span > 0 && duration > 0.0)
        .then(|| 2.0 * COLLECTIONS_FOR_A_TREND as f64 * duration / in_span as f64)
        .map(|s| s.max(duration).ceil());
    let window: Vec<(f64, f64)> = events.iter().copied().filter(|p| p.0 >= steady_from - 1e-9).collect();
    let widened = window.len() < COLLECTIONS_FOR_A_TREND;
    // Widened, the span's first point counts too: what the collection before the span left,
    // placed at the span's start (it was left then or earlier: a growing heap's slope is
    // underestimated, never overestimated).
    let mut used = if widened { events.clone() } else { window };
    if widened && events.first().is_some_and(|e| e.0 > span[0].0) {
        used.insert(0, (span[0].0, span[0].1 as f64));
    }
    let trend = (in_window > 0 && used.len() >= 2).then(|| fit(&used));
    Some(OnCollections { in_window, in_span, widened, trend, record_for_s })
}

/// Make `kg` (the managed heap's growth) the judgement of `c`: its trend on the bytes left by
/// each collection when known (growing when significant and above the floor), else unknown (not
/// growing); a caveat in `warnings` says when the trend is unknown (and how long to record) or
/// fitted on the whole span's collections.
pub(super) fn judge(kg: &mut KindGrowth, c: OnCollections, runtime: Option<Runtime>, warnings: &mut Vec<String>) {
    let heap = runtime.map_or("managed heap", crate::runtimes::heap_name);
    let record = match c.record_for_s {
        Some(s) => format!("record at least {s:.0} s for {COLLECTIONS_FOR_A_TREND} collections in the last half"),
        None => "record until the runtime collects (none was seen)".to_string(),
    };
    match &c.trend {
        Some(t) => {
            kg.trend = *t;
            kg.troughs = t.n;
            kg.levelled_off = false;
            kg.grows = t.significant_growth && t.slope_bytes_per_s > kg.noise_floor_bytes_per_s;
            if c.widened {
                warnings.push(format!(
                    "the {heap} was judged on what the {} collection(s) of the whole analysed span left (only {} in the steady window): its interval is wider ({record})",
                    t.n, c.in_window
                ));
            }
        }
        None => {
            kg.grows = false;
            kg.levelled_off = false;
            kg.troughs = 0;
            let why = if c.in_window == 0 { "no collection in the window" } else { "too few collections" };
            warnings.push(format!(
                "the {heap}'s trend is unknown: {why} ({} in the steady window, {} in the analysed span), so \
                 its growth between collections may be garbage; {record}",
                c.in_window, c.in_span
            ));
        }
    }
    kg.collections = Some(c);
}

/// "Java heap unknown: no collection in the window (record at least 60 s)": the state of a heap
/// whose trend is unknown for want of collections.
pub fn unknown_phrase(label: &str, c: &OnCollections) -> String {
    let why = if c.in_window == 0 { "no collection in the window" } else { "too few collections" };
    match c.record_for_s {
        Some(s) => format!("{label} unknown: {why} (record at least {s:.0} s)"),
        None => format!("{label} unknown: {why} (none in the whole run: record until it collects)"),
    }
}

/// True when `kg`'s trend is unknown for want of collections.
pub fn unknown(kg: &KindGrowth) -> bool {
    kg.collections.as_ref().is_some_and(|c| c.trend.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heap keeping 200 KB/s, collected every `every` seconds, sampled every second.
    fn heap(every: f64, secs: usize) -> Vec<(f64, u64, u64)> {
        (0..=secs)
            .map(|k| {
                let t = k as f64;
                let n = (t / every).floor();
                ((t), (3_500_000.0 + 200_000.0 * n * every) as u64, n as u64)
            })
            .collect()
    }

    #[test]
    fn leak_measured_after_each_collection() {
        let c = on_collections(&heap(2.0, 30), 0.0, 15.0, 30.0).expect("judged");
        assert!(!c.widened, "{c:?}");
        let t = c.trend.expect("a trend");
        assert!((t.slope_bytes_per_s - 200_000.0).abs() < 2_000.0, "{t:?}");
        assert!(t.significant_growth, "{t:?}");
    }

    #[test]
    fn few_collections_widen_to_the_span() {
        let c = on_collections(&heap(7.0, 30), 0.0, 15.0, 30.0).expect("judged");
        assert!(c.widened && c.in_window == 2 && c.in_span == 4, "{c:?}");
        let t = c.trend.expect("a trend");
        assert_eq!(t.n, 5, "four collections and the level at the span's start");
        assert!((t.slope_bytes_per_s - 200_000.0).abs() < 10_000.0, "{t:?}");
        assert_eq!(c.record_for_s, Some(45.0));
    }

    #[test]
    fn no_collection_in_the_window_is_unknown() {
        let c = on_collections(&heap(100.0, 30), 0.0, 15.0, 30.0).expect("judged");
        assert_eq!((c.in_window, c.in_span, c.trend, c.record_for_s), (0, 0, None, None));
        // Collections before the window only: still unknown, with a duration to record.
        let mut s = heap(100.0, 30);
        for p in s.iter_mut().filter(|p| p.0 >= 5.0) {
            p.2 = 1;
        }
        let c = on_collections(&s, 0.0, 15.0, 30.0).expect("judged");
        assert_eq!((c.in_window, c.in_span, c.trend), (0, 1, None));
        assert_eq!(c.record_for_s, Some(180.0));
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

    #[test]
    fn after_collection_is_used_minus_eden() {
        let mut m = ManagedHeap { used_bytes: 10_000, ..Default::default() };
        assert_eq!(after_collection_bytes(&m), None);
        m.spaces.insert("new.eden".into(), 6_000);
        m.spaces.insert("old.old".into(), 4_000);
        assert_eq!(after_collection_bytes(&m), Some(4_000));
    }
}
