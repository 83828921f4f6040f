//! A leak allocated through a small constructor (`make_record`, `Node::new`) called from several
//! places is named after the caller that holds its growth, the way a flame graph is read: the
//! constructor's other callers free what they make, and naming the constructor sends the reader
//! to every one of them.

use super::{SiteAnalysis, SiteClass, frame_label};
use crate::recording::Frame;

/// Share of the growth of the sites through a frame that one of its callers must hold for the
/// leak to be named after that caller.
pub(super) const CONCENTRATED_SHARE: f64 = 0.8;

/// At most this many frames are climbed above the allocating frame.
const MAX_HOPS: usize = 8;

/// The same frame for the reader: the same function in the same object.
fn same(a: &Frame, b: &Frame) -> bool {
    a.function.is_some() && a.function == b.function && a.object == b.object
}

/// For every leak: from its named frame, while that frame is called from two or more places
/// (among all sites whose stacks from their named frame read the same so far), one caller's
/// sites hold at least [`CONCENTRATED_SHARE`] of their growth (live bytes gained, positive
/// ones) and the other callers free at least half of what they allocate through it (the frame's
/// result is the caller's to free: a frame that loses its own blocks, whoever calls it, keeps
/// the name), the leak is named after that caller instead. The reason says through which frame.
pub(super) fn name_concentrated_callers(sites: &mut [SiteAnalysis]) {
    for li in 0..sites.len() {
        if sites[li].class != SiteClass::Leak {
            continue;
        }
        let Some(c) = sites[li].culprit_frame else { continue };
        let frames = sites[li].frames.clone();
        let mut k = c;
        let mut through = Vec::new();
        while k + 1 < frames.len() && k - c < MAX_HOPS {
            let depth = k - c;
            // Sites through frames[c..=k] (from their own named frame), by their next frame.
            let mut callers: Vec<(&Frame, f64, usize)> = Vec::new();
            // What the sites of each caller allocated and freed, bytes (same order as `callers`).
            let mut churn: Vec<(u64, u64)> = Vec::new();
            for s in sites.iter().filter(|s| s.kind == sites[li].kind) {
                let Some(sc) = s.culprit_frame else { continue };
                let Some(next) = s.frames.get(sc + depth + 1) else { continue };
                if !(0..=depth).all(|d| s.frames.get(sc + d).is_some_and(|f| same(f, &frames[c + d]))) {
                    continue;
                }
                let g = s.growth_bytes.max(0) as f64;
                match callers.iter().position(|(f, _, _)| same(f, next)) {
                    Some(i) => {
                        callers[i].1 += g;
                        callers[i].2 += 1;
                        churn[i].0 += s.allocated_bytes;
                        churn[i].1 += s.freed_bytes;
                    }
                    None => {
                        callers.push((next, g, 1));
                        churn.push((s.allocated_bytes, s.freed_bytes));
                    }
                }
            }
            let total: f64 = callers.iter().map(|e| e.1).sum();
            let mine = callers.iter().position(|(f, _, _)| same(f, &frames[k + 1]));
            let share = mine.map_or(0.0, |i| callers[i].1 / total.max(1.0));
            let (others_allocated, others_freed) = churn
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != mine)
                .fold((0u64, 0u64), |acc, (_, c)| (acc.0.saturating_add(c.0), acc.1.saturating_add(c.1)));
            let others_free = others_allocated > 0 && others_freed.saturating_mul(2) >= others_allocated;
            if callers.len() < 2 || share < CONCENTRATED_SHARE || !others_free {
                break;
            }
            through.push((frame_label(&frames[k]), callers.len(), share));
            k += 1;
        }
        if k > c {
            let s = &mut sites[li];
            s.culprit_frame = Some(k);
            s.function = frame_label(&frames[k]);
            let hops: Vec<String> = through
                .iter()
                .map(|(f, n, share)| {
                    format!(
                        "{f} is called from {n} places and this caller holds {:.0} % of their growth",
                        share * 100.0
                    )
                })
                .collect();
            s.evidence.reason.push_str(&format!(
                "; named after its caller {} (allocated through {}): {}",
                s.function,
                through.iter().map(|t| t.0.as_str()).collect::<Vec<_>>().join(" ← "),
                hops.join("; ")
            ));
        }
    }
}
