//! `leaktrace check`: the repeatable growth test. Warm up, run K equivalent batches (of units of
//! work, or of seconds), take a checkpoint after each, and compare the slope of the traced live
//! bytes against a budget. Exit code for CI: 0 pass, 1 fail, 2 error.
//!
//! The recording itself is made by `leaktrace::check::check` (the recorder with a batch
//! schedule); everything here is a pure function of the [`Recording`] ([`evaluate`]), testable without
//! root.
//!
//! Rules (also in `docs/usage.md`):
//! - Points: the checkpoints with `batch: Some(_)` (the baseline at the end of the warm-up and
//!   one per batch). x = units of work when the recording has a work probe, else seconds;
//!   y = traced live bytes (sum of the live bytes of every site, malloc and mmap kinds).
//! - Slope: least squares ([`analyze::fit`]) with its 95 % confidence interval.
//! - FAIL when the slope is above the budget **and** the growth is significant (the 95 % CI
//!   lies above zero). A slope whose CI includes zero is noise, not growth: it passes whatever
//!   the budget (budget 0 therefore means "no significant growth"). With only two points (no
//!   CI) the slope alone decides.
//! - Growing sites (named on FAIL), among the sites whose own slope exceeds [`SITE_FLOOR`]: the
//!   fastest ones, in decreasing order, until together they account for [`EXCESS_SHARE`] (90 %)
//!   of the excess (slope − budget); also every site whose own slope exceeds the budget or is at
//!   least [`SITE_SHARE`] (10 %) of the total slope.

use std::collections::BTreeMap;

use anyhow::Context as _;
use leaktrace_common::counter;
use serde::Serialize;

use crate::analyze::{self, culprit, frame_label, is_allocator};
use crate::human::{self, number, rate_in as rate};
use crate::recording::{EndReason, Recording, Stack, StackKind};
use crate::timeline::Timeline;

mod render;

pub use render::{check_json, render};

/// A site is only named as growing when its slope exceeds this (bytes per unit, or per second).
pub const SITE_FLOOR: f64 = 1.0;
/// On FAIL, every site growing at least this fraction of the total slope is named.
pub const SITE_SHARE: f64 = 0.1;
/// On FAIL, the fastest sites are named until together they grow this fraction of the excess
/// (slope − budget).
pub const EXCESS_SHARE: f64 = 0.9;

/// One batch checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BatchRow {
    /// 0 = baseline at the end of the warm-up.
    pub batch: u32,
    /// Seconds since attach.
    pub t_s: f64,
    /// Units of work since attach (None without a work probe).
    pub units: Option<u64>,
    /// Live bytes of all malloc-kind sites.
    pub native_live_bytes: u64,
    /// Live bytes of all mmap-kind (off-heap) sites.
    pub offheap_live_bytes: u64,
    /// VmRSS (None when the process was gone).
    pub rss_bytes: Option<u64>,
}

/// The growth of one site over the batch checkpoints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteSlope {
    /// [`Stack::id`].
    pub stack: u32,
    /// "malloc" or "mmap".
    pub kind: StackKind,
    /// Culprit function ([`analyze::culprit`]).
    pub function: String,
    /// Callers of the culprit, innermost first (at most 4), for the printout.
    pub callers: Vec<String>,
    /// Slope of the site's live bytes, bytes per unit (or per second).
    pub slope: f64,
    /// Half-width of its 95 % CI (None with fewer than 3 points).
    pub ci95: Option<f64>,
    /// Live bytes at the last batch checkpoint.
    pub live_bytes: u64,
}

