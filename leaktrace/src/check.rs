//! `leaktrace check`: the repeatable growth test, run live. Record with the batch schedule
//! (warm-up, then K equal batches), refuse a recording that lost allocations, evaluate it against
//! the budget ([`leaktrace_analysis::check`], where the rules are) and write `check.json`. Exit
//! code for CI: 0 pass, 1 fail, 2 error.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

pub use leaktrace_analysis::check::*;

use crate::discover::WorkProbeSpec;
use crate::pipeline;
use crate::probes::{Limits, Mode};
use crate::record::{BatchSize, ProcessOptions, RecordOptions, Schedule, TargetSpec};

/// Options of `leaktrace check`.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub warmup: Duration,
    pub batches: u32,
    pub size: BatchSize,
    /// Bytes per unit (with a work probe) or per second.
    pub budget: f64,
    pub work_probe: Option<WorkProbeSpec>,
    pub interval: Duration,
    /// None: ./leaktrace-check-PID-TIMESTAMP.
    pub out: Option<PathBuf>,
    pub limits: Limits,
    /// Reachability hook: scan at the end (`--reachability`); None: no scan.
    pub reachability: Option<crate::reach::ScanOptions>,
    /// `--python-heap`: Python heap censuses; None: none.
    pub python_heap: Option<crate::runtimes::python::heap::HeapOptions>,
    /// `--allow-seccomp-risk`: see [`crate::record::RecordOptions::allow_seccomp_risk`].
    pub allow_seccomp_risk: bool,
}

/// What `leaktrace check` did.
#[derive(Debug)]
pub struct CheckOutcome {
    pub dir: PathBuf,
    pub result: CheckResult,
    pub text: String,
}

/// Run the test: record with the batch schedule, evaluate, print nothing (see
/// [`CheckOutcome::text`]), write `check.json`. Errors (exit 2) include too few batches; the
/// recording is written before that error.
pub fn check(spec: TargetSpec, opts: CheckOptions) -> anyhow::Result<CheckOutcome> {
    anyhow::ensure!(opts.batches >= 1, "--batches must be at least 1");
    if let BatchSize::Units(_) = opts.size {
        anyhow::ensure!(opts.work_probe.is_some(), "--batch-units needs --work-probe");
    }
    // Only what differs from a plain recording's options (`RecordOptions::default()`).
    let ropts = RecordOptions {
        interval: opts.interval,
        out: opts.out.clone(),
        dir_prefix: Some("check"),
        limits: opts.limits,
        status_line: true,
        process: ProcessOptions {
            work_probe: opts.work_probe.clone(),
            // The test compares exact live bytes against a budget: no sampling.
            mode: Mode::Exact,
            allow_seccomp_risk: opts.allow_seccomp_risk,
            ..ProcessOptions::default()
        },
        schedule: Schedule::Batches { warmup: opts.warmup, count: opts.batches, size: opts.size },
        reachability: opts.reachability,
        python_heap: opts.python_heap,
        ..RecordOptions::default()
    };
    let outcome = pipeline::record(spec, ropts)?;
    let dir = outcome.dir.clone();
    let result = evaluate(&outcome.recording, opts.budget).with_context(|| {
        format!(
            "{} of {} batches completed; the recording is in {}",
            outcome.recording.checkpoints.iter().filter(|c| c.batch.is_some_and(|b| b > 0)).count(),
            opts.batches,
            dir.display()
        )
    })?;
    // A full map hides allocations: the slope would be too low, and a leak could pass.
    if let Some(lost) = untrusted_losses(&outcome.recording) {
        anyhow::bail!(
            "the test cannot be trusted: allocations were lost ({lost}; raise --max-allocs / --max-sites); the recording is in {}",
            dir.display()
        );
    }
    let mut text = String::new();
    if result.batches_completed < opts.batches {
        text.push_str(&format!(
            "warning: only {} of {} batches completed ({}): the slope is measured over those\n",
            result.batches_completed,
            opts.batches,
            end_reason_text(result.end_reason)
        ));
    }
    text.push_str(&render(&result));
    let mut json = serde_json::to_vec_pretty(&check_json(&result))?;
    json.push(b'\n');
    outcome
        .out
        .write("check.json", &json)
        .map_err(|e| anyhow::anyhow!("{e:#}; the recording and report are in {}", dir.display()))?;
    text.push_str(&format!("outputs: {} (check.json, recording.json, report.md, ...)\n", dir.display()));
    Ok(CheckOutcome { dir, result, text })
}

/// Build the target spec from `--pid` or a command.
pub fn target_spec(pid: Option<u32>, command: Vec<OsString>) -> anyhow::Result<TargetSpec> {
    match (pid, command.is_empty()) {
        (Some(pid), true) => Ok(TargetSpec::Pid(pid)),
        (None, false) => Ok(TargetSpec::Launch(command)),
        _ => anyhow::bail!("give either --pid PID or a command after --"),
    }
}
