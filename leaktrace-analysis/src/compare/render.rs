//! The outputs of a comparison: `compare.md`, `compare.json` and the differential flame graph
//! (`diff.svg`, from [`diff_folded`]).

use super::*;

pub(super) fn growth_cell(g: Option<Growth>, unit: &str) -> String {
    match g {
        None => "—".into(),
        Some(g) => {
            let ci = g.ci95.map(|c| format!(" ± {}", number(c))).unwrap_or_default();
            format!("{}{ci}{}", rate(g.slope, unit), if g.leak { " (leak)" } else { "" })
        }
    }
}

pub(super) fn status_text(s: Status) -> &'static str {
    match s {
        Status::Fixed => "fixed",
        Status::StillLeaking => "still leaking",
        Status::NewLeak => "new leak",
        Status::NoLeak => "",
    }
}

/// Escape `|` for a markdown table cell.
pub(super) fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Sites listed per table in compare.md.
pub const MD_ROWS: usize = 30;

/// `compare.md`.
pub fn compare_md(c: &Comparison) -> String {
    let u = &c.unit;
    let mut md = String::new();
    md.push_str("# leaktrace compare\n\n");
    for (name, s) in [("Before", &c.before), ("After", &c.after)] {
        md.push_str(&format!(
            "- **{name}**: `{}` — `{}`{}; {}\n",
            s.path,
            s.command,
            s.work_probe.as_ref().map(|w| format!(", work probe `{w}`")).unwrap_or_default(),
            s.window
        ));
    }
    md.push_str(&format!("- Growth in **{u}**{}\n", if u == "B/unit" { " (bytes per unit of work)" } else { "" }));
    for n in &c.notes {
        md.push_str(&format!("- Note: {n}\n"));
    }
    md.push_str("\n## Verdict\n\n");
    for v in &c.verdicts {
        md.push_str(&format!("- {v}\n"));
    }
    md.push_str(&format!("\n**{}**\n\n", c.conclusion));
    md.push_str("## Overall (traced live bytes)\n\n| | before | after | change |\n|---|---:|---:|---:|\n");
    md.push_str(&format!(
        "| growth | {} | {} | {} |\n\n",
        growth_cell(Some(c.before.overall), u),
        growth_cell(Some(c.after.overall), u),
        number(c.after.overall.slope - c.before.overall.slope)
    ));
    md.push_str(&super::types_md(&c.python_types));
    md.push_str("## Matched sites\n\n");
    if c.matched.is_empty() {
        md.push_str("No site is in both recordings.\n\n");
    } else {
        md.push_str("| site | kind | callers | before | after | change | |\n|---|---|---|---:|---:|---:|---|\n");
        for s in c.matched.iter().take(MD_ROWS) {
            md.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} | {} |\n",
                cell(&s.name),
                s.signature.kind,
                cell(&s.signature.frames[1..].iter().take(3).cloned().collect::<Vec<_>>().join(" < ")),
                growth_cell(s.before, u),
                growth_cell(s.after, u),
                number(s.slope_after() - s.slope_before()),
                status_text(s.status)
            ));
        }
        if c.matched.len() > MD_ROWS {
            md.push_str(&format!("\n… and {} more matched sites (see compare.json).\n", c.matched.len() - MD_ROWS));
        }
        md.push('\n');
    }
    for (title, list, side) in [("Only in before", &c.only_before, true), ("Only in after", &c.only_after, false)] {
        md.push_str(&format!("## {title}\n\n"));
        if list.is_empty() {
            md.push_str("None.\n\n");
            continue;
        }
        md.push_str("| site | kind | callers | growth | |\n|---|---|---|---:|---|\n");
        for s in list.iter().take(MD_ROWS) {
            md.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                cell(&s.name),
                s.signature.kind,
                cell(&s.signature.frames[1..].iter().take(3).cloned().collect::<Vec<_>>().join(" < ")),
                growth_cell(if side { s.before } else { s.after }, u),
                status_text(s.status)
            ));
        }
        if list.len() > MD_ROWS {
            md.push_str(&format!("\n… and {} more (see compare.json).\n", list.len() - MD_ROWS));
        }
        md.push('\n');
    }
    md.push_str(&super::holds::md(&c.holds));
    md.push_str(
        "## Method\n\n\
         Sites are matched by kind and the names of the culprit function and up to 6 callers \
         (no addresses, lines or files: they change with a rebuild). Growth is the least-squares \
         slope of live bytes over the batch checkpoints (or the steady window), with its 95 % \
         confidence interval; a site leaks when the slope is significant and above the noise floor. \
         `diff.svg`: width = the larger of the before and after growth; the culprit frame is red \
         when it grows faster after, blue when slower.\n",
    );
    md
}

