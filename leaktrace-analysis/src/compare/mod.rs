//! `leaktrace compare BEFORE AFTER`: two recordings of the same workload (from `record` or
//! `check`, e.g. before and after a fix), growth rates overall and per site, sites matched by a
//! stack signature that survives a rebuild, a verdict per leak, and a differential flame graph.
//! A pure function of the two recordings: no root, no target.
//!
//! Rules (also in `docs/usage.md`):
//! - Basis: bytes per unit of work when both recordings have a work probe with units counted in
//!   their window, else bytes per second.
//! - Window: the batch checkpoints (`batch: Some(_)`) when a recording has at least two, else
//!   the steady window of the analysis ([`analyze::steady_window`]: last half of the active span).
//! - Growth of a series: least-squares slope over the window ([`analyze::fit`]) with its 95 %
//!   CI. It is a *leak* when the slope is at least the floor and significant (CI above zero;
//!   with only 2 points, positive). Floor: max(1 B/unit or [`analyze::SITE_FLOOR_BYTES_PER_S`]
//!   B/s, [`analyze::SITE_FLOOR_FRACTION`] × peak live bytes / window length).
//! - Matching ([`signature`]): kind + the culprit function and up to [`CALLERS`] callers
//!   (non-allocator frames), by function name only; an unnamed frame counts as `[object
//!   basename]`. Addresses, line numbers and file names never enter: they change with a
//!   rebuild (and addresses with every run). Stacks of one recording with the same signature are
//!   summed.
//! - One classification: a signature the report's analysis classes as a cache, temporary or
//!   flat (no stack of it a leak) is not a leak here either.
//!   The total is judged the same way: when its fit is a leak, it is fitted again without those
//!   signatures, and growth they explain (a cache still filling) is not a leak of the whole.
//! - Verdict per site that leaked before: "fixed" when it no longer leaks after (or no longer
//!   allocates), else "still leaking" (with "no change beyond noise" when the two slopes differ
//!   by less than their combined 95 % intervals); a site that leaks only after is a "new leak".

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use crate::analyze::{self, basename, culprit, is_allocator};
use crate::check::stack_index;
use crate::human::{number, rate_in as rate};
use crate::output::OutDir;
use crate::recording::{Mode, Recording, Stack, StackKind};
use crate::timeline::Timeline;

pub mod holds;
mod render;

pub use crate::runtimes::python::compare::{TypeChange, TypeSide, compare_types, types_md};
pub use render::{MD_ROWS, compare_json, compare_md, diff_folded, diff_svg};

/// Callers of the culprit that enter a site's signature.
pub const CALLERS: usize = 6;
/// Absolute part of the leak floor per unit of work, bytes per unit.
pub const UNIT_FLOOR: f64 = 1.0;

/// A stack signature: stable across rebuilds and runs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Signature {
    /// "malloc", "mmap" or "fault".
    pub kind: StackKind,
    /// Culprit first, then its callers (outwards).
    pub frames: Vec<String>,
}

impl Signature {
    /// One string: `kind:culprit<caller<...`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.kind, self.frames.join("<"))
    }
    pub fn function(&self) -> &str {
        self.frames.first().map_or("[unknown]", String::as_str)
    }
}

fn sig_label(f: &crate::recording::Frame) -> String {
    match (&f.function, &f.object) {
        (Some(n), _) if !n.is_empty() => n.clone(),
        (_, Some(o)) => format!("[{}]", basename(o)),
        _ => "[unknown]".into(),
    }
}

/// The signature of a stack (see the module rules).
pub fn signature(st: &Stack) -> Signature {
    let kind = st.kind;
    let frames = match culprit(st).0 {
        Some(i) => {
            let mut v = vec![sig_label(&st.frames[i])];
            v.extend(st.frames[i + 1..].iter().filter(|f| !is_allocator(f)).take(CALLERS).map(|f| sig_label(f)));
            v
        }
        None if st.lost => vec!["[stack lost]".into()],
        None => vec!["[unknown]".into()],
    };
    Signature { kind, frames }
}

