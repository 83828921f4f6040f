//! What the headline names: the allocator's retention over a small leak beside it, glibc's own
//! figures in the retention's sentence, and warm-up told from a small leak that keeps growing.

use super::*;

/// The allocator's footprint of glibc with 5 arenas growing `per_s` bytes a second from 10 MiB,
/// its headers read: system_mem follows it, 300 KiB of it in use.
fn glibc_footprint(t: f64, per_s: f64) -> crate::recording::AllocatorFootprint {
    let arenas = (10u64 << 20) + (per_s * t) as u64;
    crate::recording::AllocatorFootprint {
        heap_resident_bytes: 1 << 20,
        arena_heaps: 4,
        arena_bytes: arenas + (8 << 20),
        arena_resident_bytes: arenas,
        glibc_system_mem_bytes: arenas + (1 << 20),
        glibc_arenas: 5,
        glibc_free_bytes: arenas + (1 << 20) - 300_000,
        ..Default::default()
    }
}

/// A leak of `per_s` bytes a second in 1 KiB records (never freed) from `remember_request`.
fn small_leak(per_s: u64) -> (Stack, SiteFn) {
    (user_stack(7, "remember_request"), Box::new(move |t: f64| (per_s * t as u64, per_s * t as u64 / 1024, 0, 0)))
}

