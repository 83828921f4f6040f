//! `cargo xtask bench`: what tracing costs, measured on this machine, written to
//! docs/benchmarks.md.
//!
//! Everything here runs as root and is reproducible: the programs measured are the C and Python
//! sources in `xtask/bench/`, compiled or run here; the tools compared with come from Debian's
//! packages (installed when missing: bpftrace, heaptrack, redis-server, redis-tools, bpftool).
//!
//! Isolation: the microbenchmark links against a private copy of libc (an rpath to
//! `target/bench/lib`). Uprobes are placed on an inode, so probes on the copy fire only in the
//! benchmark, even those of bpftrace 0.17, which attaches system-wide whatever `-p`/`-c` say.
//!
//! Noise: the machine is shared (2 cores, others build on it). Costs are measured as the
//! benchmark process's own CPU time (the uprobes run in its context; time others take the CPU
//! is not counted), variants are interleaved, each figure is the median of several runs, and
//! everything is compared as ratios within one run. The bench waits for a low load first.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::{Apt, quote, release_binary, root, run, show, which};

mod ab;
mod agent;
mod attach;
mod dominators;
mod helpers;
mod holds;
mod micro;
mod pyheap;
mod pyhooks;
mod python;
mod reach;
mod redis;
mod render;
mod watch;

use helpers::*;

#[derive(clap::Args, Clone, Debug)]
pub(crate) struct BenchArgs {
    /// Runs of each variant (interleaved); figures are medians.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// malloc+free pairs per run of the microbenchmark.
    #[arg(long, default_value_t = 200_000)]
    pub pairs: u64,
    /// Requests per redis-benchmark test (SET and GET), untraced and in growth mode; exact and
    /// sampled mode (whose probes fire on every allocator call) get a twentieth of them.
    #[arg(long, default_value_t = 1_000_000)]
    pub redis_requests: u64,
    /// Iterations of the Python workload.
    #[arg(long, default_value_t = 40_000)]
    pub python_iterations: u64,
    /// Live allocations held for the agent-cost measurement.
    #[arg(long, default_value_t = 1_000_000)]
    pub live_allocs: u64,
    /// Start measuring once the 1-minute load average is below this.
    #[arg(long, default_value_t = 1.0)]
    pub max_load: f64,
    /// Longest wait for that load (seconds); then the bench runs anyway and says so.
    #[arg(long, default_value_t = 900)]
    pub max_wait: u64,
    /// Where to write the results (default docs/benchmarks.md).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Measure only the stack walk without frame pointers (bench_unwind.rs) and update its
    /// section of the results.
    #[arg(long)]
    pub unwind_only: bool,
    /// Measure only the reachability scan's pause and update its section of the results.
    #[arg(long, conflicts_with = "unwind_only")]
    pub reach_only: bool,
    /// Measure only attach and detach (one process with ~100 probes, `--cgroup` over 50
    /// processes; uprobe_multi links and single uprobes) and update its section of the results.
    #[arg(long, conflicts_with_all = ["unwind_only", "reach_only"])]
    pub attach_only: bool,
    /// Measure only the cost of Python frames and of the pymalloc hooks (pyhooks.rs) and update
    /// its section of the results.
    #[arg(long, conflicts_with_all = ["unwind_only", "reach_only", "attach_only"])]
    pub python_only: bool,
    /// Measure only the Python heap census's pause (pyheap.rs) and update its section of the
    /// results.
    #[arg(long, conflicts_with_all = ["unwind_only", "reach_only", "attach_only", "python_only"])]
    pub pyheap_only: bool,
    /// Measure only the runtimes' own heap tools (Node heap snapshots, the JVM's class
    /// histograms and heap dump, Go's goroutine census: holds.rs) and update their section of
    /// the results.
    #[arg(long, conflicts_with_all = ["unwind_only", "reach_only", "attach_only", "python_only", "pyheap_only"])]
    pub holds_only: bool,
    /// Measure only `leaktrace watch`'s costs (the agent over 50 processes for --watch-minutes,
    /// redis-server under watch, an escalation's cost while it lasts: watch.rs) and update their
    /// section of the results.
    #[arg(
        long,
        conflicts_with_all = ["unwind_only", "reach_only", "attach_only", "python_only", "pyheap_only", "holds_only"]
    )]
    pub watch_only: bool,
    /// Measure only the heap graph's dominators over 1 M and 10 M nodes (dominators.rs) and
    /// update their section of the results.
    #[arg(
        long,
        conflicts_with_all = ["unwind_only", "reach_only", "attach_only", "python_only", "pyheap_only", "holds_only", "watch_only"]
    )]
    pub dominators_only: bool,
    /// How long the watch bench's agent watches its 50 processes, minutes (10 for the
    /// goal; shorter on a shared machine).
    #[arg(long, default_value_t = 10.0)]
    pub watch_minutes: f64,
    /// Objects in the Node target's heap of the heap-tools bench.
    #[arg(long, default_value_t = 5_000)]
    pub holds_node_objects: u64,
    /// Records (an object and a byte[100] each) kept by the JVM target of the heap-tools bench.
    #[arg(long, default_value_t = 200_000)]
    pub holds_jvm_records: u64,
    /// Blocked goroutines of the Go target of the heap-tools bench.
    #[arg(long, default_value_t = 10_000)]
    pub holds_go_goroutines: u64,
    /// Objects in the Python heap of the census bench.
    #[arg(long, default_value_t = 1_000_000)]
    pub pyheap_objects: u64,
    /// Live blocks held for the reachability scan's pause.
    #[arg(long, default_value_t = 1_000_000)]
    pub reach_blocks: u64,
    /// Measure only this build's agent against another leaktrace binary (exact and growth mode's
    /// cost per malloc+free pair, `watch`'s CPU over 50 processes: ab.rs) and update its section
    /// of the results.
    #[arg(long)]
    pub ab_against: Option<PathBuf>,
    /// How long each `watch` run of `--ab-against` lasts, seconds.
    #[arg(long, default_value_t = 90)]
    pub ab_watch_seconds: u64,
}

