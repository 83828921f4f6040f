//! The typed walk of the Go heap from its package variables (`record --heap-census`,
//! `Goroutines::walk`) in report.md (part of the Go subsection of "What holds it"), report.json
//! (`runtime_holds.go.roots`) and the verdict's holder sentence.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::holds::{Census, Goroutines};
use crate::human::{bytes, number, rate};

/// Roots listed in report.json.
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

/// report.md: the typed walk's figures (its roots are in the holders' list of "What holds it").
pub fn roots_md(md: &mut String, c: &Census<Goroutines>) {
    let (Some(a), Some(b)) = (&c.start, &c.end) else { return };
    let (Some(wa), Some(wb)) = (&a.walk, &b.walk) else { return };
    let _ = writeln!(
        md,
        "Package variables and goroutines' locals (`function.local`) and what each alone keeps alive (its retained \
         bytes: reachable from it and from no other root; sizes as typed, not rounded to size classes), from a typed \
         walk of the heap with the executable's DWARF types, without stopping the process: {} objects ({}) at {:.1} s \
         in {:.0} ms, {} objects ({}) at {:.1} s in {:.0} ms; {} reached from two roots or more; {} goroutines' \
         frames read ({} running, not unwound). Each root is in the holders' list above.\n",
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
        let h = crate::holds::RuntimeHolds { go: Some(c.clone()), ..Default::default() };
        let mut held = Vec::new();
        crate::report::what_holds::go_holders(&h, &mut held);
        let md: Vec<String> = held.iter().map(crate::report::what_holds::line).collect();
        assert!(md[0].starts_with("- **`main.memo`** (package variable, go): holds 2,200 entries"), "{md:?}");
        assert!(md[0].contains("**growing** +208.6 KiB/s\n  path: `main.memo (package variable) → map[string][]byte`"));
        assert!(md[1].starts_with("- **`main.sessions`**") && md[1].contains("not growing: not a leak"), "{md:?}");
        assert_eq!(roots_json(&c)["roots"][1]["growing"], false);
        let one = Census { start: c.start.clone(), end: None, errors: Vec::new() };
        assert!(one.root_growth().is_empty() && root_sentence(&one).is_none());
    }
}
