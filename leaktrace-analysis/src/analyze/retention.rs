//! Allocator retention judged on the whole recording: the allocator's resident memory rose (in
//! steps or steadily) while the live bytes it serves — native, off-heap and managed together —
//! stayed flat or fell back after each peak. The memory is the allocator's (freed pages it keeps:
//! glibc's arenas, jemalloc's dirty and muzzy pages, tcmalloc's page heap, mimalloc's segments),
//! not an object's; the verdict names the allocator and the knob that returns it.

use serde::Serialize;

use super::stats::median_slope;

/// The footprint must rise by at least this much over the analysed span, bytes: below it the
/// allocator's warm-up (thread caches, a first arena) is not worth a verdict.
pub const RETENTION_MIN_BYTES: u64 = 8 << 20;

/// Live bytes may rise by at most this share of the footprint's rise (the same ratio as
/// [`super::FRAGMENTATION_RATIO`]).
pub const RETENTION_LIVE_SHARE: f64 = 0.25;

/// A step of the footprint is a rise to a new high by at least this share of its whole rise
/// (and [`RETENTION_STEP_MIN_BYTES`]); smaller rises are its steady growth.
pub const RETENTION_STEP_SHARE: f64 = 0.05;

/// A step is at least this many bytes (256 pages).
pub const RETENTION_STEP_MIN_BYTES: u64 = 1 << 20;

/// One rise of the allocator's footprint to a new high.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RetentionStep {
    /// Time of the first checkpoint that saw the new high, seconds since the first checkpoint.
    pub t_s: f64,
    /// How much the footprint rose above its previous high, bytes (over consecutive
    /// checkpoints that each saw a new high: one step).
    pub bytes: u64,
    /// Live bytes (all traced) at those checkpoints, the highest, bytes: the peak the step
    /// served.
    pub live_bytes: u64,
}

/// What the allocator holds beyond live bytes, over the whole analysed span.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Retention {
    /// The footprint (the allocator's resident bytes) at the start of the span, bytes.
    pub footprint_start_bytes: u64,
    /// Its median over the last half of the span, bytes (robust to a decay that returns part of
    /// it now and then).
    pub footprint_late_bytes: u64,
    /// Its highest value, bytes.
    pub footprint_peak_bytes: u64,
    /// Live bytes (native, off-heap and managed: every traced site) at the start of the span.
    pub live_start_bytes: u64,
    /// Their median over the last half of the span, bytes: what is live between peaks.
    pub live_late_bytes: u64,
    /// Their highest value over the span, bytes.
    pub live_peak_bytes: u64,
    /// Theil–Sen slope of the live bytes over the span, bytes per second.
    pub live_bytes_per_s: f64,
    /// Footprint − live bytes, medians over the last half: what the allocator holds that no
    /// live block needs, bytes.
    pub held_beyond_live_bytes: u64,
    /// The rises to a new high ([`RETENTION_STEP_SHARE`]), in time order.
    pub steps: Vec<RetentionStep>,
    /// Checkpoints in the last half of the span.
    pub late_points: usize,
    /// The allocator's own figure over the same span, where it was read (glibc's arena headers).
    pub own: Option<OwnFigures>,
}

/// The allocator's own figure of the memory it holds from the system: glibc's Σ `system_mem` of
/// its arenas, read from their headers (brk heap extent and thread arenas' heaps; large chunks
/// served by mmap not included), resident or not.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OwnFigures {
    /// At the first checkpoint of the span that read it, and its median over the span's last
    /// half, bytes.
    pub start_bytes: u64,
    pub late_bytes: u64,
    /// Where it comes from, for humans.
    pub source: &'static str,
}

/// glibc's arenas as their headers tell it over a window (the allocator's own figure beside the
/// resident pages leaktrace measures): how many arenas, Σ `system_mem` at the window's ends and
/// its slope, and what glibc counts in use at the end (`system_mem` − the free chunks of the bins
/// and the top chunks): the rest is retained, free memory the arenas keep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GlibcArenas {
    /// Arenas on `main_arena`'s `next` list at the last checkpoint (`main_arena` counted).
    pub arenas: u32,
    /// Σ `system_mem` at the window's first and last checkpoint that read it, bytes.
    pub system_mem_start_bytes: u64,
    pub system_mem_end_bytes: u64,
    /// Least-squares slope of Σ `system_mem` over the window, bytes per second.
    pub system_mem_bytes_per_s: f64,
    /// glibc's bytes in use at the last checkpoint that read them (None: its bins could not be
    /// followed), and the bytes it retains then (`system_mem` − in use).
    pub in_use_end_bytes: Option<u64>,
    pub retained_end_bytes: Option<u64>,
}

