//! "What holds it": every holder found by every producer — the native reachability scan
//! (`--reachability`), the Python census (`--python-heap`) and the runtimes' own tools
//! (`--heap-census`, `--heap-dump`, `--heap-snapshots`) — as one list of [`HeldBy`], rendered
//! the same way in report.md's "What holds it" section and report.json's `what_holds`
//! (described in docs/report-json.md): the holder, its root's kind, what it holds, the bytes it
//! retains split native / managed / off-heap when known, its growth and its [`RetainPath`].

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::analyze::Analysis;
use crate::holds::RuntimeHolds;
use crate::human::{bytes, number, rate};
use crate::recording::{Recording, Runtime};
use crate::retain::{RetainPath, RetainStep, Root, RootKind};

/// Holders shown in report.md (report.json lists them all).
const MD_HOLDERS: usize = 20;

/// Bytes a holder retains, split by kind of memory.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Split {
    pub native: u64,
    pub managed: u64,
    pub off_heap: u64,
}

impl Split {
    pub fn total(&self) -> u64 {
        self.native.saturating_add(self.managed).saturating_add(self.off_heap)
    }
}

/// One holder, whichever producer found it.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldBy {
    /// The holder as its producer names it (`__main__.PENDING`, `g_list (server)`,
    /// `DirectHolds.LEAKED`, `main.memo`, `auditTrail (Array)`).
    pub holder: String,
    /// Its root's kind (the path's first step; `gc_root` when the producer does not say).
    pub kind: RootKind,
    /// `native`, `python`, `jvm`, `go`, `node`.
    pub runtime: String,
    /// Who found it: `reachability`, `python_heap`, `jvm_heap_dump`, `node_snapshots`, `go_walk`.
    pub source: &'static str,
    /// What it holds, in words: `68 blocks of list_add`, `10,100 bytes objects`.
    pub holds: String,
    /// The bytes it retains (None: not measured). The native scan gives the bytes of the site's
    /// blocks still pointed at (no dominators), the Go walk the bytes reachable from this root
    /// alone, the Python census, the JVM's heap dump and V8 a dominator subtree.
    pub retained: Option<Split>,
    /// Growth of those bytes, per second, and of what it holds (objects, blocks, entries), per
    /// second, between the producer's first and last look (None: looked once).
    pub bytes_per_s: Option<f64>,
    pub count_per_s: Option<f64>,
    /// Judged a leak by its producer's rule (None: cannot tell from one look).
    pub growing: Option<bool>,
    /// From the root to what is held.
    pub path: RetainPath,
}

impl HeldBy {
    fn new(holder: String, runtime: &str, source: &'static str, holds: String, path: RetainPath) -> HeldBy {
        HeldBy {
            kind: path.root().map_or(RootKind::GcRoot, |r| r.kind),
            holder,
            runtime: runtime.into(),
            source,
            holds,
            retained: None,
            bytes_per_s: None,
            count_per_s: None,
            growing: None,
            path,
        }
    }
}

/// The native scan's holders: one per site with blocks still pointed at and a chain kept.
fn reach_holders(rec: &Recording, a: &Analysis, out: &mut Vec<HeldBy>) {
    let scans = super::reach::all_scans(rec);
    for s in super::reach::ordered(rec, a) {
        if s.reachable_blocks == 0 || s.retained_by.is_empty() {
            continue;
        }
        let function = super::reach::function_of(rec, a, s.stack);
        let path = s.retain_path(Some(function.clone()));
        let name = path.root().map_or_else(|| "?".to_string(), |r| r.name.clone());
        let holds = format!("{} block(s) of {function}", number(s.reachable_blocks as f64));
        let mut h = HeldBy::new(name, "native", "reachability", holds, path);
        h.retained = Some(Split { native: s.reachable_bytes, ..Default::default() });
        if let [f, .., l] = scans.as_slice() {
            let dt = l.t_s - f.t_s;
            let at: Vec<(u64, u64)> = scans.iter().map(|x| super::reach::site_at(x, s.stack)).collect();
            if dt > 0.0 {
                h.bytes_per_s = Some((at[at.len() - 1].0 as f64 - at[0].0 as f64) / dt);
            }
            h.growing = Some(at.windows(2).all(|w| w[1].0 >= w[0].0) && at[at.len() - 1].0 > at[0].0);
        }
        out.push(h);
    }
}

