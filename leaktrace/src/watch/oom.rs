//! The OOM-time report (issue 34): when the OOM killer takes a watched process
//! (oom:mark_victim names it, else its memory cgroup's oom_kill counter rose: `record/ending.rs`),
//! what it held is written at the end of the window it died in, to `OUT/NAME/TIME-oom/`:
//! the window's growth-mode report (resident pages by the stack that first touched them:
//! recording.json, report.md, report.json …), and `oom.md` / `oom.json` with its memory
//! cgroup's limit, those stacks, the sites with bytes of its last exact window when it was
//! escalated, and the last minutes of its memory series (one sample a second).

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::analyze::Analysis;
use crate::output::OutDir;
use crate::recording::Recording;
use leaktrace_analysis::human::bytes as human_bytes;

use super::state::Proc;

/// Growth-mode sites listed, at most.
const HELD_SITES: usize = 10;

/// Frames of each stack listed in oom.json (innermost first).
const STACK_FRAMES: usize = 12;

/// Write the OOM-time report of `rec` (the window the process died in, analysed as `a`) and
/// return its directory. Errors: a file that cannot be written.
pub(super) fn write(rec: &Recording, a: &Analysis, p: &Proc, out: &OutDir) -> anyhow::Result<PathBuf> {
    let pid = rec.target.pid;
    let dir = super::report_dir(out, &p.dir_name(pid), "-oom")?;
    crate::pipeline::finish(rec, &dir, a.top)?;
    let held: Vec<serde_json::Value> = a
        .sites
        .iter()
        .filter(|s| s.held_bytes().0 > 0)
        .take(HELD_SITES)
        .map(|s| {
            let stack: Vec<&str> = s.frames.iter().filter_map(|f| f.function.as_deref()).take(STACK_FRAMES).collect();
            serde_json::json!({
                "function": s.function,
                "bytes": s.held_bytes().0,
                "growth_bytes_per_s": s.growth_bytes_per_s,
                "first_touch_in": s.first_touch_in,
                "stack": stack,
            })
        })
        .collect();
    let escalation = p.last_escalation_report.as_ref().map(|e| {
        serde_json::json!({
            "report": e.dir.display().to_string(),
            "verdict": e.sentence,
            "sites": e.sites.iter().map(|(f, b, g)| serde_json::json!({"function": f, "live_bytes": b, "growth_bytes_per_s": g})).collect::<Vec<_>>(),
        })
    });
    let series: Vec<serde_json::Value> = p
        .series
        .iter()
        .map(|s| serde_json::json!({"unix_ms": s.unix_ms, "rss_anon": s.rss_anon, "rss_file": s.rss_file, "rss_shmem": s.rss_shmem}))
        .collect();
    let doc = serde_json::json!({
        "pid": pid,
        "comm": p.labels.comm,
        "pod": p.labels.pod,
        "namespace": p.labels.namespace,
        "container": p.labels.container,
        "ended": rec.target.ended,
        "memory_limit_bytes": rec.target.memory_limit_bytes,
        "memory_limit_file": rec.target.memory_limit_file,
        "held": held,
        "escalation": escalation,
        "memory_series": series,
    });
    dir.write("oom.json", &serde_json::to_vec_pretty(&doc)?)?;
    dir.write("oom.md", markdown(rec, a, p).as_bytes())?;
    Ok(dir.path().to_path_buf())
}

/// oom.md: the kill, the limit, what it held, and its memory over the last minutes (a row
/// every 10 s, and the last sample).
fn markdown(rec: &Recording, a: &Analysis, p: &Proc) -> String {
    let t = &rec.target;
    let mut m = format!("# OOM kill of PID {} ({})\n\n", t.pid, p.labels.comm);
    if let (Some(pod), ns) = (&p.labels.pod, &p.labels.namespace) {
        let _ = writeln!(m, "Pod {}/{pod}.\n", ns.as_deref().unwrap_or("?"));
    }
    let _ = writeln!(m, "{}.\n", t.ended.as_deref().unwrap_or("killed by the OOM killer"));
    match (t.memory_limit_bytes, &t.memory_limit_file) {
        (Some(l), Some(f)) => {
            let _ = writeln!(m, "Memory cgroup limit: {} ({f}).\n", human_bytes(l));
        }
        _ => m.push_str("Memory cgroup limit: none found.\n\n"),
    }
    m.push_str("## What it held (growth mode: resident pages by the stack that first touched them, this window)\n\n");
    m.push_str("| bytes | growth | function |\n| ---: | ---: | --- |\n");
    for s in a.sites.iter().filter(|s| s.held_bytes().0 > 0).take(HELD_SITES) {
        let under = s.first_touch_in.as_ref().map(|f| format!(" (first touched under {f})")).unwrap_or_default();
        let _ = writeln!(
            m,
            "| {} | {}/s | {}{under} |",
            human_bytes(s.held_bytes().0),
            human_bytes(s.growth_bytes_per_s.max(0.0) as u64),
            s.function
        );
    }
    if let Some(e) = &p.last_escalation_report {
        let _ = writeln!(m, "\n## Its last exact window\n\n{}\n\nReport: {}\n", e.sentence, e.dir.display());
        m.push_str("| live bytes | function |\n| ---: | --- |\n");
        for (f, b, _) in &e.sites {
            let _ = writeln!(m, "| {} | {f} |", human_bytes(*b));
        }
    }
    m.push_str("\n## Memory, last minutes (one sample a second; a row every 10 s)\n\n");
    m.push_str("| seconds before the last sample | RSS anon | RSS file | RSS shmem |\n| ---: | ---: | ---: | ---: |\n");
    let last = p.series.back().map_or(0, |s| s.unix_ms);
    let n = p.series.len();
    for (i, s) in p.series.iter().enumerate().filter(|(i, _)| i % 10 == 0 || *i + 1 == n) {
        let _ = i;
        let _ = writeln!(
            m,
            "| {:.0} | {} | {} | {} |",
            (last - s.unix_ms) as f64 / 1000.0,
            human_bytes(s.rss_anon),
            human_bytes(s.rss_file),
            human_bytes(s.rss_shmem)
        );
    }
    m
}
