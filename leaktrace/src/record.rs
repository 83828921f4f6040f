//! The recorder: attach to a target (running, or launched by us), take a checkpoint every
//! interval until the end (duration, signal, target exit), then save the recording and render
//! the outputs. Nothing collected is lost: the outputs are written from every checkpoint taken,
//! whatever ended the run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use leaktrace_common::{SiteKey, site_kind};

use crate::discover::{self, MappedObject, WorkProbeSpec};
use crate::launch::{self, ExitStatus, HeldChild};
use crate::probes::{Limits, Mode, Tracer};
use crate::mappings::{self, AddressSpace};
use crate::recording::{self, AllocatorFootprint, Checkpoint, EndReason, Frame, ProbeInfo, Recording, SiteSample, Stack, StackKind, Target};
use crate::symbolize::StackSymbolizer;
use crate::report::human;
use crate::{output, procinfo};

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

/// Options of `leaktrace record`.
#[derive(Clone, Debug)]
pub struct RecordOptions {
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
    /// Show a one-line live status on stderr (only when stderr is a terminal).
    pub status_line: bool,
    /// Count calls of this function as units of work.
    pub work_probe: Option<WorkProbeSpec>,
    /// Extra checkpoints (batches of `leaktrace check`).
    pub schedule: Schedule,
    /// Exact, sampled or growth mode.
    pub mode: Mode,
    /// Also trace processes forked by the traced ones (from their fork on).
    pub follow_forks: bool,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            duration: None,
            interval: Duration::from_secs(1),
            out: None,
            dir_prefix: None,
            top: 10,
            limits: Limits::default(),
            status_line: false,
            work_probe: None,
            schedule: Schedule::Periodic,
            mode: Mode::Exact,
            follow_forks: false,
        }
    }
}

/// One traced process at the end of a session: its recording and where its outputs go.
#[derive(Debug)]
pub struct RecordedProcess {
    /// Output directory of this process (the session's, or its `pid-N` subdirectory).
    pub dir: PathBuf,
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
    pub processes: Vec<RecordedProcess>,
    /// More than one process (or --follow-forks): per-process subdirectories and a summary.
    pub several: bool,
    /// Processes selected but not traced, one line each (cgroup and container modes).
    pub skipped: Vec<String>,
    /// Why the session ended ("duration", "signal", "target-exited", "batches-done",
    /// "work-probe-missing").
    pub end_reason: EndReason,
    /// The probes being detached in the background (a few seconds: the kernel removes uprobes
    /// one at a time); [`Recorded::wait_detached`] waits for it.
    detach: Option<std::thread::JoinHandle<()>>,
}

impl Recorded {
    /// Wait until every probe is detached.
    pub fn wait_detached(&mut self) {
        if let Some(d) = self.detach.take() {
            let _ = d.join();
        }
    }
}

