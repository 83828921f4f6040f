//! The `leaktrace watch` part of `cargo xtask bench` (`--watch-only` runs just this):
//! - the agent's own cost: `leaktrace watch --cgroup` over [`PROCESSES`] processes
//!   (xtask/bench/attach_target.cpp, libc and libstdc++ mapped, [`attach::CGROUP_RATE`] rounds
//!   of new/delete and malloc/free a second each: flat memory) for `--watch-minutes` (default
//!   10, the issue's figure), default windows (30 s). Its CPU is utime + stime of
//!   /proc/PID/stat (all its threads) over the wall-clock time, as a share of one core; its
//!   memory the peak RSS (VmHWM of /proc/PID/status), read every second until it exits;
//! - redis-server (Debian's) under redis-benchmark, untraced and under `watch --pid REDIS
//!   --no-escalate`, interleaved, `--reps` times each: requests per second (wall clock) and
//!   requests per second of redis-server's own CPU time;
//! - an escalation's cost while it lasts: redis-server filled with new keys (short
//!   redis-benchmark SET runs over a large key space, one after the other) grows, so `watch
//!   --escalate-after 1` takes an exact window on it; each run's throughput is classed by when
//!   it ran: untraced (before and after the agent), growth-mode windows, or inside the exact
//!   window (its span from the escalation's recording.json).
//!
//! The results replace the section between [`BEGIN`] and [`END`] in docs/benchmarks.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// Marks of the section this writes in docs/benchmarks.md.
pub(crate) const BEGIN: &str = "<!-- watch bench: written by `cargo xtask bench`, begin -->";
pub(crate) const END: &str = "<!-- watch bench: end -->";

/// Processes watched for the agent's own cost (the issue's "50 processes").
const PROCESSES: usize = 50;
/// The exact window of the escalation measurement, seconds (`--escalate-for`).
const ESCALATE_FOR_S: u64 = 15;
/// SET requests of each short run filling redis during the escalation measurement.
const FILL_REQUESTS: u64 = 10_000;

/// What `--watch-only` measures with.
pub(super) struct Sizes {
    /// How long the agent watches the 50 processes, minutes.
    pub minutes: f64,
    /// Requests per redis-benchmark test (SET and GET) of the untraced/watched runs.
    pub redis_requests: u64,
}

/// The agent's own cost over the long run.
struct AgentRun {
    wall_s: f64,
    cpu_s: f64,
    /// CPU seconds from the end of the first minute to the end, and that span's length.
    steady_cpu_s: f64,
    steady_wall_s: f64,
    hwm_kib: u64,
    /// VmRSS, KiB: the largest sampled and the last before it exited.
    rss_max_kib: u64,
    rss_last_kib: u64,
    windows: String,
}

/// `leaktrace watch --cgroup` over 50 processes for `minutes`, sampled every second.
fn agent_cost(work: &Path, target: &Path, minutes: f64) -> Result<AgentRun> {
    let cg = attach::cgroup_of_targets(target, PROCESSES)?;
    let mut c = Command::new(release_binary());
    c.args(["watch", "--cgroup"]).arg(&cg.path);
    c.args(["--duration", &format!("{}s", (minutes * 60.0).round() as u64), "--out"]).arg(work.join("agent-out"));
    let started = Instant::now();
    let mut s = Spawned::new(c)?;
    let pid = s.pid();
    let (mut cpu, mut cpu_1m, mut hwm, mut rss_max, mut rss_last) = (0.0, None, 0, 0, 0);
    // A zombie has no VmHWM: the last figures are those read before it exited.
    while let Ok(h) = status_kib(pid, "VmHWM") {
        hwm = h;
        rss_last = status_kib(pid, "VmRSS").unwrap_or(rss_last);
        rss_max = rss_max.max(rss_last);
        cpu = cpu_seconds(pid).unwrap_or(cpu);
        if cpu_1m.is_none() && started.elapsed() >= Duration::from_secs(60) {
            cpu_1m = Some((cpu, started.elapsed().as_secs_f64()));
        }
        std::thread::sleep(Duration::from_secs(1));
        s.drain();
    }
    cpu = cpu_seconds(pid).unwrap_or(cpu);
    let wall_s = started.elapsed().as_secs_f64();
    s.drain();
    let windows = s.seen.iter().rev().find(|l| l.contains("watch: done after")).cloned().unwrap_or_default();
    s.wait(Duration::from_secs(120))?;
    drop(cg);
    let (c1, t1) = cpu_1m.unwrap_or((0.0, 0.0));
    Ok(AgentRun {
        wall_s,
        cpu_s: cpu,
        steady_cpu_s: cpu - c1,
        steady_wall_s: wall_s - t1,
        hwm_kib: hwm,
        rss_max_kib: rss_max,
        rss_last_kib: rss_last,
        windows,
    })
}

