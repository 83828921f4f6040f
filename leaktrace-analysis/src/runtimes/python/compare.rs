//! `compare`, Python heap: the object counts by type of the two recordings'
//! censuses (`record --python-heap`, [`crate::runtimes::python::heap`]) side by side — how many objects of each
//! type a recording gained between its first and its last census, and at what rate: "function
//! +8,500 (+200.0/s) before → +0 after". Types listed: those that grew ([`is_growing`]) in
//! either recording, fastest-growing before first.

use serde::Serialize;

use crate::human::number;
use crate::recording::Recording;
use crate::retain::is_growing;
use crate::runtimes::python::heap::{HolderKind, PyCensus, holds};

/// One recording's figures for one type: counts at its first and last census.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TypeSide {
    /// Objects at the first and the last census (0 when the type was not seen).
    pub count_first: u64,
    pub count_last: u64,
    /// (last − first) / seconds between the censuses.
    pub count_per_s: f64,
    /// The gain is growth ([`is_growing`]: at least 20 objects and 5 %).
    pub growing: bool,
    /// The fastest-growing holder's pattern when it grew (`__main__.bus._handlers[…][…]`), or
    /// "referenced from nowhere".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

impl TypeSide {
    /// Objects gained between the first and the last census (negative: lost).
    pub fn gained(&self) -> i64 {
        self.count_last as i64 - self.count_first as i64
    }
}

/// One type in both recordings.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TypeChange {
    /// The type's name (`function`, `__main__.Handler`).
    #[serde(rename = "type")]
    pub name: String,
    /// None when that recording has fewer than two censuses.
    pub before: Option<TypeSide>,
    pub after: Option<TypeSide>,
    /// "fixed" (grew before, not after), "still growing", "new growth" or "not growing".
    pub status: &'static str,
}

/// The figures of type `name` in a recording's censuses; None with fewer than two censuses.
fn side(censuses: &[PyCensus], name: &str) -> Option<TypeSide> {
    let (first, last) = (censuses.first()?, censuses.last()?);
    let dt = last.t_s - first.t_s;
    if censuses.len() < 2 || dt <= 0.0 {
        return None;
    }
    let count = |c: &PyCensus| c.types.iter().find(|t| t.name == name).map_or(0, |t| t.count);
    let (c0, c1) = (count(first), count(last));
    let holder = holds(censuses, &|_| None)
        .and_then(|h| h.growing.into_iter().find(|g| g.name == name))
        .and_then(|g| g.holder)
        .map(|h| if h.kind == HolderKind::Nowhere { "referenced from nowhere".into() } else { h.pattern });
    Some(TypeSide {
        count_first: c0,
        count_last: c1,
        count_per_s: (c1 as f64 - c0 as f64) / dt,
        growing: is_growing(c0, c1),
        holder,
    })
}

/// The types that grew in either recording, with both sides; empty when neither recording has
/// two censuses.
pub fn compare_types(before: &Recording, after: &Recording) -> Vec<TypeChange> {
    let mut names: Vec<String> = Vec::new();
    for rec in [before, after] {
        let (Some(first), Some(last)) = (rec.python_heap.first(), rec.python_heap.last()) else { continue };
        for t in &last.types {
            let c0 = first.types.iter().find(|x| x.name == t.name).map_or(0, |x| x.count);
            if is_growing(c0, t.count) && !names.contains(&t.name) {
                names.push(t.name.clone());
            }
        }
    }
    let mut out: Vec<TypeChange> = names
        .into_iter()
        .map(|name| {
            let (b, a) = (side(&before.python_heap, &name), side(&after.python_heap, &name));
            let grew = |s: &Option<TypeSide>| s.as_ref().is_some_and(|s| s.growing);
            let status = match (grew(&b), grew(&a)) {
                (true, false) if a.is_some() => "fixed",
                (true, false) => "not censused after",
                (true, true) => "still growing",
                (false, true) => "new growth",
                (false, false) => "not growing",
            };
            TypeChange { name, before: b, after: a, status }
        })
        .collect();
    let rate = |s: &Option<TypeSide>| s.as_ref().map_or(0.0, |s| s.count_per_s);
    out.sort_by(|x, y| rate(&y.before).total_cmp(&rate(&x.before)).then(rate(&y.after).total_cmp(&rate(&x.after))));
    out
}

