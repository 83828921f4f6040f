//! Growth of the Python heap by type and what holds it (`record --python-heap`,
//! [`crate::runtimes::python::heap`]) in report.md ("What holds it") and report.json (`python_heap`, described
//! in docs/report-json.md).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::analyze::Analysis;
use crate::human::{bytes, number, rate};
use crate::runtimes::python::heap::{Holder, HolderKind, Holds, RetainerGrowth, TypeGrowth, leak_pattern, look_alike};

/// Growing types shown in report.md.
const MD_TYPES: usize = 12;
/// Example paths shown in report.md.
const MD_PATHS: usize = 5;

/// A holder in one line: its pattern, or what it is when it has none.
pub fn holder_text(h: &Holder) -> String {
    match h.kind {
        HolderKind::Path => format!("`{}`", h.pattern.replace('`', "'")),
        HolderKind::Nowhere => "referenced from nowhere (no path from any module)".into(),
        HolderKind::Garbage => "an unreachable cycle not collected yet".into(),
    }
}

/// The example path as arrows: `__main__` (module) → `.bus` (`__main__.EventBus`) → ...
pub fn path_text(h: &Holder) -> String {
    h.example
        .iter()
        .map(|s| {
            let e = s.edge.replace('`', "'");
            if s.type_name.is_empty() { e } else { format!("`{e}` ({})", s.type_name.replace('`', "'")) }
        })
        .collect::<Vec<_>>()
        .join(" → ")
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
    let _ = writeln!(md, "## What holds it (Python heap by type)\n");
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
    retainers_md(md, h);
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
        let _ = writeln!(md, "Retaining paths (one object of each growing holder, root first):\n");
        for g in h.growing.iter().filter(|g| g.holder.as_ref().is_some_and(|x| !x.example.is_empty())).take(MD_PATHS) {
            let x = g.holder.as_ref().map(path_text).unwrap_or_default();
            let p = leak_pattern(g).map_or(String::new(), |p| format!(" — pattern: {p}"));
            let _ = writeln!(md, "- `{}`: {x}{p}", g.name.replace('`', "'"));
        }
        md.push('\n');
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
            "path": h.example,
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

/// A retainer's retaining path as typed steps, root first: the root (a module or a live
/// frame's local), the managed objects each edge leads to, and the native block at the end.
fn retain_path(r: &RetainerGrowth) -> Value {
    let mut steps: Vec<Value> = Vec::new();
    for (k, s) in r.example.iter().enumerate() {
        let kind = if k == 0 { "root" } else { "managed" };
        steps.push(json!({"kind": kind, "runtime": "python", "edge": s.edge, "type": s.type_name}));
    }
    steps.push(json!({
        "kind": "native",
        "bytes": r.last.block_bytes / r.last.blocks.max(1),
        "allocated_by": r.last.allocated_by,
        "stack": r.last.allocated_stack,
    }));
    Value::Array(steps)
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
        "retain_path": retain_path(r),
    })
}

/// report.md: the containers that retain native blocks, in the "What holds it" section.
fn retainers_md(md: &mut String, h: &Holds) {
    if h.retainers.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "Containers that retain native memory (Python objects and the traced native blocks extension objects \
         point into, as one graph; retained: what releasing the container alone would free):\n"
    );
    let _ = writeln!(md, "| Container | Objects | Retained (native / Python) | Growth | Allocated by |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for r in h.retainers.iter().take(MD_TYPES) {
        let growth = if r.growing { rate(r.bytes_per_s) } else { "not growing: not a leak".into() };
        let _ = writeln!(
            md,
            "| `{}` (`{}`) | {} → {} | {} / {} | {growth} | {} |",
            r.container.replace('`', "'"),
            r.type_name.replace('`', "'"),
            number(r.count_first as f64),
            number(r.count_last as f64),
            bytes(r.last.native),
            bytes(r.last.managed),
            r.last.allocated_by.as_deref().map_or("–".into(), functions).replace('|', "\\|"),
        );
    }
    md.push('\n');
    for r in h.retainers.iter().filter(|r| r.growing).take(MD_PATHS) {
        let steps: Vec<String> = r
            .example
            .iter()
            .map(|s| format!("`{}` ({})", s.edge.replace('`', "'"), s.type_name.replace('`', "'")))
            .chain([format!("native block ({})", r.last.allocated_by.as_deref().map_or("?".into(), functions))])
            .collect();
        let _ = writeln!(md, "- `{}`: {}", r.container.replace('`', "'"), steps.join(" → "));
    }
    md.push('\n');
}
