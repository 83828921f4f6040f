//! The `leaktrace` command line. Exit codes: 0 success, 1 `check` failed its budget, 2 error (one
//! line on stderr starting with `leaktrace: error:`).
#![allow(
    clippy::print_stderr,
    reason = "the command line: its errors and the reporter of the library's lines go to stderr"
)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use leaktrace::pipeline;
use leaktrace::probes::Limits;
use leaktrace::record::{self, ProcessOptions, RecordOptions, TargetSpec};
use leaktrace_analysis::recording::{Mode, Recording};

#[derive(Parser)]
#[command(
    name = "leaktrace",
    version,
    about = "Is the memory growth of a live process a leak? eBPF allocation tracer: live bytes by call stack, over time."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Permission bits (octal) of the output directories leaktrace makes; its files get the same
    /// bits without x. Default 0700 (files 0600): reports carry command lines and strings read
    /// from the targets. Within 0755, including 0700 (e.g. 0750 for a team's group).
    #[arg(long, global = true, value_parser = leaktrace_analysis::output::parse_mode)]
    out_mode: Option<u32>,
}

/// `report --format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ReportFormat {
    /// Every output file (report.json, report.md, SVGs, folded stacks, pprof profiles).
    All,
    /// Only profile.pb.gz and growth.pb.gz.
    Pprof,
}

#[derive(Subcommand)]
enum Command {
    /// Trace a running process (--pid) or a command (-- CMD ARGS...) and write a report.
    Record(Box<RecordArgs>),
    /// Watch every selected process (--pid, --cgroup, --pod; none: the whole host) in growth
    /// mode, window after window: a verdict per process, an exact window on those that keep
    /// growing, an OOM-time report, Prometheus metrics (docs/watch.md).
    Watch(Box<leaktrace::watch::cli::WatchArgs>),
    /// Re-render report.md, report.json, the SVGs and the pprof profiles of a recording directory
    /// (no root needed).
    Report {
        /// Directory holding recording.json.
        dir: PathBuf,
        /// Sites listed in report.md.
        #[arg(long, allow_negative_numbers = true, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        top: usize,
        /// What to write: every output (all), or only the pprof profiles profile.pb.gz and
        /// growth.pb.gz (pprof).
        #[arg(long, value_enum, default_value = "all")]
        format: ReportFormat,
    },
    /// Run the bundled demo workload (one leak, a bounded cache, temporary buffers) and record it.
    Demo {
        /// Output directory (default ./leaktrace-demo-PID-TIMESTAMP, PID the demo program's).
        #[arg(long)]
        out: Option<PathBuf>,
        /// How long the demo runs and is recorded.
        #[arg(long, allow_hyphen_values = true, default_value = "15s", value_parser = parse_duration)]
        duration: Duration,
    },
    /// Growth test for CI: warm up, run K equal batches, fail when the traced live bytes grow
    /// faster than --budget. Exit 0 pass, 1 fail, 2 error.
    Check(CheckArgs),
    /// Compare two recordings (before/after a fix): growth per site matched by stack, verdict,
    /// differential flame graph (no root needed).
    Compare {
        /// Recording directory (or recording.json) before.
        before: PathBuf,
        /// Recording directory (or recording.json) after.
        after: PathBuf,
        /// Output directory (default ./leaktrace-compare-TIMESTAMP).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Build the unwind table the stack walk would use for each ELF object and print its size:
    /// rows, kernel bytes, build time, the section it comes from, rules the walk cannot use
    /// (no root needed). Exit 2 if an object has no usable table.
    UnwindTable {
        /// ELF objects (executables, shared libraries).
        #[arg(required = true)]
        objects: Vec<PathBuf>,
    },
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("batch_size").required(true).args(["batch_units", "batch_seconds"])))]
struct CheckArgs {
    /// PID of the process to test (as the host sees it).
    #[arg(long, conflicts_with = "command")]
    pid: Option<u32>,
    /// Attach even to a process under a seccomp filter on an x86-64 kernel 6.11–6.13 (see
    /// `record --allow-seccomp-risk`).
    #[arg(long)]
    allow_seccomp_risk: bool,
    /// Warm-up before the baseline checkpoint (e.g. 5s, 0 for none).
    #[arg(long, allow_hyphen_values = true, default_value = "5s", value_parser = parse_duration_or_zero)]
    warmup: Duration,
    /// Number of batches after the warm-up.
    #[arg(long, allow_negative_numbers = true, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    batches: u32,
    /// Batch size in units of work (calls of the --work-probe function).
    #[arg(long, allow_negative_numbers = true, requires = "work_probe", value_parser = clap::value_parser!(u64).range(1..))]
    batch_units: Option<u64>,
    /// Batch size in time (e.g. 2s, 500ms).
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration)]
    batch_seconds: Option<Duration>,
    /// Largest allowed growth of the traced live bytes: bytes per unit with --work-probe, else
    /// bytes per second. Plain bytes or with a suffix: B, KB (1000), KiB (1024), MB, MiB.
    #[arg(long, allow_negative_numbers = true, value_parser = leaktrace::check::parse_bytes)]
    budget: f64,
    /// Count calls of this function as units of work (SYMBOL or SYMBOL@OBJECT); the budget is
    /// then per unit.
    #[arg(long, value_name = "SYMBOL[@OBJECT]")]
    work_probe: Option<leaktrace::discover::WorkProbeSpec>,
    /// Time between the periodic checkpoints taken besides the batch ones.
    #[arg(long, allow_hyphen_values = true, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// Output directory (default ./leaktrace-check-PID-TIMESTAMP).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    reach: ReachArgs,
    /// Command to launch and test (after --); it is stopped when the test ends.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Reachability hook: `--reachability`, shared by `record` and `check`.