/// The Python census's holders: containers retaining native blocks, the holders of the types
/// that grew, the holders that did not grow.
fn python_holders(a: &Analysis, out: &mut Vec<HeldBy>) {
    use crate::runtimes::python::heap::{HolderKind, retain_path};
    let Some(h) = &a.python_holds else { return };
    let mut patterns: Vec<&str> = Vec::new();
    for r in &h.retainers {
        let holds = format!("{} `{}` objects", number(r.count_last as f64), r.type_name);
        let path = retain_path(&r.example, Some(&r.last));
        let mut x = HeldBy::new(r.container.clone(), Runtime::Python.as_str(), "python_heap", holds, path);
        x.retained = Some(Split { native: r.last.native, managed: r.last.managed, off_heap: r.last.off_heap });
        x.bytes_per_s = Some(r.bytes_per_s);
        x.growing = Some(r.growing && r.bytes_per_s > 0.0);
        patterns.push(&r.pattern);
        out.push(x);
    }
    let types = h.growing.iter().map(|g| (g, true)).chain(h.steady.iter().map(|g| (g, false)));
    for (g, grew) in types {
        let Some(holder) = &g.holder else { continue };
        if holder.kind == HolderKind::Garbage || patterns.contains(&holder.pattern.as_str()) {
            continue;
        }
        let name = match holder.kind {
            HolderKind::Path => holder.pattern.clone(),
            _ => "(referenced from nowhere)".to_string(),
        };
        let holds = format!("{} `{}` objects ({})", number(holder.count as f64), g.name, bytes(holder.bytes));
        let mut x =
            HeldBy::new(name, Runtime::Python.as_str(), "python_heap", holds, retain_path(&holder.example, None));
        if holder.kind == HolderKind::Nowhere {
            x.kind = RootKind::Unreferenced;
        }
        x.count_per_s = Some(g.holder_count_per_s);
        x.growing = Some(grew && g.holder_count_per_s > 0.0);
        out.push(x);
    }
}

/// The JVM's holders: the roots retaining direct buffers' blocks, and the roots holding the
/// classes that grew (the heap dump's paths).
pub(crate) fn jvm_holders(h: &RuntimeHolds, out: &mut Vec<HeldBy>) {
    for r in crate::holds::off_heap_retainers(h) {
        let mut path =
            vec![RetainStep::Root(Root::named(RootKind::GcRoot, r.container.clone(), Runtime::Jvm.as_str()))];
        if let Some(mean) = r.last.block_bytes.checked_div(r.last.blocks) {
            path.push(RetainStep::Native {
                stack: r.last.allocated_stack,
                allocated_by: r.last.allocated_by.clone(),
                bytes: Some(mean),
                offset: None,
            });
        }
        let holds = format!("{} direct buffers' blocks", number(r.last.blocks as f64));
        let mut x = HeldBy::new(r.container.clone(), Runtime::Jvm.as_str(), "jvm_heap_dump", holds, RetainPath(path));
        x.retained = Some(Split { native: r.last.native, managed: r.last.managed, off_heap: r.last.off_heap });
        if h.jvm_first_dump.is_some() {
            x.bytes_per_s = Some(r.bytes_per_s);
            x.growing = Some(r.growing);
        }
        out.push(x);
    }
    let Some(d) = &h.jvm_heap_dump else { return };
    let growth = h.jvm.as_ref().map(|c| c.growth()).unwrap_or_default();
    for p in &d.paths {
        let path = p.retain_path(Runtime::Jvm.as_str());
        let name = path.root().map_or_else(|| p.root_kind.clone(), |r| r.name.clone());
        let holds = format!("{} of {} `{}` instances", number(p.held as f64), number(p.instances as f64), p.class);
        let mut x = HeldBy::new(name, Runtime::Jvm.as_str(), "jvm_heap_dump", holds, path);
        if let Some(g) = growth.iter().find(|g| g.name == p.class) {
            x.bytes_per_s = Some(g.bytes_per_s);
            x.count_per_s = Some(g.count_per_s);
            x.growing = Some(true);
        }
        out.push(x);
    }
}

/// Node's holder: the object holding the top growing constructor's new instances.
fn node_holders(h: &RuntimeHolds, out: &mut Vec<HeldBy>) {
    let Some(s) = &h.node_snapshots else { return };
    let (Some(p), Some(holder)) = (&s.path, &s.holder) else { return };
    let secs = (s.second.t_s - s.first.t_s).max(f64::MIN_POSITIVE);
    let holds = format!("{} `{}` instances", number(holder.instances as f64), p.class);
    let mut x = HeldBy::new(
        holder.name.clone(),
        Runtime::Node.as_str(),
        "node_snapshots",
        holds,
        p.retain_path(Runtime::Node.as_str()),
    );
    x.retained = Some(Split { managed: holder.retained_bytes, ..Default::default() });
    let new = s.new_objects.iter().find(|c| c.constructor == p.class);
    x.bytes_per_s = new.map(|c| c.retained_bytes as f64 / secs);
    x.count_per_s = Some(p.instances as f64 / secs);
    x.growing = Some(p.instances > 0);
    out.push(x);
}