#[test]
fn retention_is_the_headline_with_a_small_leak_beneath_it() {
    // 400 KB/s retained by glibc's arenas, a 20 KB/s leak beside it: the retention explains 95 %.
    let mut r = recording(
        &times61(),
        vec![temp_site(), small_leak(20_000)],
        &|t| mem((40 << 20) + (420_000.0 * t) as u64),
        &no_counters,
    );
    for c in &mut r.checkpoints {
        c.allocator = Some(glibc_footprint(c.t_s, 400_000.0));
    }
    let a = analyze(&r, &AnalyzeOptions::default());
    let text = sentence(&a);
    assert_eq!(a.verdict.class, ProcessClass::Fragmentation, "{text}");
    let Reason::AllocatorRetains { beneath: Some((top, 1, rate)), glibc: Some(g), .. } = &a.verdict.reason else {
        panic!("{text}")
    };
    assert_eq!(a.sites[*top].function, "remember_request");
    assert!((*rate - 20_000.0).abs() < 1000.0, "{rate}");
    assert_eq!(g.arenas, 5);
    assert_eq!(g.in_use_end_bytes, Some(300_000));
    assert!((g.system_mem_bytes_per_s - 400_000.0).abs() < 4000.0, "{g:?}");
    for part in [
        "allocator retention by glibc's per-thread arenas (5 arenas",
        "glibc's own figure, from its arena headers: system_mem",
        "MALLOC_ARENA_MAX=2",
        "another allocator",
        "beneath it, a smaller live growth: leak: remember_request",
        "(5 % of the allocator's growth)",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    // The leak itself is still named a leak, beneath.
    assert_eq!(site(&a, 7).class, SiteClass::Leak);

    // A leak of 250 KB/s beside 300 KB/s retained is more than half of it: the leak is the
    // headline.
    let mut r = recording(
        &times61(),
        vec![temp_site(), small_leak(250_000)],
        &|t| mem((40 << 20) + (550_000.0 * t) as u64),
        &no_counters,
    );
    for c in &mut r.checkpoints {
        c.allocator = Some(glibc_footprint(c.t_s, 300_000.0));
    }
    let a = analyze(&r, &AnalyzeOptions::default());
    assert_eq!(a.verdict.class, ProcessClass::Leak, "{}", sentence(&a));
}

#[test]
fn retention_without_arena_headers_says_they_were_not_read() {
    let mut r = recording(&times61(), vec![temp_site()], &|_| mem(40 << 20), &no_counters);
    for c in &mut r.checkpoints {
        let mut f = glibc_footprint(c.t_s, 400_000.0);
        (f.glibc_system_mem_bytes, f.glibc_arenas, f.glibc_free_bytes) = (0, 0, 0);
        c.allocator = Some(f);
    }
    let a = analyze(&r, &AnalyzeOptions::default());
    let text = sentence(&a);
    assert_eq!(a.verdict.class, ProcessClass::Fragmentation, "{text}");
    assert!(text.contains("glibc's arena headers were not read"), "{text}");
    assert!(!text.contains("per-thread arenas ("), "{text}");
}

/// 200-byte entries of `intern_name` at the times `at` gives (cumulative count at t), freed as
/// `gone` gives; 10 MB/s of churn beside them.
fn table(count: fn(f64) -> u64, gone: fn(f64) -> u64) -> Recording {
    let site: SiteFn = Box::new(move |t: f64| (200 * count(t), count(t), 200 * gone(t), gone(t)));
    let churn: SiteFn = Box::new(|t: f64| {
        let t = t as u64;
        (10_000_000 * t + 1000, 1000 * t + 1, 10_000_000 * t + 1000, 1000 * t + 1)
    });
    let mut churn_stack = temp_site().0;
    churn_stack.id = 3;
    recording(
        &times61(),
        vec![(user_stack(8, "intern_name"), site), (churn_stack, churn)],
        &|_| mem(40 << 20),
        &no_counters,
    )
}

#[test]
fn warm_up_without_a_new_high_in_the_last_third_is_inconclusive_not_a_leak() {
    // One entry a second for 28 s, 24 evicted at 28 s, 23 back one every 1.25 s: climbing
    // through the steady window, never above the 28 entries held at 28 s.
    let r = table(
        |t| if t < 28.0 { t as u64 } else { 28 + ((t - 29.0) / 1.25 + 1.0).clamp(0.0, 23.0) as u64 },
        |t| if t < 28.0 { 0 } else { 24 },
    );
    let a = analyze(&r, &AnalyzeOptions::default());
    let text = sentence(&a);
    assert_eq!(site(&a, 8).class, SiteClass::Cache, "{}", site(&a, 8).evidence.reason);
    assert_eq!(a.verdict.class, ProcessClass::Flat, "{text}");
    assert!(a.verdict.inconclusive);
    assert!(text.starts_with("inconclusive: warm-up — intern_name"), "{text}");

    // The same climb reaching a new high late (the entries not evicted): a leak.
    let r = table(|t| if t < 28.0 { t as u64 } else { 28 + ((t - 29.0) / 1.25 + 1.0).clamp(0.0, 23.0) as u64 }, |_| 0);
    let a = analyze(&r, &AnalyzeOptions::default());
    assert_eq!(a.verdict.class, ProcessClass::Leak, "{}", sentence(&a));
    assert_eq!(site(&a, 8).class, SiteClass::Leak);
}

#[test]
fn last_part_and_keeps_growing() {
    let times: Vec<f64> = (0..=30).map(f64::from).collect();
    // Rises to 1000 by 15 s, dips, climbs back to 900: no new high in the last third.
    let live: Vec<u64> = (0..=30u64).map(|t| if t <= 15 { 1000 * t / 15 } else { 400 + 500 * (t - 15) / 15 }).collect();
    let p = super::super::settled::last_part(&times, &live, 0..31).expect("last part");
    assert_eq!((p.high_before, p.high_in, p.last_rise_s, p.from_s), (1000, 900, 15.0, 20.0));
    assert!(!p.keeps_growing(40.0));
    // A steady climb: 100 B more in the last third than before it, a quarter of 40 B/s × 10 s.
    let live: Vec<u64> = (0..=30u64).map(|t| 10 * t).collect();
    let p = super::super::settled::last_part(&times, &live, 0..31).expect("last part");
    assert!(p.keeps_growing(10.0) && !p.keeps_growing(100.0));
    assert!(super::super::settled::last_part(&times, &live, 0..2).is_none());
}
