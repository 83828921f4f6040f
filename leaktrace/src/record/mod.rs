//! The recorder: attach to a target (running, or launched by us), take a checkpoint every
//! interval until the end (duration, signal, target exit), and hand back one recording per
//! process ([`Recorded`]); [`crate::pipeline`] saves, analyses and renders them. Nothing collected
//! is lost: the recordings hold every checkpoint taken, whatever ended the run.
//!
//! Files: this one holds the options and [`record_all`] (attach, run the session, build the
//! recordings); `targets.rs` which processes and objects; `traced.rs` one traced process's state
//! and checkpoints; `ending.rs` how a traced process ended; `session.rs` the polling loop that decides when checkpoints are taken and
//! when the recording ends, over a trait; `live.rs` that trait's real side (the eBPF tracer,
//! /proc); `sink.rs` what consumes the checkpoints (status line, periodic scans and censuses,
//! push).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::discover::{self, WorkProbeSpec};
use crate::launch::{self, ExitStatus, HeldChild};
use crate::probes::{Limits, Mode, Tracer};
use crate::procinfo;
use leaktrace_analysis::output;
use leaktrace_analysis::recording::{EndReason, Recording, Target};

pub(crate) mod ending;
pub(crate) mod escalate;
mod forks;
mod heap_dumps;
mod live;
mod py_heap_state;
// Reachability hook.
mod pyheap;
mod reachability;
mod recorder;
mod session;
mod sink;
mod targets;
mod traced;

use live::Live;
pub use recorder::{Dropped, Recorder, RecorderCosts, WindowDone, thread_cpu_s};
use session::Session;
use sink::Sinks;
use targets::launch_objects;
pub use targets::{cgroup_dir, cgroup_tree_pids, resolve_pids};
use traced::Traced;
pub use traced::{MAX_CHECKPOINTS, fix_caller, thin};

/// What to trace.
#[derive(Clone, Debug)]
pub enum TargetSpec {
    /// A running process.
    Pid(u32),
    /// Several running processes (`--pid` repeated).
    Pids(Vec<u32>),
    /// The processes of a cgroup (v2 path, absolute or relative to /sys/fs/cgroup).
    Cgroup(PathBuf),
    /// The processes of a container: every process whose /proc/PID/cgroup mentions this ID.
    Container(String),
    /// A command to start (argv).
    Launch(Vec<OsString>),
    /// Processes a selector found (`leaktrace watch`'s rescans): as `Pids`, but one that cannot
    /// be traced is skipped with a line saying why, as in cgroup mode.
    Found(Vec<u32>),
}

/// When checkpoints are taken besides the periodic ones.
#[derive(Clone, Debug, Default)]
pub enum Schedule {
    /// Periodic checkpoints only, until --duration, a signal or the target's exit.
    #[default]
    Periodic,
    /// `leaktrace check`: after `warmup`, a baseline checkpoint (batch 0), then one checkpoint at
    /// the end of each of `count` batches; the recording ends after the last batch.
    Batches { warmup: Duration, count: u32, size: BatchSize },
}

/// Size of one batch of `leaktrace check`.
#[derive(Clone, Copy, Debug)]
pub enum BatchSize {
    /// This many calls of the work-probe function.
    Units(u64),
    /// This much time.
    Seconds(Duration),
}

