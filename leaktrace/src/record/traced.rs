//! One traced process: its probes, symbolizer, stacks, checkpoints, address space and runtime;
//! attaching to it, rescanning its objects, and taking its checkpoints (thinned past
//! [`MAX_CHECKPOINTS`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use leaktrace_common::{SiteKey, site_kind};

use crate::discover::{self, MappedObject};
use crate::launch::{self, ExitStatus};
use crate::mappings::{self, AddressSpace};
use crate::probes::{Mode, Tracer};
use crate::procinfo;
use crate::symbolize::StackSymbolizer;
use leaktrace_analysis::recording::{
    AllocatorFootprint, Checkpoint, Frame, ProbeInfo, ProbeKind, SiteSample, Stack, StackKind,
};

use super::ending::{OomWatch, ending, memory_events_of, memory_limit_of, oom_kills};

use super::*;

mod arena_figures;
mod parts;
mod runtime;

/// How long the task [`Traced::gone`] found stays the one a checkpoint reads memory through
/// (a poll's round over every process, then its checkpoints, take well under this).
const LIVE_SEEN_FOR: std::time::Duration = std::time::Duration::from_millis(100);

/// One traced process and everything recorded about it.
pub(super) struct Traced {
    pub(super) pid: u32,
    pub(super) launched: bool,
    /// Launched, or a child of a launched command followed with --follow-forks: its teardown
    /// is watched ([`Traced::place_teardown_probes`]), so its last checkpoint is taken while
    /// its memory can still be read (a short child's libraries, mapped after it was followed,
    /// are symbolized then).
    pub(super) in_launched_tree: bool,
    pub(super) command: Vec<String>,
    pub(super) exe: String,
    pub(super) nspid: Vec<u32>,
    pub(super) symbolizer: StackSymbolizer,
    pub(super) stacks: Vec<Stack>,
    /// Kernel site key (tgid cleared) → index in `stacks`.
    pub(super) stack_index: HashMap<SiteKey, u32>,
    /// Stacks with native frames only, by (site kind, frame addresses): where a stack whose
    /// Python frames are left out (made during an import) joins its native twin.
    pub(super) native_stacks: HashMap<(u32, Vec<u64>), u32>,
    pub(super) checkpoints: Vec<Checkpoint>,
    pub(super) warnings: Vec<String>,
    pub(super) exit_status: Option<ExitStatus>,
    /// Anonymous regions made since attach (off-heap and the allocator's).
    pub(super) space: AddressSpace,
    pub(super) work_attached: bool,
    /// Managed runtime of the target, once detected, with its state for this process.
    pub(super) runtime: Option<Box<dyn crate::runtimes::RuntimeInstance>>,
    /// What the recording asks of the runtimes (`--python-frames`, `--jvm-perf-map`, ...).
    pub(super) runtime_opts: crate::runtimes::RuntimeOptions,
    /// `--heap-census`: the runtime's own heap tools at the start and the end.
    pub(super) census: crate::holds::HeapCensus,
    /// glibc's arena headers (`system_mem`), read at every checkpoint under glibc's malloc.
    pub(super) glibc_stats: crate::reach::arena_stats::GlibcArenaStats,
    pub(super) probes: Vec<ProbeInfo>,
    /// Objects already scanned for allocators, by (device major, minor, inode).
    pub(super) probed: BTreeSet<(i32, i32, u64)>,
    /// `exe` was read from /proc/PID/exe (launched commands: after their exec).
    pub(super) exe_resolved: bool,
    /// The last sample recorded for each stack (checkpoints keep only changed sites).
    pub(super) last_samples: HashMap<u32, SiteSample>,
    /// Reachability scans taken during the recording (`--reachability-every`), oldest first.
    pub(super) reach_scans: Vec<leaktrace_analysis::reachability::Reachability>,
    /// The reachability scan taken at the teardown stop (a launched command's `exit`), kept as
    /// the recording's scan when the process then exits.
    pub(super) reach_at_exit: Option<leaktrace_analysis::reachability::Reachability>,
    /// Python heap censuses (`--python-heap`) and where the interpreter is.
    pub(super) py_heap: super::py_heap_state::PyHeap,
    /// Every execve seen during the recording.
    pub(super) execs: Vec<leaktrace_analysis::recording::ExecChange>,
    /// A launched command's own exec (from leaktrace's held child into the command) is still to
    /// come through the exec tracepoint: not an exec of the recording.
    pub(super) launch_exec_pending: bool,
    /// (device, inode) of /proc/PID/exe as last seen: an exec noticed without the tracepoint.
    pub(super) exe_id: Option<(u64, u64)>,
    /// The cgroup v2 the process is in and its `oom_kill` count when first seen there.
    pub(super) oom_watch: Option<OomWatch>,
    /// The task through which its memory is read ([`procinfo::live_task`]) as
    /// [`Traced::gone`] last found it, and when: the checkpoint of the same poll uses it
    /// instead of reading /proc/PID/stat again.
    live_seen: Option<(std::time::Instant, u32)>,
    /// When the main thread was first seen exited while other threads ran (pthread_exit in
    /// main), and whether the report's warning about it was written.
    leader_exited: Option<(std::time::Instant, bool)>,
    /// oom:mark_victim is attached and this process is in the kernel's TARGETS filter: the OOM
    /// killer choosing it is seen (`session.oom_victim_anon_kib`), and the cgroup's counter
    /// is only a note.
    pub(super) oom_victims_watched: bool,
    /// How the process ended, in words, once it ended during the recording.
    pub(super) ended: Option<String>,
    /// /proc/PID/cgroup as last read by [`Traced::watch_cgroup`].
    pub(super) cgroup_seen: Option<String>,
    /// The memory limit of the cgroup the process is in (bytes, and the file that sets it), read
    /// when the process is first seen in that cgroup ([`memory_limit_of`]); None: no limit.
    pub(super) memory_limit: Option<(u64, std::path::PathBuf)>,
    /// Launched commands: teardown probes placed, as (object path, function).
    pub(super) teardown_probes: BTreeSet<(String, &'static str)>,
    /// What the session loop keeps of it: how it ended, its teardown, untraced children.
    pub(super) session: super::session::SessionState,
    /// The allocator's mappings found by the addresses of its blocks (`mappings::block_regions`)
    /// at the last checkpoint, [start, end).
    pub(super) block_regions: Vec<(u64, u64)>,
    /// When the live blocks were last read from the kernel for that, and how long it took.
    pub(super) block_scan: Option<(std::time::Instant, std::time::Duration)>,
    /// The tracer's clock of blocks' birth times (`Tracer::now_ms`) at this process's first
    /// checkpoint (`t_s` = 0), ms: birth times are recorded relative to it.
    pub(super) born_zero_ms: Option<i64>,
    /// A recording that starts inside a session whose tracer already traced the process (growth
    /// mode's exact window): the kernel sites' totals when it started, subtracted from theirs
    /// (page-fault sites left out), so that it counts from zero as one made by its own tracer.
    pub(super) sites_before: Option<HashMap<SiteKey, leaktrace_common::SiteStats>>,
    /// A growth-mode recording: the kernel's allocator-call sites of the process are not its
    /// (growth mode places no allocator probe; those sites are an exact window's, run on the
    /// same process in the same session, which counts them itself).
    allocator_sites_ignored: bool,
}

/// `now - before`, field by field (0 where a field went down).
fn stats_since(now: &leaktrace_common::SiteStats, before: &leaktrace_common::SiteStats) -> leaktrace_common::SiteStats {
    leaktrace_common::SiteStats {
        alloc_bytes: now.alloc_bytes.saturating_sub(before.alloc_bytes),
        alloc_count: now.alloc_count.saturating_sub(before.alloc_count),
        free_bytes: now.free_bytes.saturating_sub(before.free_bytes),
        free_count: now.free_count.saturating_sub(before.free_count),
        alloc_born_ms: now.alloc_born_ms.saturating_sub(before.alloc_born_ms),
        free_born_ms: now.free_born_ms.saturating_sub(before.free_born_ms),
    }
}

/// (device, inode) of the executable `pid` runs.
pub(super) fn exe_identity(pid: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(format!("/proc/{pid}/exe")).ok().map(|m| (m.dev(), m.ino()))
}

impl Traced {
    /// Count this process's kernel sites from now on (see [`Traced::sites_before`]).
    pub(super) fn count_sites_from_now(&mut self, tracer: &Tracer) -> anyhow::Result<()> {
        self.sites_before = Some(tracer.read_sites(self.pid)?.into_iter().collect());
        Ok(())
    }

