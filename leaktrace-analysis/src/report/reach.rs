//! The reachability scan (`record --reachability`, [`crate::reachability`]) in report.json
//! (`reachability`, described in docs/report-json.md) and report.md (its subsection of "What
//! holds it"; its holders are in the section's list, `report/what_holds.rs`).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::analyze::Analysis;
use crate::human::{bytes, number};
use crate::reachability::{Reachability, SiteReach};
use crate::recording::Recording;

/// Sites shown in report.md's section.
const MD_SITES: usize = 20;

/// The sites of the scan in report order: growing sites first (the analysis' top by growth),
/// then by live bytes at the scan.
pub(super) fn ordered<'a>(rec: &'a Recording, a: &Analysis) -> Vec<&'a SiteReach> {
    let Some(r) = &rec.reachability else { return Vec::new() };
    let growth: Vec<u32> = a.top_by_growth().iter().map(|s| s.id).collect();
    let mut v: Vec<&SiteReach> = r.sites.iter().collect();
    v.sort_by_key(|s| {
        let g = growth.iter().position(|&id| id == s.stack).unwrap_or(usize::MAX);
        (g, std::cmp::Reverse(s.reachable_bytes + s.unreachable_bytes), s.stack)
    });
    v
}

pub(super) fn function_of(rec: &Recording, a: &Analysis, id: u32) -> String {
    if let Some(s) = a.sites.iter().find(|s| s.id == id) {
        return s.function.clone();
    }
    rec.stacks.iter().find(|s| s.id == id).map(|s| crate::analyze::culprit(s).1).unwrap_or_else(|| format!("site {id}"))
}

/// Every scan of the recording, oldest first: the periodic ones (`--reachability-every`), then
/// the one at the end.
pub(super) fn all_scans(rec: &Recording) -> Vec<&Reachability> {
    rec.reachability_scans.iter().chain(rec.reachability.as_ref()).collect()
}

/// (reachable bytes, unreachable bytes) of `site` at `scan` (0 when it had no live block then).
pub(super) fn site_at(scan: &Reachability, site: u32) -> (u64, u64) {
    scan.sites.iter().find(|s| s.stack == site).map_or((0, 0), |s| (s.reachable_bytes, s.unreachable_bytes))
}

/// What several scans say of lost and still-referenced bytes over time (one sentence), or None
/// with fewer than two scans or nothing that rose.
pub fn trend_sentence(values: &[(u64, u64)]) -> Option<String> {
    if values.len() < 2 {
        return None;
    }
    // Never falling from one scan to the next, and higher at the last than at the first.
    let rising = |f: fn(&(u64, u64)) -> u64| {
        values.windows(2).all(|w| f(&w[1]) >= f(&w[0])) && f(&values[values.len() - 1]) > f(&values[0])
    };
    match (rising(|v| v.1), rising(|v| v.0)) {
        (true, _) => Some(format!(
            "lost bytes rise at every scan ({} → {}): blocks are dropped without a free (a forgotten free)",
            bytes(values[0].1),
            bytes(values[values.len() - 1].1)
        )),
        (false, true) => Some(format!(
            "still-referenced bytes rise at every scan ({} → {}) while lost bytes do not: something keeps them (retention: a list, a map or a cache that is never pruned)",
            bytes(values[0].0),
            bytes(values[values.len() - 1].0)
        )),
        _ => None,
    }
}

/// `reachability` of report.json: null without a scan.
pub fn reach_json(rec: &Recording, a: &Analysis) -> Value {
    let Some(r) = &rec.reachability else { return Value::Null };
    let scans = all_scans(rec);
    let several = scans.len() > 1;
    let sites: Vec<Value> = ordered(rec, a)
        .into_iter()
        .map(|s| {
            let at: Vec<(u64, u64)> = scans.iter().map(|x| site_at(x, s.stack)).collect();
            let mut v = json!({
                "id": s.stack,
                "function": function_of(rec, a, s.stack),
                "class": a.sites.iter().find(|x| x.id == s.stack).map(|x| x.class.as_str()),
                "reachable_bytes": s.reachable_bytes,
                "reachable_blocks": s.reachable_blocks,
                "unreachable_bytes": s.unreachable_bytes,
                "unreachable_blocks": s.unreachable_blocks,
                "retained_by": s.retain_path(Some(function_of(rec, a, s.stack))),
            });
            if several {
                v["reachable_bytes_at_scans"] = json!(at.iter().map(|x| x.0).collect::<Vec<_>>());
                v["unreachable_bytes_at_scans"] = json!(at.iter().map(|x| x.1).collect::<Vec<_>>());
                v["trend"] = json!(trend_sentence(&at));
            }
            v
        })
        .collect();
    let scan_list: Vec<Value> = scans
        .iter()
        .map(|x| {
            json!({
                "t_s": x.t_s,
                "pause_ms": x.pause_ms,
                "complete": x.complete,
                "blocks": x.blocks,
                "reachable_bytes": x.sites.iter().map(|s| s.reachable_bytes).sum::<u64>(),
                "unreachable_bytes": x.sites.iter().map(|s| s.unreachable_bytes).sum::<u64>(),
            })
        })
        .collect();
    json!({
        "scans": scan_list,
        "t_s": r.t_s,
        "pause_ms": r.pause_ms,
        "threads": r.threads,
        "complete": r.complete,
        "notes": r.notes,
        "blocks": r.blocks,
        "block_bytes": r.block_bytes,
        "root_bytes_scanned": r.root_bytes_scanned,
        "untraced_bytes_scanned": r.untraced_bytes_scanned,
        "block_bytes_scanned": r.block_bytes_scanned,
        "sites": sites,
    })
}

