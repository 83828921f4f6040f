//! Loading leaktrace's eBPF object, attaching its uprobes to a target, and reading its maps.
//!
//! The object is built from `leaktrace-ebpf` by build.rs and embedded in the binary. Every probe
//! is attached with a PID filter (the kernel installs breakpoints in that process only) and is
//! tied to the agent's file descriptors: if the agent dies, the kernel removes every probe.
//!
//! Two ways to attach, chosen once at load ([`Tracer::attach_mode`]): uprobe_multi links (Linux
//! 6.6+; one link per process, file and program, holding every offset of that program in that
//! file: see `uprobe_multi`), or, where the kernel has none or `LEAKTRACE_SINGLE_UPROBES=1`, one
//! aya perf-event uprobe per offset. The programs are loaded for the one chosen (the kernel does
//! not let a program loaded for uprobe_multi be attached as a perf event, nor the reverse).

use std::collections::HashMap as StdHashMap;

use anyhow::Context as _;
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::{
    Program, TracePoint, UProbe,
    trace_point::TracePointLinkId,
    uprobe::{UProbeLinkId, UProbeScope},
};
use aya::{Ebpf, EbpfLoader};
use leaktrace_common::counter::Counter;
use leaktrace_common::{MapEvent, ObjectId, ObjectTable, SiteKey, SiteStats, StackFrames, UnwindRow, program};

use crate::discover::ProbePoint;
use leaktrace_analysis::recording::{ProbeInfo, ProbeKind};

mod attach;
pub use attach::ProcessMark;
mod load;

use load::{
    JiffyClock, attach_tracepoint, attach_tracepoints, close_after_exit, fill_sampling, load_programs,
    monotonic_now_ns, raise_memlock, write_rows,
};

/// Buckets of the kernel's fast block table `BLOCKS` for `max_allocs` (--max-allocs): one per
/// 16 blocks (so a quarter of them fit in its 4-slot buckets before the fuller ones overflow to
/// `ALLOCS`), a power of two, at least 1024; 136 bytes each (8.5 MiB at the default 1 M).
pub fn block_buckets(max_allocs: u32) -> u32 {
    (max_allocs / 16).max(1024).next_power_of_two()
}

/// Sizes of the kernel maps. A full map loses data; the loss is counted and reported.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Maximum outstanding allocations tracked at once (entries of ALLOCS, the overflow of the
    /// fast table BLOCKS, which holds up to a quarter as many; see [`block_buckets`]).
    pub max_allocs: u32,
    /// Maximum distinct call-stack sites (entries of SITES).
    pub max_sites: u32,
    /// Maximum distinct call stacks (entries of STACKS, ~1 KiB each), half of which at most may
    /// carry Python frames (PY_STACKS, ~0.5 KiB each); allocated as stacks are found.
    pub max_stacks: u32,
    /// Unwind-table rows over all objects (entries of UNWIND_ROWS, 8 bytes each, allocated at
    /// load time).
    pub max_unwind_rows: u32,
    /// Not a size: log why stack walks stop early, from the kernel side (aya-log, debug level).
    /// Off, the log statements are dead code the verifier removes.
    pub debug_unwind: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_allocs: 1 << 20,
            max_sites: 1 << 16,
            max_stacks: 1 << 14,
            max_unwind_rows: 1 << 21,
            debug_unwind: false,
        }
    }
}

/// What the kernel side traces: the recording's [`Mode`] (the one mode enum of the CLI, the agent
/// and recording.json); the sampled mode's mean distance is [`RecordOptions`]'s `sample_bytes`.
///
/// [`RecordOptions`]: crate::record::RecordOptions
pub use leaktrace_analysis::recording::Mode;

/// Mean sampling distance of sampled mode when none is given (`--mode sampled` without
/// `--sample-bytes`), bytes: as tcmalloc, 512 KiB.
pub const DEFAULT_SAMPLE_BYTES: u64 = 512 * 1024;

/// What `mode` cannot see, for the report's caveats.
pub fn blind_spots(mode: Mode) -> &'static str {
    match mode {
        Mode::Exact => "allocators other than the hooked malloc family; memory mapped before attach",
        Mode::Sampled => {
            "individual small allocations (figures are estimates from sampled allocations, unbiased on \
             average, noisier for sites that allocate little); memory mapped before attach"
        }
        Mode::Growth => {
            "malloc/free themselves: it sees pages made resident (first touch) by call stack, not live \
             allocations; memory reused from the allocator's free lists does not show; nothing is ever \
             credited back when memory is freed"
        }
    }
}

/// Errors that stop leaktrace before anything is traced.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("leaktrace must run as root (it loads eBPF programs and places uprobes); try: sudo leaktrace ...")]
    NotRoot,
    #[error(
        "this kernel has no uprobe support (/sys/bus/event_source/devices/uprobe is missing): CONFIG_UPROBE_EVENTS is needed"
    )]
    NoUprobes,
    #[error(
        "this kernel refused to load leaktrace's eBPF programs (CONFIG_BPF_SYSCALL, BTF and uprobes are needed): {0:#}"
    )]
    Load(anyhow::Error),
}

/// Each process's sites (`SITES`' keys with that tgid) and their index in `SITE_STATS`.
type SitesByProcess = StdHashMap<u32, Vec<(SiteKey, u32)>>;