/// redis-server on the loopback (no persistence), killed when dropped.
struct Redis {
    server: KillOnDrop,
    port: u16,
}

impl Redis {
    fn start(work: &Path) -> Result<Redis> {
        let port = 7390 + (std::process::id() % 500) as u16;
        let mut c = Command::new(which("redis-server").unwrap_or_else(|| "/usr/bin/redis-server".into()));
        c.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--logfile")
            .arg(work.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let r = Redis { server: KillOnDrop(c.spawn().context("cannot start redis-server")?), port };
        let t = Instant::now();
        while !capture(Command::new("redis-cli").args(["-p", &port.to_string(), "ping"]))
            .is_ok_and(|o| o.contains("PONG"))
        {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("redis-server did not answer on 127.0.0.1:{port}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(r)
    }

    fn pid(&self) -> u32 {
        self.server.0.id()
    }

    fn bench(&self, args: &[&str]) -> Command {
        let mut c = Command::new("redis-benchmark");
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-P", "16", "-q"]).args(args);
        c
    }
}

/// One redis-benchmark run of SET and GET: (requests a second over both, requests per
/// redis-server CPU second).
fn redis_run(redis: &Redis, n: u64) -> Result<(f64, f64)> {
    let cpu0 = cpu_seconds(redis.pid())?;
    let out = capture(&mut redis.bench(&["-n", &n.to_string(), "-t", "set,get"]))?;
    let cpu = cpu_seconds(redis.pid())? - cpu0;
    let set = rps(&out, "SET").with_context(|| format!("no SET figure in:\n{out}"))?;
    let get = rps(&out, "GET").with_context(|| format!("no GET figure in:\n{out}"))?;
    Ok((2.0 / (1.0 / set + 1.0 / get), 2.0 * n as f64 / cpu.max(0.01)))
}

/// `reps` untraced runs interleaved with `reps` under `watch --pid REDIS --no-escalate` (the
/// agent started before each traced run, once its window has attached, and stopped after):
/// (untraced, watched) series of (wall rps, rps per CPU second), and the agent's CPU share
/// during the watched runs.
type Pairs = Vec<(f64, f64)>;
fn redis_under_watch(redis: &Redis, work: &Path, reps: usize, n: u64) -> Result<(Pairs, Pairs, Vec<f64>)> {
    let (mut base, mut watched, mut agent) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        base.push(redis_run(redis, n)?);
        let mut c = Command::new(release_binary());
        c.args(["watch", "--pid", &redis.pid().to_string(), "--no-escalate", "--out"])
            .arg(work.join(format!("redis-watch-{rep}")));
        let mut s = Spawned::new(c)?;
        s.wait_stderr_line("leaktrace: watch: watching PID", Duration::from_secs(60))?;
        let (cpu0, t) = (cpu_seconds(s.pid())?, Instant::now());
        watched.push(redis_run(redis, n)?);
        agent.push((cpu_seconds(s.pid())? - cpu0) / t.elapsed().as_secs_f64());
        s.interrupt();
        s.wait(Duration::from_secs(120))?;
        eprintln!("xtask: bench: watch rep {rep}: untraced {:?}, watched {:?}", base[rep], watched[rep]);
    }
    Ok((base, watched, agent))
}

/// The escalation's cost: short SET runs over a large key space, one after the other, 20 s
/// untraced, then under `watch --pid REDIS --window 5s --escalate-after 1 --escalate-for 15s`
/// until its duration ends, then 20 s untraced again. Each run: (start, end in Unix ms, SET
/// requests a second). Returns the runs, the agent's run and the exact window's (start, end) in
/// Unix ms (None: no escalation happened), and the agent's lines.
type Runs = Vec<(u64, u64, f64)>;
struct Escalation {
    runs: Runs,
    agent: (u64, u64),
    exact: Option<(u64, u64)>,
    lines: Vec<String>,
}
fn escalation_cost(redis: &Redis, work: &Path) -> Result<Escalation> {
    let stop = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let filler = {
        let (stop, runs) = (stop.clone(), runs.clone());
        let mut cmd = redis.bench(&["-n", &FILL_REQUESTS.to_string(), "-t", "set", "-r", "10000000", "-d", "64"]);
        std::thread::spawn(move || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                let t0 = unix_ms();
                let out = capture(&mut cmd)?;
                let set = rps(&out, "SET").with_context(|| format!("no SET figure in:\n{out}"))?;
                runs.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push((t0, unix_ms(), set));
                // About 20,000 new keys a second at most: redis grows by a few MB a second.
                std::thread::sleep(Duration::from_millis(400));
            }
            Ok(())
        })
    };
    std::thread::sleep(Duration::from_secs(20));
    let out = work.join("escalation");
    let mut c = Command::new(release_binary());
    c.args(["watch", "--pid", &redis.pid().to_string(), "--window", "5s", "--escalate-after", "1"]);
    c.args(["--escalate-for", &format!("{ESCALATE_FOR_S}s"), "--duration", "45s", "--out"]).arg(&out);
    let agent_from = unix_ms();
    let mut s = Spawned::new(c)?;
    let _ = s.wait_stderr_line("leaktrace: watch: done after", Duration::from_secs(240));
    let lines = s.seen.clone();
    s.wait(Duration::from_secs(120))?;
    let agent = (agent_from, unix_ms());
    std::thread::sleep(Duration::from_secs(20));
    stop.store(true, Ordering::Relaxed);
    filler.join().map_err(|_| anyhow::anyhow!("the redis filler panicked"))??;
    let exact = exact_window_span(&out.join(format!("pid-{}", redis.pid())));
    let runs = runs.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    Ok(Escalation { runs, agent, exact, lines })
}