#[derive(Args)]
struct ReachArgs {
    /// At the end, stop the target briefly and scan its memory for pointers to the live blocks:
    /// per site, bytes still pointed at and bytes lost (nothing points at them), and the chain
    /// that holds a representative block (exact mode; docs/reachability.md).
    #[arg(long)]
    reachability: bool,
    /// Longest pause of the target during the scan (e.g. 500ms, 5s); the scan stops there and
    /// says how far it got.
    #[arg(long, allow_hyphen_values = true, default_value = "5s", value_parser = parse_duration, requires = "reachability")]
    reachability_max_pause: Duration,
    /// Also scan at every Nth checkpoint (each scan pauses the target), to see lost and
    /// still-referenced bytes over time, not only at the end.
    #[arg(long, allow_negative_numbers = true, value_name = "N", requires = "reachability", value_parser = clap::value_parser!(u32).range(1..))]
    reachability_every: Option<u32>,
    /// On a CPython target, take a census of its objects by type at the first checkpoint, at
    /// the end (and with --python-heap-every N at every Nth checkpoint), each stopping the
    /// target briefly: which types grow, and the retaining path from a module global that holds
    /// them ("What holds it" in the report; docs/runtimes.md).
    #[arg(long)]
    python_heap: bool,
    /// Longest pause of the target per census (e.g. 500ms, 2s); the census stops there and says
    /// how far it got.
    #[arg(long, allow_hyphen_values = true, default_value = "2s", value_parser = parse_duration, requires = "python_heap")]
    python_heap_max_pause: Duration,
    /// Also take a census at every Nth checkpoint.
    #[arg(long, allow_negative_numbers = true, value_name = "N", requires = "python_heap", value_parser = clap::value_parser!(u32).range(1..))]
    python_heap_every: Option<u32>,
}

impl ReachArgs {
    fn heap_options(&self) -> Option<leaktrace::runtimes::python::heap::HeapOptions> {
        self.python_heap.then(|| leaktrace::runtimes::python::heap::HeapOptions {
            max_pause: self.python_heap_max_pause,
            every: self.python_heap_every,
            ..Default::default()
        })
    }

    fn options(&self) -> Option<leaktrace::reach::ScanOptions> {
        self.reachability.then_some(leaktrace::reach::ScanOptions {
            max_pause: self.reachability_max_pause,
            every: self.reachability_every,
            at_exit: false,
        })
    }
}

