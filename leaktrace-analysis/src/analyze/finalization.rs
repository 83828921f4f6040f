//! A process's finalization seen in its counters: an attached (`--pid`) process is not held at
//! its teardown, so its recording has no teardown checkpoint; when it exits, its runtime's
//! finalization (CPython's `Py_FinalizeEx` under `--pymalloc`, static destructors) frees what it
//! held, mostly blocks allocated before attach (the kernel side's `untracked_free` counter),
//! for as long as seconds under load. Those seconds are not the running program: a leak's site
//! stops allocating there, and its series' last part looks flat (a cache). This finds where
//! such a final surge of untracked frees began, so the analysis ends there, as it ends at a
//! launched command's teardown.

use crate::recording::{EndReason, Recording};
use crate::timeline::Timeline;

/// The kernel-side counter of frees of blocks not in the block tables (allocated before attach).
const UNTRACKED_FREE: &str = "untracked_free";
/// Least untracked frees in a surge (a finalization frees the process's objects: thousands).
const MIN_FREES: u64 = 1_000;
/// Share of the recording's untracked frees that the surge holds.
const SHARE: f64 = 0.9;
/// The surge's rate of untracked frees is at least this many times the rate before it.
const RATE_FACTOR: f64 = 10.0;
/// The surge lasts at most this share of the recording.
const MAX_SPAN: f64 = 0.5;
/// Checkpoints left before the surge, at least (growth needs a series).
const MIN_HEAD: usize = 3;

/// Where the finalization of a process that exited began: the position in `tl` of the last
/// checkpoint before a final surge of untracked frees (at least [`MIN_FREES`], [`SHARE`] of all
/// of the recording's, at [`RATE_FACTOR`] times the rate before, over at most [`MAX_SPAN`] of
/// the recording, the recording's last checkpoint after it). None when the process did not exit
/// while recorded, or no such surge ends the recording.
pub(super) fn start(rec: &Recording, tl: &Timeline) -> Option<usize> {
    if rec.end_reason != EndReason::TargetExited {
        return None;
    }
    let n = tl.order.len();
    if n < MIN_HEAD + 1 {
        return None;
    }
    let u: Vec<u64> =
        tl.order.iter().map(|&i| rec.checkpoints[i].counters.get(UNTRACKED_FREE).copied().unwrap_or(0)).collect();
    let t = &tl.times;
    let total = u[n - 1].saturating_sub(u[0]);
    // The latest checkpoint after which SHARE of the untracked frees came.
    let c = (0..n - 1).rev().find(|&c| u[n - 1].saturating_sub(u[c]) as f64 >= SHARE * total as f64)?;
    let surge = u[n - 1].saturating_sub(u[c]);
    let (span, head) = (t[n - 1] - t[c], t[c] - t[0]);
    if c + 1 < MIN_HEAD || surge < MIN_FREES || span <= 0.0 || head <= 0.0 || span > MAX_SPAN * (span + head) {
        return None;
    }
    let before = u[c].saturating_sub(u[0]) as f64 / head;
    (surge as f64 / span >= RATE_FACTOR * before).then_some(c)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::fixtures::*;
    use super::super::{AnalyzeOptions, ProcessClass, SiteClass, analyze};
    use crate::recording::EndReason;

    /// An attached process (no teardown checkpoint) that leaks 1,000 B/s for 10 s, then exits:
    /// its finalization frees blocks allocated before attach for 2.7 s (untracked frees 494 →
    /// 38,363, as in the flaky e2e run under load), the leak site flat meanwhile, and the last
    /// checkpoint after exit. The analysis ends where the surge began: a leak, at its rate;
    /// without the cut the flat last fifth made it a cache. A steady stream of untracked frees
    /// (no surge) is not cut.
    #[test]
    fn an_attached_process_is_judged_up_to_its_finalization() {
        let mut times: Vec<f64> = (0..=20).map(|k| k as f64 * 0.5).collect();
        times.extend([10.5, 11.0, 11.5, 12.0, 12.5, 12.7]);
        let leak: SiteFn = Box::new(|t: f64| {
            let n = (t.min(10.0) * 10.0).round() as u64;
            (100 * n, n, 0, 0)
        });
        let build = |untracked: &dyn Fn(f64) -> u64| {
            let counters = |t: f64| BTreeMap::from([("untracked_free".to_string(), untracked(t))]);
            let leak: SiteFn = Box::new({
                let v: Vec<(f64, (u64, u64, u64, u64))> = times.iter().map(|&t| (t, leak(t))).collect();
                move |t: f64| v.iter().find(|p| p.0 == t).map_or((0, 0, 0, 0), |p| p.1)
            });
            let mut r =
                recording(&times, vec![(server_stack(1, "remember_request"), leak)], &|_| mem(1 << 20), &counters);
            r.end_reason = EndReason::TargetExited;
            r.target.launched = false;
            r
        };
        let surge = |t: f64| {
            if t <= 10.0 { (t * 49.4) as u64 } else { 494 + ((t - 10.0) / 2.7 * 37_869.0) as u64 }
        };
        let a = analyze(&build(&surge), &AnalyzeOptions::default());
        let site = a.sites.iter().find(|s| s.function == "remember_request").unwrap();
        assert_eq!(site.class, SiteClass::Leak, "{:?}", a.verdict.reason);
        assert!((site.growth_bytes_per_s - 1000.0).abs() < 50.0, "{}", site.growth_bytes_per_s);
        assert_eq!(a.verdict.class, ProcessClass::Leak, "{:?}", a.verdict.reason);
        assert!((a.span_to_s - 10.0).abs() < 1e-9, "{}", a.span_to_s);
        assert!(
            a.warnings.iter().any(|w| w.starts_with("the process's finalization (from 10.0 s")),
            "{:?}",
            a.warnings
        );

        // The same untracked frees spread evenly over the recording: no finalization, no cut.
        let steady = |t: f64| (t / 12.7 * 38_363.0) as u64;
        let a = analyze(&build(&steady), &AnalyzeOptions::default());
        assert!((a.span_to_s - 12.7).abs() < 1e-9, "{}", a.span_to_s);
        assert!(a.freed_at_exit.is_none());
    }
}
