//! The Python part of `cargo xtask bench`: what reading the Python frames
//! at each traced allocation costs, and what the pymalloc hooks (`--pymalloc`) cost, beside the
//! native-only stacks (`--python-frames off`), on one Python workload (`xtask/bench/churn.py
//! ITERATIONS malloc`: per iteration ~64 malloc/free pairs from Python code and ~1,700 pymalloc
//! calls) in one run.
//!
//! Each variant is launched under `leaktrace record` (exact mode) and runs the loop for a fixed
//! number of iterations (a quarter of `--python-iterations`); its figure is the loop's process CPU time per iteration (`cpu_s` printed
//! by the script, so the agent's own CPU is not in it). The calls each variant traced are the
//! `allocs` and `frees` counters of its report.json, so the cost per traced allocator call is
//! (CPU per iteration − untraced CPU per iteration) × iterations / traced calls. The pymalloc
//! variants trap on every object allocation and free (~85× the CPU of the loop), so they run a
//! tenth of that; the loop's per-iteration cost does not depend on its length
//! (a bounded window of 256 dicts is reached after 256 iterations).
//!
//! The results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md.

use super::*;

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- python hooks bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- python hooks bench: end -->";

/// The loop runs `--python-iterations` / this many iterations ...
const ITERATIONS_DIVISOR: u64 = 4;
/// ... and the pymalloc variants a tenth of those.
const PYMALLOC_DIVISOR: u64 = 10;

/// One variant: its name, leaktrace's options (None: untraced), whether it runs the shorter loop.
struct Variant {
    name: &'static str,
    options: Option<&'static [&'static str]>,
    short: bool,
}

const VARIANTS: &[Variant] = &[
    Variant { name: "untraced", options: None, short: false },
    Variant {
        name: "exact, `--python-frames off` (native-only stacks)",
        options: Some(&["--python-frames", "off"]),
        short: false,
    },
    Variant { name: "exact, Python frames (the default)", options: Some(&[]), short: false },
    Variant {
        name: "`--pymalloc` (Python frames off with it by default)",
        options: Some(&["--pymalloc"]),
        short: true,
    },
    Variant {
        name: "`--pymalloc --python-frames on`",
        options: Some(&["--pymalloc", "--python-frames", "on"]),
        short: true,
    },
];

/// The figures of one run: loop CPU seconds per iteration, traced allocator calls per iteration.
struct Run {
    cpu_per_iter: f64,
    calls_per_iter: f64,
}

fn command(leaktrace: &Path, python: &Path, work: &Path, v: &Variant, i: usize, iterations: u64) -> Command {
    let script = root().join("xtask/bench/churn.py");
    let mut c = match v.options {
        None => Command::new(python),
        Some(options) => {
            let mut c = Command::new(leaktrace);
            c.args(["record", "--quiet", "--interval", "1s", "--out"])
                .arg(work.join(format!("rec-py-{i}")))
                .args(options)
                .arg("--")
                .arg(python);
            c
        }
    };
    c.arg(&script).arg(iterations.to_string()).arg("malloc");
    c
}

fn one_run(cmd: &mut Command, work: &Path, v: &Variant, i: usize, iterations: u64) -> Result<Run> {
    let out = capture(cmd)?;
    let cpu = field(&out, "cpu_s").with_context(|| format!("no cpu_s in:\n{out}"))?;
    let calls = match v.options {
        None => 0.0,
        Some(_) => {
            let path = work.join(format!("rec-py-{i}/report.json"));
            let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let r: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
            let n = |k: &str| r["events"][k].as_f64().unwrap_or(0.0);
            n("allocs") + n("frees")
        }
    };
    Ok(Run { cpu_per_iter: cpu / iterations as f64, calls_per_iter: calls / iterations as f64 })
}