/// Growth of one series over a recording's window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Growth {
    /// Least-squares slope, bytes per unit (or per second).
    pub slope: f64,
    /// Half-width of the 95 % CI (None with 2 points).
    pub ci95: Option<f64>,
    /// CI above zero (with 2 points: slope > 0).
    pub significant: bool,
    /// Slower growth is noise.
    pub floor: f64,
    /// slope ≥ floor and significant, and the report does not classify the signature as
    /// something else (see `not_a_leak_in_report`).
    pub leak: bool,
    /// True when the fit alone would call it a leak but the report's classification of the same
    /// recording does not (a cache, temporary churn or flat): one classification for both.
    /// For the total: its growth without the signatures so classed is not a leak.
    pub not_a_leak_in_report: bool,
    /// Live bytes at the end of the window.
    pub live_bytes: u64,
}

impl Growth {
    fn of(xs: &[f64], ys: &[f64], abs_floor: f64) -> Growth {
        let pts: Vec<(f64, f64)> = xs.iter().copied().zip(ys.iter().copied()).collect();
        let tr = analyze::fit(&pts);
        let peak = ys.iter().copied().fold(0.0, f64::max);
        let span = xs.last().copied().unwrap_or(0.0) - xs.first().copied().unwrap_or(0.0);
        let rel = if span > 0.0 { analyze::SITE_FLOOR_FRACTION * peak / span } else { 0.0 };
        let floor = abs_floor.max(rel);
        let slope = tr.slope_bytes_per_s;
        // Two points give no confidence interval: no evidence of a leak either way.
        let significant = tr.ci95_bytes_per_s.is_some() && tr.significant_growth;
        Growth {
            slope,
            ci95: tr.ci95_bytes_per_s,
            significant,
            floor,
            leak: significant && slope >= floor,
            not_a_leak_in_report: false,
            live_bytes: ys.last().copied().unwrap_or(0.0) as u64,
        }
    }
}

/// One recording, as compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Side {
    /// Where it was loaded from.
    pub path: String,
    pub command: String,
    pub work_probe: Option<String>,
    /// Which checkpoints were fitted, in words.
    pub window: String,
    /// Number of checkpoints fitted.
    pub points: usize,
    /// Traced live bytes (all sites).
    pub overall: Growth,
}

/// Verdict on one signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Leaked before, does not after.
    Fixed,
    /// Leaks before and after.
    StillLeaking,
    /// Leaks only after.
    NewLeak,
    /// Leaks in neither.
    NoLeak,
}

/// One signature in either recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SiteComparison {
    pub signature: Signature,
    /// Name for humans: the culprit, with its first caller when another signature has the same
    /// culprit.
    pub name: String,
    /// None: the site is not in that recording (it made no allocation there).
    pub before: Option<Growth>,
    pub after: Option<Growth>,
    pub status: Status,
}

impl SiteComparison {
    fn slope_before(&self) -> f64 {
        self.before.map_or(0.0, |g| g.slope)
    }
    fn slope_after(&self) -> f64 {
        self.after.map_or(0.0, |g| g.slope)
    }
}

/// Everything [`compare`] finds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// "B/unit" or "B/s".
    pub unit: String,
    /// Why per second when a work probe was given to only one of them, etc.
    pub notes: Vec<String>,
    pub before: Side,
    pub after: Side,
    /// Signatures in both recordings, largest |growth| first.
    pub matched: Vec<SiteComparison>,
    /// Signatures only in BEFORE.
    pub only_before: Vec<SiteComparison>,
    /// Signatures only in AFTER.
    pub only_after: Vec<SiteComparison>,
    /// One line per site that leaked before or leaks after.
    pub verdicts: Vec<String>,
    /// The overall conclusion, one line.
    pub conclusion: String,
    /// Nothing grows beyond noise in AFTER (no site leaks, the total does not).
    pub after_flat: bool,
    /// The runtimes' own censuses before and after: [`holds::rows`].
    pub holds: Vec<holds::HoldsRow>,
    /// Python heap censuses (`--python-heap`): the types that grew in either recording, their
    /// objects gained before and after ([`compare_types`]); empty without censuses.
    pub python_types: Vec<TypeChange>,
}

/// A recording's fitted window.
struct Window {
    /// Indexes into `live_by_stack(rec)`.
    idx: Vec<usize>,
    desc: String,
}

