//! `record --heap-census` ([`crate::holds`]) in report.md (one subsection per runtime of the
//! "What holds it" section, whose holders' list is `report/what_holds.rs`) and report.json (`runtime_holds`, described in docs/report-json.md).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::holds::{Census, ClassHistogram, Goroutines, Growth, HeapPaths, JsSampling, JsSnapshots, Taken};
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
            let heap: Vec<Value> = g
                .heap
                .iter()
                .take(JSON_ROWS)
                .map(|h| json!({ "function": h.function, "stack": h.stack, "inuse_objects": h.inuse_objects, "inuse_bytes": h.inuse_bytes }))
                .collect();
            json!({
                "taken": taken_json(&g.taken), "goroutines": g.total, "stack_bytes": g.stack_bytes, "groups": groups,
                "mem_profile_rate": g.mem_profile_rate, "heap": heap,
            })
        })
    };
    let growing: Vec<Value> = c.growth().iter().take(JSON_ROWS).map(|g| growth_json(g, "goroutines")).collect();
    let heap: Vec<Value> = c.heap_growth().iter().take(JSON_ROWS).map(|g| growth_json(g, "objects")).collect();
    let roots = crate::runtimes::go::report::roots_json(c);
    json!({
        "start": snap(&c.start), "end": snap(&c.end), "growing_groups": growing, "heap_growth": heap,
        "roots": roots["roots"], "walk_start": roots["walk_start"], "walk_end": roots["walk_end"], "errors": c.errors,
    })
}

fn node_json(c: &Census<JsSampling>) -> Value {
    let profile = c.end.as_ref().map_or(Value::Null, |s| {
        let secs = (s.taken.t_s - s.started_t_s).max(f64::MIN_POSITIVE);
        let functions: Vec<Value> = s
            .functions
            .iter()
            .take(JSON_ROWS)
            .map(|f| {
                json!({ "function": f.function, "url": f.url, "line": f.line, "live_bytes": f.live_bytes, "bytes_per_s": f.live_bytes as f64 / secs, "stack": f.stack })
            })
            .collect();
        json!({ "taken": taken_json(&s.taken), "started_t_s": s.started_t_s, "sampling_interval": s.sampling_interval, "total_bytes": s.total_bytes, "functions": functions })
    });
    json!({ "sampling_profile": profile, "errors": c.errors })
}

fn node_md(md: &mut String, c: &Census<JsSampling>) {
    let _ = writeln!(md, "### Node.js: sampling heap profile (the inspector's `HeapProfiler`)\n");
    if let Some(s) = &c.end {
        let secs = (s.taken.t_s - s.started_t_s).max(f64::MIN_POSITIVE);
        let _ = writeln!(
            md,
            "Sampled from {:.1} s to {:.1} s (one sample per {} allocated on average); still alive at the end: {}, by the JS function that allocated them:\n",
            s.started_t_s,
            s.taken.t_s,
            bytes(s.sampling_interval),
            bytes(s.total_bytes)
        );
        for f in s.functions.iter().take(MD_ROWS) {
            let at = if f.url.is_empty() { String::new() } else { format!(" ({}:{})", f.url, f.line) };
            let _ = writeln!(
                md,
                "- **{}**{at}: {} ({}); called from {}",
                f.function,
                bytes(f.live_bytes),
                rate(f.live_bytes as f64 / secs),
                f.stack.join(" ← ")
            );
        }
        md.push('\n');
    }
    for e in &c.errors {
        let _ = writeln!(md, "- note: {e}");
    }
}

fn dump_json(d: &HeapPaths) -> Value {
    json!({
        "taken": taken_json(&d.taken), "file_bytes": d.file_bytes, "kept": d.kept, "objects": d.objects,
        "parse_s": d.parse_s,
        "paths": d.paths.iter().map(|p| json!({
            "class": p.class, "instances": p.instances, "held": p.held, "root_kind": p.root_kind,
            "path": p.retain_path(crate::recording::Runtime::Jvm.as_str()),
        })).collect::<Vec<Value>>(),
    })
}

