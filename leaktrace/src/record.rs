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
use crate::recording::{AllocatorFootprint, Checkpoint, Frame, ProbeInfo, Recording, SiteSample, Stack, Target};
use crate::symbolize::StackSymbolizer;
use crate::{analyze::AnalyzeOptions, output, procinfo, report};

/// What to trace.
#[derive(Clone, Debug)]
pub enum TargetSpec {
    /// A running process.
    Pid(u32),
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
}

/// Result of a recording.
#[derive(Debug)]
pub struct RecordOutcome {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    pub exit_status: Option<ExitStatus>,
    pub recording: Recording,
}

/// Errors found before anything was attached: a bad target, an unwritable output directory.
/// The CLI maps them (and every other error) to exit code 2.
pub fn record(spec: TargetSpec, opts: RecordOptions) -> anyhow::Result<RecordOutcome> {
    // Everything that can be checked before touching the target is checked first.
    crate::probes::check_privileges()?;
    if let TargetSpec::Pid(pid) = &spec {
        discover::check_pid(*pid)?;
        if *pid == std::process::id() {
            anyhow::bail!("PID {pid} is leaktrace itself");
        }
    }
    let mut tracer = Tracer::load(opts.limits, opts.mode)?;

    let mut held: Option<HeldChild> = None;
    let pid = match &spec {
        TargetSpec::Pid(pid) => *pid,
        TargetSpec::Launch(argv) => {
            let child = launch::spawn_held(argv)?;
            let pid = child.pid;
            held = Some(child);
            pid
        }
    };
    let dir = opts.out.clone().unwrap_or_else(|| default_out_dir(pid));
    if let Err(e) = output::ensure_writable_dir(&dir) {
        if let Some(c) = held.take() {
            c.abandon();
        }
        return Err(e);
    }

    // Find and probe the allocator.
    let (objects, command, exe) = match &held {
        None => (discover::mapped_objects(pid)?, procinfo::cmdline(pid), procinfo::exe(pid)),
        Some(c) => (launch_objects(&c.exe)?, c.argv.clone(), c.exe.display().to_string()),
    };
    let attach = (|| -> anyhow::Result<(Vec<ProbeInfo>, BTreeSet<(i32, i32, u64)>, Vec<String>)> {
        let mut scan = discover::scan_allocators(pid, &objects)?;
        if opts.mode == Mode::Growth {
            // No probe on the allocator's hot path: only mmap, for the stacks of mappings.
            scan.points.retain(|p| p.hook.entry_program == "mmap_enter");
        }
        for f in &scan.families {
            eprintln!("leaktrace: allocator {f}");
        }
        let probed: BTreeSet<_> = scan.points.iter().map(|p| (p.object.dev.0, p.object.dev.1, p.object.inode)).collect();
        let placed = tracer.attach(pid, &scan.points)?;
        let mut notes = scan.notes;
        let mut placed = placed;
        if let Some(spec) = &opts.work_probe {
            match discover::find_work_function(spec, &objects) {
                Some((obj, off)) => {
                    let mut info = tracer.attach_work_probe(pid, &obj.path.display().to_string(), &obj.open_path, off)?;
                    info.function = spec.symbol.clone();
                    placed.push(info);
                }
                None if held.is_some() => {} // may be in a library the command loads: retried at checkpoints
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
        Ok((placed, probed, notes))
    })();
    let (mut probes, mut probed, notes) = match attach {
        Ok(v) => v,
        Err(e) => {
            if let Some(c) = held.take() {
                c.abandon();
            }
            return Err(e);
        }
    };
    let launched = held.is_some();
    if let Some(c) = held.as_mut() {
        c.release()?;
    }
    let objects_probed: BTreeSet<&str> = probes.iter().map(|p| p.object.as_str()).collect();
    eprintln!(
        "leaktrace: attached to PID {pid} ({}): {} probes in {}",
        command.join(" "),
        probes.len(),
        objects_probed.into_iter().collect::<Vec<_>>().join(", ")
    );

    let mut session = Session {
        pid,
        launched,
        tracer,
        symbolizer: StackSymbolizer::new(pid),
        stacks: Vec::new(),
        stack_index: HashMap::new(),
        checkpoints: Vec::new(),
        start: Instant::now(),
        warnings: notes,
        status_line: opts.status_line && unsafe { libc::isatty(2) } == 1,
        exit_status: None,
        space: AddressSpace::default(),
        work_probe: opts.work_probe.clone(),
        work_attached: probes.iter().any(|p| p.kind == "work"),
        mode: opts.mode,
        runtime: None,
        gauge: None,
    };
    if !launched {
        session.detect_runtime(&objects);
    }
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let end_reason = rt.block_on(session.run(&opts, &mut probes, &mut probed));

    // In launch mode the command does not outlive the recording.
    if launched && session.exit_status.is_none() {
        session.exit_status = launch::terminate(pid, Duration::from_secs(2));
        if let Some(s) = session.exit_status {
            eprintln!("leaktrace: stopped {} ({s})", command.join(" "));
        }
    }
    session.clear_status();

    let recording = Recording {
        format_version: crate::recording::FORMAT_VERSION,
        leaktrace_version: env!("CARGO_PKG_VERSION").to_string(),
        target: Target {
            pid,
            runtime: session.runtime.as_ref().map(|r| r.name.clone()),
            runtime_version: session.runtime.as_ref().and_then(|r| r.version.clone()),
            nspid: session.nspid(),
            command,
            exe,
            launched,
            exit_status: session.exit_status.map(ExitStatus::as_shell),
        },
        mode: opts.mode.name().to_string(),
        sample_bytes: match opts.mode {
            Mode::Sampled { mean_bytes } => Some(mean_bytes),
            _ => None,
        },
        work_probe: opts.work_probe.as_ref().map(|w| w.to_string()),
        started_unix_ms,
        interval_s: opts.interval.as_secs_f64(),
        probes,
        stacks: std::mem::take(&mut session.stacks),
        checkpoints: std::mem::take(&mut session.checkpoints),
        end_reason: end_reason.to_string(),
        warnings: std::mem::take(&mut session.warnings),
    };
    let files = save(&recording, &dir, opts.top)?;
    Ok(RecordOutcome { dir, files, exit_status: session.exit_status, recording })
}

/// Write recording.json, then every output rendered from it. Returns the files written.
pub fn save(recording: &Recording, dir: &Path, top: usize) -> anyhow::Result<Vec<PathBuf>> {
    let path = dir.join("recording.json");
    output::write_atomic(&path, &serde_json::to_vec(recording)?)?;
    let mut files = vec![path];
    files.extend(report::write_all(recording, dir, &AnalyzeOptions { top, ..Default::default() })?);
    Ok(files)
}

fn default_out_dir(pid: u32) -> PathBuf {
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&now, &mut tm) };
    PathBuf::from(format!(
        "leaktrace-{pid}-{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    ))
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
    for lib in loader_list(&program) {
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
/// resolves without running the program). Empty for static executables or on any failure.
fn loader_list(exe: &Path) -> Vec<PathBuf> {
    use object::read::elf::ProgramHeader as _;
    let Ok(data) = std::fs::read(exe) else { return Vec::new() };
    let Ok(elf) = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data) else { return Vec::new() };
    let endian = elf.endian();
    let interp = elf.elf_program_headers().iter().find_map(|ph| {
        (ph.p_type(endian) == object::elf::PT_INTERP)
            .then(|| ph.data(endian, &*data).ok())
            .flatten()
            .map(|d| String::from_utf8_lossy(d.split(|c| *c == 0).next().unwrap_or(d)).into_owned())
    });
    let Some(interp) = interp else { return Vec::new() };
    let Ok(out) = std::process::Command::new(&interp).arg("--list").arg(exe).stderr(std::process::Stdio::null()).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=> ") {
                Some((_, rest)) => rest,
                None => l.trim_start(),
            };
            let path = path.split(" (").next()?.trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

struct Session {
    pid: u32,
    launched: bool,
    tracer: Tracer,
    symbolizer: StackSymbolizer,
    stacks: Vec<Stack>,
    /// Kernel site key (tgid cleared) → index in `stacks`.
    stack_index: HashMap<SiteKey, u32>,
    checkpoints: Vec<Checkpoint>,
    start: Instant,
    warnings: Vec<String>,
    status_line: bool,
    exit_status: Option<ExitStatus>,
    /// Anonymous regions made since attach (off-heap and the allocator's).
    space: AddressSpace,
    work_probe: Option<WorkProbeSpec>,
    work_attached: bool,
    mode: Mode,
    /// Managed runtime of the target, once detected.
    runtime: Option<crate::runtimes::RuntimeInfo>,
    /// The runtime's own heap figures, sampled at every checkpoint.
    gauge: Option<Box<dyn crate::runtimes::HeapGauge>>,
}

/// Where the current batch of `leaktrace check` ends.
#[derive(Clone, Copy, Debug)]
enum BatchMark {
    Time(Instant),
    Units(u64),
}

/// How often the loop looks at the target (exit, new mappings) between checkpoints.
const POLL: Duration = Duration::from_millis(100);

impl Session {
    async fn run(
        &mut self,
        opts: &RecordOptions,
        probes: &mut Vec<ProbeInfo>,
        probed: &mut BTreeSet<(i32, i32, u64)>,
    ) -> &'static str {
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
        self.checkpoint(None);
        let mut next = Instant::now() + opts.interval;
        let deadline = opts.duration.map(|d| self.start + d);
        // Batch state: (next batch number, units or time at which it closes).
        let mut batch: Option<(u32, BatchMark)> = match &opts.schedule {
            Schedule::Periodic => None,
            Schedule::Batches { warmup, .. } => Some((0, BatchMark::Time(self.start + *warmup))),
        };
        loop {
            tokio::select! {
                _ = recv(&mut sigint) => return "signal",
                _ = recv(&mut sigterm) => return "signal",
                _ = recv(&mut sighup) => return "signal",
                _ = tokio::time::sleep(POLL) => {}
            }
            self.drain_map_events();
            if self.target_gone() {
                // Its maps still hold everything it allocated: one last checkpoint.
                self.checkpoint(None);
                return "target-exited";
            }
            self.symbolizer.refresh();
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.checkpoint(None);
                return "duration";
            }
            if let (Some((n, mark)), Schedule::Batches { count, size, .. }) = (batch, &opts.schedule) {
                let due = match mark {
                    BatchMark::Time(t) => now >= t,
                    BatchMark::Units(u) => self.tracer.work_units(self.pid) >= u,
                };
                if due {
                    self.checkpoint(Some(n));
                    if self.status_line {
                        self.clear_status();
                    }
                    eprintln!("leaktrace: {} at {:.1}s", if n == 0 { "warm-up done, baseline taken".to_string() } else { format!("batch {n}/{count} done") }, self.start.elapsed().as_secs_f64());
                    if n >= *count {
                        return "batches-done";
                    }
                    let mark = match size {
                        BatchSize::Seconds(d) => BatchMark::Time(now + *d),
                        BatchSize::Units(k) => BatchMark::Units(self.tracer.work_units(self.pid) + k),
                    };
                    batch = Some((n + 1, mark));
                    next = now + opts.interval;
                    continue;
                }
            }
            if now >= next {
                self.rescan(probes, probed);
                self.checkpoint(None);
                next += opts.interval;
                if next < now {
                    next = now + opts.interval;
                }
            }
        }
    }

    fn drain_map_events(&mut self) {
        let pid = self.pid;
        let space = &mut self.space;
        self.tracer.drain_map_events(|ev| {
            if ev.tgid == pid {
                space.apply(ev)
            }
        });
    }

    fn target_gone(&mut self) -> bool {
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
    fn rescan(&mut self, probes: &mut Vec<ProbeInfo>, probed: &mut BTreeSet<(i32, i32, u64)>) {
        let Ok(objects) = discover::mapped_objects(self.pid) else { return };
        self.detect_runtime(&objects);
        if let (Some(spec), false) = (&self.work_probe, self.work_attached) {
            if let Some((obj, off)) = discover::find_work_function(spec, &objects) {
                match self.tracer.attach_work_probe(self.pid, &obj.path.display().to_string(), &obj.open_path, off) {
                    Ok(mut info) => {
                        info.function = spec.symbol.clone();
                        self.warnings.push(format!(
                            "work probe {spec} placed at t={:.1}s (its object was mapped after attach)",
                            self.start.elapsed().as_secs_f64()
                        ));
                        probes.push(info);
                        self.work_attached = true;
                    }
                    Err(e) => {
                        self.warnings.push(format!("{e:#}"));
                        self.work_attached = true;
                    }
                }
            }
        }
        let fresh: Vec<MappedObject> =
            objects.into_iter().filter(|o| !probed.contains(&(o.dev.0, o.dev.1, o.inode))).collect();
        if fresh.is_empty() {
            return;
        }
        for o in &fresh {
            probed.insert((o.dev.0, o.dev.1, o.inode));
        }
        let Ok(mut scan) = discover::scan_allocators(self.pid, &fresh) else { return };
        if self.mode == Mode::Growth {
            scan.points.retain(|p| p.hook.entry_program == "mmap_enter");
        }
        match self.tracer.attach(self.pid, &scan.points) {
            Ok(placed) if !placed.is_empty() => {
                let t = self.start.elapsed().as_secs_f64();
                for p in &placed {
                    if p.kind == "entry" {
                        self.warnings.push(format!(
                            "{} in {} was probed only from t={t:.1}s (the target mapped it after attach)",
                            p.function, p.object
                        ));
                    }
                }
                probes.extend(placed);
            }
            Ok(_) => {}
            Err(e) => self.warnings.push(format!("could not probe a newly mapped allocator: {e:#}")),
        }
    }

    fn nspid(&self) -> Vec<u32> {
        let v = procinfo::nspid(self.pid);
        if v.is_empty() { vec![self.pid] } else { v }
    }

    /// Read the kernel maps and /proc once; add a checkpoint. Errors become warnings: a
    /// checkpoint that cannot be read is skipped, never the whole recording.
    fn checkpoint(&mut self, batch: Option<u32>) {
        let t_s = self.start.elapsed().as_secs_f64();
        let counters = match self.tracer.counters() {
            Ok(c) => c,
            Err(e) => {
                self.warnings.push(format!("checkpoint at {t_s:.1}s skipped: {e:#}"));
                return;
            }
        };
        let sites = match self.tracer.read_sites(self.pid) {
            Ok(s) => s,
            Err(e) => {
                self.warnings.push(format!("checkpoint at {t_s:.1}s skipped: {e:#}"));
                return;
            }
        };
        let mut samples = Vec::with_capacity(sites.len());
        for (key, stats) in sites {
            let stack = self.stack_for(key);
            samples.push(SiteSample {
                stack,
                alloc_bytes: stats.alloc_bytes,
                alloc_count: stats.alloc_count,
                free_bytes: stats.free_bytes,
                free_count: stats.free_count,
                resident_bytes: None,
            });
        }
        self.drain_map_events();
        let resident = self.space.resident(self.pid);
        let offheap: Vec<(SiteKey, leaktrace_common::SiteStats)> =
            self.space.offheap_sites().map(|(k, v)| (*k, *v)).collect();
        for (key, stats) in offheap {
            let stack = self.stack_for(key);
            samples.push(SiteSample {
                stack,
                alloc_bytes: stats.alloc_bytes,
                alloc_count: stats.alloc_count,
                free_bytes: stats.free_bytes,
                free_count: stats.free_count,
                resident_bytes: resident.as_ref().map(|(per_site, _)| per_site.get(&key).copied().unwrap_or(0)),
            });
        }
        samples.sort_by_key(|s| s.stack);
        let memory = procinfo::memory(self.pid);
        let allocator = match (&resident, heap_range(self.pid)) {
            (Some((_, mmap_resident)), Some((start, end))) => {
                let heap_resident = std::fs::File::open(format!("/proc/{}/pagemap", self.pid))
                    .ok()
                    .and_then(|f| mappings::resident_bytes(&f, start, end))
                    .unwrap_or(0);
                Some(AllocatorFootprint {
                    heap_bytes: end - start,
                    heap_resident_bytes: heap_resident,
                    mmap_bytes: self.space.allocator_mapped_bytes(),
                    mmap_resident_bytes: *mmap_resident,
                })
            }
            (Some((_, mmap_resident)), None) => Some(AllocatorFootprint {
                mmap_bytes: self.space.allocator_mapped_bytes(),
                mmap_resident_bytes: *mmap_resident,
                ..Default::default()
            }),
            _ => None,
        };
        if self.status_line {
            let live: u64 = samples.iter().map(SiteSample::live_bytes).sum();
            let rss = memory.as_ref().map(|m| m.rss_bytes).unwrap_or(0);
            eprint!(
                "\r\x1b[2K[{t_s:6.1}s] live {} in {} sites, RSS {}",
                human(live),
                samples.len(),
                human(rss)
            );
            let _ = std::io::stderr().flush();
        }
        self.checkpoints.push(Checkpoint {
            t_s,
            memory,
            sites: samples,
            counters: counters.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>(),
            batch,
            managed: self.gauge.as_mut().and_then(|g| g.sample()),
            units_of_work: self.work_probe.as_ref().map(|_| self.tracer.work_units(self.pid)),
            allocator,
        });
    }

    fn clear_status(&self) {
        if self.status_line {
            eprint!("\r\x1b[2K");
        }
    }

    /// The recording's stack for a kernel site, symbolized the first time it is seen.
    fn stack_for(&mut self, mut key: SiteKey) -> u32 {
        key.tgid = 0;
        if let Some(&id) = self.stack_index.get(&key) {
            return id;
        }
        let kernel_ips = if key.stack_id >= 0 { self.tracer.stack(key.stack_id as u32) } else { None };
        let lost = kernel_ips.is_none();
        let ips = fix_caller(kernel_ips.unwrap_or_default(), key.caller);
        let frames: Vec<Frame> = self.symbolizer.symbolize(&ips);
        let id = self.stacks.len() as u32;
        self.stacks.push(Stack {
            id,
            kind: match key.kind {
                site_kind::MMAP => "mmap",
                site_kind::FAULT => "fault",
                _ => "malloc",
            }
            .to_string(),
            frames,
            lost,
        });
        self.stack_index.insert(key, id);
        id
    }
}

/// The brk heap of `pid` ([heap] in /proc/PID/maps), as (start, end).
fn heap_range(pid: u32) -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let line = maps.lines().find(|l| l.ends_with("[heap]"))?;
    let (s, e) = line.split_ascii_whitespace().next()?.split_once('-')?;
    Some((u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?))
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

fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{b} B") } else { format!("{v:.1} {}", U[i]) }
}

#[cfg(test)]
mod tests {
    use super::fix_caller;

    #[test]
    fn caller_is_restored_once() {
        assert_eq!(fix_caller(vec![10, 30, 40], 20), vec![10, 20, 30, 40]);
        assert_eq!(fix_caller(vec![10, 20, 30], 20), vec![10, 20, 30]);
        assert_eq!(fix_caller(vec![], 20), vec![20]);
        assert_eq!(fix_caller(vec![10], 0), vec![10]);
        assert_eq!(fix_caller(vec![10], 20), vec![10, 20]);
    }
}