fn window(rec: &Recording, tl: &Timeline, live: &[(usize, BTreeMap<u32, u64>)], name: &str) -> anyhow::Result<Window> {
    let batch: Vec<usize> = (0..live.len()).filter(|&i| rec.checkpoints[live[i].0].batch.is_some()).collect();
    if batch.len() >= 2 {
        let n = batch.len();
        return Ok(Window { idx: batch, desc: format!("batch checkpoints (baseline + {} batches)", n - 1) });
    }
    let (steady_from_s, span_to_s) = analyze::steady_window(rec, tl);
    let t0 = live.first().map_or(0.0, |(ci, _)| rec.checkpoints[*ci].t_s);
    let (from, to) = (steady_from_s - 1e-9, span_to_s + 1e-9);
    let idx: Vec<usize> = (0..live.len())
        .filter(|&i| {
            let t = rec.checkpoints[live[i].0].t_s - t0;
            t >= from && t <= to
        })
        .collect();
    anyhow::ensure!(
        idx.len() >= 2,
        "{name}: only {} checkpoint(s) in its steady window: no growth rate can be measured (record longer)",
        idx.len()
    );
    Ok(Window { desc: format!("steady window {steady_from_s:.1}–{span_to_s:.1} s ({} checkpoints)", idx.len()), idx })
}

/// Units of work at each point of the window, when all are known and they advance.
fn units(rec: &Recording, live: &[(usize, BTreeMap<u32, u64>)], w: &Window) -> Option<Vec<f64>> {
    rec.work_probe.as_ref()?;
    let xs: Option<Vec<f64>> =
        w.idx.iter().map(|&i| rec.checkpoints[live[i].0].units_of_work.map(|u| u as f64)).collect();
    let xs = xs?;
    (xs.last()? > xs.first()?).then_some(xs)
}

struct Measured {
    side: Side,
    sites: BTreeMap<Signature, Growth>,
    /// Live bytes of each signature at each point of the window.
    series: BTreeMap<Signature, Vec<f64>>,
}

fn measure(
    rec: &Recording,
    path: &str,
    live: &[(usize, BTreeMap<u32, u64>)],
    w: &Window,
    xs: &[f64],
    abs_floor: f64,
) -> Measured {
    let stacks = stack_index(rec);
    let mut sig_of: BTreeMap<u32, Signature> = BTreeMap::new();
    let mut series: BTreeMap<Signature, Vec<f64>> = BTreeMap::new();
    let n = w.idx.len();
    let mut total = vec![0.0; n];
    for (k, &i) in w.idx.iter().enumerate() {
        for (&id, &b) in &live[i].1 {
            let sig = sig_of
                .entry(id)
                .or_insert_with(|| match stacks.get(&id) {
                    Some(st) => signature(st),
                    None => Signature { kind: StackKind::Malloc, frames: vec!["[unknown]".into()] },
                })
                .clone();
            series.entry(sig).or_insert_with(|| vec![0.0; n])[k] += b as f64;
            total[k] += b as f64;
        }
    }
    let sites: BTreeMap<Signature, Growth> =
        series.iter().map(|(s, ys)| (s.clone(), Growth::of(xs, ys, abs_floor))).collect();
    let side = Side {
        path: path.to_string(),
        command: rec.target.command.join(" "),
        work_probe: rec.work_probe.clone(),
        window: w.desc.clone(),
        points: n,
        overall: Growth::of(xs, &total, abs_floor),
    };
    Measured { side, sites, series }
}

/// Signatures of `rec` that its report ([`analyze::analyze_timeline`]) classifies with no
/// leaking stack: every stack of the signature is a cache, temporary or flat.
fn report_non_leaks(rec: &Recording, tl: &Timeline) -> BTreeSet<Signature> {
    let a = analyze::analyze_timeline(rec, tl, &analyze::AnalyzeOptions::default());
    let class: BTreeMap<u32, analyze::SiteClass> = a.sites.iter().map(|s| (s.id, s.class)).collect();
    let mut leaks = BTreeSet::new();
    let mut others = BTreeSet::new();
    for st in &rec.stacks {
        match class.get(&st.id) {
            Some(analyze::SiteClass::Leak) => {
                leaks.insert(signature(st));
            }
            Some(_) => {
                others.insert(signature(st));
            }
            None => {}
        }
    }
    others.difference(&leaks).cloned().collect()
}