    /// `sites` as this recording counts them: all of them (in growth mode, all but the
    /// allocator's calls), or, with [`Traced::sites_before`], their totals since then, page-fault
    /// sites and sites without change left out.
    fn since_start(
        &self,
        sites: Vec<(SiteKey, leaktrace_common::SiteStats)>,
    ) -> Vec<(SiteKey, leaktrace_common::SiteStats)> {
        let sites = sites.into_iter().filter(|(k, _)| !self.allocator_sites_ignored || k.kind != site_kind::MALLOC);
        let Some(before) = &self.sites_before else { return sites.collect() };
        sites
            .filter(|(k, _)| k.kind != site_kind::FAULT)
            .filter_map(|(k, v)| match before.get(&k) {
                None => Some((k, v)),
                Some(b) => Some((k, stats_since(&v, b))).filter(|(_, d)| d.alloc_count + d.free_count > 0),
            })
            .collect()
    }

    /// Find and probe the allocator of `pid` in `objects`, place the work probe, and start
    /// tracking its mappings.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attach(
        tracer: &mut Tracer,
        pid: u32,
        objects: Vec<MappedObject>,
        command: Vec<String>,
        exe: String,
        launched: bool,
        opts: &RecordOptions,
    ) -> anyhow::Result<Traced> {
        let scan = scan_for_mode(pid, &objects, opts.process.mode, opts.process.pymalloc)?;
        print_coverage(pid, &scan);
        let probed: BTreeSet<_> = objects.iter().map(|o| (o.dev.0, o.dev.1, o.inode)).collect();
        // A running process's runtime is known before its probes, and `--heap-census` starts
        // there: on Node the inspector opened, sampling started and, with --heap-snapshots, the
        // first heap snapshot taken before the malloc probes fire on every call V8 makes while
        // building it (10-20 times slower under them: docs/benchmarks.md, "What holds it").
        let runtime_opts = crate::runtimes::RuntimeOptions {
            pymalloc: opts.process.pymalloc,
            python_frames: opts.process.python_frames,
            jvm_perf_map: opts.process.jvm_perf_map,
        };
        let runtime = if launched { None } else { crate::runtimes::detect(pid, &objects, runtime_opts) };
        let mut census = crate::holds::HeapCensus::new(opts.process.heap_census).with_dump(opts.heap_dump);
        census.attach(pid, runtime.as_deref());
        let (probes, notes) = match attach_probes(tracer, pid, &objects, scan, launched, opts) {
            Ok(x) => x,
            Err(e) => {
                // What the census opened in the target (its inspector) is closed again.
                census.finish(false, &|| 0.0, None);
                return Err(e);
            }
        };
        let mut t = Traced {
            pid,
            launched,
            in_launched_tree: launched,
            command,
            exe,
            nspid: procinfo::nspid(pid),
            symbolizer: StackSymbolizer::new(pid),
            stacks: Vec::new(),
            stack_index: HashMap::new(),
            native_stacks: HashMap::new(),
            checkpoints: Vec::new(),
            warnings: notes,
            exit_status: None,
            space: AddressSpace::default(),
            work_attached: probes.iter().any(|p| p.kind == ProbeKind::Work),
            runtime: None,
            runtime_opts,
            census,
            glibc_stats: crate::reach::arena_stats::GlibcArenaStats::new(pid),
            probes,
            probed,
            exe_resolved: !launched,
            last_samples: HashMap::new(),
            reach_scans: Vec::new(),
            reach_at_exit: None,
            py_heap: Default::default(),
            execs: Vec::new(),
            launch_exec_pending: launched,
            exe_id: if launched { None } else { exe_identity(pid) },
            oom_watch: None,
            oom_victims_watched: tracer.oom_victims_unavailable.is_none() && tracer.mappings_unavailable.is_none(),
            ended: None,
            cgroup_seen: None,
            memory_limit: None,
            teardown_probes: BTreeSet::new(),
            session: Default::default(),
            block_regions: Vec::new(),
            block_scan: None,
            born_zero_ms: None,
            live_seen: None,
            leader_exited: None,
            sites_before: None,
            allocator_sites_ignored: opts.process.mode == Mode::Growth,
        };
        t.watch_cgroup();
        if !launched {
            t.set_runtime(runtime);
            t.sync_runtime(tracer, &objects);
        }
        t.place_teardown_probes(tracer, &objects);
        Ok(t)
    }

