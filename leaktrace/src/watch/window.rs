//! One growth-mode window's end: each process's recording analysed by `record`'s analysis (its
//! verdict into the state), the OOM-killed ones reported, and the escalations the policy calls
//! for started in the recorder's own session (`record/escalate.rs`'s exact window); each exact
//! window's report written in its own thread once it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::WatchOptions;
use super::state::{EscalationSummary, GrownStack, WatchState, WindowVerdict};
use crate::record;
use leaktrace_analysis::analyze::{AnalyzeOptions, analyze};
use leaktrace_analysis::output::OutDir;
use leaktrace_analysis::recording::Recording;

/// Judge every recording of the window: each process's verdict (the same analysis as
/// `record`'s), an OOM-time report for those the OOM killer took. Returns the recordings of
/// the processes due for escalation now, by PID.
pub(super) fn judge(
    recordings: Vec<Recording>,
    state: &Arc<Mutex<WatchState>>,
    out: &OutDir,
    opts: &WatchOptions,
) -> HashMap<u32, Recording> {
    let mut kept = HashMap::new();
    for rec in recordings {
        let pid = rec.target.pid;
        let a = analyze(&rec, &AnalyzeOptions { top: opts.top });
        let verdict = WindowVerdict {
            class: if a.verdict.inconclusive { "inconclusive".into() } else { a.verdict.class.as_str().to_string() },
            sentence: leaktrace_analysis::report::verdict::sentence(&a),
            growth_bytes_per_s: a.rss_anon_trend.as_ref().map_or(0.0, |t| t.slope_bytes_per_s),
            lost_events: a.drops_total,
        };
        let grown = grown_by_stack(&a);
        let oom = rec.target.ended.as_deref().is_some_and(super::oom::killed_by_oom);
        let Ok(mut s) = state.lock() else { return kept };
        let Some(p) = s.procs.get_mut(&pid) else { continue };
        if p.verdict.as_ref().map(|v| v.class.as_str()) != Some(verdict.class.as_str()) {
            say_verdict(pid, &p.labels.comm, &verdict);
        }
        p.set_verdict(verdict);
        p.add_growth(grown);
        let ended = rec.target.ended.is_some();
        if ended {
            p.gone = true;
        }
        if oom && !p.oom_killed {
            p.oom_killed = true;
            let p = p.clone();
            s.oom_kills += 1;
            drop(s);
            report_oom(pid, Some((&rec, &a)), &p, out, state);
            continue;
        }
        // A process that ended is not escalated (there is nothing left to trace).
        if !ended {
            kept.insert(pid, rec);
        }
    }
    let Ok(mut s) = state.lock() else { return HashMap::new() };
    let mut due = s.due_escalations(&opts.policy, Instant::now());
    if let Some((pct, limit)) = s.cpu_over
        && !due.is_empty()
    {
        // Refused, not forgotten: the streak stays and the process is escalated once the
        // agent is back under its limit.
        let pids: Vec<String> = due.iter().map(u32::to_string).collect();
        crate::note!(
            "leaktrace: watch: escalation of PID {} refused for now: the agent used {pct:.1} % of a core over the last minute, above --max-cpu {limit}",
            pids.join(", ")
        );
        s.escalations_refused += due.len() as u64;
        due.clear();
    }
    let now = Instant::now();
    let mut out = HashMap::new();
    for pid in due {
        if let Some(rec) = kept.remove(&pid) {
            s.start_escalation(pid, now);
            out.insert(pid, rec);
        }
    }
    out
}

/// Longest part of a verdict's sentence said on stderr when it changes (the whole one is in the
/// metrics' labels and the reports).
const SAID_CHARS: usize = 160;

/// Say a process's new window verdict on stderr: one line when its class changes (the first one
/// included), so a user without `--metrics-listen` sees what each process does.
fn say_verdict(pid: u32, comm: &str, v: &WindowVerdict) {
    let mut sentence: String = v.sentence.chars().take(SAID_CHARS).collect();
    if v.sentence.chars().count() > SAID_CHARS {
        sentence.push('…');
    }
    crate::note!("leaktrace: watch: PID {pid} ({comm}): {} — {sentence}", v.class);
}

/// Write the OOM-time report of `pid` (`window`: the recording of the window it died in and
/// its analysis; None when it died between windows) and say where it is.
pub(super) fn report_oom(
    pid: u32,
    window: Option<(&Recording, &leaktrace_analysis::analyze::Analysis)>,
    p: &super::state::Proc,
    out: &OutDir,
    state: &Mutex<WatchState>,
) {
    match super::oom::write(pid, window, p, out) {
        Ok(dir) => {
            crate::note!("leaktrace: watch: PID {pid} was killed by the OOM killer; what it held: {}", dir.display());
            if let Ok(mut s) = state.lock() {
                s.reports.push(dir);
            }
        }
        Err(e) => crate::note!("leaktrace: watch: PID {pid}'s OOM-time report could not be written: {e:#}"),
    }
}