/// Names for humans: the culprit alone when no other signature has the same culprit; else the
/// culprit with the fewest callers that tell it apart (`f (from a < b)`), and the kind when
/// only the kind differs.
fn display_names(all: &BTreeSet<&Signature>) -> BTreeMap<Signature, String> {
    let mut groups: BTreeMap<&str, Vec<&Signature>> = BTreeMap::new();
    for s in all {
        groups.entry(s.function()).or_default().push(s);
    }
    let mut out = BTreeMap::new();
    for (f, group) in groups {
        for s in &group {
            if group.len() == 1 {
                out.insert((*s).clone(), f.to_string());
                continue;
            }
            let callers = &s.frames[1..];
            let k = (0..=callers.len())
                .find(|&k| group.iter().filter(|o| o.frames[1..].starts_with(&callers[..k])).count() == 1)
                .unwrap_or(callers.len());
            // Callers that repeat the culprit's name (inlined copies) say nothing.
            let shown: Vec<&str> = callers[..k].iter().map(String::as_str).filter(|c| *c != f).collect();
            let mut name = f.to_string();
            if !shown.is_empty() {
                name = format!("{name} (from {})", shown.join(" < "));
            }
            let same_callers = group.iter().filter(|o| o.frames == s.frames).count();
            if same_callers > 1 || k == callers.len() && shown.is_empty() {
                name = format!("{name} [{}]", s.kind);
            }
            out.insert((*s).clone(), name);
        }
    }
    out
}

/// Compare two recordings. `before_path`/`after_path` are only used in messages and outputs.
/// Steps: each side's steady window, the rate axis both are fitted on ([`axes`]), growth per
/// signature ([`measure`]) corrected by the reports' classes ([`apply_report_classes`]), the
/// signatures matched across the sides ([`match_sites`]), the verdict lines ([`leak_verdicts`])
/// and the PASS/FAIL line ([`conclusion`]).
pub fn compare(
    before: &Recording,
    before_path: &str,
    after: &Recording,
    after_path: &str,
) -> anyhow::Result<Comparison> {
    if (before.mode == Mode::Growth) != (after.mode == Mode::Growth) {
        anyhow::bail!(
            "BEFORE was recorded in {} mode and AFTER in {} mode: growth mode measures pages made resident, \
             not live allocations, so the two cannot be compared (record both in the same mode)",
            before.mode,
            after.mode
        );
    }
    let (tb, ta) = (Timeline::new(before), Timeline::new(after));
    let (lb, la) = (tb.live_by_stack(), ta.live_by_stack());
    let wb = window(before, &tb, &lb, "BEFORE")?;
    let wa = window(after, &ta, &la, "AFTER")?;
    let mut notes = Vec::new();
    let Axes { before: xb, after: xa, unit, abs_floor } = axes(
        SideInput { rec: before, live: &lb, window: &wb },
        SideInput { rec: after, live: &la, window: &wa },
        &mut notes,
    );
    let mut mb = measure(before, before_path, &lb, &wb, &xb, abs_floor);
    let mut ma = measure(after, after_path, &la, &wa, &xa, abs_floor);
    apply_report_classes(&mut mb, before, &tb, &xb, abs_floor);
    apply_report_classes(&mut ma, after, &ta, &xa, abs_floor);

    let (matched, only_before, only_after) = match_sites(&mb, &ma);
    let mut leaked: Vec<&SiteComparison> =
        matched.iter().chain(&only_before).chain(&only_after).filter(|s| s.status != Status::NoLeak).collect();
    leaked.sort_by(|x, y| {
        let new = |s: &SiteComparison| s.status == Status::NewLeak;
        new(x).cmp(&new(y)).then(magnitude(y).total_cmp(&magnitude(x)))
    });
    let mut verdicts = leak_verdicts(&leaked, unit);
    let (conclusion, after_flat) = conclusion(&leaked, &mb.side.overall, &ma.side.overall, unit);
    let python_types = compare_types(before, after);
    verdicts.extend(crate::runtimes::python::compare::verdicts(&python_types));
    Ok(Comparison {
        unit: unit.to_string(),
        notes,
        before: mb.side,
        after: ma.side,
        matched,
        only_before,
        only_after,
        verdicts,
        conclusion,
        after_flat,
        holds: holds::rows(before, after),
        python_types,
    })
}