fn dump_md(md: &mut String, d: &HeapPaths) {
    let _ = writeln!(md, "### JVM: heap dump (`jcmd PID GC.heap_dump`, --heap-dump)\n");
    let kept = d.kept.as_deref().map_or_else(|| "deleted after reading".to_string(), |k| format!("kept: `{k}`"));
    let _ = writeln!(
        md,
        "Taken at {:.1} s (a full GC; jcmd ran {:.2} s: the JVM's pause is at most that): {}, {} objects, read in {:.2} s; {kept}. The shortest path from a GC root to each class that grew, for the root that holds most of them, is in the holders' list above.\n",
        d.taken.t_s,
        d.taken.took_s,
        bytes(d.file_bytes),
        number(d.objects as f64),
        d.parse_s
    );
}

fn snapshots_json(s: &JsSnapshots) -> Value {
    let secs = (s.second.t_s - s.first.t_s).max(f64::MIN_POSITIVE);
    let path = s.path.as_ref().map_or(
        Value::Null,
        |p| json!({ "constructor": p.class, "new_objects": p.instances, "reached": p.held, "path": p.retain_path(crate::recording::Runtime::Node.as_str()) }),
    );
    json!({
        "first": taken_json(&s.first), "second": taken_json(&s.second),
        "objects_first": s.objects_first, "objects_second": s.objects_second,
        "heap_used_first": s.heap_used_first, "heap_used_second": s.heap_used_second,
        "new_objects": s.new_objects.iter().map(|c| json!({
            "constructor": c.constructor, "count": c.count, "self_bytes": c.self_bytes,
            "retained_bytes": c.retained_bytes,
            "count_first": c.count_first, "count_second": c.count_second,
            "count_per_s": c.count as f64 / secs, "self_bytes_per_s": c.self_bytes as f64 / secs,
            "retained_bytes_per_s": c.retained_bytes as f64 / secs,
        })).collect::<Vec<Value>>(),
        "path": path,
        "holder": s.holder.as_ref().map_or(Value::Null, |h| json!({
            "name": h.name, "self_bytes": h.self_bytes, "retained_bytes": h.retained_bytes,
            "instances": h.instances, "instances_retained_bytes": h.instances_retained_bytes,
        })),
        "costs": s.costs.iter().map(|c| json!({
            "first_chunk_s": c.first_chunk_s, "transfer_s": c.transfer_s, "bytes": c.bytes,
            "chunks": c.chunks, "parse_s": c.parse_s, "analyse_s": c.analyse_s,
        })).collect::<Vec<Value>>(),
    })
}

fn snapshots_md(md: &mut String, s: &JsSnapshots) {
    let _ = writeln!(md, "### Node.js: heap snapshots (--heap-snapshots)\n");
    let secs = (s.second.t_s - s.first.t_s).max(f64::MIN_POSITIVE);
    let _ = writeln!(
        md,
        "Taken at {:.1} s and {:.1} s (the process paused {:.2} s and {:.2} s while V8 wrote them); objects {} → {}, JS heap used {} → {}. Objects new in the second, by constructor (self sizes; retained: what only they keep alive, from the dominator tree):\n",
        s.first.t_s,
        s.second.t_s,
        s.first.took_s,
        s.second.took_s,
        number(s.objects_first as f64),
        number(s.objects_second as f64),
        bytes(s.heap_used_first),
        bytes(s.heap_used_second)
    );
    for c in s.new_objects.iter().take(MD_ROWS) {
        let _ = writeln!(
            md,
            "- **{}**: {} new ({:+.1}/s), {} ({}), retained {} ({}); {} → {} in all",
            c.constructor,
            number(c.count as f64),
            c.count as f64 / secs,
            bytes(c.self_bytes),
            rate(c.self_bytes as f64 / secs),
            bytes(c.retained_bytes),
            rate(c.retained_bytes as f64 / secs),
            number(c.count_first as f64),
            number(c.count_second as f64)
        );
    }
    if let Some(h) = &s.holder {
        let _ = writeln!(
            md,
            "\nThe holder of the top constructor's new instances (in the holders' list above, with its path): `{}`, self {}; its {} instances retain {}.",
            h.name,
            bytes(h.self_bytes),
            number(h.instances as f64),
            bytes(h.instances_retained_bytes)
        );
    }
    md.push('\n');
}

