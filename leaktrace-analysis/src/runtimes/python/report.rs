//! Growth of the Python heap by type and what holds it (`record --python-heap`,
//! [`crate::runtimes::python::heap`]) in report.md (its subsection of "What holds it"; its holders are in the section's list) and report.json (`python_heap`, described
//! in docs/report-json.md).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::analyze::Analysis;
use crate::human::{bytes, number, rate};
use crate::runtimes::python::heap::{Holder, HolderKind, Holds, RetainerGrowth, TypeGrowth, leak_pattern, look_alike};

/// Growing types shown in report.md.
const MD_TYPES: usize = 12;

/// A holder in one line: its pattern, or what it is when it has none.
pub fn holder_text(h: &Holder) -> String {
    match h.kind {
        HolderKind::Path => format!("`{}`", h.pattern.replace('`', "'")),
        HolderKind::Nowhere => "referenced from nowhere (no path from any module)".into(),
        HolderKind::Garbage => "an unreachable cycle not collected yet".into(),
    }
}

fn signed(x: f64) -> String {
    if x >= 0.0 { format!("+{}", number(x)) } else { format!("−{}", number(-x)) }
}

fn row(md: &mut String, g: &TypeGrowth, per_unit: bool) {
    let held = g.holder.as_ref().map_or_else(String::new, |h| {
        let grown =
            if g.holder_count_per_s != 0.0 { format!(" ({}/s)", signed(g.holder_count_per_s)) } else { String::new() };
        format!("{}{grown}", holder_text(h))
    });
    let unit = if per_unit {
        format!(" {} |", g.count_per_unit.map_or("–".into(), |u| format!("{u:.2}")))
    } else {
        String::new()
    };
    let _ = writeln!(
        md,
        "| `{}` | {} → {} | {}/s | {} |{unit} {} |",
        g.name.replace('`', "'"),
        number(g.count_first as f64),
        number(g.count_last as f64),
        signed(g.count_per_s),
        rate(g.bytes_per_s),
        held.replace('|', "\\|")
    );
}

/// report.md's "What holds it" section (nothing without two censuses).
pub fn holds_md(md: &mut String, a: &Analysis) {
    let Some(h) = &a.python_holds else { return };
    let _ = writeln!(md, "### Python heap by type (--python-heap)\n");
    let units = h.units.map_or(String::new(), |u| format!(", {} units of work", number(u as f64)));
    let _ = writeln!(
        md,
        "{} censuses of the Python heap read from outside the process, at {:.1} s and {:.1} s ({:.1} s apart{units}); \
         longest pause of the target {:.1} ms; {} objects ({}) at the last.{}\n",
        h.censuses,
        h.first_s,
        h.last_s,
        h.last_s - h.first_s,
        h.max_pause_ms,
        number(h.objects as f64),
        bytes(h.bytes),
        if h.complete { "" } else { " **Partial**: counts are lower bounds." }
    );
    for n in &h.notes {
        let _ = writeln!(md, "- {n}");
    }
    if !h.notes.is_empty() {
        md.push('\n');
    }
    let per_unit = h.units.is_some();
    let head = if per_unit { " Per unit |" } else { "" };
    let sep = if per_unit { "---|" } else { "" };
    if h.growing.is_empty() {
        let _ = writeln!(md, "No type grows between the censuses.\n");
    } else {
        let _ = writeln!(md, "Types that grew between the first and the last census, most bytes per second first:\n");
        if !matches!(a.verdict.class, crate::analyze::ProcessClass::Leak) && h.censuses < 3 {
            let _ = writeln!(
                md,
                "The verdict finds no leak: two censuses cannot tell a cache that filled and levelled \
                 off from growth that goes on; `--python-heap-every N` takes censuses in between.\n"
            );
        }
        let _ = writeln!(md, "| Type | Objects | Growth |  Bytes |{head} Held by (fastest-growing holder) |");
        let _ = writeln!(md, "|---|---|---|---|{sep}---|");
        for g in h.growing.iter().take(MD_TYPES) {
            row(md, g, per_unit);
        }
        md.push('\n');
        let patterns: Vec<String> = h
            .growing
            .iter()
            .filter_map(|g| Some(format!("`{}`: {}", g.name.replace('`', "'"), leak_pattern(g)?)))
            .collect();
        if !patterns.is_empty() {
            let _ = writeln!(md, "Patterns of the growing types: {}.\n", patterns.join("; "));
        }
        let nowhere: Vec<&TypeGrowth> = h
            .growing
            .iter()
            .filter(|g| g.holder.as_ref().is_some_and(|x| x.kind == HolderKind::Nowhere) && g.holder_count_per_s > 0.0)
            .collect();
        if !nowhere.is_empty() {
            let list: Vec<String> = nowhere
                .iter()
                .map(|g| {
                    let by = g.holder.as_ref().and_then(|h| h.allocated_by.as_deref());
                    let by = by.map_or(String::new(), |f| format!(", allocated by `{f}`"));
                    format!("`{}` ({}/s{by})", g.name, signed(g.holder_count_per_s))
                })
                .collect();
            let _ = writeln!(
                md,
                "Referenced from nowhere: {} grow with no path from any module while more references point at them than \
                 the Python objects read hold: a reference leaked by native code (a missing `Py_DECREF`) in the function \
                 that allocated them (traced with `--pymalloc`; see that site's native stack).\n",
                list.join(", ")
            );
        }
    }
    if !h.steady.is_empty() {
        let list: Vec<String> = h
            .steady
            .iter()
            .map(|g| {
                let by = g.holder.as_ref().map_or(String::new(), holder_text);
                let what = look_alike(g).map_or(String::new(), |l| format!(" ({l}: not a leak)"));
                format!("{by}: `{}` {} → {}{what}", g.name, number(g.count_first as f64), number(g.count_last as f64))
            })
            .collect();
        let _ = writeln!(
            md,
            "Held from modules and not growing (bounded caches, full deques, the program's state): {}.\n",
            list.join("; ")
        );
    }
}

