//! Sites whose blocks a runtime's collector frees in bulk (V8's large-object pages, the backing
//! stores of garbage Buffers): judged on what is live after each collection.
//!
//! Between two collections such a site's live bytes climb with the garbage the program makes,
//! then fall at the collection: a sawtooth. A line fitted through the sawtooth rises when the
//! recording happens to end before the next collection (the last tooth), which is no evidence
//! of retention. What a collection leaves behind is: if the live bytes right after each fall do
//! not grow, the site's growth is garbage that the next collection frees.

use super::MIN_WINDOW_POINTS;
use super::kinds::gc_troughs;
use super::stats::{fit, points};
use crate::runtimes::MemoryKind;

/// Collections seen (falls of the site's live bytes to a trough) a site needs before its growth is judged on them.
pub(crate) const MIN_COLLECTIONS: usize = 2;

/// What the collections in a recording left of one site ([`garbage_between_collections`]).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Collected {
    /// Collections seen: falls of the site's live bytes, each followed to its bottom (a trough).
    pub(super) falls: usize,
    /// Smallest and largest live bytes at those troughs.
    pub(super) after_min: u64,
    pub(super) after_max: u64,
    /// Slope of the troughs, bytes per second (least squares, or the line through the two
    /// troughs with [`MIN_COLLECTIONS`] collections).
    pub(super) slope_bytes_per_s: f64,
}