/// How each process of a session is attached and traced: the same for every process of it
/// (those found at the start, followed children, processes a `watch` adds later), except that an
/// exact window overrides its mode ([`escalate`]'s `window_options`).
#[derive(Clone, Debug)]
pub struct ProcessOptions {
    /// Exact, sampled or growth mode.
    pub mode: Mode,
    /// Sampled mode: the mean distance between samples, bytes (`--sample-bytes`;
    /// [`crate::probes::DEFAULT_SAMPLE_BYTES`] when None). Ignored in the other modes.
    pub sample_bytes: Option<u64>,
    /// Count calls of this function as units of work.
    pub work_probe: Option<WorkProbeSpec>,
    /// Also hook CPython's allocator API (PyObject_Malloc, PyMem_Malloc, ...): blocks served
    /// from pymalloc's arenas are traced by stack (`--pymalloc`).
    pub pymalloc: bool,
    /// Read CPython targets' Python frames at each allocation (`--python-frames`).
    pub python_frames: bool,
    /// `--jvm-perf-map`: on JVM targets, leaktrace may run `jcmd PID Compiler.perfmap` (when new
    /// unnamed JIT frames appear, bounded, and once at the end) so Java frames are named, and
    /// `jcmd PID VM.flags -all` once (is -XX:+PreserveFramePointer on?); see runtimes/jcmd.rs.
    pub jvm_perf_map: bool,
    /// `--heap-census`: drive the runtimes' own heap tools at the start and the end
    /// (the JVM's class histogram, a full GC each; Go's goroutines): `crate::holds`.
    pub heap_census: bool,
    /// `--allow-seccomp-risk`: attach to a seccomp-filtered target even on a kernel whose
    /// uretprobes its filter may block (see `seccomp.rs`; a warning instead of the refusal).
    pub allow_seccomp_risk: bool,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        ProcessOptions {
            mode: Mode::Exact,
            sample_bytes: None,
            work_probe: None,
            pymalloc: false,
            python_frames: true,
            jvm_perf_map: false,
            heap_census: false,
            allow_seccomp_risk: false,
        }
    }
}

/// Options of `leaktrace record`: those of the session (when and how long it records, where
/// its outputs go, the kernel maps' sizes, what is asked once for the whole session) and
/// `process`, how each of its processes is traced.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// How each traced process is attached and traced.
    pub process: ProcessOptions,
    /// Stop after this long (None: until the target exits or a signal).
    pub duration: Option<Duration>,
    /// Time between checkpoints.
    pub interval: Duration,
    /// Output directory (None: ./leaktrace-PID-TIMESTAMP).
    pub out: Option<PathBuf>,
    /// Names the default output directory `leaktrace-PREFIX-PID-TIMESTAMP` (`check` uses
    /// "check"); None: `leaktrace-PID-TIMESTAMP`.
    pub dir_prefix: Option<&'static str>,
    /// Sites listed in report.md.
    pub top: usize,
    /// Kernel map sizes.
    pub limits: Limits,
    /// Show the live status on stderr at each checkpoint: a line redrawn in place on a terminal,
    /// a plain line every 10 s otherwise (see `status.rs`); false: none (`--quiet`).
    pub status_line: bool,
    /// Extra checkpoints (batches of `leaktrace check`).
    pub schedule: Schedule,
    /// Also trace processes forked by the traced ones (from their fork on).
    pub follow_forks: bool,
    /// The user asked for Python frames explicitly (`--python-frames on`, not auto): a traced
    /// process that never ran a CPython interpreter gets a one-line note on stderr and in its
    /// report's caveats instead of silently having none.
    pub python_frames_required: bool,
    /// `--heap-dump`: a JVM target's heap dump after its last histogram
    /// (`runtimes::jvm::heapdump`); None: none.
    pub heap_dump: Option<crate::runtimes::jvm::heapdump::DumpOptions>,
    /// Reachability hook: `--reachability`: scan each live target at the end for which
    /// blocks are still pointed at (None: no scan).
    pub reachability: Option<crate::reach::ScanOptions>,
    /// `--python-heap`: censuses of CPython targets' objects (None: none).
    pub python_heap: Option<crate::runtimes::python::heap::HeapOptions>,
    /// `--push URL`: send the heap profiles to a profile store during and after the recording
    /// (see `push.rs`); None: no push.
    pub push: Option<crate::push::PushConfig>,
    /// Growth mode's escalation (`--escalate-for`, off with `--no-escalate`): how long
    /// to trace every allocator call of a process whose growth-mode window showed memory growing
    /// through the allocator (see `escalate.rs`); None: never.
    pub escalate: Option<Duration>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            process: ProcessOptions::default(),
            duration: None,
            interval: Duration::from_secs(1),
            out: None,
            dir_prefix: None,
            top: 10,
            limits: Limits::default(),
            status_line: false,
            schedule: Schedule::Periodic,
            follow_forks: false,
            python_frames_required: false,
            heap_dump: None,
            reachability: None,
            python_heap: None,
            push: None,
            escalate: None,
        }
    }
}

impl RecordOptions {
    /// The options of a process that joins a running session (a followed child, growth mode's
    /// exact window): its process options, the report's length and the map sizes; what is asked
    /// once for the session (a heap dump, reachability, censuses of the Python heap, a push) is
    /// not repeated for it.
    pub(crate) fn per_process(&self) -> RecordOptions {
        RecordOptions { process: self.process.clone(), top: self.top, limits: self.limits, ..RecordOptions::default() }
    }
}