/// Go's holders: the package variables and goroutines' locals of the typed walk.
pub(crate) fn go_holders(h: &RuntimeHolds, out: &mut Vec<HeldBy>) {
    let Some(c) = &h.go else { return };
    for g in c.root_growth() {
        let kind = if g.goroutines.is_some() { RootKind::GoroutineLocal } else { RootKind::PackageVariable };
        let path = RetainPath(vec![
            RetainStep::Root(Root::named(kind, g.name.clone(), Runtime::Go.as_str())),
            RetainStep::Object { runtime: Runtime::Go.as_str().into(), type_name: g.type_name.clone() },
        ]);
        let mut holds = match g.entries_end {
            Some(e) => format!("{} entries, {} objects", number(e as f64), number(g.objects_end as f64)),
            None => format!("{} objects", number(g.objects_end as f64)),
        };
        if let Some(n) = g.goroutines {
            let at = g.started_at.as_deref().unwrap_or("?");
            let s = if n == 1 { "" } else { "s" };
            let _ = write!(holds, " (a local of {} goroutine{s} started at {at})", number(n as f64));
        }
        let mut x = HeldBy::new(g.name.clone(), Runtime::Go.as_str(), "go_walk", holds, path);
        x.retained = Some(Split { managed: g.bytes_end, ..Default::default() });
        x.bytes_per_s = Some(g.bytes_per_s);
        x.count_per_s = g.entries_end.map(|_| g.entries_per_s);
        x.growing = Some(g.growing);
        out.push(x);
    }
}

/// Every holder of the recording: growing ones first, then by bytes per second, then by
/// retained bytes.
pub fn holders(rec: &Recording, a: &Analysis) -> Vec<HeldBy> {
    let mut out = Vec::new();
    reach_holders(rec, a, &mut out);
    python_holders(a, &mut out);
    if let Some(h) = &rec.runtime_holds {
        jvm_holders(h, &mut out);
        node_holders(h, &mut out);
        go_holders(h, &mut out);
    }
    out.sort_by(|x, y| {
        y.growing
            .unwrap_or(false)
            .cmp(&x.growing.unwrap_or(false))
            .then(y.bytes_per_s.unwrap_or(0.0).total_cmp(&x.bytes_per_s.unwrap_or(0.0)))
            .then(y.retained.map_or(0, |r| r.total()).cmp(&x.retained.map_or(0, |r| r.total())))
    });
    out
}

fn one_json(h: &HeldBy) -> Value {
    json!({
        "holder": h.holder,
        "kind": h.kind,
        "runtime": h.runtime,
        "source": h.source,
        "holds": h.holds,
        "retained": h.retained.map(|r| json!({
            "native": r.native, "managed": r.managed, "off_heap": r.off_heap, "total": r.total(),
        })),
        "bytes_per_s": h.bytes_per_s.filter(|x| x.is_finite()),
        "count_per_s": h.count_per_s.filter(|x| x.is_finite()),
        "growing": h.growing,
        "path": h.path,
    })
}

/// report.json's `what_holds`: every holder, growing first (empty without a producer).
pub fn json(rec: &Recording, a: &Analysis) -> Value {
    Value::Array(holders(rec, a).iter().map(one_json).collect())
}

/// One holder's line in report.md.
pub fn line(h: &HeldBy) -> String {
    let code = |s: &str| s.replace('`', "'");
    let mut out = format!("- **`{}`** ({}, {}): holds {}", code(&h.holder), h.kind.words(), h.runtime, h.holds);
    if let Some(r) = h.retained {
        let _ = write!(
            out,
            "; retains {} (native {} / managed {} / off-heap {})",
            bytes(r.total()),
            bytes(r.native),
            bytes(r.managed),
            bytes(r.off_heap)
        );
    }
    let growth = match (h.bytes_per_s, h.count_per_s) {
        (Some(b), _) if b != 0.0 => Some(rate(b)),
        (_, Some(c)) => Some(format!("{c:+.1}/s")),
        _ => None,
    };
    match (h.growing, growth) {
        (Some(true), Some(g)) => {
            let _ = write!(out, "; **growing** {g}");
        }
        (Some(true), None) => out.push_str("; **growing**"),
        (Some(false), _) => out.push_str("; not growing: not a leak"),
        (None, _) => {}
    }
    if !h.path.is_empty() {
        let _ = write!(out, "\n  path: `{}`", code(&h.path.text()));
    }
    out
}