/// The PIDs a target specification selects (not for launch mode). Errors when none.
pub fn resolve_pids(spec: &TargetSpec) -> anyhow::Result<Vec<u32>> {
    let mut pids = match spec {
        TargetSpec::Pid(p) => vec![*p],
        TargetSpec::Pids(v) => v.clone(),
        TargetSpec::Cgroup(path) => {
            let dir = if path.is_absolute() { path.clone() } else { Path::new("/sys/fs/cgroup").join(path) };
            let procs = dir.join("cgroup.procs");
            let text = std::fs::read_to_string(&procs)
                .with_context(|| format!("cannot read {} (is {} a cgroup v2 directory?)", procs.display(), dir.display()))?;
            let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            anyhow::ensure!(!pids.is_empty(), "cgroup {} has no processes", dir.display());
            pids
        }
        TargetSpec::Container(id) => {
            anyhow::ensure!(id.len() >= 4, "container ID `{id}` is too short to match safely (give at least 4 characters)");
            let mut pids = Vec::new();
            for entry in std::fs::read_dir("/proc")?.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                if pid == std::process::id() {
                    continue;
                }
                if std::fs::read_to_string(entry.path().join("cgroup")).is_ok_and(|c| c.contains(id.as_str())) {
                    pids.push(pid);
                }
            }
            anyhow::ensure!(!pids.is_empty(), "no process belongs to a cgroup matching container ID `{id}`");
            pids
        }
        TargetSpec::Launch(_) => Vec::new(),
    };
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// Record every process the specification selects, until the session ends: one recording per
/// process, in memory. The output directory is created (empty) before anything is attached;
/// writing into it is [`crate::pipeline`]'s job. Errors found before anything was attached (a
/// bad target, an unwritable output directory) and any other failure are returned; the CLI maps
/// them to exit code 2.
pub fn record_all(spec: TargetSpec, opts: &RecordOptions) -> anyhow::Result<Recorded> {
    // Everything that can be checked before touching a target is checked first.
    crate::probes::check_privileges()?;
    let by_group = matches!(spec, TargetSpec::Cgroup(_) | TargetSpec::Container(_));
    let mut pids = resolve_pids(&spec)?;
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
    if by_group {
        pids.retain(|p| discover::check_pid(*p).is_ok());
        anyhow::ensure!(!pids.is_empty(), "none of the selected processes can be traced: {}", skipped.join("; "));
    }
    let mut tracer = Tracer::load(opts.limits, opts.mode)?;

    let mut held: Option<HeldChild> = None;
    if let TargetSpec::Launch(argv) = &spec {
        let child = launch::spawn_held(argv)?;
        pids = vec![child.pid];
        held = Some(child);
    }
    let several = pids.len() > 1 || opts.follow_forks;
    let dir = opts.out.clone().unwrap_or_else(|| default_out_dir(opts.dir_prefix, pids[0], several));
    if let Err(e) = output::ensure_fresh_dir(&dir).and_then(|()| output::ensure_writable_dir(&dir)) {
        if let Some(c) = held.take() {
            c.abandon();
        }
        return Err(e);
    }

    let start = Instant::now();
    let mut targets = Vec::new();
    for &pid in &pids {
        let (objects, command, exe) = match &held {
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
                    if let Some(a) = held.take() { HeldChild::abandon(a) }
                    return Err(e);
                }
            },
        };
        match Traced::attach(&mut tracer, pid, objects, command, exe, held.is_some(), opts) {
            Ok(t) => targets.push(t),
            Err(e) if by_group => skipped.push(format!("PID {pid} skipped: {e:#}")),
            Err(e) => {
                if let Some(a) = held.take() { HeldChild::abandon(a) }
                // A process that vanished while probes were placed says so plainly.
                if !held_is_launch(&spec) && !procinfo::alive(pid) {
                    anyhow::bail!("PID {pid} exited while leaktrace was attaching");
                }
                return Err(e);
            }
        }
    }
    anyhow::ensure!(!targets.is_empty(), "no process could be attached: {}", skipped.join("; "));
    if let Some(c) = held.as_mut() {
        c.release()?;
        // The exec has happened: the executable as the process sees it (/proc/PID/exe).
        for t in targets.iter_mut().filter(|t| t.pid == c.pid) {
            let exe = procinfo::exe(t.pid);
            if !exe.is_empty() {
                t.exe = exe;
                t.exe_resolved = true;
            }
        }
    }
    for t in &targets {
        let objs: BTreeSet<&str> = t.probes.iter().map(|p| p.object.as_str()).collect();
        eprintln!(
            "leaktrace: attached to PID {} ({}): {} probes in {}",
            t.pid,
            t.command.join(" "),
            t.probes.len(),
            objs.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
    for s in &skipped {
        eprintln!("leaktrace: {s}");
    }

    let mut session = Session {
        tracer,
        targets,
        start,
        status_line: opts.status_line && unsafe { libc::isatty(2) } == 1,
        mode: opts.mode,
        work_probe: opts.work_probe.clone(),
        follow_forks: opts.follow_forks,
    };
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let end_reason = rt.block_on(session.run(opts));
    session.clear_status();
    let Session { tracer, targets, .. } = session;
    // Detach in the background while the outputs are written.
    let detach = std::thread::spawn(move || tracer.shutdown());
    let mut session_targets = targets;

    // In launch mode the command does not outlive the recording.
    for t in session_targets.iter_mut().filter(|t| t.launched && t.exit_status.is_none()) {
        t.exit_status = launch::terminate(t.pid, Duration::from_secs(2));
        if let Some(s) = t.exit_status {
            eprintln!("leaktrace: stopped {} ({s})", t.command.join(" "));
        }
    }

    let several = session_targets.len() > 1 || several;
    let mut processes = Vec::new();
    for mut t in session_targets {
        let recording = Recording {
            format_version: crate::recording::FORMAT_VERSION,
            leaktrace_version: env!("CARGO_PKG_VERSION").to_string(),
            target: Target {
                pid: t.pid,
                runtime: t.runtime.as_ref().map(|r| r.name),
                runtime_version: t.runtime.as_ref().and_then(|r| r.version.clone()),
                nspid: if t.nspid.is_empty() { vec![t.pid] } else { t.nspid.clone() },
                command: t.command.clone(),
                exe: t.exe.clone(),
                launched: t.launched,
                exit_status: t.exit_status.map(ExitStatus::as_shell),
            },
            mode: recorded_mode(opts.mode),
            sample_bytes: match opts.mode {
                Mode::Sampled { mean_bytes } => Some(mean_bytes),
                _ => None,
            },
            work_probe: opts.work_probe.as_ref().map(|w| w.to_string()),
            started_unix_ms,
            interval_s: opts.interval.as_secs_f64(),
            probes: std::mem::take(&mut t.probes),
            stacks: std::mem::take(&mut t.stacks),
            checkpoints: std::mem::take(&mut t.checkpoints),
            end_reason: t.end_reason.unwrap_or(end_reason),
            warnings: {
                if t.untraced_children > 0 {
                    t.warnings.push(format!(
                        "this process forked {} child process(es) that were not traced: their memory is not in this report (record with --follow-forks)",
                        t.untraced_children
                    ));
                }
                std::mem::take(&mut t.warnings)
            },
        };
        let tdir = if several { dir.join(format!("pid-{}", t.pid)) } else { dir.clone() };
        processes.push(RecordedProcess { dir: tdir, exit_status: t.exit_status, recording });
    }
    Ok(Recorded { dir, processes, several, skipped, end_reason, detach: Some(detach) })
}

fn held_is_launch(spec: &TargetSpec) -> bool {
    matches!(spec, TargetSpec::Launch(_))
}

/// `leaktrace-[PREFIX-]PID-TIMESTAMP`, or `leaktrace-[PREFIX-]multi-PID-TIMESTAMP` for several
/// processes.
/// The recording's name for a probes mode.
fn recorded_mode(mode: Mode) -> recording::Mode {
    match mode {
        Mode::Exact => recording::Mode::Exact,
        Mode::Sampled { .. } => recording::Mode::Sampled,
        Mode::Growth => recording::Mode::Growth,
    }
}

fn default_out_dir(prefix: Option<&str>, pid: u32, several: bool) -> PathBuf {
    let name = if several { format!("multi-{pid}") } else { pid.to_string() };
    output::timestamped_dir(&match prefix {
        Some(p) => format!("{p}-{name}"),
        None => name,
    })
}

/// Objects a command about to be launched will use, so that its allocator is probed before its
/// first allocation: its executable (a static binary is its own allocator; a script's
/// interpreter), the shared libraries its dynamic loader will load (asked with `ld.so --list`,
/// honouring LD_PRELOAD and LD_LIBRARY_PATH), and this host's C library as a fallback.
fn launch_objects(exe: &Path) -> anyhow::Result<Vec<MappedObject>> {
    let mut out = Vec::new();
    let mut add = |path: &Path| -> anyhow::Result<()> {
        let m = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
        let dev = (libc::major(m.dev()) as i32, libc::minor(m.dev()) as i32);
        if !out.iter().any(|o: &MappedObject| o.dev == dev && o.inode == m.ino()) {
            out.push(MappedObject { path: path.to_path_buf(), dev, inode: m.ino(), open_path: path.to_path_buf() });
        }
        Ok(())
    };
    let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let program = script_interpreter(&exe).unwrap_or(exe.clone());
    add(&exe)?;
    if program != exe {
        add(&program)?;
    }
    // A static executable maps no shared library: it is its own allocator (or, fully stripped,
    // has none to find, which must be said rather than probing a libc it never maps).
    let Some(libs) = loader_list(&program) else { return Ok(out) };
    for lib in libs {
        let _ = add(&lib);
    }
    for o in discover::mapped_objects(std::process::id())? {
        let name = o.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with("libc.so") || name.starts_with("libc-") || name.starts_with("libc.musl") {
            add(&o.path)?;
        }
    }
    Ok(out)
}

/// The interpreter of a `#!` script (resolved through PATH for `#!/usr/bin/env NAME`).
fn script_interpreter(exe: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(exe).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|c| *c == b'\n').next()?).into_owned();
    let mut words = line.split_ascii_whitespace();
    let interp = PathBuf::from(words.next()?);
    let interp = if interp.file_name().is_some_and(|n| n == "env") {
        launch::resolve_command(Path::new(words.next()?)).ok()?
    } else {
        interp
    };
    Some(std::fs::canonicalize(&interp).unwrap_or(interp))
}