/// Result of [`evaluate`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckResult {
    /// Batch checkpoints, in order (baseline first).
    pub batches: Vec<BatchRow>,
    /// Batches completed after the baseline.
    pub batches_completed: u32,
    /// "B/unit" or "B/s".
    pub unit: String,
    /// The work probe (`SYMBOL[@OBJECT]`) when per unit.
    pub work_probe: Option<String>,
    /// Slope of the traced live bytes, bytes per unit (or per second).
    pub slope: f64,
    /// Half-width of the 95 % confidence interval of the slope (None with 2 points).
    pub ci95: Option<f64>,
    /// The CI lies above zero (or, without a CI, the slope is positive).
    pub significant: bool,
    /// Budget, same unit as the slope.
    pub budget: f64,
    pub pass: bool,
    /// Why pass or fail, one sentence.
    pub reason: String,
    /// On FAIL: the sites named as the growth (see the module rules); empty on PASS.
    pub growing_sites: Vec<SiteSlope>,
    /// Why the recording ended ("batches-done", "target-exited", "signal", ...).
    pub end_reason: EndReason,
}

/// Stack id → stack.
pub(crate) fn stack_index(rec: &Recording) -> BTreeMap<u32, &Stack> {
    let mut m = BTreeMap::new();
    for s in &rec.stacks {
        m.entry(s.id).or_insert(s);
    }
    m
}

/// "mmap" for mapping sites; every other site (and an unknown stack) counts as "malloc".
fn kind_of(stacks: &BTreeMap<u32, &Stack>, id: u32) -> StackKind {
    match stacks.get(&id) {
        Some(s) if s.kind == StackKind::Mmap => StackKind::Mmap,
        _ => StackKind::Malloc,
    }
}

