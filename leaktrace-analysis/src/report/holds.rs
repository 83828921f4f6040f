//! `record --heap-census` ([`crate::holds`]) in report.md (the "What holds it" section, one
//! subsection per runtime) and report.json (`runtime_holds`, described in docs/report-json.md).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::holds::{Census, ClassHistogram, Goroutines, Growth, Taken};
use crate::human::{bytes, number, rate};
use crate::recording::Recording;

/// Rows of a growth table in report.md (report.json has [`JSON_ROWS`]).
const MD_ROWS: usize = 10;
/// Rows of a growth list in report.json.
const JSON_ROWS: usize = 50;

fn taken_json(t: &Taken) -> Value {
    json!({ "t_s": t.t_s, "took_s": t.took_s, "units_of_work": t.units_of_work })
}

fn growth_json(g: &Growth, count_key: &str) -> Value {
    json!({
        "name": g.name,
        format!("{count_key}_start"): g.count_start,
        format!("{count_key}_end"): g.count_end,
        "bytes_start": g.bytes_start,
        "bytes_end": g.bytes_end,
        format!("{count_key}_per_s"): g.count_per_s,
        "bytes_per_s": g.bytes_per_s,
        format!("{count_key}_per_unit"): g.count_per_unit,
        "bytes_per_unit": g.bytes_per_unit,
    })
}

fn jvm_json(c: &Census<ClassHistogram>) -> Value {
    let snap = |h: &Option<ClassHistogram>| {
        h.as_ref().map_or(Value::Null, |h| {
            json!({ "taken": taken_json(&h.taken), "total_instances": h.total_instances, "total_bytes": h.total_bytes, "classes": h.classes.len() })
        })
    };
    let growing: Vec<Value> = c.growth().iter().take(JSON_ROWS).map(|g| growth_json(g, "instances")).collect();
    json!({ "start": snap(&c.start), "end": snap(&c.end), "growing_classes": growing, "errors": c.errors })
}

fn go_json(c: &Census<Goroutines>) -> Value {
    let snap = |g: &Option<Goroutines>| {
        g.as_ref().map_or(Value::Null, |g| {
            let groups: Vec<Value> = g
                .groups
                .iter()
                .take(JSON_ROWS)
                .map(|x| {
                    json!({ "state": x.state, "wait_reason": x.wait_reason, "start_function": x.start_function, "count": x.count, "stack_bytes": x.stack_bytes })
                })
                .collect();
            json!({ "taken": taken_json(&g.taken), "goroutines": g.total, "stack_bytes": g.stack_bytes, "groups": groups })
        })
    };
    let growing: Vec<Value> = c.growth().iter().take(JSON_ROWS).map(|g| growth_json(g, "goroutines")).collect();
    json!({ "start": snap(&c.start), "end": snap(&c.end), "growing_groups": growing, "errors": c.errors })
}

/// report.json's `runtime_holds`: null without `--heap-census`.
pub fn holds_json(rec: &Recording) -> Value {
    let Some(h) = &rec.runtime_holds else { return Value::Null };
    json!({
        "jvm": h.jvm.as_ref().map_or(Value::Null, jvm_json),
        "go": h.go.as_ref().map_or(Value::Null, go_json),
    })
}

/// The per-unit part of a growth line, when units were counted.
fn per_unit(g: &Growth, what: &str) -> String {
    match (g.count_per_unit, g.bytes_per_unit) {
        (Some(c), Some(b)) => format!("; per unit of work {c:.3} {what}, {b:.1} B"),
        _ => String::new(),
    }
}

fn jvm_md(md: &mut String, c: &Census<ClassHistogram>) {
    let _ = writeln!(md, "### JVM: class histogram (`jcmd PID GC.class_histogram`)\n");
    if let (Some(a), Some(b)) = (&c.start, &c.end) {
        let _ = writeln!(
            md,
            "Taken at {:.1} s and {:.1} s; each forces a full GC (jcmd ran {:.2} s and {:.2} s: the JVM's pause is at most that). Live objects {} → {}, {} → {}.\n",
            a.taken.t_s,
            b.taken.t_s,
            a.taken.took_s,
            b.taken.took_s,
            number(a.total_instances as f64),
            number(b.total_instances as f64),
            bytes(a.total_bytes),
            bytes(b.total_bytes)
        );
        let g = c.growth();
        if g.is_empty() {
            md.push_str("No class grew in instances and bytes.\n\n");
        }
        for x in g.iter().take(MD_ROWS) {
            let _ = writeln!(
                md,
                "- **{}**: {} → {} instances ({:+.1}/s), {} → {} ({}){}",
                x.name,
                number(x.count_start as f64),
                number(x.count_end as f64),
                x.count_per_s,
                bytes(x.bytes_start),
                bytes(x.bytes_end),
                rate(x.bytes_per_s),
                per_unit(x, "instances")
            );
        }
        md.push('\n');
    }
    for e in &c.errors {
        let _ = writeln!(md, "- not measured: {e}");
    }
}

fn go_md(md: &mut String, c: &Census<Goroutines>) {
    let _ = writeln!(md, "### Go: goroutines (the runtime's `allgs`, read from outside)\n");
    if let (Some(a), Some(b)) = (&c.start, &c.end) {
        let _ = writeln!(
            md,
            "Read at {:.1} s and {:.1} s without stopping the process ({:.1} ms and {:.1} ms of reads). Goroutines {} → {}, their stacks {} → {}.\n",
            a.taken.t_s,
            b.taken.t_s,
            a.taken.took_s * 1e3,
            b.taken.took_s * 1e3,
            number(a.total as f64),
            number(b.total as f64),
            bytes(a.stack_bytes),
            bytes(b.stack_bytes)
        );
        let g = c.growth();
        if g.is_empty() {
            md.push_str("No goroutine group grew.\n\n");
        }
        for x in g.iter().take(MD_ROWS) {
            let _ = writeln!(
                md,
                "- **{:+.1} goroutines/s** {}: {} → {}, stacks {} → {}{}",
                x.count_per_s,
                x.name,
                number(x.count_start as f64),
                number(x.count_end as f64),
                bytes(x.bytes_start),
                bytes(x.bytes_end),
                per_unit(x, "goroutines")
            );
        }
        md.push('\n');
    }
    for e in &c.errors {
        let _ = writeln!(md, "- not measured: {e}");
    }
}

/// The leading sentence of the runtime's answer, for the verdict and the summary: the fastest
/// growing class or goroutine group (None: no census, or nothing grew).
pub fn holder_sentence(rec: &Recording) -> Option<String> {
    let h = rec.runtime_holds.as_ref()?;
    if let Some(g) = h.go.as_ref().and_then(|c| c.growth().into_iter().next()) {
        return Some(format!("{:+.0} goroutines/s {}", g.count_per_s, g.name));
    }
    let g = h.jvm.as_ref().and_then(|c| c.growth().into_iter().next())?;
    Some(format!("class {} grows {:+.0} instances/s, {}", g.name, g.count_per_s, rate(g.bytes_per_s)))
}

/// report.md's "What holds it" subsections of the JVM and Go; nothing without `--heap-census`.
pub fn holds_md(md: &mut String, rec: &Recording) {
    let Some(h) = &rec.runtime_holds else { return };
    if h.jvm.is_none() && h.go.is_none() {
        return;
    }
    let _ = writeln!(md, "## What holds it\n");
    if let Some(c) = &h.jvm {
        jvm_md(md, c);
    }
    if let Some(c) = &h.go {
        go_md(md, c);
    }
    md.push('\n');
}