/// Shared libraries the dynamic loader will load for `exe` (PT_INTERP run with `--list`, which
/// resolves without running the program). None for a static executable (an ELF file without
/// PT_INTERP); empty on any other failure.
fn loader_list(exe: &Path) -> Option<Vec<PathBuf>> {
    use object::read::elf::ProgramHeader as _;
    let Ok(data) = std::fs::read(exe) else { return Some(Vec::new()) };
    let Ok(elf) = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data) else { return Some(Vec::new()) };
    let endian = elf.endian();
    let interp = elf.elf_program_headers().iter().find_map(|ph| {
        (ph.p_type(endian) == object::elf::PT_INTERP)
            .then(|| ph.data(endian, &*data).ok())
            .flatten()
            .map(|d| String::from_utf8_lossy(d.split(|c| *c == 0).next().unwrap_or(d)).into_owned())
    });
    let interp = interp?;
    let Ok(out) = std::process::Command::new(&interp).arg("--list").arg(exe).stderr(std::process::Stdio::null()).output() else {
        return Some(Vec::new());
    };
    let libs = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=> ") {
                Some((_, rest)) => rest,
                None => l.trim_start(),
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    Some(libs)
}

/// One traced process and everything recorded about it.
struct Traced {
    pid: u32,
    launched: bool,
    command: Vec<String>,
    exe: String,
    nspid: Vec<u32>,
    symbolizer: StackSymbolizer,
    stacks: Vec<Stack>,
    /// Kernel site key (tgid cleared) → index in `stacks`.
    stack_index: HashMap<SiteKey, u32>,
    checkpoints: Vec<Checkpoint>,
    warnings: Vec<String>,
    exit_status: Option<ExitStatus>,
    /// Anonymous regions made since attach (off-heap and the allocator's).
    space: AddressSpace,
    work_attached: bool,
    /// Managed runtime of the target, once detected.
    runtime: Option<crate::runtimes::RuntimeInfo>,
    /// The runtime's own heap figures, sampled at every checkpoint.
    gauge: Option<Box<dyn crate::runtimes::HeapGauge>>,
    probes: Vec<ProbeInfo>,
    /// Objects already scanned for allocators, by (device major, minor, inode).
    probed: BTreeSet<(i32, i32, u64)>,
    /// Set when this process's recording ended before the run (it exited).
    end_reason: Option<EndReason>,
    /// `exe` was read from /proc/PID/exe (launched commands: after their exec).
    exe_resolved: bool,
    /// The last sample recorded for each stack (checkpoints keep only changed sites).
    last_samples: HashMap<u32, SiteSample>,
    /// Child processes it forked that are not traced (no --follow-forks).
    untraced_children: u32,
}