/// Debian packages the bench needs, by the program that shows each is there.
const BENCH_PACKAGES: &[(&str, &str)] = &[
    ("bpftrace", "bpftrace"),
    ("heaptrack", "heaptrack"),
    ("redis-server", "redis-server"),
    ("redis-benchmark", "redis-tools"),
    ("bpftool", "bpftool"),
];

/// Sampling distances measured on the microbenchmark.
const SAMPLE_BYTES: &[(&str, u64)] = &[("64KiB", 64 << 10), ("512KiB", 512 << 10), ("4MiB", 4 << 20)];
/// docs/benchmarks.md: what follows this line is written by hand and kept when the bench rewrites
/// the figures above it.
const ANALYSIS_MARKER: &str = "<!-- Below: written by hand, kept by `cargo xtask bench`. -->";
/// Block size of the microbenchmark's malloc calls.
const PAIR_SIZE: u64 = 64;

pub(crate) fn bench(args: BenchArgs) -> Result<()> {
    if !crate::is_root() {
        bail!("`cargo xtask bench` must run as root (it loads eBPF programs and attaches uprobes)");
    }
    crate::setup()?;
    crate::build()?;
    let out = args.out.clone().unwrap_or_else(|| root().join("docs/benchmarks.md"));
    if let Some(old) = args.ab_against.clone() {
        let seconds = args.ab_watch_seconds;
        let section = Bench::prepare(args)?.ab(&old, seconds)?;
        crate::bench_unwind::write_marked(&out, ab::BEGIN, ab::END, &section)?;
        eprintln!("xtask: bench: wrote the A/B section of {}", out.display());
        return Ok(());
    }
    let (reps, pairs, reach_blocks, reach_only, unwind_only, attach_only, python_only) = (
        args.reps,
        args.pairs,
        args.reach_blocks,
        args.reach_only,
        args.unwind_only,
        args.attach_only,
        args.python_only,
    );
    let python_iterations = args.python_iterations;
    let (pyheap_only, pyheap_objects) = (args.pyheap_only, args.pyheap_objects);
    let holds_only = args.holds_only;
    let holds_sizes = holds::Sizes {
        node_objects: args.holds_node_objects,
        jvm_records: args.holds_jvm_records,
        go_goroutines: args.holds_go_goroutines,
    };
    let (watch_only, watch_sizes) =
        (args.watch_only, watch::Sizes { minutes: args.watch_minutes, redis_requests: args.redis_requests });
    let dominators_only = args.dominators_only;
    let all = !unwind_only
        && !reach_only
        && !attach_only
        && !python_only
        && !pyheap_only
        && !holds_only
        && !watch_only
        && !dominators_only;
    if all {
        ensure_packages()?;
        Bench::prepare(args)?.run()?;
    }
    if all || unwind_only {
        let section = crate::bench_unwind::measure(reps, pairs)?;
        crate::bench_unwind::write_section(&out, &section)?;
        eprintln!("xtask: bench: wrote the stack-walk section of {}", out.display());
    }
    if all || reach_only {
        let section = reach::measure(reps.min(3), reach_blocks)?;
        crate::bench_unwind::write_marked(&out, reach::BEGIN, reach::END, &section)?;
        eprintln!("xtask: bench: wrote the reachability section of {}", out.display());
    }
    if all || attach_only {
        let section = attach::measure(reps.min(3))?;
        crate::bench_unwind::write_marked(&out, attach::BEGIN, attach::END, &section)?;
        eprintln!("xtask: bench: wrote the attach/detach section of {}", out.display());
    }
    if all || python_only {
        let section = pyhooks::measure(reps, python_iterations)?;
        crate::bench_unwind::write_marked(&out, pyhooks::BEGIN, pyhooks::END, &section)?;
        eprintln!("xtask: bench: wrote the Python frames and pymalloc section of {}", out.display());
    }
    if all || pyheap_only {
        let section = pyheap::measure(reps.min(3), pyheap_objects)?;
        crate::bench_unwind::write_marked(&out, pyheap::BEGIN, pyheap::END, &section)?;
        eprintln!("xtask: bench: wrote the Python heap census section of {}", out.display());
    }
    if all || holds_only {
        let section = holds::measure(reps.min(3), &holds_sizes)?;
        crate::bench_unwind::write_marked(&out, holds::BEGIN, holds::END, &section)?;
        eprintln!("xtask: bench: wrote the runtime heap tools section of {}", out.display());
    }
    if all || watch_only {
        let section = watch::measure(reps.min(5), &watch_sizes)?;
        crate::bench_unwind::write_marked(&out, watch::BEGIN, watch::END, &section)?;
        eprintln!("xtask: bench: wrote the watch section of {}", out.display());
    }
    if all || dominators_only {
        let section = dominators::measure(reps.min(3))?;
        crate::bench_unwind::write_marked(&out, dominators::BEGIN, dominators::END, &section)?;
        eprintln!("xtask: bench: wrote the dominators section of {}", out.display());
    }
    Ok(())
}

fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = BENCH_PACKAGES
        .iter()
        .filter(|(prog, _)| which(prog).is_none() && !Path::new("/usr/sbin").join(prog).is_file())
        .map(|(_, pkg)| *pkg)
        .collect();
    if !missing.is_empty() {
        Apt::default().install(&missing, "the tools the benchmark compares with", &[])?;
    }
    eprintln!("xtask: ok: bpftrace, heaptrack, redis-server, redis-benchmark, bpftool");
    Ok(())
}

struct Bench {
    args: BenchArgs,
    work: PathBuf,
    leaktrace: PathBuf,
    libc: PathBuf,
    pairs: PathBuf,
    hold: PathBuf,
    floor: PathBuf,
    syscalls: PathBuf,
    python: PathBuf,
    /// pairs.c built to run without arguments (PAIRS_N pairs after a 1 s pause), on the system's
    /// libc, at a path short enough for libbpf-tools memleak's `-c` (under 32 characters).
    pairs_fixed: PathBuf,
    /// libbpf-tools memleak (../shared/tools/memleak-libbpf), when present.
    memleak: Option<PathBuf>,
    /// (file offset of malloc, of free's probe) in the libc copy, and free's placement note.
    malloc_off: u64,
    free_off: u64,
    free_placement: String,
    loads: std::cell::RefCell<Vec<f64>>,
    /// Redis: the agent's median CPU share per variant, and leaktrace's coverage lines.
    redis_notes: std::cell::RefCell<(Vec<f64>, Vec<String>)>,
    /// Redis under growth mode, per run: (ns of leaktrace's eBPF programs, read/write syscalls of
    /// redis-server, page faults of redis-server, requests).
    growth_counts: std::cell::RefCell<Vec<(u64, u64, u64, u64)>>,
}

/// One measured variant: its name, the command, and the figures of each run.
struct Series {
    name: String,
    command: String,
    values: Vec<f64>,
}

