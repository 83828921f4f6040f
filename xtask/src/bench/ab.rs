//! `cargo xtask bench --ab-against OLD`: this build's agent against another build of it (OLD,
//! e.g. one built in a temporary worktree of an earlier commit), on the two costs a change of the
//! kernel side or of the recorder would move:
//! - exact mode's cost per malloc+free pair: the microbenchmark's ns per pair (its own CPU time,
//!   private libc copy, as in [`Bench::micro`]) untraced, under the floor's empty probes, under
//!   each agent's `record` in exact mode and in growth mode (`--no-escalate`); the variants
//!   interleaved, `--reps` rounds, medians;
//! - `watch`'s CPU: `leaktrace watch --cgroup` over [`PROCESSES`] attach targets
//!   (xtask/bench/attach_target.cpp, [`attach::CGROUP_RATE`] rounds of new/delete and
//!   malloc/free a second each, flat memory: nothing escalates) for `--ab-watch-seconds`, each
//!   agent in turn on the same processes, the order swapped every round; its CPU is utime +
//!   stime of /proc/PID/stat from [`WATCH_SKIP_S`] to its end (after the eBPF load and the
//!   first attaches), as a share of one core.
//!
//! The results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md.

use std::fmt::Write as _;

use super::*;

pub(crate) const BEGIN: &str = "<!-- ab bench: written by `cargo xtask bench --ab-against`, begin -->";
pub(crate) const END: &str = "<!-- ab bench: end -->";

/// Processes watched.
const PROCESSES: usize = 50;
/// Seconds of a watch run left out of its CPU share: the eBPF load and the first attaches.
const WATCH_SKIP_S: f64 = 20.0;

/// One agent's watch run: CPU seconds and wall seconds of the measured span.
struct WatchRun {
    cpu_s: f64,
    wall_s: f64,
    hwm_kib: u64,
}

impl WatchRun {
    fn share(&self) -> f64 {
        100.0 * self.cpu_s / self.wall_s.max(1e-9)
    }
}

impl Bench {
    /// Measure both agents; the markdown section (between the markers).
    pub(super) fn ab(&self, old: &Path, watch_seconds: u64) -> Result<String> {
        let old = std::fs::canonicalize(old).with_context(|| format!("no agent at {}", old.display()))?;
        let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
        let load0 = loadavg().unwrap_or(f64::NAN);
        let pairs = self.ab_pairs(&old)?;
        let target = attach::build_target(&self.work)?;
        let mut watch: [Vec<WatchRun>; 2] = [Vec::new(), Vec::new()];
        for round in 0..self.args.reps.min(3) {
            let cg = attach::cgroup_of_targets(&target, PROCESSES)?;
            let order: [(usize, &Path); 2] =
                if round % 2 == 0 { [(0, &self.leaktrace), (1, &old)] } else { [(1, &old), (0, &self.leaktrace)] };
            for (i, agent) in order {
                let r = watch_run(agent, &cg.path, watch_seconds, &self.work.join(format!("ab-watch-{i}-{round}")))?;
                eprintln!(
                    "xtask: bench: ab round {round} {}: watch CPU {:.2} % of a core",
                    ["new", "old"][i],
                    r.share()
                );
                watch[i].push(r);
            }
        }
        let load1 = loadavg().unwrap_or(f64::NAN);
        let mut s = String::new();
        let _ = writeln!(s, "{BEGIN}\n## This agent against an earlier build (`cargo xtask bench --ab-against`)\n");
        let _ = writeln!(
            s,
            "Measured {date}; 1-minute load {load0:.1} at the start, {load1:.1} at the end (2 CPUs, shared: \
             ratios within one run, runs interleaved). New: `{}`; old: `{}`.\n",
            self.leaktrace.display(),
            old.display()
        );
        let _ = writeln!(
            s,
            "**Per malloc+free pair** (`{}` pairs of {PAIR_SIZE} B, ns of the process's own CPU time per pair, \
             median of {} interleaved rounds):\n",
            self.args.pairs, self.args.reps
        );
        let _ = writeln!(
            s,
            "| variant | ns per pair (median) | added by tracing | runs (ns) |\n| --- | ---: | ---: | --- |"
        );
        let base = pairs.first().map_or(f64::NAN, Series::median);
        for x in &pairs {
            let runs: Vec<String> = x.values.iter().map(|v| format!("{v:.0}")).collect();
            let _ = writeln!(s, "| {} | {:.0} | {:.0} | {} |", x.name, x.median(), x.median() - base, runs.join(", "));
        }
        let added = |name: &str| pairs.iter().find(|x| x.name == name).map_or(f64::NAN, |x| x.median() - base);
        let _ = writeln!(
            s,
            "\nExact mode, new against old (added ns per pair): **{:.2}×**; growth mode: {:.0} against {:.0} ns.\n",
            added("new exact") / added("old exact"),
            added("new growth"),
            added("old growth")
        );
        let _ = writeln!(
            s,
            "**`watch`'s CPU**: `leaktrace watch --cgroup CG --duration {watch_seconds}s` over {PROCESSES} \
             attach targets at {} rounds a second, each agent in turn on the same processes (order swapped \
             each round); CPU from {WATCH_SKIP_S:.0} s to the end, % of one core:\n",
            attach::CGROUP_RATE
        );
        let _ = writeln!(
            s,
            "| agent | CPU, % of a core (median) | runs | peak RSS, MiB (median) |\n| --- | ---: | --- | ---: |"
        );
        for (i, name) in ["new", "old"].iter().enumerate() {
            let shares: Vec<f64> = watch[i].iter().map(WatchRun::share).collect();
            let hwm: Vec<f64> = watch[i].iter().map(|r| r.hwm_kib as f64 / 1024.0).collect();
            let runs: Vec<String> = shares.iter().map(|v| format!("{v:.2}")).collect();
            let _ = writeln!(s, "| {name} | {:.2} | {} | {:.0} |", median(&shares), runs.join(", "), median(&hwm));
        }
        let _ = writeln!(s, "\n{END}");
        Ok(s)
    }

