//! The typed walk of the Go heap from its package variables (`record --heap-census`,
//! `Goroutines::walk`) in report.md (part of the Go subsection of "What holds it"), report.json
//! (`runtime_holds.go.roots`) and the verdict's holder sentence.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::holds::{Census, Goroutines, RootGrowth};
use crate::human::{bytes, number, rate};

/// Roots listed in report.md (report.json has up to [`JSON_ROWS`]).
const MD_ROWS: usize = 10;
const JSON_ROWS: usize = 100;

/// `runtime_holds.go.roots`: every root of the last walk with its growth, growing ones first.
pub fn roots_json(c: &Census<Goroutines>) -> Value {
    let rows: Vec<Value> = c
        .root_growth()
        .iter()
        .take(JSON_ROWS)
        .map(|g| {
            json!({
                "name": g.name, "type": g.type_name, "growing": g.growing,
                "kind": if g.goroutines.is_some() { "goroutine local" } else { "package variable" },
                "goroutines": g.goroutines, "started_at": g.started_at,
                "entries_start": g.entries_start, "entries_end": g.entries_end, "entries_per_s": g.entries_per_s,
                "objects_start": g.objects_start, "objects_end": g.objects_end,
                "retained_bytes_start": g.bytes_start, "retained_bytes_end": g.bytes_end,
                "retained_bytes_per_s": g.bytes_per_s, "retained_bytes_per_unit": g.bytes_per_unit,
            })
        })
        .collect();
    let walk = |g: &Option<Goroutines>| {
        g.as_ref().and_then(|g| g.walk.as_ref()).map_or(Value::Null, |w| {
            json!({
                "roots_walked": w.roots_walked, "objects": w.objects, "bytes": w.bytes,
                "shared_objects": w.shared_objects, "shared_bytes": w.shared_bytes,
                "read_bytes": w.read_bytes, "took_s": w.took_s, "cpu_s": w.cpu_s, "cut": w.cut,
                "goroutines": w.goroutines, "goroutines_running": w.goroutines_running, "frames": w.frames,
                "no_stack_roots": w.no_stack_roots,
            })
        })
    };
    json!({ "roots": rows, "walk_start": walk(&c.start), "walk_end": walk(&c.end) })
}

/// The entries part of a root's line: `20 → 2,020 entries (+200.0/s)`.
fn entries(g: &RootGrowth) -> String {
    match (g.entries_start, g.entries_end) {
        (Some(a), Some(b)) => {
            format!("{} → {} entries ({:+.1}/s), ", number(a as f64), number(b as f64), g.entries_per_s)
        }
        _ => String::new(),
    }
}

/// What a root is, after its type: `, a local of 1 goroutine started at runtime.main`.
fn local(g: &RootGrowth) -> String {
    match g.goroutines {
        Some(n) => format!(
            ", a local of {} goroutine{} started at {}",
            number(n as f64),
            if n == 1 { "" } else { "s" },
            g.started_at.as_deref().unwrap_or("?")
        ),
        None => String::new(),
    }
}

/// report.md: the package variables and what each alone keeps alive, growing ones first.
pub fn roots_md(md: &mut String, c: &Census<Goroutines>) {
    let (Some(a), Some(b)) = (&c.start, &c.end) else { return };
    let (Some(wa), Some(wb)) = (&a.walk, &b.walk) else { return };
    let _ = writeln!(
        md,
        "Package variables and goroutines' locals (`function.local`) and what each alone keeps alive (its retained \
         bytes: reachable from it and from no other root; sizes as typed, not rounded to size classes), from a typed \
         walk of the heap with the executable's DWARF types, without stopping the process: {} objects ({}) at {:.1} s \
         in {:.0} ms, {} objects ({}) at {:.1} s in {:.0} ms; {} reached from two roots or more; {} goroutines' \
         frames read ({} running, not unwound).\n",
        number(wa.objects as f64),
        bytes(wa.bytes),
        a.taken.t_s,
        wa.took_s * 1e3,
        number(wb.objects as f64),
        bytes(wb.bytes),
        b.taken.t_s,
        wb.took_s * 1e3,
        bytes(wb.shared_bytes),
        number(wb.goroutines as f64),
        number(wb.goroutines_running as f64)
    );
    if let Some(why) = &wb.no_stack_roots {
        let _ = writeln!(md, "- {why}");
    }
    for g in c.root_growth().iter().take(MD_ROWS) {
        let what = if g.growing { "**growing**" } else { "not growing" };
        let _ = writeln!(
            md,
            "- `{}` ({}{}): {what}, {}retains {} → {} ({})",
            g.name,
            g.type_name,
            local(g),
            entries(g),
            bytes(g.bytes_start),
            bytes(g.bytes_end),
            rate(g.bytes_per_s)
        );
    }
    for w in [wa, wb] {
        if let Some(cut) = &w.cut {
            let _ = writeln!(md, "- partial: {cut}");
        }
    }
    md.push('\n');
}

/// The verdict's sentence for the fastest-growing package variable, if one grows:
/// "`main.memo` (map[string][]byte) +200 entries/s, retains +195.3 KiB/s".
pub fn root_sentence(c: &Census<Goroutines>) -> Option<String> {
    let g = c.root_growth().into_iter().find(|g| g.growing)?;
    let entries = if g.entries_end.is_some() { format!(" {:+.0} entries/s,", g.entries_per_s) } else { String::new() };
    Some(format!("`{}` ({}){entries} retains {}", g.name, g.type_name, rate(g.bytes_per_s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::{GoRoot, GoWalk, Taken};

    fn snap(t_s: f64, memo: (u64, u64), sessions: (u64, u64)) -> Goroutines {
        let root = |name: &str, ty: &str, (entries, bytes): (u64, u64)| GoRoot {
            name: name.into(),
            type_name: ty.into(),
            entries: Some(entries),
            objects: entries,
            bytes,
            ..Default::default()
        };
        Goroutines {
            taken: Taken { t_s, took_s: 0.001, units_of_work: None },
            walk: Some(GoWalk {
                roots: vec![
                    root("main.sessions", "map[int]*main.session", sessions),
                    root("main.memo", "map[string][]byte", memo),
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_growing_variable_is_named_and_the_bounded_one_is_not() {
        let c = Census {
            start: Some(snap(1.0, (200, 213_600), (256, 40_000))),
            end: Some(snap(11.0, (2200, 2_349_600), (256, 39_000))),
            errors: Vec::new(),
        };
        let g = c.root_growth();
        assert_eq!(g[0].name, "main.memo");
        assert!(g[0].growing);
        assert_eq!(g[0].entries_per_s, 200.0);
        assert_eq!(g[0].bytes_per_s, 213_600.0);
        assert_eq!(g[1].name, "main.sessions");
        assert!(!g[1].growing);
        assert_eq!(
            root_sentence(&c).as_deref(),
            Some("`main.memo` (map[string][]byte) +200 entries/s, retains +208.6 KiB/s")
        );
        let mut md = String::new();
        roots_md(&mut md, &c);
        assert!(md.contains("- `main.memo` (map[string][]byte): **growing**, 200 → 2,200 entries (+200.0/s)"), "{md}");
        assert!(md.contains("- `main.sessions` (map[int]*main.session): not growing, 256 → 256 entries"), "{md}");
        assert_eq!(roots_json(&c)["roots"][1]["growing"], false);
        let one = Census { start: c.start.clone(), end: None, errors: Vec::new() };
        assert!(one.root_growth().is_empty() && root_sentence(&one).is_none());
    }
}