/// Evaluate a `check` recording against `budget` (bytes per unit of work when the recording has
/// a work probe, else bytes per second). Errors: fewer than 2 batch checkpoints, no units.
pub fn evaluate(rec: &Recording, budget: f64) -> anyhow::Result<CheckResult> {
    anyhow::ensure!(budget.is_finite() && budget >= 0.0, "the budget must be a non-negative number of bytes");
    let tl = Timeline::new(rec);
    let live = tl.live_by_stack();
    let points: Vec<&(usize, BTreeMap<u32, u64>)> =
        live.iter().filter(|(ci, _)| rec.checkpoints[*ci].batch.is_some()).collect();
    let completed = points.iter().filter_map(|(ci, _)| rec.checkpoints[*ci].batch).filter(|&b| b > 0).count() as u32;
    if points.len() < 2 {
        anyhow::bail!(
            "{} ({}): no slope can be measured",
            if points.is_empty() {
                "the warm-up did not complete"
            } else {
                "only the baseline was taken, no batch completed"
            },
            end_reason_text(rec.end_reason)
        );
    }
    let per_unit = rec.work_probe.is_some();
    let mut xs = Vec::with_capacity(points.len());
    for (ci, _) in &points {
        let c = &rec.checkpoints[*ci];
        xs.push(if per_unit {
            c.units_of_work.with_context(|| {
                format!(
                    "batch checkpoint {} has no units of work although the recording has a work probe",
                    c.batch.unwrap_or(0)
                )
            })? as f64
        } else {
            c.t_s
        });
    }
    if xs.iter().all(|&x| x == xs[0]) {
        match &rec.work_probe {
            Some(w) if per_unit => anyhow::bail!(
                "the work probe {w} counted no call between the baseline and the last batch: no growth per unit can be measured"
            ),
            _ => anyhow::bail!("all batch checkpoints have the same time: no slope can be measured"),
        }
    }
    let stacks = stack_index(rec);

    let mut batches = Vec::with_capacity(points.len());
    let mut total = Vec::with_capacity(points.len());
    for ((ci, sites), &x) in points.iter().zip(&xs) {
        let c = &rec.checkpoints[*ci];
        let (mut native, mut offheap) = (0u64, 0u64);
        for (&id, &b) in sites {
            match stacks.get(&id) {
                // Off-heap: program mappings only (not the loader's, the allocator's arenas or a
                // runtime's heap), as in the report (each stack classified once, in the timeline).
                Some(st) if st.kind == StackKind::Mmap => {
                    if tl.kinds[tl.index[&id]] == crate::runtimes::MemoryKind::OffHeap {
                        offheap = offheap.saturating_add(b);
                    }
                }
                _ => native = native.saturating_add(b),
            }
        }
        batches.push(BatchRow {
            batch: c.batch.unwrap_or(0),
            t_s: c.t_s,
            units: c.units_of_work,
            native_live_bytes: native,
            offheap_live_bytes: offheap,
            rss_bytes: c.memory.as_ref().map(|m| m.rss_bytes),
        });
        total.push((x, native.saturating_add(offheap) as f64));
    }
    let trend = analyze::fit(&total);
    let slope = trend.slope_bytes_per_s;
    let ci95 = trend.ci95_bytes_per_s;
    let significant = match ci95 {
        Some(_) => trend.significant_growth,
        None => slope > 0.0,
    };
    let unit = if per_unit { "B/unit" } else { "B/s" };
    let pass = slope <= budget || !significant;
    let reason = if slope <= budget {
        format!("the slope {} is within the budget {}", rate(slope, unit), rate(budget, unit))
    } else if !significant {
        format!(
            "the slope {} is above the budget {} but not significant (its 95 % confidence interval includes 0): noise, not growth",
            rate(slope, unit),
            rate(budget, unit)
        )
    } else {
        format!("the slope {} exceeds the budget {}", rate(slope, unit), rate(budget, unit))
    };

    // Per-site slopes over the same points.
    let mut ids: Vec<u32> = points.iter().flat_map(|(_, s)| s.keys().copied()).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut sites: Vec<SiteSlope> = ids
        .into_iter()
        .map(|id| {
            let pts: Vec<(f64, f64)> =
                points.iter().zip(&xs).map(|((_, s), &x)| (x, s.get(&id).copied().unwrap_or(0) as f64)).collect();
            let tr = analyze::fit(&pts);
            let (function, callers) = match stacks.get(&id) {
                Some(st) => culprit_and_callers(st, 4),
                None => ("[unknown]".to_string(), vec![]),
            };
            SiteSlope {
                stack: id,
                kind: kind_of(&stacks, id),
                function,
                callers,
                slope: tr.slope_bytes_per_s,
                ci95: tr.ci95_bytes_per_s,
                live_bytes: pts.last().map_or(0, |p| p.1 as u64),
            }
        })
        .collect();
    sites.sort_by(|a, b| b.slope.total_cmp(&a.slope).then(a.stack.cmp(&b.stack)));

    let mut growing = Vec::new();
    if !pass {
        let excess = slope - budget;
        let mut covered = 0.0;
        for s in &sites {
            if s.slope <= SITE_FLOOR {
                break;
            }
            let over_budget = s.slope > budget;
            let large_share = s.slope >= SITE_SHARE * slope;
            if over_budget || large_share || covered < EXCESS_SHARE * excess {
                covered += s.slope;
                growing.push(s.clone());
            }
        }
    }

    Ok(CheckResult {
        batches,
        batches_completed: completed,
        unit: unit.to_string(),
        work_probe: rec.work_probe.clone(),
        slope,
        ci95,
        significant,
        budget,
        pass,
        reason,
        growing_sites: growing,
        end_reason: rec.end_reason,
    })
}

/// Whether a `check` recording lost too many allocations to be trusted (the slope would be too
/// low, and a leak could pass): a full map or ring buffer always counts; a few missed returns or
/// reused addresses (a thread killed inside malloc) only above 1 % of the calls. Returns the
/// byte-losing counters that are not zero at the last checkpoint ("allocs_map_full 12, ..."),
/// or None when the recording can be trusted.
pub fn untrusted_losses(rec: &Recording) -> Option<String> {
    let last = rec.checkpoints.last();
    let value = |k: &str| last.and_then(|c| c.counters.get(k)).copied().unwrap_or(0);
    let full = counter::byte_losses().any(|c| c.full && value(c.name) > 0);
    let allocs = value(counter::Counter::Allocs.name());
    let other: u64 = counter::byte_losses().filter(|c| !c.full).map(|c| value(c.name)).sum();
    if !full && (other as f64) <= 0.01 * (allocs + other) as f64 {
        return None;
    }
    let lost: Vec<String> =
        counter::byte_losses().filter(|c| value(c.name) > 0).map(|c| format!("{} {}", c.name, value(c.name))).collect();
    Some(lost.join(", "))
}