/// The window's sites that grew, as [`GrownStack`]s (growth over the window, bytes), the
/// 50 largest.
fn grown_by_stack(a: &leaktrace_analysis::analyze::Analysis) -> Vec<GrownStack> {
    let mut v: Vec<GrownStack> = a
        .sites
        .iter()
        .filter(|s| s.growth_bytes > 0)
        .map(|s| GrownStack {
            function: s.function.clone(),
            stack: s.frames.iter().filter_map(|f| f.function.clone()).take(12).collect(),
            bytes: s.growth_bytes as u64,
        })
        .collect();
    v.sort_by_key(|g| std::cmp::Reverse(g.bytes));
    v.truncate(50);
    v
}

/// Open an exact window on each process of `due` in the recorder's own session
/// ([`record::Recorder::escalate`]: no second tracer); its growth-mode window's recording waits
/// in `pending` for the exact window's end ([`report`]). A window that cannot be opened is
/// said, and its slot given back.
pub(super) fn escalate(
    due: HashMap<u32, Recording>,
    recorder: &mut record::Recorder,
    pending: &mut HashMap<u32, Recording>,
    state: &Mutex<WatchState>,
    opts: &WatchOptions,
) {
    let Some(window) = opts.policy.window else { return };
    for (pid, rec) in due {
        crate::note!(
            "leaktrace: watch: PID {pid} grew in {} window(s) in a row; exact window of {:.1} s (its allocator calls traced, then the probes removed)",
            opts.policy.after_windows,
            window.as_secs_f64()
        );
        match recorder.escalate(pid, window) {
            Ok(()) => {
                pending.insert(pid, rec);
            }
            Err(e) => {
                crate::note!("leaktrace: watch: the exact window on PID {pid} failed: {e:#}");
                if let Ok(mut s) = state.lock() {
                    s.escalating = s.escalating.saturating_sub(1);
                }
            }
        }
    }
}

/// Write the report of each exact window that ended (`done`, with its growth-mode window from
/// `pending`: `Recording::escalation`) to `OUT/NAME/TIME/`, each in its own thread (the
/// analysis and the push take time the recorder's polls must not wait for).
pub(super) fn report(
    done: Vec<record::WindowDone>,
    pending: &mut HashMap<u32, Recording>,
    state: &Arc<Mutex<WatchState>>,
    out: &OutDir,
    opts: &WatchOptions,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut handles = Vec::new();
    for record::WindowDone { pid, recording } in done {
        let Some(mut rec) = pending.remove(&pid) else { continue };
        let state = state.clone();
        let top = opts.top;
        let push = opts.push.clone();
        let Ok(out) = out.try_clone() else { continue };
        handles.push(std::thread::spawn(move || {
            let result = recording.and_then(|exact| {
                crate::note!("leaktrace: watch: exact window on PID {pid} done; its probes are removed");
                if let Some(cfg) = &push {
                    push_exact_window(cfg, super::push_labels(state.clone()), &exact);
                }
                rec.escalation = Some(Box::new(exact));
                let name = state.lock().ok().and_then(|s| s.procs.get(&pid).map(|p| p.dir_name(pid)));
                let dir = super::report_dir(&out, &name.unwrap_or_else(|| format!("pid-{pid}")), "")?;
                let (_, a) = crate::pipeline::finish(&rec, &dir, top)?;
                let lead = a.escalation.as_deref().unwrap_or(&a);
                let sites = lead
                    .sites
                    .iter()
                    .filter(|s| s.live_bytes > 0)
                    .take(top)
                    .map(|s| (s.function.clone(), s.live_bytes, s.growth_bytes_per_s))
                    .collect();
                Ok(EscalationSummary {
                    dir: dir.path().to_path_buf(),
                    sentence: leaktrace_analysis::report::verdict::sentence(&a),
                    sites,
                })
            });
            let Ok(mut s) = state.lock() else { return };
            s.escalating = s.escalating.saturating_sub(1);
            match result {
                Ok(sum) => {
                    crate::note!("leaktrace: watch: PID {pid}: {} (report in {})", sum.sentence, sum.dir.display());
                    s.reports.push(sum.dir.clone());
                    if let Some(p) = s.procs.get_mut(&pid) {
                        p.last_escalation_report = Some(sum);
                    }
                }
                Err(e) => crate::note!("leaktrace: watch: the exact window on PID {pid} failed: {e:#}"),
            }
        }));
    }
    handles
}

/// `--push`: the exact window's profiles sent once when it ends, with the process's labels and
/// `window=exact`, so the store holds the allocating stacks the growth-mode profiles cannot name
/// (growth mode charges a page to the code that first touches it, often the allocator itself).
fn push_exact_window(cfg: &crate::push::PushConfig, labels: crate::push::LabelsOf, exact: &Recording) {
    let mut cfg = cfg.clone();
    cfg.labels.push(("window".to_string(), "exact".to_string()));
    cfg.interval = None;
    crate::push::Pusher::start_labelled(cfg, exact.started_unix_ms, Some(labels)).finish(vec![exact.clone()]);
}