/// Kernel map sizes, shared by `record` and `check`.
#[derive(Args)]
struct LimitArgs {
    /// Maximum outstanding allocations tracked at once (kernel map size, 1 to 67108864; ~150
    /// bytes of kernel memory each, allocated as used).
    #[arg(long, allow_negative_numbers = true, default_value_t = Limits::default().max_allocs, value_parser = clap::value_parser!(u32).range(1..=1 << 26))]
    max_allocs: u32,
    /// Maximum distinct allocation sites (kernel map size, 1 to 4194304).
    #[arg(long, allow_negative_numbers = true, default_value_t = Limits::default().max_sites, value_parser = clap::value_parser!(u32).range(1..=1 << 22))]
    max_sites: u32,
    /// Maximum distinct call stacks (kernel map size, 1 to 1048576; ~1 KiB each, allocated as
    /// stacks are found), and as many more with Python frames (~1.5 KiB each).
    #[arg(long, allow_negative_numbers = true, default_value_t = Limits::default().max_stacks, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    max_stacks: u32,
    /// Unwind-table rows for the stack walk, over all objects the targets map (kernel map size,
    /// 1024 to 67108864; 8 bytes each, allocated at start: the default is 16 MiB). An object
    /// whose table does not fit is walked by frame pointers only, and the report says so.
    #[arg(long, allow_negative_numbers = true, default_value_t = Limits::default().max_unwind_rows, value_parser = clap::value_parser!(u32).range(1024..=1 << 26))]
    max_unwind_rows: u32,
    /// Print, from the kernel side, why each stack walk that stopped early stopped (no unwind
    /// info, depth, unreadable stack), with its process and address (eBPF logs through aya-log;
    /// off by default, and then the log statements are removed by the verifier).
    #[arg(long)]
    debug_unwind: bool,
}

impl From<LimitArgs> for Limits {
    fn from(a: LimitArgs) -> Limits {
        Limits {
            max_allocs: a.max_allocs,
            max_sites: a.max_sites,
            max_stacks: a.max_stacks,
            max_unwind_rows: a.max_unwind_rows,
            debug_unwind: a.debug_unwind,
        }
    }
}