/// Measure `reps` interleaved runs of each variant, `python_iterations` / 4 loop iterations each
/// (the pymalloc variants a tenth of those); the markdown section (between the markers).
pub(super) fn measure(reps: usize, python_iterations: u64) -> Result<String> {
    let iterations = (python_iterations / ITERATIONS_DIVISOR).max(1000);
    let work = root().join("target/bench/pyhooks");
    std::fs::create_dir_all(&work)?;
    let python = query_line("python3", &["-c", "import sys; print(sys.executable)"])
        .map(PathBuf::from)
        .context("python3 not found")?;
    let version = query_line(python.to_str().unwrap_or("python3"), &["--version"]).unwrap_or_default();
    let leaktrace = release_binary();
    let short = (iterations / PYMALLOC_DIVISOR).max(300);
    let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let mut runs: Vec<Vec<Run>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    let mut loads = Vec::new();
    for rep in 0..reps.max(1) {
        for (i, v) in VARIANTS.iter().enumerate() {
            loads.extend(loadavg());
            let n = if v.short { short } else { iterations };
            let mut cmd = command(&leaktrace, &python, &work, v, i, n);
            let run = one_run(&mut cmd, &work, v, i, n)?;
            eprintln!(
                "xtask: bench: python hooks rep {rep} {}: {:.1} µs CPU per iteration, {:.1} traced calls per iteration",
                v.name,
                run.cpu_per_iter * 1e6,
                run.calls_per_iter
            );
            runs[i].push(run);
        }
    }
    let cpu: Vec<f64> = runs.iter().map(|r| median(&r.iter().map(|x| x.cpu_per_iter).collect::<Vec<_>>())).collect();
    let calls: Vec<f64> =
        runs.iter().map(|r| median(&r.iter().map(|x| x.calls_per_iter).collect::<Vec<_>>())).collect();
    let base = cpu[0];
    let load = load_range(&loads);

    let mut s = String::new();
    s.push_str(BEGIN);
    s.push('\n');
    s.push_str(&format!(
        "## Python frames and the pymalloc hooks\n\n\
         Measured by `cargo xtask bench` ({date}; `--python-only` runs just this part), {} interleaved run(s) of each variant, \
         1-minute load {load} at the starts. `xtask/bench/churn.py N malloc` (per iteration 64 bytes objects of 1000 bytes, each a malloc and \
         later a free, and dicts, lists and strings from pymalloc's arenas) under {version} (`{}`), launched under `leaktrace record` in \
         exact mode: {iterations} iterations, the `--pymalloc` variants {short} (they trap on every object allocation and free). CPU is the loop's own \
         process CPU time per iteration (the script's `cpu_s`; the agent's CPU is not in it); traced calls are report.json's \
         `events.allocs` + `events.frees` per iteration; the cost per traced call is the CPU added over the untraced loop divided by them.\n\n",
        reps.max(1),
        python.display()
    ));
    s.push_str(
        "| variant | CPU per iteration (median) | vs untraced | traced allocator calls per iteration | added per traced call | runs (µs per iteration) |\n\
         | --- | ---: | ---: | ---: | ---: | --- |\n",
    );
    for (i, v) in VARIANTS.iter().enumerate() {
        let per_call = if v.options.is_some() && calls[i] > 0.0 {
            format!("{:.0} ns", (cpu[i] - base) / calls[i] * 1e9)
        } else {
            "—".to_string()
        };
        s.push_str(&format!(
            "| {} | {:.1} µs | {:.2}× | {} | {per_call} | {} |\n",
            v.name,
            cpu[i] * 1e6,
            cpu[i] / base,
            if v.options.is_some() { format!("{:.1}", calls[i]) } else { "—".to_string() },
            runs[i].iter().map(|r| format!("{:.1}", r.cpu_per_iter * 1e6)).collect::<Vec<_>>().join(", ")
        ));
    }
    let frames_ns = |with: usize, without: usize| {
        let c = calls[with].max(calls[without]);
        if c > 0.0 { Some((cpu[with] - cpu[without]) / c * 1e9) } else { None }
    };
    s.push('\n');
    if let (Some(native), Some(pymalloc)) = (frames_ns(2, 1), frames_ns(4, 3)) {
        s.push_str(&format!(
            "Reading the Python frames at each traced allocation (frames on minus `--python-frames off`, over the calls traced): \
             {native:.0} ns per call of the malloc family, {pymalloc:.0} ns per call with `--pymalloc` (every object allocation and \
             free traced). \
             A difference within the runs' spread is noise: compare it with the runs column.\n\n"
        ));
    }
    s.push_str("```sh\n");
    for (i, v) in VARIANTS.iter().enumerate() {
        let n = if v.short { short } else { iterations };
        s.push_str(&show(&command(&leaktrace, &python, &work, v, i, n)));
        s.push('\n');
    }
    s.push_str("```\n\n");
    s.push_str(END);
    s.push('\n');
    Ok(s)
}