    /// Whether the process has ended; when it has, [`Traced::ended`] says how (exit status in
    /// launch mode, the cgroup's OOM-kill counter where there is one).
    pub(super) fn gone(&mut self) -> bool {
        let status = if self.launched {
            match launch::try_wait(self.pid) {
                Some(s) => Some(s),
                None => return false,
            }
        } else if let Some(task) = procinfo::live_task(self.pid) {
            self.live_seen = Some((std::time::Instant::now(), task));
            if task != self.pid {
                self.note_leader_exited(task);
            }
            return false;
        } else {
            None
        };
        self.exit_status = status.or(self.exit_status);
        let oom = self.oom_watch.as_ref().and_then(|w| Some((w.events.as_path(), w.baseline, oom_kills(&w.events)?)));
        let ended = ending(status, self.oom_victims_watched, self.session.oom_victim_anon_kib, oom);
        // A plain exit is no caveat; a kill (signal, OOM killer) is one for the last figures.
        if matches!(status, Some(ExitStatus::Signal(_))) || ended.contains("OOM killer") {
            self.warnings.push(format!("the process ended during the recording: {ended}"));
        }
        self.ended = Some(ended);
        true
    }

    /// The main thread has exited and thread `task` runs: warned once it has been so for
    /// [`LEADER_EXIT_CONFIRM`] (a whole process ending normally passes through this state for
    /// a moment, its leader a zombie before its other threads are).
    fn note_leader_exited(&mut self, task: u32) {
        let (since, warned) = *self.leader_exited.get_or_insert((std::time::Instant::now(), false));
        if !warned && since.elapsed() >= LEADER_EXIT_CONFIRM {
            self.leader_exited = Some((since, true));
            self.warnings.push(leader_exited_warning(self.pid, task));
        }
    }

