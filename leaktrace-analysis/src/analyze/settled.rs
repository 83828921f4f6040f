//! Warm-up told from a small leak: a process that fills a few small structures early (a symbol
//! table, a pool of connections) and then only churns shows a small growth over a short
//! recording. When every leaking site together grows by a sliver of what the process allocates
//! (below [`SETTLED_ALLOC_SHARE`]) and none reaches a new high in the last third of the analysed
//! span, the growth stopped: the sites are warm-up, not leaks (classed as caches, the verdict
//! says "inconclusive: warm-up"). A small leak that keeps rising through the last third stays a
//! leak.

use super::{SiteAnalysis, SiteClass};

/// The leaking sites' growth together must be below this share of the process's allocation rate
/// (bytes allocated per second by every site) to be judged warm-up.
pub(super) const SETTLED_ALLOC_SHARE: f64 = 1e-3;

/// The part of the analysed span, at its end, in which a site that keeps growing reaches a new
/// high.
pub(super) const LAST_PART: f64 = 1.0 / 3.0;

/// A site keeps growing when its high in the last part exceeds its high before by at least this
/// share of what its slope predicts over the last part.
pub(super) const LATE_RISE_SHARE: f64 = 0.25;

/// How a site's live bytes moved around the last part of the span: its high before the last
/// part, its high in it, and the time of its last new high (seconds since the span's start).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct LastPart {
    pub(super) high_before: u64,
    pub(super) high_in: u64,
    pub(super) last_rise_s: f64,
    /// Seconds from the span's start to the last part's start, and the last part's length.
    pub(super) from_s: f64,
    pub(super) len_s: f64,
}

/// `live` (per checkpoint at `times`) over `span` seen around its last part; None when the span
/// has fewer than 3 checkpoints or no length.
pub(super) fn last_part(times: &[f64], live: &[u64], span: std::ops::Range<usize>) -> Option<LastPart> {
    let (a, b) = (span.start.min(times.len()).min(live.len()), span.end.min(times.len()).min(live.len()));
    if b < a + 3 {
        return None;
    }
    let (t0, t1) = (times[a], times[b - 1]);
    let len = (t1 - t0) * LAST_PART;
    if len <= 0.0 {
        return None;
    }
    let cut = t1 - len;
    let (mut high_before, mut high_in, mut high, mut last_rise_s) = (0u64, 0u64, 0u64, 0.0);
    for k in a..b {
        let v = live[k];
        if times[k] < cut {
            high_before = high_before.max(v);
        } else {
            high_in = high_in.max(v);
        }
        if v > high {
            high = v;
            last_rise_s = times[k] - t0;
        }
    }
    Some(LastPart { high_before, high_in, last_rise_s, from_s: cut - t0, len_s: len })
}

impl LastPart {
    /// The site reached a new high in the last part by at least [`LATE_RISE_SHARE`] of what
    /// `slope` (bytes per second) predicts over it (and by at least one byte).
    pub(super) fn keeps_growing(&self, slope: f64) -> bool {
        let rise = self.high_in.saturating_sub(self.high_before) as f64;
        rise > 0.0 && rise >= LATE_RISE_SHARE * slope.max(0.0) * self.len_s
    }
}

/// Leaking sites turned into warm-up ([`settle_warm_up`]).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Settled {
    /// Their stack ids.
    pub(super) ids: Vec<u32>,
    /// Their growth together over the steady window, and the process's allocation rate, bytes
    /// per second.
    pub(super) bytes_per_s: f64,
    pub(super) allocated_bytes_per_s: f64,
    /// The latest of their last new highs, and the start of the last part, seconds since the
    /// span's start.
    pub(super) last_rise_s: f64,
    pub(super) last_part_from_s: f64,
}

/// Turns leaking sites into warm-up (class cache) when, together, they grow below
/// [`SETTLED_ALLOC_SHARE`] of the process's allocation rate and none keeps growing in the last
/// part of `span` (checkpoint indexes into `times`; `duration` seconds). `sites[i]`'s live bytes
/// at each checkpoint are `live[i]`. None when no site was turned.
pub(super) fn settle_warm_up(
    sites: &mut [SiteAnalysis],
    live: &[&[u64]],
    times: &[f64],
    span: std::ops::Range<usize>,
    duration: f64,
) -> Option<Settled> {
    if duration <= 0.0 {
        return None;
    }
    let leaking: Vec<usize> = (0..sites.len().min(live.len())).filter(|&i| sites[i].class == SiteClass::Leak).collect();
    if leaking.is_empty() {
        return None;
    }
    let allocated: u64 = sites.iter().map(|s| s.allocated_bytes).sum();
    let alloc_rate = allocated as f64 / duration;
    let growth: f64 = leaking.iter().map(|&i| sites[i].growth_bytes_per_s.max(0.0)).sum();
    if growth >= SETTLED_ALLOC_SHARE * alloc_rate {
        return None;
    }
    let mut parts = Vec::with_capacity(leaking.len());
    for &i in &leaking {
        let p = last_part(times, live[i], span.clone())?;
        if p.keeps_growing(sites[i].growth_bytes_per_s) {
            return None;
        }
        parts.push((i, p));
    }
    for (i, p) in &parts {
        let s = &mut sites[*i];
        s.class = SiteClass::Cache;
        s.confidence = s.confidence.min(0.5);
        s.evidence.reason = format!(
            "warm-up: grew {:.1} B/s over the steady window but reached its last high {:.1} s into the \
             recording and none in its last third (from {:.1} s), while the process allocates {}/s: \
             {:.4} % of it; not counted as a leak (inconclusive: record longer to see it stay level); {}",
            s.growth_bytes_per_s,
            p.last_rise_s,
            p.from_s,
            crate::human::bytes(alloc_rate as u64),
            100.0 * growth / alloc_rate.max(1.0),
            s.evidence.reason
        );
    }
    Some(Settled {
        ids: parts.iter().map(|(i, _)| sites[*i].id).collect(),
        bytes_per_s: growth,
        allocated_bytes_per_s: alloc_rate,
        last_rise_s: parts.iter().map(|(_, p)| p.last_rise_s).fold(0.0, f64::max),
        last_part_from_s: parts.first().map_or(0.0, |(_, p)| p.from_s),
    })
}