#[derive(Args)]
struct RecordArgs {
    /// PID of a process to trace (as the host sees it). Repeat for several processes: one report
    /// per process and a summary.
    #[arg(long, conflicts_with = "command")]
    pid: Vec<u32>,
    /// Trace every process of this cgroup (absolute, or relative to the cgroup2 mount, else the
    /// v1 memory controller's).
    #[arg(long, conflicts_with_all = ["command", "pid"])]
    cgroup: Option<PathBuf>,
    /// Trace every process of this container (an ID, or its first characters, as it appears
    /// in the processes' cgroup paths). With --pod: the name of a container of that pod.
    #[arg(long, conflicts_with_all = ["command", "pid", "cgroup"])]
    container: Option<String>,
    /// Also trace the processes the traced ones fork (from their fork on).
    #[arg(long)]
    follow_forks: bool,
    /// Attach even to a process under a seccomp filter on an x86-64 kernel 6.11–6.13, whose
    /// filter may kill it at its first traced return (the `uretprobe` syscall); for kernels
    /// with the seccomp passthrough fix backported. Without it leaktrace refuses.
    #[arg(long)]
    allow_seccomp_risk: bool,
    /// Python targets: also hook CPython's allocator API (PyObject_Malloc, PyMem_Malloc, ...), so
    /// objects and blocks pymalloc serves from its arenas are traced by call stack (an
    /// extension's PyMem_Malloc leak is named). Every Python allocation then pays a probe.
    #[arg(long)]
    pymalloc: bool,
    /// Python targets: read the Python frames (function, file, line) at each allocation. auto:
    /// on, except with --pymalloc, where every Python object's allocation would carry them (many
    /// more distinct stacks: the imports at startup alone fill the default --max-stacks, and the
    /// walk slows them); on with --pymalloc names the Python line that allocates (raise
    /// --max-stacks).
    #[arg(long, value_enum, default_value_t = PythonFrames::Auto)]
    python_frames: PythonFrames,
    /// JVM targets: let leaktrace run `jcmd PID Compiler.perfmap` (the JVM writes
    /// /tmp/perf-PID.map) when new unnamed JIT frames appear (at most 20 times, 5 s apart) and
    /// once at the end, so Java frames are named; and `jcmd PID VM.flags -all` once, to say
    /// whether -XX:+PreserveFramePointer is on. Uses the target JDK's jcmd, else jcmd on PATH.
    #[arg(long)]
    jvm_perf_map: bool,
    /// "What holds it" from the runtimes' own heap tools, at the start and the end of the
    /// recording: JVM: `jcmd PID GC.class_histogram` (each forces a full GC: a stop-the-world
    /// pause, stated in the report; same jcmd and safety rules as --jvm-perf-map); Go: its
    /// goroutines by state, wait reason and start function, and its own heap profile's in-use
    /// bytes by Go function, read from its memory (no pause; needs the executable's symbols and
    /// DWARF); Node: V8's sampling heap profile by JS function, through the inspector (opened
    /// with SIGUSR1 unless listening, closed again). The classes and goroutines that grew go in the
    /// report's "What holds it" section.
    #[arg(long)]
    heap_census: bool,
    #[command(flatten)]
    heap_dump: leaktrace::runtimes::jvm::heapdump::HeapDumpArgs,
    /// Stop after this long (e.g. 30s, 2m). Default: until the target exits or Ctrl-C.
    #[arg(long, allow_hyphen_values = true, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Time between checkpoints (e.g. 1s, 250ms).
    #[arg(long, allow_hyphen_values = true, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// Output directory (default ./leaktrace-PID-TIMESTAMP).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Sites listed in report.md.
    #[arg(long, allow_negative_numbers = true, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    top: usize,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    reach: ReachArgs,
    /// Count calls of this function as units of work (SYMBOL or SYMBOL@OBJECT, e.g.
    /// handle_request or parse@libfoo.so); growth is then also reported per unit.
    #[arg(long, value_name = "SYMBOL[@OBJECT]")]
    work_probe: Option<leaktrace::discover::WorkProbeSpec>,
    /// Tracing mode: exact (every malloc-family call), sampled (see --sample-bytes), or growth
    /// (no allocator probes: RSS growth by call stack from first-touch page faults; for production).
    #[arg(long, default_value = "exact", value_parser = mode_parser())]
    mode: Mode,
    /// Growth mode: when memory grows through the allocator (pages first touched inside malloc,
    /// which names no holder), trace every allocator call of that process for this long after the
    /// growth-mode window (an exact window; its probes are removed when it ends), so the report
    /// names the function whose blocks grow. Only when the recording ended by --duration and the
    /// process still runs.
    #[arg(long, value_parser = parse_duration, default_value = "10s", value_name = "DURATION")]
    escalate_for: Duration,
    /// Growth mode: never take that exact window.
    #[arg(long)]
    no_escalate: bool,
    /// Sampled mode: sample on average one allocation per this many bytes allocated (e.g. 524288,
    /// 512KiB). Implies --mode sampled.
    #[arg(long, allow_negative_numbers = true, value_name = "BYTES", value_parser = parse_sample_bytes)]
    sample_bytes: Option<u64>,
    /// No live status on stderr (by default a line redrawn at each checkpoint on a terminal, a
    /// plain `leaktrace: status:` line every 10 s otherwise).
    #[arg(long)]
    quiet: bool,
    // --pod, --namespace.
    #[command(flatten)]
    pod: leaktrace::pod::PodArgs,
    // --push, --push-format, --push-label, --push-name, --push-interval (record/sink.rs).
    #[command(flatten)]
    push: leaktrace::push::PushArgs,
    /// Command to launch and trace (after --).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `--python-frames`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum PythonFrames {
    Auto,
    On,
    Off,
}

