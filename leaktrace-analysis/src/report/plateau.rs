//! The load-spike plateau's clause of the verdict: RSS raised in steps by
//! load spikes and flat between them, named with its steps and the allocator's knob.

use crate::analyze::plateau::{Plateau, knob};
use crate::analyze::{Analysis, ProcessClass, Reason};
use crate::human::bytes as hb;

/// "RSS (anon) rose in 3 steps of ~8.0 MiB at load spikes at t=4.2 s, 8.3 s, 12.5 s (bursts of
/// 8.0–32.0 MiB allocated, most by spike), flat between: the allocator keeps the peak's pages —
/// a plateau raised by load, not a leak (live bytes 4.0 KiB at the start, 521.0 KiB between
/// spikes, peak 32.5 MiB); knob: …"; None when no plateau was found or the verdict is a leak. The knob is
/// left out when the verdict already names it (allocator retention).
pub fn clause(a: &Analysis) -> Option<String> {
    let p = a.plateau.as_ref()?;
    if matches!(a.verdict.class, ProcessClass::Leak | ProcessClass::OffHeap) {
        return None;
    }
    let knob = match a.verdict.reason {
        Reason::Retention { .. } | Reason::AllocatorRetains { .. } => String::new(),
        _ => format!("; knob: {}", knob(a.summary.allocator_family)),
    };
    Some(format!("{}{knob}", phrase(p)))
}

/// The clause without the knob.
pub fn phrase(p: &Plateau) -> String {
    let n = p.steps.len();
    let mean = p.steps.iter().map(|s| s.bytes).sum::<u64>() / n.max(1) as u64;
    let mut at: Vec<String> = p.steps.iter().take(6).map(|s| format!("{:.1} s", s.t_s)).collect();
    if n > 6 {
        at.push(format!("and {} more", n - 6));
    }
    let lo = p.steps.iter().map(|s| s.allocated_bytes).min().unwrap_or(0);
    let hi = p.steps.iter().map(|s| s.allocated_bytes).max().unwrap_or(0);
    let burst = if hb(lo) == hb(hi) { hb(hi) } else { format!("{}–{}", hb(lo), hb(hi)) };
    // The function that allocated most over the steps.
    let mut tops: Vec<(&str, u64)> = Vec::new();
    for s in &p.steps {
        let Some(f) = s.top_function.as_deref() else { continue };
        match tops.iter_mut().find(|t| t.0 == f) {
            Some(t) => t.1 += s.top_allocated_bytes,
            None => tops.push((f, s.top_allocated_bytes)),
        }
    }
    let by = tops.iter().max_by_key(|t| t.1).map_or(String::new(), |t| format!(", most by {}", t.0));
    format!(
        "RSS (anon) rose in {n} steps of ~{} at load spikes at t={} (bursts of {burst} allocated{by}), flat between \
         (+{} outside the steps; RSS anon {} → {}): the allocator keeps the peak's pages — a plateau raised by \
         load, not a leak (live bytes {} at the start, {} between spikes, peak {})",
        hb(mean),
        at.join(", "),
        hb(p.between_bytes),
        hb(p.rss_anon_start_bytes),
        hb(p.rss_anon_late_bytes),
        hb(p.live_start_bytes),
        hb(p.live_between_bytes),
        hb(p.live_peak_bytes),
    )
}
