//! After a recording session, one step for every command that records (`record`, `demo`,
//! `check`): save recording.json → analyse it once → render the report → the summary across
//! processes. The analysis is handed back to the caller (the CLI prints its verdict, `check`
//! reads the recording), so nothing reads its own outputs back from disk.

use std::path::{Path, PathBuf};

use crate::analyze::{Analysis, AnalyzeOptions, analyze};
use crate::launch::ExitStatus;
use crate::output;
use crate::record::{self, RecordOptions, TargetSpec};
use crate::recording::{EndReason, Recording};
use crate::report::{self, summary::SummaryRow};

/// One recorded process, saved and reported.
#[derive(Debug)]
pub struct RecordOutcome {
    /// Its output directory.
    pub dir: PathBuf,
    /// The files written there: recording.json first, then [`report::FILES`].
    pub files: Vec<PathBuf>,
    /// How a launched command ended (None when attached with --pid).
    pub exit_status: Option<ExitStatus>,
    pub recording: Recording,
    /// The analysis the report was rendered from.
    pub analysis: Analysis,
}

/// Result of recording several processes (`--pid` repeated, `--cgroup`, `--container`).
#[derive(Debug)]
pub struct MultiOutcome {
    /// The top output directory (one subdirectory `pid-N` per process when there are several).
    pub dir: PathBuf,
    pub outcomes: Vec<RecordOutcome>,
    /// summary.md and summary.json across processes (several processes only).
    pub summary_files: Vec<PathBuf>,
}

/// Save `recording` into `dir` (which must exist) as recording.json, analyse it once and write
/// the report rendered from that analysis. Returns the files written (recording.json first) and
/// the analysis. Errors name the file that could not be written.
pub fn finish(recording: &Recording, dir: &Path, top: usize) -> anyhow::Result<(Vec<PathBuf>, Analysis)> {
    let path = dir.join("recording.json");
    output::write_atomic(&path, &serde_json::to_vec(recording)?)?;
    let analysis = analyze(recording, &AnalyzeOptions { top });
    let mut files = vec![path];
    files.extend(report::render_all(recording, &analysis, dir)?);
    Ok((files, analysis))
}

/// Record every process the specification selects ([`record::record_all`]), then save, analyse
/// and report each one, and write the summary when there are several. Errors: those of the
/// recorder; an output that cannot be written; a work probe that was never found (after the
/// recording is saved, which the message names).
pub fn record_all(spec: TargetSpec, opts: RecordOptions) -> anyhow::Result<MultiOutcome> {
    let mut recorded = record::record_all(spec, &opts)?;
    let mut outcomes = Vec::new();
    for p in std::mem::take(&mut recorded.processes) {
        output::ensure_writable_dir(&p.dir)?;
        let (files, analysis) = finish(&p.recording, &p.dir, opts.top)?;
        outcomes.push(RecordOutcome {
            dir: p.dir,
            files,
            exit_status: p.exit_status,
            recording: p.recording,
            analysis,
        });
    }
    let summary_files = if recorded.several {
        let rows: Vec<SummaryRow<'_>> = outcomes
            .iter()
            .map(|o| SummaryRow {
                recording: &o.recording,
                analysis: &o.analysis,
                dir: o.dir.strip_prefix(&recorded.dir).unwrap_or(&o.dir).display().to_string(),
            })
            .collect();
        report::summary::write_summary(&recorded.dir, &rows, &recorded.skipped)?
    } else {
        Vec::new()
    };
    // Hook (issue #12, push): the final push, from the recordings just saved.
    recorded.finish_push(outcomes.iter().map(|o| o.recording.clone()).collect());
    recorded.wait_detached();
    if recorded.end_reason == EndReason::WorkProbeMissing {
        let spec = opts.work_probe.as_ref().map(|w| w.to_string()).unwrap_or_default();
        anyhow::bail!(
            "--work-probe {spec}: the function was not found in the objects the command maps, so no unit of work can be counted (the recording is in {})",
            recorded.dir.display()
        );
    }
    Ok(MultiOutcome { dir: recorded.dir, outcomes, summary_files })
}

/// Record exactly one process, then save, analyse and report it (see [`record_all`]).
pub fn record(spec: TargetSpec, opts: RecordOptions) -> anyhow::Result<RecordOutcome> {
    let mut multi = record_all(spec, opts)?;
    anyhow::ensure!(
        multi.outcomes.len() == 1,
        "this command traces one process; {} were selected",
        multi.outcomes.len()
    );
    Ok(multi.outcomes.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{Checkpoint, SiteSample};

    #[test]
    fn finish_saves_analyses_once_and_renders_from_that_analysis() {
        let mut rec: Recording = serde_json::from_value(serde_json::json!({
            "format_version": crate::recording::FORMAT_VERSION, "leaktrace_version": "t",
            "target": {"pid": 77, "command": ["./app"], "exe": "/app", "launched": true, "exit_status": 0},
            "mode": "exact", "started_unix_ms": 0, "interval_s": 1.0, "probes": [],
            "stacks": [{"id": 1, "kind": "malloc", "frames": [
                {"addr": 1, "object": "/lib/libc.so.6", "function": "malloc"},
                {"addr": 2, "object": "/app", "function": "keep_forever"}]}],
            "checkpoints": [], "end_reason": "duration"
        }))
        .unwrap();
        rec.checkpoints = (0..20u64)
            .map(|t| Checkpoint {
                t_s: t as f64,
                sites: vec![SiteSample {
                    stack: 1,
                    alloc_bytes: 4096 * (t + 1),
                    alloc_count: t + 1,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        let dir = std::env::temp_dir().join(format!("leaktrace-pipeline-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (files, analysis) = finish(&rec, &dir, 3).unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names[0], "recording.json");
        assert_eq!(&names[1..], report::FILES);
        assert_eq!(Recording::load(&dir.join("recording.json")).unwrap(), rec, "recording.json reads back as saved");
        assert_eq!(analysis, analyze(&rec, &AnalyzeOptions { top: 3 }), "the analysis handed back is the analysis");
        assert_eq!(analysis.verdict.class.as_str(), "leak");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
        assert_eq!(
            json["verdict"]["summary"],
            report::verdict::sentence(&analysis),
            "report.json renders that analysis"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