/// Said, not silently ignored: a CPython-only option (`flag`: `--python-frames on`,
/// `--pymalloc`) was asked for and a traced process runs no CPython interpreter. One line per
/// such process, "FLAG: PID N runs no CPython interpreter; WHAT", on stderr and in its report's
/// caveats (its recording's warnings).
fn note_without_python(targets: &mut [Traced], flag: &str, what: &str) {
    for t in targets.iter_mut().filter(|t| t.runtime_name() != Some(leaktrace_analysis::recording::Runtime::Python)) {
        let line = format!("{flag}: PID {} runs no CPython interpreter; {what}", t.pid);
        crate::note!("leaktrace: {line}");
        t.warnings.push(line);
    }
}

/// One traced process at the end of a session: its recording and where its outputs go.
#[derive(Debug)]
pub struct RecordedProcess {
    /// Output directory of this process (the session's, or its `pid-N` subdirectory).
    pub dir: PathBuf,
    /// Several processes: the name of its subdirectory (`pid-N`), made when it is saved.
    pub subdir: Option<String>,
    /// How a launched command ended (None when attached with --pid, or still running).
    pub exit_status: Option<ExitStatus>,
    pub recording: Recording,
}

/// What a recording session made: one recording per traced process, nothing written yet but the
/// (empty) output directory. [`crate::pipeline`] saves, analyses and renders them.
#[derive(Debug)]
pub struct Recorded {
    /// The top output directory (one subdirectory `pid-N` per process when there are several).
    pub dir: PathBuf,
    /// That directory, made (or checked, for an existing --out) and opened before anything was
    /// attached; every output is written through it ([`output::OutDir`]).
    pub out: output::OutDir,
    pub processes: Vec<RecordedProcess>,
    /// More than one process (or --follow-forks): per-process subdirectories and a summary.
    pub several: bool,
    /// Processes selected but not traced, one line each (cgroup and container modes).
    pub skipped: Vec<String>,
    /// Why the session ended ("duration", "signal", "target-exited", "batches-done",
    /// "work-probe-missing").
    pub end_reason: EndReason,
    /// The probes being detached in the background (under a second with uprobe_multi links;
    /// seconds to minutes with single uprobes, which the kernel removes one at a time);
    /// [`Recorded::wait_detached`] waits for it.
    detach: Option<std::thread::JoinHandle<()>>,
    /// The session's sinks (`sink.rs`), told of the end once the recordings are saved
    /// ([`Recorded::finish_sinks`]: `--push`'s final push).
    sinks: Sinks,
}

impl Recorded {
    /// Wait until every probe is detached.
    pub fn wait_detached(&mut self) {
        if let Some(d) = self.detach.take() {
            let _ = d.join();
        }
    }

    /// The end of the session for its sinks, given the recordings just saved (with `--push`,
    /// the final push, waited for at most [`crate::push::FINAL_WAIT`]).
    pub fn finish_sinks(&mut self, recordings: &[Recording]) {
        self.sinks.finish(recordings);
    }
}

