//! The scale of a leak: what its rate means for the process — bytes a day,
//! its share of RSS, and the time until the memory cgroup's limit at this rate — so that a leak
//! that would take years to matter reads as such.

use serde::Serialize;

use super::{Analysis, KindReason, MemoryKind, ProcessClass, Reason};

/// A leak verdict's scale.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scale {
    /// The leak's rate (the verdict's leaking group, or the growing kind's series), bytes per
    /// second.
    pub bytes_per_s: f64,
    /// The same per day (× 86,400), bytes.
    pub bytes_per_day: f64,
    /// What the leak holds at the end (its sites' live bytes; the growing kind's series), bytes.
    pub held_bytes: u64,
    /// `held_bytes` / RSS at the end (0..), None without memory figures.
    pub share_of_rss: Option<f64>,
    /// The target's memory cgroup limit (smallest of memory.max / memory.limit_in_bytes up its
    /// hierarchy), bytes; None: no limit (or older recordings).
    pub memory_limit_bytes: Option<u64>,
    /// Seconds until RSS reaches that limit at this rate ((limit − RSS at the end) / rate; 0 when
    /// RSS is already above it); None without a limit.
    pub seconds_to_limit: Option<f64>,
}

/// The scale of `a`'s verdict when it is a leak (class leak or off-heap, or a kind that grows),
/// with the target's cgroup memory limit `limit`; None otherwise.
pub fn scale(a: &Analysis, limit: Option<u64>) -> Option<Scale> {
    if !matches!(a.verdict.class, ProcessClass::Leak | ProcessClass::OffHeap) {
        return None;
    }
    let kind_series =
        |k: MemoryKind| a.kinds.iter().find(|g| g.kind == k).map(|g| (g.trend.slope_bytes_per_s, g.end_bytes));
    let (rate, held) = match (&a.verdict.by_kind, &a.verdict.reason) {
        (Some(KindReason::ManagedLeak), _) => kind_series(MemoryKind::Managed)?,
        (Some(KindReason::KindGrows { kind }), _) => kind_series(*kind)?,
        (_, Reason::Leaks { offheap, total_bytes_per_s, .. }) => {
            let held = a
                .sites
                .iter()
                .filter(|s| s.class == super::SiteClass::Leak && super::verdict::is_offheap_mapping(s) == *offheap)
                .map(|s| s.resident_bytes.unwrap_or(s.live_bytes))
                .sum();
            (*total_bytes_per_s, held)
        }
        _ => return None,
    };
    if rate.is_nan() || rate <= 0.0 {
        return None;
    }
    let rss = a.summary.rss_end_bytes;
    Some(Scale {
        bytes_per_s: rate,
        bytes_per_day: rate * 86_400.0,
        held_bytes: held,
        share_of_rss: rss.filter(|r| *r > 0).map(|r| held as f64 / r as f64),
        memory_limit_bytes: limit,
        seconds_to_limit: limit.map(|l| l.saturating_sub(rss.unwrap_or(0)) as f64 / rate),
    })
}

/// "1.2 KiB/day" style duration words: "3.2 hours", "12 days", "4.1 years".
pub fn duration_words(s: f64) -> String {
    const DAY: f64 = 86_400.0;
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 2.0 * 3600.0 {
        format!("{:.0} minutes", s / 60.0)
    } else if s < 2.0 * DAY {
        format!("{:.1} hours", s / 3600.0)
    } else if s < 365.0 * DAY {
        format!("{:.0} days", s / DAY)
    } else {
        format!("{:.1} years", s / (365.25 * DAY))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_the_unit_that_matters() {
        assert_eq!(duration_words(30.0), "30 s");
        assert_eq!(duration_words(600.0), "10 minutes");
        assert_eq!(duration_words(5.0 * 3600.0), "5.0 hours");
        assert_eq!(duration_words(12.0 * 86_400.0), "12 days");
        assert_eq!(duration_words(3.0 * 365.25 * 86_400.0), "3.0 years");
    }
}
