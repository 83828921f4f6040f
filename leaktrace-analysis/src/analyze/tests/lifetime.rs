//! A process's life: growth per unit of work, what a one-shot command held at exit, teardown, compare.

use super::*;

/// Units of work at time t: an accelerating load (5 t² calls), so the rate per second
/// varies while the growth per call does not.
fn units_at(t: f64) -> u64 {
    (5.0 * t * t) as u64
}

/// A recording whose leak is exactly 20 B per unit of work, with `handle_request` as the
/// work probe.
fn per_unit_recording() -> Recording {
    let (st, _) = leak_site();
    let f: SiteFn = Box::new(|t: f64| {
        let u = units_at(t);
        (20 * u, u, 0, 0)
    });
    let mut r =
        recording(&times61(), vec![(st, f), cache_site()], &|t| mem((20 << 20) + 25 * units_at(t)), &no_counters);
    r.work_probe = Some("handle_request@/opt/server/bin/server".into());
    for c in &mut r.checkpoints {
        c.units_of_work = Some(units_at(c.t_s));
    }
    r
}

#[test]
fn growth_per_unit_of_work() {
    let a = analyze(&per_unit_recording(), &AnalyzeOptions::default());
    let leak = site(&a, 1);
    assert_eq!(leak.class, SiteClass::Leak, "{:?}", leak.evidence);
    let per_unit = leak.growth_bytes_per_unit.expect("per unit");
    assert!((per_unit - 20.0).abs() < 0.01, "{per_unit}");
    assert!(leak.growth_ci95_bytes_per_unit.unwrap() < 0.1);
    // Per second, the same leak grows with the load: 20 × 10 t B/s, about 9 KB/s at 45 s.
    assert!(leak.growth_bytes_per_s > 5000.0, "{}", leak.growth_bytes_per_s);
    assert_eq!(site(&a, 2).growth_bytes_per_unit.map(|u| u.abs() < 0.01), Some(true));
    assert_eq!(a.units_of_work, Some(18_000));
    assert_eq!(a.unit_name().as_deref(), Some("call of handle_request"));
    let s = &a.summary;
    assert!((s.growth_bytes_per_unit.unwrap() - 20.0).abs() < 0.01);
    assert!((s.native_growth_bytes_per_unit.unwrap() - 20.0).abs() < 0.01);
    assert!((s.rss_anon_growth_bytes_per_unit.unwrap() - 25.0).abs() < 0.1);
    assert_eq!(s.offheap_growth_bytes_per_unit, Some(0.0));
    assert_eq!(a.verdict.class, ProcessClass::Leak);
    assert!(
        sentence(&a)
            .starts_with("leak: Session::key holds 20 B more live bytes per call of handle_request (± 0 at 95 %), +"),
        "{}",
        sentence(&a)
    );
    // Occupied heap: 360 000 + 900 000 live bytes and glibc's 8-byte chunk header of each live
    // block, in 20 MiB + 450 000 B of RSS anon.
    let blocks: u64 = a.sites.iter().map(|s| s.live_allocations).sum();
    let o = a.occupied.as_ref().expect("occupied");
    assert_eq!((o.native_bytes, o.allocator_metadata_bytes, o.managed_bytes), (1_260_000, Some(8 * blocks), None));
    let ratio = s.occupied_heap_to_rss_ratio.unwrap();
    let expected = (1_260_000 + 8 * blocks) as f64 / (20_971_520.0 + 450_000.0);
    assert!((ratio - expected).abs() < 1e-4, "{ratio} {expected}");

    // Without a work probe: per second only.
    let mut r = per_unit_recording();
    r.work_probe = None;
    for c in &mut r.checkpoints {
        c.units_of_work = None;
    }
    let a = analyze(&r, &AnalyzeOptions::default());
    assert!(a.sites.iter().all(|s| s.growth_bytes_per_unit.is_none()));
    assert_eq!(a.summary.growth_bytes_per_unit, None);
    assert_eq!(a.units_of_work, None);
    assert!(sentence(&a).starts_with("leak: Session::key holds +"), "{}", sentence(&a));

    // A work probe that counted nothing in the steady window: per second, with a warning.
    let mut r = per_unit_recording();
    for c in &mut r.checkpoints {
        c.units_of_work = Some(7);
    }
    let a = analyze(&r, &AnalyzeOptions::default());
    assert!(a.sites.iter().all(|s| s.growth_bytes_per_unit.is_none()));
    assert!(a.warnings.iter().any(|w| w.contains("counted no call")), "{:?}", a.warnings);
}