/// One site's sentence: "1,532 of 1,600 blocks lost (nothing points at them), 1.5 MiB; the
/// other 68 (6.6 KiB) held by g_sessions (server)" (the whole path is in the holders' list).
pub fn site_sentence(s: &SiteReach) -> String {
    let total = s.reachable_blocks + s.unreachable_blocks;
    let held = match s.retained_by.first() {
        Some(root) => format!(": held by {}", root.label()),
        None => String::new(),
    };
    if s.unreachable_blocks == 0 {
        return format!("all {} block(s) ({}) still pointed at{held}", number(total as f64), bytes(s.reachable_bytes));
    }
    let mut out = format!(
        "{} of {} block(s) lost (nothing points at them), {}",
        number(s.unreachable_blocks as f64),
        number(total as f64),
        bytes(s.unreachable_bytes)
    );
    if s.reachable_blocks > 0 {
        let _ = write!(
            out,
            "; the other {} ({}) still pointed at{held}",
            number(s.reachable_blocks as f64),
            bytes(s.reachable_bytes)
        );
    }
    out
}

/// report.md's subsection of "What holds it" for the scan: lost and still pointed at, per
/// site; nothing without a scan.
pub fn reach_md(md: &mut String, rec: &Recording, a: &Analysis) {
    let Some(r) = &rec.reachability else { return };
    let _ = writeln!(md, "### Native: reachability scan at {:.1} s (--reachability)\n", r.t_s);
    let _ = writeln!(
        md,
        "Target paused {:.1} ms ({} thread(s)); scanned {} of roots (stacks, registers, globals), {} of heap that is no traced block (untraced roots), {} of reached blocks; {} live block(s), {}.{}\n",
        r.pause_ms,
        r.threads,
        bytes(r.root_bytes_scanned),
        bytes(r.untraced_bytes_scanned),
        bytes(r.block_bytes_scanned),
        number(r.blocks as f64),
        bytes(r.block_bytes),
        if r.complete { "" } else { " **Incomplete scan**: lost figures are not conclusive." }
    );
    for n in &r.notes {
        let _ = writeln!(md, "- note: {n}");
    }
    let lost: u64 = r.sites.iter().map(|s| s.unreachable_bytes).sum();
    let _ = writeln!(
        md,
        "Lost (nothing scanned points at them): {} in {} block(s). \"Still pointed at\" is an upper bound: any word that looks like a pointer keeps a block (docs/reachability.md).\n",
        bytes(lost),
        number(r.sites.iter().map(|s| s.unreachable_blocks).sum::<u64>() as f64)
    );
    let scans = all_scans(rec);
    if scans.len() > 1 {
        let steps: Vec<String> = scans
            .iter()
            .map(|x| format!("{} at {:.1} s", bytes(x.sites.iter().map(|s| s.unreachable_bytes).sum()), x.t_s))
            .collect();
        let pauses: Vec<f64> = scans.iter().map(|x| x.pause_ms).collect();
        let _ = writeln!(
            md,
            "Lost bytes at each of the {} scans (`--reachability-every`): {}; longest pause {:.1} ms.\n",
            scans.len(),
            steps.join(", "),
            pauses.iter().copied().fold(0.0, f64::max)
        );
    }
    for s in ordered(rec, a).into_iter().take(MD_SITES) {
        let class = a.sites.iter().find(|x| x.id == s.stack).map(|x| format!(" ({})", x.class)).unwrap_or_default();
        let at: Vec<(u64, u64)> = scans.iter().map(|x| site_at(x, s.stack)).collect();
        let trend = trend_sentence(&at).map(|t| format!("; {t}")).unwrap_or_default();
        let _ = writeln!(md, "- **{}**{class}: {}{trend}", function_of(rec, a, s.stack), site_sentence(s));
    }
    md.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reachability::Link;

    #[test]
    fn sentences() {
        let s = SiteReach {
            stack: 1,
            reachable_blocks: 68,
            reachable_bytes: 6800,
            unreachable_blocks: 1532,
            unreachable_bytes: 153_200,
            retained_by: vec![Link::Global {
                symbol: Some("g_sessions".into()),
                offset: 0,
                object: "/srv/server".into(),
            }],
        };
        assert_eq!(
            site_sentence(&s),
            "1,532 of 1,600 block(s) lost (nothing points at them), 149.6 KiB; the other 68 (6.6 KiB) still pointed at: held by g_sessions (server)"
        );
    }

    #[test]
    fn trends_over_scans() {
        assert_eq!(trend_sentence(&[(0, 100)]), None);
        let lost = trend_sentence(&[(10, 100), (10, 200), (12, 300)]).unwrap();
        assert!(lost.starts_with("lost bytes rise at every scan (100 B → 300 B)"), "{lost}");
        let held = trend_sentence(&[(100, 5), (200, 5), (300, 5)]).unwrap();
        assert!(held.starts_with("still-referenced bytes rise at every scan (100 B → 300 B)"), "{held}");
        // A fall in between is no trend; flat is none.
        assert_eq!(trend_sentence(&[(0, 100), (0, 50), (0, 300)]), None);
        assert_eq!(trend_sentence(&[(7, 7), (7, 7)]), None);
    }
}