/// The exact window's span (Unix ms) from the escalation report's recording.json under `dir`.
fn exact_window_span(dir: &Path) -> Option<(u64, u64)> {
    let report =
        std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).find(|p| p.join("recording.json").is_file())?;
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("recording.json")).ok()?).ok()?;
    let start = rec["escalation"]["started_unix_ms"].as_u64()?;
    Some((start, start + ESCALATE_FOR_S * 1000))
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Measure and return the markdown section (between the markers).
pub(super) fn measure(reps: usize, sizes: &Sizes) -> Result<String> {
    if which("redis-server").is_none() || which("redis-benchmark").is_none() {
        crate::Apt::default().install(&["redis-server", "redis-tools"], "the watch bench's redis target", &[])?;
    }
    let work = root().join("target/bench/watch");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let target = attach::build_target(&work)?;
    let date = query_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let load0 = loadavg().unwrap_or(f64::NAN);
    let agent = agent_cost(&work, &target, sizes.minutes)?;
    let load1 = loadavg().unwrap_or(f64::NAN);
    let redis = Redis::start(&work)?;
    let (base, watched, agent_share) = redis_under_watch(&redis, &work, reps, sizes.redis_requests)?;
    let esc = escalation_cost(&redis, &work)?;
    let load2 = loadavg().unwrap_or(f64::NAN);
    let mut s = format!("{BEGIN}\n");
    s.push_str(&render_agent(&date, sizes.minutes, &agent, (load0, load1)));
    s.push_str(&render_redis(reps, sizes.redis_requests, &base, &watched, &agent_share));
    s.push_str(&render_escalation(&esc, load2));
    s.push_str(END);
    s.push('\n');
    Ok(s)
}

fn render_agent(date: &str, minutes: f64, a: &AgentRun, loads: (f64, f64)) -> String {
    format!(
        "## `leaktrace watch`: the agent's cost\n\n\
         Measured by `cargo xtask bench --watch-only --watch-minutes {minutes}` ({date}; `cargo xtask bench` and \
         `--watch-only` without `--watch-minutes` watch for 10 minutes, the issue's figure). 1-minute load {:.1} at the \
         start, {:.1} at the end (2 CPUs, shared). `leaktrace watch --cgroup CG --duration {:.0}s` (default 30 s \
         windows, escalation on) over {PROCESSES} processes in a new cgroup v2 (xtask/bench/attach_target.cpp, \
         `ATTACH_TARGET_RATE={}`: libc and libstdc++ mapped, new/delete and malloc/free {} times a second each, memory \
         flat, so nothing escalates). CPU: utime + stime of /proc/PID/stat (all its threads); memory: VmHWM and VmRSS of \
         /proc/PID/status, read every second.\n\n\
         | figure | value | goal |\n| --- | ---: | ---: |\n\
         | wall-clock time, s | {:.0} | |\n\
         | agent CPU over the run, % of one core | **{:.1}** | < 2 |\n\
         | agent CPU after the first minute, % of one core | {:.1} | < 2 |\n\
         | agent peak RSS (VmHWM), MiB | **{:.0}** | < 150 |\n\
         | largest VmRSS sampled / last before exit, MiB | {:.0} / {:.0} | |\n\n\
         Its last line: `{}`\n\n",
        loads.0,
        loads.1,
        minutes * 60.0,
        attach::CGROUP_RATE,
        attach::CGROUP_RATE,
        a.wall_s,
        100.0 * a.cpu_s / a.wall_s.max(1e-9),
        100.0 * a.steady_cpu_s / a.steady_wall_s.max(1e-9),
        a.hwm_kib as f64 / 1024.0,
        a.rss_max_kib as f64 / 1024.0,
        a.rss_last_kib as f64 / 1024.0,
        a.windows.trim(),
    )
}