impl Traced {
    /// Find and probe the allocator of `pid` in `objects`, place the work probe, and start
    /// tracking its mappings.
    #[allow(clippy::too_many_arguments)]
    fn attach(
        tracer: &mut Tracer,
        pid: u32,
        objects: Vec<MappedObject>,
        command: Vec<String>,
        exe: String,
        launched: bool,
        opts: &RecordOptions,
    ) -> anyhow::Result<Traced> {
        let scan = scan_for_mode(pid, &objects, opts.mode)?;
        print_coverage(pid, &scan);
        let probed: BTreeSet<_> = objects.iter().map(|o| (o.dev.0, o.dev.1, o.inode)).collect();
        let mut probes = tracer.attach(pid, &scan.points)?;
        let mut notes = scan.notes;
        if let Some(spec) = &opts.work_probe {
            match discover::find_work_function(spec, &objects) {
                Some((obj, off)) => {
                    let mut info = tracer.attach_work_probe(pid, &obj.path.display().to_string(), &obj.open_path, off)?;
                    info.function = spec.symbol.clone();
                    probes.push(info);
                }
                None if launched => {} // may be in a library the command loads: retried at checkpoints
                None => anyhow::bail!(
                    "--work-probe {spec}: no function `{}` in the objects PID {pid} maps{}",
                    spec.symbol,
                    spec.object.as_ref().map(|o| format!(" matching `{o}`")).unwrap_or_default()
                ),
            }
        }
        match &tracer.mappings_unavailable {
            None => tracer.add_target(pid)?,
            Some(why) if opts.mode == Mode::Growth => anyhow::bail!("growth mode needs the syscall tracepoints: {why}"),
            Some(why) => notes.push(format!("anonymous mappings (off-heap memory) not traced: {why}")),
        }
        notes.push(format!("{} mode cannot see: {}", opts.mode.name(), opts.mode.blind_spots()));
        let mut t = Traced {
            pid,
            launched,
            command,
            exe,
            nspid: procinfo::nspid(pid),
            symbolizer: StackSymbolizer::new(pid),
            stacks: Vec::new(),
            stack_index: HashMap::new(),
            checkpoints: Vec::new(),
            warnings: notes,
            exit_status: None,
            space: AddressSpace::default(),
            work_attached: probes.iter().any(|p| p.kind == "work"),
            runtime: None,
            gauge: None,
            probes,
            probed,
            end_reason: None,
            exe_resolved: !launched,
            last_samples: HashMap::new(),
            untraced_children: 0,
        };
        if !launched {
            t.detect_runtime(&objects);
        }
        Ok(t)
    }

    fn gone(&mut self) -> bool {
        if self.launched {
            if let Some(s) = launch::try_wait(self.pid) {
                self.exit_status = Some(s);
                return true;
            }
            false
        } else {
            !procinfo::alive(self.pid)
        }
    }

    /// Detect the target's runtime (once) from the objects it maps.
    fn detect_runtime(&mut self, objects: &[MappedObject]) {
        if self.runtime.is_some() {
            return;
        }
        if let Some(rt) = crate::runtimes::detect(self.pid, objects) {
            self.warnings.extend(rt.notes.iter().cloned());
            self.gauge = crate::runtimes::gauge(self.pid, &rt);
            self.runtime = Some(rt);
        }
    }

