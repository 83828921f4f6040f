//! Which frame of a stack is its culprit, and how frames are labelled in reports.

use crate::allocator_frames::is_allocator_frame;
use crate::recording::{Frame, Stack, StackKind};

/// Label of a frame: its function name, else `basename(object)+0xaddr`, else `0xaddr`.
pub fn frame_label(f: &Frame) -> String {
    match (&f.function, &f.object) {
        (Some(func), _) if !func.is_empty() => func.clone(),
        (_, Some(obj)) => format!("{}+{:#x}", basename(obj), f.addr),
        _ => format!("{:#x}", f.addr),
    }
}

/// Last path component of `path` (the whole string when it has no '/').
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// True when `f` is an allocator-internal frame (by function name).
pub fn is_allocator(f: &Frame) -> bool {
    f.function.as_deref().is_some_and(is_allocator_frame)
}

/// The culprit frame of a stack: innermost non-allocator named frame (for a mapping, also not
/// libc's mmap or syscall wrapper: [`crate::allocator_frames::is_mapping_frame`]); else innermost named
/// frame; else the innermost frame (labelled by object and address). Returns (index, label).
pub fn culprit(stack: &Stack) -> (Option<usize>, String) {
    let named = |f: &Frame| f.function.as_deref().is_some_and(|n| !n.is_empty());
    let wrapper = |f: &Frame| {
        stack.kind == StackKind::Mmap && f.function.as_deref().is_some_and(crate::allocator_frames::is_mapping_frame)
    };
    let idx = stack
        .frames
        .iter()
        .position(|f| named(f) && !is_allocator(f) && !wrapper(f))
        .or_else(|| stack.frames.iter().position(named))
        .or(if stack.frames.is_empty() { None } else { Some(0) });
    match idx {
        Some(i) => (Some(i), frame_label(&stack.frames[i])),
        None if stack.lost => (None, "[stack lost]".to_string()),
        None => (None, "[unknown]".to_string()),
    }
}