/// Why a recording ended, as a phrase for messages ("the target exited", ...).
pub fn end_reason_text(r: EndReason) -> String {
    match r {
        EndReason::TargetExited => "the target exited".into(),
        EndReason::Signal => "leaktrace was interrupted".into(),
        EndReason::Duration => "the time limit was reached".into(),
        EndReason::BatchesDone => "all batches done".into(),
        other => format!("recording ended: {other}"),
    }
}

/// The culprit label of a stack and up to `n` callers' labels (non-allocator frames after it).
pub fn culprit_and_callers(st: &Stack, n: usize) -> (String, Vec<String>) {
    let (idx, label) = culprit(st);
    let callers = match idx {
        Some(i) => st.frames[i + 1..].iter().filter(|f| !is_allocator(f)).take(n).map(|f| frame_label(f)).collect(),
        None => vec![],
    };
    (label, callers)
}

/// Bytes with a sign-free suffix: plain bytes, B, KB (1000), KiB (1024), MB, MiB, GB, GiB.
/// Case-insensitive; "0" is allowed.
pub fn parse_bytes(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a byte count (examples: 0, 512, 4KiB, 1.5MB)"))?;
    let mult = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "kib" => 1024.0,
        "mb" | "m" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "gb" | "g" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("`{s}`: unknown unit `{other}` (use B, KB, KiB, MB, MiB, GB or GiB)")),
    };
    let b = v * mult;
    if !b.is_finite() {
        return Err(format!("`{s}` is too large"));
    }
    Ok(b)
}

#[cfg(test)]
pub(crate) mod test_support {
    use crate::analyze::fixtures::*;
    use crate::recording::{EndReason, Recording, Stack, StackKind};

    pub(crate) const EXE: &str = "/opt/app/bin/app";
    pub(crate) const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    /// A stack malloc ← `function` ← run_workload ← main, addresses shifted by `shift`.
    pub(crate) fn stack(id: u32, function: &str, shift: u64) -> Stack {
        let mut frames = vec![
            frame("malloc", LIBC, None),
            frame(function, EXE, Some(("/src/app.c", 10 + shift as u32))),
            frame("run_workload", EXE, Some(("/src/app.c", 100))),
            frame("main", EXE, Some(("/src/app.c", 200))),
        ];
        for f in &mut frames {
            f.addr += shift;
        }
        Stack {
            id,
            kind: StackKind::Malloc,
            frames: frames.into_iter().map(std::sync::Arc::new).collect(),
            lost: false,
            truncated: None,
            shared: false,
        }
    }