/// Record every process the specification selects, until the session ends: one recording per
/// process, in memory. The output directory is created (empty) before anything is attached;
/// writing into it is [`crate::pipeline`]'s job. Errors found before anything was attached (a
/// bad target, an unwritable output directory) and any other failure are returned; the CLI maps
/// them to exit code 2.
///
/// The steps: select the processes ([`select_pids`]: privileges, PIDs, seccomp), load the
/// eBPF programs, launch the command held at its exec ([`launch_held`]), make the output
/// directory ([`open_out`]), attach ([`attach_all`]), let the command go ([`release_command`]),
/// run the session with its sinks (`sink.rs`), then end it ([`end_session`]: escalation, the
/// end-of-session scans, detach, the command stopped, one recording per process).
pub fn record_all(spec: TargetSpec, opts: &RecordOptions) -> anyhow::Result<Recorded> {
    // Everything that can be checked before touching a target is checked first.
    let by_group = matches!(spec, TargetSpec::Cgroup(_) | TargetSpec::Container(_) | TargetSpec::Found(_));
    let (mut pids, mut skipped) = select_pids(&spec, opts, by_group)?;
    // An explicit --out is made (or refused: a regular file there, an unwritable place) before
    // the eBPF programs are loaded and before a command is started: the target is not touched
    // for a run that could not write its report.
    let explicit_out = opts.out.as_deref().map(output::OutDir::for_out).transpose()?;
    let mut tracer = Tracer::load(opts.limits, opts.process.mode, opts.process.sample_bytes)?;
    // Dropped on every way out of this function, the guardian first (killed and reaped).
    let (mut held, mut _guardian) = launch_held(&spec, &mut pids)?;
    let several = pids.len() > 1 || opts.follow_forks;
    let out = open_out(opts, explicit_out, pids[0], several, &mut held)?;
    let dir = out.path().to_path_buf();

    let start = Instant::now();
    let mut targets = attach_all(&mut tracer, &spec, &pids, &mut held, opts, by_group, &mut skipped)?;
    if opts.follow_forks {
        forks::hold_children(&mut tracer, &targets, &mut _guardian);
    }
    if let Some(c) = held.as_mut() {
        release_command(&mut tracer, &mut targets, c, opts)?;
    }
    note_attached(&targets, &skipped);

    let started_unix_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    // The status line, periodic scans and censuses, and the push worker (started now).
    let mut sinks = Sinks::for_record(opts, started_unix_ms);
    if opts.heap_dump.is_some_and(|d| d.jvm) {
        let done = Default::default();
        sinks.push(Box::new(heap_dumps::FirstDumpSink { dir: dir.clone(), done, start }));
    }
    let host = Live::new(tracer, held.is_some(), sinks, opts.clone());
    let mut session = Session {
        host,
        targets,
        beside: Vec::new(),
        start,
        work_probe: opts.process.work_probe.clone(),
        follow_forks: opts.follow_forks,
        quiet_forks: false,
        rescan_every: 1,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let end_reason = rt.block_on(session.run(opts));
    let ended = end_session(session, opts, end_reason, (start, started_unix_ms), &dir);
    let several = ended.processes_seen > 1 || several;
    let processes = assemble(ended.targets, ended.reach, end_reason, several, &dir, opts, started_unix_ms);
    let processes = with_escalations(processes, ended.escalations);
    Ok(Recorded { dir, out, processes, several, skipped, end_reason, detach: ended.detach, sinks: ended.sinks })
}

/// Launch mode: start the command held before its exec (its PID the only one of `pids`) with
/// the guardian that resumes it if leaktrace dies. None, None for any other target.
fn launch_held(
    spec: &TargetSpec,
    pids: &mut Vec<u32>,
) -> anyhow::Result<(Option<HeldChild>, Option<launch::Guardian>)> {
    let TargetSpec::Launch(argv) = spec else { return Ok((None, None)) };
    let child = launch::spawn_held(argv)?;
    *pids = vec![child.pid];
    match launch::Guardian::start(child.pid) {
        Ok(g) => Ok((Some(child), Some(g))),
        Err(e) => {
            child.abandon();
            Err(e.context("starting the process that resumes the command if leaktrace dies"))
        }
    }
}

/// The output directory: `--out` (made, or checked when it exists), else a new
/// `leaktrace-[PREFIX-]PID-TIMESTAMP`. On error the held command is let go.
fn open_out(
    opts: &RecordOptions,
    explicit: Option<output::OutDir>,
    first_pid: u32,
    several: bool,
    held: &mut Option<HeldChild>,
) -> anyhow::Result<output::OutDir> {
    let out = match explicit {
        Some(o) => Ok(o),
        None => output::OutDir::create_named(&default_out_dir(opts.dir_prefix, first_pid, several)),
    };
    if out.is_err()
        && let Some(c) = held.take()
    {
        c.abandon();
    }
    out
}

/// Attach to every process of `pids` (a launched command: from its executable's objects, before
/// its exec). One that cannot be attached is skipped with a line in `skipped` when selected by
/// a group (`by_group`), else the error (the held command let go). Errors also when none could
/// be attached.
fn attach_all(
    tracer: &mut Tracer,
    spec: &TargetSpec,
    pids: &[u32],
    held: &mut Option<HeldChild>,
    opts: &RecordOptions,
    by_group: bool,
    skipped: &mut Vec<String>,
) -> anyhow::Result<Vec<Traced>> {
    let mut targets = Vec::new();
    for &pid in pids {
        let (objects, command, exe) = match held.as_ref() {
            None => match discover::mapped_objects(pid) {
                Ok(o) => (o, procinfo::cmdline(pid), procinfo::exe(pid)),
                Err(e) if by_group => {
                    skipped.push(format!("PID {pid} skipped: {e}"));
                    continue;
                }
                Err(e) => return Err(e.into()),
            },
            Some(c) => match launch_objects(&c.exe) {
                Ok(o) => (o, c.argv.clone(), c.exe.display().to_string()),
                Err(e) => {
                    if let Some(a) = held.take() {
                        HeldChild::abandon(a)
                    }
                    return Err(e);
                }
            },
        };
        match Traced::attach(tracer, pid, objects, command, exe, held.is_some(), opts) {
            Ok(t) => targets.push(t),
            Err(e) if by_group => skipped.push(format!("PID {pid} skipped: {e:#}")),
            Err(e) => {
                if let Some(a) = held.take() {
                    HeldChild::abandon(a)
                }
                // A process that vanished while probes were placed says so plainly.
                if !held_is_launch(spec) && !procinfo::alive(pid) {
                    anyhow::bail!("PID {pid} exited while leaktrace was attaching");
                }
                return Err(e);
            }
        }
    }
    anyhow::ensure!(!targets.is_empty(), "no process could be attached: {}", skipped.join("; "));
    Ok(targets)
}

/// Let the held command exec, its probes in place: later execs (a wrapper's: env, taskset, a
/// script's exec; with --follow-forks its children's) stop until their new image is probed;
/// then its executable as the process sees it.
fn release_command(
    tracer: &mut Tracer,
    targets: &mut [Traced],
    c: &mut HeldChild,
    opts: &RecordOptions,
) -> anyhow::Result<()> {
    if let Err(e) = tracer.hold_execs(c.pid, 1, opts.follow_forks) {
        crate::note!("leaktrace: warning: {e:#}: a program the command execs runs unprobed until it is re-discovered");
    }
    c.release()?;
    // The exec has happened: the executable as the process sees it (/proc/PID/exe), or,
    // when it has already exited (a zombie has no exe link), the resolved path it exec'd.
    for t in targets.iter_mut().filter(|t| t.pid == c.pid) {
        let mut exe = procinfo::exe(t.pid);
        if exe.is_empty() {
            exe = std::fs::canonicalize(&c.exe).map(|p| p.display().to_string()).unwrap_or_default();
        }
        if !exe.is_empty() {
            t.exe = exe;
            t.exe_resolved = true;
        }
    }
    Ok(())
}

/// What the end of a session leaves for the recordings.
struct Ended {
    targets: Vec<Traced>,
    /// Processes of the session (forked children included).
    processes_seen: usize,
    /// The end-of-session reachability scans, by PID.
    reach: std::collections::HashMap<u32, leaktrace_analysis::reachability::Reachability>,
    /// Growth mode's exact windows, by PID.
    escalations: std::collections::BTreeMap<u32, Recording>,
    detach: Option<std::thread::JoinHandle<()>>,
    sinks: Sinks,
}

/// End the session (`start`: its start, and in Unix ms): teardowns released, the sinks
/// interrupted, growth mode's escalation, the end-of-session scans, the probes detached in the
/// background, and a launched command stopped (it does not outlive the recording).
fn end_session(
    mut session: Session<Live>,
    opts: &RecordOptions,
    end_reason: EndReason,
    (start, started_unix_ms): (Instant, u64),
    dir: &std::path::Path,
) -> Ended {
    session.release_teardowns();
    session.host.sinks.interrupt();
    // Growth mode's escalation: an exact window on the processes whose memory grew
    // through the allocator, in this session, before the launched command is stopped.
    let escalations = escalate::escalate_all(&mut session, opts, end_reason, started_unix_ms, dir);
    // Time 0 of the checkpoints (the first one), for the censuses' times.
    let t_zero = session.start;
    let Session { host: Live { tracer, sinks, .. }, mut targets, .. } = session;
    let reach = end_of_session(&tracer, &mut targets, opts, (start, t_zero), dir);
    // Detach in the background while the outputs are written.
    let detach = std::thread::spawn(move || tracer.shutdown());
    let detach = node_census_after_detach(&mut targets, detach, start);
    for t in targets.iter_mut().filter(|t| t.launched && t.exit_status.is_none()) {
        t.exit_status = launch::terminate(t.pid, Duration::from_secs(2));
        if let Some(s) = t.exit_status {
            crate::note!("leaktrace: stopped {} ({s})", t.command.join(" "));
        }
    }
    Ended { processes_seen: targets.len(), targets, reach, escalations, detach, sinks }
}

/// Each recording with its process's exact window, if it had one.
fn with_escalations(
    mut processes: Vec<RecordedProcess>,
    mut escalations: std::collections::BTreeMap<u32, Recording>,
) -> Vec<RecordedProcess> {
    for p in processes.iter_mut() {
        p.recording.escalation = escalations.remove(&p.recording.target.pid).map(Box::new);
    }
    processes
}

/// `--heap-census` on Node: its last heap snapshot and sampling profile once the probes are
/// detached (waited for here, only then), before a launched command is stopped. The detach still
/// under way, if it was not waited for.
fn node_census_after_detach(
    targets: &mut [Traced],
    detach: std::thread::JoinHandle<()>,
    start: Instant,
) -> Option<std::thread::JoinHandle<()>> {
    if !targets.iter().any(|t| t.census.after_detach()) {
        return Some(detach);
    }
    let _ = detach.join();
    for t in targets.iter_mut() {
        let alive = t.session.end_reason.is_none() && procinfo::alive(t.pid);
        t.census.finish_detached(alive, &|| start.elapsed().as_secs_f64());
    }
    None
}

/// The end of the session, while the processes still run and the probes are in place: JIT
/// frames named from the runtime's final perf map, `--heap-census`'s last snapshots, the notes of
/// options that had nothing to act on, the last Python heap census and the reachability scan
/// (its result by PID; `start` is the recording's start, `t_zero` the first checkpoint's time).
fn end_of_session(
    tracer: &Tracer,
    targets: &mut [Traced],
    opts: &RecordOptions,
    (start, t_zero): (Instant, Instant),
    dir: &std::path::Path,
) -> std::collections::HashMap<u32, leaktrace_analysis::reachability::Reachability> {
    // JIT frames named from the runtime's perf map as it is at the end (with --jvm-perf-map, the
    // JVM writes it once more first), before a reachability scan stops the target.
    for t in targets.iter_mut() {
        t.jit_final();
        // `--heap-census`: the runtimes' last snapshots, while the processes still run.
        let alive = t.session.end_reason.is_none() && procinfo::alive(t.pid);
        let units = t.checkpoints.last().and_then(|c| c.units_of_work);
        t.census.finish(alive, &|| start.elapsed().as_secs_f64(), units);
        heap_dumps::last_dumps(tracer, t, dir, alive, (start, units));
    }
    if opts.process.jvm_perf_map
        && !targets.iter().any(|t| t.runtime_name() == Some(leaktrace_analysis::recording::Runtime::Jvm))
    {
        // Said, not silently ignored: the user asked for something that had nothing to act on.
        let line = "--jvm-perf-map did nothing: no traced process runs a JVM".to_string();
        crate::note!("leaktrace: {line}");
        for t in targets.iter_mut() {
            t.warnings.push(line.clone());
        }
    }
    if opts.python_frames_required {
        note_without_python(targets, "--python-frames on", "no Python frames");
    }
    if opts.process.pymalloc {
        note_without_python(targets, "--pymalloc", "CPython's allocator API is not hooked");
    }
    if opts.python_heap.is_some() {
        note_without_python(targets, "--python-heap", "no Python heap census");
    }
    // Python heap hook: the census at the end, before the launched command is stopped.
    if let Some(o) = opts.python_heap {
        pyheap::census_all(tracer, targets, o, t_zero);
    }
    // Reachability hook: before the probes go and the launched command is stopped.
    match opts.reachability {
        Some(o) => reachability::scan_all(tracer, targets, opts.process.mode, o, start),
        None => Default::default(),
    }
}

/// Tell the user which processes are attached (their probes' objects) and which were skipped.
fn note_attached(targets: &[Traced], skipped: &[String]) {
    for t in targets {
        let objs: BTreeSet<&str> = t.probes.iter().map(|p| p.object.as_str()).collect();
        crate::note!(
            "leaktrace: attached to PID {} ({}): {} probes in {}",
            t.pid,
            command_line(&t.command),
            t.probes.len(),
            objs.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    for s in skipped {
        crate::note!("leaktrace: {s}");
    }
}

/// The processes `spec` selects that can be traced, and the lines saying which were skipped (by
/// a cgroup or a container only; for any other target a process that cannot be traced is the
/// error). Checked before anything is attached: root, that no PID is leaktrace's own, each
/// process's state, and (return probes only) the seccomp refusal of seccomp.rs.
fn select_pids(spec: &TargetSpec, opts: &RecordOptions, by_group: bool) -> anyhow::Result<(Vec<u32>, Vec<String>)> {
    crate::probes::check_privileges()?;
    let mut pids = resolve_pids(spec)?;
    let mut skipped = Vec::new();
    for &pid in &pids {
        if pid == std::process::id() {
            anyhow::bail!("PID {pid} is leaktrace itself");
        }
        if let Err(e) = discover::check_pid(pid) {
            if by_group {
                skipped.push(format!("PID {pid} skipped: {e}"));
            } else {
                return Err(e.into());
            }
        }
    }
    // Return probes in a seccomp-filtered process on a kernel that would kill it for them
    // (seccomp.rs): refused before anything is attached. Growth mode places no return probes.
    if opts.process.mode != Mode::Growth {
        let mut refused = BTreeSet::new();
        for &pid in &pids {
            if let Err(e) = crate::seccomp::check_target(pid, opts.process.allow_seccomp_risk) {
                if !by_group {
                    return Err(e);
                }
                skipped.push(format!("PID {pid} skipped: {e}"));
                refused.insert(pid);
            }
        }
        pids.retain(|p| !refused.contains(p));
    }
    if by_group {
        pids.retain(|p| discover::check_pid(*p).is_ok());
        anyhow::ensure!(!pids.is_empty(), "none of the selected processes can be traced: {}", skipped.join("; "));
    }
    Ok((pids, skipped))
}

/// One recording per traced process at the end of the session (`end_reason` for those that did
/// not end on their own), each with its reachability scan from `reach`, in `dir` (or its
/// `pid-N` subdirectory when `several`).
fn assemble(
    session_targets: Vec<Traced>,
    mut reach: std::collections::HashMap<u32, leaktrace_analysis::reachability::Reachability>,
    end_reason: EndReason,
    several: bool,
    dir: &std::path::Path,
    opts: &RecordOptions,
    started_unix_ms: u64,
) -> Vec<RecordedProcess> {
    let mut processes = Vec::new();
    for mut t in session_targets {
        if let Some(note) = t.jit_note() {
            t.warnings.push(note);
        }
        if t.session.untraced_children > 0 {
            t.warnings.push(format!(
                "this process forked {} child process(es) that were not traced: their memory is not in this report (record with --follow-forks)",
                t.session.untraced_children
            ));
        }
        let mut recording = Recording {
            probes: std::mem::take(&mut t.probes),
            stacks: std::mem::take(&mut t.stacks),
            checkpoints: std::mem::take(&mut t.checkpoints),
            end_reason: t.session.end_reason.unwrap_or(end_reason),
            warnings: std::mem::take(&mut t.warnings),
            reachability: reach.remove(&t.pid).or_else(|| t.reach_at_exit.take()),
            reachability_scans: std::mem::take(&mut t.reach_scans),
            runtime_holds: t.census.take(),
            python_heap: t.py_heap.take(),
            ..t.recording_head(opts, started_unix_ms)
        };
        // One site per call path: stacks of JIT code compiled again (same frames, new addresses) merged.
        leaktrace_analysis::merge::merge_identical_stacks(&mut recording);
        let subdir = several.then(|| format!("pid-{}", t.pid));
        let tdir = subdir.as_ref().map_or_else(|| dir.to_path_buf(), |s| dir.join(s));
        processes.push(RecordedProcess { dir: tdir, subdir, exit_status: t.exit_status, recording });
    }
    processes
}

impl Traced {
    /// What a recording of this process says of it and of the options, without its bulk: no
    /// probes, stacks, checkpoints, warnings or scans, `end_reason` "running". The end of
    /// `record_all` moves the bulk in; a periodic push ([`Traced::snapshot`]) clones it.
    fn recording_head(&mut self, opts: &RecordOptions, started_unix_ms: u64) -> Recording {
        Recording {
            format_version: leaktrace_analysis::recording::FORMAT_VERSION,
            leaktrace_version: env!("CARGO_PKG_VERSION").to_string(),
            target: Target {
                pid: self.pid,
                runtime: self.runtime_name(),
                runtime_version: self.runtime.as_ref().and_then(|r| r.info().version.clone()),
                nspid: if self.nspid.is_empty() { vec![self.pid] } else { self.nspid.clone() },
                command: self.command.clone(),
                exe: self.exe.clone(),
                launched: self.launched,
                exit_status: self.exit_status.map(ExitStatus::as_shell),
                ended: self.ended.clone(),
                execs: self.execs.clone(),
                memory_limit_bytes: self.memory_limit.as_ref().map(|l| l.0),
                memory_limit_file: self.memory_limit.as_ref().map(|l| l.1.display().to_string()),
            },
            mode: opts.process.mode,
            sample_bytes: (opts.process.mode == Mode::Sampled)
                .then(|| opts.process.sample_bytes.unwrap_or(crate::probes::DEFAULT_SAMPLE_BYTES)),
            work_probe: opts.process.work_probe.as_ref().map(|w| w.to_string()),
            started_unix_ms,
            interval_s: opts.interval.as_secs_f64(),
            probes: Vec::new(),
            stacks: Vec::new(),
            checkpoints: Vec::new(),
            end_reason: EndReason::Running,
            warnings: Vec::new(),
            reachability: None,
            reachability_scans: Vec::new(),
            python_heap: Vec::new(),
            mappings: self.symbolizer.mappings(),
            merged_stacks: Default::default(),
            runtime_holds: None,
            escalation: None,
        }
    }

    /// The recording of this process as it is now, for a periodic push (`sink.rs`'s
    /// `PushSink`: stacks and checkpoints cloned; `end_reason` "running").
    fn snapshot(&mut self, opts: &RecordOptions, started_unix_ms: u64) -> Recording {
        let mut rec = Recording {
            stacks: self.stacks.clone(),
            checkpoints: self.checkpoints.clone(),
            end_reason: self.session.end_reason.unwrap_or(EndReason::Running),
            ..self.recording_head(opts, started_unix_ms)
        };
        leaktrace_analysis::merge::merge_identical_stacks(&mut rec);
        rec
    }
}

fn held_is_launch(spec: &TargetSpec) -> bool {
    matches!(spec, TargetSpec::Launch(_))
}

/// `leaktrace-[PREFIX-]PID-TIMESTAMP`, or `leaktrace-[PREFIX-]multi-PID-TIMESTAMP` for several
/// processes.
fn default_out_dir(prefix: Option<&str>, pid: u32, several: bool) -> PathBuf {
    let name = if several { format!("multi-{pid}") } else { pid.to_string() };
    output::timestamped_dir(&match prefix {
        Some(p) => format!("{p}-{name}"),
        None => name,
    })
}

/// A command line for a one-line message: its words joined by spaces, cut after
/// [`COMMAND_LINE_CHARS`] characters with how many words were left out (a process with 300
/// arguments made a 20 KiB "attached to" line).
fn command_line(words: &[String]) -> String {
    let full = words.join(" ");
    if full.chars().count() <= COMMAND_LINE_CHARS {
        return full;
    }
    let cut: String = full.chars().take(COMMAND_LINE_CHARS).collect();
    let shown = cut.split(' ').count();
    format!("{cut}… ({} of {} arguments not shown)", words.len().saturating_sub(shown), words.len())
}

/// Longest command line `command_line` prints whole, in characters.
const COMMAND_LINE_CHARS: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_command_lines_are_cut_with_a_count() {
        let short: Vec<String> = ["./host", "a.so"].iter().map(|s| s.to_string()).collect();
        assert_eq!(command_line(&short), "./host a.so");
        let long: Vec<String> =
            std::iter::once("./host".to_string()).chain((0..300).map(|i| format!("/lib/small/lib{i}.so"))).collect();
        let line = command_line(&long);
        assert!(line.starts_with("./host /lib/small/lib0.so /lib/small/lib1.so"), "{line}");
        assert!(line.ends_with("(289 of 301 arguments not shown)"), "{line}");
        assert!(line.chars().count() < 250, "{line}");
    }
}