/// One side of a comparison as [`axes`] reads it: the recording, its live bytes by stack and its
/// fitted window.
#[derive(Clone, Copy)]
struct SideInput<'a> {
    rec: &'a Recording,
    live: &'a [(usize, BTreeMap<u32, u64>)],
    window: &'a Window,
}

/// The axis both sides' growth is fitted on.
struct Axes {
    /// Units of work (or seconds) at each point of BEFORE's window.
    before: Vec<f64>,
    /// The same for AFTER.
    after: Vec<f64>,
    /// "B/unit" or "B/s".
    unit: &'static str,
    /// The absolute noise floor of a slope in that unit.
    abs_floor: f64,
}

/// Units of work when both recordings counted them over their windows, else seconds (with a
/// note saying why); a note too when the work probes differ.
fn axes(b: SideInput<'_>, a: SideInput<'_>, notes: &mut Vec<String>) -> Axes {
    let (before, after) = (b.rec, a.rec);
    let (ub, ua) = (units(before, b.live, b.window), units(after, a.live, a.window));
    let (xb, xa, unit, abs_floor) = match (ub, ua) {
        (Some(b), Some(a)) => (b, a, "B/unit", UNIT_FLOOR),
        (ub, ua) => {
            match (before.work_probe.is_some(), after.work_probe.is_some()) {
                (false, false) => notes.push(
                    "rates are per second (neither recording has a work probe): they are only comparable if both ran under the same load".into(),
                ),
                _ => notes.push(format!(
                    "rates are per second: units of work are {} (a work probe must count calls in both windows for rates per unit)",
                    match (ub.is_some(), ua.is_some()) {
                        (true, false) => "missing in AFTER",
                        (false, true) => "missing in BEFORE",
                        _ => "missing in both",
                    }
                )),
            }
            let secs = |s: SideInput<'_>| -> Vec<f64> {
                s.window.idx.iter().map(|&i| s.rec.checkpoints[s.live[i].0].t_s).collect()
            };
            (secs(b), secs(a), "B/s", analyze::SITE_FLOOR_BYTES_PER_S)
        }
    };
    if let (Some(p), Some(q)) = (&before.work_probe, &after.work_probe)
        && p != q
        && unit == "B/unit"
    {
        notes.push(format!("the work probes differ ({p} before, {q} after): a unit is not the same work"));
    }
    Axes { before: xb, after: xa, unit, abs_floor }
}

/// One classification: a signature whose stacks the report classifies, none of them a leak (a
/// cache, temporary churn, flat), is not a leak here either, whatever this window's fit. The
/// same for the total: growth that those signatures explain (a cache filling) is not a leak of
/// the whole either; the total is judged without them.
fn apply_report_classes(m: &mut Measured, rec: &Recording, tl: &Timeline, xs: &[f64], abs_floor: f64) {
    let not_leaks = report_non_leaks(rec, tl);
    for (sig, g) in &mut m.sites {
        if g.leak && not_leaks.contains(sig) {
            g.leak = false;
            g.not_a_leak_in_report = true;
        }
    }
    if m.side.overall.leak {
        let mut rest = vec![0.0; xs.len()];
        for (sig, ys) in m.series.iter().filter(|(sig, _)| !not_leaks.contains(*sig)) {
            debug_assert_eq!(ys.len(), rest.len(), "{sig:?}");
            rest.iter_mut().zip(ys).for_each(|(r, y)| *r += y);
        }
        if !Growth::of(xs, &rest, abs_floor).leak {
            m.side.overall.leak = false;
            m.side.overall.not_a_leak_in_report = true;
        }
    }
}

/// The larger of a compared site's two slopes, in magnitude: the order sites are listed in.
fn magnitude(s: &SiteComparison) -> f64 {
    s.slope_before().abs().max(s.slope_after().abs())
}