    /// A check-like recording: units go 0, 100, ... (one checkpoint per 0.5 s, 200 units/s);
    /// warm-up ends at unit 200 (batch 0), then 5 batches of 100 units. `leak` bytes leak per
    /// unit in `leak_fn`; a cache fills during the warm-up; a temporary site has 0 or 4096
    /// bytes in flight (at units 300 and 600: no net trend). Stack addresses are shifted by
    /// `shift` (a rebuild).
    pub(crate) fn batch_recording(leak: u64, leak_fn: &str, shift: u64) -> Recording {
        let times: Vec<f64> = (0..=14).map(|i| i as f64 * 0.5).collect();
        let units = |t: f64| (t * 200.0).round() as u64;
        let leak_site = stack(1, leak_fn, shift);
        let cache = stack(2, "cache_put", shift);
        let temp = stack(3, "temp_work", shift);
        let sites: Vec<(Stack, SiteFn)> = vec![
            (
                leak_site,
                Box::new(move |t: f64| {
                    // Blocks of 1000 B; leak / 1000 of them are never freed (u is a multiple
                    // of 100 and leak of 10: exact), so live blocks grow with the live bytes.
                    let u = units(t);
                    let kept = leak * u / 1000;
                    (1000 * u, u, 1000 * (u - kept), u - kept)
                }),
            ),
            (
                cache,
                Box::new(move |t: f64| {
                    let u = units(t);
                    let live = u.min(64) * 512;
                    (512 * u, u, 512 * u - live, u - u.min(64))
                }),
            ),
            (
                temp,
                Box::new(move |t: f64| {
                    let u = units(t);
                    let inflight = if u == 300 || u == 600 { 4096 } else { 0 };
                    (4096 * u + inflight, u + 1, 4096 * u, u)
                }),
            ),
        ];
        let mut rec = recording(&times, sites, &|t| mem((2 << 20) + leak * units(t)), &no_counters);
        rec.work_probe = Some("handle".into());
        for c in &mut rec.checkpoints {
            let u = units(c.t_s);
            c.units_of_work = Some(u);
            if u >= 200 && (u - 200) % 100 == 0 && u <= 700 {
                c.batch = Some(((u - 200) / 100) as u32);
            }
        }
        rec.end_reason = EndReason::BatchesDone;
        rec
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn leak_of_100_per_unit() {
        let rec = batch_recording(100, "leak_fn", 0);
        let r = evaluate(&rec, 50.0).unwrap();
        assert_eq!(r.batches.len(), 6);
        assert_eq!(r.batches_completed, 5);
        assert_eq!(r.unit, "B/unit");
        assert!((r.slope - 100.0).abs() <= 1.0, "slope {}", r.slope);
        assert!(!r.pass);
        assert!(r.significant);
        assert_eq!(r.growing_sites.len(), 1, "{:?}", r.growing_sites);
        assert_eq!(r.growing_sites[0].function, "leak_fn");
        assert!((r.growing_sites[0].slope - 100.0).abs() <= 1.0);
        let text = render(&r);
        assert!(text.contains("FAIL") && text.contains("leak_fn"), "{text}");
        assert!(text.contains("budget 50 B/unit"), "{text}");

        let r = evaluate(&rec, 200.0).unwrap();
        assert!(r.pass, "{}", r.reason);
        assert!(r.growing_sites.is_empty());
        assert!(render(&r).contains("PASS"));
        let j = check_json(&r);
        assert_eq!(j["pass"], true);
        assert_eq!(j["unit"], "B/unit");
        assert_eq!(j["batches"].as_array().unwrap().len(), 6);
    }

    #[test]
    fn flat_passes_tight_budget() {
        let rec = batch_recording(0, "leak_fn", 0);
        let r = evaluate(&rec, 1.0).unwrap();
        assert!(r.pass, "{} slope {} ci {:?}", r.reason, r.slope, r.ci95);
        assert!(r.growing_sites.is_empty());
        assert!(r.slope.abs() < 1e-9, "slope {}", r.slope);
        assert!(evaluate(&rec, 0.0).unwrap().pass);

        // Noise with a trend: 4096 B in flight at the last batch only. The slope is above
        // budget 0 but its CI includes 0: noise, not growth.
        let mut rec = batch_recording(0, "leak_fn", 0);
        for c in &mut rec.checkpoints {
            let u = c.units_of_work.unwrap();
            if u == 700 {
                let s = c.sites.iter_mut().find(|s| s.stack == 3).unwrap();
                s.alloc_bytes += 4096;
            }
        }
        let r = evaluate(&rec, 0.0).unwrap();
        assert!(r.slope > 1.0 && !r.significant && r.pass, "{r:?}");
        assert!(r.reason.contains("not significant"), "{}", r.reason);
    }

    #[test]
    fn per_second_without_work_probe() {
        let mut rec = batch_recording(100, "leak_fn", 0);
        rec.work_probe = None;
        for c in &mut rec.checkpoints {
            c.units_of_work = None;
        }
        let r = evaluate(&rec, 50.0).unwrap();
        assert_eq!(r.unit, "B/s");
        // 100 B/unit at 200 units/s.
        assert!((r.slope - 20_000.0).abs() <= 200.0, "slope {}", r.slope);
        assert!(!r.pass);
    }

    #[test]
    fn several_sites_explain_the_excess() {
        // Two leaks of 60 B/unit each, budget 100: neither alone exceeds it, both are named.
        let mut rec = batch_recording(60, "leak_a", 0);
        let mut b = stack(9, "leak_b", 0);
        std::sync::Arc::make_mut(&mut b.frames[1]).addr += 1;
        rec.stacks.push(b);
        for c in &mut rec.checkpoints {
            let u = c.units_of_work.unwrap();
            c.sites.push(crate::recording::SiteSample {
                stack: 9,
                alloc_bytes: 60 * u,
                alloc_count: u,
                ..Default::default()
            });
        }
        let r = evaluate(&rec, 100.0).unwrap();
        assert!(!r.pass);
        let names: Vec<&str> = r.growing_sites.iter().map(|s| s.function.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&"leak_a") && names.contains(&"leak_b"));
    }