/// `--mode`: the recording's [`Mode`] by its name (exact, sampled, growth), listed in `--help`.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = Mode> {
    use clap::builder::TypedValueParser as _;
    const MODES: [Mode; 3] = [Mode::Exact, Mode::Sampled, Mode::Growth];
    clap::builder::PossibleValuesParser::new(MODES.map(Mode::as_str))
        .map(|s| MODES.into_iter().find(|m| m.as_str() == s).expect("a possible value"))
}

/// The mode and sampling distance of `--mode` and `--sample-bytes` (which alone means sampled
/// mode; sampled mode without it samples every [`leaktrace::probes::DEFAULT_SAMPLE_BYTES`]).
fn mode_of(mode: Mode, sample_bytes: Option<u64>) -> anyhow::Result<(Mode, Option<u64>)> {
    Ok(match (mode, sample_bytes) {
        (Mode::Exact, None) => (Mode::Exact, None),
        (Mode::Exact | Mode::Sampled, Some(n)) => (Mode::Sampled, Some(n)),
        (Mode::Sampled, None) => (Mode::Sampled, Some(leaktrace::probes::DEFAULT_SAMPLE_BYTES)),
        (Mode::Growth, None) => (Mode::Growth, None),
        (Mode::Growth, Some(_)) => anyhow::bail!("--sample-bytes goes with --mode sampled, not growth"),
    })
}

/// Parse a byte count (plain bytes or B, KB, KiB, MB, MiB, GB, GiB), as `check --budget` does.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let b = leaktrace::check::parse_bytes(s)?;
    if b > u64::MAX as f64 {
        return Err(format!("`{s}` is too large"));
    }
    Ok(b.round() as u64)
}

/// Checkpoint intervals: at least the recorder's polling period (100 ms).
fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) {
        return Err(format!("{s} is shorter than the smallest checkpoint interval, 100ms"));
    }
    Ok(d)
}

fn parse_sample_bytes(s: &str) -> Result<u64, String> {
    match parse_bytes(s)? {
        0 => Err("the sampling distance must be at least 1 byte".to_string()),
        n => Ok(n),
    }
}

use leaktrace::args::parse_duration;

fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // The library's lines for the user (warnings, probes placed, pauses) go to stderr.
    let _ = leaktrace::notes::install(Box::new(leaktrace::notes::to_stderr));
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(leaktrace::runtimes::node::census::GUARD_SUBCOMMAND) {
        std::process::exit(leaktrace::runtimes::node::guard::main(&args[2..]));
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("leaktrace: error: {e:#}");
            std::process::exit(2);
        }
    }
}

