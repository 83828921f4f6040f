//! After a recording session, one step for every command that records (`record`, `demo`,
//! `check`): save recording.json → analyse it once → render the report → the summary across
//! processes. The analysis is handed back to the caller (the CLI prints its verdict, `check`
//! reads the recording), so nothing reads its own outputs back from disk.

use std::path::PathBuf;

use crate::launch::ExitStatus;
use crate::record::{self, RecordOptions, RecordedProcess, TargetSpec};
use leaktrace_analysis::analyze::{Analysis, AnalyzeOptions, analyze};
use leaktrace_analysis::output::{self, OutDir};
use leaktrace_analysis::recording::{EndReason, Recording};
use leaktrace_analysis::report::{self, summary::SummaryRow};

/// One recorded process, saved and reported.
#[derive(Debug)]
pub struct RecordOutcome {
    /// Its output directory.
    pub dir: PathBuf,
    /// That directory, open: later outputs (check.json) are written through it.
    pub out: OutDir,
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

/// Save `recording` as recording.json in `dir`. When that fails (a full disk, a quota, an I/O
/// error) the recording is kept in a temporary file instead ([`output::save_fallback`]) and the
/// error, one line, names both the failure and where the recording is. Returns the file's path.
pub fn save_recording(recording: &Recording, dir: &OutDir) -> anyhow::Result<PathBuf> {
    // Streamed: the JSON of a recording with many stacks is hundreds of MB (pymalloc
    // with Python frames); it is held whole only for the fallback.
    match dir.write_with("recording.json", |w| serde_json::to_writer(w, recording).map_err(std::io::Error::other)) {
        Ok(p) => Ok(p),
        Err(e) => match output::save_fallback("leaktrace-recording", &serde_json::to_vec(recording)?) {
            Ok(kept) => anyhow::bail!(
                "{e:#}; the recording was saved to {} instead (`leaktrace report` reads it as DIR/recording.json)",
                kept.display()
            ),
            Err(e2) => anyhow::bail!("{e:#}; nor could it be kept in a temporary file: {e2:#}; the recording is lost"),
        },
    }
}

/// Save `recording` into `dir` as recording.json ([`save_recording`]), analyse it once and
/// write the report rendered from that analysis. Returns the files written (recording.json
/// first) and the analysis. Errors name the file that could not be written and where the
/// recording is.
pub fn finish(recording: &Recording, dir: &OutDir, top: usize) -> anyhow::Result<(Vec<PathBuf>, Analysis)> {
    let path = save_recording(recording, dir)?;
    let analysis = analyze(recording, &AnalyzeOptions { top });
    let mut files = vec![path.clone()];
    let rendered = report::render_all(recording, &analysis, dir).map_err(|e| {
        anyhow::anyhow!(
            "{e:#}; the recording is saved in {} (`leaktrace report {}` renders the report again)",
            path.display(),
            dir.path().display()
        )
    })?;
    files.extend(rendered);
    Ok((files, analysis))
}

/// The output directory of one recorded process: the session's, or its new `pid-N`
/// subdirectory.
fn process_dir(top: &OutDir, p: &RecordedProcess) -> anyhow::Result<OutDir> {
    match &p.subdir {
        Some(name) => top.subdir(name),
        None => top.try_clone(),
    }
}

/// Record every process the specification selects ([`record::record_all`]), then save, analyse
/// and report each one, and write the summary when there are several. Errors: those of the
/// recorder; an output that cannot be written (the recordings not yet saved are then saved, or
/// kept in temporary files, and the error says where); a work probe that was never found (after
/// the recording is saved, which the message names).
pub fn record_all(spec: TargetSpec, opts: RecordOptions) -> anyhow::Result<MultiOutcome> {
    let mut recorded = record::record_all(spec, &opts)?;
    let mut outcomes = Vec::new();
    let mut processes = std::mem::take(&mut recorded.processes).into_iter();
    while let Some(p) = processes.next() {
        let result = process_dir(&recorded.out, &p).and_then(|out| {
            let (files, analysis) = finish(&p.recording, &out, opts.top)?;
            Ok((out, files, analysis))
        });
        match result {
            Ok((out, files, analysis)) => outcomes.push(RecordOutcome {
                dir: p.dir,
                out,
                files,
                exit_status: p.exit_status,
                recording: p.recording,
                analysis,
            }),
            Err(e) => {
                // Nothing recorded is dropped: the other processes' recordings are saved too.
                let mut msg = format!("PID {}: {e:#}", p.recording.target.pid);
                for rest in processes {
                    let pid = rest.recording.target.pid;
                    match process_dir(&recorded.out, &rest).and_then(|o| save_recording(&rest.recording, &o)) {
                        Ok(path) => msg.push_str(&format!("; PID {pid}: recording saved in {}", path.display())),
                        Err(e) => msg.push_str(&format!("; PID {pid}: {e:#}")),
                    }
                }
                recorded.wait_detached();
                anyhow::bail!(msg);
            }
        }
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
        report::summary::write_summary(&recorded.out, &rows, &recorded.skipped)?
    } else {
        Vec::new()
    };
    // The sinks' end (`--push`'s final push), from the recordings just saved.
    let saved: Vec<Recording> = outcomes.iter().map(|o| o.recording.clone()).collect();
    recorded.finish_sinks(&saved);
    recorded.wait_detached();
    if recorded.end_reason == EndReason::WorkProbeMissing {
        let spec = opts.process.work_probe.as_ref().map(|w| w.to_string()).unwrap_or_default();
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
    use leaktrace_analysis::recording::{Checkpoint, SiteSample};

    #[test]
    fn finish_saves_analyses_once_and_renders_from_that_analysis() {
        let mut rec: Recording = serde_json::from_value(serde_json::json!({
            "format_version": leaktrace_analysis::recording::FORMAT_VERSION, "leaktrace_version": "t",
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
        let (files, analysis) = finish(&rec, &OutDir::for_out(&dir).unwrap(), 3).unwrap();
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
