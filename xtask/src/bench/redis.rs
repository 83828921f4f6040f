//! redis-server under redis-benchmark, traced in each mode, and the syscall slow path.

use super::*;

impl Bench {
    /// redis-server under redis-benchmark, per variant: wall-clock requests per second, and
    /// requests per second of redis-server's own CPU time (what tracing adds runs in its context;
    /// other load on the machine does not add to it).
    pub(super) fn redis(&self) -> Result<(Vec<Series>, Vec<Series>)> {
        let port = 6390 + (std::process::id() % 500) as u16;
        let mut server = Command::new(which("redis-server").unwrap_or_else(|| "/usr/bin/redis-server".into()));
        server
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
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
            ("leaktrace sampled --sample-bytes 512KiB", vec!["--sample-bytes", "524288"], slow),
            ("leaktrace growth", vec!["--mode", "growth", "--no-escalate"], fast),
        ];
        let mut series: Vec<Series> = modes
            .iter()
            .map(|(name, m, n)| Series {
                name: name.to_string(),
                command: if *name == "untraced" {
                    show(&bench_cmd(*n))
                } else {
                    format!("leaktrace record --pid $REDIS_PID {} & {}", m.join(" "), show(&bench_cmd(*n)))
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
                    c.args(["record", "--pid", &pid.to_string(), "--interval", "1s", "--out"])
                        .arg(self.work.join(format!("rec-redis-{i}-{rep}")))
                        .args(mode);
                    let mut s = Spawned::new(c)?;
                    s.wait_stderr_line("leaktrace: attached", Duration::from_secs(60))?;
                    if coverage.is_empty() && *name == "leaktrace exact" {
                        coverage = s.seen.iter().filter(|l| l.contains("]:")).cloned().collect();
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
    pub(super) fn syscall_slow_path(&self) -> Result<(f64, f64)> {
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
        c.args([
            "record",
            "--mode",
            "growth",
            "--no-escalate",
            "--interval",
            "1s",
            "--pid",
            &idle.0.id().to_string(),
            "--out",
        ])
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
}
