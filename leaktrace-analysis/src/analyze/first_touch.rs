//! Growth mode's fault sites that touched their page inside the allocator.
//!
//! In growth mode a page is charged to the call stack that first touches it. When that stack
//! runs inside malloc (the allocator writing a chunk header at the top of its heap, or copying a
//! block in `realloc`), the function charged is whoever asked the allocator for memory at the
//! moment the heap reached a new page — not the code that keeps memory: a program leaking small
//! strings beside a per-request buffer that it frees has its leak's pages first touched by the
//! buffer's (re)allocation. Such a site is "pages first touched under F", never a leak culprit
//! with a missing-release hint; an exact window (escalation) names the allocating function.

use crate::recording::{EndReason, Recording, Stack, StackKind};

use super::frames::is_allocator;
use super::{Analysis, ProcessClass, Reason, Verdict};

/// Shortest exact window (growth mode's escalation) whose verdict is taken, seconds.
pub const MIN_EXACT_WINDOW_S: f64 = 2.0;
/// Fewest checkpoints of an exact window whose verdict is taken.
pub const MIN_EXACT_CHECKPOINTS: usize = 5;

/// Judge growth mode's exact window as a window: one that ended by anything but its
/// duration (SIGINT, the target exiting) or is shorter than [`MIN_EXACT_WINDOW_S`] or
/// [`MIN_EXACT_CHECKPOINTS`] gets an inconclusive verdict saying so ([`Reason::ExactWindowCut`])
/// instead of what its few checkpoints fit. `e`: the analysis of `rec`, the window's recording.
pub(super) fn judge_exact_window(e: &mut Analysis, rec: &Recording) {
    let cut = rec.end_reason != EndReason::Duration;
    if !cut && e.duration_s >= MIN_EXACT_WINDOW_S && e.checkpoints >= MIN_EXACT_CHECKPOINTS {
        return;
    }
    e.verdict = Verdict {
        class: ProcessClass::Flat,
        confidence: 0.1,
        inconclusive: true,
        reason: Reason::ExactWindowCut {
            end_reason: rec.end_reason.to_string(),
            duration_s: e.duration_s,
            checkpoints: e.checkpoints,
        },
        by_kind: None,
        losses: None,
    };
}

/// A growth-mode verdict that names growth through the allocator (its top site first touched
/// or mapped its pages inside the allocator) whose exact window could not answer
/// ([`judge_exact_window`]) is inconclusive, not a leak: growth mode cannot tell leaked blocks
/// from freed memory the allocator keeps. The sentence keeps both parts.
pub(super) fn judge_growth_through_allocator(a: &mut Analysis) {
    let Some(e) = a.escalation.as_deref() else { return };
    let through = match a.verdict.reason {
        Reason::Leaks { top, .. } => a.sites.get(top).is_some_and(|s| s.first_touch_in.is_some()),
        _ => false,
    };
    if through && matches!(e.verdict.reason, Reason::ExactWindowCut { .. }) {
        a.verdict.class = ProcessClass::Flat;
        a.verdict.inconclusive = true;
        a.verdict.confidence = a.verdict.confidence.min(0.2);
    }
}

/// The allocator function inside which a growth-mode fault site first touched its pages (the
/// outermost allocator frame inward of the culprit, e.g. `_int_realloc`), for a fault site
/// whose stack passes through the allocator; None for any other site (a malloc or mmap site,
/// or a fault in the program's own code, such as a `memset` of a block it allocated).
pub(super) fn first_touch_in(st: &Stack, culprit_frame: Option<usize>) -> Option<String> {
    if st.kind != StackKind::Fault {
        return None;
    }
    let inner = &st.frames[..culprit_frame.unwrap_or(st.frames.len()).min(st.frames.len())];
    inner.iter().find(|f| is_allocator(f)).and_then(|f| f.function.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame_origin::tests::{LIBC, stack};

    #[test]
    fn a_fault_inside_realloc_under_getline_is_a_first_touch_in_the_allocator() {
        let st = stack(
            StackKind::Fault,
            &[
                ("_int_realloc", LIBC),
                ("__GI___libc_realloc", LIBC),
                ("__GI___getdelim", LIBC),
                ("handle_request", "/srv/app"),
                ("main", "/srv/app"),
            ],
        );
        assert_eq!(first_touch_in(&st, Some(3)).as_deref(), Some("_int_realloc"));
        // The same stack as a malloc site, or a fault in the program's own code, is not.
        assert_eq!(first_touch_in(&Stack { kind: StackKind::Malloc, ..st.clone() }, Some(3)), None);
        let own = stack(StackKind::Fault, &[("memset", LIBC), ("fill_buffer", "/srv/app")]);
        assert_eq!(first_touch_in(&own, Some(1)), None);
    }
}