/// Runs a command; Ok(exit code).
fn run(cli: Cli) -> anyhow::Result<i32> {
    if let Some(mode) = cli.out_mode {
        leaktrace_analysis::output::set_mode(mode)?;
    }
    match cli.command {
        Command::Record(a) => {
            let a = *a;
            leaktrace::stopping::install();
            // --pod NAME [--namespace NS] [--container NAME] → its PIDs.
            let (pod_pids, container) = match &a.pod.pod {
                Some(pod) => {
                    if let Some(s) = &a.pod.cri_socket {
                        leaktrace::cri::set_socket(s.clone());
                    }
                    let sel = leaktrace::pod::PodSelector {
                        pod: pod.clone(),
                        namespace: a.pod.namespace.clone(),
                        container: a.container.clone(),
                    };
                    (leaktrace::pod::resolve_and_tell(&sel)?, None)
                }
                None => (Vec::new(), a.container),
            };
            let pids = if pod_pids.is_empty() { a.pid.clone() } else { pod_pids };
            let spec = match (pids.as_slice(), a.cgroup, container, a.command.is_empty()) {
                ([pid], None, None, true) => TargetSpec::Pid(*pid),
                ([_, ..], None, None, true) => TargetSpec::Pids(pids.clone()),
                ([], Some(cg), None, true) => TargetSpec::Cgroup(cg),
                ([], None, Some(id), true) => TargetSpec::Container(id),
                ([], None, None, false) => TargetSpec::Launch(a.command),
                _ => anyhow::bail!("give --pid PID (repeatable), --cgroup PATH, --container ID, or a command after --"),
            };
            let (mode, sample_bytes) = mode_of(a.mode, a.sample_bytes)?;
            let opts = RecordOptions {
                process: ProcessOptions {
                    mode,
                    sample_bytes,
                    work_probe: a.work_probe,
                    pymalloc: a.pymalloc,
                    python_frames: match a.python_frames {
                        PythonFrames::On => true,
                        PythonFrames::Off => false,
                        PythonFrames::Auto => !a.pymalloc,
                    },
                    jvm_perf_map: a.jvm_perf_map,
                    heap_census: a.heap_census,
                    allow_seccomp_risk: a.allow_seccomp_risk,
                },
                duration: a.duration,
                interval: a.interval,
                out: a.out,
                dir_prefix: None,
                top: a.top,
                limits: a.limits.into(),
                status_line: !a.quiet,
                schedule: Default::default(),
                follow_forks: a.follow_forks,
                python_frames_required: matches!(a.python_frames, PythonFrames::On),
                heap_dump: a.heap_dump.options(),
                reachability: a.reach.options(),
                python_heap: a.reach.heap_options(),
                push: a.push.config()?,
                escalate: (a.mode == Mode::Growth && !a.no_escalate).then_some(a.escalate_for),
            };
            let multi = pipeline::record_all(spec, opts)?;
            for outcome in &multi.outcomes {
                print_outcome(outcome);
            }
            for f in &multi.summary_files {
                println!("  {}", f.display());
            }
            Ok(0)
        }
        Command::Report { dir, top, format } => {
            let rec = Recording::load(&dir.join("recording.json"))?;
            let out = leaktrace_analysis::output::OutDir::existing(&dir)?;
            let opts = leaktrace_analysis::analyze::AnalyzeOptions { top };
            let files = match format {
                ReportFormat::All => leaktrace_analysis::report::write_all(&rec, &out, &opts)?,
                ReportFormat::Pprof => leaktrace_analysis::report::write_pprof(&rec, &out, &opts)?,
            };
            for f in files {
                println!("{}", f.display());
            }
            Ok(0)
        }
        Command::Watch(a) => leaktrace::watch::run(a.options()?).map(|()| 0),
        Command::Demo { out, duration } => demo(out, duration).map(|()| 0),
        Command::Check(a) => {
            let spec = leaktrace::check::target_spec(a.pid, a.command)?;
            let size = match (a.batch_units, a.batch_seconds) {
                (Some(n), None) => record::BatchSize::Units(n),
                (None, Some(d)) => record::BatchSize::Seconds(d),
                _ => anyhow::bail!("give exactly one of --batch-units N and --batch-seconds S"),
            };
            let opts = leaktrace::check::CheckOptions {
                warmup: a.warmup,
                batches: a.batches,
                size,
                budget: a.budget,
                work_probe: a.work_probe,
                interval: a.interval,
                out: a.out,
                limits: a.limits.into(),
                reachability: a.reach.options(),
                python_heap: a.reach.heap_options(),
                allow_seccomp_risk: a.allow_seccomp_risk,
            };
            let outcome = leaktrace::check::check(spec, opts)?;
            print!("{}", outcome.text);
            Ok(if outcome.result.pass { 0 } else { 1 })
        }
        Command::Compare { before, after, out } => {
            let outcome = leaktrace_analysis::compare::run(&before, &after, out)?;
            print!("{}", outcome.text);
            Ok(0)
        }
        Command::UnwindTable { objects } => {
            let mut failed = Vec::new();
            for o in &objects {
                let started = std::time::Instant::now();
                match leaktrace::unwind::build(o) {
                    Ok(t) => println!(
                        "{}: {} rows, {} bytes, built in {:.1} ms from {}; {} rules not usable by the walk",
                        o.display(),
                        t.rows.len(),
                        t.rows.len() * std::mem::size_of::<leaktrace_common::UnwindRow>(),
                        started.elapsed().as_secs_f64() * 1e3,
                        t.section,
                        t.unsupported_rows
                    ),
                    Err(e) => failed.push(format!("{}: {e:#}", o.display())),
                }
            }
            anyhow::ensure!(failed.is_empty(), "no unwind table for {}", failed.join("; "));
            Ok(0)
        }
    }
}

