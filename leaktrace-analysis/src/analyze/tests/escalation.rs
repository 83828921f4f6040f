//! Growth mode through the allocator and its exact window: a mapping jemalloc makes
//! under the program's malloc is heap growth, not an off-heap leak; an exact window cut short
//! answers nothing.

use super::*;
use crate::recording::{EndReason, Mode};

const JE: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const APP: &str = "/srv/app/decoy";

/// A frame of Debian's stripped libjemalloc2: an object, no function name.
fn stripped(addr: u64) -> std::sync::Arc<Frame> {
    Frame { addr, object: Some(JE.to_string()), ..Default::default() }.into()
}

/// jemalloc mapping a 2 MiB extent every second under remember_request's asprintf (mmap inside
/// libjemalloc), as growth mode records it.
fn jemalloc_extents() -> (Stack, SiteFn) {
    let stack = site_stack(
        3,
        StackKind::Mmap,
        vec![
            frame("mmap64", LIBC, None).into(),
            stripped(0x7f00_0000_1000),
            stripped(0x7f00_0000_2000),
            frame("malloc", JE, None).into(),
            frame("__vasprintf_internal", LIBC, None).into(),
            frame("asprintf", LIBC, None).into(),
            frame("remember_request", APP, None).into(),
            frame("main", APP, None).into(),
        ],
    );
    (stack, Box::new(|t: f64| ((2 << 20) * (t as u64 + 1), t as u64 + 1, 0, 0)))
}

fn growth_recording() -> Recording {
    let mut rec = recording(&times61(), vec![jemalloc_extents()], &|_| None, &no_counters);
    rec.mode = Mode::Growth;
    rec
}

/// Before: "off-heap: remember_request maps … (mapping)", an off-heap leak of the program.
#[test]
fn a_jemalloc_mapping_in_growth_mode_is_heap_growth_through_the_allocator() {
    let a = analyze(&growth_recording(), &AnalyzeOptions::default());
    let s = site(&a, 3);
    assert_eq!(s.function, "remember_request");
    assert_eq!(s.first_touch_in.as_deref(), Some("jemalloc"));
    assert_eq!(s.memory_kind, MemoryKind::Native);
    assert_ne!(a.verdict.class, ProcessClass::OffHeap, "{:?}", a.verdict);
    let v = sentence(&a);
    assert!(
        v.starts_with("growth through the allocator: pages mapped by the allocator (jemalloc) under remember_request"),
        "{v}"
    );
    assert!(v.contains("growth mode cannot tell leaked blocks from freed memory the allocator keeps"), "{v}");
    assert!(v.contains("an exact window names the allocating function"), "{v}");
    assert!(!v.contains("off-heap"), "{v}");
    // The escalation's note names what it is: the allocator's mapping, not a first touch.
    assert_eq!(
        s.through_allocator().as_deref(),
        Some("pages mapped by the allocator (jemalloc) under remember_request")
    );
    // Its pages are the allocator's heap, not off-heap memory (before: summed into off-heap).
    assert_eq!(a.summary.offheap_live_end_bytes, 0);
    assert!(a.memory.offheap_live_bytes.iter().all(|p| p.1 == 0), "{:?}", a.memory.offheap_live_bytes);
    assert_eq!(a.summary.growth_bytes_per_s.round(), (2u64 << 20) as f64, "{:?}", a.summary);
    // In exact mode the same mapping is the allocator's own (its blocks are at malloc sites).
    let mut exact = growth_recording();
    exact.mode = Mode::Exact;
    let a = analyze(&exact, &AnalyzeOptions::default());
    assert_eq!(site(&a, 3).memory_kind, MemoryKind::Runtime);
    assert_ne!(a.verdict.class, ProcessClass::OffHeap, "{}", sentence(&a));
}

/// An exact window of `times` ending by `end`: remember_request's malloc site leaking 1000 B/s.
fn window(times: &[f64], end: EndReason) -> Recording {
    let mut rec = recording(
        times,
        vec![server_stack(1, "remember_request")]
            .into_iter()
            .map(|s| {
                let f: SiteFn = Box::new(|t: f64| ((1000.0 * t) as u64 + 100, (t * 10.0) as u64 + 1, 0, 0));
                (s, f)
            })
            .collect(),
        &|_| None,
        &no_counters,
    );
    rec.end_reason = end;
    rec
}

/// Before: the cut window's six checkpoints fit a leak, and the verdict led with "leak (exact
/// window of 0 s after growth mode): remember_request holds …".
#[test]
fn an_exact_window_cut_by_a_signal_is_inconclusive_not_a_leak() {
    let mut rec = growth_recording();
    let short: Vec<f64> = (0..6).map(|i| i as f64 * 0.1).collect();
    rec.escalation = Some(Box::new(window(&short, EndReason::Signal)));
    let a = analyze(&rec, &AnalyzeOptions::default());
    let e = a.escalation.as_deref().expect("escalation analysed");
    assert!(matches!(e.verdict.reason, Reason::ExactWindowCut { .. }), "{:?}", e.verdict);
    assert!(a.verdict.inconclusive && a.verdict.class != ProcessClass::Leak, "{:?}", a.verdict);
    let v = sentence(&a);
    assert!(
        v.contains("inconclusive: the exact window was cut after 0.5 s (6 checkpoint(s)): it ended by signal"),
        "{v}"
    );
    assert!(!v.contains("remember_request holds"), "{v}");
    assert!(!v.contains("an exact window names"), "advice to take the window that was taken: {v}");
    // A whole window (10 s, ended by its duration) is judged: the leak is named.
    let mut rec = growth_recording();
    let whole: Vec<f64> = (0..=20).map(|i| i as f64 * 0.5).collect();
    rec.escalation = Some(Box::new(window(&whole, EndReason::Duration)));
    let a = analyze(&rec, &AnalyzeOptions::default());
    let v = sentence(&a);
    assert!(v.starts_with("leak (exact window of 10 s after growth mode): remember_request holds"), "{v}");
    assert!(!v.contains("an exact window names"), "{v}");
    assert!(!a.verdict.inconclusive, "{:?}", a.verdict);
}

/// report.md of a growth-mode recording: its sites are "grows (pages first touched)", never
/// "leak", and no occupied heap (growth mode sees no live blocks: it would read 0 %).
#[test]
fn growth_mode_report_md_says_what_it_measured() {
    let mut rec = growth_recording();
    rec.checkpoints.iter_mut().for_each(|c| c.memory = mem(100 << 20));
    let a = analyze(&rec, &AnalyzeOptions::default());
    let md = crate::report::markdown::report_md(&rec, &a);
    assert!(md.contains("remember_request — grows (pages first touched)"), "{md}");
    assert!(!md.contains("| leak |") && !md.contains(" — leak ("), "{md}");
    assert!(!md.contains("Occupied heap to RSS anon"), "{md}");
    // The Memory section counts jemalloc's extents as the allocator's heap, not off-heap.
    assert!(!md.contains("- off-heap ("), "{md}");
    assert!(md.contains("- the allocator's own mappings (jemalloc, 1 site(s): heap growth through the allocator, not off-heap): 122.0 MiB at the end; trend +2.0 MiB/s"), "{md}");
    assert!(md.contains("off-heap mappings 0 B resident"), "{md}");
}
