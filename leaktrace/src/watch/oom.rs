//! The OOM-time report: when the OOM killer takes a watched process
//! (oom:mark_victim names it, else its memory cgroup's oom_kill counter rose: `record/ending.rs`),
//! what it held is written at the end of the window it died in, to `OUT/NAME/TIME-oom/`:
//! the window's growth-mode report (resident pages by the stack that first touched them:
//! recording.json, report.md, report.json …), and `oom.md` / `oom.json` with its memory
//! cgroup's limit, those stacks, what grew by stack over every window since it was watched
//! (`state::Proc::grown`), the sites with bytes of its last exact window when it was
//! escalated, and the last minutes of its memory series (one sample a second).

use std::fmt::Write as _;
use std::path::PathBuf;

use leaktrace_analysis::analyze::Analysis;
use leaktrace_analysis::human::bytes as human_bytes;
use leaktrace_analysis::output::OutDir;
use leaktrace_analysis::recording::Recording;

use super::state::Proc;

/// Growth-mode sites listed, at most.
const HELD_SITES: usize = 10;

/// Frames of each stack listed in oom.json (innermost first).
const STACK_FRAMES: usize = 12;

/// Whether `ended` (`Target::ended`, record/ending.rs's words) says the OOM killer took the
/// process: oom:mark_victim named it, or it ended while its cgroup's OOM killer fired. Not
/// "… the OOM killer did not choose it".
pub(super) fn killed_by_oom(ended: &str) -> bool {
    ended.starts_with("killed by the OOM killer") || ended.contains("most likely killed by the OOM killer")
}

/// How it ended, its memory cgroup's limit (bytes) and the file that set it.
struct Facts {
    ended: String,
    limit: Option<(u64, String)>,
}

/// The memory limit of the process's cgroup (the one it was in when first watched), bytes, and
/// the file that set it.
fn limit_of(p: &Proc) -> Option<(u64, String)> {
    let (f, _) = p.oom_events.as_ref()?;
    crate::record::ending::memory_limit_of(f).map(|(b, f)| (b, f.display().to_string()))
}

/// The facts of a process that died between two windows: its cgroup's OOM-kill count rose
/// (`Proc::oom_events`).
fn facts_between_windows(p: &Proc) -> Facts {
    let (ended, limit) = match &p.oom_events {
        Some((f, base)) => {
            let now = crate::record::ending::oom_kills(f).map_or("?".to_string(), |n| n.to_string());
            let limit = limit_of(p);
            (
                format!(
                    "ended between two windows while its cgroup's OOM killer fired (oom_kill of {} went {base} → {now}): most likely killed by the OOM killer",
                    f.display()
                ),
                limit,
            )
        }
        None => ("ended between two windows".to_string(), None),
    };
    Facts { ended, limit }
}

/// Write the OOM-time report of `pid` and return its directory: with `window` (the recording of
/// the window it died in and its analysis), that window's report and its stacks; without (it
/// died between two windows), what grew since it was watched only. Errors: a file that cannot
/// be written.
pub(super) fn write(
    pid: u32,
    window: Option<(&Recording, &Analysis)>,
    p: &Proc,
    out: &OutDir,
) -> anyhow::Result<PathBuf> {
    let dir = super::report_dir(out, &p.dir_name(pid), "-oom")?;
    let facts = match window {
        Some((rec, a)) => {
            crate::pipeline::finish(rec, &dir, a.top)?;
            Facts {
                ended: rec.target.ended.clone().unwrap_or_default(),
                // The window may have ended before its first reading of the limit.
                limit: rec.target.memory_limit_bytes.zip(rec.target.memory_limit_file.clone()).or_else(|| limit_of(p)),
            }
        }
        None => facts_between_windows(p),
    };
    let sites = window.map_or(&[][..], |(_, a)| &a.sites[..]);
    let held: Vec<serde_json::Value> = sites
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
        "ended": facts.ended,
        "memory_limit_bytes": facts.limit.as_ref().map(|l| l.0),
        "memory_limit_file": facts.limit.as_ref().map(|l| l.1.clone()),
        "held": held,
        "grown_since_watched": p.grown.iter().map(|g| serde_json::json!({"function": g.function, "bytes": g.bytes, "stack": g.stack})).collect::<Vec<_>>(),
        "escalation": escalation,
        "memory_series": series,
    });
    dir.write("oom.json", &serde_json::to_vec_pretty(&doc)?)?;
    dir.write("oom.md", markdown(pid, &facts, sites, p).as_bytes())?;
    Ok(dir.path().to_path_buf())
}

/// oom.md: the kill, the limit, what it held, and its memory over the last minutes (a row
/// every 10 s, and the last sample).
fn markdown(pid: u32, facts: &Facts, sites: &[leaktrace_analysis::analyze::SiteAnalysis], p: &Proc) -> String {
    let mut m = format!("# OOM kill of PID {pid} ({})\n\n", p.labels.comm);
    if let (Some(pod), ns) = (&p.labels.pod, &p.labels.namespace) {
        let _ = writeln!(m, "Pod {}/{pod}.\n", ns.as_deref().unwrap_or("?"));
    }
    let _ = writeln!(m, "{}.\n", facts.ended);
    match &facts.limit {
        Some((l, f)) => {
            let _ = writeln!(m, "Memory cgroup limit: {} ({f}).\n", human_bytes(*l));
        }
        None => m.push_str("Memory cgroup limit: none found.\n\n"),
    }
    m.push_str("## What it held (growth mode: resident pages by the stack that first touched them, this window)\n\n");
    m.push_str("| bytes | growth | function |\n| ---: | ---: | --- |\n");
    for s in sites.iter().filter(|s| s.held_bytes().0 > 0).take(HELD_SITES) {
        let under = s.first_touch_in.as_ref().map_or(String::new(), |f| {
            if s.kind == leaktrace_analysis::recording::StackKind::Mmap {
                format!(" (pages mapped by the allocator, {f})")
            } else {
                format!(" (first touched inside the allocator, {f})")
            }
        });
        let _ = writeln!(
            m,
            "| {} | {}/s | {}{under} |",
            human_bytes(s.held_bytes().0),
            human_bytes(s.growth_bytes_per_s.max(0.0) as u64),
            s.function
        );
    }
    m.push_str("\n## What grew since it was watched (every window: pages first touched, by stack)\n\n");
    m.push_str("| bytes | function |\n| ---: | --- |\n");
    for g in &p.grown {
        let _ = writeln!(m, "| {} | {} |", human_bytes(g.bytes), g.function);
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

#[cfg(test)]
mod tests {
    use super::killed_by_oom;

    #[test]
    fn only_an_oom_kill_is_one() {
        assert!(killed_by_oom("killed by the OOM killer (oom:mark_victim chose it at anon-rss 48000 KiB)"));
        assert!(killed_by_oom(
            "ended while its cgroup's OOM killer fired (x): most likely killed by the OOM killer (an attached …)"
        ));
        assert!(!killed_by_oom(
            "exited (an attached process's exit status is visible only to its parent; the OOM killer did not choose it)"
        ));
        assert!(!killed_by_oom("exited (…; its cgroup's OOM killer did not fire)"));
    }
}