fn print_outcome(o: &pipeline::RecordOutcome) {
    let rec = &o.recording;
    let cps = rec.checkpoints.len();
    let dur = rec.checkpoints.last().map(|c| c.t_s).unwrap_or(0.0);
    match (&rec.target.ended, o.exit_status) {
        // Ended on its own during the recording: how, in words (OOM killer, signal, status).
        (Some(how), _) if rec.target.launched => println!("leaktrace: command ended: {how}"),
        (Some(how), _) => println!("leaktrace: PID {} {how}", rec.target.pid),
        (None, Some(s)) => println!("leaktrace: command ended: {s}"),
        (None, None) => {}
    }
    // The analysis stops at the teardown (checkpoints after it feed the list of what was still
    // allocated at exit): said when it covers fewer checkpoints than were recorded.
    let a = &o.analysis;
    let analysed = if a.checkpoints < cps && a.freed_at_exit.is_some() {
        format!("; analysed up to the teardown: {} checkpoints, {:.1} s", a.checkpoints, a.duration_s)
    } else if a.checkpoints < cps {
        format!("; analysed: {} checkpoints, {:.1} s", a.checkpoints, a.duration_s)
    } else {
        String::new()
    };
    println!("leaktrace: recorded {cps} checkpoints over {dur:.1}s ({}){analysed}", rec.end_reason);
    println!("leaktrace: verdict: {}", leaktrace_analysis::report::verdict::sentence(&o.analysis));
    for f in &o.files {
        println!("  {}", f.display());
    }
}

/// The bundled demo: write the demo binary (compiled into leaktrace at build time) to a temporary
/// directory, record it for `duration`, and say where the outputs are.
fn demo(out: Option<PathBuf>, duration: Duration) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    static DEMO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/leaktrace-demo"));
    // Not named like the default output directory: run from the temporary directory itself, the
    // two would be one, and removing this one would remove the report. Made exclusively with a
    // random name (mode 0700): nobody else can plant or swap the binary leaktrace then runs.
    let tmp = tempfile::Builder::new()
        .prefix("leaktrace-demo-program-")
        .tempdir()
        .context("cannot create a temporary directory for the demo program")?;
    let bin = tmp.path().join("leaktrace-demo");
    std::fs::write(&bin, DEMO).with_context(|| format!("cannot write {}", bin.display()))?;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))?;
    let secs = duration.as_secs().max(1);
    println!(
        "leaktrace demo: recording a message processor for {secs}s (200 messages/s; it leaks 256 B per \
         message in remember_message, keeps a bounded cache, and uses temporary buffers)"
    );
    let opts = RecordOptions {
        duration: Some(duration + Duration::from_secs(5)),
        interval: Duration::from_millis(500),
        // The default directory is named and made exclusively by the recorder, like record's.
        dir_prefix: out.is_none().then_some("demo"),
        out,
        top: 5,
        status_line: true,
        process: ProcessOptions {
            work_probe: Some("handle_message".parse().map_err(anyhow::Error::msg)?),
            ..ProcessOptions::default()
        },
        // The rest as a plain recording's (`RecordOptions::default()`: exact mode, default limits).
        ..RecordOptions::default()
    };
    let argv = vec![bin.clone().into_os_string(), "200".into(), secs.to_string().into()];
    let result = pipeline::record(TargetSpec::Launch(argv), opts);
    drop(tmp);
    let outcome = result?;
    print_outcome(&outcome);
    println!(
        "\nOpen {}/report.md for the verdict and the stacks, live.svg and growth.svg for the flame graphs.",
        outcome.dir.display()
    );
    Ok(())
}