fn cell(s: &Option<TypeSide>) -> String {
    match s {
        None => "no censuses".into(),
        Some(s) => {
            let g = s.gained();
            let sign = if g >= 0 { "+" } else { "−" };
            format!("{sign}{} ({sign}{}/s)", number(g.unsigned_abs() as f64), number(s.count_per_s.abs()))
        }
    }
}

/// One verdict line per type that grew before or after: "Python heap: `function` +8,500
/// (+200/s) before, +0 (+0/s) after — fixed".
pub(crate) fn verdicts(changes: &[TypeChange]) -> Vec<String> {
    changes
        .iter()
        .filter(|c| c.status != "not growing")
        .map(|c| {
            format!("Python heap: `{}` {} before, {} after — {}", c.name, cell(&c.before), cell(&c.after), c.status)
        })
        .collect()
}

/// compare.md's "Python heap by type" section (empty without types to show).
pub fn types_md(changes: &[TypeChange]) -> String {
    if changes.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## Python heap by type (objects gained between the first and the last census)\n\n\
         | type | before | after | status | held by (before) |\n|---|---:|---:|---|---|\n",
    );
    for c in changes {
        let held = c.before.as_ref().and_then(|s| s.holder.clone()).unwrap_or_default();
        md.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            c.name.replace('`', "'"),
            cell(&c.before),
            cell(&c.after),
            c.status,
            if held.is_empty() { String::new() } else { format!("`{}`", held.replace(['`', '|'], "'")) }
        ));
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtimes::python::heap::{Holder, TypeCensus};

    fn census(t_s: f64, functions: u64, tuples: u64) -> PyCensus {
        let ty = |name: &str, count: u64, pattern: &str| TypeCensus {
            name: name.into(),
            count,
            bytes: count * 150,
            holders: vec![Holder { pattern: pattern.into(), count, bytes: count * 150, ..Default::default() }],
        };
        PyCensus {
            t_s,
            complete: true,
            types: vec![
                ty("function", functions, "__main__.bus._handlers[…][…]"),
                ty("tuple", tuples, "__main__.recent[…]"),
            ],
            ..Default::default()
        }
    }

    fn recording(censuses: Vec<PyCensus>) -> Recording {
        let mut r = crate::analyze::fixtures::mixed();
        r.python_heap = censuses;
        r
    }

    /// Handlers that leaked 8,500 functions over 42.5 s before a fix and none after: the type
    /// is "fixed", +8,500 (+200/s) → +0, held by the bus; the full deque (no growth in either)
    /// is not listed; a recording without censuses says so.
    #[test]
    fn type_counts_before_and_after_a_fix() {
        let before = recording(vec![census(1.0, 1000, 500), census(43.5, 9500, 500)]);
        let after = recording(vec![census(1.0, 1000, 500), census(43.5, 1000, 500)]);
        let c = compare_types(&before, &after);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].name.as_str(), c[0].status), ("function", "fixed"));
        let b = c[0].before.as_ref().unwrap();
        assert_eq!((b.gained(), b.count_per_s), (8500, 200.0));
        assert_eq!(b.holder.as_deref(), Some("__main__.bus._handlers[…][…]"));
        assert_eq!(c[0].after.as_ref().unwrap().gained(), 0);
        let md = types_md(&c);
        assert!(md.contains("| `function` | +8,500 (+200/s) | +0 (+0/s) | fixed |"), "{md}");
        assert_eq!(verdicts(&c), ["Python heap: `function` +8,500 (+200/s) before, +0 (+0/s) after — fixed"]);
        let none = compare_types(&before, &recording(Vec::new()));
        assert_eq!((none[0].status, none[0].after.is_none()), ("not censused after", true));
        assert!(types_md(&compare_types(&after, &after)).is_empty());
    }
}