    /// Probe allocators the target mapped since attach (e.g. loaded with dlopen), place the
    /// work probe if its object was not mapped before, and detect the runtime.
    fn rescan(&mut self, tracer: &mut Tracer, mode: Mode, work_probe: Option<&WorkProbeSpec>, t_s: f64) {
        let Ok(objects) = discover::mapped_objects(self.pid) else { return };
        if self.nspid.is_empty() {
            self.nspid = procinfo::nspid(self.pid);
        }
        if self.launched {
            // Launched commands: the executable as the running process sees it (/proc/PID/exe),
            // followed through an exec chain (env → python3).
            let exe = procinfo::exe(self.pid);
            if !exe.is_empty() {
                self.exe = exe;
                self.exe_resolved = true;
                let argv = procinfo::cmdline(self.pid);
                if !argv.is_empty() {
                    self.command = argv;
                }
            }
        }
        self.detect_runtime(&objects);
        if let (Some(spec), false) = (work_probe, self.work_attached)
            && let Some((obj, off)) = discover::find_work_function(spec, &objects) {
                self.work_attached = true;
                match tracer.attach_work_probe(self.pid, &obj.path.display().to_string(), &obj.open_path, off) {
                    Ok(mut info) => {
                        info.function = spec.symbol.clone();
                        self.warnings.push(format!("work probe {spec} placed at t={t_s:.1}s (its object was mapped after attach)"));
                        self.probes.push(info);
                    }
                    Err(e) => self.warnings.push(format!("{e:#}")),
                }
            }
        let fresh: Vec<MappedObject> =
            objects.into_iter().filter(|o| !self.probed.contains(&(o.dev.0, o.dev.1, o.inode))).collect();
        if fresh.is_empty() {
            return;
        }
        for o in &fresh {
            self.probed.insert((o.dev.0, o.dev.1, o.inode));
        }
        let Ok(scan) = scan_for_mode(self.pid, &fresh, mode) else { return };
        match tracer.attach(self.pid, &scan.points) {
            Ok(placed) if !placed.is_empty() => {
                let objs: BTreeSet<&str> = placed.iter().map(|p| p.object.as_str()).collect();
                for o in objs {
                    self.warnings.push(format!(
                        "allocator in {o} probed only from t={t_s:.1}s (the target mapped it after attach, e.g. with dlopen)"
                    ));
                }
                self.probes.extend(placed);
            }
            Ok(_) => {}
            Err(e) => self.warnings.push(format!("could not probe a newly mapped allocator: {e:#}")),
        }
    }

    /// Read the kernel maps and /proc once for this process; add a checkpoint. Errors become
    /// warnings: a checkpoint that cannot be read is skipped, never the whole recording.
    fn checkpoint(&mut self, tracer: &Tracer, t_s: f64, batch: Option<u32>, work: bool) -> Option<(u64, u64)> {
        let counters = match tracer.counters() {
            Ok(c) => c,
            Err(e) => {
                self.warnings.push(format!("checkpoint at {t_s:.1}s skipped: {e:#}"));
                return None;
            }
        };
        let sites = match tracer.read_sites(self.pid) {
            Ok(s) => s,
            Err(e) => {
                self.warnings.push(format!("checkpoint at {t_s:.1}s skipped: {e:#}"));
                return None;
            }
        };
        // Everything that moves is read together, before the slow part (symbolizing new stacks).
        let units_of_work = work.then(|| tracer.work_units(self.pid));
        let memory = procinfo::memory(self.pid);
        // Kernel-side sites (malloc family, page faults), then off-heap mappings with their
        // resident bytes.
        let resident = self.space.resident(self.pid);
        let offheap: Vec<(SiteKey, leaktrace_common::SiteStats)> =
            self.space.offheap_sites().map(|(k, v)| (*k, *v)).collect();
        let all = sites.into_iter().map(|(k, v)| (k, v, None)).chain(offheap.into_iter().map(|(k, v)| {
            let res = resident.as_ref().map(|(per_site, _)| per_site.get(&k).copied().unwrap_or(0));
            (k, v, Some(res))
        }));
        let mut samples = Vec::new();
        for (key, stats, res) in all.collect::<Vec<_>>() {
            samples.push(SiteSample {
                stack: self.stack_for(tracer, key),
                alloc_bytes: stats.alloc_bytes,
                alloc_count: stats.alloc_count,
                free_bytes: stats.free_bytes,
                free_count: stats.free_count,
                resident_bytes: res.flatten(),
            });
        }
        samples.sort_by_key(|s| s.stack);
        let live: u64 = samples.iter().map(SiteSample::live_bytes).sum();
        // Sparse: only the sites whose totals changed since the previous checkpoint are kept (a
        // site absent from a checkpoint keeps its last totals), so memory grows with activity,
        // not with sites × checkpoints.
        samples.retain(|s| self.last_samples.get(&s.stack) != Some(s));
        for s in &samples {
            self.last_samples.insert(s.stack, s.clone());
        }
        let allocator = resident.as_ref().map(|(_, mmap_resident)| {
            let mut f = AllocatorFootprint {
                mmap_bytes: self.space.allocator_mapped_bytes(),
                mmap_resident_bytes: *mmap_resident,
                ..Default::default()
            };
            if let Some((start, end)) = heap_range(self.pid) {
                f.heap_bytes = end - start;
                f.heap_resident_bytes = std::fs::File::open(format!("/proc/{}/pagemap", self.pid))
                    .ok()
                    .and_then(|pm| mappings::resident_bytes(&pm, start, end))
                    .unwrap_or(0);
            }
            f
        });
        let rss = memory.as_ref().map(|m| m.rss_bytes).unwrap_or(0);
        self.checkpoints.push(Checkpoint {
            t_s,
            memory,
            sites: samples,
            counters: counters.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>(),
            batch,
            managed: self.gauge.as_mut().and_then(|g| g.sample()),
            units_of_work,
            allocator,
        });
        thin(&mut self.checkpoints, MAX_CHECKPOINTS);
        Some((live, rss))
    }