/// report.json's `runtime_holds`: null without `--heap-census`.
pub fn holds_json(rec: &Recording) -> Value {
    let Some(h) = &rec.runtime_holds else { return Value::Null };
    json!({
        "jvm": h.jvm.as_ref().map_or(Value::Null, jvm_json),
        "go": h.go.as_ref().map_or(Value::Null, go_json),
        "node": h.node.as_ref().map_or(Value::Null, node_json),
        "jvm_heap_dump": h.jvm_heap_dump.as_ref().map_or(Value::Null, dump_json),
        "off_heap_retainers": super::offheap::json(h),
        "node_snapshots": h.node_snapshots.as_ref().map_or(Value::Null, snapshots_json),
    })
}

/// The per-unit part of a growth line, when units were counted.
fn per_unit(g: &Growth, what: &str) -> String {
    match (g.count_per_unit, g.bytes_per_unit) {
        (Some(c), Some(b)) => format!("; per unit of work {c:.3} {what}, {b:.1} B"),
        _ => String::new(),
    }
}

/// How a census of two snapshots reads in report.md ([`census_md`]).
struct CensusMd<'a, T> {
    /// The section's title.
    title: &'a str,
    /// The line saying when the two snapshots were taken and their totals.
    taken: &'a dyn Fn(&T, &T) -> String,
    /// What is said when nothing grew.
    none: &'a str,
    /// One growing row's line.
    row: &'a dyn Fn(&Growth) -> String,
}

/// A census section of report.md: its title; with both snapshots, when they were taken, what
/// grew (`growth`, at most [`MD_ROWS`] rows) and `after` (more lines from the two snapshots);
/// then why a snapshot is missing.
fn census_md<T>(
    md: &mut String,
    c: &Census<T>,
    growth: &[Growth],
    how: &CensusMd<'_, T>,
    after: impl FnOnce(&mut String, &T),
) {
    let _ = writeln!(md, "{}\n", how.title);
    if let (Some(a), Some(b)) = (&c.start, &c.end) {
        let _ = writeln!(md, "{}\n", (how.taken)(a, b));
        if growth.is_empty() {
            let _ = writeln!(md, "{}\n", how.none);
        }
        for x in growth.iter().take(MD_ROWS) {
            let _ = writeln!(md, "{}", (how.row)(x));
        }
        md.push('\n');
        after(md, b);
    }
    for e in &c.errors {
        let _ = writeln!(md, "- not measured: {e}");
    }
}

/// The JVM's class histograms in report.md: the classes that grew.
fn jvm_md(md: &mut String, c: &Census<ClassHistogram>) {
    let how = CensusMd {
        title: "### JVM: class histogram (`jcmd PID GC.class_histogram`)",
        taken: &|a: &ClassHistogram, b: &ClassHistogram| {
            format!(
                "Taken at {:.1} s and {:.1} s; each forces a full GC (jcmd ran {:.2} s and {:.2} s: the JVM's pause is at most that). Live objects {} → {}, {} → {}.",
                a.taken.t_s,
                b.taken.t_s,
                a.taken.took_s,
                b.taken.took_s,
                number(a.total_instances as f64),
                number(b.total_instances as f64),
                bytes(a.total_bytes),
                bytes(b.total_bytes)
            )
        },
        none: "No class grew in instances and bytes.",
        row: &|x: &Growth| {
            format!(
                "- **{}**: {} → {} instances ({:+.1}/s), {} → {} ({}){}",
                x.name,
                number(x.count_start as f64),
                number(x.count_end as f64),
                x.count_per_s,
                bytes(x.bytes_start),
                bytes(x.bytes_end),
                rate(x.bytes_per_s),
                per_unit(x, "instances")
            )
        },
    };
    census_md(md, c, &c.growth(), &how, |_, _| {});
}

/// Go's goroutines in report.md: the groups that grew, then the heap profile's buckets.
fn go_md(md: &mut String, c: &Census<Goroutines>) {
    let how = CensusMd {
        title: "### Go: goroutines (the runtime's `allgs`, read from outside)",
        taken: &|a: &Goroutines, b: &Goroutines| {
            format!(
                "Read at {:.1} s and {:.1} s without stopping the process ({:.1} ms and {:.1} ms of reads). Goroutines {} → {}, their stacks {} → {}.",
                a.taken.t_s,
                b.taken.t_s,
                a.taken.took_s * 1e3,
                b.taken.took_s * 1e3,
                number(a.total as f64),
                number(b.total as f64),
                bytes(a.stack_bytes),
                bytes(b.stack_bytes)
            )
        },
        none: "No goroutine group grew.",
        row: &|x: &Growth| {
            format!(
                "- **{:+.1} goroutines/s** {}: {} → {}, stacks {} → {}{}",
                x.count_per_s,
                x.name,
                number(x.count_start as f64),
                number(x.count_end as f64),
                bytes(x.bytes_start),
                bytes(x.bytes_end),
                per_unit(x, "goroutines")
            )
        },
    };
    census_md(md, c, &c.growth(), &how, |md, end| {
        go_heap_md(md, c, end);
        crate::runtimes::go::report::roots_md(md, c);
    });
}

