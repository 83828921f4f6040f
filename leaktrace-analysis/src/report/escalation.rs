//! Growth mode's escalation in the reports: the pages a growth-mode fault site
//! first touched inside the allocator, and the exact-mode window that names the function whose
//! blocks hold them ([`crate::recording::Recording::escalation`]).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::analyze::{Analysis, SiteAnalysis, SiteClass};
use crate::human::{bytes, exact, rate};

/// Sites of the exact window listed in report.md and report.json.
const SITES_SHOWN: usize = 5;

/// The report.md line of a growth-mode site that first touched its pages inside the allocator:
/// what the attribution means. None for other sites.
pub fn first_touch_line(s: &SiteAnalysis) -> Option<String> {
    let alloc = s.first_touch_in.as_ref()?;
    if s.kind == crate::recording::StackKind::Mmap {
        return Some(format!(
            "- mapped by the allocator ({alloc}): the allocator maps memory for the blocks it hands out, \
             here while {} asked it for one; these are the allocator's pages (heap growth), not memory \
             {} maps itself; growth mode cannot tell leaked blocks from freed memory the allocator keeps \
             (an exact window names the allocating function)",
            s.function, s.function
        ));
    }
    Some(format!(
        "- first touched inside the allocator ({alloc}): growth mode charges a page to the code that \
         first touches it, here whoever asked malloc for memory when its heap reached a new page; \
         these are pages first touched under {}, not memory it holds (an exact window names the \
         allocating function)",
        s.function
    ))
}

/// The exact window's sites worth showing: growing ones first (by growth), then the largest.
fn shown(e: &Analysis) -> Vec<&SiteAnalysis> {
    let mut v: Vec<&SiteAnalysis> = e.top_by_growth();
    v.retain(|s| s.class == SiteClass::Leak || s.growth_bytes_per_s > 0.0);
    v.truncate(SITES_SHOWN);
    v
}

/// Allocator calls the exact window traced (allocations, all sites).
fn calls(e: &Analysis) -> u64 {
    e.sites.iter().map(|s| s.allocations).sum()
}

/// report.md's "Exact window (escalation)" section; nothing without an escalation.
pub fn escalation_md(md: &mut String, a: &Analysis) {
    let Some(e) = a.escalation.as_deref() else { return };
    let _ = writeln!(md, "## Exact window (escalation)\n");
    let _ = writeln!(
        md,
        "Growth mode saw memory grow through the allocator, which names no holder, so leaktrace traced \
         every allocator call of this process for {:.1} s after the growth-mode window ({} calls), then \
         removed the probes. Verdict of that window: **{}** — {}\n",
        e.duration_s,
        calls(e),
        e.verdict.class,
        super::verdict::sentence(e)
    );
    let sites = shown(e);
    if sites.is_empty() {
        md.push_str("No site's live bytes grew in the exact window.\n\n");
        return;
    }
    md.push_str("| # | function | class | growth | live at end | blocks |\n|---|---|---|---|---|---|\n");
    for (i, s) in sites.iter().enumerate() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} ({}) | {} |",
            i + 1,
            s.function.replace('|', "\\|"),
            s.class,
            rate(s.growth_bytes_per_s),
            bytes(s.live_bytes),
            exact(s.live_bytes),
            s.live_allocations
        );
    }
    md.push_str("\n```\n");
    for l in super::stack::stack_lines(sites[0]) {
        let _ = writeln!(md, "{l}");
    }
    md.push_str("```\n\n");
}

/// report.json's `escalation`: null without one; else the window's duration, calls, verdict and
/// its top growing sites (function, class, growth in bytes per second, live bytes and blocks at
/// its end, frames innermost first as "function (object)").
pub fn escalation_json(a: &Analysis) -> Value {
    let Some(e) = a.escalation.as_deref() else { return Value::Null };
    let sites: Vec<Value> = shown(e)
        .into_iter()
        .map(|s| {
            json!({
                "function": s.function,
                "class": s.class.as_str(),
                "growth_bytes_per_s": s.growth_bytes_per_s,
                "live_bytes": s.live_bytes,
                "live_allocations": s.live_allocations,
                "frames": s.frames.iter().map(|f| crate::analyze::frame_label(f)).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "duration_s": e.duration_s,
        "allocator_calls": calls(e),
        "verdict": { "class": e.verdict.class.as_str(), "sentence": super::verdict::sentence(e) },
        "sites": sites,
    })
}