    /// The microbenchmark's variants, interleaved; untraced first.
    fn ab_pairs(&self, old: &Path) -> Result<Vec<Series>> {
        let n = self.args.pairs.to_string();
        let size = PAIR_SIZE.to_string();
        let mut variants: Vec<(String, Command)> = Vec::new();
        let mut c = Command::new(&self.pairs);
        c.args([&n, &size]);
        variants.push(("untraced".into(), c));
        let mut c = Command::new(&self.floor);
        c.arg(&self.libc)
            .arg(format!("e:{:#x}", self.malloc_off))
            .arg(format!("r:{:#x}", self.malloc_off))
            .arg(format!("e:{:#x}", self.free_off))
            .arg("--")
            .arg(&self.pairs)
            .args([&n, &size]);
        variants.push(("floor: empty probes at leaktrace's places".into(), c));
        for (who, agent) in [("new", self.leaktrace.as_path()), ("old", old)] {
            for (mode, extra) in [("exact", &[][..]), ("growth", &["--mode", "growth", "--no-escalate"][..])] {
                let mut c = Command::new(agent);
                c.args(["record", "--interval", "1s", "--out"])
                    .arg(self.work.join(format!("ab-{who}-{mode}")))
                    .args(extra)
                    .arg("--")
                    .arg(&self.pairs)
                    .args([&n, &size]);
                variants.push((format!("{who} {mode}"), c));
            }
        }
        let mut series: Vec<Series> =
            variants.iter().map(|(name, c)| Series { name: name.clone(), command: show(c), values: vec![] }).collect();
        for rep in 0..self.args.reps {
            for (i, (name, cmd)) in variants.iter_mut().enumerate() {
                let out = capture(cmd).with_context(|| format!("ab microbenchmark, {name}"))?;
                let v = field(&out, "ns_per_pair").with_context(|| format!("{name}: no ns_per_pair in:\n{out}"))?;
                eprintln!("xtask: bench: ab rep {rep} {name}: {v:.1} ns/pair");
                series[i].values.push(v);
            }
        }
        Ok(series)
    }
}

/// `agent watch --cgroup CG` for `seconds`, its CPU sampled every second.
fn watch_run(agent: &Path, cgroup: &Path, seconds: u64, out: &Path) -> Result<WatchRun> {
    let mut c = Command::new(agent);
    c.args(["watch", "--cgroup"]).arg(cgroup).args(["--duration", &format!("{seconds}s"), "--out"]).arg(out);
    let started = Instant::now();
    let mut s = Spawned::new(c)?;
    let pid = s.pid();
    let (mut cpu, mut at_skip, mut hwm) = (0.0, None, 0);
    while let Ok(h) = status_kib(pid, "VmHWM") {
        hwm = h;
        cpu = cpu_seconds(pid).unwrap_or(cpu);
        if at_skip.is_none() && started.elapsed().as_secs_f64() >= WATCH_SKIP_S {
            at_skip = Some((cpu, started.elapsed().as_secs_f64()));
        }
        std::thread::sleep(Duration::from_secs(1));
        s.drain();
    }
    let wall = started.elapsed().as_secs_f64();
    s.wait(Duration::from_secs(120))?;
    let (c0, t0) = at_skip.context("the watch ended before its measured span began")?;
    Ok(WatchRun { cpu_s: cpu - c0, wall_s: wall - t0, hwm_kib: hwm })
}