/// The site's growth is garbage between collections: its memory is freed by a collector
/// (managed or off-heap memory), at least [`MIN_COLLECTIONS`] collections were seen in `span`
/// (indices into `times` and `live`; falls found as the heaps' own post-GC troughs are,
/// [`gc_troughs`]), and the live bytes those falls left do not grow beyond `floor` (bytes per
/// second): with at least [`MIN_WINDOW_POINTS`] troughs, their least-squares slope is not
/// significantly above the floor; with two, the line through them is not above it. None
/// otherwise: the site is judged as any other.
pub(super) fn garbage_between_collections(
    memory_kind: MemoryKind,
    times: &[f64],
    live: &[u64],
    span: std::ops::Range<usize>,
    floor: f64,
) -> Option<Collected> {
    if !matches!(memory_kind, MemoryKind::Managed | MemoryKind::OffHeap) {
        return None;
    }
    let troughs = gc_troughs(&points(times, live, span));
    let (&(t0, y0), &(t1, y1)) = (troughs.first()?, troughs.last()?);
    if troughs.len() < MIN_COLLECTIONS {
        return None;
    }
    let slope = if troughs.len() >= MIN_WINDOW_POINTS {
        let t = fit(&troughs);
        if t.significant_growth && t.slope_bytes_per_s > floor {
            return None;
        }
        t.slope_bytes_per_s
    } else {
        let s = if t1 > t0 { (y1 - y0) / (t1 - t0) } else { 0.0 };
        if s > floor {
            return None;
        }
        s
    };
    let bytes = troughs.iter().map(|p| p.1 as u64);
    Some(Collected {
        falls: troughs.len(),
        after_min: bytes.clone().min().unwrap_or(0),
        after_max: bytes.max().unwrap_or(0),
        slope_bytes_per_s: slope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// audit.js's decoy as recorded: V8 large-object pages (204,800 B each) climbing between
    /// collections about 2 s apart, the recording ending on a high tooth.
    const PAGE: u64 = 204_800;
    fn sawtooth(pages: &[u64]) -> (Vec<f64>, Vec<u64>) {
        let times = (0..pages.len()).map(|i| i as f64 * 0.25).collect();
        (times, pages.iter().map(|p| p * PAGE).collect())
    }

    #[test]
    fn sawtooth_ending_before_a_collection_is_garbage() {
        let (t, live) = sawtooth(&[
            12, 16, 20, 24, 28, 32, 36, 2, 6, 10, 14, 18, 22, 26, 30, 34, 0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40,
        ]);
        let c = garbage_between_collections(MemoryKind::Managed, &t, &live, 0..live.len(), 64.0)
            .expect("the troughs are flat");
        assert_eq!(c.falls, 2);
        assert_eq!((c.after_min, c.after_max), (0, 2 * PAGE));
        assert!(c.slope_bytes_per_s < 0.0, "{c:?}");
    }

    #[test]
    fn leak_beside_garbage_grows_after_each_collection() {
        // Two pages kept at every collection (about 1.6 pages/s): a leak, whatever the garbage.
        let (t, live) =
            sawtooth(&[4, 8, 12, 16, 2, 6, 10, 14, 4, 8, 12, 16, 6, 10, 14, 18, 8, 12, 16, 20, 10, 14, 18, 22, 12]);
        assert_eq!(garbage_between_collections(MemoryKind::Managed, &t, &live, 0..live.len(), 64.0), None);
    }

    #[test]
    fn native_memory_and_sites_never_collected_are_judged_as_any_other() {
        let (t, live) = sawtooth(&[12, 16, 2, 6, 10, 0, 4, 8]);
        assert_eq!(garbage_between_collections(MemoryKind::Native, &t, &live, 0..live.len(), 64.0), None);
        let (t, live) = sawtooth(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(garbage_between_collections(MemoryKind::Managed, &t, &live, 0..live.len(), 64.0), None);
        // One collection is not enough to judge on.
        let (t, live) = sawtooth(&[12, 16, 2, 6, 10, 14, 18]);
        assert_eq!(garbage_between_collections(MemoryKind::OffHeap, &t, &live, 0..live.len(), 64.0), None);
    }

    /// The CI failure of tests/tests/runtimes_node.rs `node_js_heap_leak_names_the_javascript_function`
    /// on a fresh machine: audit.js's decoy (20 large-object pages a second, garbage at once)
    /// collected twice (at 2 s and 6.5 s), the 12-s recording ending 5.5 s after the last collection;
    /// beside it the leak (20 pages a second kept). The decoy is temporary, the leak a leak.
    #[test]
    fn v8_large_object_garbage_before_the_next_collection_is_not_a_leak() {
        use crate::analyze::fixtures::{frame, mem, no_counters, recording};
        use crate::analyze::{AnalyzeOptions, SiteClass, analyze};
        use crate::recording::{Runtime, Stack, StackKind};
        let node = |js: &str| Stack {
            id: if js.contains("checkSession") { 1 } else { 2 },
            kind: StackKind::Mmap,
            frames: vec![
                frame("mmap64", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
                frame("v8::base::OS::Allocate", "/usr/bin/node", None).into(),
                frame("v8::internal::MemoryAllocator::AllocateLargePage", "/usr/bin/node", None).into(),
                frame(js, "", None).into(),
                frame("node::Start(int, char**)", "/usr/bin/node", None).into(),
            ],
            lost: false,
            truncated: None,
            shared: false,
        };
        let times: Vec<f64> = (0..=48).map(|k| k as f64 * 0.25).collect();
        fn made(t: f64) -> u64 {
            (20.0 * t).floor() as u64
        }
        let collected = move |t: f64| [2.0, 6.5].iter().filter(|&&g| g <= t).map(|&g| made(g)).max().unwrap_or(0);
        let decoy: super::super::fixtures::SiteFn =
            Box::new(move |t: f64| (PAGE * made(t), made(t), PAGE * collected(t), collected(t)));
        let leak: super::super::fixtures::SiteFn = Box::new(move |t: f64| (PAGE * made(t), made(t), 0, 0));
        let mut r = recording(
            &times,
            vec![
                (node("JS:^checkSession /srv/audit.js:20:22"), decoy),
                (node("JS:^recordAudit /srv/audit.js:15:21"), leak),
            ],
            &|t| mem((60 << 20) + (20.0 * t) as u64 * PAGE),
            &no_counters,
        );
        r.target.runtime = Some(Runtime::Node);
        let a = analyze(&r, &AnalyzeOptions::default());
        let site = |id| a.sites.iter().find(|s| s.id == id).expect("site");
        let decoy = site(1);
        assert_eq!(decoy.memory_kind, MemoryKind::Managed, "{decoy:?}");
        assert_eq!(decoy.class, SiteClass::Temporary, "{}", decoy.evidence.reason);
        assert!(decoy.evidence.reason.starts_with("freed by the runtime's collections"), "{}", decoy.evidence.reason);
        assert_eq!(site(2).class, SiteClass::Leak, "{}", site(2).evidence.reason);
    }
}