/// The loaded eBPF object and the maps the agent reads.
pub struct Tracer {
    ebpf: Ebpf,
    /// Sites → their index in `site_stats`.
    sites: HashMap<MapData, SiteKey, u32>,
    /// Per-site totals by site index.
    site_stats: aya::maps::Array<MapData, SiteStats>,
    /// Site indices of released processes, given back to the kernel side once safe.
    recycler: crate::site_recycle::SiteRecycler,
    /// `sites` read once for a round of checkpoints ([`Tracer::begin_round`]): each process's
    /// sites and their index. None outside a round (then [`Tracer::read_sites`] reads the map).
    sites_round: std::sync::Mutex<Option<SitesByProcess>>,
    /// `site_stats` from index 0 to the largest in `sites_round`, read in one call for the
    /// round (None: read entry by entry).
    stats_round: std::sync::Mutex<Option<Vec<SiteStats>>>,
    /// [`Tracer::counters`] read once for the round, likewise.
    counters_round: std::sync::Mutex<Option<StdHashMap<&'static str, u64>>>,
    stacks: HashMap<MapData, u64, StackFrames>,
    /// Interpreter frames of the stacks that have any (same keys as `stacks`).
    py_stacks: HashMap<MapData, u64, leaktrace_common::PyStack>,
    /// Traced CPython processes: tgid → where their frames are.
    py_targets: HashMap<MapData, u32, leaktrace_common::PyTarget>,
    /// Whether the kernel side knows `task_struct.thread.fsbase` (BTF): Python threads are then
    /// told apart by their TLS base, else by `native_thread_id` (3.11+) or not at all.
    python_threads_by_fsbase: bool,
    /// Whether `py_targets` has any entry (index 0: 1 or 0; the kernel skips the lookup if not).
    py_any: aya::maps::Array<MapData, u64>,
    /// The processes in `py_targets`.
    py_tgids: std::collections::HashSet<u32>,
    /// Stacks with Python frames stored so far (against the budget of --max-stacks).
    py_stack_count: aya::maps::Array<MapData, u64>,
    /// That budget.
    py_stack_budget: u64,
    counters: PerCpuArray<MapData, u64>,
    /// Traced processes and the mode of each (`TARGETS`).
    targets: HashMap<MapData, u32, leaktrace_common::TargetMode>,
    /// `MODE_GEN`: bumped after each change of `targets` (the threads' cached modes go stale).
    mode_gen: aya::maps::Array<MapData, u64>,
    /// The mode a process is given when it is added ([`Tracer::add_target`]): the mode loaded for.
    default_mode: leaktrace_common::TargetMode,
    /// Whether the sampling tables are filled (at the first process in sampled mode).
    sampling_filled: bool,
    /// Whether the page-fault program is loaded (growth mode's; loaded with a tracer for growth).
    growth_loaded: bool,
    work: HashMap<MapData, u32, u64>,
    /// Full collections of Node processes' main isolates (`GC_FULL`, see [`Tracer::watch_gc`]).
    gc_full: HashMap<MapData, u32, leaktrace_common::GcFull>,
    /// Launched commands whose teardown is watched (see [`Tracer::watch_teardown`]).
    teardown: HashMap<MapData, u32, u32>,
    /// Launched processes whose execs stop until probed (see [`Tracer::hold_execs`]).
    exec_hold: HashMap<MapData, u32, u32>,
    /// Traced processes whose new children stop at their fork's return (`FORK_HOLD`).
    fork_hold: HashMap<MapData, u32, u32>,
    events: RingBuf<MapData>,
    /// Why mapping events are not traced (tracefs missing, tracepoints refused), if so.
    pub mappings_unavailable: Option<String>,
    /// Why OOM-killer victims are not seen (oom:mark_victim missing or refused), if so: then an
    /// OOM kill is known from the memory cgroup's `oom_kill` counter only.
    pub oom_victims_unavailable: Option<String>,
    /// CLOCK_MONOTONIC (the kernel side's `bpf_ktime_get_ns`) at load, ns: the
    /// zero of blocks' birth times.
    time_base_ns: u64,
    /// Probes attached so far, as (PID, object path as the target maps it, offset, program).
    attached: std::collections::HashSet<(u32, String, u64, &'static str)>,
    /// Every uprobe link with the process it serves, to detach a process's when it is no
    /// longer traced ([`Tracer::remove_target`]) and the rest at once at the end (see
    /// [`Tracer::shutdown`]).
    links: Vec<(u32, Link)>,
    /// The tracepoint links, detached with the uprobes (each waits for RCU grace periods too).
    tp_links: Vec<(&'static str, TracePointLinkId)>,
    /// Why uprobe_multi links are not used (then every probe is a perf-event uprobe), if so.
    single_why: Option<String>,
    /// Unwind tables loaded so far, shared by every target that maps the same file.
    unwind: UnwindTables,
    /// The kernel side's log (--debug-unwind), printed at each poll.
    log: Option<aya_log::EbpfLogger<StderrLog>>,
}

/// One attachment: a uprobe_multi link (its descriptor: closing it removes every offset), or one
/// aya perf-event uprobe of `program`.
enum Link {
    Multi(std::os::fd::OwnedFd),
    Single(&'static str, UProbeLinkId),
}

/// How probes are attached, for the log and the recording: see [`Tracer::attach_mode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// uprobe_multi links: one per (process, file, program).
    Multi,
    /// One perf-event uprobe per (process, offset, program), and why not links.
    Single(String),
}

/// Prints the kernel side's log records on stderr, one `leaktrace: kernel: ...` line each.
pub struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        crate::note!("leaktrace: kernel: {}", record.args());
    }
    fn flush(&self) {}
}

/// The unwind tables in the kernel maps (see `unwind` and leaktrace-ebpf's unwind.rs).
struct UnwindTables {
    objects: HashMap<MapData, ObjectId, ObjectTable>,
    /// `UNWIND_ROWS` (an array of `UnwindRow`), written in batches (see [`write_rows`]).
    rows: aya::maps::Map,
    generation: aya::maps::Array<MapData, u64>,
    /// Rows used so far (the next object's rows go here) and the map's size.
    next_row: u32,
    capacity: u32,
    /// Every object looked at, by identity: its outcome (shared between targets).
    done: StdHashMap<ObjectId, UnwindOutcome>,
    /// Why tables are off altogether (no BTF offsets), if so.
    disabled: Option<String>,
}

/// What became of one object's unwind table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnwindOutcome {
    /// Loaded: rows, and the section they came from.
    Loaded { rows: u32, section: &'static str },
    /// Not loaded (no CFI, unreadable, did not fit): frames in it are walked by frame pointers.
    Missing(String),
}