    /// The recording's stack for a kernel site, symbolized the first time it is seen.
    fn stack_for(&mut self, tracer: &Tracer, mut key: SiteKey) -> u32 {
        key.tgid = 0;
        if let Some(&id) = self.stack_index.get(&key) {
            return id;
        }
        let kernel_ips = if key.stack != 0 { tracer.stack(key.stack) } else { None };
        let lost = kernel_ips.is_none();
        let ips = fix_caller(kernel_ips.unwrap_or_default(), key.caller);
        let frames: Vec<Frame> = self.symbolizer.symbolize(&ips);
        let id = self.stacks.len() as u32;
        self.stacks.push(Stack {
            id,
            kind: match key.kind {
                site_kind::MMAP => StackKind::Mmap,
                site_kind::FAULT => StackKind::Fault,
                _ => StackKind::Malloc,
            },
            frames,
            lost,
        });
        self.stack_index.insert(key, id);
        id
    }
}

/// The allocator entry points to probe in `objects` for `mode`: growth mode puts no probe on
/// the allocator's hot path, only on mmap (for the stacks of mappings).
fn scan_for_mode(pid: u32, objects: &[MappedObject], mode: Mode) -> Result<discover::AllocatorScan, discover::TargetError> {
    let mut scan = discover::scan_allocators(pid, objects)?;
    if mode == Mode::Growth {
        scan.points.retain(|p| p.hook.entry_program == "mmap_enter");
    }
    Ok(scan)
}

/// Print the coverage table: per object, which allocator family and functions are probed where.
fn print_coverage(pid: u32, scan: &discover::AllocatorScan) {
    let mut by_object: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &scan.points {
        let at = if p.probe_offset != p.offset { format!("{}+{}", p.function, p.probe_offset - p.offset) } else { p.function.clone() };
        by_object.entry(p.object.path.display().to_string()).or_default().push(at);
    }
    for (object, functions) in by_object {
        let fams: Vec<&str> = scan
            .families
            .iter()
            .filter_map(|f| f.strip_prefix(object.as_str()).and_then(|r| r.strip_prefix(": ")))
            .collect();
        eprintln!("leaktrace: PID {pid}: {object} [{}]: {}", fams.join(", "), functions.join(" "));
    }
}

struct Session {
    tracer: Tracer,
    targets: Vec<Traced>,
    start: Instant,
    status_line: bool,
    mode: Mode,
    work_probe: Option<WorkProbeSpec>,
    follow_forks: bool,
}

/// Where the current batch of `leaktrace check` ends.
#[derive(Clone, Copy, Debug)]
enum BatchMark {
    Time(Instant),
    Units(u64),
}

/// Seconds after which a work probe that could not be placed is reported (a launched command
/// loads its libraries first).
const WORK_PROBE_GRACE_S: f64 = 2.0;

/// How often the loop looks at the targets (exit, new mappings, forks) between checkpoints.
const POLL: Duration = Duration::from_millis(100);