    #[test]
    fn too_few_batches_is_an_error() {
        let mut rec = batch_recording(100, "leak_fn", 0);
        for c in &mut rec.checkpoints {
            if c.batch.is_some_and(|b| b > 0) {
                c.batch = None;
            }
        }
        rec.end_reason = EndReason::TargetExited;
        let e = evaluate(&rec, 50.0).unwrap_err().to_string();
        assert!(e.contains("only the baseline") && e.contains("exited"), "{e}");
        for c in &mut rec.checkpoints {
            c.batch = None;
        }
        let e = evaluate(&rec, 50.0).unwrap_err().to_string();
        assert!(e.contains("warm-up did not complete"), "{e}");
    }

    #[test]
    fn units_must_advance() {
        let mut rec = batch_recording(100, "leak_fn", 0);
        for c in &mut rec.checkpoints {
            c.units_of_work = Some(5);
        }
        assert!(evaluate(&rec, 50.0).unwrap_err().to_string().contains("counted no call"));
    }

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_bytes("0").unwrap(), 0.0);
        assert_eq!(parse_bytes("100").unwrap(), 100.0);
        assert_eq!(parse_bytes("100B").unwrap(), 100.0);
        assert_eq!(parse_bytes("4KiB").unwrap(), 4096.0);
        assert_eq!(parse_bytes("4 KB").unwrap(), 4000.0);
        assert_eq!(parse_bytes("1.5MB").unwrap(), 1.5e6);
        assert_eq!(parse_bytes("2MiB").unwrap(), 2.0 * 1024.0 * 1024.0);
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn lost_allocations_make_the_test_untrusted() {
        let mut rec = batch_recording(100, "leak_it", 0);
        let set = |rec: &mut Recording, k: &str, v: u64| {
            rec.checkpoints.last_mut().unwrap().counters.insert(k.to_string(), v);
        };
        set(&mut rec, "allocs", 10_000);
        assert_eq!(untrusted_losses(&rec), None);
        set(&mut rec, "stacks_map_full", 5);
        assert_eq!(untrusted_losses(&rec), None, "lost stacks keep their bytes");
        set(&mut rec, "missed_return", 100);
        assert_eq!(untrusted_losses(&rec), None, "1 % of the calls or less");
        set(&mut rec, "missed_return", 102);
        assert_eq!(untrusted_losses(&rec).as_deref(), Some("missed_return 102"));
        set(&mut rec, "missed_return", 1);
        set(&mut rec, "sites_map_full", 1);
        assert_eq!(untrusted_losses(&rec).as_deref(), Some("sites_map_full 1, missed_return 1"));
    }
}