/// A command that makes one 30,000-byte allocation and exits 0.6 s later
/// (checkpoints every 0.2 s). Too short to classify, whatever the sites look like; the answer is
/// what it still held at exit: main's 30,000 B, not stdio's buffer or the loader's memory. The
/// same command that frees its block holds nothing at exit.
#[test]
fn one_shot_command_lists_what_it_held_at_exit() {
    let times = [0.0, 0.2, 0.4, 0.6];
    let stdio = Stack {
        id: 2,
        kind: StackKind::Malloc,
        frames: vec![
            frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame("__GI__IO_file_doallocate", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame("_IO_doallocbuf", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame("printf", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame("main", "/opt/server/bin/server", Some(("/build/src/leaker.c", 20))).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    let init = Stack {
        id: 3,
        kind: StackKind::Malloc,
        frames: vec![
            frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None).into(),
            frame("pool", "/lib/x86_64-linux-gnu/libstdc++.so.6", None).into(),
            frame("call_init", "/lib64/ld-linux-x86-64.so.2", None).into(),
        ],
        lost: false,
        truncated: None,
        shared: false,
    };
    for freed in [false, true] {
        let leak: SiteFn = Box::new(move |t: f64| {
            if t < 0.1 {
                (0, 0, 0, 0)
            } else if freed && t > 0.3 {
                (30_000, 1, 30_000, 1)
            } else {
                (30_000, 1, 0, 0)
            }
        });
        let mut r = recording(
            &times,
            vec![
                (user_stack(1, "main"), leak),
                (stdio.clone(), Box::new(|t: f64| if t < 0.1 { (0, 0, 0, 0) } else { (1024, 1, 0, 0) })),
                (init.clone(), Box::new(|t: f64| if t < 0.1 { (0, 0, 0, 0) } else { (73_728, 1, 0, 0) })),
            ],
            &|_| mem(1 << 20),
            &no_counters,
        );
        r.end_reason = crate::recording::EndReason::TargetExited;
        let a = analyze(&r, &AnalyzeOptions::default());
        assert!(a.verdict.inconclusive);
        assert!(matches!(a.verdict.reason, Reason::TooShort { .. }), "{:?}", a.verdict.reason);
        let text = sentence(&a);
        assert!(text.starts_with("inconclusive: too short to classify"), "{text}");
        let x = a.at_exit.as_ref().expect("at_exit");
        assert_eq!(x.one_time_sites, 2, "{text}");
        assert_eq!(x.one_time_bytes, 1024 + 73_728);
        if freed {
            assert!(x.sites.is_empty(), "{text}");
            assert!(text.contains("nothing was still allocated when the command exited"), "{text}");
        } else {
            assert_eq!(x.sites.len(), 1, "{text}");
            assert_eq!(a.sites[x.sites[0]].function, "main");
            assert_eq!(x.live_bytes, 30_000);
            assert_eq!(x.live_allocations, 1);
            // One site holding it all is named once.
            assert!(
                text.contains(
                    "still allocated when the command exited: 29.3 KiB in 1 block(s), all from main (server.c:10)"
                ),
                "{text}"
            );
        }
        // The same list in report.md.
        let md = crate::report::markdown::report_md(&r, &a);
        assert!(md.contains("## Still allocated at exit"), "{md}");
    }
}

/// A one-shot command whose loop the compiler unrolled: `fill` calls malloc from two return
/// addresses on the same line of leaker.c (two stacks, same function, file and line in every
/// frame), 3 + 2 blocks of 1,000 B never freed; and a decoy, `fill` at another line (its own
/// entry). The at-exit list has two entries: fill's 5,000 B in 5 blocks (one entry, saying it
/// folds two stacks) and the decoy's; the sites themselves stay apart.
#[test]
fn at_exit_list_merges_stacks_that_differ_only_by_return_address() {
    let times = [0.0, 0.2, 0.4, 0.6];
    let fill = |id: u32, ret: u64, line: u32| {
        let mut f = frame("fill", "/opt/app/leaker", Some(("/build/leaker.c", line)));
        f.addr = 0x40_1000 + ret;
        f.file_offset = Some(0x1000 + ret);
        let mut m = frame("main", "/opt/app/leaker", Some(("/build/leaker.c", 30)));
        m.addr = 0x40_2000;
        m.file_offset = Some(0x2000);
        Stack {
            id,
            kind: StackKind::Malloc,
            frames: vec![frame("malloc", "/lib/x86_64-linux-gnu/libc.so.6", None).into(), f.into(), m.into()],
            lost: false,
            truncated: None,
            shared: false,
        }
    };
    let held = |n: u64| -> SiteFn { Box::new(move |t: f64| if t < 0.1 { (0, 0, 0, 0) } else { (n * 1000, n, 0, 0) }) };
    let mut r = recording(
        &times,
        vec![(fill(1, 0x10, 12), held(3)), (fill(2, 0x24, 12), held(2)), (fill(3, 0x60, 14), held(4))],
        &|_| mem(1 << 20),
        &no_counters,
    );
    r.end_reason = crate::recording::EndReason::TargetExited;
    let a = analyze(&r, &AnalyzeOptions::default());
    let x = a.at_exit.as_ref().expect("at_exit");
    let entries: Vec<(u32, (u64, u64), &Vec<u32>)> =
        x.sites.iter().zip(&x.held).zip(&x.folded).map(|((&i, &h), f)| (a.sites[i].id, h, f)).collect();
    assert_eq!(entries, [(1, (5000, 5), &vec![2]), (3, (4000, 4), &vec![])], "{entries:?}");
    assert_eq!((x.live_bytes, x.live_allocations), (9000, 9));
    assert_eq!(a.sites.len(), 3, "the sites stay apart");
    let text = sentence(&a);
    assert!(text.contains("4.9 KiB in 5 block(s) from fill"), "{text}");
    let md = crate::report::markdown::report_md(&r, &a);
    assert!(
        md.contains("- 4.9 KiB in 5 block(s) from fill (2 stacks with these frames at other return addresses):"),
        "{md}"
    );
    let json = crate::report::json::report_json(&r, &a);
    let listed = &json["still_allocated_at_exit"]["sites"];
    assert_eq!(listed[0]["folded_ids"], serde_json::json!([2]), "{listed}");
    assert_eq!(listed[0]["live_bytes"], 5000, "{listed}");
}

/// `compare` uses the report's classification. A cache that grows through
/// the steady window and levels off in the last quarter (the report: cache, plateau) is fitted
/// as significant growth over the steady window; compare must not call it "still leaking", nor
/// the total (which only the cache makes grow) a leak. A
/// leak measured at 1000 B/s before and after, with noise, is "still leaking" with "no change
/// beyond noise", not a percentage.
#[test]
fn compare_agrees_with_report() {
    let grow45 = || -> SiteFn {
        Box::new(|t: f64| {
            let k = (t as u64).min(45);
            (50_000 * k, 50 * k, 0, 0)
        })
    };
    let rec = || {
        let (st, _) = cache_site();
        recording(&times61(), vec![(st, grow45()), temp_site()], &|_| None, &no_counters)
    };
    let (b, a) = (rec(), rec());
    assert_eq!(site(&analyze(&b, &AnalyzeOptions::default()), 2).class, SiteClass::Cache);
    let c = crate::compare::compare(&b, "b", &a, "a").expect("compare");
    let cache = c.matched.iter().find(|s| s.signature.function() == "Cache::fill").expect("Cache::fill");
    assert!(cache.before.is_some_and(|g| g.significant && g.not_a_leak_in_report), "{cache:?}");
    assert_eq!(cache.status, crate::compare::Status::NoLeak, "{:?}", c.verdicts);
    assert!(!c.verdicts.iter().any(|v| v.contains("still leaking")), "{:?}", c.verdicts);
    // The total grows only by the cache: not a leak of the whole either (the fixed build passes).
    assert!(c.after.overall.significant && c.after.overall.not_a_leak_in_report, "{:?}", c.after.overall);
    assert!(c.after_flat && c.conclusion.starts_with("PASS — after: flat but for sites"), "{}", c.conclusion);

    // The same leak before and after, with a little noise: no change beyond noise.
    let leak = |seed: u64| {
        let (st, _) = leak_site();
        let f: SiteFn = Box::new(move |t: f64| {
            let n = t as u64;
            let wobble = (noise(seed + n) * 3.0) as u64;
            (1500 * n + 1000 * wobble, 15 * n + wobble, 500 * n, 5 * n)
        });
        recording(&times61(), vec![(st, f)], &|_| None, &no_counters)
    };
    let c = crate::compare::compare(&leak(1), "b", &leak(500), "a").expect("compare");
    let s = &c.matched[0];
    assert_eq!(s.status, crate::compare::Status::StillLeaking, "{:?}", c.verdicts);
    let (sb, sa) = (s.before.map_or(0.0, |g| g.slope), s.after.map_or(0.0, |g| g.slope));
    assert!(sb != sa && (sb - 1000.0).abs() < 60.0 && (sa - 1000.0).abs() < 60.0, "{sb} {sa}");
    assert!(c.verdicts[0].contains("no change beyond noise"), "{:?}", c.verdicts);
}

/// A launched command whose leak its teardown frees (static destructors,
/// atexit handlers, interpreter finalization). With the teardown checkpoint, growth is judged
/// up to it (a leak at 1,000 B/s), the teardown's frees are reported apart and the leak is not
/// in the list at exit; without it, the same frees make the site look temporary.
#[test]
fn leak_freed_at_teardown_is_judged_before_the_teardown() {
    let mut times: Vec<f64> = (0..=20).map(|k| k as f64 * 0.5).collect();
    times.push(10.2);
    let leak: SiteFn = Box::new(|t: f64| {
        let n = (t.min(10.0) * 10.0).round() as u64;
        if t > 10.1 { (100 * n, n, 100 * n, n) } else { (100 * n, n, 0, 0) }
    });
    let churn: SiteFn = Box::new(|t: f64| {
        let n = (t * 100.0).round() as u64;
        (4096 * n, n, 4096 * n, n)
    });
    let build = |teardown: bool| {
        let leak: SiteFn = Box::new({
            let f = &leak;
            let v: Vec<(f64, (u64, u64, u64, u64))> = times.iter().map(|&t| (t, f(t))).collect();
            move |t: f64| v.iter().find(|p| p.0 == t).map_or((0, 0, 0, 0), |p| p.1)
        });
        let churn: SiteFn = Box::new({
            let v: Vec<(f64, (u64, u64, u64, u64))> = times.iter().map(|&t| (t, churn(t))).collect();
            move |t: f64| v.iter().find(|p| p.0 == t).map_or((0, 0, 0, 0), |p| p.1)
        });
        let mut r = recording(
            &times,
            vec![(user_stack(1, "remember_request"), leak), (user_stack(2, "scratch_buffer"), churn)],
            &|_| mem(1 << 20),
            &no_counters,
        );
        r.end_reason = crate::recording::EndReason::TargetExited;
        if teardown {
            let n = r.checkpoints.len();
            r.checkpoints[n - 2].teardown = true;
        }
        r
    };
    let r = build(true);
    let a = analyze(&r, &AnalyzeOptions::default());
    assert_eq!(a.verdict.class, ProcessClass::Leak, "{:?}", a.verdict.reason);
    let site = a.sites.iter().position(|s| s.function == "remember_request").unwrap();
    assert_eq!(a.sites[site].class, SiteClass::Leak);
    let rate = a.sites[site].growth_bytes_per_s;
    assert!((rate - 1000.0).abs() < 50.0, "{rate}");
    assert_eq!(a.sites[site].live_bytes, 10_000);
    let f = a.freed_at_exit.as_ref().expect("freed_at_exit");
    assert_eq!(f.of_site(site), Some((10_000, 100)));
    assert_eq!((f.bytes, f.blocks), (10_000, 100));
    assert!((f.teardown_s - 10.0).abs() < 1e-9);
    let x = a.at_exit.as_ref().expect("at_exit");
    assert!(!x.sites.contains(&site), "{x:?}");
    let scratch = a.sites.iter().find(|s| s.function == "scratch_buffer").unwrap();
    assert_ne!(scratch.class, SiteClass::Leak);
    let text = sentence(&a);
    assert!(
        text.contains("released only at exit: the teardown freed 9.8 KiB in 100 block(s) from remember_request"),
        "{text}"
    );
    let md = crate::report::markdown::report_md(&r, &a);
    assert!(md.contains("## Freed at exit"), "{md}");
    // The same recording read back from JSON gives the same analysis.
    let back: Recording = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(analyze(&back, &AnalyzeOptions::default()), a);

    // Without the teardown checkpoint (as before, or an attached process): no leak is seen.
    let a = analyze(&build(false), &AnalyzeOptions::default());
    assert!(a.freed_at_exit.is_none());
    assert_ne!(a.sites.iter().find(|s| s.function == "remember_request").unwrap().class, SiteClass::Leak);
}

/// A command that exits 0.7 s after it starts, sampled every 100 ms (8 checkpoints, more than
/// [`MIN_SHAPE_CHECKPOINTS`]), leaking 5 blocks of 1,000 B a round: too short to judge growth
/// (the span is under [`MIN_SHAPE_SECONDS`]), never a leak at 50 KB/s; the list at exit holds
/// its 30,000 B with what the reachability scan at exit found (all unreachable), and a table kept
/// in a global (reachable).
#[test]
fn sub_second_command_is_too_short_whatever_the_interval() {
    let times: Vec<f64> = (0..8).map(|k| k as f64 / 10.0).collect();
    let leak: SiteFn = Box::new(|t: f64| {
        let rounds = ((t * 10.0).round() as u64).min(6);
        (5_000 * rounds, 5 * rounds, 0, 0)
    });
    let table: SiteFn = Box::new(|_| (8_000, 1, 0, 0));
    let mut r = recording(
        &times,
        vec![(user_stack(1, "leak_record"), leak), (user_stack(2, "load_config"), table)],
        &|t| mem((1 << 20) + (50_000.0 * t) as u64),
        &no_counters,
    );
    r.end_reason = crate::recording::EndReason::TargetExited;
    let site = |stack, reachable_bytes, unreachable_bytes| crate::reachability::SiteReach {
        stack,
        reachable_bytes,
        reachable_blocks: u64::from(reachable_bytes > 0),
        unreachable_bytes,
        unreachable_blocks: unreachable_bytes / 1000,
        ..Default::default()
    };
    r.reachability = Some(crate::reachability::Reachability {
        t_s: 0.7,
        complete: true,
        sites: vec![site(1, 0, 30_000), site(2, 8_000, 0)],
        ..Default::default()
    });
    let a = analyze(&r, &AnalyzeOptions::default());
    let text = sentence(&a);
    assert!(a.verdict.inconclusive, "{text}");
    assert!(matches!(a.verdict.reason, Reason::TooShort { checkpoints: 7.., .. }), "{:?}", a.verdict.reason);
    assert!(text.starts_with("inconclusive: too short to classify"), "{text}");
    let x = a.at_exit.as_ref().expect("at_exit");
    assert_eq!(x.reach, vec![Some((0, 30_000)), Some((8_000, 0))], "{text}");
    assert!(text.contains("29.3 KiB in 30 block(s) from leak_record"), "{text}");
    assert!(text.contains(", all unreachable (lost)") && text.contains(", all reachable"), "{text}");
    // Without a scan, nothing is said of reachability.
    r.reachability = None;
    let a = analyze(&r, &AnalyzeOptions::default());
    assert_eq!(a.at_exit.as_ref().map(|x| x.reach.clone()), Some(vec![None, None]));
    assert!(!sentence(&a).contains("reachable"), "{}", sentence(&a));
}
