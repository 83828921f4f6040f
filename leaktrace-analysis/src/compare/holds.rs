//! `compare` of the runtimes' own censuses (`record --heap-census`): the classes, the JVM's
//! off-heap holders (their retained bytes), goroutine groups, JS functions and constructors
//! that grew in either recording, with their
//! rates before and after, in compare.md's "What holds it" table and compare.json's
//! `runtime_holds`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::recording::Recording;

/// Rows of each runtime's list taken from one recording (fastest first).
const PER_SIDE: usize = 5;

/// One thing counted by a runtime's census, with its rate in each recording (None: that
/// recording has no such census; 0: the census ran and it did not grow).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HoldsRow {
    /// `jvm class`, `jvm off-heap holder`, `go goroutines`, `go heap`, `node function`,
    /// `node constructor`.
    pub what: &'static str,
    /// The class, goroutine group, Go or JS function, or constructor.
    pub name: String,
    /// The rate's unit: `instances/s`, `goroutines/s`, `B/s`, `retained B/s` (a holder's
    /// retained bytes between the heap dumps), `new objects/s`.
    pub unit: &'static str,
    pub before: Option<f64>,
    pub after: Option<f64>,
}

/// (what, unit) → name → rate, for one recording; a census that ran gives its list (maybe empty).
type Rates = BTreeMap<(&'static str, &'static str), BTreeMap<String, f64>>;

fn rates(rec: &Recording) -> Rates {
    let mut out = Rates::new();
    let Some(h) = &rec.runtime_holds else { return out };
    if let Some(c) = &h.jvm {
        let e = out.entry(("jvm class", "instances/s")).or_default();
        e.extend(c.growth().into_iter().take(PER_SIDE).map(|g| (g.name, g.count_per_s)));
    }
    if h.jvm_heap_dump.is_some() {
        let e = out.entry(("jvm off-heap holder", "retained B/s")).or_default();
        let list = crate::holds::off_heap_retainers(h);
        e.extend(list.into_iter().take(PER_SIDE).map(|r| (r.container, r.bytes_per_s)));
    }
    if let Some(c) = &h.go {
        let e = out.entry(("go goroutines", "goroutines/s")).or_default();
        e.extend(c.growth().into_iter().take(PER_SIDE).map(|g| (g.name, g.count_per_s)));
        let e = out.entry(("go heap", "B/s")).or_default();
        e.extend(c.heap_growth().into_iter().take(PER_SIDE).map(|g| (g.name, g.bytes_per_s)));
    }
    if let Some(s) = h.node.as_ref().and_then(|c| c.end.as_ref()) {
        let secs = (s.taken.t_s - s.started_t_s).max(f64::MIN_POSITIVE);
        let e = out.entry(("node function", "B/s")).or_default();
        e.extend(s.functions.iter().take(PER_SIDE).map(|f| (f.function.clone(), f.live_bytes as f64 / secs)));
    }
    if let Some(s) = &h.node_snapshots {
        let secs = (s.second.t_s - s.first.t_s).max(f64::MIN_POSITIVE);
        let e = out.entry(("node constructor", "new objects/s")).or_default();
        let mut grew: Vec<_> = s.new_objects.iter().filter(|c| c.count_second > c.count_first).collect();
        grew.sort_by_key(|c| std::cmp::Reverse(c.count_second - c.count_first));
        e.extend(
            grew.iter().take(PER_SIDE).map(|c| (c.constructor.clone(), (c.count_second - c.count_first) as f64 / secs)),
        );
    }
    out
}

/// The rows of both recordings: every name either lists, with the other's rate (0 when its
/// census ran and the name did not grow, None when it had no such census).
pub fn rows(before: &Recording, after: &Recording) -> Vec<HoldsRow> {
    let (b, a) = (rates(before), rates(after));
    let mut keys: Vec<_> = b.keys().chain(a.keys()).copied().collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for k in keys {
        let (lb, la) = (b.get(&k), a.get(&k));
        let mut names: Vec<&String> = lb.into_iter().chain(la).flat_map(|m| m.keys()).collect();
        names.sort();
        names.dedup();
        for n in names {
            out.push(HoldsRow {
                what: k.0,
                name: n.clone(),
                unit: k.1,
                before: lb.map(|m| m.get(n).copied().unwrap_or(0.0)),
                after: la.map(|m| m.get(n).copied().unwrap_or(0.0)),
            });
        }
    }
    out
}