/// The Go runtime's heap profile part of the Go subsection.
fn go_heap_md(md: &mut String, c: &Census<Goroutines>, end: &Goroutines) {
    if end.mem_profile_rate == 0 {
        md.push_str(
            "The runtime's heap profile is off (`runtime.MemProfileRate` 0: the linker turns it off in a program that never \
             references `runtime.MemProfile`, e.g. through runtime/pprof): no in-use heap by function.\n\n",
        );
        return;
    }
    let _ = writeln!(
        md,
        "The runtime's own heap profile (`runtime.mbuckets`, one sample per {} allocated, scaled as pprof does; in use as of the GC before last), Go functions whose in-use heap grew:\n",
        bytes(end.mem_profile_rate)
    );
    let g = c.heap_growth();
    if g.is_empty() {
        md.push_str("- none grew\n");
    }
    for x in g.iter().take(MD_ROWS) {
        let stack = end.heap.iter().find(|h| h.function == x.name).map(|h| h.stack.join(" ← ")).unwrap_or_default();
        let _ = writeln!(
            md,
            "- **{}**: {} → {} in use ({}), {} → {} objects{}; stack: {stack}",
            x.name,
            bytes(x.bytes_start),
            bytes(x.bytes_end),
            rate(x.bytes_per_s),
            number(x.count_start as f64),
            number(x.count_end as f64),
            per_unit(x, "objects")
        );
    }
    md.push('\n');
}

/// A class of the program rather than of the JDK or an array (what an array is part of).
fn application_class(name: &str) -> bool {
    !name.ends_with("[]") && !["java.", "javax.", "jdk.", "sun.", "com.sun."].iter().any(|p| name.starts_with(p))
}

/// The leading sentence of the runtime's answer, for the verdict: the fastest-growing goroutine
/// group, or the fastest-growing class of the program (with the fastest-growing class by bytes
/// beside it when that is another: the arrays it holds). None: no census, or nothing grew.
pub fn holder_sentence(rec: &Recording) -> Option<String> {
    let h = rec.runtime_holds.as_ref()?;
    if let Some(c) = &h.go {
        let goroutines =
            c.growth().into_iter().next().map(|g| format!("{:+.0} goroutines/s {}", g.count_per_s, g.name));
        let heap = c
            .heap_growth()
            .into_iter()
            .next()
            .map(|g| format!("Go heap in use under {} {}", g.name, rate(g.bytes_per_s)));
        let root = crate::runtimes::go::report::root_sentence(c);
        let parts: Vec<String> = [root, goroutines, heap].into_iter().flatten().collect();
        return (!parts.is_empty()).then(|| parts.join("; "));
    }
    if let Some(p) = h.node_snapshots.as_ref().and_then(|s| Some((s, s.path.as_ref()?))) {
        let (s, path) = p;
        let secs = (s.second.t_s - s.first.t_s).max(f64::MIN_POSITIVE);
        let retained = s.new_objects.iter().find(|c| c.constructor == path.class).map_or(0, |c| c.retained_bytes);
        let retaining =
            if retained > 0 { format!(" retaining {}", rate(retained as f64 / secs)) } else { String::new() };
        return Some(format!(
            "constructor {} {:+.0} new objects/s{retaining} (heap snapshots), held by {}",
            path.class,
            path.instances as f64 / secs,
            path.describe()
        ));
    }
    if let Some(s) = h.node.as_ref().and_then(|c| c.end.as_ref()) {
        let f = s.functions.iter().find(|f| !f.function.starts_with('('))?;
        let secs = (s.taken.t_s - s.started_t_s).max(f64::MIN_POSITIVE);
        return Some(format!(
            "JS objects allocated by {} still alive: {}",
            f.function,
            rate(f.live_bytes as f64 / secs)
        ));
    }
    if let Some(s) = super::offheap::sentence(h) {
        return Some(s);
    }
    let growth = h.jvm.as_ref()?.growth();
    let top = growth.first()?;
    let app = growth.iter().find(|g| application_class(&g.name)).unwrap_or(top);
    let class = |g: &Growth| format!("{} {:+.0} instances/s, {}", g.name, g.count_per_s, rate(g.bytes_per_s));
    let held = h
        .jvm_heap_dump
        .as_ref()
        .and_then(|d| d.paths.iter().find(|p| p.class == app.name))
        .map(|p| {
            let (held, n) = (number(p.held as f64), number(p.instances as f64));
            format!(", held by {} ({held} of {n} instances in the heap dump)", p.describe())
        })
        .unwrap_or_default();
    Some(if app.name == top.name {
        format!("class {}{held}", class(app))
    } else {
        format!("class {} (with {}){held}", class(app), class(top))
    })
}