/// Every signature of either side with its status, as (matched, only before, only after), each
/// list by [`magnitude`], largest first.
fn match_sites(mb: &Measured, ma: &Measured) -> (Vec<SiteComparison>, Vec<SiteComparison>, Vec<SiteComparison>) {
    let all: BTreeSet<&Signature> = mb.sites.keys().chain(ma.sites.keys()).collect();
    let names = display_names(&all);
    let mut matched = Vec::new();
    let mut only_before = Vec::new();
    let mut only_after = Vec::new();
    for sig in all {
        let (b, a) = (mb.sites.get(sig).copied(), ma.sites.get(sig).copied());
        let leak_b = b.is_some_and(|g| g.leak);
        let leak_a = a.is_some_and(|g| g.leak);
        let status = match (leak_b, leak_a) {
            (true, false) => Status::Fixed,
            (true, true) => Status::StillLeaking,
            (false, true) => Status::NewLeak,
            (false, false) => Status::NoLeak,
        };
        let name = names.get(sig).cloned().unwrap_or_else(|| sig.function().to_string());
        let sc = SiteComparison { signature: sig.clone(), name, before: b, after: a, status };
        match (b, a) {
            (Some(_), Some(_)) => matched.push(sc),
            (Some(_), None) => only_before.push(sc),
            _ => only_after.push(sc),
        }
    }
    for v in [&mut matched, &mut only_before, &mut only_after] {
        v.sort_by(|x, y| magnitude(y).total_cmp(&magnitude(x)).then(x.signature.cmp(&y.signature)));
    }
    (matched, only_before, only_after)
}

/// One line per leaking site (leaks before, fastest first, then new leaks): fixed, still
/// leaking (with the change, or "no change beyond noise"), new; or that no site leaks.
fn leak_verdicts(leaked: &[&SiteComparison], unit: &str) -> Vec<String> {
    let mut verdicts = Vec::new();
    for s in leaked {
        let b = rate(s.slope_before(), unit);
        let a = rate(s.slope_after(), unit);
        let gone = if s.after.is_none() { " (the site no longer allocates)" } else { "" };
        verdicts.push(match s.status {
            Status::Fixed => format!("leak in {}: {b} before, {a} after{gone} — fixed", s.name),
            Status::StillLeaking => {
                // A difference inside both fits' 95 % intervals is noise, not a change.
                let noise = match (s.before.and_then(|g| g.ci95), s.after.and_then(|g| g.ci95)) {
                    (Some(cb), Some(ca)) => (cb * cb + ca * ca).sqrt(),
                    _ => 0.0,
                };
                let change = if (s.slope_after() - s.slope_before()).abs() <= noise {
                    " (no change beyond noise)".to_string()
                } else if s.slope_before() > 0.0 {
                    format!(" ({:+.0} %)", 100.0 * (s.slope_after() - s.slope_before()) / s.slope_before())
                } else {
                    String::new()
                };
                format!("leak in {}: {b} before, {a} after{change} — still leaking", s.name)
            }
            Status::NewLeak => format!("new leak in {}: {b} before, {a} after", s.name),
            Status::NoLeak => unreachable!(),
        });
    }
    if verdicts.is_empty() {
        verdicts.push("no site leaks, before or after".into());
    }
    verdicts
}

/// The PASS/FAIL line, from the sites still leaking after and the overall growth of each side;
/// and whether AFTER is flat.
fn conclusion(leaked: &[&SiteComparison], ob: &Growth, oa: &Growth, unit: &str) -> (String, bool) {
    let leaking_after: Vec<&str> = leaked
        .iter()
        .filter(|s| matches!(s.status, Status::StillLeaking | Status::NewLeak))
        .map(|s| s.name.as_str())
        .collect();
    let overall = format!("overall {} before, {} after", rate(ob.slope, unit), rate(oa.slope, unit));
    let after_flat = leaking_after.is_empty() && !oa.leak;
    let conclusion = if after_flat && oa.not_a_leak_in_report {
        format!(
            "PASS — after: flat but for sites its report classes as caches, temporary or flat, no site grows \
             beyond noise ({overall})"
        )
    } else if after_flat {
        format!("PASS — after: flat, no site grows beyond noise ({overall})")
    } else if leaking_after.is_empty() {
        format!("FAIL — after: still growing, spread over sites each below the leak floor ({overall})")
    } else {
        format!(
            "FAIL — after: still growing, {} site(s) leak: {} ({overall})",
            leaking_after.len(),
            leaking_after.join(", ")
        )
    };
    (conclusion, after_flat)
}