/// compare.md's "What holds it" table; empty when neither recording has a census.
pub fn md(rows: &[HoldsRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let cell = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |x| format!("{x:+.1}"));
    let mut md = String::from(
        "## What holds it (the runtimes' own censuses)\n\n| census | name | before | after | unit |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        md.push_str(&format!("| {} | `{}` | {} | {} | {} |\n", r.what, r.name, cell(r.before), cell(r.after), r.unit));
    }
    md.push_str("\n— : that recording has no such census (`record --heap-census`).\n\n");
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holds::{Census, ClassCount, ClassHistogram, RuntimeHolds, Taken};

    fn rec(end_count: u64) -> Recording {
        let mut r: Recording = serde_json::from_str(include_str!("../../testdata/demo-recording.json")).expect("demo");
        let h = |t_s: f64, n: u64| ClassHistogram {
            taken: Taken { t_s, took_s: 0.3, units_of_work: None },
            classes: vec![ClassCount { class: "App$Rec".into(), instances: n, bytes: n * 24 }],
            total_instances: n,
            total_bytes: n * 24,
        };
        r.runtime_holds = Some(RuntimeHolds {
            jvm: Some(Census { start: Some(h(1.0, 100)), end: Some(h(11.0, end_count)), errors: Vec::new() }),
            ..Default::default()
        });
        r
    }

    #[test]
    fn a_class_that_grew_before_and_not_after() {
        let rows = rows(&rec(5100), &rec(100));
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].what, rows[0].name.as_str()), ("jvm class", "App$Rec"));
        assert_eq!((rows[0].before, rows[0].after), (Some(500.0), Some(0.0)));
        let m = md(&rows);
        assert!(m.contains("| jvm class | `App$Rec` | +500.0 | +0.0 | instances/s |"), "{m}");
        let demo: Recording = serde_json::from_str(include_str!("../../testdata/demo-recording.json")).unwrap();
        let one = super::rows(&rec(5100), &demo);
        assert_eq!(one[0].after, None, "no census after");
        assert!(md(&super::rows(&demo, &demo)).is_empty());
    }

    /// A holder's retained-size growth before and after a fix: `App.LIST` retained 600 more
    /// direct buffers' blocks in 10 s before, none more after.
    #[test]
    fn a_holders_retained_growth_before_and_after_a_fix() {
        use crate::holds::HeapPaths;
        use crate::retain::Retained;
        let with = |grown: u64| {
            let dump = |t_s: f64, n: u64| HeapPaths {
                taken: Taken { t_s, took_s: 0.1, units_of_work: None },
                retainers: vec![Retained {
                    container: "App.LIST".into(),
                    off_heap: n * 1000,
                    blocks: n,
                    block_bytes: n * 1000,
                    ..Default::default()
                }],
                ..Default::default()
            };
            let mut r = rec(100);
            let h = r.runtime_holds.as_mut().expect("holds");
            (h.jvm_first_dump, h.jvm_heap_dump) = (Some(dump(1.0, 100)), Some(dump(11.0, 100 + grown)));
            r
        };
        let rows = rows(&with(600), &with(0));
        let holder = rows.iter().find(|r| r.what == "jvm off-heap holder").expect("a holder row");
        assert_eq!((holder.name.as_str(), holder.unit), ("App.LIST", "retained B/s"));
        assert_eq!((holder.before, holder.after), (Some(60_000.0), Some(0.0)));
        let m = md(&rows);
        assert!(m.contains("| jvm off-heap holder | `App.LIST` | +60000.0 | +0.0 | retained B/s |"), "{m}");
    }
}
