//! Growth mode's fault sites that touched their page inside the allocator (issue 34).
//!
//! In growth mode a page is charged to the call stack that first touches it. When that stack
//! runs inside malloc (the allocator writing a chunk header at the top of its heap, or copying a
//! block in `realloc`), the function charged is whoever asked the allocator for memory at the
//! moment the heap reached a new page — not the code that keeps memory: a program leaking small
//! strings beside a per-request buffer that it frees has its leak's pages first touched by the
//! buffer's (re)allocation. Such a site is "pages first touched under F", never a leak culprit
//! with a missing-release hint; an exact window (escalation) names the allocating function.

use crate::recording::{Stack, StackKind};

use super::frames::is_allocator;

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
    use crate::recording::Frame;
    use std::sync::Arc;

    fn frame(function: &str, object: &str) -> Arc<Frame> {
        Arc::new(Frame { function: Some(function.to_string()), object: Some(object.to_string()), ..Default::default() })
    }

    fn stack(kind: StackKind, names: &[(&str, &str)]) -> Stack {
        Stack { id: 1, kind, frames: names.iter().map(|(f, o)| frame(f, o)).collect(), lost: false, truncated: None }
    }

    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

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