fn growth_json(g: &TypeGrowth) -> Value {
    json!({
        "type": g.name,
        "count_first": g.count_first,
        "count_last": g.count_last,
        "bytes_first": g.bytes_first,
        "bytes_last": g.bytes_last,
        "count_per_s": g.count_per_s,
        "bytes_per_s": g.bytes_per_s,
        "count_per_unit": g.count_per_unit,
        "leak_pattern": leak_pattern(g),
        "look_alike": look_alike(g),
        "holder": g.holder.as_ref().map(|h| json!({
            "kind": h.kind,
            "pattern": h.pattern,
            "count": h.count,
            "bytes": h.bytes,
            "count_per_s": g.holder_count_per_s,
            "path": crate::runtimes::python::heap::retain_path(&h.example, None),
            "allocated_by": h.allocated_by,
            "allocated_stack": h.allocated_stack,
        })),
    })
}

/// report.json's `python_heap` (null without two censuses).
pub fn holds_json(a: &Analysis) -> Value {
    let Some(h) = &a.python_holds else { return Value::Null };
    json!({
        "censuses": h.censuses,
        "first_s": h.first_s,
        "last_s": h.last_s,
        "units_of_work": h.units,
        "max_pause_ms": h.max_pause_ms,
        "complete": h.complete,
        "notes": h.notes,
        "objects": h.objects,
        "bytes": h.bytes,
        "held_by": h.top_holder(),
        "growing": h.growing.iter().map(growth_json).collect::<Vec<_>>(),
        "retainers": h.retainers.iter().map(retainer_json).collect::<Vec<_>>(),
        "steady": h.steady.iter().map(growth_json).collect::<Vec<_>>(),
    })
}

/// The verdict's clause for a managed leak: "held by `__main__.bus._handlers` (function
/// +200/s, ...)", or for objects referenced from nowhere; None without a growing type.
pub fn verdict_clause(h: &Holds) -> Option<String> {
    let top: Vec<String> =
        h.growing.iter().take(3).map(|g| format!("{} {}/s", g.name, signed(g.count_per_s))).collect();
    if top.is_empty() {
        return None;
    }
    let first = h.growing.iter().filter_map(|g| g.holder.as_ref()).next()?;
    match first.kind {
        HolderKind::Nowhere => Some(format!(
            "the growing Python objects ({}) are referenced from nowhere: a reference leaked by native code{}",
            top.join(", "),
            first.allocated_by.as_ref().map_or(String::new(), |f| format!(", allocated by {f}"))
        )),
        _ => h.top_holder().map(|root| {
            let p = h.growing.first().and_then(leak_pattern).map_or(String::new(), |p| format!(" ({p})"));
            // A local's root names its variable in backticks: kept readable inside the code span.
            let root = root.replace('`', "'");
            format!("the growing Python objects ({}) are held by `{root}`{p}", top.join(", "))
        }),
    }
}

/// A function pair as the verdict writes it: `img_alloc_buffer` ← `decode_batch`.
fn functions(by: &str) -> String {
    by.split(" ← ").map(|f| format!("`{}`", f.replace('`', "'"))).collect::<Vec<_>>().join(" ← ")
}

/// The verdict's clause for the container whose retained bytes grow fastest:
/// "`__main__.PENDING` retains +1.2 MB/s (99 % native, allocated by `img_alloc_buffer` ←
/// `decode_batch`)"; None when no container that retains native blocks grows.
pub fn retainer_clause(h: &Holds) -> Option<String> {
    let r = h.retainers.iter().find(|r| r.growing && r.bytes_per_s > 0.0)?;
    let by = r.last.allocated_by.as_deref().map_or(String::new(), |f| format!(", allocated by {}", functions(f)));
    Some(format!(
        "`{}` retains {} ({:.0} % native{by})",
        r.container.replace('`', "'"),
        rate(r.bytes_per_s),
        100.0 * r.native_share()
    ))
}

fn retained_json(r: &crate::retain::Retained) -> Value {
    json!({"native": r.native, "managed": r.managed, "off_heap": r.off_heap, "blocks": r.blocks, "block_bytes": r.block_bytes})
}

fn retainer_json(r: &RetainerGrowth) -> Value {
    json!({
        "container": r.container,
        "type": r.type_name,
        "pattern": r.pattern,
        "count_first": r.count_first,
        "count_last": r.count_last,
        "retained_first": retained_json(&r.first),
        "retained_last": retained_json(&r.last),
        "bytes_per_s": r.bytes_per_s,
        "native_per_s": r.native_per_s,
        "native_share": r.native_share(),
        "growing": r.growing,
        "leak": r.growing && r.bytes_per_s > 0.0,
        "allocated_by": r.last.allocated_by,
        "allocated_stack": r.last.allocated_stack,
        "retain_path": crate::runtimes::python::heap::retain_path(&r.example, Some(&r.last)),
    })
}