impl Series {
    fn median(&self) -> f64 {
        median(&self.values)
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

impl Bench {
    fn prepare(args: BenchArgs) -> Result<Bench> {
        let work = root().join("target/bench");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(work.join("lib"))?;
        let src = root().join("xtask/bench");

        // A private copy of the libc the compiler links against.
        let libc_out = Command::new("gcc").arg("-print-file-name=libc.so.6").output()?;
        let sys_libc = std::fs::canonicalize(String::from_utf8_lossy(&libc_out.stdout).trim())
            .context("cannot find libc.so.6 (gcc -print-file-name=libc.so.6)")?;
        let libc = work.join("lib/libc.so.6");
        std::fs::copy(&sys_libc, &libc).with_context(|| format!("cannot copy {}", sys_libc.display()))?;

        let rpath = format!("-Wl,--disable-new-dtags,-rpath,{}", work.join("lib").display());
        let pairs = work.join("pairs");
        let hold = work.join("hold");
        let floor = work.join("floor");
        let syscalls = work.join("syscalls");
        for (out, file, extra) in [
            (&pairs, "pairs.c", Some(&rpath)),
            (&hold, "hold.c", Some(&rpath)),
            (&floor, "floor.c", None),
            (&syscalls, "syscalls.c", None),
        ] {
            let mut c = Command::new("gcc");
            c.args(["-O2", "-g", "-fno-omit-frame-pointer", "-Wall"]);
            if let Some(r) = extra {
                c.arg(r);
            }
            c.arg("-o").arg(out).arg(src.join(file));
            run(&mut c)?;
        }
        // memleak -c takes a command of under 32 characters and no arguments.
        let pairs_fixed = PathBuf::from(format!("/tmp/ltb-{}", std::process::id()));
        run(Command::new("gcc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-Wall"])
            .arg(format!("-DPAIRS_N={}", args.pairs))
            .arg(format!("-DPAIRS_SIZE={PAIR_SIZE}"))
            .arg("-DSTART_DELAY_MS=1000")
            .arg("-o")
            .arg(&pairs_fixed)
            .arg(src.join("pairs.c")))?;
        let memleak = Some(root().join("../shared/tools/memleak-libbpf")).filter(|p| p.is_file());
        let python = query_line("python3", &["-c", "import sys; print(sys.executable)"])
            .map(PathBuf::from)
            .context("python3 not found")?;

        let mut b = Bench {
            args,
            work,
            leaktrace: release_binary(),
            libc,
            pairs,
            hold,
            floor,
            syscalls,
            python,
            pairs_fixed,
            memleak,
            malloc_off: 0,
            free_off: 0,
            free_placement: String::new(),
            loads: Default::default(),
            redis_notes: Default::default(),
            growth_counts: Default::default(),
        };
        b.find_offsets()?;
        Ok(b)
    }

    /// Where leaktrace puts malloc's and free's entry probes in the libc copy (from its coverage
    /// line, e.g. `free+9`), as file offsets for the floor.
    fn find_offsets(&mut self) -> Result<()> {
        let out_dir = self.work.join("probe-run");
        let mut cmd = Command::new(&self.leaktrace);
        cmd.args(["record", "--out"]).arg(&out_dir).arg("--").arg(&self.pairs).args(["1000", "64"]);
        eprintln!("xtask: $ {}", show(&cmd));
        let out = cmd.stdin(Stdio::null()).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lib = self.libc.display().to_string();
        let line = stderr
            .lines()
            .find(|l| l.contains(&lib) && l.contains("]:"))
            .with_context(|| format!("leaktrace printed no coverage line for {lib}:\n{stderr}"))?;
        let funcs = line.split("]:").nth(1).unwrap_or("");
        let free = funcs
            .split_whitespace()
            .find(|t| *t == "free" || t.starts_with("free+"))
            .with_context(|| format!("no free probe in the coverage line: {line}"))?;
        let delta: u64 = free.strip_prefix("free+").map(|d| d.parse()).transpose()?.unwrap_or(0);
        self.free_placement = free.to_string();
        let malloc_delta: u64 = funcs
            .split_whitespace()
            .find_map(|t| t.strip_prefix("malloc+"))
            .map(|d| d.parse())
            .transpose()?
            .unwrap_or(0);
        self.malloc_off = symbol_file_offset(&self.libc, "malloc")? + malloc_delta;
        self.free_off = symbol_file_offset(&self.libc, "free")? + delta;
        Ok(())
    }

    fn run(&self) -> Result<()> {
        let started = Instant::now();
        let waited = wait_for_quiet(self.args.max_load, Duration::from_secs(self.args.max_wait));
        let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();

        let micro = self.micro()?;
        let stats = self.kernel_breakdown().unwrap_or_else(|e| {
            eprintln!("xtask: bench: per-program kernel cost not measured: {e:#}");
            Vec::new()
        });
        let (redis, redis_cpu) = self.redis()?;
        let syscall_ns = self.syscall_slow_path()?;
        let python = self.python_workload()?;
        let agent = self.agent_cost()?;

        let doc = self.render(&Results {
            date,
            waited,
            micro,
            stats,
            redis,
            redis_cpu,
            syscall_ns,
            python,
            agent,
            elapsed: started.elapsed(),
        });
        let out = self.args.out.clone().unwrap_or_else(|| root().join("docs/benchmarks.md"));
        // The hand-written analysis after the marker is kept from one run to the next.
        let kept = std::fs::read_to_string(&out)
            .ok()
            .and_then(|old| old.find(ANALYSIS_MARKER).map(|i| old[i..].to_string()))
            .unwrap_or_else(|| format!("{ANALYSIS_MARKER}\n"));
        let doc = format!("{doc}{kept}");
        std::fs::write(&out, doc).with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!("xtask: bench: wrote {}", out.display());
        Ok(())
    }

    fn note_load(&self) {
        if let Some(l) = loadavg() {
            self.loads.borrow_mut().push(l);
        }
    }

    fn leaktrace_launch(&self, mode: &[&str], tag: &str) -> Command {
        let mut c = Command::new(&self.leaktrace);
        c.args(["record", "--interval", "1s", "--out"]).arg(self.work.join(format!("rec-{tag}"))).args(mode).arg("--");
        c
    }
}

/// (min, max) of a series' runs over its median.
fn spread(x: &Series) -> (f64, f64) {
    let m = x.median();
    let min = x.values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = x.values.iter().copied().fold(0.0, f64::max);
    (min / m, max / m)
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "**no**" }
}

