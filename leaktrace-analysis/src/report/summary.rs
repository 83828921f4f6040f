//! `summary.md` and `summary.json` of a recording of several processes: one line per process
//! with its verdict, and the processes that were selected but not traced.

use std::path::PathBuf;

use crate::analyze::Analysis;
use crate::output::OutDir;
use crate::recording::Recording;

use crate::human;

use super::pprof;

/// One traced process of the summary.
pub struct SummaryRow<'a> {
    pub recording: &'a Recording,
    /// Its analysis (the same one its report was rendered from).
    pub analysis: &'a Analysis,
    /// Its output directory relative to the summary's (e.g. "pid-1234").
    pub dir: String,
}

/// summary.md: a table, one row per process, then the processes not traced.
pub fn summary_md(rows: &[SummaryRow<'_>], skipped: &[String]) -> String {
    let mut md = String::from(
        "# leaktrace summary\n\n| PID | PID in container | command | verdict | native live at end | report |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let t = &r.recording.target;
        let a = r.analysis;
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {}/report.md |\n",
            t.pid,
            t.nspid.last().copied().unwrap_or(t.pid),
            t.command.join(" ").replace('|', "\\|"),
            super::verdict::sentence(a).replace('|', "\\|"),
            human::bytes(a.summary.native_live_end_bytes),
            r.dir
        ));
    }
    if !skipped.is_empty() {
        md.push_str("\nNot traced:\n\n");
        for s in skipped {
            md.push_str(&format!("- {s}\n"));
        }
    }
    md
}

/// summary.json: `{"processes": [{pid, nspid, command, verdict {class, confidence, summary},
/// native_live_end_bytes, dir}], "skipped": [...]}`.
pub fn summary_json(rows: &[SummaryRow<'_>], skipped: &[String]) -> serde_json::Value {
    let processes: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let t = &r.recording.target;
            let a = r.analysis;
            serde_json::json!({
                "pid": t.pid,
                "nspid": t.nspid,
                "command": t.command.join(" "),
                "verdict": { "class": a.verdict.class.as_str(), "confidence": a.verdict.confidence, "summary": super::verdict::sentence(a) },
                "native_live_end_bytes": a.summary.native_live_end_bytes,
                "dir": r.dir,
            })
        })
        .collect();
    serde_json::json!({ "processes": processes, "skipped": skipped })
}

/// Write summary.md and summary.json into `dir` (atomically), and, when at least one process was
/// traced, the merged pprof profiles of all processes (`profile.pb.gz`, `growth.pb.gz`, see
/// [`pprof::merge`]; each sample labelled with its `pid`). Returns the paths written.
pub fn write_summary(dir: &OutDir, rows: &[SummaryRow<'_>], skipped: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let md_path = dir.write("summary.md", summary_md(rows, skipped).as_bytes())?;
    let json_path = dir.write("summary.json", &serde_json::to_vec_pretty(&summary_json(rows, skipped))?)?;
    let mut written = vec![md_path, json_path];
    if !rows.is_empty() {
        let heap: Vec<_> = rows.iter().map(|r| pprof::heap_profile(r.recording, r.analysis)).collect();
        let growth: Vec<_> = rows.iter().map(|r| pprof::growth_profile(r.recording, r.analysis)).collect();
        for (name, profiles) in [(pprof::PROFILE_FILE, heap), (pprof::GROWTH_FILE, growth)] {
            written.push(dir.write(name, &pprof::encode_gz(&pprof::merge(&profiles)?))?);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::fixtures::mixed;
    use crate::analyze::{AnalyzeOptions, analyze};

    #[test]
    fn one_row_per_process_and_the_skipped_ones() {
        let rec = mixed();
        let a = analyze(&rec, &AnalyzeOptions::default());
        let rows = [SummaryRow { recording: &rec, analysis: &a, dir: "pid-4242".into() }];
        let skipped = ["PID 7 skipped: it is a kernel thread".to_string()];
        let md = summary_md(&rows, &skipped);
        let row = md.lines().find(|l| l.starts_with("| 4242 |")).expect("a row for PID 4242");
        assert!(row.starts_with("| 4242 | 7 | ./server --port 8080 | leak: "), "{row}");
        assert!(
            row.ends_with(&format!("| {} | pid-4242/report.md |", human::bytes(a.summary.native_live_end_bytes))),
            "{row}"
        );
        assert!(md.ends_with("\nNot traced:\n\n- PID 7 skipped: it is a kernel thread\n"), "{md}");
        let j = summary_json(&rows, &skipped);
        assert_eq!(j["processes"][0]["pid"], 4242);
        assert_eq!(j["processes"][0]["nspid"][1], 7);
        assert_eq!(j["processes"][0]["verdict"]["class"], "leak");
        assert_eq!(j["processes"][0]["native_live_end_bytes"], a.summary.native_live_end_bytes);
        assert_eq!(j["processes"][0]["dir"], "pid-4242");
        assert_eq!(j["skipped"][0], "PID 7 skipped: it is a kernel thread");
    }
}