/// Load a recording from a directory (its recording.json) or a recording.json path.
pub fn load(path: &Path) -> anyhow::Result<Recording> {
    let file = if path.is_dir() { path.join("recording.json") } else { path.to_path_buf() };
    if !file.exists() {
        anyhow::bail!(
            "{}: no recording.json there (give a directory written by leaktrace record or check)",
            path.display()
        );
    }
    Recording::load(&file)
}

/// Result of [`run`].
#[derive(Debug)]
pub struct CompareOutcome {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    pub comparison: Comparison,
    /// What `leaktrace compare` prints.
    pub text: String,
}

/// `leaktrace compare BEFORE AFTER [--out DIR]`.
pub fn run(before: &Path, after: &Path, out: Option<PathBuf>) -> anyhow::Result<CompareOutcome> {
    let rb = load(before).context("BEFORE")?;
    let ra = load(after).context("AFTER")?;
    let c = compare(&rb, &before.display().to_string(), &ra, &after.display().to_string())?;
    let out_dir = match out {
        Some(p) => OutDir::for_out(&p)?,
        None => OutDir::create_named(&default_out_dir())?,
    };
    let dir = out_dir.path().to_path_buf();
    let mut files = Vec::new();
    let mut put = |name: &str, data: &[u8]| -> anyhow::Result<()> {
        files.push(out_dir.write(name, data)?);
        Ok(())
    };
    put("compare.md", compare_md(&c).as_bytes())?;
    let mut json = serde_json::to_vec_pretty(&compare_json(&c))?;
    json.push(b'\n');
    put("compare.json", &json)?;
    put("diff.svg", &diff_svg(&c)?)?;
    let mut text = String::new();
    text.push_str(&format!("growth in {} — before: {}; after: {}\n", c.unit, c.before.window, c.after.window));
    for n in &c.notes {
        text.push_str(&format!("note: {n}\n"));
    }
    for v in &c.verdicts {
        text.push_str(&format!("{v}\n"));
    }
    text.push_str(&format!("{}\n", c.conclusion));
    text.push_str(&format!(
        "{} matched sites, {} only before, {} only after\n",
        c.matched.len(),
        c.only_before.len(),
        c.only_after.len()
    ));
    for f in &files {
        text.push_str(&format!("  {}\n", f.display()));
    }
    Ok(CompareOutcome { dir, files, comparison: c, text })
}