/// The eBPF object (leaktrace-ebpf, built by build.rs), embedded.
const OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/leaktrace"));

/// The uprobe programs (entry and return), loaded in every mode.
fn uprobe_programs() -> impl Iterator<Item = &'static program::Program> {
    program::ALL.iter().filter(|p| p.is_uprobe())
}

/// The tracepoint programs of `growth` mode or not, in the order they are attached.
fn tracepoint_programs(growth: bool) -> impl Iterator<Item = (&'static str, &'static str)> {
    program::ALL.iter().filter(move |p| growth || !p.growth_only).filter_map(|p| match p.kind {
        // oom:mark_victim is attached on its own (optional: see `Tracer::oom_victims_unavailable`).
        program::Kind::Tracepoint { group } if *p != program::OOM_MARK_VICTIM => Some((group, p.name)),
        _ => None,
    })
}

/// The kernel side's [`leaktrace_common::TargetMode`] for `mode` (`sample_bytes`: sampled
/// mode's mean, [`DEFAULT_SAMPLE_BYTES`] when None; ignored otherwise).
fn target_mode(mode: Mode, sample_bytes: Option<u64>) -> anyhow::Result<leaktrace_common::TargetMode> {
    use leaktrace_common::target_mode::{EXACT, GROWTH, SAMPLED};
    let (mode, sample_mean) = match mode {
        Mode::Exact => (EXACT, 0),
        Mode::Growth => (GROWTH, 0),
        Mode::Sampled => {
            let mean = sample_bytes.unwrap_or(DEFAULT_SAMPLE_BYTES);
            anyhow::ensure!(mean > 0, "--sample-bytes must be greater than zero");
            (SAMPLED, mean)
        }
    };
    Ok(leaktrace_common::TargetMode { mode, _pad: 0, sample_mean })
}

/// eBPF objects this process has loaded ([`Tracer::load`]): one per session, whatever modes its
/// processes go through (said in the log's "programs loaded" line, which the tests count).
static LOADS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Count one more load ([`LOADS`]) and log it with the time it took since `started`.
fn log_loaded(started: std::time::Instant) {
    let n = LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    log::info!("programs loaded in {:.3} s (eBPF object {n} of this process)", started.elapsed().as_secs_f64());
}

/// Check what tracing needs before anything else is looked at: root, and uprobe support.
pub fn check_privileges() -> Result<(), LoadError> {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LoadError::NotRoot);
    }
    if !std::path::Path::new("/sys/bus/event_source/devices/uprobe").exists() {
        return Err(LoadError::NoUprobes);
    }
    Ok(())
}

/// How many of `max_stacks` stacks may carry Python frames: half (at least 1).
fn py_stack_budget(max_stacks: u32) -> u32 {
    (max_stacks / 2).max(1)
}