/// report.md's "What holds it" section: the holders, then each producer's own figures; nothing
/// without a producer.
pub fn md(md: &mut String, rec: &Recording, a: &Analysis) {
    let runtime = rec.runtime_holds.as_ref().filter(|h| h.jvm.is_some() || h.go.is_some() || h.node.is_some());
    if rec.reachability.is_none() && a.python_holds.is_none() && runtime.is_none() {
        return;
    }
    let _ = writeln!(md, "## What holds it\n");
    let list = holders(rec, a);
    if list.is_empty() {
        let _ = writeln!(md, "No holder found.\n");
    } else {
        let _ = writeln!(
            md,
            "Every holder found, growing ones first: its root's kind and runtime, what it holds, the bytes it retains \
             (native / managed / off-heap, when measured), its growth, and the path from its root.\n"
        );
    }
    for h in list.iter().take(MD_HOLDERS) {
        let _ = writeln!(md, "{}", line(h));
    }
    if list.len() > MD_HOLDERS {
        let _ = writeln!(md, "- … and {} more in report.json's `what_holds`", list.len() - MD_HOLDERS);
    }
    md.push('\n');
    super::reach::reach_md(md, rec, a);
    crate::runtimes::python::report::holds_md(md, a);
    super::holds::holds_md(md, rec);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::{AnalyzeOptions, analyze};
    use crate::reachability::{Link, Reachability, SiteReach};
    use crate::retain::Retained;
    use crate::runtimes::python::heap::{Holds, PathStep, RetainerGrowth};

    /// A native global found by the reachability scan and a Python container found by the
    /// census: one list, one line format, one path model in report.json.
    #[test]
    fn every_producer_in_one_list() {
        let mut rec: Recording =
            serde_json::from_str(include_str!("../../testdata/demo-recording.json")).expect("demo");
        let site = rec.stacks[0].id;
        rec.reachability = Some(Reachability {
            complete: true,
            sites: vec![SiteReach {
                stack: site,
                reachable_bytes: 6400,
                reachable_blocks: 100,
                retained_by: vec![Link::Global { symbol: Some("g_list".into()), offset: 0, object: "/srv/app".into() }],
                ..Default::default()
            }],
            ..Default::default()
        });
        let mut a = analyze(&rec, &AnalyzeOptions::default());
        let step = |e: &str, t: &str| PathStep { edge: e.into(), type_name: t.into() };
        let last = Retained {
            container: "__main__.PENDING".into(),
            native: 3_000_000,
            managed: 50_000,
            blocks: 1000,
            block_bytes: 3_000_000,
            allocated_by: Some("img_alloc".into()),
            ..Default::default()
        };
        a.python_holds = Some(Holds {
            censuses: 2,
            last_s: 10.0,
            retainers: vec![RetainerGrowth {
                container: "__main__.PENDING".into(),
                type_name: "imgbuf.Buffer".into(),
                count_last: 1000,
                last,
                bytes_per_s: 300_000.0,
                native_per_s: 290_000.0,
                growing: true,
                example: vec![step("__main__", "module"), step(".PENDING", "dict"), step("['k1']", "imgbuf.Buffer")],
                ..Default::default()
            }],
            ..Default::default()
        });
        let list = holders(&rec, &a);
        assert_eq!(list.len(), 2);
        assert_eq!((list[0].holder.as_str(), list[0].growing), ("__main__.PENDING", Some(true)));
        assert_eq!((list[1].holder.as_str(), list[1].kind), ("g_list (app)", RootKind::Global));
        let l0 = line(&list[0]);
        assert!(
            l0.starts_with(
                "- **`__main__.PENDING`** (module global, python): holds 1,000 `imgbuf.Buffer` objects; retains 2.9 MiB (native 2.9 MiB / managed 48.8 KiB / off-heap 0 B); **growing** +293.0 KiB/s"
            ),
            "{l0}"
        );
        assert!(
            l0.ends_with(
                "path: `__main__.PENDING (module global) → dict → ['k1'] → imgbuf.Buffer → native block of img_alloc (2.9 KiB)`"
            ),
            "{l0}"
        );
        let l1 = line(&list[1]);
        assert!(l1.contains("(global, native): holds 100 block(s) of ") && l1.contains("retains 6.2 KiB"), "{l1}");
        let j = json(&rec, &a);
        assert_eq!(j[0]["path"][0]["kind"], "module_global");
        assert_eq!(j[0]["path"][4]["step"], "native");
        assert_eq!(j[0]["retained"]["native"], 3_000_000);
        assert_eq!(j[1]["path"][0]["symbol"], "g_list");
        assert_eq!(j[1]["path"][1]["stack"], site);
        let mut m = String::new();
        md(&mut m, &rec, &a);
        assert!(m.starts_with("## What holds it\n\n"), "{m}");
        assert_eq!(m.matches("\n## ").count(), 0, "one section: {m}");
        assert!(m.contains("### Native: reachability scan at "), "{m}");
    }
}
