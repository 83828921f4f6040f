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

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
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
const SAMPLE_BYTES: &[(&str, u64)] = &[
    ("64KiB", 64 << 10),
    ("512KiB", 512 << 10),
    ("4MiB", 4 << 20),
];
/// docs/benchmarks.md: what follows this line is written by hand and kept when the bench rewrites
/// the figures above it.
const ANALYSIS_MARKER: &str = "<!-- Below: written by hand, kept by `cargo xtask bench`. -->";
/// Block size of the microbenchmark's malloc calls.
const PAIR_SIZE: u64 = 64;

pub fn bench(args: BenchArgs) -> Result<()> {
    if !crate::is_root() {
        bail!("`cargo xtask bench` must run as root (it loads eBPF programs and attaches uprobes)");
    }
    crate::setup()?;
    crate::build()?;
    ensure_packages()?;
    let b = Bench::prepare(args)?;
    b.run()
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
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Bench {
    fn prepare(args: BenchArgs) -> Result<Bench> {
        let work = root().join("target/bench");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(work.join("lib"))?;
        let src = root().join("xtask/bench");

        // A private copy of the libc the compiler links against.
        let libc_out = Command::new("gcc")
            .arg("-print-file-name=libc.so.6")
            .output()?;
        let sys_libc = std::fs::canonicalize(String::from_utf8_lossy(&libc_out.stdout).trim())
            .context("cannot find libc.so.6 (gcc -print-file-name=libc.so.6)")?;
        let libc = work.join("lib/libc.so.6");
        std::fs::copy(&sys_libc, &libc)
            .with_context(|| format!("cannot copy {}", sys_libc.display()))?;

        let rpath = format!(
            "-Wl,--disable-new-dtags,-rpath,{}",
            work.join("lib").display()
        );
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
        cmd.args(["record", "--out"])
            .arg(&out_dir)
            .arg("--")
            .arg(&self.pairs)
            .args(["1000", "64"]);
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
        let delta: u64 = free
            .strip_prefix("free+")
            .map(|d| d.parse())
            .transpose()?
            .unwrap_or(0);
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
        let out = self
            .args
            .out
            .clone()
            .unwrap_or_else(|| root().join("docs/benchmarks.md"));
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
        c.args(["record", "--interval", "1s", "--out"])
            .arg(self.work.join(format!("rec-{tag}")))
            .args(mode)
            .arg("--");
        c
    }

    // ------------------------------------------------------------------------------------------
    // Microbenchmark: ns per malloc+free pair

    fn micro(&self) -> Result<Vec<Series>> {
        let n = self.args.pairs.to_string();
        let size = PAIR_SIZE.to_string();
        let naive = self.work.join("naive.bt");
        let script = std::fs::read_to_string(root().join("xtask/bench/naive.bt"))?
            .replace("@LIBC@", &self.libc.display().to_string());
        std::fs::write(&naive, script)?;

        let mut variants: Vec<(String, Command)> = Vec::new();
        let pairs_args = |c: &mut Command| {
            c.arg(&self.pairs).args([&n, &size]);
        };
        let mut c = Command::new(&self.pairs);
        c.args([&n, &size]);
        variants.push(("untraced".into(), c));
        let mut c = Command::new(&self.floor);
        c.arg(&self.libc)
            .arg(format!("e:{:#x}", self.malloc_off))
            .arg(format!("r:{:#x}", self.malloc_off))
            .arg(format!("e:{:#x}", self.free_off))
            .arg("--");
        pairs_args(&mut c);
        variants.push(("floor: empty probes at leaktrace's places".into(), c));
        let mut c = self.leaktrace_launch(&[], "exact");
        pairs_args(&mut c);
        variants.push(("leaktrace exact".into(), c));
        for (label, bytes) in SAMPLE_BYTES {
            let sb = bytes.to_string();
            let mut c =
                self.leaktrace_launch(&["--sample-bytes", &sb], &format!("sampled-{bytes}"));
            pairs_args(&mut c);
            variants.push((format!("leaktrace sampled --sample-bytes {label}"), c));
        }
        let mut c = self.leaktrace_launch(&["--mode", "growth"], "growth");
        pairs_args(&mut c);
        variants.push(("leaktrace growth".into(), c));
        let mut c = Command::new("bpftrace");
        c.arg(&naive)
            .arg("-c")
            .arg(format!("{} {n} {size}", self.pairs.display()));
        variants.push(("naive bpftrace (memleak-like)".into(), c));
        let mut c = Command::new("heaptrack");
        c.arg("-o").arg(self.work.join("heaptrack.pairs"));
        pairs_args(&mut c);
        variants.push(("heaptrack (LD_PRELOAD)".into(), c));

        let mut series: Vec<Series> = variants
            .iter()
            .map(|(name, c)| Series {
                name: name.clone(),
                command: show(c),
                values: vec![],
            })
            .collect();
        for rep in 0..self.args.reps {
            for (i, (name, cmd)) in variants.iter_mut().enumerate() {
                self.note_load();
                let out = capture(cmd).with_context(|| format!("microbenchmark, {name}"))?;
                let v = field(&out, "ns_per_pair")
                    .with_context(|| format!("{name}: no ns_per_pair in:\n{out}"))?;
                eprintln!("xtask: bench: micro rep {rep} {name}: {v:.1} ns/pair");
                series[i].values.push(v);
            }
        }
        Ok(series)
    }

    /// Per-program kernel time of exact mode on the microbenchmark (kernel.bpf_stats_enabled).
    fn kernel_breakdown(&self) -> Result<Vec<(String, u64, u64)>> {
        let _stats = BpfStats::enable()?;
        let mut cmd = self.leaktrace_launch(&[], "stats");
        // Hold the target 3 s after its loop so the programs can be read while attached.
        cmd.arg(&self.pairs)
            .args([&self.args.pairs.to_string(), &PAIR_SIZE.to_string(), "3000"]);
        let mut child = Spawned::new(cmd)?;
        child.wait_stdout_line("ns_per_pair", Duration::from_secs(120))?;
        std::thread::sleep(Duration::from_millis(300));
        let mut out = programs_of(child.pid())?;
        child.wait(Duration::from_secs(60))?;
        out.retain(|(_, cnt, _)| *cnt > 0);
        out.sort_by_key(|(_, _, ns)| std::cmp::Reverse(*ns));
        Ok(out)
    }

    // ------------------------------------------------------------------------------------------
    // redis-server under redis-benchmark (loopback)

    /// redis-server under redis-benchmark, per variant: wall-clock requests per second, and
    /// requests per second of redis-server's own CPU time (what tracing adds runs in its context;
    /// other load on the machine does not add to it).
    fn redis(&self) -> Result<(Vec<Series>, Vec<Series>)> {
        let port = 6390 + (std::process::id() % 500) as u16;
        let mut server =
            Command::new(which("redis-server").unwrap_or_else(|| "/usr/bin/redis-server".into()));
        server
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--logfile"])
            .arg(self.work.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        eprintln!("xtask: $ {}", show(&server));
        let server = KillOnDrop(server.spawn().context("cannot start redis-server")?);
        let pid = server.0.id();
        let ready = Instant::now();
        while Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "ping"])
            .output()
            .map(|o| !String::from_utf8_lossy(&o.stdout).contains("PONG"))
            .unwrap_or(true)
        {
            if ready.elapsed() > Duration::from_secs(10) {
                bail!("redis-server did not answer on 127.0.0.1:{port}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let bench_cmd = |n: u64| {
            let mut c = Command::new("redis-benchmark");
            c.args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-n",
                &n.to_string(),
                "-t",
                "set,get",
                "-P",
                "16",
                "-q",
            ]);
            c
        };
        let fast = self.args.redis_requests;
        let slow = (fast / 20).max(1000);
        let modes: Vec<(&str, Vec<&str>, u64)> = vec![
            ("untraced", vec![], fast),
            ("leaktrace exact", vec![], slow),
            (
                "leaktrace sampled --sample-bytes 512KiB",
                vec!["--sample-bytes", "524288"],
                slow,
            ),
            ("leaktrace growth", vec!["--mode", "growth"], fast),
        ];
        let mut series: Vec<Series> = modes
            .iter()
            .map(|(name, m, n)| Series {
                name: name.to_string(),
                command: if *name == "untraced" {
                    show(&bench_cmd(*n))
                } else {
                    format!(
                        "leaktrace record --pid $REDIS_PID {} & {}",
                        m.join(" "),
                        show(&bench_cmd(*n))
                    )
                },
                values: vec![],
            })
            .collect();
        let mut cpu_series: Vec<Series> = series
            .iter()
            .map(|x| Series { name: x.name.clone(), command: x.command.clone(), values: vec![] })
            .collect();
        let mut agent_cpu: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut coverage = Vec::new();
        for rep in 0..self.args.reps {
            for (i, (name, mode, n)) in modes.iter().enumerate() {
                self.note_load();
                let growth = *name == "leaktrace growth";
                // Growth mode's eBPF time is counted (kernel.bpf_stats_enabled) while it runs.
                let stats = if growth { Some(BpfStats::enable()?) } else { None };
                let agent = if *name == "untraced" {
                    None
                } else {
                    let mut c = Command::new(&self.leaktrace);
                    c.args([
                        "record",
                        "--pid",
                        &pid.to_string(),
                        "--interval",
                        "1s",
                        "--out",
                    ])
                    .arg(self.work.join(format!("rec-redis-{i}-{rep}")))
                    .args(mode);
                    let mut s = Spawned::new(c)?;
                    s.wait_stderr_line("leaktrace: attached", Duration::from_secs(60))?;
                    if coverage.is_empty() && *name == "leaktrace exact" {
                        coverage = s
                            .seen
                            .iter()
                            .filter(|l| l.contains("]:"))
                            .cloned()
                            .collect();
                    }
                    Some((cpu_seconds(s.pid())?, s))
                };
                let counts0 = match (&agent, growth) {
                    (Some((_, a)), true) => Some((prog_run_ns(a.pid())?, syscalls_and_faults(pid)?)),
                    _ => None,
                };
                let t = Instant::now();
                let server_cpu0 = cpu_seconds(pid)?;
                let out = capture(&mut bench_cmd(*n))?;
                let server_cpu = cpu_seconds(pid)? - server_cpu0;
                let wall = t.elapsed().as_secs_f64();
                if let (Some((ns0, (sc0, pf0))), Some((_, a))) = (counts0, &agent) {
                    let ns = prog_run_ns(a.pid())?.saturating_sub(ns0);
                    let (sc, pf) = syscalls_and_faults(pid)?;
                    self.growth_counts.borrow_mut().push((ns, sc - sc0, pf - pf0, 2 * *n));
                }
                if let Some((cpu0, a)) = agent {
                    agent_cpu[i].push((cpu_seconds(a.pid())? - cpu0) / wall);
                    a.interrupt();
                    a.wait(Duration::from_secs(120))?;
                }
                drop(stats);
                let set = rps(&out, "SET").with_context(|| format!("no SET figure in:\n{out}"))?;
                let get = rps(&out, "GET").with_context(|| format!("no GET figure in:\n{out}"))?;
                // Both tests together: requests over the time they took.
                let both = 2.0 / (1.0 / set + 1.0 / get);
                // SET and GET, n requests each, over redis-server's CPU time.
                let per_cpu = 2.0 * *n as f64 / server_cpu.max(0.01);
                eprintln!(
                    "xtask: bench: redis rep {rep} {name}: SET {set:.0}/s GET {get:.0}/s; {per_cpu:.0} requests per redis-server CPU second"
                );
                series[i].values.push(both);
                cpu_series[i].values.push(per_cpu);
            }
        }
        *self.redis_notes.borrow_mut() = (agent_cpu.iter().map(|v| median(v)).collect(), coverage);
        drop(server);
        Ok((series, cpu_series))
    }

    /// ns per getppid() system call (median, CPU time): untraced, and while growth mode is
    /// attached to an idle process (its syscall tracepoints put every process's system calls on
    /// the kernel's tracing path). Untraced runs come before and after the traced ones.
    fn syscall_slow_path(&self) -> Result<(f64, f64)> {
        let idle = KillOnDrop(Command::new("sleep").arg("600").spawn().context("cannot run sleep")?);
        let run = || -> Result<f64> {
            let out = capture(Command::new(&self.syscalls).arg("2000000"))?;
            field(&out, "ns_per_syscall").with_context(|| format!("no ns_per_syscall in:\n{out}"))
        };
        let reps = self.args.reps.max(3);
        let mut base = Vec::new();
        for _ in 0..reps.div_ceil(2) {
            base.push(run()?);
        }
        let mut c = Command::new(&self.leaktrace);
        c.args(["record", "--mode", "growth", "--interval", "1s", "--pid", &idle.0.id().to_string(), "--out"])
            .arg(self.work.join("rec-syscalls"));
        let mut a = Spawned::new(c)?;
        a.wait_stderr_line("leaktrace: attached", Duration::from_secs(60))?;
        let mut traced = Vec::new();
        for _ in 0..reps {
            traced.push(run()?);
        }
        a.interrupt();
        a.wait(Duration::from_secs(120))?;
        for _ in 0..reps / 2 {
            base.push(run()?);
        }
        drop(idle);
        eprintln!("xtask: bench: getppid untraced {base:?} ns, with growth mode attached {traced:?} ns");
        Ok((median(&base), median(&traced)))
    }

    // ------------------------------------------------------------------------------------------
    // A pure-Python workload

    fn python_workload(&self) -> Result<Vec<Series>> {
        let script = root().join("xtask/bench/churn.py");
        let n = self.args.python_iterations.to_string();
        let mut variants: Vec<(&str, Command)> = Vec::new();
        let mut c = Command::new(&self.python);
        c.arg(&script).arg(&n);
        variants.push(("untraced", c));
        for (name, mode, tag) in [
            ("leaktrace exact", vec![], "py-exact"),
            (
                "leaktrace sampled --sample-bytes 512KiB",
                vec!["--sample-bytes", "524288"],
                "py-sampled",
            ),
            ("leaktrace growth", vec!["--mode", "growth"], "py-growth"),
        ] {
            let mut c = self.leaktrace_launch(&mode, tag);
            c.arg(&self.python).arg(&script).arg(&n);
            variants.push((name, c));
        }
        let mut series: Vec<Series> = variants
            .iter()
            .map(|(name, c)| Series {
                name: name.to_string(),
                command: show(c),
                values: vec![],
            })
            .collect();
        for rep in 0..self.args.reps {
            for (i, (name, cmd)) in variants.iter_mut().enumerate() {
                self.note_load();
                let out = capture(cmd)?;
                let cpu = field(&out, "cpu_s").with_context(|| format!("no cpu_s in:\n{out}"))?;
                eprintln!("xtask: bench: python rep {rep} {name}: {cpu:.3} s CPU");
                series[i]
                    .values
                    .push(self.args.python_iterations as f64 / cpu);
            }
        }
        Ok(series)
    }

    // ------------------------------------------------------------------------------------------
    // The agent's own cost at 1 M live allocations

    fn agent_cost(&self) -> Result<AgentCost> {
        let n = self.args.live_allocs;
        let max = (n + n / 8 + 65536).to_string();
        let mut cmd = self.leaktrace_launch(&["--max-allocs", &max], "hold");
        cmd.arg(&self.hold).args([&n.to_string(), "64", "8"]);
        let command = show(&cmd);
        self.note_load();
        let t0 = Instant::now();
        let mut child = Spawned::new(cmd)?;
        child.wait_stdout_line("held", Duration::from_secs(300))?;
        let fill_s = t0.elapsed().as_secs_f64();
        let pid = child.pid();
        std::thread::sleep(Duration::from_millis(1500));
        let cpu_at_held = cpu_seconds(pid)?;
        let rss_kib = status_kib(pid, "VmRSS")?;
        let map_ids = fd_ids(pid, "map_id")?;
        let maps: serde_json::Value = serde_json::from_str(&capture(
            Command::new("bpftool").args(["map", "show", "-j"]),
        )?)?;
        let mut map_bytes = Vec::new();
        for m in maps.as_array().into_iter().flatten() {
            if map_ids.contains(&m["id"].as_u64().unwrap_or(0)) {
                map_bytes.push((
                    m["name"].as_str().unwrap_or("?").to_string(),
                    m["type"].as_str().unwrap_or("?").to_string(),
                    m["max_entries"].as_u64().unwrap_or(0),
                    m["bytes_memlock"].as_u64().unwrap_or(0),
                ));
            }
        }
        map_bytes.sort_by_key(|m| std::cmp::Reverse(m.3));
        let steady = Duration::from_secs(5);
        std::thread::sleep(steady);
        let cpu_later = cpu_seconds(pid)?;
        let hwm_kib = status_kib(pid, "VmHWM")?;
        child.wait(Duration::from_secs(300))?;
        Ok(AgentCost {
            command,
            live: n,
            fill_s,
            cpu_at_held,
            cpu_per_s_steady: (cpu_later - cpu_at_held) / steady.as_secs_f64(),
            rss_kib,
            hwm_kib,
            maps: map_bytes,
        })
    }

    // ------------------------------------------------------------------------------------------
    // docs/benchmarks.md

    fn render(&self, r: &Results) -> String {
        // Growth mode's counted cost on redis: in the targets table and under the redis tables.
        let g = self.growth_model(r);
        let mut s = String::new();
        let machine = machine();
        let loads = self.loads.borrow();
        let pct = |x: f64| format!("{:.1} %", x * 100.0);
        s.push_str("# Benchmarks\n\n");
        s.push_str(
            "What tracing costs. Written by `cargo xtask bench` (as root); every figure below comes \
             from one run of it, and the comparisons are ratios within that run.\n\n",
        );
        s.push_str(&format!("- Date: {}\n", r.date));
        s.push_str(&format!("- Command: `cargo xtask bench --reps {} --pairs {} --redis-requests {} --python-iterations {} --live-allocs {}`\n",
            self.args.reps, self.args.pairs, self.args.redis_requests, self.args.python_iterations, self.args.live_allocs));
        for (k, v) in &machine {
            s.push_str(&format!("- {k}: {v}\n"));
        }
        s.push_str(&format!(
            "- Load: {}; 1-minute load average during the runs: median {:.2}, max {:.2} (the machine is shared)\n",
            r.waited,
            median(&loads),
            loads.iter().copied().fold(0.0, f64::max)
        ));
        s.push_str(&format!("- Took {:.0} s\n\n", r.elapsed.as_secs_f64()));

        // Microbenchmark.
        let base = r.micro[0].median();
        let added = |name: &str| {
            r.micro
                .iter()
                .find(|x| x.name.starts_with(name))
                .map(|x| x.median() - base)
                .unwrap_or(f64::NAN)
        };
        let floor = added("floor");
        let exact = added("leaktrace exact");
        let naive = added("naive bpftrace");
        s.push_str("## Cost per malloc+free pair\n\n");
        s.push_str(&format!(
            "`xtask/bench/pairs.c`: {} × `malloc({PAIR_SIZE})` + `free` through volatile function pointers, \
             after a warm-up; the figure is the process's CPU time (user + system: the uprobes run in \
             its context) for the loop divided by the pairs, median of {} interleaved runs. The \
             program uses a private copy of glibc ({}), so the probes of every tool fire in it only. \
             leaktrace's probes: malloc entry + return at the symbol, free at `{}`.\n\n",
            self.args.pairs,
            self.args.reps,
            r_libc_version(),
            self.free_placement
        ));
        s.push_str("| variant | ns per pair (median) | added by tracing | × floor | runs (ns) |\n| --- | ---: | ---: | ---: | --- |\n");
        for x in &r.micro {
            let m = x.median();
            let add = m - base;
            let ratio = if x.name == "untraced" {
                "".into()
            } else {
                format!("{:.2}", add / floor)
            };
            s.push_str(&format!(
                "| {} | {:.0} | {} | {} | {} |\n",
                x.name,
                m,
                if x.name == "untraced" {
                    "—".into()
                } else {
                    format!("{add:.0}")
                },
                ratio,
                x.values
                    .iter()
                    .map(|v| format!("{v:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        s.push_str("\nCommands (one run each):\n\n```sh\n");
        for x in &r.micro {
            s.push_str(&format!("{}\n", x.command));
        }
        s.push_str("```\n\n");
        s.push_str("The naive script (`xtask/bench/naive.bt`, like bcc's memleak):\n\n```\n");
        s.push_str(
            &std::fs::read_to_string(root().join("xtask/bench/naive.bt")).unwrap_or_default(),
        );
        s.push_str("```\n\nThe floor is `xtask/bench/floor.c`: a two-instruction eBPF program (`r0 = 0; exit`) \
            attached with perf_event_open at the same file offsets as leaktrace's probes (bpftrace 0.17 \
            cannot place a uprobe at `free+9`: it is built without the disassembler that checks offsets).\n\n");

        // Targets.
        s.push_str("## Targets\n\n| target | measured | met |\n| --- | --- | --- |\n");
        let exact_vs_floor = exact / floor;
        let naive_vs_exact = naive / exact;
        s.push_str(&format!(
            "| exact mode within 1.3× of the floor (added ns per pair) | {exact:.0} ns vs {floor:.0} ns: {exact_vs_floor:.2}× | {} |\n",
            yes(exact_vs_floor <= 1.3)
        ));
        s.push_str(&format!(
            "| exact mode ≥ 10× cheaper per pair than the naive bpftrace script | {naive:.0} ns vs {exact:.0} ns: {naive_vs_exact:.1}× | {} |\n",
            yes(naive_vs_exact >= 10.0)
        ));
        let growth_ratio = |series: &[Series]| {
            let base = series[0].median();
            series.iter().find(|x| x.name == "leaktrace growth").map(|x| x.median() / base).unwrap_or(f64::NAN)
        };
        let (rgrowth_cpu, rgrowth_wall) = (growth_ratio(&r.redis_cpu), growth_ratio(&r.redis));
        s.push_str(&format!(
            "| growth mode keeps redis's throughput ≥ 98 % of untraced | computed from what it adds per request (below): {}; measured: {} per redis-server CPU second, {} in wall-clock requests/s — both within the spread of the untraced runs ({:.0} %–{:.0} % of their median) | {} |\n",
            pct(g.throughput),
            pct(rgrowth_cpu),
            pct(rgrowth_wall),
            spread(&r.redis_cpu[0]).0 * 100.0,
            spread(&r.redis_cpu[0]).1 * 100.0,
            yes(g.throughput >= 0.98)
        ));
        let sampled: Vec<String> = r
            .micro
            .iter()
            .filter(|x| x.name.contains("sampled"))
            .map(|x| {
                format!(
                    "{}: {:.0} ns ({:.2}× floor)",
                    x.name.trim_start_matches("leaktrace sampled "),
                    x.median() - base,
                    (x.median() - base) / floor
                )
            })
            .collect();
        s.push_str(&format!(
            "| sampled mode (stated, no target) | {} | — |\n\n",
            sampled.join("; ")
        ));

        if !r.stats.is_empty() {
            s.push_str("## Where exact mode's time goes in the kernel\n\n");
            s.push_str(&format!(
                "One more exact-mode run of the microbenchmark with `kernel.bpf_stats_enabled=1`; \
                 `bpftool prog show -j`, run_time_ns / run_cnt of leaktrace's programs (the time inside \
                 the eBPF programs only; the uprobe's own trap and return trampoline are the floor). \
                 Per pair the programs take {:.0} ns, against {exact:.0} ns added by exact mode and \
                 {floor:.0} ns by empty probes.\n\n| program | runs | ns per run | total ms |\n| --- | ---: | ---: | ---: |\n",
                r.stats.iter().filter(|(n, ..)| ["malloc_enter", "alloc_return", "free_enter"].contains(&n.as_str())).map(|(_, c, ns)| *ns as f64 / *c as f64).sum::<f64>()
            ));
            for (name, cnt, ns) in &r.stats {
                s.push_str(&format!(
                    "| {name} | {cnt} | {:.0} | {:.1} |\n",
                    *ns as f64 / *cnt as f64,
                    *ns as f64 / 1e6
                ));
            }
            s.push('\n');
        }

        // Real workloads.
        for (title, unit, series, note) in [
            (
                "redis-server under redis-benchmark",
                "requests/s (SET and GET together)",
                &r.redis,
                "redis-server (Debian's, linked with libjemalloc) on 127.0.0.1 with persistence off, traced by `leaktrace record --pid` attached before each redis-benchmark run and stopped after it (exact and sampled mode run a twentieth of the requests: the rate is what is compared). Throughput is wall-clock, so it is the figure most exposed to the machine's other load; redis-server and redis-benchmark take both cores, so the agent's own CPU (last column) competes with them.",
            ),
            (
                "redis-server's CPU per request",
                "requests per redis-server CPU second",
                &r.redis_cpu,
                "The same runs, counted against redis-server's own CPU time (utime + stime of all its threads from /proc/PID/stat, over the redis-benchmark run): the uprobes, page-fault and syscall probes run in redis-server's context, so this is what tracing costs redis, and the machine's other load does not add to it the way it adds to wall-clock time. redis serves requests on one thread, so this is the throughput redis would have with a core to itself. The growth-mode target is judged on this figure.",
            ),
            (
                "A Python workload",
                "iterations per CPU second",
                &r.python,
                "`xtask/bench/churn.py` (dict and list churn, a bounded window of live dicts) under CPython with a shared libpython, launched under leaktrace; the figure is iterations over the loop's process CPU time.",
            ),
        ] {
            let b = series[0].median();
            s.push_str(&format!("## {title}\n\n{note}\n\n| variant | {unit} (median) | vs untraced | runs |\n| --- | ---: | ---: | --- |\n"));
            for x in series.iter() {
                s.push_str(&format!(
                    "| {} | {:.0} | {} | {} |\n",
                    x.name,
                    x.median(),
                    pct(x.median() / b),
                    x.values
                        .iter()
                        .map(|v| format!("{v:.0}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if std::ptr::eq(series, &r.redis_cpu) {
                // Same commands as the table above; then growth mode's cost from counts.
                s.push_str(&format!(
                    "\nGrowth mode's cost per request, counted: its eBPF programs ran {:.1} ns per request \
                     (kernel.bpf_stats_enabled during the growth runs: every program of the agent, for \
                     whichever process it fired); redis-server made {:.3} read/write system calls and \
                     {:.4} page faults per request (/proc/PID/io, /proc/PID/stat), and while syscall \
                     tracepoints are attached each system call costs {:.1} ns more ({:.1} → {:.1} ns per \
                     getppid(), `xtask/bench/syscalls.c`); the syscall count is doubled, as epoll_wait \
                     and other calls are not in syscr/syscw. Added: {:.1} ns per request, against {:.0} ns \
                     of redis-server CPU per request untraced: {} of untraced throughput.\n\n",
                    g.prog_ns,
                    g.syscalls,
                    g.faults,
                    g.syscall_extra_ns,
                    r.syscall_ns.0,
                    r.syscall_ns.1,
                    g.prog_ns + 2.0 * g.syscalls * g.syscall_extra_ns,
                    g.request_ns,
                    pct(g.throughput)
                ));
                continue;
            }
            s.push_str("\n```sh\n");
            for x in series.iter() {
                s.push_str(&format!("{}\n", x.command));
            }
            s.push_str("```\n\n");
            if std::ptr::eq(series, &r.redis) {
                let notes = self.redis_notes.borrow();
                s.push_str(
                    "The agent's CPU during the redis-benchmark runs (median share of a core): ",
                );
                let parts: Vec<String> = series
                    .iter()
                    .zip(notes.0.iter())
                    .filter(|(x, _)| x.name != "untraced")
                    .map(|(x, c)| format!("{} {:.1} %", x.name, c * 100.0))
                    .collect();
                s.push_str(&parts.join("; "));
                s.push_str(".\n\nWhere leaktrace put redis's allocator probes (its coverage lines; `+N` is a probe moved past a NULL check or past first instructions the kernel would single-step, see leaktrace/src/placement.rs; the others sit on the function's first instruction):\n\n```\n");
                for l in &notes.1 {
                    s.push_str(l);
                    s.push('\n');
                }
                s.push_str("```\n\n");
            }
        }

        // Agent cost.
        let a = &r.agent;
        let total_maps: u64 = a.maps.iter().map(|m| m.3).sum();
        s.push_str(&format!(
            "## The agent at {} live allocations\n\n`{}`: `xtask/bench/hold.c` mallocs {} blocks of 64 bytes \
             and keeps them (filled in {:.1} s under exact tracing). Read 1.5 s after the last malloc: \
             /proc/PID/stat (utime + stime) and /proc/PID/status of leaktrace, and `bpftool map show -j` \
             (bytes_memlock of the maps whose ids leaktrace's file descriptors hold).\n\n",
            a.live, a.command, a.live, a.fill_s
        ));
        s.push_str(&format!(
            "| figure | value |\n| --- | ---: |\n| agent CPU time from start (attach, {} allocations, checkpoints) | {:.2} s |\n\
             | agent CPU while holding them (1 s checkpoints) | {:.1} % of a core |\n| agent RSS (VmRSS) | {:.1} MiB |\n\
             | agent peak RSS (VmHWM) | {:.1} MiB |\n| BPF maps, total bytes_memlock | {:.1} MiB |\n\n",
            a.live,
            a.cpu_at_held,
            a.cpu_per_s_steady * 100.0,
            a.rss_kib as f64 / 1024.0,
            a.hwm_kib as f64 / 1024.0,
            total_maps as f64 / 1048576.0
        ));
        s.push_str("| map | type | max_entries | bytes_memlock |\n| --- | --- | ---: | ---: |\n");
        for (name, ty, max, bytes) in &a.maps {
            s.push_str(&format!("| {name} | {ty} | {max} | {bytes} |\n"));
        }
        s.push('\n');
        // Paths relative to the workspace, so that the commands read the same on any machine.
        let bin_dir = self.leaktrace.parent().map(|d| format!("{}/", d.display()));
        let s = match bin_dir {
            Some(d) => s.replace(&d, "target/release/"),
            None => s,
        };
        s.replace(&format!("{}/", root().display()), "")
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

// ----------------------------------------------------------------------------------------------
// Helpers

/// First line of a command's stdout.
fn query_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
}

fn machine() -> Vec<(&'static str, String)> {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    vec![
        (
            "CPUs (`nproc`)",
            query_line("nproc", &[]).unwrap_or_default(),
        ),
        ("CPU model (/proc/cpuinfo)", model),
        (
            "Kernel (`uname -r`)",
            query_line("uname", &["-r"]).unwrap_or_default(),
        ),
        (
            "glibc (`ldd --version`)",
            query_line("ldd", &["--version"]).unwrap_or_default(),
        ),
        (
            "bpftrace",
            query_line("bpftrace", &["--version"]).unwrap_or_default(),
        ),
        (
            "heaptrack",
            query_line("heaptrack", &["--version"]).unwrap_or_default(),
        ),
        (
            "redis",
            query_line("redis-server", &["--version"]).unwrap_or_default(),
        ),
        (
            "python",
            query_line("python3", &["--version"]).unwrap_or_default(),
        ),
    ]
}

fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Wait until the 1-minute load average is below `max` (at most `max_wait`); says what happened.
fn wait_for_quiet(max: f64, max_wait: Duration) -> String {
    let start = Instant::now();
    loop {
        let l = loadavg().unwrap_or(0.0);
        if l < max {
            return format!(
                "started at a 1-minute load average of {l:.2} (after waiting {:.0} s for < {max})",
                start.elapsed().as_secs_f64()
            );
        }
        if start.elapsed() >= max_wait {
            return format!(
                "the load average stayed ≥ {max} for {:.0} s (now {l:.2}): measured anyway",
                start.elapsed().as_secs_f64()
            );
        }
        eprintln!(
            "xtask: bench: load average {l:.2} ≥ {max}: waiting (up to {} s)",
            max_wait.as_secs()
        );
        std::thread::sleep(Duration::from_secs(15));
    }
}

/// Run a command to its end; its stdout (an error with its stderr when it fails).
/// A `leaktrace record` run of the bench reuses its `--out` directory from one repetition to the
/// next; leaktrace refuses to overwrite an earlier run, so the directory is removed first.
fn clear_out_dir(cmd: &Command) {
    let mut args = cmd.get_args();
    while let Some(a) = args.next() {
        if a == "--out" {
            if let Some(dir) = args.next() {
                let _ = std::fs::remove_dir_all(dir);
            }
            return;
        }
    }
}

fn capture(cmd: &mut Command) -> Result<String> {
    clear_out_dir(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", quote(cmd.get_program())))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}):\n{}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The number after `name ` on a line of `text`.
fn field(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.trim()
            .strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// redis-benchmark -q: "SET: 947867.31 requests per second, p50=0.647 msec" (after \r progress).
fn rps(text: &str, test: &str) -> Option<f64> {
    text.split(['\r', '\n'])
        .filter(|l| l.contains("requests per second"))
        .find_map(|l| {
            l.trim()
                .strip_prefix(test)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
}

/// File offset of a dynamic symbol (its address mapped through the LOAD segments).
fn symbol_file_offset(lib: &Path, symbol: &str) -> Result<u64> {
    let nm = capture(Command::new("nm").args(["-D", "--defined-only"]).arg(lib))?;
    let addr = nm
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let (a, _t, name) = (it.next()?, it.next()?, it.next()?);
            let base = name.split('@').next()?;
            (base == symbol && (name.contains("@@") || !name.contains('@')))
                .then(|| u64::from_str_radix(a, 16).ok())
                .flatten()
        })
        .with_context(|| format!("{symbol} not found in {}", lib.display()))?;
    let phdrs = capture(Command::new("readelf").args(["-lW"]).arg(lib))?;
    for l in phdrs.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() == Some(&"LOAD") && f.len() >= 6 {
            let p = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0);
            let (off, vaddr, filesz) = (p(f[1]), p(f[2]), p(f[4]));
            if addr >= vaddr && addr < vaddr + filesz {
                return Ok(addr - vaddr + off);
            }
        }
    }
    bail!(
        "{symbol} at {addr:#x} is in no LOAD segment of {}",
        lib.display()
    )
}

/// ids (`prog_id` or `map_id`) of the BPF objects whose file descriptors process `pid` holds.
fn fd_ids(pid: u32, key: &str) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(e?.path()) else {
            continue;
        };
        for l in text.lines() {
            if let Some(v) = l.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
                if let Ok(id) = v.trim().parse() {
                    ids.push(id);
                }
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The eBPF programs whose ids `pid` holds: (name, run_cnt, run_time_ns), from `bpftool prog
/// show` (the counts need kernel.bpf_stats_enabled).
fn programs_of(pid: u32) -> Result<Vec<(String, u64, u64)>> {
    let ids = fd_ids(pid, "prog_id")?;
    let progs: serde_json::Value =
        serde_json::from_str(&capture(Command::new("bpftool").args(["prog", "show", "-j"]))?)?;
    Ok(progs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| ids.contains(&p["id"].as_u64().unwrap_or(0)))
        .map(|p| {
            (
                p["name"].as_str().unwrap_or("?").to_string(),
                p["run_cnt"].as_u64().unwrap_or(0),
                p["run_time_ns"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}

/// Sum of run_time_ns of the eBPF programs whose ids `pid` holds.
fn prog_run_ns(pid: u32) -> Result<u64> {
    Ok(programs_of(pid)?.iter().map(|(_, _, ns)| ns).sum())
}

/// The sum of fields of /proc/PID/stat, numbered as in proc(5) (utime is 14).
fn stat_sum(pid: u32, fields: &[usize]) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after the last ')', at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields.iter().filter_map(|n| f.get(n.checked_sub(3)?)?.parse::<u64>().ok()).sum())
}

/// Read- and write-type system calls (/proc/PID/io syscr + syscw) and page faults (minor +
/// major, /proc/PID/stat) of a process so far.
fn syscalls_and_faults(pid: u32) -> Result<(u64, u64)> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let field = |k: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    // minflt, majflt.
    let faults = stat_sum(pid, &[10, 12])?;
    Ok((field("syscr:") + field("syscw:"), faults))
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    // utime, stime.
    let ticks = stat_sum(pid, &[14, 15])?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// kernel.bpf_stats_enabled on for its lifetime, restored after.
struct BpfStats {
    old: String,
}

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";
    fn enable() -> Result<BpfStats> {
        let old = std::fs::read_to_string(Self::PATH)?.trim().to_string();
        std::fs::write(Self::PATH, "1").context("cannot enable kernel.bpf_stats_enabled")?;
        Ok(BpfStats { old })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.old);
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A child whose stdout and stderr lines are read as they come.
struct Spawned {
    child: KillOnDrop,
    command: String,
    lines: Receiver<(bool, String)>,
    seen: Vec<String>,
}

impl Spawned {
    fn new(mut cmd: Command) -> Result<Spawned> {
        clear_out_dir(&cmd);
        let command = show(&cmd);
        eprintln!("xtask: $ {command}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((true, l));
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send((false, l));
            }
        });
        Ok(Spawned {
            child: KillOnDrop(child),
            command,
            lines,
            seen: Vec::new(),
        })
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn wait_line(&mut self, stdout: bool, prefix: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((is_out, l)) => {
                    self.seen.push(l.clone());
                    if is_out == stdout && l.starts_with(prefix) {
                        return Ok(l);
                    }
                }
                Err(_) => bail!(
                    "{}: no line starting with {prefix:?} within {timeout:?}; it printed:\n{}",
                    self.command,
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn wait_stdout_line(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        self.wait_line(true, prefix, timeout)
    }

    fn wait_stderr_line(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        self.wait_line(false, prefix, timeout)
    }

    fn interrupt(&self) {
        // SAFETY: kill has no memory-safety preconditions; the child is not reaped yet.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGINT) };
    }

    fn wait(mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.0.try_wait()? {
                while let Ok((_, l)) = self.lines.try_recv() {
                    self.seen.push(l);
                }
                if !status.success() {
                    bail!(
                        "{} failed ({status}):\n{}",
                        self.command,
                        self.seen.join("\n")
                    );
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{} did not end within {timeout:?}", self.command);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stat_sum_reads_fields_by_their_proc5_number() {
        // Field 4 is the parent's PID (after the command in parentheses).
        let ppid = u64::from(std::os::unix::process::parent_id());
        assert_eq!(super::stat_sum(std::process::id(), &[4]).unwrap(), ppid);
        assert_eq!(super::stat_sum(std::process::id(), &[4, 4]).unwrap(), 2 * ppid);
    }
}