/// glibc's arenas from the series of Σ `system_mem` (`own`) and of its bytes in use (`in_use`),
/// with `arenas` read at the last checkpoint: its value at the first point at or after
/// `span_from`, its slope over `from..=to`, its value and the bytes in use at the last point up
/// to `to`; None with fewer than two points in `from..=to`.
pub fn glibc_arenas(
    own: &[(f64, u64)],
    in_use: &[(f64, u64)],
    arenas: u32,
    span_from: f64,
    (from, to): (f64, f64),
) -> Option<GlibcArenas> {
    let inside = |p: &&(f64, u64)| p.0 >= from - 1e-9 && p.0 <= to + 1e-9;
    let pts: Vec<(f64, f64)> = own.iter().filter(inside).map(|p| (p.0, p.1 as f64)).collect();
    if pts.len() < 2 {
        return None;
    }
    let start = own.iter().find(|p| p.0 >= span_from - 1e-9).map_or(pts[0].1 as u64, |p| p.1);
    let end = pts[pts.len() - 1].1 as u64;
    let in_use_end = in_use.iter().rfind(inside).map(|p| p.1);
    Some(GlibcArenas {
        arenas,
        system_mem_start_bytes: start,
        system_mem_end_bytes: end,
        system_mem_bytes_per_s: super::stats::fit(&pts).slope_bytes_per_s,
        in_use_end_bytes: in_use_end,
        retained_end_bytes: in_use_end.map(|u| end.saturating_sub(u)),
    })
}

/// What [`OwnFigures::source`] says for glibc.
pub const GLIBC_OWN_SOURCE: &str = "glibc's arena headers (Σ system_mem of main_arena and its thread arenas)";

/// Append the checkpoint's allocator figure at `t` to `series` when it was read.
pub(super) fn push_own_figure(series: &mut Vec<(f64, u64)>, t: f64, al: &crate::recording::AllocatorFootprint) {
    if al.glibc_system_mem_bytes > 0 {
        series.push((t, al.glibc_system_mem_bytes));
    }
}

/// Append glibc's bytes in use at `t` (Σ `system_mem` − free bytes) to `series` when both were
/// read at that checkpoint.
pub(super) fn push_in_use_figure(series: &mut Vec<(f64, u64)>, t: f64, al: &crate::recording::AllocatorFootprint) {
    if al.glibc_system_mem_bytes > 0 && al.glibc_free_bytes > 0 {
        series.push((t, al.glibc_system_mem_bytes.saturating_sub(al.glibc_free_bytes)));
    }
}

/// The allocator's own figure over `from..=to` (its first point and the median of its last
/// half); None when it was not read in the span.
pub(super) fn own_figures(series: &[(f64, u64)], from: f64, to: f64) -> Option<OwnFigures> {
    let span: Vec<(f64, u64)> = series.iter().copied().filter(|p| p.0 >= from - 1e-9 && p.0 <= to + 1e-9).collect();
    let first = span.first()?.1;
    let mid = from + (to - from) / 2.0;
    let late: Vec<u64> = span.iter().filter(|p| p.0 >= mid).map(|p| p.1).collect();
    let late_bytes = if late.is_empty() { span.last()?.1 } else { median(late) };
    Some(OwnFigures { start_bytes: first, late_bytes, source: GLIBC_OWN_SOURCE })
}