impl Session {
    async fn run(&mut self, opts: &RecordOptions) -> EndReason {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigint = signal(SignalKind::interrupt()).ok();
        let mut sigterm = signal(SignalKind::terminate()).ok();
        let mut sighup = signal(SignalKind::hangup()).ok();
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        // Time 0 is the first checkpoint, taken now that every probe is in place (attaching can
        // take seconds); --duration counts from here too.
        self.start = Instant::now();
        self.checkpoint_all(None);
        let mut next = Instant::now() + opts.interval;
        let deadline = opts.duration.map(|d| self.start + d);
        // Batch state (first target only): (next batch number, units or time at which it closes).
        let mut batch: Option<(u32, BatchMark)> = match &opts.schedule {
            Schedule::Periodic => None,
            Schedule::Batches { warmup, .. } => Some((0, BatchMark::Time(self.start + *warmup))),
        };
        // Batches counted in units of work end at a call count: look more often, so a batch
        // overshoots by few calls.
        let poll = match opts.schedule {
            Schedule::Batches { size: BatchSize::Units(_), .. } => POLL / 5,
            _ => POLL,
        };
        let mut polls: u64 = 0;
        let mut work_missing_told = false;
        loop {
            polls += 1;
            tokio::select! {
                _ = recv(&mut sigint) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = recv(&mut sigterm) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = recv(&mut sighup) => { self.checkpoint_all(None); return EndReason::Signal }
                _ = tokio::time::sleep(poll) => {}
            }
            self.drain_events();
            let t_s = self.start.elapsed().as_secs_f64();
            for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
                if t.gone() {
                    // Its maps still hold everything it allocated: one last checkpoint.
                    t.checkpoint(&self.tracer, t_s, None, self.work_probe.is_some());
                    t.end_reason = Some(EndReason::TargetExited);
                } else {
                    t.symbolizer.refresh();
                    if t.runtime.is_none() && t.exe_resolved && polls.is_multiple_of(5) && polls <= 100 {
                        // A launched runtime maps its libraries right after exec: detect it
                        // early (twice a second, for 10 s) rather than at the first periodic
                        // checkpoint only; later libraries are seen by the periodic rescan.
                        if let Ok(objects) = discover::mapped_objects(t.pid) {
                            t.detect_runtime(&objects);
                        }
                    }
                }
            }
            if self.targets.iter().all(|t| t.end_reason.is_some()) {
                return EndReason::TargetExited;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.checkpoint_all(None);
                return EndReason::Duration;
            }
            if let (Some((n, mark)), Schedule::Batches { count, size, .. }) = (batch, &opts.schedule) {
                let first = self.targets[0].pid;
                let due = match mark {
                    BatchMark::Time(t) => now >= t,
                    BatchMark::Units(u) => self.tracer.work_units(first) >= u,
                };
                if due {
                    self.checkpoint_all(Some(n));
                    self.clear_status();
                    eprintln!(
                        "leaktrace: {} at {:.1}s",
                        if n == 0 { "warm-up done, baseline taken".to_string() } else { format!("batch {n}/{count} done") },
                        self.start.elapsed().as_secs_f64()
                    );
                    if n >= *count {
                        return EndReason::BatchesDone;
                    }
                    // The next batch starts where the checkpoint just taken measured, not after it
                    // (symbolizing new stacks can take a while).
                    let cp = self.targets[0].checkpoints.last();
                    let mark = match size {
                        BatchSize::Seconds(d) => BatchMark::Time(now + *d),
                        BatchSize::Units(k) => BatchMark::Units(
                            cp.and_then(|c| c.units_of_work).unwrap_or_else(|| self.tracer.work_units(first)) + k,
                        ),
                    };
                    batch = Some((n + 1, mark));
                    next = now + opts.interval;
                    continue;
                }
            }
            if now >= next {
                let t_s = self.start.elapsed().as_secs_f64();
                for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
                    t.rescan(&mut self.tracer, self.mode, self.work_probe.as_ref(), t_s);
                }
                // A work probe that cannot be placed once the command has loaded its libraries
                // is a mistake to report, not to wait on: `check` by units would never end.
                if let (Some(spec), false) = (&self.work_probe, self.targets[0].work_attached)
                    && t_s >= WORK_PROBE_GRACE_S && !work_missing_told {
                        work_missing_told = true;
                        self.clear_status();
                        eprintln!(
                            "leaktrace: warning: --work-probe {spec}: no function `{}` in the objects PID {} maps after {t_s:.0} s",
                            spec.symbol, self.targets[0].pid
                        );
                        if matches!(opts.schedule, Schedule::Batches { size: BatchSize::Units(_), .. }) {
                            self.checkpoint_all(None);
                            return EndReason::WorkProbeMissing;
                        }
                    }
                self.checkpoint_all(None);
                next += opts.interval;
                if next < now {
                    next = now + opts.interval;
                }
            }
        }
    }

    /// Apply queued mapping events to their process; with --follow-forks, attach to new children
    /// of traced processes.
    fn drain_events(&mut self) {
        let mut forks = Vec::new();
        let targets = &mut self.targets;
        self.tracer.drain_map_events(|ev| {
            if ev.kind == leaktrace_common::map_event::FORK {
                forks.push((ev.tgid, ev.addr as u32));
                return;
            }
            if let Some(t) = targets.iter_mut().find(|t| t.pid == ev.tgid && t.end_reason.is_none()) {
                t.space.apply(ev);
            }
        });
        for (parent, child) in forks {
            // sched_process_fork also fires for new threads: keep new processes only.
            let is_process = std::fs::read_to_string(format!("/proc/{child}/status"))
                .ok()
                .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:")).map(|v| v.trim() == child.to_string()))
                .unwrap_or(false);
            if !is_process || self.targets.iter().any(|t| t.pid == child) {
                continue;
            }
            if !self.follow_forks {
                // A wrapper script or a forking server: say plainly that the children are not traced.
                if let Some(p) = self.targets.iter_mut().find(|t| t.pid == parent) {
                    p.untraced_children += 1;
                    if p.untraced_children == 1 {
                        self.clear_status();
                        eprintln!(
                            "leaktrace: warning: PID {parent} forked PID {child}, which is not traced (add --follow-forks to trace children)"
                        );
                    }
                }
                continue;
            }
            let Ok(objects) = discover::mapped_objects(child) else { continue };
            let opts = RecordOptions {
                work_probe: self.work_probe.clone(),
                mode: self.mode,
                ..RecordOptions::default()
            };
            match Traced::attach(&mut self.tracer, child, objects, procinfo::cmdline(child), procinfo::exe(child), false, &opts) {
                Ok(mut t) => {
                    let t_s = self.start.elapsed().as_secs_f64();
                    t.warnings.push(format!("forked by PID {parent}; traced from t={t_s:.1}s"));
                    self.clear_status();
                    eprintln!("leaktrace: following PID {child}, forked by PID {parent}");
                    t.checkpoint(&self.tracer, t_s, None, self.work_probe.is_some());
                    self.targets.push(t);
                }
                Err(e) => {
                    if let Some(p) = self.targets.iter_mut().find(|t| t.pid == parent) {
                        p.warnings.push(format!("could not follow child PID {child}: {e:#}"));
                    }
                }
            }
        }
    }

    fn checkpoint_all(&mut self, batch: Option<u32>) {
        self.drain_events();
        let t_s = self.start.elapsed().as_secs_f64();
        let (mut live, mut rss, mut n) = (0, 0, 0);
        for t in self.targets.iter_mut().filter(|t| t.end_reason.is_none()) {
            if let Some((l, r)) = t.checkpoint(&self.tracer, t_s, batch, self.work_probe.is_some()) {
                live += l;
                rss += r;
                n += 1;
            }
        }
        if self.status_line {
            let who = if n == 1 { format!("PID {}", self.targets[0].pid) } else { format!("{n} processes") };
            eprint!("\r\x1b[2K[{t_s:6.1}s] {who}: live {}, RSS {}", human::bytes(live), human::bytes(rss));
            let _ = std::io::stderr().flush();
        }
    }

    fn clear_status(&self) {
        if self.status_line {
            eprint!("\r\x1b[2K");
        }
    }
}