impl Tracer {
    /// Load the embedded eBPF object with the given map sizes; the agent's own PID is excluded.
    /// Sampled mode samples one allocation per `sample_bytes` bytes on average
    /// ([`DEFAULT_SAMPLE_BYTES`] when None); the other modes ignore it.
    pub fn load(limits: Limits, mode: Mode, sample_bytes: Option<u64>) -> Result<Tracer, LoadError> {
        check_privileges()?;
        raise_memlock();
        let agent_tgid: u32 = std::process::id();
        // The clock blocks' birth times count from (AllocInfo::born_ms).
        let time_base_ns = monotonic_now_ns();
        let jiffies =
            std::fs::read_to_string("/proc/timer_list").ok().and_then(|t| JiffyClock::parse(&t, time_base_ns));
        // Field offsets for the walk's VMA → file lookup; without them, frame pointers only.
        let offsets = crate::btf::kernel_offsets();
        // task_struct.thread.fsbase, for the Python frames of a thread that does not hold the GIL
        // (leaktrace-ebpf/src/python.rs); 0: thread states are told apart by native_thread_id.
        let task_fsbase = crate::btf::task_fsbase_offset().unwrap_or_else(|e| {
            log::info!("Python threads told apart by native_thread_id: {e:#}");
            0
        });
        // Tracepoint record layouts from the kernel's format files (tracepoints.rs).
        let (tp_offsets, tp_note) = crate::tracepoints::offsets()
            .map_err(|e| LoadError::Load(e.context("reading the tracepoints' layouts")))?;
        if let Some(note) = tp_note {
            crate::note!("leaktrace: warning: {note}");
        }
        let mut loader = EbpfLoader::new();
        let mut ebpf = crate::site_recycle::size_site_maps(&mut loader, limits.max_sites)
            // INFLIGHT is a task-storage map, which aya 0.14 creates but has no
            // user-side type for (the agent never reads it).
            .allow_unsupported_maps()
            .override_global("AGENT_TGID", &agent_tgid, true)
            .override_global("TIME_BASE_NS", &time_base_ns, true)
            .override_global("JIFFIES_AT_BASE", &jiffies.map_or(0, |j| j.at_base), true)
            .override_global("MS_PER_JIFFY_Q16", &jiffies.map_or(0, |j| j.ms_q16), true)
            .override_global("BLOCKS_MASK", &(u64::from(block_buckets(limits.max_allocs)) - 1), true)
            .map_max_entries("BLOCKS", block_buckets(limits.max_allocs))
            .map_max_entries("ALLOCS", limits.max_allocs)
            // --max-stacks bounds all stacks; those with Python frames may take half of them
            // (PY_STACK_BUDGET in leaktrace-ebpf/src/python.rs), so native ones keep room.
            .map_max_entries("STACKS", limits.max_stacks)
            .map_max_entries("PY_STACKS", py_stack_budget(limits.max_stacks))
            .override_global("PY_STACK_BUDGET", &u64::from(py_stack_budget(limits.max_stacks)), true)
            .map_max_entries("UNWIND_ROWS", if offsets.is_ok() { limits.max_unwind_rows } else { 1 })
            .override_global(
                "KERNEL_OFFSETS",
                offsets.as_ref().unwrap_or(&[0; leaktrace_common::kernel_offset::NUM]),
                true,
            )
            .override_global("TP_OFFSETS", &tp_offsets, true)
            .override_global("TASK_FSBASE", &task_fsbase, true)
            .override_global(
                aya_log::LEVEL,
                &(if limits.debug_unwind { aya_log::Level::Debug as u8 } else { 0u8 }),
                true,
            )
            .load(OBJECT)
            .map_err(|e| LoadError::Load(e.into()))?;
        let single_why = crate::uprobe_multi::supported().err();
        let started = std::time::Instant::now();
        let mut load_errors = load_programs(&mut ebpf, single_why.is_none(), mode == Mode::Growth);
        for name in uprobe_programs().map(|p| p.name) {
            if let Some(e) = load_errors.remove(name) {
                let how = if single_why.is_none() {
                    " for uprobe_multi links (LEAKTRACE_SINGLE_UPROBES=1 loads them for single uprobes)"
                } else {
                    ""
                };
                return Err(LoadError::Load(e.context(format!("loading eBPF program {name}{how}"))));
            }
        }
        // Timing lines (RUST_LOG=leaktrace=info): `cargo xtask bench --attach-only` reads them.
        log_loaded(started);
        match &single_why {
            None => log::info!("probes attached with uprobe_multi links"),
            Some(why) => log::info!("probes attached one by one (perf-event uprobes): {why}"),
        }
        let take = |ebpf: &mut Ebpf, name: &str| {
            ebpf.take_map(name).with_context(|| format!("eBPF map {name} missing")).map_err(LoadError::Load)
        };
        let sites = HashMap::try_from(take(&mut ebpf, "SITES")?).map_err(|e| LoadError::Load(e.into()))?;
        let site_stats = Array::try_from(take(&mut ebpf, "SITE_STATS")?).map_err(|e| LoadError::Load(e.into()))?;
        let recycler = crate::site_recycle::SiteRecycler::new(&mut ebpf).map_err(LoadError::Load)?;
        let stacks = HashMap::try_from(take(&mut ebpf, "STACKS")?).map_err(|e| LoadError::Load(e.into()))?;
        let py_stacks = HashMap::try_from(take(&mut ebpf, "PY_STACKS")?).map_err(|e| LoadError::Load(e.into()))?;
        let py_targets = HashMap::try_from(take(&mut ebpf, "PY_TARGETS")?).map_err(|e| LoadError::Load(e.into()))?;
        let py_any = Array::try_from(take(&mut ebpf, "PY_ANY")?).map_err(|e| LoadError::Load(e.into()))?;
        let py_stack_count =
            Array::try_from(take(&mut ebpf, "PY_STACK_COUNT")?).map_err(|e| LoadError::Load(e.into()))?;
        let counters = PerCpuArray::try_from(take(&mut ebpf, "COUNTERS")?).map_err(|e| LoadError::Load(e.into()))?;
        let targets = HashMap::try_from(take(&mut ebpf, "TARGETS")?).map_err(|e| LoadError::Load(e.into()))?;
        let events = RingBuf::try_from(take(&mut ebpf, "EVENTS")?).map_err(|e| LoadError::Load(e.into()))?;
        let work = HashMap::try_from(take(&mut ebpf, "WORK")?).map_err(|e| LoadError::Load(e.into()))?;
        let gc_full = HashMap::try_from(take(&mut ebpf, "GC_FULL")?).map_err(|e| LoadError::Load(e.into()))?;
        let teardown = HashMap::try_from(take(&mut ebpf, "TEARDOWN")?).map_err(|e| LoadError::Load(e.into()))?;
        let exec_hold = HashMap::try_from(take(&mut ebpf, "EXEC_HOLD")?).map_err(|e| LoadError::Load(e.into()))?;
        let fork_hold = HashMap::try_from(take(&mut ebpf, "FORK_HOLD")?).map_err(|e| LoadError::Load(e.into()))?;
        let unwind = UnwindTables {
            objects: HashMap::try_from(take(&mut ebpf, "UNWIND_OBJECTS")?).map_err(|e| LoadError::Load(e.into()))?,
            rows: take(&mut ebpf, "UNWIND_ROWS")?,
            generation: Array::try_from(take(&mut ebpf, "UNWIND_GEN")?).map_err(|e| LoadError::Load(e.into()))?,
            next_row: 0,
            capacity: if offsets.is_ok() { limits.max_unwind_rows } else { 0 },
            done: StdHashMap::new(),
            disabled: offsets.err().map(|e| format!("{e:#}")),
        };
        let log = match limits.debug_unwind {
            true => Some(
                aya_log::EbpfLogger::init_with_logger(&mut ebpf, StderrLog).map_err(|e| LoadError::Load(e.into()))?,
            ),
            false => None,
        };
        let mut tp_links = Vec::new();
        let mappings_unavailable =
            attach_tracepoints(&mut ebpf, &mut load_errors, &mut tp_links).err().map(|e| format!("{e:#}"));
        let oom_victims_unavailable = match program::OOM_MARK_VICTIM.kind {
            program::Kind::Tracepoint { group } => {
                attach_tracepoint(&mut ebpf, &mut load_errors, &mut tp_links, group, program::OOM_MARK_VICTIM.name)
                    .err()
                    .map(|e| format!("{e:#}"))
            }
            _ => unreachable!("a tracepoint program"),
        };
        let default_mode = target_mode(mode, sample_bytes).map_err(LoadError::Load)?;
        load::prepare_mode(&mut ebpf, mode, &mut load_errors, &mut tp_links).map_err(LoadError::Load)?;
        let mode_gen = Array::try_from(take(&mut ebpf, "MODE_GEN")?).map_err(|e| LoadError::Load(e.into()))?;
        Ok(Tracer {
            ebpf,
            sites,
            site_stats,
            recycler,
            sites_round: std::sync::Mutex::new(None),
            stats_round: std::sync::Mutex::new(None),
            counters_round: std::sync::Mutex::new(None),
            stacks,
            py_stacks,
            py_targets,
            python_threads_by_fsbase: task_fsbase != 0,
            py_any,
            py_tgids: Default::default(),
            py_stack_count,
            py_stack_budget: u64::from(py_stack_budget(limits.max_stacks)),
            counters,
            targets,
            mode_gen,
            default_mode,
            sampling_filled: mode == Mode::Sampled,
            growth_loaded: mode == Mode::Growth,
            work,
            gc_full,
            teardown,
            exec_hold,
            fork_hold,
            events,
            mappings_unavailable,
            oom_victims_unavailable,
            attached: Default::default(),
            links: Vec::new(),
            tp_links,
            single_why,
            unwind,
            log,
            time_base_ns,
        })
    }

