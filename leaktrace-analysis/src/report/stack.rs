//! A site's call stack in report.md's words: one line per frame (`function (file:line)
//! [object]`), the culprit first, the allocator frames inside it summarised
//! ([`stack_lines`]). Shared by report.md's sections (markdown.rs, escalation.rs).

use std::fmt::Write as _;

use crate::analyze::{SiteAnalysis, basename, frame_label, is_allocator};
use crate::recording::Frame;

/// Most frames printed per stack (callers beyond are summarised).
pub const MAX_FRAMES: usize = 16;

/// Last two components of a source path ("src/server.c").
fn short_file(path: &str) -> &str {
    let mut it = path.rmatch_indices('/');
    match (it.next(), it.next()) {
        (Some(_), Some((i, _))) => &path[i + 1..],
        _ => path,
    }
}

/// `function (file:line) [object]`, with " (inlined)" for an inlined frame; `[py] function
/// (file:line)` for a Python frame.
pub fn frame_line(f: &Frame) -> String {
    if f.kind == crate::recording::FrameKind::Python {
        // `[py] handle (app.py:42)`: the label has the location already.
        return format!("[py] {}", frame_label(f));
    }
    let mut s = frame_label(f);
    match (&f.file, f.line) {
        (Some(file), Some(line)) => {
            let _ = write!(s, " ({}:{line})", short_file(file));
        }
        (Some(file), None) => {
            let _ = write!(s, " ({})", short_file(file));
        }
        _ => {}
    }
    if let (Some(o), Some(_)) = (&f.object, &f.function) {
        let _ = write!(s, " [{}]", basename(o));
    }
    if f.inlined {
        s.push_str(" (inlined)");
    }
    s
}

/// The stack of a site for humans: culprit first, then its callers (outward); allocator frames
/// inside the culprit are summarised on a `via` line.
pub fn stack_lines(site: &SiteAnalysis) -> Vec<String> {
    if site.frames.is_empty() {
        return vec![if site.stack_lost {
            "[stack lost: the kernel could not capture this call stack]".into()
        } else {
            "[unknown stack]".into()
        }];
    }
    let start = site.culprit_frame.unwrap_or(0).min(site.frames.len() - 1);
    let mut out = Vec::new();
    let shown = &site.frames[start..];
    for f in shown.iter().take(MAX_FRAMES) {
        out.push(frame_line(f));
    }
    if shown.len() > MAX_FRAMES {
        out.push(format!("… {} more caller frame(s)", shown.len() - MAX_FRAMES));
    }
    if let Some(why) = &site.stack_truncated {
        out.push(format!("[stack truncated: {why}]"));
    }
    if start > 0 {
        let via: Vec<String> = site.frames[..start].iter().rev().map(|f| frame_label(f)).collect();
        let what = if site.frames[..start].iter().all(|f| is_allocator(f)) { "via" } else { "called into" };
        out.push(format!("({what} {})", via.join(" → ")));
    }
    out
}