fn r_libc_version() -> String {
    query_line("ldd", &["--version"]).unwrap_or_default()
}

/// Growth mode's cost per redis request, from counts rather than throughput (which the machine's
/// noise swamps): the eBPF programs' own time (kernel.bpf_stats_enabled, all of leaktrace's
/// programs, whichever process they ran for), plus the tracing path that every system call takes
/// while syscall tracepoints are attached (getppid microbenchmark) times redis-server's
/// read/write system calls, doubled to cover the calls /proc/PID/io does not count.
struct GrowthModel {
    /// ns of eBPF program time per request.
    prog_ns: f64,
    syscalls: f64,
    faults: f64,
    /// ns added to each syscall by the tracing path.
    syscall_extra_ns: f64,
    /// ns of redis-server CPU per request, untraced (median).
    request_ns: f64,
    /// request_ns / (request_ns + added).
    throughput: f64,
}

impl Bench {
    fn growth_model(&self, r: &Results) -> GrowthModel {
        let runs = self.growth_counts.borrow();
        let req: u64 = runs.iter().map(|x| x.3).sum::<u64>().max(1);
        let per = |f: fn(&(u64, u64, u64, u64)) -> u64| runs.iter().map(f).sum::<u64>() as f64 / req as f64;
        let (prog_ns, syscalls, faults) = (per(|x| x.0), per(|x| x.1), per(|x| x.2));
        let syscall_extra_ns = (r.syscall_ns.1 - r.syscall_ns.0).max(0.0);
        let request_ns = 1e9 / r.redis_cpu[0].median();
        // Doubled: epoll_wait and other calls are not in syscr/syscw (at most one epoll_wait per
        // read in an event loop).
        let added = prog_ns + 2.0 * syscalls * syscall_extra_ns;
        GrowthModel {
            prog_ns,
            syscalls,
            faults,
            syscall_extra_ns,
            request_ns,
            throughput: request_ns / (request_ns + added),
        }
    }
}

struct Results {
    date: String,
    waited: String,
    micro: Vec<Series>,
    stats: Vec<(String, u64, u64)>,
    redis: Vec<Series>,
    /// The same runs: requests per second of redis-server's CPU time.
    redis_cpu: Vec<Series>,
    /// ns per getppid(): untraced, and with growth mode's syscall tracepoints attached.
    syscall_ns: (f64, f64),
    python: Vec<Series>,
    agent: AgentCost,
    elapsed: Duration,
}

struct AgentCost {
    command: String,
    live: u64,
    fill_s: f64,
    cpu_at_held: f64,
    cpu_per_s_steady: f64,
    rss_kib: u64,
    hwm_kib: u64,
    /// (name, type, max_entries, bytes_memlock)
    maps: Vec<(String, String, u64, u64)>,
}