    /// Now on the clock of blocks' birth times (`AllocInfo::born_ms`, summed per site in
    /// `SiteStats::alloc_born_ms`): milliseconds of the monotonic clock since load.
    pub fn now_ms(&self) -> u64 {
        monotonic_now_ns().wrapping_sub(self.time_base_ns) / 1_000_000
    }

    /// How probes are attached: uprobe_multi links, or single uprobes and why.
    pub fn attach_mode(&self) -> AttachMode {
        match &self.single_why {
            None => AttachMode::Multi,
            Some(why) => AttachMode::Single(why.clone()),
        }
    }

    /// Detach every probe and unload the programs. Removing uprobes waits for RCU grace periods
    /// (~0.1–0.25 s here): once per uprobe_multi link, once per single uprobe. Done one after
    /// another that is seconds for tens of links, so the links are dropped from several threads
    /// at once and the waits of uprobe_multi links overlap.
    ///
    /// The uprobes are gone when this returns. The syscall and sched tracepoints' perf events
    /// are not removed here: each removal waits for grace periods under the kernel's
    /// event_mutex (`perf_trace_event_unreg`), so they go one after another (~40 ms each here,
    /// ~0.45 s for the 11) whatever the threads. Their last file descriptors are left to a
    /// helper process ([`close_after_exit`]) that closes them and exits while leaktrace exits;
    /// meanwhile their programs only note the mappings of processes no one reads any more. Where
    /// the helper cannot be made, they are closed here as the uprobes are.
    pub fn shutdown(mut self) {
        let started = std::time::Instant::now();
        // Each is held only to be dropped (which detaches it).
        let mut links: Vec<Box<dyn Send>> = Vec::with_capacity(self.links.len());
        for (_, link) in std::mem::take(&mut self.links) {
            match link {
                Link::Multi(fd) => links.push(Box::new(fd)),
                Link::Single(program, id) => {
                    if let Some(prog) = self.ebpf.program_mut(program).and_then(|p| <&mut UProbe>::try_from(p).ok())
                        && let Ok(link) = prog.take_link(id)
                    {
                        links.push(Box::new(link));
                    }
                }
            }
        }
        // Tracepoints: each perf-event tracepoint waits for its own grace periods when removed.
        let mut tp_links: Vec<aya::programs::links::FdLink> = Vec::new();
        for (program, id) in std::mem::take(&mut self.tp_links) {
            if let Some(prog) = self.ebpf.program_mut(program).and_then(|p| <&mut TracePoint>::try_from(p).ok())
                && let Ok(link) = prog.take_link(id)
            {
                // A bpf_link (Linux 5.15+) can be handed on; an older kernel's perf-event
                // attachment is removed here (by the failed conversion, which drops it).
                if let Ok(fd_link) = aya::programs::links::FdLink::try_from(link) {
                    tp_links.push(fd_link);
                }
            }
        }
        let n = links.len() + tp_links.len();
        // Grace periods waited for at the same time are shared: one thread per link, up to 256,
        // for uprobe_multi links. Single uprobes are removed one at a time whatever the threads
        // (perf_uprobe_destroy holds the kernel's event_mutex across its wait; measured: 2000
        // take ~200 s), so 32 threads: more would only sit blocked (and count in the load).
        let threads = links.len().clamp(1, if self.single_why.is_none() { 256 } else { 32 });
        let per = links.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let mut rest = links;
            while !rest.is_empty() {
                let chunk: Vec<_> = rest.drain(..per.min(rest.len())).collect();
                s.spawn(move || drop(chunk));
            }
        });
        let uprobes_done = started.elapsed().as_secs_f64();
        let fds: Vec<std::os::fd::RawFd> =
            tp_links.iter().map(|l| std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(l))).collect();
        let handed = !fds.is_empty() && close_after_exit(&fds);
        if handed {
            // This process's copies: not the last, so closing them removes nothing.
            drop(tp_links);
        } else {
            std::thread::scope(|s| {
                for l in tp_links {
                    s.spawn(move || drop(l));
                }
            });
        }
        drop(self);
        log::info!(
            "detached {n} links in {:.3} s (uprobes {uprobes_done:.3} s; {} tracepoint link(s) {})",
            started.elapsed().as_secs_f64(),
            fds.len(),
            if handed { "left to a helper process to close" } else { "closed here" }
        );
    }

    /// Count the full collections of `tgid`'s main isolate from now (an entry the GC probes
    /// write: [`Tracer::attach_gc_probes`]). Errors: the map is full or refused the update.
    pub fn watch_gc(&mut self, tgid: u32) -> anyhow::Result<()> {
        self.gc_full
            .insert(tgid, leaktrace_common::GcFull::default(), 0)
            .context("adding the process to the GC_FULL map")
    }

    /// The full collections of `tgid` seen so far, and seconds since the last one's size was
    /// read (on the kernel's monotonic clock); None when it is not watched.
    pub fn gc_full(&self, tgid: u32) -> Option<(leaktrace_common::GcFull, f64)> {
        let g = self.gc_full.get(&tgid, 0).ok()?;
        Some((g, load::monotonic_now_ns().saturating_sub(g.at_ns) as f64 / 1e9))
    }

    /// Stop counting `tgid`'s full collections (it left V8: an exec).
    pub fn unwatch_gc(&mut self, tgid: u32) {
        let _ = self.gc_full.remove(&tgid);
    }

    /// Units of work done by `tgid` since the work probe was attached (0 before the first call).
    pub fn work_units(&self, tgid: u32) -> u64 {
        self.work.get(&tgid, 0).unwrap_or(0)
    }

    /// Track the mmap/munmap/mremap/brk syscalls of process `tgid` (the syscall tracepoints are
    /// system-wide and filter on this set), in the mode the tracer was loaded for.
    pub fn add_target(&mut self, tgid: u32) -> anyhow::Result<()> {
        self.write_mode(tgid, self.default_mode).context("adding the target to the TARGETS map")
    }

    /// Trace process `tgid` in `mode` from now on (`sample_bytes`: sampled mode's mean distance,
    /// [`DEFAULT_SAMPLE_BYTES`] when None): its page faults are counted in growth mode only, its
    /// allocator calls sampled in sampled mode only. The allocator probes themselves are the
    /// caller's to attach or detach. Errors: growth mode in a tracer not loaded for it (its
    /// page-fault program is not loaded), or the map refused.
    pub fn set_mode(&mut self, tgid: u32, mode: Mode, sample_bytes: Option<u64>) -> anyhow::Result<()> {
        anyhow::ensure!(
            mode != Mode::Growth || self.growth_loaded,
            "growth mode needs a tracer loaded for it (its page-fault program)"
        );
        let target = target_mode(mode, sample_bytes)?;
        if mode == Mode::Sampled && !self.sampling_filled {
            fill_sampling(&mut self.ebpf)?;
            self.sampling_filled = true;
        }
        self.write_mode(tgid, target).with_context(|| format!("setting PID {tgid}'s mode to {mode}"))
    }

    /// `TARGETS[tgid] = mode`, then `MODE_GEN` bumped so that no thread keeps an older mode.
    fn write_mode(&mut self, tgid: u32, mode: leaktrace_common::TargetMode) -> anyhow::Result<()> {
        self.targets.insert(tgid, mode, 0)?;
        let generation = self.mode_gen.get(&0, 0).unwrap_or(0);
        self.mode_gen.set(0, generation.wrapping_add(1), 0)?;
        Ok(())
    }

    /// Stop tracking the syscalls of process `tgid` (`leaktrace watch` dropped it: it ended or
    /// left the selection); a process not tracked is no error.
    pub fn remove_target(&mut self, tgid: u32) {
        let _ = self.targets.remove(&tgid);
        let _ = self.work.remove(&tgid);
        let _ = self.gc_full.remove(&tgid);
        self.release_process(tgid);
    }

    /// What the tracer holds for process `tgid` goes (`leaktrace watch`, whose processes come
    /// and go for days): its uprobe links (detached in a thread of their own: each removal waits
    /// for RCU grace periods), its probes' bookkeeping (a process that comes back is probed
    /// anew) and its entries in the `SITES` map. Returns how many links and sites went. The
    /// sites' indices are given back to the kernel side for new sites once no probe of the
    /// process can use them (see [`crate::site_recycle`]); indices of processes released
    /// before whose wait is over go back here.
    pub fn release_process(&mut self, tgid: u32) -> (usize, usize) {
        let (mine, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.links).into_iter().partition(|(p, _)| *p == tgid);
        self.links = kept;
        let links = mine.len();
        let detach = self.take_links(mine);
        // Dropping a link detaches it.
        let detached = (!detach.is_empty()).then(|| std::thread::spawn(move || drop(detach)));
        self.attached.retain(|(pid, ..)| *pid != tgid);
        let entries: Vec<(SiteKey, u32)> =
            self.sites.iter().filter_map(Result::ok).filter(|(k, _)| k.tgid == tgid).collect();
        let freed: Vec<u32> = entries.iter().filter(|(k, _)| self.sites.remove(k).is_ok()).map(|&(_, i)| i).collect();
        let sites = freed.len();
        self.recycler.released(freed, detached);
        let now_ms = self.now_ms();
        self.recycler.give_back(&mut self.site_stats, now_ms);
        (links, sites)
    }

    /// Read the interpreter frames of process `tgid` at its allocations from now on (`target`:
    /// where they are, see [`crate::runtimes::python::frames`]).
    pub fn add_python_target(&mut self, tgid: u32, target: leaktrace_common::PyTarget) -> anyhow::Result<()> {
        self.py_targets.insert(tgid, target, 0).context("adding the process to the PY_TARGETS map")?;
        self.py_tgids.insert(tgid);
        self.py_any.set(0, 1, 0).context("setting the PY_ANY flag")
    }

    /// Whether Python threads are told apart by their TLS base (the kernel's BTF gave the offset
    /// of `task_struct.thread.fsbase`): each allocating thread gets its own Python frames, with
    /// or without the GIL, in any pid namespace.
    pub fn python_threads_by_fsbase(&self) -> bool {
        self.python_threads_by_fsbase
    }

    /// The budget of stacks with Python frames (--max-stacks), when it is spent: new stacks are
    /// stored with their native frames only from then on.
    pub fn python_budget_spent(&self) -> Option<u64> {
        let n = self.py_stack_count.get(&0, 0).unwrap_or(0);
        (n >= self.py_stack_budget).then_some(self.py_stack_budget)
    }

    /// Stop reading the interpreter frames of process `tgid` (it exec'd another program).
    pub fn remove_python_target(&mut self, tgid: u32) {
        let _ = self.py_targets.remove(&tgid);
        self.py_tgids.remove(&tgid);
        if self.py_tgids.is_empty() {
            let _ = self.py_any.set(0, 0, 0);
        }
    }

    /// The interpreter frames stored with stack `key` (innermost first), if it has any.
    pub fn py_stack(&self, key: u64) -> Option<Vec<leaktrace_common::PyFrame>> {
        let s = self.py_stacks.get(&key, 0).ok()?;
        Some(s.frames[..(s.len as usize).min(leaktrace_common::MAX_PY_FRAMES)].to_vec())
    }

    /// Print what the kernel side logged since the last call (--debug-unwind; else nothing).
    pub fn flush_log(&mut self) {
        if let Some(l) = self.log.as_mut() {
            l.flush();
        }
    }

    /// Take every queued mapping event (non-blocking).
    pub fn drain_map_events(&mut self, mut f: impl FnMut(&MapEvent)) {
        while let Some(item) = self.events.next() {
            if item.len() >= std::mem::size_of::<MapEvent>() {
                // SAFETY: the kernel side writes exactly one MapEvent (repr(C), Pod) per record.
                let ev: MapEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                f(&ev);
            }
        }
    }

    /// Per-site totals of process `tgid`, as the kernel holds them now.
    pub fn read_sites(&self, tgid: u32) -> anyhow::Result<Vec<(SiteKey, SiteStats)>> {
        let mut out = Vec::new();
        if let Ok(round) = self.sites_round.lock()
            && let Some(by_tgid) = round.as_ref()
        {
            let stats = self.stats_round.lock().ok();
            let stats = stats.as_ref().and_then(|s| s.as_ref());
            for &(k, index) in by_tgid.get(&tgid).into_iter().flatten() {
                let v = match stats.and_then(|s| s.get(index as usize)) {
                    Some(v) => *v,
                    None => self.site_stats.get(&index, 0).context("reading the SITE_STATS map")?,
                };
                out.push((k, v));
            }
            return Ok(out);
        }
        for item in self.sites.iter() {
            match item {
                Ok((k, index)) if k.tgid == tgid => {
                    out.push((k, self.site_stats.get(&index, 0).context("reading the SITE_STATS map")?))
                }
                Ok(_) => {}
                // An entry deleted while iterating: skip it, the next checkpoint sees the rest.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(e).context("reading the SITES map"),
            }
        }
        Ok(out)
    }

    /// Start a round of checkpoints of many processes (`watch`): the `SITES` map is read once
    /// here, with batched lookups (entry by entry on a kernel without them), and
    /// [`Tracer::read_sites`] takes each process's sites from that copy until
    /// [`Tracer::end_round`] — instead of walking the whole map (two system calls an entry, every
    /// process's entries) once per process. A site the kernel adds during the round is read at
    /// the next one. Nothing changes if the map cannot be read (each process then reads it).
    pub fn begin_round(&self) {
        let mut by_tgid: SitesByProcess = StdHashMap::new();
        use aya::maps::IterableMap as _;
        use std::os::fd::AsFd as _;
        let fd = self.sites.map().fd().as_fd();
        // SAFETY: SITES is a hash map of SiteKey → u32 (its 4-byte bucket token fits a u32).
        let batched = unsafe {
            crate::bpf_batch::lookup_all::<SiteKey, u32, u32>(fd, 4096, |keys, values| {
                for (k, v) in keys.iter().zip(values) {
                    by_tgid.entry(k.tgid).or_default().push((*k, *v));
                }
            })
        };
        let read = match batched {
            Ok(true) => true,
            Ok(false) => {
                by_tgid.clear();
                let mut ok = true;
                for item in self.sites.iter() {
                    match item {
                        Ok((k, index)) => by_tgid.entry(k.tgid).or_default().push((k, index)),
                        Err(aya::maps::MapError::KeyNotFound) => {}
                        Err(_) => ok = false,
                    }
                }
                ok
            }
            Err(_) => false,
        };
        // SITE_STATS up to the largest index in use, in one call: every site's totals (each
        // checkpoint used to read its own one by one). Indices of released processes are given
        // back (crate::site_recycle), so the largest stays near the sites traced at once.
        let stats = by_tgid.values().flatten().map(|&(_, i)| i as usize + 1).max().filter(|_| read).and_then(|n| {
            use aya::maps::IterableMap as _;
            let fd = self.site_stats.map().fd().as_fd();
            // SAFETY: SITE_STATS is an array of SiteStats (repr(C), the kernel side's type).
            unsafe { crate::bpf_batch::lookup_array_prefix::<SiteStats>(fd, n) }.ok().flatten()
        });
        if let Ok(mut round) = self.stats_round.lock() {
            *round = stats;
        }
        if let Ok(mut round) = self.sites_round.lock() {
            *round = read.then_some(by_tgid);
        }
        let counters = self.counters().ok();
        if let Ok(mut round) = self.counters_round.lock() {
            *round = counters;
        }
    }

    /// End the round [`Tracer::begin_round`] started: [`Tracer::read_sites`] reads the map again.
    pub fn end_round(&self) {
        if let Ok(mut round) = self.sites_round.lock() {
            *round = None;
        }
        if let Ok(mut round) = self.stats_round.lock() {
            *round = None;
        }
        if let Ok(mut round) = self.counters_round.lock() {
            *round = None;
        }
    }

    /// The sites of process `tgid` by their index (the kernel's SITES map read backwards; a live
    /// block in ALLOCS names its site by that index). Errors: the map cannot be read.
    pub fn site_keys(&self, tgid: u32) -> anyhow::Result<StdHashMap<u32, SiteKey>> {
        let mut out = StdHashMap::new();
        for item in self.sites.iter() {
            match item {
                Ok((k, index)) if k.tgid == tgid => {
                    out.insert(index, k);
                }
                Ok(_) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(e).context("reading the SITES map"),
            }
        }
        Ok(out)
    }

    /// Instruction pointers of the stack stored under `key` (`SiteKey::stack`), innermost first,
    /// and why the walk ended (`leaktrace_common::walk_end`); None if it is not in the map.
    pub fn stack(&self, key: u64) -> Option<(Vec<u64>, u32)> {
        self.stacks.get(&key, 0).ok().map(|s| (s.frames().to_vec(), s.end))
    }

    // Reachability hook: the scan reads the live blocks itself (leaktrace/src/reach/).
    /// The maps of traced live blocks, `BLOCKS` (the fast table, an array of
    /// [`leaktrace_common::BlockBucket`]) and `ALLOCS` (AllocKey → AllocInfo: blocks whose bucket
    /// was full), for the reachability scan's batched read ([`crate::reach::blocks::read`]); None
    /// if the object lacks them.
    pub fn live_block_maps(&self) -> Option<crate::reach::blocks::LiveMaps<'_>> {
        Some(crate::reach::blocks::LiveMaps { blocks: self.ebpf.map("BLOCKS")?, allocs: self.ebpf.map("ALLOCS")? })
    }

    /// Page addresses where blocks of `tgid` began since attach (the kernel's `BLOCK_PAGES`,
    /// freed blocks included, the least recently noted dropped when the map is full), sorted.
    /// One system call per entry of the map (65,536 at most). Errors: the map is missing or
    /// unreadable.
    pub fn block_pages(&self, tgid: u32) -> anyhow::Result<Vec<u64>> {
        let map = self.ebpf.map("BLOCK_PAGES").context("no BLOCK_PAGES map")?;
        let pages: HashMap<&MapData, leaktrace_common::AllocKey, u32> =
            HashMap::try_from(map).context("BLOCK_PAGES is not a hash map")?;
        let mut out = Vec::new();
        for key in pages.keys() {
            match key {
                Ok(k) if k.tgid == tgid => out.push(k.addr),
                Ok(_) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(e).context("reading the BLOCK_PAGES map"),
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Why unwind tables are off altogether (the kernel's BTF lacks what the walk needs), if so.
    pub fn unwind_disabled(&self) -> Option<&str> {
        self.unwind.disabled.as_deref()
    }

    /// Build and load the unwind tables of `objects` not loaded yet (each file once, whichever
    /// target maps it). Returns each object's outcome, in order. Loading makes the kernel forget
    /// its cached rules, so frames in these objects use their tables from now on.
    pub fn load_unwind_tables(&mut self, objects: &[crate::discover::MappedObject]) -> Vec<UnwindOutcome> {
        let u = &mut self.unwind;
        let mut out = Vec::with_capacity(objects.len());
        let mut loaded_any = false;
        for o in objects {
            let id = ObjectId { dev: ((o.dev.0 as u64) << 20) | o.dev.1 as u64, ino: o.inode };
            if let Some(done) = u.done.get(&id) {
                out.push(done.clone());
                continue;
            }
            let outcome = match &u.disabled {
                Some(why) => UnwindOutcome::Missing(format!("unwind tables are off: {why}")),
                None => match crate::unwind::build(&o.open_path) {
                    Err(e) => UnwindOutcome::Missing(format!("{e:#}")),
                    Ok(t) if t.rows.len() as u64 > (u.capacity - u.next_row) as u64 => UnwindOutcome::Missing(format!(
                        "its {} unwind rows do not fit in the {} left of --max-unwind-rows {}",
                        t.rows.len(),
                        u.capacity - u.next_row,
                        u.capacity
                    )),
                    Ok(t) => {
                        let first = u.next_row;
                        let written = write_rows(&mut u.rows, first, &t.rows);
                        let table = ObjectTable {
                            first_row: first,
                            rows: t.rows.len() as u32,
                            vaddr_minus_offset: t.vaddr_minus_offset,
                        };
                        match written.and_then(|()| u.objects.insert(id, table, 0).map_err(anyhow::Error::from)) {
                            Ok(()) => {
                                u.next_row += t.rows.len() as u32;
                                loaded_any = true;
                                UnwindOutcome::Loaded { rows: t.rows.len() as u32, section: t.section }
                            }
                            Err(e) => UnwindOutcome::Missing(format!("loading its unwind table: {e}")),
                        }
                    }
                },
            };
            u.done.insert(id, outcome.clone());
            out.push(outcome);
        }
        if loaded_any {
            let g = u.generation.get(&0, 0).unwrap_or(0);
            let _ = u.generation.set(0, g + 1, 0);
        }
        out
    }

    /// Kernel counters (see `leaktrace_common::counter`), summed over CPUs, by name.
    pub fn counters(&self) -> anyhow::Result<StdHashMap<&'static str, u64>> {
        if let Ok(round) = self.counters_round.lock()
            && let Some(c) = round.as_ref()
        {
            return Ok(c.clone());
        }
        let mut out = StdHashMap::new();
        for c in Counter::ALL {
            let v = self.counters.get(&(c as u32), 0).context("reading the COUNTERS map")?;
            out.insert(c.name(), v.iter().sum());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use leaktrace_common::program::{ALL, Kind};
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

    /// The program table is the built object's: each program of the object is in it, with the
    /// kind its section says, and each program of the table is in the object.
    #[test]
    fn program_table_matches_the_built_object() {
        let file = object::File::parse(super::OBJECT).expect("the embedded eBPF object");
        let mut programs: Vec<(String, String)> = Vec::new();
        for sym in file.symbols().filter(|s| s.is_global() && s.kind() == object::SymbolKind::Text) {
            let Some(section) = sym.section_index().and_then(|i| file.section_by_index(i).ok()) else { continue };
            let section = section.name().unwrap_or("").to_string();
            if ["uprobe", "uretprobe", "tracepoint"].iter().any(|k| section.starts_with(k)) {
                programs.push((sym.name().unwrap().to_string(), section));
            }
        }
        assert!(programs.len() > 20, "programs found in the object: {programs:?}");
        for (name, section) in &programs {
            let p =
                ALL.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("{name} ({section}) not in the table"));
            let kind_ok = match p.kind {
                Kind::Entry => section.starts_with("uprobe"),
                Kind::Return => section.starts_with("uretprobe"),
                Kind::Tracepoint { .. } => section.starts_with("tracepoint"),
            };
            assert!(kind_ok, "{name}: {:?} in the table, section {section} in the object", p.kind);
        }
        for p in ALL {
            assert!(programs.iter().any(|(n, _)| n == p.name), "{} missing from the object", p.name);
        }
    }
}