    /// Follow the cgroup the process is in (it may move, e.g. a launched command put in its
    /// cgroup by a wrapper): the OOM-kill counter's baseline is taken when it is first seen there.
    /// Read through a live task of the process, and kept only when that task had not begun to
    /// exit by the end of the reads: an exiting task, a zombie and a main thread that exited
    /// before the others read as in the root cgroups ("N:memory:/" on cgroup v1), which would
    /// lose the limit and move the baseline to the root's counter, where no kill of the
    /// process's own cgroup is counted.
    pub(super) fn watch_cgroup(&mut self) {
        let Some(task) = procinfo::live_task(self.pid) else { return };
        // Resolved again only when /proc/TID/cgroup changed (mountinfo can be long).
        let Ok(now) = std::fs::read_to_string(format!("/proc/{}/task/{task}/cgroup", self.pid)) else { return };
        if self.cgroup_seen.as_deref() == Some(now.as_str()) {
            return;
        }
        let events = memory_events_of(task);
        if !procinfo::thread_not_exiting(self.pid, task) {
            return;
        }
        self.cgroup_seen = Some(now);
        let Some(events) = events else { return };
        self.memory_limit = memory_limit_of(&events);
        if self.oom_watch.as_ref().is_some_and(|w| w.events == events) {
            return;
        }
        if let Some(baseline) = oom_kills(&events) {
            self.oom_watch = Some(OomWatch { events, baseline });
        }
    }

    /// The process exec'd (seen at `t_s`): note where the image changed, re-read its
    /// executable and command line, and re-discover its objects at once (allocators of the new
    /// image probed, unwind tables loaded; objects already probed keep their probes, which the
    /// kernel re-arms in the new image as they are filtered by process). Stacks recorded before
    /// were symbolized against the old image and stay as they are.
    pub(super) fn on_exec(&mut self, tracer: &mut Tracer, process: &ProcessOptions, t_s: f64) {
        if std::mem::take(&mut self.launch_exec_pending) {
            self.exe_id = exe_identity(self.pid);
            return;
        }
        let to = procinfo::exe(self.pid);
        let command = procinfo::cmdline(self.pid);
        let change = leaktrace_analysis::recording::ExecChange {
            t_s,
            from: self.exe.clone(),
            to: to.clone(),
            command: command.clone(),
        };
        crate::note!(
            "leaktrace: PID {} exec'd {} at t={t_s:.1}s (was {}): re-discovering its objects",
            self.pid,
            if to.is_empty() { "?" } else { &to },
            self.exe
        );
        self.warnings.push(format!(
            "at t={t_s:.1}s the process exec'd `{}` (was `{}`): sites before and after belong to different images; blocks of the old image still live at the exec went away with it but stay counted live in its sites",
            command.join(" "),
            self.exe
        ));
        self.execs.push(change);
        if !to.is_empty() {
            self.exe = to;
            self.exe_resolved = true;
        }
        if !command.is_empty() {
            self.command = command;
        }
        self.exe_id = exe_identity(self.pid);
        // A new program: its runtime is detected anew.
        self.detach_runtime(tracer);
        self.symbolizer.refresh();
        // The new image may be held at its exec, its libraries not loaded yet: those the loader
        // will load are probed now too.
        let Ok(objects) = super::targets::exec_objects(self.pid) else { return };
        self.rescan_objects(objects, tracer, process, t_s);
    }

    /// Probe allocators the target mapped since attach (e.g. loaded with dlopen), place the
    /// work probe if its object was not mapped before, and detect the runtime.
    pub(super) fn rescan(&mut self, tracer: &mut Tracer, process: &ProcessOptions, t_s: f64) {
        let Ok(objects) = discover::mapped_objects(self.pid) else { return };
        self.rescan_objects(objects, tracer, process, t_s);
    }

