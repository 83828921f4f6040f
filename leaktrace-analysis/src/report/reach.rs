//! The reachability scan (`record --reachability`, [`crate::reachability`]) in report.json
//! (`reachability`, described in docs/report-json.md) and report.md ("Who holds it").

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::analyze::Analysis;
use crate::human::{bytes, number};
use crate::reachability::{SiteReach, chain_line};
use crate::recording::Recording;

/// Sites shown in report.md's section.
const MD_SITES: usize = 20;

/// The sites of the scan in report order: growing sites first (the analysis' top by growth),
/// then by live bytes at the scan.
fn ordered<'a>(rec: &'a Recording, a: &Analysis) -> Vec<&'a SiteReach> {
    let Some(r) = &rec.reachability else { return Vec::new() };
    let growth: Vec<u32> = a.top_by_growth().iter().map(|s| s.id).collect();
    let mut v: Vec<&SiteReach> = r.sites.iter().collect();
    v.sort_by_key(|s| {
        let g = growth.iter().position(|&id| id == s.stack).unwrap_or(usize::MAX);
        (g, std::cmp::Reverse(s.reachable_bytes + s.unreachable_bytes), s.stack)
    });
    v
}

fn function_of(rec: &Recording, a: &Analysis, id: u32) -> String {
    if let Some(s) = a.sites.iter().find(|s| s.id == id) {
        return s.function.clone();
    }
    rec.stacks.iter().find(|s| s.id == id).map(|s| crate::analyze::culprit(s).1).unwrap_or_else(|| format!("site {id}"))
}

/// `reachability` of report.json: null without a scan.
pub fn reach_json(rec: &Recording, a: &Analysis) -> Value {
    let Some(r) = &rec.reachability else { return Value::Null };
    let sites: Vec<Value> = ordered(rec, a)
        .into_iter()
        .map(|s| {
            json!({
                "id": s.stack,
                "function": function_of(rec, a, s.stack),
                "class": a.sites.iter().find(|x| x.id == s.stack).map(|x| x.class.as_str()),
                "reachable_bytes": s.reachable_bytes,
                "reachable_blocks": s.reachable_blocks,
                "unreachable_bytes": s.unreachable_bytes,
                "unreachable_blocks": s.unreachable_blocks,
                "retained_by": s.retained_by,
            })
        })
        .collect();
    json!({
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
/// other 68 (6.6 KiB) held by g_sessions (server) → this block".
pub fn site_sentence(s: &SiteReach) -> String {
    let total = s.reachable_blocks + s.unreachable_blocks;
    let held =
        if s.retained_by.is_empty() { String::new() } else { format!(": held by {}", chain_line(&s.retained_by)) };
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

/// report.md's "Who holds it" section; nothing without a scan.
pub fn reach_md(md: &mut String, rec: &Recording, a: &Analysis) {
    let Some(r) = &rec.reachability else { return };
    let _ = writeln!(md, "## Who holds it (reachability scan at {:.1} s)\n", r.t_s);
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
    for s in ordered(rec, a).into_iter().take(MD_SITES) {
        let class = a.sites.iter().find(|x| x.id == s.stack).map(|x| format!(" ({})", x.class)).unwrap_or_default();
        let _ = writeln!(md, "- **{}**{class}: {}", function_of(rec, a, s.stack), site_sentence(s));
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
            "1,532 of 1,600 block(s) lost (nothing points at them), 149.6 KiB; the other 68 (6.6 KiB) still pointed at: held by g_sessions (server) → this block"
        );
    }
}