fn default_out_dir() -> PathBuf {
    crate::output::timestamped_dir("compare")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::test_support::*;

    #[test]
    fn signature_ignores_addresses_lines_and_allocator() {
        let a = signature(&stack(1, "leak_fn", 0));
        let b = signature(&stack(7, "leak_fn", 0x5000));
        assert_eq!(a, b);
        assert_eq!(a.frames[0], "leak_fn");
        assert_eq!(a.frames[1..], ["run_workload", "main"]);
        assert_ne!(a, signature(&stack(1, "other_fn", 0)));
        let mut m = stack(1, "leak_fn", 0);
        m.kind = StackKind::Mmap;
        assert_ne!(a, signature(&m));
        // An unnamed frame is its object's basename.
        let mut u = stack(1, "leak_fn", 0);
        std::sync::Arc::make_mut(&mut u.frames[2]).function = None;
        assert_eq!(signature(&u).frames[1], "[app]");
        let lost = Stack { id: 1, kind: StackKind::Malloc, frames: vec![], lost: true, truncated: None, shared: false };
        assert_eq!(signature(&lost).frames, ["[stack lost]"]);
    }

    #[test]
    fn names_tell_signatures_apart() {
        let sig = |kind: StackKind, frames: &[&str]| Signature {
            kind,
            frames: frames.iter().map(|f| f.to_string()).collect(),
        };
        let a = sig(StackKind::Mmap, &["__mmap64", "__mmap64", "__minimal_malloc"]);
        let b = sig(StackKind::Mmap, &["__mmap64", "__mmap64", "_dl_map_segments", "_dl_map_object_from_fd"]);
        let c = sig(StackKind::Malloc, &["__mmap64", "__mmap64", "__minimal_malloc"]);
        let d = sig(StackKind::Malloc, &["handle", "main"]);
        let all: BTreeSet<&Signature> = [&a, &b, &c, &d].into_iter().collect();
        let n = display_names(&all);
        assert_eq!(n[&a], "__mmap64 (from __minimal_malloc) [mmap]");
        assert_eq!(n[&b], "__mmap64 (from _dl_map_segments)");
        assert_eq!(n[&c], "__mmap64 (from __minimal_malloc) [malloc]");
        assert_eq!(n[&d], "handle");
    }

    #[test]
    fn leak_fixed_after_rebuild() {
        let before = batch_recording(100, "leak_fn", 0);
        let after = batch_recording(0, "leak_fn", 0x2340);
        let c = compare(&before, "before", &after, "after").unwrap();
        assert_eq!(c.unit, "B/unit");
        assert!(c.only_before.is_empty() && c.only_after.is_empty(), "{c:#?}");
        assert_eq!(c.matched.len(), 3);
        let leak = c.matched.iter().find(|s| s.signature.function() == "leak_fn").unwrap();
        assert_eq!(leak.status, Status::Fixed);
        assert!((leak.before.unwrap().slope - 100.0).abs() < 1.0);
        assert!(leak.after.unwrap().slope.abs() < 1e-6);
        assert_eq!(c.verdicts, ["leak in leak_fn: 100 B/unit before, 0 B/unit after — fixed"]);
        assert!(c.after_flat);
        assert!(c.conclusion.starts_with("PASS"), "{}", c.conclusion);
        for s in &c.matched {
            if s.signature.function() != "leak_fn" {
                assert_eq!(s.status, Status::NoLeak, "{s:?}");
            }
        }
        let md = compare_md(&c);
        assert!(md.contains("leak in leak_fn") && md.contains("| `leak_fn` |"), "{md}");
        let j = compare_json(&c);
        assert_eq!(j["matched"][0]["status"], "fixed");
        assert_eq!(j["unit"], "B/unit");
        // Differential flame graph: the fixed leak is drawn (width = before), coloured blue.
        let folded = diff_folded(&c);
        assert_eq!(folded.trim(), "[malloc];main;run_workload;leak_fn 200 100");
        let svg = String::from_utf8(diff_svg(&c).unwrap()).unwrap();
        assert!(svg.contains("leak_fn") && svg.contains("<svg"), "{svg}");
    }

    #[test]
    fn still_leaking_and_new_leak() {
        let mut before = batch_recording(100, "leak_fn", 0);
        let after = batch_recording(60, "leak_fn", 8);
        let c = compare(&before, "b", &after, "a").unwrap();
        assert_eq!(c.matched[0].status, Status::StillLeaking);
        assert!(c.verdicts[0].contains("still leaking") && c.verdicts[0].contains("(-40 %)"), "{:?}", c.verdicts);
        assert!(!c.after_flat && c.conclusion.starts_with("FAIL"));

        // Per second when BEFORE has no work probe; a leak present only after is new.
        before.work_probe = None;
        let flat_after = batch_recording(0, "leak_fn", 0);
        let c = compare(&flat_after, "b", &batch_recording(100, "other_leak", 0), "a").unwrap();
        assert_eq!(c.unit, "B/unit");
        assert_eq!(c.only_before.len(), 1);
        assert_eq!(c.only_after.len(), 1);
        assert_eq!(c.only_after[0].status, Status::NewLeak);
        assert!(c.verdicts.iter().any(|v| v.starts_with("new leak in other_leak")), "{:?}", c.verdicts);
        let c = compare(&before, "b", &after, "a").unwrap();
        assert_eq!(c.unit, "B/s");
        assert!(c.notes[0].contains("per second"), "{:?}", c.notes);
    }

    #[test]
    fn periodic_recordings_use_the_steady_window() {
        let strip = |mut r: Recording| {
            for c in &mut r.checkpoints {
                c.batch = None;
            }
            r.work_probe = None;
            r
        };
        let c = compare(&strip(batch_recording(100, "leak_fn", 0)), "b", &strip(batch_recording(0, "leak_fn", 4)), "a")
            .unwrap();
        assert_eq!(c.unit, "B/s");
        assert!(c.before.window.starts_with("steady window"), "{}", c.before.window);
        assert_eq!(c.verdicts.len(), 1);
        assert!(c.verdicts[0].starts_with("leak in leak_fn: 20,000 B/s before, 0 B/s after"), "{:?}", c.verdicts);
    }
}