    /// [`Traced::rescan`] over `objects`.
    fn rescan_objects(&mut self, objects: Vec<MappedObject>, tracer: &mut Tracer, process: &ProcessOptions, t_s: f64) {
        if self.nspid.is_empty() {
            self.nspid = procinfo::nspid(self.pid);
        }
        if self.launched {
            // Launched commands: the executable as the running process sees it (/proc/PID/exe),
            // followed through an exec chain (env → python3).
            let exe = procinfo::exe(self.pid);
            if !exe.is_empty() {
                // The command line only when the program changed (an exec chain): a process
                // that is exiting reads back a cut /proc/PID/cmdline while its memory is being
                // unmapped (seen in CI right after a teardown checkpoint).
                if exe != self.exe {
                    let argv = procinfo::cmdline(self.pid);
                    if !argv.is_empty() {
                        self.command = argv;
                    }
                }
                self.exe = exe;
                self.exe_resolved = true;
            }
        }
        let (mode, pymalloc) = (process.mode, process.pymalloc);
        self.detect_runtime(tracer, &objects, pymalloc);
        if let (Some(spec), false) = (process.work_probe.as_ref(), self.work_attached)
            && let Some((obj, off)) = discover::find_work_function(spec, &objects)
        {
            self.work_attached = true;
            match tracer.attach_work_probe(self.pid, &obj.path.display().to_string(), &obj.open_path, off) {
                Ok(mut info) => {
                    info.function = spec.symbol.clone();
                    self.warnings
                        .push(format!("work probe {spec} placed at t={t_s:.1}s (its object was mapped after attach)"));
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
        for note in unwind_notes(tracer, &fresh) {
            self.warnings.push(format!("{note} (mapped after attach, at t={t_s:.1}s)"));
        }
        self.place_teardown_probes(tracer, &fresh);
        let Ok(scan) = scan_for_mode(self.pid, &fresh, mode, pymalloc) else { return };
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

    /// Launched commands (and their followed children, `in_launched_tree`): probe the start of their teardown (libc's `exit`, CPython's
    /// `Py_FinalizeEx`) in `objects` and watch it, so a checkpoint is taken before static
    /// destructors, atexit handlers or interpreter finalization free anything. Failures become
    /// warnings (the recording then ends on the checkpoint after exit, as before).
    pub(super) fn place_teardown_probes(&mut self, tracer: &mut Tracer, objects: &[MappedObject]) {
        if !self.in_launched_tree {
            return;
        }
        for (obj, function, off) in discover::find_teardown_functions(objects) {
            let object = obj.path.display().to_string();
            if !self.teardown_probes.insert((object.clone(), function)) {
                continue;
            }
            match tracer.attach_teardown_probe(self.pid, &object, &obj.open_path, function, off) {
                Ok(info) => self.probes.push(info),
                Err(e) => self.warnings.push(format!("teardown not watched: {e:#}")),
            }
        }
        if !self.session.teardown_watched && self.probes.iter().any(|p| p.kind == ProbeKind::Teardown) {
            match tracer.watch_teardown(self.pid, true) {
                Ok(()) => self.session.teardown_watched = true,
                Err(e) => self.warnings.push(format!("teardown not watched: {e:#}")),
            }
        }
    }

    /// Read the kernel maps and /proc once for this process; add a checkpoint. Errors become
    /// warnings: a checkpoint that cannot be read is skipped, never the whole recording.
    pub(super) fn checkpoint(
        &mut self,
        tracer: &Tracer,
        t_s: f64,
        batch: Option<u32>,
        work: bool,
    ) -> Option<(u64, u64)> {
        let counters = match tracer.counters() {
            Ok(c) => c,
            Err(e) => {
                self.warnings.push(format!("checkpoint at {t_s:.1}s skipped: {e:#}"));
                return None;
            }
        };
        let sites = match tracer.read_sites(self.pid) {
            Ok(s) => self.since_start(s),
            Err(e) => {
                self.warnings.push(format!("checkpoint at {t_s:.1}s skipped: {e:#}"));
                return None;
            }
        };
        // Birth times on the recording's clock: ms since the checkpoint at t_s = 0.
        let zero = *self.born_zero_ms.get_or_insert_with(|| tracer.now_ms() as i64 - (t_s * 1000.0).round() as i64);
        // Everything that moves is read together, before the slow part (symbolizing new stacks).
        let units_of_work = work.then(|| tracer.work_units(self.pid));
        let (mm, memory) = self.memory_now();
        // Kernel-side sites (malloc family, page faults), then off-heap mappings with their
        // resident bytes.
        // The allocator's regions in the address space, whenever they were made: the brk heap
        // and glibc's arena heaps (the latter are left out of the allocator's tracked mappings,
        // which would count an arena made after attach twice).
        let maps = std::fs::read_to_string(format!("/proc/{mm}/maps")).unwrap_or_default();
        // The symbolizer learns new objects from this read (the poll does not read maps for it):
        // before the new stacks of this checkpoint are symbolized.
        self.symbolizer.refresh_from(mm, &maps);
        // glibc's arena heaps only where glibc's malloc is the one in use: another allocator's
        // 64 MiB-aligned reservations (mimalloc's) have the same shape, and so have the Go heap's
        // arenas: not looked for in a Go program with no probe placed (without cgo, no malloc).
        let other_malloc = self.other_malloc();
        let go_without_malloc = self.probes.is_empty()
            && self.runtime.as_ref().is_some_and(|r| r.info().name == leaktrace_analysis::recording::Runtime::Go);
        let arenas = if other_malloc || go_without_malloc { Vec::new() } else { mappings::glibc_arena_heaps(&maps) };
        // Other allocators' mappings (jemalloc, mimalloc, tcmalloc's mmaps), made before attach
        // or after: the anonymous mappings where its blocks began since attach.
        let blocks = if other_malloc { self.scan_blocks(tracer) } else { None };
        self.block_regions =
            mappings::block_regions(&maps, blocks.as_deref().unwrap_or(&[]), &self.block_regions, &arenas);
        let mut counted: Vec<(u64, u64)> = arenas.iter().chain(&self.block_regions).copied().collect();
        // With such an allocator and no managed runtime, the large anonymous mappings nothing
        // else claims are its too: memory it held before attach where no block began since.
        let unclaimed = if other_malloc && self.runtime.is_none() {
            let mut skip = counted.clone();
            skip.extend(self.space.ranges());
            mappings::unclaimed_regions(&maps, &skip)
        } else {
            Vec::new()
        };
        counted.extend(&unclaimed);
        let resident = self.space.resident(self.pid, &counted);
        let offheap: Vec<(SiteKey, leaktrace_common::SiteStats)> =
            self.space.offheap_sites().map(|(k, v)| (*k, *v)).collect();
        let all = sites.into_iter().map(|(k, v)| (k, v, None)).chain(offheap.into_iter().map(|(k, v)| {
            let res = resident.as_ref().map(|(per_site, _)| per_site.get(&k).copied().unwrap_or(0));
            (k, v, Some(res))
        }));
        let mut samples = Vec::new();
        for (key, stats, res) in all.collect::<Vec<_>>() {
            // Kernel sites carry their blocks' birth times (off-heap mappings do not: `res`).
            let born = |sum: u64, count: u64| sum as i64 - count as i64 * zero;
            let kernel = res.is_none();
            samples.push(SiteSample {
                stack: self.stack_for(tracer, key),
                alloc_bytes: stats.alloc_bytes,
                alloc_count: stats.alloc_count,
                free_bytes: stats.free_bytes,
                free_count: stats.free_count,
                resident_bytes: res.flatten(),
                alloc_born_ms: kernel.then(|| born(stats.alloc_born_ms, stats.alloc_count)),
                free_born_ms: kernel.then(|| born(stats.free_born_ms, stats.free_count)),
            });
        }
        samples.sort_by_key(|s| s.stack);
        // Kernel sites that are one recorded stack (a stack made during a Python import joins
        // its native twin, see `stack_for`): one sample, their sum.
        samples.dedup_by(|later, kept| {
            if later.stack != kept.stack {
                return false;
            }
            kept.add(later);
            true
        });
        let live: u64 = samples.iter().map(SiteSample::live_bytes).sum();
        // Sparse: only the sites whose totals changed since the previous checkpoint are kept (a
        // site absent from a checkpoint keeps its last totals), so memory grows with activity,
        // not with sites × checkpoints.
        samples.retain(|s| self.last_samples.get(&s.stack) != Some(s));
        // The checkpoint keeps this Vec: without this it would keep the capacity of every site
        // (16 K sites × 48 bytes per checkpoint, found by the long-run test).
        samples.shrink_to_fit();
        for s in &samples {
            self.last_samples.insert(s.stack, s.clone());
        }
        let allocator = resident.as_ref().map(|(_, mmap_resident)| {
            let mut f = AllocatorFootprint {
                mmap_bytes: self.space.allocator_mapped_bytes(),
                mmap_resident_bytes: *mmap_resident,
                ..Default::default()
            };
            let pagemap = std::fs::File::open(format!("/proc/{mm}/pagemap")).ok();
            let resident = |start: u64, end: u64| {
                pagemap.as_ref().and_then(|pm| mappings::resident_bytes(pm, start, end)).unwrap_or(0)
            };
            if let Some((start, end)) = heap_range(&maps) {
                f.heap_bytes = end - start;
                f.heap_resident_bytes = resident(start, end);
            }
            f.arena_heaps = arenas.len() as u32;
            f.arena_bytes = arenas.iter().map(|(s, e)| e - s).sum();
            f.arena_resident_bytes = arenas.iter().map(|&(s, e)| resident(s, e)).sum();
            // Off-heap regions merged into a block region are counted at their sites.
            let offheap = self.space.offheap_ranges();
            f.block_regions = self.block_regions.len() as u32;
            f.block_region_bytes = self.block_regions.iter().map(|(s, e)| e - s).sum();
            f.block_region_resident_bytes = self
                .block_regions
                .iter()
                .flat_map(|&(s, e)| mappings::outside(s, e, &offheap))
                .map(|(s, e)| resident(s, e))
                .sum();
            f.unclaimed_regions = unclaimed.len() as u32;
            f.unclaimed_region_bytes = unclaimed.iter().map(|(s, e)| e - s).sum();
            f.unclaimed_region_resident_bytes = unclaimed.iter().map(|&(s, e)| resident(s, e)).sum();
            f
        });
        let mut allocator = allocator;
        if let Some(f) = allocator.as_mut().filter(|_| !other_malloc) {
            self.glibc_figures(f);
        }
        let rss = memory.as_ref().map(|m| m.rss_bytes).unwrap_or(0);
        self.checkpoints.push(Checkpoint {
            t_s,
            memory,
            sites: samples,
            counters: counters.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>(),
            batch,
            managed: self.runtime.as_mut().and_then(|r| r.heap(tracer)),
            units_of_work,
            allocator,
            teardown: false,
        });
        thin(&mut self.checkpoints, MAX_CHECKPOINTS);
        Some((live, rss))
    }

    /// The task through which the process's memory is read, and its memory
    /// ([`procinfo::memory_through`]): through the task [`Traced::gone`] found alive in this
    /// poll (under [`LIVE_SEEN_FOR`] ago), else found now. A reading that fails through the
    /// task seen before (the main thread, or the thread, exited since) is taken again through
    /// the task found now.
    fn memory_now(&mut self) -> (u32, Option<leaktrace_analysis::recording::ProcMemory>) {
        let seen = self.live_seen.take().filter(|(at, _)| at.elapsed() < LIVE_SEEN_FOR).map(|(_, task)| task);
        if let Some(mm) = seen
            && let Some(m) = procinfo::memory_through(self.pid, mm)
        {
            return (mm, Some(m));
        }
        let mm = procinfo::mm_task(self.pid);
        (mm, procinfo::memory_through(self.pid, mm))
    }

    /// Whether a malloc other than the C library's is probed in this process (jemalloc,
    /// mimalloc, tcmalloc: allocators whose mappings have no shape of their own) and CPython's
    /// allocator is not (`--pymalloc`: its blocks lie in the runtime's arenas).
    fn other_malloc(&self) -> bool {
        self.probes
            .iter()
            .any(|p| p.function.ends_with("malloc") && !leaktrace_analysis::system_libs::is_libc(&p.object))
            && !self.probes.iter().any(|p| leaktrace_analysis::runtimes::python::is_pymalloc_probe(&p.function))
    }

    /// Pages where this process's blocks began since attach (sorted), read from the kernel's
    /// BLOCK_PAGES map for [`mappings::block_regions`]; None when not due or unreadable. Only
    /// for a process whose malloc is another allocator's ([`Traced::other_malloc`]): glibc's
    /// regions are the brk heap and its arena heaps, found by shape, its other mappings large
    /// chunks tracked since attach; CPython's allocator (`--pymalloc`) puts its blocks in the
    /// runtime's arenas. The read costs one system call per page noted, so it is made again only
    /// after 20 times its last duration (at most 10 s).
    fn scan_blocks(&mut self, tracer: &Tracer) -> Option<Vec<u64>> {
        let now = std::time::Instant::now();
        if let Some((at, cost)) = self.block_scan
            && now.duration_since(at) < (cost * 20).min(std::time::Duration::from_secs(10))
        {
            return None;
        }
        let pages = tracer.block_pages(self.pid).ok()?;
        self.block_scan = Some((now, now.elapsed()));
        Some(pages)
    }

    /// The recording's stack for a kernel site, symbolized the first time it is seen.
    pub(super) fn stack_for(&mut self, tracer: &Tracer, mut key: SiteKey) -> u32 {
        key.tgid = 0;
        if let Some(&id) = self.stack_index.get(&key) {
            return id;
        }
        let kernel = if key.stack != 0 { tracer.stack(key.stack) } else { None };
        let lost = kernel.is_none();
        let (kernel_ips, end) = kernel.unwrap_or_default();
        let ips = fix_caller(kernel_ips, key.caller);
        let mut frames: Vec<Arc<Frame>> = self.symbolizer.symbolize(&ips);
        if end == leaktrace_common::walk_end::BAD_FRAME {
            // The walk ended on an address no mapping holds (a frame pointer followed through
            // code without one): not a frame.
            while frames.len() > 1 && frames.last().is_some_and(|f| f.object.is_none() && f.function.is_none()) {
                frames.pop();
            }
        }
        let truncated = if lost { None } else { truncation(end, &frames) };
        // The runtime's frames (CPython's) in place of its interpreter's.
        let with_runtime = self.runtime_frames(tracer, key.stack, &mut frames);
        let twin = (!lost && !with_runtime).then(|| (key.kind, frames.iter().map(|f| f.addr).collect::<Vec<u64>>()));
        if let Some(&id) = twin.as_ref().and_then(|t| self.native_stacks.get(t)) {
            self.stack_index.insert(key, id);
            return id;
        }
        let id = self.stacks.len() as u32;
        if let Some(t) = twin {
            self.native_stacks.insert(t, id);
        }
        self.stacks.push(Stack {
            id,
            kind: match key.kind {
                site_kind::MMAP => StackKind::Mmap,
                site_kind::FAULT => StackKind::Fault,
                _ => StackKind::Malloc,
            },
            frames,
            lost,
            truncated,
            shared: key.kind == site_kind::MMAP && self.space.is_shared(&key),
        });
        self.stack_index.insert(key, id);
        id
    }
}

/// Probe the allocator of `pid` (the points of `scan`), place the work probe and start tracking
/// its mappings: the probes and the notes for the recording.
fn attach_probes(
    tracer: &mut Tracer,
    pid: u32,
    objects: &[MappedObject],
    scan: discover::AllocatorScan,
    launched: bool,
    opts: &RecordOptions,
) -> anyhow::Result<(Vec<ProbeInfo>, Vec<String>)> {
    // Unwind tables before the probes, so the first calls are walked in full.
    let mut notes = unwind_notes(tracer, objects);
    let mut probes = tracer.attach(pid, &scan.points)?;
    notes.extend(scan.notes);
    if let Some(spec) = &opts.process.work_probe {
        match discover::find_work_function(spec, objects) {
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
        Some(why) if opts.process.mode == Mode::Growth => {
            anyhow::bail!("growth mode needs the syscall tracepoints: {why}")
        }
        Some(why) => notes.push(format!("anonymous mappings (off-heap memory) not traced: {why}")),
    }
    if let Some(why) = &tracer.oom_victims_unavailable {
        notes.push(format!(
            "OOM-killer victims not seen (oom:mark_victim): {why}; an OOM kill is told from the memory cgroup's oom_kill counter"
        ));
    }
    if crate::target_fs::map_files_denied() {
        notes.push(crate::target_fs::MAP_FILES_NOTE.into());
    }
    notes.push(format!("{} mode cannot see: {}", opts.process.mode, crate::probes::blind_spots(opts.process.mode)));
    Ok((probes, notes))
}

/// Load the unwind tables of the code among `objects` (those not loaded yet; files mapped only
/// as data, such as locale archives or a JVM's hsperfdata, hold no frame and are left out); one
/// note per object that has none, since frames in it are walked by frame pointers only.
fn unwind_notes(tracer: &mut Tracer, objects: &[MappedObject]) -> Vec<String> {
    if let Some(why) = tracer.unwind_disabled() {
        return vec![format!("stacks are walked by frame pointers only (no unwind tables: {why})")];
    }
    let objects: Vec<MappedObject> = objects.iter().filter(|o| o.executable).cloned().collect();
    let objects = objects.as_slice();
    let outcomes = tracer.load_unwind_tables(objects);
    objects
        .iter()
        .zip(outcomes)
        .filter_map(|(o, r)| match r {
            crate::probes::UnwindOutcome::Missing(why) => Some(format!(
                "no unwind table for {} ({why}): stacks through it continue only where it keeps frame pointers",
                o.path.display()
            )),
            crate::probes::UnwindOutcome::Loaded { .. } => None,
        })
        .collect()
}

/// Why a walk that ended with `end` (`leaktrace_common::walk_end`) is truncated, naming where,
/// from the symbolized `frames`; None for a complete walk.
fn truncation(end: u32, frames: &[Arc<Frame>]) -> Option<String> {
    use leaktrace_common::walk_end;
    let last = frames.iter().rev().find(|f| !f.inlined).or(frames.last());
    let at = || last.map(|f| crate::symbolize::frame_location(f)).unwrap_or_else(|| "the first frame".into());
    let after = || match last.and_then(|f| f.function.as_deref()) {
        Some(func) => format!("{func} ({})", at()),
        None => at(),
    };
    match end {
        walk_end::COMPLETE => None,
        walk_end::DEPTH => Some(format!("depth limit ({} frames)", leaktrace_common::MAX_STACK_DEPTH)),
        walk_end::NO_UNWIND_INFO => Some(format!("no unwind info for {} (and no frame pointer)", after())),
        walk_end::READ_FAULT => Some(format!("stack unreadable after {}", after())),
        walk_end::VMA_BUSY => {
            Some(format!("address space busy after {} (its mapping could not be looked up)", after()))
        }
        _ => Some(format!("implausible frame after {}", after())),
    }
}

/// The allocator entry points to probe in `objects` for `mode`: growth mode puts no probe on
/// the allocator's hot path, only on mmap (for the stacks of mappings).
pub(super) fn scan_for_mode(
    pid: u32,
    objects: &[MappedObject],
    mode: Mode,
    pymalloc: bool,
) -> Result<discover::AllocatorScan, discover::TargetError> {
    let mut scan = discover::scan_allocators(pid, objects, pymalloc)?;
    if mode == Mode::Growth {
        scan.points.retain(|p| *p.hook.entry_program == leaktrace_common::program::MMAP_ENTER);
    }
    Ok(scan)
}

/// Print the coverage table: per object, which allocator family and functions are probed where.
pub(super) fn print_coverage(pid: u32, scan: &discover::AllocatorScan) {
    let mut by_object: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &scan.points {
        let at = if p.probe_offset != p.offset {
            format!("{}+{}", p.function, p.probe_offset - p.offset)
        } else {
            p.function.clone()
        };
        by_object.entry(p.object.path.display().to_string()).or_default().push(at);
    }
    for (object, functions) in by_object {
        let fams: Vec<String> = scan
            .families
            .iter()
            .filter(|f| f.object.display().to_string() == object)
            .map(|f| f.family.to_string())
            .collect();
        crate::note!("leaktrace: PID {pid}: {object} [{}]: {}", fams.join(", "), functions.join(" "));
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
        let keep = i == 0 || i == last || c.batch.is_some() || c.teardown || {
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

/// The brk heap ([heap] in `maps`, the text of /proc/PID/maps), as (start, end).
pub(super) fn heap_range(maps: &str) -> Option<(u64, u64)> {
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

/// How long the main thread must be seen exited while other threads run before the report
/// warns about it ([`leader_exited_warning`]).
const LEADER_EXIT_CONFIRM: std::time::Duration = std::time::Duration::from_secs(1);

/// The report's warning for a process whose main thread (`pid`) exited while thread `tid` and
/// others run: the kernel matches a uprobe link's process filter against the exited leader's
/// address space, which it no longer has, so the breakpoints go as soon as any tracer removes a
/// uprobe from a library the process maps (docs/reliability.md).
fn leader_exited_warning(pid: u32, tid: u32) -> String {
    format!(
        "the main thread of PID {pid} exited while its other threads run (its memory is read \
         through thread {tid}): the kernel keeps this process's uprobes only until any tracer \
         removes one from a library it maps, and no counter sees calls missed after that; \
         compare the allocation counts with the work done (docs/reliability.md)"
    )
}

#[cfg(test)]
mod tests {
    use super::fix_caller;

    #[test]
    fn thinning_keeps_sparse_totals_and_batches() {
        use leaktrace_analysis::recording::{Checkpoint, SiteSample};
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
