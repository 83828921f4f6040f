//! Helpers of the benchmarks: commands and their output, the machine, /proc figures of a
//! process, eBPF program statistics, spawned processes.

use super::*;

/// First line of a command's stdout.
pub(super) fn query_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().map(|l| l.trim().to_string()).filter(|l| !l.is_empty())
}

pub(super) fn machine() -> Vec<(&'static str, String)> {
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
        ("CPUs (`nproc`)", query_line("nproc", &[]).unwrap_or_default()),
        ("CPU model (/proc/cpuinfo)", model),
        ("Kernel (`uname -r`)", query_line("uname", &["-r"]).unwrap_or_default()),
        ("glibc (`ldd --version`)", query_line("ldd", &["--version"]).unwrap_or_default()),
        ("bpftrace", query_line("bpftrace", &["--version"]).unwrap_or_default()),
        ("heaptrack", query_line("heaptrack", &["--version"]).unwrap_or_default()),
        ("redis", query_line("redis-server", &["--version"]).unwrap_or_default()),
        ("python", query_line("python3", &["--version"]).unwrap_or_default()),
    ]
}

pub(super) fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// The range of 1-minute load averages sampled at the starts of runs ("2.1–3.4"), or "unknown".
pub(super) fn load_range(loads: &[f64]) -> String {
    if loads.is_empty() {
        return "unknown".to_string();
    }
    format!(
        "{:.1}–{:.1}",
        loads.iter().copied().fold(f64::INFINITY, f64::min),
        loads.iter().copied().fold(0.0, f64::max)
    )
}

/// Wait until the 1-minute load average is below `max` (at most `max_wait`); says what happened.
pub(super) fn wait_for_quiet(max: f64, max_wait: Duration) -> String {
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
        eprintln!("xtask: bench: load average {l:.2} ≥ {max}: waiting (up to {} s)", max_wait.as_secs());
        std::thread::sleep(Duration::from_secs(15));
    }
}

/// Run a command to its end; its stdout (an error with its stderr when it fails).
/// A `leaktrace record` run of the bench reuses its `--out` directory from one repetition to the
/// next; leaktrace refuses to overwrite an earlier run, so the directory is removed first.
pub(super) fn clear_out_dir(cmd: &Command) {
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

pub(super) fn capture(cmd: &mut Command) -> Result<String> {
    clear_out_dir(cmd);
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot run {}", quote(cmd.get_program())))?;
    if !out.status.success() {
        bail!("{} failed ({}):\n{}", show(cmd), out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The number after `name ` on a line of `text`.
pub(super) fn field(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// redis-benchmark -q: "SET: 947867.31 requests per second, p50=0.647 msec" (after \r progress).
pub(super) fn rps(text: &str, test: &str) -> Option<f64> {
    text.split(['\r', '\n'])
        .filter(|l| l.contains("requests per second"))
        .find_map(|l| l.trim().strip_prefix(test)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
}

/// File offset of a dynamic symbol (its address mapped through the LOAD segments).
pub(super) fn symbol_file_offset(lib: &Path, symbol: &str) -> Result<u64> {
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
    bail!("{symbol} at {addr:#x} is in no LOAD segment of {}", lib.display())
}

/// ids (`prog_id` or `map_id`) of the BPF objects whose file descriptors process `pid` holds.
pub(super) fn fd_ids(pid: u32, key: &str) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(e?.path()) else {
            continue;
        };
        for l in text.lines() {
            if let Some(v) = l.strip_prefix(key).and_then(|r| r.strip_prefix(':'))
                && let Ok(id) = v.trim().parse()
            {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The eBPF programs whose ids `pid` holds: (name, run_cnt, run_time_ns), from `bpftool prog
/// show` (the counts need kernel.bpf_stats_enabled).
pub(super) fn programs_of(pid: u32) -> Result<Vec<(String, u64, u64)>> {
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
pub(super) fn prog_run_ns(pid: u32) -> Result<u64> {
    Ok(programs_of(pid)?.iter().map(|(_, _, ns)| ns).sum())
}

/// The sum of fields of /proc/PID/stat, numbered as in proc(5) (utime is 14).
pub(super) fn stat_sum(pid: u32, fields: &[usize]) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after the last ')', at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(fields.iter().filter_map(|n| f.get(n.checked_sub(3)?)?.parse::<u64>().ok()).sum())
}

/// Read- and write-type system calls (/proc/PID/io syscr + syscw) and page faults (minor +
/// major, /proc/PID/stat) of a process so far.
pub(super) fn syscalls_and_faults(pid: u32) -> Result<(u64, u64)> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    let field =
        |k: &str| io.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    // minflt, majflt.
    let faults = stat_sum(pid, &[10, 12])?;
    Ok((field("syscr:") + field("syscw:"), faults))
}

/// utime + stime of a process, in seconds.
pub(super) fn cpu_seconds(pid: u32) -> Result<f64> {
    // utime, stime.
    let ticks = stat_sum(pid, &[14, 15])?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

pub(super) fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// kernel.bpf_stats_enabled on for its lifetime, restored after.
pub(super) struct BpfStats {
    old: String,
}

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";
    pub(super) fn enable() -> Result<BpfStats> {
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

pub(super) struct KillOnDrop(pub(super) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A child whose stdout and stderr lines are read as they come.
pub(super) struct Spawned {
    child: KillOnDrop,
    command: String,
    lines: Receiver<(bool, String)>,
    pub(super) seen: Vec<String>,
}

impl Spawned {
    pub(super) fn new(mut cmd: Command) -> Result<Spawned> {
        clear_out_dir(&cmd);
        let command = show(&cmd);
        eprintln!("xtask: $ {command}");
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
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
        Ok(Spawned { child: KillOnDrop(child), command, lines, seen: Vec::new() })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.0.id()
    }

    pub(super) fn wait_line(&mut self, stdout: bool, prefix: &str, timeout: Duration) -> Result<String> {
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

    pub(super) fn wait_stdout_line(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        self.wait_line(true, prefix, timeout)
    }

    pub(super) fn wait_stderr_line(&mut self, prefix: &str, timeout: Duration) -> Result<String> {
        self.wait_line(false, prefix, timeout)
    }

    /// Keep, in `seen`, the lines printed so far.
    pub(super) fn drain(&mut self) {
        while let Ok((_, l)) = self.lines.try_recv() {
            self.seen.push(l);
        }
    }

    pub(super) fn interrupt(&self) {
        // SAFETY: kill has no memory-safety preconditions; the child is not reaped yet.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGINT) };
    }

    pub(super) fn wait(mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.0.try_wait()? {
                while let Ok((_, l)) = self.lines.try_recv() {
                    self.seen.push(l);
                }
                if !status.success() {
                    bail!("{} failed ({status}):\n{}", self.command, self.seen.join("\n"));
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
