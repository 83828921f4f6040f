//! The outputs of a check: the printed table and verdict ([`render`]) and `check.json`.

use super::*;

/// The printed result: one row per batch, the slope line, the growing sites.
pub fn render(r: &CheckResult) -> String {
    let mut out = String::new();
    let per_unit = r.unit == "B/unit";
    let mut rows: Vec<Vec<String>> = vec![{
        let mut h = vec!["batch".to_string()];
        if per_unit {
            h.extend(["units".into(), "Δ".into()]);
        }
        h.extend([
            "time".into(),
            "Δ".into(),
            "live native".into(),
            "Δ".into(),
            "live off-heap".into(),
            "Δ".into(),
            "RSS".into(),
            "Δ".into(),
        ]);
        h
    }];
    let mut prev: Option<&BatchRow> = None;
    for b in &r.batches {
        let mut row = vec![if b.batch == 0 { "0 (baseline)".to_string() } else { b.batch.to_string() }];
        let delta = |f: &dyn Fn(&BatchRow) -> i64| prev.map_or(String::new(), |p| human::exact_signed(f(b) - f(p)));
        if per_unit {
            row.push(b.units.map_or("?".into(), |u| u.to_string()));
            row.push(match (prev.and_then(|p| p.units), b.units) {
                (Some(p), Some(u)) => format!("+{}", u.saturating_sub(p)),
                _ => String::new(),
            });
        }
        row.push(format!("{:.1}s", b.t_s));
        row.push(prev.map_or(String::new(), |p| format!("+{:.1}s", b.t_s - p.t_s)));
        row.push(human::bytes(b.native_live_bytes));
        row.push(delta(&|x: &BatchRow| x.native_live_bytes as i64));
        row.push(human::bytes(b.offheap_live_bytes));
        row.push(delta(&|x: &BatchRow| x.offheap_live_bytes as i64));
        row.push(b.rss_bytes.map_or("-".into(), human::bytes));
        row.push(match (prev.and_then(|p| p.rss_bytes), b.rss_bytes) {
            (Some(p), Some(c)) => human::exact_signed(c as i64 - p as i64),
            _ => String::new(),
        });
        rows.push(row);
        prev = Some(b);
    }
    let ncol = rows[0].len();
    let widths: Vec<usize> = (0..ncol).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, v)| if c == 0 { format!("{v:<w$}", w = widths[c]) } else { format!("{v:>w$}", w = widths[c]) })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let ci = match r.ci95 {
        Some(ci) => format!("± {}, 95 % CI", number(ci)),
        None => "no confidence interval: only 2 points".to_string(),
    };
    out.push_str(&format!(
        "slope: {} ({ci}) — budget {}: {}\n",
        rate(r.slope, &r.unit),
        rate(r.budget, &r.unit),
        if r.pass { "PASS" } else { "FAIL" }
    ));
    if let Some(w) = &r.work_probe {
        out.push_str(&format!("  (1 unit = 1 call of {w})\n"));
    }
    out.push_str(&format!("  {}\n", r.reason));
    if !r.growing_sites.is_empty() {
        out.push_str("growing sites:\n");
        for s in &r.growing_sites {
            let ci = s.ci95.map(|c| format!(" ± {}", number(c))).unwrap_or_default();
            let callers =
                if s.callers.is_empty() { String::new() } else { format!("  (called from {})", s.callers.join(" < ")) };
            out.push_str(&format!(
                "  {}: {}{ci} [{}, {} live]{callers}\n",
                s.function,
                rate(s.slope, &r.unit),
                s.kind,
                human::bytes(s.live_bytes)
            ));
        }
    }
    out
}

/// `check.json`.
pub fn check_json(r: &CheckResult) -> serde_json::Value {
    serde_json::json!({
        "batches": r.batches,
        "batches_completed": r.batches_completed,
        "unit": r.unit,
        "work_probe": r.work_probe,
        "slope": finite(r.slope),
        "ci95": r.ci95.and_then(finite),
        "significant": r.significant,
        "budget": r.budget,
        "pass": r.pass,
        "reason": r.reason,
        "growing_sites": r.growing_sites.iter().map(|s| serde_json::json!({
            "stack": s.stack,
            "kind": s.kind,
            "function": s.function,
            "callers": s.callers,
            "slope": finite(s.slope),
            "ci95": s.ci95.and_then(finite),
            "live_bytes": s.live_bytes,
        })).collect::<Vec<_>>(),
        "end_reason": r.end_reason,
    })
}

pub(super) fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}