fn render_redis(reps: usize, n: u64, base: &Pairs, watched: &Pairs, agent: &[f64]) -> String {
    let col = |v: &Pairs, f: fn(&(f64, f64)) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let list =
        |v: &Pairs, f: fn(&(f64, f64)) -> f64| v.iter().map(|x| format!("{:.0}", f(x))).collect::<Vec<_>>().join(", ");
    let (bw, ww, bc, wc) = (col(base, |x| x.0), col(watched, |x| x.0), col(base, |x| x.1), col(watched, |x| x.1));
    format!(
        "**redis-server under `watch`** (Debian's redis-server and redis-tools, installed by the bench when missing): \
         `redis-benchmark -P 16 -q -n {n} -t set,get` on the loopback, {reps} untraced runs interleaved with {reps} under \
         `leaktrace watch --pid REDIS --no-escalate` (started before each run, once its first window has attached; \
         stopped after). Medians; each run's figure in brackets.\n\n\
         | figure | untraced | under watch | ratio |\n| --- | ---: | ---: | ---: |\n\
         | requests/s, wall clock (SET and GET) | {bw:.0} ({}) | {ww:.0} ({}) | **{:.3}** |\n\
         | requests per redis-server CPU second | {bc:.0} ({}) | {wc:.0} ({}) | **{:.3}** |\n\
         | the agent's CPU during the run, % of one core | | {:.1} | |\n\n",
        list(base, |x| x.0),
        list(watched, |x| x.0),
        ww / bw,
        list(base, |x| x.1),
        list(watched, |x| x.1),
        wc / bc,
        100.0 * median(agent),
    )
}

fn render_escalation(e: &Escalation, load: f64) -> String {
    let mut s = format!(
        "**An escalation's cost while it lasts**: redis-server filled with new keys (`redis-benchmark -P 16 -q -n \
         {FILL_REQUESTS} -t set -r 10000000 -d 64`, one run after another with 0.4 s between), 20 s untraced, then under \
         `leaktrace watch --pid REDIS --window 5s --escalate-after 1 --escalate-for {ESCALATE_FOR_S}s --duration 45s` \
         (redis grows, so its growth-mode verdict is a leak and the agent takes an exact window), then 20 s untraced. \
         Each run's SET throughput is classed by when it ran (untraced: before the agent started or after it exited; \
         the exact window's span from its recording.json); a run across the exact window's edges is left out. 1-minute \
         load {load:.1} at the end.\n\n"
    );
    let Some((from, to)) = e.exact else {
        let said: Vec<&String> = e.lines.iter().filter(|l| l.contains("watch:")).collect();
        s.push_str(&format!("No exact window was taken in this run (the agent said: {said:?}).\n\n"));
        return s;
    };
    let class = |r: &(u64, u64, f64)| {
        if r.0 >= from && r.1 <= to {
            Some(1)
        } else if r.1 < e.agent.0 || r.0 > e.agent.1 {
            Some(0)
        } else if r.1 < from || r.0 > to {
            Some(2)
        } else {
            None
        }
    };
    let of = |c| e.runs.iter().filter(|r| class(r) == Some(c)).map(|r| r.2).collect::<Vec<f64>>();
    let (untraced, exact, growth) = (of(0), of(1), of(2));
    let m0 = median(&untraced);
    s.push_str("| runs | count | SET requests/s (median) | ratio to untraced |\n| --- | ---: | ---: | ---: |\n");
    for (name, v) in [
        ("untraced", &untraced),
        ("under watch, outside the exact window", &growth),
        ("inside the exact window", &exact),
    ] {
        s.push_str(&format!("| {name} | {} | {:.0} | **{:.3}** |\n", v.len(), median(v), median(v) / m0));
    }
    s.push_str(&format!("\nThe exact window: {:.0} s.\n\n", (to - from) as f64 / 1000.0));
    s
}