/// The clause of the retention sentence on the allocator's own figures: what glibc's arena
/// headers say, or that they (or another allocator's statistics) were not read.
pub fn own_figures_clause(own: Option<&OwnFigures>, family: Option<&str>) -> String {
    match (own, family) {
        (Some(o), _) => format!(
            "glibc's own figure, from its arena headers: system_mem {} → {}",
            crate::human::bytes(o.start_bytes),
            crate::human::bytes(o.late_bytes)
        ),
        (None, None) => "glibc's arena headers could not be read (see the warnings: libc6-dbg gives main_arena):                          leaktrace measures the resident pages of its regions"
            .to_string(),
        (None, Some(f)) => {
            format!("{f}'s own statistics are not read from outside: leaktrace measures the resident pages of its regions")
        }
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// The value of `series` ((time, bytes), time order) at time `t`: the last point at or before it
/// (the first point before the series starts).
fn at(series: &[(f64, u64)], t: f64) -> u64 {
    let k = series.partition_point(|p| p.0 <= t + 1e-9);
    series.get(k.saturating_sub(1)).map_or(0, |p| p.1)
}

/// Allocator retention over the span `from..=to` (seconds, the checkpoints' time base):
/// `footprint` is the allocator's resident bytes, `live` every traced site's live bytes. Some
/// when all of:
/// - at least 5 footprint points in the span, 3 of them in its last half;
/// - the footprint's median over the last half exceeds its start by at least
///   [`RETENTION_MIN_BYTES`] and `floor_bytes_per_s` × the span (it rose and stays risen);
/// - live bytes rose by less than [`RETENTION_LIVE_SHARE`] of that, measured twice: their median
///   over the last half against their start (what is live between peaks) and their Theil–Sen
///   slope against the footprint's rise per second over the span (peaks fall back);
/// - what the footprint holds beyond live bytes (medians over the last half) is at least half of
///   its rise.
pub(super) fn retention(
    footprint: &[(f64, u64)],
    live: &[(f64, u64)],
    from: f64,
    to: f64,
    floor_bytes_per_s: f64,
) -> Option<Retention> {
    let span: Vec<(f64, u64)> = footprint.iter().copied().filter(|p| p.0 >= from && p.0 <= to).collect();
    let duration = to - from;
    if span.len() < 5 || duration <= 0.0 {
        return None;
    }
    let mid = from + duration / 2.0;
    let late: Vec<(f64, u64)> = span.iter().copied().filter(|p| p.0 >= mid).collect();
    if late.len() < 3 {
        return None;
    }
    let f_start = span[0].1;
    let f_late = median(late.iter().map(|p| p.1).collect());
    let rise = f_late.saturating_sub(f_start);
    if rise < RETENTION_MIN_BYTES || (rise as f64) < floor_bytes_per_s * duration {
        return None;
    }
    let live_span: Vec<(f64, u64)> = span.iter().map(|p| (p.0, at(live, p.0))).collect();
    let l_start = live_span[0].1;
    let l_late = median(late.iter().map(|p| at(live, p.0)).collect());
    let l_peak = live_span.iter().map(|p| p.1).max().unwrap_or(0);
    let pts: Vec<(f64, f64)> = live_span.iter().map(|p| (p.0, p.1 as f64)).collect();
    let l_slope = median_slope(&pts).unwrap_or(0.0);
    let f_rate = rise as f64 / duration;
    if l_late.saturating_sub(l_start) as f64 >= RETENTION_LIVE_SHARE * rise as f64
        || l_slope >= RETENTION_LIVE_SHARE * f_rate
    {
        return None;
    }
    let held = f_late.saturating_sub(l_late);
    if (held as f64) < 0.5 * rise as f64 {
        return None;
    }
    let step_min = ((RETENTION_STEP_SHARE * rise as f64) as u64).max(RETENTION_STEP_MIN_BYTES);
    // A rise over consecutive checkpoints (a peak a checkpoint caught half-built) is one step:
    // its first checkpoint's time, the bytes of the whole rise, the highest live bytes in it.
    let mut steps: Vec<RetentionStep> = Vec::new();
    let mut high = f_start;
    let mut last_step_at = usize::MAX;
    for (k, &(t, f)) in span.iter().enumerate().skip(1) {
        if f >= high.saturating_add(step_min) {
            let live_now = at(live, t);
            match steps.last_mut() {
                Some(s) if last_step_at + 1 == k => {
                    s.bytes += f - high;
                    s.live_bytes = s.live_bytes.max(live_now);
                }
                _ => steps.push(RetentionStep { t_s: t, bytes: f - high, live_bytes: live_now }),
            }
            last_step_at = k;
        }
        high = high.max(f);
    }
    Some(Retention {
        footprint_start_bytes: f_start,
        footprint_late_bytes: f_late,
        footprint_peak_bytes: span.iter().map(|p| p.1).max().unwrap_or(0),
        live_start_bytes: l_start,
        live_late_bytes: l_late,
        live_peak_bytes: l_peak,
        live_bytes_per_s: l_slope,
        held_beyond_live_bytes: held,
        steps,
        late_points: late.len(),
        own: None,
    })
}

/// The allocator by the name the field uses, and the knob that makes it return freed memory:
/// `family` is the probed allocator library (jemalloc, tcmalloc, mimalloc), None for the C
/// library's malloc (glibc's arenas).
pub fn allocator_and_knob(family: Option<&str>) -> (&'static str, &'static str) {
    match family {
        Some("jemalloc") => (
            "jemalloc's dirty and muzzy pages (freed extents it keeps until they decay)",
            "MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 returns freed pages at once (a shorter decay, e.g. \
             dirty_decay_ms:1000, most of them)",
        ),
        Some("tcmalloc") => (
            "tcmalloc's page heap (freed spans it keeps)",
            "a higher TCMALLOC_RELEASE_RATE returns freed spans sooner; MallocExtension::ReleaseFreeMemory() \
             returns them at once",
        ),
        Some("mimalloc") => (
            "mimalloc's segments (freed pages it keeps before purging)",
            "MIMALLOC_PURGE_DELAY=0 (mi_option_purge_delay) purges freed pages at once",
        ),
        _ => (
            "glibc's malloc arenas (freed chunks below a live one cannot be returned: fragmentation)",
            "MALLOC_ARENA_MAX=2 limits the per-thread arenas; malloc_trim(0) after a peak returns free pages \
             inside the heaps; another allocator (jemalloc, tcmalloc) returns freed pages by itself",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn series(f: impl Fn(usize) -> u64, n: usize) -> Vec<(f64, u64)> {
        (0..n).map(|k| (k as f64 * 0.5, f(k))).collect()
    }

    /// glibc arenas ratcheting in steps of 24 MiB every 6 s while live bytes spike at each peak
    /// and fall back: retention, with each step.
    #[test]
    fn steps_with_live_falling_back_are_retention() {
        let n = 61;
        let footprint = series(|k| 4 * MIB + 24 * MIB * (k / 12) as u64, n);
        let live = series(|k| if k % 12 == 0 && k > 0 { 20 * MIB } else { MIB }, n);
        let r = retention(&footprint, &live, 0.0, 30.0, 4096.0).expect("retention");
        assert_eq!(r.steps.len(), 5, "{r:?}");
        assert_eq!(r.steps[0].bytes, 24 * MIB);
        assert_eq!(r.steps[0].t_s, 6.0);
        assert!(r.held_beyond_live_bytes >= 70 * MIB, "{r:?}");
    }

    /// A peak caught half-built by one checkpoint rises over two: one step of the whole rise.
    #[test]
    fn a_rise_over_consecutive_checkpoints_is_one_step() {
        let footprint = series(|k| 4 * MIB + 12 * MIB * ((k + 1) / 12) as u64 + 12 * MIB * (k / 12) as u64, 61);
        let live = series(|k| if k % 12 <= 1 && k > 1 { 20 * MIB } else { MIB }, 61);
        let r = retention(&footprint, &live, 0.0, 30.0, 4096.0).expect("retention");
        assert_eq!(r.steps[0].t_s, 5.5, "{r:?}");
        assert_eq!(r.steps[0].bytes, 24 * MIB, "{r:?}");
        assert_eq!(r.steps.len(), 5, "{r:?}");
    }

    /// jemalloc's footprint rises at once and swings with its decay while live bytes are ~0
    /// between reports: retention (no ongoing growth needed).
    #[test]
    fn footprint_kept_above_a_falling_working_set_is_retention() {
        let footprint = series(|k| if k < 6 { 12 * MIB * k as u64 } else { (60 + 30 * (k % 3) as u64) * MIB }, 60);
        let live = series(|k| if k % 3 == 0 { 40 * MIB } else { 100 << 10 }, 60);
        let r = retention(&footprint, &live, 0.0, 29.5, 4096.0).expect("retention");
        assert_eq!(r.live_late_bytes, 100 << 10, "{r:?}");
        assert_eq!(r.footprint_peak_bytes, 120 * MIB, "{r:?}");
        assert_eq!(r.live_peak_bytes, 40 * MIB, "{r:?}");
    }

    /// A working set kept live (a cache, a leak) explains the footprint: not retention.
    #[test]
    fn live_bytes_that_follow_the_footprint_are_not_retention() {
        let footprint = series(|k| 4 * MIB + MIB * k as u64, 60);
        let live = series(|k| MIB * k as u64, 60);
        assert!(retention(&footprint, &live, 0.0, 29.5, 4096.0).is_none());
    }

    /// A footprint that moves a few MiB (thread caches, one arena) is not worth a verdict; one
    /// that does not rise at all is not retention.
    #[test]
    fn small_or_flat_footprints_are_not_retention() {
        let small = series(|k| MIB + (k as u64 % 4) * MIB, 60);
        let live = series(|_| 0, 60);
        assert!(retention(&small, &live, 0.0, 29.5, 4096.0).is_none());
        let flat = series(|_| 200 * MIB, 60);
        assert!(retention(&flat, &live, 0.0, 29.5, 4096.0).is_none());
    }

    /// glibc's own figure over the span: its first point and the median of its last half; the
    /// clause names it, or says it was not read (glibc: the warnings; another allocator: not
    /// read from outside).
    #[test]
    fn own_figures_over_the_span_and_their_clause() {
        let series: Vec<(f64, u64)> = (0..10).map(|k| (k as f64, (2 + 4 * k as u64) << 20)).collect();
        let o = own_figures(&series, 1.0, 9.0).expect("read");
        assert_eq!((o.start_bytes, o.late_bytes), (6 << 20, 30 << 20));
        assert!(own_figures(&series, 20.0, 30.0).is_none());
        let c = own_figures_clause(Some(&o), None);
        assert_eq!(c, "glibc's own figure, from its arena headers: system_mem 6.0 MiB → 30.0 MiB");
        assert!(own_figures_clause(None, None).contains("could not be read"));
        assert!(own_figures_clause(None, Some("jemalloc")).starts_with("jemalloc's own statistics are not read"));
    }
}