/// report.md's line under the verdict naming the runtime's answer (`--heap-census`), if any.
pub fn holder_line(md: &mut String, rec: &Recording) {
    if let Some(s) = holder_sentence(rec) {
        let _ = writeln!(md, "**What holds it** (the runtime's own census): {s}.\n");
    }
}

/// report.md's subsections of "What holds it" for the runtimes' own tools (their holders are
/// in the section's list, `report/what_holds.rs`); nothing without `--heap-census`.
pub fn holds_md(md: &mut String, rec: &Recording) {
    let Some(h) = &rec.runtime_holds else { return };
    if h.jvm.is_none() && h.go.is_none() && h.node.is_none() {
        return;
    }
    if let Some(c) = &h.jvm {
        jvm_md(md, c);
    }
    if let Some(d) = &h.jvm_heap_dump {
        dump_md(md, d);
    }
    if let Some(c) = &h.go {
        go_md(md, c);
    }
    if let Some(c) = &h.node {
        node_md(md, c);
    }
    if let Some(s) = &h.node_snapshots {
        snapshots_md(md, s);
    }
    md.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::{ClassCount, RuntimeHolds};

    fn hist(t_s: f64, classes: &[(&str, u64, u64)]) -> ClassHistogram {
        ClassHistogram {
            taken: Taken { t_s, took_s: 0.4, units_of_work: None },
            classes: classes.iter().map(|&(c, i, b)| ClassCount { class: c.into(), instances: i, bytes: b }).collect(),
            total_instances: 100,
            total_bytes: 1000,
        }
    }

    #[test]
    fn jvm_census_rendered_with_the_program_class_named() {
        let mut rec: Recording =
            serde_json::from_str(include_str!("../../testdata/demo-recording.json")).expect("demo");
        assert_eq!(holds_json(&rec), Value::Null, "null without --heap-census");
        let mut md = String::new();
        holds_md(&mut md, &rec);
        assert!(md.is_empty());
        rec.runtime_holds = Some(RuntimeHolds {
            jvm: Some(Census {
                start: Some(hist(
                    2.0,
                    &[("byte[]", 100, 21_600), ("App$Rec", 100, 2400), ("java.lang.String", 5, 120)],
                )),
                end: Some(hist(
                    12.0,
                    &[("byte[]", 5100, 1_101_600), ("App$Rec", 5100, 122_400), ("java.lang.String", 5, 120)],
                )),
                errors: Vec::new(),
            }),
            go: None,
            node: None,
            jvm_heap_dump: None,
            jvm_first_dump: None,
            node_snapshots: None,
        });
        let s = holder_sentence(&rec).expect("a holder");
        assert_eq!(s, "class App$Rec +500 instances/s, +11.7 KiB/s (with byte[] +500 instances/s, +105.5 KiB/s)");
        holds_md(&mut md, &rec);
        assert!(md.starts_with("### JVM: class histogram"), "{md}");
        assert!(md.contains("- **App$Rec**: 100 → 5,100 instances (+500.0/s)"), "{md}");
        assert!(!md.contains("java.lang.String"), "a class that does not grow is not listed: {md}");
        let j = holds_json(&rec);
        assert_eq!(j["jvm"]["growing_classes"][0]["name"], "byte[]");
        assert_eq!(j["jvm"]["growing_classes"][1]["instances_per_s"], 500.0);
        assert_eq!(j["go"], Value::Null);
    }
}