/// `compare.json`.
pub fn compare_json(c: &Comparison) -> serde_json::Value {
    let site = |s: &SiteComparison| {
        serde_json::json!({
            "signature": s.signature.key(),
            "kind": s.signature.kind,
            "function": s.signature.function(),
            "callers": s.signature.frames[1..],
            "name": s.name,
            "before": s.before.map(growth_json),
            "after": s.after.map(growth_json),
            "change": finite(s.slope_after() - s.slope_before()),
            "status": s.status,
        })
    };
    let side = |s: &Side| {
        serde_json::json!({
            "path": s.path,
            "command": s.command,
            "work_probe": s.work_probe,
            "window": s.window,
            "points": s.points,
            "overall": growth_json(s.overall),
        })
    };
    serde_json::json!({
        "unit": c.unit,
        "notes": c.notes,
        "before": side(&c.before),
        "after": side(&c.after),
        "matched": c.matched.iter().map(site).collect::<Vec<_>>(),
        "only_before": c.only_before.iter().map(site).collect::<Vec<_>>(),
        "only_after": c.only_after.iter().map(site).collect::<Vec<_>>(),
        "verdicts": c.verdicts,
        "conclusion": c.conclusion,
        "after_flat": c.after_flat,
        "runtime_holds": c.holds,
        "python_types": c.python_types,
    })
}

pub(super) fn growth_json(g: Growth) -> serde_json::Value {
    serde_json::json!({
        "slope": finite(g.slope),
        "ci95": g.ci95.and_then(finite),
        "significant": g.significant,
        "floor": finite(g.floor),
        "leak": g.leak,
        "not_a_leak_in_report": g.not_a_leak_in_report,
        "live_bytes": g.live_bytes,
    })
}

pub(super) fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

pub(super) fn fold_clean(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c == ';' {
                ','
            } else if c.is_whitespace() {
                ' '
            } else {
                c
            }
        })
        .collect();
    if s.trim().is_empty() { "[unknown]".into() } else { s.trim().to_string() }
}

/// Differential folded lines `[kind];outer;...;culprit FIRST SECOND` for inferno's flame graph.
/// Read from `inferno::flamegraph::from_lines` and `merge::frames` (0.12): with two counts on a
/// line, the frame width is SECOND and the colour of the line's leaf frame is SECOND − FIRST (red
/// positive, blue negative); counts must be integers. Here the counts are growth rates in whole
/// bytes per unit (or per second), growth below zero counting as 0. To keep a fixed leak
/// (after = 0) visible, SECOND is the larger of the two rates and FIRST = SECOND − (after −
/// before): width = max(before, after), colour of the culprit = after − before. The kind is the
/// root frame; signatures hold at most [`CALLERS`] callers, so towers start there.
pub fn diff_folded(c: &Comparison) -> String {
    let mut out = String::new();
    for s in c.matched.iter().chain(&c.only_before).chain(&c.only_after) {
        let b = s.slope_before().max(0.0).round() as i64;
        let a = s.slope_after().max(0.0).round() as i64;
        let second = a.max(b);
        if second == 0 {
            continue;
        }
        let first = second - (a - b);
        let mut frames = vec![format!("[{}]", s.signature.kind)];
        frames.extend(s.signature.frames.iter().rev().map(|f| fold_clean(f)));
        out.push_str(&format!("{} {first} {second}\n", frames.join(";")));
    }
    out
}

/// `diff.svg`: inferno differential flame graph of [`diff_folded`].
pub fn diff_svg(c: &Comparison) -> anyhow::Result<Vec<u8>> {
    use inferno::flamegraph::{self, Options};
    let folded = diff_folded(c);
    let title = "Growth before → after";
    if folded.trim().is_empty() {
        return Ok(crate::report::flame::placeholder_svg(title, "no site grows by 1 byte or more, before or after")
            .into_bytes());
    }
    let mut opts = Options::default();
    opts.title = title.to_string();
    opts.subtitle = Some(format!(
        "width: larger of before/after growth ({}); culprit red: grows faster after, blue: grows slower after",
        c.unit
    ));
    opts.count_name = c.unit.clone();
    opts.deterministic = true;
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut opts, folded.lines(), &mut svg)
        .map_err(|e| anyhow::anyhow!("cannot draw diff.svg: {e}"))?;
    Ok(svg)
}