/// Checkpoints kept per process. Past this, every other periodic checkpoint of the run so far
/// is merged into the next one (the first, the last and `check`'s batch checkpoints stay), so a
/// long recording keeps its whole time span at a coarser step, in bounded memory.
pub const MAX_CHECKPOINTS: usize = 2000;

/// Halve the number of checkpoints when there are more than `max` (see [`MAX_CHECKPOINTS`]).
/// A dropped checkpoint's site samples move to the next checkpoint when that one has no newer
/// sample of the same site, so sparse totals stay right.
pub fn thin(checkpoints: &mut Vec<Checkpoint>, max: usize) {
    if checkpoints.len() <= max || checkpoints.len() < 3 {
        return;
    }
    let last = checkpoints.len() - 1;
    let old = std::mem::take(checkpoints);
    let mut carry: Vec<SiteSample> = Vec::new();
    let mut periodic = 0usize;
    for (i, mut c) in old.into_iter().enumerate() {
        let keep = i == 0 || i == last || c.batch.is_some() || {
            periodic += 1;
            periodic.is_multiple_of(2)
        };
        if !carry.is_empty() {
            for s in carry.drain(..) {
                if !c.sites.iter().any(|x| x.stack == s.stack) {
                    c.sites.push(s);
                }
            }
            c.sites.sort_by_key(|s| s.stack);
        }
        if keep {
            checkpoints.push(c);
        } else {
            carry = c.sites;
        }
    }
}

/// The brk heap of `pid` ([heap] in /proc/PID/maps), as (start, end).
fn heap_range(pid: u32) -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let heap = maps.lines().filter_map(procinfo::parse_maps_line).find(|l| l.path == "[heap]")?;
    Some((heap.start, heap.end))
}

/// Put back the direct caller that the kernel's frame-pointer walk skips at a function's first
/// instruction: `caller` (read at the stack pointer on entry) becomes frame 1 unless the kernel
/// already has it there. With no kernel stack, the caller alone is what is known.
pub fn fix_caller(mut ips: Vec<u64>, caller: u64) -> Vec<u64> {
    if caller == 0 {
        return ips;
    }
    if ips.is_empty() {
        return vec![caller];
    }
    if ips.get(1) != Some(&caller) {
        ips.insert(1, caller);
    }
    ips
}

#[cfg(test)]
mod tests {
    use super::fix_caller;

    #[test]
    fn thinning_keeps_sparse_totals_and_batches() {
        use crate::recording::{Checkpoint, SiteSample};
        let sample = |stack: u32, a: u64| SiteSample { stack, alloc_bytes: a, alloc_count: 1, ..Default::default() };
        let mut cps: Vec<Checkpoint> = (0..10)
            .map(|i| Checkpoint {
                t_s: i as f64,
                // Site 1 changes at every checkpoint, site 2 only at checkpoint 3.
                sites: if i == 3 { vec![sample(1, i), sample(2, 7)] } else { vec![sample(1, i)] },
                batch: (i == 5).then_some(1),
                ..Default::default()
            })
            .collect();
        super::thin(&mut cps, 6);
        assert!(cps.len() <= 7, "{}", cps.len());
        assert_eq!(cps.first().unwrap().t_s, 0.0);
        assert_eq!(cps.last().unwrap().t_s, 9.0);
        assert!(cps.iter().any(|c| c.batch == Some(1)));
        // Site 2's only sample survives, at or after t = 3.
        let with2: Vec<f64> = cps.iter().filter(|c| c.sites.iter().any(|s| s.stack == 2)).map(|c| c.t_s).collect();
        assert_eq!(with2.len(), 1, "{with2:?}");
        assert!(with2[0] >= 3.0);
        // Site 1 keeps its latest value at every kept checkpoint.
        for c in &cps {
            assert_eq!(c.sites.iter().find(|s| s.stack == 1).unwrap().alloc_bytes, c.t_s as u64);
        }
    }

    #[test]
    fn caller_is_restored_once() {
        assert_eq!(fix_caller(vec![10, 30, 40], 20), vec![10, 20, 30, 40]);
        assert_eq!(fix_caller(vec![10, 20, 30], 20), vec![10, 20, 30]);
        assert_eq!(fix_caller(vec![], 20), vec![20]);
        assert_eq!(fix_caller(vec![10], 0), vec![10]);
        assert_eq!(fix_caller(vec![10], 20), vec![10, 20]);
    }
}
